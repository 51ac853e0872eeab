"""The parameter gradients' last step: per-program partial rows summed in one launch."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import launching
from .launching import cdiv, next_power_of_2


@triton.jit
def sum_partials_kernel(part_ptr, tail_ptr, out_ptr, a_param_ptr, P, N, D, COL0, RUN, OUT_RUN,
                        BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """sum_p part[p, :] then sum_p tail[p, :] * sigmoid(a_param), the tail being
    d softplus(a_param): d a_param = d softplus * sigmoid(a_param).  Column c of that [N + D]
    result goes to out[(c // RUN) OUT_RUN + c % RUN + COL0], and the tail's column j reads
    a_param[COL0 + j]: the identity for RUN = OUT_RUN = N + D, COL0 = 0; one channel group's
    runs of RUN columns into a wider layout otherwise."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    in_part = cols < N
    in_tail = (cols >= N) & (cols < N + D)
    acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    for p0 in range(0, P, BLOCK_P):
        rows = p0 + tl.arange(0, BLOCK_P)[:, None]
        ok = rows < P
        acc += tl.load(part_ptr + rows.to(tl.int64) * N + cols[None, :],
                       mask=ok & in_part[None, :], other=0.0)
        acc += tl.load(tail_ptr + rows.to(tl.int64) * D + (cols[None, :] - N),
                       mask=ok & in_tail[None, :], other=0.0)
    total = tl.sum(acc, axis=0)
    a = tl.load(a_param_ptr + COL0 + cols - N, mask=in_tail, other=0.0)
    total = tl.where(in_tail, total * tl.sigmoid(a), total)
    tl.store(out_ptr + (cols // RUN) * OUT_RUN + cols % RUN + COL0, total,
             mask=in_part | in_tail)


def sum_partials(part: torch.Tensor, tail: torch.Tensor, a_param: torch.Tensor,
                 out: torch.Tensor | None = None, group: tuple[int, int] | None = None
                 ) -> torch.Tensor:
    """Every parameter gradient from the kernels' per-program partial rows, in one launch (in
    place of ~5 small torch ops at ~10 us of host time each): part [P, N] and tail [P, D], the
    d softplus(a_param) rows.  Returns [N + D]: the sums of part, then d a_param.  With
    group = (first channel, full width), the rows hold one channel group's columns, runs of D
    (its width) each, and each run goes to its place in out, a result of the full width."""
    n_parts, n = part.shape
    width = tail.shape[1]
    if out is None:
        out = torch.empty(n + width, device=part.device, dtype=torch.float32)
    col0, run, out_run = (0, n + width, n + width) if group is None else (group[0], width,
                                                                          group[1])
    # Narrow column blocks, tall row blocks: enough programs and bytes in flight when P is large
    # (4096 rows at chunk 8, L = 32768); 128-column blocks took 0.15 ms there on the H200.
    block_n = 32
    launching.launch(sum_partials_kernel, (cdiv(n + width, block_n),), part, tail, out, a_param,
                     n_parts, n, width, col0, run, out_run,
                     BLOCK_P=min(128, next_power_of_2(n_parts)), BLOCK_N=block_n, num_warps=4)
    return out


def named_columns(widths) -> dict[str, slice]:
    """{name: slice} of consecutive columns from ((name, width), ...): how a flat gradient
    buffer is read back by name instead of by offsets."""
    out, start = {}, 0
    for name, width in widths:
        out[name] = slice(start, start + width)
        start += width
    return out

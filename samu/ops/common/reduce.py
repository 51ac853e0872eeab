"""The parameter gradients' last steps: split-K rows of a rank-2 controller's weight gradient
(dz^T x, SAMU), and every kernel's per-program partial rows summed in one launch."""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import launching
from .launching import cdiv, next_power_of_2


@triton.jit
def sum_partials_kernel(front_ptr, part_ptr, tail_ptr, out_ptr, a_param_ptr, S, F, P, N, D, COL0,
                        RUN, OUT_RUN, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """Column sums of three row sets side by side: front [S, F], part [P, N], then tail [P, D],
    the tail being d softplus(a_param), so its sums are multiplied by sigmoid(a_param)
    (d a_param = d softplus * sigmoid).  The front's sums go to out[0:F]; column c of the
    [N + D] rest goes to out[F + (c // RUN) OUT_RUN + c % RUN + COL0], and the tail's column j
    reads a_param[COL0 + j]: the identity for RUN = OUT_RUN = N + D, COL0 = 0; one channel
    group's runs of RUN columns into a wider layout otherwise (no front then)."""
    first = tl.program_id(0) * BLOCK_N
    cols = first + tl.arange(0, BLOCK_N)
    in_front = cols < F
    in_part = (cols >= F) & (cols < F + N)
    in_tail = (cols >= F + N) & (cols < F + N + D)
    # Each source in its own loop, over its own rows, and only where the block has its columns.
    front_rows = tl.where(first < F, S, 0)
    part_rows = tl.where(first + BLOCK_N > F, P, 0)
    acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    for p0 in range(0, front_rows, BLOCK_P):
        rows = p0 + tl.arange(0, BLOCK_P)[:, None]
        acc += tl.load(front_ptr + rows.to(tl.int64) * F + cols[None, :],
                       mask=(rows < S) & in_front[None, :], other=0.0)
    for p0 in range(0, part_rows, BLOCK_P):
        rows = p0 + tl.arange(0, BLOCK_P)[:, None]
        wide = rows.to(tl.int64)
        ok = rows < P
        acc += tl.load(part_ptr + wide * N + (cols[None, :] - F), mask=ok & in_part[None, :],
                       other=0.0)
        acc += tl.load(tail_ptr + wide * D + (cols[None, :] - F - N), mask=ok & in_tail[None, :],
                       other=0.0)
    total = tl.sum(acc, axis=0)
    a = tl.load(a_param_ptr + COL0 + cols - F - N, mask=in_tail, other=0.0)
    total = tl.where(in_tail, total * tl.sigmoid(a), total)
    rest = tl.maximum(cols - F, 0)  # columns of part and tail, counted from the front's end
    dest = tl.where(in_front, cols, F + (rest // RUN) * OUT_RUN + rest % RUN + COL0)
    tl.store(out_ptr + dest, total,
             mask=in_front | in_part | in_tail)


@functools.lru_cache(maxsize=1024)
def _sum_partials_site(ints: tuple, dtypes: tuple, device) -> launching.Site:
    """sum_partials' launch for its ints and its tensors' dtypes (launching.Site)."""
    n_front, f, n_parts, n, width = ints[:5]
    # Narrow column blocks, tall row blocks: enough programs and bytes in flight when P is large
    # (4096 rows at chunk 8, L = 32768); 128-column blocks took 0.15 ms there on the H200.
    block_n = 32
    return launching.Site(sum_partials_kernel, (cdiv(f + n + width, block_n),),
                          dict(BLOCK_P=min(128, next_power_of_2(max(n_parts, n_front))),
                               BLOCK_N=block_n, num_warps=4))


def sum_partials(part: torch.Tensor, tail: torch.Tensor, a_param: torch.Tensor,
                 out: torch.Tensor | None = None, group: tuple[int, int] | None = None,
                 front: torch.Tensor | None = None, rows: tuple | None = None) -> torch.Tensor:
    """Every parameter gradient from the kernels' partial rows, in one launch (in place of ~5
    small torch ops at ~10 us of host time each): front [S, F] (optional, any number of rows),
    part [P, N] and tail [P, D], the d softplus(a_param) rows.  Returns [F + N + D]: the sums of
    front, of part, then d a_param.  With group = (first channel, full width) (no front), the
    rows hold one channel group's columns, runs of D (its width) each, and each run goes to its
    place in out, a result of the full width.  rows = (S, F, P, N, D): the buffers are flat
    (launching.pieces), their shapes these."""
    if rows is not None:
        n_front, f, n_parts, n, width = rows
    else:
        n_parts, n = part.shape
        width = tail.shape[1]
        n_front, f = (0, 0) if front is None else front.shape
    if front is None:
        front = part
    if group is not None and f:
        raise ValueError("sum_partials: a channel group's rows take no front")
    if out is None:
        out = torch.empty(f + n + width, device=part.device, dtype=torch.float32)
    col0, run, out_run = (0, n + width, n + width) if group is None else (group[0], width,
                                                                          group[1])
    ints = (n_front, f, n_parts, n, width, col0, run, out_run)
    site = _sum_partials_site(ints, (front.dtype, part.dtype, tail.dtype, out.dtype,
                                     a_param.dtype), out.device)
    site(front, part, tail, out, a_param, *ints)
    return out


@triton.jit
def weight_partials_kernel(x_ptr, dz_ptr, out_ptr, TOKENS, D, PER_SPLIT,
                           BT: tl.constexpr, BC: tl.constexpr):
    """Split-K rows of d W = dz^T x for a rank-2 controller z = W x: program (column block,
    split s) sums dz[j, t] x[t, cols] over its PER_SPLIT tokens into out[s, j D + cols], j = 0, 1.
    x: [TOKENS, D] (BF16 or FP32), dz: [2, TOKENS] FP32, out: [splits, 2 D] FP32."""
    cols = tl.program_id(0) * BC + tl.arange(0, BC)
    col_ok = cols < D
    lo = tl.program_id(1).to(tl.int64) * PER_SPLIT  # past 2^31 tokens in B L
    hi = tl.minimum(lo + PER_SPLIT, TOKENS)
    acc0 = tl.zeros([BT, BC], dtype=tl.float32)
    acc1 = tl.zeros([BT, BC], dtype=tl.float32)
    for t0 in range(lo, hi, BT):
        t = t0 + tl.arange(0, BT)
        t_ok = t < hi
        wide = t.to(tl.int64)
        x = tl.load(x_ptr + wide[:, None] * D + cols[None, :],
                    mask=t_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
        dz0 = tl.load(dz_ptr + wide, mask=t_ok, other=0.0)
        dz1 = tl.load(dz_ptr + TOKENS + wide, mask=t_ok, other=0.0)
        acc0 += dz0[:, None] * x
        acc1 += dz1[:, None] * x
    row = out_ptr + tl.program_id(1).to(tl.int64) * 2 * D
    tl.store(row + cols, tl.sum(acc0, axis=0), mask=col_ok)
    tl.store(row + D + cols, tl.sum(acc1, axis=0), mask=col_ok)


# Tokens per tile and channels per program of weight_partials_kernel.
WEIGHT_TOKENS = 32
WEIGHT_CHANNELS = 128


@functools.lru_cache(maxsize=None)
def _weight_split(tokens: int, width: int, programs: int) -> tuple[int, int, int]:
    """(column blocks, splits, tokens per split) of weight_partials: about `programs` programs,
    each split a whole number of token tiles."""
    col_blocks = cdiv(width, WEIGHT_CHANNELS)
    splits = max(1, min(cdiv(tokens, WEIGHT_TOKENS), cdiv(programs, col_blocks)))
    per_split = cdiv(cdiv(tokens, splits), WEIGHT_TOKENS) * WEIGHT_TOKENS
    return col_blocks, cdiv(tokens, per_split), per_split


def weight_rows(tokens: int, width: int, programs: int) -> int:
    """How many split-K rows weight_partials writes ([rows, 2 D] FP32)."""
    return _weight_split(tokens, width, programs)[1]


@functools.lru_cache(maxsize=1024)
def _weight_site(tokens: int, width: int, programs: int, x_dtype, dz_dtype, device):
    """(splits, tokens per split, the launch) of weight_partials for this signature."""
    col_blocks, splits, per_split = _weight_split(tokens, width, programs)
    return splits, per_split, launching.Site(weight_partials_kernel, (col_blocks, splits),
                                             dict(BT=WEIGHT_TOKENS, BC=WEIGHT_CHANNELS,
                                                  num_warps=4))


def weight_partials(x: torch.Tensor, dz: torch.Tensor, programs: int,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """[splits, 2 D] split-K rows of dz^T x (x [..., D] contiguous, dz [2, tokens] FP32), about
    `programs` programs in all: rows for sum_partials' front.  out: where they go (at least
    weight_rows(...) x 2 D FP32 elements, flat or not), else a new buffer."""
    width = x.shape[-1]
    tokens = x.numel() // width
    splits, per_split, site = _weight_site(tokens, width, programs, x.dtype, dz.dtype, x.device)
    if out is None:
        out = torch.empty(splits, 2 * width, device=x.device, dtype=torch.float32)
    site(x, dz, out, tokens, width, per_split)
    return out


def named_columns(widths) -> dict[str, slice]:
    """{name: slice} of consecutive columns from ((name, width), ...): how a flat gradient
    buffer is read back by name instead of by offsets."""
    out, start = {}, 0
    for name, width in widths:
        out[name] = slice(start, start + width)
        start += width
    return out

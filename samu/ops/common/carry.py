"""Phase 2 of the hierarchical scan: the carry across chunks, in one level or two.

    phase 1  each chunk, alone: decay_k = prod a, end_k = its end state from h_in = 0
    phase 2  (here) a scan over (decay_k, end_k) gives the state entering every chunk
    phase 3  each chunk again: h_t = local_t + (prod_{s<=t} a_s) h_in

The backward runs the same phases in reverse time with the adjoint recurrence.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import launching
from .launching import cdiv, next_power_of_2
from .math import exp_fast
from .scan import affine_combine, first_row, last_row
from .sequences import START_MARK


@triton.jit
def chunk_carry_kernel(decay_ptr, end_ptr, out_ptr, rate_ptr,
                       seg_decay_ptr, seg_end_ptr, seg_in_ptr, NC, D, SEG,
                       REVERSE: tl.constexpr, SCALAR_DECAY: tl.constexpr, MODE: tl.constexpr,
                       BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr):
    """Phase 2 over one segment of SEG chunks per program (grid: batch, channel blocks,
    segments).  Forward: out[k] = state entering chunk k.  Reverse: out[k] = adjoint carry
    entering chunk k from its right.  end, out: [B, NC, D] fp32.  decay: [B, NC, D] fp32, or
    with SCALAR_DECAY (SAMU) the chunk's sum of r, [B, NC], and decay = exp(-rate sum r) is
    rebuilt here from the per-channel rate [D] (8 exp(log_temp) softplus(a_param)), so that no
    [B, NC, D] decay is written or read.
    MODE 0: each segment from zero (one segment: the whole carry).  MODE 1: each segment's
    summary from zero, into seg_decay ([B, S, D], or [B, S] sums of r) and seg_end [B, S, D].
    MODE 2: each segment from its entering carry seg_in [B, S, D] (MODE 0 over the summaries)."""
    b = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    col_ok = cols < D
    seg = tl.program_id(2)
    n_seg = tl.num_programs(2)
    lo = seg * SEG
    hi = tl.minimum(lo + SEG, NC)
    base = b * NC * D
    crow = tl.arange(0, BLOCK_C)
    if MODE == 2:
        carry = tl.load(seg_in_ptr + (b * n_seg + seg) * D + cols, mask=col_ok, other=0.0)
    else:
        carry = tl.zeros([BLOCK_D], dtype=tl.float32)
    prod = tl.full([BLOCK_D], 1.0, dtype=tl.float32)
    r_total = tl.zeros([BLOCK_C], dtype=tl.float32)
    if SCALAR_DECAY:
        rate = tl.load(rate_ptr + cols, mask=col_ok, other=1.0)  # no 0 * inf past the width
    if MODE != 1:
        if REVERSE:
            tl.store(out_ptr + base + (hi - 1) * D + cols, carry, mask=col_ok)
        else:
            tl.store(out_ptr + base + lo * D + cols, carry, mask=col_ok)
    for i in range(0, tl.cdiv(hi - lo, BLOCK_C)):
        if REVERSE:
            ks = hi - (i + 1) * BLOCK_C + crow
        else:
            ks = lo + i * BLOCK_C + crow
        ok = (ks >= lo) & (ks < hi)
        offs = base + ks.to(tl.int64)[:, None] * D + cols[None, :]
        m2 = ok[:, None] & col_ok[None, :]
        if SCALAR_DECAY:
            r_sum = tl.load(decay_ptr + b * NC + ks, mask=ok, other=0.0)
            r_total += r_sum
            dec = tl.where(r_sum[:, None] == START_MARK, 0.0,  # a packed start: decay 0
                           exp_fast(-rate[None, :] * r_sum[:, None]))
        else:
            dec = tl.load(decay_ptr + offs, mask=m2, other=1.0)
        end = tl.load(end_ptr + offs, mask=m2, other=0.0)
        p, v = tl.associative_scan((dec, end), 0, affine_combine, reverse=REVERSE)
        state = v + p * carry[None, :]
        if REVERSE:
            if MODE != 1:
                tl.store(out_ptr + offs - D, state, mask=m2 & (ks[:, None] >= lo + 1))
            carry = first_row(state, crow)
            prod = prod * first_row(p, crow)
        else:
            if MODE != 1:
                tl.store(out_ptr + offs + D, state, mask=m2 & (ks[:, None] < hi - 1))
            carry = last_row(state, crow, BLOCK_C)
            prod = prod * last_row(p, crow, BLOCK_C)
    if MODE == 1:
        summary = (b * n_seg + seg) * D + cols
        tl.store(seg_end_ptr + summary, carry, mask=col_ok)
        if SCALAR_DECAY:
            tl.store(seg_decay_ptr + b * n_seg + seg, tl.sum(r_total, axis=0))
        else:
            tl.store(seg_decay_ptr + summary, prod, mask=col_ok)


@triton.jit
def walked_carry(r_sum_ptr, end_ptr, rate, b, k, NC, cols, D, REVERSE: tl.constexpr):
    """Phase 2 for one chunk, in the program that needs it: the state entering chunk k (or, with
    REVERSE, the adjoint carry entering it from its right), walked over the chunk summaries of
    SCALAR_DECAY's form (sums of r [B, NC], ends [B, NC, D]) from the first chunk (the last).
    O(NC) per program: for a few chunks, where it saves chunk_carry's launch."""
    col_ok = cols < D
    state = tl.zeros_like(rate)
    n = NC - 1 - k if REVERSE else k
    for i in range(0, n):
        j = NC - 1 - i if REVERSE else i
        r_sum = tl.load(r_sum_ptr + b * NC + j)
        start = r_sum == START_MARK  # a packed start: decay 0
        decay = tl.where(start, 0.0, exp_fast(-rate * tl.where(start, 0.0, r_sum)))
        state = decay * state + tl.load(end_ptr + (b * NC + j) * D + cols, mask=col_ok,
                                        other=0.0)
    return state


# Chunks per segment of the two-level carry, and the chunk count from which it is used: one
# program per channel block walking 4096 chunks took 0.13 ms a call on the H200 (chunk 8,
# L = 32768).
SEGMENT_CHUNKS = 128

TWO_LEVEL_FROM = 512


@functools.lru_cache(maxsize=None)
def _carry_plan(batch: int, n_chunks: int, width: int, two_level_from: int,
                segment_chunks: int) -> tuple:
    """(block_c, block_d, grid, segments or 0) of a carry over [batch, n_chunks, width]: worked
    out once per shape (host time)."""
    block_c = min(64, max(16, next_power_of_2(n_chunks)))
    if n_chunks < two_level_from:
        # One program per (batch, channel block) walks every chunk: keep >= ~256 programs busy.
        block_d = max(16, min(128, next_power_of_2(max(1, batch * width // 256))))
        block_d = min(block_d, max(16, next_power_of_2(width)))
        return block_c, block_d, (batch, cdiv(width, block_d), 1), 0
    n_seg = cdiv(n_chunks, segment_chunks)
    block_d = min(32, max(16, next_power_of_2(width)))
    return block_c, block_d, (batch, cdiv(width, block_d), n_seg), n_seg


def chunk_carry(decay: torch.Tensor, end: torch.Tensor, reverse: bool,
                rate: torch.Tensor | None = None, out: torch.Tensor | None = None
                ) -> torch.Tensor:
    """Phase 2 over [B, NC, D] summaries, into out (contiguous, like end) when given.  With
    rate (SAMU's per-channel 8 exp(log_temp) softplus(a_param), [D]), decay is the chunks' sum
    of r, [B, NC] (see chunk_carry_kernel).  From TWO_LEVEL_FROM chunks on, two levels: segment
    summaries, the carry over segments, then each segment from its carry."""
    batch, n_chunks, width = end.shape
    out = torch.empty_like(end) if out is None else out
    scalar_decay = rate is not None
    params = (rate,) if scalar_decay else (end,)
    block_c, block_d, grid, n_seg = _carry_plan(batch, n_chunks, width, TWO_LEVEL_FROM,
                                                SEGMENT_CHUNKS)
    meta = dict(REVERSE=reverse, SCALAR_DECAY=scalar_decay, BLOCK_C=block_c, BLOCK_D=block_d,
                num_warps=4)
    if not n_seg:
        launching.launch(chunk_carry_kernel, grid, decay, end, out, *params, end, end, end,
                         n_chunks, width, n_chunks, MODE=0, **meta)
        return out
    f32 = dict(device=end.device, dtype=torch.float32)
    seg_decay = torch.empty((batch, n_seg) if scalar_decay else (batch, n_seg, width), **f32)
    seg_end = torch.empty(batch, n_seg, width, **f32)
    launching.launch(chunk_carry_kernel, grid, decay, end, out, *params, seg_decay, seg_end, end,
                     n_chunks, width, SEGMENT_CHUNKS, MODE=1, **meta)
    seg_in = chunk_carry(seg_decay, seg_end, reverse, rate)
    launching.launch(chunk_carry_kernel, grid, decay, end, out, *params, seg_decay, seg_end,
                     seg_in, n_chunks, width, SEGMENT_CHUNKS, MODE=2, **meta)
    return out

"""SAMU's Triton kernels, forward and backward (SPEC sections 2 and 8).

Bytes per element of [B, L, D] (BF16 x, y, dy, dx; r, g and dz add 16 bytes per token, and the
FP32 per-chunk state rows [B, L/T, D] 4/T bytes per element each time one is written or read:
14 times per forward+backward with the two-level carry, 12 with one level):
  forward   summary+controller reads x (2), output reads x and writes y (4)            -> 6
  backward  reverse summary reads dy (2), main reads x, dy (4), dy again and writes
            dx (4), d ctrl_weight = dz^T x (reduce.weight_partials) reads x (2)         -> 12
The two full-width kernels (summary+controller, backward main) pass over a chunk's tile twice;
the second pass re-reads it from L2.  FLOPs are ~40 per element: far under the memory time;
the kernels are bound by instruction issue (docs/PERFORMANCE.md counts them).
A reset mask adds one byte per token, read by each kernel beside r (a = 0 and m = 1 at a flagged
token; a chunk holding one has the sum of r START_MARK, decay 0: samu.ops.common.sequences).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..common.carry import DEFAULT_PLAN, CarryPlan, chunk_carry, walked_carry
from ..common import launching
from ..common.launching import (Site, aligned, cdiv, check_configuration, check_launch, exact,
                                fp32_contiguous, piece_sizes, pieces, register_cap,
                                row_stride_units, sm_count, tile_width, vector_width,
                                with_state_keywords, workspace)
from ..common.math import exp_fast, sigmoid_fast, softplus, to_element, transition
from ..common.reduce import sum_partials, weight_partials, weight_rows
from ..common.scan import (DROP, KEEP, affine_combine, decayed_previous_state, last_row,
                           load_tile, row_offsets, shifted_rows, store_tile)
from ..common.sequences import (START_MARK, adjoint_inputs, check_phase_tensors, cut_resets,
                                entering_state, fold_starts, load_at, reset_mask, row_sequences,
                                sequence_args, slice_run_sequences, store_at, take_end_cotangent,
                                taken_starts, token_resets)

MIXER = "samu"


@triton.jit
def _tile(b, k, rows, cols, L, D, row_units, T: tl.constexpr, V: tl.constexpr):
    """(base, offsets, mask) of a [T, BD] tile of chunk k of a [B, L, D] tensor: its elements
    are at ptr + base + offsets.  base, the chunk's first element, is one 64-bit product per
    program; the offsets within the chunk are 32-bit (T D < 2^31), so that no element pays for
    64-bit address arithmetic.  Rows are row_offsets' multiples of row_units V (its layout)."""
    ok = (rows[:, None] < L) & (cols[None, :] < D)
    base = row_offsets(b, k * T, L, row_units, V)
    offs = (rows - k * T)[:, None] * (row_units * V) + cols[None, :]
    return base, offs, ok


# N_SEQ, the number of sequences, only masks state rows: one compiled kernel serves every count.
@triton.jit(do_not_specialize=["row_units", "N_SEQ"])
def _samu_summary_kernel(x_ptr, w_ptr, bias_ptr, a_param_ptr, log_temp_ptr, seq_ptr, h0_ptr,
                         reset_ptr, r_ptr, g_ptr, r_sum_ptr, end_ptr, rate_ptr, L, D, NC, N_SEQ,
                         row_units, T: tl.constexpr, BD: tl.constexpr, V: tl.constexpr,
                         PACKED: tl.constexpr, HAS_INITIAL: tl.constexpr,
                         HAS_RESETS: tl.constexpr, L2_HINTS: tl.constexpr):
    """Per chunk, full width: the controller (r, g) and the chunk summary: its end state and
    its sum of r (the chunk's decay is exp(-c softplus(a_param) sum r), rebuilt by the carry;
    START_MARK where the chunk holds a packed sequence's start or a reset, whose decay is 0).  Program 0
    also writes the per-channel rate c softplus(a_param) [D] that every later kernel of the
    call reads instead of recomputing it."""
    pid = tl.program_id(0)
    b = (pid // NC).to(tl.int64)
    k = pid % NC
    rows = k * T + tl.arange(0, T)
    row_ok = rows < L
    seq, starts, ends = row_sequences(seq_ptr, b, rows, L, PACKED)
    flagged = token_resets(reset_ptr, b, rows, L, HAS_RESETS)
    # Per-thread partial dot products; one cross-thread reduction after the loop.
    z0 = tl.zeros([T, BD], dtype=tl.float32)
    z1 = tl.zeros([T, BD], dtype=tl.float32)
    for d0 in range(0, D, BD):
        cols = d0 + tl.arange(0, BD)
        base, offs, ok = _tile(b, k, rows, cols, L, D, row_units, T, V)
        x = load_tile(x_ptr + base + offs, ok, L2_HINTS * KEEP).to(tl.float32)
        w0 = tl.load(w_ptr + cols, mask=cols < D, other=0.0)
        w1 = tl.load(w_ptr + D + cols, mask=cols < D, other=0.0)
        z0 += x * w0[None, :]
        z1 += x * w1[None, :]
    r = sigmoid_fast(tl.sum(z0, axis=1) + tl.load(bias_ptr))
    g = sigmoid_fast(tl.sum(z1, axis=1) + tl.load(bias_ptr + 1))
    r = tl.where(row_ok, r, 0.0)  # r = 0 makes a = 1: padded tokens are the identity
    tl.store(r_ptr + b * L + rows, r, mask=row_ok)
    tl.store(g_ptr + b * L + rows, g, mask=row_ok)
    c = 8.0 * tl.exp(tl.load(log_temp_ptr))
    r_sum = tl.sum(r, axis=0)
    if PACKED:
        r_sum = tl.where(tl.max(starts.to(tl.int32), axis=0) > 0, START_MARK, r_sum)
    if HAS_RESETS:
        r_sum = tl.where(tl.max(flagged.to(tl.int32), axis=0) > 0, START_MARK, r_sum)
    tl.store(r_sum_ptr + b * NC + k, r_sum)
    is_first = reset_mask(starts, flagged, HAS_INITIAL, HAS_RESETS)
    for d0 in range(0, D, BD):
        cols = d0 + tl.arange(0, BD)
        base, offs, ok = _tile(b, k, rows, cols, L, D, row_units, T, V)
        x = load_tile(x_ptr + base + offs, ok, L2_HINTS * DROP).to(tl.float32)
        lam = c * softplus(tl.load(a_param_ptr + cols, mask=cols < D, other=0.0))
        if pid == 0:
            tl.store(rate_ptr + cols, lam, mask=cols < D)
        a, m, _ = transition(-lam[None, :] * r[:, None], is_first)
        a = cut_resets(a, flagged, HAS_RESETS)
        u = m * g[:, None] * x
        if PACKED or HAS_INITIAL:
            entering = entering_state(h0_ptr, b, seq, taken_starts(starts, flagged, HAS_RESETS),
                                      cols, D, N_SEQ, PACKED, HAS_INITIAL)
            a, u = fold_starts(a, u, starts, entering)
        _, h = tl.associative_scan((a, u), 0, affine_combine)
        tl.store(end_ptr + (b * NC + k) * D + cols, last_row(h, tl.arange(0, T), T),
                 mask=cols < D)


@triton.jit(do_not_specialize=["row_units", "N_SEQ"])
def _samu_output_kernel(x_ptr, y_ptr, r_ptr, g_ptr, h_in_ptr, r_sum_ptr, end_ptr, rate_ptr,
                        skip_ptr, seq_ptr, h0_ptr, reset_ptr, final_ptr, L, D, NC, N_SEQ,
                        row_units, T: tl.constexpr, BD: tl.constexpr, V: tl.constexpr,
                        PACKED: tl.constexpr, HAS_INITIAL: tl.constexpr, HAS_FINAL: tl.constexpr,
                        HAS_RESETS: tl.constexpr, WALKED_CARRY: tl.constexpr):
    """Per (chunk, channel block): y = h + skip x with h rebuilt from the chunk's entering state;
    h at each sequence's last token into final (HAS_FINAL).  The entering state is chunk_carry's
    (h_in), or with WALKED_CARRY walked here over the chunk summaries (r_sum, end) and written to
    h_in for the backward."""
    pid = tl.program_id(0)
    b = (pid // NC).to(tl.int64)
    k = pid % NC
    rows = k * T + tl.arange(0, T)
    row_ok = rows < L
    seq, starts, ends = row_sequences(seq_ptr, b, rows, L, PACKED)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    base, offs, ok = _tile(b, k, rows, cols, L, D, row_units, T, V)
    x = tl.load(x_ptr + base + offs, mask=ok, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + b * L + rows, mask=row_ok, other=0.0)
    g = tl.load(g_ptr + b * L + rows, mask=row_ok, other=0.0)
    lam = tl.load(rate_ptr + cols, mask=cols < D, other=0.0)
    flagged = token_resets(reset_ptr, b, rows, L, HAS_RESETS)
    a, m, _ = transition(-lam[None, :] * r[:, None],
                         reset_mask(starts, flagged, HAS_INITIAL, HAS_RESETS))
    a = cut_resets(a, flagged, HAS_RESETS)
    u = m * g[:, None] * x
    if PACKED or HAS_INITIAL:
        entering = entering_state(h0_ptr, b, seq, taken_starts(starts, flagged, HAS_RESETS),
                                  cols, D, N_SEQ, PACKED, HAS_INITIAL)
        a, u = fold_starts(a, u, starts, entering)
    p, h = tl.associative_scan((a, u), 0, affine_combine)
    if WALKED_CARRY:
        h_in = walked_carry(r_sum_ptr, end_ptr, lam, b, k, NC, cols, D, False)
        tl.store(h_in_ptr + (b * NC + k) * D + cols, h_in, mask=cols < D)
    else:
        h_in = tl.load(h_in_ptr + (b * NC + k) * D + cols, mask=cols < D, other=0.0)
    h = h + p * h_in[None, :]
    if HAS_FINAL:
        store_at(final_ptr, h, b, seq, ends, cols, D, N_SEQ, PACKED)
    y = h + tl.load(skip_ptr) * x
    tl.store(y_ptr + base + offs, to_element(y, y_ptr), mask=ok)


@triton.jit(do_not_specialize=["row_units", "N_SEQ"])
def _samu_reverse_summary_kernel(dy_ptr, r_ptr, rate_ptr, seq_ptr, reset_ptr, dfinal_ptr,
                                 end_ptr, L, D, NC, N_SEQ, row_units,
                                 T: tl.constexpr, BD: tl.constexpr, V: tl.constexpr,
                                 PACKED: tl.constexpr, HAS_DFINAL: tl.constexpr,
                                 HAS_RESETS: tl.constexpr):
    """Per (chunk, channel block): the adjoint carry a_s dh_s leaving the chunk's first token,
    with nothing entering from the right.  Rows are taken latest first, so the reverse
    recurrence is a forward scan (Triton's reverse scan shuffles even within a thread).  The
    final state's gradient enters at each sequence's end; nothing leaves through a start."""
    pid = tl.program_id(0)
    b = (pid // NC).to(tl.int64)
    k = pid % NC
    rows = k * T + (T - 1 - tl.arange(0, T))
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    base, offs, ok = _tile(b, k, rows, cols, L, D, row_units, T, V)
    dy = tl.load(dy_ptr + base + offs, mask=ok, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + b * L + rows, mask=rows < L, other=0.0)
    lam = tl.load(rate_ptr + cols, mask=cols < D, other=0.0)
    a = exp_fast(-lam[None, :] * r[:, None])
    a, dy = adjoint_inputs(a, dy, seq_ptr, dfinal_ptr, b, rows, L, cols, D, N_SEQ, PACKED,
                           HAS_DFINAL)
    a = cut_resets(a, token_resets(reset_ptr, b, rows, L, HAS_RESETS), HAS_RESETS)
    _, v = tl.associative_scan((a, a * dy), 0, affine_combine)
    tl.store(end_ptr + (b * NC + k) * D + cols, last_row(v, tl.arange(0, T), T), mask=cols < D)


@triton.jit
def _samu_chunk_adjoint(x_ptr, dy_ptr, h_in_ptr, carry_ptr, r_sum_ptr, rate_ptr, h0_ptr,
                        dfinal_ptr, dh0_ptr, b, k, rows, cols, seq, starts, ends, flagged, r, g,
                        L, D, NC, N_SEQ, row_units,
                        T: tl.constexpr, V: tl.constexpr, NEED_H: tl.constexpr,
                        PACKED: tl.constexpr, HAS_INITIAL: tl.constexpr,
                        HAS_DFINAL: tl.constexpr, HAS_RESETS: tl.constexpr,
                        WALKED_CARRY: tl.constexpr, POLICY: tl.constexpr):
    """Recompute one [T, BD] tile of the backward: x, dy, a, m, dh and (if NEED_H) dlog a, and
    then d h0 = a_s dh_s at each start (HAS_INITIAL).  rows run latest first: the adjoint is a
    forward scan; a_t h_{t-1} is unrolled from the earliest row.  The carry is chunk_carry's, or
    with WALKED_CARRY walked here over the reverse summaries (carry_ptr) and sums of r.  x and
    dy load with the L2 eviction priority POLICY (scan.load_tile)."""
    base, offs, ok = _tile(b, k, rows, cols, L, D, row_units, T, V)
    x = load_tile(x_ptr + base + offs, ok, POLICY).to(tl.float32)
    dy = load_tile(dy_ptr + base + offs, ok, POLICY).to(tl.float32)
    lam = tl.load(rate_ptr + cols, mask=cols < D, other=0.0)
    log_a = -lam[None, :] * r[:, None]
    a, m, dm_dlog_a = transition(log_a, reset_mask(starts, flagged, HAS_INITIAL, HAS_RESETS))
    a = cut_resets(a, flagged, HAS_RESETS)  # no gradient into a, d h0 or a later token's dh
    gx = g[:, None] * x
    state = (b * NC + k) * D + cols
    if WALKED_CARRY:
        carry = walked_carry(r_sum_ptr, carry_ptr, lam, b, k, NC, cols, D, True)
    else:
        carry = tl.load(carry_ptr + state, mask=cols < D, other=0.0)
    # dh_t = dy_t + a_{t+1} dh_{t+1}; the chunk's last token (row 0) takes the carry (a dh)
    # instead.  a_{t+1} is the next row's a, moved within the thread (the state rows' loads
    # keep the tile's layout: sequences.load_at).
    a_next = shifted_rows(a, 1.0, T)
    if PACKED:  # nothing crosses a start backwards
        a_next = tl.where(ends[:, None], 0.0, a_next)
    dy_state = dy
    if HAS_DFINAL:
        dy_state += load_at(dfinal_ptr, b, seq, ends, cols, D, N_SEQ, PACKED)
    q, w = tl.associative_scan((a_next, dy_state), 0, affine_combine)
    dh = w + q * carry[None, :]
    dla = tl.zeros_like(dh)
    if NEED_H:
        h_in = tl.load(h_in_ptr + state, mask=cols < D, other=0.0)
        u = m * gx
        if PACKED or HAS_INITIAL:
            entering = entering_state(h0_ptr, b, seq, taken_starts(starts, flagged, HAS_RESETS),
                                      cols, D, N_SEQ, PACKED, HAS_INITIAL)
            a_fold, u_fold = fold_starts(a, u, starts, entering)
            a_h_prev = decayed_previous_state(a_fold, u_fold, h_in, T) + (u_fold - u)
        else:
            a_h_prev = decayed_previous_state(a, u, h_in, T)
        dla = dh * a_h_prev + dh * gx * dm_dlog_a
        if HAS_INITIAL:  # pass 1 only
            store_at(dh0_ptr, a * dh, b, seq, starts, cols, D, N_SEQ, PACKED)
    return base, offs, ok, x, dy, m, dh, dla, lam, log_a


@triton.jit(do_not_specialize=["row_units", "N_SEQ"])
def _samu_backward_kernel(x_ptr, dy_ptr, dx_ptr, w_ptr, r_ptr, g_ptr, h_in_ptr, carry_ptr,
                          r_sum_ptr, rate_ptr, log_temp_ptr, skip_ptr, seq_ptr, h0_ptr, reset_ptr,
                          dfinal_ptr, dh0_ptr, dz_ptr, part_ptr, dsp_part_ptr, L, D, NC, N_SEQ,
                          TOKENS, row_units,
                          T: tl.constexpr, BD: tl.constexpr, V: tl.constexpr,
                          PACKED: tl.constexpr, HAS_INITIAL: tl.constexpr,
                          HAS_DFINAL: tl.constexpr, HAS_RESETS: tl.constexpr,
                          WALKED_CARRY: tl.constexpr, PARTIAL_DX: tl.constexpr,
                          L2_HINTS: tl.constexpr):
    """Per chunk, full width.  Pass 1 reduces dr, dg per token (and per-channel and scalar
    partials) and writes dz = (dz_r, dz_g) per token into dz [2, TOKENS]; pass 2 writes
    dx = dh m g + skip dy + W^T dz.  With PARTIAL_DX, pass 1 also writes dh m g + skip dy into
    dx (in dx's dtype: dx is then rounded twice) and pass 2 only adds W^T dz to what it reads
    back, instead of forming the adjoint again.  The chunk's parameter gradients go to its rows (summed by
    reduce.sum_partials): in part [d log_temp, d skip, d ctrl_bias (2)], in dsp_part
    d softplus; d ctrl_weight = dz^T x is reduce.weight_partials' (no 2 D-wide row per chunk).
    With WALKED_CARRY, carry_ptr holds the reverse summaries (see _samu_chunk_adjoint)."""
    pid = tl.program_id(0)
    row = part_ptr + pid.to(tl.int64) * 4
    b = (pid // NC).to(tl.int64)
    k = pid % NC
    rows = k * T + (T - 1 - tl.arange(0, T))  # latest first (see _samu_chunk_adjoint)
    row_ok = rows < L
    seq, starts, ends = row_sequences(seq_ptr, b, rows, L, PACKED)
    flagged = token_resets(reset_ptr, b, rows, L, HAS_RESETS)
    r = tl.load(r_ptr + b * L + rows, mask=row_ok, other=0.0)
    g = tl.load(g_ptr + b * L + rows, mask=row_ok, other=0.0)
    c = 8.0 * tl.exp(tl.load(log_temp_ptr))
    skip = tl.load(skip_ptr)
    # Per-thread partial sums over channels; one cross-thread reduction after the loop.
    dr_part = tl.zeros([T, BD], dtype=tl.float32)
    dg_part = tl.zeros([T, BD], dtype=tl.float32)
    d_log_temp = tl.zeros([BD], dtype=tl.float32)
    d_skip = tl.zeros([BD], dtype=tl.float32)
    for d0 in range(0, D, BD):
        cols = d0 + tl.arange(0, BD)
        base, offs, ok, x, dy, m, dh, dla, lam, log_a = _samu_chunk_adjoint(
            x_ptr, dy_ptr, h_in_ptr, carry_ptr, r_sum_ptr, rate_ptr, h0_ptr, dfinal_ptr,
            dh0_ptr, b, k, rows, cols, seq, starts, ends, flagged, r, g, L, D, NC, N_SEQ,
            row_units, T, V, True, PACKED, HAS_INITIAL, HAS_DFINAL, HAS_RESETS, WALKED_CARRY,
            L2_HINTS * (1 - PARTIAL_DX) * KEEP)  # with PARTIAL_DX pass 2 reads dx instead
        dr_part += dla * -lam[None, :]
        dg_part += dh * m * x
        if PARTIAL_DX:
            tl.store(dx_ptr + base + offs, to_element(dh * m * g[:, None] + skip * dy, dx_ptr),
                     mask=ok)
        tl.store(dsp_part_ptr + pid.to(tl.int64) * D + cols,
                 tl.sum(dla * (-c * r[:, None]), axis=0), mask=cols < D)
        d_log_temp += tl.sum(dla * log_a, axis=0)
        d_skip += tl.sum(dy * x, axis=0)
    dz0 = tl.where(row_ok, tl.sum(dr_part, axis=1) * r * (1.0 - r), 0.0)
    dz1 = tl.where(row_ok, tl.sum(dg_part, axis=1) * g * (1.0 - g), 0.0)
    tl.store(dz_ptr + b * L + rows, dz0, mask=row_ok)
    tl.store(dz_ptr + TOKENS + b * L + rows, dz1, mask=row_ok)
    tl.store(row, tl.sum(d_log_temp, axis=0))
    tl.store(row + 1, tl.sum(d_skip, axis=0))
    tl.store(row + 2, tl.sum(dz0, axis=0))
    tl.store(row + 3, tl.sum(dz1, axis=0))
    for d0 in range(0, D, BD):
        cols = d0 + tl.arange(0, BD)
        w0 = tl.load(w_ptr + cols, mask=cols < D, other=0.0)
        w1 = tl.load(w_ptr + D + cols, mask=cols < D, other=0.0)
        if PARTIAL_DX:  # each thread reads back the elements it wrote in pass 1
            base, offs, ok = _tile(b, k, rows, cols, L, D, row_units, T, V)
            dx = tl.load(dx_ptr + base + offs, mask=ok, other=0.0).to(tl.float32)
        else:
            base, offs, ok, x, dy, m, dh, dla, lam, log_a = _samu_chunk_adjoint(
                x_ptr, dy_ptr, h_in_ptr, carry_ptr, r_sum_ptr, rate_ptr, h0_ptr, dfinal_ptr,
                dh0_ptr, b, k, rows, cols, seq, starts, ends, flagged, r, g, L, D, NC, N_SEQ,
                row_units, T, V, False, PACKED, HAS_INITIAL, HAS_DFINAL, HAS_RESETS,
                WALKED_CARRY,
                L2_HINTS * DROP)
            dx = dh * m * g[:, None] + skip * dy
        dx += dz0[:, None] * w0[None, :] + dz1[:, None] * w1[None, :]
        store_tile(dx_ptr + base + offs, to_element(dx, dx_ptr), ok, L2_HINTS * DROP)


# A thread holds T x vector values of each tile: past 64 the summary kernel spills (SASS).
VALUES_PER_THREAD = 64


@dataclass(frozen=True)
class Launch:
    """Warps and channels per thread of one kernel; the tile is 32 * warps * vector channels wide,
    so that each thread holds all T tokens of its channels (scan.row_offsets).  Longer
    chunks take fewer channels per thread (VALUES_PER_THREAD)."""
    warps: int
    vector: int
    registers: int | None = None  # a cap on registers per thread (Triton's maxnreg), or none

    def __post_init__(self):
        check_launch(self)

    def tile(self, width: int, chunk: int):
        vector = vector_width(width, min(self.vector, max(1, VALUES_PER_THREAD // chunk)))
        return dict(BD=tile_width(self.warps, vector), V=vector, num_warps=self.warps,
                    **register_cap(self.registers))


# Launches chosen from per-kernel GPU times on the H200 (docs/PERFORMANCE.md): 4 channels per
# thread (8-byte loads) suit the summaries, 2 the output; where a chunk differs, LAUNCHES below.
@dataclass(frozen=True)
class SamuConfig:
    """One SAMU backend: tokens per chunk and each kernel's launch.  The name is generated from
    the chunk; launches are tuning (sweeps pass other ones in), not part of the name.
    Up to walked_carry_chunks chunks per row, and while B L D is at most walked_carry_elements
    (where the host, not the GPU, sets the time), the output and backward kernels walk the
    chunk summaries for their carries themselves (carry.walked_carry) instead of launching
    chunk_carry: two launches fewer per forward+backward, for instructions that grow with the
    row's chunk count."""
    chunk: int
    summary: Launch = Launch(2, 4)
    output: Launch = Launch(2, 2)
    reverse_summary: Launch = Launch(2, 4)
    backward: Launch = Launch(4, 1)
    walked_carry_chunks: int = 16
    walked_carry_elements: int = 1 << 20
    carry: CarryPlan = DEFAULT_PLAN
    partial_dx: bool = False
    l2_hints: bool = False

    def __post_init__(self):
        check_configuration(self, dict(walked_carry_chunks=0, walked_carry_elements=0))

    def walks_carry(self, n_chunks: int, elements: int) -> bool:
        return n_chunks <= self.walked_carry_chunks and elements <= self.walked_carry_elements

    @property
    def name(self) -> str:
        return f"fused_controller_hierarchical_chunk{self.chunk}"

    def launches(self) -> dict[str, Launch]:
        return {role: getattr(self, role) for role in KERNELS}


KERNELS = {"summary": _samu_summary_kernel, "output": _samu_output_kernel,
           "reverse_summary": _samu_reverse_summary_kernel, "backward": _samu_backward_kernel}


@functools.lru_cache(maxsize=None)
def tiles(config: SamuConfig, width: int) -> dict:
    """Each kernel's constexprs and warps (by role), and the row_units argument of its tiles."""
    out = {}
    for role, setting in config.launches().items():
        out[role] = setting.tile(width, config.chunk)
        out[role + "_units"] = row_stride_units(width, out[role])
    return out


# The state keywords' constexprs of each kernel (samu.ops.common.sequences).
FEATURES = {"summary": ("PACKED", "HAS_INITIAL", "HAS_RESETS"),
            "output": ("PACKED", "HAS_INITIAL", "HAS_FINAL", "HAS_RESETS"),
            "reverse_summary": ("PACKED", "HAS_DFINAL", "HAS_RESETS"),
            "backward": ("PACKED", "HAS_INITIAL", "HAS_DFINAL", "HAS_RESETS")}


def launch_plan(config: SamuConfig, width: int, features: bool = False):
    """(kernel, constexprs, compile options) of every kernel a backend launches at this width:
    without the state keywords, or (features=True) with all of them."""
    plan = []
    for role, kernel in KERNELS.items():
        meta = dict(with_state_keywords(tiles(config, width)[role], features))
        options = {name: meta.pop(name) for name in ("num_warps", "maxnreg") if name in meta}
        flags = {name: features for name in FEATURES[role]}
        if role in ("output", "backward"):  # the carry as chunk_carry gives it (long rows)
            flags["WALKED_CARRY"] = False
        if role == "backward":
            flags["PARTIAL_DX"] = config.partial_dx
        if role in ("summary", "backward"):
            flags["L2_HINTS"] = config.l2_hints
        plan.append((kernel, dict(T=config.chunk, **meta, **flags), options))
    return plan


@functools.lru_cache(maxsize=None)
def _launch_meta(config: SamuConfig, width: int, keywords: tuple[str, ...]) -> dict:
    """tiles() as one call's kernels take them: a kernel's register cap is off where one of
    its own state keywords (FEATURES) is among the call's (launching.with_state_keywords)."""
    out = dict(tiles(config, width))
    for role, names in FEATURES.items():
        out[role] = with_state_keywords(out[role], any(n in keywords for n in names))
    return out


def _keywords(**flags) -> tuple[str, ...]:
    """The names of the state keywords that are on, for _launch_meta."""
    return tuple(name for name, on in flags.items() if on)


class _ForwardPlan(NamedTuple):
    n_chunks: int
    meta: dict
    walked: bool  # the output kernel walks the chunk summaries itself (no chunk_carry)
    summary: Site
    output: Site


@functools.lru_cache(maxsize=256)
def _forward_plan(config: SamuConfig, shape: tuple, count: int, dtype, state_dtype, device,
                  keywords: tuple[str, ...]) -> _ForwardPlan:
    """What a forward with this signature launches: its key fixes every int the kernels take
    (from the shape and the sequence count) and every tensor dtype (x's, the initial state's
    or its placeholder's; the rest are FP32), as launching.Site requires."""
    batch, length, width = shape
    n_chunks = cdiv(length, config.chunk)
    meta = _launch_meta(config, width, keywords)
    flags = dict(PACKED="PACKED" in keywords, HAS_INITIAL="HAS_INITIAL" in keywords,
                 HAS_RESETS="HAS_RESETS" in keywords)
    walked = config.walks_carry(n_chunks, batch * length * width)
    summary = Site(_samu_summary_kernel, (batch * n_chunks,),
                   dict(T=config.chunk, **meta["summary"], **flags, L2_HINTS=config.l2_hints))
    output = Site(_samu_output_kernel, (batch * n_chunks, cdiv(width, meta["output"]["BD"])),
                  dict(T=config.chunk, **meta["output"], **flags,
                       HAS_FINAL="HAS_FINAL" in keywords, WALKED_CARRY=walked))
    return _ForwardPlan(n_chunks, meta, walked, summary, output)


class _BackwardPlan(NamedTuple):
    meta: dict
    reverse_summary: Site
    main: Site


@functools.lru_cache(maxsize=256)
def _backward_plan(config: SamuConfig, shape: tuple, count: int, dtypes: tuple, device,
                   keywords: tuple[str, ...], walked: bool) -> _BackwardPlan:
    """_forward_plan's twin for the backward; dtypes: x's, dy's and the initial state's (or its
    placeholder's)."""
    batch, length, width = shape
    n_chunks = cdiv(length, config.chunk)
    meta = _launch_meta(config, width, keywords)
    flags = dict(PACKED="PACKED" in keywords, HAS_INITIAL="HAS_INITIAL" in keywords,
                 HAS_DFINAL="HAS_DFINAL" in keywords, HAS_RESETS="HAS_RESETS" in keywords)
    items = batch * n_chunks
    reverse_summary = Site(_samu_reverse_summary_kernel,
                           (items, cdiv(width, meta["reverse_summary"]["BD"])),
                           dict(T=config.chunk, **meta["reverse_summary"],
                                PACKED=flags["PACKED"], HAS_DFINAL=flags["HAS_DFINAL"],
                                HAS_RESETS=flags["HAS_RESETS"]))
    main = Site(_samu_backward_kernel, (items,),
                dict(T=config.chunk, **meta["backward"], **flags, WALKED_CARRY=walked,
                     PARTIAL_DX=config.partial_dx, L2_HINTS=config.l2_hints))
    return _BackwardPlan(meta, reverse_summary, main)


@functools.lru_cache(maxsize=None)
def gradient_sizes(width: int) -> tuple[int, ...]:
    """Columns of each gradient in sum_partials' output, in order: d ctrl_weight (the weight
    rows), d log_temp, d skip, d ctrl_bias (the scalar rows), then d a_param."""
    return (2 * width, 1, 1, 2, width)


def _residual_shapes(batch: int, length: int, width: int, n_chunks: int) -> tuple:
    """Shapes of what forward keeps for the backward, all FP32 pieces of one buffer
    (launching.workspace), the one residual, in its order: the chunks' entering states h_in
    ([B, NC, D]), the per-channel rate ([D]), r, g ([B, L]) and the chunks' sums of r ([B, NC]).
    The largest first and the sums of r (often not whole 16-byte lines) last: at most shapes
    no gap between pieces needs zeroing."""
    return ((batch, n_chunks, width), (width,), (batch, length), (batch, length),
            (batch, n_chunks))


@functools.lru_cache(maxsize=256)
def _residual_numels(batch: int, length: int, width: int, n_chunks: int) -> tuple:
    return tuple(map(math.prod, _residual_shapes(batch, length, width, n_chunks)))


def _residual_buffer(batch: int, length: int, width: int, n_chunks: int, device,
                     zero_gaps: bool):
    """(the residual buffer, its pieces h_in, rate, r, g, r_sum): one allocation; zero_gaps as
    launching.workspace's."""
    return workspace(_residual_numels(batch, length, width, n_chunks), device,
                     zero_gaps=zero_gaps)


def _shaped(buffers: tuple, batch: int, length: int, width: int, n_chunks: int) -> tuple:
    """The residual pieces in their shapes, for torch ops (the kernels take the pieces)."""
    return tuple(exact(piece, shape) for piece, shape in
                 zip(buffers, _residual_shapes(batch, length, width, n_chunks)))


def _summaries(x, params, sequences, plan: _ForwardPlan, rate, r, g, r_sum):
    """The summary kernel over aligned x: r, g, the chunks' sums of r and the rate into the
    given buffers; returns the chunks' end states from zero, [B, NC, D] FP32."""
    batch, length, width = x.shape
    w, bias, a_param, log_temp = params
    end = torch.empty(batch, plan.n_chunks, width, device=x.device, dtype=torch.float32)
    plan.summary(x, w, bias, a_param, log_temp, sequences.seq_index, sequences.initial_state,
                 sequences.reset_flags, r, g, r_sum, end, rate, length, width, plan.n_chunks,
                 sequences.count, plan.meta["summary_units"])
    return end


def _plan_of(x, sequences, config: SamuConfig, keywords: tuple[str, ...]) -> _ForwardPlan:
    return _forward_plan(config, x.shape, sequences.count, x.dtype,
                         sequences.initial_state.dtype, x.device, keywords)


def forward(x, params, sequences, config: SamuConfig, summary=None, zero_gaps: bool = True):
    """(y, final state or None, residuals): the forward's kernels.  The residuals are the
    tensors the backward needs beside x and the parameters: one FP32 buffer
    (_residual_shapes), whose gaps between pieces are zeroed unless ``zero_gaps`` is off (a
    custom op's output must hold nothing uninitialised; the autograd.Function's need not).  ``summary``: (that buffer, its pieces, end) with r, g, the sums of r,
    the rate and the chunks' end states of the summary kernel over the same x, unpacked, from a
    zero initial state, or from the reset in a call without one (_slice_pass): reused instead
    of running it again, chunk 0's end state moved by its decay times the initial state."""
    x = aligned(x)
    batch, length, width = x.shape
    w, bias, a_param, log_temp, skip = [fp32_contiguous(p) for p in params]
    seq, h0 = sequences.seq_index, sequences.initial_state
    plan = _plan_of(x, sequences, config, _keywords(PACKED=sequences.packed,
                                                    HAS_INITIAL=sequences.has_initial,
                                                    HAS_FINAL=sequences.output_final_state,
                                                    HAS_RESETS=sequences.has_resets))
    n_chunks = plan.n_chunks
    if summary is None:
        buffer, buffers = _residual_buffer(batch, length, width, n_chunks, x.device, zero_gaps)
        end = _summaries(x, (w, bias, a_param, log_temp), sequences, plan, *buffers[1:])
    else:
        if sequences.packed:
            raise ValueError("samu: a summary is reused by an unpacked call only")
        buffer, buffers, end = summary  # from a zero state, or from the reset without h0
        if sequences.has_initial:  # linear in it: h0 enters decayed
            _, rate, _, _, r_sum = _shaped(buffers, batch, length, width, n_chunks)
            end[:, 0] += torch.exp(-rate * r_sum[:, :1]) * h0
    h_in, rate, r, g, r_sum = buffers
    if not plan.walked:
        chunk_carry(r_sum, end, reverse=False, rate=rate, out=h_in, plan=config.carry)
    y = torch.empty_like(x)
    final = sequences.final_state(width, x.device)
    plan.output(x, y, r, g, h_in, r_sum, end, rate, skip, seq, h0, sequences.reset_flags, final,
                length, width, n_chunks, sequences.count, plan.meta["output_units"])
    return y, (final if sequences.output_final_state else None), (buffer,)


def residual_specs(config: SamuConfig, batch: int, length: int, width: int, dtype,
                   params=None):
    """(shape, dtype) of each of forward's residuals, for a compiled graph's fake tensors
    (params, which the RG-LRU family's residuals depend on through its heads, are not needed)."""
    shapes = _residual_shapes(batch, length, width, cdiv(length, config.chunk))
    # uncached: a compiled graph's sizes may be symbolic, which do not hash
    sizes = piece_sizes.__wrapped__(tuple(math.prod(shape) for shape in shapes), 4)
    return [((sum(sizes),), torch.float32)]


def spent_residuals(config: SamuConfig):
    """None: the backward writes over nothing it was given (samu.ops.common.family)."""
    return None


# Programs per SM of the d ctrl_weight reduction (split over tokens): enough loads in flight.
WEIGHT_PROGRAMS_PER_SM = 4


def backward(x, params, residuals, dy, d_final, sequences, config: SamuConfig,
             spend_residuals: bool = False, end_cotangent=None):
    """(dx, d ctrl_weight, d ctrl_bias, d a_param, d log_temp, d skip, d initial_state or
    None): the backward's kernels.  dy and d_final may be None (no gradient reached them).
    Nothing is written over the residuals (spend_residuals changes nothing).
    ``end_cotangent`` (unpacked only): called once the adjoint carry is known with mu, FP32
    [B, D], the adjoint leaving the first token for the state entering it; it returns a
    cotangent to add on the final state (or None), which the rest of the backward takes in
    (context parallelism: the later ranks' cotangent)."""
    if end_cotangent is not None and sequences.packed:
        raise ValueError("samu: end_cotangent needs an unpacked call")
    x = aligned(x)
    w, bias, a_param, log_temp, skip = [fp32_contiguous(p) for p in params]
    chunk = config.chunk
    dy = torch.zeros_like(x) if dy is None else aligned(dy)
    batch, length, width = x.shape
    n_chunks = cdiv(length, chunk)
    h_in, rate, r, g, r_sum = pieces(aligned(residuals[0]),
                                     _residual_numels(batch, length, width, n_chunks))
    seq, h0 = sequences.seq_index, sequences.initial_state
    has_dfinal = d_final is not None
    walked = config.walks_carry(n_chunks, x.numel()) and end_cotangent is None

    def plan_with(has_dfinal: bool) -> _BackwardPlan:
        return _backward_plan(config, x.shape, sequences.count, (x.dtype, dy.dtype, h0.dtype),
                              x.device, _keywords(PACKED=sequences.packed,
                                                  HAS_INITIAL=sequences.has_initial,
                                                  HAS_DFINAL=has_dfinal,
                                                  HAS_RESETS=sequences.has_resets), walked)
    plan = plan_with(has_dfinal)
    meta = plan.meta
    d_final = fp32_contiguous(d_final) if has_dfinal else h0
    items = batch * n_chunks
    tokens = batch * length
    programs = WEIGHT_PROGRAMS_PER_SM * sm_count(x.device)
    splits = weight_rows(tokens, width, programs)
    # One workspace: the reverse summaries, the per-chunk rows (d log_temp, d skip, d ctrl_bias),
    # dz and the split-K weight rows, and where the carry is walked the d softplus rows.
    _, (end, part, dz, rows, *dsp_part) = workspace(
        (items * width, items * 4, 2 * tokens, splits * 2 * width)
        + ((items * width,) if walked else ()), x.device)
    flags = sequences.reset_flags
    plan.reverse_summary(dy, r, rate, seq, flags, d_final, end, length, width, n_chunks,
                         sequences.count, meta["reverse_summary_units"])
    if walked:  # the backward kernel walks the reverse summaries: its rows go elsewhere
        carry, dsp_part = end, dsp_part[0]
    else:
        end = exact(end, (batch, n_chunks, width))
        carry = chunk_carry(r_sum, end, reverse=True, rate=rate, plan=config.carry)
        if end_cotangent is not None:
            _, rate, _, _, r_sum = _shaped((h_in, rate, r, g, r_sum), batch, length, width,
                                           n_chunks)
            extra = take_end_cotangent(end_cotangent, _start_adjoint(end, carry, r_sum, rate))
            if extra is not None:  # linear: it reaches the last chunk's start decayed
                end[:, -1] += torch.exp(-rate * r_sum[:, -1:]) * extra
                d_final = extra if not has_dfinal else d_final + extra
                has_dfinal = True
                plan = plan_with(True)
                meta = plan.meta
                carry = chunk_carry(r_sum, end, reverse=True, rate=rate, plan=config.carry)
        dsp_part = end  # end is spent: the carry has read it
    dx = torch.empty_like(x)
    d_h0 = sequences.initial_state_gradient()
    plan.main(x, dy, dx, w, r, g, h_in, carry, r_sum, rate, log_temp, skip, seq, h0, flags,
              d_final, d_h0, dz, part, dsp_part, length, width, n_chunks, sequences.count, tokens,
              meta["backward_units"])
    weight_partials(x, dz, programs, out=rows)
    grads = sum_partials(part, dsp_part, a_param, front=rows,
                         rows=(splits, 2 * width, items, 4, width))
    d_weight, d_log_temp, d_skip, d_bias, d_a_param = grads.split_with_sizes(
        gradient_sizes(width))
    return (dx, d_weight.view(2, width), d_bias, d_a_param, d_log_temp.view(()),
            d_skip.view(()), d_h0 if sequences.has_initial else None)


class _SlicePass(NamedTuple):
    x: torch.Tensor  # aligned
    sequences: object
    meta: dict
    buffer: torch.Tensor  # the residual buffer: all but h_in written
    buffers: tuple  # its pieces
    r_sum: torch.Tensor  # [B, NC]
    rate: torch.Tensor  # [D]
    end: torch.Tensor  # [B, NC, D]


def _slice_pass(x, params, config: SamuConfig, initial_state, *keywords: str) -> _SlicePass:
    """The summary kernel over a slice that holds no sequence start after its first token.
    ``initial_state``: the FP32 [B, D] state entering the first token (an ordinary step from it:
    zeros for a slice that continues a sequence), or None where a sequence starts there and
    resets."""
    x = aligned(x)
    batch, length, width = x.shape
    w, bias, a_param, log_temp, _ = [fp32_contiguous(p) for p in params]
    sequences = sequence_args(x, initial_state, None, False)
    plan = _plan_of(x, sequences, config, _keywords(HAS_INITIAL=initial_state is not None,
                                                    **{k: True for k in keywords}))
    buffer, buffers = _residual_buffer(batch, length, width, plan.n_chunks, x.device, False)
    end = _summaries(x, (w, bias, a_param, log_temp), sequences, plan, *buffers[1:])
    _, rate, _, _, r_sum = _shaped(buffers, batch, length, width, plan.n_chunks)
    return _SlicePass(x, sequences, plan.meta, buffer, buffers, r_sum, rate, end)


def _zero_state(x) -> torch.Tensor:
    return torch.zeros(x.shape[0], x.shape[2], device=x.device, dtype=torch.float32)


def slice_summary(x, params, config: SamuConfig, initial_state=None, resets: bool = False):
    """(A, h), FP32 [B, D] each, of a slice that holds no sequence start after its first token:
    its end state is A h_in + h for the state h_in entering it.  The forward's summary kernel
    and carry without its output kernel: x read once, no y; A from the chunks' sums of r.
    Where a sequence starts at the first token, h is the end state itself: from
    ``initial_state`` (FP32 [B, D]), or with ``resets`` from the reset (A is then unused)."""
    check_phase_tensors("slice_summary", x, initial_state=initial_state)
    entering = None if resets else (_zero_state(x) if initial_state is None else initial_state)
    run = _slice_pass(x, params, config, entering)
    return _end_state(run, config)


def _end_state(run: _SlicePass, config: SamuConfig):
    """(A, h) of a slice from its chunks' sums of r and end states (end is only read); the
    residual buffer's h_in piece holds the carry (a forward from the pass writes it again)."""
    r_sum, rate, end = run.r_sum, run.rate, run.end
    h_in = chunk_carry(r_sum, end, reverse=False, rate=rate, plan=config.carry,
                       out=exact(run.buffers[0], end.shape))
    h = torch.exp(-rate * r_sum[:, -1:]) * h_in[:, -1] + end[:, -1]
    return torch.exp(-rate * r_sum.sum(1, keepdim=True)), h


def start_adjoint(x, params, dy, d_end, config: SamuConfig):
    """mu, FP32 [B, D]: the adjoint a_s dh_s that leaves a continued slice's first token s for
    the state entering it, from dy and the cotangent d_end on the slice's end state.  The
    summary kernel (for r), the backward's reverse summary and its carry: x and dy read once
    each, where a backward through the slice would run every kernel."""
    check_phase_tensors("start_adjoint", x, dy=dy, d_state=d_end)
    run = _slice_pass(x, params, config, _zero_state(x), "HAS_DFINAL")
    x, meta, r_sum, rate = run.x, run.meta, run.r_sum, run.rate
    batch, length, width = x.shape
    n_chunks = r_sum.shape[1]
    end = exact(run.buffers[0], (batch, n_chunks, width))  # the h_in piece: no forward follows
    grid = (batch * n_chunks, cdiv(width, meta["reverse_summary"]["BD"]))
    launching.launch(_samu_reverse_summary_kernel, grid, aligned(dy), run.buffers[2], rate,
                     run.sequences.seq_index, run.sequences.reset_flags, fp32_contiguous(d_end),
                     end, length, width, n_chunks, run.sequences.count,
                     meta["reverse_summary_units"], T=config.chunk, **meta["reverse_summary"],
                     PACKED=False, HAS_DFINAL=True, HAS_RESETS=False)
    carry = chunk_carry(r_sum, end, reverse=True, rate=rate, plan=config.carry)
    return _start_adjoint(end, carry, r_sum, rate)


def _start_adjoint(end, carry, r_sum, rate):
    """mu [B, D]: the adjoint leaving the first token, from the reverse summaries and carry."""
    return end[:, 0] + torch.exp(-rate * r_sum[:, :1]) * carry[:, 0]


class SliceRun:
    """One rank's slice under context parallelism (samu.distributed) that holds a piece of one
    sequence, unpacked: its kernels in three phases that share their work.
    ``summary`` runs the summary kernel and carry from a zero state; ``forward`` reuses that
    pass (no second read of x for r, g) from the entering state; ``backward`` hands the adjoint
    at the slice start out mid-way and takes the later ranks' cotangent in, so that the reverse
    summary over dy runs once.  Beside one call at the slice: two chunk carries and the
    collectives.  ``resets``: the slice starts a sequence without an initial state, which
    resets there (m = 1 at its first token, unlike a zero entering state)."""

    def __init__(self, x, params, config: SamuConfig, resets: bool = False):
        self.x, self.params, self.config = aligned(x), list(params), config
        self.resets = resets
        self._summary = self._saved = None

    @staticmethod
    def fits(params, config: SamuConfig) -> bool:
        """Every SAMU configuration shares its phases."""
        return True

    def summary(self):
        """(A, h), FP32 [B, D]: the slice's end state is A h_in + h (with ``resets``, h)."""
        start = None if self.resets else _zero_state(self.x)
        run = _slice_pass(self.x, self.params, self.config, start)
        self._summary = (run.buffer, run.buffers, run.end)
        return _end_state(run, self.config)

    def forward(self, entering):
        """(y, final state FP32 [B, D]) from ``entering``, the state entering the slice (None
        with ``resets``)."""
        sequences = slice_run_sequences(self, entering)
        y, final, residuals = forward(self.x, self.params, sequences, self.config,
                                      summary=self._summary, zero_gaps=False)
        self._summary = None  # its chunk-0 end state now holds the entering state
        self._saved = (sequences, residuals)
        return y, final

    def backward(self, dy, d_final, end_cotangent):
        """(dx, d ctrl_weight, d ctrl_bias, d a_param, d log_temp, d skip, d entering or None
        with ``resets``); end_cotangent as backward's.  Once only: the forward's residuals go
        with it."""
        check_phase_tensors("SliceRun.backward", self.x, dy=dy, d_state=d_final)
        sequences, residuals = self._saved
        self._saved = None
        grads = backward(self.x, self.params, residuals, dy, d_final, sequences, self.config,
                         end_cotangent=end_cotangent)
        return grads


# Each chunk's launches where they differ from SamuConfig's defaults.
LAUNCHES = {8: dict(backward=Launch(2, 2, registers=128)), 16: dict(summary=Launch(4, 2))}

# Each thread holds a chunk of every scan tile: beyond 32 tokens the backward kernel spills.
CONFIGS = tuple(SamuConfig(chunk, **LAUNCHES.get(chunk, {})) for chunk in (8, 16, 32))

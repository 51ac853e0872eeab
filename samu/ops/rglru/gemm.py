"""RG-LRU with its gate products in cuBLAS and its elementwise work and scans in Triton kernels.

The block-diagonal products run as strided batched GEMMs on head views of x (torch.bmm of
x.view(N, H, bw).transpose(0, 1), no copy, by W_cat = [Wx | Wa], [H, bw, 2 bw], in x's dtype):
G = [Gx | Ga] comes back as [H, N, 2 bw] in x's dtype, rounded as the eager autocast reference
rounds its products, and the biases are added in FP32 inside the kernels.  The kernels work on
flat channels d = h bw + j (any head count, any block width); only the addressing of G and dG
knows the heads.  The scan is hierarchical, as SAMU's: a per-chunk summary (decay, end state),
``chunk_carry``, and chunk outputs recomputed from the entering states; the backward mirrors it.

G is saved for the backward, which writes dG over it (peak memory of a forward+backward ~5
units, a unit being B L D BF16 elements: y, dx, G, the per-chunk states), or, in the recompute
configurations, not saved at all: the heads then run in groups (GemmConfig.workspace_units),
each group's G going into one workspace [heads per group, N, 2 bw] and its kernels covering
its DG = heads per group x bw channels, and the backward recomputes G group by group.  Peak
memory is then y and dx (1 each), one group's G (2 / groups), the saved entering states
(2 / T) and one group's decays, adjoint ends and carries (6 / (T groups)): 2.94 at T = 8 with
4 groups, for one more GEMM (6 bytes per element) and four times the launches.

Initial states, packed sequences (cu_seqlens) and final states follow samu.ops.layout, as in
samu.ops.samu.chunk: the forward folds each sequence start into the scan inputs (a_s -> 0,
u_s -> u_s + a_s h0), so that a chunk holding one has decay 0 and the carry needs nothing else;
the backward cuts the adjoint there, adds the final state's gradient at each end and writes
d h0 = a_s dh_s at each start.  A reset mask is one byte per token, loaded beside each tile's
gates: a = 0 and m = 1 at a flagged token, in every kernel (samu.ops.common.sequences).  Each
feature is a constexpr (PACKED, HAS_INITIAL, HAS_FINAL, HAS_DFINAL, HAS_RESETS): a call without
it compiles to the kernel it was before.

Bytes per element of [B, L, D] (BF16 x, y, dy, dx; G and dG hold two values per element):
  forward   gate GEMM reads x (2) and writes G (4)                                       6
            summary reads G and x (6)                                                    6
            output reads G and x, writes y (8)                                           8  -> 20
  backward  gate GEMM again, recompute only: reads x (2) and writes G (4)               (6)
            reverse summary reads Ga and dy (4)                                          4
            main kernel reads x, dy, G (8), writes dG over G (4) and dx's direct term (2) 14
            dx GEMM, in place on dx: reads dG (4) and dx (2), writes dx (2)              8
            dW GEMM reads x (2) and dG (4)                                               6  -> 32 (38)
The FP32 per-chunk states (decays and end states both ways, entering states, adjoint carries)
add ~52 D / T bytes per token, 6.5 per element at T = 8; the backward's partial rows are per
program, not per chunk, and reuse the spent summaries.  Saved for backward: x, G (x's dtype)
unless recomputed and the chunks' entering states: no FP32 [B, L, D] tensor, no a or log a.
FLOPs per element: 4 bw per GEMM, three GEMMs (four recomputing) -> 12 bw (1536 at bw = 128),
tensor cores; the kernels ~100 (sigmoids, exp, sqrt, the scans).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..common import launching
from ..common.carry import DEFAULT_PLAN, CarryPlan, chunk_carry
from ..common.launching import (Site, aligned, carve, carved_size, cdiv, check_configuration,
                                check_launch, fp32_contiguous, register_cap, sm_count,
                                tile_width, with_state_keywords)
from ..common.math import (FAST_MATH, _ptx_approx, exp_fast, one_minus_a_squared, sigmoid_fast,
                           softplus, to_element, transition)
from ..common.reduce import named_columns, sum_partials
from ..common.scan import affine_combine, decayed_previous_state, last_row
from ..common.sequences import (adjoint_inputs, check_phase_tensors, cut_resets, entering_state,
                                fold_starts, load_at, reset_mask, row_sequences, sequence_args,
                                slice_run_sequences, store_at, take_end_cotangent, taken_starts,
                                token_resets)
from ..recurrence import GATE_SCALE

MIXER = "rglru"


@triton.jit
def _columns(col0, DG: tl.constexpr, BN: tl.constexpr, V: tl.constexpr):
    """The program's BN channels (grid axis 1) of the launch's group of DG channels from col0:
    their channels, their places within the group, and their mask (all true, folded away, when
    BN divides DG).  They are hinted as multiples of V and no more, so that loads give each
    thread V adjacent channels and, with BN = 32 * warps * V, all T tokens of them (as
    scan.row_offsets does with an unspecialised width).  Computed here: a hint on a function's
    argument is lost."""
    local = tl.multiple_of(tl.program_id(1) * BN + tl.arange(0, BN), V)
    cols = tl.multiple_of(col0 + local, V)
    if DG % BN == 0:
        ok = tl.full([BN], 1, tl.int1)
    else:
        ok = local < DG
    return cols, local, ok


@triton.jit
def _state_columns(cols, col_ok, D: tl.constexpr):
    """The columns of the [N, D] state rows (h0, final state, their gradients): D, out of range,
    on a tile's padding lanes, whose channels belong to the next group (samu.ops.layout'
    loads and stores mask cols < D)."""
    return tl.where(col_ok, cols, D)


@triton.jit
def _chunk_tile(b, k, rows_in_chunk, local, col_ok, L, N, T: tl.constexpr, BW: tl.constexpr,
                V: tl.constexpr, RUN: tl.constexpr):
    """Chunk k's [T, BN] tile: its rows, its first token (int64), its mask, and the offsets of
    its channels' x-gate columns in the group's G [heads of the group, N, 2 BW] from the
    token's row (the a gate's lie BW further), from the channels' places in the group.  V divides BW: a thread's V channels sit in one head of G, contiguous and
    V-aligned; the block's channels run contiguous in G for RUN = gcd(BN, BW), which the hint
    says so that the columns, not the rows, are the loads' fast axis."""
    rows = k * T + rows_in_chunk
    head = local // BW
    within = head.to(tl.int64) * N * (2 * BW) + (local - head * BW)
    within = tl.max_contiguous(tl.multiple_of(within, V), RUN)
    ok = (rows < L)[:, None] & col_ok[None, :]
    return rows, b * L + k * T, ok, within


@triton.jit
def _rows_at(ptr, first, rows_in_chunk, cols, ROW: tl.constexpr):
    """Pointers to a tile of rows ROW elements apart, from the chunk's first token: the rows'
    offsets from it are constants (D and BW are constexprs), added last, which the loads and
    stores take as immediates, so that one address register per thread and tensor serves every
    row."""
    return (ptr + first * ROW + cols)[None, :] + (rows_in_chunk * ROW)[:, None]


@triton.jit
def _rsqrt_fast(x):
    """1 / sqrt(x) for x > 0: PTX rsqrt.approx.ftz (relative error ~2^-23)."""
    if FAST_MATH:
        return _ptx_approx(x, "rsqrt.approx.ftz.f32")
    else:
        return 1.0 / tl.sqrt(x)


@triton.jit
def _transition_rsqrt(log_a, is_first):
    """common.math.transition from one reciprocal square root r = 1 / sqrt(1 - a^2) instead of
    a sqrt and a reciprocal: m = (1 - a^2) r, and dm/dlog a = -a^2 min(r, 2000) (the floor of
    m at 5e-4 there).  1 - a^2 under 1e-30 gives m = 0 (it is under 1e-15), as sqrt.approx.ftz
    gives for the denormals."""
    a = exp_fast(log_a)
    v = one_minus_a_squared(log_a, a)
    r = _rsqrt_fast(tl.maximum(v, 1e-30))
    m = tl.where(is_first, 1.0, tl.where(v > 1e-30, v * r, 0.0))
    dm_dlog_a = tl.where(is_first, 0.0, -(a * a) * tl.minimum(r, 2000.0))
    return a, m, dm_dlog_a


@triton.jit
def _forward_tile(x_ptr, g_ptr, bx_ptr, ba_ptr, a_param_ptr, seq_ptr, h0_ptr, reset_ptr, b, k,
                  col0, L, N, N_SEQ, D: tl.constexpr, DG: tl.constexpr, T: tl.constexpr,
                  BN: tl.constexpr, V: tl.constexpr, BW: tl.constexpr, RUN: tl.constexpr,
                  PACKED: tl.constexpr, HAS_INITIAL: tl.constexpr, HAS_RESETS: tl.constexpr):
    """Chunk k's local scan from h_in = 0, sequence starts folded into its inputs: returns
    (prod a, h, first token, mask, columns, their places in the group, column mask, each row's
    sequence, ends)."""
    cols, local, col_ok = _columns(col0, DG, BN, V)
    rows_in_chunk = tl.arange(0, T)
    rows, first, ok, within = _chunk_tile(b, k, rows_in_chunk, local, col_ok, L, N, T, BW, V,
                                          RUN)
    g_at = _rows_at(g_ptr, first, rows_in_chunk, within, 2 * BW)
    x_at = _rows_at(x_ptr, first, rows_in_chunk, cols, D)
    bx = tl.load(bx_ptr + cols, mask=col_ok, other=0.0)
    ba = tl.load(ba_ptr + cols, mask=col_ok, other=0.0)
    sp = softplus(tl.load(a_param_ptr + cols, mask=col_ok, other=0.0))
    ga = sigmoid_fast(tl.load(g_at + BW, mask=ok, other=0.0).to(tl.float32) + ba[None, :])
    log_a = tl.where((rows < L)[:, None], -8.0 * ga * sp[None, :], 0.0)
    seq, starts, ends = row_sequences(seq_ptr, b, rows, L, PACKED)
    flagged = token_resets(reset_ptr, b, rows, L, HAS_RESETS)
    a, m, _ = transition(log_a, reset_mask(starts, flagged, HAS_INITIAL, HAS_RESETS))
    a = cut_resets(a, flagged, HAS_RESETS)
    gx = sigmoid_fast(tl.load(g_at, mask=ok, other=0.0).to(tl.float32) + bx[None, :])
    x = tl.load(x_at, mask=ok, other=0.0).to(tl.float32)
    u = m * gx * x
    if PACKED or HAS_INITIAL:
        entering = entering_state(h0_ptr, b, seq, taken_starts(starts, flagged, HAS_RESETS),
                                  _state_columns(cols, col_ok, D), D, N_SEQ, PACKED, HAS_INITIAL)
        a, u = fold_starts(a, u, starts, entering)
    p, h = tl.associative_scan((a, u), 0, affine_combine)
    return p, h, first, ok, cols, local, col_ok, seq, ends


# N_SEQ, the number of sequences, only masks state rows: one compiled kernel serves every count.
@triton.jit(do_not_specialize=["N_SEQ"])
def _summary_kernel(x_ptr, g_ptr, bx_ptr, ba_ptr, a_param_ptr, seq_ptr, reset_ptr, h0_ptr,
                    decay_ptr, end_ptr, col0, L, N, NC, N_SEQ, D: tl.constexpr, DG: tl.constexpr,
                    T: tl.constexpr, BN: tl.constexpr, V: tl.constexpr, BW: tl.constexpr,
                    RUN: tl.constexpr, PACKED: tl.constexpr, HAS_INITIAL: tl.constexpr,
                    HAS_RESETS: tl.constexpr):
    """Per (chunk, channel block of the group): the chunk's decay prod a and its end state from
    h_in = 0 (a chunk holding a sequence start or a reset has decay 0: its a is folded to 0
    there), into the group's [B, NC, DG] summaries."""
    pid = tl.program_id(0)
    b = (pid // NC).to(tl.int64)
    k = pid % NC
    p, h, _, _, _, local, col_ok, _, _ = _forward_tile(
        x_ptr, g_ptr, bx_ptr, ba_ptr, a_param_ptr, seq_ptr, h0_ptr, reset_ptr, b, k, col0, L, N,
        N_SEQ, D, DG, T, BN, V, BW, RUN, PACKED, HAS_INITIAL, HAS_RESETS)
    state = (b * NC + k) * DG + local
    tr = tl.arange(0, T)
    tl.store(decay_ptr + state, last_row(p, tr, T), mask=col_ok)
    tl.store(end_ptr + state, last_row(h, tr, T), mask=col_ok)


@triton.jit(do_not_specialize=["N_SEQ"])
def _output_kernel(x_ptr, g_ptr, y_ptr, bx_ptr, ba_ptr, a_param_ptr, h_in_ptr, seq_ptr,
                   reset_ptr, h0_ptr, final_ptr, col0, L, N, NC, N_SEQ, D: tl.constexpr,
                   DG: tl.constexpr, T: tl.constexpr, BN: tl.constexpr, V: tl.constexpr,
                   BW: tl.constexpr, RUN: tl.constexpr, PACKED: tl.constexpr,
                   HAS_INITIAL: tl.constexpr, HAS_FINAL: tl.constexpr, HAS_RESETS: tl.constexpr):
    """Per (chunk, channel block of the group): y = h, rebuilt from the chunk's entering state
    (the group's [B, NC, DG]); h at each sequence's last token into final (HAS_FINAL)."""
    pid = tl.program_id(0)
    b = (pid // NC).to(tl.int64)
    k = pid % NC
    p, h, first, ok, cols, local, col_ok, seq, ends = _forward_tile(
        x_ptr, g_ptr, bx_ptr, ba_ptr, a_param_ptr, seq_ptr, h0_ptr, reset_ptr, b, k, col0, L, N,
        N_SEQ, D, DG, T, BN, V, BW, RUN, PACKED, HAS_INITIAL, HAS_RESETS)
    h_in = tl.load(h_in_ptr + (b * NC + k) * DG + local, mask=col_ok, other=0.0)
    y_at = _rows_at(y_ptr, first, tl.arange(0, T), cols, D)
    h = h + p * h_in[None, :]
    tl.store(y_at, to_element(h, y_ptr), mask=ok)
    if HAS_FINAL:
        store_at(final_ptr, h, b, seq, ends, _state_columns(cols, col_ok, D), D, N_SEQ,
                 PACKED)


@triton.jit(do_not_specialize=["N_SEQ"])
def _reverse_summary_kernel(dy_ptr, g_ptr, ba_ptr, a_param_ptr, seq_ptr, reset_ptr, dfinal_ptr,
                            decay_ptr, end_ptr, col0, L, N, NC, N_SEQ, D: tl.constexpr,
                            DG: tl.constexpr, T: tl.constexpr, BN: tl.constexpr, V: tl.constexpr,
                            BW: tl.constexpr, RUN: tl.constexpr, PACKED: tl.constexpr,
                            HAS_DFINAL: tl.constexpr, HAS_RESETS: tl.constexpr):
    """Per (chunk, channel block of the group): the chunk's decay prod a (as the reverse carry
    reads it: cut at packed starts and resets; chunk 0's is never read) and the adjoint carry a_s dh_s
    leaving the chunk's first token s, with nothing entering from the right, into the group's
    [B, NC, DG] summaries.  Rows latest first: the reverse recurrence is a forward scan
    (Triton's reverse scan shuffles even within a thread).  The final state's gradient enters
    at each sequence's end; nothing leaves through a start."""
    pid = tl.program_id(0)
    b = (pid // NC).to(tl.int64)
    k = pid % NC
    cols, local, col_ok = _columns(col0, DG, BN, V)
    latest_first = T - 1 - tl.arange(0, T)
    rows, first, ok, within = _chunk_tile(b, k, latest_first, local, col_ok, L, N, T, BW, V,
                                          RUN)
    g_at = _rows_at(g_ptr, first, latest_first, within, 2 * BW)
    dy_at = _rows_at(dy_ptr, first, latest_first, cols, D)
    ba = tl.load(ba_ptr + cols, mask=col_ok, other=0.0)
    sp = softplus(tl.load(a_param_ptr + cols, mask=col_ok, other=0.0))
    ga = sigmoid_fast(tl.load(g_at + BW, mask=ok, other=0.0).to(tl.float32) + ba[None, :])
    a = exp_fast(tl.where((rows < L)[:, None], -8.0 * ga * sp[None, :], 0.0))
    dy = tl.load(dy_at, mask=ok, other=0.0).to(tl.float32)
    a, dy = adjoint_inputs(a, dy, seq_ptr, dfinal_ptr, b, rows, L,
                           _state_columns(cols, col_ok, D), D, N_SEQ, PACKED, HAS_DFINAL)
    a = cut_resets(a, token_resets(reset_ptr, b, rows, L, HAS_RESETS), HAS_RESETS)
    p, v = tl.associative_scan((a, a * dy), 0, affine_combine)
    state = (b * NC + k) * DG + local
    tl.store(decay_ptr + state, last_row(p, tl.arange(0, T), T), mask=col_ok)
    tl.store(end_ptr + state, last_row(v, tl.arange(0, T), T), mask=col_ok)


@triton.jit
def _adjoint_latest_first(a, dy, carry, T: tl.constexpr):
    """dh_t = dy_t + a_{t+1} dh_{t+1} for a tile whose T rows (latest first) sit in one thread,
    the chunk's last token taking the carry a_s dh_s from its right.  Unrolled like
    scan.decayed_previous_state: each row pick folds to a register move."""
    index = tl.arange(0, T)[:, None]
    incoming = carry
    dh = tl.zeros_like(dy)
    for i in tl.static_range(T):
        dh_i = tl.sum(tl.where(index == i, dy, 0.0), axis=0) + incoming
        dh = tl.where(index == i, dh_i[None, :], dh)
        incoming = tl.sum(tl.where(index == i, a, 0.0), axis=0) * dh_i
    return dh


@triton.jit(do_not_specialize=["N_SEQ"])
def _backward_kernel(x_ptr, dy_ptr, g_ptr, dg_ptr, dx_ptr, bx_ptr, ba_ptr, a_param_ptr, h_in_ptr,
                     carry_ptr, seq_ptr, reset_ptr, h0_ptr, dfinal_ptr, dh0_ptr, part_ptr,
                     dsp_part_ptr, col0, L, N, NC, N_SEQ, SPAN, NSPAN, D: tl.constexpr,
                     DG: tl.constexpr, T: tl.constexpr, BN: tl.constexpr, V: tl.constexpr,
                     BW: tl.constexpr, RUN: tl.constexpr, PACKED: tl.constexpr,
                     HAS_INITIAL: tl.constexpr, HAS_DFINAL: tl.constexpr,
                     HAS_RESETS: tl.constexpr):
    """Per (span of SPAN chunks, channel block of the group), each chunk recomputed from its
    entering state h_in and adjoint carry (the group's [B, NC, DG]): dG = [dGx | dGa] into dg
    (G itself by default, each tile written after it is read), dx's direct term dh m gx (the GEMM adds dG W_cat^T to
    it in place), and the program's partial sums of d bias (row of part: [dbx (DG) | dba (DG)])
    and of d softplus(a_param) (row of dsp_part, DG), for sum_partials.  With
    sequences: the adjoint is cut at each start (the folded a_s = 0), takes the final state's
    gradient at each end (HAS_DFINAL), and d h0 = a_s dh_s is written at each start
    (HAS_INITIAL)."""
    pid = tl.program_id(0)
    b = (pid // NSPAN).to(tl.int64)
    span = pid % NSPAN
    cols, local, col_ok = _columns(col0, DG, BN, V)
    bx = tl.load(bx_ptr + cols, mask=col_ok, other=0.0)
    ba = tl.load(ba_ptr + cols, mask=col_ok, other=0.0)
    sp = softplus(tl.load(a_param_ptr + cols, mask=col_ok, other=0.0))
    dbx = tl.zeros([BN], dtype=tl.float32)
    dba = tl.zeros([BN], dtype=tl.float32)
    dsp = tl.zeros([BN], dtype=tl.float32)
    latest_first = T - 1 - tl.arange(0, T)  # the adjoint then runs as a forward recurrence
    k0 = span * SPAN
    for k in range(k0, tl.minimum(k0 + SPAN, NC)):
        rows, first, ok, within = _chunk_tile(b, k, latest_first, local, col_ok, L, N, T, BW, V,
                                              RUN)
        g_at = _rows_at(g_ptr, first, latest_first, within, 2 * BW)
        x_at = _rows_at(x_ptr, first, latest_first, cols, D)
        ga = sigmoid_fast(tl.load(g_at + BW, mask=ok, other=0.0).to(tl.float32) + ba[None, :])
        log_a = tl.where((rows < L)[:, None], -8.0 * ga * sp[None, :], 0.0)
        seq, starts, ends = row_sequences(seq_ptr, b, rows, L, PACKED)
        flagged = token_resets(reset_ptr, b, rows, L, HAS_RESETS)
        state_cols = _state_columns(cols, col_ok, D)
        a, m, dm_dlog_a = _transition_rsqrt(log_a, reset_mask(starts, flagged, HAS_INITIAL,
                                                              HAS_RESETS))
        a = cut_resets(a, flagged, HAS_RESETS)  # no gradient into a, d h0 or a later dh
        gx = sigmoid_fast(tl.load(g_at, mask=ok, other=0.0).to(tl.float32) + bx[None, :])
        x = tl.load(x_at, mask=ok, other=0.0).to(tl.float32)
        gate_x = gx * x
        u = m * gate_x
        state = (b * NC + k) * DG + local
        h_in = tl.load(h_in_ptr + state, mask=col_ok, other=0.0)
        # d log a = dh (a_t h_{t-1} + gx x dm/dlog a), a_t h_{t-1} as a product (no h - u)
        if PACKED or HAS_INITIAL:
            # From the folded inputs (a_s h_{s-1} is then 0 at a start), plus a_s h0 at each
            # start (0 where the state resets); the folded a_s = 0 also cuts the adjoint there.
            entering = entering_state(h0_ptr, b, seq, taken_starts(starts, flagged, HAS_RESETS),
                                      state_cols, D, N_SEQ, PACKED, HAS_INITIAL)
            a_cut, u_fold = fold_starts(a, u, starts, entering)
            a_h_prev = decayed_previous_state(a_cut, u_fold, h_in, T)
            if HAS_INITIAL:
                a_h_prev += a * entering
        else:
            a_cut = a
            a_h_prev = decayed_previous_state(a, u, h_in, T)
        dla_per_dh = a_h_prev + gate_x * dm_dlog_a
        dgx_per_dh = u * (1.0 - gx)  # dGx = dh m x gx (1 - gx)
        direct_per_dh = m * gx
        dy = tl.load(_rows_at(dy_ptr, first, latest_first, cols, D), mask=ok,
                     other=0.0).to(tl.float32)
        if HAS_DFINAL:
            dy += load_at(dfinal_ptr, b, seq, ends, state_cols, D, N_SEQ, PACKED)
        carry = tl.load(carry_ptr + state, mask=col_ok, other=0.0)
        dh = _adjoint_latest_first(a_cut, dy, carry, T)
        if HAS_INITIAL:
            store_at(dh0_ptr, a * dh, b, seq, starts, state_cols, D, N_SEQ, PACKED)
        dla = dh * dla_per_dh
        d_gate_x = dh * dgx_per_dh
        d_gate_a = dla * (-8.0 * sp[None, :]) * ga * (1.0 - ga)
        dg_at = _rows_at(dg_ptr, first, latest_first, within, 2 * BW)
        tl.store(dg_at, to_element(d_gate_x, dg_ptr), mask=ok)  # may be G: this tile is read
        tl.store(dg_at + BW, to_element(d_gate_a, dg_ptr), mask=ok)
        tl.store(_rows_at(dx_ptr, first, latest_first, cols, D),
                 to_element(dh * direct_per_dh, dx_ptr), mask=ok)
        dbx += tl.sum(d_gate_x, axis=0)
        dba += tl.sum(d_gate_a, axis=0)
        dsp += tl.sum(dla * ga, axis=0)
    row = pid.to(tl.int64) * (2 * DG)
    tl.store(part_ptr + row + local, dbx, mask=col_ok)
    tl.store(part_ptr + row + DG + local, dba, mask=col_ok)
    tl.store(dsp_part_ptr + pid.to(tl.int64) * DG + local, -8.0 * dsp, mask=col_ok)


# Values of one [T, BN] tile per thread (T x vector) past which the vector width is cut: the
# kernels hold three to eight such tiles at once.
VALUES_PER_THREAD = 32


@dataclass(frozen=True)
class Launch:
    """Warps and channels per thread of one kernel's [T, BN] tiles, BN = 32 * warps * vector,
    so that each thread holds all T tokens of its channels (scan.row_offsets).  The vector
    width is cut to 1 where it does not divide the block width (a thread's channels must lie in
    one head of G) and halved while T x vector exceeds VALUES_PER_THREAD."""
    warps: int
    vector: int
    registers: int | None = None  # a cap on registers per thread (Triton's maxnreg), or none

    def __post_init__(self):
        check_launch(self)

    def tile(self, bw: int, chunk: int) -> dict:
        vector = self.vector if bw % self.vector == 0 else 1
        while vector > 1 and chunk * vector > VALUES_PER_THREAD:
            vector //= 2
        return dict(BN=tile_width(self.warps, vector), V=vector, num_warps=self.warps,
                    **register_cap(self.registers))


@dataclass(frozen=True)
class GemmConfig:
    """One RG-LRU backend of this family: tokens per chunk, each kernel's launch, how many
    backward programs to aim for per SM (each walks a span of chunks, so that its partial sums
    are one row per program), and what happens to G.  Saved (recompute False): all heads at
    once, G kept for the backward, which writes dG over it.  Recomputed: the heads run in
    groups whose G (2 units for all heads, a unit being B L D BF16 elements) fits in
    workspace_units, and the backward recomputes each group's G, so that the peak memory of a
    forward+backward stays under 3 units, at the price of a GEMM and more launches.  The name
    is generated from the chunk and the choice; launches and the workspace are tuning (sweeps
    pass other ones in), not part of the name.  gradient_over_gates False gives dG a buffer of
    its own (2 units more memory for less GPU time: docs/PERFORMANCE.md); sweeps pass it."""
    chunk: int
    recompute: bool = False
    summary: Launch = Launch(2, 2)
    output: Launch = Launch(2, 2)
    reverse_summary: Launch = Launch(2, 2)
    backward: Launch = Launch(2, 1)
    backward_programs_per_sm: int = 32
    workspace_units: float = 0.5
    gradient_over_gates: bool = True
    carry: CarryPlan = DEFAULT_PLAN

    def __post_init__(self):
        check_configuration(self, dict(workspace_units=0))

    @property
    def name(self) -> str:
        return f"gemm_{'recompute_' if self.recompute else ''}fused_hierarchical_chunk{self.chunk}"

    def launches(self) -> dict[str, Launch]:
        return {role: getattr(self, role) for role in KERNELS}

    def heads_per_group(self, heads: int) -> int:
        """All heads when G is saved; else the most heads, a divisor of heads, whose G fits the
        workspace (at least one)."""
        if not self.recompute:
            return heads
        fit = max(1, int(heads * self.workspace_units / 2))
        return max(d for d in range(1, min(fit, heads) + 1) if heads % d == 0)


KERNELS = {"summary": _summary_kernel, "output": _output_kernel,
           "reverse_summary": _reverse_summary_kernel, "backward": _backward_kernel}


@functools.lru_cache(maxsize=None)
def tiles(config: GemmConfig, bw: int, width: int, group_width: int) -> dict:
    """Each kernel's constexprs (signature order: D, DG, T, BN, V, BW, RUN), warps and any
    register cap (maxnreg), by role."""
    out = {}
    for role, setting in config.launches().items():
        tile = setting.tile(bw, config.chunk)
        out[role] = dict(D=width, DG=group_width, T=config.chunk, **tile, BW=bw,
                         RUN=math.gcd(tile["BN"], bw))
    return out


# The state keywords' constexprs of each kernel (samu.ops.common.sequences).
FEATURES = {"summary": ("PACKED", "HAS_INITIAL", "HAS_RESETS"),
            "output": ("PACKED", "HAS_INITIAL", "HAS_FINAL", "HAS_RESETS"),
            "reverse_summary": ("PACKED", "HAS_DFINAL", "HAS_RESETS"),
            "backward": ("PACKED", "HAS_INITIAL", "HAS_DFINAL", "HAS_RESETS")}


def launch_plan(config: GemmConfig, width: int, heads: int = 16, features: bool = False):
    """(kernel, constexprs, compile options: num_warps and any maxnreg) of every kernel a
    backend launches at this width: without the state keywords, or (features=True) with all of
    them."""
    bw = width // heads
    plan = []
    for role, kernel in KERNELS.items():
        meta = dict(with_state_keywords(
            tiles(config, bw, width, config.heads_per_group(heads) * bw)[role], features))
        options = {name: meta.pop(name) for name in ("num_warps", "maxnreg") if name in meta}
        meta.update({name: features for name in FEATURES[role]})
        plan.append((kernel, meta, options))
    return plan


def _gemm_dtype(dtype: torch.dtype) -> torch.dtype:
    """The GEMM operands' dtype, and G's: x's own when it is BF16 or FP16 (as autocast rounds
    the products), else FP32."""
    return dtype if dtype in (torch.bfloat16, torch.float16) else torch.float32


def _heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, L, D] as [H, B L, bw]: a strided view (no copy) that cuBLAS takes as it is."""
    return t.view(t.shape[0] * t.shape[1], heads, t.shape[2] // heads).transpose(0, 1)


def _weight_gradient(x_heads: torch.Tensor, d_gates: torch.Tensor, out: torch.Tensor) -> None:
    """out = x_h^T dG_h for every head, [heads, bw, 2 bw], FP32 (accumulated in FP32 either
    way)."""
    xt = x_heads.transpose(1, 2)
    if d_gates.is_cuda and d_gates.dtype != torch.float32:
        torch.bmm(xt, d_gates, out_dtype=torch.float32, out=out)
    elif d_gates.dtype == torch.float32:
        torch.bmm(xt, d_gates, out=out)
    else:
        out.copy_(torch.bmm(xt, d_gates))


def _gate_weights(gate_x_weight, gate_a_weight, dtype: torch.dtype) -> torch.Tensor:
    """W_cat = [Wx | Wa], [H, bw, 2 bw], in the GEMM operand dtype: cast as it is concatenated
    (one allocation and one op; a cat and then a cast cost ~95 us of the H200's host time)."""
    heads, bw, _ = gate_x_weight.shape
    out = torch.empty(heads, bw, 2 * bw, device=gate_x_weight.device, dtype=_gemm_dtype(dtype))
    # The kernels form the weights' gradients themselves: nothing differentiates through W_cat
    # (and an out= op refuses inputs that require grad where grad mode is on).
    return torch.cat([gate_x_weight.detach(), gate_a_weight.detach()], dim=2, out=out)


@dataclass(frozen=True)
class _Groups:
    """The head groups of one call: each runs its gate GEMM into one G workspace
    [heads per group, B L, 2 bw] and its kernels over its DG = heads per group x bw channels."""
    heads: int
    bw: int
    per_group: int

    @property
    def count(self) -> int:
        return self.heads // self.per_group

    @property
    def width(self) -> int:
        return self.per_group * self.bw

    def __iter__(self):
        """(index, heads slice, first channel) of each group."""
        for g in range(self.count):
            yield g, slice(g * self.per_group, (g + 1) * self.per_group), g * self.width


def _groups(config: GemmConfig, gate_x_weight: torch.Tensor) -> _Groups:
    heads, bw, _ = gate_x_weight.shape
    return _Groups(heads, bw, config.heads_per_group(heads))


def _entering_state_shapes(groups: _Groups, batch: int, n_chunks: int) -> list[tuple]:
    """The residual's pieces: each group's entering states, [B, NC, DG]."""
    return [(batch, n_chunks, groups.width)] * groups.count


def _gate_products(x_heads, w_cat, heads: slice, out: torch.Tensor) -> torch.Tensor:
    """One group's G = x_h W_cat,h into its buffer (x's dtype is the operand dtype)."""
    return torch.bmm(x_heads[heads], w_cat[heads], out=out)


class _ForwardSites(NamedTuple):
    summary: tuple  # a Site per head group (each passes its own first channel)
    output: tuple


@functools.lru_cache(maxsize=256)
def _forward_sites(config: GemmConfig, groups: _Groups, shape: tuple, count: int, dtype,
                   state_dtype, device, packed: bool, has_initial: bool,
                   has_final: bool, has_resets: bool = False) -> _ForwardSites:
    """The forward's launches for this signature, which fixes every int the kernels take and
    every tensor dtype (x's and G's, the initial state's or its placeholder's; the rest FP32),
    as launching.Site requires."""
    batch, length, width = shape
    n_chunks = cdiv(length, config.chunk)
    meta = tiles(config, groups.bw, width, groups.width)
    flags = dict(PACKED=packed, HAS_INITIAL=has_initial, HAS_RESETS=has_resets)
    summary_meta = dict(with_state_keywords(meta["summary"], packed or has_initial or has_resets),
                        **flags)
    output_meta = dict(with_state_keywords(meta["output"], packed or has_initial or has_final
                                           or has_resets), **flags, HAS_FINAL=has_final)
    summary_grid = (batch * n_chunks, cdiv(groups.width, meta["summary"]["BN"]))
    output_grid = (batch * n_chunks, cdiv(groups.width, meta["output"]["BN"]))
    return _ForwardSites(tuple(Site(_summary_kernel, summary_grid, summary_meta) for _ in groups),
                         tuple(Site(_output_kernel, output_grid, output_meta) for _ in groups))


def forward(x, params, sequences, config: GemmConfig, zero_gaps: bool = True, w_cat=None,
            summary=None):
    """(y, final state or None, residuals): per head group, the gate GEMM and the forward's
    kernels.  The residuals the backward needs beside x and the parameters: G flat (its
    [H, B L, 2 bw] layout read back from the weights' shape, x's GEMM dtype) unless the
    configuration recomputes it, then the chunks' entering states, each group's [B, NC, DG]
    FP32 carved from one flat buffer (its padding zeroed unless ``zero_gaps`` is off,
    samu.ops.common.family), then W_cat.  w_cat: W_cat when the caller has it.  ``summary``:
    (G, decay, end, chunk 0's whole decay) of the gate GEMM and summary kernel over the same
    x, unpacked, from a zero initial state (or the reset, in a call without one), one head
    group (SliceRun): reused instead of running them again, chunk 0's end state moved by its
    decay times the initial state."""
    x = aligned(x)
    gate_x_weight, gate_x_bias, gate_a_weight, gate_a_bias, a_param = params
    batch, length, width = x.shape
    groups = _groups(config, gate_x_weight)
    tokens = batch * length
    n_chunks = cdiv(length, config.chunk)
    if w_cat is None:
        w_cat = _gate_weights(gate_x_weight, gate_a_weight, x.dtype)
    x_heads = _heads(x, groups.heads)
    bx, ba, a_param = [fp32_contiguous(p) for p in (gate_x_bias, gate_a_bias, a_param)]
    seq, h0 = sequences.seq_index, sequences.initial_state
    sites = _forward_sites(config, groups, x.shape, sequences.count, x.dtype, h0.dtype, x.device,
                           sequences.packed, sequences.has_initial,
                           sequences.output_final_state, sequences.has_resets)
    flags = sequences.reset_flags
    f32 = dict(device=x.device, dtype=torch.float32)
    if summary is None:
        gates = torch.empty(groups.per_group, tokens, 2 * groups.bw, device=x.device,
                            dtype=_gemm_dtype(x.dtype))
        summary_shape = (batch, n_chunks, groups.width)
        decay, end = carve(torch.empty(carved_size([summary_shape] * 2), **f32),
                           [summary_shape] * 2)
    else:
        if sequences.packed or groups.count != 1:
            raise ValueError("rglru: a summary is reused by an unpacked call over one head "
                             "group only")
        gates, decay, end, first_decay = summary  # from a zero state, or the reset without h0
        if sequences.has_initial:  # linear in it: h0 enters chunk 0 decayed
            end[:, 0] += first_decay * h0
    shapes = _entering_state_shapes(groups, batch, n_chunks)
    residual = (torch.zeros if zero_gaps else torch.empty)(carved_size(shapes), **f32)
    h_in = carve(residual, shapes)
    y = torch.empty_like(x)
    final = sequences.final_state(width, x.device)
    for g, heads, col0 in groups:
        if summary is None:
            _gate_products(x_heads, w_cat, heads, gates)
            sites.summary[g](x, gates, bx, ba, a_param, seq, flags, h0, decay, end, col0, length,
                             tokens, n_chunks, sequences.count)
        chunk_carry(decay, end, reverse=False, out=h_in[g], plan=config.carry)
        sites.output[g](x, gates, y, bx, ba, a_param, h_in[g], seq, flags, h0, final, col0, length,
                        tokens, n_chunks, sequences.count)
    residuals = (residual, w_cat) if config.recompute else (gates.view(-1), residual, w_cat)
    return y, (final if sequences.output_final_state else None), residuals


def residual_specs(config: GemmConfig, batch: int, length: int, width: int, dtype, params):
    """(shape, dtype) of each of forward's residuals, for a compiled graph's fake tensors."""
    heads, bw, _ = params[0].shape
    shapes = _entering_state_shapes(_groups(config, params[0]), batch,
                                    cdiv(length, config.chunk))
    kept = [((carved_size(shapes),), torch.float32), ((heads, bw, 2 * bw), _gemm_dtype(dtype))]
    gates = [((2 * batch * length * width,), _gemm_dtype(dtype))]
    return kept if config.recompute else gates + kept


def spent_residuals(config: GemmConfig):
    """The saved G, which the backward overwrites with dG (samu.ops.common.family)."""
    if config.recompute or not config.gradient_over_gates:
        return None
    return ("the saved gate pre-activations (a gemm_recompute_* backend, or a GemmConfig with "
            "gradient_over_gates=False, keeps them)")


def _spans(config: GemmConfig, groups: _Groups, batch: int, n_chunks: int, col_blocks: int,
           device) -> tuple[int, int]:
    """(chunks per span, spans per sequence) of the backward kernel: about
    backward_programs_per_sm programs per SM over all groups' launches, and at most 2 NC / 3
    spans, so that the partial rows (3 DG values per program) fit in the group's spent
    summaries (2 B NC DG values)."""
    programs = config.backward_programs_per_sm * sm_count(device) // groups.count
    spans = max(1, min(max(1, 2 * n_chunks // 3), programs // (batch * col_blocks)))
    per_span = cdiv(n_chunks, spans)
    return per_span, cdiv(n_chunks, per_span)


class _BackwardSites(NamedTuple):
    reverse_summary: tuple  # a Site per head group
    main: tuple
    per_span: int  # the backward kernel's chunks per span (_spans)
    spans: int


@functools.lru_cache(maxsize=256)
def _backward_sites(config: GemmConfig, groups: _Groups, shape: tuple, count: int,
                    dtypes: tuple, device, packed: bool, has_initial: bool,
                    has_dfinal: bool, has_resets: bool = False) -> _BackwardSites:
    """_forward_sites' twin for the backward; dtypes: x's, dy's and the initial state's (or its
    placeholder's).  The backward kernel's spans follow the device's SM count."""
    batch, length, width = shape
    n_chunks = cdiv(length, config.chunk)
    meta = tiles(config, groups.bw, width, groups.width)
    reverse_meta = dict(with_state_keywords(meta["reverse_summary"],
                                            packed or has_dfinal or has_resets),
                        PACKED=packed, HAS_DFINAL=has_dfinal, HAS_RESETS=has_resets)
    backward_meta = dict(with_state_keywords(meta["backward"], packed or has_initial
                                             or has_dfinal or has_resets),
                         PACKED=packed, HAS_INITIAL=has_initial, HAS_DFINAL=has_dfinal,
                         HAS_RESETS=has_resets)
    col_blocks = cdiv(groups.width, meta["backward"]["BN"])
    per_span, spans = _spans(config, groups, batch, n_chunks, col_blocks, device)
    reverse_grid = (batch * n_chunks, cdiv(groups.width, meta["reverse_summary"]["BN"]))
    return _BackwardSites(
        tuple(Site(_reverse_summary_kernel, reverse_grid, reverse_meta) for _ in groups),
        tuple(Site(_backward_kernel, (batch * spans, col_blocks), backward_meta) for _ in groups),
        per_span, spans)


def backward(x, params, residuals, dy, d_final, sequences, config: GemmConfig,
             spend_residuals: bool = False, end_cotangent=None):
    """(dx, d gate_x_weight, d gate_x_bias, d gate_a_weight, d gate_a_bias, d a_param,
    d initial_state or None): per head group, G recomputed (or the saved G), the backward's
    kernels (dG written over G, or into a buffer of its own without gradient_over_gates) and
    GEMMs, with the forward's W_cat.  A saved G is overwritten only with spend_residuals (the
    caller then refuses a second backward through the same graph, which would read dG as G);
    else it is copied first.  dy and d_final may be None (no gradient reached them).
    ``end_cotangent`` (unpacked, one head group): called once the adjoint carry is known with
    mu, FP32 [B, D], the adjoint leaving the first token for the state entering it; it returns
    a cotangent to add on the final state (or None), which the rest of the backward takes in
    (context parallelism: the later ranks' cotangent)."""
    if end_cotangent is not None and (sequences.packed or _groups(config, params[0]).count > 1):
        raise ValueError("rglru: end_cotangent needs an unpacked call over one head group")
    x = aligned(x)
    gate_x_weight, gate_x_bias, gate_a_weight, gate_a_bias, a_param = params
    saved_gates = None if config.recompute else residuals[0]
    residual, w_cat = residuals[-2:]
    batch, length, width = x.shape
    groups = _groups(config, gate_x_weight)
    tokens = batch * length
    n_chunks = cdiv(length, config.chunk)
    h_in = carve(residual, _entering_state_shapes(groups, batch, n_chunks))
    bx, ba, a_param = [fp32_contiguous(p) for p in (gate_x_bias, gate_a_bias, a_param)]
    dy = torch.zeros_like(x) if dy is None else aligned(dy)
    seq, h0 = sequences.seq_index, sequences.initial_state
    has_dfinal = d_final is not None
    d_final = fp32_contiguous(d_final) if has_dfinal else h0
    flags = sequences.reset_flags

    def sites_with(has_dfinal: bool) -> _BackwardSites:
        return _backward_sites(config, groups, x.shape, sequences.count,
                               (x.dtype, dy.dtype, h0.dtype), x.device, sequences.packed,
                               sequences.has_initial, has_dfinal, sequences.has_resets)
    sites = sites_with(has_dfinal)
    f32 = dict(device=x.device, dtype=torch.float32)
    x_heads = _heads(x, groups.heads)
    if saved_gates is None:
        gates = torch.empty(groups.per_group, tokens, 2 * groups.bw, device=x.device,
                            dtype=_gemm_dtype(x.dtype))
    else:
        gates = saved_gates.view(groups.heads, tokens, 2 * groups.bw)
        if config.gradient_over_gates and not spend_residuals:
            gates = gates.clone()
    d_gates = gates if config.gradient_over_gates else torch.empty_like(gates)
    summary_shape = (batch, n_chunks, groups.width)
    per_span, spans = sites.per_span, sites.spans  # has_dfinal does not move them
    n_parts = batch * spans
    partial_shapes = [(n_parts, 2 * groups.width), (n_parts, groups.width)]
    # The decays and adjoint ends are spent once the carry has run: the partial rows reuse them.
    summaries = torch.empty(max(carved_size([summary_shape] * 2), carved_size(partial_shapes)),
                            **f32)
    decay, end = carve(summaries, [summary_shape] * 2)
    part, dsp_part = carve(summaries, partial_shapes)
    carry = torch.empty(summary_shape, **f32)
    dx = torch.empty_like(x)
    dx_heads = _heads(dx, groups.heads)
    d_h0 = sequences.initial_state_gradient()
    d_weight = torch.empty(groups.heads, groups.bw, 2 * groups.bw, **f32)
    grads = torch.empty(3 * width, **f32)
    for g, heads, col0 in groups:
        if saved_gates is None:
            _gate_products(x_heads, w_cat, heads, gates)
        sites.reverse_summary[g](dy, gates, ba, a_param, seq, flags, d_final, decay, end, col0,
                                 length, tokens, n_chunks, sequences.count)
        chunk_carry(decay, end, reverse=True, out=carry, plan=config.carry)
        if end_cotangent is not None:
            # The reverse summary's chunk decays are whole products of a (no start cuts them).
            extra = take_end_cotangent(end_cotangent, _start_adjoint(end, decay, carry))
            if extra is not None:  # linear: it reaches the last chunk's start decayed
                end[:, -1] += decay[:, -1] * extra
                d_final = extra if not has_dfinal else d_final + extra
                has_dfinal = True
                sites = sites_with(True)
                chunk_carry(decay, end, reverse=True, out=carry, plan=config.carry)
        sites.main[g](x, dy, gates, d_gates, dx, bx, ba, a_param, h_in[g], carry, seq, flags, h0,
                      d_final, d_h0, part, dsp_part, col0, length, tokens, n_chunks,
                      sequences.count, per_span, spans)
        sum_partials(part, dsp_part, a_param, out=grads, group=(col0, width))
        dx_heads[heads].baddbmm_(d_gates, w_cat[heads].transpose(1, 2))  # dx += dG W_cat^T
        _weight_gradient(x_heads[heads], d_gates, d_weight[heads])
    at = gradient_columns(width)
    return (dx, d_weight[:, :, :groups.bw], grads[at["gate_x_bias"]], d_weight[:, :, groups.bw:],
            grads[at["gate_a_bias"]], grads[at["a_param"]],
            d_h0 if sequences.has_initial else None)


@functools.lru_cache(maxsize=None)
def gradient_columns(width: int) -> dict[str, slice]:
    """Where each bias and a_param gradient sits in the gradient vector."""
    return named_columns([("gate_x_bias", width), ("gate_a_bias", width), ("a_param", width)])


class _SlicePass(NamedTuple):
    """One call's arguments over a slice that holds no sequence start after its first token,
    entering it from a given state (an ordinary step, as in a call with an initial state: zeros
    for a slice that continues a sequence) or resetting there: the kernels' inputs and one
    group's G workspace and [B, NC, DG] summaries."""
    x: torch.Tensor
    x_heads: torch.Tensor
    w_cat: torch.Tensor
    bx: torch.Tensor
    ba: torch.Tensor
    a_param: torch.Tensor
    groups: _Groups
    sequences: object
    meta: dict
    gates: torch.Tensor
    decay: torch.Tensor
    end: torch.Tensor

    @classmethod
    def of(cls, x, params, config: GemmConfig, initial_state=None,
           resets: bool = False) -> "_SlicePass":
        x = aligned(x)
        gate_x_weight, gate_x_bias, gate_a_weight, gate_a_bias, a_param = params
        batch, length, width = x.shape
        groups = _groups(config, gate_x_weight)
        f32 = dict(device=x.device, dtype=torch.float32)
        bx, ba, a_param = [fp32_contiguous(p) for p in (gate_x_bias, gate_a_bias, a_param)]
        if not resets and initial_state is None:
            initial_state = torch.zeros(batch, width, **f32)
        sequences = sequence_args(x, None if resets else initial_state, None, False)
        gates = torch.empty(groups.per_group, batch * length, 2 * groups.bw, device=x.device,
                            dtype=_gemm_dtype(x.dtype))
        shape = (batch, cdiv(length, config.chunk), groups.width)
        return cls(x, _heads(x, groups.heads), _gate_weights(gate_x_weight, gate_a_weight,
                                                              x.dtype),
                   bx, ba, a_param, groups, sequences,
                   tiles(config, groups.bw, width, groups.width), gates,
                   torch.empty(shape, **f32), torch.empty(shape, **f32))

    def launch(self, kernel, role: str, first, col0: int, **flags) -> None:
        """One group's summary or reverse summary kernel into decay and end."""
        batch, length, _ = self.x.shape
        n_chunks = self.decay.shape[1]
        grid = (batch * n_chunks, cdiv(self.groups.width, self.meta[role]["BN"]))
        launching.launch(kernel, grid, first, self.gates, *flags.pop("inputs"),
                         self.sequences.seq_index, self.sequences.reset_flags, flags.pop("state"),
                         self.decay, self.end, col0, length, batch * length, n_chunks,
                         self.sequences.count, **with_state_keywords(self.meta[role], True),
                         PACKED=False, HAS_RESETS=False, **flags)


def slice_summary(x, params, config: GemmConfig, initial_state=None, resets: bool = False):
    """(A, h), FP32 [B, D] each, of a slice that holds no sequence start after its first token:
    its end state is A h_in + h for the state h_in entering it.  Per head group the gate GEMM,
    the forward's summary kernel and carry, without its output kernel (no y).  The summary
    kernel folds the first token's a into the entering state, so chunk 0's decay comes from G.
    Where a sequence starts at the first token, h is the end state itself: from
    ``initial_state`` (FP32 [B, D]), or with ``resets`` from the reset (A is then unused)."""
    check_phase_tensors("slice_summary", x, initial_state=initial_state)
    s = _SlicePass.of(x, params, config, initial_state, resets)
    batch, length, width = s.x.shape
    A, h = [torch.empty(batch, width, device=s.x.device, dtype=torch.float32) for _ in "Ah"]
    for _, heads, col0 in s.groups:
        cols = slice(col0, col0 + s.groups.width)
        first_decay, h[:, cols] = _group_summary(s, heads, col0, config)
        A[:, cols] = first_decay * s.decay[:, 1:].prod(1)
    return A, h


def _group_summary(s: "_SlicePass", heads: slice, col0: int, config: GemmConfig):
    """(chunk 0's whole decay, end state from the entering state), FP32 [B, DG], of one head
    group: its gate GEMM into s.gates, the summary kernel into s.decay and s.end, the carry."""
    _gate_products(s.x_heads, s.w_cat, heads, s.gates)
    s.launch(_summary_kernel, "summary", s.x, col0, inputs=(s.bx, s.ba, s.a_param),
             state=s.sequences.initial_state, HAS_INITIAL=s.sequences.has_initial)
    h_in = chunk_carry(s.decay, s.end, reverse=False, plan=config.carry)
    cols = slice(col0, col0 + s.groups.width)
    return (_first_chunk_decay(s, cols, config.chunk),
            s.decay[:, -1] * h_in[:, -1] + s.end[:, -1])


def _first_chunk_decay(s: "_SlicePass", cols: slice, chunk: int) -> torch.Tensor:
    """FP32 [B, DG]: the whole product of a over chunk 0 of one group (whose G is in s.gates),
    which the summary kernel cuts at the first token (it folds that a into the entering
    state)."""
    batch, length, _ = s.x.shape
    first = min(chunk, length)
    bw = s.groups.bw
    ga = s.gates.view(s.groups.per_group, batch, length, 2 * bw)[:, :, :first, bw:]
    ga_sum = torch.sigmoid(ga.float() + s.ba[cols].view(-1, 1, 1, bw)).sum(2)
    softplus_a = torch.nn.functional.softplus(s.a_param[cols])
    return torch.exp(-GATE_SCALE * ga_sum.transpose(0, 1).reshape(batch, -1) * softplus_a)


def start_adjoint(x, params, dy, d_end, config: GemmConfig):
    """mu, FP32 [B, D]: the adjoint a_s dh_s that leaves a continued slice's first token s for
    the state entering it, from dy and the cotangent d_end on the slice's end state.  Per head
    group the gate GEMM, the backward's reverse summary and its carry, where a backward through
    the slice would run every kernel."""
    check_phase_tensors("start_adjoint", x, dy=dy, d_state=d_end)
    s = _SlicePass.of(x, params, config)
    batch, _, width = s.x.shape
    dy, d_end = aligned(dy), fp32_contiguous(d_end)
    mu = torch.empty(batch, width, device=s.x.device, dtype=torch.float32)
    for _, heads, col0 in s.groups:
        _gate_products(s.x_heads, s.w_cat, heads, s.gates)
        s.launch(_reverse_summary_kernel, "reverse_summary", dy, col0,
                 inputs=(s.ba, s.a_param), state=d_end, HAS_DFINAL=True)
        carry = chunk_carry(s.decay, s.end, reverse=True, plan=config.carry)
        mu[:, col0:col0 + s.groups.width] = _start_adjoint(s.end, s.decay, carry)
    return mu


def _start_adjoint(end, decay, carry):
    """mu [B, DG]: the adjoint leaving the first token, from one group's reverse summaries and
    carry (the reverse summary's chunk 0 decay is its whole product of a: no start cuts it)."""
    return end[:, 0] + decay[:, 0] * carry[:, 0]


class SliceRun:
    """One rank's slice under context parallelism (samu.distributed) that holds a piece of one
    sequence, unpacked, on a configuration that saves G in one head group: its
    phases sharing their work.  ``summary`` runs the gate GEMM, the summary kernel and carry
    from a zero state; ``forward`` reuses G and the chunk summaries from the entering state;
    ``backward`` hands the adjoint at the slice start out mid-way and takes the later ranks'
    cotangent in, so that the reverse summary over dy runs once.  Beside one call at the
    slice: two chunk carries, chunk 0's decay and the collectives.  ``resets``: the slice starts
    a sequence without an initial state, which resets there (m = 1 at its first token, unlike a
    zero entering state)."""

    def __init__(self, x, params, config: GemmConfig, resets: bool = False):
        self.x, self.params, self.config = aligned(x), list(params), config
        self.resets = resets
        self._summary = self._saved = self._w_cat = None

    @staticmethod
    def fits(params, config: GemmConfig) -> bool:
        """G saved (then in one head group): what the phases share."""
        return not config.recompute and _groups(config, params[0]).count == 1

    def summary(self):
        """(A, h), FP32 [B, D]: the slice's end state is A h_in + h (with ``resets``, h)."""
        s = _SlicePass.of(self.x, self.params, self.config, resets=self.resets)
        ((_, heads, col0),) = list(s.groups)
        first_decay, h = _group_summary(s, heads, col0, self.config)
        self._summary = (s.gates, s.decay, s.end, first_decay)
        self._w_cat = s.w_cat
        return first_decay * s.decay[:, 1:].prod(1), h

    def forward(self, entering):
        """(y, final state FP32 [B, D]) from ``entering``, the state entering the slice (None
        with ``resets``)."""
        sequences = slice_run_sequences(self, entering)
        y, final, residuals = forward(self.x, self.params, sequences, self.config,
                                      w_cat=self._w_cat, summary=self._summary)
        self._summary = None  # its chunk-0 end state now holds the entering state
        self._saved = (sequences, residuals)
        return y, final

    def backward(self, dy, d_final, end_cotangent):
        """(dx, d gate_x_weight, d gate_x_bias, d gate_a_weight, d gate_a_bias, d a_param,
        d entering or None with ``resets``); end_cotangent as backward's.  Once only: G is
        overwritten by its gradient."""
        check_phase_tensors("SliceRun.backward", self.x, dy=dy, d_state=d_final)
        sequences, residuals = self._saved
        self._saved = None
        grads = backward(self.x, self.params, residuals, dy, d_final, sequences, self.config,
                         spend_residuals=True, end_cotangent=end_cotangent)
        return grads


# The backward kernel's launch per chunk: capped registers buy resident programs (it is
# latency-bound), and at chunk 8 more, shorter spans cut the last wave (docs/PERFORMANCE.md).
LAUNCHES = {8: dict(backward=Launch(2, 1, registers=96), backward_programs_per_sm=64),
            16: dict(backward=Launch(2, 1, registers=128)),
            32: {}}

# Chunk 64 is left out: its [64, BN] tiles spill in every kernel (sm_90a, 2 warps, 1 channel per
# thread); chunk 32's backward spills a little.
# The recomputing configurations trade GPU time for memory: chunk 32's tiles are the slowest.
CONFIGS = (tuple(GemmConfig(chunk, **LAUNCHES[chunk]) for chunk in (8, 16, 32))
           + tuple(GemmConfig(chunk, recompute=True, **LAUNCHES[chunk]) for chunk in (8, 16)))

"""RG-LRU's Triton kernels, forward and backward, with the block-diagonal gates fused in.

A program owns a chunk of T tokens and BN channels of one head; the head's x tile [T, bw] is the
A operand of both gate products (tl.dot, BF16 operands, FP32 accumulation).  Gates are recomputed
in every phase instead of stored: two [T, bw] x [bw, BN] products cost less than 8 bytes per
element of extra traffic.

Bytes per element (BF16 x, y, dy, dx):
  forward   summary reads x (2); output reads x, writes y (4)                          -> 6
  backward  reverse summary reads x, dy (4); dx kernel reads x, dy, writes dx (6);
            weight-gradient kernel reads x, dy (4)                                     -> 14
FLOPs per element: 4 bw per gate-product pass (2 gates), 10 passes fwd+bwd -> 40 bw
(5120 at bw = 128): at D = 2048 the gates, not the bytes, bound RG-LRU.

Initial states, packed sequences and final states follow common.sequences: the forward folds each
start into the scan inputs (a_s -> 0, u_s -> u_s + a_s h0), so a chunk holding one has decay 0
and the carry is a scan from zero; the backward cuts the adjoint at starts, adds the final
state's gradient at ends and writes d h0 = a_s dh_s from the dx kernel.  Each feature is a
constexpr: a call without it compiles to the kernel it was before.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..common.carry import chunk_carry
from ..common import launching
from ..common.launching import (aligned, cdiv, dot_dtype, dot_operand_dtype, fp32_contiguous,
                             next_power_of_2, refuse_double_backward, row_stride_units, rows_of,
                             sm_count, tile_width, vector_width)
from ..common.math import exp_fast, sigmoid_fast, softplus, to_element, transition
from ..common.reduce import named_columns, sum_partials
from ..common.scan import (adjoint_combine, affine_combine, last_row, previous_state_combine,
                           row_offsets)
from ..common.sequences import (entering_state, fold_starts, load_at, resets, row_sequences,
                                sequence_args, store_at)

MIXER = "rglru"
GATE_SCALE = 8.0


@triton.jit
def _head_x(x_ptr, b, rows, head, L, D, BW, BWK: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """x[b, rows, head's bw channels] as a [T, BWK] dot operand (zero-padded)."""
    kcols = tl.arange(0, BWK)
    ok = (rows[:, None] < L) & (kcols[None, :] < BW)
    offs = (b * L + rows.to(tl.int64))[:, None] * D + (head * BW + kcols)[None, :]
    return tl.load(x_ptr + offs, mask=ok, other=0.0).to(DOT_DTYPE)


@triton.jit
def _gate(xh, w_ptr, bias_ptr, head, j, BW, BWK: tl.constexpr, DOT_DTYPE: tl.constexpr,
          PREC: tl.constexpr):
    """sigmoid(x_h W[h, :, j] + b): returns the gate [T, BN] and the W tile [BWK, BN]."""
    i = tl.arange(0, BWK)
    ok = (i[:, None] < BW) & (j[None, :] < BW)
    w = tl.load(w_ptr + head * BW * BW + i[:, None] * BW + j[None, :], mask=ok, other=0.0)
    w = w.to(DOT_DTYPE)
    bias = tl.load(bias_ptr + head * BW + j, mask=j < BW, other=0.0)
    return sigmoid_fast(tl.dot(xh, w, input_precision=PREC) + bias[None, :]), w


@triton.jit
def _own_tile(b, rows, head, j, L, BW, row_units, V: tl.constexpr):
    """A [T, BN] tile of the program's own channels, laid out with each channel's T tokens in
    one thread (scan.row_offsets)."""
    ok = (rows[:, None] < L) & (j[None, :] < BW)
    offs = row_offsets(b, rows, L, row_units, V)[:, None] + (head * BW + j)[None, :]
    return offs, ok


@triton.jit
def _state_cols(head, j, BW, D):
    """The program's channels as columns of an [N, D] state, D (masked off by load_at and
    store_at) past the head's bw: those belong to the next head."""
    return tl.where(j < BW, head * BW + j, D)


@triton.jit
def _forward_tile(x_ptr, wx_ptr, bx_ptr, wa_ptr, ba_ptr, a_param_ptr, b, rows, head, j,
                  L, D, BW, row_units, seq_ptr, h0_ptr, V: tl.constexpr, BWK: tl.constexpr,
                  DOT_DTYPE: tl.constexpr, PREC: tl.constexpr, PACKED: tl.constexpr,
                  HAS_INITIAL: tl.constexpr):
    """The chunk's local scan: returns (prod a, h from h_in = 0, offsets, mask, each row's
    sequence, sequence ends), each sequence start folded into the scan inputs (so prod a is 0
    across one)."""
    xh = _head_x(x_ptr, b, rows, head, L, D, BW, BWK, DOT_DTYPE)
    gx, _ = _gate(xh, wx_ptr, bx_ptr, head, j, BW, BWK, DOT_DTYPE, PREC)
    ga, _ = _gate(xh, wa_ptr, ba_ptr, head, j, BW, BWK, DOT_DTYPE, PREC)
    offs, ok = _own_tile(b, rows, head, j, L, BW, row_units, V)
    x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    sp = softplus(tl.load(a_param_ptr + head * BW + j, mask=j < BW, other=0.0))
    log_a = tl.where((rows < L)[:, None], -8.0 * ga * sp[None, :], 0.0)
    seq, starts, ends = row_sequences(seq_ptr, b, rows, L, PACKED)
    a, m, _ = transition(log_a, resets(starts, HAS_INITIAL))
    u = m * gx * x
    if PACKED or HAS_INITIAL:
        a, u = fold_starts(a, u, starts, entering_state(h0_ptr, seq, starts,
                                                        _state_cols(head, j, BW, D), D,
                                                        HAS_INITIAL))
    p, h = tl.associative_scan((a, u), 0, affine_combine)
    return p, h, offs, ok, seq, ends


@triton.jit(do_not_specialize=["row_units"])
def _rglru_summary_kernel(x_ptr, wx_ptr, bx_ptr, wa_ptr, ba_ptr, a_param_ptr, decay_ptr, end_ptr,
                          L, D, NC, BW, NBV, row_units, seq_ptr, h0_ptr, T: tl.constexpr,
                          BWK: tl.constexpr, BN: tl.constexpr, V: tl.constexpr,
                          DOT_DTYPE: tl.constexpr, PREC: tl.constexpr, PACKED: tl.constexpr,
                          HAS_INITIAL: tl.constexpr):
    """Per (chunk, head, column block): the chunk's decay (prod a) and end state from zero."""
    pid = tl.program_id(0)
    b = (pid // NC).to(tl.int64)
    k = pid % NC
    head = tl.program_id(1) // NBV
    j = (tl.program_id(1) % NBV) * BN + tl.arange(0, BN)
    rows = k * T + tl.arange(0, T)
    p, h, _, _, _, _ = _forward_tile(x_ptr, wx_ptr, bx_ptr, wa_ptr, ba_ptr, a_param_ptr, b, rows,
                                     head, j, L, D, BW, row_units, seq_ptr, h0_ptr, V, BWK,
                                     DOT_DTYPE, PREC, PACKED, HAS_INITIAL)
    out = (b * NC + k) * D + head * BW + j
    tr = tl.arange(0, T)
    tl.store(decay_ptr + out, last_row(p, tr, T), mask=j < BW)
    tl.store(end_ptr + out, last_row(h, tr, T), mask=j < BW)


@triton.jit(do_not_specialize=["row_units"])
def _rglru_output_kernel(x_ptr, y_ptr, wx_ptr, bx_ptr, wa_ptr, ba_ptr, a_param_ptr, h_in_ptr,
                         L, D, NC, BW, NBV, row_units, seq_ptr, h0_ptr, final_ptr,
                         T: tl.constexpr, BWK: tl.constexpr, BN: tl.constexpr, V: tl.constexpr,
                         DOT_DTYPE: tl.constexpr, PREC: tl.constexpr, PACKED: tl.constexpr,
                         HAS_INITIAL: tl.constexpr, HAS_FINAL: tl.constexpr):
    """Per (chunk, head, column block): y = h rebuilt from the chunk's entering state; h at each
    sequence's last token into final (HAS_FINAL)."""
    pid = tl.program_id(0)
    b = (pid // NC).to(tl.int64)
    k = pid % NC
    head = tl.program_id(1) // NBV
    j = (tl.program_id(1) % NBV) * BN + tl.arange(0, BN)
    rows = k * T + tl.arange(0, T)
    p, h, offs, ok, seq, ends = _forward_tile(
        x_ptr, wx_ptr, bx_ptr, wa_ptr, ba_ptr, a_param_ptr, b, rows, head, j, L, D, BW,
        row_units, seq_ptr, h0_ptr, V, BWK, DOT_DTYPE, PREC, PACKED, HAS_INITIAL)
    h_in = tl.load(h_in_ptr + (b * NC + k) * D + head * BW + j, mask=j < BW, other=0.0)
    y = h + p * h_in[None, :]
    if HAS_FINAL:
        store_at(final_ptr, y, seq, ends, _state_cols(head, j, BW, D), D)
    tl.store(y_ptr + offs, to_element(y, y_ptr), mask=ok)


@triton.jit(do_not_specialize=["row_units"])
def _rglru_reverse_summary_kernel(x_ptr, dy_ptr, wa_ptr, ba_ptr, a_param_ptr, end_ptr,
                                  L, D, NC, BW, NBV, row_units, seq_ptr, dfinal_ptr,
                                  T: tl.constexpr, BWK: tl.constexpr, BN: tl.constexpr,
                                  V: tl.constexpr, DOT_DTYPE: tl.constexpr, PREC: tl.constexpr,
                                  PACKED: tl.constexpr, HAS_DFINAL: tl.constexpr):
    """Per (chunk, head, column block): the adjoint carry a_s dh_s leaving the chunk's first
    token, with nothing entering from the right.  Rows latest first: the reverse recurrence is a
    forward scan (Triton's reverse scan shuffles even within a thread).  The final state's
    gradient enters at each sequence's end; nothing leaves through a start."""
    pid = tl.program_id(0)
    b = (pid // NC).to(tl.int64)
    k = pid % NC
    head = tl.program_id(1) // NBV
    j = (tl.program_id(1) % NBV) * BN + tl.arange(0, BN)
    rows = k * T + (T - 1 - tl.arange(0, T))
    xh = _head_x(x_ptr, b, rows, head, L, D, BW, BWK, DOT_DTYPE)
    ga, _ = _gate(xh, wa_ptr, ba_ptr, head, j, BW, BWK, DOT_DTYPE, PREC)
    offs, ok = _own_tile(b, rows, head, j, L, BW, row_units, V)
    dy = tl.load(dy_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    sp = softplus(tl.load(a_param_ptr + head * BW + j, mask=j < BW, other=0.0))
    a = exp_fast(tl.where((rows < L)[:, None], -8.0 * ga * sp[None, :], 0.0))
    if PACKED or HAS_DFINAL:
        seq, starts, ends = row_sequences(seq_ptr, b, rows, L, PACKED)
        if HAS_DFINAL:
            dy += load_at(dfinal_ptr, seq, ends, _state_cols(head, j, BW, D), D)
        if PACKED:
            a = tl.where(starts[:, None], 0.0, a)
    _, v = tl.associative_scan((a, a * dy), 0, affine_combine)
    out = (b * NC + k) * D + head * BW + j
    tl.store(end_ptr + out, last_row(v, tl.arange(0, T), T), mask=j < BW)


@triton.jit
def _chunk_adjoint(x_ptr, dy_ptr, h_in_ptr, carry_ptr, wx_ptr, bx_ptr, wa_ptr, ba_ptr,
                   a_param_ptr, xh, b, k, rows, head, j, L, D, NC, BW, row_units, seq_ptr,
                   h0_ptr, dfinal_ptr, dh0_ptr, V: tl.constexpr, BWK: tl.constexpr,
                   DOT_DTYPE: tl.constexpr, PREC: tl.constexpr, PACKED: tl.constexpr,
                   HAS_INITIAL: tl.constexpr, HAS_DFINAL: tl.constexpr,
                   WRITE_DH0: tl.constexpr):
    """One [T, BN] tile of the backward, recomputed: gate gradients, dx's direct term, dlog a,
    and d h0 = a_s dh_s at each start (WRITE_DH0).  rows run latest first: the adjoint is a
    forward scan, only h_{t-1} needs a reverse one.  At a start, a_s h_{s-1} is a_s times the
    entering state (h0, or 0 where the state resets)."""
    gx, wx = _gate(xh, wx_ptr, bx_ptr, head, j, BW, BWK, DOT_DTYPE, PREC)
    ga, wa = _gate(xh, wa_ptr, ba_ptr, head, j, BW, BWK, DOT_DTYPE, PREC)
    offs, ok = _own_tile(b, rows, head, j, L, BW, row_units, V)
    x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    sp = softplus(tl.load(a_param_ptr + head * BW + j, mask=j < BW, other=0.0))
    log_a = tl.where((rows < L)[:, None], -8.0 * ga * sp[None, :], 0.0)
    seq, starts, ends = row_sequences(seq_ptr, b, rows, L, PACKED)
    a, m, dm_dlog_a = transition(log_a, resets(starts, HAS_INITIAL))
    u = m * gx * x
    ones = tl.full(a.shape, 1.0, tl.float32)
    cols = _state_cols(head, j, BW, D)
    if PACKED or HAS_INITIAL:  # h_{t-1} of the folded scan; at a start, the entering state
        entering = entering_state(h0_ptr, seq, starts, cols, D, HAS_INITIAL)
        a_fold, u_fold = fold_starts(a, u, starts, entering)
        _, _, c, d = tl.associative_scan((a_fold, u_fold, ones, tl.zeros_like(a)), 0,
                                         previous_state_combine, reverse=True)
    else:
        _, _, c, d = tl.associative_scan((a, u, ones, tl.zeros_like(a)), 0,
                                         previous_state_combine, reverse=True)
    state = (b * NC + k) * D + head * BW + j
    h_prev = c * tl.load(h_in_ptr + state, mask=j < BW, other=0.0)[None, :] + d
    if PACKED or HAS_INITIAL:
        h_prev = tl.where(starts[:, None], entering, h_prev)
    # dh_t = dy_t + a_{t+1} dh_{t+1}, with nothing crossing a start backwards.
    a_cut = a
    if PACKED:
        a_cut = tl.where(starts[:, None], 0.0, a)
    if HAS_DFINAL:
        dy += load_at(dfinal_ptr, seq, ends, cols, D)
    _, _, q, w = tl.associative_scan((a_cut, a_cut * dy, ones, dy), 0, adjoint_combine)
    dh = w + q * tl.load(carry_ptr + state, mask=j < BW, other=0.0)[None, :]
    dla = dh * (a * h_prev) + dh * gx * x * dm_dlog_a
    if WRITE_DH0:
        store_at(dh0_ptr, a * dh, seq, starts, cols, D)
    d_gate_x = dh * m * x * gx * (1.0 - gx)
    d_gate_a = dla * (-8.0 * sp[None, :]) * ga * (1.0 - ga)
    return d_gate_x, d_gate_a, dh * m * gx, dla * (-8.0 * ga), wx, wa


@triton.jit(do_not_specialize=["row_units"])
def _rglru_dx_kernel(x_ptr, dy_ptr, dx_ptr, wx_ptr, bx_ptr, wa_ptr, ba_ptr, a_param_ptr,
                     h_in_ptr, carry_ptr, L, D, NC, BW, row_units, seq_ptr, h0_ptr,
                     dfinal_ptr, dh0_ptr, T: tl.constexpr, BWK: tl.constexpr, BN: tl.constexpr,
                     NB: tl.constexpr, NBV: tl.constexpr, V: tl.constexpr,
                     DOT_DTYPE: tl.constexpr, PREC: tl.constexpr, PACKED: tl.constexpr,
                     HAS_INITIAL: tl.constexpr, HAS_DFINAL: tl.constexpr):
    """Per (chunk, head): dx = dh m gx + dGx Wx^T + dGa Wa^T over the head's column blocks, and
    d h0 at the chunk's starts (HAS_INITIAL; this kernel alone writes it)."""
    pid = tl.program_id(0)
    b = (pid // NC).to(tl.int64)
    k = pid % NC
    head = tl.program_id(1)
    rows = k * T + (T - 1 - tl.arange(0, T))  # latest first (see _chunk_adjoint)
    xh = _head_x(x_ptr, b, rows, head, L, D, BW, BWK, DOT_DTYPE)
    dx_products = tl.zeros([T, BWK], dtype=tl.float32)
    dx_direct = tl.zeros([T, NB, BN], dtype=tl.float32)
    block = tl.arange(0, NB)
    for nb in tl.static_range(NBV):
        j = nb * BN + tl.arange(0, BN)
        d_gate_x, d_gate_a, direct, _, wx, wa = _chunk_adjoint(
            x_ptr, dy_ptr, h_in_ptr, carry_ptr, wx_ptr, bx_ptr, wa_ptr, ba_ptr, a_param_ptr, xh,
            b, k, rows, head, j, L, D, NC, BW, row_units, seq_ptr, h0_ptr, dfinal_ptr, dh0_ptr,
            V, BWK, DOT_DTYPE, PREC, PACKED, HAS_INITIAL, HAS_DFINAL, HAS_INITIAL)
        dx_products += tl.dot(d_gate_x.to(DOT_DTYPE), tl.trans(wx), input_precision=PREC)
        dx_products += tl.dot(d_gate_a.to(DOT_DTYPE), tl.trans(wa), input_precision=PREC)
        dx_direct += tl.where(block[None, :, None] == nb, direct[:, None, :], 0.0)
    dx = dx_products + tl.reshape(dx_direct, [T, BWK])
    kcols = tl.arange(0, BWK)
    offs, ok = _own_tile(b, rows, head, kcols, L, BW, row_units, V)
    tl.store(dx_ptr + offs, to_element(dx, dx_ptr), mask=ok)


@triton.jit(do_not_specialize=["row_units"])
def _rglru_param_grad_kernel(x_ptr, dy_ptr, wx_ptr, bx_ptr, wa_ptr, ba_ptr, a_param_ptr,
                             h_in_ptr, carry_ptr, part_ptr, dsp_part_ptr,
                             L, D, NC, BW, NBV, CHUNKS_PER_SPAN, NSPAN, row_units,
                             seq_ptr, h0_ptr, dfinal_ptr, T: tl.constexpr, BWK: tl.constexpr, BN: tl.constexpr,
                             V: tl.constexpr, DOT_DTYPE: tl.constexpr, PREC: tl.constexpr,
                             PACKED: tl.constexpr, HAS_INITIAL: tl.constexpr,
                             HAS_DFINAL: tl.constexpr):
    """Per (span of chunks, head, column block): partial dWx, dWa, dbx, dba and d softplus."""
    pid = tl.program_id(0)
    b = (pid // NSPAN).to(tl.int64)
    span = pid % NSPAN
    head = tl.program_id(1) // NBV
    j = (tl.program_id(1) % NBV) * BN + tl.arange(0, BN)
    dwx = tl.zeros([BWK, BN], dtype=tl.float32)
    dwa = tl.zeros([BWK, BN], dtype=tl.float32)
    dbx = tl.zeros([BN], dtype=tl.float32)
    dba = tl.zeros([BN], dtype=tl.float32)
    dsp = tl.zeros([BN], dtype=tl.float32)
    k0 = span * CHUNKS_PER_SPAN
    k1 = tl.minimum(k0 + CHUNKS_PER_SPAN, NC)
    for k in range(k0, k1):
        rows = k * T + (T - 1 - tl.arange(0, T))  # latest first (see _chunk_adjoint)
        xh = _head_x(x_ptr, b, rows, head, L, D, BW, BWK, DOT_DTYPE)
        d_gate_x, d_gate_a, _, d_sp, _, _ = _chunk_adjoint(
            x_ptr, dy_ptr, h_in_ptr, carry_ptr, wx_ptr, bx_ptr, wa_ptr, ba_ptr, a_param_ptr, xh,
            b, k, rows, head, j, L, D, NC, BW, row_units, seq_ptr, h0_ptr, dfinal_ptr, h0_ptr,
            V, BWK, DOT_DTYPE, PREC, PACKED, HAS_INITIAL, HAS_DFINAL, False)
        xt = tl.trans(xh)
        dwx += tl.dot(xt, d_gate_x.to(DOT_DTYPE), input_precision=PREC)
        dwa += tl.dot(xt, d_gate_a.to(DOT_DTYPE), input_precision=PREC)
        dbx += tl.sum(d_gate_x, axis=0)
        dba += tl.sum(d_gate_a, axis=0)
        dsp += tl.sum(d_sp, axis=0)
    # One row per program of part, [dWx (H bw bw) | dWa (H bw bw) | dbx D | dba D], and of
    # dsp_part, d softplus (D): reduce.sum_partials sums them
    row = pid.to(tl.int64) * (2 * D * BW + 2 * D)
    i = tl.arange(0, BWK)
    w_offs = row + head * BW * BW + i[:, None] * BW + j[None, :]
    w_ok = (i[:, None] < BW) & (j[None, :] < BW)
    tl.store(part_ptr + w_offs, dwx, mask=w_ok)
    tl.store(part_ptr + w_offs + D * BW, dwa, mask=w_ok)
    v_offs = row + 2 * D * BW + head * BW + j
    tl.store(part_ptr + v_offs, dbx, mask=j < BW)
    tl.store(part_ptr + v_offs + D, dba, mask=j < BW)
    tl.store(dsp_part_ptr + pid.to(tl.int64) * D + head * BW + j, dsp, mask=j < BW)


def _blocks(bw: int, block_n: int):
    bwk = max(16, next_power_of_2(bw))
    bn = min(bwk, block_n)
    return bwk, bn, bwk // bn, cdiv(bw, bn)


# Parameter-gradient programs: 2 per SM are resident (255 registers, Nsight Compute), so 2 per SM
# fill one wave; each program's partial row holds 2 H bw^2 + 2 D floats, and with 4 per SM those
# rows took ~0.5 unit of peak memory at (4, 2048, 2048) and (1, 8192, 2560).
PARAM_GRAD_PROGRAMS_PER_SM = 2


@dataclass(frozen=True)
class RglruConfig:
    """One RG-LRU backend: tokens per chunk and channels per program (block_n), and the launch
    tuning that sweeps pass in: channels per thread of the [T, BN] scan tiles (vector) and the
    warps of the dx and parameter-gradient kernels, whose [T, BWK] and [BWK, BN] accumulators
    need more threads than a tile with the chunk in each thread gives (their scans cross warps;
    4 beat 8 on the H200).  The name is generated from chunk and block_n."""
    chunk: int
    block_n: int = 64
    vector: int = 1
    dx_warps: int = 4
    param_grad_warps: int = 4

    @property
    def name(self) -> str:
        block = "" if self.block_n == 64 else f"_block{self.block_n}"
        return f"fused_gates_hierarchical_chunk{self.chunk}{block}"


def _tile_launch(bn: int, width: int, wanted_vector: int):
    """Warps and vector width that give each thread all T tokens of its channels: BN = 32 w V."""
    vector = vector_width(width, wanted_vector) if bn >= tile_width(1, wanted_vector) else 1
    return dict(V=vector, num_warps=max(1, bn // tile_width(1, vector)))


@functools.lru_cache(maxsize=None)
def plan(config: RglruConfig, bw: int, width: int, dtype=torch.bfloat16) -> dict:
    """Constexprs and warps of every kernel, keyed by role; one place for launches and probes."""
    bwk, bn, nb, nbv = _blocks(bw, config.block_n)
    bn_w = min(bn, 32)  # the parameter-gradient kernel holds two [BWK, BN] accumulators
    common = dict(T=config.chunk, BWK=bwk, DOT_DTYPE=dot_dtype(dtype),
                  PREC="ieee" if dtype == torch.float32 else "tf32")
    scan = dict(common, BN=bn, **_tile_launch(bn, width, config.vector))
    return {"summary": scan, "output": scan, "reverse_summary": scan,
            "dx": {**scan, "NB": nb, "NBV": nbv, "num_warps": config.dx_warps},
            "param_grad": {**common, "BN": bn_w, **_tile_launch(bn_w, width, config.vector),
                           "num_warps": config.param_grad_warps},
            "nbv": nbv, "nbv_w": cdiv(bw, bn_w)}


KERNELS = {"summary": _rglru_summary_kernel, "output": _rglru_output_kernel,
           "reverse_summary": _rglru_reverse_summary_kernel, "dx": _rglru_dx_kernel,
           "param_grad": _rglru_param_grad_kernel}


# The state keywords' constexprs of each kernel (samu.ops.common.sequences).
FEATURES = {"summary": ("PACKED", "HAS_INITIAL"),
            "output": ("PACKED", "HAS_INITIAL", "HAS_FINAL"),
            "reverse_summary": ("PACKED", "HAS_DFINAL"),
            "dx": ("PACKED", "HAS_INITIAL", "HAS_DFINAL"),
            "param_grad": ("PACKED", "HAS_INITIAL", "HAS_DFINAL")}


def launch_plan(config: RglruConfig, width: int, heads: int = 16, features: bool = False):
    """(kernel, constexprs, warps) of every kernel a backend launches at this width: without
    the state keywords, or (features=True) with all of them."""
    by_role = plan(config, width // heads, width)
    out = []
    for role, kernel in KERNELS.items():
        meta = dict(by_role[role])
        warps = meta.pop("num_warps")
        meta.update({name: features for name in FEATURES[role]})
        out.append((kernel, meta, warps))
    return out


@functools.lru_cache(maxsize=None)
def gradient_columns(heads: int, bw: int, width: int) -> dict[str, slice]:
    """Where each parameter's gradient sits in sum_partials' output: the partial rows'
    [dWx (H bw bw) | dWa (H bw bw) | dbx (D) | dba (D)], then d a_param (D)."""
    return named_columns([("gate_x_weight", heads * bw * bw), ("gate_a_weight", heads * bw * bw),
                          ("gate_x_bias", width), ("gate_a_bias", width), ("a_param", width)])


def _operands(params, dtype: torch.dtype):
    """The parameters as the kernels read them: gate weights in the dot's operand dtype (half the
    registers and bytes of FP32 tiles), biases and a_param FP32; a no-op on operands."""
    gate_x_weight, gate_x_bias, gate_a_weight, gate_a_bias, a_param = params
    operand = dot_operand_dtype(dtype)
    return (aligned(gate_x_weight.to(operand)), fp32_contiguous(gate_x_bias),
            aligned(gate_a_weight.to(operand)), fp32_contiguous(gate_a_bias),
            fp32_contiguous(a_param))


def forward(x, params, sequences, config: RglruConfig):
    """(y, final state or None, residuals): the forward's kernels.  The residuals are the
    tensors the backward needs beside x and the parameters: the chunks' decays and entering
    states ([B, NC, D] FP32)."""
    x = aligned(x)
    batch, length, width = x.shape
    heads, bw, _ = params[0].shape
    n_chunks = cdiv(length, config.chunk)
    by_role = plan(config, bw, width, x.dtype)
    params = _operands(params, x.dtype)
    seq, h0 = sequences.seq_index, sequences.initial_state
    flags = dict(PACKED=sequences.packed, HAS_INITIAL=sequences.has_initial)
    f32 = dict(device=x.device, dtype=torch.float32)
    decay = torch.empty(batch, n_chunks, width, **f32)
    end = torch.empty(batch, n_chunks, width, **f32)
    grid = (batch * n_chunks, heads * by_role["nbv"])
    meta = by_role["summary"]
    launching.launch(_rglru_summary_kernel, grid, x, *params, decay, end, length, width,
                     n_chunks, bw, by_role["nbv"], row_stride_units(width, meta), seq, h0,
                     **meta, **flags)
    h_in = chunk_carry(decay, end, reverse=False)
    y = torch.empty_like(x)
    final = sequences.final_state(width, x.device)
    meta = by_role["output"]
    launching.launch(_rglru_output_kernel, grid, x, y, *params, h_in, length, width, n_chunks,
                     bw, by_role["nbv"], row_stride_units(width, meta), seq, h0, final,
                     **meta, **flags, HAS_FINAL=sequences.output_final_state)
    return y, (final if sequences.output_final_state else None), (decay, h_in)


def residual_specs(config: RglruConfig, batch: int, length: int, width: int, dtype):
    """(shape, dtype) of each of forward's residuals, for a compiled graph's fake tensors."""
    n_chunks = cdiv(length, config.chunk)
    return [((batch, n_chunks, width), torch.float32), ((batch, n_chunks, width), torch.float32)]


def backward(x, params, residuals, dy, d_final, sequences, config: RglruConfig):
    """(dx, d gate_x_weight, d gate_x_bias, d gate_a_weight, d gate_a_bias, d a_param,
    d initial_state or None): the backward's kernels.  dy and d_final may be None (no gradient
    reached them).  d h0 comes from the dx kernel alone (the parameter-gradient kernel
    recomputes the same adjoint)."""
    x = aligned(x)
    wx, bx, wa, ba, a_param = _operands(params, x.dtype)
    decay, h_in = residuals
    dy = torch.zeros_like(x) if dy is None else aligned(dy)
    batch, length, width = x.shape
    heads, bw, _ = wx.shape
    n_chunks = cdiv(length, config.chunk)
    by_role = plan(config, bw, width, x.dtype)
    seq, h0 = sequences.seq_index, sequences.initial_state
    has_dfinal = d_final is not None
    d_final = fp32_contiguous(d_final) if has_dfinal else h0
    flags = dict(PACKED=sequences.packed, HAS_INITIAL=sequences.has_initial,
                 HAS_DFINAL=has_dfinal)
    f32 = dict(device=x.device, dtype=torch.float32)
    end = torch.empty(batch, n_chunks, width, **f32)
    meta = by_role["reverse_summary"]
    launching.launch(_rglru_reverse_summary_kernel, (batch * n_chunks, heads * by_role["nbv"]),
                     x, dy, wa, ba, a_param, end, length, width, n_chunks, bw, by_role["nbv"],
                     row_stride_units(width, meta), seq, d_final, **meta,
                     PACKED=sequences.packed, HAS_DFINAL=has_dfinal)
    carry = chunk_carry(decay, end, reverse=True)
    dx = torch.empty_like(x)
    d_h0 = torch.empty_like(h0) if sequences.has_initial else h0
    meta = by_role["dx"]
    launching.launch(_rglru_dx_kernel, (batch * n_chunks, heads), x, dy, dx, wx, bx, wa, ba,
                     a_param, h_in, carry, length, width, n_chunks, bw,
                     row_stride_units(width, meta), seq, h0, d_final, d_h0, **meta, **flags)
    nbv_w = by_role["nbv_w"]
    slots = PARAM_GRAD_PROGRAMS_PER_SM * sm_count(x.device)
    per_batch = max(1, slots // (batch * heads * nbv_w))
    per_span = cdiv(n_chunks, min(n_chunks, per_batch))
    n_spans = cdiv(n_chunks, per_span)
    n_parts = batch * n_spans
    part = torch.empty(n_parts, 2 * heads * bw * bw + 2 * width, **f32)
    dsp_part = rows_of(end, n_parts, width)  # end is spent: the carry has read it
    meta = by_role["param_grad"]
    launching.launch(_rglru_param_grad_kernel, (n_parts, heads * nbv_w), x, dy, wx, bx, wa, ba,
                     a_param, h_in, carry, part, dsp_part, length, width, n_chunks, bw, nbv_w,
                     per_span, n_spans, row_stride_units(width, meta), seq, h0, d_final,
                     **meta, **flags)
    grads = sum_partials(part, dsp_part, a_param)
    at = gradient_columns(heads, bw, width)
    return (dx, grads[at["gate_x_weight"]].view(heads, bw, bw), grads[at["gate_x_bias"]],
            grads[at["gate_a_weight"]].view(heads, bw, bw), grads[at["gate_a_bias"]],
            grads[at["a_param"]], d_h0 if sequences.has_initial else None)


class RglruFunction(torch.autograd.Function):
    """Eager autograd over forward and backward.  The outputs are y and the final state (None
    unless asked for); the backward takes both gradients and returns one for the initial
    state.  Saved: x, the per-chunk states and the parameters as the kernels read them."""

    @staticmethod
    def forward(ctx, x, gate_x_weight, gate_x_bias, gate_a_weight, gate_a_bias, a_param,
                initial_state, seq_index, config: RglruConfig, sequences):
        x = aligned(x)
        params = _operands((gate_x_weight, gate_x_bias, gate_a_weight, gate_a_bias, a_param),
                           x.dtype)
        y, final, residuals = forward(x, params, sequences, config)
        ctx.save_for_backward(x, *params, *residuals)
        ctx.config = config
        ctx.sequences = sequences
        ctx.set_materialize_grads(False)
        return y, final

    @staticmethod
    def backward(ctx, dy, d_final):
        refuse_double_backward("rglru")
        x, *rest = ctx.saved_tensors
        grads = backward(x, rest[:5], rest[5:], dy, d_final, ctx.sequences, ctx.config)
        return (*grads, None, None, None)


def run_with(config: RglruConfig):
    """The backend of one configuration: run(x, *parameters, initial_state=None,
    cu_seqlens=None, output_final_state=False) -> (y, final state or None)."""
    def run(x, gate_x_weight, gate_x_bias, gate_a_weight, gate_a_bias, a_param,
            initial_state=None, cu_seqlens=None, output_final_state=False):
        x = aligned(x)  # sequence_args' placeholders are x, and every pointer must be aligned
        if initial_state is not None:
            initial_state = fp32_contiguous(initial_state)  # differentiable: autograd casts back
        sequences = sequence_args(x, initial_state, cu_seqlens, output_final_state)
        return RglruFunction.apply(x, gate_x_weight, gate_x_bias, gate_a_weight, gate_a_bias,
                                   a_param, initial_state, sequences.seq_index, config, sequences)
    return run


# Narrower column blocks waste less where bw is not a power of two (bw = 160 at D = 2560).
CONFIGS = (tuple(RglruConfig(chunk) for chunk in (16, 32, 64))
           + tuple(RglruConfig(chunk, block_n=32) for chunk in (16, 32)))

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
def _forward_tile(x_ptr, wx_ptr, bx_ptr, wa_ptr, ba_ptr, a_param_ptr, b, rows, head, j,
                  L, D, BW, row_units, V: tl.constexpr, BWK: tl.constexpr,
                  DOT_DTYPE: tl.constexpr, PREC: tl.constexpr):
    """The chunk's local scan: returns (prod a, h from h_in = 0, offsets, mask)."""
    xh = _head_x(x_ptr, b, rows, head, L, D, BW, BWK, DOT_DTYPE)
    gx, _ = _gate(xh, wx_ptr, bx_ptr, head, j, BW, BWK, DOT_DTYPE, PREC)
    ga, _ = _gate(xh, wa_ptr, ba_ptr, head, j, BW, BWK, DOT_DTYPE, PREC)
    offs, ok = _own_tile(b, rows, head, j, L, BW, row_units, V)
    x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    sp = softplus(tl.load(a_param_ptr + head * BW + j, mask=j < BW, other=0.0))
    log_a = tl.where((rows < L)[:, None], -8.0 * ga * sp[None, :], 0.0)
    a, m, _ = transition(log_a, (rows == 0)[:, None])
    p, h = tl.associative_scan((a, m * gx * x), 0, affine_combine)
    return p, h, offs, ok


@triton.jit(do_not_specialize=["row_units"])
def _rglru_summary_kernel(x_ptr, wx_ptr, bx_ptr, wa_ptr, ba_ptr, a_param_ptr, decay_ptr, end_ptr,
                          L, D, NC, BW, NBV, row_units, T: tl.constexpr, BWK: tl.constexpr,
                          BN: tl.constexpr, V: tl.constexpr, DOT_DTYPE: tl.constexpr,
                          PREC: tl.constexpr):
    pid = tl.program_id(0)
    b = (pid // NC).to(tl.int64)
    k = pid % NC
    head = tl.program_id(1) // NBV
    j = (tl.program_id(1) % NBV) * BN + tl.arange(0, BN)
    rows = k * T + tl.arange(0, T)
    p, h, _, _ = _forward_tile(x_ptr, wx_ptr, bx_ptr, wa_ptr, ba_ptr, a_param_ptr, b, rows, head,
                               j, L, D, BW, row_units, V, BWK, DOT_DTYPE, PREC)
    out = (b * NC + k) * D + head * BW + j
    tr = tl.arange(0, T)
    tl.store(decay_ptr + out, last_row(p, tr, T), mask=j < BW)
    tl.store(end_ptr + out, last_row(h, tr, T), mask=j < BW)


@triton.jit(do_not_specialize=["row_units"])
def _rglru_output_kernel(x_ptr, y_ptr, wx_ptr, bx_ptr, wa_ptr, ba_ptr, a_param_ptr, h_in_ptr,
                         L, D, NC, BW, NBV, row_units, T: tl.constexpr, BWK: tl.constexpr,
                         BN: tl.constexpr, V: tl.constexpr, DOT_DTYPE: tl.constexpr,
                         PREC: tl.constexpr):
    pid = tl.program_id(0)
    b = (pid // NC).to(tl.int64)
    k = pid % NC
    head = tl.program_id(1) // NBV
    j = (tl.program_id(1) % NBV) * BN + tl.arange(0, BN)
    rows = k * T + tl.arange(0, T)
    p, h, offs, ok = _forward_tile(x_ptr, wx_ptr, bx_ptr, wa_ptr, ba_ptr, a_param_ptr, b, rows,
                                   head, j, L, D, BW, row_units, V, BWK, DOT_DTYPE, PREC)
    h_in = tl.load(h_in_ptr + (b * NC + k) * D + head * BW + j, mask=j < BW, other=0.0)
    y = h + p * h_in[None, :]
    tl.store(y_ptr + offs, to_element(y, y_ptr), mask=ok)


@triton.jit(do_not_specialize=["row_units"])
def _rglru_reverse_summary_kernel(x_ptr, dy_ptr, wa_ptr, ba_ptr, a_param_ptr, end_ptr,
                                  L, D, NC, BW, NBV, row_units, T: tl.constexpr,
                                  BWK: tl.constexpr, BN: tl.constexpr, V: tl.constexpr,
                                  DOT_DTYPE: tl.constexpr, PREC: tl.constexpr):
    """Rows latest first: the reverse recurrence is a forward scan (Triton's reverse scan
    shuffles even within a thread)."""
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
    _, v = tl.associative_scan((a, a * dy), 0, affine_combine)
    out = (b * NC + k) * D + head * BW + j
    tl.store(end_ptr + out, last_row(v, tl.arange(0, T), T), mask=j < BW)


@triton.jit
def _chunk_adjoint(x_ptr, dy_ptr, h_in_ptr, carry_ptr, wx_ptr, bx_ptr, wa_ptr, ba_ptr,
                   a_param_ptr, xh, b, k, rows, head, j, L, D, NC, BW, row_units,
                   V: tl.constexpr, BWK: tl.constexpr, DOT_DTYPE: tl.constexpr,
                   PREC: tl.constexpr):
    """One [T, BN] tile of the backward, recomputed: gate gradients, dx's direct term, dlog a.
    rows run latest first: the adjoint is a forward scan, only h_{t-1} needs a reverse one."""
    gx, wx = _gate(xh, wx_ptr, bx_ptr, head, j, BW, BWK, DOT_DTYPE, PREC)
    ga, wa = _gate(xh, wa_ptr, ba_ptr, head, j, BW, BWK, DOT_DTYPE, PREC)
    offs, ok = _own_tile(b, rows, head, j, L, BW, row_units, V)
    x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    sp = softplus(tl.load(a_param_ptr + head * BW + j, mask=j < BW, other=0.0))
    log_a = tl.where((rows < L)[:, None], -8.0 * ga * sp[None, :], 0.0)
    a, m, dm_dlog_a = transition(log_a, (rows == 0)[:, None])
    u = m * gx * x
    ones = tl.full(a.shape, 1.0, tl.float32)
    _, _, c, d = tl.associative_scan((a, u, ones, tl.zeros_like(a)), 0, previous_state_combine,
                                     reverse=True)
    state = (b * NC + k) * D + head * BW + j
    h_prev = c * tl.load(h_in_ptr + state, mask=j < BW, other=0.0)[None, :] + d
    _, _, q, w = tl.associative_scan((a, a * dy, ones, dy), 0, adjoint_combine)
    dh = w + q * tl.load(carry_ptr + state, mask=j < BW, other=0.0)[None, :]
    dla = dh * (a * h_prev) + dh * gx * x * dm_dlog_a
    d_gate_x = dh * m * x * gx * (1.0 - gx)
    d_gate_a = dla * (-8.0 * sp[None, :]) * ga * (1.0 - ga)
    return d_gate_x, d_gate_a, dh * m * gx, dla * (-8.0 * ga), wx, wa


@triton.jit(do_not_specialize=["row_units"])
def _rglru_dx_kernel(x_ptr, dy_ptr, dx_ptr, wx_ptr, bx_ptr, wa_ptr, ba_ptr, a_param_ptr,
                     h_in_ptr, carry_ptr, L, D, NC, BW, row_units, T: tl.constexpr,
                     BWK: tl.constexpr, BN: tl.constexpr, NB: tl.constexpr, NBV: tl.constexpr,
                     V: tl.constexpr, DOT_DTYPE: tl.constexpr, PREC: tl.constexpr):
    """Per (chunk, head): dx = dh m gx + dGx Wx^T + dGa Wa^T over the head's column blocks."""
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
            b, k, rows, head, j, L, D, NC, BW, row_units, V, BWK, DOT_DTYPE, PREC)
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
                             T: tl.constexpr, BWK: tl.constexpr, BN: tl.constexpr,
                             V: tl.constexpr, DOT_DTYPE: tl.constexpr, PREC: tl.constexpr):
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
            b, k, rows, head, j, L, D, NC, BW, row_units, V, BWK, DOT_DTYPE, PREC)
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


def launch_plan(config: RglruConfig, width: int, heads: int = 16):
    """(kernel, constexprs, warps) of every kernel a backend launches at this width."""
    by_role = plan(config, width // heads, width)
    out = []
    for role, kernel in KERNELS.items():
        meta = dict(by_role[role])
        warps = meta.pop("num_warps")
        out.append((kernel, meta, warps))
    return out


@functools.lru_cache(maxsize=None)
def gradient_columns(heads: int, bw: int, width: int) -> dict[str, slice]:
    """Where each parameter's gradient sits in sum_partials' output: the partial rows'
    [dWx (H bw bw) | dWa (H bw bw) | dbx (D) | dba (D)], then d a_param (D)."""
    return named_columns([("gate_x_weight", heads * bw * bw), ("gate_a_weight", heads * bw * bw),
                          ("gate_x_bias", width), ("gate_a_bias", width), ("a_param", width)])


class RglruFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gate_x_weight, gate_x_bias, gate_a_weight, gate_a_bias, a_param,
                config: RglruConfig):
        x = aligned(x)
        batch, length, width = x.shape
        heads, bw, _ = gate_x_weight.shape
        n_chunks = cdiv(length, config.chunk)
        by_role = plan(config, bw, width, x.dtype)
        # Gate weights in the dot's operand dtype: half the registers and bytes of FP32 tiles.
        operand = dot_operand_dtype(x.dtype)
        params = [aligned(gate_x_weight.to(operand)), fp32_contiguous(gate_x_bias),
                  aligned(gate_a_weight.to(operand)), fp32_contiguous(gate_a_bias),
                  fp32_contiguous(a_param)]
        f32 = dict(device=x.device, dtype=torch.float32)
        decay = torch.empty(batch, n_chunks, width, **f32)
        end = torch.empty(batch, n_chunks, width, **f32)
        grid = (batch * n_chunks, heads * by_role["nbv"])
        meta = by_role["summary"]
        launching.launch(_rglru_summary_kernel, grid, x, *params, decay, end, length, width,
                         n_chunks, bw, by_role["nbv"], row_stride_units(width, meta), **meta)
        h_in = chunk_carry(decay, end, reverse=False)
        y = torch.empty_like(x)
        meta = by_role["output"]
        launching.launch(_rglru_output_kernel, grid, x, y, *params, h_in, length, width, n_chunks,
                         bw, by_role["nbv"], row_stride_units(width, meta), **meta)
        ctx.save_for_backward(x, decay, h_in, *params)
        ctx.config = config
        return y

    @staticmethod
    def backward(ctx, dy):
        refuse_double_backward("rglru")
        x, decay, h_in, wx, bx, wa, ba, a_param = ctx.saved_tensors
        config = ctx.config
        dy = aligned(dy)
        batch, length, width = x.shape
        heads, bw, _ = wx.shape
        n_chunks = cdiv(length, config.chunk)
        by_role = plan(config, bw, width, x.dtype)
        f32 = dict(device=x.device, dtype=torch.float32)
        end = torch.empty(batch, n_chunks, width, **f32)
        meta = by_role["reverse_summary"]
        launching.launch(_rglru_reverse_summary_kernel, (batch * n_chunks, heads * by_role["nbv"]),
                         x, dy, wa, ba, a_param, end, length, width, n_chunks, bw, by_role["nbv"],
                         row_stride_units(width, meta), **meta)
        carry = chunk_carry(decay, end, reverse=True)
        dx = torch.empty_like(x)
        meta = by_role["dx"]
        launching.launch(_rglru_dx_kernel, (batch * n_chunks, heads), x, dy, dx, wx, bx, wa, ba,
                         a_param, h_in, carry, length, width, n_chunks, bw,
                         row_stride_units(width, meta), **meta)
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
                         per_span, n_spans, row_stride_units(width, meta), **meta)
        grads = sum_partials(part, dsp_part, a_param)
        at = gradient_columns(heads, bw, width)
        return (dx, grads[at["gate_x_weight"]].view(heads, bw, bw), grads[at["gate_x_bias"]],
                grads[at["gate_a_weight"]].view(heads, bw, bw), grads[at["gate_a_bias"]],
                grads[at["a_param"]], None)


def run_with(config: RglruConfig):
    """The backend of one configuration: run(x, *parameters) -> y."""
    def run(x, gate_x_weight, gate_x_bias, gate_a_weight, gate_a_bias, a_param):
        return RglruFunction.apply(x, gate_x_weight, gate_x_bias, gate_a_weight, gate_a_bias,
                                   a_param, config)
    return run


# Narrower column blocks waste less where bw is not a power of two (bw = 160 at D = 2560).
CONFIGS = (tuple(RglruConfig(chunk) for chunk in (16, 32, 64))
           + tuple(RglruConfig(chunk, block_n=32) for chunk in (16, 32)))

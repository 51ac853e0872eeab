"""RG-LRU's decode step in one kernel launch: y_t and the new state from x_t and the state.

One program per (batch row, head, block of BJ of the head's channels): it forms the two gate
products of its channels, G[h bw + j] = sum_i x[h bw + i] W[h, i, j] + b[h bw + j] (as
samu.ops.rglru.naive.block_diagonal), over the head's inputs in blocks of BI, then the step.
For BF16 and FP16 x the weights and the products are rounded to x's dtype, as the eager
autocast reference and the gemm backend's GEMM in x's dtype round them; sums are FP32.
The programs of one weight block are adjacent in the grid (the batch index varies fastest), so
that the batch rows read it from L2.

Bytes per element of [B, D] (BF16 x_t and y_t, FP32 states): reads x (2) and the state (4),
writes y (2) and the new state (4) -> 12 (8 without a state); the gate weights add 8 bw bytes
per channel (both [H, bw, bw] FP32 matrices, read once per step from memory and by every
further batch row from L2) and the head's inputs are re-read by each of its bw / BJ blocks.
Nothing else is allocated or written: no W_cat, no G.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..common import launching
from ..common.launching import cdiv, next_power_of_2
from ..common.math import (exp_fast, one_minus_a_squared, sigmoid_fast, softplus, sqrt_fast,
                           to_element)
from ..recurrence import GATE_SCALE
from ..common.step import reset_rows, step_operands

MIXER = "rglru"

_GATE_SCALE = tl.constexpr(GATE_SCALE)


@triton.jit
def _in_dtype_of(v, ptr):
    """v rounded to ptr's element type (to nearest), back in FP32: the identity for FP32."""
    return to_element(v, ptr).to(tl.float32)


@triton.jit
def _rglru_step_kernel(x_ptr, h0_ptr, y_ptr, h_ptr, wx_ptr, bx_ptr, wa_ptr, ba_ptr, a_param_ptr,
                       reset_ptr, B, D, BW, NJ, x_row, h0_row,
                       BI: tl.constexpr, BJ: tl.constexpr, HAS_STATE: tl.constexpr,
                       HAS_RESETS: tl.constexpr):
    """Program pid = (head NJ + block) B + b: channels h BW + j, j in [block BJ, block BJ + BJ)
    of row b.  gx, ga = sigmoid(G); log a = -8 ga softplus(a_param); h = a h0 + sqrt(1 - a^2)
    gx x (h = gx x without a state, or where the row's reset flag is set: the state resets);
    y = h.  x and h0 rows are x_row, h0_row
    elements apart (unit column stride); y and h are contiguous [B, D], D = heads BW."""
    pid = tl.program_id(0).to(tl.int64)
    b = pid % B
    rest = pid // B
    head = rest // NJ
    j = (rest % NJ) * BJ + tl.arange(0, BJ)
    j_ok = j < BW
    x_at = x_ptr + b * x_row + head * BW
    w_at = head * BW * BW + j[None, :]
    # Per-lane partial sums over the head's inputs; one cross-lane reduction after the loop.
    gx = tl.zeros([BI, BJ], dtype=tl.float32)
    ga = tl.zeros([BI, BJ], dtype=tl.float32)
    for i0 in range(0, BW, BI):
        i = i0 + tl.arange(0, BI)
        i_ok = i < BW
        x_i = tl.load(x_at + i, mask=i_ok, other=0.0).to(tl.float32)
        offs = w_at + i.to(tl.int64)[:, None] * BW
        ok = i_ok[:, None] & j_ok[None, :]
        wx = _in_dtype_of(tl.load(wx_ptr + offs, mask=ok, other=0.0), x_ptr)
        wa = _in_dtype_of(tl.load(wa_ptr + offs, mask=ok, other=0.0), x_ptr)
        gx += x_i[:, None] * wx
        ga += x_i[:, None] * wa
    cols = head * BW + j
    gx = _in_dtype_of(tl.sum(gx, axis=0), x_ptr) + tl.load(bx_ptr + cols, mask=j_ok, other=0.0)
    ga = _in_dtype_of(tl.sum(ga, axis=0), x_ptr) + tl.load(ba_ptr + cols, mask=j_ok, other=0.0)
    x = tl.load(x_at + j, mask=j_ok, other=0.0).to(tl.float32)
    u = sigmoid_fast(gx) * x
    if HAS_STATE:
        sp = softplus(tl.load(a_param_ptr + cols, mask=j_ok, other=0.0))
        log_a = -_GATE_SCALE * sigmoid_fast(ga) * sp
        a = exp_fast(log_a)
        m = sqrt_fast(tl.maximum(one_minus_a_squared(log_a, a), 0.0))
        h = a * tl.load(h0_ptr + b * h0_row + cols, mask=j_ok, other=0.0) + m * u
        h = reset_rows(h, u, reset_ptr, b, cols, HAS_RESETS)
    else:
        h = u
    tl.store(h_ptr + b * D + cols, h, mask=j_ok)
    tl.store(y_ptr + b * D + cols, to_element(h, y_ptr), mask=j_ok)


@functools.lru_cache(maxsize=None)
def _blocks(bw: int) -> tuple[int, int]:
    """(BI, BJ): the head's inputs per loop step and channels per program."""
    return min(32, max(16, next_power_of_2(bw))), min(64, max(16, next_power_of_2(bw)))


def step(x_t, state, gate_x_weight, gate_x_bias, gate_a_weight, gate_a_bias, a_param,
         resets=None):
    """(y_t, new state) of one token in one launch, with the contract of samu.ops.samu.step's
    step; the gate weights' shapes ([H, bw, bw] with H bw = D) are checked here."""
    batch, width = x_t.shape
    heads = gate_x_weight.shape[0] if gate_x_weight.dim() == 3 else 0
    bw = width // heads if heads else 0
    if (bw == 0 or heads * bw != width or tuple(gate_x_weight.shape) != (heads, bw, bw)
            or tuple(gate_a_weight.shape) != (heads, bw, bw)
            or any(tuple(p.shape) != (width,) for p in (gate_x_bias, gate_a_bias, a_param))):
        raise ValueError(f"rglru: the parameters' shapes do not fit width {width}: "
                         f"gate_x_weight {list(gate_x_weight.shape)}, gate_a_weight "
                         f"{list(gate_a_weight.shape)}, gate_x_bias {list(gate_x_bias.shape)}, "
                         f"gate_a_bias {list(gate_a_bias.shape)}, a_param "
                         f"{list(a_param.shape)}")
    x, h0, y, h, params, flags = step_operands(x_t, state, (gate_x_weight, gate_x_bias,
                                                            gate_a_weight, gate_a_bias, a_param),
                                               resets)
    bi, bj = _blocks(bw)
    nj = cdiv(bw, bj)
    launching.launch(_rglru_step_kernel, (batch * heads * nj,), x, h0, y, h, *params, flags,
                     batch, width, bw, nj, x.stride(0), h0.stride(0), BI=bi, BJ=bj,
                     HAS_STATE=state is not None, HAS_RESETS=state is not None
                     and resets is not None, num_warps=4)
    return y, h

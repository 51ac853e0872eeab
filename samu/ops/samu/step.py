"""SAMU's decode step in one kernel launch: y_t and the new state from x_t and the state.

One program per (batch row, part of the row's channels).  The controller's two scalars reduce
over the whole row, so every program of a row forms them itself (the same sums in the same
order: the same r and g), then takes its own channels.  A row is cut into parts only while the
batch is too small to fill the GPU; each part re-reads the row's x and ctrl_weight for the
reduction, from L2.

Bytes per element of [B, D] (BF16 x_t and y_t, FP32 states): reads x (2) and the state (4),
writes y (2) and the new state (4) -> 12 (8 without a state); per channel the parameters add
12 (ctrl_weight's two rows and a_param, FP32), shared by the batch rows.  Nothing else is
allocated or written: no residuals, no per-token scalars.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..common import launching
from ..common.step import reset_rows, step_operands
from ..common.launching import cdiv, next_power_of_2, sm_count
from ..common.math import (exp_fast, one_minus_a_squared, sigmoid_fast, softplus, sqrt_fast,
                           to_element)
from ..recurrence import GATE_SCALE

MIXER = "samu"

_GATE_SCALE = tl.constexpr(GATE_SCALE)


@triton.jit
def _samu_step_kernel(x_ptr, h0_ptr, y_ptr, h_ptr, w_ptr, bias_ptr, a_param_ptr, log_temp_ptr,
                      skip_ptr, reset_ptr, D, x_row, h0_row, SPAN,
                      BD: tl.constexpr, HAS_STATE: tl.constexpr, HAS_RESETS: tl.constexpr):
    """Program (b, part): z = W x_b + bias over the whole row; r, g = sigmoid(z); then channels
    [part SPAN, (part + 1) SPAN) of h = a h0 + sqrt(1 - a^2) g x (h = g x without a state, or
    where the row's reset flag is set: the state resets) and y = h + skip x.  x and h0 rows are
    x_row, h0_row elements apart (unit column stride); y and h are contiguous [B, D]."""
    b = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    x_at = x_ptr + b * x_row
    # Per-lane partial dot products; one cross-lane reduction after the loop.
    z0 = tl.zeros([BD], dtype=tl.float32)
    z1 = tl.zeros([BD], dtype=tl.float32)
    for d0 in range(0, D, BD):
        cols = d0 + tl.arange(0, BD)
        ok = cols < D
        x = tl.load(x_at + cols, mask=ok, other=0.0).to(tl.float32)
        z0 += x * tl.load(w_ptr + cols, mask=ok, other=0.0)
        z1 += x * tl.load(w_ptr + D + cols, mask=ok, other=0.0)
    r = sigmoid_fast(tl.sum(z0, axis=0) + tl.load(bias_ptr))
    g = sigmoid_fast(tl.sum(z1, axis=0) + tl.load(bias_ptr + 1))
    c = _GATE_SCALE * tl.exp(tl.load(log_temp_ptr))
    skip = tl.load(skip_ptr)
    lo = part * SPAN
    hi = tl.minimum(lo + SPAN, D)
    for d0 in range(lo, hi, BD):
        cols = d0 + tl.arange(0, BD)
        ok = cols < hi
        x = tl.load(x_at + cols, mask=ok, other=0.0).to(tl.float32)
        u = g * x
        if HAS_STATE:
            log_a = -c * r * softplus(tl.load(a_param_ptr + cols, mask=ok, other=0.0))
            a = exp_fast(log_a)
            m = sqrt_fast(tl.maximum(one_minus_a_squared(log_a, a), 0.0))
            h0 = tl.load(h0_ptr + b * h0_row + cols, mask=ok, other=0.0)
            h = reset_rows(a * h0 + m * u, u, reset_ptr, b, cols, HAS_RESETS)
        else:
            h = u
        tl.store(h_ptr + b * D + cols, h, mask=ok)
        tl.store(y_ptr + b * D + cols, to_element(h + skip * x, y_ptr), mask=ok)


# Programs that keep the GPU busy: a row is cut into parts below this many rows.
_PROGRAMS_PER_SM = 1


@functools.lru_cache(maxsize=None)
def _geometry(batch: int, width: int, sms: int) -> tuple[int, int, int]:
    """(block, parts per row, channels per part) of a step: worked out once per shape."""
    block = min(512, max(16, next_power_of_2(width)))
    blocks = cdiv(width, block)
    parts = max(1, min(blocks, cdiv(_PROGRAMS_PER_SM * sms, batch)))
    per_part = cdiv(blocks, parts)
    return block, cdiv(blocks, per_part), per_part * block  # no part left without channels


def step(x_t, state, ctrl_weight, ctrl_bias, a_param, log_temp, skip, resets=None):
    """(y_t in x_t's dtype, new state FP32 [B, D]) of one token, in one launch.  x_t [B, D]
    bfloat16, float16 or float32; state [B, D] floating point (FP32; another dtype is cast, as
    the forward casts an initial state), or None for a sequence's first token; resets
    torch.bool [B] or None (a True row ignores its state).  The inputs are
    checked by the caller (samu.modules); the parameters' shapes are checked here, as the
    kernel's bounds follow them.  Allocates only the two outputs when x_t's rows, the state and
    the FP32 parameters are as the kernel reads them (samu.ops.common.step)."""
    batch, width = x_t.shape
    if (tuple(ctrl_weight.shape) != (2, width) or tuple(ctrl_bias.shape) != (2,)
            or tuple(a_param.shape) != (width,) or log_temp.numel() != 1 or skip.numel() != 1):
        raise ValueError(f"samu: the parameters' shapes do not fit width {width}: ctrl_weight "
                         f"{list(ctrl_weight.shape)}, ctrl_bias {list(ctrl_bias.shape)}, "
                         f"a_param {list(a_param.shape)}, log_temp {list(log_temp.shape)}, "
                         f"skip {list(skip.shape)}")
    x, h0, y, h, params, flags = step_operands(x_t, state, (ctrl_weight, ctrl_bias, a_param,
                                                            log_temp, skip), resets)
    block, parts, span = _geometry(batch, width, sm_count(x.device))
    launching.launch(_samu_step_kernel, (batch, parts), x, h0, y, h, *params, flags, width,
                     x.stride(0), h0.stride(0), span, BD=block, HAS_STATE=state is not None,
                     HAS_RESETS=state is not None and resets is not None, num_warps=4)
    return y, h

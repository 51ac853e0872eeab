"""SAMU's Triton kernels, forward and backward (SPEC sections 2 and 8).

Bytes per element of [B, L, D] (BF16 x, y, dy, dx; the FP32 per-chunk states are ~D*12/T bytes
per token):
  forward   summary+controller reads x (2), output reads x and writes y (4)          -> 6
  backward  reverse summary reads dy (2), main reads x, dy (4) and writes dx (2)     -> 8
The two full-width kernels (summary+controller, backward main) pass over a chunk's tile twice;
the second pass re-reads it from L2.  FLOPs are ~40 per element: far under the memory time.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .scan_kernels import (adjoint_combine, affine_combine, chunk_carry, first_row, last_row,
                           softplus, transition)

MIXER = "samu"


@triton.jit
def _tile(ptr, b, rows, cols, L, D):
    """Offsets and mask of a [T, BD] tile of a [B, L, D] tensor, int64-safe."""
    ok = (rows[:, None] < L) & (cols[None, :] < D)
    offs = (b * L + rows.to(tl.int64))[:, None] * D + cols[None, :]
    return offs, ok


@triton.jit
def _samu_summary_kernel(x_ptr, w_ptr, bias_ptr, a_param_ptr, log_temp_ptr,
                         r_ptr, g_ptr, decay_ptr, end_ptr, L, D, NC,
                         T: tl.constexpr, BD: tl.constexpr):
    """Per chunk, full width: the controller (r, g) and the chunk summary (decay, end state)."""
    pid = tl.program_id(0)
    b = (pid // NC).to(tl.int64)
    k = pid % NC
    rows = k * T + tl.arange(0, T)
    row_ok = rows < L
    z0 = tl.zeros([T], dtype=tl.float32)
    z1 = tl.zeros([T], dtype=tl.float32)
    for d0 in range(0, D, BD):
        cols = d0 + tl.arange(0, BD)
        offs, ok = _tile(x_ptr, b, rows, cols, L, D)
        x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        w0 = tl.load(w_ptr + cols, mask=cols < D, other=0.0)
        w1 = tl.load(w_ptr + D + cols, mask=cols < D, other=0.0)
        z0 += tl.sum(x * w0[None, :], axis=1)
        z1 += tl.sum(x * w1[None, :], axis=1)
    r = tl.sigmoid(z0 + tl.load(bias_ptr))
    g = tl.sigmoid(z1 + tl.load(bias_ptr + 1))
    r = tl.where(row_ok, r, 0.0)  # r = 0 makes a = 1: padded tokens are the identity
    tl.store(r_ptr + b * L + rows, r, mask=row_ok)
    tl.store(g_ptr + b * L + rows, g, mask=row_ok)
    c = 8.0 * tl.exp(tl.load(log_temp_ptr))
    r_sum = tl.sum(r, axis=0)
    is_first = (rows == 0)[:, None]
    for d0 in range(0, D, BD):
        cols = d0 + tl.arange(0, BD)
        offs, ok = _tile(x_ptr, b, rows, cols, L, D)
        x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        lam = c * softplus(tl.load(a_param_ptr + cols, mask=cols < D, other=0.0))
        a, m, _ = transition(-lam[None, :] * r[:, None], is_first)
        _, h = tl.associative_scan((a, m * g[:, None] * x), 0, affine_combine)
        out = (b * NC + k) * D + cols
        tl.store(end_ptr + out, last_row(h, tl.arange(0, T), T), mask=cols < D)
        tl.store(decay_ptr + out, tl.exp(-lam * r_sum), mask=cols < D)


@triton.jit
def _samu_output_kernel(x_ptr, y_ptr, r_ptr, g_ptr, h_in_ptr, a_param_ptr, log_temp_ptr, skip_ptr,
                        L, D, NC, T: tl.constexpr, BD: tl.constexpr):
    """Per (chunk, channel block): y = h + skip x with h rebuilt from the chunk's entering state."""
    pid = tl.program_id(0)
    b = (pid // NC).to(tl.int64)
    k = pid % NC
    rows = k * T + tl.arange(0, T)
    row_ok = rows < L
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    offs, ok = _tile(x_ptr, b, rows, cols, L, D)
    x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + b * L + rows, mask=row_ok, other=0.0)
    g = tl.load(g_ptr + b * L + rows, mask=row_ok, other=0.0)
    c = 8.0 * tl.exp(tl.load(log_temp_ptr))
    lam = c * softplus(tl.load(a_param_ptr + cols, mask=cols < D, other=0.0))
    a, m, _ = transition(-lam[None, :] * r[:, None], (rows == 0)[:, None])
    p, h = tl.associative_scan((a, m * g[:, None] * x), 0, affine_combine)
    h_in = tl.load(h_in_ptr + (b * NC + k) * D + cols, mask=cols < D, other=0.0)
    y = h + p * h_in[None, :] + tl.load(skip_ptr) * x
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _samu_reverse_summary_kernel(dy_ptr, r_ptr, a_param_ptr, log_temp_ptr, end_ptr, L, D, NC,
                                 T: tl.constexpr, BD: tl.constexpr):
    """Per (chunk, channel block): the adjoint carry a_s dh_s leaving the chunk's first token,
    with nothing entering from the right."""
    pid = tl.program_id(0)
    b = (pid // NC).to(tl.int64)
    k = pid % NC
    rows = k * T + tl.arange(0, T)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    offs, ok = _tile(dy_ptr, b, rows, cols, L, D)
    dy = tl.load(dy_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + b * L + rows, mask=rows < L, other=0.0)
    c = 8.0 * tl.exp(tl.load(log_temp_ptr))
    lam = c * softplus(tl.load(a_param_ptr + cols, mask=cols < D, other=0.0))
    a = tl.exp(-lam[None, :] * r[:, None])
    _, v = tl.associative_scan((a, a * dy), 0, affine_combine, reverse=True)
    tl.store(end_ptr + (b * NC + k) * D + cols, first_row(v, tl.arange(0, T)), mask=cols < D)


@triton.jit
def _samu_chunk_adjoint(x_ptr, dy_ptr, h_in_ptr, carry_ptr, a_param_ptr, b, k, rows, cols, r, g,
                        c, L, D, NC, NEED_H: tl.constexpr):
    """Recompute one [T, BD] tile of the backward: x, dy, a, m, dh and (if NEED_H) dlog a."""
    offs, ok = _tile(x_ptr, b, rows, cols, L, D)
    x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    lam = c * softplus(tl.load(a_param_ptr + cols, mask=cols < D, other=0.0))
    log_a = -lam[None, :] * r[:, None]
    a, m, dm_dlog_a = transition(log_a, (rows == 0)[:, None])
    gx = g[:, None] * x
    state = (b * NC + k) * D + cols
    carry = tl.load(carry_ptr + state, mask=cols < D, other=0.0)
    ones = tl.full(a.shape, 1.0, tl.float32)
    _, _, q, w = tl.associative_scan((a, a * dy, ones, dy), 0, adjoint_combine, reverse=True)
    dh = w + q * carry[None, :]
    dla = tl.zeros_like(dh)
    if NEED_H:
        u = m * gx
        p, h = tl.associative_scan((a, u), 0, affine_combine)
        h_in = tl.load(h_in_ptr + state, mask=cols < D, other=0.0)
        h = h + p * h_in[None, :]
        dla = dh * (h - u) + dh * gx * dm_dlog_a
    return offs, ok, x, dy, m, dh, dla, lam, log_a


@triton.jit
def _samu_backward_kernel(x_ptr, dy_ptr, dx_ptr, w_ptr, r_ptr, g_ptr, h_in_ptr, carry_ptr,
                          a_param_ptr, log_temp_ptr, skip_ptr,
                          dsp_part_ptr, dw_part_ptr, scalar_part_ptr, L, D, NC,
                          T: tl.constexpr, BD: tl.constexpr):
    """Per chunk, full width.  Pass 1 reduces dr, dg per token (and per-channel and scalar
    partials); pass 2 writes dx = dh m g + skip dy + W^T dz and the ctrl_weight partials."""
    pid = tl.program_id(0)
    b = (pid // NC).to(tl.int64)
    k = pid % NC
    rows = k * T + tl.arange(0, T)
    row_ok = rows < L
    r = tl.load(r_ptr + b * L + rows, mask=row_ok, other=0.0)
    g = tl.load(g_ptr + b * L + rows, mask=row_ok, other=0.0)
    c = 8.0 * tl.exp(tl.load(log_temp_ptr))
    skip = tl.load(skip_ptr)
    dr = tl.zeros([T], dtype=tl.float32)
    dg = tl.zeros([T], dtype=tl.float32)
    d_log_temp = tl.zeros([BD], dtype=tl.float32)
    d_skip = tl.zeros([BD], dtype=tl.float32)
    for d0 in range(0, D, BD):
        cols = d0 + tl.arange(0, BD)
        offs, ok, x, dy, m, dh, dla, lam, log_a = _samu_chunk_adjoint(
            x_ptr, dy_ptr, h_in_ptr, carry_ptr, a_param_ptr, b, k, rows, cols, r, g, c,
            L, D, NC, True)
        dr += tl.sum(dla * -lam[None, :], axis=1)
        dg += tl.sum(dh * m * x, axis=1)
        tl.store(dsp_part_ptr + pid.to(tl.int64) * D + cols,
                 tl.sum(dla * (-c * r[:, None]), axis=0), mask=cols < D)
        d_log_temp += tl.sum(dla * log_a, axis=0)
        d_skip += tl.sum(dy * x, axis=0)
    dz0 = tl.where(row_ok, dr * r * (1.0 - r), 0.0)
    dz1 = tl.where(row_ok, dg * g * (1.0 - g), 0.0)
    scalars = scalar_part_ptr + pid.to(tl.int64) * 4
    tl.store(scalars, tl.sum(d_log_temp, axis=0))
    tl.store(scalars + 1, tl.sum(d_skip, axis=0))
    tl.store(scalars + 2, tl.sum(dz0, axis=0))
    tl.store(scalars + 3, tl.sum(dz1, axis=0))
    for d0 in range(0, D, BD):
        cols = d0 + tl.arange(0, BD)
        offs, ok, x, dy, m, dh, dla, lam, log_a = _samu_chunk_adjoint(
            x_ptr, dy_ptr, h_in_ptr, carry_ptr, a_param_ptr, b, k, rows, cols, r, g, c,
            L, D, NC, False)
        w0 = tl.load(w_ptr + cols, mask=cols < D, other=0.0)
        w1 = tl.load(w_ptr + D + cols, mask=cols < D, other=0.0)
        dx = dh * m * g[:, None] + skip * dy + dz0[:, None] * w0[None, :] + dz1[:, None] * w1[None, :]
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=ok)
        part = dw_part_ptr + pid.to(tl.int64) * 2 * D + cols
        tl.store(part, tl.sum(dz0[:, None] * x, axis=0), mask=cols < D)
        tl.store(part + D, tl.sum(dz1[:, None] * x, axis=0), mask=cols < D)


def _launch_config(width: int, chunk: int):
    block_d = min(64 if chunk >= 64 else 128, triton.next_power_of_2(width))
    warps = 8 if chunk * block_d >= 4096 else 4
    return block_d, warps


class SamuFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ctrl_weight, ctrl_bias, a_param, log_temp, skip, chunk):
        x = x.contiguous()
        batch, length, width = x.shape
        n_chunks = triton.cdiv(length, chunk)
        block_d, warps = _launch_config(width, chunk)
        f32 = dict(device=x.device, dtype=torch.float32)
        params = [p.detach().float().contiguous() for p in (ctrl_weight, ctrl_bias, a_param,
                                                             log_temp, skip)]
        w, bias, a_param_, log_temp_, skip_ = params
        r = torch.empty(batch, length, **f32)
        g = torch.empty(batch, length, **f32)
        decay = torch.empty(batch, n_chunks, width, **f32)
        end = torch.empty(batch, n_chunks, width, **f32)
        _samu_summary_kernel[(batch * n_chunks,)](
            x, w, bias, a_param_, log_temp_, r, g, decay, end, length, width, n_chunks,
            T=chunk, BD=block_d, num_warps=warps)
        h_in = chunk_carry(decay, end, reverse=False)
        y = torch.empty_like(x)
        grid = (batch * n_chunks, triton.cdiv(width, block_d))
        _samu_output_kernel[grid](x, y, r, g, h_in, a_param_, log_temp_, skip_, length, width,
                                  n_chunks, T=chunk, BD=block_d, num_warps=warps)
        ctx.save_for_backward(x, r, g, decay, h_in, *params)
        ctx.chunk = chunk
        return y

    @staticmethod
    def backward(ctx, dy):
        x, r, g, decay, h_in, w, bias, a_param, log_temp, skip = ctx.saved_tensors
        chunk = ctx.chunk
        dy = dy.contiguous()
        batch, length, width = x.shape
        n_chunks = triton.cdiv(length, chunk)
        block_d, warps = _launch_config(width, chunk)
        f32 = dict(device=x.device, dtype=torch.float32)
        end = torch.empty(batch, n_chunks, width, **f32)
        grid = (batch * n_chunks, triton.cdiv(width, block_d))
        _samu_reverse_summary_kernel[grid](dy, r, a_param, log_temp, end, length, width, n_chunks,
                                           T=chunk, BD=block_d, num_warps=warps)
        carry = chunk_carry(decay, end, reverse=True)
        dx = torch.empty_like(x)
        dsp_part = end  # reused: the reverse summary is consumed by the carry
        dw_part = torch.empty(batch * n_chunks, 2, width, **f32)
        scalar_part = torch.empty(batch * n_chunks, 4, **f32)
        _samu_backward_kernel[(batch * n_chunks,)](
            x, dy, dx, w, r, g, h_in, carry, a_param, log_temp, skip,
            dsp_part, dw_part, scalar_part, length, width, n_chunks,
            T=chunk, BD=block_d, num_warps=warps)
        scalars = scalar_part.sum(0)
        grads = (dx, dw_part.sum(0), scalars[2:4].clone(),
                 dsp_part.sum((0, 1)) * torch.sigmoid(a_param), scalars[0], scalars[1])
        return (*grads, None)


def _backend(chunk: int):
    def run(x, ctrl_weight, ctrl_bias, a_param, log_temp, skip):
        return SamuFunction.apply(x, ctrl_weight, ctrl_bias, a_param, log_temp, skip, chunk)
    return run


CHUNKS = (16, 32, 64)
BACKENDS = {f"fused_controller_hierarchical_chunk{c}": _backend(c) for c in CHUNKS}

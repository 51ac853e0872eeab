"""Hand-derived backward of both mixers, written as formulas (no autograd).

These are the formulas the Triton kernels implement; tests and notebook 00 check them against
autograd on the float64 reference.  With dh the total gradient reaching h:

    dh_t     = dy_t + a_{t+1} dh_{t+1}                          (reverse scan, dh_L = 0)
    a_t h_{t-1} = h_t - u_t                                     (no division, no shift)
    dlog a_t = dh_t (h_t - u_t) + [t > 0] dh_t gate_t x_t dm_t/dlog a_t
    dm/dlog a = -2 a^2 / sqrt(max(4 (1 - a^2), 1e-6))           (recurrentgemma's bound)

and then each parameter by the chain rule (see ``rglru_backward`` and ``samu_backward``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .reference import (GATE_SCALE, SQRT_GRAD_FLOOR, SCANS, block_diagonal, samu_controller,
                        transition)


def reverse_scan(a: torch.Tensor, dy: torch.Tensor, scan: str = "sequential") -> torch.Tensor:
    """dh_t = dy_t + a_{t+1} dh_{t+1}: the forward scan run on the time-reversed sequence."""
    a_next = torch.cat([a[:, 1:], torch.ones_like(a[:, :1])], dim=1)
    return SCANS[scan](a_next.flip(1), dy.flip(1)).flip(1)


def dlog_a(log_a, a, h, u, dh, gate_x):
    """Gradient reaching log a through a_t h_{t-1} and through m_t (none at t = 0)."""
    dm_dlog_a = -2.0 * a * a / torch.sqrt(torch.clamp(4.0 * -torch.expm1(2.0 * log_a),
                                                      min=SQRT_GRAD_FLOOR))
    dm_dlog_a[:, 0] = 0.0
    return dh * (h - u) + dh * gate_x * dm_dlog_a


def block_diagonal_transpose(g: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """dx[..., h*bw+i] = sum_j g[..., h*bw+j] W[h, i, j]."""
    heads, bw, _ = weight.shape
    gh = g.reshape(*g.shape[:-1], heads, bw)
    return torch.einsum("blhj,hij->blhi", gh, weight).reshape(g.shape)


def block_diagonal_weight_grad(x: torch.Tensor, g: torch.Tensor, heads: int) -> torch.Tensor:
    """dW[h, i, j] = sum_{b,t} x[..., h*bw+i] g[..., h*bw+j]."""
    bw = x.shape[-1] // heads
    return torch.einsum("blhi,blhj->hij", x.reshape(*x.shape[:-1], heads, bw),
                        g.reshape(*g.shape[:-1], heads, bw))


def rglru_backward(x, dy, gate_x_weight, gate_x_bias, gate_a_weight, gate_a_bias, a_param,
                   scan: str = "sequential"):
    """Every gradient of RG-LRU from the formulas, in x's dtype (use float64)."""
    heads = gate_x_weight.shape[0]
    gx = torch.sigmoid(block_diagonal(x, gate_x_weight, gate_x_bias))
    ga = torch.sigmoid(block_diagonal(x, gate_a_weight, gate_a_bias))
    sp = F.softplus(a_param)
    log_a = -GATE_SCALE * ga * sp
    a, m = transition(log_a)
    u = m * gx * x
    h = SCANS[scan](a, u)
    dh = reverse_scan(a, dy, scan)
    dla = dlog_a(log_a, a, h, u, dh, gx * x)
    d_gate_x = dh * m * x * gx * (1 - gx)
    d_gate_a = dla * (-GATE_SCALE * sp) * ga * (1 - ga)
    d_sp = (dla * (-GATE_SCALE * ga)).sum((0, 1))
    dx = (dh * m * gx + block_diagonal_transpose(d_gate_x, gate_x_weight)
          + block_diagonal_transpose(d_gate_a, gate_a_weight))
    return {
        "x": dx,
        "gate_x_weight": block_diagonal_weight_grad(x, d_gate_x, heads),
        "gate_x_bias": d_gate_x.sum((0, 1)),
        "gate_a_weight": block_diagonal_weight_grad(x, d_gate_a, heads),
        "gate_a_bias": d_gate_a.sum((0, 1)),
        "a_param": d_sp * torch.sigmoid(a_param),
    }


def samu_backward(x, dy, ctrl_weight, ctrl_bias, a_param, log_temp, skip,
                  scan: str = "sequential"):
    """Every gradient of SAMU from the formulas, in x's dtype (use float64)."""
    r, g = samu_controller(x, ctrl_weight, ctrl_bias)
    c = GATE_SCALE * torch.exp(log_temp)
    sp = F.softplus(a_param)
    log_a = -c * r[..., None] * sp
    a, m = transition(log_a)
    u = m * g[..., None] * x
    h = SCANS[scan](a, u)
    dh = reverse_scan(a, dy, scan)
    dla = dlog_a(log_a, a, h, u, dh, g[..., None] * x)
    dr = (dla * (-c * sp)).sum(-1)
    dg = (dh * m * x).sum(-1)
    dz = torch.stack([dr * r * (1 - r), dg * g * (1 - g)], dim=-1)
    dx = dh * m * g[..., None] + skip * dy + dz @ ctrl_weight
    return {
        "x": dx,
        "ctrl_weight": torch.einsum("blk,bld->kd", dz, x),
        "ctrl_bias": dz.sum((0, 1)),
        "a_param": (dla * (-c * r[..., None])).sum((0, 1)) * torch.sigmoid(a_param),
        "log_temp": (dla * log_a).sum(),
        "skip": (dy * x).sum(),
    }


BACKWARDS = {"rglru": rglru_backward, "samu": samu_backward}

"""RG-LRU's hand-derived backward, written as formulas (no autograd): what its kernels implement,
checked against autograd on the float64 reference.  The shared steps (dh, dlog a) are in
``samu.ops.recurrence``; this adds the gates' chain rule and the block-diagonal transposes."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..recurrence import GATE_SCALE, SCANS, dlog_a, reverse_scan, transition
from .naive import block_diagonal


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

"""SAMU's hand-derived backward, written as formulas (no autograd): what its kernels implement,
checked against autograd on the float64 reference.  The shared steps (dh, dlog a) are in
``samu.ops.recurrence``; this adds the controller's chain rule."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..recurrence import GATE_SCALE, SCANS, dlog_a, reverse_scan, transition
from .naive import samu_controller


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

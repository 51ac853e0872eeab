"""SAMU in pure PyTorch, differentiated by autograd: the reference the kernels are held to.

Its controller z = W x + b is FP32 (float64 for the oracle).
Numerics follow SPEC section 2, "Numerics, both mixers": in float64 everything is float64
(the oracle); otherwise the carry is FP32 and y comes back in x's dtype.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..recurrence import GATE_SCALE, carry_dtype, token_chunks, transition
from ..layout import scan_sequences, with_final_state


def samu_controller(x, ctrl_weight, ctrl_bias):
    """z_t = W x_t + b in FP32 (float64 for the oracle); r, g = sigmoid(z)."""
    cdt = carry_dtype(x)
    z = x.to(cdt) @ ctrl_weight.to(cdt).t() + ctrl_bias.to(cdt)
    return torch.sigmoid(z[..., 0]), torch.sigmoid(z[..., 1])


def samu_scan_inputs(x, ctrl_weight, ctrl_bias, a_param, log_temp, reset=None):
    """The recurrence's inputs, (log a, a, u), from the eager controller: per-token scalars r, g;
    log a = -8 exp(log_temp) r softplus(a_param); u = m g x.  [B, L, D] each, in the carry dtype:
    this is the state-sized transition the kernels never write.  m = 1 where ``reset`` ([B, L]
    bool; t = 0 by default)."""
    cdt = carry_dtype(x)
    r, g = samu_controller(x, ctrl_weight, ctrl_bias)
    c = GATE_SCALE * torch.exp(log_temp.to(cdt))
    log_a = -c * r[..., None] * F.softplus(a_param.to(cdt))
    a, m = transition(log_a, reset)
    return log_a, a, m * g[..., None] * x.to(cdt)


def samu_reference(x, ctrl_weight, ctrl_bias, a_param, log_temp, skip, scan: str = "chunked",
                   initial_state=None, cu_seqlens=None, output_final_state: bool = False,
                   resets=None):
    """SAMU: the scan of samu_scan_inputs; y = h + skip x.  The state keywords (resets among
    them) are SPEC section 3's (samu.ops.layout); with output_final_state returns (y, final
    state)."""
    h, seqs = scan_sequences(
        x, lambda reset: samu_scan_inputs(x, ctrl_weight, ctrl_bias, a_param, log_temp, reset),
        scan, initial_state, cu_seqlens, resets)
    y = (h + skip.to(h.dtype) * x.to(h.dtype)).to(x.dtype)
    return with_final_state(y, h, seqs, output_final_state)


def eager_controller(x, ctrl_weight, ctrl_bias, a_param, log_temp, skip):
    """The public pipelines' preparation (samu.experiment.peers): samu_scan_inputs' log a and u,
    and y from the scan's states h (y = h + skip x)."""
    log_a, _, u = samu_scan_inputs(x, ctrl_weight, ctrl_bias, a_param, log_temp)
    return log_a, u, lambda h: h + skip.to(h.dtype) * x.to(h.dtype)


def log_decay(x, ctrl_weight, ctrl_bias, a_param, log_temp, skip):
    """[B, D] in the carry dtype: sum_t log a_t = -8 exp(log_temp) softplus(a_param) sum_t r_t,
    r = sigmoid(ctrl_weight[0] x + ctrl_bias[0]) as in samu_reference: log A of a slice that no
    sequence starts in (samu.distributed)."""
    cdt = carry_dtype(x)
    weight, bias = ctrl_weight[0].to(cdt), ctrl_bias[0].to(cdt)
    total = torch.zeros(x.shape[0], dtype=cdt, device=x.device)
    for xc in token_chunks(x):
        total += torch.sigmoid(xc.to(cdt) @ weight + bias).sum(1)
    scale = GATE_SCALE * torch.exp(log_temp.to(cdt))
    return -scale * total[:, None] * F.softplus(a_param.to(cdt))

"""RG-LRU in pure PyTorch, differentiated by autograd: the reference the kernels are held to.

Its block-diagonal gate products take operands in x's dtype with FP32 accumulation, rounded to
x's dtype as autocast would.
Numerics follow SPEC section 2, "Numerics, both mixers": in float64 everything is float64
(the oracle); otherwise the carry is FP32 and y comes back in x's dtype.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..recurrence import GATE_SCALE, carry_dtype, token_chunks, transition
from ..layout import scan_sequences, with_final_state


def block_diagonal(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """G[..., h*bw+j] = sum_i x[..., h*bw+i] W[h, i, j] + b[h*bw+j]."""
    heads, bw, _ = weight.shape
    xh = x.reshape(*x.shape[:-1], heads, bw)
    return torch.einsum("blhi,hij->blhj", xh, weight).reshape(x.shape) + bias


def rglru_scan_inputs(x, gate_x_weight, gate_x_bias, gate_a_weight, gate_a_bias, a_param,
                      reset=None):
    """The recurrence's inputs, (log a, a, u), from the eager gates: gx, ga = sigmoid(block-
    diagonal gates); log a = -8 ga softplus(a_param); u = m gx x.  [B, L, D] each, in the carry
    dtype: this is the state-sized transition the kernels never write.  m = 1 where ``reset``
    ([B, L] bool; t = 0 by default)."""
    cdt = carry_dtype(x)
    if cdt == torch.float64:
        xg, wx, wa = x, gate_x_weight.double(), gate_a_weight.double()
    elif x.dtype in (torch.bfloat16, torch.float16):  # autocast: low-precision operands
        xg, wx, wa = x, gate_x_weight.to(x.dtype), gate_a_weight.to(x.dtype)
    else:
        xg, wx, wa = x.float(), gate_x_weight.float(), gate_a_weight.float()
    gx = torch.sigmoid(block_diagonal(xg, wx, gate_x_bias.to(cdt)).to(cdt))
    ga = torch.sigmoid(block_diagonal(xg, wa, gate_a_bias.to(cdt)).to(cdt))
    log_a = -GATE_SCALE * ga * F.softplus(a_param.to(cdt))
    a, m = transition(log_a, reset)
    return log_a, a, m * gx * x.to(cdt)


def rglru_reference(x, gate_x_weight, gate_x_bias, gate_a_weight, gate_a_bias, a_param,
                    scan: str = "chunked", initial_state=None, cu_seqlens=None,
                    output_final_state: bool = False, resets=None):
    """RG-LRU: the scan of rglru_scan_inputs; y = h.  The state keywords (resets among them)
    are SPEC section 3's (samu.ops.layout); with output_final_state returns (y, final state)."""
    h, seqs = scan_sequences(
        x, lambda reset: rglru_scan_inputs(x, gate_x_weight, gate_x_bias, gate_a_weight,
                                           gate_a_bias, a_param, reset),
        scan, initial_state, cu_seqlens, resets)
    return with_final_state(h.to(x.dtype), h, seqs, output_final_state)


def eager_gates(x, gate_x_weight, gate_x_bias, gate_a_weight, gate_a_bias, a_param):
    """The public pipelines' preparation (samu.experiment.peers): rglru_scan_inputs' log a and
    u, and y from the scan's states h (y = h)."""
    log_a, _, u = rglru_scan_inputs(x, gate_x_weight, gate_x_bias, gate_a_weight, gate_a_bias,
                                    a_param)
    return log_a, u, lambda h: h


def log_decay(x, gate_x_weight, gate_x_bias, gate_a_weight, gate_a_bias, a_param):
    """[B, D] in the carry dtype: sum_t log a_t = -8 softplus(a_param) sum_t ga_t, ga the
    a-gate of rglru_reference (its operand dtypes), over runs of tokens: log A of a slice that
    no sequence starts in (samu.distributed)."""
    cdt = carry_dtype(x)
    if cdt == torch.float64:
        weight = gate_a_weight.double()
    elif x.dtype in (torch.bfloat16, torch.float16):  # autocast: low-precision operands
        weight = gate_a_weight.to(x.dtype)
    else:
        weight = gate_a_weight.float()
    operand = x.dtype if x.dtype in (torch.bfloat16, torch.float16) else cdt
    bias = gate_a_bias.to(cdt)
    total = torch.zeros(x.shape[0], x.shape[2], dtype=cdt, device=x.device)
    for xc in token_chunks(x):
        total += torch.sigmoid(block_diagonal(xc.to(operand), weight, bias).to(cdt)).sum(1)
    return -GATE_SCALE * total * F.softplus(a_param.to(cdt))

"""Pure-PyTorch reference mixers (SPEC section 2).

Two formulations of the same recurrence, h_t = a_t * h_{t-1} + u_t with h_{-1} = 0:

* ``scan_sequential``: one step per token. In float64 it is the oracle.
* ``scan_chunked``: chunks of C tokens are scanned in parallel (a sequential loop over the
  C positions, vectorised over every chunk), then chunk carries are composed with the identity
  h_t = local_t + (prod_{s <= t in chunk} a_s) * h_in.  About 2*sqrt(L) Python steps.

Both are differentiated by autograd; ``samu.backward`` holds the hand-derived formulas that the
Triton kernels implement and is checked against these.

Numerics follow the seed's policy (SPEC 2, "Numerics"): in float64 everything is float64 (oracle);
otherwise RG-LRU's gate products take operands in x's dtype with FP32 accumulation, rounded to x's
dtype as autocast would, SAMU's controller is FP32, the carry is FP32, and y comes back in x's dtype.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

GATE_SCALE = 8.0  # the constant c in log a = -c * gate * softplus(a_param)
SQRT_GRAD_FLOOR = 1e-6  # d sqrt(v)/dv = 1/sqrt(max(4v, 1e-6)): capped at 1000


class BoundedSqrt(torch.autograd.Function):
    """sqrt with recurrentgemma's bounded derivative."""

    @staticmethod
    def forward(ctx, v):
        ctx.save_for_backward(v)
        return torch.sqrt(v)

    @staticmethod
    def backward(ctx, grad):
        (v,) = ctx.saved_tensors
        return grad / torch.sqrt(torch.clamp(4.0 * v, min=SQRT_GRAD_FLOOR))


def carry_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def transition(log_a: torch.Tensor):
    """a and m = sqrt(1 - a^2) from log a, [B, L, D]; m_0 = 1 (the state resets at t = 0)."""
    a = torch.exp(log_a)
    m = BoundedSqrt.apply(-torch.expm1(2.0 * log_a))
    first = torch.zeros_like(m, dtype=torch.bool)
    first[:, 0] = True
    m = torch.where(first, torch.ones_like(m), m)
    return a, m


def scan_sequential(a: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """h_t = a_t h_{t-1} + u_t, h_{-1} = 0, one token at a time."""
    h = torch.zeros_like(u[:, 0])
    out = []
    for t in range(u.shape[1]):
        h = a[:, t] * h + u[:, t]
        out.append(h)
    return torch.stack(out, dim=1)


def default_chunk(length: int) -> int:
    return max(1, math.isqrt(max(length - 1, 0)) + 1)


def scan_chunked(a: torch.Tensor, u: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """The same scan, chunk-parallel: local scans of every chunk at once, then the carries."""
    batch, length, width = u.shape
    chunk = chunk or default_chunk(length)
    n_chunks = -(-length // chunk)
    pad = n_chunks * chunk - length
    if pad:  # a = 1, u = 0 after the end leaves the real tokens untouched
        a = torch.cat([a, a.new_ones(batch, pad, width)], dim=1)
        u = torch.cat([u, u.new_zeros(batch, pad, width)], dim=1)
    a4 = a.reshape(batch, n_chunks, chunk, width)
    u4 = u.reshape(batch, n_chunks, chunk, width)
    h = torch.zeros_like(u4[:, :, 0])
    local = []
    for c in range(chunk):
        h = a4[:, :, c] * h + u4[:, :, c]
        local.append(h)
    local = torch.stack(local, dim=2)
    decay = torch.cumprod(a4, dim=2)  # prod of a from the chunk's start to t
    carry = torch.zeros_like(u4[:, 0, 0])
    carries = []
    for k in range(n_chunks):
        carries.append(carry)
        carry = decay[:, k, -1] * carry + local[:, k, -1]
    carries = torch.stack(carries, dim=1)
    h = local + decay * carries[:, :, None]
    return h.reshape(batch, n_chunks * chunk, width)[:, :length]


SCANS = {"sequential": scan_sequential, "chunked": scan_chunked}


def _scan(a, u, scan: str):
    try:
        return SCANS[scan](a, u)
    except KeyError:
        raise ValueError(f"unknown scan {scan!r}; choose one of {sorted(SCANS)}") from None


def block_diagonal(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """G[..., h*bw+j] = sum_i x[..., h*bw+i] W[h, i, j] + b[h*bw+j]."""
    heads, bw, _ = weight.shape
    xh = x.reshape(*x.shape[:-1], heads, bw)
    return torch.einsum("blhi,hij->blhj", xh, weight).reshape(x.shape) + bias


def rglru_reference(x, gate_x_weight, gate_x_bias, gate_a_weight, gate_a_bias, a_param,
                    scan: str = "chunked"):
    """RG-LRU: gx, ga = sigmoid(block-diagonal gates); log a = -8 ga softplus(a_param);
    u = m gx x; y = h."""
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
    a, m = transition(log_a)
    h = _scan(a, m * gx * x.to(cdt), scan)
    return h.to(x.dtype)


def samu_controller(x, ctrl_weight, ctrl_bias):
    """z_t = W x_t + b in FP32 (float64 for the oracle); r, g = sigmoid(z)."""
    cdt = carry_dtype(x)
    z = x.to(cdt) @ ctrl_weight.to(cdt).t() + ctrl_bias.to(cdt)
    return torch.sigmoid(z[..., 0]), torch.sigmoid(z[..., 1])


def samu_reference(x, ctrl_weight, ctrl_bias, a_param, log_temp, skip, scan: str = "chunked"):
    """SAMU: per-token scalars r, g; log a = -8 exp(log_temp) r softplus(a_param);
    u = m g x; y = h + skip x."""
    cdt = carry_dtype(x)
    r, g = samu_controller(x, ctrl_weight, ctrl_bias)
    c = GATE_SCALE * torch.exp(log_temp.to(cdt))
    log_a = -c * r[..., None] * F.softplus(a_param.to(cdt))
    a, m = transition(log_a)
    xc = x.to(cdt)
    h = _scan(a, m * g[..., None] * xc, scan)
    return (h + skip.to(cdt) * xc).to(x.dtype)


REFERENCES = {"rglru": rglru_reference, "samu": samu_reference}

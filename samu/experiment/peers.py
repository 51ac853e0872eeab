"""The best public pipeline beside samu, timed by the same protocol (docs/SPEC.md section 8):
eager PyTorch gates (RG-LRU) or controller (SAMU) under autocast, then FLA's ``chunk_hgrn``
(h_t = exp(g_t) h_{t-1} + x_t, fla-core, an optional dependency).

The eager part is the reference's own preparation (``samu.ops.<mixer>.naive``), so the peer
computes the same function; unlike samu's kernels it writes the state-sized log a and u.
"""
from __future__ import annotations

from torch import nn

from ..ops.rglru.naive import rglru_scan_inputs
from ..ops.samu.naive import samu_scan_inputs

PIPELINES = {"rglru": "eager_gates_then_fla_chunk_hgrn",
             "samu": "eager_controller_then_fla_chunk_hgrn"}


def fla_version() -> str | None:
    """fla-core's version, or None where it is not installed."""
    try:
        from importlib.metadata import version
        import fla  # noqa: F401
        return version("fla-core")
    except Exception:
        return None


class FlaPipeline(nn.Module):
    """A samu module's parameters run through the public pipeline; module-like, so the timing
    protocol samples it as it samples samu's modules."""

    def __init__(self, module: nn.Module):
        super().__init__()
        from fla.ops.hgrn import chunk_hgrn
        self._chunk_hgrn = chunk_hgrn
        self.inner = module
        self.mixer = module.mixer
        self.last_backend = PIPELINES[module.mixer]

    def forward(self, x):
        p = self.inner
        if self.mixer == "rglru":
            log_a, _, u = rglru_scan_inputs(x, p.gate_x_weight, p.gate_x_bias, p.gate_a_weight,
                                            p.gate_a_bias, p.a_param)
            h, _ = self._chunk_hgrn(u, log_a)
            return h.to(x.dtype)
        log_a, _, u = samu_scan_inputs(x, p.ctrl_weight, p.ctrl_bias, p.a_param, p.log_temp)
        h, _ = self._chunk_hgrn(u, log_a)
        return (h + p.skip * x.to(h.dtype)).to(x.dtype)


def peer_of(module: nn.Module) -> FlaPipeline | None:
    """The public pipeline on the module's parameters, or None where fla-core is missing or
    cannot run here (it needs CUDA)."""
    if fla_version() is None or not next(module.parameters()).is_cuda:
        return None
    return FlaPipeline(module)

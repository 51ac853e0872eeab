"""The public pipelines timed beside samu by the same protocol (docs/SPEC.md section 8), in a
registry: a mixer's eager PyTorch preparation under autocast (RG-LRU's gates, SAMU's controller),
then one of FLA's scans of h_t = exp(g_t) h_{t-1} + x_t (fla-core, an optional dependency):
``chunk_hgrn`` (chunked, the first and headline peer) or ``fused_recurrent_hgrn`` (sequential).

The eager part is the reference's own preparation, named by the mixer's spec
(``MixerSpec.eager_preparation``), so each peer computes the same function; unlike samu's kernels
it writes the state-sized log a and u.  The FLA peers serve every mixer whose spec names one.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Sequence

from torch import nn

from .. import mixers as mixers_
from . import schema


@dataclass(frozen=True)
class PeerSpec:
    """One public pipeline: ``name`` keys its entry in a result row's ``peers``; ``build(module)``
    returns a module-like peer on the module's parameters whose ``last_backend`` names the
    pipeline, where ``available(module)`` holds.  ``mixers``: the mixers it serves; None: every
    registered mixer whose spec names an eager preparation."""
    name: str
    mixers: tuple[str, ...] | None
    label: str
    available: Callable[[nn.Module], bool]
    build: Callable[[nn.Module], nn.Module]
    materialized_state_sized_transition: bool = True

    def serves(self, mixer: str) -> bool:
        if self.mixers is not None:
            return mixer in self.mixers
        spec = mixers_.MIXERS.get(mixer)
        return spec is not None and spec.eager_preparation is not None


def fla_version() -> str | None:
    """fla-core's version, or None where it is not installed."""
    try:
        from importlib.metadata import version
        import fla  # noqa: F401
        return version("fla-core")
    except Exception:
        return None


def fla_hgrn(op: str):
    """``fla.ops.hgrn.<op>``, or None where fla-core (or that op) is missing."""
    try:
        return getattr(importlib.import_module("fla.ops.hgrn"), op)
    except Exception:
        return None


def pipeline_name(mixer: str, op: str) -> str:
    return f"{mixers_.get(mixer).eager_preparation_name}_then_fla_{op}"


class FlaPipeline(nn.Module):
    """A samu module's parameters run through its mixer's eager preparation and an FLA scan;
    module-like, so the timing protocol samples it as it samples samu's modules.  ``scan``:
    ``fn(u, log_a) -> (h, final)`` in place of ``fla.ops.hgrn.<op>`` (a test's exact scan)."""

    def __init__(self, module: nn.Module, op: str, scan=None):
        super().__init__()
        self._scan = scan or fla_hgrn(op)
        spec = mixers_.get(module.mixer)
        self._prepare = spec.load("eager_preparation")
        self._names = spec.parameter_names  # the module's attributes (SPEC section 2)
        self.inner = module
        self.mixer = module.mixer
        self.last_backend = pipeline_name(module.mixer, op)

    def forward(self, x):
        log_a, u, output = self._prepare(x, *(getattr(self.inner, n) for n in self._names))
        h, _ = self._scan(u, log_a)
        return output(h).to(x.dtype)


def fla_peer(name: str, op: str, label: str) -> PeerSpec:
    """A peer through ``fla.ops.hgrn.<op>`` of every mixer with an eager preparation; it needs
    CUDA (FLA's kernels are Triton's), so CUDA is checked first and a CPU run never imports
    fla."""
    def available(module: nn.Module) -> bool:
        return next(module.parameters()).is_cuda and fla_hgrn(op) is not None
    return PeerSpec(name, None, label, available, lambda module: FlaPipeline(module, op))


PEERS: tuple[PeerSpec, ...] = (
    fla_peer(schema.SINGLE_PEER, "chunk_hgrn", "eager + FLA chunk_hgrn"),
    fla_peer("fla_fused_recurrent_hgrn", "fused_recurrent_hgrn",
             "eager + FLA fused_recurrent_hgrn"),
)


def peers_of(module: nn.Module, registry: Sequence[PeerSpec] = PEERS
             ) -> dict[str, tuple[PeerSpec, nn.Module]]:
    """Every peer of the registry that serves the module's mixer and can run here, by name, with
    its spec, in the registry's order."""
    names = [spec.name for spec in registry]
    if len(set(names)) != len(names):
        raise ValueError(f"peer names repeat in the registry: {names}")
    return {spec.name: (spec, spec.build(module)) for spec in registry
            if spec.serves(module.mixer) and spec.available(module)}


def label(name: str, registry: Sequence[PeerSpec] = PEERS) -> str:
    """A peer's label for tables and figures; its name where the registry does not hold it."""
    return next((spec.label for spec in registry if spec.name == name), name)

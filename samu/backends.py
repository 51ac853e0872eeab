"""Backend registry: which implementations each mixer has and what their names mean.

A backend name is a sequence of words from ``VOCABULARY``; ``explain(name)`` spells it out and
``describe()`` prints every backend of both mixers (``explanations()`` returns them).  Which backend ``auto`` picks is
``samu.dispatch``'s business.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable


VOCABULARY = {
    "reference": "pure-PyTorch scan, differentiated by autograd, which materialises a and log a",
    "sequential": "one Python step per token (the float64 oracle's formulation)",
    "chunked": "chunks of about sqrt(L) tokens scanned in parallel, then the chunk carries",
    "fused": "one Triton kernel per phase does all the elementwise work of that phase",
    "gates": "(retired) RG-LRU's block-diagonal gate products inside the scan kernels with "
             "tl.dot, recomputed in the backward",
    "controller": "SAMU's FP32 controller z = W x + b is reduced over the full width inside the "
                  "chunk-summary kernel, which also writes the per-token scalars r, g",
    "hierarchical": "three phases: per-chunk summaries (decay, local end state), a scan over "
                    "chunk summaries (the carry: one program per channel block, or from 512 "
                    "chunks on two levels, segments of 128 chunks then the segments; a "
                    "configuration's CarryPlan can take a one-launch decoupled look-back "
                    "instead), and the chunk outputs recomputed from the carry; backward "
                    "mirrors it in reverse",
    "chunk": "chunkN: N tokens per chunk, scanned in registers by tl.associative_scan",
    "block": "blockN: a program owns N channels of one head (64 when the name has no blockN)",
    "gemm": "RG-LRU's block-diagonal gate products run as cuBLAS strided batched GEMMs on head "
            "views of x (torch.bmm, no copy), outside the kernels, and so do the backward's dx "
            "and weight-gradient products; the gate pre-activations G are saved for the "
            "backward, which writes their gradient over them",
    "recompute": "G is not saved: the heads run in groups whose G fits half a unit of "
                 "memory, and the backward recomputes each group's G, so that peak memory "
                 "stays under 3 units, for one more GEMM and more launches",
}

# Used on CUDA when there is no calibration file for the GPU (the gemm family was fastest at
# every shape measured on the H200: docs/PERFORMANCE.md), and under the interpreter.
DEFAULTS = {
    "rglru": "gemm_fused_hierarchical_chunk8",
    "samu": "fused_controller_hierarchical_chunk16",
}


# Backends that existed and were removed, with the reason.  A calibration file written before
# their removal still loads: their entries are skipped, never chosen (samu.calibration_file).
RETIRED_FUSED_GATES = ("RG-LRU's fused_gates family (gate products inside the scan kernels with "
                       "tl.dot) was retired: the gemm family was faster at every shape measured "
                       "on the H200 (docs/PERFORMANCE.md)")
RETIRED = {"rglru": {f"fused_gates_hierarchical_{tail}": RETIRED_FUSED_GATES
                     for tail in ("chunk16", "chunk32", "chunk64", "chunk16_block32",
                                  "chunk32_block32")},
           "samu": {}}


@dataclass(frozen=True)
class Backend:
    name: str
    mixer: str
    kind: str  # "reference" or "triton"
    run: Callable = field(repr=False, compare=False)
    materialized_state_sized_transition: bool = False
    config: object = None  # a Triton backend's frozen configuration (chunk, launches)

    @property
    def description(self) -> str:
        return explain(self.name)

REGISTRY: dict[str, dict[str, Backend]] = {"rglru": {}, "samu": {}}


def register(backend: Backend) -> Backend:
    REGISTRY[backend.mixer][backend.name] = backend
    return backend


def explain(name: str) -> str:
    """Every word of a backend name, spelled out."""
    parts = []
    for word in name.split("_"):
        m = re.fullmatch(r"([a-z]+?)(\d+)", word)
        stem, number = (m.group(1), m.group(2)) if m else (word, None)
        if stem not in VOCABULARY:
            raise ValueError(f"backend name {name!r} has the unknown word {word!r}")
        text = VOCABULARY[stem]
        parts.append(f"{word}: {text}" + (f" (N = {number})" if number else ""))
    return " | ".join(parts)


def available(mixer: str) -> list[str]:
    _ensure_registered()
    if mixer not in REGISTRY:
        raise ValueError(f"unknown mixer {mixer!r}; choose 'rglru' or 'samu'")
    return list(REGISTRY[mixer])


def explanations() -> dict[str, dict[str, str]]:
    """{mixer: {backend: explanation}} for every registered backend."""
    _ensure_registered()
    return {m: {n: b.description for n, b in bs.items()} for m, bs in REGISTRY.items()}


def describe(file=None) -> None:
    """Print every backend of both mixers, and what each word of its name means."""
    _ensure_registered()
    lines = []
    for mixer, named in REGISTRY.items():
        lines.append(f"{mixer}: {len(named)} backends (backend='auto' picks one; "
                     "samu.dispatch says how)")
        width = max(map(len, named))
        for name, backend in named.items():
            lines.append(f"  {name:<{width}}  {backend.kind}")
    numbers: dict[str, list[int]] = {}
    for word in sorted({w for named in REGISTRY.values() for n in named for w in n.split("_")}):
        match = re.fullmatch(r"([a-z]+?)(\d+)", word)
        stem, number = (match.group(1), int(match.group(2))) if match else (word, None)
        numbers.setdefault(stem, [])
        if number is not None:
            numbers[stem].append(number)
    lines.append("words:")
    for stem, ns in numbers.items():
        label = f"{stem}N, N in {sorted(ns)}" if ns else stem
        lines.append(f"  {label}: {VOCABULARY[stem]}")
    print("\n".join(lines), file=file)


def check_name(mixer: str, name) -> None:
    """A backend is "auto", a registered name, or a Triton configuration (see from_config)."""
    if name == "auto":
        return
    if not isinstance(name, str):
        from_config(mixer, name)
        return
    _ensure_registered()
    if name in RETIRED.get(mixer, ()):
        raise ValueError(f"{mixer}: backend {name!r} no longer exists: {RETIRED[mixer][name]}; "
                         f"choose 'auto' or one of {available(mixer)}")
    if name not in REGISTRY.get(mixer, ()):
        raise ValueError(f"{mixer}: unknown backend {name!r}; choose 'auto' or one of "
                         f"{available(mixer)}")

@lru_cache(maxsize=None)
def from_config(mixer: str, config) -> Backend:
    """The backend of a Triton configuration passed in instead of a name (a sweep's, say:
    ``dataclasses.replace(backends.REGISTRY["samu"][name].config, output=Launch(4, 2))``).  It
    is not registered; its name is the configuration's."""
    _ensure_registered()
    from .ops.rglru import gemm as rglru_gemm
    from .ops.samu import chunk as samu_chunk
    modules = {"rglru": (rglru_gemm,), "samu": (samu_chunk,)}.get(mixer)
    if modules is None:
        raise ValueError(f"unknown mixer {mixer!r}; choose 'rglru' or 'samu'")
    module = next((m for m in modules if isinstance(config, m.CONFIGS[0].__class__)), None)
    if module is None:
        expected = " or ".join(m.CONFIGS[0].__class__.__name__ for m in modules)
        raise TypeError(f"{mixer}: backend must be 'auto', a name from "
                        f"samu.backends.available({mixer!r}) or a {expected}, got "
                        f"{config!r}")
    return Backend(config.name, mixer, "triton", module.run_with(config), config=config)


_registered = False


def _reference_run(reference, scan: str):
    """A reference as a backend: run(x, *parameters, **state keywords) -> (y, final or None)."""
    def run(x, *params, output_final_state=False, **state):
        out = reference(x, *params, scan=scan, output_final_state=output_final_state, **state)
        return out if output_final_state else (out, None)
    return run


def _ensure_registered() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    from .ops.recurrence import SCANS
    from .ops.rglru.naive import rglru_reference
    from .ops.samu.naive import samu_reference
    for mixer, fn in (("rglru", rglru_reference), ("samu", samu_reference)):
        for scan in SCANS:
            register(Backend(f"reference_{scan}", mixer, "reference", _reference_run(fn, scan),
                             materialized_state_sized_transition=True))
    try:
        from .ops.rglru import gemm as rglru_gemm
        from .ops.samu import chunk as samu_chunk
    except ImportError:  # no triton: the reference backends still work
        return
    for module in (samu_chunk, rglru_gemm):
        for config in module.CONFIGS:
            register(Backend(config.name, module.MIXER, "triton", module.run_with(config),
                             config=config))

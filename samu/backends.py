"""Backend registry: which implementations each mixer has, what their names mean, and `auto`.

A backend name is a sequence of words from ``VOCABULARY``; ``explain(name)`` spells it out.
``backend="auto"`` picks:

* with CUDA: the calibrated choice for (GPU name, mixer, shape) in ``data/calibration/<gpu>.json``;
  where that file has no entry for the shape, ``DEFAULTS[mixer]`` (documented, not silent: the
  module's ``last_backend`` and ``return_backend=True`` say what ran);
* without CUDA: the chunked reference, or the default Triton backend when ``TRITON_INTERPRET=1``
  was set before samu was imported (Triton's interpreter runs the kernels on CPU tensors).
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

import torch

from . import _runtime, calibration_file, paths
from .calibration_file import CalibrationFileError  # noqa: F401  part of this module's interface

VOCABULARY = {
    "reference": "pure-PyTorch scan, differentiated by autograd, which materialises a and log a",
    "sequential": "one Python step per token (the float64 oracle's formulation)",
    "chunked": "chunks of about sqrt(L) tokens scanned in parallel, then the chunk carries",
    "fused": "one Triton kernel per phase does all the elementwise work of that phase",
    "gates": "RG-LRU's block-diagonal gate products run inside the scan kernels with tl.dot "
             "(BF16 operands, FP32 accumulation) and are recomputed in the backward",
    "controller": "SAMU's FP32 controller z = W x + b is reduced over the full width inside the "
                  "chunk-summary kernel, which also writes the per-token scalars r, g",
    "hierarchical": "three phases: per-chunk summaries (decay, local end state), a scan over "
                    "chunk summaries (the carry: one program per channel block, or from 512 "
                    "chunks on two levels, segments of 128 chunks then the segments), and the "
                    "chunk outputs recomputed from the carry; backward mirrors it in reverse",
    "chunk": "chunkN: N tokens per chunk, scanned in registers by tl.associative_scan",
    "block": "blockN: a program owns N channels of one head (64 when the name has no blockN)",
}

# Used on CUDA when the calibration file has no entry for the shape.
DEFAULTS = {
    "rglru": "fused_gates_hierarchical_chunk32",
    "samu": "fused_controller_hierarchical_chunk16",
}


@dataclass(frozen=True)
class Backend:
    name: str
    mixer: str
    kind: str  # "reference" or "triton"
    run: Callable = field(repr=False, compare=False)
    materialized_state_sized_transition: bool = False

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


def describe() -> dict[str, dict[str, str]]:
    """{mixer: {backend: explanation}} for every registered backend."""
    _ensure_registered()
    return {m: {n: b.description for n, b in bs.items()} for m, bs in REGISTRY.items()}


def check_name(mixer: str, name: str) -> None:
    if name == "auto":
        return
    _ensure_registered()
    if name not in REGISTRY.get(mixer, ()):
        raise ValueError(f"{mixer}: unknown backend {name!r}; choose 'auto' or one of "
                         f"{available(mixer)}")


def interpreting() -> bool:
    """Whether Triton's interpreter runs the kernels: TRITON_INTERPRET as it was when samu was
    imported, the value the kernels were built with (samu._runtime)."""
    return _runtime.INTERPRETING


def gpu_slug(name: str | None = None) -> str:
    """'NVIDIA H200' -> 'nvidia-h200': the file name of a GPU's calibration and results."""
    if name is None:
        if not torch.cuda.is_available():
            return "cpu"
        return _device_slug(torch.cuda.current_device())
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


@lru_cache(maxsize=None)
def _device_slug(index: int) -> str:
    return gpu_slug(torch.cuda.get_device_name(index))


# Re-stat the calibration file at most this often: a stat costs ~10 us of host time per call.
RECHECK_SECONDS = 1.0
_CHOICES: dict[str, tuple[float, tuple, dict]] = {}  # path -> (checked at, stat stamp, choices)


def check_calibration(doc: dict, path) -> dict:
    """{(mixer, (B, L, D)): chosen backend or None} of a calibration document, every entry
    checked against the registered backends (CalibrationFileError names the file and entry)."""
    _ensure_registered()
    return calibration_file.choices(doc, path, REGISTRY)


def _load_choices(path: str) -> dict:
    return check_calibration(calibration_file.read(path), path)


def forget_calibration() -> None:
    """Drop the cached calibration choices (writers call this after writing the file)."""
    _CHOICES.clear()


def calibrated_choice(mixer: str, shape: tuple[int, int, int], slug: str) -> str | None:
    """The calibrated backend for (mixer, shape) on this GPU; the file is re-read when its stat
    changes, checked at most every RECHECK_SECONDS."""
    path = str(paths.calibration_file(slug))
    now = time.monotonic()
    cached = _CHOICES.get(path)
    if cached is None or now - cached[0] > RECHECK_SECONDS:
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            _CHOICES.pop(path, None)
            return None
        stamp = (stat.st_mtime_ns, stat.st_size)
        choices = cached[2] if cached is not None and cached[1] == stamp else _load_choices(path)
        cached = _CHOICES[path] = (now, stamp, choices)
    return cached[2].get((mixer, tuple(shape)))


def shape_key(shape) -> str:
    return "x".join(map(str, map(int, shape)))


def resolve(mixer: str, x: torch.Tensor, backend: str = "auto") -> Backend:
    _ensure_registered()
    check_name(mixer, backend)
    if backend != "auto":
        chosen = REGISTRY[mixer][backend]
        if chosen.kind == "triton":
            _check_triton_input(mixer, x, chosen.name)
        return chosen
    if x.dtype == torch.float64:
        return REGISTRY[mixer]["reference_chunked"]
    if x.is_cuda:
        name = calibrated_choice(mixer, tuple(x.shape), gpu_slug()) or DEFAULTS[mixer]
        return REGISTRY[mixer][name]
    _runtime.check_interpret_unchanged()  # off the CUDA path: costs CUDA calls nothing
    if interpreting():
        return REGISTRY[mixer][DEFAULTS[mixer]]
    return REGISTRY[mixer]["reference_chunked"]


def _check_triton_input(mixer: str, x: torch.Tensor, name: str) -> None:
    if x.dtype == torch.float64:
        raise TypeError(f"{mixer}: backend {name} takes bfloat16, float16 or float32 x, not "
                        "float64 (use backend='reference_chunked' for the oracle)")
    if x.is_cuda:
        return
    _runtime.check_interpret_unchanged()
    if not interpreting():
        raise RuntimeError(f"{mixer}: backend {name} is a Triton kernel and needs a CUDA tensor, "
                           "or TRITON_INTERPRET=1 set before samu is imported")


_registered = False


def _ensure_registered() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    from . import reference
    for mixer, fn in reference.REFERENCES.items():
        for scan in reference.SCANS:
            register(Backend(f"reference_{scan}", mixer, "reference",
                             (lambda f, s: lambda x, *p: f(x, *p, scan=s))(fn, scan),
                             materialized_state_sized_transition=True))
    try:
        from . import kernels_rglru, kernels_samu
    except ImportError:  # no triton: the reference backends still work
        return
    for module in (kernels_rglru, kernels_samu):
        for name, run in module.BACKENDS.items():
            register(Backend(name, module.MIXER, "triton", run))

"""Backend registry: which implementations each mixer has and what their names mean.

A backend name is a sequence of words from ``VOCABULARY``; ``explain(name)`` spells it out and
``describe()`` prints every backend of every mixer (``explanations()`` returns them).  Which backend ``auto`` picks is
``samu.dispatch``'s business.  ``REGISTRY`` fills itself on its first read; where the Triton
backends could not be loaded (no triton, or no numpy for Triton's interpreter),
``triton_unavailable()`` says why, and so does every error that asks for one.
"""
from __future__ import annotations

import inspect
import re
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from contextlib import contextmanager
from functools import lru_cache
from typing import Callable

from . import _runtime, mixers


VOCABULARY = {
    "reference": "pure-PyTorch scan, differentiated by autograd, which materialises a and log a",
    "sequential": "one Python step per token (the float64 oracle's formulation)",
    "chunked": "chunks of about sqrt(L) tokens scanned in parallel, then the chunk carries",
    "fused": "one Triton kernel per phase does all the elementwise work of that phase",
    "controller": "SAMU's FP32 controller z = W x + b is reduced over the full width inside the "
                  "chunk-summary kernel, which also writes the per-token scalars r, g",
    "hierarchical": "three phases: per-chunk summaries (decay, local end state), a scan over "
                    "chunk summaries (the carry: one program per channel block, or from 512 "
                    "chunks on two levels, segments of 128 chunks then the segments; a "
                    "configuration's CarryPlan can take a one-launch decoupled look-back "
                    "instead), and the chunk outputs recomputed from the carry; backward "
                    "mirrors it in reverse",
    "singlepass": "one kernel per direction: a program owns a (chunk of tokens) x (channel "
                  "block) tile, reads it once, publishes its aggregate, finds the state "
                  "entering it by a decoupled look-back over the tiles before it (tickets from "
                  "an atomic counter) and writes its output from registers; SAMU's tiles of a "
                  "chunk exchange per-token partial sums for the controller and dz",
    "chunk": "N tokens per chunk, scanned in registers by tl.associative_scan",
    "gemm": "RG-LRU's block-diagonal gate products run as cuBLAS strided batched GEMMs on head "
            "views of x (torch.bmm, no copy), outside the kernels, and so do the backward's dx "
            "and weight-gradient products; the gate pre-activations G are saved for the "
            "backward, which writes their gradient over them",
    "recompute": "G is not saved: the heads run in groups whose G fits half a unit of "
                 "memory, and the backward recomputes each group's G, so that peak memory "
                 "stays under 3 units, for one more GEMM and more launches",
}

# Used on CUDA when there is no calibration file for the GPU, and under the interpreter: each
# mixer's spec says which (samu.mixers).
DEFAULTS = mixers.View(lambda spec: spec.default_backend)


# What runs a backend: a pure-PyTorch reference scan, or Triton kernels.
KINDS = ("reference", "triton")


@dataclass(frozen=True)
class Backend:
    name: str
    mixer: str
    kind: str  # one of KINDS
    run: Callable = field(repr=False, compare=False)
    materialized_state_sized_transition: bool = False
    config: object = None  # a Triton backend's frozen configuration (chunk, launches)
    takes_resets: bool = False  # its run takes a reset mask (the keyword resets)

    @property
    def description(self) -> str:
        return explain(self.name)

    @property
    def settings(self) -> str | None:
        """A Triton backend's launch settings, as a digest (samu.ops.common.family); None for a
        reference.  Calibration records it beside the name."""
        if self.config is None:
            return None
        from .ops.common.family import settings_digest
        return settings_digest(self.config)


class _Registry(Mapping):
    """{mixer: {name: Backend}}, filled on its first read: registering imports the kernels,
    which ``import samu`` does not, so that samu imports without triton and quickly."""

    def __init__(self, names):
        self._mixers = {mixer: {} for mixer in names}

    def __getitem__(self, mixer):
        if not _registered:
            _ensure_registered()
        return self._mixers[mixer]

    def __iter__(self):
        _ensure_registered()
        return iter(self._mixers)

    def __len__(self):
        _ensure_registered()
        return len(self._mixers)

    def __contains__(self, mixer):
        _ensure_registered()
        return mixer in self._mixers

    def __repr__(self):
        _ensure_registered()
        return f"REGISTRY({ {m: list(named) for m, named in self._mixers.items()} })"


REGISTRY: Mapping[str, dict[str, Backend]] = _Registry(mixers.MIXERS)
# The same tables without the filling read, for the per-call paths that register first.
REGISTERED: dict[str, dict[str, Backend]] = REGISTRY._mixers


def register(backend: Backend) -> Backend:
    REGISTRY._mixers[backend.mixer][backend.name] = backend  # no read: registering fills it
    return backend


def triton_unavailable() -> str | None:
    """Why the Triton backends could not be loaded (None: they are registered)."""
    _ensure_registered()
    return _triton_unavailable


def _unavailable_line() -> str:
    return (f"the Triton backends could not be loaded: {_triton_unavailable}; the reference "
            "backends still work")


def explain(name: str) -> str:
    """Every word of a backend name, spelled out."""
    if not isinstance(name, str):
        raise TypeError(f"a backend name is a str, got {type(name).__name__}")
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
        mixers.get(mixer)  # names the mixers there are
    return list(REGISTRY[mixer])


def matching(mixer: str, words=(), kind: str = "triton") -> list[str]:
    """The mixer's available backends of ``kind`` whose names hold one of ``words``, as a word
    between underscores or as the whole name (every one of that kind without words); a str is
    one word."""
    if kind not in KINDS:
        raise ValueError(f"unknown backend kind {kind!r}; choose one of {list(KINDS)}")
    if isinstance(words, str):
        words = (words,)
    return [name for name in available(mixer) if REGISTRY[mixer][name].kind == kind
            and (not words or any(w == name or w in name.split("_") for w in words))]


def explanations() -> dict[str, dict[str, str]]:
    """{mixer: {backend: explanation}} for every registered backend."""
    _ensure_registered()
    if _triton_unavailable is not None:
        warnings.warn(f"samu: {_unavailable_line()}", RuntimeWarning, stacklevel=2)
    return {m: {n: b.description for n, b in bs.items()} for m, bs in REGISTRY.items()}


def describe(file=None) -> None:
    """Print every backend of every mixer (with its launches per forward+backward where its
    family counts them), and what each word of its name means."""
    _ensure_registered()
    lines = [] if _triton_unavailable is None else [
        f"Triton backends unavailable: {_triton_unavailable}; only the reference backends run"]
    for mixer, named in REGISTRY.items():
        lines.append(f"{mixer}: {len(named)} backends (backend='auto' picks one; "
                     "samu.dispatch says how)")
        width = max(map(len, named))
        for name, backend in named.items():
            lines.append(f"  {name:<{width}}  {backend.kind}{_launches(mixer, backend)}")
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


def _launches(mixer: str, backend: Backend) -> str:
    """", N launches per forward+backward" where the backend's family counts them
    (launch_count(config)), else nothing."""
    family = family_of(mixer, backend.config) if backend.config is not None else None
    count = getattr(family, "launch_count", None)
    return "" if count is None else f", {count(backend.config)} launches per forward+backward"


def check_name(mixer: str, name) -> None:
    """A backend is "auto", a registered name, or a Triton configuration (see from_config)."""
    if not isinstance(name, str):
        _check_configuration(mixer, name)
        return
    if name == "auto":
        return
    _ensure_registered()
    if name in REGISTERED.get(mixer, ()):
        return
    if _triton_unavailable is not None and _names_a_triton_backend(name):
        raise RuntimeError(f"{mixer}: backend {name!r} is a Triton backend, and "
                           f"{_unavailable_line()}: {available(mixer)}")
    unloaded = "" if _triton_unavailable is None else f" ({_unavailable_line()})"
    raise ValueError(f"{mixer}: unknown backend {name!r}; choose 'auto' or one of "
                     f"{available(mixer)}{unloaded}")


def _names_a_triton_backend(name: str) -> bool:
    """Whether a name that is not registered reads as a Triton backend's (its words are all in
    VOCABULARY): when the Triton backends could not be loaded, that is why it is missing."""
    try:
        explain(name)
    except ValueError:
        return False
    return not name.startswith("reference")


def _short_repr(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _check_configuration(mixer: str, config) -> None:
    """TypeError naming ``backend`` and what it accepts, unless ``config`` is a Triton
    configuration of the mixer (checked before any cache sees it: a dict or list is
    unhashable)."""
    mixers.get(mixer)  # an unknown mixer is refused, naming the mixers there are
    _ensure_registered()
    classes = tuple(m.CONFIGS[0].__class__ for m in _CONFIGURATION_MODULES.get(mixer, ()))
    if classes and isinstance(config, classes):
        return
    accepted = f"'auto' or a name from samu.backends.available({mixer!r})"
    if classes:
        accepted = (f"'auto', a name from samu.backends.available({mixer!r}) or a "
                    f"{' or '.join(c.__name__ for c in classes)} configuration object "
                    f"(samu.backends.REGISTRY[{mixer!r}][name].config, changed with "
                    "dataclasses.replace)")
    unloaded = ("" if _triton_unavailable is None
                else f"; configuration objects need the Triton backends, and "
                     f"{_unavailable_line()}")
    raise TypeError(f"{mixer}: backend must be {accepted}, got {type(config).__name__} "
                    f"{_short_repr(config)}{unloaded}")


def kernel_families(mixer: str) -> tuple:
    """The Triton family modules of ``mixer`` that loaded (none without triton)."""
    _ensure_registered()
    return _CONFIGURATION_MODULES.get(mixer, ())


def family_of(mixer: str, config):
    """The Triton family module of ``mixer`` whose configurations ``config`` is one of, or None."""
    _ensure_registered()
    return next((m for m in _CONFIGURATION_MODULES.get(mixer, ())
                 if isinstance(config, m.CONFIGS[0].__class__)), None)


def from_config(mixer: str, config) -> Backend:
    """The backend of a Triton configuration passed in instead of a name (a sweep's, say:
    ``dataclasses.replace(backends.REGISTRY["samu"][name].config, output=Launch(4, 2))``).  It
    is not registered; its name is the configuration's."""
    _check_configuration(mixer, config)
    return _backend_of_configuration(mixer, config)


@lru_cache(maxsize=None)
def _backend_of_configuration(mixer: str, config) -> Backend:
    from .ops.common.function import run_with
    run = run_with(family_of(mixer, config), config)
    return Backend(config.name, mixer, "triton", run, config=config,
                   takes_resets=takes_keyword(run, "resets"))


def takes_keyword(fn, keyword: str) -> bool:
    """Whether fn has a parameter of that name (a reset mask: every built-in backend; a kernel
    family or a mixer's reference that has none refuses the mask by name instead of failing
    inside)."""
    try:
        return keyword in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


_registered = False
_registering = False  # while the lock's holder fills the registry (its imports may ask again)
_registration_lock = threading.RLock()
# Why the Triton backends could not be loaded, once registration tried (None: they loaded).
_triton_unavailable: str | None = None
# mixer -> the modules whose configuration class a backend passed in may be (filled with them).
_CONFIGURATION_MODULES: dict[str, tuple] = {}


def _reference_run(reference, scan: str):
    """A reference as a backend: run(x, *parameters, **state keywords) -> (y, final or None)."""
    def run(x, *params, output_final_state=False, **state):
        out = reference(x, *params, scan=scan, output_final_state=output_final_state, **state)
        return out if output_final_state else (out, None)
    return run


def _reason_triton_failed(exc: ImportError) -> str:
    """What a user can do about an ImportError of the Triton backends."""
    missing = (getattr(exc, "name", None) or "").split(".")[0]
    if missing == "triton":
        return (f"triton is not installed ({exc}); it is published for Linux on x86_64 and "
                "aarch64: pip install triton")
    if missing == "numpy" and _runtime.INTERPRETING:
        return (f"Triton's interpreter (TRITON_INTERPRET=1) needs numpy: pip install numpy, or "
                f"pip install '.[interpret]' in a clone of samu ({exc})")
    return f"{type(exc).__name__}: {exc}"


def _ensure_registered() -> None:
    global _registered, _registering, _triton_unavailable
    if _registered:
        return
    with _registration_lock:
        if _registered or _registering:
            return
        _registering = True
        try:
            _triton_unavailable = _register_all()
            _registered = True
        finally:
            _registering = False


def _register_all() -> str | None:
    """Register every mixer's backends; the reason the Triton backends could not be, or None."""
    unavailable = None
    for spec in mixers.MIXERS.values():
        unavailable = _register_mixer(spec) or unavailable
    return unavailable


def _register_mixer(spec) -> str | None:
    """A mixer's reference backends (one per scan) and its Triton families' configurations;
    why the families could not be imported, or None."""
    from .ops.recurrence import SCANS
    REGISTRY._mixers.setdefault(spec.name, {})
    reference = spec.load("reference")
    for scan in SCANS:
        register(Backend(f"reference_{scan}", spec.name, "reference",
                         _reference_run(reference, scan),
                         materialized_state_sized_transition=True,
                         takes_resets=takes_keyword(reference, "resets")))
    try:
        families = tuple(mixers.load(path) for path in spec.kernel_families)
    except ImportError as exc:  # the reference backends still work; say why the rest do not
        return _reason_triton_failed(exc)
    from .ops.common.family import check_family
    from .ops.common.function import run_with
    for module in families:
        check_family(module)
    _CONFIGURATION_MODULES[spec.name] = families
    for module in families:
        for config in module.CONFIGS:
            run = run_with(module, config)
            register(Backend(config.name, spec.name, "triton", run, config=config,
                             takes_resets=takes_keyword(run, "resets")))
    return None


@contextmanager
def registered_mixer(spec):
    """A mixer (samu.mixers.MixerSpec) in the registry for the ``with`` block, its backends
    registered beside the others; both leave when the block does.  For trying a new mixer
    before its line is in samu.mixers.MIXERS, and for tests."""
    if spec.name in mixers.MIXERS:
        raise ValueError(f"mixer {spec.name!r} is registered already")
    _ensure_registered()
    mixers.MIXERS[spec.name] = spec
    try:
        reason = _register_mixer(spec)
        if reason is not None:
            raise RuntimeError(f"{spec.name}: its kernel families could not be loaded: {reason}")
        yield spec
    finally:
        mixers.MIXERS.pop(spec.name, None)
        REGISTRY._mixers.pop(spec.name, None)
        _CONFIGURATION_MODULES.pop(spec.name, None)
        _backend_of_configuration.cache_clear()

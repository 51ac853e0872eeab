"""The mixers samu knows, each defined once: a ``MixerSpec`` in ``samu/mixers/<name>.py`` and a
line in ``MIXERS``.  Every layer (backends, functional form, modules, legality, protocol,
report, calibration) loops over this table instead of naming mixers.

A spec names its implementations by dotted path ("package.module:attribute"), loaded on first
use, so that importing samu imports neither the kernels nor triton, and this package sits
below everything that implements a mixer.  ``samu.backends.registered_mixer(spec)`` adds a
mixer for the length of a ``with`` block (a new mixer tried out, a test's toy one)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Callable

from .spec import MixerSpec, check_shape, load, shape_of


def get(mixer) -> MixerSpec:
    """The spec of ``mixer``, or ValueError listing the mixers there are."""
    spec = MIXERS.get(mixer) if isinstance(mixer, str) else None
    if spec is None:
        raise ValueError(f"unknown mixer {mixer!r}; choose one of {names()}")
    return spec


def names() -> list[str]:
    return list(MIXERS)


def check_count(mixer: str, params) -> None:
    """TypeError when a functional call passes another number of parameters than the spec's."""
    want = get(mixer).parameter_names
    if len(params) != len(want):
        raise TypeError(f"{mixer}: takes {len(want)} parameters ({', '.join(want)}), got "
                        f"{len(params)}")


class View(Mapping):
    """{mixer: what ``pick(spec)`` gives} over the current MIXERS, read when looked up: the
    tables other layers keep by mixer (FUNCTIONS, MODULES, DEFAULTS) follow the registry."""

    def __init__(self, pick: Callable[[MixerSpec], object]):
        self._pick = pick
        self._picked: dict[int, tuple] = {}  # id(spec) -> (spec, value): lookups are per call

    def __getitem__(self, mixer):
        spec = MIXERS.get(mixer)
        if spec is None:
            raise KeyError(mixer)
        picked = self._picked.get(id(spec))
        if picked is None or picked[0] is not spec:
            picked = self._picked[id(spec)] = (spec, self._pick(spec))
        return picked[1]

    def __iter__(self):
        return iter(list(MIXERS))

    def __len__(self):
        return len(MIXERS)

    def __repr__(self):
        return f"{ {m: self[m] for m in self} }"


# Every mixer's pure-PyTorch reference and hand-derived backward formulas, by name.
REFERENCES = View(lambda spec: spec.load("reference"))
BACKWARDS = View(lambda spec: spec.load("backward"))
# Every mixer's name in tables and figures, and its colour there.
LABELS = View(lambda spec: spec.label)
# The colours of mixers whose spec gives none, in the order they are registered.
SPARE_COLOURS = ("tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan")


def _colour(spec: MixerSpec) -> str:
    if spec.colour is not None:
        return spec.colour
    spare = [name for name, s in MIXERS.items() if s.colour is None]
    return SPARE_COLOURS[spare.index(spec.name) % len(SPARE_COLOURS)]


COLOURS = View(_colour)


def baselines() -> dict[str, str]:
    """{mixer: the mixer its speed-up is taken over} for every registered mixer with a baseline
    that is registered too, in the table's order."""
    return {name: spec.baseline for name, spec in MIXERS.items()
            if spec.baseline is not None and spec.baseline in MIXERS}


def _builtin() -> dict[str, MixerSpec]:
    from .rglru import SPEC as RGLRU
    from .samu import SPEC as SAMU
    return {spec.name: spec for spec in (RGLRU, SAMU)}


# The table.  Its order is the order of tables, figures and the protocol's rotation.
MIXERS: dict[str, MixerSpec] = _builtin()


__all__ = ["MixerSpec", "MIXERS", "REFERENCES", "BACKWARDS", "LABELS", "COLOURS", "View", "get",
           "names", "load", "baselines", "check_count", "check_shape"]

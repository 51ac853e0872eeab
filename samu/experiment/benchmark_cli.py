"""The command line the benchmarks (benchmarks/*.py) and the calibration command share: shapes and
mixers checked as they are read, each list of mixers taken from the registry, and a clear refusal
where the kernels cannot run (off a GPU, or on a CPU without Triton's interpreter)."""
from __future__ import annotations

import argparse
import dataclasses
import sys

import torch

from .. import backends, dispatch
from ..shapes import Shape
from .pipeline import check_heads_divide, parse_shapes  # noqa: F401 (the CLIs' check)


def shape(text: str) -> tuple[int, int, int]:
    """An argparse type: BATCHxLENGTHxWIDTH as (batch, length, width)."""
    try:
        return tuple(Shape.parse(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def shapes_given(parser: argparse.ArgumentParser, texts: list[str]) -> list[Shape]:
    """The BxLxD shapes in ``texts`` (pipeline.parse_shapes: a malformed one exits naming it);
    none at all is a parser error."""
    shapes = parse_shapes(texts)
    if not shapes:
        parser.error(f"no shape in {texts}: give BxLxD shapes such as 4x2048x2048")
    return shapes


def _int_at_least(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1 (a count, a width, a number of ranks)."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An argparse type: an integer of at least 0 (a warm-up count)."""
    return _int_at_least(text, 0)


def positive_ints(text: str) -> list[int]:
    """An argparse type: comma-separated integers of at least 1 (widths, head counts)."""
    return [positive_int(word) for word in text.split(",")]


def device(text: str) -> torch.device:
    """An argparse type: cpu, cuda or cuda:<index>."""
    try:
        value = torch.device(text)
    except RuntimeError:
        value = None
    if value is None or value.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"must be cpu, cuda or cuda:<index>, got {text!r}")
    return value


def mixer(text: str) -> str:
    """An argparse type: a registered mixer's name."""
    if text not in backends.REGISTRY:
        raise argparse.ArgumentTypeError(
            f"unknown mixer {text!r}; choose from {', '.join(backends.REGISTRY)}")
    return text


class Distinct(argparse.Action):
    """Store the values given, each once, in their first order: a name given twice runs once."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, list(dict.fromkeys(values)))


def words(text: str) -> list[str]:
    """An argparse type: comma-separated words, empty ones dropped."""
    return [w for w in text.split(",") if w]


def parser(doc: str) -> argparse.ArgumentParser:
    """A parser whose --help prints the benchmark's docstring as written."""
    return argparse.ArgumentParser(description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def add_mixers(parser: argparse.ArgumentParser) -> None:
    """--mixers NAME ...: the mixers to run, each once (default: every registered one)."""
    parser.add_argument("--mixers", nargs="+", type=mixer, action=Distinct,
                        default=list(backends.REGISTRY),
                        help=f"mixers to run (default: {' '.join(backends.REGISTRY)})")


def backends_named(parser: argparse.ArgumentParser, asked: list[str],
                   offered: dict[str, list[str]], option: str = "--backends",
                   every_mixer: bool = True) -> dict[str, list[str]]:
    """{mixer: the names in ``asked`` that ``offered[mixer]`` holds, in its order}; a name that
    no mixer offers, or (``every_mixer``) a mixer left with none, is a parser error before
    anything runs; without ``every_mixer`` such a mixer is left out."""
    chosen = {m: [n for n in names if n in asked] for m, names in offered.items()}
    unknown = sorted(set(asked) - {n for names in chosen.values() for n in names})
    if unknown:
        parser.error(f"unknown backends {unknown} for {list(chosen)}; available: "
                     + "; ".join(f"{m}: {', '.join(names)}" for m, names in offered.items()))
    if not every_mixer:
        return {m: names for m, names in chosen.items() if names}
    # A mixer left with none would be run, or recorded, with no backend at all.
    bare = [m for m, names in chosen.items() if not names]
    if bare:
        parser.error(f"{option} {' '.join(asked)} names no backend of {', '.join(bare)}: give "
                     "--mixers only mixers that have them")
    return chosen


def launch_type(mixer: str) -> type:
    """The mixer's Launch class, read from its registered Triton configurations."""
    for backend in backends.REGISTRY[mixer].values():
        if backend.config is None:  # a reference
            continue
        for field in dataclasses.fields(backend.config):
            value = getattr(backend.config, field.name)
            if type(value).__name__ == "Launch":
                return type(value)
    raise ValueError(f"{mixer} has no registered configuration with a Launch")


def config_variants(mixer: str, settings) -> list[tuple[str, dict]]:
    """(label, {field: value}) of each --set text: field=value pairs of a backend's frozen
    configuration, several separated by ";", each value a Python expression over the mixer's
    Launch, CarryPlan and Lookback (e.g. "chunk=8; lookback=Lookback(window=4)")."""
    from ..ops.common.carry import CarryPlan
    from ..ops.common.single_pass import Lookback
    names = {"Launch": launch_type(mixer), "CarryPlan": CarryPlan, "Lookback": Lookback}
    out = []
    for text in settings:
        change = {}
        for part in text.split(";"):
            if "=" not in part:
                raise SystemExit(f"--set {text!r}: {part.strip()!r} is not FIELD=VALUE")
            field, value = part.split("=", 1)
            if field.strip() in change:
                raise SystemExit(f"--set {text!r}: {field.strip()} given twice")
            try:
                change[field.strip()] = eval(value, names)
            except Exception as error:  # the message names the text, whatever went wrong
                raise SystemExit(f"--set {text!r}: {value.strip()!r} is not a value here "
                                 f"({type(error).__name__}: {error})") from None
        out.append((text, change))
    return out


def require_cuda(program: str, what: str = "times GPU kernels") -> None:
    """Exit, naming the program and what it does, where torch sees no GPU."""
    if not torch.cuda.is_available():
        sys.exit(f"{program} {what}: it needs CUDA")


def kernel_device(program: str) -> torch.device:
    """The device the Triton kernels run on: the GPU, or a CPU under Triton's interpreter; exit,
    naming the program and the fix, on a CPU without it (every kernel would fail there)."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if not dispatch.interpreting():
        sys.exit(f"{program}: no GPU here, and the kernels run off a GPU only under Triton's "
                 "interpreter: set TRITON_INTERPRET=1 before starting it, and give small "
                 "shapes, e.g. 1x64x64")
    return torch.device("cpu")

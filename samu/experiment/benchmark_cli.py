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


def shape(text: str) -> tuple[int, int, int]:
    """An argparse type: BATCHxLENGTHxWIDTH as (batch, length, width)."""
    try:
        return tuple(Shape.parse(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1 (a count, a width, a number of ranks)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


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


def words(text: str) -> list[str]:
    """An argparse type: comma-separated words, empty ones dropped."""
    return [w for w in text.split(",") if w]


def parser(doc: str) -> argparse.ArgumentParser:
    """A parser whose --help prints the benchmark's docstring as written."""
    return argparse.ArgumentParser(description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def add_mixers(parser: argparse.ArgumentParser) -> None:
    """--mixers NAME ...: the mixers to run (default: every registered one)."""
    parser.add_argument("--mixers", nargs="+", type=mixer, default=list(backends.REGISTRY),
                        help=f"mixers to run (default: {' '.join(backends.REGISTRY)})")


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

"""The machine-readable rows that the benchmarks (benchmarks/*.py) append beside what they print.

Each measurement is one JSON line of ``data/benchmarks/<gpu>/<benchmark>.jsonl``
(samu.paths.benchmarks_file; SAMU_DATA_DIR moves it with the rest of the data folder)::

    {"format": 1, "benchmark": "sweep_backends", "gpu": "nvidia-h200", "commit": "<sha>",
     "mixer": "samu",
     "configuration": {"backend": "fused_controller_hierarchical_chunk8",
                       "settings": {"chunk": 8, "output": {"warps": 2, ...}, ...},
                       "settings_digest": "<12 hex digits>", "sweep": "outside"},
     "shape": {"batch": 1, "length": 32768, "width": 2048},
     "values": {"gpu_time_ms": 0.41, "median_ms": 0.52, "chosen_by_auto": true},
     "units": {"gpu_time_ms": "ms", "median_ms": "ms", "chosen_by_auto": "bool"},
     "environment": {"torch": ..., "triton": ..., "cuda": ..., "gpu": "NVIDIA H200", ...}}

- gpu: protocol.device_slug of the device timed, "cpu" for a CPU run (git ignores
  data/benchmarks/cpu/, as it does every CPU output).
- commit: SAMU_GIT_COMMIT, else git's HEAD (protocol.environment's git_commit); null outside git.
- mixer: null for a measurement of no mixer (a bare torch op).
- configuration: what was chosen; ``configuration()`` gives a backend's name with every field of
  its frozen configuration (the launch settings) and their digest, plus the benchmark's own keys.
- shape: batch, length, width of a call; another set of axes where the work has no length (the
  carry's batch, chunks, width).
- values: numbers, booleans, null (not measured on this device), or "inf"/"nan"; units names
  each value's unit, given or read from the name's suffix (_ms, _us, _s, _bytes).
- environment: protocol.environment(device), taken once per writer.

Rows are only ever appended.  Each is one write() to a file opened with O_APPEND, under an
exclusive flock, so that the rows of writers running at once do not interleave; a row cut short by
a killed writer stays as a line that read_rows skips, and the next row starts a line of its own.
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import os
from pathlib import Path

import torch

from .. import backends, paths
from ..shapes import Shape
from . import protocol, schema

FORMAT = 1
SUFFIX_UNITS = {"_ms": "ms", "_us": "us", "_s": "s", "_bytes": "bytes"}
NEW_FILE_MODE = schema.NEW_FILE_MODE


def unit_of(name: str) -> str | None:
    """The unit a value's name carries in its suffix (gpu_time_ms: ms), or None."""
    return next((unit for suffix, unit in SUFFIX_UNITS.items() if name.endswith(suffix)), None)


def configuration(mixer: str | None, backend, **extra) -> dict:
    """{"backend": name, "settings": its frozen configuration's fields, "settings_digest": ...}
    and ``extra``.  ``backend`` is a registered name or a configuration passed in as the backend;
    a reference backend, "auto" or any other name not registered has no settings."""
    if isinstance(backend, str):
        entry = backends.REGISTRY[mixer].get(backend) if mixer in backends.REGISTRY else None
        name, config = backend, (entry.config if entry is not None else None)
    else:
        name, config = backend.name, backend
    out = {"backend": name}
    if config is not None and dataclasses.is_dataclass(config):
        from ..ops.common.family import settings_digest  # imports triton, which a config implies
        out["settings"] = dataclasses.asdict(config)
        out["settings_digest"] = settings_digest(config)
    out.update(extra)
    return out


def _value(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return float(value)  # a tensor's or numpy's scalar


def _shape(shape) -> dict:
    if isinstance(shape, dict) and not {"batch", "length", "width"} <= shape.keys():
        return {str(axis): int(size) for axis, size in shape.items()}
    return Shape.of(shape).as_dict()


def append_line(path, line: str) -> None:
    """Append ``line`` and a newline to ``path`` in one write (creating the file and its folder)."""
    if "\n" in line:
        raise ValueError("a row is one line")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (line + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, NEW_FILE_MODE)
    try:
        # Held to the close: another writer's row is never seen half-written by the check below.
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":  # a row cut short: leave it its own line
            data = b"\n" + data
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)


def read_rows(path) -> list[dict]:
    """The rows of ``path`` in order, without the lines that do not hold one (cut short, blank)."""
    rows = []
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return rows
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and row.get("format") == FORMAT:
            rows.append(row)
    return rows


class BenchmarkRows:
    """The writer of one benchmark's rows on one device: ``add`` appends one measurement."""

    def __init__(self, benchmark: str, device=None, path=None):
        device = torch.device(device) if device is not None else protocol.default_device()
        self.benchmark = benchmark
        self.environment = protocol.environment(device)
        self.gpu = protocol.device_slug(device)
        self.commit = self.environment["git_commit"]
        self.path = Path(path) if path is not None else paths.benchmarks_file(self.gpu, benchmark)
        self.written = 0

    def row(self, mixer: str | None, configuration: dict, shape, values: dict,
            units: dict | None = None) -> dict:
        """The validated row of one measurement (schema.BENCHMARK_ROW_SCHEMA); written by add."""
        given = dict(units or {})
        extra = sorted(set(given) - set(values))
        if extra:
            raise ValueError(f"{self.benchmark}: units for no value: {extra}")
        units = {name: given.get(name) or unit_of(name) for name in values}
        missing = [name for name, unit in units.items() if unit is None]
        if missing:
            raise ValueError(f"{self.benchmark}: no unit for {missing}")
        row = schema._finite({
            "format": FORMAT, "benchmark": self.benchmark, "gpu": self.gpu,
            "commit": self.commit, "mixer": mixer,
            "configuration": json.loads(json.dumps(configuration)),
            "shape": _shape(shape),
            "values": {name: _value(v) for name, v in values.items()},
            "units": units, "environment": self.environment})
        schema.validate(row, "benchmark_row")
        return row

    def add(self, mixer: str | None, configuration: dict, shape, values: dict,
            units: dict | None = None) -> dict:
        row = self.row(mixer, configuration, shape, values, units)
        append_line(self.path, json.dumps(row, allow_nan=False))
        self.written += 1
        return row

    def summary(self) -> str:
        """What a benchmark prints at its end: how many rows went where."""
        return f"appended {self.written} rows to {paths.relative(self.path)}"

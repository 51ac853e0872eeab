"""The calibration file data/calibration/<gpu>.json: its checks, and the lock its writers share.

``backend="auto"`` dispatches from this file, so it is checked when it is read, in plain Python
(``import samu`` stays free of jsonschema), and every error names the file and the entry.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

from .shapes import Shape


class CalibrationFileError(ValueError):
    """A calibration file that cannot be trusted for dispatch; the message names file and entry."""


def lock_path(path) -> Path:
    path = Path(path)
    return path.with_name(f".{path.name}.lock")


@contextlib.contextmanager
def locked(path):
    """Hold an exclusive lock for a read-modify-write of ``path``.  The lock is a separate file
    because the data file itself is replaced by rename on every write; it is never deleted, since
    removing it would let a late process lock a file no one else sees."""
    lock = lock_path(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def read(path) -> dict:
    """The parsed file, or CalibrationFileError saying why it is not JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as exc:
        raise CalibrationFileError(f"{path}: not valid JSON (truncated or hand-edited?): "
                                   f"{exc}") from None
    except UnicodeDecodeError as exc:
        raise CalibrationFileError(f"{path}: not UTF-8 text: {exc}") from None


def parse_shape_key(key, path) -> tuple[int, int, int]:
    try:
        return tuple(Shape.parse(key))
    except ValueError as exc:
        raise CalibrationFileError(f"{path}: shape key {key!r}: {exc}") from None


def choices(doc, path, registry: dict, retired: dict | None = None) -> dict:
    """{(mixer, (B, L, D)): chosen backend or None} of a calibration document, after checking
    every entry against ``registry`` ({mixer: {name: Backend}}, every backend registered).
    Names in ``retired`` ({mixer: {name: reason}}) are accepted and skipped: where one was
    chosen, the choice is the entry's best-ranked backend that still exists and was legal.

    A chosen backend must be a registered Triton backend of its mixer that the entry's own
    ``backends`` list records as legal; null means "no calibrated choice" (the default runs)."""
    if not isinstance(doc, dict):
        raise CalibrationFileError(f"{path}: the top level must be an object, not "
                                   f"{type(doc).__name__}")
    shapes = doc.get("shapes")
    if not isinstance(shapes, dict):
        raise CalibrationFileError(f"{path}: 'shapes' must be an object of "
                                   "{BATCHxLENGTHxWIDTH: {mixer: entry}}, got "
                                   f"{type(shapes).__name__}")
    out = {}
    for key, mixers in shapes.items():
        shape = parse_shape_key(key, path)
        if not isinstance(mixers, dict):
            raise CalibrationFileError(f"{path}: shape {key}: must be an object of "
                                       f"{{mixer: entry}}, got {type(mixers).__name__}")
        for mixer, entry in mixers.items():
            out[(mixer, shape)] = _checked_choice(entry, registry, f"{path}: shape {key}, "
                                                  f"mixer {mixer}", mixer,
                                                  (retired or {}).get(mixer, {}))
    return out


def _checked_choice(entry, registry: dict, where: str, mixer: str, retired=()):
    if mixer not in registry:
        raise CalibrationFileError(f"{where}: unknown mixer; choose one of {sorted(registry)}")
    names = registry[mixer]
    if not isinstance(entry, dict):
        raise CalibrationFileError(f"{where}: the entry must be an object with 'ranking', "
                                   f"'chosen' and 'backends', got {type(entry).__name__}")
    missing = [k for k in ("ranking", "chosen", "backends") if k not in entry]
    if missing:
        raise CalibrationFileError(f"{where}: the entry lacks {', '.join(map(repr, missing))}")

    def registered(name, field):
        if isinstance(name, str) and name in retired:
            return
        if not isinstance(name, str) or name not in names:
            raise CalibrationFileError(f"{where}: {field} {name!r} is not a registered backend "
                                       f"of {mixer}; registered: {sorted(names)}")

    ranking, recorded = entry["ranking"], entry["backends"]
    if not isinstance(ranking, list):
        raise CalibrationFileError(f"{where}: 'ranking' must be a list of backend names")
    for name in ranking:
        registered(name, "ranking name")
    if not isinstance(recorded, list):
        raise CalibrationFileError(f"{where}: 'backends' must be a list of objects")
    legal = {}
    for i, item in enumerate(recorded):
        if not isinstance(item, dict):
            raise CalibrationFileError(f"{where}: backends[{i}] must be an object, got "
                                       f"{type(item).__name__}")
        registered(item.get("backend"), f"backends[{i}].backend")
        legal[item["backend"]] = item.get("legal") is True

    chosen = entry["chosen"]
    if chosen in retired:
        chosen = next((n for n in ranking if n not in retired and legal.get(n)), None)
    if chosen is None:
        return None
    registered(chosen, "chosen")  # "" included: an empty choice is no way to say "none"
    if names[chosen].kind != "triton":
        raise CalibrationFileError(f"{where}: chosen {chosen!r} is a {names[chosen].kind} "
                                   "backend; auto dispatches only to Triton backends (write "
                                   "null for no choice)")
    if not legal.get(chosen):
        state = "records it as illegal" if chosen in legal else "does not record it"
        raise CalibrationFileError(f"{where}: chosen {chosen!r} is not legal here: the entry's "
                                   f"'backends' list {state} (legal: true is required)")
    return chosen

"""The calibration file data/calibration/<gpu>.json: its checks, and the lock its writers share.

``backend="auto"`` dispatches from this file, so it is checked when it is read, in plain Python
(``import samu`` stays free of jsonschema), and every error names the file and the entry.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import reprlib
from pathlib import Path

from .shapes import Shape


class CalibrationFileError(ValueError):
    """A calibration file that cannot be trusted for dispatch; the message names file and entry."""


# A calibration file is a few hundred kB (every shape, mixer and backend of a GPU); a larger one
# is refused before it is parsed.
MAX_FILE_BYTES = 16 * 2**20

# An error echoes at most about this many characters of a value from the file: a hostile file's
# value may be a gigabyte.
ECHO_CHARACTERS = 80
_echo = reprlib.Repr()
_echo.maxstring = _echo.maxother = _echo.maxlong = ECHO_CHARACTERS
_echo.maxlevel, _echo.maxdict, _echo.maxlist, _echo.maxtuple = 2, 4, 4, 4


def shown(value) -> str:
    """repr(value), cut to about ECHO_CHARACTERS (strings are cut before they are copied)."""
    return _echo.repr(value)


def named_directory(path, named_by: str) -> Path:
    """The calibration directory that ``named_by`` (set_calibration_dir, SAMU_CALIBRATION_DIR)
    names, absolute (a relative path taken against the working directory now); one that is not
    an existing directory is refused, whichever names it."""
    folder = Path(os.path.abspath(os.path.expanduser(os.fspath(path))))
    if not folder.is_dir():
        what = "a file, not a directory" if folder.exists() else "not a directory (none there)"
        raise NotADirectoryError(f"{named_by}: {folder} is {what}")
    return folder


def lock_path(path) -> Path:
    path = Path(path)
    return path.with_name(f".{path.name}.lock")


@contextlib.contextmanager
def locked(path):
    """Hold an exclusive lock for a read-modify-write of ``path``.  The lock is a separate file
    because the data file itself is replaced by rename on every write; it is never deleted, since
    removing it would let a late process lock a file no one else sees."""
    # Beside the link's target when the file is a symlink: writers write through to the target
    # (schema.atomic_write), so every path to one file shares one lock.
    lock = lock_path(os.path.realpath(path))
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def read(path) -> dict:
    """The parsed file, or CalibrationFileError saying why it cannot be used: not JSON, nested
    too deeply, a key twice in one object, or not a readable file (a directory, a symlink loop).
    A missing file raises FileNotFoundError: to a caller that is no file, not a broken one."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise CalibrationFileError(f"{path}: larger than {MAX_FILE_BYTES} bytes, too large "
                                       "to be a calibration file")
        return json.loads(data.decode("utf-8"), object_pairs_hook=_refuse_repeated_keys)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise unreadable(path, exc) from None
    except json.JSONDecodeError as exc:
        raise CalibrationFileError(f"{path}: not valid JSON (truncated or hand-edited?): "
                                   f"{exc}") from None
    except UnicodeDecodeError as exc:
        raise CalibrationFileError(f"{path}: not UTF-8 text: {exc}") from None
    except CalibrationFileError:
        raise
    except ValueError as exc:  # an integer of more digits than Python converts, say
        raise CalibrationFileError(f"{path}: not a calibration file's JSON: {exc}") from None
    except RecursionError:
        raise CalibrationFileError(f"{path}: nested too deeply to be a calibration file "
                                   "(it is {gpu, environment, shapes: {shape: {mixer: "
                                   "entry}}})") from None
    except _RepeatedKey as exc:
        raise CalibrationFileError(f"{path}: the key {shown(exc.args[0])} appears twice in one "
                                   "object; JSON readers keep only the last") from None


class _RepeatedKey(Exception):
    pass


def _refuse_repeated_keys(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise _RepeatedKey(key)
        out[key] = value
    return out


def unreadable(path, exc: OSError) -> CalibrationFileError:
    """The error for something at a calibration file's path that cannot be read (a directory,
    a symlink loop)."""
    return CalibrationFileError(f"{path}: cannot be read as a calibration file: "
                                f"{exc.strerror or exc} ({type(exc).__name__})")


def is_finite_number(value) -> bool:
    """A JSON number that is finite: not a bool, not NaN or infinite (as a float, a NaN literal
    or the strings "nan" and "inf" that the writers put in its place)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


# What an entry's memory rule and each backend's measurements must hold where present and not
# null: a NaN time or tolerance makes the choice depend on the entries' order, or take a backend
# far slower than the fastest.
ENTRY_NUMBERS = ("memory_tolerance", "memory_budget_units")
MEASUREMENTS = ("median_ms", "gpu_time_ms", "peak_units")


def _check_finite(record: dict, fields, where: str) -> None:
    for field in fields:
        value = record.get(field)
        if value is not None and not is_finite_number(value):
            raise CalibrationFileError(f"{where}: {field!r} must be a finite number or null, got "
                                       f"{type(value).__name__} {shown(value)}")


def parse_shape_key(key, path) -> tuple[int, int, int]:
    if len(key) > ECHO_CHARACTERS:  # Shape.parse's message would echo it whole
        raise CalibrationFileError(f"{path}: shape key {shown(key)} ({len(key)} characters) is "
                                   "too long to be BATCHxLENGTHxWIDTH")
    try:
        return tuple(Shape.parse(key))
    except ValueError as exc:
        raise CalibrationFileError(f"{path}: shape key {key!r}: {exc}") from None


def _brief(value) -> str:
    """A name or digest from the file as a message gives it: a short string as it is, anything
    else as ``shown``."""
    return value if isinstance(value, str) and len(value) <= ECHO_CHARACTERS else shown(value)


def choices(doc, path, registry: dict, check_settings: bool = True) -> dict:
    """{(mixer, (B, L, D)): chosen backend or None} of a calibration document, after checking
    every entry against ``registry`` ({mixer: {name: Backend}}, every backend registered).

    A chosen backend must be a registered Triton backend of its mixer that the entry's own
    ``backends`` list records as legal; null means "no calibrated choice" (calibration found
    no legal backend there; dispatch takes the nearest choice that the entry does not record as
    not legal, else the default).
    With check_settings, its recorded launch settings must be its registered configuration's
    (off for a writer: recalibrating is how an entry of other settings is replaced, so such
    entries must not block it)."""
    if not isinstance(doc, dict):
        raise CalibrationFileError(f"{path}: the top level must be an object, not "
                                   f"{type(doc).__name__}")
    shapes = doc.get("shapes")
    if not isinstance(shapes, dict):
        raise CalibrationFileError(f"{path}: 'shapes' must be an object of "
                                   "{BATCHxLENGTHxWIDTH: {mixer: entry}}, got "
                                   f"{type(shapes).__name__}")
    out = {}
    spelled = {}  # shape -> its key: 1x16x16 and 1X16X16 are one shape
    for key, mixers in shapes.items():
        shape = parse_shape_key(key, path)
        if shape in spelled:
            raise CalibrationFileError(f"{path}: shape keys {spelled[shape]!r} and {key!r} name "
                                       f"one shape, {Shape(*shape).key}: keep one")
        spelled[shape] = key
        if not isinstance(mixers, dict):
            raise CalibrationFileError(f"{path}: shape {key}: must be an object of "
                                       f"{{mixer: entry}}, got {type(mixers).__name__}")
        for mixer, entry in mixers.items():
            out[(mixer, shape)] = _checked_choice(entry, registry, f"{path}: shape {key}, "
                                                  f"mixer {_brief(mixer)}", mixer, check_settings)
    return out


def not_legal(doc, path) -> dict:
    """{(mixer, (B, L, D)): the backends the entry records as not legal} of a calibration
    document that ``choices`` has checked."""
    return {(mixer, parse_shape_key(key, path)):
            frozenset(item["backend"] for item in entry["backends"] if item.get("legal") is not True)
            for key, mixers in doc["shapes"].items() for mixer, entry in mixers.items()}


def _checked_choice(entry, registry: dict, where: str, mixer: str, check_settings: bool):
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
        if not isinstance(name, str) or name not in names:
            raise CalibrationFileError(f"{where}: {field} {shown(name)} is not a registered "
                                       f"backend of {mixer}; registered: {sorted(names)}")

    _check_finite(entry, ENTRY_NUMBERS, where)
    ranking, recorded = entry["ranking"], entry["backends"]
    if not isinstance(ranking, list):
        raise CalibrationFileError(f"{where}: 'ranking' must be a list of backend names")
    for name in ranking:
        registered(name, "ranking name")
    if not isinstance(recorded, list):
        raise CalibrationFileError(f"{where}: 'backends' must be a list of objects")
    legal, settings = {}, {}
    for i, item in enumerate(recorded):
        if not isinstance(item, dict):
            raise CalibrationFileError(f"{where}: backends[{i}] must be an object, got "
                                       f"{type(item).__name__}")
        registered(item.get("backend"), f"backends[{i}].backend")
        if item["backend"] in legal:
            raise CalibrationFileError(f"{where}: backends[{i}] records {item['backend']!r} "
                                       "again: one record a backend")
        _check_finite(item, MEASUREMENTS, f"{where}, backends[{i}]")
        samples = item.get("forward_backward_ms")
        if samples is not None and not (isinstance(samples, list)
                                        and all(map(is_finite_number, samples))):
            raise CalibrationFileError(f"{where}, backends[{i}]: 'forward_backward_ms' must be "
                                       "a list of finite numbers or null")
        legal[item["backend"]] = item.get("legal") is True
        settings[item["backend"]] = item.get("settings")

    chosen = entry["chosen"]
    if chosen is not None and not isinstance(chosen, str):
        raise CalibrationFileError(f"{where}: 'chosen' must be a backend name or null, got "
                                   f"{type(chosen).__name__} {shown(chosen)}")
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
    # Recorded launch settings (files written before they were recorded have none) must be the
    # registered configuration's: a timing of other launches says nothing of these.
    if (check_settings and settings.get(chosen) is not None
            and settings[chosen] != names[chosen].settings):
        raise CalibrationFileError(f"{where}: chosen {chosen!r} was calibrated with launch "
                                   f"settings {_brief(settings[chosen])}, and its registered "
                                   f"configuration's are {names[chosen].settings}: recalibrate "
                                   "this shape (make reproduce)")
    return chosen

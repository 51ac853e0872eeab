"""``backend="auto"``: which backend runs a call (SPEC section 3).

* with CUDA: the calibrated choice for (GPU name, mixer, shape) from the GPU's calibration file;
  where that file has no entry for the shape, or there is no file, ``backends.DEFAULTS[mixer]``
  (documented, not silent: the module's ``last_backend`` and ``return_backend=True`` say what
  ran);
* without CUDA: the chunked reference, or the default Triton backend when ``TRITON_INTERPRET=1``
  was set before samu was imported (Triton's interpreter runs the kernels on CPU tensors);
* where ``auto`` would run a Triton backend and the Triton backends could not be loaded
  (``backends.triton_unavailable()``), an error saying why.

The calibration file is ``<directory>/<gpu-slug>.json`` (``gpu_slug``: ``NVIDIA H200`` ->
``nvidia-h200``), the directory being the first of these that applies:

1. the directory named by ``set_calibration_dir(path)`` (``None`` restores the default);
2. the directory named by the environment variable ``SAMU_CALIBRATION_DIR``;
3. the data folder's ``calibration/``: ``$SAMU_DATA_DIR/calibration`` when ``SAMU_DATA_DIR`` is
   set, else ``data/calibration/`` when samu runs from its checkout (an editable install
   included; ``paths.in_checkout``), where the experiment writes it;
4. the copy packaged with samu, ``samu/_calibration/`` (a wheel or sdist carries the checkout's
   ``data/calibration/*.json`` there).

Only that directory is read: a GPU without a file there has no calibrated choice (the defaults
run), and no later directory is tried.  ``calibration_source(slug)`` says which file ``auto``
would read and why.  The directory and the file's stat are looked up again at most every
``RECHECK_SECONDS``, and at once after ``set_calibration_dir`` or ``forget_calibration``; a
file that fails its checks raises ``CalibrationFileError`` naming the file and the entry (and
is not read again until it changes).  A directory named by ``set_calibration_dir`` or
``SAMU_CALIBRATION_DIR`` that is not one (missing, or a file) raises NotADirectoryError.
"""
from __future__ import annotations

import math
import os
import re
import time
from functools import lru_cache
from pathlib import Path
from stat import S_ISDIR, S_ISREG
from typing import NamedTuple

import torch

from . import _runtime, backends, calibration_file, paths
from .backends import DEFAULTS, REGISTERED, REGISTRY, Backend, _ensure_registered, check_name
from .calibration_file import CalibrationFileError  # (re-exported)


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

# Look the calibration directory up and re-stat its file at most this often: a stat costs
# ~10 us of host time, too much for every call.
RECHECK_SECONDS = 1.0

# gpu slug -> (checked at, (path, stat stamp), choices); a missing file is cached as no choices,
# a file that failed its checks as _Unusable until its stamp changes.
_CHOICES: dict[str, tuple[float, tuple, dict]] = {}


class _Unusable(NamedTuple):
    message: str  # the CalibrationFileError a look-up raises again
_USER_DIR: Path | None = None  # set_calibration_dir's directory


class CalibrationSource(NamedTuple):
    """The calibration file ``auto`` reads for one GPU, and which rule of the lookup chose it."""
    path: Path | None  # it may not exist: then that GPU has no calibrated choice; None: no file
    origin: str  # "set_calibration_dir", "SAMU_CALIBRATION_DIR", "SAMU_DATA_DIR", "checkout",
                 # "packaged", or NO_CUDA


# The origin of calibration_source() in a process without CUDA: there auto runs the chunked
# reference (or, under TRITON_INTERPRET=1, the default Triton backend) and reads no file.
NO_CUDA = "no CUDA: auto reads no calibration file"


def set_calibration_dir(path) -> None:
    """Make ``auto`` read ``<path>/<gpu-slug>.json``, ahead of SAMU_CALIBRATION_DIR, the data
    folder and the packaged copy; ``None`` restores the default lookup (see the module docstring).
    The directory must exist; a relative path is taken against the working directory now."""
    global _USER_DIR
    _USER_DIR = None if path is None else calibration_file.named_directory(
        path, "set_calibration_dir")
    forget_calibration()


def calibration_source(slug: str | None = None) -> CalibrationSource:
    """The calibration file ``auto`` would read for GPU ``slug`` (default: this process's GPU,
    ``gpu_slug()``), with the rule that chose its directory; the first that applies:

    1. ``set_calibration_dir(path)``: origin ``"set_calibration_dir"``;
    2. the environment variable SAMU_CALIBRATION_DIR: origin ``"SAMU_CALIBRATION_DIR"``;
    3. the data folder's calibration/: ``$SAMU_DATA_DIR/calibration`` (origin
       ``"SAMU_DATA_DIR"``), else the checkout's ``data/calibration`` when samu runs from its
       checkout (origin ``"checkout"``);
    4. the copy packaged with samu, ``samu/_calibration``: origin ``"packaged"``.

    No later directory is tried when the file is missing from the chosen one.  Without a slug
    in a process without CUDA it is ``(None, NO_CUDA)``: auto reads no file there (a named
    directory that is none is refused all the same)."""
    folder, origin = _calibration_dir()
    if slug is None:
        if not torch.cuda.is_available():
            return CalibrationSource(None, NO_CUDA)
        slug = gpu_slug()
    return CalibrationSource(folder / f"{slug}.json", origin)


def _calibration_dir() -> tuple[Path, str]:
    if _USER_DIR is not None:
        return _USER_DIR, "set_calibration_dir"
    named = paths.calibration_dir_from_env()
    if named is not None:  # refused, as set_calibration_dir refuses it, where it is no directory
        return (calibration_file.named_directory(named, paths.CALIBRATION_DIR_ENV),
                paths.CALIBRATION_DIR_ENV)
    if paths.DATA_FROM_ENV:
        return paths.DATA / "calibration", "SAMU_DATA_DIR"
    if paths.in_checkout():
        return paths.DATA / "calibration", "checkout"
    return paths.PACKAGED_CALIBRATION, "packaged"


def check_calibration(doc: dict, path, check_settings: bool = True) -> dict:
    """{(mixer, (B, L, D)): chosen backend or None} of a calibration document, every entry
    checked against the registered backends (CalibrationFileError names the file and entry;
    check_settings: calibration_file.choices)."""
    _ensure_registered()
    return calibration_file.choices(doc, path, REGISTRY, check_settings)


def _load_choices(path: str) -> dict:
    """check_calibration's choices, and beside them ("not legal", mixer, shape) keys: the
    backends each entry records as not legal, which a shape whose nearest entry it is never
    takes from a neighbour."""
    doc = calibration_file.read(path)
    choices = check_calibration(doc, path)
    choices.update({("not legal", *key): names
                    for key, names in calibration_file.not_legal(doc, path).items()})
    return choices


def forget_calibration() -> None:
    """Drop the cached calibration choices and directory (writers call this after writing the
    file): the next look-up finds the directory again and re-reads the file."""
    _CHOICES.clear()


def calibrated_choice(mixer: str, shape: tuple[int, int, int], slug: str) -> str | None:
    """The calibrated backend for (mixer, shape) on GPU ``slug``, from ``calibration_source(slug)``:
    the entry for the shape, else (no entry, or one without a choice) the choice calibrated at
    the nearest shape (``nearest_entry``), so that an uncalibrated shape does not fall back to a
    default far slower than the best; where the nearest entry of all (the shape's own, if the
    file has it) chose nothing, no backend it records as not legal (None: no file, or no such
    choice).  The directory is looked up and the file re-stat'ed at most every
    RECHECK_SECONDS; the file is re-read when its path or stat changed."""
    now = time.monotonic()
    cached = _CHOICES.get(slug)
    if cached is None or now - cached[0] > RECHECK_SECONDS:
        cached = _recheck(slug, now, cached)
    choices = cached[2]
    if isinstance(choices, _Unusable):
        raise CalibrationFileError(choices.message)
    key = (mixer, tuple(shape))
    if choices.get(key) is not None:
        return choices[key]
    nearest = ("nearest", *key)  # memoised beside the file's own entries
    if nearest not in choices:
        anchor = nearest_entry(choices, mixer, tuple(shape), chosen_only=False)
        refused = choices.get(("not legal", mixer, anchor), ()) if anchor else ()
        found = nearest_entry(choices, mixer, tuple(shape), refused=refused)
        choices[nearest] = choices[(mixer, found)] if found else None
    return choices[nearest]


# An entry at another width is this many times further than one at another token count: the
# block width (RG-LRU) and the tiles follow the width, the grid follows the tokens.
WIDTH_DISTANCE_WEIGHT = 4.0


def nearest_entry(choices: dict, mixer: str, shape, refused=(),
                  chosen_only: bool = True) -> tuple[int, int, int] | None:
    """The calibrated shape closest to ``shape`` among the mixer's entries that chose a backend
    not in ``refused`` (``chosen_only`` false: among all its entries): distance
    |log(D / D')| * WIDTH_DISTANCE_WEIGHT + |log(B L / B' L')|; ties go to the larger shape (the
    kernels' choice is stabler there)."""
    batch, length, width = shape
    best, best_key = None, None
    for key, name in choices.items():
        if len(key) != 2 or key[0] != mixer or (chosen_only and name is None) or name in refused:
            continue
        b, l, d = key[1]
        distance = (WIDTH_DISTANCE_WEIGHT * abs(math.log(width / d))
                    + abs(math.log(batch * length / (b * l))))
        # Rounded, so that an exact tie is one: log(q / s) and log(l / q) at a geometric
        # midpoint can differ in the last bit.
        rank = (round(distance, 9), -(b * l * d))
        if best is None or rank < best:
            best, best_key = rank, key[1]
    return best_key


def _recheck(slug: str, now: float, cached) -> tuple[float, tuple, dict]:
    path = str(calibration_source(slug).path)
    try:
        stat = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        stamp, choices = (path, None), {}
    except OSError as exc:  # a symlink loop, say: something is there, and it cannot be read
        raise calibration_file.unreadable(path, exc) from None
    else:
        if not S_ISREG(stat.st_mode):  # a directory, say (and a FIFO would block the read)
            what = "a directory" if S_ISDIR(stat.st_mode) else "not a regular file"
            raise CalibrationFileError(f"{path}: cannot be read as a calibration file: {what}")
        stamp = (path, stat.st_mtime_ns, stat.st_size, stat.st_ino)
        if cached is not None and cached[1] == stamp:
            choices = cached[2]
        else:
            try:
                choices = _load_choices(path)
            except CalibrationFileError as exc:  # not parsed again until the file changes
                choices = _Unusable(str(exc))
    cached = _CHOICES[slug] = (now, stamp, choices)
    return cached


def resolve(mixer: str, x: torch.Tensor, backend: str = "auto") -> Backend:
    _ensure_registered()
    check_name(mixer, backend)  # a wrong type, an unknown name or an unloadable one raises here
    if backend != "auto":
        chosen = (REGISTERED[mixer][backend] if isinstance(backend, str)
                  else backends.from_config(mixer, backend))
        if chosen.kind == "triton":
            _check_triton_input(mixer, x, chosen.name)
        return chosen
    if x.dtype == torch.float64:
        return REGISTERED[mixer]["reference_chunked"]
    if x.is_cuda:
        if backends._triton_unavailable is not None:  # before the file: it names Triton backends
            raise _auto_needs_triton(mixer, f"a Triton backend on CUDA (the calibrated choice, "
                                            f"else {DEFAULTS[mixer]})")
        name = calibrated_choice(mixer, tuple(x.shape), gpu_slug()) or DEFAULTS[mixer]
        return REGISTERED[mixer][name]
    _runtime.check_interpret_unchanged()  # off the CUDA path: costs CUDA calls nothing
    if interpreting():
        if backends._triton_unavailable is not None:
            raise _auto_needs_triton(mixer, f"{DEFAULTS[mixer]} under Triton's interpreter "
                                            "(TRITON_INTERPRET=1)")
        return REGISTERED[mixer][DEFAULTS[mixer]]
    return REGISTERED[mixer]["reference_chunked"]


def _auto_needs_triton(mixer: str, runs: str) -> RuntimeError:
    return RuntimeError(f"{mixer}: backend='auto' runs {runs}, and "
                        f"{backends._unavailable_line()}: pass backend='reference_chunked'")


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

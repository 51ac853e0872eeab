"""``backend="auto"``: which backend runs a call (SPEC section 3).

* with CUDA: the calibrated choice for (GPU name, mixer, shape) from the calibration file
  (``samu.paths.calibration_file``); where that file has no entry for the shape,
  ``backends.DEFAULTS[mixer]`` (documented, not silent: the module's ``last_backend`` and
  ``return_backend=True`` say what ran);
* without CUDA: the chunked reference, or the default Triton backend when ``TRITON_INTERPRET=1``
  was set before samu was imported (Triton's interpreter runs the kernels on CPU tensors).
"""
from __future__ import annotations

import os
import re
import time
from functools import lru_cache

import torch

from . import _runtime, calibration_file, paths
from .backends import DEFAULTS, REGISTRY, Backend, _ensure_registered, check_name
from .calibration_file import CalibrationFileError  # noqa: F401  (re-exported)


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

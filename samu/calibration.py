"""Legality against the float64 oracle, and calibration of backends per shape (SPEC section 4).

A backend is legal for a shape on a device when it runs there within memory; y and every gradient
match the float64 oracle (same BF16-rounded x, same FP32 parameters) with normwise relative error
at most 2 x the eager PyTorch autocast reference's error + 1e-3, all finite; and it materialises no
state-sized transition.
"""
from __future__ import annotations

import math
import statistics
from datetime import datetime, timezone
from pathlib import Path

import torch

from . import backends, calibration_file, paths, schema, timing
from .mixers import FUNCTIONS, MODULES, PARAMETER_NAMES

ERROR_SLACK = 1e-3
ERROR_FACTOR = 2.0
# Above this many elements the oracle uses the chunked float64 scan: it agrees with the
# sequential one to ~1e-15 (tests/test_reference.py) and runs in ~2 sqrt(L) steps.
SEQUENTIAL_ORACLE_MAX_LENGTH = 256


def make_inputs(mixer: str, shape, device, seed: int = 0, dtype=torch.bfloat16):
    """Parameters from the module's initialisation with a fixed seed; x, dy standard normal."""
    batch, length, width = shape
    gen = torch.Generator(device="cpu").manual_seed(seed)
    module = MODULES[mixer](width)
    module.reset_parameters(generator=gen)
    params = {n: p.detach().to(device) for n, p in module.named_parameters()}
    x = torch.randn(batch, length, width, generator=gen).to(device=device, dtype=dtype)
    dy = torch.randn(batch, length, width, generator=gen).to(device=device, dtype=dtype)
    return x, params, dy


def outputs(mixer: str, backend: str, x, params: dict, dy):
    """y and every gradient (x first, then parameters in state_dict order) of one backend."""
    xg = x.detach().clone().requires_grad_()
    ps = [p.detach().clone().requires_grad_() for p in params.values()]
    y = FUNCTIONS[mixer](xg, *ps, backend=backend)
    grads = torch.autograd.grad(y, [xg, *ps], dy.to(y.dtype))
    return {"y": y.detach(), **dict(zip(["x", *PARAMETER_NAMES[mixer]], grads))}


def oracle(mixer: str, x, params: dict, dy):
    """float64 outputs from the same BF16-rounded x and FP32 parameters."""
    scan = "sequential" if x.shape[1] <= SEQUENTIAL_ORACLE_MAX_LENGTH else "chunked"
    return outputs(mixer, f"reference_{scan}", x.double(),
                   {n: p.double() for n, p in params.items()}, dy.double())


def relative_errors(got: dict, want: dict) -> dict[str, float]:
    errs = {}
    for name, w in want.items():
        g = got[name].double()
        if not torch.isfinite(g).all():
            errs[name] = math.inf
            continue
        denom = w.norm().item()
        diff = (g - w).norm().item()
        errs[name] = diff / denom if denom > 0 else diff
    return errs


def check_legality(mixer: str, backend: str, shape=None, device=None, seed: int = 0,
                   want: dict | None = None, eager_errors: dict | None = None,
                   inputs: tuple | None = None) -> dict:
    """Errors of y and every gradient against the oracle, the eager reference's beside them.
    The inputs are make_inputs(mixer, shape, device, seed), or ``inputs`` = (x, params, dy)."""
    x, params, dy = inputs if inputs is not None else make_inputs(mixer, shape, device, seed)
    if want is None:
        want = oracle(mixer, x, params, dy)
    if eager_errors is None:
        eager_errors = relative_errors(outputs(mixer, "reference_chunked", x, params, dy), want)
    chosen = backends.REGISTRY[mixer][backend]
    entry = {"backend": backend, "eager_errors": eager_errors,
             "materialized_state_sized_transition": chosen.materialized_state_sized_transition}
    try:
        errs = relative_errors(outputs(mixer, backend, x, params, dy), want)
    except torch.cuda.OutOfMemoryError as exc:
        return {**entry, "legal": False, "reason": f"out of memory: {exc}", "errors": {}}
    except Exception as exc:  # a backend that cannot run here is illegal here, not fatal
        return {**entry, "legal": False, "reason": f"{type(exc).__name__}: {exc}", "errors": {}}
    bounds = {n: ERROR_FACTOR * e + ERROR_SLACK for n, e in eager_errors.items()}
    failing = [n for n, e in errs.items() if not e <= bounds[n]]
    reasons = [f"{n}: {errs[n]:.2e} > {bounds[n]:.2e}" for n in failing]
    if chosen.materialized_state_sized_transition:
        reasons.append("materialises a state-sized transition")
    return {**entry, "errors": errs, "bounds": bounds, "legal": not reasons,
            "reason": "; ".join(reasons) or None}


def calibrate_shape(shape, device, mixers=("rglru", "samu"), candidates: dict | None = None,
                    reps: int = 10, seed: int = 0, progress=None) -> dict:
    """For each mixer: legality of every candidate, forward+backward medians of the legal ones,
    ranked, and the choice.  Reference backends are recorded as illegal without timing."""
    result = {}
    for mixer in mixers:
        names = candidates[mixer] if candidates else backends.available(mixer)
        x, params, dy = make_inputs(mixer, shape, device, seed)
        want = oracle(mixer, x, params, dy)
        eager = relative_errors(outputs(mixer, "reference_chunked", x, params, dy), want)
        entries = []
        for name in names:
            if progress:
                progress(f"{mixer}/{name}")
            if backends.REGISTRY[mixer][name].kind == "reference" and device != "cpu":
                entries.append({"backend": name, "legal": False,
                                "reason": "materialises a state-sized transition",
                                "materialized_state_sized_transition": True})
                continue
            entry = check_legality(mixer, name, shape, device, seed, want, eager)
            if entry["legal"]:
                samples = timing.time_forward_backward(mixer, name, x, params, dy, reps)
                entry["forward_backward_ms"] = samples
                entry["median_ms"] = statistics.median(samples)
            entries.append(entry)
        del want
        legal = sorted((e for e in entries if e["legal"]), key=lambda e: e["median_ms"])
        result[mixer] = {
            "ranking": [e["backend"] for e in legal],
            "chosen": legal[0]["backend"] if legal else None,
            "backends": entries,
        }
    return result


def merge_calibration(slug: str, shape, result: dict, environment: dict,
                      path: Path | None = None) -> dict:
    """Merge one shape's result into data/calibration/<slug>.json (or ``path``), atomically.

    The read-modify-write holds the file's lock, so concurrent calibrations of other shapes
    lose nothing; the merged document is checked as ``auto`` will check it before it is
    written, so a bad result leaves the file as it was."""
    path = Path(path) if path is not None else paths.calibration_file(slug)
    with calibration_file.locked(path):
        if path.exists():
            doc = calibration_file.read(path)
            backends.check_calibration(doc, path)  # refuse to build on a broken file
        else:
            doc = {"gpu": environment.get("gpu"), "shapes": {}}
        doc["environment"] = environment
        doc["updated"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        doc["shapes"][backends.shape_key(shape)] = result
        backends.check_calibration(doc, path)
        schema.write_json_atomic(path, doc, kind="calibration")
    backends.forget_calibration()
    return doc

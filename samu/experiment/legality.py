"""Legality against the float64 oracle (SPEC section 4).

A backend is legal for a shape on a device when it runs there within memory; y and every gradient
match the float64 oracle (same BF16-rounded x, same FP32 parameters) with normwise relative error
at most 2 x the eager PyTorch autocast reference's error + 1e-3, all finite; and it materialises no
state-sized transition.
"""
from __future__ import annotations

import math

import torch

from .. import backends
from ..functional import FUNCTIONS, PARAMETER_NAMES
from ..modules import MODULES


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

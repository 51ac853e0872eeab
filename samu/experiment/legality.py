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
from ..modules import NUM_HEADS, build


ERROR_SLACK = 1e-3

ERROR_FACTOR = 2.0

# Above this many elements the oracle uses the chunked float64 scan: it agrees with the
# sequential one to ~1e-15 (tests/test_reference.py) and runs in ~2 sqrt(L) steps.
SEQUENTIAL_ORACLE_MAX_LENGTH = 256


def make_inputs(mixer: str, shape, device, seed: int = 0, dtype=torch.bfloat16,
                num_heads: int = NUM_HEADS):
    """Parameters from the module's initialisation with a fixed seed (num_heads: RG-LRU's gate
    blocks); x, dy standard normal."""
    batch, length, width = shape
    gen = torch.Generator(device="cpu").manual_seed(seed)
    module = build(mixer, width, num_heads)
    module.reset_parameters(generator=gen)
    params = {n: p.detach().to(device) for n, p in module.named_parameters()}
    x = torch.randn(batch, length, width, generator=gen).to(device=device, dtype=dtype)
    dy = torch.randn(batch, length, width, generator=gen).to(device=device, dtype=dtype)
    return x, params, dy


def make_state(shape, device, seed: int = 0, cu_seqlens=None, initial: bool = True,
               resets=None) -> dict:
    """State keywords for a legality check: an initial state (standard normal, FP32) unless
    ``initial`` is False, cu_seqlens as given, the final state's incoming gradient, and the
    reset mask ``resets`` ([B, L] bool, or positions per row) where given."""
    batch, length, width = shape
    count = batch if cu_seqlens is None else len(cu_seqlens) - 1
    gen = torch.Generator(device="cpu").manual_seed(seed + 1)
    state = {"d_final_state": torch.randn(count, width, generator=gen).to(device)}
    if initial:
        state["initial_state"] = torch.randn(count, width, generator=gen).to(device)
    if cu_seqlens is not None:
        state["cu_seqlens"] = torch.as_tensor(cu_seqlens, dtype=torch.int32, device=device)
    if resets is not None:
        state["resets"] = reset_mask(resets, batch, length, device)
    return state


def reset_mask(resets, batch: int, length: int, device) -> torch.Tensor:
    """[B, L] bool from a mask, or from each row's reset positions (a list per row)."""
    if isinstance(resets, torch.Tensor):
        return resets.to(device=device, dtype=torch.bool)
    mask = torch.zeros(batch, length, dtype=torch.bool)
    for row, positions in enumerate(resets):
        mask[row, list(positions)] = True
    return mask.to(device)


def outputs(mixer: str, backend: str, x, params: dict, dy, state: dict | None = None):
    """y and every gradient (x first, then parameters in state_dict order) of one backend.
    With ``state`` (make_state), the call passes its initial state, cu_seqlens and reset mask
    and returns the final state, whose gradient d_final_state enters beside dy; the outputs add
    final_state and (given an initial state) its gradient initial_state."""
    xg = x.detach().clone().requires_grad_()
    ps = [p.detach().clone().requires_grad_() for p in params.values()]
    if state is None:
        y = FUNCTIONS[mixer](xg, *ps, backend=backend)
        grads = torch.autograd.grad(y, [xg, *ps], dy.to(y.dtype))
        return {"y": y.detach(), **dict(zip(["x", *PARAMETER_NAMES[mixer]], grads))}
    h0 = state.get("initial_state")
    h0 = None if h0 is None else h0.detach().clone().requires_grad_()
    y, final = FUNCTIONS[mixer](xg, *ps, backend=backend, initial_state=h0,
                                cu_seqlens=state.get("cu_seqlens"), output_final_state=True,
                                resets=state.get("resets"))
    inputs = [xg, *ps] + ([h0] if h0 is not None else [])
    grads = torch.autograd.grad([y, final], inputs,
                                [dy.to(y.dtype), state["d_final_state"].to(final.dtype)])
    names = ["x", *PARAMETER_NAMES[mixer]] + (["initial_state"] if h0 is not None else [])
    return {"y": y.detach(), "final_state": final.detach(), **dict(zip(names, grads))}


def _double_state(state: dict | None) -> dict | None:
    if state is None:
        return None
    return {n: t if n in ("cu_seqlens", "resets") else t.double() for n, t in state.items()}


def oracle(mixer: str, x, params: dict, dy, state: dict | None = None):
    """float64 outputs from the same BF16-rounded x and FP32 parameters (and states)."""
    scan = "sequential" if x.shape[1] <= SEQUENTIAL_ORACLE_MAX_LENGTH else "chunked"
    return outputs(mixer, f"reference_{scan}", x.double(),
                   {n: p.double() for n, p in params.items()}, dy.double(), _double_state(state))


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
                   inputs: tuple | None = None, state: dict | None = None) -> dict:
    """Errors of y and every gradient against the oracle, the eager reference's beside them.
    backend: a registered name or a Triton configuration (samu.backends.from_config).  The
    inputs are make_inputs(mixer, shape, device, seed), or ``inputs`` = (x, params, dy);
    ``state`` (make_state) adds the state keywords, the final state and its gradients."""
    x, params, dy = inputs if inputs is not None else make_inputs(mixer, shape, device, seed)
    if want is None:
        want = oracle(mixer, x, params, dy, state)
    if eager_errors is None:
        eager_errors = relative_errors(outputs(mixer, "reference_chunked", x, params, dy, state),
                                       want)
    chosen = (backends.REGISTRY[mixer][backend] if isinstance(backend, str)
              else backends.from_config(mixer, backend))  # a configuration passed in
    entry = {"backend": chosen.name, "eager_errors": eager_errors,
             "materialized_state_sized_transition": chosen.materialized_state_sized_transition}
    try:
        errs = relative_errors(outputs(mixer, backend, x, params, dy, state), want)
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

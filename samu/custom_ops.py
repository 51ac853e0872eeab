"""The Triton backends as torch.library custom ops, for torch.compile and CUDA graphs
(SPEC section 3).

``samu::scan_forward`` and ``samu::scan_backward`` wrap a backend family's ``forward`` and
``backward`` (the same functions its autograd.Function calls), with fake implementations that
give every output's shape from the backend's configuration, and autograd that connects them.
Eager calls do not come here: they keep the autograd.Functions, so the dispatcher adds no host
time to them; samu.functional routes a call here only while torch.compile traces it.

A backend reaches the ops by its registered name: the configuration (chunk, launches) is then a
constant of the compiled graph.

``samu::scan_forward`` reads packed offsets' values when it runs (one host sync, none during a
CUDA-graph capture), called directly or from a compiled graph, and refuses bad ones with eager's
words; ``samu::check_cu_seqlens`` does the same for the references' compiled calls, which a
traced graph cannot do itself.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import backends, checks, mixers
from .ops.common.launching import fp32_contiguous
from .ops.common.sequences import sequence_args


def _family(mixer: str, backend: str):
    """(module with forward / backward / residual_specs, configuration) of a registered name."""
    mixers.get(mixer)  # an unknown name: ValueError listing the registered ones
    registered = backends.REGISTRY[mixer].get(backend) if isinstance(backend, str) else None
    config = registered.config if registered is not None else None
    module = backends.family_of(mixer, config) if config is not None else None
    if module is None:
        raise ValueError(f"{mixer}: backend {backend!r} is not a Triton backend; the custom "
                         f"ops take one of {backends.matching(mixer)}")
    return module, config


# Argument signatures whose checks passed: the ops' checks read only types, shapes, dtypes,
# devices and layouts (cu_seqlens' values are read on every call), so a compiled graph that runs
# without CUDA graphs pays for them once per signature, as eager calls do (samu.functional).
_CHECKED: dict = {}


def _checked_before(plain: tuple, tensors) -> tuple | None:
    """None where this signature (checks.call_signature) passed its checks before, else the key
    to remember once they pass (an empty one where there is none, as inside
    checks_on_every_call: checked every time, never remembered)."""
    key = checks.call_signature(plain, tensors)
    if key is None:
        return ()
    return None if key in _CHECKED else key


def _remember(key: tuple) -> None:
    if key:
        checks.remember(_CHECKED, key)


def _count(x: torch.Tensor, cu_seqlens: Optional[torch.Tensor]):
    return x.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1


@torch.library.custom_op("samu::scan_forward", mutates_args=())
def scan_forward(x: torch.Tensor, params: list[torch.Tensor],
                 initial_state: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor],
                 resets: Optional[torch.Tensor], mixer: str, backend: str,
                 output_final_state: bool) -> list[torch.Tensor]:
    """[y, final state (empty unless asked for), *residuals] of one backend's forward; resets,
    the reset mask (torch.bool [B, L]) or None."""
    module, config = _family(mixer, backend)
    key = _checked_before(("forward", mixer, backend, output_final_state, len(params)),
                          (x, *params, initial_state, cu_seqlens, resets))
    if key is not None:
        checks.check_op_inputs(mixer, backend, x, params, initial_state, cu_seqlens, resets,
                               output_final_state)
        _remember(key)
    checks.check_running_offsets(mixer, cu_seqlens, x.shape[1])
    if initial_state is not None:
        initial_state = fp32_contiguous(initial_state)
    sequences = sequence_args(x, initial_state, cu_seqlens, output_final_state, resets)
    y, final, residuals = module.forward(x, params, sequences, config)
    if final is None:
        final = x.new_empty(0, dtype=torch.float32)
    return [y, final, *residuals]


@scan_forward.register_fake
def _scan_forward_fake(x, params, initial_state, cu_seqlens, resets, mixer, backend,
                       output_final_state):
    module, config = _family(mixer, backend)
    batch, length, width = x.shape
    final_shape = (_count(x, cu_seqlens), width) if output_final_state else (0,)
    residuals = [x.new_empty(shape, dtype=dtype)
                 for shape, dtype in module.residual_specs(config, batch, length, width, x.dtype,
                                                               params)]
    return [torch.empty_like(x), x.new_empty(final_shape, dtype=torch.float32), *residuals]


@torch.library.custom_op("samu::scan_backward", mutates_args=())
def scan_backward(x: torch.Tensor, params: list[torch.Tensor], residuals: list[torch.Tensor],
                  dy: Optional[torch.Tensor], d_final: Optional[torch.Tensor],
                  initial_state: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor],
                  resets: Optional[torch.Tensor], mixer: str, backend: str) -> list[torch.Tensor]:
    """[dx, the parameter gradients flattened into one FP32 vector, d initial state (empty
    without one)] of one backend.  A custom op's outputs may not alias each other, and the
    kernels' parameter gradients are views of one buffer: one small copy joins them."""
    module, config = _family(mixer, backend)
    key = _checked_before(("backward", mixer, backend, len(params), len(residuals)),
                          (x, *params, *residuals, dy, d_final, initial_state, cu_seqlens,
                           resets))
    if key is not None:
        count = checks.check_op_inputs(mixer, backend, x, params, initial_state, cu_seqlens,
                                       resets, False)
        _check_backward_inputs(mixer, module, config, x, params, residuals, dy, d_final, count)
        _remember(key)
    if initial_state is not None:
        initial_state = fp32_contiguous(initial_state)
    sequences = sequence_args(x, initial_state, cu_seqlens, False, resets)
    grads = module.backward(x, params, residuals, dy, d_final, sequences, config)
    d_h0 = grads[-1] if grads[-1] is not None else x.new_empty(0, dtype=torch.float32)
    flat = torch.cat([g.reshape(-1).float() for g in grads[1:-1]])
    return [grads[0], flat, d_h0]


def _check_backward_inputs(mixer, module, config, x, params, residuals, dy, d_final, count):
    """dy like x, d_final [sequences, D], and the residuals of the shapes and dtypes that this
    backend's forward gives (residual_specs): the kernels index each by x's shape."""
    batch, length, width = x.shape
    if dy is not None:
        checks.check_like(mixer, "dy", dy, x.shape, x.device)
    if d_final is not None:
        checks.check_like(mixer, "d_final", d_final, (count, width), x.device)
    want = module.residual_specs(config, batch, length, width, x.dtype, params)
    got = [(tuple(r.shape), r.dtype) if isinstance(r, torch.Tensor) else type(r).__name__
           for r in residuals]
    if got != [(tuple(shape), dtype) for shape, dtype in want] or any(
            r.device != x.device for r in residuals):
        raise ValueError(f"{mixer}: the residuals must be those of this backend's forward "
                         f"for x of shape {list(x.shape)}, {[tuple(w) for w in want]} on "
                         f"{x.device}, got {got}")


@scan_backward.register_fake
def _scan_backward_fake(x, params, residuals, dy, d_final, initial_state, cu_seqlens, resets,
                        mixer, backend):
    d_h0 = (x.new_empty(initial_state.shape, dtype=torch.float32) if initial_state is not None
            else x.new_empty(0, dtype=torch.float32))
    flat = x.new_empty(sum(p.numel() for p in params), dtype=torch.float32)
    return [torch.empty_like(x), flat, d_h0]


def _setup_context(ctx, inputs, output):
    x, params, initial_state, cu_seqlens, resets, mixer, backend, output_final_state = inputs
    ctx.save_for_backward(x, initial_state, cu_seqlens, resets, *params, *output[2:])
    ctx.n_params = len(params)
    ctx.names = (mixer, backend)
    ctx.output_final_state = output_final_state


def _backward(ctx, grads):
    x, initial_state, cu_seqlens, resets, *rest = ctx.saved_tensors
    params, residuals = rest[:ctx.n_params], rest[ctx.n_params:]
    dy, d_final = grads[0], grads[1]
    if not ctx.output_final_state:
        d_final = None
    out = torch.ops.samu.scan_backward(x, params, residuals, dy, d_final, initial_state,
                                       cu_seqlens, resets, *ctx.names)
    d_h0 = out[2] if initial_state is not None else None
    sizes = [p.numel() for p in params]
    d_params = [g.view(p.shape) for g, p in zip(out[1].split(sizes), params)]
    return out[0], d_params, d_h0, None, None, None, None, None


scan_forward.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("samu::check_cu_seqlens", mutates_args=())
def check_cu_seqlens(cu_seqlens: torch.Tensor, length: int, mixer: str) -> torch.Tensor:
    """A copy of cu_seqlens once its values are checked as an eager call checks them (one host
    sync), or unchecked during a CUDA-graph capture, which forbids the sync.  The copy is what
    the scan reads: a result that the graph uses keeps the check from being dropped as dead
    code (a custom op's output may not alias its input)."""
    checks.check_running_offsets(mixer, cu_seqlens, length)
    return cu_seqlens.clone()


@check_cu_seqlens.register_fake
def _check_cu_seqlens_fake(cu_seqlens, length, mixer):
    return torch.empty_like(cu_seqlens)


def checked_cu_seqlens(mixer: str, x: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """cu_seqlens for a traced call, its values checked when the graph runs."""
    return torch.ops.samu.check_cu_seqlens(cu_seqlens, x.shape[1], mixer)


def run(mixer: str, backend: str, x, params, initial_state=None, cu_seqlens=None,
        output_final_state: bool = False, resets=None):
    """(y, final state or None) of a registered Triton backend through the custom ops."""
    if initial_state is not None:  # traced: no alignment check here (the ops align)
        initial_state = initial_state.float().contiguous()
    out = torch.ops.samu.scan_forward(x, list(params), initial_state, cu_seqlens, resets, mixer,
                                      backend, output_final_state)
    return out[0], (out[1] if output_final_state else None)

"""The mixers' functional forms and their input checks (SPEC section 3).

Bad input raises an error that names the problem and touches nothing; the checks run before any
backend, so every backend refuses the same inputs with the same words.
"""
from __future__ import annotations

import contextlib
import functools
from typing import NamedTuple

import torch

from . import backends, dispatch, mixers


PARAMETER_NAMES = mixers.View(lambda spec: spec.parameter_names)

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)

# Kernels index with int64 offsets; grid axis 0 (batch x chunks) is the only large one.
MAX_ELEMENTS = 2**62


def check_positive_int(mixer: str, name: str, value, what: str = "") -> None:
    # bool is an int subclass, and RGLRU(True) would reach torch.empty with a bool size.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{mixer}: {name} must be a positive integer{what}, got "
                        f"{type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{mixer}: {name} must be a positive integer{what}, got {value}")


def check_dense(mixer: str, x: torch.Tensor, name: str = "x") -> None:
    if x.layout != torch.strided:  # a sparse tensor has no strides for a view or a kernel
        raise TypeError(f"{mixer}: {name} must be a dense tensor, got layout {x.layout}; pass "
                        f"{name}.to_dense()")


def check_input(x, width: int, mixer: str) -> None:
    """Refuse bad input with a message naming the problem; touches nothing."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{mixer}: x must be a torch.Tensor, got {type(x).__name__}")
    check_dense(mixer, x)
    if x.dim() != 3:
        raise ValueError(f"{mixer}: x must have rank 3 [batch, length, width], got rank {x.dim()} "
                         f"with shape {tuple(x.shape)}")
    batch, length, got = x.shape
    if got != width:
        raise ValueError(f"{mixer}: x has width {got} but the mixer's width is {width}")
    if batch == 0 or length == 0:
        raise ValueError(f"{mixer}: x is empty (batch {batch}, length {length}); "
                         "batch and length must be at least 1")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{mixer}: unsupported dtype {x.dtype}; use one of "
                        f"{', '.join(str(d) for d in SUPPORTED_DTYPES)}")
    if x.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{mixer}: unsupported device {x.device}; use cpu or cuda")
    if x.numel() >= MAX_ELEMENTS:
        raise ValueError(f"{mixer}: x has {x.numel()} elements, more than the kernels can address")


def check_tensors(mixer: str, params: dict) -> None:
    """Runs before any .shape or .dim(): one isinstance per parameter, on every forward."""
    for name, p in params.items():
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"{mixer}: {name} must be a torch.Tensor, got {type(p).__name__}")


def check_parameters(mixer: str, x: torch.Tensor, params: dict[str, torch.Tensor]) -> None:
    device = x.device
    for name, p in params.items():
        if p.device != device:
            raise ValueError(f"{mixer}: parameter {name} is on {p.device} but x is on {x.device}")
        if not p.is_floating_point():
            raise TypeError(f"{mixer}: parameter {name} must be floating point, got {p.dtype}")
        if p.layout != torch.strided:
            raise TypeError(f"{mixer}: parameter {name} must be a dense tensor, got layout "
                            f"{p.layout}")


def autocast_input(x: torch.Tensor) -> torch.Tensor:
    """Under autocast, a float32 x enters as the autocast dtype, as a matmul would."""
    if x.dtype == torch.float32 and torch.is_autocast_enabled(x.device.type):
        return x.to(torch.get_autocast_dtype(x.device.type))
    return x


CU_SEQLENS_DTYPES = (torch.int32, torch.int64)


def _capturing(t: torch.Tensor) -> bool:
    """Whether t's stream is capturing a CUDA graph, where a host sync is forbidden."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _values_checkable(t: torch.Tensor) -> bool:
    """Reading cu_seqlens' values needs a host sync, which a CUDA-graph capture forbids and a
    traced graph cannot hold: a compiled graph reads them when it runs instead
    (samu::check_cu_seqlens, samu.custom_ops); a capture checks only the shape, dtype and
    device."""
    if torch.compiler.is_compiling():
        return False
    return not _capturing(t)


def check_cu_seqlens_values(mixer: str, cu_seqlens: torch.Tensor, length: int) -> None:
    """The offsets' values (one host sync): from 0 to the length, each sequence at least one
    token long.  Eager calls and compiled graphs (samu::check_cu_seqlens) both check here."""
    offsets = cu_seqlens.tolist()
    if offsets[0] != 0 or offsets[-1] != length:
        raise ValueError(f"{mixer}: cu_seqlens must start at 0 and end at the length "
                         f"{length}, got {offsets[0]} ... {offsets[-1]}")
    check_offsets_increase(mixer, offsets)


def check_offsets_increase(who: str, offsets) -> None:
    """Every sequence of the offsets at least one token long."""
    short = next((n for n in range(len(offsets) - 1) if offsets[n + 1] <= offsets[n]), None)
    if short is not None:
        raise ValueError(f"{who}: cu_seqlens must increase (every sequence at least one "
                         f"token), but sequence {short} runs from {offsets[short]} to "
                         f"{offsets[short + 1]}")


def check_cu_seqlens(mixer: str, x: torch.Tensor, cu_seqlens) -> int:
    """The number of packed sequences, after FlashAttention's convention is checked: batch 1,
    [N + 1] int32 or int64 offsets on x's device, from 0 to the length, each sequence at least
    one token long."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"{mixer}: cu_seqlens must be a torch.Tensor, got "
                        f"{type(cu_seqlens).__name__}")
    if cu_seqlens.dtype not in CU_SEQLENS_DTYPES:
        raise TypeError(f"{mixer}: cu_seqlens must be int32 or int64, got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"{mixer}: cu_seqlens must have shape [N + 1] with N >= 1 sequences, "
                         f"got shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.device != x.device:
        raise ValueError(f"{mixer}: cu_seqlens is on {cu_seqlens.device} but x is on {x.device}")
    if x.shape[0] != 1:
        raise ValueError(f"{mixer}: packed sequences (cu_seqlens) need batch 1, got batch "
                         f"{x.shape[0]}")
    if _values_checkable(cu_seqlens):
        check_cu_seqlens_values(mixer, cu_seqlens, x.shape[1])
    return cu_seqlens.numel() - 1


def check_resets(mixer: str, x: torch.Tensor, resets, what: str = "resets") -> None:
    """A reset mask: torch.bool [B, L] ([1, L] with cu_seqlens) on x's device.  Only its dtype,
    shape and device: its values need no check (any mask is a valid one), so none is read and
    nothing syncs with the host."""
    if not isinstance(resets, torch.Tensor):
        raise TypeError(f"{mixer}: {what} must be a torch.bool tensor, got "
                        f"{type(resets).__name__}")
    if resets.dtype != torch.bool:
        raise TypeError(f"{mixer}: {what} must be a torch.bool tensor (True where the state "
                        f"resets), got {resets.dtype}")
    want = tuple(x.shape[:-1])
    if tuple(resets.shape) != want:
        raise ValueError(f"{mixer}: {what} must have x's shape without the width, "
                         f"{list(want)}, got {list(resets.shape)}")
    if resets.device != x.device:
        raise ValueError(f"{mixer}: {what} is on {resets.device} but x is on {x.device}")


def check_sequences(mixer: str, x: torch.Tensor, initial_state, cu_seqlens,
                    output_final_state, resets=None) -> None:
    """The state keywords of SPEC section 3, checked before anything runs."""
    if not isinstance(output_final_state, bool):
        raise TypeError(f"{mixer}: output_final_state must be True or False, got "
                        f"{output_final_state!r}")
    count = x.shape[0] if cu_seqlens is None else check_cu_seqlens(mixer, x, cu_seqlens)
    if resets is not None:
        check_resets(mixer, x, resets)
    if initial_state is None:
        return
    if not isinstance(initial_state, torch.Tensor):
        raise TypeError(f"{mixer}: initial_state must be a torch.Tensor, got "
                        f"{type(initial_state).__name__}")
    width = x.shape[2]
    if tuple(initial_state.shape) != (count, width):
        what = "sequences in cu_seqlens" if cu_seqlens is not None else "batch"
        raise ValueError(f"{mixer}: initial_state must have shape [{count}, {width}] "
                         f"({what} {count}, width {width}), got {tuple(initial_state.shape)}")
    if not initial_state.is_floating_point():
        raise TypeError(f"{mixer}: initial_state must be floating point (FP32), got "
                        f"{initial_state.dtype}")
    if initial_state.device != x.device:
        raise ValueError(f"{mixer}: initial_state is on {initial_state.device} but x is on "
                         f"{x.device}")


def _resolve(mixer: str, x, backend):
    """dispatch.resolve's backend, refused under torch.func transforms where it is a kernel."""
    chosen = dispatch.resolve(mixer, x, backend)
    if chosen.kind != "triton":
        return chosen
    if torch._C._are_functorch_transforms_active():
        # The kernels read raw storage, which torch.func's wrapped tensors do not have.
        raise RuntimeError(f"{mixer}: torch.func transforms (vmap/grad/jvp) are supported on the "
                           f"reference backends only, and backend {chosen.name} is a Triton "
                           "kernel: pass backend='reference_chunked'")
    if torch.jit.is_tracing():
        # The tracer records torch ops; a Triton launch is none, and reads its traced inputs'
        # storage as it is.
        raise RuntimeError(f"{mixer}: torch.jit.trace cannot record backend {chosen.name}, a "
                           "Triton kernel; use torch.compile or torch.export, which take the "
                           "kernels as custom ops (or trace backend='reference_chunked')")
    return chosen


def refuse_script(what: str):
    """What torch.jit.script of a mixer's function or module raises (their
    ``__prepare_scriptable__``): TorchScript compiles neither samu's Python dispatch nor its
    Triton kernels."""
    raise RuntimeError(f"{what}: torch.jit.script is not supported (TorchScript cannot compile "
                       "samu's Python dispatch or its Triton kernels); use torch.compile or "
                       "torch.export, which take the kernels as custom ops")


def state_keywords(initial_state, cu_seqlens, output_final_state, resets) -> dict:
    """The state keywords a backend's run takes: none where no keyword is used (the fastest
    path), and resets only where a mask is given."""
    if initial_state is None and cu_seqlens is None and not output_final_state:
        return {} if resets is None else dict(resets=resets)
    state = dict(initial_state=initial_state, cu_seqlens=cu_seqlens,
                 output_final_state=output_final_state)
    return state if resets is None else dict(state, resets=resets)


def _run(mixer: str, x, params: dict, backend: str, initial_state=None, cu_seqlens=None,
         output_final_state: bool = False, checked: bool = False, resets=None):
    """(y, final state or None, name of the backend that ran).  ``checked``: the call's
    signature passed every check before (_CHECKED), so only the packed offsets' values, which
    no signature fixes, are checked again."""
    x = autocast_input(x)
    if not checked:
        check_parameters(mixer, x, params)
    state = state_keywords(initial_state, cu_seqlens, output_final_state, resets)
    if state:
        if not checked:
            check_sequences(mixer, x, initial_state, cu_seqlens, output_final_state, resets)
        elif cu_seqlens is not None and _values_checkable(cu_seqlens):
            check_cu_seqlens_values(mixer, cu_seqlens, x.shape[1])
    if torch.compiler.is_compiling():
        return _run_compiled(mixer, x, params, backend, state)
    chosen = _resolve(mixer, x, backend)
    if resets is not None:
        check_takes_resets(mixer, chosen)
    if chosen.kind == "triton" or not torch.is_autocast_enabled(x.device.type):
        # The kernels set every dtype themselves; entering autocast costs ~15 us of host time.
        return (*chosen.run(x, *params.values(), **state), chosen.name)
    with torch.autocast(x.device.type, enabled=False):
        return (*chosen.run(x, *params.values(), **state), chosen.name)


def check_takes_resets(mixer: str, chosen) -> None:
    """ValueError naming the backend where its run takes no reset mask, and those that do."""
    if not chosen.takes_resets:
        able = [n for n, b in backends.REGISTRY[mixer].items() if b.takes_resets]
        raise ValueError(f"{mixer}: backend {chosen.name} does not take a reset mask (resets); "
                         f"these do: {able}")


class _Traced(NamedTuple):
    """What ``dispatch.resolve`` reads of x."""
    shape: tuple
    dtype: torch.dtype
    is_cuda: bool


@torch.compiler.assume_constant_result
def _compiled_choice(mixer: str, shape: tuple, dtype: torch.dtype, is_cuda: bool,
                     backend: str) -> str:
    """The backend name ``resolve`` picks, taken once while torch.compile traces: a constant
    of the graph, which then holds the Triton path as custom ops (samu.custom_ops)."""
    return dispatch.resolve(mixer, _Traced(shape, dtype, is_cuda), backend).name


# A compiled graph takes the backend chosen for (1, this many tokens, D): its batch and length
# may be symbolic (torch.compile's dynamic shapes), and one graph serves every length.
COMPILED_SHAPE_TOKENS = 16384


def _run_compiled(mixer: str, x, params: dict, backend, state: dict):
    """The traced call: a reference's torch ops as they are, a Triton backend as custom ops."""
    if not isinstance(backend, str):
        raise TypeError(f"{mixer}: under torch.compile, backend must be 'auto' or a registered "
                        f"name (samu.backends.available({mixer!r})), not a configuration")
    if backend == "auto":
        width = int(params["a_param"].shape[0])
        name = _compiled_choice(mixer, (1, COMPILED_SHAPE_TOKENS, width), x.dtype, x.is_cuda,
                                backend)
    else:  # a named backend needs no shape: the width may be symbolic (dynamic=True)
        backends.check_name(mixer, backend)
        name = backend
    chosen = backends.REGISTRY[mixer][name]
    if state.get("resets") is not None:
        check_takes_resets(mixer, chosen)
    from . import custom_ops
    if state.get("cu_seqlens") is not None:  # its values, checked when the graph runs
        state = dict(state, cu_seqlens=custom_ops.checked_cu_seqlens(mixer, x, state["cu_seqlens"]))
    if chosen.kind != "triton":
        return (*chosen.run(x, *params.values(), **state), name)
    return (*custom_ops.run(mixer, name, x, params.values(), **state), name)


def _result(y, final, name, output_final_state: bool, return_backend: bool):
    out = (y, final) if output_final_state else (y,)
    if return_backend:
        out = (*out, name)
    return out if len(out) > 1 else y

STATE_DOC = """
    initial_state: FP32 [B, D] ([N, D] with cu_seqlens), the state entering each sequence's first
        token, which is then an ordinary step; without it the state resets there.
    output_final_state: also return the FP32 state after each sequence's last token, [B, D]
        ([N, D] with cu_seqlens).
    cu_seqlens: packed sequences in one row (batch 1): int32 or int64 offsets [0, ..., L] as in
        FlashAttention; every start resets (or takes its initial state).
    resets: torch.bool [B, L] ([1, L] with cu_seqlens) on x's device, or None: True at token t
        resets the state there, whatever it would carry (from t - 1 or from initial_state):
        a_t counts as 0 and m_t as 1, and no gradient reaches a_t's inputs or the ignored state
        (recurrentgemma's and transformers' reset where segment_pos / position_ids is 0).  The
        starts above reset as if their tokens were True, unless an initial state enters them.
        Only the mask's dtype, shape and device are checked: no host sync.

    Returns y, (y, final_state) with output_final_state, and the backend's name after them with
    return_backend=True.  Every output is differentiable, the states included."""


def mix(mixer: str, x, *params, backend="auto", return_backend: bool = False,
        initial_state=None, output_final_state: bool = False, cu_seqlens=None,
        cp_context=None, resets=None):
    """Any registered mixer's functional form (samu.mixers): its parameters in the spec's
    order, the shapes checked by its spec; samu.rglru and samu.samu are this with named
    parameters."""
    if cp_context is not None:  # this rank's slice of a sequence split over ranks, which
        # checks everything there, sharing its verdict with the other ranks
        from .distributed import context_parallel
        return context_parallel(mixer, x, params, cp_context=cp_context, backend=backend,
                                return_backend=return_backend, initial_state=initial_state,
                                output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                resets=resets)
    spec = mixers.get(mixer)
    mixers.check_count(mixer, params)
    named = dict(zip(spec.parameter_names, params))
    signature = _signature(spec, x, params, backend, initial_state, cu_seqlens,
                           output_final_state, resets)
    try:
        checked = signature is not None and signature in _CHECKED
    except TypeError:  # an unhashable backend: checked every time
        signature, checked = None, False
    if not checked:
        _check_shapes(mixer, spec, x, named)
    y, final, name = _run(mixer, x, named, backend, initial_state, cu_seqlens,
                          output_final_state, checked, resets)
    if signature is not None and not checked:  # every check passed: remembered
        if len(_CHECKED) >= CHECKED_SIGNATURES:
            _CHECKED.clear()
        _CHECKED[signature] = spec  # held: its id in the key stays its own
    return _result(y, final, name, output_final_state, return_backend)


# Call signatures whose checks have passed.  Every check above reads only what a signature
# fixes (the mixer's spec, types, shapes, dtypes, devices, the backend and the keywords), apart
# from the packed offsets' values: a later call with the same signature skips them (host time,
# ~4.6 us on a CPU).  A mixer registered again under its name has a new spec, so new keys.
_CHECKED: dict = {}
CHECKED_SIGNATURES = 4096


def _tensor_signature(t):
    return None if t is None else (t.__class__, t.shape, t.dtype, t.device, t.layout)


_remembering = True  # checks_on_every_call turns it off for its block


@contextlib.contextmanager
def checks_on_every_call():
    """Within the block no call is remembered, so every call runs every check: what a call
    costs without _CHECKED (benchmarks/host_budget.py)."""
    global _remembering
    before, _remembering = _remembering, False
    try:
        yield
    finally:
        _remembering = before


def _signature(spec, x, params: tuple, backend, initial_state, cu_seqlens,
               output_final_state, resets=None):
    """What the checks of a call depend on, or None where it cannot be a key (a traced call, an
    argument that is no tensor, a call inside checks_on_every_call): such calls are checked
    every time."""
    if not _remembering or torch.compiler.is_compiling():
        return None
    try:
        return (id(spec), backend, output_final_state.__class__, output_final_state,
                _tensor_signature(x), _tensor_signature(initial_state),
                _tensor_signature(cu_seqlens), _tensor_signature(resets),
                *[_tensor_signature(p) for p in params])
    except AttributeError:
        return None


def _check_shapes(mixer: str, spec, x, named: dict) -> None:
    check_tensors(mixer, named)
    width = spec.width_of(named)
    check_input(x, width, mixer)
    spec.check_shapes(named, width)


def check_call(mixer: str, x, params, backend="auto") -> None:
    """Raises what a call of the mixer on x (no state keywords) would raise before anything
    runs: the checks that a caller of the kernels' phases alone, which check nothing, makes
    first (samu.distributed)."""
    spec = mixers.get(mixer)
    mixers.check_count(mixer, params)
    named = dict(zip(spec.parameter_names, params))
    _check_shapes(mixer, spec, x, named)
    x = autocast_input(x)
    check_parameters(mixer, x, named)
    _resolve(mixer, x, backend)


def rglru(x, gate_x_weight, gate_x_bias, gate_a_weight, gate_a_bias, a_param, backend="auto",
          return_backend: bool = False, initial_state=None, output_final_state: bool = False,
          cu_seqlens=None, cp_context=None, resets=None):
    """Functional RG-LRU (SPEC sections 2 and 3; cp_context: samu.distributed).
    """
    return mix("rglru", x, gate_x_weight, gate_x_bias, gate_a_weight, gate_a_bias, a_param,
               backend=backend, return_backend=return_backend, initial_state=initial_state,
               output_final_state=output_final_state, cu_seqlens=cu_seqlens,
               cp_context=cp_context, resets=resets)


def samu(x, ctrl_weight, ctrl_bias, a_param, log_temp, skip, backend="auto",
         return_backend: bool = False, initial_state=None, output_final_state: bool = False,
         cu_seqlens=None, cp_context=None, resets=None):
    """Functional SAMU (SPEC sections 2 and 3; cp_context: samu.distributed).
    """
    return mix("samu", x, ctrl_weight, ctrl_bias, a_param, log_temp, skip, backend=backend,
               return_backend=return_backend, initial_state=initial_state,
               output_final_state=output_final_state, cu_seqlens=cu_seqlens,
               cp_context=cp_context, resets=resets)


rglru.__doc__ += STATE_DOC
samu.__doc__ += STATE_DOC
mix.__doc__ += STATE_DOC
for _fn in (rglru, samu, mix):  # torch.jit.script calls it before compiling anything
    _fn.__prepare_scriptable__ = functools.partial(refuse_script, f"samu.{_fn.__name__}")
del _fn


def _function(spec):
    if spec.function is not None:
        return spec.load("function")
    return functools.partial(mix, spec.name)


# {mixer: its functional form}: the named one where the spec has it, else mix for that mixer.
FUNCTIONS = mixers.View(_function)

"""The mixers' functional forms (SPEC section 3): each call's input checks (samu.checks), once
per call signature, then the backend that dispatch picks, the custom ops under torch.compile
(samu.custom_ops), or, with ``cp_context``, context parallelism (samu.distributed, through the
context object: this module imports neither).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from . import backends, checks, dispatch, mixers


PARAMETER_NAMES = mixers.View(lambda spec: spec.parameter_names)

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
    x = checks.autocast_input(x)
    if not checked:
        checks.check_parameters(mixer, x, params)
    state = state_keywords(initial_state, cu_seqlens, output_final_state, resets)
    if state:
        if not checked:
            checks.check_sequences(mixer, x, initial_state, cu_seqlens, output_final_state,
                                   resets)
        elif cu_seqlens is not None and checks.values_checkable(cu_seqlens):
            checks.check_cu_seqlens_values(mixer, cu_seqlens, x.shape[1])
    if torch.compiler.is_compiling():
        return _run_compiled(mixer, x, params, backend, state)
    chosen = checks.resolve_backend(mixer, x, backend)
    if resets is not None:
        checks.check_takes_resets(mixer, chosen)
    if chosen.kind == "triton" or not torch.is_autocast_enabled(x.device.type):
        # The kernels set every dtype themselves; entering autocast costs ~15 us of host time.
        return (*chosen.run(x, *params.values(), **state), chosen.name)
    with torch.autocast(x.device.type, enabled=False):
        return (*chosen.run(x, *params.values(), **state), chosen.name)


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
        checks.check_takes_resets(mixer, chosen)
    from . import custom_ops  # only while tracing: it imports triton, which samu need not
    if chosen.kind == "triton":  # samu::scan_forward checks cu_seqlens' values when it runs
        return (*custom_ops.run(mixer, name, x, params.values(), **state), name)
    if state.get("cu_seqlens") is not None:  # its values, checked when the graph runs
        state = dict(state, cu_seqlens=custom_ops.checked_cu_seqlens(mixer, x, state["cu_seqlens"]))
    return (*chosen.run(x, *params.values(), **state), name)


def _result(y, final, name, output_final_state: bool, return_backend: bool):
    out = (y, final) if output_final_state else (y,)
    if return_backend:
        out = (*out, name)
    return out if len(out) > 1 else y

STATE_DOC = """
    initial_state: [B, D] ([N, D] with cu_seqlens), the state entering each sequence's first
        token, which is then an ordinary step; without it the state resets there.  Any floating
        dtype: it is carried in FP32 (float64 where x is float64).
    output_final_state: also return the state after each sequence's last token, [B, D]
        ([N, D] with cu_seqlens), in FP32 (float64 where x is float64).
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
    if cp_context is not None:  # this rank's slice of a sequence split over ranks: the
        # context runs it, checking everything there and sharing its verdict with the other ranks
        if not isinstance(cp_context, checks.SplitContext):
            raise checks.cp_context_error(mixer, cp_context)
        return cp_context.mix(mixer, x, params, backend=backend, return_backend=return_backend,
                              initial_state=initial_state, output_final_state=output_final_state,
                              cu_seqlens=cu_seqlens, resets=resets)
    checks.check_flag(mixer, "output_final_state", output_final_state)
    checks.check_flag(mixer, "return_backend", return_backend)
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
        checks.check_shapes(mixer, spec, x, named)
    y, final, name = _run(mixer, x, named, backend, initial_state, cu_seqlens,
                          output_final_state, checked, resets)
    if signature is not None and not checked:  # every check passed: remembered
        checks.remember(_CHECKED, signature, spec)  # held: its id in the key stays its own
    return _result(y, final, name, output_final_state, return_backend)


# Call signatures whose checks have passed.  Every check above reads only what a signature
# fixes (the mixer's spec, types, shapes, dtypes, devices, the backend and the keywords), apart
# from the packed offsets' values: a later call with the same signature skips them (host time,
# ~4.6 us on a CPU).  A mixer registered again under its name has a new spec, so new keys.
_CHECKED: dict = {}
checks_on_every_call = checks.checks_on_every_call  # what a call costs without _CHECKED


def _signature(spec, x, params: tuple, backend, initial_state, cu_seqlens,
               output_final_state, resets=None):
    """What the checks of a call depend on, or None where it cannot be a key
    (checks.call_signature): such calls are checked every time."""
    return checks.call_signature((id(spec), backend, output_final_state.__class__,
                                  output_final_state),
                                 (x, initial_state, cu_seqlens, resets, *params))


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

"""The mixers' input checks (SPEC section 3), one module that every entry point runs: the
functional forms (samu.functional), the modules, the model, the custom ops (the packed offsets'
values when a compiled graph runs) and context parallelism (samu.distributed).

Bad input raises an error that names the problem and touches nothing; the checks run before any
backend, so every backend refuses the same inputs with the same words.
"""
from __future__ import annotations

import contextlib
import numbers
from typing import Protocol, runtime_checkable

import torch

from . import backends, dispatch, mixers


SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)

# Kernels index with int64 offsets; grid axis 0 (batch x chunks) is the only large one.
MAX_ELEMENTS = 2**62


def check_positive_int(mixer: str, name: str, value, what: str = "") -> None:
    # bool is an int subclass, and RGLRU(True) would reach torch.empty with a bool size.
    if isinstance(value, bool) or not isinstance(value, int):
        # A numpy integer is refused too: sizes are stored and written to JSON as Python ints.
        hint = (" (a Python int; int(...) converts it)"
                if isinstance(value, numbers.Integral) and not isinstance(value, bool) else "")
        raise TypeError(f"{mixer}: {name} must be a positive integer{what}{hint}, got "
                        f"{type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{mixer}: {name} must be a positive integer{what}, got {value}")


def check_heads(mixer: str, width: int, num_heads) -> None:
    """num_heads, a mixer's gate blocks (RG-LRU's), a positive integer that divides ``width``."""
    check_positive_int(mixer, "num_heads", num_heads, f" dividing width {width}")
    if width % num_heads:
        raise ValueError(f"{mixer}: width {width} is not divisible by num_heads {num_heads}")


def check_flag(mixer: str, name: str, value) -> None:
    """A keyword that is True or False, not a value that is merely truthy or falsy."""
    if value is not True and value is not False:
        raise TypeError(f"{mixer}: {name} must be True or False, got {value!r}")


def check_dense(mixer: str, x: torch.Tensor, name: str = "x") -> None:
    if x.layout != torch.strided:  # a sparse tensor has no strides for a view or a kernel
        raise TypeError(f"{mixer}: {name} must be a dense tensor, got layout {x.layout}; pass "
                        f"{name}.to_dense()")


def check_dtype_and_device(mixer: str, x: torch.Tensor) -> None:
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{mixer}: unsupported dtype {x.dtype}; use one of "
                        f"{', '.join(str(d) for d in SUPPORTED_DTYPES)}")
    if x.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{mixer}: unsupported device {x.device}; use cpu or cuda")


def check_input(x, width: int, mixer: str, width_from=None, name: str = "x") -> None:
    """Refuse bad input with a message naming the problem; touches nothing.  ``width_from()``,
    called only to word an error, says where the width comes from (the functional forms: the
    parameters' shapes); ``name``, the caller's name for x."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{mixer}: {name} must be a torch.Tensor, got {type(x).__name__}")
    check_dense(mixer, x, name)
    if x.dim() != 3:
        raise ValueError(f"{mixer}: x must have rank 3 [batch, length, width], got rank {x.dim()} "
                         f"with shape {tuple(x.shape)}")
    batch, length, got = x.shape
    if got != width:
        raise ValueError(f"{mixer}: {name} has width {got} but the mixer's width is {width}"
                         + (f" (the parameters: {width_from()})" if width_from else ""))
    if batch == 0 or length == 0 or width == 0:
        raise ValueError(f"{mixer}: {name} is empty (batch {batch}, length {length}, width "
                         f"{width}); batch, length and width must be at least 1")
    check_dtype_and_device(mixer, x)
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


def capturing(t: torch.Tensor) -> bool:
    """Whether t's stream is capturing a CUDA graph, where a host sync is forbidden."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def values_checkable(t: torch.Tensor) -> bool:
    """Reading cu_seqlens' values needs a host sync, which a CUDA-graph capture forbids and a
    traced graph cannot hold: a compiled graph reads them when it runs instead (the custom ops,
    samu.custom_ops); a capture checks only the shape, dtype and device."""
    if torch.compiler.is_compiling():
        return False
    return not capturing(t)


def check_cu_seqlens_values(mixer: str, cu_seqlens: torch.Tensor, length: int) -> None:
    """The offsets' values (one host sync): from 0 to the length, each sequence at least one
    token long.  Eager calls and the custom ops (check_running_offsets) both check here."""
    offsets = cu_seqlens.tolist()
    if offsets[0] != 0 or offsets[-1] != length:
        raise ValueError(f"{mixer}: cu_seqlens must start at 0 and end at the length "
                         f"{length}, got {offsets[0]} ... {offsets[-1]}")
    check_offsets_increase(mixer, offsets)


def check_running_offsets(mixer: str, cu_seqlens, length: int) -> None:
    """What a custom op checks of the offsets it runs with, called directly or from a compiled
    graph: their values, but during a CUDA-graph capture, which forbids the host sync, none."""
    if cu_seqlens is not None and not capturing(cu_seqlens):
        check_cu_seqlens_values(mixer, cu_seqlens, length)


def check_offsets_increase(who: str, offsets) -> None:
    """Every sequence of the offsets at least one token long."""
    short = next((n for n in range(len(offsets) - 1) if offsets[n + 1] <= offsets[n]), None)
    if short is not None:
        raise ValueError(f"{who}: cu_seqlens must increase (every sequence at least one "
                         f"token), but sequence {short} runs from {offsets[short]} to "
                         f"{offsets[short + 1]}")


def check_cu_seqlens(mixer: str, x: torch.Tensor, cu_seqlens, values: bool = True) -> int:
    """The number of packed sequences, after FlashAttention's convention is checked: batch 1,
    [N + 1] int32 or int64 offsets on x's device, from 0 to the length, each sequence at least
    one token long (the values only with ``values``, where they can be read)."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"{mixer}: cu_seqlens must be a torch.Tensor, got "
                        f"{type(cu_seqlens).__name__}")
    check_dense(mixer, cu_seqlens, "cu_seqlens")
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
    if values and values_checkable(cu_seqlens):
        check_cu_seqlens_values(mixer, cu_seqlens, x.shape[1])
    return cu_seqlens.numel() - 1


def check_resets(mixer: str, x: torch.Tensor, resets, what: str = "resets") -> None:
    """A reset mask: torch.bool [B, L] ([1, L] with cu_seqlens) on x's device.  Only its dtype,
    shape and device: its values need no check (any mask is a valid one), so none is read and
    nothing syncs with the host."""
    if not isinstance(resets, torch.Tensor):
        raise TypeError(f"{mixer}: {what} must be a torch.bool tensor, got "
                        f"{type(resets).__name__}")
    check_dense(mixer, resets, what)
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
                    output_final_state, resets=None, offsets_values: bool = True,
                    state_name: str = "initial_state", x_name: str = "x") -> int:
    """The state keywords of SPEC section 3, checked before anything runs; the number of
    sequences.  ``offsets_values=False`` leaves cu_seqlens' values to a check of their own;
    ``state_name`` and ``x_name``, the caller's names (step's ``state`` and ``x_t``)."""
    check_flag(mixer, "output_final_state", output_final_state)
    count = (x.shape[0] if cu_seqlens is None
             else check_cu_seqlens(mixer, x, cu_seqlens, offsets_values))
    if resets is not None:
        check_resets(mixer, x, resets)
    if initial_state is None:
        return count
    if not isinstance(initial_state, torch.Tensor):
        raise TypeError(f"{mixer}: {state_name} must be a torch.Tensor, got "
                        f"{type(initial_state).__name__}")
    check_dense(mixer, initial_state, state_name)
    width = x.shape[2]
    if tuple(initial_state.shape) != (count, width):
        what = "sequences in cu_seqlens" if cu_seqlens is not None else "batch"
        raise ValueError(f"{mixer}: {state_name} must have shape [{count}, {width}] "
                         f"({what} {count}, width {width}), got {tuple(initial_state.shape)}")
    if not initial_state.is_floating_point():
        raise TypeError(f"{mixer}: {state_name} must be floating point (FP32), got "
                        f"{initial_state.dtype}")
    if initial_state.device != x.device:
        raise ValueError(f"{mixer}: {state_name} is on {initial_state.device} but {x_name} is "
                         f"on {x.device}")
    return count


def resolve_backend(mixer: str, x, backend):
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


def check_takes_resets(mixer: str, chosen) -> None:
    """ValueError naming the backend where its run takes no reset mask, and those that do."""
    if not chosen.takes_resets:
        able = [n for n, b in backends.REGISTRY[mixer].items() if b.takes_resets]
        raise ValueError(f"{mixer}: backend {chosen.name} does not take a reset mask (resets); "
                         f"these do: {able}")


def check_shapes(mixer: str, spec, x, named: dict) -> None:
    """The parameters' types and shapes and x, by the mixer's spec.  Where x's width differs
    from the one the spec reads from a parameter, the parameters are checked against each other
    first, so that an error blames x only when they agree."""
    check_tensors(mixer, named)
    width = spec.width_of(named)
    if isinstance(x, torch.Tensor) and x.dim() == 3 and x.shape[-1] != width:
        check_parameters_agree(mixer, spec, named, width, f"x has width {x.shape[-1]}")
    check_input(x, width, mixer,
                lambda: ", ".join(f"{name} {tuple(p.shape)}" for name, p in named.items()))
    spec.check_shapes(named, width)


def check_parameters_agree(mixer: str, spec, named: dict, width: int, also: str = "") -> None:
    """The spec's shape check of the parameters at ``width``, the one a parameter fixes; its
    ValueError names the parameter that does not fit, then that width and the parameter that
    fixes it (a parameter of another width, or of a wrong shape at any width), then ``also``."""
    try:
        spec.check_shapes(named, width)
    except ValueError as exc:
        fixing = spec.width_parameter_name()
        raise ValueError(f"{exc} (at the width {width} that {fixing} "
                         f"{tuple(named[fixing].shape)} gives" + (f"; {also})" if also else ")")
                         ) from None


def check_call(mixer: str, x, params, backend="auto") -> None:
    """Raises what a call of the mixer on x (no state keywords) would raise before anything
    runs: the checks that a caller of the kernels' phases alone, which check nothing, makes
    first (samu.distributed)."""
    spec = mixers.get(mixer)
    mixers.check_count(mixer, params)
    named = dict(zip(spec.parameter_names, params))
    check_shapes(mixer, spec, x, named)
    x = autocast_input(x)
    check_parameters(mixer, x, named)
    resolve_backend(mixer, x, backend)


def check_like(mixer: str, name: str, value, shape: tuple, device) -> None:
    """value a floating-point tensor of ``shape`` on ``device``: a tensor the kernels index as
    another's shape (a gradient, a state), which a wrong shape would have them read past."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{mixer}: {name} must be a torch.Tensor, got {type(value).__name__}")
    check_dense(mixer, value, name)
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{mixer}: {name} must have shape {list(shape)}, got "
                         f"{list(value.shape)}")
    if not value.is_floating_point():
        raise TypeError(f"{mixer}: {name} must be floating point, got {value.dtype}")
    if value.device != device:
        raise ValueError(f"{mixer}: {name} is on {value.device} but x is on {device}")


def check_op_inputs(mixer: str, backend: str, x, params, initial_state, cu_seqlens, resets,
                    output_final_state) -> int:
    """What the custom ops (samu.custom_ops) check before a kernel runs, called directly or from
    a compiled graph, once per signature: check_call, and the state keywords as an eager call
    checks them, cu_seqlens' values apart (samu::scan_forward reads them on every call,
    check_running_offsets); the number of sequences."""
    check_call(mixer, x, params, backend)
    return check_sequences(mixer, x, initial_state, cu_seqlens, output_final_state, resets,
                           offsets_values=False)


@runtime_checkable
class SplitContext(Protocol):
    """What a functional form's ``cp_context`` is: a context that runs the call over a sequence
    split across the ranks of a group (samu.distributed.CPContext, from build_cp_context)."""

    def mix(self, mixer: str, x, params, **keywords): ...


def cp_context_error(mixer: str, cp_context) -> TypeError:
    return TypeError(f"{mixer}: cp_context must be a CPContext from "
                     f"samu.distributed.build_cp_context, got {type(cp_context).__name__}")


# --- signatures whose checks passed ------------------------------------------------------------
# The entry points' checks read only what a signature fixes (types, shapes, dtypes, devices,
# layouts, the backend and the keywords): a call whose signature passed before skips them
# (samu.functional's _CHECKED, samu.custom_ops' own).

CHECKED_SIGNATURES = 4096  # per table; a full table starts again
_remembering = True  # checks_on_every_call turns it off for its block


def tensor_signature(t):
    return None if t is None else (t.__class__, t.shape, t.dtype, t.device, t.layout)


def remembering() -> bool:
    return _remembering


def call_signature(plain: tuple, tensors) -> tuple | None:
    """The key of a call whose checks read only ``plain`` (as it is) and ``tensors`` (each by
    tensor_signature; None allowed), or None where it cannot be one (inside
    checks_on_every_call, a traced call, an argument that is no tensor): such calls are checked
    every time."""
    if not _remembering or torch.compiler.is_compiling():
        return None
    try:
        return (*plain, *[tensor_signature(t) for t in tensors])
    except AttributeError:
        return None


def remember(table: dict, key, value=True) -> None:
    if len(table) >= CHECKED_SIGNATURES:
        table.clear()
    table[key] = value


@contextlib.contextmanager
def checks_on_every_call():
    """Within the block no call is remembered, so every call runs every check: what a call
    costs without the remembered signatures (benchmarks/host_budget.py)."""
    global _remembering
    before, _remembering = _remembering, False
    try:
        yield
    finally:
        _remembering = before

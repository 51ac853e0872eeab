"""The mixers' functional forms and their input checks (SPEC section 3).

Bad input raises an error that names the problem and touches nothing; the checks run before any
backend, so every backend refuses the same inputs with the same words.
"""
from __future__ import annotations

import torch

from . import dispatch


PARAMETER_NAMES = {
    "rglru": ("gate_x_weight", "gate_x_bias", "gate_a_weight", "gate_a_bias", "a_param"),
    "samu": ("ctrl_weight", "ctrl_bias", "a_param", "log_temp", "skip"),
}

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


def check_input(x, width: int, mixer: str) -> None:
    """Refuse bad input with a message naming the problem; touches nothing."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{mixer}: x must be a torch.Tensor, got {type(x).__name__}")
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


def _rglru_width(gate_x_weight: torch.Tensor) -> tuple[int, int]:
    if gate_x_weight.dim() != 3 or gate_x_weight.shape[1] != gate_x_weight.shape[2]:
        raise ValueError("rglru: gate_x_weight must have shape [heads, bw, bw], got "
                         f"{tuple(gate_x_weight.shape)}")
    heads, bw, _ = gate_x_weight.shape
    return heads, heads * bw


def autocast_input(x: torch.Tensor) -> torch.Tensor:
    """Under autocast, a float32 x enters as the autocast dtype, as a matmul would."""
    if x.dtype == torch.float32 and torch.is_autocast_enabled(x.device.type):
        return x.to(torch.get_autocast_dtype(x.device.type))
    return x


def _run(mixer: str, x, params: dict, backend: str):
    x = autocast_input(x)
    check_parameters(mixer, x, params)
    chosen = dispatch.resolve(mixer, x, backend)
    if chosen.kind == "triton" or not torch.is_autocast_enabled(x.device.type):
        # The kernels set every dtype themselves; entering autocast costs ~15 us of host time.
        return chosen.run(x, *params.values()), chosen.name
    with torch.autocast(x.device.type, enabled=False):
        return chosen.run(x, *params.values()), chosen.name

# The entry points are opaque to dynamo until the kernels are custom ops: tracing into the
# library fails (CUDA queries, Triton launches) and can leave launch caches half filled.  So
# torch.compile(fullgraph=True) raises at the call, and without fullgraph the graph breaks there
# and the mixer runs eagerly.  The wrapper costs ~0.5 us of host time per call.
_opaque_to_dynamo = torch.compiler.disable(
    reason="samu's mixers run eagerly: their Triton kernels are not custom ops yet")


@_opaque_to_dynamo
def rglru(x, gate_x_weight, gate_x_bias, gate_a_weight, gate_a_bias, a_param, backend="auto",
          return_backend: bool = False):
    """Functional RG-LRU. With return_backend=True returns (y, name of the backend that ran)."""
    params = dict(gate_x_weight=gate_x_weight, gate_x_bias=gate_x_bias,
                  gate_a_weight=gate_a_weight, gate_a_bias=gate_a_bias, a_param=a_param)
    check_tensors("rglru", params)
    heads, width = _rglru_width(gate_x_weight)
    check_input(x, width, "rglru")
    for name in ("gate_x_bias", "gate_a_bias", "a_param"):
        if params[name].shape != (width,):
            raise ValueError(f"rglru: {name} must have shape [{width}], got "
                             f"{tuple(params[name].shape)}")
    if gate_a_weight.shape != gate_x_weight.shape:
        raise ValueError("rglru: gate_a_weight and gate_x_weight must have the same shape")
    y, name = _run("rglru", x, params, backend)
    return (y, name) if return_backend else y


@_opaque_to_dynamo
def samu(x, ctrl_weight, ctrl_bias, a_param, log_temp, skip, backend="auto",
         return_backend: bool = False):
    """Functional SAMU. With return_backend=True returns (y, name of the backend that ran)."""
    params = dict(ctrl_weight=ctrl_weight, ctrl_bias=ctrl_bias, a_param=a_param,
                  log_temp=log_temp, skip=skip)
    check_tensors("samu", params)
    if ctrl_weight.dim() != 2 or ctrl_weight.shape[0] != 2:
        raise ValueError("samu: ctrl_weight must have shape [2, D], got "
                         f"{tuple(ctrl_weight.shape)}")
    width = ctrl_weight.shape[1]
    check_input(x, width, "samu")
    expected = {"ctrl_bias": (2,), "a_param": (width,), "log_temp": (), "skip": ()}
    for name, shape in expected.items():
        if tuple(params[name].shape) != shape:
            raise ValueError(f"samu: {name} must have shape {list(shape)}, got "
                             f"{list(params[name].shape)}")
    y, name = _run("samu", x, params, backend)
    return (y, name) if return_backend else y

FUNCTIONS = {"rglru": rglru, "samu": samu}

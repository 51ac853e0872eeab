"""What every Triton kernel family implements (samu/ops/<mixer>/<family>.py), written once:
samu.backends registers a family only after check_family, and the autograd.Function and backend
(samu.ops.common.function), the custom ops, context parallelism and the calibration file rely
on nothing else.

A family's configurations are frozen dataclasses: the name says the algorithm (chunk, what is
saved); the launch settings (warps, vector widths, register caps, carry plan) are tuning, not
in the name, so ``settings_digest`` names them, and a calibration entry recorded under other
settings is refused instead of silently standing for these."""
from __future__ import annotations

import hashlib
from typing import Any, Optional, Protocol, Sequence, runtime_checkable


@runtime_checkable
class KernelFamily(Protocol):
    MIXER: str  # the mixer (samu.mixers) the family implements
    CONFIGS: Sequence[Any]  # the registered configurations; each has .name and .launches()
    KERNELS: dict  # role -> the @triton.jit kernel launched in that role
    FEATURES: dict  # role -> the constexpr flags that specialise it (packing, state)
    LAUNCHES: dict  # chunk -> the launch settings that differ from the defaults

    # One rank's slice under context parallelism (samu.distributed) whose phases share their
    # work: SliceRun(x, params, config, resets=False) with fits(params, config), summary(),
    # forward(entering) and backward(dy, d_final, end_cotangent); None: the phases run apart.
    SliceRun: Optional[type]

    # -> (y, final, residuals); zero_gaps off: the residuals' padding may stay unwritten (an
    # autograd.Function's; a custom op's outputs must hold nothing uninitialised)
    def forward(self, x, params, sequences, config, zero_gaps: bool = True): ...
    # -> (dx, *parameter gradients, d initial state or None); spend_residuals: the backward may
    # write over the residuals (the caller then refuses a second backward, spent_residuals)
    def backward(self, x, params, residuals, dy, d_final, sequences, config,
                 spend_residuals: bool = False): ...
    # What backward(spend_residuals=True) writes its gradient over, said for an error (with
    # how to keep it), or None where it writes over nothing saved
    def spent_residuals(self, config) -> Optional[str]: ...
    def residual_specs(self, config, batch, length, width, dtype, params): ...
    def launch_plan(self, config, width, *args, **kwargs): ...
    # context parallelism's phases apart: (A, h) of a slice, and mu at a continued slice's start
    def slice_summary(self, x, params, config, initial_state=None, resets: bool = False): ...
    def start_adjoint(self, x, params, dy, d_end, config): ...


REQUIRED = ("MIXER", "CONFIGS", "KERNELS", "FEATURES", "LAUNCHES", "SliceRun", "forward",
            "backward", "spent_residuals", "residual_specs", "launch_plan", "slice_summary",
            "start_adjoint")


def check_family(module) -> None:
    """TypeError naming what a kernel family module lacks of KernelFamily."""
    missing = [name for name in REQUIRED if not hasattr(module, name)]
    if missing:
        raise TypeError(f"{module.__name__} is no kernel family: it lacks {', '.join(missing)} "
                        "(samu.ops.common.family.KernelFamily)")
    names = [config.name for config in module.CONFIGS]
    if len(set(names)) != len(names):
        raise TypeError(f"{module.__name__}: two configurations share a name: {names}")


def settings_digest(config) -> str:
    """12 hex digits of the configuration's every field (its launches included): equal exactly
    when the configuration is the same."""
    return hashlib.sha256(repr(config).encode()).hexdigest()[:12]

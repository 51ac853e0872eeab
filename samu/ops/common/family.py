"""What every Triton kernel family implements (samu/ops/<mixer>/<family>.py), written once:
samu.backends registers a family only after check_family, and the custom ops and the
calibration file rely on nothing else.

A family's configurations are frozen dataclasses: the name says the algorithm (chunk, what is
saved); the launch settings (warps, vector widths, register caps, carry plan) are tuning, not
in the name, so ``settings_digest`` names them, and a calibration entry recorded under other
settings is refused instead of silently standing for these."""
from __future__ import annotations

import hashlib
from typing import Any, Callable, Protocol, Sequence, runtime_checkable


@runtime_checkable
class KernelFamily(Protocol):
    MIXER: str  # the mixer (samu.mixers) the family implements
    CONFIGS: Sequence[Any]  # the registered configurations; each has .name and .launches()
    KERNELS: dict  # role -> the @triton.jit kernel launched in that role
    FEATURES: dict  # role -> the constexpr flags that specialise it (packing, state)
    LAUNCHES: dict  # chunk -> the launch settings that differ from the defaults

    def run_with(self, config) -> Callable: ...  # run(x, *params, **state) -> (y, final)
    def forward(self, x, params, sequences, config): ...  # -> (y, final, residuals)
    def backward(self, x, params, residuals, dy, d_final, sequences, config): ...
    def residual_specs(self, config, batch, length, width, dtype, params): ...
    def launch_plan(self, config, width, *args, **kwargs): ...


REQUIRED = ("MIXER", "CONFIGS", "KERNELS", "FEATURES", "LAUNCHES", "run_with", "forward",
            "backward", "residual_specs", "launch_plan")


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

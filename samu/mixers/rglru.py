"""RG-LRU's identity: block-diagonal per-channel gates (Griffin/Hawk)."""
from __future__ import annotations

from . import MixerSpec


def width_of(params: dict) -> int:
    w = params["gate_x_weight"]
    if w.dim() != 3 or w.shape[1] != w.shape[2]:
        raise ValueError(f"rglru: gate_x_weight must have shape [heads, bw, bw], got "
                         f"{tuple(w.shape)}")
    return w.shape[0] * w.shape[1]


def check_shapes(params: dict, width: int) -> None:
    for name in ("gate_x_bias", "gate_a_bias", "a_param"):
        if tuple(params[name].shape) != (width,):
            raise ValueError(f"rglru: {name} must have shape [{width}], got "
                             f"{tuple(params[name].shape)}")
    if params["gate_a_weight"].shape != params["gate_x_weight"].shape:
        raise ValueError("rglru: gate_a_weight and gate_x_weight must have the same shape")


SPEC = MixerSpec(
    name="rglru",
    label="RG-LRU",
    parameter_names=("gate_x_weight", "gate_x_bias", "gate_a_weight", "gate_a_bias", "a_param"),
    width_of=width_of,
    check_shapes=check_shapes,
    parameter_count=lambda width, num_heads: 2 * width * width // num_heads + 3 * width,
    dynamic_control_values_per_token=lambda width: 2 * width,
    reference="samu.ops.rglru.naive:rglru_reference",
    module="samu.modules:RGLRU",
    function="samu.functional:rglru",
    backward="samu.ops.rglru.backward:rglru_backward",
    kernel_families=("samu.ops.rglru.gemm",),
    # The gemm family was fastest at every shape measured on the H200 (docs/PERFORMANCE.md).
    default_backend="gemm_fused_hierarchical_chunk8",
    has_heads=True,
)

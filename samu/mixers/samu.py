"""SAMU's identity: two per-token scalars from an FP32 controller, shared by every channel."""
from __future__ import annotations

from .spec import MixerSpec, check_shape


FLOPS_PER_ELEMENT = 40 + 80


def width_of(params: dict) -> int:
    w = params["ctrl_weight"]
    if w.dim() != 2 or w.shape[0] != 2:
        raise ValueError(f"samu: ctrl_weight must have shape [2, D], got {tuple(w.shape)}")
    return w.shape[1]


def check_shapes(params: dict, width: int) -> None:
    for name, shape in {"ctrl_bias": (2,), "a_param": (width,), "log_temp": (),
                        "skip": ()}.items():
        check_shape("samu", params, name, shape)


SPEC = MixerSpec(
    name="samu",
    label="SAMU",
    parameter_names=("ctrl_weight", "ctrl_bias", "a_param", "log_temp", "skip"),
    width_of=width_of,
    width_parameter="ctrl_weight",
    check_shapes=check_shapes,
    parameter_count=lambda width, num_heads: 3 * width + 4,
    dynamic_control_values_per_token=lambda width: 2,
    reference="samu.ops.samu.naive:samu_reference",
    log_decay="samu.ops.samu.naive:log_decay",
    module="samu.modules:SAMU",
    function="samu.functional:samu",
    backward="samu.ops.samu.backward:samu_backward",
    kernel_families=("samu.ops.samu.chunk", "samu.ops.samu.single_pass"),
    default_backend="fused_controller_hierarchical_chunk16",
    # docs/PERFORMANCE.md, "The two numbers": ~40 forward (exp, sqrt, scan) + ~80 backward.
    flops_per_element=lambda width, num_heads: float(FLOPS_PER_ELEMENT),
    memory_budget_units=2.5,  # SPEC section 8
    colour="#55A868",
    baseline="rglru",  # the project's question: how much faster than RG-LRU
    controller="fp32_fused_coords",
    host_target_over_linear=1.0,
    eager_preparation="samu.ops.samu.naive:eager_controller",
    eager_preparation_name="eager_controller",
)

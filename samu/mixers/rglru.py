"""RG-LRU's identity: block-diagonal per-channel gates (Griffin/Hawk)."""
from __future__ import annotations

from .spec import MixerSpec


# docs/PERFORMANCE.md, "The two numbers": 8 bw forward (its gates) + ~28 bw backward, bw = D /
# heads the block width (36 bw = 4608 at bw = 128: the "~4600 FLOPs per element at D = 2048"
# there), plus its scans, which that table does not count apart, taken as SAMU's 120.
FLOPS_PER_BLOCK_WIDTH = 8 + 28
SCAN_FLOPS_PER_ELEMENT = 40 + 80


def flops_per_element(width: int, num_heads: int) -> float:
    return float(FLOPS_PER_BLOCK_WIDTH * width / num_heads + SCAN_FLOPS_PER_ELEMENT)


def width_of(params: dict) -> int:
    w = params["gate_x_weight"]
    if w.dim() != 3 or w.shape[1] != w.shape[2]:
        raise ValueError(f"rglru: gate_x_weight must have shape [heads, bw, bw], got "
                         f"{tuple(w.shape)}")
    return w.shape[0] * w.shape[1]


def check_shapes(params: dict, width: int) -> None:
    for name in ("gate_x_bias", "gate_a_bias", "a_param"):
        if tuple(params[name].shape) != (width,):
            raise ValueError(f"rglru: {name} must have shape ({width},), got "
                             f"{tuple(params[name].shape)}")
    if params["gate_a_weight"].shape != params["gate_x_weight"].shape:
        raise ValueError("rglru: gate_a_weight and gate_x_weight must have the same shape")


SPEC = MixerSpec(
    name="rglru",
    label="RG-LRU",
    parameter_names=("gate_x_weight", "gate_x_bias", "gate_a_weight", "gate_a_bias", "a_param"),
    width_of=width_of,
    width_parameter="gate_x_weight",
    check_shapes=check_shapes,
    parameter_count=lambda width, num_heads: 2 * width * width // num_heads + 3 * width,
    dynamic_control_values_per_token=lambda width: 2 * width,
    reference="samu.ops.rglru.naive:rglru_reference",
    log_decay="samu.ops.rglru.naive:log_decay",
    module="samu.modules:RGLRU",
    function="samu.functional:rglru",
    backward="samu.ops.rglru.backward:rglru_backward",
    kernel_families=("samu.ops.rglru.gemm", "samu.ops.rglru.single_pass"),
    # The gemm family was fastest at every shape measured on the H200 (docs/PERFORMANCE.md).
    default_backend="gemm_fused_hierarchical_chunk8",
    has_heads=True,
    heads_of=lambda params: params["gate_x_weight"].shape[0],
    flops_per_element=flops_per_element,
    memory_budget_units=3.0,  # SPEC section 8
    colour="#DD8452",
    host_target_over_linear=1.2,
    eager_preparation="samu.ops.rglru.naive:eager_gates",
    eager_preparation_name="eager_gates",
    flops_on_tensor_cores=True,  # its gates are GEMMs
)

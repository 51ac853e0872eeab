"""What the report knows of the hardware and the mixers' work: each GPU's copy bandwidth (the
floor's), its compute ceilings for the roofline, and FLOPs per element from the mixer specs."""
from __future__ import annotations

import math

from ... import mixers
from .. import protocol

# The memory bandwidth in NVIDIA's H800 PCIe datasheet (NVIDIA H800 Tensor Core GPU datasheet,
# H800 PCIe 80 GB): 2.0 TB/s.  The published H800 rows are judged against it (SPEC section 8).
PUBLISHED_H800_PCIE_BANDWIDTH = 2.0e12
# Each GPU's copy bandwidth, bytes read plus bytes written per second, by GPU slug: the H200's as
# measured by protocol.measure_copy_bandwidth, the H800 PCIe's from its datasheet.  A result row's
# own copy_bandwidth_bytes_per_s (written by notebook 03) takes precedence.
COPY_BANDWIDTH = {**protocol.COPY_BANDWIDTH, "nvidia-h800-pcie": PUBLISHED_H800_PCIE_BANDWIDTH}

# The roofline's compute ceilings, FLOP/s, by GPU slug.  BF16 tensor cores: ~790 TFLOP/s, the
# rate measured on the project's H200 (docs/PERFORMANCE.md's "~0.4 ms of tensor-core time" for
# RG-LRU at (1, 32768, 2048) is this rate).  FP32 without tensor cores: 67 TFLOP/s, the NVIDIA H200
# (SXM) datasheet's peak; SAMU's FLOPs (exp, sqrt, the scans) and RG-LRU's scans run there.  No
# compute ceiling is drawn for the H800 PCIe: none was measured.
COMPUTE_CEILINGS = {
    "nvidia-h200": [("BF16 tensor cores, measured", 790e12),
                    ("FP32 without tensor cores, datasheet", 67e12)],
}

# Result rows do not record the head count; the published result and this project's timing use
# 16 heads.
RGLRU_HEADS = 16


def flops_per_element(mixer: str, width: int, num_heads: int = RGLRU_HEADS) -> float:
    """Forward+backward FLOPs per element of [B, L, D], the mixer spec's count (samu.mixers);
    NaN where the spec has none."""
    count = mixers.get(mixer).flops_per_element
    return math.nan if count is None else count(width, num_heads)

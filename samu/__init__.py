"""samu: fused Triton kernels and exact references for RG-LRU and SAMU sequence mixers."""
from . import backends, reference
from .mixers import RGLRU, SAMU, parameter_count, dynamic_control_values_per_token, rglru, samu

__all__ = ["RGLRU", "SAMU", "rglru", "samu", "backends", "reference", "parameter_count",
           "dynamic_control_values_per_token"]
__version__ = "0.1.0"

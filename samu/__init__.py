"""samu: fused Triton kernels and exact references for RG-LRU and SAMU sequence mixers."""
from . import backends
from .functional import rglru, samu
from .modules import RGLRU, SAMU, dynamic_control_values_per_token, parameter_count

__all__ = ["RGLRU", "SAMU", "rglru", "samu", "backends", "parameter_count",
           "dynamic_control_values_per_token"]
__version__ = "0.1.0"

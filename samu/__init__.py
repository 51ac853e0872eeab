"""samu: fused Triton kernels and exact references for RG-LRU and SAMU sequence mixers."""
from . import backends
from .dispatch import calibration_source, set_calibration_dir
from .functional import rglru, samu
from .modules import RGLRU, SAMU, dynamic_control_values_per_token, parameter_count

__all__ = ["RGLRU", "SAMU", "rglru", "samu", "backends", "parameter_count",
           "dynamic_control_values_per_token", "set_calibration_dir", "calibration_source"]
__version__ = "0.1.0"

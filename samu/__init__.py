"""samu: fused Triton kernels and exact references for RG-LRU and SAMU sequence mixers.

``samu.distributed`` (context parallelism) and ``samu.integrations`` (other libraries' models)
are imported on first use as attributes, so that ``import samu`` imports neither
``samu.distributed`` nor transformers."""
from . import _runtime, backends
from .dispatch import calibration_source, set_calibration_dir
from .functional import rglru, samu
from .modules import RGLRU, SAMU, dynamic_control_values_per_token, parameter_count

__all__ = ["RGLRU", "SAMU", "rglru", "samu", "backends", "parameter_count",
           "dynamic_control_values_per_token", "set_calibration_dir", "calibration_source"]
__version__ = "0.1.0"

# Submodules imported when first read as attributes (PEP 562).
SUBMODULES = ("distributed", "integrations")

__getattr__, __dir__ = _runtime.lazy_submodules(__name__, SUBMODULES, globals())

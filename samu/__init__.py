"""samu: fused Triton kernels and exact references for RG-LRU and SAMU sequence mixers.

``samu.distributed`` (context parallelism) and ``samu.integrations`` (other libraries' models)
are imported on first use as attributes, so that ``import samu`` imports neither
``samu.distributed`` nor transformers."""
from . import backends
from .dispatch import calibration_source, set_calibration_dir
from .functional import rglru, samu
from .modules import RGLRU, SAMU, dynamic_control_values_per_token, parameter_count

__all__ = ["RGLRU", "SAMU", "rglru", "samu", "backends", "parameter_count",
           "dynamic_control_values_per_token", "set_calibration_dir", "calibration_source"]
__version__ = "0.1.0"

# Submodules imported when first read as attributes (PEP 562).
LAZY_SUBMODULES = ("distributed", "integrations")


def __getattr__(name: str):
    if name in LAZY_SUBMODULES:
        import importlib
        return importlib.import_module(f".{name}", __name__)  # binds it here too
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(LAZY_SUBMODULES))

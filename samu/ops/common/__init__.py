"""Triton pieces shared by both mixers' kernels, split by concern: per-element math,
the scan inside a chunk, the carry across chunks, the gradient reduction, and launching."""
from . import interpreter  # noqa: F401  (speeds up the interpreter's scans when it runs)

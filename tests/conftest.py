"""Kernel tests run on CUDA when there is one, else under Triton's interpreter (set before samu
is imported, which is why it is set here)."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

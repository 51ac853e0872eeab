"""Kernel tests run on CUDA when there is one, else under Triton's interpreter (set before samu
is imported, which is why it is set here)."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def one_thread():
    """One CPU thread for the tiny training models: more threads only contend."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

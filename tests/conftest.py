"""Kernel tests run on CUDA when there is one, else under Triton's interpreter (set before samu
is imported, which is why it is set here)."""
import os
import warnings

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# torch loads its forward-mode AD decompositions at a process's first jvp, each through
# torch.jit.script, which warns that it is deprecated: 18 warnings a process, none about samu.
# Loaded here with that warning silenced; any other use of torch.jit.script still warns.
_load_jvp_decompositions = getattr(torch.autograd.forward_ad, "_maybe_load_decompositions", None)
if _load_jvp_decompositions is not None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`torch.jit.script` is deprecated", DeprecationWarning)
        _load_jvp_decompositions()

# Under pytest-xdist each worker gets its share of the cores.  With torch's default (every core
# per process) the workers' OpenMP threads oversubscribe the machine, and a test of many tiny
# CPU ops (the float64 reference scans) then spends its time in barriers: 0.2 s alone, over
# 100 s with 16 workers on a 16-core GPU machine.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
if _workers > 1:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch.set_num_threads(max(1, (_cores or 1) // _workers))


@pytest.fixture
def one_thread():
    """One CPU thread for the tiny training models: more threads only contend."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

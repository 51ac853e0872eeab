"""The features benchmark (samu.experiment.features): packing and decode timings, on the CPU
under Triton's interpreter (tests/conftest.py), where no GPU figure exists."""
import pytest
import torch

import samu
from samu import backends
from samu.experiment import features
from samu import mixers

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("mixer", mixers.names())
def test_decode_rows_take_the_one_launch_step(mixer):
    # Two batch sizes, one step timed: interpreted, an RG-LRU step runs 16 heads' programs a row.
    rows = features.time_steps(mixer, backends.DEFAULTS[mixer], 32, [1, 2], DEVICE, steps=1)
    assert [r["batch"] for r in rows] == [1, 2]
    for r in rows:
        assert r["one_launch"] and r["backend"] == f"{mixer} step kernel"
        assert r["host_us_per_step"] > 0
        if DEVICE == "cpu":  # no GPU time and no Linear beside it on a CPU
            assert r["gpu_us_per_step"] is None and r["step_over_linear"] is None
        else:
            assert r["gpu_us_per_step"] > 0 and r["step_over_linear"] > 0


def test_a_reference_backend_steps_through_the_forward():
    (row,) = features.time_steps("samu", "reference_chunked", 16, [2], "cpu", steps=2)
    assert not row["one_launch"] and row["backend"] == "reference_chunked"


def test_packing_times_the_layouts_and_the_state_keywords():
    out = features.time_packing("samu", backends.DEFAULTS["samu"], 24, 16, DEVICE, count=3,
                                samples=1)
    assert sum(out["lengths"]) == 24 and len(out["lengths"]) == 3
    for name in ("packed", "unpacked", "one_by_one", "with_states"):
        assert out[name]["forward_backward_median_ms"] > 0
    assert features.random_offsets(24, 3)[0] == 0 and features.random_offsets(24, 3)[-1] == 24


@pytest.mark.parametrize("backend", ["reference_chunked", backends.DEFAULTS["samu"]])
def test_with_states_takes_both_state_gradients(backend):
    """The with_states variant runs the initial-state and final-state-gradient paths (the
    kernels' on a Triton backend): the initial state's gradient and dx equal the float64
    reference's with dy[:, -1] on the final state."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    module = samu.SAMU(8, backend=backend).to(device)
    x = torch.randn(1, 6, 8, device=device, requires_grad=True)
    h0 = torch.randn(1, 8, device=device)
    wrapped = features.WithStates(module, h0.clone())
    wrapped(x).sum().backward()
    oracle = samu.SAMU(8, backend="reference_chunked").to(device).double()
    oracle.load_state_dict(module.state_dict())
    x64 = x.detach().double().requires_grad_()
    state = h0.double().requires_grad_()
    y, final = oracle(x64, initial_state=state, output_final_state=True)
    (y.sum() + final.sum()).backward()
    assert wrapped.initial_state.grad is not None
    torch.testing.assert_close(wrapped.initial_state.grad.double(), state.grad, atol=1e-4,
                               rtol=1e-4)
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=1e-4, rtol=1e-4)

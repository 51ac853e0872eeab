"""The sequential and chunked reference scans agree, in float64, at any length."""
import pytest
import torch

from samu.modules import MODULES
from samu.ops import REFERENCES, recurrence
from samu.ops.rglru import naive as rglru_naive


def _params(mixer, width, seed):
    gen = torch.Generator().manual_seed(seed)
    module = MODULES[mixer](width)
    module.reset_parameters(generator=gen)
    params = [p.detach().double() for p in module.parameters()]
    if mixer == "samu":  # non-zero temperature and skip so that both are exercised
        params[3] = torch.tensor(0.3, dtype=torch.float64)
        params[4] = torch.tensor(-0.7, dtype=torch.float64)
    return params


@pytest.mark.parametrize("mixer", ["rglru", "samu"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("length", [1, 7, 64, 1000])
@pytest.mark.parametrize("width", [16, 32, 48])
def test_chunked_matches_sequential(mixer, batch, length, width):
    gen = torch.Generator().manual_seed(batch * 1000 + length + width)
    x = torch.randn(batch, length, width, generator=gen, dtype=torch.float64)
    params = _params(mixer, width, length)
    fn = REFERENCES[mixer]
    seq = fn(x, *params, scan="sequential")
    chunked = fn(x, *params, scan="chunked")
    assert seq.dtype == torch.float64
    assert torch.isfinite(seq).all()
    assert ((chunked - seq).norm() / seq.norm()).item() < 1e-12


@pytest.mark.parametrize("chunk", [1, 2, 5, 16, 64])
def test_scan_chunked_any_chunk(chunk):
    gen = torch.Generator().manual_seed(chunk)
    a = torch.rand(2, 50, 8, generator=gen, dtype=torch.float64)
    u = torch.randn(2, 50, 8, generator=gen, dtype=torch.float64)
    seq = recurrence.scan_sequential(a, u)
    assert torch.allclose(recurrence.scan_chunked(a, u, chunk=chunk), seq, rtol=1e-13, atol=1e-14)


def test_scan_matches_explicit_sum():
    """h_t = sum_s (prod_{s<r<=t} a_r) u_s, straight from the definition."""
    gen = torch.Generator().manual_seed(1)
    a = torch.rand(1, 9, 3, generator=gen, dtype=torch.float64)
    u = torch.randn(1, 9, 3, generator=gen, dtype=torch.float64)
    want = torch.zeros_like(u)
    for t in range(9):
        for s in range(t + 1):
            want[:, t] += torch.prod(a[:, s + 1:t + 1], dim=1) * u[:, s]
    assert torch.allclose(recurrence.scan_sequential(a, u), want, rtol=1e-13)


def test_state_resets_at_first_token():
    """m_0 = 1 and h_{-1} = 0: y_0 = gate_0 * x_0 exactly, whatever a_0 is."""
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    params = _params("rglru", 16, 0)
    y = REFERENCES["rglru"](x, *params, scan="sequential")
    gx = torch.sigmoid(rglru_naive.block_diagonal(x, params[0], params[1]))
    assert torch.allclose(y[:, 0], gx[:, 0] * x[:, 0], rtol=1e-14)


def test_bounded_sqrt_derivative():
    v = torch.tensor([0.0, 1e-9, 0.25, 1.0], dtype=torch.float64, requires_grad=True)
    recurrence.BoundedSqrt.apply(v).sum().backward()
    want = 1.0 / torch.sqrt(torch.clamp(4 * v.detach(), min=1e-6))
    assert torch.allclose(v.grad, want)
    assert v.grad[0].item() == pytest.approx(1000.0)


def test_no_gradient_through_first_transition():
    """Nothing flows into a_0's inputs: dy at t = 0 alone gives no a_param gradient."""
    x = torch.randn(1, 4, 16, dtype=torch.float64)
    params = [p.requires_grad_() for p in _params("rglru", 16, 0)]
    y = REFERENCES["rglru"](x, *params, scan="sequential")
    y[:, 0].sum().backward()
    assert params[4].grad.abs().max().item() == 0.0
    assert params[2].grad.abs().max().item() == 0.0


def test_low_precision_policy():
    """BF16 in and out, FP32 carry: close to the float64 result from the same rounded x."""
    x = torch.randn(2, 40, 32).to(torch.bfloat16)
    for mixer in ("rglru", "samu"):
        params = [p.float() for p in _params(mixer, 32, 2)]
        y = REFERENCES[mixer](x, *params)
        y64 = REFERENCES[mixer](x.double(), *[p.double() for p in params])
        assert y.dtype == torch.bfloat16
        assert ((y.double() - y64).norm() / y64.norm()).item() < 1e-2

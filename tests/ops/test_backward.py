"""The hand-derived backward formulas equal autograd on the float64 reference."""
import pytest
import torch

from samu.functional import PARAMETER_NAMES
from samu.mixers import BACKWARDS, REFERENCES
from samu.ops import recurrence

from test_recurrence import _params
from samu import mixers


@pytest.mark.parametrize("mixer", mixers.names())
@pytest.mark.parametrize("shape", [(1, 1, 16), (3, 7, 32), (1, 64, 48), (3, 1000, 16)])
@pytest.mark.parametrize("scan", ["sequential", "chunked"])
def test_formulas_match_autograd(mixer, shape, scan):
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=gen, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(*shape, generator=gen, dtype=torch.float64)
    params = [p.requires_grad_() for p in _params(mixer, shape[2], shape[1])]
    y = REFERENCES[mixer](x, *params, scan="sequential")
    auto = torch.autograd.grad(y, [x, *params], dy)
    manual = BACKWARDS[mixer](x.detach(), dy, *[p.detach() for p in params], scan=scan)
    for name, want in zip(["x", *PARAMETER_NAMES[mixer]], auto):
        got = manual[name]
        assert got.shape == want.shape, name
        scale = want.norm().item()
        err = (got - want).norm().item()
        assert err <= 1e-12 * max(scale, 1e-300) or err < 1e-14, (name, err, scale)


def test_reverse_scan_definition():
    gen = torch.Generator().manual_seed(3)
    a = torch.rand(2, 11, 4, generator=gen, dtype=torch.float64)
    dy = torch.randn(2, 11, 4, generator=gen, dtype=torch.float64)
    want = torch.zeros_like(dy)
    nxt = torch.zeros_like(dy[:, 0])
    for t in reversed(range(11)):
        nxt = dy[:, t] + (a[:, t + 1] * nxt if t + 1 < 11 else 0)
        want[:, t] = nxt
    for scan in ("sequential", "chunked"):
        assert torch.allclose(recurrence.reverse_scan(a, dy, scan), want, rtol=1e-13)

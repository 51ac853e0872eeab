"""The sequential and chunked reference scans agree, in float64, at any length."""
import pytest
import torch

from samu.modules import MODULES
from samu.mixers import REFERENCES
from samu.ops import recurrence
from samu.ops.rglru import naive as rglru_naive
from samu import mixers


def _params(mixer, width, seed):
    gen = torch.Generator().manual_seed(seed)
    module = MODULES[mixer](width)
    module.reset_parameters(generator=gen)
    params = [p.detach().double() for p in module.parameters()]
    if mixer == "samu":  # non-zero temperature and skip so that both are exercised
        params[3] = torch.tensor(0.3, dtype=torch.float64)
        params[4] = torch.tensor(-0.7, dtype=torch.float64)
    return params


@pytest.mark.parametrize("mixer", mixers.names())
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
    recurrence.BoundedSqrt.apply(v).sum().backward()  # the derivation notebook's spelling
    want = 1.0 / torch.sqrt(torch.clamp(4 * v.detach(), min=1e-6))
    assert torch.allclose(v.grad, want)
    assert v.grad[0].item() == pytest.approx(1000.0)


BOUNDED_SQRT_POINTS = [0.0, 1e-9, 2.4e-7, 2.5e-7, 2.6e-7, 1e-3, 0.25, 1.0]


def test_bounded_sqrt_value_is_sqrt_exactly():
    v = torch.tensor(BOUNDED_SQRT_POINTS, dtype=torch.float64)
    assert torch.equal(recurrence.bounded_sqrt(v), torch.sqrt(v))
    v32 = torch.rand(1000, generator=torch.Generator().manual_seed(0))
    assert torch.equal(recurrence.bounded_sqrt(v32), torch.sqrt(v32))


def test_bounded_sqrt_under_torch_func():
    """Forward mode (jvp), vmap of grad and double backward all see the bounded derivative
    1/sqrt(max(4v, 1e-6)), and its own derivative."""
    v = torch.tensor(BOUNDED_SQRT_POINTS, dtype=torch.float64)
    want = 1.0 / torch.sqrt(torch.clamp(4 * v, min=1e-6))
    _, tangent = torch.func.jvp(recurrence.bounded_sqrt, (v,), (torch.ones_like(v),))
    torch.testing.assert_close(tangent, want, rtol=1e-15, atol=0)
    per_element = torch.func.vmap(torch.func.grad(recurrence.bounded_sqrt))(v)
    torch.testing.assert_close(per_element, want, rtol=1e-15, atol=0)
    second = torch.func.vmap(torch.func.grad(torch.func.grad(recurrence.bounded_sqrt)))(v)
    want_second = torch.where(4 * v >= 1e-6, -0.25 * torch.clamp(v, min=2.5e-7) ** -1.5,
                              torch.zeros_like(v))
    torch.testing.assert_close(second, want_second, rtol=1e-12, atol=0)


def test_default_chunk_is_a_power_of_two_at_least_sqrt_length():
    for length in range(1, 300):
        chunk = recurrence.default_chunk(length)
        assert chunk & (chunk - 1) == 0
        assert chunk * chunk >= length and (chunk == 1 or (chunk // 2) ** 2 < length)


def test_chunked_scan_compiles_for_symbolic_lengths():
    """torch.compile with dynamic=True traces the chunked scan, starts folded in, with a
    symbolic length: one graph per range 4^k < L <= 4^(k+1), each equal to the sequential
    scan."""
    from torch._dynamo.testing import CompileCounter

    def scan(a, u, starts, entering):
        return recurrence.scan_chunked(a, u, starts, entering)

    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(scan, fullgraph=True, dynamic=True, backend=counter)
    gen = torch.Generator().manual_seed(5)
    try:
        for length in (5, 7, 8, 13, 16, 17, 40, 64):
            a = torch.rand(2, length, 3, generator=gen, dtype=torch.float64)
            u = torch.randn(2, length, 3, generator=gen, dtype=torch.float64)
            starts = torch.rand(2, length, generator=gen) < 0.2
            starts[:, 0] = True
            entering = torch.randn(2, length, 3, generator=gen, dtype=torch.float64)
            want = recurrence.scan_sequential(a, u, starts, entering)
            torch.testing.assert_close(compiled(a, u, starts, entering), want, rtol=1e-12,
                                       atol=1e-13)
    finally:
        torch._dynamo.reset()
    assert counter.frame_count == 2  # 5 to 16, then 17 to 64


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
    for mixer in mixers.names():
        params = [p.float() for p in _params(mixer, 32, 2)]
        y = REFERENCES[mixer](x, *params)
        y64 = REFERENCES[mixer](x.double(), *[p.double() for p in params])
        assert y.dtype == torch.bfloat16
        assert ((y.double() - y64).norm() / y64.norm()).item() < 1e-2


class _ElementsWritten(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the elements of every tensor the aten ops return: the work a backward does,
    independent of the machine's speed and load."""

    def __init__(self):
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.elements += sum(t.numel() for t in torch.utils._pytree.tree_leaves(out)
                             if isinstance(t, torch.Tensor))
        return out


@pytest.mark.parametrize("mixer", mixers.names())
def test_reference_backward_work_is_linear_in_length(mixer):
    """The chunked reference's backward writes a bounded number of elements per token: 16x the
    tokens is at most 1.25 x 16 the work (a per-position slice's backward, a zero-filled tensor
    of the full size per position, made it grow as L^1.5: 2.7x per token from 1k to 16k)."""
    params = [p.float().requires_grad_() for p in _params(mixer, 16, 0)]

    def backward_elements(length):
        x = torch.randn(1, length, 16, requires_grad=True)
        y = REFERENCES[mixer](x, *params, scan="chunked")
        counter = _ElementsWritten()
        with counter:
            y.sum().backward()
        return counter.elements

    short, long = backward_elements(256), backward_elements(4096)
    assert long <= 1.25 * 16 * short, (short, long)


@pytest.mark.parametrize("mixer", mixers.names())
def test_chunked_reference_gradients_equal_oracle(mixer):
    """Autograd through the chunked scan, packed and from initial states, equals autograd through
    the float64 sequential scan (the oracle) for x, every parameter and h0."""
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(1, 300, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(3, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    cu_seqlens = torch.tensor([0, 37, 38, 300], dtype=torch.int32)
    dy = torch.randn(1, 300, 16, generator=gen, dtype=torch.float64)
    params = [p.requires_grad_() for p in _params(mixer, 16, 1)]
    grads = {}
    for scan in ("sequential", "chunked"):
        y = REFERENCES[mixer](x, *params, scan=scan, initial_state=h0, cu_seqlens=cu_seqlens)
        grads[scan] = torch.autograd.grad(y, [x, h0, *params], dy)
    for want, got in zip(grads["sequential"], grads["chunked"]):
        torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-12)


def test_forward_mode_ad_prints_no_torchscript_deprecation(tmp_path):
    """A pytest run whose first jvp is here prints none of the 18 torch.jit.script deprecation
    warnings torch gives while loading its forward-mode decompositions (tests/conftest.py)."""
    import subprocess
    import sys
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
         "-W", "always::DeprecationWarning",
         f"{__file__}::test_bounded_sqrt_under_torch_func"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    assert "torch.jit.script" not in done.stdout + done.stderr


@pytest.mark.parametrize("chunk", [1, 3, 4, 16])
def test_a_cut_stops_a_nan_in_the_chunked_scan_as_in_the_sequential(chunk):
    """A start folded in as a = 0 cuts by selection: a NaN or infinity before it stays before it
    (0 * NaN is NaN), at any chunk, whether the cut falls inside a chunk or on its edge; finite
    values are the sequential scan's to the last bit of what they were before."""
    torch.manual_seed(0)
    a, u = torch.rand(2, 13, 4) * 0.9 + 0.05, torch.randn(2, 13, 4)
    u[0, 2, 1], u[1, 4, 0] = float("nan"), float("inf")
    starts = torch.zeros(2, 13, dtype=torch.bool)
    starts[:, 0] = True
    starts[0, 6], starts[1, 8] = True, True
    entering = torch.zeros(2, 13, 4)
    want = recurrence.scan_sequential(a, u, starts, entering)
    got = recurrence.scan_chunked(a, u, starts, entering, chunk=chunk)
    assert torch.isfinite(got[0, 6:]).all() and torch.isfinite(got[1, 8:]).all()
    assert not torch.isfinite(got[0, 2:6, 1]).any()
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got))
    torch.testing.assert_close(got[finite], want[finite])

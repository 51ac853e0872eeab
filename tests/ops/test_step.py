"""The one-launch decode step (samu.ops.samu.step, samu.ops.rglru.step) behind Module.step:
against the float64 oracle, against the forward, when it runs and when the forward runs
instead, and its errors.  On a CPU the kernels run under Triton's interpreter (conftest) at tiny
sizes."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from samu import backends
from samu.functional import FUNCTIONS
from samu.modules import MODULES
from samu.ops.common import launching
from samu import mixers

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MIXERS = tuple(mixers.names())
STEP_KERNELS = {"samu": "_samu_step_kernel", "rglru": "_rglru_step_kernel"}


def _module(mixer, width, heads=None, seed=0):
    """A module on the default Triton backend, every parameter away from its initial zeros."""
    kw = {} if mixer == "samu" else dict(num_heads=heads)
    module = MODULES[mixer](width, backend=backends.DEFAULTS[mixer], **kw)
    gen = torch.Generator().manual_seed(seed)
    module.reset_parameters(generator=gen)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias") or name in ("skip", "log_temp"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
    return module.to(DEVICE)


def _inputs(shape, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(device=DEVICE, dtype=dtype)


def _oracle(module, x, state=None):
    """(y, final state) of the float64 reference scan over x [B, L, D]."""
    params = [p.detach().double() for p in module._parameters_in_order()]
    return FUNCTIONS[module.mixer](x.double(), *params, backend="reference_sequential",
                                   initial_state=None if state is None else state.double(),
                                   output_final_state=True)


def _eager(module, x, state=None):
    """(y, final state) of the eager reference in x's dtype: the rounding the bound allows."""
    params = [p.detach() for p in module._parameters_in_order()]
    return FUNCTIONS[module.mixer](x, *params, backend="reference_chunked", initial_state=state,
                                   output_final_state=True)


def _error(got, want):
    return ((got.double() - want).norm() / want.norm()).item()


def _assert_oracle_close(got, want, eager, what):
    """SPEC section 4's rule, with a slack for FP32: at most 2x the eager reference's error."""
    err, bound = _error(got, want), 2 * _error(eager, want) + 1e-6
    assert err <= bound, f"{what}: error {err:.2e} > {bound:.2e}"


@pytest.fixture
def launches(monkeypatch):
    """The names of the kernels launched, in order (every kernel goes through launching.launch)."""
    names = []
    real = launching.launch

    def spy(kernel, grid, *args, **meta):
        names.append(kernel.fn.__name__)
        real(kernel, grid, *args, **meta)

    monkeypatch.setattr(launching, "launch", spy)
    return names


# SAMU: widths under one block, not a multiple of it, and over several blocks (cut into parts
# while the batch is small).  RG-LRU: one head, a non-power-of-two head width, a head wider
# than the channels of one program.
CASES = [("samu", 16, None), ("samu", 40, None), ("samu", 1030, None),
         ("rglru", 16, 1), ("rglru", 40, 4), ("rglru", 64, 4), ("rglru", 80, 1)]


@pytest.mark.parametrize("mixer, width, heads", CASES)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("with_state", [False, True], ids=["first_token", "state"])
def test_step_matches_the_oracle(mixer, width, heads, batch, dtype, with_state, launches):
    module = _module(mixer, width, heads, seed=width + batch)
    x = _inputs((batch, 1, width), seed=batch, dtype=dtype)
    state = _inputs((batch, width), seed=7) if with_state else None
    with torch.no_grad():
        y, new_state = module.step(x[:, 0], state)
        want_y, want_state = _oracle(module, x, state)
        eager_y, eager_state = _eager(module, x, state)
    assert launches == [STEP_KERNELS[mixer]]
    assert y.dtype == dtype and y.shape == (batch, width)
    assert new_state.dtype == torch.float32 and new_state.shape == (batch, width)
    _assert_oracle_close(y, want_y[:, 0], eager_y[:, 0], "y")
    _assert_oracle_close(new_state, want_state, eager_state, "state")


@pytest.mark.parametrize("mixer, width, heads", [("samu", 40, None), ("rglru", 40, 4)])
def test_steps_equal_one_forward(mixer, width, heads, launches):
    """A loop of steps from no state is the forward over the sequence; a prefill's final
    state followed by steps is too (x[:, t], rows of a [B, L, D] tensor, read in place)."""
    module = _module(mixer, width, heads, seed=3)
    x = _inputs((2, 6, width), seed=4)
    want_y, want_state = _oracle(module, x)
    eager_y, eager_state = _eager(module, x)
    with torch.no_grad():
        state, ys = None, []
        for t in range(x.shape[1]):
            y_t, state = module.step(x[:, t], state)
            ys.append(y_t)
        assert launches == [STEP_KERNELS[mixer]] * x.shape[1]
        _assert_oracle_close(torch.stack(ys, 1), want_y, eager_y, "y")
        _assert_oracle_close(state, want_state, eager_state, "state")
        prefix, state = module(x[:, :4], output_final_state=True)
        ys = [prefix]
        for t in range(4, x.shape[1]):
            y_t, state = module.step(x[:, t], state)
            ys.append(y_t[:, None])
    _assert_oracle_close(torch.cat(ys, 1), want_y, eager_y, "prefill then steps: y")
    _assert_oracle_close(state, want_state, eager_state, "prefill then steps: state")


class _Ops(TorchDispatchMode):
    """The aten ops run on the host."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


VIEWS = {"slice", "unsqueeze", "select", "view", "alias", "as_strided"}


@pytest.mark.parametrize("mixer, width, heads", [("samu", 40, None), ("rglru", 40, 4)])
def test_no_grad_step_allocates_only_its_outputs(mixer, width, heads, monkeypatch):
    module = _module(mixer, width, heads)
    x = _inputs((2, 5, width), seed=1)
    state = _inputs((2, width), seed=2)
    launched = []
    monkeypatch.setattr(launching, "launch", lambda kernel, *a, **k: launched.append(kernel))
    with torch.no_grad(), _Ops() as mode:
        module.step(x[:, 2], state)
    assert len(launched) == 1
    assert [op for op in mode.ops if op not in VIEWS] == ["empty", "empty"], mode.ops


@pytest.mark.parametrize("mixer, width, heads", [("samu", 16, None), ("rglru", 16, 2)])
def test_autograd_takes_the_forward(mixer, width, heads, launches):
    """With a gradient to record the forward runs (its kernels, not the step's) and the
    gradients flow; under no_grad, or with nothing requiring grad, the step kernel runs."""
    module = _module(mixer, width, heads)
    x = _inputs((2, width), seed=5)
    state = _inputs((2, width), seed=6)
    y, new_state = module.step(x, state)
    assert STEP_KERNELS[mixer] not in launches and launches
    assert y.requires_grad and new_state.requires_grad
    (y.square().sum() + new_state.sum()).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in module.parameters())
    h0 = state.clone().requires_grad_()
    with torch.no_grad():
        launches.clear()
        want_y, want_state = module.step(x, state)
        assert launches == [STEP_KERNELS[mixer]]
        launches.clear()
        module.step(x, h0)  # requires_grad, but no_grad records nothing
        assert launches == [STEP_KERNELS[mixer]]
    assert torch.allclose(y.detach(), want_y, atol=1e-5, rtol=1e-5)
    assert torch.allclose(new_state.detach(), want_state, atol=1e-5, rtol=1e-5)
    module.requires_grad_(False)
    launches.clear()
    module.step(x, state)  # grad mode, nothing requires grad
    assert launches == [STEP_KERNELS[mixer]]


def test_reference_backend_and_float64_take_the_forward(launches):
    module = _module("samu", 16)
    x = _inputs((2, 16), seed=1)
    with torch.no_grad():
        module.backend = "auto"
        module.step(x.double(), None)  # the oracle's dtype: auto runs the reference
        assert module.last_backend == "reference_chunked"
        module.backend = "reference_sequential"
        module.step(x, None)
        assert module.last_backend == "reference_sequential"
    assert launches == []


@pytest.mark.parametrize("mixer, width, heads", [("samu", 40, None), ("rglru", 40, 4)])
def test_layouts_the_kernel_cannot_read_are_copied(mixer, width, heads):
    """Columns apart in memory, and rows at an address off 16 bytes, are copied first; a
    float64 state is cast, as the forward casts an initial state."""
    module = _module(mixer, width, heads)
    x = _inputs((3, width), seed=8)
    state = _inputs((3, width), seed=9)
    with torch.no_grad():
        want_y, want_state = module.step(x, state)
        columns = x.t().contiguous().t()
        flat = torch.empty(3 * width + 1, device=DEVICE)
        shifted = flat[1:].view(3, width)
        shifted.copy_(x)
        assert shifted.data_ptr() % 16 and columns.stride(1) != 1
        for x_t, h0 in ((columns, state), (shifted, state), (x, state.double())):
            y, new_state = module.step(x_t, h0)
            assert torch.equal(y, want_y) and torch.equal(new_state, want_state)


def test_autocast_enters_as_bf16(launches):
    module = _module("samu", 40)
    x = _inputs((2, 40), seed=3)
    with torch.no_grad(), torch.autocast(DEVICE, dtype=torch.bfloat16):
        y, state = module.step(x, None)
    assert launches == [STEP_KERNELS["samu"]]
    assert y.dtype == torch.bfloat16 and state.dtype == torch.float32
    with torch.no_grad():
        want_y, want_state = module.step(x.to(torch.bfloat16), None)
    assert torch.equal(y, want_y) and torch.equal(state, want_state)


BAD_STEPS = [
    (lambda x, s: (x[None], s), ValueError, r"step takes x_t of shape \[batch, width\]"),
    (lambda x, s: (x.tolist(), s), TypeError, "x_t must be a torch.Tensor, got list"),
    (lambda x, s: (x[:, :8], s), ValueError, "x_t has width 8 but the mixer's width is 16"),
    (lambda x, s: (x.int(), s), TypeError, "dtype"),
    (lambda x, s: (x, s[:1]), ValueError, r": state must have shape \[2, 16\]"),
    (lambda x, s: (x, s[:, :8]), ValueError, r": state must have shape \[2, 16\]"),
    (lambda x, s: (x, s.long()), TypeError, "floating point"),
    (lambda x, s: (x, s.tolist()), TypeError, ": state must be a torch.Tensor"),
    (lambda x, s: (x, s.to("meta")), ValueError, "state is on meta but x_t is on"),
]


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("make, error, words", BAD_STEPS)
def test_bad_input_is_refused_clearly(mixer, make, error, words, launches):
    """The step kernel's path refuses bad input with the forward's words, before any launch."""
    module = _module(mixer, 16, heads=2)
    x_t, state = make(_inputs((2, 16), seed=0), _inputs((2, 16), seed=1))
    with torch.no_grad(), pytest.raises(error, match=words):
        module.step(x_t, state)
    assert launches == []
    with pytest.raises(error, match=words):  # the forward's path, with autograd
        module.step(x_t, state)


@pytest.mark.parametrize("mixer", MIXERS)
def test_a_signature_that_passed_is_not_checked_again_and_a_new_one_is(mixer, monkeypatch):
    """A decode loop pays for step's checks once per signature, as forward calls do; a bad
    input after a good one is still refused, and checks_on_every_call checks every call."""
    from samu import checks, modules
    monkeypatch.setattr(modules, "_STEP_CHECKED", {})  # whatever earlier tests remembered
    calls = []
    real = modules.check_sequences
    monkeypatch.setattr(modules, "check_sequences",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    module = _module(mixer, 16, heads=2)
    x, state = _inputs((2, 16), seed=0), _inputs((2, 16), seed=1)
    with torch.no_grad():
        first = module.step(x, state)
        again = module.step(x, state)
        assert len(calls) == 1 and all(torch.equal(a, b) for a, b in zip(first, again))
        with pytest.raises(ValueError, match=r": state must have shape \[2, 16\]"):
            module.step(x, state[:1])
        with pytest.raises(TypeError, match="resets must be a torch.bool tensor"):
            module.step(x, state, resets=torch.zeros(2, dtype=torch.int32, device=DEVICE))
        calls.clear()
        with checks.checks_on_every_call():
            module.step(x, state)
            module.step(x, state)
        assert len(calls) == 2

"""The functional forms under program transforms: torch.compile of the reference path (at
several lengths, and with dynamic shapes), torch.func (vmap, grad, jvp) on the reference
backends, and the Triton backends' refusal of torch.func.

The compile tests take Dynamo with AOTAutograd (backend="aot_eager"): they trace the forward and
the joint backward graph as a real compile does, without Inductor's C++ build, which would cost
minutes here.  conftest sets the interpreter, so backend="auto" would pick a Triton backend: the
reference is named explicitly."""
import dataclasses

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch.func import functional_call, grad, jvp, vmap

from samu import backends
from samu.functional import FUNCTIONS
from samu.modules import MODULES
from samu import mixers

MIXERS = tuple(mixers.names())
REFERENCES = ("reference_chunked", "reference_sequential")
WIDTH = 16
# Where the Triton kernels run: on CUDA, else under the interpreter (tests/conftest.py).
KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _module(mixer, backend, dtype=torch.float32, seed=0):
    module = MODULES[mixer](WIDTH, backend=backend)
    module.reset_parameters(generator=torch.Generator().manual_seed(seed))
    if mixer == "samu":  # non-zero temperature and skip so that both are exercised
        with torch.no_grad():
            module.log_temp.fill_(0.3)
            module.skip.fill_(-0.7)
    return module.to(dtype)


def _state(kind, length, dtype, gen):
    """(batch, state keywords): none, an initial state with the final one, or packed rows."""
    if kind == "none":
        return 2, {}
    if kind == "initial_and_final":
        return 2, dict(initial_state=torch.randn(2, WIDTH, generator=gen, dtype=dtype),
                       output_final_state=True)
    cu_seqlens = torch.tensor([0, 1, length // 2, length])
    return 1, dict(cu_seqlens=cu_seqlens, initial_state=torch.randn(3, WIDTH, generator=gen,
                                                                    dtype=dtype),
                   output_final_state=True)


def _as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("state", ["none", "packed"])
@pytest.mark.parametrize("mixer", MIXERS)
def test_compiled_reference_at_several_lengths(fresh_dynamo, mixer, state):
    """fullgraph=True with the default (automatic) dynamic shapes: the second length recompiles
    with a symbolic length, which the chunked scan takes; outputs and gradients equal eager."""
    module = _module(mixer, "reference_chunked")
    params = [p for p in module._parameters_in_order()]
    fn = FUNCTIONS[mixer]

    def call(x, state_kw):
        return fn(x, *params, backend="reference_chunked", **state_kw)

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(call, fullgraph=True, backend=counter)
    gen = torch.Generator().manual_seed(1)
    for length in (5, 9, 14):
        batch, state_kw = _state(state, length, torch.float32, gen)
        x = torch.randn(batch, length, WIDTH, generator=gen, requires_grad=True)
        got, want = _as_tuple(compiled(x, state_kw)), _as_tuple(call(x, state_kw))
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
        inputs = [x, *params]
        got_grads = torch.autograd.grad(sum(g.square().sum() for g in got), inputs)
        want_grads = torch.autograd.grad(sum(w.square().sum() for w in want), inputs)
        for g, w in zip(got_grads, want_grads):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert counter.frame_count == 2  # the first length's static graph, then one for the rest


@pytest.mark.parametrize("mixer", MIXERS)
def test_compiled_reference_with_dynamic_shapes(fresh_dynamo, mixer):
    """dynamic=True: one graph serves every length between two powers of four (here 5 to 16,
    chunk 4, with and without a partial last chunk), with the state keywords too."""
    module = _module(mixer, "reference_chunked")
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(module, fullgraph=True, dynamic=True, backend=counter)
    gen = torch.Generator().manual_seed(2)
    frames = []
    for length in (5, 8, 11, 16):
        state = dict(initial_state=torch.randn(2, WIDTH, generator=gen), output_final_state=True)
        x = torch.randn(2, length, WIDTH, generator=gen)
        for g, w in zip(compiled(x, **state), module(x, **state)):
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
        frames.append(counter.frame_count)
    # The first call may count more than one frame (torch 2.11's aot_eager counts two), but no
    # later length compiles again.
    assert frames[0] >= 1 and frames == frames[:1] * len(frames), frames


@pytest.mark.parametrize("mixer", MIXERS)
def test_compiled_functional_form_with_dynamic_shapes(fresh_dynamo, mixer):
    """The functional form with its parameters as graph inputs: under dynamic=True their width
    is symbolic too, which a named backend does not need."""
    module = _module(mixer, "reference_chunked")
    params = [p.detach() for p in module.parameters()]
    function = FUNCTIONS[mixer]

    def call(x, *params):
        return function(x, *params, backend="reference_chunked")

    compiled = torch.compile(call, fullgraph=True, dynamic=True, backend="aot_eager")
    gen = torch.Generator().manual_seed(3)
    for length in (5, 11):
        x = torch.randn(2, length, WIDTH, generator=gen)
        torch.testing.assert_close(compiled(x, *params), call(x, *params), rtol=1e-6, atol=1e-6)


def _per_sample_inputs(state, gen):
    """Three samples, each one call's x (and its state keywords): vmapped over dim 0."""
    length = 7
    xs = torch.randn(3, 2 if state != "packed" else 1, length, WIDTH, generator=gen,
                     dtype=torch.float64)
    samples = [_state(state, length, torch.float64, gen)[1] for _ in range(3)]
    h0 = (torch.stack([s["initial_state"] for s in samples]) if "initial_state" in samples[0]
          else None)
    extra = {k: v for k, v in samples[0].items() if k not in ("initial_state",)}
    return xs, h0, extra


@pytest.mark.parametrize("state", ["none", "initial_and_final", "packed"])
@pytest.mark.parametrize("backend", REFERENCES)
@pytest.mark.parametrize("mixer", MIXERS)
def test_per_sample_gradients_equal_a_loop_of_backward_passes(mixer, backend, state):
    """vmap(grad(functional_call)): the per-sample gradients of a reference backend, against one
    ordinary backward pass per sample, in float64."""
    module = _module(mixer, backend, torch.float64)
    params = {k: v.detach() for k, v in module.named_parameters()}
    xs, h0s, extra = _per_sample_inputs(state, torch.Generator().manual_seed(3))

    def loss(p, x, h0):
        kw = dict(extra, initial_state=h0) if h0 is not None else extra
        return sum(o.square().sum() for o in _as_tuple(functional_call(module, p, (x,), kw)))

    h0_dim = 0 if h0s is not None else None
    per_sample = vmap(grad(loss), in_dims=(None, 0, h0_dim))(params, xs, h0s)
    for i in range(xs.shape[0]):
        module.zero_grad()
        loss(dict(module.named_parameters()), xs[i], None if h0s is None else h0s[i]).backward()
        for name, p in module.named_parameters():
            torch.testing.assert_close(per_sample[name][i], p.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", REFERENCES)
@pytest.mark.parametrize("mixer", MIXERS)
def test_jvp_equals_double_backward_and_finite_difference(mixer, backend):
    """torch.func.jvp of a reference backend in every input at once (x, the parameters, the
    initial state): equal to J v from the double-backward trick (reverse mode twice) and close
    to a central difference, in float64."""
    module = _module(mixer, backend, torch.float64)
    gen = torch.Generator().manual_seed(4)
    params = {k: v.detach() for k, v in module.named_parameters()}
    x = torch.randn(2, 9, WIDTH, generator=gen, dtype=torch.float64)
    h0 = torch.randn(2, WIDTH, generator=gen, dtype=torch.float64)
    primals = (params, x, h0)
    tangents = ({k: torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in params.items()},
                torch.randn(x.shape, generator=gen, dtype=x.dtype),
                torch.randn(h0.shape, generator=gen, dtype=h0.dtype))

    def f(p, x, h0):
        y, final = functional_call(module, p, (x,), dict(initial_state=h0,
                                                         output_final_state=True))
        return torch.cat([y.flatten(), final.flatten()])

    out, forward_mode = jvp(f, primals, tangents)

    leaves = [*params.values(), x, h0]
    leaves = [t.clone().requires_grad_() for t in leaves]
    names = list(params)
    flat_tangents = [*tangents[0].values(), tangents[1], tangents[2]]
    y = f(dict(zip(names, leaves[:len(names)])), *leaves[len(names):])
    cotangent = torch.zeros_like(y, requires_grad=True)
    vjp = torch.autograd.grad(y, leaves, cotangent, create_graph=True)
    (double_backward,) = torch.autograd.grad(
        sum((g * t).sum() for g, t in zip(vjp, flat_tangents)), cotangent)
    torch.testing.assert_close(forward_mode, double_backward, rtol=1e-10, atol=1e-12)

    eps = 1e-6
    shifted = [shifted_inputs(primals, tangents, s * eps) for s in (1, -1)]
    difference = (f(*shifted[0]) - f(*shifted[1])) / (2 * eps)
    assert ((forward_mode - difference).norm() / difference.norm()).item() < 1e-7
    torch.testing.assert_close(out, f(*primals), rtol=0, atol=0)


def shifted_inputs(primals, tangents, step):
    """primals + step * tangents, through the (parameter dict, x, h0) structure."""
    params, x, h0 = primals
    dparams, dx, dh0 = tangents
    return ({k: v + step * dparams[k] for k, v in params.items()}, x + step * dx, h0 + step * dh0)


TRANSFORMS = {
    "vmap": lambda f, x: vmap(f)(x[None]),
    "grad": lambda f, x: grad(lambda x: f(x).sum())(x),
    "jvp": lambda f, x: jvp(f, (x,), (torch.ones_like(x),)),
}


@pytest.mark.parametrize("transform", sorted(TRANSFORMS))
@pytest.mark.parametrize("mixer", MIXERS)
def test_triton_backend_refuses_torch_func(monkeypatch, mixer, transform):
    """A Triton backend under torch.func raises a clear error before any kernel runs (its run is
    replaced by one that fails the test)."""
    name = backends.DEFAULTS[mixer]
    backends.available(mixer)  # registers the backends

    def no_kernel(*args, **kwargs):
        raise AssertionError("a kernel ran under a torch.func transform")

    monkeypatch.setitem(backends.REGISTRY[mixer], name,
                        dataclasses.replace(backends.REGISTRY[mixer][name], run=no_kernel))
    module = _module(mixer, name).to(KERNEL_DEVICE)
    x = torch.randn(1, 5, WIDTH, device=KERNEL_DEVICE)
    with pytest.raises(RuntimeError, match=r"torch\.func transforms \(vmap/grad/jvp\) are "
                                           r"supported on the reference backends only"):
        TRANSFORMS[transform](module, x)


def test_a_cp_context_that_is_no_context_is_refused_by_name():
    """The functional forms hand a cp_context call to the context object (samu.distributed's
    CPContext): anything else is refused before it is used."""
    x, decay = torch.randn(1, 5, 16), torch.zeros(16)
    for bogus in ({}, "group", object()):
        with pytest.raises(TypeError, match="^samu: cp_context must be a CPContext from "
                                            "samu.distributed.build_cp_context, got "
                                            f"{type(bogus).__name__}$"):
            FUNCTIONS["samu"](x, decay, decay, decay, decay, decay, cp_context=bogus)


@pytest.mark.parametrize("mixer", mixers.names())
def test_check_call_raises_what_the_call_raises_without_running(mixer):
    """checks.check_call (what context parallelism runs before the kernels' phases, which
    check nothing) raises a call's error for a parameter of the wrong width, and nothing for a
    good call."""
    from samu.experiment import legality
    from samu.checks import check_call
    x, params, _ = legality.make_inputs(mixer, (1, 5, 16), "cpu")
    good = list(params.values())
    check_call(mixer, x, good, "reference_chunked")
    bad = [p[..., :8] if p.dim() and p.shape[-1] == 16 else p for p in good]
    with pytest.raises(ValueError) as called:
        FUNCTIONS[mixer](x, *bad, backend="reference_chunked")
    with pytest.raises(ValueError) as checked:
        check_call(mixer, x, bad, "reference_chunked")
    assert str(checked.value) == str(called.value)


@pytest.mark.parametrize("mixer", MIXERS)
def test_width_zero_is_refused_as_empty(mixer):
    """x and parameters of width 0 agree, and no backend takes them: the refusal names the empty
    width (RG-LRU's kernels had divided by the head count's width)."""
    from samu.experiment import legality
    _, params, _ = legality.make_inputs(mixer, (1, 5, 16), "cpu")
    empty = [p[..., :0] if p.dim() and p.shape[-1] == 16 else p for p in params.values()]
    empty = [p[:0] if p.dim() == 3 else p for p in empty]  # RG-LRU's heads
    for backend in backends.available(mixer):
        with pytest.raises(ValueError, match=rf"^{mixer}: x is empty \(batch 1, length 5, "
                                             r"width 0\)"):
            FUNCTIONS[mixer](torch.zeros(1, 5, 0, device=KERNEL_DEVICE),
                             *[p.to(KERNEL_DEVICE) for p in empty], backend=backend)

"""The Triton backends as torch.library custom ops: opcheck, torch.compile(fullgraph=True) equal to
eager with states and packing, CUDA-graph capture on a GPU, and eager calls kept off the ops."""
import pytest
import torch

import samu
from samu import backends
from samu.modules import MODULES
from samu.ops import library

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _first_triton(mixer, family=""):
    return next(n for n in backends.available(mixer)
                if backends.REGISTRY[mixer][n].kind == "triton" and n.startswith(family))


# One backend of each family.
FAMILIES = [("samu", _first_triton("samu")), ("rglru", _first_triton("rglru", "gemm"))]


def _module(mixer, name, width=32):
    torch.manual_seed(0)
    kw = dict(num_heads=2) if mixer == "rglru" else {}
    return MODULES[mixer](width, backend=name, **kw).to(DEVICE)


def _params(module):
    return [p.detach() for p in module._parameters_in_order()]


@pytest.mark.parametrize("mixer, name", FAMILIES)
@pytest.mark.parametrize("packed", [False, True])
def test_opcheck(mixer, name, packed):
    """The ops' schemas, fake implementations and autograd registration are consistent."""
    module = _module(mixer, name)
    x = torch.randn(1 if packed else 2, 19, 32, device=DEVICE)
    count = 3 if packed else 2
    cu = torch.tensor([0, 5, 6, 19], device=DEVICE) if packed else None
    h0 = torch.randn(count, 32, device=DEVICE)
    params = _params(module)
    args = (x, params, h0, cu, mixer, name, True)
    torch.library.opcheck(torch.ops.samu.scan_forward.default, args)
    out = torch.ops.samu.scan_forward(*args)
    dy, d_final = torch.randn_like(x), torch.randn(count, 32, device=DEVICE)
    torch.library.opcheck(torch.ops.samu.scan_backward.default,
                          (x, params, out[2:], dy, d_final, h0, cu, mixer, name))


def _grads(fn, module, x, h0, cu):
    module.zero_grad()
    xg, hg = x.clone().requires_grad_(), h0.clone().requires_grad_()
    y, final = fn(xg, hg, cu)
    (y.float().square().sum() + final.sum()).backward()
    return [y, final, xg.grad, hg.grad] + [p.grad.clone() for p in module._parameters_in_order()]


@pytest.mark.parametrize("mixer, name", FAMILIES + [("samu", "auto")])
def test_compiled_model_equals_eager(mixer, name):
    """torch.compile(fullgraph=True) of a model around the mixer, with an initial state, a
    final state and packed sequences, compiles without a graph break and gives eager's
    outputs and gradients; a second length reuses the graph with dynamic shapes."""
    module = _module(mixer, name)
    norm = torch.nn.LayerNorm(32).to(DEVICE)

    def model(x, h0, cu):
        y, final = module(norm(x), initial_state=h0, output_final_state=True, cu_seqlens=cu)
        return y * 2 + x, final

    compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=True)
    try:
        for length, cu in ((19, [0, 5, 6, 19]), (23, [0, 1, 20, 23])):
            x = torch.randn(1, length, 32, device=DEVICE)
            h0 = torch.randn(len(cu) - 1, 32, device=DEVICE)
            cu = torch.tensor(cu, device=DEVICE)
            want = _grads(model, module, x, h0, cu)
            got = _grads(compiled, module, x, h0, cu)
            for w, g in zip(want, got):
                assert torch.allclose(g, w, rtol=1e-5, atol=1e-6)
    finally:
        torch._dynamo.reset()


# torch's own inductor code calls its deprecated torch.jit.script_method
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_compiled_with_inductor_equals_eager():
    """The default compiler (inductor) around both mixers, no graph break."""
    mixers = [_module("samu", FAMILIES[0][1]), _module("rglru", FAMILIES[1][1])]

    def model(x):
        return mixers[1](mixers[0](x) * 0.5).sum()

    x = torch.randn(2, 17, 32, device=DEVICE)
    try:
        want = model(x)
        got = torch.compile(model, fullgraph=True)(x)
        assert torch.allclose(got, want, rtol=1e-5)
    finally:
        torch._dynamo.reset()


def test_eager_calls_do_not_go_through_the_ops(monkeypatch):
    """Eager calls keep the autograd.Functions: the ops add no host time to them."""
    def refuse(*args, **kwargs):
        raise AssertionError("an eager call reached the custom op")

    monkeypatch.setattr(library, "run", refuse)
    module = _module("samu", FAMILIES[0][1])
    module(torch.randn(1, 9, 32, device=DEVICE), output_final_state=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("mixer, name", FAMILIES)
def test_reduce_overhead_captures_and_replays(mixer, name):
    """mode='reduce-overhead' captures the compiled forward and backward in CUDA graphs; the
    replays give eager's values on new inputs."""
    module = _module(mixer, name, width=256)

    def step(x, h0):
        y, final = module(x, initial_state=h0, output_final_state=True)
        return y.float().square().mean() + final.square().mean()

    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    try:
        for seed in range(4):
            torch.manual_seed(seed)
            x = torch.randn(2, 300, 256, device="cuda", dtype=torch.bfloat16)
            h0 = torch.randn(2, 256, device="cuda")
            module.zero_grad()
            want = step(x, h0)
            want.backward()
            want_grad = module.a_param.grad.clone()
            module.zero_grad()
            got = compiled(x, h0)
            got.backward()
            assert torch.allclose(got, want, rtol=1e-4)
            assert torch.allclose(module.a_param.grad, want_grad, rtol=1e-3, atol=1e-6)
    finally:
        torch._dynamo.reset()


def test_compiled_refuses_a_configuration_object():
    config = backends.REGISTRY["samu"][FAMILIES[0][1]].config
    module = samu.SAMU(32, backend=config)
    try:
        with pytest.raises(Exception, match="registered name"):
            torch.compile(module, fullgraph=True, backend="eager")(torch.randn(1, 5, 32))
    finally:
        torch._dynamo.reset()

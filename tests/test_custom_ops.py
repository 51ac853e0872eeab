"""The Triton backends as torch.library custom ops: opcheck, torch.compile(fullgraph=True) equal to
eager with states and packing, CUDA-graph capture on a GPU, and eager calls kept off the ops."""
import re

import pytest
import torch

import samu
from samu import backends
from samu.modules import MODULES
from samu import custom_ops
from samu import mixers

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
    args = (x, params, h0, cu, None, mixer, name, True)
    torch.library.opcheck(torch.ops.samu.scan_forward.default, args)
    out = torch.ops.samu.scan_forward(*args)
    dy, d_final = torch.randn_like(x), torch.randn(count, 32, device=DEVICE)
    torch.library.opcheck(torch.ops.samu.scan_backward.default,
                          (x, params, out[2:], dy, d_final, h0, cu, None, mixer, name))


def test_only_the_op_zeroes_the_residual_buffers_gaps(monkeypatch):
    """SAMU's residual buffer has gaps between its aligned pieces at odd shapes: the custom op,
    whose outputs must hold nothing uninitialised, zeroes them; an eager call does not pay for
    it."""
    from samu.ops.samu import chunk
    flags = []
    real = chunk.workspace
    monkeypatch.setattr(chunk, "workspace",
                        lambda *a, **k: (flags.append(k.get("zero_gaps", False)), real(*a, **k))[1])
    name = FAMILIES[0][1]
    module = _module("samu", name)
    x = torch.randn(1, 19, 32, device=DEVICE)  # B L = 19: r and g end mid-line
    module(x)
    assert flags == [False]  # the forward's residuals (the backward's workspace is not run)
    flags.clear()
    out = torch.ops.samu.scan_forward(x, _params(module), None, None, None, "samu", name, False)
    assert flags == [True]
    n_chunks = chunk.cdiv(19, backends.REGISTRY["samu"][name].config.chunk)
    h_in, rate, r, g, r_sum = chunk.pieces(out[2], chunk._residual_numels(1, 19, 32, n_chunks))
    assert bool((r[19:] == 0).all()) and bool((g[19:] == 0).all()) and r.numel() > 19


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


def test_compiled_auto_takes_the_choice_of_one_long_row(monkeypatch):
    """Under torch.compile auto resolves once, for (1, COMPILED_SHAPE_TOKENS, D) whatever the
    batch and length, so that one graph serves every length."""
    from samu import dispatch, functional
    seen, resolve = [], dispatch.resolve

    def spy(mixer, x, backend="auto"):
        if backend == "auto":  # (the op's own checks resolve the name it was given)
            seen.append((mixer, tuple(x.shape)))
        return resolve(mixer, x, backend)

    monkeypatch.setattr(dispatch, "resolve", spy)
    module = _module("samu", "auto")
    compiled = torch.compile(lambda x: module(x), fullgraph=True, backend="aot_eager",
                             dynamic=True)
    try:
        for batch, length in ((2, 5), (3, 9)):
            compiled(torch.randn(batch, length, 32, device=DEVICE))
    finally:
        torch._dynamo.reset()
    assert seen and set(seen) == {("samu", (1, functional.COMPILED_SHAPE_TOKENS, 32))}


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

    monkeypatch.setattr(custom_ops, "run", refuse)
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


# Wrong at L = 20, with the words eager uses: ends short of the length, decreases, holds an
# empty sequence.
BAD_CU_SEQLENS = [([0, 5, 15], "must start at 0 and end at the length 20"),
                  ([0, 12, 8, 20], "must increase"),
                  ([0, 5, 5, 20], "must increase")]


def test_check_cu_seqlens_op():
    """samu::check_cu_seqlens's schema and fake are consistent, and it refuses as eager does."""
    cu = torch.tensor([0, 5, 20], device=DEVICE)
    torch.library.opcheck(torch.ops.samu.check_cu_seqlens.default, (cu, 20, "samu"))
    assert torch.equal(torch.ops.samu.check_cu_seqlens(cu, 20, "samu"), cu)
    with pytest.raises(ValueError, match="samu: cu_seqlens must increase"):
        torch.ops.samu.check_cu_seqlens(torch.tensor([0, 5, 5, 20], device=DEVICE), 20, "samu")


@pytest.mark.parametrize("mixer, name", FAMILIES)
def test_scan_forward_called_directly_refuses_bad_cu_seqlens(mixer, name):
    """The op's own check of the offsets' values: called directly, as a compiled graph calls it,
    bad offsets are refused with eager's words, not scanned as some other packing."""
    x = torch.randn(1, 20, 32, device=DEVICE)
    params = _params(_module(mixer, name))
    for offsets, words in BAD_CU_SEQLENS + [([0, 5, 100], "must start at 0 and end at the "
                                                          "length 20")]:
        cu = torch.tensor(offsets, device=DEVICE)
        with pytest.raises(ValueError, match=f"{mixer}: cu_seqlens {words}"):
            torch.ops.samu.scan_forward(x, params, None, cu, None, mixer, name, True)


@pytest.mark.parametrize("mixer, name", [(m, backends.DEFAULTS[m]) for m in mixers.names()]
                         + [(m, "reference_chunked") for m in mixers.names()])
def test_compiled_call_refuses_bad_cu_seqlens(mixer, name):
    """Under torch.compile the offsets' values are checked when the graph runs, with eager's
    error, on the Triton path (whose kernels would otherwise write past the final state) and on
    the references' (whose final state would have the wrong number of rows)."""
    module = _module(mixer, name, width=16)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    x = torch.randn(1, 20, 16, device=DEVICE)
    try:
        for offsets, words in BAD_CU_SEQLENS:
            cu = torch.tensor(offsets, device=DEVICE)
            with pytest.raises(ValueError, match=f"{mixer}: cu_seqlens {words}"):
                compiled(x, cu_seqlens=cu, output_final_state=True)
    finally:
        torch._dynamo.reset()


# torch's own inductor code calls its deprecated torch.jit.script_method
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_inductor_keeps_the_cu_seqlens_check():
    """The default compiler (inductor) keeps the check: the scan reads its output."""
    module = _module("samu", backends.DEFAULTS["samu"], width=16)
    compiled = torch.compile(module, fullgraph=True)
    try:
        with pytest.raises(ValueError, match="samu: cu_seqlens must start at 0 and end"):
            compiled(torch.randn(1, 20, 16, device=DEVICE),
                     cu_seqlens=torch.tensor([0, 5, 15], device=DEVICE))
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("mixer, name", FAMILIES)
def test_compiled_initial_state_changed_in_place_before_backward_is_refused(mixer, name):
    """The custom op's autograd saves the initial state: changed in place after the compiled
    forward, it makes autograd refuse the backward instead of giving wrong gradients."""
    module = _module(mixer, name, width=16)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    h0 = torch.randn(2, 16, device=DEVICE)
    try:
        y = compiled(torch.randn(2, 20, 16, device=DEVICE), initial_state=h0)
        h0.mul_(100)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.square().sum().backward()
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("mixer, name", FAMILIES)
def test_direct_op_calls_refuse_what_the_kernels_would_index_past(mixer, name):
    """The ops are public (torch.ops.samu.*): called directly they check what an eager call
    checks, and the backward's dy, d_final and residuals, before a kernel runs.  Without these
    checks a [1, D] initial state for batch 3 had the backward write past its d_h0 buffer."""
    module = _module(mixer, name)
    params = _params(module)
    x = torch.randn(3, 16, 32, device=DEVICE)
    h0 = torch.randn(3, 32, device=DEVICE)
    forward, backward = torch.ops.samu.scan_forward, torch.ops.samu.scan_backward
    with pytest.raises(ValueError, match=r"initial_state must have shape \[3, 32\]"):
        forward(x, params, h0[:1], None, None, mixer, name, True)
    short = [params[0][..., :-1], *params[1:]]
    with pytest.raises(ValueError, match="width|must have shape"):
        forward(x, short, None, None, None, mixer, name, True)
    with pytest.raises(ValueError, match="resets must have x's shape"):
        forward(x, params, None, None, torch.zeros(3, 8, dtype=torch.bool, device=DEVICE),
                mixer, name, True)
    out = forward(x, params, h0, None, None, mixer, name, True)
    residuals, dy = out[2:], torch.randn_like(x)
    bad = {"dy": dict(dy=dy[..., :16]), "initial_state": dict(h0=h0[:1]),
           "d_final": dict(d_final=torch.ones(1, 32, device=DEVICE)),
           "residuals": dict(residuals=[r[:-1] for r in residuals])}
    for word, change in bad.items():
        args = {**dict(residuals=residuals, dy=dy, d_final=torch.ones(3, 32, device=DEVICE),
                       h0=h0), **change}
        with pytest.raises(ValueError, match=word):
            backward(x, params, args["residuals"], args["dy"], args["d_final"], args["h0"],
                     None, None, mixer, name)
    dx, flat, d_h0 = backward(x, params, residuals, dy, None, h0, None, None, mixer, name)
    assert dx.shape == x.shape and d_h0.shape == h0.shape and torch.isfinite(dx).all()


def test_direct_op_calls_refuse_unknown_names_by_name():
    """A direct call names an unknown mixer or backend, 'auto' or a reference backend, with the
    valid choices, as the functional forms do, in both ops."""
    mixer, name = FAMILIES[0]
    params = _params(_module(mixer, name))
    x = torch.randn(1, 8, 32, device=DEVICE)
    reference = next(n for n in backends.available(mixer)
                     if backends.REGISTRY[mixer][n].kind == "reference")
    choices = re.escape(f"the custom ops take one of {backends.matching(mixer)}")
    refusals = [("no_such_mixer", name, "unknown mixer"),
                (mixer, "no_such_backend",
                 f"'no_such_backend' is not a Triton backend; {choices}"),
                (mixer, "auto", f"'auto' is not a Triton backend; {choices}"),
                (mixer, reference, f"is not a Triton backend; {choices}")]
    for op_mixer, op_backend, words in refusals:
        with pytest.raises(ValueError, match=words):
            torch.ops.samu.scan_forward(x, params, None, None, None, op_mixer, op_backend, False)
        with pytest.raises(ValueError, match=words):
            torch.ops.samu.scan_backward(x, params, [], x, None, None, None, None, op_mixer,
                                         op_backend)


def test_direct_op_checks_run_once_per_signature(monkeypatch):
    """The ops' checks read only their arguments' types, shapes, dtypes and devices: a compiled
    graph without CUDA graphs pays for them once per signature, and a new shape is checked."""
    mixer, name = FAMILIES[0]
    params = _params(_module(mixer, name))
    calls = []
    real = samu.checks.check_op_inputs
    monkeypatch.setattr(samu.checks, "check_op_inputs",
                        lambda *a: (calls.append(a[2].shape), real(*a))[1])
    monkeypatch.setattr(custom_ops, "_CHECKED", {})
    for length in (16, 16, 8):
        torch.ops.samu.scan_forward(torch.randn(2, length, 32, device=DEVICE), params, None,
                                    None, None, mixer, name, False)
    assert [tuple(s) for s in calls] == [(2, 16, 32), (2, 8, 32)]
    with pytest.raises(ValueError, match="initial_state must have shape"):
        torch.ops.samu.scan_forward(torch.randn(2, 16, 32, device=DEVICE), params,
                                    torch.zeros(1, 32, device=DEVICE), None, None, mixer, name,
                                    False)

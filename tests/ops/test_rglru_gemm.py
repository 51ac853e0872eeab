"""The gemm RG-LRU backends (samu.ops.rglru.gemm) against the float64 oracle with SPEC section 4's
legality rule, their launches, what they save for backward, and double backward.  On a CPU these
run under Triton's interpreter at tiny sizes (conftest sets TRITON_INTERPRET)."""
import inspect

import pytest
import torch

import samu
from samu import backends
from samu.experiment import legality
from samu.functional import FUNCTIONS
from samu.ops.common import launching
from samu.ops.common.function import run_with
from samu.ops.rglru import gemm

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NAMES = [config.name for config in gemm.CONFIGS]
CHUNK = {config.name: config.chunk for config in gemm.CONFIGS}
RECOMPUTE = {config.name: config.recompute for config in gemm.CONFIGS}


def _inputs(shape, heads, seed=0, a_param_value=None, dtype=torch.bfloat16):
    """Parameters from samu.RGLRU's initialisation (with `heads` heads), x and dy standard
    normal; every channel's a_param set to one value when a_param_value is given."""
    batch, length, width = shape
    module = samu.RGLRU(width, num_heads=heads)
    gen = torch.Generator().manual_seed(seed)
    module.reset_parameters(generator=gen)
    params = {n: p.detach().to(DEVICE) for n, p in module.named_parameters()}
    if a_param_value is not None:
        params["a_param"] = torch.full_like(params["a_param"], a_param_value)
    x = torch.randn(batch, length, width, generator=gen).to(DEVICE, dtype)
    dy = torch.randn(batch, length, width, generator=gen).to(DEVICE, dtype)
    return x, params, dy


def _assert_legal(name, inputs):
    entry = legality.check_legality("rglru", name, inputs=inputs)
    assert entry["legal"], entry["reason"]
    assert not entry["materialized_state_sized_transition"]
    assert set(entry["errors"]) == {"y", "x", *legality.PARAMETER_NAMES["rglru"]}


def test_every_configuration_is_registered_with_words_that_explain_it():
    assert len(set(NAMES)) == len(NAMES)
    assert set(NAMES) <= set(backends.available("rglru"))
    for config in gemm.CONFIGS:
        backend = backends.REGISTRY["rglru"][config.name]
        assert backend.kind == "triton" and backend.config == config
        assert "gemm:" in backends.explain(config.name)


# Every configuration over two chunks or more at an odd length with B > 1; block widths that are
# not powers of two (24, 8, 3), one head (bw = D), and bw = 1.  Every configuration at extreme
# decays: test_chunk_kernels.py.
SHAPES = [((2, 37, 48), 2), ((1, 45, 40), 5), ((2, 21, 48), 16), ((1, 41, 32), 1), ((2, 19, 8), 8)]
# A shape selects the tiles' vector width (V = 2 at an even bw and chunk 8 or 16, else 1) and,
# for a recomputing configuration, the head groups.  On a GPU every configuration at every shape;
# under the interpreter (slow) each shape with a saving and a recomputing configuration, each
# configuration at two shapes or more, both V where the chunk allows two (indices into SHAPES).
# test_chunk_kernels.py runs every configuration at 16 and 10 heads besides, some at 3 and 1.
_SUBSET = {"gemm_fused_hierarchical_chunk8": (0, 2), "gemm_fused_hierarchical_chunk16": (1, 4),
           "gemm_fused_hierarchical_chunk32": (2, 3),
           "gemm_recompute_fused_hierarchical_chunk8": (1, 4),
           "gemm_recompute_fused_hierarchical_chunk16": (0, 2, 3)}
LEGALITY_CASES = [(SHAPES[i], name) for name in NAMES for i in range(len(SHAPES))
                  if torch.cuda.is_available() or i in _SUBSET[name]]


@pytest.mark.parametrize("shape_heads, name", LEGALITY_CASES,
                         ids=[f"{'x'.join(map(str, s))}-{h}-{n}" for (s, h), n in LEGALITY_CASES])
def test_backend_is_legal(shape_heads, name):
    (batch, length, width), heads = shape_heads
    length = max(length, 2 * CHUNK[name] + 3)  # at least two chunks, the last one partial
    _assert_legal(name, _inputs((batch, length, width), heads, seed=length + heads))


def test_chunk_sizes_agree():
    """The configurations compute the same function: in FP32 they agree to rounding."""
    # 2-6 chunks each; one row (FP32 at B > 1: test_head_groups_compute_the_same_function)
    x, params, dy = _inputs((1, 41, 24), 3, seed=5, dtype=torch.float32)
    outs = [legality.outputs("rglru", name, x, params, dy) for name in NAMES]
    want = legality.oracle("rglru", x, params, dy)
    for got in outs:
        assert max(legality.relative_errors(got, want).values()) < 1e-5
    for other in outs[1:]:
        for key in outs[0]:
            a, b = outs[0][key].double(), other[key].double()
            assert ((a - b).norm() / b.norm().clamp_min(1e-30)).item() < 1e-5, key


def test_cached_launches_pass_every_argument(monkeypatch):
    """launching.launch replays a compiled kernel with the positional arguments followed by the
    constexprs in signature order, taken from the keywords: every launch must pass every kernel
    argument, the constexprs by keyword, and every kernel must be launched."""
    seen = []

    def checked_launch(kernel, grid, *args, **meta):
        names = kernel.arg_names
        missing = [n for n in names[len(args):] if n not in meta]
        assert not missing, (kernel.fn.__name__, missing)
        constexprs = [n for n, p in inspect.signature(kernel.fn).parameters.items()
                      if "constexpr" in str(p.annotation)]
        assert constexprs, kernel.fn.__name__
        assert all(names.index(n) >= len(args) for n in constexprs), (kernel.fn.__name__, "a "
                                                                      "constexpr passed by position")
        seen.append(kernel.fn.__name__)
        kernel[grid](*args, **meta)

    monkeypatch.setattr(launching, "launch", checked_launch)  # every kernel launches through it
    x, params, dy = _inputs((1, 40, 32), 2, seed=2)
    legality.outputs("rglru", NAMES[0], x, params, dy)
    assert set(seen) == {"_summary_kernel", "_output_kernel", "_reverse_summary_kernel",
                         "_backward_kernel", "chunk_carry_kernel", "sum_partials_kernel"}


@pytest.mark.parametrize("name", NAMES)
def test_saves_x_and_g_or_only_x_and_no_transition(name):
    """Saved for backward: x, G in x's dtype unless the backend recomputes it, and the chunks'
    FP32 entering states, nothing else of [B, L, D] size (a and log a never exist); the eager
    reference saves a and log a."""
    # Two chunks or more, the last one partial, and B L D above W_cat's 2 H bw^2 elements.
    batch, length, width = 2, max(CHUNK[name] + 3, 19), 32
    x, params, dy = _inputs((batch, length, width), 2, seed=3)
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.dtype))
        return t

    leaves = [x.clone().requires_grad_(), *(p.clone().requires_grad_() for p in params.values())]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = FUNCTIONS["rglru"](*leaves, backend=name)
    state_sized = batch * length * width
    big = [(shape, dtype) for shape, dtype in saved if torch.Size(shape).numel() >= state_sized]
    want = [((batch, length, width), torch.bfloat16)]
    if not RECOMPUTE[name]:
        want.append(((2 * batch * length * width,), torch.bfloat16))  # G, flat
    assert big == want, saved
    entering = y.grad_fn.saved_tensors[len(want)]
    assert entering.dtype == torch.float32
    assert entering.numel() >= batch * gemm.cdiv(length, CHUNK[name]) * width
    assert entering.numel() < state_sized
    torch.autograd.grad(y, leaves, dy)  # and the backward runs from what was saved


def test_heads_run_in_groups_whose_gates_fit_the_workspace():
    """A group's G takes at most workspace_units of the 2 units all heads' G take, in whole
    heads dividing the head count (one head at least)."""
    config = gemm.GemmConfig(8, recompute=True)
    assert [config.heads_per_group(h) for h in (16, 10, 32, 7, 2, 1)] == [4, 2, 8, 1, 1, 1]
    whole = gemm.GemmConfig(8, recompute=True, workspace_units=2.0)
    assert [whole.heads_per_group(h) for h in (16, 10, 7)] == [16, 10, 7]
    assert gemm.GemmConfig(8, recompute=True, workspace_units=1.0).heads_per_group(10) == 5
    assert gemm.GemmConfig(8).heads_per_group(16) == 16  # G saved: one group


# Workspaces of 0.25, 0.5 and 2 units: 16 heads in groups of 2 and 4, 10 heads (RecurrentGemma's)
# in groups of 1 and 2, each beside all heads at once.  The BF16 runs of the registered
# configuration at 16 and 10 heads are legal in test_chunk_kernels.py.
@pytest.mark.parametrize("heads", [16, 10])
def test_head_groups_compute_the_same_function(heads):
    """Groups of 1, 2 or 4 heads agree to rounding in FP32 with all heads at once, which agrees
    with the float64 oracle."""
    import dataclasses
    # 3 chunks, the last short
    x, params, dy = _inputs((2, 21, 80), heads, seed=heads, dtype=torch.float32)
    base = next(config for config in gemm.CONFIGS if config.recompute)
    runs = {}
    for units in (0.25, 0.5, 2.0):
        config = dataclasses.replace(base, workspace_units=units)
        runs[config.heads_per_group(heads)] = legality.outputs("rglru", config, x, params, dy)
    assert len(runs) == 3, runs.keys()
    want = runs.pop(heads)
    errors = legality.relative_errors(want, legality.oracle("rglru", x, params, dy))
    assert max(errors.values()) < 1e-5, errors
    for per_group, got in runs.items():
        for key in want:
            a, b = got[key].double(), want[key].double()
            assert ((a - b).norm() / b.norm().clamp_min(1e-30)).item() < 1e-5, (per_group, key)


def test_groups_run_in_any_order_with_every_state_keyword(monkeypatch):
    """A tile's padding lanes (group width 12 beside 64-channel tiles) hold the next group's
    channels: they must not write its final state or initial-state gradient.  Groups run last
    to first here, so a stray write would land after the right one."""
    config = next(config for config in gemm.CONFIGS if config.recompute and config.chunk == 8)
    forward_order = gemm._Groups.__iter__
    monkeypatch.setattr(gemm._Groups, "__iter__",
                        lambda self: iter(list(forward_order(self))[::-1]))
    shape = (1, 29, 48)  # 16 heads of 3 channels: 4 groups of 12
    state = legality.make_state(shape, DEVICE, seed=11, cu_seqlens=[0, 3, 11, 20, 29])
    inputs = legality.make_inputs("rglru", shape, DEVICE, seed=11)
    want = legality.oracle("rglru", *inputs, state)
    got = legality.outputs("rglru", config, *inputs, state)
    errors = legality.relative_errors(got, want)
    assert {"final_state", "initial_state"} <= set(errors)
    assert max(errors.values()) < 0.02, errors


def test_a_second_backward_through_an_overwritten_g_raises():
    """The backward writes dG over the saved G: a second backward through the same graph
    (retain_graph) must fail loudly, not read dG as G, with or without saved-tensor hooks."""
    x, params, dy = _inputs((1, 20, 32), 2, seed=9)
    xg = x.clone().requires_grad_()
    ps = [p.clone().requires_grad_() for p in params.values()]
    name = next(config.name for config in gemm.CONFIGS if not config.recompute)
    y = FUNCTIONS["rglru"](xg, *ps, backend=name)
    torch.autograd.grad(y, xg, dy, retain_graph=True)
    with pytest.raises(RuntimeError, match="cannot be backpropagated through twice"):
        torch.autograd.grad(y, xg, dy)
    # Saved-tensor hooks skip autograd's version check: the backend's own check still holds.
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        y = FUNCTIONS["rglru"](xg, *ps, backend=name)
    torch.autograd.grad(y, xg, dy, retain_graph=True)
    with pytest.raises(RuntimeError, match="gemm_recompute_"):
        torch.autograd.grad(y, xg, dy)
    # A recomputing backend saves no G: twice through one graph gives the same gradient.
    name = next(config.name for config in gemm.CONFIGS if config.recompute)
    y = FUNCTIONS["rglru"](xg, *ps, backend=name)
    (first,) = torch.autograd.grad(y, xg, dy, retain_graph=True)
    (second,) = torch.autograd.grad(y, xg, dy)
    assert torch.equal(first, second)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="peak memory is counted on a GPU")
@pytest.mark.parametrize("name", [name for name in NAMES if RECOMPUTE[name]])
def test_peak_memory_of_a_forward_backward_is_at_most_three_units(name):
    """SPEC's unit, B L D BF16 elements, for the recomputing backends: y and dx take one each,
    the rest (a group's G, the per-chunk states, the partial rows) must fit in the third.  At a
    long sequence, so that the parameter-sized buffers (W_cat, the weight gradients) are small
    beside a unit."""
    from samu.experiment import protocol
    shape = (1, 32768, 2048)
    x, params, dy = _inputs(shape, 16, seed=8)
    module = samu.RGLRU(shape[2], num_heads=16, backend=name).to(DEVICE)
    module.load_state_dict(params)
    xg = x.clone().requires_grad_()
    protocol.sample(module, xg, dy, "forward_backward")  # compiled, workspace pools warm
    memory = protocol.measure_memory(module, xg, dy)
    units = memory["peak_allocated_delta_bytes"] / (2 * x.numel())
    assert units <= 3.0, units


def test_double_backward_is_refused():
    """A gradient penalty through the backend must not silently drop second-order terms."""
    x, params, dy = _inputs((1, 20, 32), 2, seed=4)
    xg = x.clone().requires_grad_()
    ps = [p.clone().requires_grad_() for p in params.values()]
    y = FUNCTIONS["rglru"](xg, *ps, backend=NAMES[0])
    with pytest.raises(RuntimeError, match="do not support double backward"):
        torch.autograd.grad(y, xg, dy, create_graph=True)
    (gx,) = torch.autograd.grad(y, xg, dy)  # first order still works
    assert torch.isfinite(gx).all()


def test_a_configuration_passed_in_runs_without_changing_the_registered_one():
    """Sweeps pass frozen configurations in as the backend (backends.from_config)."""
    import dataclasses
    registered = gemm.CONFIGS[0]
    tried = dataclasses.replace(registered, output=gemm.Launch(1, 1),
                                backward_programs_per_sm=1)
    x, params, dy = _inputs((1, 40, 32), 2, seed=6)
    got = legality.outputs("rglru", tried, x, params, dy)
    want = legality.oracle("rglru", x, params, dy)
    assert max(legality.relative_errors(got, want).values()) < 0.02
    assert backends.REGISTRY["rglru"][registered.name].config == registered
    module = samu.RGLRU(32, 2, backend=tried)
    module.to(x.device)(x.float())
    assert module.last_backend == tried.name
    with pytest.raises(TypeError, match="backend must be 'auto', a name"):
        samu.SAMU(32, backend=registered)


def test_launch_plan_covers_every_kernel_and_keeps_the_chunk_in_each_thread():
    """BN = 32 x warps x V for every kernel, V dividing the block width, at the widths the
    project runs (bw = 128, 160, 256) and at a block width of 176."""
    for config in gemm.CONFIGS:
        for width, heads in ((2048, 16), (2560, 16), (2560, 10), (2816, 16)):
            plan = gemm.launch_plan(config, width, heads)
            assert {k.fn.__name__ for k, _, _ in plan} == {
                "_summary_kernel", "_output_kernel", "_reverse_summary_kernel", "_backward_kernel"}
            for kernel, meta, options in plan:
                assert meta["BN"] == 32 * options["num_warps"] * meta["V"]
                assert (width // heads) % meta["V"] == 0
                assert meta["T"] * meta["V"] <= max(gemm.VALUES_PER_THREAD, config.chunk)
                assert meta["D"] == width and meta["BW"] == width // heads


def test_the_entering_states_padding_is_zeroed_for_a_custom_op():
    """The entering states of head groups whose [B, NC, DG] pieces end mid-line leave padding
    between the pieces: forward zeroes it unless zero_gaps is off (a custom op's outputs must
    hold nothing uninitialised), and hands W_cat, the backward's, out last."""
    from samu.ops.common.sequences import sequence_args
    config = next(c for c in gemm.CONFIGS if c.recompute and c.chunk == 8)
    x, params, _ = _inputs((1, 21, 30), 10, seed=12)  # groups of 2 heads of 3: 18 per piece
    params = list(params.values())
    shapes = gemm._entering_state_shapes(gemm._groups(config, params[0]), 1, 3)
    padding = torch.ones(launching.carved_size(shapes), device=DEVICE)
    for piece in launching.carve(padding, shapes):
        piece.zero_()
    assert padding.sum() > 0
    sequences = sequence_args(x, None, None, False)
    _, _, (entering, w_cat) = gemm.forward(x, params, sequences, config, zero_gaps=True)
    assert bool((entering[padding.bool()] == 0).all())
    want = torch.cat([params[0], params[2]], dim=2).to(w_cat.dtype)
    assert torch.equal(w_cat, want)


def test_gate_gradient_in_its_own_buffer_is_legal_and_survives_a_second_backward():
    """gradient_over_gates=False (sweeps pass it): dG gets a buffer of its own, so the saved G
    stays intact and a retained graph backpropagates twice to the same gradient."""
    import dataclasses
    config = dataclasses.replace(gemm.CONFIGS[0], gradient_over_gates=False)
    x, params, dy = _inputs((1, 40, 32), 2, seed=10)
    got = legality.outputs("rglru", config, x, params, dy)
    want = legality.oracle("rglru", x, params, dy)
    assert max(legality.relative_errors(got, want).values()) < 0.02
    xg = x.clone().requires_grad_()
    ps = [p.clone().requires_grad_() for p in params.values()]
    y, _ = run_with(gemm, config)(xg, *ps)
    (first,) = torch.autograd.grad(y, xg, dy, retain_graph=True)
    (second,) = torch.autograd.grad(y, xg, dy)
    assert torch.equal(first, second)


def test_backward_register_cap_is_left_off_where_a_state_keyword_is_on(monkeypatch):
    """The cap is tuned for the default path; the state keywords' loads would spill under it."""
    config = next(c for c in gemm.CONFIGS if c.backward.registers is not None)
    caps = []
    real = launching.launch

    def spy(kernel, grid, *args, **meta):
        if kernel is gemm._backward_kernel:
            caps.append(meta.get("maxnreg"))
        return real(kernel, grid, *args, **meta)

    monkeypatch.setattr(launching, "launch", spy)
    x, params, dy = _inputs((1, 24, 32), 2, seed=11)
    run = run_with(gemm, config)
    for h0 in (None, torch.zeros(1, 32, device=DEVICE)):
        xg = x.clone().requires_grad_()
        y, _ = run(xg, *params.values(), initial_state=h0)
        y.backward(dy)
    assert caps == [config.backward.registers, None]
    plan = {k.fn.__name__: options for k, _, options in gemm.launch_plan(config, 32, 2)}
    assert plan["_backward_kernel"]["maxnreg"] == config.backward.registers
    plan = {k.fn.__name__: options
            for k, _, options in gemm.launch_plan(config, 32, 2, features=True)}
    assert "maxnreg" not in plan["_backward_kernel"]

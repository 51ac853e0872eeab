"""State in and out, packed sequences and single-step decode (SPEC section 3), for every backend,
against the float64 oracle under SPEC section 4's legality rule.  On a CPU the Triton backends
run under Triton's interpreter (conftest) at tiny sizes."""
import dataclasses
import sys

import pytest
import torch

import samu
from samu import backends
from samu.experiment import legality
from samu.functional import FUNCTIONS
from samu.modules import MODULES
from samu.ops import layout as packing
from samu.ops.common import carry
from samu import mixers

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MIXERS = tuple(mixers.names())


def _triton(mixer):
    return [n for n in backends.available(mixer) if backends.REGISTRY[mixer][n].kind == "triton"]


def _chunk(mixer, name):
    return backends.REGISTRY[mixer][name].config.chunk


# Boundaries inside chunks, at chunk edges, sequences of length 1, a last one not a multiple
# of the chunk.
PACKED = [0, 3, 4, 11, 16, 17, 29]


def _packing_for(chunk):
    """PACKED stretched so that some sequences span chunks at this chunk size."""
    scale = max(1, chunk // 8)
    return [o * scale for o in PACKED[:-1]] + [PACKED[-1] * scale + 2]


STATE_CASES = []
for mixer in MIXERS:
    for name in _triton(mixer):
        chunk = _chunk(mixer, name)
        packed = (1, _packing_for(chunk)[-1], 48)
        STATE_CASES.append((mixer, name, packed, _packing_for(chunk), True))
        # Every case for the defaults, and for every backend on a GPU; under the interpreter
        # (slow) the other backends take the packed case with initial states, which covers most.
        if name == backends.DEFAULTS[mixer] or torch.cuda.is_available():
            STATE_CASES.append((mixer, name, (2, 2 * chunk + 3, 48), None, True))
            STATE_CASES.append((mixer, name, packed, _packing_for(chunk), False))
    if mixer == "samu":  # the default with chunk_carry's launches, not the walked carries
        name = backends.DEFAULTS[mixer]
        config = dataclasses.replace(backends.REGISTRY[mixer][name].config, walked_carry_chunks=0)
        chunk = _chunk(mixer, name)
        STATE_CASES.append((mixer, config, (1, _packing_for(chunk)[-1], 48), _packing_for(chunk),
                            True))
        STATE_CASES.append((mixer, config, (2, 2 * chunk + 3, 48), None, True))
        STATE_CASES.append((mixer, config, (1, _packing_for(chunk)[-1], 48), _packing_for(chunk),
                            False))
    # Each chunk a segment of the look-back carry, so that starts fall in segments' summaries.
    name = backends.DEFAULTS[mixer]
    config = backends.REGISTRY[mixer][name].config
    walk = dict(walked_carry_chunks=0) if mixer == "samu" else {}
    config = dataclasses.replace(config, **walk, carry=carry.CarryPlan(
        two_level_from=2, segment_chunks=1, lookback=True))
    STATE_CASES.append((mixer, config, (1, _packing_for(config.chunk)[-1], 48),
                        _packing_for(config.chunk), True))
    if mixer == "samu":  # the backward's pass 2 from the partial dx of pass 1
        config = dataclasses.replace(backends.REGISTRY[mixer][name].config, partial_dx=True)
        STATE_CASES.append((mixer, config, (1, _packing_for(config.chunk)[-1], 48),
                            _packing_for(config.chunk), True))
        STATE_CASES.append((mixer, config, (2, 2 * config.chunk + 3, 48), None, True))
    for name in ("reference_chunked",):
        STATE_CASES.append((mixer, name, (2, 21, 32), None, True))
        STATE_CASES.append((mixer, name, (1, PACKED[-1], 32), PACKED, True))


def _id(case):
    mixer, name, shape, packing, initial = case
    if not isinstance(name, str):
        plan = "" if name.carry == carry.DEFAULT_PLAN else f"-{name.carry.label}"
        name = (f"{name.name}-walked_carry_chunks{getattr(name, 'walked_carry_chunks', None)}"
                f"{plan}{'-partial_dx' if getattr(name, 'partial_dx', False) else ''}")
    return (f"{mixer}-{name}-{'x'.join(map(str, shape))}-"
            f"{'packed' if packing else 'rows'}-{'h0' if initial else 'reset'}")


@pytest.mark.parametrize("case", STATE_CASES, ids=[_id(c) for c in STATE_CASES])
def test_state_and_packing_are_legal(case):
    """y, the final state and every gradient (x, parameters, the initial state) within the
    legality bound, at odd lengths, with and without an initial state, packed or not."""
    mixer, name, shape, packing, initial = case
    triton = not isinstance(name, str) or backends.REGISTRY[mixer][name].kind == "triton"
    seed = sum(shape) + (len(name) if isinstance(name, str) else 7)
    state = legality.make_state(shape, DEVICE, seed, cu_seqlens=packing, initial=initial)
    entry = legality.check_legality(mixer, name, shape, DEVICE, seed=seed, state=state)
    if triton:
        assert entry["legal"], entry["reason"]
    else:  # the references store a and log a, so only their errors can be legal
        failing = {n: e for n, e in entry["errors"].items() if not e <= entry["bounds"][n]}
        assert not failing, failing
    expected = {"y", "final_state", "x", *legality.PARAMETER_NAMES[mixer]}
    assert set(entry["errors"]) == expected | ({"initial_state"} if initial else set())


def _inputs(mixer, shape, seed, dtype=torch.float32):
    x, params, _ = legality.make_inputs(mixer, shape, DEVICE, seed=seed, dtype=dtype)
    return x, list(params.values())


def _close(got, want, tol):
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item() < tol


BACKENDS = [(m, n) for m in MIXERS for n in _triton(m)[:1] + ["reference_chunked"]]
BACKENDS += [(m, n) for m in MIXERS for n in _triton(m)[1:] if _chunk(m, n) == 32][:2]


@pytest.mark.parametrize("mixer, name", BACKENDS)
def test_prefill_in_two_parts_equals_one_call(mixer, name):
    """The final state of the first part, passed as the second part's initial state, gives
    the same outputs and final state as one call (FP32 inputs, split inside a chunk)."""
    x, params = _inputs(mixer, (2, 45, 32), seed=3)
    fn = FUNCTIONS[mixer]
    y, final = fn(x, *params, backend=name, output_final_state=True)
    y1, mid = fn(x[:, :19], *params, backend=name, output_final_state=True)
    y2, final2 = fn(x[:, 19:], *params, backend=name, initial_state=mid, output_final_state=True)
    assert _close(torch.cat([y1, y2], 1), y, 1e-5)
    assert _close(final2, final, 1e-5)


@pytest.mark.parametrize("mixer, name", BACKENDS)
def test_packed_equals_sequences_one_by_one(mixer, name):
    """A packed row gives each sequence's outputs, final state and gradients as if it ran
    alone, with or without initial states."""
    x, params = _inputs(mixer, (1, PACKED[-1], 32), seed=4)
    fn = FUNCTIONS[mixer]
    cu = torch.tensor(PACKED, dtype=torch.int64, device=DEVICE)
    h0 = torch.randn(len(PACKED) - 1, 32, device=DEVICE)
    for initial in (None, h0):
        xp = x.clone().requires_grad_()
        hp = None if initial is None else initial.clone().requires_grad_()
        y, final = fn(xp, *params, backend=name, cu_seqlens=cu, initial_state=hp,
                      output_final_state=True)
        (y.square().sum() + final.sum()).backward()
        for n in range(len(PACKED) - 1):
            part = slice(PACKED[n], PACKED[n + 1])
            xn = x[:, part].clone().requires_grad_()
            hn = None if initial is None else initial[n:n + 1].clone().requires_grad_()
            yn, fn_ = fn(xn, *params, backend=name, initial_state=hn, output_final_state=True)
            (yn.square().sum() + fn_.sum()).backward()
            assert _close(y[:, part], yn, 1e-5), n
            assert _close(final[n:n + 1], fn_, 1e-5), n
            assert _close(xp.grad[:, part], xn.grad, 1e-4), n
            if initial is not None:
                assert _close(hp.grad[n:n + 1], hn.grad, 1e-4), n


# Module.step takes one kernel per mixer whatever the Triton backend: the chunk-32 backends would
# repeat the chunk-8 ones' steps (their final states inside a chunk: the prefill test above).
STEP_BACKENDS = [(m, n) for m, n in BACKENDS
                 if n == "reference_chunked" or _chunk(m, n) != 32 or torch.cuda.is_available()]


@pytest.mark.parametrize("mixer, name", STEP_BACKENDS)
def test_steps_equal_the_full_forward(mixer, name):
    """A loop of step from no state equals one forward; so does a prefill then steps."""
    torch.manual_seed(0)
    module = MODULES[mixer](32, backend=name).to(DEVICE)
    x = torch.randn(2, 11, 32, device=DEVICE)
    with torch.no_grad():
        y, final = module(x, output_final_state=True)
        state, ys = None, []
        for t in range(x.shape[1]):
            y_t, state = module.step(x[:, t], state)
            ys.append(y_t)
        assert _close(torch.stack(ys, 1), y, 1e-5)
        assert _close(state, final, 1e-5)
        _, state = module(x[:, :6], output_final_state=True)
        ys = [module(x[:, :6])]
        for t in range(6, x.shape[1]):
            y_t, state = module.step(x[:, t], state)
            ys.append(y_t[:, None])
        assert _close(torch.cat(ys, 1), y, 1e-5)
        assert _close(state, final, 1e-5)


def test_final_state_is_h_at_the_last_token():
    """With skip = 0 SAMU's y is h: the final state equals y's last token, in FP32."""
    x, params = _inputs("samu", (2, 9, 16), seed=5, dtype=torch.float64)
    params[4] = torch.zeros((), dtype=torch.float64, device=DEVICE)
    y, final = samu.samu(x, *params, output_final_state=True)
    assert final.dtype == torch.float64 and final.shape == (2, 16)
    assert torch.equal(final, y[:, -1])


def test_initial_state_gradient_is_a_times_dh_at_the_first_token():
    """d h0 = a_0 dh_0 (the reference's algebra, checked against autograd): with dy only at
    t = 0, dh_0 = dy_0."""
    x, params = _inputs("samu", (1, 5, 8), seed=6, dtype=torch.float64)
    h0 = torch.randn(1, 8, dtype=torch.float64, device=DEVICE, requires_grad=True)
    y = samu.samu(x, *params, initial_state=h0)
    dy = torch.zeros_like(y)
    dy[:, 0] = torch.randn(8, dtype=torch.float64, device=DEVICE)
    y.backward(dy)
    from samu.ops.samu.naive import samu_scan_inputs
    _, a, _ = samu_scan_inputs(x, *params[:4], reset=torch.zeros(1, 5, dtype=torch.bool,
                                                                 device=DEVICE))
    assert torch.allclose(h0.grad, a[:, 0] * dy[:, 0], rtol=1e-12)


def test_sequence_layout():
    seqs = packing.layout(1, 7, "cpu", torch.tensor([0, 2, 3, 7]))
    assert seqs.starts.tolist() == [[True, False, True, True, False, False, False]]
    assert seqs.ends.tolist() == [[False, True, True, False, False, False, True]]
    assert seqs.index.tolist() == [[0, 0, 1, 2, 2, 2, 2]] and seqs.count == 3


BAD_CU_SEQLENS = [
    ([1, 4, 9], "start at 0"),
    ([0, 4, 8], "end at the length 9"),
    ([0, 5, 4, 9], "must increase"),
    ([0, 4, 4, 9], "must increase"),
    ([9], "shape"),
]


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("offsets, words", BAD_CU_SEQLENS)
def test_bad_cu_seqlens_is_refused_clearly(mixer, offsets, words):
    x, params = _inputs(mixer, (1, 9, 16), seed=0)
    with pytest.raises(ValueError, match=words):
        FUNCTIONS[mixer](x, *params, cu_seqlens=torch.tensor(offsets, device=DEVICE))


@pytest.mark.parametrize("mixer", MIXERS)
def test_bad_state_arguments_are_refused_clearly(mixer):
    x, params = _inputs(mixer, (2, 9, 16), seed=0)
    fn = FUNCTIONS[mixer]
    cu = torch.tensor([0, 4, 9], device=DEVICE)
    with pytest.raises(TypeError, match="int32 or int64"):
        fn(x[:1], *params, cu_seqlens=cu.float())
    with pytest.raises(ValueError, match="batch 1"):
        fn(x, *params, cu_seqlens=cu)
    with pytest.raises(ValueError, match=r"initial_state must have shape \[2, 16\]"):
        fn(x, *params, initial_state=torch.zeros(3, 16, device=DEVICE))
    with pytest.raises(ValueError, match=r"\[2, 16\] \(sequences in cu_seqlens"):
        fn(x[:1], *params, cu_seqlens=cu, initial_state=torch.zeros(1, 16, device=DEVICE))
    with pytest.raises(TypeError, match="floating point"):
        fn(x, *params, initial_state=torch.zeros(2, 16, dtype=torch.int64, device=DEVICE))
    with pytest.raises(TypeError, match="output_final_state must be True or False"):
        fn(x, *params, output_final_state=1)
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="cu_seqlens is on"):
            fn(x[:1], *params, cu_seqlens=cu.cpu())
        with pytest.raises(ValueError, match="initial_state is on"):
            fn(x, *params, initial_state=torch.zeros(2, 16))


@pytest.mark.parametrize("mixer", MIXERS)
def test_step_refuses_a_sequence(mixer):
    module = MODULES[mixer](16)
    with pytest.raises(ValueError, match=r"step takes x_t of shape \[batch, width\]"):
        module.step(torch.zeros(1, 3, 16))


def _module(mixer, name, width=16):
    torch.manual_seed(0)
    kw = dict(num_heads=2) if mixer == "rglru" else {}
    return MODULES[mixer](width, backend=name, **kw).to(DEVICE)


def _reference_module(module):
    """The float64 oracle with the module's parameters."""
    kw = dict(num_heads=module.num_heads) if module.mixer == "rglru" else {}
    oracle = MODULES[module.mixer](module.width, backend="reference_chunked", **kw).to(DEVICE)
    oracle.load_state_dict(module.state_dict())
    return oracle.double()


# Each family's Function, and the gemm family's recomputing one (its saved tensors differ).
IN_PLACE_BACKENDS = [(m, backends.DEFAULTS[m]) for m in MIXERS] + [
    ("rglru", "gemm_recompute_fused_hierarchical_chunk8")]


@pytest.mark.parametrize("mixer, name", IN_PLACE_BACKENDS)
@pytest.mark.parametrize("packed", [False, True], ids=["rows", "packed"])
def test_initial_state_changed_in_place_before_backward_is_refused(mixer, name, packed):
    """The Triton backends save the initial state for the backward: changed in place after the
    forward, it makes autograd refuse the backward instead of giving wrong gradients."""
    module = _module(mixer, name)
    cu = torch.tensor([0, 7, 20], device=DEVICE) if packed else None
    x = torch.randn(1 if packed else 2, 20, 16, device=DEVICE)
    h0 = torch.randn(2, 16, device=DEVICE)  # FP32 and contiguous: the kernels take it as it is
    y, final = module(x, initial_state=h0, cu_seqlens=cu, output_final_state=True)
    h0.mul_(100)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (y.square().sum() + final.sum()).backward()


@pytest.mark.parametrize("mixer", MIXERS)
def test_initial_state_copied_for_the_kernels_keeps_the_gradients_right(mixer):
    """An initial state the kernels copy (float64 here) may change in place after the forward:
    the gradients are those of the values the forward saw (the float64 oracle's)."""
    module = _module(mixer, backends.DEFAULTS[mixer])
    x = torch.randn(2, 20, 16, device=DEVICE)
    h = torch.randn(2, 16, device=DEVICE, dtype=torch.float64)
    h0 = h.clone()
    module(x, initial_state=h0).square().sum().backward()
    h0.mul_(100)
    oracle = _reference_module(module)
    oracle(x.double(), initial_state=h).square().sum().backward()
    for (name, p), want in zip(module.named_parameters(), oracle.parameters()):
        assert _close(p.grad, want.grad, 1e-4), name


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("name", ["reference_chunked", "reference_sequential"])
def test_a_reference_keeps_what_it_read_of_an_initial_state_changed_in_place(mixer, name):
    """The references' autograd graphs hold what they read of the initial state: changed in
    place after the forward, the backward runs, with the gradients of the values it saw."""
    module = _reference_module(_module(mixer, backends.DEFAULTS[mixer]))
    module.backend = name
    x = torch.randn(2, 20, 16, device=DEVICE, dtype=torch.float64)
    h = torch.randn(2, 16, device=DEVICE, dtype=torch.float64)
    h0 = h.clone().requires_grad_()
    y = module(x, initial_state=h0)
    with torch.no_grad():
        h0.mul_(100)
    y.square().sum().backward()
    oracle = _reference_module(module)
    oracle.backend = name
    h_ref = h.clone().requires_grad_()
    oracle(x, initial_state=h_ref).square().sum().backward()
    assert torch.equal(h0.grad, h_ref.grad)
    for (pname, p), want in zip(module.named_parameters(), oracle.parameters()):
        assert torch.equal(p.grad, want.grad), pname


# Wrong at L = 20: ends short of the length, decreases, holds an empty sequence.
UNCHECKED_OFFSETS = [[0, 5, 15], [0, 12, 8, 20], [0, 5, 5, 20], [4, 30]]


@pytest.mark.parametrize("offsets", UNCHECKED_OFFSETS)
def test_sequence_index_stays_within_the_sequences(offsets):
    """Offsets that were never checked (a CUDA-graph capture) still give every token a
    sequence in [0, N): no kernel indexes a state row that does not exist."""
    cu = torch.tensor(offsets, device=DEVICE)
    index = packing.sequence_index(cu, 20)
    assert index.min().item() >= 0 and index.max().item() < len(offsets) - 1
    assert index.tolist() == sorted(index.tolist())
    valid = torch.tensor([0, 3, 4, 11, 20], device=DEVICE)
    assert packing.sequence_index(valid, 20).tolist() == (
        [0] * 3 + [1] + [2] * 7 + [3] * 9)


# Each mixer's default and its single-pass backends (whose tiles find their states through a
# look-back and, for SAMU, exchange partial sums: no offsets may move either out of bounds).
GUARDED = [(m, n) for m in MIXERS for n in _triton(m)
           if n == backends.DEFAULTS[m] or "singlepass" in n.split("_")]


@pytest.mark.parametrize("mixer, name", GUARDED)
def test_backend_run_with_unchecked_bad_cu_seqlens_stays_in_bounds(mixer, name):
    """A backend's run skips samu.functional's checks: given wrong offsets, its forward and
    backward return with finite outputs and states of N rows (a row no token writes, that of a
    zero-length sequence, is zero), touching nothing outside them."""
    module = _module(mixer, name)
    run = backends.REGISTRY[mixer][name].run
    for offsets in UNCHECKED_OFFSETS[:3]:
        count = len(offsets) - 1
        x = torch.randn(1, 20, 16, device=DEVICE, requires_grad=True)
        h0 = torch.randn(count, 16, device=DEVICE, requires_grad=True)
        y, final = run(x, *module._parameters_in_order(), initial_state=h0,
                       cu_seqlens=torch.tensor(offsets, device=DEVICE), output_final_state=True)
        assert final.shape == (count, 16) and torch.isfinite(y).all(), offsets
        assert torch.isfinite(final).all(), offsets
        (y.square().sum() + final.sum()).backward()
        assert torch.isfinite(x.grad).all() and h0.grad.shape == (count, 16), offsets
        assert torch.isfinite(h0.grad).all(), offsets


GUARD_ROWS = 4


def _guarded(rows, width, fill=float("nan")):
    """(a [rows, width] FP32 view, the buffer around it): GUARD_ROWS rows of `fill` on each
    side, which a kernel that writes outside the view changes and one that reads there takes
    in (NaN)."""
    buffer = torch.full((rows + 2 * GUARD_ROWS, width), fill, device=DEVICE)
    return buffer[GUARD_ROWS:GUARD_ROWS + rows], buffer


def _guards_untouched(buffer):
    return bool(buffer[:GUARD_ROWS].isnan().all() and buffer[-GUARD_ROWS:].isnan().all())


@pytest.mark.parametrize("mixer, name", GUARDED)
def test_kernels_touch_no_state_row_outside_the_buffers(mixer, name):
    """Sequence indices outside [0, N) reach the kernels directly (bypassing sequence_index):
    every initial-state and final-state-gradient load there reads nothing (the NaN guard rows
    around the buffers do not reach y or the gradients) and every final-state and d h0 store
    writes nothing (the guard rows stay NaN)."""
    from samu.ops.common.sequences import SequenceArgs
    config = backends.REGISTRY[mixer][name].config
    family = sys.modules[type(config).__module__]
    module = _module(mixer, name)
    count, width, length = 2, 16, 20
    # Tokens of sequences -1, 0, 1, 2 and 5 of N = 2: the bad ones within the guard rows.
    index = torch.tensor([-1] * 3 + [0] * 5 + [1] * 4 + [2] * 4 + [5] * 4, dtype=torch.int32,
                         device=DEVICE)
    h0, h0_buffer = _guarded(count, width)
    h0.copy_(torch.randn(count, width))
    final, final_buffer = _guarded(count, width)
    d_h0, d_h0_buffer = _guarded(count, width)
    d_final, _ = _guarded(count, width)
    d_final.copy_(torch.randn(count, width))

    class GuardedSequences(SequenceArgs):
        def final_state(self, width, device):
            return final

        def initial_state_gradient(self):
            return d_h0

    state = GuardedSequences(index, h0, count, True, True, True)
    x = torch.randn(1, length, width, device=DEVICE)
    params = [p.detach() for p in module._parameters_in_order()]
    y, got_final, residuals = family.forward(x, params, state, config)
    assert got_final is final
    assert torch.isfinite(y).all() and torch.isfinite(final).all()
    assert _guards_untouched(final_buffer)
    grads = family.backward(x, params, residuals, torch.randn_like(x), d_final, state, config)
    assert grads[-1] is d_h0
    assert all(torch.isfinite(g).all() for g in grads[:-1])
    assert torch.isfinite(d_h0).all() and _guards_untouched(d_h0_buffer)
    assert _guards_untouched(h0_buffer)

"""Per-token resets (SPEC section 3): True at token t ignores whatever state would enter t (from
t - 1 or from an initial state); a_t counts as 0 and m_t as 1 there.

The float64 oracle (the sequential reference) is checked first against an independent
formulation, every run between two resets called apart and the pieces joined; every backend is
then held to the oracle: y, the final state, dx, every parameter gradient and d initial_state,
with resets at chunk boundaries, at the first and the last token, inside rows, different in
every row, with packed sequences and initial states.  On a CPU the Triton backends run under
Triton's interpreter (conftest) at tiny sizes."""
import dataclasses

import pytest
import torch

from samu import backends, custom_ops, mixers, model  # custom_ops registers torch.ops.samu
from samu.ops.common import carry
from samu.experiment import legality
from samu.functional import FUNCTIONS, PARAMETER_NAMES
from samu.functional import mix as functional_mix
from samu.modules import MODULES, build

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MIXERS = mixers.names()
WIDTH = 32
HEADS = 2  # RG-LRU's: blocks of 16 channels, and one head per group where G is recomputed


def _backends(mixer, kinds=("reference",)):
    """The registered backends of these kinds that take a reset mask (Backend.takes_resets)."""
    return [n for n, b in backends.REGISTRY[mixer].items() if b.kind in kinds and b.takes_resets]


def _chunk(mixer, name):
    config = name if not isinstance(name, str) else backends.REGISTRY[mixer][name].config
    return 8 if config is None else config.chunk


def _variants(mixer):
    """The default Triton configuration with each other carry path and backward option: the
    carry by chunk_carry (not walked), by the look-back (every chunk a segment), and SAMU's
    backward from a partial dx."""
    config = backends.REGISTRY[mixer][backends.DEFAULTS[mixer]].config
    walk = dict(walked_carry_chunks=0) if hasattr(config, "walked_carry_chunks") else {}
    out = [dataclasses.replace(config, **walk, carry=carry.CarryPlan(
        two_level_from=2, segment_chunks=1, lookback=True))]
    if walk:
        out.append(dataclasses.replace(config, **walk))
    if hasattr(config, "partial_dx"):
        out.append(dataclasses.replace(config, partial_dx=True))
    return out


def _rows_mask(length, chunk):
    """Resets of two rows that differ: row 0 at its first token (an initial state is then
    ignored), on both sides of chunk boundaries, inside a chunk and at the last token; row 1
    elsewhere, two in a row, none at its first token."""
    row0 = {0, 3, chunk - 1, chunk, 2 * chunk, length - 1}
    row1 = {1, 2, chunk + 1, 2 * chunk - 1, length - 2}
    return [sorted(p for p in row if p < length) for row in (row0, row1)]


def _packed(length, chunk):
    """(cu_seqlens, resets of the one row): a reset at a sequence's start (its initial state
    ignored), on chunk boundaries, inside sequences and at the last token."""
    offsets = [0, 3, chunk + 2, 2 * chunk + 1, length]
    resets = sorted({3, 5, chunk, chunk + 1, 2 * chunk + 3, length - 1})
    return offsets, [resets]


def _state(shape, chunk, packed, initial, seed):
    batch, length, _ = shape
    if packed:
        offsets, resets = _packed(length, chunk)
        return legality.make_state(shape, DEVICE, seed, cu_seqlens=offsets, initial=initial,
                                   resets=resets)
    return legality.make_state(shape, DEVICE, seed, initial=initial,
                               resets=_rows_mask(length, chunk))


def _inputs(mixer, shape, seed, dtype=torch.float32):
    return legality.make_inputs(mixer, shape, DEVICE, seed=seed, dtype=dtype, num_heads=HEADS)


def _oracle(mixer, x, params, dy, state):
    return legality.outputs(mixer, "reference_sequential", x.double(),
                            {n: p.double() for n, p in params.items()}, dy.double(),
                            legality._double_state(state))


def _segments(state, batch, length):
    """(row, first, end, sequence, whether an initial state enters) of every run of tokens
    that holds no reset or sequence start after its first token."""
    resets = state["resets"].cpu()
    if "cu_seqlens" in state:
        offsets = state["cu_seqlens"].tolist()
        starts = {o: n for n, o in enumerate(offsets[:-1])}
    else:
        starts = {0: None}
    out = []
    for row in range(batch):
        cuts = sorted(set(starts) | set(torch.nonzero(resets[row]).flatten().tolist()))
        for first, end in zip(cuts, cuts[1:] + [length]):
            sequence = row if "cu_seqlens" not in state else max(
                n for o, n in starts.items() if o <= first)
            entered = (first in starts and not bool(resets[row, first])
                       and "initial_state" in state)
            out.append((row, first, end, sequence, entered))
    return out


def _segments_apart(mixer, x, params, dy, state):
    """The oracle's outputs by another route: every run between resets and starts called
    alone (the reference, float64, without a mask: it resets at its first token or takes its
    sequence's initial state), y joined, each sequence's final state its last run's."""
    x = x.double().detach().requires_grad_()
    ps = [p.double().detach().requires_grad_() for p in params.values()]
    h0 = state.get("initial_state")
    h0 = None if h0 is None else h0.double().detach().requires_grad_()
    d_final = state["d_final_state"].double()
    batch, length, _ = x.shape
    pieces = {}
    finals = {}
    for row, first, end, sequence, entered in _segments(state, batch, length):
        y, final = FUNCTIONS[mixer](
            x[row:row + 1, first:end], *ps, backend="reference_sequential",
            initial_state=h0[sequence:sequence + 1] if entered else None, output_final_state=True)
        pieces[(row, first)] = y
        finals[sequence] = final  # runs come in order: the last one of the sequence stays
    y = torch.cat([torch.cat([pieces[k] for k in sorted(pieces) if k[0] == row], dim=1)
                   for row in range(batch)])
    final = torch.cat([finals[n] for n in sorted(finals)])
    inputs = [x, *ps] + ([h0] if h0 is not None else [])
    grads = torch.autograd.grad([y, final], inputs, [dy.double(), d_final])
    names = ["x", *PARAMETER_NAMES[mixer]] + (["initial_state"] if h0 is not None else [])
    return {"y": y.detach(), "final_state": final.detach(), **dict(zip(names, grads))}


ORACLE_CASES = [(mixer, packed, initial) for mixer in MIXERS for packed in (False, True)
                for initial in (True, False)]


@pytest.mark.parametrize("mixer, packed, initial", ORACLE_CASES)
def test_oracle_equals_segments_run_apart(mixer, packed, initial):
    """The float64 oracle with a mask equals the runs between resets called one by one:
    outputs, final states and every gradient, d initial_state included (zero for a sequence
    whose first token resets)."""
    shape = (1 if packed else 2, 21, WIDTH)
    x, params, dy = _inputs(mixer, shape, seed=11)
    state = _state(shape, 8, packed, initial, seed=12)
    want = _segments_apart(mixer, x, params, dy, state)
    got = _oracle(mixer, x, params, dy, state)
    assert set(got) == set(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-10, atol=1e-12,
                                   msg=lambda m: f"{name}: {m}")
    if initial:  # the sequence whose first token resets takes no gradient into its h0
        reset, kept = (1, 0) if packed else (0, 1)
        assert got["initial_state"][reset].abs().max().item() == 0.0
        assert got["initial_state"][kept].abs().max().item() > 0.0


def _relative(got, want):
    return ((got.double() - want).norm() / want.norm().clamp_min(1e-30)).item()


# Every backend of every mixer (the Triton ones under the interpreter on a CPU), rows and packed.
def _backend_cases():
    """Rows and packed for the references and the default Triton backends, and for every
    backend on a GPU; under the interpreter (slow) the other configurations take the packed
    case, whose resets fall on the same chunk boundaries."""
    cases = []
    for mixer in MIXERS:
        for name in _backends(mixer, ("reference", "triton")) + _variants(mixer):
            both = (torch.cuda.is_available() or name == backends.DEFAULTS[mixer]
                    or name in _backends(mixer))
            cases += [(mixer, name, packed) for packed in ((False, True) if both else (True,))]
    return cases


BACKEND_CASES = _backend_cases()


def _case_id(case):
    mixer, name, packed = case
    if not isinstance(name, str):
        changed = [f"{f.name}={getattr(name, f.name)}" for f in dataclasses.fields(name)
                   if getattr(name, f.name) != getattr(
                       backends.REGISTRY[mixer][name.name].config, f.name)]
        name = f"{name.name}[{','.join(changed)}]"
    return f"{mixer}-{name}-{'packed' if packed else 'rows'}"


@pytest.mark.parametrize("mixer, name, packed", BACKEND_CASES,
                         ids=[_case_id(c) for c in BACKEND_CASES])
def test_backend_with_resets_matches_the_oracle(mixer, name, packed):
    """y, the final state and every gradient of each backend with a mask and initial states
    within 1e-5 of the float64 oracle (FP32 inputs), where the mask changes each of them by
    more than 1e-2."""
    chunk = _chunk(mixer, name)
    length = 2 * chunk + 5
    shape = (1 if packed else 2, length, WIDTH)
    x, params, dy = _inputs(mixer, shape, seed=length)
    state = _state(shape, chunk, packed, True, seed=length + 1)
    want = _oracle(mixer, x, params, dy, state)
    got = legality.outputs(mixer, name, x, params, dy, state)
    errors = {n: _relative(got[n], want[n]) for n in want}
    assert max(errors.values()) < 1e-5, errors
    reset = 1 if packed else 0  # the sequence whose first token resets
    assert got["initial_state"][reset].abs().max().item() == 0.0
    # A backend that ignored the mask would be this far off.
    without = _oracle(mixer, x, params, dy, {k: v for k, v in state.items() if k != "resets"})
    assert min(_relative(without[n], want[n]) for n in ("y", "final_state", "x")) > 1e-2


@pytest.mark.parametrize("mixer", MIXERS)
def test_any_mask_bytes_and_layout(mixer):
    """A torch.bool mask whose bytes are any values (a uint8 tensor viewed as bool) resets where
    a byte is non-zero, on the default Triton backend as on the reference, and a mask that is
    a strided view gives what its contiguous copy gives."""
    shape = (2, 19, WIDTH)
    x, params, _ = _inputs(mixer, shape, seed=9)
    ps = list(params.values())
    gen = torch.Generator().manual_seed(4)
    raw = torch.randint(0, 256, shape[:2], generator=gen, dtype=torch.uint8)
    raw[raw < 200] = 0  # a few resets, of byte values 200 to 255
    mask = raw.to(DEVICE).view(torch.bool)
    clean = raw.to(DEVICE) != 0
    strided = torch.zeros(shape[1], 2 * shape[0], dtype=torch.bool, device=DEVICE)
    strided[:, ::2] = clean.t()
    for name in ("reference_chunked", backends.DEFAULTS[mixer]):
        fn = FUNCTIONS[mixer]
        want = fn(x, *ps, backend=name, resets=clean)
        torch.testing.assert_close(fn(x, *ps, backend=name, resets=mask), want, rtol=0, atol=0)
        view = strided[:, ::2].t()
        assert not view.is_contiguous()
        torch.testing.assert_close(fn(x, *ps, backend=name, resets=view), want, rtol=0, atol=0)


@pytest.mark.parametrize("mixer", MIXERS)
def test_no_reset_and_reset_at_start_are_the_old_rules(mixer):
    """A mask of all False changes nothing; True at each row's first token with an initial
    state equals the call without the initial state, whose gradient is then zero."""
    shape = (2, 11, WIDTH)
    x, params, dy = _inputs(mixer, shape, seed=5, dtype=torch.float64)
    fn = FUNCTIONS[mixer]
    ps = list(params.values())
    h0 = torch.randn(2, WIDTH, dtype=torch.float64, device=DEVICE, requires_grad=True)
    none = torch.zeros(2, 11, dtype=torch.bool, device=DEVICE)
    y, final = fn(x, *ps, initial_state=h0, output_final_state=True, resets=none)
    y0, final0 = fn(x, *ps, initial_state=h0, output_final_state=True)
    assert torch.equal(y, y0) and torch.equal(final, final0)
    first = none.clone()
    first[:, 0] = True
    y, final = fn(x, *ps, initial_state=h0, output_final_state=True, resets=first)
    y0, final0 = fn(x, *ps, output_final_state=True)
    torch.testing.assert_close(y, y0, rtol=0, atol=0)
    torch.testing.assert_close(final, final0, rtol=0, atol=0)
    (d_h0,) = torch.autograd.grad((y * dy).sum() + final.sum(), h0)
    assert d_h0.abs().max().item() == 0.0


def _bad_masks(batch, length):
    return [
        ([[False] * length] * batch, TypeError, "must be a torch.bool tensor, got list"),
        (torch.zeros(batch, length, dtype=torch.uint8), TypeError, "got torch.uint8"),
        (torch.zeros(batch, length), TypeError, "got torch.float32"),
        (torch.zeros(batch, length, 1, dtype=torch.bool), ValueError,
         rf"must have x's shape without the width, \[{batch}, {length}\], got"),
        (torch.zeros(length, dtype=torch.bool), ValueError, "x's shape without the width"),
        (torch.zeros(batch, length + 1, dtype=torch.bool), ValueError,
         "x's shape without the width"),
        (torch.zeros(batch, length, dtype=torch.bool, device="meta"), ValueError,
         "resets is on meta but x is on"),
    ]


@pytest.mark.parametrize("mixer", MIXERS)
def test_bad_masks_are_refused_by_name(mixer):
    """A mask of another dtype, shape or device is refused before anything runs, by the
    functional form, the module and step, with the same words on every backend."""
    batch, length = 2, 6
    module = build(mixer, WIDTH, HEADS)
    x = torch.randn(batch, length, WIDTH, device=DEVICE)
    ps = [p.to(DEVICE) for p in module._parameters_in_order()]
    for name in _backends(mixer, ("reference", "triton"))[:3]:
        for mask, error, words in _bad_masks(batch, length):
            if isinstance(mask, torch.Tensor) and mask.device.type != "meta":
                mask = mask.to(DEVICE)
            with pytest.raises(error, match=words):
                FUNCTIONS[mixer](x, *ps, backend=name, resets=mask)
    module = module.to(DEVICE)
    with pytest.raises(ValueError, match=r"resets must have x's shape without the width, \[2\]"):
        module.step(x[:, 0], None, resets=torch.zeros(2, 1, dtype=torch.bool, device=DEVICE))
    with pytest.raises(TypeError, match="resets must be a torch.bool tensor"):
        module.step(x[:, 0], None, resets=torch.zeros(2, dtype=torch.int64, device=DEVICE))
    packed = torch.randn(1, length, WIDTH, device=DEVICE)
    cu = torch.tensor([0, 2, length], device=DEVICE)
    with pytest.raises(ValueError, match=r"\[1, 6\]"):
        module(packed, cu_seqlens=cu, resets=torch.zeros(2, 3, dtype=torch.bool, device=DEVICE))


STEP_CASES = [(mixer, name) for mixer in MIXERS
              for name in _backends(mixer) + [backends.DEFAULTS[mixer]]]


@pytest.mark.parametrize("mixer, name", STEP_CASES)
def test_steps_with_resets_equal_the_forward(mixer, name):
    """A prefill and steps with per-row resets equal the float64 oracle's forward with the same
    mask; a step whose row resets equals the scan's first token, whatever the state (FP32, no
    gradient: the one-launch kernel where the backend is a Triton one)."""
    module = build(mixer, WIDTH, HEADS, backend=name)
    module.reset_parameters(generator=torch.Generator().manual_seed(2))  # a CPU generator
    module = module.to(DEVICE)
    oracle = build(mixer, WIDTH, HEADS, backend="reference_sequential").to(DEVICE).double()
    oracle.load_state_dict(module.state_dict())
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 9, WIDTH, generator=gen).to(DEVICE)
    mask = torch.zeros(3, 9, dtype=torch.bool)
    mask[0, 5] = mask[1, 6] = mask[1, 7] = mask[2, 8] = True  # none in the prefill
    mask = mask.to(DEVICE)
    with torch.no_grad():
        want = oracle(x.double(), resets=mask)
        y, state = module(x[:, :5], output_final_state=True)
        ys = [y]
        for t in range(5, 9):
            y_t, state = module.step(x[:, t], state, resets=mask[:, t])
            ys.append(y_t[:, None])
        assert _relative(torch.cat(ys, 1), want) < 1e-5
        first = oracle(x[:, :1].double())[:, 0]
        all_rows = torch.ones(3, dtype=torch.bool, device=DEVICE)
        y_t, h = module.step(x[:, 0], torch.randn(3, WIDTH, generator=gen).to(DEVICE),
                             resets=all_rows)
        assert _relative(y_t, first) < 1e-6
        _, h_none = module.step(x[:, 0], None)
        assert _relative(h, h_none.double()) < 1e-6


def _plain_reference(x, decay, scan="chunked", initial_state=None, cu_seqlens=None,
                     output_final_state=False):
    """A reference that takes no reset mask: h_t = a h_{t-1} + x_t."""
    from samu.ops.layout import scan_sequences, with_final_state
    from samu.ops.recurrence import carry_dtype

    def scan_inputs(reset):
        cdt = carry_dtype(x)
        a = torch.sigmoid(decay.to(cdt)).expand(x.shape).contiguous()
        return torch.log(a), a, x.to(cdt)
    h, seqs = scan_sequences(x, scan_inputs, scan, initial_state, cu_seqlens)
    return with_final_state(h.to(x.dtype), h, seqs, output_final_state)


PLAIN = mixers.MixerSpec(
    name="plain", label="Plain", parameter_names=("decay",),
    width_of=lambda params: params["decay"].shape[0], check_shapes=lambda params, width: None,
    parameter_count=lambda width, num_heads: width,
    dynamic_control_values_per_token=lambda width: 0,
    reference=f"{__name__}:_plain_reference", module="samu.modules:SAMU")


def test_a_backend_without_resets_refuses_the_mask_by_name():
    """Every built-in reference and default backend takes the mask; a backend whose run has no
    resets keyword (here a registered mixer's reference) refuses it before running, naming
    itself, and runs without it."""
    for mixer in MIXERS:
        named = backends.REGISTRY[mixer]
        assert all(named[n].takes_resets for n in ("reference_chunked", "reference_sequential",
                                                   backends.DEFAULTS[mixer]))
    with backends.registered_mixer(PLAIN):
        assert not any(b.takes_resets for b in backends.REGISTRY["plain"].values())
        x = torch.randn(1, 5, 4)
        decay = torch.zeros(4)
        mask = torch.zeros(1, 5, dtype=torch.bool)
        with pytest.raises(ValueError, match="plain: backend reference_chunked does not take a "
                                             r"reset mask \(resets\); these do: \[\]"):
            functional_mix("plain", x, decay, backend="reference_chunked", resets=mask)
        assert functional_mix("plain", x, decay, backend="reference_chunked").shape == x.shape


# Griffin's recurrent block: the convolution and the mixer both reset.

def _griffin(mixer, backend="reference_chunked", dtype=torch.float64):
    """A block whose convolution taps and biases are larger than at initialisation, so that a
    tap that leaks across a reset shows."""
    block = model.RecurrentBlock(mixer, 8, lru_width=WIDTH, num_heads=HEADS, backend=backend)
    gen = torch.Generator().manual_seed(6)
    block.reset_parameters(generator=gen)
    with torch.no_grad():
        for p in (block.conv_1d.w, block.conv_1d.b, block.linear_x.bias):
            p.normal_(0.0, 0.5, generator=gen)
    return block.to(device=DEVICE, dtype=dtype)


def _block_outputs(block, x, state, calls):
    """y, the final state and the gradients of x, every parameter and the initial state of
    ``calls(x, h0) -> (y, RecurrentBlockState)``, for fixed random cotangents."""
    x = x.detach().requires_grad_()
    h0 = model.RecurrentBlockState(*(t.detach().requires_grad_() for t in state))
    y, final = calls(x, h0)
    gen = torch.Generator().manual_seed(8)
    cotangents = [torch.randn(t.shape, generator=gen, dtype=t.dtype).to(DEVICE)
                  for t in (y, *final)]
    inputs = [x, *block.parameters(), *h0]
    grads = torch.autograd.grad([y, *final], inputs, cotangents)
    return [y, *final, *grads]


@pytest.mark.parametrize("packed", [False, True], ids=["rows", "packed"])
@pytest.mark.parametrize("mixer", MIXERS)
def test_griffin_block_with_resets_equals_segments_apart(mixer, packed):
    """The block with a mask (and initial states) equals the runs between resets called
    apart: y, the final conv and mixer states, and the gradients of x, every parameter and
    both initial states.  Resets one and two tokens apart (inside the convolution's reach), at
    a start and at the last token."""
    block = _griffin(mixer)
    gen = torch.Generator().manual_seed(7)
    if packed:
        shape, offsets, positions = (1, 20, 8), [0, 6, 8, 20], [[3, 6, 10, 11, 19]]
    else:
        shape, offsets, positions = (2, 13, 8), None, [[0, 4, 5, 12], [2, 9]]
    count = shape[0] if offsets is None else len(offsets) - 1
    x = torch.randn(shape, generator=gen, dtype=torch.float64).to(DEVICE)
    state = model.RecurrentBlockState(
        torch.randn(count, block.conv_width - 1, WIDTH, generator=gen, dtype=torch.float64),
        torch.randn(count, WIDTH, generator=gen, dtype=torch.float64))
    state = model.RecurrentBlockState(*(t.to(DEVICE) for t in state))
    mask = legality.reset_mask(positions, shape[0], shape[1], DEVICE)
    keywords = {"resets": mask, "initial_state": state}
    cu = None
    if offsets is not None:
        cu = torch.tensor(offsets, device=DEVICE)
        keywords["cu_seqlens"] = cu

    def at_once(x, h0):
        return block(x, cu_seqlens=cu, initial_state=h0, output_final_state=True, resets=mask)

    def apart(x, h0):
        pieces, finals = {}, {}
        for row, first, end, sequence, entered in _segments(keywords, *shape[:2]):
            start = (model.RecurrentBlockState(h0.conv[sequence:sequence + 1],
                                               h0.mixer[sequence:sequence + 1])
                     if entered else None)
            pieces[(row, first)], finals[sequence] = block(
                x[row:row + 1, first:end], initial_state=start, output_final_state=True)
        y = torch.cat([torch.cat([pieces[k] for k in sorted(pieces) if k[0] == row], dim=1)
                       for row in range(shape[0])])
        return y, model.RecurrentBlockState(*(torch.cat([finals[n][i] for n in sorted(finals)])
                                              for i in range(2)))

    got = _block_outputs(block, x, state, at_once)
    want = _block_outputs(block, x, state, apart)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    without = block(x, cu_seqlens=cu, initial_state=state)
    assert _relative(without, got[0]) > 1e-2


@pytest.mark.parametrize("mixer", MIXERS)
def test_griffin_steps_with_resets_equal_the_forward(mixer):
    """A prefill and steps whose rows reset at different steps equal one forward with the
    mask, on the default Triton backend (the one-launch step kernels) against the float64
    reference block."""
    oracle = _griffin(mixer)
    block = _griffin(mixer, backends.DEFAULTS[mixer], torch.float32)
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(3, 9, 8, generator=gen).to(DEVICE)
    mask = legality.reset_mask([[5], [6, 7], [0, 8]], 3, 9, DEVICE)
    with torch.no_grad():
        want = oracle(x.double(), resets=mask)
        y, state = block(x[:, :5], output_final_state=True, resets=mask[:, :5])
        ys = [y]
        for t in range(5, 9):
            y_t, state = block.step(x[:, t], state, resets=mask[:, t])
            ys.append(y_t[:, None])
    assert _relative(torch.cat(ys, 1), want) < 1e-5


# The custom ops (torch.compile's path): one backend of each kernel family, and the reference.

def _family_backends():
    """(mixer, the first registered backend of each Triton family that takes the mask)."""
    out = []
    for mixer in MIXERS:
        for family in backends.kernel_families(mixer):
            names = [n for n, b in backends.REGISTRY[mixer].items()
                     if b.kind == "triton" and b.takes_resets
                     and backends.family_of(mixer, b.config) is family]
            out += [(mixer, n) for n in names[:1]]
    return out


@pytest.mark.parametrize("mixer, name", _family_backends())
def test_custom_ops_opcheck_with_resets(mixer, name):
    """The ops' schemas, fake implementations and autograd registration hold with a mask."""
    module = build(mixer, WIDTH, HEADS, backend=name).to(DEVICE)
    x = torch.randn(1, 19, WIDTH, device=DEVICE)
    cu = torch.tensor([0, 5, 6, 19], device=DEVICE)
    h0 = torch.randn(3, WIDTH, device=DEVICE)
    mask = legality.reset_mask([[2, 5, 8, 18]], 1, 19, DEVICE)
    params = [p.detach() for p in module._parameters_in_order()]
    args = (x, params, h0, cu, mask, mixer, name, True)
    torch.library.opcheck(torch.ops.samu.scan_forward.default, args)
    out = torch.ops.samu.scan_forward(*args)
    dy, d_final = torch.randn_like(x), torch.randn(3, WIDTH, device=DEVICE)
    torch.library.opcheck(torch.ops.samu.scan_backward.default,
                          (x, params, out[2:], dy, d_final, h0, cu, mask, mixer, name))


COMPILE_CASES = [(mixer, "reference_chunked") for mixer in MIXERS] + _family_backends()


@pytest.mark.parametrize("mixer, name", COMPILE_CASES)
def test_compiled_with_resets_equals_eager(mixer, name):
    """torch.compile(fullgraph=True) of a model around the mixer with a mask, initial states
    and packing: no graph break (no host sync reads the mask), and eager's outputs and
    gradients; the mask reaches the compiled call (with none set, the outputs differ)."""
    module = build(mixer, WIDTH, HEADS, backend=name).to(DEVICE)
    norm = torch.nn.LayerNorm(WIDTH).to(DEVICE)

    def call(x, h0, cu, mask):
        y, final = module(norm(x), initial_state=h0, output_final_state=True, cu_seqlens=cu,
                          resets=mask)
        return y * 2 + x, final

    def outputs(fn, x, h0, cu, mask):
        module.zero_grad()
        xg, hg = x.clone().requires_grad_(), h0.clone().requires_grad_()
        y, final = fn(xg, hg, cu, mask)
        (y.square().sum() + final.sum()).backward()
        return [y, final, xg.grad, hg.grad] + [p.grad.clone() for p in module.parameters()]

    compiled = torch.compile(call, fullgraph=True, backend="aot_eager")
    gen = torch.Generator().manual_seed(10)
    length = 19
    x = torch.randn(1, length, WIDTH, generator=gen).to(DEVICE)
    h0 = torch.randn(3, WIDTH, generator=gen).to(DEVICE)
    cu = torch.tensor([0, 5, 6, length], device=DEVICE)
    mask = legality.reset_mask([[0, 3, 8, 9, 18]], 1, length, DEVICE)
    try:
        want = outputs(call, x, h0, cu, mask)
        got = outputs(compiled, x, h0, cu, mask)
        for w, g in zip(want, got):  # the compiled reference takes another chunk: 1e-4
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
        unmasked = compiled(x, h0, cu, torch.zeros_like(mask))[0]
        assert _relative(unmasked, want[0].double()) > 1e-2
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("mixer, name", _family_backends())
def test_kernel_entry_points_refuse_a_mask_they_would_misread(mixer, name):
    """The custom op and the step kernel, called directly (past the functional checks), refuse
    a mask whose shape, dtype or device does not fit x: the kernels index it by x's shape."""
    import importlib
    module = build(mixer, WIDTH, HEADS, backend=name).to(DEVICE)
    params = [p.detach() for p in module._parameters_in_order()]
    x = torch.randn(2, 19, WIDTH, device=DEVICE)
    step = importlib.import_module(f"samu.ops.{mixer}.step").step
    for shape, dtype, device in (((2, 3), torch.bool, DEVICE), ((2, 19), torch.uint8, DEVICE),
                                 ((2, 19), torch.bool, "meta")):
        mask = torch.zeros(shape, dtype=dtype, device=device)
        if device != "meta":  # a meta input would send the op to its fake implementation
            with pytest.raises((ValueError, TypeError),  # an eager call's words
                               match=r"resets must (have x's shape|be a torch.bool tensor)"):
                torch.ops.samu.scan_forward(x, params, None, None, mask, mixer, name, False)
        row_mask = torch.zeros(shape[1:], dtype=dtype, device=device)
        with pytest.raises(ValueError, match=r"the reset mask must be torch.bool \[2\]"):
            step(x[:, 0], torch.zeros(2, WIDTH, device=DEVICE), *params, resets=row_mask)

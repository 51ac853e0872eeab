"""samu.model: the small sequence model of the training study.  The recurrent mixers run the
chunked reference here, named: tests/conftest.py sets TRITON_INTERPRET=1 on a CPU."""
import itertools

import pytest
import torch

from samu import model as M
from samu.modules import SAMU, parameter_count
from samu import mixers

REF = "reference_chunked"


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def config(mixer, **kw):
    kw.setdefault("vocab_size", 37)
    kw.setdefault("width", 32)
    kw.setdefault("layers", 2)
    kw.setdefault("mlp_expansion", 2)
    if mixer != "attention":
        kw.setdefault("backend", REF)
    return M.ModelConfig(mixer=mixer, **kw)


@pytest.mark.parametrize("mixer", M.MIXERS)
def test_logits_shape_and_backend(mixer):
    m = M.build(config(mixer), seed=0)
    tokens = torch.randint(0, 37, (3, 21))
    logits = m(tokens)
    assert logits.shape == (3, 21, 37) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    want = "sdpa" if mixer == "attention" else REF
    assert m.last_backends == [want, want]


def test_backend_is_passed_through():
    m = M.build(config("samu", backend="reference_sequential"), seed=0)
    m(torch.randint(0, 37, (1, 5)))
    assert m.last_backends == ["reference_sequential"] * 2


@pytest.mark.parametrize("mixer", M.MIXERS)
def test_mixer_parameters_follow_the_formulas(mixer):
    cfg = config(mixer, width=64, rglru_heads=4, attention_heads=3, attention_head_dim=8)
    counts = M.build(cfg).parameter_counts()
    per_layer = {"rglru": parameter_count("rglru", 64, 4), "samu": parameter_count("samu", 64),
                 "attention": M.attention_parameters(64, 3, 8)}[mixer]
    assert counts["mixer"] == 2 * per_layer
    assert counts["mlp"] == 2 * 2 * 64 * 128
    assert counts["embedding"] == 37 * 64 and counts["head"] == 0  # tied
    assert counts["total"] == sum(v for k, v in counts.items() if k != "total")
    assert counts["total"] == M.build(cfg).num_parameters


def test_models_differ_only_in_their_mixers():
    counts = {m: M.build(config(m)).parameter_counts() for m in M.MIXERS}
    for part in ("embedding", "mlp", "norm", "head"):
        assert len({c[part] for c in counts.values()}) == 1, part
    totals = {m: c["total"] - c["mixer"] for m, c in counts.items()}
    assert len(set(totals.values())) == 1


@pytest.mark.parametrize("vocab", [256, 1024])
def test_parameter_budgets_comparable_at_the_study_size(vocab):
    """At the GPU study's size (width 256, 2 layers, MLP x4) the totals are within 6 % of each
    other: the MLPs and the embedding dominate, the attention mixer's head count matches
    RG-LRU's mixer (1 head of 32 channels against 4 heads of 64), SAMU's mixer is 3 D + 4."""
    totals = {m: M.build(M.ModelConfig(vocab_size=vocab, mixer=m)).num_parameters
              for m in M.MIXERS}
    assert max(totals.values()) / min(totals.values()) < 1.06, totals
    assert M.ModelConfig(vocab_size=vocab, mixer="attention").resolved_attention_heads == 1
    assert M.ModelConfig(vocab_size=vocab, mixer="rglru").resolved_rglru_heads == 4


def test_head_counts():
    assert [M.default_rglru_heads(w) for w in (32, 64, 127, 128, 200, 256, 2048)] == [
        1, 1, 1, 2, 2, 4, 32]
    # RG-LRU at (2048, 16 heads) has 530432 parameters; one head of 64 channels has 524288.
    assert M.matching_attention_heads(2048, 16, 64) == 1
    assert M.matching_attention_heads(2048, 4, 64) == 4
    cfg = M.ModelConfig(vocab_size=8, mixer="attention", width=2048, rglru_heads=4,
                        attention_head_dim=64)
    assert cfg.resolved_attention_heads == 4


def test_untied_head_and_layernorm():
    tied = M.build(config("samu"))
    untied = M.build(config("samu", tie_embeddings=False, norm="layernorm"))
    assert untied.parameter_counts()["head"] == 37 * 32
    # a LayerNorm has a bias beside its weight: 5 norms of 32 more
    assert untied.num_parameters == tied.num_parameters + 37 * 32 + 5 * 32
    assert untied(torch.randint(0, 37, (2, 7))).shape == (2, 7, 37)


def test_parameter_report_lists_every_model():
    models = {m: M.build(config(m)) for m in M.MIXERS}
    text = M.parameter_report(models)
    lines = text.splitlines()
    assert len(lines) == 1 + len(models)
    for line, (name, m) in zip(lines[1:], models.items()):
        assert line.startswith(name) and f"{m.num_parameters:,}" in line
    assert "1.000" in text  # the largest against itself


def test_one_seed_gives_every_mixer_the_same_shared_parts():
    models = {m: M.build(config(m), seed=5) for m in M.MIXERS}
    shared = [k for k in models["samu"].state_dict() if ".mixer." not in k]
    assert "embedding.weight" in shared and "blocks.1.mlp.down.weight" in shared
    for name in shared:
        values = [m.state_dict()[name] for m in models.values()]
        assert all(torch.equal(values[0], v) for v in values[1:]), name
    other = M.build(config("samu"), seed=6)
    assert not torch.equal(other.embedding.weight, models["samu"].embedding.weight)
    with pytest.raises(ValueError, match="seed"):
        M.build(config("samu"), seed=-1)


def test_initial_scales():
    m = M.build(M.ModelConfig(vocab_size=512, mixer="attention", width=256, layers=4), seed=0)
    assert abs(m.embedding.weight.std().item() - 0.02) < 0.001
    bound = 1 / 256 ** 0.5
    up = m.blocks[0].mlp.up.weight
    assert up.abs().max() <= bound and up.abs().max() > 0.95 * bound
    down = m.blocks[0].mlp.down.weight  # fan_in 1024, scaled by 1 / sqrt(8)
    assert down.abs().max() <= 1 / 1024 ** 0.5 / 8 ** 0.5
    assert torch.equal(m.blocks[2].mlp_norm.weight, torch.ones(256))


def test_same_seed_same_model():
    a, b, c = (M.build(config("rglru"), seed=s) for s in (3, 3, 4))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not all(torch.equal(x, y)
                   for x, y in zip(a.state_dict().values(), c.state_dict().values()))


@pytest.mark.parametrize("kw, error, words", [
    (dict(mixer="mamba"), ValueError, "unknown mixer 'mamba'"),
    (dict(norm="batchnorm"), ValueError, "unknown norm"),
    (dict(width=0), ValueError, "width"),
    (dict(width=True), TypeError, "width"),
    (dict(layers=0), ValueError, "layers"),
    (dict(vocab_size=2.5), TypeError, "vocab_size"),
    (dict(mlp_expansion=-1), ValueError, "mlp_expansion"),
    (dict(mixer="rglru", rglru_heads=5), ValueError, "not divisible by rglru_heads"),
    (dict(mixer="attention", attention_head_dim=7), ValueError, "even"),
    (dict(mixer="attention", attention_heads=0), ValueError, "attention_heads"),
    (dict(tie_embeddings="yes"), TypeError, "tie_embeddings"),
])
def test_bad_configuration_is_refused(kw, error, words):
    kw = {"vocab_size": 10, "mixer": "samu", "width": 32, **kw}
    with pytest.raises(error, match=words):
        M.ModelConfig(**kw)


def test_bad_backend_is_refused_when_built():
    with pytest.raises(ValueError, match="unknown backend"):
        M.build(M.ModelConfig(vocab_size=10, mixer="samu", width=32, backend="fastest"))


def test_bad_tokens_are_refused():
    m = M.build(config("samu"))
    with pytest.raises(ValueError, match=r"\[batch, length\]"):
        m(torch.zeros(2, 3, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="int64 or int32"):
        m(torch.zeros(2, 3))
    with pytest.raises(TypeError, match="ModelConfig"):
        M.SequenceModel({"mixer": "samu"})


@pytest.mark.parametrize("mixer", M.MIXERS)
def test_every_parameter_gets_a_gradient(mixer):
    m = M.build(config(mixer, vocab_size=11), seed=1)
    tokens = torch.arange(40).remainder(11).view(2, 20)  # every token id is used
    torch.nn.functional.cross_entropy(m(tokens).flatten(0, 1), tokens.roll(-1).flatten()).backward()
    for name, p in m.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("mixer", M.MIXERS)
def test_causal(mixer):
    """The logits at t do not depend on tokens after t; they do depend on tokens up to t."""
    m = M.build(config(mixer), seed=2)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 37, (2, 30), generator=gen)
    base = m(tokens)
    for t in (0, 9, 17, 28):
        later = tokens.clone()
        later[:, t + 1:] = torch.randint(0, 37, (2, 29 - t), generator=gen)
        out = m(later)
        assert torch.allclose(out[:, :t + 1], base[:, :t + 1], atol=1e-6, rtol=0), (mixer, t)
        assert not torch.allclose(out[:, t + 1:], base[:, t + 1:], atol=1e-4), (mixer, t)
        earlier = tokens.clone()
        earlier[:, t] = (earlier[:, t] + 1) % 37
        assert not torch.allclose(m(earlier)[:, t], base[:, t], atol=1e-4), (mixer, t)


# Griffin's recurrent block (RecurrentBlock): tiny sizes, the chunked reference in float64.

D, L = 16, 12


def griffin(mixer="rglru", dtype=torch.float64, backend=REF, seed=0, width=D, **kw):
    """A block whose convolution taps and biases are larger than at initialisation (where the
    biases are zero and the taps small), so that a lost or leaked tap shows."""
    if mixer == "rglru":
        kw.setdefault("num_heads", 2)
    block = M.RecurrentBlock(mixer, width, backend=backend, **kw)
    gen = torch.Generator().manual_seed(seed)
    block.reset_parameters(generator=gen)
    with torch.no_grad():
        for p in (block.conv_1d.w, block.conv_1d.b, block.linear_x.bias, block.linear_y.bias,
                  block.linear_out.bias):
            p.normal_(0.0, 0.5, generator=gen)
    return block.to(dtype)


def inputs(*shape, dtype=torch.float64, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def block_state(count, block, dtype=torch.float64, seed=2):
    conv = inputs(count, block.conv_width - 1, block.lru_width, dtype=dtype, seed=seed)
    mixer = inputs(count, block.lru_width, dtype=dtype, seed=seed + 1) * 0.5
    return M.RecurrentBlockState(conv, mixer)


def close(a, b, tol=1e-10):
    return torch.allclose(a, b, atol=tol, rtol=tol)


@pytest.mark.parametrize("mixer", mixers.names())
def test_griffin_block_is_causal(mixer):
    block = griffin(mixer)
    x = inputs(2, L, D)
    base = block(x)
    assert base.shape == (2, L, D) and base.dtype == torch.float64
    for t in (0, 1, 5, L - 1):
        changed = x.clone()
        changed[:, t] += 1.0
        out = block(changed)
        assert torch.equal(out[:, :t], base[:, :t]), t
        assert not close(out[:, t], base[:, t], 1e-6), t
        if t + 4 < L:  # the convolution and the mixer both carry it on
            assert not close(out[:, t + 4], base[:, t + 4], 1e-6), t


@pytest.mark.parametrize("mixer", mixers.names())
@pytest.mark.parametrize("with_state", [False, True], ids=["reset", "initial_state"])
def test_griffin_packed_sequences_equal_one_by_one(mixer, with_state):
    """Lengths 5, 2 (shorter than the convolution's 3 remembered inputs), 1 and 4: every start
    resets the convolution and the mixer, or takes its row of the initial state."""
    block = griffin(mixer)
    lengths = [5, 2, 1, 4]
    cu = torch.tensor([0, 5, 7, 8, 12], dtype=torch.int32)
    x = inputs(1, L, D)
    state = block_state(len(lengths), block) if with_state else None
    packed, final = block(x, cu_seqlens=cu, initial_state=state, output_final_state=True)
    assert final.conv.shape == (4, 3, D) and final.mixer.shape == (4, D)
    for n in range(len(lengths)):
        one = x[:, cu[n]:cu[n + 1]]
        row = None if state is None else M.RecurrentBlockState(state.conv[n:n + 1],
                                                               state.mixer[n:n + 1])
        alone, alone_final = block(one, initial_state=row, output_final_state=True)
        assert close(packed[:, cu[n]:cu[n + 1]], alone), n
        assert close(final.conv[n:n + 1], alone_final.conv), n
        assert close(final.mixer[n:n + 1], alone_final.mixer), n
    # int64 offsets give the same, and without state in or out the output alone
    assert close(block(x, cu_seqlens=cu.long(), initial_state=state), packed)


def test_griffin_convolution_does_not_leak_across_starts():
    """The mixer alone resets at the starts; the convolution must too (a sharper check of the
    mask than the block's: its taps reach exactly conv_width - 1 tokens back)."""
    w = inputs(4, D, seed=3)
    b = inputs(D, seed=4)
    x = inputs(1, L, D)
    cu = torch.tensor([0, 5, 7, 12])
    y, final = M.causal_conv1d(x, w, b, cu_seqlens=cu)
    for n in range(3):
        alone, alone_final = M.causal_conv1d(x[:, cu[n]:cu[n + 1]], w, b)
        assert close(y[:, cu[n]:cu[n + 1]], alone), n
        assert close(final[n:n + 1], alone_final), n
    # by hand: token 5 starts sequence 1 and sees only itself, token 8 sees 7 and 8
    assert close(y[0, 5], b + w[3] * x[0, 5])
    assert close(y[0, 8], b + w[3] * x[0, 8] + w[2] * x[0, 7])
    assert close(final[1], torch.cat((torch.zeros(1, D, dtype=x.dtype), x[0, 5:7])))


@pytest.mark.parametrize("with_state", [False, True])
def test_griffin_convolution_is_a_depthwise_conv1d_over_the_state_and_tokens(with_state):
    """Another formulation: torch's grouped conv1d over [state, x] in float64, and a final state
    that holds only its own K - 1 rows (not a view of a copy of the whole input)."""
    w, b, x = inputs(4, D, seed=3), inputs(D, seed=4), inputs(2, L, D)
    state = inputs(2, 3, D, seed=5) if with_state else torch.zeros(2, 3, D, dtype=x.dtype)
    y, final = M.causal_conv1d(x, w, b, initial_state=state if with_state else None)
    padded = torch.cat((state, x), dim=1).transpose(1, 2)  # [B, D, 3 + L]
    want = torch.nn.functional.conv1d(padded, w.t()[:, None, :], b, groups=D).transpose(1, 2)
    assert torch.allclose(y, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(final, torch.cat((state, x), dim=1)[:, -3:])
    assert final.untyped_storage().nbytes() == final.numel() * final.element_size()


def test_griffin_convolution_in_bf16_with_resets_is_the_masked_conv1d_in_float64():
    """BF16 input and an FP32 state with resets: each token sees nothing before its latest
    reset, computed in FP32 and rounded once (to BF16's precision of the float64 result)."""
    w, b = inputs(4, D, seed=3).float(), inputs(D, seed=4).float()
    x = inputs(2, L, D).to(torch.bfloat16)
    state = inputs(2, 3, D, seed=5).float()
    resets = torch.zeros(2, L, dtype=torch.bool)
    resets[0, 4] = resets[1, 1] = resets[1, 2] = True
    y, final = M.causal_conv1d(x, w, b, initial_state=state, resets=resets)
    assert y.dtype == torch.bfloat16 and final.dtype == torch.bfloat16
    seen = torch.cat((state.to(torch.bfloat16), x), dim=1).double()  # the state in x's dtype
    want = torch.empty(2, L, D, dtype=torch.float64)
    for row in range(2):
        for t in range(L):
            first = max([t - 3] + [int(r) for r in torch.nonzero(resets[row, :t + 1])])
            taps = [(s, seen[row, 3 + t - s]) for s in range(4) if t - s >= first]
            want[row, t] = b.double() + sum(w[3 - s].double() * v for s, v in taps)
    assert torch.allclose(y.double(), want, rtol=1e-2, atol=1e-2)
    assert torch.equal(final.double(), seen[:, -3:])  # no reset among the last three tokens


def masked_conv_in_float64(x, w, b, state, resets, cu):
    """Each token's sum over the taps at or after its sequence's start and latest reset, a tap
    before the start reading its sequence's row of ``state`` ([N, K - 1, W])."""
    keep = w.shape[0] - 1
    want = torch.empty(x.shape, dtype=torch.float64)
    for n in range(len(cu) - 1):
        seen = torch.cat((state[n], x[0, cu[n]:cu[n + 1]]), dim=0).double()
        for t in range(int(cu[n + 1] - cu[n])):
            marks = torch.nonzero(resets[0, cu[n]:cu[n] + t + 1]).flatten().tolist()
            first = max([t - keep] + marks)
            want[0, cu[n] + t] = b.double() + sum(w[keep - s].double() * seen[keep + t - s]
                                                  for s in range(keep + 1) if t - s >= first)
    return want


def test_packed_convolution_with_states_and_resets_is_the_masked_conv1d_in_float64():
    """Sequences shorter than the taps, a state row for each, resets at a start and inside: the
    value and the gradients of x, the states and w against the float64 masked sum."""
    torch.manual_seed(0)
    cu = torch.tensor([0, 1, 3, 8, 9, 12])
    w, b = inputs(4, D, seed=3).requires_grad_(), inputs(D, seed=4)
    x = inputs(1, 12, D).requires_grad_()
    state = inputs(5, 3, D, seed=5).requires_grad_()
    resets = torch.zeros(1, 12, dtype=torch.bool)
    resets[0, 3] = resets[0, 6] = resets[0, 10] = True
    y, _ = M.causal_conv1d(x, w, b, initial_state=state, cu_seqlens=cu, resets=resets)
    want = masked_conv_in_float64(x, w, b, state, resets, cu)
    assert torch.allclose(y, want, rtol=1e-12, atol=1e-12)
    dy = torch.randn_like(want)
    grads = torch.autograd.grad(y, (x, state, w), dy)
    wanted = torch.autograd.grad(want, (x, state, w), dy)
    for got, expected in zip(grads, wanted):
        assert torch.allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_the_packed_convolution_state_entries_stay_in_x_for_offsets_no_check_saw():
    """During a CUDA-graph capture cu_seqlens' values go unchecked: a start before 0 or past L
    must not send the state entries' add outside y."""
    w, b, x = inputs(4, D, seed=3), inputs(D, seed=4), inputs(1, 6, D)
    state = inputs(2, 3, D, seed=5)
    for cu, resets in itertools.product(([-2, 3, 6], [0, 7, 6]),
                                        (None, torch.ones(1, 6, dtype=torch.bool))):
        y, _ = M.causal_conv1d(x, w, b, initial_state=state[:len(cu) - 1],
                               cu_seqlens=torch.tensor(cu), resets=resets)
        assert y.shape == x.shape


def test_a_nan_in_one_packed_sequence_stays_out_of_the_next_convolution():
    w, b = inputs(4, D, seed=3), inputs(D, seed=4)
    x = inputs(1, 8, D).clone()
    x[0, 4] = float("nan")  # the last token of the first sequence
    y, final = M.causal_conv1d(x, w, b, cu_seqlens=torch.tensor([0, 5, 8]))
    assert torch.isnan(y[0, 4]).all() and torch.isfinite(y[0, 5:]).all()
    assert torch.isfinite(final[1]).all()


@pytest.mark.parametrize("mixer", mixers.names())
@pytest.mark.parametrize("split", [1, 2, 7])
def test_griffin_prefill_in_two_parts_equals_one_call(mixer, split):
    """Split 1 and 2 leave fewer inputs than the convolution remembers: its state is padded."""
    block = griffin(mixer)
    x = inputs(2, L, D)
    whole, whole_final = block(x, output_final_state=True)
    first, state = block(x[:, :split], output_final_state=True)
    second, final = block(x[:, split:], initial_state=state, output_final_state=True)
    assert close(torch.cat((first, second), dim=1), whole)
    assert close(final.conv, whole_final.conv) and close(final.mixer, whole_final.mixer)
    assert close(whole_final.conv, block.linear_x(x[:, -3:]))  # the conv's last inputs
    assert state.mixer.shape == (2, D)
    # a part shorter than the convolution's memory, entered with a state, keeps its older inputs
    middle, state = block(x[:, split:split + 1], initial_state=state, output_final_state=True)
    rest = block(x[:, split + 1:], initial_state=state)
    assert close(torch.cat((first, middle, rest), dim=1), whole)


@pytest.mark.parametrize("mixer", mixers.names())
@pytest.mark.parametrize("conv_width", [1, 2, 4])
def test_griffin_step_loop_equals_one_forward(mixer, conv_width):
    block = griffin(mixer, conv_width=conv_width)
    x = inputs(2, L, D)
    whole, whole_final = block(x, output_final_state=True)
    state, outs = None, []
    for t in range(L):
        y_t, state = block.step(x[:, t], state)
        outs.append(y_t)
    assert close(torch.stack(outs, dim=1), whole)
    assert close(state.conv, whole_final.conv) and close(state.mixer, whole_final.mixer)
    # a prefill's state, then steps
    prefix, state = block(x[:, :4], output_final_state=True)
    for t in range(4, L):
        y_t, state = block.step(x[:, t], state)
        assert close(y_t, whole[:, t]), t


@pytest.mark.parametrize("mixer", mixers.names())
@pytest.mark.parametrize("packed", [False, True], ids=["batch", "packed"])
def test_griffin_gradcheck(mixer, packed):
    """Input, both initial states and every parameter of a width-8 block, in float64."""
    block = griffin(mixer, width=8)
    names = [n for n, _ in block.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in block.parameters())
    batch, length = (1, 7) if packed else (2, 5)
    cu = torch.tensor([0, 2, 7]) if packed else None
    count = 2
    x = inputs(batch, length, 8).requires_grad_()
    conv0, mixer0 = (t.requires_grad_() for t in block_state(count, block))

    def f(x, conv0, mixer0, *params):
        out, final = torch.func.functional_call(
            block, dict(zip(names, params)), (x,),
            dict(cu_seqlens=cu, initial_state=M.RecurrentBlockState(conv0, mixer0),
                 output_final_state=True))
        return out, final.conv, final.mixer

    assert torch.autograd.gradcheck(f, (x, conv0, mixer0, *params), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("mixer", mixers.names())
def test_griffin_model_trains(mixer):
    """Adam on a repeating pattern with period 5: the loss falls by more than half."""
    m = M.build(config(mixer, vocab_size=11, recurrent_block="griffin"), seed=0)
    assert m.last_backends == [None, None]  # nothing ran yet
    pattern = torch.tensor([3, 1, 4, 1, 5])
    tokens = pattern.repeat(4, 5)[:, :24].roll(1, dims=1)  # [4, 24], rows alike
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    losses = []
    for _ in range(25):
        loss = torch.nn.functional.cross_entropy(m(tokens[:, :-1]).flatten(0, 1),
                                                 tokens[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses
    assert m.last_backends == [REF, REF]


@pytest.mark.parametrize("mixer", mixers.names())
def test_griffin_triton_default_equals_reference(mixer):
    """backend "auto" runs a Triton backend (on CUDA, else under TRITON_INTERPRET=1 on a CPU,
    tests/conftest.py); float32 against the chunked reference: forward, state, packing, steps."""
    from samu import backends
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ref = griffin(mixer, dtype=torch.float32).to(device)
    tri = griffin(mixer, dtype=torch.float32, backend="auto").to(device)
    tri.load_state_dict(ref.state_dict())
    x = inputs(2, L, D, dtype=torch.float32).to(device)
    want, want_final = ref(x, output_final_state=True)
    got, got_final = tri(x, output_final_state=True)
    assert backends.REGISTRY[mixer][tri.last_backend].kind == "triton", tri.last_backend
    # cuBLAS may sum the projections in another order than the CPU does
    tol = dict(atol=1e-4, rtol=1e-4) if device == "cuda" else dict(atol=2e-5, rtol=2e-5)
    assert torch.allclose(got, want, **tol)
    assert torch.allclose(got_final.mixer, want_final.mixer, **tol)
    cu = torch.tensor([0, 5, 7, 12], dtype=torch.int32, device=device)
    state = block_state(3, ref, dtype=torch.float32)
    state = M.RecurrentBlockState(state.conv.to(device), state.mixer.to(device))
    packed = x[:1]
    assert torch.allclose(tri(packed, cu_seqlens=cu, initial_state=state),
                          ref(packed, cu_seqlens=cu, initial_state=state), **tol)
    state, outs = None, []
    for t in range(6):
        y_t, state = tri.step(x[:, t], state)
        outs.append(y_t)
    assert torch.allclose(torch.stack(outs, dim=1), want[:, :6], **tol)


def test_griffin_parameters_follow_the_formula():
    cfg = config("rglru", width=64, rglru_heads=4, recurrent_block="griffin", lru_width=96)
    m = M.build(cfg)
    counts = m.parameter_counts()
    lru = 96
    per_layer = (2 * (64 * lru + lru)  # linear_x, linear_y
                 + 4 * lru + lru  # conv taps and bias
                 + parameter_count("rglru", lru, 4)
                 + lru * 64 + 64)  # linear_out
    assert M.griffin_parameters("rglru", 64, 96, 4, 4) == per_layer
    assert counts["mixer"] == 2 * per_layer == cfg.layers * cfg.recurrent_mixer_parameters("rglru")
    assert m.blocks[0].mixer.parameter_counts()["total"] == per_layer
    assert counts["total"] == m.num_parameters
    bare = M.build(config("rglru", width=64, rglru_heads=4)).parameter_counts()
    for part in ("embedding", "mlp", "norm", "head"):
        assert counts[part] == bare[part], part
    samu_block = M.build(config("samu", width=64, recurrent_block="griffin")).parameter_counts()
    assert samu_block["mixer"] == 2 * M.griffin_parameters("samu", 64, conv_width=4)


def test_griffin_configuration():
    assert M.ModelConfig(vocab_size=8, mixer="rglru").recurrent_block == "bare"  # the default
    cfg = M.ModelConfig(vocab_size=8, mixer="rglru", width=64, recurrent_block="griffin",
                        lru_width=128, conv_width=3)
    assert cfg.resolved_rglru_heads == 2  # of the lru width, 128
    described = cfg.describe()
    assert described["recurrent_block"] == "griffin" and described["lru_width"] == 128
    assert described["conv_width"] == 3 and described["rglru_heads"] == 2
    block = M.build(cfg).blocks[1].mixer
    assert isinstance(block, M.RecurrentBlock) and block.lru_width == 128
    assert block.conv_width == 3 and block.mixer.num_heads == 2
    assert isinstance(M.build(config("samu")).blocks[0].mixer, SAMU)  # bare
    # attention ignores the block but its matched heads follow it: the Griffin block of RG-LRU
    # at width 256 (4 heads) has about 3.5 D^2 parameters, 7 heads of 32 channels
    matched = M.ModelConfig(vocab_size=8, mixer="attention", recurrent_block="griffin")
    target = matched.recurrent_mixer_parameters("rglru")
    assert target == M.griffin_parameters("rglru", 256, 256, 4, 4) == 232192
    assert matched.resolved_attention_heads == round(target / (4 * 256 * 32)) == 7
    assert M.ModelConfig(vocab_size=8, mixer="attention").resolved_attention_heads == 1


def test_standard_attention_heads():
    cfg = M.ModelConfig(vocab_size=8, mixer="attention", attention_heads="standard",
                        attention_head_dim=64)
    assert cfg.resolved_attention_heads == 4 and cfg.describe()["attention_heads"] == 4
    m = M.build(cfg)
    assert m.blocks[0].mixer.heads == 4
    assert m.parameter_counts()["mixer"] == 2 * 4 * 256 * 256
    assert M.ModelConfig(vocab_size=8, mixer="attention",
                         attention_heads="matched").resolved_attention_heads == 1


def test_griffin_initial_scales():
    m = M.build(M.ModelConfig(vocab_size=64, mixer="samu", width=256, layers=4,
                              recurrent_block="griffin"), seed=0)
    block = m.blocks[0].mixer
    assert abs(block.linear_x.weight.std().item() - 256 ** -0.5) < 0.002
    assert abs(block.linear_y.weight.std().item() - 256 ** -0.5) < 0.002
    assert abs(block.linear_out.weight.std().item() - (0.5 / 256) ** 0.5) < 0.002  # 2 / layers
    assert abs(block.conv_1d.w.std().item() - (0.01 / 4) ** 0.5) < 0.004
    for bias in (block.linear_x.bias, block.linear_y.bias, block.linear_out.bias,
                 block.conv_1d.b):
        assert torch.equal(bias, torch.zeros_like(bias))
    again = M.build(m.config, seed=0).blocks[0].mixer
    assert torch.equal(again.conv_1d.w, block.conv_1d.w)
    assert not torch.equal(m.blocks[1].mixer.conv_1d.w, block.conv_1d.w)


@pytest.mark.parametrize("mixer", mixers.names())
def test_griffin_model_causal_and_every_parameter_learns(mixer):
    m = M.build(config(mixer, vocab_size=11, recurrent_block="griffin"), seed=1)
    tokens = torch.arange(40).remainder(11).view(2, 20)
    base = m(tokens)
    later = tokens.clone()
    later[:, 10:] = (later[:, 10:] + 3) % 11
    out = m(later)
    assert torch.allclose(out[:, :10], base[:, :10], atol=1e-6, rtol=0)
    assert not torch.allclose(out[:, 10:], base[:, 10:], atol=1e-4)
    torch.nn.functional.cross_entropy(base.flatten(0, 1), tokens.roll(-1).flatten()).backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("kw, error, words", [
    (dict(recurrent_block="mamba"), ValueError, "unknown recurrent_block 'mamba'"),
    (dict(lru_width=64), ValueError, "lru_width needs recurrent_block='griffin'"),
    (dict(recurrent_block="griffin", lru_width=0), ValueError, "lru_width"),
    (dict(recurrent_block="griffin", conv_width=0), ValueError, "conv_width"),
    (dict(recurrent_block="griffin", lru_width=48, rglru_heads=32), ValueError,
     "lru_width 48 is not divisible by rglru_heads"),
    (dict(mixer="attention", attention_heads="wide"), ValueError, "unknown attention_heads"),
    (dict(mixer="attention", attention_heads="standard", attention_head_dim=12), ValueError,
     "divisible by attention_head_dim"),
])
def test_bad_griffin_configuration_is_refused(kw, error, words):
    kw = {"vocab_size": 10, "mixer": "rglru", "width": 32, **kw}
    with pytest.raises(error, match=words):
        M.ModelConfig(**kw)


def test_griffin_bad_input_is_refused():
    block = griffin("samu")
    x = inputs(2, L, D)
    with pytest.raises(ValueError, match="unknown mixer"):
        M.RecurrentBlock("attention", D)
    with pytest.raises(ValueError, match="width 8 but the mixer's width is 16"):
        block(inputs(2, L, 8))
    with pytest.raises(ValueError, match="batch 1"):
        block(x, cu_seqlens=torch.tensor([0, 5, 12]))
    with pytest.raises(ValueError, match="end at the length"):
        block(x[:1], cu_seqlens=torch.tensor([0, 5, 11]))
    with pytest.raises(ValueError, match=r"conv state must have shape \[2, 3, 16\]"):
        block(x, initial_state=M.RecurrentBlockState(torch.zeros(2, 4, D), torch.zeros(2, D)))
    with pytest.raises(TypeError, match="RecurrentBlockState"):
        block(x, initial_state=torch.zeros(2, D))
    with pytest.raises(ValueError, match="initial_state must have shape"):
        block(x, initial_state=M.RecurrentBlockState(torch.zeros(2, 3, D), torch.zeros(3, D)))
    with pytest.raises(ValueError, match="step takes x_t"):
        block.step(x)
    with pytest.raises(TypeError, match="x_t must be a torch.Tensor, got list"):
        block.step(x[:, 0].tolist())
    with pytest.raises(TypeError, match="output_final_state"):
        block(x, output_final_state=1)
    # A state without its mixer half restarted the mixer while the convolution went on.
    for call in (lambda s: block(x, initial_state=s), lambda s: block.step(x[:, 0], s)):
        with pytest.raises(TypeError, match="the mixer state must be a torch.Tensor"):
            call(M.RecurrentBlockState(torch.zeros(2, 3, D), None))
    # step refuses x_t as forward refuses x (torch's matmul error, or a sparse x_t taken).
    for bad, words in ((x[:, 0].long(), "unsupported dtype torch.int64"),
                       (x[:, 0].to_sparse(), "x_t must be a dense tensor")):
        with pytest.raises(TypeError, match=words):
            block.step(bad)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_griffin_refuses_an_integer_conv_state_as_it_does_a_mixer_state(dtype):
    """Neither state is cast from integers: both are refused by name, in forward and step."""
    block = griffin("samu")
    x = inputs(2, L, D)
    conv, state = torch.zeros(2, 3, D), torch.zeros(2, D)
    with pytest.raises(TypeError, match="conv state must be floating point"):
        block(x, initial_state=M.RecurrentBlockState(conv.to(dtype), state))
    with pytest.raises(TypeError, match="conv state must be floating point"):
        block.step(x[:, 0], M.RecurrentBlockState(conv.to(dtype), state))
    with pytest.raises(TypeError, match="initial_state must be floating point"):
        block(x, initial_state=M.RecurrentBlockState(conv, state.to(dtype)))

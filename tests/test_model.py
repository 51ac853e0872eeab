"""samu.model: the small sequence model of the training study.  The recurrent mixers run the
chunked reference here, named: tests/conftest.py sets TRITON_INTERPRET=1 on a CPU."""
import pytest
import torch

from samu import model as M
from samu.modules import parameter_count

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

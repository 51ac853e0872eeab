"""samu.integrations.transformers against the real transformers package (the `transformers`
extra, which the `test` extra includes).

The oracle is transformers itself in float64 where it is right, with its scan and norms in
float64 too (they compute in FP32 whatever the dtype: ``float64_scan``), and, where its
convolution reads across a reset, the same tokens run apart.  Tiny random models (every
parameter perturbed, so that biases, norms and the padding embedding all count)."""
import copy

import pytest
import torch
from transformers import DynamicCache, RecurrentGemmaConfig, RecurrentGemmaForCausalLM
from transformers.models.recurrent_gemma import modeling_recurrent_gemma as hf_modeling

from samu import backends
from samu.integrations import transformers as samu_hf
from samu.integrations import weights

REFERENCE = "reference_chunked"
VOCAB = 40
HIDDEN, LRU, HEADS = 16, 32, 2  # lru_width differs from hidden_size; block width 16


def tiny_model(block_types=("recurrent", "attention"), layers=3, seed=0, dtype=torch.float64):
    config = RecurrentGemmaConfig(
        num_hidden_layers=layers, vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=32,
        num_attention_heads=HEADS, lru_width=LRU, attention_window_size=64, conv1d_width=4,
        block_types=block_types, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    torch.manual_seed(seed)
    model = RecurrentGemmaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model.to(dtype).eval()


@pytest.fixture
def float64_scan(monkeypatch):
    """transformers in float64 throughout: its RG-LRU scan accumulates in FP32 and its RMSNorm
    normalises in FP32 whatever the dtype; here both run in float64 for float64 input (the
    same formulas)."""
    scan = samu_hf.HF_RGLRU._rnn_scan

    def scan_in_float64(self, *args, **kwargs):
        return scan(self, *args, **dict(kwargs, acc_dtype=torch.float64))

    def norm_in_float64(self, x):
        wide = torch.promote_types(x.dtype, torch.float32)
        return (self._norm(x.to(wide)) * (1.0 + self.weight.to(wide))).type_as(x)
    monkeypatch.setattr(samu_hf.HF_RGLRU, "_rnn_scan", scan_in_float64)
    monkeypatch.setattr(hf_modeling.RecurrentGemmaRMSNorm, "forward", norm_in_float64)


def tokens(batch, length, seed=1):
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def assert_close(got, want, what, rtol=1e-10, atol=1e-12):
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_grads(got, want, **tol):
    assert got.keys() == want.keys()
    for name in want:
        assert_close(got[name], want[name], name, **tol)


def train_step(model, ids, position_ids=None):
    model.zero_grad()
    out = model(input_ids=ids, position_ids=position_ids, labels=ids, use_cache=False)
    out.loss.backward()
    return out.logits.detach(), out.loss.detach(), grads(model)


@pytest.mark.parametrize("shift", [None, (5, 0)], ids=["positions-from-0", "row-0-mid-sequence"])
def test_training_equals_transformers(float64_scan, shift):
    """Logits, loss and every gradient of a model with recurrent and attention layers; row 0
    may start inside a sequence (no reset at all), as a packed pretraining row does."""
    model = tiny_model()
    patched = copy.deepcopy(model)
    handle = samu_hf.patch(patched, backend=REFERENCE)
    ids = tokens(2, 12)
    positions = None if shift is None else torch.arange(12) + torch.tensor(shift)[:, None]
    want = train_step(model, ids, positions)
    got = train_step(patched, ids, positions)
    assert_close(got[0], want[0], "logits")
    assert_close(got[1], want[1], "loss")
    assert_same_grads(got[2], want[2])
    assert set(handle.last_backends.values()) == {REFERENCE}


def segments(position_ids_row):
    """[(start, end)] of the runs that start where the position is 0."""
    starts = [t for t, p in enumerate(position_ids_row) if p == 0]
    if not starts or starts[0] != 0:
        starts = [0] + starts
    return list(zip(starts, starts[1:] + [len(position_ids_row)]))


def packed_positions(row_starts, length):
    positions = torch.zeros(len(row_starts), length, dtype=torch.long)
    for row, starts in enumerate(row_starts):
        for a, b in zip(starts, starts[1:] + [length]):
            positions[row, a:b] = torch.arange(b - a)
    return positions


# Resets at the reference's chunk boundaries (L = 16: chunks of 4), at the first token of a row
# (a one-token sequence) and at its last.
PACKED = [[0, 4, 8, 15], [0, 1, 6]]


def test_packed_rows_equal_their_sequences_run_apart(float64_scan):
    """Packed rows against each sequence alone (transformers' attention masks packed sequences
    by their positions), logits and every gradient (the probe's weights summed)."""
    model = tiny_model()
    patched = copy.deepcopy(model)
    samu_hf.patch(patched, backend=REFERENCE)
    ids = tokens(2, 16)
    positions = packed_positions(PACKED, 16)
    probe = torch.randn(2, 16, VOCAB, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(3))
    logits = patched(input_ids=ids, position_ids=positions, use_cache=False).logits
    (logits * probe).sum().backward()
    model.zero_grad()
    for row in range(2):
        for a, b in segments(positions[row].tolist()):
            alone = model(input_ids=ids[row:row + 1, a:b], use_cache=False).logits
            assert_close(logits[row:row + 1, a:b].detach(), alone.detach(),
                         f"logits of row {row}, tokens {a}:{b}")
            (alone * probe[row:row + 1, a:b]).sum().backward()
    assert_same_grads(grads(patched), grads(model))


def test_transformers_own_conv_reads_across_a_reset(float64_scan):
    """Why the packed oracle is the sequences apart: unpatched transformers differs from them
    after a reset (its nn.Conv1d), while the patch does not (the test above)."""
    model = tiny_model(block_types=("recurrent",), layers=1)
    ids = tokens(1, 8)
    positions = packed_positions([[0, 4]], 8)
    packed = model(input_ids=ids, position_ids=positions, use_cache=False).logits
    alone = model(input_ids=ids[:, 4:], use_cache=False).logits
    assert (packed[:, 4:] - alone).abs().max() > 1e-3


def test_rglru_layer_with_resets_and_a_state_equals_transformers(float64_scan):
    """The RG-LRU alone, where transformers is right about resets: y, the state it keeps, and
    the gradients of x, every parameter and the state it started from."""
    model = tiny_model()
    layer = model.model.layers[0].temporal_block.rg_lru
    patched_model = copy.deepcopy(model)
    samu_hf.patch(patched_model, backend=REFERENCE)
    patched = patched_model.model.layers[0].temporal_block.rg_lru
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 16, LRU, dtype=torch.float64, generator=gen)
    h0 = torch.randn(2, LRU, dtype=torch.float64, generator=gen)
    positions = packed_positions([[0, 4, 8, 15], [5, 11]], 16) + torch.tensor([[0], [3]])
    positions[1, 5] = 0  # row 1 continues its state, then resets at 5 and 11
    positions[1, 11] = 0
    dy = torch.randn(2, 16, LRU, dtype=torch.float64, generator=gen)
    dh = torch.randn(2, LRU, dtype=torch.float64, generator=gen)
    results = []
    for module in (layer, patched):
        xg, hg = x.clone().requires_grad_(), h0.clone().requires_grad_()
        module.zero_grad()
        module.recurrent_states = hg
        y = module(xg, positions)
        final = module.recurrent_states
        torch.autograd.backward([y, final], [dy, dh])
        results.append((y.detach(), final.detach(), xg.grad, hg.grad,
                        {n: p.grad.clone() for n, p in module.named_parameters()}))
    (y0, f0, dx0, dh0, g0), (y1, f1, dx1, dh1, g1) = results
    assert_close(y1, y0, "y")
    assert_close(f1, f0, "final state")
    assert_close(dx1, dx0, "dx")
    assert_close(dh1, dh0, "d initial state")
    assert_same_grads(g1, g0)


def greedy(model, ids, attention_mask=None, new=6):
    with torch.no_grad():
        return model.generate(ids, attention_mask=attention_mask, max_new_tokens=new,
                              do_sample=False, pad_token_id=0)[:, ids.shape[1]:]


def test_generate_gives_transformers_tokens():
    model = tiny_model()
    patched = copy.deepcopy(model)
    samu_hf.patch(patched, backend=REFERENCE)
    ids = tokens(3, 7)
    assert torch.equal(greedy(patched, ids), greedy(model, ids))


def test_generate_left_padded_equals_each_prompt_alone():
    """Left padding: each row's tokens are those of its prompt alone (transformers' own
    convolution reads the padding into the first tokens; the padding embedding is not zero
    here)."""
    model = tiny_model()
    patched = copy.deepcopy(model)
    samu_hf.patch(patched, backend=REFERENCE)
    lengths = [7, 2, 5]
    ids = tokens(3, 7)
    mask = torch.zeros(3, 7, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, :7 - n] = 0
        mask[row, 7 - n:] = 1
    batch = greedy(patched, ids, mask)
    for row, n in enumerate(lengths):
        assert torch.equal(batch[row], greedy(model, ids[row:row + 1, 7 - n:])[0]), row


def continued_logits(model, ids, positions, cuts):
    """Logits of the calls ids[:, a:b] (a, b from cuts), one cache continued across them."""
    cache, out = DynamicCache(config=model.config), []
    with torch.no_grad():
        for a, b in zip(cuts, cuts[1:]):
            out.append(model(input_ids=ids[:, a:b], position_ids=positions[:, a:b], cache=cache,
                             use_cache=True).logits)
    return torch.cat(out, dim=1)


def test_cache_continued_across_calls_equals_one_call(float64_scan):
    """Prefill, a second prefill (samu continues its convolution; transformers' restarts it),
    then decode steps, against one call of transformers over all the tokens."""
    model = tiny_model()
    patched = copy.deepcopy(model)
    samu_hf.patch(patched, backend=REFERENCE)
    ids = tokens(2, 12)
    positions = torch.arange(12).expand(2, 12)
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits
    got = continued_logits(patched, ids, positions, [0, 5, 9, 10, 11, 12])
    assert_close(got, want, "logits")


def recurrent_block(model):
    return model.model.layers[0].temporal_block


def block_calls(block, x, positions, cuts):
    """The block over x[:, a:b] for each call, its cache continued."""
    block.conv1d_state, block.rg_lru.recurrent_states = None, None
    with torch.no_grad():
        return torch.cat([block(x[:, a:b], position_ids=positions[:, a:b], attention_mask=None,
                                use_cache=True)[0] for a, b in zip(cuts, cuts[1:])], dim=1)


CUTS = {"one-call": [0, 16], "prefill-steps-prefill": [0, 6, 7, 8, 13, 16],
        "resets-at-steps": [0, 5, 6, 10, 11, 16]}
TRITON = "triton-" + backends.DEFAULTS["rglru"]
# The Triton backends run on CUDA where there is a GPU, under the interpreter on a CPU.
KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("backend, cuts", [(REFERENCE, c) for c in CUTS.values()]
                         + [(TRITON, CUTS["resets-at-steps"])],
                         ids=[*CUTS, TRITON + "-resets-at-steps"])
def test_block_with_cache_and_resets_equals_its_sequences_apart(float64_scan, backend, cuts):
    """The recurrent block, its cache continued over calls of several tokens and of one (a
    decode step), resets in prefills and at steps (positions 0 at 6, 10 and 15; 5 and 10 are
    a call's first token), against each sequence through transformers' block alone; the
    reference in float64, the Triton backend (under the interpreter on a CPU) in FP32."""
    model = tiny_model()
    block = recurrent_block(model)
    triton = backend.startswith("triton-")
    patched_model = (copy.deepcopy(model).float().to(KERNEL_DEVICE) if triton
                     else copy.deepcopy(model))
    samu_hf.patch(patched_model, backend=backend.removeprefix("triton-"))
    x = torch.randn(2, 16, HIDDEN, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    positions = packed_positions([[0, 6, 10, 15], [0, 5, 10]], 16)
    device = patched_model.device
    got = block_calls(recurrent_block(patched_model), x.to(device, patched_model.dtype),
                      positions.to(device), cuts).double().cpu()
    tol = dict(rtol=1e-4, atol=1e-5) if triton else {}
    for row in range(2):
        for a, b in segments(positions[row].tolist()):
            with torch.no_grad():
                alone = block(x[row:row + 1, a:b], position_ids=positions[row:row + 1, a:b],
                              attention_mask=None, use_cache=False)[0]
            assert_close(got[row:row + 1, a:b], alone, f"row {row}, tokens {a}:{b}", **tol)


def test_cache_stays_in_transformers_format(float64_scan):
    """A prefill by one side, decode steps by the other, either way round, equal transformers
    throughout: the state patch keeps is transformers' own."""
    model = tiny_model()
    ids = tokens(2, 10)
    positions = torch.arange(10).expand(2, 10)
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits
    for first_patched in (True, False):
        cache, out = DynamicCache(config=model.config), []
        handle = samu_hf.patch(model, backend=REFERENCE) if first_patched else None
        with torch.no_grad():
            out.append(model(input_ids=ids[:, :7], position_ids=positions[:, :7], cache=cache,
                             use_cache=True).logits)
            if first_patched:
                handle.unpatch()
            else:
                handle = samu_hf.patch(model, backend=REFERENCE)
            for t in range(7, 10):
                out.append(model(input_ids=ids[:, t:t + 1], position_ids=positions[:, t:t + 1],
                                 cache=cache, use_cache=True).logits)
        handle.unpatch()
        assert_close(torch.cat(out, dim=1), want, f"prefill patched: {first_patched}")


def test_patch_is_reversible_and_changes_no_parameter():
    model = tiny_model()
    original = copy.deepcopy(model)
    keys = list(model.state_dict())
    ids = tokens(2, 9)
    with torch.no_grad():
        want = original(input_ids=ids, use_cache=False).logits
    with samu_hf.patch(model, backend=REFERENCE) as handle:
        assert samu_hf.is_patched(model) and handle.active
        assert list(model.state_dict()) == keys
        assert [n for n, _ in model.named_modules()] == [n for n, _ in original.named_modules()]
        with pytest.raises(ValueError, match="patched already"):
            samu_hf.patch(model)
    assert not samu_hf.is_patched(model) and not handle.active
    for mine, theirs in zip(model.modules(), original.modules()):
        assert type(mine) is type(theirs)
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids, use_cache=False).logits, want)
    handle.unpatch()  # a second undo changes nothing
    again = samu_hf.patch(model, backend=REFERENCE)
    # The first handle, undone, neither claims the new patch nor undoes it.
    assert not handle.active and again.active
    handle.unpatch()
    assert samu_hf.is_patched(model) and again.active
    assert list(again.last_backends) == list(again.blocks)
    assert samu_hf.unpatch(model) == 2 and not samu_hf.is_patched(model)


def test_a_refused_rg_lru_call_leaves_the_cache_as_it_was():
    """The convolution's cache moved on before the RG-LRU refused the call (a Triton backend
    on a float64 model), so the two states no longer agreed."""
    model = tiny_model(block_types=("recurrent",), layers=1)
    block = model.model.layers[0].temporal_block
    x = torch.randn(2, 5, HIDDEN, dtype=torch.float64)
    with samu_hf.patch(model, backend=backends.DEFAULTS["rglru"]):
        block._setup_cache(2, "cpu", torch.float64)
        block.conv1d_state.normal_()
        before = block.conv1d_state.clone(), block.rg_lru.recurrent_states.clone()
        with torch.no_grad(), pytest.raises(TypeError, match="float64"):
            block(x, position_ids=torch.arange(5).expand(2, 5), attention_mask=None,
                  use_cache=True)
        assert torch.equal(block.conv1d_state, before[0])
        assert torch.equal(block.rg_lru.recurrent_states, before[1])


def test_refusals_name_the_problem_and_change_nothing(monkeypatch):
    model = tiny_model()
    with pytest.raises(TypeError, match="torch.nn.Module"):
        samu_hf.patch("model")
    with pytest.raises(ValueError, match="no RecurrentGemma recurrent block"):
        samu_hf.patch(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="unknown backend|backend"):
        samu_hf.patch(model, backend="no_such_backend")
    assert not samu_hf.is_patched(model)

    bad = copy.deepcopy(model)
    bad.model.layers[2].temporal_block.conv_1d.padding = (1,)  # the second recurrent block
    with pytest.raises(ValueError, match="layers.2.temporal_block.*convolution"):
        samu_hf.patch(bad)
    assert not samu_hf.is_patched(bad)  # the first block, valid, was not patched either

    class Custom(samu_hf.HF_BLOCK):
        pass
    sub = copy.deepcopy(model)
    sub.model.layers[0].temporal_block.__class__ = Custom
    with pytest.raises(TypeError, match="Custom is not transformers' RecurrentGemmaRecurrentBlock"):
        samu_hf.patch(sub)

    for version in ("5.19.0", "6.0.0", "unknown"):
        monkeypatch.setattr(samu_hf.transformers, "__version__", version)
        with pytest.raises(RuntimeError, match=f"transformers {version} is not"):
            samu_hf.patch(model)
        assert not samu_hf.is_patched(model)
    with pytest.warns(UserWarning, match="patched anyway"):
        samu_hf.patch(model, check_version=False).unpatch()


def test_unsupported_dtype_is_refused():
    model = tiny_model()
    lru = model.model.layers[0].temporal_block.rg_lru
    lru.recurrent_param.data = lru.recurrent_param.data.to(torch.float8_e4m3fn)  # quantized
    with pytest.raises(ValueError, match="torch.float8_e4m3fn are not supported"):
        samu_hf.patch(model)


def test_position_ids_of_another_shape_are_refused():
    model = tiny_model()
    samu_hf.patch(model, backend=REFERENCE)
    with pytest.raises(ValueError, match=r"position_ids must be \[2, 5\] or \[1, 5\]"):
        model(input_ids=tokens(2, 5), position_ids=torch.arange(4)[None], use_cache=False)


def test_weights_map_both_ways(float64_scan):
    """transformers' block -> samu.model.RecurrentBlock computes the patched block's function
    (resets included); samu's weights copied back give transformers' block its own numbers."""
    model = tiny_model()
    block = recurrent_block(model)
    samu_block = samu_hf.to_samu_block(block, backend=REFERENCE).double()
    x = torch.randn(2, 12, HIDDEN, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    positions = packed_positions([[0, 5], [0]], 12)
    with torch.no_grad():
        want = block(x, position_ids=torch.arange(12)[None], attention_mask=None,
                     use_cache=False)[0]
        assert_close(samu_block(x), want, "samu block, no reset inside")
        patched = copy.deepcopy(model)
        samu_hf.patch(patched, backend=REFERENCE)
        assert_close(samu_block(x, resets=positions == 0),
                     recurrent_block(patched)(x, position_ids=positions, attention_mask=None,
                                              use_cache=False)[0], "samu block with resets")
    fresh = tiny_model(seed=9)
    samu_hf.load_samu_block(samu_block, recurrent_block(fresh))
    for name, t in block.state_dict().items():
        assert torch.equal(recurrent_block(fresh).state_dict()[name], t), name


@pytest.mark.parametrize("library", list(weights.TABLES))
def test_state_dict_conversions_round_trip(library):
    heads, bw, taps = 3, 4, 4
    width = heads * bw
    gen = torch.Generator().manual_seed(7)
    shapes = {"linear_y.weight": (width, 8), "linear_y.bias": (width,),
              "linear_x.weight": (width, 8), "linear_x.bias": (width,),
              "linear_out.weight": (8, width), "linear_out.bias": (8,),
              "conv_1d.w": (taps, width), "conv_1d.b": (width,),
              "mixer.gate_x_weight": (heads, bw, bw), "mixer.gate_x_bias": (width,),
              "mixer.gate_a_weight": (heads, bw, bw), "mixer.gate_a_bias": (width,),
              "mixer.a_param": (width,)}
    samu_sd = {k: torch.randn(s, generator=gen) for k, s in shapes.items()}
    theirs = weights.from_samu(samu_sd, library)
    biases = [e.other for e in weights.TABLES[library] if e.layout == "heads"]
    assert all(theirs[k].shape == (heads, bw) for k in biases)
    back = weights.to_samu(theirs, library)
    assert back.keys() == samu_sd.keys()
    assert all(torch.equal(back[k], samu_sd[k]) for k in samu_sd)
    with pytest.raises(ValueError, match="missing"):
        weights.to_samu({k: v for k, v in list(theirs.items())[1:]}, library)


def test_transformers_state_dict_converts_to_samu_block():
    """The table's names and layouts are transformers' own: samu's block loads them strictly."""
    block = recurrent_block(tiny_model(dtype=torch.float32))
    samu_block = samu_hf.to_samu_block(block)
    w = samu_block.conv_1d.w
    assert torch.equal(w, block.conv_1d.weight[:, 0, :].t())
    assert torch.equal(samu_block.mixer.gate_a_bias, block.rg_lru.recurrent_gate_bias.reshape(-1))


def test_triton_kernels_against_the_reference():
    """The registry's default RG-LRU Triton backend (the interpreter on a CPU), FP32, against
    the patched float64 reference (held to the sequences apart above): logits and every
    gradient, with resets at the backend's chunk boundaries, at a row's first and last token."""
    name = backends.DEFAULTS["rglru"]
    chunk = backends.REGISTRY["rglru"][name].config.chunk
    length = 2 * chunk + 1
    oracle = tiny_model()
    model = copy.deepcopy(oracle).float().to(KERNEL_DEVICE)
    samu_hf.patch(oracle, backend=REFERENCE)
    handle = samu_hf.patch(model, backend=name)
    ids = tokens(2, length)
    positions = packed_positions([[0, chunk, 2 * chunk], [0, 1, chunk]], length)
    probe = torch.randn(2, length, VOCAB, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(8))
    results = []
    for m in (oracle, model):
        m.zero_grad()
        device = m.device
        logits = m(input_ids=ids.to(device), position_ids=positions.to(device),
                   use_cache=False).logits
        (logits * probe.to(device, logits.dtype)).sum().backward()
        results.append((logits.detach().double().cpu(),
                        {n: g.cpu() for n, g in grads(m).items()}))
    assert set(handle.last_backends.values()) == {name}
    (want, want_grads), (got, got_grads) = results
    assert_close(got, want, "logits", rtol=1e-4, atol=1e-4)
    assert got_grads.keys() == want_grads.keys()
    for n in want_grads:
        assert_close(got_grads[n].double(), want_grads[n], n, rtol=1e-3, atol=1e-4)


def test_triton_decode_steps(float64_scan, monkeypatch):
    """Generation with the Triton backend: its prefill and one-launch steps (the step kernel,
    once per recurrent block and new token after the first) give the tokens of transformers
    in float64."""
    from samu.ops.rglru import step as step_kernel
    launches = []
    kernel = step_kernel.step

    def counted(*args, **kwargs):
        launches.append(args[0].shape)
        return kernel(*args, **kwargs)
    monkeypatch.setattr(step_kernel, "step", counted)
    name = backends.DEFAULTS["rglru"]
    oracle = tiny_model()
    model = copy.deepcopy(oracle).float().to(KERNEL_DEVICE)
    handle = samu_hf.patch(model, backend=name)
    ids = tokens(2, 6)
    assert torch.equal(greedy(model, ids.to(KERNEL_DEVICE), new=4).cpu(),
                       greedy(oracle, ids, new=4))
    assert set(handle.last_backends.values()) == {name}
    assert len(launches) == 2 * 3  # two recurrent blocks, three steps after the prefill


def test_samu_block_conv_resets_packed_and_stepped(float64_scan):
    """samu.model.RecurrentBlock with resets: packed rows (cu_seqlens) equal the rows apart,
    and a prefill whose last reset falls in its final convolution window, then steps (one a
    reset), equal one forward."""
    block = samu_hf.to_samu_block(recurrent_block(tiny_model()), backend=REFERENCE).double()
    gen = torch.Generator().manual_seed(10)
    x = torch.randn(2, 12, HIDDEN, dtype=torch.float64, generator=gen)
    resets = packed_positions([[0, 5, 10], [0, 3, 11]], 12) == 0
    h0 = block(x[:, :1], output_final_state=True)[1]  # a state for every row to start from
    with torch.no_grad():
        rows, final = block(x, initial_state=h0, output_final_state=True, resets=resets)
        cu = torch.tensor([0, 12, 24])
        packed, packed_final = block(x.reshape(1, 24, HIDDEN), cu_seqlens=cu, initial_state=h0,
                                     output_final_state=True, resets=resets.reshape(1, 24))
        assert_close(packed.reshape(2, 12, HIDDEN), rows, "packed")
        for got, want in zip(packed_final, final):
            assert_close(got, want, "packed final state")
        out, state = block(x[:, :11], output_final_state=True, resets=resets[:, :11])
        y_t, _ = block.step(x[:, 11], state, resets=resets[:, 11])
        assert_close(y_t, block(x, resets=resets)[:, 11], "step after a late reset")


def test_decode_without_a_prefill_where_lru_width_is_not_the_width(float64_scan):
    """A first call of one token with use_cache (the cache set up by the model): the patched
    block's state has lru_width channels (transformers' own sets up hidden_size ones, which
    its decode cannot use where they differ, as here)."""
    model = tiny_model()
    patched = copy.deepcopy(model)
    samu_hf.patch(patched, backend=REFERENCE)
    ids = tokens(2, 1)
    with torch.no_grad():
        got = patched(input_ids=ids, use_cache=True).logits
        want = model(input_ids=ids, use_cache=False).logits
    assert_close(got, want, "logits")
    assert recurrent_block(patched).conv1d_state.shape == (2, LRU, 3)


def test_float32_multiplier_is_accurate_where_a_nears_one():
    """Departure (1): as a -> 1, transformers' 1 - exp(2 log a) cancels in FP32; samu's
    -expm1(2 log a) does not.  FP32 RG-LRU layers against the float64 oracle."""
    model = tiny_model()
    layer = model.model.layers[0].temporal_block.rg_lru
    with torch.no_grad():
        layer.recurrent_param.fill_(-10.0)  # softplus ~ 5e-5: a within ~1e-3 of 1
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 64, LRU, dtype=torch.float64, generator=gen)
    positions = torch.arange(64)[None]
    oracle = copy.deepcopy(model)
    samu_hf.patch(oracle, backend=REFERENCE)
    errors = {}
    with torch.no_grad():
        want = oracle.model.layers[0].temporal_block.rg_lru(x, positions)
        for name in ("transformers", "samu"):
            m = copy.deepcopy(model).float()
            if name == "samu":
                samu_hf.patch(m, backend=REFERENCE)
            y = m.model.layers[0].temporal_block.rg_lru(x.float(), positions).double()
            errors[name] = ((y - want).norm() / want.norm()).item()
    assert errors["samu"] < 1e-6 and errors["samu"] * 4 < errors["transformers"], errors

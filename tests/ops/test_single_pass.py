"""The single-pass backends (samu.ops.<mixer>.single_pass) against the float64 oracle under SPEC
section 4's legality rule, at tiny sizes with several chunks and channel blocks, so that the
look-back runs across tiles and windows: with states, packing, resets, heads, an adversarial
ticket order and walks that cross aggregates.  On a CPU they run under Triton's interpreter (conftest), where
a group of several channel blocks takes the split exchange (Lookback.phases)."""
import dataclasses
import sys

import pytest
import torch

from samu import backends
from samu.experiment import legality
from samu.ops.common.single_pass import Lookback
from samu import mixers

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _single_pass(mixer):
    return [n for n in backends.available(mixer) if "singlepass" in n.split("_")]


def _family(mixer, name):
    config = backends.REGISTRY[mixer][name].config
    return sys.modules[type(config).__module__], config


def _small(mixer, width, **lookback):
    """The mixer's first single-pass backend at chunk 8 with one-warp tiles (32 channels: three
    channel blocks at width 80) and a look-back of two predecessors at a time."""
    family, config = _family(mixer, _single_pass(mixer)[0])
    one_warp = type(config.forward)(1, 1)
    return dataclasses.replace(config, chunk=8, forward=one_warp, backward=one_warp,
                               lookback=Lookback(window=2, **lookback))


# (label, B, L, D, cu_seqlens, initial state, reset positions per row, lookback settings),
# chunks of 8: five chunks and three channel blocks (the last partial) with walks over aggregates
# only, windows of two; two batch rows taken chain by chain; packed starts inside a chunk, at a
# chunk's first token (16) and a one-token sequence (16-17); resets at a row's first token
# (over its initial state), on a chunk boundary and inside chunks, alone and packed; one channel
# block, whose exchange runs in the same launch.
CASES = [
    ("aggregates_only", 1, 37, 80, None, False, None, dict(inclusive_every=0)),
    ("state_chain_order", 2, 21, 64, None, True, None, dict(ticket_order=1, inclusive_every=2)),
    ("packed_state", 1, 29, 48, [0, 5, 16, 17, 29], True, None, {}),
    ("packed_reset", 1, 29, 48, [0, 5, 16, 17, 29], False, None, dict(inclusive_every=0)),
    ("resets_state", 2, 29, 48, None, True, [[0, 8, 13], [20]], dict(inclusive_every=0)),
    ("resets_packed", 1, 29, 48, [0, 5, 16, 17, 29], True, [[3, 16, 24]],
     dict(ticket_order=1)),
    ("one_block_one_launch", 1, 37, 32, None, True, None, dict(inclusive_every=0)),
]


@pytest.mark.parametrize("mixer", mixers.names())
@pytest.mark.parametrize("label, batch, length, width, cu, initial, resets, lookback", CASES,
                         ids=[c[0] for c in CASES])
def test_single_pass_is_legal(mixer, label, batch, length, width, cu, initial, resets,
                              lookback):
    if not _single_pass(mixer):
        pytest.skip(f"{mixer} has no single-pass backend yet")
    config = _small(mixer, width, **lookback)
    shape = (batch, length, width)
    heads = {"rglru": dict(num_heads=width // 16)}.get(mixer, {})
    inputs = legality.make_inputs(mixer, shape, DEVICE, seed=length + width, **heads)
    state = (legality.make_state(shape, DEVICE, seed=3, cu_seqlens=cu, initial=initial,
                                 resets=resets)
             if cu is not None or initial or resets else None)
    entry = legality.check_legality(mixer, config, inputs=inputs, state=state)
    assert entry["legal"], entry["reason"]


def _forward_tile_width(mixer, family, config, width):
    """Channels of the forward's tile at this width (RG-LRU at 16 heads)."""
    plan = (family.launch_plan(config, width, 16) if mixer == "rglru"
            else family.launch_plan(config, width))
    constexprs = plan[0][1]
    return constexprs.get("BD", constexprs.get("BN"))


@pytest.mark.parametrize("mixer, name", [(m, n) for m in mixers.names()
                                          for n in _single_pass(m)])
def test_one_channel_block_over_a_long_row(mixer, name):
    """Each registered single-pass backend at the width of its forward tile, so that a row is
    one chain of consecutive tickets and each look-back waits on tiles still running: legal
    over 2 x 1024 tokens on a GPU (2 x 48 under the interpreter, which runs one program at a
    time).  Eight-warp RG-LRU tiles failed exactly this on an H100 (docs/PERFORMANCE.md, "The
    registered launches checked on an H100")."""
    length = 1024 if DEVICE == "cuda" else 48
    family, config = _family(mixer, name)
    width = _forward_tile_width(mixer, family, config, 2048)
    assert _forward_tile_width(mixer, family, config, width) == width  # one block a row
    heads = {"rglru": dict(num_heads=16)}.get(mixer, {})
    inputs = legality.make_inputs(mixer, (2, length, width), DEVICE, seed=width, **heads)
    entry = legality.check_legality(mixer, config, inputs=inputs)
    assert entry["legal"], f"{name} at width {width}: {entry['reason']}"


@pytest.mark.parametrize("mixer", mixers.names())
def test_the_exchange_splits_only_where_a_group_cannot_be_resident(mixer):
    """One launch per direction where a chunk's tiles fit on the GPU at once; two (the exchange
    apart) under the interpreter with several channel blocks, or where asked."""
    if not _single_pass(mixer):
        pytest.skip(f"{mixer} has no single-pass backend yet")
    lookback = Lookback()
    assert lookback.phases(1, torch.device(DEVICE)) == (0,)
    assert Lookback(split=True).phases(1, torch.device(DEVICE)) == (1, 2)
    assert Lookback(ticket_order=1).phases(1, torch.device(DEVICE)) == (1, 2)
    several = (0,) if DEVICE == "cuda" else (1, 2)
    assert lookback.phases(3, torch.device(DEVICE)) == several
    assert lookback.phases(10_000, torch.device(DEVICE)) == (1, 2)


@pytest.mark.parametrize("mixer", mixers.names())
def test_the_launch_plan_lists_a_split_exchange_as_two_launches(mixer):
    """The plan that count_single_pass.py reads holds each launch the settings ask for: PHASE
    0 alone, or SAMU's PHASE 1 then 2 for each kernel where the exchange is split; RG-LRU's
    tiles exchange nothing and always run in one."""
    if not _single_pass(mixer):
        pytest.skip(f"{mixer} has no single-pass backend yet")
    family, config = _family(mixer, _single_pass(mixer)[0])

    def phases(lookback):
        changed = dataclasses.replace(config, lookback=lookback)
        plan = (family.launch_plan(changed, 2048, 16) if mixer == "rglru"
                else family.launch_plan(changed, 2048))
        return [(kernel.fn.__name__, constexprs["PHASE"]) for kernel, constexprs, _ in plan]

    one = phases(Lookback())
    assert [phase for _, phase in one] == [0] * len(one)
    kernels = [name for name, _ in one]
    for asked in (Lookback(split=True), Lookback(ticket_order=1)):
        expected = ([(n, p) for n in kernels for p in (1, 2)] if mixer == "samu" else one)
        assert phases(asked) == expected


def test_lookback_settings_are_checked():
    """Windows are powers of two up to 32 (one bit a lane); rows past 2^31 elements a batch
    row are refused by name (the look-back's offsets are 32-bit)."""
    from samu.ops.common import single_pass
    with pytest.raises(ValueError, match="at most 2\\^31 - 1 elements of chunk rows"):
        single_pass.scratch(1, 2 ** 20, 2 ** 11, 16)
    assert single_pass.scratch(2, 4, 64, 2) == (16, 8)
    for window in (3, 64):
        with pytest.raises(ValueError, match="window must be a power of two up to 32"):
            Lookback(window=window)
    with pytest.raises(ValueError, match="ticket_order"):
        Lookback(ticket_order=2)


@pytest.mark.parametrize("mixer", mixers.names())
def test_launches_per_call_are_counted(mixer, capsys):
    """describe() reports each single-pass backend's launches per forward+backward: SAMU's
    forward in two (the flags' fill, the kernel), its backward in three (and sum_partials)."""
    for name in _single_pass(mixer):
        family, config = _family(mixer, name)
        count = family.launch_count(config)
        if mixer == "samu":
            assert count == 5
        backends.describe()
        assert f"{name}" in capsys.readouterr().out


@pytest.mark.parametrize("mixer", mixers.names())
def test_any_mask_bytes_reset_alike_and_a_bad_mask_is_refused(mixer):
    """A mask's bytes only select values: any non-zero byte resets as True does, bit for bit; a
    mask of the wrong shape, given straight to a backend's run (past the functional checks), is
    refused before any kernel reads it."""
    shape = (1, 19, 32)
    x, params, _ = legality.make_inputs(mixer, shape, DEVICE, seed=4,
                                        **({"num_heads": 2} if mixer == "rglru" else {}))
    raw = torch.zeros(shape[:2], dtype=torch.uint8)
    raw[0, [0, 7, 8, 15]] = torch.tensor([255, 1, 200, 128], dtype=torch.uint8)
    for name in _single_pass(mixer):
        run = backends.REGISTRY[mixer][name].run
        ps = list(params.values())
        want, _ = run(x, *ps, resets=(raw != 0).to(DEVICE))
        got, _ = run(x, *ps, resets=raw.to(DEVICE).view(torch.bool))
        assert torch.equal(got, want), name
        with pytest.raises(ValueError, match="the reset mask must be torch.bool"):
            run(x, *ps, resets=torch.zeros(1, shape[1] + 1, dtype=torch.bool, device=DEVICE))


@pytest.mark.parametrize("mixer", mixers.names())
def test_the_chunk_and_channel_block_counts_are_never_specialised(mixer):
    """Triton 3.6 (the GPUs' here) fails to compile a single-pass kernel whose chunk count it
    specialised into the constant 1 (a one-chunk call; Triton 3.9 compiles it), and RG-LRU's
    eight-warp tiles went wrong on an H100 only where the channel-block count was 1
    (docs/PERFORMANCE.md, "The registered launches checked on an H100"): every kernel of each
    single-pass family takes NC and N_CB unspecialised, under the interpreter as compiled."""
    for name in _single_pass(mixer):
        family, _ = _family(mixer, name)
        for role, kernel in family.KERNELS.items():
            kept = (kernel.kwargs["do_not_specialize"] if hasattr(kernel, "kwargs")
                    else kernel.do_not_specialize)
            assert "NC" in kept and "N_CB" in kept, (name, role)

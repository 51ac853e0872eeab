"""Every Triton backend against the float64 oracle with SPEC section 4's legality rule.
On a CPU these run under Triton's interpreter at tiny sizes (conftest sets TRITON_INTERPRET)."""
import dataclasses
import sys

import pytest
import torch
import triton
import triton.language as tl

import samu
from samu import backends
from samu.experiment import legality
from samu.functional import FUNCTIONS, PARAMETER_NAMES
from samu.ops.common import carry, launching
from samu.ops.common.function import run_with
from samu.ops.common.math import softplus
from samu.ops.common.scan import row_offsets
from samu.ops.rglru import gemm as rglru_gemm
from samu.ops.samu import chunk as samu_chunk
from samu import mixers

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _triton(mixer):
    return [n for n in backends.available(mixer) if backends.REGISTRY[mixer][n].kind == "triton"]


def _hierarchical_samu():
    """SAMU's backends of the hierarchical family (samu.ops.samu.chunk): the variants below
    change its configuration's fields."""
    return [n for n in _triton("samu")
            if isinstance(backends.REGISTRY["samu"][n].config, samu_chunk.SamuConfig)]


def _chunk(mixer, name):
    return backends.REGISTRY[mixer][name].config.chunk


# every backend over two chunks (so its carries run); the defaults also at odd lengths, B > 1,
# widths that are not powers of two, and length 1
CASES = [(m, n, (1, _chunk(m, n) + 5, 48)) for m in mixers.names() for n in _triton(m)]
CASES += [("samu", backends.DEFAULTS["samu"], s) for s in [(2, 37, 48), (1, 1, 16), (3, 37, 80)]]
CASES += [("rglru", backends.DEFAULTS["rglru"], s) for s in [(2, 37, 48), (1, 1, 16), (1, 37, 96)]]
# SAMU walks its carries inside the kernels up to walked_carry_chunks chunks: every SAMU backend
# also with chunk_carry's launches, and the default past the walk's limit.
CASES += [("samu", dataclasses.replace(backends.REGISTRY["samu"][n].config,
                                       walked_carry_chunks=0), (2, 3 * _chunk("samu", n) + 5, 48))
          for n in _hierarchical_samu()]
CASES += [("samu", backends.DEFAULTS["samu"],
           (1, (backends.REGISTRY["samu"][backends.DEFAULTS["samu"]].config.walked_carry_chunks
                + 2) * _chunk("samu", backends.DEFAULTS["samu"]) + 3, 32))]


# Both defaults with long-row carries cut into two-chunk segments: in two levels, and by the
# look-back, one segment at a time and two at once (SAMU's carries as chunk_carry gives them,
# not walked).  Six chunks, the last one partial: three segments
# (test_carry_plans_match_a_sequential_carry takes many more).
LONG_ROW_PLANS = (carry.CarryPlan(two_level_from=4, segment_chunks=2),
                  carry.CarryPlan(two_level_from=4, segment_chunks=2, lookback=True),
                  carry.CarryPlan(two_level_from=4, segment_chunks=2, lookback=True, window=2))
for _mixer in mixers.names():
    _config = backends.REGISTRY[_mixer][backends.DEFAULTS[_mixer]].config
    _walk = dict(walked_carry_chunks=0) if _mixer == "samu" else {}
    CASES += [(_mixer, dataclasses.replace(_config, carry=plan, **_walk),
               (2, 5 * _config.chunk + 3, 48)) for plan in LONG_ROW_PLANS]


# The backward's pass 2 from the partial dx that pass 1 wrote, for every SAMU backend, also
# across several chunks with chunk_carry's launches.
CASES += [("samu", dataclasses.replace(backends.REGISTRY["samu"][n].config, partial_dx=True, **walk),
           (2, 3 * _chunk("samu", n) + 5, 48))
          for n in _hierarchical_samu() for walk in ({}, dict(walked_carry_chunks=0))]


# The two full-width kernels with their tiles' L2 eviction priorities (scan.load_tile), with the
# carry walked and launched: the hints change no value.
CASES += [("samu", dataclasses.replace(backends.REGISTRY["samu"][n].config, l2_hints=True, **walk),
           (2, 3 * _chunk("samu", n) + 5, 48))
          for n in _hierarchical_samu()[:2] for walk in ({}, dict(walked_carry_chunks=0))]
_first_samu = _hierarchical_samu()[0]
CASES += [("samu", dataclasses.replace(backends.REGISTRY["samu"][_first_samu].config,
                                       l2_hints=True, partial_dx=True),
           (2, 3 * _chunk("samu", _first_samu) + 5, 48))]


def _config_id(value):
    if dataclasses.is_dataclass(value):
        walk = getattr(value, "walked_carry_chunks", None)
        partial = "-partial_dx" if getattr(value, "partial_dx", False) else ""
        hints = "-l2_hints" if getattr(value, "l2_hints", False) else ""
        plan = "" if value.carry == carry.DEFAULT_PLAN else f"-{value.carry.label}"
        return f"{value.name}-walked_carry_chunks{walk}{plan}{partial}{hints}"
    return None


@pytest.mark.parametrize("mixer, backend, shape", CASES, ids=_config_id)
def test_backend_is_legal(mixer, backend, shape):
    entry = legality.check_legality(mixer, backend, shape, DEVICE, seed=sum(shape))
    assert entry["legal"], entry["reason"]
    assert not entry["materialized_state_sized_transition"]
    assert set(entry["errors"]) == {"y", "x", *legality.PARAMETER_NAMES[mixer]}


@pytest.mark.parametrize("mixer", mixers.names())
def test_chunk_sizes_agree(mixer):
    """Kernel formulations with different chunks give the same function (beyond rounding)."""
    x, params, dy = legality.make_inputs(mixer, (1, 20, 32), DEVICE, seed=5,
                                            dtype=torch.float32)
    names = _triton(mixer)[:2]
    outs = [legality.outputs(mixer, n, x, params, dy) for n in names]
    for key in outs[0]:
        a, b = outs[0][key].double(), outs[1][key].double()
        assert ((a - b).norm() / b.norm().clamp_min(1e-30)).item() < 1e-4, key


def test_float32_input_is_accurate():
    x, params, dy = legality.make_inputs("samu", (2, 33, 16), DEVICE, seed=1,
                                            dtype=torch.float32)
    got = legality.outputs("samu", backends.DEFAULTS["samu"], x, params, dy)
    want = legality.oracle("samu", x, params, dy)
    errs = legality.relative_errors(got, want)
    assert max(errs.values()) < 1e-4, errs


@pytest.mark.parametrize("mixer", mixers.names())
def test_cached_launches_pass_every_argument(mixer, monkeypatch):
    """launching.launch replays a compiled kernel with the positional arguments followed by
    the constexprs in signature order, taken from the keywords: every launch site must pass
    every kernel argument, the constexprs by keyword, and every kernel must be launched."""
    seen = []

    def checked_launch(kernel, grid, *args, **meta):
        missing = [n for n in kernel.arg_names[len(args):] if n not in meta]
        assert not missing, (kernel.fn.__name__, missing)
        seen.append(kernel.fn.__name__)
        kernel[grid](*args, **meta)

    monkeypatch.setattr(launching, "launch", checked_launch)  # every kernel launches through it
    x, params, dy = legality.make_inputs(mixer, (1, 20, 32), DEVICE, seed=2)
    legality.outputs(mixer, backends.DEFAULTS[mixer], x, params, dy)
    config = backends.REGISTRY[mixer][backends.DEFAULTS[mixer]].config
    if mixer == "samu":  # three chunks: the carries are walked; then with chunk_carry
        assert "chunk_carry_kernel" not in seen
        legality.outputs(mixer, dataclasses.replace(config, walked_carry_chunks=0), x, params,
                         dy)
    kernels = sys.modules[type(config).__module__].KERNELS
    shared = {"chunk_carry_kernel", "sum_partials_kernel"}
    if mixer == "samu":  # d ctrl_weight = dz^T x, split over tokens
        shared.add("weight_partials_kernel")
    assert set(seen) == {k.fn.__name__ for k in kernels.values()} | shared


def test_launch_cache_keys_on_what_triton_specialises():
    from samu.ops.common.launching import arg_key
    assert arg_key([16]) != arg_key([17])
    assert arg_key([1]) != arg_key([3])
    assert arg_key([2**31]) != arg_key([2**31 - 16])
    t = torch.zeros(8)
    assert arg_key([t]) != arg_key([t.double()])


@pytest.mark.parametrize("mixer", mixers.names())
def test_kernels_get_aligned_pointers_from_misaligned_inputs(mixer, monkeypatch):
    """The launch cache does not key pointer alignment, so every pointer must come aligned:
    x, dy and parameters that are views 4 bytes into their storage are copied first."""
    misaligned = []

    def checked_launch(kernel, grid, *args, **meta):
        misaligned.extend(a.data_ptr() % 16 for a in args
                          if isinstance(a, torch.Tensor) and a.data_ptr() % 16)
        kernel[grid](*args, **meta)

    monkeypatch.setattr(launching, "launch", checked_launch)  # every kernel launches through it
    x, params, dy = legality.make_inputs(mixer, (1, 20, 32), DEVICE, seed=2)

    def shifted(t):
        """t's values in a view 4 bytes past an aligned start."""
        store = torch.empty(t.numel() * t.element_size() // 2 + 8, dtype=torch.int16,
                            device=t.device)
        view = store[2:2 + t.numel() * t.element_size() // 2].view(t.dtype).view(t.shape)
        view.copy_(t)
        assert view.data_ptr() % 16
        return view.detach()
    # Straight through the functional form: legality.outputs would clone (and so align).
    leaves = [shifted(t).requires_grad_() for t in (x, *params.values())]
    y = FUNCTIONS[mixer](*leaves, backend=backends.DEFAULTS[mixer])
    grads = torch.autograd.grad(y, leaves, shifted(dy))
    got = {"y": y.detach(), **dict(zip(["x", *PARAMETER_NAMES[mixer]], grads))}
    assert not misaligned
    errors = legality.relative_errors(got, legality.oracle(mixer, x, params, dy))
    assert max(errors.values()) < 0.02, errors


@triton.jit
def _offsets_kernel(out_ptr, batch_index, L, row_units, T: tl.constexpr, V: tl.constexpr):
    b = (tl.program_id(0) + batch_index).to(tl.int64)  # as the kernels derive it
    rows = L - T + tl.arange(0, T)
    tl.store(out_ptr + tl.arange(0, T), row_offsets(b, rows, L, row_units, V))


def test_row_offsets_stay_exact_past_two_to_the_31():
    """The kernels address [B, L, D] rows through scan.row_offsets with an int64 batch
    index: an offset past 2^31 elements must come out exact, not wrapped."""
    L, D, T, V, b = 2**20, 2**12, 16, 2, 3
    out = torch.zeros(T, dtype=torch.int64, device=DEVICE)
    _offsets_kernel[(1,)](out, b, L, D // V, T=T, V=V)
    want = [(b * L + L - T + i) * D for i in range(T)]
    assert max(want) > 2**33
    assert out.tolist() == want


# Short segments so that a 37-chunk row takes several: one level, two, and the look-back with
# every tile's inclusive state published, every third one's (walks cross summaries, then stop at
# an inclusive state), and none (every walk runs back to the first segment).
_SHORT = dict(two_level_from=8, segment_chunks=4)
CARRY_PLANS = {"one_level": carry.CarryPlan(),
               "two_level": carry.CarryPlan(**_SHORT),
               "lookback": carry.CarryPlan(**_SHORT, lookback=True),
               "lookback_every3": carry.CarryPlan(**_SHORT, lookback=True, publish_every=3),
               "lookback_summaries": carry.CarryPlan(**_SHORT, lookback=True, publish_every=0),
               # ten segments read four at a time: windows that stop at an inclusive state, and
               # windows of summaries only, back to the first segment (the last one partial)
               "window4_every3": carry.CarryPlan(**_SHORT, lookback=True, publish_every=3,
                                                 window=4),
               "window4_summaries": carry.CarryPlan(**_SHORT, lookback=True, publish_every=0,
                                                    window=4)}


# Every plan with each of reverse, scalar_decay and starts; on a GPU every combination, under the
# interpreter (slow) half of them for each plan: those where every two of the three take all four
# pairs of values, the plans taking the two halves by turns.
CARRY_CASES = [(plan, reverse, scalar_decay, starts)
               for i, plan in enumerate(CARRY_PLANS)
               for reverse in (False, True) for scalar_decay in (False, True)
               for starts in (False, True)
               if torch.cuda.is_available() or (reverse + scalar_decay + starts + i) % 2 == 0]


@pytest.mark.parametrize("plan, reverse, scalar_decay, starts", CARRY_CASES,
                         ids=[f"{p}-{'reverse' if r else 'forward'}-"
                              f"{'scalar_decay' if d else 'channel_decay'}-"
                              f"{'starts' if t else 'no_starts'}" for p, r, d, t in CARRY_CASES])
def test_carry_plans_match_a_sequential_carry(plan, reverse, scalar_decay, starts):
    """chunk_carry by each plan against a Python loop over the chunk summaries, in both
    directions, with per-channel decays (RG-LRU) and with decays rebuilt from sums of r and a
    per-channel rate (SAMU); with starts, some chunks (one the first of a segment, one inside
    one) hold a packed start (decay 0, or START_MARK for sums of r)."""
    gen = torch.Generator().manual_seed(3)
    batch, n_chunks, width = 2, 37, 24
    end = torch.randn(batch, n_chunks, width, generator=gen).to(DEVICE)
    cut = [12, 22] if starts else []
    if scalar_decay:
        # small sums of r: a segment decays by about a half, so earlier segments weigh in
        r_sum = (torch.rand(batch, n_chunks, generator=gen) * 0.1).to(DEVICE)
        a_param = torch.randn(width, generator=gen).to(DEVICE)
        log_temp = torch.tensor(-0.3, device=DEVICE)
        rate = 8 * torch.exp(log_temp) * torch.nn.functional.softplus(a_param)
        decay = torch.exp(-rate * r_sum[..., None])
        decay[:, cut] = 0.0
        r_sum[:, cut] = float("inf")
        args = (r_sum, end)
        extra = dict(rate=rate.contiguous())
    else:
        decay = torch.rand(batch, n_chunks, width, generator=gen).to(DEVICE)
        decay[:, cut] = 0.0
        args = (decay, end)
        extra = {}
    want = torch.zeros_like(end)
    state = torch.zeros(batch, width, device=DEVICE)
    order = range(n_chunks - 1, -1, -1) if reverse else range(n_chunks)
    for k in order:
        want[:, k] = state
        state = decay[:, k] * state + end[:, k]
    got = carry.chunk_carry(*args, reverse=reverse, plan=CARRY_PLANS[plan], **extra)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (got - want).abs().max()


def test_host_helpers_match_triton():
    """launching.cdiv / next_power_of_2 stand in for Triton's JIT versions on the host."""
    from samu.ops.common.launching import cdiv, next_power_of_2
    for n in range(1, 300):
        assert next_power_of_2(n) == triton.next_power_of_2(n)
        for d in (1, 7, 16, 128):
            assert cdiv(n, d) == triton.cdiv(n, d)


def test_carries_are_walked_only_for_short_small_calls():
    """The walked carry costs instructions per earlier chunk: only up to walked_carry_chunks
    chunks per row and walked_carry_elements elements, where the host sets the time."""
    config = samu_chunk.SamuConfig(8, walked_carry_chunks=16, walked_carry_elements=1 << 20)
    assert config.walks_carry(16, 1 << 20)
    assert not config.walks_carry(17, 1 << 10)
    assert not config.walks_carry(2, (1 << 20) + 1)


def test_samu_register_cap_reaches_the_launch_and_is_left_off_with_a_state_keyword(monkeypatch):
    """A capped SAMU launch compiles with maxnreg on the default path, and without it where one
    of that kernel's own state keywords is on (its loads would spill under a cap tuned without
    them); the result stays legal against the float64 oracle."""
    capped = samu_chunk.Launch(2, 2, registers=128)
    config = dataclasses.replace(samu_chunk.CONFIGS[0], output=capped, backward=capped)
    watched = {samu_chunk._samu_output_kernel: "output",
               samu_chunk._samu_backward_kernel: "backward"}
    caps = []
    real = launching.launch

    def spy(kernel, grid, *args, **meta):
        if kernel in watched:
            caps.append((watched[kernel], meta.get("maxnreg")))
        return real(kernel, grid, *args, **meta)

    monkeypatch.setattr(launching, "launch", spy)
    x, params, dy = legality.make_inputs("samu", (1, 21, 32), DEVICE)
    got = legality.outputs("samu", config, x, params, dy)
    want = legality.oracle("samu", x, params, dy)
    assert max(legality.relative_errors(got, want).values()) < 0.02
    assert caps == [("output", 128), ("backward", 128)]
    run = run_with(samu_chunk, config)
    ps = [p.float() for p in params.values()]
    for keywords, expected in ((dict(initial_state=torch.zeros(1, 32, device=DEVICE)),
                                [("output", None), ("backward", None)]),
                               # the final state unused: only the output kernel's HAS_FINAL
                               (dict(output_final_state=True),
                                [("output", None), ("backward", 128)])):
        caps.clear()
        xg = x.clone().float().requires_grad_()
        y, _ = run(xg, *ps, **keywords)
        y.backward(dy.float())
        assert caps == expected, keywords
    plan = {k.fn.__name__: options for k, _, options in samu_chunk.launch_plan(config, 32)}
    assert plan["_samu_backward_kernel"] == dict(num_warps=2, maxnreg=128)
    assert "maxnreg" not in plan["_samu_summary_kernel"]
    plan = {k.fn.__name__: options
            for k, _, options in samu_chunk.launch_plan(config, 32, features=True)}
    assert "maxnreg" not in plan["_samu_backward_kernel"]


@pytest.mark.parametrize("hints", [False, True])
def test_samu_l2_hints_reach_both_full_width_kernels(hints):
    """l2_hints is the summary's and the backward's L2_HINTS constexpr, in the launch plan and
    in the Sites a call launches; the other kernels take none."""
    config = dataclasses.replace(samu_chunk.CONFIGS[0], l2_hints=hints)
    plan = {k.fn.__name__: meta for k, meta, _ in samu_chunk.launch_plan(config, 32)}
    assert plan["_samu_summary_kernel"]["L2_HINTS"] is hints
    assert plan["_samu_backward_kernel"]["L2_HINTS"] is hints
    assert "L2_HINTS" not in plan["_samu_output_kernel"]
    assert "L2_HINTS" not in plan["_samu_reverse_summary_kernel"]
    forward = samu_chunk._forward_plan(config, (1, 64, 32), 1, torch.bfloat16, torch.float32,
                                       torch.device("cpu"), ())
    backward = samu_chunk._backward_plan(config, (1, 64, 32), 1, (torch.bfloat16,) * 3,
                                         torch.device("cpu"), (), False)
    assert forward.summary.meta["L2_HINTS"] is hints
    assert backward.main.meta["L2_HINTS"] is hints


def test_carve_cuts_aligned_disjoint_pieces():
    """launching.carve: contiguous pieces of the asked shapes, one after another from the
    buffer's start (a view at an offset too), each 16-byte aligned, none overlapping."""
    from samu.ops.common.launching import carve, carved_size
    shapes = [(3, 5, 7), (2, 9), (4,), (1,)]
    backing = torch.zeros(carved_size(shapes) + 8)
    flat = backing[4:]  # 16 bytes in: the start is aligned, the storage offset is not 0
    pieces = carve(flat, shapes)
    assert [tuple(p.shape) for p in pieces] == shapes
    assert all(p.is_contiguous() for p in pieces)
    offsets = [p.data_ptr() - flat.data_ptr() for p in pieces]
    assert offsets[0] == 0 and all(o % 16 == 0 for o in offsets)
    for i, p in enumerate(pieces):
        p.fill_(i + 1)
    assert int((flat != 0).sum()) == sum(p.numel() for p in pieces)  # disjoint, inside flat
    assert backing[:4].eq(0).all()
    assert carve(flat, [list(s) for s in shapes])[1].data_ptr() == pieces[1].data_ptr()
    assert carve(flat, (tuple(s) for s in shapes))[2].data_ptr() == pieces[2].data_ptr()
    with pytest.raises(ValueError, match="carve"):
        carve(flat[:-8], shapes)


class _UninitialisedTorch:
    """torch whose empty() hands out NaN, as uninitialised memory may hold."""
    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def empty(*args, **kwargs):
        return torch.empty(*args, **kwargs).fill_(float("nan"))


def test_workspace_cuts_aligned_disjoint_pieces_and_zeroes_its_gaps(monkeypatch):
    """launching.workspace: one buffer cut into 1-D pieces of at least the asked sizes, each
    16-byte aligned, none overlapping, the last ending the buffer; ``pieces`` cuts a buffer the
    same way; with zero_gaps nothing between pieces is left uninitialised; ``exact`` gives a
    piece its shape."""
    from samu.ops.common import launching
    from samu.ops.common.launching import exact, pieces, workspace
    monkeypatch.setattr(launching, "torch", _UninitialisedTorch())
    numels = (7, 16, 1, 5)
    flat, cut = workspace(numels, "cpu")
    assert [p.numel() for p in cut] == [8, 16, 4, 5] and flat.numel() == 33
    assert all(p.data_ptr() % 16 == 0 for p in cut)
    assert [p.data_ptr() for p in pieces(flat, numels)] == [p.data_ptr() for p in cut]
    for i, p in enumerate(cut):
        p[:numels[i]].fill_(i + 1)
    assert int(flat.isnan().sum()) == 8 + 16 + 4 + 5 - sum(numels)  # the gaps only
    flat, cut = workspace(numels, "cpu", zero_gaps=True)
    for p, n in zip(cut, numels):
        p[:n].fill_(1.0)
    assert int(flat.sum()) == sum(numels) and int((flat == 0).sum()) == flat.numel() - sum(numels)
    assert exact(cut[1], (4, 4)).shape == (4, 4)
    assert exact(cut[0], (7,)).data_ptr() == cut[0].data_ptr()


# Slow decay (a near 1: softplus(a_param) of 1e-13 at -30) and fast decay (a near 0); training
# drives a_param to both ends, initialisation stays in between.
EXTREME_A_PARAM = [-30.0, -17.0, -12.0, -8.0, 10.0, 30.0]
# Every value at every chunk.  A recomputing RG-LRU backend computes the decays as the saving one
# of its chunk does: under the interpreter (slow) it takes the two ends only.
EXTREME_CASES = [(m, n, a) for m in mixers.names() for n in _triton(m) for a in EXTREME_A_PARAM
                 if DEVICE == "cuda" or "recompute" not in n or a in (-30.0, 30.0)]


def _inputs_with(mixer, backend, a_param_value=None, seed=7, width=32, heads=2, batch=1):
    """A small shape over two chunks, every channel at one a_param value (or the module's
    initialisation); RG-LRU with 2 heads (bw = 16) keeps the interpreter quick."""
    module = samu.RGLRU(width, num_heads=heads) if mixer == "rglru" else samu.SAMU(width)
    gen = torch.Generator().manual_seed(seed)
    module.reset_parameters(generator=gen)
    params = {n: p.detach().to(DEVICE) for n, p in module.named_parameters()}
    if a_param_value is not None:
        params["a_param"] = torch.full_like(params["a_param"], a_param_value)
    length = _chunk(mixer, backend) + 5
    x = torch.randn(batch, length, width, generator=gen).to(DEVICE, torch.bfloat16)
    dy = torch.randn(batch, length, width, generator=gen).to(DEVICE, torch.bfloat16)
    return x, params, dy


# (width, heads): block widths that are not powers of two, RecurrentGemma-2B's 10 heads of 256
# and the Griffin 7B preset's 176 on the GPU; small ones for the interpreter.
HEAD_LAYOUTS = ([(2560, 10), (2816, 16), (3072, 16), (2560, 16)] if DEVICE == "cuda"
                else [(40, 10), (48, 3), (24, 1)])
# On a GPU every backend at every layout.  Under the interpreter (slow) every backend at 10 heads
# and the other two layouts by turns, each with saving and recomputing backends
# (test_rglru_gemm.py takes five more layouts).
HEAD_CASES = [(backend, width, heads) for k, (width, heads) in enumerate(HEAD_LAYOUTS)
              for j, backend in enumerate(_triton("rglru"))
              if DEVICE == "cuda" or k == 0 or (j + k) % 2 == 1]


@pytest.mark.parametrize("backend, width, heads", HEAD_CASES)
def test_rglru_backend_is_legal_at_any_head_count(backend, width, heads):
    x, params, dy = _inputs_with("rglru", backend, width=width, heads=heads, batch=2)
    entry = legality.check_legality("rglru", backend, inputs=(x, params, dy))
    assert entry["legal"], entry["reason"]


@pytest.mark.parametrize("mixer, backend, a_param_value", EXTREME_CASES)
def test_backend_is_legal_at_extreme_decay(mixer, backend, a_param_value):
    x, params, dy = _inputs_with(mixer, backend, a_param_value)
    entry = legality.check_legality(mixer, backend, inputs=(x, params, dy))
    assert entry["legal"], entry["reason"]


@triton.jit
def _softplus_kernel(z_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, softplus(tl.load(z_ptr + i)))


def test_softplus_is_exact_in_float32_over_the_whole_range():
    # down to -87, where softplus(z) ~ e^z is still a normal FP32 number
    z = torch.cat([torch.linspace(-87, 100, 1001), torch.tensor([-17.0, -12.0, 0.0, 1e-3])])
    n = triton.next_power_of_2(z.numel())
    z = torch.cat([z, torch.zeros(n - z.numel())]).to(DEVICE)
    out = torch.empty_like(z)
    _softplus_kernel[(1,)](z, out, N=n)
    want = torch.nn.functional.softplus(z.double().cpu(), threshold=1000)
    relative = ((out.double().cpu() - want).abs() / want).max().item()
    # the GPU's exp and log are approximate (3.7e-6 measured on the H200): a few ulps, no more
    assert relative < 1e-5, relative


@pytest.mark.parametrize("mixer", mixers.names())
def test_double_backward_is_refused(mixer):
    """A gradient penalty through a Triton backend must not silently drop second-order terms."""
    x, params, dy = _inputs_with(mixer, backends.DEFAULTS[mixer], 0.5)
    xg = x.detach().clone().requires_grad_()
    ps = [p.detach().clone().requires_grad_() for p in params.values()]
    y = FUNCTIONS[mixer](xg, *ps, backend=backends.DEFAULTS[mixer])
    with pytest.raises(RuntimeError, match="do not support double backward"):
        torch.autograd.grad(y, xg, dy, create_graph=True)
    (gx,) = torch.autograd.grad(y, xg, dy)  # first order still works
    assert torch.isfinite(gx).all()


@pytest.mark.parametrize("mixer", mixers.names())
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
# inf * 0 in the interpreter's numpy is the point of the test, not a problem
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_non_finite_input_propagates_as_in_the_reference(mixer, bad):
    """A NaN or inf in x spoils y from its token on, and no earlier token: as in the reference."""
    backend = backends.DEFAULTS[mixer]
    x, params, dy = _inputs_with(mixer, backend, 0.5)
    x[0, 9, 3] = bad
    got = legality.outputs(mixer, backend, x, params, dy)
    want = legality.outputs(mixer, "reference_chunked", x.cpu(),
                               {n: p.cpu() for n, p in params.items()}, dy.cpu())
    spoiled = ~torch.isfinite(got["y"].float().cpu())
    assert not spoiled[0, :9].any()
    assert spoiled[0, 9:].any()
    assert torch.equal(spoiled, ~torch.isfinite(want["y"].float()))
    for name in got:
        assert torch.equal(~torch.isfinite(got[name].float().cpu()),
                           ~torch.isfinite(want[name].float())), name


def test_launcher_caches_nothing_when_no_kernel_was_compiled():
    """A traced call (dynamo) returns no compiled kernel: caching that None broke every later
    eager call.  The next call must compile again and be cached then."""
    from samu.ops.common.launching import Launcher

    class Compiled:
        def __init__(self):
            self.calls = []

        def __getitem__(self, grid):
            return lambda *args: self.calls.append((grid, args))

    class FakeKernel:
        arg_names = ["x", "n", "BLOCK"]

        def __init__(self):
            self.returns = [None, Compiled()]
            self.jit_calls = 0

        def __getitem__(self, grid):
            def run(*args, **meta):
                self.jit_calls += 1
                return self.returns.pop(0) if self.returns else None
            return run

    kernel = FakeKernel()
    launch = Launcher(interpreting=False, device_index=lambda: 0)
    t = torch.zeros(4)
    launch(kernel, (2,), t, 4, BLOCK=16)   # traced: nothing compiled
    assert not launch.compiled
    launch(kernel, (2,), t, 4, BLOCK=16)   # eager: compiles, cached
    compiled = next(iter(launch.compiled.values()))[0]
    launch(kernel, (3,), t, 4, BLOCK=16)   # replayed through the compiled launcher
    assert kernel.jit_calls == 2
    assert compiled.calls == [((3, 1, 1), (t, 4, 16))]


class _FakeCompiled:
    """A compiled kernel's stand-in: records calls of its C launcher (direct) and of its runner."""
    function, packed_metadata = "handle", "packed"

    def __init__(self):
        self.direct, self.runner = [], []

    def _init_handles(self):
        pass

    def run(self, *args):
        self.direct.append(args)

    def __getitem__(self, grid):
        return lambda *args: self.runner.append((grid, args))


def test_launcher_calls_the_c_launcher_unless_a_launch_hook_is_set(monkeypatch):
    """A cached launch calls the compiled kernel's C launcher with the current stream, its
    handle and metadata, the hooks' slots empty, and every argument; with a launch hook set it
    goes through the runner, which calls the hooks."""
    from triton import knobs
    from samu.ops.common import launching

    compiled = _FakeCompiled()

    class FakeKernel:
        arg_names = ["x", "n", "BLOCK"]

        def __getitem__(self, grid):
            return lambda *args, **meta: compiled

    monkeypatch.setattr(launching, "_current_stream", lambda device: 1234 + device)
    launch = launching.Launcher(interpreting=False, device_index=lambda: 0)
    t = torch.zeros(4)
    kernel = FakeKernel()
    launch(kernel, (2,), t, 4, BLOCK=16)  # compiles
    launch(kernel, (5, 2), t, 4, BLOCK=16)
    assert compiled.direct == [(5, 2, 1, 1234, "handle", "packed", None, None, None, t, 4, 16)]
    hooks = knobs.HookChain()
    hooks.add(lambda *args, **kwargs: None)
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", hooks)
    launch(kernel, (3,), t, 4, BLOCK=16)
    assert compiled.runner == [((3, 1, 1), (t, 4, 16))] and len(compiled.direct) == 1


def test_a_site_calls_the_c_launcher_once_bound_and_the_general_path_otherwise(monkeypatch):
    """A launching.Site's first call goes through launch (which compiles); later calls go to
    the compiled kernel's C launcher with the site's grid, the arguments and the constexprs,
    and through launch again while launch is patched, a launch hook is set, or another
    device is current."""
    from triton import knobs
    from samu.ops.common import launching

    compiled = _FakeCompiled()

    class FakeKernel:
        arg_names = ["x", "n", "BLOCK"]
        jit_calls = 0

        def __getitem__(self, grid):
            def run(*args, **meta):
                FakeKernel.jit_calls += 1
                return compiled
            return run

    device = [0]
    launch = launching.Launcher(interpreting=False, device_index=lambda: device[0])
    monkeypatch.setattr(launching, "launch", launch)
    monkeypatch.setattr(launching, "_LAUNCHER", launch)
    monkeypatch.setattr(launching, "_current_stream", lambda d: 1234 + d)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: device[0])
    t = torch.zeros(4)
    site = launching.Site(FakeKernel(), (5, 2), dict(BLOCK=16, num_warps=4))
    site(t, 4)  # compiles through launch
    assert FakeKernel.jit_calls == 1 and site.bound is not None
    site(t, 4)
    assert compiled.direct == [(5, 2, 1, 1234, "handle", "packed", None, None, None, t, 4, 16)]
    device[0] = 1  # another device: launch keys its own entry and compiles there
    site(t, 4)
    assert FakeKernel.jit_calls == 2 and len(compiled.direct) == 1
    device[0] = 0
    seen = []
    monkeypatch.setattr(launching, "launch", lambda kernel, grid, *args, **meta:
                        seen.append((grid, args, meta)))
    site(t, 4)
    assert seen == [((5, 2), (t, 4), dict(BLOCK=16, num_warps=4))]
    assert len(compiled.direct) == 1
    monkeypatch.setattr(launching, "launch", launch)
    hooks = knobs.HookChain()
    hooks.add(lambda *args, **kwargs: None)
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", hooks)
    site(t, 4)  # the runner, which calls the hooks
    assert compiled.runner == [((5, 2, 1), (t, 4, 16))] and len(compiled.direct) == 1


@pytest.mark.parametrize("mixer", mixers.names())
def test_every_site_is_keyed_on_every_int_and_dtype_it_passes(mixer, monkeypatch):
    """A Site replays one compiled kernel, so its owner's key must fix every int argument and
    every tensor dtype: over calls that differ in dtype, state keywords and packed sequence
    count at one shape, each Site sees exactly one launcher key (launching.arg_key)."""
    from samu.ops.common import launching
    seen = {}
    real_call = launching.Site.__call__

    def recording(site, *args):
        seen.setdefault(id(site), (site, set()))[1].add(launching.arg_key(args))
        real_call(site, *args)

    monkeypatch.setattr(launching.Site, "__call__", recording)
    name = backends.DEFAULTS[mixer]
    width, length = 32, _chunk(mixer, name) + 5
    x, params, dy = _inputs_with(mixer, name)
    x, dy = x[:, :length], dy[:, :length]
    for dtype in (torch.bfloat16, torch.float32):
        legality.outputs(mixer, name, x.to(dtype), params, dy)
        for cu_seqlens, initial in (([0, length], True), ([0, 3, length], False),
                                    ([0, 2, 5, length], True)):
            cu = torch.tensor(cu_seqlens, dtype=torch.int32, device=DEVICE)
            state = legality.make_state((1, length, width), DEVICE, cu_seqlens=cu,
                                        initial=initial)
            legality.outputs(mixer, name, x.to(dtype), params, dy, state)
    assert len(seen) >= 8 * 2
    for site, keys in seen.values():
        assert len(keys) == 1, (site.kernel.fn.__name__, keys)


def test_a_site_under_the_interpreter_launches_through_launch(monkeypatch):
    """Interpreting, a Site never binds: every call is an interpreted launch."""
    from samu.ops.common import launching
    calls = []

    class FakeKernel:
        arg_names = ["x", "BLOCK"]

        def __getitem__(self, grid):
            return lambda *args, **meta: calls.append((grid, args, meta))

    launch = launching.Launcher(interpreting=True)
    monkeypatch.setattr(launching, "launch", launch)
    monkeypatch.setattr(launching, "_LAUNCHER", launch)
    t = torch.zeros(2)
    site = launching.Site(FakeKernel(), (3,), dict(BLOCK=8))
    site(t)
    site(t)
    assert site.bound is None and calls == [((3,), (t,), dict(BLOCK=8))] * 2


def test_a_configuration_passed_in_runs_without_changing_the_registered_one():
    """Sweeps pass frozen configurations in as the backend; the registered ones stay as they
    are (the gemm family has its own test in test_rglru_gemm.py)."""
    import dataclasses
    name = samu_chunk.CONFIGS[1].name
    registered = backends.REGISTRY["samu"][name].config
    tried = dataclasses.replace(registered, output=samu_chunk.Launch(1, 1))
    x, params, dy = _inputs_with("samu", name, 0.5)
    got = legality.outputs("samu", tried, x, params, dy)
    want = legality.oracle("samu", x, params, dy)
    assert max(legality.relative_errors(got, want).values()) < 0.02
    assert backends.REGISTRY["samu"][name].config == registered
    module = samu.SAMU(32, backend=tried)
    module.to(DEVICE)(x.float())
    assert module.last_backend == tried.name
    with pytest.raises(TypeError, match="backend must be 'auto', a name"):
        samu.SAMU(32, backend=rglru_gemm.CONFIGS[0])
    with pytest.raises(TypeError, match="backend must be 'auto', a name"):
        samu.RGLRU(32, 2, backend=registered)


@pytest.mark.parametrize("window, lookback", [(3, True), (8, False), (-4, True)])
def test_a_carry_window_must_be_a_power_of_two_with_the_look_back(window, lookback):
    with pytest.raises(ValueError, match="window must be 0 or a power of two, with lookback"):
        carry.CarryPlan(lookback=lookback, window=window)


def test_a_row_of_more_segments_than_a_grid_axis_holds_takes_longer_segments():
    """A carry's segments lie on the launch grid's third axis (at most 65535 programs): a row
    of more chunks than 65535 of the plan's segments (L past 67 M tokens at chunk 8) takes
    segments just long enough, every chunk in one."""
    plan = carry.CarryPlan()
    for n_chunks in (plan.two_level_from, 65535 * plan.segment_chunks,
                     65535 * plan.segment_chunks + 1, 2 ** 31 // 8):
        *_, grid, n_seg, seg_chunks = carry._carry_grid(1, n_chunks, 64, plan)
        assert grid[2] == n_seg <= carry.GRID_AXIS_LIMIT
        assert seg_chunks >= plan.segment_chunks and (n_seg - 1) * seg_chunks < n_chunks \
            <= n_seg * seg_chunks
    assert carry._carry_grid(1, 65535 * 128, 64, plan)[-1] == 128


@pytest.mark.parametrize("lookback", [False, True], ids=["two_level", "lookback"])
def test_longer_segments_give_the_carry_of_the_plans_own(monkeypatch, lookback):
    """The segments lengthened for the grid's limit (a limit of 3 here, so that 37 chunks in
    segments of 4 take segments of 13) carry what the plan's own segments do."""
    gen = torch.Generator().manual_seed(5)
    end = torch.randn(2, 37, 24, generator=gen).to(DEVICE)
    decay = torch.rand(2, 37, 24, generator=gen).to(DEVICE)
    plan = carry.CarryPlan(**_SHORT, lookback=lookback)
    want = carry.chunk_carry(decay, end, reverse=False, plan=plan)
    carry._carry_grid.cache_clear()
    monkeypatch.setattr(carry, "GRID_AXIS_LIMIT", 3)
    try:
        assert carry._carry_grid(2, 37, 24, plan)[-2:] == (3, 13)
        got = carry.chunk_carry(decay, end, reverse=False, plan=plan)
    finally:
        carry._carry_grid.cache_clear()
    assert torch.allclose(got, want, atol=1e-6, rtol=1e-6)


def test_a_carry_window_changes_the_settings_digest_and_none_keeps_it():
    """Calibration files key launch settings on the configuration's repr: a plan without a
    window reads as before the field existed, one with a window differs."""
    from samu.ops.common.family import settings_digest
    plain = carry.CarryPlan(lookback=True)
    assert "window" not in repr(plain)
    assert settings_digest(plain) != settings_digest(carry.CarryPlan(lookback=True, window=8))

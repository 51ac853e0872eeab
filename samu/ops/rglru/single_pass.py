"""RG-LRU with its gate products in cuBLAS (as samu.ops.rglru.gemm) and single-pass scans: one
kernel per direction, each tile read once (SPEC sections 2, 8).

G = [Gx | Ga] = x W_cat comes from strided batched GEMMs on head views of x and is saved for the
backward, which writes dG over it (gemm's layout and rounding).  A program owns a tile of T
tokens x BN channels (samu.ops.common.lookback: tickets, the look-back): it loads its G and x
once, computes the transition once, scans locally, publishes its aggregate (the product of its
a and its end state from zero, [BN] rows), looks back for its entering state, publishes its
inclusive state and writes y from registers; the inclusive states are saved ([B, NC, D] FP32),
the backward's entering states.  The backward is the same scan in reverse for the adjoint: each
tile writes dG over G, dx's direct term dh m gx (the dx GEMM adds dG W_cat^T in place) and
per-chunk rows of d gate biases and d softplus for reduce.sum_partials.  Nothing reduces over a
token's channels, so the tiles exchange nothing and each kernel runs in one launch.

Bytes per element of [B, L, D] (BF16 x, y, dy, dx; G and dG two values per element), from the
code (docs/PERFORMANCE.md):
  forward   gate GEMM reads x (2), writes G (4); the kernel reads G, x (6), writes y (2)    14
  backward  kernel reads G, x, dy (8), writes dG over G (4) and dx (2)                      14
            dx GEMM in place: reads dG (4) and dx (2), writes dx (2)                          8
            dW GEMM reads x (2) and dG (4)                                                    6  -> 28
FP32 rows [B, NC, D] (4/T bytes per element each time written or read): forward decays and end
states (written; read by look-backs) and inclusive states (written; read by look-backs and by
the backward); backward the same three, and the bias and d softplus rows (3 written, 3 read).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch
import triton
import triton.language as tl

from ..common import single_pass as host
from ..common.single_pass import FEATURES  # the family's (samu.ops.common.family)
from ..common.launching import Site, aligned, carve, carved_size, cdiv, fp32_contiguous
from ..common.lookback import adjoint_scan, boundaries, chain, scan_inputs, tile_of
from ..common.math import sigmoid_fast, softplus, to_element
from ..common.reduce import sum_partials
from ..common.scan import affine_combine, decayed_previous_state, last_row
from ..common.sequences import row_sequences, store_at, token_resets
from .gemm import (Launch, _chunk_tile, _gate_products, _gate_weights, _gemm_dtype, _heads,
                   _rows_at, _state_columns, _weight_gradient, gradient_columns, tiles)

MIXER = "rglru"


@triton.jit
def _gated_tile(x_ptr, g_ptr, bx_ptr, ba_ptr, a_param_ptr, seq_ptr, h0_ptr, reset_ptr, b, k,
                cb, L, N, N_SEQ, rows_in_chunk, D: tl.constexpr, T: tl.constexpr,
                BN: tl.constexpr, V: tl.constexpr, BW: tl.constexpr, RUN: tl.constexpr,
                PACKED: tl.constexpr, HAS_INITIAL: tl.constexpr, HAS_RESETS: tl.constexpr):
    """One tile's gates and scan inputs, rows in the given order: (columns, column mask, the
    tile's first token, mask, G's offsets, x, gx, ga, softplus(a_param), each row's sequence,
    starts or resets, ends, and scan_inputs' a, m, dm/dlog a, a and u folded)."""
    local = tl.multiple_of(cb * BN + tl.arange(0, BN), V)
    if D % BN == 0:
        col_ok = tl.full([BN], 1, tl.int1)
    else:
        col_ok = local < D
    rows, first, ok, within = _chunk_tile(b, k, rows_in_chunk, local, col_ok, L, N, T, BW, V,
                                          RUN)
    g_at = _rows_at(g_ptr, first, rows_in_chunk, within, 2 * BW)
    x = tl.load(_rows_at(x_ptr, first, rows_in_chunk, local, D), mask=ok,
                other=0.0).to(tl.float32)
    gx = sigmoid_fast(tl.load(g_at, mask=ok, other=0.0).to(tl.float32)
                      + tl.load(bx_ptr + local, mask=col_ok, other=0.0)[None, :])
    ga = sigmoid_fast(tl.load(g_at + BW, mask=ok, other=0.0).to(tl.float32)
                      + tl.load(ba_ptr + local, mask=col_ok, other=0.0)[None, :])
    sp = softplus(tl.load(a_param_ptr + local, mask=col_ok, other=0.0))
    log_a = tl.where((rows < L)[:, None], -8.0 * ga * sp[None, :], 0.0)
    seq, starts, ends = row_sequences(seq_ptr, b, rows, L, PACKED)
    flagged = token_resets(reset_ptr, b, rows, L, HAS_RESETS)
    a, m, dm_dlog_a, a_in, u_in = scan_inputs(log_a, gx * x, starts, flagged, h0_ptr, b, seq,
                                              _state_columns(local, col_ok, D), D, N_SEQ,
                                              PACKED, HAS_INITIAL, HAS_RESETS)
    return (local, col_ok, first, ok, within, x, gx, ga, sp, seq, starts, starts | flagged, ends,
            a, m, dm_dlog_a, a_in, u_in)


@triton.jit(do_not_specialize=["N_SEQ", "NC", "N_CB"])
def _rglru_forward_kernel(x_ptr, g_ptr, y_ptr, bx_ptr, ba_ptr, a_param_ptr, seq_ptr, h0_ptr,
                          reset_ptr, final_ptr, incl_ptr, flag_ptr, decay_ptr, end_ptr, L, N, NC, N_CB,
                          N_TILES, N_GROUPS, N_SEQ, D: tl.constexpr, DG: tl.constexpr,
                          T: tl.constexpr, BN: tl.constexpr, V: tl.constexpr,
                          BW: tl.constexpr, RUN: tl.constexpr, WINDOW: tl.constexpr,
                          PHASE: tl.constexpr, ORDER: tl.constexpr,
                          INCLUSIVE_EVERY: tl.constexpr, PACKED: tl.constexpr,
                          HAS_INITIAL: tl.constexpr, HAS_FINAL: tl.constexpr,
                          HAS_RESETS: tl.constexpr):
    """One tile of the forward (module docstring): y = h from the entering state its look-back
    finds; h at each sequence's last token into final (HAS_FINAL).  DG (= D) and PHASE (0) are
    gemm.tiles' and the plan's, unused."""
    b, k, step, cb, group, me = tile_of(flag_ptr, N_TILES, N_GROUPS, NC, N_CB, PHASE, ORDER,
                                        False)
    tr = tl.arange(0, T)
    (cols, col_ok, first, ok, _, _, _, _, _, seq, _, cuts, ends, _, _, _, a, u) = _gated_tile(
        x_ptr, g_ptr, bx_ptr, ba_ptr, a_param_ptr, seq_ptr, h0_ptr, reset_ptr, b, k, cb, L, N,
        N_SEQ, tr, D, T, BN, V, BW, RUN, PACKED, HAS_INITIAL, HAS_RESETS)
    p, h = tl.associative_scan((a, u), 0, affine_combine)
    holds, entry = boundaries(cuts, cuts, k == 0, k == 0, PACKED or HAS_RESETS)
    h_in = chain(flag_ptr, decay_ptr, end_ptr, incl_ptr, tl.zeros([BN], tl.float32),
                 last_row(p, tr, T),
                 last_row(h, tr, T), 0.0, holds, entry, me,
                 group * D, step, N_CB, D, cols, col_ok, False, WINDOW, INCLUSIVE_EVERY)
    h += p * h_in[None, :]
    tl.store(_rows_at(y_ptr, first, tr, cols, D), to_element(h, y_ptr), mask=ok)
    if HAS_FINAL:
        store_at(final_ptr, h, b, seq, ends, _state_columns(cols, col_ok, D), D, N_SEQ, PACKED)


@triton.jit(do_not_specialize=["N_SEQ", "NC", "N_CB"])
def _rglru_backward_kernel(x_ptr, dy_ptr, g_ptr, dg_ptr, dx_ptr, bx_ptr, ba_ptr, a_param_ptr,
                           h_ptr, seq_ptr, h0_ptr, reset_ptr, dfinal_ptr, dh0_ptr, flag_ptr,
                           decay_ptr,
                           end_ptr, incl_ptr, part_ptr, dsp_ptr, L, N, NC, N_CB, N_TILES,
                           N_GROUPS, N_SEQ, D: tl.constexpr, DG: tl.constexpr,
                           T: tl.constexpr, BN: tl.constexpr, V: tl.constexpr,
                           BW: tl.constexpr, RUN: tl.constexpr, WINDOW: tl.constexpr,
                           PHASE: tl.constexpr, ORDER: tl.constexpr,
                           INCLUSIVE_EVERY: tl.constexpr, PACKED: tl.constexpr,
                           HAS_INITIAL: tl.constexpr, HAS_DFINAL: tl.constexpr,
                           HAS_RESETS: tl.constexpr):
    """One tile of the backward, rows latest first (the adjoint is then a forward scan): its
    aggregate is the chunk's decay and the adjoint carry a_s dh_s leaving its first token from
    nothing entering at its last; the look-back gives the carry entering from the right.
    h_ptr: the forward's inclusive states (chunk k - 1's enters chunk k).  dG goes to dg_ptr
    (G itself by default: each element is written after it is read), dx's direct term to dx,
    and the chunk's rows of d gate biases [groups, 2 D] and d softplus [groups, D]."""
    b, k, step, cb, group, me = tile_of(flag_ptr, N_TILES, N_GROUPS, NC, N_CB, PHASE, ORDER,
                                        True)
    tr = tl.arange(0, T)
    latest_first = T - 1 - tr
    (cols, col_ok, first, ok, within, x, gx, ga, sp, seq, starts, cuts, ends, a, m, dm_dlog_a,
     a_in, u_in) = _gated_tile(x_ptr, g_ptr, bx_ptr, ba_ptr, a_param_ptr, seq_ptr, h0_ptr,
                               reset_ptr, b, k, cb, L, N, N_SEQ, latest_first, D, T, BN, V, BW,
                               RUN, PACKED, HAS_INITIAL, HAS_RESETS)
    state_cols = _state_columns(cols, col_ok, D)
    at = group * D + cols
    gate_x = gx * x
    # d log a per dh before the carry is known (as in the SAMU kernel): a_t h_{t-1} from the
    # folded inputs and the forward's state entering the chunk, a_s h0 at each start
    h_in = tl.load(h_ptr + at - D, mask=cols < tl.where(k > 0, D, 0), other=0.0)
    dla_per_dh = (decayed_previous_state(a_in, u_in, h_in, T) + (u_in - m * gate_x)
                  + gate_x * dm_dlog_a)
    dy = tl.load(_rows_at(dy_ptr, first, latest_first, cols, D), mask=ok,
                 other=0.0).to(tl.float32)
    q, w = adjoint_scan(a, dy, ends, dfinal_ptr, b, seq, state_cols, D, N_SEQ, T, PACKED,
                        HAS_DFINAL)
    a_s = last_row(a_in, tr, T)  # a start (folded to 0) cuts the carry leaving the chunk
    holds, entry = boundaries(cuts, ends, k == 0, k * T + T == L, PACKED or HAS_RESETS)
    carry = chain(flag_ptr, decay_ptr, end_ptr, incl_ptr, tl.zeros_like(sp),
                  a_s * last_row(q, tr, T),
                  a_s * last_row(w, tr, T), 0.0, holds, entry, me,
                  group * D, step, -N_CB, -D, cols, col_ok, False, WINDOW, INCLUSIVE_EVERY)
    dh = w + q * carry[None, :]
    if HAS_INITIAL:
        store_at(dh0_ptr, a * dh, b, seq, starts, state_cols, D, N_SEQ, PACKED)
    dla = dh * dla_per_dh
    d_gate_x = dh * m * gate_x * (1.0 - gx)  # dGx = dh m x gx (1 - gx)
    d_gate_a = dla * (-8.0 * sp[None, :]) * ga * (1.0 - ga)
    dg_at = _rows_at(dg_ptr, first, latest_first, within, 2 * BW)
    tl.store(dg_at, to_element(d_gate_x, dg_ptr), mask=ok)  # may be G: this tile is read
    tl.store(dg_at + BW, to_element(d_gate_a, dg_ptr), mask=ok)
    tl.store(_rows_at(dx_ptr, first, latest_first, cols, D), to_element(dh * m * gx, dx_ptr),
             mask=ok)
    wide = group * (2 * D) + cols
    tl.store(part_ptr + wide, tl.sum(d_gate_x, axis=0), mask=col_ok)
    tl.store(part_ptr + wide + D, tl.sum(d_gate_a, axis=0), mask=col_ok)
    tl.store(dsp_ptr + at, -8.0 * tl.sum(dla * ga, axis=0), mask=col_ok)


@dataclass(frozen=True)
class RglruSinglePassConfig(host.SinglePassConfig):
    """One single-pass RG-LRU backend (host.SinglePassConfig); its launches are gemm.Launch: a
    tile is 32 x warps x vector channels of one head's run, each thread holding every token of
    its channels."""
    forward: Launch = Launch(2, 2)
    backward: Launch = Launch(2, 1)
    NAME: ClassVar[str] = "gemm_fused_singlepass_chunk{chunk}"


KERNELS = {"forward": _rglru_forward_kernel, "backward": _rglru_backward_kernel}


def launch_count(config: RglruSinglePassConfig) -> int:
    """Launches of one forward+backward: the gate GEMM, the flags' fill and the kernel; the
    fill, the kernel, sum_partials and the dx and dW GEMMs."""
    return 3 + 5


def launch_plan(config: RglruSinglePassConfig, width: int, heads: int = 16,
                features: bool = False):
    """(kernel, constexprs, compile options) of each kernel at this width and head count,
    without the state keywords or (features=True) with all."""
    return host.launch_plan(KERNELS, config, tiles(config, width // heads, width, width),
                            features, exchanges=False)


class _Plan(NamedTuple):
    n_chunks: int
    channel_blocks: int
    scratch: host.Scratch
    site: Site


@functools.lru_cache(maxsize=512)
def _plan(role: str, config: RglruSinglePassConfig, shape: tuple, heads: int, count: int,
          dtypes: tuple, device, flags: tuple) -> _Plan:
    """One kernel's launch for a call signature (every int it takes follows from the key, and
    every tensor dtype that can vary is in it, as launching.Site requires)."""
    batch, length, width = shape
    n_chunks = cdiv(length, config.chunk)
    meta = dict(tiles(config, width // heads, width, width)[role])
    if any(on for _, on in flags):  # as gemm: no register cap with a state keyword
        meta.pop("maxnreg", None)
    blocks = cdiv(width, meta["BN"])
    scratch = host.scratch(batch, n_chunks, width, blocks)
    (phase,) = config.lookback.phases(blocks, device, exchanges=False)
    site = Site(KERNELS[role], (scratch.n_tiles,),
                dict(meta, PHASE=phase, **config.lookback.meta(), **dict(flags)))
    return _Plan(n_chunks, blocks, scratch, site)


def _call_ints(plan: _Plan, shape: tuple, count: int) -> tuple:
    batch, length, _ = shape
    return (length, batch * length, plan.n_chunks, plan.channel_blocks, plan.scratch.n_tiles,
            plan.scratch.n_groups, count)


def _state_rows(batch: int, n_chunks: int, width: int) -> list[tuple]:
    return [(batch, n_chunks, width)]


def forward(x, params, sequences, config: RglruSinglePassConfig, zero_gaps: bool = True):
    """(y, final state or None, residuals): the gate GEMM, the fill and the forward kernel.
    Residuals: G flat ([H, B L, 2 bw] in the GEMM dtype) and the chunks' inclusive states
    [B, NC, D] FP32 (every element written: nothing to zero)."""
    x = aligned(x)
    gate_x_weight, gate_x_bias, gate_a_weight, gate_a_bias, a_param = params
    batch, length, width = x.shape
    heads, bw, _ = gate_x_weight.shape
    bx, ba, a_param = [fp32_contiguous(p) for p in (gate_x_bias, gate_a_bias, a_param)]
    seq, h0 = sequences.seq_index, sequences.initial_state
    plan = _plan("forward", config, x.shape, heads, sequences.count, (x.dtype, h0.dtype),
                 x.device, host.flags(sequences, HAS_FINAL=sequences.output_final_state))
    gates = torch.empty(heads, batch * length, 2 * bw, device=x.device,
                        dtype=_gemm_dtype(x.dtype))
    _gate_products(_heads(x, heads), _gate_weights(gate_x_weight, gate_a_weight, x.dtype),
                   slice(None), gates)
    shapes = _state_rows(batch, plan.n_chunks, width)
    (incl,) = carve(torch.empty(carved_size(shapes), device=x.device, dtype=torch.float32),
                    shapes)
    words, (decay, end) = plan.scratch.allocate((incl.numel(), incl.numel()), x.device)
    y = torch.empty_like(x)
    final = sequences.final_state(width, x.device)
    plan.site(x, gates, y, bx, ba, a_param, seq, h0, sequences.reset_flags, final, incl, words,
              decay, end,
              *_call_ints(plan, x.shape, sequences.count))
    return y, (final if sequences.output_final_state else None), (gates.view(-1), incl.view(-1))


def residual_specs(config: RglruSinglePassConfig, batch: int, length: int, width: int, dtype,
                   params):
    """(shape, dtype) of each of forward's residuals, for a compiled graph's fake tensors."""
    states = carved_size(_state_rows(batch, cdiv(length, config.chunk), width))
    return [((2 * batch * length * width,), _gemm_dtype(dtype)), ((states,), torch.float32)]


def backward(x, params, residuals, dy, d_final, sequences, config: RglruSinglePassConfig,
             spend_residuals: bool = False):
    """(dx, d gate_x_weight, d gate_x_bias, d gate_a_weight, d gate_a_bias, d a_param,
    d initial_state or None): the fill, the backward kernel (dG over G), sum_partials and the
    dx and dW GEMMs.  The saved G is overwritten only with ``spend_residuals`` (the caller
    then refuses a second backward through the graph); else it is copied first."""
    x = aligned(x)
    gate_x_weight, gate_x_bias, gate_a_weight, gate_a_bias, a_param = params
    batch, length, width = x.shape
    heads, bw, _ = gate_x_weight.shape
    bx, ba, a_param = [fp32_contiguous(p) for p in (gate_x_bias, gate_a_bias, a_param)]
    dy = torch.zeros_like(x) if dy is None else aligned(dy)
    seq, h0 = sequences.seq_index, sequences.initial_state
    has_dfinal = d_final is not None
    d_final = fp32_contiguous(d_final) if has_dfinal else h0
    plan = _plan("backward", config, x.shape, heads, sequences.count,
                 (x.dtype, dy.dtype, h0.dtype), x.device,
                 host.flags(sequences, HAS_DFINAL=has_dfinal))
    gates = residuals[0].view(heads, batch * length, 2 * bw)
    if not spend_residuals:
        gates = gates.clone()
    groups = plan.scratch.n_groups
    words, (decay, end, incl, part, dsp) = plan.scratch.allocate(
        (groups * width, groups * width, groups * width, groups * 2 * width, groups * width),
        x.device)
    dx = torch.empty_like(x)
    d_h0 = sequences.initial_state_gradient()
    plan.site(x, dy, gates, gates, dx, bx, ba, a_param, aligned(residuals[1]), seq, h0,
              sequences.reset_flags, d_final, d_h0, words, decay, end, incl, part, dsp,
              *_call_ints(plan, x.shape, sequences.count))
    grads = sum_partials(part, dsp, a_param, rows=(0, 0, groups, 2 * width, width))
    w_cat = _gate_weights(gate_x_weight, gate_a_weight, x.dtype)
    _heads(dx, heads).baddbmm_(gates, w_cat.transpose(1, 2))  # dx += dG W_cat^T
    d_weight = torch.empty(heads, bw, 2 * bw, device=x.device, dtype=torch.float32)
    _weight_gradient(_heads(x, heads), gates, d_weight)
    at = gradient_columns(width)
    return (dx, d_weight[:, :, :bw], grads[at["gate_x_bias"]], d_weight[:, :, bw:],
            grads[at["gate_a_bias"]], grads[at["a_param"]],
            d_h0 if sequences.has_initial else None)


slice_summary, start_adjoint = host.entry_points(__name__)
# No SliceRun: the backward takes no cotangent mid-way, so context parallelism runs the phases
# apart (slice_summary, start_adjoint).
SliceRun = None


def spent_residuals(config: RglruSinglePassConfig):
    """The saved G, which the backward overwrites with dG (samu.ops.common.family)."""
    return "the saved gate pre-activations (a gemm_recompute_* backend keeps them)"


# Each chunk's launches where they differ from RglruSinglePassConfig's defaults: chunk 8 takes
# wider tiles (more values a thread, no spill; sm_90a counts in docs/PERFORMANCE.md).  Eight-warp
# tiles were faster on an H100 and wrong there wherever a row held one channel block
# (docs/PERFORMANCE.md, "The registered launches checked on an H100"): not registered.
LAUNCHES: dict = {8: dict(forward=Launch(2, 4), backward=Launch(2, 2))}

CONFIGS = tuple(RglruSinglePassConfig(chunk, **LAUNCHES.get(chunk, {})) for chunk in (8, 16))

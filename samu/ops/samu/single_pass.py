"""SAMU's single-pass kernels: one kernel per direction, each tile read once (SPEC sections 2, 8).

A program owns a tile of T tokens x BD channels (samu.ops.common.lookback: tickets, the
look-back, the exchange).  Forward: the tile loads x, and the tiles of its chunk exchange their
per-token partial sums of the controller W x, so that each forms r, g; it computes the
transition once, scans locally, publishes its aggregate (the chunk's sum of r, whose decay is
exp(-rate sum r), and its end state from zero), looks back for its entering state, publishes its
inclusive state and writes y from registers.  The inclusive states are saved ([B, NC, D] FP32):
the backward's entering states.  Backward: the same scan in reverse for the adjoint; the tiles
of a chunk exchange their per-token partials of dr, dg (and of d skip) for dz, and each writes
dx = dh m g + skip dy + W^T dz from registers, with per-chunk rows of d ctrl_weight (dz^T x),
d softplus and the scalars, which reduce.sum_partials sums.

Bytes per element of [B, L, D] (BF16 x, y, dy, dx), from the code (docs/PERFORMANCE.md):
  forward   x (2), y (2)                                                        4
  backward  x, dy (4), dx (2)                                                   6
FP32 rows [B, NC, D] (4/T bytes per element each time one is written or read): forward end
states (written, and read by look-backs), inclusive states (written, read by look-backs, read by
the backward): 4; backward end states and inclusive states (2, plus look-back reads), d softplus
and d ctrl_weight rows (3 written, 3 read): 8 and more; r, g, dz and the exchange are per token.
Launches: forward a fill of the flags and the kernel (two); backward the fill, the kernel and
sum_partials (three).  With a split exchange (``Lookback.split``) each kernel runs twice.
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
from ..common.single_pass import Lookback
from ..common.launching import (Site, aligned, cdiv, fp32_contiguous, piece_sizes, pieces,
                                with_state_keywords, workspace)
from ..common.lookback import (adjoint_scan, arrive, boundaries, chain, exchange_sum, publish,
                               scan_inputs, tile_of, wait_for)
from ..common.math import sigmoid_fast, softplus, to_element
from ..common.reduce import sum_partials
from ..common.scan import affine_combine, decayed_previous_state, last_row
from ..common.sequences import row_sequences, store_at, token_resets
from ..rglru.gemm import _rows_at
from .chunk import Launch, gradient_sizes, tiles

MIXER = "samu"


@triton.jit
def _share(part_ptr, total_ptr, flag_ptr, N_TILES, N_GROUPS, group, me, N_CB, p0, p1, extra,
           T: tl.constexpr, WIDTH: tl.constexpr):
    """Store this tile's per-token partials p0, p1 ([T] each) and, where WIDTH is 4 T, a scalar
    partial as its row of the group's exchange and arrive; the group's last tile sums the rows
    (in channel-block order) and publishes the totals."""
    lanes = tl.arange(0, T)
    row = part_ptr + me * WIDTH
    tl.store(row + lanes, p0)
    tl.store(row + T + lanes, p1)
    if WIDTH > 2 * T:
        tl.store(row + 2 * T + lanes, tl.where(lanes == 0, extra, 0.0))
        tl.store(row + 3 * T + lanes, tl.zeros([T], dtype=tl.float32))
    if arrive(flag_ptr + N_TILES, group, N_CB):
        total = exchange_sum(part_ptr, group, N_CB, WIDTH)
        tl.store(total_ptr + group * WIDTH + tl.arange(0, WIDTH), total)
        publish(flag_ptr + N_TILES + N_GROUPS, group, 1)


@triton.jit
def _totals(total_ptr, flag_ptr, N_TILES, N_GROUPS, group, T: tl.constexpr,
            WIDTH: tl.constexpr):
    """The group's summed per-token partials ([T] each) and scalar (0 where WIDTH is 2 T), once
    published.  [T] vectors, not [T, BD] tiles of them: in the backward the tiles cost 40 % more
    instructions and spilled under Triton 3.6 (docs/PERFORMANCE.md, "Single-pass scans")."""
    wait_for(flag_ptr + N_TILES + N_GROUPS + group)
    row = total_ptr + group * WIDTH
    lanes = tl.arange(0, T)
    extra = 0.0
    if WIDTH > 2 * T:
        extra = tl.load(row + 2 * T, cache_modifier=".cg")
    return (tl.load(row + lanes, cache_modifier=".cg"),
            tl.load(row + T + lanes, cache_modifier=".cg"), extra)


@triton.jit
def _store_one(ptr, values, cols, where):
    """One value of a [BD] row whose lanes hold it alike, where ``where`` (a scalar) holds."""
    first = tl.arange(0, cols.shape[0]) == 0
    tl.store(ptr + cols * 0, values, mask=first & (cols * 0 + where.to(tl.int32) > 0))


@triton.jit
def _tile_rows(b, k, rows, cols, L, D: tl.constexpr, T: tl.constexpr):
    """(the chunk's first token, int64, and the tile's mask) of a [T, BD] tile: its elements lie
    at gemm._rows_at(ptr, first, rows - k T, cols, D), whose row offsets are constants (D a
    constexpr), so that one address a thread serves every row."""
    return b * L + k * T, (rows < L)[:, None] & (cols < D)[None, :]


@triton.jit
def _rate(a_param_ptr, log_temp_ptr, cols, D):
    """c softplus(a_param) of the tile's channels, c = 8 exp(log_temp)."""
    c = 8.0 * tl.exp(tl.load(log_temp_ptr))
    return c * softplus(tl.load(a_param_ptr + cols, mask=cols < D, other=0.0))


@triton.jit(do_not_specialize=["N_SEQ", "NC", "N_CB"])
def _samu_forward_kernel(x_ptr, y_ptr, w_ptr, bias_ptr, a_param_ptr, log_temp_ptr, skip_ptr,
                         seq_ptr, h0_ptr, reset_ptr, final_ptr, r_ptr, g_ptr, incl_ptr, flag_ptr, r_sum_ptr,
                         end_ptr, part_ptr, total_ptr, L, NC, N_CB, N_TILES, N_GROUPS, N_SEQ,
                         D: tl.constexpr, T: tl.constexpr, BD: tl.constexpr, V: tl.constexpr,
                         WINDOW: tl.constexpr, PHASE: tl.constexpr, ORDER: tl.constexpr,
                         INCLUSIVE_EVERY: tl.constexpr, PACKED: tl.constexpr,
                         HAS_INITIAL: tl.constexpr, HAS_FINAL: tl.constexpr,
                         HAS_RESETS: tl.constexpr):
    """One tile of the forward (module docstring).  PHASE 0: all of it; PHASE 1: the
    controller's exchange only; PHASE 2: the rest, the exchange's totals read."""
    b, k, step, cb, group, me = tile_of(flag_ptr, N_TILES, N_GROUPS, NC, N_CB, PHASE, ORDER,
                                        False)
    cols = tl.multiple_of(cb * BD + tl.arange(0, BD), V)  # V adjacent channels a thread
    rows = k * T + tl.arange(0, T)
    row_ok = rows < L
    col_ok = cols < D
    first, ok = _tile_rows(b, k, rows, cols, L, D, T)
    x = tl.load(_rows_at(x_ptr, first, tl.arange(0, T), cols, D), mask=ok,
                other=0.0).to(tl.float32)
    if PHASE != 2:
        w0 = tl.load(w_ptr + cols, mask=col_ok, other=0.0)
        w1 = tl.load(w_ptr + D + cols, mask=col_ok, other=0.0)
        _share(part_ptr, total_ptr, flag_ptr, N_TILES, N_GROUPS, group, me, N_CB,
               tl.sum(x * w0[None, :], axis=1), tl.sum(x * w1[None, :], axis=1), 0.0, T, 2 * T)
    if PHASE != 1:
        z0, z1, _ = _totals(total_ptr, flag_ptr, N_TILES, N_GROUPS, group, T, 2 * T)
        r = tl.where(row_ok, sigmoid_fast(z0 + tl.load(bias_ptr)), 0.0)  # r = 0: a = 1
        g = sigmoid_fast(z1 + tl.load(bias_ptr + 1))
        kept = rows < tl.where(cb == 0, L, 0)  # one tile of the chunk keeps r, g
        tl.store(r_ptr + b * L + rows, r, mask=kept)
        tl.store(g_ptr + b * L + rows, g, mask=kept)
        lam = _rate(a_param_ptr, log_temp_ptr, cols, D)
        seq, starts, ends = row_sequences(seq_ptr, b, rows, L, PACKED)
        flagged = token_resets(reset_ptr, b, rows, L, HAS_RESETS)
        _, _, _, a, u = scan_inputs(-lam[None, :] * r[:, None], g[:, None] * x, starts, flagged,
                                    h0_ptr, b, seq, cols, D, N_SEQ, PACKED, HAS_INITIAL,
                                    HAS_RESETS)
        p, h = tl.associative_scan((a, u), 0, affine_combine)
        y = h + tl.load(skip_ptr) * x  # x is spent: less held across the look-back
        tr = tl.arange(0, T)
        holds, entry = boundaries(starts | flagged, starts | flagged, k == 0, k == 0,
                                  PACKED or HAS_RESETS)
        h_in = chain(flag_ptr, r_sum_ptr, end_ptr, incl_ptr, lam, last_row(p, tr, T),
                     last_row(h, tr, T), tl.sum(r, axis=0), holds, entry, me,
                     group * D, step, N_CB, D, cols, col_ok, True,
                     WINDOW, INCLUSIVE_EVERY)
        if HAS_FINAL:
            store_at(final_ptr, h + p * h_in[None, :], b, seq, ends, cols, D, N_SEQ, PACKED)
        y += p * h_in[None, :]
        tl.store(_rows_at(y_ptr, first, tr, cols, D), to_element(y, y_ptr), mask=ok)


@triton.jit(do_not_specialize=["N_SEQ", "NC", "N_CB"])
def _samu_backward_kernel(x_ptr, dy_ptr, dx_ptr, w_ptr, a_param_ptr, log_temp_ptr, skip_ptr,
                          r_ptr, g_ptr, h_ptr, seq_ptr, h0_ptr, reset_ptr, dfinal_ptr, dh0_ptr,
                          flag_ptr,
                          r_sum_ptr, end_ptr, incl_ptr, part_ptr, total_ptr, dw_ptr, scalar_ptr,
                          dsp_ptr, L, NC, N_CB, N_TILES, N_GROUPS, N_SEQ, D: tl.constexpr,
                          T: tl.constexpr, BD: tl.constexpr, V: tl.constexpr,
                          WINDOW: tl.constexpr, PHASE: tl.constexpr, ORDER: tl.constexpr,
                          INCLUSIVE_EVERY: tl.constexpr, PACKED: tl.constexpr,
                          HAS_INITIAL: tl.constexpr, HAS_DFINAL: tl.constexpr,
                          HAS_RESETS: tl.constexpr):
    """One tile of the backward, rows latest first (the adjoint is then a forward scan).  Its
    aggregate is the chunk's decay (its sum of r) and the adjoint carry a_s dh_s leaving its
    first token s from nothing entering at its last; the look-back gives the carry entering
    from the right.  h_ptr: the forward's inclusive states, the state entering chunk k being
    chunk k - 1's.  PHASE 1 (split): up to the exchange; PHASE 2: from the saved carry (this
    launch's incl rows, written in phase 1) on.  Rows of d ctrl_weight [groups, 2 D], d softplus
    [groups, D] and the scalars [groups, 4] (d log_temp, d skip, d ctrl_bias) for sum_partials."""
    b, k, step, cb, group, me = tile_of(flag_ptr, N_TILES, N_GROUPS, NC, N_CB, PHASE, ORDER,
                                        True)
    cols = tl.multiple_of(cb * BD + tl.arange(0, BD), V)  # V adjacent channels a thread
    tr = tl.arange(0, T)
    rows = k * T + (T - 1 - tr)
    row_ok = rows < L
    col_ok = cols < D
    seq, starts, ends = row_sequences(seq_ptr, b, rows, L, PACKED)
    first, ok = _tile_rows(b, k, rows, cols, L, D, T)
    latest_first = T - 1 - tr
    x = tl.load(_rows_at(x_ptr, first, latest_first, cols, D), mask=ok,
                other=0.0).to(tl.float32)
    dy = tl.load(_rows_at(dy_ptr, first, latest_first, cols, D), mask=ok,
                 other=0.0).to(tl.float32)
    r = tl.load(r_ptr + b * L + rows, mask=row_ok, other=0.0)
    g = tl.load(g_ptr + b * L + rows, mask=row_ok, other=0.0)
    lam = _rate(a_param_ptr, log_temp_ptr, cols, D)
    gx = g[:, None] * x
    flagged = token_resets(reset_ptr, b, rows, L, HAS_RESETS)
    a, m, dm_dlog_a, a_in, u_in = scan_inputs(-lam[None, :] * r[:, None], gx, starts, flagged,
                                              h0_ptr, b, seq, cols, D, N_SEQ, PACKED,
                                              HAS_INITIAL, HAS_RESETS)
    at = group * D + cols
    # d log a = dh (a_t h_{t-1} + gx dm/dlog a), formed before the carry is known: a_t h_{t-1}
    # as a product from the folded inputs and the forward's state entering the chunk, plus
    # a_s h0 at each start (u_in - m gx), so that fewer tiles are held across the look-back
    h_in = tl.load(h_ptr + at - D, mask=cols < tl.where(k > 0, D, 0), other=0.0)
    dla_per_dh = decayed_previous_state(a_in, u_in, h_in, T) + (u_in - m * gx) + gx * dm_dlog_a
    q, w = adjoint_scan(a, dy, ends, dfinal_ptr, b, seq, cols, D, N_SEQ, T, PACKED, HAS_DFINAL)
    if PHASE != 2:
        # The carry leaving the first token s is a_s dh_s = a_s q_s c + a_s w_s for the carry c
        # entering at the last: a_s q_s is the chunk's decay, exp(-rate sum r); a start (its a
        # folded to 0) cuts it.
        a_s = last_row(a_in, tr, T)
        holds, entry = boundaries(starts | flagged, ends, k == 0, k * T + T == L,
                                  PACKED or HAS_RESETS)
        carry = chain(flag_ptr, r_sum_ptr, end_ptr, incl_ptr, lam, a_s * last_row(q, tr, T),
                      a_s * last_row(w, tr, T), tl.sum(r, axis=0), holds, entry, me,
                      group * D, step, -N_CB, -D, cols, col_ok, True,
                      WINDOW, INCLUSIVE_EVERY)
    else:
        carry = tl.load(incl_ptr + at + D, mask=cols < tl.where(k + 1 < NC, D, 0), other=0.0,
                        cache_modifier=".cg")
    dh = w + q * carry[None, :]
    dla = dh * dla_per_dh
    if PHASE != 2:
        if HAS_INITIAL:
            store_at(dh0_ptr, a * dh, b, seq, starts, cols, D, N_SEQ, PACKED)
        _share(part_ptr, total_ptr, flag_ptr, N_TILES, N_GROUPS, group, me, N_CB,
               tl.sum(dla * -lam[None, :], axis=1), tl.sum(dh * m * x, axis=1),
               tl.sum(tl.sum(dy * x, axis=0), axis=0), T, 4 * T)
    if PHASE != 1:
        c = 8.0 * tl.exp(tl.load(log_temp_ptr))
        tl.store(dsp_ptr + at, tl.sum(dla * (-c * r[:, None]), axis=0), mask=col_ok)
        dx = dh * m * g[:, None] + tl.load(skip_ptr) * dy  # dx but W^T dz: less held
        dr, dg, d_skip = _totals(total_ptr, flag_ptr, N_TILES, N_GROUPS, group, T, 4 * T)
        dz0 = tl.where(row_ok, dr * r * (1.0 - r), 0.0)
        dz1 = tl.where(row_ok, dg * g * (1.0 - g), 0.0)
        w0 = tl.load(w_ptr + cols, mask=col_ok, other=0.0)
        w1 = tl.load(w_ptr + D + cols, mask=col_ok, other=0.0)
        dx += dz0[:, None] * w0[None, :] + dz1[:, None] * w1[None, :]
        tl.store(_rows_at(dx_ptr, first, latest_first, cols, D), to_element(dx, dx_ptr), mask=ok)
        wide = group * (2 * D) + cols
        tl.store(dw_ptr + wide, tl.sum(dz0[:, None] * x, axis=0), mask=col_ok)
        tl.store(dw_ptr + wide + D, tl.sum(dz1[:, None] * x, axis=0), mask=col_ok)
        # The chunk's scalars, by its first tile: d log_temp (sum_d dla log a = r_t sum_d dla
        # (-rate), from the exchanged dr), d skip, d ctrl_bias.
        row = scalar_ptr + group * 4
        first = cb == 0
        _store_one(row, tl.sum(r * dr, axis=0), cols, first)
        _store_one(row + 1, d_skip + tl.zeros_like(lam), cols, first)
        _store_one(row + 2, tl.sum(dz0, axis=0), cols, first)
        _store_one(row + 3, tl.sum(dz1, axis=0), cols, first)


@dataclass(frozen=True)
class SamuSinglePassConfig(host.SinglePassConfig):
    """One single-pass SAMU backend (host.SinglePassConfig); its launches are chunk.Launch: a
    tile is 32 x warps x vector channels, each thread holding every token of its channels."""
    forward: Launch = Launch(2, 2)
    backward: Launch = Launch(4, 1)
    NAME: ClassVar[str] = "fused_singlepass_chunk{chunk}"


KERNELS = {"forward": _samu_forward_kernel, "backward": _samu_backward_kernel}

# Launches per forward+backward (samu.backends.describe): the forward's fill and kernel, the
# backward's fill, kernel and sum_partials; a split exchange launches each kernel twice.
LAUNCHES_PER_CALL = dict(forward=2, backward=3)


def launch_count(config: SamuSinglePassConfig, split: bool = False) -> int:
    """Launches of one forward+backward."""
    return sum(LAUNCHES_PER_CALL.values()) + (2 if split or config.lookback.asks_split else 0)


def launch_plan(config: SamuSinglePassConfig, width: int, features: bool = False):
    """(kernel, constexprs, compile options) of each kernel a backend launches at this width,
    without the state keywords or (features=True) with all."""
    roles = {role: dict(tiles(config, width)[role], D=width, T=config.chunk) for role in KERNELS}
    return host.launch_plan(KERNELS, config, roles, features)


class _Plan(NamedTuple):
    n_chunks: int
    channel_blocks: int
    scratch: host.Scratch
    sites: tuple  # one Site per launch of the kernel (one, or two for a split exchange)


@functools.lru_cache(maxsize=512)
def _plan(role: str, config: SamuSinglePassConfig, shape: tuple, count: int, dtypes: tuple,
          device, flags: tuple) -> _Plan:
    """One kernel's launches for a call signature: the key fixes every int the kernel takes
    (from the shape and the sequence count) and every tensor dtype that can vary (x's, dy's,
    the state's or its placeholder's), as launching.Site requires.  flags: the state
    keywords' constexprs, (name, value) pairs."""
    batch, length, width = shape
    n_chunks = cdiv(length, config.chunk)
    meta = dict(with_state_keywords(tiles(config, width)[role], any(v for _, v in flags)))
    blocks = cdiv(width, meta["BD"])
    scratch = host.scratch(batch, n_chunks, width, blocks)
    phases = config.lookback.phases(blocks, device)
    sites = tuple(Site(KERNELS[role], (scratch.n_tiles,),
                       dict(D=width, T=config.chunk, **meta, **config.lookback.meta(),
                            PHASE=phase, **dict(flags)))
                  for phase in phases)
    return _Plan(n_chunks, blocks, scratch, sites)


def _residual_numels(batch: int, length: int, width: int, n_chunks: int) -> tuple:
    """The residual buffer's pieces: each chunk's inclusive state [B, NC, D] (the state entering
    chunk k + 1), r and g [B, L]."""
    return (batch * n_chunks * width, batch * length, batch * length)


def residual_specs(config: SamuSinglePassConfig, batch: int, length: int, width: int, dtype,
                   params=None):
    """(shape, dtype) of forward's one residual, for a compiled graph's fake tensors."""
    numels = _residual_numels(batch, length, width, cdiv(length, config.chunk))
    # uncached: a compiled graph's sizes may be symbolic, which do not hash
    return [((sum(piece_sizes.__wrapped__(numels, 4)),), torch.float32)]


def _call_ints(plan: _Plan, shape: tuple, count: int) -> tuple:
    return (shape[1], plan.n_chunks, plan.channel_blocks, plan.scratch.n_tiles,
            plan.scratch.n_groups, count)


def forward(x, params, sequences, config: SamuSinglePassConfig, zero_gaps: bool = True):
    """(y, final state or None, residuals): the fill and the forward kernel.  The residual is
    one FP32 buffer (_residual_numels), its gaps zeroed unless ``zero_gaps`` is off (a custom
    op's output must hold nothing uninitialised; the autograd.Function's need not)."""
    x = aligned(x)
    batch, length, width = x.shape
    w, bias, a_param, log_temp, skip = [fp32_contiguous(p) for p in params]
    seq, h0 = sequences.seq_index, sequences.initial_state
    plan = _plan("forward", config, x.shape, sequences.count, (x.dtype, h0.dtype), x.device,
                 host.flags(sequences, HAS_FINAL=sequences.output_final_state))
    scratch = plan.scratch
    residual, (incl, r, g) = workspace(_residual_numels(batch, length, width, plan.n_chunks),
                                       x.device, zero_gaps=zero_gaps)
    words, (r_sum, end, part, total) = scratch.allocate(
        (scratch.n_tiles, scratch.n_groups * width, scratch.n_tiles * 2 * config.chunk,
         scratch.n_groups * 2 * config.chunk), x.device)
    y = torch.empty_like(x)
    final = sequences.final_state(width, x.device)
    for site in plan.sites:
        site(x, y, w, bias, a_param, log_temp, skip, seq, h0, sequences.reset_flags, final, r, g,
             incl, words, r_sum, end, part, total, *_call_ints(plan, x.shape, sequences.count))
    return y, (final if sequences.output_final_state else None), (residual,)


def backward(x, params, residuals, dy, d_final, sequences, config: SamuSinglePassConfig,
             spend_residuals: bool = False):
    """(dx, d ctrl_weight, d ctrl_bias, d a_param, d log_temp, d skip, d initial_state or None):
    the fill, the backward kernel and sum_partials.  dy and d_final may be None.  Nothing is
    written over the residuals (spend_residuals changes nothing)."""
    x = aligned(x)
    batch, length, width = x.shape
    w, _, a_param, log_temp, skip = [fp32_contiguous(p) for p in params]
    dy = torch.zeros_like(x) if dy is None else aligned(dy)
    seq, h0 = sequences.seq_index, sequences.initial_state
    has_dfinal = d_final is not None
    d_final = fp32_contiguous(d_final) if has_dfinal else h0
    plan = _plan("backward", config, x.shape, sequences.count, (x.dtype, dy.dtype, h0.dtype),
                 x.device, host.flags(sequences, HAS_DFINAL=has_dfinal))
    scratch = plan.scratch
    groups = scratch.n_groups
    h, r, g = pieces(aligned(residuals[0]),
                     _residual_numels(batch, length, width, plan.n_chunks))
    words, (r_sum, end, incl, part, total, dw, scalars, dsp) = scratch.allocate(
        (scratch.n_tiles, groups * width, groups * width, scratch.n_tiles * 4 * config.chunk,
         groups * 4 * config.chunk, groups * 2 * width, groups * 4, groups * width), x.device)
    dx = torch.empty_like(x)
    d_h0 = sequences.initial_state_gradient()
    for site in plan.sites:
        site(x, dy, dx, w, a_param, log_temp, skip, r, g, h, seq, h0, sequences.reset_flags,
             d_final, d_h0, words, r_sum, end, incl, part, total, dw, scalars, dsp,
             *_call_ints(plan, x.shape, sequences.count))
    flat = sum_partials(scalars, dsp, a_param, front=dw,
                        rows=(groups, 2 * width, groups, 4, width))
    return (dx, *_parameter_gradients(flat, width),
            d_h0 if sequences.has_initial else None)


def _parameter_gradients(flat, width: int) -> tuple:
    """(d ctrl_weight, d ctrl_bias, d a_param, d log_temp, d skip) from sum_partials' vector."""
    weight, log_temp, skip, bias, a_param = flat.split_with_sizes(gradient_sizes(width))
    return weight.view(2, width), bias, a_param, log_temp.view(()), skip.view(())


slice_summary, start_adjoint = host.entry_points(__name__)
# No SliceRun: the backward takes no cotangent mid-way, so context parallelism runs the phases
# apart (slice_summary, start_adjoint).
SliceRun = None


def spent_residuals(config: SamuSinglePassConfig):
    """None: the backward writes over nothing it was given (samu.ops.common.family)."""
    return None


# Each chunk's launches where they differ from SamuSinglePassConfig's defaults: register caps
# that hold more programs an SM and a look-back window of 8, from GPU times on an H100
# (docs/PERFORMANCE.md, "Single-pass launches timed").
LAUNCHES: dict = {16: dict(forward=Launch(2, 2, 128), backward=Launch(4, 1, 128),
                           lookback=Lookback(window=8))}

CONFIGS = tuple(SamuSinglePassConfig(chunk, **LAUNCHES.get(chunk, {})) for chunk in (16,))

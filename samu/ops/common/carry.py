"""Phase 2 of the hierarchical scan: the carry across chunks.

    phase 1  each chunk, alone: decay_k = prod a, end_k = its end state from h_in = 0
    phase 2  (here) a scan over (decay_k, end_k) gives the state entering every chunk
    phase 3  each chunk again: h_t = local_t + (prod_{s<=t} a_s) h_in

The backward runs the same phases in reverse time with the adjoint recurrence.  Phase 2 runs in
one of three ways (``CarryPlan``): one program per channel block walking every chunk (short
rows); two levels (segment summaries, the carry over segments, each segment from its carry:
three launches); or one launch whose programs each take a segment and find the state entering
it by a decoupled look-back over the segments before it (Merrill and Garland, "Single-pass
Parallel Prefix Scan with Decoupled Look-back", 2016), one earlier segment at a time or a window
of them at once.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import launching
from .launching import cdiv, next_power_of_2
from .math import exp_fast
from .scan import affine_combine, first_row, last_row
from .sequences import START_MARK


@triton.jit
def _chunk_decay(decay_ptr, rate, b, ks, ok, offs, m2, NC, SCALAR_DECAY: tl.constexpr):
    """(decay [BLOCK_C, BLOCK_D], sums of r [BLOCK_C] or zeros) of chunks ks: loaded, or with
    SCALAR_DECAY rebuilt as exp(-rate sum r), 0 at a packed start (START_MARK)."""
    if SCALAR_DECAY:
        r_sum = tl.load(decay_ptr + b * NC + ks, mask=ok, other=0.0)
        dec = tl.where(r_sum[:, None] == START_MARK, 0.0,
                       exp_fast(-rate[None, :] * r_sum[:, None]))
    else:
        r_sum = tl.zeros(ks.shape, dtype=tl.float32)
        dec = tl.load(decay_ptr + offs, mask=m2, other=1.0)
    return dec, r_sum


@triton.jit
def _walk_segment(decay_ptr, end_ptr, out_ptr, rate, carry, b, cols, col_ok, lo, hi, NC, D,
                  WRITE: tl.constexpr, REVERSE: tl.constexpr, SCALAR_DECAY: tl.constexpr,
                  BLOCK_C: tl.constexpr):
    """The carry through chunks lo..hi-1 (latest first with REVERSE) from `carry` entering
    them; with WRITE, each chunk's entering carry into out.  Returns (carry leaving them, the
    product of their decays [BLOCK_D], their sum of r)."""
    base = b * NC * D
    crow = tl.arange(0, BLOCK_C)
    prod = tl.full(carry.shape, 1.0, dtype=tl.float32)
    r_total = tl.zeros([BLOCK_C], dtype=tl.float32)
    if WRITE:
        if REVERSE:
            tl.store(out_ptr + base + (hi - 1) * D + cols, carry, mask=col_ok)
        else:
            tl.store(out_ptr + base + lo * D + cols, carry, mask=col_ok)
    for i in range(0, tl.cdiv(hi - lo, BLOCK_C)):
        if REVERSE:
            ks = hi - (i + 1) * BLOCK_C + crow
        else:
            ks = lo + i * BLOCK_C + crow
        ok = (ks >= lo) & (ks < hi)
        offs = base + ks.to(tl.int64)[:, None] * D + cols[None, :]
        m2 = ok[:, None] & col_ok[None, :]
        dec, r_sum = _chunk_decay(decay_ptr, rate, b, ks, ok, offs, m2, NC, SCALAR_DECAY)
        r_total += r_sum
        end = tl.load(end_ptr + offs, mask=m2, other=0.0)
        p, v = tl.associative_scan((dec, end), 0, affine_combine, reverse=REVERSE)
        state = v + p * carry[None, :]
        if REVERSE:
            if WRITE:
                tl.store(out_ptr + offs - D, state, mask=m2 & (ks[:, None] >= lo + 1))
            carry = first_row(state, crow)
            prod = prod * first_row(p, crow)
        else:
            if WRITE:
                tl.store(out_ptr + offs + D, state, mask=m2 & (ks[:, None] < hi - 1))
            carry = last_row(state, crow, BLOCK_C)
            prod = prod * last_row(p, crow, BLOCK_C)
    return carry, prod, tl.sum(r_total, axis=0)


@triton.jit
def chunk_carry_kernel(decay_ptr, end_ptr, out_ptr, rate_ptr,
                       seg_decay_ptr, seg_end_ptr, seg_in_ptr, NC, D, SEG,
                       REVERSE: tl.constexpr, SCALAR_DECAY: tl.constexpr, MODE: tl.constexpr,
                       BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr):
    """Phase 2 over one segment of SEG chunks per program (grid: batch, channel blocks,
    segments).  Forward: out[k] = state entering chunk k.  Reverse: out[k] = adjoint carry
    entering chunk k from its right.  end, out: [B, NC, D] fp32.  decay: [B, NC, D] fp32, or
    with SCALAR_DECAY (SAMU) the chunk's sum of r, [B, NC], and decay = exp(-rate sum r) is
    rebuilt here from the per-channel rate [D] (8 exp(log_temp) softplus(a_param)), so that no
    [B, NC, D] decay is written or read.
    MODE 0: each segment from zero (one segment: the whole carry).  MODE 1: each segment's
    summary from zero, into seg_decay ([B, S, D], or [B, S] sums of r) and seg_end [B, S, D].
    MODE 2: each segment from its entering carry seg_in [B, S, D] (MODE 0 over the summaries)."""
    b = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    col_ok = cols < D
    seg = tl.program_id(2)
    n_seg = tl.num_programs(2)
    lo = seg * SEG
    hi = tl.minimum(lo + SEG, NC)
    if MODE == 2:
        carry = tl.load(seg_in_ptr + (b * n_seg + seg) * D + cols, mask=col_ok, other=0.0)
    else:
        carry = tl.zeros([BLOCK_D], dtype=tl.float32)
    rate = carry
    if SCALAR_DECAY:
        rate = tl.load(rate_ptr + cols, mask=col_ok, other=1.0)  # no 0 * inf past the width
    carry, prod, r_total = _walk_segment(decay_ptr, end_ptr, out_ptr, rate, carry, b, cols,
                                         col_ok, lo, hi, NC, D, MODE != 1, REVERSE,
                                         SCALAR_DECAY, BLOCK_C)
    if MODE == 1:
        summary = (b * n_seg + seg) * D + cols
        tl.store(seg_end_ptr + summary, carry, mask=col_ok)
        if SCALAR_DECAY:
            tl.store(seg_decay_ptr + b * n_seg + seg, r_total)
        else:
            tl.store(seg_decay_ptr + summary, prod, mask=col_ok)


# A look-back tile's status: 0 nothing yet, then its segment's summary, then its inclusive state.
_SUMMARY = tl.constexpr(1)
_INCLUSIVE = tl.constexpr(2)


@triton.jit
def _publish(status_ptr, tile, value):
    """Set a tile's status once every thread's stores before it are done (then released)."""
    tl.debug_barrier()
    tl.atomic_xchg(status_ptr + tile, value, sem="release")


@triton.jit
def _multiply(a, b):
    return a * b


@triton.jit
def _window_entering(sum_decay_ptr, sum_end_ptr, inclusive_ptr, status_ptr, rate, tile, step,
                     block, SCALAR_DECAY: tl.constexpr, WINDOW: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    """The state entering scan position ``step`` (tile ``tile``) from the tiles before it, read
    WINDOW at a time, nearest first: lane w holds position p - 1 - w of a window that ends
    before position p.  Once every lane's tile has published at least its summary, the window's
    terms up to the nearest inclusive state or packed start (its stop) are weighted by the
    decay of the tiles between (an exclusive scan over the lanes: sums of r, or products of
    decays) and summed; past a window without a stop, the next one begins where it ended."""
    w = tl.arange(0, WINDOW)
    entering = tl.zeros([BLOCK_D], dtype=tl.float32)
    between = tl.full([BLOCK_D], 1.0, dtype=tl.float32)
    end_pos = step
    while end_pos > 0:
        pos = end_pos - 1 - w
        valid = pos >= 0
        tiles = tile - (step - pos)
        flags = tl.atomic_add(status_ptr + tiles, 0, mask=valid, sem="acquire")
        flags = tl.where(valid, flags, _SUMMARY)
        while tl.min(flags, axis=0) == 0:  # wait only on tiles that published nothing yet
            flags = tl.atomic_add(status_ptr + tiles, 0, mask=valid, sem="acquire")
            flags = tl.where(valid, flags, _SUMMARY)
        rows = tiles.to(tl.int64)[:, None] * BLOCK_D + block[None, :]
        inclusive = valid & (flags == _INCLUSIVE)
        if SCALAR_DECAY:
            r_sum = tl.load(sum_decay_ptr + tiles, mask=valid, other=0.0, cache_modifier=".cg")
            stops = inclusive | (valid & (r_sum == START_MARK))
        else:
            stops = inclusive
        stop = tl.min(tl.where(stops, w, WINDOW), axis=0)  # WINDOW: no stop in this window
        used = valid & (w <= stop)
        value = tl.load(sum_end_ptr + rows, mask=used[:, None] & ~inclusive[:, None],
                        other=0.0, cache_modifier=".cg")
        value += tl.load(inclusive_ptr + rows, mask=used[:, None] & inclusive[:, None],
                         other=0.0, cache_modifier=".cg")
        # lane w's weight: the decay of the lanes nearer than it, below the stop (no mark)
        nearer = (w >= 1) & (w <= stop) & valid
        if SCALAR_DECAY:
            r_prev = tl.load(sum_decay_ptr + tiles + 1, mask=nearer, other=0.0,
                             cache_modifier=".cg")
            through = tl.cumsum(r_prev, axis=0)
            weight = exp_fast(-rate[None, :] * through[:, None])
            passed = tl.sum(tl.where(valid, r_sum, 0.0), axis=0)
            window_decay = exp_fast(-rate * passed)
        else:
            d_prev = tl.load(sum_decay_ptr + rows + BLOCK_D, mask=nearer[:, None], other=1.0,
                             cache_modifier=".cg")
            weight = tl.cumprod(d_prev, axis=0)
            d_all = tl.load(sum_decay_ptr + rows, mask=valid[:, None], other=1.0,
                            cache_modifier=".cg")
            window_decay = tl.reduce(d_all, 0, _multiply)
        entering += between * tl.sum(tl.where(used[:, None], weight * value, 0.0), axis=0)
        if stop < WINDOW:
            end_pos = 0
        else:
            between *= window_decay
            end_pos -= WINDOW
    return entering


@triton.jit
def lookback_carry_kernel(decay_ptr, end_ptr, out_ptr, rate_ptr, sum_decay_ptr, sum_end_ptr,
                          inclusive_ptr, status_ptr, NC, D, SEG, N_SEG, N_CB,
                          REVERSE: tl.constexpr, SCALAR_DECAY: tl.constexpr,
                          PUBLISH_EVERY: tl.constexpr, BLOCK_C: tl.constexpr,
                          BLOCK_D: tl.constexpr, WINDOW: tl.constexpr = 0):
    """Phase 2 in one launch: one program per (batch, channel block, segment of SEG chunks),
    tensors as chunk_carry_kernel's.  A program sums its segment from zero and publishes the
    summary, then walks back over the segments before it in scan order, taking each one's
    inclusive state where published (and stopping there) or its summary, then publishes its
    own inclusive state and writes its chunks' carries from the state it found.
    Tiles are numbered by an atomic counter (status[N_TILES]), in scan order within a
    (batch, channel block): a program waits only on tiles that are already running, so it
    cannot wait on one that never starts.  status: [N_TILES + 1] int32, zero at launch.
    sum_decay ([N_TILES], sums of r, or [N_TILES, BLOCK_D]), sum_end and inclusive
    ([N_TILES, BLOCK_D]) are scratch.  How far a walk goes depends on timing, so the sums'
    rounding, and the last bits of the result, can differ from call to call.
    PUBLISH_EVERY: 1, every tile publishes its inclusive state; k > 1, only every k-th tile in
    scan order; 0, none, so that every walk runs back to the first segment.  Tests take the
    last two, whose walks cross summaries before an inclusive state: the interpreter runs the
    programs in order, so with 1 every walk stops at the tile before it.
    WINDOW: 0, the walk reads one earlier tile at a time (a wait and an L2 round trip each);
    W (a power of two), it reads the W tiles before it at once (a lane each), waits only while
    one of them has published nothing, and combines their summaries with the recurrence's
    associative operator up to the nearest inclusive state (or packed start) among them, so
    that one round trip covers W segments (_window_entering)."""
    n_tiles = tl.num_programs(0)
    tile = tl.atomic_add(status_ptr + n_tiles, 1)
    step = tile % N_SEG  # position in scan order
    line = tile // N_SEG
    b = (line // N_CB).to(tl.int64)
    block = tl.arange(0, BLOCK_D)
    cols = (line % N_CB) * BLOCK_D + block
    col_ok = cols < D
    seg = N_SEG - 1 - step if REVERSE else step
    lo = seg * SEG
    hi = tl.minimum(lo + SEG, NC)
    zero = tl.zeros([BLOCK_D], dtype=tl.float32)
    rate = zero
    if SCALAR_DECAY:
        rate = tl.load(rate_ptr + cols, mask=col_ok, other=1.0)  # no 0 * inf past the width
    own_end, own_prod, own_r = _walk_segment(decay_ptr, end_ptr, out_ptr, rate, zero, b, cols,
                                             col_ok, lo, hi, NC, D, False, REVERSE,
                                             SCALAR_DECAY, BLOCK_C)
    row = tile.to(tl.int64) * BLOCK_D + block
    tl.store(sum_end_ptr + row, own_end)
    if SCALAR_DECAY:
        tl.store(sum_decay_ptr + tile, own_r)
    else:
        tl.store(sum_decay_ptr + row, own_prod)
    _publish(status_ptr, tile, _SUMMARY)
    # state entering the segment = sum over earlier segments i of (decay between) * end_i
    entering = zero
    if WINDOW > 0:
        entering = _window_entering(sum_decay_ptr, sum_end_ptr, inclusive_ptr, status_ptr, rate,
                                    tile, step, block, SCALAR_DECAY, WINDOW, BLOCK_D)
    else:  # a walk whose start is a constant -1 crashes triton 3.6's coalesce pass
        between = tl.full([BLOCK_D], 1.0, dtype=tl.float32)
        back = step - 1
        while back >= 0:
            earlier = tile - (step - back)
            flag = tl.atomic_add(status_ptr + earlier, 0, sem="acquire")
            while flag == 0:
                flag = tl.atomic_add(status_ptr + earlier, 0, sem="acquire")
            other = earlier.to(tl.int64) * BLOCK_D + block
            if flag == _INCLUSIVE:
                entering += between * tl.load(inclusive_ptr + other, cache_modifier=".cg")
                back = -1
            else:
                entering += between * tl.load(sum_end_ptr + other, cache_modifier=".cg")
                if SCALAR_DECAY:
                    r_sum = tl.load(sum_decay_ptr + earlier, cache_modifier=".cg")
                    if r_sum == START_MARK:  # a packed start: nothing earlier passes
                        back = -1
                    else:
                        between *= exp_fast(-rate * r_sum)
                        back -= 1
                else:
                    between *= tl.load(sum_decay_ptr + other, cache_modifier=".cg")
                    back -= 1
    publish = PUBLISH_EVERY == 1
    if PUBLISH_EVERY > 1:
        publish = step % PUBLISH_EVERY == 0
    if publish:
        if SCALAR_DECAY:
            own_prod = tl.where(own_r == START_MARK, 0.0, exp_fast(-rate * own_r))
        tl.store(inclusive_ptr + row, own_prod * entering + own_end)
        _publish(status_ptr, tile, _INCLUSIVE)
    _walk_segment(decay_ptr, end_ptr, out_ptr, rate, entering, b, cols, col_ok, lo, hi, NC, D,
                  True, REVERSE, SCALAR_DECAY, BLOCK_C)


@triton.jit
def walked_carry(r_sum_ptr, end_ptr, rate, b, k, NC, cols, D, REVERSE: tl.constexpr):
    """Phase 2 for one chunk, in the program that needs it: the state entering chunk k (or, with
    REVERSE, the adjoint carry entering it from its right), walked over the chunk summaries of
    SCALAR_DECAY's form (sums of r [B, NC], ends [B, NC, D]) from the first chunk (the last).
    O(NC) per program: for a few chunks, where it saves chunk_carry's launch."""
    col_ok = cols < D
    state = tl.zeros_like(rate)
    n = NC - 1 - k if REVERSE else k
    for i in range(0, n):
        j = NC - 1 - i if REVERSE else i
        r_sum = tl.load(r_sum_ptr + b * NC + j)
        start = r_sum == START_MARK  # a packed start: decay 0
        decay = tl.where(start, 0.0, exp_fast(-rate * tl.where(start, 0.0, r_sum)))
        state = decay * state + tl.load(end_ptr + (b * NC + j) * D + cols, mask=col_ok,
                                        other=0.0)
    return state


@dataclass(frozen=True)
class CarryPlan:
    """How phase 2 runs over a row of chunks.  Below two_level_from chunks, one program per
    (batch, channel block) walks the whole row; from there on, segments of segment_chunks
    chunks, in two levels (three launches) or, with lookback, in one launch and a fill of its
    status flags.  The look-back's result can differ from call to call in its last bits
    (lookback_carry_kernel)."""
    two_level_from: int = 512
    segment_chunks: int = 128
    lookback: bool = False
    publish_every: int = 1  # lookback_carry_kernel's PUBLISH_EVERY (tests change it)
    window: int = 0  # lookback_carry_kernel's WINDOW: 0 one tile at a time, else a power of 2

    def __repr__(self) -> str:
        # Without a window, as before the field existed: calibration files key the registered
        # configurations' launch settings on their repr (family.settings_digest).
        fields = [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                  if f.name != "window" or self.window]
        return f"CarryPlan({', '.join(fields)})"

    def __post_init__(self):
        launching.check_fields(self, dict(two_level_from=0, publish_every=0, window=None))
        if self.window and (self.window & (self.window - 1) or not self.lookback):
            raise ValueError(f"CarryPlan: window must be 0 or a power of two, with lookback; "
                             f"got window={self.window}, lookback={self.lookback}")

    @property
    def label(self) -> str:
        """A short tag for test ids and logs."""
        kind = f"lookback_every{self.publish_every}" if self.lookback else "levels"
        if self.window:
            kind += f"_window{self.window}"
        return f"{kind}_from{self.two_level_from}_seg{self.segment_chunks}"


# One program per channel block walking 4096 chunks took 0.13 ms a call on the H200 (chunk 8,
# L = 32768): longer rows are cut into segments.
DEFAULT_PLAN = CarryPlan()


# A launch grid's second and third axes hold at most 65535 programs (CUDA's limit).
GRID_AXIS_LIMIT = 65535


@functools.lru_cache(maxsize=None)
def _carry_grid(batch: int, n_chunks: int, width: int, plan: CarryPlan) -> tuple:
    """(block_c, block_d, grid, segments or 0, chunks a segment) of a carry over
    [batch, n_chunks, width]: worked out once per shape (host time).  Segments are the plan's
    length, or longer where a row would need more than the grid's third axis holds."""
    block_c = min(64, max(16, next_power_of_2(n_chunks)))
    if n_chunks < plan.two_level_from:
        # One program per (batch, channel block) walks every chunk: keep >= ~256 programs busy.
        block_d = max(16, min(128, next_power_of_2(max(1, batch * width // 256))))
        block_d = min(block_d, max(16, next_power_of_2(width)))
        return block_c, block_d, (batch, cdiv(width, block_d), 1), 0, n_chunks
    seg_chunks = max(plan.segment_chunks, cdiv(n_chunks, GRID_AXIS_LIMIT))
    n_seg = cdiv(n_chunks, seg_chunks)
    block_d = min(32, max(16, next_power_of_2(width)))
    return block_c, block_d, (batch, cdiv(width, block_d), n_seg), n_seg, seg_chunks


def chunk_carry(decay: torch.Tensor, end: torch.Tensor, reverse: bool,
                rate: torch.Tensor | None = None, out: torch.Tensor | None = None,
                plan: CarryPlan = DEFAULT_PLAN) -> torch.Tensor:
    """Phase 2 over [B, NC, D] summaries, into out (contiguous, like end) when given.  With
    rate (SAMU's per-channel 8 exp(log_temp) softplus(a_param), [D]), decay is the chunks' sum
    of r, [B, NC] (see chunk_carry_kernel).  Long rows run as plan says."""
    batch, n_chunks, width = end.shape
    out = torch.empty_like(end) if out is None else out
    scalar_decay = rate is not None
    params = (rate,) if scalar_decay else (end,)
    block_c, block_d, grid, n_seg, seg_chunks = _carry_grid(batch, n_chunks, width, plan)
    meta = dict(REVERSE=reverse, SCALAR_DECAY=scalar_decay, BLOCK_C=block_c, BLOCK_D=block_d,
                num_warps=4)
    if not n_seg:
        launching.launch(chunk_carry_kernel, grid, decay, end, out, *params, end, end, end,
                         n_chunks, width, n_chunks, MODE=0, **meta)
        return out
    f32 = dict(device=end.device, dtype=torch.float32)
    if plan.lookback:
        n_cb = grid[1]
        n_tiles = batch * n_cb * n_seg
        status = torch.zeros(n_tiles + 1, device=end.device, dtype=torch.int32)
        sums = torch.empty(n_tiles, block_d, **f32)
        inclusive = torch.empty(n_tiles, block_d, **f32)
        sum_decay = torch.empty(n_tiles if scalar_decay else (n_tiles, block_d), **f32)
        launching.launch(lookback_carry_kernel, (n_tiles,), decay, end, out, *params, sum_decay,
                         sums, inclusive, status, n_chunks, width, seg_chunks, n_seg,
                         n_cb, PUBLISH_EVERY=plan.publish_every, WINDOW=plan.window, **meta)
        return out
    seg_decay = torch.empty((batch, n_seg) if scalar_decay else (batch, n_seg, width), **f32)
    seg_end = torch.empty(batch, n_seg, width, **f32)
    launching.launch(chunk_carry_kernel, grid, decay, end, out, *params, seg_decay, seg_end, end,
                     n_chunks, width, seg_chunks, MODE=1, **meta)
    seg_in = chunk_carry(seg_decay, seg_end, reverse, rate)
    launching.launch(chunk_carry_kernel, grid, decay, end, out, *params, seg_decay, seg_end,
                     seg_in, n_chunks, width, seg_chunks, MODE=2, **meta)
    return out

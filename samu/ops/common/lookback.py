"""The single-pass scans' shared pieces: tickets, published tile states, the decoupled look-back,
the exchange of per-token partial sums between the tiles of one chunk, and a tile's scans.

A single-pass kernel runs one program per tile, a chunk of T tokens times a block of channels.
A program takes a ticket from an atomic counter (``ticket``), which names its tile, so that the
order in which tiles start is the ticket order, whatever order the GPU launches programs in.  The
tile loads its inputs once, scans them locally, publishes its aggregate (the decay across the
tile and its end state from a zero entering state, flag AGGREGATE), finds the state entering it
from the tiles before it (``look_back``, Merrill and Garland's decoupled look-back), publishes
its inclusive state (flag INCLUSIVE), and writes its output from registers.

Publication is a release/acquire pair: a tile stores its rows, every thread of it passes a
barrier, and one thread sets the flag with a release exchange (``publish``); a reader polls the
flags with relaxed loads (``relaxed``: no read-modify-write), and once they show what it waits
for, one acquire fence (``fence``; a single flag is read with an acquire load, ``acquire``)
orders its reads of the rows, which go past L1 (.cg).  A row, once published, is never written
again, and an aggregate and an inclusive state lie in rows of their own, so no read can see half
of one.  Polls back off between rounds (``pause``).

The look-back polls the flags of WINDOW predecessors at once, nearest first; it waits only
while a lane up to the nearest inclusive one has published nothing, then combines those lanes'
rows with the recurrence's operator (h -> decay h + end), nearest first, up to that lane.  A tile whose chunk holds a sequence
start or a reset (its decay is exactly 0) publishes its end state as inclusive at once: a walk
stops there.

SAMU's controller and its dz reduce over every channel of a token, so the tiles of one chunk
(a group) exchange per-token partial sums: each stores its partials, arrives on the group's
counter, and the last to arrive sums them in channel-block order (the same order, and so the
same bits, for every tile) and publishes the totals, which the others wait for (``exchange``).

Deadlock freedom needs every tile a program waits on to hold a ticket already: look-back
predecessors hold earlier tickets; a group's tiles hold consecutive tickets (channel block
fastest), and a group's first tile waits until its last one has started, which needs the GPU to
hold a group's tiles at once (the host checks that the group is at most one program per SM, or
runs ``SPLIT``: the exchange in a launch of its own, docs/PERFORMANCE.md).  Under Triton's
interpreter, which runs programs one at a time in grid order, the host always splits where a
group has more than one tile.
"""
from __future__ import annotations

import triton
import triton.language as tl

from . import scan
from .carry import _publish
from .math import INTERPRETER, exp_fast, transition
from .scan import affine_combine
from .sequences import (cut_resets, entering_state, fold_starts, load_at, reset_mask,
                        taken_starts)

# A tile's flag: 0 nothing yet, then its aggregate, then its inclusive state.
AGGREGATE = tl.constexpr(1)
INCLUSIVE = tl.constexpr(2)

# Channel blocks of a group summed per step of the exchange (a fixed order: the same bits in
# every tile).
EXCHANGE_BLOCKS = tl.constexpr(16)

# Backoff between polls, in nanoseconds: doubled from the first to the last.
FIRST_PAUSE = tl.constexpr(32)
LAST_PAUSE = tl.constexpr(512)


@triton.jit
def _flags_at(ptrs, INSTRUCTION: tl.constexpr):
    """The int32 values at ptrs, each loaded by one PTX load INSTRUCTION; the interpreter runs
    programs one at a time: a plain load."""
    if INTERPRETER:
        return tl.load(ptrs, volatile=True)
    else:
        return tl.inline_asm_elementwise(INSTRUCTION + " $0, [$1];", "=r,l", [ptrs],
                                         dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def acquire(ptrs):
    """Flags, each an acquire load at GPU scope (PTX ld.acquire.gpu): the rows a tile published
    before its flag are visible after it."""
    return _flags_at(ptrs, "ld.acquire.gpu.global.b32")


@triton.jit
def relaxed(ptrs):
    """Flags, each a relaxed load at GPU scope (PTX ld.relaxed.gpu: coherent in L2, no
    ordering): the polls, which ``fence`` orders once they see what they wait for."""
    return _flags_at(ptrs, "ld.relaxed.gpu.global.b32")


@triton.jit
def fence(token):
    """An acquire-release fence at GPU scope (PTX fence.acq_rel.gpu) after the relaxed polls that
    saw the flags: the rows published before them are then visible.  ``token`` (a polled value)
    orders it after the polls; returned, it orders the reads after it."""
    if INTERPRETER:
        return token
    else:
        return tl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tmov.u32 $0, $1;", "=r,r",
                                         [token], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def pause(ns):
    """Sleep about ns nanoseconds (PTX nanosleep) between polls; returns the next pause."""
    if not INTERPRETER:
        tl.inline_asm_elementwise("nanosleep.u32 $1;\n\tmov.u32 $0, $1;", "=r,r", [ns],
                                  dtype=tl.int32, is_pure=False, pack=1)
    return tl.minimum(ns * 2, LAST_PAUSE)


@triton.jit
def publish(flag_ptr, index, value):
    """Set a tile's flag once every thread's stores before it are done (a release)."""
    _publish(flag_ptr, index, value)


@triton.jit
def wait_for(flag_ptr):
    """Poll one flag until it is set (acquire loads, backing off)."""
    ns = FIRST_PAUSE
    while acquire(flag_ptr) == 0:
        ns = pause(ns)


@triton.jit
def ticket(counter_ptr, n_tiles, N_CB, NC, ORDER: tl.constexpr):
    """(batch row, scan step, channel block) of the tile this program runs, from the next
    ticket of counter_ptr.  ORDER 0: channel block fastest, then the scan step, then the batch
    row: each chain's resident tiles span few steps, and a group's tiles hold consecutive
    tickets.  ORDER 1 (tests, split launches only): chain by chain, the channel blocks and batch
    rows taken last first, a legal order under the interpreter that no GPU launch takes."""
    t = tl.atomic_add(counter_ptr, 1)
    if ORDER == 0:
        cb = t % N_CB
        group = t // N_CB
        return group // NC, group % NC, cb
    else:
        chain = n_tiles // NC - 1 - t // NC
        return chain // N_CB, t % NC, chain % N_CB


@triton.jit
def tile_of(flag_ptr, N_TILES, N_GROUPS, NC, N_CB, PHASE: tl.constexpr, ORDER: tl.constexpr,
            REVERSE: tl.constexpr):
    """This program's tile from its ticket: (batch row (int64), chunk, scan step, channel
    block, group, tile index).  The int32 words at flag_ptr hold the tiles' flags, the groups'
    arrival counts and totals flags, then two ticket counters (one per launch of a split).
    REVERSE: the scan runs from the last chunk."""
    counter = flag_ptr + N_TILES + 2 * N_GROUPS + PHASE // 2
    b, step, cb = ticket(counter, N_TILES, N_CB, NC, ORDER)
    b = b.to(tl.int64)
    if REVERSE:
        k = NC - 1 - step
    else:
        k = step
    group = b * NC + k
    return b, k, step, cb, group, group * N_CB + cb


@triton.jit
def boundaries(cuts, entry, holds_by_row, entry_by_row, FROM_ROWS: tl.constexpr):
    """(whether the tile holds a cut, whether its entry row is one): from its rows' [T] flags
    (cuts: sequence starts and resets; entry: the flags whose row 0 stops what enters) where
    FROM_ROWS (packed sequences or a reset mask), else the scalars given (an unpacked row's only
    start is its first token: no cross-thread reduction)."""
    if FROM_ROWS:
        first = tl.arange(0, entry.shape[0]) == 0
        return (tl.max(cuts.to(tl.int32), axis=0) > 0,
                tl.max(tl.where(first, entry.to(tl.int32), 0), axis=0) > 0)
    else:
        return holds_by_row, entry_by_row


@triton.jit
def _or(a, b):
    return a | b


@triton.jit
def _poll(flag_ptr, me, seen, step, flag_step, WINDOW: tl.constexpr):
    """(ready, the last lane the window uses, a bit per inclusive lane) of the window of
    predecessors seen + 1 .. seen + WINDOW, nearest first: ready once every lane up to the
    nearest inclusive one (or every lane, without one) has published.  A lane is a relaxed load
    of its flag (one per thread of a warp); a lane past the row's start counts as inclusive,
    with nothing in it."""
    lanes = tl.arange(0, WINDOW)
    dist = seen + 1 + lanes
    valid = dist <= step
    flags = tl.where(valid, relaxed(flag_ptr + tl.where(valid, me - dist * flag_step, me)),
                     INCLUSIVE)
    first_inclusive = tl.min(tl.where(flags == INCLUSIVE, lanes, WINDOW), axis=0)
    first_empty = tl.min(tl.where(flags == 0, lanes, WINDOW), axis=0)
    inclusive = tl.reduce((flags == INCLUSIVE).to(tl.int32) << lanes, 0, _or)
    last_used = tl.minimum(first_inclusive, WINDOW - 1)
    return first_empty > last_used, last_used, inclusive


@triton.jit
def _compose_outer(a1, b1, a2, b2):
    """(a1, b1) after (a2, b2): a scan of it over lanes nearest first composes the nearer
    predecessors' maps (h -> decay h + end) over the farther ones."""
    return affine_combine(a2, b2, a1, b1)


@triton.jit
def look_back(flag_ptr, decay_ptr, end_ptr, incl_ptr, rate, me, row, step, flag_step, row_step,
              cols, col_ok, SCALAR_DECAY: tl.constexpr, WINDOW: tl.constexpr):
    """The state entering a tile at scan step ``step`` from its predecessors.  Predecessor j
    (1 <= j <= step) has its flag and decay at index me - j flag_step and its rows (end state,
    inclusive state) at element row - j row_step + cols (row_step an int32 whose divisibility
    is the tile's vector width's: the window's rows then take the tile's layout).  The decay is
    a [BD] row, or with SCALAR_DECAY a sum of r per tile whose decay is exp(-rate sum) (SAMU).
    Each round polls the flags of WINDOW predecessors at once (at most 32);
    once every lane up to the nearest inclusive one has published, one fence, then one load
    brings those lanes' rows ([WINDOW, BD], masked to them: one round trip), which are composed
    nearest first in each thread's registers (the lanes lie in a thread, as a tile's tokens)."""
    lanes = tl.arange(0, WINDOW)[:, None]
    ok = col_ok[None, :]
    end_row = end_ptr + row
    incl_row = incl_ptr + row
    own_decay = decay_ptr + me
    entering = tl.zeros_like(rate)
    between = tl.full(rate.shape, 1.0, tl.float32)
    seen = step * 0
    while seen < step:
        ready, last_used, inclusive = _poll(flag_ptr, me, seen, step, flag_step, WINDOW)
        ns = FIRST_PAUSE
        while ready == 0:
            ns = pause(ns)
            ready, last_used, inclusive = _poll(flag_ptr, me, seen, step, flag_step, WINDOW)
        last_used = fence(last_used)
        dist = seen + 1 + lanes
        used = (dist <= step) & (lanes <= last_used)
        stops = used & (((inclusive >> lanes) & 1) != 0)
        offsets = cols[None, :] - dist * row_step
        value = tl.load(tl.where(stops, incl_row, end_row) + offsets, mask=used & ok, other=0.0,
                        cache_modifier=".cg")
        if SCALAR_DECAY:
            r_sum = tl.load(own_decay - dist * flag_step, mask=used & ~stops, other=0.0,
                            cache_modifier=".cg")
            decay = exp_fast(-rate[None, :] * r_sum)
        else:
            decay = tl.load(decay_ptr + row + offsets, mask=used & ~stops & ok, other=1.0,
                            cache_modifier=".cg")
        # lanes past the last used one hold (1, 0): the identity
        through, total = tl.associative_scan((decay, value), 0, _compose_outer)
        last = lanes == WINDOW - 1
        entering += between * tl.sum(tl.where(last, total, 0.0), axis=0)
        between *= tl.sum(tl.where(last, through, 0.0), axis=0)
        seen = tl.where(((inclusive >> last_used) & 1) != 0, step, seen + WINDOW)
    return entering


@triton.jit
def chain(flag_ptr, decay_ptr, end_ptr, incl_ptr, rate, decay, end, r_sum, holds_start,
          entry_cut, me, row, step, flag_step, row_step, cols, col_ok,
          SCALAR_DECAY: tl.constexpr, WINDOW: tl.constexpr, INCLUSIVE_EVERY: tl.constexpr):
    """Publish a scanned tile's aggregate (``decay``, the product of its a, [BD], published as
    a row, or with SCALAR_DECAY as the tile's sum of r; ``end``, its end state from zero), find
    the state entering it by the look-back, store and publish its inclusive state
    decay h_in + end; return h_in.  A tile holding a sequence start (its decay is then exactly
    0: the start cuts it) publishes its end state as inclusive at once; its look-back is
    skipped where nothing enters its first row (entry_cut).  INCLUSIVE_EVERY (tests): 0, no
    tile but a start's publishes its inclusive state; k, only every k-th step's (the row is
    stored all the same: a split launch and the backward read it)."""
    at = row + cols
    tl.store(end_ptr + at, end, mask=col_ok)
    if SCALAR_DECAY:  # r_sum: one value, or a [BD] row of it (one lane stores it)
        tl.store(decay_ptr + me + cols * 0, r_sum, mask=tl.arange(0, cols.shape[0]) == 0)
    else:
        tl.store(decay_ptr + at, decay, mask=col_ok)
    if holds_start:
        tl.store(incl_ptr + at, end, mask=col_ok)
    publish(flag_ptr, me, tl.where(holds_start, INCLUSIVE, AGGREGATE))
    h_in = look_back(flag_ptr, decay_ptr, end_ptr, incl_ptr, rate, me, row,
                     tl.where(entry_cut, 0, step), flag_step, row_step, cols, col_ok,
                     SCALAR_DECAY, WINDOW)
    if not holds_start:
        tl.store(incl_ptr + at, decay * h_in + end, mask=col_ok)
        if INCLUSIVE_EVERY > 0:
            if step % INCLUSIVE_EVERY == 0:
                publish(flag_ptr, me, INCLUSIVE)
    return h_in


@triton.jit
def arrive(count_ptr, group, N_CB):
    """Count this tile in its group of N_CB once its stores are done (acquiring the others'):
    True for the group's last."""
    tl.debug_barrier()
    return tl.atomic_add(count_ptr + group, 1, sem="acq_rel") == N_CB - 1


@triton.jit
def exchange_sum(part_ptr, group, N_CB, WIDTH: tl.constexpr):
    """[WIDTH]: the sum over the N_CB channel blocks of a group's partial rows (part [groups,
    N_CB, WIDTH]), in channel-block order, read past L1 (the last tile of the group runs it)."""
    lanes = tl.arange(0, EXCHANGE_BLOCKS)
    cols = tl.arange(0, WIDTH)
    base = group.to(tl.int64) * N_CB * WIDTH
    total = tl.zeros([WIDTH], dtype=tl.float32)
    for c0 in range(0, N_CB, EXCHANGE_BLOCKS):
        blocks = c0 + lanes
        part = tl.load(part_ptr + base + blocks[:, None] * WIDTH + cols[None, :],
                       mask=(blocks < N_CB)[:, None], other=0.0, cache_modifier=".cg")
        total += tl.sum(part, axis=0)
    return total


# --- a tile's scans, shared by the single-pass kernels of both mixers ---------------------------

@triton.jit
def scan_inputs(log_a, gx, starts, flagged, h0_ptr, b, seq, cols, D, N_SEQ,
                PACKED: tl.constexpr, HAS_INITIAL: tl.constexpr, HAS_RESETS: tl.constexpr):
    """(a, m, dm/dlog a, and the scan's inputs a, u = m gx with each start folded in:
    sequences.fold_starts) of a tile from its log a and gate x.  At a token the mask flags
    (HAS_RESETS) m = 1 and a = 0, whatever state would enter it; an initial state enters only
    the starts the mask leaves alone (samu.ops.common.sequences)."""
    a, m, dm_dlog_a = transition(log_a, reset_mask(starts, flagged, HAS_INITIAL, HAS_RESETS))
    a = cut_resets(a, flagged, HAS_RESETS)
    if PACKED or HAS_INITIAL:
        entering = entering_state(h0_ptr, b, seq, taken_starts(starts, flagged, HAS_RESETS),
                                  cols, D, N_SEQ, PACKED, HAS_INITIAL)
        a_in, u_in = fold_starts(a, m * gx, starts, entering)
    else:
        a_in, u_in = a, m * gx
    return a, m, dm_dlog_a, a_in, u_in


@triton.jit
def adjoint_scan(a, dy, ends, dfinal_ptr, b, seq, cols, D, N_SEQ, T: tl.constexpr,
                 PACKED: tl.constexpr, HAS_DFINAL: tl.constexpr):
    """(q, w) of a tile whose rows run latest first: dh = w + q c for the carry c = a dh entering
    at its last token.  dh_t = dy_t + a_{t+1} dh_{t+1}, a_{t+1} the row before's a, cut where a
    sequence ends (nothing crosses a start backwards); the final state's gradient enters at
    each end."""
    shifted = scan.shifted_rows(a, 1.0, T)
    if PACKED:
        shifted = tl.where(ends[:, None], 0.0, shifted)
    if HAS_DFINAL:
        dy += load_at(dfinal_ptr, b, seq, ends, cols, D, N_SEQ, PACKED)
    return tl.associative_scan((shifted, dy), 0, affine_combine)

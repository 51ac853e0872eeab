"""The scan inside a chunk: affine combines, the unrolled previous-state product, tile rows.

A scan tile [T tokens, channels] is laid out so that each thread holds all T tokens of its
channels (``row_offsets``): the scan along time is then a loop in registers, with no shared
memory and no shuffles.  Triton's reverse scan still shuffles, so reverse recurrences load a
chunk latest token first and scan forward; a scan then calls combine(accumulated_later,
element_earlier), the order a reverse scan uses, and one affine combine serves both directions.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def affine_combine(a1, b1, a2, b2):
    """Apply (a1, b1) then (a2, b2): h -> a2 (a1 h + b1) + b2."""
    return a1 * a2, a2 * b1 + b2


@triton.jit
def adjoint_combine(p_r, v_r, q_r, w_r, p_l, v_l, q_l, w_l):
    """Reverse-scan combine for the adjoint.  For a segment and an incoming c = a dh from its right:
    a_t dh_t = p c + v and dh_t = q c + w at the segment's first token."""
    return p_l * p_r, p_l * v_r + v_l, q_l * p_r, q_l * v_r + w_l


@triton.jit
def decayed_previous_state(a, u, h_in, T: tl.constexpr):
    """a_t h_{t-1} of h_t = a_t h_{t-1} + u_t for a tile whose T rows (latest first) sit in one
    thread, from the chunk's entering state h_in, unrolled from the earliest row.  Taken as a
    product, not as h_t - u_t, which cancels when a_t is small (fast decay).  Each row pick and
    placement compares a constant row index, which folds to a register move; Triton's reverse
    scan would shuffle across lanes."""
    index = tl.arange(0, T)[:, None]
    h_run = h_in
    out = tl.zeros_like(a)
    for i in tl.static_range(T - 1, -1, -1):
        a_i = tl.sum(tl.where(index == i, a, 0.0), axis=0)
        u_i = tl.sum(tl.where(index == i, u, 0.0), axis=0)
        decayed = a_i * h_run
        h_run = decayed + u_i
        out = tl.where(index == i, decayed[None, :], out)
    return out


@triton.jit
def shifted_rows(values, first, T: tl.constexpr):
    """Row i of the result is row i - 1 of values, row 0 is `first`: in a tile loaded latest
    first, each token gets the value of the token after it (a_{t+1} from a_t) without computing
    it again.  Where the rows sit in one thread, each pick against a constant row index folds to
    a register move (check the SASS: other loads in a kernel can change its layout)."""
    index = tl.arange(0, T)[:, None]
    out = tl.full(values.shape, first, values.dtype)
    for i in tl.static_range(1, T):
        out = tl.where(index == i, tl.sum(tl.where(index == i - 1, values, 0.0), axis=0)[None, :],
                       out)
    return out


@triton.jit
def row_offsets(b, rows, L, row_units, V: tl.constexpr):
    """Element offset of each row of a [B, L, D] tensor, int64, written as rows * row_units * V
    with D = row_units * V.  row_units is passed unspecialised, so Triton knows only that rows
    start at multiples of V elements: its loads then give each thread V adjacent channels and,
    with a tile V * 32 * num_warps channels wide, every token of the chunk (see
    tile_width).  The scan along time then runs in registers, with no shared memory."""
    return (b * L + rows.to(tl.int64)) * row_units * V


@triton.jit
def last_row(values, rows, T: tl.constexpr):
    return tl.sum(tl.where(rows[:, None] == T - 1, values, 0.0), axis=0)


@triton.jit
def first_row(values, rows):
    return tl.sum(tl.where(rows[:, None] == 0, values, 0.0), axis=0)


# Cache policies of a tile's load or store (PTX eviction priorities in L2): the full-width
# kernels pass over a chunk twice, so the first pass asks L2 to keep the tile and the second,
# the kernel's last use of it, to drop it first.
KEEP = tl.constexpr(1)
DROP = tl.constexpr(2)


@triton.jit
def load_tile(ptr, mask, POLICY: tl.constexpr):
    """tl.load(ptr, mask, other=0) with the eviction priority POLICY (0: none, KEEP, DROP)."""
    if POLICY == KEEP:
        v = tl.load(ptr, mask=mask, other=0.0, eviction_policy="evict_last")
    elif POLICY == DROP:
        v = tl.load(ptr, mask=mask, other=0.0, eviction_policy="evict_first")
    else:
        v = tl.load(ptr, mask=mask, other=0.0)
    return v


@triton.jit
def store_tile(ptr, value, mask, POLICY: tl.constexpr):
    """tl.store with the eviction priority POLICY (0: none, DROP: a write not read again soon)."""
    if POLICY == DROP:
        tl.store(ptr, value, mask=mask, eviction_policy="evict_first")
    else:
        tl.store(ptr, value, mask=mask)

"""Sequence starts and ends inside the scan kernels: initial states, packed rows, final states.

The algebra is samu.ops.layout'.  In a kernel, each tile row (token) knows its sequence, and
whether it starts or ends one (``row_sequences``).  The forward folds every start into the scan
inputs, a_s -> 0 and u_s -> u_s + a_s h0 (``fold_starts``), so the chunk summaries and the carry
are those of a scan from zero: a chunk holding a start has decay 0, and nothing crosses it.  The
backward cuts the adjoint in the same place (a_{t+1} -> 0 where t + 1 starts), adds the final
state's gradient at each end, and writes d h0 = a_s dh_s at each start.

A reset mask (HAS_RESETS) is one byte per token and row, loaded beside the tile's per-token
values (``token_resets``): at a flagged token m = 1 (``reset_mask``) and a = 0 (``cut_resets``),
so that nothing enters it forwards (h_t = u_t; a chunk holding one has decay 0, as one holding a
start) and nothing leaves it backwards (a_t dh_t = 0: no d h0 there, no gradient into a); an
initial state enters only the starts the mask leaves alone (``taken_starts``).  The flag only
selects values: no mask byte moves an address.

Each feature is a constexpr (PACKED, HAS_INITIAL, HAS_FINAL, HAS_RESETS), so a call without it
compiles to the kernel it was before.  Every state load and store is masked to sequences
0 <= n < N_SEQ: no offsets, however wrong, make a kernel touch memory outside the [N, D] state
buffers.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..layout import sequence_index
from .launching import aligned, fp32_contiguous, reset_bytes


@triton.jit
def row_sequences(seq_ptr, b, rows, L, PACKED: tl.constexpr):
    """(sequence index (int64), starts, ends) of each row.  Unpacked, row b is sequence b;
    packed (batch 1), seq_ptr holds each token's sequence."""
    ok = rows < L
    if PACKED:
        seq = tl.load(seq_ptr + rows, mask=ok, other=0)
        before = tl.load(seq_ptr + rows - 1, mask=ok & (rows > 0), other=-1)
        after = tl.load(seq_ptr + rows + 1, mask=rows + 1 < L, other=-1)
        starts = ok & (seq != before)
        ends = ok & (seq != after)
        seq = seq.to(tl.int64)
    else:
        seq = tl.zeros_like(rows).to(tl.int64) + b
        starts = rows == 0
        ends = rows == L - 1
    return seq, starts, ends


@triton.jit
def state_offsets(seq, cols, D):
    """Offsets of the [N, D] state rows of each tile row's sequence."""
    return seq[:, None] * D + cols[None, :]


@triton.jit
def state_mask(seq, where, cols, D, N_SEQ):
    """Where a tile row's state element is read or written: ``where`` holds, the column is in
    the width and the sequence is a row of the [N_SEQ, D] buffer."""
    rows_ok = where & (seq >= 0) & (seq < N_SEQ)
    return rows_ok[:, None] & (cols < D)[None, :]


@triton.jit
def _row_mask(b, where, cols, D, N_SEQ):
    """Unpacked: where row b's state element is read or written: a tile row needs it, the
    column is in the width and b is a row of the [N_SEQ, D] buffer (as a bound on the
    columns: a scalar condition in a mask fails under Triton's interpreter)."""
    needed = tl.max(where.to(tl.int32), axis=0) > 0
    return cols < tl.where(needed & (b >= 0) & (b < N_SEQ), D, 0)


@triton.jit
def load_at(ptr, b, seq, where, cols, D, N_SEQ, PACKED: tl.constexpr):
    """The [N, D] state row of each tile row's sequence where ``where`` holds (0 elsewhere).
    Unpacked every row is sequence b: one [BD] row, broadcast over the rows.  A [T, BD] gather
    there would take a layout of its own, and the scan's tile with it: the time axis across
    warps, through shared memory (5-9x the backward's GPU time on the H200)."""
    if PACKED:
        return tl.load(ptr + state_offsets(seq, cols, D),
                       mask=state_mask(seq, where, cols, D, N_SEQ), other=0.0)
    else:
        row = tl.load(ptr + b * D + cols, mask=_row_mask(b, where, cols, D, N_SEQ), other=0.0)
        return tl.where(where[:, None], row[None, :], 0.0)


@triton.jit
def store_at(ptr, values, b, seq, where, cols, D, N_SEQ, PACKED: tl.constexpr):
    """values into the [N, D] state row of each tile row's sequence where ``where`` holds.
    Unpacked, at most one row of a tile holds (a start, or an end): its values, picked within
    each thread, go to row b as one [BD] store (as in load_at)."""
    if PACKED:
        tl.store(ptr + state_offsets(seq, cols, D), values,
                 mask=state_mask(seq, where, cols, D, N_SEQ))
    else:
        row = tl.sum(tl.where(where[:, None], values, 0.0), axis=0)
        tl.store(ptr + b * D + cols, row, mask=_row_mask(b, where, cols, D, N_SEQ))


@triton.jit
def resets(starts, HAS_INITIAL: tl.constexpr):
    """[T, 1]: where the state resets (m = 1, no gradient into a): every start, unless an
    initial state enters it."""
    if HAS_INITIAL:
        return (starts & False)[:, None]
    else:
        return starts[:, None]


@triton.jit
def token_resets(reset_ptr, b, rows, L, HAS_RESETS: tl.constexpr):
    """[T] bool: the mask's flag of each tile row (token) of row b; false past the length and
    without a mask.  The mask is [B, L] bytes."""
    if HAS_RESETS:
        ok = (rows >= 0) & (rows < L)
        return tl.load(reset_ptr + b * L + rows, mask=ok, other=0) != 0
    else:
        return rows < 0


@triton.jit
def reset_mask(starts, flagged, HAS_INITIAL: tl.constexpr, HAS_RESETS: tl.constexpr):
    """[T, 1]: where the state resets (m = 1, no gradient into a): resets' starts and the
    mask's flagged tokens."""
    if HAS_RESETS:
        return resets(starts, HAS_INITIAL) | flagged[:, None]
    else:
        return resets(starts, HAS_INITIAL)


@triton.jit
def cut_resets(a, flagged, HAS_RESETS: tl.constexpr):
    """a = 0 at the mask's flagged tokens: nothing enters them, nothing leaves them backwards."""
    if HAS_RESETS:
        return tl.where(flagged[:, None], 0.0, a)
    else:
        return a


@triton.jit
def taken_starts(starts, flagged, HAS_RESETS: tl.constexpr):
    """The starts that an initial state enters: those the mask does not reset."""
    if HAS_RESETS:
        return starts & (flagged == 0)
    else:
        return starts


@triton.jit
def entering_state(h0_ptr, b, seq, starts, cols, D, N_SEQ, PACKED: tl.constexpr,
                   HAS_INITIAL: tl.constexpr):
    """The state entering each start: h0 of its sequence, or 0 where the state resets."""
    if HAS_INITIAL:
        return load_at(h0_ptr, b, seq, starts, cols, D, N_SEQ, PACKED)
    else:
        return 0.0


@triton.jit
def fold_starts(a, u, starts, entering):
    """A start folded into the scan inputs: a_s -> 0 and u_s -> u_s + a_s entering_s (entering
    is h0, or 0 where the state resets)."""
    s = starts[:, None]
    return tl.where(s, 0.0, a), tl.where(s, u + a * entering, u)


@triton.jit
def adjoint_inputs(a, dy, seq_ptr, dfinal_ptr, b, rows, L, cols, D, N_SEQ,
                   PACKED: tl.constexpr, HAS_DFINAL: tl.constexpr):
    """A reverse scan's (a, dy) with sequences: the final state's gradient enters dy at each
    sequence's end (HAS_DFINAL), and nothing leaves through a start (a = 0 there, PACKED)."""
    if PACKED or HAS_DFINAL:
        seq, starts, ends = row_sequences(seq_ptr, b, rows, L, PACKED)
        if HAS_DFINAL:
            dy += load_at(dfinal_ptr, b, seq, ends, cols, D, N_SEQ, PACKED)
        if PACKED:
            a = tl.where(starts[:, None], 0.0, a)
    return a, dy


class SequenceArgs(NamedTuple):
    """The kernels' view of the state keywords: the arguments and constexprs of every launch.
    Where a feature is off, its tensor argument is a placeholder the kernel never reads."""
    seq_index: torch.Tensor  # [L] int32, packed only
    initial_state: torch.Tensor  # [N, D] FP32
    count: int  # N, the number of sequences (the kernels' N_SEQ)
    packed: bool
    has_initial: bool
    output_final_state: bool
    resets: torch.Tensor | None = None  # [B, L] bytes (reset_bytes), with a mask only
    has_resets: bool = False

    # How many tensors tensors_to_save gives (and with_saved takes back).
    SAVED = 3

    @property
    def reset_flags(self) -> torch.Tensor:
        """The mask's bytes as the kernels take them, or a placeholder they never read."""
        return self.resets if self.has_resets else self.initial_state

    def final_state(self, width: int, device) -> torch.Tensor:
        """[N, D] FP32 for the output kernel to fill, or a placeholder."""
        if not self.output_final_state:
            return self.initial_state
        # Packed, a zero-length sequence (offsets no one checked: a capture, a direct run) has
        # no last token to write its row: zeros, not uninitialised memory.
        alloc = torch.zeros if self.packed else torch.empty
        return alloc(self.count, width, device=device, dtype=torch.float32)

    def initial_state_gradient(self) -> torch.Tensor:
        """[N, D] FP32 for the backward kernel to fill with d h0, or a placeholder."""
        if not self.has_initial:
            return self.initial_state
        alloc = torch.zeros_like if self.packed else torch.empty_like  # as in final_state
        return alloc(self.initial_state)

    def tensors_to_save(self) -> tuple:
        """(seq_index, initial_state, resets), None where off (SAVED of them), for an
        autograd.Function's save_for_backward: an in-place change of any before the backward then
        raises autograd's error instead of giving wrong gradients."""
        return (self.seq_index if self.packed else None,
                self.initial_state if self.has_initial else None,
                self.resets if self.has_resets else None)

    def without_tensors(self) -> "SequenceArgs":
        """The flags and count alone, for an autograd.Function's ctx: its backward takes the
        tensors from the saved ones (``with_saved``)."""
        return self._replace(seq_index=None, initial_state=None, resets=None)

    def with_saved(self, seq_index, initial_state, resets,
                   placeholder: torch.Tensor) -> "SequenceArgs":
        """The arguments again from ``tensors_to_save``'s saved tensors; placeholder stands for
        those that are off: aligned x, as in the forward (the launch Sites key on x's dtype for
        a placeholder's, so another tensor would need its dtype in their keys)."""
        return self._replace(seq_index=placeholder if seq_index is None else seq_index,
                             initial_state=placeholder if initial_state is None else initial_state,
                             resets=resets)


def sequence_args(x: torch.Tensor, initial_state, cu_seqlens, output_final_state: bool,
                  resets=None) -> SequenceArgs:
    """The kernels' arguments for checked state keywords (samu.functional checks them); the
    sequence index stays in [0, N) even for offsets that were not checked (sequence_index).
    resets: a torch.bool [B, L] mask, or None."""
    batch, length, _ = x.shape
    packed = cu_seqlens is not None
    placeholder = aligned(x)  # a pointer the kernels never read, aligned as compiled for
    seq_index = sequence_index(cu_seqlens, length) if packed else placeholder
    count = cu_seqlens.numel() - 1 if packed else batch
    h0 = placeholder if initial_state is None else initial_state  # FP32, contiguous
    flags = None if resets is None else reset_bytes(resets, (batch, length), x.device)
    return SequenceArgs(seq_index, h0, count, packed, initial_state is not None,
                        bool(output_final_state), flags, resets is not None)


# SAMU's chunk sum of r where the chunk holds a packed sequence's start: its decay is 0.
START_MARK = tl.constexpr(float("inf"))


def _check_state_rows(what: str, value, shape: tuple, device) -> None:
    """value a floating-point tensor of ``shape`` on ``device``: the kernels read [B, D] state
    rows, and a wrong shape would have them read past the buffer."""
    if (not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(shape)
            or value.device != device or not value.is_floating_point()):
        got = (f"{tuple(value.shape)} {value.dtype} on {value.device}"
               if isinstance(value, torch.Tensor) else type(value).__name__)
        raise ValueError(f"{what} a floating-point tensor of shape {tuple(shape)} on {device}, "
                         f"got {got}")


def check_phase_tensors(who: str, x, initial_state=None, dy=None, d_state=None) -> None:
    """The tensors that context parallelism's phases take beside x (which samu.checks checks):
    a state or its cotangent [B, D], dy like x, each floating point on x's device; the kernels
    index each by x's shape, and a wrong one would have them read past its buffer."""
    batch, _, width = x.shape
    for what, value in (("initial_state", initial_state), ("the end state's cotangent", d_state)):
        if value is not None:
            _check_state_rows(f"{who}: {what} must be", value, (batch, width), x.device)
    if dy is not None:
        _check_state_rows(f"{who}: dy must be", dy, tuple(x.shape), x.device)


def slice_run_sequences(run, entering):
    """A SliceRun's sequence arguments (context parallelism) from its entering state, checked:
    None where the run resets (its summary came from the reset), else a floating-point [B, D]
    tensor on x's device."""
    if run.resets:
        if entering is not None:
            raise ValueError("SliceRun: a run that resets (a sequence starting without an "
                             "initial state) takes no entering state, got a tensor")
        return sequence_args(run.x, None, None, True)
    _check_state_rows("SliceRun: the entering state must be", entering,
                      (run.x.shape[0], run.x.shape[2]), run.x.device)
    return sequence_args(run.x, fp32_contiguous(entering), None, True)


def take_end_cotangent(end_cotangent, mu: torch.Tensor):
    """end_cotangent(mu) of a backward with that hook (context parallelism: the cotangent that
    later ranks put on this slice's final state), checked to be [B, D] like mu on mu's device,
    FP32 contiguous; None where it gives none.  A wrong shape would have the kernels read past
    the [B, D] buffer."""
    extra = end_cotangent(mu)
    if extra is None:
        return None
    _check_state_rows("end_cotangent must return None or", extra, mu.shape, mu.device)
    return fp32_contiguous(extra)

"""Where sequences start and end inside x, and what enters their first token (SPEC section 3).

Unpacked, every batch row is one sequence.  Packed (``cu_seqlens``, FlashAttention's convention:
batch 1, cumulative offsets [0, l_0, l_0 + l_1, ..., L]), sequence n holds the tokens
cu_seqlens[n] <= t < cu_seqlens[n + 1] of the single row.  At a sequence's first token s:

* with an initial state h0 [N, D], the step is an ordinary one from it:
  h_s = a_s h0[n] + m_s u'_s (u' = gate * x), so d h0[n] = a_s dh_s;
* without one, the state resets: h_s = u'_s (m_s = 1, a_s counts as 0), and nothing flows into
  a_s's inputs.

A per-token reset mask (``resets``, [B, L] bool) generalises the second case: wherever it is
true the state entering the token is ignored, whether it would come from the previous token or
from an initial state, and the token resets as above (d h0 is then zero at that start).  The
starts without an initial state are the resets that every call has; ``reset_tokens`` gives them
all.

The final state of sequence n is h at its last token; a gradient on it adds to dh there.
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class Sequences(NamedTuple):
    """Per-token layout, [B, L] each: starts, ends, and each token's sequence index."""
    starts: torch.Tensor
    ends: torch.Tensor
    index: torch.Tensor
    count: int


def sequence_index(cu_seqlens: torch.Tensor, length: int) -> torch.Tensor:
    """[L] int32: the sequence of each token of a packed row, without a host sync.  It counts
    the inner offsets (cu_seqlens[1:-1]) at or before each token, which for valid offsets is
    its sequence and for any offsets is in [0, N): bad ones cannot index past the states."""
    positions = torch.arange(length, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    inner = cu_seqlens[1:-1].contiguous()
    return torch.searchsorted(inner, positions, right=True).to(torch.int32)


def layout(batch: int, length: int, device, cu_seqlens: torch.Tensor | None = None) -> Sequences:
    """Where each sequence starts and ends (every row one sequence, or the packed ones)."""
    if cu_seqlens is None:
        t = torch.arange(length, device=device)
        starts = (t == 0).expand(batch, length)
        ends = (t == length - 1).expand(batch, length)
        index = torch.arange(batch, device=device)[:, None].expand(batch, length)
        return Sequences(starts, ends, index, batch)
    index = sequence_index(cu_seqlens.to(device), length).long()[None]
    starts = torch.ones_like(index, dtype=torch.bool)
    starts[:, 1:] = index[:, 1:] != index[:, :-1]
    ends = torch.ones_like(starts)
    ends[:, :-1] = starts[:, 1:]
    return Sequences(starts, ends, index, int(cu_seqlens.numel()) - 1)


def dense_entering_state(seqs: Sequences, initial_state: torch.Tensor | None, width: int, dtype,
                         resets: torch.Tensor | None = None):
    """[B, L, D]: the state entering each token where a sequence starts (h0[n], or 0 where the
    state resets), zero elsewhere.  The reference's formulation only: the kernels read h0 at the
    start tokens.  A where, not a product: an ignored h0 (a reset start) leaves no trace, not
    even a NaN of 0 * inf, and takes no gradient."""
    if initial_state is None:
        return torch.zeros(*seqs.starts.shape, width, device=seqs.starts.device, dtype=dtype)
    taken = seqs.starts if resets is None else seqs.starts & ~resets
    h0 = initial_state.to(dtype)[seqs.index]
    return torch.where(taken[..., None], h0, torch.zeros((), dtype=dtype, device=h0.device))


def final_states(h: torch.Tensor, seqs: Sequences) -> torch.Tensor:
    """[N, D]: h at each sequence's last token, in sequence order."""
    return h[seqs.ends]


def reset_tokens(seqs: Sequences, initial_state: torch.Tensor | None,
                 resets: torch.Tensor | None = None) -> torch.Tensor:
    """[B, L] bool: where the state resets: every start unless an initial state enters it, and
    every token of the mask."""
    implied = seqs.starts if initial_state is None else torch.zeros_like(seqs.starts)
    return implied if resets is None else implied | resets


def scan_sequences(x, scan_inputs, scan: str, initial_state=None, cu_seqlens=None, resets=None):
    """(h, sequences) of a reference: scan_inputs(reset) gives (log a, a, u) for the resets
    that the sequences and the mask imply; the scan then replaces the state entering every start
    and every reset (by h0, or by 0 where the state resets)."""
    from .recurrence import run_scan
    batch, length, width = x.shape
    seqs = layout(batch, length, x.device, cu_seqlens)
    _, a, u = scan_inputs(reset_tokens(seqs, initial_state, resets))
    replaced = seqs.starts if resets is None else seqs.starts | resets
    entering = dense_entering_state(seqs, initial_state, width, u.dtype, resets)
    h = run_scan(a, u, scan, replaced, entering)
    return h, seqs


def with_final_state(y, h, seqs: Sequences, output_final_state: bool):
    """y, or (y, the final states in the carry dtype) when asked for."""
    return (y, final_states(h, seqs)) if output_final_state else y

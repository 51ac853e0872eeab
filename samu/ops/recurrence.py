"""The recurrence both mixers share, in pure PyTorch (SPEC section 2).

h_t = a_t * h_{t-1} + u_t with h_{-1} = 0, in two formulations that check each other:

* ``scan_sequential``: one step per token.  In float64 it is the oracle.
* ``scan_chunked``: chunks of C tokens are scanned in parallel (a sequential loop over the
  C positions, vectorised over every chunk), then chunk carries are composed with the identity
  h_t = local_t + (prod_{s <= t in chunk} a_s) * h_in.  C is the power of two with
  sqrt(L) <= C < 2 sqrt(L): 2C Python steps, and under torch.compile's symbolic lengths one
  graph serves every length between two powers of four.

Where a sequence starts (``starts``, [B, L] bool; samu.ops.layout), the state entering the token
is replaced by ``entering`` (h0, or 0 where the state resets).  The sequential scan does exactly
that; the chunked scan folds it into the inputs instead, a_s -> 0 and u_s -> u_s + a_s entering_s,
so that its chunks and carries are those of a scan from zero.

and the pieces of the hand-derived backward that both mixers use (``reverse_scan``, ``dlog_a``).
"""
from __future__ import annotations

import math

import torch


GATE_SCALE = 8.0  # the constant c in log a = -c * gate * softplus(a_param)

SQRT_GRAD_FLOOR = 1e-6  # d sqrt(v)/dv = 1/sqrt(max(4v, 1e-6)): capped at 1000


def bounded_sqrt(v: torch.Tensor) -> torch.Tensor:
    """sqrt(v), with recurrentgemma's bounded derivative 1/sqrt(max(4v, SQRT_GRAD_FLOOR)).

    The value is sqrt(v) exactly: sqrt(v) plus a zero, f - f.detach(), whose derivative is the
    bounded one (f is sqrt above the floor and a line below it).  Plain differentiable ops, not an
    autograd.Function, so that double backward, torch.func (vmap, grad, jvp) and torch.compile
    all take it as it is: Dynamo does not trace a Function with a custom jvp, and forward-mode AD
    needs one."""
    floor = SQRT_GRAD_FLOOR / 4.0
    # clamp keeps sqrt's derivative finite where torch.where takes the line instead
    f = torch.where(v >= floor, torch.sqrt(torch.clamp(v, min=floor)),
                    v / math.sqrt(SQRT_GRAD_FLOOR))
    return torch.sqrt(v).detach() + (f - f.detach())


class BoundedSqrt:
    """bounded_sqrt under the autograd.Function spelling ``BoundedSqrt.apply(v)``, which the
    derivation notebook uses."""
    apply = staticmethod(bounded_sqrt)


def bounded_sqrt_denominator(v: torch.Tensor) -> torch.Tensor:
    """1 / this is bounded_sqrt's derivative: sqrt(max(4v, SQRT_GRAD_FLOOR))."""
    return torch.sqrt(torch.clamp(4.0 * v, min=SQRT_GRAD_FLOOR))


# A slice's log-decay sum (the mixers' log_decay) runs over chunks of tokens of at most this many
# elements, so that its gates never take a [B, L, D] buffer of the carry dtype.
LOG_DECAY_CHUNK_ELEMENTS = 2**24


def token_chunks(x: torch.Tensor):
    """x's tokens in runs of at most LOG_DECAY_CHUNK_ELEMENTS elements."""
    step = max(1, LOG_DECAY_CHUNK_ELEMENTS // (x.shape[0] * x.shape[2]))
    for t in range(0, x.shape[1], step):
        yield x[:, t:t + step]


def carry_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def first_token(log_a: torch.Tensor) -> torch.Tensor:
    """[B, L] bool, true at t = 0: where an unpacked sequence without initial state resets."""
    reset = torch.zeros(log_a.shape[:2], dtype=torch.bool, device=log_a.device)
    reset[:, 0] = True
    return reset


def transition(log_a: torch.Tensor, reset: torch.Tensor | None = None):
    """a and m = sqrt(1 - a^2) from log a, [B, L, D]; m = 1 where the state resets (``reset``,
    [B, L] bool; t = 0 by default)."""
    reset = first_token(log_a) if reset is None else reset
    a = torch.exp(log_a)
    m = bounded_sqrt(-torch.expm1(2.0 * log_a))
    m = torch.where(reset[..., None], torch.ones_like(m), m)
    return a, m


def scan_sequential(a: torch.Tensor, u: torch.Tensor, starts: torch.Tensor | None = None,
                    entering: torch.Tensor | None = None) -> torch.Tensor:
    """h_t = a_t h_{t-1} + u_t, h_{-1} = 0, one token at a time; at starts, h_{t-1} is replaced
    by entering."""
    h = torch.zeros_like(u[:, 0])
    out = []
    # Tokens taken by unbind, not a[:, t]: a slice's backward writes a zero tensor of the full
    # size per token (L^2 work in all), unbind's writes one stack of the gradients.
    a_t, u_t = a.unbind(1), u.unbind(1)
    if starts is not None:
        starts_t, entering_t = starts.unbind(1), entering.unbind(1)
    for t in range(u.shape[1]):
        if starts is not None:
            h = torch.where(starts_t[t][:, None], entering_t[t], h)
        h = a_t[t] * h + u_t[t]
        out.append(h)
    return torch.stack(out, dim=1)


def fold_starts(a, u, starts, entering):
    """The starts folded into the inputs: a_s -> 0 and u_s -> u_s + a_s entering_s."""
    if starts is None:
        return a, u
    s = starts[..., None]
    return torch.where(s, torch.zeros_like(a), a), u + torch.where(s, a * entering,
                                                                  torch.zeros_like(u))


def default_chunk(length: int) -> int:
    """The smallest power of two c with c * c >= length: about sqrt(length), found by integer
    comparisons alone, so that it works on torch.compile's symbolic lengths too.  There it is a
    constant of the graph, guarded by the length's range: one graph serves 4^k < L <= 4^(k+1)."""
    chunk = 1
    while chunk * chunk < length:
        chunk *= 2
    return chunk


def eager_chunk(length: int) -> int:
    """ceil(sqrt(length)): the eager scan's chunk, about 2 sqrt(L) Python steps in all."""
    return max(1, math.isqrt(max(length - 1, 0)) + 1)


def scan_chunked(a: torch.Tensor, u: torch.Tensor, starts: torch.Tensor | None = None,
                 entering: torch.Tensor | None = None, chunk: int | None = None) -> torch.Tensor:
    """The same scan, chunk-parallel: local scans of every chunk at once, then the carries.
    With the default chunk both Python loops run over it, never over a count that follows the
    length, so that under torch.compile's symbolic lengths the graph holds for the chunk's range
    of lengths."""
    a, u = fold_starts(a, u, starts, entering)
    batch, length, width = u.shape
    compiling = torch.compiler.is_compiling()
    # Eager, the smallest chunk of at least sqrt(L) tokens: the fewest Python steps.
    chunk = chunk or (default_chunk(length) if compiling else eager_chunk(length))
    n_chunks = -(-length // chunk)
    padded = n_chunks * chunk
    a4 = extended(a, padded, 1.0).reshape(batch, n_chunks, chunk, width)
    u4 = extended(u, padded, 0.0).reshape(batch, n_chunks, chunk, width)
    h = torch.zeros_like(u4[:, :, 0])
    product = torch.ones_like(h)
    local, decay = [], []
    # Positions taken by unbind, not a4[:, :, c], so that the backward stays linear in L (see
    # scan_sequential); the decay from the chunk's start to t multiplied in the same loop, not
    # by torch.cumprod, whose backward (torch 2.11) does chunk^2 work per chunk.
    # A decay of exactly 0 (a start folded in) cuts by selection, not by a product: 0 * NaN is
    # NaN, and a NaN or infinity before a cut would cross it (the sequential scan selects too).
    for a_c, u_c in zip(a4.unbind(2), u4.unbind(2)):
        cut = a_c == 0
        h = torch.where(cut, u_c, a_c * h + u_c)
        product = torch.where(cut, 0.0, product * a_c)
        local.append(h)
        decay.append(product)
    local = torch.stack(local, dim=2)
    decay = torch.stack(decay, dim=2)
    # The carry loop runs over `chunk` chunk summaries, not n_chunks, which follows a symbolic
    # length; the default chunk is at least the number of chunks.
    steps = chunk if compiling and n_chunks <= chunk else n_chunks
    chunk_decay = extended(decay[:, :, -1], steps, 1.0)
    chunk_end = extended(local[:, :, -1], steps, 0.0)
    carry = torch.zeros_like(u4[:, 0, 0])
    carries = []
    for decay_k, end_k in zip(chunk_decay.unbind(1), chunk_end.unbind(1)):
        carries.append(carry)
        carry = torch.where(decay_k == 0, end_k, decay_k * carry + end_k)
    carries = leading(torch.stack(carries, dim=1), n_chunks)
    h = torch.where(decay == 0, local, local + decay * carries[:, :, None])
    return leading(h.reshape(batch, padded, width), length)


def extended(t: torch.Tensor, count, value: float) -> torch.Tensor:
    """t filled up to count entries along dim 1 with value: a = 1, u = 0 after the end leave the
    scan before them untouched."""
    if torch.compiler.is_compiling():
        # A gather, not a cat and slices: a view's strides, or a pad of size 0 or 1, would make
        # the pad's size a guard of the graph, forward or backward.
        positions = torch.arange(count, device=t.device)
        taken = t.index_select(1, positions.clamp(max=t.shape[1] - 1))
        return torch.where((positions < t.shape[1])[None, :, None], taken, value)
    if count == t.shape[1]:
        return t
    return torch.cat([t, t.new_full((t.shape[0], count - t.shape[1], t.shape[2]), value)], dim=1)


def leading(t: torch.Tensor, count) -> torch.Tensor:
    """t[:, :count]: compiled, a gather, for the reason given in extended."""
    if torch.compiler.is_compiling():
        return t.index_select(1, torch.arange(count, device=t.device))
    return t[:, :count]


SCANS = {"sequential": scan_sequential, "chunked": scan_chunked}


def run_scan(a, u, scan: str, starts=None, entering=None):
    try:
        fn = SCANS[scan]
    except KeyError:
        raise ValueError(f"unknown scan {scan!r}; choose one of {sorted(SCANS)}") from None
    return fn(a, u, starts, entering)


def reverse_scan(a: torch.Tensor, dy: torch.Tensor, scan: str = "sequential",
                 starts: torch.Tensor | None = None) -> torch.Tensor:
    """dh_t = dy_t + a_{t+1} dh_{t+1}: the forward scan run on the time-reversed sequence.
    Nothing crosses a start backwards: a_{t+1} counts as 0 where t + 1 starts a sequence."""
    if starts is not None:
        a = torch.where(starts[..., None], torch.zeros_like(a), a)
    a_next = torch.cat([a[:, 1:], torch.ones_like(a[:, :1])], dim=1)
    return SCANS[scan](a_next.flip(1), dy.flip(1)).flip(1)


def dlog_a(log_a, a, h, u, dh, gate_x, reset: torch.Tensor | None = None):
    """Gradient reaching log a through a_t h_{t-1} and through m_t (none where the state resets:
    t = 0 by default).  h - u is a_t h_{t-1}, with h_{t-1} the entering state at a start."""
    reset = first_token(log_a) if reset is None else reset
    dm_dlog_a = -2.0 * a * a / bounded_sqrt_denominator(-torch.expm1(2.0 * log_a))
    dm_dlog_a = torch.where(reset[..., None], torch.zeros_like(dm_dlog_a), dm_dlog_a)
    return dh * (h - u) + dh * gate_x * dm_dlog_a

"""Context parallelism: one sequence split across the ranks of a torch.distributed group
(SPEC section 3, "Context parallelism").

Rank r holds the contiguous slice x_r [B, L_r, D] of the sequence (slices in rank order, any
lengths of at least one token) and calls the mixer with ``cp_context=build_cp_context(...)``.
Both mixers run h_t = a_t h_{t-1} + u_t per channel, so the state leaving a slice is affine in
the state entering it:

    h_out_r = A_r * h_in_r + hloc_r,

A_r the product of a over the slice (0 where a sequence starts inside it: nothing crosses a
start) and hloc_r the state at the slice end from a zero entering state.  Each boundary carries
one row per batch row, or one sequence of a packed row: the "rows" below are B unpacked, 1
packed.

Forward, with no serial chain across ranks:

1. each rank computes its summary (A_r, hloc_r).  On a Triton backend: the forward's summary
   kernel and carry alone (``slice_summary`` of the kernel module: x read once, no y; A_r from
   the same gates), over the slice from a zero state, or where a sequence starts inside it over
   its last piece from that start.  On a reference backend hloc_r by the mixer under no_grad
   with ``output_final_state=True`` over the same tokens, and A_r = exp(sum of log a) from the
   gates in PyTorch (``log_decay``, the reference's formula; only where no sequence starts in
   the slice);
2. one all_gather of the summaries; every rank composes its own entering state in closed form,
   h_in_r = sum_{j<r} (prod_{j<k<r} A_k) hloc_j (a rank where a sequence starts has A = 0 and
   its initial-state rows already in hloc);
3. the slice runs with that entering state, keeping its autograd graph.

Backward (``_SliceWithCarry``), the same in reverse for the adjoint:

1. mu_r = d<dy_r, y_r> / d h_in_r (with the cotangents of the states this rank returns, but
   none from later ranks), over the slice's first piece: on a Triton backend the backward's
   reverse summary and reverse carry alone (``start_adjoint``: x and dy read once); otherwise
   a backward through a recomputed forward, with only the entering state requiring grad;
2. one all_gather of mu; g_r = sum_{k>r} (prod_{r<j<k} A_j) mu_k, the cotangent that later
   ranks put on this slice's end state;
3. the slice's backward through the kept graph, with g_r added to its end state's cotangent:
   dx, this rank's parameter gradients and its initial-state rows.

Cost per rank against one single-GPU call on the same slice, on a Triton backend whose family
has a SliceRun (``slice_runner``), where the slice is unpacked or carries one packed sequence
through: two chunk carries (and RG-LRU's chunk-0 decay), since the forward reuses the
summary pass and the backward hands mu out mid-way (step 1 of the backward is then its own
reverse summary and carry; a slice where the sequence starts runs from its initial-state rows,
or resets at its first token without them, and publishes A = 0 and its end state).  Elsewhere on
a Triton backend: in the forward one summary pass (the gates and one read of x, of the last
piece only where a sequence starts in the slice; none where the slice ends at a sequence end),
in the backward one adjoint pass over the first piece (the gates, x and dy read once; none on a
rank that starts at a sequence start).  On a reference backend the summary is
a forward and the log-decay sum (SAMU: an FP32 copy of x and one D-wide dot per token; RG-LRU:
the a-gate's block-diagonal product; in chunks of 2^24 elements), and the adjoint a forward and
a backward.  Collectives: in the forward an all_gather of 15 int64 (every rank's checks' verdict
and what gives its summary its meaning, so that a bad or mismatched call fails on every rank
before any summary is combined; a host sync) and one of 2 x rows x D values of the carry dtype
(8 rows D bytes per rank in FP32), in the backward one of rows x D + 1 (4 rows D bytes).  Peak
memory: the slice's saved activations, and while a pass runs its FP32 chunk summaries and
per-token gates (SAMU's r and g; RG-LRU's gate products of one head group).

A reset mask comes in slices too, each rank's [B, L_r] (``resets=``): a row of a slice that holds
a reset has A_r = 0, and the slice runs and takes its adjoint with its mask, through the generic
phases (calls and autograd: the SliceRuns and the kernels' summary phases take no mask).

Parameter gradients are each rank's share (its slice's terms): the full gradient is their sum
over the group, as data parallelism sums them (an all_reduce; DDP's average over equal slices
of a loss that is each rank's mean).  Every rank must run the backward of every
context-parallel call, in the same order, as with any collective; where data parallelism runs
over the same ranks, give context parallelism a group of its own.
"""
from __future__ import annotations

import bisect
import dataclasses
import functools
import hashlib
import operator
from collections.abc import Mapping
from typing import NamedTuple

import torch
import torch.distributed as dist

from . import backends, dispatch, mixers
from .checks import (SUPPORTED_DTYPES, autocast_input, capturing, check_call, check_flag,
                     check_offsets_increase, check_resets, check_takes_resets, check_tensors,
                     cp_context_error, resolve_backend)
from .functional import FUNCTIONS
from .ops.recurrence import carry_dtype

__all__ = ["CPContext", "SliceCall", "SliceLayout", "build_cp_context", "context_parallel",
           "log_decay", "slice_layout", "slice_runner", "slice_summary", "incoming_state",
           "run_slice", "run_with_carry", "head_adjoint", "outgoing_cotangent",
           "with_end_cotangent"]

# One row of the call's metadata, all_gathered before anything else (positions in the row):
# every property that changes what a summary means is agreed before any is combined.
_STATUS, _RANK, _PACKED, _CU_COUNT, _CU_DIGEST, _SLICES_DIGEST, _MIXER_DIGEST, _HEADS, \
    _BATCH, _LENGTH, _WIDTH, _DTYPE, _SUMMARY_DTYPE, _HAS_INITIAL, _NEEDS_GRAD = range(15)
_META_FIELDS = 15


def _digest(value) -> int:
    """A 63-bit BLAKE2b digest of ``repr(value)`` (None, ints, strings and tuples of them):
    equal on two ranks when the values are, and unequal otherwise but for a 2^-63 chance (a
    weighted sum of offsets would collide: [0, 1, 4, 6, 10] and [0, 3, 4, 5, 10])."""
    data = hashlib.blake2b(repr(value).encode(), digest_size=8).digest()
    return int.from_bytes(data, "little") >> 1


def _dtype_code(dtype) -> int:
    return SUPPORTED_DTYPES.index(dtype) if dtype in SUPPORTED_DTYPES else -1


def _shortened(values, limit: int = 12) -> str:
    """A list for an error message, its middle elided past ``limit`` entries."""
    values = list(values)
    if len(values) <= limit:
        return str(values)
    return (f"[{', '.join(map(str, values[:limit // 2]))}, ... "
            f"{', '.join(map(str, values[-limit // 2:]))}] ({len(values)} values)")


_MESSAGE_LIMIT = 2000  # characters of one rank's error text shared with the others


def _raise_for_failures(group, world_size: int, failed, error, prefix: str):
    """Raises on every rank of the group the errors of the ``failed`` ranks (a collective: every
    rank calls it with the same ``failed``).  TypeError where every failure is one, else
    ValueError; chained to this rank's own ``error``."""
    mine = None if error is None else (type(error).__name__, str(error)[:_MESSAGE_LIMIT])
    shared = [None] * world_size
    dist.all_gather_object(shared, mine, group=group)
    kind = TypeError if all(shared[k][0] == "TypeError" for k in failed) else ValueError
    raise kind(prefix + "; ".join(f"rank {k}: {shared[k][0]}: {shared[k][1]}"
                                  for k in failed)) from error


class SliceLayout(NamedTuple):
    """Where one rank's slice lies among the sequences.

    Unpacked, every batch row is one sequence that starts on rank 0.  Packed, the slice holds
    the pieces of global sequences ``first_sequence`` .. ``last_sequence``, at the local
    offsets ``piece_offsets`` (the slice's own cu_seqlens)."""
    rank: int
    world_size: int
    length: int
    start: int | None  # the slice's first token in the global sequence (None: not known)
    piece_offsets: tuple[int, ...] | None
    first_sequence: int | None
    continued: bool  # the slice starts inside a sequence that started on an earlier rank
    continues: bool  # its last sequence goes on past the slice's end

    @property
    def packed(self) -> bool:
        return self.piece_offsets is not None

    @property
    def last_sequence(self) -> int | None:
        return None if not self.packed else self.first_sequence + len(self.piece_offsets) - 2

    @property
    def head(self) -> int:
        """Tokens of the continued piece (0 where the slice starts at a sequence start)."""
        if not self.continued:
            return 0
        return self.length if not self.packed else self.piece_offsets[1]

    @property
    def carries_through(self) -> bool:
        """No sequence starts in the slice: its end state depends on its entering state."""
        return self.continued and self.head == self.length

    @property
    def rows(self) -> int | None:
        """Rows crossing a boundary: 1 packed, the batch unpacked (None: not known here)."""
        return 1 if self.packed else None


def slice_layout(rank: int, slice_lengths, sequence_offsets=None) -> SliceLayout:
    """The layout of ``rank``'s slice.  ``slice_lengths``: every rank's length (unpacked, only
    this rank's is read, and None gives an unknown start); ``sequence_offsets``: the global
    cu_seqlens as ints, or None when unpacked."""
    world = len(slice_lengths)
    if sequence_offsets is None:
        before = slice_lengths[:rank]
        start = None if None in before else sum(before)
        return SliceLayout(rank, world, slice_lengths[rank], start, None, None, rank > 0,
                           rank < world - 1)
    start = sum(slice_lengths[:rank])
    length = slice_lengths[rank]
    end = start + length
    cu = sequence_offsets
    first = bisect.bisect_right(cu, start) - 1  # the sequence holding the slice's first token
    last = bisect.bisect_right(cu, end - 1) - 1  # and its last
    pieces = (0,) + tuple(c - start for c in cu[first + 1:last + 1]) + (length,)
    return SliceLayout(rank, world, length, start, pieces, first, cu[first] < start,
                       cu[last + 1] > end)


@dataclasses.dataclass(frozen=True, eq=False)
class CPContext:
    """What a context-parallel call needs to know about the split (``build_cp_context``).

    Attributes:
        group: the process group (None: the default group).
        rank, world_size: this rank's position in the group and the group's size.
        cu_seqlens: the GLOBAL offsets of packed sequences (before the split), or None.
        slice_lengths: every rank's slice length, in rank order (None unpacked when they are
            taken from each call's inputs).
        sequence_offsets: ``cu_seqlens`` as a tuple of ints.
    """
    group: object
    rank: int
    world_size: int
    cu_seqlens: torch.Tensor | None
    slice_lengths: tuple[int, ...] | None
    sequence_offsets: tuple[int, ...] | None

    @property
    def packed(self) -> bool:
        return self.sequence_offsets is not None

    @functools.cached_property
    def digests(self) -> tuple[int, int]:
        """(of the global offsets, of the slice lengths): what every call's agreement compares,
        computed once per context."""
        return _digest(self.sequence_offsets), _digest(self.slice_lengths)

    @property
    def layout(self) -> SliceLayout:
        """This rank's SliceLayout (for an unpacked context without slice lengths, its start
        and length are unknown)."""
        lengths = self.slice_lengths or (None,) * self.world_size
        return slice_layout(self.rank, lengths, self.sequence_offsets)

    @property
    def local_cu_seqlens(self) -> torch.Tensor | None:
        """This rank's cu_seqlens: its pieces of the packed sequences, on the global offsets'
        device and in their dtype (None unpacked)."""
        if not self.packed:
            return None
        return torch.tensor(self.layout.piece_offsets, dtype=self.cu_seqlens.dtype,
                            device=self.cu_seqlens.device)

    @property
    def sequence_ids(self) -> range | None:
        """The global ids of the sequences with a piece in this slice, in order: the rows of
        the state this rank returns and of the initial state it reads (None unpacked)."""
        lay = self.layout
        return None if not self.packed else range(lay.first_sequence, lay.last_sequence + 1)

    @property
    def continues_from_previous(self) -> bool:
        """Whether the slice's first token continues a sequence from the previous rank."""
        return self.layout.continued

    @property
    def continues_to_next(self) -> bool:
        """Whether the slice's last sequence goes on on the next rank: then the last row of
        the returned state is the state at the slice end, not a final state."""
        return self.layout.continues

    def mix(self, mixer: str, x, params, **keywords):
        """The mixer over this split (context_parallel): what a functional form's call with
        ``cp_context=self`` runs (samu.checks.SplitContext)."""
        return context_parallel(mixer, x, params, cp_context=self, **keywords)


def _comm_device(group, device: torch.device) -> torch.device:
    """Where collectives' tensors live: on the GPU for NCCL, on the host for gloo."""
    backend = str(dist.get_backend(group))
    if "nccl" in backend and (device.type == "cuda" or "gloo" not in backend):
        return device if device.type == "cuda" else torch.device("cuda",
                                                                 torch.cuda.current_device())
    return torch.device("cpu") if "gloo" in backend else device


def _all_gather(group, tensor: torch.Tensor, world_size: int) -> torch.Tensor:
    """[world_size, *tensor.shape]: every rank's tensor, in rank order."""
    out = [torch.empty_like(tensor) for _ in range(world_size)]
    dist.all_gather(out, tensor.contiguous(), group=group)
    return torch.stack(out)


def _integers(name: str, values) -> tuple[int, ...]:
    """``values`` (a 1-D int tensor or a sequence of integers) as a tuple of ints; TypeError
    naming the first value that is no integer (a float is refused, not truncated)."""
    if isinstance(values, torch.Tensor):
        if values.dtype not in (torch.int32, torch.int64) or values.dim() != 1:
            raise TypeError(f"build_cp_context: {name} must be a 1-D int32 or int64 tensor, "
                            f"got {values.dtype} of shape {tuple(values.shape)}")
        return tuple(int(c) for c in values.tolist())
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"build_cp_context: {name} must be a 1-D int tensor or a sequence of "
                        f"ints, got {type(values).__name__}")
    out = []
    for position, value in enumerate(values):
        try:
            if isinstance(value, bool):
                raise TypeError
            out.append(operator.index(value))
        except TypeError:
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
            raise TypeError(f"build_cp_context: {name} must hold integers, got "
                            f"{type(value).__name__} {shown} at position {position}") from None
    return tuple(out)


def _as_offsets(cu_seqlens) -> tuple[int, ...]:
    offsets = _integers("cu_seqlens", cu_seqlens)
    if len(offsets) < 2 or offsets[0] != 0:
        raise ValueError("build_cp_context: cu_seqlens must be [0, l_0, l_0 + l_1, ..., L] with "
                         f"at least one sequence, got {_shortened(offsets)}")
    check_offsets_increase("build_cp_context", offsets)
    return offsets


def _build_arguments(world: int, cu_seqlens, local_length, slice_lengths):
    """(offsets, local_length, slice_lengths) checked as one rank can alone."""
    if local_length is not None and slice_lengths is not None:
        raise ValueError("build_cp_context: pass local_length or slice_lengths, not both")
    offsets = None if cu_seqlens is None else _as_offsets(cu_seqlens)
    if local_length is not None and (isinstance(local_length, bool)
                                     or not isinstance(local_length, int)):
        raise TypeError(f"build_cp_context: local_length must be an int, got "
                        f"{type(local_length).__name__}")
    if local_length is not None and not 1 <= local_length < 2**62:
        raise ValueError(f"build_cp_context: local_length must be at least 1 token, got "
                         f"{local_length}")
    if slice_lengths is not None:
        slice_lengths = _integers("slice_lengths", slice_lengths)
        if len(slice_lengths) != world:
            raise ValueError(f"build_cp_context: slice_lengths has {len(slice_lengths)} entries "
                             f"for a group of {world} ranks")
    return offsets, local_length, slice_lengths


# The row build_cp_context all_gathers (positions).
_BUILD_STATUS, _BUILD_LOCAL, _BUILD_LENGTH, _BUILD_OFFSETS, _BUILD_SLICES = range(5)


def build_cp_context(group=None, cu_seqlens=None, *, local_length: int | None = None,
                     slice_lengths=None) -> CPContext:
    """The context of a context-parallel call, built once per split on every rank of ``group``.

    Args:
        group: the torch.distributed process group whose ranks hold the slices, in rank order
            (None: the default group, which must be initialised).
        cu_seqlens: packed sequences (batch 1): the GLOBAL offsets [0, ..., L] before the
            split, as in FlashAttention (a 1-D int tensor or a sequence of ints; the same on
            every rank).  Each rank derives its local offsets and the sequences that cross its
            boundaries; the mixer call then takes no cu_seqlens of its own.
        local_length: this rank's slice length.
        slice_lengths: every rank's slice length in rank order (ints), the same on every rank
            (instead of local_length).

    Without either length: packed, the global length split evenly (it must divide); unpacked,
    each call takes the lengths of its inputs, any of at least one token.

    One all_gather of a few int64 (a host sync) shares every rank's arguments' checks and
    digests: the same ValueError or TypeError is raised on every rank for offsets that are not
    integers increasing from 0, lengths that are not integers of at least 1 or do not sum to
    the offsets' last value, both length arguments, or ranks that disagree on the offsets, on
    the slice lengths or on which length argument they pass.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("build_cp_context: torch.distributed is not initialised "
                           "(call torch.distributed.init_process_group first)")
    rank = dist.get_rank(group)
    world = dist.get_world_size(group)
    error, offsets = None, None
    row = [0] * 5
    try:
        offsets, local_length, slice_lengths = _build_arguments(world, cu_seqlens, local_length,
                                                                slice_lengths)
        row[_BUILD_LOCAL] = int(local_length is not None)
        row[_BUILD_LENGTH] = local_length if local_length is not None else 0
        row[_BUILD_OFFSETS] = _digest(offsets)
        row[_BUILD_SLICES] = _digest(slice_lengths)
    except Exception as exc:  # shared below: the other ranks would wait in the gather
        error, row[_BUILD_STATUS] = exc, 1
    device = (torch.device("cuda", torch.cuda.current_device())
              if torch.cuda.is_available() else torch.device("cpu"))
    mine = torch.tensor(row, dtype=torch.int64, device=_comm_device(group, device))
    table = _all_gather(group, mine, world).tolist()
    prefix = "build_cp_context: "
    failed = [k for k, r in enumerate(table) if r[_BUILD_STATUS]]
    if failed:
        _raise_for_failures(group, world, failed, error, prefix)
    for field, what in ((_BUILD_OFFSETS, "the global cu_seqlens"),
                        (_BUILD_LOCAL, "whether each passes local_length"),
                        (_BUILD_SLICES, "slice_lengths")):
        if len({r[field] for r in table}) > 1:
            shown = {_BUILD_OFFSETS: offsets, _BUILD_LOCAL: local_length is not None,
                     _BUILD_SLICES: slice_lengths}[field]
            _raise_disagreement(group, world, prefix, what, shown)
    if local_length is not None:
        slice_lengths = tuple(r[_BUILD_LENGTH] for r in table)
    elif slice_lengths is None and offsets is not None:
        if offsets[-1] % world:
            raise ValueError(f"build_cp_context: {offsets[-1]} tokens do not split evenly over "
                             f"{world} ranks; pass local_length or slice_lengths")
        slice_lengths = (offsets[-1] // world,) * world
    # Every rank holds the same lengths and offsets now: these raise on all or none.
    if slice_lengths is not None:
        if min(slice_lengths) < 1:
            raise ValueError(f"build_cp_context: every slice needs at least one token, got "
                             f"slice lengths {_shortened(slice_lengths)}")
        if offsets is not None and sum(slice_lengths) != offsets[-1]:
            raise ValueError(f"build_cp_context: cu_seqlens cover {offsets[-1]} tokens but the "
                             f"slices hold {sum(slice_lengths)} (slice lengths "
                             f"{_shortened(slice_lengths)})")
    if isinstance(cu_seqlens, torch.Tensor):
        tensor = cu_seqlens
    elif offsets is not None:
        tensor = torch.tensor(offsets, dtype=torch.int32)
    else:
        tensor = None
    return CPContext(group, rank, world, tensor, slice_lengths, offsets)


def _raise_disagreement(group, world_size: int, prefix: str, what: str, mine):
    """Raises on every rank that the ranks disagree on ``what``, with each rank's value (a
    collective: every rank calls it, having seen the same disagreement)."""
    shown = [None] * world_size
    dist.all_gather_object(shown, _shortened(mine) if isinstance(mine, tuple) else str(mine),
                           group=group)
    raise ValueError(prefix + f"the ranks disagree on {what}: "
                     + ", ".join(f"{v} on rank {k}" for k, v in enumerate(shown)))


# --- the per-mixer log decay: sum over the slice of log a, as the reference computes it -------



def log_decay(mixer: str, x, params) -> torch.Tensor:
    """sum over x's tokens of log a, [B, D] in the carry dtype: log A of a slice that no
    sequence starts in.  ``params`` in the functional form's order.  Autocast stays off, as
    for the reference: the dtypes are the reference's own."""
    spec = mixers.get(mixer)
    if spec.log_decay is None:
        raise NotImplementedError(f"{mixer}: its spec gives no log_decay (samu.mixers), which "
                                  "context parallelism needs on a reference backend")
    with torch.autocast(x.device.type, enabled=False):
        return spec.load("log_decay")(x, *params)


# --- the local pieces of the algorithm, one rank's share (also what the benchmark times) -------

def _call(mixer, x, params, backend, **state):
    """(y, states, backend name) of one library call on (part of) a slice."""
    return FUNCTIONS[mixer](x, *params, backend=backend, return_backend=True,
                            output_final_state=True, **state)


def kernel_phases(mixer: str, x, backend):
    """(kernel module, configuration) where ``backend`` resolves to a Triton backend for x:
    the module's slice_summary and start_adjoint run its kernels' phases alone, without a
    whole forward or backward.  None for a reference backend (the generic path: a call and
    autograd)."""
    chosen = dispatch.resolve(mixer, x, backend)
    if chosen.kind != "triton" or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return None
    return backends.family_of(mixer, chosen.config), chosen.config


def slice_runner(mixer: str, layout: SliceLayout, x, params, backend="auto",
                 initial_state=None, resets=None):
    """The kernel family's SliceRun over this rank's slice (its summary, forward and backward
    sharing their work), where the slice is unpacked or carries one sequence through, on a
    Triton backend whose family has one; else None (the phases run apart, as with a reset
    mask, which the SliceRuns do not take).  A slice where the sequence starts without an
    initial state resets there.  The kernels check nothing: the mixer's checks run first
    (samu.checks.check_call)."""
    if resets is not None or (layout.packed and not layout.carries_through):
        return None
    phases = kernel_phases(mixer, x, backend)
    run = None if phases is None else phases[0].SliceRun
    params = [p.detach() for p in params]
    if run is None or not run.fits(params, phases[1]):  # slice_summary checks the inputs
        return None
    check_call(mixer, x, params, backend)
    return run(x.detach(), params, phases[1],
               resets=not layout.continued and initial_state is None)


def _local_cu(layout: SliceLayout, device, begin: int = 0) -> torch.Tensor:
    """The slice's piece offsets from piece ``begin`` on, counted from that piece's start."""
    offsets = layout.piece_offsets[begin:]
    return torch.tensor([c - offsets[0] for c in offsets], dtype=torch.int32, device=device)


def _new_rows(layout: SliceLayout, initial_state):
    """The initial-state rows of the sequences that start in the slice (None without them)."""
    if initial_state is None or (layout.continued and not layout.packed):
        return None
    if not layout.packed:
        return initial_state
    first = layout.first_sequence + (1 if layout.continued else 0)
    return initial_state[first:layout.last_sequence + 1]


def runner_entering(layout: SliceLayout, entering, initial_state) -> torch.Tensor | None:
    """The state a SliceRun starts from: ``entering`` where the slice continues a sequence,
    else the initial-state rows of the sequence that starts with it (None: it resets)."""
    if layout.continued:
        return entering
    rows0 = _new_rows(layout, initial_state)
    return None if rows0 is None else rows0.detach().to(torch.float32)


def slice_summary(mixer: str, layout: SliceLayout, x, params, backend="auto",
                  initial_state=None, runner=None, resets=None) -> torch.Tensor:
    """[2, rows, D] in the carry dtype: (A, hloc) of the slice, h_out = A * h_in + hloc.  Runs
    without a graph.  Where no later rank reads it (the slice ends at a sequence end), zeros,
    after the mixer's checks (samu.checks.check_call).  ``runner``: the slice's
    slice_runner, whose summary the forward then reuses.  ``resets``: this slice's [B, L_r]
    reset mask (or None): hloc by the mixer with it, A zero in a row that holds a reset (the
    kernels' phases take no mask: the generic path runs)."""
    cdt = carry_dtype(x)
    rows = layout.rows or x.shape[0]
    zeros = x.new_zeros(rows, x.shape[2], dtype=cdt)
    with torch.no_grad():
        if runner is not None and not layout.continued and runner.resets != (
                initial_state is None):
            built, given = (("without", "with") if runner.resets else ("with", "without"))
            raise ValueError(f"slice_summary: the runner was built {built} an initial state "
                             f"and is called {given} one (slice_runner takes the same "
                             f"initial_state)")
        if runner is not None and layout.continues:
            decay, hloc = runner.summary()
            if layout.continued:
                return torch.stack([decay, hloc])
            rows0 = _new_rows(layout, initial_state)  # the sequence starts here: A = 0
            if rows0 is not None:
                hloc = hloc + decay * rows0.to(hloc.dtype)
            return torch.stack([zeros, hloc.to(cdt)])
        if not layout.continues:
            if runner is None:  # slice_runner checked them already
                check_call(mixer, x, params, backend)
            return torch.stack([zeros, zeros])
        if layout.carries_through:
            phases = kernel_phases(mixer, x, backend) if resets is None else None
            if phases is not None:  # the kernel phases check nothing: check_call does
                check_call(mixer, x, params, backend)
                module, config = phases
                decay, hloc = module.slice_summary(x, params, config)
                return torch.stack([decay, hloc])
            _, hloc, _ = _call(mixer, x, params, backend, initial_state=zeros, resets=resets)
            decay = torch.exp(log_decay(mixer, x, params))
            if resets is not None:  # nothing crosses a reset: no host sync reads the mask
                decay = torch.where(resets.any(1)[:, None], torch.zeros_like(decay), decay)
            return torch.stack([decay, hloc.to(cdt)])
        # A sequence starts in the slice: only its last piece reaches the end, from its start.
        tail = layout.piece_offsets[-2] if layout.packed else 0
        rows0 = _new_rows(layout, initial_state)
        if layout.packed and rows0 is not None:
            rows0 = rows0[-1:]
        phases = kernel_phases(mixer, x[:, tail:], backend) if resets is None else None
        if phases is not None:  # as above: the summary kernel and carry from the start
            check_call(mixer, x, params, backend)
            module, config = phases
            start = None if rows0 is None else rows0.to(torch.float32).contiguous()
            _, hloc = module.slice_summary(x[:, tail:], params, config, initial_state=start,
                                           resets=rows0 is None)
            return torch.stack([zeros, hloc.to(cdt)])
        _, hloc, _ = _call(mixer, x[:, tail:], params, backend, initial_state=rows0,
                           resets=_tokens(resets, tail))
        return torch.stack([zeros, hloc.to(cdt)])


def _tokens(resets, begin: int = 0, end: int | None = None):
    """The mask of tokens begin..end of the slice (None without one)."""
    return None if resets is None else resets[:, begin:end]


def incoming_state(summaries: torch.Tensor, rank: int) -> torch.Tensor:
    """[rows, D]: the state entering ``rank``'s slice from every earlier slice's (A, hloc)
    ([world, 2, rows, D]): h_in_r = sum_{j<r} (prod_{j<k<r} A_k) hloc_j, composed locally."""
    state = torch.zeros_like(summaries[0, 1])
    for j in range(rank):  # a slice with a cut (A = 0) starts the state again: a selection,
        decay, hloc = summaries[j, 0], summaries[j, 1]  # so that 0 * NaN cannot cross it
        state = torch.where(decay == 0, hloc, decay * state + hloc)
    return state


def outgoing_cotangent(decays: torch.Tensor, adjoints: torch.Tensor, rank: int) -> torch.Tensor:
    """[rows, D]: the cotangent that later ranks put on ``rank``'s end state, from their A_k
    and mu_k ([world, rows, D] each): g_r = sum_{k>r} (prod_{r<j<k} A_j) mu_k."""
    cotangent = torch.zeros_like(adjoints[0])
    for k in range(adjoints.shape[0] - 1, rank, -1):  # selected at a cut, as incoming_state
        cotangent = torch.where(decays[k] == 0, adjoints[k], adjoints[k] + decays[k] * cotangent)
    return cotangent


def run_slice(mixer: str, layout: SliceLayout, x, params, backend="auto", entering=None,
              initial_state=None, resets=None):
    """(y, states, backend name) of the slice: its continued piece from ``entering`` [rows, D],
    the sequences that start in it from their initial-state rows (or reset), with this slice's
    reset mask ``resets`` (or None).  ``states``: [B, D] unpacked, the state at the slice end;
    packed, one row per piece (the sequences of ``CPContext.sequence_ids``), each the state at
    its piece's end."""
    new_rows = _new_rows(layout, initial_state)
    if not layout.continued:
        cu = _local_cu(layout, x.device) if layout.packed else None
        return _call(mixer, x, params, backend, initial_state=new_rows, cu_seqlens=cu,
                     resets=resets)
    if layout.carries_through:
        return _call(mixer, x, params, backend, initial_state=entering, resets=resets)
    if new_rows is not None:  # one call: the continued piece enters its state, the rest theirs
        rows = torch.cat([entering, new_rows.to(entering.dtype)])
        return _call(mixer, x, params, backend, initial_state=rows,
                     cu_seqlens=_local_cu(layout, x.device), resets=resets)
    # Without initial states the new sequences reset, which a call with states cannot say.
    head = layout.head
    y0, s0, name0 = _call(mixer, x[:, :head], params, backend, initial_state=entering,
                          resets=_tokens(resets, 0, head))
    y1, s1, name1 = _call(mixer, x[:, head:], params, backend,
                          cu_seqlens=_local_cu(layout, x.device, begin=1),
                          resets=_tokens(resets, head))
    name = name0 if name0 == name1 else f"{name0}+{name1}"
    return torch.cat([y0, y1], dim=1), torch.cat([s0, s1]), name


def head_adjoint(mixer: str, layout: SliceLayout, x, params, backend, entering, dy,
                 dstates, resets=None) -> torch.Tensor:
    """mu [rows, D]: d<(dy, dstates), (y, states)> / d entering, through a recomputed forward
    of the continued piece (a slice that starts at a sequence start has none), with the
    slice's reset mask (then by autograd: the kernels' phases take no mask)."""
    head = layout.head
    dfinal = dstates[:1] if layout.packed else dstates
    phases = kernel_phases(mixer, x[:, :head], backend) if resets is None else None
    if phases is not None:
        module, config = phases
        with torch.no_grad():
            return module.start_adjoint(x[:, :head].detach(), [p.detach() for p in params],
                                        dy[:, :head], dfinal, config)
    with torch.enable_grad():
        state = entering.detach().requires_grad_()
        y, final, _ = _call(mixer, x[:, :head].detach(), [p.detach() for p in params], backend,
                            initial_state=state, resets=_tokens(resets, 0, head))
        (mu,) = torch.autograd.grad([y, final], [state],
                                    [dy[:, :head], dfinal.to(final.dtype)])
    return mu


def with_end_cotangent(layout: SliceLayout, dstates: torch.Tensor, cotangent) -> torch.Tensor:
    """The states' cotangent with the later ranks' one added on the slice's end state."""
    if not layout.continues:
        return dstates
    total = dstates.clone()
    total[-cotangent.shape[0]:] += cotangent.to(total.dtype)
    return total


# --- the call ----------------------------------------------------------------------------------

class SliceCall(NamedTuple):
    """What a rank's slice needs beside its tensors: ``gather`` takes this rank's tensor and
    returns every rank's stacked in rank order, [world, *shape] on its device (an all_gather;
    the benchmark passes stand-ins of the other ranks'); ``runner`` is slice_runner's or None."""
    mixer: str
    backend: object
    layout: SliceLayout
    gather: object
    decays: torch.Tensor  # [world, rows, D]: every rank's A, for the backward
    runner: object
    names: list  # the backend that ran, filled by the forward
    resets: torch.Tensor | None = None  # this slice's reset mask


def _gatherer(group, world_size: int, comm_device, device):
    def gather(tensor):
        return _all_gather(group, tensor.to(comm_device), world_size).to(device)
    return gather


def _backend_name(mixer: str, x, backend) -> str:
    return dispatch.resolve(mixer, x, backend).name


class _DoubleBackward(RuntimeError):
    """A backward run with create_graph=True: its gradients would have to be differentiated
    through the exchange between ranks, which is not differentiable."""


def _double_backward(mixer: str) -> _DoubleBackward:
    return _DoubleBackward(
        f"{mixer} (context parallel): a double backward (create_graph=True, e.g. a gradient "
        "penalty) is not supported through a context-parallel call: the adjoints exchanged "
        "between ranks are not differentiable; take second derivatives without cp_context")


# The failure flag of the adjoint packet: what went wrong on a rank.
_FAILED, _CREATE_GRAPH = 1, 2


def _exchange_adjoints(call: SliceCall, mu, failure, gathered_once=None) -> torch.Tensor:
    """The cotangent that later ranks put on this slice's end state, from every rank's mu (one
    gather); raises on every rank where one rank's adjoint failed or was refused.
    ``gathered_once``: a list that records that the gather took place (then no rank waits for
    this one any more)."""
    code = 0 if failure is None else (
        _CREATE_GRAPH if isinstance(failure, _DoubleBackward) else _FAILED)
    # The flag by a fill, not a copy from the host: a CUDA graph can capture it.
    flag = torch.full((1,), float(code), dtype=mu.dtype, device=mu.device)
    packet = torch.cat([mu.flatten(), flag])
    gathered = call.gather(packet)
    if gathered_once is not None:
        gathered_once.append(True)
    # Read on the host, which a CUDA graph's capture (the benchmark's GPU time) cannot do.
    codes = [] if capturing(gathered) else [int(c) for c in gathered[:, -1].tolist()]
    refused = [k for k, c in enumerate(codes) if c == _CREATE_GRAPH]
    if refused:
        raise RuntimeError(str(_double_backward(call.mixer))
                           + f" (asked on rank(s) {refused})") from failure
    failed = [k for k, c in enumerate(codes) if c]
    if failed:
        here = "" if failure is None else f" (here: {type(failure).__name__}: {failure})"
        raise RuntimeError(f"{call.mixer} (context parallel): the backward's adjoint failed "
                           f"on rank(s) {failed}{here}") from failure
    adjoints = gathered[:, :-1].reshape(gathered.shape[0], *mu.shape)
    return outgoing_cotangent(call.decays.to(mu.device), adjoints, call.layout.rank)


def _autocast_state(device_type: str):
    return (torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type))


def _keeps_graph() -> bool:
    """Whether the running backward keeps the graph (retain_graph=True): then this one is not
    the last through it.  Autograd's own flag, as torch's compiled functions read it; without
    it, the graph goes after the first backward."""
    flag = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return bool(flag()) if flag is not None else False


class _SliceWithCarry(torch.autograd.Function):
    """The slice's forward from its entering state (graph kept), and the backward of
    the module docstring: the adjoint at the slice start, one all_gather, the slice's backward
    with the later ranks' cotangent on its end state.

    A backward with retain_graph=True keeps what the next needs: the slice's graph on a
    reference backend; a SliceRun's phases consume their saved work, so the next backward
    runs the slice's summary and forward again first.  create_graph=True is refused on every
    rank (_double_backward)."""

    @staticmethod
    def forward(ctx, call: SliceCall, entering, x, initial_state, *params):
        needs = ctx.needs_input_grad
        ctx.call = call
        if call.runner is not None:  # the kernels' phases, no graph: the runner keeps theirs
            ctx.start = runner_entering(call.layout, entering, initial_state)
            y, states = call.runner.forward(ctx.start)
            ctx.phases_spent = False  # a backward consumes the runner's saved work
            call.names.append(_backend_name(call.mixer, x, call.backend))
            ctx.initial_state = (None if initial_state is None
                                 else (initial_state.shape, initial_state.dtype))
            # Saved, though the runner holds them (and h0 where the slice starts from it):
            # autograd then refuses a backward after an in-place change to them instead of
            # using the changed values.
            starts_from_h0 = not call.layout.continued and initial_state is not None
            ctx.save_for_backward(x, *params, *([initial_state] if starts_from_h0 else []))
            return y, states
        with torch.enable_grad():
            x_leaf = x.detach().requires_grad_(needs[2])
            h0_leaf = (None if initial_state is None
                       else initial_state.detach().requires_grad_(needs[3]))
            p_leaves = [p.detach().requires_grad_(n) for p, n in zip(params, needs[4:])]
            y, states, name = run_slice(call.mixer, call.layout, x_leaf, p_leaves, call.backend,
                                        entering, h0_leaf, call.resets)
        call.names.append(name)
        ctx.entering = entering
        ctx.graph = (y, states)
        ctx.leaves = (x_leaf, h0_leaf, p_leaves)
        ctx.autocast = _autocast_state(x.device.type)
        return y.detach(), states.detach()

    @staticmethod
    def backward(ctx, dy, dstates):
        # The engine runs a backward in grad mode only with create_graph=True.
        refusal = _double_backward(ctx.call.mixer) if torch.is_grad_enabled() else None
        keep = _keeps_graph()
        with torch.no_grad():
            if ctx.call.runner is not None:
                grads = _SliceWithCarry._runner_backward(ctx, dy, dstates, refusal, keep)
            else:
                grads = _SliceWithCarry._graph_backward(ctx, dy, dstates, refusal, keep)
        return (None, None, *grads)

    @staticmethod
    def _graph_backward(ctx, dy, dstates, refusal, keep):
        """(dx, d initial_state, *d params) through the slice's kept graph."""
        call = ctx.call
        x_leaf, h0_leaf, p_leaves = ctx.leaves
        device = x_leaf.device
        enabled, dtype = ctx.autocast
        failure = None
        try:
            if refusal is not None:
                raise refusal
            if ctx.graph is None:
                raise RuntimeError("the slice's graph was freed by an earlier backward: pass "
                                   "retain_graph=True to every backward through it but the "
                                   "last")
            if not call.layout.continued:  # nothing enters the slice: no adjoint to send
                mu = torch.zeros_like(call.decays[0])
            else:
                with torch.autocast(device.type, dtype=dtype, enabled=enabled):
                    mu = head_adjoint(call.mixer, call.layout, x_leaf, p_leaves, call.backend,
                                      ctx.entering, dy, dstates, call.resets)
        except Exception as exc:  # reported to every rank instead of leaving them waiting
            mu, failure = torch.zeros_like(call.decays[0]), exc
        cotangent = _exchange_adjoints(call, mu.to(device), failure)
        y, states = ctx.graph
        if not keep:
            ctx.graph = None  # the kernels' saved tensors go with it
        leaves = [x_leaf, h0_leaf, *p_leaves]
        wanted = [t for t in leaves if t is not None and t.requires_grad]
        # An output without a graph depends on no wanted leaf: a slice that reads no row of
        # the one input needing a gradient (a learned initial state it does not start).
        traced = [(out, grad) for out, grad in
                  ((y, dy), (states, with_end_cotangent(call.layout, dstates, cotangent)))
                  if out.requires_grad]
        grads = (torch.autograd.grad([out for out, _ in traced], wanted,
                                     [grad for _, grad in traced], allow_unused=True,
                                     retain_graph=keep)
                 if traced else [None] * len(wanted))
        by_leaf = dict(zip(map(id, wanted), grads))
        out = []
        for t in leaves:
            g = by_leaf.get(id(t)) if t is not None else None
            if g is None and t is not None and t.requires_grad:
                g = torch.zeros_like(t)  # initial-state rows this rank does not read
            out.append(g)
        return out

    @staticmethod
    def _runner_backward(ctx, dy, dstates, refusal, keep):
        """(dx, d initial_state, *d params) by the runner: the adjoint at the slice start
        leaves mid-way through its backward, which takes the later ranks' cotangent in."""
        call = ctx.call
        exchanged = []

        def end_cotangent(mu):
            return _exchange_adjoints(call, mu, None, exchanged)
        try:
            if refusal is not None:
                raise refusal
            # Autograd's checks: no in-place change since the forward, no graph freed by an
            # earlier backward.
            ctx.saved_tensors  # noqa: B018
            if ctx.phases_spent:  # an earlier backward kept the graph: run them again
                call.runner.summary()
                call.runner.forward(ctx.start)
            ctx.phases_spent = True
            dx, *d_params, d_entering = call.runner.backward(dy, dstates, end_cotangent)
        except Exception as exc:
            if not exchanged:  # the other ranks wait in the gather: tell them
                mu = torch.zeros(dstates.shape, device=dstates.device, dtype=torch.float32)
                _exchange_adjoints(call, mu, exc)
            raise
        if not keep:
            ctx.start = None
        needs = ctx.needs_input_grad[2:]
        d_h0 = None
        if needs[1]:
            shape, dtype = ctx.initial_state
            # Unpacked, a slice that starts the sequences reads every row; one that continues
            # them reads none (zeros).
            d_h0 = (d_entering.to(dtype) if not call.layout.continued
                    else torch.zeros(shape, dtype=dtype, device=dx.device))
        return [dx if needs[0] else None, d_h0,
                *[g if n else None for g, n in zip(d_params, needs[2:])]]


def run_with_carry(call: SliceCall, entering, x, initial_state, *params):
    """(y, states) of the slice from ``entering`` with the backward of the module docstring
    (the adjoint exchange through ``call.gather``)."""
    return _SliceWithCarry.apply(call, entering, x, initial_state, *params)


def _meta_row(mixer, x, initial_state, ctx: CPContext, needs_grad: bool, status: int,
              heads: int, summary):
    row = [0] * _META_FIELDS
    row[_STATUS] = status
    row[_RANK] = ctx.rank
    row[_PACKED] = int(ctx.packed)
    if ctx.packed:
        row[_CU_COUNT] = len(ctx.sequence_offsets)
    row[_CU_DIGEST], row[_SLICES_DIGEST] = ctx.digests
    row[_MIXER_DIGEST] = _digest(mixer)
    row[_HEADS] = heads
    if isinstance(x, torch.Tensor) and x.dim() == 3:
        row[_BATCH], row[_LENGTH], row[_WIDTH] = x.shape
        row[_DTYPE] = _dtype_code(x.dtype)
    row[_SUMMARY_DTYPE] = -1 if summary is None else _dtype_code(summary.dtype)
    row[_HAS_INITIAL] = int(initial_state is not None)
    row[_NEEDS_GRAD] = int(needs_grad)
    return row


def _check_local(mixer, x, initial_state, cu_seqlens, ctx: CPContext, group_rank, group_world):
    """The checks one rank can make alone; the mixer checks the rest in the summary pass."""
    if cu_seqlens is not None:
        raise ValueError("with cp_context the packed layout comes from the context: pass the "
                         "global offsets to build_cp_context(cu_seqlens=...) and no cu_seqlens "
                         "to the call")
    if (group_rank, group_world) != (ctx.rank, ctx.world_size):
        raise ValueError(f"cp_context was built for rank {ctx.rank} of {ctx.world_size}, but "
                         f"this process is rank {group_rank} of {group_world} in its group")
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be this rank's slice [batch, length, width], got {shape}")
    batch, length, width = x.shape
    if ctx.slice_lengths is not None and length != ctx.slice_lengths[ctx.rank]:
        raise ValueError(f"this rank's slice holds {length} tokens but the context's slice "
                         f"lengths {list(ctx.slice_lengths)} give it "
                         f"{ctx.slice_lengths[ctx.rank]}")
    if ctx.packed and batch != 1:
        raise ValueError(f"packed sequences (cu_seqlens in the context) need batch 1, got "
                         f"batch {batch}")
    if initial_state is not None:
        if not isinstance(initial_state, torch.Tensor):
            raise TypeError(f"initial_state must be a torch.Tensor, got "
                            f"{type(initial_state).__name__}")
        count = len(ctx.sequence_offsets) - 1 if ctx.packed else batch
        if tuple(initial_state.shape) != (count, width):
            what = "global sequences" if ctx.packed else "batch"
            raise ValueError(f"initial_state must have shape [{count}, {width}] ({what} "
                             f"{count}), got {tuple(initial_state.shape)}")
        if not initial_state.is_floating_point():
            raise TypeError(f"initial_state must be floating point, got {initial_state.dtype}")
        if initial_state.device != x.device:
            raise ValueError(f"initial_state is on {initial_state.device} but x is on "
                             f"{x.device}")


# What the ranks must agree on, in the order checked: (position, what, this rank's value shown
# when the row holds a digest of it).
_AGREED = (
    (_PACKED, "packed or not (cu_seqlens in the context)", None),
    (_CU_COUNT, "the number of global sequences", None),
    (_CU_DIGEST, "the global cu_seqlens", lambda ctx, mixer: ctx.sequence_offsets),
    (_SLICES_DIGEST, "the context's slice lengths", lambda ctx, mixer: ctx.slice_lengths),
    (_MIXER_DIGEST, "the mixer", lambda ctx, mixer: mixer),
    (_HEADS, "the number of heads", None),
    (_BATCH, "the batch", None),
    (_WIDTH, "the width", None),
    (_DTYPE, "x's dtype", None),
    (_SUMMARY_DTYPE, "the state's dtype", None),
    (_HAS_INITIAL, "whether an initial state is given", None),
    (_NEEDS_GRAD, "whether the call builds a graph (grad mode and requires_grad): every rank "
                  "must run its backward", None),
)


def _agree(mixer: str, ctx: CPContext, row, error: Exception | None, comm_device):
    """All_gathers every rank's metadata and raises the same error on every rank when one
    failed or the ranks disagree; returns the slice lengths."""
    mine = torch.tensor(row, dtype=torch.int64, device=comm_device)
    table = _all_gather(ctx.group, mine, ctx.world_size).tolist()
    prefix = f"{mixer} (context parallel): "
    failed = [k for k, r in enumerate(table) if r[_STATUS]]
    if failed:
        _raise_for_failures(ctx.group, ctx.world_size, failed, error, prefix)
    if [r[_RANK] for r in table] != list(range(ctx.world_size)):
        raise ValueError(prefix + "the ranks' contexts were built in different groups")
    for field, what, value in _AGREED:
        values = [r[field] for r in table]
        if len(set(values)) == 1:
            continue
        if value is not None:  # a digest: each rank's value, gathered to be shown
            _raise_disagreement(ctx.group, ctx.world_size, prefix, what, value(ctx, mixer))
        if field in (_DTYPE, _SUMMARY_DTYPE):
            values = [str(SUPPORTED_DTYPES[v]) if v >= 0 else "unsupported" for v in values]
        raise ValueError(prefix + f"the ranks disagree on {what}: {values} by rank")
    lengths = tuple(r[_LENGTH] for r in table)
    if ctx.slice_lengths is not None and lengths != ctx.slice_lengths:
        raise ValueError(prefix + f"the slices hold {_shortened(lengths)} tokens by rank, the "
                         f"context's slice lengths are {_shortened(ctx.slice_lengths)}")
    return lengths


def parameter_list(mixer: str, spec, params) -> list:
    """``params`` as the spec's ordered list: a sequence as given, a dict by its names (which
    must be the spec's, each once); TypeError or ValueError naming the problem otherwise."""
    if isinstance(params, Mapping):
        names = list(spec.parameter_names)
        if set(params) != set(names):
            raise ValueError(f"{mixer}: params as a dict must hold exactly the parameters "
                             f"{names}, got {list(params)}")
        return [params[name] for name in names]
    if isinstance(params, (str, bytes)) or not hasattr(params, "__iter__"):
        raise TypeError(f"{mixer}: params must be a sequence of tensors in the order "
                        f"{list(spec.parameter_names)}, or a dict of them by name; got "
                        f"{type(params).__name__}")
    return list(params)


@torch.compiler.disable
def context_parallel(mixer: str, x, params, *, cp_context: CPContext, backend="auto",
                     return_backend: bool = False, initial_state=None,
                     output_final_state: bool = False, cu_seqlens=None, resets=None):
    """The mixer over the sequence that the ranks of ``cp_context.group`` hold in slices: this
    rank's y (and states), as the functional forms return them with ``cp_context``.
    ``params``: the mixer's parameters in its spec's order, or {name: tensor} of every one.

    ``initial_state``: [B, D] ([N, D] packed, N the global sequences), the same tensor on
    every rank; each rank reads the rows of the sequences that start in its slice (unpacked:
    rank 0 reads all of it), and its gradient holds those rows (zeros elsewhere), so that
    their sum over the ranks is the full gradient.

    States returned with ``output_final_state``: unpacked, [B, D], the state at this slice's
    end, which is the next rank's entering state, and on the last rank the final state;
    packed, one row per sequence with a piece in the slice (``cp_context.sequence_ids``): the
    final state of each sequence that ends here, and for the last, when it continues on the
    next rank (``cp_context.continues_to_next``), the state at the slice end.  Gradients on
    every returned row are taken in.

    ``resets``: this rank's [B, L_r] slice of the reset mask (torch.bool, the tokens of its
    slice of x), or None; ranks may differ in passing one.  A slice with a mask runs the
    generic phases (a call with the mask, and autograd for the adjoint): a row that holds a
    reset has A = 0, and a reset at the slice's first token ignores the entering state.

    Every check that can fail on one rank runs before the first collective, and the ranks
    share their verdicts: a bad call on any rank raises the same error on every rank (only a
    cp_context that is no CPContext, which names no group to tell, raises here alone)."""
    ctx = cp_context
    if not isinstance(ctx, CPContext):
        raise cp_context_error(mixer, ctx)
    if isinstance(x, torch.Tensor):
        x = autocast_input(x)
    device = x.device if isinstance(x, torch.Tensor) else torch.device("cpu")
    comm_device = _comm_device(ctx.group, device)
    error, status, summary, layout, runner, heads = None, 0, None, None, None, 0
    param_list, needs_grad = [], False
    try:
        spec = mixers.get(mixer)
        param_list = parameter_list(mixer, spec, params)
        tensors = [t for t in (x, initial_state, *param_list) if isinstance(t, torch.Tensor)]
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
        mixers.check_count(mixer, param_list)
        named = dict(zip(spec.parameter_names, param_list))
        check_tensors(mixer, named)
        check_flag(mixer, "output_final_state", output_final_state)
        check_flag(mixer, "return_backend", return_backend)
        _check_local(mixer, x, initial_state, cu_seqlens, ctx, dist.get_rank(ctx.group),
                     dist.get_world_size(ctx.group))
        if resets is not None:
            check_resets(mixer, x, resets)
            # Here, not where the slice runs: a slice that ends a sequence runs after the
            # summaries are exchanged, and its refusal would leave the other ranks waiting.
            check_takes_resets(mixer, resolve_backend(mixer, x, backend))
        lengths = ctx.slice_lengths or (None,) * ctx.world_size
        if not ctx.packed:
            lengths = tuple(x.shape[1] if k == ctx.rank else n for k, n in enumerate(lengths))
        layout = slice_layout(ctx.rank, lengths, ctx.sequence_offsets)
        runner = slice_runner(mixer, layout, x, param_list, backend, initial_state, resets)
        summary = slice_summary(mixer, layout, x, param_list, backend, initial_state, runner,
                                resets)
        heads = spec.heads_of(named) if spec.has_heads else 0
    except Exception as exc:  # reported to every rank below instead of leaving them waiting
        error, status = exc, 1
    meta = _meta_row(mixer, x, initial_state, ctx, needs_grad, status, heads, summary)
    _agree(mixer, ctx, meta, error, comm_device)
    gather = _gatherer(ctx.group, ctx.world_size, comm_device, device)
    summaries = gather(summary)
    entering = incoming_state(summaries, ctx.rank) if layout.continued else None
    call = SliceCall(mixer, backend, layout, gather, summaries[:, 0], runner, [], resets)
    if needs_grad:
        y, states = run_with_carry(call, entering, x, initial_state, *param_list)
        name = call.names[0]
    elif runner is not None:
        y, states = runner.forward(runner_entering(layout, entering, initial_state))
        name = _backend_name(mixer, x, backend)
    else:
        y, states, name = run_slice(mixer, layout, x, param_list, backend, entering,
                                    initial_state, resets)
    out = (y, states) if output_final_state else (y,)
    if return_backend:
        out = (*out, name)
    return out if len(out) > 1 else y

"""Host side of the single-pass families (samu.ops.<mixer>.single_pass): their scratch, when the
exchange runs in a launch of its own, and the context-parallel phases that every family serves
from its forward and backward (their autograd.Function is every family's,
samu.ops.common.function).

The kernels' side is samu.ops.common.lookback.  A call's scratch is one workspace: its int32
words (each tile's flag, each group's arrival count and totals flag, two ticket counters) come
first and are zeroed by one fill, the launch before the kernel's.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch

from ..._runtime import INTERPRETING
from .launching import (aligned, check_configuration, check_fields, fp32_contiguous, sm_count,
                        workspace)
from .sequences import check_phase_tensors, sequence_args


@dataclass(frozen=True)
class Lookback:
    """A single-pass family's look-back and exchange settings.  window: predecessors read at once
    (a power of two).  split: the exchange between a chunk's tiles in a launch of its own (the
    kernel then runs in two launches, each tile's inputs read twice); the host also splits where
    a group of tiles could not be resident at once (more channel blocks than SMs) and under
    Triton's interpreter, which runs programs one at a time.  Tests only: ticket_order 1 takes
    the tiles chain by chain (split launches), inclusive_every k publishes only every k-th
    tile's inclusive state (0: none), so that walks cross aggregates."""
    window: int = 16
    split: bool = False
    ticket_order: int = 0
    inclusive_every: int = 1

    def __post_init__(self):
        check_fields(self, dict(window=None, ticket_order=None, inclusive_every=0))
        if self.window < 1 or self.window & (self.window - 1) or self.window > 32:
            raise ValueError(f"Lookback: window must be a power of two up to 32 (a bit per "
                             f"lane of an int32), got {self.window}")
        if self.ticket_order not in (0, 1):
            raise ValueError(f"Lookback: ticket_order must be 0 or 1, got {self.ticket_order}")

    def phases(self, channel_blocks: int, device, exchanges: bool = True) -> tuple[int, ...]:
        """The kernel's PHASE of each launch: (0,) one launch; (1, 2) the exchange apart.  A
        kernel whose tiles exchange nothing (``exchanges`` off) waits only on earlier tickets
        and always runs in one."""
        split = exchanges and (self.asks_split or channel_blocks > sm_count(device)
                               or (INTERPRETING and channel_blocks > 1))
        return (1, 2) if split else (0,)

    @property
    def asks_split(self) -> bool:
        """Whether these settings split the exchange whatever the width and device."""
        return self.split or self.ticket_order != 0

    def meta(self) -> dict:
        return dict(WINDOW=self.window, ORDER=self.ticket_order,
                    INCLUSIVE_EVERY=self.inclusive_every)


@dataclass(frozen=True)
class SinglePassConfig:
    """A single-pass backend: tokens per chunk, each kernel's launch (the family's Launch) and
    the look-back's settings.  The name is generated from the chunk (the family's NAME); the
    rest is tuning."""
    chunk: int
    forward: object = None
    backward: object = None
    lookback: Lookback = Lookback()
    NAME: ClassVar[str] = "singlepass_chunk{chunk}"

    def __post_init__(self):
        check_configuration(self)

    @property
    def name(self) -> str:
        return self.NAME.format(chunk=self.chunk)

    def launches(self) -> dict:
        return {role: getattr(self, role) for role in FEATURES}


# The state keywords' constexprs of each kernel of a single-pass family (its roles).
FEATURES = {"forward": ("PACKED", "HAS_INITIAL", "HAS_FINAL", "HAS_RESETS"),
            "backward": ("PACKED", "HAS_INITIAL", "HAS_DFINAL", "HAS_RESETS")}


def flags(sequences, **more) -> tuple:
    """One call's state-keyword constexprs as (name, value) pairs (a launch plan's cache key):
    the sequences' and ``more`` (HAS_FINAL or HAS_DFINAL)."""
    return (("PACKED", sequences.packed), ("HAS_INITIAL", sequences.has_initial),
            *more.items(), ("HAS_RESETS", sequences.has_resets))


def launch_plan(kernels: dict, config: SinglePassConfig, tiles_of_role: dict,
                features: bool, exchanges: bool = True) -> list:
    """(kernel, constexprs, compile options) of each launch of each role's kernel, from its tile
    constexprs, without the state keywords or (features=True) with all: one launch (PHASE 0),
    or PHASE 1 then 2 where the settings split the exchange (``Lookback.asks_split``; the split
    a width of more channel blocks than SMs forces is the device's, not the plan's)."""
    phases = (1, 2) if exchanges and config.lookback.asks_split else (0,)
    plan = []
    for role, kernel in kernels.items():
        for phase in phases:
            constexprs = dict(tiles_of_role[role], PHASE=phase, **config.lookback.meta(),
                              **dict.fromkeys(FEATURES[role], features))
            options = {name: constexprs.pop(name) for name in ("num_warps", "maxnreg")
                       if name in constexprs}
            plan.append((kernel, constexprs, options))
    return plan


def entry_points(module_name: str) -> tuple:
    """(slice_summary, start_adjoint) of the family module ``module_name``: the
    context-parallel phases, from its forward and backward."""
    def family():
        return sys.modules[module_name]

    def family_slice_summary(x, params, config, initial_state=None, resets: bool = False):
        """(A, h) of a slice (samu.ops.common.single_pass.slice_summary)."""
        return slice_summary(family(), x, params, config, initial_state, resets)

    def family_start_adjoint(x, params, dy, d_end, config):
        """mu of a continued slice (samu.ops.common.single_pass.start_adjoint)."""
        return start_adjoint(family(), x, params, dy, d_end, config)
    return family_slice_summary, family_start_adjoint


class Scratch(NamedTuple):
    """Sizes of a call's scratch in tiles (n_tiles = groups x channel blocks) and groups (batch
    rows x chunks)."""
    n_tiles: int
    n_groups: int

    @property
    def int_words(self) -> int:
        """Tile flags, group counts, group totals flags, two ticket counters."""
        return self.n_tiles + 2 * self.n_groups + 2

    def allocate(self, float_numels, device) -> tuple:
        """(the int32 words, zeroed, and the float pieces) in one workspace and one fill."""
        _, (words, *floats) = workspace((self.int_words, *float_numels), device)
        words = words.view(torch.int32)
        words.zero_()
        return words, floats


def scratch(batch: int, n_chunks: int, width: int, channel_blocks: int) -> Scratch:
    """A call's scratch sizes.  ValueError where a batch row's chunk rows ([NC, D]) pass 2^31
    elements: the look-back addresses a row's predecessors with 32-bit offsets."""
    if n_chunks * width >= 2 ** 31:
        raise ValueError(f"the single-pass kernels take at most 2^31 - 1 elements of chunk rows "
                         f"per batch row ({n_chunks} chunks x {width} channels); use a longer "
                         "chunk or another backend")
    return Scratch(batch * n_chunks * channel_blocks, batch * n_chunks)


# --- context parallelism's phases (samu.distributed), from a family's forward and backward ----

def _slice_sequences(x, initial_state, resets: bool, output_final_state: bool):
    batch, _, width = x.shape
    if resets:
        initial_state = None
    elif initial_state is None:
        initial_state = torch.zeros(batch, width, device=x.device, dtype=torch.float32)
    return sequence_args(x, initial_state, None, output_final_state)


def slice_summary(family, x, params, config, initial_state=None, resets: bool = False):
    """(A, h), FP32 [B, D] each, of a slice that holds no sequence start after its first token:
    its end state is A h_in + h.  h is the final state of a forward from ``initial_state``
    (zeros by default; with ``resets`` the state resets at the first token); A is the product
    of the slice's decays, exp of the mixer's log_decay (samu.mixers), the one extra pass."""
    from ...mixers import MIXERS
    check_phase_tensors("slice_summary", x, initial_state=initial_state)
    x = aligned(x)
    sequences = _slice_sequences(x, initial_state, resets, True)
    _, h, _ = family.forward(x, list(params), sequences, config)
    log_decay = MIXERS[family.MIXER].load("log_decay")
    with torch.autocast(x.device.type, enabled=False):
        decay = torch.exp(log_decay(x, *params).float())
    return decay, h


def start_adjoint(family, x, params, dy, d_end, config):
    """mu, FP32 [B, D]: the adjoint leaving a continued slice's first token for the state
    entering it, from dy and the cotangent d_end on the slice's end state: the gradient of the
    state entering the slice, from the family's forward and backward (from a zero entering
    state: the adjoint does not depend on it)."""
    check_phase_tensors("start_adjoint", x, dy=dy, d_state=d_end)
    x = aligned(x)
    params = list(params)
    sequences = _slice_sequences(x, None, False, False)
    _, _, residuals = family.forward(x, params, sequences, config)
    grads = family.backward(x, params, residuals, aligned(dy), fp32_contiguous(d_end),
                            sequences, config)
    return grads[-1]

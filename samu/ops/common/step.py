"""What both decode-step kernels read and write: x_t's rows and the state as the kernels read
them, the FP32 parameters, and the two outputs (the only allocations where the inputs are
already in that form)."""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .launching import aligned, fp32_contiguous, reset_bytes


def rows(t: torch.Tensor) -> torch.Tensor:
    """A [B, D] tensor as the step kernels read it: rows of unit column stride at a 16-byte
    aligned address (launching.launch's cached kernels are compiled for aligned pointers),
    any row stride.  A copy only when it is not one already: x[:, t] of a [B, L, D] tensor is
    read in place."""
    if (t.stride(1) == 1 or t.shape[1] == 1) and t.data_ptr() % 16 == 0:
        return t
    return aligned(t)


@triton.jit
def reset_rows(h, u, reset_ptr, b, cols, HAS_RESETS: tl.constexpr):
    """h, or u (the step from a reset state) where row b's reset flag is set: one byte, which
    every lane loads at the same in-bounds address."""
    if HAS_RESETS:
        flag = tl.load(reset_ptr + b + cols * 0)
        return tl.where(flag != 0, u, h)
    else:
        return h


class StepOperands(NamedTuple):
    x: torch.Tensor  # x_t's rows
    h0: torch.Tensor  # the state's rows, FP32 (the new state itself, unread, without one)
    y: torch.Tensor  # y_t, x_t's dtype
    h: torch.Tensor  # the new state, FP32
    params: list  # FP32, contiguous
    resets: torch.Tensor  # one byte per row (a placeholder the kernel never reads without)


def step_operands(x_t: torch.Tensor, state, params, resets=None) -> StepOperands:
    """The operands of one step: the state is cast to FP32 as the forward casts an initial
    state; None (a sequence's first token) leaves h0 a placeholder the kernel never reads, and
    so does a mask of None its flags."""
    x = rows(x_t)
    batch, width = x.shape
    y = torch.empty((batch, width), device=x.device, dtype=x.dtype)
    h = torch.empty((batch, width), device=x.device, dtype=torch.float32)
    h0 = h if state is None else rows(state if state.dtype == torch.float32 else state.float())
    flags = h if resets is None else reset_bytes(resets, (batch,), x.device)
    return StepOperands(x, h0, y, h, [fp32_contiguous(p) for p in params], flags)

"""Per-element math of the scan kernels, counted in instructions.

exp, sqrt and reciprocal are single MUFU instructions on the GPU (PTX approx.ftz; tl.exp adds a
four-instruction denormal fix-up); the interpreter runs no PTX and takes Triton's own ops.
Softplus is built from tl.exp / tl.log so that the interpreter can run it (no libdevice).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..._runtime import INTERPRETING


# Compile-time switches: each kernel keeps only its GPU (PTX) or its interpreter branch.
FAST_MATH = tl.constexpr(not INTERPRETING)
INTERPRETER = tl.constexpr(INTERPRETING)

LOG2_E = tl.constexpr(1.4426950408889634)


@triton.jit
def _ptx_approx(x, INSTRUCTION: tl.constexpr):
    """One PTX f32 instruction (one MUFU in SASS) on every element of x."""
    return tl.inline_asm_elementwise(INSTRUCTION + " $0, $1;", "=f,f", [x], dtype=tl.float32,
                                     is_pure=True, pack=1)


@triton.jit
def exp_fast(x):
    """e^x: PTX ex2.approx.ftz (relative error ~2^-22, results under 2^-126 flush to zero)."""
    if FAST_MATH:
        return _ptx_approx(x * LOG2_E, "ex2.approx.ftz.f32")
    else:
        return tl.exp(x)


@triton.jit
def sqrt_fast(x):
    if FAST_MATH:
        return _ptx_approx(x, "sqrt.approx.ftz.f32")
    else:
        return tl.sqrt(x)


@triton.jit
def reciprocal_fast(x):
    if FAST_MATH:
        return _ptx_approx(x, "rcp.approx.ftz.f32")
    else:
        return 1.0 / x


@triton.jit
def sigmoid_fast(x):
    """1 / (1 + e^-x): e^-x = inf gives 0, e^-x = 0 gives 1."""
    return reciprocal_fast(1.0 + exp_fast(-x))


@triton.jit
def to_element(x, ptr):
    """x in ptr's element type, rounded to nearest.  The interpreter casts FP32 to BF16 by
    truncation (numpy has no bfloat16), which doubles an output's rounding error; there the
    rounding is done on the bits.  On the GPU this is the plain cast (cvt.rn)."""
    if INTERPRETER:
        if ptr.dtype.element_ty == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            bits = bits + 0x7FFF + ((bits >> 16) & 1)
            x = (bits & 0xFFFF0000).to(tl.float32, bitcast=True)
    return x.to(ptr.dtype.element_ty)


@triton.jit
def softplus(z):
    """log(1 + e^z), accurate in FP32 over the whole range.  With e = e^-|z|, log(1 + e) alone
    rounds to 0 once e < 2^-24 (z < -17) and loses digits well before; and the GPU's log is
    approximate (to ~2^-22 absolute near 1), so no correction built on log(1 + e) recovers them.
    Where e < 1/4, log1p(e) is its series to e^12 (truncation < 5e-9 relative); elsewhere
    log(1 + e) >= 0.22, where the log's absolute error is small beside it.  Built from tl.exp /
    tl.log and arithmetic, so that the interpreter runs it (no libdevice)."""
    e = tl.exp(-tl.abs(z))
    series = e * (1.0 + e * (-1.0 / 2 + e * (1.0 / 3 + e * (-1.0 / 4 + e * (1.0 / 5 + e * (
        -1.0 / 6 + e * (1.0 / 7 + e * (-1.0 / 8 + e * (1.0 / 9 + e * (-1.0 / 10 + e * (
            1.0 / 11 + e * (-1.0 / 12))))))))))))
    log1p_e = tl.where(e < 0.25, series, tl.log(1.0 + e))
    return tl.maximum(z, 0.0) + log1p_e


@triton.jit
def one_minus_a_squared(log_a, a):
    """1 - a^2 without cancellation when a is near 1: -expm1(2 log a) by its series for
    2 log a > -1/16 (truncation ~x^4/120 < 1.3e-7 relative), elsewhere 1 - a * a."""
    y = log_a
    series = y * (-2.0 + y * (-2.0 + y * (-4.0 / 3.0 + y * (-2.0 / 3.0))))
    return tl.where(y > -0.03125, series, 1.0 - a * a)


@triton.jit
def transition(log_a, is_first):
    """a, m = sqrt(1 - a^2) and dm/dlog a = -a^2 / m (its denominator floored at 5e-4), with
    m = 1 and no gradient at t = 0."""
    a = exp_fast(log_a)
    m_raw = sqrt_fast(tl.maximum(one_minus_a_squared(log_a, a), 0.0))
    m = tl.where(is_first, 1.0, m_raw)
    dm_dlog_a = tl.where(is_first, 0.0, -(a * a) * reciprocal_fast(tl.maximum(m_raw, 5e-4)))
    return a, m, dm_dlog_a

"""Triton pieces shared by both mixers' kernels: the scan combines, the transition, the carry.

The recurrence h_t = a_t h_{t-1} + u_t is a composition of affine maps.  A chunk of T tokens is
scanned in registers with ``tl.associative_scan``; chunks are joined by the hierarchical carry:

    phase 1  each chunk, alone: decay_k = prod a, end_k = its end state from h_in = 0
    phase 2  one program per channel block scans (decay_k, end_k) over the chunks -> h_in per chunk
    phase 3  each chunk again: h_t = local_t + (prod_{s<=t} a_s) h_in

The backward runs the same three phases in reverse time with the adjoint recurrence.

Layout: a scan tile [T tokens, channels] is 32 x num_warps channels wide and its row stride is
unspecialised (row_offsets), so each thread holds all T tokens of its channel and the scan is a
sequential loop in registers: no shared memory, no shuffles.  Triton's reverse scan still
shuffles, so reverse recurrences load the chunk latest token first and scan forward; a scan then
calls combine(accumulated_later, element_earlier), the order a reverse scan uses, and one affine
combine serves both directions (products commute).  Softplus is written from tl.exp / tl.log
so that Triton's interpreter can run it (no libdevice).

The scan kernels issue more instructions than their bytes need (Nsight Compute on the H200: the
SAMU output kernel issued on 79 % of cycles at 1.4 TB/s), so the per-element math is counted:
exp, sqrt and reciprocal are single MUFU instructions (``exp_fast`` and friends: PTX approx.ftz
on the GPU, where tl.exp adds a four-instruction denormal fix-up), and the one reverse scan that
cannot be turned around (SAMU's backward needs h and the adjoint in one register order) is
unrolled (``decayed_previous_state``): Triton's reverse scan shuffles across lanes.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ._runtime import INTERPRETING  # read once, at import: Triton decides at decoration

SQRT_GRAD_FLOOR = 1e-6


@triton.jit
def affine_combine(a1, b1, a2, b2):
    """Apply (a1, b1) then (a2, b2): h -> a2 (a1 h + b1) + b2."""
    return a1 * a2, a2 * b1 + b2


@triton.jit
def adjoint_combine(p_r, v_r, q_r, w_r, p_l, v_l, q_l, w_l):
    """Reverse-scan combine for the adjoint.  For a segment and an incoming c = a dh from its right:
    a_t dh_t = p c + v and dh_t = q c + w at the segment's first token."""
    return p_l * p_r, p_l * v_r + v_l, q_l * p_r, q_l * v_r + w_l


# One MUFU instruction each on the GPU; the interpreter runs no PTX and takes Triton's own ops.
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
def sigmoid_fast(x):
    """1 / (1 + e^-x): e^-x = inf gives 0, e^-x = 0 gives 1."""
    return reciprocal_fast(1.0 + exp_fast(-x))


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
def softplus(z):
    """log(1 + e^z), accurate in FP32 over the whole range: log(1 + e) alone rounds to 0 once
    e = e^-|z| < 2^-24 (z < -17), and loses digits well before.  log1p(e) is taken by
    Goldberg's correction, log(w) * e / (w - 1) with w = 1 + e, exact to a few ulps, built from
    tl.log so that the interpreter runs it (no libdevice)."""
    e = tl.exp(-tl.abs(z))
    w = 1.0 + e
    log1p_e = tl.where(w == 1.0, e, tl.log(w) * (e / (w - 1.0)))
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


@triton.jit
def chunk_carry_kernel(decay_ptr, end_ptr, out_ptr, a_param_ptr, log_temp_ptr,
                       seg_decay_ptr, seg_end_ptr, seg_in_ptr, NC, D, SEG,
                       REVERSE: tl.constexpr, SCALAR_DECAY: tl.constexpr, MODE: tl.constexpr,
                       BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr):
    """Phase 2 over one segment of SEG chunks per program (grid: batch, channel blocks,
    segments).  Forward: out[k] = state entering chunk k.  Reverse: out[k] = adjoint carry
    entering chunk k from its right.  end, out: [B, NC, D] fp32.  decay: [B, NC, D] fp32, or
    with SCALAR_DECAY (SAMU) the chunk's sum of r, [B, NC], and decay = exp(-8 exp(log_temp)
    softplus(a_param) sum r) is rebuilt here, so that no [B, NC, D] decay is written or read.
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
    base = b * NC * D
    crow = tl.arange(0, BLOCK_C)
    if MODE == 2:
        carry = tl.load(seg_in_ptr + (b * n_seg + seg) * D + cols, mask=col_ok, other=0.0)
    else:
        carry = tl.zeros([BLOCK_D], dtype=tl.float32)
    prod = tl.full([BLOCK_D], 1.0, dtype=tl.float32)
    r_total = tl.zeros([BLOCK_C], dtype=tl.float32)
    if SCALAR_DECAY:
        rate = 8.0 * tl.exp(tl.load(log_temp_ptr)) * softplus(
            tl.load(a_param_ptr + cols, mask=col_ok, other=0.0))
    if MODE != 1:
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
        if SCALAR_DECAY:
            r_sum = tl.load(decay_ptr + b * NC + ks, mask=ok, other=0.0)
            r_total += r_sum
            dec = exp_fast(-rate[None, :] * r_sum[:, None])
        else:
            dec = tl.load(decay_ptr + offs, mask=m2, other=1.0)
        end = tl.load(end_ptr + offs, mask=m2, other=0.0)
        p, v = tl.associative_scan((dec, end), 0, affine_combine, reverse=REVERSE)
        state = v + p * carry[None, :]
        if REVERSE:
            if MODE != 1:
                tl.store(out_ptr + offs - D, state, mask=m2 & (ks[:, None] >= lo + 1))
            carry = first_row(state, crow)
            prod = prod * first_row(p, crow)
        else:
            if MODE != 1:
                tl.store(out_ptr + offs + D, state, mask=m2 & (ks[:, None] < hi - 1))
            carry = last_row(state, crow, BLOCK_C)
            prod = prod * last_row(p, crow, BLOCK_C)
    if MODE == 1:
        summary = (b * n_seg + seg) * D + cols
        tl.store(seg_end_ptr + summary, carry, mask=col_ok)
        if SCALAR_DECAY:
            tl.store(seg_decay_ptr + b * n_seg + seg, tl.sum(r_total, axis=0))
        else:
            tl.store(seg_decay_ptr + summary, prod, mask=col_ok)


# Chunks per segment of the two-level carry, and the chunk count from which it is used: one
# program per channel block walking 4096 chunks took 0.13 ms a call on the H200 (chunk 8,
# L = 32768).
SEGMENT_CHUNKS = 128
TWO_LEVEL_FROM = 512


def chunk_carry(decay: torch.Tensor, end: torch.Tensor, reverse: bool,
                a_param: torch.Tensor | None = None, log_temp: torch.Tensor | None = None
                ) -> torch.Tensor:
    """Phase 2 over [B, NC, D] summaries.  With a_param and log_temp (SAMU), decay is the
    chunks' sum of r, [B, NC] (see chunk_carry_kernel).  From TWO_LEVEL_FROM chunks on, two
    levels: segment summaries, the carry over segments, then each segment from its carry."""
    batch, n_chunks, width = end.shape
    out = torch.empty_like(end)
    scalar_decay = a_param is not None
    params = (a_param, log_temp) if scalar_decay else (end, end)
    block_c = min(64, max(16, next_power_of_2(n_chunks)))
    if n_chunks < TWO_LEVEL_FROM:
        # One program per (batch, channel block) walks every chunk: keep >= ~256 programs busy.
        block_d = max(16, min(128, next_power_of_2(max(1, batch * width // 256))))
        block_d = min(block_d, max(16, next_power_of_2(width)))
        launch(chunk_carry_kernel, (batch, cdiv(width, block_d), 1), decay, end, out, *params,
               end, end, end, n_chunks, width, n_chunks, REVERSE=reverse,
               SCALAR_DECAY=scalar_decay, MODE=0, BLOCK_C=block_c, BLOCK_D=block_d, num_warps=4)
        return out
    n_seg = cdiv(n_chunks, SEGMENT_CHUNKS)
    block_d = min(32, max(16, next_power_of_2(width)))
    grid = (batch, cdiv(width, block_d), n_seg)
    f32 = dict(device=end.device, dtype=torch.float32)
    seg_decay = torch.empty((batch, n_seg) if scalar_decay else (batch, n_seg, width), **f32)
    seg_end = torch.empty(batch, n_seg, width, **f32)
    meta = dict(REVERSE=reverse, SCALAR_DECAY=scalar_decay, BLOCK_C=block_c, BLOCK_D=block_d,
                num_warps=4)
    launch(chunk_carry_kernel, grid, decay, end, out, *params, seg_decay, seg_end, end,
           n_chunks, width, SEGMENT_CHUNKS, MODE=1, **meta)
    seg_in = chunk_carry(seg_decay, seg_end, reverse, a_param, log_temp)
    launch(chunk_carry_kernel, grid, decay, end, out, *params, seg_decay, seg_end, seg_in,
           n_chunks, width, SEGMENT_CHUNKS, MODE=2, **meta)
    return out


@triton.jit
def sum_partials_kernel(part_ptr, tail_ptr, out_ptr, a_param_ptr, P, N, D,
                        BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[:N] = sum_p part[p, :] and out[N:N+D] = sum_p tail[p, :] * sigmoid(a_param), the tail
    being d softplus(a_param): d a_param = d softplus * sigmoid(a_param)."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    in_part = cols < N
    in_tail = (cols >= N) & (cols < N + D)
    acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    for p0 in range(0, P, BLOCK_P):
        rows = p0 + tl.arange(0, BLOCK_P)[:, None]
        ok = rows < P
        acc += tl.load(part_ptr + rows.to(tl.int64) * N + cols[None, :],
                       mask=ok & in_part[None, :], other=0.0)
        acc += tl.load(tail_ptr + rows.to(tl.int64) * D + (cols[None, :] - N),
                       mask=ok & in_tail[None, :], other=0.0)
    total = tl.sum(acc, axis=0)
    a = tl.load(a_param_ptr + cols - N, mask=in_tail, other=0.0)
    total = tl.where(in_tail, total * tl.sigmoid(a), total)
    tl.store(out_ptr + cols, total, mask=in_part | in_tail)


def sum_partials(part: torch.Tensor, tail: torch.Tensor, a_param: torch.Tensor) -> torch.Tensor:
    """Every parameter gradient from the kernels' per-program partial rows, in one launch (in
    place of ~5 small torch ops at ~10 us of host time each): part [P, N] and tail [P, D], the
    d softplus(a_param) rows.  Returns [N + D]: the sums of part, then d a_param."""
    n_parts, n = part.shape
    width = tail.shape[1]
    out = torch.empty(n + width, device=part.device, dtype=torch.float32)
    # Narrow column blocks, tall row blocks: enough programs and bytes in flight when P is large
    # (4096 rows at chunk 8, L = 32768); 128-column blocks took 0.15 ms there on the H200.
    block_n = 32
    launch(sum_partials_kernel, (cdiv(n + width, block_n),), part, tail, out, a_param, n_parts,
           n, width, BLOCK_P=min(128, next_power_of_2(n_parts)), BLOCK_N=block_n, num_warps=4)
    return out


def refuse_double_backward(mixer: str) -> None:
    """The kernels' gradients are not themselves differentiable: with create_graph=True the
    engine runs backward in grad mode, and second-order terms would be dropped without a word."""
    if torch.is_grad_enabled():
        raise RuntimeError(f"{mixer}: the Triton backends do not support double backward "
                           "(create_graph=True, e.g. a gradient penalty); use "
                           "backend='reference_chunked' for that")


def fp32_contiguous(p: torch.Tensor) -> torch.Tensor:
    """A parameter as a contiguous, aligned FP32 tensor: itself when it is one (no op)."""
    if p.dtype == torch.float32:
        return aligned(p)
    return p.float().contiguous()


def rows_of(spent: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """A [rows, cols] FP32 buffer: the front of a spent FP32 buffer when it is large enough
    (no allocation, no peak memory), else a new one."""
    if spent.dtype == torch.float32 and spent.is_contiguous() and spent.numel() >= rows * cols:
        return spent.view(-1)[:rows * cols].view(rows, cols)
    return torch.empty(rows, cols, device=spent.device, dtype=torch.float32)


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (4 for the interpreter's CPU tensors)."""
    return _sm_count(device) if device.type == "cuda" else 4


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for host code: triton.cdiv is a JIT function whose Python call costs ~15 us."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (>= 1); host-side twin of triton.next_power_of_2 (~13 us)."""
    return 1 << max(0, int(n) - 1).bit_length()


class Launcher:
    """kernel[grid](*args, **meta), after the first call through the compiled kernel's own
    launcher: Triton's JIT path binds and keys every argument on every call, host time that the
    small shapes feel (scripts/host_overhead.py on the H200's host: 27.2 vs 14.1 us per launch).

    args are tensors and ints.  The cache key holds each int itself and each tensor's dtype, not
    its address: every pointer a kernel gets is 16-byte aligned (the Functions pass inputs
    through ``aligned``; buffers are fresh allocations or views at their start), which is the
    pointer specialisation Triton compiled for.  Keying the alignment cost ~0.6 us per tensor.
    A first call that returns no compiled kernel (a tracer such as dynamo ran it) caches
    nothing, so a later eager call compiles for real."""

    def __init__(self, interpreting: bool = INTERPRETING, device_index=None):
        self.interpreting = interpreting
        self.device_index = device_index or torch.cuda.current_device
        self.compiled: dict = {}

    def __call__(self, kernel, grid, *args, **meta):
        if self.interpreting:
            kernel[grid](*args, **meta)
            return
        key = (kernel, self.device_index(), arg_key(args),
               tuple(meta.items()))  # call sites pass constexprs in a fixed order
        entry = self.compiled.get(key)
        if entry is None:
            compiled = kernel[grid](*args, **meta)
            if compiled is not None:
                constexpr_names = kernel.arg_names[len(args):]
                self.compiled[key] = (compiled, [meta[name] for name in constexpr_names])
            return
        compiled, constexprs = entry
        compiled[tuple(grid) + (1,) * (3 - len(grid))](*args, *constexprs)


launch = Launcher()


def arg_key(args) -> tuple:
    """What a launch's cache entry is keyed on per argument: an int itself (Triton specialises
    on 1, divisibility by 16 and width), a tensor's dtype (its address is aligned, see launch)."""
    return tuple([a if a.__class__ is int else a.dtype for a in args])


def aligned(t: torch.Tensor) -> torch.Tensor:
    """t contiguous and at a 16-byte aligned address (a copy only when it is not): the kernels
    are compiled for aligned pointers (see launch)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def vector_width(width: int, wanted: int) -> int:
    """Channels per thread and load: `wanted` where it divides the width, else 1."""
    return wanted if width % wanted == 0 else 1


def tile_width(warps: int, vector: int) -> int:
    """Channels of a tile whose layout keeps the whole chunk of tokens in each thread."""
    return 32 * warps * vector


def row_stride_units(width: int, meta: dict) -> int:
    """The row_units argument of row_offsets: the width in units of the tile's vector V."""
    return width // meta["V"]


def dot_operand_dtype(dtype: torch.dtype) -> torch.dtype:
    """Operand dtype of tl.dot: x's own, except under the interpreter, whose BF16 dot is wrong."""
    if INTERPRETING:
        return torch.float32
    return dtype if dtype in (torch.bfloat16, torch.float16) else torch.float32


def dot_dtype(dtype: torch.dtype):
    """dot_operand_dtype as a Triton dtype."""
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16,
            torch.float32: tl.float32}[dot_operand_dtype(dtype)]


def _speed_up_interpreter_scan() -> None:
    """Triton's interpreter scans with a custom combine one element at a time in Python.  This
    replacement steps along the scan axis only, calling the same combine on whole slices in the
    same order (accumulated, current), so results are unchanged and tests run ~BN times faster."""
    import numpy as np
    from triton.runtime import interpreter

    ops = getattr(interpreter, "ScanOps", None)
    if ops is None or not hasattr(ops, "generic_scan"):
        return

    def generic_scan(self, input):
        data = [np.moveaxis(arg.handle.data, self.axis, 0) for arg in input]
        out = [np.empty_like(d) for d in data]
        acc = None
        for i in range(data[0].shape[0]):
            cur = tuple(self.to_tensor(d[i], input[j].dtype) for j, d in enumerate(data))
            if acc is None:
                acc = cur
            else:
                ret = self.combine_fn.fn(*acc, *cur)
                acc = ret if isinstance(ret, tuple) else (ret,)
            for j, o in enumerate(out):
                o[i] = np.asarray(acc[j].handle.data).reshape(o[i].shape)
        return [self.to_tensor(np.moveaxis(o, 0, self.axis), input[j].dtype)
                for j, o in enumerate(out)]

    ops.generic_scan = generic_scan


if INTERPRETING:
    _speed_up_interpreter_scan()

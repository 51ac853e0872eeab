"""Probe: RG-LRU's forward output pass with the gate products on chip, against the gemm family.

One program per (batch row, span of chunks, head, block of BN output channels) loads its
[bw, BN] slices of Wx and Wa once, then walks its span chunk by chunk: the head's x tile
[T, bw] through tl.dot into both gates' pre-activations, the gates, a scan over the chunk with
each thread holding one channel's T tokens (the program's own x and y are addressed with an
unspecialised row stride, as samu's scan kernels do, so no scan crosses threads), and the state
carried to the next chunk in registers.  It is the pass a fused forward would run twice (summary,
then output), so its time against the gemm family's whole forward (gate GEMM, summary, carry,
output) says whether keeping G on chip can win.  Results: docs/PERFORMANCE.md.

    python scripts/probe_fused_gates.py inspect            # registers and SASS per setting (any machine)
    python scripts/probe_fused_gates.py check              # against the float64 oracle (GPU, or
                                                           # TRITON_INTERPRET=1 in FP32 on a CPU)
    python scripts/probe_fused_gates.py time [--ncu]       # GPU time beside the gemm forward
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from samu import functional  # noqa: E402
from samu.experiment import protocol  # noqa: E402
from samu.ops.common.launching import cdiv, next_power_of_2  # noqa: E402
from samu.ops.common.math import sigmoid_fast, softplus, to_element, transition  # noqa: E402
from samu.ops.common.scan import affine_combine, last_row  # noqa: E402
from samu.ops.rglru.naive import rglru_reference  # noqa: E402

# (T tokens per chunk, BN channels per program, warps, spans per batch row)
SETTINGS = [(16, 32, 1, 32), (16, 64, 2, 128), (32, 64, 2, 32), (16, 128, 4, 32),
            (32, 128, 4, 32)]


@triton.jit(do_not_specialize=["row_units"])  # as samu's scan kernels: see below
def fused_output_kernel(x_ptr, wx_ptr, wa_ptr, y_ptr, bx_ptr, ba_ptr, a_param_ptr, h_in_ptr, L,
                        NSPAN, SPAN, row_units, D: tl.constexpr, BW: tl.constexpr,
                        T: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid = tl.program_id(0)
    head = tl.program_id(1)
    b = (pid // NSPAN).to(tl.int64)
    span = pid % NSPAN
    inputs = tl.arange(0, BK)
    input_ok = inputs < BW
    own = tl.program_id(2) * BN + tl.arange(0, BN)
    cols = head * BW + own
    w_at = head * BW * BW + inputs[:, None] * BW + own[None, :]
    wx = tl.load(wx_ptr + w_at, mask=input_ok[:, None], other=0.0)
    wa = tl.load(wa_ptr + w_at, mask=input_ok[:, None], other=0.0)
    bx = tl.load(bx_ptr + cols)
    ba = tl.load(ba_ptr + cols)
    sp = softplus(tl.load(a_param_ptr + cols))
    h = tl.load(h_in_ptr + (b * NSPAN + span) * D + cols)
    tr = tl.arange(0, T)
    for c in range(SPAN):
        rows = (span * SPAN + c) * T + tr
        row_ok = rows < L
        head_tile = (b * L + rows.to(tl.int64)) * D + head * BW
        xt = tl.load(x_ptr + head_tile[:, None] + inputs[None, :],
                     mask=row_ok[:, None] & input_ok[None, :], other=0.0)
        gx = sigmoid_fast(tl.dot(xt, wx) + bx[None, :])
        ga = sigmoid_fast(tl.dot(xt, wa) + ba[None, :])
        # row_units is unspecialised (a D divisible by 16 would otherwise be specialised and
        # the rows' alignment known): each thread then holds all T tokens of its channel
        row = (b * L + rows.to(tl.int64)) * row_units
        x_own = tl.load(x_ptr + row[:, None] + cols[None, :], mask=row_ok[:, None],
                        other=0.0).to(tl.float32)
        log_a = tl.where(row_ok[:, None], -8.0 * ga * sp[None, :], 0.0)
        a, m, _ = transition(log_a, (rows == 0)[:, None])
        p, hs = tl.associative_scan((a, m * gx * x_own), 0, affine_combine)
        hs = hs + p * h[None, :]
        tl.store(y_ptr + row[:, None] + cols[None, :], to_element(hs, y_ptr),
                 mask=row_ok[:, None])
        h = last_row(hs, tr, T)


def launcher(x, wx, wa, bx, ba, a_param, T, BN, warps, spans):
    """(y, a zero-argument launch) for one setting; h_in = 0 at each span (the timing does not
    depend on it; check runs one span per row, where that is the true entering state)."""
    B, L, D = x.shape
    H, bw, _ = wx.shape
    per_span = cdiv(cdiv(L, T), spans)
    spans = cdiv(cdiv(L, T), per_span)
    y = torch.empty_like(x)
    h_in = torch.zeros(B, spans, D, device=x.device)
    grid = (B * spans, H, bw // BN)

    def go():
        return fused_output_kernel[grid](x, wx, wa, y, bx, ba, a_param, h_in, L, spans, per_span, D,
                                  D=D, BW=bw, T=T, BN=BN, BK=next_power_of_2(bw),
                                  num_warps=warps)
    return y, go


def parameters(D, H, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    bw = D // H
    wx, wa = [(torch.randn(H, bw, bw, generator=gen) / bw ** 0.5).to(device) for _ in range(2)]
    bx, ba, a_param = [(torch.randn(D, generator=gen) * s).to(device) for s in (0.1, 0.1, 1.0)]
    return wx, bx, wa, ba, a_param


def check(device):
    """Max error against the float64 oracle, one span per row (so h_in = 0 is exact)."""
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    dtype = torch.float32 if interpreting else torch.bfloat16  # the interpreter's tl.dot
    shapes = [(2, 70, 64, 2)] if interpreting else [(1, 1000, 2048, 16)]
    settings = [(16, 32, 1), (32, 16, 1)] if interpreting else [s[:3] for s in SETTINGS]
    for B, L, D, H in shapes:
        wx, bx, wa, ba, a_param = parameters(D, H, device)
        x = torch.randn(B, L, D, generator=torch.Generator().manual_seed(1)).to(device, dtype)
        want = rglru_reference(x.double(), wx.double(), bx.double(), wa.double(), ba.double(),
                               a_param.double()).float()
        for T, BN, warps in settings:
            y, go = launcher(x, wx.to(dtype), wa.to(dtype), bx, ba, a_param, T, BN, warps, 1)
            go()
            err = (y.float() - want).abs().max().item()
            print(f"check {(B, L, D)} heads={H} T={T} BN={BN} warps={warps}: max |error| "
                  f"{err:.3e} (max |y| {want.abs().max().item():.2f})", flush=True)


def _compiled(kernel) -> str:
    """Registers and shuffles of the kernel as this machine's JIT compiled it."""
    try:
        sass = kernel.asm["sass"]
    except Exception:  # no disassembler here
        return f"{kernel.n_regs} registers"
    return f"{kernel.n_regs} registers, {sass.count('SHFL')} SHFL, {sass.count('LDS')} LDS"


def _ms(value) -> str:
    return "not captured" if value is None else f"{value:.4f} ms"


def time(ncu: bool):
    for B, L, D in [(1, 32768, 2048), (4, 2048, 2048)]:
        H = 16
        wx, bx, wa, ba, a_param = parameters(D, H, "cuda")
        x = torch.randn(B, L, D, device="cuda").bfloat16()
        floor = protocol.floor_ms((B, L, D), 4.22e12, bytes_per_element=4)
        print(f"{(B, L, D)}: forward floor (x read, y written) {floor:.4f} ms", flush=True)
        with torch.no_grad():
            for name in ("gemm_fused_hierarchical_chunk8", "gemm_fused_hierarchical_chunk16"):
                ms = protocol.graph_replay_time(
                    lambda: functional.rglru(x, wx, bx, wa, ba, a_param, backend=name), x.device)
                print(f"  {name} whole forward: {_ms(ms)}", flush=True)
        for T, BN, warps, spans in SETTINGS:
            _, go = launcher(x, wx.bfloat16(), wa.bfloat16(), bx, ba, a_param, T, BN, warps,
                             spans)
            print(f"  on-chip output pass T={T} BN={BN} warps={warps} spans/row={spans}: "
                  f"{_ms(protocol.graph_replay_time(go, x.device))}, {_compiled(go())}",
                  flush=True)
        if ncu and L == 32768:  # one launch of the first setting, for ncu --profile-from-start off
            _, go = launcher(x, wx.bfloat16(), wa.bfloat16(), bx, ba, a_param, *SETTINGS[0])
            go()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
            go()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()


def inspect():
    from scripts.inspect_kernels import compile_stats
    for T, BN, warps, _ in SETTINGS:
        regs, spills, ops, _, _ = compile_stats(
            fused_output_kernel, dict(D=2048, BW=128, T=T, BN=BN, BK=128), dict(num_warps=warps))
        print(f"T={T} BN={BN} warps={warps}: regs={regs} spill={spills} {ops}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("inspect", "check", "time"))
    parser.add_argument("--ncu", action="store_true")
    args = parser.parse_args()
    if args.mode == "inspect":
        inspect()
    elif args.mode == "check":
        check("cuda" if torch.cuda.is_available() else "cpu")
    else:
        time(args.ncu)


if __name__ == "__main__":
    main()

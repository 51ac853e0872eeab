"""Probe for the performance issue: how fast are SAMU's two simplest scan kernels (output: reads x,
writes y; reverse summary: reads dy) as the tile (T tokens x BD channels) and warps change?
With few warps and wide tiles the time axis of the tile lives in each thread's registers, so
tl.associative_scan needs no shared-memory exchange.  Prints achieved TB/s per configuration."""
import sys

import torch
import triton
from triton.testing import do_bench

from samu import kernels_samu as ks
from samu.scan_kernels import chunk_carry

B, L, D = (int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "1x32768x2048").split("x"))
dev = "cuda"
x = torch.randn(B, L, D, device=dev, dtype=torch.bfloat16)
y = torch.empty_like(x)
a_param = torch.randn(D, device=dev) * 0.1 - 2
log_temp = torch.zeros((), device=dev)
skip = torch.zeros((), device=dev)
r = torch.rand(B, L, device=dev)
g = torch.rand(B, L, device=dev)
print(f"shape {(B, L, D)}; bytes: output 4/elem, reverse summary 2/elem")
for T, BD, warps in [(16, 128, 4), (16, 128, 1), (16, 256, 1), (8, 256, 1), (8, 128, 1),
                     (32, 128, 1), (16, 64, 1), (16, 256, 2), (32, 64, 1), (64, 32, 1)]:
    nc = triton.cdiv(L, T)
    h_in = torch.zeros(B, nc, D, device=dev)
    end = torch.empty(B, nc, D, device=dev)
    grid = (B * nc, triton.cdiv(D, BD))
    try:
        t_out = do_bench(lambda: ks._samu_output_kernel[grid](
            x, y, r, g, h_in, a_param, log_temp, skip, L, D, nc, T=T, BD=BD, num_warps=warps),
            warmup=20, rep=100, return_mode="median")
        t_rev = do_bench(lambda: ks._samu_reverse_summary_kernel[grid](
            x, r, a_param, log_temp, end, L, D, nc, T=T, BD=BD, num_warps=warps),
            warmup=20, rep=100, return_mode="median")
    except Exception as exc:  # a configuration that does not compile is a finding too
        print(f"T={T:3d} BD={BD:4d} warps={warps}: {type(exc).__name__}: {str(exc)[:80]}")
        continue
    n = B * L * D
    print(f"T={T:3d} BD={BD:4d} warps={warps}: output {t_out*1e3:7.1f} us {4*n/t_out/1e9:5.2f} TB/s"
          f" | reverse summary {t_rev*1e3:7.1f} us {2*n/t_rev/1e9:5.2f} TB/s", flush=True)
dec = torch.rand(B, triton.cdiv(L, 16), D, device=dev)
t_carry = do_bench(lambda: chunk_carry(dec, end if end.shape == dec.shape else dec, False),
                   warmup=10, rep=50, return_mode="median")
print(f"carry over {triton.cdiv(L, 16)} chunks: {t_carry*1e3:.1f} us")

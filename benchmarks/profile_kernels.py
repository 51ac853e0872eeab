"""Per-kernel GPU time of one forward+backward per mixer and backend (torch.profiler), and the
host-side time of a tiny call, which bounds small shapes.  Usage: profile_kernels.py 1x32768x2048 ...

Each (shape, mixer, backend) is also a row of data/benchmarks/<gpu>/profile_kernels.jsonl
(samu.experiment.benchmark_rows), and each of its kernels a row with the kernel's name in its
configuration."""
import sys
import time

import torch

from samu import backends
from samu.experiment import benchmark_rows, legality, protocol

shapes = [tuple(map(int, s.split("x"))) for s in sys.argv[1:]] or [(1, 32768, 2048)]
table = benchmark_rows.BenchmarkRows("profile_kernels", "cuda")
for shape in shapes:
    for mixer in ("samu", "rglru"):
        for name in [n for n in backends.available(mixer) if backends.REGISTRY[mixer][n].kind == "triton"]:
            x, params, dy = legality.make_inputs(mixer, shape, "cuda")
            module = protocol.build_module(mixer, shape[2], name, "cuda")
            xg = x.detach().requires_grad_()
            for _ in range(3):
                protocol.sample(module, xg, dy, "forward_backward")
            total = 0
            lines = []
            step = lambda: protocol.sample(module, xg, dy, "forward_backward")  # noqa: E731
            for key, per, launches in protocol.kernel_times(step, 5):
                total += per
                lines.append(f"    {per:8.4f} ms  x{int(launches):<3d} {key[:70]}")
                table.add(mixer, benchmark_rows.configuration(mixer, name, kernel=key), shape,
                          {"gpu_time_ms": per, "launches": launches}, {"launches": "count"})
            t0 = time.perf_counter()
            wall = [protocol.sample(module, xg, dy, "forward_backward") for _ in range(5)]
            floor = protocol.floor_ms(shape, 4.22e12)
            print(f"{shape} {mixer} {name}: GPU kernel sum {total:.4f} ms, event fb median "
                  f"{sorted(wall)[2]:.4f} ms, floor {floor:.4f} ms")
            print("\n".join(lines[:12]), flush=True)
            table.add(mixer, benchmark_rows.configuration(mixer, name), shape,
                      {"kernel_sum_ms": total, "event_median_ms": sorted(wall)[2],
                       "floor_ms": floor})
print(table.summary())

"""The carry across chunks by each plan on a GPU (samu.ops.common.carry.CarryPlan): agreement of
the look-back (one earlier segment at a time, and WINDOWS at once) with the two-level carry over
repeated calls (normwise, FP32), then GPU time per call, replayed from a CUDA graph, by plan,
segment length and look-back window.

    python benchmarks/bench_carry.py                      # (1, 4096, 2048) and four more shapes
    python benchmarks/bench_carry.py 1x4096x2048 --calls=200

Shapes are (batch, chunks, width): chunk 8 at L = 32768 is 4096 chunks.  Both decay forms run:
SAMU's sums of r with a per-channel rate, and RG-LRU's per-channel decays; the chunk a third of
the way along each row holds a packed start.  The look-back plans cut every row into segments
(two_level_from=2), whatever its length.  Each agreement and each time is also a row of
data/benchmarks/<gpu>/bench_carry.jsonl (samu.experiment.benchmark_rows), its shape (batch, chunks,
width) and its mixer the one whose decay form ran."""
from __future__ import annotations

import dataclasses
import sys

import torch

from samu.experiment import benchmark_cli, benchmark_rows
from samu.ops.common import carry

SHAPES = ["1x4096x2048", "1x2048x2048", "1x4096x1024", "2x1024x3072", "1x1024x4096"]
SEGMENTS = (16, 32, 64, 128, 256)
WINDOWS = (0, 8, 32)  # CarryPlan.window: 0 reads one earlier segment per round trip


def plan_configuration(plan: carry.CarryPlan, **extra) -> dict:
    return {"plan": "look-back" if plan.lookback else "two-level", **dataclasses.asdict(plan),
            **extra}


def summaries(batch, n_chunks, width, scalar, device="cuda"):
    """(positional args, keywords) of chunk_carry over random summaries with slow decays."""
    end = torch.randn(batch, n_chunks, width, device=device)
    if scalar:
        r_sum = torch.rand(batch, n_chunks, device=device) * 0.02
        r_sum[:, n_chunks // 3] = float("inf")  # a packed start
        return (r_sum, end), dict(rate=torch.rand(width, device=device) * 2 + 0.01)
    decay = torch.rand(batch, n_chunks, width, device=device) * 0.02 + 0.98
    decay[:, n_chunks // 3] = 0.0
    return (decay, end), {}


def replay_ms(fn, calls_per_graph=10, graphs=5):
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls_per_graph):
            fn()
    graph.replay()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(graphs):
        start.record()
        graph.replay()
        stop.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(stop) / calls_per_graph)
    return best


def main(argv=None) -> int:
    parser = benchmark_cli.parser(__doc__)
    parser.add_argument("shapes", nargs="*", type=benchmark_cli.shape,
                        default=[benchmark_cli.shape(s) for s in SHAPES],
                        help=f"BATCHxCHUNKSxWIDTH ... (default: {' '.join(SHAPES)})")
    parser.add_argument("--calls", type=int, default=100, help="calls per CUDA graph")
    options = parser.parse_args(argv)
    benchmark_cli.require_cuda("bench_carry.py")
    calls = options.calls
    two_level = carry.CarryPlan()
    table = benchmark_rows.BenchmarkRows("bench_carry", "cuda")
    for batch, n_chunks, width in options.shapes:
        shape = {"batch": batch, "chunks": n_chunks, "width": width}
        for scalar in (True, False):
            mixer = "samu" if scalar else "rglru"  # sums of r are SAMU's, decays RG-LRU's
            args, extra = summaries(batch, n_chunks, width, scalar)
            line = f"({batch}, {n_chunks}, {width}) {'sums of r' if scalar else 'decays'}:"
            for reverse in (False, True):
                want = carry.chunk_carry(*args, reverse=reverse, plan=two_level, **extra)
                for window in WINDOWS:
                    plan = carry.CarryPlan(two_level_from=2, lookback=True, window=window)
                    worst = max(((carry.chunk_carry(*args, reverse=reverse, plan=plan, **extra)
                                  - want).norm() / want.norm()).item() for _ in range(calls))
                    line += (f" look-back/window {window} "
                             f"{'reverse' if reverse else 'forward'} worst {worst:.1e};")
                    table.add(mixer, plan_configuration(plan, reverse=reverse, calls=calls),
                              shape, {"worst_error": worst},
                              {"worst_error": "normwise relative error"})
            print(line, flush=True)
            ms = replay_ms(lambda: carry.chunk_carry(*args, reverse=False, plan=two_level,
                                                     **extra))
            table.add(mixer, plan_configuration(two_level), shape, {"gpu_time_ms": ms})
            times = [f"two-level {ms:.4f}"]
            for seg in SEGMENTS:
                for window in WINDOWS:
                    if n_chunks // seg < 2:
                        continue
                    plan = carry.CarryPlan(two_level_from=2, segment_chunks=seg, lookback=True,
                                           window=window)
                    ms = replay_ms(lambda: carry.chunk_carry(*args, reverse=False, plan=plan,
                                                             **extra))
                    times.append(f"look-back/{seg}/w{window} {ms:.4f}")
                    table.add(mixer, plan_configuration(plan), shape, {"gpu_time_ms": ms})
            print("    ms per call: " + "  ".join(times), flush=True)
    print(table.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The gemm RG-LRU family's memory against time: for each chunk, G saved, then G recomputed with
each workspace size: the GPU time of a forward+backward (CUDA-graph replay), its median (CUDA
events, host included) and its peak memory in SPEC's units (B L D BF16 elements).

    python benchmarks/rglru_workspace.py 1x32768x2048 4x2048x2048 --chunks 8 16

Recomputing, the heads run in groups whose G fits the workspace (samu.ops.rglru.gemm.GemmConfig):
2 units is one group of every head, smaller workspaces mean more groups, each a gate GEMM and
the kernels over its channels.  Each setting is a frozen configuration passed in as the
backend, so nothing global changes.  Prints one line per setting ("saved" in the workspace
column: G saved, one group), and appends each as a row of
data/benchmarks/<gpu>/rglru_workspace.jsonl (samu.experiment.benchmark_rows)."""
from __future__ import annotations

import argparse
import dataclasses

from samu.experiment import benchmark_cli, benchmark_rows, legality, protocol, sweep
from samu.experiment.pipeline import parse_shapes
from samu.ops.rglru import gemm

WORKSPACES = (0.25, 0.5, 1.0, 2.0)


def measure(config: gemm.GemmConfig, inputs, samples: int) -> dict:
    """The backend sweep's GPU time and median, and the peak memory of one forward+backward."""
    x, params, dy = inputs
    timing = sweep.time_backend("rglru", config, x, params, dy, samples)
    module, xg = protocol.module_with("rglru", config, x, params)
    memory = protocol.measure_memory(module, xg, dy)
    return {**timing, "peak_units": protocol.memory_units(memory["peak_allocated_delta_bytes"],
                                                          x.shape)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shapes", nargs="+", help="BxLxD shapes")
    parser.add_argument("--chunks", nargs="+", type=int, default=[8, 16])
    parser.add_argument("--workspaces", nargs="+", type=float, default=list(WORKSPACES))
    parser.add_argument("--samples", type=int, default=10)
    args = parser.parse_args(argv)
    device = benchmark_cli.kernel_device("rglru_workspace.py")
    table = benchmark_rows.BenchmarkRows("rglru_workspace", device)
    print(f"{'shape':>14} {'chunk':>5} {'workspace':>9} {'groups':>6} {'gpu ms':>8} "
          f"{'median ms':>9} {'peak units':>10}", flush=True)
    for shape in parse_shapes(args.shapes):
        inputs = legality.make_inputs("rglru", shape, device)
        for chunk in args.chunks:
            saved = next(c for c in gemm.CONFIGS if c.chunk == chunk and not c.recompute)
            configs = [saved] + [dataclasses.replace(saved, recompute=True, workspace_units=units)
                                 for units in args.workspaces]
            for config in configs:
                got = measure(config, inputs, args.samples)
                gpu = float("nan") if got["gpu_time_ms"] is None else got["gpu_time_ms"]
                units = f"{config.workspace_units:9.3f}" if config.recompute else f"{'saved':>9}"
                groups = 16 // config.heads_per_group(16)
                print(f"{'x'.join(map(str, shape)):>14} {chunk:5d} {units} "
                      f"{groups:6d} {gpu:8.3f} "
                      f"{got['median_ms']:9.3f} {got['peak_units']:10.2f}", flush=True)
                table.add("rglru", benchmark_rows.configuration("rglru", config, groups=groups),
                          shape, {"gpu_time_ms": got["gpu_time_ms"],
                                  "median_ms": got["median_ms"],
                                  "peak_units": got["peak_units"]},
                          {"peak_units": "B L D BF16 elements"})
        del inputs
    print(table.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

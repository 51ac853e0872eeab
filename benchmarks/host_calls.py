"""Count the host work of a Triton backend's forward+backward on any machine, GPU or not: every
kernel launch is replaced by nothing, the tensors live on the CPU, and cProfile counts the
Python calls, the calls into torch (built-in methods) and the launches of one call; the wall time
of the same stubbed call is printed beside them.  The counts are exact and repeat from run to
run; the wall time is this machine's, noisy, and not the GPU host's.

    python benchmarks/host_calls.py                      # every mixer at (1, 64, 256)
    python benchmarks/host_calls.py --width 2048 --length 128
    python benchmarks/host_calls.py --backends fused_controller_hierarchical_chunk8 \
        gemm_fused_hierarchical_chunk8                   # the chunk-8 backends of earlier counts

Run it with another tree's samu first on PYTHONPATH to compare two trees.  Each mixer's counts
are also a row of data/benchmarks/cpu/host_calls.jsonl (samu.experiment.benchmark_rows): the
tensors are the CPU's, whatever the machine.  The mixers are the registry's with Triton
kernels, each at its default backend (samu.backends.DEFAULTS)."""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

import samu
from samu import backends, dispatch, mixers
from samu.experiment import benchmark_cli, benchmark_rows, protocol
from samu.modules import NUM_HEADS
from samu.ops.common import launching


def counted_backends() -> dict[str, str]:
    """{mixer: its default backend} of every registered mixer with Triton kernels (the others
    have no launches to stub)."""
    return {m: backends.DEFAULTS[m] for m in mixers.names() if backends.kernel_families(m)}


class StubbedLaunches:
    """launching.launch replaced by a counter, and the Triton backends allowed on CPU tensors
    (nothing runs on them: every launch is stubbed)."""

    def __init__(self):
        self.launches = 0

    def __call__(self, kernel, grid, *args, **meta):
        self.launches += 1

    def __enter__(self):
        self._saved = launching.launch, dispatch._check_triton_input
        launching.launch = self
        dispatch._check_triton_input = lambda *args: None
        return self

    def __exit__(self, *exc):
        launching.launch, dispatch._check_triton_input = self._saved


def count(mixer: str, backend: str, shape: tuple[int, int, int], calls: int = 100,
          warmup: int = 20, repeats: int = 7) -> dict:
    module = protocol.build_module(mixer, shape[2], backend, "cpu")
    x = torch.randn(*shape, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)

    def step():
        x.grad = None
        module.zero_grad(set_to_none=True)
        module(x).backward(dy)

    with StubbedLaunches() as stub:
        for _ in range(warmup):
            step()
        stub.launches = 0
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(calls):
            step()
        profiler.disable()
        launches = stub.launches / calls
        stats = pstats.Stats(profiler).stats
        builtin = sum(entry[1] for key, entry in stats.items() if key[0] == "~")
        total = sum(entry[1] for entry in stats.values())
        best = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(calls):
                step()
            best.append((time.perf_counter() - start) / calls * 1e6)
    return {"python_calls": (total - builtin) / calls, "builtin_calls": builtin / calls,
            "launches": launches, "best_us": min(best)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=benchmark_cli.positive_int, default=256)
    parser.add_argument("--length", type=benchmark_cli.positive_int, default=64)
    parser.add_argument("--calls", type=benchmark_cli.positive_int, default=100,
                        help="calls counted and timed")
    parser.add_argument("--repeats", type=benchmark_cli.positive_int, default=7,
                        help="timings of --calls calls")
    parser.add_argument("--backends", nargs="+", default=None,
                        help="count these Triton backends alone, at most one a mixer "
                             "(default: every mixer with kernels at its default backend)")
    args = parser.parse_args(argv)
    counted = counted_backends()
    if args.backends:
        named = benchmark_cli.backends_named(
            parser, args.backends, {m: backends.matching(m) for m in counted}, every_mixer=False)
        several = {m: names for m, names in named.items() if len(names) > 1}
        if several:
            parser.error(f"--backends names several backends of one mixer: {several}")
        counted = {m: names[0] for m, names in named.items()}
    if not counted:
        parser.error(f"no mixer with Triton kernels to count: {backends.triton_unavailable()}")
    shape = (1, args.length, args.width)
    benchmark_cli.check_heads_divide(parser, NUM_HEADS, [shape], list(counted),
                                     source="the modules' head count")
    torch.set_num_threads(1)
    table = benchmark_rows.BenchmarkRows("host_calls", "cpu")
    print(f"samu from {samu.__file__}; shape {shape}; launches stubbed, CPU tensors")
    for mixer, backend in counted.items():
        c = count(mixer, backend, shape, args.calls, min(20, args.calls), args.repeats)
        print(f"{mixer} ({backend}): {c['python_calls']:.0f} Python calls, "
              f"{c['builtin_calls']:.0f} built-in calls, {c['launches']:.0f} launches per "
              f"forward+backward; best {c['best_us']:.1f} us of this machine's wall time",
              flush=True)
        config = benchmark_rows.configuration(mixer, backend, launches="stubbed")
        table.add(mixer, config, shape, c, {"python_calls": "count", "builtin_calls": "count",
                                            "launches": "count", "best_us": "us"})
    print(table.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

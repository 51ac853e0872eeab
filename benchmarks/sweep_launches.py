"""Sweep the launch settings of SAMU's scan kernels on a GPU: for each setting, the
forward+backward median (CUDA events, calibration's sampler) and its legality against the float64
oracle.

    python benchmarks/sweep_launches.py 1x32768x2048 1x8192x2560
    python benchmarks/sweep_launches.py 1x32768x2048 --backends=chunk8,chunk16 --roles=output
    python benchmarks/sweep_launches.py 1x32768x2048 --roles=backward --registers=96,128

--registers adds each setting with those register caps (Triton's maxnreg) beside it uncapped.

One kernel role at a time (warps, channels per thread) with the others at their defaults, for
every backend.  Each setting is a frozen
configuration passed in as the backend (samu.backends.from_config), so nothing global changes.
Prints one line per setting and the best per role, and appends each setting as a row of
data/benchmarks/<gpu>/sweep_launches.jsonl (samu.experiment.benchmark_rows); the winners become
the configurations' defaults in samu/ops/<mixer>/chunk.py by hand, with the figures in
docs/PERFORMANCE.md."""
from __future__ import annotations

import dataclasses
import itertools
import statistics
import sys
import time

import torch

from samu.experiment import benchmark_cli, benchmark_rows, legality, protocol
from samu.ops.samu import chunk as samu_chunk

# (warps, channels per thread)
SAMU_OPTIONS = [(1, 1), (2, 1), (4, 1), (2, 2), (1, 4), (2, 4), (2, 8)]


def kernel_ms(mixer, backend, inputs, reps=3):
    """GPU milliseconds per forward+backward of each kernel (torch.profiler): unlike the
    forward+backward median, free of the host's noise."""
    from torch.profiler import ProfilerActivity, profile
    x, params, dy = inputs
    module, xg = protocol.module_with(mixer, backend, x, params)
    protocol.sample(module, xg, dy, "forward_backward")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            protocol.sample(module, xg, dy, "forward_backward")
        torch.cuda.synchronize()
    return {e.key: e.device_time_total / reps / 1e3 for e in prof.key_averages()
            if e.device_time_total > 0}


def measure(mixer, backend, shape, inputs, want, eager):
    x, params, dy = inputs
    errs = legality.relative_errors(legality.outputs(mixer, backend, x, params, dy), want)
    legal = all(e <= legality.ERROR_FACTOR * eager[n] + legality.ERROR_SLACK
                for n, e in errs.items())
    samples = protocol.time_forward_backward(mixer, backend, x, params, dy, reps=15)
    kernels = kernel_ms(mixer, backend, inputs)
    times = ", ".join(f"{k} {v:.4f}" for k, v in sorted(kernels.items()))
    print(f"  {backend} kernels: {times}", flush=True)
    return statistics.median(samples), legal, max(errs.values())


def main(argv=None) -> int:
    parser = benchmark_cli.parser(__doc__)
    parser.add_argument("shapes", nargs="*", type=benchmark_cli.shape, default=[(1, 32768, 2048)],
                        help="BATCHxLENGTHxWIDTH ... (default: 1x32768x2048)")
    parser.add_argument("--backends", type=benchmark_cli.words, default=None,
                        help="endings of SAMU backend names to sweep (default: every one)")
    parser.add_argument("--roles", type=benchmark_cli.words, default=None,
                        help="kernel roles to sweep (default: every one)")
    parser.add_argument("--registers", type=lambda t: [int(c) for c in benchmark_cli.words(t)],
                        default=[],
                        help="register caps to add beside each uncapped setting")
    args = parser.parse_args(argv)
    benchmark_cli.require_cuda("sweep_launches.py")
    backends_wanted, roles_wanted = args.backends, args.roles
    caps = [None] + args.registers
    table = benchmark_rows.BenchmarkRows("sweep_launches", "cuda")
    bandwidth = protocol.copy_bandwidth("cuda")
    for shape in args.shapes:
        floor = protocol.floor_ms(shape, bandwidth)
        for mixer, module in (("samu", samu_chunk),):
            inputs = legality.make_inputs(mixer, shape, "cuda")
            want = legality.oracle(mixer, *inputs)
            eager = legality.relative_errors(
                legality.outputs(mixer, "reference_chunked", *inputs), want)
            results = []
            for config in module.CONFIGS:
                name = config.name
                if backends_wanted and not any(name.endswith(b) for b in backends_wanted):
                    continue
                for role in config.launches():
                    if roles_wanted and role not in roles_wanted:
                        continue
                    for (warps, vector), cap in itertools.product(SAMU_OPTIONS, caps):
                        launch = module.Launch(warps, vector, registers=cap)
                        tried = dataclasses.replace(config, **{role: launch})
                        key = (name, role, warps, vector) + ((cap,) if cap else ())
                        results.append((key, *_try(mixer, tried, shape, inputs, want, eager)))
                        median, legal, err = results[-1][1:]
                        table.add(mixer, benchmark_rows.configuration(mixer, tried, role=role),
                                  shape,
                                  {"median_ms": median, "times_floor": median / floor,
                                   "legal": legal, "max_error": err},
                                  {"times_floor": "ratio", "legal": "bool",
                                   "max_error": "relative error"})
            for key, median, legal, err in results:
                print(f"{shape} {mixer} {key}: {median:.4f} ms (x{median / floor:.1f} floor) "
                      f"legal={legal} max_err={err:.2e}", flush=True)
            ok = [r for r in results if r[2]]
            for role in roles_wanted or samu_chunk.CONFIGS[0].launches():
                best = min((r for r in ok if r[0][1] == role), key=lambda r: r[1])
                print(f"BEST {shape} samu {role}: {best[0]} {best[1]:.4f} ms")
            best = min(ok, key=lambda r: r[1])
            print(f"BEST {shape} {mixer}: {best[0]} {best[1]:.4f} ms", flush=True)
            del want, inputs
            torch.cuda.empty_cache()
    print(table.summary())
    return 0


def _try(mixer, backend, shape, inputs, want, eager):
    t0 = time.time()
    try:
        return measure(mixer, backend, shape, inputs, want, eager)
    except Exception as exc:  # a setting that does not compile or run is a finding too
        print(f"  {backend}: {type(exc).__name__}: {str(exc)[:120]} ({time.time() - t0:.0f}s)")
        return float("inf"), False, float("nan")


if __name__ == "__main__":
    sys.exit(main())

"""A backend's configuration against variants of it on a GPU: forward+backward GPU time replayed
from a CUDA graph, and with --legality each variant's errors against the float64 oracle.

    python benchmarks/compare_configs.py samu 1x32768x2048 4x2048x2048 --set partial_dx=True --legality
    python benchmarks/compare_configs.py samu 1x32768x2048 --backends=chunk8 \\
        --set "backward=Launch(2, 2, 128)" --set "carry=CarryPlan(lookback=True)"
    python benchmarks/compare_configs.py rglru 1x32768x2048 --set "carry=CarryPlan(lookback=True)"

Each --set is one variant: field=value of the backend's frozen configuration, the value a
Python expression over Launch (the mixer's), CarryPlan and Lookback (the single-pass
backends' look-back); several fields of one variant are separated by ";", e.g.
--set "chunk=8; lookback=Lookback(window=4)".  --legality adds every
configuration's legality and dx error against the float64 oracle (computed once per shape).
Variants are passed in as the backend (samu.backends.from_config): nothing registered changes.
Each (shape, backend, variant) is also a row of data/benchmarks/<gpu>/compare_configs.jsonl
(samu.experiment.benchmark_rows)."""
from __future__ import annotations

import dataclasses
import sys

import torch

from samu import backends
from samu.experiment import benchmark_cli, benchmark_rows, legality, protocol

variants = benchmark_cli.config_variants  # (label, {field: value}) of each --set


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    if "-h" in args or "--help" in args:
        print(__doc__)
        return 0
    if not args or args[-1] == "--set":  # no mixer, or a --set without its variant
        print(__doc__, file=sys.stderr)
        return 2
    benchmark_cli.require_cuda("compare_configs.py")
    mixer = args[0]
    settings = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    wanted = next((a.split("=", 1)[1].split(",") for a in args if a.startswith("--backends=")),
                  None)
    check = "--legality" in args
    shapes = [a for a in args[1:] if "x" in a and not a.startswith("--") and a not in settings]
    names = [n for n in backends.available(mixer) if backends.REGISTRY[mixer][n].kind == "triton"
             and (not wanted or any(n.endswith(w) for w in wanted))]
    table = benchmark_rows.BenchmarkRows("compare_configs", "cuda")
    for text in shapes:
        shape = tuple(map(int, text.split("x")))
        inputs = legality.make_inputs(mixer, shape, "cuda", seed=1)
        x, params, dy = inputs
        if check:  # the oracle and the eager reference's errors once per shape
            want = legality.oracle(mixer, *inputs)
            eager = legality.relative_errors(
                legality.outputs(mixer, "reference_chunked", *inputs), want)
        for name in names:
            registered = backends.REGISTRY[mixer][name].config
            row = []
            for label, change in [("registered", {})] + variants(mixer, settings):
                config = dataclasses.replace(registered, **change)
                module = protocol.build_module(mixer, shape[2], config, "cuda")
                xg = x.detach().requires_grad_()
                ms = min(protocol.graph_replay_ms(module, xg, dy) for _ in range(3))
                row.append(f"{label}: {ms:.4f} ms")
                values, units = {"gpu_time_ms": ms}, {}
                if check:
                    entry = legality.check_legality(mixer, config, want=want,
                                                    eager_errors=eager, inputs=inputs)
                    dx = entry["errors"].get("x")
                    row[-1] += (f" (legal {entry['legal']}, dx error {dx:.2e})" if dx is not None
                                else f" (legal False: {entry['reason']})")
                    values.update(legal=bool(entry["legal"]), dx_error=dx)
                    units.update(legal="bool", dx_error="relative error")
                table.add(mixer, benchmark_rows.configuration(mixer, config, variant=label),
                          shape, values, units)
                del module, xg
            print(f"{shape} {name}: " + "; ".join(row), flush=True)
        del x, dy, inputs
        torch.cuda.empty_cache()
    print(table.summary())


if __name__ == "__main__":
    sys.exit(main())

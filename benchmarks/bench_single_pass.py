"""Each single-pass kernel's GPU time replayed from a CUDA graph, and the bandwidth it achieves
beside the bytes counted from its code (docs/PERFORMANCE.md, "Single-pass scans"); the whole
forward+backward beside the floor and beside each mixer's default backend.

    python benchmarks/bench_single_pass.py                     # both mixers, both shapes
    python benchmarks/bench_single_pass.py samu 1x32768x2048   # one mixer, one shape
    python benchmarks/bench_single_pass.py rglru 4x2048x2048 --backends=chunk8

A kernel is timed alone: one eager call records its launches (samu.ops.common.launching.launch
patched), and a graph of the fill of its flags and its launch(es) is replayed. "counted" is the DRAM
traffic its code reads and writes (tensors of B L D elements, the FP32 rows it writes and reads from
memory, not the look-back's reads of rows just written, which L2 serves); "GB/s" is that over its
time, beside the copy rate (protocol.copy_bandwidth: the GPU's committed rate, else measured in the
run). Rows go to data/benchmarks/<gpu>/bench_single_pass.jsonl (samu.experiment.benchmark_rows). Off
a GPU the kernels run under Triton's interpreter at the shapes given and nothing is timed."""
from __future__ import annotations

import argparse
import sys

import torch

from samu import backends
from samu.experiment import benchmark_cli, benchmark_rows, legality, protocol
from samu.ops.common import launching
from samu.ops.common.sequences import sequence_args

DEFAULT_SHAPES = ["1x32768x2048", "4x2048x2048"]


def counted_bytes(mixer: str, chunk: int, shape, element: int = 2) -> dict[str, float]:
    """Bytes each kernel reads and writes in DRAM at this shape, from the code: x, y, dy, dx
    (and RG-LRU's G, dG: two values per element) of ``element`` bytes, FP32 rows [B, L/T, D]
    (4 / T bytes per element each), per-token FP32 values (r, g)."""
    batch, length, width = shape
    elements = batch * length * width
    rows = 4 * elements / chunk  # one FP32 [B, L/T, D] row set
    tokens = batch * length
    if mixer == "samu":
        return {"forward": 2 * element * elements + 2 * rows + 8 * tokens,  # x, y; end, incl
                # x, dy, dx; h_in; end, incl; d ctrl_weight (2), d softplus rows; r, g
                "backward": 3 * element * elements + 6 * rows + 8 * tokens,
                "sum_partials": 3 * rows}
    return {"gate_gemm": 3 * element * elements,  # x; G
            "forward": 4 * element * elements + 3 * rows,  # G, x, y; decay, end, incl
            # G, x, dy, dG, dx; h_in; decay, end, incl; d biases (2), d softplus rows
            "backward": 7 * element * elements + 7 * rows,
            "sum_partials": 3 * rows,
            "dx_gemm": 4 * element * elements,
            "dw_gemm": 3 * element * elements}


def recorded_launches(call):
    """(kernel, grid, args, meta) of each launch call() makes through launching.launch."""
    seen = []
    original = launching.launch

    def recording(kernel, grid, *args, **meta):
        seen.append((kernel, grid, args, meta))
        original(kernel, grid, *args, **meta)
    launching.launch = recording
    try:
        call()
    finally:
        launching.launch = original
    return seen


def replay_ms(launches, device) -> float | None:
    """GPU time of the launches (after zeroing the int32 flag words they take), from a graph."""
    words = [a for _, _, args, _ in launches for a in args
             if isinstance(a, torch.Tensor) and a.dtype == torch.int32]

    def step():
        for w in words:
            w.zero_()
        for kernel, grid, args, meta in launches:
            kernel[grid](*args, **meta)
    if device.type != "cuda":
        step()
        return None
    return protocol.graph_replay_time(step, device)


def launches_by_role(mixer, name, shape, device):
    """(the backend's configuration, x, {role: launches}) of one eager forward and backward: its
    single-pass kernels ("forward", "backward") and the partial sums ("sum_partials")."""
    config = backends.REGISTRY[mixer][name].config
    family = backends.family_of(mixer, config)
    x, params, dy = legality.make_inputs(mixer, shape, device, seed=1)
    params = list(params.values())
    sequences = sequence_args(x, None, None, False)
    residuals = []

    def forward():
        residuals[:] = family.forward(x, params, sequences, config)[2]
    forward_launches = recorded_launches(forward)
    backward_launches = recorded_launches(
        lambda: family.backward(x, params, residuals, dy, None, sequences, config))
    kernels = set(family.KERNELS.values())
    return config, x, {"forward": forward_launches,
                       "backward": [r for r in backward_launches if r[0] in kernels],
                       "sum_partials": [r for r in backward_launches if r[0] not in kernels]}


def kernel_rows(mixer, name, shape, device):
    """{role: GPU ms} of the backend's single-pass kernels and sum_partials, each alone."""
    _, _, by_role = launches_by_role(mixer, name, shape, device)
    return {role: replay_ms(launches, device) for role, launches in by_role.items()}


def parse_args(argv=None):
    """(mixers, shapes, backend words) from the command line: mixer names and BxLxD shapes in any
    order (every mixer and DEFAULT_SHAPES where none is given), --backends=WORD,... to keep the
    single-pass backends holding one of those words."""
    parser = benchmark_cli.parser(__doc__)
    parser.add_argument("targets", nargs="*", metavar="MIXER_OR_SHAPE",
                        help=f"mixers ({', '.join(backends.REGISTRY)}; default: every one) and "
                             f"shapes BATCHxLENGTHxWIDTH (default: {' '.join(DEFAULT_SHAPES)})")
    parser.add_argument("--backends", type=benchmark_cli.words, default=[],
                        help="words of the single-pass backend names to keep (default: all)")
    args = parser.parse_args(argv)
    mixers, shapes = [], []
    for word in args.targets:
        if word in backends.REGISTRY:
            mixers.append(word)
            continue
        try:
            shapes.append(benchmark_cli.shape(word))
        except argparse.ArgumentTypeError as exc:
            parser.error(f"{word!r} is neither a mixer ({', '.join(backends.REGISTRY)}) nor a "
                         f"shape: {exc}")
    return (mixers or list(backends.REGISTRY),
            shapes or [benchmark_cli.shape(s) for s in DEFAULT_SHAPES], args.backends)


def main(argv=None) -> int:
    mixers, shapes, wanted = parse_args(argv)
    device = benchmark_cli.kernel_device("bench_single_pass.py")
    names_of = {}
    for mixer in mixers:
        names_of[mixer] = [n for n in backends.matching(mixer, ["singlepass"])
                           if not wanted or n in backends.matching(mixer, wanted)]
        if not names_of[mixer]:
            raise SystemExit(f"no {mixer} single-pass backend matches {wanted}: "
                             f"{backends.matching(mixer, ['singlepass'])}")
    copy = protocol.copy_bandwidth(device)
    table = benchmark_rows.BenchmarkRows("bench_single_pass", device.type)
    for shape in shapes:
        for mixer in mixers:
            names = names_of[mixer]
            default = backends.DEFAULTS[mixer]
            for name in names + [default]:
                module = protocol.build_module(mixer, shape[2], name, device)
                x = legality.make_inputs(mixer, shape, device, seed=1)
                xg, dy = x[0].detach().requires_grad_(), x[2]
                total = protocol.graph_replay_ms(module, xg, dy)
                floor = protocol.floor_ms(shape, copy) if copy else None
                times = ({} if name == default else
                         kernel_rows(mixer, name, shape, device))
                counted = ({} if name == default else
                           counted_bytes(mixer, backends.REGISTRY[mixer][name].config.chunk,
                                         shape))
                print(f"{shape} {mixer} {name}: forward+backward "
                      + (f"{total:.4f} ms, {total / floor:.2f}x the floor" if total
                         else "not timed (no GPU)"), flush=True)
                table.add(mixer, benchmark_rows.configuration(mixer, name), shape,
                          {"gpu_time_ms": total, "floor_ms": floor})
                for role, ms in times.items():
                    moved = counted.get(role)
                    rate = moved / (ms * 1e-3) if ms and moved else None
                    share = f", {rate / copy:.0%} of copy" if rate and copy else ""
                    print(f"    {role:13s} " + (f"{ms:8.4f} ms" if ms else "   (untimed)")
                          + f"  counted {moved / 1e6:9.3f} MB"
                          + (f"  {rate / 1e9:7.0f} GB/s{share}" if rate else ""), flush=True)
                    table.add(mixer, benchmark_rows.configuration(mixer, name, kernel=role),
                              shape, {"gpu_time_ms": ms, "counted_bytes": moved,
                                      "bandwidth_gbps": rate / 1e9 if rate else None},
                              {"bandwidth_gbps": "GB/s"})
    print(table.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Per-kernel GPU time of one forward+backward per mixer and Triton backend (torch.profiler),
their sum beside the whole call's event-timed median and the floor.

    python benchmarks/profile_kernels.py 1x32768x2048 4x2048x2048 [--mixers samu]

Each (shape, mixer, backend) is also a row of data/benchmarks/<gpu>/profile_kernels.jsonl
(samu.experiment.benchmark_rows), and each of its kernels a row with the kernel's name in its
configuration."""
import sys

from samu import backends
from samu.experiment import benchmark_cli, benchmark_rows, legality, protocol


def main(argv=None) -> int:
    parser = benchmark_cli.parser(__doc__)
    parser.add_argument("shapes", nargs="*", type=benchmark_cli.shape, default=[(1, 32768, 2048)],
                        help="BATCHxLENGTHxWIDTH ... (default: 1x32768x2048)")
    benchmark_cli.add_mixers(parser)
    args = parser.parse_args(argv)
    benchmark_cli.require_cuda("profile_kernels.py", "profiles GPU kernels")
    shapes = args.shapes
    copy = protocol.copy_bandwidth("cuda")
    table = benchmark_rows.BenchmarkRows("profile_kernels", "cuda")
    for shape in shapes:
        for mixer in args.mixers:
            for name in backends.matching(mixer):
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
                wall = [protocol.sample(module, xg, dy, "forward_backward") for _ in range(5)]
                floor = protocol.floor_ms(shape, copy)
                print(f"{shape} {mixer} {name}: GPU kernel sum {total:.4f} ms, event fb median "
                      f"{sorted(wall)[2]:.4f} ms, floor {floor:.4f} ms")
                print("\n".join(lines[:12]), flush=True)
                table.add(mixer, benchmark_rows.configuration(mixer, name), shape,
                          {"kernel_sum_ms": total, "event_median_ms": sorted(wall)[2],
                           "floor_ms": floor})
    print(table.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())

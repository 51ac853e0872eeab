"""The host and GPU timeline of one protocol forward+backward sample (torch.profiler, CPU and
CUDA): when each top-level host operation and each kernel started and how long it ran, relative
to the sample's start.  Shows where the GPU waits for the host at small shapes.

    python benchmarks/host_timeline.py 4x2048x2048 [--mixer rglru]

The sample's totals (event time, kernels, their GPU time, the timeline's span) are also a row of
data/benchmarks/<gpu>/host_timeline.jsonl (samu.experiment.benchmark_rows)."""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from samu.experiment import benchmark_cli, benchmark_rows, legality, protocol


def main(argv=None) -> int:
    parser = benchmark_cli.parser(__doc__)
    parser.add_argument("shape", nargs="?", type=benchmark_cli.shape, default=(4, 2048, 2048),
                        help="BATCHxLENGTHxWIDTH (default: 4x2048x2048)")
    parser.add_argument("--mixer", type=benchmark_cli.mixer, default="samu")
    args = parser.parse_args(argv)
    benchmark_cli.require_cuda("host_timeline.py", "profiles a GPU call")
    shape, mixer = args.shape, args.mixer
    inputs = legality.make_inputs(mixer, shape, "cuda")
    module = protocol.build_module(mixer, shape[2], "auto", "cuda")
    x = inputs[0].detach().requires_grad_()
    for _ in range(5):
        protocol.sample(module, x, inputs[2], "forward_backward")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        event_ms = protocol.sample(module, x, inputs[2], "forward_backward")
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
              or e.cpu_parent is None]
    t0 = min(e.time_range.start for e in events)
    print(f"{shape} {mixer} ({module.last_backend}): event time {event_ms * 1e3:.0f} us")
    for e in sorted(events, key=lambda e: e.time_range.start):
        gpu = e.device_type == torch.autograd.DeviceType.CUDA
        print(f"{'GPU' if gpu else 'CPU'} {e.time_range.start - t0:8.1f} us  "
              f"{e.time_range.elapsed_us():7.1f} us  {e.name[:70]}")
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    table = benchmark_rows.BenchmarkRows("host_timeline", "cuda")
    table.add(mixer, benchmark_rows.configuration(mixer, module.last_backend), shape,
              {"event_time_us": event_ms * 1e3, "kernels": len(kernels),
               "kernel_time_us": sum(e.time_range.elapsed_us() for e in kernels),
               "span_us": max(e.time_range.end for e in events) - t0},
              {"kernels": "count"})
    print(table.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where the host time of one forward+backward goes (small shapes are bound by it): CPU time per
Triton launch through the JIT path, the compiled kernel's runner, its C launcher and the
library's launching.launch, per small torch op, and per whole forward / forward+backward call,
beside the GPU time of the same call.

    python benchmarks/host_overhead.py 4x2048x2048 [--mixers samu] [--profile] [--cprofile]
    python benchmarks/host_overhead.py 4x2048x2048 --backward

The per-launch, per-op and per-call figures are also rows of
data/benchmarks/<gpu>/host_overhead.jsonl (samu.experiment.benchmark_rows)."""
import sys
import time

import torch
import triton

from samu.experiment import benchmark_cli, benchmark_rows, legality, protocol
from samu.ops.common import launching
from samu.ops.samu import chunk as samu_chunk


def cpu_us(fn, n=200, synchronise_each=False):
    """Host microseconds per call of fn: without synchronising, the CPU's enqueue time while the
    GPU keeps up; synchronising after each call, the wall time of a call."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
        if synchronise_each:
            torch.cuda.synchronize()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def output_kernel_launch(shape, device):
    """(kernel, grid, args, T, meta, flags) of one launch of SAMU's output kernel at ``shape``,
    every state keyword off: what the launch paths below are timed on."""
    B, L, D = shape
    x = torch.randn(shape, device=device, dtype=torch.bfloat16)
    y = torch.full_like(x, float("nan"))
    T = 8
    nc = triton.cdiv(L, T)
    r = torch.rand(B, L, device=device)
    g = torch.rand(B, L, device=device)
    h_in = torch.zeros(B, nc, D, device=device)
    p = torch.zeros(D, device=device)
    s = torch.zeros((), device=device)
    meta = samu_chunk.SamuConfig(T).output.tile(D, T)
    grid = (B * nc, triton.cdiv(D, meta["BD"]))
    # r_sum, end (WALKED_CARRY), seq, h0, resets and final (the state keywords) are not read
    # with those flags off; any tensor will do.  The order is the kernel's signature's.
    args = (x, y, r, g, h_in, s, s, p, s, s, s, s, s, L, D, nc, B, D // meta["V"])
    flags = dict(PACKED=False, HAS_INITIAL=False, HAS_FINAL=False, HAS_RESETS=False,
                 WALKED_CARRY=False)
    return samu_chunk._samu_output_kernel, grid, args, T, meta, flags


def main(argv=None) -> int:
    parser = benchmark_cli.parser(__doc__)
    parser.add_argument("shape", nargs="?", type=benchmark_cli.shape, default=(4, 2048, 2048),
                        help="BATCHxLENGTHxWIDTH (default: 4x2048x2048)")
    benchmark_cli.add_mixers(parser)
    parser.add_argument("--profile", action="store_true",
                        help="torch.profiler's host functions of SAMU's forward+backward")
    parser.add_argument("--cprofile", action="store_true",
                        help="cProfile's Python frames of each mixer's forward+backward")
    parser.add_argument("--backward", action="store_true",
                        help="where a tiny-length backward's host wall time goes")
    options = parser.parse_args(argv)
    benchmark_cli.require_cuda("host_overhead.py", "times a GPU machine's host")
    shape = options.shape
    B, L, D = shape
    table = benchmark_rows.BenchmarkRows("host_overhead", "cuda")

    def launch_row(path, us):
        """A row of one launch of SAMU's output kernel by ``path``."""
        table.add("samu", {"kernel": "_samu_output_kernel", "launch_path": path}, shape,
                  {"host_us_per_launch": us}, {"host_us_per_launch": "us"})

    kernel, grid, args, T, meta, flags = output_kernel_launch(shape, "cuda")
    nc = triton.cdiv(L, T)
    h_in = torch.zeros(B, nc, D, device="cuda")  # the small ops below take these shapes
    p = torch.zeros(D, device="cuda")
    compiled = kernel[grid](*args, T=T, **meta, **flags)
    full = [*args, T, meta["BD"], meta["V"], *flags.values()]
    jit_us = cpu_us(lambda: kernel[grid](*args, T=T, **meta, **flags))
    launcher_us = cpu_us(lambda: compiled[(*grid, 1)](*full))
    print(f"{shape}: Triton launch via JIT {jit_us:.1f} us, "
          f"via compiled launcher {launcher_us:.1f} us")
    launch_row("JIT", jit_us)
    launch_row("compiled launcher", launcher_us)
    # The compiled kernel's runner looks the device and stream up and builds launch metadata on
    # every call; its C launcher itself takes them as arguments.
    try:
        compiled._init_handles()
        stream = torch.cuda.current_stream().cuda_stream
        g3 = (*grid, 1)
        run, function, packed = compiled.run, compiled.function, compiled.packed_metadata

        def direct():
            run(g3[0], g3[1], g3[2], stream, function, packed, None, None, None, *full)
        direct_us = cpu_us(direct)
        print(f"{shape}: compiled C launcher called directly {direct_us:.1f} us")
        launch_row("C launcher", direct_us)
    except Exception as exc:  # another Triton's launcher signature: not a result
        print(f"direct launcher call unavailable: {type(exc).__name__}: {exc}")
    launching.launch(kernel, grid, *args, T=T, **meta, **flags)  # compiles and caches
    library_us = cpu_us(lambda: launching.launch(kernel, grid, *args, T=T, **meta, **flags))
    print(f"{shape}: the library's launching.launch {library_us:.1f} us")
    launch_row("launching.launch", library_us)
    # One workspace per call against one allocation per buffer: SAMU's forward's FP32 buffers.
    buffers = samu_chunk._residual_shapes(B, L, D, nc) + ((B, nc, D),)
    sizes = [launching.carved_size([b]) for b in buffers]
    ops = {"torch.empty": cpu_us(lambda: torch.empty(B, nc, D, device='cuda')),
           "sum(0)": cpu_us(lambda: h_in.sum(0)),
           "float().contiguous()": cpu_us(lambda: p.float().contiguous()),
           f"{len(buffers)} x torch.empty": cpu_us(
               lambda: [torch.empty(b, device="cuda") for b in buffers]),
           f"torch.empty, carve into {len(buffers)}": cpu_us(
               lambda: launching.carve(torch.empty(launching.carved_size(buffers), device="cuda"),
                                       buffers)),
           f"torch.empty, split_with_sizes into {len(buffers)}": cpu_us(
               lambda: torch.empty(sum(sizes), device="cuda").split_with_sizes(sizes))}
    print(", ".join(f"{op} {us:.1f} us" for op, us in ops.items()))
    for op, us in ops.items():  # of no mixer: the op's own tensors are (B, L / 8, D) or (D,)
        table.add(None, {"op": op}, shape, {"host_us_per_call": us}, {"host_us_per_call": "us"})
    for mixer in options.mixers:
        inputs = legality.make_inputs(mixer, shape, "cuda")
        backend = protocol.build_module(mixer, D, "auto", "cuda")
        xg = inputs[0].detach().requires_grad_()
        dy = inputs[2]

        def forward():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return backend(xg)

        def forward_backward():
            forward().backward(dy)

        forward_us = cpu_us(forward, 50)
        gpu = protocol.time_forward_backward(mixer, backend.last_backend, *inputs, reps=11)
        forward_backward_us = cpu_us(forward_backward, 50)
        print(f"{mixer} ({backend.last_backend}): CPU per forward {forward_us:.0f} us, "
              f"per forward+backward {forward_backward_us:.0f} us; "
              f"event median forward+backward {sorted(gpu)[5] * 1e3:.0f} us")
        table.add(mixer, benchmark_rows.configuration(mixer, backend.last_backend), shape,
                  {"host_forward_us": forward_us, "host_forward_backward_us": forward_backward_us,
                   "event_median_forward_backward_us": sorted(gpu)[5] * 1e3})

    # At a tiny length the GPU work is negligible, so a synchronised call's wall time is host time.
    for mixer in options.mixers:
        tiny = (1, 128, D)
        inputs = legality.make_inputs(mixer, tiny, "cuda")
        module = protocol.build_module(mixer, D, "auto", "cuda")
        xg = inputs[0].detach().requires_grad_()

        def fwd():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return module(xg)

        def fwd_bwd():
            xg.grad = None
            module.zero_grad(set_to_none=True)
            fwd().backward(inputs[2])

        forward_wall = cpu_us(fwd, 100, synchronise_each=True)  # also sets module.last_backend
        walls = {"synchronised_forward_us": forward_wall,
                 "synchronised_forward_backward_us": cpu_us(fwd_bwd, 100, True),
                 "empty_synchronise_us": cpu_us(lambda: None, 100, True),
                 "protocol_sample_us": sorted(protocol.sample(module, xg, inputs[2],
                                                              "forward_backward")
                                              for _ in range(21))[10] * 1e3}
        print(f"{tiny} {mixer} ({module.last_backend}): host wall per synchronised forward "
              f"{forward_wall:.0f} us, forward+backward "
              f"{walls['synchronised_forward_backward_us']:.0f}"
              f" us, empty synchronise {walls['empty_synchronise_us']:.0f} us, "
              f"protocol sample {walls['protocol_sample_us']:.0f} us")
        table.add(mixer, benchmark_rows.configuration(mixer, module.last_backend), tiny, walls)
    print(table.summary())

    # The host functions that take the time, for the SAMU backend above.
    if options.profile:
        from torch.profiler import ProfilerActivity, profile
        inputs = legality.make_inputs("samu", shape, "cuda")
        module = protocol.build_module("samu", D, "auto", "cuda")
        xg = inputs[0].detach().requires_grad_()
        for _ in range(3):
            protocol.sample(module, xg, inputs[2], "forward_backward")
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(10):
                protocol.sample(module, xg, inputs[2], "forward_backward")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25,
                                        max_name_column_width=60))

    # The Python functions that take the host time (cProfile: every Python frame, unlike the above).
    if options.cprofile:
        import cProfile
        import pstats
        for mixer in options.mixers:
            inputs = legality.make_inputs(mixer, shape, "cuda")
            module = protocol.build_module(mixer, D, "auto", "cuda")
            xg = inputs[0].detach().requires_grad_()
            for _ in range(3):
                protocol.sample(module, xg, inputs[2], "forward_backward")
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(50):
                protocol.sample(module, xg, inputs[2], "forward_backward")
            profiler.disable()
            print(f"--- {mixer}: cProfile of 50 protocol forward+backward samples")
            pstats.Stats(profiler).sort_stats("tottime").print_stats(22)

    # Where a tiny-length backward's host wall time goes: Python frames (cProfile) against the wall.
    if options.backward:
        import cProfile
        import pstats
        for mixer in options.mixers:
            tiny = (1, 128, D)
            inputs = legality.make_inputs(mixer, tiny, "cuda")
            module = protocol.build_module(mixer, D, "auto", "cuda")
            xg = inputs[0].detach().requires_grad_()
            profiler = cProfile.Profile()
            wall = 0.0
            for i in range(60):
                xg.grad = None
                module.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    y = module(xg)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                if i >= 10:
                    profiler.enable()
                y.backward(inputs[2])
                if i >= 10:
                    profiler.disable()
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                if i >= 10:
                    wall += t1 - t0
            stats = pstats.Stats(profiler)
            print(f"--- {mixer} backward at {tiny}: host wall {wall / 50 * 1e6:.0f} us per call "
                  f"(profiled), Python frames {stats.total_tt / 50 * 1e6:.0f} us")
            stats.sort_stats("tottime").print_stats(12)
    return 0


if __name__ == "__main__":
    sys.exit(main())

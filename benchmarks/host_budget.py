"""Where a small shape's host time goes, piece by piece, on a GPU machine: a synchronised
forward+backward at a length where the GPU work is negligible, against

  null      a do-nothing autograd.Function with the same inputs (x and the mixer's parameters):
            the autograd engine's own cost (graph, device thread hand-off, AccumulateGrad);
  stubbed   the mixer with every Triton launch replaced by nothing: samu's Python per call;
  real      the mixer as the protocol runs it;
  backward  the time inside the Function's backward body, against the whole y.backward();
  interleaved  rounds of the Linear, the mixer, the mixer with its launches through the
            general launcher instead of its bound sites (launching.Site), and the mixer with its
            input checks run on every call (no signature remembered), one after another, so
            that the host's drift between runs (a Linear's time varies 2x from run to run on
            the H200's host) does not decide the ratio.

    python benchmarks/host_budget.py [--width 2048] [--length 128] [--mixer samu]
    python benchmarks/host_budget.py --backends=auto,singlepass   # the default and the single pass

Each mixer's figures are also a row of data/benchmarks/<gpu>/host_budget.jsonl
(samu.experiment.benchmark_rows); a row names the backend asked for ("auto": the calibrated
default, which the host-cost figure draws) and the one that ran."""
from __future__ import annotations

import argparse
import time

import torch

from samu import backends, functional
from samu.experiment import benchmark_cli, benchmark_rows, legality, protocol
from samu.mixers import MIXERS
from samu.ops.common import launching
from samu.ops.common.function import FamilyFunction

# The mixers with Triton kernel families: their autograd Function (every family's), whose
# forward and backward bodies the run times.
KERNEL_MIXERS = [mixer for mixer in MIXERS if backends.kernel_families(mixer)]
ROUNDS = 7  # interleaved rounds of the Linear and the mixer (median of their medians)


def backends_asked(mixer: str, words: list[str]) -> list[str]:
    """'auto' where asked, then the mixer's Triton backends whose names hold one of the other
    words (backends.matching), each once."""
    names = ["auto"] if "auto" in words else []
    others = [w for w in words if w != "auto"]
    return names + (backends.matching(mixer, others) if others else [])


def wall_us(fn, n: int = 200):
    """Median host wall time of fn() followed by a synchronise, in microseconds."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - t0)
    return sorted(samples)[n // 2] * 1e6


def profile_calls(fn, title: str, calls: int = 50, top: int = 25) -> None:
    """The functions with the most own time over ``calls`` synchronised calls of fn, per call
    (cProfile's own overhead included: read the ranking, not the sum)."""
    import cProfile
    import pstats
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        fn()
        torch.cuda.synchronize()
    profile.disable()
    stats = pstats.Stats(profile).stats
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    print(f"  {title}: own time per call (us), calls per call, function")
    for (path, line, name), (_, count, own, _, _) in rows:
        print(f"    {own / calls * 1e6:8.1f} {count / calls:6.1f}  {path.rsplit('/', 2)[-1]}:"
              f"{line} {name}")


class Null(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, *params):
        ctx.save_for_backward(x, *params)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, dy):
        x, *params = ctx.saved_tensors
        return (torch.empty_like(x), *(torch.empty_like(p) for p in params))


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=2048, help="D (default 2048)")
    parser.add_argument("--length", type=int, default=128, help="L (default 128)")
    parser.add_argument("--profile", action="store_true",
                        help="also print each mixer's costliest functions (cProfile, stubbed "
                             "and live)")
    parser.add_argument("--mixer", choices=KERNEL_MIXERS, action="append",
                        help="only this mixer (repeatable; default every one)")
    parser.add_argument("--backends", type=lambda s: [w for w in s.split(",") if w],
                        default=["auto"],
                        help="comma-separated: 'auto' (the calibrated default) and words of "
                             "Triton backend names, each backend matching one timed "
                             "(default: auto)")
    args = parser.parse_args(argv)
    asked = {mixer: backends_asked(mixer, args.backends) for mixer in args.mixer or KERNEL_MIXERS}
    empty_mixers = [mixer for mixer, names in asked.items() if not names]
    if empty_mixers:
        parser.error(f"no backend of {empty_mixers} matches {args.backends}")
    benchmark_cli.require_cuda("host_budget.py", "times a GPU machine's host")
    shape = (1, args.length, args.width)
    table = benchmark_rows.BenchmarkRows("host_budget", "cuda")
    empty = wall_us(lambda: None)
    print(f"shape {shape}; empty synchronise {empty:.1f} us")
    table.add(None, {"operation": "empty synchronise"}, shape, {"host_wall_us": empty})
    # The yardstick of the host targets, in the same run: a Linear's forward+backward.
    linear = torch.nn.Linear(args.width, args.width, device="cuda")
    xl = torch.randn(shape, device="cuda", requires_grad=True)
    dyl = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

    def linear_fb():
        xl.grad = None
        linear.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = linear(xl)
        y.backward(dyl)
    linear_us = wall_us(linear_fb)
    print(f"torch.nn.Linear({args.width}, {args.width}) forward+backward {linear_us:.0f} us")
    table.add(None, {"operation": "torch.nn.Linear forward+backward"}, shape,
              {"host_wall_us": linear_us})
    for mixer, backend in [(m, b) for m, names in asked.items() for b in names]:
        inputs = legality.make_inputs(mixer, shape, "cuda")
        if backend != "auto":  # a named backend is timed only where it is legal at the shape
            check = legality.check_legality(mixer, backend, inputs=inputs)
            if not check["legal"]:
                print(f"{mixer} {backend}: not timed, illegal at {shape} ({check['reason']})",
                      flush=True)
                continue
        module = protocol.build_module(mixer, args.width, backend, "cuda")
        x = inputs[0].detach().requires_grad_()
        dy = inputs[2]
        params = [p for _, p in module.named_parameters()]

        def null_fb():
            x.grad = None
            module.zero_grad(set_to_none=True)
            Null.apply(x, *params).backward(dy)

        def protocol_fb():
            protocol.sample(module, x, dy, "forward_backward")

        def forward_only():
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                module(x)

        real = wall_us(protocol_fb)
        fwd = wall_us(forward_only)
        # Interleaved rounds, so that the host's drift falls on all three alike: the Linear,
        # the mixer, and the mixer with its launches through the general launcher (launch
        # wrapped, so that every launching.Site takes the keyed path).
        real_launch = launching.launch

        def general_launcher(kernel, grid, *a, **k):
            real_launch(kernel, grid, *a, **k)

        rounds = {"linear": [], "sites": [], "general": [], "checked": []}
        for _ in range(ROUNDS):
            rounds["linear"].append(wall_us(linear_fb, n=60))
            rounds["sites"].append(wall_us(protocol_fb, n=60))
            launching.launch = general_launcher
            try:
                rounds["general"].append(wall_us(protocol_fb, n=60))
            finally:
                launching.launch = real_launch
            with functional.checks_on_every_call():
                rounds["checked"].append(wall_us(protocol_fb, n=60))
        paired = {k: sorted(v)[len(v) // 2] for k, v in rounds.items()}
        # One instrumented forward+backward: the module call, the Function's forward and
        # backward bodies, the engine's whole y.backward(), and the launches inside them.
        function = FamilyFunction
        spans = {k: [] for k in ("module call", "forward body", "y.backward()", "backward body",
                                 "launches")}
        counts = []
        original = {"forward": function.forward, "backward": function.backward,
                    "launch": launching.launch}
        launch_time = [0.0, 0]

        def timed(name, fn):
            def wrapper(*a, **k):
                t0 = time.perf_counter()
                out = fn(*a, **k)
                spans[name].append(time.perf_counter() - t0)
                return out
            return wrapper

        def timed_launch(*a, **k):
            t0 = time.perf_counter()
            original["launch"](*a, **k)
            launch_time[0] += time.perf_counter() - t0
            launch_time[1] += 1
        function.forward = staticmethod(timed("forward body", original["forward"]))
        function.backward = staticmethod(timed("backward body", original["backward"]))
        launching.launch = timed_launch
        try:
            for _ in range(110):
                x.grad = None
                module.zero_grad(set_to_none=True)
                launch_time[:] = [0.0, 0]
                t0 = time.perf_counter()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    y = module(x)
                spans["module call"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                y.backward(dy)
                spans["y.backward()"].append(time.perf_counter() - t0)
                spans["launches"].append(launch_time[0])
                counts.append(launch_time[1])
                torch.cuda.synchronize()
        finally:
            function.forward = original["forward"]
            function.backward = original["backward"]
            launching.launch = original["launch"]
        median = {k: sorted(v[10:])[len(v[10:]) // 2] * 1e6 for k, v in spans.items()}
        breakdown = ", ".join(f"{k} {v:.0f} us" for k, v in median.items())
        # Every launch replaced by nothing: the Python around the launches.
        original_launch = launching.launch
        stub = lambda kernel, grid, *a, **k: None  # noqa: E731
        launching.launch = stub
        try:
            stubbed = wall_us(protocol_fb)
            if args.profile:
                profile_calls(protocol_fb, f"{mixer}, launches stubbed")
        finally:
            launching.launch = original_launch
        if args.profile:
            profile_calls(protocol_fb, f"{mixer}, launches live")
        null = wall_us(null_fb)
        print(f"{mixer} ({module.last_backend}): protocol forward+backward {real:.0f} us, "
              f"no-grad forward {fwd:.0f} us, launches stubbed {stubbed:.0f} us, "
              f"null Function {null:.0f} us", flush=True)
        print(f"    medians per forward+backward, no synchronise inside: {breakdown}; "
              f"{counts[-1]} launches; protocol over the Linear {real / linear_us:.2f}x",
              flush=True)
        print(f"    interleaved ({ROUNDS} rounds): Linear {paired['linear']:.0f} us, {mixer} "
              f"{paired['sites']:.0f} us ({paired['sites'] / paired['linear']:.2f}x), launches "
              f"through the general launcher {paired['general']:.0f} us "
              f"({paired['general'] / paired['linear']:.2f}x), every call's checks run "
              f"{paired['checked']:.0f} us ({paired['checked'] / paired['linear']:.2f}x)",
              flush=True)
        values = {"protocol_forward_backward_us": real, "no_grad_forward_us": fwd,
                  "launches_stubbed_us": stubbed, "null_function_us": null,
                  **{k.replace(".", "_").replace("()", "").replace(" ", "_") + "_us": v
                     for k, v in median.items()},
                  "launch_count": counts[-1], "over_linear": real / linear_us,
                  "interleaved_linear_us": paired["linear"],
                  "interleaved_forward_backward_us": paired["sites"],
                  "interleaved_general_launcher_us": paired["general"],
                  "interleaved_checked_every_call_us": paired["checked"],
                  "interleaved_over_linear": paired["sites"] / paired["linear"]}
        configuration = benchmark_rows.configuration(mixer, module.last_backend, asked=backend)
        table.add(mixer, configuration, shape,
                  values, {"launch_count": "count", "over_linear": "ratio",
                           "interleaved_over_linear": "ratio"})
    print(table.summary())


if __name__ == "__main__":
    main()

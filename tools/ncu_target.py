"""One forward+backward of a mixer backend between cudaProfilerStart/Stop, after warm-up, for
Nsight Compute:

    ncu --profile-from-start off ... python tools/ncu_target.py samu 1x32768x2048 \\
        fused_controller_hierarchical_chunk8

It needs a CUDA device."""
from __future__ import annotations

import argparse

from samu import backends
from samu.experiment import benchmark_cli


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python tools/ncu_target.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mixer", type=benchmark_cli.mixer,
                        help=f"the mixer: {', '.join(backends.REGISTRY)}")
    parser.add_argument("shape", type=benchmark_cli.shape,
                        help="BATCHxLENGTHxWIDTH of x, e.g. 1x32768x2048")
    parser.add_argument("backend", help="one of the mixer's backends "
                                        "(samu.backends.available(mixer))")
    args = parser.parse_args(argv)
    known = backends.available(args.mixer)
    if args.backend not in known:
        parser.error(f"unknown backend {args.backend!r} of {args.mixer}; choose one of "
                     f"{', '.join(known)}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    benchmark_cli.require_cuda("tools/ncu_target.py", "profiles GPU kernels")
    import torch

    from samu.experiment import legality, protocol
    x, params, dy = legality.make_inputs(args.mixer, args.shape, "cuda")
    module = protocol.build_module(args.mixer, args.shape[2], args.backend, "cuda")
    xg = x.detach().requires_grad_()
    for _ in range(2):
        protocol.sample(module, xg, dy, "forward_backward")
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    protocol.sample(module, xg, dy, "forward_backward")
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()

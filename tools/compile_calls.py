"""Compile, for the H200 (sm_90, 132 SMs) with the Triton installed here, every kernel launch a
backend's forward and backward make at given shapes, on any machine, GPU or not: the calls go
through the backend's own host code, and each launch is compiled (Triton's warmup) instead of
run.  Triton specialises an int argument equal to 1 into a constant, so a one-chunk call or a
one-token one compiles code that longer calls never do; its compiler can fail there where
Triton's interpreter, which compiles nothing, passes (tools/inspect_kernels.py compiles each
kernel unspecialised, at its launch settings).  Such a failure can belong to one Triton: run it
with the GPU's (the H200 ran Triton 3.6, whose failure at one chunk 3.9 does not have).

    python tools/compile_calls.py                            # every Triton backend, SHAPES
    python tools/compile_calls.py samu --backends=singlepass 1x5x48

Each shape runs plain and, for a single batch row, with an initial state, two packed sequences,
a final state and resets.  Run it without TRITON_INTERPRET; it exits 1 naming every call that
failed to compile."""
from __future__ import annotations

import argparse
import os
import sys

# Calls whose ints Triton specialises to 1 (one token, one chunk of 8 or 16, one channel block)
# beside a chunk and a token, a partial channel block, RecurrentGemma's ten heads and a width
# whose single-pass exchange is split.
SHAPES = ("1x1x32", "2x5x48", "1x16x512", "2x17x40", "1x40x2560", "1x16x20480")
TARGET = ("cuda", 90, 32)
# The H200's (and the H100 SXM's) streaming multiprocessors: the single-pass families split their
# exchange into a launch of its own past one channel block an SM (Lookback.phases), so the calls
# compile the phases the GPU runs (20480 channels: 160 blocks of 128, the split).
TARGET_SMS = 132


class CompileOnlyDriver:
    """Triton's active driver for compiling without a GPU: device 0, stream 0, the target."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget
        return GPUTarget(*TARGET)


def compiling_launches(compiled: list):
    """A stand-in for samu.ops.common.launching.launch that compiles each launch and runs none."""
    def launch(kernel, grid, *args, **meta):
        kernel.warmup(*args, grid=grid, **meta)
        compiled.append(kernel.fn.__name__)
    return launch


def stateful_keywords(shape):
    """(initial_state, cu_seqlens, resets, d_final) of a one-row call: two sequences where the
    row has two tokens or more, resets at its first token and its last."""
    import torch
    batch, length, width = shape
    cuts = [0, length] if length < 2 else [0, 1, length]
    count = len(cuts) - 1
    resets = torch.zeros(batch, length, dtype=torch.bool)
    resets[0, [0, length - 1]] = True
    return (torch.zeros(count, width), torch.tensor(cuts, dtype=torch.int32), resets,
            torch.zeros(count, width))


def head_count(mixer: str, width: int) -> dict:
    """RG-LRU's gate blocks: ten (RecurrentGemma's) where they divide the width, else 16, 8 ..."""
    if mixer != "rglru":
        return {}
    return {"num_heads": next(h for h in (10, 16, 8, 4, 2, 1) if width % h == 0)}


def compile_call(mixer: str, name: str, shape, stateful: bool) -> list[str]:
    """The kernels one forward+backward of backend ``name`` compiles at ``shape``."""
    from samu import backends
    from samu.experiment import legality
    from samu.ops.common import launching
    from samu.ops.common.sequences import sequence_args

    config = backends.REGISTRY[mixer][name].config
    family = backends.family_of(mixer, config)
    x, params, dy = legality.make_inputs(mixer, shape, "cpu", seed=1,
                                         **head_count(mixer, shape[2]))
    params = list(params.values())
    h0 = cu = resets = d_final = None
    if stateful:
        h0, cu, resets, d_final = stateful_keywords(shape)
    sequences = sequence_args(x, h0, cu, stateful, resets)
    compiled = []
    original = launching.launch
    launching.launch = compiling_launches(compiled)
    try:
        _, _, residuals = family.forward(x, params, sequences, config)
        family.backward(x, params, residuals, dy, d_final, sequences, config)
    finally:
        launching.launch = original
    return compiled


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*", help="mixers and BATCHxLENGTHxWIDTH shapes")
    parser.add_argument("--backends", type=lambda s: [w for w in s.split(",") if w], default=[],
                        help="words of backend names (default: every Triton backend)")
    args = parser.parse_intermixed_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        parser.error("TRITON_INTERPRET=1 compiles nothing: run without it")
    from triton.runtime.driver import driver
    from samu import backends
    from samu.shapes import Shape

    mixers = [t for t in args.targets if t in backends.REGISTRY]
    try:
        shapes = [Shape.parse(t) for t in args.targets if t not in backends.REGISTRY]
    except ValueError as exc:
        parser.error(f"{exc} (or name a mixer: {list(backends.REGISTRY)})")
    shapes = shapes or [Shape.parse(s) for s in SHAPES]
    chosen = {mixer: backends.matching(mixer, args.backends)
              for mixer in mixers or list(backends.REGISTRY)}
    if not any(chosen.values()):
        parser.error(f"no Triton backend matches {args.backends}")
    import triton
    from samu.ops.common import single_pass
    driver.set_active(CompileOnlyDriver())
    single_pass.sm_count = lambda device: TARGET_SMS  # the GPU's, not the CPU tensors' 4
    print(f"Triton {triton.__version__}, target {TARGET[0]} sm_{TARGET[1]}, {TARGET_SMS} SMs",
          flush=True)
    failed = []
    for mixer, names in chosen.items():
        for name in names:
            for shape in shapes:
                for stateful in (False, True) if shape[0] == 1 else (False,):
                    label = f"{mixer} {name} {shape.key}" + (
                        " with state, packing and resets" if stateful else "")
                    try:
                        kernels = compile_call(mixer, name, shape, stateful)
                    except Exception as exc:  # the compiler's error is the result
                        last = (str(exc).strip().splitlines() or [""])[-1]
                        failed.append(label)
                        print(f"{label}: FAILED ({type(exc).__name__}: {last[:200]})",
                              flush=True)
                        continue
                    print(f"{label}: compiled {len(kernels)} launches", flush=True)
    if failed:
        print(f"{len(failed)} calls failed to compile: " + "; ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

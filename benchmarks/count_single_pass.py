"""The single-pass kernels counted before they are timed, on any machine (docs/PERFORMANCE.md,
"Single-pass scans"): each kernel compiled for the H200 (sm_90a, tools/inspect_kernels.py's
compiler) at its registered launch, its registers, spills, SASS instructions per element (every
instruction once, over the T x V values a thread holds) and those of one look-back round (the
largest loop), the programs an SM holds, its loops that hold a CTA barrier (only the exchange's
sum may), and its grid against the 132 SMs at each default shape (samu.experiment.pipeline.GPU_SHAPES).

    python benchmarks/count_single_pass.py                 # both mixers, D = 2048, 16 heads
    python benchmarks/count_single_pass.py --width 2560 --heads 10
    python benchmarks/count_single_pass.py --mixers samu --set "lookback=Lookback(window=4)" \
        --set "backward=Launch(4, 1, 128)"                  # variants, as compare_configs.py times them

Each --set is a variant of every single-pass backend of the mixers given (compare_configs.py's
syntax: benchmark_cli.config_variants); the registered launches are counted first.  A variant
that splits the exchange (lookback=Lookback(split=True)) counts each kernel's two launches.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import inspect_kernels  # noqa: E402  (tools/ is no package)

from samu import backends, mixers  # noqa: E402
from samu.experiment.pipeline import GPU_SHAPES  # noqa: E402
from samu.ops.common.launching import cdiv  # noqa: E402
from samu.shapes import Shape  # noqa: E402

SMS = 132  # the H200's
REGISTERS_PER_SM = 65536
PROGRAMS_PER_SM = 32
# The int32 words of the tiles' flags and the reset mask's bytes (inspect_kernels types the
# rest).
POINTER_TYPES = {"flag_ptr": "*i32", "seq_ptr": "*i32", "reset_ptr": "*u8"}


_SIGNATURE = inspect_kernels.signature


def signature(fn, constexprs):
    sig = _SIGNATURE(fn, constexprs)
    return {**sig, **{n: t for n, t in POINTER_TYPES.items() if n in sig}}


def resident(registers: int, warps: int) -> int:
    """Programs an SM holds at this register count (allocated 8 at a time a thread)."""
    per_program = -(-registers // 8) * 8 * 32 * warps
    return min(PROGRAMS_PER_SM, REGISTERS_PER_SM // per_program)


def loops_with_barriers(instructions) -> int:
    """Loops whose body holds a CTA barrier.  A wait's loop must hold none: its warps poll
    apart and may leave it at different rounds (the exchange's sum, which every warp of the
    group's last tile runs alike, may)."""
    address = [a for a, _ in instructions]
    count = 0
    for i, (at, text) in enumerate(instructions):
        target = re.search(r"\bBRA\s+(?:`\()?(?:\.L_x_\d+|0x([0-9a-f]+))", text)
        if target and target.group(1) and int(target.group(1), 16) < at:
            body = instructions[address.index(int(target.group(1), 16)):i + 1]
            count += any(re.search(r"\bBAR\.", t) for _, t in body)  # not MEMBAR
    return count


def launch_plan(mixer: str, family, config, width: int, heads: int):
    """The family's launches of ``config`` at ``width``; a mixer with heads takes ``heads``."""
    if mixers.get(mixer).has_heads:
        return family.launch_plan(config, width, heads)
    return family.launch_plan(config, width)


def counts(mixer: str, width: int, heads: int, change: dict | None = None):
    """(backend, kernel, registers, spills, instructions per element, per look-back round,
    programs an SM holds, channels a tile, loops holding a barrier) of each single-pass
    kernel, its configuration's fields replaced by ``change``."""
    inspect_kernels.signature = signature
    for name in backends.available(mixer):
        if "singlepass" not in name.split("_"):
            continue
        config = dataclasses.replace(backends.REGISTRY[mixer][name].config, **(change or {}))
        family = backends.family_of(mixer, config)
        for kernel, constexprs, options in launch_plan(mixer, family, config, width, heads):
            regs, spills, _, _, instructions = inspect_kernels.compile_stats(
                kernel, constexprs, options, specialized_ints=("L", "NC"))
            values = constexprs["T"] * constexprs["V"]
            loops = inspect_kernels.loop_bodies(instructions)
            block = constexprs.get("BD", constexprs.get("BN"))
            phase = constexprs.get("PHASE", 0)  # a split exchange's two launches, apart
            label = kernel.fn.__name__ + (f" phase {phase}" if phase else "")
            yield (name, label, regs, spills, len(instructions) / values,
                   max(loops, default=0) / values, resident(regs, options["num_warps"]),
                   block, config.chunk, loops_with_barriers(instructions))


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    from samu.experiment.benchmark_cli import add_mixers, config_variants, positive_int
    parser.add_argument("--width", type=positive_int, default=2048)
    parser.add_argument("--heads", type=positive_int, default=16)
    add_mixers(parser)
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="a variant of each single-pass backend (compare_configs.py's --set)")
    args = parser.parse_args()
    if args.width % args.heads:
        parser.error(f"--heads {args.heads} does not divide --width {args.width}")
    if os.environ.get("TRITON_INTERPRET") == "1":  # its kernels are then not compiled
        parser.error("counts compiled kernels: run it without TRITON_INTERPRET=1")
    for mixer in args.mixers:
        for label, change in [("registered", {})] + config_variants(mixer, args.set):
            if args.set:
                print(f"{mixer}, {label}:")
            _print_counts(mixer, args.width, args.heads, change)


def _print_counts(mixer, width, heads, change):
    """Print counts() of one configuration, each kernel with its grid at the default shapes."""
    for name, kernel, regs, spills, per, per_round, held, block, chunk, barred in counts(
            mixer, width, heads, change):
        print(f"{name:32s} {kernel:32s} regs {regs:3d} spill {spills:4d} B  "
              f"{per:6.1f} instructions/element ({per_round:5.1f} a look-back round)  "
              f"{held} programs/SM, {block} channels a tile, {barred} loops with a "
              "barrier")
        grids = []
        for shape in map(Shape.parse, GPU_SHAPES):
            batch, length, d = shape
            tiles = batch * cdiv(length, chunk) * cdiv(d, block)
            grids.append(f"{shape.label}: {tiles} tiles = {tiles / (SMS * held):.1f} x "
                         f"{SMS * held} resident")
        print("    " + "; ".join(grids), flush=True)


if __name__ == "__main__":
    main()

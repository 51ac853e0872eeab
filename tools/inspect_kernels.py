"""Compile a kernel for the H200 (sm_90a) on any machine, GPU or not, and print what decides its
speed before any timing: the layouts Triton chose, registers, spills and the count of
shared-memory, barrier, shuffle and special-function instructions in its SASS.

    python tools/inspect_kernels.py samu                # every SAMU kernel at its launch configs
    python tools/inspect_kernels.py rglru --width 2560  # RG-LRU kernels at D = 2560 (bw = 160)
    python tools/inspect_kernels.py --ptx-digest out.txt  # one hash per kernel configuration

The digest compiles every kernel of every backend (and the shared carry and reduction kernels)
at widths 2048 and 2560 and hashes its PTX with debug line information removed: two trees whose
digests are equal compile to the same code.

A scan along the time axis whose layout keeps each channel's T tokens in one thread shows no
LDS/STS/BAR/SHFL: that is the layout the kernels aim for (docs/PERFORMANCE.md)."""
from __future__ import annotations

import argparse
import hashlib
import inspect
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from samu.ops.rglru import gemm as rglru_gemm
from samu.ops.samu import chunk as samu_chunk

# Each mixer's hierarchical kernel family, whose launch plans are compiled here.
KERNEL_MODULES = {"samu": samu_chunk, "rglru": rglru_gemm}

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
# Newer triton ships a second ptxas for the PTX versions its own compiler emits.
PTXAS = next(os.path.join(BIN, name) for name in ("ptxas-blackwell", "ptxas")
             if os.path.exists(os.path.join(BIN, name)))
SASS_OPS = ("LDG", "STG", "LDS", "STS", "BAR.SYNC", "SHFL", "MUFU", "HMMA", "HGMMA", "LDL", "STL")
BF16_ARGS = {"x_ptr", "y_ptr", "dy_ptr", "dx_ptr", "wx_ptr", "wa_ptr",  # RG-LRU gate weights too
             "g_ptr", "dg_ptr"}  # the gemm family's gate pre-activations


def signature(fn, constexprs):
    names = inspect.signature(fn.fn).parameters
    sig = {}
    for name in names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in ("seq_ptr", "status_ptr"):
            sig[name] = "*i32"
        elif name.endswith("_ptr"):
            sig[name] = "*bf16" if name in BF16_ARGS else "*fp32"
        else:
            sig[name] = "i32"
    return sig


def compile_for_h200(fn, constexprs, options, specialized_ints=("L", "D", "NC", "BW")):
    """options: Triton's compile options (num_warps, any maxnreg)."""
    sig = signature(fn, constexprs)
    names = list(sig)
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if sig[n].startswith("*") or (n in specialized_ints and sig[n] != "constexpr")}
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=dict(options))


def ptx_without_debug_lines(ptx: str) -> str:
    """PTX with .loc/.file lines and DWARF sections removed: they name source files and lines,
    which move when code moves without the kernel changing."""
    ptx = re.sub(r"^\s*\.section\s+\.debug_\w+\s*\{.*?^\s*\}", "", ptx, flags=re.S | re.M)
    return "\n".join(line for line in ptx.splitlines()
                     if not re.match(r"\s*\.(loc|file)\b", line))


def configurations():
    """(label, kernel, constexprs, compile options) of every kernel configuration the backends
    launch by default, and the look-back carry of CarryPlan(lookback=True), window 0 and 32."""
    from samu.ops.common import carry, reduce
    for width in (2048, 2560):
        for module in KERNEL_MODULES.values():
            for config in module.CONFIGS:
                for kernel, constexprs, options in module.launch_plan(config, width):
                    yield f"{width} {config.name}", kernel, constexprs, options
    for reverse in (False, True):
        for scalar in (False, True):
            for mode in (0, 1, 2):
                yield ("carry", carry.chunk_carry_kernel,
                       dict(REVERSE=reverse, SCALAR_DECAY=scalar, MODE=mode, BLOCK_C=64,
                            BLOCK_D=32), dict(num_warps=4))
            for window in (0, 32):  # one earlier segment per round trip, or 32 at once
                yield ("carry", carry.lookback_carry_kernel,
                       dict(REVERSE=reverse, SCALAR_DECAY=scalar, PUBLISH_EVERY=1, BLOCK_C=64,
                            BLOCK_D=32, WINDOW=window), dict(num_warps=4))
    yield ("sum_partials", reduce.sum_partials_kernel, dict(BLOCK_P=128, BLOCK_N=32),
           dict(num_warps=4))
    yield ("weight_partials", reduce.weight_partials_kernel,
           dict(BT=reduce.WEIGHT_TOKENS, BC=reduce.WEIGHT_CHANNELS), dict(num_warps=4))


def ptx_digest(path: str) -> None:
    lines = []
    for label, kernel, constexprs, options in configurations():
        ptx = ptx_without_debug_lines(compile_for_h200(kernel, constexprs, options).asm["ptx"])
        digest = hashlib.sha256(ptx.encode()).hexdigest()[:16]
        lines.append(f"{digest} {label} {kernel.fn.__name__} {options} {constexprs}")
        print(lines[-1], flush=True)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


SASS_LINE = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?);")


def sass_instructions(sass: str) -> list[tuple[int, str]]:
    """(address, instruction text) of every SASS instruction, in order."""
    return [(int(m.group(1), 16), m.group(2)) for m in map(SASS_LINE.match, sass.splitlines())
            if m]


def loop_bodies(instructions) -> list[int]:
    """Instruction counts of the loops: a branch back to an earlier address closes one (the
    trailing self-branch that pads a kernel is not a loop)."""
    address = [a for a, _ in instructions]
    bodies = []
    for i, (at, text) in enumerate(instructions):
        target = re.search(r"\bBRA\s+(?:`\()?(?:\.L_x_\d+|0x([0-9a-f]+))", text)
        if target and target.group(1) and int(target.group(1), 16) < at:
            start = address.index(int(target.group(1), 16))
            bodies.append(i - start + 1)
    return bodies


def per_element(instructions, elements_per_iteration: int, iterations: int) -> float:
    """Thread instructions per element of [B, L, D]: each loop body handles elements_per_iteration
    elements of a thread (T tokens x V channels) and runs `iterations` times per program (the
    D / BD channel blocks of a full-width kernel); what is outside the loops runs once per
    program.  Without loops the whole kernel is one iteration."""
    bodies = loop_bodies(instructions)
    inside = sum(bodies)
    outside = len(instructions) - inside
    if not bodies:
        return len(instructions) / elements_per_iteration
    return (inside + outside / iterations) / elements_per_iteration


def compile_stats(fn, constexprs, options, specialized_ints=("L", "D", "NC", "BW")):
    kernel = compile_for_h200(fn, constexprs, options, specialized_ints)
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "k.ptx")
        cubin = os.path.join(tmp, "k.cubin")
        with open(ptx, "w") as f:
            f.write(kernel.asm["ptx"])
        log = subprocess.run([PTXAS, "-arch=sm_90a", "-v", ptx, "-o", cubin],
                             capture_output=True, text=True, check=True).stderr
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", cubin],
                              capture_output=True, text=True, check=True).stdout
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    spills = int(re.search(r"(\d+) bytes spill stores", log).group(1))
    ops = {op: len(re.findall(r"\b" + re.escape(op) + r"[\s.]", sass)) for op in SASS_OPS}
    layouts = sorted(set(re.findall(r"#(?:blocked|mma)\d* = (.*)", kernel.asm["ttgir"])))
    return regs, spills, {k: v for k, v in ops.items() if v}, layouts, sass_instructions(sass)


def samu_per_element(instructions, constexprs, width: int) -> float | None:
    """per_element for a SAMU scan kernel's [T, BD] tiles (T x V values per thread); None for
    other kernels."""
    if not {"T", "BD", "V"} <= set(constexprs):
        return None
    iterations = -(-width // constexprs["BD"])
    return per_element(instructions, constexprs["T"] * constexprs["V"], iterations)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mixer", nargs="?", choices=list(KERNEL_MODULES))
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layouts", action="store_true", help="print the TTGIR layouts too")
    parser.add_argument("--features", action="store_true", help="compile with every state "
                        "keyword on (initial and final state, packed sequences)")
    parser.add_argument("--ptx-digest", metavar="FILE", help="write one PTX hash per kernel "
                        "configuration to FILE")
    args = parser.parse_args()
    if args.ptx_digest:
        ptx_digest(args.ptx_digest)
        return
    if args.mixer is None:
        parser.error("name a mixer, or pass --ptx-digest FILE")
    module = KERNEL_MODULES[args.mixer]
    for config in module.CONFIGS:
        name = config.name
        for kernel, constexprs, options in module.launch_plan(config, args.width,
                                                            features=args.features):
            regs, spills, ops, layouts, instructions = compile_stats(kernel, constexprs, options)
            counted = samu_per_element(instructions, constexprs, args.width)
            per = "" if counted is None else f" per_element={counted:.1f}"
            print(f"{name:42s} {kernel.fn.__name__:34s} {options} {constexprs} "
                  f"regs={regs} spill={spills} sass={len(instructions)} loops="
                  f"{loop_bodies(instructions)}{per} {ops}", flush=True)
            if args.layouts:
                for layout in layouts:
                    print("      ", layout)


if __name__ == "__main__":
    main()

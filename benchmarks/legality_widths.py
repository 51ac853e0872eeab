"""Every Triton backend against the float64 oracle (SPEC section 4) over model widths and RG-LRU
head counts, with and without state: each width in WIDTHS at every head count of HEADS that
divides it (RG-LRU's gate blocks; SAMU has none, so it runs once a width), once plain and once
with an initial state per sequence, packed sequences (a start inside a chunk and a one-token
sequence) and per-token resets.

    python benchmarks/legality_widths.py                          # every backend, every width
    python benchmarks/legality_widths.py --backends=singlepass    # names containing a word
    python benchmarks/legality_widths.py samu --widths=512,2560 --length=512

Each check is one row of data/benchmarks/<gpu>/legality_widths.jsonl
(samu.experiment.benchmark_rows): legal or not, the worst error over y and the gradients as a
share of its bound.  The run ends with status 1 when any backend was illegal.  Off a GPU the
kernels run under Triton's interpreter: give it small widths and lengths."""
from __future__ import annotations

import sys
import time

from samu import backends, mixers
from samu.experiment import benchmark_cli, benchmark_rows, legality

WIDTHS = (512, 640, 1024, 2048, 2560, 4096, 5120, 8192)
HEADS = (10, 16, 32)
STATEFUL_TOKENS = 8  # the least a row takes to hold the stateful check's four sequences


def state_case(batch: int, length: int, width: int, device) -> tuple[tuple, dict]:
    """(shape, state) of the stateful check: one row of ``batch * length`` tokens (at least 8)
    packed into four sequences (one starting inside a chunk, one of a single token), an initial
    state for each and resets at the row's first token, inside a chunk, on the fourth
    sequence's first and on the row's last but one."""
    tokens = batch * length
    if tokens < STATEFUL_TOKENS:
        raise ValueError(f"the stateful check packs four sequences: batch x length must be at "
                         f"least {STATEFUL_TOKENS} tokens, got {tokens}")
    quarter = tokens // 4
    cuts = [0, quarter + 3, quarter + 4, max(quarter + 5, tokens // 2), tokens]
    resets = [[0, tokens // 8 + 5, cuts[3], tokens - 2]]
    shape = (1, tokens, width)
    return shape, legality.make_state(shape, device, seed=width, cu_seqlens=cuts,
                                      resets=resets)


def head_counts(mixer: str, width: int, heads: list[int]) -> list[int | None]:
    """The head counts a width is checked at: those of ``heads`` that divide it for a mixer
    with heads, else once without (None)."""
    if not mixers.get(mixer).has_heads:
        return [None]
    return [h for h in heads if width % h == 0]


def worst_share(entry: dict) -> float | None:
    """The largest error / bound over y and the gradients (None when the backend did not run)."""
    bounds = entry.get("bounds") or {}
    shares = [e / bounds[n] for n, e in entry["errors"].items() if bounds.get(n)]
    return max(shares) if shares else None


def main(argv=None) -> int:
    parser = benchmark_cli.parser(__doc__)
    parser.add_argument("mixers", nargs="*", action=benchmark_cli.Distinct,
                        help="mixers (default: every one)")
    parser.add_argument("--backends", type=benchmark_cli.words,
                        default=[], help="words of backend names (default: every Triton one)")
    parser.add_argument("--widths", type=benchmark_cli.positive_ints, default=list(WIDTHS))
    parser.add_argument("--heads", type=benchmark_cli.positive_ints, default=list(HEADS))
    parser.add_argument("--batch", type=benchmark_cli.positive_int, default=2)
    parser.add_argument("--length", type=benchmark_cli.positive_int, default=2048)
    args = parser.parse_args(argv)
    unknown = [m for m in args.mixers if m not in backends.REGISTRY]
    if unknown:
        parser.error(f"unknown mixers {unknown}; choose from {list(backends.REGISTRY)}")
    if args.batch * args.length < STATEFUL_TOKENS:
        parser.error(f"--batch {args.batch} x --length {args.length} is under {STATEFUL_TOKENS} "
                     "tokens: the stateful check packs four sequences into them")
    # Every mixer's backends found before any runs: a later mixer's refusal writes no rows.
    chosen = {m: backends.matching(m, args.backends)
              for m in args.mixers or list(backends.REGISTRY)}
    bare = [m for m, names in chosen.items() if not names]
    if bare:
        parser.error(f"no backend of {bare} matches --backends {','.join(args.backends)}")
    idle = [w for w in args.backends if not any(backends.matching(m, [w]) for m in chosen)]
    if idle:  # a misspelt word beside a good one
        parser.error(f"--backends: {idle} match no backend of {list(chosen)}")
    device = benchmark_cli.kernel_device("legality_widths.py")
    table = benchmark_rows.BenchmarkRows("legality_widths", device.type)
    illegal = []
    for mixer, names in chosen.items():
        for width in args.widths:
            counts = head_counts(mixer, width, args.heads)
            if not counts:
                print(f"{mixer} width {width}: none of the head counts {args.heads} divides it, "
                      "skipped", flush=True)
            for heads in counts:
                for stateful in (False, True):
                    plain = (args.batch, args.length, width)
                    shape, state = (state_case(*plain, device) if stateful else (plain, None))
                    started = time.perf_counter()
                    inputs = legality.make_inputs(mixer, shape, device, seed=width,
                                                  **({"num_heads": heads} if heads else {}))
                    want = legality.oracle(mixer, *inputs, state)
                    eager = legality.relative_errors(
                        legality.outputs(mixer, "reference_chunked", *inputs, state), want)
                    for name in names:
                        entry = legality.check_legality(mixer, name, want=want,
                                                        eager_errors=eager, inputs=inputs,
                                                        state=state)
                        share = worst_share(entry)
                        label = (f"{mixer} {name} {shape}" + (f" heads {heads}" if heads else "")
                                 + (" state+packed+resets" if stateful else ""))
                        print(f"{label}: " + ("legal" if entry["legal"] else
                                              f"ILLEGAL ({entry['reason']})")
                              + (f", worst error {share:.2f} of its bound" if share is not None
                                 else ""), flush=True)
                        if not entry["legal"]:
                            illegal.append(label)
                        table.add(mixer, benchmark_rows.configuration(
                                      mixer, name, num_heads=heads, stateful=stateful), shape,
                                  {"legal": entry["legal"], "worst_error_share": share},
                                  {"legal": "bool", "worst_error_share": "of bound"})
                    print(f"  ({time.perf_counter() - started:.1f} s)", flush=True)
    print(table.summary())
    if illegal:
        print(f"{len(illegal)} illegal: " + "; ".join(illegal))
    return 1 if illegal else 0


if __name__ == "__main__":
    sys.exit(main())

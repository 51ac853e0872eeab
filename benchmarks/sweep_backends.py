"""Time every Triton backend at given shapes beside auto's choice (samu.experiment.sweep) and write
data/sweeps/<gpu>_<name>.json and data/figures/<gpu>_sweep_<name>.png.

    python benchmarks/sweep_backends.py --name outside 2x4096x3072 1x65536x1024
    python benchmarks/sweep_backends.py 1x16x32 --name tiny --mixers samu     # interpreter, CPU

Each (mixer, backend, shape) is also a row of data/benchmarks/<gpu>/sweep_backends.jsonl
(samu.experiment.benchmark_rows).

With no calibration entry for a shape, auto takes the choice calibrated at the nearest shape
(samu.dispatch.nearest_entry): at shapes outside the file, the figure shows how far that choice
is from the fastest backend."""
from __future__ import annotations

import argparse

from tqdm import tqdm

from samu import dispatch, mixers, paths
from samu.experiment import benchmark_cli, benchmark_rows, protocol, schema, sweep
from samu.modules import NUM_HEADS


def draw(doc: dict, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from samu.experiment import report
    swept = list(dict.fromkeys(r["mixer"] for r in doc["rows"]))
    key = "gpu_time_ms" if any(r["gpu_time_ms"] for r in doc["rows"]) else "median_ms"
    fig, axes = plt.subplots(1, len(swept), figsize=(7.5 * len(swept), 4.5), squeeze=False)
    for ax, mixer in zip(axes[0], swept):
        rows = [r for r in doc["rows"] if r["mixer"] == mixer and r[key] is not None]
        shapes = list(dict.fromkeys(tuple(r["shape"]) for r in rows))
        names = list(dict.fromkeys(r["backend"] for r in rows))
        width = 0.8 / max(1, len(names))
        for j, name in enumerate(names):
            for i, shape in enumerate(shapes):
                group = [r for r in rows if tuple(r["shape"]) == shape]
                best = min(r[key] for r in group)
                row = next((r for r in group if r["backend"] == name), None)
                if row is None:
                    continue
                ax.bar(i + j * width, row[key] / best, width, color=f"C{j}",
                       edgecolor="black" if row["auto"] else "none",
                       linewidth=2 if row["auto"] else 0,
                       label=name if i == 0 else None)
        ax.axhline(1.25, color="grey", linestyle="--", linewidth=1)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(shapes))],
                      ["x".join(map(str, s)) for s in shapes], rotation=20)
        ax.set_ylabel(f"{'GPU time' if key == 'gpu_time_ms' else 'median'} / fastest")
        ax.set_title(f"{mixers.LABELS.get(mixer, mixer)}: every backend (outlined: auto's "
                     "choice; dashed: 1.25x)")
        ax.legend(fontsize=7)
    fig.suptitle(f"{doc['environment']['gpu']}: backends beside auto")
    fig.tight_layout()
    report.save_figure(fig, path)
    plt.close(fig)


def line(row: dict) -> str:
    gpu, median = row["gpu_time_ms"], row["median_ms"]
    return (f"{'x'.join(map(str, row['shape'])):>14} {row['mixer']:5} {row['backend']:45} "
            f"gpu {float('nan') if gpu is None else gpu:8.3f} ms  median "
            f"{float('nan') if median is None else median:8.3f} ms"
            f"{'  <- auto' if row['auto'] else ''}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shapes", nargs="+", help="BxLxD shapes")
    parser.add_argument("--name", required=True, help="the sweep's name in its file names")
    benchmark_cli.add_mixers(parser)
    parser.add_argument("--samples", type=benchmark_cli.positive_int, default=5)
    parser.add_argument("--backends", nargs="+", help="only these backends (default: all)")
    parser.add_argument("--heads", type=benchmark_cli.positive_int, default=NUM_HEADS,
                        help=f"gate blocks of a mixer with heads (default {NUM_HEADS})")
    args = parser.parse_args(argv)
    offered = {m: sweep.triton_backends(m) for m in args.mixers}
    names = (benchmark_cli.backends_named(parser, args.backends, offered) if args.backends
             else offered)
    shapes = benchmark_cli.shapes_given(parser, args.shapes)
    benchmark_cli.check_heads_divide(parser, args.heads, shapes, args.mixers)
    device = benchmark_cli.kernel_device("sweep_backends.py")
    slug = dispatch.gpu_slug()
    source = dispatch.calibration_source(slug)
    calibrated = []
    if source.path.exists():
        calibrated = sorted(schema.read_json(source.path)["shapes"])
    key = "gpu_time_ms" if device.type == "cuda" else "median_ms"
    out = paths.DATA / "sweeps" / f"{slug}_{args.name}.json"
    rows = []
    table = benchmark_rows.BenchmarkRows("sweep_backends", device)
    work = sum(len(found) for found in names.values())
    with tqdm(total=work * len(shapes), desc="sweep") as bar:
        def progress(text):
            bar.set_postfix_str(text)
            bar.update()
        for shape in shapes:
            found = sweep.sweep_shape(shape, device, args.mixers, args.samples, names, progress,
                                      num_heads=args.heads)
            for row in found:
                bar.write(line(row))
                extra = {"num_heads": row["num_heads"]} if "num_heads" in row else {}
                config = benchmark_rows.configuration(row["mixer"], row["backend"],
                                                      sweep=args.name, **extra)
                values = {"gpu_time_ms": row["gpu_time_ms"], "median_ms": row["median_ms"],
                          "chosen_by_auto": row["auto"]}
                table.add(row["mixer"], config, row["shape"], values, {"chosen_by_auto": "bool"})
            rows += found
            # Written after every shape: a run cut short keeps what it measured.
            doc = {"environment": protocol.environment(),
                   "calibration": {"path": str(source.path.name), "shapes": calibrated},
                   "rows": rows, "auto": sweep.auto_ratios(rows, key)}
            schema.write_json_atomic(out, doc, kind="sweep")
    figure = paths.DATA / "figures" / f"{slug}_sweep_{args.name}.png"
    draw(doc, figure)
    print("wrote", out, "and", figure)
    print(table.summary())
    for row in doc["auto"]:
        ratio = row["auto_over_fastest"]
        print(f"{'x'.join(map(str, row['shape'])):>14} {row['mixer']:5} auto {row['auto']} / "
              f"fastest {row['fastest']}: "
              f"{'not timed' if ratio is None else f'{ratio:.3f}x'} ({key})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Time packed sequences, decode steps and torch.compile for every mixer (samu.experiment.features)
and write data/features/<gpu>.json and data/figures/<gpu>_features.png; each timing is also a row
of data/benchmarks/<gpu>/benchmark_features.jsonl (samu.experiment.benchmark_rows).

    python benchmarks/benchmark_features.py                      # the GPU configuration
    python benchmarks/benchmark_features.py --length 64 --width 32 --batches 1 2 --compile-shape 1 16 32
"""
from __future__ import annotations

import argparse

import torch
from tqdm import tqdm

from samu import dispatch, mixers, paths
from samu.experiment import benchmark_rows, features, protocol, schema


PACKING_VARIANTS = ("packed", "unpacked", "one_by_one", "with_states")


def draw(doc: dict, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from samu.experiment import report
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    names = mixers.LABELS
    ax = axes[0]
    variants = [v for v in PACKING_VARIANTS if v in doc["packing"][0]]
    on_gpu = doc["packing"][0]["packed"]["gpu_time_ms"] is not None
    key = "gpu_time_ms" if on_gpu else "forward_backward_median_ms"
    step = len(variants) + 1
    for i, row in enumerate(doc["packing"]):
        values = [row[v][key] for v in variants]
        ax.bar([i * step + k for k in range(len(variants))], values,
               color=[f"C{k}" for k in range(len(variants))])
    ax.set_xticks([i * step + (len(variants) - 1) / 2 for i in range(len(doc["packing"]))],
                  [names[r["mixer"]] for r in doc["packing"]])
    labels = {"packed": "packed (cu_seqlens)", "unpacked": "same tokens, one row",
              "one_by_one": "one call per sequence",
              "with_states": "one row, initial and final state"}
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=f"C{k}")
                       for k in range(len(variants))],
              labels=[labels[v] for v in variants], fontsize=8)
    shape = doc["packing"][0]["shape"]
    ax.set_title(f"{len(doc['packing'][0]['lengths'])} sequences, {shape[1]} tokens, D = "
                 f"{shape[2]}: {'GPU time' if on_gpu else 'median'} (ms)")
    ax = axes[1]
    for mixer in dict.fromkeys(r["mixer"] for r in doc["decode"]):
        rows = [r for r in doc["decode"] if r["mixer"] == mixer]
        ax.plot([r["batch"] for r in rows], [r["host_us_per_step"] for r in rows], "o-",
                label=f"{names[mixer]} host wall")
        if rows and rows[0]["gpu_us_per_step"] is not None:
            ax.plot([r["batch"] for r in rows], [r["gpu_us_per_step"] for r in rows], "s--",
                    label=f"{names[mixer]} GPU (CUDA graph)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch")
    ax.set_title("decode: microseconds per step")
    ax.legend()
    ax = axes[2]
    labels = ("eager_ms", "compiled_ms", "reduce_overhead_ms")
    for i, row in enumerate(doc["compile"]):
        ax.bar([i * 4 + k for k in range(3)], [row[k] for k in labels],
               color=["C0", "C1", "C2"])
    ax.set_xticks([i * 4 + 1 for i in range(len(doc["compile"]))],
                  [f"{names[r['mixer']]}\n{'x'.join(map(str, r['shape']))}"
                   for r in doc["compile"]])
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=f"C{k}") for k in range(3)],
              labels=["eager", "torch.compile", "reduce-overhead"])
    ax.set_title("block forward+backward median (ms)")
    fig.suptitle(f"{doc['environment']['gpu']}: state keywords, decode and torch.compile")
    fig.tight_layout()
    report.save_figure(fig, path)
    plt.close(fig)


def append_rows(doc: dict, width: int, table) -> None:
    """One row per packing variant, decode batch and compiled shape of ``doc``."""
    for row in doc["packing"]:
        for variant in [v for v in PACKING_VARIANTS if v in row]:
            config = benchmark_rows.configuration(row["mixer"], row["backend"], feature="packing",
                                                  variant=variant,
                                                  sequences=len(row["lengths"]))
            table.add(row["mixer"], config, row["shape"], row[variant])
    for row in doc["decode"]:  # a decode step is a call of length 1
        config = benchmark_rows.configuration(row["mixer"], row["backend"], feature="decode step")
        values = {k: row[k] for k in ("host_us_per_step", "gpu_us_per_step", "one_launch",
                                      "linear_forward_backward_us", "step_over_linear")}
        table.add(row["mixer"], config, (row["batch"], 1, width), values,
                  {"host_us_per_step": "us", "gpu_us_per_step": "us", "one_launch": "bool",
                   "step_over_linear": "ratio"})
    for row in doc["compile"]:
        config = benchmark_rows.configuration(row["mixer"], row["backend"],
                                              feature="residual block")
        values = {k: v for k, v in row.items() if k.endswith(("_ms", "_s"))}
        table.add(row["mixer"], config, row["shape"], values)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=32768)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--compile-shape", type=int, nargs=3, action="append",
                        help="B L D; repeatable (default on a GPU: 1 128 2048 and 4 2048 2048; "
                             "on a CPU: 1, at most 16 tokens of --length, --width)")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    compile_shapes = args.compile_shape or (
        [[1, 128, 2048], [4, 2048, 2048]] if device.type == "cuda"
        else [[1, min(args.length, 16), args.width]])
    slug = dispatch.gpu_slug()
    doc = {"environment": protocol.environment(), "packing": [], "decode": [], "compile": []}
    work = len(mixers.names()) * (1 + 1 + len(compile_shapes))
    with tqdm(total=work, desc="features") as bar:
        for mixer in mixers.names():
            bar.set_postfix_str(f"{mixer} packing")
            doc["packing"].append(features.time_packing(mixer, "auto", args.length, args.width,
                                                        device, count=args.sequences))
            bar.update()
            bar.set_postfix_str(f"{mixer} decode")
            for row in features.time_steps(mixer, "auto", args.width, args.batches, device):
                doc["decode"].append({"mixer": mixer, **row})
            bar.update()
            for shape in compile_shapes:
                bar.set_postfix_str(f"{mixer} compile {shape}")
                doc["compile"].append(features.time_compiled(mixer, "auto", tuple(shape),
                                                             device))
                bar.update()
    out = paths.DATA / "features" / f"{slug}.json"
    schema.write_json_atomic(out, doc, kind="features")
    figure = paths.DATA / "figures" / f"{slug}_features.png"
    draw(doc, figure)
    table = benchmark_rows.BenchmarkRows("benchmark_features", device)
    append_rows(doc, args.width, table)
    print("wrote", out, "and", figure)
    print(table.summary())
    for row in doc["packing"]:
        print(row["mixer"], {v: row[v] for v in PACKING_VARIANTS if v in row})
    for row in doc["decode"]:
        print(row)
    for row in doc["compile"]:
        print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

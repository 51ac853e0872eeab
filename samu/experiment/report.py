"""Combine per-shape result files, compare with the seed's H800 rows, and draw the figures."""
from __future__ import annotations

import statistics
from pathlib import Path

import pandas as pd

from ..shapes import Shape
from .. import paths
from . import protocol, schema

SHAPE_ORDER_KEY = lambda s: (s[1], s[2], s[0])  # noqa: E731  length, width, batch


def shape_of(row: dict) -> Shape:
    return Shape.of(row["shape"])


def load_shape_files(slug: str) -> list[dict]:
    folder = paths.results_dir(slug)
    docs = [schema.read_json(p) for p in sorted(folder.glob("*.json"))]
    for doc in docs:
        schema.validate(doc)
    return docs


def combine(slug: str) -> dict:
    """All per-shape files of one GPU in one schema-valid document, written atomically."""
    docs = load_shape_files(slug)
    if not docs:
        raise FileNotFoundError(f"no per-shape result files in {paths.results_dir(slug)}; run "
                                "notebook 03 (make reproduce) first")
    rows = [row for doc in docs for row in doc["rows"]]
    rows.sort(key=lambda r: (SHAPE_ORDER_KEY(shape_of(r)), r["architecture"]))
    combined = {
        "schema_version": schema.SCHEMA_VERSION,
        "protocol": docs[0]["protocol"],
        "environment": docs[-1]["environment"],
        "shape_environments": {shape_of(d["rows"][0]).key: d["environment"]
                               for d in docs},
        "rows": rows,
    }
    schema.write_json_atomic(paths.results_file(slug), combined)
    return combined


def seed_document() -> dict:
    return schema.read_json(paths.PUBLISHED_H800_FILE)


def frame(doc: dict, source: str) -> pd.DataFrame:
    """One line per row: times, memory in units of B*L*D BF16 elements, floor figures."""
    bandwidth = protocol.COPY_BANDWIDTH["nvidia-h200"]
    records = []
    for row in doc["rows"]:
        shape = shape_of(row)
        unit = 2 * shape[0] * shape[1] * shape[2]
        fb = row["forward_backward"]["median_ms"]
        floor = row.get("floor_ms", protocol.floor_ms(shape, bandwidth))
        records.append({
            "source": source, "shape": shape.label, "shape_tuple": shape,
            "mixer": row["architecture"], "backend": row["backend"],
            "forward_ms": row["forward"]["median_ms"],
            "backward_ms": row["backward"]["median_ms"],
            "forward_backward_ms": fb,
            "forward_backward_std_ms": row["forward_backward"]["std_ms"],
            "peak_allocated_delta_units": row["peak_allocated_delta_bytes"] / unit,
            "floor_ms": floor, "times_floor": fb / floor, "floor_fraction": floor / fb,
            "forward_times_floor": row["forward"]["median_ms"] / protocol.floor_ms(
                shape, bandwidth, protocol.FORWARD_FLOOR_BYTES_PER_ELEMENT),
            "achieved_TBps": protocol.FLOOR_BYTES_PER_ELEMENT * unit / 2 / (fb * 1e-3) / 1e12,
            "samples": row["forward_backward"]["samples_ms"],
        })
    df = pd.DataFrame.from_records(records)
    return df.sort_values(["shape_tuple", "mixer"], key=lambda c: c.map(
        lambda v: SHAPE_ORDER_KEY(v) if isinstance(v, tuple) else v)).reset_index(drop=True)


def speedups(df: pd.DataFrame) -> pd.DataFrame:
    """SAMU's forward+backward speedup over RG-LRU per shape and source, with its spread over
    every pair of samples (median, and the 10th-90th percentile of the pairwise ratios)."""
    out = []
    for (source, shape), grp in df.groupby(["source", "shape"], sort=False):
        by = {r.mixer: r for r in grp.itertuples()}
        if {"rglru", "samu"} <= set(by):
            ratios = sorted(a / b for a in by["rglru"].samples for b in by["samu"].samples)
            q = statistics.quantiles(ratios, n=10)
            out.append({"source": source, "shape": shape,
                        "speedup": by["rglru"].forward_backward_ms / by["samu"].forward_backward_ms,
                        "low": q[0], "high": q[-1]})
    return pd.DataFrame(out)


def summary_table(df: pd.DataFrame) -> pd.DataFrame:
    cols = ["source", "shape", "mixer", "backend", "forward_ms", "backward_ms",
            "forward_backward_ms", "times_floor", "achieved_TBps", "peak_allocated_delta_units"]
    return df[cols].round(4)


def seed_comparison(df: pd.DataFrame, seed_df: pd.DataFrame) -> pd.DataFrame:
    """This GPU's forward+backward medians beside the seed's H800 rows, shape by shape."""
    mine = df.set_index(["shape", "mixer"])["forward_backward_ms"]
    seed = seed_df.set_index(["shape", "mixer"])["forward_backward_ms"]
    both = pd.DataFrame({"seed_h800_ms": seed, "this_gpu_ms": mine}).dropna()
    both["faster_than_seed"] = both["seed_h800_ms"] / both["this_gpu_ms"]
    return both.reset_index()


def draw_figures(df: pd.DataFrame, seed_df: pd.DataFrame, slug: str) -> list[Path]:
    """Seaborn figures into data/figures/: time, speedup, memory, fraction of the floor."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook")
    folder = paths.figures_dir()
    folder.mkdir(parents=True, exist_ok=True)
    both = pd.concat([seed_df, df], ignore_index=True)
    both["series"] = both["source"] + " " + both["mixer"]
    written = []

    def save(fig, name):
        for ax_ in fig.axes:
            ax_.tick_params(axis="x", labelrotation=20)
        path = folder / f"{slug}_{name}.png"
        try:
            # The temporary's name does not end in .png, so the format is given.
            schema.atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120,
                                                              bbox_inches="tight"))
        finally:
            plt.close(fig)
        written.append(path)

    def bars(name, column, ylabel, title, log=False):
        fig, ax = plt.subplots(figsize=(9, 4.5))
        sns.barplot(data=both, x="shape", y=column, hue="series", ax=ax)
        if log:
            ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        save(fig, name)

    bars("time", "forward_backward_ms", "forward+backward median (ms, log)",
         "Complete mixer time per shape: this GPU beside the seed's H800", log=True)

    sp = speedups(both)
    fig, ax = plt.subplots(figsize=(8, 4))
    sns.pointplot(data=sp, x="shape", y="speedup", hue="source", linestyle="none", ax=ax,
                  dodge=0.3)
    for source_i, (source, grp) in enumerate(sp.groupby("source", sort=False)):
        xs = [list(sp["shape"].unique()).index(s) for s in grp["shape"]]
        offset = -0.15 if source_i == 0 else 0.15
        ax.errorbar([x + offset for x in xs], grp["speedup"],
                    yerr=[grp["speedup"] - grp["low"], grp["high"] - grp["speedup"]],
                    fmt="none", ecolor="gray", capsize=4)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_ylabel("RG-LRU / SAMU time (forward+backward)")
    ax.set_title("SAMU's speedup over RG-LRU (bars: 10th-90th percentile of sample ratios)")
    save(fig, "speedup")

    bars("memory", "peak_allocated_delta_units", "peak allocated delta (units of B*L*D BF16)",
         "Peak memory around one forward+backward")
    bars("roofline", "floor_fraction", "floor / measured (1 = at the floor)",
         "Fraction of the 10 B/element bandwidth floor (4.22 TB/s, H200)", log=True)
    return written

"""Context parallelism's cost on one GPU (benchmarks/bench_context_parallel.py writes the file):
each rank's share of a forward+backward against one call at L / P and one at L, as a frame and
a figure for notebook 04."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from .. import mixers, paths
from . import schema

# A rank's share (summary pass and its slice with an initial state, forward and backward) over
# a plain call at L / P: the target at L = 2^18, D = 2048, P = 2-8.
TARGET_SHARE_OVER_SLICE_CALL = 1.3
# A mixer's line style, by its place in the registry (samu.mixers).
LINE_STYLES = ("-", "--", "-.", ":")


def _relative(slug: str) -> str:
    return f"context_parallel/{slug}.json"


def result_file(slug: str) -> Path:
    """Where the benchmark writes a GPU's timings: the data folder's."""
    return paths.DATA / _relative(slug)


def load(slug: str | None = None) -> tuple[dict, Path]:
    """(document, its path): ``slug``'s timings from the data folder or the repository's, else
    the committed H200 ones (paths.measured_file)."""
    path, slugs = paths.measured_file(_relative, slug)
    if path is None:
        raise FileNotFoundError(f"no context-parallel timings for {' or '.join(slugs)}: run "
                                "benchmarks/bench_context_parallel.py on that GPU")
    return schema.read_valid_json(path, "context_parallel"), path


def frame(doc: dict) -> pd.DataFrame:
    """One row per (mixer, L, P): the slowest rank's share, the calls at L / P and at L (ms),
    and the two ratios the figure draws."""
    df = pd.DataFrame(doc["rows"])
    keep = ["mixer", "length", "width", "ranks", "one_call_at_length_ms", "one_call_at_slice_ms",
            "slowest_rank_ms", "slowest_rank_over_slice_call", "speedup_over_one_call"]
    keep += [c for c in GPU_COLUMNS if c in df]  # GPU time, where the run could replay a graph
    return df[keep].sort_values(["mixer", "ranks", "length"]).reset_index(drop=True)


GPU_COLUMNS = ("one_call_at_slice_gpu_ms", "slowest_rank_gpu_ms",
               "slowest_rank_over_slice_call_gpu")


def figure(df: pd.DataFrame, label: str = ""):
    """The slowest rank's share over a plain call at L / P against L, with the target: by GPU
    time (graph replay, where the frame has it; the target is judged there) and by the
    protocol's medians (host time included); then one call at L over the slowest rank's share
    (what P GPUs gain).  Colour: P; line: the mixer.  A matplotlib Figure."""
    from matplotlib.figure import Figure

    gpu_column = "slowest_rank_over_slice_call_gpu"
    has_gpu = gpu_column in df and df[gpu_column].notna().any()
    panels = ([(gpu_column, "slowest share / call at L / P\n(GPU time, graph replay)")]
              if has_gpu else [])
    panels += [("slowest_rank_over_slice_call", "slowest share / call at L / P\n(median)"),
               ("speedup_over_one_call", "one call at L / slowest share\n(median)")]
    fig = Figure(figsize=(4.2 * len(panels), 4.4))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    if has_gpu:  # the two ratios on one scale
        axes[0].sharey(axes[1])
    registered = mixers.names()
    for (mixer, ranks), part in df.groupby(["mixer", "ranks"]):
        color = f"C{[2, 4, 8].index(ranks) if ranks in (2, 4, 8) else 3}"
        name = f"{mixers.LABELS.get(mixer, mixer)}, P = {ranks}"
        style = (LINE_STYLES[registered.index(mixer) % len(LINE_STYLES)]
                 if mixer in registered else ":")
        for ax, (column, _) in zip(axes, panels):
            ax.plot(part["length"], part[column], style, marker="o", color=color, label=name)
    for ax, (column, ylabel) in zip(axes, panels):
        if column != "speedup_over_one_call":
            ax.axhline(TARGET_SHARE_OVER_SLICE_CALL, color="k", lw=0.8, ls=":",
                       label=f"target {TARGET_SHARE_OVER_SLICE_CALL}x")
        ax.axhline(1.0, color="grey", lw=0.6)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length L (tokens, D = %d)" % int(df["width"].iloc[0]))
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle("Context parallelism on one GPU, each rank's share timed in turn"
                 + (f" ({label})" if label else ""))
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    return fig

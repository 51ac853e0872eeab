"""Host cost against a Linear (benchmarks/host_budget.py writes the rows): each run's
forward+backward at (1, L, D) over a torch.nn.Linear(D, D)'s, from interleaved rounds, as a
frame and a figure for notebook 04."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from .. import mixers, paths
from . import benchmark_rows

BENCHMARK = "host_budget"
# Where a call's time goes, from the run's own medians (wall time, synchronised): the autograd
# engine with a do-nothing Function, samu's Python with every launch stubbed, then the rest.
PARTS = (("null Function", "null_function_us"),
         ("samu's Python (launches stubbed)", "launches_stubbed_us"),
         ("launches and GPU", "protocol_forward_backward_us"))


def load(slug: str | None = None) -> tuple[list[dict], Path]:
    """(rows, their path): ``slug``'s rows from the data folder or the repository's, else the
    committed H200 ones (paths.measured_file)."""
    path, slugs = paths.measured_file(lambda name: f"benchmarks/{name}/{BENCHMARK}.jsonl", slug)
    if path is None:
        raise FileNotFoundError(f"no host-budget rows for {' or '.join(slugs)}: run "
                                "benchmarks/host_budget.py on that GPU")
    return benchmark_rows.read_rows(path), path


def targets() -> dict[str, float]:
    """{mixer: its forward+backward's host time over a Linear's that it aims at}, from the specs
    (samu.mixers), for the mixers that have one."""
    return {name: spec.host_target_over_linear for name, spec in mixers.MIXERS.items()
            if spec.host_target_over_linear is not None}


def frame(rows: list[dict]) -> pd.DataFrame:
    """One row per (run, mixer, width) that timed interleaved rounds: the run's number in file
    order (a run starts at its 'empty synchronise' row), its commit, the backend asked for
    ("auto" for rows that do not say) and the one that ran, the ratio over the Linear
    (interleaved rounds), and the medians the breakdown draws (us; each its own loop, the
    Linear's too, so that they drift apart by the host's noise)."""
    out, run, linear = [], 0, None
    for row in rows:
        operation = row.get("configuration", {}).get("operation")
        values = row["values"]
        if operation == "empty synchronise":
            run, linear = run + 1, None
        elif operation == "torch.nn.Linear forward+backward":
            linear = values["host_wall_us"]
        if row.get("mixer") is None or "interleaved_over_linear" not in values:
            continue
        configuration = row.get("configuration", {})
        out.append(dict(run=run, commit=str(row["commit"])[:7], mixer=row["mixer"],
                        asked=configuration.get("asked", "auto"),
                        backend=configuration.get("backend"),
                        width=row["shape"]["width"], length=row["shape"]["length"],
                        over_linear=values["interleaved_over_linear"],
                        linear_us=values["interleaved_linear_us"],
                        mixer_us=values["interleaved_forward_backward_us"],
                        linear_alone_us=linear,
                        **{column: values.get(column) for _, column in PARTS}))
    columns = ["run", "commit", "mixer", "asked", "backend", "width", "length", "over_linear",
               "linear_us", "mixer_us", "linear_alone_us"] + [column for _, column in PARTS]
    return pd.DataFrame(out, columns=columns)


def figure(df: pd.DataFrame, label: str = ""):
    """Left: each run's forward+backward over its Linear, by mixer and width, with the targets:
    the calibrated defaults' rows (those asked for "auto"), or every row where none is.
    Right: where the latest run's time goes at its widest rows, beside its Linear (medians of
    separate loops: a part can read a little short or long by the host's drift).
    A matplotlib Figure."""
    from matplotlib.figure import Figure

    defaults = df[df["asked"] == "auto"]  # the calibrated defaults; other backends are in df
    named = defaults.empty  # no default timed: each series names its backend
    df = df if named else defaults
    fig = Figure(figsize=(11, 4.4))
    left, right = fig.subplots(1, 2, gridspec_kw=dict(width_ratios=[1.6, 1]))
    markers = {1024: "s", 2048: "o", 3072: "^", 4096: "D"}
    series = ["mixer", "width"] + (["backend"] if named else [])
    for key, part in df.groupby(series, dropna=False):
        mixer, width = key[:2]
        left.plot(part["run"], part["over_linear"], ls="none", marker=markers.get(width, "x"),
                  color=mixers.COLOURS.get(mixer, "grey"),
                  label=f"{mixers.LABELS.get(mixer, mixer)}{f' {key[2]}' if named else ''}, "
                        f"D = {width}")
    for mixer, target in targets().items():
        if mixer in set(df["mixer"]):
            left.axhline(target, color=mixers.COLOURS[mixer], lw=0.9, ls=":",
                         label=f"target {mixers.LABELS[mixer]} {target}x")
    runs = df.drop_duplicates("run")
    left.set_xticks(runs["run"], runs["commit"], rotation=45, fontsize=7)
    left.set_xlabel("run (commit), in order")
    left.set_ylabel("forward+backward host time / Linear's")
    left.set_ylim(bottom=0)
    left.legend(fontsize=7, ncol=2, loc="lower left")
    latest = df[df["run"] == df["run"].max()]
    bars = latest.sort_values("width").drop_duplicates("mixer", keep="last")
    names = ["Linear"] + [mixers.LABELS.get(m, m) for m in bars["mixer"]]
    right.bar(0, bars["linear_alone_us"].iloc[0], color="grey")
    for i, (_, row) in enumerate(bars.iterrows(), start=1):
        bottom = 0.0
        for j, (part_label, column) in enumerate(PARTS):
            top = row[column]
            if top is None or pd.isna(top):
                continue
            right.bar(i, max(top - bottom, 0.0), bottom=bottom, color=f"C{j + 2}",
                      label=part_label if i == 1 else None)
            bottom = max(bottom, top)
    right.set_xticks(range(len(names)), names)
    right.set_ylabel("host time per forward+backward (us)")
    right.set_title(f"run {int(latest['run'].max())} ({latest['commit'].iloc[0]}), "
                    f"D = {int(bars['width'].max())}", fontsize=9)
    if right.get_legend_handles_labels()[0]:  # rows without the breakdown draw no parts
        right.legend(fontsize=7, loc="upper left")
    fig.suptitle("Host cost of a forward+backward at (1, %d, D) against torch.nn.Linear(D, D)"
                 % int(df["length"].iloc[0]) + (f" ({label})" if label else ""))
    fig.tight_layout()
    return fig

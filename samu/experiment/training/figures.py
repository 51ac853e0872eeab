"""The study's figures, drawn from a result document."""
from __future__ import annotations

import math
import textwrap
from pathlib import Path

from ... import model as model_
from .curves import compared_mixers, rates_said, recall_curve_frame, recall_sanity, short_why
from .results import (MIXER_NAMES, UNNAMED_CONFIGURATION, best_frame, higher_is_better,
                      learning_rate_choice, not_compared_note, runs_of, sanity)
from .tasks import METRIC_TABLE, TASK_NAMES, TASKS

# --- figures -------------------------------------------------------------------------------------

def seed_range(values):
    """seaborn's error band: the range over seeds."""
    return values.min(), values.max()


def mixer_palette() -> dict:
    """{mixer label: colour}: each mixer a colour of its own, the same in every figure, in the
    order of samu.model.mixer_names()."""
    import seaborn as sns
    names = [MIXER_NAMES[m] for m in model_.mixer_names()]
    return dict(zip(names, sns.color_palette("deep", len(names))))


MARKERS = ["o", "s", "^", "D", "v", "P", "X"]


def title_note(doc: dict) -> str:
    env = doc["environment"]
    where = env["gpu"] if env.get("device", "").startswith("cuda") else "CPU"
    note = f"{where}, {env['dtype']}"
    if not env.get("device", "").startswith("cuda"):
        note += "; a CPU run exercises the study, its numbers are no GPU result"
    return note


def _one_seed(df) -> bool:
    """Whether every (task, length, mixer) of a best_frame has one seed: no range to draw."""
    return bool((df.groupby(["task", "seq_len", "mixer"])["seed"].nunique() <= 1).all())


def figures(doc: dict) -> dict:
    """matplotlib Figures (no pyplot, so nothing is left open): loss curves per task and length,
    accuracy against sequence length (recall, copying), and quality against training speed."""
    import numpy as np
    import pandas as pd
    import seaborn as sns
    from matplotlib.figure import Figure

    from matplotlib.ticker import FuncFormatter

    from ..report import plain_log_ticks

    sns.set_theme(style="whitegrid", context="notebook")
    out = {}
    if not runs_of(doc):  # the recall curves alone
        if isinstance(doc, dict) and doc.get("recall_curves"):
            out["recall_curves"] = recall_curves_figure(doc)
        return out
    # Each (task, length, mixer) at its best learning rate; the document keeps every run.
    best = {(r.task, r.seq_len, r.mixer): r.lr for r in learning_rate_choice(doc).itertuples()}
    runs = [r for r in runs_of(doc)
            if r.get("lr") == best[(r["task"], r["seq_len"], r["mixer"])]
            or (r.get("lr") is None and pd.isna(best[(r["task"], r["seq_len"], r["mixer"])]))]
    df = best_frame(doc)
    df["Mixer"] = df["mixer"].map(lambda m: MIXER_NAMES.get(m, m))
    mixers = list(dict.fromkeys(df["Mixer"]))
    palette = mixer_palette()
    markers = dict(zip(palette, MARKERS))
    note = title_note(doc)
    one_seed = _one_seed(df)

    # Loss curves: one panel per (task, length), the band the range over seeds.
    curves = pd.DataFrame([{"task": r["task"], "seq_len": r["seq_len"],
                            "Mixer": MIXER_NAMES.get(r["mixer"], r["mixer"]),
                            "seed": r["seed"], "step": s, "loss": float(l)}
                           for r in runs for s, l in r["loss_curve"]])
    panels = list(dict.fromkeys(zip(curves["task"], curves["seq_len"])))
    cols = min(4, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(4.2 * cols, 3.3 * rows + 0.6))
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    for ax, (task, length) in zip(axes, panels):
        part = curves[(curves["task"] == task) & (curves["seq_len"] == length)]
        # A curve of one or two logged points (a short run) is drawn by its markers.
        few = part.groupby(["Mixer", "seed"]).size().max() <= 2
        sns.lineplot(data=part, x="step", y="loss", hue="Mixer", hue_order=mixers,
                     palette=palette, errorbar=seed_range, ax=ax, legend=ax is axes[0],
                     marker="o" if few else None)
        ax.set_title(f"{TASK_NAMES[task]}, L = {length}", fontsize=10)
        ax.set_ylabel("training loss (nats)")
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    if axes[0].get_legend() is not None:
        axes[0].get_legend().set_title("mixer")
    seeds = "one seed" if one_seed else "mean over seeds; band: range over seeds"
    fig.suptitle(f"Training loss ({seeds}) — {note}", fontsize=11)
    fig.tight_layout()
    out["loss"] = fig

    # Accuracy against sequence length, for the tasks scored by accuracy.
    acc = df[df["task"].map(lambda t: TASKS[t].metric == "accuracy" if t in TASKS else False)]
    if len(acc):
        tasks = list(dict.fromkeys(acc["task"]))
        fig = Figure(figsize=(5.2 * len(tasks) + 1.5, 4.2))
        axes = np.atleast_1d(fig.subplots(1, len(tasks), squeeze=False)).ravel()
        for ax, task in zip(axes, tasks):
            part = acc[acc["task"] == task]
            sns.lineplot(data=part, x="seq_len", y="value", hue="Mixer", hue_order=mixers,
                         palette=palette, style="Mixer", markers=markers, dashes=False,
                         errorbar=seed_range, err_style="bars", ax=ax, legend=ax is axes[-1])
            ax.axhline(part["chance"].iloc[0], color="gray", lw=1, ls=":", label="chance")
            if part["values_baseline"].notna().any():
                level = part["values_baseline"].iloc[0]
                ax.axhline(level, color="gray", lw=1, ls="--")
                ax.text(0.01, level + 0.01, "guessing among the values present (1 / pairs)",
                        transform=ax.get_yaxis_transform(), color="gray", fontsize=8,
                        va="bottom")
            ax.set_xscale("log", base=2)
            lengths = sorted(set(part["seq_len"]))
            ax.set_xticks(lengths, [str(v) for v in lengths])
            ax.minorticks_off()
            ax.set_ylim(-0.03, 1.03)
            ax.set_xlabel("sequence length (trained and evaluated)")
            ax.set_ylabel("held-out accuracy at the answer positions")
            ax.set_title(TASK_NAMES[task], fontsize=10)
        legend = axes[-1].get_legend()
        if legend is not None:
            handles, labels = axes[-1].get_legend_handles_labels()
            legend.remove()
            axes[-1].legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                            frameon=False)
        seeds = "one seed" if one_seed else "mean over seeds; bars: range"
        fig.suptitle(f"Accuracy against sequence length ({seeds}) — {note}", fontsize=11)
        fig.tight_layout()
        out["accuracy"] = fig

    # Quality against training time: each task at its longest length, one marker per mixer (the
    # mean over seeds, bars the range over seeds on both axes).  Every run of a task has the same
    # steps at most (a solved run, or one a plateau decays, ends sooner), so the time is what the
    # quality cost; documents of the earlier study lack it: tokens/s then.
    timed = "train_wall_s" if df["train_wall_s"].notna().all() else "tokens_per_s"
    tasks = list(dict.fromkeys(df["task"]))
    check = sanity(doc)
    fig = Figure(figsize=(4.6 * len(tasks) + 1.5, 4.2))
    axes = np.atleast_1d(fig.subplots(1, len(tasks), squeeze=False)).ravel()
    for ax, task in zip(axes, tasks):
        part = df[df["task"] == task]
        longest = part["seq_len"].max()
        part = part[part["seq_len"] == longest]
        for mixer in mixers:
            grp = part[part["Mixer"] == mixer]
            if not len(grp):
                continue
            x, y = grp[timed], grp["value"]
            if not one_seed:
                ax.scatter(x, y, color=palette[mixer], marker=markers[mixer], alpha=0.35, s=22)
            ax.errorbar([x.mean()], [y.mean()],
                        xerr=[[x.mean() - x.min()], [x.max() - x.mean()]],
                        yerr=[[y.mean() - y.min()], [y.max() - y.mean()]],
                        fmt=markers[mixer], color=palette[mixer], markersize=9,
                        markeredgecolor="black", capsize=3, label=mixer)
        lo, hi = part[timed].min(), part[timed].max()
        if math.isfinite(lo) and math.isfinite(hi) and lo > 0 and hi / lo >= 5:
            ax.set_xscale("log")  # speeds an order of magnitude apart
            ax.set_xlim(lo / 1.3, hi * 1.3)
            plain_log_ticks(ax.xaxis, lo / 1.3, hi * 1.3)
        elif math.isfinite(hi) and lo > 0 and hi / lo < 1.5:
            ax.set_xlim(0, hi * 1.1)  # close times: from zero, so that gaps read as ratios
        ax.xaxis.set_major_formatter(FuncFormatter(
            (lambda v, _: f"{v:,.3g}") if timed == "train_wall_s" else (lambda v, _: f"{v:,.0f}")))
        ax.tick_params(axis="x", labelrotation=20)
        ax.set_xlabel(("training time per run, timed alone (s)" if part["timed_alone"].all()
                       else "training wall time per run (s)") if timed == "train_wall_s"
                      else "training tokens / s")
        own_bar = part["yardstick_bar"].dropna()
        if len(own_bar) and not higher_is_better(part["metric"].iloc[0]):
            ax.axhline(own_bar.iloc[0], color="gray", lw=1, ls=":")
            ax.text(0.01, own_bar.iloc[0], "bigram model (attention's bar)", color="gray",
                    transform=ax.get_yaxis_transform(), fontsize=8, va="bottom")
        ax.set_ylabel(METRIC_TABLE[part["metric"].iloc[0]].label)
        ax.set_title(f"{TASK_NAMES[task]}, L = {longest}" + not_compared_note(task, check, "\n"),
                     fontsize=10)
    from matplotlib.lines import Line2D
    drawn = [m for m in mixers if (df["Mixer"] == m).any()]
    axes[-1].legend(handles=[Line2D([], [], ls="none", marker=markers[m], color=palette[m],
                                    markeredgecolor="black", markersize=9, label=m)
                             for m in drawn],
                    loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    seeds = ("one seed each" if one_seed
             else "large marker: mean over seeds, bars: range; small: each seed")
    fig.suptitle(f"Quality against training {'time' if timed == 'train_wall_s' else 'speed'} "
                 f"({seeds}) — {note}", fontsize=11)
    fig.tight_layout()
    out["quality_speed"] = fig
    if doc.get("recall_curves") if isinstance(doc, dict) else False:
        out["recall_curves"] = recall_curves_figure(doc)
    return out


def recall_curves_figure(doc: dict):
    """Zoology's figure 2: MQAR accuracy against the model's width, a panel per (sequence
    length, key-value pairs) point of the grid, and against the pairs at the widest width with
    more than one point; a line per mixer, each point at its best learning rate (hollow: the best
    is at the sweep's edge; a cross beside it: its run was still learning when it stopped).  The
    mixers that pass the curves' sanity bar (recall_sanity) are drawn solid; one below its own
    bar is drawn dashed and pale, labelled so (what it learned in these steps, not compared);
    nothing is drawn when attention is below its bar, and the figure says so."""
    import seaborn as sns
    from matplotlib.figure import Figure

    sns.set_theme(style="whitegrid", context="notebook")
    curves = recall_curve_frame(doc)
    check = recall_sanity(doc)
    compared = compared_mixers(check)
    drawn = list(check["checks"]) if check["yardstick_passed"] else []
    palette = mixer_palette()
    points = sorted({(int(r.seq_len), int(r.pairs)) for r in curves.itertuples()},
                    key=lambda p: (p[1], p[0]))
    panels = [("width", p) for p in points
              if curves[(curves["seq_len"] == p[0]) & (curves["pairs"] == p[1])]["width"]
              .nunique() > 1]
    by_width = curves.groupby("width")["pairs"].nunique()
    several = [w for w, n in by_width.items() if n > 1]
    if several:
        panels.append(("pairs", max(several)))
    panels = panels or [("width", p) for p in points[:1]]
    fig = Figure(figsize=(3.9 * len(panels) + 2.6, 4.3))
    axes = fig.subplots(1, len(panels), squeeze=False).ravel()
    for ax, (kind, at) in zip(axes, panels):
        if kind == "width":
            part = curves[(curves["seq_len"] == at[0]) & (curves["pairs"] == at[1])]
            x, title = "width", f"L = {at[0]}, {at[1]} pairs"
        else:
            part = curves[curves["width"] == at]
            lengths = sorted(set(part["seq_len"]))
            x, title = "pairs", (f"width {at}, L = {lengths[0]}" if len(lengths) == 1 else
                                 f"width {at}, L = {lengths[0]}-{lengths[-1]} with the pairs")
        for mixer in drawn:
            line = part[part["mixer"] == mixer].sort_values(x)
            if not len(line):
                continue
            colour = palette[MIXER_NAMES[mixer]]
            below = mixer not in compared
            alpha = 0.55 if below else 1.0
            ax.plot(line[x], line["accuracy"], "--" if below else "-", color=colour, alpha=alpha,
                    label=MIXER_NAMES[mixer] + (f" ({short_why(check['checks'][mixer])})"
                                                if below else ""))
            for edge, face in ((False, colour), (True, "white")):
                pts = line[line["at_edge"] == edge]
                ax.scatter(pts[x], pts["accuracy"], color=face, edgecolor=colour, alpha=alpha,
                           zorder=3)
            learning = line[line["still_learning"]]
            ax.scatter(learning[x], learning["accuracy"] + 0.04, marker="x", color=colour,
                       alpha=alpha, s=18, zorder=3)
        xs = sorted(set(part[x]))
        if xs:
            ax.set_xscale("log", base=2)
            ax.set_xlim(xs[0] / 1.3, xs[-1] * 1.3)  # the grid's span, drawn or not
            ax.set_xticks(xs, [str(v) for v in xs])
            ax.minorticks_off()
        ax.set_ylim(-0.03, 1.07)
        ax.axhline(check["bar"], color="gray", lw=1, ls=":")
        ax.set_xlabel("model width" if x == "width" else "key-value pairs")
        ax.set_ylabel("held-out MQAR accuracy")
        ax.set_title(title, fontsize=10)
        if not drawn:
            ax.text(0.5, 0.5, "no comparison:\nattention failed its bar", ha="center",
                    va="center", transform=ax.transAxes, color="firebrick", fontsize=10)
    failed = [f"{MIXER_NAMES[m]}: {c['why']}" for m, c in check["checks"].items()
              if not c["passed"]]
    notes = [f"Sanity bar (accuracy {check['bar']:.2f} at {check['pairs']} pairs, L = "
             f"{check['seq_len']}: attention at every width >= "
             f"{check['attention_from_width']}, the others at the widest)"]
    notes += (["passed by every mixer"] if not failed else
              ["failed, drawn dashed and not compared:" if drawn else "failed:"] + failed)
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        axes[-1].legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                        frameon=False, title="mixer")
    axes[-1].text(1.02, 0.45 if handles else 1.0,
                  "\n".join(textwrap.fill(n, 34) for n in notes), transform=axes[-1].transAxes,
                  va="top", fontsize=8, color="black" if not failed else "firebrick")
    verdict = "" if drawn and not failed else (
        " — no comparison: attention failed its bar" if not drawn else
        " — dashed: below their own bar, not compared")
    rates = rates_said(curves) if len(curves) else "no runs"
    fig.suptitle(f"Recall curves ({rates}; hollow: best at the sweep's edge; x: still "
                 f"learning){verdict} — {title_note(doc)}", fontsize=10)
    fig.tight_layout()
    return fig


FIGURE_NAMES = ("loss", "accuracy", "quality_speed", "recall_curves")  # the figures' keys


def figure_path(slug: str, name: str, configuration: str | None = None) -> Path:
    """data/figures/<slug>_training_<name>.png for the unnamed configuration,
    data/figures/<slug>_training_<configuration>_<name>.png for the others."""
    from ... import paths
    named = "" if configuration in (None, UNNAMED_CONFIGURATION) else f"{configuration}_"
    return paths.figures_dir() / f"{slug}_training_{named}{name}.png"


def draw_figures(doc: dict, slug: str) -> list[Path]:
    """The figures written atomically (``report.save_figure``) to their figure_path."""
    from .. import report
    configuration = doc["study"].get("configuration")
    return [report.save_figure(fig, figure_path(slug, name, configuration))
            for name, fig in figures(doc).items()]

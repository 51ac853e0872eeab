"""The report's figures, matplotlib Figures (no pyplot): time per shape, each mixer's speed-up over
its baseline with its spread, peak memory, multiples of the floor and the roofline; saved
atomically.  Each mixer keeps its colour (samu.mixers.COLOURS) in every figure."""
from __future__ import annotations

import io
import math
from pathlib import Path

import pandas as pd

from ... import dispatch, mixers, paths
from ...shapes import Shape
from .. import peers as peers_, schema
from .constants import CPU_LABEL, CPU_NOTE, PUBLISHED_SOURCE, SHAPE_ORDER_KEY
from .hardware import COMPUTE_CEILINGS
from .tables import floor_multiples, speedup_title, speedups


def plain_log_ticks(axis, lo: float, hi: float) -> None:
    """Major ticks at 1-2-5 steps (1 and 10 steps over wide ranges) labelled as plain numbers,
    no minor labels: a log axis otherwise writes "2x10^0"."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    lo, hi = min(lo, hi), max(lo, hi)
    decades = range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
    for steps in ((1, 2, 5), (1, 3), (1,)):
        ticks = [m * 10.0 ** e for e in decades for m in steps if lo <= m * 10.0 ** e <= hi]
        if len(ticks) <= 9:
            break
    if len(ticks) > 9:
        ticks = ticks[::math.ceil(len(ticks) / 8)]
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _legend_outside(ax, **kwargs) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if ax.get_legend() is not None:
        ax.get_legend().remove()
    if handles:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  borderaxespad=0.0, frameon=False, **kwargs)


def _series(both: pd.DataFrame) -> pd.Series:
    return both["source"] + ", " + both["mixer"].map(lambda m: mixers.LABELS.get(m, m))


def _shape_order(both: pd.DataFrame) -> list[str]:
    tuples = sorted(set(both["shape_tuple"]), key=SHAPE_ORDER_KEY)
    return [Shape.of(t).label for t in tuples]


def figures(df: pd.DataFrame, published_df: pd.DataFrame, registry=peers_.PEERS) -> dict:
    """The figures, matplotlib Figures (no pyplot, so nothing is left open): time per
    shape, each mixer's speedup over its baseline with its spread, peak memory, and the
    roofline.  The memory and roofline figures hold GPU rows only: where the run has none (a
    CPU run), their titles say they show the published result alone, and why."""
    import seaborn as sns
    from matplotlib.figure import Figure

    sns.set_theme(style="whitegrid", context="notebook")
    both = pd.concat([published_df, df], ignore_index=True)
    both["series"] = _series(both)
    order = _shape_order(both)
    machines = ", ".join(dict.fromkeys(df["machine"]))
    beside = (f"{machines} beside the {PUBLISHED_SOURCE} result" if machines
              else f"the {PUBLISHED_SOURCE} result")
    cpu = bool(df["cpu"].any())
    cpu_line = f"\n{CPU_NOTE}" if cpu else ""
    out = {}

    # Mixer by colour; the published rows in a lighter shade of it.
    from matplotlib.colors import to_rgb
    palette = {}
    for series, source, mixer in zip(both["series"], both["source"], both["mixer"]):
        rgb = to_rgb(mixers.COLOURS.get(mixer, "grey"))
        palette[series] = (tuple(0.45 * c + 0.55 for c in rgb) if source == PUBLISHED_SOURCE
                           else rgb)

    def bar_figure(data, column, ylabel, title, log=False):
        fig = Figure(figsize=(10, 4.8))
        ax = fig.subplots()
        sns.barplot(data=data, x="shape", y=column, hue="series", order=_shape_order(data), ax=ax,
                    hue_order=list(dict.fromkeys(data["series"])), palette=palette)
        if log:
            ax.set_yscale("log")
            lo = data[column].min()
            hi = data[column].max()
            ax.set_ylim(lo / 1.6, hi * 1.6)
            plain_log_ticks(ax.yaxis, lo / 1.6, hi * 1.6)
        ax.set_xlabel("shape (batch, length, width)")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=11)
        ax.tick_params(axis="x", labelrotation=20)
        _legend_outside(ax)
        return fig

    out["time"] = bar_figure(
        both, "forward_backward_ms", "forward+backward median (ms, log scale)",
        f"Complete mixer time per shape\n{beside}{cpu_line}", log=True)

    floors = floor_multiples(df, registry)
    if floors["series"].str.endswith("GPU time").any():  # results from before GPU time: none
        fig = Figure(figsize=(10, 4.8))
        ax = fig.subplots()
        sns.barplot(data=floors, x="shape", y="times_floor", hue="series",
                    order=_shape_order(floors), ax=ax, palette="Paired")
        ax.set_yscale("log")
        lo, hi = min(floors["times_floor"].min(), 1.0) / 1.6, floors["times_floor"].max() * 1.6
        ax.set_ylim(lo, hi)
        plain_log_ticks(ax.yaxis, lo, hi)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xlabel("shape (batch, length, width)")
        ax.set_ylabel("multiple of the 10-byte floor (log scale)")
        ax.set_title(f"Forward+backward on {machines}: protocol median (host included), GPU time "
                     "(CUDA-graph replay),\nand the public pipelines (eager gates or controller, "
                     "then an FLA scan)", fontsize=11)
        ax.tick_params(axis="x", labelrotation=20)
        _legend_outside(ax)
        out["floor_multiples"] = fig

    sp = speedups(both)
    fig = Figure(figsize=(10, 4.5))
    ax = fig.subplots()
    sources = list(dict.fromkeys(sp["source"]))
    width = 0.5 / max(len(sources), 1)
    colours = sns.color_palette("dark", len(sources))
    for i, source in enumerate(sources):
        grp = sp[sp["source"] == source]
        xs = [order.index(s) + (i - (len(sources) - 1) / 2) * width for s in grp["shape"]]
        ax.errorbar(xs, grp["speedup"],
                    yerr=[grp["speedup"] - grp["low"], grp["high"] - grp["speedup"]],
                    fmt="o", color=colours[i], ecolor="gray", capsize=4, label=source)
    ax.set_xticks(range(len(order)), order)
    ax.set_xlim(-0.6, len(order) - 0.4)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xlabel("shape (batch, length, width)")
    ax.set_ylabel("; ".join(f"{mixers.LABELS.get(b, b)} time / {mixers.LABELS.get(m, m)} time"
                            for m, b in dict.fromkeys(zip(sp["mixer"], sp["baseline"]))))
    ax.set_title(f"{speedup_title(sp)}, forward+backward medians (bars: 10th-90th "
                 f"percentile of the pairwise sample ratios)\n{beside}{cpu_line}", fontsize=11)
    ax.tick_params(axis="x", labelrotation=20)
    _legend_outside(ax)
    out["speedup"] = fig

    memory = both[~both["cpu"]]
    out["memory"] = bar_figure(
        memory, "peak_allocated_delta_units", "peak allocated delta (units of B*L*D BF16)",
        "Peak memory above the baseline around one forward+backward\n"
        + _gpu_rows_only(df, beside, "no allocator counters"))

    out["roofline"] = _roofline(both, _gpu_rows_only(df, beside, "no floor, no bandwidth"))
    return out


def _gpu_rows_only(df: pd.DataFrame, beside: str, why: str) -> str:
    """What a figure of GPU rows alone shows: ``beside`` where the run has GPU rows (a CPU's
    left out, and why), the published result alone where it has none."""
    if not df["cpu"].any():
        return beside
    if df["cpu"].all():
        return (f"the {PUBLISHED_SOURCE} result alone: this run is a {CPU_LABEL} run, which has "
                f"{why}")
    return f"{beside}\n{CPU_LABEL} rows left out: {why}"


def _roofline(both: pd.DataFrame, beside: str):
    """Achieved bandwidth (bytes at the 10-byte floor count / time) against arithmetic intensity
    (FLOPs per floor byte), log-log, with each GPU's copy-bandwidth ceiling and the H200's compute
    ceilings (a FLOP/s ceiling P is the bandwidth P / intensity)."""
    import numpy as np
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    rows = both[~both["cpu"] & both["achieved_TBps"].notna()]
    fig = Figure(figsize=(10, 5.5))
    ax = fig.subplots()
    ax.set_xscale("log")
    ax.set_yscale("log")
    colours = {m: mixers.COLOURS.get(m, "grey") for m in dict.fromkeys(rows["mixer"])}
    markers = ["o", "s", "^", "D", "v", "P"]
    machines = list(dict.fromkeys(rows["machine"]))
    marker_of = {m: markers[i % len(markers)] for i, m in enumerate(machines)}
    for (machine, mixer), grp in rows.groupby(["machine", "mixer"], sort=False):
        ax.scatter(grp["flops_per_byte"], grp["achieved_TBps"], s=55, color=colours[mixer],
                   marker=marker_of[machine], edgecolor="black", linewidth=0.5, zorder=3)
    intensities = rows["flops_per_byte"] if len(rows) else pd.Series([1.0, 100.0])
    x_lo, x_hi = intensities.min() / 3, intensities.max() * 3
    xs = np.geomspace(x_lo, x_hi, 200)
    ceiling_handles, y_values = [], list(rows["achieved_TBps"])
    styles = ["-", "--", "-.", ":"]
    for i, machine in enumerate(machines):
        slug = dispatch.gpu_slug(machine)
        grp = rows[rows["machine"] == machine]
        bw = float(grp["copy_TBps"].median())
        if not math.isfinite(bw):
            continue
        ceilings = COMPUTE_CEILINGS.get(slug, [])
        roof = np.full_like(xs, bw)
        name = f"{machine}: copy bandwidth {bw:.2f} TB/s"
        if ceilings:  # the roof: the lower of bandwidth and the first (tensor-core) ceiling
            label, flops = ceilings[0]
            roof = np.minimum(roof, flops / xs / 1e12)
            name += f", {label} {flops / 1e12:.0f} TFLOP/s"
        else:
            name += " (no compute ceiling measured)"
        style = styles[i % len(styles)]
        ax.plot(xs, roof, color="black", lw=1.4, ls=style, zorder=2)
        ceiling_handles.append(Line2D([], [], color="black", lw=1.4, ls=style, label=name))
        y_values += [bw]
        # The FP32 ceiling bounds only the mixers whose FLOPs do not run on tensor cores (SAMU's;
        # RG-LRU's gates are GEMMs), so it is drawn over their intensities alone.
        scalar = [m for m in dict.fromkeys(rows["mixer"])
                  if m in mixers.MIXERS and not mixers.get(m).flops_on_tensor_cores]
        scalar_x = rows.loc[rows["mixer"].isin(scalar), "flops_per_byte"].dropna()
        whose = " and ".join(f"{mixers.LABELS[m]}'s" for m in scalar)
        for label, flops in ceilings[1:] if len(scalar_x) else ():
            near = xs[(xs >= scalar_x.min() / 2.5) & (xs <= scalar_x.max() * 2.5)]
            ax.plot(near, flops / near / 1e12, color="gray", lw=1.2, ls=":", zorder=1)
            ceiling_handles.append(Line2D(
                [], [], color="gray", lw=1.2, ls=":",
                label=f"{machine}: {label} {flops / 1e12:.0f} TFLOP/s ({whose} FLOPs)"))
    y_lo = min(y_values) / 3 if y_values else 0.01
    y_hi = max(y_values) * 3 if y_values else 10.0
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_lo, y_hi)
    plain_log_ticks(ax.xaxis, x_lo, x_hi)
    plain_log_ticks(ax.yaxis, y_lo, y_hi)
    # The mixer is the colour and the machine the marker: a mixer's entry is a patch of its
    # colour, a machine's its marker drawn as the points are (black edge, no fill colour).
    handles = ([Patch(facecolor=colours[m], edgecolor="black", linewidth=0.5,
                      label=mixers.LABELS.get(m, m)) for m in colours]
               + [Line2D([], [], ls="none", marker=marker_of[m], markersize=math.sqrt(55),
                         markerfacecolor="white", markeredgecolor="black",
                         markeredgewidth=0.5, label=m) for m in machines]
               + ceiling_handles)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
              frameon=False, fontsize=9)
    ax.set_xlabel("arithmetic intensity (FLOPs per byte; FLOPs per docs/PERFORMANCE.md, "
                  "bytes at the 10 B/element floor)")
    ax.set_ylabel("achieved bandwidth (TB/s, 10 B/element / median time)")
    ax.set_title(f"Roofline: complete mixer, forward+backward\n{beside}", fontsize=11)
    return fig


def png_bytes(fig) -> bytes:
    """A figure as PNG, for showing without writing a file."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    return buf.getvalue()


def save_figure(fig, path) -> Path:
    """A figure written atomically as PNG (its folder made if needed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # The temporary's name does not end in .png, so the format is given.
    return schema.atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120,
                                                             bbox_inches="tight"))


def draw_figures(df: pd.DataFrame, published_df: pd.DataFrame, slug: str,
                 registry=peers_.PEERS) -> list[Path]:
    """The figures written atomically into data/figures/<slug>_<name>.png."""
    folder = paths.figures_dir()
    return [save_figure(fig, folder / f"{slug}_{name}.png")
            for name, fig in figures(df, published_df, registry).items()]

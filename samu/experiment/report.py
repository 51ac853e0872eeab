"""Combine per-shape result files, set them beside the published H800 result, draw the figures.

Each row is judged on its own machine: the floor (SPEC section 8) is 10 bytes per element at that
GPU's own copy bandwidth, the H200's measured, the H800 PCIe's from its datasheet.  A CPU run
(Triton's interpreter) has no floor, no bandwidth and no memory figures: its timings only exercise
the pipeline, and every table and figure says so.
"""
from __future__ import annotations

import io
import math
import statistics
from pathlib import Path

import pandas as pd

from ..shapes import Shape
from .. import dispatch, mixers, paths
from . import peers as peers_, protocol, schema

SHAPE_ORDER_KEY = lambda s: (s[1], s[2], s[0])  # noqa: E731  length, width, batch

COMMITTED_SLUG = "nvidia-h200"  # the results committed in data/results/
CPU_SLUG = "cpu"  # dispatch.gpu_slug() without CUDA
CPU_LABEL = "CPU (Triton interpreter)"
CPU_NOTE = "CPU (Triton interpreter): timings are no GPU result"
PUBLISHED_SOURCE = "published H800 PCIe"
MIXER_NAMES = mixers.View(lambda spec: spec.label)
# The peer of the headline column speedup_vs_peer: eager gates or controller, then FLA's
# chunk_hgrn.  Every other peer a row holds gets a column of its own (summary_table).
HEADLINE_PEER = peers_.PEERS[0].name

# The memory bandwidth in NVIDIA's H800 PCIe datasheet (NVIDIA H800 Tensor Core GPU datasheet,
# H800 PCIe 80 GB): 2.0 TB/s.  The published H800 rows are judged against it (SPEC section 8).
PUBLISHED_H800_PCIE_BANDWIDTH = 2.0e12
# Each GPU's copy bandwidth, bytes read plus bytes written per second, by GPU slug: the H200's as
# measured by protocol.measure_copy_bandwidth, the H800 PCIe's from its datasheet.  A result row's
# own copy_bandwidth_bytes_per_s (written by notebook 03) takes precedence.
COPY_BANDWIDTH = {**protocol.COPY_BANDWIDTH, "nvidia-h800-pcie": PUBLISHED_H800_PCIE_BANDWIDTH}

# The roofline's compute ceilings, FLOP/s, by GPU slug.  BF16 tensor cores: ~790 TFLOP/s, the
# rate measured on the project's H200 (docs/PERFORMANCE.md's "~0.4 ms of tensor-core time" for
# RG-LRU at (1, 32768, 2048) is this rate).  FP32 without tensor cores: 67 TFLOP/s, the NVIDIA H200
# (SXM) datasheet's peak; SAMU's FLOPs (exp, sqrt, the scans) and RG-LRU's scans run there.  No
# compute ceiling is drawn for the H800 PCIe: none was measured.
COMPUTE_CEILINGS = {
    "nvidia-h200": [("BF16 tensor cores, measured", 790e12),
                    ("FP32 without tensor cores, datasheet", 67e12)],
}

# Result rows do not record the head count; the published result and this project's timing use
# 16 heads.
RGLRU_HEADS = 16


def flops_per_element(mixer: str, width: int, num_heads: int = RGLRU_HEADS) -> float:
    """Forward+backward FLOPs per element of [B, L, D], the mixer spec's count (samu.mixers);
    NaN where the spec has none."""
    count = mixers.get(mixer).flops_per_element
    return math.nan if count is None else count(width, num_heads)


def shape_of(row: dict) -> Shape:
    return Shape.of(row["shape"])


# --- which results -------------------------------------------------------------------------------

def has_shape_results(slug: str) -> bool:
    return any(paths.results_dir(slug).glob("*.json"))


def default_slug() -> str:
    """This machine's results when data/results/<its slug>/ holds per-shape files, else the
    committed H200 results (data/results/nvidia-h200/)."""
    here = dispatch.gpu_slug()
    return here if has_shape_results(here) else COMMITTED_SLUG


def describe_choice(slug: str) -> str:
    """One line naming the results shown, and why when they are not this machine's."""
    here = dispatch.gpu_slug()
    folder = paths.relative(paths.results_dir(slug))
    if slug == here:
        text = f"Showing this machine's results ({slug}) from {folder}/"
    else:
        text = f"Showing the {slug} results from {folder}/"
        if slug == COMMITTED_SLUG:
            text = f"Showing the committed {slug} results from {folder}/"
        if not has_shape_results(here):
            text += (f"; this machine ({here}) has no per-shape results in "
                     f"{paths.relative(paths.results_dir(here))}/")
    if slug == CPU_SLUG:
        text += f". {CPU_NOTE}."
    return text


def load_shape_files(slug: str) -> list[dict]:
    """Every per-shape result file of one GPU, validated; schema.ResultFileError names a file
    that is not JSON or not a valid result document."""
    folder = paths.results_dir(slug)
    return [schema.read_valid_json(p, "result") for p in sorted(folder.glob("*.json"))]


def combine(slug: str, write: bool = True) -> dict:
    """All per-shape files of one GPU in one schema-valid document; with write=True (the
    pipeline) it is also written atomically to data/results/<slug>.json, with write=False (viewing
    results) nothing is written."""
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
    if write:
        schema.write_json_atomic(paths.results_file(slug), combined)
    else:
        schema.validate(combined)
    return combined


def published_h800_document() -> dict:
    """The published H800 result (data/reference/h800_pcie_published_result.json), unchanged."""
    return schema.read_json(paths.PUBLISHED_H800_FILE)


# --- tables --------------------------------------------------------------------------------------

def is_cpu(environment: dict, source: str | None = None) -> bool:
    """Results of a CPU run: slug "cpu", an environment whose gpu is "cpu", or one whose timed
    device (recorded since results name it) is no CUDA device."""
    device = str(environment.get("device") or "cuda").strip().lower()
    return (source == CPU_SLUG or str(environment.get("gpu", "")).strip().lower() == "cpu"
            or not device.startswith("cuda"))


def machine_label(environment: dict, source: str | None = None) -> str:
    if is_cpu(environment, source):
        return CPU_LABEL
    return str(environment.get("gpu") or "unknown GPU")


def _number(value) -> float:
    """A float from a row value (files hold non-finite numbers as strings); NaN when absent."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def row_bandwidth(row: dict, environment: dict) -> float:
    """The copy bandwidth (bytes/s) that a GPU row's floor is taken at: the row's own, else its
    GPU's from COPY_BANDWIDTH; NaN for a GPU with neither."""
    own = _number(row.get("copy_bandwidth_bytes_per_s"))
    if math.isfinite(own) and own > 0:
        return own
    return COPY_BANDWIDTH.get(dispatch.gpu_slug(str(environment.get("gpu", ""))), math.nan)


def frame(doc: dict, source: str | None = None) -> pd.DataFrame:
    """One line per row: times, memory in units of B*L*D BF16 elements, floor figures at the
    row's own GPU's copy bandwidth, arithmetic intensity.  `source` labels the rows (default: the
    GPU's name, or CPU_LABEL); rows from a CPU have NaN floor, bandwidth and memory figures."""
    shape_envs = doc.get("shape_environments", {})
    records = []
    for row in doc["rows"]:
        shape = shape_of(row)
        env = shape_envs.get(shape.key, doc["environment"])
        cpu = is_cpu(env, source)
        elements = shape.elements
        unit = 2 * elements
        fb = row["forward_backward"]["median_ms"]
        fwd = row["forward"]["median_ms"]
        nan = math.nan
        bandwidth = nan if cpu else row_bandwidth(row, env)
        floor = protocol.floor_ms(shape, bandwidth) if not cpu else nan
        forward_floor = (protocol.floor_ms(shape, bandwidth,
                                           protocol.FORWARD_FLOOR_BYTES_PER_ELEMENT)
                         if not cpu else nan)
        flops = flops_per_element(row["architecture"], shape.width)
        timed_peers = {name: {"forward_backward_ms": _or_nan(p["forward_backward"]["median_ms"]),
                              "gpu_time_ms": _or_nan(p.get("gpu_time_ms")),
                              "speedup": _or_nan(p.get("speedup"))}
                       for name, p in (row.get("peers") or {}).items()}
        records.append({
            "source": source if source not in (None, CPU_SLUG) else machine_label(env, source),
            "machine": machine_label(env, source), "cpu": cpu,
            "shape": shape.label, "shape_tuple": shape,
            "mixer": row["architecture"], "backend": row["backend"],
            "forward_ms": fwd,
            "backward_ms": row["backward"]["median_ms"],
            "forward_backward_ms": fb,
            "forward_backward_std_ms": row["forward_backward"]["std_ms"],
            "peak_allocated_delta_units": nan if cpu else row["peak_allocated_delta_bytes"] / unit,
            "copy_TBps": bandwidth / 1e12,
            "floor_ms": floor, "times_floor": fb / floor, "floor_fraction": floor / fb,
            "forward_times_floor": fwd / forward_floor,
            "achieved_TBps": (nan if cpu else
                              protocol.FLOOR_BYTES_PER_ELEMENT * elements / (fb * 1e-3) / 1e12),
            # The kernels' own time: one forward+backward replayed from a CUDA graph (no host).
            "gpu_time_ms": _or_nan(row.get("gpu_time_ms")),
            "gpu_time_times_floor": _or_nan(row.get("gpu_time_ms")) / floor,
            # The public pipelines timed in the same rounds, by name: each one's median, GPU
            # time, and samu's speedup over it; the headline peer's speedup also on its own.
            "peers": timed_peers,
            "speedup_vs_peer": timed_peers.get(HEADLINE_PEER, {}).get("speedup", nan),
            # Host cost of a synchronised forward+backward at (1, 128, D) against nn.Linear(D, D).
            "host_ratio_to_linear": _or_nan((row.get("host") or {}).get("ratio_to_linear")),
            "flops_per_element": flops,
            "flops_per_byte": flops / protocol.FLOOR_BYTES_PER_ELEMENT,
            "samples": row["forward_backward"]["samples_ms"],
        })
    df = pd.DataFrame.from_records(records)
    return df.sort_values(["shape_tuple", "mixer"], key=lambda c: c.map(
        lambda v: SHAPE_ORDER_KEY(v) if isinstance(v, tuple) else v)).reset_index(drop=True)


def peer_names(df: pd.DataFrame, registry=peers_.PEERS) -> list[str]:
    """The peers timed in a frame's rows, in the registry's order, then any other in the order
    met."""
    order = [spec.name for spec in registry]
    met = dict.fromkeys(name for timed in df["peers"] for name in timed)
    return sorted(met, key=lambda name: order.index(name) if name in order else len(order))


def floor_multiples(df: pd.DataFrame, registry=peers_.PEERS) -> pd.DataFrame:
    """Long form of each GPU row's forward+backward as multiples of its floor: the protocol's
    median, the GPU time (CUDA-graph replay) and each public pipeline's median, where measured;
    a peer's series is named by its label in the registry."""
    records = []
    for r in df[~df["cpu"]].itertuples():
        for label, ms in (("median", r.forward_backward_ms), ("GPU time", r.gpu_time_ms),
                          *((f"{peers_.label(name, registry)} median", timed["forward_backward_ms"])
                            for name, timed in r.peers.items())):
            if not math.isnan(ms) and not math.isnan(r.floor_ms):
                records.append({"shape": r.shape, "shape_tuple": r.shape_tuple,
                                "series": f"{r.mixer} {label}", "times_floor": ms / r.floor_ms})
    return pd.DataFrame(records, columns=["shape", "shape_tuple", "series", "times_floor"])


def _or_nan(value) -> float:
    return math.nan if value is None else float(value)


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
                        "low": q[0], "high": q[-1], "cpu": bool(grp["cpu"].any())})
    return pd.DataFrame(out, columns=["source", "shape", "speedup", "low", "high", "cpu"])


def summary_table(df: pd.DataFrame, registry=peers_.PEERS) -> pd.DataFrame:
    """The summary columns; floor, bandwidth and memory are NaN on CPU rows.  speedup_vs_peer is
    over the headline peer, speedup_vs_<name> over each other peer the rows hold."""
    cols = ["source", "shape", "mixer", "backend", "forward_ms", "backward_ms",
            "forward_backward_ms", "times_floor", "gpu_time_ms", "gpu_time_times_floor",
            "achieved_TBps", "peak_allocated_delta_units", "speedup_vs_peer",
            "host_ratio_to_linear"]
    table = df[cols].copy()
    at = cols.index("speedup_vs_peer") + 1
    for name in (n for n in peer_names(df, registry) if n != HEADLINE_PEER):
        table.insert(at, f"speedup_vs_{name}",
                     [timed.get(name, {}).get("speedup", math.nan) for timed in df["peers"]])
        at += 1
    return table.round(4)


def published_comparison(df: pd.DataFrame, published_df: pd.DataFrame) -> pd.DataFrame:
    """GPU rows' forward+backward medians beside the published H800 rows, shape by shape (CPU
    rows are left out: an interpreter's time says nothing beside a GPU's)."""
    gpu = df[~df["cpu"]]
    measured = gpu.set_index(["shape", "mixer"])["forward_backward_ms"]
    machine = gpu.set_index(["shape", "mixer"])["machine"]
    published = published_df.set_index(["shape", "mixer"])["forward_backward_ms"]
    both = pd.DataFrame({"published_h800_ms": published, "measured_ms": measured,
                         "machine": machine}).dropna()
    both["faster_than_published"] = both["published_h800_ms"] / both["measured_ms"]
    return both.reset_index()


def run_label(df: pd.DataFrame) -> str:
    """The machines of a frame's rows, for titles; a CPU run carries CPU_NOTE."""
    machines = [m for m in dict.fromkeys(df["machine"]) if m != CPU_LABEL]
    label = ", ".join(machines)
    if df["cpu"].any():
        label = f"{label}; {CPU_NOTE}" if label else CPU_NOTE
    return label


# --- figures -------------------------------------------------------------------------------------

def _plain_log_ticks(axis, lo: float, hi: float) -> None:
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
    return both["source"] + ", " + both["mixer"].map(MIXER_NAMES)


def _shape_order(both: pd.DataFrame) -> list[str]:
    tuples = sorted(set(both["shape_tuple"]), key=SHAPE_ORDER_KEY)
    return [Shape.of(t).label for t in tuples]


def figures(df: pd.DataFrame, published_df: pd.DataFrame, registry=peers_.PEERS) -> dict:
    """The figures, matplotlib Figures (no pyplot, so nothing is left open): time per
    shape, SAMU's speedup with its spread, peak memory, and the roofline."""
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
    base = dict(zip(MIXER_NAMES, sns.color_palette("deep", len(MIXER_NAMES))))
    palette = {}
    for series, source, mixer in zip(both["series"], both["source"], both["mixer"]):
        rgb = base[mixer]
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
            _plain_log_ticks(ax.yaxis, lo / 1.6, hi * 1.6)
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
        _plain_log_ticks(ax.yaxis, lo, hi)
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
    ax.set_ylabel("RG-LRU time / SAMU time")
    ax.set_title("SAMU's speedup over RG-LRU, forward+backward medians (bars: 10th-90th "
                 f"percentile of the pairwise sample ratios)\n{beside}{cpu_line}", fontsize=11)
    ax.tick_params(axis="x", labelrotation=20)
    _legend_outside(ax)
    out["speedup"] = fig

    memory = both[~both["cpu"]]
    note = f"{cpu_line}; CPU rows omitted: no allocator counters" if cpu else ""
    out["memory"] = bar_figure(
        memory, "peak_allocated_delta_units", "peak allocated delta (units of B*L*D BF16)",
        f"Peak memory above the baseline around one forward+backward\n{beside}{note}")

    out["roofline"] = _roofline(both, beside + (
        f"{cpu_line}; CPU rows omitted: no floor, no bandwidth" if cpu else ""))
    return out


def _roofline(both: pd.DataFrame, beside: str):
    """Achieved bandwidth (bytes at the 10-byte floor count / time) against arithmetic intensity
    (FLOPs per floor byte), log-log, with each GPU's copy-bandwidth ceiling and the H200's compute
    ceilings (a FLOP/s ceiling P is the bandwidth P / intensity)."""
    import numpy as np
    import seaborn as sns
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    rows = both[~both["cpu"] & both["achieved_TBps"].notna()]
    fig = Figure(figsize=(10, 5.5))
    ax = fig.subplots()
    ax.set_xscale("log")
    ax.set_yscale("log")
    colours = dict(zip(MIXER_NAMES, sns.color_palette("deep", len(MIXER_NAMES))))
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
        # The FP32 ceiling bounds SAMU's FLOPs only (RG-LRU's gates run on tensor cores), so it
        # is drawn over SAMU's intensity alone.
        samu_x = rows.loc[rows["mixer"] == "samu", "flops_per_byte"]
        for label, flops in ceilings[1:] if len(samu_x) else ():
            near = xs[(xs >= samu_x.min() / 2.5) & (xs <= samu_x.max() * 2.5)]
            ax.plot(near, flops / near / 1e12, color="gray", lw=1.2, ls=":", zorder=1)
            ceiling_handles.append(Line2D(
                [], [], color="gray", lw=1.2, ls=":",
                label=f"{machine}: {label} {flops / 1e12:.0f} TFLOP/s (SAMU's FLOPs)"))
    y_lo = min(y_values) / 3 if y_values else 0.01
    y_hi = max(y_values) * 3 if y_values else 10.0
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_lo, y_hi)
    _plain_log_ticks(ax.xaxis, x_lo, x_hi)
    _plain_log_ticks(ax.yaxis, y_lo, y_hi)
    handles = ([Line2D([], [], ls="none", marker="o", color=colours[m], label=MIXER_NAMES[m])
                for m in MIXER_NAMES if m in set(rows["mixer"])]
               + [Line2D([], [], ls="none", marker=marker_of[m], color="white",
                         markeredgecolor="black", label=m) for m in machines]
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

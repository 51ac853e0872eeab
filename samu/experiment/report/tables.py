"""The result documents as tables: one row per (source, shape, mixer), judged on its own machine,
the speed-ups with their spread, the summary with a column per peer, the published comparison."""
from __future__ import annotations

import math
import statistics

import pandas as pd

from ... import dispatch, mixers
from .. import peers as peers_, protocol
from .constants import CPU_LABEL, CPU_NOTE, CPU_SLUG, HEADLINE_PEER, SHAPE_ORDER_KEY, shape_of
from .hardware import COPY_BANDWIDTH, flops_per_element


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
            "peak_allocated_delta_units": (nan if cpu else protocol.memory_units(
                row["peak_allocated_delta_bytes"], shape)),
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
    """Each mixer's forward+backward speedup over its baseline (samu.mixers.baselines(): SAMU's
    over RG-LRU), baseline time / mixer time, per shape and source, with its spread over every
    pair of samples (median, and the 10th-90th percentile of the pairwise ratios)."""
    out = []
    pairs = mixers.baselines()
    for (source, shape), grp in df.groupby(["source", "shape"], sort=False):
        by = {r.mixer: r for r in grp.itertuples()}
        for mixer, baseline in pairs.items():
            if mixer not in by or baseline not in by:
                continue
            ratios = sorted(a / b for a in by[baseline].samples for b in by[mixer].samples)
            q = statistics.quantiles(ratios, n=10)
            out.append({"source": source, "shape": shape, "mixer": mixer, "baseline": baseline,
                        "speedup": by[baseline].forward_backward_ms / by[mixer].forward_backward_ms,
                        "low": q[0], "high": q[-1], "cpu": bool(grp["cpu"].any())})
    return pd.DataFrame(out, columns=["source", "shape", "mixer", "baseline", "speedup", "low",
                                      "high", "cpu"])


def speedup_title(pairs: pd.DataFrame | None = None) -> str:
    """"SAMU's speedup over RG-LRU", for each (mixer, baseline) of a speedups frame (default:
    every registered pair)."""
    found = (mixers.baselines().items() if pairs is None else
             dict.fromkeys(zip(pairs["mixer"], pairs["baseline"])))
    return "; ".join(f"{mixers.LABELS.get(m, m)}'s speedup over {mixers.LABELS.get(b, b)}"
                     for m, b in found)


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

"""The README's results block, rendered from the committed data files, and the other figures the
README quotes from data and device logs.

``python -m samu.experiment.readme --write`` rewrites the block between RESULTS_BEGIN and
RESULTS_END in README.md (and the per-row table in docs/LAB.md); ``--check`` exits 1 where either
differs from what the data files give.  tests/experiment/test_readme.py runs the check.
"""
from __future__ import annotations

import argparse
import re
import sys
import textwrap
from pathlib import Path

import pandas as pd

from .. import mixers, paths
from ..shapes import Shape
from . import calibration, pipeline, protocol, report, schema, training

RESULTS_BEGIN = "<!-- results:begin (python -m samu.experiment.readme --write) -->"
RESULTS_END = "<!-- results:end -->"
OTHER_GPUS_BEGIN = "<!-- other-gpus:begin (python -m samu.experiment.readme --write) -->"
OTHER_GPUS_END = "<!-- other-gpus:end -->"
ROWS_BEGIN = "<!-- result-rows:begin (python -m samu.experiment.readme --write) -->"
ROWS_END = "<!-- result-rows:end -->"
README = paths.REPO_ROOT / "README.md"
LAB = paths.REPO_ROOT / "docs" / "LAB.md"
DASH = "—"
# The device logs behind `make reproduce`'s time on the H200: the one commit whose two commands
# ran every default GPU shape and logged their wall time ("t=<s>").
REPRODUCE_LOGS = ("docs/sweeps/2026-12-04_2f7b718_gpu_reproduce/reproduce_three_shapes.log",
                  "docs/sweeps/2026-12-04_2f7b718_gpu_reproduce/reproduce_four_shapes.log")
# The newest `make test` on the H200: pytest's summary line, then nbval's.
MAKE_TEST_LOG = "docs/sweeps/2026-12-04_d1b6a00_gpu_make_test.txt"
# A training step of the scale study's model, each mixer timed alone at one token budget (H100).
STEP_SPEED_FILES = tuple(f"docs/sweeps/2026-12-07_8951e76_gpu_h100_training_step_speed/{name}"
                         for name in ("step_speed_8192_16384.json", "step_speed_32768.json"))


def _results(data_dir: Path, slug: str) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """(result document, its frame, the published H800 result's frame), each file validated."""
    doc = schema.read_valid_json(data_dir / "results" / f"{slug}.json", "result")
    published = schema.read_valid_json(
        data_dir / "reference" / paths.PUBLISHED_H800_FILE.name, "result")
    return doc, report.frame(doc), report.frame(published, report.PUBLISHED_SOURCE)


def _ms(value: float, digits: int = 3) -> str:
    return DASH if pd.isna(value) else f"{value:.{digits}f} ms"


def _times(value: float, digits: int = 1) -> str:
    return DASH if pd.isna(value) else f"{value:.{digits}f}"


def _code_said(doc: dict, shapes: list) -> str:
    """The commits the shapes' rows ran at, from the results' per-shape environments: "at c; "
    for one, "at c (n shapes), d (m shapes); " for several, "" where none is recorded."""
    commits = [(e.get("git_commit") or "")[:7]  # None outside a git checkout
               for key, e in doc.get("shape_environments", {}).items()
               if Shape.of(key).label in shapes]
    counts = {c: commits.count(c) for c in dict.fromkeys(commits) if c}
    if len(counts) <= 1:
        return "".join(f"at {c}; " for c in counts)
    return "at " + ", ".join(f"{c} ({n} shape{'s' * (n > 1)})" for c, n in counts.items()) + "; "


def speed_table(data_dir: Path, slug: str = report.COMMITTED_SLUG) -> str:
    """The complete mixer's forward+backward at `make reproduce`'s default GPU shapes: each
    mixer's published H800 median beside this GPU's median and GPU time (with its multiple of
    the floor, and the median over the GPU time); then each mixer's speed-up over its baseline
    (samu.mixers.baselines()) by the published medians, this GPU's medians and its GPU times;
    then where the medians' speed-up falls furthest below the GPU times', from the rows."""
    doc, df, published = _results(data_dir, slug)
    sp = report.speedups(pd.concat([published, df], ignore_index=True))
    ours = sp[sp["source"] != report.PUBLISHED_SOURCE].set_index(["shape", "mixer"])
    theirs = sp[sp["source"] == report.PUBLISHED_SOURCE].set_index(["shape", "mixer"])["speedup"]
    rows = df.set_index(["shape", "mixer"])
    published_ms = published.set_index(["shape", "mixer"])["forward_backward_ms"]
    env = doc["environment"]
    bandwidth = df.loc[~df["cpu"], "copy_TBps"].median()
    gpu = env["gpu"].removeprefix("NVIDIA ")
    shapes = [Shape.parse(key).label for key in pipeline.GPU_SHAPES]
    shapes = [shape for shape in shapes if shape in set(df["shape"])]
    names = [m for m in mixers.names() if m in set(df["mixer"])]
    caption = (
        f"Speed on the {env['gpu']} (torch {env['torch']}, triton {env['triton']}; "
        f"{_code_said(doc, shapes)}`data/results/{slug}.json`) beside the published H800 "
        f"result: the complete mixer's "
        f"forward+backward at `make reproduce`'s default GPU shapes, each mixer at its calibrated "
        f"backend. A median is the protocol's (CUDA events around each call, so the GPU's waits "
        f"for the host's launches are in it; the published times are such medians); GPU time is "
        f"one forward+backward replayed from a CUDA graph, with no host in it, and its multiple of "
        f"the floor ({protocol.FLOOR_BYTES_PER_ELEMENT} bytes per element at {bandwidth:.2f} "
        f"TB/s, the GPU's measured copy bandwidth).")
    lines = [_wrap(caption), "",
             f"| shape (B, L, D) | mixer | published H800 median | {gpu} median "
             f"| {gpu} GPU time (× floor) | {gpu} median / GPU time |",
             "|---" * 6 + "|"]
    for shape in shapes:
        for mixer in names:
            if (shape, mixer) not in rows.index:
                continue
            r = rows.loc[(shape, mixer)]
            lines.append(
                f"| {shape} | {mixers.LABELS[mixer]} "
                f"| {_ms(published_ms.get((shape, mixer), float('nan')), 2)} "
                f"| {_ms(r['forward_backward_ms'])} "
                f"| {_ms(r['gpu_time_ms'])} ({_times(r['gpu_time_times_floor'])}) "
                f"| {_times(r['forward_backward_ms'] / r['gpu_time_ms'], 2)} |")
    for mixer, baseline in mixers.baselines().items():
        if mixer not in names or baseline not in names:
            continue
        them, us = mixers.LABELS[baseline], mixers.LABELS[mixer]
        lines += ["", f"{us}'s speed-up over {them} ({them} time / {us} time):", "",
                  f"| shape (B, L, D) | published H800 medians | {gpu} medians (10th-90th pct. "
                  f"of the sample ratios) | {gpu} GPU times |", "|---" * 4 + "|"]
        for shape in shapes:
            if (shape, mixer) not in ours.index:
                continue
            median = ours.loc[(shape, mixer)]
            gpu_ratio = rows.loc[(shape, baseline), "gpu_time_ms"] / rows.loc[(shape, mixer),
                                                                               "gpu_time_ms"]
            lines.append(
                f"| {shape} | {_times(theirs.get((shape, mixer), float('nan')), 2)} "
                f"| {median['speedup']:.2f} ({median['low']:.2f}-{median['high']:.2f}) "
                f"| {_times(gpu_ratio, 2)} |")
        lines += ["", _wrap(_furthest_below(rows, ours, shapes, mixer, baseline))]
    return "\n".join(lines)


def _furthest_below(rows: pd.DataFrame, ours: pd.DataFrame, shapes: list, mixer: str,
                    baseline: str) -> str:
    """Where the medians' speed-up falls furthest below the GPU times', and each median's
    multiple of its GPU time there: the share of a median that is not the kernels'."""
    def gpu_ratio(shape):
        return rows.loc[(shape, baseline), "gpu_time_ms"] / rows.loc[(shape, mixer), "gpu_time_ms"]
    timed = [s for s in shapes if (s, mixer) in ours.index and pd.notna(gpu_ratio(s))]
    shape = min(timed, key=lambda s: ours.loc[(s, mixer), "speedup"] / gpu_ratio(s))
    over = {m: rows.loc[(shape, m), "forward_backward_ms"] / rows.loc[(shape, m), "gpu_time_ms"]
            for m in (mixer, baseline)}
    us, them = mixers.LABELS[mixer], mixers.LABELS[baseline]
    return (f"The medians' speed-up falls furthest below the GPU times' at {shape}: "
            f"{ours.loc[(shape, mixer), 'speedup']:.2f} against {gpu_ratio(shape):.2f}. There "
            f"{us}'s median is {over[mixer]:.1f} times its GPU time and {them}'s "
            f"{over[baseline]:.1f} times: the medians hold time outside the kernels (the GPU "
            f"waiting for the host), {100 - 100 / over[mixer]:.0f} % of {us}'s and "
            f"{100 - 100 / over[baseline]:.0f} % of {them}'s, which narrows their ratio; the kernels' "
            f"speed-up is the GPU times' ratio.")


def _wrap(paragraph: str) -> str:
    """A paragraph in lines of at most 100 characters, as the rest of the README."""
    return textwrap.fill(paragraph, width=100, break_long_words=False, break_on_hyphens=False)


def _cell(stats: pd.Series | None, bold: bool) -> str:
    """A mixer's mean (range over seeds) in the training table; "-" where it did not run."""
    if stats is None:
        return "-"
    finite, seeds = int(stats["finite"]), int(stats["seeds"])
    if finite == 0:  # the best rate is a finite one's where there is one: none was
        return "diverged at every rate"
    text = f"{stats['mean']:.3f}"
    if f"{stats['min']:.3f}" != f"{stats['max']:.3f}":
        text += f" ({stats['min']:.3f}-{stats['max']:.3f})"
    text = f"**{text}**" if bold else text
    return text + (f", {seeds - finite} of {seeds} seeds diverged" if finite < seeds else "")


def training_table(data_dir: Path, slug: str = report.COMMITTED_SLUG,
                   configuration: str | None = None) -> str:
    """A training study's scores (the unnamed configuration's, or ``configuration``'s): each
    mixer's mean at its best learning rate with the range over seeds (training.summary), the
    best mean of a row in bold, and the GPU time per step."""
    name = training.result_path(slug, configuration).name
    doc = schema.read_valid_json(data_dir / "training" / name, "training")
    study, env = doc["study"], doc["environment"]
    mixers = list(study["mixers"])
    summary = training.summary(doc).set_index(["task", "seq_len", "mixer"])
    runs = training.frame(doc)
    check = training.sanity(doc)
    block = " (Griffin block)" if study.get("recurrent_block") == "griffin" else ""
    names = [training.MIXER_NAMES[m] + ("" if m == "attention" else block) for m in mixers]
    steps = ", ".join(f"{training.TASK_NAMES[t].split(' (')[0]} {training.steps_said(c)}"
                      for t, c in study["train"].items())
    sanity = "; ".join(training.check_text(t, c) for t, c in check["checks"].items())
    command = "make train" + ("" if name == f"{slug}.json" else f" CONFIG={configuration}")
    curves = len(doc.get("recall_curves", []))
    caption = (
        f"What each mixer learns (`{command}` on the {env['gpu']}, `data/training/{name}`: "
        f"{len(doc['runs'])} runs{f' and {curves} recall-curve runs' if curves else ''}; "
        f"width {study['width']}, {study['layers']} layers; steps: {steps}): mean over "
        f"{len(study['seeds'])} seeds at each mixer's best learning rate, the range over seeds "
        f"in brackets, the best mean of a row in bold, none where attention fails the "
        f"task's sanity bar."
        + (f" Attention on each: {sanity}." if sanity else " No task's bar was checked."))
    lines = [_wrap(caption)]
    lines += ["", "| task | " + " | ".join(names) + " |", "|---" * (len(mixers) + 1) + "|"]
    for (task, length), part in summary.groupby(level=["task", "seq_len"], sort=False):
        part = part.droplevel(["task", "seq_len"])
        accuracy = training.METRICS[task] == "accuracy"
        means = part["mean"].dropna()
        best = (means.idxmax() if accuracy else means.idxmin()) if len(means) else None
        if (part["finite"] < part["seeds"]).any():
            best = None  # a diverged seed: no best is claimed (as the conclusion)
        label = f"{training.TASK_NAMES[task]}, L = {length}"
        label += "" if accuracy else ", bits per character"
        if task not in check["compared"]:
            label, best = label + training.not_compared_note(task, check), None
        lines.append(f"| {label} | " + " | ".join(
            _cell(part.loc[m] if m in part.index else None, m == best) for m in mixers) + " |")
    gpu = training.speed_by_mixer(runs, "gpu_ms_per_step")
    alone = all(r.get("concurrent_runs", 1) <= 1 or "solo_gpu_ms_per_step" in r
                for r in doc["runs"])
    lines.append(f"| GPU time per training step ({training.SPEED_AVERAGE}; "
                 f"{'each timed alone' if alone else 'some timed while sharing the GPU'}) | "
                 + " | ".join(_ms(gpu.get(m, float("nan")), 2) for m in mixers) + " |")
    side = training.side_by_side_frame(doc)
    if side is not None:  # the parts' configurations timed again in the command that merged
        ms = training.speed_by_mixer(side, "ms_per_step")
        lines.append(f"| {side.attrs['clock']} time per training step, every configuration timed "
                     f"side by side in the command that merged the parts ({training.SPEED_AVERAGE}"
                     ") | " + " | ".join(_ms(ms.get(m, float("nan")), 2) for m in mixers) + " |")
    shared = _shared_timing(doc["runs"])
    if shared:
        lines += ["", _wrap(" ".join(shared))]
    return "\n".join(lines)


def _shared_timing(runs: list[dict]) -> list[str]:
    """For each mixer whose runs trained several at a time on one GPU: how many, their median
    GPU time per step while sharing it, and the solo re-timing the table gives instead."""
    out = []
    for mixer in dict.fromkeys(r["mixer"] for r in runs):
        mine = [r for r in runs if r["mixer"] == mixer]
        at_once = sorted({r.get("concurrent_runs", 1) for r in mine})
        if max(at_once) <= 1:
            continue
        # As the table's: per task and length, then averaged (the records keep the shared time).
        shared = pd.DataFrame([{k: r.get(k) for k in ("task", "seq_len", "mixer",
                                                      "gpu_ms_per_step")} for r in mine])
        shared["gpu_ms_per_step"] = pd.to_numeric(shared["gpu_ms_per_step"], errors="coerce")
        while_shared = training.speed_by_mixer(shared, "gpu_ms_per_step").get(mixer, float("nan"))
        steps = sorted({r["solo_timed_steps"] for r in mine if "solo_timed_steps" in r})
        out.append(
            f"{_label(mixer).capitalize()}'s runs trained {' or '.join(map(str, at_once))} at a "
            f"time on the GPU (median GPU time per step while sharing it: {while_shared:.2f} ms); "
            f"the table gives its {' or '.join(map(str, steps))} steps re-timed alone after each "
            f"run.")
    others = [_label(m) for m in dict.fromkeys(r["mixer"] for r in runs)
              if all(r.get("concurrent_runs", 1) == 1 for r in runs if r["mixer"] == m)]
    if out and others:
        out.append(f"{' and '.join(others)} trained one run at a time, timed as they trained.")
    return out


def _label(mixer: str) -> str:
    return training.MIXER_NAMES.get(mixer, mixer)


def results_tables(data_dir=None) -> str:
    """The README's results block (without its markers): the speed table and the training
    study's, from ``data_dir`` (default: the repository's data/)."""
    data_dir = Path(data_dir) if data_dir is not None else paths.REPO_ROOT / "data"
    return (speed_table(data_dir) + "\n\n" + training_table(data_dir)
            + study_sections(data_dir, report.COMMITTED_SLUG,
                             skip=(training.UNNAMED_CONFIGURATION,)) + "\n")


def other_gpu_tables(data_dir=None) -> str:
    """The speed table of every GPU with a results file besides the committed one
    (data/results/<gpu>.json), each under its own heading, with how many of `make reproduce`'s
    default shapes it ran.  A CPU run's file (git ignores it) is no GPU's: it has no table."""
    data_dir = Path(data_dir) if data_dir is not None else paths.REPO_ROOT / "data"
    slugs = sorted(p.stem for p in (data_dir / "results").glob("*.json")
                   if p.stem not in (report.COMMITTED_SLUG, report.CPU_SLUG))
    parts = []
    for slug in slugs:
        doc, df, _ = _results(data_dir, slug)
        if report.is_cpu(doc["environment"], slug):
            continue
        ran = {Shape.of(s).key for s in df["shape_tuple"]} & set(pipeline.GPU_SHAPES)
        figure = data_dir / "figures" / f"{slug}_floor_multiples.png"
        parts.append(f"### On the {doc['environment']['gpu']}\n\n"
                     + _wrap(f"{len(ran)} of the {len(pipeline.GPU_SHAPES)} default shapes ran "
                             "there.") + "\n\n" + speed_table(data_dir, slug)
                     + (f"\n\n![multiples of the floor on the {doc['environment']['gpu']}]"
                        f"(data/figures/{figure.name})" if figure.exists() else "")
                     + study_sections(data_dir, slug))
    if not parts:
        return ""
    return "## Results on other GPUs\n\n" + "\n\n".join(parts) + "\n"


def study_sections(data_dir: Path, slug: str, skip=()) -> str:
    """The training studies of ``slug`` with a result file (every configuration of
    training.CONFIGURATIONS not in ``skip``), each as its table, quality-against-time figure and
    conclusion when it has runs, and as the recall curves' lines and figure when it has those;
    "" where that GPU has none."""
    out = []
    for name in training.CONFIGURATIONS:
        path = data_dir / "training" / training.result_path(slug, name).name
        if name in skip or not path.exists():
            continue
        doc = schema.read_valid_json(path, "training")
        gpu = doc["environment"]["gpu"]

        def figure(kind: str, what: str) -> str:
            png = data_dir / "figures" / training.figure_path(slug, kind, name).name
            return f"\n\n![{what} on the {gpu}](data/figures/{png.name})" if png.exists() else ""
        if doc["runs"]:
            words = training.conclusion({**doc, "recall_curves": []}).split("\n\n")
            out.append(training_table(data_dir, slug, name)
                       + figure("quality_speed", "quality against training time") + "\n\n"
                       + "\n\n".join(_wrap(line) for line in words))
        if doc.get("recall_curves"):
            envs = [p["environment"] for p in doc.get("parts", [])] or [doc["environment"]]
            commits = dict.fromkeys((e.get("git_commit") or "?")[:7] for e in envs)
            lead = (f"Recall curves on the {gpu} (`make train CONFIG={name}`, "
                    f"`data/training/{path.name}`, at {', '.join(commits)}):")
            lines = [lead] + training.recall_curve_lines(doc)
            out.append("\n\n".join(_wrap(line) for line in lines)
                       + figure("recall_curves", "recall curves"))
    return "".join("\n\n" + part for part in out)


def result_rows_table(data_dir=None, slug: str = report.COMMITTED_SLUG) -> str:
    """docs/LAB.md's table: every row of the results beside the published H800 time, with its
    floor multiples, the public pipeline, host cost, peak memory and the commit it ran at."""
    data_dir = Path(data_dir) if data_dir is not None else paths.REPO_ROOT / "data"
    doc, df, published = _results(data_dir, slug)
    published = published.set_index(["shape", "mixer"])["forward_backward_ms"]
    commits = {Shape.of(k).label: e.get("git_commit", "")[:7]
               for k, e in doc.get("shape_environments", {}).items()}
    lines = ["| shape | mixer | backend (calibrated) | published H800 | median | × floor "
             "| GPU time | × floor | public pipeline | host / Linear | peak Δ (units) | code |",
             "|---" * 12 + "|"]
    order = {key: i for i, key in enumerate(pipeline.GPU_SHAPES)}  # then the other shapes
    df = df.sort_values("shape_tuple", kind="stable", key=lambda c: c.map(
        lambda s: order.get(Shape.of(s).key, len(order))))
    for r in df.itertuples():
        headline = r.peers.get(report.HEADLINE_PEER, {})
        peer_ms = headline.get("forward_backward_ms", float("nan"))
        peer = (DASH if pd.isna(peer_ms) else f"{peer_ms:.2f} ms ({r.speedup_vs_peer:.1f}×)")
        lines.append(
            f"| {r.shape} | {r.mixer} | `{r.backend}` "
            f"| {_ms(published.get((r.shape, r.mixer), float('nan')), 2)} "
            f"| {_ms(r.forward_backward_ms)} | {r.times_floor:.0f} | {_ms(r.gpu_time_ms)} "
            f"| {_times(r.gpu_time_times_floor)} | {peer} | {_times(r.host_ratio_to_linear)} "
            f"| {r.peak_allocated_delta_units:.2f} | `{commits.get(r.shape, '')}` |")
    return "\n".join(lines) + "\n"


# --- figures quoted outside the blocks --------------------------------------------------------

WALL = re.compile(r"(?:\bwall=|^t=)(\d+)\b", re.MULTILINE)


def command_seconds(path) -> list[int]:
    """The wall time of each command a device log records ("rc=0 wall=371", "t=492 rc=0")."""
    return [int(v) for v in WALL.findall(Path(path).read_text(errors="replace"))]


PASSED = re.compile(r"^\d+ passed.* in ([\d.]+)s\b", re.MULTILINE)


def make_test_seconds(path) -> tuple[float, float]:
    """(pytest's, nbval's) seconds from a `make test` log: their summary lines, in order."""
    found = [float(v) for v in PASSED.findall(Path(path).read_text(errors="replace"))]
    if len(found) != 2:
        raise ValueError(f"{path}: expected pytest's and nbval's summary lines, found {found}")
    return found[0], found[1]


def training_part_seconds(repo_root=None, slug: str = report.COMMITTED_SLUG) -> list[list[int]]:
    """Per part of the committed training study, the wall time of each `make train PART=k`
    command that made it: the logs docs/sweeps/*_<commit>_gpu_training/make_train_part<k>*.txt
    of the commit each part's environment names (a part cut short and gone on with has two)."""
    root = Path(repo_root) if repo_root is not None else paths.REPO_ROOT
    doc = schema.read_valid_json(root / "data" / "training" / f"{slug}.json", "training")
    out = []
    for part in doc["parts"]:
        k = part["part"].split("/")[0]
        commit = part["environment"]["git_commit"][:7]
        logs = sorted(root.glob(f"docs/sweeps/*_{commit}_gpu_training/make_train_part{k}*.txt"))
        out.append([s for log in logs for s in command_seconds(log)])
    return out


def recurrent_step_ratios(repo_root=None) -> dict[int, tuple[float, float]]:
    """{length: (least, most)} of a recurrent mixer's GPU time per training step over
    attention's at that length, from STEP_SPEED_FILES."""
    root = Path(repo_root) if repo_root is not None else paths.REPO_ROOT
    rows = [row for name in STEP_SPEED_FILES for row in schema.read_json(root / name)]
    attention = {row["length"]: row["solo_gpu_ms_per_step"] for row in rows
                 if row["mixer"] == "attention"}
    ratios: dict[int, list[float]] = {}
    for row in rows:
        if row["mixer"] != "attention":
            ratios.setdefault(row["length"], []).append(
                row["solo_gpu_ms_per_step"] / attention[row["length"]])
    return {length: (min(r), max(r)) for length, r in sorted(ratios.items())}


def _minutes(seconds: float) -> str:
    return f"about {round(seconds / 60)} min"


def facts(repo_root=None) -> dict[str, str]:
    """Each figure the README quotes outside its results block, as the README writes it."""
    root = Path(repo_root) if repo_root is not None else paths.REPO_ROOT
    _, _, published = _results(root / "data", report.COMMITTED_SLUG)
    sp = report.speedups(published)["speedup"]
    parts = training_part_seconds(root)
    reproduce = [s for log in REPRODUCE_LOGS for s in command_seconds(root / log)]
    cells = sum(1 for nb in sorted((root / "notebooks").glob("*.ipynb"))
                for cell in schema.read_json(nb)["cells"] if cell["cell_type"] == "code")
    pytest, nbval = make_test_seconds(root / MAKE_TEST_LOG)
    percent, budgets = calibration.memory_rule_text()
    (l0, r0), (l1, r1), (l2, r2) = recurrent_step_ratios(root).items()
    return {
        "published speed-ups": f"{sp.min():.2f} to {sp.max():.2f}",
        "make test, H200": f"{_minutes(pytest + nbval)}: pytest {pytest:.0f} s, nbval {nbval:.0f} s",
        "make train, H200": f"{_minutes(sum(map(sum, parts)))} in {len(parts)} parts",
        "make reproduce, H200": (f"{_minutes(sum(reproduce))} for the {len(pipeline.GPU_SHAPES)} "
                                 "default shapes"),
        "notebook cells": f"{cells} notebook cells",
        "recurrent step against attention's, H100": (
            f"at L = {l0} now costs {r0[0]:.2f}-{r0[1]:.2f} of attention's, and with the same "
            f"tokens a step {r1[0]:.2f}-{r1[1]:.2f} of it at L = {l1} and "
            f"{r2[0]:.2f}-{r2[1]:.2f} at {l2}"),
        "auto's memory rule": (
            f"one up to {percent} % slower that keeps the "
            f"mixer's peak memory within its budget ({budgets} units"),
    }


# --- the blocks in their files -----------------------------------------------------------------

def _span(text: str, begin: str, end: str) -> tuple[int, int]:
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start or text.count(begin) != 1 or text.count(end) != 1:
        raise ValueError(f"expected one {begin!r} followed by one {end!r}")
    return start + len(begin) + 1, stop


def block(text: str, begin: str = RESULTS_BEGIN, end: str = RESULTS_END) -> str:
    """What stands between the markers (one line break after the first marker is theirs)."""
    start, stop = _span(text, begin, end)
    return text[start:stop]


def with_block(text: str, rendered: str, begin: str = RESULTS_BEGIN,
               end: str = RESULTS_END) -> str:
    start, stop = _span(text, begin, end)
    return text[:start] + rendered + text[stop:]


def targets(data_dir=None) -> list[tuple[Path, str, str, str]]:
    """(file, begin marker, end marker, rendered block) of every generated block."""
    return [(README, RESULTS_BEGIN, RESULTS_END, results_tables(data_dir)),
            (README, OTHER_GPUS_BEGIN, OTHER_GPUS_END, other_gpu_tables(data_dir)),
            (LAB, ROWS_BEGIN, ROWS_END, result_rows_table(data_dir))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m samu.experiment.readme",
                                     description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="rewrite the blocks in place")
    action.add_argument("--check", action="store_true",
                        help="exit 1 where a block differs from the data files")
    args = parser.parse_args(argv)
    if not (args.write or args.check):
        print(results_tables(), end="")
        return 0
    try:
        rendered_blocks = list(targets())
    except schema.ResultFileError as exc:  # a data file the blocks render from is broken
        raise SystemExit(f"python -m samu.experiment.readme: {exc}") from None
    stale = []
    for path, begin, end, rendered in rendered_blocks:
        text = path.read_text()
        try:
            current = block(text, begin, end)
        except ValueError as exc:
            raise SystemExit(f"{paths.relative(path)}: {exc}") from None
        if current == rendered:
            continue
        stale.append(paths.relative(path))
        if args.write:
            new = with_block(text, rendered, begin, end)
            schema.atomic_write(path, lambda tmp: tmp.write_text(new))
    for name in stale:
        print(f"{name}: {'rewritten' if args.write else 'differs from the data files'}")
    return 1 if stale and args.check else 0

if __name__ == "__main__":
    sys.exit(main())

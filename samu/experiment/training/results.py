"""The training study's result document (schema ``samu.experiment.schema.SCHEMAS["training"]``):
writing it (whole, or a part's, and merging the parts), and reading it: ``frame`` (a row a run),
each mixer at its best learning rate (``learning_rate_choice``, ``best_frame``, ``summary``)
and the yardstick's ``sanity``."""
from __future__ import annotations

import math
import platform
import re
from collections.abc import Mapping
from pathlib import Path

from ... import mixers as mixers_
from ... import model as model_
from .. import protocol, schema
from .loop import dtype_name
from .parameters import ParameterError
from .tasks import METRIC_TABLE, TASKS

# The configuration whose files carry no configuration's name (the study as it first ran).
UNNAMED_CONFIGURATION = "small"
# The accuracy attention must reach on the sanity tasks at their shortest length before the
# study compares mixers, for documents that do not state their own.
SANITY_BAR = 0.95


def higher_is_better(metric: str) -> bool:
    return METRIC_TABLE[metric].higher_is_better


class _MixerLabels(Mapping):
    """{mixer: its label} over the mixers a model can hold (samu.model.mixer_names()):
    attention's, and each registered mixer's spec's, read when looked up."""

    def __getitem__(self, mixer):
        if mixer == "attention":
            return "attention"
        try:
            return mixers_.get(mixer).label
        except ValueError:
            raise KeyError(mixer) from None

    def __iter__(self):
        return iter(model_.mixer_names())

    def __len__(self):
        return len(model_.mixer_names())


MIXER_NAMES = _MixerLabels()


def parse_part(part) -> tuple | None:
    """``"2/3"`` -> (2, 3); None -> None; ParameterError for anything else (k from 1 to n, each
    in plain ASCII digits without a leading zero: one part has one spelling, which its file's
    name and its merge compare)."""
    if part is None:
        return None
    match = re.fullmatch(r"([1-9][0-9]*)/([1-9][0-9]*)", part) if isinstance(part, str) else None
    k, n = (int(match[1]), int(match[2])) if match else (0, 0)
    if not 1 <= k <= n:
        raise ParameterError(f"part must be None or 'k/n' with 1 <= k <= n, each in plain "
                             f"digits without a leading zero, got {part!r}")
    return k, n


# --- writing ------------------------------------------------------------------------------------

def environment(device) -> dict:
    """The timing protocol's environment (versions, GPU, driver, commit, date) of the device the
    study trained on, with its dtype: a CPU run on a GPU machine names no GPU."""
    env = protocol.environment(device)
    env["dtype"] = dtype_name(device)
    return env


def result_document(study, records: list[dict], device, recall_curves: list[dict] | None = None,
                    pool=None) -> dict:
    """The document of ``study`` (a Study): its runs' records, its recall curves' (if any),
    the environment, how ``pool`` (a RunPool) spread the runs, and under "data" what each task
    with a ``data_info`` records about its data (the LM's corpus)."""
    doc = {"schema_version": schema.SCHEMA_VERSION, "kind": "training",
           "environment": environment(device), "study": study.describe(), "runs": records}
    if pool is not None:
        doc["concurrency"] = pool.describe()
    if recall_curves:
        doc["recall_curves"] = recall_curves
    data = {name: task.data_info() for name in study.tasks
            for task in study.task_list(name)[:1] if hasattr(task, "data_info")}
    if data:
        doc["data"] = data
    return doc


CPU_SIZE_SUFFIX = "-cpu-size"


def results_label(device, size: str) -> str:
    """The label of a study's files (results, figures, executed notebook): the device's slug,
    with CPU_SIZE_SUFFIX where a CPU's size ran on a GPU, so that the quick defaults (what nbval
    runs) never overwrite that GPU's study."""
    slug = protocol.device_slug(device)
    return slug if size == "gpu" or slug == "cpu" else slug + CPU_SIZE_SUFFIX


def result_path(slug: str, configuration: str | None = None) -> Path:
    """data/training/<slug>.json (samu.paths.training_file) for the unnamed configuration,
    data/training/<slug>.<configuration>.json for the others."""
    from ... import paths
    path = paths.training_file(slug)
    if configuration in (None, UNNAMED_CONFIGURATION):
        return path
    return path.with_name(f"{slug}.{configuration}.json")


def part_path(slug: str, part: str, configuration: str | None = None) -> Path:
    """One part's result document: result_path's name with ``.part-<k>-of-<n>`` before
    ``.json``."""
    k, n = parse_part(part)
    whole = result_path(slug, configuration)
    return whole.with_name(f"{whole.stem}.part-{k}-of-{n}.json")


# What a merged study's parts may differ in without being refused, but a reader should know.
ENVIRONMENT_FIELDS_SAID = ("git_commit", "torch", "triton", "driver")


def mixed_environments(doc: dict) -> str | None:
    """A line naming the commits and versions a merged study's parts ran at, where they differ
    (None where they agree, or for a document of one part)."""
    parts = doc.get("parts") or []
    differing = []
    for field in ENVIRONMENT_FIELDS_SAID:
        values = [p["environment"].get(field) for p in parts]
        if len(set(map(str, values))) > 1:
            differing.append(f"{field} " + ", ".join(
                f"{p['part']}: {v}" for p, v in zip(parts, values)))
    if not differing:
        return None
    return "the parts ran at different " + "; ".join(differing)


def write_part(doc: dict, slug: str) -> Path:
    """A part's document (its study's ``part`` and ``configuration`` say which), validated and
    written atomically."""
    study = doc["study"]
    return schema.write_json_atomic(part_path(slug, study["part"], study.get("configuration")),
                                    doc, kind="training")


def merge_parts(slug: str, part: str, configuration: str | None = None) -> dict | None:
    """When every part of ``part``'s study has its file: the documents joined into one (every
    run, in part order; the first part's environment, each part's in ``parts``), written to
    result_path(slug, configuration) and returned; None while a part is missing.  Parts of
    different studies, data or GPUs are refused."""
    _, n = parse_part(part)
    paths_ = [part_path(slug, f"{k}/{n}", configuration) for k in range(1, n + 1)]
    if not all(p.exists() for p in paths_):
        return None
    docs = [schema.read_valid_json(p, "training") for p in paths_]
    wanted = configuration or UNNAMED_CONFIGURATION
    for k, (p, d) in enumerate(zip(paths_, docs), start=1):
        holds = d["study"].get("configuration") or UNNAMED_CONFIGURATION
        if holds != wanted:
            raise ValueError(f"{p}: holds a part of the {holds} study, not of {wanted}; not "
                             "merged")
        if d["study"].get("part") != f"{k}/{n}":
            # A file copied or renamed to another part's name would be merged twice or as
            # another part's runs.
            raise ValueError(f"{p}: holds part {d['study'].get('part')!r} of its study, not "
                             f"{k}/{n} as its name says; not merged")

    for p, d in zip(paths_[1:], docs[1:]):
        if _without_part(d["study"]) != _without_part(docs[0]["study"]):
            raise ValueError(f"{p}: its study differs from that of {paths_[0]}; not merged")
        if d["environment"].get("gpu") != docs[0]["environment"].get("gpu"):
            # Each part is often one mixer's runs: their speeds would compare two devices.
            raise ValueError(f"{p}: ran on {d['environment'].get('gpu')}, {paths_[0]} on "
                             f"{docs[0]['environment'].get('gpu')}; not merged")
        if _data_identity(d) != _data_identity(docs[0]):
            raise ValueError(f"{p}: its runs trained on other data than those of {paths_[0]} "
                             "(the checksums in \"data\" differ); not merged")
    merged = dict(docs[0])
    merged["study"] = {**_without_part(docs[0]["study"]), "part": None}
    merged["runs"] = [r for d in docs for r in d["runs"]]
    curves = [r for d in docs for r in d.get("recall_curves", [])]
    if curves:
        merged["recall_curves"] = curves
    merged["parts"] = [{"part": d["study"]["part"], "environment": d["environment"],
                        **({"concurrency": d["concurrency"]} if "concurrency" in d else {})}
                       for d in docs]
    merged.pop("concurrency", None)  # each part's is in "parts"
    merged["bars_recorded"] = record_missing_bars(merged)
    earlier = _earlier_side_by_side(result_path(slug, configuration), merged)
    if earlier:  # timed when these parts were first merged; merged again, it still holds
        merged["side_by_side"] = earlier
    write_result(merged, slug)
    return merged


def _earlier_side_by_side(path: Path, merged: dict) -> dict | None:
    """The side-by-side timing of the document at ``path`` when it holds ``merged``'s study
    timed on its GPU; else None."""
    try:
        before = schema.read_valid_json(path, "training")
    except (FileNotFoundError, schema.ResultFileError):
        return None
    block = before.get("side_by_side")
    if not block or _without_part(before["study"]) != _without_part(merged["study"]) \
            or block["environment"].get("gpu") != merged["environment"].get("gpu"):
        return None
    return block


# What a corpus's checksums are: the fields of data_info() that say which bytes it holds.
DATA_IDENTITY = ("train_bytes", "train_sha256", "validation_bytes", "validation_sha256")


def _identity(info: dict) -> dict:
    return {k: info.get(k) for k in DATA_IDENTITY}


def _data_identity(doc: dict) -> dict:
    return {name: _identity(info) for name, info in (doc.get("data") or {}).items()}


def record_missing_bars(doc: dict) -> dict:
    """Fills in the task's own sanity bar (``yardstick_bar``) of runs that ran before it was
    recorded, where this machine holds the very data they trained on (the checksums in the
    document's "data" match).  Returns {task: what was done, in words}; runs are changed in
    place, nothing else."""
    from .tasks import make_task
    done = {}
    for name, recorded in (doc.get("data") or {}).items():
        runs = [r for r in doc["runs"] if r["task"] == name and r.get("yardstick_bar") is None]
        if not runs or name not in TASKS:
            continue
        task = make_task(name, runs[0]["seq_len"], **runs[0].get("task_options", {}))
        if not hasattr(type(task), "yardstick_bar"):
            continue
        here = task.data_info()
        where = f"where the merge ran (Python {here.get('python')}, {platform.machine()})"
        if _identity(here) != _identity(recorded):
            done[name] = (f"no bar recorded for {len(runs)} runs: the data {where} are not "
                          f"theirs (Python {recorded.get('python')} in the runs; the checksums "
                          "differ)")
            continue
        bar = task.yardstick_bar
        for r in runs:
            r["yardstick_bar"] = bar
        done[name] = (f"bar {bar:.4f} recorded for {len(runs)} runs, from the data {where}, "
                      "whose checksums match theirs")
    return done


def _without_part(study: dict) -> dict:
    return {k: v for k, v in study.items() if k != "part"}


def merge_when_whole(slug: str, part: str, configuration: str | None,
                     study: dict) -> tuple[dict | None, str]:
    """(merge_parts's document, "") once every part's file of ``part``'s study holds ``study``
    (a Study.describe(), its own part aside); else (None, why): the parts still to run, and
    those whose file holds another study or cannot be read, to run again."""
    from ... import paths
    _, n = parse_part(part)
    files = [part_path(slug, f"{k}/{n}", configuration) for k in range(1, n + 1)]
    missing = [f for f in files if not f.exists()]
    other = []
    for f in files:
        if f in missing:
            continue
        try:
            held = schema.read_valid_json(f, "training")["study"]
        except schema.ResultFileError:
            held = None
        if held is None or _without_part(held) != _without_part(study):
            other.append(f)
    why = []
    if missing:
        why.append("still to run: " + ", ".join(str(paths.relative(f)) for f in missing))
    if other:
        why.append("of another study or unreadable, to run again: "
                   + ", ".join(str(paths.relative(f)) for f in other))
    if why:
        return None, "not merged; parts " + "; parts ".join(why)
    return merge_parts(slug, part, configuration), ""


def fresh_result(slug: str, part: str, configuration: str | None) -> Path:
    """The file that holds a part's runs now: the whole study's where it was merged from this
    part's study (or where the part wrote none), else the part's own."""
    own = part_path(slug, part, configuration)
    whole = result_path(slug, configuration)
    if not own.exists():
        return whole
    if whole.exists():
        merged = schema.read_valid_json(whole, "training")
        study = schema.read_valid_json(own, "training")["study"]
        if merged.get("parts") and _without_part(merged["study"]) == _without_part(study):
            return whole
    return own


def validate(doc: dict) -> None:
    """Raise jsonschema.ValidationError naming the first problem (non-finite numbers taken as the
    strings they are written as)."""
    schema.validate(schema._finite(doc), "training")


def write_result(doc: dict, slug: str) -> Path:
    """Validated against the "training" schema, then written atomically to result_path (its
    study's configuration's)."""
    return schema.write_json_atomic(result_path(slug, doc["study"].get("configuration")), doc,
                                    kind="training")


def steps_said(config: dict) -> str:
    """A task's steps as its described TrainConfig (a document's ``study["train"][task]``) gives
    them: "600", or "up to 12000" where a run may end sooner (an early stop once solved, or a
    "wsd" decay that a plateau of the loss starts)."""
    sooner = config.get("stop_loss") is not None or config.get("plateau_from") is not None
    return f"up to {config['steps']}" if sooner else str(config["steps"])


def runs_of(doc) -> list[dict]:
    """The run records of a document, or the list of records given."""
    return doc["runs"] if isinstance(doc, dict) else list(doc)


# frame()'s speed columns and the record fields of the speed timed alone that replace them.
SOLO_COLUMNS = {"tokens_per_s": "solo_tokens_per_s", "wall_ms_per_step": "solo_wall_ms_per_step",
                "gpu_ms_per_step": "solo_gpu_ms_per_step", "train_wall_s": "solo_train_s"}


def frame(doc):
    """One row per run (of a document, or of a list of run records): task, mixer, seed, seq_len,
    lr, metric, value, tokens_per_s, parameters, mixer_parameters, ms per step, ..."""
    import pandas as pd
    keys = ("task", "mixer", "seed", "seq_len", "lr", "metric", "value", "chance",
            "values_baseline", "yardstick_bar", "eval_loss", "final_train_loss", "tokens_per_s",
            "parameters", "mixer_parameters", "wall_ms_per_step", "gpu_ms_per_step", "steps",
            "steps_completed", "stopped_by_time", "stopped_early", "diverged", "train_wall_s",
            "wall_s")
    rows = []
    for r in runs_of(doc):
        row = {k: r.get(k) for k in keys}
        if row["mixer_parameters"] is None:  # documents of the earlier study
            row["mixer_parameters"] = r.get("parameter_counts", {}).get("mixer")
        # The speed timed alone on the device where the study measured it (runs that shared the
        # device keep theirs as concurrent_*): steps at that speed are the run's training time.
        row["timed_alone"] = "solo_wall_ms_per_step" in r
        if row["timed_alone"]:
            for column, solo in SOLO_COLUMNS.items():
                row[f"concurrent_{column}"] = row[column]
                row[column] = r.get(solo)
        rows.append(row)
    df = pd.DataFrame(rows, columns=[*keys, "timed_alone"] if not rows else None)
    df["stopped_early"] = df["stopped_early"].fillna(False).astype(bool)  # earlier documents
    for column in ("value", "eval_loss", "final_train_loss", "tokens_per_s", "lr",
                   "wall_ms_per_step", "gpu_ms_per_step", "train_wall_s", "yardstick_bar"):
        df[column] = pd.to_numeric(df[column], errors="coerce")  # "nan" strings of a file
    return df


def speed_by_mixer(timed, column: str):
    """Each mixer's ``column`` of frame() (a speed) as one number: the median over its runs of
    each task and length, then the mean over the tasks and lengths every mixer ran.  A median
    over all runs would weigh each mixer's own mix of cheap and costly tasks (a wider rate sweep
    on the LM pulls it toward the LM's step).  Mixers in the frame's order.  Where no task and
    length has runs of every mixer (a part of a study) each mixer's own are averaged, and
    ``attrs["comparable"]`` is False: the numbers are then not to be set against each other."""
    known = timed.dropna(subset=[column])
    cells = known.groupby(["task", "seq_len", "mixer"], sort=False)[column].median() \
        .unstack("mixer")
    common = cells.dropna()
    means = (common if len(common) else cells).mean()
    order = [m for m in dict.fromkeys(known["mixer"]) if m in means.index]
    means = means.reindex(order).dropna()
    means.attrs["comparable"] = bool(len(common)) or len(means) < 2
    return means


SPEED_AVERAGE = "median per task and length, averaged over them"


def side_by_side_frame(doc):
    """The side-by-side timings of a merged document (time_side_by_side), one row per (task,
    length, mixer), with ``column``: GPU time per step where measured, else wall; None when the
    document has none."""
    import pandas as pd
    block = doc.get("side_by_side") if isinstance(doc, dict) else None
    if not block:
        return None
    df = pd.DataFrame(block["rows"])
    gpu = pd.to_numeric(df["gpu_ms_per_step"], errors="coerce")
    df["ms_per_step"] = gpu if gpu.notna().all() else df["wall_ms_per_step"]
    df.attrs["clock"] = "GPU" if gpu.notna().all() else "wall"
    return df


def learning_rate_choice(doc):
    """Per task, length and mixer: the learning rate whose mean metric is best (highest
    accuracy, lowest bits per character) over the seeds that ran at every rate (all of them on
    a grid; the first seed of a first_seed sweep, whose other seeds ran at its best only), the
    rates swept, and ``at_edge``: the best is the lowest or the highest rate of a sweep of three
    or more and beats the rate next to it (edge_beyond), so a better one may lie outside it."""
    import pandas as pd
    df = frame(doc)
    rows = []
    for (task, length, mixer), part in df.groupby(["task", "seq_len", "mixer"], sort=False):
        seeds_per_rate = [set(p["seed"]) for _, p in part.groupby("lr", dropna=False)]
        common = set.intersection(*seeds_per_rate)
        scored = part[part["seed"].isin(common)] if common else part
        means = scored.groupby("lr", dropna=False)["value"].mean()
        finite = means.dropna()
        higher = higher_is_better(part["metric"].iloc[0])
        if len(finite):
            best = finite.idxmax() if higher else finite.idxmin()
        else:
            best = means.index[0]
        rates = sorted(means.index)
        rows.append({"task": task, "seq_len": length, "mixer": mixer, "lr": best,
                     "swept": rates,
                     # Of two rates the best is always one end: flagged from three on.
                     "at_edge": len(rates) > 2
                     and edge_beyond(means.to_dict(), best, higher) is not None,
                     "mean_by_lr": {float(k): float(v) for k, v in means.items()}})
    return pd.DataFrame(rows, columns=["task", "seq_len", "mixer", "lr", "swept", "at_edge",
                                       "mean_by_lr"])


def best_frame(doc):
    """frame(doc) restricted to the runs at each (task, length, mixer)'s best learning rate."""
    import pandas as pd
    df = frame(doc)
    best = {(r.task, r.seq_len, r.mixer): r.lr for r in learning_rate_choice(doc).itertuples()}
    keep = [(row.lr == best[key]) or (pd.isna(row.lr) and pd.isna(best[key]))
            for row, key in ((row, (row.task, row.seq_len, row.mixer))
                             for row in df.itertuples())]
    return df[keep].reset_index(drop=True)


def summary(doc):
    """Per task, length and mixer (of a document, or of a list of run records), at the best
    learning rate (learning_rate_choice): the metric's mean, standard deviation, minimum and
    maximum over seeds, the rate and whether it is at the edge of the sweep, median tokens per
    second and ms per step (wall; GPU time on CUDA), total and mixer parameters.  ``seeds``
    counts the runs, ``finite`` those with a finite score: the mean and range are over these."""
    import pandas as pd
    df = best_frame(doc)
    if df.empty:  # a part of a study that holds none of this task's runs
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    choice = learning_rate_choice(doc).set_index(["task", "seq_len", "mixer"])["at_edge"]
    grouped = df.groupby(["task", "seq_len", "mixer"], sort=False)
    out = grouped.agg(metric=("metric", "first"), lr=("lr", "first"), seeds=("seed", "count"),
                      finite=("value", "count"), mean=("value", "mean"),
                      std=("value", "std"), min=("value", "min"), max=("value", "max"),
                      tokens_per_s=("tokens_per_s", "median"),
                      wall_ms_per_step=("wall_ms_per_step", "median"),
                      gpu_ms_per_step=("gpu_ms_per_step", "median"),
                      parameters=("parameters", "first"),
                      mixer_parameters=("mixer_parameters", "first"),
                      steps_completed=("steps_completed", "min")).reset_index()
    out.insert(5, "lr_at_edge", [bool(choice.loc[(t, l, m)]) for t, l, m in
                                 zip(out["task"], out["seq_len"], out["mixer"])])
    return out


SUMMARY_COLUMNS = ["task", "seq_len", "mixer", "metric", "lr", "lr_at_edge", "seeds", "finite",
                   "mean", "std", "min", "max", "tokens_per_s", "wall_ms_per_step",
                   "gpu_ms_per_step", "parameters", "mixer_parameters", "steps_completed"]


def sanity(doc, bar: float | None = None) -> dict:
    """Whether the yardstick works, task by task: attention's mean score (at its best learning
    rate) at its shortest length on every task whose spec counts for the sanity bar, against
    the task's own bar where its runs record one (``yardstick_bar``: the LM's bigram bits per
    character, to be beaten) and otherwise the accuracy ``bar`` (None: the study's sanity_bar,
    SANITY_BAR for documents without one).  Returns {"bar", "passed", "checks": {task:
    {"seq_len", "metric", "value", "bar", "passed"}}, "compared", "unjudged"}: "compared"
    lists the study's tasks whose comparison may be reported, those whose own check passed
    and, when every check passed, those without one; "unjudged" the tasks attention did not run
    (a part of a study), never compared.  A bits task whose runs record no bar (earlier
    documents) is not checked.  A seed with no finite score (diverged) fails the check."""
    if bar is None:
        bar = doc.get("study", {}).get("sanity_bar", SANITY_BAR) if isinstance(doc, dict) \
            else SANITY_BAR
    checks = {}
    if not runs_of(doc):
        return {"bar": float(bar), "passed": True, "checks": checks, "compared": [],
                "unjudged": []}
    df = best_frame(doc)
    for task in [name for name, spec in TASKS.items() if spec.sanity]:
        part = df[(df["task"] == task) & (df["mixer"] == "attention")]
        if not len(part):
            continue
        shortest = int(part["seq_len"].min())
        part = part[part["seq_len"] == shortest]
        metric = part["metric"].iloc[0]
        own = part["yardstick_bar"].dropna()
        if len(own):
            level = float(own.iloc[0])
        elif higher_is_better(metric):
            level = float(bar)
        else:
            continue
        value = float(part["value"].mean(skipna=False))  # NaN, failing, if a seed diverged
        passed = value >= level if higher_is_better(metric) else value < level
        checks[task] = {"seq_len": shortest, "metric": metric, "value": value, "bar": level,
                        "passed": bool(passed)}
    tasks = list(dict.fromkeys(df["task"]))
    unjudged = [t for t in tasks if not ((df["task"] == t) & (df["mixer"] == "attention")).any()]
    every = all(c["passed"] for c in checks.values())
    compared = [t for t in tasks if t not in unjudged
                and (checks[t]["passed"] if t in checks else every)]
    return {"bar": float(bar), "passed": every and not unjudged, "checks": checks,
            "compared": compared, "unjudged": unjudged}


def not_compared_note(task: str, check: dict, before: str = " ") -> str:
    """Why ``task`` is not compared under ``check`` (sanity's), after ``before``; "" when it
    is."""
    if task in check["compared"]:
        return ""
    why = ("attention did not run it here" if task in check.get("unjudged", ()) else
           "attention fails its bar" if task in check["checks"] else
           "no bar of its own recorded, and attention fails another task's")
    return f"{before}(not compared: {why})"


def check_text(task: str, check: dict) -> str:
    """One sanity check (of sanity's "checks") in words, e.g. "associative recall (MQAR) at
    L = 64: held-out accuracy 0.998 (bar: at least 0.90; passes)"."""
    higher = higher_is_better(check["metric"])
    label = METRIC_TABLE[check["metric"]].label.split("\n")[0]
    name = TASKS[task].label if task in TASKS else task
    value = ("not finite (a seed diverged)" if math.isnan(check["value"])
             else f"{check['value']:.3f}")
    return (f"{name} at L = {check['seq_len']}: {label} {value} (bar: "
            f"{'at least' if higher else 'below'} "
            f"{format(check['bar'], 'g') if higher else format(check['bar'], '.3f')}; "
            f"{'passes' if check['passed'] else 'fails'})")


def best_rate(records: list[dict]) -> float:
    """The rate of the best finite metric among ``records`` (one run per rate: the first
    seed's), the highest accuracy or the lowest bits per character, the lowest rate among equal
    ones (as learning_rate_choice); the lowest rate when none is finite."""
    finite = sorted((r for r in records if math.isfinite(r["value"])), key=lambda r: r["lr"])
    if not finite:
        return min(r["lr"] for r in records)
    pick = max if higher_is_better(records[0]["metric"]) else min
    return pick(finite, key=lambda r: r["value"])["lr"]  # a tie: the lowest rate, as pandas


def edge_beyond(value: dict, best: float, higher_is_better: bool) -> float | None:
    """The end of a sweep (``value``: the metric by rate, two rates or more) where its best
    rate ``best`` sits and strictly beats its neighbour, so a better rate may lie beyond it;
    None when the best is inside or only ties the rate next to it (a saturated or a flat sweep:
    a rate inside does as well)."""
    ordered = sorted(value)
    if len(ordered) < 2 or best not in (ordered[0], ordered[-1]):
        return None
    va = value[best]
    vb = value[ordered[1] if best == ordered[0] else ordered[-2]]
    return best if beats(va, vb, higher_is_better) else None


def beats(va: float, vb: float, higher_is_better: bool) -> bool:
    """Whether a finite metric ``va`` strictly beats ``vb``, which it does where ``vb`` is not
    finite (a diverged run)."""
    if not math.isfinite(va):
        return False
    return not math.isfinite(vb) or (va > vb if higher_is_better else va < vb)



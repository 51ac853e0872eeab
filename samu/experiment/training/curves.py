"""Zoology's recall curves (Arora et al. 2023, figure 2): MQAR accuracy of each mixer over a grid
of (sequence length, key-value pairs) points and model widths, every point trained at each of
its mixer's learning rates and scored at its best; and their own sanity bar, which says whether
the curves can show where a state stops recalling.

The bar: attention solves the smallest pair count at every width of at least
``attention_from_width`` (128 in Zoology's grid), and each other mixer solves it at the widest
width.  A mixer below its bar is not compared: the figure and the conclusion say so instead."""
from __future__ import annotations

from ... import model as model_
from .loop import SCHEDULES, still_learning
from .parameters import COUNT, LEARNING_RATE, OFFSET, ParameterError, Range, check_list
from .results import edge_beyond

# The keys of a study's ``recall_curves``: "points", a list of [seq_len, pairs]; "widths";
# "vocab_size"; "steps".  Optional: "batch_size" (default: the study's MQAR batch, else 64),
# "lr" (the rates every point is trained at: a list, or a dict of lists by mixer; default the
# study's sweep), "bar" (the accuracy that counts as solved; default the study's sanity_bar),
# "attention_from_width" (default 128), "stop_loss" (a run stops once its mean training loss
# over a logging window is at most this: solved; default None, every step), "lr_search"
# (RECALL_LR_SEARCHES; default "every_point"), "lr_refine" (with "first_point": rounds of
# refinement after the widenings, each adding the geometric midpoints between each group's best
# rate and its neighbours, study.refined_rates; default 0), "schedule" (loop.SCHEDULES; default
# "cosine", whatever the study's tasks take) and "plateau_from" (with "wsd": the step from which
# a run whose loss has stopped falling starts its decay and ends, so that "steps" is a run's
# most; default None).
RECALL_CURVE_KEYS = {"points": COUNT, "widths": COUNT, "vocab_size": COUNT, "steps": COUNT}
RECALL_CURVE_OPTIONAL = {"batch_size": COUNT, "lr": LEARNING_RATE, "bar": Range(low=0, high=1),
                         "attention_from_width": COUNT,
                         "stop_loss": Range(low=0, low_open=True, optional=True),
                         "lr_search": None, "lr_refine": OFFSET, "schedule": None,
                         "plateau_from": Range(integer=True, low=0, optional=True)}
# How the curves choose each mixer's rate: "every_point", every point at every rate and scored
# at its best (Zoology's protocol); "first_point", every rate at the grid's first point (fewest
# pairs), widened past an edge best as a first_seed sweep is and refined "lr_refine" times, for
# each mixer and width, and the other points at that best rate (before the widenings and
# refinements, a third of the runs of a four-rate grid of three points).
RECALL_LR_SEARCHES = ("every_point", "first_point")
ATTENTION_FROM_WIDTH = 128


def check_recall_curves(value) -> None:
    """ParameterError naming the first key of a ``recall_curves`` value that is missing,
    unknown or out of its range (None: no curves)."""
    if value is None:
        return
    if (not isinstance(value, dict) or not set(RECALL_CURVE_KEYS) <= set(value)
            or set(value) - set(RECALL_CURVE_KEYS) - set(RECALL_CURVE_OPTIONAL)):
        raise ParameterError(f"recall_curves must be None or a dict with the keys "
                             f"{sorted(RECALL_CURVE_KEYS)} and optionally "
                             f"{sorted(RECALL_CURVE_OPTIONAL)}, got {value!r}")
    points = value["points"]
    if isinstance(points, (str, bytes)) or not isinstance(points, (list, tuple)) or not points:
        raise ParameterError(f"recall_curves['points'] must be a non-empty list of "
                             f"[seq_len, pairs], got {points!r}")
    for i, point in enumerate(points):
        if isinstance(point, (str, bytes)) or not isinstance(point, (list, tuple)) \
                or len(point) != 2:
            raise ParameterError(f"recall_curves['points'][{i}] must be [seq_len, pairs], got "
                                 f"{point!r}")
        for j, v in enumerate(point):
            COUNT.check(f"recall_curves['points'][{i}][{j}]", v)
    if len({tuple(p) for p in points}) != len(points):
        raise ParameterError(f"recall_curves['points'] must not repeat a point, got {points!r}")
    check_list("recall_curves['widths']", value["widths"], COUNT)
    for key in ("vocab_size", "steps"):
        COUNT.check(f"recall_curves[{key!r}]", value[key])
    for key, allowed in RECALL_CURVE_OPTIONAL.items():
        if key not in value:
            continue
        if key == "lr":
            check_rates("recall_curves['lr']", value[key])
        elif key == "lr_search":
            if value[key] not in RECALL_LR_SEARCHES:
                raise ParameterError(f"recall_curves['lr_search'] must be one of "
                                     f"{list(RECALL_LR_SEARCHES)}, got {value[key]!r}")
        elif key == "schedule":
            if value[key] not in SCHEDULES:
                raise ParameterError(f"recall_curves['schedule'] must be one of "
                                     f"{list(SCHEDULES)}, got {value[key]!r}")
        elif key == "plateau_from":
            allowed.check(f"recall_curves[{key!r}]", value[key])
            if value[key] is not None and value.get("schedule") != "wsd":
                raise ParameterError("recall_curves['plateau_from'] starts a 'wsd' schedule's "
                                     "decay: give it with recall_curves['schedule'] = 'wsd'")
        elif key == "lr_refine":
            allowed.check(f"recall_curves[{key!r}]", value[key])
            if value[key] and value.get("lr_search", "every_point") != "first_point":
                raise ParameterError(f"recall_curves['lr_refine'] refines a first_point sweep; "
                                     f"with lr_search {value.get('lr_search', 'every_point')!r}"
                                     f" every point already runs every rate, so it must be 0")
        else:
            allowed.check(f"recall_curves[{key!r}]", value[key])


def check_rates(name: str, value) -> None:
    """A learning rate, a list of them, or a dict of either by mixer."""
    if isinstance(value, dict):
        if not value:
            raise ParameterError(f"{name} must not be an empty dict")
        for mixer, rates in value.items():
            check_rates(f"{name}[{mixer!r}]", rates)
    elif isinstance(value, (list, tuple)):
        check_list(name, value, LEARNING_RATE)
    else:
        LEARNING_RATE.check(name, value)


def points_in_order(spec: dict) -> list[tuple[int, int]]:
    """The grid's (seq_len, pairs) points, fewest pairs first (the bar's point leads)."""
    return sorted((int(length), int(pairs)) for length, pairs in spec["points"])


def _pairs_of(record: dict) -> int:
    return int(record.get("pairs") or record["task_options"]["num_pairs"])


def before_decay(record: dict) -> list:
    """A run's loss curve up to its "wsd" decay (all of it under another schedule): a decay's
    falling rate lowers the loss whether or not the run had converged before it."""
    start = record.get("decay_from")
    return [p for p in record["loss_curve"] if start is None or p[0] <= start]


def recall_curve_frame(doc):
    """Per (seq_len, pairs, width, mixer): the best accuracy over the learning rates (the mean
    over seeds at each), the rate, whether it is at the edge of the sweep (``at_edge``), and
    whether its run was still learning when it stopped (``still_learning``, before a "wsd"
    decay; never one stopped early, which had solved its point)."""
    import pandas as pd

    columns = ["seq_len", "pairs", "width", "mixer", "accuracy", "lr", "rates", "at_edge",
               "still_learning", "steps_completed"]
    records = doc.get("recall_curves", []) if isinstance(doc, dict) else list(doc)
    if not records:
        return pd.DataFrame(columns=columns)
    df = pd.DataFrame([{"seq_len": int(r["seq_len"]), "pairs": _pairs_of(r),
                        "width": int(r["width"]), "mixer": r["mixer"], "lr": r.get("lr"),
                        "seed": r.get("seed"), "value": r.get("value"),
                        "still_learning": still_learning(before_decay(r))
                        and not r.get("stopped_early"),  # stopped early: solved
                        "steps_completed": r["steps_completed"]} for r in records])
    df["value"] = pd.to_numeric(df["value"], errors="coerce")
    rows = []
    for (length, pairs, width, mixer), part in df.groupby(
            ["seq_len", "pairs", "width", "mixer"], sort=False):
        means = part.groupby("lr")["value"].mean()
        best = means.idxmax() if means.notna().any() else means.index[0]
        at_best = part[part["lr"] == best]
        rows.append({"seq_len": length, "pairs": pairs, "width": width, "mixer": mixer,
                     "accuracy": means[best], "lr": best, "rates": len(means),
                     "at_edge": len(means) > 2
                     and edge_beyond(means.to_dict(), best, True) is not None,
                     "still_learning": bool(at_best["still_learning"].any()),
                     "steps_completed": int(at_best["steps_completed"].min())})
    order = {name: i for i, name in enumerate(model_.mixer_names())}  # a study's parts joined
    rows.sort(key=lambda r: (r["pairs"], r["seq_len"], r["width"], order.get(r["mixer"], 0)))
    return pd.DataFrame(rows, columns=columns)


def recall_sanity(doc, bar: float | None = None, attention_from_width: int | None = None) -> dict:
    """The recall curves' own sanity bar, at the smallest pair count of the grid (its shortest
    length): attention's best accuracy at every width of at least ``attention_from_width``, and
    each other mixer's at the widest width, against ``bar`` (None: the curves' "bar", else the
    study's sanity_bar).  Returns {"bar", "passed", "yardstick_passed", "seq_len", "pairs",
    "checks": {mixer: {"widths", "accuracy" (by width), "passed", "why"}}}; a check with no run
    at its widths fails ("not measured").  No curves: passed, no checks."""
    study = doc.get("study", {}) if isinstance(doc, dict) else {}
    spec = study.get("recall_curves") or {}
    if bar is None:
        bar = spec.get("bar", study.get("sanity_bar", 0.95))
    if attention_from_width is None:
        attention_from_width = spec.get("attention_from_width", ATTENTION_FROM_WIDTH)
    curves = recall_curve_frame(doc)
    out = {"bar": float(bar), "passed": True, "yardstick_passed": True, "seq_len": None,
           "pairs": None, "checks": {}, "attention_from_width": int(attention_from_width)}
    if not len(curves):
        return out
    pairs = int(curves["pairs"].min())
    length = int(curves[curves["pairs"] == pairs]["seq_len"].min())
    at = curves[(curves["pairs"] == pairs) & (curves["seq_len"] == length)]
    widest = int(curves["width"].max())
    out.update(seq_len=length, pairs=pairs)
    for mixer in dict.fromkeys(curves["mixer"]):
        if mixer == "attention":
            widths = sorted(w for w in set(curves["width"]) if w >= attention_from_width)
        else:
            widths = [widest]
        mine = at[at["mixer"] == mixer].set_index("width")["accuracy"]
        accuracy = {int(w): float(mine[w]) for w in widths if w in mine.index}
        measured = bool(widths) and len(accuracy) == len(widths)
        passed = measured and all(a >= bar for a in accuracy.values())
        if not measured:
            missing = [w for w in widths if w not in accuracy]
            why = (f"not measured at width {', '.join(map(str, missing))}" if widths
                   else f"no width of at least {attention_from_width} in the grid")
        elif passed:  # at or over the bar, not necessarily solved
            why = (", ".join(f"{a:.2f}" for a in accuracy.values())
                   + f" at width{'s' if len(accuracy) > 1 else ''} "
                   + ", ".join(map(str, accuracy)))
        else:
            why = ("below the bar at width "
                   + ", ".join(f"{w} ({a:.2f})" for w, a in accuracy.items() if a < bar))
        out["checks"][mixer] = {"widths": widths, "accuracy": accuracy, "passed": passed,
                                "why": why}
    out["yardstick_passed"] = out["checks"].get("attention", {"passed": True})["passed"]
    out["passed"] = all(c["passed"] for c in out["checks"].values())
    return out


def rates_said(curves) -> str:
    """How the curves' points got their rates: each swept (the same count or a range), or, where
    only some points were (the grid's first, lr_search "first_point"), the others at their
    best."""
    swept = sorted(set(int(n) for n in curves["rates"] if n > 1))
    count = (f"{swept[0]}" if len(swept) == 1 else f"{swept[0]}-{swept[-1]}") if swept else "1"
    if swept and (curves["rates"] == 1).any():
        return (f"{count} learning rates swept at the grid's first point for each mixer and "
                "width, the other points at the best of them")
    return f"each point at the best of {count} learning rate{'s' if swept else ''}"


def short_why(check: dict) -> str:
    """A mixer's failed bar in few words: "below its bar", or its check's own why."""
    return "below its bar" if check["why"].startswith("below") else check["why"]


def compared_mixers(check: dict) -> list[str]:
    """The mixers whose curves may be compared: none when attention fails its bar, else those
    that pass theirs."""
    if not check["yardstick_passed"]:
        return []
    return [m for m, c in check["checks"].items() if c["passed"]]

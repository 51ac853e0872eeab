"""The study's conclusion in words, computed from a result document."""
from __future__ import annotations

from .curves import compared_mixers, rates_said, recall_curve_frame, recall_sanity, short_why
from .results import (MIXER_NAMES, SPEED_AVERAGE, best_frame, check_text, frame,
                      higher_is_better, learning_rate_choice, sanity, side_by_side_frame,
                      speed_by_mixer, steps_said)
from .tasks import METRIC_TABLE, TASK_NAMES

# --- the conclusion ------------------------------------------------------------------------------

def unit(metric: str) -> str:
    return METRIC_TABLE[metric].unit


def conclusion(doc: dict) -> str:
    """A Markdown summary computed from the document: what was measured, each mixer's metric at
    each task's longest length with its spread over seeds, whether the spreads separate the
    mixers, the speeds, the recall curves against their own sanity bar, and what the runs do not
    show."""
    env = doc["environment"]
    gpu = env.get("device", "").startswith("cuda")
    block = doc["study"].get("recurrent_block", "bare")
    lines = _tasks(doc) if doc["runs"] else []
    lines.extend(recall_curve_lines(doc))
    lines.append(_caveats(gpu, block))
    return "\n\n".join(lines)


def _tasks(doc: dict) -> list[str]:
    import pandas as pd
    everything = frame(doc)
    df = best_frame(doc)
    env = doc["environment"]
    study = doc["study"]
    gpu = env.get("device", "").startswith("cuda")
    seeds = sorted(set(df["seed"]))
    params = everything.groupby("mixer")["parameters"].agg(["min", "max"])
    steps = {t: steps_said(c) for t, c in study["train"].items()}
    rates = sorted({float(v) for v in everything["lr"].dropna()})
    block = study.get("recurrent_block", "bare")
    lines = [f"**Measured.** {len(everything)} runs on {env['gpu'] if gpu else 'a CPU'} "
             f"({env['dtype']}): tasks {', '.join(TASK_NAMES[t] for t in study['tasks'])}; "
             f"mixers {', '.join(MIXER_NAMES.get(m, m) for m in study['mixers'])} (recurrent "
             f"mixers {'in Griffin' + chr(39) + 's recurrent block' if block == 'griffin' else 'bare'}); "
             f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''} each; width {study['width']}, "
             f"{study['layers']} layer{'s' if study['layers'] > 1 else ''}, "
             f"{params['min'].min():,}-{params['max'].max():,} parameters; "
             f"{', '.join(f'{t} {s} steps' for t, s in steps.items())}; learning rates "
             f"{', '.join(f'{v:.3g}' for v in rates) or 'as recorded'}"
             f"{' (each mixer scored at its best)' if len(rates) > 1 else ''}."
             + _part_commits(doc)]
    lines.extend(_concurrency(doc))
    check = sanity(doc)
    if check["checks"]:
        lines.append(f"**Sanity of the yardstick** (attention at each task's shortest length): "
                     f"{'; '.join(check_text(t, c) for t, c in check['checks'].items())}.")
    timed = everything  # speed does not depend on what the runs learned
    failed = [t for t in dict.fromkeys(df["task"]) if t in check["checks"]
              and not check["checks"][t]["passed"]]
    unguarded = [t for t in dict.fromkeys(df["task"]) if t not in check["checks"]
                 and t not in check["compared"] and t not in check["unjudged"]]
    if check["unjudged"]:
        lines.append(f"**No comparison on {', '.join(TASK_NAMES[t] for t in check['unjudged'])}"
                     ":** attention did not run it here, so nothing says whether the training "
                     "works there; only its speed is used below.")
    if not check["compared"] and failed:
        lines.append("**yardstick failed its sanity bar: no comparison.** Attention passed the "
                     "bar of no task here, so the training (steps, learning rates) is what these "
                     "runs measure, not the mixers; only their speed is reported.")
    elif failed:
        lines.append(f"**No comparison on {', '.join(TASK_NAMES[t] for t in failed)}:** "
                     "attention did not pass its bar there, so those runs measure the training "
                     "(steps, learning rates), not the mixers; only their speed is used below.")
    if unguarded:
        lines.append(f"**No comparison on {', '.join(TASK_NAMES[t] for t in unguarded)}:** "
                     "no sanity bar of its own was recorded, and attention failed another "
                     "task's.")
    if not check["compared"]:
        return lines + _speed_lines(timed, gpu) + _side_by_side_lines(doc)
    df = df[df["task"].isin(check["compared"])]
    everything = everything[everything["task"].isin(check["compared"])]
    choice = learning_rate_choice(doc)
    choice = choice[choice["task"].isin(check["compared"])]
    edges = choice[choice["at_edge"]]
    if len(edges):
        lines.append("**Best learning rate at the edge of the sweep** (a better one may lie "
                     "outside it): " + "; ".join(
                         f"{TASK_NAMES[r.task]} L = {r.seq_len} {MIXER_NAMES.get(r.mixer, r.mixer)} "
                         f"{r.lr:.3g}" for r in edges.itertuples()) + ".")
    for task in dict.fromkeys(df["task"]):
        part = df[df["task"] == task]
        longest = part["seq_len"].max()
        part = part[part["seq_len"] == longest]
        metric = part["metric"].iloc[0]
        higher = higher_is_better(metric)
        stats = part.groupby("mixer", sort=False)["value"].agg(
            ["mean", "min", "max", "count", "size"])
        lost = [m for m, st in stats.iterrows() if st["count"] < st["size"]]  # diverged seeds
        cells = [_score_cell(m, st, metric) for m, st in stats.iterrows()]
        finite = stats[stats["count"] > 0]
        if finite.empty:
            lines.append(f"**{TASK_NAMES[task][0].upper() + TASK_NAMES[task][1:]}, L = "
                         f"{longest}**: {'; '.join(cells)}.")
            continue
        better = finite["mean"].idxmax() if higher else finite["mean"].idxmin()
        others = stats.drop(index=better)
        several = part.groupby("mixer")["seed"].nunique().min() > 1  # a spread to compare
        if higher:
            separated = bool(len(others)) and bool((stats.loc[better, "min"] > others["max"]).all())
        else:
            separated = bool(len(others)) and bool((stats.loc[better, "max"] < others["min"]).all())
        separated = separated and several and not lost
        verdict = (f"{MIXER_NAMES.get(better, better)} has the best mean of its finite seeds, "
                   f"but seeds diverged ({_diverged_names(stats)}): no ordering is claimed"
                   if lost else
                   f"{MIXER_NAMES.get(better, better)} is best, beyond the spread over seeds"
                   if separated else
                   f"{MIXER_NAMES.get(better, better)} has the best mean, but the ranges over "
                   "seeds overlap: no ordering is claimed" if several else
                   f"{MIXER_NAMES.get(better, better)} has the best value, from one seed: no "
                   "ordering is claimed")
        chance = part["chance"].iloc[0]
        baseline = part["values_baseline"].iloc[0]
        if baseline is not None and not pd.isna(baseline):
            if stats["max"].max() < 1.5 * baseline:
                verdict += (f"; no run got past guessing among the values present "
                            f"(1 / pairs = {baseline:.3f}): none learned to bind keys to values "
                            "in these steps")
            else:
                learned = [MIXER_NAMES.get(m, m) for m, st in stats.iterrows()
                           if st["max"] >= 1.5 * baseline]
                verdict += (f"; past guessing among the values present (1 / pairs = "
                            f"{baseline:.3f}) in at least one seed: {', '.join(learned)}")
        lines.append(f"**{TASK_NAMES[task][0].upper() + TASK_NAMES[task][1:]}, L = {longest}** "
                     f"(mean, range over seeds; chance {chance:.3f}{unit(metric)}): "
                     f"{'; '.join(cells)}. {verdict[0].upper() + verdict[1:]}.")
        all_lengths = df[df["task"] == task]
        if higher and all_lengths["seq_len"].nunique() > 1:
            by_len = all_lengths.groupby(["mixer", "seq_len"])["value"].mean()
            trend = [f"{MIXER_NAMES.get(m, m)} {by_len.loc[m].iloc[0]:.3f} at L = "
                     f"{by_len.loc[m].index[0]} to {by_len.loc[m].iloc[-1]:.3f} at L = "
                     f"{by_len.loc[m].index[-1]}" for m in stats.index]
            lines.append(f"Mean accuracy from the shortest to the longest length: "
                         f"{'; '.join(trend)}.")
    lines.extend(_where_each_loses(df))
    lines.extend(_what_speed_buys(df))
    return lines + _speed_lines(timed, gpu) + _side_by_side_lines(doc)


def _side_by_side_lines(doc: dict) -> list[str]:
    """The merged study's configurations timed one after another in one command: each mixer's
    time per step, and its multiple of attention's, by task and length."""
    df = side_by_side_frame(doc)
    if df is None:
        return []
    cells = []
    for (task, length), part in df.groupby(["task", "seq_len"], sort=False):
        ms = part.set_index("mixer")["ms_per_step"]
        base = ms.get("attention")
        cells.append(f"{TASK_NAMES[task]} L = {length}: " + ", ".join(
            f"{MIXER_NAMES.get(m, m)} {v:.2f} ms"
            + (f" ({v / base:.2f}×)" if base and m != "attention" else "")
            for m, v in ms.items()))
    env = doc["side_by_side"]["environment"]
    where = env.get("gpu") if str(env.get("device", "")).startswith("cuda") else "a CPU"
    return [f"**Timed side by side** (every configuration alone, one after another in the "
            f"command that merged the parts, on {where}; "
            f"{doc['side_by_side']['steps']} steps each, {df.attrs['clock']} time per step): "
            + "; ".join(cells) + "."]


def _part_commits(doc: dict) -> str:
    """Where a merged study's parts ran at different commits, which (a part often holds one
    mixer's runs, so its speed is that commit's)."""
    commits = {p["part"]: p["environment"].get("git_commit") for p in doc.get("parts", [])}
    if len(set(commits.values())) < 2:
        return ""
    return " Its parts ran at different commits: " + ", ".join(
        f"{part} at {(commit or 'unknown')[:7]}" for part, commit in commits.items()) + "."


def _diverged_names(stats) -> str:
    """Which mixers of ``stats`` (mean, count, size by mixer) lost seeds, in words."""
    some = [MIXER_NAMES.get(m, m) for m, st in stats.iterrows() if 0 < st["count"] < st["size"]]
    every = [MIXER_NAMES.get(m, m) for m, st in stats.iterrows() if st["count"] == 0]
    return "; ".join(([f"{', '.join(some)} in some"] if some else [])
                     + ([f"{', '.join(every)} at every rate"] if every else []))


def _score_cell(mixer: str, stats, metric: str) -> str:
    """A mixer's mean (range over seeds) on a task, saying which seeds diverged."""
    name = MIXER_NAMES.get(mixer, mixer)
    size, count = int(stats["size"]), int(stats["count"])
    if count == 0:  # the best rate is a finite one's where there is one: none was
        return f"{name} diverged at every rate"
    text = f"{name} {stats['mean']:.3f} ({stats['min']:.3f}-{stats['max']:.3f}){unit(metric)}"
    return text + (f" ({size - count} of {size} seeds diverged)" if count < size else "")


def _speed_lines(timed, gpu: bool) -> list[str]:
    """Each mixer's training speed and GPU time per step (``timed``: frame(); speed_by_mixer,
    each task and length weighing the same), and the runs that ended before their last step:
    solved or decayed from a plateau, stopped by the time budget, or diverged."""
    import pandas as pd
    lines = []
    speed = speed_by_mixer(timed, "tokens_per_s")
    apart = ("" if speed.attrs["comparable"] else
             " No task and length here has runs of every mixer, so these are each mixer's own "
             "tasks, not set against each other.")
    if "attention" in speed.index and len(speed) > 1 and not apart:
        rel = ", ".join(f"{MIXER_NAMES.get(m, m)} {v / speed['attention']:.2f}×"
                        for m, v in speed.items() if m != "attention")
        speed_text = f" Relative to attention: {rel}."
    else:
        speed_text = ""
    alone = ("timed_alone" in timed and bool(len(timed)) and bool(timed["timed_alone"].all()))
    lines.append(f"**Training speed** (tokens/s, {SPEED_AVERAGE}"
                 + ("; each configuration timed alone on the device" if alone else "") + "): "
                 + ", ".join(f"{MIXER_NAMES.get(m, m)} {v:,.0f}" for m, v in speed.items())
                 + f".{speed_text}{apart}")
    gpu_ms = speed_by_mixer(timed, "gpu_ms_per_step")
    if len(gpu_ms):
        lines.append(f"**GPU time per training step** ({SPEED_AVERAGE}; CUDA events, "
                     "evaluation excluded): " + ", ".join(f"{MIXER_NAMES.get(m, m)} {v:.2f} ms"
                                               for m, v in gpu_ms.items()) + ".")
    elif not gpu:
        lines.append("(On a CPU only wall time is measured: tokens/s above are wall-clock.)")
    by_time, diverging = (timed[c].fillna(False).astype(bool)
                          for c in ("stopped_by_time", "diverged"))
    cut, diverged = timed[by_time], timed[diverging]
    sooner = timed[(pd.to_numeric(timed["steps_completed"]) < pd.to_numeric(timed["steps"]))
                   & ~by_time & ~diverging]
    if len(sooner):
        lines.append(f"**Ended before their last step:** {len(sooner)} runs, solved (an early "
                     f"stop) or decayed from a plateau of the loss (steps "
                     f"{sooner['steps_completed'].min()}-{sooner['steps_completed'].max()}); a "
                     "run's training time counts the steps it took.")
    if len(cut):
        lines.append(f"**Stopped by the time budget:** {len(cut)} runs (fewest steps "
                     f"{cut['steps_completed'].min()} of {cut['steps'].max()}); their scores are "
                     "from shorter training (the time budget is a safety cap).")
    if len(diverged):
        lines.append(f"**Diverged:** {len(diverged)} runs (non-finite training loss).")
    return lines


def _caveats(gpu: bool, block: str = "griffin") -> str:
    caveats = ("**What this does not show.** These are small models trained for a fixed budget "
               "of steps; each mixer is scored at the best learning rate of a short sweep. "
               + ("The recurrent mixers run bare, without the projections, convolution and gate "
                  "of Griffin's recurrent block. " if block != "griffin" else "")
               + "Nothing here predicts quality or speed at scale. ")
    if gpu:
        caveats += ("At this size a training step is short, so tokens/s include the host's "
                    "per-step cost (each step is synchronised); the GPU time per step is the "
                    "better measure, and notebooks 03-04 time the kernels at large shapes.")
    else:
        caveats += ("On a CPU the recurrent mixers run the pure-PyTorch reference, so these "
                    "speeds and scores only exercise the study; they are no GPU result.")
    return caveats


def _where_each_loses(best) -> list[str]:
    """Beside the quality-against-time figure: for each mixer other than attention, where its
    mean (at its best rate) is worse than another mixer's, at every length, and how the
    training times compare."""
    if best["mixer"].nunique() < 2:
        return []
    # The figure's runs: each mixer's best rate, by task and length (a median over more would
    # weigh each mixer's own mix of lengths, rates and diverged runs).
    by_task = []
    for (task, length), part in best.groupby(["task", "seq_len"], sort=False):
        time_ = part.groupby("mixer", sort=False)["train_wall_s"].median().dropna()
        if len(time_) > 1:
            by_task.append(f"{TASK_NAMES[task]} L = {length}: " + ", ".join(
                f"{MIXER_NAMES.get(m, m)} {v:.1f} s" for m, v in time_.items()))
    timing = (" Median training wall time per run at each mixer's best rate (the "
              "quality-against-time figure's axis): " + "; ".join(by_task) + "."
              if by_task else "")
    out = []
    for mixer in dict.fromkeys(best["mixer"]):
        if mixer == "attention":
            continue
        losses = []
        for (task, length), part in best.groupby(["task", "seq_len"], sort=False):
            means = part.groupby("mixer")["value"].mean()
            if mixer not in means.index:
                continue
            metric = part["metric"].iloc[0]
            higher = higher_is_better(metric)
            if means.isna()[mixer]:  # no finite score at any rate: it lost outright
                losses.append(f"{TASK_NAMES[task]} L = {length} (diverged at every rate)")
                continue
            # A mean over the seeds that did not diverge ranks nothing, as the task's line.
            partial = set(part.loc[part["value"].isna(), "mixer"])
            if mixer in partial:
                losses.append(f"{TASK_NAMES[task]} L = {length} (seeds diverged: not ranked)")
                continue
            beaten = [m for m, v in means.drop(mixer).items() if m not in partial
                      and (v > means[mixer] if higher else v < means[mixer])]
            if beaten:
                losses.append(f"{TASK_NAMES[task]} L = {length} (behind "
                              f"{', '.join(MIXER_NAMES.get(m, m) for m in beaten)}: "
                              f"{means[mixer]:.3f}{unit(metric)} against "
                              f"{', '.join(f'{means[m]:.3f}' for m in beaten)})")
        out.append(f"**Where {MIXER_NAMES.get(mixer, mixer)} loses** (mean at each mixer's best "
                   f"rate): " + ("; ".join(losses) if losses else "nowhere in these runs") + ".")
    if out:
        out[-1] += timing
    return out


def _what_speed_buys(best) -> list[str]:
    """Beside the quality-against-time figure: at each task's longest length, each mixer's time
    per training step (GPU time on CUDA, else wall; each timed alone where the study did) as a
    multiple of attention's, beside its score and attention's (each at its best rate)."""
    if "attention" not in set(best["mixer"]) or best["mixer"].nunique() < 2:
        return []
    gpu = best["gpu_ms_per_step"].notna().all()
    column = "gpu_ms_per_step" if gpu else "wall_ms_per_step"
    cells = []
    for task in dict.fromkeys(best["task"]):
        part = best[best["task"] == task]
        part = part[part["seq_len"] == part["seq_len"].max()]
        step = part.groupby("mixer")[column].median()
        score = part.groupby("mixer")["value"].mean()
        metric = part["metric"].iloc[0]
        if "attention" not in step.index or not step["attention"] > 0:
            continue
        def scored(m):  # a mean over finite seeds only where every seed was finite
            values = part.loc[part["mixer"] == m, "value"]
            return f"{score[m]:.3f}" if values.notna().all() else "diverged seeds"
        cells.append(f"{TASK_NAMES[task]} L = {part['seq_len'].iloc[0]}: " + ", ".join(
            f"{MIXER_NAMES.get(m, m)} {step[m] / step['attention']:.2f}× attention's step, "
            f"{scored(m)} against {scored('attention')}{unit(metric)}"
            for m in step.index if m != "attention"))
    if not cells:
        return []
    return [f"**What a step's speed buys** ({'GPU' if gpu else 'wall'} time per step, each mixer "
            f"at its best rate, at each task's longest length): " + "; ".join(cells) + "."]


def recall_curve_lines(doc: dict) -> list[str]:
    """The recall curves against their own sanity bar: which mixers passed it, and each one's
    best accuracy at each point of the grid (those below their bar after, marked as not
    compared)."""
    curves = recall_curve_frame(doc)
    if not len(curves):
        return []
    check = recall_sanity(doc)
    compared = compared_mixers(check)
    cells = [f"{MIXER_NAMES.get(m, m)} {'passes' if c['passed'] else 'fails'} ({c['why']})"
             for m, c in check["checks"].items()]
    runs = len(doc.get("recall_curves", []))
    lines = [f"**Recall curves** ({runs} runs; MQAR, vocabulary "
             f"{', '.join(str(v) for v in sorted(_vocabularies(doc)))}; {rates_said(curves)}, "
             f"one seed). Their sanity bar, "
             f"accuracy {check['bar']:.2f} at {check['pairs']} pairs and L = {check['seq_len']} "
             f"(attention at every width of at least {check['attention_from_width']}, the "
             f"others at the widest): {'; '.join(cells)}."]
    if not check["yardstick_passed"]:
        lines.append("**Recall curves: attention failed their sanity bar: no comparison.** "
                     "The curves measure the training (steps, rates), not the states.")
        return lines
    below = [m for m in check["checks"] if m not in compared]
    for mixer in compared + below:
        mine = curves[curves["mixer"] == mixer].sort_values(["pairs", "seq_len", "width"])
        points = "; ".join(
            f"L = {length}, {pairs} pairs: " + ", ".join(
                f"{a:.2f}" + ("*" if learning else "")
                for a, learning in zip(grp["accuracy"], grp["still_learning"]))
            for (pairs, length), grp in mine.groupby(["pairs", "seq_len"], sort=False))
        widths = ", ".join(str(w) for w in sorted(set(mine["width"])))
        status = (f", {short_why(check['checks'][mixer])}: what it learned in these steps, "
                  "not compared") if mixer in below else ""
        lines.append(f"{MIXER_NAMES.get(mixer, mixer)}{status} (widths {widths}): {points}.")
    if any(curves["still_learning"]):
        lines.append("(\\* its run was still learning when it stopped: more steps may raise it.)")
    return lines


def _vocabularies(doc: dict) -> set:
    return {r.get("task_options", {}).get("vocab_size") for r in doc.get("recall_curves", [])}


def _concurrency(doc) -> list[str]:
    """A line on the runs that shared the devices: how many at once (per part, for a merged
    study whose parts ran differently), and the throughput that gained over one run at a time,
    per task (its phases and the parts that shared a device together)."""
    if not isinstance(doc, dict):
        return []
    spreads = [("", doc["concurrency"])] if "concurrency" in doc else [
        (p.get("part", ""), p["concurrency"]) for p in doc.get("parts", []) if "concurrency" in p]
    totals = {}  # per task (a task's sweep, widenings and seeds together) over the parts
    for _, c in spreads:
        for p in c["phases"]:
            if c["workers"] > 1 and p.get("wall_s"):
                key = "recall curves" if p["phase"].startswith("recall") else p["phase"].split()[0]
                solo, wall = totals.get(key, (0.0, 0.0))
                totals[key] = (solo + p["solo_train_s"], wall + p["wall_s"])
    cells = [f"{key} {solo / wall:.1f}×" for key, (solo, wall) in totals.items()]
    if not cells:
        return []
    by_setting = {}  # (workers, devices) -> the parts that ran so
    for part, c in spreads:
        by_setting.setdefault((c["workers"], tuple(c["devices"])), []).append(part)
    settings = []
    for (workers, devices), parts in by_setting.items():
        how = (f"{workers} worker processes on {', '.join(devices)}" if workers > 1
               else "one run at a time")
        named = [p for p in parts if p]
        if named and len(by_setting) > 1:
            how += f" (part{'s' if len(named) > 1 else ''} {', '.join(named)})"
        settings.append(how)
    return [f"**Runs at once**: {'; '.join(settings)}; where runs shared a device, training "
            f"throughput against one run at a time (the runs' steps at their speed alone, over "
            f"the wall time with set-up and evaluation): {', '.join(cells)}."]

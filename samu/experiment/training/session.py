"""One configuration's study as notebook 05 runs it: ``configured_study`` (its parameters at a
size, overridden and checked) and ``StudyRun`` (the runs of its tasks and recall curves, their
sanity bars, the result document written, its figures and conclusion)."""
from __future__ import annotations

import inspect
import json

from ... import model as model_
from ... import paths
from .. import schema
from .conclusion import conclusion
from .configs import configuration
from .curves import recall_curve_frame, recall_sanity
from .figures import draw_figures, figures
from .loop import dtype_name
from .pool import RunPool
from .results import (check_text, environment, merge_when_whole, parse_part, part_path,
                      result_document, result_path, results_label, sanity, summary, validate,
                      write_part, write_result)
from .resume import FinishedRuns, finished_path
from .study import (check_parameters, log_line, models_for, run_recall_curves, run_task,
                    study_from_parameters, time_side_by_side)
from .tasks import TASK_NAMES

# What a configuration's parameters may name: the study's, and how its runs are spread.
STUDY_PARAMETERS = (*inspect.signature(study_from_parameters).parameters, "processes", "device",
                    "devices", "cpu_threads")


def configured_study(name: str, size: str, overrides: dict | None = None, part=None,
                     configurations: dict | None = None) -> tuple:
    """(Study, parameters) of configuration ``name`` of ``configurations`` (None: the table
    CONFIGURATIONS) at ``size`` ("gpu" or "cpu") with ``overrides`` (parameters that replace
    its own) and ``part`` ("k/n", or k: the k-th of its own parts), every parameter checked
    (check_parameters): ParameterError names the first that is out of range or unknown, before
    anything runs."""
    config = configuration(name, configurations)
    parameters = {**config.parameters(size), **(overrides or {})}
    if part is not None:
        parameters["part"] = part_of(part, config.parts)
    return check_parameters(parameters, known=STUDY_PARAMETERS), parameters


def written_part(path, study) -> dict | None:
    """The document at ``path`` (a part's) when it holds ``study`` (the same parameters and
    part), else None (no file, another study's, or one that cannot be read: the part trains
    and writes it again): a part already written is read, not trained again."""
    if not path.exists():
        return None
    try:
        doc = schema.read_valid_json(path, "training")
    except schema.ResultFileError:
        return None
    return doc if doc["study"] == described(study) else None


def described(study) -> dict:
    """study.describe() as its JSON file holds it."""
    return json.loads(json.dumps(study.describe()))


def time_merged(merged: dict, study, device, slug: str, progress_log=None) -> str:
    """A merged document's configurations timed side by side on ``device`` (time_side_by_side)
    and the document written again, when it has task runs, lacks that timing and ran on this
    device's GPU (the parts timed their runs in their own commands, often one mixer each).
    A failure leaves the merged document as it was, untimed, and is said, not raised: the
    runs are kept either way.  Returns what was done, as printed."""
    if not merged["runs"] or "side_by_side" in merged:
        return ""
    env = environment(device)
    if env.get("gpu") != merged["environment"].get("gpu"):
        said = (f"not timed side by side: this machine's device ({env.get('gpu')}) is not the "
                f"parts' ({merged['environment'].get('gpu')})")
    else:
        log_line(progress_log, f"timing every configuration side by side "
                               f"({study.speed_steps} steps each)")
        try:
            rows = time_side_by_side(study, merged["runs"], device, study.speed_steps)
        except Exception as exc:  # noqa: BLE001 - the trained runs must not be lost to it
            said = (f"side-by-side timing failed ({type(exc).__name__}: {exc}); the merged "
                    "document has none, and running this part again times it")
        else:
            merged["side_by_side"] = {"environment": env, "steps": study.speed_steps,
                                      "rows": rows}
            write_result(merged, slug)
            said = f"timed {len(rows)} configurations side by side"
    print(said, flush=True)
    log_line(progress_log, said)
    return said


def sanity_text(doc: dict) -> str:
    """The sanity bars of a result document (or of one in the making: its "study", "runs" and
    "recall_curves"): attention on the tasks that count for it, and the recall curves' own;
    whether each passes."""
    lines = []
    if doc.get("runs"):
        check = sanity(doc)
        for task, c in check["checks"].items():
            lines.append(f"attention on {check_text(task, c)}")
        left_out = [TASK_NAMES[t] for t in dict.fromkeys(r["task"] for r in doc["runs"])
                    if t not in check["compared"]]
        unjudged = [TASK_NAMES[t] for t in check["unjudged"]]
        failed = [t for t in left_out if t not in unjudged]
        if unjudged:
            lines.append(f"attention did not run {', '.join(unjudged)} here: no comparison "
                         "there")
        if check["passed"]:
            lines.append("yardstick passes its sanity bar")
        elif failed:
            lines.append("yardstick failed its sanity bar: no comparison" if not check["compared"]
                         else f"yardstick failed its sanity bar on {', '.join(failed)}: no "
                              "comparison there")
    if doc.get("recall_curves"):
        check = recall_sanity(doc)
        lines.append(f"recall curves' bar: accuracy {check['bar']} at {check['pairs']} pairs, "
                     f"L = {check['seq_len']} (attention at every width >= "
                     f"{check['attention_from_width']}, the others at the widest)")
        for mixer, c in check["checks"].items():
            lines.append(f"  {mixer}: {'passes' if c['passed'] else 'fails'} ({c['why']})")
        lines.append("recall curves: every mixer passes its bar" if check["passed"] else
                     "recall curves: no comparison (attention failed its bar)"
                     if not check["yardstick_passed"] else
                     "recall curves: the mixers below their bar are not compared")
    return "\n".join(lines)


def part_of(part, parts: int) -> str:
    """"k/n" as given, or k (an int or its text) as "k/<parts>"; ParameterError otherwise."""
    text = str(part)
    if "/" not in text:
        text = f"{text}/{parts}"
    k, n = parse_part(text)
    return f"{k}/{n}"


class StudyRun:
    """A configuration's study on ``device``: its runs (``processes`` at once on each of
    ``devices``, the configuration's own unless overridden), each kept as it finishes when
    ``write`` (FinishedRuns, so that a study stopped midway goes on where it stopped), and its
    result document written (a part's, merged once every part's is), figures and conclusion.
    ``start`` returns None for a configuration not among ``chosen``.  ``configurations``: the
    table it is looked up in (None: CONFIGURATIONS)."""

    def __init__(self, name: str, size: str, device, overrides=None, part=None, devices=None,
                 write: bool = True, progress_log=None, bar: bool = True,
                 configurations: dict | None = None):
        self.name = name
        self.study, parameters = configured_study(name, size, overrides, part, configurations)
        self.device = str(device)
        self.slug = results_label(device, size)
        self.write, self.progress_log, self.bar = write, progress_log, bar
        self.pool = RunPool(device, parameters.get("processes", 1),
                            parameters.get("devices", devices))
        whole = (part_path(self.slug, self.study.part, name) if self.study.part
                 else result_path(self.slug, name))
        self.written_part = written_part(whole, self.study) if write and self.study.part \
            else None
        self.finished = FinishedRuns(finished_path(whole), self.study.describe()) \
            if write and self.written_part is None else None
        if self.written_part is not None:  # runs kept before it was written are spent
            FinishedRuns(finished_path(whole), self.study.describe()).clear()
        self.records: dict[str, list] = {}
        self.curves: list = []
        self.doc = None
        self.merged = None

    @classmethod
    def start(cls, name: str, chosen, *args, **kwargs):
        """A StudyRun of ``name`` when it is among ``chosen`` (None: every configuration),
        else None."""
        if chosen is not None and name not in chosen:
            return None
        return cls(name, *args, **kwargs)

    def plan(self) -> str:
        """What it runs: the device, the runs per task and of the recall curves, the steps."""
        study = self.study
        runs = {name: study.planned_runs(name) for name in study.tasks}
        text = (f"{self.name}: device {self.device} ({self.slug}), {dtype_name(self.device)}; "
                f"mixers {', '.join(study.mixers)}")
        if runs:
            text += (f"; runs per task {runs} ({study.total_steps():,} training steps in all, "
                     f"before widenings)")
        if study.recall_curves:
            text += (f"; {study.planned_recall_runs()} recall-curve runs"
                     + (", before widenings and refinements"
                        if study.recall_search() == "first_point" else ""))
        if study.part:
            text += f"; part {study.part}"
        text += f"; {self.pool.workers} at once on {list(self.pool.devices)}"
        if self.written_part is not None:
            written = paths.relative(part_path(self.slug, study.part, self.name))
            text += (f"\nthis part's file is written ({written}): its runs are read from it "
                     "(remove the file to train them again)")
        if self.finished is not None and self.finished.records:
            text += (f"\ngoing on after a stop: {len(self.finished.records)} runs finished "
                     f"before")
        return text

    def models(self) -> str:
        """Parameters by part of each mixer's model, for each task's vocabulary."""
        out = []
        for name in self.study.tasks:
            vocab = self.study.task_list(name)[0].vocab_size
            out.append(f"{TASK_NAMES[name]} (vocabulary {vocab}):\n"
                       + model_.parameter_report(models_for(self.study, name)))
        return "\n\n".join(out)

    def preview(self, name: str) -> str:
        """Task ``name`` at its shortest length: an example, or what its data is."""
        return self.study.task_list(name)[0].preview()

    def run_task(self, name: str):
        """Every run of task ``name``; its summary (each mixer at its best rate)."""
        if self.written_part is not None:
            self.records[name] = [r for r in self.written_part["runs"] if r["task"] == name]
            return summary(self.records[name])
        self.records[name] = run_task(self.study, name, self.device, self.progress_log,
                                      self.bar, pool=self.pool, finished=self.finished)
        return summary(self.records[name])

    def run_recall_curves(self):
        """Every run of the recall curves; their table (each point at its best rate)."""
        if self.written_part is not None:
            self.curves = list(self.written_part.get("recall_curves", []))
            return recall_curve_frame(self.curves)
        self.curves = run_recall_curves(self.study, self.device, self.progress_log, self.bar,
                                        pool=self.pool, finished=self.finished)
        return recall_curve_frame(self.curves)

    def runs(self) -> list[dict]:
        return [r for name in self.study.tasks for r in self.records.get(name, [])]

    def sanity_text(self) -> str:
        """The sanity bars: attention on the tasks that count for it, and the recall curves'
        own; whether each passes."""
        return sanity_text({"study": self.study.describe(), "runs": self.runs(),
                            "recall_curves": self.curves})

    def finish(self) -> dict:
        """The result document: written (a part's, then merged once every part's is; its
        figures drawn for a whole study) when ``write``, else validated only.  The pool is
        closed and the kept runs removed once it is written."""
        self.pool.close()
        if self.written_part is not None:  # as it was written, with its own environment
            self.doc = self.written_part
            self.merged = self._merge()
            if self.merged is not None:
                self.doc = self.merged
            return self.doc
        self.doc = result_document(self.study, self.runs(), self.device,
                                   recall_curves=self.curves, pool=self.pool)
        if not self.write:
            validate(self.doc)
            return self.doc
        if self.study.part:
            write_part(self.doc, self.slug)
            self.merged = self._merge()
            if self.merged is not None:
                self.doc = self.merged
        else:
            write_result(self.doc, self.slug)
        self.finished.clear()
        return self.doc

    def _merge(self) -> dict | None:
        """The parts merged once every part's file holds this study; None, and why, while one
        is missing or holds another (which part to run, or run again)."""
        merged, why = merge_when_whole(self.slug, self.study.part, self.name,
                                       described(self.study))
        if why:
            print(why)
        if merged is not None:
            time_merged(merged, self.study, self.device, self.slug, self.progress_log)
        return merged

    def written(self) -> list:
        """What finish wrote: the result file, or the part's and, once merged, the whole's."""
        if not self.write:
            return []
        if not self.study.part:
            return [result_path(self.slug, self.name)]
        out = [] if self.written_part is not None else [
            part_path(self.slug, self.study.part, self.name)]
        return out + ([result_path(self.slug, self.name)] if self.merged is not None else [])

    def images(self) -> list:
        """The figures as PNG: drawn to their files for a whole study (or a merged one), else
        only shown (a lone part's are not stored)."""
        from .. import report
        if self.write and (self.merged is not None or not self.study.part):
            return [path.read_bytes() for path in draw_figures(self.doc, self.slug)]
        return [report.png_bytes(fig) for fig in figures(self.doc).values()]

    def conclusion(self) -> str:
        return conclusion(self.doc)


__all__ = ["STUDY_PARAMETERS", "configured_study", "part_of", "StudyRun"]

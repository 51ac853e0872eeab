"""A study that goes on where it stopped: ``FinishedRuns`` keeps the record of every run as it
finishes, so that a study cut short (a time limit, a lost machine) and started again trains only
the runs it had not finished."""
from __future__ import annotations

import json
import os
from pathlib import Path

from .pool import Job


def finished_path(result: Path) -> Path:
    """``<result>.finished.jsonl`` beside a result file (the study's, or a part's)."""
    return result.with_name(result.stem + ".finished.jsonl")


class FinishedRuns:
    """The records of a study's finished runs in ``path``: a first line holding the study, then
    one JSON line a run, appended (and flushed to disk) as each finishes.  A file written for
    another study, or one that cannot be read, is replaced, never taken for this one; a line cut
    short by a stop mid-write is dropped.  run_jobs takes a job's record from here instead of
    training it again; ``clear`` removes the file once the study's result is written.  Runs are
    deterministic in their seed, so a study resumed from here equals one run without a stop."""

    def __init__(self, path: Path, study: dict):
        self.path = Path(path)
        self.study = json.loads(json.dumps(study))
        self.records: dict[str, dict] = {}
        self.reused = 0
        self._read()
        if not self.records:
            self._start()

    def _read(self) -> None:
        try:
            lines = self.path.read_text().splitlines()
        except (FileNotFoundError, IsADirectoryError, UnicodeDecodeError):
            return
        try:
            if not lines or json.loads(lines[0]) != {"study": self.study}:
                return
        except json.JSONDecodeError:
            return
        for line in lines[1:]:
            try:
                entry = json.loads(line)
                self.records[entry["key"]] = dict(entry["record"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                break  # the last line, cut short by a stop: the runs from here train again
        self._rewrite()  # without a line cut short, so that appends start on a line of their own

    def _start(self) -> None:
        self.records = {}
        self._rewrite()

    def _rewrite(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(self.path.name + ".tmp")
        with open(temporary, "w") as f:
            f.write(json.dumps({"study": self.study}) + "\n")
            for key, record in self.records.items():
                f.write(json.dumps({"key": key, "record": record}) + "\n")
        os.replace(temporary, self.path)

    @staticmethod
    def key(job: Job) -> str:
        """What names a run within one study: its label (which rounds the rate), exact rate and
        seed, steps, batch size and width."""
        return (f"{job.name}: {job.label} | lr {float(job.lr)!r} seed {job.seed} | steps "
                f"{job.config.steps} | batch {job.config.batch_size} | width {job.width}")

    def get(self, job: Job) -> dict | None:
        """A copy of ``job``'s record if it finished before, else None."""
        record = self.records.get(self.key(job))
        if record is None:
            return None
        self.reused += 1
        return json.loads(json.dumps(record))

    def add(self, job: Job, record: dict) -> None:
        """Keep ``job``'s record, on disk before this returns."""
        line = json.dumps({"key": self.key(job), "record": record})
        self.records[self.key(job)] = json.loads(line)["record"]
        with open(self.path, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def clear(self) -> None:
        """Remove the file: the study's result is written."""
        self.path.unlink(missing_ok=True)
        self.records = {}

"""A study that goes on where it stopped: ``FinishedRuns`` keeps the record of every run as it
finishes, so that a study cut short (a time limit, a lost machine) and started again trains only
the runs it had not finished, each of those from its last saved state (RunCheckpoint)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ...calibration_file import locked
from .. import schema
from ..benchmark_rows import append_line
from .checkpoint import checkpoint_file
from .runs import Job, run_key


def finished_path(result: Path) -> Path:
    """``<result>.finished.jsonl`` beside a result file (the study's, or a part's)."""
    return result.with_name(result.stem + ".finished.jsonl")


class FinishedRuns:
    """The records of a study's finished runs in ``path``: a first line holding the study, then
    one JSON line a run, appended (and flushed to disk) as each finishes.  A file written for
    another study, or one whose first line cannot be read, is replaced, never taken for this
    one.  A line that holds no run (cut short by a stop mid-write, corrupt, or not a run's
    record) is skipped, and the lines after it are read; it stays on disk, and the next append
    starts a line of its own.  Every read-modify-write holds the file's lock, so that processes
    opening and appending to one file at once lose nothing.  run_jobs takes a job's record from
    here instead of training it again, and trains the others from their state saved in
    ``in_progress`` (``checkpoint``), which goes with a replaced file; ``clear`` removes both once
    the study's result is written.  Runs are deterministic in their seed, so a study resumed from
    here equals one run without a stop."""

    def __init__(self, path: Path, study: dict):
        self.path = Path(path)
        self.study = json.loads(json.dumps(study))
        self.header = json.dumps({"study": self.study})
        self.records: dict[str, dict] = {}
        self.reused = 0
        self.skipped = 0  # lines of this study's file that held no run
        self._run_schema = schema.validator("training_run")
        with locked(self.path):
            if not self._read():
                self._rewrite()
                shutil.rmtree(self.in_progress, ignore_errors=True)  # another study's runs

    def is_run(self, record) -> bool:
        """Whether ``record`` is a finished run as the training study's document holds one."""
        return self._run_schema.is_valid(record)

    def _lines(self) -> list[str] | None:
        """The file's lines (an undecodable byte spoils only its own line), or None: no file."""
        try:
            return self.path.read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            return None

    def _ours(self, lines) -> bool:
        try:
            return bool(lines) and json.loads(lines[0]) == {"study": self.study}
        except json.JSONDecodeError:
            return False

    def _read(self) -> bool:
        """Take the runs of the file; False where it is not this study's."""
        lines = self._lines()
        if not self._ours(lines):
            return False
        for line in lines[1:]:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                entry = None
            if (isinstance(entry, dict) and isinstance(entry.get("key"), str)
                    and self.is_run(entry.get("record"))):
                self.records[entry["key"]] = entry["record"]
            else:
                self.skipped += 1
        return True

    def _rewrite(self) -> None:
        """The file replaced by this study's line and the records held here (a unique temporary
        renamed into place)."""
        lines = [self.header] + [json.dumps({"key": key, "record": record})
                                 for key, record in self.records.items()]

        def write(temporary: Path) -> None:
            temporary.write_text("".join(line + "\n" for line in lines))

        schema.atomic_write(self.path, write)

    key = staticmethod(run_key)

    def checkpoint(self, job: Job) -> str:
        """The file that keeps ``job``'s state while it trains (RunCheckpoint), in the
        directory ``<stem>.in-progress`` beside this file."""
        return str(checkpoint_file(self.in_progress, run_key(job)))

    @property
    def in_progress(self) -> Path:
        stem = self.path.name.removesuffix(".jsonl").removesuffix(".finished")
        return self.path.with_name(stem + ".in-progress")

    def get(self, job: Job) -> dict | None:
        """A copy of ``job``'s record if it finished before, else None."""
        record = self.records.get(self.key(job))
        if record is None:
            return None
        self.reused += 1
        return json.loads(json.dumps(record))

    def add(self, job: Job, record: dict) -> None:
        """Keep ``job``'s record, on disk before this returns.  Where the file is gone or holds
        another study (cleared or replaced meanwhile), it is written again with this study's
        records."""
        line = json.dumps({"key": self.key(job), "record": record})
        kept = json.loads(line)["record"]
        if not self.is_run(kept):
            raise ValueError(f"{job.label}: not a finished run's record (the training study's "
                             "run schema)")
        self.records[self.key(job)] = kept
        with locked(self.path):
            if not self._starts_ours():
                self._rewrite()
            else:
                append_line(self.path, line)
                fd = os.open(self.path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        Path(self.checkpoint(job)).unlink(missing_ok=True)  # its record is kept: done with it

    def _starts_ours(self) -> bool:
        try:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                return self._ours([f.readline()])
        except FileNotFoundError:
            return False

    def clear(self) -> None:
        """Remove the file, and the states of runs in progress: the study's result is
        written."""
        with locked(self.path):
            self.path.unlink(missing_ok=True)
            shutil.rmtree(self.in_progress, ignore_errors=True)
        self.records = {}

"""A study that goes on where it stopped (samu.experiment.training.resume): the runs finished
before a stop are taken from their file, the others trained, and the result equals a study run
without a stop."""
import dataclasses
import json
import multiprocessing

import pytest

from samu.experiment import training as T

REF = "reference_chunked"  # named: tests/conftest.py sets TRITON_INTERPRET=1 on a CPU

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def small_study(**kw):
    return T.study_from_parameters(
        ["attention", "samu"], [0, 1], 16, 1, 2,
        {"mqar": {"lengths": [16], "num_pairs": 2, "vocab_size": 8}}, 6, 4, [1e-3, 3e-3], 2, 1,
        timing_warmup_steps=2, log_every=3, attention_head_dim=8, backend=REF, speed_steps=2,
        lr_search="first_seed", **kw)


def _lines(path):
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """The study run once without a stop, its finished runs kept in a file."""
    study = small_study()
    path = tmp_path_factory.mktemp("whole") / "cpu.finished.jsonl"
    finished = T.FinishedRuns(path, study.describe())
    records = T.run_task(study, "mqar", "cpu", bar=False, finished=finished)
    return study, path, records


def test_every_finished_run_is_kept_as_it_finishes(whole):
    study, path, records = whole
    lines = _lines(path)
    assert json.loads(lines[0]) == {"study": json.loads(json.dumps(study.describe()))}
    assert len(lines) == 1 + len(records)
    kept = [json.loads(line)["record"] for line in lines[1:]]
    assert sorted((r["mixer"], r["lr"], r["seed"]) for r in kept) == sorted(
        (r["mixer"], r["lr"], r["seed"]) for r in records)


@pytest.mark.parametrize("stopped_after", [0, 3])
def test_a_study_started_again_trains_only_what_had_not_finished(whole, tmp_path, stopped_after):
    study, path, records = whole
    lines = _lines(path)
    cut = tmp_path / "cpu.finished.jsonl"
    # A stop after `stopped_after` runs, mid-way through writing the next one's line.
    cut.write_text("\n".join(lines[:1 + stopped_after]) + "\n" + lines[1 + stopped_after][:40])
    log = tmp_path / "progress.log"
    finished = T.FinishedRuns(cut, study.describe())
    assert len(finished.records) == stopped_after
    again = T.run_task(study, "mqar", "cpu", progress_log=log, bar=False, finished=finished)
    assert finished.reused == stopped_after
    assert len(_lines(log)) == len(records) - stopped_after  # one line a run trained here
    assert len(again) == len(records)
    for a, b in zip(records, again):
        assert (a["mixer"], a["lr"], a["seed"], a["lr_sweep"]) == (
            b["mixer"], b["lr"], b["seed"], b["lr_sweep"])
        assert a["loss_curve"] == b["loss_curve"] and a["value"] == b["value"]
    # The line cut short stays on its own line (skipped), and every run is read back.
    assert len(_lines(cut)) == 1 + len(records) + 1
    assert len(T.FinishedRuns(cut, study.describe()).records) == len(records)
    T.validate(T.result_document(study, again, "cpu"))


def test_refined_recall_curves_stopped_midway_go_on_to_the_same_records(tmp_path):
    """A refined first_point search, cut after its sweep, inside its refinements and before
    its last run: the rates it adds again and every record are the ones of a run without a
    stop."""
    spec = {"points": [[16, 2], [24, 3]], "widths": [8], "vocab_size": 8, "steps": 6,
            "batch_size": 4, "lr": [1e-3, 1e-2, 1e-1], "lr_search": "first_point",
            "lr_refine": 2}
    study = T.study_from_parameters(
        ["samu"], [0], 8, 1, 2, {}, {}, {}, [1e-3], 2, 1, timing_warmup_steps=1, log_every=2,
        attention_head_dim=8,
        backend=REF, speed_steps=2, recall_curves=spec, configuration="recall")
    path = tmp_path / "whole.jsonl"
    records = T.run_recall_curves(study, "cpu", bar=False,
                                  finished=T.FinishedRuns(path, study.describe()))
    grid = {10.0 ** k for k in range(-5, 2)}  # the rates and their widenings
    assert any(all(abs(rate / g - 1) > 1e-9 for g in grid) for rate in records[0]["lr_sweep"])
    lines = _lines(path)
    for stopped_after in (3, len(records) - 2, len(records) - 1):
        cut = tmp_path / f"cut{stopped_after}.jsonl"
        cut.write_text("\n".join(lines[:1 + stopped_after]) + "\n")
        finished = T.FinishedRuns(cut, study.describe())
        again = T.run_recall_curves(study, "cpu", bar=False, finished=finished)
        assert finished.reused == stopped_after
        assert [(r["lr"], r["pairs"], r["lr_sweep"], r["value"]) for r in again] == [
            (r["lr"], r["pairs"], r["lr_sweep"], r["value"]) for r in records]


def test_a_file_of_another_study_is_replaced_not_reused(whole, tmp_path):
    study, path, records = whole
    other = tmp_path / "cpu.finished.jsonl"
    other.write_text(path.read_text())
    finished = T.FinishedRuns(other, {**study.describe(), "width": 32})
    assert finished.records == {} and len(_lines(other)) == 1
    for broken in ("", "not json\n", '{"study": 1}\n'):
        other.write_text(broken)
        assert T.FinishedRuns(other, study.describe()).records == {}


def test_clear_removes_the_file_and_the_file_sits_beside_the_result(whole, tmp_path):
    study, path, _ = whole
    copy = tmp_path / "cpu.finished.jsonl"
    copy.write_text(path.read_text())
    finished = T.FinishedRuns(copy, study.describe())
    assert finished.records
    finished.clear()
    assert not copy.exists() and finished.records == {}
    assert T.finished_path(T.result_path("nvidia-h200")).name == "nvidia-h200.finished.jsonl"
    assert T.finished_path(T.part_path("nvidia-h200", "2/3")).name == \
        "nvidia-h200.part-2-of-3.finished.jsonl"


def test_rates_the_label_rounds_alike_are_two_runs(whole, tmp_path):
    study, _, records = whole
    task = study.task_list("mqar")[0]
    job = study.job("mqar", task, "samu", 1e-3, 0, study.train_config("mqar", 1e-3),
                    label="mqar samu lr 0.001 seed 0")
    close = dataclasses.replace(job, lr=1.004e-3)  # the same label
    finished = T.FinishedRuns(tmp_path / "f.jsonl", study.describe())
    finished.add(job, records[0])
    assert finished.get(job) == json.loads(json.dumps(records[0]))
    assert finished.get(close) is None


def _job(study, seed):
    task = study.task_list("mqar")[0]
    return study.job("mqar", task, "samu", 1e-3, seed, study.train_config("mqar", 1e-3),
                     label=f"mqar samu lr 0.001 seed {seed}")


def _open_repeatedly(path, count, at_least, barrier):
    """One process: ``count`` openings of the shared file, each finding at least ``at_least``
    runs (an assertion or exception here is the process's non-zero exit code)."""
    study = small_study().describe()
    barrier.wait()  # start together, so that the openings overlap
    for _ in range(count):
        assert len(T.FinishedRuns(path, study).records) >= at_least


def _add_runs(path, record, seeds, barrier):
    """One process: a run's record added under each of ``seeds``."""
    study = small_study()
    finished = T.FinishedRuns(path, study.describe())
    barrier.wait()
    for seed in seeds:
        finished.add(_job(study, seed), record)


# Python 3.12 warns on every fork of a process with threads (torch's); the children here run
# no torch, only file and JSON work.
FORK_WARNING = "ignore:This process .* is multi-threaded, use of fork:DeprecationWarning"


def _run_together(*targets):
    """Each (function, args) in a process of its own, started together; every one must exit 0
    within a deadline (one that fails breaks the barrier instead of leaving the others waiting)."""
    ctx = multiprocessing.get_context("fork")  # no import of torch per process: seconds, not tens
    barrier = ctx.Barrier(len(targets), timeout=60)
    procs = [ctx.Process(target=fn, args=(*args, barrier)) for fn, args in targets]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout=120)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    assert [p.exitcode for p in procs] == [0] * len(procs)


@pytest.mark.filterwarnings(FORK_WARNING)
def test_processes_opening_one_file_at_once(whole, tmp_path):
    """Openings at once of one finished file all read every run (a shared temporary name made
    about half of them fail with FileNotFoundError), and leave the file as it was."""
    _, path, records = whole
    shared = tmp_path / "cpu.finished.jsonl"
    shared.write_text(path.read_text())
    before = shared.read_bytes()
    _run_together(*[(_open_repeatedly, (shared, 40, len(records))) for _ in range(3)])
    assert shared.read_bytes() == before
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))


@pytest.mark.filterwarnings(FORK_WARNING)
def test_runs_added_while_other_processes_open_the_file_are_all_kept(whole, tmp_path):
    """Two processes add runs while another opens the file again and again: no opening rewrites
    the file from a stale snapshot, so every added run is there at the end."""
    study, path, records = whole
    shared = tmp_path / "cpu.finished.jsonl"
    shared.write_text(path.read_text())
    _run_together((_add_runs, (shared, records[0], range(100, 120))),
                  (_add_runs, (shared, records[1], range(200, 220))),
                  (_open_repeatedly, (shared, 40, len(records))))
    kept = T.FinishedRuns(shared, study.describe()).records
    for seed in [*range(100, 120), *range(200, 220)]:
        assert T.FinishedRuns.key(_job(study, seed)) in kept
    assert len(kept) == len(records) + 40


def test_lines_that_hold_no_run_are_skipped_and_kept_on_disk(whole, tmp_path):
    """A corrupt line, an undecodable byte or a record that is not a run ({}) costs only its own
    line: the runs after it are read, nothing is deleted from the file, and appends go on."""
    study, path, records = whole
    lines = _lines(path)
    empty = json.dumps({"key": T.FinishedRuns.key(_job(study, 7)), "record": {}})
    damaged = tmp_path / "cpu.finished.jsonl"
    damaged.write_bytes("\n".join([lines[0], lines[1], "{not json", empty, lines[2],
                                   "\udcff"]).encode("utf-8", "surrogateescape")
                        + b"\n" + "\n".join(lines[3:]).encode())
    before = damaged.read_bytes()
    finished = T.FinishedRuns(damaged, study.describe())
    assert len(finished.records) == len(records) and finished.skipped == 3
    assert finished.get(_job(study, 7)) is None  # {} is no finished run
    assert damaged.read_bytes() == before
    with pytest.raises(ValueError, match="not a finished run's record"):
        finished.add(_job(study, 8), {})
    assert damaged.read_bytes() == before
    finished.add(_job(study, 9), records[0])
    assert damaged.read_bytes().startswith(before)
    again = T.FinishedRuns(damaged, study.describe())
    assert len(again.records) == len(records) + 1 and again.skipped == 3

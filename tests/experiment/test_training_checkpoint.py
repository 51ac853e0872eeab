"""A run stopped midway goes on from its last save (samu.experiment.training.checkpoint): on a
CPU the run it finishes equals one that was never stopped, step for step."""
import dataclasses

import pytest
import torch

from samu import model as model_
from samu.experiment import training as T

REF = "reference_chunked"  # named: tests/conftest.py sets TRITON_INTERPRET=1 on a CPU

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

TASKS = {"mqar": {"lengths": [16], "num_pairs": 2, "vocab_size": 8}}


class Stop(Exception):
    """A run's process stopped (a time limit, a lost machine)."""


def small_study(mixers=("attention", "samu"), steps=30, **kw):
    return T.study_from_parameters(list(mixers), [0], 16, 1, 2, TASKS, steps, 4, 3e-3, 3, 1,
                                   timing_warmup_steps=2, log_every=4, attention_head_dim=8,
                                   backend=REF, speed_steps=2, **kw)


def trained(study, config, mixer, checkpoint=None, stop_at=None):
    """(the run's record, its weights); ``stop_at``: the run's process stops after that step."""
    task = study.task_list("mqar")[0]
    m = model_.build(study.model_config(mixer, task.vocab_size), seed=0)

    def progress(step, loss):
        if step + 1 == stop_at:
            raise Stop

    record = T.train(m, task, config, 0, "cpu", progress=progress, checkpoint=checkpoint)
    return record, torch.cat([p.detach().flatten() for p in m.parameters()])


@pytest.mark.parametrize("mixer,schedule", [("attention", "cosine"), ("samu", "wsd")])
def test_a_run_stopped_midway_goes_on_from_its_last_save(tmp_path, mixer, schedule):
    """Stopped twice, at steps that are not saving points, the run goes on from the last save
    before each stop and ends as the run that was never stopped: the same loss at every step,
    the same weights, the same "wsd" decay point (a plateau starts it midway)."""
    study = small_study([mixer])
    config, stops = study.train["mqar"], (7, 14)
    if schedule == "wsd":  # flat: a plateau at step 20 decays the run to its end at step 25
        config = dataclasses.replace(config, lr=1e-9, schedule="wsd", plateau_from=8,
                                     log_every=2)
        stops = (7, 22)
    whole, weights = trained(study, config, mixer)
    assert whole["resumed_at"] == []
    saves = T.RunCheckpoint(tmp_path / "run.pt", "the run", every_s=0)  # at every log point
    for stop in stops:
        with pytest.raises(Stop):
            trained(study, config, mixer, saves, stop_at=stop)
    resumed, resumed_weights = trained(study, config, mixer, saves)
    # each stop goes on from the last logging point before it
    assert resumed["resumed_at"] == [(stop - 1) // config.log_every * config.log_every
                                     for stop in stops]
    assert resumed["loss_curve"] == whole["loss_curve"]
    assert torch.equal(resumed_weights, weights)
    for key in ("steps_completed", "decay_from", "stopped_early", "diverged"):
        assert resumed[key] == whole[key], key
    if schedule == "wsd":
        assert (whole["decay_from"], whole["steps_completed"]) == (20, 25)
    assert resumed["timed_steps"] < whole["timed_steps"]  # each start warms up again


def test_a_save_of_another_run_or_a_broken_file_is_not_resumed_from(tmp_path):
    study = small_study(["attention"], steps=12)
    config = study.train["mqar"]
    whole, weights = trained(study, config, "attention")
    other = T.RunCheckpoint(tmp_path / "run.pt", "another run", every_s=0)
    with pytest.raises(Stop):
        trained(study, config, "attention", other, stop_at=6)
    saved = torch.load(tmp_path / "run.pt", weights_only=True)
    del saved["generator"]
    older = tmp_path / "older.pt"
    torch.save({**saved, "key": "the run"}, older)  # the right run, a layout without a field
    for broken in (None, b"not a checkpoint", older.read_bytes()):
        if broken is not None:
            (tmp_path / "run.pt").write_bytes(broken)
        saves = T.RunCheckpoint(tmp_path / "run.pt", "the run", every_s=0)
        record, resumed_weights = trained(study, config, "attention", saves)
        assert record["resumed_at"] == [] and torch.equal(resumed_weights, weights)


def test_a_save_that_does_not_fit_the_model_is_not_resumed_from(tmp_path):
    """A save of the same run's key but another model (other shapes), and one made on another
    attention kernel, leave the model as built: the run starts afresh."""
    study = small_study(["attention", "samu"], steps=12)
    config = study.train["mqar"]
    whole, weights = trained(study, config, "attention")
    for mixer, kernel in (("samu", None), ("attention", "math")):
        saves = T.RunCheckpoint(tmp_path / f"{mixer}.pt", "the run", every_s=0)
        with pytest.raises(Stop):
            trained(study, dataclasses.replace(config, attention_kernel=kernel), mixer, saves,
                    stop_at=6)
        record, resumed_weights = trained(study, config, "attention", saves)
        assert record["resumed_at"] == [] and torch.equal(resumed_weights, weights)


def test_a_run_goes_on_on_the_attention_kernel_it_started_on(tmp_path):
    """run_job resumes a run on the kernel its save names where the kernels' timing chose
    another in this command, and its record names that kernel."""
    study = small_study(["attention"], steps=12)
    task = study.task_list("mqar")[0]
    job = T.on_attention_kernel(study.job("mqar", task, "attention", 3e-3, 0,
                                          study.train["mqar"]), "math")
    whole = T.run_job(job, "cpu")
    saved = tmp_path / "run.pt"
    with pytest.raises(Stop):
        trained(study, job.config, "attention", T.RunCheckpoint(saved, T.run_key(job), 0),
                stop_at=6)
    chosen_again = dataclasses.replace(T.on_attention_kernel(job, "flash"), checkpoint=str(saved))
    record = T.run_job(chosen_again, "cpu")
    assert record["attention_kernel"] == "math" and record["resumed_at"] == [4]
    assert record["loss_curve"] == whole["loss_curve"]


def test_a_save_that_fails_is_warned_of_and_the_run_trains_on(tmp_path):
    study = small_study(["attention"], steps=12)
    (tmp_path / "a file").write_text("")
    nowhere = T.RunCheckpoint(tmp_path / "a file" / "run.pt", "the run", every_s=0)
    with pytest.warns(RuntimeWarning, match="was not saved"):
        record, _ = trained(study, study.train["mqar"], "attention", nowhere)
    assert record["steps_completed"] == 12


def test_a_study_resumes_its_runs_from_their_saves_and_drops_them_as_they_finish(tmp_path):
    """run_jobs gives each job its file in the FinishedRuns' in-progress directory, resumes a run
    from a save found there, logs it, and removes the save once the run's record is kept; a
    FinishedRuns of another study, and clear, remove every save."""
    study = small_study(["attention", "samu"])
    task = study.task_list("mqar")[0]
    jobs = [study.job("mqar", task, mixer, 3e-3, 0, study.train["mqar"])
            for mixer in study.mixers]
    alone = T.run_jobs(study, jobs, "cpu", bar=False)
    finished = T.FinishedRuns(tmp_path / "cpu.finished.jsonl", study.describe())
    saved = finished.checkpoint(jobs[1])
    assert str(finished.in_progress) == str(tmp_path / "cpu.in-progress")
    assert saved.startswith(str(finished.in_progress)) and saved != finished.checkpoint(jobs[0])
    with pytest.raises(Stop):
        trained(study, study.train["mqar"], "samu",
                T.RunCheckpoint(saved, T.run_key(jobs[1]), every_s=0), stop_at=10)
    log = tmp_path / "progress.log"
    with T.RunPool("cpu") as pool:
        records = T.run_jobs(study, jobs, "cpu", progress_log=log, bar=False, pool=pool,
                             finished=finished)
    assert [r["resumed_at"] for r in records] == [[], [8]]
    # the phase's training time counts the steps trained in it: the second run's last 22 of 30
    assert pool.phases[0]["solo_train_s"] == pytest.approx(
        records[0]["solo_train_s"] + records[1]["solo_train_s"] * 22 / 30)
    assert [r["loss_curve"] for r in records] == [r["loss_curve"] for r in alone]
    assert "resumed at step 8" in log.read_text()
    assert not list(finished.in_progress.iterdir())  # each save removed as its run finished
    finished.in_progress.joinpath("stale.pt").write_bytes(b"")
    T.FinishedRuns(finished.path, {**study.describe(), "seeds": [1]})  # another study
    assert not finished.in_progress.exists()
    finished.in_progress.mkdir()
    finished.clear()
    assert not finished.in_progress.exists() and not finished.path.exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_on_cuda_a_resumed_run_trains_as_one_never_stopped(tmp_path, cuda_graph):
    """On the GPU, in BF16, with or without a CUDA graph (captured again after the resume): the
    resumed run's curve follows the whole run's."""
    task = T.make_task("mqar", 64, num_pairs=4, vocab_size=16)
    study = T.study_from_parameters(["samu"], [0], 64, 2, 2, {"mqar": {
        "lengths": [64], "num_pairs": 4, "vocab_size": 16}}, 40, 16, 3e-3, 5, 2,
        timing_warmup_steps=3, log_every=4, cuda_graph=cuda_graph)
    config = study.train["mqar"]
    curves = []
    for stop in (None, 18):
        saves = T.RunCheckpoint(tmp_path / f"run{stop}.pt", "the run", every_s=0)
        for stop_at in ((stop, None) if stop else (None,)):
            m = model_.build(study.model_config("samu", task.vocab_size), seed=0, device="cuda")

            def progress(step, loss, stop_at=stop_at):
                if step + 1 == stop_at:
                    raise Stop
            try:
                record = T.train(m, task, config, 0, "cuda", progress=progress,
                                 checkpoint=saves)
            except Stop:
                continue
        curves.append([loss for _, loss in record["loss_curve"]])
    assert record["resumed_at"] == [16]
    whole, resumed = curves
    assert max(abs(a - b) / abs(a) for a, b in zip(whole, resumed)) < 1e-3, (whole, resumed)

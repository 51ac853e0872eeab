"""Several training runs at once (samu.experiment.training.pool): worker processes give the runs
that one process gives, the study reports each configuration's speed timed alone, and bad pool
arguments are refused before anything runs."""
import dataclasses

import pytest
import torch

from samu import paths
from samu.experiment import training as T

REF = "reference_chunked"  # named: tests/conftest.py sets TRITON_INTERPRET=1 on a CPU

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def small_study(**kw):
    return T.study_from_parameters(
        ["attention", "rglru", "samu"], [0], 16, 1, 2,
        {"mqar": {"lengths": [16], "num_pairs": 2, "vocab_size": 8}}, 8, 4, [1e-3, 3e-3], 2, 1,
        timing_warmup_steps=2, log_every=4, attention_head_dim=8, backend=REF, speed_steps=3,
        **kw)


@pytest.fixture(scope="module")
def both():
    """The same study's runs one after another here, and in two worker processes."""
    study = small_study()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the workers run
    try:
        alone = T.run_task(study, "mqar", "cpu", bar=False)
        with T.RunPool("cpu", 2) as pool:
            shared = T.run_task(study, "mqar", "cpu", bar=False, pool=pool)
            doc = T.result_document(study, shared, "cpu", pool=pool)
    finally:
        torch.set_num_threads(threads)
    return study, alone, shared, doc


def test_worker_processes_train_the_same_models(both):
    study, alone, shared, _ = both
    assert len(alone) == len(shared) == len(study.runs("mqar")) == 6
    for a, b in zip(alone, shared):
        assert (a["mixer"], a["lr"], a["seed"]) == (b["mixer"], b["lr"], b["seed"])
        assert a["loss_curve"] == b["loss_curve"]  # float32 on one thread: bit for bit
        assert a["value"] == b["value"] and a["eval_loss"] == b["eval_loss"]
    assert {r["concurrent_runs"] for r in alone} == {1}
    # One at a time, a run is timed alone already: its own timing is its speed alone.
    assert all(r["solo_wall_ms_per_step"] == r["wall_ms_per_step"]
               and r["solo_timed_steps"] == r["timed_steps"] for r in alone)
    assert {r["concurrent_runs"] for r in shared} == {2}


def test_the_speed_reported_is_timed_alone(both):
    _, _, shared, doc = both
    T.validate(doc)
    for r in shared:
        assert r["solo_timed_steps"] == 3 and r["solo_wall_ms_per_step"] > 0
        assert r["solo_train_s"] == pytest.approx(r["solo_wall_ms_per_step"] * 8 / 1e3)
        assert r["solo_gpu_ms_per_step"] is None  # no CUDA events on a CPU
    # One measurement per configuration: every learning rate of a mixer shares it.
    by_mixer = {}
    for r in shared:
        by_mixer.setdefault(r["mixer"], set()).add(r["solo_wall_ms_per_step"])
    assert all(len(v) == 1 for v in by_mixer.values())
    df = T.frame(doc)
    assert df["timed_alone"].all()
    assert list(df["tokens_per_s"]) == [r["solo_tokens_per_s"] for r in shared]
    assert list(df["concurrent_tokens_per_s"]) == [r["tokens_per_s"] for r in shared]
    assert list(df["train_wall_s"]) == [r["solo_train_s"] for r in shared]
    axis = T.figures(doc)["quality_speed"].axes[0]
    assert axis.get_xlabel() == "training time per run, timed alone (s)"


def test_the_document_and_conclusion_report_the_throughput(both):
    _, _, shared, doc = both
    spread = doc["concurrency"]
    assert spread["workers"] == 2 and spread["devices"] == ["cpu"]
    (phase,) = spread["phases"]
    assert phase["phase"] == "mqar" and phase["runs"] == 6 and phase["wall_s"] > 0
    assert phase["solo_train_s"] == pytest.approx(sum(r["solo_train_s"] for r in shared))
    assert phase["throughput_gain"] == pytest.approx(phase["solo_train_s"] / phase["wall_s"])
    assert "**Runs at once**: 2 worker processes on cpu" in T.conclusion(doc)
    assert f"mqar {phase['throughput_gain']:.1f}×." in T.conclusion(doc)
    one = {**doc, "concurrency": {**spread, "workers": 1}}
    assert "Runs at once" not in T.conclusion(one)
    # A first-seed search's phases of one task are one figure: their time alone over their wall.
    phases = [{"phase": "copy sweep", "runs": 3, "workers": 2, "wall_s": 10.0,
               "solo_train_s": 30.0},
              {"phase": "copy seeds", "runs": 2, "workers": 2, "wall_s": 10.0,
               "solo_train_s": 10.0},
              {"phase": "recall curves", "runs": 4, "workers": 2, "wall_s": 4.0,
               "solo_train_s": 6.0}]
    many = {**doc, "concurrency": {**spread, "phases": phases}}
    assert "evaluation): copy 2.0×, recall curves 1.5×." in T.conclusion(many)


def test_merged_parts_keep_each_parts_spread(both, tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    study, _, shared, doc = both
    for k in (1, 2):
        part = dataclasses.replace(study, part=f"{k}/2")
        T.write_part({**doc, "study": part.describe()}, "cpu")
    merged = T.merge_parts("cpu", "2/2")
    assert "concurrency" not in merged
    assert [p["concurrency"]["workers"] for p in merged["parts"]] == [2, 2]
    assert "**Runs at once**: 2 worker processes on cpu; where" in T.conclusion(merged)
    # Parts that ran differently are each named with how they ran.
    merged["parts"][1]["concurrency"] = {**merged["parts"][1]["concurrency"], "workers": 1}
    line = T.conclusion(merged).split("**Runs at once**: ")[1].split("\n")[0]
    assert line.startswith("2 worker processes on cpu (part 1/2); one run at a time (part 2/2);")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_workers_train_on_the_cuda_device_named(device):
    study = small_study()
    task = study.task_list("mqar")[0]
    jobs = [study.job("mqar", task, mixer, 1e-3, 0, study.train_config("mqar", 1e-3))
            for mixer in study.mixers]
    with T.RunPool(device, 2) as pool:
        records, wall = pool.map(jobs)
    assert [r["mixer"] for r in records] == list(study.mixers) and wall > 0
    assert all(r["gpu_ms_per_step"] > 0 for r in records)  # CUDA events: it ran on the GPU


def test_a_run_that_fails_in_a_worker_raises_here():
    study = small_study()
    job = study.job("mqar", study.task_list("mqar")[0], "samu", 1e-3, 0, config=None)
    with T.RunPool("cpu", 2) as pool:
        with pytest.raises(AttributeError):
            pool.map([job])


def test_a_failed_run_keeps_the_records_of_runs_under_way():
    study = small_study()
    task = study.task_list("mqar")[0]
    failing = study.job("mqar", task, "samu", 1e-3, 0, config=None)
    slow = study.job("mqar", task, "rglru", 1e-3, 0,
                     dataclasses.replace(study.train_config("mqar", 1e-3), steps=64))
    later = [study.job("mqar", task, "attention", 1e-3, seed, study.train_config("mqar", 1e-3))
             for seed in (1, 2)]
    finished = []
    with T.RunPool("cpu", 2) as pool:
        with pytest.raises(AttributeError):
            pool.map([failing, slow, *later], done=lambda job, record: finished.append(record))
    # The failure came first; the run under way beside it finished and reached ``done``; the
    # runs not yet started did not start.
    assert [(r["mixer"], r["steps"]) for r in finished] == [("rglru", 64)]


@pytest.mark.parametrize("processes, devices, message", [
    (0, None, "processes must be an integer >= 1, got 0"),
    (True, None, "processes must be an integer >= 1, got True"),
    (1.5, None, "processes must be an integer >= 1"),
    (1, "cpu", "devices must be None or a non-empty list"),
    (1, [], "devices must be None or a non-empty list"),
    (1, ["cpu", "cpu"], "must not repeat a device"),
    (1, ["cpu", "cuda:0"], "all be CPUs or all CUDA devices"),
    (1, ["gpu:0"], "devices: "),
    (1, [f"cuda:{torch.cuda.device_count() + 3}"], "is not on this machine"),
])
def test_bad_pool_arguments_are_refused(processes, devices, message):
    with pytest.raises(T.ParameterError, match=message.replace("(", r"\(")):
        T.RunPool("cpu", processes, devices)


def test_devices_of_another_kind_than_the_studys_device_are_refused():
    """The study's files are labelled by its device: GPU runs under --device cpu were labelled
    cpu."""
    with pytest.raises(T.ParameterError, match=r"devices \['cpu'\] are not of the study's "
                                               "device cuda's kind"):
        T.check_devices("cuda", 1, ["cpu"])


def test_the_notebooks_parameters_take_devices_without_a_device(monkeypatch):
    """The command line hands the notebook "devices" without "device": the kind check must not
    read a missing device as the CPU and refuse two GPUs."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    defaults = {k: v for k, v in T.configuration("small").parameters("cpu").items()
                if k != "device"}
    study = T.check_parameters({**defaults, "devices": ["cuda:0", "cuda:1"]},
                               known=T.STUDY_PARAMETERS)
    assert study is not None


def test_check_parameters_refuses_bad_pool_arguments_before_anything_runs():
    defaults = T.configuration("small").parameters("cpu")
    known = T.STUDY_PARAMETERS
    with pytest.raises(T.ParameterError, match="processes must be an integer >= 1"):
        T.check_parameters({**defaults, "processes": 0}, known=known)
    with pytest.raises(T.ParameterError, match="must not repeat a device"):
        T.check_parameters({**defaults, "devices": ["cpu", "cpu"]}, known=known)
    with pytest.raises(T.ParameterError, match="speed_steps must be an integer >= 1"):
        T.check_parameters({**defaults, "speed_steps": 0}, known=known)
    assert T.check_parameters({**defaults, "processes": 3, "devices": ["cpu"]},
                              known=known).speed_steps == defaults["speed_steps"]

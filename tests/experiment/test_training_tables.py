"""The training study is built on tables: a task is a TaskSpec in samu.experiment.training.TASKS,
a study a Configuration in CONFIGURATIONS.  A toy task registered for a test's length runs
through the study, its document, figures, conclusion and notebook 05's cells with no other file
edited; the configurations' GPU parts fit a 10-minute device command by the estimate from the
committed H200 step times; and the package's modules import one another without a circle."""
import ast
import dataclasses
import json
import re
from pathlib import Path

import nbformat
import pytest
import torch

from samu import paths
from samu.experiment import schema, training as T
from samu.experiment.training import budget, configs
from samu.experiment.training import session as session_module

REF = "reference_chunked"  # named: tests/conftest.py sets TRITON_INTERPRET=1 on a CPU

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@dataclasses.dataclass(frozen=True)
class Echo:
    """Random tokens; at every position after the first the target is the token before it."""
    seq_len: int
    vocab_size: int = 8
    name = "echo"

    @property
    def chance(self) -> float:
        return 1.0 / self.vocab_size

    def batch(self, batch_size, generator):
        inputs = torch.randint(0, self.vocab_size, (batch_size, self.seq_len),
                               generator=generator, device=generator.device)
        targets = torch.full_like(inputs, T.IGNORE)
        targets[:, 1:] = inputs[:, :-1]
        return inputs, targets

    def held_out(self, batches, batch_size):
        g = T.seeded_generator(T.EVAL_SEED)
        return [self.batch(batch_size, g) for _ in range(batches)]

    def preview(self):
        return "an echo of the token before"


ECHO = T.TaskSpec("echo", "echo (the token before)", "accuracy", Echo,
                  {"vocab_size": T.COUNT}, sanity=True,
                  description="**Echo**: the token before, a toy task.")

ECHO_STUDY = dict(mixers=None, seeds=[0], width=16, layers=1, mlp_expansion=2,
                  tasks={"echo": {"lengths": [12], "vocab_size": 6}}, steps=30, batch_size=8,
                  lr=[3e-3, 1e-2], lr_search="grid", warmup_steps=2, eval_batches=1,
                  timing_warmup_steps=1, log_every=5, attention_head_dim=8, sanity_bar=0.1,
                  backend=REF, speed_steps=2, processes=1)


@pytest.fixture
def echo():
    with T.registered_task(ECHO) as spec:
        yield spec


def test_the_task_table_is_what_every_module_reads():
    assert list(T.TASKS) == ["mqar", "copy", "lm"]
    assert dict(T.TASK_NAMES) == {name: spec.label for name, spec in T.TASKS.items()}
    assert dict(T.METRICS) == {"mqar": "accuracy", "copy": "accuracy", "lm": "bits_per_char"}
    assert [n for n, spec in T.TASKS.items() if spec.sanity] == ["mqar", "copy", "lm"]
    assert T.make_task("mqar", 64, num_pairs=4).num_pairs == 4
    with pytest.raises(T.ParameterError, match="unknown task 'echo'"):
        T.make_task("echo", 8)
    with pytest.raises(T.ParameterError, match=r"mqar: .*num_tokens.*its options are"):
        T.make_task("mqar", 64, num_tokens=4)
    with pytest.raises(ValueError, match="unknown metric 'f1'"):
        dataclasses.replace(ECHO, metric="f1")
    with pytest.raises(ValueError, match="registered already"):
        with T.registered_task(T.TASKS["mqar"]):
            pass
    assert dict(T.MIXER_NAMES) == {"attention": "attention", "rglru": "RG-LRU", "samu": "SAMU"}


def test_a_toy_task_runs_through_the_study_its_document_figures_and_conclusion(echo, data_dir):
    table = {"echo": configs.Configuration("echo", "Echo", "", ECHO_STUDY, ECHO_STUDY)}
    run = T.StudyRun("echo", "cpu", "cpu", configurations=table, bar=False)
    assert "runs per task {'echo': 6}" in run.plan()
    assert "echo (the token before) (vocabulary 6)" in run.models()
    summary = run.run_task("echo")
    assert set(summary["mixer"]) == set(T.model_.mixer_names())
    assert "attention on echo (the token before) at L = 12" in run.sanity_text()
    doc = run.finish()
    assert run.written() == [data_dir / "training" / "cpu.echo.json"]
    assert schema.read_valid_json(run.written()[0], "training")["runs"][0]["task"] == "echo"
    assert {r["metric"] for r in doc["runs"]} == {"accuracy"}
    assert T.sanity(doc)["checks"]["echo"]["seq_len"] == 12  # it counts for the bar
    text = run.conclusion()
    assert "echo (the token before)" in text and "Where SAMU loses" in text
    assert len(run.images()) == 3  # loss, accuracy against length, quality against time
    assert sorted(p.name for p in (data_dir / "figures").iterdir()) == [
        f"cpu_training_echo_{name}.png" for name in ("accuracy", "loss", "quality_speed")]
    # Without the task in the table its documents do not validate.
    with pytest.raises(Exception, match="'echo' is not one of"):
        T.TASKS.pop("echo")
        try:
            T.validate(doc)
        finally:
            T.TASKS["echo"] = ECHO


def test_a_written_part_is_read_not_trained_and_merge_joins_the_parts_anywhere(
        echo, data_dir, monkeypatch, capsys):
    table = {"echo": configs.Configuration("echo", "Echo", "", ECHO_STUDY, ECHO_STUDY, parts=2)}
    with pytest.raises(SystemExit):
        T.main(["--config", "echo", "--merge", "cpu"], configurations=table)
    assert "no part file of echo" in capsys.readouterr().err
    for k in (1, 2):
        run = T.StudyRun("echo", "cpu", "cpu", part=k, configurations=table, bar=False)
        run.run_task("echo")
        run.finish()
    assert run.merged is not None
    # The part that merged timed every configuration again, one after another, on one machine.
    side = schema.read_valid_json(data_dir / "training" / "cpu.echo.json",
                                  "training")["side_by_side"]
    assert [(r["task"], r["seq_len"], r["mixer"]) for r in side["rows"]] == [
        ("echo", 12, m) for m in T.model_.mixer_names()]
    assert side["steps"] == ECHO_STUDY["speed_steps"] and all(
        r["wall_ms_per_step"] > 0 and r["gpu_ms_per_step"] is None for r in side["rows"])
    assert "**Timed side by side** (every configuration alone, one after another in the " \
        "command that merged the parts, on a CPU; 2 steps each, wall time per step): echo " \
        "(the token before) L = 12: attention " in T.conclusion(run.merged)
    first = data_dir / "training" / "cpu.echo.part-1-of-2.json"
    written = first.read_bytes()
    (data_dir / "training" / "cpu.echo.json").unlink()

    def trained(*args, **kwargs):
        raise AssertionError("a written part was trained again")
    monkeypatch.setattr(session_module, "run_task", trained)
    spent = data_dir / "training" / "cpu.echo.part-1-of-2.finished.jsonl"
    spent.write_text("{}\n")  # runs kept before the part was written
    saves = data_dir / "training" / "cpu.echo.part-1-of-2.in-progress"
    saves.mkdir()
    (saves / "run.pt").write_bytes(b"")  # and a run's save left by a stop
    again = T.StudyRun("echo", "cpu", "cpu", part=1, configurations=table, bar=False)
    assert not spent.exists() and not saves.exists()
    assert "this part's file is written" in again.plan()
    assert len(again.run_task("echo"))
    assert again.finish()["parts"] and first.read_bytes() == written
    assert (data_dir / "training" / "cpu.echo.json").exists()

    (data_dir / "training" / "cpu.echo.json").unlink()
    assert not (data_dir / "figures").exists()  # a part's run draws none; the merge does
    assert T.main(["--config", "echo", "--merge", "cpu"], configurations=table) == 0
    out = capsys.readouterr().out
    assert "yardstick passes its sanity bar" in out and "wrote " in out
    merged = schema.read_valid_json(data_dir / "training" / "cpu.echo.json", "training")
    assert [p["part"] for p in merged["parts"]] == ["1/2", "2/2"]
    assert sorted(p.name for p in (data_dir / "figures").iterdir()) == [
        f"cpu_training_echo_{name}.png" for name in ("accuracy", "loss", "quality_speed")]
    with pytest.raises(SystemExit):
        T.main(["--merge", "cpu"], configurations=table)
    assert "--merge: name one configuration" in capsys.readouterr().err
    stale = json.loads(first.read_text())
    stale["study"]["width"] *= 2
    first.write_text(json.dumps(stale))  # part 1 of another study
    again = T.StudyRun("echo", "cpu", "cpu", part=2, configurations=table, bar=False)
    again.run_task("echo")
    assert again.finish() is again.written_part and again.merged is None
    assert again.written() == []  # read, not written
    said = capsys.readouterr().out
    assert "not merged" in said and said.split("to run again: ")[1].strip().endswith(
        "cpu.echo.part-1-of-2.json")
    assert T.main(["--device", "cpu", "--config", "echo", "--part", "2"],
                  configurations=table) == 0  # the command line: no notebook, no training
    said = capsys.readouterr().out
    assert "part 2/2 of echo is written already; nothing is trained" in said
    assert "read " in said.splitlines()[-1] and "wrote" not in said  # the part's file, only read
    assert "cpu.echo.part-1-of-2.json" in said.split("to run again: ")[1]
    with pytest.raises(SystemExit):
        T.main(["--config", "echo", "--merge", "cpu"], configurations=table)
    assert "its study differs" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        T.main(["--config", "echo", "--merge", "cpu", "--part", "1"], configurations=table)
    assert "--merge trains nothing: drop --part" in capsys.readouterr().err
    first.write_text(first.read_text()[:100])  # cut short: that part trains again
    assert T.StudyRun("echo", "cpu", "cpu", part=1, configurations=table,
                      bar=False).written_part is None


def test_a_part_holding_none_of_a_tasks_runs_goes_through(echo, data_dir):
    # Parts split a study's (task, mixer) sweeps, so a part may hold none of a task's runs:
    # the scale study's parts are one sweep each.  Here the sweeps are echo's three, then
    # MQAR's, dealt to 4 parts in turn: part 4 holds MQAR's attention sweep alone.
    two = dict(ECHO_STUDY, lr_search="first_seed", tasks={
        "echo": {"lengths": [12], "vocab_size": 6},
        "mqar": {"lengths": [8], "num_pairs": 2, "vocab_size": 8}})
    table = {"two": configs.Configuration("two", "Two", "", two, two, parts=4)}
    run = T.StudyRun("two", "cpu", "cpu", part=4, configurations=table, bar=False)
    summary = run.run_task("echo")
    assert summary.empty and list(summary.columns) == T.SUMMARY_COLUMNS
    assert list(run.run_task("mqar")["mixer"]) == ["attention"]
    assert {r["task"] for r in run.finish()["runs"]} == {"mqar"}
    assert (data_dir / "training" / "cpu.two.part-4-of-4.json").exists()
    # More parts than sweeps: one would hold nothing, and the merge would wait for it.
    for part in ("1/7", "7/7"):
        with pytest.raises(T.ParameterError, match=rf"part {part}: .* at most 6 parts .*not 7"):
            T.check_parameters(dict(two, part=part))
    assert T.check_parameters(dict(two, part="6/6")).part == "6/6"


def test_the_side_by_side_timing_is_kept_contained_and_never_lost(echo, data_dir, monkeypatch,
                                                                    capsys):
    from samu.experiment.training import session as session_module
    table = {"echo": configs.Configuration("echo", "Echo", "", ECHO_STUDY, ECHO_STUDY, parts=2)}
    for k in (1, 2):
        run = T.StudyRun("echo", "cpu", "cpu", part=k, configurations=table, bar=False)
        run.run_task("echo")
        run.finish()
    whole = data_dir / "training" / "cpu.echo.json"
    timed = schema.read_valid_json(whole, "training")["side_by_side"]
    # Merged again from the files (--merge times nothing): the timing of the same study stays.
    assert T.main(["--config", "echo", "--merge", "cpu"], configurations=table) == 0
    assert schema.read_valid_json(whole, "training")["side_by_side"] == timed
    # A timing that fails leaves the merged runs written and untimed, and says so.
    doc = schema.read_valid_json(whole, "training")
    del doc["side_by_side"]

    def broken(*args, **kwargs):
        raise RuntimeError("out of memory")
    monkeypatch.setattr(session_module, "time_side_by_side", broken)
    said = session_module.time_merged(doc, run.study, "cpu", "cpu")
    assert said.startswith("side-by-side timing failed (RuntimeError: out of memory)")
    assert "side_by_side" not in doc
    # Another machine's GPU: not timed here.
    other = dict(doc, environment=dict(doc["environment"], gpu="NVIDIA H100"))
    assert "not timed side by side" in session_module.time_merged(other, run.study, "cpu", "cpu")
    # A time budget whose share this part cannot split (a part of no task runs) is no matter:
    # a step's time is timed, not a run's share.
    monkeypatch.undo()
    budgeted = dataclasses.replace(run.study, time_budget_s=5.0)
    monkeypatch.setattr(type(budgeted), "total_steps", lambda self: 0)
    rows = T.time_side_by_side(budgeted, doc["runs"], "cpu", 1)
    assert [r["mixer"] for r in rows] == list(T.model_.mixer_names())
    capsys.readouterr()


def test_merge_takes_the_number_of_parts_from_the_files(echo, data_dir, capsys):
    table = {"echo": configs.Configuration("echo", "Echo", "", ECHO_STUDY, ECHO_STUDY, parts=2)}
    for k in (1, 2, 3):  # run as thirds, not the configuration's halves
        run = T.StudyRun("echo", "cpu", "cpu", part=f"{k}/3", configurations=table, bar=False)
        run.run_task("echo")
        run.finish()
    (data_dir / "training" / "cpu.echo.json").unlink()
    assert T.main(["--config", "echo", "--merge", "cpu"], configurations=table) == 0
    merged = schema.read_valid_json(data_dir / "training" / "cpu.echo.json", "training")
    assert [p["part"] for p in merged["parts"]] == ["1/3", "2/3", "3/3"]
    capsys.readouterr()
    extra = data_dir / "training" / "cpu.echo.part-1-of-2.json"
    extra.write_text((data_dir / "training" / "cpu.echo.part-1-of-3.json").read_text())
    with pytest.raises(SystemExit):
        T.main(["--config", "echo", "--merge", "cpu"], configurations=table)
    assert "part files of echo split 2 ways (2, 3 parts)" in capsys.readouterr().err
    extra.unlink()
    # A part's file copied over another's name would merge its runs twice: refused, unwritten.
    third = data_dir / "training" / "cpu.echo.part-3-of-3.json"
    third.write_text((data_dir / "training" / "cpu.echo.part-1-of-3.json").read_text())
    (data_dir / "training" / "cpu.echo.json").unlink()
    with pytest.raises(SystemExit):
        T.main(["--config", "echo", "--merge", "cpu"], configurations=table)
    assert "holds part '1/3' of its study, not 3/3" in capsys.readouterr().err
    assert not (data_dir / "training" / "cpu.echo.json").exists()
    for label in ("", "../cpu", " cpu", "cpu.echo", "cpu*"):
        with pytest.raises(SystemExit):  # "cpu.echo" took another configuration's files
            T.main(["--config", "echo", "--merge", label], configurations=table)
        assert "a label is a GPU's slug" in capsys.readouterr().err


def test_merge_refuses_another_configurations_parts_and_names_mixed_commits(echo, data_dir,
                                                                             capsys):
    table = {name: configs.Configuration(name, name.title(), "", ECHO_STUDY, ECHO_STUDY,
                                         parts=2) for name in ("echo", "other")}
    for k in (1, 2):
        run = T.StudyRun("echo", "cpu", "cpu", part=k, configurations=table, bar=False)
        run.run_task("echo")
        run.finish()
    folder = data_dir / "training"
    first, second = (folder / f"cpu.echo.part-{k}-of-2.json" for k in (1, 2))
    for k, source in ((1, first), (2, second)):  # echo's parts under other's names
        (folder / f"cpu.other.part-{k}-of-2.json").write_text(source.read_text())
    with pytest.raises(SystemExit):
        T.main(["--config", "other", "--merge", "cpu"], configurations=table)
    assert "holds a part of the echo study, not of other" in capsys.readouterr().err
    assert not (folder / "cpu.other.json").exists()

    later = json.loads(second.read_text())
    later["environment"]["git_commit"] = "0123456789ab"
    second.write_text(json.dumps(later))
    assert T.main(["--config", "echo", "--merge", "cpu"], configurations=table) == 0
    said = capsys.readouterr().out
    assert "the parts ran at different git_commit 1/2: " in said and "2/2: 0123456789ab" in said

    later["environment"]["gpu"] = "Another GPU"
    second.write_text(json.dumps(later))
    (folder / "cpu.echo.json").unlink()
    with pytest.raises(SystemExit):  # a written part whose merge is refused: one line
        T.main(["--device", "cpu", "--config", "echo", "--part", "1"], configurations=table)
    assert "--part 1/2: " in capsys.readouterr().err


def notebook_05(out: Path, monkeypatch) -> nbformat.NotebookNode:
    """Notebook 05 as tools/make_notebooks.py writes it now (into ``out``)."""
    import runpy
    out.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("SAMU_NOTEBOOKS_OUT", str(out))
    runpy.run_path(str(paths.REPO_ROOT / "tools" / "make_notebooks.py"))["main"]([])
    return nbformat.read(out / "05_training.ipynb", as_version=4)


def test_notebook_05_reads_the_tables_and_its_cells_run_a_toy_task(echo, data_dir, tmp_path,
                                                                   monkeypatch):
    nb = notebook_05(tmp_path / "notebooks", monkeypatch)
    intro = nb.cells[0].source
    assert ECHO.description in intro  # the task table, as the notebook is written
    for spec in T.TASKS.values():
        assert spec.description in intro
    headings = [c.source.split("\n")[0] for c in nb.cells if c.cell_type == "markdown"]
    for name, config in T.CONFIGURATIONS.items():
        assert f"## {config.label} (`{name}`)" in headings
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    for name in T.TASKS:  # no cell names a task: each loops over the study's
        assert not re.search(rf"[\"']{name}[\"']", code), name
    # Its cells, as papermill runs them, with a toy study handed in: the first section runs it.
    namespace = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        exec(compile(cell.source, "05_training", "exec"), namespace)
        if "parameters" in cell.metadata.get("tags", []):
            namespace.update(studies={"small": ECHO_STUDY}, yardstick=False, device="cpu")
    doc = namespace["doc"]
    assert doc["study"]["configuration"] == "small" and doc["study"]["tasks"] == {
        "echo": {"lengths": [12], "vocab_size": 6}}
    assert (data_dir / "training" / "cpu.json").exists()


@pytest.fixture(scope="module")
def committed():
    return schema.read_valid_json(paths.REPO_ROOT / "data" / "training" / "nvidia-h200.json",
                                  "training")


def test_the_step_model_fits_the_committed_step_times(committed):
    models = budget.fit_step_models(committed)
    assert set(models) == {"attention", "rglru", "samu"}
    for mixer, model in models.items():
        assert model.points >= 5 and model.fixed_ms > 0 and model.per_element_ns > 0
    # Each configuration's step time is within 15% of what it measured alone.
    for r in committed["runs"] + committed["recall_curves"]:
        config = budget._config_of(r)
        ms = models[r["mixer"]].ms(budget.step_cost(config, r["seq_len"], r["batch_size"]))
        assert ms == pytest.approx(r["solo_wall_ms_per_step"], rel=0.15), r["mixer"]


def test_attention_costs_more_than_a_recurrent_step_only_at_the_scale_configuration(committed):
    models = budget.fit_step_models(committed)
    for name, longer in (("small", False), ("scale", True)):
        study = T.check_parameters(T.configuration(name).parameters("gpu"))
        task = study.task_list("lm")[0]
        ms = {m: models[m].ms(budget.step_cost(study.model_config(m, task.vocab_size),
                                               task.seq_len, study.train["lm"].batch_size))
              for m in study.mixers}
        assert all((ms["attention"] > ms[m]) == longer for m in study.mixers
                   if m != "attention"), (name, ms)


def quoted(name: str) -> dict:
    """The estimate configs' docstring quotes for ``name``: runs, seconds, parts and their
    seconds."""
    line = re.search(rf"- ``{name}``: (\d+) runs .*?about (\d+) s in all, (\d+) parts of "
                     rf"about (\d+) s", configs.__doc__.replace("\n", " ")).groups()
    return dict(zip(("runs", "seconds", "parts", "part_seconds"), map(int, line)))


@pytest.mark.parametrize("name, part_fits_a_command", [("recall", False), ("scale", False),
                                                       ("small", True)])
def test_each_gpu_run_or_part_fits_a_ten_minute_command_and_the_docstring_says_so(
        name, part_fits_a_command, committed):
    config = T.configuration(name)
    study = T.check_parameters(config.parameters("gpu"))
    whole = budget.estimate(study, committed)
    parts = [budget.estimate(dataclasses.replace(study, part=f"{k}/{config.parts}"), committed)
             for k in range(1, config.parts + 1)]
    assert sum(p["runs"] for p in parts) == whole["runs"]
    # A 10-minute command less its start-up (about 30 s) and a minute's room.  Every run fits
    # one, so that a part a command stops (a widened sweep, or the recall curves' long runs)
    # goes on from its finished runs in the next; the small study's parts fit one whole.
    steps = {key: (study.recall_config().steps if key[0] == "recall"
                   else study.train[key[0]].steps) for key in whole["step_ms"]}
    longest_run = max(ms * steps[key] / 1e3 for key, ms in whole["step_ms"].items())
    assert longest_run + whole["per_run_overhead_s"] < 510
    if part_fits_a_command:
        assert max(p["seconds"] for p in parts) < 510
    said = quoted(name)
    assert said["runs"] == whole["runs"] and said["parts"] == config.parts
    assert said["seconds"] == pytest.approx(whole["seconds"], rel=0.05)
    assert said["part_seconds"] == pytest.approx(max(p["seconds"] for p in parts), rel=0.1)


def test_the_recall_curves_follow_zoology_and_the_rate_grids_are_wide():
    recall = T.check_parameters(T.configuration("recall").parameters("gpu"))
    spec = recall.recall_curves
    assert spec["points"] == [[64, 4], [128, 8], [256, 16]] and spec["vocab_size"] == 8192
    assert spec["widths"] == [64, 128, 256, 512]
    for mixer in recall.mixers:
        rates = recall.recall_lrs(mixer)
        assert len(rates) >= 4 and min(rates) <= 1e-4 and max(rates) >= 1e-2
    scale = T.check_parameters(T.configuration("scale").parameters("gpu"))
    assert 4096 <= scale.task_list("lm")[0].seq_len <= 8192 and 512 <= scale.width <= 1024
    assert scale.attention_kernel == "fastest" and scale.lr_search == "first_seed"
    for name in scale.tasks:
        for mixer in scale.mixers:
            rates = scale.lrs(name, mixer)
            assert len(rates) >= 4 and max(rates) / min(rates) >= 8
    # Each task's steps and batch are the task's, not a mixer's: the same tokens for every
    # mixer; MQAR's runs are the longer (attention was still leaving its plateau at the LM's).
    tokens = {name: scale.train[name].steps * scale.train[name].batch_size
              * scale.task_list(name)[0].seq_len for name in scale.tasks}
    assert tokens["mqar"] > tokens["lm"] >= 600 * 8 * 8192


def test_the_fastest_attention_kernel_is_one_that_runs():
    study = T.check_parameters(T.configuration("scale").parameters("cpu"))
    task = study.task_list("mqar")[0]
    config = study.train_config("mqar")
    name = T.fastest_attention_kernel(study.model_config("attention", task.vocab_size), task,
                                      config, "cpu", steps=2)
    assert name in ("math", "flash")  # the kernels a CPU has
    job = study.job("mqar", task, "attention", 1e-3, 0, dataclasses.replace(
        config, attention_kernel="efficient"))
    with pytest.raises(RuntimeError):  # not on a CPU: refused, not quietly another
        T.run_job(job, "cpu")


def test_a_run_stops_early_once_solved():
    task = T.make_task("mqar", 16, num_pairs=2, vocab_size=8)
    study = T.check_parameters({**ECHO_STUDY, "tasks": {"mqar": {"lengths": [16],
                                                                 "num_pairs": 2,
                                                                 "vocab_size": 8}}})
    config = dataclasses.replace(study.train_config("mqar"), steps=40, stop_loss=100.0)
    record = T.run_job(study.job("mqar", task, "attention", 1e-3, 0, config), "cpu")
    assert record["stopped_early"] and record["steps_completed"] == 5  # the first window
    assert not record["stopped_by_time"] and record["decay_from"] is None
    # Under "wsd" too: a run solved before its decay records none (its curve is all before).
    wsd = dataclasses.replace(config, schedule="wsd", plateau_from=20)
    record = T.run_job(study.job("mqar", task, "attention", 1e-3, 0, wsd), "cpu")
    assert record["stopped_early"] and record["steps_completed"] == 5
    assert record["decay_from"] is None


def test_each_task_takes_its_own_schedule():
    """A study's "schedule" and "plateau_from" by task reach that task's runs (and its
    description, which names a part's file) and no other's; a plateau with another schedule, a
    schedule that is none, and a dict that misses a task are refused, naming the task."""
    tasks = {"mqar": {"lengths": [16], "num_pairs": 2, "vocab_size": 8}, "lm": {"lengths": [16]}}
    study = T.check_parameters({**ECHO_STUDY, "tasks": tasks, "steps": {"mqar": 200, "lm": 30},
                                "log_every": 2, "schedule": {"mqar": "wsd", "lm": "cosine"},
                                "plateau_from": {"mqar": 40, "lm": None}})
    assert (study.train["mqar"].schedule, study.train["mqar"].plateau_from) == ("wsd", 40)
    assert (study.train["lm"].schedule, study.train["lm"].plateau_from) == ("cosine", None)
    described = study.describe()["train"]
    assert described["mqar"]["plateau_from"] == 40 and described["lm"]["schedule"] == "cosine"
    task = study.task_list("mqar")[0]
    record = T.run_job(study.job("mqar", task, "attention", 1e-9, 0,
                                 study.train_config("mqar", 1e-9)), "cpu")
    assert record["decay_from"] == 40 and record["steps_completed"] == 50  # flat: it decays
    one = T.check_parameters({**ECHO_STUDY, "tasks": tasks, "schedule": "wsd",
                              "plateau_from": 10})
    assert all((c.schedule, c.plateau_from) == ("wsd", 10) for c in one.train.values())
    default = T.check_parameters({**ECHO_STUDY, "tasks": tasks}).train
    assert all((c.schedule, c.plateau_from) == ("cosine", None) for c in default.values())
    for bad, words in [
            ({"schedule": {"mqar": "cosine", "lm": "cosine"}, "plateau_from": {"mqar": 40,
                                                                             "lm": None}},
             "task 'mqar': train: plateau_from starts a 'wsd' schedule's decay; with schedule "
             "'cosine' it must be None"),
            ({"plateau_from": 40}, "task 'mqar': train: plateau_from starts a 'wsd' schedule's"),
            ({"schedule": {"mqar": "wsd", "lm": "linear"}},
             "task 'lm': train: schedule must be one of ['cosine', 'constant', 'wsd'], got "
             "'linear'"),
            ({"schedule": {"mqar": "wsd"}}, "schedule has no value for the tasks ['lm']"),
            ({"schedule": "wsd", "plateau_from": {"mqar": -1, "lm": None}},
             "plateau_from['mqar'] must be an integer >= 0, or None, got -1"),
            ({"schedule": {"mqar": "wsd", "lm": "cosine"}, "steps": {"mqar": 10, "lm": 30},
              "warmup_steps": 9}, "task 'mqar': train: a 'wsd' schedule's decay starts at step 8")]:
        with pytest.raises(T.ParameterError) as caught:
            T.check_parameters({**ECHO_STUDY, "tasks": tasks, **bad})
        assert words in str(caught.value), caught.value


def test_a_wsd_run_whose_loss_stops_falling_decays_and_ends_there():
    """At a rate too small to learn, the loss is flat: from plateau_from on the first logging
    point finds it, the decay starts there and the run ends a fifth of its length later; without
    plateau_from the run takes every step, decaying from latest_decay."""
    task = T.make_task("mqar", 16, num_pairs=2, vocab_size=8)
    study = T.check_parameters({**ECHO_STUDY, "tasks": {"mqar": {"lengths": [16],
                                                                 "num_pairs": 2,
                                                                 "vocab_size": 8}}})
    flat = dataclasses.replace(study.train_config("mqar"), steps=200, log_every=2,
                               schedule="wsd", plateau_from=40)
    record = T.run_job(study.job("mqar", task, "attention", 1e-9, 0, flat), "cpu")
    assert record["decay_from"] == 40 and record["steps_completed"] == flat.decay_end(40) == 50
    assert not record["stopped_early"] and record["loss_curve"][-1][0] == 50
    # too few logged points to judge by: the decay waits for the tenth (step 100)
    sparse = dataclasses.replace(flat, log_every=10, plateau_from=20)
    record = T.run_job(study.job("mqar", task, "attention", 1e-9, 0, sparse), "cpu")
    assert record["decay_from"] == 100 and record["steps_completed"] == 125
    whole = dataclasses.replace(flat, steps=30, plateau_from=None)
    record = T.run_job(study.job("mqar", task, "attention", 1e-9, 0, whole), "cpu")
    assert record["decay_from"] == whole.latest_decay() == 24
    assert record["steps_completed"] == 30
    # no plateau before the warm-up's end
    late = dataclasses.replace(flat, warmup_steps=60, plateau_from=20)
    record = T.run_job(study.job("mqar", task, "attention", 1e-9, 0, late), "cpu")
    assert record["decay_from"] == 60 and record["steps_completed"] == late.decay_end(60) == 75
    T.validate(T.result_document(study, [record], "cpu"))  # the schema takes decay_from
    with pytest.raises(Exception, match="decay_from"):
        T.validate(T.result_document(study, [{**record, "decay_from": "60"}], "cpu"))


def imports_of(path: Path, package: str) -> set:
    """The modules of ``package`` that the module at ``path`` imports, at any depth."""
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            out.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 1:
            out.update(alias.name for alias in node.names)
    return out & {p.stem for p in path.parent.glob("*.py")}


def test_the_training_modules_import_one_another_without_a_circle():
    folder = Path(T.__file__).parent
    graph = {p.stem: imports_of(p, "training") for p in folder.glob("*.py")
             if p.stem not in ("__init__", "__main__")}
    seen, done = set(), set()

    def visit(node, path):
        assert node not in path, " -> ".join([*path, node])
        if node in done:
            return
        for other in graph.get(node, ()):
            visit(other, [*path, node])
        done.add(node)
    for node in graph:
        visit(node, [])
    assert "study" not in graph["pool"]  # the pool runs Jobs; it knows no study
    init = (folder / "__init__.py").read_text()
    assert not re.search(r"import _\w", init)  # no private name is re-exported


def test_the_conclusion_says_what_a_faster_step_buys():
    runs = [{"task": "lm", "mixer": m, "seed": 0, "seq_len": 64, "metric": "bits_per_char",
             "value": v, "chance": 8.0, "eval_loss": 1.0, "final_train_loss": 1.0,
             "tokens_per_s": 1e5, "parameters": 1000, "steps": 10, "steps_completed": 10,
             "stopped_by_time": False, "diverged": False, "wall_s": 1.0,
             "wall_ms_per_step": 1.0, "gpu_ms_per_step": ms, "train_wall_s": 1.0}
            for m, v, ms in (("attention", 2.0, 4.0), ("samu", 2.2, 3.0))]
    doc = {"environment": {"gpu": "NVIDIA H200", "device": "cuda", "dtype": "bfloat16"},
           "study": {"tasks": {"lm": {}}, "mixers": ["attention", "samu"], "width": 8,
                     "layers": 1, "train": {"lm": {"steps": 10}}, "sanity_bar": 0.0},
           "runs": runs}
    assert ("**What a step's speed buys** (GPU time per step, each mixer at its best rate, at "
            "each task's longest length): character LM (stdlib source) L = 64: SAMU 0.75× "
            "attention's step, 2.200 against 2.000 bits/char.") in T.conclusion(doc)


def test_make_train_estimates_a_study_and_runs_nothing(capsys, monkeypatch):
    from samu.experiment import pipeline
    monkeypatch.setattr(pipeline, "run_notebook", lambda *a, **k: pytest.fail("ran"))
    assert T.main(["--estimate", "--config", "scale"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("scale: 36 runs (not counting the rates a sweep adds past an edge "
                          "best, nor early stops), about ")
    assert [line.split(":")[0].strip() for line in out.splitlines()[1:]] == [
        f"PART={k}" for k in range(1, 7)]
    with pytest.raises(SystemExit):  # it prints every part's: a part is refused, not ignored
        T.main(["--estimate", "--config", "scale", "--part", "7"])
    assert "--estimate prints every part's estimate: drop --part" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:  # a name it lacks: a usage error, no traceback
        T.main(["--estimate", "--config", "bogus"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "usage: python -m samu.experiment.training" in err
    assert "--config: unknown configuration 'bogus'; choose one of " in err and "or all" in err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            T.main(["--estimate", "--measure"])
        assert "--measure: with --estimate, on a machine with a CUDA device" in \
            capsys.readouterr().err


def test_a_solved_run_stops_by_its_tasks_stop_loss_and_no_other_task_does():
    """``stop_loss`` by task: a run of that task stops at the first logging window whose mean
    training loss is at most it, and records that it stopped early; another task's run takes
    every step; a value of a task that is no positive number is refused, naming the task."""
    tasks = {"mqar": {"lengths": [16], "num_pairs": 2, "vocab_size": 8}, "lm": {"lengths": [16]}}
    study = T.check_parameters({**ECHO_STUDY, "tasks": tasks, "steps": 12, "log_every": 2,
                                "stop_loss": {"mqar": 1e3, "lm": None}})
    assert (study.train["mqar"].stop_loss, study.train["lm"].stop_loss) == (1e3, None)
    assert study.describe()["train"]["mqar"]["stop_loss"] == 1e3
    records = {}
    for name in tasks:
        job = study.job(name, study.task_list(name)[0], "attention", 1e-3, 0,
                        study.train_config(name, 1e-3))
        records[name] = T.run_job(job, "cpu")
    assert records["mqar"]["stopped_early"] and records["mqar"]["steps_completed"] == 2
    assert not records["lm"]["stopped_early"] and records["lm"]["steps_completed"] == 12
    with pytest.raises(T.ParameterError, match=r"stop_loss\['mqar'\] must be"):
        T.check_parameters({**ECHO_STUDY, "tasks": tasks, "stop_loss": {"mqar": 0, "lm": None}})
    with pytest.raises(T.ParameterError, match=r"stop_loss has no value for the tasks \['lm'\]"):
        T.check_parameters({**ECHO_STUDY, "tasks": tasks, "stop_loss": {"mqar": 0.02}})


def test_each_configurations_speed_is_timed_under_a_schedule_that_fits_its_few_steps():
    """measure_speed times a run's configuration over a few steps: a "wsd" task (the scale
    study's MQAR, the recall curves) is timed as a cosine one, with no plateau, early stop or
    time cap, whatever its warm-up, and anything else of its configuration kept."""
    from samu.experiment.training.runs import speed_config
    for name in T.CONFIGURATIONS:
        study = T.check_parameters(T.configuration(name).parameters("gpu"))
        configs_ = list(study.train.values())
        if study.recall_curves is not None:
            configs_.append(study.recall_config())
        for config in configs_:
            timed = speed_config(config, study.speed_steps)
            assert timed.steps == config.timing_warmup_steps + study.speed_steps
            assert timed.schedule == ("cosine" if config.schedule == "wsd" else config.schedule)
            assert (timed.plateau_from, timed.stop_loss, timed.max_seconds) == (None, None, None)
            assert (timed.lr, timed.batch_size, timed.cuda_graph) == (
                config.lr, config.batch_size, config.cuda_graph)
    scale = T.check_parameters(T.configuration("scale").parameters("gpu")).train["mqar"]
    assert (scale.schedule, scale.plateau_from, scale.stop_loss) == ("wsd", 6000, 0.02)



def test_the_per_run_overhead_leaves_out_resumed_runs():
    """A resumed run's wall time misses what it trained after its last save: the estimate's
    per-run overhead is the median over the runs trained in one go."""
    def run(wall_s, resumed_at):
        return {"steps_completed": 100, "solo_wall_ms_per_step": 10.0, "wall_s": wall_s,
                "concurrent_runs": 1, "resumed_at": resumed_at}
    doc = {"runs": [run(3.0, []), run(4.0, []), run(5.0, []), run(0.5, [40]), run(0.6, [60])]}
    assert budget.run_overhead_s(doc) == pytest.approx(3.0)  # 1 s of steps, the median 4 s

"""The training study: task generators, the standard-library corpus, the training loop, the result
document and its schema, the figures, the conclusion and `make train`'s entry point."""
import copy
import dataclasses
import json
import math
import re

import jsonschema
import pytest
import torch

from samu import paths
from samu.experiment import pipeline, schema, training as T
from samu.experiment.training import tasks as task_module
from samu.experiment.training import session as session_module

REF = "reference_chunked"  # named: tests/conftest.py sets TRITON_INTERPRET=1 on a CPU


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# --- tasks ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("task", [T.MQAR(64, num_pairs=6, vocab_size=40),
                                  T.SelectiveCopy(40, num_tokens=5),
                                  T.CharLM(33)])
def test_batches_are_deterministic_in_the_seed(task):
    a, b, c = task.batch(4, gen(1)), task.batch(4, gen(1)), task.batch(4, gen(2))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])
    assert a[0].shape == a[1].shape == (4, task.seq_len) and a[0].dtype == torch.int64
    assert a[0].min() >= 0 and a[0].max() < task.vocab_size
    held = task.held_out(2, 3)
    again = task.held_out(2, 3)
    assert len(held) == 2 and all(torch.equal(x[0], y[0]) for x, y in zip(held, again))


@pytest.mark.parametrize("episodes", [1, 4])
def test_mqar_answers_are_the_values_of_the_queried_keys(episodes):
    """Each episode (the whole sequence, or one of ``episodes`` blocks) holds its pairs, then
    queries of its own keys only; keys are distinct over the whole sequence."""
    task = T.MQAR(128 * episodes, num_pairs=8, vocab_size=128, episodes=episodes)
    inputs, targets = task.batch(16, gen(3))
    assert inputs.shape == (16, 128 * episodes)
    half = 64
    for row_x, row_y in zip(inputs.tolist(), targets.tolist()):
        assert len({k for e in range(episodes) for k in row_x[128 * e:128 * e + 16:2]}) \
            == 8 * episodes  # no key of one episode in another
        for e in range(episodes):
            x, y = row_x[128 * e:128 * (e + 1)], row_y[128 * e:128 * (e + 1)]
            context = x[:16]
            keys, values = context[0::2], context[1::2]
            assert len(set(keys)) == 8 and all(1 <= k < half for k in keys)
            assert len(set(values)) == 8 and all(half <= v < 128 for v in values)
            pairs = dict(zip(keys, values))
            asked = [(i, x[i], y[i]) for i in range(128) if y[i] != T.IGNORE]
            assert len(asked) == 8 and all(i >= 16 for i, _, _ in asked)
            assert sorted(k for _, k, _ in asked) == sorted(keys)  # every key queried once
            assert all(pairs[k] == v for _, k, v in asked)  # the answer is the key's value
            # outside its pair and its query a key never appears: the rest is the values' range
            queried = {i for i, _, _ in asked}
            assert all(half <= x[i] < 128 for i in range(16, 128) if i not in queried)


def test_a_long_example_is_previewed_by_its_start():
    short, long = T.MQAR(64, num_pairs=4, vocab_size=32), T.MQAR(8192, num_pairs=4,
                                                                  vocab_size=2048, episodes=128)
    assert "tokens)" not in short.preview() and len(short.preview().splitlines()) == 2
    text = long.preview()
    assert text.endswith(f"(the first {T.tasks.PREVIEW_TOKENS} of 8192 tokens)")
    assert len(text) < 3000


def test_mqar_queries_follow_the_power_law():
    """Zoology's power law: most queries soon after the pairs, a tail to the end of the sequence;
    uniform placement spreads them evenly."""
    def positions(task):
        _, targets = task.batch(256, gen(0))
        return (targets != T.IGNORE).nonzero()[:, 1].float() - 8  # offsets past the pairs
    power = positions(T.MQAR(1024, num_pairs=4, vocab_size=64))
    uniform = positions(T.MQAR(1024, num_pairs=4, vocab_size=64, power_a=None))
    assert power.median() < 100 and power.max() > 800  # near the pairs, with a heavy tail
    assert (power < 20).float().mean() > 0.2
    assert abs(uniform.mean().item() - 1016 / 2) < 30 and (uniform < 20).float().mean() < 0.05
    # the law itself: slot s has weight s^(a - 1)
    weights = T.MQAR(1024, num_pairs=4, vocab_size=64, power_a=0.5).slot_weights().exp()
    assert weights[3] / weights[0] == pytest.approx(4 ** -0.5)


def test_copy_targets_are_the_scattered_data_tokens_in_order():
    task = T.SelectiveCopy(50, num_tokens=6, data_vocab=8, noise_vocab=5)
    assert task.vocab_size == 15 and task.body == 43
    inputs, targets = task.batch(16, gen(4))
    for x, y in zip(inputs.tolist(), targets.tolist()):
        body = x[:43]
        data = [t for t in body if 2 <= t < 10]
        assert len(data) == 6
        assert all(10 <= t < 15 for t in body if not 2 <= t < 10)  # the rest is noise
        assert x[43] == T.SelectiveCopy.SEPARATOR and x[44:] == [T.SelectiveCopy.MARKER] * 6
        assert y[44:] == data and all(t == T.IGNORE for t in y[:44])


@pytest.mark.parametrize("make, words", [
    (lambda: T.MQAR(31, num_pairs=8, vocab_size=64), "too short"),
    (lambda: T.MQAR(256, num_pairs=8, vocab_size=16), "distinct keys"),
    (lambda: T.MQAR(256, num_pairs=0), "num_pairs"),
    (lambda: T.MQAR(256, num_pairs=8, vocab_size=64, episodes=4), "32 distinct keys"),
    (lambda: T.MQAR(250, num_pairs=4, vocab_size=64, episodes=4), "whole number of episodes"),
    (lambda: T.MQAR(256, num_pairs=4, vocab_size=512, episodes=32), "an episode"),
    (lambda: T.MQAR(256, episodes=0), "episodes"),
    (lambda: T.MQAR(256, power_a=1.5), "power_a"),
    (lambda: T.SelectiveCopy(10, num_tokens=5), "too short"),
    (lambda: T.SelectiveCopy(64, noise_vocab=0), "noise_vocab"),
    (lambda: T.CharLM(0), "seq_len"),
    (lambda: T.make_task("parity", 64), "unknown task"),
])
def test_bad_task_parameters_are_refused(make, words):
    with pytest.raises(ValueError, match=words):
        make()


# --- the standard-library corpus -----------------------------------------------------------------

@pytest.fixture
def tiny_stdlib(tmp_path):
    root = tmp_path / "lib"
    names = [f"pkg{i // 2}/mod{i}.py" for i in range(40)] + ["top.py"]  # 21 folders
    for i, name in enumerate(names):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(("abc" * 50 + f"# {i}\n").encode())
    for skipped in ("site-packages/x.py", "pkg0/__pycache__/y.py", "dist-packages/z.py"):
        (root / skipped).parent.mkdir(parents=True, exist_ok=True)
        (root / skipped).write_text("skipped = True\n")
    (root / "notes.txt").write_text("not python\n")
    return root, sorted(names)


def test_corpus_split_by_file_is_deterministic_and_disjoint(tiny_stdlib):
    root, names = tiny_stdlib
    assert T.stdlib_files(root) == names  # installed packages, caches and non-.py left out
    data, split, info = T.corpus(root)
    assert sorted(split["train"] + split["validation"]) == names
    assert not set(split["train"]) & set(split["validation"])
    assert split["validation"] == [n for n in names if T.is_validation_file(n)]
    assert split["validation"] and split["train"]
    for part in ("train", "validation"):
        blob = b"".join((root / n).read_bytes() for n in split[part])
        assert bytes(data[part].numpy()) == blob and info[f"{part}_bytes"] == len(blob)
    assert info["files"] == len(names)


def test_corpus_is_split_by_folder_without_generated_files_or_duplicates(tiny_stdlib):
    root, names = tiny_stdlib
    (root / "pkg0" / "copy_of_mod0.py").write_bytes((root / "pkg0" / "mod0.py").read_bytes())
    (root / "pkg1" / "table.py").write_bytes(b'""" Codec generated from CP1252.TXT """\n')
    task_module._corpus.cache_clear()
    data, split, info = T.corpus(root)
    assert info["dropped_generated"] == 1 and info["dropped_duplicates"] == 1
    kept = split["train"] + split["validation"]
    assert "pkg1/table.py" not in kept
    assert "pkg0/copy_of_mod0.py" in kept and "pkg0/mod0.py" not in kept  # the first kept
    groups = {side: {T.split_group(n) for n in split[side]} for side in split}
    assert not groups["train"] & groups["validation"]  # no folder on both sides
    leak = info["leak"]
    assert leak["window_bytes"] == 32 and 0 <= leak["by_folder_deduplicated"] <= 1
    assert leak["by_file_all_files"] > 0.5  # every file repeats "abc": most windows leak


def test_split_groups_and_verbatim_windows():
    assert T.split_group("json/decoder.py") == "json" and T.split_group("os.py") == "os"
    assert T.split_group("test/test_json/test_fail.py") == "test/test_json"
    assert T.split_group("test/test_os.py") == "test/test_os"
    assert T.verbatim_fraction(b"a" * 40, b"xx" + b"a" * 32, window=32, windows=4) == 1.0
    assert T.verbatim_fraction(b"abcd" * 10, b"zzzz" * 10, window=8, windows=5) == 0.0
    assert T.is_generated(b"# Generated by Tools/build; DO NOT EDIT\n")
    assert not T.is_generated(b"import os\n")


def test_stdlib_corpus_is_split_about_one_in_ten():
    data, split, info = T.corpus()
    assert info["files"] > 100 and info["python"]
    assert info["root"] == T.STDLIB_ROOT_LABEL  # named, not this machine's folder
    assert not set(split["train"]) & set(split["validation"])
    assert 0.03 < info["validation_files"] / info["files"] < 0.25
    # Generated files (code-page tables and the like) are dropped, and only they: their share
    # differs between builds (12 % of a Python 3.12 without its test package).
    assert 0 < info["dropped_generated"] < 0.25 * info["files"]
    kept = split["train"] + split["validation"]
    root = T.stdlib_root()
    assert not any(T.is_generated((root / rel).read_bytes()) for rel in kept)
    assert info["leak"]["by_folder_deduplicated"] <= info["leak"]["by_file_all_files"]
    assert info["validation_bytes"] > 100_000
    assert T.corpus() is T.corpus()  # read once per process
    assert split == T.corpus(T.stdlib_root())[1]


def test_char_lm_windows_come_from_their_split(tiny_stdlib):
    root, _ = tiny_stdlib
    task = T.CharLM(20, root=str(root))
    train = bytes(T.corpus(root)[0]["train"].numpy())
    validation = bytes(T.corpus(root)[0]["validation"].numpy())
    inputs, targets = task.batch(8, gen(0))
    for x, y in zip(inputs.tolist(), targets.tolist()):
        assert bytes(x) in train and x[1:] == y[:-1]
    (x, y), = task.held_out(1, 5)
    assert all(bytes(row) in validation for row in x.tolist())


# --- training ------------------------------------------------------------------------------------

def test_learning_rate_schedule():
    cfg = T.TrainConfig(steps=110, warmup_steps=10, min_lr_ratio=0.1)
    assert cfg.lr_factor(0) == pytest.approx(0.1) and cfg.lr_factor(9) == pytest.approx(1.0)
    assert cfg.lr_factor(10) == pytest.approx(1.0)
    assert cfg.lr_factor(60) == pytest.approx(0.55)
    assert cfg.lr_factor(110) == pytest.approx(0.1)
    constant = T.TrainConfig(steps=110, warmup_steps=10, schedule="constant")
    assert constant.lr_factor(100) == 1.0
    with pytest.raises(ValueError, match="schedule"):
        T.TrainConfig(schedule="linear")
    with pytest.raises(ValueError, match="none of"):
        T.TrainConfig(steps=5, timing_warmup_steps=5)


def test_a_wsd_schedule_holds_the_rate_then_decays_over_its_share_of_the_run():
    cfg = T.TrainConfig(steps=100, warmup_steps=10, min_lr_ratio=0.1, schedule="wsd",
                        decay_fraction=0.2)
    assert cfg.latest_decay() == 80 and cfg.decay_end(80) == 100
    assert cfg.lr_factor(0) == pytest.approx(0.1) and cfg.lr_factor(10) == 1.0
    assert cfg.lr_factor(79) == 1.0 and 0.99 < cfg.lr_factor(80) < 1.0
    assert cfg.lr_factor(89) == pytest.approx(0.55)
    assert cfg.lr_factor(99) == pytest.approx(0.1)  # the run's last step takes the lowest
    # a decay started by a plateau at step 40 takes a fifth of the 50-step run it makes
    assert cfg.decay_end(40) == 50
    assert cfg.lr_factor(39, 40) == 1.0 and cfg.lr_factor(44, 40) == pytest.approx(0.55)
    assert cfg.lr_factor(49, 40) == pytest.approx(0.1)
    assert cfg.decay_end(79) == 99 and cfg.decay_end(1) == 2  # never past steps, at least one
    short = T.TrainConfig(steps=5, warmup_steps=0, timing_warmup_steps=1, schedule="wsd")
    assert [short.lr_factor(s) for s in range(5)] == [1.0, 1.0, 1.0, 1.0, pytest.approx(0.1)]
    with pytest.raises(ValueError, match="plateau_from starts a 'wsd' schedule"):
        T.TrainConfig(plateau_from=10)
    with pytest.raises(ValueError, match="decay_fraction"):
        T.TrainConfig(schedule="wsd", decay_fraction=1.0)
    with pytest.raises(ValueError, match="before its 9 warm-up steps end"):
        T.TrainConfig(steps=10, warmup_steps=9, schedule="wsd")


def lm_study(root, mixers=("attention", "samu"), steps=60, **kw):
    return T.study_from_parameters(
        mixers, [0], 32, 1, 2, {"lm": {"lengths": [24], "root": str(root)}}, steps, 8, 1e-2,
        5, 2, timing_warmup_steps=2, backend=REF, **kw)


@pytest.mark.parametrize("mixer", ["attention", "samu"])
def test_a_tiny_run_learns_an_easy_task(tiny_stdlib, mixer):
    """The tiny corpus repeats "abc": the loss falls far below ln 256 within 60 steps."""
    root, _ = tiny_stdlib
    study = lm_study(root, mixers=(mixer,))
    task = study.task_list("lm")[0]
    record = T.run_one(study, "lm", task, mixer, 0, "cpu")
    curve = [loss for _, loss in record["loss_curve"]]
    assert curve[0] > 3.0 and curve[-1] < 0.5 * curve[0], curve
    assert record["value"] < 3.0  # bits per character on the held-out files
    assert record["steps_completed"] == 60 and not record["stopped_by_time"]
    assert record["tokens_per_s"] > 0 and record["timed_steps"] == 58
    assert record["backend"] == (["sdpa"] if mixer == "attention" else [REF])


def test_evaluate_scores_only_the_answer_positions():
    class Constant(torch.nn.Module):  # always says token 3
        def forward(self, tokens):
            out = torch.zeros(*tokens.shape, 10)
            out[..., 3] = 1.0
            return out
    task = T.SelectiveCopy(30, num_tokens=4, data_vocab=4, noise_vocab=4)
    batches = task.held_out(3, 8)
    want = sum(int((y[y != T.IGNORE] == 3).sum()) for _, y in batches) / (3 * 8 * 4)
    scored = T.evaluate(Constant(), task, batches, "cpu")
    assert scored["scored"] == 3 * 8 * 4
    assert scored["value"] == pytest.approx(want) and 0 < want < 1


def test_time_budget_is_shared_by_steps(tiny_stdlib):
    root, _ = tiny_stdlib
    study = lm_study(root, steps=50, time_budget_s=8.0)  # two runs of 50 steps
    assert study.total_steps() == 100
    assert study.train_config("lm").max_seconds == pytest.approx(4.0)
    tight = T.TrainConfig(steps=50, batch_size=4, timing_warmup_steps=1, max_seconds=0.0)
    m = T.model_.build(study.model_config("samu", 256), seed=0)
    trained = T.train(m, study.task_list("lm")[0], tight, 0, "cpu")
    assert trained["stopped_by_time"] and trained["steps_completed"] == 2
    assert trained["loss_curve"][-1][0] == 2


def test_bad_study_is_refused(tiny_stdlib):
    root, _ = tiny_stdlib
    with pytest.raises(ValueError, match="unknown mixers"):
        lm_study(root, mixers=("attention", "lstm"))
    with pytest.raises(ValueError, match="unknown task 'parity'"):
        T.Study(tasks={"parity": {"lengths": [8]}}, train={"parity": T.TrainConfig()})
    with pytest.raises(ValueError, match="no training configuration"):
        T.Study(tasks={"lm": {"lengths": [8]}})
    with pytest.raises(ValueError, match="too short"):
        T.Study(tasks={"mqar": {"lengths": [8], "num_pairs": 4}}, train={"mqar": T.TrainConfig()})


# --- the document --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def doc():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    study = T.study_from_parameters(
        ["attention", "rglru", "samu"], [0, 1], 16, 1, 2,
        {"mqar": {"lengths": [16, 32], "num_pairs": 2, "vocab_size": 16},
         "copy": {"lengths": [16], "num_tokens": 2, "data_vocab": 4, "noise_vocab": 2},
         "lm": {"lengths": [16]}}, 6, 4, 3e-3, 2, 1, timing_warmup_steps=1, log_every=2,
        backend=REF, attention_head_dim=8)
    try:
        records = [r for name in study.tasks for r in T.run_task(study, name, "cpu", bar=False)]
    finally:
        torch.set_num_threads(threads)
    return T.result_document(study, records, "cpu")


def test_document_holds_every_run_and_validates(doc):
    T.validate(doc)
    assert doc["kind"] == "training" and len(doc["runs"]) == 3 * 2 * (2 + 1 + 1)
    keys = {(r["task"], r["mixer"], r["seed"], r["seq_len"]) for r in doc["runs"]}
    assert len(keys) == len(doc["runs"])
    env = doc["environment"]
    assert env["device"] == "cpu" and env["dtype"] == "float32" and env["torch"]
    assert doc["data"]["lm"]["train_files"] > 0  # the corpus the LM task records
    run = doc["runs"][0]
    assert [s for s, _ in run["loss_curve"]] == [2, 4, 6]
    assert run["parameters"] == run["parameter_counts"]["total"]


@pytest.mark.parametrize("breakage", [
    lambda d: d.pop("runs"),
    lambda d: d.update(kind="result"),
    lambda d: d["runs"].clear(),
    lambda d: d["runs"][0].update(mixer="lstm"),
    lambda d: d["runs"][0].pop("tokens_per_s"),
    lambda d: d["runs"][0].update(loss_curve=[[1, 2.0, 3.0]]),
    lambda d: d["runs"][0].update(loss_curve=[[0, 2.0]]),
    lambda d: d["runs"][0].update(value="high"),
    lambda d: d["environment"].pop("dtype"),
])
def test_broken_document_is_refused(doc, breakage):
    bad = copy.deepcopy(doc)
    breakage(bad)
    with pytest.raises(jsonschema.ValidationError):
        T.validate(bad)


def test_non_finite_numbers_are_accepted_as_strings(doc, tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    odd = copy.deepcopy(doc)
    odd["runs"][0]["value"] = math.nan
    odd["runs"][0]["loss_curve"][-1][1] = math.inf
    path = T.write_result(odd, "cpu")
    back = json.loads(path.read_text())
    assert back["runs"][0]["value"] == "nan" and back["runs"][0]["loss_curve"][-1][1] == "inf"
    assert T.frame(back)["value"].isna().sum() == 1


def test_write_is_atomic(doc, tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    path = T.write_result(doc, "cpu")
    assert path == tmp_path / "training" / "cpu.json"
    before = path.read_text()
    assert json.loads(before)["runs"] == json.loads(json.dumps(doc["runs"]))
    bad = copy.deepcopy(doc)
    bad["runs"][0]["seed"] = "zero"
    with pytest.raises(jsonschema.ValidationError):
        T.write_result(bad, "cpu")
    assert path.read_text() == before
    assert [p.name for p in (tmp_path / "training").iterdir()] == ["cpu.json"]  # no temporary


def test_summary_spreads_over_seeds(doc):
    table = T.summary(doc)
    assert len(table) == 3 * 4 and (table["seeds"] == 2).all()
    assert (table["min"] <= table["mean"]).all() and (table["mean"] <= table["max"]).all()


def test_a_one_seed_run_draws_no_spread_and_marks_its_short_curves(doc):
    """One seed: no band, bars or per-seed points, and the titles say so; a loss curve of one
    logged point shows as a marker; no y-label runs into the title."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import PathCollection
    one = copy.deepcopy(doc)
    one["runs"] = [r for r in one["runs"] if r["seed"] == 0]
    for r in one["runs"]:
        if r["task"] == "lm":
            r["loss_curve"] = r["loss_curve"][-1:]
    figs = T.figures(one)
    assert "(one seed)" in figs["loss"].get_suptitle()
    assert "(one seed)" in figs["accuracy"].get_suptitle()
    lm = next(ax for ax in figs["loss"].axes if ax.get_title().startswith(T.TASK_NAMES["lm"]))
    drawn = [line for line in lm.lines if len(line.get_xdata())]
    assert drawn and all(line.get_marker() == "o" for line in drawn)
    quality = figs["quality_speed"]
    assert "one seed each" in quality.get_suptitle() and "each seed" not in quality.get_suptitle()
    assert not any(isinstance(c, PathCollection) for ax in quality.axes for c in ax.collections)
    renderer = FigureCanvasAgg(quality).get_renderer()
    title = quality._suptitle.get_window_extent(renderer)
    for ax in quality.axes:
        assert not ax.yaxis.label.get_window_extent(renderer).overlaps(title), ax.get_ylabel()


def test_figures_are_written_atomically(doc, tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    written = T.draw_figures(doc, "cpu")
    assert [p.name for p in written] == [
        "cpu_training_loss.png", "cpu_training_accuracy.png", "cpu_training_quality_speed.png"]
    # The recall curves' figure only when the document has them.
    assert written == [T.figure_path("cpu", name) for name in T.FIGURE_NAMES
                       if name != "recall_curves"]
    assert sorted(p.name for p in (tmp_path / "figures").iterdir()) == sorted(
        p.name for p in written)
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)


def synthetic(values: dict, sanity_bar: float = 0.0) -> dict:
    """A document of copy runs at one length: values[mixer] = accuracies over seeds (no sanity
    bar unless given)."""
    runs = [{"task": "copy", "mixer": m, "seed": s, "seq_len": 64, "metric": "accuracy",
             "value": v, "chance": 0.1, "eval_loss": 1.0, "final_train_loss": 1.0,
             "tokens_per_s": {"attention": 2e5, "rglru": 1e5, "samu": 4e5}[m],
             "parameters": 1000, "steps": 10, "steps_completed": 10, "stopped_by_time": False,
             "diverged": False, "wall_s": 1.0}
            for m, vs in values.items() for s, v in enumerate(vs)]
    return {"environment": {"gpu": "NVIDIA H200", "device": "cuda", "dtype": "bfloat16"},
            "study": {"tasks": {"copy": {}}, "mixers": list(values), "width": 8, "layers": 1,
                      "train": {"copy": {"steps": 10}}, "sanity_bar": sanity_bar},
            "runs": runs}


def test_conclusion_claims_an_order_only_beyond_the_seed_spread():
    apart = T.conclusion(synthetic({"attention": [0.9, 0.95], "rglru": [0.3, 0.4],
                                    "samu": [0.5, 0.6]}))
    assert "Attention is best, beyond the spread over seeds" in apart
    assert "attention 0.925 (0.900-0.950)" in apart
    assert "RG-LRU 0.50×" in apart and "SAMU 2.00×" in apart
    assert "does not show" in apart and "NVIDIA H200" in apart
    overlap = T.conclusion(synthetic({"attention": [0.5, 0.9], "rglru": [0.3, 0.6],
                                      "samu": [0.1, 0.2]}))
    assert "no ordering is claimed" in overlap and "beyond the spread" not in overlap


def test_conclusion_says_which_runs_ended_before_their_last_step():
    """A task whose runs may end sooner (an early stop, a plateau's decay) gives its steps as
    "up to N", and the runs that did are counted with the steps they took; a run cut by the
    time budget or diverged is said as such, not among them."""
    fixed = T.conclusion(synthetic({"attention": [0.9, 0.95], "rglru": [0.3, 0.4]}))
    assert "copy 10 steps" in fixed and "Ended before" not in fixed
    doc = synthetic({"attention": [0.9, 0.95], "rglru": [0.3, 0.4]})
    doc["study"]["train"]["copy"] = {"steps": 10, "stop_loss": 0.02, "plateau_from": None}
    doc["runs"][0]["steps_completed"] = 4
    doc["runs"][1]["steps_completed"] = 7
    doc["runs"][2].update(steps_completed=6, stopped_by_time=True)
    text = T.conclusion(doc)
    assert "copy up to 10 steps" in text
    assert "**Ended before their last step:** 2 runs" in text and "(steps 4-7)" in text
    assert "**Stopped by the time budget:** 1 runs" in text
    assert T.steps_said({"steps": 30, "plateau_from": 12}) == "up to 30"
    assert T.steps_said({"steps": 30, "stop_loss": None, "plateau_from": None}) == "30"


def test_conclusion_says_whether_recall_got_past_guessing_among_the_values():
    def mqar(values):
        d = synthetic(values)
        for r in d["runs"]:
            r.update(task="mqar", values_baseline=0.125)
        d["study"]["tasks"] = {"mqar": {}}
        d["study"]["train"] = {"mqar": {"steps": 10}}
        return d
    stuck = T.conclusion(mqar({"attention": [0.12, 0.14], "rglru": [0.11, 0.13],
                               "samu": [0.12, 0.12]}))
    assert "none learned to bind keys to values" in stuck
    one = T.conclusion(mqar({"attention": [0.12, 0.95], "rglru": [0.11, 0.13],
                             "samu": [0.12, 0.12]}))
    assert "in at least one seed: attention" in one and "none learned" not in one


def test_conclusion_refuses_to_compare_when_the_yardstick_fails():
    values = {"attention": [0.5, 0.9], "rglru": [0.1, 0.2], "samu": [0.1, 0.2]}
    failed = T.conclusion(synthetic(values, sanity_bar=0.95))
    assert "yardstick failed its sanity bar: no comparison" in failed
    assert "**Training speed** (tokens/s, median per task and length, averaged over them): " \
        "attention 200,000" in failed
    assert "selective copying at L = 64: held-out accuracy 0.700 (bar: at least 0.95; fails)" \
        in failed and "is best" not in failed
    passed = T.conclusion(synthetic(values, sanity_bar=0.6))
    assert "no comparison" not in passed and "Attention is best" in passed
    assert T.sanity(synthetic(values))["bar"] == 0.0
    assert T.sanity(synthetic(values), bar=0.8) == {
        "bar": 0.8, "passed": False, "compared": [], "unjudged": [],
        "checks": {"copy": {"seq_len": 64, "metric": "accuracy", "value": pytest.approx(0.7),
                            "bar": 0.8, "passed": False}}}


def with_lm(values: dict, bits: dict, bar: float | None = 3.5, sanity_bar: float = 0.0):
    """synthetic(values) with character-LM runs beside the copy runs: bits[mixer] = bits per
    character over seeds, each run recording the LM's own sanity bar ``bar``."""
    d = synthetic(values, sanity_bar=sanity_bar)
    lm = [dict(d["runs"][0], task="lm", mixer=m, seed=s, metric="bits_per_char", value=v,
               chance=8.0, yardstick_bar=bar) for m, vs in bits.items() for s, v in enumerate(vs)]
    d["runs"] += lm
    d["study"]["tasks"]["lm"] = {}
    d["study"]["train"]["lm"] = {"steps": 10}
    return d


def test_each_task_is_compared_only_where_attention_passes_its_own_bar():
    recall = {"attention": [0.5, 0.6], "rglru": [0.8, 0.9], "samu": [0.1, 0.2]}
    bits = {"attention": [2.3, 2.2], "rglru": [1.9, 1.95], "samu": [2.0, 2.05]}
    doc = with_lm(recall, bits, bar=3.5, sanity_bar=0.9)
    check = T.sanity(doc)
    assert not check["passed"] and check["compared"] == ["lm"]
    assert check["checks"]["lm"] == {"seq_len": 64, "metric": "bits_per_char",
                                     "value": pytest.approx(2.25), "bar": 3.5, "passed": True}
    text = T.conclusion(doc)
    assert "**No comparison on selective copying:**" in text
    assert "character LM (stdlib source) at L = 64: held-out bits per character 2.250 (bar: " \
        "below 3.500; passes)" in text
    assert "RG-LRU is best, beyond the spread over seeds" in text  # the LM, compared
    assert "Selective copying, L = 64" not in text  # the copy task, not compared
    assert "**Training speed** (tokens/s, median per task and length, averaged over them): " \
        "attention 200,000" in text
    # Attention above the bigram bar: the LM is not compared either; nothing is.
    worse = T.conclusion(with_lm(recall, bits, bar=2.0, sanity_bar=0.9))
    assert "yardstick failed its sanity bar: no comparison" in worse and "is best" not in worse
    # A document whose LM runs record no bar (an earlier study): the LM is not checked, and is
    # compared only when every check passed.
    old = T.sanity(with_lm(recall, bits, bar=None, sanity_bar=0.9))
    assert set(old["checks"]) == {"copy"} and old["compared"] == []
    assert T.sanity(with_lm(recall, bits, bar=None, sanity_bar=0.4))["compared"] == \
        ["copy", "lm"]


def test_training_times_beside_the_losses_are_medians_by_task():
    # A mixer with more runs of a short task must not look faster than the others.
    recall = {"attention": [0.95, 0.96], "rglru": [0.8, 0.9], "samu": [0.1, 0.2]}
    bits = {"attention": [2.3, 2.2], "rglru": [1.9, 1.95], "samu": [2.0, 2.05, 2.1, 2.0, 2.1]}
    doc = with_lm(recall, bits, bar=3.5, sanity_bar=0.9)
    for r in doc["runs"]:
        r["train_wall_s"] = {"copy": 40.0, "lm": 15.0}[r["task"]] + (r["mixer"] == "samu")
    text = T.conclusion(doc)
    assert ("Median training wall time per run at each mixer's best rate (the quality-against-"
            "time figure's axis): selective copying L = 64: attention 40.0 s, RG-LRU 40.0 s, "
            "SAMU 41.0 s; character LM (stdlib source) L = 64: attention 15.0 s, RG-LRU 15.0 s, "
            "SAMU 16.0 s.") in text
    # Speeds likewise: SAMU's three extra LM runs (the cheap task) do not make it look faster.
    for r in doc["runs"]:
        r["gpu_ms_per_step"] = {"copy": 30.0, "lm": 10.0}[r["task"]]
    assert list(T.speed_by_mixer(T.frame(doc), "gpu_ms_per_step")) == [20.0, 20.0, 20.0]
    assert "attention 20.00 ms, RG-LRU 20.00 ms, SAMU 20.00 ms" in T.conclusion(doc)
    # Only the tasks compared: attention failing the copy bar takes the copy times out.
    doc["study"]["sanity_bar"] = 0.99
    assert "axis): character LM (stdlib source) L = 64: attention 15.0 s" in T.conclusion(doc)


def test_a_diverged_seed_is_said_and_claims_no_order():
    recall = {"attention": [0.95, 0.96, 0.97], "rglru": [0.8, 0.9, 0.85], "samu": [0.1, 0.2, 0.3]}
    nan = float("nan")
    bits = {"attention": [2.3, 2.2, 2.25], "rglru": [1.9, 1.95, 1.92], "samu": [1.80, 1.81, nan]}
    doc = with_lm(recall, bits, bar=3.5, sanity_bar=0.9)
    for r in doc["runs"]:
        r["gpu_ms_per_step"] = 2.0
    summary = T.summary(doc).set_index(["task", "mixer"])
    assert (summary.loc[("lm", "samu"), "seeds"], summary.loc[("lm", "samu"), "finite"]) == (3, 2)
    text = T.conclusion(doc)
    assert "SAMU 1.805 (1.800-1.810) bits/char (1 of 3 seeds diverged)" in text
    assert "SAMU has the best mean of its finite seeds, but seeds diverged (SAMU in some): no " \
        "ordering is claimed" in text and "is best, beyond" not in text.split("Character LM")[1]
    # Nor is it ranked beside the figure, nor its score set beside a step's speed.
    assert "character LM (stdlib source) L = 64 (seeds diverged: not ranked)" in text
    assert "behind SAMU" not in text and "SAMU 1.00× attention's step, diverged seeds" in text
    # Every seed diverged: said, and counted as a loss.
    bits["samu"] = [nan, nan, nan]
    text = T.conclusion(with_lm(recall, bits, bar=3.5, sanity_bar=0.9))
    assert "SAMU diverged at every rate" in text and "(SAMU at every rate)" in text
    assert "character LM (stdlib source) L = 64 (diverged at every rate)" in text
    assert "nan" not in text
    # The yardstick with a diverged seed fails its bar.
    bits["attention"] = [2.3, nan, 2.25]
    check = T.sanity(with_lm(recall, bits, bar=3.5, sanity_bar=0.9))
    assert not check["checks"]["lm"]["passed"] and "lm" not in check["compared"]
    assert "held-out bits per character not finite (a seed diverged) (bar: below 3.500; " \
        "fails)" in T.check_text("lm", check["checks"]["lm"])


def test_a_task_attention_did_not_run_is_not_judged_nor_compared():
    # A part of a study may hold no attention runs of a task: nothing says the training works.
    recall = {"attention": [0.95, 0.96], "rglru": [0.8, 0.9], "samu": [0.1, 0.2]}
    bits = {"rglru": [1.9, 1.95], "samu": [2.0, 2.05]}
    doc = with_lm(recall, bits, bar=3.5, sanity_bar=0.9)
    check = T.sanity(doc)
    assert check["unjudged"] == ["lm"] and check["compared"] == ["copy"]
    assert not check["passed"] and check["checks"]["copy"]["passed"]
    assert T.not_compared_note("lm", check) == " (not compared: attention did not run it here)"
    text = T.conclusion(doc)
    assert "**No comparison on character LM (stdlib source):** attention did not run it here" \
        in text and "yardstick failed" not in text
    assert "attention did not run character LM (stdlib source) here: no comparison there" in \
        session_module.sanity_text(doc)
    # And its speeds, with no task every mixer ran, are not set against each other.
    apart = with_lm({"attention": [0.95, 0.96]}, bits, bar=3.5, sanity_bar=0.9)
    speed = T.conclusion(apart)
    assert "not set against each other" in speed and "Relative to attention" not in speed
    assert not T.speed_by_mixer(T.frame(apart), "tokens_per_s").attrs["comparable"]


def test_a_merge_records_the_lm_bar_only_from_the_runs_own_data():
    recall = {"attention": [0.5, 0.6], "rglru": [0.8, 0.9], "samu": [0.1, 0.2]}
    bits = {"attention": [2.3, 2.2], "rglru": [1.9, 1.95], "samu": [2.0, 2.05]}
    doc = with_lm(recall, bits, bar=None, sanity_bar=0.9)
    doc["data"] = {"lm": T.CharLM(16).data_info()}
    said = T.record_missing_bars(doc)
    assert "recorded for 6 runs" in said["lm"] and "checksums match" in said["lm"]
    assert {r.get("yardstick_bar") for r in doc["runs"] if r["task"] == "lm"} == \
        {T.CharLM(16).yardstick_bar}
    assert T.sanity(doc)["compared"] == ["lm"]
    other = with_lm(recall, bits, bar=None, sanity_bar=0.9)
    other["data"] = {"lm": dict(T.CharLM(16).data_info(), train_sha256="0" * 64)}
    assert "not theirs" in T.record_missing_bars(other)["lm"]
    assert all(r.get("yardstick_bar") is None for r in other["runs"])
    # Runs that recorded their bar keep it.
    kept = with_lm(recall, bits, bar=3.0)
    kept["data"] = {"lm": T.CharLM(16).data_info()}
    assert T.record_missing_bars(kept) == {}
    assert {r["yardstick_bar"] for r in kept["runs"] if r["task"] == "lm"} == {3.0}


def test_the_lm_bar_is_a_bigram_model_of_the_corpus():
    # Each byte fixes the next: the only cost is the pseudo-counts, 500 of each pair against
    # 500 + 256 * 0.5 in its row, where one byte alone (unigram) would cost 2 bits.
    cycle = torch.tensor(list(b"abcd") * 500, dtype=torch.uint8)
    assert T.bigram_bits_of(cycle, cycle[:3]) == pytest.approx(-math.log2(500.5 / 628))
    # Against the counts by hand: train "aab", validation "ab"; the pair (a, b) has count 1,
    # the row of a holds 2 pairs, and 256 cells of pseudo-count 0.5 each.
    by_hand = -math.log2((1 + 0.5) / (2 + 256 * 0.5))
    assert T.bigram_bits_of(torch.tensor(list(b"aab"), dtype=torch.uint8),
                            torch.tensor(list(b"ab"), dtype=torch.uint8)) == \
        pytest.approx(by_hand)
    with pytest.raises(ValueError, match="at least two bytes"):
        T.bigram_bits_of(cycle, cycle[:1])
    task = T.CharLM(16)
    assert task.yardstick_bar == T.bigram_bits_of(T.corpus()[0]["train"],
                                                  T.corpus()[0]["validation"])
    assert 1.0 < task.yardstick_bar < task.chance


def swept(means: dict) -> dict:
    """A copy document with two seeds at each learning rate: means[mixer][lr] = accuracy."""
    d = synthetic({m: [0.0] for m in means})
    d["runs"] = [dict(d["runs"][0], mixer=m, lr=lr, seed=seed, value=v)
                 for m, by_lr in means.items() for lr, v in by_lr.items() for seed in (0, 1)]
    return d


def test_a_best_rate_that_ties_the_rate_inside_it_is_not_at_the_edge():
    # Saturated at the lowest two rates: the rate inside does as well, so nothing better can
    # lie below the sweep; beating the rate inside by a hair is an edge.
    d = swept({"attention": {3e-4: 1.0, 1e-3: 1.0, 3e-3: 0.9},
               "samu": {3e-4: 0.91, 1e-3: 0.9, 3e-3: 0.2}})
    choice = T.learning_rate_choice(d).set_index("mixer")
    assert choice.loc["attention", "lr"] == 3e-4 and not choice.loc["attention", "at_edge"]
    assert choice.loc["samu", "lr"] == 3e-4 and choice.loc["samu", "at_edge"]
    assert "at the edge of the sweep" in T.conclusion(d)
    assert "attention 0.0003" not in T.conclusion(d).split("edge of the sweep")[1].split("\n")[0]


def test_each_mixer_is_scored_at_its_best_learning_rate():
    d = swept({"attention": {1e-4: 0.2, 1e-3: 0.9, 1e-2: 0.3},
               "samu": {1e-4: 0.1, 1e-3: 0.2, 1e-2: 0.6}})
    choice = T.learning_rate_choice(d).set_index("mixer")
    assert choice.loc["attention", "lr"] == 1e-3 and not choice.loc["attention", "at_edge"]
    assert choice.loc["samu", "lr"] == 1e-2 and choice.loc["samu", "at_edge"]
    assert choice.loc["samu", "mean_by_lr"] == {1e-4: 0.1, 1e-3: 0.2, 1e-2: 0.6}
    table = T.summary(d).set_index("mixer")
    assert table.loc["attention", "mean"] == pytest.approx(0.9) and table.loc["samu", "lr_at_edge"]
    assert table.loc["attention", "seeds"] == 2  # only the runs at the best rate
    assert len(T.best_frame(d)) == 4 and len(T.frame(d)) == 12  # every run is kept
    text = T.conclusion(d)
    assert "at the edge of the sweep" in text and "SAMU 0.01" in text
    assert "attention 0.900" in text


def test_bits_per_character_pick_the_lowest():
    d = swept({"samu": {1e-3: 2.0, 3e-3: 1.5, 1e-2: 4.0}})
    for r in d["runs"]:
        r.update(task="lm", metric="bits_per_char")
    assert T.learning_rate_choice(d)["lr"].tolist() == [3e-3]


def test_the_committed_h200_study_passes_its_sanity_bar_before_it_compares():
    """The committed H200 document: every run its full steps, attention at the bar on recall
    and copying at the shortest length, so the conclusion compares the mixers."""
    doc = schema.read_valid_json(paths.REPO_ROOT / "data" / "training" / "nvidia-h200.json",
                                 "training")
    assert all(r["steps_completed"] == r["steps"] for r in doc["runs"])
    table = T.summary(doc)
    shortest = table[(table["mixer"] == "attention") & table["task"].isin(["mqar", "copy"])]
    shortest = shortest.loc[shortest.groupby("task")["seq_len"].idxmin()]
    assert len(shortest) == 2 and (shortest["mean"] >= doc["study"]["sanity_bar"]).all()
    text = T.conclusion(doc)
    assert "yardstick failed its sanity bar" not in text and "**Where SAMU loses**" in text
    assert table["mixer_parameters"].notna().all()
    assert {r["mixer"] for r in doc["recall_curves"]} == {"attention", "rglru", "samu"}
    # Its recall curves fail their own bar: attention was not trained at widths 128 and 512 with
    # 4 pairs, the recurrent mixers not at all at the widest width with 4 pairs.
    check = T.recall_sanity(doc)
    assert (check["pairs"], check["seq_len"]) == (4, 256) and not check["yardstick_passed"]
    assert check["checks"]["attention"]["why"] == "not measured at width 128, 512"
    assert check["checks"]["samu"]["why"] == "not measured at width 512"
    assert "Recall curves: attention failed their sanity bar: no comparison" in text


def test_a_small_attention_model_learns_recall_on_a_cpu():
    """The yardstick works: the study's own attention model (width 64, 2 layers, L = 64, 4 pairs
    over 16 tokens) learns MQAR within 400 steps at lr 1e-3 on one CPU thread, as notebook 05
    shows with its CPU defaults (yardstick_run)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        record = T.yardstick_run("cpu")
    finally:
        torch.set_num_threads(threads)
    assert record["value"] >= T.YARDSTICK_BAR, record["value"]
    assert record["model"]["attention_heads"] == 4 and record["steps_completed"] == 400
    assert T.sanity([record], bar=T.YARDSTICK_BAR)["passed"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("mixer", ["attention", "rglru", "samu"])
def test_cuda_graph_steps_train_as_eager_steps(mixer):
    """Replaying one captured step gives the eager loop's losses and weights (the same kernels
    on the same batches, in BF16), with the schedule's learning rate at every step."""
    from samu import model as model_
    task = T.make_task("mqar", 64, num_pairs=4, vocab_size=16)
    study = T.study_from_parameters([mixer], [0], 64, 2, 2, {"mqar": {"lengths": [64],
                                    "num_pairs": 4, "vocab_size": 16}}, 40, 16, 3e-3, 5, 2,
                                    timing_warmup_steps=3)
    trained = {}
    for graphed in (False, True):
        config = dataclasses.replace(study.train["mqar"], cuda_graph=graphed)
        m = model_.build(study.model_config(mixer, task.vocab_size), seed=0, device="cuda")
        record = T.train(m, task, config, 0, "cuda")
        trained[graphed] = ([loss for _, loss in record["loss_curve"]],
                            torch.cat([p.detach().flatten() for p in m.parameters()]))
    (eager, w_eager), (graphed, w_graphed) = trained[False], trained[True]
    assert eager[-1] < eager[0]
    # The H200 gave equal curves to 4-5 digits; a learning rate frozen at its capture-time value
    # (the warm-up's) would move them far more.
    assert max(abs(a - b) / abs(a) for a, b in zip(eager, graphed)) < 1e-3, (eager, graphed)
    assert (w_graphed - w_eager).abs().max() < 1e-2 * w_eager.abs().max()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU's step timing needs CUDA")
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_on_cuda_a_run_stops_early_and_a_plateau_ends_a_wsd_run(cuda_graph):
    """The same stops as on a CPU, with the step's CUDA events in the loop: a loss at the early
    stop's mark stops at the first window, and a flat run ends where its plateau's decay ends."""
    from samu import model as model_
    task = T.make_task("mqar", 16, num_pairs=2, vocab_size=8)
    study = T.study_from_parameters(["attention"], [0], 16, 1, 2, {"mqar": {
        "lengths": [16], "num_pairs": 2, "vocab_size": 8}}, 200, 4, 1e-9, 2, 1,
        timing_warmup_steps=3, log_every=2, attention_head_dim=8, cuda_graph=cuda_graph)
    base = study.train["mqar"]
    for config, steps, early in (
            (dataclasses.replace(base, stop_loss=100.0), 2, True),
            (dataclasses.replace(base, schedule="wsd", plateau_from=40), 50, False)):
        m = model_.build(study.model_config("attention", task.vocab_size), seed=0,
                         device="cuda")
        record = T.train(m, task, config, 0, "cuda")
        assert (record["steps_completed"], record["stopped_early"]) == (steps, early), record
        assert record["gpu_ms_per_step"] > 0 or steps <= base.timing_warmup_steps


def test_conclusion_of_a_real_document_names_its_runs(doc):
    text = T.conclusion(doc)
    assert f"{len(doc['runs'])} runs" in text and "a CPU" in text
    assert "no GPU result" in text
    for name in ("attention", "RG-LRU", "SAMU"):
        assert name in text


# --- make train ----------------------------------------------------------------------------------

@pytest.fixture
def gpu_machine(monkeypatch):
    """This machine as an H200 machine looks to the code (CUDA available, the device an H200);
    nothing here runs on it: the notebook runs are faked."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")


def faked_notebook(doc, slug, calls):
    """A stand-in for pipeline.run_notebook: records its call, logs a run, writes ``doc`` for
    each study it was handed (every configuration when none)."""
    def run_notebook(name, out_dir, parameters, unstored=()):
        calls.append((name, out_dir, dict(parameters), tuple(unstored)))
        with open(parameters["progress_log"], "a") as f:
            f.write("mqar L=16 samu seed 0: accuracy 0.5\n")
        for config in parameters.get("studies") or T.CONFIGURATIONS:
            T.write_result({**doc, "study": {**doc["study"], "configuration": config}}, slug)
        return out_dir / f"{name}.ipynb"
    return run_notebook


def test_main_runs_the_notebook_and_prints_its_progress(doc, data_dir, monkeypatch, capsys):
    """The device is named, so this runs the same on a CPU and on a GPU machine: every
    configuration at the notebook's own CPU sizes, results labelled cpu."""
    calls = []
    monkeypatch.setattr(pipeline, "run_notebook", faked_notebook(doc, "cpu", calls))
    assert T.main(["--device", "cpu"]) == 0
    (name, out_dir, parameters, unstored), = calls
    assert name == "05_training" and out_dir == data_dir / "runs" / "cpu"
    assert parameters["size"] == "cpu" and parameters["device"] == "cpu"
    assert "studies" not in parameters  # the notebook's own defaults
    assert unstored == ("progress_log",)  # a temporary file: not in the stored notebook
    out = capsys.readouterr().out
    assert "mqar L=16 samu seed 0: accuracy 0.5" in out
    for config in T.CONFIGURATIONS:
        assert f"{config}: {len(doc['runs'])} runs" in out
    assert "wrote " in out and str(paths.REPO_ROOT) not in out.replace(str(data_dir), "")


def test_main_on_a_gpu_machine_labels_a_cpu_run_cpu(doc, data_dir, monkeypatch, gpu_machine):
    calls = []
    monkeypatch.setattr(pipeline, "run_notebook", faked_notebook(doc, "cpu", calls))
    assert T.main(["--device", "cpu", "--config", "scale"]) == 0
    (_, out_dir, parameters, _), = calls
    assert out_dir == data_dir / "runs" / "cpu" / "scale" and parameters["size"] == "cpu"
    assert parameters["studies"] == {"scale": T.configuration("scale").parameters("cpu")}


def test_main_on_a_gpu_runs_the_small_study_at_its_gpu_size(doc, data_dir, monkeypatch,
                                                             gpu_machine):
    calls = []
    monkeypatch.setattr(pipeline, "run_notebook", faked_notebook(doc, "nvidia-h200", calls))
    assert T.main(["--time-budget", "60"]) == 0
    (_, out_dir, parameters, _), = calls
    assert out_dir == data_dir / "runs" / "nvidia-h200"
    assert parameters["studies"] == {"small": {**T.GPU_PARAMETERS, "configuration": "small",
                                               "time_budget_s": 60.0}}
    assert parameters["size"] == "gpu" and parameters["device"] == "cuda"


def test_a_cpu_size_on_a_gpu_is_labelled_apart_from_that_gpu_study(doc, data_dir, monkeypatch,
                                                                   gpu_machine):
    """--defaults on a GPU: the executed notebook and the results carry '-cpu-size', so that
    the quick defaults never overwrite the GPU's study."""
    assert T.results_label("cuda", "gpu") == "nvidia-h200"
    assert T.results_label("cuda", "cpu") == "nvidia-h200-cpu-size"
    assert T.results_label("cpu", "cpu") == T.results_label("cpu", "gpu") == "cpu"
    calls = []
    monkeypatch.setattr(pipeline, "run_notebook",
                        faked_notebook(doc, "nvidia-h200-cpu-size", calls))
    assert T.main(["--defaults", "--config", "scale"]) == 0
    (_, out_dir, parameters, _), = calls
    assert out_dir == data_dir / "runs" / "nvidia-h200-cpu-size" / "scale"
    assert parameters["size"] == "cpu" and parameters["device"] == "cuda"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    run = T.StudyRun("scale", "cpu", "cuda", write=False)
    assert run.slug == "nvidia-h200-cpu-size"


def test_notebook_05_runs_a_cpus_size_by_default_on_a_gpu(monkeypatch, gpu_machine):
    """What nbval runs on a GPU machine: the notebook's parameters as committed, which train at
    a CPU's size there too (a GPU's size is make train's, minutes to an hour)."""
    from tests.test_mixers import run_notebook
    namespace = run_notebook("05_training", code_cells=2, device="cuda")
    assert namespace["size"] == "cpu" and namespace["device"] == "cuda"


def test_main_reports_a_failed_notebook(data_dir, monkeypatch, capsys):
    def failing(name, out_dir, parameters, unstored=()):
        raise RuntimeError("cell 5 failed")

    monkeypatch.setattr(pipeline, "run_notebook", failing)
    assert T.main(["--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "train FAILED" in err
    assert str(data_dir / "runs" / "cpu" / "05_training.failed.ipynb") in err


def test_main_refuses_a_device_this_machine_lacks(data_dir, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(SystemExit):
        T.main(["--device", "cuda"])
    assert "no CUDA device" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        T.main(["--device", "tpu"])
    assert "cpu, cuda or cuda:<index>, got 'tpu'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        T.main(["--device", "cpu", "--config", "huge"])
    assert "unknown configuration 'huge'" in capsys.readouterr().err


# --- the parameters of the studies ---------------------------------------------------------------

# Every configuration's parameters at both sizes: what `make train` and notebook 05 run.
SETS = {f"{name} {size}": config.parameters(size) for name, config in T.CONFIGURATIONS.items()
        for size in T.SIZES}
GPU_SET = SETS["small gpu"]
CPU_SET = SETS["small cpu"]


def numeric_leaves(value, name=""):
    """(name, value) of every number in a parameter value, named as the checks name them:
    ``tasks['mqar']['lengths'][0]``."""
    if isinstance(value, dict):
        for key, v in value.items():
            yield from numeric_leaves(v, f"{name}[{key!r}]" if name else key)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from numeric_leaves(v, f"{name}[{i}]")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield name, value


def with_leaf(parameters: dict, name: str, value) -> dict:
    """A deep copy of ``parameters`` with the number called ``name`` replaced by ``value``."""
    import ast

    out = copy.deepcopy(parameters)
    keys = [re.match(r"\w+", name).group()] + [
        ast.literal_eval(k) for k in re.findall(r"\[([^\]]+)\]", name)]
    node = out
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    return out


# Every number of the configurations' parameters, each with the first set that holds it.
LEAVES = list({n: (source, n) for source, parameters in reversed(SETS.items())
               for n, _ in numeric_leaves(parameters)}.values())


def test_every_numeric_parameter_has_a_range():
    tops = {name.split("[")[0] for _, name in LEAVES}
    assert tops <= set(T.PARAMETER_RANGES) | {"tasks"}, tops - set(T.PARAMETER_RANGES)
    options = {name.split("]")[1].strip("[']") for _, name in LEAVES
               if name.startswith("tasks[") and "['lengths']" not in name}
    assert options <= {o for spec in T.TASKS.values() for o in spec.options}, options
    curves = {name.split("]")[0].split("[")[1].strip("'") for _, name in LEAVES
              if name.startswith("recall_curves[")}
    assert curves <= set(T.RECALL_CURVE_KEYS) | set(T.RECALL_CURVE_OPTIONAL), curves
    assert len(LEAVES) > 50  # the walk found the nested ones too


def test_the_parameters_of_every_configuration_are_in_range():
    for parameters in SETS.values():
        study = T.check_parameters(parameters, known=T.STUDY_PARAMETERS)
        assert study.tasks == parameters["tasks"]
        assert study.configuration == parameters["configuration"]


@pytest.mark.parametrize("bad", [math.nan, -1, "1"], ids=["nan", "negative", "a string"])
@pytest.mark.parametrize("source, name", LEAVES, ids=[f"{s} {n}" for s, n in LEAVES])
def test_each_numeric_parameter_is_checked(source, name, bad):
    with pytest.raises(T.ParameterError) as caught:
        T.check_parameters(with_leaf(SETS[source], name, bad))
    message = str(caught.value)
    assert message.startswith(f"{name} must be "), message
    assert message.endswith(f"got {bad!r}"), message


@pytest.mark.parametrize("name, value, words", [
    ("time_budget_s", math.nan, "a finite number > 0, or None"),
    ("time_budget_s", math.inf, "a finite number > 0, or None"),
    ("time_budget_s", -5, "got -5"),
    ("time_budget_s", 0, "got 0"),
    ("time_budget_s", "330", "got '330'"),
    ("lr", math.inf, "a finite number > 0"),
    ("lr", 0.0, "a finite number > 0"),
    ("lr", None, "got None"),
    ("width", 0, "an integer >= 1"),
    ("width", "32", "got '32'"),
    ("width", 32.0, "got 32.0"),
    ("layers", True, "got True"),
    ("steps", 0, "an integer >= 1"),
    ("steps", 2.5, "got 2.5"),
    ("steps", {"mqar": 10}, "no value for the tasks ['copy', 'lm']"),
    ("steps['copy']", -3, "got -3"),
    ("batch_size", 0, "an integer >= 1"),
    ("eval_batches", 0, "an integer >= 1"),
    ("log_every", 0, "an integer >= 1"),
    ("warmup_steps", -1, "an integer >= 0"),
    ("timing_warmup_steps", math.nan, "an integer >= 0"),
    ("cpu_threads", -1, "an integer >= 0, or None"),
    ("seeds", [], "a non-empty list"),
    ("seeds", "0,1", "a non-empty list"),
    ("seeds", [0, 0], "must not repeat"),
    ("seeds[0]", -1, "an integer >= 0"),
    ("seeds[1]", 1.5, "got 1.5"),
    ("tasks['mqar']['lengths']", [], "a non-empty list"),
    ("tasks['lm']['lengths'][0]", 0, "an integer >= 1"),
    ("tasks['mqar']['power_a']", 0.0, "in (0, 1], or None"),
    ("tasks['mqar']['power_a']", math.nan, "got nan"),
    ("tasks['mqar']['num_pairs']", 0, "an integer >= 1"),
])
def test_out_of_range_parameters_name_themselves(name, value, words):
    parameters = copy.deepcopy(GPU_SET)
    if name == "tasks['mqar']['power_a']":
        parameters["tasks"]["mqar"]["power_a"] = 0.01
    with pytest.raises(T.ParameterError) as caught:
        T.check_parameters(with_leaf(parameters, name, value))
    message = str(caught.value)
    assert message.startswith(name.split("[")[0]) and name in message, message
    assert words in message, message


@pytest.mark.parametrize("name, value", [("seeds[0]", 0), ("warmup_steps", 0),
                                         ("timing_warmup_steps", 0), ("cpu_threads", 0),
                                         ("cpu_threads", None), ("time_budget_s", None),
                                         ("lr", 1), ("time_budget_s", 0.5)])
def test_zero_none_and_integers_where_they_are_allowed(name, value):
    T.check_parameters(with_leaf(GPU_SET, name, value))


def test_what_depends_on_several_parameters_is_checked_too():
    with pytest.raises(T.ParameterError, match="leaves none of 5 steps"):
        T.check_parameters({**CPU_SET, "steps": 5, "timing_warmup_steps": 5})
    with pytest.raises(T.ParameterError, match="too short"):
        T.check_parameters(with_leaf(CPU_SET, "tasks['mqar']['lengths'][0]", 8))
    with pytest.raises(T.ParameterError, match=r"unknown parameters \['widht'\]"):
        T.check_parameters({**CPU_SET, "widht": 32}, known=T.STUDY_PARAMETERS)
    with pytest.raises(T.ParameterError, match=r"learning_rates by mixer must name every mixer"):
        T.check_parameters({**SETS["scale cpu"], "lr": {"attention": [1e-3]}})


TRAIN_FIELDS = [f.name for f in dataclasses.fields(T.TrainConfig) if f.name != "schedule"]


@pytest.mark.parametrize("field", TRAIN_FIELDS)
def test_each_training_configuration_field_is_checked(field):
    bad = (math.nan, 0.95) if field == "betas" else math.nan
    with pytest.raises(T.ParameterError, match=rf"train: {field}(\[0\])? must be .*got nan"):
        T.TrainConfig(**{field: bad})


@pytest.mark.parametrize("field, value, words", [
    ("lr", math.inf, "lr must be a finite number > 0, got inf"),
    ("grad_clip", 0.0, "grad_clip must be a finite number > 0, got 0.0"),
    ("min_lr_ratio", 1.5, "min_lr_ratio must be a finite number in [0, 1], got 1.5"),
    ("weight_decay", -0.1, "weight_decay must be a finite number >= 0, got -0.1"),
    ("betas", (0.9, 1.0), "betas[1] must be a finite number in [0, 1), got 1.0"),
    ("betas", 0.9, "betas must be two numbers in [0, 1), got 0.9"),
    ("max_seconds", -1.0, "max_seconds must be a finite number >= 0, or None, got -1.0"),
    ("steps", "100", "steps must be an integer >= 1, got '100'"),
])
def test_training_configuration_ranges(field, value, words):
    with pytest.raises(T.ParameterError) as caught:
        T.TrainConfig(**{field: value})
    assert str(caught.value) == f"train: {words}"


STUDY_FIELDS = ["seeds", "width", "layers", "mlp_expansion", "time_budget_s"]


@pytest.mark.parametrize("field", STUDY_FIELDS)
def test_each_numeric_study_field_is_checked(field):
    bad = (0, math.nan) if field == "seeds" else math.nan
    # The study is where time_budget_s is checked, so it names it as the parameter it is.
    with pytest.raises(T.ParameterError,
                       match=rf"^(study: )?{field}(\[1\])? must be .*got nan"):
        T.Study(**{field: bad})


def test_a_negative_time_budget_is_refused_not_a_stop_after_one_step(tiny_stdlib):
    root, _ = tiny_stdlib
    for budget in (-5, 0, math.nan, math.inf):
        with pytest.raises(T.ParameterError, match="time_budget_s must be a finite number > 0"):
            lm_study(root, time_budget_s=budget)


@pytest.mark.parametrize("budget, words", [
    ("nan", "got nan"), ("inf", "got inf"), ("-inf", "got -inf"), ("-5", "got -5.0"),
    ("0", "got 0.0"), ("ten", "invalid float value: 'ten'"), ("", "invalid float value: ''")])
def test_time_budget_flag_is_checked_before_anything_runs(budget, words, data_dir, monkeypatch,
                                                          capsys):
    calls = []
    monkeypatch.setattr(pipeline, "run_notebook", lambda *a, **k: calls.append(a))
    with pytest.raises(SystemExit) as caught:
        T.main(["--device", "cpu", f"--time-budget={budget}"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "time-budget" in err or "time_budget_s must be a finite number > 0" in err, err
    assert words in err, err
    assert not calls and not list(data_dir.iterdir())


def test_main_checks_the_gpu_parameters_before_anything_runs(data_dir, monkeypatch, capsys,
                                                             gpu_machine):
    calls = []
    monkeypatch.setattr(pipeline, "run_notebook", lambda *a, **k: calls.append(a))
    for name, value in (("lr[1]", math.nan), ("steps['mqar']", 0), ("seeds[2]", -1)):
        small = T.configuration("small")
        table = {"small": dataclasses.replace(small, gpu=with_leaf(small.gpu, name, value))}
        with pytest.raises(SystemExit):
            T.main([], configurations=table)
        assert f"{name} must be" in capsys.readouterr().err
    assert not calls and not list(data_dir.iterdir())


def test_the_small_gpu_study_is_the_one_that_ran():
    study = T.check_parameters(GPU_SET, known=T.STUDY_PARAMETERS)
    assert len(study.seeds) == 3 and study.mixers == T.model_.mixer_names()
    assert sorted(study.tasks) == ["copy", "lm", "mqar"]
    assert study.width == 256 and len(study.learning_rates) >= 3
    assert study.time_budget_s is None and study.sanity_bar == 0.95  # fixed steps, no time cap
    assert study.recurrent_block == "griffin" and study.attention_heads == "standard"
    assert study.model_config("attention", 64).resolved_attention_heads == 256 // 64
    assert study.recall_curves is None  # now the recall configuration's
    for name in study.tasks:
        assert {lr for _, _, lr, _ in study.runs(name)} == set(study.learning_rates)
        assert study.train_config(name).max_seconds is None
    committed = schema.read_valid_json(paths.REPO_ROOT / "data" / "training" / "nvidia-h200.json",
                                       "training")["study"]
    described = json.loads(json.dumps(study.describe()))
    for key in ("seeds", "width", "layers", "tasks", "learning_rates", "lr_search",
                "sanity_bar", "recurrent_block", "attention_head_dim"):
        assert described[key] == committed[key], key
    for name, config in committed["train"].items():  # the fields added since take no effect
        assert {k: described["train"][name][k] for k in config} == config
        assert described["train"][name]["stop_loss"] is None
        assert described["train"][name]["attention_kernel"] is None


def recall_study(**curves):
    spec = {"points": [[16, 2], [32, 4]], "widths": [8, 16], "vocab_size": 16, "steps": 12,
            "batch_size": 8, "bar": 0.5, "attention_from_width": 16, **curves}
    return T.study_from_parameters(
        ["attention", "samu"], [0, 1], 16, 1, 2, {}, {}, {}, [1e-3, 1e-2], 2, 1,
        timing_warmup_steps=1, log_every=2, attention_head_dim=8, backend=REF,
        recall_curves=spec, configuration="recall")


def test_recall_curves_train_every_point_at_every_rate_and_draw(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    study = recall_study()
    jobs = study.recall_jobs()
    assert len(jobs) == study.planned_recall_runs() == 2 * 2 * 2 * 2  # points, widths, mixers, rates
    assert [(j.task.seq_len, j.task.num_pairs) for j in jobs[:8]] == [(16, 2)] * 8  # bar first
    curves = T.run_recall_curves(study, "cpu", bar=False)
    assert {(r["seq_len"], r["pairs"], r["width"]) for r in curves} == {
        (16, 2, 8), (16, 2, 16), (32, 4, 8), (32, 4, 16)}
    assert all(r["steps"] == 12 and r["task_options"]["vocab_size"] == 16
               and r["batch_size"] == 8 and r["lr_sweep"] == [1e-3, 1e-2] for r in curves)
    doc = T.result_document(study, [], "cpu", recall_curves=curves)
    T.validate(doc)  # the recall curves alone
    assert doc["study"]["recall_train"]["steps"] == 12
    table = T.recall_curve_frame(doc)
    assert len(table) == 2 * 2 * 2 and table["at_edge"].dtype == bool
    assert (table["rates"] == 2).all()
    text = T.conclusion(doc)
    assert "**Recall curves** (16 runs; MQAR, vocabulary 16" in text
    written = T.draw_figures(doc, "cpu")
    assert written == [T.figure_path("cpu", "recall_curves", "recall")]
    assert written[0].name == "cpu_training_recall_recall_curves.png"


def test_first_point_search_sweeps_the_first_point_then_runs_the_rest_at_its_best():
    study = recall_study(lr_search="first_point")
    assert study.planned_recall_runs() == 4 * (2 + 1)  # groups, rates at the first point + one
    curves = T.run_recall_curves(study, "cpu", bar=False)
    for mixer, width in study.recall_groups():
        mine = [r for r in curves if (r["mixer"], r["width"]) == (mixer, width)]
        first = [r for r in mine if r["pairs"] == 2]
        assert sorted(r["lr"] for r in first) == mine[0]["lr_sweep"]
        assert set(mine[0]["lr_sweep"]) >= {1e-3, 1e-2}
        (other,) = [r for r in mine if r["pairs"] == 4]
        assert other["lr"] == T.best_rate(first)


def test_a_refined_first_point_search_adds_the_midpoints_around_each_best_and_uses_them():
    plain = T.run_recall_curves(recall_study(lr_search="first_point"), "cpu", bar=False)
    study = recall_study(lr_search="first_point", lr_refine=1)
    curves = T.run_recall_curves(study, "cpu", bar=False)
    refined = 0
    for mixer, width in study.recall_groups():
        def first(records):
            return [r for r in records if (r["mixer"], r["width"], r["pairs"]) ==
                    (mixer, width, 2)]
        swept = first(plain)[0]["lr_sweep"]
        added = T.refined_rates(swept, first(plain))
        refined += len(added)
        assert first(curves)[0]["lr_sweep"] == sorted(swept + added)
        assert sorted(r["lr"] for r in first(curves)) == sorted(swept + added)  # each once
        (other,) = [r for r in curves if (r["mixer"], r["width"], r["pairs"]) ==
                    (mixer, width, 4)]
        assert other["lr"] == T.best_rate(first(curves))  # refinements counted
    assert refined  # some group had a best that beat a neighbour


@pytest.mark.parametrize("values, want", [
    ((0.2, 0.9, 0.5, 0.1), [1.73e-3, 5.2e-3]),  # inside: a midpoint on each side
    ((0.9, 0.5, 0.2, 0.1), [1.73e-3]),  # at an edge: only the side it has
    ((0.2, 0.9, 0.9, 0.1), [1.73e-3]),  # a tie with a neighbour: nothing between them
    ((0.2, 0.9, math.nan, 0.1), [1.73e-3, 5.2e-3]),  # a diverged neighbour: still refined
    ((math.nan,) * 4, []),  # nothing finite: nothing to refine
])
def test_refinement_adds_the_geometric_midpoints_between_the_best_and_what_it_beats(values,
                                                                                    want):
    rates = [1e-3, 3e-3, 9e-3, 2.7e-2]
    got = T.refined_rates(rates, [_fake_record(r, v) for r, v in zip(rates, values)])
    assert got == want
    if got:  # a better midpoint refines again, about itself
        again = T.refined_rates(rates + got, [_fake_record(r, v) for r, v in zip(
            rates + got, values + (0.95,) + (0.5,) * (len(got) - 1))])
        assert again and all(min(rates + got) < r < max(rates + got) for r in again)
        assert got[0] not in again
    bits = [_fake_record(r, v, "bits_per_char") for r, v in zip(rates, (3.0, 1.0, 2.0, 4.0))]
    assert T.refined_rates(rates, bits) == [1.73e-3, 5.2e-3]  # the lowest bits are the best


def test_the_recall_curves_train_on_their_own_schedule():
    study = recall_study(schedule="wsd", plateau_from=6)
    config = study.recall_config(1e-3)
    assert (config.schedule, config.plateau_from, config.steps) == ("wsd", 6, 12)
    assert recall_study().recall_config().schedule == "cosine"
    base = {"points": [[16, 2]], "widths": [8], "vocab_size": 16, "steps": 12}
    with pytest.raises(T.ParameterError, match="schedule'\\] must be one of"):
        T.check_parameter_ranges({"recall_curves": {**base, "schedule": "linear"}})
    with pytest.raises(T.ParameterError, match="plateau_from'\\] starts a 'wsd'"):
        T.check_parameter_ranges({"recall_curves": {**base, "plateau_from": 4}})


def test_a_wsd_point_is_judged_still_learning_on_its_curve_before_the_decay():
    flat_then_falling = [[10 * i, 2.0] for i in range(1, 41)] + [[400 + 10 * i, 2.0 - 0.1 * i]
                                                                   for i in range(1, 11)]
    record = {"seq_len": 16, "pairs": 2, "width": 8, "mixer": "samu", "lr": 1e-3, "seed": 0,
              "value": 0.5, "steps_completed": 500, "loss_curve": flat_then_falling}
    assert T.recall_curve_frame([record])["still_learning"].tolist() == [True]
    decayed = {**record, "decay_from": 400}  # the fall is the decay's: it had converged
    assert T.recall_curve_frame([decayed])["still_learning"].tolist() == [False]


def test_refinement_is_refused_where_every_point_runs_every_rate():
    base = {"points": [[16, 2]], "widths": [8], "vocab_size": 16, "steps": 12}
    with pytest.raises(T.ParameterError, match="lr_refine'\\] refines a first_point sweep"):
        T.check_parameter_ranges({"recall_curves": {**base, "lr_refine": 1}})
    with pytest.raises(T.ParameterError, match="lr_refine"):
        T.check_parameter_ranges({"recall_curves": {**base, "lr_search": "first_point",
                                                    "lr_refine": -1}})
    T.check_parameter_ranges({"recall_curves": {**base, "lr_refine": 0}})


def synthetic_curves(accuracy) -> dict:
    """A recall-curve document: accuracy(mixer, pairs, width), one rate."""
    base = {"task": "mqar", "seed": 0, "metric": "accuracy", "lr": 1e-3, "steps": 10,
            "steps_completed": 10, "loss_curve": [[10, 1.0]]}
    records = [{**base, "mixer": m, "seq_len": 16 * p, "pairs": p, "width": w,
                "value": accuracy(m, p, w)}
               for m in ("attention", "rglru", "samu") for p in (4, 8) for w in (64, 128, 256)]
    return {"environment": {"gpu": "NVIDIA H200", "device": "cuda", "dtype": "bfloat16"},
            "study": {"recall_curves": {"bar": 0.9}, "sanity_bar": 0.95}, "runs": [],
            "recall_curves": records}


def test_the_recall_curves_compare_only_the_mixers_that_pass_their_bar_and_show_the_rest():
    def solved(m, p, w):  # attention from width 128, SAMU at the widest, RG-LRU never
        return {"attention": 1.0 if w >= 128 else 0.5, "samu": 0.95 if w == 256 else 0.3,
                "rglru": 0.3}[m] if p == 4 else 0.2
    check = T.recall_sanity(synthetic_curves(solved))
    assert check["bar"] == 0.9 and (check["pairs"], check["seq_len"]) == (4, 64)
    assert check["checks"]["attention"] == {"widths": [128, 256],
                                            "accuracy": {128: 1.0, 256: 1.0},
                                            "passed": True, "why": "1.00, 1.00 at widths 128, 256"}
    assert check["checks"]["samu"]["why"] == "0.95 at width 256"
    assert check["checks"]["samu"]["passed"] and not check["checks"]["rglru"]["passed"]
    assert check["checks"]["rglru"]["why"] == "below the bar at width 256 (0.30)"
    assert T.compared_mixers(check) == ["attention", "samu"]
    text = T.conclusion(synthetic_curves(solved))
    assert "RG-LRU fails (below the bar at width 256 (0.30))" in text
    assert "SAMU passes (0.95 at width 256)" in text
    assert "SAMU (widths 64, 128, 256): L = 64, 4 pairs: 0.30, 0.30, 0.95" in text
    assert ("RG-LRU, below its bar: what it learned in these steps, not compared (widths 64, "
            "128, 256): L = 64, 4 pairs: 0.30, 0.30, 0.30") in text
    failed = T.recall_sanity(synthetic_curves(lambda m, p, w: 0.5 if m == "attention" else 1.0))
    assert not failed["yardstick_passed"] and T.compared_mixers(failed) == []
    assert "no comparison" in T.conclusion(synthetic_curves(lambda m, p, w: 0.5))
    styles = {line.get_label(): line.get_linestyle()
              for line in T.recall_curves_figure(synthetic_curves(solved)).axes[0].get_lines()
              if not line.get_label().startswith("_")}
    assert styles == {"attention": "-", "SAMU": "-", "RG-LRU (below its bar)": "--"}
    nothing = T.recall_curves_figure(synthetic_curves(lambda m, p, w: 0.5)).axes[0]
    assert not [line for line in nothing.get_lines() if not line.get_label().startswith("_")]


def test_a_run_still_learning_is_flagged():
    falling = [[i, 2.0 - 0.1 * i] for i in range(1, 16)]
    assert T.still_learning(falling)
    point = {"task": "mqar", "seed": 0, "metric": "accuracy", "lr": 1e-3, "steps": 40,
             "steps_completed": 30, "loss_curve": falling, "mixer": "samu", "seq_len": 64,
             "pairs": 4, "width": 64, "value": 1.0}
    assert T.recall_curve_frame([point])["still_learning"].item()
    solved = T.recall_curve_frame([{**point, "stopped_early": True}])  # at the stop loss
    assert not solved["still_learning"].item()
    assert not T.still_learning([[i, 1.0] for i in range(1, 16)])
    assert not T.still_learning(falling[:5])  # too few points to say


def test_bad_recall_curves_are_refused():
    base = dict(SETS["recall gpu"]["recall_curves"])
    recall = SETS["recall gpu"]
    with pytest.raises(T.ParameterError, match="recall_curves must be None or a dict"):
        T.check_parameter_ranges({"recall_curves": {"pairs": [4]}})
    with pytest.raises(T.ParameterError,
                       match=re.escape("recall_curves['points'][1][1] must be")):
        T.check_parameter_ranges({"recall_curves": {**base, "points": [[64, 4], [128, 0]]}})
    with pytest.raises(T.ParameterError, match="too short"):  # 16 pairs need L >= 64
        T.check_parameters({**recall, "recall_curves": {**base, "points": [[32, 16]]}})
    with pytest.raises(T.ParameterError, match=re.escape("recall_curves['lr'][0] must be")):
        T.check_parameter_ranges({"recall_curves": {**base, "lr": [0.0]}})
    with pytest.raises(T.ParameterError, match="must not repeat a point"):
        T.check_parameter_ranges({"recall_curves": {**base, "points": [[64, 4], [64, 4]]}})
    with pytest.raises(T.ParameterError, match="lr_search'\\] must be one of"):
        T.check_parameter_ranges({"recall_curves": {**base, "lr_search": "grid"}})
    with pytest.raises(T.ParameterError, match="optionally"):
        T.check_parameter_ranges({"recall_curves": {**base, "rates": [1e-3]}})


def test_recall_curves_take_their_own_learning_rates():
    recall = SETS["recall gpu"]
    spec = {**recall["recall_curves"], "lr": [1e-3, 3e-3]}
    study = T.check_parameters({**recall, "recall_curves": spec})
    assert {job.lr for job in study.recall_jobs()} == {1e-3, 3e-3}
    without = {k: v for k, v in spec.items() if k != "lr"}
    study = T.check_parameters({**recall, "recall_curves": without, "lr": [2e-3, 5e-3]})
    assert {job.lr for job in study.recall_jobs()} == {2e-3, 5e-3}
    by_mixer = {m: [1e-3 * (i + 1)] for i, m in enumerate(study.mixers)}
    study = T.check_parameters({**recall, "recall_curves": {**without, "lr": by_mixer}})
    assert {(job.mixer, job.lr) for job in study.recall_jobs()} == {
        (m, r[0]) for m, r in by_mixer.items()}


def test_parts_cover_the_study_once_and_merge(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    args = (["attention", "samu"], [0, 1], 16, 1, 2,
            {"mqar": {"lengths": [32], "num_pairs": 2, "vocab_size": 16},
             "copy": {"lengths": [16], "num_tokens": 2, "data_vocab": 4, "noise_vocab": 2}},
            3, 4, [1e-3, 3e-3], 1, 1)
    kw = dict(timing_warmup_steps=1, log_every=2, attention_head_dim=8, backend=REF)

    def keys(study):
        return [(n, t.seq_len, m, lr, s) for n in study.tasks for t, m, lr, s in study.runs(n)]
    whole = keys(T.study_from_parameters(*args, **kw))
    parts = [T.study_from_parameters(*args, part=f"{k}/3", **kw) for k in (1, 2, 3)]
    assert sorted(k for p in parts for k in keys(p)) == sorted(whole)
    assert [len(keys(p)) for p in parts] == [6, 5, 5]
    first = None
    for study in parts:
        records = [r for n in study.tasks for r in T.run_task(study, n, "cpu", bar=False)]
        first = first or T.result_document(study, records, "cpu")
        written = T.write_part(T.result_document(study, records, "cpu"), "cpu")
        assert written == tmp_path / "training" / f"cpu.part-{study.part[0]}-of-3.json"
        merged = T.merge_parts("cpu", study.part)
        assert (merged is None) == (study.part != "3/3")
    assert len(merged["runs"]) == len(whole) and merged["study"]["part"] is None
    assert [p["part"] for p in merged["parts"]] == ["1/3", "2/3", "3/3"]
    assert T.schema.read_valid_json(T.result_path("cpu"), "training")["parts"]
    other = T.study_from_parameters(*args, part="1/3", **{**kw, "log_every": 3})
    records = [r for n in other.tasks for r in T.run_task(other, n, "cpu", bar=False)]
    T.write_part(T.result_document(other, records, "cpu"), "cpu")
    with pytest.raises(ValueError, match="its study differs"):
        T.merge_parts("cpu", "3/3")
    # A part that trained on other bytes (its corpus's checksums differ) is not merged.
    T.write_part(dict(first, data={"lm": {"train_sha256": "0" * 64}}), "cpu")
    with pytest.raises(ValueError, match="trained on other data"):
        T.merge_parts("cpu", "3/3")
    # Nor one from another GPU: a part often holds one mixer's runs, whose speed it would set
    # against another device's.
    T.write_part(dict(first, environment=dict(first["environment"], gpu="NVIDIA H100")), "cpu")
    with pytest.raises(ValueError, match="ran on cpu, .* on NVIDIA H100; not merged"):
        T.merge_parts("cpu", "3/3")
    for bad in ("0/3", "4/3", "x", "1/0"):
        with pytest.raises(T.ParameterError, match="part must be"):
            T.study_from_parameters(*args, part=bad, **kw)


def test_main_passes_the_part_and_checks_it(doc, data_dir, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(pipeline, "run_notebook", faked_notebook(doc, "cpu", calls))
    assert T.main(["--device", "cpu", "--config", "small", "--part", "2"]) == 0
    assert calls[0][2]["part"] == "2/3"  # of the configuration's own parts
    assert T.main(["--device", "cpu", "--config", "scale", "--part", "1/4"]) == 0
    assert calls[1][2]["part"] == "1/4"
    assert [c[1] for c in calls] == [paths.runs_dir("cpu") / "part-2-of-3",  # small: unnamed
                                     paths.runs_dir("cpu") / "scale" / "part-1-of-4"]
    # One part, one spelling: "01" was recorded as "01/3", which its file's name (part-1-of-3)
    # and the merge then disowned after the part had trained.
    for other_spelling in ("02", "2/03", "+2/3", " 2/3", "1_0/12", "\uff12/3"):
        with pytest.raises(SystemExit):
            T.main(["--device", "cpu", "--config", "small", "--part", other_spelling])
        assert "--part: part must be" in capsys.readouterr().err
    assert len(calls) == 2
    for bad in ("4/3", "0/3", "x"):
        with pytest.raises(SystemExit):
            T.main(["--device", "cpu", "--config", "small", "--part", bad])
        assert "--part: part must be" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        T.main(["--device", "cpu", "--part", "1"])
    assert "--part: name one configuration" in capsys.readouterr().err


def test_devices_all_without_a_cuda_device_says_so(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(SystemExit):
        T.main(["--device", "cpu", "--config", "small", "--devices", "all"])
    assert "--devices all: this machine has no CUDA device" in capsys.readouterr().err


def test_each_run_records_its_rate_parameters_and_wall_time(doc):
    for r in doc["runs"]:
        assert r["lr"] == 3e-3 and r["lr_sweep"] == [3e-3]
        assert 0 < r["mixer_parameters"] < r["parameters"]
        assert r["mixer_parameters"] == r["parameter_counts"]["mixer"]
        assert r["wall_ms_per_step"] > 0 and r["gpu_ms_per_step"] is None  # CPU: wall only
    assert doc["study"]["recurrent_block"] == "griffin"
    assert {r["model"]["recurrent_block"] for r in doc["runs"]} == {"griffin"}


def _fake_record(lr, value, metric="accuracy"):
    return {"lr": lr, "value": value, "metric": metric}


@pytest.mark.parametrize("values, want", [
    ((0.9, 0.5, 0.2), 1e-3 / 3),  # best at the lowest rate: one step of the ratio below
    ((0.2, 0.5, 0.9), 9e-3 * 3),  # at the highest: one step above
    ((0.2, 0.9, 0.5), None),  # inside: no widening
    ((math.nan, math.nan, 0.1), 9e-3 * 3),  # diverged runs are not the best
    ((1.0, 1.0, 1.0), None),  # saturated: an edge that only ties widens nothing
    ((0.9, 0.9, 0.2), None),
])
def test_a_first_seed_sweep_widens_past_an_edge_best(values, want):
    rates = [1e-3, 3e-3, 9e-3]
    got = T.widened_rate(rates, [_fake_record(r, v) for r, v in zip(rates, values)])
    assert got == (None if want is None else pytest.approx(want))
    bits = [_fake_record(r, v, "bits_per_char") for r, v in zip(rates, (1.0, 2.0, 3.0))]
    assert T.widened_rate(rates, bits) == pytest.approx(1e-3 / 3)  # the lowest bits win


def test_first_seed_search_runs_the_other_seeds_at_the_best_rate():
    rates = [1e-3, 1e-2, 1e-1]
    study = T.study_from_parameters(
        ["attention", "samu"], [0, 1, 2], 16, 1, 2,
        {"mqar": {"lengths": [16, 24], "num_pairs": 2, "vocab_size": 8}}, 12, 4, rates, 2, 1,
        timing_warmup_steps=1, backend=REF, attention_head_dim=8, lr_search="first_seed")
    assert study.runs("mqar") == [(t, m, lr, 0) for t, m in study.groups("mqar") for lr in rates]
    assert study.planned_runs("mqar") == 4 * (3 + 2)
    records = T.run_task(study, "mqar", "cpu", bar=False)
    choice = T.learning_rate_choice(records).set_index(["seq_len", "mixer"])
    for task, mixer in study.groups("mqar"):
        mine = [r for r in records if r["seq_len"] == task.seq_len and r["mixer"] == mixer]
        swept = mine[0]["lr_sweep"]
        assert all(r["lr_sweep"] == swept for r in mine)
        first = [r for r in mine if r["seed"] == 0]
        assert sorted(r["lr"] for r in first) == swept and set(rates) <= set(swept)
        widened = sorted(set(swept) - set(rates))  # one step of 10x at a time, past the ends
        assert len(widened) <= T.LR_WIDENINGS
        for rate in widened:
            assert any(rate == pytest.approx(v) for v in (1e-4, 1e-5, 1.0, 10.0)), swept
        best = choice.loc[(task.seq_len, mixer), "lr"]
        assert best == T.best_rate(first)  # the first seed decides
        others = sorted((r["seed"], r["lr"]) for r in mine if r["seed"] != 0)
        assert others == [(1, best), (2, best)]
    assert (T.summary(records)["seeds"] == 3).all()


def test_first_seed_parts_hold_whole_groups_once():
    base = T.check_parameters(SETS["scale gpu"])
    assert base.lr_search == "first_seed"
    whole = {name: base.groups(name) for name in base.tasks}
    parts = [dataclasses.replace(base, part=f"{k}/3") for k in (1, 2, 3)]
    for name, groups in whole.items():
        got = [g for p in parts for g in p.groups(name)]
        assert sorted(map(str, got)) == sorted(map(str, groups))  # each group in one part
        for p in parts:  # every run of a part's sweep belongs to one of its groups
            assert {(t, m) for t, m, _, _ in p.runs(name)} == set(p.groups(name))
    recall = T.check_parameters(SETS["recall gpu"])
    parts = [dataclasses.replace(recall, part=f"{k}/2") for k in (1, 2)]
    groups = [g for p in parts for g in p.recall_groups()]
    assert sorted(groups) == sorted(recall.recall_groups())
    assert sum(len(p.recall_jobs()) for p in parts) == len(recall.recall_jobs())

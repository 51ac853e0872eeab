"""README.md's figures against the files they come from: its results block (and docs/LAB.md's
table of result rows) is what samu.experiment.readme renders from the committed data, and every
other number in it is a figure readme.facts computes from data and device logs, the count of
tests pytest collects, or one of the few figures listed here."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from samu import paths
from samu.shapes import Shape
from samu.experiment import pipeline, readme, report
from samu import mixers

ROOT = paths.REPO_ROOT
DATA = ROOT / "data"  # the committed files, whatever SAMU_DATA_DIR names
COUNT = re.compile(r"On a CPU pytest collects (\d+) tests")
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?!\w)")
# Figures the README quotes with no data file or log behind them, each with where it was
# measured, and the numbers that describe the project rather than a measurement.
NOT_FROM_DATA = {
    "about 14 min on a fresh clone, the install included: pytest 596 s, nbval 163 s":
        "make test on the 2-core CPU machine, a fresh clone at b47b047 (854 s)",
    "about 1 min for its one small shape": "make reproduce on that machine at 39369e1: 56 s",
    "about 50 s": "make train with notebook 05's CPU defaults on that machine at 39369e1",
    "CPU (2 cores,": "the CPU machine those times were measured on",
    "one worker a core up to 16": "the Makefile's cap on pytest-xdist workers",
}


def readme_text() -> str:
    return readme.README.read_text()


def prose(text: str) -> str:
    """The text a reader reads as sentences and tables: without the generated block, code,
    link targets and HTML comments."""
    for begin, end in ((readme.RESULTS_BEGIN, readme.RESULTS_END),
                       (readme.OTHER_GPUS_BEGIN, readme.OTHER_GPUS_END)):
        start, stop = readme._span(text, begin, end)
        text = text[:start] + text[stop:]
    text = re.sub(r"```.*?```", " ", text, flags=re.DOTALL)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.DOTALL)
    return re.sub(r"\s+", " ", text)  # a phrase reads the same wherever a line breaks it


def test_the_results_block_is_rendered_from_the_committed_data():
    assert readme.block(readme_text()) == readme.results_tables(DATA)


def test_the_lab_log_result_rows_are_rendered_from_the_committed_data():
    lab = readme.LAB.read_text()
    assert readme.block(lab, readme.ROWS_BEGIN, readme.ROWS_END) == readme.result_rows_table(DATA)


def _copy_of_the_data(dest):
    for name in ("results/nvidia-h200.json", "reference/h800_pcie_published_result.json",
                 "training/nvidia-h200.json"):
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(DATA / name, dest / name)
    return dest


def _edit(path, change):
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def _speed(data, shape):
    """The result rows' frame at one shape, by mixer, and SAMU's speed-up sample there."""
    frame = report.frame(json.loads((data / "results" / "nvidia-h200.json").read_text()))
    rows = frame[frame["shape"] == shape].set_index("mixer")
    sp = report.speedups(frame)
    return rows, sp[(sp["shape"] == shape) & (sp["mixer"] == "samu")].iloc[0]


def test_the_block_changes_with_the_data(tmp_path):
    data = _copy_of_the_data(tmp_path)
    assert readme.results_tables(data) == readme.results_tables(DATA)

    def slower_samu(doc):
        row = next(r for r in doc["rows"] if r["architecture"] == "samu"
                   and r["shape"] == {"batch": 4, "length": 2048, "width": 2048})
        row["gpu_time_ms"] = 0.5

    def worse_attention(doc):
        for run in doc["runs"]:
            if (run["task"], run["seq_len"], run["mixer"]) == ("mqar", 256, "attention"):
                run["value"] = 0.25

    rows, speedup = _speed(data, "(4, 2048, 2048)")
    samu, rglru = rows.loc["samu"], rows.loc["rglru"]
    _edit(data / "results" / "nvidia-h200.json", slower_samu)
    _edit(data / "training" / "nvidia-h200.json", worse_attention)
    rendered = readme.results_tables(data)
    # SAMU's GPU time now 0.5 ms: its multiple of the floor, its median over it and the GPU
    # times' speed-up follow; the medians' speed-up does not.  Attention below its bar on MQAR
    # at L = 256, so MQAR's rows name no best, while selective copying's still do.
    floor_ms = samu["gpu_time_ms"] / samu["gpu_time_times_floor"]
    assert (f"| (4, 2048, 2048) | SAMU | 1.92 ms | {samu['forward_backward_ms']:.3f} ms "
            f"| 0.500 ms ({0.5 / floor_ms:.1f}) | {samu['forward_backward_ms'] / 0.5:.2f} |"
            ) in rendered
    assert (f"| (4, 2048, 2048) | 1.33 | {speedup['speedup']:.2f} ({speedup['low']:.2f}-"
            f"{speedup['high']:.2f}) | {rglru['gpu_time_ms'] / 0.5:.2f} |") in rendered
    assert ("| associative recall (MQAR), L = 256 (not compared: attention fails its bar) | "
            "0.250 | 0.795 (0.740-0.826) | 0.904 (0.786-0.967) |") in rendered
    flat = " ".join(rendered.split())
    assert ("associative recall (MQAR) at L = 256: held-out accuracy 0.250 (bar: at least "
            "0.95; fails)") in flat
    assert re.search(r"\| selective copying, L = 256 \|[^\n]*\*\*", rendered)


def test_the_low_median_is_explained_from_the_rows(tmp_path):
    """The shape where the medians' speed-up falls furthest below the GPU times' is named with
    each median's multiple of its GPU time, from the rows: here a shape made so by giving
    RG-LRU's kernels ten times their GPU time there."""
    data = _copy_of_the_data(tmp_path)

    def slower_rglru_kernels(doc):
        row = next(r for r in doc["rows"] if r["architecture"] == "rglru"
                   and r["shape"] == {"batch": 3, "length": 1000, "width": 1536})
        row["gpu_time_ms"] *= 10

    _edit(data / "results" / "nvidia-h200.json", slower_rglru_kernels)
    rows, speedup = _speed(data, "(3, 1000, 1536)")
    samu, rglru = rows.loc["samu"], rows.loc["rglru"]
    over = {m: rows.loc[m, "forward_backward_ms"] / rows.loc[m, "gpu_time_ms"]
            for m in mixers.names()}
    text = " ".join(readme.results_tables(data).split())
    assert (f"furthest below the GPU times' at (3, 1000, 1536): {speedup['speedup']:.2f} against "
            f"{rglru['gpu_time_ms'] / samu['gpu_time_ms']:.2f}. There SAMU's median is "
            f"{over['samu']:.1f} times its GPU time and RG-LRU's {over['rglru']:.1f} times"
            ) in text
    assert (f"{100 - 100 / over['samu']:.0f} % of SAMU's and {100 - 100 / over['rglru']:.0f} % "
            f"of RG-LRU's") in text


def test_the_training_table_shows_missing_and_diverged_runs(tmp_path):
    """A mixer that did not run a task gets "-"; a diverged seed is said and no best is bolded;
    a task where a mixer diverged at every rate still renders."""
    doc = json.loads((DATA / "training" / "nvidia-h200.json").read_text())
    doc["runs"] = [r for r in doc["runs"] if not (r["task"] == "lm" and r["mixer"] == "samu")]
    for r in doc["runs"]:
        if r["task"] == "lm" and r["mixer"] == "rglru" and r["seed"] == 2:
            r["value"] = float("nan")
        if r["task"] == "copy" and r["mixer"] == "rglru":
            r["value"] = float("nan")
    (tmp_path / "training").mkdir()
    (tmp_path / "training" / "nvidia-h200.json").write_text(json.dumps(doc))
    rows = {line.split(" | ")[0]: line for line in
            readme.training_table(tmp_path, "nvidia-h200").splitlines() if line.startswith("| ")}
    lm = rows["| character LM (stdlib source), L = 512, bits per character"]
    assert lm.endswith("| - |")
    assert "1 of 3 seeds diverged" in lm and "**" not in lm
    copy = rows["| selective copying, L = 512"]
    assert "diverged at every rate" in copy and "**" not in copy
    assert "each timed alone) |" in readme.training_table(tmp_path, "nvidia-h200")
    # A run that shared the GPU and was not re-timed alone: the speed row says so.
    shared = next(r for r in doc["runs"] if "solo_gpu_ms_per_step" in r)
    del shared["solo_gpu_ms_per_step"]
    (tmp_path / "training" / "nvidia-h200.json").write_text(json.dumps(doc))
    assert "some timed while sharing the GPU) |" in readme.training_table(tmp_path, "nvidia-h200")
    # A merged study's configurations timed side by side: a row of their own, averaged per task.
    doc["side_by_side"] = {"environment": doc["environment"], "steps": 20, "rows": [
        {"task": t, "seq_len": 512, "mixer": m, "wall_ms_per_step": 9.0, "tokens_per_s": 1e6,
         "gpu_ms_per_step": {"lm": 2.0, "copy": 4.0}[t] * (1.5 if m == "samu" else 1.0)}
        for t in ("lm", "copy") for m in ("attention", "rglru", "samu")]}
    (tmp_path / "training" / "nvidia-h200.json").write_text(json.dumps(doc))
    assert ("| GPU time per training step, every configuration timed side by side in the command "
            "that merged the parts (median per task and length, averaged over them) | 3.00 ms | "
            "3.00 ms | 4.50 ms |") in readme.training_table(tmp_path, "nvidia-h200")


def test_the_shared_training_timing_is_said():
    """Attention's runs shared the GPU four at a time; the table's time is its solo re-timing,
    and the block says so with the shared median."""
    text = " ".join(readme.results_tables(DATA).split())
    assert ("Attention's runs trained 4 at a time on the GPU (median GPU time per step while "
            "sharing it: 4.52 ms); the table gives its 50 steps re-timed alone") in text
    assert "| GPU time per training step (median per task and length, averaged over them; " \
        "each timed alone) | 3.14 ms |" \
        in text


def test_the_figures_quoted_outside_the_block_come_from_the_data():
    text = prose(readme_text())
    for name, figure in readme.facts().items():
        assert figure in text, f"README does not say {name} as the data give it: {figure!r}"


def test_every_other_number_in_the_readme_is_accounted_for():
    """A number added to README.md outside its block fails here until it is rendered from data,
    computed by readme.facts, or listed in NOT_FROM_DATA with where it was measured."""
    text = prose(readme_text())
    for phrase in [*readme.facts().values(), *NOT_FROM_DATA]:
        assert phrase in text, f"README no longer says {phrase!r}: drop it from the lists"
        text = text.replace(phrase, " ")
    text = COUNT.sub(" ", text)
    assert NUMBER.findall(text) == []


def test_the_makefile_caps_the_test_workers_as_the_readme_says():
    assert "min(16, os.cpu_count() or 1)" in (ROOT / "Makefile").read_text()


def test_every_part_of_the_training_study_has_its_logged_commands():
    parts = readme.training_part_seconds()
    assert len(parts) == 3 and all(parts)


def test_the_reproduce_logs_ran_every_default_gpu_shape_once_each():
    shapes = []
    for log in readme.REPRODUCE_LOGS:
        text = (ROOT / log).read_text(errors="replace")
        assert len(readme.command_seconds(ROOT / log)) == 1 and "rc=0" in text
        shapes += sorted(set(re.findall(r"01_correctness (\d+x\d+x\d+)", text)))
    assert sorted(shapes) == sorted(pipeline.GPU_SHAPES)


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="under CUDA the kernel tests add GPU sizes; the README counts a CPU's")
def test_the_test_count_is_what_pytest_collects():
    match = COUNT.search(prose(readme_text()))
    assert match, "README states how many tests pytest collects on a CPU"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0",
                          "-p", "no:cacheprovider", "tests"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    collected = re.search(r"^(\d+) tests? collected", out.stdout, re.MULTILINE)
    assert collected, out.stdout[-2000:] + out.stderr[-2000:]
    assert match.group(1) == collected.group(1)


@pytest.mark.parametrize("path", [readme.README, readme.LAB], ids=["README", "LAB"])
def test_every_relative_link_names_a_file_that_exists(path):
    targets = re.findall(r"\]\(([^)#]+)\)", path.read_text())
    assert targets
    missing = [t for t in targets if "://" not in t and not (path.parent / t).exists()]
    assert missing == []


def test_write_renders_stale_blocks_and_check_finds_none_left(tmp_path, monkeypatch, capsys):
    for name in ("README", "LAB"):
        copy = tmp_path / f"{name}.md"
        copy.write_text(getattr(readme, name).read_text())
        monkeypatch.setattr(readme, name, copy)
    assert readme.main(["--check"]) == 0
    stale = readme.with_block(readme.README.read_text(), "old figures\n")
    readme.README.write_text(stale)
    assert readme.main(["--check"]) == 1
    assert "differs from the data files" in capsys.readouterr().out
    assert readme.main(["--write"]) == 0
    assert readme.block(readme.README.read_text()) == readme.results_tables(DATA)
    rendered = readme.results_tables(DATA)
    assert readme.README.read_text().replace(rendered, "") == stale.replace("old figures\n", "")
    assert readme.main(["--check"]) == 0


def api_examples() -> dict[str, str]:
    """The README's Python blocks of its API section, by where they run: "cpu" and "gpu"."""
    text = readme_text()
    section = text[text.index("## The API in one screen"):text.index("## Results on the H200")]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    by = {("gpu" if "cuda" in block else "cpu"): block for block in blocks}
    assert len(blocks) == len(by) == 2, blocks
    return by


def unbound_names(code: str) -> set[str]:
    """Names a block reads that it neither binds nor imports and Python does not provide."""
    import ast
    import builtins
    tree = ast.parse(code)
    bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
             and isinstance(n.ctx, ast.Store)}
    bound |= {(a.asname or a.name).split(".")[0] for n in ast.walk(tree)
              if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
            and isinstance(n.ctx, ast.Load)}
    return read - bound - set(dir(builtins))


@pytest.mark.parametrize("where", ["cpu", "gpu"])
def test_the_api_examples_name_only_what_they_define(where):
    assert unbound_names(api_examples()[where]) == set()


def test_the_cpu_api_example_runs_as_written(tmp_path):
    """In a fresh interpreter without TRITON_INTERPRET, as a reader on a CPU would run it."""
    script = tmp_path / "example.py"
    script.write_text(api_examples()["cpu"])
    env = {k: v for k, v in os.environ.items()
           if k != "TRITON_INTERPRET" and not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU, even on a GPU machine
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["reference_chunked"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU example needs CUDA")
def test_the_gpu_api_example_runs_as_written():
    exec(compile(api_examples()["gpu"], "README.md", "exec"), {})


def test_other_gpus_get_a_table_each_and_none_without_their_results(tmp_path):
    """A results file besides the committed GPU's gets its own heading and speed table, with how
    many default shapes ran there; with none, the block is empty."""
    import shutil
    (tmp_path / "results").mkdir()
    shutil.copytree(ROOT / "data" / "reference", tmp_path / "reference")
    committed = f"{readme.report.COMMITTED_SLUG}.json"
    shutil.copy(ROOT / "data" / "results" / committed, tmp_path / "results" / committed)
    assert readme.other_gpu_tables(tmp_path) == ""
    # a CPU run of `make reproduce` (git ignores its file) is no other GPU
    cpu_run = readme.schema.read_json(ROOT / "data" / "results" / committed)
    cpu_run["environment"] = {**cpu_run["environment"], "gpu": "cpu", "device": "cpu"}
    for name in (readme.report.CPU_SLUG, "renamed-cpu-run"):
        (tmp_path / "results" / f"{name}.json").write_text(json.dumps(cpu_run))
        assert readme.other_gpu_tables(tmp_path) == ""
        (tmp_path / "results" / f"{name}.json").unlink()
    # a committed GPU's file, not a CPU run's that `make reproduce` left here
    other = next(p for p in sorted((ROOT / "data" / "results").glob("*.json"))
                 if p.name != committed and p.stem != readme.report.CPU_SLUG)
    shutil.copy(other, tmp_path / "results" / other.name)
    rendered = readme.other_gpu_tables(tmp_path)
    doc = readme.schema.read_json(other)
    ran = {readme.Shape.of(k).key for k in doc["shape_environments"]} & set(pipeline.GPU_SHAPES)
    assert rendered.startswith("## Results on other GPUs\n\n### On the "
                               + doc["environment"]["gpu"])
    assert f"{len(ran)} of the {len(pipeline.GPU_SHAPES)} default shapes ran there." in rendered
    assert "![multiples of the floor" not in rendered  # no figure in this data folder
    assert rendered.count("| SAMU |") == len(ran)
    # its training studies, each configuration's with a result file, from the registry
    (tmp_path / "training").mkdir()
    slug = other.stem
    recall = ROOT / "data" / "training" / f"{slug}.recall.json"
    shutil.copy(recall, tmp_path / "training" / recall.name)
    small = readme.schema.read_json(ROOT / "data" / "training" / committed)
    scale = {**small, "study": {**small["study"], "configuration": "scale"}}
    scale.pop("recall_curves")
    (tmp_path / "training" / f"{slug}.scale.json").write_text(json.dumps(scale))
    rendered = readme.other_gpu_tables(tmp_path)
    assert f"Recall curves on the {doc['environment']['gpu']} (`make train CONFIG=recall`" \
        in rendered
    assert rendered.index("Recall curves on") < rendered.index("`make train CONFIG=scale` on the")
    assert f"`data/training/{slug}.scale.json`: {len(scale['runs'])} runs;" in rendered
    assert "**Measured.**" in rendered and "recall-curve runs" not in rendered
    assert "![" not in rendered  # no figure in this data folder


def test_a_broken_data_file_stops_write_with_its_name_and_no_traceback(monkeypatch):
    """--write and --check name the broken file the blocks render from and change nothing."""
    from samu.experiment import schema

    def broken(data_dir=None):
        raise schema.ResultFileError("data/results/nvidia-h200.json", "not valid JSON")
    monkeypatch.setattr(readme, "targets", broken)
    monkeypatch.setattr(schema, "atomic_write",
                        lambda *a, **k: pytest.fail("wrote despite a broken data file"))
    for flag in ("--write", "--check"):
        with pytest.raises(SystemExit, match="nvidia-h200.json: not valid JSON"):
            readme.main([flag])


def test_the_speed_table_names_the_commits_its_shapes_ran_at():
    envs = {"4x2048x2048": {"git_commit": "a" * 40}, "1x8192x2560": {"git_commit": "b" * 40},
            "1x32768x1024": {"git_commit": "b" * 40}, "2x4097x512": {"git_commit": "c" * 40}}
    shown = [Shape.of(key).label for key in ("4x2048x2048", "1x8192x2560", "1x32768x1024")]
    assert (readme._code_said({"shape_environments": envs}, shown)
            == "at aaaaaaa (1 shape), bbbbbbb (2 shapes); ")  # the unshown shape's commit left out
    one = {"shape_environments": {"4x2048x2048": envs["4x2048x2048"]}}
    assert readme._code_said(one, shown) == "at aaaaaaa; "
    assert readme._code_said({}, shown) == ""
    unknown = {"shape_environments": {"4x2048x2048": {"git_commit": None}}}
    assert readme._code_said(unknown, shown) == ""  # run outside a git checkout
    table = " ".join(readme.speed_table(DATA).split())
    assert re.search(r"triton [0-9.]+; at [0-9a-f]{7}[;( ]", table)


def test_help_gives_the_command_and_the_docstring_s_whole_first_paragraph(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit) as exit_:
        readme.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m samu.experiment.readme ")
    first_paragraph = " ".join(readme.__doc__.split("\n\n")[0].split())
    assert first_paragraph.endswith("device logs.")
    assert first_paragraph in " ".join(out.split())

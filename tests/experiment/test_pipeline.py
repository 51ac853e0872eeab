import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from samu import dispatch, paths
from samu.experiment import pipeline


def test_parse_shape():
    assert pipeline.parse_shape("4x2048x2048") == (4, 2048, 2048)
    for bad in ("4x2048", "ax1x2", "0x4x16"):
        with pytest.raises(SystemExit, match="bad shape"):
            pipeline.parse_shape(bad)


def test_parse_shape_takes_ascii_digits_only():
    assert pipeline.parse_shape("1X16x16") == (1, 16, 16)
    for bad in ("1_6x16x16", " 1x16x16", "1x16x16\n", "+1x16x16", "1x16x\u0661\u0666", "1x16x16x"):
        with pytest.raises(SystemExit, match="bad shape"):
            pipeline.parse_shape(bad)


def test_a_width_the_head_count_does_not_divide_stops_the_run_before_any_notebook(
        monkeypatch, capsys):
    """RG-LRU splits the width into the notebooks' head count: 1x16x15 is refused up front,
    naming the shape, not in the correctness notebook's traceback."""
    monkeypatch.setattr(pipeline, "run_notebook", lambda *a: pytest.fail("a notebook ran"))
    with pytest.raises(SystemExit):
        pipeline.main(["--shapes", "1x16x16 1x16x15"])
    assert "head count 16 does not divide the width of 1x16x15" in capsys.readouterr().err


def test_parse_shapes_splits_each_argument_on_whitespace():
    assert pipeline.parse_shapes(["4x2048x2048 1x8192x2560", "1x16x16"]) == [
        (4, 2048, 2048), (1, 8192, 2560), (1, 16, 16)]
    assert pipeline.parse_shapes([""]) == pipeline.parse_shapes(None) == []
    assert pipeline.parse_shapes(["1x16x16 1X16x16", "2x8x8 1x16x16"]) == [
        (1, 16, 16), (2, 8, 8)]  # each shape once, in the order first given


def test_help_names_every_default_shape(capsys, monkeypatch):
    """--help's default is the shapes main runs: GPU_SHAPES on a GPU, CPU_SHAPES on a CPU."""
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option: a shape is never broken
    with pytest.raises(SystemExit) as exit_:
        pipeline.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m samu.experiment.pipeline ")
    for shape in pipeline.GPU_SHAPES + pipeline.CPU_SHAPES:
        assert shape in out
    assert f"the {len(pipeline.PUBLISHED_SHAPES)} shapes of the published H800 result" in out
    assert "the four shapes" not in out


def test_default_shapes_text_follows_the_constants(monkeypatch):
    monkeypatch.setattr(pipeline, "GPU_SHAPES", pipeline.PUBLISHED_SHAPES[:])
    text = pipeline.default_shapes_text()
    assert text.endswith(f"({', '.join(pipeline.PUBLISHED_SHAPES)}); on a CPU 1x16x16")
    monkeypatch.setattr(pipeline, "GPU_SHAPES", ["2x8x8"])
    assert pipeline.default_shapes_text() == "on a GPU 2x8x8; on a CPU 1x16x16"


def test_notebooks_inherit_the_absolute_data_dir(tmp_path, monkeypatch):
    """paths.DATA was made absolute at import; the kernels, started in notebooks/, must get the
    same folder, not the relative text the user gave."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SAMU_DATA_DIR", "reldata")
    monkeypatch.setattr(paths, "DATA", tmp_path / "reldata")  # what the import made of it
    assert pipeline.export_data_dir() == os.environ["SAMU_DATA_DIR"] == str(tmp_path / "reldata")

    monkeypatch.setenv("SAMU_DATA_DIR", "reldata")
    calls = []

    def fake_run_notebook(name, out_dir, parameters):
        calls.append((name, os.environ["SAMU_DATA_DIR"], out_dir, parameters))
        if name == "04_report":
            raise RuntimeError("stop before the report")  # main then reports failure

    monkeypatch.setattr(pipeline, "run_notebook", fake_run_notebook)
    assert pipeline.main(["--shapes", "4x2048x2048 1x8192x2560"]) == 1
    assert [c[0] for c in calls] == pipeline.PER_SHAPE * 2 + ["04_report"]
    assert all(c[1] == str(tmp_path / "reldata") for c in calls)
    assert all(Path(c[2]).is_relative_to(tmp_path / "reldata" / "runs") for c in calls)
    assert [(c[3]["batch"], c[3]["length"], c[3]["width"]) for c in calls[::3][:2]] == [
        (4, 2048, 2048), (1, 8192, 2560)]


def _make(*args, python, target="reproduce"):
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "SHAPES", "GPU")}
    make = shutil.which("make")
    assert make, "make is needed to test the Makefile"
    return subprocess.run([make, "-s", "-C", str(paths.REPO_ROOT), target,
                           f"PYTHON={python}", *args], env=env, capture_output=True, text=True)


def test_make_passes_shapes_as_one_argument_the_shell_never_parses(tmp_path):
    fake = tmp_path / "python"  # prints its arguments, one a line
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    fake.chmod(0o755)
    hostile = f"bad;touch {tmp_path}/a $(shell touch {tmp_path}/b) `touch {tmp_path}/c` *"
    for shapes, expected in ((hostile, hostile), (None, ""),
                             ("4x2048x2048 1x8192x2560", "4x2048x2048 1x8192x2560")):
        out = _make(*([f"SHAPES={shapes}"] if shapes is not None else []), python=fake)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split("\n")[:4] == ["-m", "samu.experiment.pipeline", "--shapes", expected]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["python"]


def test_make_report_passes_the_gpu_as_one_argument_the_shell_never_parses(tmp_path):
    fake = tmp_path / "python"  # prints its arguments, one a line
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    fake.chmod(0o755)
    hostile = f"-x;touch {tmp_path}/a $(shell touch {tmp_path}/b) `touch {tmp_path}/c`"
    for gpu, expected in ((hostile, hostile), (None, ""), ("nvidia-h200", "nvidia-h200")):
        out = _make(*([f"GPU={gpu}"] if gpu is not None else []), python=fake, target="report")
        assert out.returncode == 0, out.stderr
        # one argument, so that a value starting with "-" reaches the slug check
        assert out.stdout.split("\n")[:3] == ["-m", "samu.experiment.pipeline",
                                               f"--report={expected}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["python"]


def _cpu_shape_results(slug, shapes):
    from samu.experiment import protocol

    for shape in shapes:
        rows = protocol.time_shape(shape, 0, {"rglru": "reference_chunked",
                                              "samu": "reference_chunked"}, "cpu")
        protocol.write_shape_result(slug, shape, rows)


def test_report_alone_combines_the_shapes_already_there(tmp_path, monkeypatch, capsys):
    """Shapes written by separate runs (here two, one at a time) are combined by the report
    notebook alone: one result document holding both, and no shape run again."""
    import json

    monkeypatch.setenv("SAMU_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(paths, "DATA", tmp_path)
    _cpu_shape_results("cpu", [(1, 8, 16)])
    _cpu_shape_results("cpu", [(2, 8, 16)])
    assert pipeline.main(["--report", "cpu"]) == 0
    doc = json.loads(paths.results_file("cpu").read_text())
    assert sorted((r["shape"]["batch"], r["architecture"]) for r in doc["rows"]) == [
        (1, "rglru"), (1, "samu"), (2, "rglru"), (2, "samu")]
    # the report ran, and no shape's notebook did
    assert sorted(p.name for p in paths.runs_dir("cpu").rglob("*.ipynb")) == ["04_report.ipynb"]
    out = capsys.readouterr().out
    assert "report over 2 shapes of cpu: 1x8x16 2x8x16" in out
    assert f"wrote {paths.relative(paths.results_file('cpu'))}" in out


@pytest.mark.parametrize("argv, message", [
    (["--report", "../calibration"], "not a GPU slug"),
    (["--report", "NVIDIA H200"], "not a GPU slug"),
    (["--report=-x"], "'-x': not a GPU slug"),
    (["--report", "nvidia-h999"], "GPUs with results: cpu"),
    (["--report", "cpu", "--shapes", "1x16x16"], "give --shapes or --report, not both"),
])
def test_report_refuses_what_it_cannot_combine(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.setenv("SAMU_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(paths, "DATA", tmp_path)
    _cpu_shape_results("cpu", [(1, 8, 16)])
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(SystemExit) as stop:
        pipeline.main(argv)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
    assert sorted(tmp_path.rglob("*")) == before  # nothing written


def test_report_takes_an_empty_shapes_argument_as_none(tmp_path, monkeypatch):
    """`--shapes ""` (what an unset SHAPES gives) asks for no shape, so it may stand beside
    --report."""
    monkeypatch.setenv("SAMU_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(paths, "DATA", tmp_path)
    _cpu_shape_results("cpu", [(1, 8, 16)])
    calls = []
    monkeypatch.setattr(pipeline, "run_notebook", lambda name, out_dir, p: calls.append(name))
    monkeypatch.setattr(pipeline, "print_summary", lambda slug: None)
    assert pipeline.main(["--shapes", " ", "--report", "cpu"]) == 0
    assert calls == ["04_report"]


def test_make_reproduce_fails_on_a_bad_shape(tmp_path):
    marker = tmp_path / "marker"
    out = _make(f"SHAPES=bad;touch {marker}", python=sys.executable)
    assert out.returncode != 0
    assert "bad shape 'bad;touch'" in out.stderr
    assert not marker.exists()


def _make_dry(target, *args):
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "LAB_ARGS")}
    make = shutil.which("make")
    assert make, "make is needed to test the Makefile"
    out = subprocess.run([make, "-n", "-s", "-C", str(paths.REPO_ROOT), target, *args], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_make_lab_serves_the_repository_root_and_passes_lab_args():
    """A dry run (-n): the command, no server."""
    out = _make_dry("lab", "PYTHON=python3", "LAB_ARGS=--no-browser --port 8899")
    lab = [line for line in out.splitlines() if "-m jupyterlab" in line]
    assert len(lab) == 1, out
    assert f'--ServerApp.root_dir="{paths.REPO_ROOT}"' in lab[0]
    assert lab[0].rstrip().endswith("--no-browser --port 8899")
    assert " notebooks" not in lab[0]  # the root, not notebooks/
    assert ("--allow-root" in lab[0]) == (os.geteuid() == 0)
    plain = [line for line in _make_dry("lab", "PYTHON=python3").splitlines()
             if "-m jupyterlab" in line][0]
    assert "--port" not in plain


def test_report_notebook_runs_in_write_mode_only_from_the_pipeline(tmp_path, monkeypatch,
                                                                     capsys):
    monkeypatch.setenv("SAMU_DATA_DIR", str(tmp_path))  # main exports the data folder
    monkeypatch.setattr(paths, "DATA", tmp_path)
    calls = []
    monkeypatch.setattr(pipeline, "run_notebook", lambda name, out_dir, p: calls.append((name, p)))
    monkeypatch.setattr(pipeline, "print_summary", lambda slug: None)
    assert pipeline.main(["--shapes", "1x16x16"]) == 0
    assert calls[-1][0] == "04_report" and calls[-1][1]["write"] is True
    wrote = capsys.readouterr().out.strip().splitlines()[-1]  # every folder it wrote, named
    slug = dispatch.gpu_slug()  # this machine's: "cpu" here, the GPU's on one
    for folder in (paths.results_dir(slug), paths.correctness_dir(slug), paths.runs_dir(slug)):
        assert f"{paths.relative(folder)}/" in wrote
    assert os.environ["TRITON_DEFAULT_FP_FUSION"] == "1"


def test_a_cpu_run_names_its_shapes_and_warns_of_large_ones(tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # restored after: main sets it on a CPU
    monkeypatch.setenv("SAMU_DATA_DIR", str(tmp_path))  # and exports the data folder
    monkeypatch.setattr(paths, "DATA", tmp_path)
    monkeypatch.setattr(pipeline, "run_notebook", lambda name, out_dir, p: None)
    monkeypatch.setattr(pipeline, "print_summary", lambda slug: None)
    assert pipeline.main([]) == 0
    out = capsys.readouterr().out
    assert f"No CUDA device: running {' '.join(pipeline.CPU_SHAPES)} with" in out
    assert "expect a long run" not in out
    assert pipeline.main(["--shapes", "1x16x16 4x2048x2048"]) == 0
    out = capsys.readouterr().out
    assert "running 1x16x16 4x2048x2048 with" in out
    assert "\n4x2048x2048: over 65536 elements" in out and "expect a long run" in out


@pytest.fixture(params=["this machine", "a GPU machine"])
def machine(request, monkeypatch):
    """Run here, and on a simulated H200 machine (CUDA available, the device an H200) while the
    tests time CPU tensors: results must be labelled by the device timed, not the machine."""
    if request.param == "a GPU machine":
        import torch

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    return request.param


def test_cpu_summary_has_no_floor_bandwidth_or_memory(tmp_path, monkeypatch, capsys, machine):
    from samu.experiment import protocol, report

    monkeypatch.setattr(paths, "DATA", tmp_path)
    rows = protocol.time_shape((1, 8, 16), 0, {"rglru": "reference_chunked",
                                               "samu": "reference_chunked"}, "cpu")
    protocol.add_floor_figures(rows, 4.22e12)  # as notebook 03 did before: ignored on a CPU
    protocol.write_shape_result("cpu", (1, 8, 16), rows)
    pipeline.print_summary("cpu")
    out = capsys.readouterr().out
    assert report.CPU_NOTE in out
    assert "H200" not in out and "e+09" not in out
    header = next(line for line in out.splitlines() if line.split()[:1] == ["source"]).split()
    line = next(line for line in out.splitlines() if " rglru " in line).split()
    # the floor, GPU-time, bandwidth, memory, peer and host columns are blank ("-"); the row's
    # first columns (source, shape) hold spaces, so count from the end
    blank = ["times_floor", "gpu_time_ms", "gpu_time_times_floor", "achieved_TBps",
             "peak_allocated_delta_units", "speedup_vs_peer", "host_ratio_to_linear"]
    assert header[-len(blank):] == blank
    assert line[-len(blank):] == ["-"] * len(blank)


def test_papermill_kernels_use_ipc_not_tcp(capfd):
    """ipykernel warns "Kernel is running over TCP without encryption" on every TCP start."""
    manager_class = pipeline.kernel_manager_class()
    if os.name != "posix":
        assert manager_class is None
        return
    km = manager_class()
    assert km.transport == "ipc"
    assert Path(km.ip).parent == Path(__import__("tempfile").gettempdir())
    km.start_kernel()
    try:
        client = km.client()
        client.start_channels()
        client.wait_for_ready(timeout=60)
        client.stop_channels()
    finally:
        km.shutdown_kernel(now=True)
    assert "without encryption" not in capfd.readouterr().err
    assert not list(Path(km.ip).parent.glob(Path(km.ip).name + "-*"))  # sockets removed
    assert manager_class().ip != km.ip  # each kernel its own sockets


def executed_notebook(input_path, output_path, parameters):
    """A notebook as papermill leaves it: absolute paths in its metadata, an injected-parameters
    cell, outputs that name the checkout, the standard library and site-packages."""
    import sysconfig

    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    from papermill.translators import translate_parameters

    stdlib = sysconfig.get_paths()["stdlib"]
    injected = new_code_cell(translate_parameters("python3", "python", parameters, "Parameters"))
    injected.metadata["tags"] = ["injected-parameters"]
    printed = new_code_cell("print(path)", outputs=[
        new_output("stream", name="stdout",
                   text=f"wrote {paths.REPO_ROOT}/data/results/cpu/1x16x16.json\n"),
        new_output("stream", name="stderr",
                   text="/opt/venv/lib/python3.12/site-packages/tqdm/auto.py:21: TqdmWarning: "
                        "IProgress not found\n"),
        new_output("execute_result", data={"text/plain": f"'{stdlib}/json/__init__.py'"},
                   execution_count=1),
        new_output("error", ename="OSError", evalue=f"{paths.REPO_ROOT}/data/x is missing",
                   traceback=[f"File \x1b[0;32m{stdlib}/os.py:1\x1b[0m",
                              "File /usr/lib/python3/dist-packages/numpy/core.py:5"])])
    nb = new_notebook(cells=[new_code_cell("x = 1"), injected, printed])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.metadata["papermill"] = {"input_path": str(input_path), "output_path": str(output_path),
                                "parameters": parameters}
    return nbformat.writes(nb)


def test_stored_notebooks_name_no_folder_of_this_machine(tmp_path):
    import nbformat

    stored = paths.REPO_ROOT / "data" / "runs" / "cpu" / "05_training.ipynb"
    parameters = {"width": 32, "progress_log": str(tmp_path / "samu-training-x.log")}
    nb = nbformat.reads(executed_notebook(paths.REPO_ROOT / "notebooks" / "05_training.ipynb",
                                          stored.with_name(".05_training.running.ipynb"),
                                          parameters), as_version=4)
    pipeline.portable_notebook(nb, stored, unstored=("progress_log",))
    meta = nb.metadata["papermill"]
    assert meta["input_path"] == "notebooks/05_training.ipynb"
    assert meta["output_path"] == "data/runs/cpu/05_training.ipynb"
    assert meta["parameters"] == {"width": 32}
    assert nb.cells[1].source == "# Parameters\nwidth = 32\n"
    outputs = nb.cells[2].outputs
    assert outputs[0].text == "wrote data/results/cpu/1x16x16.json\n"
    assert outputs[1].text.startswith("tqdm/auto.py:21: TqdmWarning")
    assert outputs[2].data["text/plain"] == "'json/__init__.py'"
    assert outputs[3].evalue == "data/x is missing"
    assert outputs[3].traceback == ["File \x1b[0;32mos.py:1\x1b[0m", "File numpy/core.py:5"]
    assert nb.cells[0].source == "x = 1"  # sources are left alone


def test_run_notebook_stores_a_portable_copy(tmp_path, monkeypatch):
    """run_notebook's stored copy (and a failed run's) goes through portable_notebook."""
    import json

    import papermill

    log = str(tmp_path / "samu-training-x.log")

    def fake_execute(input_path, output_path, parameters, **kwargs):
        text = executed_notebook(input_path, output_path, parameters)
        Path(output_path).write_text(text, encoding="utf-8")
        if parameters.get("fail"):
            raise RuntimeError("a cell failed")

    monkeypatch.setattr(papermill, "execute_notebook", fake_execute)
    out_dir = tmp_path / "runs" / "cpu"
    stored = pipeline.run_notebook("05_training", out_dir, {"width": 32, "progress_log": log},
                                   unstored=("progress_log",))
    assert stored == out_dir / "05_training.ipynb"
    assert sorted(p.name for p in out_dir.iterdir()) == ["05_training.ipynb"]
    text = stored.read_text()
    assert str(paths.REPO_ROOT) not in text and log not in text and "site-packages" not in text
    meta = json.loads(text)["metadata"]["papermill"]
    assert meta["input_path"] == "notebooks/05_training.ipynb"
    assert meta["output_path"] == str(stored)  # outside the checkout: as given
    with pytest.raises(RuntimeError, match="a cell failed"):
        pipeline.run_notebook("05_training", out_dir, {"fail": True, "progress_log": log},
                              unstored=("progress_log",))
    failed = (out_dir / "05_training.failed.ipynb").read_text()
    assert log not in failed and "site-packages" not in failed
    assert sorted(p.name for p in out_dir.iterdir()) == ["05_training.failed.ipynb",
                                                         "05_training.ipynb"]


def test_notebook_parameters_are_the_parameters_cell():
    defaults = pipeline.notebook_parameters("05_training")
    assert defaults["configurations"] is None and defaults["progress_log"] is None
    assert defaults["overrides"] == {} and defaults["yardstick"] is True
    assert pipeline.notebook_parameters("03_timing") == {
        "batch": 1, "length": 16, "width": 16, "shape_index": 0, "seed": 0, "mixers": None}

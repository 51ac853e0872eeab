"""Data locations: a relative SAMU_DATA_DIR means the same folder in every process."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


def test_relative_data_dir_is_absolute_against_the_starting_directory(tmp_path):
    env = dict(os.environ, SAMU_DATA_DIR="reldata")
    out = subprocess.run([sys.executable, "-c", "import os, samu.paths as p; "
                          "print(p.DATA); print(os.getcwd())"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    data, cwd = (Path(line) for line in out.stdout.splitlines())
    assert data.is_absolute()
    assert data == cwd / "reldata" == tmp_path.resolve() / "reldata"


def _root(path, pyproject=None, data=True):
    path.mkdir()
    if data:
        (path / "data").mkdir()
    if pyproject is not None:
        (path / "pyproject.toml").write_text(pyproject)
    return path


def test_the_checkout_is_recognised_and_site_packages_is_not(tmp_path, monkeypatch):
    from samu import paths
    assert paths.in_checkout()
    assert paths.calibration_file("nvidia-h200").parent == paths.DATA / "calibration"
    assert paths.PACKAGED_CALIBRATION == paths.REPO_ROOT / "samu" / "_calibration"
    cases = {"site-packages": (None, False), "no data": ('[project]\nname = "samu"\n', False),
             "another project": ('[project]\nname = "another"\n', True)}
    for name, (pyproject, data) in cases.items():
        monkeypatch.setattr(paths, "REPO_ROOT", _root(tmp_path / name, pyproject, data))
        assert not paths.in_checkout(), name
    monkeypatch.setattr(paths, "REPO_ROOT", _root(tmp_path / "samu-checkout",
                                                  '[project]\nname = "samu"\n'))
    assert paths.in_checkout()


def test_calibration_dir_from_the_environment(tmp_path, monkeypatch):
    from samu import paths
    monkeypatch.delenv("SAMU_CALIBRATION_DIR", raising=False)
    assert paths.calibration_dir_from_env() is None
    monkeypatch.setenv("SAMU_CALIBRATION_DIR", "")  # empty counts as unset
    assert paths.calibration_dir_from_env() is None
    monkeypatch.setenv("SAMU_CALIBRATION_DIR", str(tmp_path))
    assert paths.calibration_dir_from_env() == tmp_path


def test_relative_names_checkout_files_from_its_root(tmp_path):
    from samu import paths
    assert paths.relative(paths.REPO_ROOT / "data" / "runs" / "x.ipynb") == "data/runs/x.ipynb"
    assert paths.relative(paths.REPO_ROOT) == "."
    assert paths.relative(tmp_path / "x.json") == str(tmp_path / "x.json")  # outside: as given


# --- what git keeps -------------------------------------------------------------------------------

def _git(*args):
    import shutil
    from samu import paths

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    inside = subprocess.run(["git", "-C", str(paths.REPO_ROOT), "rev-parse", "--show-toplevel"],
                            capture_output=True, text=True)
    if inside.returncode or Path(inside.stdout.strip()).resolve() != paths.REPO_ROOT.resolve():
        pytest.skip("samu does not run from a git checkout")
    return subprocess.run(["git", "-C", str(paths.REPO_ROOT), *args], capture_output=True,
                          text=True)


def _ignored(path) -> bool:
    from samu import paths
    rel = Path(path).relative_to(paths.REPO_ROOT).as_posix()
    out = _git("check-ignore", "--no-index", "-q", rel)
    assert out.returncode in (0, 1), out.stderr
    return out.returncode == 0


def _outputs(slug):
    """Every file `make train` and `make reproduce` write for one slug, named by the code's
    own path functions (at the shape and figure names a CPU run uses), and a benchmark's rows."""
    from samu import paths
    from samu.experiment import pipeline, training

    shape = pipeline.CPU_SHAPES[0]
    out = [training.result_path(slug), paths.calibration_file(slug), paths.results_file(slug),
           paths.correctness_dir(slug) / f"{shape}.json", paths.results_dir(slug) / f"{shape}.json",
           paths.figures_dir() / f"{slug}_time.png"]
    out += [training.figure_path(slug, name) for name in training.FIGURE_NAMES]
    out += pipeline.executed_paths(training.NOTEBOOK, paths.runs_dir(slug)).values()
    out += pipeline.executed_paths("04_report", paths.runs_dir(slug)).values()
    out.append(paths.benchmarks_file(slug, "sweep_backends"))
    for name in pipeline.PER_SHAPE:
        out += pipeline.executed_paths(name, paths.runs_dir(slug) / shape).values()
    return out


def test_cpu_outputs_are_ignored_and_gpu_outputs_are_not(monkeypatch):
    """A CPU run of `make train` or `make reproduce` exercises the pipeline and is no GPU result:
    git ignores all it writes (and the GPU's results stay visible)."""
    from samu import paths
    from samu.experiment import training

    monkeypatch.setattr(paths, "DATA", paths.REPO_ROOT / "data")  # not SAMU_DATA_DIR's
    cpu = _outputs("cpu")
    assert training.result_path("cpu") == paths.REPO_ROOT / "data" / "training" / "cpu.json"
    assert [p for p in cpu if not _ignored(p)] == []
    gpu = [p for p in _outputs("nvidia-h200") if not p.name.startswith(".")]
    assert [p for p in gpu if _ignored(p)] == []


# --- no machine's folders in what is committed ---------------------------------------------------

# A path of some machine: an absolute POSIX path of two components at least ("/a/b"), or one under
# the home folder ("~/a"), starting a string or after whitespace or a delimiter; a URL's path
# follows its host, not a delimiter, and "B/s" or "rglru / samu" have no leading "/" name "/".
ABSOLUTE_PATH = re.compile(r"""(?:^|(?<=[\s"'(=,:;\[{<>`|]))(?:~|/[\w.+-]+)/[\w.+-]""")
# Folders that name a machine wherever they appear, and Windows' drive paths.
MACHINE_FOLDERS = re.compile(r"/(?:root|home|tmp|work|usr|opt|var|srv|mnt|Users)/"
                             r"|site-packages|dist-packages|\b[A-Za-z]:\\(?:Users|Windows)\b")
TEXT_SUFFIXES = (".ipynb", ".json", ".jsonl", ".txt", ".md")


def machine_paths(text: str) -> list[str]:
    """The machine paths in ``text`` (ABSOLUTE_PATH or MACHINE_FOLDERS), each with a little of
    its line around it."""
    found = []
    for line in text.splitlines():
        matches = [m for m in (ABSOLUTE_PATH.search(line), MACHINE_FOLDERS.search(line)) if m]
        if matches:
            first = min(matches, key=lambda m: m.start())
            found.append(line[max(first.start() - 30, 0):first.end() + 40])
    return found


@pytest.mark.parametrize("text", [
    "/root/x", "wrote /work/main/data/results/nvidia-h200/4x2048x2048.json",
    "{'root': '/usr/lib/python3.12', 'python': '3.12.3'}", 'progress_log = "/tmp/samu-1.log"',
    "(/srv/data/file)", "x=/data/results", "see ~/.cache/samu", "/tmp/x",
    "/opt/torch/.venv/lib/python3.12/site-packages/tqdm/auto.py:21: TqdmWarning",
    "File \x1b[0;32mlib/python3.12/site-packages/torch/nn/modules/module.py",
    "C:\\Users\\me\\samu", "[/mnt/d/x]", "`/proc/cpuinfo`",
])
def test_machine_paths_are_found(text):
    assert machine_paths(text), text


@pytest.mark.parametrize("text", [
    "https://github.com/owner/repo/blob/main/samu/paths.py",
    "See https://ipywidgets.readthedocs.io/en/stable/user_install.html",
    "http://localhost:8888/lab/tree/notebooks", "data/runs/nvidia-h200/05_training.ipynb",
    "notebooks/05_training.ipynb", "tqdm/auto.py:21: TqdmWarning: IProgress not found",
    "4.22 TB/s copy bandwidth", "10 B/element / median time", "RG-LRU / SAMU", "1/pairs",
    "tokens/s and ms/step", "<td>1.5</td></tr>", "a/b/c", "$\\sqrt{1-a_t^2}/2$", "-100 carries",
    "`samu/ops/common/scan.py`", "data/results/<gpu>/*.json", "(1, 128, D)/2", "/ 2",
])
def test_repository_paths_and_units_are_not_machine_paths(text):
    assert not machine_paths(text), machine_paths(text)


def _strings(node, where=""):
    """Every string of a JSON document (keys too) with where it is; image outputs (base64) are
    left out."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield f"{where}.{key} (key)", key
            if not str(key).startswith("image/"):
                yield from _strings(value, f"{where}.{key}")
    elif isinstance(node, list):
        if node and all(isinstance(v, str) for v in node):  # a notebook's lines of one text
            yield where, "".join(node)
        else:
            for i, value in enumerate(node):
                yield from _strings(value, f"{where}[{i}]")
    elif isinstance(node, str):
        yield where, node


def test_committed_data_and_notebooks_name_no_machine_folder():
    """Results, executed notebooks and notebooks are read on other machines: what they show names
    files relative to the repository (or by module), never this machine's folders."""
    import json
    from samu import paths

    listed = _git("ls-files", "-z", "--", "data", "notebooks")
    assert listed.returncode == 0, listed.stderr
    files = [f for f in listed.stdout.split("\0") if f.endswith(TEXT_SUFFIXES)]
    assert any(f.startswith("data/runs/") for f in files) and "notebooks/05_training.ipynb" in files
    found = []
    for name in files:
        path = paths.REPO_ROOT / name
        if not path.exists():  # deleted in the working tree, not yet in the index
            continue
        text = path.read_text(encoding="utf-8")
        if name.endswith((".ipynb", ".json")):
            pieces = _strings(json.loads(text))
        elif name.endswith(".jsonl"):  # the benchmarks' rows, a document a line
            pieces = [p for line in text.splitlines() if line.strip()
                      for p in _strings(json.loads(line))]
        else:
            pieces = [("", text)]
        found += [f"{name}{where}: {hit!r}" for where, piece in pieces
                  for hit in machine_paths(piece)]
    assert not found, "\n".join(found[:40])

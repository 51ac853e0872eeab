"""tools/make_notebooks.py keeps the notebooks' cells as one reviewable file: what it writes
is what is committed, so that neither drifts from the other."""
import os
import subprocess
import sys

from samu import paths


def test_the_generator_writes_the_committed_notebooks(tmp_path):
    env = dict(os.environ, SAMU_NOTEBOOKS_OUT=str(tmp_path))
    subprocess.run([sys.executable, str(paths.REPO_ROOT / "tools" / "make_notebooks.py")],
                   env=env, check=True, capture_output=True)
    committed = sorted(p.name for p in (paths.REPO_ROOT / "notebooks").glob("*.ipynb"))
    assert sorted(p.name for p in tmp_path.glob("*.ipynb")) == committed
    for name in committed:
        assert (tmp_path / name).read_bytes() == \
            (paths.REPO_ROOT / "notebooks" / name).read_bytes(), name


def test_help_and_unknown_arguments_write_nothing(tmp_path):
    env = dict(os.environ, SAMU_NOTEBOOKS_OUT=str(tmp_path))
    tool = str(paths.REPO_ROOT / "tools" / "make_notebooks.py")
    helped = subprocess.run([sys.executable, tool, "--help"], env=env, capture_output=True,
                            text=True)
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: python tools/make_notebooks.py [-h]")
    assert "Writes notebooks/*.ipynb" in helped.stdout
    for bad in (["--bogus"], ["notebooks"]):
        refused = subprocess.run([sys.executable, tool, *bad], env=env, capture_output=True,
                                 text=True)
        assert refused.returncode == 2
        assert f"unrecognized arguments: {bad[0]}" in refused.stderr
    assert list(tmp_path.iterdir()) == []


def test_every_notebook_has_one_parameters_cell_before_its_other_code():
    """papermill injects a run's values after the cell tagged "parameters": every notebook has
    exactly one, and it is the first code cell."""
    import nbformat
    for path in sorted((paths.REPO_ROOT / "notebooks").glob("*.ipynb")):
        code = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
        tagged = [i for i, c in enumerate(code) if "parameters" in c.metadata.get("tags", [])]
        assert tagged == [0], f"{path.name}: parameters cells at code cells {tagged}"

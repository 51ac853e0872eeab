"""Data locations: a relative SAMU_DATA_DIR means the same folder in every process."""
import os
import subprocess
import sys
from pathlib import Path


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

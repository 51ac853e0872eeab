"""The benchmarks are programs in benchmarks/, not a package: a test loads one by its path."""
import importlib.util

import pytest

from samu import paths


@pytest.fixture
def load_benchmark():
    def load(name):
        spec = importlib.util.spec_from_file_location(name, paths.REPO_ROOT / "benchmarks"
                                                      / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return load


@pytest.fixture
def rows_folder(tmp_path, monkeypatch):
    """A data folder of the test's own, where the rows go, and a commit to label them with."""
    monkeypatch.setattr(paths, "DATA", tmp_path / "data")
    monkeypatch.setenv("SAMU_GIT_COMMIT", "0123abc")
    return tmp_path / "data" / "benchmarks" / "cpu"

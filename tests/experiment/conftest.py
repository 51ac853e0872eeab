"""Fixtures shared by the experiment's tests."""
import pytest

from samu import paths


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """A scratch data folder for what a study or a report writes."""
    monkeypatch.setattr(paths, "DATA", tmp_path)
    monkeypatch.setenv("SAMU_DATA_DIR", str(tmp_path))
    return tmp_path

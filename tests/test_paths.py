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

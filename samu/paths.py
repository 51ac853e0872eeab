"""Repository-relative locations of every data file, whatever the working directory."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# Absolute from import on: the notebooks' kernels run in notebooks/, so a relative SAMU_DATA_DIR
# would name a different folder in each process (the pipeline exports this absolute path).
_data = os.environ.get("SAMU_DATA_DIR") or REPO_ROOT / "data"  # empty counts as unset
DATA = Path(os.path.abspath(os.path.expanduser(_data)))
PUBLISHED_H800_FILE = REPO_ROOT / "data" / "reference" / "h800_pcie_published_result.json"


def calibration_file(slug: str) -> Path:
    return DATA / "calibration" / f"{slug}.json"


def correctness_dir(slug: str) -> Path:
    return DATA / "correctness" / slug


def results_dir(slug: str) -> Path:
    return DATA / "results" / slug


def results_file(slug: str) -> Path:
    return DATA / "results" / f"{slug}.json"


def figures_dir() -> Path:
    return DATA / "figures"

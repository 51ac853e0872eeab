"""Repository-relative locations of every data file, whatever the working directory."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("SAMU_DATA_DIR", REPO_ROOT / "data"))
SEED_FILE = REPO_ROOT / "data" / "reference" / "000_cf73cb5e04ef014a.txt"


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

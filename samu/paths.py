"""Repository-relative locations of every data file, whatever the working directory.

Writers (the experiment) put a GPU's calibration at ``calibration_file(slug)``, under the data
folder.  Which calibration file ``backend="auto"`` *reads* is ``samu.dispatch.calibration_source``
(a directory the user names, else this data folder when samu runs from a checkout or
SAMU_DATA_DIR is set, else the copy packaged with samu: ``PACKAGED_CALIBRATION``).
"""
from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
# Absolute from import on: the notebooks' kernels run in notebooks/, so a relative SAMU_DATA_DIR
# would name a different folder in each process (the pipeline exports this absolute path).
_data = os.environ.get("SAMU_DATA_DIR") or REPO_ROOT / "data"  # empty counts as unset
DATA = Path(os.path.abspath(os.path.expanduser(_data)))
# Whether SAMU_DATA_DIR named the data folder (then its calibration/ is read even outside a
# checkout, so that what the experiment writes is what auto reads).
DATA_FROM_ENV = bool(os.environ.get("SAMU_DATA_DIR"))
# The GPU whose measurements the repository's data/ holds: what the report, the README and the
# notebooks show where this machine has none of its own.
COMMITTED_SLUG = "nvidia-h200"
PUBLISHED_H800_FILE = REPO_ROOT / "data" / "reference" / "h800_pcie_published_result.json"

# The calibration copy a wheel or sdist carries (setup.py copies data/calibration/*.json there,
# all but cpu.json); a checkout has no such folder and reads data/calibration/ instead.
PACKAGED_CALIBRATION = PACKAGE_DIR / "_calibration"
# The environment variable naming a calibration directory (samu.set_calibration_dir wins over it).
CALIBRATION_DIR_ENV = "SAMU_CALIBRATION_DIR"


def calibration_file(slug: str) -> Path:
    """Where the experiment writes (and merges into) a GPU's calibration: the data folder's."""
    return DATA / "calibration" / f"{slug}.json"


def in_checkout() -> bool:
    """Whether samu runs from its source checkout (an editable install included): the folder
    above the package holds this project's pyproject.toml and a data/ folder.  An installed
    wheel's folder above the package is site-packages, which holds neither."""
    return _is_checkout(REPO_ROOT)


@lru_cache(maxsize=None)
def _is_checkout(root: Path) -> bool:
    try:
        text = (root / "pyproject.toml").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    named = re.search(r'^\s*name\s*=\s*["\']samu["\']', text, re.MULTILINE) is not None
    return named and (root / "data").is_dir()


_ABSOLUTE: dict[str, Path] = {}  # a value of SAMU_CALIBRATION_DIR -> the folder it first named


def calibration_dir_from_env() -> Path | None:
    """The directory SAMU_CALIBRATION_DIR names (unset or empty: None).  A relative value is
    taken against the working directory when samu first sees that value, and keeps naming that
    folder afterwards, whatever the working directory becomes."""
    raw = os.environ.get(CALIBRATION_DIR_ENV)
    if not raw:
        return None
    if raw not in _ABSOLUTE:
        _ABSOLUTE[raw] = Path(os.path.abspath(os.path.expanduser(raw)))
    return _ABSOLUTE[raw]


def relative(path) -> str:
    """``path`` relative to the repository root when it lies inside it (what results, notebooks
    and messages show: the checkout's own folder differs between machines), else as given."""
    path = Path(path)
    return path.relative_to(REPO_ROOT).as_posix() if path.is_relative_to(REPO_ROOT) else str(path)


def correctness_dir(slug: str) -> Path:
    return DATA / "correctness" / slug


def results_dir(slug: str) -> Path:
    return DATA / "results" / slug


def results_file(slug: str) -> Path:
    return DATA / "results" / f"{slug}.json"


def figures_dir() -> Path:
    return DATA / "figures"


def runs_dir(slug: str) -> Path:
    """Where the executed notebooks of a GPU's runs go (per-shape ones in a folder per shape)."""
    return DATA / "runs" / slug


def training_file(slug: str) -> Path:
    """The training study's result document of a GPU (notebook 05, `make train`)."""
    return DATA / "training" / f"{slug}.json"


def benchmarks_file(slug: str, benchmark: str) -> Path:
    """The rows a benchmark (benchmarks/<benchmark>.py) appends on a GPU, one JSON line each
    (samu.experiment.benchmark_rows)."""
    return DATA / "benchmarks" / slug / f"{benchmark}.jsonl"


def measured_file(relative, slug: str | None,
                  committed_slug: str = COMMITTED_SLUG) -> tuple[Path | None, list]:
    """(the first file that exists, the slugs tried): ``relative(name)`` under the data folder,
    then under the repository's data folder, for ``slug`` and then for ``committed_slug`` (a
    scratch data folder, as nbval's, has none; nor has a GPU that was never timed)."""
    slugs = list(dict.fromkeys([slug or committed_slug, committed_slug]))
    for name in slugs:
        for root in (DATA, REPO_ROOT / "data"):
            path = root / relative(name)
            if path.is_file():
                return path, slugs
    return None, slugs

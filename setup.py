"""Build hook: a wheel or sdist carries the calibration files inside the package.

The canonical files stay in data/calibration/ (the experiment writes them there).  Building from
the checkout copies every data/calibration/*.json but cpu.json (a CPU run of the pipeline, no GPU
result) into samu/_calibration/ of the build (build_py) or of the sdist's tree (sdist); a wheel
built from that sdist then takes them as package data.  An editable install copies nothing: it
reads the checkout's data/calibration/ (samu.dispatch.calibration_source).
"""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent
CANONICAL = ROOT / "data" / "calibration"
PACKAGED = Path("samu") / "_calibration"
EXCLUDED = {"cpu.json"}


def calibration_files() -> list[Path]:
    if not CANONICAL.is_dir():  # building from an sdist: its samu/_calibration is package data
        return []
    return sorted(p for p in CANONICAL.glob("*.json")
                  if p.is_file() and not p.name.startswith(".") and p.name not in EXCLUDED)


def copy_calibration(base: Path) -> None:
    files = calibration_files()
    if not files:
        return
    target = base / PACKAGED
    if target.exists():
        shutil.rmtree(target)  # the canonical files, and only they
    target.mkdir(parents=True)
    for src in files:
        shutil.copyfile(src, target / src.name)


class BuildPy(build_py):
    def run(self):
        super().run()
        if not getattr(self, "editable_mode", False):
            copy_calibration(Path(self.build_lib))


class Sdist(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        copy_calibration(Path(base_dir))


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})

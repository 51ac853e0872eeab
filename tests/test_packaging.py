"""requirements.txt (what `make setup` installs) and pyproject.toml's extras (what `pip install
"samu[...]"` installs) ask for the same packages at the same versions."""
import pytest
from packaging.requirements import Requirement

from samu import paths


def requirements_txt() -> dict[str, Requirement]:
    lines = (paths.REPO_ROOT / "requirements.txt").read_text().splitlines()
    found = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    return {r.name: r for r in found}


def pyproject() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((paths.REPO_ROOT / "pyproject.toml").read_text())["project"]


def test_every_extra_asks_for_what_requirements_txt_installs():
    pinned = requirements_txt()
    for extra, wanted in pyproject()["optional-dependencies"].items():
        for text in wanted:
            want = Requirement(text)
            if want.name == "samu":  # another extra, checked as itself
                continue
            if extra == "lab" and want.name not in pinned:  # JupyterLab: make lab installs it
                continue
            got = pinned.get(want.name)
            assert got is not None, f"[{extra}] asks for {want.name}, requirements.txt does not"
            assert (got.specifier, str(got.marker)) == (want.specifier, str(want.marker)), \
                f"[{extra}] asks for {want}, requirements.txt pins {got}"


def test_the_interpret_extra_brings_the_interpreters_triton_and_numpy():
    names = {Requirement(text).name for text in pyproject()["optional-dependencies"]["interpret"]}
    assert names == {"triton", "numpy"}


def test_requirements_txt_holds_every_dependency():
    pinned = requirements_txt()
    for text in pyproject()["dependencies"]:
        assert Requirement(text).name in pinned, text

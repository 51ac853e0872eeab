"""Which calibration file backend="auto" reads (samu.dispatch.calibration_source), what a wheel
carries, and what `import samu` needs."""
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch

import samu
from samu import calibration_file, dispatch, paths
from samu.shapes import Shape

SLUG = "test-gpu"
CHUNK8, CHUNK16 = "fused_controller_hierarchical_chunk8", "fused_controller_hierarchical_chunk16"


def _doc(chosen: str) -> dict:
    return {"gpu": "Test GPU", "environment": {}, "shapes": {"1x8x16": {"samu": {
        "ranking": [chosen], "chosen": chosen,
        "backends": [{"backend": CHUNK8, "legal": True}, {"backend": CHUNK16, "legal": True}]}}}}


def _write(folder: Path, chosen: str, slug: str = SLUG) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{slug}.json"
    path.write_text(json.dumps(_doc(chosen)))
    return path


@pytest.fixture
def lookup(tmp_path, monkeypatch):
    """The default lookup with nothing named, the data folder and the packaged copy in tmp_path,
    each holding a file that chooses differently: {"data": ..., "packaged": ...} -> folder."""
    monkeypatch.delenv(paths.CALIBRATION_DIR_ENV, raising=False)
    monkeypatch.setattr(dispatch, "_USER_DIR", None)
    monkeypatch.setattr(paths, "DATA_FROM_ENV", False)
    monkeypatch.setattr(paths, "DATA", tmp_path / "data")
    monkeypatch.setattr(paths, "PACKAGED_CALIBRATION", tmp_path / "packaged")
    _write(tmp_path / "data" / "calibration", CHUNK8)
    _write(tmp_path / "packaged", CHUNK16)
    dispatch.forget_calibration()
    yield tmp_path
    dispatch.forget_calibration()


def _choice() -> str | None:
    return dispatch.calibrated_choice("samu", (1, 8, 16), SLUG)


def _not_a_checkout(monkeypatch, tmp_path):
    elsewhere = tmp_path / "site-packages"
    elsewhere.mkdir()
    monkeypatch.setattr(paths, "REPO_ROOT", elsewhere)
    dispatch.forget_calibration()


def test_the_checkout_reads_its_data_folder(lookup):
    assert paths.in_checkout()
    source = dispatch.calibration_source(SLUG)
    assert source == (lookup / "data" / "calibration" / f"{SLUG}.json", "checkout")
    assert _choice() == CHUNK8


def test_outside_a_checkout_the_packaged_copy_is_read(lookup, monkeypatch):
    _not_a_checkout(monkeypatch, lookup)
    assert not paths.in_checkout()
    assert dispatch.calibration_source(SLUG) == (lookup / "packaged" / f"{SLUG}.json",
                                                 "packaged")
    assert _choice() == CHUNK16


def test_samu_data_dir_names_the_data_folder_outside_a_checkout_too(lookup, monkeypatch):
    _not_a_checkout(monkeypatch, lookup)
    monkeypatch.setattr(paths, "DATA_FROM_ENV", True)
    dispatch.forget_calibration()
    assert dispatch.calibration_source(SLUG) == (lookup / "data" / "calibration" / f"{SLUG}.json",
                                                 "SAMU_DATA_DIR")
    assert _choice() == CHUNK8


@pytest.mark.parametrize("in_checkout", [True, False])
def test_a_named_directory_overrides_both_and_the_function_wins(lookup, monkeypatch, in_checkout):
    if not in_checkout:
        _not_a_checkout(monkeypatch, lookup)
    by_env = lookup / "by-env"
    by_call = lookup / "by-call"
    _write(by_env, CHUNK16)
    _write(by_call, CHUNK8)
    default = _choice()

    monkeypatch.setenv("SAMU_CALIBRATION_DIR", str(by_env))
    dispatch.forget_calibration()
    assert dispatch.calibration_source(SLUG) == (by_env / f"{SLUG}.json", "SAMU_CALIBRATION_DIR")
    assert _choice() == CHUNK16

    samu.set_calibration_dir(by_call)  # no forget_calibration needed: it drops the cache
    try:
        assert samu.calibration_source(SLUG) == (by_call / f"{SLUG}.json", "set_calibration_dir")
        assert _choice() == CHUNK8
    finally:
        samu.set_calibration_dir(None)
    assert dispatch.calibration_source(SLUG).origin == "SAMU_CALIBRATION_DIR"
    assert _choice() == CHUNK16

    monkeypatch.delenv("SAMU_CALIBRATION_DIR")
    dispatch.forget_calibration()
    assert dispatch.calibration_source(SLUG).origin == ("checkout" if in_checkout else "packaged")
    assert _choice() == default


def test_a_named_directory_without_the_file_means_no_calibrated_choice(lookup, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    samu.set_calibration_dir(empty)
    try:
        assert _choice() is None  # the data folder's file is not tried after it
    finally:
        samu.set_calibration_dir(None)
    assert _choice() == CHUNK8


def test_set_calibration_dir_refuses_a_missing_directory(lookup, tmp_path):
    with pytest.raises(NotADirectoryError, match="no-such-dir"):
        samu.set_calibration_dir(tmp_path / "no-such-dir")
    assert dispatch.calibration_source(SLUG).origin == "checkout"


def test_a_relative_environment_value_keeps_naming_one_folder(lookup, monkeypatch):
    first, second = lookup / "first", lookup / "second"
    _write(first / "cal", CHUNK16)
    second.mkdir()
    monkeypatch.chdir(first)
    monkeypatch.setenv("SAMU_CALIBRATION_DIR", "cal")
    dispatch.forget_calibration()
    assert dispatch.calibration_source(SLUG).path == first / "cal" / f"{SLUG}.json"
    monkeypatch.chdir(second)
    dispatch.forget_calibration()
    assert dispatch.calibration_source(SLUG).path == first / "cal" / f"{SLUG}.json"
    assert _choice() == CHUNK16


def test_errors_name_the_file_wherever_it_is(lookup, monkeypatch):
    _not_a_checkout(monkeypatch, lookup)
    broken = lookup / "packaged" / f"{SLUG}.json"
    broken.write_text("{")
    with pytest.raises(dispatch.CalibrationFileError, match="not valid JSON") as info:
        _choice()
    assert str(broken) in str(info.value)


def test_the_directory_is_looked_up_once_per_recheck(lookup, monkeypatch):
    calls = []
    real = dispatch.calibration_source
    monkeypatch.setattr(dispatch, "calibration_source", lambda slug=None: calls.append(slug)
                        or real(slug))
    monkeypatch.setattr(dispatch, "RECHECK_SECONDS", 3600.0)
    for _ in range(50):
        assert _choice() == CHUNK8
        assert dispatch.calibrated_choice("samu", (1, 8, 16), "uncalibrated-gpu") is None
    assert calls == [SLUG, "uncalibrated-gpu"]  # a missing file is remembered as well
    samu.set_calibration_dir(lookup / "packaged")
    try:
        assert _choice() == CHUNK16
    finally:
        samu.set_calibration_dir(None)
    assert calls == [SLUG, "uncalibrated-gpu", SLUG]
    monkeypatch.setattr(dispatch, "RECHECK_SECONDS", 0.0)
    _choice()
    _choice()
    assert len(calls) == 5


def test_a_file_that_appears_is_read_at_the_next_recheck(lookup, monkeypatch):
    assert dispatch.calibrated_choice("samu", (1, 8, 16), "late-gpu") is None
    _write(lookup / "data" / "calibration", CHUNK16, slug="late-gpu")
    monkeypatch.setattr(dispatch, "RECHECK_SECONDS", 0.0)
    assert dispatch.calibrated_choice("samu", (1, 8, 16), "late-gpu") == CHUNK16


@pytest.mark.parametrize("thing", ["missing", "a regular file"])
def test_a_named_directory_that_is_none_is_refused_by_the_variable_as_by_the_function(
        lookup, monkeypatch, thing):
    """SAMU_CALIBRATION_DIR naming no directory meant "no calibration" in silence while
    set_calibration_dir refused the same path: both refuse it, with one message."""
    named = lookup / "named"
    if thing == "a regular file":
        named.write_text("{}")
    with pytest.raises(NotADirectoryError) as by_call:
        samu.set_calibration_dir(named)
    monkeypatch.setenv("SAMU_CALIBRATION_DIR", str(named))
    dispatch.forget_calibration()
    with pytest.raises(NotADirectoryError) as by_env:
        dispatch.calibration_source(SLUG)
    with pytest.raises(NotADirectoryError):
        _choice()
    with pytest.raises(NotADirectoryError):  # this process's GPU, or none: refused all the same
        dispatch.calibration_source()
    assert str(by_env.value) == str(by_call.value).replace("set_calibration_dir",
                                                           "SAMU_CALIBRATION_DIR")
    assert str(named) in str(by_env.value)
    named.unlink(missing_ok=True)
    named.mkdir()
    dispatch.forget_calibration()
    assert dispatch.calibration_source(SLUG).path == named / f"{SLUG}.json"
    assert _choice() is None


def test_a_failing_file_is_parsed_once_until_it_changes(lookup, monkeypatch):
    """A file that fails its checks is not parsed again on every look-up (a large one took
    seconds each): its error is remembered until the file's stamp changes."""
    broken = lookup / "data" / "calibration" / f"{SLUG}.json"
    broken.write_text('{"shapes": 1}')
    reads = []
    real = calibration_file.read
    monkeypatch.setattr(calibration_file, "read", lambda path: reads.append(path) or real(path))
    monkeypatch.setattr(dispatch, "RECHECK_SECONDS", 0.0)
    for _ in range(5):
        with pytest.raises(dispatch.CalibrationFileError, match="'shapes' must be an object"):
            _choice()
    assert len(reads) == 1
    _write(lookup / "data" / "calibration", CHUNK16)  # changed: read again, and used
    assert _choice() == CHUNK16 and len(reads) == 2


HUGE = "z" * 2_000_000


@pytest.mark.parametrize("where", ["chosen", "ranking", "backend", "settings", "mixer", "shape",
                                   "repeated key", "tolerance"])
def test_a_hostile_file_is_refused_in_a_short_message(lookup, where):
    """A value of megabytes is echoed in a few characters (the message stays short), and the
    message still names the file and the field."""
    doc = _doc(CHUNK8)
    entry = doc["shapes"]["1x8x16"]["samu"]
    if where == "chosen":
        entry["chosen"] = HUGE
    elif where == "ranking":
        entry["ranking"] = [HUGE]
    elif where == "backend":
        entry["backends"][0]["backend"] = HUGE
    elif where == "settings":
        entry["backends"][0]["settings"] = {"chunk": HUGE, "warps": list(range(10**5))}
    elif where == "mixer":
        doc["shapes"]["1x8x16"] = {HUGE: entry}
    elif where == "shape":
        doc["shapes"] = {HUGE: {"samu": entry}}
    elif where == "tolerance":
        entry["memory_tolerance"] = HUGE
    text = json.dumps(doc)
    if where == "repeated key":
        text = text[:-1] + f', "{HUGE}": 1, "{HUGE}": 2}}'
    path = lookup / "data" / "calibration" / f"{SLUG}.json"
    path.write_text(text)
    with pytest.raises(dispatch.CalibrationFileError) as info:
        _choice()
    message = str(info.value)
    assert str(path) in message and "zzzz" in message
    assert len(message) < len(str(path)) + 600, message


def test_a_file_too_large_or_with_an_unconvertible_number_is_refused(lookup, monkeypatch):
    path = lookup / "data" / "calibration" / f"{SLUG}.json"
    monkeypatch.setattr(calibration_file, "MAX_FILE_BYTES", 8192)
    monkeypatch.setattr(dispatch, "RECHECK_SECONDS", 0.0)
    path.write_text(json.dumps({**_doc(CHUNK8), "padding": "p" * 9000}))
    with pytest.raises(dispatch.CalibrationFileError, match="larger than 8192 bytes"):
        _choice()
    path.write_text('{"gpu": ' + "9" * 5000 + "}")  # more digits than Python converts
    with pytest.raises(dispatch.CalibrationFileError, match="not a calibration file's JSON"):
        _choice()


def test_without_cuda_the_source_says_auto_reads_no_file(lookup, monkeypatch):
    """In an installed wheel on a CPU, calibration_source() named samu/_calibration/cpu.json,
    which no wheel holds and auto never reads: without CUDA it says that auto reads no file."""
    _not_a_checkout(monkeypatch, lookup)
    source = samu.calibration_source()
    if torch.cuda.is_available():
        assert source.path.name == f"{dispatch.gpu_slug()}.json"
    else:
        assert source == (None, dispatch.NO_CUDA)
        assert "no calibration file" in source.origin
    assert dispatch.calibration_source(SLUG).path == lookup / "packaged" / f"{SLUG}.json"


# --- what a wheel and an sdist carry ---------------------------------------------------------

def _copy_of_the_checkout(dest: Path) -> Path:
    root = paths.REPO_ROOT
    dest.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(root / name, dest / name)
    shutil.copytree(root / "samu", dest / "samu",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_calibration"))
    (dest / "data" / "calibration").mkdir(parents=True)
    for path in (root / "data" / "calibration").glob("*.json"):
        shutil.copy2(path, dest / "data" / "calibration" / path.name)
    (dest / "data" / "calibration" / "cpu.json").write_text("{}")  # a CPU run: never packaged
    return dest


def _canonical() -> dict[str, bytes]:
    return {p.name: p.read_bytes()
            for p in sorted((paths.REPO_ROOT / "data" / "calibration").glob("*.json"))
            if p.name != "cpu.json"}


def test_a_wheel_carries_the_calibration_files(tmp_path):
    pytest.importorskip("setuptools")
    src = _copy_of_the_checkout(tmp_path / "src")
    out = tmp_path / "wheels"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "--no-index", "-q", "-w", str(out), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = out.glob("samu-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        packaged = {n.rsplit("/", 1)[1]: z.read(n) for n in names
                    if n.startswith("samu/_calibration/")}
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    canonical = _canonical()
    assert "nvidia-h200.json" in canonical
    assert packaged == canonical  # byte-identical, cpu.json left out
    assert {"samu/ops/common/launching.py", "samu/experiment/schema.py"} <= names
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    plain = [line for line in requires if "extra ==" not in line]
    assert [line.split()[1].split(">")[0].split(";")[0] for line in plain] == ["torch", "triton"]
    assert any(line.startswith("Requires-Dist: jsonschema") and 'extra == "experiment"' in line
               for line in requires)


def test_an_sdist_carries_them_inside_the_package(tmp_path):
    pytest.importorskip("setuptools")
    src = _copy_of_the_checkout(tmp_path / "src")
    out = tmp_path / "sdist"
    script = ("import sys; from setuptools import build_meta; "
              "print(build_meta.build_sdist(sys.argv[1]))")
    done = subprocess.run([sys.executable, "-c", script, str(out)], cwd=src,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (sdist,) = out.glob("samu-*.tar.gz")
    with tarfile.open(sdist) as tar:
        packaged = {m.name.rsplit("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers()
                    if m.isfile() and "/samu/_calibration/" in m.name}
    assert packaged == _canonical()


# --- what `import samu` needs -----------------------------------------------------------------

BLOCK_TRITON = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
"""

# numpy as if not installed: torch's probes of it find a spec, importing it fails (Triton's
# interpreter imports it when the first kernel is decorated).
BLOCK_NUMPY = """
import importlib.abc, importlib.machinery, sys
class Block(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" or name.startswith("numpy."):
            return importlib.machinery.ModuleSpec(name, self)
    def create_module(self, spec):
        raise ModuleNotFoundError(f"No module named {spec.name!r}", name=spec.name)
    def exec_module(self, module):
        pass
sys.meta_path.insert(0, Block())
"""

# Every way of asking for a Triton backend says why there is none; the references still run.
ASK_FOR_TRITON = """
import io, warnings, torch, samu
from samu import backends, dispatch
def error(call):
    try:
        call()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"
x = torch.randn(1, 4, 16)
name = backends.DEFAULTS["samu"]
print("BY NAME", error(lambda: samu.SAMU(16, backend=name)))
print("AUTO", error(lambda: dispatch.resolve("samu", x, "auto")))
print("AUTO MODULE", error(lambda: samu.SAMU(16)(x)))
out = io.StringIO()
backends.describe(file=out)
print("DESCRIBE", out.getvalue().splitlines()[0])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    backends.explanations()
print("EXPLANATIONS", "; ".join(str(w.message) for w in caught))
print("REASON", backends.triton_unavailable())
m = samu.SAMU(16, backend="reference_chunked")
m(x)
print("REFERENCE", m.last_backend)
"""


def _run_without(blocker: str, interpret: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    done = subprocess.run([sys.executable, "-c", blocker + ASK_FOR_TRITON], env=env,
                          capture_output=True, text=True, timeout=300, cwd=paths.REPO_ROOT)
    assert done.returncode == 0, done.stderr
    said = {}
    for line in done.stdout.splitlines():
        for label in ("BY NAME", "AUTO MODULE", "AUTO", "DESCRIBE", "EXPLANATIONS", "REASON",
                      "REFERENCE"):
            if line.startswith(label + " "):
                said[label] = line[len(label) + 1:]
                break
    return said


@pytest.mark.parametrize("missing", ["numpy", "triton"])
def test_without_what_the_triton_backends_need_every_request_for_one_says_why(missing):
    said = _run_without(BLOCK_NUMPY if missing == "numpy" else BLOCK_TRITON, interpret=True)
    why = ("Triton's interpreter (TRITON_INTERPRET=1) needs numpy: pip install numpy"
           if missing == "numpy" else "triton is not installed")
    assert why in said["REASON"]
    for label in ("BY NAME", "AUTO", "AUTO MODULE"):
        assert said[label].startswith("RuntimeError: samu: "), (label, said[label])
        assert f"the Triton backends could not be loaded: {why}" in said[label], said[label]
    assert CHUNK16 in said["BY NAME"] and "'reference_chunked'" in said["AUTO"]
    assert said["DESCRIBE"].startswith(f"Triton backends unavailable: {why}")
    assert f"the Triton backends could not be loaded: {why}" in said["EXPLANATIONS"]
    assert said["REFERENCE"] == "reference_chunked"

IMPORT_SAMU = """
import sys, torch
import samu
# (not tqdm: torch.hub imports it whenever it is installed)
heavy = sorted(m for m in ("jsonschema", "pandas", "matplotlib", "seaborn", "papermill",
                           "nbformat", "nbclient") if m in sys.modules)
assert not heavy, heavy
m = samu.SAMU(16)
m(torch.randn(1, 4, 16, dtype=torch.float64))
print(sorted(samu.backends.available("samu")), "triton" in sys.modules, m.last_backend)
"""


@pytest.mark.parametrize("triton", ["present", "absent"])
def test_import_samu_needs_neither_the_experiment_nor_triton(triton):
    script = (BLOCK_TRITON if triton == "absent" else "") + IMPORT_SAMU
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300, cwd=paths.REPO_ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "reference_chunked"
    if triton == "absent":
        assert done.stdout.startswith("['reference_chunked', 'reference_sequential'] False")


def test_an_uncalibrated_shape_takes_the_nearest_calibrated_choice(tmp_path, monkeypatch):
    """No cliff: a shape the file lacks gets the choice of the nearest shape of the same width
    (tokens in log space), and a width the file lacks the nearest width's."""
    def entry(name):
        return {"ranking": [name], "chosen": name, "backends": [{"backend": name, "legal": True}]}
    c8, c16, c32 = (f"fused_controller_hierarchical_chunk{c}" for c in (8, 16, 32))
    doc = {"gpu": "test", "environment": {}, "shapes": {
        "1x32768x2048": {"samu": entry(c8)}, "4x2048x2048": {"samu": entry(c16)},
        "1x8192x4096": {"samu": entry(c32)}}}
    (tmp_path / "test-gpu.json").write_text(json.dumps(doc))
    dispatch.set_calibration_dir(tmp_path)
    try:
        assert dispatch.calibrated_choice("samu", (1, 32768, 2048), "test-gpu") == c8  # exact
        assert dispatch.calibrated_choice("samu", (2, 16384, 2048), "test-gpu") == c8
        assert dispatch.calibrated_choice("samu", (1, 4096, 2048), "test-gpu") == c16
        assert dispatch.calibrated_choice("samu", (1, 8192, 3072), "test-gpu") == c32
        assert dispatch.calibrated_choice("rglru", (1, 8192, 3072), "test-gpu") is None
    finally:
        dispatch.set_calibration_dir(None)


def test_a_shape_that_chose_nothing_never_takes_a_neighbour_choice_it_records_as_illegal(
        tmp_path):
    """An entry with chosen null (no backend legal there) takes the nearest shape's choice only
    where its own entry does not record that backend as illegal, else the next nearest one's,
    else none, and so does a shape whose nearest entry it is; at equal distance the larger
    shape's choice wins."""
    c8, c16, c32 = (f"fused_controller_hierarchical_chunk{c}" for c in (8, 16, 32))

    def entry(chosen, legal=(), illegal=()):
        return {"ranking": list(legal), "chosen": chosen,
                "backends": [{"backend": n, "legal": True} for n in legal]
                + [{"backend": n, "legal": False} for n in illegal]}
    doc = {"gpu": "test", "environment": {}, "shapes": {
        "1x1024x2048": {"samu": entry(c16, legal=[c16])},
        "1x4096x2048": {"samu": entry(c8, legal=[c8])},        # as near as 1x1024, larger
        "1x2048x2048": {"samu": entry(None, illegal=[c8])},    # c8 illegal here
        "1x2048x1024": {"samu": entry(None, illegal=[c8, c16])},
        "1x2048x4096": {"samu": entry(None, illegal=[c32])}}}
    (tmp_path / "test-gpu.json").write_text(json.dumps(doc))
    dispatch.set_calibration_dir(tmp_path)
    try:
        assert dispatch.calibrated_choice("samu", (1, 2048, 2048), "test-gpu") == c16
        for nearby in ((2, 1024, 2048), (1, 2049, 2048), (1, 1900, 2048)):
            assert dispatch.calibrated_choice("samu", nearby, "test-gpu") == c16
        assert dispatch.calibrated_choice("samu", (1, 3500, 2048), "test-gpu") == c8
        assert dispatch.calibrated_choice("samu", (1, 2048, 1024), "test-gpu") is None
        assert dispatch.calibrated_choice("samu", (1, 2048, 4096), "test-gpu") == c8  # the tie
        assert dispatch.calibrated_choice("samu", (1, 2048, 8192), "test-gpu") == c8  # no entry
    finally:
        dispatch.set_calibration_dir(None)


@pytest.mark.parametrize("ratio", [2, 3, 5, 7, 10])
def test_an_exact_tie_goes_to_the_larger_shape(ratio):
    """At the geometric midpoint of two entries (in tokens, or in width) the distances are equal
    in exact arithmetic, whatever their last bits say: the larger shape wins."""
    near_tokens = {("samu", (1, 64, 1024)): "small", ("samu", (1, 64 * ratio**2, 1024)): "large"}
    assert dispatch.nearest_entry(near_tokens, "samu", (1, 64 * ratio, 1024)) == \
        (1, 64 * ratio**2, 1024)
    near_widths = {("samu", (1, 2048, 8)): "small", ("samu", (1, 2048, 8 * ratio**2)): "large"}
    assert dispatch.nearest_entry(near_widths, "samu", (1, 2048, 8 * ratio)) == \
        (1, 2048, 8 * ratio**2)


def _refused_entry(tmp_path, shape_key: str, mixer: str, entry: dict, words: str) -> None:
    """A file holding ``entry`` alone is refused at its own shape with ``words``."""
    doc = {"gpu": "test", "environment": {}, "shapes": {shape_key: {mixer: entry}}}
    (tmp_path / "test-gpu.json").write_text(json.dumps(doc))
    dispatch.set_calibration_dir(tmp_path)
    try:
        with pytest.raises(dispatch.CalibrationFileError,
                           match=f"{shape_key}, mixer {mixer}: {words}"):
            dispatch.calibrated_choice(mixer, Shape.parse(shape_key), "test-gpu")
    finally:
        dispatch.set_calibration_dir(None)


def test_a_backend_recorded_twice_in_an_entry_is_refused(tmp_path):
    c16 = "fused_controller_hierarchical_chunk16"
    _refused_entry(tmp_path, "1x2048x2048", "samu", {
        "ranking": [c16], "chosen": c16,
        "backends": [{"backend": c16, "legal": False}, {"backend": c16, "legal": True}]},
        f"backends\\[1\\] records '{c16}' again")


def test_a_file_naming_a_backend_that_no_longer_exists_is_refused_naming_it(tmp_path):
    """A file calibrated before a backend was removed is refused, not read around: its
    choices were ranked among backends that no longer run (recalibrate)."""
    gemm8 = "gemm_fused_hierarchical_chunk8"
    gone = "fused_gates_hierarchical_chunk16"
    _refused_entry(tmp_path, "1x4096x2560", "rglru", {
        "ranking": [gone, gemm8], "chosen": gone,
        "backends": [{"backend": gone, "legal": True}, {"backend": gemm8, "legal": True}]},
        f"ranking name '{gone}' is not a registered backend")

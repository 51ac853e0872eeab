import copy
import json
import os
import subprocess
import sys

import pytest
import torch

import samu
from samu import _runtime, backends, dispatch, mixers, paths
from samu.experiment import schema
from samu.functional import FUNCTIONS


def test_every_backend_is_explained():
    described = backends.explanations()
    for mixer in mixers.names():
        names = backends.available(mixer)
        assert {"reference_sequential", "reference_chunked"} <= set(names)
        assert sum(backends.REGISTRY[mixer][n].kind == "triton" for n in names) >= 2
        for name in names:
            assert len(described[mixer][name].split(" | ")) == len(name.split("_"))


def test_every_word_of_the_vocabulary_names_a_backend():
    """A word no registered backend uses is an explanation of nothing."""
    used = {w.rstrip("0123456789") for named in backends.REGISTRY.values() for n in named
            for w in n.split("_")}
    assert set(backends.VOCABULARY) == used


def test_unknown_word_is_refused():
    with pytest.raises(ValueError, match="unknown word 'warp'"):
        backends.explain("fused_warp_chunk16")


def test_matching_takes_one_word_as_a_str_and_refuses_an_unknown_kind():
    every = backends.matching("samu")
    word = every[0].split("_")[0]
    assert backends.matching("samu", word) == backends.matching("samu", [word]) != []
    assert backends.matching("samu", kind="reference") == [
        n for n in backends.available("samu") if backends.REGISTRY["samu"][n].kind == "reference"]
    with pytest.raises(ValueError, match=r"unknown backend kind 'triotn'; choose one of"):
        backends.matching("samu", kind="triotn")
    with pytest.raises(TypeError, match="a backend name is a str, got NoneType"):
        backends.explain(None)


def test_auto_without_cuda(monkeypatch):
    # The flag is read once at import (the kernels are built for it); patch it, not the env.
    x = torch.randn(1, 4, 16)
    monkeypatch.setattr(_runtime, "INTERPRETING", False)
    assert dispatch.resolve("samu", x).name == "reference_chunked"
    monkeypatch.setattr(_runtime, "INTERPRETING", True)
    assert dispatch.resolve("samu", x).name == backends.DEFAULTS["samu"]
    assert dispatch.resolve("rglru", x.double()).name == "reference_chunked"


def test_triton_backend_refuses_what_it_cannot_run(monkeypatch):
    monkeypatch.setattr(_runtime, "INTERPRETING", False)
    with pytest.raises(RuntimeError, match="needs a CUDA tensor"):
        dispatch.resolve("samu", torch.randn(1, 4, 16), backends.DEFAULTS["samu"])
    with pytest.raises(TypeError, match="not float64"):
        dispatch.resolve("samu", torch.randn(1, 4, 16).double(), backends.DEFAULTS["samu"])


def test_triton_interpret_changed_after_import_is_refused(monkeypatch):
    flipped = "0" if _runtime.TRITON_INTERPRET_AT_IMPORT == "1" else "1"
    monkeypatch.setenv("TRITON_INTERPRET", flipped)
    x = torch.randn(1, 4, 16)
    for backend in ("auto", backends.DEFAULTS["samu"]):
        with pytest.raises(RuntimeError, match="changed after samu was imported"):
            dispatch.resolve("samu", x, backend)
    # A reference backend asked for by name does not depend on the flag.
    assert dispatch.resolve("samu", x, "reference_chunked").name == "reference_chunked"


CHANGE_AFTER_IMPORT = """
import os, torch, samu
samu.SAMU(16)(torch.randn(1, 4, 16))
os.environ["TRITON_INTERPRET"] = "1"
try:
    samu.SAMU(16)(torch.randn(1, 4, 16))
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}")
else:
    print("no error")
"""


def test_triton_interpret_set_after_import_in_a_fresh_interpreter():
    # Before the flag was read once, this ran the kernels outside the interpreter on CPU
    # tensors: "AssertionError: Torch not compiled with CUDA enabled".
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", CHANGE_AFTER_IMPORT], env=env,
                          capture_output=True, text=True, timeout=300, cwd=paths.REPO_ROOT)
    assert done.returncode == 0, done.stderr
    out = done.stdout.strip()
    assert out.startswith("RuntimeError: TRITON_INTERPRET was changed after samu was imported")
    assert "before `import samu`" in out and "restart" in out


def _calibration_doc() -> dict:
    chunk8, chunk16 = "fused_controller_hierarchical_chunk8", "fused_controller_hierarchical_chunk16"
    return {"gpu": "Test GPU", "environment": {}, "shapes": {"1x8x16": {
        "samu": {"ranking": [chunk8, chunk16], "chosen": chunk8,
                 "backends": [{"backend": chunk8, "legal": True},
                              {"backend": chunk16, "legal": True},
                              {"backend": "reference_chunked", "legal": False}]},
        "rglru": {"ranking": [], "chosen": None, "backends": []}}}}


def _write(doc, slug="test-gpu"):
    schema.write_json_atomic(paths.calibration_file(slug), doc, kind=None)
    dispatch.forget_calibration()


def test_calibrated_choice_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    doc = _calibration_doc()
    _write(doc)
    assert dispatch.calibrated_choice("samu", (1, 8, 16), "test-gpu") == \
        "fused_controller_hierarchical_chunk8"
    # (1, 9, 16) is not in the file: the nearest calibrated shape's choice
    assert dispatch.calibrated_choice("samu", (1, 9, 16), "test-gpu") == \
        dispatch.calibrated_choice("samu", (1, 8, 16), "test-gpu")
    assert dispatch.calibrated_choice("rglru", (1, 8, 16), "test-gpu") is None  # chosen: null
    # A rewritten file is picked up once its writer calls forget_calibration (merge_calibration
    # does) or once RECHECK_SECONDS passed.
    doc["shapes"]["1x8x16"]["samu"]["chosen"] = "fused_controller_hierarchical_chunk16"
    schema.write_json_atomic(paths.calibration_file("test-gpu"), doc, kind="calibration")
    monkeypatch.setattr(dispatch, "RECHECK_SECONDS", 0.0)
    assert dispatch.calibrated_choice("samu", (1, 8, 16), "test-gpu") == \
        "fused_controller_hierarchical_chunk16"


def _samu_entry(doc):
    return doc["shapes"]["1x8x16"]["samu"]


def _set(field, value):
    def mutate(doc):
        _samu_entry(doc)[field] = value
    return mutate


def _mark_illegal(doc):
    _samu_entry(doc)["backends"][0]["legal"] = False


def _unlist_chosen(doc):
    del _samu_entry(doc)["backends"][0]


def _rename_shape(key):
    def mutate(doc):
        doc["shapes"][key] = doc["shapes"].pop("1x8x16")
    return mutate


def _add_shape(key):
    def mutate(doc):
        doc["shapes"][key] = copy.deepcopy(doc["shapes"]["1x8x16"])
    return mutate


def _add_mixer(doc):
    doc["shapes"]["1x8x16"]["mamba"] = copy.deepcopy(_samu_entry(doc))


def _unknown_in_backends(doc):
    _samu_entry(doc)["backends"].append({"backend": "fused_warp", "legal": False})


def _other_settings(doc):
    _samu_entry(doc)["backends"][0]["settings"] = "0123456789ab"


# (how the file is broken, what the message must name besides the file)
BROKEN = {
    "chosen under other launch settings": (
        _other_settings, ["shape 1x8x16", "mixer samu", "calibrated with launch settings "
                          "0123456789ab", "recalibrate"]),
    "unknown chosen": (_set("chosen", "bogus_backend"),
                       ["shape 1x8x16", "mixer samu", "'bogus_backend' is not a registered"]),
    "empty chosen": (_set("chosen", ""), ["shape 1x8x16", "mixer samu",
                                          "chosen '' is not a registered"]),
    "reference chosen": (_set("chosen", "reference_sequential"),
                         ["shape 1x8x16", "mixer samu", "is a reference backend"]),
    "illegal chosen": (_mark_illegal, ["shape 1x8x16", "mixer samu", "records it as illegal"]),
    "unrecorded chosen": (_unlist_chosen, ["shape 1x8x16", "mixer samu",
                                           "does not record it"]),
    "letters in a shape key": (_add_shape("axbxc"), ["shape key 'axbxc'"]),
    "underscore in a shape key": (_rename_shape("1x1_6x16"), ["shape key '1x1_6x16'"]),
    "zero in a shape key": (_rename_shape("0x8x16"), ["shape key '0x8x16'"]),
    "two dimensions": (_rename_shape("8x16"), ["shape key '8x16'"]),
    "unknown mixer": (_add_mixer, ["shape 1x8x16", "mixer mamba", "unknown mixer"]),
    "unknown name in backends": (_unknown_in_backends,
                                 ["mixer samu", "backends[3].backend 'fused_warp'"]),
    "no backends list": (lambda doc: _samu_entry(doc).pop("backends"),
                         ["mixer samu", "lacks 'backends'"]),
    "a list chosen": (_set("chosen", ["fused_controller_hierarchical_chunk8"]),
                      ["shape 1x8x16", "mixer samu",
                       "'chosen' must be a backend name or null, got list"]),
    "two spellings of one shape": (_add_shape("1X8X16"),
                                   ["shape keys '1x8x16' and '1X8X16' name one shape"]),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_calibration_file_is_refused_naming_file_and_entry(tmp_path, monkeypatch, case):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    mutate, wanted = BROKEN[case]
    doc = _calibration_doc()
    mutate(doc)
    _write(doc)
    with pytest.raises(dispatch.CalibrationFileError) as info:
        dispatch.calibrated_choice("samu", (1, 8, 16), "test-gpu")
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert str(paths.calibration_file("test-gpu")) in message
    for part in wanted:
        assert part in message


def test_truncated_calibration_file_is_refused_then_reread_once_fixed(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    path = paths.calibration_file("test-gpu")
    path.parent.mkdir(parents=True)
    text = json.dumps(_calibration_doc(), indent=2)
    path.write_text(text[: len(text) // 2])
    dispatch.forget_calibration()
    with pytest.raises(dispatch.CalibrationFileError, match="not valid JSON") as info:
        dispatch.calibrated_choice("samu", (1, 8, 16), "test-gpu")
    assert str(path) in str(info.value)
    # A refused file is not cached: the fixed file is read on the next look-up.
    path.write_text(text)
    monkeypatch.setattr(dispatch, "RECHECK_SECONDS", 0.0)
    assert dispatch.calibrated_choice("samu", (1, 8, 16), "test-gpu") == \
        "fused_controller_hierarchical_chunk8"


def _nested_too_deeply(path):
    depth = 100_000  # far past the interpreter's recursion limit
    path.write_text('{"gpu": "G", "environment": {}, "shapes": {}, "notes": '
                    + "[" * depth + "]" * depth + "}")


def _a_key_twice(path):
    entry = json.dumps(_calibration_doc()["shapes"]["1x8x16"])
    path.write_text('{"gpu": "G", "environment": {}, "shapes": {"1x8x16": ' + entry
                    + ', "1x8x16": ' + entry + '}}')


# (what is at the file's path, what the message must say besides the file)
UNREADABLE = {
    "nested too deeply": (_nested_too_deeply, "nested too deeply"),
    "a key twice": (_a_key_twice, "the key '1x8x16' appears twice in one object"),
    "a directory": (lambda path: path.mkdir(), "cannot be read as a calibration file: a "
                                               "directory"),
    "a symlink loop": (lambda path: path.symlink_to(path.name), "cannot be read as a "
                                                                 "calibration file"),
}


@pytest.mark.parametrize("case", list(UNREADABLE))
def test_an_unreadable_calibration_file_is_refused_naming_the_file(tmp_path, monkeypatch, case):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    path = paths.calibration_file("test-gpu")
    path.parent.mkdir(parents=True)
    make, wanted = UNREADABLE[case]
    make(path)
    dispatch.forget_calibration()
    for _ in range(2):  # not cached: every look-up says so until the file is fixed
        with pytest.raises(dispatch.CalibrationFileError) as info:
            dispatch.calibrated_choice("samu", (1, 8, 16), "test-gpu")
        assert str(path) in str(info.value) and wanted in str(info.value)


def test_committed_calibration_files_pass_the_checks():
    files = sorted((paths.REPO_ROOT / "data" / "calibration").glob("*.json"))
    assert files
    for path in files:
        choices = dispatch.check_calibration(schema.read_json(path), path)
        assert choices and all(c is None or backends.REGISTRY[m][c].kind == "triton"
                               for (m, _), c in choices.items())


def test_gpu_slug():
    assert dispatch.gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert dispatch.gpu_slug("NVIDIA H800 PCIe") == "nvidia-h800-pcie"


def test_describe_prints_every_backend_and_word(capsys):
    backends.describe()
    out = capsys.readouterr().out
    for mixer in mixers.names():
        for name in backends.available(mixer):
            assert name in out
            for word in name.split("_"):
                assert f"  {word.rstrip('0123456789')}" in out


REGISTRY_AFTER_IMPORT = """
import samu
config = samu.backends.REGISTRY["samu"][samu.backends.DEFAULTS["samu"]].config
assert config is not None and config.name == samu.backends.DEFAULTS["samu"], config
registry = samu.backends.REGISTRY
assert "rglru" in registry and len(registry) == 2 and sorted(registry) == ["rglru", "samu"]
assert samu.backends.DEFAULTS["rglru"] in registry.get("rglru")
assert sorted(registry.keys()) == ["rglru", "samu"] and len(list(registry.values())) == 2
assert all(named for _, named in registry.items())
print("ok")
"""


def test_the_registry_is_filled_on_its_first_read_after_import():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", REGISTRY_AFTER_IMPORT], env=env,
                          capture_output=True, text=True, timeout=300, cwd=paths.REPO_ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok"]


# Neither a name nor a configuration: the error names `backend` and what it takes, whatever
# the value's type (a dict or a list is unhashable, and once reached a cache with it).
WRONG_BACKENDS = [{"chunk": 16}, [], ["fused_controller_hierarchical_chunk16"], 16, None,
                  torch.zeros(2)]


def _refusal(mixer: str) -> str:
    config_class = "SamuConfig" if mixer == "samu" else "GemmConfig"
    return (rf"{mixer}: backend must be 'auto', a name from "
            rf"samu.backends.available\('{mixer}'\) or a {config_class}( or \w+)* "
            rf"configuration object")


@pytest.mark.parametrize("value", WRONG_BACKENDS, ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("mixer", mixers.names())
def test_a_backend_of_the_wrong_type_is_refused_naming_backend(mixer, value):
    module_class = samu.SAMU if mixer == "samu" else samu.RGLRU
    with pytest.raises(TypeError, match=_refusal(mixer)):
        module_class(16, backend=value)
    module = module_class(16)
    x = torch.randn(1, 4, 16)
    with pytest.raises(TypeError, match=_refusal(mixer)):
        FUNCTIONS[mixer](x, *module._parameters_in_order(), backend=value)
    with pytest.raises(TypeError, match=_refusal(mixer)):
        dispatch.resolve(mixer, x, value)


def test_a_choice_recorded_with_its_current_settings_is_taken(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    doc = _calibration_doc()
    chosen = _samu_entry(doc)["backends"][0]
    current = backends.REGISTRY["samu"][chosen["backend"]]
    chosen["settings"] = current.settings
    _write(doc)
    assert dispatch.calibrated_choice("samu", (1, 8, 16), "test-gpu") == current.name


def test_launch_settings_tell_configurations_of_one_name_apart():
    import dataclasses
    from samu.ops.common.family import settings_digest
    config = backends.REGISTRY["samu"]["fused_controller_hierarchical_chunk16"].config
    other = dataclasses.replace(config, backward=dataclasses.replace(config.backward, warps=8))
    assert other.name == config.name
    assert settings_digest(other) != settings_digest(config)
    assert settings_digest(dataclasses.replace(other, backward=config.backward)) == \
        settings_digest(config)
    assert backends.REGISTRY["samu"]["reference_chunked"].settings is None


def test_every_kernel_family_implements_the_interface():
    from samu.ops.common import family
    for mixer in backends.REGISTRY:
        for module in backends.kernel_families(mixer):
            family.check_family(module)
            assert isinstance(module, family.KernelFamily) and module.MIXER == mixer
    import types
    with pytest.raises(TypeError, match="lacks .*forward"):
        family.check_family(types.SimpleNamespace(__name__="half_a_family", MIXER="samu",
                                                  CONFIGS=(), KERNELS={}, FEATURES={},
                                                  LAUNCHES={}, SliceRun=None))


@pytest.mark.parametrize("mixer", mixers.names())
def test_a_configuration_refuses_a_chunk_or_launch_the_kernels_cannot_take(mixer):
    """dataclasses.replace(config, ...) makes a backend= a user may pass: a chunk or launch
    that no kernel can compile is refused where it is made, naming the field, not deep in
    Triton (chunk 3: 'arange's range must be a power of 2'; chunk 0: ZeroDivisionError)."""
    import dataclasses
    configs = [b.config for b in backends.REGISTRY[mixer].values() if b.kind == "triton"]
    assert configs
    for config in configs:
        launch_role, launch = next(iter(config.launches().items()))
        for change, error, words in ((dict(chunk=0), ValueError, "chunk must be a power of two"),
                                     (dict(chunk=3), ValueError, "chunk must be a power of two"),
                                     (dict(chunk=256), ValueError, "from 1 to 128"),
                                     (dict(chunk=8.0), TypeError, "chunk must be an int"),
                                     (dict(chunk=True), TypeError, "chunk must be an int"),
                                     ({launch_role: "fast"}, TypeError, "must be a Launch")):
            with pytest.raises(error, match=words):
                dataclasses.replace(config, **change)
        for change, words in ((dict(warps=3), "warps must be a power of two"),
                              (dict(vector=0), "vector must be a power of two"),
                              (dict(registers=300), "registers must be None or an int")):
            with pytest.raises(ValueError, match=words):
                dataclasses.replace(launch, **change)
        assert dataclasses.replace(config, chunk=4).chunk == 4


@pytest.mark.parametrize("mixer", mixers.names())
def test_a_configuration_refuses_settings_of_the_wrong_type_or_range(mixer):
    """Every other field of every Triton configuration, and of the settings it holds (the
    carry plan, the look-back), is checked by its declared type where it is made: a flag that
    is no bool, a count below its least value, a number that is no finite positive one, a
    settings field of another class.  Before, a carry plan of 0 chunks a segment reached
    ZeroDivisionError and partial_dx="no" ran as True."""
    import dataclasses
    import typing
    configs = [b.config for b in backends.REGISTRY[mixer].values() if b.kind == "triton"]
    checked = set()

    def refused(settings):
        for field in dataclasses.fields(settings):
            kind = typing.get_type_hints(type(settings))[field.name]
            value = getattr(settings, field.name)
            bad = {bool: ("no", TypeError), int: (-1, ValueError),
                   float: (float("nan"), ValueError)}.get(kind)
            if bad is None and isinstance(kind, type) and kind is not object \
                    and dataclasses.is_dataclass(kind) and "launches" not in dir(kind) \
                    and not hasattr(value, "warps"):
                bad = (None, TypeError)
                refused(value)  # the settings it holds, field by field
            if bad is None or field.name == "chunk":
                continue
            with pytest.raises(bad[1], match=rf"{type(settings).__name__}: {field.name} must"):
                dataclasses.replace(settings, **{field.name: bad[0]})
            checked.add((type(settings).__name__, field.name))

    for config in configs:
        refused(config)
    # the settings whose least value is 0, taken at 0
    for settings in configs + [c.carry for c in configs if hasattr(c, "carry")] \
            + [c.lookback for c in configs if hasattr(c, "lookback")]:
        for name in ("walked_carry_chunks", "walked_carry_elements", "workspace_units",
                     "two_level_from", "inclusive_every"):
            if hasattr(settings, name):
                assert getattr(dataclasses.replace(settings, **{name: 0}), name) == 0
    # the carry plan's segments and the look-back's flags among them
    assert {("CarryPlan", "segment_chunks"), ("CarryPlan", "lookback")} <= checked \
        or {("Lookback", "split"), ("Lookback", "inclusive_every")} <= checked

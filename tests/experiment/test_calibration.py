import copy
import json
import math
import multiprocessing

import pytest
import torch

from samu import _runtime, backends, calibration_file, dispatch, paths
from samu.experiment import calibration, legality, schema
from samu.shapes import Shape


def test_inputs_are_deterministic():
    a = legality.make_inputs("samu", (1, 5, 16), "cpu", seed=3)
    b = legality.make_inputs("samu", (1, 5, 16), "cpu", seed=3)
    assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2])
    assert a[0].dtype == torch.bfloat16
    assert all(torch.equal(a[1][k], b[1][k]) for k in a[1])


def test_relative_errors():
    want = {"y": torch.ones(4, dtype=torch.float64), "z": torch.zeros(2, dtype=torch.float64)}
    got = {"y": torch.full((4,), 1.5), "z": torch.tensor([0.0, float("nan")])}
    errs = legality.relative_errors(got, want)
    assert errs["y"] == pytest.approx(0.5)
    assert math.isinf(errs["z"])


def test_reference_is_illegal_as_a_transition_materialiser():
    entry = legality.check_legality("samu", "reference_chunked", (1, 6, 16), "cpu")
    assert not entry["legal"]
    assert "materialises" in entry["reason"]
    assert max(entry["errors"].values()) < 1e-2  # accurate, only illegal by the rule


def _fake(monkeypatch, run):
    backends._ensure_registered()
    fake = backends.Backend("fused_chunk16", "samu", "triton", run)
    monkeypatch.setitem(backends.REGISTRY["samu"], fake.name, fake)
    return fake.name


def test_inaccurate_backend_is_illegal(monkeypatch):
    backends._ensure_registered()
    reference = backends.REGISTRY["samu"]["reference_chunked"].run
    # a backend's run gives (y, final state or None)
    name = _fake(monkeypatch, lambda x, *p, **state: (reference(x, *p)[0] * 1.01, None))
    monkeypatch.setattr(_runtime, "INTERPRETING", True)
    entry = legality.check_legality("samu", name, (1, 6, 16), "cpu")
    assert not entry["legal"]
    assert entry["reason"].startswith("y:") and "x:" in entry["reason"]


def test_failing_backend_is_illegal_not_fatal(monkeypatch):
    def broken(x, *p):
        raise RuntimeError("no kernel for this GPU")
    name = _fake(monkeypatch, broken)
    monkeypatch.setattr(_runtime, "INTERPRETING", True)
    entry = legality.check_legality("samu", name, (1, 6, 16), "cpu")
    assert not entry["legal"] and "no kernel for this GPU" in entry["reason"]


def _triton_device() -> str:
    """Where this machine runs the Triton backends: its GPU, else the CPU under Triton's
    interpreter (on a GPU machine the kernels are built for the GPU, and refuse CPU tensors)."""
    if torch.cuda.is_available():
        return "cuda"
    if not dispatch.interpreting():
        pytest.skip("no GPU, and TRITON_INTERPRET=1 was not set before samu was imported")
    return "cpu"


def test_calibrate_and_merge(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    name = backends.DEFAULTS["samu"]
    result = calibration.calibrate_shape((1, 8, 16), _triton_device(), mixers=("samu",),
                                         candidates={"samu": ["reference_chunked", name]}, reps=1)
    assert result["samu"]["chosen"] == name, result["samu"]["backends"]
    assert result["samu"]["ranking"] == [name]
    assert result["samu"]["ranked_by"] == ("gpu_time_ms" if torch.cuda.is_available()
                                           else "median_ms")
    calibration.merge_calibration("test-gpu", (1, 8, 16), result, {"gpu": "Test GPU"})
    doc = schema.read_json(paths.calibration_file("test-gpu"))
    schema.validate(doc, "calibration")
    # auto reads the file just written, whatever SAMU_CALIBRATION_DIR or an install would name
    monkeypatch.setattr(dispatch, "_USER_DIR", paths.calibration_file("test-gpu").parent)
    dispatch.forget_calibration()
    assert dispatch.calibrated_choice("samu", (1, 8, 16), "test-gpu") == name


@pytest.mark.parametrize("gpu_times, want", [
    ({0: 0.30, 1: 0.20}, "gpu_time_ms"),  # GPU time reverses the medians' order
    ({0: 0.30, 1: None}, "median_ms"),  # one backend could not be captured: the medians rank
])
def test_legal_backends_are_ranked_by_gpu_time_where_every_one_has_it(monkeypatch, gpu_times,
                                                                      want):
    names = [n for n in backends.available("samu")
             if backends.REGISTRY["samu"][n].kind == "triton"][:2]
    medians = {names[0]: 1.0, names[1]: 2.0}
    gpu = {names[i]: t for i, t in gpu_times.items()}
    monkeypatch.setattr(calibration.protocol, "warm_samples",
                        lambda module, x, dy, reps: [medians[module.backend]] * reps)
    monkeypatch.setattr(calibration.protocol, "graph_replay_ms",
                        lambda module, x, dy: gpu[module.backend])
    result = calibration.calibrate_shape((1, 8, 16), _triton_device(), mixers=("samu",),
                                         candidates={"samu": names}, reps=1)["samu"]
    assert result["ranked_by"] == want
    order = names[::-1] if want == "gpu_time_ms" else names
    assert result["ranking"] == order and result["chosen"] == order[0]
    entries = {e["backend"]: e for e in result["backends"]}
    assert [entries[n]["median_ms"] for n in names] == [1.0, 2.0]  # kept beside GPU time
    assert [entries[n]["gpu_time_ms"] for n in names] == [gpu[n] for n in names]


def _entries(times, peaks):
    return [{"backend": f"b{i}", "gpu_time_ms": t, "peak_units": p}
            for i, (t, p) in enumerate(zip(times, peaks))]


@pytest.mark.parametrize("times, peaks, budget, want, why", [
    ([1.0, 1.04], [2.8, 2.4], 2.5, "b1", "within the memory budget"),  # 4 % for the budget
    ([1.0, 1.06], [2.8, 2.4], 2.5, "b0", "none within"),  # 6 %: over the tolerance
    ([1.0, 1.01, 1.03], [2.8, 2.6, 2.4], 2.5, "b2", "within the memory budget"),
    ([1.0, 1.01], [2.4, 2.3], 2.5, "b0", "fastest"),  # the fastest is within: nothing traded
    ([1.0, 1.01], [2.8, 2.4], None, "b0", "fastest"),  # no budget
    ([1.0, 1.01], [2.8, None], 2.5, "b0", "none within"),  # an unmeasured peak is not taken
    ([1.0, 1.01], [None, None], 2.5, "b0", "fastest"),  # a CPU measures no peak
])
def test_the_choice_trades_at_most_the_tolerance_for_the_memory_budget(times, peaks, budget,
                                                                       want, why):
    chosen, chosen_by = calibration.choose(_entries(times, peaks), "gpu_time_ms", budget, 1.05)
    assert chosen == want and why in chosen_by
    assert calibration.choose([], "gpu_time_ms", 2.5) == (None, "no legal backend")
    # a tolerance of 1 ranks by time alone, ties included
    for times in ([1.0, 1.0001], [1.0, 1.0]):
        assert calibration.choose(_entries(times, [2.8, 2.4]), "gpu_time_ms", 2.5,
                                  1.0)[0] == "b0"
    # entries in any order: the fastest is found, not taken as the first
    assert calibration.choose(_entries([1.04, 1.0], [2.4, 2.8]), "gpu_time_ms",
                              2.5, 1.05) == ("b0", "fastest within the memory budget")
    assert calibration.choose(_entries([1.2, 1.0], [2.4, 2.8]), "gpu_time_ms", 2.5,
                              1.05)[0] == "b1"


def test_calibration_records_peak_memory_and_chooses_within_the_mixers_budget(tmp_path,
                                                                              monkeypatch):
    """On a GPU every legal backend's peak memory is recorded (bytes and units of B*L*D BF16),
    and auto's choice is the fastest within the mixer's memory_budget_units when it is within
    the tolerance of the fastest; the ranking stays by time, and auto takes the choice."""
    monkeypatch.setattr(paths, "DATA", tmp_path)
    names = [n for n in backends.available("samu")
             if backends.REGISTRY["samu"][n].kind == "triton"][:2]
    shape = (1, 8, 16)
    unit = 2 * 8 * 16
    gpu = {names[0]: 0.100, names[1]: 0.104}
    peak = {names[0]: int(2.8 * unit), names[1]: int(2.4 * unit)}
    monkeypatch.setattr(calibration.protocol, "warm_samples",
                        lambda module, x, dy, reps: [1.0] * reps)
    monkeypatch.setattr(calibration.protocol, "graph_replay_ms",
                        lambda module, x, dy: gpu[module.backend])
    monkeypatch.setattr(calibration.protocol, "peak_allocated_delta",
                        lambda module, x, dy: peak[module.backend])
    for tolerance, want in ((1.0, names[0]), (1.05, names[1])):
        result = calibration.calibrate_shape(shape, _triton_device(), mixers=("samu",),
                                             candidates={"samu": names}, reps=1,
                                             memory_tolerance=tolerance)["samu"]
        assert result["ranking"] == names and result["chosen"] == want, tolerance
        assert result["memory_budget_units"] == 2.5 and result["memory_tolerance"] == tolerance
        entries = {e["backend"]: e for e in result["backends"]}
        for name in names:
            assert entries[name]["peak_allocated_delta_bytes"] == peak[name]
            assert entries[name]["peak_units"] == pytest.approx(peak[name] / unit)
    calibration.merge_calibration("test-gpu", shape, {"samu": result}, {"gpu": "Test GPU"})
    monkeypatch.setattr(dispatch, "_USER_DIR", paths.calibration_file("test-gpu").parent)
    dispatch.forget_calibration()
    assert dispatch.calibrated_choice("samu", shape, "test-gpu") == names[1]


def test_a_reference_on_a_cpu_device_object_is_checked_not_skipped():
    # Skipped (recorded illegal unchecked) only on a GPU: decided by the tensors' device, so
    # torch.device("cpu") is a CPU as "cpu" is.
    result = calibration.calibrate_shape((1, 6, 16), torch.device("cpu"), mixers=("samu",),
                                         candidates={"samu": ["reference_chunked"]}, reps=1)
    (entry,) = result["samu"]["backends"]
    assert not entry["legal"] and "materialises" in entry["reason"]
    assert max(entry["errors"].values()) < 1e-2  # it ran: measured against the oracle


def _legal_result(name=None) -> dict:
    name = name or backends.DEFAULTS["samu"]
    return {"samu": {"ranking": [name], "chosen": name,
                     "backends": [{"backend": name, "legal": True}]}}


def test_an_entry_of_other_launch_settings_does_not_block_recalibration(tmp_path, monkeypatch):
    """After a launch setting changes, auto refuses the entries calibrated with the old one and
    asks for recalibration: merging a recalibrated shape must work while other shapes are still
    stale, and replacing the stale shape lifts the refusal."""
    monkeypatch.setattr(paths, "DATA", tmp_path)
    monkeypatch.setattr(dispatch, "_USER_DIR", paths.calibration_file("test-gpu").parent)
    name = backends.DEFAULTS["samu"]
    current = _legal_result(name)
    current["samu"]["backends"][0]["settings"] = backends.REGISTRY["samu"][name].settings
    calibration.merge_calibration("test-gpu", (1, 8, 16), current, {"gpu": "Test GPU"})
    path = paths.calibration_file("test-gpu")
    doc = schema.read_json(path)  # as a file calibrated before a launch setting changed
    doc["shapes"]["1x8x16"]["samu"]["backends"][0]["settings"] = "0123456789ab"
    path.write_text(json.dumps(doc))
    stale = copy.deepcopy(doc["shapes"]["1x8x16"])
    with pytest.raises(calibration_file.CalibrationFileError, match="recalibrate this shape"):
        calibration.merge_calibration("test-gpu", (1, 9, 16), stale, {"gpu": "Test GPU"})
    calibration.merge_calibration("test-gpu", (1, 9, 16), current, {"gpu": "Test GPU"})
    dispatch.forget_calibration()
    with pytest.raises(calibration_file.CalibrationFileError, match="recalibrate this shape"):
        dispatch.calibrated_choice("samu", (1, 9, 16), "test-gpu")
    calibration.merge_calibration("test-gpu", (1, 8, 16), current, {"gpu": "Test GPU"})
    dispatch.forget_calibration()
    assert dispatch.calibrated_choice("samu", (1, 8, 16), "test-gpu") == name
    # a broken entry (not only a stale one) is still refused before anything is written
    bad = _legal_result(name)
    bad["samu"]["chosen"] = "bogus_backend"
    with pytest.raises(calibration_file.CalibrationFileError, match="bogus_backend"):
        calibration.merge_calibration("test-gpu", (1, 10, 16), bad, {"gpu": "Test GPU"})
    assert "1x10x16" not in schema.read_json(paths.calibration_file("test-gpu"))["shapes"]


def _merge_shapes(data_dir, first_length, count, barrier):
    """One writer process: ``count`` merges of distinct shapes into the shared file."""
    paths.DATA = data_dir  # this process's own module state
    barrier.wait()  # start together, so the read-modify-writes overlap
    for length in range(first_length, first_length + count):
        calibration.merge_calibration("test-gpu", (1, length, 16), _legal_result(),
                                      {"gpu": "Test GPU"})


def test_concurrent_merges_lose_nothing(tmp_path):
    writers, merges = 2, 40
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(writers)
    procs = [ctx.Process(target=_merge_shapes, args=(tmp_path, 1 + k * merges, merges, barrier))
             for k in range(writers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    doc = schema.read_json(tmp_path / "calibration" / "test-gpu.json")
    assert sorted(doc["shapes"]) == sorted(Shape.of((1, n, 16)).key
                                           for n in range(1, 1 + writers * merges))
    lock = calibration_file.lock_path(tmp_path / "calibration" / "test-gpu.json")
    assert sorted(p.name for p in (tmp_path / "calibration").iterdir()) == [lock.name,
                                                                           "test-gpu.json"]


def test_merge_into_a_given_path(tmp_path):
    path = tmp_path / "elsewhere" / "gpu.json"
    calibration.merge_calibration("unused-slug", (1, 8, 16), _legal_result(), {"gpu": "G"},
                                  path=path)
    calibration.merge_calibration("unused-slug", (1, 9, 16), _legal_result(), {"gpu": "G"},
                                  path=path)
    assert sorted(schema.read_json(path)["shapes"]) == ["1x8x16", "1x9x16"]
    assert not paths.calibration_file("unused-slug").exists()


def test_calibrating_one_mixer_keeps_the_other_mixers_entries_at_the_shape(tmp_path):
    """A --mixers run replaced the whole shape, so the other mixers' entries were lost."""
    path = tmp_path / "gpu.json"
    other = backends.DEFAULTS["rglru"]
    both = {**_legal_result(), "rglru": {"ranking": [other], "chosen": other,
                                         "backends": [{"backend": other, "legal": True}]}}
    calibration.merge_calibration("g", (1, 8, 16), both, {"gpu": "G"}, path=path)
    again = _legal_result()
    again["samu"]["backends"][0]["median_ms"] = 1.0
    calibration.merge_calibration("g", (1, 8, 16), again, {"gpu": "G"}, path=path)
    entry = schema.read_json(path)["shapes"]["1x8x16"]
    assert entry["rglru"] == both["rglru"] and entry["samu"] == again["samu"]


@pytest.mark.parametrize("field", ["ranking", "chosen", "backends"])
def test_merge_refuses_unregistered_names_and_keeps_the_file(tmp_path, field):
    path = tmp_path / "gpu.json"
    calibration.merge_calibration("g", (1, 8, 16), _legal_result(), {"gpu": "G"}, path=path)
    before = path.read_bytes()
    bad = _legal_result()
    entry = bad["samu"]
    if field == "ranking":
        entry["ranking"] = ["bogus_backend"]
    elif field == "chosen":
        entry["chosen"] = "bogus_backend"
    else:
        entry["backends"].append({"backend": "bogus_backend", "legal": False})
    with pytest.raises(dispatch.CalibrationFileError) as info:
        calibration.merge_calibration("g", (1, 9, 16), bad, {"gpu": "G"}, path=path)
    message = str(info.value)
    assert str(path) in message and "1x9x16" in message and "samu" in message
    assert "'bogus_backend' is not a registered backend of samu" in message
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [".gpu.json.lock", "gpu.json"]


def test_merge_through_a_symlink_writes_the_target_and_keeps_the_link(tmp_path):
    shared = tmp_path / "shared" / "gpu.json"
    calibration.merge_calibration("g", (1, 8, 16), _legal_result(), {"gpu": "G"}, path=shared)
    link = tmp_path / "data" / "gpu.json"
    link.parent.mkdir()
    link.symlink_to(shared)
    calibration.merge_calibration("g", (1, 9, 16), _legal_result(), {"gpu": "G"}, path=link)
    assert link.is_symlink() and link.resolve() == shared.resolve()
    assert sorted(schema.read_json(shared)["shapes"]) == ["1x8x16", "1x9x16"]
    # the lock is the target's, shared with every writer of the target by any path
    assert sorted(p.name for p in link.parent.iterdir()) == ["gpu.json"]
    assert sorted(p.name for p in shared.parent.iterdir()) == [".gpu.json.lock", "gpu.json"]


def test_merge_through_a_dangling_symlink_creates_the_target(tmp_path):
    target = tmp_path / "shared" / "gpu.json"
    link = tmp_path / "gpu.json"
    link.symlink_to(target)
    calibration.merge_calibration("g", (1, 8, 16), _legal_result(), {"gpu": "G"}, path=link)
    assert link.is_symlink() and sorted(schema.read_json(target)["shapes"]) == ["1x8x16"]


@pytest.mark.parametrize("thing", ["a directory", "a symlink loop"])
def test_merge_refuses_what_is_not_a_file_at_the_path(tmp_path, thing):
    path = tmp_path / "gpu.json"
    if thing == "a directory":
        path.mkdir()
    else:
        path.symlink_to(path.name)
    with pytest.raises(dispatch.CalibrationFileError, match="cannot be read") as info:
        calibration.merge_calibration("g", (1, 9, 16), _legal_result(), {"gpu": "G"}, path=path)
    assert str(path) in str(info.value)
    assert path.is_dir() if thing == "a directory" else path.is_symlink()


def test_merge_refuses_to_build_on_a_broken_file(tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"gpu": "G", "environment": {}, "shapes": {"axbxc": {}}}))
    before = path.read_bytes()
    with pytest.raises(dispatch.CalibrationFileError, match="shape key 'axbxc'"):
        calibration.merge_calibration("g", (1, 9, 16), _legal_result(), {"gpu": "G"}, path=path)
    assert path.read_bytes() == before


def test_inputs_take_the_head_count():
    _, params, _ = legality.make_inputs("rglru", (1, 4, 16), "cpu", num_heads=2)
    assert params["gate_x_weight"].shape == (2, 8, 8)


def test_the_command_calibrates_each_shape_at_its_head_count(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    device = _triton_device()
    name = backends.DEFAULTS["rglru"]
    assert calibration.main(["1x8x16", "--mixers", "rglru", "--heads", "2", "--reps", "1",
                             "--backends", name]) == 0
    slug = dispatch.gpu_slug() if device == "cuda" else "cpu"
    doc = schema.read_json(paths.calibration_file(slug))
    entry = doc["shapes"]["1x8x16"]["rglru"]
    assert entry["chosen"] == name and entry["num_heads"] == 2
    assert [e["backend"] for e in entry["backends"]] == [name]
    assert f"1x8x16 rglru: chosen {name}" in capsys.readouterr().out


def test_the_command_refuses_an_unknown_backend_by_name(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    with pytest.raises(SystemExit) as info:
        calibration.main(["1x8x16", "--mixers", "samu", "--backends", "nope",
                          backends.DEFAULTS["samu"]])
    assert info.value.code == 2
    assert "unknown backends ['nope'] for ['samu']" in capsys.readouterr().err
    assert not any(tmp_path.rglob("*.json"))


def test_the_command_refuses_backends_that_leave_a_mixer_none(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    with pytest.raises(SystemExit) as info:
        calibration.main(["1x8x16", "--reps", "1", "--backends", backends.DEFAULTS["samu"]])
    assert info.value.code == 2
    assert "names no backend of rglru" in capsys.readouterr().err
    assert not any(tmp_path.rglob("*.json"))


@pytest.mark.parametrize("argv, words", [
    ([""], "no shape in ['']"),
    (["1x8x16", "--reps", "0"], "argument --reps: must be at least 1, got 0"),
    (["1x8x16", "--heads", "-1"], "argument --heads: must be at least 1, got -1"),
    (["1x8x16", "1x8x12", "--mixers", "rglru", "--heads", "8"],
     "--heads 8 does not divide the width of 1x8x12")])
def test_the_command_refuses_bad_counts_before_calibrating_anything(tmp_path, monkeypatch,
                                                                    capsys, argv, words):
    """An empty shape list exited 0 having written nothing; --reps 0 died in statistics;
    --heads that does not divide a later shape's width failed after earlier shapes were
    written."""
    monkeypatch.setattr(paths, "DATA", tmp_path)
    with pytest.raises(SystemExit) as info:
        calibration.main(argv)
    assert info.value.code == 2 and words in capsys.readouterr().err
    assert not any(tmp_path.rglob("*.json"))


def test_the_command_refuses_a_broken_file_before_timing_anything(tmp_path, monkeypatch,
                                                                  capsys):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    slug = dispatch.gpu_slug() if _triton_device() == "cuda" else "cpu"
    broken = paths.calibration_file(slug)
    broken.parent.mkdir(parents=True)
    broken.write_text("{broken")
    monkeypatch.setattr(calibration, "calibrate_shape",
                        lambda *a, **k: pytest.fail("calibrated before the file was read"))
    with pytest.raises(SystemExit) as info:
        calibration.main(["1x8x16", "--mixers", "samu", "--reps", "1"])
    assert info.value.code == 1 and "not valid JSON" in capsys.readouterr().err
    assert broken.read_text() == "{broken"


def test_the_command_refuses_a_cpu_without_the_interpreter(tmp_path, monkeypatch):
    # Every Triton backend would fail there, and the file would choose none.
    monkeypatch.setattr(paths, "DATA", tmp_path)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("samu.dispatch.interpreting", lambda: False)
    with pytest.raises(SystemExit, match="set TRITON_INTERPRET=1"):
        calibration.main(["1x8x16", "--mixers", "samu", "--reps", "1"])
    assert not any(tmp_path.rglob("*.json"))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_the_memory_rule_refuses_non_finite_numbers(bad):
    """A NaN tolerance would let a 100x slower backend through for the budget, and a NaN time
    would make the choice follow the entries' order: both are refused, as are the budget and
    the peaks."""
    entries = _entries([1.0, 100.0], [4.0, 2.0])
    with pytest.raises(ValueError, match="memory tolerance must be a finite number"):
        calibration.choose(entries, "gpu_time_ms", 2.5, bad)
    with pytest.raises(ValueError, match="memory budget must be a finite number"):
        calibration.choose(entries, "gpu_time_ms", bad, 1.05)
    for field in ("gpu_time_ms", "peak_units"):
        timed = _entries([1.0, 1.01], [2.8, 2.4])
        timed[1][field] = bad
        with pytest.raises(ValueError, match=f"b1's {field} must be a finite number"):
            calibration.choose(timed, "gpu_time_ms", 2.5, 1.05)
    with pytest.raises(ValueError, match="memory tolerance must be a finite number"):
        calibration.calibrate_shape((1, 8, 16), "cpu", ["samu"], memory_tolerance=bad)


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "NaN", "lots"])
def test_the_command_refuses_a_non_finite_memory_tolerance(tmp_path, monkeypatch, capsys, text):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    with pytest.raises(SystemExit) as info:
        calibration.main(["1x8x16", f"--memory-tolerance={text}"])
    assert info.value.code == 2
    assert "--memory-tolerance" in capsys.readouterr().err
    assert not any(tmp_path.rglob("*.json"))


@pytest.mark.parametrize("where, field, bad", [
    ("entry", "memory_tolerance", "nan"), ("entry", "memory_tolerance", math.nan),
    ("entry", "memory_budget_units", "inf"), ("backend", "gpu_time_ms", "nan"),
    ("backend", "median_ms", math.inf), ("backend", "peak_units", "-inf"),
    ("backend", "forward_backward_ms", [1.0, "nan"]), ("backend", "gpu_time_ms", True),
])
def test_the_file_refuses_non_finite_rule_numbers_and_times(tmp_path, where, field, bad):
    """In a calibration file (non-finite numbers are written as strings, and Python's JSON
    reader takes a NaN literal too), the memory rule's numbers and the measurements must be
    finite: the reader, and a merge on top of such a file, refuse it by file, entry and field."""
    result = _legal_result()
    entry = result["samu"]
    (entry if where == "entry" else entry["backends"][0])[field] = bad
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"gpu": "G", "environment": {}, "shapes": {"1x8x16": result}}))
    with pytest.raises(calibration_file.CalibrationFileError, match=field) as info:
        dispatch.check_calibration(calibration_file.read(path), path)
    assert str(path) in str(info.value) and "1x8x16" in str(info.value)
    before = path.read_bytes()
    with pytest.raises(calibration_file.CalibrationFileError, match=field):
        calibration.merge_calibration("g", (1, 9, 16), _legal_result(), {"gpu": "G"}, path=path)
    assert path.read_bytes() == before

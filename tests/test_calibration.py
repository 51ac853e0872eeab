import math

import pytest
import torch

from samu import backends, calibration, paths, schema


def test_inputs_are_deterministic():
    a = calibration.make_inputs("samu", (1, 5, 16), "cpu", seed=3)
    b = calibration.make_inputs("samu", (1, 5, 16), "cpu", seed=3)
    assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2])
    assert a[0].dtype == torch.bfloat16
    assert all(torch.equal(a[1][k], b[1][k]) for k in a[1])


def test_relative_errors():
    want = {"y": torch.ones(4, dtype=torch.float64), "z": torch.zeros(2, dtype=torch.float64)}
    got = {"y": torch.full((4,), 1.5), "z": torch.tensor([0.0, float("nan")])}
    errs = calibration.relative_errors(got, want)
    assert errs["y"] == pytest.approx(0.5)
    assert math.isinf(errs["z"])


def test_reference_is_illegal_as_a_transition_materialiser():
    entry = calibration.check_legality("samu", "reference_chunked", (1, 6, 16), "cpu")
    assert not entry["legal"]
    assert "materialises" in entry["reason"]
    assert max(entry["errors"].values()) < 1e-2  # accurate, only illegal by the rule


def _fake(monkeypatch, run):
    fake = backends.Backend("fused_chunk16", "samu", "triton", run)
    monkeypatch.setitem(backends.REGISTRY["samu"], fake.name, fake)
    return fake.name


def test_inaccurate_backend_is_illegal(monkeypatch):
    reference = backends.REGISTRY["samu"]["reference_chunked"].run
    name = _fake(monkeypatch, lambda x, *p: reference(x, *p) * 1.01)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    entry = calibration.check_legality("samu", name, (1, 6, 16), "cpu")
    assert not entry["legal"]
    assert entry["reason"].startswith("y:") and "x:" in entry["reason"]


def test_failing_backend_is_illegal_not_fatal(monkeypatch):
    def broken(x, *p):
        raise RuntimeError("no kernel for this GPU")
    name = _fake(monkeypatch, broken)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    entry = calibration.check_legality("samu", name, (1, 6, 16), "cpu")
    assert not entry["legal"] and "no kernel for this GPU" in entry["reason"]


def test_calibrate_and_merge(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    name = backends.DEFAULTS["samu"]
    result = calibration.calibrate_shape((1, 8, 16), "cpu", mixers=("samu",),
                                         candidates={"samu": ["reference_chunked", name]}, reps=1)
    assert result["samu"]["chosen"] == name
    assert result["samu"]["ranking"] == [name]
    calibration.merge_calibration("test-gpu", (1, 8, 16), result, {"gpu": "Test GPU"})
    doc = schema.read_json(paths.calibration_file("test-gpu"))
    schema.validate(doc, "calibration")
    assert backends.calibrated_choice("samu", (1, 8, 16), "test-gpu") == name

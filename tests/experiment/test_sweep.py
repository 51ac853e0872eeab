import pytest
import torch

from samu import backends, dispatch
from samu.experiment import schema, sweep
from samu import mixers

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_triton_backends_leave_out_the_references():
    names = sweep.triton_backends("samu")
    assert names and all(backends.REGISTRY["samu"][n].kind == "triton" for n in names)
    assert "reference_chunked" in backends.available("samu")
    assert "reference_chunked" not in names


def _row(shape, mixer, name, ms, auto):
    return {"shape": list(shape), "mixer": mixer, "backend": name, "auto": auto,
            "gpu_time_ms": ms, "median_ms": None if ms is None else 2 * ms}


def test_auto_ratios_compare_auto_with_the_fastest_per_shape_and_mixer():
    rows = [_row((1, 8, 4), "samu", "a", 2.0, True), _row((1, 8, 4), "samu", "b", 1.0, False),
            _row((1, 8, 4), "rglru", "c", 3.0, True), _row((1, 8, 4), "rglru", "d", None, False),
            _row((2, 8, 4), "samu", "a", 1.0, False), _row((2, 8, 4), "samu", "b", 4.0, False)]
    got = {(tuple(r["shape"]), r["mixer"]): r for r in sweep.auto_ratios(rows)}
    assert got[((1, 8, 4), "samu")]["auto_over_fastest"] == pytest.approx(2.0)
    assert got[((1, 8, 4), "samu")]["fastest"] == "b"
    assert got[((1, 8, 4), "rglru")]["auto_over_fastest"] == pytest.approx(1.0)  # d: no time
    assert got[((2, 8, 4), "samu")]["auto"] is None  # auto chose none of the timed backends
    by_median = {(tuple(r["shape"]), r["mixer"]): r for r in sweep.auto_ratios(rows, "median_ms")}
    assert by_median[((1, 8, 4), "samu")]["fastest_ms"] == pytest.approx(2.0)


def test_sweep_times_the_named_backends_and_marks_autos_choice():
    shape = (1, 12, 32)
    auto = dispatch.resolve("samu", torch.zeros(shape, dtype=torch.bfloat16, device=DEVICE)).name
    other = next(n for n in sweep.triton_backends("samu") if n != auto)
    rows = sweep.sweep_shape(shape, DEVICE, ("samu",), samples=1, names={"samu": [auto, other]})
    assert [r["backend"] for r in rows] == [auto, other]
    assert [r["auto"] for r in rows] == [True, False]
    assert all(r["median_ms"] > 0 and r["error"] is None for r in rows)
    assert all((r["gpu_time_ms"] is None) == (DEVICE == "cpu") for r in rows)
    doc = {"environment": {"torch": "", "cuda": None, "gpu": "cpu"},
           "calibration": {"path": "cpu.json", "shapes": []}, "rows": rows,
           "auto": sweep.auto_ratios(rows, "median_ms")}
    schema.validate(doc, "sweep")
    doc["rows"][0]["auto"] = "yes"
    with pytest.raises(Exception):
        schema.validate(doc, "sweep")


def test_a_sweep_at_another_head_count_keeps_it_in_its_rows():
    shape = (1, 8, 16)
    name = sweep.triton_backends("rglru")[0]
    rows = sweep.sweep_shape(shape, DEVICE, ("rglru",), samples=1, names={"rglru": [name]},
                             num_heads=2)
    assert [(r["backend"], r["num_heads"]) for r in rows] == [(name, 2)]
    four = [dict(r, num_heads=4, median_ms=r["median_ms"] / 2) for r in rows]
    ratios = sweep.auto_ratios(rows + four, "median_ms")  # one group per head count
    assert sorted(r["num_heads"] for r in ratios) == [2, 4]


def test_an_empty_list_of_names_is_refused_not_taken_for_every_backend(monkeypatch):
    timed = []
    monkeypatch.setattr(sweep, "time_backend", lambda *args: timed.append(args))
    with pytest.raises(ValueError, match=r"no backend to sweep for \['samu'\]"):
        sweep.sweep_shape((1, 8, 16), DEVICE, mixers.names(), samples=1,
                          names={"rglru": sweep.triton_backends("rglru")[:1], "samu": []})
    assert timed == []  # refused before the first mixer ran


def test_a_mixer_the_names_leave_out_sweeps_every_triton_backend():
    chosen = sweep.backends_to_sweep(mixers.names(), {"samu": ["fused_singlepass_chunk16"]})
    assert chosen == {"rglru": sweep.triton_backends("rglru"),
                      "samu": ["fused_singlepass_chunk16"]}
    assert sweep.backends_to_sweep(["samu"], None) == {"samu": sweep.triton_backends("samu")}

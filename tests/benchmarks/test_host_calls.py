"""benchmarks/host_calls.py at a tiny size (launches stubbed, CPU tensors): what it prints, the
rows it appends after those already in the file, the mixers it counts (the registry's with
Triton kernels, each at its default backend) and the counts it refuses."""
import dataclasses

import pytest
import torch

from samu import backends, mixers
from samu.experiment import benchmark_rows

TINY = ["--width", "32", "--length", "16", "--calls", "2", "--repeats", "1"]


def run(bench, argv):
    threads = torch.get_num_threads()
    try:
        return bench.main(argv)
    finally:
        torch.set_num_threads(threads)  # the benchmark runs on one thread


def test_host_calls_appends_a_row_per_mixer(load_benchmark, rows_folder, capsys):
    bench = load_benchmark("host_calls")
    path = rows_folder / "host_calls.jsonl"
    earlier = benchmark_rows.BenchmarkRows("host_calls", "cpu")
    assert earlier.path == path
    kept = earlier.add("samu", {"backend": "earlier"}, (1, 8, 4), {"best_us": 1.0})
    assert run(bench, TINY) == 0
    printed = capsys.readouterr().out
    rows = benchmark_rows.read_rows(path)
    assert rows[0] == kept
    assert [r["mixer"] for r in rows[1:]] == list(bench.counted_backends()) == mixers.names()
    for row in rows[1:]:
        assert row["gpu"] == "cpu" and row["commit"] == "0123abc"
        assert row["shape"] == {"batch": 1, "length": 16, "width": 32}
        assert row["configuration"]["backend"] == backends.DEFAULTS[row["mixer"]]
        assert row["configuration"]["launches"] == "stubbed"
        assert "settings_digest" in row["configuration"]
        values = row["values"]
        assert values["launches"] >= 1 and values["python_calls"] > 0 and values["best_us"] > 0
        assert f"{values['launches']:.0f} launches per forward+backward" in printed
        assert row["units"] == {"python_calls": "count", "builtin_calls": "count",
                                "launches": "count", "best_us": "us"}
    assert "appended 2 rows to" in printed


def test_a_registered_mixer_is_counted_at_its_default_and_one_without_kernels_is_not(
        load_benchmark, rows_folder):
    bench = load_benchmark("host_calls")
    samu = mixers.get("samu")
    twin = dataclasses.replace(samu, name="twin",
                               default_backend="fused_controller_hierarchical_chunk8")
    plain = dataclasses.replace(samu, name="plain", kernel_families=())
    with backends.registered_mixer(twin), backends.registered_mixer(plain):
        assert run(bench, TINY) == 0
    rows = benchmark_rows.read_rows(rows_folder / "host_calls.jsonl")
    assert [(r["mixer"], r["configuration"]["backend"]) for r in rows] == [
        ("rglru", backends.DEFAULTS["rglru"]), ("samu", backends.DEFAULTS["samu"]),
        ("twin", "fused_controller_hierarchical_chunk8")]


def test_backends_named_are_counted_in_place_of_the_defaults(load_benchmark, rows_folder,
                                                              capsys):
    """The counts of earlier runs were taken at other backends than today's defaults."""
    bench = load_benchmark("host_calls")
    other = {m: next(n for n in backends.matching(m) if n != backends.DEFAULTS[m])
             for m in bench.counted_backends()}
    assert run(bench, TINY + ["--backends", *other.values()]) == 0
    rows = benchmark_rows.read_rows(rows_folder / "host_calls.jsonl")
    assert {r["mixer"]: r["configuration"]["backend"] for r in rows} == other
    assert run(bench, TINY + ["--backends", other["samu"]]) == 0  # that mixer alone
    rows = benchmark_rows.read_rows(rows_folder / "host_calls.jsonl")
    assert [r["configuration"]["backend"] for r in rows[len(other):]] == [other["samu"]]
    two = backends.matching("samu")[:2]
    with pytest.raises(SystemExit) as stop:
        run(bench, TINY + ["--backends", *two])
    assert stop.value.code == 2
    assert "names several backends of one mixer" in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    (["--calls", "0"], "--calls: must be at least 1, got 0"),
    (["--repeats", "0"], "--repeats: must be at least 1, got 0"),
    (["--length", "-1"], "--length: must be at least 1, got -1"),
    (["--width", "0"], "--width: must be at least 1, got 0"),
    (["--width", "20"], "head count 16 does not divide the width of 1x64x20")])
def test_a_bad_count_is_refused_before_anything_runs(load_benchmark, rows_folder, capsys, argv,
                                                     words):
    bench = load_benchmark("host_calls")
    with pytest.raises(SystemExit) as stop:
        run(bench, argv)
    assert stop.value.code == 2 and words in capsys.readouterr().err
    assert not rows_folder.exists()

"""benchmarks/host_calls.py at a tiny size (launches stubbed, CPU tensors): what it prints and
the rows it appends after those already in the file."""
import torch

from samu.experiment import benchmark_rows


def test_host_calls_appends_a_row_per_mixer(load_benchmark, rows_folder, capsys):
    bench = load_benchmark("host_calls")
    path = rows_folder / "host_calls.jsonl"
    earlier = benchmark_rows.BenchmarkRows("host_calls", "cpu")
    assert earlier.path == path
    kept = earlier.add("samu", {"backend": "earlier"}, (1, 8, 4), {"best_us": 1.0})
    threads = torch.get_num_threads()
    try:
        assert bench.main(["--width", "32", "--length", "16", "--calls", "2",
                           "--repeats", "1"]) == 0
    finally:
        torch.set_num_threads(threads)  # the benchmark runs on one thread
    printed = capsys.readouterr().out
    rows = benchmark_rows.read_rows(path)
    assert rows[0] == kept
    assert [r["mixer"] for r in rows[1:]] == list(bench.BACKENDS)
    for row in rows[1:]:
        assert row["gpu"] == "cpu" and row["commit"] == "0123abc"
        assert row["shape"] == {"batch": 1, "length": 16, "width": 32}
        assert row["configuration"]["backend"] == bench.BACKENDS[row["mixer"]]
        assert row["configuration"]["launches"] == "stubbed"
        assert "settings_digest" in row["configuration"]
        values = row["values"]
        assert values["launches"] >= 1 and values["python_calls"] > 0 and values["best_us"] > 0
        assert f"{values['launches']:.0f} launches per forward+backward" in printed
        assert row["units"] == {"python_calls": "count", "builtin_calls": "count",
                                "launches": "count", "best_us": "us"}
    assert "appended 2 rows to" in printed

"""benchmarks/bench_transformers.py at a tiny size on a CPU: a row for each implementation and
measurement, labelled as no GPU result, the speed-ups it prints and its figure; and its figure
redrawn from committed rows."""
import importlib.util

import pytest

from samu import paths
from samu.experiment import benchmark_rows


def load_benchmark():
    spec = importlib.util.spec_from_file_location(
        "bench_transformers", paths.REPO_ROOT / "benchmarks" / "bench_transformers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_small_cpu_run_appends_its_rows_and_draws(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(paths, "DATA", tmp_path / "data")
    monkeypatch.setenv("SAMU_GIT_COMMIT", "0123abc")
    bench = load_benchmark()
    assert bench.main(["--device", "cpu", "--width", "16", "--heads", "2", "--layers", "3",
                       "--vocab", "32", "--intermediate", "32", "--lengths", "8", "--prompt",
                       "4", "--new-tokens", "3", "--batches", "1", "2", "--repeats", "1",
                       "--backend", "reference_chunked", "--figure"]) == 0
    printed = capsys.readouterr().out
    assert "no GPU result" in printed
    rows = benchmark_rows.read_rows(tmp_path / "data" / "benchmarks" / "cpu"
                                    / "bench_transformers.jsonl")
    parts = [(r["configuration"]["implementation"], r["configuration"]["part"],
              r["shape"]["batch"]) for r in rows]
    for implementation in ("transformers", "samu"):
        assert parts.count((implementation, "rglru_layer_forward_backward", 1)) == 1
        assert parts.count((implementation, "model_forward_backward", 1)) == 1
        assert {b for i, p, b in parts if (i, p) == (implementation, "generate")} == {1, 2}
    for row in rows:
        assert row["gpu"] == "cpu" and row["configuration"]["gpu_result"] is False
        backend = row["configuration"]["backend"]
        assert backend == ("transformers" if row["configuration"]["implementation"]
                           == "transformers" else "reference_chunked")
        assert all(v > 0 for v in row["values"].values())
    assert printed.count("samu over transformers,") == 4
    assert (tmp_path / "data" / "figures" / "cpu_transformers.png").stat().st_size > 0


def test_redraw_pairs_each_measurement_within_its_latest_complete_commit(tmp_path, monkeypatch,
                                                                         capsys):
    monkeypatch.setattr(paths, "DATA", tmp_path / "data")
    bench = load_benchmark()
    table = benchmark_rows.BenchmarkRows(
        "bench_transformers", "cpu",
        path=paths.benchmarks_file("nvidia-h200", "bench_transformers"))

    def add(commit, implementation, wall_ms, gpu_result=True, length=8192, layers=26):
        table.commit = commit * 40
        config = benchmark_rows.configuration(
            "rglru", implementation, part="model_forward_backward", implementation=implementation,
            dtype="bfloat16", layers=layers, heads=10, vocab=256000, gpu_result=gpu_result)
        table.add("rglru", config, {"batch": 1, "length": length, "width": 2560},
                  {"wall_ms": wall_ms})

    def bars():
        return bench.speedups(bench.results_from_rows(benchmark_rows.read_rows(table.path)))
    add("a", "transformers", 400.0)
    add("a", "samu", 10.0)                      # 40x
    add("b", "transformers", 500.0)             # no samu row at b: never paired with a's
    add("d", "transformers", 90.0, length=2048)
    add("d", "samu", 3.0, length=2048)          # 30x
    add("e", "samu", 20.0)
    add("e", "transformers", 500.0)             # 25x, complete after a: the latest
    add("c", "transformers", 1000.0, gpu_result=False)
    add("c", "samu", 1.0, gpu_result=False)     # no GPU result: left out, though last
    assert bars() == [("model fwd+bwd, L = 2048 (ddddddd)", 30.0),
                      ("model fwd+bwd, L = 8192 (eeeeeee)", 25.0)]
    add("f", "transformers", 200.0, layers=13)
    add("f", "samu", 8.0, layers=13)            # another layout: its own bar, never e's
    assert bars() == [("model fwd+bwd, L = 2048 (ddddddd, 26 layers, bfloat16)", 30.0),
                      ("model fwd+bwd, L = 8192 (eeeeeee, 26 layers, bfloat16)", 25.0),
                      ("model fwd+bwd, L = 8192 (fffffff, 13 layers, bfloat16)", 25.0)]
    assert bench.main(["--redraw", "nvidia-h200"]) == 0
    assert (tmp_path / "data" / "figures" / "nvidia-h200_transformers.png").stat().st_size > 0
    assert bench.main(["--redraw", "nvidia-h100"]) == 1  # no rows there
    assert "no GPU rows" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.parse(["--redraw", "../elsewhere"])
    assert "--redraw takes a GPU's folder name" in capsys.readouterr().err

"""benchmarks/bench_transformers.py at a tiny size on a CPU: a row for each implementation and
measurement, labelled as no GPU result, the speed-ups it prints and its figure."""
import importlib.util

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

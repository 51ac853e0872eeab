"""benchmarks/bench_context_parallel.py on a CPU, at a tiny size."""
import importlib.util
import json

from samu import paths


def test_benchmark_runs_on_the_cpu(tmp_path):
    path = paths.REPO_ROOT / "benchmarks" / "bench_context_parallel.py"
    spec = importlib.util.spec_from_file_location("bench_context_parallel", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "cp.json"
    assert bench.main(["--device", "cpu", "--lengths", "64", "--ranks", "2", "--width", "16",
                       "--repeats", "1", "--backend", "reference_chunked",
                       "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["environment"]["gpu"] == "cpu"
    row = doc["rows"][0]
    assert {row["mixer"] for row in doc["rows"]} == {"rglru", "samu"}
    assert len(row["rank_ms"]) == 2 and row["one_call_at_slice_ms"] > 0

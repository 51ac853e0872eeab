"""benchmarks/bench_context_parallel.py on a CPU, at a tiny size: its JSON file and its rows."""
import json

import torch

from samu import dispatch
from samu.experiment import benchmark_rows


def test_benchmark_runs_on_the_cpu_and_appends_a_row_per_measurement(tmp_path, load_benchmark,
                                                                      rows_folder):
    bench = load_benchmark("bench_context_parallel")
    out = tmp_path / "cp.json"
    assert bench.main(["--device", "cpu", "--lengths", "64", "--ranks", "2", "--width", "16",
                       "--repeats", "1", "--backend", "reference_chunked",
                       "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["environment"]["gpu"] == "cpu"
    row = doc["rows"][0]
    assert {row["mixer"] for row in doc["rows"]} == {"rglru", "samu"}
    assert len(row["rank_ms"]) == 2 and row["one_call_at_slice_ms"] > 0
    rows = benchmark_rows.read_rows(rows_folder / "bench_context_parallel.jsonl")
    assert [(r["mixer"], r["gpu"], r["commit"]) for r in rows] == \
        [(d["mixer"], "cpu", "0123abc") for d in doc["rows"]]
    for line, timed in zip(rows, doc["rows"]):
        assert line["shape"] == {"batch": 1, "length": 64, "width": 16}
        assert line["configuration"] == {"backend": "reference_chunked", "ranks": 2,
                                         "dtype": "float32"}
        values = line["values"]
        assert [values["rank_0_ms"], values["rank_1_ms"]] == timed["rank_ms"]
        assert values["slowest_rank_ms"] == max(timed["rank_ms"])
        assert values["one_call_at_length_ms"] == timed["one_call_at_length_ms"]
        assert line["units"]["speedup_over_one_call"] == "ratio"
        assert line["units"]["rank_1_ms"] == "ms"


def test_host_time_with_launches_stubbed(tmp_path, load_benchmark, rows_folder):
    """--host times each call and rank's share with its Triton launches stubbed (the Triton
    backend, under the interpreter where there is no GPU, so that there are launches to stub),
    and restores them."""
    from samu.ops.common import launching
    bench = load_benchmark("bench_context_parallel")
    real = launching.launch
    out = tmp_path / "cp.json"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert bench.main(["--device", device, "--lengths", "32", "--ranks", "2", "--width", "16",
                       "--repeats", "1", "--mixers", "samu", "--host",
                       "--backend", "fused_controller_hierarchical_chunk8",
                       "--out", str(out)]) == 0
    assert launching.launch is real
    row = json.loads(out.read_text())["rows"][0]
    assert len(row["rank_host_us"]) == 2 and row["one_call_at_slice_host_us"] > 0
    assert row["slowest_rank_host_over_slice_call_host"] == \
        max(row["rank_host_us"]) / row["one_call_at_slice_host_us"]
    rows = rows_folder.parent / dispatch.gpu_slug() / "bench_context_parallel.jsonl"
    (line,) = benchmark_rows.read_rows(rows)
    assert line["units"]["one_call_at_slice_host_us"] == "us"
    assert line["units"]["slowest_rank_host_over_slice_call_host"] == "ratio"


def test_distributed_and_check_spawn_ranks_with_real_collectives(tmp_path):
    """--distributed times each rank's real call in its own process (gloo on the CPU): a row per
    (mixer, length, P) with every rank's time, the call at L / P and the all_gather's share;
    --check spawns its ranks the same way and finds them legal."""
    import subprocess
    import sys

    from samu import paths
    script = str(paths.REPO_ROOT / "benchmarks" / "bench_context_parallel.py")
    tiny = ["--device", "cpu", "--ranks", "2", "--width", "16", "--mixers", "samu"]
    out = tmp_path / "distributed.json"
    done = subprocess.run([sys.executable, script, *tiny, "--distributed", "--lengths", "32",
                           "48", "--repeats", "2", "--backend", "reference_chunked", "--out",
                           str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(out.read_text())
    assert doc["protocol"]["dist_backend"] == "gloo"
    assert [(r["length"], r["ranks"]) for r in doc["rows"]] == [(32, 2), (48, 2)]
    for row in doc["rows"]:
        assert row["devices"] == ["cpu", "cpu"] and len(row["rank_ms"]) == 2
        assert row["slowest_rank_ms"] == max(row["rank_ms"]) > 0
        assert 0 < row["all_gather_share_of_slowest"] < 1
    check = tmp_path / "check.json"
    done = subprocess.run([sys.executable, script, *tiny, "--check", "--check-length", "32",
                           "--out", str(check)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    cases = json.loads(check.read_text())["cases"]
    assert len(cases) == 4 and all(c["legal"] for c in cases)


def test_bad_counts_and_devices_are_refused_by_argparse(load_benchmark, capsys):
    """--ranks 0 died in a ZeroDivisionError, --device garbage in torch, --width 0 deep in
    samu; transformers' benchmark took --lengths 0 into transformers' scan."""
    import pytest
    for program, argv, words in (
            ("bench_context_parallel", ["--ranks", "0"], "--ranks: must be at least 1, got 0"),
            ("bench_context_parallel", ["--width", "0"], "--width: must be at least 1, got 0"),
            ("bench_context_parallel", ["--device", "garbage"],
             "must be cpu, cuda or cuda:<index>, got 'garbage'"),
            ("bench_transformers", ["--device", "cpu", "--lengths", "0"],
             "--lengths: must be at least 1, got 0")):
        bench = load_benchmark(program)
        with pytest.raises(SystemExit) as info:
            (bench.main if program == "bench_context_parallel" else bench.parse)(argv)
        assert info.value.code == 2 and words in capsys.readouterr().err


def test_a_bad_backend_or_warmup_is_refused_before_anything_is_written(tmp_path, load_benchmark,
                                                                      rows_folder, capsys):
    import pytest

    from samu import backends
    bench = load_benchmark("bench_context_parallel")
    out = tmp_path / "cp.json"
    every = ["auto", *dict.fromkeys(n for m in bench._mixers() for n in backends.available(m))]
    for argv, words in (
            (["--backend", "nope"], "--backend: invalid choice: 'nope' (choose from "
             + ", ".join(repr(n) for n in every) + ")"),
            (["--backend", "fused_controller_hierarchical_chunk8"],
             "--backend fused_controller_hierarchical_chunk8 names no backend of rglru"),
            (["--warmup", "-2"], "--warmup: must be at least 0, got -2")):
        with pytest.raises(SystemExit) as info:
            bench.main(["--device", "cpu", "--lengths", "16", "--ranks", "2", "--width", "8",
                        "--repeats", "1", "--out", str(out), *argv])
        assert info.value.code == 2 and words in capsys.readouterr().err
    assert not out.exists() and not rows_folder.exists()


def test_a_mixer_given_twice_is_timed_once_and_warmup_may_be_zero(tmp_path, load_benchmark,
                                                                  rows_folder):
    bench = load_benchmark("bench_context_parallel")
    out = tmp_path / "cp.json"
    assert bench.main(["--device", "cpu", "--lengths", "16", "--ranks", "2", "--width", "8",
                       "--repeats", "1", "--warmup", "0", "--mixers", "samu", "samu",
                       "--backend", "reference_chunked", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["protocol"]["warmup"] == 0
    assert [row["mixer"] for row in doc["rows"]] == ["samu"]

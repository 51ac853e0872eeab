"""The benchmarks' machine-readable rows (samu.experiment.benchmark_rows): one JSON line per
measurement, appended, keyed by gpu, commit, mixer, configuration and shape."""
import dataclasses
import json
import shutil
import subprocess
import threading

import jsonschema
import pytest

from samu import backends, paths
from samu.experiment import benchmark_rows

KEYS = {"format", "benchmark", "gpu", "commit", "mixer", "configuration", "shape", "values",
        "units", "environment"}


@pytest.fixture
def writer(tmp_path, monkeypatch):
    monkeypatch.setenv("SAMU_GIT_COMMIT", "0123abc")
    return benchmark_rows.BenchmarkRows("sweep_backends", "cpu", path=tmp_path / "rows.jsonl")


def test_a_row_holds_every_key_and_a_unit_for_each_value(writer):
    writer.add("samu", {"backend": "reference_chunked"}, "2x16x32",
               {"median_ms": 1.5, "first_call_s": 0.25, "peak_bytes": 10, "launches": 6,
                "legal": True},
               {"launches": "count", "legal": "bool"})
    [row] = benchmark_rows.read_rows(writer.path)
    assert set(row) == KEYS
    assert (row["benchmark"], row["gpu"], row["commit"], row["mixer"]) == \
        ("sweep_backends", "cpu", "0123abc", "samu")
    assert row["shape"] == {"batch": 2, "length": 16, "width": 32}
    assert row["units"] == {"median_ms": "ms", "first_call_s": "s", "peak_bytes": "bytes",
                            "launches": "count", "legal": "bool"}
    assert row["values"]["legal"] is True and row["values"]["median_ms"] == 1.5
    env = row["environment"]
    assert env["gpu"] == "cpu" and env["git_commit"] == "0123abc"
    assert {"torch", "triton", "cuda", "python"} <= set(env)


def test_shapes_come_in_any_form_and_other_axes_stay_named(writer):
    for shape in ((1, 8, 4), [1, 8, 4], "1x8x4", {"batch": 1, "length": 8, "width": 4}):
        assert writer.row(None, {}, shape, {"x_ms": 1.0})["shape"] == \
            {"batch": 1, "length": 8, "width": 4}
    carry = writer.row("rglru", {}, {"batch": 1, "chunks": 4096, "width": 2048}, {"x_ms": 1.0})
    assert carry["shape"] == {"batch": 1, "chunks": 4096, "width": 2048}


def test_a_row_that_cannot_be_read_back_is_refused(writer):
    with pytest.raises(ValueError, match="no unit"):
        writer.row("samu", {}, (1, 8, 4), {"launches": 6})
    with pytest.raises(ValueError, match="units for no value"):
        writer.row("samu", {}, (1, 8, 4), {"x_ms": 1.0}, {"y": "ms"})
    with pytest.raises(jsonschema.ValidationError):
        writer.row("not_a_mixer", {}, (1, 8, 4), {"x_ms": 1.0})
    with pytest.raises(jsonschema.ValidationError):
        writer.row("samu", {}, (1, 8, 4), {})
    with pytest.raises(jsonschema.ValidationError):
        writer.row("samu", {}, (1, 8, 4), {"x_ms": "fast"}, {"x_ms": "ms"})
    assert not writer.path.exists()  # nothing was appended
    row = writer.row("samu", {}, (1, 8, 4), {"x_ms": float("inf"), "y_ms": float("nan")})
    assert row["values"] == {"x_ms": "inf", "y_ms": "nan"}  # JSON has neither


def test_rows_are_appended_to_what_the_file_holds(writer):
    first = writer.add("samu", {"backend": "a"}, (1, 8, 4), {"x_ms": 1.0})
    again = benchmark_rows.BenchmarkRows("sweep_backends", "cpu", path=writer.path)
    again.add("rglru", {"backend": "b"}, (1, 8, 4), {"x_ms": 2.0})
    again.add("rglru", {"backend": "c"}, (1, 8, 4), {"x_ms": 3.0})
    rows = benchmark_rows.read_rows(writer.path)
    assert rows[0] == first
    assert [r["configuration"]["backend"] for r in rows] == ["a", "b", "c"]
    assert writer.path.read_text().count("\n") == 3 and again.written == 2
    assert again.summary() == f"appended 2 rows to {paths.relative(writer.path)}"


def test_a_row_cut_short_is_skipped_and_the_next_row_starts_its_own_line(writer):
    writer.add("samu", {"backend": "a"}, (1, 8, 4), {"x_ms": 1.0})
    whole = writer.path.read_text()
    with open(writer.path, "a") as f:  # a writer killed mid-line
        f.write(whole[:len(whole) // 2])
    writer.add("samu", {"backend": "b"}, (1, 8, 4), {"x_ms": 2.0})
    lines = writer.path.read_text().splitlines()
    assert len(lines) == 3
    assert json.loads(lines[2])["configuration"] == {"backend": "b"}
    assert [r["configuration"]["backend"] for r in benchmark_rows.read_rows(writer.path)] == \
        ["a", "b"]


def test_writers_at_once_never_interleave_their_lines(tmp_path):
    path = tmp_path / "deep" / "rows.jsonl"  # the folder is made on the first append
    big = "y" * 20000  # several pages: no line of this length is written in one go by accident

    def write(k):
        for i in range(50):
            benchmark_rows.append_line(path, json.dumps({"format": 1, "k": k, "i": i,
                                                         "pad": big}))
    threads = [threading.Thread(target=write, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = path.read_text().splitlines()
    assert len(lines) == 300
    rows = [json.loads(line) for line in lines]  # every line whole
    assert sorted((r["k"], r["i"]) for r in rows) == [(k, i) for k in range(6) for i in range(50)]
    with pytest.raises(ValueError):
        benchmark_rows.append_line(path, "two\nlines")


def test_rows_go_to_the_data_folder_by_gpu_and_benchmark(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    monkeypatch.delenv("SAMU_GIT_COMMIT", raising=False)
    rows = benchmark_rows.BenchmarkRows("host_calls", "cpu")
    assert rows.path == tmp_path / "benchmarks" / "cpu" / "host_calls.jsonl"
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=paths.REPO_ROOT,
                          capture_output=True, text=True)
    if head.returncode:
        pytest.skip("samu does not run from a git checkout")
    assert rows.commit == head.stdout.strip()  # git's HEAD without SAMU_GIT_COMMIT


def test_a_configuration_names_its_backend_and_every_launch_setting():
    from samu.ops.samu.chunk import SamuConfig
    name = [n for n in backends.available("samu")
            if isinstance(backends.REGISTRY["samu"][n].config, SamuConfig)][-1]
    config = backends.REGISTRY["samu"][name].config
    got = benchmark_rows.configuration("samu", name, role="output")
    assert got["backend"] == name and got["role"] == "output"
    assert got["settings"] == json.loads(json.dumps(dataclasses.asdict(config)))
    assert got["settings"]["output"]["warps"] == config.output.warps
    assert got["settings_digest"] == backends.REGISTRY["samu"][name].settings
    changed = dataclasses.replace(config, output=dataclasses.replace(config.output, warps=8))
    other = benchmark_rows.configuration("samu", changed)
    assert other["backend"] == changed.name and other["settings"]["output"]["warps"] == 8
    assert other["settings_digest"] != got["settings_digest"]
    assert benchmark_rows.configuration("samu", "reference_chunked") == \
        {"backend": "reference_chunked"}
    assert benchmark_rows.configuration("samu", "auto", ranks=2) == {"backend": "auto", "ranks": 2}

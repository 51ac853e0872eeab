"""The context-parallel timings as notebook 04 shows them (samu.experiment.context_parallel)."""
import pytest

from samu import paths
from samu.experiment import context_parallel, schema
from samu import mixers


def _doc():
    rows = []
    for mixer in mixers.names():
        for ranks in (2, 4):
            for length in (1024, 2048):
                rows.append({"mixer": mixer, "length": length, "width": 16, "ranks": ranks,
                             "backend": "test_backend",
                             "one_call_at_length_ms": 2.0, "one_call_at_slice_ms": 2.0 / ranks,
                             "rank_ms": [1.5 / ranks] * ranks, "slowest_rank_ms": 1.5 / ranks,
                             "slowest_rank_over_slice_call": 0.75,
                             "speedup_over_one_call": 1.5 * ranks})
    return {"environment": {"gpu": "Test GPU", "torch": "x", "cuda": None},
            "protocol": {"repeats": 1}, "rows": rows}


def test_frame_and_figure():
    df = context_parallel.frame(_doc())
    assert len(df) == 8 and list(df["ranks"].unique()) == [2, 4]
    fig = context_parallel.figure(df, "Test GPU")
    left, right = fig.axes
    assert len(left.lines) == 4 + 2  # a line per (mixer, P), the target and 1
    assert left.lines[-2].get_ydata()[0] == context_parallel.TARGET_SHARE_OVER_SLICE_CALL


def test_load_prefers_the_data_folder_then_the_committed_file(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    committed = paths.REPO_ROOT / "data" / "context_parallel" / "nvidia-h200.json"
    doc, path = context_parallel.load()
    assert path == committed and doc["environment"]["gpu"] == "NVIDIA H200"
    assert context_parallel.load("test-gpu")[1] == committed  # a GPU never timed: the H200's
    with monkeypatch.context() as m:
        m.setattr(paths, "REPO_ROOT", tmp_path / "elsewhere")
        with pytest.raises(FileNotFoundError,
                           match="no context-parallel timings for test-gpu or nvidia-h200"):
            context_parallel.load("test-gpu")
    schema.write_json_atomic(context_parallel.result_file("nvidia-h200"), _doc(),
                             kind="context_parallel")
    doc, path = context_parallel.load()
    assert path == tmp_path / "context_parallel" / "nvidia-h200.json"
    assert doc["environment"]["gpu"] == "Test GPU"


def test_gpu_time_is_drawn_where_the_rows_have_it():
    """A first panel of GPU-time ratios (with the target) where the rows carry them: a line per
    (mixer, P), gaps where a row has none."""
    doc = _doc()
    for row in doc["rows"][:4]:  # RG-LRU's rows: GPU time replayed from a graph
        row.update(one_call_at_slice_gpu_ms=0.5, slowest_rank_gpu_ms=0.6,
                   slowest_rank_over_slice_call_gpu=1.2)
    df = context_parallel.frame(doc)
    assert "slowest_rank_over_slice_call_gpu" in df
    gpu, median, gain = context_parallel.figure(df, "Test GPU").axes
    assert "GPU time" in gpu.get_ylabel() and "median" in median.get_ylabel()
    drawn = [list(line.get_ydata()) for line in gpu.lines[:4]]
    assert drawn[:2] == [[1.2, 1.2], [1.2, 1.2]]  # RG-LRU, P = 2 and 4
    assert all(all(v != v for v in ys) for ys in drawn[2:])  # SAMU: no GPU time (NaN)
    assert gpu.lines[4].get_ydata()[0] == context_parallel.TARGET_SHARE_OVER_SLICE_CALL


@pytest.mark.parametrize("path, kind", [
    ("data/context_parallel/nvidia-h200.json", "context_parallel"),
    ("data/context_parallel/nvidia-h200_check.json", "context_parallel_check")])
def test_committed_files_validate(path, kind):
    schema.read_valid_json(paths.REPO_ROOT / path, kind)


def test_a_malformed_document_is_refused_unwritten_and_unread(tmp_path, monkeypatch):
    """The benchmark's write and notebook 04's read both check the document: a row without its
    slowest rank is refused by name, and nothing is written."""
    doc = _doc()
    del doc["rows"][0]["slowest_rank_ms"]
    target = tmp_path / "context_parallel" / "test-gpu.json"
    with pytest.raises(Exception, match="slowest_rank_ms"):
        schema.write_json_atomic(target, doc, kind="context_parallel")
    assert not target.exists()
    target.parent.mkdir()
    schema.write_json_atomic(target, doc, kind=None)
    monkeypatch.setattr(paths, "DATA", tmp_path)
    with pytest.raises(schema.ResultFileError, match="slowest_rank_ms"):
        context_parallel.load("test-gpu")


def test_a_failed_check_with_a_non_finite_error_is_still_written(tmp_path):
    """--check must record an illegal case, NaN error included (written as "nan")."""
    report = {"environment": {"gpu": "Test GPU", "torch": "x", "cuda": None},
              "cases": [{"case": "packed", "ranks": 2, "slices": [8, 8], "cu_seqlens": [0, 16],
                         "backends": ["b", "b"], "errors": {"y": float("nan")},
                         "bounds": {"y": 1e-3}, "eager_errors": {"y": 1e-4}, "legal": False}]}
    path = schema.write_json_atomic(tmp_path / "check.json", report,
                                    kind="context_parallel_check")
    assert schema.read_valid_json(path, "context_parallel_check")["cases"][0]["errors"] == {
        "y": "nan"}

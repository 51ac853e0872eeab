"""The context-parallel timings as notebook 04 shows them (samu.experiment.context_parallel)."""
import pytest

from samu import paths
from samu.experiment import context_parallel, schema


def _doc():
    rows = []
    for mixer in ("rglru", "samu"):
        for ranks in (2, 4):
            for length in (1024, 2048):
                rows.append({"mixer": mixer, "length": length, "width": 16, "ranks": ranks,
                             "one_call_at_length_ms": 2.0, "one_call_at_slice_ms": 2.0 / ranks,
                             "rank_ms": [1.5 / ranks] * ranks, "slowest_rank_ms": 1.5 / ranks,
                             "slowest_rank_over_slice_call": 0.75,
                             "speedup_over_one_call": 1.5 * ranks})
    return {"environment": {"gpu": "Test GPU", "torch": "x"}, "rows": rows}


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
    schema.write_json_atomic(context_parallel.result_file("nvidia-h200"), _doc(), kind=None)
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

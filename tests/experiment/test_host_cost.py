"""Host cost against a Linear as notebook 04 shows it (samu.experiment.host_cost)."""
import pytest

from samu import paths
from samu.experiment import benchmark_rows, host_cost


def _rows(writer):
    """Three runs as benchmarks/host_budget.py writes them: both mixers at D = 1024, then at
    2048, then SAMU alone (as with --mixer samu)."""
    for run, mixers in enumerate((("samu", "rglru"), ("samu",)), start=1):
        for width in ((1024, 2048) if run == 1 else (2048,)):
            shape = (1, 128, width)
            writer.add(None, {"operation": "empty synchronise"}, shape, {"host_wall_us": 5.0})
            writer.add(None, {"operation": "torch.nn.Linear forward+backward"}, shape,
                       {"host_wall_us": 400.0 + run})
            for mixer in mixers:
                ratio = (1.5 if mixer == "samu" else 2.5) + 0.1 * run
                writer.add(mixer, {"backend": "b"}, shape,
                           {"interleaved_over_linear": ratio, "interleaved_linear_us": 500.0,
                            "interleaved_forward_backward_us": 500.0 * ratio,
                            "null_function_us": 200.0, "launches_stubbed_us": 600.0,
                            "protocol_forward_backward_us": 650.0},
                           {"interleaved_over_linear": "ratio"})
            if (run, width) == (1, 2048):  # this width also timed a named backend
                writer.add("samu", {"backend": "single", "asked": "single"}, shape,
                           {"interleaved_over_linear": 1.2, "interleaved_linear_us": 500.0,
                            "interleaved_forward_backward_us": 600.0},
                           {"interleaved_over_linear": "ratio"})


def test_frame_and_figure(tmp_path):
    writer = benchmark_rows.BenchmarkRows("host_budget", path=tmp_path / "host_budget.jsonl")
    _rows(writer)
    every = host_cost.frame(benchmark_rows.read_rows(writer.path))
    assert list(every["asked"]) == ["auto"] * 4 + ["single", "auto"]  # rows without: auto
    assert list(every["backend"]) == ["b"] * 4 + ["single", "b"]
    df = every[every["asked"] == "auto"]
    assert list(df["run"]) == [1, 1, 2, 2, 3]  # a run starts at its empty synchronise row
    assert list(df["width"]) == [1024, 1024, 2048, 2048, 2048]
    assert list(df["linear_alone_us"]) == [401.0] * 4 + [402.0]
    assert df["over_linear"].iloc[-1] == pytest.approx(1.7)
    fig = host_cost.figure(every, "Test GPU")  # draws the defaults' rows alone
    left, right = fig.axes
    targets = [line.get_ydata()[0] for line in left.lines if line.get_linestyle() == ":"]
    assert sorted(targets) == sorted(host_cost.targets().values()) == [1.0, 1.2]
    assert len(left.lines) == 4 + 2  # a series per (mixer, width), the two targets
    heights = [p.get_height() for p in right.patches]
    assert heights[0] == 402.0  # the latest run's Linear, then SAMU's three parts
    assert heights[1:] == [200.0, 400.0, 50.0]
    samu_2048 = [line for line in left.lines if line.get_label().startswith("SAMU, D = 2048")]
    assert [list(line.get_xdata()) for line in samu_2048] == [[2, 3]]
    assert 1.2 not in list(samu_2048[0].get_ydata())  # the named backend's row is not drawn
    named = host_cost.figure(every[every["asked"] == "single"], "Test GPU")
    assert [line.get_label() for line in named.axes[0].lines][0] == "SAMU single, D = 2048"


def test_load_prefers_the_data_folder_then_the_committed_file(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    committed = paths.REPO_ROOT / "data" / "benchmarks" / "nvidia-h200" / "host_budget.jsonl"
    rows, path = host_cost.load()
    assert path == committed and rows[-1]["gpu"] == "nvidia-h200"
    assert not host_cost.frame(rows).empty
    assert host_cost.load("test-gpu")[1] == committed  # a GPU never timed: the H200's
    with monkeypatch.context() as m:
        m.setattr(paths, "REPO_ROOT", tmp_path / "elsewhere")
        with pytest.raises(FileNotFoundError,
                           match="no host-budget rows for test-gpu or nvidia-h200"):
            host_cost.load("test-gpu")

import pytest

from samu import paths
from samu.experiment import protocol, report, schema


def test_seed_frame_and_published_speedups():
    seed = report.frame(report.seed_document(), "seed")
    assert len(seed) == 8
    sp = report.speedups(seed)
    assert len(sp) == 4
    assert sp["speedup"].min() == pytest.approx(1.33, abs=0.01)
    assert sp["speedup"].max() == pytest.approx(1.67, abs=0.01)
    assert (sp["low"] <= sp["speedup"]).all() and (sp["speedup"] <= sp["high"]).all()


def test_combine_and_figures(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    chosen = {"rglru": "reference_chunked", "samu": "reference_chunked"}
    for k, shape in enumerate([(1, 8, 16), (2, 5, 16)]):
        rows = protocol.time_shape(shape, k, chosen, "cpu")
        protocol.add_floor_figures(rows, 4.22e12)
        protocol.write_shape_result("test-gpu", shape, rows)
    doc = report.combine("test-gpu")
    schema.validate(doc)
    assert [r["shape"]["length"] for r in doc["rows"]] == [5, 5, 8, 8]
    df = report.frame(doc, "test-gpu")
    paths_ = report.draw_figures(df, report.frame(report.seed_document(), "seed"), "test-gpu")
    assert [p.name for p in paths_] == [f"test-gpu_{n}.png" for n in
                                        ("time", "speedup", "memory", "roofline")]
    assert all(p.stat().st_size > 10_000 for p in paths_)
    assert report.seed_comparison(df, df).shape[0] == 4


def test_combine_without_results_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    with pytest.raises(FileNotFoundError, match="run notebook 03"):
        report.combine("nothing-here")


def test_failed_figure_save_leaves_old_figure_and_no_temporary(tmp_path, monkeypatch):
    import matplotlib.figure
    import matplotlib.pyplot as plt

    monkeypatch.setattr(paths, "DATA", tmp_path)
    folder = paths.figures_dir()
    folder.mkdir(parents=True)
    old = folder / "test-gpu_time.png"
    old.write_bytes(b"the previous figure")

    def write_half_then_fail(self, fname, *args, **kwargs):
        with open(fname, "wb") as f:
            f.write(b"\x89PNG half")
        raise OSError("disk full")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", write_half_then_fail)
    seed = report.frame(report.seed_document(), "seed")
    with pytest.raises(OSError, match="disk full"):
        report.draw_figures(seed, seed, "test-gpu")
    assert [p.name for p in folder.iterdir()] == [old.name]
    assert old.read_bytes() == b"the previous figure"
    assert plt.get_fignums() == []  # the failed figure is closed too

import copy
import json
import math
import shutil

import pytest

from samu import dispatch, mixers, paths
from samu.experiment import peers, protocol, report, schema


def published_frame():
    return report.frame(report.published_h800_document(), report.PUBLISHED_SOURCE)


def cpu_results(slug="test-gpu", shapes=((1, 8, 16), (2, 5, 16))):
    """Per-shape files of a CPU run under paths.DATA, as notebook 03 writes them."""
    chosen = {"rglru": "reference_chunked", "samu": "reference_chunked"}
    for k, shape in enumerate(shapes):
        rows = protocol.time_shape(shape, k, chosen, "cpu")
        protocol.add_floor_figures(rows, 4.22e12)
        protocol.write_shape_result(slug, shape, rows)


def as_gpu(doc, gpu="NVIDIA H200"):
    doc = copy.deepcopy(doc)
    for env in [doc["environment"], *doc.get("shape_environments", {}).values()]:
        env.update(gpu=gpu, device="cuda")
    return doc


@pytest.fixture
def gpu_machine(monkeypatch):
    """This machine as an H200 machine would look to the code (CUDA available, the device an
    H200), while the tests still time CPU tensors: results must be labelled by the device timed."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")


MACHINES = ["this machine", "a GPU machine"]


@pytest.fixture(params=MACHINES)
def machine(request):
    """Each test that takes it runs here and on a simulated GPU machine (gpu_machine)."""
    if request.param == "a GPU machine":
        request.getfixturevalue("gpu_machine")
    return request.param


def test_published_frame_and_speedups():
    published = published_frame()
    assert len(published) == 8
    assert (published["source"] == "published H800 PCIe").all()
    sp = report.speedups(published)
    assert len(sp) == 4
    assert sp["speedup"].min() == pytest.approx(1.33, abs=0.01)
    assert sp["speedup"].max() == pytest.approx(1.67, abs=0.01)
    assert (sp["low"] <= sp["speedup"]).all() and (sp["speedup"] <= sp["high"]).all()


def test_published_h800_rows_take_the_h800_pcie_floor():
    """SPEC section 8: the H800 PCIe's datasheet bandwidth, 2.0 TB/s, not the H200's."""
    assert report.PUBLISHED_H800_PCIE_BANDWIDTH == 2.0e12
    published = published_frame().set_index(["shape", "mixer"])
    assert (published["copy_TBps"] == 2.0).all()
    row = published.loc[("(4, 2048, 2048)", "rglru")]
    assert row["floor_ms"] == pytest.approx(10 * 4 * 2048 * 2048 / 2.0e12 * 1e3)
    # SPEC section 8's table: 30.4 and 15.6 times the H800 PCIe floor
    assert row["times_floor"] == pytest.approx(30.4, abs=0.05)
    samu_row = published.loc[("(1, 32768, 2048)", "samu")]
    assert samu_row["times_floor"] == pytest.approx(15.6, abs=0.05)


def test_committed_h200_rows_take_the_h200_floor():
    df = report.frame(report.combine(report.COMMITTED_SLUG, write=False))
    assert (df["machine"] == "NVIDIA H200").all() and not df["cpu"].any()
    assert df["copy_TBps"].tolist() == pytest.approx([4.22] * len(df))
    fb = df["forward_backward_ms"]
    assert df["achieved_TBps"].tolist() == pytest.approx(
        [10 * s.elements / (t * 1e-3) / 1e12 for s, t in zip(df["shape_tuple"], fb)])


def test_cpu_rows_have_no_floor_bandwidth_or_memory(tmp_path, monkeypatch, machine):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    cpu_results()  # written with the H200's bandwidth: the report must not use it
    df = report.frame(report.combine("test-gpu", write=False))
    assert df["cpu"].all() and (df["machine"] == report.CPU_LABEL).all()
    for column in ("floor_ms", "times_floor", "floor_fraction", "forward_times_floor",
                   "achieved_TBps", "copy_TBps", "peak_allocated_delta_units"):
        assert df[column].isna().all(), column
    table = report.summary_table(df)
    assert table["times_floor"].isna().all() and table["achieved_TBps"].isna().all()
    assert report.run_label(df) == report.CPU_NOTE
    assert report.published_comparison(df, published_frame()).empty
    # slug "cpu" marks CPU results whatever the environment says
    gpu_doc = as_gpu(report.combine("test-gpu", write=False))
    assert report.frame(gpu_doc, report.CPU_SLUG)["floor_ms"].isna().all()
    assert report.frame(gpu_doc)["floor_ms"].notna().all()


def test_nan_floor_figures_in_a_file_read_back_as_nan(tmp_path, monkeypatch, machine):
    """Notebook 03 on a CPU writes its floor figures as NaN, which the file holds as "nan"."""
    monkeypatch.setattr(paths, "DATA", tmp_path)
    rows = protocol.time_shape((1, 8, 16), 0, {"rglru": "reference_chunked",
                                               "samu": "reference_chunked"}, "cpu")
    protocol.add_floor_figures(rows, float("nan"))
    path = protocol.write_shape_result("cpu", (1, 8, 16), rows)
    assert schema.read_json(path)["rows"][0]["times_floor"] == "nan"
    assert report.frame(report.combine("cpu"))["times_floor"].isna().all()
    assert report._number("nan") != report._number("nan")  # NaN


def test_combine_and_figures(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    cpu_results()
    doc = report.combine("test-gpu")
    schema.validate(doc)
    assert paths.results_file("test-gpu").exists()
    assert [r["shape"]["length"] for r in doc["rows"]] == [5, 5, 8, 8]
    df = report.frame(doc)
    paths_ = report.draw_figures(df, published_frame(), "test-gpu")
    assert [p.name for p in paths_] == [f"test-gpu_{n}.png" for n in
                                        ("time", "speedup", "memory", "roofline")]
    assert all(p.stat().st_size > 10_000 for p in paths_)
    gpu = report.frame(as_gpu(doc))
    assert report.published_comparison(gpu, gpu).shape[0] == 4
    assert set(report.published_comparison(gpu, gpu).columns) >= {
        "published_h800_ms", "measured_ms", "faster_than_published"}


def test_combine_without_write_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    cpu_results()
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    doc = report.combine("test-gpu", write=False)
    assert len(doc["rows"]) == 4
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert not paths.results_file("test-gpu").exists()


def test_combine_refuses_a_shape_of_another_gpu_or_protocol(tmp_path, monkeypatch):
    """An H100's file among the H200's shapes made a document headed "NVIDIA H200" that held
    an H100 row."""
    monkeypatch.setattr(paths, "DATA", tmp_path)
    committed = paths.REPO_ROOT / "data" / "results"
    folder = paths.results_dir(report.COMMITTED_SLUG)
    shutil.copytree(committed / report.COMMITTED_SLUG, folder)
    intruder = sorted(p for p in committed.iterdir()
                      if p.is_dir() and p.name != report.COMMITTED_SLUG)[0]
    shape = sorted(intruder.glob("*.json"))[-1]
    shutil.copy(shape, folder / shape.name)
    with pytest.raises(schema.ResultFileError, match=f"{shape.name}.*measured on "):
        report.combine(report.COMMITTED_SLUG, write=False)
    shutil.copy(committed / report.COMMITTED_SLUG / shape.name, folder / shape.name)
    doc = json.loads((folder / shape.name).read_text())
    doc["protocol"]["order"] = f"{doc['protocol']['order']}, reversed"
    (folder / shape.name).write_text(json.dumps(doc))
    with pytest.raises(schema.ResultFileError, match="its protocol differs"):
        report.combine(report.COMMITTED_SLUG, write=False)
    assert not paths.results_file(report.COMMITTED_SLUG).exists()


def test_viewing_the_committed_results_rewrites_nothing():
    combined = paths.REPO_ROOT / "data" / "results" / f"{report.COMMITTED_SLUG}.json"
    before = combined.read_bytes()
    figs = report.figures(report.frame(report.combine(report.COMMITTED_SLUG, write=False)),
                          published_frame())
    # the committed rows carry GPU times, so the floor-multiples figure is drawn too
    assert sorted(figs) == ["floor_multiples", "memory", "roofline", "speedup", "time"]
    assert report.png_bytes(figs["roofline"])[:4] == b"\x89PNG"
    assert combined.read_bytes() == before


def test_default_slug(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    monkeypatch.setattr(dispatch, "gpu_slug", lambda name=None: "cpu")
    assert report.default_slug() == report.COMMITTED_SLUG == "nvidia-h200"
    assert "committed nvidia-h200" in report.describe_choice(report.default_slug())
    assert "no per-shape results" in report.describe_choice(report.default_slug())
    paths.results_dir("cpu").mkdir(parents=True)
    assert report.default_slug() == "nvidia-h200"  # an empty folder is no results
    cpu_results("cpu", shapes=((1, 8, 16),))
    assert report.default_slug() == "cpu"
    assert report.CPU_NOTE in report.describe_choice("cpu")


def test_cpu_figures_are_labelled_cpu(tmp_path, monkeypatch, machine):
    """A CPU run's figures say so; those of GPU rows alone (memory, roofline) say they show the
    published result alone, and why."""
    monkeypatch.setattr(paths, "DATA", tmp_path)
    cpu_results()
    figs = report.figures(report.frame(report.combine("test-gpu", write=False)), published_frame())
    for name, fig in figs.items():
        title = fig.axes[0].get_title()
        assert "H200" not in title and "this GPU" not in title, name
        if name in ("memory", "roofline"):
            assert f"the {report.PUBLISHED_SOURCE} result alone" in title, name
            assert f"a {report.CPU_LABEL} run, which has no" in title, name
            assert "omitted" not in title and "beside" not in title, name
        else:
            assert report.CPU_NOTE in title, name
    roofline = figs["roofline"].axes[0]
    machines = {t.get_text() for t in roofline.get_legend().get_texts()} - {"RG-LRU", "SAMU"}
    assert not any(m.startswith(report.CPU_LABEL) for m in machines)


def test_roofline_axes_and_legend():
    df = report.frame(report.combine(report.COMMITTED_SLUG, write=False))
    fig = report.figures(df, published_frame())["roofline"]
    ax = fig.axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    # one marker per row: every H200 and every published row
    assert sum(len(c.get_offsets()) for c in ax.collections) == len(df) + 8
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("4.22 TB/s" in t for t in labels) and any("2.00 TB/s" in t for t in labels)
    assert any("790 TFLOP/s" in t for t in labels)
    assert ax.get_legend().get_bbox_to_anchor().x0 > ax.bbox.x1 - 1  # outside the axes
    for axis in (ax.xaxis, ax.yaxis):
        texts = [t.get_text() for t in axis.get_ticklabels()]
        assert texts and all("10^" not in t and "times" not in t for t in texts), texts
        assert all(t == f"{float(t):g}" for t in texts), texts


def test_the_roofline_legend_draws_what_the_points_are():
    """Colour is the mixer (a patch of its colour), the marker the machine (drawn as the points
    are, black edge): a legend marker is a machine's, never a mixer's."""
    from matplotlib.colors import to_rgba
    from matplotlib.patches import Patch
    df = report.frame(report.combine(report.COMMITTED_SLUG, write=False))
    ax = report.figures(df, published_frame())["roofline"].axes[0]
    legend = ax.get_legend()
    entries = dict(zip([t.get_text() for t in legend.get_texts()], legend.legend_handles))
    for mixer in mixers.names():
        patch = entries[mixers.LABELS[mixer]]
        assert isinstance(patch, Patch)
        assert patch.get_facecolor() == to_rgba(mixers.COLOURS[mixer])
    point_faces = {tuple(c.get_facecolor()[0]) for c in ax.collections}
    assert point_faces == {to_rgba(mixers.COLOURS[m]) for m in mixers.names()}
    markers = {c.get_paths()[0].vertices.round(3).tobytes() for c in ax.collections}
    assert len(markers) == 2  # one marker per machine: the H200 and the published H800
    for machine in ("NVIDIA H200", "NVIDIA H800 PCIe"):
        handle = entries[machine]
        assert handle.get_markerfacecolor() == "white" and handle.get_markeredgecolor() == "black"


def test_flops_per_element_follows_the_performance_notes():
    assert report.flops_per_element("samu", 2048) == 120
    # docs/PERFORMANCE.md: ~4600 FLOPs per element at D = 2048 (bw = 128) for RG-LRU's gates
    assert report.flops_per_element("rglru", 2048) - 120 == pytest.approx(4608)


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
    published = published_frame()
    with pytest.raises(OSError, match="disk full"):
        report.draw_figures(published, published, "test-gpu")
    assert [p.name for p in folder.iterdir()] == [old.name]
    assert old.read_bytes() == b"the previous figure"
    assert plt.get_fignums() == []  # no figure is left open


def test_vocabulary_seed_means_random_seeds_only():
    """'the published H800 result' names the reference file; 'seed' means random seeds only."""
    import json

    banned = ("seed's", "the seed", "seed file", "seed_document", "seed_comparison", "seed_h800",
              "seed_df", "seed_doc", "than_seed", "seed h800", "seed nvidia", "seed parameters",
              "seed control")
    texts = {p.name: p.read_text() for p in (
        *sorted((paths.REPO_ROOT / "samu" / "experiment" / "report").glob("*.py")),
        paths.REPO_ROOT / "samu" / "experiment" / "pipeline.py",
        paths.REPO_ROOT / "tools" / "make_notebooks.py")}
    for nb in sorted((paths.REPO_ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        texts[nb.name] = "\n".join("".join(c["source"]) for c in cells)
    for name, text in texts.items():
        for phrase in banned:
            assert phrase not in text.lower(), (name, phrase)


def test_floor_multiples_figure_shows_median_gpu_time_and_public_pipelines(tmp_path):
    """GPU rows with a CUDA-graph time and public-pipeline medians get a figure of them all as
    multiples of the floor, a series per peer; CPU rows get none."""
    doc = report.published_h800_document()
    first, second = report.HEADLINE_PEER, "other_scan"  # the second one no registry holds
    rows = []
    for row in doc["rows"]:
        fb = row["forward_backward"]["median_ms"]
        row = dict(row, gpu_time_ms=fb / 3,
                   peers={first: {"forward_backward": {"median_ms": fb * 2}, "speedup": 2.0},
                          second: {"forward_backward": {"median_ms": fb * 5}, "speedup": 5.0}})
        rows.append(row)
    h200 = dict(doc, rows=rows, environment=dict(doc["environment"], gpu="NVIDIA H200"))
    df = report.frame(h200)
    assert (df["speedup_vs_peer"] == 2.0).all()  # the headline is the first peer
    floors = report.floor_multiples(df)
    labels = [f"{peers.PEERS[0].label} median", "other_scan median"]
    assert set(floors["series"]) == {f"{m} {s}" for m in mixers.names()
                                     for s in ("median", "GPU time", *labels)}
    median = floors[floors["series"] == "samu median"]["times_floor"].to_numpy()
    gpu = floors[floors["series"] == "samu GPU time"]["times_floor"].to_numpy()
    second_peer = floors[floors["series"] == f"samu {labels[1]}"]["times_floor"].to_numpy()
    assert (abs(gpu * 3 - median) < 1e-9).all() and (abs(second_peer - 5 * median) < 1e-9).all()
    table = report.summary_table(df)
    assert list(table.columns[table.columns.get_loc("speedup_vs_peer"):][:3]) == [
        "speedup_vs_peer", f"speedup_vs_{second}", "host_ratio_to_linear"]
    assert (table[f"speedup_vs_{second}"] == 5.0).all()
    assert "floor_multiples" in report.figures(df, report.frame(doc, report.PUBLISHED_SOURCE))
    cpu = report.frame(dict(h200, environment=dict(doc["environment"], gpu="cpu")), "cpu")
    assert report.floor_multiples(cpu).empty


def test_results_are_labelled_by_the_device_timed(tmp_path, monkeypatch, gpu_machine):
    """On a machine with an H200, rows timed on CPU tensors are a CPU result: gpu "cpu" in the
    file, no H200 floor, bandwidth or memory in the report."""
    monkeypatch.setattr(paths, "DATA", tmp_path)
    cpu_results()
    doc = report.combine("test-gpu", write=False)
    assert doc["environment"]["gpu"] == "cpu" and doc["environment"]["device"] == "cpu"
    assert {row["device"] for row in doc["rows"]} == {"cpu"}
    assert all(env["gpu"] == "cpu" for env in doc["shape_environments"].values())
    df = report.frame(doc)
    assert df["cpu"].all() and (df["machine"] == report.CPU_LABEL).all()
    assert df["floor_ms"].isna().all() and df["peak_allocated_delta_units"].isna().all()
    assert "H200" not in report.run_label(df)


def test_the_environment_is_that_of_the_device_timed(gpu_machine):
    assert protocol.environment("cpu")["gpu"] == "cpu"
    assert protocol.environment("cpu")["driver"] is None
    cuda = protocol.environment("cuda")
    assert cuda["gpu"] == "NVIDIA H200" and cuda["device"] == "cuda"
    assert protocol.device_slug("cpu") == "cpu" and protocol.device_slug("cuda") == "nvidia-h200"


def test_a_truncated_result_file_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "DATA", tmp_path)
    cpu_results()
    broken = paths.results_dir("test-gpu") / "2x5x16.json"
    broken.write_text(broken.read_text()[:200])
    with pytest.raises(schema.ResultFileError) as caught:
        report.combine("test-gpu", write=False)
    assert isinstance(caught.value, ValueError) and caught.value.path == broken
    message = str(caught.value)
    assert str(broken) in message and "not valid JSON" in message and "line" in message


@pytest.mark.parametrize("breakage, words", [
    (lambda d: d.pop("rows"), "'rows' is a required property"),
    (lambda d: d["rows"][0]["forward"].update(median_ms="fast"), "$.rows[0].forward.median_ms"),
    (lambda d: d.update(schema_version=2), "$.schema_version"),
], ids=["no rows", "a median that is no number", "another schema version"])
def test_a_result_file_that_fails_the_schema_is_named(tmp_path, monkeypatch, breakage, words):
    import json

    monkeypatch.setattr(paths, "DATA", tmp_path)
    cpu_results()
    broken = paths.results_dir("test-gpu") / "1x8x16.json"
    doc = json.loads(broken.read_text())
    breakage(doc)
    broken.write_text(json.dumps(doc))
    with pytest.raises(schema.ResultFileError) as caught:
        report.combine("test-gpu")
    message = str(caught.value)
    assert str(broken) in message and "not a valid result document" in message
    assert words in message, message
    assert not paths.results_file("test-gpu").exists()  # nothing combined, nothing written


def test_a_registered_peer_appears_in_the_report(tmp_path, monkeypatch):
    """A toy second peer, in a registry passed to the protocol, is timed on the CPU, read back
    from the result file, and gets its own column in the summary and its own series."""
    monkeypatch.setattr(paths, "DATA", tmp_path)
    toy = peers.PeerSpec("toy", ("samu",), "toy pipeline", available=lambda module: True,
                         build=lambda module: module)
    registry = (*peers.PEERS, toy)
    chosen = {"rglru": "reference_chunked", "samu": "reference_chunked"}
    rows = protocol.time_shape((1, 8, 16), 0, chosen, "cpu", peers=registry)
    protocol.write_shape_result("test-gpu", (1, 8, 16), rows)
    df = report.frame(report.combine("test-gpu", write=False))
    assert report.peer_names(df, registry) == ["toy"]
    table = report.summary_table(df, registry).set_index("mixer")
    want = next(r for r in rows if r["architecture"] == "samu")["peers"]["toy"]["speedup"]
    assert table.loc["samu", "speedup_vs_toy"] == pytest.approx(want, abs=1e-4)
    assert math.isnan(table.loc["rglru", "speedup_vs_toy"])  # the toy serves SAMU only
    assert math.isnan(table.loc["samu", "speedup_vs_peer"])  # no FLA on a CPU
    gpu = report.frame(as_gpu(report.combine("test-gpu", write=False)))
    assert "samu toy pipeline median" in set(report.floor_multiples(gpu, registry)["series"])
    assert "samu toy median" in set(report.floor_multiples(gpu)["series"])  # no label: its name


def test_the_committed_results_hold_the_default_gpu_shapes_as_combined():
    """data/results/nvidia-h200.json is what its per-shape files combine to, and they hold
    `make reproduce`'s default GPU shapes, no other."""
    from samu.experiment import pipeline
    from samu.shapes import Shape
    committed = schema.read_valid_json(paths.results_file(report.COMMITTED_SLUG))
    combined = report.combine(report.COMMITTED_SLUG, write=False)
    assert committed["rows"] == combined["rows"]
    assert committed["shape_environments"] == combined["shape_environments"]
    assert sorted(committed["shape_environments"]) == sorted(
        Shape.parse(key).key for key in pipeline.GPU_SHAPES)


def test_the_committed_rows_keep_their_headline_speedup():
    """The report's headline speedup_vs_peer is each committed row's first peer's speedup."""
    raw = {(tuple(r["shape"].values()), r["architecture"]):
           r.get("peers", {}).get(schema.SINGLE_PEER, {}).get("speedup", math.nan)
           for p in sorted(paths.results_dir(report.COMMITTED_SLUG).glob("*.json"))
           for r in schema.read_valid_json(p)["rows"]}
    df = report.frame(report.combine(report.COMMITTED_SLUG, write=False))
    got = {(tuple(s), m): v for s, m, v in zip(df["shape_tuple"], df["mixer"],
                                               df["speedup_vs_peer"])}
    assert got.keys() == raw.keys() and sum(math.isfinite(v) for v in got.values()) == 14
    for key, value in raw.items():
        assert got[key] == pytest.approx(value, nan_ok=True), key
    assert report.peer_names(df)[0] == schema.SINGLE_PEER

import pytest

from samu.experiment import protocol, schema


@pytest.mark.parametrize("shape, floor", [((4, 2048, 2048), 0.040), ((1, 8192, 2560), 0.050),
                                          ((1, 32768, 1024), 0.080), ((1, 32768, 2048), 0.159)])
def test_floor_matches_spec(shape, floor):
    assert protocol.floor_ms(shape, protocol.COPY_BANDWIDTH["nvidia-h200"]) == pytest.approx(
        floor, abs=6e-4)


@pytest.mark.parametrize("shape_index", [0, 1])
def test_protocol_rows_on_cpu(shape_index):
    chosen = {"rglru": "reference_chunked", "samu": "reference_chunked"}
    rows = protocol.time_shape((1, 8, 16), shape_index, chosen, "cpu")
    protocol.add_floor_figures(rows, 4.22e12)
    schema.validate(protocol.result_document(rows))
    by = {r["architecture"]: r for r in rows}
    for r in range(2):
        rglru_first = (r + shape_index) % 2 == 0
        assert by["rglru"]["rounds"][r]["order_index"] == (0 if rglru_first else 1)
        assert by["samu"]["rounds"][r]["order_index"] == (1 if rglru_first else 0)
    assert by["samu"]["controller"] == "fp32_fused_coords" and by["rglru"]["controller"] is None
    assert by["samu"]["parameters"] == 3 * 16 + 4
    assert by["samu"]["speedup_vs_rglru"] == pytest.approx(
        by["rglru"]["forward_backward"]["median_ms"] / by["samu"]["forward_backward"]["median_ms"])
    fb = by["samu"]["forward_backward"]
    assert fb["samples_ms"] == by["samu"]["rounds"][0]["forward_backward_ms"] + \
        by["samu"]["rounds"][1]["forward_backward_ms"]
    assert fb["minimum_ms"] <= fb["median_ms"] <= fb["maximum_ms"]


def test_summarize():
    s = protocol.summarize([1.0, 2.0, 3.0, 4.0])
    assert s["median_ms"] == 2.5 and s["mean_ms"] == 2.5
    assert s["std_ms"] == pytest.approx(1.118, abs=1e-3)


def test_git_commit_override_wins(monkeypatch):
    """A copied tree can carry a stale .git (the H200's copy did): SAMU_GIT_COMMIT is believed
    first; without it the commit comes from git."""
    monkeypatch.setenv("SAMU_GIT_COMMIT", "0123abc")
    assert protocol.environment()["git_commit"] == "0123abc"
    monkeypatch.delenv("SAMU_GIT_COMMIT")
    commit = protocol.environment()["git_commit"]
    assert commit is None or len(commit) == 40

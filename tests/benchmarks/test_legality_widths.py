"""benchmarks/legality_widths.py at tiny sizes under Triton's interpreter: a row per backend,
width, head count that divides the width and state case, and a failing status when a bound is
broken."""
import pytest

from samu import backends
from samu.experiment import benchmark_rows


def _rows(rows_folder):
    """The rows the run appended, under its device's folder (cpu here, the GPU's on one)."""
    files = list(rows_folder.parent.glob("*/legality_widths.jsonl"))
    assert len(files) == 1, files
    return benchmark_rows.read_rows(files[0])


def test_every_width_and_dividing_head_count_is_checked(load_benchmark, rows_folder, capsys):
    bench = load_benchmark("legality_widths")
    assert bench.main(["--widths=32,40", "--heads=2,10", "--batch=1", "--length=24",
                       "--backends=singlepass"]) == 0
    printed = capsys.readouterr().out
    rows = _rows(rows_folder)
    names = {m: backends.matching(m, ["singlepass"]) for m in backends.REGISTRY}
    # RG-LRU: width 32 at 2 heads, width 40 at 2 and 10; SAMU once a width; each plain and
    # stateful
    want = 2 * (3 * len(names["rglru"]) + 2 * len(names["samu"]))
    assert len(rows) == want and all(r["values"]["legal"] for r in rows)
    heads = {(r["shape"]["width"], r["configuration"]["num_heads"])
             for r in rows if r["mixer"] == "rglru"}
    assert heads == {(32, 2), (40, 2), (40, 10)}
    stateful = [r for r in rows if r["configuration"]["stateful"]]
    assert stateful and all(r["shape"]["batch"] == 1 for r in stateful)
    assert all(0 < r["values"]["worst_error_share"] <= 1 for r in rows)
    assert "state+packed+resets: legal" in printed and "ILLEGAL" not in printed


def test_a_broken_bound_fails_the_run(load_benchmark, rows_folder, capsys, monkeypatch):
    bench = load_benchmark("legality_widths")
    monkeypatch.setattr(bench.legality, "ERROR_FACTOR", 0.0)
    monkeypatch.setattr(bench.legality, "ERROR_SLACK", 0.0)
    assert bench.main(["samu", "--widths=32", "--batch=1", "--length=16",
                       "--backends=singlepass"]) == 1
    printed = capsys.readouterr().out
    assert "ILLEGAL (y:" in printed and "illegal: samu fused_singlepass" in printed
    rows = _rows(rows_folder)
    assert rows and not any(r["values"]["legal"] for r in rows)


def test_an_unknown_mixer_is_refused(load_benchmark, capsys):
    bench = load_benchmark("legality_widths")
    with pytest.raises(SystemExit):
        bench.main(["mamba"])
    assert "unknown mixers ['mamba']" in capsys.readouterr().err


def test_a_mixer_given_twice_is_checked_once(load_benchmark, rows_folder):
    bench = load_benchmark("legality_widths")
    assert bench.main(["samu", "samu", "--widths=32", "--batch=1", "--length=16",
                       "--backends=fused_singlepass_chunk16"]) == 0
    rows = _rows(rows_folder)
    assert [(r["mixer"], r["configuration"]["stateful"]) for r in rows] == \
        [("samu", False), ("samu", True)]


def test_head_counts_follow_the_mixers_spec_not_its_name(load_benchmark):
    import dataclasses

    from samu import mixers
    bench = load_benchmark("legality_widths")
    headed = dataclasses.replace(mixers.get("samu"), name="headed", has_heads=True,
                                 kernel_families=())
    with backends.registered_mixer(headed):
        assert bench.head_counts("headed", 40, [2, 10, 16]) == [2, 10]
    assert bench.head_counts("rglru", 40, [2, 10, 16]) == [2, 10]
    assert bench.head_counts("samu", 40, [2, 10, 16]) == [None]


@pytest.mark.parametrize("argv, words", [
    (["rglru", "--heads=0", "--widths=16"], "--heads: must be at least 1, got 0"),
    (["samu", "--widths=16,0"], "--widths: must be at least 1, got 0"),
    (["samu", "--widths=16,x"], "--widths: 'x' is not an integer"),
    (["samu", "--length=-4"], "--length: must be at least 1, got -4"),
    (["samu", "--batch=0"], "--batch: must be at least 1, got 0"),
    (["samu", "--batch=1", "--length=4"],
     "--batch 1 x --length 4 is under 8 tokens: the stateful check packs four sequences"),
    (["--backends=gemm", "--widths=16", "--batch=1", "--length=8"],
     "no backend of ['samu'] matches --backends gemm"),
    (["samu", "--backends=singlepass,singelpass", "--widths=16", "--batch=1", "--length=8"],
     "--backends: ['singelpass'] match no backend of ['samu']")])
def test_a_bad_option_is_refused_before_any_row_is_written(load_benchmark, rows_folder, capsys,
                                                          argv, words):
    bench = load_benchmark("legality_widths")
    with pytest.raises(SystemExit) as stop:
        bench.main(argv)
    assert stop.value.code == 2 and words in capsys.readouterr().err
    assert not rows_folder.parent.exists()

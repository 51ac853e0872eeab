"""benchmarks/sweep_backends.py: the backends it times are the ones named, each mixer once, and
a bad name, count, head count or shape is refused before anything is timed or written."""
import pytest

from samu import paths
from samu.experiment import benchmark_rows, sweep

TIMED = "fused_controller_hierarchical_chunk16"


def test_the_named_backend_alone_is_timed_once_for_a_mixer_given_twice(load_benchmark,
                                                                       rows_folder):
    bench = load_benchmark("sweep_backends")
    assert bench.main(["1x8x16", "--name", "one", "--mixers", "samu", "samu", "--samples", "1",
                       "--backends", TIMED]) == 0
    rows = benchmark_rows.read_rows(rows_folder / "sweep_backends.jsonl")
    assert [(r["mixer"], r["configuration"]["backend"]) for r in rows] == [("samu", TIMED)]
    assert (paths.DATA / "sweeps" / "cpu_one.json").exists()


@pytest.mark.parametrize("argv, words", [
    (["--mixers", "samu", "--backends", "fused_contoller_typo"],
     "unknown backends ['fused_contoller_typo'] for ['samu']; available: samu: "
     + ", ".join(sweep.triton_backends("samu"))),
    (["--backends", TIMED], f"--backends {TIMED} names no backend of rglru"),
    (["--mixers", "mamba"], "unknown mixer 'mamba'"),
    (["--samples", "0"], "--samples: must be at least 1, got 0"),
    (["--samples", "-3"], "--samples: must be at least 1, got -3"),
    (["--heads", "0"], "--heads: must be at least 1, got 0"),
    (["--mixers", "rglru", "--heads", "3"],
     "--heads 3 does not divide the width of 1x8x16 (rglru split the width into 3 blocks)")])
def test_a_bad_option_is_refused_before_anything_is_written(load_benchmark, rows_folder, capsys,
                                                           argv, words):
    bench = load_benchmark("sweep_backends")
    with pytest.raises(SystemExit) as stop:
        bench.main(["1x8x16", "--name", "refused", *argv])
    assert stop.value.code == 2 and words in capsys.readouterr().err
    assert not paths.DATA.exists()


def test_heads_that_do_not_divide_the_width_pass_for_a_mixer_without_heads(load_benchmark,
                                                                          monkeypatch):
    bench = load_benchmark("sweep_backends")

    def reached(program):
        raise SystemExit("reached the device")
    monkeypatch.setattr(bench.benchmark_cli, "kernel_device", reached)
    with pytest.raises(SystemExit, match="reached the device"):
        bench.main(["1x8x16", "--name", "passed", "--mixers", "samu", "--heads", "3"])


def test_no_shape_at_all_is_refused(load_benchmark, rows_folder, capsys):
    bench = load_benchmark("sweep_backends")
    with pytest.raises(SystemExit) as stop:
        bench.main([" ", "--name", "refused"])
    assert stop.value.code == 2 and "no shape in [' ']" in capsys.readouterr().err
    assert not paths.DATA.exists()

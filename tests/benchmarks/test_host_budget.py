"""benchmarks/host_budget.py's choice of backends (its timings need a GPU): 'auto' and the
Triton backends named by words, and a clear refusal of words no backend of a mixer holds."""
import pytest

from samu import backends


def test_auto_and_words_pick_the_backends_timed(load_benchmark):
    bench = load_benchmark("host_budget")
    for mixer in bench.KERNEL_MIXERS:
        single_pass = backends.matching(mixer, ["singlepass"])
        assert single_pass  # every kernel mixer has a single-pass backend
        assert bench.backends_asked(mixer, ["auto"]) == ["auto"]
        assert bench.backends_asked(mixer, ["auto", "singlepass"]) == ["auto"] + single_pass
        assert bench.backends_asked(mixer, ["singlepass"]) == single_pass
        assert bench.backends_asked(mixer, ["no-such-word"]) == []


def test_words_no_backend_holds_are_refused_before_anything_runs(load_benchmark, capsys):
    bench = load_benchmark("host_budget")
    with pytest.raises(SystemExit) as stop:
        bench.main(["--mixer", "samu", "--backends=no-such-word"])
    assert stop.value.code == 2
    assert "no backend of ['samu'] matches ['no-such-word']" in capsys.readouterr().err


def test_without_cuda_it_says_so_after_its_arguments_are_read(load_benchmark, monkeypatch,
                                                              capsys):
    import torch
    bench = load_benchmark("host_budget")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="host_budget.py times a GPU machine's host: it needs "
                                         "CUDA"):
        bench.main(["--backends=auto,singlepass"])
    with pytest.raises(SystemExit) as stop:  # --help needs no GPU, and shows the whole text
        bench.main(["--help"])
    assert stop.value.code == 0
    assert "interleaved  rounds of the Linear" in capsys.readouterr().out

"""benchmarks/compare_configs.py's variants: each --set is one field of the backend's frozen
configuration (or several, separated by ";"), read as a Python expression over the mixer's
Launch, CarryPlan and Lookback."""
import pytest

from samu.ops.common.single_pass import Lookback
from samu.ops.samu.chunk import Launch


def test_each_set_is_a_field_and_its_value(load_benchmark):
    bench = load_benchmark("compare_configs")
    got = bench.variants("samu", ["lookback=Lookback(window=32)", "backward=Launch(4, 1, 168)"])
    assert got == [("lookback=Lookback(window=32)", {"lookback": Lookback(window=32)}),
                   ("backward=Launch(4, 1, 168)", {"backward": Launch(4, 1, 168)})]


def test_one_set_may_change_several_fields(load_benchmark):
    bench = load_benchmark("compare_configs")
    text = "chunk=8; lookback=Lookback(window=4)"
    assert bench.variants("samu", [text]) == [(text, {"chunk": 8,
                                                      "lookback": Lookback(window=4)})]
    with pytest.raises(SystemExit, match="chunk given twice"):
        bench.variants("samu", ["chunk=8; chunk=16"])


def test_help_is_printed_on_any_machine(load_benchmark, capsys):
    bench = load_benchmark("compare_configs")
    assert bench.main(["--help"]) == 0
    assert "Each --set is one variant" in capsys.readouterr().out


def test_each_mixer_takes_the_launch_of_its_registered_configurations():
    """A variant's Launch is the mixer's own, read from its registered configurations (the
    two mixers' Launch classes differ: SAMU's tiles are channels, RG-LRU's a head's run)."""
    import dataclasses

    from samu import backends
    from samu.experiment.benchmark_cli import config_variants, launch_type
    for mixer in backends.REGISTRY:
        launch = launch_type(mixer)
        assert any(isinstance(getattr(b.config, f.name), launch)
                   for b in backends.REGISTRY[mixer].values() if b.config is not None
                   for f in dataclasses.fields(b.config))
        (_, change), = config_variants(mixer, ["forward=Launch(2, 1)"])
        assert type(change["forward"]) is launch
    assert launch_type("samu") is not launch_type("rglru")


@pytest.mark.parametrize("text, message", [
    ("lookback", "is not FIELD=VALUE"),
    ("backward=Launch(3, 1)", "is not a value here .*warps"),
    ("forward=Lanch(2, 1)", "is not a value here .*NameError"),
])
def test_a_bad_set_is_refused_by_name(text, message):
    from samu.experiment.benchmark_cli import config_variants
    with pytest.raises(SystemExit, match=message):
        config_variants("samu", [text])

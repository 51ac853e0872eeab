"""benchmarks/count_single_pass.py compiles for the H200 (not under Triton's interpreter, which
runs these tests): what is tested here is how it asks a family for its launches."""
import dataclasses
from types import SimpleNamespace

from samu import backends, mixers


def test_a_mixer_with_heads_passes_them_to_its_launch_plan(load_benchmark):
    bench = load_benchmark("count_single_pass")
    family = SimpleNamespace(launch_plan=lambda *args: args)
    headed = dataclasses.replace(mixers.get("samu"), name="headed", has_heads=True,
                                 kernel_families=())
    with backends.registered_mixer(headed):
        assert bench.launch_plan("headed", family, "config", 32, 4) == ("config", 32, 4)
    assert bench.launch_plan("rglru", family, "config", 32, 4) == ("config", 32, 4)
    assert bench.launch_plan("samu", family, "config", 32, 4) == ("config", 32)

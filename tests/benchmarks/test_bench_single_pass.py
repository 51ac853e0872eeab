"""benchmarks/bench_single_pass.py at tiny sizes, on the GPU or under Triton's interpreter: its
bytes counted from the code bound by the tensors each kernel takes, its rows, and its refusals of
bad words."""
import pytest
import torch

from samu import backends
from samu.experiment import benchmark_rows, protocol

SHAPE = (2, 64, 32)
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("mixer,name", [(m, n) for m in backends.REGISTRY
                                        for n in backends.matching(m, ["singlepass"])])
def test_counted_bytes_lie_between_the_big_tensors_and_every_tensor_read_and_written(
        load_benchmark, mixer, name):
    # Each tensor of B*L*D elements or more that a kernel takes is moved at least once; no byte
    # is moved more than twice (read, then written over).
    bench = load_benchmark("bench_single_pass")
    config, x, by_role = bench.launches_by_role(mixer, name, SHAPE, DEVICE)
    counted = bench.counted_bytes(mixer, config.chunk, SHAPE, element=x.element_size())
    elements = SHAPE[0] * SHAPE[1] * SHAPE[2]
    for role, launches in by_role.items():
        assert launches, role
        taken = {a.data_ptr(): a for _, _, args, _ in launches for a in args
                 if isinstance(a, torch.Tensor)}
        every = sum(t.nbytes for t in taken.values())
        big = sum(t.nbytes for t in taken.values() if t.numel() >= elements)
        assert big <= counted[role] <= 2 * every, (role, big, counted[role], every)


def test_a_run_writes_each_kernel_and_the_whole_beside_the_default(load_benchmark, rows_folder,
                                                                  capsys):
    bench = load_benchmark("bench_single_pass")
    assert bench.main(["samu", "1x32x32"]) == 0
    folder = rows_folder.parent / protocol.device_slug(DEVICE)
    rows = benchmark_rows.read_rows(folder / "bench_single_pass.jsonl")
    names = backends.matching("samu", ["singlepass"])
    wholes = [r for r in rows if "kernel" not in r["configuration"]]
    assert sorted(r["configuration"]["backend"] for r in wholes) == sorted(
        names + [backends.DEFAULTS["samu"]])
    kernels = [r for r in rows if "kernel" in r["configuration"]]
    assert sorted(r["configuration"]["kernel"] for r in kernels) == sorted(
        ["forward", "backward", "sum_partials"] * len(names))
    timed = DEVICE.type == "cuda"
    assert all(r["values"]["counted_bytes"] > 0
               and (r["values"]["gpu_time_ms"] is not None) == timed for r in kernels)
    assert all(r["shape"] == {"batch": 1, "length": 32, "width": 32} for r in rows)
    assert ("not timed (no GPU)" in capsys.readouterr().out) != timed


@pytest.mark.parametrize("argv,said", [
    (["mamba"], "'mamba' is neither a mixer"),
    (["samu", "1x0x32"], "'1x0x32' is neither a mixer"),
])
def test_an_unknown_word_is_refused(load_benchmark, capsys, argv, said):
    bench = load_benchmark("bench_single_pass")
    with pytest.raises(SystemExit):
        bench.main(argv)
    assert said in capsys.readouterr().err


def test_backend_words_matching_nothing_are_refused(load_benchmark):
    bench = load_benchmark("bench_single_pass")
    with pytest.raises(SystemExit, match="no samu single-pass backend matches"):
        bench.main(["samu", "1x32x32", "--backends=chunk64"])


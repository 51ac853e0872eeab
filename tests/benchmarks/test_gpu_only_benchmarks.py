"""The benchmarks that only time or profile a GPU: each loads without running, answers --help,
refuses a bad shape or mixer by name, and off a GPU says it needs CUDA before touching one; those
that run the kernels anywhere refuse a CPU without Triton's interpreter."""
import pytest
import torch

from samu import paths

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _calling(function):
    return sorted(p.stem for p in (paths.REPO_ROOT / "benchmarks").glob("*.py")
                  if f"benchmark_cli.{function}(" in p.read_text())


GPU_ONLY = _calling("require_cuda")
KERNELS_ANYWHERE = _calling("kernel_device")
# The least each takes to reach its device check.
KERNEL_ARGV = {"legality_widths": ["samu", "--widths=32"], "bench_single_pass": ["samu"],
               "sweep_backends": ["1x16x32", "--name", "refused"],
               "rglru_workspace": ["1x16x32"]}


def test_the_gpu_only_benchmarks_are_found():
    assert {"host_overhead", "host_timeline", "profile_kernels", "sweep_launches",
            "bench_carry"} <= set(GPU_ONLY)


@pytest.mark.parametrize("name", GPU_ONLY)
def test_help_prints_the_usage(load_benchmark, capsys, name):
    bench = load_benchmark(name)
    try:
        code = bench.main(["--help"])
    except SystemExit as stop:
        code = stop.code
    assert code in (0, None)
    assert f"{name}.py" in capsys.readouterr().out


@pytest.mark.parametrize("name", GPU_ONLY)
def test_off_a_gpu_it_says_it_needs_cuda(load_benchmark, monkeypatch, name):
    bench = load_benchmark(name)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    argv = {"compare_configs": ["samu", "1x64x64"], "host_budget": []}.get(name, ["1x64x64"])
    with pytest.raises(SystemExit, match=f"{name}.py .*: it needs CUDA"):
        bench.main(argv)


@pytest.mark.parametrize("name", ["host_overhead", "host_timeline", "profile_kernels",
                                  "sweep_launches", "bench_carry"])
def test_a_bad_shape_is_refused_by_name(load_benchmark, capsys, name):
    bench = load_benchmark(name)
    with pytest.raises(SystemExit) as stop:
        bench.main(["1x0x64"])
    assert stop.value.code == 2
    assert "bad shape '1x0x64'" in capsys.readouterr().err


@pytest.mark.parametrize("name,argv", [("host_timeline", ["--mixer", "mamba"]),
                                       ("profile_kernels", ["--mixers", "samu", "mamba"]),
                                       ("host_overhead", ["--mixers", "mamba"])])
def test_an_unknown_mixer_is_refused_by_name(load_benchmark, capsys, name, argv):
    bench = load_benchmark(name)
    with pytest.raises(SystemExit) as stop:
        bench.main(argv)
    assert stop.value.code == 2
    assert "unknown mixer 'mamba'" in capsys.readouterr().err


def test_every_kernel_benchmark_has_its_arguments_here():
    assert set(KERNELS_ANYWHERE) == set(KERNEL_ARGV)


@pytest.mark.parametrize("name", KERNELS_ANYWHERE)
def test_a_cpu_without_the_interpreter_is_refused_before_any_kernel(load_benchmark, rows_folder,
                                                                    monkeypatch, name):
    bench = load_benchmark(name)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("samu.dispatch.interpreting", lambda: False)
    with pytest.raises(SystemExit, match=f"{name}.py: no GPU here.*set TRITON_INTERPRET=1"):
        bench.main(KERNEL_ARGV[name])
    assert not rows_folder.parent.exists() or not any(rows_folder.parent.rglob("*.jsonl"))


def test_host_overheads_output_kernel_launch_matches_the_kernels_signature(load_benchmark):
    # The launch it times is built by hand; it must run and write every y (on the GPU, or under
    # the interpreter).
    bench = load_benchmark("host_overhead")
    kernel, grid, args, chunk, meta, flags = bench.output_kernel_launch((1, 16, 32), DEVICE)
    kernel[grid](*args, T=chunk, **meta, **flags)
    assert bool(args[1].isfinite().all())

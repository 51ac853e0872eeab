"""The timing protocol of the published H800 result (SPEC section 5), the memory-bandwidth floor
(SPEC section 8), GPU time by CUDA-graph replay and host cost against torch.nn.Linear."""
from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from datetime import datetime, timezone

import torch

from ..shapes import Shape
from .. import backends, dispatch, mixers, paths
from ..modules import (MODULES, NUM_HEADS, build, dynamic_control_values_per_token,
                       parameter_count)
from . import peers as peers_
from . import schema

ROUNDS = schema.ROUNDS
SAMPLES = schema.SAMPLES_PER_ROUND
WARMUP = 3  # on a GPU; a CPU (interpreter) run compiles nothing and warms up once


def warmup_count(device) -> int:
    return WARMUP if torch.device(device).type == "cuda" else 1
FLOOR_BYTES_PER_ELEMENT = 10  # fwd reads x, writes y; bwd reads x, dy, writes dx: all BF16
FORWARD_FLOOR_BYTES_PER_ELEMENT = 4
COPY_BANDWIDTH = {"nvidia-h200": 4.22e12}  # measured read+write copy rate, bytes/s (SPEC 8)
PROTOCOL = {
    "scope": "complete mixer preparation, recurrence, input and parameter gradients",
    "dtype": "BF16 autocast and FP32 recurrent carry",
    "input_gradient": True,
    "order": "AB/BA counterbalanced",
    "compile_excluded": True,
    "baseline_policy": "strongest previously calibrated legal RG-LRU backend per shape",
    "samu_policy": "strongest previously calibrated legal SAMU backend per shape",
    "resets": "independent sequences reset at first token; no internal packed reset",
}


def floor_ms(shape, bandwidth: float, bytes_per_element: int = FLOOR_BYTES_PER_ELEMENT) -> float:
    batch, length, width = shape
    return bytes_per_element * batch * length * width / bandwidth * 1e3


def memory_units(nbytes: int, shape) -> float:
    """Bytes in units of one BF16 tensor of the shape, B*L*D*2 (SPEC section 8)."""
    return nbytes / (2 * Shape.of(shape).elements)


def measure_copy_bandwidth(device, nbytes: int = 2**31, reps: int = 20) -> float:
    """Device-to-device copy rate, counting bytes read plus bytes written."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    samples = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop))
    return 2 * src.numel() * src.element_size() / (statistics.median(samples) * 1e-3)


def copy_bandwidth(device) -> float | None:
    """The copy rate the floor is measured against: the GPU's committed one (COPY_BANDWIDTH),
    else measured here; None on a CPU, which has no floor (SPEC section 8)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return COPY_BANDWIDTH.get(device_slug(device)) or measure_copy_bandwidth(device)


def _timer(device):
    """A (start, stop) pair returning milliseconds: CUDA events on the current stream, or the
    host clock on a CPU."""
    if device.type == "cuda":
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def begin():
            start.record()

        def end():
            stop.record()
            stop.synchronize()
            return start.elapsed_time(stop)
        return begin, end
    t0 = [0.0]

    def begin():
        t0[0] = time.perf_counter()

    def end():
        return (time.perf_counter() - t0[0]) * 1e3
    return begin, end


def _forward(module, x):
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        return module(x)


def _clear_grads(module, x):
    x.grad = None
    module.zero_grad(set_to_none=True)


def sample(module, x, dy, phase: str) -> float:
    begin, end = _timer(x.device)
    _clear_grads(module, x)
    if phase == "forward":
        begin()
        _forward(module, x)
        return end()
    if phase == "backward":
        y = _forward(module, x)
        if x.is_cuda:
            torch.cuda.synchronize()
        begin()
        y.backward(dy)
        return end()
    begin()
    _forward(module, x).backward(dy)
    return end()


def captured(step):
    """A CUDA graph of step(), or None where step cannot be captured.  A capture that fails
    leaves the current device's default generator marked as capturing, and every random op
    after it raising ("Offset increment outside graph capture"): its state, cloned before the
    capture, is put back."""
    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    # A torch without graph-safe generator states (clone_state) has none to put back.
    saved = generator.clone_state() if hasattr(generator, "clone_state") else None
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            step()
    except Exception:
        if saved is not None:
            generator.graphsafe_set_state(saved)
        return None
    return graph


def graph_replay_time(step, device, replays: int = 20, reset=None) -> float | None:
    """GPU time of step() with no host in it: captured once in a CUDA graph after three warm-up
    calls (reset(), when given, runs before each and before the capture), replayed ``replays``
    times between CUDA events; the median of 3 such runs, per replay.  None where the call
    cannot be captured (the error is not a result)."""
    reset = reset or (lambda: None)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up off the default stream, as capture needs
        for _ in range(3):
            reset()
            step()
    torch.cuda.current_stream().wait_stream(stream)
    reset()
    graph = captured(step)
    if graph is None:
        return None
    runs = []
    for _ in range(3):
        begin, end = _timer(device)
        begin()
        for _ in range(replays):
            graph.replay()
        runs.append(end() / replays)
    del graph
    reset()
    torch.cuda.synchronize()
    return statistics.median(runs)


def graph_replay_ms(module, x, dy, replays: int = 20) -> float | None:
    """GPU time of one forward+backward (graph_replay_time); None on a CPU."""
    if not x.is_cuda:
        return None
    return graph_replay_time(lambda: _forward(module, x).backward(dy), x.device, replays,
                             reset=lambda: _clear_grads(module, x))


def kernel_times(step, repeats: int = 5) -> list[tuple[str, float, float]]:
    """(kernel name, GPU ms per call, launches per call) of step() on a GPU, by torch.profiler
    over ``repeats`` calls (after the caller's warm-up), the longest first."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            step()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / repeats / 1e3, e.count / repeats)
            for e in prof.key_averages() if e.device_time_total > 0]
    return sorted(rows, key=lambda row: -row[1])


HOST_SHAPE_LENGTH = 128  # (1, 128, D): the GPU work is negligible, the host sets the time


def host_cost_us(module, width: int, device, reps: int = 50) -> dict | None:
    """Host cost of a synchronised forward+backward at (1, 128, D), beside torch.nn.Linear(D, D)
    under BF16 autocast measured the same way in the same process: this host is slow and noisy,
    so the ratio is the figure (docs/SPEC.md section 8).  None on a CPU, where the interpreter,
    not the host, sets the time."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    x = torch.randn(1, HOST_SHAPE_LENGTH, width, device=device, dtype=torch.bfloat16,
                    requires_grad=True)
    dy = torch.randn_like(x)
    linear = torch.nn.Linear(width, width).to(device)

    def wall_us(m):
        times = []
        for i in range(reps + 5):
            _clear_grads(m, x)
            t0 = time.perf_counter()
            _forward(m, x).backward(dy)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i >= 5:
                times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)
    mixer_us, linear_us = wall_us(module), wall_us(linear)
    return {"shape": {"batch": 1, "length": HOST_SHAPE_LENGTH, "width": width},
            "mixer_us": mixer_us, "linear_us": linear_us, "ratio_to_linear": mixer_us / linear_us}


def build_module(mixer: str, width: int, backend: str, device, seed: int = 0):
    module = MODULES[mixer](width, backend=backend)
    module.reset_parameters(generator=torch.Generator().manual_seed(seed))
    return module.to(device)


def module_with(mixer: str, backend: str, x, params: dict):
    """A module of one backend holding the given parameters (at their head count), and a fresh
    leaf copy of x."""
    spec = mixers.get(mixer)
    heads = spec.heads_of(params) if spec.has_heads else NUM_HEADS
    module = build(mixer, x.shape[-1], heads, backend=backend).to(x.device)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(params[name])
    return module, x.detach().clone().requires_grad_()


def warm_samples(module, x, dy, reps: int) -> list:
    """forward+backward samples of a module after its warm-up."""
    for _ in range(warmup_count(x.device)):
        sample(module, x, dy, "forward_backward")
    return [sample(module, x, dy, "forward_backward") for _ in range(reps)]


def time_forward_backward(mixer: str, backend: str, x, params: dict, dy, reps: int) -> list:
    """forward+backward samples of one backend on given inputs (for calibration)."""
    module, xg = module_with(mixer, backend, x, params)
    return warm_samples(module, xg, dy, reps)


def summarize(samples: list) -> dict:
    return {
        "samples_ms": samples,
        "median_ms": statistics.median(samples),
        "mean_ms": statistics.fmean(samples),
        "std_ms": statistics.pstdev(samples),
        "minimum_ms": min(samples),
        "maximum_ms": max(samples),
    }


def measure_memory(module, x, dy) -> dict:
    """Six memory figures around one forward_backward (zeros on a CPU, which has no counters)."""
    keys = ("peak_allocated_delta_bytes", "peak_reserved_delta_bytes", "peak_allocated_bytes",
            "peak_reserved_bytes", "baseline_allocated_bytes", "baseline_reserved_bytes")
    if not x.is_cuda:
        sample(module, x, dy, "forward_backward")
        return dict.fromkeys(keys, 0)
    _clear_grads(module, x)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base_alloc, base_res = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    _forward(module, x).backward(dy)
    torch.cuda.synchronize()
    peak_alloc, peak_res = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    return dict(zip(keys, (peak_alloc - base_alloc, peak_res - base_res, peak_alloc, peak_res,
                           base_alloc, base_res)))


def peak_allocated_delta(module, x, dy) -> int | None:
    """measure_memory's peak above the baseline, in bytes; None on a CPU (no counters)."""
    return measure_memory(module, x, dy)["peak_allocated_delta_bytes"] if x.is_cuda else None


def phase_stats(rounds_: list[dict]) -> dict:
    """Each phase's summary over the samples of every round."""
    return {phase: summarize([s for rd in rounds_ for s in rd[f"{phase}_ms"]])
            for phase in ("forward", "backward", "forward_backward")}


def time_shape(shape, shape_index: int, chosen: dict, device, seed: int = 0, rounds=ROUNDS,
               samples=SAMPLES, progress=None, peers=peers_.PEERS) -> list[dict]:
    """The mixers of ``chosen`` ({mixer: backend}, in the registry's order) at one shape,
    counterbalanced: round r starts at mixer (r + shape_index) mod their count and goes round
    (for two mixers, AB/BA: the registry's first when r + shape_index is even), each mixer followed
    by every peer of ``peers`` (a registry of peers_.PeerSpec) that serves it and can run here.
    Returns one result row per mixer."""
    device = torch.device(device)
    batch, length, width = shape
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, width, generator=gen).to(device, torch.bfloat16)
    x.requires_grad_()
    dy = torch.randn(batch, length, width, generator=gen).to(device, torch.bfloat16)
    names = [m for m in mixers.names() if m in chosen]
    modules = {m: build_module(m, width, chosen[m], device, seed) for m in names}
    # The public pipelines on the same parameters, timed right after their mixer in every round.
    peer_of = {m: peers_.peers_of(mod, peers) for m, mod in modules.items()}
    per_round = {m: [] for m in modules}
    peer_rounds = {m: {name: [] for name in peer_of[m]} for m in modules}

    def run_phases(module, label):
        for _ in range(warmup_count(device)):
            sample(module, x, dy, "forward_backward")
        phases = {}
        for phase in ("forward", "backward", "forward_backward"):
            phases[f"{phase}_ms"] = [sample(module, x, dy, phase) for _ in range(samples)]
            if progress:
                progress(f"round {r} {label} {phase}")
        return phases

    for r in range(rounds):
        first = (r + shape_index) % len(names)
        order = names[first:] + names[:first]
        for position, mixer in enumerate(order):
            per_round[mixer].append({"round": r, "order_index": position,
                                     **run_phases(modules[mixer], mixer)})
            for name, (_, peer) in peer_of[mixer].items():
                peer_rounds[mixer][name].append({"round": r, "order_index": position,
                                                 **run_phases(peer, f"{mixer} {name}")})
    rows = []
    for mixer, module in modules.items():
        rounds_ = per_round[mixer]
        row = {
            "shape": {"batch": batch, "length": length, "width": width},
            "architecture": mixer,
            "backend": module.last_backend,
            "controller": mixers.get(mixer).controller,
            "device": str(device),  # what labels the result: its GPU, floor and memory
        }
        row.update(phase_stats(rounds_))
        row["rounds"] = rounds_
        row.update(measure_memory(module, x, dy))
        n_params = parameter_count(mixer, width)
        row["parameters"] = n_params
        row["parameter_bytes"] = 4 * n_params
        row["dynamic_control_values_per_token"] = (
            dynamic_control_values_per_token(mixer, width))
        row["materialized_state_sized_transition"] = (
            backends.REGISTRY[mixer][module.last_backend].materialized_state_sized_transition)
        row["gpu_time_ms"] = graph_replay_ms(module, x, dy)
        row["host"] = host_cost_us(module, width, device)
        row["peers"] = {}
        for name, (spec, peer) in peer_of[mixer].items():
            entry = {"pipeline": peer.last_backend, "fla_core": peers_.fla_version(),
                     "materialized_state_sized_transition":
                         spec.materialized_state_sized_transition,
                     **phase_stats(peer_rounds[mixer][name]),
                     "rounds": peer_rounds[mixer][name],
                     "gpu_time_ms": graph_replay_ms(peer, x, dy),
                     "host": host_cost_us(peer, width, device)}
            entry["speedup"] = (entry["forward_backward"]["median_ms"]
                                / row["forward_backward"]["median_ms"])
            row["peers"][name] = entry
        rows.append(row)
    return rows


def add_floor_figures(rows: list[dict], bandwidth: float) -> None:
    """Floor, fraction of it reached, achieved bandwidth, and each mixer's speedup over its
    spec's baseline (samu.mixers; SAMU's over RG-LRU) as speedup_vs_<baseline>, as extra keys."""
    fb = {}
    for row in rows:
        s = row["shape"]
        shape = (s["batch"], s["length"], s["width"])
        floor = floor_ms(shape, bandwidth)
        median = row["forward_backward"]["median_ms"]
        row["floor_ms"] = floor
        row["floor_fraction"] = floor / median
        row["times_floor"] = median / floor
        row["forward_floor_ms"] = floor_ms(shape, bandwidth, FORWARD_FLOOR_BYTES_PER_ELEMENT)
        row["achieved_bandwidth_bytes_per_s"] = (
            FLOOR_BYTES_PER_ELEMENT * shape[0] * shape[1] * shape[2] / (median * 1e-3))
        row["copy_bandwidth_bytes_per_s"] = bandwidth
        if row.get("gpu_time_ms"):
            row["gpu_time_times_floor"] = row["gpu_time_ms"] / floor
        fb[(shape, row["architecture"])] = row["forward_backward"]
    baselines = mixers.baselines()
    for row in rows:
        s = row["shape"]
        shape = (s["batch"], s["length"], s["width"])
        baseline = baselines.get(row["architecture"])
        base = fb.get((shape, baseline))
        if base:
            row[f"speedup_vs_{baseline}"] = (base["median_ms"]
                                             / row["forward_backward"]["median_ms"])


def _git_commit() -> str | None:
    """SAMU_GIT_COMMIT when set (a copied tree can carry a stale .git), else git's HEAD."""
    if os.environ.get("SAMU_GIT_COMMIT"):
        return os.environ["SAMU_GIT_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=paths.REPO_ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def default_device() -> torch.device:
    """The device a run times when none is named: CUDA when this machine has it, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def device_slug(device) -> str:
    """The slug that names the results of a device: its GPU's (dispatch.gpu_slug of its name),
    "cpu" for the CPU."""
    device = torch.device(device)
    return dispatch.gpu_slug(torch.cuda.get_device_name(device)) if device.type == "cuda" else "cpu"


def environment(device=None) -> dict:
    """The published file's three keys plus what a reader needs to reproduce the numbers.  The
    gpu (and the driver) are those of ``device``, the device that was timed (default:
    default_device()): a CPU run on a machine that has a GPU is labelled "cpu", not that GPU."""
    import triton
    device = torch.device(device) if device is not None else default_device()
    cuda = device.type == "cuda"
    env = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(device) if cuda else "cpu",
        "device": str(device),
        "triton": triton.__version__,
        "python": platform.python_version(),
        "driver": None,
        "git_commit": _git_commit(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0") == "1",
    }
    if cuda:
        try:
            env["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, check=True).stdout.strip().splitlines()[0]
        except (OSError, subprocess.CalledProcessError, IndexError):
            pass
    return env


def timed_device(rows: list[dict]):
    """The device that rows were timed on (time_shape records it in each row); None for rows
    that do not name one."""
    devices = {row["device"] for row in rows if row.get("device")}
    if len(devices) > 1:
        raise ValueError(f"rows timed on several devices: {sorted(devices)}")
    return devices.pop() if devices else None


def result_document(rows: list[dict]) -> dict:
    """The schema-valid document of one shape's rows, its environment that of the device the rows
    were timed on."""
    return {"schema_version": schema.SCHEMA_VERSION, "protocol": dict(PROTOCOL),
            "environment": environment(timed_device(rows)), "rows": rows}


def write_shape_result(slug: str, shape, rows: list[dict], calibration_doc: dict | None = None):
    """One schema-valid file per shape in data/results/<slug>/, with the legality errors that
    calibration recorded for each row's backend."""
    if calibration_doc:
        entry = calibration_doc["shapes"].get(Shape.of(shape).key, {})
        for row in rows:
            for b in entry.get(row["architecture"], {}).get("backends", []):
                if b["backend"] == row["backend"]:
                    row["legality_errors"] = b.get("errors")
                    row["eager_reference_errors"] = b.get("eager_errors")
    path = paths.results_dir(slug) / f"{Shape.of(shape).key}.json"
    return schema.write_json_atomic(path, result_document(rows))

"""Context parallelism (samu.distributed): each rank's share of a forward+backward, timed in turn
on one GPU, against one call at L / P and one at L; (--check) its legality against the float64
oracle; (--distributed) each rank's real call timed in its own process, on one GPU or several.

Timing runs in one process: rank r's share is its summary pass, the simulated all_gather (its
summary stacked with stand-ins of the other ranks', whose values do not change the work), its
slice from the composed entering state, the adjoint at its slice start, and its slice's backward
with the later ranks' cotangent: the code path of a real call (samu.distributed's phases) with
the collectives simulated.  Beside the medians, the GPU time of each by CUDA-graph replay;
--profile prints each kernel's GPU time in a rank's share.  Each is
timed with CUDA events (the host clock on a CPU), median of --repeats after a warm-up, and
written to data/context_parallel/<gpu-slug>.json with the environment; each (mixer, length,
ranks) is also a row of data/benchmarks/<gpu-slug>/bench_context_parallel.jsonl
(samu.experiment.benchmark_rows).

--check spawns P processes (gloo) on one GPU, each holding its slice, runs the context-parallel
call and its backward there, and checks y, the final states, dx, every parameter's gradient
(summed over the ranks) and d initial_state against the float64 oracle over the whole sequence
with SPEC section 4's rule (2 x the eager reference's error + 1e-3, all finite).  It exits 1 if
any output is not legal.  With --gpus N (N > 1), rank r runs on GPU r mod N and the ranks
talk over --dist-backend (NCCL by default there): the same code on several GPUs.

--distributed times the real call instead of the simulation: P processes (one per GPU with
--gpus, else all on one device), each running its rank's context-parallel forward+backward with
the real collectives, started together after a barrier; per rank the median of CUDA events (the
host clock on a CPU), one plain call at L / P on its device, and the all_gather of the forward's
summaries alone (2 x B x D FP32), whose share of the rank's time the JSON reports.  CUDA-graph
replay does not apply: the call's input agreement reads the gathered shapes on the host.
Written to data/context_parallel/<gpu-slug>_distributed.json.

    python benchmarks/bench_context_parallel.py                       # L = 2^17..2^20, D = 2048
    python benchmarks/bench_context_parallel.py --check               # legality, P = 2, 4, 8
    python benchmarks/bench_context_parallel.py --check --gpus 2 --ranks 2        # over NCCL
    python benchmarks/bench_context_parallel.py --distributed --gpus 2 --ranks 2  # timed
    python benchmarks/bench_context_parallel.py --device cpu --lengths 64 --ranks 2 --width 16
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch

def _mixers() -> list[str]:
    """The registry's mixers that context parallelism serves (each gives its log_decay)."""
    from samu.mixers import MIXERS
    return [name for name, spec in MIXERS.items() if spec.log_decay is not None]


def _backend_names(mixers: list[str]) -> list[str]:
    """'auto' and every registered backend of these mixers, each once."""
    from samu import backends
    return ["auto", *dict.fromkeys(n for m in mixers for n in backends.available(m))]


def _modules():
    from samu import paths
    from samu.experiment import protocol, schema
    return paths, protocol, schema


def make_inputs(mixer: str, length: int, width: int, device, dtype, seed: int = 0):
    from samu.modules import build
    gen = torch.Generator().manual_seed(seed)
    module = build(mixer, width)
    module.reset_parameters(generator=gen)
    params = [p.detach().to(device) for p in module._parameters_in_order()]
    x = torch.randn(1, length, width, generator=gen).to(device=device, dtype=dtype)
    dy = torch.randn(1, length, width, generator=gen).to(device=device, dtype=dtype)
    return x, params, dy


def timed(fn, device, repeats: int, warmup: int) -> float:
    """Median milliseconds of fn() over ``repeats`` after ``warmup`` calls."""
    _, protocol, _ = _modules()
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        begin, end = protocol._timer(device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        begin()
        fn()
        samples.append(end())
    return statistics.median(samples)


def one_call(mixer, x, params, dy, backend):
    """A plain forward+backward, as one GPU runs the mixer without context parallelism."""
    from samu.functional import FUNCTIONS
    xg = x.detach().requires_grad_()
    ps = [p.detach().requires_grad_() for p in params]

    def step():
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=x.is_cuda):
            y = FUNCTIONS[mixer](xg, *ps, backend=backend)
        torch.autograd.grad(y, [xg, *ps], dy)
    return step


def rank_share(mixer, layout, x, params, dy, backend, world: int):
    """Rank ``layout.rank``'s work in one forward+backward, the collectives simulated: the
    context-parallel call's own phases (samu.distributed), with a gather that stacks this
    rank's tensor among fixed stand-ins of the other ranks'."""
    from samu import distributed as cp
    rows, width = x.shape[0], x.shape[2]
    gen = torch.Generator().manual_seed(layout.rank)
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    others = {n: torch.rand(world, n, generator=gen, dtype=cdt).to(x.device)
              for n in (2 * rows * width, rows * width + 1)}
    for stand_in in others.values():
        stand_in[:, -1] = 0  # an adjoint packet's failure flag: none failed
    zero_states = torch.zeros(rows, width, dtype=cdt, device=x.device)

    def gather(tensor):
        stand_in = others[tensor.numel()].view(world, *tensor.shape)
        return torch.cat([stand_in[:layout.rank], tensor[None], stand_in[layout.rank + 1:]])

    def phases():
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=x.is_cuda):
            xg = x.detach().requires_grad_()
            ps = [p.detach().requires_grad_() for p in params]
            runner = cp.slice_runner(mixer, layout, xg, ps, backend)
            mine = cp.slice_summary(mixer, layout, xg, ps, backend, runner=runner)
            summaries = gather(mine)
            entering = cp.incoming_state(summaries, layout.rank) if layout.continued else None
            call = cp.SliceCall(mixer, backend, layout, gather, summaries[:, 0], runner, [])
            y, states = cp.run_with_carry(call, entering, xg, None, *ps)
        torch.autograd.grad([y, states], [xg, *ps], [dy, zero_states])
    return phases


def gpu_time(step, device) -> float | None:
    """GPU time of step() by CUDA-graph replay (protocol.graph_replay_time); None on a CPU or
    where the step cannot be captured."""
    if device.type != "cuda":
        return None
    _, protocol, _ = _modules()
    return protocol.graph_replay_time(step, device)


@contextlib.contextmanager
def launches_stubbed():
    """Every Triton launch replaced by nothing (launching.launch, which every kernel goes
    through): what is left of a call is samu's Python, autograd and the torch ops around the
    kernels, the host time that bounds the medians at small slices."""
    from samu.ops.common import launching
    real = launching.launch
    launching.launch = lambda *args, **meta: None
    try:
        yield
    finally:
        launching.launch = real


def host_us(step, device, repeats: int) -> float:
    """Median host wall time of step() with its launches stubbed, synchronised after each call
    (microseconds); the caller has run it with real launches first (compiled kernels)."""
    samples = []
    with launches_stubbed():
        step()
        for _ in range(repeats):
            t0 = time.perf_counter()
            step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def print_kernels(title: str, step) -> None:
    """Per-kernel GPU time of step() (--profile): where a rank's share goes."""
    _, protocol, _ = _modules()
    rows = protocol.kernel_times(step)
    print(f"  {title}: kernel sum {sum(r[1] for r in rows):.3f} ms")
    for key, ms, launches in rows[:16]:
        print(f"    {ms:8.4f} ms  x{launches:<5.1f} {key[:90]}")


def benchmark(args, device) -> dict:
    from samu import distributed as cp
    from samu.experiment import benchmark_rows
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = []
    table = benchmark_rows.BenchmarkRows("bench_context_parallel", device)
    for mixer in args.mixers:
        for length in args.lengths:
            x, params, dy = make_inputs(mixer, length, args.width, device, dtype)
            full_ms = timed(one_call(mixer, x, params, dy, args.backend), device,
                            args.repeats, args.warmup)
            for world in args.ranks:
                if length % world:
                    raise SystemExit(f"--lengths {length} does not split over {world} ranks")
                part = length // world
                plain = one_call(mixer, x[:, :part], params, dy[:, :part], args.backend)
                slice_ms = timed(plain, device, args.repeats, args.warmup)
                slice_gpu_ms = gpu_time(plain, device)
                slice_host = host_us(plain, device, args.repeats) if args.host else None
                rank_ms, rank_gpu_ms, rank_host = [], [], []
                for rank in range(world):
                    layout = cp.slice_layout(rank, (part,) * world)
                    lo = rank * part
                    share = rank_share(mixer, layout, x[:, lo:lo + part], params,
                                       dy[:, lo:lo + part], args.backend, world)
                    rank_ms.append(timed(share, device, args.repeats, args.warmup))
                    rank_gpu_ms.append(gpu_time(share, device))
                    if args.host:
                        rank_host.append(host_us(share, device, args.repeats))
                    if args.profile and rank in (0, 1, world - 1):
                        print_kernels(f"{mixer} L={length} P={world} rank {rank}", share)
                if args.profile:
                    print_kernels(f"{mixer} one call at L/P = {part}", plain)
                slowest = max(rank_ms)
                row = {"mixer": mixer, "length": length, "width": args.width, "ranks": world,
                       "backend": args.backend, "dtype": str(dtype).replace("torch.", ""),
                       "one_call_at_length_ms": full_ms, "one_call_at_slice_ms": slice_ms,
                       "rank_ms": rank_ms, "slowest_rank_ms": slowest,
                       "slowest_rank_over_slice_call": slowest / slice_ms,
                       "speedup_over_one_call": full_ms / slowest}
                if args.host:
                    row.update({"one_call_at_slice_host_us": slice_host,
                                "rank_host_us": rank_host,
                                "slowest_rank_host_over_slice_call_host":
                                    max(rank_host) / slice_host})
                if slice_gpu_ms is not None and None not in rank_gpu_ms:
                    row.update({"one_call_at_slice_gpu_ms": slice_gpu_ms,
                                "rank_gpu_ms": rank_gpu_ms,
                                "slowest_rank_gpu_ms": max(rank_gpu_ms),
                                "slowest_rank_over_slice_call_gpu":
                                    max(rank_gpu_ms) / slice_gpu_ms})
                rows.append(row)
                ratios = ("slowest_rank_over_slice_call", "speedup_over_one_call")
                values = {k: row[k] for k in ("one_call_at_length_ms", "one_call_at_slice_ms",
                                              "slowest_rank_ms", *ratios)}
                values.update({f"rank_{r}_ms": ms for r, ms in enumerate(rank_ms)})
                if args.host:
                    values.update({"one_call_at_slice_host_us": slice_host,
                                   "slowest_rank_host_us": max(rank_host),
                                   "slowest_rank_host_over_slice_call_host":
                                       row["slowest_rank_host_over_slice_call_host"]})
                    ratios += ("slowest_rank_host_over_slice_call_host",)
                if "rank_gpu_ms" in row:
                    values.update({k: row[k] for k in ("one_call_at_slice_gpu_ms",
                                                       "slowest_rank_gpu_ms",
                                                       "slowest_rank_over_slice_call_gpu")})
                    ratios += ("slowest_rank_over_slice_call_gpu",)
                config = benchmark_rows.configuration(mixer, args.backend, ranks=world,
                                                      dtype=row["dtype"])
                table.add(mixer, config, (1, length, args.width), values,
                          dict.fromkeys(ratios, "ratio"))
                print(f"{mixer} L={length} P={world}: one call {full_ms:.3f} ms, at L/P "
                      f"{slice_ms:.3f} ms, ranks {[round(t, 3) for t in rank_ms]} ms "
                      f"(slowest / L/P call {slowest / slice_ms:.2f}, one call / slowest "
                      f"{full_ms / slowest:.2f})", flush=True)
                if args.host:
                    print(f"    host time, launches stubbed: at L/P {slice_host:.0f} us, ranks "
                          f"{[round(t) for t in rank_host]} us (slowest / L/P call "
                          f"{row['slowest_rank_host_over_slice_call_host']:.2f})", flush=True)
                if device.type == "cuda" and "rank_gpu_ms" not in row:
                    print("    GPU time: not measured (a call or a rank's share could not be "
                          "captured in a CUDA graph)", flush=True)
                if "rank_gpu_ms" in row:
                    print(f"    GPU time (graph replay): at L/P {slice_gpu_ms:.3f} ms, ranks "
                          f"{[round(t, 3) for t in rank_gpu_ms]} ms (slowest / L/P call "
                          f"{row['slowest_rank_over_slice_call_gpu']:.2f})", flush=True)
            del x, dy
            if device.type == "cuda":
                torch.cuda.empty_cache()
    print(table.summary())
    return {"rows": rows}


# --- --check: P processes on one GPU over gloo -------------------------------------------------

def check_sequences(slices) -> list[int]:
    """Offsets with sequences across rank boundaries (the first crossed by one token), a
    one-token sequence, and, from three ranks on, a sequence that starts exactly at a rank's
    first token."""
    bounds = [sum(slices[:k]) for k in range(len(slices) + 1)]
    points = {0, bounds[-1], bounds[1] // 3, bounds[1] + 1, bounds[1] + 2}
    for k in range(2, len(slices), 2):
        points.update((bounds[k], bounds[k] + slices[k] // 2))
    return sorted(p for p in points if p <= bounds[-1])


def _join(rank: int, world: int, work_dir: str, gpus: int, dist_backend: str) -> torch.device:
    """This worker's process group and device: GPU rank mod gpus (0: the CPU).  The ranks meet
    through a file in the run's own folder, not a port that another group could take first."""
    device = torch.device("cuda", rank % gpus) if gpus else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.distributed.init_process_group(
        dist_backend, init_method=f"file://{Path(work_dir) / 'rendezvous'}", rank=rank,
        world_size=world, timeout=timedelta(seconds=300))
    return device


def _spawn(worker, world: int, work: str, gpus: int, dist_backend: str) -> list:
    """Every rank's results: ``world`` processes of ``worker``, each ending in finish_rank."""
    import torch.multiprocessing as mp
    from samu.experiment import spawned_ranks
    try:
        mp.start_processes(worker, args=(world, work, gpus, dist_backend), nprocs=world,
                           start_method="spawn")
    except mp.ProcessExitedException as exc:
        if not spawned_ranks.died_after_writing(exc, work, world):
            raise
        print(f"warning: {spawned_ranks.kept_despite(exc)}", file=sys.stderr, flush=True)
    return spawned_ranks.load_results(work, world)


def check_worker(rank: int, world: int, work_dir: str, gpus: int, dist_backend: str):
    device = _join(rank, world, work_dir, gpus, dist_backend)
    from samu.distributed import build_cp_context
    from samu.functional import FUNCTIONS
    job = torch.load(Path(work_dir) / "job.pt")
    results = {}
    for name, case in job.items():
        lengths = case["slices"]
        start = sum(lengths[:rank])
        end = start + lengths[rank]
        ctx = build_cp_context(cu_seqlens=case["cu_seqlens"], slice_lengths=lengths)
        x = case["x"][:, start:end].to(device).requires_grad_()
        params = [p.to(device).requires_grad_() for p in case["params"]]
        h0 = case.get("initial_state")
        h0 = None if h0 is None else h0.to(device).requires_grad_()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            y, states, backend = FUNCTIONS[case["mixer"]](
                x, *params, backend="auto", initial_state=h0, output_final_state=True,
                return_backend=True, cp_context=ctx)
        d_final = case["d_final_state"].to(device)
        if ctx.packed:
            d_states = d_final[list(ctx.sequence_ids)].clone()
            if ctx.continues_to_next:
                d_states[-1] = 0
        else:
            d_states = d_final if rank == world - 1 else torch.zeros_like(d_final)
        dy = case["dy"][:, start:end].to(device)
        torch.autograd.backward([y, states], [dy.to(y.dtype), d_states.to(states.dtype)])
        grads = [p.grad for p in params] + ([h0.grad] if h0 is not None else [])
        for g in grads:  # on the rank's device: NCCL reduces CUDA tensors only
            torch.distributed.all_reduce(g)
        grads = [g.cpu() for g in grads]
        results[name] = {"y": y.detach().cpu(), "states": states.detach().cpu(),
                         "x": x.grad.cpu(), "grads": grads, "backend": backend,
                         "sequence_ids": None if not ctx.packed else list(ctx.sequence_ids),
                         "continues": ctx.continues_to_next}
    from samu.experiment.spawned_ranks import finish_rank
    finish_rank(results, work_dir, rank)


def check(args, device) -> int:
    from samu.experiment import legality
    from samu.functional import PARAMETER_NAMES
    paths, protocol, schema = _modules()
    length, width = args.check_length, args.width
    report = {"environment": protocol.environment(device), "cases": []}
    legal = True
    for world in args.ranks:
        if length % world:
            raise SystemExit(f"--check-length {length} does not split over {world} ranks")
        slices = [length // world] * world
        slices[0] -= 1  # uneven slices
        slices[-1] += 1
        job, wants = {}, {}
        for mixer in args.mixers:
            for layout in ("plain", "plain_h0", "packed", "packed_h0"):
                unpacked = layout.startswith("plain")
                batch = 2 if unpacked else 1
                cu = None if unpacked else check_sequences(slices)
                x, params, dy = legality.make_inputs(mixer, (batch, length, width), device)
                state = legality.make_state((batch, length, width), device, cu_seqlens=cu,
                                            initial=layout.endswith("_h0"))
                want = legality.oracle(mixer, x, params, dy, state)
                eager = legality.relative_errors(
                    legality.outputs(mixer, "reference_chunked", x, params, dy, state), want)
                name = f"{mixer}-{layout}"
                wants[name] = (want, eager)
                job[name] = {"mixer": mixer, "slices": slices, "cu_seqlens": cu,
                             "x": x.cpu(), "params": [p.cpu() for p in params.values()],
                             "dy": dy.cpu(), "d_final_state": state["d_final_state"].cpu(),
                             "initial_state": (state["initial_state"].cpu()
                                               if "initial_state" in state else None)}
        with tempfile.TemporaryDirectory() as work:
            torch.save(job, Path(work) / "job.pt")
            ranks = _spawn(check_worker, world, work, args.gpus, args.dist_backend)
        for name, (want, eager) in wants.items():
            mixer = job[name]["mixer"]
            got = {"y": torch.cat([r[name]["y"] for r in ranks], 1),
                   "x": torch.cat([r[name]["x"] for r in ranks], 1)}
            names = list(PARAMETER_NAMES[mixer]) + (
                ["initial_state"] if job[name]["initial_state"] is not None else [])
            got.update(zip(names, ranks[0][name]["grads"]))
            if job[name]["cu_seqlens"] is None:
                got["final_state"] = ranks[-1][name]["states"]
            else:  # each sequence's final state from the rank where it ends
                final = torch.empty_like(want["final_state"].cpu()).float()
                for r in ranks:
                    ids = r[name]["sequence_ids"][:-1 if r[name]["continues"] else None]
                    final[ids] = r[name]["states"][:len(ids)].float()
                got["final_state"] = final
            want_cpu = {k: v.cpu() for k, v in want.items()}
            errors = legality.relative_errors(got, want_cpu)
            bounds = {k: legality.ERROR_FACTOR * e + legality.ERROR_SLACK
                      for k, e in eager.items()}
            failing = [k for k, e in errors.items() if not e <= bounds[k]]
            legal &= not failing
            report["cases"].append({"case": name, "ranks": world, "slices": slices,
                                    "cu_seqlens": job[name]["cu_seqlens"],
                                    "backends": [r[name]["backend"] for r in ranks],
                                    "errors": errors, "bounds": bounds,
                                    "eager_errors": eager, "legal": not failing})
            worst = max(errors, key=lambda k: errors[k] / bounds[k])
            print(f"P={world} {name}: {'legal' if not failing else 'NOT LEGAL ' + str(failing)};"
                  f" max error {max(errors.values()):.2e}, closest to its bound: {worst} "
                  f"{errors[worst]:.2e} <= {bounds[worst]:.2e}", flush=True)
    out = Path(args.out) if args.out else (paths.DATA / "context_parallel"
                                           / f"{protocol.device_slug(device)}_check.json")
    schema.write_json_atomic(out, report, kind="context_parallel_check")
    print("wrote", paths.relative(out))
    return 0 if legal else 1


def distributed_worker(rank: int, world: int, work_dir: str, gpus: int, dist_backend: str):
    """This rank's timings of the real context-parallel call (see the module docstring)."""
    device = _join(rank, world, work_dir, gpus, dist_backend)
    from samu.distributed import build_cp_context
    from samu.functional import FUNCTIONS
    dist = torch.distributed
    job = torch.load(Path(work_dir) / "job.pt")
    _, protocol, _ = _modules()
    results = []
    for case in job["cases"]:
        mixer, length, width = case["mixer"], case["length"], case["width"]
        # The whole sequence made on the host (the same on every rank), this rank's slice moved
        x, params, dy = make_inputs(mixer, length, width, "cpu", torch.bfloat16)
        params = [p.to(device) for p in params]
        local = length // world
        xs = x[:, rank * local:(rank + 1) * local].contiguous().to(device)
        dys = dy[:, rank * local:(rank + 1) * local].contiguous().to(device)
        ctx = build_cp_context()
        xg = xs.detach().requires_grad_()
        ps = [p.detach().requires_grad_() for p in params]
        fn = FUNCTIONS[mixer]

        def share():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                y = fn(xg, *ps, backend=job["backend"], cp_context=ctx)
            torch.autograd.grad(y, [xg, *ps], dys)
        call = one_call(mixer, xs, params, dys, job["backend"])
        summaries = torch.zeros(2, 1, width, device=device)
        gathered = [torch.empty_like(summaries) for _ in range(world)]

        def gather():
            dist.all_gather(gathered, summaries)
        times = {}
        for label, step in (("share", share), ("call", call), ("all_gather", gather)):
            for _ in range(job["warmup"]):
                step()
            samples = []
            for _ in range(job["repeats"]):
                if device.type == "cuda":
                    torch.cuda.synchronize()
                dist.barrier()  # every rank starts together, as in training
                begin, end = protocol._timer(device)
                begin()
                step()
                samples.append(end())
            times[label] = statistics.median(samples)
        results.append({**case, "rank": rank, "device": str(device), **{
            f"{k}_ms": v for k, v in times.items()}})
    from samu.experiment.spawned_ranks import finish_rank
    finish_rank(results, work_dir, rank)


def distributed(args, device) -> int:
    """--distributed: P processes each timing its rank's real call (module docstring)."""
    paths, protocol, schema = _modules()
    rows = []
    for world in args.ranks:
        cases = [{"mixer": m, "length": n, "width": args.width, "ranks": world}
                 for m in args.mixers for n in args.lengths if n % world == 0]
        job = {"cases": cases, "backend": args.backend, "repeats": args.repeats,
               "warmup": args.warmup}
        with tempfile.TemporaryDirectory() as work:
            torch.save(job, Path(work) / "job.pt")
            ranks = _spawn(distributed_worker, world, work, args.gpus, args.dist_backend)
        for i, case in enumerate(cases):
            mine = [r[i] for r in ranks]
            slowest = max(m["share_ms"] for m in mine)
            row = {**case, "devices": [m["device"] for m in mine],
                   "rank_ms": [m["share_ms"] for m in mine],
                   "call_at_slice_ms": [m["call_ms"] for m in mine],
                   "all_gather_ms": [m["all_gather_ms"] for m in mine],
                   "slowest_rank_ms": slowest,
                   "slowest_rank_over_slice_call": slowest / max(m["call_ms"] for m in mine),
                   "all_gather_share_of_slowest": max(m["all_gather_ms"] for m in mine)
                   / slowest}
            rows.append(row)
            print(f"{case['mixer']} L={case['length']} P={world}: ranks "
                  f"{[round(t, 3) for t in row['rank_ms']]} ms, call at L/P "
                  f"{max(row['call_at_slice_ms']):.3f} ms (slowest / call "
                  f"{row['slowest_rank_over_slice_call']:.2f}), all_gather of the summaries "
                  f"{max(row['all_gather_ms']):.3f} ms", flush=True)
    doc = {"environment": protocol.environment(device),
           "protocol": {"repeats": args.repeats, "warmup": args.warmup,
                        "dist_backend": args.dist_backend, "gpus": args.gpus,
                        "timer": "CUDA events" if device.type == "cuda" else "host clock",
                        "share": "the real context-parallel call and its backward, ranks "
                                 "started together after a barrier"},
           "rows": rows}
    out = Path(args.out) if args.out else (paths.DATA / "context_parallel"
                                           / f"{protocol.device_slug(device)}_distributed.json")
    schema.write_json_atomic(out, doc, kind="context_parallel_distributed")
    print("wrote", paths.relative(out))
    return 0


def main(argv=None) -> int:
    from samu import backends
    from samu.experiment import benchmark_cli
    from samu.experiment.benchmark_cli import device as device_type, positive_int
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", type=device_type, default=None,
                        help="cuda (default when present) or cpu")
    parser.add_argument("--lengths", type=positive_int, nargs="+",
                        default=[2**17, 2**18, 2**19, 2**20])
    parser.add_argument("--ranks", type=positive_int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--width", type=positive_int, default=2048)
    parser.add_argument("--mixers", nargs="+", default=_mixers(), choices=_mixers(),
                        action=benchmark_cli.Distinct)
    parser.add_argument("--backend", default="auto", choices=_backend_names(_mixers()),
                        metavar="NAME", help="auto (default) or a backend of every --mixers")
    parser.add_argument("--repeats", type=positive_int, default=10)
    parser.add_argument("--warmup", type=benchmark_cli.non_negative_int, default=None,
                        help="calls before timing (default 3 on a GPU, 1 on a CPU)")
    parser.add_argument("--host", action="store_true",
                        help="also time the host alone: each call and share with its Triton "
                             "launches stubbed (samu's Python, autograd and the torch ops)")
    parser.add_argument("--profile", action="store_true",
                        help="also print each kernel's GPU time in ranks 0, 1 and P - 1 and in "
                             "the call at L / P (torch.profiler, CUDA only)")
    parser.add_argument("--check", action="store_true",
                        help="legality of the context-parallel path, P processes (on one "
                             "GPU, or over --gpus)")
    parser.add_argument("--check-length", type=positive_int, default=2**14)
    parser.add_argument("--distributed", action="store_true",
                        help="time the real call, P processes with real collectives")
    parser.add_argument("--gpus", type=positive_int, default=None,
                        help="--check and --distributed: rank r on GPU r mod GPUS (default 1 "
                             "on CUDA)")
    parser.add_argument("--dist-backend", default=None,
                        help="--check and --distributed: the process group's backend (default "
                             "nccl with --gpus > 1, else gloo)")
    parser.add_argument("--out", default=None, help="the JSON file to write (default: "
                        "data/context_parallel/<gpu-slug>.json, or <gpu-slug>_check.json)")
    args = parser.parse_args(argv)
    # The one --backend runs every mixer: each must have it.
    benchmark_cli.backends_named(parser, [args.backend],
                                 {m: ["auto", *backends.available(m)] for m in args.mixers},
                                 option="--backend")
    device = args.device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.warmup is None:
        args.warmup = 3 if device.type == "cuda" else 1
    if args.profile and device.type != "cuda":
        parser.error("--profile needs a CUDA device")
    if device.type == "cuda":
        args.gpus = args.gpus or 1
        if args.gpus > torch.cuda.device_count():
            parser.error(f"--gpus {args.gpus}: this machine has {torch.cuda.device_count()}")
    elif args.gpus:
        parser.error("--gpus needs a CUDA device")
    else:
        args.gpus = 0
    args.dist_backend = args.dist_backend or ("nccl" if args.gpus > 1 else "gloo")
    if args.check:
        return check(args, device)
    if args.distributed:
        return distributed(args, device)
    paths, protocol, schema = _modules()
    doc = {"environment": protocol.environment(device),
           "protocol": {"repeats": args.repeats, "warmup": args.warmup,
                        "timer": "CUDA events" if device.type == "cuda" else "host clock",
                        "share": "samu.distributed's phases with a simulated gather: summary "
                                 "pass, slice forward, adjoint at the slice start and slice "
                                 "backward (one SliceRun where the family shares them)"},
           **benchmark(args, device)}
    out = Path(args.out) if args.out else (paths.DATA / "context_parallel"
                                           / f"{protocol.device_slug(device)}.json")
    schema.write_json_atomic(out, doc, kind="context_parallel")
    print("wrote", paths.relative(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

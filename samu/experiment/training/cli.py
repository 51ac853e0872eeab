"""`make train`: notebook 05 with ``GPU_PARAMETERS`` on a CUDA device."""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import torch

from ... import model as model_
from .. import schema
from .parameters import Range
from .parameters import ParameterError
from .study import check_parameters, parse_part, part_path, result_path, summary

# --- make train ----------------------------------------------------------------------------------

# The configuration of `make train` on a GPU: width 256, 2 layers, 3 seeds; for every (task,
# length, mixer) a learning-rate sweep of three rates at the first seed, widened past an edge
# best, then the other two seeds at the best rate; recall and copying at two lengths, the LM at
# one: 75 runs and a few widenings, each its full steps (no time cap); then Zoology's recall
# curves, 27 runs.  The
# recurrent mixers run inside Griffin's recurrent block, attention with the usual heads of 64
# channels.  Attention must reach the sanity bar on recall and copying at the shorter length
# before the conclusion compares anything.  The steps come from probes on the H200
# (docs/sweeps/2026-12-02_48199ae_gpu_probes): attention copies at L = 256 to 0.978 in 2000
# steps (lr 3e-4; 0.79 in 800); RG-LRU and SAMU in Griffin's block stay at the 1/8 guessing
# baseline on MQAR after 1200 steps and reach 0.78 and 0.82 after 4000.  Eager steps of these
# small models took 6-14 ms, nearly all launches, so every step replays a CUDA graph.  With
# graphs, four runs at once (worker processes) trained at 0.61-0.92x the rate of one at a time
# (docs/sweeps/2026-12-03_a57ed47_gpu_training), so the runs go one at a time.
GPU_PARAMETERS = dict(
    mixers=list(model_.MIXERS),
    seeds=[0, 1, 2],
    width=256,
    layers=2,
    mlp_expansion=4,
    tasks={
        "mqar": {"lengths": [256, 512], "num_pairs": 8, "vocab_size": 64},
        "copy": {"lengths": [256, 512], "num_tokens": 16, "data_vocab": 16,
                 "noise_vocab": 16},
        "lm": {"lengths": [512]},
    },
    steps={"mqar": 4000, "copy": 2000, "lm": 1000},
    batch_size={"mqar": 64, "copy": 64, "lm": 32},
    lr=[3e-4, 1e-3, 3e-3],
    lr_search="first_seed",
    warmup_steps=100,
    eval_batches=8,
    timing_warmup_steps=10,
    log_every=20,
    time_budget_s=None,
    recurrent_block="griffin",
    attention_heads="standard",
    attention_head_dim=64,
    sanity_bar=0.95,
    speed_steps=50,
    processes=1,
    cuda_graph=True,
    # 9 points x 3 mixers, one seed, one rate: 27 runs.  At 2000 steps attention reached 0.73 at
    # 16 pairs with lr 1e-3 and 0.20 with 3e-4; in 4000 steps at 8 pairs SAMU learned MQAR best
    # at 1e-3 (0.815) and RG-LRU at 3e-3 (0.775).  One rate halves the runs; 1e-3 is attention's.
    recall_curves={"seq_len": 256, "vocab_size": 256, "pairs": [4, 8, 16, 32, 64],
                   "widths": [64, 128, 256, 512], "fixed_pairs": 16, "steps": 2500,
                   "lr": [1e-3]},
)


NOTEBOOK = "05_training"
# A run's own temporary files: passed to the notebook, left out of its stored copy.
UNSTORED_PARAMETERS = ("progress_log",)


def _time_budget_argument(text: str) -> float:
    """--time-budget's value: seconds, a finite number > 0."""
    allowed = Range(low=0, low_open=True)
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not allowed.admits(value):
        raise argparse.ArgumentTypeError(f"must be {allowed.describe()} (seconds), got {text!r}")
    return value


def _device_argument(text: str) -> torch.device:
    try:
        device = torch.device(text)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"must be cpu, cuda or cuda:<index>, got {text!r}")
    return device


def main(argv=None, gpu_parameters: dict = GPU_PARAMETERS) -> int:
    """`make train`: notebook 05 on ``--device`` (default: CUDA when there is one, else the CPU)
    with ``gpu_parameters`` on a CUDA device and the notebook's own defaults on the CPU; every
    parameter is checked (check_parameters) before anything runs or is written."""
    parser = argparse.ArgumentParser(
        description="Run notebooks/05_training.ipynb with papermill: the GPU configuration "
                    "(GPU_PARAMETERS) on a CUDA device, the notebook's own small defaults on "
                    "the CPU. The executed notebook goes to data/runs/<slug>/05_training.ipynb, "
                    "the slug that of the device trained on.")
    parser.add_argument("--device", type=_device_argument, default=None,
                        help="cpu, cuda or cuda:<index> (default: cuda when this machine has "
                             "it, else cpu); the results are labelled by this device")
    parser.add_argument("--defaults", action="store_true",
                        help="use the notebook's own (CPU-sized) defaults even on a GPU")
    parser.add_argument("--time-budget", type=_time_budget_argument, default=None,
                        help="an optional safety cap: seconds of measured training for the whole "
                             "study, a finite number > 0 (default: none; each run its full "
                             "steps); runs it stops are recorded as such")
    parser.add_argument("--processes", type=int, default=None, metavar="N",
                        help="runs at once on each device (default: the configuration's; 1 on "
                             "the CPU)")
    parser.add_argument("--devices", default=None, metavar="LIST",
                        help="the CUDA devices the runs spread over: 'all' or a comma list such "
                             "as cuda:0,cuda:1 (default: --device alone)")
    parser.add_argument("--part", default=None, metavar="K/N",
                        help="run only the K-th of N parts of the study's runs (each writes "
                             "data/training/<slug>.part-K-of-N.json; the part that finds every "
                             "part's file merges them into the result file)")
    args = parser.parse_args(argv)
    from ... import paths
    from .. import pipeline, protocol

    device = args.device or protocol.default_device()
    on_gpu = device.type == "cuda"
    if on_gpu and not torch.cuda.is_available():
        parser.error(f"--device {device}: this machine has no CUDA device")
    if on_gpu and device.index is not None and device.index >= torch.cuda.device_count():
        parser.error(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA "
                     "devices")
    parameters = dict(gpu_parameters) if on_gpu and not args.defaults else {}
    if args.time_budget is not None:
        parameters["time_budget_s"] = args.time_budget
    parameters["device"] = str(device)
    if args.processes is not None:
        parameters["processes"] = args.processes
    if args.devices is not None:
        parameters["devices"] = ([f"cuda:{i}" for i in range(torch.cuda.device_count())]
                                 if args.devices == "all" else args.devices.split(","))
    if args.part is not None:
        try:
            parse_part(args.part)
        except ParameterError as exc:
            parser.error(f"--part: {exc}")
        parameters["part"] = args.part
    defaults = pipeline.notebook_parameters(NOTEBOOK)
    check_parameters({**defaults, **parameters}, known=defaults)  # before anything is written

    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    import threading
    import tempfile

    if not on_gpu:
        print("Training on the CPU: the notebook's small defaults; they exercise the study and "
              "are no GPU result.", flush=True)
    pipeline.export_data_dir()
    slug = protocol.device_slug(device)
    out_dir = paths.runs_dir(slug)
    stored = paths.relative(pipeline.executed_paths(NOTEBOOK, out_dir)["stored"])
    fd, log = tempfile.mkstemp(prefix="samu-training-", suffix=".log")
    os.close(fd)
    parameters["progress_log"] = log
    print(f"{NOTEBOOK} on {device} ({slug}): executed notebook -> {stored}", flush=True)
    failure = []

    def work():
        try:
            pipeline.run_notebook(NOTEBOOK, out_dir, parameters, unstored=UNSTORED_PARAMETERS)
        except BaseException as exc:  # reported by the main thread
            failure.append(exc)

    started = time.perf_counter()
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    seen = 0
    try:
        while True:
            thread.join(timeout=2.0)
            with open(log) as f:
                lines = f.read().splitlines()
            for line in lines[seen:]:
                print(f"[{time.perf_counter() - started:6.0f} s] {line}", flush=True)
            seen = len(lines)
            if not thread.is_alive():
                break
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(log)
    wall = time.perf_counter() - started
    if failure:
        print(f"\ntrain FAILED after {wall:.0f} s: {type(failure[0]).__name__}: {failure[0]}\n"
              f"the executed notebook is kept as "
              f"{paths.relative(pipeline.executed_paths(NOTEBOOK, out_dir)['failed'])}",
              file=sys.stderr)
        return 1
    import pandas as pd
    done = result_path(slug)
    if args.part is not None:
        merged = done.exists() and schema.read_valid_json(done, "training").get("parts")
        if not merged and part_path(slug, args.part).exists():
            done = part_path(slug, args.part)  # the other parts are still to run
    doc = schema.read_valid_json(done, "training")
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print("\n" + summary(doc).round(4).to_string(index=False))
    print(f"\n{len(doc['runs'])} runs in {wall:.0f} s; wrote {paths.relative(done)}, "
          f"{paths.relative(paths.figures_dir())}/{slug}_training_*.png, {stored}")
    return 0

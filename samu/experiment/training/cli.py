"""`make train`: notebook 05 with a configuration (configs.CONFIGURATIONS) at a GPU's size on a
CUDA device, at a CPU's otherwise."""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import torch

from ... import paths
from .. import benchmark_cli, schema
from .budget import committed_document, estimate_lines
from .configs import CONFIGURATIONS, configuration
from .curves import recall_curve_frame
from .parameters import ParameterError
from .results import (UNNAMED_CONFIGURATION, fresh_result, merge_parts, merge_when_whole,
                      mixed_environments, parse_part, part_path, result_path, results_label,
                      summary)
from .session import configured_study, described, part_of, written_part

NOTEBOOK = "05_training"
# A run's own temporary files: passed to the notebook, left out of its stored copy.
UNSTORED_PARAMETERS = ("progress_log",)


device_argument = benchmark_cli.device


def chosen_configurations(text: str | None, on_gpu: bool, table: dict) -> list[str] | None:
    """--config's value: a configuration's name, or "all"; None (not given): the small study on
    a GPU, every configuration on the CPU (notebook 05's default, None)."""
    if text is None:
        return [UNNAMED_CONFIGURATION] if on_gpu else None
    if text == "all":
        return list(table)
    configuration(text, table)  # ValueError naming the ones there are
    return [text]


def notebook_folder(slug: str, chosen: list[str] | None, part: str | None = None):
    """data/runs/<slug>/ for the unnamed configuration or several; data/runs/<slug>/<name>/
    for one other configuration alone; a part's in its own part-<k>-of-<n>/ below that."""
    folder = paths.runs_dir(slug)
    if chosen is not None and len(chosen) == 1 and chosen[0] != UNNAMED_CONFIGURATION:
        folder = folder / chosen[0]
    if part is not None:
        k, n = parse_part(part)
        folder = folder / f"part-{k}-of-{n}"
    return folder


def print_document(doc: dict, name: str, path, verb: str = "wrote") -> None:
    """A result document's tables (each mixer at its best rate; the recall curves), and where
    it is ("wrote" or "read" it)."""
    import pandas as pd
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        if doc["runs"]:
            print("\n" + summary(doc).round(4).to_string(index=False))
        if doc.get("recall_curves"):
            print("\n" + recall_curve_frame(doc).round(4).to_string(index=False))
    print(f"\n{name}: {len(doc['runs'])} runs, {len(doc.get('recall_curves', []))} "
          f"recall-curve runs; {verb} {paths.relative(path)}")


def written_part_count(label: str, name: str, parser) -> int:
    """N of the part files data/training/<label>[.<name>].part-K-of-N.json on disk, one N."""
    whole = result_path(label, name)
    found = {int(p.stem.rsplit("-of-", 1)[1])
             for p in whole.parent.glob(f"{whole.stem}.part-*-of-*.json")
             if p.stem.rsplit("-of-", 1)[1].isdigit()}
    if len(found) != 1:
        parser.error(f"--merge {label}: " + (
            f"no part file of {name} ({paths.relative(whole.parent)}/{whole.stem}"
            ".part-K-of-N.json)" if not found else
            f"part files of {name} split {len(found)} ways ({', '.join(map(str, sorted(found)))}"
            " parts): keep one study's"))
    return found.pop()


def merge_written_parts(label: str, name: str, parser) -> int:
    """--merge: the part files of configuration ``name`` labelled ``label`` (however many
    parts they were run in) joined into its result (merge_parts), its figures drawn, its
    tables, sanity bars and conclusion printed."""
    from .conclusion import conclusion
    from .figures import draw_figures
    from .session import sanity_text
    from ..pipeline import SLUG
    if not SLUG.match(label):  # a dot would take another configuration's files
        parser.error(f"--merge {label!r}: a label is a GPU's slug (lowercase letters, digits "
                     "and hyphens: the start of a data/training file name, e.g. nvidia-h200)")
    parts = written_part_count(label, name, parser)
    wanted = [part_path(label, f"{k}/{parts}", name) for k in range(1, parts + 1)]
    missing = [str(paths.relative(p)) for p in wanted if not p.exists()]
    if missing:
        parser.error(f"--merge {label}: no file for {len(missing)} of the {parts} parts of "
                     f"{name}: {', '.join(missing)}")
    try:
        doc = merge_parts(label, f"1/{parts}", name)
    except ValueError as exc:
        parser.error(f"--merge {label}: {exc}")
    print_document(doc, name, result_path(label, name))
    mixed = mixed_environments(doc)
    if mixed:
        print(mixed)
    for task, said in doc.get("bars_recorded", {}).items():
        print(f"{task}: {said}")
    print("\n" + sanity_text(doc))
    drawn = draw_figures(doc, label)
    print("\n" + conclusion(doc))
    print(f"\nfigures: {', '.join(str(paths.relative(p)) for p in drawn)}")
    return 0


def read_written_part(slug: str, part: str, name: str, study, device, parser) -> int:
    """A part whose file holds its study already: nothing trained, its notebook left as it
    ran; the parts merged (timed side by side on ``device`` where not yet: time_merged, and
    the figures drawn) once every one is written, or a parser error where they refuse to."""
    from .figures import draw_figures
    from .session import time_merged
    own = part_path(slug, part, name)
    print(f"{paths.relative(own)}: part {part} of {name} is written already; nothing is "
          "trained (remove the file to train it again)", flush=True)
    try:
        merged, why = merge_when_whole(slug, part, name, described(study))
    except ValueError as exc:  # parts of other GPUs or data: --merge's words
        parser.error(f"--part {part}: {exc}")
    if why:
        print(why)
        print_document(schema.read_valid_json(own, "training"), name, own, verb="read")
    else:
        time_merged(merged, study, device, slug)
        drawn = draw_figures(merged, slug)
        print(f"merged; figures: {', '.join(str(paths.relative(p)) for p in drawn)}")
        print_document(merged, name, result_path(slug, name))
        mixed = mixed_environments(merged)
        if mixed:
            print(mixed)
    return 0


def main(argv=None, configurations: dict | None = None) -> int:
    """`make train`: notebook 05 on ``--device`` (default: CUDA when there is one, else the CPU)
    for ``--config`` of ``configurations`` (None: CONFIGURATIONS) at a GPU's size on a CUDA
    device and a CPU's otherwise; every parameter of every configuration it runs is checked
    (configured_study) before anything runs or is written, and the notebook is handed those
    parameters ("studies") when a configuration is named, its own defaults otherwise."""
    table = CONFIGURATIONS if configurations is None else configurations
    parser = argparse.ArgumentParser(
        prog="python -m samu.experiment.training",
        description="Run notebooks/05_training.ipynb with papermill for a study configuration "
                    "(samu.experiment.training.CONFIGURATIONS): at a GPU's size on a CUDA "
                    "device, at a CPU's otherwise. The executed notebook goes to "
                    "data/runs/<label>/[<config>/][part-K-of-N/]05_training.ipynb, the label "
                    "the device's slug (with -cpu-size for a CPU's size on a GPU); results to "
                    "data/training/<label>[.<config>].json.")
    parser.add_argument("--config", default=None, metavar="NAME",
                        help=f"the configuration: {', '.join(CONFIGURATIONS)} or all (default: "
                             f"{UNNAMED_CONFIGURATION} on a GPU, all on the CPU)")
    parser.add_argument("--device", type=device_argument, default=None,
                        help="cpu, cuda or cuda:<index> (default: cuda when this machine has "
                             "it, else cpu); the results are labelled by this device")
    parser.add_argument("--defaults", action="store_true",
                        help="the configurations at a CPU's size even on a GPU (files "
                             "labelled <gpu>-cpu-size)")
    parser.add_argument("--time-budget", type=float, default=None,
                        help="an optional safety cap: seconds of measured training for each "
                             "study's tasks, a finite number > 0 (default: none; each run its "
                             "full steps); runs it stops are recorded as such")
    parser.add_argument("--processes", type=int, default=None, metavar="N",
                        help="runs at once on each device (default: the configuration's)")
    parser.add_argument("--devices", default=None, metavar="LIST",
                        help="the CUDA devices the runs spread over: 'all' or a comma list such "
                             "as cuda:0,cuda:1 (default: --device alone)")
    parser.add_argument("--part", default=None, metavar="K[/N]",
                        help="run only the K-th part of one configuration's runs (of its own "
                             "number of parts, or of N); each writes "
                             "data/training/<slug>[.<config>].part-K-of-N.json, and the part "
                             "that finds every part's file merges them; run again after a stop, "
                             "a part trains only what it had not finished, each run from its "
                             "last save")
    parser.add_argument("--merge", default=None, metavar="LABEL",
                        help="train nothing: join the part files of --config's study labelled "
                             "LABEL (data/training/LABEL.<config>.part-K-of-N.json, written on "
                             "one machine or several) into its result, draw its figures and "
                             "print its tables, sanity bars and conclusion; on any machine")
    parser.add_argument("--estimate", action="store_true",
                        help="print the GPU study's device time, in all and per part, estimated "
                             "from the committed H200 study's step times, and run nothing")
    parser.add_argument("--measure", action="store_true",
                        help="with --estimate on a CUDA device: first time each configuration's "
                             "step alone there, beside the estimate")
    args = parser.parse_args(argv)
    from .. import pipeline, protocol

    if args.merge is not None:
        if args.config in (None, "all"):
            parser.error("--merge: name one configuration with --config")
        besides = [flag for flag, given in (("--part", args.part), ("--device", args.device),
                                            ("--estimate", args.estimate),
                                            ("--defaults", args.defaults),
                                            ("--time-budget", args.time_budget),
                                            ("--processes", args.processes),
                                            ("--devices", args.devices)) if given]
        if besides:
            parser.error(f"--merge trains nothing: drop {', '.join(besides)}")
        try:
            configuration(args.config, table)
        except ValueError as exc:
            parser.error(f"--config: {exc}")
        return merge_written_parts(args.merge, args.config, parser)
    if args.measure and not (args.estimate and torch.cuda.is_available()):
        parser.error("--measure: with --estimate, on a machine with a CUDA device")
    if args.estimate:
        if args.part is not None:
            parser.error("--estimate prints every part's estimate: drop --part")
        names = list(table) if args.config in (None, "all") else [args.config]
        for name in names:
            try:
                configuration(name, table)
            except ValueError as exc:
                parser.error(f"--config: {exc}, or all")
        doc = committed_document()
        for name in names:
            study, _ = configured_study(name, "gpu", configurations=table)
            for line in estimate_lines(study, configuration(name, table).parts, doc,
                                       "cuda" if args.measure else None):
                print(line, flush=True)
        return 0

    device = args.device or protocol.default_device()
    on_gpu = device.type == "cuda"
    if on_gpu and not torch.cuda.is_available():
        parser.error(f"--device {device}: this machine has no CUDA device")
    if on_gpu and device.index is not None and device.index >= torch.cuda.device_count():
        parser.error(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA "
                     "devices")
    try:
        chosen = chosen_configurations(args.config, on_gpu, table)
    except ValueError as exc:
        parser.error(f"--config: {exc}, or all")
    size = "gpu" if on_gpu and not args.defaults else "cpu"
    overrides = {}
    if args.time_budget is not None:
        overrides["time_budget_s"] = args.time_budget
    if args.processes is not None:
        overrides["processes"] = args.processes
    devices = None
    if args.devices is not None:
        if args.devices == "all" and not torch.cuda.device_count():
            parser.error("--devices all: this machine has no CUDA device")
        devices = ([f"cuda:{i}" for i in range(torch.cuda.device_count())]
                   if args.devices == "all" else args.devices.split(","))
        overrides["devices"] = devices
    names = list(table) if chosen is None else chosen
    part = None
    if args.part is not None:
        if len(names) != 1:
            parser.error("--part: name one configuration with --config")
        try:
            part = part_of(args.part, configuration(names[0], table).parts)
        except ParameterError as exc:
            parser.error(f"--part: {exc}")
    studies, built = {}, {}
    try:  # every parameter checked once, here, before anything is written
        for name in names:
            built[name], studies[name] = configured_study(
                name, size, {**overrides, "device": str(device)}, part, table)
            del studies[name]["device"]
            studies[name].pop("part", None)
    except ParameterError as exc:
        parser.error(str(exc))
    parameters = {"size": size, "part": part, "device": str(device)}
    if chosen is not None or configurations is not None:
        parameters["studies"] = studies

    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    import threading
    import tempfile

    if size == "cpu":
        print("Training at a CPU's size: the configurations' small defaults; they exercise the "
              "studies and are no GPU result.", flush=True)
    pipeline.export_data_dir()
    slug = results_label(device, size)
    if part is not None and written_part(part_path(slug, part, names[0]), built[names[0]]):
        return read_written_part(slug, part, names[0], built[names[0]], device, parser)
    out_dir = notebook_folder(slug, chosen, part)
    stored = paths.relative(pipeline.executed_paths(NOTEBOOK, out_dir)["stored"])
    fd, log = tempfile.mkstemp(prefix="samu-training-", suffix=".log")
    os.close(fd)
    parameters["progress_log"] = log
    print(f"{NOTEBOOK} ({', '.join(names)}) on {device}"
          f"{f' (files labelled {slug})' if slug != str(device) else ''}: executed notebook -> "
          f"{stored}", flush=True)
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
    for name in names:
        done = result_path(slug, name) if part is None else fresh_result(slug, part, name)
        print_document(schema.read_valid_json(done, "training"), name, done)
    print(f"\n{wall:.0f} s; figures in {paths.relative(paths.figures_dir())}/{slug}_training_*.png, "
          f"executed notebook {stored}")
    return 0

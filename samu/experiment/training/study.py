"""The study: which runs it makes (``Study``), notebook 05's parameters and their ranges, one run
(``run_one``) and every run of a task (``run_task``), and the result document (``"training"``
schema) with its reading, writing and tables."""
from __future__ import annotations

import inspect
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ... import model as model_
from .. import schema
from .loop import TrainConfig, dtype_name, evaluate, train
from .pool import Job, RunPool, check_devices, speed_config
from .resume import FinishedRuns
from .parameters import (COUNT, LEARNING_RATE, OFFSET, SECONDS, ParameterError, Range,
                         _check_list)
from .tasks import MQAR, TASK_OPTION_RANGES, TASKS, corpus, make_task, task_options

# The numeric parameters of notebook 05, so of `make train`, and what each may be.  "seeds" is
# a list of them, "tasks" maps a task to its "lengths" (a list of COUNT) and options
# (TASK_OPTION_RANGES); "steps" and "batch_size" are one value or a dict by task.
PARAMETER_RANGES = {
    "seeds": OFFSET,
    "width": COUNT,
    "layers": COUNT,
    "mlp_expansion": COUNT,
    "lengths": COUNT,
    "steps": COUNT,
    "batch_size": COUNT,
    "lr": LEARNING_RATE,  # one rate, or a list: the learning-rate sweep
    "warmup_steps": OFFSET,
    "eval_batches": COUNT,
    "timing_warmup_steps": OFFSET,
    "log_every": COUNT,
    "time_budget_s": SECONDS,
    "cpu_threads": Range(integer=True, low=0, optional=True),  # 0 or None: torch's default
    "sanity_bar": Range(low=0, high=1),
    "attention_head_dim": COUNT,
    "recall_curves": COUNT,  # None, or a dict whose numbers are checked by RECALL_CURVE_KEYS
    "speed_steps": COUNT,  # steps timed alone per configuration (measure_speed)
    "processes": COUNT,  # runs at once on each device (RunPool)
}
# Zoology's recall curves: MQAR accuracy against the number of key-value pairs at one length and
# width (``pairs``), and against the model's width at ``fixed_pairs`` (``widths``); every point
# is trained at each of the curves' "lr" rates (default: the study's sweep) for ``steps`` steps
# (the first seed) and scored at its best.
RECALL_CURVE_KEYS = {"seq_len": COUNT, "vocab_size": COUNT, "pairs": COUNT, "widths": COUNT,
                     "fixed_pairs": COUNT, "steps": COUNT}
RECALL_CURVE_LISTS = ("pairs", "widths")
# Optional: "lr", the curves' own learning rates (a list; default the study's sweep).
RECALL_CURVE_OPTIONAL = {"lr": LEARNING_RATE}
SWEPT = ("lr",)  # one value or a list of them
# The accuracy attention must reach on MQAR and copying at their shortest length before the
# study compares mixers (the GPU parameters' bar; the notebook states its own).
SANITY_BAR = 0.95
PER_TASK = ("steps", "batch_size")
# "first_seed": the sweep's first seed runs every rate; where its best is the lowest or highest
# rate, the sweep widens by one rate beyond it (the sweep's own ratio), at most LR_WIDENINGS
# times; then the other seeds run at the best rate.  Zoology's practice, at a third of the runs.
LR_SEARCHES = ("grid", "first_seed")
LR_WIDENINGS = 2


def _check_recall_curves(value) -> None:
    if value is None:
        return
    if (not isinstance(value, dict) or not set(RECALL_CURVE_KEYS) <= set(value)
            or set(value) - set(RECALL_CURVE_KEYS) - set(RECALL_CURVE_OPTIONAL)):
        raise ParameterError(f"recall_curves must be None or a dict with the keys "
                             f"{sorted(RECALL_CURVE_KEYS)} and optionally "
                             f"{sorted(RECALL_CURVE_OPTIONAL)}, got {value!r}")
    for key, allowed in {**RECALL_CURVE_KEYS, **RECALL_CURVE_OPTIONAL}.items():
        name = f"recall_curves[{key!r}]"
        if key in RECALL_CURVE_LISTS or key in RECALL_CURVE_OPTIONAL:
            if key in value:
                _check_list(name, value[key], allowed)
        else:
            allowed.check(name, value[key])


def parse_part(part) -> tuple | None:
    """``"2/3"`` -> (2, 3); None -> None; ParameterError for anything else (k from 1 to n)."""
    if part is None:
        return None
    try:
        k, n = (int(v) for v in str(part).split("/"))
    except ValueError:
        k = n = 0
    if not isinstance(part, str) or not 1 <= k <= n:
        raise ParameterError(f"part must be None or 'k/n' with 1 <= k <= n, got {part!r}")
    return k, n


def check_parameter_ranges(parameters: dict) -> None:
    """Check every numeric parameter present in ``parameters`` (notebook 05's names) against
    PARAMETER_RANGES, the task options against TASK_OPTION_RANGES; ParameterError names the
    first that is out of range (as ``tasks['mqar']['lengths'][0]``, say)."""
    tasks = parameters.get("tasks")
    if "tasks" in parameters:
        if not isinstance(tasks, dict) or not tasks:
            raise ParameterError(f"tasks must be a non-empty dict of task -> {{'lengths': [...], "
                                 f"options}}, got {tasks!r}")
        for task, spec in tasks.items():
            name = f"tasks[{task!r}]"
            if not isinstance(spec, dict) or "lengths" not in spec:
                raise ParameterError(f"{name} must be a dict with 'lengths', got {spec!r}")
            _check_list(f"{name}['lengths']", spec["lengths"], PARAMETER_RANGES["lengths"])
            for option, value in spec.items():
                if option in TASK_OPTION_RANGES:
                    TASK_OPTION_RANGES[option].check(f"{name}[{option!r}]", value)
    if "seeds" in parameters:
        _check_list("seeds", parameters["seeds"], PARAMETER_RANGES["seeds"])
    for key, allowed in PARAMETER_RANGES.items():
        if key not in parameters or key in ("seeds", "lengths"):
            continue
        value = parameters[key]
        if key in SWEPT and isinstance(value, (list, tuple)):
            _check_list(key, value, allowed)
            continue
        if key == "recall_curves":
            _check_recall_curves(value)
            continue
        if key in PER_TASK and isinstance(value, dict):
            missing = set(tasks or ()) - set(value)
            if missing:
                raise ParameterError(f"{key} has no value for the tasks {sorted(missing)}, got "
                                     f"{value!r}")
            for task, v in value.items():
                allowed.check(f"{key}[{task!r}]", v)
        else:
            allowed.check(key, value)


# --- the study -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Study:
    """Which runs the study makes: every task of ``tasks`` at each of its lengths, for every mixer
    and seed, with one model configuration (the vocabulary follows the task) and one training
    configuration per task.  ``backend`` is the recurrent mixers' backend, one value for both or a
    dict by mixer.  ``time_budget_s`` bounds the measured training time of the whole study: each
    run may take its share (its steps over the study's), and stops there (recorded)."""
    mixers: tuple = model_.MIXERS
    seeds: tuple = (0, 1, 2)
    tasks: dict = field(default_factory=dict)  # task name -> {"lengths": [...], **options}
    train: dict = field(default_factory=dict)  # task name -> TrainConfig
    width: int = 256
    layers: int = 2
    mlp_expansion: int = 4
    norm: str = "rmsnorm"
    tie_embeddings: bool = True
    backend: object = "auto"
    time_budget_s: float | None = None
    # The learning-rate sweep; empty: each task's TrainConfig.lr alone.
    learning_rates: tuple = ()
    # How the sweep runs (LR_SEARCHES): "grid", every rate for every seed; "first_seed", every
    # rate for the first seed, widened past an edge best, then the other seeds at the best.
    lr_search: str = "grid"
    # How the recurrent mixers sit in their block ("griffin": projections, conv, gate; "bare").
    recurrent_block: str = "griffin"
    attention_heads: object = "standard"
    attention_head_dim: int = 32
    sanity_bar: float = SANITY_BAR
    recall_curves: dict | None = None  # RECALL_CURVE_KEYS; None: no recall curves
    # "k/n": only the k-th of n parts of the runs (every n-th run of the whole study, from the
    # k-th), so that a long study runs as n shorter jobs whose result files merge_parts joins.
    part: str | None = None
    # Steps (after the timing warm-up) of each configuration's speed measurement, made alone on
    # the device before its runs (measure_speed): the speed a study reports.
    speed_steps: int = 20

    def __post_init__(self):
        unknown = set(self.mixers) - set(model_.mixer_names())
        if unknown:
            raise ParameterError(f"study: unknown mixers {sorted(unknown)}; choose from "
                                 f"{list(model_.mixer_names())}")
        unknown = set(self.tasks) - set(TASKS)
        if unknown:
            raise ParameterError(f"study: unknown tasks {sorted(unknown)}; choose from "
                                 f"{list(TASKS)}")
        missing = set(self.tasks) - set(self.train)
        if missing:
            raise ParameterError(f"study: no training configuration for {sorted(missing)}")
        _check_list("study: seeds", self.seeds, PARAMETER_RANGES["seeds"])
        for key in ("width", "layers", "mlp_expansion", "time_budget_s", "sanity_bar",
                    "attention_head_dim", "speed_steps"):
            PARAMETER_RANGES[key].check(f"study: {key}", getattr(self, key))
        if self.learning_rates:
            _check_list("study: learning_rates", list(self.learning_rates),
                        PARAMETER_RANGES["lr"])
        _check_recall_curves(self.recall_curves)
        if self.lr_search not in LR_SEARCHES:
            raise ParameterError(f"study: lr_search must be one of {list(LR_SEARCHES)}, got "
                                 f"{self.lr_search!r}")
        parse_part(self.part)
        for _, _, task, mixer, width, _, _ in self.recall_runs():
            try:
                self.model_config(mixer, task.vocab_size, width)
            except ValueError as exc:
                raise ParameterError(f"study: recall_curves: {exc}") from None
        for name in self.tasks:
            for task in self.task_list(name):  # bad task and model options fail here
                for mixer in self.mixers:
                    try:
                        self.model_config(mixer, task.vocab_size)
                    except ValueError as exc:
                        raise ParameterError(f"study: {exc}") from None

    def task_list(self, name: str) -> list:
        spec = dict(self.tasks[name])
        lengths = spec.pop("lengths")
        return [make_task(name, int(length), **spec) for length in lengths]

    def backend_for(self, mixer: str):
        if isinstance(self.backend, dict):
            return self.backend.get(mixer, "auto")
        return self.backend

    def recall_runs(self) -> list[tuple]:
        """(curve, x, task, mixer, width, lr, seed) of every run of the recall curves: curve
        "pairs" (x the pairs, at the study's width) or "width" (x the width, at fixed_pairs)."""
        spec = self.recall_curves
        if not spec:
            return []
        lrs = (tuple(spec.get("lr") or ()) or tuple(self.learning_rates)
               or (next(iter(self.train.values())).lr if self.train else 1e-3,))

        def task(pairs):
            return MQAR(spec["seq_len"], num_pairs=pairs, vocab_size=spec["vocab_size"])
        points = ([("pairs", p, task(p), self.width) for p in spec["pairs"]]
                  + [("width", w, task(spec["fixed_pairs"]), w) for w in spec["widths"]])
        # One seed, the first, as Zoology's curves: the points' spread shows the trend.
        every = [(curve, x, t, mixer, width, lr, seed) for curve, x, t, width in points
                 for mixer in self.mixers for lr in lrs for seed in self.seeds[:1]]
        return self._in_part("recall", every)

    def _in_part(self, name: str, every: list) -> list:
        if self.part is None:
            return every
        k, n = parse_part(self.part)
        first = self._part_offsets()[name]
        return [run for i, run in enumerate(every) if (first + i) % n == k - 1]

    def _part_offsets(self) -> dict:
        """The index of each task's first run (first_seed: its first group) and the recall
        curves' in the whole study."""
        whole = replace(self, part=None)
        offsets, at = {}, 0
        for name in self.tasks:
            offsets[name] = at
            at += len(whole.groups(name) if self.lr_search == "first_seed"
                      else whole.runs(name))
        offsets["recall"] = at
        return offsets

    def groups(self, name: str) -> list[tuple]:
        """(task, mixer) of every group of task ``name`` whose learning rate is searched
        together; with first_seed a part holds whole groups."""
        every = [(task, mixer) for task in self.task_list(name) for mixer in self.mixers]
        return self._in_part(name, every) if self.lr_search == "first_seed" else every

    def model_config(self, mixer: str, vocab_size: int,
                     width: int | None = None) -> model_.ModelConfig:
        return model_.ModelConfig(
            vocab_size=vocab_size, mixer=mixer, width=width or self.width, layers=self.layers,
            mlp_expansion=self.mlp_expansion, norm=self.norm, tie_embeddings=self.tie_embeddings,
            backend="auto" if mixer == "attention" else self.backend_for(mixer),
            recurrent_block=self.recurrent_block, attention_heads=self.attention_heads,
            attention_head_dim=self.attention_head_dim)

    def lrs(self, name: str) -> tuple:
        """The learning rates task ``name`` is trained at."""
        return tuple(self.learning_rates) or (self.train[name].lr,)

    def runs(self, name: str) -> list[tuple]:
        """(task, mixer, lr, seed) of every run of task ``name`` that is known before it runs:
        with first_seed the first seed's sweep (widenings and the other seeds follow from it),
        with grid every run."""
        if self.lr_search == "first_seed":
            return [(task, mixer, lr, self.seeds[0]) for task, mixer in self.groups(name)
                    for lr in self.lrs(name)]
        every = [(task, mixer, lr, seed) for task in self.task_list(name)
                 for mixer in self.mixers for lr in self.lrs(name) for seed in self.seeds]
        return self._in_part(name, every)

    def planned_runs(self, name: str) -> int:
        """How many runs task ``name`` makes, without widenings of a first_seed sweep."""
        if self.lr_search == "first_seed":
            return len(self.groups(name)) * (len(self.lrs(name)) + len(self.seeds) - 1)
        return len(self.runs(name))

    def total_steps(self) -> int:
        """Training steps of the tasks' runs (first_seed: without widenings)."""
        return sum(self.planned_runs(name) * self.train[name].steps for name in self.tasks)

    def train_config(self, name: str, lr: float | None = None) -> TrainConfig:
        config = self.train[name] if lr is None else replace(self.train[name], lr=float(lr))
        if self.time_budget_s is None:
            return config
        share = self.time_budget_s * config.steps / self.total_steps()
        return replace(config, max_seconds=share)

    def describe(self) -> dict:
        out = {k: getattr(self, k) for k in ("mixers", "seeds", "width", "layers",
                                              "mlp_expansion", "norm", "tie_embeddings",
                                              "time_budget_s", "recurrent_block",
                                              "attention_heads", "attention_head_dim",
                                              "sanity_bar", "recall_curves", "part",
                                              "speed_steps", "lr_search")}
        out["learning_rates"] = [float(v) for v in self.learning_rates]
        out["backend"] = (self.backend if isinstance(self.backend, (str, dict))
                          else repr(self.backend))
        out["tasks"] = {k: dict(v) for k, v in self.tasks.items()}
        out["train"] = {k: asdict(v) for k, v in self.train.items()}
        return out


def study_from_parameters(mixers, seeds, width, layers, mlp_expansion, tasks, steps, batch_size,
                          lr, warmup_steps, eval_batches, timing_warmup_steps=5, log_every=10,
                          time_budget_s=None, backend="auto", norm="rmsnorm",
                          recurrent_block="griffin", attention_heads="standard",
                          attention_head_dim=32, sanity_bar=SANITY_BAR,
                          recall_curves=None, part=None, speed_steps=20,
                          cuda_graph=False, lr_search="grid") -> Study:
    """The study of notebook 05's parameters: ``tasks`` maps a task to its lengths and options,
    ``steps`` and ``batch_size`` map a task to its own (or are one number for all), ``lr`` is
    one learning rate or a list of them (the sweep: see ``lr_search``); ``cuda_graph``: on
    CUDA every training step replays one CUDA graph (TrainConfig.cuda_graph).  Every
    numeric parameter is checked first (check_parameter_ranges): ParameterError names the one
    out of range before anything runs."""
    check_parameter_ranges(dict(
        seeds=seeds, width=width, layers=layers, mlp_expansion=mlp_expansion, tasks=tasks,
        steps=steps, batch_size=batch_size, lr=lr, warmup_steps=warmup_steps,
        eval_batches=eval_batches, timing_warmup_steps=timing_warmup_steps, log_every=log_every,
        time_budget_s=time_budget_s, sanity_bar=sanity_bar,
        attention_head_dim=attention_head_dim, recall_curves=recall_curves,
        speed_steps=speed_steps))
    rates = [float(v) for v in lr] if isinstance(lr, (list, tuple)) else [float(lr)]

    def per_task(value, name):
        return value[name] if isinstance(value, dict) else value
    # Checked above, so int() and float() only turn numpy's numbers into Python's.
    train = {name: TrainConfig(steps=int(per_task(steps, name)),
                               batch_size=int(per_task(batch_size, name)), lr=rates[0],
                               warmup_steps=int(warmup_steps), eval_batches=int(eval_batches),
                               timing_warmup_steps=int(timing_warmup_steps),
                               log_every=int(log_every), cuda_graph=cuda_graph)
             for name in tasks}
    return Study(mixers=tuple(mixers), seeds=tuple(int(s) for s in seeds),
                 tasks={k: dict(v) for k, v in tasks.items()}, train=train, width=int(width),
                 layers=int(layers), mlp_expansion=int(mlp_expansion), norm=norm,
                 backend=backend, time_budget_s=time_budget_s,
                 learning_rates=tuple(rates) if len(rates) > 1 else (),
                 recurrent_block=recurrent_block, attention_heads=attention_heads,
                 attention_head_dim=int(attention_head_dim), sanity_bar=float(sanity_bar),
                 recall_curves=None if recall_curves is None else
                 {k: (list(v) if isinstance(v, (list, tuple)) else int(v))
                  for k, v in recall_curves.items()}, part=part, speed_steps=int(speed_steps),
                 lr_search=lr_search)


def check_parameters(parameters: dict, known=None) -> Study:
    """Check a complete set of notebook 05's parameters (its defaults updated with what
    `make train` passes) before anything runs: names outside ``known`` (when given) are refused,
    every numeric parameter is checked against PARAMETER_RANGES, and the study is built, which
    checks what depends on several (a task's length against its pairs, say).  Returns the
    study; raises ParameterError naming the parameter, its value and its allowed range."""
    if known is not None:
        unknown = sorted(set(parameters) - set(known))
        if unknown:
            raise ParameterError(f"unknown parameters {unknown}; notebook 05 takes "
                                 f"{sorted(known)}")
    check_parameter_ranges(parameters)
    if parameters.get("devices") is not None:
        check_devices(parameters.get("device") or "cpu", parameters.get("processes", 1),
                      parameters["devices"])
    names = inspect.signature(study_from_parameters).parameters
    return study_from_parameters(**{k: v for k, v in parameters.items() if k in names})


def models_for(study: Study, name: str) -> dict:
    """One freshly initialised model per mixer for task ``name``'s vocabulary (for counting)."""
    vocab = study.task_list(name)[0].vocab_size
    return {m: model_.build(study.model_config(m, vocab), seed=0) for m in study.mixers}


def run_one(study: Study, name: str, task, mixer: str, seed: int, device, held_out=None,
            progress=None, lr: float | None = None, width: int | None = None,
            config: TrainConfig | None = None) -> dict:
    """Train and evaluate one model at ``lr`` (None: the task's TrainConfig.lr) and ``width``
    (None: the study's); the run's record for the result document."""
    config = config or study.train_config(name, lr)
    cfg = study.model_config(mixer, task.vocab_size, width)
    model = model_.build(cfg, seed=seed, device=device)
    started = time.perf_counter()
    trained = train(model, task, config, seed, device, progress=progress)
    held_out = held_out if held_out is not None else task.held_out(config.eval_batches,
                                                                   config.batch_size)
    scored = evaluate(model, task, held_out, device)
    return {
        "task": name, "mixer": mixer, "seed": int(seed), "seq_len": task.seq_len,
        "task_options": task_options(task),
        "parameters": model.num_parameters, "parameter_counts": model.parameter_counts(),
        "mixer_parameters": model.parameter_counts()["mixer"],
        "model": cfg.describe(), "backend": model.last_backends,
        "batch_size": config.batch_size, "lr": config.lr, "max_seconds": config.max_seconds,
        "lr_sweep": [float(v) for v in study.lrs(name)],
        **trained,
        "metric": scored["metric"], "value": scored["value"], "eval_loss": scored["loss"],
        "eval_scored_positions": scored["scored"], "chance": task.chance,
        "values_baseline": getattr(task, "values_baseline", None),
        "wall_s": time.perf_counter() - started,
    }


# The yardstick at a CPU's size (yardstick_run): attention, width 64, two layers, MQAR at
# L = 64 with 4 pairs over 16 tokens, 400 steps at lr 1e-3, reaches YARDSTICK_BAR on one CPU
# thread in about 20 s, so that the notebook's CPU defaults show it learning recall.
YARDSTICK = dict(width=64, layers=2, mlp_expansion=2, seq_len=64, num_pairs=4, vocab_size=16,
                 steps=400, batch_size=32, lr=1e-3, warmup_steps=40, attention_head_dim=16)
YARDSTICK_BAR = 0.9


def yardstick_run(device="cpu", progress_log=None) -> dict:
    """One attention run on MQAR at YARDSTICK's settings on ``device``: its record (accuracy in
    ``value``), which sanity(..., bar=YARDSTICK_BAR) passes when the yardstick learns recall."""
    y = YARDSTICK
    study = study_from_parameters(
        ["attention"], [0], y["width"], y["layers"], y["mlp_expansion"],
        {"mqar": {"lengths": [y["seq_len"]], "num_pairs": y["num_pairs"],
                  "vocab_size": y["vocab_size"]}},
        y["steps"], y["batch_size"], y["lr"], y["warmup_steps"], 4, timing_warmup_steps=2,
        log_every=50, attention_head_dim=y["attention_head_dim"])
    (record,) = run_task(study, "mqar", device, progress_log, bar=False)
    return record


def _log_line(path, text: str) -> None:
    if path:
        with open(path, "a") as f:
            f.write(text + "\n")


def measure_speed(study: Study, task, mixer: str, config: TrainConfig, device,
                  width: int | None = None) -> dict:
    """The training speed of ``mixer`` on ``task`` at ``config``'s batch size and ``width``,
    timed alone on ``device``: ``study.speed_steps`` steps after the timing warm-up (a model of
    seed 0, not kept).  The study reports these, not the speed of runs that shared the device."""
    model = model_.build(study.model_config(mixer, task.vocab_size, width), seed=0,
                         device=device)
    return _alone(train(model, task, speed_config(config, study.speed_steps), 0, device))


def _alone(timed: dict) -> dict:
    """The ``solo_*`` fields of a timing (train's) made alone on the device."""
    return {"solo_wall_ms_per_step": timed["wall_ms_per_step"],
            "solo_gpu_ms_per_step": timed["gpu_ms_per_step"],
            "solo_tokens_per_s": timed["tokens_per_s"], "solo_timed_steps": timed["timed_steps"]}


def run_jobs(study: Study, jobs: list, device, progress_log=None, bar=True, pool=None,
             desc: str = "runs", speeds: dict | None = None,
             finished: FinishedRuns | None = None) -> list[dict]:
    """Every one of ``jobs`` (``pool``'s workers at once; None: one after another here), with
    each run's speed alone (``solo_*``; ``solo_train_s``, that speed times the run's steps) and
    ``concurrent_runs`` added to its record: where runs share the pool, each configuration is
    timed alone first (measure_speed); with one worker a run is timed alone already, and its own
    timing is that speed.  A tqdm bar, and a line per finished run in ``progress_log`` when
    given.  The pool records the phase's wall time beside the runs' training time alone
    (RunPool.phases).  ``speeds``: the speeds timed alone so far, by configuration, kept across
    calls (a dict the caller passes again).  ``finished``: the runs finished before a stop,
    taken from there instead of trained again; each run trained here is added to it as it
    finishes."""
    from tqdm import tqdm  # the text bar: tqdm.auto's widget bar needs ipywidgets

    if not jobs:
        return []
    earlier = [finished.get(job) if finished is not None else None for job in jobs]
    todo = [job for job, record in zip(jobs, earlier) if record is None]
    own = pool is None
    pool = RunPool(device) if own else pool
    speeds = {} if speeds is None else speeds

    def key(job):
        return (job.task, job.mixer, job.width, job.config.batch_size)
    shared = pool.workers > 1
    try:
        for job in jobs if shared else ():
            if key(job) not in speeds:
                speeds[key(job)] = measure_speed(study, job.task, job.mixer, job.config,
                                                 pool.devices[0], job.width)
        with tqdm(total=len(jobs), initial=len(jobs) - len(todo), desc=desc, unit="run",
                  disable=not bar, mininterval=1.0) as total:
            def done(job, record):
                if finished is not None:
                    finished.add(job, record)
                total.update()
                flags = " (stopped on time)" if record["stopped_by_time"] else ""
                flags += " (diverged)" if record["diverged"] else ""
                _log_line(progress_log, f"{job.label}: {record['metric']} {record['value']:.4f}, "
                          f"{record['steps_completed']}/{record['steps']} steps, "
                          f"{record['wall_s']:.1f} s{flags}")
            trained, wall = pool.map(study, todo, done) if todo else ([], 0.0)
    finally:
        if own:
            pool.close()
    fresh = iter(trained)
    records = [record if record is not None else next(fresh) for record in earlier]
    for job, record in zip(jobs, records):
        speed = speeds[key(job)] if shared else _alone(record)
        record.update(speed, concurrent_runs=pool.workers,
                      solo_train_s=speed["solo_wall_ms_per_step"] * record["steps_completed"]
                      / 1e3)
    if trained:  # a phase's throughput counts only the runs trained in it
        pool.phases.append({"phase": desc, "runs": len(trained), "workers": pool.workers,
                            "wall_s": wall,
                            "solo_train_s": sum(r["solo_train_s"] for r in trained)})
    return records


def run_task(study: Study, name: str, device, progress_log=None, bar=True,
             pool=None, finished: FinishedRuns | None = None) -> list[dict]:
    """Every run of task ``name`` by run_jobs: with grid, each length, mixer, learning rate and
    seed at once; with first_seed, each group's sweep at the first seed, its widenings
    (widened_rate), then the other seeds at the best rate, each record's ``lr_sweep`` the rates
    its group swept.  ``finished``: as run_jobs."""
    def job(task, mixer, lr, seed):
        return Job(name, task, mixer, seed, lr, study.train_config(name, lr),
                   label=f"{name} L={task.seq_len} {mixer} lr {lr:.2g} seed {seed}")
    if study.lr_search == "grid":
        return run_jobs(study, [job(*run) for run in study.runs(name)], device, progress_log,
                        bar, pool, desc=name, finished=finished)
    speeds, records = {}, []
    swept = {group: list(study.lrs(name)) for group in study.groups(name)}
    todo = study.runs(name)
    for widening in range(LR_WIDENINGS + 1):
        desc = f"{name} sweep" + (f" widened {widening}" if widening else "")
        records += run_jobs(study, [job(*run) for run in todo], device, progress_log, bar, pool,
                            desc=desc, speeds=speeds, finished=finished)
        todo = []
        if widening < LR_WIDENINGS:
            for (task, mixer), rates in swept.items():
                rate = widened_rate(rates, _group_records(records, task, mixer))
                if rate is not None:
                    rates.append(rate)
                    todo.append((task, mixer, rate, study.seeds[0]))
        if not todo:
            break
    best = {group: _best_rate(_group_records(records, *group)) for group in swept}
    records += run_jobs(study, [job(task, mixer, best[(task, mixer)], seed)
                                for (task, mixer) in swept for seed in study.seeds[1:]],
                        device, progress_log, bar, pool, desc=f"{name} seeds", speeds=speeds,
                        finished=finished)
    for record in records:
        group = next(g for g in swept if g[0].seq_len == record["seq_len"]
                     and g[1] == record["mixer"])
        record["lr_sweep"] = sorted(float(v) for v in swept[group])
    return records


def _group_records(records: list[dict], task, mixer: str) -> list[dict]:
    return [r for r in records if r["seq_len"] == task.seq_len and r["mixer"] == mixer]


def _best_rate(records: list[dict]) -> float:
    """The rate of the best finite metric among ``records`` (one run per rate: the first
    seed's), the highest accuracy or the lowest bits per character, the lowest rate among equal
    ones (as learning_rate_choice); the lowest rate when none is finite."""
    finite = sorted((r for r in records if math.isfinite(r["value"])), key=lambda r: r["lr"])
    if not finite:
        return min(r["lr"] for r in records)
    pick = max if records[0]["metric"] == "accuracy" else min
    return pick(finite, key=lambda r: r["value"])["lr"]  # a tie: the lowest rate, as pandas


def edge_beyond(value: dict, best: float, higher_is_better: bool) -> float | None:
    """The end of a sweep (``value``: the metric by rate, two rates or more) where its best
    rate ``best`` sits and strictly beats its neighbour, so a better rate may lie beyond it;
    None when the best is inside or only ties the rate next to it (a saturated or a flat sweep:
    a rate inside does as well)."""
    ordered = sorted(value)
    if len(ordered) < 2 or best not in (ordered[0], ordered[-1]):
        return None
    va = value[best]
    vb = value[ordered[1] if best == ordered[0] else ordered[-2]]
    if not math.isfinite(va):
        return None
    if not math.isfinite(vb) or (va > vb if higher_is_better else va < vb):
        return best
    return None


def widened_rate(rates: list[float], records: list[dict]) -> float | None:
    """The next rate of a first_seed sweep: one step of the sweep's ratio beyond its lowest or
    highest rate where the best run sits there and beats its neighbour (edge_beyond), else
    None."""
    ordered = sorted(rates)
    if len(ordered) < 2:
        return None
    value = dict.fromkeys(ordered, math.nan)
    value.update((r["lr"], r["value"]) for r in records if r["lr"] in value)
    edge = edge_beyond(value, _best_rate(records), records[0]["metric"] == "accuracy")
    if edge is None:
        return None
    if edge == ordered[0]:
        return ordered[0] / (ordered[1] / ordered[0])
    return ordered[-1] * (ordered[-1] / ordered[-2])


def run_recall_curves(study: Study, device, progress_log=None, bar=True,
                      pool=None, finished: FinishedRuns | None = None) -> list[dict]:
    """Every run of the recall curves (Study.recall_runs) by run_jobs, each record with its
    "curve" and "x"; trained like MQAR (its TrainConfig) for the curves' own steps."""
    runs = study.recall_runs()
    if not runs:
        return []
    base = study.train.get("mqar") or next(iter(study.train.values()))
    steps = study.recall_curves["steps"]
    jobs = []
    for curve, x, task, mixer, width, lr, seed in runs:
        config = replace(base, steps=steps, lr=float(lr), max_seconds=None,
                         warmup_steps=min(base.warmup_steps, steps // 10),
                         timing_warmup_steps=min(base.timing_warmup_steps, steps - 1))
        jobs.append(Job("mqar", task, mixer, seed, float(lr), config, width=width,
                        extra=(("curve", curve), ("x", int(x)), ("width", int(width))),
                        label=f"recall curve {curve}={x} {mixer} lr {lr:.2g} seed {seed}"))
    return run_jobs(study, jobs, device, progress_log, bar, pool, desc="recall curves",
                    finished=finished)


def recall_curve_frame(doc):
    """Per curve, x and mixer: the best mean accuracy over the learning rates (mean over
    seeds), the rate, and whether it is at the edge of the sweep."""
    import pandas as pd
    rows = []
    records = doc.get("recall_curves", []) if isinstance(doc, dict) else list(doc)
    if not records:
        return pd.DataFrame(columns=["curve", "x", "mixer", "accuracy", "lr", "at_edge"])
    df = pd.DataFrame([{k: r.get(k) for k in ("curve", "x", "mixer", "lr", "seed", "value")}
                       for r in records])
    df["value"] = pd.to_numeric(df["value"], errors="coerce")
    for (curve, x, mixer), part in df.groupby(["curve", "x", "mixer"], sort=False):
        means = part.groupby("lr")["value"].mean()
        best = means.idxmax() if means.notna().any() else means.index[0]
        rates = sorted(means.index)
        rows.append({"curve": curve, "x": int(x), "mixer": mixer, "accuracy": means[best],
                     "lr": best, "at_edge": len(rates) > 2
                     and edge_beyond(means.to_dict(), best, True) is not None})
    return pd.DataFrame(rows)


# --- the result document -------------------------------------------------------------------------

def environment(device) -> dict:
    """The timing protocol's environment (versions, GPU, driver, commit, date) of the device the
    study trained on, with its dtype: a CPU run on a GPU machine names no GPU."""
    from .. import protocol
    env = protocol.environment(device)
    env["dtype"] = dtype_name(device)
    return env


def result_document(study: Study, records: list[dict], device,
                    recall_curves: list[dict] | None = None, pool: RunPool | None = None) -> dict:
    doc = {"schema_version": schema.SCHEMA_VERSION, "kind": "training",
           "environment": environment(device), "study": study.describe(), "runs": records}
    if pool is not None:
        doc["concurrency"] = pool.describe()
    if recall_curves:
        doc["recall_curves"] = recall_curves
    if "lm" in study.tasks:
        root = next((t.root for t in study.task_list("lm")), None)
        doc["corpus"] = corpus(root)[2]
    return doc


def result_path(slug: str) -> Path:
    """data/training/<slug>.json (samu.paths.training_file)."""
    from ... import paths
    return paths.training_file(slug)


def part_path(slug: str, part: str) -> Path:
    """data/training/<slug>.part-<k>-of-<n>.json: one part's result document."""
    k, n = parse_part(part)
    return result_path(slug).with_name(f"{slug}.part-{k}-of-{n}.json")


def write_part(doc: dict, slug: str) -> Path:
    """A part's document (its study's ``part`` says which), validated and written atomically."""
    return schema.write_json_atomic(part_path(slug, doc["study"]["part"]), doc, kind="training")


def merge_parts(slug: str, part: str) -> dict | None:
    """When every part of ``part``'s study has its file: the documents joined into one (every
    run, in part order; the first part's environment, each part's in ``parts``), written to
    result_path(slug) and returned; None while a part is missing.  Parts of different studies
    are refused."""
    _, n = parse_part(part)
    paths_ = [part_path(slug, f"{k}/{n}") for k in range(1, n + 1)]
    if not all(p.exists() for p in paths_):
        return None
    docs = [schema.read_valid_json(p, "training") for p in paths_]

    def whole(study):
        return {k: v for k, v in study.items() if k != "part"}
    for p, d in zip(paths_[1:], docs[1:]):
        if whole(d["study"]) != whole(docs[0]["study"]):
            raise ValueError(f"{p}: its study differs from that of {paths_[0]}; not merged")
    merged = dict(docs[0])
    merged["study"] = {**whole(docs[0]["study"]), "part": None}
    merged["runs"] = [r for d in docs for r in d["runs"]]
    curves = [r for d in docs for r in d.get("recall_curves", [])]
    if curves:
        merged["recall_curves"] = curves
    merged["parts"] = [{"part": d["study"]["part"], "environment": d["environment"],
                        **({"concurrency": d["concurrency"]} if "concurrency" in d else {})}
                       for d in docs]
    merged.pop("concurrency", None)  # each part's is in "parts"
    write_result(merged, slug)
    return merged


def validate(doc: dict) -> None:
    """Raise jsonschema.ValidationError naming the first problem (non-finite numbers taken as the
    strings they are written as)."""
    schema.validate(schema._finite(doc), "training")


def write_result(doc: dict, slug: str) -> Path:
    """Validated against the "training" schema, then written atomically."""
    return schema.write_json_atomic(result_path(slug), doc, kind="training")


def _runs(doc) -> list[dict]:
    return doc["runs"] if isinstance(doc, dict) else list(doc)


# frame()'s speed columns and the record fields of the speed timed alone that replace them.
SOLO_COLUMNS = {"tokens_per_s": "solo_tokens_per_s", "wall_ms_per_step": "solo_wall_ms_per_step",
                "gpu_ms_per_step": "solo_gpu_ms_per_step", "train_wall_s": "solo_train_s"}


def frame(doc):
    """One row per run (of a document, or of a list of run records): task, mixer, seed, seq_len,
    lr, metric, value, tokens_per_s, parameters, mixer_parameters, ms per step, ..."""
    import pandas as pd
    keys = ("task", "mixer", "seed", "seq_len", "lr", "metric", "value", "chance",
            "values_baseline", "eval_loss", "final_train_loss", "tokens_per_s", "parameters",
            "mixer_parameters", "wall_ms_per_step", "gpu_ms_per_step", "steps", "steps_completed",
            "stopped_by_time", "diverged", "train_wall_s", "wall_s")
    rows = []
    for r in _runs(doc):
        row = {k: r.get(k) for k in keys}
        if row["mixer_parameters"] is None:  # documents of the earlier study
            row["mixer_parameters"] = r.get("parameter_counts", {}).get("mixer")
        # The speed timed alone on the device where the study measured it (runs that shared the
        # device keep theirs as concurrent_*): steps at that speed are the run's training time.
        row["timed_alone"] = "solo_wall_ms_per_step" in r
        if row["timed_alone"]:
            for column, solo in SOLO_COLUMNS.items():
                row[f"concurrent_{column}"] = row[column]
                row[column] = r.get(solo)
        rows.append(row)
    df = pd.DataFrame(rows)
    for column in ("value", "eval_loss", "final_train_loss", "tokens_per_s", "lr",
                   "wall_ms_per_step", "gpu_ms_per_step", "train_wall_s"):
        df[column] = pd.to_numeric(df[column], errors="coerce")  # "nan" strings of a file
    return df


def learning_rate_choice(doc):
    """Per task, length and mixer: the learning rate whose mean metric is best (highest
    accuracy, lowest bits per character) over the seeds that ran at every rate (all of them on
    a grid; the first seed of a first_seed sweep, whose other seeds ran at its best only), the
    rates swept, and ``at_edge``: the best is the lowest or the highest rate of a sweep of three
    or more and beats the rate next to it (edge_beyond), so a better one may lie outside it."""
    import pandas as pd
    df = frame(doc)
    rows = []
    for (task, length, mixer), part in df.groupby(["task", "seq_len", "mixer"], sort=False):
        seeds_per_rate = [set(p["seed"]) for _, p in part.groupby("lr", dropna=False)]
        common = set.intersection(*seeds_per_rate)
        scored = part[part["seed"].isin(common)] if common else part
        means = scored.groupby("lr", dropna=False)["value"].mean()
        finite = means.dropna()
        if len(finite):
            best = finite.idxmax() if part["metric"].iloc[0] == "accuracy" else finite.idxmin()
        else:
            best = means.index[0]
        rates = sorted(means.index)
        rows.append({"task": task, "seq_len": length, "mixer": mixer, "lr": best,
                     "swept": rates,
                     # Of two rates the best is always one end: flagged from three on.
                     "at_edge": len(rates) > 2 and edge_beyond(
                         means.to_dict(), best, part["metric"].iloc[0] == "accuracy") is not None,
                     "mean_by_lr": {float(k): float(v) for k, v in means.items()}})
    return pd.DataFrame(rows)


def best_frame(doc):
    """frame(doc) restricted to the runs at each (task, length, mixer)'s best learning rate."""
    import pandas as pd
    df = frame(doc)
    best = {(r.task, r.seq_len, r.mixer): r.lr for r in learning_rate_choice(doc).itertuples()}
    keep = [(row.lr == best[key]) or (pd.isna(row.lr) and pd.isna(best[key]))
            for row, key in ((row, (row.task, row.seq_len, row.mixer))
                             for row in df.itertuples())]
    return df[keep].reset_index(drop=True)


def summary(doc):
    """Per task, length and mixer (of a document, or of a list of run records), at the best
    learning rate (learning_rate_choice): the metric's mean, standard deviation, minimum and
    maximum over seeds, the rate and whether it is at the edge of the sweep, median tokens per
    second and ms per step (wall; GPU time on CUDA), total and mixer parameters."""
    df = best_frame(doc)
    choice = learning_rate_choice(doc).set_index(["task", "seq_len", "mixer"])["at_edge"]
    grouped = df.groupby(["task", "seq_len", "mixer"], sort=False)
    out = grouped.agg(metric=("metric", "first"), lr=("lr", "first"), seeds=("seed", "count"),
                      mean=("value", "mean"), std=("value", "std"), min=("value", "min"),
                      max=("value", "max"), tokens_per_s=("tokens_per_s", "median"),
                      wall_ms_per_step=("wall_ms_per_step", "median"),
                      gpu_ms_per_step=("gpu_ms_per_step", "median"),
                      parameters=("parameters", "first"),
                      mixer_parameters=("mixer_parameters", "first"),
                      steps_completed=("steps_completed", "min")).reset_index()
    out.insert(5, "lr_at_edge", [bool(choice.loc[(t, l, m)]) for t, l, m in
                                 zip(out["task"], out["seq_len"], out["mixer"])])
    return out


def sanity(doc, bar: float | None = None) -> dict:
    """Whether the yardstick works: attention's mean accuracy (at its best learning rate) on
    MQAR and selective copying at their shortest length against ``bar`` (None: the study's
    sanity_bar, SANITY_BAR for documents without one).  Returns {"bar", "passed", "checks":
    {task: {"seq_len", "accuracy", "passed"}}}; a task without attention runs is not checked."""
    if bar is None:
        bar = doc.get("study", {}).get("sanity_bar", SANITY_BAR) if isinstance(doc, dict) \
            else SANITY_BAR
    checks = {}
    if not _runs(doc):
        return {"bar": float(bar), "passed": True, "checks": checks}
    df = best_frame(doc)
    for task in ("mqar", "copy"):
        part = df[(df["task"] == task) & (df["mixer"] == "attention")]
        if not len(part):
            continue
        shortest = int(part["seq_len"].min())
        accuracy = float(part[part["seq_len"] == shortest]["value"].mean())
        checks[task] = {"seq_len": shortest, "accuracy": accuracy, "passed": accuracy >= bar}
    return {"bar": float(bar), "passed": all(c["passed"] for c in checks.values()),
            "checks": checks}

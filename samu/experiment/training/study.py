"""The study: which runs it makes (``Study``), its parameters and their ranges
(``study_from_parameters``, ``check_parameters``), and every run of a task (``run_task``) or of
the recall curves (``run_recall_curves``), through ``run_jobs``."""
from __future__ import annotations

import inspect
import math
from dataclasses import asdict, dataclass, field, replace

from ... import model as model_
from .curves import check_rates, check_recall_curves, points_in_order
from .loop import TrainConfig
from .parameters import (COUNT, LEARNING_RATE, OFFSET, SECONDS, ParameterError, Range,
                         check_list)
from .pool import RunPool, check_devices
from .results import (SANITY_BAR, UNNAMED_CONFIGURATION, beats, best_rate, edge_beyond,
                      higher_is_better, parse_part)
from .resume import FinishedRuns
from .runs import (Job, alone, fastest_attention_kernel, measure_speed, on_attention_kernel,
                   run_job)
from .tasks import MQAR, make_task, task_spec

# The numeric parameters of a study (notebook 05's, so `make train`'s), and what each may be.
# "seeds" is a list of them, "tasks" maps a task to its "lengths" (a list of COUNT) and options
# (its TaskSpec's); "steps", "batch_size", "schedule" (loop.SCHEDULES), "plateau_from" (a
# "wsd" schedule's: TrainConfig.plateau_from) and "stop_loss" (TrainConfig's: a solved run
# stops) are one value or a dict by task; "lr" one rate, a list (the sweep), or a dict of
# either by mixer.
PARAMETER_RANGES = {
    "seeds": OFFSET,
    "width": COUNT,
    "layers": COUNT,
    "mlp_expansion": COUNT,
    "lengths": COUNT,
    "steps": COUNT,
    "batch_size": COUNT,
    "lr": LEARNING_RATE,
    "warmup_steps": OFFSET,
    "eval_batches": COUNT,
    "timing_warmup_steps": OFFSET,
    "log_every": COUNT,
    "time_budget_s": SECONDS,  # checked where it is used: Study
    "cpu_threads": Range(integer=True, low=0, optional=True),  # 0 or None: torch's default
    "sanity_bar": Range(low=0, high=1),
    "attention_head_dim": COUNT,
    "recall_curves": COUNT,  # None, or a dict that curves.check_recall_curves checks
    "speed_steps": COUNT,  # steps timed alone per configuration (measure_speed)
    "processes": COUNT,  # runs at once on each device (RunPool)
    "plateau_from": Range(integer=True, low=0, optional=True),
    "stop_loss": Range(low=0, low_open=True, optional=True),
}
PER_TASK = ("steps", "batch_size", "schedule", "plateau_from", "stop_loss")
CHECKED_BY_THE_STUDY = ("time_budget_s",)
# "first_seed": the sweep's first seed runs every rate; where its best is the lowest or highest
# rate, the sweep widens by one rate beyond it (the sweep's own ratio), at most LR_WIDENINGS
# times; then the other seeds run at the best rate.  Zoology's practice, at a third of the runs.
LR_SEARCHES = ("grid", "first_seed")
LR_WIDENINGS = 2
# How attention's scaled_dot_product_attention picks its kernel: torch's own choice, or the
# fastest of those that run, timed on the device before the runs (loop.fastest_attention_kernel).
ATTENTION_KERNELS = ("default", "fastest")


def check_parameter_ranges(parameters: dict) -> None:
    """Check every numeric parameter present in ``parameters`` (a study's names) against
    PARAMETER_RANGES, the task options against their TaskSpec's; ParameterError names the first
    that is out of range (as ``tasks['mqar']['lengths'][0]``, say).  ``time_budget_s`` is left
    to the Study, which checks it."""
    tasks = parameters.get("tasks")
    if "tasks" in parameters:
        if not isinstance(tasks, dict):
            raise ParameterError(f"tasks must be a dict of task -> {{'lengths': [...], "
                                 f"options}}, got {tasks!r}")
        for task, spec in tasks.items():
            name = f"tasks[{task!r}]"
            options = task_spec(task).options
            if not isinstance(spec, dict) or "lengths" not in spec:
                raise ParameterError(f"{name} must be a dict with 'lengths', got {spec!r}")
            check_list(f"{name}['lengths']", spec["lengths"], PARAMETER_RANGES["lengths"])
            for option, value in spec.items():
                if option in options:
                    options[option].check(f"{name}[{option!r}]", value)
    if "seeds" in parameters:
        check_list("seeds", parameters["seeds"], PARAMETER_RANGES["seeds"])
    for key, allowed in PARAMETER_RANGES.items():
        if key not in parameters or key in ("seeds", "lengths", *CHECKED_BY_THE_STUDY):
            continue
        value = parameters[key]
        if key == "lr":
            check_rates(key, value)
        elif key == "recall_curves":
            check_recall_curves(value)
        else:
            for label, v in _by_task(key, value, tasks):
                allowed.check(label, v)
    if "schedule" in parameters:  # a dict names every task; TrainConfig checks each value
        _by_task("schedule", parameters["schedule"], tasks)


def _by_task(key: str, value, tasks) -> list[tuple]:
    """(label, value) of a parameter of PER_TASK: [(key, value)] for one value for every task,
    [(key[task], its value)] for a dict by task, which must name every task of ``tasks``."""
    if key not in PER_TASK or not isinstance(value, dict):
        return [(key, value)]
    missing = set(tasks or ()) - set(value)
    if missing:
        raise ParameterError(f"{key} has no value for the tasks {sorted(missing)}, got "
                             f"{value!r}")
    return [(f"{key}[{task!r}]", v) for task, v in value.items()]


def _rate_tuple(value) -> tuple:
    return tuple(float(v) for v in value) if isinstance(value, (list, tuple)) else (float(value),)


# --- the study -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Study:
    """Which runs the study makes: every task of ``tasks`` at each of its lengths, for every mixer
    and seed, with one model configuration (the vocabulary follows the task) and one training
    configuration per task; and, with ``recall_curves``, Zoology's recall curves.  ``backend``
    is the recurrent mixers' backend, one value for all or a dict by mixer.  ``time_budget_s``
    bounds the measured training time of the tasks' runs: each run may take its share (its steps
    over the study's), and stops there (recorded)."""
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
    # The learning-rate sweep: a tuple of rates for every mixer, or a dict of tuples by mixer;
    # empty: each task's TrainConfig.lr alone.
    learning_rates: object = ()
    # How the sweep runs (LR_SEARCHES): "grid", every rate for every seed; "first_seed", every
    # rate for the first seed, widened past an edge best, then the other seeds at the best.
    lr_search: str = "grid"
    # How the recurrent mixers sit in their block ("griffin": projections, conv, gate; "bare").
    recurrent_block: str = "griffin"
    attention_heads: object = "standard"
    attention_head_dim: int = 32
    attention_kernel: str = "default"  # ATTENTION_KERNELS
    sanity_bar: float = SANITY_BAR
    recall_curves: dict | None = None  # curves.RECALL_CURVE_KEYS; None: no recall curves
    # The recall curves' training configuration (their own steps and batch size); None: the
    # MQAR task's (else the first task's) with the curves' steps.
    recall_train: TrainConfig | None = None
    # "k/n": only the k-th of n parts of the runs (every n-th run of the whole study, from the
    # k-th), so that a long study runs as n shorter jobs whose result files merge_parts joins.
    part: str | None = None
    # Steps (after the timing warm-up) of each configuration's speed measurement, made alone on
    # the device before its runs (measure_speed): the speed a study reports.
    speed_steps: int = 20
    # The name of the configuration this study is (configs.CONFIGURATIONS), which names its
    # files; None: the unnamed one's.
    configuration: str | None = None

    def __post_init__(self):
        unknown = set(self.mixers) - set(model_.mixer_names())
        if unknown:
            raise ParameterError(f"study: unknown mixers {sorted(unknown)}; choose from "
                                 f"{list(model_.mixer_names())}")
        for name in self.tasks:
            task_spec(name)
        missing = set(self.tasks) - set(self.train)
        if missing:
            raise ParameterError(f"study: no training configuration for {sorted(missing)}")
        check_list("study: seeds", self.seeds, PARAMETER_RANGES["seeds"])
        for key in ("width", "layers", "mlp_expansion", "time_budget_s", "sanity_bar",
                    "attention_head_dim", "speed_steps"):
            PARAMETER_RANGES[key].check(f"study: {key}" if key not in CHECKED_BY_THE_STUDY
                                        else key, getattr(self, key))
        self._check_rates("study: learning_rates", self.learning_rates, allow_empty=True)
        check_recall_curves(self.recall_curves)
        if self.recall_curves and "lr" in self.recall_curves:
            self._check_rates("recall_curves['lr']", self.recall_curves["lr"])
        if self.recall_curves and self.recall_train is None and not self.train:
            raise ParameterError("study: recall_curves need a training configuration "
                                 "(recall_train, or a task's)")
        if self.lr_search not in LR_SEARCHES:
            raise ParameterError(f"study: lr_search must be one of {list(LR_SEARCHES)}, got "
                                 f"{self.lr_search!r}")
        if self.attention_kernel not in ATTENTION_KERNELS:
            raise ParameterError(f"study: attention_kernel must be one of "
                                 f"{list(ATTENTION_KERNELS)}, got {self.attention_kernel!r}")
        parsed = parse_part(self.part)
        if parsed is not None and parsed[1] > self.part_units():
            # Some part would hold no runs, and the merge would wait for it forever.
            raise ParameterError(
                f"study: part {self.part}: the study's runs split into at most "
                f"{self.part_units()} parts (its rate sweeps stay whole), not {parsed[1]}")
        if self.recall_curves:
            for length, pairs in points_in_order(self.recall_curves):
                try:
                    task = MQAR(length, num_pairs=pairs,
                                vocab_size=self.recall_curves["vocab_size"])
                    for mixer, width in self.recall_groups(every=True):
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

    def _check_rates(self, name: str, value, allow_empty: bool = False) -> None:
        """Rates for every mixer: a tuple of rates, or a dict of them by mixer that names each
        mixer of the study (and no other)."""
        if allow_empty and isinstance(value, (list, tuple)) and not value:
            return
        check_rates(name, value)
        if isinstance(value, dict) and set(value) != set(self.mixers):
            raise ParameterError(f"{name} by mixer must name every mixer of the study "
                                 f"({sorted(self.mixers)}) and no other, got {sorted(value)}")

    def task_list(self, name: str) -> list:
        spec = dict(self.tasks[name])
        lengths = spec.pop("lengths")
        return [make_task(name, int(length), **spec) for length in lengths]

    def backend_for(self, mixer: str):
        if isinstance(self.backend, dict):
            return self.backend.get(mixer, "auto")
        return self.backend

    def model_config(self, mixer: str, vocab_size: int,
                     width: int | None = None) -> model_.ModelConfig:
        return model_.ModelConfig(
            vocab_size=vocab_size, mixer=mixer, width=width or self.width, layers=self.layers,
            mlp_expansion=self.mlp_expansion, norm=self.norm, tie_embeddings=self.tie_embeddings,
            backend="auto" if mixer == "attention" else self.backend_for(mixer),
            recurrent_block=self.recurrent_block, attention_heads=self.attention_heads,
            attention_head_dim=self.attention_head_dim)

    def job(self, name: str, task, mixer: str, lr: float, seed: int, config: TrainConfig,
            width: int | None = None, extra: tuple = (), label: str = "") -> Job:
        return Job(name, task, mixer, int(seed), float(lr), config,
                   self.model_config(mixer, task.vocab_size, width), extra=extra,
                   label=label or f"{name} L={task.seq_len} {mixer} lr {lr:.2g} seed {seed}")

    # --- the tasks' runs

    def lrs(self, name: str, mixer: str) -> tuple:
        """The learning rates ``mixer`` is trained at on task ``name``."""
        rates = self.learning_rates
        if isinstance(rates, dict):
            return _rate_tuple(rates[mixer])
        return tuple(float(v) for v in rates) or (self.train[name].lr,)

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

    def part_units(self) -> int:
        """How many units the parts split the study into (``_in_part``): its sweeps where a
        sweep stays whole, else its runs; a part beyond them would hold none."""
        whole = replace(self, part=None)
        recall = (whole.recall_groups(every=True) if whole.recall_search() == "first_point"
                  else whole.recall_jobs(every=True))
        return whole._part_offsets()["recall"] + len(recall)

    def groups(self, name: str) -> list[tuple]:
        """(task, mixer) of every group of task ``name`` whose learning rate is searched
        together; with first_seed a part holds whole groups."""
        every = [(task, mixer) for task in self.task_list(name) for mixer in self.mixers]
        return self._in_part(name, every) if self.lr_search == "first_seed" else every

    def runs(self, name: str) -> list[tuple]:
        """(task, mixer, lr, seed) of every run of task ``name`` that is known before it runs:
        with first_seed the first seed's sweep (widenings and the other seeds follow from it),
        with grid every run."""
        if self.lr_search == "first_seed":
            return [(task, mixer, lr, self.seeds[0]) for task, mixer in self.groups(name)
                    for lr in self.lrs(name, mixer)]
        every = [(task, mixer, lr, seed) for task in self.task_list(name)
                 for mixer in self.mixers for lr in self.lrs(name, mixer) for seed in self.seeds]
        return self._in_part(name, every)

    def planned_runs(self, name: str) -> int:
        """How many runs task ``name`` makes, without widenings of a first_seed sweep."""
        if self.lr_search == "first_seed":
            return sum(len(self.lrs(name, mixer)) + len(self.seeds) - 1
                       for _, mixer in self.groups(name))
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

    # --- the recall curves' runs

    def recall_lrs(self, mixer: str) -> tuple:
        """The rates the recall curves train ``mixer`` at: the curves' own "lr", else the
        study's sweep, else their training configuration's rate."""
        spec = self.recall_curves or {}
        if "lr" in spec:
            rates = spec["lr"]
            return _rate_tuple(rates[mixer] if isinstance(rates, dict) else rates)
        rates = self.learning_rates
        if isinstance(rates, dict):
            return _rate_tuple(rates[mixer])
        return tuple(float(v) for v in rates) or (self.recall_config().lr,)

    def recall_config(self, lr: float | None = None) -> TrainConfig:
        """The recall curves' TrainConfig at rate ``lr``: their own steps, batch size, early
        stop and schedule, no time cap."""
        spec = self.recall_curves
        base = self.recall_train or self.train.get("mqar") or next(iter(self.train.values()))
        steps = spec["steps"]
        return replace(base, steps=steps, batch_size=spec.get("batch_size", base.batch_size),
                       lr=float(base.lr if lr is None else lr), max_seconds=None,
                       stop_loss=spec.get("stop_loss"),
                       schedule=spec.get("schedule", base.schedule),
                       plateau_from=spec.get("plateau_from"),
                       warmup_steps=min(base.warmup_steps, steps // 10),
                       timing_warmup_steps=min(base.timing_warmup_steps, steps - 1))

    def recall_search(self) -> str:
        return (self.recall_curves or {}).get("lr_search", "every_point")

    def recall_groups(self, every: bool = False) -> list[tuple]:
        """(mixer, width) of every group of the recall curves whose rate is searched together
        (this part's; ``every``: the whole study's); with "first_point" a part holds whole
        groups."""
        spec = self.recall_curves
        if not spec:
            return []
        groups = [(mixer, width) for width in sorted(spec["widths"]) for mixer in self.mixers]
        if every or self.recall_search() != "first_point":
            return groups
        return self._in_part("recall", groups)

    def recall_job(self, point: tuple, mixer: str, width: int, lr: float) -> Job:
        length, pairs = point
        task = MQAR(length, num_pairs=pairs, vocab_size=self.recall_curves["vocab_size"])
        return self.job("mqar", task, mixer, lr, self.seeds[0], self.recall_config(lr),
                        width=width, extra=(("pairs", pairs), ("width", width)),
                        label=f"recall L={length} pairs={pairs} width={width} {mixer} "
                              f"lr {lr:.2g} seed {self.seeds[0]}")

    def recall_jobs(self, every: bool = False) -> list[Job]:
        """The Job of every run of the recall curves known before they run (this part's;
        ``every``: the whole study's), the first seed, as Zoology's curves: with "every_point"
        each (seq_len, pairs) point, fewest pairs first, at each width, for each mixer at each
        of its rates (recall_lrs); with "first_point" the first point's sweep of each group
        (its widenings and the other points follow from it)."""
        spec = self.recall_curves
        if not spec:
            return []
        points = points_in_order(spec)
        if self.recall_search() == "first_point":
            return [self.recall_job(points[0], mixer, width, lr)
                    for mixer, width in self.recall_groups(every) for lr in self.recall_lrs(mixer)]
        jobs = [self.recall_job(point, mixer, width, lr) for point in points
                for mixer, width in self.recall_groups(every) for lr in self.recall_lrs(mixer)]
        return jobs if every else self._in_part("recall", jobs)

    def planned_recall_runs(self) -> int:
        """How many runs the recall curves make (this part's), without widenings or refinements."""
        if self.recall_search() != "first_point":
            return len(self.recall_jobs())
        points = len(points_in_order(self.recall_curves))
        return sum(len(self.recall_lrs(mixer)) + points - 1 for mixer, _ in self.recall_groups())

    def describe(self) -> dict:
        out = {k: getattr(self, k) for k in ("mixers", "seeds", "width", "layers",
                                              "mlp_expansion", "norm", "tie_embeddings",
                                              "time_budget_s", "recurrent_block",
                                              "attention_heads", "attention_head_dim",
                                              "attention_kernel", "sanity_bar",
                                              "recall_curves", "part", "speed_steps",
                                              "lr_search", "configuration")}
        rates = self.learning_rates
        out["learning_rates"] = ({m: list(_rate_tuple(v)) for m, v in rates.items()}
                                 if isinstance(rates, dict) else [float(v) for v in rates])
        out["backend"] = (self.backend if isinstance(self.backend, (str, dict))
                          else repr(self.backend))
        out["tasks"] = {k: dict(v) for k, v in self.tasks.items()}
        out["train"] = {k: asdict(v) for k, v in self.train.items()}
        if self.recall_curves:
            out["recall_train"] = asdict(self.recall_config())
        return out


def _plain(value):
    """numpy's numbers as Python's, in nested lists and dicts (the parameters are checked)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    return int(value) if float(value).is_integer() and not isinstance(value, float) \
        else float(value)


def study_from_parameters(mixers, seeds, width, layers, mlp_expansion, tasks, steps, batch_size,
                          lr, warmup_steps, eval_batches, timing_warmup_steps=5, log_every=10,
                          time_budget_s=None, backend="auto", norm="rmsnorm",
                          recurrent_block="griffin", attention_heads="standard",
                          attention_head_dim=32, sanity_bar=SANITY_BAR,
                          recall_curves=None, part=None, speed_steps=20,
                          cuda_graph=False, lr_search="grid", attention_kernel="default",
                          configuration=None, schedule="cosine", plateau_from=None,
                          stop_loss=None) -> Study:
    """The study of notebook 05's parameters: ``tasks`` maps a task to its lengths and options,
    ``steps``, ``batch_size``, ``schedule``, ``plateau_from`` and ``stop_loss`` (TrainConfig's)
    map a task to its own (or are one value for all; the recall curves take theirs from
    ``recall_curves``),
    ``lr`` is one learning rate, a list of them (the sweep: see ``lr_search``) or a dict of
    either by mixer; ``cuda_graph``: on CUDA every training step replays one CUDA graph
    (TrainConfig.cuda_graph).  Every numeric parameter is checked first
    (check_parameter_ranges): ParameterError names the one out of range before anything
    runs.  ``mixers=None``: every mixer a model can hold (samu.model.mixer_names())."""
    if mixers is None:
        mixers = model_.mixer_names()
    check_parameter_ranges(dict(
        seeds=seeds, width=width, layers=layers, mlp_expansion=mlp_expansion, tasks=tasks,
        steps=steps, batch_size=batch_size, lr=lr, warmup_steps=warmup_steps,
        eval_batches=eval_batches, timing_warmup_steps=timing_warmup_steps, log_every=log_every,
        sanity_bar=sanity_bar, attention_head_dim=attention_head_dim,
        recall_curves=recall_curves, speed_steps=speed_steps, schedule=schedule,
        plateau_from=plateau_from, stop_loss=stop_loss))
    if isinstance(lr, dict):
        rates = {m: _rate_tuple(v) for m, v in lr.items()}
        first = next(iter(rates.values()))[0]
    else:
        rates = _rate_tuple(lr)
        first = rates[0]
        rates = rates if len(rates) > 1 else ()

    def per_task(value, name):
        return value[name] if isinstance(value, dict) else value

    def config(steps_, batch_, schedule_="cosine", plateau_=None, stop_=None):
        # Checked above, so int() only turns numpy's numbers into Python's.
        return TrainConfig(steps=int(steps_), batch_size=int(batch_), lr=first,
                           warmup_steps=int(warmup_steps), eval_batches=int(eval_batches),
                           timing_warmup_steps=int(timing_warmup_steps),
                           log_every=int(log_every), cuda_graph=cuda_graph,
                           schedule=schedule_,
                           plateau_from=None if plateau_ is None else int(plateau_),
                           stop_loss=None if stop_ is None else float(stop_))

    def task_config(name):
        try:
            return config(per_task(steps, name), per_task(batch_size, name),
                          per_task(schedule, name), per_task(plateau_from, name),
                          per_task(stop_loss, name))
        except ParameterError as exc:  # the schedule, and what depends on several values
            raise ParameterError(f"task {name!r}: {exc}") from None
    train = {name: task_config(name) for name in tasks}
    recall_train = None
    if recall_curves is not None:
        recall_curves = _plain(recall_curves)
        recall_steps = recall_curves["steps"]
        recall_train = config(recall_steps, recall_curves.get(
            "batch_size", per_task(batch_size, "mqar") if not isinstance(batch_size, dict)
            or "mqar" in batch_size else 64))
        recall_train = replace(recall_train, warmup_steps=min(int(warmup_steps),
                                                              recall_steps // 10),
                               timing_warmup_steps=min(int(timing_warmup_steps),
                                                       recall_steps - 1))
    return Study(mixers=tuple(mixers), seeds=tuple(int(s) for s in seeds),
                 tasks={k: dict(v) for k, v in tasks.items()}, train=train, width=int(width),
                 layers=int(layers), mlp_expansion=int(mlp_expansion), norm=norm,
                 backend=backend, time_budget_s=time_budget_s, learning_rates=rates,
                 recurrent_block=recurrent_block, attention_heads=attention_heads,
                 attention_head_dim=int(attention_head_dim), sanity_bar=float(sanity_bar),
                 recall_curves=recall_curves, recall_train=recall_train, part=part,
                 speed_steps=int(speed_steps), lr_search=lr_search,
                 attention_kernel=attention_kernel, configuration=configuration)


def check_parameters(parameters: dict, known=None) -> Study:
    """Check a complete set of a study's parameters (notebook 05's names) before anything runs:
    names outside ``known`` (when given) are refused, every numeric parameter is checked against
    PARAMETER_RANGES, and the study is built, which checks what depends on several (a task's
    length against its pairs, say) and the time budget.  Returns the study; raises
    ParameterError naming the parameter, its value and its allowed range."""
    if known is not None:
        unknown = sorted(set(parameters) - set(known))
        if unknown:
            raise ParameterError(f"unknown parameters {unknown}; a study takes {sorted(known)}")
    check_parameter_ranges(parameters)
    if parameters.get("devices") is not None:
        check_devices(parameters.get("device"), parameters.get("processes", 1),
                      parameters["devices"])
    names = inspect.signature(study_from_parameters).parameters
    return study_from_parameters(**{k: v for k, v in parameters.items() if k in names})


def models_for(study: Study, name: str) -> dict:
    """One freshly initialised model per mixer for task ``name``'s vocabulary (for counting)."""
    vocab = study.task_list(name)[0].vocab_size
    return {m: model_.build(study.model_config(m, vocab), seed=0) for m in study.mixers}


def run_one(study: Study, name: str, task, mixer: str, seed: int, device, lr: float | None = None,
            width: int | None = None, config: TrainConfig | None = None) -> dict:
    """Train and evaluate one model at ``lr`` (None: the task's TrainConfig.lr) and ``width``
    (None: the study's); the run's record for the result document."""
    config = config or study.train_config(name, lr)
    return run_job(study.job(name, task, mixer, config.lr, seed, config, width), device)


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
        log_every=50, attention_head_dim=y["attention_head_dim"], configuration="yardstick")
    (record,) = run_task(study, "mqar", device, progress_log, bar=False)
    return record


def log_line(path, text: str) -> None:
    """``text`` as a line of the progress log ``path`` (None: nowhere)."""
    if path:
        with open(path, "a") as f:
            f.write(text + "\n")


def _with_kernels(study: Study, jobs: list, device, kernels: dict) -> list:
    """``jobs`` with attention's scaled_dot_product_attention kernel chosen (attention_kernel
    "fastest": the fastest that runs, timed once per configuration and kept in ``kernels``)."""
    if study.attention_kernel != "fastest":
        return jobs
    out = []
    for job in jobs:
        if job.mixer != "attention":
            out.append(job)
            continue
        key = (job.task, job.width, job.config.batch_size)
        if key not in kernels:
            kernels[key] = fastest_attention_kernel(job.model, job.task, job.config, device)
        out.append(on_attention_kernel(job, kernels[key]))
    return out


def time_side_by_side(study: Study, records: list[dict], device, steps: int) -> list[dict]:
    """Every (task, length, mixer) configuration of ``study`` timed alone on ``device`` for
    ``steps`` steps, one after another: a merged study's parts ran in separate commands, often
    one mixer each, so their own timings compare machines as much as mixers.  Attention uses
    the kernel its runs in ``records`` used (else the fastest, as they would); the rate does
    not change a step's time."""
    used = {(r["task"], r["seq_len"]): r["attention_kernel"] for r in records
            if r["mixer"] == "attention" and r.get("attention_kernel")}
    study = replace(study, part=None, time_budget_s=None)  # a step's time, not a run's share
    rows, kernels = [], {}
    for name in study.tasks:
        for task in study.task_list(name):
            for mixer in study.mixers:
                config = study.train_config(name)
                job = study.job(name, task, mixer, config.lr, study.seeds[0], config)
                if mixer == "attention" and (name, task.seq_len) in used:
                    job = replace(job, config=replace(
                        config, attention_kernel=used[(name, task.seq_len)]))
                else:
                    (job,) = _with_kernels(study, [job], device, kernels)
                timed = measure_speed(job, device, steps)
                rows.append({"task": name, "seq_len": task.seq_len, "mixer": mixer,
                             "wall_ms_per_step": timed["solo_wall_ms_per_step"],
                             "gpu_ms_per_step": timed["solo_gpu_ms_per_step"],
                             "tokens_per_s": timed["solo_tokens_per_s"],
                             "timed_steps": timed["solo_timed_steps"]})
    return rows


def run_jobs(study: Study, jobs: list, device, progress_log=None, bar=True, pool=None,
             desc: str = "runs", speeds: dict | None = None,
             finished: FinishedRuns | None = None, kernels: dict | None = None) -> list[dict]:
    """Every one of ``jobs`` (``pool``'s workers at once; None: one after another here), with
    each run's speed alone (``solo_*``; ``solo_train_s``, that speed times the run's steps) and
    ``concurrent_runs`` added to its record: where runs share the pool, each configuration is
    timed alone first (measure_speed); with one worker a run is timed alone already, and its own
    timing is that speed.  A tqdm bar, and a line per finished run in ``progress_log`` when
    given.  The pool records the phase's wall time beside the runs' training time alone
    (RunPool.phases).  ``speeds`` and ``kernels``: the speeds timed alone and the attention
    kernels chosen so far, by configuration, kept across calls (dicts the caller passes again).
    ``finished``: the runs finished before a stop, taken from there instead of trained again;
    each run trained here is added to it as it finishes."""
    from tqdm import tqdm  # the text bar: tqdm.auto's widget bar needs ipywidgets

    if not jobs:
        return []
    own = pool is None
    pool = RunPool(device) if own else pool
    speeds = {} if speeds is None else speeds
    kernels = {} if kernels is None else kernels

    def key(job):
        return (job.task, job.mixer, job.width, job.config.batch_size)
    shared = pool.workers > 1
    try:
        jobs = _with_kernels(study, jobs, pool.devices[0], kernels)
        if finished is not None:
            jobs = [replace(job, checkpoint=finished.checkpoint(job)) for job in jobs]
        earlier = [finished.get(job) if finished is not None else None for job in jobs]
        todo = [job for job, record in zip(jobs, earlier) if record is None]
        for job in jobs if shared else ():
            if key(job) not in speeds:
                speeds[key(job)] = measure_speed(job, pool.devices[0], study.speed_steps)
        with tqdm(total=len(jobs), initial=len(jobs) - len(todo), desc=desc, unit="run",
                  disable=not bar, mininterval=1.0) as total:
            def done(job, record):
                if finished is not None:
                    finished.add(job, record)
                total.update()
                flags = " (stopped on time)" if record["stopped_by_time"] else ""
                flags += " (solved: stopped early)" if record.get("stopped_early") else ""
                flags += " (diverged)" if record["diverged"] else ""
                flags += "".join(f" (resumed at step {step})"
                                 for step in record.get("resumed_at", ()))
                log_line(progress_log, f"{study.configuration or UNNAMED_CONFIGURATION} "
                         f"{job.label}: {record['metric']} "
                         f"{record['value']:.4f}, {record['steps_completed']}/{record['steps']} "
                         f"steps, {record['wall_s']:.1f} s{flags}")
            trained, wall = pool.map(todo, done) if todo else ([], 0.0)
    finally:
        if own:
            pool.close()
    fresh = iter(trained)
    records = [record if record is not None else next(fresh) for record in earlier]
    for job, record in zip(jobs, records):
        speed = speeds[key(job)] if shared else alone(record)
        record.update(speed, concurrent_runs=pool.workers,
                      solo_train_s=speed["solo_wall_ms_per_step"] * record["steps_completed"]
                      / 1e3)
    if trained:  # a phase's throughput counts only the runs, and steps, trained in it
        pool.phases.append({"phase": desc, "runs": len(trained), "workers": pool.workers,
                            "wall_s": wall,
                            "solo_train_s": sum(r["solo_train_s"] * _share_trained_here(r)
                                                for r in trained)})
    return records


def _share_trained_here(record: dict) -> float:
    """The share of a run's steps trained since its last resume (all of them: none)."""
    resumed = record.get("resumed_at") or [0]
    return (record["steps_completed"] - resumed[-1]) / record["steps_completed"]


def _group_records(records: list[dict], task, mixer: str) -> list[dict]:
    return [r for r in records if r["seq_len"] == task.seq_len and r["mixer"] == mixer]


def _value_by_rate(ordered: list[float], records: list[dict]) -> dict:
    """The metric of each of the sweep's rates (NaN where no record has it)."""
    value = dict.fromkeys(ordered, float("nan"))
    value.update((r["lr"], r["value"]) for r in records if r["lr"] in value)
    return value


def widened_rate(rates: list[float], records: list[dict]) -> float | None:
    """The next rate of a first_seed sweep: one step of the sweep's ratio beyond its lowest or
    highest rate where the best run sits there and beats its neighbour (edge_beyond), else
    None."""
    ordered = sorted(rates)
    if len(ordered) < 2:
        return None
    value = _value_by_rate(ordered, records)
    edge = edge_beyond(value, best_rate(records), higher_is_better(records[0]["metric"]))
    if edge is None:
        return None
    if edge == ordered[0]:
        return ordered[0] / (ordered[1] / ordered[0])
    return ordered[-1] * (ordered[-1] / ordered[-2])


def refined_rates(rates: list[float], records: list[dict]) -> list[float]:
    """The rates one round of refinement adds to a sweep: the geometric midpoint (to three
    figures) between its best rate (best_rate) and each neighbouring rate that the best
    strictly beats; none where the best is not finite, or where a midpoint rounds onto a rate
    already swept."""
    ordered = sorted(rates)
    if len(ordered) < 2 or not records:
        return []
    value = _value_by_rate(ordered, records)
    best = best_rate(records)
    if best not in value or not math.isfinite(value[best]):
        return []
    higher = higher_is_better(records[0]["metric"])
    out = []
    i = ordered.index(best)
    for j in (i - 1, i + 1):
        if not 0 <= j < len(ordered):
            continue
        if not beats(value[best], value[ordered[j]], higher):
            continue  # a tie: a flat or saturated stretch, where a rate between does as well
        mid = float(f"{math.sqrt(best * ordered[j]):.3g}")
        if all(not math.isclose(mid, r, rel_tol=1e-9) for r in ordered):
            out.append(mid)
    return out


def search_rates(swept: dict, first_jobs: list, job_of, records_of, run,
                 refine: int = 0) -> list[dict]:
    """A sweep searched at its first seed or point: ``first_jobs`` (every group's rates), then
    each group (``swept``: group -> its rates, extended in place) widened past an edge best
    (widened_rate, at most LR_WIDENINGS rounds), then ``refine`` rounds of refined_rates.
    ``job_of(group, rate)``: the job of a new rate; ``records_of(records, group)``: a group's
    records; ``run(jobs, round_name)``: their records ("", "widened k", "refined k")."""
    records = run(first_jobs, "")

    def widened(rates, records):
        rate = widened_rate(rates, records)
        return [] if rate is None else [rate]
    rounds = [("widened", widened)] * LR_WIDENINGS + [("refined", refined_rates)] * refine
    rounds_run = {}
    for kind, new_rates in rounds:
        todo = []
        for group, rates in swept.items():
            for rate in new_rates(rates, records_of(records, group)):
                rates.append(rate)
                todo.append(job_of(group, rate))
        if not todo:
            if kind == "widened":
                continue  # no edge best: the refinements may still add rates
            break
        rounds_run[kind] = rounds_run.get(kind, 0) + 1
        records += run(todo, f"{kind} {rounds_run[kind]}")
    return records


def run_task(study: Study, name: str, device, progress_log=None, bar=True,
             pool=None, finished: FinishedRuns | None = None) -> list[dict]:
    """Every run of task ``name`` by run_jobs: with grid, each length, mixer, learning rate and
    seed at once; with first_seed, each group's sweep at the first seed, its widenings
    (widened_rate), then the other seeds at the best rate, each record's ``lr_sweep`` the rates
    its group swept.  ``finished``: as run_jobs."""
    def job(task, mixer, lr, seed):
        return study.job(name, task, mixer, lr, seed, study.train_config(name, lr))
    speeds, kernels = {}, {}
    if study.lr_search == "grid":
        records = run_jobs(study, [job(*run) for run in study.runs(name)], device, progress_log,
                           bar, pool, desc=name, finished=finished, kernels=kernels)
        for record in records:
            record["lr_sweep"] = list(study.lrs(name, record["mixer"]))
        return records
    swept = {(task, mixer): list(study.lrs(name, mixer)) for task, mixer in study.groups(name)}
    records = search_rates(
        swept, [job(*run) for run in study.runs(name)],
        lambda group, rate: job(*group, rate, study.seeds[0]),
        lambda records, group: _group_records(records, *group),
        lambda jobs, round_name: run_jobs(
            study, jobs, device, progress_log, bar, pool,
            desc=f"{name} sweep {round_name}".rstrip(), speeds=speeds, finished=finished,
            kernels=kernels))
    best = {group: best_rate(_group_records(records, *group)) for group in swept}
    records += run_jobs(study, [job(task, mixer, best[(task, mixer)], seed)
                                for (task, mixer) in swept for seed in study.seeds[1:]],
                        device, progress_log, bar, pool, desc=f"{name} seeds", speeds=speeds,
                        finished=finished, kernels=kernels)
    for record in records:
        group = next(g for g in swept if g[0].seq_len == record["seq_len"]
                     and g[1] == record["mixer"])
        record["lr_sweep"] = sorted(float(v) for v in swept[group])
    return records


def run_recall_curves(study: Study, device, progress_log=None, bar=True,
                      pool=None, finished: FinishedRuns | None = None) -> list[dict]:
    """Every run of the recall curves by run_jobs, each record with its ``pairs`` and ``width``
    and the rates its (mixer, width) swept (``lr_sweep``): with "every_point" every job of
    Study.recall_jobs; with "first_point" each group's sweep at the first point, widened past an
    edge best (widened_rate, at most LR_WIDENINGS times), refined "lr_refine" times
    (refined_rates), then the other points at its best."""
    if study.recall_search() != "first_point":
        records = run_jobs(study, study.recall_jobs(), device, progress_log, bar, pool,
                           desc="recall curves", finished=finished)
        for record in records:
            record["lr_sweep"] = list(study.recall_lrs(record["mixer"]))
        return records
    points = points_in_order(study.recall_curves) if study.recall_curves else []
    swept = {group: list(study.recall_lrs(group[0])) for group in study.recall_groups()}
    speeds, kernels = {}, {}

    def mine(records, group):
        return [r for r in records if (r["mixer"], r["width"]) == group]
    records = search_rates(
        swept, study.recall_jobs(), lambda group, rate: study.recall_job(points[0], *group, rate),
        mine, lambda jobs, round_name: run_jobs(
            study, jobs, device, progress_log, bar, pool,
            desc=f"recall sweep {round_name}".rstrip(), speeds=speeds, finished=finished,
            kernels=kernels),
        refine=study.recall_curves.get("lr_refine", 0))
    best = {group: best_rate(mine(records, group)) for group in swept}
    records += run_jobs(study, [study.recall_job(point, *group, best[group])
                                for point in points[1:] for group in swept],
                        device, progress_log, bar, pool, desc="recall points", speeds=speeds,
                        finished=finished, kernels=kernels)
    for record in records:
        record["lr_sweep"] = sorted(float(v) for v in swept[(record["mixer"], record["width"])])
    return records

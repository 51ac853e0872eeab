"""One training run: ``Job`` (its task, model, training configuration and seed) and
``run_job`` (the model built, trained and evaluated: the run's record); ``measure_speed`` times a
job's configuration alone on a device."""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass, replace

from ... import model as model_
from .checkpoint import RunCheckpoint
from .loop import ATTENTION_KERNEL_NAMES, TrainConfig, attention_kernel, evaluate, train
from .tasks import task_options


@dataclass(frozen=True)
class Job:
    """One training run: ``task`` (a task object of task ``name``) learned by a model of
    ``model`` (a samu.model.ModelConfig around ``mixer``) from ``seed`` under ``config`` (a
    TrainConfig at rate ``lr``); ``extra``: (key, value) pairs its record gets beside them;
    ``label``: how the progress log names it; ``checkpoint``: the file that keeps its state
    while it trains (a RunCheckpoint's), so that it goes on from there after a stop (None:
    none)."""
    name: str
    task: object
    mixer: str
    seed: int
    lr: float
    config: TrainConfig
    model: model_.ModelConfig
    extra: tuple = ()
    label: str = ""
    checkpoint: str | None = None

    @property
    def width(self) -> int:
        return self.model.width


def run_key(job: Job) -> str:
    """What names a run within one study: its label (which rounds the rate), exact rate and
    seed, steps, batch size and width."""
    return (f"{job.name}: {job.label} | lr {float(job.lr)!r} seed {job.seed} | steps "
            f"{job.config.steps} | batch {job.config.batch_size} | width {job.width}")


@functools.lru_cache(maxsize=8)
def _held_out(task, batches: int, batch_size: int):
    return task.held_out(batches, batch_size)


def held_out(task, config: TrainConfig):
    """The task's held-out batches at ``config``'s sizes, drawn once per process (the last few
    tasks' kept)."""
    return _held_out(task, config.eval_batches, config.batch_size)


def on_attention_kernel(job: Job, name: str) -> Job:
    """``job`` with attention on scaled_dot_product_attention kernel ``name``
    (ATTENTION_KERNEL_NAMES), which its record names (``attention_kernel``)."""
    extra = tuple(item for item in job.extra if item[0] != "attention_kernel")
    return replace(job, config=replace(job.config, attention_kernel=name),
                   extra=(*extra, ("attention_kernel", name)))


def run_job(job: Job, device, progress=None) -> dict:
    """Train and evaluate ``job``'s model on ``device``: the run's record for the result
    document (``progress(step, loss)`` after every step); with ``job.checkpoint`` it goes on
    from the state saved there, on the attention kernel it started on, and ``wall_s`` counts
    the training before a stop up to its last save."""
    checkpoint = (RunCheckpoint(job.checkpoint, run_key(job)) if job.checkpoint is not None
                  else None)
    saved = checkpoint.load() if checkpoint is not None else None
    if (saved is not None and saved["attention_kernel"] != job.config.attention_kernel
            and saved["attention_kernel"] in ATTENTION_KERNEL_NAMES):
        # the kernel it started on, where timing the kernels again chose another
        job = on_attention_kernel(job, saved["attention_kernel"])
    model = model_.build(job.model, seed=job.seed, device=device)
    started = time.perf_counter()
    trained = train(model, job.task, job.config, job.seed, device, progress=progress,
                    checkpoint=checkpoint)
    trained_here = time.perf_counter() - started
    with attention_kernel(job.config.attention_kernel):
        scored = evaluate(model, job.task, held_out(job.task, job.config), device)
    counts = model.parameter_counts()
    return {
        "task": job.name, "mixer": job.mixer, "seed": int(job.seed),
        "seq_len": job.task.seq_len, "task_options": task_options(job.task),
        "parameters": model.num_parameters, "parameter_counts": counts,
        "mixer_parameters": counts["mixer"], "model": job.model.describe(),
        "backend": model.last_backends, "batch_size": job.config.batch_size,
        "lr": job.config.lr, "max_seconds": job.config.max_seconds,
        **trained,
        "metric": scored["metric"], "value": scored["value"], "eval_loss": scored["loss"],
        "eval_scored_positions": scored["scored"], "chance": job.task.chance,
        "values_baseline": getattr(job.task, "values_baseline", None),
        "yardstick_bar": getattr(job.task, "yardstick_bar", None),
        # this process's set-up, training and evaluation, and the training before a stop
        "wall_s": time.perf_counter() - started - trained_here + trained["train_wall_s"],
        **dict(job.extra),
    }


def speed_config(config: TrainConfig, steps: int) -> TrainConfig:
    """``config`` cut to its timing warm-up and ``steps`` timed steps, no time cap and no early
    stop; a "wsd" schedule is timed as a cosine one (a rate a step either way), as its decay
    could not fit after the warm-up in so few steps."""
    total = config.timing_warmup_steps + steps
    schedule = "cosine" if config.schedule == "wsd" else config.schedule
    return replace(config, steps=total, max_seconds=None, stop_loss=None, log_every=total,
                   warmup_steps=min(config.warmup_steps, total), schedule=schedule,
                   plateau_from=None)


def measure_speed(job: Job, device, steps: int) -> dict:
    """The training speed of ``job``'s configuration timed alone on ``device``: ``steps`` steps
    after the timing warm-up (a model of seed 0, not kept), as the ``solo_*`` fields of a
    record."""
    model = model_.build(job.model, seed=0, device=device)
    return alone(train(model, job.task, speed_config(job.config, steps), 0, device))


def alone(timed: dict) -> dict:
    """The ``solo_*`` fields of a timing (train's) made alone on the device."""
    return {"solo_wall_ms_per_step": timed["wall_ms_per_step"],
            "solo_gpu_ms_per_step": timed["gpu_ms_per_step"],
            "solo_tokens_per_s": timed["tokens_per_s"], "solo_timed_steps": timed["timed_steps"]}


def fastest_attention_kernel(model: model_.ModelConfig, task, config: TrainConfig, device,
                             steps: int = 5) -> str:
    """The name (ATTENTION_KERNEL_NAMES) of the scaled_dot_product_attention kernel that trains
    an attention model of ``model`` on ``task`` at ``config``'s batch fastest on ``device``:
    each kernel that runs there is timed alone for ``steps`` steps after the timing warm-up (GPU
    time on CUDA, wall time elsewhere); one that cannot run this shape is passed over.  The
    steps run eagerly, so that a kernel that cannot run fails on its first call rather than
    inside a CUDA graph's capture."""
    times = {}
    for name in ATTENTION_KERNEL_NAMES:
        trial = replace(config, attention_kernel=name, cuda_graph=False)
        try:
            timed = measure_speed(Job("", task, model.mixer, 0, config.lr, trial, model),
                                  device, steps)
        except RuntimeError:  # "No available kernel": not this shape, dtype or device
            continue
        ms = timed["solo_gpu_ms_per_step"]
        times[name] = ms if ms is not None else timed["solo_wall_ms_per_step"]
    if not times:
        raise RuntimeError(f"no scaled_dot_product_attention kernel runs {model} on {device}")
    return min(times, key=times.get)

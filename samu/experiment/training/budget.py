"""How long a study takes on a GPU, estimated before it runs from the step times a committed
study measured there (``data/training/<gpu>.json``) and each step's FLOP and byte counts.

A training step of these models costs (wall time, each configuration timed alone):

    t = fixed + per_element * E + matmul_flops / MATMUL_RATE + attention_flops / ATTENTION_RATE

E is the residual stream's elements a step (tokens x width x layers): the element-wise work
(norms, residual adds, activations, casts, the recurrence and its block) and the launches of a
step's many small kernels scale with it.  The matmul FLOPs (6 per parameter of a linear layer
and of the head per token) and the attention core's (7 L x heads x head_dim per token and
layer, causal, forward and backward as flash attention computes them) are taken at fixed
fractions of the GPU's dense BF16 rate.  ``fixed`` and ``per_element`` are fitted per mixer, by
least squares, to the committed step times after their FLOP terms are taken off.  A run adds a
fixed set-up (model, CUDA graph capture, evaluation): the committed runs' median of their wall
time beyond their steps.  The committed runs span widths 64-512 at L = 256-512; far beyond
them the estimate is an extrapolation, which the first part of a study, timing its own steps
alone, checks."""
from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass, replace

from ... import model as model_
from .curves import points_in_order

# The H200's dense BF16 tensor-core rate, and the fractions of it reached by the linear layers
# (large matmuls) and by flash attention's causal forward and backward.
DENSE_BF16_FLOPS = 989e12
MATMUL_EFFICIENCY = 0.6
ATTENTION_EFFICIENCY = 0.35
MATMUL_RATE = DENSE_BF16_FLOPS * MATMUL_EFFICIENCY
ATTENTION_RATE = DENSE_BF16_FLOPS * ATTENTION_EFFICIENCY
# Flash attention's forward and backward over a causal sequence: 2 L^2 d forward (QK^T and PV,
# half the square each), 5 L^2 d backward (QK^T recomputed, dV, dP, dQ, dK): 7 L d per token.
ATTENTION_FLOPS_PER_TOKEN_AND_CHANNEL = 7


@dataclass(frozen=True)
class StepCost:
    """One step's work: ``elements`` of the residual stream (tokens x width x layers),
    ``matmul_flops`` and ``attention_flops``."""
    elements: float
    matmul_flops: float
    attention_flops: float


@functools.lru_cache(maxsize=64)
def linear_parameters(config: model_.ModelConfig) -> int:
    """The parameters that multiply every token a step: every weight of two or more dimensions
    but the embedding (a lookup), with the head counted once more where it is tied to it."""
    model = model_.build(config, seed=0)
    counted = sum(p.numel() for name, p in model.named_parameters()
                  if p.dim() >= 2 and not name.startswith("embedding"))
    return counted + config.vocab_size * config.width  # the head: tied or not, a matmul


def step_cost(config: model_.ModelConfig, seq_len: int, batch: int) -> StepCost:
    tokens = seq_len * batch
    attention = 0.0
    if config.mixer == "attention":
        channels = config.resolved_attention_heads * config.attention_head_dim
        attention = (ATTENTION_FLOPS_PER_TOKEN_AND_CHANNEL * seq_len * channels * tokens
                     * config.layers)
    return StepCost(elements=tokens * config.width * config.layers,
                    matmul_flops=6.0 * linear_parameters(config) * tokens,
                    attention_flops=attention)


def flop_ms(cost: StepCost) -> float:
    return 1e3 * (cost.matmul_flops / MATMUL_RATE + cost.attention_flops / ATTENTION_RATE)


@dataclass(frozen=True)
class StepModel:
    """A mixer's fitted step time: ``fixed_ms + per_element_ns * E / 1e6 + flop_ms``."""
    fixed_ms: float
    per_element_ns: float
    points: int

    def ms(self, cost: StepCost) -> float:
        return self.fixed_ms + self.per_element_ns * cost.elements / 1e6 + flop_ms(cost)


def _records(doc: dict) -> list[dict]:
    return [r for r in doc["runs"] + doc.get("recall_curves", [])
            if isinstance(r.get("solo_wall_ms_per_step"), (int, float))
            and math.isfinite(r["solo_wall_ms_per_step"])]


def _config_of(record: dict) -> model_.ModelConfig:
    fields = dict(record["model"])  # ModelConfig.describe(): the head counts resolved
    known = model_.ModelConfig.__dataclass_fields__
    return model_.ModelConfig(**{k: v for k, v in fields.items() if k in known})


def fit_step_models(doc: dict) -> dict[str, StepModel]:
    """Per mixer of a committed training document: the StepModel fitted to its runs' step times
    timed alone (wall), one point per configuration (median over its runs)."""
    points: dict[tuple, list] = {}
    for r in _records(doc):
        config = _config_of(r)
        key = (r["mixer"], r["seq_len"], r["batch_size"], config)
        points.setdefault(key, []).append(r["solo_wall_ms_per_step"])
    by_mixer: dict[str, list] = {}
    for (mixer, length, batch, config), times in points.items():
        cost = step_cost(config, length, batch)
        by_mixer.setdefault(mixer, []).append((cost.elements / 1e6,
                                               statistics.median(times) - flop_ms(cost)))
    out = {}
    for mixer, xy in by_mixer.items():
        n = len(xy)
        mx = sum(x for x, _ in xy) / n
        my = sum(y for _, y in xy) / n
        sxx = sum((x - mx) ** 2 for x, _ in xy)
        slope = sum((x - mx) * (y - my) for x, y in xy) / sxx if sxx > 0 else 0.0
        out[mixer] = StepModel(fixed_ms=my - slope * mx, per_element_ns=slope, points=n)
    return out


def run_overhead_s(doc: dict) -> float:
    """A run's wall time beyond its steps (model set-up, CUDA graph capture, evaluation): the
    median over the committed runs that trained one at a time, in one go (a resumed run's
    wall time misses what it trained after its last save)."""
    extra = [r["wall_s"] - r["steps_completed"] * r["solo_wall_ms_per_step"] / 1e3
             for r in _records(doc) if r.get("concurrent_runs", 1) == 1 and "wall_s" in r
             and not r.get("resumed_at")]
    return statistics.median(extra)


def estimate(study, doc: dict) -> dict:
    """The device time of ``study`` (a Study; its part only, when it has one) on the GPU of
    ``doc`` (a committed training document): {"runs", "seconds", "step_ms": {(task, seq_len,
    mixer, width): ms}, "per_run_overhead_s"}.  Every planned run takes all its steps
    (a sweep's widenings and early stops left out; a recall sweep's refinements counted at
    their most, a rate either side of the best each round), one at a time."""
    models = fit_step_models(doc)
    overhead = run_overhead_s(doc)
    step_ms, seconds, runs = {}, 0.0, 0

    def add(name, task, mixer, width, steps, batch, count):
        nonlocal seconds, runs
        config = study.model_config(mixer, task.vocab_size, width)
        ms = models[mixer].ms(step_cost(config, task.seq_len, batch))
        step_ms[(name, task.seq_len, mixer, config.width)] = ms
        seconds += count * (steps * ms / 1e3 + overhead)
        runs += count
    for name in study.tasks:
        config = study.train[name]
        if study.lr_search == "first_seed":
            for task, mixer in study.groups(name):
                add(name, task, mixer, None, config.steps, config.batch_size,
                    len(study.lrs(name, mixer)) + len(study.seeds) - 1)
        else:
            for task, mixer, _, _ in study.runs(name):
                add(name, task, mixer, None, config.steps, config.batch_size, 1)
    if study.recall_curves:
        config = study.recall_config()
        count = {}
        for job in study.recall_jobs():
            count[(job.task, job.mixer, job.width)] = count.get(
                (job.task, job.mixer, job.width), 0) + 1
        if study.recall_search() == "first_point":  # the other points, at the best rate
            first, *points = points_in_order(study.recall_curves)
            refine = study.recall_curves.get("lr_refine", 0)
            for mixer, width in study.recall_groups():
                # each round of refinement: at most a rate on either side of the best
                if len(study.recall_lrs(mixer)) > 1:
                    task = study.recall_job(first, mixer, width, config.lr).task
                    count[(task, mixer, width)] += 2 * refine
                for length, pairs in points:
                    job = study.recall_job((length, pairs), mixer, width, config.lr)
                    count[(job.task, mixer, width)] = 1
        for (task, mixer, width), n in count.items():
            add("recall", task, mixer, width, config.steps, config.batch_size, n)
    return {"runs": runs, "seconds": seconds, "step_ms": step_ms,
            "per_run_overhead_s": overhead}


def committed_document(slug: str = "nvidia-h200") -> dict:
    """The committed training study whose step times the estimates start from."""
    from ... import paths
    from .. import schema
    return schema.read_valid_json(paths.REPO_ROOT / "data" / "training" / f"{slug}.json",
                                  "training")


def estimate_lines(study, config_parts: int, doc: dict, measure_on=None,
                   steps: int = 20) -> list[str]:
    """What `make train --estimate` prints for ``study`` (a GPU study of ``config_parts``
    parts): its device time on the GPU of ``doc`` (a committed training document), in all and
    per part; with ``measure_on`` (a CUDA device) each of its configurations' step first timed
    alone there for ``steps`` steps, beside the estimate."""
    from .runs import measure_speed
    whole = estimate(study, doc)
    lines = [f"{study.configuration}: {whole['runs']} runs (not counting the rates a sweep adds "
             f"past an edge best, nor early stops), about {whole['seconds']:.0f} s on the "
             f"{doc['environment']['gpu']}"]
    for k in range(1, config_parts + 1):
        part = estimate(replace(study, part=f"{k}/{config_parts}"), doc)
        lines.append(f"  PART={k}: {part['runs']} runs, about {part['seconds']:.0f} s")
    if measure_on is None:
        return lines
    jobs = {}
    for name in study.tasks:
        for task in study.task_list(name):
            for mixer in study.mixers:
                jobs[(name, task.seq_len, mixer, study.width)] = study.job(
                    name, task, mixer, study.lrs(name, mixer)[0], 0, study.train_config(name))
    for job in study.recall_jobs(every=True):
        jobs.setdefault(("recall", job.task.seq_len, job.mixer, job.width), job)
    for key, job in jobs.items():
        timed = measure_speed(job, measure_on, steps)
        gpu = timed["solo_gpu_ms_per_step"]
        lines.append(f"  {key}: {timed['solo_wall_ms_per_step']:.2f} ms a step (wall, alone"
                     + (f"; GPU {gpu:.2f} ms" if gpu is not None else "")
                     + f"), estimated {whole['step_ms'][key]:.2f} ms")
    return lines

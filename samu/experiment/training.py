"""The training study (SPEC section 9): what each mixer learns on recall, selective copying and a
character-level language model, beside its training speed.

Three tasks, all generated on the fly from fixed seeds (nothing is downloaded):

- ``MQAR``, multi-query associative recall (Zoology): key-value pairs, then every key queried
  once among noise tokens; loss and accuracy only where the answer is due.
- ``SelectiveCopy``: data tokens scattered among noise tokens, then a separator and one marker per
  data token; at the markers the model must give the data tokens in order.
- ``CharLM``: bytes of the Python standard library's own ``*.py`` files (present wherever Python
  is), split by file into training and validation; bits per character on validation.

``run_task`` trains one ``samu.model.SequenceModel`` per (task, sequence length, mixer, seed),
``result_document`` gathers the runs with the environment into a ``"training"`` document (schema
``samu.experiment.schema.SCHEMAS["training"]``), ``write_result`` writes it to
``data/training/<gpu-slug>.json`` and ``draw_figures`` the figures to
``data/figures/<gpu-slug>_training_*.png``.  Notebook 05 runs the study; ``make train``
(``python -m samu.experiment.training``) runs notebook 05 with ``GPU_PARAMETERS`` on a CUDA device,
after ``check_parameters`` has checked every parameter against its range (``PARAMETER_RANGES``).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import inspect
import math
import numbers
import os
import platform
import statistics
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import model as model_
from . import schema

TASKS = ("mqar", "copy", "lm")
TASK_NAMES = {"mqar": "associative recall (MQAR)", "copy": "selective copying",
              "lm": "character LM (stdlib source)"}
MIXER_NAMES = {"attention": "attention", "rglru": "RG-LRU", "samu": "SAMU"}
METRICS = {"mqar": "accuracy", "copy": "accuracy", "lm": "bits_per_char"}
IGNORE = -100  # targets that carry no loss
# The held-out examples of the synthetic tasks come from this seed, whatever the training seed:
# every mixer and seed is scored on the same examples.
EVAL_SEED = 2_147_483_647


def _generator(seed: int, device="cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(int(seed))


def _distinct(rows: int, population: int, count: int, generator,
              log_weights: torch.Tensor | None = None) -> torch.Tensor:
    """[rows, count] distinct integers from range(population) per row, in random order, on the
    generator's device: a uniformly random subset, or with ``log_weights`` (unnormalised
    log-probabilities over the population) one drawn without replacement in proportion to them
    (the top ``count`` of log-weights plus Gumbel noise)."""
    u = torch.rand(rows, population, generator=generator, device=generator.device)
    if log_weights is None:
        return u.topk(count, dim=1).indices
    gumbel = -torch.log(-torch.log(u.clamp(1e-12, 1 - 1e-7)))
    return (log_weights.to(u.device) + gumbel).topk(count, dim=1).indices


# --- parameter checks ----------------------------------------------------------------------------

class ParameterError(ValueError):
    """A parameter of the training study of the wrong type or outside its range; the message
    names the parameter, its value and what it may be."""


@dataclass(frozen=True)
class Range:
    """What a numeric parameter may be: an integer or a finite real (a bool is neither), at least
    (or above, ``low_open``) ``low`` and at most (or below, ``high_open``) ``high``, or None
    where ``optional``."""
    integer: bool = False
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    optional: bool = False

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a finite number"
        if self.low is not None and self.high is not None:
            text = (f"{kind} in {'(' if self.low_open else '['}{self.low}, {self.high}"
                    f"{')' if self.high_open else ']'}")
        elif self.low is not None:
            text = f"{kind} {'>' if self.low_open else '>='} {self.low}"
        elif self.high is not None:
            text = f"{kind} {'<' if self.high_open else '<='} {self.high}"
        else:
            text = kind
        return text + (", or None" if self.optional else "")

    def admits(self, value) -> bool:
        if value is None:
            return self.optional
        if isinstance(value, bool) or not isinstance(
                value, numbers.Integral if self.integer else numbers.Real):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def check(self, name: str, value):
        """``value``, or ParameterError naming ``name``, the value and this range."""
        if not self.admits(value):
            raise ParameterError(f"{name} must be {self.describe()}, got {value!r}")
        return value


COUNT = Range(integer=True, low=1)  # sizes, lengths, step counts
OFFSET = Range(integer=True, low=0)  # warm-up steps, seeds
SECONDS = Range(low=0, low_open=True, optional=True)  # a time budget; None: none
# The options of each task (the classes below check them too).
TASK_OPTION_RANGES = {"num_pairs": COUNT, "vocab_size": COUNT, "num_tokens": COUNT,
                      "data_vocab": COUNT, "noise_vocab": COUNT,
                      "power_a": Range(low=0, high=1, low_open=True, optional=True)}
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
    "lr": Range(low=0, low_open=True),
    "warmup_steps": OFFSET,
    "eval_batches": COUNT,
    "timing_warmup_steps": OFFSET,
    "log_every": COUNT,
    "time_budget_s": SECONDS,
    "cpu_threads": Range(integer=True, low=0, optional=True),  # 0 or None: torch's default
}
PER_TASK = ("steps", "batch_size")


def _check_int(owner: str, name: str, value, minimum: int = 1) -> None:
    Range(integer=True, low=minimum).check(f"{owner}: {name}", value)


def _check_list(name: str, value, item: Range) -> None:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value:
        raise ParameterError(f"{name} must be a non-empty list, each {item.describe()}, got "
                             f"{value!r}")
    for i, v in enumerate(value):
        item.check(f"{name}[{i}]", v)
    if len(set(value)) != len(value):
        raise ParameterError(f"{name} must not repeat a value, got {value!r}")


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
        if key in PER_TASK and isinstance(value, dict):
            missing = set(tasks or ()) - set(value)
            if missing:
                raise ParameterError(f"{key} has no value for the tasks {sorted(missing)}, got "
                                     f"{value!r}")
            for task, v in value.items():
                allowed.check(f"{key}[{task!r}]", v)
        else:
            allowed.check(key, value)


# --- tasks ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MQAR:
    """Multi-query associative recall, as in Zoology: ``num_pairs`` key-value pairs
    ``k1 v1 k2 v2 ...`` (keys distinct, from 1 .. vocab/2 - 1; values distinct, from
    vocab/2 .. vocab - 1), then every key once more at an even offset of the rest of the sequence,
    whose other positions hold random tokens from the values' range (so a key appears only in its
    pair and its query).  The target at a queried key is its value; every other position is
    ``IGNORE``.  The query slots (offset / 2) are drawn without replacement with probability
    proportional to slot^(power_a - 1), Zoology's power law (0.01, its default): most queries come
    soon after the pairs, a heavy tail reaches the end of the sequence, whatever its length.
    ``power_a=None`` draws them uniformly instead."""
    seq_len: int
    num_pairs: int = 8
    vocab_size: int = 256
    power_a: float | None = 0.01
    name = "mqar"
    metric = "accuracy"

    def __post_init__(self):
        for key in ("seq_len", "num_pairs", "vocab_size"):
            _check_int("mqar", key, getattr(self, key))
        half = self.vocab_size // 2
        if half - 1 < self.num_pairs or self.vocab_size - half < self.num_pairs:
            raise ParameterError(f"mqar: vocab_size {self.vocab_size} holds fewer than "
                                 f"num_pairs {self.num_pairs} distinct keys (1 .. vocab/2 - 1) "
                                 "or values")
        if (self.seq_len - 2 * self.num_pairs) // 2 < self.num_pairs:
            raise ParameterError(f"mqar: seq_len {self.seq_len} is too short for "
                                 f"{self.num_pairs} pairs and their queries (at least "
                                 f"{4 * self.num_pairs})")
        TASK_OPTION_RANGES["power_a"].check("mqar: power_a", self.power_a)

    @property
    def chance(self) -> float:
        return 1.0 / (self.vocab_size - self.vocab_size // 2)

    @property
    def values_baseline(self) -> float:
        """The accuracy of guessing among the values present in the sequence, which a model
        reaches before it binds keys to values: 1 / num_pairs."""
        return 1.0 / self.num_pairs

    def batch(self, batch_size: int, generator: torch.Generator):
        """(inputs, targets), int64 [batch_size, seq_len], on the generator's device."""
        b, p, v, length = batch_size, self.num_pairs, self.vocab_size, self.seq_len
        half = v // 2
        keys = _distinct(b, half - 1, p, generator) + 1
        values = _distinct(b, v - half, p, generator) + half
        inputs = torch.randint(half, v, (b, length), generator=generator, device=generator.device)
        inputs[:, :2 * p] = torch.stack((keys, values), dim=2).reshape(b, 2 * p)
        slots = _distinct(b, (length - 2 * p) // 2, p, generator, self.slot_weights())
        query = 2 * p + 2 * slots  # where key i is queried
        inputs.scatter_(1, query, keys)
        targets = torch.full_like(inputs, IGNORE).scatter_(1, query, values)
        return inputs, targets

    def slot_weights(self) -> torch.Tensor | None:
        """Unnormalised log-probabilities of the query slots (None: uniform)."""
        if self.power_a is None:
            return None
        space = (self.seq_len - 2 * self.num_pairs) // 2
        return (self.power_a - 1) * torch.log(torch.arange(1, space + 1, dtype=torch.float32))

    def held_out(self, batches: int, batch_size: int):
        g = _generator(EVAL_SEED)
        return [self.batch(batch_size, g) for _ in range(batches)]


@dataclass(frozen=True)
class SelectiveCopy:
    """Selective copying: ``num_tokens`` data tokens at sorted random positions of a body of
    ``seq_len - num_tokens - 1`` noise tokens, then the separator, then ``num_tokens`` markers.
    The target at the j-th marker is the j-th data token; every other position is ``IGNORE``.
    Tokens: 0 separator, 1 marker, 2 .. 2 + data_vocab - 1 data, the next ``noise_vocab`` noise."""
    seq_len: int
    num_tokens: int = 8
    data_vocab: int = 16
    noise_vocab: int = 16
    name = "copy"
    metric = "accuracy"
    SEPARATOR = 0
    MARKER = 1

    def __post_init__(self):
        for key in ("seq_len", "num_tokens", "data_vocab", "noise_vocab"):
            _check_int("copy", key, getattr(self, key))
        if self.body < self.num_tokens:
            raise ParameterError(f"copy: seq_len {self.seq_len} is too short for "
                                 f"{self.num_tokens} data tokens (at least "
                                 f"{2 * self.num_tokens + 1})")

    @property
    def body(self) -> int:
        return self.seq_len - self.num_tokens - 1

    @property
    def vocab_size(self) -> int:
        return 2 + self.data_vocab + self.noise_vocab

    @property
    def chance(self) -> float:
        return 1.0 / self.data_vocab

    def batch(self, batch_size: int, generator: torch.Generator):
        b, k = batch_size, self.num_tokens
        device = generator.device
        data = torch.randint(2, 2 + self.data_vocab, (b, k), generator=generator, device=device)
        positions = _distinct(b, self.body, k, generator).sort(dim=1).values
        inputs = torch.randint(2 + self.data_vocab, self.vocab_size, (b, self.seq_len),
                               generator=generator, device=device)
        inputs.scatter_(1, positions, data)
        inputs[:, self.body] = self.SEPARATOR
        inputs[:, self.body + 1:] = self.MARKER
        targets = torch.full_like(inputs, IGNORE)
        targets[:, self.body + 1:] = data
        return inputs, targets

    def held_out(self, batches: int, batch_size: int):
        g = _generator(EVAL_SEED)
        return [self.batch(batch_size, g) for _ in range(batches)]


# --- the standard-library corpus -----------------------------------------------------------------

# A file is in the validation split when the first 8 bytes of SHA-256 of its path relative to the
# standard library, as an integer, are 0 modulo this: about one file in ten, the same files on
# every machine that has them, whatever else the folder holds.
VALIDATION_MODULUS = 10
SKIPPED_FOLDERS = frozenset({"site-packages", "dist-packages", "__pycache__"})
STDLIB_ROOT_LABEL = "stdlib"  # the corpus root recorded for this Python's standard library


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root=None) -> list[str]:
    """The ``*.py`` files under the standard library (installed packages and caches left out),
    as POSIX paths relative to it, sorted."""
    root = Path(root) if root is not None else stdlib_root()
    out = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if SKIPPED_FOLDERS.isdisjoint(rel.parts) and path.is_file():
            out.append(rel.as_posix())
    return sorted(out)


def is_validation_file(rel: str) -> bool:
    digest = hashlib.sha256(rel.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % VALIDATION_MODULUS == 0


@lru_cache(maxsize=4)
def _corpus(root: str):
    files = stdlib_files(root)
    parts = {"train": [], "validation": []}
    names = {"train": [], "validation": []}
    for rel in files:
        split = "validation" if is_validation_file(rel) else "train"
        parts[split].append((Path(root) / rel).read_bytes())
        names[split].append(rel)
    data = {}
    # The standard library is named, not its folder, which differs between machines (the Python
    # version beside it says which one).
    shown = STDLIB_ROOT_LABEL if Path(root) == stdlib_root() else root
    info = {"root": shown, "python": platform.python_version(), "files": len(files),
            "validation_modulus": VALIDATION_MODULUS}
    for split, chunks in parts.items():
        blob = b"".join(chunks)
        data[split] = torch.frombuffer(bytearray(blob), dtype=torch.uint8) if blob else \
            torch.empty(0, dtype=torch.uint8)
        info[f"{split}_files"] = len(names[split])
        info[f"{split}_bytes"] = len(blob)
        info[f"{split}_sha256"] = hashlib.sha256(blob).hexdigest()
    return data, names, info


def corpus(root=None):
    """``(data, names, info)``: data maps "train" and "validation" to uint8 tensors (each split's
    files concatenated in sorted order), names to the files of each split, info describes the
    corpus (its root, STDLIB_ROOT_LABEL for the standard library; Python version, file and byte
    counts, SHA-256 of each split).  Read once per process."""
    return _corpus(str(Path(root) if root is not None else stdlib_root()))


@dataclass(frozen=True)
class CharLM:
    """Next-byte prediction on the standard library's source; every position is scored.
    Training windows start at random offsets of the training split; held-out windows are evenly
    spaced over the validation split (no randomness)."""
    seq_len: int
    root: str | None = None
    name = "lm"
    metric = "bits_per_char"
    vocab_size = 256
    chance = 8.0  # bits per character of a uniform guess over 256 bytes

    def __post_init__(self):
        _check_int("lm", "seq_len", self.seq_len)

    def split(self, name: str, device="cpu") -> torch.Tensor:
        data = _split_on(self.root, name, str(torch.device(device)))
        if data.numel() < self.seq_len + 1:
            raise ValueError(f"lm: the {name} split has {data.numel()} bytes, fewer than "
                             f"seq_len + 1 = {self.seq_len + 1}")
        return data

    def _windows(self, data: torch.Tensor, starts: torch.Tensor):
        idx = starts[:, None] + torch.arange(self.seq_len + 1, device=data.device)
        w = data[idx].long()
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()

    def batch(self, batch_size: int, generator: torch.Generator):
        data = self.split("train", generator.device)
        starts = torch.randint(0, data.numel() - self.seq_len, (batch_size,), generator=generator,
                               device=generator.device)
        return self._windows(data, starts)

    def held_out(self, batches: int, batch_size: int):
        data = self.split("validation")
        n = batches * batch_size
        starts = torch.linspace(0, data.numel() - self.seq_len - 1, n).long()
        return [self._windows(data, starts[i * batch_size:(i + 1) * batch_size])
                for i in range(batches)]


@lru_cache(maxsize=4)
def _split_on(root, name: str, device: str) -> torch.Tensor:
    """A split of the corpus on ``device`` (kept there: the training batches are cut on it)."""
    return corpus(root)[0][name].to(device)


def make_task(name: str, seq_len: int, **options):
    """``make_task("mqar", 256, num_pairs=16, vocab_size=1024)``, ``make_task("copy", ...)``,
    ``make_task("lm", 512)``."""
    classes = {"mqar": MQAR, "copy": SelectiveCopy, "lm": CharLM}
    if name not in classes:
        raise ParameterError(f"unknown task {name!r}; choose one of {list(classes)}")
    return classes[name](seq_len, **options)


def task_options(task) -> dict:
    return {k: v for k, v in asdict(task).items() if k not in ("seq_len", "root")}


# --- training ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrainConfig:
    """AdamW (no weight decay on vectors, scalars and the embedding), linear warm-up then cosine
    decay to ``min_lr_ratio * lr`` (or constant), gradient clipping at ``grad_clip``.  Tokens per
    second are measured over the steps after ``timing_warmup_steps`` (compilation and allocator
    warm-up excluded), each step synchronised on CUDA.  ``max_seconds`` stops a run once its
    measured steps took that long (None: never); the run records it."""
    steps: int = 100
    batch_size: int = 16
    lr: float = 3e-3
    schedule: str = "cosine"
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    grad_clip: float = 1.0
    eval_batches: int = 4
    log_every: int = 10
    timing_warmup_steps: int = 5
    max_seconds: float | None = None

    # What each numeric field may be.  max_seconds may be 0 (stop after the first timed step);
    # a study's time budget, which it is a share of, may not.
    RANGES = {"steps": COUNT, "batch_size": COUNT, "lr": PARAMETER_RANGES["lr"],
              "warmup_steps": OFFSET, "min_lr_ratio": Range(low=0, high=1),
              "weight_decay": Range(low=0), "grad_clip": Range(low=0, low_open=True),
              "eval_batches": COUNT, "log_every": COUNT, "timing_warmup_steps": OFFSET,
              "max_seconds": Range(low=0, optional=True)}
    BETA = Range(low=0, high=1, high_open=True)

    def __post_init__(self):
        for key, allowed in self.RANGES.items():
            allowed.check(f"train: {key}", getattr(self, key))
        if (isinstance(self.betas, (str, bytes)) or not isinstance(self.betas, (list, tuple))
                or len(self.betas) != 2):
            raise ParameterError(f"train: betas must be two numbers in [0, 1), got "
                                 f"{self.betas!r}")
        for i, beta in enumerate(self.betas):
            self.BETA.check(f"train: betas[{i}]", beta)
        if self.timing_warmup_steps >= self.steps:
            raise ParameterError(f"train: timing_warmup_steps {self.timing_warmup_steps} leaves "
                                 f"none of {self.steps} steps to time (it must be below steps)")
        if self.schedule not in ("cosine", "constant"):
            raise ParameterError(f"train: schedule must be 'cosine' or 'constant', got "
                                 f"{self.schedule!r}")

    def lr_factor(self, step: int) -> float:
        """The learning rate of step ``step`` (0-based) over ``lr``."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.schedule == "constant":
            return 1.0
        span = max(self.steps - self.warmup_steps, 1)
        progress = min((step - self.warmup_steps) / span, 1.0)
        cosine = 0.5 * (1 + math.cos(math.pi * progress))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * cosine


def optimizer(model, config: TrainConfig, device) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and not name.startswith("embedding") else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    fused = torch.device(device).type == "cuda"
    return torch.optim.AdamW(groups, lr=config.lr, betas=tuple(config.betas), fused=fused)


def autocast(device):
    """BF16 autocast on CUDA (the Triton kernels' policy); FP32 elsewhere."""
    if torch.device(device).type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def dtype_name(device) -> str:
    return "bfloat16" if torch.device(device).type == "cuda" else "float32"


def _synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def loss_of(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean"):
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE,
                           reduction=reduction)


@torch.no_grad()
def evaluate(model, task, batches, device) -> dict:
    """Mean loss over the scored positions of ``batches``, and the task's metric: accuracy
    (argmax equals target) or bits per character (the loss over ln 2)."""
    was_training = model.training
    model.eval()
    total, count, correct = 0.0, 0, 0
    try:
        for inputs, targets in batches:
            inputs, targets = inputs.to(device), targets.to(device)
            with autocast(device):
                logits = model(inputs)
            mask = targets != IGNORE
            total += loss_of(logits, targets, "sum").item()
            count += int(mask.sum().item())
            correct += int((logits.argmax(-1)[mask] == targets[mask]).sum().item())
    finally:
        model.train(was_training)
    loss = total / count
    value = correct / count if task.metric == "accuracy" else loss / math.log(2)
    return {"loss": loss, "metric": task.metric, "value": value, "scored": count}


def train(model, task, config: TrainConfig, seed: int, device, progress=None) -> dict:
    """Train ``model`` on batches of ``task`` drawn on ``device`` from a generator seeded with
    ``seed`` (the same batches for every model on one kind of device).
    ``progress(step, loss)`` is called after every step.  Returns the loss curve (mean training
    loss over each ``log_every`` steps, at the step that ends them), tokens per second, steps
    completed and whether the run stopped on time or diverged."""
    device = torch.device(device)
    generator = _generator(seed, device)
    opt = optimizer(model, config, device)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, config.lr_factor)
    params = [p for p in model.parameters()]
    model.train()
    losses, curve = [], []
    timed_s, timed_tokens, timed_steps = 0.0, 0, 0
    stopped_by_time = diverged = False
    started = time.perf_counter()
    for step in range(config.steps):
        inputs, targets = task.batch(config.batch_size, generator)
        _synchronize(device)
        t0 = time.perf_counter()
        inputs = inputs.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        with autocast(device):
            logits = model(inputs)
        loss = loss_of(logits, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
        opt.step()
        schedule.step()
        value = loss.item()  # synchronises
        elapsed = time.perf_counter() - t0
        if step >= config.timing_warmup_steps:
            timed_s += elapsed
            timed_tokens += inputs.numel()
            timed_steps += 1
        losses.append(value)
        if progress is not None:
            progress(step, value)
        done = step + 1
        if done % config.log_every == 0 or done == config.steps:
            window = losses[-(done - (curve[-1][0] if curve else 0)):]
            curve.append([done, statistics.fmean(window)])
        if not math.isfinite(value):
            diverged = True
            break
        if config.max_seconds is not None and timed_s > config.max_seconds:
            stopped_by_time = done < config.steps
            break
    last = curve[-1][0] if curve else 0
    if last != len(losses):  # a run cut short: its last partial window
        curve.append([len(losses), statistics.fmean(losses[last:])])
    return {
        "loss_curve": curve,
        "final_train_loss": curve[-1][1],
        "steps": config.steps,
        "steps_completed": len(losses),
        "stopped_by_time": stopped_by_time,
        "diverged": diverged,
        "tokens_per_s": timed_tokens / timed_s if timed_s > 0 else math.nan,
        "timed_steps": timed_steps,
        "train_wall_s": time.perf_counter() - started,
    }


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

    def __post_init__(self):
        unknown = set(self.mixers) - set(model_.MIXERS)
        if unknown:
            raise ParameterError(f"study: unknown mixers {sorted(unknown)}; choose from "
                                 f"{list(model_.MIXERS)}")
        unknown = set(self.tasks) - set(TASKS)
        if unknown:
            raise ParameterError(f"study: unknown tasks {sorted(unknown)}; choose from "
                                 f"{list(TASKS)}")
        missing = set(self.tasks) - set(self.train)
        if missing:
            raise ParameterError(f"study: no training configuration for {sorted(missing)}")
        _check_list("study: seeds", self.seeds, PARAMETER_RANGES["seeds"])
        for key in ("width", "layers", "mlp_expansion", "time_budget_s"):
            PARAMETER_RANGES[key].check(f"study: {key}", getattr(self, key))
        for name in self.tasks:
            for task in self.task_list(name):  # bad task options fail here, before any run
                model_.ModelConfig(vocab_size=task.vocab_size, mixer=self.mixers[0],
                                   width=self.width, layers=self.layers)

    def task_list(self, name: str) -> list:
        spec = dict(self.tasks[name])
        lengths = spec.pop("lengths")
        return [make_task(name, int(length), **spec) for length in lengths]

    def backend_for(self, mixer: str):
        if isinstance(self.backend, dict):
            return self.backend.get(mixer, "auto")
        return self.backend

    def model_config(self, mixer: str, vocab_size: int) -> model_.ModelConfig:
        return model_.ModelConfig(
            vocab_size=vocab_size, mixer=mixer, width=self.width, layers=self.layers,
            mlp_expansion=self.mlp_expansion, norm=self.norm, tie_embeddings=self.tie_embeddings,
            backend="auto" if mixer == "attention" else self.backend_for(mixer))

    def runs(self, name: str) -> list[tuple]:
        return [(task, mixer, seed) for task in self.task_list(name) for mixer in self.mixers
                for seed in self.seeds]

    def total_steps(self) -> int:
        return sum(len(self.runs(name)) * self.train[name].steps for name in self.tasks)

    def train_config(self, name: str) -> TrainConfig:
        config = self.train[name]
        if self.time_budget_s is None:
            return config
        share = self.time_budget_s * config.steps / self.total_steps()
        return replace(config, max_seconds=share)

    def describe(self) -> dict:
        out = {k: getattr(self, k) for k in ("mixers", "seeds", "width", "layers",
                                              "mlp_expansion", "norm", "tie_embeddings",
                                              "time_budget_s")}
        out["backend"] = (self.backend if isinstance(self.backend, (str, dict))
                          else repr(self.backend))
        out["tasks"] = {k: dict(v) for k, v in self.tasks.items()}
        out["train"] = {k: asdict(v) for k, v in self.train.items()}
        return out


def study_from_parameters(mixers, seeds, width, layers, mlp_expansion, tasks, steps, batch_size,
                          lr, warmup_steps, eval_batches, timing_warmup_steps=5, log_every=10,
                          time_budget_s=None, backend="auto", norm="rmsnorm") -> Study:
    """The study of notebook 05's parameters: ``tasks`` maps a task to its lengths and options,
    ``steps`` and ``batch_size`` map a task to its own (or are one number for all).  Every
    numeric parameter is checked first (check_parameter_ranges): ParameterError names the one
    out of range before anything runs."""
    check_parameter_ranges(dict(
        seeds=seeds, width=width, layers=layers, mlp_expansion=mlp_expansion, tasks=tasks,
        steps=steps, batch_size=batch_size, lr=lr, warmup_steps=warmup_steps,
        eval_batches=eval_batches, timing_warmup_steps=timing_warmup_steps, log_every=log_every,
        time_budget_s=time_budget_s))

    def per_task(value, name):
        return value[name] if isinstance(value, dict) else value
    # Checked above, so int() and float() only turn numpy's numbers into Python's.
    train = {name: TrainConfig(steps=int(per_task(steps, name)),
                               batch_size=int(per_task(batch_size, name)), lr=float(lr),
                               warmup_steps=int(warmup_steps), eval_batches=int(eval_batches),
                               timing_warmup_steps=int(timing_warmup_steps),
                               log_every=int(log_every))
             for name in tasks}
    return Study(mixers=tuple(mixers), seeds=tuple(int(s) for s in seeds),
                 tasks={k: dict(v) for k, v in tasks.items()}, train=train, width=int(width),
                 layers=int(layers), mlp_expansion=int(mlp_expansion), norm=norm,
                 backend=backend, time_budget_s=time_budget_s)


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
    names = inspect.signature(study_from_parameters).parameters
    return study_from_parameters(**{k: v for k, v in parameters.items() if k in names})


def models_for(study: Study, name: str) -> dict:
    """One freshly initialised model per mixer for task ``name``'s vocabulary (for counting)."""
    vocab = study.task_list(name)[0].vocab_size
    return {m: model_.build(study.model_config(m, vocab), seed=0) for m in study.mixers}


def run_one(study: Study, name: str, task, mixer: str, seed: int, device, held_out=None,
            progress=None) -> dict:
    """Train and evaluate one model; the run's record for the result document."""
    config = study.train_config(name)
    cfg = study.model_config(mixer, task.vocab_size)
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
        "model": cfg.describe(), "backend": model.last_backends,
        "batch_size": config.batch_size, "lr": config.lr, "max_seconds": config.max_seconds,
        **trained,
        "metric": scored["metric"], "value": scored["value"], "eval_loss": scored["loss"],
        "eval_scored_positions": scored["scored"], "chance": task.chance,
        "values_baseline": getattr(task, "values_baseline", None),
        "wall_s": time.perf_counter() - started,
    }


def _log_line(path, text: str) -> None:
    if path:
        with open(path, "a") as f:
            f.write(text + "\n")


def run_task(study: Study, name: str, device, progress_log=None, bar=True) -> list[dict]:
    """Every run of task ``name`` (each length, mixer and seed), with a tqdm bar; each finished
    run is also appended as a line to ``progress_log`` when given (``make train`` prints them)."""
    from tqdm import tqdm  # the text bar: tqdm.auto's widget bar needs ipywidgets

    runs = study.runs(name)
    records = []
    steps = study.train[name].steps
    total = tqdm(total=len(runs) * steps, desc=name, unit="step", disable=not bar,
                 mininterval=1.0)
    held = {}
    try:
        for task, mixer, seed in runs:
            total.set_postfix_str(f"L={task.seq_len} {mixer} seed {seed}")
            if task.seq_len not in held:
                cfg = study.train[name]
                held[task.seq_len] = task.held_out(cfg.eval_batches, cfg.batch_size)
            done = [0]

            def progress(step, loss):
                done[0] = step + 1
                total.update()
            record = run_one(study, name, task, mixer, seed, device, held[task.seq_len],
                             progress)
            total.update(steps - done[0])  # a run cut short still fills its share of the bar
            records.append(record)
            flags = " (stopped on time)" if record["stopped_by_time"] else ""
            flags += " (diverged)" if record["diverged"] else ""
            _log_line(progress_log, f"{name} L={task.seq_len} {mixer} seed {seed}: "
                      f"{record['metric']} {record['value']:.4f}, "
                      f"{record['tokens_per_s']:.3g} tokens/s, "
                      f"{record['steps_completed']}/{record['steps']} steps, "
                      f"{record['wall_s']:.1f} s{flags}")
    finally:
        total.close()
    return records


# --- the result document -------------------------------------------------------------------------

def environment(device) -> dict:
    """The timing protocol's environment (versions, GPU, driver, commit, date) of the device the
    study trained on, with its dtype: a CPU run on a GPU machine names no GPU."""
    from . import protocol
    env = protocol.environment(device)
    env["dtype"] = dtype_name(device)
    return env


def result_document(study: Study, records: list[dict], device) -> dict:
    doc = {"schema_version": schema.SCHEMA_VERSION, "kind": "training",
           "environment": environment(device), "study": study.describe(), "runs": records}
    if "lm" in study.tasks:
        root = next((t.root for t in study.task_list("lm")), None)
        doc["corpus"] = corpus(root)[2]
    return doc


def result_path(slug: str) -> Path:
    """data/training/<slug>.json (samu.paths.training_file)."""
    from .. import paths
    return paths.training_file(slug)


def validate(doc: dict) -> None:
    """Raise jsonschema.ValidationError naming the first problem (non-finite numbers taken as the
    strings they are written as)."""
    schema.validate(schema._finite(doc), "training")


def write_result(doc: dict, slug: str) -> Path:
    """Validated against the "training" schema, then written atomically."""
    return schema.write_json_atomic(result_path(slug), doc, kind="training")


def _runs(doc) -> list[dict]:
    return doc["runs"] if isinstance(doc, dict) else list(doc)


def frame(doc):
    """One row per run (of a document, or of a list of run records): task, mixer, seed, seq_len,
    metric, value, tokens_per_s, parameters, ..."""
    import pandas as pd
    keys = ("task", "mixer", "seed", "seq_len", "metric", "value", "chance", "values_baseline",
            "eval_loss",
            "final_train_loss", "tokens_per_s", "parameters", "steps", "steps_completed",
            "stopped_by_time", "diverged", "wall_s")
    df = pd.DataFrame([{k: r.get(k) for k in keys} for r in _runs(doc)])
    for column in ("value", "eval_loss", "final_train_loss", "tokens_per_s"):
        df[column] = pd.to_numeric(df[column], errors="coerce")  # "nan" strings of a file
    return df


def summary(doc):
    """Per task, length and mixer (of a document, or of a list of run records): the metric's
    mean, standard deviation, minimum and maximum over seeds, median tokens per second and the
    parameter count."""
    df = frame(doc)
    grouped = df.groupby(["task", "seq_len", "mixer"], sort=False)
    out = grouped.agg(metric=("metric", "first"), seeds=("seed", "count"),
                      mean=("value", "mean"), std=("value", "std"), min=("value", "min"),
                      max=("value", "max"), tokens_per_s=("tokens_per_s", "median"),
                      parameters=("parameters", "first"),
                      steps_completed=("steps_completed", "min")).reset_index()
    return out


# --- figures -------------------------------------------------------------------------------------

def _seed_range(values):
    return values.min(), values.max()


def _title_note(doc: dict) -> str:
    env = doc["environment"]
    where = env["gpu"] if env.get("device", "").startswith("cuda") else "CPU"
    note = f"{where}, {env['dtype']}"
    if not env.get("device", "").startswith("cuda"):
        note += "; a CPU run exercises the study, its numbers are no GPU result"
    return note


def figures(doc: dict) -> dict:
    """matplotlib Figures (no pyplot, so nothing is left open): loss curves per task and length,
    accuracy against sequence length (recall, copying), and quality against training speed."""
    import numpy as np
    import pandas as pd
    import seaborn as sns
    from matplotlib.figure import Figure

    from matplotlib.ticker import FuncFormatter

    from .report import _plain_log_ticks

    sns.set_theme(style="whitegrid", context="notebook")
    runs = _runs(doc)
    df = frame(doc)
    df["Mixer"] = df["mixer"].map(lambda m: MIXER_NAMES.get(m, m))
    mixers = list(dict.fromkeys(df["Mixer"]))
    palette = dict(zip(mixers, sns.color_palette("deep", len(mixers))))
    markers = dict(zip(mixers, ["o", "s", "^", "D", "v"]))
    note = _title_note(doc)
    out = {}

    # Loss curves: one panel per (task, length), the band the range over seeds.
    curves = pd.DataFrame([{"task": r["task"], "seq_len": r["seq_len"],
                            "Mixer": MIXER_NAMES.get(r["mixer"], r["mixer"]),
                            "seed": r["seed"], "step": s, "loss": float(l)}
                           for r in runs for s, l in r["loss_curve"]])
    panels = list(dict.fromkeys(zip(curves["task"], curves["seq_len"])))
    cols = min(4, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(4.2 * cols, 3.3 * rows + 0.6))
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    for ax, (task, length) in zip(axes, panels):
        part = curves[(curves["task"] == task) & (curves["seq_len"] == length)]
        sns.lineplot(data=part, x="step", y="loss", hue="Mixer", hue_order=mixers,
                     palette=palette, errorbar=_seed_range, ax=ax, legend=ax is axes[0])
        ax.set_title(f"{TASK_NAMES[task]}, L = {length}", fontsize=10)
        ax.set_ylabel("training loss (nats)")
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    if axes[0].get_legend() is not None:
        axes[0].get_legend().set_title("mixer")
    fig.suptitle(f"Training loss (mean over seeds; band: range over seeds) — {note}", fontsize=11)
    fig.tight_layout()
    out["loss"] = fig

    # Accuracy against sequence length.
    acc = df[df["task"].isin(["mqar", "copy"])]
    if len(acc):
        tasks = list(dict.fromkeys(acc["task"]))
        fig = Figure(figsize=(5.2 * len(tasks) + 1.5, 4.2))
        axes = np.atleast_1d(fig.subplots(1, len(tasks), squeeze=False)).ravel()
        for ax, task in zip(axes, tasks):
            part = acc[acc["task"] == task]
            sns.lineplot(data=part, x="seq_len", y="value", hue="Mixer", hue_order=mixers,
                         palette=palette, style="Mixer", markers=markers, dashes=False,
                         errorbar=_seed_range, err_style="bars", ax=ax, legend=ax is axes[-1])
            ax.axhline(part["chance"].iloc[0], color="gray", lw=1, ls=":", label="chance")
            if task == "mqar" and part["values_baseline"].notna().any():
                level = part["values_baseline"].iloc[0]
                ax.axhline(level, color="gray", lw=1, ls="--")
                ax.text(0.01, level + 0.01, "guessing among the values present (1 / pairs)",
                        transform=ax.get_yaxis_transform(), color="gray", fontsize=8,
                        va="bottom")
            ax.set_xscale("log", base=2)
            lengths = sorted(set(part["seq_len"]))
            ax.set_xticks(lengths, [str(v) for v in lengths])
            ax.minorticks_off()
            ax.set_ylim(-0.03, 1.03)
            ax.set_xlabel("sequence length (trained and evaluated)")
            ax.set_ylabel("held-out accuracy at the answer positions")
            ax.set_title(TASK_NAMES[task], fontsize=10)
        legend = axes[-1].get_legend()
        if legend is not None:
            handles, labels = axes[-1].get_legend_handles_labels()
            legend.remove()
            axes[-1].legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                            frameon=False)
        fig.suptitle(f"Accuracy against sequence length (mean over seeds; bars: range) — {note}",
                     fontsize=11)
        fig.tight_layout()
        out["accuracy"] = fig

    # Quality against speed: each task at its longest length, one marker per mixer (the mean
    # over seeds, bars the range over seeds on both axes).
    tasks = list(dict.fromkeys(df["task"]))
    fig = Figure(figsize=(4.6 * len(tasks) + 1.5, 4.2))
    axes = np.atleast_1d(fig.subplots(1, len(tasks), squeeze=False)).ravel()
    for ax, task in zip(axes, tasks):
        part = df[df["task"] == task]
        longest = part["seq_len"].max()
        part = part[part["seq_len"] == longest]
        for mixer in mixers:
            grp = part[part["Mixer"] == mixer]
            if not len(grp):
                continue
            x, y = grp["tokens_per_s"], grp["value"]
            ax.scatter(x, y, color=palette[mixer], marker=markers[mixer], alpha=0.35, s=22)
            ax.errorbar([x.mean()], [y.mean()],
                        xerr=[[x.mean() - x.min()], [x.max() - x.mean()]],
                        yerr=[[y.mean() - y.min()], [y.max() - y.mean()]],
                        fmt=markers[mixer], color=palette[mixer], markersize=9,
                        markeredgecolor="black", capsize=3, label=mixer)
        lo, hi = part["tokens_per_s"].min(), part["tokens_per_s"].max()
        if math.isfinite(lo) and math.isfinite(hi) and lo > 0 and hi / lo >= 5:
            ax.set_xscale("log")  # speeds an order of magnitude apart
            ax.set_xlim(lo / 1.3, hi * 1.3)
            _plain_log_ticks(ax.xaxis, lo / 1.3, hi * 1.3)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.tick_params(axis="x", labelrotation=20)
        ax.set_xlabel("training tokens / s")
        metric = METRICS[task]
        ax.set_ylabel("held-out accuracy (higher is better)" if metric == "accuracy"
                      else "held-out bits per character (lower is better)")
        ax.set_title(f"{TASK_NAMES[task]}, L = {longest}", fontsize=10)
    handles, labels = axes[-1].get_legend_handles_labels()
    if handles:
        axes[-1].legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                        frameon=False)
    fig.suptitle(f"Quality against training speed (large marker: mean over seeds, bars: range; "
                 f"small: each seed) — {note}", fontsize=11)
    fig.tight_layout()
    out["quality_speed"] = fig
    return out


FIGURE_NAMES = ("loss", "accuracy", "quality_speed")  # figures' keys, those a study draws


def figure_path(slug: str, name: str) -> Path:
    """data/figures/<slug>_training_<name>.png."""
    from .. import paths
    return paths.figures_dir() / f"{slug}_training_{name}.png"


def draw_figures(doc: dict, slug: str) -> list[Path]:
    """The figures written atomically (``report.save_figure``) to their figure_path."""
    from . import report
    return [report.save_figure(fig, figure_path(slug, name)) for name, fig in figures(doc).items()]


# --- the conclusion ------------------------------------------------------------------------------

def _unit(metric: str) -> str:
    return "" if metric == "accuracy" else " bits/char"


def conclusion(doc: dict) -> str:
    """A Markdown summary computed from the document: what was measured, each mixer's metric at
    each task's longest length with its spread over seeds, whether the spreads separate the
    mixers, the speeds, and what the runs do not show."""
    import pandas as pd
    df = frame(doc)
    env = doc["environment"]
    study = doc["study"]
    gpu = env.get("device", "").startswith("cuda")
    seeds = sorted(set(df["seed"]))
    params = df.groupby("mixer")["parameters"].agg(["min", "max"])
    steps = {t: c["steps"] for t, c in study["train"].items()}
    lines = [f"**Measured.** {len(df)} runs on {env['gpu'] if gpu else 'a CPU'} "
             f"({env['dtype']}): tasks {', '.join(TASK_NAMES[t] for t in study['tasks'])}; "
             f"mixers {', '.join(MIXER_NAMES.get(m, m) for m in study['mixers'])}; "
             f"{len(seeds)} seeds each; width {study['width']}, {study['layers']} layers, "
             f"{params['min'].min():,}-{params['max'].max():,} parameters; "
             f"{', '.join(f'{t} {s} steps' for t, s in steps.items())}."]
    for task in dict.fromkeys(df["task"]):
        part = df[df["task"] == task]
        longest = part["seq_len"].max()
        part = part[part["seq_len"] == longest]
        metric = METRICS[task]
        stats = part.groupby("mixer", sort=False)["value"].agg(["mean", "min", "max"])
        better = stats["mean"].idxmax() if metric == "accuracy" else stats["mean"].idxmin()
        others = stats.drop(index=better)
        if metric == "accuracy":
            separated = bool(len(others)) and bool((stats.loc[better, "min"] > others["max"]).all())
        else:
            separated = bool(len(others)) and bool((stats.loc[better, "max"] < others["min"]).all())
        cells = [f"{MIXER_NAMES.get(m, m)} {s['mean']:.3f} ({s['min']:.3f}-{s['max']:.3f})"
                 f"{_unit(metric)}" for m, s in stats.iterrows()]
        verdict = (f"{MIXER_NAMES.get(better, better)} is best, beyond the spread over seeds"
                   if separated else
                   f"{MIXER_NAMES.get(better, better)} has the best mean, but the ranges over "
                   "seeds overlap: no ordering is claimed")
        chance = part["chance"].iloc[0]
        baseline = part["values_baseline"].iloc[0] if task == "mqar" else None
        if baseline is not None and not pd.isna(baseline):
            if stats["max"].max() < 1.5 * baseline:
                verdict += (f"; no run got past guessing among the values present "
                            f"(1 / pairs = {baseline:.3f}): none learned to bind keys to values "
                            "in these steps")
            else:
                learned = [MIXER_NAMES.get(m, m) for m, st in stats.iterrows()
                           if st["max"] >= 1.5 * baseline]
                verdict += (f"; past guessing among the values present (1 / pairs = "
                            f"{baseline:.3f}) in at least one seed: {', '.join(learned)}")
        lines.append(f"**{TASK_NAMES[task][0].upper() + TASK_NAMES[task][1:]}, L = {longest}** "
                     f"(mean, range over seeds; chance {chance:.3f}{_unit(metric)}): "
                     f"{'; '.join(cells)}. {verdict[0].upper() + verdict[1:]}.")
        all_lengths = df[df["task"] == task]
        if metric == "accuracy" and all_lengths["seq_len"].nunique() > 1:
            by_len = all_lengths.groupby(["mixer", "seq_len"])["value"].mean()
            trend = [f"{MIXER_NAMES.get(m, m)} {by_len.loc[m].iloc[0]:.3f} at L = "
                     f"{by_len.loc[m].index[0]} to {by_len.loc[m].iloc[-1]:.3f} at L = "
                     f"{by_len.loc[m].index[-1]}" for m in stats.index]
            lines.append(f"Mean accuracy from the shortest to the longest length: "
                         f"{'; '.join(trend)}.")
    speed = df.groupby("mixer", sort=False)["tokens_per_s"].median()
    if "attention" in speed.index and len(speed) > 1:
        rel = ", ".join(f"{MIXER_NAMES.get(m, m)} {v / speed['attention']:.2f}×"
                        for m, v in speed.items() if m != "attention")
        speed_text = f" Relative to attention: {rel}."
    else:
        speed_text = ""
    lines.append("**Training speed** (median tokens/s over all runs): "
                 + ", ".join(f"{MIXER_NAMES.get(m, m)} {v:,.0f}" for m, v in speed.items())
                 + f".{speed_text}")
    cut = df[df["stopped_by_time"]]
    diverged = df[df["diverged"]]
    if len(cut):
        lines.append(f"**Stopped by the time budget:** {len(cut)} runs (fewest steps "
                     f"{cut['steps_completed'].min()} of {cut['steps'].max()}); their scores are "
                     "from shorter training.")
    if len(diverged):
        lines.append(f"**Diverged:** {len(diverged)} runs (non-finite training loss).")
    caveats = ("**What this does not show.** These are small models trained for few steps with "
               "one learning rate for every mixer (no tuning per mixer); the recurrent mixers run "
               "bare, without the projections, convolution and gating branch of Griffin's "
               "recurrent block. Nothing here predicts quality or speed at scale. ")
    if gpu:
        caveats += ("At this size a training step is short, so tokens/s include the host's "
                    "per-step cost (each step is synchronised) and say little about the kernels' "
                    "speed at large shapes (notebooks 03-04 time those).")
    else:
        caveats += ("On a CPU the recurrent mixers run the pure-PyTorch reference, so these "
                    "speeds and scores only exercise the study; they are no GPU result.")
    lines.append(caveats)
    return "\n\n".join(lines)


# --- make train ----------------------------------------------------------------------------------

# The configuration of `make train` on a GPU: width 256, 2 layers, 3 seeds; recall and copying at
# four lengths, 81 runs and 77,400 training steps in all.  The models are small, so a step costs
# a few milliseconds on an H200, mostly the host's: about 4-5 minutes of training, never more than
# time_budget_s of measured steps (each run stops at its share), plus a minute or so of start-up,
# Triton compilation, evaluation and figures.  MQAR has 8 pairs over a vocabulary of 64.  In CPU
# trials (width 64-128, length 64-256, 1200-1500 steps) attention first learned to guess among the
# values present (accuracy 1/8) and bound keys to values in only one run of eight: when that
# transition comes varies with the seed, so the spread over seeds matters here.
GPU_PARAMETERS = dict(
    mixers=list(model_.MIXERS),
    seeds=[0, 1, 2],
    width=256,
    layers=2,
    mlp_expansion=4,
    tasks={
        "mqar": {"lengths": [256, 512, 1024, 2048], "num_pairs": 8, "vocab_size": 64},
        "copy": {"lengths": [256, 512, 1024, 2048], "num_tokens": 16, "data_vocab": 16,
                 "noise_vocab": 16},
        "lm": {"lengths": [512]},
    },
    steps={"mqar": 1200, "copy": 800, "lm": 600},
    batch_size=32,
    lr=3e-3,
    warmup_steps=100,
    eval_batches=8,
    timing_warmup_steps=10,
    log_every=20,
    time_budget_s=330,
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
                        help="seconds of measured training for the whole study, a finite number "
                             f"> 0 (GPU default: {GPU_PARAMETERS['time_budget_s']})")
    args = parser.parse_args(argv)
    from .. import paths
    from . import pipeline, protocol

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
    doc = schema.read_valid_json(result_path(slug), "training")
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print("\n" + summary(doc).round(4).to_string(index=False))
    print(f"\n{len(doc['runs'])} runs in {wall:.0f} s; wrote {paths.relative(result_path(slug))}, "
          f"{paths.relative(paths.figures_dir())}/{slug}_training_*.png, {stored}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Training and evaluating one model: ``TrainConfig`` (AdamW, warm-up and cosine decay, or a
warm-up, stable, decay schedule that a plateau may end), ``train`` and ``evaluate``."""
from __future__ import annotations

import contextlib
import math
import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .checkpoint import restore
from .parameters import COUNT, LEARNING_RATE, OFFSET, ParameterError, Range
from .tasks import IGNORE, metric_of, seeded_generator

# --- training ------------------------------------------------------------------------------------

# scaled_dot_product_attention's kernels by the name a TrainConfig gives (the fastest first, as
# a rule, on a recent GPU; fastest_attention_kernel times them).
ATTENTION_KERNEL_NAMES = {"cudnn": SDPBackend.CUDNN_ATTENTION,
                          "flash": SDPBackend.FLASH_ATTENTION,
                          "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def attention_kernel(name: str | None):
    """A context in which scaled_dot_product_attention runs kernel ``name`` alone (None:
    torch's own choice)."""
    return contextlib.nullcontext() if name is None else sdpa_kernel(ATTENTION_KERNEL_NAMES[name])


# A run's learning-rate schedules (TrainConfig.schedule).
SCHEDULES = ("cosine", "constant", "wsd")
# A run whose mean training loss over the last fifth of its logged steps is below this fraction
# of the fifth before was still learning when it stopped; fewer logged points say nothing.
STILL_LEARNING_RATIO = 0.9
STILL_LEARNING_POINTS = 10


def still_learning(loss_curve) -> bool:
    """Whether a run's training loss was still falling when it stopped: the mean over the last
    fifth of its logged points below STILL_LEARNING_RATIO times the mean over the fifth before
    (False with fewer than STILL_LEARNING_POINTS points)."""
    losses = [float(v) for _, v in loss_curve]
    if len(losses) < STILL_LEARNING_POINTS or not all(math.isfinite(v) for v in losses):
        return False
    fifth = len(losses) // 5
    last = sum(losses[-fifth:]) / fifth
    before = sum(losses[-2 * fifth:-fifth]) / fifth
    return last < STILL_LEARNING_RATIO * before


@dataclass(frozen=True)
class TrainConfig:
    """AdamW (no weight decay on vectors, scalars and the embedding), linear warm-up then cosine
    decay to ``min_lr_ratio * lr`` (or constant, or ``"wsd"``: warm-up, stable, decay), gradient
    clipping at ``grad_clip``.  With "wsd" the rate stays at ``lr`` until the decay starts, then
    falls by the same cosine to ``min_lr_ratio * lr`` (at the last step) over ``decay_fraction``
    of the run, which ends there.  The decay starts at ``(1 - decay_fraction) * steps`` at the
    latest, or at the first logging point from step ``plateau_from`` (and the warm-up's end) on
    where the training loss has stopped falling (``still_learning`` false over at least
    STILL_LEARNING_POINTS points), so that ``steps`` is a run's most and a run that has
    converged stops sooner.  Tokens per second are measured over the steps after
    ``timing_warmup_steps`` (compilation and allocator warm-up excluded), each step
    synchronised on CUDA; on CUDA the GPU time of each step (CUDA events around forward,
    backward and the optimizer step; no evaluation) is summed as well.
    ``max_seconds`` is an optional safety cap: it stops a run once its measured steps took that
    long (None, the default: never) and the run records that it did.  ``stop_loss``: a run
    stops once its mean training loss over a logging window (``log_every`` steps) is at most
    this, the task solved (None, the default: never), and records that it stopped early.
    ``attention_kernel``: the kernel of scaled_dot_product_attention (ATTENTION_KERNEL_NAMES;
    None: torch's own choice).  ``cuda_graph``: on CUDA,
    after ``GraphedStep.EAGER_STEPS`` eager steps every step (forward, backward, clipping and
    the optimizer) is one CUDA graph's replay, so that a small model's step costs its GPU work
    rather than its launches; elsewhere it changes nothing."""
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
    cuda_graph: bool = False
    stop_loss: float | None = None
    attention_kernel: str | None = None
    decay_fraction: float = 0.2
    plateau_from: int | None = None

    # What each numeric field may be.  max_seconds may be 0 (stop after the first timed step);
    # a study's time budget, which it is a share of, may not.
    RANGES = {"steps": COUNT, "batch_size": COUNT, "lr": LEARNING_RATE,
              "warmup_steps": OFFSET, "min_lr_ratio": Range(low=0, high=1),
              "weight_decay": Range(low=0), "grad_clip": Range(low=0, low_open=True),
              "eval_batches": COUNT, "log_every": COUNT, "timing_warmup_steps": OFFSET,
              "max_seconds": Range(low=0, optional=True),
              "stop_loss": Range(low=0, low_open=True, optional=True),
              "decay_fraction": Range(low=0, high=1, low_open=True, high_open=True),
              "plateau_from": Range(integer=True, low=0, optional=True)}
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
        if not isinstance(self.cuda_graph, bool):
            raise ParameterError(f"train: cuda_graph must be True or False, got "
                                 f"{self.cuda_graph!r}")
        if self.timing_warmup_steps >= self.steps:
            raise ParameterError(f"train: timing_warmup_steps {self.timing_warmup_steps} leaves "
                                 f"none of {self.steps} steps to time (it must be below steps)")
        if self.attention_kernel is not None and \
                self.attention_kernel not in ATTENTION_KERNEL_NAMES:
            raise ParameterError(f"train: attention_kernel must be None or one of "
                                 f"{list(ATTENTION_KERNEL_NAMES)}, got {self.attention_kernel!r}")
        if self.schedule not in SCHEDULES:
            raise ParameterError(f"train: schedule must be one of {list(SCHEDULES)}, got "
                                 f"{self.schedule!r}")
        if self.plateau_from is not None and self.schedule != "wsd":
            raise ParameterError(f"train: plateau_from starts a 'wsd' schedule's decay; with "
                                 f"schedule {self.schedule!r} it must be None")
        if self.schedule == "wsd" and self.warmup_steps > self.latest_decay():
            raise ParameterError(f"train: a 'wsd' schedule's decay starts at step "
                                 f"{self.latest_decay()} at the latest, before its "
                                 f"{self.warmup_steps} warm-up steps end: fewer warm-up steps, "
                                 f"or more steps")

    def latest_decay(self) -> int:
        """"wsd": the step at which the decay starts when no plateau starts it sooner."""
        return self.steps - max(1, round(self.steps * self.decay_fraction))

    def decay_end(self, decay_from: int) -> int:
        """"wsd": the step a decay that starts at ``decay_from`` ends the run at: decay_fraction
        of the run it makes (at least one step), and ``steps`` at the latest."""
        if decay_from >= self.latest_decay():
            return self.steps
        span = max(1, round(decay_from * self.decay_fraction / (1 - self.decay_fraction)))
        return min(self.steps, decay_from + span)

    def lr_factor(self, step: int, decay_from: int | None = None) -> float:
        """The learning rate of step ``step`` (0-based) over ``lr``; "wsd": ``decay_from`` is the
        step its decay started at (None: latest_decay)."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.schedule == "constant":
            return 1.0
        if self.schedule == "wsd":
            start = self.latest_decay() if decay_from is None else decay_from
            if step < start:
                return 1.0
            # the run's last step (decay_end - 1) takes the lowest rate
            progress = min((step - start + 1) / (self.decay_end(start) - start), 1.0)
        else:
            progress = min((step - self.warmup_steps) / max(self.steps - self.warmup_steps, 1),
                           1.0)
        cosine = 0.5 * (1 + math.cos(math.pi * progress))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * cosine


def optimizer(model, config: TrainConfig, device, graphed: bool = False) -> torch.optim.Optimizer:
    """AdamW, fused on CUDA; ``graphed``: capturable, its learning rate a device tensor that
    set_learning_rate fills (a CUDA graph replays the step with whatever it holds)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and not name.startswith("embedding") else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    fused = torch.device(device).type == "cuda"
    lr = torch.tensor(config.lr, device=device) if graphed else config.lr
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(config.betas), fused=fused,
                             capturable=graphed)


def set_learning_rate(opt: torch.optim.Optimizer, value: float) -> None:
    for group in opt.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(value)
        else:
            group["lr"] = value


def train_step(model, opt, params, grad_clip: float, inputs, targets, device,
               cache_enabled: bool = True) -> torch.Tensor:
    """One step on gradients that are None (zero_grad(set_to_none=True) before it): forward
    under autocast, the loss, backward, clipping and the optimizer; returns the loss."""
    with autocast(device, cache_enabled=cache_enabled):
        logits = model(inputs)
    loss = loss_of(logits, targets)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, grad_clip)
    opt.step()
    return loss


class GraphedStep:
    """Training steps replayed from one CUDA graph.  Each call copies the batch into static
    buffers; the first EAGER_STEPS calls run eagerly on a side stream (they train like any step
    and warm up the allocator, cuBLAS and the Triton kernels, as capture requires); the next
    captures one step and replays it; later calls replay.  Gradients are set to None before
    capture, so the captured backward writes them rather than accumulating."""
    EAGER_STEPS = 2

    def __init__(self, model, opt, params, grad_clip: float):
        self.model, self.opt, self.params, self.grad_clip = model, opt, params, grad_clip
        self.calls = 0
        self.graph = self.loss = self.inputs = self.targets = None

    def _body(self):
        return train_step(self.model, self.opt, self.params, self.grad_clip, self.inputs,
                          self.targets, "cuda", cache_enabled=False)

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.inputs is None:
            self.inputs, self.targets = inputs.clone(), targets.clone()
        else:
            self.inputs.copy_(inputs, non_blocking=True)
            self.targets.copy_(targets, non_blocking=True)
        self.calls += 1
        if self.graph is not None:
            self.graph.replay()
            return self.loss
        self.opt.zero_grad(set_to_none=True)
        if self.calls <= self.EAGER_STEPS:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                loss = self._body().detach()  # frees the step's autograd graph before capture
            torch.cuda.current_stream().wait_stream(side)
            return loss
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.loss = self._body().detach()
        self.graph.replay()  # capture records the step without running it
        return self.loss


def autocast(device, cache_enabled: bool = True):
    """BF16 autocast on CUDA (the Triton kernels' policy); FP32 elsewhere.  A CUDA graph's
    capture needs ``cache_enabled=False``: a cached cast would be captured once and never
    refreshed."""
    if torch.device(device).type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=cache_enabled)
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
    """Mean loss over the scored positions of ``batches``, and the task's metric (its spec's):
    from the mean loss and the fraction of scored positions whose argmax is the target."""
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
    metric = metric_of(task)
    return {"loss": loss, "metric": metric.name, "value": metric.value(loss, correct / count),
            "scored": count}


def train(model, task, config: TrainConfig, seed: int, device, progress=None,
          checkpoint=None) -> dict:
    """Train ``model`` on batches of ``task`` drawn on ``device`` from a generator seeded with
    ``seed`` (the same batches for every model on one kind of device).
    ``progress(step, loss)`` is called after every step.  Returns the loss curve (mean training
    loss over each ``log_every`` steps, at the step that ends them), tokens per second, steps
    completed and whether the run stopped on time, stopped early (solved) or diverged; the
    steps run attention on ``config.attention_kernel``.  ``checkpoint`` (a RunCheckpoint, or
    None): the run starts from the state it holds, if any, and saves its state there as it
    trains (a save of other parameters or another attention kernel is not resumed from);
    ``resumed_at`` lists the steps it went on from."""
    with attention_kernel(config.attention_kernel):
        return _train(model, task, config, seed, device, progress, checkpoint)


def _train(model, task, config: TrainConfig, seed: int, device, progress, checkpoint) -> dict:
    device = torch.device(device)
    generator = seeded_generator(seed, device)
    graphed = config.cuda_graph and device.type == "cuda"
    opt = optimizer(model, config, device, graphed)
    params = [p for p in model.parameters()]
    graph_step = GraphedStep(model, opt, params, config.grad_clip) if graphed else None
    model.train()
    losses, curve = [], []
    timed_s, timed_tokens, timed_steps = 0.0, 0, 0
    cuda = device.type == "cuda"
    gpu_ms = 0.0
    stopped_by_time = stopped_early = diverged = False
    wsd = config.schedule == "wsd"
    decay_from = config.latest_decay() if wsd else None
    stop_at = config.steps  # "wsd": where its decay ends, once a plateau starts it
    earlier_wall_s, resumed_at = 0.0, []
    saved = checkpoint.load() if checkpoint is not None else None
    if saved is not None and restore(saved, model, opt, generator, config.attention_kernel):
        losses, curve = list(saved["losses"]), [list(point) for point in saved["curve"]]
        timed_s, timed_tokens = saved["timed_s"], saved["timed_tokens"]
        timed_steps, gpu_ms = saved["timed_steps"], saved["gpu_ms"]
        decay_from, stop_at = saved["decay_from"], saved["stop_at"]
        earlier_wall_s, resumed_at = saved["wall_s"], list(saved["resumed_at"]) + [len(losses)]
    start = len(losses)
    # The capture's step is never timed: it synchronises and records rather than trains fast;
    # nor are the first steps after a resume (compilation and allocator warm-up again).
    first_timed = start + (max(config.timing_warmup_steps, GraphedStep.EAGER_STEPS + 1)
                           if graphed else config.timing_warmup_steps)
    started = time.perf_counter()

    def state() -> dict:
        return {"model": model.state_dict(), "optimizer": opt.state_dict(),
                "generator": generator.get_state(), "losses": losses, "curve": curve,
                "timed_s": timed_s, "timed_tokens": timed_tokens, "timed_steps": timed_steps,
                "gpu_ms": gpu_ms, "decay_from": decay_from, "stop_at": stop_at,
                "wall_s": earlier_wall_s + time.perf_counter() - started,
                "resumed_at": resumed_at, "attention_kernel": config.attention_kernel}
    for step in range(start, config.steps):
        inputs, targets = task.batch(config.batch_size, generator)
        _synchronize(device)
        t0 = time.perf_counter()
        if cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
        inputs = inputs.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        set_learning_rate(opt, config.lr * config.lr_factor(step, decay_from))
        if graph_step is not None:
            loss = graph_step(inputs, targets)
        else:
            opt.zero_grad(set_to_none=True)
            loss = train_step(model, opt, params, config.grad_clip, inputs, targets, device)
        if cuda:
            end.record()
        value = loss.item()  # synchronises
        elapsed = time.perf_counter() - t0
        if step >= first_timed:
            if cuda:
                gpu_ms += begin.elapsed_time(end)
            timed_s += elapsed
            timed_tokens += inputs.numel()
            timed_steps += 1
        losses.append(value)
        if progress is not None:
            progress(step, value)
        done = step + 1
        if not math.isfinite(value):
            diverged = True
            break
        if done % config.log_every == 0 or done == stop_at:
            window = losses[-(done - (curve[-1][0] if curve else 0)):]
            curve.append([done, statistics.fmean(window)])
            if (config.stop_loss is not None and done < stop_at
                    and curve[-1][1] <= config.stop_loss):
                stopped_early = True
                break
            if (wsd and config.plateau_from is not None
                    and max(config.plateau_from, config.warmup_steps) <= done < decay_from
                    and len(curve) >= STILL_LEARNING_POINTS and not still_learning(curve)):
                decay_from = done  # converged at this rate: decay from here
                stop_at = config.decay_end(done)
        if done == stop_at:
            break
        if config.max_seconds is not None and timed_s > config.max_seconds:
            stopped_by_time = done < config.steps
            break
        if checkpoint is not None and done % config.log_every == 0 and checkpoint.due():
            checkpoint.save(state())
    last = curve[-1][0] if curve else 0
    if last != len(losses):  # a run cut short: its last partial window
        curve.append([len(losses), statistics.fmean(losses[last:])])
    return {
        "loss_curve": curve,
        "final_train_loss": curve[-1][1],
        "steps": config.steps,
        "steps_completed": len(losses),
        # "wsd": the step its decay started at; None under another schedule, or where the run
        # stopped (solved, or on time) before any step of its decay.
        "decay_from": decay_from if decay_from is not None and decay_from < len(losses) else None,
        "stopped_by_time": stopped_by_time,
        "stopped_early": stopped_early,
        "diverged": diverged,
        "tokens_per_s": timed_tokens / timed_s if timed_s > 0 else math.nan,
        "timed_steps": timed_steps,
        # Wall time per timed step, host overhead included; GPU time only on CUDA (None here).
        "wall_ms_per_step": 1e3 * timed_s / timed_steps if timed_steps else math.nan,
        "gpu_ms_per_step": (gpu_ms / timed_steps if timed_steps else math.nan) if cuda else None,
        "train_wall_s": earlier_wall_s + time.perf_counter() - started,
        "resumed_at": resumed_at,
    }



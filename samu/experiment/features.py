"""Timing the state keywords, decode and torch.compile (SPEC section 3), with the protocol's
sampling (samu.experiment.protocol): medians of synchronised forward+backward samples under BF16
autocast, and the GPU time of one forward+backward replayed from a CUDA graph.

* packing: one row of N sequences with cu_seqlens, beside the same tokens as one plain row,
  beside one call per sequence, and as one row from an initial state with its final state in
  the loss;
* decode: microseconds per ``step`` at several batch sizes (host wall time over consecutive
  steps, and the GPU time of a step replayed from a CUDA graph);
* compile: a residual block around the mixer, eager beside torch.compile (default and
  ``mode="reduce-overhead"``, CUDA graphs), forward+backward medians.
"""
from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from . import protocol


class WithKeywords(nn.Module):
    """A mixer called with fixed keywords (cu_seqlens, say): the protocol calls module(x)."""

    def __init__(self, mixer: nn.Module, **keywords):
        super().__init__()
        self.mixer = mixer
        self.keywords = keywords

    def forward(self, x):
        return self.mixer(x, **self.keywords)


class _FinalStateGradient(torch.autograd.Function):
    """y unchanged, and in the backward dy[:, -1] as the final state's gradient: a loss that
    reads the final state, at no cost of its own."""

    @staticmethod
    def forward(ctx, y, final):
        return y.view_as(y)

    @staticmethod
    def backward(ctx, dy):
        return dy, dy[:, -1].float()


class WithStates(nn.Module):
    """A mixer from a given initial state (a parameter: its gradient is formed) with its final
    state in the loss: the kernels' initial-state and final-state-gradient paths."""

    def __init__(self, mixer: nn.Module, initial_state: torch.Tensor):
        super().__init__()
        self.mixer = mixer
        self.initial_state = nn.Parameter(initial_state)

    def forward(self, x):
        y, final = self.mixer(x, initial_state=self.initial_state, output_final_state=True)
        return _FinalStateGradient.apply(y, final)


class OneByOne(nn.Module):
    """The packed row's sequences, one call each: what packing saves."""

    def __init__(self, mixer: nn.Module, offsets: list[int]):
        super().__init__()
        self.mixer = mixer
        self.offsets = offsets

    def forward(self, x):
        parts = [self.mixer(x[:, a:b]) for a, b in zip(self.offsets, self.offsets[1:])]
        return torch.cat(parts, dim=1)


class Block(nn.Module):
    """A pre-norm residual block around the mixer: what torch.compile sees in a model."""

    def __init__(self, mixer: nn.Module, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mixer = mixer
        self.out = nn.Linear(width, width)

    def forward(self, x):
        return x + self.out(self.mixer(self.norm(x)))


def random_offsets(length: int, count: int, seed: int = 0) -> list[int]:
    """cu_seqlens of ``count`` sequences of random lengths (each at least 1) summing to length."""
    gen = torch.Generator().manual_seed(seed)
    cuts = sorted(torch.randperm(length - 1, generator=gen)[:count - 1].add(1).tolist())
    return [0, *cuts, length]


def _median_ms(module, x, dy, samples: int) -> float:
    return statistics.median(protocol.warm_samples(module, x, dy, samples))


def _timed(module, x, dy, samples: int) -> dict:
    return {"forward_backward_median_ms": _median_ms(module, x, dy, samples),
            "gpu_time_ms": protocol.graph_replay_ms(module, x, dy)}


def time_packing(mixer: str, backend: str, length: int, width: int, device, count: int = 8,
                 seed: int = 0, samples: int = 10) -> dict:
    """One row of ``count`` packed sequences against the same tokens unpacked and one by one,
    and unpacked from an initial state with the final state in the loss (``with_states``)."""
    device = torch.device(device)
    module = protocol.build_module(mixer, width, backend, device, seed)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, length, width, generator=gen).to(device, torch.bfloat16).requires_grad_()
    dy = torch.randn(1, length, width, generator=gen).to(device, torch.bfloat16)
    offsets = random_offsets(length, count, seed)
    cu = torch.tensor(offsets, dtype=torch.int32, device=device)
    h0 = torch.randn(1, width, generator=gen).to(device)
    variants = {"packed": WithKeywords(module, cu_seqlens=cu), "unpacked": module,
                "one_by_one": OneByOne(module, offsets), "with_states": WithStates(module, h0)}
    out = {"mixer": mixer, "backend": backend, "shape": [1, length, width],
           "lengths": [b - a for a, b in zip(offsets, offsets[1:])]}
    for name, variant in variants.items():
        out[name] = _timed(variant, x, dy, samples)
    module(x, cu_seqlens=cu)
    out["backend"] = module.last_backend
    return out


def time_steps(mixer: str, backend: str, width: int, batches, device, steps: int = 64,
               seed: int = 0) -> list[dict]:
    """Microseconds per decode step at each batch size: host wall time over ``steps``
    consecutive steps (synchronised once at the end; median of 5), and on a GPU the step's
    own time replayed from a CUDA graph and the host time of a torch.nn.Linear(D, D)
    forward+backward at (1, 128, D) measured in the same run (protocol.host_cost_us), with the
    step's ratio to it.  ``one_launch``: the step took its one-kernel path (samu.modules)."""
    device = torch.device(device)
    module = protocol.build_module(mixer, width, backend, device, seed)
    host = protocol.host_cost_us(module, width, device)  # None on a CPU
    linear_us = host["linear_us"] if host else None
    rows = []
    for batch in batches:
        x = torch.randn(batch, width, device=device, dtype=torch.bfloat16)
        state = torch.zeros(batch, width, device=device)
        with torch.no_grad():
            for _ in range(3):
                module.step(x, state)
            walls = []
            for _ in range(5):
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                s = state
                for _ in range(steps):
                    _, s = module.step(x, s)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                walls.append((time.perf_counter() - t0) * 1e6 / steps)
            one_launch = module._step_in_one_launch(x, state, module._parameters_in_order())
            host_us = statistics.median(walls)
            rows.append({"batch": batch, "host_us_per_step": host_us,
                         "gpu_us_per_step": _graph_step_us(module, x, state),
                         "one_launch": one_launch,
                         "backend": f"{mixer} step kernel" if one_launch else module.last_backend,
                         "linear_forward_backward_us": linear_us,
                         "step_over_linear": host_us / linear_us if linear_us else None})
    return rows


def _graph_step_us(module, x, state, replays: int = 50) -> float | None:
    if not x.is_cuda:
        return None
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(stream):
        for _ in range(3):
            module.step(x, state)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        module.step(x, state)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) * 1e3 / replays


def time_compiled(mixer: str, backend: str, shape, device, seed: int = 0,
                  samples: int = 10) -> dict:
    """A residual block around the mixer, forward+backward medians: eager, torch.compile
    (fullgraph) and torch.compile(mode="reduce-overhead"), with the first call's compile time."""
    device = torch.device(device)
    batch, length, width = shape
    block = Block(protocol.build_module(mixer, width, backend, device, seed), width).to(device)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=gen).to(device, torch.bfloat16).requires_grad_()
    dy = torch.randn(*shape, generator=gen).to(device, torch.bfloat16)
    out = {"mixer": mixer, "shape": list(shape), "eager_ms": _median_ms(block, x, dy, samples)}
    for label, options in (("compiled", {}), ("reduce_overhead", {"mode": "reduce-overhead"})):
        torch._dynamo.reset()
        compiled = torch.compile(block, fullgraph=True, **options)
        t0 = time.perf_counter()
        protocol.sample(compiled, x, dy, "forward_backward")
        out[f"{label}_first_call_s"] = time.perf_counter() - t0
        out[f"{label}_ms"] = _median_ms(compiled, x, dy, samples)
    torch._dynamo.reset()
    out["backend"] = block.mixer.last_backend
    return out

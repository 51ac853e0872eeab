"""A run that goes on where it stopped: ``RunCheckpoint`` keeps a training run's state (model,
optimizer, batch generator, loss curve and timing) while it trains, so that a run stopped midway
(a command's time limit, a lost machine) goes on from its last save instead of its first step."""
from __future__ import annotations

import hashlib
import time
import warnings
from pathlib import Path

import torch

from .. import schema

# Seconds of training between two saves: a stop loses at most this much of a run, and a save
# costs about one percent of it (docs/LAB.md).
CHECKPOINT_EVERY_S = 60.0
# What a run's saved state holds (loop.train writes and reads them); a file that lacks one, or
# holds others (an older layout), is not resumed from.
STATE_KEYS = frozenset({"model", "optimizer", "generator", "losses", "curve", "timed_s",
                        "timed_tokens", "timed_steps", "gpu_ms", "decay_from", "stop_at",
                        "wall_s", "resumed_at", "attention_kernel"})


def checkpoint_file(directory: Path, key: str) -> Path:
    """The file in ``directory`` that holds the run named ``key`` while it trains."""
    return Path(directory) / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".pt")


class RunCheckpoint:
    """The state of the run named ``key`` in ``path`` (written whole or not at all), saved at a
    logging point once ``every_s`` seconds have passed since the last save (or since the run
    started).  A file that holds another run, or that cannot be read, is not resumed from.
    Runs are deterministic in their seed on a CPU, so a run resumed from here equals one that
    was never stopped; on a GPU it does to the kernels' own determinism."""

    def __init__(self, path, key: str, every_s: float = CHECKPOINT_EVERY_S):
        self.path, self.key, self.every_s = Path(path), key, float(every_s)
        self._last = time.perf_counter()
        self._loaded = None  # the last state read, until the next save

    def load(self) -> dict | None:
        """The saved state of this run (tensors on the CPU), or None."""
        if self._loaded is not None:
            return self._loaded
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception:  # noqa: BLE001 - none yet, cut short, or of another format: start again
            return None
        if not isinstance(state, dict) or state.pop("key", None) != self.key \
                or set(state) != STATE_KEYS:
            return None
        self._loaded = state
        return state

    def due(self) -> bool:
        return time.perf_counter() - self._last >= self.every_s

    def save(self, state: dict) -> None:
        """Write ``state``; a write that fails (a full disk, say) is warned of, and the run
        trains on from its previous save."""
        if set(state) != STATE_KEYS:
            raise ValueError(f"a run's state holds {sorted(STATE_KEYS)}, got {sorted(state)}")
        self._loaded = None
        try:
            schema.atomic_write(self.path,
                                lambda tmp: torch.save({**state, "key": self.key}, tmp))
        except OSError as exc:
            warnings.warn(f"{self.path}: the run's state was not saved ({exc}); it trains on "
                          "from its previous save", RuntimeWarning, stacklevel=2)
        self._last = time.perf_counter()

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        self._loaded = None


def restore(saved: dict, model, opt, generator, attention_kernel) -> bool:
    """Put ``saved``'s model, optimizer and generator state into ``model``, ``opt`` (whose
    learning rates stay the objects they are: a CUDA graph reads a tensor one) and
    ``generator``; False, with nothing changed, where the save does not fit them (other
    parameters or shapes, another attention kernel, a state that fails to load)."""
    current = model.state_dict()
    groups = saved["optimizer"].get("param_groups", [])
    if (saved["attention_kernel"] != attention_kernel
            or set(saved["model"]) != set(current)
            or any(tuple(saved["model"][k].shape) != tuple(v.shape) for k, v in current.items())
            or [len(g["params"]) for g in groups] != [len(g["params"]) for g in opt.param_groups]
            or tuple(saved["generator"].shape) != tuple(generator.get_state().shape)):
        return False
    model_before = {k: v.detach().clone() for k, v in current.items()}
    opt_before, generator_before = opt.state_dict(), generator.get_state()
    rates = [group["lr"] for group in opt.param_groups]
    try:
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        generator.set_state(saved["generator"])
        restored = True
    except (RuntimeError, ValueError, KeyError, TypeError):
        model.load_state_dict(model_before)
        opt.state.clear()
        opt.load_state_dict(opt_before)
        generator.set_state(generator_before)
        restored = False
    for group, rate in zip(opt.param_groups, rates):
        group["lr"] = rate
    return restored

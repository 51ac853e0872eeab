"""Every Triton backend timed at given shapes, beside the one ``auto`` picks there.

This is the evidence behind two claims of the calibration (SPEC section 4): that ``auto`` stays
within 1.25x of the fastest backend at shapes the calibration file lacks, and which backend
families win anywhere at all.  Each row holds a backend's GPU time (forward+backward captured
in a CUDA graph and replayed: no host in it) and its forward+backward median by the protocol's
sample (the host included).  Legality is calibration's business, not this module's."""
from __future__ import annotations

import statistics

import torch

from .. import backends, dispatch
from .. import mixers as mixers_
from ..modules import NUM_HEADS
from ..shapes import Shape
from . import protocol
from .legality import make_inputs


def triton_backends(mixer: str) -> list[str]:
    """The mixer's Triton backends, in the registry's order."""
    return backends.matching(mixer)


def time_backend(mixer: str, name: str, x, params: dict, dy, samples: int) -> dict:
    """GPU time (None off a GPU) and the forward+backward median of one backend."""
    module, xg = protocol.module_with(mixer, name, x, params)
    times = protocol.warm_samples(module, xg, dy, samples)
    return {"gpu_time_ms": protocol.graph_replay_ms(module, xg, dy),
            "median_ms": statistics.median(times)}


def backends_to_sweep(mixers, names: dict | None) -> dict[str, list[str]]:
    """{mixer: the backends to time}: ``names[mixer]`` where given, else every Triton backend;
    ValueError where ``names`` gives a mixer none (an empty list is no request for all)."""
    chosen = {m: triton_backends(m) if names is None or m not in names else list(names[m])
              for m in mixers}
    bare = [m for m, found in chosen.items() if not found]
    if bare:
        raise ValueError(f"no backend to sweep for {bare}: names gives them an empty list")
    return chosen


def sweep_shape(shape, device, mixers=None, samples: int = 5,
                names: dict | None = None, progress=None, num_heads: int = NUM_HEADS) -> list[dict]:
    """One row per (mixer, backend) at this shape (a mixer with heads at ``num_heads``, in its
    rows); ``auto`` marks the backend that ``backend="auto"`` resolves to for a BF16 x of this
    shape on this device.  ``names``: {mixer: backends} (backends_to_sweep)."""
    shape = Shape(*shape)
    chosen = backends_to_sweep(mixers if mixers is not None else mixers_.names(), names)
    rows = []
    for mixer, swept in chosen.items():
        heads = {"num_heads": num_heads} if mixers_.get(mixer).has_heads else {}
        x, params, dy = make_inputs(mixer, shape, device, num_heads=num_heads)
        auto = dispatch.resolve(mixer, x, "auto").name
        for name in swept:
            if progress:
                progress(f"{shape.key} {mixer}/{name}")
            try:
                timing = time_backend(mixer, name, x, params, dy, samples)
                error = None
            except torch.cuda.OutOfMemoryError as exc:  # a result: the backend does not fit
                timing, error = {"gpu_time_ms": None, "median_ms": None}, str(exc)[:200]
            rows.append({"shape": list(shape), "mixer": mixer, "backend": name, **heads,
                         "auto": name == auto, **timing, "error": error})
        del x, params, dy
    return rows


def auto_ratios(rows: list[dict], key: str = "gpu_time_ms") -> list[dict]:
    """Per (shape, mixer): auto's choice, the fastest backend by ``key``, and auto's time over
    the fastest's (1.0 when auto picked it)."""
    groups: dict = {}
    for row in rows:
        if row[key] is not None:
            group = (tuple(row["shape"]), row["mixer"], row.get("num_heads"))
            groups.setdefault(group, []).append(row)
    out = []
    for (shape, mixer, heads), group in groups.items():
        best = min(group, key=lambda r: r[key])
        chosen = [r for r in group if r["auto"]]
        out.append({"shape": list(shape), "mixer": mixer,
                    **({"num_heads": heads} if heads is not None else {}),
                    "fastest": best["backend"],
                    "fastest_ms": best[key],
                    "auto": chosen[0]["backend"] if chosen else None,
                    "auto_ms": chosen[0][key] if chosen else None,
                    "auto_over_fastest": chosen[0][key] / best[key] if chosen else None})
    return out

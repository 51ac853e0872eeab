"""Calibration of backends per shape (SPEC section 4): every backend's legality and time, ranked,
and the choice, merged into the calibration file that ``auto`` reads."""
from __future__ import annotations

import statistics
from datetime import datetime, timezone
from pathlib import Path

from ..modules import NUM_HEADS
from ..shapes import Shape
from .. import backends, calibration_file, dispatch, paths
from .. import mixers as mixers_
from . import protocol, schema
from .legality import check_legality, make_inputs, oracle, outputs, relative_errors


def ranking_key(entries: list[dict]) -> str:
    """What legal ``entries`` are ranked by: GPU time (CUDA-graph replay) where every one has it,
    since below L = 32768 a forward+backward's median is mostly host time; else the median."""
    if entries and all(e.get("gpu_time_ms") is not None for e in entries):
        return "gpu_time_ms"
    return "median_ms"


# How much slower than the fastest legal backend auto's choice may be, to stay within its mixer's
# memory budget (MixerSpec.memory_budget_units): 1.0 ranks by time alone.
MEMORY_TOLERANCE = 1.05


def memory_rule_text(tolerance: float = MEMORY_TOLERANCE) -> tuple[str, str]:
    """(the tolerance as a percentage, the mixers' budgets) as the README and notebook 02 write
    them: ("5", "RG-LRU 3, SAMU 2.5")."""
    budgets = ", ".join(f"{spec.label} {spec.memory_budget_units:g}"
                        for spec in map(mixers_.get, mixers_.names())
                        if spec.memory_budget_units is not None)
    return f"{round((tolerance - 1) * 100)}", budgets


def choose(legal: list[dict], key: str, budget: float | None,
           tolerance: float = MEMORY_TOLERANCE) -> tuple[str | None, str]:
    """(chosen backend, why) from ``legal`` entries timed by ``key``: the fastest, unless it
    holds more than ``budget`` units of peak memory and another entry within the budget takes
    at most ``tolerance`` times its time; then the fastest such.  Entries without a measured
    peak (a CPU) are never taken for the budget; a tolerance of 1 or less chooses by time
    alone, ties included."""
    _check_rule(legal, key, budget, tolerance)
    if not legal:
        return None, "no legal backend"
    legal = sorted(legal, key=lambda e: e[key])
    fastest = legal[0]
    peak = fastest.get("peak_units")
    if budget is None or peak is None or peak <= budget or tolerance <= 1:
        return fastest["backend"], "fastest"
    for entry in legal[1:]:
        if entry[key] > tolerance * fastest[key]:
            break
        if entry.get("peak_units") is not None and entry["peak_units"] <= budget:
            return entry["backend"], "fastest within the memory budget"
    return fastest["backend"], "fastest (none within the memory budget and the tolerance)"


def check_tolerance(tolerance) -> None:
    if not calibration_file.is_finite_number(tolerance):
        raise ValueError(f"the memory tolerance must be a finite number, got {tolerance!r}")


def _check_rule(legal: list[dict], key: str, budget, tolerance) -> None:
    """choose's numbers must be finite: a NaN compares false with everything, so a NaN time
    makes the order of the entries decide, and a NaN tolerance lets any slower entry through."""
    check_tolerance(tolerance)
    if budget is not None and not calibration_file.is_finite_number(budget):
        raise ValueError(f"choose: the memory budget must be a finite number or None, got "
                         f"{budget!r}")
    for entry in legal:
        if not calibration_file.is_finite_number(entry.get(key)):
            raise ValueError(f"choose: {entry.get('backend')}'s {key} must be a finite number, "
                             f"got {entry.get(key)!r}")
        peak = entry.get("peak_units")
        if peak is not None and not calibration_file.is_finite_number(peak):
            raise ValueError(f"choose: {entry.get('backend')}'s peak_units must be a finite "
                             f"number or None, got {peak!r}")


def finite_tolerance(text: str) -> float:
    """--memory-tolerance's type: a finite number (argparse reports the error)."""
    import argparse
    try:
        value = float(text)
        check_tolerance(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def calibrate_shape(shape, device, mixers=None, candidates: dict | None = None,
                    reps: int = 10, seed: int = 0, progress=None,
                    num_heads: int = NUM_HEADS,
                    memory_tolerance: float = MEMORY_TOLERANCE) -> dict:
    """For each mixer: legality of every candidate, the forward+backward median and, on a GPU,
    the GPU time (CUDA-graph replay) and peak memory of the legal ones, ranked (ranking_key),
    and the choice (``choose``, with the mixer's memory budget and ``memory_tolerance``).
    Reference backends are recorded as illegal without timing.  A mixer with heads is
    calibrated at ``num_heads`` (recorded in its entry)."""
    check_tolerance(memory_tolerance)  # before any timing, not after
    result = {}
    for mixer in mixers if mixers is not None else mixers_.names():
        names = candidates[mixer] if candidates else backends.available(mixer)
        spec = mixers_.get(mixer)
        x, params, dy = make_inputs(mixer, shape, device, seed, num_heads=num_heads)
        want = oracle(mixer, x, params, dy)
        eager = relative_errors(outputs(mixer, "reference_chunked", x, params, dy), want)
        entries = []
        for name in names:
            if progress:
                progress(f"{mixer}/{name}")
            # By the tensors' device: torch.device("cpu") != "cpu", and "cuda:1" is a GPU too.
            if backends.REGISTRY[mixer][name].kind == "reference" and x.device.type != "cpu":
                entries.append({"backend": name, "legal": False,
                                "reason": "materialises a state-sized transition",
                                "materialized_state_sized_transition": True})
                continue
            entry = check_legality(mixer, name, shape, device, seed, want, eager,
                                   inputs=(x, params, dy))
            entry["settings"] = backends.REGISTRY[mixer][name].settings
            if entry["legal"]:
                module, xg = protocol.module_with(mixer, name, x, params)
                samples = protocol.warm_samples(module, xg, dy, reps)
                entry["forward_backward_ms"] = samples
                entry["median_ms"] = statistics.median(samples)
                entry["gpu_time_ms"] = protocol.graph_replay_ms(module, xg, dy)  # None: CPU
                peak = protocol.peak_allocated_delta(module, xg, dy)  # None: CPU
                if peak is not None:
                    entry["peak_allocated_delta_bytes"] = peak
                    entry["peak_units"] = protocol.memory_units(peak, shape)
                del module, xg
            entries.append(entry)
        del want
        legal = [e for e in entries if e["legal"]]
        key = ranking_key(legal)
        legal.sort(key=lambda e: e[key])
        chosen, chosen_by = choose(legal, key, spec.memory_budget_units, memory_tolerance)
        result[mixer] = {
            "ranking": [e["backend"] for e in legal],
            "chosen": chosen,
            "chosen_by": chosen_by,
            "ranked_by": key,
            "memory_budget_units": spec.memory_budget_units,
            "memory_tolerance": memory_tolerance,
            **({"num_heads": num_heads} if spec.has_heads else {}),
            "backends": entries,
        }
    return result


def merge_calibration(slug: str, shape, result: dict, environment: dict,
                      path: Path | None = None) -> dict:
    """Merge one shape's result into data/calibration/<slug>.json (or ``path``), atomically:
    each mixer in ``result`` replaces that mixer's entry at the shape; the others' stay.

    The read-modify-write holds the file's lock, so concurrent calibrations of other shapes
    lose nothing; the merged document is checked as ``auto`` will check it before it is
    written, so a bad result leaves the file as it was.  Other shapes' entries calibrated with
    other launch settings are let through (auto refuses them; recalibrating replaces them);
    the result itself must carry its backends' current settings.  A symlinked file is written
    through to its target, and the link stays."""
    path = Path(path) if path is not None else paths.calibration_file(slug)
    with calibration_file.locked(path):
        try:
            doc = calibration_file.read(path)  # a directory or symlink loop there is refused
        except FileNotFoundError:  # no file yet, or a symlink to one not written yet
            doc = {"gpu": environment.get("gpu"), "shapes": {}}
        else:
            dispatch.check_calibration(doc, path, check_settings=False)  # nor on a broken one
        doc["environment"] = environment
        doc["updated"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        key = Shape.of(shape).key
        dispatch.check_calibration({"shapes": {key: result}}, path)
        doc["shapes"].setdefault(key, {}).update(result)  # other mixers' entries stay
        dispatch.check_calibration(doc, path, check_settings=False)
        schema.write_json_atomic(path, doc, kind="calibration")
    dispatch.forget_calibration()
    return doc


def main(argv=None) -> int:
    """Calibrate shapes into this device's calibration file, one shape at a time (each merged
    as it finishes, so a run cut short keeps what it measured)."""
    import argparse

    from . import benchmark_cli
    parser = argparse.ArgumentParser(prog="python -m samu.experiment.calibration",
                                     description=" ".join(main.__doc__.split()))
    parser.add_argument("shapes", nargs="+", help="BxLxD shapes")
    parser.add_argument("--mixers", nargs="+", choices=mixers_.names(), default=None,
                        action=benchmark_cli.Distinct,
                        help="the mixers to calibrate (default: every one)")
    parser.add_argument("--heads", type=benchmark_cli.positive_int, default=NUM_HEADS,
                        help=f"gate blocks of a mixer with heads (default {NUM_HEADS})")
    parser.add_argument("--reps", type=benchmark_cli.positive_int, default=10,
                        help="timed forward+backward samples per backend (default 10)")
    parser.add_argument("--backends", nargs="+", help="only these backends (default: all)")
    parser.add_argument("--memory-tolerance", type=finite_tolerance, default=MEMORY_TOLERANCE,
                        help="how much slower than the fastest a choice within its mixer's "
                             f"memory budget may be (default {MEMORY_TOLERANCE}; 1 ranks by "
                             "time alone)")
    args = parser.parse_args(argv)
    chosen_mixers = args.mixers or mixers_.names()
    candidates = (benchmark_cli.backends_named(parser, args.backends,
                                               {m: backends.available(m) for m in chosen_mixers})
                  if args.backends else None)
    shapes = benchmark_cli.shapes_given(parser, args.shapes)  # a malformed one exits naming it
    # Refused before any shape is calibrated and written.
    benchmark_cli.check_heads_divide(parser, args.heads, shapes, chosen_mixers)
    device = benchmark_cli.kernel_device("python -m samu.experiment.calibration")
    slug = protocol.device_slug(device)
    environment = protocol.environment(device)
    try:  # a broken file is refused before any backend is timed, not after
        dispatch.check_calibration(calibration_file.read(paths.calibration_file(slug)),
                                   paths.calibration_file(slug), check_settings=False)
    except FileNotFoundError:
        pass
    except calibration_file.CalibrationFileError as exc:
        parser.exit(1, f"python -m samu.experiment.calibration: {exc}\n")
    for shape in shapes:
        result = calibrate_shape(shape, device, args.mixers, candidates, reps=args.reps,
                                 num_heads=args.heads, memory_tolerance=args.memory_tolerance)
        merge_calibration(slug, shape, result, environment)
        for mixer, entry in result.items():
            times = {e["backend"]: e.get(entry["ranked_by"]) for e in entry["backends"]
                     if e["legal"]}
            ranking = ", ".join(f"{name} {times[name]:.3f}" for name in entry["ranking"])
            peaks = {e["backend"]: e.get("peak_units") for e in entry["backends"] if e["legal"]}
            held = ", ".join(f"{name} {peaks[name]:.2f}" for name in entry["ranking"]
                             if peaks[name] is not None)
            print(f"{shape.key} {mixer}: chosen {entry['chosen']} ({entry['chosen_by']}; by "
                  f"{entry['ranked_by']}, ms: {ranking}" + (f"; peak units: {held}" if held
                                                            else "") + ")", flush=True)
    print("wrote", paths.relative(paths.calibration_file(slug)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

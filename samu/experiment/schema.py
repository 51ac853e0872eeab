"""Result schema version 1 (SPEC section 6) as a JSON Schema document, and atomic JSON writes.

The published H800 result file is the schema by example: every key it has is required with the
same meaning; extra keys are allowed.  Validation uses the ``jsonschema`` package.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Callable

import jsonschema

from .. import mixers

SCHEMA_VERSION = 1
SAMPLES_PER_ROUND = 5
ROUNDS = 2

_number = {"type": "number"}
# The registered mixers (samu.mixers), filled in again before each validation: a mixer added
# with samu.backends.registered_mixer validates like the others.
_MIXERS: list = []
_MODEL_MIXERS: list = []  # the training study's: attention and the registered mixers
_count = {"type": "integer", "minimum": 0}
_samples = {"type": "array", "items": _number, "minItems": SAMPLES_PER_ROUND * ROUNDS,
            "maxItems": SAMPLES_PER_ROUND * ROUNDS}
_round_samples = {"type": "array", "items": _number, "minItems": SAMPLES_PER_ROUND,
                  "maxItems": SAMPLES_PER_ROUND}
_stats = {
    "type": "object",
    "required": ["samples_ms", "median_ms", "mean_ms", "std_ms", "minimum_ms", "maximum_ms"],
    "properties": {"samples_ms": _samples, "median_ms": _number, "mean_ms": _number,
                   "std_ms": _number, "minimum_ms": _number, "maximum_ms": _number},
}
_rounds = {"type": "array", "minItems": ROUNDS, "maxItems": ROUNDS, "items": {
    "type": "object",
    "required": ["round", "order_index", "forward_ms", "backward_ms", "forward_backward_ms"],
    "properties": {"round": _count, "order_index": _count, "forward_ms": _round_samples,
                   "backward_ms": _round_samples, "forward_backward_ms": _round_samples}}}
_maybe_number = {"type": ["number", "null"]}  # null: not measured on this device
# A public pipeline timed beside the row's mixer in the same rounds (samu.experiment.peers);
# speedup is its forward+backward median over the row's.
_peer = {
    "type": "object",
    "required": ["pipeline", "forward", "backward", "forward_backward", "rounds", "speedup",
                 "materialized_state_sized_transition"],
    "properties": {"pipeline": {"type": "string"}, "fla_core": {"type": ["string", "null"]},
                   "forward": _stats, "backward": _stats, "forward_backward": _stats,
                   "rounds": _rounds, "gpu_time_ms": _maybe_number,
                   "host": {"type": ["object", "null"]}, "speedup": _number,
                   "materialized_state_sized_transition": {"type": "boolean"}},
}
PEER_NAME = "^[a-z][a-z0-9_]*$"  # a name that can stand in a column's name
# Rows written before there were several peers held one, this one, as "peer", with its speedup
# beside it as "speedup_vs_peer"; read_valid_json turns them into "peers".
SINGLE_PEER = "fla_chunk_hgrn"
_row = {
    "type": "object",
    "required": ["shape", "architecture", "backend", "controller", "forward", "backward",
                 "forward_backward", "rounds", "peak_allocated_delta_bytes",
                 "peak_reserved_delta_bytes", "peak_allocated_bytes", "peak_reserved_bytes",
                 "baseline_allocated_bytes", "baseline_reserved_bytes", "parameters",
                 "parameter_bytes", "dynamic_control_values_per_token",
                 "materialized_state_sized_transition"],
    "properties": {
        "shape": {"type": "object", "required": ["batch", "length", "width"],
                  "properties": {k: {"type": "integer", "minimum": 1}
                                 for k in ("batch", "length", "width")}},
        "architecture": {"enum": _MIXERS},
        "backend": {"type": "string"},
        "controller": {"type": ["string", "null"]},
        "forward": _stats, "backward": _stats, "forward_backward": _stats,
        "rounds": _rounds,
        **{k: {"type": "integer"} for k in ("peak_allocated_delta_bytes",
                                            "peak_reserved_delta_bytes")},
        **{k: _count for k in ("peak_allocated_bytes", "peak_reserved_bytes",
                               "baseline_allocated_bytes", "baseline_reserved_bytes",
                               "parameters", "parameter_bytes",
                               "dynamic_control_values_per_token")},
        "materialized_state_sized_transition": {"type": "boolean"},
        "peers": {"type": "object", "propertyNames": {"pattern": PEER_NAME},
                  "additionalProperties": _peer},
    },
}
_environment = {"type": "object", "required": ["torch", "cuda", "gpu"]}
RESULT_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "samu result document, schema version 1",
    "type": "object",
    "required": ["schema_version", "protocol", "environment", "rows"],
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "protocol": {"type": "object",
                     "required": ["scope", "dtype", "input_gradient", "order",
                                  "compile_excluded", "baseline_policy", "samu_policy",
                                  "resets"]},
        "environment": _environment,
        "rows": {"type": "array", "minItems": 1, "items": _row},
    },
}
CALIBRATION_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["gpu", "shapes", "environment"],
    "properties": {"shapes": {"type": "object", "additionalProperties": {
        "type": "object", "additionalProperties": {
            "type": "object", "required": ["ranking", "chosen", "backends"],
            "properties": {"ranking": {"type": "array", "items": {"type": "string"}},
                           "chosen": {"type": ["string", "null"]},
                           "backends": {"type": "array"}}}}}},
}
CORRECTNESS_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["shape", "environment", "mixers"],
}
# The training study (samu.experiment.training, notebook 05): one run per (task, mixer, seed,
# sequence length).  A non-finite number is written as a string ("nan", "inf", "-inf").
_real = {"anyOf": [{"type": "number"}, {"enum": ["nan", "inf", "-inf"]}]}
# The study's tasks and metrics: its tables (samu.experiment.training.tasks) register here when
# they are imported, and validation fills these in from them, so that a task added to the table
# validates like the others.  Until then a task or metric is any name.
_TRAINING_TABLES: dict = {}
_task = {"type": "string", "pattern": PEER_NAME}
_metric = {"type": "string", "pattern": PEER_NAME}


def register_training_tables(tasks: Callable[[], list], metrics: Callable[[], list]) -> None:
    """Where the training schema reads its task and metric names: ``tasks()`` and
    ``metrics()``, called before each validation."""
    _TRAINING_TABLES.update(tasks=tasks, metrics=metrics)


_training_run = {
    "type": "object",
    "required": ["task", "mixer", "seed", "seq_len", "parameters", "parameter_counts",
                 "loss_curve", "metric", "value", "eval_loss", "chance", "tokens_per_s", "steps",
                 "steps_completed", "stopped_by_time", "diverged", "backend"],
    "properties": {
        "task": _task,
        "mixer": {"enum": _MODEL_MIXERS},
        "seed": {"type": "integer"},
        "seq_len": {"type": "integer", "minimum": 1},
        "parameters": {"type": "integer", "minimum": 1},
        "parameter_counts": {"type": "object", "required": ["total"],
                             "additionalProperties": _count},
        "loss_curve": {"type": "array", "minItems": 1, "items": {
            "type": "array", "minItems": 2, "maxItems": 2,
            "prefixItems": [{"type": "integer", "minimum": 1}, _real]}},
        "metric": _metric,
        "value": _real, "eval_loss": _real, "tokens_per_s": _real,
        "chance": _number,
        "steps": {"type": "integer", "minimum": 1},
        "steps_completed": {"type": "integer", "minimum": 1},
        "stopped_by_time": {"type": "boolean"},
        "diverged": {"type": "boolean"},
        "stopped_early": {"type": "boolean"},  # optional: solved before its last step
        # optional: the steps a run stopped midway went on from (its RunCheckpoint)
        "resumed_at": {"type": "array", "items": {"type": "integer", "minimum": 1}},
        # optional: a "wsd" schedule's run, the step its decay started at (else null)
        "decay_from": {"type": ["integer", "null"], "minimum": 0},
        "backend": {"type": "array", "items": {"type": ["string", "null"]}},
        # Optional: absent from documents of the earlier study (one rate, bare mixers).
        "lr": _number,
        "lr_sweep": {"type": "array", "items": _number},
        "mixer_parameters": {"type": "integer", "minimum": 0},
        "wall_ms_per_step": _real,
        "gpu_ms_per_step": {"anyOf": [_real, {"type": "null"}]},  # null: not on CUDA
        # Optional: the configuration's speed timed alone on the device (the study's speed),
        # and how many runs shared the device with this one.
        "solo_wall_ms_per_step": _real, "solo_tokens_per_s": _real, "solo_train_s": _real,
        "solo_gpu_ms_per_step": {"anyOf": [_real, {"type": "null"}]},
        "concurrent_runs": {"type": "integer", "minimum": 1},
    },
}
TRAINING_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "samu training-study document",
    "type": "object",
    "required": ["schema_version", "kind", "environment", "study", "runs"],
    # Runs of the tasks, or the recall curves' alone (a study of the curves only).
    "anyOf": [{"properties": {"runs": {"minItems": 1}}},
              {"required": ["recall_curves"], "properties": {"recall_curves": {"minItems": 1}}}],
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "kind": {"const": "training"},
        "environment": {"type": "object",
                        "required": ["torch", "cuda", "gpu", "triton", "python", "git_commit",
                                     "date", "device", "dtype"]},
        "study": {"type": "object", "required": ["mixers", "seeds", "tasks", "train"]},
        "runs": {"type": "array", "items": _training_run},
        # Optional: how the runs shared the devices, and the throughput that gained.
        "concurrency": {"type": "object", "required": ["workers", "devices", "phases"]},
        # Optional: the parts a merged document was run in, each with its environment.
        "parts": {"type": "array", "items": {"type": "object",
                                             "required": ["part", "environment"]}},
        # Optional: every (task, length, mixer) configuration's step timed alone, one after
        # another in the command that merged the parts (the parts' runs timed on their own
        # machines), with that command's environment.
        "side_by_side": {"type": "object", "required": ["environment", "steps", "rows"],
                         "properties": {"rows": {"type": "array", "minItems": 1, "items": {
                             "type": "object",
                             "required": ["task", "seq_len", "mixer", "wall_ms_per_step",
                                          "gpu_ms_per_step", "tokens_per_s"],
                             "properties": {
                                 "wall_ms_per_step": _real, "tokens_per_s": _real,
                                 "gpu_ms_per_step": {"anyOf": [_real, {"type": "null"}]}}}}}},
        # Optional: the sanity bars the merge filled in for runs that ran before their task
        # recorded one, by task, in words.
        "bars_recorded": {"type": "object", "additionalProperties": {"type": "string"}},
        # Optional: MQAR runs of the recall curves, each with its width and key-value pairs
        # (documents of the earlier curves name the pairs in task_options, and add the curve,
        # "pairs" or "width", and its x).
        "recall_curves": {"type": "array", "items": {
            "allOf": [_training_run, {"type": "object", "required": ["width"],
                                      "properties": {"curve": {"enum": ["pairs", "width"]},
                                                     "x": {"type": "integer", "minimum": 1},
                                                     "pairs": {"type": "integer", "minimum": 1},
                                                     "width": {"type": "integer",
                                                               "minimum": 1}}}]}},
    },
}
# Packed sequences, decode steps and torch.compile (samu.experiment.features).
_timed = {"type": "object", "required": ["forward_backward_median_ms", "gpu_time_ms"],
          "properties": {"forward_backward_median_ms": _number, "gpu_time_ms": _maybe_number}}
FEATURES_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "samu state-keyword, decode and compile timings",
    "type": "object",
    "required": ["environment", "packing", "decode", "compile"],
    "properties": {
        "environment": _environment,
        "packing": {"type": "array", "items": {
            "type": "object",
            "required": ["mixer", "backend", "shape", "lengths", "packed", "unpacked",
                         "one_by_one"],
            "properties": {"lengths": {"type": "array", "items": {"type": "integer",
                                                                    "minimum": 1}},
                           "packed": _timed, "unpacked": _timed, "one_by_one": _timed,
                           "with_states": _timed}}},
        "decode": {"type": "array", "items": {
            "type": "object", "required": ["mixer", "batch", "host_us_per_step",
                                           "gpu_us_per_step", "backend"],
            "properties": {"host_us_per_step": _number,
                           "gpu_us_per_step": _maybe_number,
                           "one_launch": {"type": "boolean"},
                           "linear_forward_backward_us": _maybe_number,
                           "step_over_linear": _maybe_number}}},
        "compile": {"type": "array", "items": {
            "type": "object", "required": ["mixer", "shape", "eager_ms", "compiled_ms",
                                           "reduce_overhead_ms", "backend"],
            "properties": {k: _number for k in ("eager_ms", "compiled_ms",
                                                "reduce_overhead_ms")}}},
    },
}
# Every Triton backend timed at given shapes beside auto's choice (samu.experiment.sweep).
SWEEP_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "samu backend sweep",
    "type": "object",
    "required": ["environment", "calibration", "rows", "auto"],
    "properties": {
        "environment": _environment,
        "calibration": {"type": "object", "required": ["path", "shapes"]},
        "rows": {"type": "array", "items": {
            "type": "object",
            "required": ["shape", "mixer", "backend", "auto", "gpu_time_ms", "median_ms"],
            "properties": {"auto": {"type": "boolean"}, "gpu_time_ms": _maybe_number,
                           "median_ms": _maybe_number}}},
        "auto": {"type": "array", "items": {
            "type": "object", "required": ["shape", "mixer", "fastest", "auto",
                                           "auto_over_fastest"]}},
    },
}
# Context parallelism on one GPU (benchmarks/bench_context_parallel.py; notebook 04 draws it),
# its legality check over processes (--check) and its real multi-process timing (--distributed).
_times_ms = {"type": "array", "minItems": 1, "items": _real}
_cp_case = {"mixer": {"enum": _MIXERS}, "length": {"type": "integer", "minimum": 1},
            "width": {"type": "integer", "minimum": 1}, "ranks": {"type": "integer",
                                                                 "minimum": 1}}


def _context_parallel_rows(title: str, required: list, properties: dict) -> dict:
    """A context-parallel timing document: its environment, protocol and one row per (mixer,
    length, width, ranks) with ``required`` and ``properties`` beside those."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": title,
        "type": "object",
        "required": ["environment", "protocol", "rows"],
        "properties": {
            "environment": _environment,
            "protocol": {"type": "object"},
            "rows": {"type": "array", "items": {
                "type": "object", "required": [*_cp_case, *required],
                "properties": {**_cp_case, **properties}}},
        },
    }


CONTEXT_PARALLEL_SCHEMA = _context_parallel_rows(
    "samu context parallelism on one GPU",
    ["backend", "one_call_at_length_ms", "one_call_at_slice_ms", "rank_ms", "slowest_rank_ms",
     "slowest_rank_over_slice_call", "speedup_over_one_call"],
    {"rank_ms": _times_ms,
     **{k: _real for k in ("one_call_at_length_ms", "one_call_at_slice_ms", "slowest_rank_ms",
                           "slowest_rank_over_slice_call", "speedup_over_one_call")},
     **{k: _maybe_number for k in ("one_call_at_slice_gpu_ms", "slowest_rank_gpu_ms",
                                   "slowest_rank_over_slice_call_gpu")}})
CONTEXT_PARALLEL_DISTRIBUTED_SCHEMA = _context_parallel_rows(
    "samu context parallelism, each rank its own process",
    ["rank_ms", "call_at_slice_ms", "all_gather_ms", "slowest_rank_ms",
     "slowest_rank_over_slice_call"],
    {"rank_ms": _times_ms, "call_at_slice_ms": _times_ms, "all_gather_ms": _times_ms,
     "slowest_rank_ms": _real, "slowest_rank_over_slice_call": _real})
CONTEXT_PARALLEL_CHECK_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "samu context parallelism against one call, over processes",
    "type": "object",
    "required": ["environment", "cases"],
    "properties": {
        "environment": _environment,
        "cases": {"type": "array", "minItems": 1, "items": {
            "type": "object",
            "required": ["case", "ranks", "slices", "backends", "errors", "bounds", "legal"],
            "properties": {"ranks": {"type": "integer", "minimum": 1},
                           "errors": {"type": "object", "additionalProperties": _real},
                           "bounds": {"type": "object", "additionalProperties": _real},
                           "legal": {"type": "boolean"}}}},
    },
}
# One measurement of a benchmark (samu.experiment.benchmark_rows): a JSON line.  A value is a
# number, a boolean, null (not measured here) or "inf"/"nan" as _finite writes them.
_name = {"type": "string", "pattern": "^[a-z][a-z0-9_]*$"}
BENCHMARK_ROW_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "samu benchmark row",
    "type": "object",
    "required": ["format", "benchmark", "gpu", "commit", "mixer", "configuration", "shape",
                 "values", "units", "environment"],
    "properties": {
        "format": {"const": 1},
        "benchmark": _name,
        "gpu": {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]*$"},
        "commit": {"type": ["string", "null"]},
        "mixer": {"anyOf": [{"enum": _MIXERS}, {"type": "null"}]},
        "configuration": {"type": "object"},
        "shape": {"type": "object", "minProperties": 1,
                  "additionalProperties": {"type": "integer", "minimum": 1}},
        "values": {"type": "object", "minProperties": 1, "propertyNames": _name,
                   "additionalProperties": {"anyOf": [
                       {"type": ["number", "boolean", "null"]},
                       {"enum": ["inf", "-inf", "nan"]}]}},
        "units": {"type": "object", "additionalProperties": {"type": "string", "minLength": 1}},
        "environment": _environment,
    },
}
SCHEMAS = {"result": RESULT_SCHEMA, "calibration": CALIBRATION_SCHEMA,
           "correctness": CORRECTNESS_SCHEMA, "training": TRAINING_SCHEMA,
           "features": FEATURES_SCHEMA, "sweep": SWEEP_SCHEMA,
           "benchmark_row": BENCHMARK_ROW_SCHEMA, "training_run": _training_run,
           "context_parallel": CONTEXT_PARALLEL_SCHEMA,
           "context_parallel_check": CONTEXT_PARALLEL_CHECK_SCHEMA,
           "context_parallel_distributed": CONTEXT_PARALLEL_DISTRIBUTED_SCHEMA}


def _fill_tables() -> None:
    """The registered mixers, and the training study's tasks and metrics, into the schemas."""
    _MIXERS[:] = mixers.names()
    _MODEL_MIXERS[:] = ["attention", *mixers.names()]
    for node, key in ((_task, "tasks"), (_metric, "metrics")):
        if key in _TRAINING_TABLES:
            node.clear()
            node["enum"] = list(_TRAINING_TABLES[key]())


def validate(doc: dict, kind: str = "result") -> None:
    """Raise jsonschema.ValidationError naming the first problem."""
    _fill_tables()
    jsonschema.validate(doc, SCHEMAS[kind])


def validator(kind: str):
    """A validator of ``kind``'s documents for many checks (``is_valid``): jsonschema.validate
    checks the schema itself on every call, tens of ms.  It holds the mixers, tasks and metrics
    registered now."""
    _fill_tables()
    return jsonschema.validators.validator_for(SCHEMAS[kind])(SCHEMAS[kind])


def _finite(obj):
    """JSON has no inf/nan: write them as strings so files stay valid JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


# Mode of a file that did not exist before; an existing file keeps its own (mkstemp's 0600
# would otherwise replace it).
NEW_FILE_MODE = 0o644


def atomic_write(path, write: Callable[[Path], object]) -> Path:
    """``write(tmp)`` writes the whole file to ``tmp``, a temporary ``.<name>.<random>.tmp``
    beside ``path``, which is then renamed into place: a reader never sees a half-written file,
    and an exception leaves the old file untouched and no temporary behind (a killed process
    can still leave one; .gitignore ignores them).  Where ``path`` is a symlink, the write goes
    through to its final target, so that the link and whatever else shares the target stay."""
    given = Path(path)
    path = Path(os.path.realpath(given))  # renaming onto the link would replace the link
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = NEW_FILE_MODE
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return given


def write_json_atomic(path, doc: dict, kind: str | None = "result") -> Path:
    """Validate, then write atomically (atomic_write)."""
    doc = _finite(doc)
    if kind:
        validate(doc, kind)

    def dump(tmp: Path) -> None:
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")

    return atomic_write(path, dump)


def read_json(path) -> dict:
    with open(path) as f:
        return json.load(f)


class ResultFileError(ValueError):
    """A result file that cannot be read as JSON or does not match its schema; the message names
    the file and what is wrong with it."""

    def __init__(self, path, problem: str):
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


def with_peers(doc: dict) -> dict:
    """A result document whose rows hold their public pipelines as "peers": a row of the single
    peer form ("peer", "speedup_vs_peer") is turned in place into {SINGLE_PEER: that peer, with
    its speedup}."""
    rows = doc.get("rows") if isinstance(doc, dict) else None
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict) and isinstance(row.get("peer"), dict) and "peers" not in row:
            peer = row.pop("peer")
            if "speedup_vs_peer" in row:  # else the schema names the missing speedup
                peer["speedup"] = row.pop("speedup_vs_peer")
            row["peers"] = {SINGLE_PEER: peer}
    return doc


def read_valid_json(path, kind: str = "result") -> dict:
    """The document in ``path``, validated against the ``kind`` schema (a result document in
    its current form, with_peers); ResultFileError names the file when it is not JSON (truncated,
    say) or not a valid document."""
    try:
        doc = read_json(path)
    except json.JSONDecodeError as exc:
        raise ResultFileError(path, f"not valid JSON ({exc.msg} at line {exc.lineno}, column "
                                    f"{exc.colno})") from exc
    except UnicodeDecodeError as exc:
        raise ResultFileError(path, f"not valid JSON (not UTF-8 text: {exc.reason})") from exc
    try:
        if kind == "result":
            with_peers(doc)
        validate(doc, kind)
    except jsonschema.ValidationError as exc:
        raise ResultFileError(path, f"not a valid {kind} document: {exc.message} (at "
                                    f"{exc.json_path})") from exc
    return doc

"""The study's tasks, all generated on the fly from fixed seeds (nothing is downloaded):

- ``MQAR``, multi-query associative recall (Zoology): key-value pairs, then every key queried
  once among noise tokens; loss and accuracy only where the answer is due.
- ``SelectiveCopy``: data tokens scattered among noise tokens, then a separator and one marker per
  data token; at the markers the model must give the data tokens in order.
- ``CharLM``: bytes of the Python standard library's own ``*.py`` files (present wherever Python
  is), split into training and validation; bits per character on validation.
"""
from __future__ import annotations

import hashlib
import math
import platform
import re
import sysconfig
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

import torch

from .. import schema
from .parameters import COUNT, ParameterError, Range, check_int

IGNORE = -100  # targets that carry no loss
# The held-out examples of the synthetic tasks come from this seed, whatever the training seed:
# every mixer and seed is scored on the same examples.
EVAL_SEED = 2_147_483_647


# --- the tables: metrics and tasks ---------------------------------------------------------------

@dataclass(frozen=True)
class Metric:
    """How a task is scored.  name: the key (result files); label: the axis's words;
    higher_is_better: its direction; unit: what follows a value in text ("" for a fraction);
    value: (mean loss in nats over the scored positions, fraction of them right) -> the score."""
    name: str
    label: str
    higher_is_better: bool
    unit: str
    value: Callable[[float, float], float]


METRIC_TABLE: dict[str, Metric] = {m.name: m for m in (
    Metric("accuracy", "held-out accuracy\n(higher is better)", True, "",
           lambda loss, right: right),
    Metric("bits_per_char", "held-out bits per character\n(lower is better)", False,
           " bits/char", lambda loss, right: loss / math.log(2)),
)}


@dataclass(frozen=True)
class TaskSpec:
    """A training task, defined once: every module of the study reads it from ``TASKS``.

    name: the key (study parameters, result files).
    label: its name in tables, figures and the conclusion.
    metric: the key of its score in METRIC_TABLE.
    data: the task's class, ``data(seq_len, **options)``, a frozen dataclass with ``name``,
        ``vocab_size``, ``chance``, ``batch(batch_size, generator)`` -> (inputs, targets) int64
        [batch, seq_len] (targets IGNORE where nothing is scored), ``held_out(batches,
        batch_size)`` and ``preview()`` (a few lines that show an example); optionally
        ``values_baseline`` (an accuracy reached before the task is learned), ``yardstick_bar``
        (the score attention must beat to pass the sanity bar on it, where the task sets one
        rather than the study) and ``data_info()`` (what the result document records about its
        data).
    options: the numeric options it takes and what each may be (its other fields, such as a
        corpus root, are passed through to ``data``).
    sanity: attention must pass a sanity bar on it, at its shortest length, before the study
        compares mixers on it: the task's ``yardstick_bar`` where it has one, else the study's
        sanity_bar (an accuracy).
    description: notebook 05's words on it (Markdown).
    """
    name: str
    label: str
    metric: str
    data: type
    options: Mapping = field(default_factory=dict)
    sanity: bool = False
    description: str = ""

    def __post_init__(self):
        if self.metric not in METRIC_TABLE:
            raise ValueError(f"task {self.name!r}: unknown metric {self.metric!r}; choose one "
                             f"of {list(METRIC_TABLE)}")

    @property
    def scored_by(self) -> Metric:
        return METRIC_TABLE[self.metric]


class _View(Mapping):
    """{task: what ``pick(spec)`` gives} over the current TASKS, read when looked up."""

    def __init__(self, pick):
        self._pick = pick

    def __getitem__(self, name):
        return self._pick(TASKS[name])

    def __iter__(self):
        return iter(list(TASKS))

    def __len__(self):
        return len(TASKS)


def task_spec(name) -> TaskSpec:
    """The spec of task ``name``, or ParameterError listing the tasks there are."""
    spec = TASKS.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ParameterError(f"unknown task {name!r}; choose one of {list(TASKS)}")
    return spec


def metric_of(task) -> Metric:
    """The metric that scores a task object (its spec's)."""
    return task_spec(task.name).scored_by


@contextmanager
def registered_task(spec: TaskSpec):
    """A task in TASKS for the length of the ``with`` block (a new task tried out, a test's
    toy one); it leaves when the block does."""
    if spec.name in TASKS:
        raise ValueError(f"task {spec.name!r} is registered already")
    TASKS[spec.name] = spec
    try:
        yield spec
    finally:
        TASKS.pop(spec.name, None)


def seeded_generator(seed: int, device="cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(int(seed))


def distinct(rows: int, population: int, count: int, generator,
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


# The options of each task and what each may be (its spec's; the class checks them too).
MQAR_OPTIONS = {"num_pairs": COUNT, "vocab_size": COUNT,
                "power_a": Range(low=0, high=1, low_open=True, optional=True),
                "episodes": COUNT}
COPY_OPTIONS = {"num_tokens": COUNT, "data_vocab": COUNT, "noise_vocab": COUNT}


def _check_options(task) -> None:
    """A task object's seq_len and each numeric option of its spec against its range."""
    check_int(task.name, "seq_len", task.seq_len)
    for key, allowed in task_spec(task.name).options.items():
        allowed.check(f"{task.name}: {key}", getattr(task, key))


PREVIEW_TOKENS = 128  # a long example is shown by its start


def _preview(task) -> str:
    """One example: its inputs, then its targets (IGNORE where nothing is scored); of a sequence
    longer than PREVIEW_TOKENS, its first PREVIEW_TOKENS."""
    x, y = task.batch(1, torch.Generator().manual_seed(0))
    shown = min(task.seq_len, PREVIEW_TOKENS)
    more = f"\n(the first {shown} of {task.seq_len} tokens)" if shown < task.seq_len else ""
    return f"inputs  {x[0, :shown].tolist()}\ntargets {y[0, :shown].tolist()}{more}"


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
    ``power_a=None`` draws them uniformly instead.  ``episodes`` > 1: the sequence is that many
    such blocks of ``seq_len / episodes`` tokens back to back, ``num_pairs`` pairs each, keys
    distinct over the whole sequence, so that each block's queries ask for its own pairs: recall
    at a long length with a short one's supervision per token (``num_pairs * episodes`` scored
    positions a sequence)."""
    seq_len: int
    num_pairs: int = 8
    vocab_size: int = 256
    power_a: float | None = 0.01
    episodes: int = 1
    name = "mqar"

    def __post_init__(self):
        _check_options(self)
        half = self.vocab_size // 2
        keys = self.num_pairs * self.episodes
        if half - 1 < keys or self.vocab_size - half < self.num_pairs:
            raise ParameterError(f"mqar: vocab_size {self.vocab_size} holds fewer than "
                                 f"{keys} distinct keys (1 .. vocab/2 - 1; num_pairs "
                                 f"{self.num_pairs} times episodes {self.episodes}) or "
                                 f"{self.num_pairs} values")
        if self.seq_len % self.episodes:
            raise ParameterError(f"mqar: seq_len {self.seq_len} is not a whole number of "
                                 f"episodes ({self.episodes})")
        if (self.episode_len - 2 * self.num_pairs) // 2 < self.num_pairs:
            what = "seq_len" if self.episodes == 1 else "an episode (seq_len / episodes)"
            raise ParameterError(f"mqar: {what} {self.episode_len} is too short for "
                                 f"{self.num_pairs} pairs and their queries (at least "
                                 f"{4 * self.num_pairs})")

    @property
    def episode_len(self) -> int:
        return self.seq_len // self.episodes

    @property
    def chance(self) -> float:
        return 1.0 / (self.vocab_size - self.vocab_size // 2)

    @property
    def values_baseline(self) -> float:
        """The accuracy of guessing among the values present in the sequence (in its episode,
        with episodes), which a model reaches before it binds keys to values: 1 / num_pairs."""
        return 1.0 / self.num_pairs

    def batch(self, batch_size: int, generator: torch.Generator):
        """(inputs, targets), int64 [batch_size, seq_len], on the generator's device."""
        p, v, length = self.num_pairs, self.vocab_size, self.episode_len
        b = batch_size * self.episodes  # one row an episode, joined into sequences at the end
        half = v // 2
        keys = (distinct(batch_size, half - 1, p * self.episodes, generator) + 1).reshape(b, p)
        values = distinct(b, v - half, p, generator) + half
        inputs = torch.randint(half, v, (b, length), generator=generator, device=generator.device)
        inputs[:, :2 * p] = torch.stack((keys, values), dim=2).reshape(b, 2 * p)
        slots = distinct(b, (length - 2 * p) // 2, p, generator, self.slot_weights())
        query = 2 * p + 2 * slots  # where key i is queried
        inputs.scatter_(1, query, keys)
        targets = torch.full_like(inputs, IGNORE).scatter_(1, query, values)
        return (inputs.reshape(batch_size, self.seq_len),
                targets.reshape(batch_size, self.seq_len))

    def slot_weights(self) -> torch.Tensor | None:
        """Unnormalised log-probabilities of the query slots (None: uniform)."""
        if self.power_a is None:
            return None
        space = (self.episode_len - 2 * self.num_pairs) // 2
        return (self.power_a - 1) * torch.log(torch.arange(1, space + 1, dtype=torch.float32))

    def held_out(self, batches: int, batch_size: int):
        g = seeded_generator(EVAL_SEED)
        return [self.batch(batch_size, g) for _ in range(batches)]

    preview = _preview


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
    SEPARATOR = 0
    MARKER = 1

    def __post_init__(self):
        _check_options(self)
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
        positions = distinct(b, self.body, k, generator).sort(dim=1).values
        inputs = torch.randint(2 + self.data_vocab, self.vocab_size, (b, self.seq_len),
                               generator=generator, device=device)
        inputs.scatter_(1, positions, data)
        inputs[:, self.body] = self.SEPARATOR
        inputs[:, self.body + 1:] = self.MARKER
        targets = torch.full_like(inputs, IGNORE)
        targets[:, self.body + 1:] = data
        return inputs, targets

    def held_out(self, batches: int, batch_size: int):
        g = seeded_generator(EVAL_SEED)
        return [self.batch(batch_size, g) for _ in range(batches)]

    preview = _preview


# --- the standard-library corpus -----------------------------------------------------------------

# The validation split holds whole folders: a file is in it when the first 8 bytes of SHA-256 of
# its group, as an integer, are 0 modulo this (about one group in ten, the same on every machine).
# A file's group is its top-level package (a module at the top is its own group), except under
# test/, which holds one test module or package per library module: there the group is the next
# level.  Splitting by file put sibling files of one package (such as the code-page tables of
# encodings/) on both sides.
VALIDATION_MODULUS = 10
SKIPPED_FOLDERS = frozenset({"site-packages", "dist-packages", "__pycache__"})
STDLIB_ROOT_LABEL = "stdlib"  # the corpus root recorded for this Python's standard library
# Files that say they were generated (the code-page tables of encodings/, Unicode and token
# tables, pydoc's topics) are near-copies of each other or of data, not code: they are left out,
# as are exact duplicates (the first in sorted order kept).
GENERATED = re.compile(rb"generated (from|by)|autogenerated|auto-generated|do not edit")
GENERATED_HEAD_BYTES = 600
# The leak: the fraction of held-out windows of this many bytes found verbatim in the training
# split, over this many evenly spaced windows.
LEAK_WINDOW = 32
LEAK_WINDOWS = 100


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


def split_group(rel: str) -> str:
    """The folder a file is split with: ``json/decoder.py`` -> ``json``, ``os.py`` -> ``os``,
    ``test/test_json/test_fail.py`` -> ``test/test_json``, ``test/test_os.py`` ->
    ``test/test_os``."""
    parts = rel.split("/")
    depth = 2 if parts[0] == "test" and len(parts) > 1 else 1
    group = "/".join(parts[:depth])
    return group[:-3] if group.endswith(".py") else group


def is_validation_file(rel: str) -> bool:
    digest = hashlib.sha256(split_group(rel).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % VALIDATION_MODULUS == 0


def is_generated(content: bytes) -> bool:
    return GENERATED.search(content[:GENERATED_HEAD_BYTES].lower()) is not None


def verbatim_fraction(held_out: bytes, train: bytes, window: int = LEAK_WINDOW,
                      windows: int = LEAK_WINDOWS) -> float:
    """The fraction of ``windows`` evenly spaced ``window``-byte windows of ``held_out`` that
    occur verbatim in ``train``."""
    if len(held_out) < window or not train:
        return 0.0
    count = min(windows, len(held_out) - window + 1)
    span = len(held_out) - window
    starts = [round(i * span / max(count - 1, 1)) for i in range(count)]
    return sum(held_out[s:s + window] in train for s in starts) / count


@lru_cache(maxsize=4)
def _corpus(root: str):
    files = stdlib_files(root)
    contents = {rel: (Path(root) / rel).read_bytes() for rel in files}
    generated = [rel for rel in files if is_generated(contents[rel])]
    seen, duplicates = set(), []
    for rel in files:
        if rel in generated:
            continue
        digest = hashlib.sha256(contents[rel]).digest()
        if digest in seen:
            duplicates.append(rel)
        seen.add(digest)
    dropped = set(generated) | set(duplicates)
    parts = {"train": [], "validation": []}
    names = {"train": [], "validation": []}
    for rel in files:
        if rel in dropped:
            continue
        split = "validation" if is_validation_file(rel) else "train"
        parts[split].append(contents[rel])
        names[split].append(rel)
    # The earlier split, by file with every file kept, for the leak it had.
    by_file = {"train": [], "validation": []}
    for rel in files:
        digest = hashlib.sha256(rel.encode("utf-8")).digest()
        held = int.from_bytes(digest[:8], "big") % VALIDATION_MODULUS == 0
        by_file["validation" if held else "train"].append(contents[rel])
    data = {}
    # The standard library is named, not its folder, which differs between machines (the Python
    # version beside it says which one).
    shown = STDLIB_ROOT_LABEL if Path(root) == stdlib_root() else root
    info = {"root": shown, "python": platform.python_version(), "files": len(files),
            "validation_modulus": VALIDATION_MODULUS,
            "split": "by folder (top-level package; under test/ the next level)",
            "dropped_generated": len(generated), "dropped_duplicates": len(duplicates)}
    for split, chunks in parts.items():
        blob = b"".join(chunks)
        data[split] = torch.frombuffer(bytearray(blob), dtype=torch.uint8) if blob else \
            torch.empty(0, dtype=torch.uint8)
        info[f"{split}_files"] = len(names[split])
        info[f"{split}_bytes"] = len(blob)
        info[f"{split}_sha256"] = hashlib.sha256(blob).hexdigest()
    info["leak"] = {
        "window_bytes": LEAK_WINDOW, "windows": LEAK_WINDOWS,
        "by_file_all_files": verbatim_fraction(b"".join(by_file["validation"]),
                                               b"".join(by_file["train"])),
        "by_folder_deduplicated": verbatim_fraction(b"".join(parts["validation"]),
                                                    b"".join(parts["train"]))}
    return data, names, info


def corpus(root=None):
    """``(data, names, info)``: data maps "train" and "validation" to uint8 tensors (each split's
    files concatenated in sorted order; generated files and duplicates left out), names to the
    files of each split, info describes the corpus (its root, STDLIB_ROOT_LABEL for the standard
    library; Python version, file and byte counts, SHA-256 of each split, files left out, and the
    leak: held-out windows found verbatim in training, for the earlier by-file split of every
    file and for this one).  Read once per process."""
    return _corpus(str(Path(root) if root is not None else stdlib_root()))


@dataclass(frozen=True)
class CharLM:
    """Next-byte prediction on the standard library's source; every position is scored.
    Training windows start at random offsets of the training split; held-out windows are evenly
    spaced over the validation split (no randomness)."""
    seq_len: int
    root: str | None = None
    name = "lm"
    vocab_size = 256
    chance = 8.0  # bits per character of a uniform guess over 256 bytes

    def __post_init__(self):
        _check_options(self)

    @property
    def yardstick_bar(self) -> float:
        """The held-out bits per character of a bigram model of the corpus (bigram_bits):
        attention must do better, that is use more than the byte before."""
        return bigram_bits(self.root)

    def preview(self) -> str:
        """The corpus: its files, bytes and leak (the checksums left out)."""
        return str({k: v for k, v in self.data_info().items() if not k.endswith("sha256")})

    def data_info(self) -> dict:
        """The corpus (corpus()'s info), for the result document."""
        return corpus(self.root)[2]

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


# Add-one-half (Krichevsky-Trofimov) counts: no byte pair held out is impossible.
BIGRAM_PSEUDOCOUNT = 0.5


def bigram_bits_of(train: torch.Tensor, validation: torch.Tensor) -> float:
    """Bits per byte on ``validation`` of the bigram model fit on ``train`` (both uint8): each
    byte predicted from the one before, by counts plus BIGRAM_PSEUDOCOUNT."""
    if train.numel() < 2 or validation.numel() < 2:
        raise ValueError("bigram_bits_of: each split needs at least two bytes")
    t, v = train.long(), validation.long()
    counts = torch.bincount(t[:-1] * 256 + t[1:], minlength=256 * 256).double()
    counts = counts.view(256, 256) + BIGRAM_PSEUDOCOUNT
    log_p = counts.log2() - counts.sum(1, keepdim=True).log2()
    return float(-log_p[v[:-1], v[1:]].mean())


@lru_cache(maxsize=4)
def bigram_bits(root=None) -> float:
    """The corpus's bigram bits per character (bigram_bits_of its two splits): what one byte of
    context gives, the LM's sanity bar."""
    data = corpus(root)[0]
    return bigram_bits_of(data["train"], data["validation"])


@lru_cache(maxsize=4)
def _split_on(root, name: str, device: str) -> torch.Tensor:
    """A split of the corpus on ``device`` (kept there: the training batches are cut on it)."""
    return corpus(root)[0][name].to(device)


def make_task(name: str, seq_len: int, **options):
    """``make_task("mqar", 256, num_pairs=16, vocab_size=1024)``: task ``name`` of TASKS at
    ``seq_len`` with its options; ParameterError names an unknown task or option, or one out of
    its range."""
    spec = task_spec(name)
    try:
        return spec.data(seq_len, **options)
    except TypeError as exc:
        raise ParameterError(f"{name}: {exc}; its options are {sorted(spec.options)}") from None


def task_options(task) -> dict:
    """A task object's options (its spec's numeric ones)."""
    return {k: v for k, v in asdict(task).items() if k in task_spec(task.name).options}


def _builtin() -> dict[str, TaskSpec]:
    return {spec.name: spec for spec in (
        TaskSpec("mqar", "associative recall (MQAR)", "accuracy", MQAR, MQAR_OPTIONS,
                 sanity=True, description=(
                     "**Multi-query associative recall** (MQAR, as in Zoology): key-value "
                     "pairs, then every key queried once later in the sequence (Zoology's power "
                     "law: most queries soon after the pairs, a heavy tail to the end), among "
                     "noise. It measures in-context recall, the ability that separates attention "
                     "from fixed-size recurrent states; with the pairs fixed, a longer sequence "
                     "adds noise and distance. With `episodes`, the sequence is that many such "
                     "blocks back to back, each asking for its own pairs. Scored only at the "
                     "answer positions. Before a model binds keys to values it can guess among "
                     "the values present (in the episode): accuracy 1 / pairs, the dashed line "
                     "of the figure.")),
        TaskSpec("copy", "selective copying", "accuracy", SelectiveCopy, COPY_OPTIONS,
                 sanity=True, description=(
                     "**Selective copying**: a few data tokens scattered among noise tokens, "
                     "then a separator and one marker per data token, where the model must give "
                     "the data tokens in order. It measures selection by content: skipping noise "
                     "needs gates that depend on the input. Scored only at the markers. Tokens: "
                     "0 separator, 1 marker, then the data tokens, then the noise tokens.")),
        TaskSpec("lm", "character LM (stdlib source)", "bits_per_char", CharLM, {},
                 sanity=True, description=(
                     "**Character-level language model** on the Python standard library's own "
                     "`*.py` files (present wherever Python is; bytes as tokens): natural data, "
                     "scored in bits per character on held-out files. The corpus is this "
                     "machine's Python, so bits per character compare across mixers, not across "
                     "machines. The split is by folder (a top-level package, or under `test/` "
                     "the next level, goes wholly to one side), and files that say they were "
                     "generated and exact duplicates are left out: a split by file put "
                     "near-copies on both sides. The leak, the fraction of held-out 32-byte "
                     "windows found verbatim in training, is measured for the earlier by-file "
                     "split and for this one; the result file records the corpus. Its sanity "
                     "bar: attention must score fewer bits per character than a bigram model "
                     "of the corpus (each byte from the one before), the dotted line of the "
                     "quality-against-time figure.")),
    )}


# The table.  Its order is the order of the study's tasks in tables and figures.
TASKS: dict[str, TaskSpec] = _builtin()
# Labels and metric names by task, read from TASKS when looked up.
TASK_NAMES = _View(lambda spec: spec.label)
METRICS = _View(lambda spec: spec.metric)
schema.register_training_tables(tasks=lambda: list(TASKS), metrics=lambda: list(METRIC_TABLE))


"""The studies `make train` runs (``CONFIGURATIONS``), each at a GPU's size (``make train
CONFIG=<name>`` on CUDA) and at a CPU's (notebook 05's defaults, which nbval runs in about a
minute on one core: they exercise every step and are no result).

- ``small``: the study as it first ran on the H200 (``data/training/nvidia-h200.json``):
  width 256, L = 256-512, recall, copying and the LM, 3 seeds; its recall curves are now the
  ``recall`` configuration's.
- ``recall``: Zoology's recall curves, built to show where each state stops recalling.
- ``scale``: the three mixers at a length and width where a recurrent training step is cheaper
  than attention's, for quality against training time.

Each GPU study runs in ``parts``: ``make train CONFIG=<name> PART=k`` (k = 1 .. parts) runs the
k-th, each estimated (``budget.estimate`` from the committed H200 step times, every run taking
all its steps) to take under 8.5 minutes of device time, so that one fits a 10-minute device
command, or, where one run's steps are many (the recall curves, the scale study's MQAR), each
run does; a part stopped short is run again with the same command and trains only what it had
not finished (FinishedRuns), each run from its last save (RunCheckpoint).
The part that finds every part's file merges them.  The estimates (``python -m
samu.experiment.training --estimate --config <name>`` prints them; with ``--measure`` on the GPU
it first times each configuration's step alone beside them), at the commit that set these values
(``tests/experiment/test_training_tables.py`` recomputes them):

- ``small``: 75 runs (with no widening), about 941 s in all, 3 parts of about 350 s (249-350 s,
  each one command);
- ``recall``: 96 runs (no widening; one refinement round, at most two rates a group),
  about 7137 s in all, 12 parts of about 1256 s (one mixer at one width each: 207-1256 s, the
  recurrent mixers' parts at width 256 and every part at 512 two or three commands each; early
  stops cut them short);
- ``scale``: 36 runs (with no widening), about 5524 s in all, 6 parts of about 1960 s (one
  (task, mixer) sweep each: the LM's three parts about 87-105 s, so that one command can run
  them in turn, MQAR's 1611-1960 s at their full 12000 steps, four commands each (a command's
  limit stops a run midway, and the next goes on from its last save), fewer where runs stop as
  solved or decay from a plateau); per step (wall, alone): attention 26.5 ms, RG-LRU 22.5 ms,
  SAMU 21.6 ms, where the H100's wall time per step was 24.2-25.8, 24.0-25.8 and 23.3-25.1 ms.

How the recall curves' numbers were chosen.  The points and widths are Zoology's figure 2
((L, pairs) = (64, 4), (128, 8), (256, 16); widths 64-512), at vocabulary 8192.  Rates: four
from 1e-4 to 1e-2 (Zoology's logspace(-4, -2, 4)), swept at the grid's first point for each
mixer and width and widened past an edge best (``lr_search="first_point"``: a third of the
runs of sweeping every point, which the budget does not allow at these steps), then refined once
(``lr_refine``: the geometric midpoints between the best rate and the neighbours it beats, as
the grid's factor of 4.6 between rates is coarse beside a mixer's peak: on the H100 at 4000
steps SAMU at width 256 reached 0.69 at 2.15e-3 and 0.26 and 0.25 at the rates either side;
data/training/nvidia-h100-80gb-hbm3.recall.json).  Steps: up to 16000 of batch 256, an early
stop once a logging window's mean training loss is 0.02 nats or less (the point solved), and a
"wsd" schedule whose decay (a fifth of the run it makes) a plateau of the loss starts from step
4000 on, so that a run that stops learning ends early.  At 4000 steps (the curves of c4d2de2) SAMU
at width 512 with 4 pairs ended at 0.57, still learning, below its bar; with this schedule on an
H100 it reached 0.970 in 16000 steps at 2.15e-3 (at 4.64e-3 its loss plateaued at 2.4 and the
run ended at step 5000, 0.239), and RG-LRU at 1e-2 0.993, stopped as solved at step 15450
(docs/sweeps/2026-12-07_0e5f219_gpu_h100_recall_probe_and_cuda_stops/).  At batch 64
(data/training/nvidia-h100-80gb-hbm3.recall.json as committed in 3563b7f) most points were
still learning after 4000 steps: RG-LRU at width 512 ended at 0.889 with 4 pairs, attention at
widths 128-512 at 0.48-0.84 with 8 and 16 pairs.  A step there took a fixed 1.7-2.0 ms plus a
time per element (``budget.fit_step_models`` on that document), so four times the sequences a
step were estimated at about twice the time (measured on the H100: 2.2-3.7 times, median 3.2).
A run's 16000 steps are 4,096,000 sequences, where Zoology's 64 epochs of 100k examples are 6.4
million.  So every point still records whether its run was still learning when it stopped
(``loop.still_learning``, on the loss before a decay), and the figure marks it.  The bar:
accuracy 0.9.  Each part sweeps the grid's first point, the bar's, before the others, so that
its progress log shows the bar's runs first.

The scale study: L = 8192, width 512, 2 layers, batch 8 (65,536 tokens a step), the character LM
(600 steps a run, 39M tokens) and MQAR (up to 12000 steps, 786M tokens) at that length, the same
tokens at most for every mixer; four rates for each mixer at the first seed, widened past an
edge best, then seeds 1 and 2 at the best; attention on the fastest
scaled_dot_product_attention kernel, timed before its runs; one run at a time, so that every run's
GPU time per step (CUDA events) and tokens per second are its own, alone on the GPU.

Its MQAR is episodic: each sequence holds 128 episodes of 64 tokens, 4 pairs each, keys distinct
over the sequence (vocabulary 2048). With 64 pairs at the start of a sequence (vocabulary 512)
attention learned nothing in 600 steps at any of five rates (four and one past the grid's edge)
on the H200 (data/training/nvidia-h200.scale.part-1-of-3.json), nor with 128 pairs in 1500
steps at 3e-4 on an H100 (accuracy 0.0105 against 1/128;
docs/sweeps/2026-12-06_c563b21_gpu_h100_recall_curves_and_tests/): 600 steps of 8 sequences are
4,800 sequences, where the recall curves at batch 64 needed 128,000-256,000 (2000-4000 steps)
for attention to solve a point. The episodes give the same 600 steps 614,400 of the recall curves'
easiest point, (L, pairs) = (64, 4), where attention at width 512 reached 0.96 and RG-LRU 0.89
(the batch-64 curves of 3563b7f); the recall distance is an episode's, the
stream the recurrence carries 8192 tokens. At 600 steps on an H100 attention stayed at the plateau
of a uniform guess over the values (loss 6.94) for about 300 steps at 3e-4 and was still falling
steeply when the schedule ended (4.73, accuracy 0.18 over three seeds, below its 0.9 bar), while
RG-LRU reached 0.77. At 1500 steps
(docs/sweeps/2026-12-06_252233c_gpu_h100_scale_study_1500_step_mqar/) attention solved it in one
seed of three (0.9996; 0.262 and 0.251 in the others, mean 0.504), RG-LRU reached 0.935, and
SAMU stayed near a guess at every rate (0.234-0.262; 0.259 at its best, 1.2e-3); attention alone
at 3000 steps, lr 3e-4, seed 0 (one of the seeds that failed at 1500) reached 1.000 (its loss
3.02 at step 620, 0.034 at step 920). At 3000 steps (the study at ac6e0b4) attention at 3e-4
solved it in seeds 0 and 1 and ended at 0.435 in seed 2, its loss still falling; seed 2 with
6000 steps ended at 0.739, still learning. Given up to 12000 steps with a "wsd" decay that a
plateau of the loss starts from step 6000 on, every seed solved it (1.000, 1.000, 0.996; seed 2
left the plateau of a guess near step 4700 and decayed from 9600;
docs/sweeps/2026-12-07_c680154_gpu_h100_scale_mqar_attention_12000_steps/), so MQAR's runs take
up to 12000 steps, twenty times the LM's, and stop once a logging window's mean training loss
is 0.02 nats or less (solved: seeds 0 and 1 were there by step 1000). The
rates: each mixer's four span its best rates of those runs (attention 1e-3 on the LM and 3e-4 on
MQAR; RG-LRU 2.4e-3 and 4.8e-3; SAMU 4.8e-3 on the LM and 1.2e-3 on MQAR, where its sweep was
flat), so that an MQAR sweep seldom widens: a widened one adds a run of up to 12000 steps to its
part.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# The small study as it ran on the H200 (width 256, 2 layers, 3 seeds; for every (task, length,
# mixer) a learning-rate sweep of three rates at the first seed, widened past an edge best,
# then the other two seeds at the best rate).  The steps come from probes on the H200
# (docs/sweeps/2026-12-02_48199ae_gpu_probes): attention copies at L = 256 to 0.978 in 2000
# steps (lr 3e-4; 0.79 in 800); RG-LRU and SAMU in Griffin's block stay at the 1/8 guessing
# baseline on MQAR after 1200 steps and reach 0.78 and 0.82 after 4000.  Every step replays a
# CUDA graph (eager steps of these models are nearly all launches).  Four runs at once trained
# at 0.61-0.92x the rate of one at a time (docs/sweeps/2026-12-03_a57ed47_gpu_training), so
# the runs go one at a time.
SMALL_GPU = dict(
    mixers=None,
    seeds=[0, 1, 2],
    width=256,
    layers=2,
    mlp_expansion=4,
    tasks={
        "mqar": {"lengths": [256, 512], "num_pairs": 8, "vocab_size": 64},
        "copy": {"lengths": [256, 512], "num_tokens": 16, "data_vocab": 16,
                 "noise_vocab": 16},
        "lm": {"lengths": [512]},
    },
    steps={"mqar": 4000, "copy": 2000, "lm": 1000},
    batch_size={"mqar": 64, "copy": 64, "lm": 32},
    lr=[3e-4, 1e-3, 3e-3],
    lr_search="first_seed",
    warmup_steps=100,
    eval_batches=8,
    timing_warmup_steps=10,
    log_every=20,
    time_budget_s=None,
    recurrent_block="griffin",
    attention_heads="standard",
    attention_head_dim=64,
    sanity_bar=0.95,
    speed_steps=50,
    processes=1,
    cuda_graph=True,
    recall_curves=None,
)
# A CPU's size: a minute's study that exercises every step (its bar, 0.2, just above chance).
SMALL_CPU = dict(
    mixers=None,
    seeds=[0],
    width=32,
    layers=2,
    mlp_expansion=2,
    tasks={"mqar": {"lengths": [32], "num_pairs": 4, "vocab_size": 16},
           "copy": {"lengths": [32], "num_tokens": 4, "data_vocab": 8, "noise_vocab": 8},
           "lm": {"lengths": [64]}},
    steps={"mqar": 100, "copy": 100, "lm": 20},
    batch_size=32,
    lr=[1e-3, 3e-3],
    lr_search="grid",
    warmup_steps=10,
    eval_batches=2,
    timing_warmup_steps=2,
    log_every=10,
    attention_head_dim=16,
    sanity_bar=0.2,
    speed_steps=4,
    processes=1,
    cuda_graph=True,
)

# Zoology's logspace(-4, -2, 4), to three figures.
ZOOLOGY_RATES = [1e-4, 4.64e-4, 2.15e-3, 1e-2]
RECALL_GPU = dict(
    mixers=None,
    seeds=[0],
    width=256,  # unused: each point has its own width
    layers=2,
    mlp_expansion=2,
    tasks={},
    steps={},
    batch_size={},
    lr=ZOOLOGY_RATES,
    warmup_steps=100,
    eval_batches=4,
    timing_warmup_steps=10,
    log_every=50,
    attention_head_dim=32,  # width 64 holds two heads
    sanity_bar=0.9,
    speed_steps=20,
    processes=1,
    cuda_graph=True,
    recall_curves={"points": [[64, 4], [128, 8], [256, 16]], "widths": [64, 128, 256, 512],
                   "vocab_size": 8192, "steps": 16000, "batch_size": 256, "bar": 0.9,
                   "attention_from_width": 128, "stop_loss": 0.02,
                   "schedule": "wsd", "plateau_from": 4000,
                   "lr_search": "first_point", "lr_refine": 1},
)
RECALL_CPU = dict(
    RECALL_GPU,
    width=16,
    layers=1,
    lr=[3e-3, 1e-2],
    warmup_steps=4,
    eval_batches=2,
    timing_warmup_steps=2,
    log_every=10,
    attention_head_dim=8,
    speed_steps=4,
    recall_curves={"points": [[16, 2], [32, 4]], "widths": [16, 32], "vocab_size": 16,
                   "steps": 40, "batch_size": 16, "bar": 0.9, "attention_from_width": 16,
                   "stop_loss": 0.02, "lr_search": "first_point", "lr_refine": 1},
)

SCALE_LENGTH = 8192
SCALE_GPU = dict(
    mixers=None,
    seeds=[0, 1, 2],
    width=512,
    layers=2,
    mlp_expansion=4,
    tasks={"lm": {"lengths": [SCALE_LENGTH]},
           "mqar": {"lengths": [SCALE_LENGTH], "num_pairs": 4, "vocab_size": 2048,
                    "episodes": SCALE_LENGTH // 64}},
    steps={"lm": 600, "mqar": 12000},
    schedule={"lm": "cosine", "mqar": "wsd"},
    plateau_from={"lm": None, "mqar": 6000},
    stop_loss={"lm": None, "mqar": 0.02},
    batch_size=8,
    lr={"attention": [1e-4, 3e-4, 1e-3, 2e-3], "rglru": [1.2e-3, 2.4e-3, 4.8e-3, 9.6e-3],
        "samu": [6e-4, 1.2e-3, 2.4e-3, 4.8e-3]},
    lr_search="first_seed",
    warmup_steps=60,
    eval_batches=4,
    timing_warmup_steps=10,
    log_every=20,
    recurrent_block="griffin",
    attention_heads="standard",
    attention_head_dim=64,
    attention_kernel="fastest",
    sanity_bar=0.9,
    speed_steps=20,
    processes=1,
    cuda_graph=True,
)
SCALE_CPU = dict(
    SCALE_GPU,
    seeds=[0, 1],
    width=32,
    layers=1,
    mlp_expansion=2,
    tasks={"lm": {"lengths": [64]},
           "mqar": {"lengths": [64], "num_pairs": 4, "vocab_size": 32, "episodes": 2}},
    steps=20,
    plateau_from={"lm": None, "mqar": 10},  # wsd's path; ten logged points find a plateau
    batch_size=8,
    lr={"attention": [3e-3], "rglru": [3e-3, 1e-2], "samu": [3e-3, 1e-2]},
    warmup_steps=4,
    eval_batches=2,
    timing_warmup_steps=2,
    log_every=5,
    attention_head_dim=16,
    sanity_bar=0.2,
    speed_steps=4,
)


@dataclass(frozen=True)
class Configuration:
    """A study `make train` runs: ``gpu`` and ``cpu``, its parameters at each size (notebook
    05's names; ``mixers=None`` is every mixer of samu.model.mixer_names()); ``parts``, the
    parts its GPU runs split into; ``label`` and ``description``, notebook 05's heading and
    words on it."""
    name: str
    label: str
    description: str
    gpu: dict = field(repr=False)
    cpu: dict = field(repr=False)
    parts: int = 1

    def parameters(self, size: str) -> dict:
        """Its parameters at ``size`` ("gpu" or "cpu"), naming the configuration."""
        if size not in SIZES:
            raise ValueError(f"size must be one of {list(SIZES)}, got {size!r}")
        return {**(self.gpu if size == "gpu" else self.cpu), "configuration": self.name}


SIZES = ("gpu", "cpu")
CONFIGURATIONS: dict[str, Configuration] = {c.name: c for c in (
    Configuration(
        "small", "The study at a small size",
        "Width 256, L = 256-512 on a GPU: what each mixer learns on recall, copying and the "
        "character LM, each at its best rate, three seeds. At this size a recurrent step costs "
        "more than attention's, so the quality-against-time figure cannot show what a fast "
        "recurrence buys; the `scale` study below can.",
        SMALL_GPU, SMALL_CPU, parts=3),
    Configuration(
        "recall", "Recall curves",
        "Zoology's figure 2: MQAR accuracy over (L, pairs) points and model widths, each mixer "
        "at its own best rate, with a sanity bar of their own (attention solves the fewest "
        "pairs at every width of at least 128, each other mixer at the widest width); a mixer "
        "below its bar is drawn dashed and not compared, and no mixer is drawn when attention "
        "is below its own.",
        RECALL_GPU, RECALL_CPU, parts=12),
    Configuration(
        "scale", "At a scale where a recurrent step is cheaper",
        "L = 8192, width 512 on a GPU, the same tokens at most for every mixer (a solved MQAR "
        "run stops): the character LM and "
        "MQAR at that length, each mixer at its best rate, three seeds, attention on the "
        "fastest `scaled_dot_product_attention` kernel; quality against training time, each "
        "run timed alone.",
        SCALE_GPU, SCALE_CPU, parts=6),
)}


def configuration(name: str, configurations: dict | None = None) -> Configuration:
    """The configuration ``name`` of ``configurations`` (None: CONFIGURATIONS), or ValueError
    listing those there are."""
    table = CONFIGURATIONS if configurations is None else configurations
    if name not in table:
        raise ValueError(f"unknown configuration {name!r}; choose one of {list(table)}")
    return table[name]


def as_table(studies: dict) -> dict[str, Configuration]:
    """{name: Configuration} from {name: its parameters}, each at both sizes (the form in which
    `make train` hands notebook 05 the studies it checked)."""
    return {name: Configuration(name, configuration(name).label if name in CONFIGURATIONS
                                else name, "", dict(parameters), dict(parameters))
            for name, parameters in studies.items()}


# `make train` on a GPU, without CONFIG: the small study, as before there were several.
GPU_PARAMETERS = SMALL_GPU

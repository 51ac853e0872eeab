"""Attention (the yardstick) on the scale study's MQAR: does it learn at L = 8192 given more
steps, or more pairs?  usage: python .devrun/probe_mqar.py OUT.json [--cpu] CASE ...
CASE = pairs:steps:lr[:vocab[:episodes]], e.g. 64:2000:3e-4 or 4:600:1e-3:2048:128"""
import json, sys, time
import torch
from samu.experiment.training import configs, study as study_

out = sys.argv[1]
cpu = "--cpu" in sys.argv
cases = [a for a in sys.argv[2:] if not a.startswith("--")]
base = dict(configs.SCALE_CPU if cpu else configs.SCALE_GPU)
length = base["tasks"]["mqar"]["lengths"][0]
device = "cpu" if cpu else "cuda"
records = []
for case in cases:
    pairs, steps, lr, *more = case.split(":")
    vocab, episodes = (more + [None, None])[:2]
    p = dict(base, mixers=["attention"], seeds=[0], steps=int(steps), lr=float(lr),
             warmup_steps=min(base["warmup_steps"], int(steps) // 10),
             tasks={"mqar": {"lengths": [length], "num_pairs": int(pairs),
                             "vocab_size": int(vocab) if vocab
                             else base["tasks"]["mqar"]["vocab_size"],
                             "episodes": int(episodes) if episodes else 1}})
    names = set(study_.inspect.signature(study_.study_from_parameters).parameters)
    study = study_.study_from_parameters(**{k: v for k, v in p.items() if k in names})
    (task,) = study.task_list("mqar")
    t0 = time.time()
    record = study_.run_one(study, "mqar", task, "attention", 0, device)
    curve = record["loss_curve"]
    line = dict(case=case, value=record["value"], baseline=record["values_baseline"],
                eval_loss=record["eval_loss"], gpu_ms_per_step=record["gpu_ms_per_step"],
                wall_s=round(time.time() - t0, 1), curve=curve)
    records.append(line)
    print(case, "accuracy", record["value"], "baseline", record["values_baseline"],
          "eval loss", record["eval_loss"], "curve", [c for c in curve][::max(1, len(curve) // 10)],
          f"{line['wall_s']} s", flush=True)
    json.dump(records, open(out, "w"), indent=1)

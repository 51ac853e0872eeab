"""Probe: scale-study MQAR runs for MIXER:LR:SEED:STEPS:WARMUP[:PLATEAU_FROM] (a wsd schedule
with it); one JSON line per run."""
import json, sys, time
from samu.experiment.training import configured_study, run_job

out = sys.argv[1]
for spec in sys.argv[2:]:
    mixer, lr, seed, steps, warmup, *plateau = spec.split(":")
    schedule = {"schedule": {"lm": "cosine", "mqar": "wsd"},
                "plateau_from": {"lm": None, "mqar": int(plateau[0])}} if plateau else {}
    study, _ = configured_study("scale", "gpu", overrides={
        "steps": {"lm": 600, "mqar": int(steps)}, "warmup_steps": int(warmup),
        "mixers": [mixer], "lr": {mixer: [float(lr)]}, **schedule})
    task = study.task_list("mqar")[0]
    config = study.train_config("mqar", float(lr))
    job = study.job("mqar", task, mixer, float(lr), int(seed), config)
    t0 = time.time()
    def progress(step, loss, t0=t0):
        if step % 500 == 0:
            print(f"  {spec} step {step} loss {loss:.4f} ({time.time() - t0:.0f} s)", flush=True)
    record = run_job(job, "cuda", progress=progress)
    keep = {k: record.get(k) for k in ("mixer", "lr", "seed", "value", "steps_completed",
                                       "stopped_early", "decay_from", "wall_s", "loss_curve")}
    keep["spec"] = spec
    print(spec, {k: v for k, v in keep.items() if k != "loss_curve"}, flush=True)
    with open(out, "a") as f:
        f.write(json.dumps(keep) + "\n")

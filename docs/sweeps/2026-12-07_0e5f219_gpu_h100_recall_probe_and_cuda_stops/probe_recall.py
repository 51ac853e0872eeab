"""Probe: recall-curve runs at (64, 4) for MIXER:WIDTH:STEPS:LR with a wsd schedule whose decay
a plateau from PLATEAU_FROM starts; one JSON line per run."""
import json, os, sys, time
from samu.experiment.training import configured_study, configuration, run_job

out = sys.argv[1]
plateau = int(os.environ.get("PLATEAU_FROM", "4000"))
base = configuration("recall").parameters("gpu")["recall_curves"]
for spec in sys.argv[2:]:
    mixer, width, steps, lr = spec.split(":")
    curves = {**base, "steps": int(steps), "schedule": "wsd", "plateau_from": plateau}
    study, _ = configured_study("recall", "gpu", overrides={"recall_curves": curves})
    job = study.recall_job((64, 4), mixer, int(width), float(lr))
    t0 = time.time()
    def progress(step, loss, t0=t0):
        if step % 1000 == 0:
            print(f"  {spec} step {step} loss {loss:.4f} ({time.time() - t0:.0f} s)", flush=True)
    record = run_job(job, "cuda", progress=progress)
    keep = {k: record.get(k) for k in ("mixer", "width", "lr", "value", "steps_completed",
                                       "decay_from", "stopped_early", "wall_s", "loss_curve")}
    print(spec, {k: v for k, v in keep.items() if k != "loss_curve"}, flush=True)
    with open(out, "a") as f:
        f.write(json.dumps(keep) + "\n")

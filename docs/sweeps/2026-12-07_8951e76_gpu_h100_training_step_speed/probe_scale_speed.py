"""GPU time per training step of the scale study's LM models at longer L (the same tokens a
step), each mixer alone, attention on its fastest kernel.  usage:
python .devrun/probe_scale_speed.py OUT.json [--cpu] L:batch ..."""
import json, sys, time
from dataclasses import replace
from samu.experiment.training import configs, study as study_
from samu.experiment.training.runs import fastest_attention_kernel, measure_speed

out = sys.argv[1]
cpu = "--cpu" in sys.argv
cases = [a for a in sys.argv[2:] if not a.startswith("--")]
base = dict(configs.SCALE_CPU if cpu else configs.SCALE_GPU)
device = "cpu" if cpu else "cuda"
rows = []
for case in cases:
    length, batch = map(int, case.split(":"))
    p = dict(base, tasks={"lm": {"lengths": [length]}}, batch_size=batch,
             steps={"lm": 40}, lr=base["lr"])
    study = study_.check_parameters({k: v for k, v in p.items()
                                     if k in study_.inspect.signature(
                                         study_.study_from_parameters).parameters})
    (task,) = study.task_list("lm")
    for mixer in study.mixers:
        job = study.job("lm", task, mixer, study.lrs("lm", mixer)[0], 0, study.train_config("lm"))
        if mixer == "attention":
            kernel = fastest_attention_kernel(job.model, task, job.config, device)
            job = replace(job, config=replace(job.config, attention_kernel=kernel))
        t0 = time.time()
        timed = measure_speed(job, device, 4 if cpu else 20)
        row = dict(length=length, batch=batch, mixer=mixer,
                   kernel=job.config.attention_kernel, wall_s=round(time.time() - t0, 1), **timed)
        rows.append(row)
        print(row, flush=True)
        json.dump(rows, open(out, "w"), indent=1)

"""Where a scale-study training step spends its GPU time, per mixer: top kernels by CUDA time
over 5 eager steps after 3 warm-ups (the lm task, L = 8192, width 512, batch 8)."""
import sys, torch
from torch.profiler import profile, ProfilerActivity
from samu import model as model_
from samu.experiment.training import configs, study as study_
from samu.experiment.training.loop import optimizer, train_step, attention_kernel
base = dict(configs.SCALE_GPU)
names = set(study_.inspect.signature(study_.study_from_parameters).parameters)
study = study_.study_from_parameters(**{k: v for k, v in base.items() if k in names})
(task,) = study.task_list("lm")
g = torch.Generator().manual_seed(0)
for mixer in study.mixers:
    for kernel in (["flash", "cudnn", "efficient"] if mixer == "attention" else [None]):
        model = model_.build(study.model_config(mixer, task.vocab_size), seed=0, device="cuda")
        cfg = study.train_config("lm", 1e-3)
        opt = optimizer(model, cfg, "cuda")
        params = [p for p in model.parameters()]
        x, y = task.batch(base["batch_size"], g)
        x, y = x.cuda(), y.cuda()
        def step():
            opt.zero_grad(set_to_none=True)
            with attention_kernel(kernel):
                train_step(model, opt, params, 1.0, x, y, "cuda")
        try:
            for _ in range(3): step()
        except RuntimeError as e:
            print(mixer, kernel, "cannot run:", str(e)[:100]); continue
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(10): step()
        e.record(); torch.cuda.synchronize()
        print(f"=== {mixer} kernel={kernel}: eager step {s.elapsed_time(e)/10:.2f} ms (CUDA events)", flush=True)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5): step()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=70), flush=True)

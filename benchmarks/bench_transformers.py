"""Hugging Face transformers' RecurrentGemma against the same model patched onto samu
(samu.integrations.transformers): wall time of a forward+backward of one RG-LRU layer
(transformers' RecurrentGemmaRglru, whose scan is a Python loop over the tokens) and of the whole
model, and decode tokens per second of greedy generation at batch 1 and 16.

    python benchmarks/bench_transformers.py --figure           # on a GPU: the default below
    python benchmarks/bench_transformers.py --lengths 2048 --layers 8 --batches 1
    python benchmarks/bench_transformers.py --redraw nvidia-h200  # the figure from committed rows

On a GPU the default is a RecurrentGemma-2B-like layout in BF16: width 2560 (lru_width 2560),
10 heads (one key-value head), MLP 15360, vocabulary 256000, the blocks recurrent, recurrent,
attention, and as many of its 26 layers as fit (halved until each of transformers' timed
forward+backward steps at the longest length fits, in turn), random weights; sequence lengths
2048 and 8192 at batch 1; generation from a 128-token prompt, 64 new tokens.  On a CPU it runs a
small shape (width 64, 3 layers, L = 64, FP32) and every line, row and figure says it is no GPU
result.  Run as a script, CUDA's allocator grows its segments (expandable_segments) unless the
caller set PYTORCH_CUDA_ALLOC_CONF or PYTORCH_ALLOC_CONF: the 26-layer model at L = 8192 fills
most of an 80 GB GPU, and fixed blocks can strand gigabytes between steps.

Each time is the median wall time of --repeats calls after a warm-up, the device synchronised
around each (host time included: transformers' scan is host-bound).  Decode tokens per second are
batch x (new tokens - 1) over the time generate takes beyond the time of one new token (prefill
and first token excluded).  The patched model runs samu's ``backend`` (``auto``: the calibrated
choice).  Each measurement is a row of data/benchmarks/<gpu>/bench_transformers.jsonl
(samu.experiment.benchmark_rows); --figure draws data/figures/<gpu>_transformers.png from the
run, --redraw from the GPU's committed rows (each bar the latest commit that measured both).
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import time

ALLOCATOR_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
if __name__ == "__main__" and not set(ALLOCATOR_VARIABLES) & set(os.environ):
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"  # before torch is loaded
import torch  # noqa: E402

GPU = dict(width=2560, heads=10, kv_heads=1, intermediate=15360, vocab=256000, layers=26,
           lengths=[2048, 8192], dtype="bfloat16", prompt=128, new_tokens=64, repeats=3)
CPU = dict(width=64, heads=2, kv_heads=1, intermediate=128, vocab=256, layers=3, lengths=[64],
           dtype="float32", prompt=16, new_tokens=8, repeats=2)
BATCHES = [1, 16]
PARTS = ("layer", "model", "generate")
BLOCK_TYPES = ("recurrent", "recurrent", "attention")  # RecurrentGemma's
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def build_model(args, device):
    from transformers import RecurrentGemmaConfig, RecurrentGemmaForCausalLM
    config = RecurrentGemmaConfig(
        num_hidden_layers=args.layers, vocab_size=args.vocab, hidden_size=args.width,
        lru_width=args.width, intermediate_size=args.intermediate, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, attention_window_size=2048, block_types=BLOCK_TYPES)
    torch.manual_seed(0)
    with torch.device(device):
        model = RecurrentGemmaForCausalLM(config)
    return model.to(DTYPES[args.dtype]).eval()


def synchronize(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wall_ms(fn, device, repeats: int) -> float:
    fn()  # warm-up: compiles, allocates
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def layer_step(model, batch, length, device):
    """A forward+backward of the first recurrent block's RG-LRU layer alone."""
    layer = model.model.layers[0].temporal_block.rg_lru
    dtype = next(model.parameters()).dtype
    width = model.config.lru_width
    x = torch.randn(batch, length, width, device=device, dtype=dtype, requires_grad=True)
    dy = torch.randn_like(x)
    positions = torch.arange(length, device=device)[None]

    def run():
        layer.recurrent_states = None
        layer(x, positions).backward(dy)
        x.grad = None
        layer.zero_grad(set_to_none=True)
    return run


def model_step(model, batch, length, device):
    """A forward+backward of the model with its language-model loss (use_cache=False)."""
    ids = torch.randint(3, model.config.vocab_size, (batch, length), device=device)

    def run():
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        model.zero_grad(set_to_none=True)
    return run


# The forward+backward parts: (the step's maker, the row's part, what the line says).
STEPS = {"layer": (layer_step, "rglru_layer_forward_backward", "RG-LRU layer forward+backward"),
         "model": (model_step, "model_forward_backward", "model forward+backward ({layers} layers)")}


def generate_ms(model, batch, prompt, new_tokens, device, repeats):
    """(ms of generate with one new token, decode tokens per second beyond it)."""
    ids = torch.randint(3, model.config.vocab_size, (batch, prompt), device=device)

    def run(n):
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                           min_new_tokens=n, do_sample=False, pad_token_id=0)
    first = wall_ms(lambda: run(1), device, repeats)
    whole = wall_ms(lambda: run(new_tokens), device, repeats)
    return first, batch * (new_tokens - 1) / max(whole - first, 1e-9) * 1e3


def release_cache(device) -> None:
    """Return the allocator's cached blocks: one step's leftovers must not fragment the next's."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def fit_layers(args, device):
    """The model with the most layers (halving from --layers) on which every timed unpatched
    forward+backward runs, in the order measure() takes them, at the longest length; on a CPU,
    --layers.  The model step alone is not enough: at L = 8192 it fitted by itself and then ran
    out of memory after the layer step, with 13 GiB reserved by the allocator but unused."""
    steps = [step for part, (step, _, _) in STEPS.items() if part in args.parts]
    while True:
        model = build_model(args, device)
        if device.type != "cuda" or "model" not in args.parts:
            return model
        try:
            for step in steps:
                step(model, 1, max(args.lengths), device)()
                release_cache(device)
            return model
        except torch.OutOfMemoryError:
            if args.layers == 1:
                raise
        del model  # outside the handler, whose traceback holds the failed step's tensors
        release_cache(device)
        args.layers = max(1, args.layers // 2)
        print(f"out of memory: trying {args.layers} layers", flush=True)


def measure(args, device, table, gpu_result: bool) -> list[dict]:
    from samu.experiment import benchmark_rows
    import samu.integrations.transformers as samu_hf
    model = fit_layers(args, device)
    layout = dict(dtype=args.dtype, layers=args.layers, heads=args.heads, vocab=args.vocab,
                  gpu_result=gpu_result)
    results = []

    def record(part, shape, implementation, backend, values, units=None):
        config = benchmark_rows.configuration("rglru", backend, part=part,
                                              implementation=implementation, **layout)
        table.add("rglru", config, shape, values, units)
        results.append(dict(part=part, shape=shape, implementation=implementation, **values))

    for implementation in ("transformers", "samu"):
        handle = samu_hf.patch(model, backend=args.backend) if implementation == "samu" else None

        def backend():
            if handle is None:
                return "transformers"
            return next(iter(handle.last_backends.values()), None) or str(args.backend)
        for length in args.lengths:
            shape = {"batch": 1, "length": length, "width": args.width}
            for part, (step, name, what) in STEPS.items():
                if part not in args.parts:
                    continue
                ms = wall_ms(step(model, 1, length, device), device, args.repeats)
                release_cache(device)
                record(name, shape, implementation, backend(), {"wall_ms": ms})
                print(f"{implementation:>12}: {what.format(layers=args.layers)} "
                      f"{tuple(shape.values())} {ms:.2f} ms", flush=True)
        if "generate" in args.parts:
            for batch in args.batches:
                shape = {"batch": batch, "length": args.prompt, "width": args.width}
                first, rate = generate_ms(model, batch, args.prompt, args.new_tokens, device,
                                          args.repeats)
                record("generate", shape, implementation, backend(),
                       {"first_token_ms": first, "decode_tokens_per_s": rate},
                       {"decode_tokens_per_s": "tokens/s"})
                print(f"{implementation:>12}: generate batch {batch}, prompt {args.prompt}: "
                      f"first token {first:.1f} ms, decode {rate:.1f} tokens/s", flush=True)
        if handle is not None:
            handle.unpatch()
        release_cache(device)
    return results


def speedups(results: list[dict]) -> list[tuple[str, float]]:
    """(label, samu over transformers) of each measurement: time ratio, or tokens/s ratio; a
    result with a tag (results_from_rows: its commit) has it in its label."""
    out = []
    for ours in (r for r in results if r["implementation"] == "samu"):
        theirs = next(r for r in results if r["implementation"] == "transformers"
                      and r["part"] == ours["part"] and r["shape"] == ours["shape"]
                      and r.get("tag") == ours.get("tag"))
        s = ours["shape"]
        if ours["part"] == "generate":
            label = f"decode, batch {s['batch']}"
            ratio = ours["decode_tokens_per_s"] / theirs["decode_tokens_per_s"]
        else:
            what = "RG-LRU layer" if ours["part"].startswith("rglru") else "model"
            label = f"{what} fwd+bwd, L = {s['length']}"
            ratio = theirs["wall_ms"] / ours["wall_ms"]
        out.append((f"{label} ({ours['tag']})" if "tag" in ours else label, ratio))
    return out


def results_from_rows(rows: list[dict]) -> list[dict]:
    """measure()'s results rebuilt from committed rows of GPU runs: for each measurement (part,
    shape and model layout), the rows of the latest commit that has both implementations', each
    result naming its commit in ``tag`` (with its layout where the results hold several).  Latest
    is the commit whose row was appended last, so a rerun of older code counts as new; rows of
    one commit or layout are never paired with another's."""
    layout_keys = ("layers", "dtype", "heads", "vocab")
    by_measurement = {}
    for index, row in enumerate(rows):
        config = row["configuration"]
        if not config.get("gpu_result"):
            continue
        layout = tuple(config.get(k) for k in layout_keys)
        key = (config["part"], tuple(sorted(row["shape"].items())), layout)
        commit = (row.get("commit") or "unknown")[:7]
        entry = by_measurement.setdefault(key, {}).setdefault(commit, {"pair": {}})
        entry["pair"][config["implementation"]] = row
        entry["last"] = index
    chosen = []
    for (part, _, layout), by_commit in by_measurement.items():
        complete = [(entry["last"], commit, entry["pair"]) for commit, entry in by_commit.items()
                    if {"samu", "transformers"} <= set(entry["pair"])]
        if complete:
            chosen.append((part, layout, *max(complete)[1:]))
    several = len({layout for _, layout, _, _ in chosen}) > 1
    results = []
    for part, (layers, dtype, *_), commit, pair in chosen:
        tag = f"{commit}, {layers} layers, {dtype}" if several else commit
        for implementation, row in pair.items():
            results.append(dict(part=part, shape=row["shape"], implementation=implementation,
                                tag=tag, layout=row["configuration"], **row["values"]))
    order = [name for _, name, _ in STEPS.values()] + ["generate"]
    return sorted(results, key=lambda r: (order.index(r["part"]) if r["part"] in order
                                          else len(order), r["part"], r["shape"]["length"],
                                          r["shape"]["batch"], r["tag"]))


def redraw(gpu: str) -> int:
    """Draw data/figures/<gpu>_transformers.png from that GPU's committed rows; measures nothing."""
    from samu import paths
    from samu.experiment import benchmark_rows
    source = paths.benchmarks_file(gpu, "bench_transformers")
    results = results_from_rows(benchmark_rows.read_rows(source))
    if not results:
        print(f"no GPU rows with both implementations in {paths.relative(source)}")
        return 1
    layouts = sorted({f"width {r['shape']['width']}, {r['layout']['heads']} heads, "
                      f"{r['layout']['layers']} layers, {r['layout']['dtype']}" for r in results})
    title = ("RecurrentGemma in transformers, patched onto samu\n"
             f"{gpu}, committed rows\n" + "; ".join(layouts))
    path = paths.figures_dir() / f"{gpu}_transformers.png"
    draw(speedups(results), title, path)
    print("wrote", paths.relative(path))
    return 0


def draw(ratios, title: str, path) -> None:
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(ratios) + 1.5))
    labels, values = zip(*ratios)
    ax.barh(range(len(values)), values, color="#4c72b0")
    ax.set_yticks(range(len(values)), labels)
    ax.invert_yaxis()
    ax.axvline(1.0, color="grey", lw=1)
    ax.set_xscale("log")
    ax.set_xlim(right=max(max(values), 1.0) * 4)  # room for the largest bar's label
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("samu over transformers (times faster; log scale)")
    fig.suptitle(title, fontsize=9)
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.2f}x" if v < 10 else f" {v:.1f}x", va="center", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse(argv=None):
    from samu.experiment.benchmark_cli import device as device_type, positive_int
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", type=device_type, default=None,
                        help="cuda (default when present) or cpu")
    for name in ("width", "heads", "kv_heads", "intermediate", "vocab", "layers", "prompt",
                 "new_tokens", "repeats"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=positive_int, default=None)
    parser.add_argument("--lengths", type=positive_int, nargs="+", default=None)
    parser.add_argument("--batches", type=positive_int, nargs="+", default=BATCHES)
    parser.add_argument("--dtype", choices=list(DTYPES), default=None)
    parser.add_argument("--backend", default="auto", help="samu's RG-LRU backend (default auto)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--figure", action="store_true", help="draw the speed-ups")
    parser.add_argument("--redraw", metavar="GPU",
                        help="measure nothing (the measuring options are ignored): draw GPU's "
                             "figure (e.g. nvidia-h200) from its committed rows, each bar the "
                             "latest commit that measured both")
    args = parser.parse_args(argv)
    if args.redraw is not None and not re.fullmatch(r"[a-z0-9][a-z0-9-]*", args.redraw):
        parser.error(f"--redraw takes a GPU's folder name under data/benchmarks (e.g. "
                     f"nvidia-h200), got {args.redraw!r}")
    device = args.device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for name, value in (GPU if device.type == "cuda" else CPU).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if "generate" in args.parts and "attention" not in (BLOCK_TYPES * args.layers)[:args.layers]:
        parser.error(f"transformers' generate fails without an attention layer: --layers must be "
                     f"at least {BLOCK_TYPES.index('attention') + 1} for --parts generate")
    if args.new_tokens < 2:
        parser.error("--new-tokens must be at least 2 (decode is timed beyond the first token)")
    return args, device


def main(argv=None) -> int:
    from samu import paths
    from samu.experiment import benchmark_rows
    args, device = parse(argv)
    if args.redraw:
        return redraw(args.redraw)
    gpu_result = device.type == "cuda"
    if not gpu_result:
        print("CPU run at a small shape: no GPU result", flush=True)
    table = benchmark_rows.BenchmarkRows("bench_transformers", device)
    results = measure(args, device, table, gpu_result)
    ratios = speedups(results)
    for label, ratio in ratios:
        print(f"samu over transformers, {label}: {ratio:.2f}x")
    if args.figure and ratios:
        name = "GPU" if gpu_result else "CPU, a small shape: no GPU result"
        title = (f"RecurrentGemma in transformers, patched onto samu ({table.gpu}; {name})\n"
                 f"width {args.width}, {args.heads} heads, {args.layers} layers, {args.dtype}")
        path = paths.figures_dir() / f"{table.gpu}_transformers.png"
        draw(ratios, title, path)
        print("wrote", paths.relative(path))
    print(table.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

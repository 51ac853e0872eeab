"""Writes notebooks/*.ipynb (without outputs).  The notebooks are the source users open; this
script only keeps their cells reviewable as one Python file.  Run: python tools/make_notebooks.py

It takes no arguments.  SAMU_NOTEBOOKS_OUT, where set, names another folder to write them to (a
test compares what it writes there with the committed notebooks)."""
import argparse
import os
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from samu import mixers
from samu.experiment import host_cost
from samu.experiment.calibration import memory_rule_text

ROOT = Path(__file__).resolve().parent.parent
# auto's memory rule as notebook 02 states it, from the code that applies it
TOLERANCE_PERCENT, BUDGETS = memory_rule_text()
# The registered mixers' names as the notebooks' prose gives them ("RG-LRU and SAMU").
LABELS = " and ".join(mixers.LABELS.values())
# Each speed-up the report draws ("SAMU's speedup over RG-LRU"), and the host-cost targets.
SPEEDUPS = "; ".join(f"{mixers.LABELS[m]}'s speedup over {mixers.LABELS[b]}"
                     for m, b in mixers.baselines().items())
HOST_TARGETS = ", ".join(f"{mixers.LABELS[m]} {t}x" for m, t in host_cost.targets().items())
# The notebooks built, by name, in the order they are written (main writes them).
NOTEBOOKS: dict = {}
# tqdm.auto without ipywidgets warns (TqdmWarning) naming its own file, a machine's path; the
# notebooks use the text bar, so the warning says nothing about them.
QUIET_TQDM = '''import warnings
from tqdm import TqdmWarning
warnings.filterwarnings("ignore", category=TqdmWarning)  # tqdm.auto's "IProgress not found": the text bar is used'''
SETUP = '''import os
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default (FP fusion on); Triton 3.9 warns while unset
''' + QUIET_TQDM + '''
import torch
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton's interpreter runs the kernels on a CPU
import samu
from samu import backends, dispatch, paths
from samu.shapes import Shape
from samu.experiment import calibration, features, legality, protocol, report, schema
device = "cuda" if torch.cuda.is_available() else "cpu"
slug = protocol.device_slug(device)  # results are labelled by the device they were measured on
shape = (batch, length, width)
print(f"device {device} ({slug}); shape {shape}")'''
# Notebooks 01-03 run the mixers of their parameter, every registered one by default.
MIXERS_PARAMETER = "mixers = None  # the mixers to run; None: every registered one (samu.mixers)"
MIXERS_CHOSEN = '''
mixers = list(mixers or samu.mixers.names())
print("mixers", mixers)'''


def params(src):
    cell = new_code_cell(src)
    cell.metadata["tags"] = ["parameters"]
    return cell


def md(src):
    return new_markdown_cell(src)


def code(src):
    return new_code_cell(src)


def save(name, cells):
    for i, cell in enumerate(cells):
        cell.id = f"{name[:2]}-{i:02d}"  # stable ids: regenerating changes only what changed
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    NOTEBOOKS[name] = nb


save("00_derivation", [
    md(r"""# 00 — Derivation: the recurrence, its chunked composition, and its backward

Both mixers run one recurrence, elementwise per channel, carried in FP32:

$$h_t = a_t\,h_{t-1} + u_t,\qquad h_{-1}=0,\qquad m_t=\sqrt{1-a_t^2}\ (t\ge1),\quad m_0=1,\ a_0 \equiv 0.$$

**RG-LRU** (16 heads, block width $b_w = D/16$): $g^x=\sigma(G_x(x))$, $g^a=\sigma(G_a(x))$ with block-diagonal
$G(x)_{h b_w+j}=\sum_i x_{h b_w+i}W_{h,i,j}+b_{h b_w+j}$; $\log a_t=-8\,g^a_t\,\mathrm{softplus}(\Lambda)$, $u_t=m_t\,g^x_t\,x_t$, $y_t=h_t$.

**SAMU**: $z_t = W_c x_t + b_c\in\mathbb R^2$ (FP32), $r_t=\sigma(z_{t,0})$, $g_t=\sigma(z_{t,1})$ shared by every channel,
$c=8e^{\tau}$, $\log a_{t,d}=-c\,r_t\,\mathrm{softplus}(\Lambda_d)$, $u_{t,d}=m_{t,d}\,g_t\,x_{t,d}$, $y_t=h_t+s\,x_t$.

Every identity below is checked numerically in an `assert` cell, in float64."""),
    params("length = 200\nwidth = 32\nbatch = 2\nseed = 0"),
    code(SETUP + '''
import pandas as pd
from samu.mixers import BACKWARDS, REFERENCES
from samu.ops import recurrence
torch.manual_seed(seed)
gen = torch.Generator().manual_seed(seed)
a = torch.rand(batch, length, width, generator=gen, dtype=torch.float64)
u = torch.randn(batch, length, width, generator=gen, dtype=torch.float64)'''),
    md(r"""## 1. The scan unrolled

$h_t=\sum_{s\le t}\Big(\prod_{s<r\le t}a_r\Big)u_s$. The sequential scan is the oracle's formulation."""),
    code('''t = min(length, 12)
explicit = torch.stack([sum(torch.prod(a[:, s + 1:k + 1], dim=1) * u[:, s] for s in range(k + 1))
                        for k in range(t)], dim=1)
err = (recurrence.scan_sequential(a[:, :t], u[:, :t]) - explicit).abs().max().item()
print(f"max |sequential - unrolled| = {err:.1e}")
assert err < 1e-12'''),
    md(r"""## 2. Chunk and carry composition

Each step is the affine map $h\mapsto a_t h+u_t$. Composing two maps gives $(a_1,b_1)\circ(a_2,b_2) = (a_1a_2,\ a_2b_1+b_2)$,
which is associative, so any grouping of the tokens gives the same state. For a chunk entered with state $h_\text{in}$:

$$h_t = \underbrace{h^{\text{local}}_t}_{\text{scan from }0} + \Big(\prod_{s\le t,\ s\in\text{chunk}} a_s\Big)\,h_\text{in}.$$

Phase 1 computes every chunk's (decay, end state) alone; phase 2 scans those summaries (the same combine) to get each
chunk's $h_\text{in}$; phase 3 rebuilds $h_t$. The kernels use this with chunks of 8-64 tokens
(`samu.backends.describe()` lists them), and two levels of carry from 512 chunks on."""),
    code('''def compose(p, q):  # apply p then q: the kernels' affine_combine
    return p[0] * q[0], q[0] * p[1] + q[1]
maps = [(a[:, i], u[:, i]) for i in range(3)]
left = compose(compose(maps[0], maps[1]), maps[2])
right = compose(maps[0], compose(maps[1], maps[2]))
assert all(torch.allclose(l, r, rtol=1e-14) for l, r in zip(left, right))
sequential = recurrence.scan_sequential(a, u)
rows = []
for chunk in (1, 3, 16, 64, recurrence.default_chunk(length)):
    rel = ((recurrence.scan_chunked(a, u, chunk=chunk) - sequential).norm() / sequential.norm()).item()
    rows.append({"chunk": chunk, "relative error vs sequential": rel})
    assert rel < 1e-12
pd.DataFrame(rows)'''),
    md(r"""## 3. The backward

With $\delta_t = \partial\mathcal L/\partial h_t$ the total gradient reaching $h_t$:

$$\delta_t = \bar y_t + a_{t+1}\,\delta_{t+1}\quad(\delta_L=0),$$

the same scan run backwards in time. The gradient reaching $\log a_t$ needs $a_t h_{t-1}$, which equals $h_t-u_t$;
the reference formulas use that difference, but the SAMU kernel forms the product $a_t h_{t-1}$ itself, because the
difference cancels when $a_t$ is small (fast decay):

$$\overline{\log a_t} = \delta_t\,(h_t-u_t) + [t>0]\;\delta_t\,\mathrm{gate}_t\,x_t\,\frac{-2a_t^2}{\sqrt{\max(4(1-a_t^2),10^{-6})}}.$$

The sqrt's derivative is bounded as in recurrentgemma (at most 1000). Then, per mixer:

* RG-LRU: $\overline{G_x}=\delta\,m\,x\,g^x(1-g^x)$, $\overline{G_a}=\overline{\log a}\,(-8\,\mathrm{sp})\,g^a(1-g^a)$,
  $\bar x=\delta\,m\,g^x+\overline{G_x}W_x^\top+\overline{G_a}W_a^\top$ (per head), $\bar W_h=\sum x_h^\top\overline{G}_h$, $\bar b=\sum\overline G$,
  $\bar\Lambda=\sum_t\overline{\log a}\,(-8g^a)\,\sigma(\Lambda)$.
* SAMU: $\bar r_t=\sum_d\overline{\log a}_{t,d}(-c\,\mathrm{sp}_d)$, $\bar g_t=\sum_d\delta\,m\,x$, $\bar z=(\bar r\,r(1-r),\ \bar g\,g(1-g))$,
  $\bar x=\delta\,m\,g+s\,\bar y+W_c^\top\bar z$, $\bar W_c=\sum_t\bar z_t x_t^\top$, $\bar\tau=\sum\overline{\log a}\,\log a$, $\bar s=\sum\bar y\,x$.

The kernels load each chunk latest token first, so $\delta$ is a forward scan in registers (`samu/ops/common/scan.py`;
RG-LRU's tiles use the 4-tuple `adjoint_combine`, SAMU's the affine one); SAMU unrolls $a_t h_{t-1}$ from the chunk's
entering state (`decayed_previous_state`). Both recompute $h$ from FP32 per-chunk states instead of saving any
[B, L, D] FP32 tensor."""),
    code('''dy = torch.randn(batch, length, width, generator=gen, dtype=torch.float64)
want = torch.zeros_like(dy)
nxt = torch.zeros_like(dy[:, 0])
for k in reversed(range(length)):
    nxt = dy[:, k] + (a[:, k + 1] * nxt if k + 1 < length else 0)
    want[:, k] = nxt
for scan in ("sequential", "chunked"):
    assert torch.allclose(recurrence.reverse_scan(a, dy, scan), want, rtol=1e-12)
h = recurrence.scan_sequential(a, u)
assert torch.allclose(a[:, 1:] * h[:, :-1], h[:, 1:] - u[:, 1:], rtol=1e-12, atol=1e-14)
v = torch.tensor([0.0, 1e-9, 0.5], dtype=torch.float64, requires_grad=True)
recurrence.BoundedSqrt.apply(v).sum().backward()
assert abs(v.grad[0].item() - 1000.0) < 1e-9
print("reverse scan, a_t h_(t-1) = h_t - u_t, bounded sqrt derivative: OK")'''),
    code('''rows = []
for mixer in REFERENCES:  # every registered mixer
    module = samu.modules.MODULES[mixer](width).double()
    module.reset_parameters(generator=torch.Generator().manual_seed(seed))
    ps = [p.detach().clone().requires_grad_() for p in module.parameters()]
    if mixer == "samu":  # exercise the temperature and skip too
        with torch.no_grad():
            ps[3].fill_(0.4); ps[4].fill_(-0.3)
    x = torch.randn(batch, length, width, generator=gen, dtype=torch.float64, requires_grad=True)
    y = REFERENCES[mixer](x, *ps, scan="sequential")
    auto = torch.autograd.grad(y, [x, *ps], dy)
    manual = BACKWARDS[mixer](x.detach(), dy, *[p.detach() for p in ps], scan="chunked")
    for name, g in zip(["x", *samu.functional.PARAMETER_NAMES[mixer]], auto):
        rel = ((manual[name] - g).norm() / g.norm()).item()
        rows.append({"mixer": mixer, "gradient": name, "formula vs autograd": rel})
        assert rel < 1e-12, (mixer, name, rel)
pd.DataFrame(rows)'''),
    md(r"""## 4. State in and out, resets and packed sequences

A sequence starting at token $s$ either **resets** ($h_s = u'_s$: $m_s=1$, $a_s$ counts as 0, no gradient into $a_s$'s
inputs) or, given an **initial state** $h^0$, takes an ordinary step from it: $h_s = a_s h^0 + m_s u'_s$ with
$u' = \mathrm{gate}\cdot x$. Packed sequences (`cu_seqlens`) put several sequences in one row; each start inside the row
behaves like a row's first token. The **final state** is $h$ at each sequence's last token.

**What crosses a chunk boundary.** The kernels fold every start into the scan's inputs,
$$a_s \to 0,\qquad u_s \to u_s + a_s\,h^0_s\quad(h^0_s = 0\text{ where the state resets}),$$
so the chunk summaries and the carry are exactly those of a scan from zero: a chunk that holds a start has decay
$\prod a = 0$, and no state crosses it. (SAMU's carry rebuilds a chunk's decay from its sum of $r$; a chunk holding a packed
start stores $+\infty$ there, whose decay is 0.)

**The backward.** The adjoint is cut at the same place, $\delta_t = \bar y_t + [t\text{ ends}]\,\overline{h^{\text{final}}} + [t+1\text{ does not start}]\,a_{t+1}\delta_{t+1}$,
the gradient reaching $\log a_s$ at a start uses $h^0$ as the previous state ($a_s h^0$), and the initial state receives
$$\overline{h^0} = a_s\,\delta_s .$$"""),
    code('''from samu.ops import layout as packing
offsets = [0, 3, 4, min(11, length - 1), length] if length > 12 else [0, length]
cu = torch.tensor(offsets)
seqs = packing.layout(1, length, "cpu", cu)
h0 = torch.randn(seqs.count, width, generator=gen, dtype=torch.float64)
entering = packing.dense_entering_state(seqs, h0, width, torch.float64)
a1, u1 = a[:1], u[:1]
# the sequential scan replaces the entering state; the chunked one folds the starts into its inputs
want = recurrence.scan_sequential(a1, u1, seqs.starts, entering)
for chunk in (1, 2, 5, 16):
    got = recurrence.scan_chunked(a1, u1, seqs.starts, entering, chunk=chunk)
    assert torch.allclose(got, want, rtol=1e-13, atol=1e-14), chunk
# each packed sequence equals the same tokens scanned alone from its initial state
for n, (lo, hi) in enumerate(zip(offsets, offsets[1:])):
    alone = recurrence.scan_sequential(a1[:, lo:hi], u1[:, lo:hi], seqs.starts[:, lo:hi],
                                       h0[n].expand(1, hi - lo, width) * seqs.starts[:, lo:hi, None])
    assert torch.allclose(want[:, lo:hi], alone, rtol=1e-13)
# a folded start makes its chunk's decay 0: nothing from before it survives
a_fold, _ = recurrence.fold_starts(a1, u1, seqs.starts, entering)
assert (a_fold[seqs.starts] == 0).all()
print("starts folded into the inputs = states replaced at the starts; packed = one by one: OK")'''),
    code('''# The backward's state algebra against autograd on the references (float64).
rows = []
for mixer in REFERENCES:  # every registered mixer
    module = samu.modules.MODULES[mixer](width).double()
    module.reset_parameters(generator=torch.Generator().manual_seed(seed))
    ps = [p.detach() for p in module.parameters()]
    x = torch.randn(1, length, width, generator=gen, dtype=torch.float64)
    h0_ = h0.clone().requires_grad_()
    y, final = REFERENCES[mixer](x, *ps, scan="sequential", initial_state=h0_, cu_seqlens=cu,
                                 output_final_state=True)
    d_final = torch.randn_like(final)
    (y * dy[:1]).sum().add((final * d_final).sum()).backward()
    inputs = (samu.ops.rglru.naive.rglru_scan_inputs if mixer == "rglru"
              else samu.ops.samu.naive.samu_scan_inputs)(x, *ps[:4 if mixer == "samu" else 5],
                                                          reset=torch.zeros_like(seqs.starts))
    a_ = inputs[1]
    # delta: dy, plus the final state's gradient at each end; nothing crosses a start backwards
    g = dy[:1].clone()
    g[seqs.ends] += d_final
    delta = recurrence.reverse_scan(a_, g, "sequential", seqs.starts)
    manual = a_[seqs.starts] * delta[seqs.starts]
    rel = ((manual - h0_.grad).norm() / h0_.grad.norm()).item()
    rows.append({"mixer": mixer, "d initial_state = a_s delta_s, vs autograd": rel})
    assert rel < 1e-12, (mixer, rel)
pd.DataFrame(rows)'''),
    md("## 5. Footprints against the published H800 result\n\nParameters and dynamic control values per token, from the formulas of SPEC section 2, beside the figures recorded in the published H800 result (`data/reference/h800_pcie_published_result.json`)."),
    code('''published = report.published_h800_document()
rows = []
for row in published["rows"]:
    w, mixer = row["shape"]["width"], row["architecture"]
    rows.append({"width": w, "mixer": mixer, "published parameters": row["parameters"],
                 "samu parameters": samu.parameter_count(mixer, w),
                 "published control values/token": row["dynamic_control_values_per_token"],
                 "samu control values/token": samu.dynamic_control_values_per_token(mixer, w)})
table = pd.DataFrame(rows).drop_duplicates()
print(table.to_string(index=False))
assert (table["published parameters"] == table["samu parameters"]).all()'''),
    md(r"""The published H800 result's RG-LRU rows record 2D control values per token (gx and ga per channel), as the formula
does; SAMU's two scalars per token are shared by every channel. The byte counts that bound the kernels are in SPEC
section 8 and in the module docstrings of `samu/ops/samu/chunk.py` and `samu/ops/rglru/gemm.py`."""),
    code('''assert (table["published control values/token"] == table["samu control values/token"]).all()'''),
])

save("01_correctness", [
    md("# 01 — Correctness: every backend against the float64 oracle at one shape\n\n"
       "Errors are normwise relative, ‖got − oracle‖ / ‖oracle‖, of y and of every gradient. The oracle runs in "
       "float64 from the same BF16-rounded x and FP32 parameters; the eager PyTorch autocast reference's errors stand "
       "beside them. A backend is legal when every error is at most 2 × the eager error + 1e-3 (SPEC section 4)."),
    params("batch = 1\nlength = 16\nwidth = 16\nshape_index = 0\nseed = 0\n" + MIXERS_PARAMETER),
    code(SETUP + MIXERS_CHOSEN),
    code('''import pandas as pd
doc = {"shape": list(shape), "environment": protocol.environment(device), "mixers": {}}
tables = []
for mixer in mixers:
    x, params, dy = legality.make_inputs(mixer, shape, device, seed)
    want = legality.oracle(mixer, x, params, dy)
    eager = legality.relative_errors(legality.outputs(mixer, "reference_chunked", x, params, dy), want)
    entries = [legality.check_legality(mixer, name, shape, device, seed, want, eager)
               for name in backends.available(mixer) if backends.REGISTRY[mixer][name].kind == "triton"]
    doc["mixers"][mixer] = entries
    tables.append(pd.DataFrame([{"mixer": mixer, "backend": "eager autocast reference", **eager, "legal": None}]
                               + [{"mixer": mixer, "backend": e["backend"], **e["errors"], "legal": e["legal"]}
                                  for e in entries]))
path = schema.write_json_atomic(paths.correctness_dir(slug) / f"{Shape.of(shape).key}.json", doc,
                                kind="correctness")
print("wrote", paths.relative(path))
for t in tables:
    display(t.set_index(["mixer", "backend"]).style.format(precision=2, na_rep="", formatter={
        c: "{:.1e}" for c in t.columns if c not in ("mixer", "backend", "legal")}))'''),
    code('''illegal = [(m, e["backend"], e["reason"]) for m, es in doc["mixers"].items() for e in es if not e["legal"]]
assert not illegal, illegal
print("every Triton backend is legal at", shape)'''),
])

save("02_calibration", [
    md('# 02 — Calibration: legality and forward+backward time of every backend at one shape\n\nLegal backends are ranked by their forward+backward GPU time on a GPU (one CUDA-graph replay: no host in it, since below L = 32768 the median of a synchronised call is mostly host time), by the median on a CPU; both are kept in the file. On a GPU each legal backend\'s peak memory is recorded too, and the choice that `backend="auto"` and notebook 03 take is the fastest, unless it holds more than the mixer\'s memory budget (' + BUDGETS + ' units of B·L·D BF16) and a backend within it is at most ' + TOLERANCE_PERCENT + ' % slower: then that one (SPEC section 4). The result is merged into `data/calibration/<gpu>.json` atomically. Reference backends materialise a state-sized transition, so they are recorded as illegal.'),
    params("batch = 1\nlength = 16\nwidth = 16\nshape_index = 0\nreps = 10\nseed = 0\n"
           + MIXERS_PARAMETER),
    code(SETUP + MIXERS_CHOSEN + '''
def triton_names(m):
    return [n for n in backends.available(m) if backends.REGISTRY[m][n].kind == "triton"]
names = {m: backends.available(m) for m in mixers}  # every backend
if device == "cpu":  # the interpreter is slow: two Triton backends per mixer exercise the pipeline
    reps = min(reps, 2)
    for m in mixers:
        keep = {backends.DEFAULTS[m], *triton_names(m)[:1]}
        names[m] = [n for n in backends.available(m) if n in keep or n.startswith("reference")]
    print("CPU run: interpreter timings rank nothing about a GPU; they only exercise the pipeline.")'''),
    code('''from tqdm import tqdm  # the text bar: tqdm.auto's widget bar needs ipywidgets
bar = tqdm(desc="calibrate", total=sum(len(v) for v in names.values()))
def progress(label):
    bar.set_postfix_str(label); bar.update()
result = calibration.calibrate_shape(shape, device, mixers, candidates=names, reps=reps, seed=seed,
                                     progress=progress)
bar.close()
cal = calibration.merge_calibration(slug, shape, result, protocol.environment(device))
for mixer, r in result.items():
    print(f"{mixer}: chosen {r['chosen']} ({r['chosen_by']}); ranked by {r['ranked_by']}: {r['ranking']}")
    # references are never chosen: a mixer without Triton backends has no choice, and auto runs its default
    assert r["chosen"] is not None or not triton_names(mixer), f"no legal {mixer} backend at {shape}"'''),
    code('''import pandas as pd, seaborn as sns, matplotlib.pyplot as plt
rows = [{"mixer": m, "backend": e["backend"], "median_ms": e["median_ms"],
         "gpu_time_ms": e["gpu_time_ms"], "peak_units": e.get("peak_units"),
         "chosen": e["backend"] == r["chosen"]}
        for m, r in result.items() for e in r["backends"] if e["legal"]]
df = pd.DataFrame(rows, columns=["mixer", "backend", "median_ms", "gpu_time_ms", "peak_units", "chosen"])
key = next(iter(result.values()))["ranked_by"]  # the same for every mixer on one device
memory = df["peak_units"].notna().any()  # a GPU measures peak memory; a CPU does not
palette = {m: samu.mixers.COLOURS[m] for m in result}  # each mixer's colour in every figure
fig, axes = plt.subplots(1, 2 if memory else 1, figsize=(13 if memory else 7, 4), squeeze=False)
sns.barplot(data=df, y="backend", x=key, hue="mixer", palette=palette, ax=axes[0][0])
axes[0][0].set_title(f"forward+backward {'GPU time' if key == 'gpu_time_ms' else 'median'} at {shape} ({slug})")
if memory:
    sns.barplot(data=df, y="backend", x="peak_units", hue="mixer", palette=palette, ax=axes[0][1])
    for m, r in result.items():
        if r.get("memory_budget_units") is not None:
            axes[0][1].axvline(r["memory_budget_units"], linestyle="--", linewidth=1,
                               color=palette[m])
    axes[0][1].set_title("peak memory above the inputs (units of B*L*D BF16; dashed: budgets)")
    axes[0][1].set_yticklabels([])
    axes[0][1].set_ylabel("")
fig.tight_layout(); plt.show()
df'''),
])

save("03_timing", [
    md("# 03 — Timing one shape by the protocol of the published H800 result\n\n"
       f"Every mixer of `mixers` ({LABELS} by default) in one process, 2 rounds, counterbalanced: round r starts at "
       "mixer (r + shape_index) mod their count and goes round (for two mixers, AB/BA); per round and mixer, warm-up first, then 5 CUDA-event samples each of forward, backward and "
       "forward+backward under BF16 autocast; the six memory figures around one forward+backward. The backend comes "
       "from the calibration file only (notebook 02). Beside the protocol's medians (which include the host): the GPU "
       "time of one forward+backward replayed from a CUDA graph, the public pipelines of `samu.experiment.peers` "
       "(eager gates or controller, then FLA's `chunk_hgrn` or `fused_recurrent_hgrn`, where fla-core and CUDA are "
       "there) timed in the same rounds, and the host cost at (1, 128, D) as a ratio to `torch.nn.Linear(D, D)`."),
    params("batch = 1\nlength = 16\nwidth = 16\nshape_index = 0\nseed = 0\n" + MIXERS_PARAMETER),
    code(SETUP + MIXERS_CHOSEN),
    code('''cal_path = paths.calibration_file(slug)
assert cal_path.exists(), f"{cal_path} is missing: run notebook 02 for {shape} first"
cal = schema.read_json(cal_path)
entry = cal["shapes"].get(Shape.of(shape).key)
assert entry, f"{cal_path} has no entry for {shape}: run notebook 02 for it first"
# as auto checks it: a choice calibrated under other launch settings is refused
dispatch.check_calibration({"shapes": {Shape.of(shape).key: entry}}, cal_path)
missing = [m for m in mixers if m not in entry]
assert not missing, f"{cal_path} has no entry for {missing} at {shape}: run notebook 02 for them first"
# no legal backend calibrated (a mixer without Triton backends): its default, which auto runs then
chosen = {m: entry[m]["chosen"] or backends.DEFAULTS[m] for m in mixers}
print("calibrated choice:", chosen)'''),
    code('''from tqdm import tqdm  # the text bar: tqdm.auto's widget bar needs ipywidgets
bar = tqdm(desc="timing", total=protocol.ROUNDS * len(chosen) * 3)
def progress(label):
    bar.set_postfix_str(label); bar.update()
rows = protocol.time_shape(shape, shape_index, chosen, device, seed=seed, progress=progress)
bar.close()
if device == "cuda":
    bandwidth = protocol.copy_bandwidth(device)
else:
    bandwidth = float("nan")  # the floor is a GPU's copy bandwidth (SPEC section 8): a CPU has none
    print(f"{report.CPU_NOTE}: no floor and no bandwidth.")
protocol.add_floor_figures(rows, bandwidth)
if device != "cuda":
    for r in rows:
        r["achieved_bandwidth_bytes_per_s"] = float("nan")
path = protocol.write_shape_result(slug, shape, rows, cal)
print("wrote", paths.relative(path))'''),
    code('''import pandas as pd
pd.DataFrame([{"mixer": r["architecture"], "backend": r["backend"],
               "forward_ms": r["forward"]["median_ms"], "backward_ms": r["backward"]["median_ms"],
               "forward_backward_ms": r["forward_backward"]["median_ms"],
               "times_floor": r["times_floor"],
               # the kernels' own time: one forward+backward replayed from a CUDA graph
               "gpu_time_ms": r.get("gpu_time_ms"), "gpu_time_times_floor": r.get("gpu_time_times_floor"),
               "peak_alloc_delta_MB": r["peak_allocated_delta_bytes"] / 2**20 if device == "cuda" else float("nan"),
               # each mixer's speedup over its baseline (samu.mixers: SAMU's over RG-LRU)
               **{k: v for k, v in r.items() if k.startswith("speedup_vs_")},
               # each public pipeline timed in the same rounds: its median and samu's speedup over it
               **{f"{name}_ms": p["forward_backward"]["median_ms"] for name, p in r["peers"].items()},
               **{f"speedup_vs_{name}": p["speedup"] for name, p in r["peers"].items()},
               # a synchronised forward+backward at (1, 128, D) against torch.nn.Linear(D, D)
               "host_ratio_to_linear": (r.get("host") or {}).get("ratio_to_linear")} for r in rows])'''),
    md("## Packed sequences beside the same tokens\n\nAt a batch-1 shape: 8 sequences of random lengths packed in the row "
       "(`cu_seqlens`), the same tokens as one plain row, one call per sequence, and one row from an initial state with "
       "its final state in the loss (`with_states`), each timed by the protocol's "
       "forward+backward samples and, on a GPU, replayed from a CUDA graph (`samu.experiment.features`; "
       "`benchmarks/benchmark_features.py` writes the H200's figures to `data/features/`)."),
    code('''if batch == 1 and length >= 8:
    samples = 10 if device == "cuda" else 1
    packing = [features.time_packing(m, chosen[m], length, width, device, count=8, samples=samples)
               for m in chosen]
    display(pd.DataFrame([{"mixer": p["mixer"], "backend": p["backend"], "variant": v,
                           "forward_backward_median_ms": p[v]["forward_backward_median_ms"],
                           "gpu_time_ms": p[v]["gpu_time_ms"]}
                          for p in packing for v in ("packed", "unpacked", "one_by_one", "with_states")]))
else:
    print(f"batch {batch}: packing takes batch 1")'''),
])

save("04_report", [
    md("# 04 — Report: measured rows beside the published H800 result\n\n"
       "Combines `data/results/<gpu>/*.json` into one document (schema version 1), sets it beside the published H800 "
       "result (`data/reference/h800_pcie_published_result.json`: H800 PCIe, torch 2.1.2) and draws the figures. "
       "Each row's floor is 10 bytes per element at its own GPU's copy bandwidth (SPEC section 8): 4.22 TB/s measured "
       "on the H200, 2.0 TB/s from the H800 PCIe datasheet. A CPU run (Triton's interpreter) has no floor, bandwidth "
       "or memory figures: its timings are no GPU result.\n\n"
       "`gpu_slug = None` shows this machine's results when `data/results/<this machine's slug>/` holds per-shape "
       "files, else the committed `nvidia-h200` results. `write = False` only reads them and draws the figures here; "
       "`make reproduce` runs this notebook with `write=True`, which writes `data/results/<gpu>.json` and "
       "`data/figures/<gpu>_*.png`."),
    params("gpu_slug = None\nwrite = False"),
    code('''import pandas as pd
from IPython.display import Image, display
from samu import paths
from samu.experiment import report
slug = gpu_slug or report.default_slug()
print(report.describe_choice(slug))
doc = report.combine(slug, write=write)
df = report.frame(doc)
published_df = report.frame(report.published_h800_document(), report.PUBLISHED_SOURCE)
env = doc["environment"]
print(f"{len(doc['rows'])} rows; gpu {env['gpu']}, torch {env['torch']}, triton {env.get('triton')}, "
      f"commit {(env.get('git_commit') or '?')[:7]}")'''),
    md("## Summary\n\nMedians in ms; `times_floor` is the forward+backward median over the floor, `gpu_time_ms` one "
       "forward+backward replayed from a CUDA graph (the kernels' own time, no host) and `gpu_time_times_floor` its "
       "multiple of the floor, `achieved_TBps` the floor's 10 bytes per element over the median, memory the peak "
       "allocated delta in units of B·L·D BF16 elements, `speedup_vs_peer` the first public pipeline's median (eager "
       "gates or controller, then FLA's `chunk_hgrn`, same rounds) over samu's, `speedup_vs_<name>` the same for each "
       "further pipeline the rows hold (FLA's `fused_recurrent_hgrn` as `fla_fused_recurrent_hgrn`), and "
       "`host_ratio_to_linear` the host cost of a forward+backward at (1, 128, D) over `torch.nn.Linear(D, D)`'s in "
       "the same run."),
    code('''pd.set_option("display.width", 200)
if df["cpu"].any():
    print(f"{report.CPU_NOTE}: floor, bandwidth and memory are NaN.")
report.summary_table(df)'''),
    md("## Beside the published H800 result (H800 PCIe, torch 2.1.2)"),
    code('''comparison = report.published_comparison(df, published_df)
if comparison.empty:
    print("No GPU rows at the shapes of the published H800 result.")
comparison'''),
    code('''report.speedups(pd.concat([published_df, df]))'''),
    md(f"## Figures\n\nTime per shape, {SPEEDUPS} with its spread, peak memory, and a roofline: achieved bandwidth "
       "(the floor's bytes over the median) against FLOPs per byte, under each GPU's copy bandwidth and the H200's "
       "compute ceilings."),
    code('''if write:
    for path in report.draw_figures(df, published_df, slug):
        print("wrote", paths.relative(path))
        display(Image(filename=str(path)))
else:
    for name, fig in report.figures(df, published_df).items():
        display(Image(data=report.png_bytes(fig)))'''),
    md("## Context parallelism on one GPU\n\n`samu.distributed` splits a sequence over the ranks of a `torch.distributed` group: each rank runs a summary pass over its slice, one `all_gather` of 2 × B × D FP32 values, its slice from the composed entering state, and in backward the same in reverse. `benchmarks/bench_context_parallel.py` times each rank's share of a forward+backward in turn on one GPU (the collectives simulated) against one plain call at L / P and one at L, at D = 2048 (`--check` runs P processes on the GPU over gloo and checks them against the float64 oracle). Below: the slowest rank's share over the call at L / P, by GPU time (CUDA-graph replay, where the file has it: the target, 1.3x at L = 2^18, is judged there) and by the protocol's medians (host time included), and what P GPUs gain over one call at L. The committed H200 timings are shown where this machine has none."),
    code('''from samu.experiment import context_parallel
try:
    cp_doc, cp_path = context_parallel.load(slug if slug != "cpu" else None)
except FileNotFoundError as exc:
    print(exc)
else:
    cp_env = cp_doc["environment"]
    print(f"{paths.relative(cp_path)}: {cp_env['gpu']}, torch {cp_env['torch']}, triton {cp_env.get('triton')}")
    cp_df = context_parallel.frame(cp_doc)
    display(Image(data=report.png_bytes(context_parallel.figure(cp_df, cp_env["gpu"]))))
    display(cp_df.round(3))'''),
    md("## Host cost against a Linear\n\nAt small shapes the host, not the GPU, sets a call's time. `benchmarks/host_budget.py` times a synchronised forward+backward at (1, 128, D) under BF16 autocast in rounds interleaved with `torch.nn.Linear(D, D)`'s, so that the host's drift (a Linear's time varies 2x between runs on the H200's host) falls on both. Left: each run's ratio for the calibrated defaults, against the targets (" + HOST_TARGETS + "); rows of backends timed by name (`--backends`) are in the table below, not drawn. Right: the latest run's time split into the autograd engine's cost with a do-nothing Function of the same inputs, samu's Python with every launch stubbed, and the rest. `docs/PERFORMANCE.md` says where each microsecond goes. The committed H200 rows are shown where this machine has none."),
    code('''from samu.experiment import host_cost
try:
    host_rows, host_path = host_cost.load(slug if slug != "cpu" else None)
except FileNotFoundError as exc:
    print(exc)
else:
    host_df = host_cost.frame(host_rows)
    host_env = host_rows[-1]["environment"]
    print(f"{paths.relative(host_path)}: {host_env['gpu']}, torch {host_env['torch']}, triton {host_env.get('triton')}")
    display(Image(data=report.png_bytes(host_cost.figure(host_df, host_env["gpu"]))))
    display(host_df.round(2).tail(6))'''),
])
def training_notebook():
    """Notebook 05: a section per study configuration (samu.experiment.training.CONFIGURATIONS),
    its tasks described from the task table (TASKS)."""
    from samu.experiment import training

    tasks = "\n".join(f"- {spec.description}" for spec in training.TASKS.values())
    studies = "\n".join(f"- `{c.name}`: {c.description}"
                        for c in training.CONFIGURATIONS.values())
    cells = [
        md("# 05 — Training: what each mixer learns, beside its training speed\n\n"
           "The same model (`samu.model.SequenceModel`: token embedding, pre-norm residual blocks of mixer and GELU MLP, final norm, tied head) is trained with each mixer from fixed seeds; only the mixer differs. The recurrent mixers are the library's modules inside Griffin's recurrent block (input and gate projections, a short causal convolution, the mixer, a GeLU gate; `recurrent_block = \"bare\"` runs the mixer alone); **attention** is the yardstick: causal self-attention (`scaled_dot_product_attention`, rotary positions) with the usual heads of `attention_head_dim` channels. Every run of a task has the same steps at most (warm-up, then cosine decay to the last step; or a warm-up, stable, decay schedule whose decay a plateau of the loss may start sooner, and an early stop once a task is solved, where a configuration sets them); each mixer is trained at every rate of a learning-rate sweep and scored at its best, flagged when the best is at the edge of the sweep (`lr_search = \"first_seed\"`: the first seed sweeps, widened past an edge best, and the other seeds run at its best). Every task is generated on the fly; nothing is downloaded. The tasks (`training.TASKS`):\n\n"
           + tasks + "\n\n"
           "**Sanity first.** Attention solves recall and copying at these sizes when trained well, and uses more context on the character LM than a bigram model of the corpus, so a study compares mixers on a task only where attention passes that task's bar at its shortest length (`sanity_bar` for accuracy, the bigram model's bits per character for the LM); with no task left its conclusion says *yardstick failed its sanity bar: no comparison*. The recall curves have a bar of their own. At a CPU's size the studies run too few steps to reach a GPU's bars: they exercise every step and are no result.\n\n"
           "The studies (`training.CONFIGURATIONS`), each in a section of its own below, at a GPU's size through `make train CONFIG=<name>` on CUDA (in parts: `PART=k`), and at a CPU's by default on any device (what nbval runs; on a GPU its files carry the GPU's name and `-cpu-size`, beside that GPU's study, never over it):\n\n"
           + studies + "\n\n"
           "Training speed: wall time per step and tokens per second after warm-up, and on CUDA the GPU time per step (CUDA events around forward, backward and the optimizer step; evaluation excluded). Each study writes `data/training/<device>[.<config>].json` and `data/figures/<device>_training_[<config>_]*.png`."),
        params('''configurations = None  # the studies to run (names of training.CONFIGURATIONS); None: every one
size = "cpu"  # "gpu" or "cpu": the studies' sizes; "cpu", the quick defaults (nbval's), on any device; make train passes "gpu" on CUDA
studies = None  # {name: its parameters} to run instead (make train passes those it checked); None: training.CONFIGURATIONS at `size`
overrides = {}  # parameters that replace each study's own, e.g. {"processes": 4}; checked like them
part = None  # the k-th part of one study's runs ("k/n", or k of its own parts); the part that finds every part merges them
write = True  # write the result files and figures
progress_log = None  # a file that receives one line per finished run (make train prints them)
device = None  # "cuda", "cuda:1" or "cpu"; None: CUDA when there is one, else the CPU
devices = None  # the devices the runs spread over, e.g. ["cuda:0", "cuda:1"]; None: just `device`
cpu_threads = 1  # torch's intra-op threads on a CPU: these models are tiny, more threads only contend
yardstick = True  # first, attention learning recall at a CPU's size (about 20 s on a CPU)'''),
        code('''import os
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default (FP fusion on); Triton 3.9 warns while unset
''' + QUIET_TQDM + '''
import torch
from IPython.display import Image, Markdown, display
from samu import paths
from samu.experiment import protocol, training
device = str(device or protocol.default_device())
if device == "cpu" and cpu_threads:
    torch.set_num_threads(cpu_threads)
if studies:  # the parameters make train checked, each study's own at both sizes
    configurations = list(studies)
options = dict(overrides=overrides, part=part, devices=devices, write=write, progress_log=progress_log,
               configurations=training.as_table(studies) if studies else None)
print(f"device {device} (files labelled {training.results_label(device, size)}); studies "
      f"{configurations or list(training.CONFIGURATIONS)} at a {size.upper()}'s size")'''),
        md("## The yardstick learns recall\n\nBefore the studies' own runs: attention alone on MQAR at a size a CPU trains in about 20 s (width 64, two layers, L = 64, 4 pairs over 16 tokens, 400 steps at lr 1e-3; `training.YARDSTICK`). It must reach `training.YARDSTICK_BAR` (0.9): a yardstick that cannot learn recall here would make every comparison below meaningless."),
        code('''if yardstick:
    check = training.yardstick_run(device, progress_log)
    print(f"attention on MQAR at L = {check['seq_len']}, {check['steps_completed']} steps: "
          f"accuracy {check['value']:.3f} (bar {training.YARDSTICK_BAR})")
    if device == "cpu":  # the bar was set in FP32 on a CPU; on a GPU (BF16) the studies' own bars apply
        assert training.sanity([check], bar=training.YARDSTICK_BAR)["passed"], "the yardstick did not learn recall"'''),
    ]
    for name, config in training.CONFIGURATIONS.items():
        cells += [
            md(f"## {config.label} (`{name}`)\n\n{config.description}\n\nThe plan, then the "
               "models' parameters by part for each task's vocabulary (the MLPs and the embedding "
               "are the same for every mixer; with Griffin's block the mixer part is the whole "
               "block)."),
            code(f"run = training.StudyRun.start({name!r}, configurations, size, device, **options)\n"
                 "if run:\n"
                 "    print(run.plan())\n"
                 "    print(run.models())\n"
                 "else:\n"
                 "    print(f\"not run here (configurations = {configurations!r})\")"),
            md("Each task at its shortest length (an example, or what its data is), then its "
               "runs: every length, mixer, learning rate and seed, each mixer at its best rate "
               "(`lr_at_edge`: the best is the lowest or highest rate swept)."),
            code('''for name in run.study.tasks if run else ():
    print(f"{training.TASK_NAMES[name]}:\\n{run.preview(name)}")
    display(run.run_task(name))'''),
            md("The recall curves, when the study has them: each point of the grid at each "
               "width, at its mixer's best rate; `still_learning`: its run's training loss was "
               "still falling when it stopped."),
            code('''if run and run.study.recall_curves:
    display(run.run_recall_curves())'''),
            md("The sanity bars: attention on the tasks that count for it, and the recall "
               "curves' own."),
            code('''if run:
    print(run.sanity_text())'''),
            md("The result document (every run at every rate, the environment; validated against "
               "the `training` schema and written atomically), its figures, and the conclusion "
               "computed from it."),
            code('''if run:
    doc = run.finish()
    print("wrote", ", ".join(str(paths.relative(p)) for p in run.written()) or "nothing (write = False)")
    for png in run.images():
        display(Image(data=png))
    display(Markdown(run.conclusion()))'''),
        ]
    save("05_training", cells)


training_notebook()


def transformers_notebook():
    """06: Hugging Face transformers' RecurrentGemma on samu (samu.integrations.transformers)."""
    save("06_transformers", [
        md("# RecurrentGemma in Hugging Face transformers, on samu\n\n`samu.integrations.transformers.patch(model)` makes a loaded `RecurrentGemmaForCausalLM` (or `RecurrentGemmaModel`) run the causal convolution and the RG-LRU of its recurrent blocks on samu, for training and generation, on transformers' own parameters and cache, and `unpatch()` gives the model its own code back. This notebook builds a tiny random model (no download), patches it, checks it against the unpatched model and shows where and why the numbers differ (`docs/SPEC.md`, section 3). It runs in seconds on a CPU. The model is float64, the oracle's precision, so samu runs its chunked reference here (`backend=\"auto\"`); a BF16 model on a GPU takes the calibrated Triton kernels."),
        params('''backend = "auto"  # samu's backend for the patched layers; the model is float64 (the oracle's precision), where "auto" takes the chunked reference and the Triton kernels do not run
seed = 0  # the tiny model's weights and tokens
hidden_size = 32  # the tiny model's width (2 heads)
lru_width = 48  # its RG-LRU's width (2 blocks)'''),
        code('''import copy
import torch
import transformers
from transformers import DynamicCache, RecurrentGemmaConfig, RecurrentGemmaForCausalLM
from transformers.models.recurrent_gemma import modeling_recurrent_gemma
import samu.integrations.transformers as samu_hf
from samu.integrations import weights

device = "cuda" if torch.cuda.is_available() else "cpu"
config = RecurrentGemmaConfig(num_hidden_layers=3, vocab_size=64, hidden_size=hidden_size,
                              intermediate_size=2 * hidden_size, num_attention_heads=2, lru_width=lru_width,
                              attention_window_size=64, block_types=("recurrent", "recurrent", "attention"))
torch.manual_seed(seed)
model = RecurrentGemmaForCausalLM(config)
with torch.no_grad():  # random weights away from the initialisation, so that every parameter counts
    for p in model.parameters():
        p.add_(0.2 * torch.randn_like(p))
model = model.to(device, torch.float64).eval()  # float64: the oracle's precision
print(f"transformers {transformers.__version__}; supported: {samu_hf.version_supported(transformers.__version__)}")
print(f"{sum(p.numel() for p in model.parameters()):,} parameters; layers: {config.layers_block_type}")'''),
        md("## Patch\n\nOne call; every check runs before anything changes. The parameters, the `state_dict` and the module tree stay transformers'."),
        code('''unpatched = copy.deepcopy(model)
handle = samu_hf.patch(model, backend=backend)
print(handle)
print(type(model.model.layers[0].temporal_block).__name__, type(model.model.layers[0].temporal_block.rg_lru).__name__)
assert list(model.state_dict()) == list(unpatched.state_dict())'''),
        md("## Training: logits, loss and gradients against transformers\n\ntransformers' scan accumulates in FP32 whatever the model's dtype, so against it as it is the float64 model agrees to FP32 precision; with its scan accumulating in float64 (the same formula, `acc_dtype`), to float64 precision."),
        code('''def step(m, ids, positions=None):
    m.zero_grad()
    out = m(input_ids=ids, position_ids=positions, labels=ids, use_cache=False)
    out.loss.backward()
    return out.logits.detach(), out.loss.item(), {n: p.grad.clone() for n, p in m.named_parameters()}

def worst(a, b):
    return max((a[n] - b[n]).abs().max().item() / b[n].abs().max().item() for n in b)

ids = torch.randint(3, 64, (2, 24), device=device)
logits, loss, grads = step(model, ids)
logits0, loss0, grads0 = step(unpatched, ids)
print(f"as transformers is:       logits {(logits - logits0).abs().max().item():.1e}, loss {abs(loss - loss0):.1e}, gradients {worst(grads, grads0):.1e}")

scan = samu_hf.HF_RGLRU._rnn_scan
samu_hf.HF_RGLRU._rnn_scan = lambda self, *a, **k: scan(self, *a, **dict(k, acc_dtype=torch.float64))
logits0, loss0, grads0 = step(unpatched, ids)
samu_hf.HF_RGLRU._rnn_scan = scan
print(f"its scan in float64:      logits {(logits - logits0).abs().max().item():.1e}, loss {abs(loss - loss0):.1e}, gradients {worst(grads, grads0):.1e}")
assert (logits - logits0).abs().max() < 1e-10 and worst(grads, grads0) < 1e-9
print("backends that ran:", handle.last_backends)'''),
        md("## Packed rows: a position of 0 starts a sequence\n\nA token whose `position_ids` entry is 0 resets the RG-LRU (as in transformers) and the convolution (transformers' `nn.Conv1d` reads across). Here row 0 packs two sequences; each part should equal its sequence run alone."),
        code('''positions = torch.cat([torch.arange(10), torch.arange(14)]).to(device)[None]
row = ids[:1]
with torch.no_grad():
    alone = torch.cat([unpatched(input_ids=row[:, :10]).logits, unpatched(input_ids=row[:, 10:]).logits], dim=1)
    ours = model(input_ids=row, position_ids=positions, use_cache=False).logits
    theirs = unpatched(input_ids=row, position_ids=positions, use_cache=False).logits
print(f"samu against the sequences alone:         {(ours - alone)[:, 10:].abs().max().item():.1e}")
print(f"transformers against the sequences alone: {(theirs - alone)[:, 10:].abs().max().item():.1e}  (its conv reads the first sequence)")'''),
        md("transformers' attention masks the packed sequences apart by their positions too; what remains for samu is transformers' FP32 scan in the sequences run alone (with it in float64 the packed row equals them to float64 precision: `tests/integrations/test_transformers.py`)."),
        md("## Generation\n\n`generate` works unchanged: a prompt is a prefill, each new token one `step` (one kernel launch on a GPU). The cache stays in transformers' format (`conv1d_state`, `recurrent_states`). Greedy tokens, and left-padded prompts against each prompt alone (transformers' own conv lets the padding into the first tokens)."),
        code('''def greedy(m, prompt, mask=None, new=8):
    with torch.no_grad():
        return m.generate(prompt, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0)[:, prompt.shape[1]:]

prompt = ids[:, :6]
print("samu:        ", greedy(model, prompt).tolist())
print("transformers:", greedy(unpatched, prompt).tolist())
assert torch.equal(greedy(model, prompt), greedy(unpatched, prompt))
padded = prompt.clone(); padded[1, :3] = 0
mask = torch.ones_like(padded); mask[1, :3] = 0
assert torch.equal(greedy(model, padded, mask)[1], greedy(unpatched, prompt[1:, 3:])[0])
print("left-padded row 1 equals its prompt alone")'''),
        md("## A cache continued over calls\n\nPass the same `DynamicCache` and the positions: a second prefill continues the convolution (transformers' restarts it), steps continue both."),
        code('''cache, parts = DynamicCache(config=config), []
pos = torch.arange(24, device=device)[None].expand(2, 24)
with torch.no_grad():
    for a, b in [(0, 10), (10, 20), (20, 21), (21, 24)]:
        parts.append(model(input_ids=ids[:, a:b], position_ids=pos[:, a:b], cache=cache, use_cache=True).logits)
    whole = model(input_ids=ids, use_cache=False).logits
print(f"four calls against one call: {(torch.cat(parts, dim=1) - whole).abs().max().item():.1e}")'''),
        md("## Weights both ways, and undoing the patch\n\n`to_samu_block` builds samu's own Griffin block (`samu.model.RecurrentBlock`) from a transformers block; `load_samu_block` copies one back; `samu.integrations.weights` holds the name and layout tables (transformers and recurrentgemma)."),
        code('''block = unpatched.model.layers[0].temporal_block
samu_block = samu_hf.to_samu_block(block).double()
x = torch.randn(2, 12, hidden_size, device=device, dtype=torch.float64)
with torch.no_grad():
    print(f"samu block against transformers' block (its scan in FP32): {(samu_block(x) - block(x, position_ids=torch.arange(12, device=device)[None], attention_mask=None, use_cache=False)[0]).abs().max().item():.1e}")
for e in weights.TABLES["transformers"]:
    if e.layout != "same" or e.samu != e.other:
        print(f"  {e.other:28} -> {e.samu:22} {e.layout}")
handle.unpatch()
print(handle, "| patched:", samu_hf.is_patched(model))'''),
    ])


transformers_notebook()


def out_dir() -> Path:
    """Where the notebooks go: notebooks/, or the folder SAMU_NOTEBOOKS_OUT names."""
    return Path(os.environ.get("SAMU_NOTEBOOKS_OUT") or ROOT / "notebooks")


def main(argv=None) -> int:
    argparse.ArgumentParser(prog="python tools/make_notebooks.py", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    out = out_dir()
    for name, nb in NOTEBOOKS.items():
        nbformat.write(nb, out / f"{name}.ipynb")
    print(f"notebooks written: {', '.join(NOTEBOOKS)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

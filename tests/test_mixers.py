"""The mixer registry: every layer takes its mixers from samu.mixers, so a third mixer is a spec
and a module.  The toy here is a diagonal recurrence with a per-channel constant decay,
h_t = a h_{t-1} + sqrt(1 - a^2) x_t, a = exp(-softplus(decay)); y = h."""
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from samu import backends, dispatch, functional, mixers, modules
from samu.experiment import legality
from samu.ops.recurrence import carry_dtype, transition
from samu.ops.layout import scan_sequences, with_final_state


def toy_reference(x, decay, scan="chunked", initial_state=None, cu_seqlens=None,
                  output_final_state=False):
    def scan_inputs(reset):
        cdt = carry_dtype(x)
        log_a = (-F.softplus(decay.to(cdt))).expand(x.shape).contiguous()
        a, m = transition(log_a, reset)
        return log_a, a, m * x.to(cdt)
    h, seqs = scan_sequences(x, scan_inputs, scan, initial_state, cu_seqlens)
    return with_final_state(h.to(x.dtype), h, seqs, output_final_state)


def toy_by_loop(x, decay):
    """The same recurrence, one token at a time in float64."""
    a = torch.exp(-F.softplus(decay.double()))
    h = torch.zeros(x.shape[0], x.shape[2], dtype=torch.float64)
    ys = []
    for t in range(x.shape[1]):
        h = x[:, t].double() if t == 0 else a * h + torch.sqrt(1 - a * a) * x[:, t].double()
        ys.append(h)
    return torch.stack(ys, 1)


class ToyDecay(modules.Mixer):
    mixer = "toy"

    def __init__(self, width, backend="auto", device=None):
        super().__init__(width, backend)
        self.decay = nn.Parameter(torch.empty(width, device=device))
        self.reset_parameters()

    def reset_parameters(self, generator=None):
        with torch.no_grad():
            self.decay.uniform_(-2.0, 2.0, generator=generator)

    def _parameters_in_order(self):
        return (self.decay,)


def toy_width(params):
    decay = params["decay"]
    if decay.dim() != 1:
        raise ValueError(f"toy: decay must have shape [D], got {list(decay.shape)}")
    return decay.shape[0]


TOY = mixers.MixerSpec(
    name="toy", label="Toy decay", parameter_names=("decay",), width_of=toy_width,
    check_shapes=lambda params, width: None,
    parameter_count=lambda width, num_heads: width,
    dynamic_control_values_per_token=lambda width: 0,
    reference=f"{__name__}:toy_reference", module=f"{__name__}:ToyDecay")


@pytest.fixture
def toy():
    with backends.registered_mixer(TOY) as spec:
        yield spec


def test_the_table_lists_both_mixers_and_every_layer_follows_it():
    assert mixers.names() == ["rglru", "samu"]
    assert list(functional.PARAMETER_NAMES) == list(modules.MODULES) == mixers.names()
    assert set(backends.REGISTRY) == set(mixers.names())
    assert functional.FUNCTIONS["samu"] is functional.samu
    with pytest.raises(ValueError, match="unknown mixer 'toy'; choose one of"):
        backends.available("toy")


def test_a_toy_mixer_runs_through_dispatch_and_equals_its_loop(toy):
    assert "toy" in mixers.names() and "toy" in backends.REGISTRY
    assert backends.available("toy") == ["reference_sequential", "reference_chunked"]
    module = ToyDecay(8)
    x = torch.randn(2, 37, 8)
    y = module(x)
    assert module.last_backend == dispatch.resolve("toy", x).name == "reference_chunked"
    torch.testing.assert_close(y.double(), toy_by_loop(x, module.decay.detach()),
                               rtol=1e-5, atol=1e-5)
    # The generic functional form, with the state keywords every mixer has.
    y2, final = functional.FUNCTIONS["toy"](x, module.decay, output_final_state=True)
    torch.testing.assert_close(y2, y)
    torch.testing.assert_close(final, y[:, -1].float())
    assert modules.parameter_count("toy", 8) == module.num_parameters == 8


def test_a_toy_mixer_refuses_bad_input_in_the_common_words(toy):
    decay = torch.zeros(8)
    with pytest.raises(ValueError, match=r"toy: x has width 4 but the mixer's width is 8 "
                                         r"\(the parameters: decay \(8,\)\)"):
        functional.mix("toy", torch.randn(1, 3, 4), decay)
    with pytest.raises(ValueError, match=r"toy: decay must have shape \[D\]"):
        functional.mix("toy", torch.randn(1, 3, 8), decay[None])
    with pytest.raises(TypeError, match=r"toy: takes 1 parameters \(decay\), got 2"):
        functional.mix("toy", torch.randn(1, 3, 8), decay, decay)


def test_a_toy_mixer_is_legal_against_its_float64_oracle(toy):
    entry = legality.check_legality("toy", "reference_chunked", (2, 300, 16), "cpu")
    assert entry["legal"] is False  # a reference materialises the transition: never chosen
    assert entry["reason"] == "materialises a state-sized transition"
    assert set(entry["errors"]) == {"y", "x", "decay"}
    assert all(err <= entry["bounds"][name] for name, err in entry["errors"].items())
    # With state and packed sequences, as every mixer is checked.
    x, params, dy = legality.make_inputs("toy", (1, 40, 16), "cpu")
    state = legality.make_state((1, 40, 16), "cpu", cu_seqlens=[0, 7, 40])
    got = legality.outputs("toy", "reference_chunked", x, params, dy, state)
    want = legality.oracle("toy", x, params, dy, state)
    errs = legality.relative_errors(got, want)
    assert set(errs) == {"y", "final_state", "x", "decay", "initial_state"}
    assert max(errs.values()) < 1e-2


def test_after_the_block_the_toy_is_gone():
    with backends.registered_mixer(TOY):
        assert "toy" in backends.REGISTRY
    assert "toy" not in mixers.MIXERS and "toy" not in backends.REGISTRY
    with pytest.raises(ValueError, match="unknown mixer"):
        functional.mix("toy", torch.randn(1, 3, 8), torch.zeros(8))
    with pytest.raises(ValueError, match="registered already"):
        with backends.registered_mixer(mixers.get("samu")):
            pass


def test_a_toy_mixer_trains_inside_griffins_block(toy):
    from samu.model import ModelConfig, SequenceModel
    config = ModelConfig(mixer="toy", vocab_size=16, width=16, layers=1,
                         recurrent_block="griffin")
    model = SequenceModel(config)
    assert type(model.blocks[0].mixer.mixer).__name__ == "ToyDecay"
    tokens = torch.randint(0, 16, (2, 12), generator=torch.Generator().manual_seed(0))
    loss = F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
    loss.backward()
    assert model.blocks[0].mixer.mixer.decay.grad.abs().sum() > 0


def test_a_toy_mixer_goes_through_the_protocol_and_the_report(toy, tmp_path, monkeypatch):
    """Three mixers timed in one process, each round starting one further along, their rows
    written, validated, combined and reported."""
    from samu import paths
    from samu.experiment import protocol, report
    monkeypatch.setattr(paths, "DATA", tmp_path)
    chosen = {"rglru": "reference_chunked", "samu": "reference_chunked",
              "toy": "reference_chunked"}
    rows = protocol.time_shape((1, 8, 16), 1, chosen, "cpu", peers=())
    assert [r["architecture"] for r in rows] == ["rglru", "samu", "toy"]
    toy_row = rows[2]
    # Round r starts at mixer (r + 1) mod 3: samu, toy, rglru; then toy, rglru, samu.
    assert [rd["order_index"] for rd in toy_row["rounds"]] == [1, 0]
    assert [rd["order_index"] for rd in rows[0]["rounds"]] == [2, 1]
    assert toy_row["parameters"] == 16 and toy_row["dynamic_control_values_per_token"] == 0
    protocol.write_shape_result("test-gpu", (1, 8, 16), rows)
    df = report.frame(report.combine("test-gpu", write=False))
    assert set(df["mixer"]) == {"rglru", "samu", "toy"}
    assert mixers.LABELS["toy"] == "Toy decay" and mixers.COLOURS["toy"] == "tab:purple"
    table = report.summary_table(df).set_index("mixer")
    assert table.loc["toy", "forward_backward_ms"] > 0 and table.loc["toy", "backend"] == \
        "reference_chunked"
    assert math.isnan(report.flops_per_element("toy", 16))  # the toy's spec counts none


def test_a_mixer_registered_again_is_checked_by_its_new_spec():
    """A remembered signature belongs to the spec it was checked under: the same name with
    stricter checks refuses what the old one let through."""
    x, decay = torch.randn(1, 3, 8), torch.zeros(8)
    with backends.registered_mixer(TOY):
        functional.mix("toy", x, decay)

    def refuse(params, width):
        raise ValueError("toy: decay refused by the new spec")
    with backends.registered_mixer(dataclasses.replace(TOY, check_shapes=refuse)):
        with pytest.raises(ValueError, match="refused by the new spec"):
            functional.mix("toy", x, decay)


def test_inside_checks_on_every_call_every_call_is_checked():
    """Outside the block a call's checks run once per signature; inside, on every call (what
    benchmarks/host_budget.py times), and nothing done there is remembered."""
    calls = []
    spec = dataclasses.replace(TOY, check_shapes=lambda params, width: calls.append(width))
    x, decay = torch.randn(1, 3, 8), torch.zeros(8)
    with backends.registered_mixer(spec):
        functional.mix("toy", x, decay)
        functional.mix("toy", x, decay)
        assert len(calls) == 1
        with functional.checks_on_every_call():
            functional.mix("toy", x, decay)
            functional.mix("toy", x[:, :2], decay)
        assert len(calls) == 3
        functional.mix("toy", x, decay)
        assert len(calls) == 3  # remembered from before the block
        functional.mix("toy", x[:, :2], decay)
        assert len(calls) == 4  # not remembered inside it


def run_notebook(name: str, code_cells: int | None = None, **parameters) -> dict:
    """A committed notebook's code cells (its first ``code_cells``; None: all) run in this
    process, the parameters set after its parameters cell as papermill sets them, so that the
    notebook sees a mixer registered here.  Returns the notebook's namespace."""
    import nbformat
    from samu import paths
    notebook = nbformat.read(paths.REPO_ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    cells = [cell for cell in notebook.cells if cell.cell_type == "code"][:code_cells]
    namespace = {"display": lambda *objects, **kwargs: None}  # a kernel's built-in
    for cell in cells:
        exec(compile(cell.source, name, "exec"), namespace)
        if "parameters" in cell.metadata.get("tags", []):
            namespace.update(parameters)
    return namespace


@pytest.mark.parametrize("name", ["01_correctness", "02_calibration", "03_timing"])
def test_the_notebooks_run_every_registered_mixer_by_default(toy, name, monkeypatch):
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")  # what the notebooks' setup sets
    setup = run_notebook(name, code_cells=2)  # the parameters, then the setup
    assert setup["mixers"] == ["rglru", "samu", "toy"]


def test_a_toy_mixer_goes_through_notebooks_01_to_04(toy, tmp_path, monkeypatch):
    """Correctness, calibration, timing and the report, as committed, run the toy, with no
    notebook edited (here the toy alone: the registered mixers' kernels take minutes under
    the interpreter, and nbval runs them).  Having no Triton backend, it has nothing to check
    for legality, calibration chooses nothing for it, and notebook 03 times its default,
    which auto runs then."""
    import matplotlib.pyplot as plt
    from samu import paths
    monkeypatch.setattr(paths, "DATA", tmp_path)
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")  # what the notebooks' setup sets
    run = dict(batch=1, length=8, width=16, mixers=["toy"])
    try:
        correctness = run_notebook("01_correctness", **run)
        assert correctness["doc"]["mixers"] == {"toy": []}  # no Triton backend to check
        calibrated = run_notebook("02_calibration", **run)
        assert calibrated["result"]["toy"]["chosen"] is None
        assert {e["backend"] for e in calibrated["result"]["toy"]["backends"]} == {
            "reference_sequential", "reference_chunked"}
        timed = run_notebook("03_timing", **run)
        assert timed["chosen"] == {"toy": "reference_chunked"}
        assert [r["architecture"] for r in timed["rows"]] == ["toy"]
        assert [p["mixer"] for p in timed["packing"]] == ["toy"]
        shown = run_notebook("04_report")
        assert shown["slug"] == dispatch.gpu_slug()  # this machine's, written above
        assert list(shown["df"]["mixer"]) == ["toy"]
        table = shown["report"].summary_table(shown["df"]).set_index("mixer")
        assert table.loc["toy", "backend"] == "reference_chunked"
    finally:
        plt.close("all")

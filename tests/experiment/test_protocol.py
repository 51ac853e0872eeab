import statistics

import pytest
import torch

from samu import mixers
from samu.experiment import peers, protocol, schema


@pytest.mark.parametrize("shape, floor", [((4, 2048, 2048), 0.040), ((1, 8192, 2560), 0.050),
                                          ((1, 32768, 1024), 0.080), ((1, 32768, 2048), 0.159)])
def test_floor_matches_spec(shape, floor):
    assert protocol.floor_ms(shape, protocol.COPY_BANDWIDTH["nvidia-h200"]) == pytest.approx(
        floor, abs=6e-4)


def test_copy_bandwidth_is_the_committed_rate_on_a_known_gpu_and_none_on_a_cpu(monkeypatch):
    assert protocol.copy_bandwidth("cpu") is None
    monkeypatch.setattr(protocol, "device_slug", lambda device: "nvidia-h200")
    monkeypatch.setattr(protocol, "measure_copy_bandwidth", lambda device: pytest.fail("measured"))
    assert protocol.copy_bandwidth("cuda") == protocol.COPY_BANDWIDTH["nvidia-h200"]
    monkeypatch.setattr(protocol, "device_slug", lambda device: "an-unknown-gpu")
    monkeypatch.setattr(protocol, "measure_copy_bandwidth", lambda device: 1.5e12)
    assert protocol.copy_bandwidth("cuda") == 1.5e12


@pytest.mark.parametrize("shape_index", [0, 1])
def test_protocol_rows_on_cpu(shape_index):
    chosen = {"rglru": "reference_chunked", "samu": "reference_chunked"}
    rows = protocol.time_shape((1, 8, 16), shape_index, chosen, "cpu")
    protocol.add_floor_figures(rows, 4.22e12)
    schema.validate(protocol.result_document(rows))
    by = {r["architecture"]: r for r in rows}
    for r in range(2):
        rglru_first = (r + shape_index) % 2 == 0
        assert by["rglru"]["rounds"][r]["order_index"] == (0 if rglru_first else 1)
        assert by["samu"]["rounds"][r]["order_index"] == (1 if rglru_first else 0)
    assert by["samu"]["controller"] == "fp32_fused_coords" and by["rglru"]["controller"] is None
    assert by["samu"]["parameters"] == 3 * 16 + 4
    assert by["samu"]["speedup_vs_rglru"] == pytest.approx(
        by["rglru"]["forward_backward"]["median_ms"] / by["samu"]["forward_backward"]["median_ms"])
    fb = by["samu"]["forward_backward"]
    assert fb["samples_ms"] == by["samu"]["rounds"][0]["forward_backward_ms"] + \
        by["samu"]["rounds"][1]["forward_backward_ms"]
    assert fb["minimum_ms"] <= fb["median_ms"] <= fb["maximum_ms"]


def test_summarize():
    s = protocol.summarize([1.0, 2.0, 3.0, 4.0])
    assert s["median_ms"] == 2.5 and s["mean_ms"] == 2.5
    assert s["std_ms"] == pytest.approx(1.118, abs=1e-3)


def test_git_commit_override_wins(monkeypatch):
    """A copied tree can carry a stale .git (the H200's copy did): SAMU_GIT_COMMIT is believed
    first; without it the commit comes from git."""
    monkeypatch.setenv("SAMU_GIT_COMMIT", "0123abc")
    assert protocol.environment()["git_commit"] == "0123abc"
    monkeypatch.delenv("SAMU_GIT_COMMIT")
    commit = protocol.environment()["git_commit"]
    assert commit is None or len(commit) == 40


CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def test_graph_replay_time_is_the_kernels_own():
    """On a GPU: positive and no more than the protocol's median (which adds the host); on a
    CPU there is no graph to replay."""
    module = protocol.build_module("samu", 64, "auto", DEVICE)
    x = torch.randn(2, 512, 64, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    gpu = protocol.graph_replay_ms(module, x, dy)
    if not CUDA:
        assert gpu is None
        return
    assert x.grad is None  # the replays leave nothing behind
    median = statistics.median(protocol.sample(module, x, dy, "forward_backward")
                               for _ in range(10))
    assert 0 < gpu <= 1.2 * median


def test_host_cost_is_a_ratio_to_a_linear_layer():
    module = protocol.build_module("samu", 64, "auto", DEVICE)
    cost = protocol.host_cost_us(module, 64, DEVICE, reps=5)
    if not CUDA:
        assert cost is None
        return
    assert cost["linear_us"] > 0 and cost["mixer_us"] > 0
    assert cost["ratio_to_linear"] == pytest.approx(cost["mixer_us"] / cost["linear_us"])


@pytest.mark.parametrize("name", [spec.name for spec in peers.PEERS])
@pytest.mark.parametrize("mixer", mixers.names())
def test_public_pipeline_computes_the_same_mixer(mixer, name):
    """Eager gates or controller then an FLA scan: the reference's function, on a GPU with
    fla-core; elsewhere no peer is built."""
    from samu.experiment import legality
    module = protocol.build_module(mixer, 64, "auto", DEVICE)
    registry = [spec for spec in peers.PEERS if spec.name == name]
    built = peers.peers_of(module, registry)
    if not CUDA or peers.fla_version() is None:
        assert built == {}
        return
    _, peer = built[name]
    x = torch.randn(1, 300, 64, device=DEVICE, dtype=torch.bfloat16)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = peer(x)
    params = {n: p.detach() for n, p in module.named_parameters()}
    want = legality.oracle(mixer, x, params, torch.zeros_like(x))["y"]
    assert ((got.double() - want).norm() / want.norm()).item() < 2e-2


@pytest.mark.parametrize("mixer", [name for name, spec in mixers.MIXERS.items()
                                   if spec.eager_preparation is not None])
def test_a_pipeline_of_the_eager_preparation_and_an_exact_scan_is_its_mixer(mixer):
    """The preparation each spec names, scanned exactly in float64 where FLA's scan would run,
    is the reference: the public pipelines time the same function."""
    from samu.ops import recurrence

    def scan(u, log_a):
        return recurrence.scan_sequential(torch.exp(log_a), u), None
    module = protocol.build_module(mixer, 16, "reference_sequential", "cpu").double()
    pipeline = peers.FlaPipeline(module, "chunk_hgrn", scan=scan)
    x = torch.randn(2, 20, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(pipeline(x), module(x), rtol=1e-12, atol=1e-12)
    assert pipeline.last_backend == peers.pipeline_name(mixer, "chunk_hgrn")


def test_the_first_peer_is_fla_chunk_hgrn_and_the_second_its_sequential_scan():
    assert [spec.name for spec in peers.PEERS] == [schema.SINGLE_PEER,
                                                   "fla_fused_recurrent_hgrn"]
    assert all(spec.serves("rglru") and spec.serves("samu") for spec in peers.PEERS)
    assert peers.pipeline_name("rglru", "chunk_hgrn") == "eager_gates_then_fla_chunk_hgrn"
    assert peers.pipeline_name("samu", "chunk_hgrn") == "eager_controller_then_fla_chunk_hgrn"


def toy_peer(mixer="samu", name="toy"):
    """A peer that runs anywhere: the mixer's own module, serving one mixer."""
    return peers.PeerSpec(name, (mixer,), "toy pipeline", available=lambda module: True,
                          build=lambda module: module, materialized_state_sized_transition=False)


def test_a_registered_peer_is_timed_beside_its_mixer_only():
    registry = (*peers.PEERS, toy_peer("samu"))
    chosen = {"rglru": "reference_chunked", "samu": "reference_chunked"}
    rows = protocol.time_shape((1, 8, 16), 1, chosen, "cpu", peers=registry)
    schema.validate(protocol.result_document(rows))
    by = {r["architecture"]: r for r in rows}
    assert by["rglru"]["peers"] == {}  # the FLA peers need CUDA; the toy serves SAMU only
    assert list(by["samu"]["peers"]) == ["toy"]
    toy = by["samu"]["peers"]["toy"]
    assert toy["pipeline"] == "reference_chunked"
    assert toy["materialized_state_sized_transition"] is False
    assert [rd["order_index"] for rd in toy["rounds"]] == \
        [rd["order_index"] for rd in by["samu"]["rounds"]]
    assert toy["forward_backward"]["samples_ms"] == \
        toy["rounds"][0]["forward_backward_ms"] + toy["rounds"][1]["forward_backward_ms"]
    assert toy["speedup"] == pytest.approx(toy["forward_backward"]["median_ms"]
                                           / by["samu"]["forward_backward"]["median_ms"])
    assert toy["gpu_time_ms"] is None and toy["host"] is None  # a CPU has neither


def test_peer_names_must_not_repeat():
    module = protocol.build_module("samu", 16, "reference_chunked", "cpu")
    with pytest.raises(ValueError, match="repeat"):
        peers.peers_of(module, (toy_peer(), toy_peer()))


def test_a_failed_capture_puts_the_generator_state_back(monkeypatch):
    """protocol.captured, with CUDA stood in for: the device generator's state is cloned before
    the capture and put back when the capture fails (a failed capture leaves it marked as
    capturing, and every random op after it raising); a capture that works keeps its graph."""
    from samu.experiment import protocol

    class Generator:
        def __init__(self):
            self.state, self.restored = "before", []

        def clone_state(self):
            return f"clone of {self.state}"

        def graphsafe_set_state(self, state):
            self.restored.append(state)

    class Capture:
        def __init__(self, graph):
            self.graph = graph

        def __enter__(self):
            generator.state = "capturing"

        def __exit__(self, *exc):
            return False

    generator = Generator()
    monkeypatch.setattr(torch.cuda, "default_generators", (generator,))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: "graph")
    monkeypatch.setattr(torch.cuda, "graph", Capture)

    def fails():
        raise RuntimeError("operation not permitted when stream is capturing")
    assert protocol.captured(fails) is None
    assert generator.restored == ["clone of before"]
    assert protocol.captured(lambda: None) == "graph"
    assert generator.restored == ["clone of before"]

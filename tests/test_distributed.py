"""Context parallelism (samu.distributed) over torch.distributed with gloo, against one process
holding the whole sequence; and samu.model under DDP and FSDP2 against one process on the whole
batch.

Three groups of processes run, once each (module-scoped fixtures): three ranks (uneven slices
10, 9, 11) for both mixers on the float64 reference and on the Triton backend in float32 (on
CUDA where there is a GPU, else under Triton's interpreter), once with a second backward; two
ranks (slices 7 and 17, lengths gathered by build_cp_context) for the reference cases without
initial state, the bad contexts, and the training runs; two ranks in a group whose collectives
time out in seconds, for calls that disagree or fail on one rank.  The workers are in
tests/distributed_workers.py; each writes its results with torch.save, and the tests here
compare them with what this process computes over the whole sequence.
"""
from __future__ import annotations

import fcntl
import math
import os
import socket
import time
import warnings

import pytest
import torch
import torch.multiprocessing as mp

import distributed_workers as workers
from samu.distributed import (build_cp_context, incoming_state, log_decay,
                              outgoing_cotangent, slice_layout)
from samu.experiment import spawned_ranks
from samu import mixers

# Whole-group deadline: a worker that hangs fails the test instead of the run.
DEADLINE_SECONDS = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_group(entry, world: int, out_dir, parent_work=None, deadline_s=DEADLINE_SECONDS):
    """Starts ``world`` ranks of ``entry``, runs ``parent_work()`` meanwhile, and returns
    (every rank's results, parent_work's result).  A worker's exception fails the test with its
    traceback; a group that outlives the deadline is killed and fails it too."""
    context = mp.start_processes(entry, args=(world, free_port(), str(out_dir)), nprocs=world,
                                 join=False, start_method="spawn")
    deadline = time.monotonic() + deadline_s
    try:
        mine = parent_work() if parent_work is not None else None
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                pytest.fail(f"the {world} ranks of {entry.__name__} did not finish within "
                            f"{deadline_s} s")
    except mp.ProcessRaisedException as exc:
        pytest.fail(f"a rank of {entry.__name__} raised:\n{exc}")
    except mp.ProcessExitedException as exc:
        if not spawned_ranks.died_after_writing(exc, out_dir, world):
            pytest.fail(f"a rank of {entry.__name__} died: {exc}")
        warnings.warn(spawned_ranks.kept_despite(exc))
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join(5)
    return spawned_ranks.load_results(out_dir, world), mine


def once_per_run(tmp_path_factory, name: str, run):
    """``run(out_dir)``'s result, computed once for the whole pytest run: pytest-xdist's workers
    each set up a module-scoped fixture they draw a test of, so the first one here runs the group
    under a file lock and saves what it returns, or why it failed; the others wait on the lock
    and load the result, or fail with the first one's reason rather than run the group again."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return run(tmp_path_factory.mktemp(name))
    # every worker's basetemp's parent, named by this run's id (the same in every worker)
    shared = (tmp_path_factory.getbasetemp().parent
              / f"{name}-{os.environ['PYTEST_XDIST_TESTRUNUID']}")
    result_file, failure_file = shared.with_suffix(".pt"), shared.with_suffix(".failed")
    with open(shared.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if result_file.is_file():
            return torch.load(result_file)
        if failure_file.is_file():
            pytest.fail(f"another worker's run of {name} failed:\n{failure_file.read_text()}")
        try:
            result = run(tmp_path_factory.mktemp(name))
        except BaseException as exc:
            failure_file.write_text(f"{type(exc).__name__}: {exc}")
            raise
        torch.save(result, result_file)
        return result


def references(cases, slices, layouts):
    return {workers.case_name(c): workers.full_sequence(c, slices, layouts) for c in cases}


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory):
    return once_per_run(tmp_path_factory, "three_ranks", lambda out: run_group(
        workers.three_ranks, 3, out,
        lambda: references(workers.THREE_CASES + workers.SECOND_BACKWARD_CASES,
                           workers.THREE_SLICES, workers.THREE_LAYOUTS)))


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    def parent_work():
        refs = references(workers.TWO_CASES, workers.TWO_SLICES, workers.TWO_LAYOUTS)
        for mixer in mixers.names():
            refs[f"train-{mixer}"] = workers.train(mixer, None)
        return refs
    return once_per_run(tmp_path_factory, "two_ranks",
                        lambda out: run_group(workers.two_ranks, 2, out, parent_work))


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    scale = want.norm().item()
    return (got - want).norm().item() / (scale if scale > 0 else 1.0)


def check_case(case, ranks: list[dict], want: dict):
    tolerance = workers.TOLERANCE[case[1]]
    name = workers.case_name(case)
    mine = [r[name] for r in ranks]
    errors = {"y": relative_error(torch.cat([m["y"] for m in mine], 1), want["y"]),
              "y without a graph": relative_error(
                  torch.cat([m["y_no_grad"] for m in mine], 1), want["y"]),
              "dx": relative_error(torch.cat([m["dx"] for m in mine], 1), want["dx"])}
    for i, pname in enumerate(workers.parameter_names(case[0])):
        errors[f"d {pname}"] = relative_error(mine[0]["params"][i], want["params"][i])
    if want["dh0"] is not None:
        errors["d initial_state"] = relative_error(mine[0]["dh0"], want["dh0"])
    for rank, m in enumerate(mine):
        rows = m["states"]
        if m["continues"]:  # the state at the slice end, the next rank's entering state
            carried = rows.shape[0] if m["sequence_ids"] is None else 1
            errors[f"rank {rank} slice-end state"] = relative_error(
                rows[-carried:], want["state_at"][rank])
            rows, ids = rows[:-carried], (m["sequence_ids"] or [])[:-1]
        else:
            ids = m["sequence_ids"]
        if ids is None:
            errors[f"rank {rank} final states"] = relative_error(rows, want["final"])
        elif ids:
            errors[f"rank {rank} final states {ids}"] = relative_error(rows, want["final"][ids])
    bad = {k: v for k, v in errors.items() if not v <= tolerance}
    assert not bad, f"{name}: errors above {tolerance:g}: {bad}"
    if case[1] == "triton_float32":
        assert all(not m["backend"].startswith("reference") for m in mine), \
            [m["backend"] for m in mine]


@pytest.mark.parametrize("case", workers.THREE_CASES, ids=workers.case_name)
def test_three_ranks_match_one_process(three_ranks, case):
    ranks, want = three_ranks
    check_case(case, ranks, want[workers.case_name(case)])


@pytest.mark.parametrize("case", workers.SECOND_BACKWARD_CASES, ids=workers.case_name)
def test_a_second_backward_with_retain_graph_matches_one_process(three_ranks, case):
    """Two backwards through one context-parallel graph (the first with retain_graph) give
    twice one backward's gradients, on the kernels' SliceRun (which runs its phases again) and
    through the slice's kept graph."""
    ranks, want = three_ranks
    check_case(case, ranks, want[workers.case_name(case)])


@pytest.mark.parametrize("case", workers.TWO_CASES, ids=workers.case_name)
def test_two_uneven_ranks_match_one_process(two_ranks, case):
    ranks, want = two_ranks
    check_case(case, ranks, want[workers.case_name(case)])


def test_local_cu_seqlens_in_the_context(three_ranks):
    ranks, _ = three_ranks
    name = workers.case_name(("samu", "reference_float64", "packed_spanning_h0"))
    assert [r[name]["local_cu_seqlens"] for r in ranks] == [[0, 5, 10], [0, 9], [0, 2, 3, 11]]
    assert [r[name]["sequence_ids"] for r in ranks] == [[0, 1], [1], [1, 2, 3]]
    assert [r[name]["continues"] for r in ranks] == [True, True, False]


EXPECTED_ERRORS = {
    "cu_seqlens_short": "cu_seqlens cover 20 tokens but the slices hold 24",
    "slice_lengths_mismatch": "the context's slice lengths [12, 12] give it 12",
    "ranks_disagree_on_cu_seqlens": "the ranks disagree on the global cu_seqlens",
    "wrong_width_on_one_rank": "rank 1: ValueError: samu: x has width 17",
    "cu_seqlens_passed_to_the_call": "the packed layout comes from the context",
    "grad_mode_differs": "disagree on whether the call builds a graph",
    "resets_of_the_whole_sequence_on_one_rank":
        "rank 1: ValueError: samu: resets must have x's shape without the width, [1, 17], got "
        "[1, 24]",
}


def test_a_bad_parameter_on_a_kernel_rank_raises_on_every_rank(three_ranks):
    """A middle rank runs only the kernels' summary phases: the mixer still checks its inputs
    there (a ctrl_weight of the wrong width would otherwise be read past its end)."""
    ranks, _ = three_ranks
    for rank, r in enumerate(ranks):
        got = r["bad_parameter"]
        assert got is not None, f"rank {rank} raised nothing"
        kind, message = got
        assert kind == "ValueError" and "rank 1: ValueError: samu: a_param must have shape " \
            "[8], got [16] (at the width 8 that ctrl_weight (2, 8) gives; x has width 16)" \
            in message, (rank, got)


def test_bad_contexts_raise_on_every_rank(two_ranks):
    ranks, _ = two_ranks
    for name, words in EXPECTED_ERRORS.items():
        for rank, r in enumerate(ranks):
            got = r["errors"][name]
            assert got is not None, f"{name}: rank {rank} raised nothing"
            kind, message = got
            assert kind == "ValueError" and words in message, (name, rank, got)


@pytest.mark.parametrize("mixer", mixers.names())
@pytest.mark.parametrize("wrap", ["ddp", "fsdp2"])
def test_data_parallel_training_matches_one_process(two_ranks, wrap, mixer):
    ranks, want = two_ranks
    got = [r[f"{wrap}-{mixer}"] for r in ranks]
    if isinstance(got[0], str):
        pytest.fail(f"{wrap} on CPU/gloo did not run: {got[0]}")
    assert got[0] == got[1]  # both ranks report the whole batch's loss
    reference = want[f"train-{mixer}"]
    assert len(reference) == workers.TRAINING_STEPS and reference[0] > reference[-1]
    for step, (a, b) in enumerate(zip(got[0], reference)):
        assert math.isclose(a, b, rel_tol=1e-8), (step, got[0], reference)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (NCCL)")
def test_data_parallel_training_over_nccl_on_two_gpus_matches_one_gpu(tmp_path):
    """DDP and FSDP2 over NCCL, a rank per GPU: the same losses as one GPU on the whole batch."""
    ranks, want = run_group(workers.two_gpus, 2, tmp_path,
                            lambda: {m: workers.train(m, None, device="cuda:0")
                                     for m in mixers.names()})
    for mixer in mixers.names():
        assert len(want[mixer]) == workers.TRAINING_STEPS and want[mixer][0] > want[mixer][-1]
        for wrap in ("ddp", "fsdp2"):
            got = [r[f"{wrap}-{mixer}"] for r in ranks]
            assert not isinstance(got[0], str), f"{wrap} over NCCL did not run: {got[0]}"
            assert got[0] == got[1]
            for step, (a, b) in enumerate(zip(got[0], want[mixer])):
                assert math.isclose(a, b, rel_tol=1e-8), (wrap, mixer, step, got[0], want[mixer])


# --- one process: the layout and the closed forms ------------------------------------------

def test_slice_layout_of_packed_sequences():
    cu = (0, 5, 21, 22, 30)
    first, middle, last = (slice_layout(r, (10, 9, 11), cu) for r in range(3))
    assert (first.piece_offsets, first.first_sequence, first.continued, first.continues) == \
        ((0, 5, 10), 0, False, True)
    assert (middle.piece_offsets, middle.first_sequence, middle.carries_through) == \
        ((0, 9), 1, True)
    assert (last.piece_offsets, last.first_sequence, last.last_sequence, last.head,
            last.continued, last.continues, last.carries_through) == \
        ((0, 2, 3, 11), 1, 3, 2, True, False, False)
    at_boundary = slice_layout(1, (10, 9, 11), (0, 5, 10, 21, 30))
    assert (at_boundary.continued, at_boundary.head, at_boundary.continues) == (False, 0, True)
    plain = slice_layout(0, (None, None), None)
    assert (plain.continued, plain.continues, plain.head) == (False, True, 0)


def test_closed_forms_equal_the_chain():
    gen = torch.Generator().manual_seed(0)
    world, rows, width = 4, 2, 3
    decays = torch.rand(world, rows, width, generator=gen, dtype=torch.float64)
    decays[2, 0] = 0.0  # a sequence starts in slice 2 of row 0
    ends = torch.randn(world, rows, width, generator=gen, dtype=torch.float64)
    adjoints = torch.randn(world, rows, width, generator=gen, dtype=torch.float64)
    summaries = torch.stack([decays, ends], dim=1)
    for rank in range(world):
        state = torch.zeros(rows, width, dtype=torch.float64)
        for j in range(rank):  # the serial chain the closed form replaces
            state = decays[j] * state + ends[j]
        assert torch.equal(incoming_state(summaries, rank), state)
        want = sum((torch.prod(decays[rank + 1:k], dim=0) * adjoints[k]
                    for k in range(rank + 1, world)), torch.zeros(rows, width,
                                                                  dtype=torch.float64))
        torch.testing.assert_close(outgoing_cotangent(decays, adjoints, rank), want)
    # A NaN in a slice before the cut stays before it, in both directions.
    poisoned = summaries.clone()
    poisoned[1, 1, 0] = float("nan")  # row 0's end state on slice 1; slice 2 cuts row 0
    assert torch.isfinite(incoming_state(poisoned, 3)[0]).all()
    assert not torch.isfinite(incoming_state(poisoned, 2)[0]).all()  # before the cut: it does
    hurt = adjoints.clone()
    hurt[3, 0] = float("nan")  # row 0's adjoint on slice 3, behind the cut of slice 2
    assert torch.isfinite(outgoing_cotangent(decays, hurt, 0)[0]).all()
    assert not torch.isfinite(outgoing_cotangent(decays, hurt, 2)[0]).all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("mixer", mixers.names())
def test_log_decay_is_the_reference_sum(mixer, dtype):
    from samu.ops.rglru.naive import rglru_scan_inputs
    from samu.ops.samu.naive import samu_scan_inputs
    gen = torch.Generator().manual_seed(1)
    module = workers.make_module(mixer, "reference_chunked")
    module.reset_parameters(generator=gen)
    params = [p.detach() + 0.1 * torch.randn(p.shape, generator=gen)
              for p in module._parameters_in_order()]
    x = torch.randn(2, 37, workers.WIDTH, generator=gen).to(dtype)
    scan_inputs = rglru_scan_inputs if mixer == "rglru" else samu_scan_inputs
    log_a = scan_inputs(x, *params[:5 if mixer == "rglru" else 4])[0]
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(log_decay(mixer, x, params), log_a.sum(1), rtol=tolerance,
                               atol=tolerance)


def test_the_context_parallel_call_runs_outside_torch_compile():
    """Its collectives and host-side checks run eagerly (SPEC section 3): a function placed
    between the decorator and the call once took the decorator instead."""
    import samu.distributed as distributed
    assert getattr(distributed.context_parallel, "_torchdynamo_disable", False) is True


def test_context_needs_torch_distributed():
    if torch.distributed.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        build_cp_context()



class _FailingRunner:
    """A SliceRun whose backward fails before it hands its adjoint out."""

    def forward(self, entering):  # None: a slice that starts its sequence and resets
        state = torch.zeros(1, 4) if entering is None else entering.clone()
        return state[:, None, :].expand(-1, 3, -1).clone(), state

    def backward(self, dy, d_final, end_cotangent):
        raise MemoryError("out of memory in the reverse summary")


def test_a_runner_that_fails_before_the_exchange_still_joins_it():
    """The other ranks wait in the adjoint gather: a rank whose backward fails before it
    hands its adjoint out still gathers (with its failure flag) and raises the group's error."""
    from samu.distributed import SliceCall, run_with_carry
    packets = []

    def gather(packet):  # rank 0 of 2; rank 1's packet says it did not fail
        packets.append(packet.clone())
        return torch.stack([packet, torch.zeros_like(packet)])
    layout = slice_layout(0, (3, 3))
    entering = torch.zeros(1, 4)
    x = torch.randn(1, 3, 4, requires_grad=True)
    call = SliceCall("samu", "auto", layout, gather, torch.ones(2, 1, 4), _FailingRunner(), [])
    y, states = run_with_carry(call, entering, x, None)
    with pytest.raises(RuntimeError, match=r"adjoint failed on rank\(s\) \[0\]") as raised:
        (y.sum() + states.sum()).backward()
    assert len(packets) == 1 and packets[0][-1] == 1
    assert isinstance(raised.value.__cause__, MemoryError)


def test_a_runner_refuses_a_backward_after_x_changed_in_place():
    """The runner path keeps x and the parameters itself; autograd's version check still
    refuses a backward after x was changed in place (the values the runner holds changed)."""
    from samu.distributed import SliceCall, run_with_carry
    layout = slice_layout(1, (3, 3))
    x = torch.randn(1, 3, 4)
    call = SliceCall("samu", "auto", layout, lambda t: torch.stack([t, t]),
                     torch.ones(2, 1, 4), _FailingRunner(), [])
    leaf = x.clone().requires_grad_()
    xin = leaf * 1.0  # not a leaf: in-place changes are allowed on it
    y, states = run_with_carry(call, torch.zeros(1, 4), xin, None)
    xin.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (y.sum() + states.sum()).backward()


def test_a_runner_refuses_a_backward_after_h0_changed_in_place():
    """On the first rank the runner starts from h0 itself: an in-place change to h0 after the
    forward is refused as for x, instead of a backward that reads the changed values."""
    from samu.distributed import SliceCall, run_with_carry
    layout = slice_layout(0, (3, 3))
    x = torch.randn(1, 3, 4, requires_grad=True)
    call = SliceCall("samu", "auto", layout, lambda t: torch.stack([t, t]),
                     torch.ones(2, 1, 4), _FailingRunner(), [])
    leaf = torch.randn(1, 4, requires_grad=True)
    h0 = leaf * 1.0  # not a leaf: in-place changes are allowed on it
    y, states = run_with_carry(call, None, x, h0)
    h0.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (y.sum() + states.sum()).backward()


# --- ranks that disagree, or fail on one rank ------------------------------------------------

# (exception type, words in its message on every rank).
MISMATCH_ERRORS = {
    "cu_seqlens_collide_at_build": (
        "ValueError", "build_cp_context: the ranks disagree on the global cu_seqlens: "
        "[0, 1, 4, 6, 10] on rank 0, [0, 3, 4, 5, 10] on rank 1"),
    "cu_seqlens_collide_in_the_call": (
        "ValueError", "samu (context parallel): the ranks disagree on the global cu_seqlens: "
        "[0, 1, 4, 6, 10] on rank 0, [0, 3, 4, 5, 10] on rank 1"),
    "slice_lengths_differ_in_the_call": (
        "ValueError", "the ranks disagree on the context's slice lengths: [5, 5] on rank 0, "
        "[5, 6] on rank 1"),
    "mixers_differ": ("ValueError", "the ranks disagree on the mixer: samu on rank 0, rglru on "
                                    "rank 1"),
    "heads_differ": ("ValueError", "the ranks disagree on the number of heads: [2, 4] by rank"),
    "output_final_state_not_a_bool_on_one_rank": (
        "TypeError", "rank 1: TypeError: samu: output_final_state must be True or False, got 1"),
    "return_backend_not_a_bool_on_one_rank": (
        "TypeError", "rank 1: TypeError: samu: return_backend must be True or False, got 'yes'"),
    "parameter_missing_on_one_rank": ("TypeError", "rank 1: TypeError: samu: takes 5 parameters"),
    "parameter_none_on_one_rank": (
        "TypeError", "rank 1: TypeError: samu: ctrl_weight must be a torch.Tensor, got NoneType"),
    "nested_cu_seqlens_on_one_rank": (
        "TypeError", "rank 1: TypeError: build_cp_context: cu_seqlens must hold integers, got "
        "list [0, 10] at position 0"),
    "fractional_slice_lengths": (
        "TypeError", "slice_lengths must hold integers, got float 2.7 at position 0"),
    "fractional_cu_seqlens": (
        "TypeError", "cu_seqlens must hold integers, got float 2.5 at position 1"),
    "nested_cu_seqlens": ("TypeError", "cu_seqlens must hold integers, got list [0, 4] at "
                                       "position 0"),
    "create_graph_on_one_rank": (
        "RuntimeError", "a double backward (create_graph=True, e.g. a gradient penalty) is not "
        "supported through a context-parallel call"),
    "create_graph_on_the_kernels": ("RuntimeError", "asked on rank(s) [0, 1]"),
    "second_backward_without_retain_graph": (
        "RuntimeError", "the slice's graph was freed by an earlier backward: pass "
        "retain_graph=True"),
    # After the adjoints' exchange: the rank whose graph cannot run twice raises the kernels'
    # own refusal, the other completes its backward (nothing waits).
    "second_backward_through_overwritten_gates": [
        ("RuntimeError", "so this graph cannot be backpropagated through twice"), None],
    # Calls that succeed, each rank checking its numbers against one process.
    "only_h0_needs_grad": None,
    "params_as_a_dict_by_name": None,
    "params_as_a_dict_of_other_names_on_one_rank": (
        "ValueError", "rank 1: ValueError: samu: params as a dict must hold exactly the "
        "parameters"),
    "params_not_a_sequence_on_one_rank": (
        "TypeError", "rank 1: TypeError: samu: params must be a sequence of tensors"),
    "resets_for_a_backend_without_a_mask_on_the_last_rank": (
        "ValueError", "rank 1: ValueError: samu: backend reference_without_a_mask does not take "
        "a reset mask"),
}


@pytest.fixture(scope="module")
def mismatched_ranks(tmp_path_factory):
    """Two ranks whose group times out in seconds, under a deadline a little longer: a rank
    left waiting, or a collective paired with another call's, fails these tests instead of
    hanging the suite."""
    ranks, _ = once_per_run(tmp_path_factory, "mismatched_ranks", lambda out: run_group(
        workers.mismatched_ranks, 2, out, deadline_s=4 * workers.MISMATCH_TIMEOUT_SECONDS + 60))
    return ranks


def test_every_case_of_the_mismatched_group_is_checked():
    assert set(MISMATCH_ERRORS) == set(workers.MISMATCH_CASES)


@pytest.mark.parametrize("name", workers.MISMATCH_CASES)
def test_a_call_that_disagrees_or_fails_on_one_rank_raises_on_every_rank(mismatched_ranks,
                                                                         name):
    """The error is raised on every rank before any summary is combined (none waits for a
    collective that another rank skipped), and the next good call on the same group matches
    one process over the whole sequence (no collective paired across calls)."""
    expected = MISMATCH_ERRORS[name]
    for rank, r in enumerate(mismatched_ranks):
        want = expected[rank] if isinstance(expected, list) else expected
        got = r[name]["outcome"]
        if want is None:
            assert got is None, (name, rank, got)
        else:
            assert got is not None, f"{name}: rank {rank} raised nothing"
            assert got[0] == want[0] and want[1] in got[1], (name, rank, got)
        after = r[name]["after"]
        assert isinstance(after, float) and after <= 1e-12, (name, rank, after)

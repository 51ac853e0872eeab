"""The kernel phases that context parallelism runs on a slice (slice_summary, start_adjoint of
each Triton family) against the float64 oracle: the reference over the slice from a zero state
(hloc), the sum of log a (A), and autograd through the reference (the adjoint at the start),
within SPEC section 4's bound (2 x the eager FP32 reference's error + 1e-3)."""
import pytest
import torch

from samu import backends
from samu import distributed as cp
from samu.experiment import legality
from samu import mixers

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CASES = [(m, n) for m in mixers.names()
         for n in backends.available(m) if backends.REGISTRY[m][n].kind == "triton"]


def _relative(got, want):
    return ((got.double() - want).norm() / want.norm()).item()


@pytest.mark.parametrize("shape", [(2, 37, 32), (1, 5, 48)], ids=str)
@pytest.mark.parametrize("mixer, name", CASES)
def test_slice_phases_match_the_oracle(mixer, name, shape):
    x, params, dy = legality.make_inputs(mixer, shape, DEVICE, seed=1)
    params = list(params.values())
    x64, p64, dy64 = x.double(), [p.double() for p in params], dy.double()
    gen = torch.Generator().manual_seed(2)
    entering = torch.randn(shape[0], shape[2], generator=gen, dtype=torch.float64).to(DEVICE)
    d_end = torch.randn(shape[0], shape[2], generator=gen, dtype=torch.float64).to(DEVICE)
    zeros = torch.zeros_like(entering)

    def generic(x, params, dy, dtype):
        """(A, hloc, mu) by the reference path in ``dtype``."""
        start, end = zeros.to(dtype), d_end.to(dtype)
        _, h, _ = cp._call(mixer, x, params, "reference_chunked", initial_state=start)
        state = entering.to(dtype).requires_grad_()
        y, final, _ = cp._call(mixer, x, params, "reference_chunked", initial_state=state)
        (mu,) = torch.autograd.grad([y, final], [state], [dy, end])
        return torch.exp(cp.log_decay(mixer, x, params)), h, mu
    want = generic(x64, p64, dy64, torch.float64)
    eager = [_relative(e, w) for e, w in zip(generic(x, params, dy, torch.float32), want)]

    module, config = cp.kernel_phases(mixer, x, name)
    assert module.__name__.endswith((".chunk", ".gemm", ".single_pass"))
    a, h = module.slice_summary(x, params, config)
    mu = module.start_adjoint(x, params, dy, d_end.float(), config)
    for name, got, w, e in zip(("A", "hloc", "mu"), (a, h, mu), want, eager):
        assert got.dtype == torch.float32 and got.shape == entering.shape, name
        error = _relative(got, w)
        assert error <= legality.ERROR_FACTOR * e + legality.ERROR_SLACK, (name, error, e)


def test_reference_backends_take_the_generic_path():
    x = torch.randn(1, 4, 16)
    for mixer in mixers.names():
        assert cp.kernel_phases(mixer, x, "reference_chunked") is None
        assert cp.kernel_phases(mixer, x.double(), "auto") is None


@pytest.mark.parametrize("with_state", [True, False], ids=["initial_state", "reset"])
@pytest.mark.parametrize("mixer, name", CASES)
def test_a_slice_from_a_sequence_start_ends_in_the_final_state(mixer, name, with_state):
    """slice_summary from a sequence start (the first rank's slice, a packed slice's last
    piece): h is the reference's final state, from an initial state or from the reset."""
    shape = (2, 21, 32)
    x, params, _ = legality.make_inputs(mixer, shape, DEVICE, seed=3)
    params = list(params.values())
    gen = torch.Generator().manual_seed(4)
    h0 = (torch.randn(shape[0], shape[2], generator=gen, dtype=torch.float64).to(DEVICE)
          if with_state else None)

    def final(x, params, dtype):
        state = None if h0 is None else h0.to(dtype)
        _, h, _ = cp._call(mixer, x, params, "reference_chunked", initial_state=state)
        return h
    want = final(x.double(), [p.double() for p in params], torch.float64)
    eager = _relative(final(x, params, torch.float32), want)
    module, config = cp.kernel_phases(mixer, x, name)
    _, h = module.slice_summary(x, params, config,
                                initial_state=None if h0 is None else h0.float(),
                                resets=h0 is None)
    assert h.dtype == torch.float32 and h.shape == (shape[0], shape[2])
    error = _relative(h, want)
    assert error <= legality.ERROR_FACTOR * eager + legality.ERROR_SLACK, (error, eager)


RUN_CASES = [(m, n) for m, n in CASES
             if backends.family_of(m, backends.REGISTRY[m][n].config).SliceRun is not None]


@pytest.mark.parametrize("mixer, name", RUN_CASES)
def test_a_slice_run_shares_its_phases_and_matches_the_oracle(mixer, name):
    """SliceRun: the summary (A, hloc), the forward from an entering state that reuses it, and
    the backward that hands out mu and takes the later ranks' cotangent g in, against the
    float64 reference: y, the end state, mu, and dx, every parameter's gradient and the
    entering state's with d_end + g on the end state."""
    shape = (2, 29, 48)
    x, params, dy = legality.make_inputs(mixer, shape, DEVICE, seed=5)
    params = list(params.values())
    gen = torch.Generator().manual_seed(6)
    entering, d_end, g = [torch.randn(shape[0], shape[2], generator=gen,
                                      dtype=torch.float64).to(DEVICE) for _ in range(3)]

    def reference(x, params, dy, dtype):
        x = x.detach().requires_grad_()
        params = [p.detach().requires_grad_() for p in params]
        _, hloc, _ = cp._call(mixer, x, params, "reference_chunked",
                              initial_state=torch.zeros_like(entering, dtype=dtype))
        state = entering.to(dtype).requires_grad_()
        y, final, _ = cp._call(mixer, x, params, "reference_chunked", initial_state=state)
        (mu,) = torch.autograd.grad([y, final], [state], [dy, d_end.to(dtype)],
                                    retain_graph=True)
        grads = torch.autograd.grad([y, final], [x, *params, state],
                                    [dy, (d_end + g).to(dtype)])
        a = torch.exp(cp.log_decay(mixer, x.detach(), [p.detach() for p in params]))
        return [a, hloc, y.detach(), final.detach(), mu, *grads]
    want = reference(x.double(), [p.double() for p in params], dy.double(), torch.float64)
    eager = [_relative(e, w) for e, w in zip(reference(x, params, dy, torch.float32), want)]

    module, config = cp.kernel_phases(mixer, x, name)
    if not module.SliceRun.fits(params, config):
        assert cp.slice_runner(mixer, cp.slice_layout(1, (3, 29, 5)), x, params, name) is None
        return  # the phases run apart (test_slice_phases_match_the_oracle)
    run = module.SliceRun(x, params, config)
    a, hloc = run.summary()
    y, final = run.forward(entering.float())
    handed = []

    def end_cotangent(mu):
        handed.append(mu.clone())
        return g.float()
    grads = run.backward(dy, d_end.float(), end_cotangent)
    assert len(handed) == 1
    got = [a, hloc, y, final, handed[0], *grads]
    names = (["A", "hloc", "y", "final", "mu", "dx"]
             + [f"d param {k}" for k in range(len(params))] + ["d entering"])
    assert len(got) == len(want) == len(names)
    for label, value, w, e in zip(names, got, want, eager):
        error = _relative(value, w)
        assert error <= legality.ERROR_FACTOR * e + legality.ERROR_SLACK, (label, error, e)


SHARING_CASES = [c for c in RUN_CASES
                 if not getattr(backends.REGISTRY[c[0]][c[1]].config, "recompute", False)]


def _sharing_inputs(mixer, name, shape, seed):
    """(x, params, dy, kernel module, config) of a configuration whose phases share work."""
    x, params, dy = legality.make_inputs(mixer, shape, DEVICE, seed=seed)
    params = list(params.values())
    module, config = cp.kernel_phases(mixer, x, name)
    if not module.SliceRun.fits(params, config):
        pytest.fail(f"{name} was picked as a configuration whose phases share their work")
    return x, params, dy, module, config


def _assert_within_bounds(got, want, eager):
    """Each value within the legality bound of the eager FP32 reference's error."""
    assert len(got) == len(want) == len(eager)
    for k, (value, w, e) in enumerate(zip(got, want, eager)):
        error = _relative(value, w)
        assert error <= legality.ERROR_FACTOR * e + legality.ERROR_SLACK, (k, error, e)


@pytest.mark.parametrize("mixer, name", SHARING_CASES[::2])
def test_end_cotangent_may_give_none_and_is_checked(mixer, name):
    """A backward whose end_cotangent gives None is the plain backward with its own final-state
    cotangent (against the float64 reference); one that gives a tensor of the wrong shape is
    refused before any kernel reads it."""
    shape = (2, 19, 48)
    x, params, dy, module, config = _sharing_inputs(mixer, name, shape, seed=7)
    gen = torch.Generator().manual_seed(8)
    entering, d_end = [torch.randn(shape[0], shape[2], generator=gen,
                                   dtype=torch.float64).to(DEVICE) for _ in range(2)]

    def reference(x, params, dy, dtype):
        x = x.detach().requires_grad_()
        params = [p.detach().requires_grad_() for p in params]
        state = entering.to(dtype).requires_grad_()
        y, final, _ = cp._call(mixer, x, params, "reference_chunked", initial_state=state)
        return torch.autograd.grad([y, final], [x, *params, state], [dy, d_end.to(dtype)])
    want = reference(x.double(), [p.double() for p in params], dy.double(), torch.float64)
    eager = [_relative(e, w) for e, w in zip(reference(x, params, dy, torch.float32), want)]
    run = module.SliceRun(x, params, config)
    run.summary()
    run.forward(entering.float())
    grads = run.backward(dy, d_end.float(), lambda mu: None)
    _assert_within_bounds(grads, want, eager)
    run = module.SliceRun(x, params, config)
    run.summary()
    run.forward(entering.float())
    with pytest.raises(ValueError, match="end_cotangent must return"):
        run.backward(dy, d_end.float(), lambda mu: mu[:1])


@pytest.mark.parametrize("mixer, name", SHARING_CASES[1::2])
def test_a_slice_run_that_resets_matches_a_call_without_initial_state(mixer, name):
    """SliceRun(resets=True), a slice where a sequence starts without an initial state: it
    resets there (m = 1 at the first token), which a zero entering state does not.  Its
    summary's end state, y, the final state and every gradient against the float64 reference
    without an initial state, with the later ranks' cotangent g on the end state;
    slice_runner picks it where no initial state is given."""
    shape = (2, 21, 48)
    x, params, dy, module, config = _sharing_inputs(mixer, name, shape, seed=9)
    gen = torch.Generator().manual_seed(10)
    d_end, g = [torch.randn(shape[0], shape[2], generator=gen, dtype=torch.float64).to(DEVICE)
                for _ in range(2)]

    def reference(x, params, dy, dtype):
        x = x.detach().requires_grad_()
        params = [p.detach().requires_grad_() for p in params]
        y, final, _ = cp._call(mixer, x, params, "reference_chunked")
        grads = torch.autograd.grad([y, final], [x, *params], [dy, (d_end + g).to(dtype)])
        return [final.detach(), y.detach(), final.detach(), *grads]
    want = reference(x.double(), [p.double() for p in params], dy.double(), torch.float64)
    eager = [_relative(e, w) for e, w in zip(reference(x, params, dy, torch.float32), want)]
    run = cp.slice_runner(mixer, cp.slice_layout(0, (21, 8)), x, params, name)
    assert isinstance(run, module.SliceRun) and run.resets
    _, hloc = run.summary()
    y, final = run.forward(None)
    handed = []

    def end_cotangent(mu):
        handed.append(mu)
        return g.float()
    *grads, d_entering = run.backward(dy, d_end.float(), end_cotangent)
    assert d_entering is None and len(handed) == 1
    _assert_within_bounds([hloc, y, final, *grads], want, eager)


@pytest.mark.parametrize("mixer, name", SHARING_CASES[:1] + SHARING_CASES[-1:])
def test_a_slice_run_refuses_an_entering_state_that_does_not_fit(mixer, name):
    """A run that resets takes no entering state and one that does not takes a [B, D] tensor:
    anything else is refused before a kernel runs (a wrong shape would be read past its end);
    slice_summary refuses a runner built for the other initial-state case."""
    shape = (2, 9, 48)
    x, params, _, module, config = _sharing_inputs(mixer, name, shape, seed=11)
    state = torch.zeros(shape[0], shape[2], device=DEVICE)
    for resets, entering, words in ((True, state, "takes no entering state"),
                                    (False, None, "must be a floating-point tensor"),
                                    (False, state[:1], r"shape \(2, 48\)"),
                                    (False, state.long(), "floating-point")):
        run = module.SliceRun(x, params, config, resets=resets)
        run.summary()
        with pytest.raises(ValueError, match=words):
            run.forward(entering)
    layout = cp.slice_layout(0, (shape[1], 4))
    runner = cp.slice_runner(mixer, layout, x, params, name)  # no initial state: resets
    with pytest.raises(ValueError, match="built without an initial state and is called with"):
        cp.slice_summary(mixer, layout, x, params, name, initial_state=state, runner=runner)


@pytest.mark.parametrize("mixer, name", CASES)
def test_the_phases_refuse_tensors_that_do_not_fit_x(mixer, name):
    """Every family's slice_summary and start_adjoint, and a sharing run's backward, take an
    initial state, dy and the end state's cotangent shaped by x and refuse any other before a
    kernel runs (each had its kernels read past the buffer); a refused backward leaves the run
    able to go on."""
    shape = (2, 9, 48)
    x, params, _ = legality.make_inputs(mixer, shape, DEVICE, seed=5)
    params = list(params.values())
    family, config = cp.kernel_phases(mixer, x, name)
    state, dy = torch.randn(2, 48, device=DEVICE), torch.randn(shape, device=DEVICE)
    with pytest.raises(ValueError, match=r"slice_summary: initial_state .* shape \(2, 48\)"):
        family.slice_summary(x, params, config, initial_state=state[:1])
    with pytest.raises(ValueError, match=r"start_adjoint: dy .* shape \(2, 9, 48\)"):
        family.start_adjoint(x, params, dy[..., :24], state, config)
    with pytest.raises(ValueError, match=r"start_adjoint: the end state's cotangent"):
        family.start_adjoint(x, params, dy, state[:1], config)
    if family.SliceRun is None or not family.SliceRun.fits(params, config):
        return
    run = family.SliceRun(x, params, config)
    run.summary()
    run.forward(state)
    with pytest.raises(ValueError, match=r"SliceRun.backward: the end state's cotangent"):
        run.backward(dy, state[:1], None)
    assert torch.isfinite(run.backward(dy, state, None)[0]).all()

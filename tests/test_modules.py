"""Modules and functional forms: names, shapes, footprints, autocast policy, clear errors."""
import numpy as np
import pytest
import torch

import samu
from samu.functional import PARAMETER_NAMES
from samu.modules import MODULES, parameter_count
from samu import mixers

SEED_FOOTPRINTS = {  # (width): (rglru parameters, samu parameters), from the seed file
    1024: (134144, 3076), 2048: (530432, 6148), 2560: (826880, 7684)}


@pytest.mark.parametrize("width", sorted(SEED_FOOTPRINTS))
def test_footprints_equal_seed(width):
    rglru, samu_ = samu.RGLRU(width), samu.SAMU(width)
    assert rglru.num_parameters == parameter_count("rglru", width) == SEED_FOOTPRINTS[width][0]
    assert samu_.num_parameters == parameter_count("samu", width) == SEED_FOOTPRINTS[width][1]
    assert rglru.dynamic_control_values_per_token == 2 * width
    assert samu_.dynamic_control_values_per_token == 2


def test_state_dict_is_the_contract():
    shapes = {k: tuple(v.shape) for k, v in samu.RGLRU(64).state_dict().items()}
    assert shapes == {"gate_x_weight": (16, 4, 4), "gate_x_bias": (64,),
                      "gate_a_weight": (16, 4, 4), "gate_a_bias": (64,), "a_param": (64,)}
    shapes = {k: tuple(v.shape) for k, v in samu.SAMU(64).state_dict().items()}
    assert shapes == {"ctrl_weight": (2, 64), "ctrl_bias": (2,), "a_param": (64,),
                      "log_temp": (), "skip": ()}
    for mixer, cls in (("rglru", samu.RGLRU), ("samu", samu.SAMU)):
        assert tuple(cls(32).state_dict()) == PARAMETER_NAMES[mixer]
        assert all(p.dtype == torch.float32 for p in cls(32).parameters())


def test_initialisation_distribution():
    torch.manual_seed(0)
    m = samu.RGLRU(2048)
    sp = torch.nn.functional.softplus(m.a_param.detach())
    u = torch.exp(-2 * sp)  # softplus(a_param) = -0.5 log U
    assert u.min() >= 0.9**2 - 1e-5 and u.max() <= 0.999**2 + 1e-5
    assert abs(m.gate_x_weight.std().item() - 1 / 128**0.5) < 0.01 * (1 / 128**0.5) * 5
    assert m.gate_x_bias.abs().max() == 0
    s = samu.SAMU(2048)
    assert abs(s.ctrl_weight.std().item() - 1 / 2048**0.5) < 0.002
    assert s.log_temp.item() == 0 and s.skip.item() == 0


@pytest.mark.parametrize("mixer", mixers.names())
def test_module_forward_cpu_policy(mixer):
    m = samu.modules.MODULES[mixer](32, backend="reference_chunked")
    x = torch.randn(2, 9, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m(x)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    assert m.last_backend == "reference_chunked"
    y.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in m.parameters())


@pytest.mark.parametrize("mixer", sorted(samu.modules.MODULES))
def test_triton_path_dtype_policy(mixer):
    """The default Triton backend (on CUDA, else the interpreter) keeps section 2's dtypes: y
    and dx in x's BF16, the final state and d initial state FP32, every parameter's gradient
    FP32."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    m = samu.modules.MODULES[mixer](32, backend=samu.backends.DEFAULTS[mixer]).to(device)
    x = torch.randn(2, 8, 32, dtype=torch.bfloat16, device=device, requires_grad=True)
    h0 = torch.randn(2, 32, device=device, requires_grad=True)
    y, state = m(x, initial_state=h0, output_final_state=True)
    assert m.last_backend == samu.backends.DEFAULTS[mixer]
    assert (y.dtype, state.dtype) == (torch.bfloat16, torch.float32)
    (y.float().sum() + state.sum()).backward()
    assert x.grad.dtype == torch.bfloat16 and h0.grad.dtype == torch.float32
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in m.parameters())


def test_functional_equals_module():
    m = samu.SAMU(16, backend="reference_sequential")
    x = torch.randn(1, 5, 16)
    y, name = samu.samu(x, *m.parameters(), backend="reference_sequential",
                        return_backend=True)
    assert name == "reference_sequential"
    assert torch.equal(y, m(x))


@pytest.mark.parametrize("mixer", mixers.names())
def test_non_contiguous_input(mixer):
    m = samu.modules.MODULES[mixer](16, backend="reference_chunked")
    x = torch.randn(5, 2, 16).transpose(0, 1)
    assert not x.is_contiguous()
    assert torch.allclose(m(x), m(x.contiguous()))


@pytest.mark.parametrize("mixer", mixers.names())
@pytest.mark.parametrize("bad, error, words", [
    (torch.randn(4, 16), ValueError, "rank 3"),
    (torch.randn(1, 2, 4, 16), ValueError, "rank 3"),
    (torch.randn(1, 4, 32), ValueError, "width 32"),
    (torch.randn(1, 0, 16), ValueError, "empty"),
    (torch.randn(0, 3, 16), ValueError, "empty"),
    (torch.randint(0, 3, (1, 4, 16)), TypeError, "dtype"),
    (torch.randn(1, 4, 16).to(torch.complex64), TypeError, "dtype"),
    (torch.randn(1, 4, 16, device="meta"), ValueError, "device"),
    ([[1.0]], TypeError, "torch.Tensor"),
])
def test_bad_input_is_refused_clearly(mixer, bad, error, words):
    m = samu.modules.MODULES[mixer](16, backend="reference_chunked")
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.raises(error, match=words):
        m(bad)
    assert m.last_backend is None  # no state touched
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())


@pytest.mark.parametrize("mixer, fixing, other", [
    ("samu", r"ctrl_weight \(2, 8\)", r"a_param must have shape \[8\], got \[16\]"),
    ("rglru", r"gate_x_weight \(1, 8, 8\)", r"gate_x_bias must have shape \(8,\), got \(16,\)"),
])
def test_parameters_that_disagree_are_named_not_x(mixer, fixing, other):
    # The width comes from one parameter; where it disagrees with the others, x (which agrees
    # with them) is not blamed: the message names both parameters and their widths.
    module = samu.modules.MODULES[mixer](16, **({"num_heads": 2} if mixer == "rglru" else {}))
    params = [p.detach() for p in module.parameters()]
    params[0] = params[0][..., :8] if mixer == "samu" else params[0][:1]
    with pytest.raises(ValueError, match=rf"^{mixer}: {other} \(at the width 8 that {fixing} "
                                         r"gives; x has width 16\)$") as refused:
        samu.functional.FUNCTIONS[mixer](torch.randn(1, 4, 16), *params)
    assert "but the mixer's width" not in str(refused.value)
    # x agreeing with the parameter that fixes the width: the odd parameter is named
    with pytest.raises(ValueError, match=rf"^{mixer}: {other}$"):
        samu.functional.FUNCTIONS[mixer](torch.randn(1, 4, 8), *params)


def test_a_wrong_shape_of_no_width_beside_an_x_of_another_width_is_named_as_such():
    # log_temp has no width: nothing says the parameters disagree on one
    module = samu.SAMU(8)
    params = [p.detach() for p in module.parameters()]
    named = dict(zip(samu.mixers.get("samu").parameter_names, params))
    params[list(named).index("log_temp")] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"^samu: log_temp must have shape \[\], got \[1\] "
                                         r"\(at the width 8 that ctrl_weight \(2, 8\) gives; "
                                         r"x has width 16\)$"):
        samu.functional.FUNCTIONS["samu"](torch.randn(1, 4, 16), *params)


@pytest.mark.parametrize("mixer", mixers.names())
def test_x_that_disagrees_with_agreeing_parameters_is_blamed_with_their_shapes(mixer):
    module = samu.modules.MODULES[mixer](16, **({"num_heads": 2} if mixer == "rglru" else {}))
    params = [p.detach() for p in module.parameters()]
    with pytest.raises(ValueError, match=r"x has width 32 but the mixer's width is 16 "
                                         r"\(the parameters: .*a_param \(16,\)") as refused:
        samu.functional.FUNCTIONS[mixer](torch.randn(1, 4, 32), *params)
    assert "at the width" not in str(refused.value)


def test_width_not_divisible_by_heads():
    with pytest.raises(ValueError, match="not divisible by num_heads 16"):
        samu.RGLRU(40)
    m = samu.RGLRU(32)
    with pytest.raises(ValueError, match="gate_x_bias"):
        samu.rglru(torch.randn(1, 3, 32), m.gate_x_weight, m.gate_x_bias[:-1],
                   m.gate_a_weight, m.gate_a_bias, m.a_param)


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown backend 'fastest'"):
        samu.SAMU(16, backend="fastest")


def test_parameter_on_other_device_refused():
    m = samu.SAMU(16)
    with pytest.raises(ValueError, match="ctrl_weight is on meta"):
        samu.samu(torch.randn(1, 2, 16), m.ctrl_weight.to("meta"), m.ctrl_bias, m.a_param,
                  m.log_temp, m.skip)


@pytest.mark.parametrize("make, error, words", [
    (lambda: samu.RGLRU(2048, num_heads=0), ValueError,
     "rglru: num_heads must be a positive integer dividing width 2048, got 0"),
    (lambda: samu.RGLRU(2048, num_heads=-16), ValueError,
     "rglru: num_heads must be a positive integer dividing width 2048, got -16"),
    (lambda: samu.RGLRU(32, num_heads=2.0), TypeError, "rglru: num_heads must be a positive"),
    (lambda: samu.RGLRU(32, num_heads=True), TypeError, "rglru: num_heads .* got bool True"),
    (lambda: samu.RGLRU(True, num_heads=1), TypeError, "rglru: width .* got bool True"),
    (lambda: samu.SAMU(True), TypeError, "samu: width .* got bool True"),
    (lambda: samu.SAMU(16.0), TypeError, "samu: width must be a positive integer, got float"),
    (lambda: samu.SAMU(np.int64(16)), TypeError, r"\(a Python int; int\(...\) converts it\), "
                                                 r"got int64"),
    (lambda: samu.SAMU(0), ValueError, "samu: width must be a positive integer, got 0"),
])
def test_bad_sizes_are_refused_clearly(make, error, words):
    with pytest.raises(error, match=words):
        make()


@pytest.mark.parametrize("mixer, width, heads", [
    ("samu", -64, 1), ("samu", 0, 16), ("samu", 16.0, 16), ("samu", True, 16),
    ("rglru", 64, -1), ("rglru", 64, 3), ("rglru", 64, 0), ("rglru", 64, 2.0),
    ("rglru", -64, 16), ("rglru", 40, 16), ("rglru", 16, None),
])
def test_counts_refuse_the_sizes_the_constructor_refuses_with_its_words(mixer, width, heads):
    heads_kw = {"num_heads": heads} if mixer == "rglru" else {}
    with pytest.raises((TypeError, ValueError)) as made:
        samu.modules.MODULES[mixer](width, **heads_kw)
    with pytest.raises(made.type) as counted:
        parameter_count(mixer, width, heads)
    assert str(counted.value) == str(made.value)
    if heads_kw:  # a width the constructor accepts keeps the count's words the same
        return
    with pytest.raises(made.type) as counted:
        samu.dynamic_control_values_per_token(mixer, width)
    assert str(counted.value) == str(made.value)


def test_counts_of_good_sizes_and_unknown_mixers():
    assert parameter_count("rglru", 64, 4) == samu.RGLRU(64, num_heads=4).num_parameters == 2240
    assert parameter_count("samu", 64, 3) == samu.SAMU(64).num_parameters  # heads: RG-LRU's only
    assert samu.dynamic_control_values_per_token("samu", 64) == 2
    assert samu.dynamic_control_values_per_token("rglru", 64) == 128
    with pytest.raises(TypeError, match="rglru: width must be a positive integer"):
        samu.dynamic_control_values_per_token("rglru", 64.0)
    for count in (parameter_count, samu.dynamic_control_values_per_token):
        with pytest.raises(ValueError,
                           match=r"unknown mixer 'lstm'; choose one of \['rglru', 'samu'\]"):
            count("lstm", 64)


@pytest.mark.parametrize("mixer", mixers.names())
def test_non_tensor_parameter_is_refused_by_name(mixer):
    m = samu.modules.MODULES[mixer](16, backend="reference_chunked")
    params = dict(m.named_parameters())
    for name in PARAMETER_NAMES[mixer]:
        bad = dict(params, **{name: params[name].reshape(-1).tolist()})
        with pytest.raises(TypeError, match=f"^{mixer}: {name} must be a torch.Tensor, got list$"):
            samu.functional.FUNCTIONS[mixer](torch.randn(1, 3, 16), **bad)
        # a bad x as well: the parameter, checked first, is named
        with pytest.raises(TypeError, match=f"{mixer}: {name} must be a torch.Tensor"):
            samu.functional.FUNCTIONS[mixer]([[1.0]], **bad)


@pytest.mark.parametrize("mixer", mixers.names())
def test_a_checked_signature_skips_the_checks(mixer, monkeypatch):
    """The second call with one signature runs no shape check; another dtype, shape or keyword
    is checked again, and a bad call is never remembered."""
    m = samu.modules.MODULES[mixer](16, backend="reference_chunked")
    monkeypatch.setattr(samu.functional, "_CHECKED", {})
    checks = {"check_input": [], "check_parameters": [], "check_sequences": []}
    for name, calls in checks.items():
        real = getattr(samu.checks, name)
        monkeypatch.setattr(samu.checks, name,
                            lambda *a, calls=calls, real=real: (calls.append(a), real(*a))[1])
    x = torch.randn(2, 5, 16)
    m(x)
    m(torch.randn(2, 5, 16))
    assert [len(c) for c in checks.values()] == [1, 1, 0]
    m(x.double())
    m(torch.randn(2, 6, 16))
    m(x, output_final_state=True)
    m(x, output_final_state=True)
    assert [len(c) for c in checks.values()] == [4, 4, 1]
    for _ in range(2):
        with pytest.raises(ValueError, match="width 32"):
            m(torch.randn(2, 5, 32))
    assert len(checks["check_input"]) == 6
    with pytest.raises(ValueError, match=r"initial_state must have shape \[2, 16\]"):
        m(x, initial_state=torch.zeros(3, 16))
    m(x, initial_state=torch.zeros(2, 16))
    assert len(samu.functional._CHECKED) == 5


@pytest.mark.parametrize("mixer", mixers.names())
def test_a_checked_signature_still_checks_packed_offsets(mixer):
    """Offsets' values are not in a signature: the same shapes with bad values are refused."""
    m = samu.modules.MODULES[mixer](16, backend="reference_chunked")
    x = torch.randn(1, 6, 16)
    m(x, cu_seqlens=torch.tensor([0, 2, 6]))
    for bad, words in (([0, 3, 5], "end at the length 6"), ([0, 6, 6], "must increase")):
        with pytest.raises(ValueError, match=words):
            m(x, cu_seqlens=torch.tensor(bad))


def test_a_checked_signature_still_refuses_a_parameter_changed_in_kind():
    """A parameter replaced by one of another dtype or device is a new signature."""
    m = samu.SAMU(16, backend="reference_chunked")
    x = torch.randn(1, 3, 16)
    samu.samu(x, m.ctrl_weight, m.ctrl_bias, m.a_param, m.log_temp, m.skip)
    with pytest.raises(ValueError, match="ctrl_weight is on meta"):
        samu.samu(x, m.ctrl_weight.to("meta"), m.ctrl_bias, m.a_param, m.log_temp, m.skip)
    with pytest.raises(TypeError, match="a_param must be floating point"):
        samu.samu(x, m.ctrl_weight, m.ctrl_bias, m.a_param.long(), m.log_temp, m.skip)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta:UserWarning")
@pytest.mark.parametrize("mixer", mixers.names())
@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_a_sparse_input_is_refused_by_name(mixer, layout):
    """A sparse x, or parameter, is refused by name, even where a dense call of the same shape
    was remembered as checked."""
    m = samu.modules.MODULES[mixer](16, backend="reference_chunked")
    x = torch.randn(2, 4, 16)
    m(x)
    sparse = x.to_sparse() if layout == "coo" else x.to_sparse_csr()
    with pytest.raises(TypeError, match=f"^{mixer}: x must be a dense tensor, got layout "
                                        r"torch\.sparse_.*x\.to_dense\(\)"):
        m(sparse)
    with pytest.raises(TypeError, match=f"^{mixer}: x_t must be a dense tensor"):
        m.step(x[:, 0].to_sparse() if layout == "coo" else x[:, 0].to_sparse_csr())
    params = dict(zip(PARAMETER_NAMES[mixer], m._parameters_in_order()))
    bad = dict(params, a_param=params["a_param"].detach().to_sparse())
    with pytest.raises(TypeError, match=f"^{mixer}: parameter a_param must be a dense tensor"):
        samu.functional.FUNCTIONS[mixer](x, **bad)

    def sparse_of(t):  # CSR needs two dimensions; cu_seqlens has one
        return t.to_sparse() if layout == "coo" or t.dim() < 2 else t.to_sparse_csr()

    resets = torch.zeros(2, 4, dtype=torch.bool)
    keywords = dict(initial_state=(x, torch.randn(2, 16)), resets=(x, resets),
                    cu_seqlens=(x[:1], torch.tensor([0, 1, 4])))
    for name, (rows, value) in keywords.items():
        with pytest.raises(TypeError, match=f"^{mixer}: {name} must be a dense tensor"):
            m(rows, **{name: sparse_of(value)})
    with pytest.raises(TypeError, match=f"^{mixer}: state must be a dense tensor"):
        m.step(x[:, 0], sparse_of(torch.randn(2, 16)))
    with pytest.raises(TypeError, match=f"^{mixer}: resets must be a dense tensor"):
        m.step(x[:, 0], torch.randn(2, 16), resets=sparse_of(resets[:, 0]))


class _Stepping(torch.nn.Module):
    """A module whose forward is one decode step of ``mixer``: what torch.jit.trace takes."""

    def __init__(self, mixer):
        super().__init__()
        self.mixer = mixer

    def forward(self, x_t):
        return self.mixer.step(x_t)[0]


# torch.jit.trace warns that it is deprecated, and the tracer that the checks' Python branches
# are constants of the trace: the test is about the refusal, not these.
@pytest.mark.filterwarnings("ignore:`torch.jit.trace:DeprecationWarning")
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.parametrize("mixer", mixers.names())
def test_torch_jit_trace_of_the_kernels_is_refused_and_says_what_to_use(mixer):
    """The tracer cannot record a Triton launch (it failed inside Triton, or read out of its
    storage's bounds): refused by name, forward and step; the reference still traces."""
    from samu import backends
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the kernels' own device
    kernel = samu.modules.MODULES[mixer](16, backend=backends.DEFAULTS[mixer]).to(device)
    x = torch.randn(1, 5, 16, device=device)
    words = (f"^{mixer}: torch.jit.trace cannot record backend {backends.DEFAULTS[mixer]}, a "
             "Triton kernel; use torch.compile or torch.export")
    with torch.no_grad():
        with pytest.raises(RuntimeError, match=words):
            torch.jit.trace(kernel, x)
        with pytest.raises(RuntimeError, match=words):
            torch.jit.trace(_Stepping(kernel), x[:, 0])
        reference = samu.modules.MODULES[mixer](16, backend="reference_chunked").to(device)
        traced = torch.jit.trace(reference, x)
        torch.testing.assert_close(traced(x), reference(x))


def test_torch_jit_script_is_refused_and_says_what_to_use():
    """TorchScript compiles neither the Python dispatch nor the kernels (its NotSupportedError
    came from inside samu): the modules, a model holding one and the functions say so.
    torch.jit.script warns that it is deprecated on every call: kept out of the output."""
    import warnings

    from samu import model
    from samu.functional import mix
    targets = [("SAMU", samu.SAMU(16)), ("RGLRU", samu.RGLRU(16)),
               ("RGLRU", model.RecurrentBlock("rglru", 16)), ("samu.samu", samu.samu),
               ("samu.rglru", samu.rglru), ("samu.mix", mix)]
    for name, target in targets:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "`torch.jit.script` is deprecated",
                                    DeprecationWarning)
            with pytest.raises(RuntimeError, match=f"^{name}: torch.jit.script is not supported"
                                                   ".*use torch.compile or torch.export"):
                torch.jit.script(target)


@pytest.mark.parametrize("keyword", ["output_final_state", "return_backend"])
@pytest.mark.parametrize("value", [0, 1, None, "yes"])
def test_flags_must_be_true_or_false(keyword, value):
    """A flag that is merely falsy (0, None) was taken as False, and a truthy one was refused
    or taken by one path and not the other: each is refused by name, on every mixer."""
    for mixer in samu.mixers.names():
        module = MODULES[mixer](16)
        params = [p.detach() for p in module._parameters_in_order()]
        with pytest.raises(TypeError, match=f"{keyword} must be True or False, got {value!r}"):
            samu.functional.mix(mixer, torch.randn(1, 4, 16), *params, **{keyword: value})

"""The mixers as nn.Modules (SPEC section 3).

A state_dict is the contract: parameter names and shapes are those of SPEC section 2.
"""
from __future__ import annotations

import importlib
import math

import torch
from torch import nn

from . import _runtime, backends, checks, dispatch, mixers
from .checks import (autocast_input, check_dense, check_heads, check_input, check_parameters,
                     check_positive_int, check_resets, check_sequences)
from .functional import FUNCTIONS, PARAMETER_NAMES, refuse_script


NUM_HEADS = 16

# Step signatures whose checks passed (samu.checks): a decode loop pays for them once, as
# forward calls do (samu.functional's _CHECKED).
_STEP_CHECKED: dict = {}


def checked_spec(mixer: str, width: int, num_heads=NUM_HEADS, check_heads_too: bool = True
                 ) -> mixers.MixerSpec:
    """The spec of ``mixer`` once its sizes pass the checks its module's constructor runs: a
    width that is a positive integer and, for a mixer with heads (unless ``check_heads_too`` is
    off), a head count that divides it.  ValueError or TypeError naming the problem otherwise,
    and ValueError listing the registered mixers for an unknown name."""
    spec = mixers.get(mixer)
    check_positive_int(spec.name, "width", width)
    if spec.has_heads and check_heads_too:
        check_heads(spec.name, width, num_heads)
    return spec


def parameter_count(mixer: str, width: int, num_heads: int = NUM_HEADS) -> int:
    """Parameters of one mixer of ``width`` (num_heads: RG-LRU's gate blocks, ignored by a mixer
    without heads), by its spec; the sizes are checked as the module's constructor checks them."""
    return checked_spec(mixer, width, num_heads).parameter_count(width, num_heads)


def dynamic_control_values_per_token(mixer: str, width: int) -> int:
    """The input-dependent gate values one token of a mixer of ``width`` computes, by its spec."""
    spec = checked_spec(mixer, width, check_heads_too=False)
    return spec.dynamic_control_values_per_token(width)


def build(mixer: str, width: int, num_heads: int = NUM_HEADS, backend="auto", **kwargs):
    """A module of ``mixer`` at ``width``; num_heads reaches a mixer with heads only."""
    spec = mixers.get(mixer)
    if spec.has_heads:
        kwargs["num_heads"] = num_heads
    return MODULES[mixer](width, backend=backend, **kwargs)


def init_a_param(a_param: torch.Tensor, generator=None) -> None:
    """softplus(a_param) = -0.5 log U, U uniform on [0.9^2, 0.999^2]."""
    with torch.no_grad():
        u = torch.empty_like(a_param).uniform_(0.9**2, 0.999**2, generator=generator)
        sp = -0.5 * torch.log(u)
        a_param.copy_(sp + torch.log(-torch.expm1(-sp)))  # inverse softplus


class Mixer(nn.Module):
    """The base of every mixer's module: its width and backend, forward through the mixer's
    functional form (samu.mixers), and step.  A subclass sets ``mixer`` to its spec's name,
    creates the spec's parameters as attributes, and gives them in the spec's order in
    ``_parameters_in_order``, and their initialisation in ``reset_parameters``."""
    mixer = ""

    def __init__(self, width: int, backend: str):
        super().__init__()
        check_positive_int(self.mixer, "width", width)
        backends.check_name(self.mixer, backend)
        self.width = width
        self.backend = backend
        # Looked up once here: the first look-up imports, which torch.compile cannot trace.
        self._function = FUNCTIONS[self.mixer]
        self.last_backend: str | None = None  # the backend that ran in the last forward

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def dynamic_control_values_per_token(self) -> int:
        return dynamic_control_values_per_token(self.mixer, self.width)

    def extra_repr(self) -> str:
        return f"width={self.width}, backend={self.backend!r}"

    def _parameters_in_order(self) -> tuple:
        raise NotImplementedError

    def __prepare_scriptable__(self):
        refuse_script(type(self).__name__)

    def forward(self, x, initial_state=None, output_final_state: bool = False, cu_seqlens=None,
                cp_context=None, resets=None):
        # Attributes, not self.parameters(): the generator costs ~15 us of host time per call.
        out = self._function(x, *self._parameters_in_order(), backend=self.backend,
                             return_backend=True, initial_state=initial_state,
                             output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                             cp_context=cp_context, resets=resets)
        self.last_backend = out[-1]
        return out[:-1] if output_final_state else out[0]

    def step(self, x_t, state=None, resets=None):
        """(y_t, state): one token from a state, for generation.  x_t is [B, D]; state FP32
        [B, D] (None: the first token, where the state resets); resets torch.bool [B] or None:
        a True row ignores its state and resets, as the scan's first token does.  A loop of
        steps equals one forward over the sequence, and so does a prefill's final state
        followed by steps (resets[b] of step t being the forward's resets[b, t]).

        Where the backend is a Triton one (CUDA, or a CPU tensor under TRITON_INTERPRET=1),
        x_t is BF16, FP16 or FP32 and no gradient is needed, one kernel launch does the step
        and allocates only y_t and the new state (samu.ops.<mixer>.step says when a layout
        costs a copy); otherwise the forward runs on the length-1 sequence.  Both refuse the
        same bad input with the same words; the kernel leaves ``last_backend`` as it was."""
        if not isinstance(x_t, torch.Tensor):  # as the forward refuses a non-tensor x
            raise TypeError(f"{self.mixer}: x_t must be a torch.Tensor, got "
                            f"{type(x_t).__name__}")
        if x_t.dim() != 2:
            raise ValueError(f"{self.mixer}: step takes x_t of shape [batch, width], got "
                             f"{tuple(x_t.shape)}")
        params = self._parameters_in_order()
        key = self._step_signature(x_t, state, resets, params)
        if key is None or key not in _STEP_CHECKED:
            self._check_step(x_t, state, resets, params)
            if key is not None:  # every check passed: remembered
                checks.remember(_STEP_CHECKED, key)
        x = x_t[:, None]
        if not self._step_in_one_launch(x_t, state, params):
            y, state = self(x, initial_state=state, output_final_state=True,
                            resets=None if resets is None else resets[:, None])
            return y[:, 0], state
        x_t = autocast_input(x_t)
        kernel = importlib.import_module(f"samu.ops.{self.mixer}.step")  # imports triton
        return kernel.step(x_t, state, *params, resets=resets)

    def _check_step(self, x_t, state, resets, params) -> None:
        check_dense(self.mixer, x_t, "x_t")
        x = x_t[:, None]
        if resets is not None:  # on both paths, named as step takes it ([B], not [B, 1])
            check_resets(self.mixer, x_t, resets)
        # The forward's checks, in its order, with step's names: the same errors on both paths.
        check_input(x, self.width, self.mixer, name="x_t")
        check_parameters(self.mixer, x_t, dict(zip(PARAMETER_NAMES[self.mixer], params)))
        check_sequences(self.mixer, x, state, None, True, state_name="state", x_name="x_t")

    def _step_signature(self, x_t, state, resets, params) -> tuple | None:
        """What step's checks depend on (the mixer, its width, and the tensors' types, shapes,
        dtypes, devices and layouts), or None where it cannot be a key (checks.call_signature):
        such calls are checked every time."""
        return checks.call_signature((self.mixer, self.width), (x_t, state, resets, *params))

    def _step_in_one_launch(self, x_t, state, params) -> bool:
        """Whether step takes its one-launch kernel: the forward would run a Triton backend on
        x_t, and autograd would record nothing."""
        if torch.compiler.is_compiling():
            return False  # compiled graphs take the forward's custom ops (samu.custom_ops)
        if x_t.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            return False  # float64, the oracle's: the reference
        if not x_t.is_cuda:
            if x_t.device.type != "cpu" or not dispatch.interpreting():
                return False
            _runtime.check_interpret_unchanged()  # as the forward checks off CUDA
        if torch.is_grad_enabled() and (x_t.requires_grad
                                        or getattr(state, "requires_grad", False)
                                        or any(p.requires_grad for p in params)):
            return False
        if (backends.triton_unavailable() is not None
                or torch._C._are_functorch_transforms_active() or torch.jit.is_tracing()):
            return False  # the forward raises its error
        backend = self.backend
        if isinstance(backend, str) and backend != "auto":
            chosen = backends.REGISTERED[self.mixer].get(backend)
            return chosen is not None and chosen.kind == "triton"
        return True  # "auto" picks a Triton backend here, and a configuration is one


class RGLRU(Mixer):
    """Real-Gated Linear Recurrent Unit (Griffin/Hawk, as in recurrentgemma) with block-diagonal
    gates: gx, ga = sigmoid(block-diagonal products of x); log a = -8 ga softplus(a_param);
    h_t = a_t h_{t-1} + sqrt(1 - a_t^2) gx_t x_t; y = h (docs/SPEC.md section 2).

    Args:
        width: channels D of x.
        num_heads: blocks of the gate matrices, any divisor of the width (16 by default;
            RecurrentGemma-2B uses 10 heads of 256 at width 2560).
        backend: ``"auto"`` (the default: the calibrated choice on a GPU, the reference on a
            CPU; see ``samu.dispatch``), a name from ``samu.backends.available("rglru")`` (for
            example ``"gemm_fused_hierarchical_chunk16"``), or a Triton configuration from
            ``samu.backends.REGISTRY["rglru"][name].config`` changed with ``dataclasses.replace``.
            ``last_backend`` names the backend that ran in the last forward.
        device: where the FP32 parameters are created.

    Raises ValueError or TypeError naming the argument for a width or head count that is not a
    positive integer, a width the heads do not divide, or an unknown backend.
    """
    mixer = "rglru"

    def __init__(self, width: int, num_heads: int = NUM_HEADS, backend: str = "auto",
                 device=None):
        super().__init__(width, backend)
        check_heads("rglru", width, num_heads)
        self.num_heads = num_heads
        bw = width // num_heads
        kw = dict(device=device, dtype=torch.float32)
        self.gate_x_weight = nn.Parameter(torch.empty(num_heads, bw, bw, **kw))
        self.gate_x_bias = nn.Parameter(torch.empty(width, **kw))
        self.gate_a_weight = nn.Parameter(torch.empty(num_heads, bw, bw, **kw))
        self.gate_a_bias = nn.Parameter(torch.empty(width, **kw))
        self.a_param = nn.Parameter(torch.empty(width, **kw))
        self.reset_parameters()

    def reset_parameters(self, generator=None) -> None:
        bw = self.width // self.num_heads
        with torch.no_grad():
            for w in (self.gate_x_weight, self.gate_a_weight):
                w.normal_(0.0, 1.0 / math.sqrt(bw), generator=generator)
            self.gate_x_bias.zero_()
            self.gate_a_bias.zero_()
        init_a_param(self.a_param, generator)

    def _parameters_in_order(self) -> tuple:
        return (self.gate_x_weight, self.gate_x_bias, self.gate_a_weight, self.gate_a_bias,
                self.a_param)


class SAMU(Mixer):
    """Scalar-gated mixer: two per-token FP32 controller scalars shared by every channel.
    z_t = ctrl_weight x_t + ctrl_bias; r, g = sigmoid(z); log a = -8 exp(log_temp) r
    softplus(a_param); h_t = a_t h_{t-1} + sqrt(1 - a_t^2) g_t x_t; y = h + skip x
    (docs/SPEC.md section 2).

    Args:
        width: channels D of x.
        backend: ``"auto"`` (the default: the calibrated choice on a GPU, the reference on a
            CPU; see ``samu.dispatch``), a name from ``samu.backends.available("samu")`` (for
            example ``"fused_controller_hierarchical_chunk16"``), or a Triton configuration from
            ``samu.backends.REGISTRY["samu"][name].config`` changed with ``dataclasses.replace``.
            ``last_backend`` names the backend that ran in the last forward.
        device: where the FP32 parameters are created.

    Raises ValueError or TypeError naming the argument for a width that is not a positive
    integer, or an unknown backend.
    """
    mixer = "samu"

    def __init__(self, width: int, backend: str = "auto", device=None):
        super().__init__(width, backend)
        kw = dict(device=device, dtype=torch.float32)
        self.ctrl_weight = nn.Parameter(torch.empty(2, width, **kw))
        self.ctrl_bias = nn.Parameter(torch.empty(2, **kw))
        self.a_param = nn.Parameter(torch.empty(width, **kw))
        self.log_temp = nn.Parameter(torch.empty((), **kw))
        self.skip = nn.Parameter(torch.empty((), **kw))
        self.reset_parameters()

    def reset_parameters(self, generator=None) -> None:
        with torch.no_grad():
            self.ctrl_weight.normal_(0.0, 1.0 / math.sqrt(self.width), generator=generator)
            self.ctrl_bias.zero_()
            self.log_temp.zero_()
            self.skip.zero_()
        init_a_param(self.a_param, generator)

    def _parameters_in_order(self) -> tuple:
        return self.ctrl_weight, self.ctrl_bias, self.a_param, self.log_temp, self.skip


# {mixer: its nn.Module class}, from the registry (samu.mixers).
MODULES = mixers.View(lambda spec: spec.load("module"))


# One docstring serves both modules' forward: help(samu.SAMU.forward) and help(samu.RGLRU.forward).
FORWARD_DOC = """y = mixer(x), or (y, final_state) = mixer(x, output_final_state=True).

Args:
    x: [batch, length, width], bfloat16, float16, float32 or float64, on CUDA (the Triton
        kernels) or the CPU (the reference; the kernels under TRITON_INTERPRET=1).  Under
        ``torch.autocast("cuda", dtype=torch.bfloat16)`` a float32 x enters as BF16, as a
        matmul would.  Each batch row is an independent sequence whose state resets at
        its first token.  Non-contiguous x is copied.

    initial_state: FP32 [B, D] ([N, D] with cu_seqlens): the state entering each sequence's
        first token, which is then an ordinary step.
    output_final_state: also return the FP32 state after each sequence's last token.
    cu_seqlens: packed sequences in one row (batch 1), int32 or int64 offsets [0, ..., L] as in
        FlashAttention; every start resets the state (or takes its initial state).
    resets: torch.bool [B, L] ([1, L] with cu_seqlens) or None: True at token t resets the
        state there, whatever it would carry (from t - 1 or from the initial state): a_t counts
        as 0, m_t as 1, and no gradient reaches a_t's inputs or the ignored state
        (recurrentgemma's reset where segment_pos is 0).  Its values are never read on the host.
    cp_context: context parallelism (``samu.distributed.build_cp_context``): x is this rank's
        slice of a sequence split over a torch.distributed group, y this slice's output.  The
        packed layout then comes from the context (no cu_seqlens here); the initial state is
        the global one, the same on every rank; the state returned is that at each of this
        slice's sequence pieces' ends (``samu.distributed.context_parallel``).

Returns:
    y of x's shape and dtype (and the final state, [B, D] or [N, D]).  The recurrence is carried in FP32; backward gives dx in
    x's dtype and every parameter gradient in FP32 (the Triton backends refuse double
    backward).

Raises ValueError or TypeError, before anything runs, for a rank other than 3, a width
other than the mixer's, an empty batch or length, an unsupported dtype or device, a
tensor too large to address, an initial state of the wrong shape or device, cu_seqlens
that are not FlashAttention's offsets of this row, or a reset mask that is not torch.bool
of x's shape without the width on x's device.
"""
Mixer.forward.__doc__ = FORWARD_DOC

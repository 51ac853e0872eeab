"""A small causal sequence model around one mixer, for the training study (SPEC section 9).

Token embedding, ``layers`` residual pre-norm blocks (norm, mixer, residual; norm, MLP, residual),
a final norm and a linear head (tied to the embedding by default).  Only the mixer differs between
models of one configuration:

- ``"rglru"``: ``samu.RGLRU(width, num_heads=rglru_heads)``;
- ``"samu"``: ``samu.SAMU(width)``;
- ``"attention"``, the yardstick: causal self-attention through
  ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)`` with rotary position
  embeddings, its head count chosen so that its parameters come closest to RG-LRU's mixer
  (``attention_heads="matched"``, the default), fixed, or ``width // attention_head_dim``
  (``attention_heads="standard"``, the usual multi-head layout).

``recurrent_block`` says how a recurrent mixer sits in its block:

- ``"bare"`` (the default): as the library exposes it, no projection, convolution or gate around
  it; the MLP mixes channels;
- ``"griffin"``: inside Griffin's recurrent block (``RecurrentBlock``, RecurrentGemma's):
  ``linear_out(mixer(conv(linear_x(x))) * gelu(linear_y(x)))``, with a short causal depthwise
  convolution (``conv_width`` taps) and the mixer at ``lru_width`` channels.  The block counts as
  the mixer in ``parameter_counts()``, and the matched attention heads match it.

The recurrent mixers need no position embedding, and the attention mixer carries its own
(rotary), so the residual blocks are the same for every mixer.

The mixers take x of [B, L, D].  On a CPU, ``backend="auto"`` runs the pure-PyTorch chunked
reference (the Triton kernels under ``TRITON_INTERPRET=1``); on CUDA, run the model under
``torch.autocast("cuda", dtype=torch.bfloat16)`` and the calibrated Triton kernels run.  The
residual stream stays FP32.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .checks import (check_cu_seqlens, check_dense, check_dtype_and_device, check_input,
                     check_positive_int, check_resets)
from . import mixers as mixers_
from .modules import NUM_HEADS, parameter_count
from .modules import build as build_mixer
from .ops.layout import sequence_index

MIXERS = ("attention", *mixers_.names())  # the yardstick and the registered mixers


def mixer_names() -> tuple:
    """The mixers a model can hold now: attention and every registered one (samu.mixers)."""
    return ("attention", *mixers_.names())
NORMS = ("rmsnorm", "layernorm")
# How a recurrent mixer sits in its residual block: alone, or inside Griffin's recurrent block.
RECURRENT_BLOCKS = ("bare", "griffin")
# Attention head counts by name: parameters matched to RG-LRU's mixer, or width / head_dim.
ATTENTION_HEADS = ("matched", "standard")
CONV_WIDTH = 4
# RecurrentGemma's Conv1D initialisation (its default w_init_variance_scale):
# w ~ N(0, 0.01 / temporal width).
CONV_INIT_VARIANCE = 0.01
# RG-LRU's default block width: heads = width / 64 (the largest head count whose blocks are at
# least 64 channels wide).
RGLRU_BLOCK_WIDTH = 64
ROPE_BASE = 10000.0


def default_rglru_heads(width: int) -> int:
    """The largest divisor h of ``width`` with width / h >= 64 (1 for widths below 128)."""
    best = 1
    for h in range(1, width // RGLRU_BLOCK_WIDTH + 1):
        if width % h == 0:
            best = h
    return best


def attention_parameters(width: int, heads: int, head_dim: int) -> int:
    """q, k, v and output projections, no biases: 4 * width * heads * head_dim."""
    return 4 * width * heads * head_dim


def griffin_parameters(mixer: str, width: int, lru_width: int | None = None,
                       conv_width: int = CONV_WIDTH, rglru_heads: int = NUM_HEADS) -> int:
    """Griffin's recurrent block around ``mixer``: linear_x and linear_y (D -> W, with biases),
    the depthwise convolution (conv_width taps and a bias per channel), the mixer at width W and
    linear_out (W -> D, with a bias); W = lru_width (None: D)."""
    lru = lru_width or width
    return (2 * (width * lru + lru) + conv_width * lru + lru
            + parameter_count(mixer, lru, rglru_heads) + lru * width + width)


def matching_attention_heads(width: int, rglru_heads: int, head_dim: int,
                             target: int | None = None) -> int:
    """The head count (at least 1) whose attention parameters come closest to ``target``; by
    default RG-LRU's bare mixer, 2 D^2 / H + 3 D at this width."""
    if target is None:
        target = parameter_count("rglru", width, rglru_heads)
    per_head = attention_parameters(width, 1, head_dim)
    return max(1, round(target / per_head))


@dataclass(frozen=True)
class ModelConfig:
    """Everything that defines a model; a value, passed in.

    Args:
        vocab_size: tokens 0 .. vocab_size - 1.
        mixer: ``"attention"``, ``"rglru"`` or ``"samu"``.
        width: D, the residual stream's channels.
        layers: residual blocks.
        mlp_expansion: the MLP's hidden width is ``mlp_expansion * width`` (GELU).
        norm: ``"rmsnorm"`` or ``"layernorm"``.
        tie_embeddings: the head reuses the embedding matrix.
        rglru_heads: RG-LRU's head count (None: ``default_rglru_heads`` of the mixer's width).
        attention_heads: an int; ``None`` or ``"matched"``: ``matching_attention_heads``
            (parameters closest to RG-LRU's mixer, as the recurrent block counts it);
            ``"standard"``: ``width // attention_head_dim`` heads (the width must divide).
        attention_head_dim: channels per attention head (even, for the rotary embedding).
        backend: the recurrent mixer's backend (``"auto"``, a name from
            ``samu.backends.available(mixer)`` or a Triton configuration); the attention mixer
            has one implementation and ignores it.
        recurrent_block: how a recurrent mixer sits in its block: ``"bare"`` (the mixer alone,
            at the width) or ``"griffin"`` (``RecurrentBlock``: projections, convolution and
            gate around the mixer).  The attention mixer ignores it, but its matched head count
            follows it.
        lru_width: the Griffin block's inner width W (None: the width); only with ``"griffin"``.
        conv_width: the Griffin block's convolution taps.
    """
    vocab_size: int
    mixer: str
    width: int = 256
    layers: int = 2
    mlp_expansion: int = 4
    norm: str = "rmsnorm"
    tie_embeddings: bool = True
    rglru_heads: int | None = None
    attention_heads: int | str | None = None
    attention_head_dim: int = 32
    backend: object = "auto"
    recurrent_block: str = "bare"
    lru_width: int | None = None
    conv_width: int = CONV_WIDTH

    def __post_init__(self):
        if self.mixer not in mixer_names():
            raise ValueError(f"model: unknown mixer {self.mixer!r}; choose one of "
                             f"{list(mixer_names())}")
        if self.norm not in NORMS:
            raise ValueError(f"model: unknown norm {self.norm!r}; choose one of {list(NORMS)}")
        if self.recurrent_block not in RECURRENT_BLOCKS:
            raise ValueError(f"model: unknown recurrent_block {self.recurrent_block!r}; choose "
                             f"one of {list(RECURRENT_BLOCKS)}")
        for name in ("vocab_size", "width", "layers", "mlp_expansion", "attention_head_dim",
                     "conv_width"):
            check_positive_int("model", name, getattr(self, name))
        if self.lru_width is not None:
            check_positive_int("model", "lru_width", self.lru_width)
            if self.recurrent_block != "griffin":
                raise ValueError("model: lru_width needs recurrent_block='griffin' (a bare "
                                 "mixer runs at the width)")
        if self.rglru_heads is not None:
            name, size = (("lru_width", self.recurrent_width) if self.lru_width
                          else ("width", self.width))
            check_positive_int("model", "rglru_heads", self.rglru_heads,
                               f" dividing {name} {size}")
            if size % self.rglru_heads:
                raise ValueError(f"model: {name} {size} is not divisible by rglru_heads "
                                 f"{self.rglru_heads}")
        if isinstance(self.attention_heads, str):
            if self.attention_heads not in ATTENTION_HEADS:
                raise ValueError(f"model: unknown attention_heads {self.attention_heads!r}; "
                                 f"choose an int or one of {list(ATTENTION_HEADS)}")
        elif self.attention_heads is not None:
            check_positive_int("model", "attention_heads", self.attention_heads)
        if self.attention_head_dim % 2:
            raise ValueError("model: attention_head_dim must be even (rotary embedding), got "
                             f"{self.attention_head_dim}")
        if self.attention_heads == "standard" and self.width % self.attention_head_dim:
            raise ValueError(f"model: attention_heads='standard' needs a width divisible by "
                             f"attention_head_dim, got width {self.width} and attention_head_dim "
                             f"{self.attention_head_dim}")
        if not isinstance(self.tie_embeddings, bool):
            raise TypeError("model: tie_embeddings must be a bool, got "
                            f"{type(self.tie_embeddings).__name__}")

    @property
    def recurrent_width(self) -> int:
        """The recurrent mixer's width: the lru width inside a Griffin block, else D."""
        if self.recurrent_block == "griffin":
            return self.lru_width or self.width
        return self.width

    @property
    def resolved_rglru_heads(self) -> int:
        return self.rglru_heads or default_rglru_heads(self.recurrent_width)

    def recurrent_mixer_parameters(self, mixer: str) -> int:
        """One layer's mixer parameters for ``"rglru"`` or ``"samu"`` as this configuration
        builds it (the whole Griffin block with ``recurrent_block="griffin"``)."""
        if self.recurrent_block == "griffin":
            return griffin_parameters(mixer, self.width, self.recurrent_width, self.conv_width,
                                      self.resolved_rglru_heads)
        return parameter_count(mixer, self.width, self.resolved_rglru_heads)

    @property
    def resolved_attention_heads(self) -> int:
        if self.attention_heads == "standard":
            return self.width // self.attention_head_dim
        if isinstance(self.attention_heads, int):
            return self.attention_heads
        return matching_attention_heads(self.width, self.resolved_rglru_heads,
                                        self.attention_head_dim,
                                        target=self.recurrent_mixer_parameters("rglru"))

    def describe(self) -> dict:
        """The configuration as plain values (a backend configuration as its repr), with the
        resolved head counts (and the Griffin block's lru width)."""
        out = asdict(self)
        if not isinstance(self.backend, str):
            out["backend"] = repr(self.backend)
        out["rglru_heads"] = self.resolved_rglru_heads
        out["attention_heads"] = self.resolved_attention_heads
        if self.recurrent_block == "griffin":
            out["lru_width"] = self.recurrent_width
        return out


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in FP32."""

    def __init__(self, width: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.weight.fill_(1.0)

    def forward(self, x):
        if hasattr(F, "rms_norm"):  # torch >= 2.4: one fused kernel on CUDA
            return F.rms_norm(x.float(), (x.shape[-1],), self.weight, self.eps).to(x.dtype)
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        return out.to(x.dtype)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (i, i + d/2) of x [B, H, L, d] by the angles of each position."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with rotary position embeddings, no biases:
    ``heads * head_dim`` channels for queries, keys and values, projected back to ``width``."""

    def __init__(self, width: int, heads: int, head_dim: int):
        super().__init__()
        check_positive_int("attention", "width", width)
        check_positive_int("attention", "heads", heads)
        check_positive_int("attention", "head_dim", head_dim)
        if head_dim % 2:
            raise ValueError(f"attention: head_dim must be even, got {head_dim}")
        self.width, self.heads, self.head_dim = width, heads, head_dim
        self.qkv = nn.Linear(width, 3 * heads * head_dim, bias=False)
        self.out = nn.Linear(heads * head_dim, width, bias=False)
        self._angles: dict = {}  # (length, device) -> (cos, sin), FP32
        self.reset_parameters()

    def reset_parameters(self, generator=None) -> None:
        """torch.nn.Linear's default: uniform within 1 / sqrt(fan_in)."""
        for linear in (self.qkv, self.out):
            init_linear(linear.weight, generator)

    def angles(self, length: int, device, dtype):
        key = (length, str(device))
        if key not in self._angles:
            half = self.head_dim // 2
            inv = ROPE_BASE ** (-torch.arange(half, device=device, dtype=torch.float32) / half)
            freqs = torch.outer(torch.arange(length, device=device, dtype=torch.float32), inv)
            self._angles = {key: (freqs.cos(), freqs.sin())}  # keep the latest length only
        cos, sin = self._angles[key]
        return cos.to(dtype), sin.to(dtype)

    def forward(self, x):
        if x.dim() != 3 or x.shape[-1] != self.width:
            raise ValueError(f"attention: x must be [batch, length, {self.width}], got "
                             f"{tuple(x.shape)}")
        batch, length, _ = x.shape
        q, k, v = (self.qkv(x).view(batch, length, 3, self.heads, self.head_dim)
                   .permute(2, 0, 3, 1, 4).unbind(0))  # each [B, H, L, d]
        cos, sin = self.angles(length, x.device, q.dtype)
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(batch, length, self.heads * self.head_dim))

    def extra_repr(self) -> str:
        return f"width={self.width}, heads={self.heads}, head_dim={self.head_dim}"


def init_linear(weight: torch.Tensor, generator=None, scale: float = 1.0) -> None:
    """torch.nn.Linear's default initialisation, uniform within 1 / sqrt(fan_in), times scale."""
    bound = scale / math.sqrt(weight.shape[1])
    with torch.no_grad():
        weight.uniform_(-bound, bound, generator=generator)


def causal_conv1d(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, initial_state=None,
                  cu_seqlens=None, resets=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, final state) of a depthwise causal convolution, as RecurrentGemma's Conv1D:
    y_t = b + sum_s w[K - 1 - s] * x_{t - s}, s = 0 .. K - 1, for x [B, L, W], w [K, W], b [W].

    A tap that would reach before its sequence's first token (each row's, or each start in
    ``cu_seqlens``) reads the initial state [N, K - 1, W] (the K - 1 inputs before the start,
    oldest first), or zero without one.  The final state holds each sequence's last K - 1
    inputs, its initial state's where the sequence is shorter.  ``resets`` ([B, L] bool, as the
    mixers take it): a tap reaching before the latest reset at or before its token reads zero
    (recurrentgemma's Conv1D with segment positions), and so does the final state before each
    sequence's last reset, so that steps after it see no earlier token either.  Computed in at
    least FP32, returned in x's dtype."""
    batch, length, width = x.shape
    keep = w.shape[0] - 1
    positions = torch.arange(length, device=x.device)
    if cu_seqlens is None:
        count, pos = batch, positions
    else:
        offsets = cu_seqlens.long()
        count = offsets.numel() - 1
        seq = sequence_index(cu_seqlens, length).long()
        pos = positions - offsets[seq]  # each token's place in its own sequence
    state = (x.new_zeros(count, keep, width) if initial_state is None
             else initial_state.to(x.dtype))
    # Every tap is a view of one copy: each row's state then its tokens, or, packed, x behind
    # K - 1 zeros (a tap reaching before its sequence's start is hidden there and its row of the
    # states added after, at the fewer than K tokens a sequence where that happens).
    head = state if cu_seqlens is None else x.new_zeros(1, keep, width)
    padded = torch.cat((head, x), dim=1) if keep else x
    # The latest reset at or before each token within its sequence, [B, L]; before any tap
    # (-keep - 1) where there is none.
    latest = None if resets is None else latest_reset(resets, positions, positions - pos, keep)
    if cu_seqlens is not None and initial_state is not None:
        # Tap s of the first s tokens of sequence n reads state[n, keep - s:]: those tokens,
        # [N, keep], each index inside x whatever the offsets (unchecked in a CUDA-graph capture).
        first = torch.arange(keep, device=x.device)
        token = offsets[:-1, None] + first
        in_sequence = ((first < (offsets[1:] - offsets[:-1])[:, None]) & (token >= 0)
                       & (token < length))
        token = torch.where(in_sequence, token, 0)
        token_reset = None if latest is None else latest[0, token]
    dtype = torch.promote_types(x.dtype, torch.float32)
    y = torch.addcmul(b.to(dtype), x, w[keep].to(dtype))  # in FP32 at least, as promoted
    for s in range(1, keep + 1):
        tap = padded[:, keep - s:keep - s + length]  # x_{t - s}, or the state's before t = s
        hidden = None if cu_seqlens is None else (pos < s)[None]  # reaching before its start
        if latest is not None:
            cut = positions - s < latest  # reaching before the latest reset
            hidden = cut if hidden is None else hidden | cut
        if hidden is not None:
            tap = torch.where(hidden[..., None], 0.0, tap)
        y = torch.addcmul(y, tap, w[keep - s].to(dtype))
        if cu_seqlens is not None and initial_state is not None:
            shown = in_sequence[:, :s]
            if latest is not None:  # no reset between the sequence's start and the token
                shown = shown & (token[:, :s] - s >= token_reset[:, :s])
            entry = torch.where(shown[..., None], state[:, keep - s:].to(dtype), 0)
            entry = (entry * w[keep - s].to(dtype)).reshape(1, -1, width)
            y.index_add_(1, token[:, :s].reshape(-1), entry)
    if cu_seqlens is None:
        final = padded[:, -keep:].clone() if keep else state  # not a view of the whole
        if latest is not None:
            held = length - keep + torch.arange(keep, device=x.device)  # each entry's token
            final = torch.where((held < latest[:, -1:])[..., None], 0.0, final)
    else:
        starts, lengths = offsets[:-1], offsets[1:] - offsets[:-1]
        p = lengths[:, None] - keep + torch.arange(keep, device=x.device)  # [N, K - 1]
        inside = p >= 0
        last = max(length - 1, 0)  # the clamps keep unchecked offsets' indices in their tensors
        from_x = x[0][torch.where(inside, starts[:, None] + p, 0).clamp(0, last)]
        from_state = state[torch.arange(count, device=x.device)[:, None],
                           torch.where(inside, 0, keep + p).clamp(0, keep - 1)]
        final = torch.where(inside[..., None], from_x, from_state)
        if latest is not None:
            last_reset = latest[0, (offsets[1:] - 1).clamp(0, last)]  # [N], at its last token
            held = starts[:, None] + p  # each entry's token
            final = torch.where((held < last_reset[:, None])[..., None], 0.0, final)
    return y.to(x.dtype), final


def latest_reset(resets: torch.Tensor, positions: torch.Tensor, starts: torch.Tensor,
                 keep: int) -> torch.Tensor:
    """[B, L]: the index of the latest reset at or before each token and at or after its
    sequence's start (``starts``, [L]), or -keep - 1 (before every tap) where there is none."""
    latest = torch.cummax(torch.where(resets, positions, -1), dim=1).values
    return torch.where(latest >= starts, latest, -keep - 1)


def causal_conv1d_step(x_t: torch.Tensor, w: torch.Tensor, b: torch.Tensor, state=None,
                       resets=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(y_t, state) of causal_conv1d for one token x_t [B, W] from the last K - 1 inputs
    [B, K - 1, W] (None: zeros, a sequence's first token); a row of ``resets`` ([B] bool) that
    is True ignores its state."""
    if state is None:
        state = x_t.new_zeros(x_t.shape[0], w.shape[0] - 1, x_t.shape[1])
    state = state.to(x_t.dtype)
    if resets is not None:
        state = torch.where(resets[:, None, None], torch.zeros_like(state), state)
    window = torch.cat((state, x_t[:, None]), dim=1)  # oldest first
    dtype = torch.promote_types(x_t.dtype, torch.float32)
    y = (window.to(dtype) * w.to(dtype)).sum(1) + b.to(dtype)
    return y.to(x_t.dtype), window[:, 1:]


class Conv1D(nn.Module):
    """Depthwise causal convolution over time, ``temporal_width`` taps with a bias per channel
    (RecurrentGemma's Conv1D: parameters ``w`` [temporal_width, width], ``b`` [width];
    ``w[-1]`` multiplies the current token)."""

    def __init__(self, width: int, temporal_width: int = CONV_WIDTH,
                 w_init_variance_scale: float = CONV_INIT_VARIANCE):
        super().__init__()
        check_positive_int("conv", "width", width)
        check_positive_int("conv", "temporal_width", temporal_width)
        self.width, self.temporal_width = width, temporal_width
        self.w_init_variance_scale = w_init_variance_scale
        self.w = nn.Parameter(torch.empty(temporal_width, width))
        self.b = nn.Parameter(torch.empty(width))
        self.reset_parameters()

    def reset_parameters(self, generator=None) -> None:
        std = math.sqrt(self.w_init_variance_scale / self.temporal_width)
        with torch.no_grad():
            self.w.normal_(0.0, std, generator=generator)
            self.b.zero_()

    def forward(self, x, initial_state=None, cu_seqlens=None, resets=None):
        """(y, final state): ``causal_conv1d`` with this module's parameters."""
        return causal_conv1d(x, self.w, self.b, initial_state, cu_seqlens, resets)

    def step(self, x_t, state=None, resets=None):
        """(y_t, state) for one token x_t [B, W] from the last temporal_width - 1 inputs
        [B, temporal_width - 1, W] (None: zeros, a sequence's first token): causal_conv1d_step."""
        return causal_conv1d_step(x_t, self.w, self.b, state, resets)

    def extra_repr(self) -> str:
        return f"width={self.width}, temporal_width={self.temporal_width}"


class RecurrentBlockState(NamedTuple):
    """What a RecurrentBlock carries from one call to the next, per sequence: the convolution's
    last conv_width - 1 inputs [N, conv_width - 1, lru_width] (x's dtype, oldest first) and the
    mixer's FP32 state [N, lru_width]."""
    conv: torch.Tensor
    mixer: torch.Tensor


class RecurrentBlock(nn.Module):
    """Griffin's recurrent block (RecurrentGemma's ``RecurrentBlock``) around RG-LRU or SAMU:

        y = gelu(linear_y(x));  u = mixer(conv_1d(linear_x(x)));  out = linear_out(u * y)

    with linear_x, linear_y: D -> W and linear_out: W -> D (all with biases), a depthwise causal
    convolution of ``conv_width`` taps over W channels and the mixer at width W = lru_width.

    Args:
        mixer: ``"rglru"`` or ``"samu"``.
        width: D, the input and output channels.
        lru_width: W (None: D).
        conv_width: the convolution's taps.
        num_heads: RG-LRU's head count (dividing W); SAMU has none.
        backend: the mixer's backend (``samu.RGLRU`` and ``samu.SAMU``).
        final_w_init_variance_scale: linear_out's weights have variance scale / W
            (RecurrentGemma's Griffin passes 2 / layers).

    ``forward(x, cu_seqlens=None, initial_state=None, output_final_state=False, resets=None)``
    takes x [B, L, D] and, like the mixers, packed sequences (batch 1; every start resets both
    the convolution and the mixer, or takes its row of the initial state), a
    ``RecurrentBlockState`` to continue from, a reset mask (both the convolution and the mixer
    see nothing before a reset), and returns the final state with output_final_state.
    ``step(x_t, state, resets=None)`` is one decode step.  ``last_backend`` is the mixer's.
    """

    def __init__(self, mixer: str, width: int, lru_width: int | None = None,
                 conv_width: int = CONV_WIDTH, num_heads: int = NUM_HEADS, backend="auto",
                 final_w_init_variance_scale: float = 1.0):
        super().__init__()
        if mixer not in mixers_.MIXERS:
            raise ValueError(f"griffin: unknown mixer {mixer!r}; choose one of "
                             f"{mixers_.names()}")
        check_positive_int("griffin", "width", width)
        if lru_width is not None:
            check_positive_int("griffin", "lru_width", lru_width)
        self.kind, self.width = mixer, width
        self.lru_width = lru_width or width
        self.final_w_init_variance_scale = final_w_init_variance_scale
        self.linear_y = nn.Linear(width, self.lru_width)
        self.linear_x = nn.Linear(width, self.lru_width)
        self.conv_1d = Conv1D(self.lru_width, conv_width)
        self.mixer = build_mixer(mixer, self.lru_width, num_heads, backend)
        self.linear_out = nn.Linear(self.lru_width, width)
        self.reset_parameters()

    @property
    def conv_width(self) -> int:
        return self.conv_1d.temporal_width

    @property
    def last_backend(self) -> str | None:
        return self.mixer.last_backend

    def reset_parameters(self, generator=None) -> None:
        """RecurrentGemma's: linear_x and linear_y normal with variance 1 / D, linear_out with
        variance final_w_init_variance_scale / W, biases zero; the convolution's weights normal
        with variance 0.01 / conv_width; the mixer its own (SPEC section 2)."""
        with torch.no_grad():
            for linear, variance in ((self.linear_x, 1.0 / self.width),
                                     (self.linear_y, 1.0 / self.width),
                                     (self.linear_out,
                                      self.final_w_init_variance_scale / self.lru_width)):
                linear.weight.normal_(0.0, math.sqrt(variance), generator=generator)
                linear.bias.zero_()
        self.conv_1d.reset_parameters(generator)
        self.mixer.reset_parameters(generator=generator)

    def parameter_counts(self) -> dict[str, int]:
        """Parameters by part: projections (x, y and out), conv, mixer and total."""
        def count(*modules):
            return sum(p.numel() for m in modules for p in m.parameters())
        counts = {"projections": count(self.linear_x, self.linear_y, self.linear_out),
                  "conv": count(self.conv_1d), "mixer": count(self.mixer)}
        counts["total"] = sum(counts.values())
        return counts

    def _check_state(self, state, count: int, device) -> None:
        if not isinstance(state, tuple) or len(state) != 2:
            raise TypeError("griffin: a state must be a RecurrentBlockState (conv, mixer), got "
                            f"{type(state).__name__}")
        conv = state[0]
        want = (count, self.conv_width - 1, self.lru_width)
        if not isinstance(conv, torch.Tensor) or tuple(conv.shape) != want:
            got = tuple(conv.shape) if isinstance(conv, torch.Tensor) else type(conv).__name__
            raise ValueError(f"griffin: the conv state must have shape {list(want)}, got {got}")
        if conv.device != device:
            raise ValueError(f"griffin: the conv state is on {conv.device} but x is on {device}")
        if not conv.is_floating_point():  # as the mixer's state: no silent cast of integers
            raise TypeError(f"griffin: the conv state must be floating point, got {conv.dtype}")
        if not isinstance(state[1], torch.Tensor):  # None would restart the mixer alone
            raise TypeError("griffin: the mixer state must be a torch.Tensor (the mixer's FP32 "
                            f"state), got {type(state[1]).__name__}")

    def forward(self, x, cu_seqlens=None, initial_state=None, output_final_state: bool = False,
                resets=None):
        """out [B, L, D], or (out, RecurrentBlockState) with output_final_state."""
        check_input(x, self.width, "griffin")
        if not isinstance(output_final_state, bool):
            raise TypeError("griffin: output_final_state must be True or False, got "
                            f"{output_final_state!r}")
        # The convolution indexes by cu_seqlens, so they are checked before it runs.
        count = x.shape[0] if cu_seqlens is None else check_cu_seqlens("griffin", x, cu_seqlens)
        if initial_state is not None:
            self._check_state(initial_state, count, x.device)
        if resets is not None:  # the convolution indexes by it too
            check_resets("griffin", x, resets)
        conv_state, mixer_state = initial_state if initial_state is not None else (None, None)
        y = gelu(self.linear_y(x))
        u, conv_final = self.conv_1d(self.linear_x(x), conv_state, cu_seqlens, resets)
        out = self.mixer(u, initial_state=mixer_state, output_final_state=output_final_state,
                         cu_seqlens=cu_seqlens, resets=resets)
        u, mixer_final = out if output_final_state else (out, None)
        out = self.linear_out(u * y)
        return (out, RecurrentBlockState(conv_final, mixer_final)) if output_final_state else out

    def step(self, x_t, state=None, resets=None):
        """(out_t, state): one token x_t [B, D] from a RecurrentBlockState (None: a sequence's
        first token); a True row of ``resets`` ([B] bool) ignores its state.  A loop of steps
        equals one forward, and so do a prefill and steps."""
        if not isinstance(x_t, torch.Tensor):
            raise TypeError(f"griffin: x_t must be a torch.Tensor, got {type(x_t).__name__}")
        check_dense("griffin", x_t, "x_t")
        if x_t.dim() != 2 or x_t.shape[1] != self.width:
            raise ValueError(f"griffin: step takes x_t of shape [batch, {self.width}], got "
                             f"{tuple(x_t.shape)}")
        check_dtype_and_device("griffin", x_t)  # as forward's check_input, on every step
        if state is not None:
            self._check_state(state, x_t.shape[0], x_t.device)
        if resets is not None:
            check_resets("griffin", x_t, resets)
        conv_state, mixer_state = state if state is not None else (None, None)
        y = gelu(self.linear_y(x_t))
        u, conv_state = self.conv_1d.step(self.linear_x(x_t), conv_state, resets)
        u, mixer_state = self.mixer.step(u, mixer_state, resets=resets)
        return self.linear_out(u * y), RecurrentBlockState(conv_state, mixer_state)

    def extra_repr(self) -> str:
        return f"mixer={self.kind!r}, width={self.width}, lru_width={self.lru_width}"


def gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU with the tanh approximation, as RecurrentGemma (and JAX's default)."""
    return F.gelu(x, approximate="tanh")


def make_mixer(config: ModelConfig) -> nn.Module:
    if config.mixer != "attention" and config.recurrent_block == "griffin":
        return RecurrentBlock(config.mixer, config.width, config.recurrent_width,
                              config.conv_width, config.resolved_rglru_heads, config.backend,
                              final_w_init_variance_scale=2.0 / config.layers)
    if config.mixer != "attention":
        return build_mixer(config.mixer, config.width, config.resolved_rglru_heads,
                           config.backend)
    return CausalSelfAttention(config.width, config.resolved_attention_heads,
                               config.attention_head_dim)


def make_norm(config: ModelConfig) -> nn.Module:
    return RMSNorm(config.width) if config.norm == "rmsnorm" else nn.LayerNorm(config.width)


class MLP(nn.Module):
    def __init__(self, width: int, expansion: int):
        super().__init__()
        self.up = nn.Linear(width, expansion * width, bias=False)
        self.down = nn.Linear(expansion * width, width, bias=False)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """x + mixer(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.mixer_norm = make_norm(config)
        self.mixer = make_mixer(config)
        self.mlp_norm = make_norm(config)
        self.mlp = MLP(config.width, config.mlp_expansion)

    def forward(self, x):
        x = x + self.mixer(self.mixer_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class SequenceModel(nn.Module):
    """``logits = model(tokens)``: tokens [B, L] (int64) to logits [B, L, vocab_size].

    ``reset_parameters(seed)`` (called with ``seed=0`` on construction) draws every part from its
    own generator, seeded from ``seed`` and the part: models of one seed that differ only in their
    mixer start from the same embedding, MLPs and head.  ``parameter_counts()`` splits
    ``num_parameters`` by part.
    """

    def __init__(self, config: ModelConfig, seed: int = 0):
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise TypeError(f"model: config must be a ModelConfig, got {type(config).__name__}")
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.width)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.final_norm = make_norm(config)
        self.head = (None if config.tie_embeddings
                     else nn.Linear(config.width, config.vocab_size, bias=False))
        self.reset_parameters(seed)

    def reset_parameters(self, seed: int = 0) -> None:
        """Embedding (and an untied head) normal with std 0.02; MLPs as torch.nn.Linear, the
        second scaled by 1 / sqrt(2 layers) (GPT-2's residual scaling); norms to one (and zero);
        each mixer by its own ``reset_parameters`` (SPEC section 2 for RG-LRU and SAMU; a Griffin
        block as RecurrentGemma, ``RecurrentBlock.reset_parameters``)."""
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"model: seed must be a non-negative integer, got {seed!r}")

        def generator(part: int) -> torch.Generator:
            return torch.Generator().manual_seed(seed * 1_000_003 + part)

        with torch.no_grad():
            self.embedding.weight.normal_(0.0, 0.02, generator=generator(0))
            if self.head is not None:
                self.head.weight.normal_(0.0, 0.02, generator=generator(1))
            norms = [self.final_norm]
            for i, block in enumerate(self.blocks):
                init_linear(block.mlp.up.weight, generator(2 + 3 * i))
                init_linear(block.mlp.down.weight, generator(3 + 3 * i),
                            scale=1.0 / math.sqrt(2 * self.config.layers))
                block.mixer.reset_parameters(generator=generator(4 + 3 * i))
                norms += [block.mixer_norm, block.mlp_norm]
            for norm in norms:
                norm.reset_parameters()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
            raise ValueError("model: tokens must be a [batch, length] tensor, got "
                             f"{getattr(tokens, 'shape', type(tokens).__name__)}")
        if tokens.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"model: tokens must be int64 or int32, got {tokens.dtype}")
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x)
        x = self.final_norm(x)
        weight = self.embedding.weight if self.head is None else self.head.weight
        return F.linear(x, weight)

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def parameter_counts(self) -> dict[str, int]:
        """Parameters by part: embedding, mixer, mlp, norm, head (0 when tied) and total.  With
        ``recurrent_block="griffin"`` the mixer part is the whole recurrent block (its
        projections, convolution and mixer: ``griffin_parameters``)."""
        def count(modules):
            return sum(p.numel() for m in modules for p in m.parameters())
        blocks = list(self.blocks)
        counts = {
            "embedding": self.embedding.weight.numel(),
            "mixer": count(b.mixer for b in blocks),
            "mlp": count(b.mlp for b in blocks),
            "norm": count([self.final_norm] + [n for b in blocks
                                               for n in (b.mixer_norm, b.mlp_norm)]),
            "head": 0 if self.head is None else self.head.weight.numel(),
        }
        counts["total"] = sum(counts.values())
        return counts

    @property
    def last_backends(self) -> list[str | None]:
        """The backend that ran in each block's last forward (attention: ``"sdpa"``)."""
        return [getattr(b.mixer, "last_backend", "sdpa") for b in self.blocks]


def build(config: ModelConfig, seed: int = 0, device=None) -> SequenceModel:
    """The model initialised from ``seed`` (``SequenceModel.reset_parameters``), on ``device``."""
    return SequenceModel(config, seed).to(device)


def parameter_report(models: dict[str, SequenceModel]) -> str:
    """A table of parameter counts by part, one line per model, and each total's ratio to the
    largest."""
    parts = ("embedding", "mixer", "mlp", "norm", "head", "total")
    rows = {name: m.parameter_counts() for name, m in models.items()}
    largest = max(r["total"] for r in rows.values())
    name_width = max([len("model")] + [len(n) for n in rows])
    header = f"{'model':<{name_width}}" + "".join(f"{p:>12}" for p in parts) + f"{'of largest':>12}"
    lines = [header]
    for name, r in rows.items():
        lines.append(f"{name:<{name_width}}" + "".join(f"{r[p]:>12,}" for p in parts)
                     + f"{r['total'] / largest:>12.3f}")
    return "\n".join(lines)

"""A small causal sequence model around one mixer, for the training study (SPEC section 9).

Token embedding, ``layers`` residual pre-norm blocks (norm, mixer, residual; norm, MLP, residual),
a final norm and a linear head (tied to the embedding by default).  Only the mixer differs between
models of one configuration:

- ``"rglru"``: ``samu.RGLRU(width, num_heads=rglru_heads)``;
- ``"samu"``: ``samu.SAMU(width)``;
- ``"attention"``, the yardstick: causal self-attention through
  ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)`` with rotary position
  embeddings, its head count chosen so that its parameters come closest to RG-LRU's mixer.

The recurrent mixers run bare, as the library exposes them: no input or output projection, no
convolution and no gating branch around them (Griffin's recurrent block has all three); the MLP
mixes channels.  They need no position embedding, and the attention mixer carries its own (rotary),
so the blocks are the same for every mixer.

The mixers take x of [B, L, D].  On a CPU, ``backend="auto"`` runs the pure-PyTorch chunked
reference (the Triton kernels under ``TRITON_INTERPRET=1``); on CUDA, run the model under
``torch.autocast("cuda", dtype=torch.bfloat16)`` and the calibrated Triton kernels run.  The
residual stream stays FP32.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .functional import check_positive_int
from .modules import RGLRU, SAMU, parameter_count

MIXERS = ("attention", "rglru", "samu")
NORMS = ("rmsnorm", "layernorm")
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


def matching_attention_heads(width: int, rglru_heads: int, head_dim: int) -> int:
    """The head count (at least 1) whose attention parameters come closest to RG-LRU's
    2 D^2 / H + 3 D at this width."""
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
        rglru_heads: RG-LRU's head count (None: ``default_rglru_heads(width)``).
        attention_heads: None: ``matching_attention_heads`` (parameters closest to RG-LRU's).
        attention_head_dim: channels per attention head (even, for the rotary embedding).
        backend: the recurrent mixer's backend (``"auto"``, a name from
            ``samu.backends.available(mixer)`` or a Triton configuration); the attention mixer
            has one implementation and ignores it.
    """
    vocab_size: int
    mixer: str
    width: int = 256
    layers: int = 2
    mlp_expansion: int = 4
    norm: str = "rmsnorm"
    tie_embeddings: bool = True
    rglru_heads: int | None = None
    attention_heads: int | None = None
    attention_head_dim: int = 32
    backend: object = "auto"

    def __post_init__(self):
        if self.mixer not in MIXERS:
            raise ValueError(f"model: unknown mixer {self.mixer!r}; choose one of {list(MIXERS)}")
        if self.norm not in NORMS:
            raise ValueError(f"model: unknown norm {self.norm!r}; choose one of {list(NORMS)}")
        for name in ("vocab_size", "width", "layers", "mlp_expansion", "attention_head_dim"):
            check_positive_int("model", name, getattr(self, name))
        if self.rglru_heads is not None:
            check_positive_int("model", "rglru_heads", self.rglru_heads,
                               f" dividing width {self.width}")
            if self.width % self.rglru_heads:
                raise ValueError(f"model: width {self.width} is not divisible by rglru_heads "
                                 f"{self.rglru_heads}")
        if self.attention_heads is not None:
            check_positive_int("model", "attention_heads", self.attention_heads)
        if self.attention_head_dim % 2:
            raise ValueError("model: attention_head_dim must be even (rotary embedding), got "
                             f"{self.attention_head_dim}")
        if not isinstance(self.tie_embeddings, bool):
            raise TypeError("model: tie_embeddings must be a bool, got "
                            f"{type(self.tie_embeddings).__name__}")

    @property
    def resolved_rglru_heads(self) -> int:
        return self.rglru_heads or default_rglru_heads(self.width)

    @property
    def resolved_attention_heads(self) -> int:
        return self.attention_heads or matching_attention_heads(
            self.width, self.resolved_rglru_heads, self.attention_head_dim)

    def describe(self) -> dict:
        """The configuration as plain values (a backend configuration as its repr), with the
        resolved head counts."""
        out = asdict(self)
        if not isinstance(self.backend, str):
            out["backend"] = repr(self.backend)
        out["rglru_heads"] = self.resolved_rglru_heads
        out["attention_heads"] = self.resolved_attention_heads
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


def make_mixer(config: ModelConfig) -> nn.Module:
    if config.mixer == "rglru":
        return RGLRU(config.width, num_heads=config.resolved_rglru_heads, backend=config.backend)
    if config.mixer == "samu":
        return SAMU(config.width, backend=config.backend)
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
        each mixer by its own ``reset_parameters`` (SPEC section 2 for RG-LRU and SAMU)."""
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
        """Parameters by part: embedding, mixer, mlp, norm, head (0 when tied) and total."""
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

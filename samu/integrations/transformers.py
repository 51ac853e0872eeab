"""Hugging Face transformers' RecurrentGemma on samu: one call, reversible.

    import samu.integrations.transformers as samu_hf
    model = RecurrentGemmaForCausalLM.from_pretrained(...)      # or RecurrentGemmaModel
    handle = samu_hf.patch(model, backend="auto")
    ...                                                         # train, generate, as before
    handle.unpatch()                                            # transformers' own code again
    with samu_hf.patch(model): ...                              # the same, for a block

``patch`` makes every recurrent block of the model (``RecurrentGemmaRecurrentBlock``) run its
causal convolution and its RG-LRU on samu, with transformers' own parameters in place (no copy:
gradients, optimizers, ``state_dict`` and ``save_pretrained`` are unchanged).  Everything else
(embedding, norms, projections, attention, MLPs, the head) is transformers' code.

- Training: full sequences, and several sequences packed in a row through ``position_ids``: a
  token whose position is 0 starts a sequence (transformers' and recurrentgemma's rule), per row
  and per token; samu's ``resets=`` mask carries it to the convolution and the RG-LRU.
  Gradients reach every parameter as in transformers.
- Generation: the recurrent state stays where and as transformers keeps it (the block's
  ``conv1d_state`` [B, lru_width, conv1d_width - 1] in the model's dtype, the RG-LRU's
  ``recurrent_states`` [B, lru_width]), so that ``generate``, a cache continued over calls and
  switching between patched and unpatched code all work; a call of several tokens is a prefill,
  one token a decode step (samu's ``step``: one kernel launch on a Triton backend).
- ``backend``: samu's choice for the RG-LRU (``"auto"``, a name from
  ``samu.backends.available("rglru")`` or a configuration), as for ``samu.RGLRU``;
  ``handle.last_backends`` says what ran in each block.

It refuses, before changing anything: a transformers version it was not written for (it
supports 5.20 to 5.25, whose recurrent block and RG-LRU are one code; tested with 5.25;
``check_version=False`` patches another with a warning), a model without RecurrentGemma
recurrent blocks, a block already patched, a subclass of transformers' classes (its overrides
would be lost), and a block whose convolution or gates are not those of RecurrentGemma's
configuration (another padding, a bias-less convolution, lru_width not divisible by the heads,
parameters of an unsupported dtype or device).

Where the numbers differ from transformers' own, and why (docs/SPEC.md, "RecurrentGemma in
transformers"):

1. sqrt(1 - a^2): samu computes 1 - a^2 as -expm1(2 log a); transformers as 1 - exp(2 log a),
   which cancels as a -> 1 (in FP32 the multiplier loses up to a few 1e-4 there; samu ~1e-6).
2. Gates in FP32: samu evaluates the sigmoid gates, log a, a and the multiplier in FP32 (float64
   for float64 input) whatever the model's dtype; its gate products take operands in the model's
   dtype with FP32 accumulation, as autocast would.  transformers computes all of it in the
   model's dtype (BF16: errors of several 1e-2 in the gates).  The recurrence is carried in FP32
   by both (samu in float64 for a float64 model, transformers in FP32 even then), and the
   state it keeps is in that carry dtype.
3. The convolution respects resets: at a token after position 0 it sees no token before it, as
   recurrentgemma's Conv1D; transformers' ``nn.Conv1d`` reads across (packed rows, and
   left-padded prompts, whose padding then leaks into the first tokens).  Computed in FP32 and
   rounded to the model's dtype (transformers: in the model's dtype).
4. A prefill continues the cached convolution state: a second call of several tokens after a
   first one equals one call over both; transformers' prefill starts its convolution from zeros
   (its RG-LRU does continue).  Where a position is 0 the state is ignored all the same.

Where transformers is right (no reset inside a row but at its first token, float64 accumulation)
the logits, loss and every gradient agree with it to float64 precision, and greedy generation
gives the same tokens (tests/integrations/test_transformers.py).

Two transformers habits that the patch does not change: ``position_ids`` left out are taken as
``cache.get_seq_length() + arange(L)``, which counts 0 tokens where the first layer is
recurrent, so a call continuing a cache must pass its positions (a position of 0 resets); and
the recurrent blocks ignore ``attention_mask``: padding must carry position 0 (``generate``'s
positions do: every left pad and the first real token are 0).

Weights: ``to_samu_block(block)`` builds ``samu.model.RecurrentBlock`` from a transformers block
and ``load_samu_block(samu_block, block)`` copies one back (``samu.integrations.weights``).
"""
from __future__ import annotations

import re
import warnings

import torch
from torch import nn

try:
    import transformers
    from transformers.models.recurrent_gemma import modeling_recurrent_gemma as _hf
except ImportError as exc:  # transformers missing, or one without RecurrentGemma
    raise ImportError("samu.integrations.transformers needs Hugging Face transformers with "
                      "RecurrentGemma (5.20 to 5.25): pip install '.[transformers]' in a clone of "
                      "samu") from exc

from ..checks import SUPPORTED_DTYPES
from ..model import RecurrentBlock, causal_conv1d, causal_conv1d_step, gelu
from ..modules import Mixer
from . import weights

# The transformers releases whose RecurrentGemmaRecurrentBlock and RecurrentGemmaRglru are the
# code this module reproduces (the same from 5.20 to 5.25; 5.12 returned another value).
SUPPORTED_VERSIONS = ((5, 20), (5, 25))
TESTED_VERSION = "5.25"
# Where patch keeps samu's RG-LRU on transformers' layer (an attribute, not a submodule).
_MIXER = "samu_mixer"
HF_BLOCK = _hf.RecurrentGemmaRecurrentBlock
HF_RGLRU = _hf.RecurrentGemmaRglru


def version_supported(version: str) -> bool:
    """Whether transformers ``version`` ("5.25.0", "5.26.0.dev0") is one patch was written for."""
    found = re.match(r"(\d+)\.(\d+)", str(version))
    if found is None:
        return False
    low, high = SUPPORTED_VERSIONS
    return low <= (int(found[1]), int(found[2])) <= high


def _versions_text() -> str:
    (a, b), (c, d) = SUPPORTED_VERSIONS
    return f"{a}.{b} to {c}.{d}"


def check_transformers_version(strict: bool = True) -> None:
    """RuntimeError unless the installed transformers is one
    whose RecurrentGemma code this module reproduces (a warning instead with strict=False)."""
    version = transformers.__version__
    if version_supported(version):
        return
    text = (f"samu.integrations.transformers: transformers {version} is not a version it "
            f"supports ({_versions_text()}, whose RecurrentGemma recurrent block and RG-LRU it "
            f"reproduces; tested with {TESTED_VERSION})")
    if strict:
        raise RuntimeError(text + "; install one of those, or pass check_version=False to "
                           "patch anyway (then compare with the unpatched model)")
    warnings.warn(text + ": patched anyway (check_version=False); compare the patched model "
                  "with the unpatched one before relying on it", stacklevel=3)


def reset_mask(position_ids, batch: int, length: int) -> torch.Tensor:
    """[B, L] bool, True where the position is 0 (a sequence starts there), from position_ids
    [B, L] or [1, L] (shared by every row)."""
    if not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 2 \
            or position_ids.shape[1] != length or position_ids.shape[0] not in (1, batch):
        shape = (tuple(position_ids.shape) if isinstance(position_ids, torch.Tensor)
                 else type(position_ids).__name__)
        raise ValueError(f"samu.integrations.transformers: position_ids must be [{batch}, "
                         f"{length}] or [1, {length}] (the input's batch and length), got "
                         f"{shape}")
    resets = position_ids == 0
    return resets if resets.shape[0] == batch else resets.expand(batch, length).contiguous()


class RglruView(Mixer):
    """samu's RG-LRU over the parameters of a transformers ``RecurrentGemmaRglru``, in place:
    ``input_gate_*`` are samu's ``gate_x_*``, ``recurrent_gate_*`` its ``gate_a_*`` (biases
    [H, bw] read as [D]), ``recurrent_param`` its ``a_param``.  forward and step are
    ``samu.modules.Mixer``'s; the layer is held, not registered (its parameters stay its
    own)."""
    mixer = "rglru"

    def __init__(self, layer: nn.Module, backend="auto"):
        super().__init__(layer.num_attention_heads * layer.block_width, backend)
        self.num_heads = layer.num_attention_heads
        object.__setattr__(self, "_layer", layer)

    def _parameters_in_order(self) -> tuple:
        layer, heads = self._layer, "heads"
        return (layer.input_gate_weight,
                weights.tensor_to_samu(heads, layer.input_gate_bias),
                layer.recurrent_gate_weight,
                weights.tensor_to_samu(heads, layer.recurrent_gate_bias),
                layer.recurrent_param)


class SamuRglru(HF_RGLRU):
    """transformers' ``RecurrentGemmaRglru`` run by samu (``patch`` sets it as the layer's
    class): the same call, ``forward(activations, position_ids)``, and the same state
    attribute, ``recurrent_states`` (None: zeros), continued and replaced by each call.  A
    position of 0 resets; one token is a ``step``."""

    def forward(self, activations: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        mixer = self.__dict__[_MIXER]
        batch, length, width = activations.shape
        resets = reset_mask(position_ids, batch, length)
        state = self.recurrent_states
        if state is None:  # as transformers: the recurrence starts from zeros
            state = torch.zeros(batch, width, device=activations.device, dtype=torch.float32)
        if length == 1:
            y, state = mixer.step(activations[:, 0], state, resets=resets[:, 0])
            y = y[:, None]
        else:
            y, state = mixer(activations, initial_state=state, output_final_state=True,
                             resets=resets)
        self.recurrent_states = state
        return y


def conv_parameters(conv: nn.Conv1d) -> tuple[torch.Tensor, torch.Tensor]:
    """(w [K, W], b [W]): samu's causal convolution's parameters, views of an nn.Conv1d's."""
    return weights.tensor_to_samu("conv", conv.weight), conv.bias


class SamuRecurrentBlock(HF_BLOCK):
    """transformers' ``RecurrentGemmaRecurrentBlock`` whose convolution and RG-LRU run on samu
    (``patch`` sets it as the block's class): the same call and return value, the same state
    attributes in transformers' layout (``conv1d_state`` [B, lru_width, conv1d_width - 1])."""

    def forward(self, input_states, position_ids, attention_mask=None, use_cache: bool = True,
                **kwargs):
        batch, length, _ = input_states.shape
        resets = reset_mask(position_ids, batch, length)
        y_branch = self.act_fn(self.linear_y(input_states))
        x_branch = self.linear_x(input_states)
        w, b = conv_parameters(self.conv_1d)
        if use_cache:
            want = (batch, self.lru_width, self.conv1d_width - 1)
            if self.conv1d_state is None or tuple(self.conv1d_state.shape) != want:
                self._setup_cache(batch, x_branch.device, x_branch.dtype)
            state = self.conv1d_state.transpose(1, 2)  # samu's [B, K - 1, W]
            if length == 1:
                u, state = causal_conv1d_step(x_branch[:, 0], w, b, state, resets[:, 0])
                u = u[:, None]
            else:
                u, state = causal_conv1d(x_branch, w, b, state, resets=resets)
        else:
            self.conv1d_state = None
            self.rg_lru.recurrent_states = None
            u, _ = causal_conv1d(x_branch, w, b, resets=resets)
        u = self.rg_lru(u, position_ids)
        if use_cache:  # after the RG-LRU: a call it refuses leaves both states as they were
            self.conv1d_state = state.transpose(1, 2)  # transformers' layout, no copy
        return self.linear_out(u * y_branch), None

    def _setup_cache(self, batch, device, dtype):
        """transformers' zeros, with the convolution's state at lru_width channels (its own
        takes hidden_size, which a decode without a prefill cannot use where they differ)."""
        self.rg_lru.recurrent_states = torch.zeros((batch, self.lru_width), device=device,
                                                   dtype=torch.float32)
        self.conv1d_state = torch.zeros((batch, self.lru_width, self.conv1d_width - 1),
                                        device=device, dtype=dtype)


PATCHED = {HF_BLOCK: SamuRecurrentBlock, HF_RGLRU: SamuRglru}
ORIGINAL = {patched: original for original, patched in PATCHED.items()}


def check_block(block: nn.Module, name: str = "") -> None:
    """ValueError (TypeError for a subclass) naming what patch cannot serve in ``block``."""
    where = f"samu.integrations.transformers: recurrent block {name!r}" if name else \
        "samu.integrations.transformers: a recurrent block"
    if type(block) is SamuRecurrentBlock:
        raise ValueError(f"{where} is patched already; unpatch it first")
    for module, cls in ((block, HF_BLOCK), (getattr(block, "rg_lru", None), HF_RGLRU)):
        if type(module) is not cls:
            raise TypeError(f"{where}: {type(module).__name__} is not transformers' "
                            f"{cls.__name__} itself; a subclass's changes would be lost")
    conv, lru, width = block.conv_1d, block.rg_lru, block.lru_width
    taps = block.conv1d_width
    if not (isinstance(conv, nn.Conv1d) and conv.in_channels == conv.out_channels == width
            and conv.groups == width and conv.kernel_size == (taps,)
            and conv.padding == (taps - 1,) and conv.stride == (1,) and conv.dilation == (1,)
            and conv.padding_mode == "zeros" and conv.bias is not None):
        raise ValueError(f"{where}: its convolution is not RecurrentGemma's (a depthwise causal "
                         f"nn.Conv1d of {width} channels, {taps} taps, padding {taps - 1}, with "
                         f"a bias), got {conv}")
    if lru.num_attention_heads * lru.block_width != width:
        raise ValueError(f"{where}: lru_width {width} is not divisible by num_attention_heads "
                         f"{lru.num_attention_heads}")
    tensors = [*lru.parameters(), conv.weight, conv.bias]
    for t in tensors:
        if t.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{where}: parameters of dtype {t.dtype} are not supported; samu "
                             f"runs {', '.join(str(d) for d in SUPPORTED_DTYPES)}")
        if t.device.type not in ("cpu", "cuda") or t.device != tensors[0].device:
            raise ValueError(f"{where}: parameters must be on one cpu or cuda device, got "
                             f"{t.device} and {tensors[0].device}")


def recurrent_blocks(model: nn.Module) -> dict[str, nn.Module]:
    """{name: block} of every RecurrentGemma recurrent block in ``model``, patched or not."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"samu.integrations.transformers: expected a torch.nn.Module (a "
                        f"RecurrentGemmaForCausalLM or RecurrentGemmaModel), got "
                        f"{type(model).__name__}")
    return {name: m for name, m in model.named_modules() if isinstance(m, HF_BLOCK)}


class Patch:
    """What ``patch`` returns: ``unpatch()`` gives the model back transformers' code (again a
    no-op), and a ``with`` block unpatches at its end.  ``blocks``: {name: block} patched;
    ``last_backends``: {name: the RG-LRU backend that ran in its last forward}."""

    def __init__(self, model: nn.Module, blocks: dict, backend, mixers: dict):
        self.model, self.blocks, self.backend = model, blocks, backend
        self._mixers = mixers  # the RglruViews this patch installed: whose blocks are its own

    def _own(self) -> dict:
        """{name: block} still running this patch (not undone, nor patched again since)."""
        return {name: b for name, b in self.blocks.items() if type(b) is SamuRecurrentBlock
                and b.rg_lru.__dict__.get(_MIXER) is self._mixers[name]}

    @property
    def active(self) -> bool:
        return bool(self._own())

    @property
    def last_backends(self) -> dict:
        return {name: b.rg_lru.__dict__[_MIXER].last_backend for name, b in self._own().items()}

    def unpatch(self) -> None:
        for block in self._own().values():  # a later patch's blocks are left to its handle
            _restore(block)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.unpatch()
        return False

    def __repr__(self) -> str:
        state = "active" if self.active else "undone"
        return (f"Patch({type(self.model).__name__}, {len(self.blocks)} recurrent blocks on "
                f"samu, backend={self.backend!r}, {state})")


def _restore(block: nn.Module) -> None:
    for module in (block, block.rg_lru):
        if type(module) in ORIGINAL:
            module.__class__ = ORIGINAL[type(module)]
    block.rg_lru.__dict__.pop(_MIXER, None)


def patch(model: nn.Module, backend="auto", check_version: bool = True) -> Patch:
    """Run every RecurrentGemma recurrent block of ``model`` on samu (module docstring): its
    convolution with resets at position 0, its RG-LRU by samu's ``backend``.  Checks every
    block before it changes any; returns the ``Patch`` that undoes it."""
    blocks = recurrent_blocks(model)
    check_transformers_version(check_version)
    if not blocks:
        raise ValueError(f"samu.integrations.transformers: {type(model).__name__} has no "
                         "RecurrentGemma recurrent block (RecurrentGemmaRecurrentBlock) to patch")
    for name, block in blocks.items():
        check_block(block, name)
    mixers = {name: RglruView(block.rg_lru, backend) for name, block in blocks.items()}
    for name, block in blocks.items():
        block.rg_lru.__dict__[_MIXER] = mixers[name]
        block.rg_lru.__class__ = SamuRglru
        block.__class__ = SamuRecurrentBlock
    return Patch(model, blocks, backend, mixers)


def unpatch(model: nn.Module) -> int:
    """Undo every patch in ``model`` (whatever handle made it); the number of blocks undone."""
    undone = 0
    for block in recurrent_blocks(model).values():
        undone += type(block) is SamuRecurrentBlock
        _restore(block)
    return undone


def is_patched(model: nn.Module) -> bool:
    return any(type(b) is SamuRecurrentBlock for b in recurrent_blocks(model).values())


def _check_activation(block: nn.Module) -> None:
    probe = torch.linspace(-4.0, 4.0, 17, dtype=torch.float64)
    if not torch.allclose(block.act_fn(probe), gelu(probe), rtol=0, atol=1e-12):
        raise ValueError(f"samu.integrations.transformers: the block's activation "
                         f"{type(block.act_fn).__name__} is not samu's RecurrentBlock's (GELU, "
                         "tanh approximation: hidden_activation='gelu_pytorch_tanh')")


def to_samu_block(block: nn.Module, backend="auto") -> RecurrentBlock:
    """A ``samu.model.RecurrentBlock`` (mixer ``"rglru"``, FP32, on the block's device) with the
    weights of transformers' recurrent ``block`` (patched or not): the same function but for
    samu's departures listed above."""
    if not isinstance(block, HF_BLOCK):
        raise TypeError(f"samu.integrations.transformers: expected a "
                        f"RecurrentGemmaRecurrentBlock, got {type(block).__name__}")
    _check_activation(block)
    out = RecurrentBlock("rglru", block.hidden_size, block.lru_width, block.conv1d_width,
                         block.rg_lru.num_attention_heads, backend)
    out.to(block.linear_x.weight.device)
    out.load_state_dict(weights.to_samu(block.state_dict(), "transformers"))
    return out


def load_samu_block(samu_block: RecurrentBlock, block: nn.Module) -> None:
    """Copy a ``samu.model.RecurrentBlock``'s weights into transformers' recurrent ``block``
    (cast to its dtype); sizes must match (load_state_dict's error otherwise)."""
    if not isinstance(samu_block, RecurrentBlock) or samu_block.kind != "rglru":
        raise TypeError("samu.integrations.transformers: expected samu.model.RecurrentBlock "
                        f"with mixer 'rglru', got {samu_block!r}")
    if not isinstance(block, HF_BLOCK):
        raise TypeError(f"samu.integrations.transformers: expected a "
                        f"RecurrentGemmaRecurrentBlock, got {type(block).__name__}")
    _check_activation(block)
    block.load_state_dict(weights.from_samu(samu_block.state_dict(), "transformers"))


__all__ = ["patch", "unpatch", "is_patched", "Patch", "check_block", "check_transformers_version",
           "version_supported", "recurrent_blocks", "reset_mask", "to_samu_block",
           "load_samu_block", "RglruView", "SamuRglru", "SamuRecurrentBlock",
           "SUPPORTED_VERSIONS"]

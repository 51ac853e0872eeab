"""The Griffin recurrent block's weights in samu, transformers and recurrentgemma.

``samu.model.RecurrentBlock`` (mixer ``"rglru"``), transformers' ``RecurrentGemmaRecurrentBlock``
and recurrentgemma's PyTorch ``RecurrentBlock`` hold the same parameters under other names and
layouts.  The three compute the same block-diagonal gate products, G[h bw + j] =
sum_i x[h bw + i] W[h, i, j] + b[h bw + j], with W stored [H, bw, bw] everywhere; they differ in

- names: transformers' ``rg_lru.input_gate_*`` and ``rg_lru.recurrent_gate_*``, recurrentgemma's
  ``rg_lru.input_gate.{w,b}`` and ``rg_lru.a_gate.{w,b}``, are samu's ``mixer.gate_x_*`` and
  ``mixer.gate_a_*``; ``recurrent_param`` (transformers) and ``a_param`` (recurrentgemma) are
  samu's ``mixer.a_param``;
- the gate biases: [H, bw] in the other two, [D] (D = H bw, head-major) in samu;
- the convolution's weight: transformers' ``nn.Conv1d`` holds ``conv_1d.weight`` [W, 1, K] and
  ``conv_1d.bias``; samu and recurrentgemma hold ``conv_1d.w`` [K, W] and ``conv_1d.b``, and in
  all three the last tap multiplies the current token.

The linear layers (``linear_x``, ``linear_y``, ``linear_out``) are ``nn.Linear`` in all three.
``to_samu`` and ``from_samu`` convert state dicts (tensors keep their dtype and device; the
loading module casts); they import neither library.
"""
from __future__ import annotations

from typing import NamedTuple


class Entry(NamedTuple):
    """One parameter: its samu name, its name in the other library, and its layout there:
    ``"same"``, ``"heads"`` (a gate bias [H, bw], samu's [D]) or ``"conv"`` (an nn.Conv1d weight
    [W, 1, K], samu's [K, W])."""
    samu: str
    other: str
    layout: str = "same"


_LINEARS = tuple(Entry(f"{layer}.{p}", f"{layer}.{p}")
                 for layer in ("linear_y", "linear_x", "linear_out") for p in ("weight", "bias"))

TABLES = {
    "transformers": _LINEARS + (
        Entry("conv_1d.w", "conv_1d.weight", "conv"),
        Entry("conv_1d.b", "conv_1d.bias"),
        Entry("mixer.gate_x_weight", "rg_lru.input_gate_weight"),
        Entry("mixer.gate_x_bias", "rg_lru.input_gate_bias", "heads"),
        Entry("mixer.gate_a_weight", "rg_lru.recurrent_gate_weight"),
        Entry("mixer.gate_a_bias", "rg_lru.recurrent_gate_bias", "heads"),
        Entry("mixer.a_param", "rg_lru.recurrent_param"),
    ),
    "recurrentgemma": _LINEARS + (
        Entry("conv_1d.w", "conv_1d.w"),
        Entry("conv_1d.b", "conv_1d.b"),
        Entry("mixer.gate_x_weight", "rg_lru.input_gate.w"),
        Entry("mixer.gate_x_bias", "rg_lru.input_gate.b", "heads"),
        Entry("mixer.gate_a_weight", "rg_lru.a_gate.w"),
        Entry("mixer.gate_a_bias", "rg_lru.a_gate.b", "heads"),
        Entry("mixer.a_param", "rg_lru.a_param"),
    ),
}


def _table(library: str) -> tuple[Entry, ...]:
    if library not in TABLES:
        raise ValueError(f"weights: unknown library {library!r}; choose one of {list(TABLES)}")
    return TABLES[library]


def _check_keys(state_dict, want: list[str], whose: str) -> None:
    if not isinstance(state_dict, dict):
        raise TypeError(f"weights: expected {whose} state dict (a dict of tensors), got "
                        f"{type(state_dict).__name__}")
    missing = [k for k in want if k not in state_dict]
    unexpected = [k for k in state_dict if k not in want]
    if missing or unexpected:
        raise ValueError(f"weights: {whose} recurrent block's state dict does not match: missing "
                         f"{missing}, unexpected {unexpected}")


def tensor_to_samu(layout: str, t):
    """One tensor in samu's layout from the other library's (``Entry.layout``); a view."""
    if layout == "heads":
        return t.reshape(-1)
    if layout == "conv":
        if t.dim() != 3 or t.shape[1] != 1:
            raise ValueError("weights: a depthwise nn.Conv1d weight must be [W, 1, K], got "
                             f"{list(t.shape)}")
        return t[:, 0, :].t()
    return t


def tensor_from_samu(layout: str, t, heads: int):
    """One tensor in the other library's layout from samu's (``heads``: H, for the biases)."""
    if layout == "heads":
        return t.reshape(heads, -1)
    if layout == "conv":
        return t.t()[:, None, :]
    return t


def to_samu(state_dict: dict, library: str) -> dict:
    """samu.model.RecurrentBlock's state dict from a recurrent block's of ``library``
    (``"transformers"`` or ``"recurrentgemma"``); ValueError naming any missing or unexpected
    key."""
    table = _table(library)
    _check_keys(state_dict, [e.other for e in table], f"a {library}")
    return {e.samu: tensor_to_samu(e.layout, state_dict[e.other]).contiguous() for e in table}


def from_samu(state_dict: dict, library: str) -> dict:
    """A recurrent block's state dict of ``library`` from samu.model.RecurrentBlock's (mixer
    ``"rglru"``); the head count is read from the gate weights [H, bw, bw]."""
    table = _table(library)
    _check_keys(state_dict, [e.samu for e in table], "samu's")
    heads = state_dict["mixer.gate_x_weight"].shape[0]
    return {e.other: tensor_from_samu(e.layout, state_dict[e.samu], heads).contiguous()
            for e in table}


__all__ = ["TABLES", "Entry", "to_samu", "from_samu", "tensor_to_samu", "tensor_from_samu"]

"""Names the report's parts share: the committed and CPU slugs, the CPU's labels, the headline
peer (the mixers' labels and colours are samu.mixers.LABELS and COLOURS)."""
from __future__ import annotations

from ...paths import COMMITTED_SLUG  # noqa: F401  the results committed in data/results/
from .. import peers as peers_
from ...shapes import Shape

SHAPE_ORDER_KEY = lambda s: (s[1], s[2], s[0])  # noqa: E731  length, width, batch

CPU_SLUG = "cpu"  # dispatch.gpu_slug() without CUDA
CPU_LABEL = "CPU (Triton interpreter)"
CPU_NOTE = "CPU (Triton interpreter): timings are no GPU result"
PUBLISHED_SOURCE = "published H800 PCIe"
# The peer of the headline column speedup_vs_peer: eager gates or controller, then FLA's
# chunk_hgrn.  Every other peer a row holds gets a column of its own (summary_table).
HEADLINE_PEER = peers_.PEERS[0].name


def shape_of(row: dict) -> Shape:
    return Shape.of(row["shape"])

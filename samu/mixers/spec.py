"""A mixer's spec (``MixerSpec``) and what the specs in samu/mixers/<name>.py use to write
theirs; the table of them is samu.mixers.MIXERS."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class MixerSpec:
    """What makes a mixer a mixer, and where its implementations live.

    name: the key everywhere (backend registry, calibration and result files).
    label: its name in tables and figures.
    parameter_names: the functional form's parameters in order, the state_dict's names.
    width_of: {name: tensor} in that order -> the width D, from the parameter that fixes it
        (ValueError naming it when its shape is wrong); x is checked against it next.
    width_parameter: the name of that parameter, which an error names where another does not
        fit the width it gives; None: the first of parameter_names.
    check_shapes: ({name: tensor}, width) -> None, or ValueError naming the parameter whose
        shape is wrong (every parameter is a tensor by then).  Both read shapes only: a call
        whose signature passed them once is not checked again (samu.functional).
    parameter_count: (width, num_heads) -> parameters of one mixer (num_heads ignored by a
        mixer without heads).
    dynamic_control_values_per_token: width -> the input-dependent gate values per token.
    reference: path of the pure-PyTorch reference, ``fn(x, *params, scan=, initial_state=,
        cu_seqlens=, output_final_state=)`` as in samu.ops.<mixer>.naive, and ``resets=`` where
        a call passes a reset mask (samu.ops.layout.scan_sequences takes it).
    module: path of its torch.nn.Module class (``cls(width, backend=...)``, with
        ``reset_parameters(generator=None)``).
    function: path of its named functional form; None: ``samu.functional.mix`` serves it.
    backward: path of its hand-derived backward formulas (tests hold them to autograd).
    kernel_families: paths of its Triton families; each module implements
        samu.ops.common.family.KernelFamily (MIXER, CONFIGS, forward, backward, ...), and
        samu.ops.common.function makes its backends.
    default_backend: what ``auto`` runs on CUDA without a calibrated choice, and under
        Triton's interpreter.
    log_decay: path of ``fn(x, *params) -> [B, D]``, the sum of log a over x's tokens in the
        reference's dtypes (a slice's decay, for context parallelism); None: not given.
    has_heads: the module takes ``num_heads`` (RG-LRU's gate blocks).
    heads_of: {name: tensor} -> the head count they hold (a mixer with heads).
    flops_per_element: (width, num_heads) -> forward+backward FLOPs per element of [B, L, D],
        for the report's roofline (docs/PERFORMANCE.md's counts); None: not counted.
    memory_budget_units: the peak memory of a forward+backward, above its inputs, in units of
        B*L*D BF16 elements, that calibration prefers for ``auto`` (SPEC section 4): where the
        fastest legal backend holds more, the fastest one within it is chosen if its GPU time
        is within the calibration's tolerance; None: the fastest, whatever it holds.
    colour: its colour in figures (a matplotlib colour); None: one of ``SPARE_COLOURS`` by its
        place in the table (``COLOURS``).
    baseline: the mixer whose time this one's speed-up is taken over in result rows, tables and
        figures (SAMU's over RG-LRU); None: no speed-up.
    controller: what result rows record as its controller (SAMU's FP32 controller); None: none.
    host_target_over_linear: the host time of a small forward+backward it aims at, over a
        torch.nn.Linear(D, D)'s (docs/SPEC.md section 8); None: no target.
    eager_preparation: path of ``fn(x, *params) -> (log_a, u, output)``: the reference's own
        eager preparation of the scan's inputs ([B, L, D] in the carry dtype) and ``output(h)``
        the mixer's y from the scan's states, for the public pipelines that run another
        library's scan on them (samu.experiment.peers); None: no public pipeline serves it.
    eager_preparation_name: the preparation's name in a pipeline's
        ("<name>_then_fla_chunk_hgrn").
    flops_on_tensor_cores: most of its FLOPs are tensor-core products (RG-LRU's gates): the
        roofline's FP32 ceiling bounds the other mixers only.
    """
    name: str
    label: str
    parameter_names: tuple[str, ...]
    width_of: Callable[[dict], int]
    check_shapes: Callable[[dict, int], None]
    parameter_count: Callable[[int, int], int]
    dynamic_control_values_per_token: Callable[[int], int]
    reference: str
    module: str
    function: str | None = None
    backward: str | None = None
    kernel_families: tuple[str, ...] = ()
    log_decay: str | None = None
    default_backend: str = "reference_chunked"
    has_heads: bool = False
    heads_of: Callable[[dict], int] | None = None
    flops_per_element: Callable[[int, int], float] | None = None
    memory_budget_units: float | None = None
    colour: str | None = None
    baseline: str | None = None
    controller: str | None = None
    host_target_over_linear: float | None = None
    eager_preparation: str | None = None
    eager_preparation_name: str = "eager"
    flops_on_tensor_cores: bool = False
    width_parameter: str | None = None

    def load(self, field: str):
        """The object that field ``field`` names (e.g. ``spec.load("reference")``)."""
        return load(getattr(self, field))

    def width_parameter_name(self) -> str:
        """The parameter width_of reads the width from."""
        return self.width_parameter or self.parameter_names[0]


def load(path: str):
    """The attribute ``path`` ("package.module:attribute") names."""
    module, _, attribute = path.partition(":")
    found = importlib.import_module(module)
    return getattr(found, attribute) if attribute else found


def shape_of(params: dict, name: str) -> tuple:
    return tuple(params[name].shape)


def check_shape(mixer: str, params: dict, name: str, want: tuple) -> None:
    """ValueError naming ``name`` unless its shape is ``want``."""
    if shape_of(params, name) != tuple(want):
        raise ValueError(f"{mixer}: {name} must have shape {list(want)}, got "
                         f"{list(shape_of(params, name))}")

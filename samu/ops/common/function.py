"""The eager autograd.Function and the backend that every kernel family (samu.ops.common.family)
shares: one piece of code over any family's forward and backward, whatever its mixer.  The
custom ops (samu.custom_ops) call the same forward and backward under torch.compile."""
from __future__ import annotations

import torch

from .launching import aligned, fp32_contiguous, refuse_double_backward
from .sequences import SequenceArgs, sequence_args


class FamilyFunction(torch.autograd.Function):
    """Eager autograd over a kernel family's forward and backward.  The outputs are y and the
    final state (None unless asked for); the backward takes both gradients and returns one for
    the initial state.  Saved: x, the family's residuals, the parameters and the sequence
    tensors.  Where the family's backward writes its gradient over the saved residuals
    (``spent_residuals``), a second backward through the same graph is refused."""

    @staticmethod
    def forward(ctx, family, config, sequences, initial_state, seq_index, x, *params):
        y, final, residuals = family.forward(x, params, sequences, config, zero_gaps=False)
        # The initial state and sequence index are saved, not kept on ctx: autograd then
        # refuses a backward after an in-place change to them instead of reading new values.
        ctx.save_for_backward(x, *residuals, *params, *sequences.tensors_to_save())
        ctx.family, ctx.config, ctx.n_params = family, config, len(params)
        ctx.sequences = sequences.without_tensors()
        ctx.spent = None
        ctx.set_materialize_grads(False)
        return y, final

    @staticmethod
    def backward(ctx, dy, d_final):
        family, config = ctx.family, ctx.config
        refuse_double_backward(family.MIXER)
        if ctx.spent is not None:  # a flag, not a version bump: saved-tensor hooks skip that
            raise RuntimeError(f"{family.MIXER}: {config.name} wrote its gradient over "
                               f"{ctx.spent} in the first backward, so this graph cannot be "
                               "backpropagated through twice (retain_graph=True)")
        ctx.spent = family.spent_residuals(config)
        x, *rest = ctx.saved_tensors
        n, kept = ctx.n_params, SequenceArgs.SAVED
        residuals, params = rest[:-n - kept], rest[-n - kept:-kept]
        # the forward's placeholder (aligned x): the same compiled kernel variants as the forward
        sequences = ctx.sequences.with_saved(*rest[-kept:], placeholder=aligned(x))
        grads = family.backward(x, params, residuals, dy, d_final, sequences, config,
                                spend_residuals=True)
        return (None, None, None, grads[-1], None, grads[0], *grads[1:-1])


def run_with(family, config):
    """The backend of one configuration of a kernel family: run(x, *parameters,
    initial_state=None, cu_seqlens=None, output_final_state=False, resets=None) -> (y, final
    state or None)."""
    def run(x, *params, initial_state=None, cu_seqlens=None, output_final_state=False,
            resets=None):
        if initial_state is not None:
            initial_state = fp32_contiguous(initial_state)  # differentiable: autograd casts back
        sequences = sequence_args(x, initial_state, cu_seqlens, output_final_state, resets)
        return FamilyFunction.apply(family, config, sequences, initial_state,
                                    sequences.seq_index, x, *params)
    return run

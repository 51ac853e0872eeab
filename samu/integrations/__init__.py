"""samu inside other libraries' models.

- ``samu.integrations.transformers``: Hugging Face transformers' RecurrentGemma run on samu's
  RG-LRU (``patch(model)``), and its recurrent blocks' weights mapped to and from
  ``samu.model.RecurrentBlock``.  It imports transformers: ``pip install '.[transformers]'`` in a
  clone of samu.
- ``samu.integrations.weights``: the Griffin recurrent block's parameter names and layouts in
  transformers, in recurrentgemma's PyTorch code and in samu, and the state-dict conversions
  between them (plain tensors; imports neither library).

Nothing here is imported by ``import samu``; each submodule is imported when first read as an
attribute (``samu.integrations.transformers.patch(model)`` after ``import samu``).
"""

from .._runtime import lazy_submodules

SUBMODULES = ("transformers", "weights")

# transformers' submodule imports transformers, which a clone may lack (an extra).
__getattr__, __dir__ = lazy_submodules(__name__, SUBMODULES, globals(),
                                       optional=("transformers",))

"""The mixers' implementations, one folder each: ``naive.py`` (the pure-PyTorch reference),
``backward.py`` (the hand-derived backward formulas) and the Triton kernel families
(``samu/chunk.py``; ``rglru/gemm.py``, whose gate products run in cuBLAS; ``*/single_pass.py``);
``recurrence.py`` is the PyTorch recurrence both share and ``common/`` the Triton pieces both
share, the families' interface (``family.py``) and the autograd Function and backend that serve
every family (``function.py``).  Importing this package imports no Triton."""
from .rglru.backward import rglru_backward
from .rglru.naive import rglru_reference
from .samu.backward import samu_backward
from .samu.naive import samu_reference

__all__ = ["rglru_backward", "rglru_reference", "samu_backward", "samu_reference"]

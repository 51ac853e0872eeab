"""Process-wide settings read once, when samu is imported.

Triton's @jit decides at decoration whether a kernel runs under its interpreter, so the kernels
and the dispatch in backends.py must agree on one value read at one time: this one.
"""
from __future__ import annotations

import os

TRITON_INTERPRET_AT_IMPORT = os.environ.get("TRITON_INTERPRET", "0")
# Triton 3.9 warns when this is unset and will change its default; "1" is today's behaviour, the
# one every measurement in docs/ was made with.
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
INTERPRETING = TRITON_INTERPRET_AT_IMPORT == "1"


def check_interpret_unchanged() -> None:
    """Raise when TRITON_INTERPRET now says otherwise than at import: the kernels were built for
    the old value and cannot follow the new one."""
    now = os.environ.get("TRITON_INTERPRET", "0")
    if (now == "1") != (TRITON_INTERPRET_AT_IMPORT == "1"):
        raise RuntimeError(
            f"TRITON_INTERPRET was changed after samu was imported (it was "
            f"{TRITON_INTERPRET_AT_IMPORT!r} at import, it is {now!r} now); the kernels keep the "
            "value they were imported with. Set TRITON_INTERPRET before `import samu` (restart "
            "the interpreter or notebook kernel to change it).")


def lazy_submodules(package: str, names: tuple, namespace: dict,
                    optional: tuple = ()) -> tuple:
    """(__getattr__, __dir__) for ``package`` (PEP 562): each of ``names`` is imported the first
    time it is read as an attribute, so that importing the package imports none of them;
    ``namespace`` is the package's globals().  Those of ``optional`` need a library that may be
    missing: dir() lists them once imported only, so that help() and inspect, which read every
    name dir() gives, work without it."""
    import importlib

    def __getattr__(name: str):
        if name in names:
            return importlib.import_module(f".{name}", package)  # binds it there too
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(namespace) | (set(names) - set(optional)))
    return __getattr__, __dir__

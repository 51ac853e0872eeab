"""SAMU: reference, backward formulas, chunked Triton kernels."""

"""RG-LRU: reference, backward formulas, chunked Triton kernels."""

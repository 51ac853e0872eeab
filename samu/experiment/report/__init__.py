"""Combine per-shape result files, set them beside the published H800 result, draw the figures.

Each row is judged on its own machine: the floor (SPEC section 8) is 10 bytes per element at that
GPU's own copy bandwidth, the H200's measured, the H800 PCIe's from its datasheet.  A CPU run
(Triton's interpreter) has no floor, no bandwidth and no memory figures: its timings only exercise
the pipeline, and every table and figure says so.
"""
from __future__ import annotations

from .constants import (COMMITTED_SLUG, CPU_LABEL, CPU_NOTE, CPU_SLUG, HEADLINE_PEER,
                        PUBLISHED_SOURCE, SHAPE_ORDER_KEY, shape_of)
from .hardware import (COMPUTE_CEILINGS, COPY_BANDWIDTH, PUBLISHED_H800_PCIE_BANDWIDTH,
                       RGLRU_HEADS, flops_per_element)
from .results import (combine, default_slug, describe_choice, has_shape_results,
                      load_shape_files, published_h800_document)
from .tables import (floor_multiples, frame, is_cpu, machine_label, peer_names,
                     published_comparison, row_bandwidth, run_label, speedup_title, speedups,
                     summary_table,
                     _number)
from .figures import draw_figures, figures, plain_log_ticks, png_bytes, save_figure

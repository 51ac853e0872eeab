"""Which results there are: the per-shape files of a GPU, combined into its result document, and
the published H800 document."""
from __future__ import annotations

from ... import dispatch, paths
from .. import schema
from .constants import COMMITTED_SLUG, CPU_NOTE, CPU_SLUG, SHAPE_ORDER_KEY, shape_of


def has_shape_results(slug: str) -> bool:
    return any(paths.results_dir(slug).glob("*.json"))


def default_slug() -> str:
    """This machine's results when data/results/<its slug>/ holds per-shape files, else the
    committed H200 results (data/results/nvidia-h200/)."""
    here = dispatch.gpu_slug()
    return here if has_shape_results(here) else COMMITTED_SLUG


def describe_choice(slug: str) -> str:
    """One line naming the results shown, and why when they are not this machine's."""
    here = dispatch.gpu_slug()
    folder = paths.relative(paths.results_dir(slug))
    if slug == here:
        text = f"Showing this machine's results ({slug}) from {folder}/"
    else:
        text = f"Showing the {slug} results from {folder}/"
        if slug == COMMITTED_SLUG:
            text = f"Showing the committed {slug} results from {folder}/"
        if not has_shape_results(here):
            text += (f"; this machine ({here}) has no per-shape results in "
                     f"{paths.relative(paths.results_dir(here))}/")
    if slug == CPU_SLUG:
        text += f". {CPU_NOTE}."
    return text


def load_shape_files(slug: str) -> list[dict]:
    """Every per-shape result file of one GPU, validated; schema.ResultFileError names a file
    that is not JSON or not a valid result document, or one measured on another kind of GPU
    or under another protocol than the folder's first file (one document would mix them)."""
    files = sorted(paths.results_dir(slug).glob("*.json"))
    docs = [schema.read_valid_json(p, "result") for p in files]
    for path, doc in zip(files[1:], docs[1:]):
        gpu, first_gpu = doc["environment"].get("gpu"), docs[0]["environment"].get("gpu")
        if dispatch.gpu_slug(gpu or CPU_SLUG) != dispatch.gpu_slug(first_gpu or CPU_SLUG):
            raise schema.ResultFileError(path, f"measured on {gpu}, where {files[0].name} was "
                                         f"on {first_gpu}: keep one GPU's shapes in a folder")
        if doc["protocol"] != docs[0]["protocol"]:
            raise schema.ResultFileError(path, f"its protocol differs from that of "
                                         f"{files[0].name}: rerun the shapes under one protocol")
    return docs


def combine(slug: str, write: bool = True) -> dict:
    """All per-shape files of one GPU in one schema-valid document; with write=True (the
    pipeline) it is also written atomically to data/results/<slug>.json, with write=False (viewing
    results) nothing is written."""
    docs = load_shape_files(slug)
    if not docs:
        raise FileNotFoundError(f"no per-shape result files in {paths.results_dir(slug)}; run "
                                "notebook 03 (make reproduce) first")
    rows = [row for doc in docs for row in doc["rows"]]
    rows.sort(key=lambda r: (SHAPE_ORDER_KEY(shape_of(r)), r["architecture"]))
    combined = {
        "schema_version": schema.SCHEMA_VERSION,
        "protocol": docs[0]["protocol"],
        "environment": docs[-1]["environment"],
        "shape_environments": {shape_of(d["rows"][0]).key: d["environment"]
                               for d in docs},
        "rows": rows,
    }
    if write:
        schema.write_json_atomic(paths.results_file(slug), combined)
    else:
        schema.validate(combined)
    return combined


def published_h800_document() -> dict:
    """The published H800 result (data/reference/h800_pcie_published_result.json), unchanged."""
    return schema.read_json(paths.PUBLISHED_H800_FILE)

"""`make reproduce`: papermill runs notebooks 01-03 once per shape, then 04 once.

`make report GPU=<slug>` (``--report``) runs 04 alone over the per-shape results already in
data/results/<slug>/: the result document, figures and executed report rebuilt from shapes run
in several commands or on several machines of one GPU kind.  It measures nothing.

Executed notebooks go to data/runs/<gpu>/<shape>/, apart from the sources.  A notebook that fails
stops the run with a non-zero exit; its executed copy is kept as *.failed.ipynb for reading, and
the result files it would have written are untouched (they are written atomically).  What is
stored names no folder of the machine that ran it (portable_notebook): paths are relative to the
repository root, a run's temporary files are left out.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import sysconfig
from pathlib import Path

from .. import mixers
from ..shapes import Shape

# The published result's four shapes, then one shape at each other width the calibration covers
# (1536, 3072, 4096), so that auto's nearest-shape rule has an entry at every common width.
PUBLISHED_SHAPES = ["4x2048x2048", "1x8192x2560", "1x32768x1024", "1x32768x2048"]
GPU_SHAPES = PUBLISHED_SHAPES + ["2x8192x3072", "1x16384x4096", "3x1000x1536"]
CPU_SHAPES = ["1x16x16"]  # the interpreter takes ~10 s per RG-LRU forward+backward here
CPU_LARGE_ELEMENTS = 2 ** 16  # beyond this a CPU run is warned that the interpreter is slow
PER_SHAPE = ["01_correctness", "02_calibration", "03_timing"]


def parse_shape(text: str) -> Shape:
    try:
        return Shape.parse(text)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def parse_shapes(args: list[str] | None) -> list[Shape]:
    """Each argument may hold several shapes separated by whitespace: `make reproduce` passes
    SHAPES as one quoted argument.  A shape given twice (1x8x16 and 1X8x16) runs once."""
    return list(dict.fromkeys(parse_shape(word) for arg in args or () for word in arg.split()))


def check_heads_divide(parser: argparse.ArgumentParser, heads: int, shapes,
                       names: list[str], source: str = "--heads") -> None:
    """A parser error, before any shape runs, where ``heads`` (named as ``source``) does not
    divide the width of a BxLxD shape and one of the mixers ``names`` has heads (it splits the
    width into that many blocks)."""
    headed = [m for m in names if mixers.get(m).has_heads]
    uneven = [Shape(*s).key for s in shapes if s[2] % heads] if headed else []
    if uneven:
        parser.error(f"{source} {heads} does not divide the width of {', '.join(uneven)} "
                     f"({', '.join(headed)} split the width into {heads} blocks)")


def export_data_dir() -> str:
    """Put the absolute data folder into the environment that notebook kernels inherit: they run
    in notebooks/, where a relative SAMU_DATA_DIR would name another folder."""
    from .. import paths

    os.environ["SAMU_DATA_DIR"] = str(paths.DATA)
    return os.environ["SAMU_DATA_DIR"]


def kernel_manager_class():
    """The kernel manager for papermill's kernels: they listen on Unix (IPC) sockets, not TCP.
    Over TCP ipykernel warns at every start that code and outputs travel unencrypted ("Kernel is
    running over TCP without encryption") and names IPC transport as the remedy; IPC removes the
    cause instead of hiding the message.  Each kernel's sockets get a unique path in the temporary
    folder: the default, "kernel-ipc" in the working directory (notebooks/), would be shared by
    runs at the same time.  Without Unix sockets (Windows) this returns None: papermill's default,
    TCP."""
    if os.name != "posix":
        return None
    import tempfile
    import uuid

    from jupyter_client.manager import KernelManager
    from traitlets import default

    class IPCKernelManager(KernelManager):
        @default("transport")
        def _transport_default(self):
            return "ipc"

        @default("ip")
        def _ip_default(self):  # a socket path: short enough for AF_UNIX's ~100 bytes
            return os.path.join(tempfile.gettempdir(), f"samu-kernel-{uuid.uuid4().hex[:16]}")

    return IPCKernelManager


# An installed package's folder as a warning or a traceback names it
# ("/opt/venv/lib/python3.12/site-packages/"): the stored copy names the file by its module's path
# ("tqdm/auto.py") instead.
_SITE_PACKAGES = re.compile(r"(?:/[^\s\"'/:\x1b]+)*/(?:site|dist)-packages/")


def machine_prefixes() -> list[str]:
    """This machine's folders that outputs may name, longest first, each ending in "/": the
    repository root (results are named relative to it) and the standard library."""
    from .. import paths

    folders = {str(paths.REPO_ROOT), sysconfig.get_paths()["stdlib"]}
    return sorted((f.rstrip("/") + "/" for f in folders), key=len, reverse=True)


def _portable_text(text: str, prefixes: list[str]) -> str:
    for prefix in prefixes:
        text = text.replace(prefix, "")
    return _SITE_PACKAGES.sub("", text)


def _portable_value(value, prefixes: list[str]):
    if isinstance(value, str):
        return _portable_text(value, prefixes)
    if isinstance(value, list):
        return [_portable_value(v, prefixes) for v in value]
    return value


def portable_notebook(nb, stored_path, unstored=()):
    """An executed notebook as it is stored (changed in place, and returned): papermill's
    input_path and output_path relative to the repository root (the output path is where the
    notebook is stored, not papermill's temporary), the parameters named in ``unstored`` (a
    run's temporary files, say) left out of the metadata and the injected-parameters cell, and
    the repository root, the standard library's folder and site-packages folders dropped from
    every text output, so that no output names this machine's folders."""
    from papermill.engines import papermill_engines
    from papermill.translators import translate_parameters
    from .. import paths

    meta = nb.metadata.get("papermill")
    if meta is not None:
        if meta.get("input_path"):
            meta["input_path"] = paths.relative(meta["input_path"])
        meta["output_path"] = paths.relative(stored_path)
        parameters = meta.get("parameters") or {}
        dropped = {k: parameters.pop(k) for k in unstored if k in parameters}
        injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
        kernel, language = (papermill_engines.nb_kernel_name(None, nb),
                            papermill_engines.nb_language(None, nb))
        for name, value in dropped.items():
            # The assignment papermill wrote for this parameter, without its comment line.
            assignment = translate_parameters(kernel, language, {name: value},
                                              "Parameters").split("\n", 1)[1]
            for cell in injected:
                cell.source = cell.source.replace(assignment, "")
    prefixes = machine_prefixes()
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            for key in ("text", "evalue", "traceback"):
                if key in output:
                    output[key] = _portable_value(output[key], prefixes)
            for mime, data in output.get("data", {}).items():
                if mime.startswith("text/"):
                    output["data"][mime] = _portable_value(data, prefixes)
    return nb


def store_portable(executed: Path, stored: Path, unstored=()) -> Path:
    """Rewrite the executed notebook ``executed`` as portable_notebook stores it, at ``stored``
    (atomically: written beside it, then renamed), and remove ``executed``."""
    import nbformat

    nb = portable_notebook(nbformat.read(executed, as_version=4), stored, unstored)

    def write(tmp: Path) -> None:  # as papermill writes notebooks: nbformat.writes' text
        tmp.write_text(nbformat.writes(nb), encoding="utf-8")

    from . import schema
    schema.atomic_write(stored, write)
    if executed != stored:
        executed.unlink()
    return stored


def notebook_parameters(name: str) -> dict:
    """The defaults of notebooks/<name>.ipynb: the values its "parameters" cell assigns (literals
    only), which papermill's parameters override."""
    import ast

    import nbformat
    from .. import paths

    nb = nbformat.read(paths.REPO_ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    return {node.targets[0].id: ast.literal_eval(node.value)
            for node in ast.parse(cell.source).body
            if isinstance(node, ast.Assign) and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)}


def executed_paths(name: str, out_dir: Path) -> dict:
    """Where run_notebook puts notebook ``name`` in ``out_dir``: "stored" (the executed notebook),
    "running" (papermill's copy while it runs) and "failed" (kept when a cell fails)."""
    out_dir = Path(out_dir)
    return {"stored": out_dir / f"{name}.ipynb", "running": out_dir / f".{name}.running.ipynb",
            "failed": out_dir / f"{name}.failed.ipynb"}


def run_notebook(name: str, out_dir: Path, parameters: dict, unstored=()) -> Path:
    """Execute notebooks/<name>.ipynb with papermill into ``out_dir``; the stored copy is
    portable (portable_notebook), without the parameters named in ``unstored``."""
    import papermill
    from .. import paths

    src = paths.REPO_ROOT / "notebooks" / f"{name}.ipynb"
    out_dir.mkdir(parents=True, exist_ok=True)
    where = executed_paths(name, out_dir)
    final, partial = where["stored"], where["running"]
    engine_options = {}
    manager = kernel_manager_class()
    if manager is not None:
        engine_options["kernel_manager_class"] = manager
    try:
        papermill.execute_notebook(str(src), str(partial), parameters=parameters,
                                   cwd=str(paths.REPO_ROOT / "notebooks"), progress_bar=False,
                                   **engine_options)
    except Exception:
        if partial.exists():
            failed = where["failed"]
            try:
                store_portable(partial, failed, unstored)
            except Exception:  # the notebook's own error is the one to report
                partial.replace(failed)
        raise
    return store_portable(partial, final, unstored)


def print_summary(slug: str) -> None:
    """The combined results of this run as a table, labelled: a CPU run's timings come from
    Triton's interpreter, so its floor, bandwidth and memory figures are left blank."""
    import pandas as pd
    from . import report

    doc = report.combine(slug, write=False)  # notebook 04 wrote it
    df = report.frame(doc)
    print()
    if df["cpu"].any():
        print(f"{report.CPU_NOTE}: floor, times_floor, achieved_TBps and memory are left blank.")
    else:
        print(f"{report.run_label(df)}: floor at {df['copy_TBps'].median():.2f} TB/s copy "
              "bandwidth (SPEC section 8); memory in units of B*L*D BF16 elements.")
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(report.summary_table(df).to_string(index=False, na_rep="-"))
        sp = report.speedups(df)
        if len(sp):
            print(f"\n{report.speedup_title(sp)}, forward+backward (10th-90th percentile of the "
                  "pairwise sample ratios):")
            print(sp.drop(columns="cpu").round(2).to_string(index=False))
        published = report.published_comparison(
            df, report.frame(report.published_h800_document(), report.PUBLISHED_SOURCE))
        if len(published):
            print(f"\nBeside the published H800 result ({report.PUBLISHED_SOURCE}):")
            print(published.round(3).to_string(index=False))


def default_shapes_text() -> str:
    """--shapes' default in words, from GPU_SHAPES and CPU_SHAPES."""
    n = len(PUBLISHED_SHAPES)
    if GPU_SHAPES[:n] == PUBLISHED_SHAPES:
        gpu = f"the {n} shapes of the published H800 result ({', '.join(PUBLISHED_SHAPES)})"
        if GPU_SHAPES[n:]:
            gpu += f" and {', '.join(GPU_SHAPES[n:])}"
    else:
        gpu = ", ".join(GPU_SHAPES)
    return f"on a GPU {gpu}; on a CPU {', '.join(CPU_SHAPES)}"


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m samu.experiment.pipeline",
                                     description=__doc__)
    parser.add_argument("--shapes", nargs="*", default=None,
                        help="BATCHxLENGTHxWIDTH ..., separate arguments or one whitespace-"
                             "separated argument (default, also for an empty one: "
                             f"{default_shapes_text()})")
    parser.add_argument("--report", nargs="?", const="", default=None, metavar="GPU",
                        help="run no shape: only the report (notebook 04) over the per-shape "
                             "results in data/results/GPU/ (GPU: a slug such as nvidia-h200; "
                             "empty or absent: this machine's)")
    return parser


SLUG = re.compile(r"[a-z0-9][a-z0-9-]*\Z")


def report_slug(text: str) -> tuple[str, list[str]]:
    """(the GPU whose per-shape results ``--report`` combines, those shapes' keys): ``text``, or
    this machine's slug when it is empty.  A slug names a folder of the data, so it is refused
    unless it is one (lowercase letters, digits and hyphens) with results to combine."""
    from .. import dispatch, paths

    slug = text.strip() or dispatch.gpu_slug()
    if not SLUG.match(slug):
        raise ValueError(f"--report {slug!r}: not a GPU slug (lowercase letters, digits and "
                         f"hyphens, such as nvidia-h200)")
    shapes = sorted(f.stem for f in paths.results_dir(slug).glob("*.json"))
    if not shapes:
        root = paths.DATA / "results"
        having = sorted(d.name for d in root.iterdir()
                        if d.is_dir() and any(d.glob("*.json"))) if root.is_dir() else []
        raise ValueError(f"--report {slug}: no per-shape results in "
                         f"{paths.relative(paths.results_dir(slug))}/ to combine (`make "
                         f"reproduce` writes them); GPUs with results: "
                         f"{' '.join(having) or 'none'}")
    return slug, shapes


def main_report(text: str) -> int:
    """``--report``: notebook 04 alone over the per-shape results there are."""
    from .. import paths

    export_data_dir()
    slug, shapes = report_slug(text)
    print(f"report over {len(shapes)} shapes of {slug}: {' '.join(shapes)}", flush=True)
    try:
        run_notebook("04_report", paths.runs_dir(slug), dict(gpu_slug=slug, write=True))
    except Exception as exc:
        print(f"\nreport FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print_summary(slug)
    print(f"\nwrote {paths.relative(paths.results_file(slug))}, "
          f"{paths.relative(paths.figures_dir())}/{slug}_*.png and the executed report in "
          f"{paths.relative(paths.runs_dir(slug))}/")
    return 0


def main(argv=None) -> int:
    parser = argument_parser()
    args = parser.parse_args(argv)
    if args.report is not None:
        if any(a.split() for a in args.shapes or ()):  # an empty --shapes asks for nothing
            parser.error("--report runs no shape: give --shapes or --report, not both")
        try:
            return main_report(args.report)
        except ValueError as exc:
            parser.error(str(exc))
    explicit = parse_shapes(args.shapes)  # a bad shape stops the run before any notebook
    from ..modules import NUM_HEADS
    check_heads_divide(parser, NUM_HEADS, explicit, mixers.names(),
                       "the notebooks' head count")
    # Triton 3.9 warns when TRITON_DEFAULT_FP_FUSION is unset; "1" keeps its default (fused
    # multiply-adds on), which every committed result was measured with.  The notebook kernels
    # inherit it.
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    import torch
    cuda = torch.cuda.is_available()
    shapes = explicit or parse_shapes(GPU_SHAPES if cuda else CPU_SHAPES)
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        print(f"No CUDA device: running {' '.join(s.key for s in shapes)} with Triton's "
              f"interpreter. CPU timings are no GPU result.", flush=True)
        large = [s.key for s in shapes if s.elements > CPU_LARGE_ELEMENTS]
        if large:
            print(f"{' '.join(large)}: over {CPU_LARGE_ELEMENTS} elements: the interpreter runs "
                  f"every program of every kernel in Python, so expect a long run (the CPU "
                  f"default is {' '.join(CPU_SHAPES)}).", flush=True)
    from tqdm import tqdm
    from .. import dispatch, paths

    export_data_dir()
    slug = dispatch.gpu_slug()
    steps = [(k, shape, nb) for k, shape in enumerate(shapes) for nb in PER_SHAPE]
    bar = tqdm(total=len(steps) + 1, desc="reproduce", unit="notebook")
    try:
        for k, shape, nb in steps:
            label = shape.key
            bar.set_postfix_str(f"{nb} {label}")
            run_notebook(nb, paths.runs_dir(slug) / label,
                         dict(batch=shape[0], length=shape[1], width=shape[2], shape_index=k))
            bar.update()
        bar.set_postfix_str("04_report")
        run_notebook("04_report", paths.runs_dir(slug), dict(gpu_slug=slug, write=True))
        bar.update()
    except Exception as exc:
        bar.close()
        print(f"\nreproduce FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    bar.close()
    print_summary(slug)
    print(f"\nwrote {paths.relative(paths.results_file(slug))}, "
          f"{paths.relative(paths.results_dir(slug))}/, "
          f"{paths.relative(paths.correctness_dir(slug))}/, "
          f"{paths.relative(paths.calibration_file(slug))}, "
          f"{paths.relative(paths.figures_dir())}/{slug}_*.png and the executed notebooks in "
          f"{paths.relative(paths.runs_dir(slug))}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())

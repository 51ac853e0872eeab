"""How a spawned rank of a process group (the context-parallel benchmark's, the distributed
tests') hands its results back, and how its parent tells a failed run from a finished one.

Each rank writes one file, whole or not at all, then waits for the others and leaves. On the
CPU a rank of a gloo group was seen to abort now and then ("terminate called without an active
exception"; docs/SPEC.md section 9), where in the process is not known; a C++ abort without an
exception is most often a thread left running at teardown, so the ranks leave without the
interpreter's teardown. A rank that dies after every rank wrote its file (a signal or an exit
code, not a Python exception) died after the work was done: its parent keeps the results and
says so."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

import torch


def result_path(out_dir, rank: int) -> Path:
    return Path(out_dir) / f"rank{rank}.pt"


def write_result(results, out_dir, rank: int) -> None:
    """``results`` to this rank's file, through a temporary one: a rank stopped while writing
    leaves no file."""
    path = result_path(out_dir, rank)
    partial = path.with_name(path.name + ".partial")
    torch.save(results, partial)
    os.replace(partial, path)


def finish_rank(results, out_dir, rank: int) -> NoReturn:
    """End a spawned rank: write its results, wait for every rank (none tears the group down
    while another still uses it), destroy the group and leave at once, without the
    interpreter's teardown (module docstring)."""
    write_result(results, out_dir, rank)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def load_results(out_dir, world: int) -> list:
    return [torch.load(result_path(out_dir, r)) for r in range(world)]


def died_after_writing(exc: BaseException, out_dir, world: int) -> bool:
    """Whether ``exc``, what torch.multiprocessing raised for a spawned group, is a rank's
    death by a signal or an exit code (ProcessExitedException, not a rank's Python exception)
    after all ``world`` ranks had written their results: the work is complete."""
    import torch.multiprocessing as mp
    return (isinstance(exc, mp.ProcessExitedException)
            and all(result_path(out_dir, r).is_file() for r in range(world)))


def kept_despite(exc: BaseException) -> str:
    """The warning a parent gives when it keeps the results of a group that ``exc`` ended."""
    return f"a rank died after every rank had written its results; they are kept ({exc})"

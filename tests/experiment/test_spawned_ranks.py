"""Spawned ranks hand their results back whole, and a parent keeps them only where every rank
wrote its own before one died: a real gloo group that finishes, a rank killed by SIGABRT after
the writes (what a teardown abort does), and one killed before its write."""
from __future__ import annotations

import os
import resource
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from samu.experiment import spawned_ranks


def finishing_rank(rank: int, world: int, out_dir: str):
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{Path(out_dir) / 'rendezvous'}", rank=rank,
        world_size=world, timeout=timedelta(seconds=120))
    mine = torch.full((3,), float(rank))
    every = [torch.empty(3) for _ in range(world)]
    torch.distributed.all_gather(every, mine)
    spawned_ranks.finish_rank({"rank": rank, "gathered": every}, out_dir, rank)
    raise AssertionError("finish_rank returned")  # never reached: the rank has left


def aborting_rank(rank: int, world: int, out_dir: str, abort_before_writing: int):
    """Every rank writes; the last then waits for the others' files and aborts, as a teardown
    abort would, or (``abort_before_writing``) rank 0 aborts before its write.  No core file."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    deadline = time.monotonic() + 120
    if abort_before_writing and rank == 0:
        os.abort()
    spawned_ranks.write_result({"rank": rank}, out_dir, rank)
    if rank == world - 1:
        while not all(spawned_ranks.result_path(out_dir, r).is_file() for r in range(world)):
            assert time.monotonic() < deadline, "the other ranks' files never came"
            time.sleep(0.01)
        os.abort()


def run(worker, world: int, out_dir: Path, *args):
    try:
        mp.start_processes(worker, args=(world, str(out_dir), *args), nprocs=world,
                           start_method="spawn")
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
        return exc
    return None


def test_a_group_that_finishes_hands_back_every_rank_s_results(tmp_path):
    assert run(finishing_rank, 2, tmp_path) is None  # every rank left with exit code 0
    results = spawned_ranks.load_results(tmp_path, 2)
    for rank, got in enumerate(results):
        assert got["rank"] == rank
        assert [t.tolist() for t in got["gathered"]] == [[0.0] * 3, [1.0] * 3]
    assert not list(tmp_path.glob("*.partial"))


def test_a_rank_that_dies_after_every_write_keeps_the_results_and_one_before_does_not(tmp_path):
    after, before = tmp_path / "after", tmp_path / "before"
    after.mkdir()
    before.mkdir()
    exc = run(aborting_rank, 2, after, 0)
    assert isinstance(exc, mp.ProcessExitedException) and exc.signal_name == "SIGABRT"
    assert spawned_ranks.died_after_writing(exc, after, 2)
    assert [r["rank"] for r in spawned_ranks.load_results(after, 2)] == [0, 1]
    assert "after every rank had written its results" in spawned_ranks.kept_despite(exc)
    exc = run(aborting_rank, 2, before, 1)
    assert isinstance(exc, mp.ProcessExitedException) and exc.signal_name == "SIGABRT"
    assert not spawned_ranks.died_after_writing(exc, before, 2)
    # a rank's Python exception is its work failing, never kept
    raised = mp.ProcessRaisedException("boom", 0, os.getpid())
    assert not spawned_ranks.died_after_writing(raised, after, 2)


def test_a_write_is_whole_or_absent(tmp_path, monkeypatch):
    def stopped(obj, path):
        Path(path).write_bytes(b"half")
        raise KeyboardInterrupt
    monkeypatch.setattr(torch, "save", stopped)
    with pytest.raises(KeyboardInterrupt):
        spawned_ranks.write_result({"rank": 0}, tmp_path, 0)
    assert not spawned_ranks.result_path(tmp_path, 0).exists()

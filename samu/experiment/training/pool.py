"""Several training runs at once: ``RunPool`` runs the study's runs in worker processes, several
to a GPU and one set per GPU given, or one after another in this process.

The models are small, so one run leaves most of an H200 idle while its host thread launches
kernels; runs in separate processes fill it.  Runs that share a GPU slow each other down, so the
speed a run records while others run is not its own: the study times every configuration alone
first (``measure_speed``) and reports that; with one worker each run is its own timing alone."""
from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import time

import torch

from .parameters import ParameterError
from .runs import Job, run_job

# The device a worker process trains on, set once by its initializer.
_WORKER_DEVICE: str | None = None


def _init_worker(devices, threads: int) -> None:
    global _WORKER_DEVICE
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    _WORKER_DEVICE = devices.get()
    torch.set_num_threads(threads)
    device = torch.device(_WORKER_DEVICE)
    if device.type == "cuda" and device.index is not None:  # "cuda" alone: the current one
        torch.cuda.set_device(device)


def _run_in_worker(job: Job) -> dict:
    return run_job(job, _WORKER_DEVICE)


def check_devices(device, processes, devices) -> tuple:
    """The devices a RunPool spreads over (``devices``, or ``device`` alone when None), each as
    torch names it; ParameterError for a bad device, a mix of kinds, devices of another kind
    than ``device`` (None: not known here), a CUDA device this machine lacks, or ``processes``
    not an integer >= 1."""
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ParameterError(f"processes must be an integer >= 1, got {processes!r}")
    if devices is not None and (isinstance(devices, (str, bytes))
                                or not isinstance(devices, (list, tuple)) or not devices):
        raise ParameterError(f"devices must be None or a non-empty list of devices, got "
                             f"{devices!r}")
    try:
        chosen = tuple(str(torch.device(d)) for d in (devices or [device]))
    except (RuntimeError, TypeError) as exc:
        raise ParameterError(f"devices: {exc}") from None
    if len(set(chosen)) != len(chosen):
        raise ParameterError(f"devices must not repeat a device, got {list(chosen)}")
    kinds = {torch.device(d).type for d in chosen}
    if len(kinds) > 1:
        raise ParameterError(f"devices must all be CPUs or all CUDA devices, got {list(chosen)}")
    if "cuda" in kinds:
        count = torch.cuda.device_count()
        for d in chosen:
            index = torch.device(d).index or 0
            if index >= count:
                raise ParameterError(f"devices: {d} is not on this machine ({count} CUDA "
                                     "devices)")
    if devices and device is not None and kinds != {torch.device(device).type}:
        # The study's files are labelled by ``device``: runs elsewhere would carry its name.
        raise ParameterError(f"devices {list(chosen)} are not of the study's device {device}'s "
                             "kind")
    return chosen


class RunPool:
    """Runs ``Job``s: ``processes`` worker processes on each of ``devices`` (default: just
    ``device``), or, with one process on one device, in this process one after another.
    ``map`` returns the records in the jobs' order and calls ``done(job, record)`` as each
    finishes.  Use it as a context manager, so that the workers end with it."""

    def __init__(self, device, processes: int = 1, devices=None, threads: int = 1):
        self.devices = check_devices(device, processes, devices)
        self.processes = processes
        self.workers = processes * len(self.devices)
        self.threads = threads
        self._executor = None
        # Per batch of runs (run_jobs): its runs, wall seconds, and their training time alone.
        self.phases: list[dict] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def _start(self):
        if self._executor is None:
            context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
            queue = context.Queue()
            for i in range(self.workers):
                queue.put(self.devices[i % len(self.devices)])
            self._executor = concurrent.futures.ProcessPoolExecutor(
                self.workers, mp_context=context, initializer=_init_worker,
                initargs=(queue, self.threads))
        return self._executor

    def map(self, jobs, done=None) -> tuple[list[dict], float]:
        """The records of ``jobs`` in order, and the wall seconds they took together."""
        started = time.perf_counter()
        jobs = list(jobs)
        if self.workers == 1:
            records = []
            for job in jobs:
                records.append(run_job(job, self.devices[0]))
                if done is not None:
                    done(job, records[-1])
            return records, time.perf_counter() - started
        executor = self._start()
        records = [None] * len(jobs)
        waiting = iter(enumerate(jobs))
        running: dict = {}

        def start_next() -> None:
            # One run a worker at a time, so that a failure stops every run not yet started
            # (the executor would have queued more, and a queued run cannot be cancelled).
            following = next(waiting, None)
            if following is not None:
                running[executor.submit(_run_in_worker, following[1])] = following[0]

        for _ in range(self.workers):
            start_next()
        failure = None
        try:
            while running:
                finished, _ = concurrent.futures.wait(
                    running, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in finished:
                    i = running.pop(future)
                    try:
                        records[i] = future.result()
                    except Exception as error:
                        # The runs under way finish and are recorded (``done``), so that a run
                        # going on after the stop starts from them.
                        if failure is None:
                            failure = error
                        else:
                            failure.add_note(f"another run failed too: {error!r}")
                        continue
                    if done is not None:
                        done(jobs[i], records[i])
                    if failure is None:
                        start_next()
        except BaseException:
            for future in running:
                future.cancel()
            raise
        if failure is not None:
            raise failure
        return records, time.perf_counter() - started

    def describe(self) -> dict:
        """How the runs were spread, and per phase the throughput gained against one run at a
        time: the runs' training time alone (their steps at the speed timed alone) over the
        phase's wall time, which also holds model set-up, evaluation and process start."""
        return {"processes_per_device": self.processes, "devices": list(self.devices),
                "workers": self.workers,
                "phases": [{**p, "throughput_gain": p["solo_train_s"] / p["wall_s"]
                            if p["wall_s"] > 0 else None} for p in self.phases]}

"""The host threads behind the `emu` driver's engines.

Each DMA engine has a worker thread and the compute engine a pool of them, so operations
the model overlaps really overlap on the host. They run operations handed to them one at
a time (`Job`s: paced mode, calibration, profiling, armed faults, and large dispatches
of a submission placed operation by operation); a paced job also waits for its modelled
start and end in wall time. Fast mode's replayed submissions run instead as one native
stream, their dispatches' workgroups shared with the native threads of `helpers`.
"""

from __future__ import annotations

import functools
import os
import queue as queue_module
import threading
import time
from collections.abc import Callable
from typing import Any

from ...errors import Error, InternalError
from ..device import run_capturing
from ..execution import Barrier, Dispatch, Operation, run_transfer
from ..stream import StreamHelpers
from .emu_calibration import DispatchSample
from .emu_engines import TraceEvent


class Batch:
    """The operations of one submission in flight on the engines."""

    def __init__(self) -> None:
        self.outstanding = 0
        self.error: Error | None = None
        self.cond = threading.Condition()

    def add(self) -> None:
        with self.cond:
            self.outstanding += 1

    def finish(self, error: Error | None) -> None:
        with self.cond:
            if error is not None and self.error is None:
                self.error = error
            self.outstanding -= 1
            if not self.outstanding:
                self.cond.notify_all()

    def join(self) -> Error | None:
        with self.cond:
            while self.outstanding:
                self.cond.wait()
            return self.error


class Job:
    """One operation handed to an engine's workers."""

    __slots__ = ("op", "batch", "queue", "not_before", "not_until", "left", "lock",
                 "error", "host_start", "event", "calibrate", "seq", "submission_id")

    def __init__(self, op: Operation, batch: Batch, queue: int, not_before: int,
                 not_until: int, workers: int, event: TraceEvent, calibrate: bool,
                 seq: int, submission_id: int) -> None:
        self.op = op
        self.batch = batch
        self.queue = queue
        self.not_before = not_before
        self.not_until = not_until
        self.left = workers
        self.lock = threading.Lock()
        self.error: Error | None = None
        self.host_start = 0
        self.event = event
        self.calibrate = calibrate
        self.seq = seq
        self.submission_id = submission_id


Finish = Callable[[Job, int, int, "Error | None"], None]


def sleep_until(deadline_ns: int) -> None:
    while True:
        left = deadline_ns - time.monotonic_ns()
        if left <= 0:
            return
        time.sleep(left / 1e9)


def next_job(jobs: queue_module.SimpleQueue) -> Job | None:
    """A worker's next job once its modelled start has come (paced), or None: stop."""
    job = jobs.get()
    if job is not None and job.not_before:
        sleep_until(job.not_before)
    return job


def dispatch_error(prepared: Any, rc: int) -> Error:
    try:
        prepared.raise_for_status(rc)
    except Error as exc:
        return exc
    return InternalError(f"dispatch failed with status {rc}")


def run_each_inline(ops: list[Operation]) -> None:
    """Runs typed operations in order on this thread; raises the first error."""
    for op in ops:
        if type(op) is Dispatch:
            rc = op.prepared.run(0, 0)
            if rc:
                raise dispatch_error(op.prepared, rc)
        elif type(op) is not Barrier:
            run_transfer(op)


class Workers:
    """`dma_engines` DMA threads and `compute_workers` compute threads (default: one
    per compute unit up to the host's cores). A job that ends calls `finish(job,
    host_start, host_end, error)`; `lost()` is the device's loss error, if lost (then
    jobs fail without running); `sample` receives calibration measurements."""

    def __init__(self, dma_engines: int, compute_units: int, compute_workers: int | None,
                 finish: Finish, lost: Callable[[], Error | None],
                 sample: Callable[[DispatchSample], None]) -> None:
        self.finish = finish
        self.lost = lost
        self.sample = sample
        self.threads: list[threading.Thread] = []
        self.dma = [queue_module.SimpleQueue() for _ in range(dma_engines)]
        for i, jobs in enumerate(self.dma):
            self.spawn(self.dma_worker, f"tinyhal-emu-dma{i}", jobs)
        count = compute_workers or max(1, min(compute_units, os.cpu_count() or 1))
        self.compute = [queue_module.SimpleQueue() for _ in range(count)]
        for i, jobs in enumerate(self.compute):
            self.spawn(self.compute_worker, f"tinyhal-emu-cu{i}", jobs, i)
        self.helpers: StreamHelpers | None = None
        self.helpers_lock = threading.Lock()

    def spawn(self, target: Callable[..., None], name: str, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

    @property
    def concurrency(self) -> int:
        """Host threads a dispatch's workgroups spread over (processor ids 0..n-1)."""
        return len(self.compute)

    def stream_helpers(self) -> StreamHelpers | None:
        """Native threads that join a replayed stream's dispatches (made on first use;
        None with one compute worker: the leading thread is the only participant)."""
        if self.helpers is None and len(self.compute) > 1:
            with self.helpers_lock:
                if self.helpers is None:
                    self.helpers = StreamHelpers(len(self.compute) - 1)
        return self.helpers

    def stop(self, timeout: float | None, others: list[threading.Thread]) -> None:
        """Ends the workers, then joins them and `others` (whose ends the caller
        asked for) within `timeout`."""
        for q in self.dma + self.compute:
            q.put(None)
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in others + self.threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if self.helpers is not None:
            self.helpers.stop()

    def post_transfer(self, engine: int, job: Job) -> None:
        self.dma[engine].put(job)

    def post_dispatch(self, job: Job) -> None:
        for target in self.compute[:job.left]:
            target.put(job)

    def run_inline(self, job: Job) -> None:
        """Runs a job on this thread as its engine would (fast mode, small operations)."""
        op = job.op
        host_start = time.monotonic_ns()
        error = self.lost()
        if error is None:
            if type(op) is Dispatch:
                rc = op.prepared.run(0, 0)
                if rc:
                    error = dispatch_error(op.prepared, rc)
            else:
                error = run_capturing(functools.partial(run_transfer, op))
        self.finish(job, host_start, time.monotonic_ns(), error or self.lost())

    def dma_worker(self, jobs: queue_module.SimpleQueue) -> None:
        while True:
            job = next_job(jobs)
            if job is None:
                return
            host_start = time.monotonic_ns()
            error = self.lost() or run_capturing(functools.partial(run_transfer, job.op))
            if job.not_until:
                sleep_until(job.not_until)
            self.finish(job, host_start, time.monotonic_ns(), error)
            job = None

    def compute_worker(self, jobs: queue_module.SimpleQueue, index: int) -> None:
        while True:
            job = next_job(jobs)
            if job is None:
                return
            now = time.monotonic_ns()
            with job.lock:
                if not job.host_start:
                    job.host_start = now
            prepared = job.op.prepared
            tile = 0 if job.calibrate else max(1, prepared.total // (4 * len(self.compute)))
            cpu_start = time.thread_time_ns()
            rc = 0 if self.lost() is not None else prepared.run(index, tile)
            cpu_ns = time.thread_time_ns() - cpu_start
            with job.lock:
                if rc and job.error is None:
                    job.error = dispatch_error(prepared, rc)
                job.left -= 1
                last = not job.left
            if last:
                end = time.monotonic_ns()
                if job.calibrate and job.error is None:
                    self.sample(DispatchSample(prepared.export.name, prepared.total, cpu_ns,
                                               end - job.host_start))
                if job.not_until:
                    sleep_until(job.not_until)
                    end = time.monotonic_ns()
                self.finish(job, job.host_start, end, job.error or self.lost())
            job = None


__all__ = ["Batch", "Job", "Workers", "dispatch_error", "run_each_inline", "sleep_until"]

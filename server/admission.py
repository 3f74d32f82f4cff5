"""Admission control: bounded concurrency, a bounded FIFO queue, deadlines.

One `Admission` guards one model version. At most `max_concurrency` invocations run at
once; up to `max_queue` more wait in FIFO order (a `trio.CapacityLimiter` is fair);
anything beyond is refused at once with `Overloaded` (the app answers 429 with a
Retry-After estimated from recent latencies) rather than piling up memory and latency.

Deadlines. A request whose deadline passes while it is queued leaves the queue and gets
`DeadlineExceeded` (504): nothing ran. A request whose deadline passes while its
invocation is running also gets its 504 at the deadline, but the invocation itself is
*not* interrupted: it runs to completion in the server's background nursery, keeps its
concurrency slot until then, and its result is dropped. Cutting a VM invocation at a
`hal.fence.await` would abandon the program between its queue operations — the
`queue_dealloca` of its transient buffers would never be issued and the ringbuffer would
leak — so "cancel" means: stop waiting for it, and do not count the slot free before the
device is. The same path covers a client that disconnects mid-request.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

__all__ = ["Admission", "AdmissionStatistics", "DeadlineExceeded", "Overloaded",
           "RunningInvocation"]


class Overloaded(Exception):
    """The model's queue is full; `retry_after` is a whole number of seconds to wait."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class DeadlineExceeded(Exception):
    """The request's deadline passed (while queued, or while its invocation ran)."""

    def __init__(self, message: str, started: bool) -> None:
        super().__init__(message)
        self.started = started


@dataclass(frozen=True)
class AdmissionStatistics:
    running: int
    queued: int
    max_concurrency: int
    max_queue: int
    detached: int  # invocations still running whose requests already got their 504


@dataclass(frozen=True)
class RunningInvocation:
    """One invocation still running: what it is (the caller's label) and since when."""

    label: str
    started: float  # trio clock
    detached: bool


class _Job:
    __slots__ = ("result", "error", "done", "detached", "label", "started")

    def __init__(self, label: str, started: float) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = trio.Event()
        self.detached = False
        self.label = label
        self.started = started


class Admission:
    """Runs invocations under a concurrency limit with a bounded queue and deadlines."""

    def __init__(self, max_concurrency: int, max_queue: int) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, not {max_concurrency}")
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, not {max_queue}")
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self._limiter = trio.CapacityLimiter(max_concurrency)
        self.queued = 0
        self.running = 0
        self.detached = 0
        self._latency = 0.0  # exponentially weighted mean of invocation seconds
        self._idle = trio.Event()
        self._idle.set()
        self._jobs: set[_Job] = set()

    def running_invocations(self) -> list[RunningInvocation]:
        """The invocations running now, oldest first (for the drain's abandon log)."""
        jobs = sorted(self._jobs, key=lambda j: j.started)
        return [RunningInvocation(j.label, j.started, j.detached) for j in jobs]

    def statistics(self) -> AdmissionStatistics:
        return AdmissionStatistics(self.running, self.queued, self.max_concurrency,
                                   self.max_queue, self.detached)

    def retry_after(self) -> int:
        """Seconds until a slot is likely free: the queue ahead drained at the recent rate."""
        ahead = self.queued + self.running
        estimate = self._latency * ahead / self.max_concurrency
        return max(1, math.ceil(estimate))

    async def wait_idle(self) -> None:
        """Returns once nothing runs (including detached invocations)."""
        while self.running:
            await self._idle.wait()

    async def acquire(self) -> object:
        """Waits for a free slot (no queue bound, no deadline); the token to release it.
        For callers that queue requests themselves (the dynamic batcher)."""
        token = object()
        await self._limiter.acquire_on_behalf_of(token)
        return token

    def try_acquire(self) -> object | None:
        """A slot's token if one is free now, else None."""
        token = object()
        try:
            self._limiter.acquire_on_behalf_of_nowait(token)
        except trio.WouldBlock:
            return None
        return token

    def release(self, token: object) -> None:
        self._limiter.release_on_behalf_of(token)

    async def execute(self, fn: Callable[[], Awaitable[Any]], token: object, label: str) -> Any:
        """Runs `await fn()` in the calling task under the slot `token` (from `acquire`),
        counted as running and listed by `running_invocations()`; releases the slot."""
        job = _Job(label, trio.current_time())
        self._jobs.add(job)
        self.running += 1
        self._idle = trio.Event()
        try:
            return await fn()
        finally:
            self._finish(job, token)

    def _finish(self, job: _Job, token: object) -> None:
        elapsed = trio.current_time() - job.started
        self._latency = elapsed if not self._latency else 0.8 * self._latency + 0.2 * elapsed
        self.running -= 1
        self._jobs.discard(job)
        if job.detached:
            self.detached -= 1
        self._limiter.release_on_behalf_of(token)
        job.done.set()
        if not self.running:
            self._idle.set()

    async def run(
        self,
        fn: Callable[[], Awaitable[Any]],
        deadline: float,
        background: trio.Nursery,
        on_start: Callable[[float], None] | None = None,
        label: str = "",
    ) -> Any:
        """Runs `await fn()` once admitted, in `background`; returns its result.

        Raises `Overloaded` when the queue is full, `DeadlineExceeded` when `deadline`
        (trio clock; `math.inf` for none) passes first. `on_start(queued_seconds)` is
        called when the invocation starts; `label` names it in `running_invocations()`.
        """
        if self._limiter.available_tokens == 0 and self.queued >= self.max_queue:
            raise Overloaded(
                f"{self.running} requests running and {self.queued} queued "
                f"(max_concurrency {self.max_concurrency}, max_queue {self.max_queue})",
                self.retry_after(),
            )
        token = object()
        queued_at = trio.current_time()
        self.queued += 1
        acquired = False
        try:
            with trio.move_on_at(deadline):
                await self._limiter.acquire_on_behalf_of(token)
                acquired = True
        finally:
            self.queued -= 1
        if not acquired:
            raise DeadlineExceeded(
                f"deadline exceeded after {trio.current_time() - queued_at:.3f} s in the "
                f"queue (nothing ran)", started=False)
        if trio.current_time() >= deadline:
            self._limiter.release_on_behalf_of(token)
            raise DeadlineExceeded("deadline exceeded before the invocation started",
                                   started=False)
        started = trio.current_time()
        if on_start is not None:
            on_start(started - queued_at)
        job = _Job(label, started)
        self._jobs.add(job)
        self.running += 1
        self._idle = trio.Event()
        background.start_soon(self._execute, fn, token, job, started)
        try:
            with trio.move_on_at(deadline):
                await job.done.wait()
        finally:
            if not job.done.is_set():
                job.detached = True
                self.detached += 1
        if not job.done.is_set():
            raise DeadlineExceeded(
                f"deadline exceeded after {trio.current_time() - queued_at:.3f} s; the "
                f"invocation started and will run to completion in the background "
                f"(its result is discarded)", started=True)
        if job.error is not None:
            raise job.error
        return job.result

    async def _execute(self, fn, token: object, job: _Job, started: float) -> None:
        try:
            job.result = await fn()
        except Exception as exc:  # noqa: BLE001 - handed to the waiting request
            job.error = exc
        finally:
            self._finish(job, token)

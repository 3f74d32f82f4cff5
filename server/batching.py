"""Dynamic batching with Triton's semantics, for models whose inputs share a batch dim.

A model version whose config has `max_batch_size > 0` and a `dynamic_batching` object

    "dynamic_batching": {"max_queue_delay_microseconds": 500, "preferred_batch_size": [8, 16]}

gets a `DynamicBatcher`. Requests wait in its FIFO queue; whenever an execution slot of the
model's `Admission` is free, the batcher takes requests from the head of the queue (those
whose inputs agree on every dim but the first) until the rows reach `max_batch_size`,
concatenates each input along dim 0, runs one invocation and splits every output back
along dim 0 (zero-copy slices). If fewer rows than the largest preferred size (or
`max_batch_size` when none is preferred) are queued, the batcher waits up to
`max_queue_delay_microseconds` counted from the arrival of the oldest queued request for
more; 0 (the default) never waits. Under load, requests gather while every slot is busy,
so batches form with no added delay.

Isolation: if a batch of several requests fails, each of its requests runs again alone,
so only the request whose data the program rejects gets the error. Deadlines: a request
whose deadline passes while queued leaves the queue with 504 (nothing ran); one whose
deadline passes while its batch runs gets 504 at once and the batch runs on (the other
requests still get their results). The queue holds at most the model's `max_queue`
requests; more are refused with `Overloaded` (429).

Every input and output must have a dynamic first dim (checked when the model loads).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import trio

from .admission import Admission, DeadlineExceeded, Overloaded

__all__ = ["BatchingConfig", "DynamicBatcher"]

Results = list[tuple[str, str, np.ndarray]]
Invoke = Callable[[list[Any]], Awaitable[Results]]


class BatchingConfig:
    """The `dynamic_batching` settings of one model version."""

    def __init__(self, max_batch_size: int, max_queue_delay_us: int = 0,
                 preferred_batch_sizes: tuple[int, ...] = ()) -> None:
        self.max_batch_size = max_batch_size
        self.max_queue_delay_us = max_queue_delay_us
        self.preferred_batch_sizes = tuple(sorted(preferred_batch_sizes))

    @property
    def target_rows(self) -> int:
        """Rows at which a batch is taken without waiting out the queue delay."""
        return self.preferred_batch_sizes[-1] if self.preferred_batch_sizes else \
            self.max_batch_size

    def describe(self) -> dict:
        return {"max_queue_delay_microseconds": self.max_queue_delay_us,
                "preferred_batch_size": list(self.preferred_batch_sizes)}


class _Pending:
    __slots__ = ("args", "rows", "key", "deadline", "arrived", "label", "done", "result",
                 "error", "taken", "abandoned", "queued_seconds", "infer_seconds")

    def __init__(self, args: list[Any], deadline: float, label: str) -> None:
        self.args = args
        self.rows = int(args[0].shape[0])
        self.key = tuple(a.shape[1:] for a in args)
        self.deadline = deadline
        self.arrived = trio.current_time()
        self.label = label
        self.done = trio.Event()
        self.result: Results | None = None
        self.error: BaseException | None = None
        self.taken = False
        self.abandoned = False
        self.queued_seconds = 0.0
        self.infer_seconds = 0.0


class DynamicBatcher:
    """Forms batches from queued requests and runs them under `admission`'s slots.

    `executed(requests, rows, seconds)` is called after every successful execution.
    """

    def __init__(self, config: BatchingConfig, admission: Admission, invoke: Invoke,
                 executed: Callable[[int, int, float], None]) -> None:
        self.config = config
        self.admission = admission
        self.invoke = invoke
        self.executed = executed
        self._queue: deque[_Pending] = deque()
        self._wakeup = trio.Event()
        self._started = False

    @property
    def queued(self) -> int:
        return len(self._queue)

    async def infer(self, args: list[Any], deadline: float, background: trio.Nursery,
                    label: str) -> tuple[Results, float, float]:
        """Queues one request; (its results, seconds queued, seconds its batch's
        invocation took) once its batch ran (see the module doc)."""
        if len(self._queue) >= max(1, self.admission.max_queue):
            raise Overloaded(f"{len(self._queue)} requests queued for batching "
                             f"(max_queue {self.admission.max_queue})",
                             self.admission.retry_after())
        if not self._started:
            self._started = True
            background.start_soon(self._schedule, background)
        pending = _Pending(args, deadline, label)
        token = None
        if not self._queue and not self.config.max_queue_delay_us:
            token = self.admission.try_acquire()
        if token is not None:
            # nothing to batch with and a slot free: a batch of one, without a hop through
            # the scheduler task
            pending.taken = True
            background.start_soon(self._run, [pending], token)
        else:
            self._queue.append(pending)
            self.admission.queued += 1
            self._wakeup.set()
        with trio.move_on_at(deadline):
            await pending.done.wait()
        if pending.done.is_set():
            if pending.error is not None:
                raise pending.error
            return pending.result, pending.queued_seconds, pending.infer_seconds
        if not pending.taken:
            self._queue.remove(pending)
            self.admission.queued -= 1
            raise DeadlineExceeded(
                f"deadline exceeded after {trio.current_time() - pending.arrived:.3f} s in "
                f"the queue (nothing ran)", started=False)
        pending.abandoned = True
        self.admission.detached += 1
        raise DeadlineExceeded(
            f"deadline exceeded after {trio.current_time() - pending.arrived:.3f} s; its "
            f"batch started and runs to completion in the background (its result is "
            f"discarded)", started=True)

    async def _schedule(self, background: trio.Nursery) -> None:
        config = self.config
        while True:
            while not self._queue:
                self._wakeup = trio.Event()
                await self._wakeup.wait()
            token = await self.admission.acquire()
            try:
                delay = config.max_queue_delay_us / 1e6
                if delay > 0:
                    until = self._queue[0].arrived + delay if self._queue else 0.0
                    while self._queue and self._ready_rows() < config.target_rows \
                            and trio.current_time() < until:
                        self._wakeup = trio.Event()
                        with trio.move_on_at(until):
                            await self._wakeup.wait()
                batch = self._take()
            except BaseException:
                self.admission.release(token)
                raise
            if not batch:
                self.admission.release(token)
                continue
            background.start_soon(self._run, batch, token)

    def _ready_rows(self) -> int:
        head = self._queue[0]
        return sum(p.rows for p in self._queue if p.key == head.key)

    def _take(self) -> list[_Pending]:
        """Requests from the head of the queue that fit one batch (FIFO among those whose
        inputs agree with the head's on every dim but the first)."""
        now = trio.current_time()
        limit = self.config.max_batch_size
        batch: list[_Pending] = []
        rows = 0
        key = None
        for pending in list(self._queue):
            if key is not None and pending.key != key:
                continue
            if rows + pending.rows > limit:
                break
            key = pending.key
            batch.append(pending)
            rows += pending.rows
        if batch and self.config.preferred_batch_sizes and rows > 0:
            # cut back to the largest preferred size the batch reaches, if it is not full
            fitting = [s for s in self.config.preferred_batch_sizes if s <= rows]
            if fitting and rows < limit:
                want, kept, n = fitting[-1], [], 0
                for pending in batch:
                    if n + pending.rows > want:
                        break
                    kept.append(pending)
                    n += pending.rows
                if kept:
                    batch = kept
        for pending in batch:
            self._queue.remove(pending)
            self.admission.queued -= 1
            pending.taken = True
            pending.queued_seconds = now - pending.arrived
        return batch

    async def _run(self, batch: list[_Pending], token: object) -> None:
        label = (batch[0].label if len(batch) == 1 else
                 f"{batch[0].label.split(' request ')[0]} batch of {len(batch)} requests "
                 f"({', '.join(p.label.split(' request ')[-1] for p in batch)})")

        async def run_all() -> None:
            if len(batch) == 1:
                await self._run_one(batch[0])
                return
            try:
                await self._run_batch(batch)
            except Exception:  # noqa: BLE001 - isolate: each request alone
                for pending in batch:
                    await self._run_one(pending)

        try:
            await self.admission.execute(run_all, token, label)
        finally:
            for pending in batch:
                if pending.abandoned:
                    self.admission.detached -= 1
                pending.done.set()

    async def _run_batch(self, batch: list[_Pending]) -> None:
        args = [np.concatenate([p.args[i] for p in batch]) for i in range(len(batch[0].args))]
        t0 = trio.current_time()
        results = await self.invoke(args)
        seconds = trio.current_time() - t0
        rows = sum(p.rows for p in batch)
        for name, _, array in results:
            if array.ndim == 0 or array.shape[0] != rows:
                raise ValueError(f"output '{name}' has shape {list(array.shape)}: not "
                                 f"batched along dim 0 ({rows} rows)")
        start = 0
        for pending in batch:
            stop = start + pending.rows
            pending.result = [(name, datatype, array[start:stop])
                              for name, datatype, array in results]
            pending.infer_seconds = seconds
            start = stop
        self.executed(len(batch), rows, seconds)

    async def _run_one(self, pending: _Pending) -> None:
        t0 = trio.current_time()
        try:
            pending.result = await self.invoke(pending.args)
        except Exception as exc:  # noqa: BLE001 - handed to the waiting request
            pending.error = exc
            return
        pending.infer_seconds = trio.current_time() - t0
        self.executed(1, pending.rows, pending.infer_seconds)


def parse_batching_config(value: Any, max_batch_size: int) -> BatchingConfig | None:
    """`dynamic_batching` of a model config (None when absent); ValueError naming the
    problem."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"config 'dynamic_batching' must be an object, not {value!r}")
    if max_batch_size <= 0:
        raise ValueError("config 'dynamic_batching' needs 'max_batch_size' > 0")
    unknown = set(value) - {"max_queue_delay_microseconds", "preferred_batch_size"}
    if unknown:
        raise ValueError(f"config 'dynamic_batching': unknown keys {sorted(unknown)}")
    delay = value.get("max_queue_delay_microseconds", 0)
    if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0 or \
            not math.isfinite(delay):
        raise ValueError(f"config 'dynamic_batching.max_queue_delay_microseconds' must be "
                         f"an integer >= 0, not {delay!r}")
    preferred = value.get("preferred_batch_size", [])
    if not isinstance(preferred, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) and 0 < s <= max_batch_size
            for s in preferred):
        raise ValueError(f"config 'dynamic_batching.preferred_batch_size' must list "
                         f"integers in [1, max_batch_size={max_batch_size}], not "
                         f"{preferred!r}")
    return BatchingConfig(max_batch_size, delay, tuple(preferred))

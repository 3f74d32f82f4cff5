"""Dynamic batching with Triton's semantics: which queued requests form the next batch,
and how one batch runs on an instance thread.

A model version whose config has `max_batch_size > 0` and a `dynamic_batching` object

    "dynamic_batching": {"max_queue_delay_microseconds": 500, "preferred_batch_size": [8, 16]}

batches its queued requests. The queue and the instances belong to the model's
`Admission` (admission.py); this module holds the policy it applies:

- `take_batch`: whenever an instance is free, the next batch is every request from the
  head of the queue whose inputs agree with the head's on every dim but the first, up to
  `max_batch_size` rows; when the rows exceed a preferred size but not `max_batch_size`,
  the batch is cut back to the largest preferred size it reaches. Requests whose deadline
  already passed are skipped (they leave the queue with 504; nothing ran).
- `BatchingConfig.should_wait`: with a queue delay, a batch smaller than the largest
  preferred size (or `max_batch_size`) waits until the delay, counted from the arrival of
  the oldest queued request, has passed; an arrival that brings the rows up to it ends
  the wait at once. A delay of 0 never waits: under load requests gather while the
  instances are busy and the next batch takes all of them.
- `run_batch` (on the instance thread): inputs concatenated along dim 0, one invocation,
  every output split back along dim 0 (zero-copy slices). If a batch of several requests
  fails, each of its requests runs again alone, so only the request whose data the
  program rejects gets the error: one bad request never fails its batch-mates.

Every input and output of a batched model must have a dynamic first dim (checked when the
model loads).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

__all__ = ["BatchingConfig", "Outcome", "run_batch", "take_batch"]

Results = list[tuple[str, str, np.ndarray]]
# what one request of an execution got: (results, None) or (None, the error)
Outcome = tuple[Results | None, BaseException | None]


class BatchingConfig:
    """The `dynamic_batching` settings of one model version."""

    def __init__(self, max_batch_size: int, max_queue_delay_us: int = 0,
                 preferred_batch_sizes: tuple[int, ...] = ()) -> None:
        self.max_batch_size = max_batch_size
        self.max_queue_delay_us = max_queue_delay_us
        self.delay = max_queue_delay_us / 1e6
        self.preferred_batch_sizes = tuple(sorted(preferred_batch_sizes))

    @property
    def target_rows(self) -> int:
        """Rows at which a batch is taken without waiting out the queue delay."""
        return self.preferred_batch_sizes[-1] if self.preferred_batch_sizes else \
            self.max_batch_size

    def preferred_size(self, rows: int) -> int | None:
        """The preferred size a batch of `rows` (fewer than `max_batch_size`) is cut back
        to: the largest one it reaches; None when it is not cut."""
        if self.preferred_batch_sizes and rows < self.max_batch_size:
            fitting = [s for s in self.preferred_batch_sizes if s <= rows]
            if fitting:
                return fitting[-1]
        return None

    def describe(self) -> dict:
        return {"max_queue_delay_microseconds": self.max_queue_delay_us,
                "preferred_batch_size": list(self.preferred_batch_sizes)}


def ready_rows(queue: Iterable[Any]) -> int:
    """Rows queued that could join the head's batch (same dims but the first)."""
    rows = 0
    key = None
    for request in queue:
        if key is None:
            key = request.key
        if request.key == key:
            rows += request.rows
    return rows


def take_batch(queue: list[Any], config: BatchingConfig | None, now: float) -> list[Any]:
    """Removes and returns the next batch from `queue` (requests with `rows`, `key` and
    `deadline`): one request without batching, else see the module doc. Requests whose
    deadline passed stay queued: their own tasks take them out with 504."""
    if config is None:
        for i, request in enumerate(queue):
            if request.deadline > now:
                del queue[i]
                return [request]
        return []
    limit = config.max_batch_size
    batch: list[Any] = []
    picked: list[int] = []
    rows = 0
    key = None
    for i, request in enumerate(queue):
        if request.deadline <= now or (key is not None and request.key != key):
            continue
        if rows + request.rows > limit:
            break
        key = request.key
        batch.append(request)
        picked.append(i)
        rows += request.rows
    want = config.preferred_size(rows)
    if want:
        n = keep = 0
        for request in batch:
            if n + request.rows > want:
                break
            n += request.rows
            keep += 1
        if keep:
            batch, picked = batch[:keep], picked[:keep]
    for i in reversed(picked):
        del queue[i]
    return batch


def run_batch(invoke: Callable[[list[Any]], Results], batch_args: list[list[Any]],
              batch_rows: list[int]) -> tuple[list[Outcome], list[tuple[int, int, float]]]:
    """Runs one execution of `batch_args` (each request's argument list, `batch_rows`
    its rows) with the blocking `invoke`; returns each request's outcome and the
    executions it took as (requests, rows, seconds). Called on an instance thread,
    never on the event loop."""
    if len(batch_args) == 1:
        return _run_alone(invoke, batch_args[0], batch_rows[0])
    start = time.perf_counter()
    try:
        args = [np.concatenate([a[i] for a in batch_args]) for i in range(len(batch_args[0]))]
        results = invoke(args)
        rows = int(args[0].shape[0])
        for name, _, array in results:
            if array.ndim == 0 or array.shape[0] != rows:
                raise ValueError(f"output '{name}' has shape {list(array.shape)}: not "
                                 f"batched along dim 0 ({rows} rows)")
    except Exception:  # noqa: BLE001 - isolate: each request alone
        outcomes: list[Outcome] = []
        executions: list[tuple[int, int, float]] = []
        for args, rows in zip(batch_args, batch_rows):
            outcome, execution = _run_alone(invoke, args, rows)
            outcomes += outcome
            executions += execution
        return outcomes, executions
    seconds = time.perf_counter() - start
    outcomes = []
    begin = 0
    for request_rows in batch_rows:
        end = begin + request_rows
        outcomes.append(([(name, datatype, array[begin:end])
                          for name, datatype, array in results], None))
        begin = end
    return outcomes, [(len(batch_args), rows, seconds)]


def _run_alone(invoke: Callable[[list[Any]], Results], args: list[Any], rows: int
               ) -> tuple[list[Outcome], list[tuple[int, int, float]]]:
    start = time.perf_counter()
    try:
        results = invoke(args)
    except Exception as exc:  # noqa: BLE001 - handed to the waiting request
        return [(None, exc)], []
    return [(results, None)], [(1, rows, time.perf_counter() - start)]

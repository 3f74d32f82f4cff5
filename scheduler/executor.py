"""Worker pool.

An `Executor` owns a fixed set of worker threads and a FIFO ready queue. Work is a
`CallTask`: `fn()` run once on a worker, its exception (if any) the task's error. Whoever
waits for a task registers `on_complete(callback)`, called on the completing thread with
the error (None on success) — a queue entry's retirement, for the `task` driver. Nothing
polls: a submitted task is queued at once and an idle worker is woken for it.

Ordering between tasks is not the pool's business: the HAL orders work with timeline
semaphores and submits a task only once its waits are met.

The module is generic: it knows nothing of buffers, semaphores or devices.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from ..errors import (
    AbortedError,
    DeadlineExceededError,
    Error,
    FailedPreconditionError,
    InvalidArgumentError,
    as_error,
)

__all__ = [
    "Executor",
    "ExecutorStatistics",
    "CallTask",
    "default_worker_count",
    "current_worker_index",
]



def _log_exception(message: str, *args: object) -> None:
    """Logs the exception being handled; `logging` (2.5 ms to import) loads only then."""
    import logging

    logging.getLogger("tinyhal.scheduler").exception(message, *args)

# Task states.
PENDING = "pending"  # made, not yet submitted
READY = "ready"  # queued for a worker
RUNNING = "running"  # a worker is executing it (or a shutdown is failing it)
DONE = "done"  # completed, successfully or not

_tls = threading.local()


def default_worker_count() -> int:
    """One worker per core this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _allowed_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return []


def current_worker_index() -> int | None:
    """The index of the executor worker running the caller, or None off the pool."""
    return getattr(_tls, "worker_index", None)


class ExecutorStatistics(NamedTuple):
    """A snapshot of an executor's state (like trio's `statistics()` objects)."""

    worker_count: int
    idle_workers: int
    queued: int  # tasks ready and waiting for a worker
    running: int  # entries being executed by workers
    live_tasks: int  # submitted and not yet completed
    completed_tasks: int
    closed: bool


class CallTask:
    """Runs `fn()` once on a worker of `executor`; an exception it raises becomes the
    task's error."""

    __slots__ = ("executor", "name", "fn", "_callbacks", "_error", "_state", "__weakref__")

    def __init__(self, executor: Executor, fn: Callable[[], Any], *, name: str = "") -> None:
        if not isinstance(executor, Executor):
            raise InvalidArgumentError(f"task {name!r}: executor must be an Executor")
        self.executor = executor
        self.name = name or getattr(fn, "__name__", "call")
        self.fn: Callable[[], Any] | None = fn
        self._callbacks: list[Callable[[Error | None], Any]] = []
        self._error: Error | None = None
        self._state = PENDING

    def __repr__(self) -> str:
        return f"<CallTask {self.name!r} {self._state}>"

    def on_complete(self, callback: Callable[[Error | None], Any]) -> None:
        """Calls `callback(error)` once the task completes (at once if it already has),
        on the completing thread, in registration order; exceptions it raises are logged
        and dropped."""
        with self.executor._lock:
            if self._state is not DONE:
                self._callbacks.append(callback)
                return
            error = self._error
        _call_callback(self, callback, error)

    @property
    def state(self) -> str:
        return self._state

    @property
    def done(self) -> bool:
        return self._state is DONE

    @property
    def error(self) -> Error | None:
        """The error the task completed with (None while running or on success)."""
        return self._error if self._state is DONE else None

    def wait(self, timeout: float | None = None) -> Error | None:
        """Blocks until the task completes; returns its error (None on success).

        Raises DEADLINE_EXCEEDED after `timeout` seconds. Meant for tests and host code;
        never call it from a worker.
        """
        if self._state is DONE:
            return self._error
        event = threading.Event()
        self.on_complete(lambda _e: event.set())
        if not event.wait(timeout):
            raise DeadlineExceededError(f"task {self.name!r} not complete after {timeout} s")
        return self._error

    def _run(self) -> None:
        fn, self.fn = self.fn, None  # runs once; drop what it captured as soon as it ran
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - becomes the task's status
            self._error = as_error(exc)


def _call_callback(task: CallTask, callback: Callable, error: Error | None) -> None:
    try:
        callback(error)
    except Exception:  # a broken callback must not take a worker down
        _log_exception("completion callback of %r raised", task)


class Executor:
    """A pool of worker threads running submitted tasks in order of submission.

    `workers` defaults to one per core; `pin` (default: when workers <= CPUs) binds worker
    i to the i-th CPU the process may use. Threads are daemons, started at construction and
    stopped by `shutdown()` (also via `with Executor() as ex:`).
    """

    def __init__(self, workers: int | None = None, *, name: str = "tinyhal-worker",
                 pin: bool | None = None) -> None:
        if workers is None:
            workers = default_worker_count()
        workers = int(workers)
        if workers < 1:
            raise InvalidArgumentError(f"executor {name!r}: workers must be >= 1, got {workers}")
        self.name = name
        self._lock = threading.Lock()
        self._work_cond = threading.Condition(self._lock)
        self._quiet_cond = threading.Condition(self._lock)
        self._queue: collections.deque[CallTask] = collections.deque()
        self._idle = 0
        self._running = 0
        self._completed = 0
        self._closed = False
        self._stopping = False
        # Pin worker i to the i-th allowed CPU (like IREE's topology groups) so the kernel
        # does not stack a freshly woken worker onto the core of the worker that woke it.
        # Default: pin when there are no more workers than CPUs.
        cpus = _allowed_cpus()
        if pin is None:
            pin = len(cpus) > 1 and workers <= len(cpus)
        self._cpus = cpus if pin else []
        self._threads = [
            threading.Thread(target=self._worker_main, args=(i,), name=f"{name}-{i}", daemon=True)
            for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    @property
    def worker_count(self) -> int:
        return len(self._threads)

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def statistics(self) -> ExecutorStatistics:
        with self._lock:
            return ExecutorStatistics(
                worker_count=len(self._threads),
                idle_workers=self._idle,
                queued=len(self._queue),
                running=self._running,
                live_tasks=len(self._queue) + self._running,
                completed_tasks=self._completed,
                closed=self._closed,
            )

    # -- submission -------------------------------------------------------------------

    def submit(self, *tasks: CallTask) -> None:
        """Queues each task for a worker.

        Raises ABORTED after `shutdown()` (the tasks are then completed with that error,
        so their callbacks still run).
        """
        refused = []
        with self._lock:
            for task in tasks:
                if task.executor is not self:
                    raise InvalidArgumentError(f"task {task.name!r} belongs to another executor")
                if task._state is not PENDING:
                    raise FailedPreconditionError(f"task {task.name!r} was already submitted")
                if self._closed:
                    task._error = AbortedError(
                        f"task {task.name!r} submitted after executor {self.name!r} shut down")
                    task._state = RUNNING  # claimed by the refusal
                    refused.append(task)
                    continue
                task._state = READY
                self._queue.append(task)
                if self._idle:
                    self._work_cond.notify()
        for task in refused:
            self._finish(task)
        if refused:
            raise AbortedError(f"executor {self.name!r} is shut down")

    def call(self, fn: Callable[[], Any], *, name: str = "") -> CallTask:
        """Convenience: a `CallTask` running `fn`, submitted at once."""
        task = CallTask(self, fn, name=name)
        self.submit(task)
        return task

    def _finish(self, task: CallTask) -> None:
        with self._lock:
            task._state = DONE
            self._completed += 1
            callbacks, task._callbacks = task._callbacks, []
            error = task._error
        task.fn = None
        for cb in callbacks:
            _call_callback(task, cb, error)

    # -- workers ----------------------------------------------------------------------

    def _worker_main(self, index: int) -> None:
        _tls.worker_index = index
        if self._cpus:
            try:
                os.sched_setaffinity(0, {self._cpus[index % len(self._cpus)]})
            except OSError:  # pragma: no cover - restricted environments
                pass
        lock = self._lock
        cond = self._work_cond
        queue = self._queue
        while True:
            with lock:
                while not queue:
                    if self._stopping:
                        return
                    self._idle += 1
                    cond.wait()
                    self._idle -= 1
                task = queue.popleft()
                task._state = RUNNING
                self._running += 1
            try:
                task._run()
                self._finish(task)
            except BaseException:  # pragma: no cover - _run swallows task errors
                _log_exception("worker %d: task %r escaped its error handling", index, task)
            finally:
                task = None  # an idle worker must not keep the last task's captures alive
                with lock:
                    self._running -= 1
                    if not queue and not self._running:
                        self._quiet_cond.notify_all()

    # -- shutdown ---------------------------------------------------------------------

    def stop_nowait(self) -> None:
        """Closes the pool and lets the workers exit once the queue is empty, without
        waiting and without failing blocked tasks (for finalizers; prefer `shutdown`).
        Safe to call from any thread, including a worker, and from a finalizer that a
        garbage collection runs inside this executor's own locked section: the flags are
        set without the lock, and if the lock is busy the wake-up goes to a short-lived
        thread instead of waiting for it here."""
        self._closed = True
        self._stopping = True
        if self._lock.acquire(blocking=False):
            try:
                self._work_cond.notify_all()
            finally:
                self._lock.release()
        else:
            threading.Thread(target=self._wake_all, name=f"{self.name}-stop",
                             daemon=True).start()

    def _wake_all(self) -> None:
        with self._lock:
            self._work_cond.notify_all()

    def shutdown(
        self, *, cancel: bool = False, timeout: float | None = 30.0, error: BaseException | None = None
    ) -> None:
        """Stops the pool; nothing is left hanging.

        Without `cancel`, queued and running work finishes first; with it (or once
        `timeout` has passed), tasks still queued are completed with `error` (ABORTED by
        default): their callbacks run. Workers exit and are joined. Calling it again does
        nothing. Never call it from a worker thread.
        """
        if current_worker_index() is not None and threading.current_thread() in self._threads:
            raise FailedPreconditionError(f"executor {self.name!r}: shutdown from its own worker")
        err = as_error(error) if error is not None else AbortedError(
            f"executor {self.name!r} shut down before the task ran"
        )
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._closed = True
            if not cancel:
                while self._queue or self._running:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    self._quiet_cond.wait(left)
            victims = list(self._queue)
            self._queue.clear()
            for t in victims:
                t._error = t._error or err
                t._state = RUNNING  # claimed by the shutdown
        for t in victims:
            self._finish(t)
        with self._lock:
            self._stopping = True
            self._work_cond.notify_all()
        for t in self._threads:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            t.join(left)

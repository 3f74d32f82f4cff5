"""Worker pool and task graph.

An `Executor` owns a fixed set of worker threads and a ready queue. Work is expressed as
`Task` nodes. Every task carries a *suspend count*: it starts at one (the construction
hold, dropped by `Executor.submit`), each `depends_on` edge and each `add_wait` gate adds
one, and whoever drops the count to zero (a completing upstream task, a semaphore callback
on a signalling thread, `submit` itself) makes the task ready. Nothing polls: a task
becomes runnable exactly when its last gate is released.

Errors are first-wins and flow downstream: a gate released with an error, or an upstream
task that failed, marks the task failed; a failed task never runs its body but still
completes, so its completion callbacks see the error and its dependents fail in turn.

Kinds of task:

- `CallTask(fn)` runs `fn()` once on a worker (or on the releasing thread if `inline`).
- `NopTask()` runs nothing: a join point, completed on the thread that readies it.

Unlike `concurrent.futures`, nothing here blocks a worker on another task: joins are
graph edges, so a pool of N workers never deadlocks waiting on itself.

The module is generic: it knows nothing of buffers, semaphores or devices.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import (
    AbortedError,
    CancelledError,
    DeadlineExceededError,
    Error,
    FailedPreconditionError,
    InvalidArgumentError,
    as_error,
)

__all__ = [
    "Executor",
    "ExecutorStatistics",
    "Task",
    "CallTask",
    "NopTask",
    "default_worker_count",
    "current_worker_index",
]



def _log_exception(message: str, *args: object) -> None:
    """Logs the exception being handled; `logging` (2.5 ms to import) loads only then."""
    import logging

    logging.getLogger("tinyhal.scheduler").exception(message, *args)

# Task states.
PENDING = "pending"  # suspend count > 0
READY = "ready"  # queued for a worker
RUNNING = "running"  # a worker is executing it
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


@dataclasses.dataclass(frozen=True)
class ExecutorStatistics:
    """A snapshot of an executor's state (like trio's `statistics()` objects)."""

    worker_count: int
    idle_workers: int
    queued: int  # tasks ready and waiting for a worker
    running: int  # entries being executed by workers
    live_tasks: int  # submitted and not yet completed
    completed_tasks: int
    closed: bool


class Task:
    """A node of the task graph; see the module docstring for its life cycle."""

    __slots__ = (
        "executor",
        "name",
        "_pending",
        "_dependents",
        "_callbacks",
        "_error",
        "_state",
        "_submitted",
        "__weakref__",
    )

    #: Completed on the thread that makes it ready instead of going through the queue.
    inline: bool = False

    def __init__(self, executor: Executor, name: str = "") -> None:
        if not isinstance(executor, Executor):
            raise InvalidArgumentError(f"task {name!r}: executor must be an Executor")
        self.executor = executor
        self.name = name
        self._pending = 1  # the construction hold
        self._dependents: list[Task] = []
        self._callbacks: list[Callable[[Error | None], Any]] = []
        self._error: Error | None = None
        self._state = PENDING
        self._submitted = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} {self._state}>"

    # -- graph building ---------------------------------------------------------------

    def depends_on(self, *tasks: Task) -> Task:
        """Gates this task on the completion of every task in `tasks`; returns self."""
        for t in tasks:
            t.then(self)
        return self

    def then(self, other: Task) -> Task:
        """Makes `other` depend on this task; returns `other` (for chaining)."""
        ex = self.executor
        if other.executor is not ex:
            raise InvalidArgumentError(
                f"task {other.name!r} belongs to another executor than {self.name!r}"
            )
        with ex._lock:
            if other._state is not PENDING:
                raise FailedPreconditionError(
                    f"task {other.name!r} is {other._state}; dependencies must be added "
                    "before it is released"
                )
            if self._state is DONE:
                if self._error is not None and other._error is None:
                    other._error = self._error
                return other
            other._pending += 1
            self._dependents.append(other)
        return other

    def add_wait(self) -> Callable[..., None]:
        """Adds one external gate and returns its one-shot `release(error=None)`.

        `release` may be called from any thread, e.g. from a semaphore's callback on the
        thread that signals it; releasing with an error fails the task. Calling it a second
        time does nothing.
        """
        ex = self.executor
        with ex._lock:
            if self._state is not PENDING:
                raise FailedPreconditionError(
                    f"task {self.name!r} is {self._state}; gates must be added before it is released"
                )
            self._pending += 1
        fired = []

        def release(error: BaseException | None = None) -> None:
            if fired:
                return
            fired.append(True)
            ex._release(self, None if error is None else as_error(error))

        return release

    def on_complete(self, callback: Callable[[Error | None], Any]) -> None:
        """Calls `callback(error)` once the task completes (at once if it already has).

        Callbacks run on the completing thread, in registration order, before the task's
        dependents are released; exceptions they raise are logged and dropped.
        """
        with self.executor._lock:
            if self._state is not DONE:
                self._callbacks.append(callback)
                return
            error = self._error
        _call_callback(self, callback, error)

    def cancel(self, error: BaseException | None = None) -> bool:
        """Completes a task that has not started with `error` (CANCELLED by default).

        Returns False if the task already runs or has completed. Later releases of its
        gates are ignored; its dependents fail with the same error.
        """
        err = as_error(error) if error is not None else CancelledError(f"task {self.name!r} cancelled")
        ex = self.executor
        with ex._lock:
            if self._state is RUNNING or self._state is DONE:
                return False
            if self._state is READY:
                _remove_from_queue(ex._queue, self)
            self._error = err
            self._state = RUNNING  # claimed by this cancellation
        _run_ready(self, _finish_only=True)
        return True

    # -- inspection -------------------------------------------------------------------

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

    # -- execution (subclasses) -------------------------------------------------------

    def _run(self, worker_index: int | None) -> bool:
        """Executes the body; returns True if the caller must complete the task."""
        return True


def _call_callback(task: Task, callback: Callable, error: Error | None) -> None:
    try:
        callback(error)
    except Exception:  # a broken callback must not take a worker down
        _log_exception("completion callback of %r raised", task)


def _remove_from_queue(queue: collections.deque, task: Task) -> None:
    try:
        while True:
            queue.remove(task)
    except ValueError:
        pass


class NopTask(Task):
    """Runs nothing: a join/barrier node completed by whoever releases its last gate."""

    __slots__ = ()
    inline = True


class CallTask(Task):
    """Runs `fn()` once; an exception it raises becomes the task's error."""

    __slots__ = ("fn", "inline")

    def __init__(
        self, executor: Executor, fn: Callable[[], Any], *, name: str = "", inline: bool = False
    ) -> None:
        super().__init__(executor, name or getattr(fn, "__name__", "call"))
        self.fn = fn
        self.inline = inline

    def _run(self, worker_index: int | None) -> bool:
        fn, self.fn = self.fn, None  # runs once; drop what it captured as soon as it ran
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - becomes the task's status
            self._error = as_error(exc)
        return True


def _run_ready(task: Task, *, _finish_only: bool = False) -> None:
    """Runs the ready-processing loop for `task` on this thread (trampolined).

    Completing a task releases its dependents, which may complete inline and release
    theirs; a per-thread work list keeps that iterative so long chains cannot overflow
    the stack.
    """
    work = getattr(_tls, "work", None)
    item = (task, _finish_only)
    if work is not None:
        work.append(item)
        return
    work = _tls.work = collections.deque((item,))
    try:
        while work:
            t, finish_only = work.popleft()
            t.executor._process(t, finish_only)
    finally:
        _tls.work = None


class Executor:
    """A pool of worker threads running a task graph.

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
        self._queue: collections.deque[Task] = collections.deque()
        self._live: set[Task] = set()
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

    @property
    def closed(self) -> bool:
        return self._closed

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
                live_tasks=len(self._live),
                completed_tasks=self._completed,
                closed=self._closed,
            )

    # -- submission -------------------------------------------------------------------

    def submit(self, *tasks: Task) -> None:
        """Drops the construction hold of each task: it runs once its gates are released.

        Raises ABORTED after `shutdown()` (the tasks are then completed with that error,
        so their callbacks still run).
        """
        for task in tasks:
            if task.executor is not self:
                raise InvalidArgumentError(f"task {task.name!r} belongs to another executor")
            with self._lock:
                if task._submitted:
                    raise FailedPreconditionError(f"task {task.name!r} was already submitted")
                task._submitted = True
                closed = self._closed
                if not closed and task._state is not DONE:
                    self._live.add(task)
            self._release(task, None)
        if closed:
            raise AbortedError(f"executor {self.name!r} is shut down")

    def call(self, fn: Callable[[], Any], *, after: Iterable[Task] = (), name: str = "") -> CallTask:
        """Convenience: a `CallTask` running `fn` after `after`, submitted at once."""
        task = CallTask(self, fn, name=name)
        task.depends_on(*after)
        self.submit(task)
        return task

    def _release(self, task: Task, error: Error | None) -> None:
        with self._lock:
            if task._state is not PENDING:
                return  # cancelled/aborted meanwhile: late gates are ignored
            if error is not None and task._error is None:
                task._error = error
            task._pending -= 1
            if task._pending:
                return
            task._state = READY
        _run_ready(task)

    def _process(self, task: Task, finish_only: bool) -> None:
        """Called from the trampoline when `task` became ready (or must just finish)."""
        if not finish_only:
            if task._error is None and not task.inline:
                with self._lock:
                    if task._state is not READY:
                        return
                    if self._closed:
                        task._error = AbortedError(
                            f"task {task.name!r} released after executor {self.name!r} shut down"
                        )
                    else:
                        self._queue.append(task)
                        if self._idle:
                            self._work_cond.notify()
                        return
            elif task._error is None:  # inline body on the releasing thread
                with self._lock:
                    if task._state is not READY:
                        return
                    task._state = RUNNING
                if not task._run(None):
                    return
        self._finish(task)

    def _finish(self, task: Task) -> None:
        with self._lock:
            if task._state is DONE:
                return
            task._state = DONE
            self._live.discard(task)
            self._completed += 1
            callbacks, task._callbacks = task._callbacks, []
            dependents, task._dependents = task._dependents, []
            error = task._error
        for cb in callbacks:
            _call_callback(task, cb, error)
        for dep in dependents:
            self._release(dep, error)

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
                if task._state is READY:
                    task._state = RUNNING
                elif task._state is not RUNNING:
                    continue  # completed/cancelled while queued
                self._running += 1
            try:
                complete = task._run(index)
                if complete:
                    _run_ready(task, _finish_only=True)
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

        Without `cancel`, queued and running work finishes first. Then every task still
        waiting on a gate (and, with `cancel`, every task not yet started) is completed
        with `error` (ABORTED by default): its callbacks run and its dependents fail.
        Workers exit and are joined. Calling it again does nothing. Never call it from a
        worker thread.
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
            victims = [t for t in self._live if t._state is PENDING or t._state is READY]
            for t in victims:
                t._error = t._error or err
                t._state = RUNNING  # claimed by the shutdown
            # Drop the queued entries of victims.
            doomed = set(victims)
            keep = [t for t in self._queue if t._state is RUNNING and t not in doomed]
            self._queue.clear()
            self._queue.extend(keep)
        for t in victims:
            _run_ready(t, _finish_only=True)
        with self._lock:
            self._stopping = True
            self._work_cond.notify_all()
        for t in self._threads:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            t.join(left)

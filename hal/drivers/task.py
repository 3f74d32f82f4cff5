"""The `task` driver: submissions run on native helper threads and an executor's workers.

The device hands over each queue operation once its wait semaphores are reached (a
semaphore timepoint callback, so nothing polls). A command-buffer submission runs as one
native `Stream` (see `hal/stream.py`), led through its operations in C by the thread that
readies it (usually the submitting one, which would otherwise only wait), while the
device's `StreamHelpers` (plain C threads: no Python, no GIL) join each dispatch of
several workgroups and claim tiles of them, like compute units on a GPU (and 64 KiB tiles
of large fills and copies, as IREE's task executor splits them); a stream of
one-workgroup dispatches wakes no helper. A ready submission is bound and led in one C
call (`hal.stream.lead`), as on `sync`. So a small model's submission costs no thread hand-off
at all: no worker is woken through Python to start it and none to report its end. A
leader hands the rest of a stream that outlasts `inline_us` to an executor worker and
returns, so a submitting thread is held up that long (plus one tile) at most; a thread
that runs an event loop (trio, asyncio) hands the whole stream to a worker, so its other
tasks go on at once. A handed-off stream is also offered at its signal points
(`Semaphore.offer`): a thread that blocks waiting for it before the worker has started (a
VM invocation awaiting its result, typically) leads it on itself, rather than sleeping
while a worker wakes up and moves the stream to another core. When the stream completes,
the signal semaphores advance, or fail with its error (or its waits' error), which
reaches every dependent submission the same way.

Independent submissions run out of order: the only ordering is the one semaphores give.
Host work (file and host-memory transfers) runs on the executor's workers. `close()`
(see `Device.close`) fails what still waits with ABORTED, lets running work finish, then
stops the executor and the helpers.

Options: `workers` (default one per core: the helpers are one fewer, the leader being
the last), `transient_capacity` (ringbuffer bytes), `inline_us` (how long a readying
thread leads a submission before handing it to a worker, default 2000; 0: never),
`helper_spin_us` (how long an idle helper stays awake for the next submission before it
sleeps).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from ...errors import AbortedError, Error, InvalidArgumentError
from ...scheduler import CallTask, Executor, on_event_loop
from ..device import Device
from ..execution import Submission
from ..queue import Capabilities, Completion, Driver, run_device_work
from ..semaphore import SemaphorePoint
from ..stream import Stream, StreamHelpers, lead
from . import DriverInfo

DEFAULT_INLINE_US = 2000
DEFAULT_HELPER_SPIN_US = 0


class TaskDriver(Driver):
    name = "task"
    identifier = "local-task"
    capabilities: Capabilities  # concurrency: the executor's workers
    create_allocator = Driver.create_allocator
    attach = Driver.attach

    def __init__(self, workers: int | None = None, inline_us: int = DEFAULT_INLINE_US,
                 helper_spin_us: int = DEFAULT_HELPER_SPIN_US) -> None:
        for name, value in (("inline_us", inline_us), ("helper_spin_us", helper_spin_us)):
            if type(value) is not int or value < 0:
                raise InvalidArgumentError(f"{name} must be an int >= 0, not {value!r}")
        self.inline_us = inline_us
        # Unpinned: its workers only lead streams on (the helpers keep off their CPU
        # themselves) and run host work, and on a loaded machine a pinned leader could
        # not move off a busy core.
        self.executor = Executor(workers, name="tinyhal-task", pin=False)
        self.helpers = StreamHelpers(self.executor.worker_count - 1, helper_spin_us)
        self.capabilities = Capabilities(concurrency=self.executor.worker_count)
        # A driver dropped without close() must not leave its threads behind (at
        # interpreter exit `close()` runs instead, after running work drained).
        weakref.finalize(self, _stop_nowait, self.executor, self.helpers).atexit = False

    def execute(self, payload: Submission, done: Completion, submission_id: int,
                wait: Sequence[SemaphorePoint], signal: Sequence[SemaphorePoint],
                queue: int) -> None:
        helpers = self.helpers  # they join only operations of several tiles
        if self.inline_us and not on_event_loop():
            try:
                stream = lead(payload, helpers, self.inline_us)
            except Error as exc:
                done(exc)
                return
            if stream is None:
                done(None)
                return
        else:
            stream = Stream.start(payload, 1 + helpers.count)

        try:
            handoff = _Handoff(stream, helpers, done)
        except BaseException:  # interrupted (KeyboardInterrupt): end the stream first
            _end_stream(stream, helpers)
            raise
        for sem, value in signal:  # a handed-off stream is offered to its waiters
            sem.offer(value, handoff.lead)
        task = CallTask(self.executor, handoff.lead, name="submit")
        task.on_complete(handoff.end_unrun)
        try:
            self.executor.submit(task)
        except Error:
            pass  # completed (with ABORTED) already

    fill = update = copy = execute

    def host_call(self, payload: Callable[[], None], done: Completion, submission_id: int,
                  wait: Sequence[SemaphorePoint], signal: Sequence[SemaphorePoint],
                  queue: int) -> None:
        task = CallTask(self.executor, payload, name="queue-op")
        task.on_complete(done)
        self.executor.submit(task)

    alloca = dealloca = barrier = run_device_work
    queue_for_affinity = Driver.queue_for_affinity
    check_alloca = read_direct = write_direct = None

    def stop(self, timeout: float | None) -> None:
        self.executor.shutdown(timeout=timeout)
        self.helpers.stop()


class TaskDevice(Device):
    """A device run by the `task` driver; `executor` and `helpers` are its threads."""

    def __init__(self, workers: int | None = None, *, inline_us: int = DEFAULT_INLINE_US,
                 helper_spin_us: int = DEFAULT_HELPER_SPIN_US, **options: Any) -> None:
        driver = TaskDriver(workers, inline_us, helper_spin_us)
        self.executor = driver.executor
        self.helpers = driver.helpers
        self.inline_us = inline_us
        super().__init__(driver, **options)

    def __repr__(self) -> str:
        return f"<Device {self.identifier} workers={self.executor.worker_count}>"

    def statistics(self) -> Any:
        """The executor's statistics snapshot (queued, running, live tasks, ...)."""
        return self.executor.statistics()


class _Handoff:
    """A stream its first leader paused: an executor worker leads it to the end, or a
    thread waiting for one of its signal points does if it gets there first (it would
    only sleep meanwhile, and a worker takes a thread wake-up to start). Whoever claims it
    first takes the stream out, leads it and completes it; a later `lead` does nothing.
    So the worker's task, or an offer, that outlives the claim holds no stream: its
    native program goes back to the recording's pool as soon as the stream has run."""

    __slots__ = ("stream", "helpers", "done", "claim")

    def __init__(self, stream: Stream, helpers: StreamHelpers | None, done: Completion) -> None:
        self.stream: Stream | None = stream
        self.helpers = helpers
        self.done: Completion | None = done
        self.claim = threading.Lock()

    def _take(self) -> tuple[Stream, StreamHelpers | None, Completion] | None:
        """What the claimer runs, once; None for everyone after the first."""
        if not self.claim.acquire(blocking=False):
            return None
        taken = self.stream, self.helpers, self.done
        self.stream = self.helpers = self.done = None
        return taken  # type: ignore[return-value]

    def lead(self) -> None:
        taken = self._take()
        if taken is None:
            return
        stream, helpers, done = taken
        try:
            stream.run(helpers)
        except Error as exc:
            done(exc)
            return
        except BaseException as exc:  # interrupted on a waiting thread: still complete it
            _end_stream(stream, helpers)
            done(AbortedError(f"the thread leading this submission was interrupted "
                              f"({type(exc).__name__})"))
            raise
        done(None)

    def end_unrun(self, error: Error | None) -> None:
        """The worker's task ended: if it never ran (shut down), end the stream here."""
        if error is None:
            return
        taken = self._take()
        if taken is None:
            return
        stream, helpers, done = taken
        _end_stream(stream, helpers)
        done(error)


def _end_stream(stream: Stream, helpers: StreamHelpers | None) -> None:
    """Runs what is left of a stream with its remaining operations skipped, so its
    helpers and program are free again (a paused stream must be led to the end)."""
    if stream.done:
        return
    stream.abort()
    try:
        stream.run(helpers)
    except Error:
        pass  # the stream's own outcome is not the error that ends it


def _stop_nowait(executor: Executor, helpers: StreamHelpers) -> None:
    executor.stop_nowait()
    helpers.stop()


DRIVER = DriverInfo("task", TaskDevice)

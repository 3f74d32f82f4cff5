"""The `task` driver: submissions run on a `tinyhal.scheduler.Executor`'s workers.

Each queue operation is a task gated by its wait semaphores (a gate released by a
semaphore timepoint callback, so nothing polls). A command-buffer submission runs as one
`Stream` (see `hal/stream.py`): the first worker to pick it up leads through the
operations in C, the others join each dispatch and claim tiles of its workgroups, like
compute units on a GPU. When it completes, the signal semaphores advance, or fail with its
error (or its waits' error), which reaches every dependent submission the same way.

Independent submissions run out of order: the only ordering is the one semaphores give.
Work with nothing to spread over workers (single-workgroup dispatches, small transfers,
barriers, deallocas) runs inline on the thread that readies it, usually the submitting
thread, which avoids waking a worker (tens of microseconds) for nothing. `close()` shuts
the executor down: work already running finishes, and every operation still waiting fails
its signal semaphores with ABORTED, so nothing hangs.

Options: `workers` (default one per core), `transient_capacity` (ringbuffer bytes),
`inline_bytes` (largest transfer-only submission run inline, default 64 KiB).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from ...errors import Error, FailedPreconditionError, InvalidArgumentError
from ...scheduler import CallTask, CooperativeTask, Executor, Task
from ..device import Device
from ..execution import Submission
from ..semaphore import SemaphorePoint, when_all_reached
from ..stream import Stream

DEFAULT_INLINE_BYTES = 64 << 10


class TaskDevice(Device):
    driver_name = "task"
    identifier = "local-task"

    def __init__(self, workers: int | None = None, *, inline_bytes: int = DEFAULT_INLINE_BYTES,
                 **options: Any) -> None:
        super().__init__(**options)
        if not isinstance(inline_bytes, int) or inline_bytes < 0:
            raise InvalidArgumentError(f"inline_bytes must be an int >= 0, not {inline_bytes!r}")
        self.inline_bytes = inline_bytes
        self.executor = Executor(workers, name="tinyhal-task")
        # A device dropped without close() must not leave its worker threads behind.
        weakref.finalize(self, self.executor.stop_nowait)

    def __repr__(self) -> str:
        return f"<Device {self.identifier} workers={self.executor.worker_count}>"

    def close(self) -> None:
        """Stops the workers; queued operations finish or fail with ABORTED."""
        if self._closed:
            return
        super().close()
        self.executor.shutdown(timeout=60.0)

    @property
    def concurrency(self) -> int:
        return self.executor.worker_count

    def statistics(self) -> Any:
        """The executor's statistics snapshot (queued, running, live tasks, ...)."""
        return self.executor.statistics()

    # -- queue hooks ------------------------------------------------------------------

    def _gate(self, entry: Task, wait: list[SemaphorePoint]) -> None:
        if wait:
            when_all_reached(wait, entry.add_wait())

    def _finish_with(self, last: Task, signal: list[SemaphorePoint], keep: Any = None) -> None:
        def complete(error: Error | None) -> None:
            self._complete(signal, error)
            del keep_alive[:]

        keep_alive = [keep]  # command buffers stay alive until the work is done
        last.on_complete(complete)

    def _check_open(self) -> None:
        if self._closed:
            raise FailedPreconditionError(f"{self!r} is closed")

    def _enqueue(self, wait: list[SemaphorePoint], signal: list[SemaphorePoint],
                 work: Callable[[], None], keep: Any = None, cheap: bool = False) -> None:
        self._check_open()
        # Cheap operations (barriers, deallocas) complete on the readying thread.
        task = CallTask(self.executor, work, name="queue-op", inline=cheap)
        self._gate(task, wait)
        self._finish_with(task, signal, keep)
        self.executor.submit(task)

    def _enqueue_async(self, wait: list[SemaphorePoint], signal: list[SemaphorePoint],
                       start: Callable[[Callable[[Error | None], None]], None]) -> None:
        # The start (e.g. a ringbuffer reservation) is cheap: run it inline on the thread
        # that releases the gate; its completion arrives through `done`.
        self._check_open()
        done_fired = []

        def done(error: Error | None) -> None:
            if not done_fired:
                done_fired.append(True)
                self._complete(signal, error)

        def run() -> None:
            start(done)

        task = CallTask(self.executor, run, name="queue-async-op", inline=True)
        self._gate(task, wait)
        # Gate failure, shutdown or a failing start complete the operation here; a
        # successful start completes it through `done`.
        task.on_complete(lambda error: done(error) if error is not None else None)
        self.executor.submit(task)

    def _enqueue_commands(self, wait: list[SemaphorePoint], signal: list[SemaphorePoint],
                          ops: Submission, keep: Any) -> None:
        self._check_open()
        ex = self.executor
        if ops.single_workgroup and ops.transfer_bytes() <= self.inline_bytes:
            # Tiny: nothing to spread over workers, so no worker is woken for it; it
            # runs on whichever thread readies it (usually the submitting one).
            task: Task = CallTask(ex, lambda: Stream(ops).run(), name="submit-inline",
                                  inline=True)
        else:
            participants = ex.worker_count
            lock = threading.Lock()
            packed: list[Stream] = []

            def participate(worker_index: int | None) -> None:
                with lock:
                    if not packed:
                        packed.append(Stream(ops, participants))
                packed[0].run(worker_index or 0)

            task = CooperativeTask(ex, participate, max_concurrency=participants,
                                   name="submit")
        self._gate(task, wait)
        self._finish_with(task, signal, keep)
        ex.submit(task)

"""The `task` driver: submissions run on a `tinyhal.scheduler.Executor`'s workers.

The device hands over each queue operation once its wait semaphores are reached (a
semaphore timepoint callback, so nothing polls). A command-buffer submission runs as one
`Stream` (see `hal/stream.py`): the first worker to pick it up leads through the
operations in C, the others join each dispatch and claim tiles of its workgroups, like
compute units on a GPU. When it completes, the signal semaphores advance, or fail with its
error (or its waits' error), which reaches every dependent submission the same way.

Independent submissions run out of order: the only ordering is the one semaphores give.
Work with nothing to spread over workers (single-workgroup dispatches, small transfers,
barriers, deallocas) runs inline on the thread that readies it, usually the submitting
thread, which avoids waking a worker (tens of microseconds) for nothing. `close()` (see
`Device.close`) fails what still waits with ABORTED, lets running work finish, then shuts
the executor down.

Options: `workers` (default one per core), `transient_capacity` (ringbuffer bytes),
`inline_bytes` (largest transfer-only submission run inline, default 64 KiB).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from ...errors import InvalidArgumentError
from ...scheduler import CallTask, CooperativeTask, Executor
from ..device import Completion, Device, run_capturing
from ..execution import Submission
from ..profile import run_profiled
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
        # A device dropped without close() must not leave its worker threads behind (at
        # interpreter exit `close()` runs instead, after running work drained).
        weakref.finalize(self, self.executor.stop_nowait).atexit = False

    def __repr__(self) -> str:
        return f"<Device {self.identifier} workers={self.executor.worker_count}>"

    @property
    def concurrency(self) -> int:
        return self.executor.worker_count

    def statistics(self) -> Any:
        """The executor's statistics snapshot (queued, running, live tasks, ...)."""
        return self.executor.statistics()

    # -- driver contract --------------------------------------------------------------

    profiles_submissions = True

    def _execute(self, ops: Submission, done: Completion, submission_id: int = 0) -> None:
        ex = self.executor
        profile = self.profile
        if profile is not None and profile.records_host_execution:
            def profiled() -> None:
                run_profiled(ops, profile, threading.current_thread().name,
                             submission_id=submission_id)

            task = CallTask(ex, profiled, name="submit-profiled")
            task.on_complete(done)
            ex.submit(task)
            return
        if ops.single_workgroup and ops.transfer_bytes() <= self.inline_bytes:
            # Tiny: nothing to spread over workers, so no worker is woken for it; it
            # runs on whichever thread readies it (usually the submitting one).
            done(run_capturing(Stream(ops).run))
            return
        participants = ex.worker_count
        lock = threading.Lock()
        packed: list[Stream] = []

        def participate(worker_index: int | None) -> None:
            with lock:
                if not packed:
                    packed.append(Stream(ops, participants))
            packed[0].run(worker_index or 0)

        task = CooperativeTask(ex, participate, max_concurrency=participants, name="submit")
        task.on_complete(done)
        ex.submit(task)

    def _call(self, work: Callable[[], None], done: Completion) -> None:
        task = CallTask(self.executor, work, name="queue-op")
        task.on_complete(done)
        self.executor.submit(task)

    def _stop(self, timeout: float | None) -> None:
        self.executor.shutdown(timeout=timeout)

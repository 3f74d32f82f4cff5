"""Model instances: the threads that run a model version's invocations off the event loop.

Triton's `instance_group` count: a model version runs on N instances, each its own loaded
module with one thread that runs one execution at a time. The event loop hands an
instance a list of jobs (`InstanceThread.submit`) and goes on serving; the thread does all
the host work of each execution (VM code, marshalling of inputs and outputs, batch concatenation and
splitting) and posts each outcome back with `TrioToken.run_sync_soon` as soon as it has it, which
calls the job's completion on the loop: the request tasks waiting for it are woken directly, with no
task in between.

A thread carries its instance's name in the system too (`top -H`, `ps -L`, profilers,
`/proc`), cut to the 15 bytes Linux keeps; otherwise it would show the name of the
model-loading worker that started it.

A thread ends after `stop()` once its current job is done. Threads are daemons: a process
that abandons running invocations (drain timeout, second signal) exits without joining
them, as the drain contract says.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

import trio

from .cpus import pin_current_thread

log = logging.getLogger("tinyhal.server")

__all__ = ["InstanceThread"]

_STOP = object()


def _name_system_thread(name: str) -> None:
    """Names the calling thread for the system (Linux; nothing elsewhere)."""
    text = name.encode("utf-8", "backslashreplace")[:15].decode("utf-8", "ignore")
    try:
        with open("/proc/thread-self/comm", "w") as f:
            f.write(text)
    except OSError:
        pass


class InstanceThread:
    """One thread that runs jobs in order; each job's result goes back to trio."""

    def __init__(self, name: str, token: trio.lowlevel.TrioToken,
                 cpu: int | None = None) -> None:
        self.name = name
        self._token = token
        self._cpu = cpu  # the CPU it runs on (the event loop's, see cpus.py), or any
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, jobs: list[tuple[Callable[[], Any], Callable[[Any], None]]]) -> None:
        """Runs each `work()` of `jobs` on the thread in order, each followed by
        `done(result)` on the trio loop (posted as soon as that `work` returned). `work`
        returns its failures as values; an exception it raises is handed to `done`."""
        self._jobs.put(jobs)

    def stop(self) -> None:
        """The thread ends after the jobs already submitted."""
        self._jobs.put(_STOP)

    def _loop(self) -> None:
        _name_system_thread(self.name)
        pin_current_thread(self._cpu)
        while True:
            jobs = self._jobs.get()
            if jobs is _STOP:
                return
            for work, done in jobs:
                try:
                    result = work()
                except BaseException as exc:  # noqa: BLE001 - a bug of ours; handed on
                    log.exception("instance %s: job failed", self.name)
                    result = exc
                try:
                    self._token.run_sync_soon(done, result)
                except trio.RunFinishedError:
                    return
            # nothing of the last requests (their bodies, arrays, answers) outlives them
            # while the thread waits for the next jobs
            jobs = work = done = result = None

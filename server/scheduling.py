"""What every scheduler of a model version shares: the `Scheduler` protocol the model
version and the server's drain and unload use, the outcomes a request can have, the
count of admitted work an unload waits for, the end-of-pass dispatch, and the
queue-delay timer.

A model version holds one scheduler (Triton's `Scheduler`: `Enqueue`,
`InflightInferenceCount`, `Stop`): the dynamic batcher (`admission.Admission`) or the
sequence batcher (`sequences.SequenceBatcher`), which is built from the dynamic
batcher's pieces rather than copies of them: from here the in-flight count and the
queue-delay timer with its lead correction; from admission.py the pending request (its
own one-waiter completion) and its wait; from batching.py the batching policy.

Every scheduler keeps the same promises to the drain and the unload:

- every request it admitted is answered: with its result, or with `Unavailable` (503)
  or `DeadlineExceeded` (504), and each one answered so by `abandon` is logged;
- `in_flight` counts admitted requests until their execution finished (detached ones
  included), and `wait_idle` returns once it is zero: nothing runs on the instances, so
  their modules may close;
- `close` admits nothing new and does not wait; what can never run (a sequence waiting
  for a slot no one will free) is answered at once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from .batching import Results

log = logging.getLogger("tinyhal.server")

__all__ = ["DeadlineExceeded", "DispatchAfterPass", "InFlight", "Overloaded",
           "QueueTimer", "RunningInvocation", "Scheduler", "Unavailable", "after_pass",
           "nothing"]


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


class Unavailable(Exception):
    """The model version is unloading: it admits nothing new."""


@dataclass(frozen=True)
class RunningInvocation:
    """One execution still running: what it is (the caller's label) and since when."""

    label: str
    started: float  # trio clock
    detached: bool  # every request of it already got its 504


class Scheduler(Protocol):
    """What a model version's scheduler offers the model version, the drain and the
    unload (Triton's `Scheduler`; see the module doc for the promises)."""

    max_concurrency: int  # executions at once (instances)
    max_queue: int

    @property
    def in_flight(self) -> int:
        """Requests admitted and not finished (queued, running, detached)."""

    @property
    def live_sequences(self) -> int:
        """Sequences started here and not ended (0 for a scheduler without any)."""

    def infer(self, args: list[Any], rows: int, deadline: float, label: str,
              respond: Callable[[Results, float], Any] | None = None,
              parameters: dict | None = None) -> Awaitable[tuple[Results, float, float]]:
        """Enqueues one request and waits for its outcome: (results, seconds queued,
        seconds its execution took); raises `Unavailable`, `Overloaded`,
        `DeadlineExceeded`, a 400 for a bad request, or the invocation's own error."""

    def continues_work(self, parameters: dict) -> bool:
        """Whether a request with these parameters continues work rather than starting
        new work (a sequence step without START), which a draining server still takes."""

    def running_invocations(self) -> list[RunningInvocation]:
        """The executions running now, oldest first."""

    def statistics(self) -> Any:
        """Queue and instance figures (the dynamic batcher's `AdmissionStatistics`)."""

    def close(self) -> None:
        """Admits nothing new (does not wait)."""

    def abandon(self, why: str) -> int:
        """Answers every admitted request that has not finished now: a queued one
        `Unavailable` (503), a running one `DeadlineExceeded` (504, its execution goes
        on), each with a log line naming it and `why`; returns how many."""

    async def wait_idle(self) -> None:
        """Returns once nothing admitted is in flight (detached executions included)."""

    def stop(self) -> None:
        """Ends the instance threads and the timer (once idle)."""


class InFlight:
    """Counts admitted work that has not finished yet, and wakes whoever waits for it
    all to finish (an unload). Each waiter gets its own event, taken when the count
    reaches zero, so no wake-up is lost to work admitted in between; a waiter that
    finds work again waits once more. Shared by `Admission` and the sequence batcher."""

    __slots__ = ("count", "_waiters")

    def __init__(self) -> None:
        self.count = 0
        self._waiters: list[trio.Event] = []

    def left(self, count: int) -> None:
        """`count` admitted items finished (on the loop)."""
        self.count -= count
        if not self.count:
            waiters, self._waiters = self._waiters, []
            for event in waiters:
                event.set()

    async def wait_idle(self) -> None:
        while self.count:
            event = trio.Event()
            self._waiters.append(event)
            await event.wait()


class _AfterPass(trio.abc.Instrument):
    """Calls what was registered (`calls`) when the loop has run every ready task and is
    about to wait for I/O: once per pass of the scheduler."""

    def __init__(self) -> None:
        self.calls: list[Callable[[], None]] = []

    def before_io_wait(self, timeout: float) -> None:
        if self.calls:
            calls, self.calls = self.calls, []
            for call in calls:
                try:
                    call()
                except Exception:  # noqa: BLE001 - a bug of ours; the loop must go on
                    log.exception("dispatch after the scheduler's pass failed")


_AFTER_PASS: trio.lowlevel.RunVar = trio.lowlevel.RunVar("tinyhal_after_pass")


def after_pass(call: Callable[[], None]) -> None:
    """Calls `call` (on the loop) at the end of this trio run's current scheduler pass,
    when every ready task has run and the loop is about to wait for I/O."""
    instrument = _AFTER_PASS.get(None)
    if instrument is None:
        instrument = _AfterPass()
        trio.lowlevel.add_instrument(instrument)
        _AFTER_PASS.set(instrument)
    instrument.calls.append(call)


class DispatchAfterPass:
    """Calling it asks for one call of `dispatch` at the end of the loop's current
    scheduler pass (`after_pass`), however often it is asked within the pass."""

    __slots__ = ("_dispatch", "_pending")

    def __init__(self, dispatch: Callable[[], None]) -> None:
        self._dispatch = dispatch
        self._pending = False

    def __call__(self) -> None:
        if not self._pending:
            self._pending = True
            after_pass(self._pass_ended)

    def _pass_ended(self) -> None:
        self._pending = False
        self._dispatch()

    def detach(self) -> None:
        """Calls nothing any more (its scheduler stopped): the scheduler's dispatch was a
        reference cycle through it, which a frozen heap would never collect."""
        self._dispatch = nothing


def nothing(*args: Any) -> None:
    """A callback that does nothing: what a stopped scheduler's callbacks become."""


class _DelayTimer:
    """A thread that calls `fired(at)` on the trio loop once the trio clock reaches the
    armed time `at`. A condition variable's timed wait ends within tens of microseconds
    of its deadline on a quiet machine, where the loop's epoll wait rounds up to whole
    milliseconds; and nothing spins while a batch waits to fill."""

    def __init__(self, token: trio.lowlevel.TrioToken,
                 fired: Callable[[float], None]) -> None:
        self._token = token
        self._fired = fired
        self._at = math.inf
        self._stopped = False
        self._offset = trio.current_time() - time.monotonic()  # trio clock - monotonic
        self._cond = threading.Condition()
        threading.Thread(target=self._loop, name="tinyhal-queue-delay", daemon=True).start()

    def arm(self, at: float) -> None:
        """Fires at `at` (math.inf: not at all). Only an earlier time wakes the thread:
        a later one (a disarm included) it finds when it wakes for the one it waits
        for, so a batch that starts before its delay ran out costs no wake-up."""
        with self._cond:
            earlier = at < self._at
            self._at = at
            if earlier:
                self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _loop(self) -> None:
        with self._cond:
            while not self._stopped:
                at = self._at
                if at == math.inf:
                    self._cond.wait()
                    continue
                remaining = at - self._offset - time.monotonic()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                self._at = math.inf
                try:
                    self._token.run_sync_soon(self._fired, at)
                except trio.RunFinishedError:
                    return


class _TimerFd:
    """Calls `fired(at)` on the trio loop once the trio clock reaches the armed time `at`,
    through a Linux timerfd the loop waits on: the kernel wakes the loop at the time
    itself (epoll only rounds its own timeouts), with no thread that would have to take
    the interpreter lock for each wait."""

    def __init__(self, fd: int, fired: Callable[[float], None]) -> None:
        self._fd = fd
        self._fired = fired
        self._at = math.inf
        self._stopped = False
        self._offset = trio.current_time() - time.monotonic()  # trio clock - monotonic
        self._token = trio.lowlevel.current_trio_token()
        self._spec = _ITimerSpec()
        trio.lowlevel.spawn_system_task(self._wait)

    def arm(self, at: float) -> None:
        """Fires at `at` (math.inf: not at all); nothing once stopped (its descriptor
        number may belong to another file by then)."""
        if self._stopped:
            return
        self._at = at
        value = self._spec.it_value
        if at == math.inf:
            value.tv_sec = value.tv_nsec = 0  # disarmed
        else:
            when = max(at - self._offset, 1e-9)  # 0 would disarm
            value.tv_sec = int(when)
            value.tv_nsec = int((when - int(when)) * 1e9)
        _LIBC.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None)

    def stop(self) -> None:
        """Closes the timer (any thread: its descriptor is closed on the loop while
        the loop runs, so trio is told first)."""
        if self._stopped:
            return
        self._stopped = True
        if trio.lowlevel.in_trio_run():
            self._close()
            return
        try:
            self._token.run_sync_soon(self._close)
        except trio.RunFinishedError:
            os.close(self._fd)

    def _close(self) -> None:
        trio.lowlevel.notify_closing(self._fd)
        os.close(self._fd)

    async def _wait(self) -> None:
        while not self._stopped:
            try:
                await trio.lowlevel.wait_readable(self._fd)
            except (trio.ClosedResourceError, OSError):
                return
            if self._stopped:
                return
            try:
                os.read(self._fd, 8)
            except BlockingIOError:  # re-armed or disarmed meanwhile
                continue
            at = self._at
            if at == math.inf:
                continue
            if trio.current_time() < at:  # the clocks' offset, read apart: wait on
                self.arm(at)
                continue
            self._at = math.inf
            self._fired(at)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _ITimerSpec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_TFD_TIMER_ABSTIME = 1
_CLOCK_MONOTONIC = 1
try:  # a quick kernel call that need not give up the interpreter lock: PyDLL
    _LIBC = ctypes.PyDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    _LIBC.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
    _LIBC.timerfd_settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                      ctypes.c_void_p]
except (OSError, AttributeError):  # not Linux with glibc: the timer thread instead
    _LIBC = None


def delay_timer(fired: Callable[[float], None]) -> _DelayTimer | _TimerFd:
    """A queue-delay timer (`arm(at)`, `stop()`) calling `fired(at)` on the trio loop:
    a timerfd the loop waits on where the system has one, else a timer thread. Call on
    the loop."""
    if _LIBC is not None and sys.platform.startswith("linux"):
        fd = _LIBC.timerfd_create(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
        if fd >= 0:
            return _TimerFd(fd, fired)
    return _DelayTimer(trio.lowlevel.current_trio_token(), fired)


class QueueTimer:
    """A scheduler's queue-delay timer: `arm(until)` asks for `fire()` (on the loop) at
    the trio time `until`, `arm(math.inf)` for none. It keeps `lead`, how late its
    wake-ups reached the loop (a mean; each counts for at most half the delay, so an
    outlier cannot make batches start early for long): a scheduler arms it that much
    early, so a batch starts when its delay ends, as Triton's delay is a maximum. The
    system timer (`delay_timer`) is made on the first arming, on the loop."""

    __slots__ = ("delay", "lead", "_at", "_fire", "_timer", "_stopped")

    def __init__(self, delay: float, fire: Callable[[], None]) -> None:
        self.delay = delay
        self.lead = 0.0
        self._at = math.inf
        self._fire = fire
        self._timer: _DelayTimer | _TimerFd | None = None
        self._stopped = False

    def arm(self, at: float) -> None:
        if at != self._at and not self._stopped:
            self._at = at
            if self._timer is None:
                if at == math.inf:
                    return
                self._timer = delay_timer(self._fired)
            self._timer.arm(at)

    def _fired(self, at: float) -> None:
        if self._at == at:
            self._at = math.inf
            bound = self.delay / 2
            late = min(trio.current_time() - at, bound)
            self.lead = min(max(0.8 * self.lead + 0.2 * late, 0.0), bound)
            self._fire()

    def stop(self) -> None:
        self._stopped = True
        if self._timer is not None:
            self._timer.stop()

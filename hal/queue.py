"""The device queue: entries, waits, retirement, close and device loss, and the driver
protocol it hands ready work to.

`Device` (`hal/device.py`) validates every queue operation on the calling thread and
then gives it to its `WorkQueue`. The queue registers an entry that holds everything the
work touches (its resource set), waits on the wait semaphores without polling, and once
they are reached calls the driver's method for that operation; the driver's
`done(error)` retires the entry: the resource set is dropped first, then the signal
semaphores advance or fail. A wait that fails never runs the work; its failure reaches
the signal semaphores instead.

**The driver protocol** is `Driver` below: a driver is an object the device holds
(`Device.driver`), not a subclass of it, and it is one file (`hal/drivers/<name>.py`,
or any module that registers one with `tinyhal.hal.register_driver`). It declares every
member of the protocol, in the protocol's order; what it cannot do it declares as
`unimplemented(...)` (the operation fails with UNIMPLEMENTED), never by leaving it out.

- *Identity and capabilities*: `name`, `identifier` (IREE's device id) and
  `capabilities` (`Capabilities`: queue count, concurrency, inline completion,
  host-visible device memory, modelled memory, device clock, default profiling modes).
  Callers outside the driver read these, never the driver's name.
- *Lifetime*: `create_allocator()` (once, by the device), `attach(queue)` (once: the
  `WorkQueue` that will call it; a driver may read `queue.lost` and `queue.closed` and
  call `queue.lose(error)`, nothing else of it), `stop(timeout)` (release threads; `close()`
  calls it once nothing runs).
- *Queue operations*, each called once per operation whose waits are reached, on the
  thread that reached them, as `op(payload, done, submission_id, wait, signal, queue)`:
  `execute` a `hal.execution.Submission` (run its operations in order: a `hal.stream`
  native stream, or `Submission.operations()` one at a time; operations may overlap only
  where no barrier separates them); `fill`, `update`, `copy` the one-command submission
  of `queue_fill` / `queue_update` / `queue_copy` (as IREE's local drivers run queue
  transfers); `host_call` host work, a callable of no arguments (`queue_read` /
  `queue_write`); `alloca`, `dealloca` queue work the device built (`Alloca`, `Dealloca`:
  call `payload(done)` in its turn; `Alloca` places transient memory, maybe later, when
  the ring has room); `barrier` (no payload: `barrier(done, submission_id, wait, signal,
  queue)`). The driver then calls `done(error)` exactly once, on any thread (`error`
  None on success; `run_capturing` turns an exception into one). `submission_id` is the
  profile's id of the operation (0 while no profiling session records), `wait` and
  `signal` its semaphore points and `queue` the device queue it was given to: a driver
  that models queues, dependencies or device time reads them; others ignore them. A
  driver keeps nothing alive for the work's sake (the entry's resource set does that,
  and a submission a driver still holds after `done` holds no buffers).
- *Host hooks*, called on the caller's thread: `queue_for_affinity(mask)` (the queue a
  program's affinity picks), `check_alloca(size)` (the error that refuses a
  `queue_alloca` of `size` bytes now, or None; a ready alloca takes ring space without an
  entry only when it passes, and a driver's `alloca` refuses it by the same check),
  `read_direct(buffer, offset, length)` / `write_direct(buffer, data, offset)` (a host
  read or write of memory the host cannot map: the bytes, or True, when the driver did it
  at once; None / False sends it through the queue as a transfer).

**Closing and loss.** `close()` lets running work finish (and work it makes ready),
fails every entry still waiting with ABORTED (it never runs), then stops the driver.
`lose(error)` loses the device: waiting entries fail with `error` at once, as does
every later one, and the driver fails what it holds.
"""

from __future__ import annotations

import abc
import collections
import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import (
    AbortedError,
    DeviceLostError,
    Error,
    FailedPreconditionError,
    InternalError,
    KernelFaultError,
    UnimplementedError,
    as_error,
)
from .allocator import Allocator
from .execution import Submission
from .native import core as _core
from .semaphore import SemaphorePoint, when_all_reached

if TYPE_CHECKING:
    from .buffer import Buffer, Storage
    from .profile import Profile
    from .ringbuffer import TransientRingbuffer

Completion = Callable[[Error | None], None]
Operation = Callable[[Any, Completion, int, Sequence[SemaphorePoint],
                      Sequence[SemaphorePoint], int], None]
"""A driver's queue operation, bound: `operation(payload, done, submission_id, wait,
signal, queue)`."""
DEFAULT_PROFILING_MODES = ("queue-events", "host-execution", "memory-events")


def run_capturing(work: Callable[[], None]) -> Error | None:
    """Runs `work`; returns its failure as a `tinyhal.Error` (None on success). Drivers
    use it to turn an operation's exception into the error its signals fail with."""
    try:
        work()
    except BaseException as exc:  # noqa: BLE001 - any failure becomes the operation's error
        return as_error(exc)
    return None


class Capabilities(NamedTuple):
    """What a driver declares and callers read instead of testing which driver it is."""

    queue_count: int = 1
    """Device queues (the `queue=` argument of queue operations: 0 .. count-1)."""
    concurrency: int = 1
    """Workers a dispatch may spread over (IREE's `hal.dispatch` concurrency)."""
    completes_inline: bool = False
    """`execute` (and `fill`, `update`, `copy`) always runs the work on the calling
    thread and calls `done` before it returns: a ready submission has run when `submit`
    returns, and the device has no threads of its own to run work on."""
    host_visible_memory: bool = True
    """Device-local memory is host-visible (mappable); False: the host reaches device
    memory only by queue transfers (`read_direct` / `write_direct` may shortcut them)."""
    default_profiling_modes: tuple[str, ...] = DEFAULT_PROFILING_MODES
    """The profiling modes a session records by default; device-time modes
    (`dispatch-events`, `device-queue-events`) only where the driver has a device clock."""
    modelled_time: bool = False
    """The driver models device time: the device's `summary()` gives a run's modelled
    total, engine use, bytes moved and peak device memory (`tinyhal-run --emu_summary`)."""


def unimplemented(what: str) -> Callable[..., None]:
    """A queue operation a driver does not have, declared as such: each call fails the
    operation with UNIMPLEMENTED (`driver 'NAME' cannot WHAT`)."""

    def operation(driver: Driver, payload: Any, done: Completion, submission_id: int,
                  wait: Sequence[SemaphorePoint], signal: Sequence[SemaphorePoint],
                  queue: int) -> None:
        done(UnimplementedError(f"driver {driver.name!r} cannot {what}"))

    operation.__doc__ = f"Unimplemented: fails with UNIMPLEMENTED (cannot {what})."
    return operation


def run_device_work(driver: Driver, payload: Callable[[Completion], None], done: Completion,
                    submission_id: int, wait: Sequence[SemaphorePoint],
                    signal: Sequence[SemaphorePoint], queue: int) -> None:
    """The queue work the device built (`Alloca`, `Dealloca`, a barrier's `no_work`),
    run in its turn on the thread that readied it: a driver's `alloca`, `dealloca` or
    `barrier` when it models nothing about them."""
    payload(done)


def cpu_queue_for_affinity(affinity: int, queue_count: int) -> int:
    """IREE's CPU devices' rule (local-task, local-sync), which never rejects an
    affinity: the queue is the mask (a VM i64, read as IREE's u64) modulo the queue
    count, so on a one-queue device every mask, ANY (-1) and bits of queues that do not
    exist included, is queue 0."""
    return (affinity & 0xFFFF_FFFF_FFFF_FFFF) % queue_count if queue_count > 1 else 0


class Driver(abc.ABC):
    """The driver protocol (see the module docstring for each member's contract).

    A driver class declares every name of `PROTOCOL`, in that order, in its own body
    (`tests/hal/test_driver_contract.py` checks it): a queue operation it lacks as
    `unimplemented(...)`, a hook it lacks as None. Nothing here is inherited silently
    except the bodies of `create_allocator`, `attach` and `stop`, which a driver with
    nothing to add assigns from here (`attach = Driver.attach`)."""

    name: str
    identifier: str
    capabilities: Capabilities
    profile: Profile | None = None
    """The profiling session attached to the device (`Profile.attach` sets it), for a
    driver that records spans of its own (device time); not a protocol member to declare."""

    def create_allocator(self) -> Allocator:
        """The device's allocator; called once, by the device."""
        return Allocator(self.identifier)

    def attach(self, queue: WorkQueue) -> None:  # noqa: B027 - the default keeps nothing
        """Called once with the `WorkQueue` that will call this driver."""

    @abc.abstractmethod
    def execute(self, payload: Submission, done: Completion, submission_id: int,
                wait: Sequence[SemaphorePoint], signal: Sequence[SemaphorePoint],
                queue: int) -> None:
        """Runs a submission's operations in order, then `done(error)`."""

    @abc.abstractmethod
    def fill(self, payload: Submission, done: Completion, submission_id: int,
             wait: Sequence[SemaphorePoint], signal: Sequence[SemaphorePoint],
             queue: int) -> None:
        """Runs `queue_fill`'s one-command submission, then `done(error)`."""

    @abc.abstractmethod
    def update(self, payload: Submission, done: Completion, submission_id: int,
               wait: Sequence[SemaphorePoint], signal: Sequence[SemaphorePoint],
               queue: int) -> None:
        """Runs `queue_update`'s one-command submission, then `done(error)`."""

    @abc.abstractmethod
    def copy(self, payload: Submission, done: Completion, submission_id: int,
             wait: Sequence[SemaphorePoint], signal: Sequence[SemaphorePoint],
             queue: int) -> None:
        """Runs `queue_copy`'s one-command submission, then `done(error)`."""

    @abc.abstractmethod
    def host_call(self, payload: Callable[[], None], done: Completion, submission_id: int,
                  wait: Sequence[SemaphorePoint], signal: Sequence[SemaphorePoint],
                  queue: int) -> None:
        """Runs host work (a `queue_read` / `queue_write` transfer), then `done(error)`."""

    @abc.abstractmethod
    def alloca(self, payload: Alloca, done: Completion, submission_id: int,
               wait: Sequence[SemaphorePoint], signal: Sequence[SemaphorePoint],
               queue: int) -> None:
        """Calls `payload(done)` in its turn (after `check_alloca`, where it has one)."""

    @abc.abstractmethod
    def dealloca(self, payload: Dealloca, done: Completion, submission_id: int,
                 wait: Sequence[SemaphorePoint], signal: Sequence[SemaphorePoint],
                 queue: int) -> None:
        """Calls `payload(done)` in its turn."""

    @abc.abstractmethod
    def barrier(self, payload: Callable[[Completion], None], done: Completion,
                submission_id: int, wait: Sequence[SemaphorePoint],
                signal: Sequence[SemaphorePoint], queue: int) -> None:
        """Calls `payload(done)` in its turn (nothing runs; the signal follows)."""

    def queue_for_affinity(self, affinity: int) -> int:
        """The queue a program's `queue_affinity` mask picks (`cpu_queue_for_affinity`)."""
        return cpu_queue_for_affinity(affinity, self.capabilities.queue_count)

    check_alloca: Callable[[int], Error | None] | None = None
    read_direct: Callable[[Buffer, int, int], bytearray | None] | None = None
    write_direct: Callable[[Buffer, memoryview, int], bool] | None = None

    def stop(self, timeout: float | None) -> None:  # noqa: B027 - the default has no threads
        """Stops the driver's threads; called by `close()` once no work is running."""


PROTOCOL = ("name", "identifier", "capabilities", "create_allocator", "attach", "execute",
            "fill", "update", "copy", "host_call", "alloca", "dealloca", "barrier",
            "queue_for_affinity", "check_alloca", "read_direct", "write_direct", "stop")
"""The driver protocol's members, in the order every driver class declares them."""


class Alloca:
    """The queue work of a `queue_alloca`: places `size` bytes of the transient ring
    into `storage` when called (at once, or when a retirement makes room)."""

    __slots__ = ("storage", "size", "ring")

    def __init__(self, storage: Storage, ring: TransientRingbuffer) -> None:
        self.storage = storage
        self.size = storage.byte_length
        self.ring = ring

    def __call__(self, done: Completion) -> None:
        storage, ring = self.storage, self.ring

        def granted(block: Any, error: Error | None) -> None:
            if error is None:
                ring.commit(storage, block)
            done(error)

        ring.reserve(self.size, granted)


class Dealloca:
    """The queue work of a `queue_dealloca`: gives the storage's ring block back."""

    __slots__ = ("storage", "ring")

    def __init__(self, storage: Storage, ring: TransientRingbuffer) -> None:
        self.storage = storage
        self.ring = ring

    def __call__(self, done: Completion) -> None:
        self.storage.released = True
        self.ring.release(self.storage)
        done(None)


def no_work(done: Completion) -> None:
    """The queue work of a barrier."""
    done(None)


_WAITING, _RUNNING, _RETIRED = "waiting", "running", "retired"


class _Entry:
    """One accepted queue operation: what to perform, its resource set and its state."""

    __slots__ = ("operation", "payload", "submission_id", "wait", "signal", "queue",
                 "resources", "state")

    def __init__(self, operation: Operation, payload: Any, submission_id: int,
                 wait: list[SemaphorePoint], signal: list[SemaphorePoint], queue: int,
                 resources: Any) -> None:
        self.operation = operation
        self.payload = payload
        self.submission_id = submission_id
        self.wait = wait
        self.signal = signal
        self.queue = queue
        self.resources = resources
        self.state = _WAITING


NOT_YET = object()
"""What `WorkQueue.perform_ready` returns when the driver may complete the work later."""


class WorkQueue:
    """One device's queue entries, run by its driver (see the module docstring)."""

    def __init__(self, owner: str, driver: Driver, transient: TransientRingbuffer) -> None:
        self.owner = owner  # how messages name the device
        self.driver = driver
        self.completes_inline = driver.capabilities.completes_inline
        self.transient = transient
        self.closed = False
        self.lost: Error | None = None  # set by `lose`: every entry fails with it
        self._entries: set[_Entry] = set()
        self._running = 0  # entries running (under the lock)
        # One item per `perform_ready` in progress: appended and popped without the lock
        # (atomic list operations), as a ready submission on `sync` is the hot path.
        self._running_inline: list[None] = []
        # Re-entrant: a garbage collection under the lock may free a transient buffer whose
        # ringbuffer retirement grants a parked queue_alloca, which retires its entry.
        self._lock = threading.RLock()
        self._idle = threading.Condition(self._lock)  # for wait_idle() and close()
        self._watchers = 0  # threads waiting on `_idle`; retiring notifies only if any
        driver.attach(self)

    @property
    def in_flight(self) -> int:
        """Operations accepted and not yet retired (waiting or running, with or without
        an entry)."""
        with self._lock:
            return len(self._entries) + len(self._running_inline)

    def check_open(self) -> None:
        if self.closed:
            raise FailedPreconditionError(f"{self.owner} is closed")

    # -- entries ----------------------------------------------------------------------

    def accept(self, operation: Operation, payload: Any, wait: list[SemaphorePoint],
               signal: list[SemaphorePoint], queue: int, resources: Any,
               submission_id: int = 0, reached: bool = False) -> None:
        """Registers an entry holding `resources` (and `payload`); once `wait` is reached
        `operation` (the driver's method for it) runs it, and its `done` retires the
        entry. `reached` says the caller saw every wait point reached
        (`normalize_wait_signal`): it runs now."""
        runs_now = reached or not wait
        entry = _Entry(operation, payload, submission_id, wait, signal, queue, resources)
        with self._lock:
            if self.closed:
                raise FailedPreconditionError(f"{self.owner} is closed")
            self._entries.add(entry)
            if runs_now:
                entry.state = _RUNNING
                self._running += 1
        if self.lost is not None:
            self._retire(entry, self.lost)
            return
        if runs_now:
            self._start(entry)
            return
        for sem, value in signal:
            sem.offer_waits(value, wait)

        def ready(error: Error | None) -> None:
            error = error or self.lost
            if error is not None:
                self._retire(entry, error)
                return
            with self._lock:
                if entry.state is not _WAITING:
                    return  # aborted by close() while it waited
                entry.state = _RUNNING
                self._running += 1
            self._start(entry)

        when_all_reached(wait, ready)

    def _start(self, entry: _Entry) -> None:
        def done(error: Error | None) -> None:
            self._retire(entry, error)

        try:
            entry.operation(entry.payload, done, entry.submission_id, entry.wait,
                            entry.signal, entry.queue)
        except BaseException as exc:  # noqa: BLE001 - becomes the entry's error
            self._retire(entry, as_error(exc))

    def perform_ready(self, operation: Operation, payload: Submission,
                      wait: list[SemaphorePoint], signal: list[SemaphorePoint], queue: int,
                      submission_id: int = 0) -> Error | None | object:
        """Hands the driver a submission whose waits are met, without an entry
        (`operation`: its `execute`, `fill`, `update` or `copy`): it counts as running
        (so `close()` and `wait_idle()` wait for it) until the driver's `done`, which
        drops its references (the submission holds everything its work touches) and then
        signals. A driver that `completes_inline` runs it on this thread before this
        returns, which then returns its outcome (None or the error `signal` was failed
        with); others may complete it later on another thread (`NOT_YET` returned)."""
        running_inline = self._running_inline
        running_inline.append(None)  # before the test: close() then waits for it
        if self.closed:
            running_inline.pop()
            raise FailedPreconditionError(f"{self.owner} is closed")
        if self.completes_inline:
            outcome: list[Error | None] = []
            try:
                operation(payload, outcome.append, submission_id, wait, signal, queue)
            except BaseException as exc:  # noqa: BLE001 - becomes the work's error
                outcome.append(as_error(exc))
            error = outcome[0] if outcome else InternalError(
                f"{self.owner} finished inline work without completing it")
            self._ready_done(payload, signal, None, error)
            return error
        # The first report completes it (a `list.pop`, atomic, claims it), later ones are
        # ignored, as an entry's are; a partial, so handing it over costs no frame.
        done = functools.partial(self._ready_done, payload, signal, [None])
        try:
            operation(payload, done, submission_id, wait, signal, queue)
        except BaseException as exc:  # noqa: BLE001 - becomes the work's error
            done(as_error(exc))
        return NOT_YET

    def _ready_done(self, payload: Submission, signal: list[SemaphorePoint],
                    once: list[None] | None, error: Error | None) -> None:
        if once is not None:
            try:
                once.pop()
            except IndexError:
                return
        payload.release()  # before the signal, as an entry's resource set
        try:
            self.complete(signal, error)
        finally:
            running_inline = self._running_inline
            running_inline.pop()
            if self._watchers and not running_inline:
                with self._lock:
                    self._idle.notify_all()
        if type(error) is KernelFaultError:
            self.lose_to_fault(error)

    def _retire(self, entry: _Entry, error: Error | None) -> None:
        with self._lock:
            state = entry.state
            if state is _RETIRED:
                return
            entry.state = _RETIRED
        _release(entry)  # before the signal: a woken waiter sees it
        try:
            self.complete(entry.signal, error)
        finally:
            # Counted as in flight until its signal has readied what depends on it, so
            # close() sees work made ready by running work as running, never as waiting.
            with self._lock:
                self._entries.discard(entry)
                if state is _RUNNING:
                    self._running -= 1
                if self._watchers and (not self._running or not self._entries):
                    self._idle.notify_all()
        if type(error) is KernelFaultError:
            self.lose_to_fault(error)

    complete = staticmethod(_core.complete)
    """`complete(signal, error)`: signals (or fails) `signal`. Trampolined: completions
    that a signal triggers on this thread are queued for the outermost call, so chains
    of thousands of dependent operations, succeeding or failing, never recurse once per
    link. In C (`hal/native/core.c`) while no error, no trampoline and no waiter is
    involved: the points advance there; the rest takes `_complete_slow`."""

    # -- idle, close, loss ------------------------------------------------------------

    def wait_idle(self, timeout: float | None = 60.0) -> bool:
        """Waits until every entry has retired and nothing runs; False on timeout."""
        return self._wait_until(lambda: not (self._entries or self._running
                                             or self._running_inline), timeout)

    def _wait_until(self, condition: Callable[[], bool], timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            self._watchers += 1
            try:
                while not condition():
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._idle.wait(left)
            finally:
                self._watchers -= 1
        return True

    def close(self, timeout: float | None) -> bool:
        """Stops accepting work, lets running work finish (and work it makes ready),
        aborts what still waits, then stops the driver. False if already closed."""
        with self._lock:
            if self.closed:
                return False
            self.closed = True
        self.transient.close(AbortedError(
            f"{self.owner} closed while a queue_alloca waited for ringbuffer space"))
        deadline = None if timeout is None else time.monotonic() + timeout
        self._wait_until(lambda: not (self._running or self._running_inline), timeout)
        waiting: list[_Entry] = []
        with self._lock:
            for entry in tuple(self._entries):
                if entry.state is _WAITING:  # claimed: a late `ready` finds it retired
                    entry.state = _RETIRED
                    self._entries.discard(entry)
                    waiting.append(entry)
        for entry in waiting:
            self._finish(entry, AbortedError(f"{self.owner} closed before the work ran"))
        self.wait_idle(None if deadline is None else max(0.0, deadline - time.monotonic()))
        self.driver.stop(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return True

    def lose_to_fault(self, fault: Error) -> None:
        """A kernel faulted: what it wrote before faulting cannot be trusted, so the
        device is lost (as a GPU context is after a kernel fault)."""
        self.lose(DeviceLostError(f"{self.owner} lost: a kernel faulted ({fault.message})"))

    def lose(self, error: Error) -> None:
        """Loses the device: entries waiting on semaphores fail with `error` now, as do
        parked `queue_alloca` reservations and every later entry; the driver fails the
        work it holds (it reads `lost`). The device stays usable only for `close()`."""
        with self._lock:
            if self.lost is not None:
                return
            self.lost = error
            waiting = [e for e in self._entries if e.state is _WAITING]
            for entry in waiting:
                entry.state = _RETIRED
                self._entries.discard(entry)
            if self._watchers:
                self._idle.notify_all()
        self.transient.close(error)
        for entry in waiting:
            self._finish(entry, error)

    def _finish(self, entry: _Entry, error: Error | None) -> None:
        # The resource set goes before the signal, so a woken waiter sees it released.
        # (A semaphore that never reaches the wait may keep `ready`, never the set.)
        _release(entry)
        self.complete(entry.signal, error)


def _complete_slow(signal: Sequence[SemaphorePoint], error: Error | None) -> None:
    """`WorkQueue.complete` where the C path stops: a completion to queue on this
    thread's trampoline, points with waiters (their timepoints fire here, outside the
    semaphores' locks), errors."""
    pending = _core.trampoline()
    if pending is not None:
        pending.append((signal, error))
        return
    ready: Sequence[Any] = ()
    if error is None:
        advanced = 0
        for sem, value in signal:
            advanced += 1
            try:
                ready = sem.advance(value)
            except Error as exc:
                sem.fail(exc)
                continue
            if ready:
                signal = signal[advanced:]
                break
        else:
            return
    _core.set_trampoline(pending := collections.deque())
    try:
        for tp in ready:  # what the last point advanced reached, before the next point
            tp.callback(None)
        while True:
            for sem, value in signal:
                if error is not None:
                    sem.fail(error)
                    continue
                try:
                    sem.signal(value)
                except Error as exc:
                    sem.fail(exc)
            if not pending:
                break
            signal, error = pending.popleft()
    finally:
        _core.set_trampoline(None)


_core.register(complete_slow=_complete_slow)


def _release(entry: _Entry) -> None:
    """Drops an entry's resource set and payload. A submission is emptied as well:
    driver frames, tasks and closures that ran it may outlive its completion by a
    moment, and what they still hold must not keep its buffers' memory alive."""
    payload = entry.payload
    entry.resources = entry.payload = None
    if type(payload) is Submission:
        payload.release()


__all__ = ["Alloca", "Capabilities", "Completion", "Dealloca", "Driver", "Operation",
           "PROTOCOL", "WorkQueue", "cpu_queue_for_affinity", "no_work", "run_capturing",
           "run_device_work", "unimplemented"]

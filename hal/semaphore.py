"""Timeline semaphores and fences.

A `Semaphore` holds a monotonically increasing 64-bit value. Work waits for a value and
signals a larger one; host threads block in `wait`, trio tasks suspend in `wait_async`, and
drivers register timepoint callbacks that fire exactly when a value is reached, so nothing
ever polls. `fail` records the first error; every current and future waiter sees it.

A driver may also `offer` work that reaching a value depends on (a submission handed to a
worker thread that has not started it yet): a thread about to block in `wait` for that
value runs it itself instead of sleeping while the worker wakes up. This is the caller
donating its thread, as IREE's task executor lets a waiting caller do.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from ..errors import (
    AbortedError,
    DeadlineExceededError,
    Error,
    InvalidArgumentError,
    OutOfRangeError,
)
from ..scheduler.trio_bridge import await_callback
from .native import core as _core

FenceCore = _core.FenceCore
SemaphoreCore = _core.SemaphoreCore

MAX_VALUE = (1 << 64) - 1
TimepointCallback = Callable[[Error | None], None]


class SemaphoreStatistics(NamedTuple):
    value: int
    failed: bool
    pending_timepoints: int
    blocked_threads: int


class Timepoint:
    """A registered callback for a semaphore value; `cancel()` unregisters it if unfired."""

    __slots__ = ("value", "callback", "fired", "_seq")

    def __init__(self, value: int, callback: TimepointCallback, seq: int) -> None:
        self.value = value
        self.callback = callback
        self.fired = False
        self._seq = seq

    def __lt__(self, other: Timepoint) -> bool:
        return (self.value, self._seq) < (other.value, other._seq)


class Semaphore(SemaphoreCore):
    """A timeline semaphore: a uint64 that only moves forward, or fails once.

    Queue operations wait for a semaphore to reach a value and signal it to a larger one
    (their `wait=` and `signal=` take a `SemaphoreList`: `[(semaphore, value), ...]` or a
    `Fence`); the host reads it with `query()`, blocks in `wait(value, timeout)` (raises
    the failure if it failed), suspends in `await wait_async(value)` under trio, and
    moves it with `signal(value)` or `fail(error)`.

    >>> from tinyhal.hal import Semaphore
    >>> ready = Semaphore(0)
    >>> ready.signal(2)
    >>> ready.query()
    2
    >>> ready.wait(1, timeout=1.0)  # reached already: returns at once

    Its state lives in the C base (`hal/native/core.c`), which also runs `advance` and
    `query` when nothing waits: the ready path of every queue operation. What waits
    (timepoints, offers, blocked threads) registers under `_lock` before it reads the
    value, and `advance` takes the locked `_advance_slow` whenever anything is registered,
    so the unlocked C path (atomic under the GIL) never misses a waiter.
    """

    # No timepoint or offer list until one is added, and no lock until a slow path needs
    # one: a program makes a semaphore per fence, and most never get a waiter.
    __slots__ = ()

    _seq = itertools.count()

    # `Semaphore(initial=0, name="")` is the C base's constructor, which every semaphore
    # C makes (`Fence.pending`) goes through too: INVALID_ARGUMENT unless `initial` is an
    # int in [0, 2**64).

    def __repr__(self) -> str:
        label = f" {self.name}" if self.name else ""
        state = f"failed: {self._failure}" if self._failure else f"value={self._value}"
        return f"<Semaphore{label} {state}>"

    @property
    def failure(self) -> Error | None:
        """The error the semaphore failed with, or None."""
        return self._failure

    def signal(self, value: int) -> None:
        """Advances to `value`, waking every waiter at or below it.

        Values must strictly increase (OUT_OF_RANGE otherwise); signalling a failed
        semaphore raises its failure.
        """
        for tp in self.advance(value):
            tp.callback(None)

    # `advance(value) -> Sequence[Timepoint]` (C): `signal`, except that the callbacks of
    # the timepoints it reaches are returned for the caller to run (outside any lock), in
    # order, instead of run here. Without waiters it only moves the value; otherwise, and
    # for every error, it is `_advance_slow`.

    def _advance_slow(self, value: int) -> Sequence[Timepoint]:
        if type(value) is not int or not 0 <= value <= MAX_VALUE:
            _check_value(value, "signal value")
        with self._lock:
            if self._failure is not None:
                raise self._failure
            if value <= self._value:
                raise OutOfRangeError(
                    f"{self!r} cannot be signalled to {value}: timeline values must increase "
                    f"(current {self._value})"
                )
            self._value = value
            ready = self._pop_reached(value) if self._timepoints else ()
            offers = self._offers
            while offers and offers[0][0] <= value:  # reached: the offers lapse
                heapq.heappop(offers)
            if self._blocked:
                self._cond.notify_all()
        return ready

    def fail(self, error: BaseException | str) -> None:
        """Fails the semaphore; the first failure wins and reaches every waiter."""
        if isinstance(error, str):
            error = AbortedError(error)
        elif not isinstance(error, Error):
            wrapped = AbortedError(f"{type(error).__name__}: {error}")
            wrapped.__cause__ = error
            error = wrapped
        with self._lock:
            if self._failure is not None:
                return
            self._failure = error
            ready = self._timepoints
            self._timepoints = ()
            self._offers = ()
            for tp in ready:
                tp.fired = True
            if self._blocked:
                self._cond.notify_all()
        for tp in ready:
            tp.callback(error)

    def wait(self, value: int, timeout: float | None = None) -> None:
        """Blocks until the value is reached; DEADLINE_EXCEEDED after `timeout` seconds.

        `timeout=0` only checks. Raises the semaphore's failure if it fails. Without a
        timeout, work `offer`ed for a value up to `value` runs on this thread rather than
        the thread sleeping (with one, it could not keep its deadline).
        """
        _check_value(value, "wait value")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            cond = self._cond
            if cond is None:
                cond = self._cond = threading.Condition(self._lock)
            self._blocked += 1
            try:
                while True:
                    if self._failure is not None:
                        raise self._failure
                    if self._value >= value:
                        return
                    if deadline is None:
                        if self._offers and self._offers[0][0] <= value:
                            self._lock.release()
                            try:
                                assist_points(((self, value),))
                            finally:
                                self._lock.acquire()
                            continue
                        cond.wait()
                    else:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            raise DeadlineExceededError(
                                f"{self!r} did not reach {value} within {timeout} s"
                            )
                        cond.wait(remaining)
            finally:
                self._blocked -= 1

    async def wait_async(self, value: int) -> None:
        """Waits in a trio task without blocking the event loop; cancellation is safe
        (it unregisters the timepoint). Raises the semaphore's failure."""
        _check_value(value, "wait value")

        def subscribe(callback: Callable[..., None]) -> Callable[[], bool] | None:
            tp = self.on_reached(value, callback)
            if tp is None:
                callback(self._failure)  # already reached, or failed
                return None
            return functools.partial(self.cancel_timepoint, tp)

        await await_callback(subscribe)

    def offer(self, value: int, work: Callable[[], None]) -> None:
        """Offers `work` that reaching `value` waits on to the threads that block in `wait`.

        The first such thread waiting for `value` or more runs `work()` instead of
        sleeping; the offer lapses once `value` is reached or the semaphore fails. `work`
        must be safe to call on any thread, more than once and after it was done by
        others (it claims what it runs), and must not raise.
        """
        self._add_offer(value, work, None)

    def offer_waits(self, value: int, points: Sequence[SemaphorePoint]) -> None:
        """Says that reaching `value` waits on `points` (a queue entry waiting on them will
        signal it): a thread that blocks for `value` assists what is offered there, and
        so on back along a chain of any length (iteratively, never recursively)."""
        self._add_offer(value, None, points)

    def _add_offer(self, value: int, work: Callable[[], None] | None,
                   points: Sequence[SemaphorePoint] | None) -> None:
        with self._lock:
            if self._failure is None and self._value < value:
                if not self._offers:
                    self._offers = []
                heapq.heappush(self._offers, (value, next(self._seq), work, points))

    def _take_offer(self, value: int) -> _Offer | None:
        with self._lock:
            offers = self._offers
            if not offers or offers[0][0] > value:
                return None
            return heapq.heappop(offers)

    def on_reached(self, value: int, callback: TimepointCallback) -> Timepoint | None:
        """Calls `callback(None)` when `value` is reached or `callback(error)` on failure.

        If the outcome is already known, the callback is not stored and this returns None
        after calling nothing: the caller checks `query()`/`failure` itself. Otherwise it
        returns the timepoint; the callback later runs on the signalling thread, outside the
        semaphore's lock, exactly once.
        """
        tp = Timepoint(value, callback, next(self._seq))
        with self._lock:
            if self._failure is not None or self._value >= value:
                return None
            timepoints = self._timepoints
            if not timepoints:
                timepoints = [tp]  # registered in one store: the C `advance` sees it or not
                self._timepoints = timepoints
            else:
                heapq.heappush(timepoints, tp)
            # Registered before the value is read again: an `advance` that ran after the
            # check above and before the store skipped the lock, so it missed `tp`.
            if self._value >= value:
                timepoints.remove(tp)
                heapq.heapify(timepoints)
                return None
            return tp

    def cancel_timepoint(self, tp: Timepoint) -> bool:
        """Unregisters an unfired timepoint; False if it already fired."""
        with self._lock:
            if tp.fired:
                return False
            tp.fired = True
            timepoints = self._timepoints
            if tp in timepoints:
                timepoints.remove(tp)
                heapq.heapify(timepoints)
            return True

    def statistics(self) -> SemaphoreStatistics:
        with self._lock:
            return SemaphoreStatistics(
                self._value, self._failure is not None, len(self._timepoints), self._blocked
            )

    def _pop_reached(self, value: int) -> list[Timepoint]:
        ready = []
        heap = self._timepoints
        while heap and heap[0].value <= value:
            tp = heapq.heappop(heap)
            tp.fired = True
            ready.append(tp)
        return ready


def assist_points(points: Iterable[SemaphorePoint]) -> None:
    """Runs the work offered at `points` on this thread, following `offer_waits` back
    through chains of waiting queue entries with a work list, so a chain of thousands of
    entries costs no recursion."""
    todo = list(points)
    while todo:
        sem, value = todo.pop()
        while (offer := sem._take_offer(value)) is not None:
            _, _, work, waits = offer
            if waits is not None:
                todo.extend(waits)
            else:
                work()


_Offer = tuple  # (value, sequence number, work or None, wait points or None)


def _check_value(value: int, what: str) -> None:
    if not isinstance(value, int) or value < 0 or value > MAX_VALUE:
        raise InvalidArgumentError(f"semaphore {what} must be an int in [0, 2**64), not {value!r}")


SemaphorePoint = tuple[Semaphore, int]


class Fence(FenceCore):
    """A set of semaphore points: reached when every semaphore reaches its value.

    What IREE's functions take and return as `!hal.fence`, and one form of a queue
    operation's `SemaphoreList`. `query()` says whether it is reached, `wait(timeout)`
    blocks until it is (raising a semaphore's failure), `signal()` / `fail(error)` move
    every semaphore in it; `Fence.pending()` is a fence of a new semaphore, reached once
    signalled, and `Fence.join(fences)` one reached when all of them are.

    >>> from tinyhal.hal import Fence, Semaphore
    >>> a, b = Semaphore(0), Semaphore(0)
    >>> both = Fence([(a, 1), (b, 5)])
    >>> a.signal(1); both.query()
    False
    >>> b.signal(5); both.query()
    True
    >>> both.wait(timeout=1.0)

    A semaphore appears at most once, at the largest value inserted for it.
    `timeline` maps each semaphore to its value (read it). A fence never changes once
    made; its points are a tuple (in the C base, `hal/native/core.c`), which queue
    operations take as they are, and `timeline` is made from them when first read.
    """

    __slots__ = ()

    # `Fence(points=())` and `Fence.single(semaphore, value)` (a fence of one point) are
    # the C base's: one constructor, which `pending` and `join` go through too. Each value
    # must be an int in [0, 2**64) and each point a pair (INVALID_ARGUMENT otherwise).

    pending = staticmethod(_core.pending_fence)
    """`Fence.pending()`: a fence of one new semaphore (at 0) reached at 1, what
    `hal.fence.create` makes, several per step of a recurrent program (C)."""

    reached = staticmethod(_core.reached_fence)
    """`Fence.reached()`: a fence of one new semaphore already at 1, the signal fence of
    a queue operation that completed before it returned (C)."""

    join = staticmethod(_core.join_fences)
    """`Fence.join(fences)`: a fence of every point of `fences` (Nones skipped), the
    largest value per semaphore (C)."""

    def __repr__(self) -> str:
        inner = ", ".join(f"{s!r}@{v}" for s, v in self.timeline.items())
        return f"<Fence [{inner}]>"

    @property
    def points(self) -> list[SemaphorePoint]:
        return list(self._points)

    def signal(self) -> None:
        for sem, value in self.timeline.items():
            sem.signal(value)

    def fail(self, error: BaseException | str) -> None:
        for sem in self.timeline:
            sem.fail(error)

    @property
    def failure(self) -> Error | None:
        for sem in self.timeline:
            if sem.failure is not None:
                return sem.failure
        return None

    def query(self) -> bool:
        """True when every point is reached; raises the first failure."""
        for sem, value in self.timeline.items():
            if sem.query() < value:
                return False
        return True

    def wait(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        for sem, value in self.timeline.items():
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            sem.wait(value, remaining)

    async def wait_async(self) -> None:
        for sem, value in self.timeline.items():
            await sem.wait_async(value)


fences_reached: Callable[[Sequence[Fence | None]], Any] = _core.fences_reached
"""`fences_reached(fences)`: whether every fence of a list or tuple of Fences and Nones is
reached with no semaphore failed (a queue operation waiting on them all is ready), or
NotImplemented if an item is neither; in C, reading the fences' points where they are."""

join_fence_rows: Callable[[Sequence[tuple[Fence | None]]], Any] = _core.join_fence_rows
"""`hal.fence.join` over the VM's rows (1-tuples of a fence or None), in C: the one fence
with points among them as it is, a new joined fence, None if no row has a point, or
NotImplemented if a row holds anything else (the caller names the error)."""


def _normalize_general(
    wait: Fence | Sequence[SemaphorePoint] | None, signal: Fence | Sequence[SemaphorePoint] | None
) -> tuple[Sequence[SemaphorePoint], Sequence[SemaphorePoint], bool]:
    wait_points = normalize_points(wait, "wait")
    return wait_points, normalize_points(signal, "signal"), all_reached(wait_points)


SemaphoreList = Fence | Sequence[SemaphorePoint] | None
"""What a queue operation's `wait=` and `signal=` take (IREE's `iree_hal_semaphore_list_t`):
a `Fence`, a sequence of `(Semaphore, value)` pairs, or None (nothing: the same as `()`).
Waiting means every semaphore reaches at least its value; signalling sets each to its
value once the operation is done (or fails them all if it fails)."""

normalize_wait_signal: Callable[
    [SemaphoreList, SemaphoreList],
    tuple[Sequence[SemaphorePoint], Sequence[SemaphorePoint], bool],
] = _core.normalize_wait_signal
"""`normalize_wait_signal(wait, signal) -> (wait points, signal points, reached)`:
`normalize_points` of a queue operation's wait and signal, and whether the wait is already
reached (`all_reached`). In C, in one call, when they are Fences (or None), as the VM
passes them: then the points are the fences' own tuples (read them only); otherwise
through the general path here."""


def normalize_points(
    points: Fence | Sequence[SemaphorePoint] | None, what: str
) -> list[SemaphorePoint]:
    """Turns a Fence or a list of (Semaphore, value) into a validated list."""
    if isinstance(points, Fence):
        return points.points
    if points is None:
        return []
    result = []
    for item in points:
        try:
            sem, value = item
        except (TypeError, ValueError):
            raise InvalidArgumentError(
                f"{what} entries must be (Semaphore, value) pairs, not {item!r}"
            ) from None
        if not isinstance(sem, Semaphore):
            raise InvalidArgumentError(f"{what} entry {item!r} does not name a Semaphore")
        if type(value) is not int or not 0 <= value <= MAX_VALUE:
            _check_value(value, f"{what} value")
        result.append((sem, value))
    return result


def all_reached(points: Sequence[SemaphorePoint]) -> bool:
    """True when every point is reached and no semaphore has failed (a failure, or a
    point still ahead, is for `when_all_reached` to decide)."""
    for sem, value in points:
        if sem._failure is not None or sem._value < value:
            return False
    return True


def when_all_reached(
    points: Sequence[SemaphorePoint], callback: TimepointCallback
) -> None:
    """Calls `callback(None)` once every point is reached, or `callback(error)` on the first
    failure; immediately (on this thread) if already decided, else on the signalling thread.
    """
    pending = []
    for sem, value in points:
        failure = sem.failure
        if failure is not None:
            callback(failure)
            return
        if sem._value < value:
            pending.append((sem, value))
    if not pending:
        callback(None)
        return
    lock = threading.Lock()
    state = {"left": len(pending), "done": False}

    def one(error: Error | None) -> None:
        with lock:
            if state["done"]:
                return
            if error is None:
                state["left"] -= 1
                if state["left"]:
                    return
            state["done"] = True
        callback(error)

    for sem, value in pending:
        if sem.on_reached(value, one) is None:
            one(sem.failure)


_core.register(semaphore=Semaphore, fence=Fence, normalize_general=_normalize_general)

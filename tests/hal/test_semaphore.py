"""Semaphore and fence conformance (after IREE's CTS semaphore suite), on every driver."""

from __future__ import annotations

import threading

import pytest

from tinyhal import errors
from tinyhal.hal import Fence
from tinyhal.hal.semaphore import Semaphore, assist_points


def test_initial_value_and_signal(device):
    sem = device.create_semaphore(5)
    assert sem.query() == 5
    sem.signal(6)
    sem.signal(1 << 63)
    assert sem.query() == 1 << 63


def test_signal_backwards_is_rejected(device):
    sem = device.create_semaphore(3)
    with pytest.raises(errors.OutOfRangeError, match="must increase"):
        sem.signal(3)
    with pytest.raises(errors.OutOfRangeError):
        sem.signal(2)
    assert sem.query() == 3


def test_value_range_checked(device):
    with pytest.raises(errors.InvalidArgumentError):
        device.create_semaphore(-1)
    sem = device.create_semaphore()
    with pytest.raises(errors.InvalidArgumentError):
        sem.signal(1 << 64)


def test_wait_already_reached_and_timeout(device):
    sem = device.create_semaphore(2)
    sem.wait(1, timeout=0)
    sem.wait(2, timeout=0)
    with pytest.raises(errors.DeadlineExceededError, match="did not reach 3"):
        sem.wait(3, timeout=0.01)


def test_threaded_waiters_wake_on_signal(device):
    sem = device.create_semaphore()
    reached = []
    threads = [
        threading.Thread(target=lambda v=v: (sem.wait(v, timeout=10), reached.append(v)))
        for v in (1, 2, 3, 3)
    ]
    for t in threads:
        t.start()
    sem.signal(2)
    sem.signal(3)
    for t in threads:
        t.join(10)
    assert sorted(reached) == [1, 2, 3, 3]


def test_failure_reaches_every_waiter(device):
    sem = device.create_semaphore()
    seen = []

    def waiter():
        try:
            sem.wait(10, timeout=10)
        except errors.Error as exc:
            seen.append(exc)

    threads = [threading.Thread(target=waiter) for _ in range(4)]
    for t in threads:
        t.start()
    sem.fail(errors.DataLossError("device lost"))
    for t in threads:
        t.join(10)
    assert len(seen) == 4 and all(isinstance(e, errors.DataLossError) for e in seen)
    with pytest.raises(errors.DataLossError):
        sem.query()
    with pytest.raises(errors.DataLossError):
        sem.wait(1, timeout=1)


def test_first_failure_wins(device):
    sem = device.create_semaphore()
    sem.fail(errors.AbortedError("first"))
    sem.fail(errors.InternalError("second"))
    assert isinstance(sem.failure, errors.AbortedError)
    with pytest.raises(errors.AbortedError, match="first"):
        sem.signal(1)


def test_timepoint_callbacks_fire_once(device):
    sem = device.create_semaphore()
    fired = []
    tp = sem.on_reached(2, fired.append)
    assert tp is not None
    sem.signal(1)
    assert fired == []
    sem.signal(5)
    assert fired == [None]
    assert sem.on_reached(3, fired.append) is None  # already reached: caller checks


def test_fence_join_wait_and_failure(device):
    a, b = device.create_semaphore(), device.create_semaphore()
    fence = Fence.join([Fence([(a, 1)]), Fence([(a, 2), (b, 1)]), None])
    assert len(fence) == 2 and dict(fence.points)[a] == 2
    assert fence.query() is False
    a.signal(2)
    b.signal(1)
    fence.wait(timeout=1)
    assert fence.query() is True
    f2 = Fence([(device.create_semaphore(), 1)])
    f2.fail("boom")
    with pytest.raises(errors.AbortedError, match="boom"):
        f2.wait(timeout=1)


def test_fence_signal_and_timeout(device):
    s = device.create_semaphore()
    fence = Fence([(s, 4)])
    with pytest.raises(errors.DeadlineExceededError):
        fence.wait(timeout=0.01)
    fence.signal()
    assert s.query() == 4


def test_long_dependency_chain_completes_without_deep_recursion(device):
    sems = [device.create_semaphore() for _ in range(5001)]
    for i in range(5000):
        device.queue_barrier(wait=[(sems[i], 1)], signal=[(sems[i + 1], 1)])
    sems[0].signal(1)
    sems[-1].wait(1, timeout=60)
    failing = [device.create_semaphore() for _ in range(3001)]
    for i in range(3000):
        device.queue_barrier(wait=[(failing[i], 1)], signal=[(failing[i + 1], 1)])
    failing[0].fail(errors.CancelledError("upstream cancelled"))
    with pytest.raises(errors.CancelledError, match="upstream cancelled"):
        failing[-1].wait(1, timeout=60)


def test_a_blocking_waiter_runs_offered_work_instead_of_sleeping(device):
    s = device.create_semaphore()
    ran_on = []

    def work():
        ran_on.append(threading.current_thread().name)
        s.signal(2)

    s.offer(2, work)
    s.offer(5, lambda: ran_on.append("too late"))  # for a later value: not this wait's
    s.wait(2)  # would block forever without the offer
    assert ran_on == [threading.current_thread().name]
    assert s.statistics().pending_timepoints == 0


def test_offers_lapse_and_a_deadline_waiter_does_not_run_them(device):
    s = device.create_semaphore()
    ran = []
    s.offer(1, lambda: ran.append(1))
    with pytest.raises(errors.DeadlineExceededError):
        s.wait(1, timeout=0.05)  # could not keep its deadline while running work
    s.signal(1)  # reached: the offer lapses
    assist_points([(s, 1)])
    s.offer(1, lambda: ran.append("reached"))  # already reached: not kept
    assist_points([(s, 5)])
    t = device.create_semaphore()
    t.offer(1, lambda: ran.append("failed"))
    t.fail("gone")
    assist_points([(t, 1)])
    assert ran == []


def test_assist_runs_what_is_offered_up_to_a_value_in_value_order(device):
    s = device.create_semaphore()
    ran = []
    for value in (3, 1, 2, 7):
        s.offer(value, lambda v=value: ran.append(v))
    assist_points([(s, 3)])
    assert ran == [1, 2, 3]
    assist_points([(s, 3)])  # each offer runs once
    assert ran == [1, 2, 3]


def test_fence_single_is_a_one_point_fence(device):
    s = device.create_semaphore()
    fence = Fence.single(s, 3)
    assert fence.points == [(s, 3)] and fence.timeline == Fence([(s, 3)]).timeline
    with pytest.raises(errors.InvalidArgumentError, match="fence value"):
        Fence.single(s, -1)


def test_a_waiter_follows_a_long_chain_of_waits_without_recursing(device):
    # 5000 entries, each waiting on the one before: a waiter at the end walks back
    # through all of them (finding no work) and then sleeps until the chain completes.
    gate = device.create_semaphore()
    sems = [gate] + [device.create_semaphore() for _ in range(5000)]
    for before, after in zip(sems, sems[1:]):
        device.queue_barrier(wait=[(before, 1)], signal=[(after, 1)])
    outcome = []

    def waiter():
        try:
            sems[-1].wait(1)  # no deadline: it assists what the chain offers
            outcome.append("reached")
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome.append(exc)

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    thread.join(0.5)
    assert not outcome, outcome  # nothing to run yet: it sleeps
    gate.signal(1)
    thread.join(30)
    assert outcome == ["reached"]


def test_a_pending_fence_holds_a_semaphore_as_semaphore_makes_it():
    """`Fence.pending` builds its semaphore without `__init__` (it is on every step of a
    recurrent program); every slot must hold what `Semaphore()` puts there."""
    fence = Fence.pending()
    (made, value), = fence.points
    assert value == 1 and fence.timeline == {made: 1}
    fresh = Semaphore()
    for slot in Semaphore.__slots__:
        if slot == "__weakref__":
            continue
        ours, theirs = getattr(made, slot), getattr(fresh, slot)
        if slot == "_lock":
            assert type(ours) is type(theirs) and not ours.locked()
        else:
            assert ours == theirs, slot

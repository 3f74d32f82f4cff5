"""Unit tests of tinyhal.scheduler: gating, ordering, errors, tiling, shutdown."""

from __future__ import annotations

import random
import threading

import pytest

from tinyhal.errors import (
    AbortedError,
    CancelledError,
    FailedPreconditionError,
    InvalidArgumentError,
)
from tinyhal.scheduler import (
    CallTask,
    Executor,
    NopTask,
    current_worker_index,
)

WAIT = 10.0  # bound for every wait in this file


@pytest.fixture
def ex():
    executor = Executor(2, name="test")
    yield executor
    executor.shutdown(cancel=True, timeout=WAIT)


def test_call_runs_on_a_worker(ex):
    seen = []
    t = ex.call(lambda: seen.append(current_worker_index()))
    assert t.wait(WAIT) is None
    assert seen and seen[0] in (0, 1)
    assert t.done and t.error is None


def test_gates_hold_until_released(ex):
    ran = threading.Event()
    t = CallTask(ex, ran.set)
    release = t.add_wait()
    ex.submit(t)
    assert not ran.wait(0.05)
    assert t.state == "pending"
    release()
    release()  # a second release is a no-op
    assert t.wait(WAIT) is None and ran.is_set()


def test_dependencies_order_a_diamond(ex):
    order = []
    lock = threading.Lock()

    def rec(name):
        def fn():
            with lock:
                order.append(name)

        return fn

    a = CallTask(ex, rec("a"))
    b = CallTask(ex, rec("b")).depends_on(a)
    c = CallTask(ex, rec("c")).depends_on(a)
    d = CallTask(ex, rec("d")).depends_on(b, c)
    ex.submit(d, c, b, a)
    assert d.wait(WAIT) is None
    assert order[0] == "a" and order[-1] == "d" and sorted(order[1:3]) == ["b", "c"]


def test_independent_work_runs_out_of_order(ex):
    blocked = CallTask(ex, lambda: None, name="blocked")
    release = blocked.add_wait()
    after_blocked = CallTask(ex, lambda: None).depends_on(blocked)
    free = CallTask(ex, lambda: None, name="free")
    ex.submit(blocked, after_blocked, free)
    assert free.wait(WAIT) is None
    assert not after_blocked.done
    release()
    assert after_blocked.wait(WAIT) is None


def test_random_dag_runs_each_node_once_after_its_parents(ex):
    rng = random.Random(1234)
    n = 400
    done_at = {}
    counter = [0]
    lock = threading.Lock()
    tasks = []
    parents = []
    for i in range(n):
        ps = rng.sample(range(i), k=min(i, rng.randint(0, 3)))
        parents.append(ps)

        def fn(i=i):
            with lock:
                assert i not in done_at
                done_at[i] = counter[0]
                counter[0] += 1

        t = CallTask(ex, fn, name=str(i)) if i % 3 else NopTask(ex, name=str(i))
        t.depends_on(*(tasks[p] for p in ps))
        tasks.append(t)
    order = list(range(n))
    rng.shuffle(order)
    ex.submit(*(tasks[i] for i in order))
    for t in tasks:
        assert t.wait(WAIT) is None
    for i, ps in enumerate(parents):
        if i % 3:
            for p in ps:
                if p % 3:
                    assert done_at[p] < done_at[i]


def test_failure_flows_to_every_dependent_without_running_them(ex):
    ran = []
    seen_errors = []

    def boom():
        raise ValueError("kaput")

    a = CallTask(ex, boom)
    b = CallTask(ex, lambda: ran.append("b")).depends_on(a)
    c = NopTask(ex).depends_on(b)
    c.on_complete(seen_errors.append)
    ex.submit(a, b, c)
    err = c.wait(WAIT)
    assert err is not None and "kaput" in str(err)
    assert a.error is b.error is c.error is err
    assert ran == [] and seen_errors == [err]


def test_gate_released_with_error_fails_the_task(ex):
    ran = []
    t = CallTask(ex, lambda: ran.append(1))
    release = t.add_wait()
    ex.submit(t)
    release(AbortedError("upstream failed"))
    err = t.wait(WAIT)
    assert isinstance(err, AbortedError) and ran == []


def test_depending_on_a_completed_task(ex):
    a = ex.call(lambda: None)
    a.wait(WAIT)
    b = CallTask(ex, lambda: None).depends_on(a)
    ex.submit(b)
    assert b.wait(WAIT) is None


def test_misuse_is_named(ex):
    a = ex.call(lambda: None)
    a.wait(WAIT)
    with pytest.raises(FailedPreconditionError):
        a.add_wait()
    with pytest.raises(FailedPreconditionError):
        ex.submit(a)
    other = Executor(1)
    try:
        with pytest.raises(InvalidArgumentError):
            CallTask(other, lambda: None).depends_on(CallTask(ex, lambda: None))
    finally:
        other.shutdown()
    with pytest.raises(InvalidArgumentError):
        Executor(0)


def test_long_chain_of_inline_nodes_does_not_recurse(ex):
    head = CallTask(ex, lambda: None)
    prev = head
    nodes = []
    for _ in range(20000):
        nxt = NopTask(ex).depends_on(prev)
        nodes.append(nxt)
        prev = nxt
    ex.submit(*nodes)
    ex.submit(head)
    assert prev.wait(WAIT) is None


def test_cancel_before_start(ex):
    ran = []
    t = CallTask(ex, lambda: ran.append(1))
    release = t.add_wait()
    dep = NopTask(ex).depends_on(t)
    ex.submit(t, dep)
    assert t.cancel()
    release()  # late release is ignored
    assert isinstance(t.wait(WAIT), CancelledError)
    assert isinstance(dep.wait(WAIT), CancelledError)
    assert ran == []
    assert not t.cancel()


def test_shutdown_fails_blocked_tasks_and_joins_workers():
    ex = Executor(2)
    blocked = CallTask(ex, lambda: None)
    blocked.add_wait()  # never released
    dependent = NopTask(ex).depends_on(blocked)
    errors = []
    dependent.on_complete(errors.append)
    finished = ex.call(lambda: None)
    ex.submit(blocked, dependent)
    ex.shutdown(timeout=WAIT)
    assert finished.error is None and finished.done
    assert isinstance(blocked.error, AbortedError)
    assert isinstance(errors[0], AbortedError)
    st = ex.statistics()
    assert st.closed and st.live_tasks == 0 and st.queued == 0
    assert not any(t.is_alive() for t in ex._threads)
    late = CallTask(ex, lambda: None)
    with pytest.raises(AbortedError):
        ex.submit(late)
    assert isinstance(late.error, AbortedError)
    ex.shutdown()  # idempotent


def test_shutdown_without_cancel_lets_running_work_finish():
    ex = Executor(2)
    go = threading.Event()
    started = threading.Event()
    results = []

    def slow():
        started.set()
        go.wait(WAIT)
        results.append("done")

    t = ex.call(slow)
    assert started.wait(WAIT)
    threading.Timer(0.05, go.set).start()
    ex.shutdown(timeout=WAIT)
    assert t.error is None and results == ["done"]


def test_shutdown_with_cancel_drops_queued_work():
    ex = Executor(1)
    go = threading.Event()
    started = threading.Event()

    def slow():
        started.set()
        go.wait(WAIT)

    running = ex.call(slow)
    assert started.wait(WAIT)
    queued = [ex.call(lambda: None) for _ in range(5)]
    threading.Timer(0.05, go.set).start()
    ex.shutdown(cancel=True, timeout=WAIT)
    assert running.error is None
    assert all(isinstance(q.error, AbortedError) for q in queued)


def test_idle_workers_sleep(ex):
    ex.call(lambda: None).wait(WAIT)
    deadline = threading.Event()
    for _ in range(100):  # workers park on a condition after the queue drains
        if ex.statistics().idle_workers == 2:
            break
        deadline.wait(0.01)
    assert ex.statistics().idle_workers == 2


def test_scheduler_is_generic_and_does_not_import_the_hal():
    import subprocess
    import sys

    code = ("import sys, tinyhal.scheduler; "
            "print(any(m.startswith('tinyhal.hal') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "False"


def test_many_random_gates_from_many_threads(ex):
    rng = random.Random(5)
    tasks, releases = [], []
    for i in range(2000):
        t = CallTask(ex, lambda: None, name=str(i)) if i % 2 else NopTask(ex)
        for _ in range(rng.randint(0, 3)):
            releases.append(t.add_wait())
        if tasks and rng.random() < 0.5:
            t.depends_on(rng.choice(tasks))
        tasks.append(t)
    ex.submit(*tasks)
    rng.shuffle(releases)
    chunks = [releases[i::4] for i in range(4)]
    threads = [threading.Thread(target=lambda c=c: [r() for r in c]) for c in chunks]
    for th in threads:
        th.start()
    for th in threads:
        th.join(WAIT)
    for t in tasks:
        assert t.wait(WAIT) is None
    assert ex.statistics().live_tasks == 0

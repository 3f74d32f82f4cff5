"""Unit tests of tinyhal.scheduler's worker pool: running, errors, callbacks, shutdown."""

from __future__ import annotations

import threading

import pytest

from tinyhal.errors import (
    AbortedError,
    FailedPreconditionError,
    InvalidArgumentError,
)
from tinyhal.scheduler import (
    CallTask,
    Executor,
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
    assert current_worker_index() is None


def test_independent_work_runs_while_a_worker_is_busy(ex):
    go = threading.Event()
    busy = ex.call(lambda: go.wait(WAIT))
    free = ex.call(lambda: None)
    assert free.wait(WAIT) is None
    assert not busy.done
    go.set()
    assert busy.wait(WAIT) is None


def test_an_exception_is_the_task_s_error_and_reaches_its_callbacks(ex):
    seen = []

    def boom():
        raise ValueError("kaput")

    t = CallTask(ex, boom)
    t.on_complete(seen.append)
    ex.submit(t)
    err = t.wait(WAIT)
    assert err is not None and "kaput" in str(err)
    assert seen == [err]
    late = []
    t.on_complete(late.append)  # after completion: called at once
    assert late == [err]


def test_misuse_is_named(ex):
    a = ex.call(lambda: None)
    a.wait(WAIT)
    with pytest.raises(FailedPreconditionError):
        ex.submit(a)
    other = Executor(1)
    try:
        with pytest.raises(InvalidArgumentError):
            other.submit(CallTask(ex, lambda: None))
    finally:
        other.shutdown()
    with pytest.raises(InvalidArgumentError):
        Executor(0)
    with pytest.raises(InvalidArgumentError):
        CallTask("not an executor", lambda: None)


def test_submit_after_shutdown_completes_the_task_with_aborted():
    ex = Executor(2)
    finished = ex.call(lambda: None)
    ex.shutdown(timeout=WAIT)
    assert finished.error is None and finished.done
    st = ex.statistics()
    assert st.closed and st.live_tasks == 0 and st.queued == 0
    assert not any(t.is_alive() for t in ex._threads)
    late = CallTask(ex, lambda: None)
    errors = []
    late.on_complete(errors.append)
    with pytest.raises(AbortedError):
        ex.submit(late)
    assert isinstance(late.error, AbortedError) and isinstance(errors[0], AbortedError)
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


def test_many_tasks_from_many_threads(ex):
    done = []
    lock = threading.Lock()

    def record(i):
        with lock:
            done.append(i)

    tasks = [CallTask(ex, lambda i=i: record(i), name=str(i)) for i in range(2000)]
    chunks = [tasks[i::4] for i in range(4)]
    threads = [threading.Thread(target=lambda c=c: [ex.submit(t) for t in c]) for c in chunks]
    for th in threads:
        th.start()
    for th in threads:
        th.join(WAIT)
    for t in tasks:
        assert t.wait(WAIT) is None
    assert sorted(done) == list(range(2000))
    assert ex.statistics().live_tasks == 0

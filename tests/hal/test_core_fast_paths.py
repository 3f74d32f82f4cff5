"""The C core's fast paths (`hal/native/core.c`): semaphores advanced while nothing waits,
`hal.fence.create`'s fences, joins, the reached check of a queue operation's wait and the
transient ring's placement, release and counters, each against the semantics of the
Python paths they stand in for."""

from __future__ import annotations

import functools
import gc
import os
import subprocess
import sys
import threading
import weakref

import pytest

from support.leaks import traced_growth
from tinyhal import errors
from tinyhal.hal import Fence, create_device
from tinyhal.hal.allocator import Allocator, HeapCounter
from tinyhal.hal.ringbuffer import HEAP_NAME, TransientRingbuffer
from tinyhal.hal.semaphore import (
    MAX_VALUE,
    Semaphore,
    join_fence_rows,
    normalize_wait_signal,
)


def test_advance_without_waiters_moves_the_value_and_reaches_nothing():
    sem = Semaphore()
    assert sem.advance(3) == ()
    assert sem.query() == 3
    assert sem.advance(MAX_VALUE) == ()
    assert sem.query() == MAX_VALUE


def test_advance_keeps_every_error_of_the_locked_path():
    sem = Semaphore(5)
    with pytest.raises(errors.OutOfRangeError, match="must increase"):
        sem.advance(5)
    with pytest.raises(errors.OutOfRangeError, match="current 5"):
        sem.advance(4)
    with pytest.raises(errors.InvalidArgumentError, match="signal value"):
        sem.advance(1 << 64)
    with pytest.raises(errors.InvalidArgumentError):
        sem.advance(-1)
    with pytest.raises(errors.InvalidArgumentError):
        sem.advance(6.0)
    assert sem.query() == 5
    sem.fail("broken")
    with pytest.raises(errors.AbortedError, match="broken"):
        sem.advance(9)
    with pytest.raises(errors.AbortedError, match="broken"):
        sem.query()


def test_a_timepoint_turns_advance_to_the_locked_path_and_fires_once():
    sem = Semaphore()
    seen = []
    tp = sem.on_reached(2, seen.append)
    assert tp is not None
    assert sem.advance(1) == []
    reached = sem.advance(2)
    assert reached == [tp] and tp.fired
    assert sem.advance(3) == ()  # no waiter left: the fast path again
    assert on_reached_now(sem, 3) is None


def on_reached_now(sem: Semaphore, value: int):
    return sem.on_reached(value, lambda error: None)


def test_registering_races_advance_and_every_callback_runs_once():
    """A timepoint registered while another thread advances without the lock is either
    reported reached at once or fired by that advance; never lost, never twice."""
    rounds = 2000
    sems = [Semaphore() for _ in range(rounds)]
    fired = [0] * rounds
    immediate = [0] * rounds
    start = threading.Barrier(2)

    def register() -> None:
        start.wait()
        for i, sem in enumerate(sems):
            def hit(error, i=i) -> None:
                fired[i] += 1
            if sem.on_reached(1, hit) is None:
                immediate[i] += 1

    def advance() -> None:
        start.wait()
        for sem in sems:
            sem.signal(1)

    threads = [threading.Thread(target=register), threading.Thread(target=advance)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert all(f + i == 1 for f, i in zip(fired, immediate))


def test_a_thread_blocked_on_a_created_fence_wakes_when_a_ready_barrier_signals_it():
    device = create_device("sync")
    try:
        fence = Fence.pending()
        woken = threading.Event()

        def waiter() -> None:
            fence.wait(30)
            woken.set()

        thread = threading.Thread(target=waiter)
        thread.start()
        (sem, value), = fence.points
        for _ in range(3000):  # until the waiter is registered (bounded)
            if sem.statistics().blocked_threads:
                break
            threading.Event().wait(0.001)
        device.queue_barrier(wait=None, signal=fence)
        thread.join(30)
        assert woken.is_set() and fence.query()
    finally:
        device.close()


def test_a_failed_wait_fence_fails_the_signal_of_a_queue_operation():
    device = create_device("sync")
    try:
        wait, signal = Fence.pending(), Fence.pending()
        wait.fail(errors.DataLossError("upstream"))
        device.queue_barrier(wait=wait, signal=signal)
        with pytest.raises(errors.DataLossError, match="upstream"):
            signal.wait(10)
    finally:
        device.close()


def test_pending_fence_shape():
    fence = Fence.pending()
    assert type(fence) is Fence and len(fence) == 1
    (sem, value), = fence.points
    assert type(sem) is Semaphore and value == 1 and sem.query() == 0
    assert fence.timeline == {sem: 1}
    assert sem.name == "" and sem.failure is None
    assert sem._lock is sem._lock  # made once, on first use
    assert not fence.query()
    fence.signal()
    assert fence.query()
    assert weakref.ref(fence)() is fence and weakref.ref(sem)() is sem


def test_cycles_through_timepoints_are_collected():
    fence = Fence.pending()
    (sem, _), = fence.points
    sem.on_reached(1, functools.partial(list, [fence]))  # sem -> timepoint -> fence -> sem
    refs = weakref.ref(fence), weakref.ref(sem)
    del fence, sem
    gc.collect()
    assert refs[0]() is None and refs[1]() is None


def test_join_keeps_the_largest_value_per_semaphore():
    a, b = Semaphore(), Semaphore()
    joined = Fence.join([Fence([(a, 2)]), None, Fence([(a, 5), (b, 1)]), Fence([(a, 3)])])
    assert joined.timeline == {a: 5, b: 1}
    assert len(Fence.join([None])) == 0
    with pytest.raises(TypeError):
        Fence.join([object()])


def test_join_rows_as_the_vm_passes_them():
    one, two = Fence.pending(), Fence.pending()
    assert join_fence_rows([(one,), (None,)]) is one  # a fence never changes: shared
    assert join_fence_rows([(None,), (Fence(),), (one,)]) is one
    assert join_fence_rows([(None,)]) is None
    assert join_fence_rows([]) is None
    both = join_fence_rows([(one,), (two,)])
    assert set(both.timeline) == set(one.timeline) | set(two.timeline)
    assert join_fence_rows([(object(),)]) is NotImplemented
    assert join_fence_rows([(one, two)]) is NotImplemented


def test_normalize_fast_path_equals_the_general_path():
    reached, pending = Fence.pending(), Fence.pending()
    reached.signal()
    signal = Fence.pending()
    assert normalize_wait_signal(None, signal) == ((), signal._points, True)
    assert normalize_wait_signal(reached, signal) == (reached._points, signal._points, True)
    assert normalize_wait_signal(pending, signal)[2] is False
    failed = Fence.pending()
    failed.fail("x")
    assert normalize_wait_signal(failed, signal)[2] is False
    # lists take the general path, with its checks
    (sem, _), = reached.points
    wait_points, signal_points, ok = normalize_wait_signal([(sem, 1)], signal)
    assert wait_points == [(sem, 1)] and signal_points == [signal.points[0]] and ok
    with pytest.raises(errors.InvalidArgumentError, match="does not name a Semaphore"):
        normalize_wait_signal([(object(), 1)], signal)
    odd = Fence([(object(), 1)])  # not a semaphore: the general path decides
    with pytest.raises(AttributeError):
        normalize_wait_signal(odd, signal)


def test_fast_paths_do_not_leak():
    def cycle() -> None:
        wait = Fence.pending()
        signal = Fence.pending()
        joined = Fence.join([wait, signal])
        join_fence_rows([(wait,), (signal,)])
        normalize_wait_signal(wait, signal)
        for sem, value in joined.points:
            sem.advance(value)
        normalize_wait_signal(wait, signal)

    assert traced_growth(cycle, warm=2000, measured=20000) < 64 << 10


def test_the_core_builds_into_a_cache_from_source(tmp_path):
    """An uninstalled tree builds `_core` on first use through the same helper as
    `_dispatch` (run in a child: it compiles C)."""
    code = (
        "from tinyhal.hal.native import load_compiled\n"
        "m = load_compiled('tinyhal.hal.native._not_installed_core',"
        " 'tinyhal.hal.native.core_build')\n"
        "print(m.__name__, m.SemaphoreCore.__name__)\n"
    )
    env = dict(os.environ, TINYHAL_BUILD_CACHE=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[1] == "SemaphoreCore"
    assert done.stdout.startswith("_tinyhal_not_installed_core_")


@pytest.mark.parametrize("edited", [True, False])
def test_a_module_built_in_place_warns_when_its_sources_are_newer(tmp_path, monkeypatch,
                                                                   edited):
    """An editable install runs its in-place build: edited C sources beside it (older
    than the build by more than a second) make loading it warn, so a stale module is
    named at import instead of failing later."""
    import warnings

    from tinyhal.hal.native import load_compiled

    name = f"stale_native_pkg_{int(edited)}"
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "compiled.py").write_text("VALUE = 1\n")  # stands in for the .so
    (package / "builder.py").write_text("SOURCES = ()\n")
    (package / "kernel.c").write_text("int f(void) { return 1; }\n")
    for file in ("__init__.py", "compiled.py", "builder.py"):
        os.utime(package / file, (1_000_000, 1_000_000))
    os.utime(package / "kernel.c", (1_000_100 if edited else 1_000_000,) * 2)
    monkeypatch.syspath_prepend(str(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = load_compiled(f"{name}.compiled", f"{name}.builder")
    assert module.VALUE == 1
    stale = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    if edited:
        assert len(stale) == 1 and "kernel.c" in str(stale[0].message)
    else:
        assert not stale


def test_a_free_threaded_interpreter_is_refused(monkeypatch):
    from tinyhal.hal.native import core_build

    monkeypatch.setattr(core_build.sysconfig, "get_config_var",
                        lambda name: 1 if name == "Py_GIL_DISABLED" else None)
    with pytest.raises(RuntimeError, match="free-threaded"):
        core_build.extension()


# -- the transient ring's C bookkeeping ----------------------------------------------


def test_try_commit_places_in_order_and_release_grants_parked_requests_in_order():
    ring = TransientRingbuffer(Allocator("local"), capacity=256)
    first, second = ring.pending_storage(100), ring.pending_storage(128)
    assert ring.try_commit(first) and ring.try_commit(second)
    assert (first.block.offset, second.block.offset) == (0, 128)
    assert first.address % 64 == 0 and len(first.array) == 100
    granted = []
    ring.reserve(64, lambda block, error: granted.append(("a", block.offset)))
    ring.reserve(64, lambda block, error: granted.append(("b", block.offset)))
    assert not ring.try_commit(ring.pending_storage(1))  # parked ahead: refused, in order
    ring.release(second)  # the newest: the tail is still held
    assert granted == []
    ring.release(first)
    assert granted == [("a", 0), ("b", 64)]
    assert first.block is None and second.block is None
    ring.release(first)  # released twice: nothing
    st = ring.statistics()
    assert (st.live_bytes, st.live_blocks, st.parked_requests) == (128, 2, 0)


def test_try_commit_wraps_and_refuses_when_full_or_closed():
    ring = TransientRingbuffer(capacity=256)
    a, b, c = (ring.pending_storage(64) for _ in range(3))
    assert ring.try_commit(a) and ring.try_commit(b) and ring.try_commit(c)
    ring.release(a)
    big = ring.pending_storage(128)
    assert not ring.try_commit(big)  # 64 at the end, 64 free at the start: no room
    tail = ring.pending_storage(64)
    assert ring.try_commit(tail) and tail.block.offset == 192
    wrapped = ring.pending_storage(64)
    assert ring.try_commit(wrapped) and wrapped.block.offset == 0
    assert not ring.try_commit(ring.pending_storage(1))  # full: head == tail
    ring.close(errors.AbortedError("closed"))
    for storage in (b, c, tail, wrapped):
        ring.release(storage)
    assert not ring.try_commit(ring.pending_storage(1))
    assert ring.statistics().live_bytes == 0


def test_release_ignores_storage_of_another_ring_or_kind():
    ring, other = TransientRingbuffer(capacity=256), TransientRingbuffer(capacity=256)
    theirs = other.pending_storage(10)
    assert other.try_commit(theirs)
    ring.release(theirs)
    assert theirs.block is not None and other.statistics().live_bytes == 64
    ring.release(Allocator("local").allocate(64).storage)


def test_owns_and_collection_of_a_dropped_transient():
    ring = TransientRingbuffer(capacity=128)
    dropped, kept = ring.pending_storage(64), ring.pending_storage(64)
    assert ring.try_commit(dropped) and ring.try_commit(kept)
    assert ring.owns(kept) and not ring.owns(ring.pending_storage(1))
    assert not TransientRingbuffer(capacity=128).owns(kept)
    granted = threading.Event()
    ring.reserve(64, lambda block, error: granted.set())  # parked: the ring is full
    ring.release(kept)  # the tail is still `dropped`'s
    assert not granted.is_set()
    with ring._lock:  # a collection inside the ring's locked section: deferred
        del dropped
        gc.collect()
    assert granted.wait(30)  # retired, then granted, on the reclaim thread
    assert ring.statistics().live_blocks == 1 and not ring.owns(kept)


def test_ready_and_queued_allocas_count_alike():
    """The ready path (C, no entry) and the queued path (an entry granted later) leave
    the same allocator and ring statistics behind."""
    sizes = (100, 64, 1, 0, 5000, 63)

    def run(ready: bool):
        device = create_device("sync", transient_capacity=1 << 16)
        try:
            buffers = []
            for size in sizes:
                gate = device.create_semaphore()
                wait = [] if ready else [(gate, 1)]
                buffers.append(device.queue_alloca(size, wait=wait))
                if not ready:
                    gate.signal(1)
            middle = device.allocator.statistics()
            for buffer in buffers[::2]:
                gate = device.create_semaphore()
                device.queue_dealloca(buffer, wait=[] if ready else [(gate, 1)])
                if not ready:
                    gate.signal(1)
            assert device.wait_idle(30)
            return middle, device.allocator.statistics(), device.transient.statistics()
        finally:
            device.close()

    assert run(True) == run(False)
    middle, end, ring = run(True)
    assert middle.heaps[HEAP_NAME].live_bytes == sum((s + 63) // 64 * 64 or 64 for s in sizes)
    assert ring.reservations == len(sizes) and ring.live_blocks == 3
    assert end.peak_bytes >= middle.heaps[HEAP_NAME].live_bytes


def test_ring_counters_are_heap_counters():
    allocator = Allocator("local")
    ring = TransientRingbuffer(allocator, capacity=1024)
    storage = ring.pending_storage(10)
    assert ring.try_commit(storage)
    counter = allocator.add_heap_statistics(HEAP_NAME)
    assert isinstance(counter, HeapCounter)
    assert (counter.live, counter.peak, counter.allocated, counter.count) == (64, 64, 64, 1)
    ring.release(storage)
    assert (counter.live, counter.freed, allocator.total.live) == (0, 64, 0)
    with pytest.raises(TypeError):
        ring._heap_counter = object()


# -- completion -----------------------------------------------------------------------


def test_completions_made_by_a_timepoint_are_queued_on_the_trampoline_in_order():
    device = create_device("sync")
    try:
        complete = device.work_queue.complete
        first, second = Semaphore(), Semaphore()
        seen = []

        def reached(error) -> None:
            complete([(second, 1)], None)
            complete([(second, 2)], None)
            seen.append(second.query())  # queued: runs after this callback returns

        assert first.on_reached(1, reached) is not None
        complete([(first, 1)], None)
        assert seen == [0] and second.query() == 2
        complete([(second, 3)], None)  # no trampoline left behind: the fast path again
        assert second.query() == 3
    finally:
        device.close()


def test_completion_errors_fail_the_points():
    device = create_device("sync")
    try:
        complete = device.work_queue.complete
        a, b, c = Semaphore(), Semaphore(5), Semaphore()
        complete([(a, 1), (b, 4), (c, 1)], None)  # b cannot go back: it fails, c advances
        assert a.query() == 1 and c.query() == 1
        with pytest.raises(errors.OutOfRangeError):
            b.query()
        complete((((c, 2)),), errors.DataLossError("lost"))
        with pytest.raises(errors.DataLossError):
            c.query()
    finally:
        device.close()


def test_ready_allocas_from_many_threads_keep_the_ring_and_counters_exact():
    """The ring's C path takes the allocator's lock: threads placing and releasing at
    once (with a statistics reader under the same lock) never lose a count."""
    device = create_device("task", transient_capacity=1 << 20)
    try:
        per_thread, threads_count = 400, 4
        start = threading.Barrier(threads_count + 1)
        failures = []

        def work(seed: int) -> None:
            try:
                start.wait()
                for i in range(per_thread):
                    buffer = device.queue_alloca(64 * (1 + (seed + i) % 5))
                    device.queue_dealloca(buffer)
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(threads_count)]
        for t in threads:
            t.start()
        start.wait()
        for _ in range(200):  # a reader under the allocator's lock meanwhile (bounded)
            device.allocator.statistics()
        for t in threads:
            t.join(60)
        assert not failures and not any(t.is_alive() for t in threads)
        assert device.wait_idle(30)
        ring = device.transient.statistics()
        assert ring.live_bytes == 0 and ring.live_blocks == 0
        assert ring.reservations == per_thread * threads_count
        heap = device.allocator.statistics().heaps[HEAP_NAME]
        assert heap.live_bytes == 0 and heap.allocated_bytes == heap.freed_bytes
        assert heap.allocation_count == per_thread * threads_count
    finally:
        device.close()


def _recording_over(device, buffer):
    """A finalized command buffer dispatch-free but with a fill (TRANSFER_TARGET over the
    first 64 bytes of `buffer`, a direct buffer) and a table slot; and its recording."""
    from tinyhal.hal.execution import Recording

    cb = device.create_command_buffer(binding_capacity=1)
    cb.fill(buffer, 0, 64, b"\x01")
    cb.fill(0, 0, 32, b"\x02")
    cb.finalize()
    return Recording(tuple(cb.commands), cb.max_slot + 1, len(cb.direct), 1)


def test_adopt_takes_only_live_buffers_with_the_usage_and_bytes_the_commands_need():
    from tinyhal.hal import BufferUsage, MemoryType
    from tinyhal.hal.execution import Submission

    device = create_device("sync")
    try:
        first = device.allocator.allocate(128)
        adopt = _recording_over(device, first).adopter()
        other = device.allocator.allocate(64)
        submission = adopt([other])
        assert type(submission) is Submission
        assert submission.parts[0][1] == [(other, 0, 64)]
        assert submission.addresses == [other.address] and submission.lengths == [64]
        assert submission.instrument is None
        assert adopt([device.allocator.allocate(32)]) is None  # too few bytes
        assert adopt([other, other]) is None  # another count of buffers
        assert adopt(["not a buffer"]) is None
        no_transfer = device.allocator.allocate(
            64, MemoryType.HOST_LOCAL | MemoryType.DEVICE_VISIBLE, BufferUsage.DISPATCH_STORAGE)
        assert adopt([no_transfer]) is None
        other.storage.release()
        assert adopt([other]) is None  # released
    finally:
        device.close()


@pytest.mark.parametrize("driver", ["sync", "task"])
def test_an_adopted_submission_runs_as_its_command_buffers_submit_would(driver):
    """`Device.submit` and `Device.queue_execute_dealloca` take what
    `Recording.adopter` gave for a recording binding no table: its fills run over the
    buffer it adopted, ready or once a wait is reached, and the dealloca's block goes back
    to the ring; a profile attached records the execute, without command buffers."""
    from tinyhal.hal.execution import Recording

    device = create_device(driver)
    try:
        cb = device.create_command_buffer()
        cb.fill(device.allocator.allocate(64), 0, 64, b"\x05")
        cb.finalize()
        adopt = Recording(tuple(cb.commands), cb.max_slot + 1, len(cb.direct),
                          device.concurrency).adopter()
        for gated in (False, True):
            target = device.allocator.allocate(64)
            scratch = device.queue_alloca(64)
            gate = Fence.pending() if gated else None
            freed = device.queue_execute_dealloca(adopt([target]), gate, scratch)
            if gated:
                assert not freed.query() and not scratch.storage.released
                gate.signal()
            freed.wait(timeout=60)
            assert scratch.storage.released
            assert device.read_bytes(target) == b"\x05" * 64
        target = device.allocator.allocate(64)
        with device.profiling("queue-events") as profile:
            done = Fence.pending()
            device.submit(adopt([target]), None, done)
            done.wait(timeout=60)
        assert profile.summary().queue_operations.get("execute") == 1
        assert device.read_bytes(target) == b"\x05" * 64
    finally:
        device.close()


def test_bind_slots_checks_a_table_as_the_recording_needs_and_names_failures():
    from tinyhal.hal.execution import Range

    device = create_device("sync")
    try:
        direct = device.allocator.allocate(128)
        recording = _recording_over(device, direct)
        table_buffer = device.allocator.allocate(96)
        # a buffer, a plain entry, and one of a tuple subclass (normalized in Python)
        for entry in (table_buffer, (table_buffer, 32, 64), Range(table_buffer, 16, 80)):
            addresses, lengths = [], []
            entries, has_memory = recording.bind([entry], [direct], addresses, lengths)
            base = entry[1] if isinstance(entry, tuple) else 0
            assert entries == [(table_buffer, base, 96 - base), (direct, 0, 128)]
            assert has_memory
            assert addresses == [table_buffer.address + base, direct.address]
            assert lengths == [96 - base, 128]
        with pytest.raises(errors.OutOfRangeError, match="binding slot 0 of 16 bytes"):
            recording.bind([(table_buffer, 0, 16)], [direct], [], [])
        with pytest.raises(errors.InvalidArgumentError, match="binding table entry 0"):
            recording.bind(["no buffer"], [direct], [], [])
        with pytest.raises(errors.InvalidArgumentError, match="binding table has 0 entries"):
            recording.bind([], [direct], [], [])
        direct.storage.release()
        with pytest.raises(errors.FailedPreconditionError):
            recording.bind([table_buffer], [direct], [], [])
    finally:
        device.close()


def test_bind_slots_refuses_a_range_whose_end_overflows():
    """Offsets and lengths that only fit the buffer by wrapping around 64 bits are
    refused as the Python check refuses them."""
    device = create_device("sync")
    try:
        direct = device.allocator.allocate(128)
        recording = _recording_over(device, direct)
        table_buffer = device.allocator.allocate(96)
        with pytest.raises(errors.Error):
            recording.bind([(table_buffer, 2**62, 2**62)], [direct], [], [])
        with pytest.raises(errors.Error):
            recording.bind([(table_buffer, 2**70, 0)], [direct], [], [])
    finally:
        device.close()


def test_a_reached_fence_is_a_new_semaphore_at_its_point():
    one, two = Fence.reached(), Fence.reached()
    assert one.query() and two.query()
    assert list(one.timeline) != list(two.timeline)  # each its own semaphore
    assert [value for _sem, value in one.points] == [1]


def test_fences_reached_is_the_reached_check_of_a_wait_on_all_of_them():
    from tinyhal.hal.semaphore import fences_reached

    done, pending, failed = Fence.reached(), Fence.pending(), Fence.pending()
    failed.fail(errors.AbortedError("gone"))
    assert fences_reached((done, None)) is True
    assert fences_reached([]) is True
    assert fences_reached((done, pending)) is False
    assert fences_reached((failed,)) is False  # a failure is the waiter's to report
    assert fences_reached((done, "not a fence")) is NotImplemented
    assert fences_reached(iter([done])) is NotImplemented


def test_any_released_reads_each_buffers_storage():
    from tinyhal.hal.native import core

    device = create_device("sync")
    try:
        buffers = [device.allocator.allocate(64), device.queue_alloca(64)]
        assert core.any_released(buffers) is False
        device.queue_dealloca(buffers[1])
        assert core.any_released(buffers) is True
        assert core.any_released([buffers[0], "not a buffer"]) is True
        assert core.any_released(tuple(buffers[:1])) is True  # a list only
    finally:
        device.close()

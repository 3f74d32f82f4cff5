"""Behaviour specific to the `task` driver: out-of-order execution, tiling, shutdown."""

from __future__ import annotations

import contextlib
import ctypes
import threading

import numpy as np
import pytest

from tinyhal import errors, hal
from tinyhal.hal import BufferView, KernelExport, build_executable

T = 30

KERNELS = r"""
#include <time.h>
/* out[wg] = processor id + 1. The first 16 slots of binding 0 double as arrival flags:
 * a workgroup marks its processor, then waits (at most 5 s) until two processors have
 * arrived, so the test does not depend on how fast the OS wakes the second worker. */
static int who(const tinyhal_environment_t* env, const tinyhal_dispatch_state_t* d,
               const tinyhal_workgroup_state_t* w) {
  uint32_t* out = (uint32_t*)d->binding_ptrs[0];
  uint32_t* flags = out + d->workgroup_count_x;
  __atomic_store_n(&flags[w->processor_id & 15u], 1u, __ATOMIC_SEQ_CST);
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    uint32_t n = 0;
    for (int i = 0; i < 16; ++i) n += __atomic_load_n(&flags[i], __ATOMIC_SEQ_CST);
    if (n >= 2u) break;
    clock_gettime(CLOCK_MONOTONIC, &t);
    if (t.tv_sec - t0.tv_sec > 5) break;
  }
  out[w->workgroup_id_x] = w->processor_id + 1u;
  return 0;
}
/* out[wg] = 1. Workgroups below GATED_FROM busy-wait 200 us first; the others wait (at
 * most 5 s) for the flag in binding 1, which the test sets after `submit` returned, and
 * write 2 if it never came. */
#define GATED_FROM 64u
static int gated(const tinyhal_environment_t* env, const tinyhal_dispatch_state_t* d,
                 const tinyhal_workgroup_state_t* w) {
  uint32_t* out = (uint32_t*)d->binding_ptrs[0];
  const uint32_t* flag = (const uint32_t*)d->binding_ptrs[1];
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    clock_gettime(CLOCK_MONOTONIC, &t);
    long us = (t.tv_sec - t0.tv_sec) * 1000000L + (t.tv_nsec - t0.tv_nsec) / 1000L;
    if (w->workgroup_id_x < GATED_FROM ? us >= 200 : __atomic_load_n(flag, __ATOMIC_ACQUIRE)) {
      break;
    }
    if (us > 5000000L) {
      out[w->workgroup_id_x] = 2u;
      return 0;
    }
  }
  out[w->workgroup_id_x] = 1u;
  return 0;
}
/* out[i] = in[i] * 2 + 1, 64 items per workgroup */
static int step(const tinyhal_environment_t* env, const tinyhal_dispatch_state_t* d,
                const tinyhal_workgroup_state_t* w) {
  const int32_t* in = (const int32_t*)d->binding_ptrs[0];
  int32_t* out = (int32_t*)d->binding_ptrs[1];
  uint32_t base = w->workgroup_id_x * 64u;
  for (uint32_t i = base; i < base + 64u; ++i) out[i] = in[i] * 2 + 1;
  return 0;
}
"""


@pytest.fixture(scope="module")
def kernels() -> bytes:
    return build_executable(KERNELS, [KernelExport("who", binding_count=1),
                                      KernelExport("step", binding_count=2),
                                      KernelExport("gated", binding_count=2)],
                            name="task_kernels")


@pytest.fixture
def task_device():
    dev = hal.create_device("task", workers=2)
    yield dev
    dev.close()


def test_independent_work_overtakes_blocked_work(task_device):
    dev = task_device
    gate, blocked, free = (dev.create_semaphore() for _ in range(3))
    a = dev.allocator.allocate(1 << 20)
    dev.queue_fill(a, 0, 1 << 20, b"\x01", wait=[(gate, 1)], signal=[(blocked, 1)])
    dev.queue_fill(a, 0, 1 << 20, b"\x02", signal=[(free, 1)])  # queued later, runs first
    free.wait(1, timeout=T)
    assert blocked.query() == 0
    gate.signal(1)
    blocked.wait(1, timeout=T)


@pytest.mark.parametrize("inline_us", [2000, 1])
def test_dispatch_is_tiled_across_workers(kernels, inline_us):
    # With inline_us=1 the submitting thread pauses after a first, one-workgroup dispatch
    # and whoever leads the stream on (a worker, or the thread waiting for it) still
    # has the helpers join the dispatch that follows.
    dev = hal.create_device("task", workers=2, inline_us=inline_us)
    try:
        exe = dev.load_executable(kernels)
        n = 512
        a = dev.allocator.allocate(4 * 64)
        b = dev.allocator.allocate(4 * 64)
        out = dev.allocator.allocate(4 * n + 64)  # + arrival flags
        cb = dev.create_command_buffer()
        cb.dispatch(exe, "step", (1, 1, 1), bindings=[a, b])
        cb.barrier()
        cb.dispatch(exe, "who", (n, 1, 1), bindings=[out])
        cb.finalize()
        s = dev.create_semaphore()
        dev.submit(cb, signal=[(s, 1)])
        s.wait(1, timeout=T)
        ids = BufferView(out, (n + 16,), 0x10000020).to_numpy()[:n]
        assert ids.min() >= 1  # every workgroup ran
        assert set(ids.tolist()) == {1, 2}  # on both workers (processor ids 0 and 1)
    finally:
        dev.close()


@pytest.mark.parametrize("inline_us", [1000, 0])
def test_a_long_stream_does_not_hold_up_the_submitting_thread(kernels, inline_us):
    # 1000: the submitter leads for ~1 ms (a few of the 64 slow workgroups), then a worker
    # leads on; 0: a worker leads from the start. Either way `submit` returns while the
    # gated workgroups still wait for a flag that only this thread sets afterwards.
    dev = hal.create_device("task", workers=2, inline_us=inline_us)
    try:
        exe = dev.load_executable(kernels)
        n = 64 + 8
        out = dev.allocator.allocate(4 * n)
        flag = dev.allocator.allocate(64)
        dev.write_bytes(flag, bytes(64))
        cb = dev.create_command_buffer()
        cb.dispatch(exe, "gated", (n, 1, 1), bindings=[out, flag])
        cb.finalize()
        s = dev.create_semaphore()
        dev.submit(cb, signal=[(s, 1)])
        ctypes.c_uint32.from_address(flag.address).value = 1
        s.wait(1, timeout=T)
        assert BufferView(out, (n,), 0x10000020).to_numpy().tolist() == [1] * n
    finally:
        dev.close()


def test_inline_us_option():
    for bad in (-1, 1.5, "1"):
        with pytest.raises(errors.InvalidArgumentError, match="inline_us"):
            hal.create_device("task", inline_us=bad)


@pytest.mark.parametrize("inline_us", [2000, 1])
def test_barriers_order_dispatches_inside_a_command_buffer(kernels, inline_us):
    # inline_us=1: the submitter pauses at once (inside the first dispatch or before the
    # next), and a worker leads the rest on from where it stopped.
    dev = hal.create_device("task", workers=2, inline_us=inline_us)
    try:
        _run_step_chain(dev, kernels)
    finally:
        dev.close()


def _run_step_chain(dev, kernels, signal=None, wait_on: threading.Thread | None = None):
    """Ten dependent dispatches over 4096 ints, checked. With `wait_on`, that thread is
    started after `submit` and waits for the result instead of this one."""
    exe = dev.load_executable(kernels)
    n = 64 * 64
    x = np.arange(n, dtype=np.int32)
    a = BufferView.from_numpy(dev, x).buffer
    b = dev.allocator.allocate(4 * n)
    cb = dev.create_command_buffer()
    for i in range(10):
        src, dst = (a, b) if i % 2 == 0 else (b, a)
        cb.dispatch(exe, "step", (n // 64, 1, 1), bindings=[src, dst])
        cb.barrier()
    cb.finalize()
    s = signal or dev.create_semaphore()
    dev.submit(cb, signal=[(s, 1)])
    if wait_on is not None:
        wait_on.start()
        wait_on.join(T)
        assert not wait_on.is_alive(), "the waiting thread did not lead the paused stream"
    s.wait(1, timeout=T)
    expected = x.astype(np.int64)
    for _ in range(10):
        expected = expected * 2 + 1
    assert np.array_equal(BufferView(a, (n,), 0x10000020).to_numpy(), expected.astype(np.int32))


def test_close_fails_waiting_work_and_leaves_nothing_hanging(kernels):
    dev = hal.create_device("task", workers=2)
    gate, s, t = (dev.create_semaphore() for _ in range(3))
    buf = dev.allocator.allocate(4096)
    exe = dev.load_executable(kernels)
    cb = dev.create_command_buffer()
    cb.dispatch(exe, "step", (16, 1, 1), bindings=[buf, buf])
    cb.finalize()
    dev.submit(cb, wait=[(gate, 1)], signal=[(s, 1)])
    dev.queue_barrier(wait=[(s, 1)], signal=[(t, 1)])
    done = dev.create_semaphore()
    dev.queue_fill(buf, 0, 4096, b"\x00", signal=[(done, 1)])
    done.wait(1, timeout=T)
    dev.close()
    for sem in (s, t):
        with pytest.raises(errors.AbortedError):
            sem.wait(1, timeout=T)
    st = dev.statistics()
    assert st.closed and st.live_tasks == 0 and st.queued == 0 and st.running == 0
    assert not any(th.is_alive() for th in dev.executor._threads)
    with pytest.raises(errors.FailedPreconditionError, match="closed"):
        dev.queue_barrier()
    gate.signal(1)  # late signal: nothing left to run, nothing breaks
    dev.close()


def test_kernel_failure_stops_the_other_tiles_and_fails_dependents(task_device):
    src = r"""
static int fail_at_7(const tinyhal_environment_t* env, const tinyhal_dispatch_state_t* d,
                     const tinyhal_workgroup_state_t* w) {
  return w->workgroup_id_x == 7 ? 13 : 0;
}
"""
    exe = task_device.load_executable(build_executable(src, ["fail_at_7"], name="fail7"))
    cb = task_device.create_command_buffer()
    cb.dispatch(exe, 0, (64, 1, 1))
    cb.finalize()
    s, t = task_device.create_semaphore(), task_device.create_semaphore()
    task_device.submit(cb, signal=[(s, 1)])
    task_device.queue_barrier(wait=[(s, 1)], signal=[(t, 1)])
    for sem in (s, t):
        with pytest.raises(errors.InternalError, match=r"workgroup \(7, 0, 0\)"):
            sem.wait(1, timeout=T)


def test_workers_option(task_device):
    assert task_device.concurrency == 2
    dev = hal.create_device("task", workers=1)
    try:
        assert dev.query("hal.device", "concurrency") == 1
    finally:
        dev.close()
    with pytest.raises(errors.InvalidArgumentError):
        hal.create_device("task", workers=0)


def test_a_dropped_device_stops_its_workers():
    import gc

    dev = hal.create_device("task", workers=2)
    threads = list(dev.executor._threads)
    s = dev.create_semaphore()
    dev.queue_barrier(signal=[(s, 1)])
    s.wait(1, timeout=T)
    del dev
    gc.collect()
    for th in threads:
        th.join(T)
        assert not th.is_alive()


class _BlockingSource:
    """A file object whose read holds the executor worker running it until released."""

    def __init__(self, started: threading.Semaphore, release: threading.Event) -> None:
        self.started, self.release = started, release

    def seek(self, offset: int) -> None:
        pass

    def readinto(self, view) -> int:
        self.started.release()
        self.release.wait(3 * T)  # released by the test (a bound, should it fail)
        view[:] = bytes(len(view))
        return len(view)


@pytest.mark.parametrize("chained", [False, True])
def test_a_thread_waiting_for_a_handed_off_stream_leads_it(kernels, chained):
    # Both executor workers are held by host reads, so a stream its submitter paused
    # (inline_us=1) completes only if the thread waiting for it leads it on; `chained`:
    # that thread waits on a barrier behind the stream, not on the stream's own signal.
    dev = hal.create_device("task", workers=2, inline_us=1)
    started, release = threading.Semaphore(0), threading.Event()
    try:
        scratch = dev.allocator.allocate(64)
        held = dev.create_semaphore()
        for i in range(dev.executor.worker_count):
            dev.queue_read(_BlockingSource(started, release), 0, scratch, 0, 64,
                           signal=[(held, i + 1)] if i == 0 else ())
        for _ in range(dev.executor.worker_count):
            assert started.acquire(timeout=T)
        s, t = dev.create_semaphore(), dev.create_semaphore()
        waited = (t, 1) if chained else (s, 1)
        waiter_done = threading.Event()

        def waiter() -> None:
            waited[0].wait(waited[1])  # no deadline: it may lead offered work
            waiter_done.set()

        thread = threading.Thread(target=waiter, daemon=True)
        if chained:
            dev.queue_barrier(wait=[(s, 1)], signal=[(t, 1)])
        _run_step_chain(dev, kernels, signal=s, wait_on=thread)
        assert waiter_done.is_set()
    finally:
        release.set()
        dev.close()


@pytest.mark.parametrize("shift", [None, 4096, -4096])
def test_large_fills_and_copies_are_shared_in_tiles_and_exact(task_device, shift):
    # Over 64 KiB a fill or copy is split into tiles the helpers share (as IREE's task
    # executor does); a copy whose ranges overlap (`shift`: within one buffer) runs whole,
    # with memmove's result.
    dev = task_device
    n = (1 << 20) + 4 * 37  # not a whole number of tiles
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, n + 8192, dtype=np.uint8)
    a = dev.allocator.allocate(n + 8192)
    dev.write_bytes(a, data.tobytes())
    b = dev.allocator.allocate(n + 8192)
    cb = dev.create_command_buffer()
    cb.fill(b, 4, n, b"\x01\x02\x03\x04")
    cb.barrier()
    expected_b = np.zeros(n + 8192, np.uint8)
    expected_b[4 : 4 + n] = np.tile(np.array([1, 2, 3, 4], np.uint8), n // 4)
    expected_a = data.copy()
    if shift is None:
        cb.copy(a, 4096, b, 0, n)
        expected_b[0:n] = data[4096 : 4096 + n]
    else:
        src, dst = (0, shift) if shift > 0 else (-shift, 0)
        cb.copy(a, src, a, dst, n)
        expected_a[dst : dst + n] = data[src : src + n]
    cb.finalize()
    s = dev.create_semaphore()
    dev.submit(cb, signal=[(s, 1)])
    s.wait(1, timeout=T)
    assert np.array_equal(np.frombuffer(dev.read_bytes(a), np.uint8), expected_a)
    assert np.array_equal(np.frombuffer(dev.read_bytes(b), np.uint8), expected_b)


def test_an_interrupted_waiter_still_completes_the_stream_it_led():
    # The waiting thread leads a handed-off stream (inline_us=1) and is interrupted (a
    # signal handler raising) while it does: the stream still ends, its signal fails
    # rather than hanging, the interrupt reaches the waiter, and the device closes.
    from support.child import run_child

    out = run_child(r"""
        import signal, time
        from tinyhal import errors, hal
        from tinyhal.hal import KernelExport, build_executable

        SOURCE = r'''
        #include <time.h>
        static int slow(const tinyhal_environment_t* env, const tinyhal_dispatch_state_t* d,
                        const tinyhal_workgroup_state_t* w) {
          struct timespec t0, t;
          clock_gettime(CLOCK_MONOTONIC, &t0);
          do { clock_gettime(CLOCK_MONOTONIC, &t); }
          while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 20000000L);
          ((unsigned*)d->binding_ptrs[0])[w->workgroup_id_x] = 1u;
          return 0;
        }
        '''

        class Interrupted(BaseException):
            pass

        def interrupt(signum, frame):
            raise Interrupted()

        dev = hal.create_device("task", workers=2, inline_us=1)
        exe = dev.load_executable(build_executable(
            SOURCE, [KernelExport("slow", binding_count=1)], name="slow_kernels"))
        out = dev.allocator.allocate(4 * 16)
        cb = dev.create_command_buffer()
        for _ in range(8):
            cb.dispatch(exe, "slow", (16, 1, 1), bindings=[out])
            cb.barrier()
        cb.finalize()
        s = dev.create_semaphore()
        signal.signal(signal.SIGALRM, interrupt)
        dev.submit(cb, signal=[(s, 1)])
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        try:
            s.wait(1)
            print("not interrupted")
        except Interrupted:
            print("interrupted")
        try:
            s.wait(1, timeout=30)
            print("signalled")
        except errors.Error as exc:
            print("failed:", type(exc).__name__)
        dev.close()
        print("closed")
    """, timeout=90)
    lines = out.split()
    assert lines == ["interrupted", "failed:", "AbortedError", "closed"], out


@contextlib.contextmanager
def every_worker_busy(dev):
    """Keeps every executor worker of `dev` busy for the block, so a stream handed off
    (inline_us=0) stays queued on the executor while the waiting thread leads it through
    the offer at its signal point."""
    release = threading.Event()
    started = threading.Semaphore(0)

    def occupy():
        started.release()
        release.wait(T)

    watchdog = threading.Timer(T, release.set)  # bounds the untimed waits in the block
    watchdog.start()
    try:
        for _ in range(dev.executor.worker_count):
            dev.executor.call(occupy, name="occupy")
        for _ in range(dev.executor.worker_count):
            assert started.acquire(timeout=T)
        yield
    finally:
        watchdog.cancel()
        release.set()


def test_work_led_by_its_waiter_frees_its_memory_before_the_wait_returns():
    # The queued task still holds the stream when the wait returns: the buffers must not
    # be alive through it (the race a loaded machine showed as live bytes after trim()).
    dev = hal.create_device("task", workers=2, inline_us=0)
    try:
        with every_worker_busy(dev):
            buffer = dev.allocator.allocate(1 << 16)
            done = dev.create_semaphore()
            dev.queue_fill(buffer, 0, 1 << 16, b"\x07", signal=[(done, 1)])
            del buffer
            done.wait(1)  # untimed: it leads the offered stream itself
            assert dev.executor.statistics().queued >= 1  # the handed-off task is queued
            assert dev.allocator.statistics().live_bytes == 0
    finally:
        dev.close()


def test_a_stream_its_waiter_led_returns_its_native_program_while_the_task_is_queued():
    # The executor's task for the stream its waiter led stays queued, and must not keep
    # the stream (and through it the recording's native program) out of the pool.
    dev = hal.create_device("task", workers=2, inline_us=0)
    try:
        with every_worker_busy(dev):
            buffer = dev.allocator.allocate(1 << 16)
            cb = dev.create_command_buffer("reusable", binding_capacity=1)
            cb.fill(0, 0, 1 << 16, b"\x07")
            cb.finalize()
            done = dev.create_semaphore()
            dev.submit(cb, signal=[(done, 1)], binding_table=[buffer])
            done.wait(1)  # untimed: it leads the offered stream itself
            assert dev.executor.statistics().queued >= 1  # the handed-off task is queued
            assert len(cb.recording.streams) == 1  # the program is back in the pool
    finally:
        dev.close()

"""The queue owns what it uses: dropping every host reference while work is in flight,
closing the device with work in flight and exiting the interpreter with work in flight
are safe on every driver.

Each scenario runs in a child process (see `support.child`), so a kernel writing freed
memory is a failed test rather than a dead test runner. Freed memory is reused on
purpose (fresh numpy arrays of the same sizes) before the work runs, and buffers are
256 KiB or more so glibc returns them to the OS: a missing reference shows as a crash
or as wrong bytes.
"""

from __future__ import annotations

import pytest

from support.child import run_child

PRELUDE = """
import gc, sys
import numpy as np
from support.executables import compile_executable
from tinyhal import errors, hal

driver = sys.argv[1]
dev = hal.create_device(driver)
EXE = compile_executable("elementwise_3d")
T = 60
WG = 1 << 14            # workgroups of 4 floats: 256 KiB buffers
N = 4 * WG

def f32_bits(x):
    return int(np.array(x, np.float32).view(np.uint32))

def churn():
    # Reuse whatever was freed, so a dangling address points at someone else's bytes.
    gc.collect()
    return [np.full(4 * N, 0xAB, np.uint8) for _ in range(8)]

def live():
    gc.collect()
    return dev.allocator.statistics().live_bytes
"""


def test_dropping_every_host_reference_in_flight_is_safe(driver):
    out = run_child(PRELUDE + """
baseline = live()
a_expected = np.arange(N, dtype=np.float32)
b_expected = np.full(N, 0.5, np.float32)
for round_ in range(3):
    gate, done = dev.create_semaphore(), dev.create_semaphore()
    result = dev.allocator.allocate(4 * N)          # the only buffer the host keeps
    host_out = np.zeros(N, np.float32)              # kept: receives a queue_write

    def submit_all():
        exe = dev.load_executable(EXE)
        a = dev.allocator.allocate(4 * N)
        b = dev.allocator.allocate(4 * N)
        mid = dev.allocator.allocate(4 * N)
        s = [dev.create_semaphore() for _ in range(8)]
        dev.queue_update(np.arange(N, dtype=np.float32), a, wait=[(gate, 1)],
                         signal=[(s[0], 1)])
        dev.queue_read(np.full(N, 0.5, np.float32).tobytes(), 0, b, 0, 4 * N,
                       wait=[(s[0], 1)], signal=[(s[1], 1)])
        # reusable command buffer + binding table: mid = a * 2 + b
        cb = dev.create_command_buffer("reusable", binding_capacity=3)
        cb.dispatch(exe, "fma_3d", (WG, 1, 1), constants=[f32_bits(2.0), 0],
                    bindings=[0, 1, 2])
        cb.finalize()
        dev.submit(cb, wait=[(s[1], 1)], signal=[(s[2], 1)], binding_table=[a, b, mid])
        # a transient, dropped without queue_dealloca: t = mid * 1 + a + 1
        t = dev.queue_alloca(4 * N, wait=[(s[2], 1)], signal=[(s[3], 1)])
        cb2 = dev.create_command_buffer()
        cb2.dispatch(exe, "fma_3d", (WG, 1, 1), constants=[f32_bits(1.0), 1],
                     bindings=[mid, a, t])
        cb2.barrier()
        cb2.copy(t, 0, result, 0, 4 * N)
        cb2.finalize()
        dev.submit(cb2, wait=[(s[3], 1)], signal=[(s[4], 1)])
        # queue_write into host memory the host drops, and into memory it keeps
        dev.queue_write(result, 0, np.empty(N, np.float32), 0, 4 * N,
                        wait=[(s[4], 1)], signal=[(s[5], 1)])
        dev.queue_write(result, 0, host_out, 0, 4 * N, wait=[(s[5], 1)],
                        signal=[(done, 1)])

    submit_all()
    junk = churn()
    in_flight = dev.allocator.statistics().live_bytes
    assert in_flight >= baseline + 4 * 4 * N, (in_flight, baseline)
    gate.signal(1)
    done.wait(1, timeout=T)
    expected = (a_expected * 2 + b_expected) + a_expected + 1
    assert np.array_equal(host_out, expected), round_
    got = dev.read_array(result).view(np.float32)
    assert np.array_equal(got, expected), round_
    del result, junk
    assert dev.wait_idle(T)
    after = live()
    assert after == baseline, (round_, after, baseline)
dev.close()
print("ok")
""", driver)
    assert out.strip().endswith("ok")


def test_close_with_work_in_flight(driver):
    out = run_child(PRELUDE + """
baseline = live()
never = dev.create_semaphore()
ran, waited = [], []

def submit_all():
    exe = dev.load_executable(EXE)
    prev = None
    for i in range(6):
        x = dev.allocator.allocate(4 * N)
        y = dev.allocator.allocate(4 * N)
        cb = dev.create_command_buffer()
        cb.fill(x, 0, 4 * N, np.float32(1.0))
        cb.barrier()
        for _ in range(4):
            cb.dispatch(exe, "fma_3d", (WG, 1, 1), constants=[f32_bits(1.0), 1],
                        bindings=[x, x, y])
            cb.barrier()
        cb.finalize()
        s = dev.create_semaphore()
        dev.submit(cb, wait=[] if prev is None else [(prev, 1)], signal=[(s, 1)])
        ran.append(s)
        prev = s
    # work that can never start: it must fail with ABORTED, not hang or run
    z = dev.allocator.allocate(4 * N)
    cb = dev.create_command_buffer()
    cb.dispatch(exe, "fma_3d", (WG, 1, 1), constants=[0, 0], bindings=[z, z, z])
    cb.finalize()
    w = dev.create_semaphore()
    dev.submit(cb, wait=[(never, 1)], signal=[(w, 1)])
    waited.append(w)
    t = dev.queue_alloca(4 * N, wait=[(never, 1)], signal=[(dev.create_semaphore(), 1)])

submit_all()
junk = churn()
dev.close()
assert dev.in_flight == 0
for s in ran:                      # running and queued-behind-running work completed
    s.wait(1, timeout=T)
for w in waited:
    try:
        w.wait(1, timeout=T)
    except errors.AbortedError:
        pass
    else:
        raise AssertionError("work waiting on a never-signalled semaphore ran")
try:
    dev.queue_barrier()
except errors.FailedPreconditionError:
    pass
else:
    raise AssertionError("a closed device accepted work")
never.signal(1)                    # a late signal finds nothing to run
del junk
assert live() == baseline, (live(), baseline)
dev.close()
print("ok")
""", driver)
    assert out.strip().endswith("ok")


@pytest.mark.parametrize("waiting", [False, True], ids=["running", "running+waiting"])
@pytest.mark.parametrize("drain", ["60", "0"], ids=["drain", "no-drain"])
def test_interpreter_exit_with_work_in_flight(driver, waiting, drain):
    # With no drain budget the process exits while kernels still run: their memory is
    # held by the device's resource sets, so teardown frees nothing under them.
    out = run_child(PRELUDE + """
import tinyhal.hal.device
tinyhal.hal.device.EXIT_DRAIN_SECONDS = float(sys.argv[3])
waiting = sys.argv[2] == "1"
exe = dev.load_executable(EXE)
never = dev.create_semaphore()
prev = None
for i in range(8):
    x = dev.allocator.allocate(4 * N)
    y = dev.allocator.allocate(4 * N)
    cb = dev.create_command_buffer()
    for _ in range(4):
        cb.dispatch(exe, "fma_3d", (WG, 1, 1), constants=[f32_bits(1.0), 1],
                    bindings=[x, x, y])
        cb.barrier()
    cb.finalize()
    s = dev.create_semaphore()
    wait = [] if prev is None else [(prev, 1)]
    if waiting and i == 7:
        wait.append((never, 1))
    dev.submit(cb, wait=wait, signal=[(s, 1)])
    prev = s
del x, y, cb, exe
print("exiting", flush=True)
""", driver, "1" if waiting else "0", drain)
    assert "exiting" in out


def test_close_at_random_moments_leaves_every_signal_decided(driver):
    out = run_child(PRELUDE + """
import random, threading, time
choice = random.Random(99)
exe_bytes = EXE
for round_ in range(20):
    dev = hal.create_device(driver)
    exe = dev.load_executable(exe_bytes)
    baseline = live()
    gates = [dev.create_semaphore() for _ in range(3)]
    signals = []
    for i in range(30):
        x = dev.allocator.allocate(4 * 4096)
        wait = [(choice.choice(gates + [s for s, _ in signals[-5:]]), 1)] if i else []
        s = dev.create_semaphore()
        kind = choice.random()
        if kind < 0.5:
            cb = dev.create_command_buffer()
            cb.dispatch(exe, "fma_3d", (4096 // 4, 1, 1), constants=[0, 1],
                        bindings=[x, x, x])
            cb.finalize()
            dev.submit(cb, wait=wait, signal=[(s, 1)])
        elif kind < 0.7:
            t = dev.queue_alloca(4096, wait=wait, signal=[(s, 1)])
        elif kind < 0.85:
            dev.queue_update(np.ones(4096, np.uint8), x, 0, wait=wait, signal=[(s, 1)])
        else:
            dev.queue_barrier(wait=wait, signal=[(s, 1)])
        signals.append((s, i))
    opener = threading.Thread(target=lambda: [g.signal(1) for g in gates[:2]])
    opener.start()
    time.sleep(choice.uniform(0, 0.003))
    dev.close()
    opener.join(T)
    for s, i in signals:
        try:
            s.wait(1, timeout=T)
        except errors.AbortedError:
            pass
    for name in ("x", "t", "cb", "exe"):
        globals().pop(name, None)
    assert dev.in_flight == 0
    assert live() == baseline, (round_, live(), baseline)
print("ok")
""", driver)
    assert out.strip().endswith("ok")


def test_a_collection_inside_a_locked_section_frees_transients_without_deadlock(driver):
    # A garbage collection can run at any allocation, also inside the ringbuffer's and
    # the allocator's locked sections; the transient it frees must not wait for a lock
    # its own thread holds. Simulated by collecting at allocations made under the
    # allocator's lock and inside the ring's locked section (the same lock; the ring's
    # placement itself is C, where a collection can run at the storage's memoryview).
    out = run_child(PRELUDE + """
import time
import faulthandler
from tinyhal.hal import allocator as allocator_module
faulthandler.dump_traceback_later(50, exit=True)
heap_stats_init = allocator_module.HeapStatistics.__init__

def collecting(init):
    def wrapped(*args):
        gc.collect()
        return init(*args)
    return wrapped

dev = hal.create_device(driver, transient_capacity=1 << 16)
baseline = live()
for i in range(20):
    s = dev.create_semaphore()
    t = dev.queue_alloca(4 << 10, signal=[(s, 1)])
    s.wait(1, timeout=T)
    held = dev.allocator.allocate(4 << 10)
    cycle = [t, held]
    cycle.append(cycle)           # garbage only a collection frees
    del t, held, cycle
    allocator_module.HeapStatistics.__init__ = collecting(heap_stats_init)
    try:
        dev.allocator.statistics()
        with dev.allocator.lock:  # the ring's lock
            gc.collect()
        s2 = dev.create_semaphore()
        t2 = dev.queue_alloca(4 << 10, signal=[(s2, 1)])
        s2.wait(1, timeout=T)
    finally:
        allocator_module.HeapStatistics.__init__ = heap_stats_init
    dev.queue_dealloca(t2)
    del t2
deadline = time.monotonic() + T
while live() != baseline:         # retirements deferred to the reclaim thread land
    assert time.monotonic() < deadline, (live(), baseline)
    time.sleep(0.01)
assert dev.transient.statistics().live_bytes == 0
dev.close()
print("ok")
""", driver)
    assert out.strip().endswith("ok")

"""The driver interface (`tinyhal.hal.queue`): a driver object performs ready queue
operations and reports them done; the public `Device` validates, its `WorkQueue` holds
resource sets, waits and completes."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

from tinyhal import errors
from tinyhal.hal.device import Device
from tinyhal.hal.drivers import emu, sync, task
from tinyhal.hal.queue import Driver, run_capturing
from tinyhal.hal.stream import Stream

T = 30


class BareDriver(Driver):
    """A driver that implements nothing: what it lacks is UNIMPLEMENTED, not a crash."""

    name = "bare"


class LateDriver(Driver):
    """Runs commands on a thread of its own when told to, reporting `done` twice."""

    name = "late"

    def __init__(self) -> None:
        self.go = threading.Event()
        self.threads: list[threading.Thread] = []

    def perform(self, operation, payload, done, submission_id, wait, signal, queue):
        if operation != "execute":
            return super().perform(operation, payload, done, submission_id, wait, signal,
                                   queue)

        def run():
            self.go.wait(T)
            error = run_capturing(Stream(payload).run)
            done(error)
            done(errors.InternalError("a second report is ignored"))

        th = threading.Thread(target=run)
        self.threads.append(th)
        th.start()


def test_a_driver_without_hooks_fails_work_with_unimplemented():
    dev = Device(BareDriver())
    buf = dev.allocator.allocate(256)
    s = dev.create_semaphore()
    dev.queue_fill(buf, 0, 256, b"\x01", signal=[(s, 1)])
    with pytest.raises(errors.UnimplementedError, match="'bare' cannot execute"):
        s.wait(1, timeout=T)
    r = dev.create_semaphore()
    dev.queue_read(b"\x00" * 16, 0, buf, 0, 16, signal=[(r, 1)])
    with pytest.raises(errors.UnimplementedError, match="'bare' cannot run host work"):
        r.wait(1, timeout=T)
    # Work the device does itself needs no driver: barriers and transient memory.
    b, a, d = (dev.create_semaphore() for _ in range(3))
    dev.queue_barrier(signal=[(b, 1)])
    t = dev.queue_alloca(1024, wait=[(b, 1)], signal=[(a, 1)])
    dev.queue_dealloca(t, wait=[(a, 1)], signal=[(d, 1)])
    d.wait(1, timeout=T)
    assert dev.in_flight == 0
    dev.close()


def test_the_device_holds_resources_until_the_driver_reports_done():
    driver = LateDriver()
    dev = Device(driver)
    baseline = dev.allocator.statistics().live_bytes
    s = dev.create_semaphore()
    out = dev.allocator.allocate(1 << 20)

    def submit():
        src = dev.allocator.allocate(1 << 20)
        cb = dev.create_command_buffer()
        cb.fill(src, 0, 1 << 20, np.uint32(0x01020304))
        cb.barrier()
        cb.copy(src, 0, out, 0, 1 << 20)
        cb.finalize()
        dev.submit(cb, signal=[(s, 1)])

    submit()
    gc.collect()
    assert dev.in_flight == 1
    assert dev.allocator.statistics().live_bytes == baseline + (2 << 20)
    assert not dev.wait_idle(0.01)
    driver.go.set()
    s.wait(1, timeout=T)  # the second `done` (an error) changed nothing
    assert dev.wait_idle(T)
    assert dev.allocator.statistics().live_bytes == baseline + (1 << 20)
    assert np.all(dev.read_array(out).view(np.uint32) == 0x01020304)
    for th in driver.threads:
        th.join(T)
    dev.close()


class LingeringDriver(Driver):
    """Runs commands inline and keeps the submission and its stream afterwards, as a
    driver thread's frame or queued task may for a moment after reporting done."""

    name = "lingering"

    def __init__(self) -> None:
        self.kept: list = []

    def perform(self, operation, payload, done, submission_id, wait, signal, queue):
        stream = Stream(payload)
        self.kept.append((payload, stream))
        done(run_capturing(stream.run))


def test_memory_is_free_when_the_signal_is_reached_whatever_the_driver_still_holds():
    driver = LingeringDriver()
    dev = Device(driver)
    s = dev.create_semaphore()
    buffer = dev.allocator.allocate(1 << 16)
    dev.queue_fill(buffer, 0, 1 << 16, b"\x05", signal=[(s, 1)])
    del buffer
    s.wait(1, timeout=T)
    assert driver.kept  # no collection: the references are gone, not merely unreachable
    assert dev.allocator.statistics().live_bytes == 0
    dev.close()


@pytest.mark.parametrize("module", [sync, task, emu], ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_every_driver_is_an_object_the_device_holds(module):
    """A driver is composed into its device: it implements `perform` (and `stop`), and
    its device class adds only public extras: it defines no private method at all."""
    drivers = [v for v in vars(module).values()
               if isinstance(v, type) and issubclass(v, Driver) and v.__module__ == module.__name__]
    devices = [v for v in vars(module).values()
               if isinstance(v, type) and issubclass(v, Device) and v.__module__ == module.__name__]
    assert len(drivers) == 1 and len(devices) == 1
    assert "perform" in vars(drivers[0])
    assert devices[0].__mro__[1] is Device  # drivers build on the public layer, not on each other
    overridden = [name for name in vars(devices[0]) if name.startswith("_")
                  and not name.startswith("__") and callable(getattr(Device, name, None))]
    assert not overridden
    device = module.__dict__[devices[0].__name__]()
    try:
        assert isinstance(device.driver, drivers[0])
        assert device.driver_name == drivers[0].name
    finally:
        device.close()

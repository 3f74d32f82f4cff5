"""The driver contract (`tinyhal.hal.drivers`): drivers run ready work and report it
done; the public `Device` validates, holds resource sets, waits and completes."""

from __future__ import annotations

import gc
import inspect
import threading

import numpy as np
import pytest

from tinyhal import errors
from tinyhal.hal.device import Device, run_capturing
from tinyhal.hal.drivers import emu, sync, task
from tinyhal.hal.stream import Stream

T = 30


class BareDevice(Device):
    """A driver that implements nothing: what it lacks is UNIMPLEMENTED, not a crash."""

    driver_name = "bare"


class LateDevice(Device):
    """Runs commands on a thread of its own when told to, reporting `done` twice."""

    driver_name = "late"

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.threads: list[threading.Thread] = []

    def _execute(self, ops, done):
        def run():
            self.go.wait(T)
            error = run_capturing(Stream(ops).run)
            done(error)
            done(errors.InternalError("a second report is ignored"))

        th = threading.Thread(target=run)
        self.threads.append(th)
        th.start()


def test_a_driver_without_hooks_fails_work_with_unimplemented():
    dev = BareDevice()
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
    dev = LateDevice()
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
    dev.go.set()
    s.wait(1, timeout=T)  # the second `done` (an error) changed nothing
    assert dev.wait_idle(T)
    assert dev.allocator.statistics().live_bytes == baseline + (1 << 20)
    assert np.all(dev.read_array(out).view(np.uint32) == 0x01020304)
    for th in dev.threads:
        th.join(T)
    dev.close()


class LingeringDevice(Device):
    """Runs commands inline and keeps the submission and its stream afterwards, as a
    driver thread's frame or queued task may for a moment after reporting done."""

    driver_name = "lingering"

    def __init__(self) -> None:
        super().__init__()
        self.kept: list = []

    def _execute(self, ops, done):
        stream = Stream(ops)
        self.kept.append((ops, stream))
        done(run_capturing(stream.run))


def test_memory_is_free_when_the_signal_is_reached_whatever_the_driver_still_holds():
    dev = LingeringDevice()
    s = dev.create_semaphore()
    buffer = dev.allocator.allocate(1 << 16)
    dev.queue_fill(buffer, 0, 1 << 16, b"\x05", signal=[(s, 1)])
    del buffer
    s.wait(1, timeout=T)
    assert dev.kept  # no collection: the references are gone, not merely unreachable
    assert dev.allocator.statistics().live_bytes == 0
    dev.close()


@pytest.mark.parametrize("module", [sync, task, emu], ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_every_driver_implements_the_contract_in_the_same_order(module):
    cls = next(v for v in vars(module).values()
               if isinstance(v, type) and issubclass(v, Device) and v is not Device
               and v.__module__ == module.__name__)
    for name in ("_execute", "_call"):
        assert name in vars(cls), f"{cls.__name__} lacks {name}"
    lines = [inspect.getsourcelines(vars(cls)[n])[1] for n in ("_execute", "_call", "_stop")
             if n in vars(cls)]
    assert lines == sorted(lines)
    assert cls.__mro__[1] is Device  # drivers build on the public layer, not on each other


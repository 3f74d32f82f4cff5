"""The driver protocol (`tinyhal.hal.queue.Driver`): a driver object runs ready queue
operations, one method each, and reports them done; the public `Device` validates, its
`WorkQueue` holds resource sets, waits and completes. Every driver file declares the
whole protocol in one order; a driver in one file (`toy_driver.py`) registers at run
time and runs like the built-in ones."""

from __future__ import annotations

import ast
import gc
import inspect
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from support import toy_driver
from tinyhal import errors, hal
from tinyhal.hal.device import Device
from tinyhal.hal.drivers import emu, sync, task
from tinyhal.hal.queue import (
    PROTOCOL,
    Capabilities,
    Driver,
    run_capturing,
    run_device_work,
    unimplemented,
)
from tinyhal.hal.stream import Stream

T = 30


class BareDriver(Driver):
    """A driver that runs nothing, declared so: its operations are UNIMPLEMENTED (the
    work fails with that, nothing crashes); work the device builds still runs."""

    name = "bare"
    identifier = "bare"
    capabilities = Capabilities()
    create_allocator = Driver.create_allocator
    attach = Driver.attach
    execute = fill = update = copy = unimplemented("execute commands")
    host_call = unimplemented("run host work")
    alloca = dealloca = barrier = run_device_work
    queue_for_affinity = Driver.queue_for_affinity
    check_alloca = read_direct = write_direct = None
    stop = Driver.stop


class LateDriver(BareDriver):
    """Runs commands on a thread of its own when told to, reporting `done` twice."""

    name = "late"

    def __init__(self) -> None:
        self.go = threading.Event()
        self.threads: list[threading.Thread] = []

    def execute(self, payload, done, submission_id, wait, signal, queue):
        def run():
            self.go.wait(T)
            error = run_capturing(Stream.start(payload).run)
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


class LingeringDriver(BareDriver):
    """Runs commands inline and keeps the submission and its stream afterwards, as a
    driver thread's frame or queued task may for a moment after reporting done."""

    name = "lingering"

    def __init__(self) -> None:
        self.kept: list = []

    def execute(self, payload, done, submission_id, wait, signal, queue):
        stream = Stream.start(payload)
        self.kept.append((payload, stream))
        done(run_capturing(stream.run))

    fill = execute


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


DRIVER_MODULES = [sync, task, emu, toy_driver]


def _driver_classes(module):
    drivers = [v for v in vars(module).values()
               if isinstance(v, type) and issubclass(v, Driver) and v.__module__ == module.__name__]
    devices = [v for v in vars(module).values()
               if isinstance(v, type) and issubclass(v, Device) and v.__module__ == module.__name__]
    return drivers, devices


@pytest.mark.parametrize("module", DRIVER_MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_every_driver_is_an_object_the_device_holds(module):
    """A driver is composed into its device: its device class only builds it and adds
    public extras: it overrides no method of `Device` and defines no private one."""
    drivers, devices = _driver_classes(module)
    assert len(drivers) == 1 and len(devices) == 1
    assert devices[0].__mro__[1] is Device  # drivers build on the public layer, not on each other
    overridden = [name for name in vars(devices[0]) if callable(getattr(Device, name, None))
                  and name not in ("__init__", "__repr__")]
    assert not overridden
    private = [name for name in vars(devices[0]) if name.startswith("_")
               and not name.startswith("__")]
    assert not private
    device = devices[0]()
    try:
        assert isinstance(device.driver, drivers[0])
        assert device.driver_name == drivers[0].name
        assert device.capabilities is device.driver.capabilities
    finally:
        device.close()


def _declared(module) -> list[str]:
    """The protocol names a module's driver class declares in its body, in order."""
    drivers, _ = _driver_classes(module)
    tree = ast.parse(Path(inspect.getfile(module)).read_text())
    body = next(node for node in tree.body
                if isinstance(node, ast.ClassDef) and node.name == drivers[0].__name__).body
    names = []
    for node in body:
        if isinstance(node, ast.FunctionDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names.extend(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return [name for name in names if name in PROTOCOL]


@pytest.mark.parametrize("module", DRIVER_MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_every_driver_file_declares_the_whole_protocol_in_one_order(module):
    """Each member of the protocol is declared in the driver's own class body (what it
    lacks as `unimplemented(...)` or None), in `PROTOCOL`'s order: reading one driver
    file tells what it does with every operation, and files compare line by line."""
    assert _declared(module) == list(PROTOCOL)


def test_a_device_takes_only_a_driver():
    with pytest.raises(errors.InvalidArgumentError, match="hal.queue.Driver"):
        Device(object())
    with pytest.raises(TypeError, match="abstract"):
        Driver()


@pytest.mark.parametrize("name", ["sync", "task", "emu"])
def test_capabilities_say_what_callers_may_rely_on(name):
    """Callers read capabilities, not names: inline completion means a ready submission
    has run when `submit` returns, on the calling thread; host-visible memory means the
    host maps device-local memory."""
    device = hal.create_device(name)
    try:
        caps = device.capabilities
        assert device.queue_count == caps.queue_count
        assert device.query("hal.dispatch", "concurrency") == caps.concurrency
        buffer = device.allocator.allocate(64)
        assert buffer.mappable == caps.host_visible_memory
        sem = device.create_semaphore()
        device.queue_fill(buffer, 0, 64, b"\x09", signal=[(sem, 1)])
        if caps.completes_inline:
            assert sem.query() == 1  # ran before queue_fill returned
        sem.wait(1, timeout=T)
        assert device.read_bytes(buffer) == b"\x09" * 64
    finally:
        device.close()


def test_device_uris_are_the_drivers_to_read():
    """`create_device` takes a device URI; what follows `://` is the driver's to read."""
    device = hal.create_device("emu://edge-npu?queues=2")
    try:
        assert device.queue_count == 2 and device.preset == "edge-npu"
    finally:
        device.close()
    with pytest.raises(errors.InvalidArgumentError, match="takes `\\?queues=N`"):
        hal.create_device("emu://?lanes=2")
    assert "emu://edge-npu" in hal.device_uris("emu") and hal.device_uris("sync") == []
    assert "workers" in hal.driver_options("local-task")
    assert "workers" not in hal.driver_options("sync")
    with pytest.raises(errors.InvalidArgumentError, match="unknown driver 'nope'"):
        hal.create_device("nope://x")


def test_a_driver_in_one_file_registers_at_run_time():
    hal.register_driver(toy_driver.DRIVER)
    assert "toy" in hal.available_drivers()
    device = hal.create_device("toy")
    try:
        buffer = device.allocator.allocate(256)
        sem = device.create_semaphore()
        device.queue_fill(buffer, 0, 256, b"\x05", signal=[(sem, 1)])
        host = bytearray(256)
        device.queue_write(buffer, 0, host, 0, 256, wait=[(sem, 1)], signal=[(sem, 2)])
        sem.wait(2, timeout=T)
        assert host == b"\x05" * 256
    finally:
        device.close()
    with pytest.raises(errors.InvalidArgumentError, match="DriverInfo"):
        hal.register_driver(("toy", None))


def test_driver_modules_named_in_the_environment_register_their_driver(monkeypatch):
    monkeypatch.setenv("TINYHAL_DRIVER_MODULES", "support.no_such_driver")
    with pytest.raises(errors.InvalidArgumentError, match="cannot import 'support.no_such"):
        hal.create_device("elsewhere")
    monkeypatch.setenv("TINYHAL_DRIVER_MODULES", "support.executables")
    with pytest.raises(errors.InvalidArgumentError, match="defines no DRIVER"):
        hal.available_drivers()
    monkeypatch.setenv("TINYHAL_DRIVER_MODULES", " support.toy_driver, ")
    device = hal.create_device("toy://ignored/path")
    try:
        assert device.driver_name == "toy" and device.identifier == "local-toy"
    finally:
        device.close()


# The suites the toy driver runs in a child process: the HAL conformance tests that take
# the `device` fixture (queue operations, dispatch, semaphores, command buffers, host
# memory, alloca, lifetimes, kernel faults, a profiled model run), their own child
# processes included (they create the device by name: `TINYHAL_DRIVER_MODULES`
# registers it there too). The toy driver places transient memory later than the
# others (on its thread), which the profiled run's deallocas depend on.
TOY_SUITES = ["test_queue_ops.py", "test_dispatch.py", "test_semaphore.py",
              "test_command_buffer.py", "test_queue_alloca.py", "test_lifetimes.py",
              "test_host_memory.py", "test_kernel_faults.py", "test_profile_format.py"]


@pytest.mark.timeout(600)
def test_the_toy_driver_passes_the_conformance_suite():
    """The driver-parametrized HAL suites, run on the toy driver only, registered at run
    time in the child and its children (`TINYHAL_DRIVER_MODULES`)."""
    here = Path(__file__).parent
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
         *[str(here / name) for name in TOY_SUITES], "-k", "toy"],
        env={**os.environ, "TINYHAL_TEST_DRIVERS": "toy",
             "TINYHAL_DRIVER_MODULES": "support.toy_driver"},
        cwd=here.parent.parent, capture_output=True, text=True, timeout=540)
    tail = done.stdout[-3000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    assert " passed" in done.stdout and "failed" not in done.stdout, tail

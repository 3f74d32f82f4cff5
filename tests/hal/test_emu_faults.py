"""Faults on the emulated accelerator: the Nth operation of an export, kind or queue;
device loss; memory capacity. On HAL submissions and on VM invocations; nothing hangs
(device-loss scenarios run in a child process with a timeout)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tinyhal import errors, hal
from tinyhal.hal.drivers.emu import DeviceLostError

pytestmark = pytest.mark.timeout(300)

KERNELS = """
static int k1(const tinyhal_environment_t* e, const tinyhal_dispatch_state_t* d,
              const tinyhal_workgroup_state_t* w) { return 0; }
static int k2(const tinyhal_environment_t* e, const tinyhal_dispatch_state_t* d,
              const tinyhal_workgroup_state_t* w) { return 0; }
"""
TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def library():
    return hal.build_executable(KERNELS, ["k1", "k2"], name="emu_faults")


def submit(device, cb, queue=0, wait=()):
    sem = device.create_semaphore()
    device.submit(cb, wait=wait, signal=[(sem, 1)], queue=queue)
    return sem


def outcome(sem):
    try:
        sem.wait(1, timeout=30)
        return "ok"
    except errors.Error as exc:
        return type(exc).__name__


def test_nth_dispatch_of_an_export_fails(library):
    with hal.create_device("emu") as emu:
        exe = emu.load_executable(library)
        emu.inject_fault("dispatch", after=1, export="k2",
                         error=errors.DataLossError("bit flip in k2"))
        results = []
        for name in ("k2", "k1", "k1", "k2", "k2"):
            cb = emu.create_command_buffer()
            cb.dispatch(exe, name, (4, 1, 1))
            cb.finalize()
            results.append(outcome(submit(emu, cb)))
        assert results == ["ok", "ok", "ok", "DataLossError", "ok"]


def test_nth_transfer_of_a_queue_fails(library):
    with hal.create_device("emu", queues=2) as emu:
        buf = emu.allocator.allocate(256)
        emu.inject_fault("transfer", after=1, queue=1)
        results = []
        for q, op in ((1, "fill"), (0, "fill"), (0, "copy"), (1, "copy"), (1, "fill")):
            cb = emu.create_command_buffer()
            if op == "fill":
                cb.fill(buf, 0, 128, q + 1)
            else:
                cb.copy(buf, 0, buf, 128, 128)
            cb.finalize()
            results.append(outcome(submit(emu, cb, queue=q)))
        assert results == ["ok", "ok", "ok", "InternalError", "ok"]
        # the failed copy wrote nothing; later work saw consistent memory
        assert emu.read_bytes(buf, 0, 4) == b"\x02" * 4
        assert emu.read_bytes(buf, 128, 4) == b"\x01" * 4


@pytest.mark.parametrize("kind", ["fill", "update", "copy", "any"])
def test_each_transfer_kind_fails_on_its_nth(kind):
    with hal.create_device("emu") as emu:
        buf = emu.allocator.allocate(64)
        emu.inject_fault(kind, after=0)
        cb = emu.create_command_buffer()
        {"fill": lambda: cb.fill(buf, 0, 64, 1),
         "update": lambda: cb.update(b"\x01" * 64, buf, 0),
         "copy": lambda: cb.copy(buf, 0, buf, 32, 32),
         "any": lambda: cb.fill(buf, 0, 64, 1)}[kind]()
        cb.finalize()
        assert outcome(submit(emu, cb)) == "InternalError"
        cb2 = emu.create_command_buffer()
        cb2.fill(buf, 0, 64, 9)
        cb2.finalize()
        assert outcome(submit(emu, cb2)) == "ok"  # one-shot: the next one runs


def test_bad_fault_arguments():
    with hal.create_device("emu") as emu:
        with pytest.raises(errors.InvalidArgumentError, match="fault kind"):
            emu.inject_fault("teleport")
        with pytest.raises(errors.InvalidArgumentError, match="after"):
            emu.inject_fault("dispatch", after=-1)
        with pytest.raises(errors.InvalidArgumentError, match="queue"):
            emu.inject_fault("dispatch", queue=3)


def run_child(code: str, timeout: float = 120) -> str:
    """Runs `code` in a fresh interpreter (bounded); returns its stdout."""
    prelude = f"import sys; sys.path.insert(0, {str(TESTS)!r})\n"
    result = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)],
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_device_loss_fails_pending_and_later_work_and_wakes_every_waiter():
    out = run_child("""
        import threading
        from tinyhal import errors, hal
        from tinyhal.hal.drivers.emu import DeviceLostError

        emu = hal.create_device("emu", queues=2)
        buf = emu.allocator.allocate(1 << 16)
        gate = emu.create_semaphore()
        pending = emu.create_semaphore()
        cb = emu.create_command_buffer()
        cb.fill(buf, 0, 1 << 16, 1)
        cb.finalize()
        emu.submit(cb, wait=[(gate, 1)], signal=[(pending, 1)], queue=1)
        woke = []

        def waiter():
            try:
                pending.wait(1, timeout=30)
                woke.append("signalled")
            except errors.Error as exc:
                woke.append(exc)

        t = threading.Thread(target=waiter)
        t.start()
        emu.lose_device()
        t.join(30)
        assert not t.is_alive() and isinstance(woke[0], DeviceLostError), woke
        assert woke[0].code == errors.StatusCode.UNAVAILABLE
        later = emu.create_semaphore()
        emu.queue_fill(buf, 0, 64, 2, signal=[(later, 1)])
        try:
            later.wait(1, timeout=30)
            raise AssertionError("work after loss ran")
        except DeviceLostError:
            pass
        try:
            emu.queue_alloca(64, signal=[(emu.create_semaphore(), 1)])
        except errors.Error:
            pass
        try:
            emu.read_bytes(buf, 0, 4, timeout=30)
            raise AssertionError("read after loss ran")
        except DeviceLostError as exc:
            assert "lost" in str(exc)
        gate.signal(1)  # a late wait reached: still fails, never runs
        emu.close(timeout=30)
        with hal.create_device("emu") as fresh:  # a new device works
            b = fresh.allocator.allocate(64)
            fresh.write_bytes(b, b"\\x05" * 64)
            assert fresh.read_bytes(b, 0, 2) == b"\\x05\\x05"
        print("ok")
    """)
    assert out.strip() == "ok"


def test_device_loss_as_an_injected_fault_mid_stream(library):
    with hal.create_device("emu") as emu:
        exe = emu.load_executable(library)
        emu.inject_fault("device_loss", after=2)
        sems = []
        for _ in range(6):
            cb = emu.create_command_buffer()
            cb.dispatch(exe, "k1", (2, 1, 1))
            cb.finalize()
            sems.append(submit(emu, cb))
        results = [outcome(s) for s in sems]
        assert results == ["ok", "ok"] + ["DeviceLostError"] * 4
        assert issubclass(DeviceLostError, errors.UnavailableError)


# -- VM invocations ------------------------------------------------------------------


@pytest.fixture(scope="module")
def mobilenet():
    pytest.importorskip("onnx")
    from support.models import mobilenet_input, mobilenet_v2_vmfb

    return mobilenet_v2_vmfb(), mobilenet_input()


def test_vm_invocation_fails_on_the_nth_dispatch_of_an_export(mobilenet):
    import tinyhal

    vmfb, x = mobilenet
    emu = hal.create_device("emu", preset="edge-npu")
    with tinyhal.load(vmfb, device=emu) as module:
        expected = module.mobilenet_v2(x)
        names = [e.name for e in emu.trace() if e.engine == "compute"]
        target = names[3]
        occurrence = names.count(target) - 1  # the last dispatch of that export
        emu.inject_fault("dispatch", after=occurrence, export=target,
                         error=errors.DataLossError("ECC error"))
        with pytest.raises(errors.DataLossError, match="ECC error"):
            module.mobilenet_v2(x)
        again = module.mobilenet_v2(x)  # not lost: the next invocation is exact
        assert again.tobytes() == expected.tobytes()
    emu.close()


@pytest.mark.parametrize("kind,queue", [("transfer", None), ("fill", 0), ("any", 0)])
def test_vm_invocation_fails_on_a_transfer_or_queue_fault(mobilenet, kind, queue):
    import tinyhal

    vmfb, x = mobilenet
    emu = hal.create_device("emu", preset="edge-npu")
    with tinyhal.load(vmfb, device=emu) as module:
        expected = module.mobilenet_v2(x)
        emu.inject_fault(kind, after=0, queue=queue)
        with pytest.raises(errors.InternalError, match="injected fault"):
            module.mobilenet_v2(x)
        assert module.mobilenet_v2(x).tobytes() == expected.tobytes()
    emu.close()


def test_vm_invocation_on_a_lost_device_fails_cleanly(mobilenet):
    vmfb, _x = mobilenet
    out = run_child(f"""
        import tinyhal
        from tinyhal import errors, hal
        from support.models import mobilenet_input
        x = mobilenet_input()
        emu = hal.create_device("emu", preset="edge-npu")
        module = tinyhal.load({str(vmfb)!r}, device=emu)
        expected = module.mobilenet_v2(x)
        emu.inject_fault("device_loss", after=20)
        for attempt in range(2):  # mid-invocation, then on the lost device
            try:
                module.mobilenet_v2(x)
                raise AssertionError("ran on a lost device")
            except errors.Error as exc:
                assert exc.code == errors.StatusCode.UNAVAILABLE, exc
        module.close()
        with tinyhal.load({str(vmfb)!r}, device="emu") as fresh:
            assert fresh.mobilenet_v2(x).tobytes() == expected.tobytes()
        print("ok")
    """, timeout=240)
    assert out.strip() == "ok"


def test_mobilenet_capacity_just_above_runs_just_below_fails(mobilenet):
    import tinyhal

    vmfb, x = mobilenet
    with hal.create_device("emu", preset="edge-npu") as emu:
        with tinyhal.load(vmfb, device=emu) as module:
            expected = module.mobilenet_v2(x)
        peak = emu.allocator.device_peak
        assert peak == emu.summary().peak_device_bytes > 0
    with hal.create_device("emu", preset="edge-npu", memory_size=peak) as emu:
        with tinyhal.load(vmfb, device=emu) as module:
            assert module.mobilenet_v2(x).tobytes() == expected.tobytes()
    with hal.create_device("emu", preset="edge-npu", memory_size=peak - 64) as emu:
        with tinyhal.load(vmfb, device=emu) as module:
            with pytest.raises(errors.ResourceExhaustedError, match="emulated device memory"):
                module.mobilenet_v2(x)
            assert emu.wait_idle(30)
            assert np.isfinite(peak)

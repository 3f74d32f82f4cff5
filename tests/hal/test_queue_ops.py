"""Queue operations on every driver: transfers, host/file I/O, barriers, ordering, failure.

Waits are often queued before the signals that satisfy them; every host wait is bounded.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tinyhal import errors
from tinyhal.hal import BufferView, KernelExport, build_executable

T = 30  # seconds: bound on every wait


def contents(buf, device=None) -> np.ndarray:
    """The buffer's bytes, read back through the device queue (no mapping needed)."""
    out = np.zeros(buf.byte_length, np.uint8)
    sem = _DEVICE[0].create_semaphore()
    _DEVICE[0].queue_write(buf, 0, out, 0, buf.byte_length, signal=[(sem, 1)])
    sem.wait(1, timeout=T)
    return out


_DEVICE: list = [None]


@pytest.fixture(autouse=True)
def _remember_device(request):
    if "device" in request.fixturenames:
        _DEVICE[0] = request.getfixturevalue("device")
    yield
    _DEVICE[0] = None


def test_transfers_queued_before_their_waits_are_signalled(device):
    gate, s = device.create_semaphore(), device.create_semaphore()
    a = device.allocator.allocate(256)
    b = device.allocator.allocate(256)
    device.queue_fill(a, 0, 256, b"\x11", wait=[(gate, 1)], signal=[(s, 1)])
    device.queue_update(bytes(range(16)), a, 32, wait=[(s, 1)], signal=[(s, 2)])
    device.queue_copy(a, 0, b, 64, 128, wait=[(s, 2)], signal=[(s, 3)])
    device.queue_barrier(wait=[(s, 3)], signal=[(s, 4)])
    with pytest.raises(errors.DeadlineExceededError):
        s.wait(1, timeout=0.02)
    gate.signal(1)
    s.wait(4, timeout=T)
    expected_a = np.full(256, 0x11, np.uint8)
    expected_a[32:48] = np.arange(16)
    assert np.array_equal(contents(a), expected_a)
    expected_b = np.zeros(256, np.uint8)
    expected_b[64:192] = expected_a[:128]
    assert np.array_equal(contents(b), expected_b)


def test_update_captures_its_source_at_submit(device):
    gate, done = device.create_semaphore(), device.create_semaphore()
    target = device.allocator.allocate(8)
    source = bytearray(b"original")
    array = np.frombuffer(b"numpyarr", np.uint8).copy()
    target2 = device.allocator.allocate(8)
    device.queue_update(source, target, 0, wait=[(gate, 1)], signal=[(done, 1)])
    device.queue_update(array, target2, 0, wait=[(gate, 1)], signal=[(done, 2)])
    source[:] = b"CHANGED!"
    array[:] = 0
    gate.signal(1)
    done.wait(2, timeout=T)
    assert contents(target).tobytes() == b"original"
    assert contents(target2).tobytes() == b"numpyarr"


def test_read_and_write_host_memory_and_files(device, tmp_path):
    s = device.create_semaphore()
    buf = device.allocator.allocate(64)
    host = np.arange(64, dtype=np.uint8)
    device.queue_read(host, 0, buf, 0, 64, signal=[(s, 1)])
    out = bytearray(32)
    device.queue_write(buf, 16, out, 0, 32, wait=[(s, 1)], signal=[(s, 2)])
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(100, 200)))
    device.queue_read(path, 10, buf, 0, 8, wait=[(s, 2)], signal=[(s, 3)])
    out_path = tmp_path / "out.bin"
    device.queue_write(buf, 0, out_path, 0, 64, wait=[(s, 3)], signal=[(s, 4)])
    with open(path, "rb") as f:
        device.queue_read(f, 0, buf, 56, 8, wait=[(s, 4)], signal=[(s, 5)])
        s.wait(5, timeout=T)
    assert bytes(out) == bytes(range(16, 48))
    got = out_path.read_bytes()
    assert got[:8] == bytes(range(110, 118)) and got[8:] == bytes(range(8, 64))
    assert contents(buf)[56:].tobytes() == bytes(range(100, 108))


def test_failure_flows_from_wait_to_signal_to_every_dependent(device):
    root, mid, leaf, other = (device.create_semaphore() for _ in range(4))
    buf = device.allocator.allocate(64)
    device.queue_fill(buf, 0, 64, b"\x01", wait=[(root, 1)], signal=[(mid, 1)])
    cb = device.create_command_buffer()
    cb.fill(buf, 0, 64, b"\x02")
    cb.finalize()
    device.submit(cb, wait=[(mid, 1)], signal=[(leaf, 1), (other, 5)])
    device.queue_barrier(wait=[(leaf, 1)], signal=[(leaf, 2)])
    root.fail(errors.DataLossError("disk on fire"))
    for sem, value in ((mid, 1), (leaf, 1), (leaf, 2), (other, 5)):
        with pytest.raises(errors.DataLossError, match="disk on fire"):
            sem.wait(value, timeout=T)
    assert contents(buf).max() == 0  # no failed-wait work ran


def test_signal_failure_of_one_operation_does_not_touch_independent_ones(device):
    bad, good = device.create_semaphore(), device.create_semaphore()
    device.queue_barrier(wait=[(bad, 1)], signal=[(bad, 2)])
    device.queue_barrier(signal=[(good, 1)])
    bad.fail("nope")
    good.wait(1, timeout=T)
    assert good.query() == 1


def test_dag_across_several_submissions(device):
    a, b, c, d = (device.create_semaphore() for _ in range(4))
    buf = device.allocator.allocate(16)
    # d <- (b, c); b <- a; c <- a; queued leaves first.
    device.queue_copy(buf, 0, buf, 8, 4, wait=[(b, 1), (c, 1)], signal=[(d, 1)])
    device.queue_fill(buf, 0, 4, b"\x0b", wait=[(a, 1)], signal=[(b, 1)])
    device.queue_fill(buf, 4, 4, b"\x0c", wait=[(a, 1)], signal=[(c, 1)])
    a.signal(1)
    d.wait(1, timeout=T)
    assert list(contents(buf)) == [11] * 4 + [12] * 4 + [11] * 4 + [0] * 4


def test_signal_from_another_thread(device):
    gate, done = device.create_semaphore(), device.create_semaphore()
    device.queue_barrier(wait=[(gate, 3)], signal=[(done, 1)])
    t = threading.Timer(0.02, gate.signal, args=(3,))
    t.start()
    done.wait(1, timeout=T)
    t.join(T)


# -- dispatches on transient memory ---------------------------------------------------

KERNELS = r"""
/* out[i] = in[i] + k for the workgroup's 16 items */
static int add_k(const tinyhal_environment_t* env, const tinyhal_dispatch_state_t* d,
                 const tinyhal_workgroup_state_t* w) {
  const int32_t* in = (const int32_t*)d->binding_ptrs[0];
  int32_t* out = (int32_t*)d->binding_ptrs[1];
  uint32_t base = w->workgroup_id_x * 16u;
  for (uint32_t i = base; i < base + 16u; ++i) out[i] = in[i] + (int32_t)d->constants[0];
  return 0;
}
"""


@pytest.fixture(scope="module")
def add_k() -> bytes:
    return build_executable(KERNELS, [KernelExport("add_k", constant_count=1, binding_count=2)],
                            name="queue_kernels")


def test_alloca_dispatch_dealloca_chain_queued_up_front(device, add_k):
    exe = device.load_executable(add_k)
    n = 1024
    x = np.arange(n, dtype=np.int32)
    src = BufferView.from_numpy(device, x).buffer
    out = device.allocator.allocate(4 * n)
    gate, s = device.create_semaphore(), device.create_semaphore()
    tmp = device.queue_alloca(4 * n, wait=[(gate, 1)], signal=[(s, 1)])
    cb1 = device.create_command_buffer()
    cb1.dispatch(exe, "add_k", (n // 16, 1, 1), constants=[5], bindings=[src, tmp])
    cb1.barrier()
    cb1.dispatch(exe, "add_k", (n // 16, 1, 1), constants=[7], bindings=[tmp, out])
    cb1.finalize()
    device.submit(cb1, wait=[(s, 1)], signal=[(s, 2)])  # before the alloca has memory
    device.queue_dealloca(tmp, wait=[(s, 2)], signal=[(s, 3)])
    gate.signal(1)
    s.wait(3, timeout=T)
    assert np.array_equal(BufferView(out, (n,), 0x10000020).to_numpy(), x + 12)
    assert device.allocator.statistics()["transient"].live_bytes == 0
    with pytest.raises(errors.FailedPreconditionError):
        tmp.map()

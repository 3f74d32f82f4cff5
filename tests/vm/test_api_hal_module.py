"""The native hal module's functions called directly, as compiled code calls them."""

from __future__ import annotations

import numpy as np
import pytest
import trio

import tinyhal
from tinyhal import hal
from tinyhal.errors import InvalidArgumentError, OutOfRangeError
from tinyhal.hal.types import BufferUsage, MemoryType
from tinyhal.vm import Suspend, VMBuffer
from tinyhal.vm.hal_module import HAL_MODULE_VERSION, create_hal_module


@pytest.fixture(params=["sync", "task"])
def env(request):
    dev = hal.create_device(request.param)
    mod = create_hal_module(dev)
    yield dev, (lambda name, *args: mod.functions[f"hal.{name}"].fn(*args))
    dev.close()


def aligned_rodata(n: int, offset: int = 0) -> VMBuffer:
    raw = np.arange(n + 128, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    view = memoryview(raw[start : start + n])
    return VMBuffer(view.toreadonly(), mutable=False)


USAGE = int(BufferUsage.DEFAULT | BufferUsage.SHARING_IMMUTABLE)
DEVICE_LOCAL = int(MemoryType.DEVICE_LOCAL)


def test_module_identity():
    mod = create_hal_module(hal.create_device("sync"))
    assert mod.name == "hal" and mod.version == HAL_MODULE_VERSION >= 7
    assert mod.functions["hal.fence.await"].yieldable


def test_allocator_import_is_zero_copy(env):
    dev, call = env
    rodata = aligned_rodata(256)
    buf = call("allocator.import", dev.allocator, 1, -1, DEVICE_LOCAL, USAGE, rodata, 64, 128)
    assert buf is not None and buf.byte_length == 128
    assert buf.address == np.frombuffer(rodata.data, np.uint8).ctypes.data + 64
    assert dev.allocator.statistics().live_bytes == 0


def test_allocator_import_try_returns_null_when_unaligned(env):
    dev, call = env
    rodata = aligned_rodata(256, offset=4)
    assert call("allocator.import", dev.allocator, 1, -1, DEVICE_LOCAL, USAGE, rodata, 0, 64) \
        is None
    with pytest.raises(tinyhal.Error):
        call("allocator.import", dev.allocator, 0, -1, DEVICE_LOCAL, USAGE, rodata, 0, 64)
    with pytest.raises(tinyhal.Error, match="immutable"):  # rodata needs constant usage
        call("allocator.import", dev.allocator, 1, -1, DEVICE_LOCAL,
             int(BufferUsage.DEFAULT), aligned_rodata(64), 0, 64)


def test_device_query(env):
    dev, call = env
    key = VMBuffer(b"hal.device.id")
    assert call("device.query.i64", dev, key, VMBuffer(b"local*")) == (1, 1)
    assert call("device.query.i64", dev, key, VMBuffer(b"cuda*")) == (1, 0)
    assert call("device.query.i64", dev, VMBuffer(b"no.such"), VMBuffer(b"x")) == (0, 0)
    fmt = VMBuffer(b"hal.executable.format")
    assert call("device.query.i64", dev, fmt, VMBuffer(b"embedded-elf-x86_64"))[1] in (0, 1)


def test_wrong_ref_types_are_invalid_argument(env):
    dev, call = env
    with pytest.raises(tinyhal.Error, match="hal.buffer_view"):
        call("buffer_view.buffer", None)
    with pytest.raises(tinyhal.Error, match="hal.device"):
        call("device.allocator", dev.allocator)


def test_buffer_load_store_and_views(env):
    dev, call = env
    buf = call("allocator.allocate", dev.allocator, -1, DEVICE_LOCAL, int(BufferUsage.DEFAULT
                                                                       | BufferUsage.MAPPING), 16)
    call("buffer.store", -2, buf, 4, 4)
    assert call("buffer.load", buf, 4, 4) == 0xFFFFFFFE
    assert call("buffer.load", buf, 4, 2) == 0xFFFE
    with pytest.raises(tinyhal.Error):
        call("buffer.store", 1, buf, 14, 4)
    view = call("buffer_view.create", buf, 0, 16, 0x20000020, 1, [(2,), (2,)])
    assert call("buffer_view.rank", view) == 2 and call("buffer_view.dim", view, 1) == 2
    assert (view.shape, view.element_type, view.encoding_type) == ((2, 2), 0x20000020, 1)
    assert view.buffer is buf
    with pytest.raises(OutOfRangeError, match=r"shape \(2, 3\).* needs 24 bytes"):
        call("buffer_view.create", buf, 0, 16, 0x20000020, 1, [(2,), (3,)])
    with pytest.raises(InvalidArgumentError, match="negative dimension"):
        call("buffer_view.create", buf, 0, 16, 0x20000020, 1, [(-1,), (2,)])
    part = call("buffer_view.create", buf, 8, 8, 0x20000020, 1, [(2,)])
    assert part.buffer.byte_length == 8 and part.shape == (2,)
    call("buffer_view.assert", view, VMBuffer(b"x"), 0x20000020, 1, [(2,), (2,)])
    with pytest.raises(tinyhal.Error, match="x shape dimension 1 mismatch"):
        call("buffer_view.assert", view, VMBuffer(b"x"), 0x20000020, 1, [(2,), (3,)])
    with pytest.raises(tinyhal.Error, match="element type mismatch"):
        call("buffer_view.assert", view, VMBuffer(b"x"), 0x21000010, 1, [(2,), (2,)])
    call("device.queue.dealloca", dev, -1, None, None, buf, 0)  # not transient: just orders
    assert call("buffer.length", buf) == 16


def test_fence_query_signal_fail_and_await(env):
    dev, call = env
    f = call("fence.create", dev, 0)
    assert call("fence.query", f) == tinyhal.StatusCode.DEFERRED
    assert call("fence.await", 0, 0, [(f,)]) == tinyhal.StatusCode.DEADLINE_EXCEEDED
    pending = call("fence.await", 10, 0, [(f,), (None,)])
    assert isinstance(pending, Suspend)
    assert pending.block() == tinyhal.StatusCode.DEADLINE_EXCEEDED
    joined = call("fence.join", 0, [(f,), (None,)])
    assert call("fence.join", 0, [(None,)]) is None
    call("fence.signal", f)
    assert call("fence.query", joined) == 0
    assert call("fence.await", -1, 0, [(joined,)]) == 0
    g = call("fence.create", dev, 0)
    suspended = call("fence.await", -1, 0, [(g,)])
    call("fence.fail", g, int(tinyhal.StatusCode.ABORTED))
    with pytest.raises(tinyhal.Error) as info:
        suspended.block()
    assert info.value.code == tinyhal.StatusCode.ABORTED
    assert call("fence.query", g) == tinyhal.StatusCode.ABORTED


def test_fence_await_async_resumes_when_signalled(env):
    dev, call = env
    f = call("fence.create", dev, 0)
    suspended = call("fence.await", -1, 0, [(f,)])

    async def main():
        async with trio.open_nursery() as nursery:
            result = []

            async def waiter():
                result.append(await suspended.wait_async())

            nursery.start_soon(waiter)
            await trio.sleep(0.01)
            assert not result
            call("fence.signal", f)
        return result

    assert trio.run(main) == [0]


def test_every_export_is_declared_with_its_ref_types():
    from tinyhal.vm.hal_module import EXPORTS

    mod = create_hal_module(hal.create_device("sync"))
    assert {f"hal.{name}" for name, *_ in EXPORTS} == set(mod.functions)
    for name, cconv, refs, *_rest in EXPORTS:
        assert mod.functions[f"hal.{name}"].cconv == cconv
        if refs is not None:
            assert all(r is None or r.rstrip("?") in (
                "hal.allocator", "hal.buffer", "hal.buffer_view", "hal.command_buffer",
                "hal.device", "hal.executable", "hal.fence", "hal.file") for r in refs)


def test_every_shim_checks_the_refs_its_row_declares():
    """Each shim checks its declared refs itself, in order: with every earlier ref valid,
    a wrong object in a ref position is INVALID_ARGUMENT naming the declared type, and
    null is too unless the declaration allows it."""
    from support.executables import compile_executable
    from tinyhal.hal import Fence, Semaphore
    from tinyhal.vm.hal_module import EXPORTS, HalFile

    dev = hal.create_device("sync")
    try:
        buffer = dev.allocator.allocate(64)
        valid = {
            "hal.allocator": dev.allocator, "hal.buffer": buffer,
            "hal.buffer_view": hal.BufferView(buffer, (16,), 0x21000020),
            "hal.command_buffer": dev.create_command_buffer(), "hal.device": dev,
            "hal.executable": dev.load_executable(compile_executable("elementwise_3d")),
            "hal.fence": Fence([(Semaphore(0), 1)]),
            "hal.file": HalFile(memoryview(b"x"), 1, None),
        }
        mod = create_hal_module(dev)
        checked = 0
        for name, _cconv, refs, *_rest in EXPORTS:
            fn = mod.functions[f"hal.{name}"].fn
            for i, ref in enumerate(refs or ()):
                if ref is None:
                    continue
                args = [valid[r.rstrip("?")] if r is not None and j < i else 0
                        for j, r in enumerate(refs)]
                for wrong in (object(), None):
                    if wrong is None and ref.endswith("?"):
                        continue
                    args[i] = wrong
                    with pytest.raises(tinyhal.errors.InvalidArgumentError,
                                       match=f"expected a {ref.rstrip('?')} ref"):
                        fn(*args)
                    checked += 1
        assert checked > 60
    finally:
        dev.close()


@pytest.mark.parametrize("name, args, message", [
    ("buffer.length", (None,), "expected a hal.buffer ref but got null"),
    ("buffer_view.rank", ("view",), "expected a hal.buffer_view ref but got str"),
    ("device.allocator", (3,), "expected a hal.device ref but got int"),
    ("fence.query", (None,), "expected a hal.fence ref but got null"),
])
def test_declared_refs_are_checked_before_the_shim_runs(env, name, args, message):
    _dev, call = env
    with pytest.raises(tinyhal.errors.InvalidArgumentError, match=message):
        call(name, *args)


def test_nullable_refs_accept_null_and_reject_other_types(env):
    dev, call = env
    # queue.barrier's wait and signal fences may be null ...
    call("device.queue.barrier", dev, -1, None, None, 0)
    # ... but not another type
    with pytest.raises(tinyhal.errors.InvalidArgumentError,
                       match="expected a hal.fence ref or null but got SyncDevice|TaskDevice"):
        call("device.queue.barrier", dev, -1, dev, None, 0)


def test_generated_prologues_keep_one_frame_and_the_bodys_line_numbers():
    """Each shim's ref checks and queue come from its row, generated once at import into
    the shim itself (no wrapper frame), and an error in its body points at the body's
    line in the source."""
    import linecache
    import traceback

    from tinyhal.vm import hal_module

    dev = hal.create_device("sync")
    try:
        mod = create_hal_module(dev)
        fn = mod.functions["hal.buffer.load"].fn
        assert fn.func is hal_module.buffer_load  # the generated shim, bound: one frame
        assert "ref_check_failed" in fn.func.__code__.co_names
        assert "queue" in hal_module.device_queue_execute.__code__.co_varnames
        with pytest.raises(tinyhal.errors.InvalidArgumentError) as raised:
            fn(dev.allocator.allocate(64), 0, 8)
        frame = traceback.extract_tb(raised.tb)[-1]
        assert frame.filename == hal_module.__file__ and frame.name == "buffer_load"
        assert "raise InvalidArgumentError" in linecache.getline(frame.filename, frame.lineno)
    finally:
        dev.close()

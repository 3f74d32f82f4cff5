"""A real network: MobileNetV2 (seeded random weights, built with onnx), IREE vs tinyhal."""

from __future__ import annotations

import numpy as np
import pytest

import tinyhal
from support.models import mobilenet_input, mobilenet_v2_vmfb

pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def vmfb():
    return mobilenet_v2_vmfb()


@pytest.fixture(scope="module")
def expected(vmfb):
    import iree.runtime as rt

    config = rt.Config("local-sync")
    ctx = rt.SystemContext(config=config)
    ctx.add_vm_module(rt.VmModule.mmap(ctx.instance, str(vmfb)))
    return ctx.modules.module["mobilenet_v2"](mobilenet_input()).to_host()


@pytest.mark.parametrize("driver", ["sync", "task"])
def test_mobilenet_v2_matches_iree(vmfb, expected, driver):
    with tinyhal.load(vmfb, device=driver) as module:
        assert set(module.function_names) == {"mobilenet_v2", "mobilenet_v2$async"}
        ours = module.mobilenet_v2(mobilenet_input())
        assert ours.dtype == expected.dtype and ours.shape == (1, 1000)
        assert ours.tobytes() == expected.tobytes()
        again = module.mobilenet_v2(mobilenet_input())  # state (weights, cmd buffers) reused
        assert again.tobytes() == expected.tobytes()
        # every transient and result buffer was returned, and the input buffer too: it is
        # larger than the inputs kept idle for the next call
        assert mobilenet_input().nbytes > 256 << 10
        assert module.statistics().live_bytes == 0
        module.trim()
        stats = module.statistics()
        assert stats.live_bytes == 0
        # weights are imported from the module's rodata in place, never copied
        assert stats["device"].peak_bytes < 1 << 20


def test_mobilenet_v2_from_bytes_and_async(vmfb, expected):
    import trio

    data = vmfb.read_bytes()
    with tinyhal.load(data, device="task") as module:
        async def main():
            results = [None] * 3

            async def one(i):
                results[i] = await module.invoke_async("mobilenet_v2", mobilenet_input())

            async with trio.open_nursery() as nursery:
                for i in range(3):
                    nursery.start_soon(one, i)
            return results

        for r in trio.run(main):
            assert r.tobytes() == expected.tobytes()
        assert module.statistics()["device"].peak_bytes < 4 << 20


def test_mobilenet_bad_input_names_argument(vmfb):
    with tinyhal.load(vmfb, device="sync") as module, pytest.raises(tinyhal.Error) as info:
        module.mobilenet_v2(np.zeros((1, 3, 224, 225), np.float32))
    assert "input0" in str(info.value) or "shape" in str(info.value)


def test_mobilenet_v2_peak_memory_exact_per_device_and_within_iree(vmfb):
    """One invocation's peak device memory is the same on every driver, counted per
    device (two devices in one process do not share counts), and no more than what IREE's
    allocator reports for the same module on local-sync."""
    import iree.runtime as rt

    config = rt.Config("local-sync")
    ctx = rt.SystemContext(config=config)
    ctx.add_vm_module(rt.VmModule.mmap(ctx.instance, str(vmfb)))
    ctx.modules.module["mobilenet_v2"](mobilenet_input()).to_host()
    iree_stats = config.device.allocator.statistics
    iree_peak = iree_stats["device_bytes_peak"] + iree_stats["host_bytes_peak"]

    peaks = {}
    for driver in ("sync", "task", "emu"):
        with tinyhal.load(vmfb, device=driver) as module:
            module.mobilenet_v2(mobilenet_input())
            module.trim()
            stats = module.statistics()
            assert stats.live_bytes == 0
            peaks[driver] = stats.peak_bytes
    assert len(set(peaks.values())) == 1, peaks
    assert 0 < peaks["sync"] <= iree_peak

    with tinyhal.load(vmfb, device="sync") as busy, tinyhal.load(vmfb, device="sync") as idle:
        busy.mobilenet_v2(mobilenet_input())
        assert busy.statistics().peak_bytes == peaks["sync"]
        assert idle.statistics().peak_bytes == 0


def test_mobilenet_v2_weights_through_file_read_when_import_refuses(vmfb, expected, monkeypatch):
    """When the allocator cannot import rodata in place (try-import returns null), the
    module falls back to `hal.ex.file.from_memory` + `device.queue.read`: same bits,
    weights now copied into device memory."""
    from tinyhal.hal.allocator import Allocator

    monkeypatch.setattr(Allocator, "import_host", lambda self, *a, **k: None)
    with tinyhal.load(vmfb, device="task") as module:
        ours = module.mobilenet_v2(mobilenet_input())
        assert ours.tobytes() == expected.tobytes()
        assert module.statistics()["device"].live_bytes > 1 << 20  # the weights, copied

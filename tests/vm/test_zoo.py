"""The model zoo (BERT-tiny, a GPT decoder step with its KV cache, LSTM, GRU): IREE vs
tinyhal on every driver, bit for bit.

These programs record one-shot command buffers of many small dispatches on every call
(the recurrent ones inside a VM loop over time steps), so two calls with different
inputs check that each call's recording binds that call's buffers.
"""

from __future__ import annotations

import numpy as np
import pytest

import tinyhal
from support.zoo import ZOO, zoo_inputs, zoo_vmfb

pytest.importorskip("onnx")


def _arrays(result) -> list[np.ndarray]:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _iree_reference(vmfb, function: str):
    import iree.runtime as rt

    ctx = rt.SystemContext(config=rt.Config("local-sync"))
    ctx.add_vm_module(rt.VmModule.mmap(ctx.instance, str(vmfb)))
    fn = ctx.modules.module[function]
    return lambda *args: [r.to_host() for r in _arrays(fn(*args))]


def _perturbed(args: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """The same inputs with every float one changed (ids and masks kept valid)."""
    return tuple(a * np.float32(0.5) + np.float32(0.25) if a.dtype == np.float32 else a
                 for a in args)


@pytest.fixture(scope="module", params=sorted(ZOO))
def zoo_case(request):
    name = request.param
    vmfb = zoo_vmfb(name)
    reference = _iree_reference(vmfb, ZOO[name].function)
    first = zoo_inputs(name)
    second = _perturbed(first)
    expected = [[a.tobytes() for a in reference(*args)] for args in (first, second)]
    return name, vmfb, (first, second), expected


@pytest.mark.parametrize("driver", ["sync", "task", "emu"])
def test_zoo_model_matches_iree_bit_exactly(zoo_case, driver):
    name, vmfb, inputs, expected = zoo_case
    with tinyhal.load(vmfb, device=driver) as module:
        fn = getattr(module, ZOO[name].function)
        for _round in range(2):
            for args, want in zip(inputs, expected):
                got = [a.tobytes() for a in _arrays(fn(*args))]
                assert got == want, (name, driver)


def test_closing_a_module_drops_the_recordings_its_device_cached():
    """Recordings hold executables: a device shared by modules must not keep a closed
    module's executables alive through its recording cache."""
    device = tinyhal.hal.create_device("sync")
    try:
        name = "gru"
        module = tinyhal.load(zoo_vmfb(name), device=device)
        getattr(module, ZOO[name].function)(*zoo_inputs(name))
        assert len(device.recordings) > 0
        module.close()
        assert len(device.recordings) == 0
    finally:
        device.close()

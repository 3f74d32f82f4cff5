"""A program compiled for two devices (`--iree-hal-target-device=device_a=local[0]
--iree-hal-target-device=device_b=local[1]`, `flow.tensor.transfer` between them) runs
with IREE's bits on two devices of every driver and on a `task` CPU beside an `emu`
accelerator, through `tinyhal.load(device=[...])` and `tinyhal-run --device= --device=`."""

from __future__ import annotations

import numpy as np
import pytest

import tinyhal
from support.iree_tools import compile_mlir
from support.run_compare import iree_run_module, tinyhal_run
from tinyhal.errors import IncompatibleError

TWO_DEVICES = """
func.func @main(%x: tensor<64xf32>) -> tensor<64xf32> {
  %a = flow.tensor.transfer %x : tensor<64xf32> to #hal.device.promise<@device_a>
  %s = arith.mulf %a, %a : tensor<64xf32>
  %b = flow.tensor.transfer %s : tensor<64xf32> to #hal.device.promise<@device_b>
  %t = arith.addf %b, %b : tensor<64xf32>
  %c = flow.tensor.transfer %t : tensor<64xf32> to #hal.device.promise<@device_a>
  %r = arith.subf %c, %a : tensor<64xf32>
  return %r : tensor<64xf32>
}
"""
FLAGS = ["--iree-hal-target-device=device_a=local[0]",
         "--iree-hal-target-device=device_b=local[1]",
         "--iree-hal-local-target-device-backends=llvm-cpu", "--iree-llvmcpu-target-cpu=host"]
PAIRS = [("sync", "sync"), ("task", "task"), ("emu", "emu"), ("task", "emu"), ("emu", "sync")]


@pytest.fixture(scope="module")
def vmfb():
    return compile_mlir(TWO_DEVICES, FLAGS)


def _iree(vmfb, x: np.ndarray, tmp_path) -> np.ndarray:
    """iree-run-module's result on two local-task devices (through .npy files)."""
    np.save(tmp_path / "x.npy", x)
    rc, out = iree_run_module(["--device=local-task", "--device=local-task",
                               f"--module={vmfb}", f"--input=@{tmp_path / 'x.npy'}",
                               f"--output=@{tmp_path / 'y.npy'}"])
    assert rc == 0, out
    return np.load(tmp_path / "y.npy")


@pytest.mark.parametrize("pair", PAIRS, ids=["+".join(p) for p in PAIRS])
def test_two_devices_give_iree_bits(vmfb, pair, tmp_path):
    x = np.linspace(-4, 4, 64, dtype=np.float32)
    expected = _iree(vmfb, x, tmp_path)
    np.testing.assert_array_equal(expected, 2 * x * x - x)
    with tinyhal.load(vmfb, device=list(pair)) as module:
        assert module.main(x).tobytes() == expected.tobytes()
        assert [d.identifier.split("-")[-1] for d in module.devices] == list(pair)
        if pair == ("task", "emu"):  # device_b's work ran on the modelled accelerator
            assert module.devices[1].summary().dispatches >= 1


def test_tinyhal_run_takes_several_devices(vmfb):
    args = [f"--module={vmfb}", "--input=64xf32=1.5"]
    rc, expected = iree_run_module(["--device=local-task", "--device=local-task", *args])
    assert rc == 0
    for devices in (["task", "task"], ["sync", "emu"], ["emu://edge-npu", "task"]):
        flags = [f"--device={d}" for d in devices] + args
        assert tinyhal_run(flags) == (0, expected, "")


def test_one_device_for_a_two_device_program_is_incompatible(vmfb):
    with pytest.raises(IncompatibleError, match="HAL device `device_b` not found"):
        tinyhal.load(vmfb, device="task")

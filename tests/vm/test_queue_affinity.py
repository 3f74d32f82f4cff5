"""Queue affinities as IREE's HAL uses them: a program compiled with explicit queue
affinities (`#hal.device.affinity<@device_a, [1]>`) passes queue masks to
`hal.device.queue.*`. IREE's CPU devices (local-task, local-sync) take the mask modulo
their queue count, so one-queue devices run every mask on queue 0; IREE's accelerator
rule (its amdgpu driver), which the `emu` driver models, ANDs the mask with the
device's queues and takes the first set bit, rejecting a mask naming none of them."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tinyhal
from support.iree_tools import compile_mlir
from support.models import iree_function
from support.run_compare import tinyhal_run
from tinyhal import hal
from tinyhal.errors import InvalidArgumentError

ON_QUEUES = """
func.func @main(%x: tensor<64xf32>) -> tensor<64xf32> {
  %a = flow.tensor.transfer %x : tensor<64xf32> to #hal.device.affinity<@device_a, [1]>
  %s = arith.mulf %a, %a : tensor<64xf32>
  %b = flow.tensor.transfer %s : tensor<64xf32> to #hal.device.affinity<@device_a, [0]>
  %t = arith.addf %b, %b : tensor<64xf32>
  return %t : tensor<64xf32>
}
"""
FLAGS = ["--iree-hal-target-device=device_a=local",
         "--iree-hal-local-target-device-backends=llvm-cpu", "--iree-llvmcpu-target-cpu=host"]


@pytest.fixture(scope="module")
def vmfb():
    return compile_mlir(ON_QUEUES, FLAGS)


def test_cpu_devices_run_every_mask_on_their_one_queue():
    with hal.create_device("task") as device:
        assert device.queue_count == 1 == device.query("hal.device", "concurrency")
        assert [device.queue_for_affinity(m) for m in (-1, 1, 2, 3, 1 << 63)] == [0] * 5


def test_emu_takes_the_first_of_its_queues_in_the_mask():
    with hal.create_device("emu", queues=2) as device:
        assert device.query("hal.device", "concurrency") == 2
        assert [device.queue_for_affinity(m) for m in (-1, 1, 2, 3, 6)] == [0, 0, 1, 0, 1]
        with pytest.raises(InvalidArgumentError, match="names none of the 2 queue"):
            device.queue_for_affinity(4)


@pytest.mark.parametrize("driver", ["sync", "task", "emu"])
def test_program_with_queue_affinities_gives_iree_bits(vmfb, driver):
    x = np.linspace(-3, 3, 64, dtype=np.float32)
    expected = iree_function(vmfb, "main", "local-task")(x)
    np.testing.assert_array_equal(expected, 2 * x * x)
    device = hal.create_device(driver, **({"queues": 2} if driver == "emu" else {}))
    with device, tinyhal.load(vmfb, device=device) as module:
        with module.profiling("queue-events") as (profile,):
            assert module.main(x).tobytes() == expected.tobytes()
    records = [json.loads(line) for line in profile.ireeperf_lines()]
    executes = {r["queue_ordinal"] for r in records
                if r["record_type"] == "queue_event" and r["op"] == "execute"}
    # The mulf was placed on queue [1] and the addf on queue [0]: on a two-queue emu
    # device they run on those queues, on a CPU device both on its one queue.
    assert executes == ({0, 1} if driver == "emu" else {0})


def test_a_mask_naming_no_queue_of_an_accelerator_is_invalid(vmfb):
    rc, _, err = tinyhal_run(["--device=emu", f"--module={vmfb}", "--input=64xf32=1"])
    assert rc == 1 and "INVALID_ARGUMENT" in err and "names none of the 1 queue" in err

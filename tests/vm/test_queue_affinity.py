"""Queue affinities as IREE's HAL uses them: a program compiled with explicit queue
affinities (`#hal.device.affinity<@device_a, [1]>`) passes queue masks to
`hal.device.queue.*`. IREE's CPU devices (local-task, local-sync) take the mask modulo
their queue count, so one-queue devices run every mask on queue 0; IREE's accelerator
rule (its amdgpu driver), which the `emu` driver models, ANDs the mask with the
device's queues and takes the first set bit; where none is left, emu falls back to the
CPU rule so a program IREE's CPU devices run also runs there."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tinyhal
from support.iree_tools import compile_mlir
from support.models import iree_function
from support.run_compare import tinyhal_run
from tinyhal import hal

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
        assert [device.queue_for_affinity(m) for m in (4, 8, 12)] == [0, 0, 0]  # 4 % 2 ...
    with hal.create_device("emu", queues=3) as device:
        assert [device.queue_for_affinity(m) for m in (4, 8, 16)] == [2, 2, 1]


DEVICES = [("sync", {}), ("task", {}), ("emu", {}), ("emu", {"queues": 2})]


@pytest.mark.parametrize("driver,options", DEVICES, ids=["sync", "task", "emu", "emu-2q"])
def test_program_with_queue_affinities_gives_iree_bits(vmfb, driver, options):
    x = np.linspace(-3, 3, 64, dtype=np.float32)
    expected = iree_function(vmfb, "main", "local-task")(x)
    np.testing.assert_array_equal(expected, 2 * x * x)
    device = hal.create_device(driver, **options)
    with device, tinyhal.load(vmfb, device=device) as module:
        with module.profiling("queue-events") as (profile,):
            assert module.main(x).tobytes() == expected.tobytes()
    records = [json.loads(line) for line in profile.to_ireeperf_jsonl().splitlines()]
    executes = {r["queue_ordinal"] for r in records
                if r["record_type"] == "queue_event" and r["op"] == "execute"}
    # The mulf was placed on queue [1] and the addf on queue [0]: on a two-queue emu
    # device they run on those queues, on a CPU device both on its one queue.
    assert executes == ({0, 1} if options else {0})


def test_tinyhal_run_places_the_program_on_emu_queues(vmfb, tmp_path):
    profile = tmp_path / "run.jsonl"
    args = [f"--module={vmfb}", "--input=64xf32=1.5"]
    rc, out, err = tinyhal_run(["--device=emu://?queues=2", *args,
                                f"--device_profiling_output={profile}"])
    assert (rc, err) == (0, "") and "64xf32=4.5" in out
    records = [json.loads(line) for line in profile.read_text().splitlines()]
    assert {r["queue_ordinal"] for r in records
            if r["record_type"] == "queue_event" and r["op"] == "execute"} == {0, 1}


def test_emu_device_uri_takes_only_a_queue_count(vmfb):
    rc, _, err = tinyhal_run(["--device=emu://?lanes=2", f"--module={vmfb}"])
    assert rc == 2 and "takes `?queues=N`" in err and err.count("\n") == 1

"""A program compiled for two devices (`--iree-hal-target-device=device_a=local[0]
--iree-hal-target-device=device_b=local[1]`, `flow.tensor.transfer` between them) runs
with IREE's bits on two devices of every driver and on a `task` CPU beside an `emu`
accelerator, through `tinyhal.load(device=[...])` and `tinyhal-run --device= --device=`."""

from __future__ import annotations

import json

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


def _by_device(records: list[dict], kind: str) -> dict[int, int]:
    counts: dict[int, int] = {}
    for record in records:
        if record["record_type"] == kind:
            ordinal = record["physical_device_ordinal"]
            counts[ordinal] = counts.get(ordinal, 0) + 1
    return counts


@pytest.mark.parametrize("pair", [("task", "task"), ("task", "emu")], ids="+".join)
def test_tinyhal_run_profiles_every_device_into_one_file(vmfb, pair, tmp_path):
    args = [f"--device={d}" for d in pair] + [f"--module={vmfb}", "--input=64xf32=1.5"]
    trace, jsonl = tmp_path / "run.json", tmp_path / "run.ireeperf.jsonl"
    for output in (trace, jsonl):
        rc, _, err = tinyhal_run([*args, f"--device_profiling_output={output}"])
        assert rc == 0, err
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    kinds = [r["record_type"] for r in records]
    assert kinds.count("schema") == 1 and kinds.count("session") == 2
    assert [r["source_record_index"] for r in records[1:]] == list(range(len(records) - 1))
    devices = [r for r in records if r["record_type"] == "device"]
    assert [d["physical_device_ordinal"] for d in devices] == [0, 1]
    assert [d["tinyhal_device"].split("-")[-1] for d in devices] == list(pair)
    # Each device's queue operations and executions are its own, told apart by ordinal.
    assert set(_by_device(records, "queue_event")) == {0, 1}
    assert set(_by_device(records, "host_execution_event")) == {0, 1}
    if pair[1] == "emu":
        assert _by_device(records, "dispatch_event") == {1: 1}
    executables = [r["executable_id"] for r in records if r["record_type"] == "executable"]
    assert len(executables) == len(set(executables)) >= 2  # ids unique across devices
    names = [e["args"]["name"] for e in json.loads(trace.read_text())["traceEvents"]
             if e["name"] == "process_name"]
    assert names[:2] == [f"[0] local-{pair[0]} (host time)", f"[1] local-{pair[1]} (host time)"]


def test_python_api_profiles_and_measures_each_device(vmfb):
    x = np.linspace(-4, 4, 64, dtype=np.float32)
    with tinyhal.load(vmfb, device=["task", "emu"]) as module:
        with module.profiling() as profiles:
            module.main(x)
        assert [p.physical_device_ordinal for p in profiles] == [0, 1]
        assert all(p.summary().queue_operations for p in profiles)
        assert list(profiles[1].summary().by_export) == ["main_dispatch_1_elementwise_64_f32"]
        statistics = module.device_statistics()
        assert len(statistics) == 2 and statistics[0] == module.statistics()
        assert all(s.peak_bytes >= 64 * 4 for s in statistics)  # a 64xf32 tensor each

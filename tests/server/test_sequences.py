"""Stateful sequences and cellular batching (server/sequences.py) against a real server
with tritonclient: outputs equal to each sequence run alone, Triton's control-flow errors,
idle expiry, slots freed after a client went away, control inputs, failure isolation."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from serve_helpers import SAMPLES, ServerProcess, write_model
from tritonclient.utils import InferenceServerException

import tinyhal
from support.iree_tools import HOST_FLAGS, compile_mlir
from tinyhal.server.sequences import parse_sequence_config

GRU = SAMPLES / "gru_step" / "1" / "model.vmfb"

# X is added to the state ACC; FLAGS reports the control inputs as the program saw them
# (START + 2 END + 4 READY + 8 CORRID); a negative X fails the whole invocation.
CONTROL_MLIR = """
#id = affine_map<(d0, d1) -> (d0, d1)>
#all = affine_map<(d0, d1) -> ()>
func.func @acc(%x: tensor<?x1xf32> {iree.abi.name = "X"},
               %start: tensor<?x1xi32> {iree.abi.name = "START"},
               %end: tensor<?x1xi32> {iree.abi.name = "END"},
               %ready: tensor<?x1xf32> {iree.abi.name = "READY"},
               %corrid: tensor<?x1xi64> {iree.abi.name = "CORRID"},
               %acc: tensor<?x1xf32> {iree.abi.name = "ACC_IN"})
    -> (tensor<?x1xf32> {iree.abi.name = "SUM"}, tensor<?x1xi64> {iree.abi.name = "FLAGS"},
        tensor<?x1xf32> {iree.abi.name = "ACC_OUT"}) {
  %c0 = arith.constant 0 : index
  %zero = arith.constant 0.0 : f32
  %inf = arith.constant 0x7F800000 : f32
  %e0 = tensor.empty() : tensor<f32>
  %m0 = linalg.fill ins(%inf : f32) outs(%e0 : tensor<f32>) -> tensor<f32>
  %mn = linalg.generic {indexing_maps = [#id, #all], iterator_types = ["reduction", "reduction"]}
      ins(%x : tensor<?x1xf32>) outs(%m0 : tensor<f32>) {
  ^bb0(%a: f32, %o: f32):
    %m = arith.minimumf %a, %o : f32
    linalg.yield %m : f32
  } -> tensor<f32>
  %v = tensor.extract %mn[] : tensor<f32>
  %ok = arith.cmpf oge, %v, %zero : f32
  cf.assert %ok, "X must not be negative"
  %n = tensor.dim %x, %c0 : tensor<?x1xf32>
  %ef = tensor.empty(%n) : tensor<?x1xf32>
  %ei = tensor.empty(%n) : tensor<?x1xi64>
  %sum = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x, %acc : tensor<?x1xf32>, tensor<?x1xf32>) outs(%ef : tensor<?x1xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %s = arith.addf %a, %b : f32
    linalg.yield %s : f32
  } -> tensor<?x1xf32>
  %flags = linalg.generic {indexing_maps = [#id, #id, #id, #id, #id],
                           iterator_types = ["parallel", "parallel"]}
      ins(%start, %end, %ready, %corrid : tensor<?x1xi32>, tensor<?x1xi32>, tensor<?x1xf32>,
          tensor<?x1xi64>) outs(%ei : tensor<?x1xi64>) {
  ^bb0(%s: i32, %e: i32, %r: f32, %c: i64, %o: i64):
    %s64 = arith.extsi %s : i32 to i64
    %e64 = arith.extsi %e : i32 to i64
    %r64 = arith.fptosi %r : f32 to i64
    %two = arith.constant 2 : i64
    %four = arith.constant 4 : i64
    %eight = arith.constant 8 : i64
    %e2 = arith.muli %e64, %two : i64
    %r4 = arith.muli %r64, %four : i64
    %c8 = arith.muli %c, %eight : i64
    %a1 = arith.addi %s64, %e2 : i64
    %a2 = arith.addi %a1, %r4 : i64
    %a3 = arith.addi %a2, %c8 : i64
    linalg.yield %a3 : i64
  } -> tensor<?x1xi64>
  return %sum, %flags, %sum : tensor<?x1xf32>, tensor<?x1xi64>, tensor<?x1xf32>
}
"""

CONTROL_CONFIG = {
    "function": "acc", "device": "sync", "max_batch_size": 16,
    "sequence_batching": {
        "max_sequence_idle_microseconds": 30000000,
        "oldest": {"max_candidate_sequences": 16, "max_queue_delay_microseconds": 2000},
        "control_input": [
            {"name": "START", "control": [{"kind": "CONTROL_SEQUENCE_START",
                                           "int32_false_true": [0, 1]}]},
            {"name": "END", "control": [{"kind": "CONTROL_SEQUENCE_END",
                                         "int32_false_true": [0, 1]}]},
            {"name": "READY", "control": [{"kind": "CONTROL_SEQUENCE_READY",
                                           "fp32_false_true": [0, 1]}]},
            {"name": "CORRID", "control": [{"kind": "CONTROL_SEQUENCE_CORRID",
                                            "data_type": "TYPE_INT64"}]},
        ],
        "state": [{"input_name": "ACC_IN", "output_name": "ACC_OUT", "data_type": "TYPE_FP32",
                   "dims": [1], "initial_state": [{"data_type": "TYPE_FP32", "dims": [1],
                                                   "data_file": "hundred", "name": "h"}]}],
    },
}

# Y = S + X * READY (and the new state S); N reports the rows of the execution
DIRECT_MLIR = """
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @f(%x: tensor<?x1xf32> {iree.abi.name = "X"},
             %ready: tensor<?x1xi32> {iree.abi.name = "READY"},
             %s: tensor<?x1xf32> {iree.abi.name = "S_IN"})
    -> (tensor<?x1xf32> {iree.abi.name = "Y"}, tensor<?x1xf32> {iree.abi.name = "N"},
        tensor<?x1xf32> {iree.abi.name = "S_OUT"}) {
  %c0 = arith.constant 0 : index
  %n = tensor.dim %x, %c0 : tensor<?x1xf32>
  %e = tensor.empty(%n) : tensor<?x1xf32>
  %y = linalg.generic {indexing_maps = [#id, #id, #id, #id],
                       iterator_types = ["parallel", "parallel"]}
      ins(%x, %ready, %s : tensor<?x1xf32>, tensor<?x1xi32>, tensor<?x1xf32>)
      outs(%e : tensor<?x1xf32>) {
  ^bb0(%a: f32, %r: i32, %b: f32, %o: f32):
    %rf = arith.sitofp %r : i32 to f32
    %ar = arith.mulf %a, %rf : f32
    %t = arith.addf %ar, %b : f32
    linalg.yield %t : f32
  } -> tensor<?x1xf32>
  %ni = arith.index_cast %n : index to i64
  %nf = arith.sitofp %ni : i64 to f32
  %e2 = tensor.empty(%n) : tensor<?x1xf32>
  %rows = linalg.fill ins(%nf : f32) outs(%e2 : tensor<?x1xf32>) -> tensor<?x1xf32>
  return %y, %rows, %y : tensor<?x1xf32>, tensor<?x1xf32>, tensor<?x1xf32>
}
"""

DIRECT_CONFIG = {
    "function": "f", "device": "sync", "max_batch_size": 4,
    "sequence_batching": {
        "max_sequence_idle_microseconds": 30000000, "direct": {},
        "control_input": [{"name": "READY", "control": [
            {"kind": "CONTROL_SEQUENCE_READY", "int32_false_true": [0, 1]}]}],
        "state": [{"input_name": "S_IN", "output_name": "S_OUT", "data_type": "TYPE_FP32",
                   "dims": [1], "initial_state": [{"data_type": "TYPE_FP32", "dims": [1],
                                                   "zero_data": True, "name": "z"}]}],
    },
}

# Y = S + X, with an INT32 CORRID control (its range bounds the sequence ids taken)
CORRID32_MLIR = """
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @f(%x: tensor<?x1xf32> {iree.abi.name = "X"},
             %c: tensor<?x1xi32> {iree.abi.name = "CORRID"},
             %s: tensor<?x1xf32> {iree.abi.name = "S_IN"})
    -> (tensor<?x1xf32> {iree.abi.name = "Y"}, tensor<?x1xf32> {iree.abi.name = "S_OUT"}) {
  %c0 = arith.constant 0 : index
  %n = tensor.dim %x, %c0 : tensor<?x1xf32>
  %e = tensor.empty(%n) : tensor<?x1xf32>
  %y = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x, %s : tensor<?x1xf32>, tensor<?x1xf32>) outs(%e : tensor<?x1xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %t = arith.addf %a, %b : f32
    linalg.yield %t : f32
  } -> tensor<?x1xf32>
  return %y, %y : tensor<?x1xf32>, tensor<?x1xf32>
}
"""

CORRID32_CONFIG = {
    "function": "f", "device": "sync", "max_batch_size": 4,
    "sequence_batching": {
        "control_input": [{"name": "CORRID", "control": [
            {"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_INT32"}]}],
        "state": [{"input_name": "S_IN", "output_name": "S_OUT", "data_type": "TYPE_FP32",
                   "dims": [1], "initial_state": [{"data_type": "TYPE_FP32", "dims": [1],
                                                   "zero_data": True, "name": "z"}]}],
    },
}

IDLE_US = 300_000
ROUND_US = 200_000  # gru_rounds' queue delay


def _gru_config(**changes) -> dict:
    config = json.loads((SAMPLES / "gru_step" / "config.json").read_text())
    config["sequence_batching"].update(changes)
    return config


def _gru_async() -> Path:
    """The gru_step sample compiled with the coarse-fences ABI: `step` takes a wait and a
    signal fence, so its state gathers are ordered before it on the device."""
    from tinyhal.server.models.build_samples import gru_step

    mlir, _ = gru_step()
    return compile_mlir(mlir, HOST_FLAGS + ["--iree-execution-model=async-external"])


@pytest.fixture(scope="module")
def seq_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("seqrepo")
    shutil.copytree(SAMPLES / "gru_step", root / "gru_step")
    write_model(root, "gru_short", GRU, _gru_config(max_sequence_idle_microseconds=IDLE_US))
    write_model(root, "gru_one", GRU, _gru_config(
        max_sequence_idle_microseconds=IDLE_US, oldest={"max_candidate_sequences": 1}))
    # every step waits out a queue delay (nobody fills a batch of 4): time to hang up
    write_model(root, "gru_wait", GRU, _gru_config(
        max_sequence_idle_microseconds=60_000_000,
        oldest={"max_candidate_sequences": 2, "max_queue_delay_microseconds": 1_000_000,
                "preferred_batch_size": [4]}))
    # every execution waits out a queue delay from its oldest step (32 sequences never
    # fill a batch of 64): the steps of a round of all live sequences run together
    # however slowly a loaded machine lets their clients send them
    write_model(root, "gru_rounds", GRU, _gru_config(
        oldest={"max_candidate_sequences": 32, "max_queue_delay_microseconds": ROUND_US}))
    write_model(root, "gru_pref", GRU, _gru_config(
        oldest={"max_candidate_sequences": 16, "preferred_batch_size": [2]}))
    # 8 starts run as one batch (they wait for each other up to 1 s); the lone sequence
    # must outlive a loaded machine's pauses, so idle expiry is far off (its states are
    # looked at every second all the same)
    write_model(root, "gru_pack", GRU, _gru_config(
        max_sequence_idle_microseconds=20_000_000,
        oldest={"max_candidate_sequences": 16, "max_queue_delay_microseconds": 1_000_000,
                "preferred_batch_size": [8]}))
    for driver in ("task", "emu"):
        write_model(root, f"gru_{driver}", GRU, {**_gru_config(), "device": driver})
    write_model(root, "gru_async", _gru_async(), {**_gru_config(), "device": "task"})
    write_model(root, "acc", compile_mlir(CONTROL_MLIR, HOST_FLAGS), CONTROL_CONFIG)
    write_model(root, "direct", compile_mlir(DIRECT_MLIR, HOST_FLAGS), DIRECT_CONFIG)
    write_model(root, "corrid32", compile_mlir(CORRID32_MLIR, HOST_FLAGS), CORRID32_CONFIG)
    (root / "acc" / "1" / "initial_state").mkdir()
    (root / "acc" / "1" / "initial_state" / "hundred").write_bytes(
        np.float32(100).tobytes())
    proc = ServerProcess("--model-repository", str(root))
    try:
        yield proc.start()
    finally:
        proc.stop()


def _step(client, model: str, x: np.ndarray, name: str = "INPUT", **params):
    tensor = httpclient.InferInput(name, list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer(model, [tensor], **params)


def _stats(client, model: str) -> dict:
    return client.get_inference_statistics(model)["model_stats"][0]


def _error(fn) -> str:
    with pytest.raises(InferenceServerException) as info:
        fn()
    assert info.value.status() == "400", info.value
    return info.value.message()


def _run_sequences(server, model: str, inputs: list, first_id: int, end: bool = True
                   ) -> list[list[np.ndarray]]:
    """Runs sequence i (ids from `first_id`) over `inputs[i]` (one step each, the last
    with sequence_end if `end`), all sequences at once from their own threads and
    clients; the OUTPUT of every step."""
    got: list[list[np.ndarray]] = [[] for _ in inputs]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(inputs))

    def run(i: int) -> None:
        try:
            client = httpclient.InferenceServerClient(server.url, network_timeout=60)
            barrier.wait(timeout=30)
            for k, x in enumerate(inputs[i]):
                result = _step(client, model, x, sequence_id=first_id + i,
                               sequence_start=k == 0,
                               sequence_end=end and k == len(inputs[i]) - 1)
                got[i].append(result.as_numpy("OUTPUT"))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[0]
    return got


def test_32_interleaved_sequences_match_each_sequence_alone(seq_server):
    """32 sequences of 1-13 steps at once, each from its own client: every step's output
    is the one the sequence gives alone (tinyhal and iree.runtime), and the steps of
    different sequences ran batched. The model (`gru_rounds`) waits out a queue delay
    from each batch's oldest step, so batching does not depend on how closely a loaded
    machine lets 32 client threads send their steps."""
    model = "gru_rounds"
    rng = np.random.default_rng(7)
    lengths = [1 + (i * 7) % 13 for i in range(32)]
    inputs = [rng.normal(size=(n, 1, 8)).astype(np.float32) for n in lengths]
    before = _stats(httpclient.InferenceServerClient(seq_server.url), model)
    got = _run_sequences(seq_server, model, inputs, 1000)

    module = tinyhal.load(GRU.read_bytes(), device="sync")
    import iree.runtime as ireert

    config = ireert.Config("local-sync")
    context = ireert.SystemContext(config=config)
    context.add_vm_module(ireert.VmModule.copy_buffer(context.instance, GRU.read_bytes()))
    for i, xs in enumerate(inputs):
        h = np.zeros((1, 16), np.float32)
        hi = h
        for k, x in enumerate(xs):
            y, h = module.invoke("step", x, h)
            yi, hi = context.modules.module.step(x, hi)
            assert np.array_equal(got[i][k], y), (i, k)
            assert np.array_equal(np.asarray(yi), y), (i, k)
            hi = np.asarray(hi)

    client = httpclient.InferenceServerClient(seq_server.url)
    after = _stats(client, model)
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == sum(lengths)
    assert executions * 2 <= inferences, (executions, inferences)  # batching happened
    assert any(b["batch_size"] > 1 for b in after["batch_stats"])
    seq = after["sequence_stats"]
    assert seq["live_sequences"] == 0 and seq["slots_in_use"] == 0
    assert seq["host"]["invoke"]["count"] >= executions
    assert seq["state_gathers"]["in_place"] > 0  # a batch's rows where its last left them
    labels = (("model", model), ("version", "1"))
    metrics = seq_server.metrics()
    assert metrics[("tinyhal_sequences_live", labels)] == 0
    assert metrics[("tinyhal_sequence_slots_in_use", labels)] == 0
    assert metrics[("tinyhal_sequence_batch_size_count", labels)] == after["execution_count"]
    assert metrics[("tinyhal_sequence_batch_size_bucket", (("le", "1.0"), *labels))] < \
        after["execution_count"]
    assert metrics[("tinyhal_sequence_host_seconds_total",
                    (("model", model), ("phase", "invoke"), ("version", "1")))] > 0


def test_a_sequence_started_again_on_its_last_answer_is_new(seq_server):
    """Steps are answered from the instance thread before the loop takes in their
    outcome; a sequence's last step is not, so a client that starts the same id again
    as soon as it has that answer never finds the old sequence still in progress."""
    client = httpclient.InferenceServerClient(seq_server.url, network_timeout=60)
    x = np.full((1, 8), 0.25, np.float32)
    try:
        first = None
        for _ in range(40):
            out = [_step(client, "gru_step", x, sequence_id=4242, sequence_start=k == 0,
                         sequence_end=k == 2).as_numpy("OUTPUT") for k in range(3)]
            first = out if first is None else first
            for got, want in zip(out, first):
                np.testing.assert_array_equal(got, want)
    finally:
        client.close()


def _alone(xs: list[np.ndarray], vmfb: Path = GRU) -> list[np.ndarray]:
    """The OUTPUT of each step of one sequence run alone through tinyhal.load."""
    module = tinyhal.load(vmfb.read_bytes(), device="sync")
    h = np.zeros((1, 16), np.float32)
    out = []
    for x in xs:
        y, h = module.invoke("step", x, h)
        out.append(y)
    return out


@pytest.mark.parametrize("model", ["gru_task", "gru_emu", "gru_async"])
def test_state_on_each_driver_matches_each_sequence_alone(seq_server, model):
    """On `emu` the host cannot map device memory: the state never passes through it.
    `gru_async` (coarse-fences) waits for its state gathers on the device."""
    rng = np.random.default_rng(11)
    inputs = [list(rng.normal(size=(3 + i % 4, 1, 8)).astype(np.float32)) for i in range(6)]
    got = _run_sequences(seq_server, model, inputs, 50)
    vmfb = _gru_async() if model == "gru_async" else GRU  # its own numerics
    for i, xs in enumerate(inputs):
        for k, want in enumerate(_alone(xs, vmfb)):
            assert np.array_equal(got[i][k], want), (model, i, k)
    seq = _stats(httpclient.InferenceServerClient(seq_server.url), model)["sequence_stats"]
    assert seq["live_sequences"] == 0 and seq["slots_in_use"] == 0


def test_preferred_batch_size_cuts_batches(seq_server):
    rng = np.random.default_rng(5)
    inputs = [list(rng.normal(size=(4, 1, 8)).astype(np.float32)) for _ in range(6)]
    got = _run_sequences(seq_server, "gru_pref", inputs, 70)
    for i, xs in enumerate(inputs):
        for k, want in enumerate(_alone(xs)):
            assert np.array_equal(got[i][k], want), (i, k)
    batches = _stats(httpclient.InferenceServerClient(seq_server.url), "gru_pref")[
        "batch_stats"]
    assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in batches) == 24
    assert max(b["batch_size"] for b in batches) <= 2  # 6 ready are taken 2 at a time


def test_a_lone_sequence_stops_keeping_its_batch_outputs_alive(seq_server):
    """8 sequences step together: their states are the rows of one output. When 7 have
    ended, the 8th is copied to a buffer of its own (its state unchanged)."""
    rng = np.random.default_rng(3)
    xs = [list(rng.normal(size=(2, 1, 8)).astype(np.float32)) for _ in range(8)]
    starts = _run_sequences(seq_server, "gru_pack", [x[:1] for x in xs], 90, end=False)
    client = httpclient.InferenceServerClient(seq_server.url, network_timeout=30)
    row = 16 * 4
    seq = _stats(client, "gru_pack")["sequence_stats"]
    assert seq["state_bytes_reserved"] == 64 * row + 8 * row  # initial rows, one batch
    threads = [threading.Thread(target=_step, args=(
        httpclient.InferenceServerClient(seq_server.url, network_timeout=30), "gru_pack",
        xs[i][1]), kwargs={"sequence_id": 90 + i, "sequence_end": True}) for i in range(1, 8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    deadline = time.monotonic() + 30
    while _stats(client, "gru_pack")["sequence_stats"]["state_bytes_reserved"] > \
            64 * row + row and time.monotonic() < deadline:
        time.sleep(0.05)
    seq = _stats(client, "gru_pack")["sequence_stats"]
    assert seq["live_sequences"] == 1 and seq["state_bytes_reserved"] == 64 * row + row
    last = _step(client, "gru_pack", xs[0][1], sequence_id=90, sequence_end=True)
    want = _alone(xs[0])
    assert np.array_equal(starts[0][0], want[0])
    assert np.array_equal(last.as_numpy("OUTPUT"), want[1])


def test_metadata_hides_state_and_lists_sequence_extension(seq_server):
    client = httpclient.InferenceServerClient(seq_server.url)
    assert "sequence" in client.get_server_metadata()["extensions"]
    meta = client.get_model_metadata("gru_step")
    assert [i["name"] for i in meta["inputs"]] == ["INPUT"]
    assert [o["name"] for o in meta["outputs"]] == ["OUTPUT"]
    config = client.get_model_config("gru_step")
    state = config["sequence_batching"]["state"][0]
    assert state["data_type"] == "TYPE_FP32" and state["dims"] == [16]


def test_control_flow_errors_are_400_with_triton_messages(seq_server):
    client = httpclient.InferenceServerClient(seq_server.url)
    x = np.zeros((1, 8), np.float32)
    message = _error(lambda: _step(client, "gru_step", x))
    assert "must specify a non-zero or non-empty correlation ID" in message
    message = _error(lambda: _step(client, "gru_step", x, sequence_id=0))
    assert "correlation ID" in message
    message = _error(lambda: _step(client, "gru_step", x, sequence_id=424242))
    assert message == ("inference request for sequence 424242 to model 'gru_step' must "
                       "specify the START flag on the first request of the sequence")
    ones = np.ones((1, 8), np.float32)
    first = _step(client, "gru_step", ones, sequence_id=77, sequence_start=True)
    second = _step(client, "gru_step", ones, sequence_id=77)
    # as Triton: a second START ends the live sequence and starts it anew
    again = _step(client, "gru_step", ones, sequence_id=77, sequence_start=True)
    assert np.array_equal(again.as_numpy("OUTPUT"), first.as_numpy("OUTPUT"))
    assert not np.array_equal(second.as_numpy("OUTPUT"), first.as_numpy("OUTPUT"))
    # a string id is another sequence than the integer with the same digits
    message = _error(lambda: _step(client, "gru_step", x, sequence_id="77"))
    assert "must specify the START flag" in message
    _step(client, "gru_step", x, sequence_id="77", sequence_start=True, sequence_end=True)
    _step(client, "gru_step", x, sequence_id=77, sequence_end=True)
    message = _error(lambda: _step(client, "gru_step", x, sequence_id=77))
    assert "must specify the START flag" in message
    message = _error(lambda: _step(client, "gru_step", np.zeros((2, 8), np.float32),
                                   sequence_id=78, sequence_start=True))
    assert "must specify batch-size 1 due to requirements of sequence batcher" in message
    status, _, body = seq_server.request("POST", "/v2/models/gru_step/infer", {
        "parameters": {"sequence_id": 5, "sequence_start": "yes"},
        "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 8],
                    "data": [0.0] * 8}]})
    assert status == 400 and b"'sequence_start' must be true or false" in body
    status, _, body = seq_server.request("POST", "/v2/models/gru_step/infer", {
        "parameters": {"sequence_id": -3},
        "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 8],
                    "data": [0.0] * 8}]})
    assert status == 400 and b"uint64 or a string" in body
    assert _stats(client, "gru_step")["sequence_stats"]["live_sequences"] == 0


def test_idle_sequence_expires(seq_server):
    client = httpclient.InferenceServerClient(seq_server.url)
    x = np.zeros((1, 8), np.float32)
    _step(client, "gru_short", x, sequence_id=9, sequence_start=True)
    assert _stats(client, "gru_short")["sequence_stats"]["slots_in_use"] == 1
    labels = (("model", "gru_short"), ("version", "1"))
    metrics = seq_server.metrics()
    assert metrics[("tinyhal_sequence_state_bytes", labels)] == 16 * 4
    assert metrics[("tinyhal_sequence_state_device_bytes", labels)] >= 16 * 4
    deadline = time.monotonic() + 30
    while _stats(client, "gru_short")["sequence_stats"]["slots_in_use"] and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    message = _error(lambda: _step(client, "gru_short", x, sequence_id=9))
    assert "must specify the START flag" in message and "expired" in message
    assert _stats(client, "gru_short")["sequence_stats"]["expired_sequences"] >= 1


_GONE_CLIENT = """
import sys, time, numpy as np, tritonclient.http as h
c = h.InferenceServerClient(sys.argv[1])
t = h.InferInput("INPUT", [1, 8], "FP32"); t.set_data_from_numpy(np.ones((1, 8), np.float32))
c.infer("gru_one", [t], sequence_id=1, sequence_start=True)
c.infer("gru_one", [t], sequence_id=1)
print("mid-sequence", flush=True)
time.sleep(60)
"""


def test_client_gone_mid_sequence_frees_its_slot(seq_server):
    """gru_one has one slot: a client killed mid-sequence holds it until its sequence
    idles out; the next sequence then gets it."""
    child = subprocess.Popen([sys.executable, "-c", _GONE_CLIENT, seq_server.url],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "mid-sequence"
    finally:
        child.kill()
        child.wait(timeout=10)
    client = httpclient.InferenceServerClient(seq_server.url, network_timeout=30)
    assert _stats(client, "gru_one")["sequence_stats"]["slots_in_use"] == 1
    x = np.ones((1, 8), np.float32)
    result = _step(client, "gru_one", x, sequence_id=2, sequence_start=True, sequence_end=True)
    alone, _ = tinyhal.load(GRU.read_bytes(), device="sync").invoke(
        "step", x, np.zeros((1, 16), np.float32))
    assert np.array_equal(result.as_numpy("OUTPUT"), alone)
    seq = _stats(client, "gru_one")["sequence_stats"]
    assert seq["expired_sequences"] == 1 and seq["slots_in_use"] == 0


def test_client_gone_while_its_step_waits_ends_its_sequence(seq_server):
    """A client that closes its connection while its step is queued ends its sequence
    (Triton's cancellation) and frees its slot then, not after the idle expiry."""
    client = httpclient.InferenceServerClient(seq_server.url, network_timeout=30)
    x = np.ones((1, 8), np.float32)
    _step(client, "gru_wait", x, sequence_id=7, sequence_start=True)
    body = json.dumps({"parameters": {"sequence_id": 7}, "inputs": [
        {"name": "INPUT", "datatype": "FP32", "shape": [1, 8], "data": [1.0] * 8}]}).encode()
    host, port = seq_server.url.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(b"POST /v2/models/gru_wait/infer HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))
        deadline = time.monotonic() + 10
        while _stats(client, "gru_wait")["sequence_stats"]["queued_steps"] == 0 and \
                time.monotonic() < deadline:
            time.sleep(0.01)
    # hung up with the step queued (it waits up to 1 s for batch-mates)
    deadline = time.monotonic() + 30
    while _stats(client, "gru_wait")["sequence_stats"]["slots_in_use"] and \
            time.monotonic() < deadline:
        time.sleep(0.02)
    seq = _stats(client, "gru_wait")["sequence_stats"]
    assert seq["slots_in_use"] == 0 and seq["live_sequences"] == 0
    assert seq["client_gone_sequences"] == 1 and seq["expired_sequences"] == 0
    labels = (("model", "gru_wait"), ("version", "1"))
    assert seq_server.metrics()[("tinyhal_sequences_client_gone_total", labels)] == 1
    message = _error(lambda: _step(client, "gru_wait", x, sequence_id=7))
    assert "must specify the START flag" in message and "client" in message


def test_a_step_past_its_deadline_is_504_and_leaves_the_state(seq_server):
    client = httpclient.InferenceServerClient(seq_server.url, network_timeout=30)
    xs = [np.full((1, 8), v, np.float32) for v in (0.5, 9.0, -0.25)]
    first = _step(client, "gru_wait", xs[0], sequence_id=8, sequence_start=True)
    with pytest.raises(InferenceServerException) as info:  # queued 1 s, allowed 0.1 s
        _step(client, "gru_wait", xs[1], sequence_id=8, timeout=100_000)
    assert info.value.status() == "504" and "nothing ran" in info.value.message()
    last = _step(client, "gru_wait", xs[2], sequence_id=8, sequence_end=True)
    want = _alone([xs[0], xs[2]])
    assert np.array_equal(first.as_numpy("OUTPUT"), want[0])
    assert np.array_equal(last.as_numpy("OUTPUT"), want[1])


def test_a_sequence_whose_start_timed_out_in_the_queue_is_expired(seq_server):
    """As Triton: a START that left the queue unrun (its deadline) ends its sequence, so
    the next step without START is refused (400) with the reason."""
    client = httpclient.InferenceServerClient(seq_server.url, network_timeout=30)
    x = np.ones((1, 8), np.float32)
    with pytest.raises(InferenceServerException) as info:  # queued 1 s, allowed 0.1 s
        _step(client, "gru_wait", x, sequence_id=31, sequence_start=True, timeout=100_000)
    assert info.value.status() == "504" and "nothing ran" in info.value.message()
    message = _error(lambda: _step(client, "gru_wait", x, sequence_id=31))
    assert "must specify the START flag" in message and "START request left the queue" \
        in message
    assert _stats(client, "gru_wait")["sequence_stats"]["live_sequences"] == 0


def test_corrid_control_range_bounds_the_sequence_ids(seq_server):
    """A CORRID control of TYPE_INT32 takes ids up to 2**31 - 1: a larger id (or a
    string) is a 400 naming the range, never a 500."""
    client = httpclient.InferenceServerClient(seq_server.url, network_timeout=30)
    x = np.full((1, 1), 2.0, np.float32)
    for sid in (3_000_000_000, 2**31, 2**64 - 1):
        message = _error(lambda sid=sid: _step(client, "corrid32", x, name="X",
                                               sequence_id=sid, sequence_start=True))
        assert "out of the range" in message and "int32" in message, message
    message = _error(lambda: _step(client, "corrid32", x, name="X", sequence_id="abc",
                                   sequence_start=True))
    assert "integer sequence_id" in message
    top = 2**31 - 1
    _step(client, "corrid32", x, name="X", sequence_id=top, sequence_start=True)
    result = _step(client, "corrid32", x, name="X", sequence_id=top, sequence_end=True)
    assert result.as_numpy("Y").tolist() == [[4.0]]


def test_control_inputs_and_state_from_file(seq_server):
    client = httpclient.InferenceServerClient(seq_server.url)
    sums, flags = [], []
    for k in range(3):
        result = _step(client, "acc", np.full((1, 1), k + 1, np.float32), "X",
                       sequence_id=21, sequence_start=k == 0, sequence_end=k == 2)
        sums.append(float(result.as_numpy("SUM")[0, 0]))
        flags.append(int(result.as_numpy("FLAGS")[0, 0]))
        assert result.as_numpy("ACC_OUT") is None
    assert sums == [101.0, 103.0, 106.0]
    assert flags == [1 + 4 + 8 * 21, 4 + 8 * 21, 2 + 4 + 8 * 21]
    message = _error(lambda: _step(client, "acc", np.ones((1, 1), np.float32), "X",
                                   sequence_id="s", sequence_start=True))
    assert "integer sequence_id" in message


def test_direct_gives_each_sequence_a_fixed_row_and_null_rows_keep_their_state(
        seq_server):
    """`direct`: a sequence's slot is its row; an execution covers the rows up to the
    highest ready one, the others null (READY 0, their state kept), as Triton does."""
    client = httpclient.InferenceServerClient(seq_server.url, network_timeout=30)

    def step(sid, x, **flags):
        r = _step(client, "direct", np.full((1, 1), x, np.float32), "X", sequence_id=sid,
                  **flags)
        return float(r.as_numpy("Y")[0, 0]), int(r.as_numpy("N")[0, 0])

    assert step(1, 1, sequence_start=True) == (1, 1)  # slot 0
    assert step(2, 2, sequence_start=True) == (2, 2)  # slot 1: row 0 null
    assert step(3, 4, sequence_start=True) == (4, 3)  # slot 2: rows 0 and 1 null
    assert step(1, 10) == (11, 1)
    assert step(3, 5) == (9, 3)
    assert step(2, 3, sequence_end=True) == (5, 2)
    assert step(1, 1, sequence_end=True) == (12, 1)
    assert step(3, 1, sequence_end=True) == (10, 3)  # row 1 now empty: null all the same
    seq = _stats(client, "direct")["sequence_stats"]
    assert seq["strategy"] == "direct" and seq["slots"] == 4 and seq["slots_in_use"] == 0


def test_a_bad_step_fails_alone_and_keeps_its_state(seq_server):
    ids = list(range(300, 308))
    results: dict[int, list] = {i: [] for i in ids}
    barrier = threading.Barrier(len(ids))

    def run(sid: int) -> None:
        client = httpclient.InferenceServerClient(seq_server.url, network_timeout=60)
        barrier.wait(timeout=30)
        for k in range(4):
            value = -1.0 if (sid == 303 and k == 2) else 1.0
            try:
                r = _step(client, "acc", np.full((1, 1), value, np.float32), "X",
                          sequence_id=sid, sequence_start=k == 0, sequence_end=k == 3)
                results[sid].append(float(r.as_numpy("SUM")[0, 0]))
            except InferenceServerException as exc:
                results[sid].append(exc.status())

    threads = [threading.Thread(target=run, args=(i,)) for i in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for sid in ids:
        if sid == 303:
            assert results[sid] == [101.0, 102.0, "400", 103.0]
        else:
            assert results[sid] == [101.0, 102.0, 103.0, 104.0]


@pytest.mark.parametrize("change, message", [
    ({"oldest": {}, "direct": {}}, "one of 'direct' and 'oldest'"),
    ({"max_sequence_idle_microseconds": -1}, "max_sequence_idle_microseconds': must be >= 0"),
    ({"bogus": 1}, "'sequence_batching.bogus': unknown key"),
    ({"state": [{"input_name": "a", "output_name": "b", "data_type": "FP32", "dims": [2]}]},
     "'sequence_batching.state[0].data_type': must be 'TYPE_BOOL'"),
    ({"state": [{"input_name": "a", "output_name": "b", "data_type": "TYPE_FP32",
                 "dims": [2], "initial_state": [{"zero_data": True, "data_file": "f"}]}]},
     "one of 'zero_data' and 'data_file'"),
    ({"state": [{"input_name": "a", "output_name": "b", "data_type": "TYPE_FP32",
                 "dims": [2], "initial_state": [{"data_file": "missing"}]}]},
     "cannot read initial_state/missing"),
    ({"control_input": [{"name": "S", "control": [{"kind": "CONTROL_SEQUENCE_GO"}]}]},
     "kind': must be 'CONTROL_SEQUENCE_START'"),
    ({"oldest": {"preferred_batch_size": [99]}}, "over max_batch_size 8"),
])
def test_bad_sequence_config_names_the_field(tmp_path: Path, change: dict, message: str):
    doc = {"oldest": {"max_candidate_sequences": 4}}
    doc.update(change)
    with pytest.raises(ValueError, match=None) as info:
        parse_sequence_config(doc, 8, tmp_path)
    assert message in str(info.value)


@pytest.mark.parametrize("driver", ["sync", "task", "emu"])
def test_device_state_gathers_rows_in_place_or_by_device_copies(driver):
    from types import SimpleNamespace

    from tinyhal.hal import BufferView, MemoryType, create_device
    from tinyhal.server.sequences import DeviceState, StateSpec, StepProgram

    device = create_device(driver)
    try:
        program = StepProgram(SimpleNamespace(device=device,
                                              input_memory_type=int(MemoryType.DEVICE_LOCAL)),
                              "step")
        initial = np.arange(16, dtype=np.float32)
        state = DeviceState((StateSpec("S_IN", "S_OUT", "FP32", (16,), initial),), 4,
                            [program])
        rows = [BufferView.from_numpy(device, np.full((3, 16), k, np.float32) +
                                      np.arange(3, dtype=np.float32)[:, None]).buffer
                for k in (10, 20)]
        a, b = ((rows[0],), 0), ((rows[1],), 0)

        def gathered(homes):
            view = state.gather(program, 0, homes)
            done = state.take_gathers(program)
            if done is not None:
                done.wait(timeout=30)
            return view.to_numpy()

        # rows 1..2 of one buffer: a view of it, nothing copied
        got = gathered([(a[0], 1), (a[0], 2)])
        assert np.array_equal(got[:, 0], [11, 12]) and state.counts["copies"] == 0
        assert state.counts["in_place"] == 1
        # initial rows, then runs from two buffers: one copy per run
        got = gathered([state.initial_home, state.initial_home, (a[0], 0), (a[0], 1),
                        (b[0], 2), (a[0], 2)])
        assert np.array_equal(got[:2], [initial, initial])
        assert np.array_equal(got[2:, 0], [10, 11, 22, 12])
        assert state.counts == {"in_place": 1, "copied": 1, "copies": 4}
        assert np.array_equal(state.read(0, (b[0], 1)), np.full(16, 21, np.float32))
        assert state.held_bytes([a, b]) == 4 * 64 + 2 * 3 * 64
    finally:
        device.close()

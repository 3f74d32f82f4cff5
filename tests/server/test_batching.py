"""Dynamic batching end to end, with tritonclient: batched results are bit for bit those
of unbatched calls, mixed batch sizes split back right, one bad request never fails its
batch-mates, deadlines hold in the batch queue, and inferences/executions are counted
apart (statistics extension and /metrics)."""

from __future__ import annotations

import json
import shutil
import threading
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from serve_helpers import SAMPLES, write_model
from tritonclient.utils import InferenceServerException

from support.iree_tools import HOST_FLAGS, compile_mlir

pytestmark = pytest.mark.timeout(180)

# y = 2 x, but the program refuses any value >= 1000 (cf.assert over the whole batch)
CHECKED_MLIR = """
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @main(%x: tensor<?x4xf32> {iree.abi.name = "x"})
    -> (tensor<?x4xf32> {iree.abi.name = "y"}) {
  %c0 = arith.constant 0 : index
  %n = tensor.dim %x, %c0 : tensor<?x4xf32>
  %ninf = arith.constant 0xFF800000 : f32
  %e0 = tensor.empty() : tensor<f32>
  %init = linalg.fill ins(%ninf : f32) outs(%e0 : tensor<f32>) -> tensor<f32>
  %m = linalg.reduce ins(%x : tensor<?x4xf32>) outs(%init : tensor<f32>) dimensions = [0, 1]
    (%a: f32, %b: f32) {
      %r = arith.maximumf %a, %b : f32
      linalg.yield %r : f32
    }
  %v = tensor.extract %m[] : tensor<f32>
  %lim = arith.constant 1000.0 : f32
  %ok = arith.cmpf olt, %v, %lim : f32
  cf.assert %ok, "every value must be below 1000"
  %e = tensor.empty(%n) : tensor<?x4xf32>
  %y = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<?x4xf32>) outs(%e : tensor<?x4xf32>) {
  ^bb0(%a: f32, %o: f32):
    %two = arith.constant 2.0 : f32
    %r = arith.mulf %a, %two : f32
    linalg.yield %r : f32
  } -> tensor<?x4xf32>
  return %y : tensor<?x4xf32>
}
"""


@pytest.fixture(scope="module")
def batch_server(tmp_path_factory):
    from serve_helpers import ServerProcess

    root = tmp_path_factory.mktemp("batching")
    shutil.copytree(SAMPLES / "mlp_classifier", root / "mlp_classifier")
    # the bundled model with a queue delay: concurrent requests surely meet in batches
    write_model(root, "mlp_delayed", SAMPLES / "mlp_classifier/1/model.vmfb", {
        "function": "predict", "max_batch_size": 64, "max_concurrency": 1, "max_queue": 64,
        "dynamic_batching": {"max_queue_delay_microseconds": 50_000,
                             "preferred_batch_size": [16, 32]}})
    checked = compile_mlir(CHECKED_MLIR, HOST_FLAGS)
    # one slot and a long delay: requests sent together surely meet in one batch
    write_model(root, "checked", checked, {
        "max_batch_size": 16, "max_concurrency": 1, "max_queue": 16,
        "dynamic_batching": {"max_queue_delay_microseconds": 1_500_000,
                             "preferred_batch_size": [4]}})
    proc = ServerProcess("--model-repository", str(root))
    try:
        yield proc.start()
    finally:
        proc.stop()


@pytest.fixture
def bclient(batch_server):
    c = httpclient.InferenceServerClient(batch_server.url, concurrency=16,
                                         network_timeout=60.0)
    try:
        yield c
    finally:
        c.close()


def _input(name, array, binary=True):
    inp = httpclient.InferInput(name, list(array.shape), "FP32")
    inp.set_data_from_numpy(array, binary_data=binary)
    return inp


def _stats(client, model):
    (stats,) = client.get_inference_statistics(model)["model_stats"]
    return stats


def test_batched_results_equal_unbatched_calls(bclient, batch_server):
    import iree.runtime as rt

    module = rt.load_vm_flatbuffer_file(
        str(SAMPLES / "mlp_classifier/1/model.vmfb"), driver="local-task")
    rng = np.random.default_rng(21)
    before = _stats(bclient, "mlp_delayed")
    batches = [rng.normal(size=(1 + i % 5, 16)).astype(np.float32) for i in range(60)]
    pending = [bclient.async_infer("mlp_delayed", [_input("features", x, i % 3 != 0)])
               for i, x in enumerate(batches)]
    for x, handle in zip(batches, pending):
        result = handle.get_result(timeout=60)
        probs, cls = (np.asarray(r.to_host()) for r in module.predict(x))
        np.testing.assert_array_equal(result.as_numpy("probabilities"), probs)
        np.testing.assert_array_equal(result.as_numpy("class"), cls)
    after = _stats(bclient, "mlp_delayed")
    rows = sum(len(x) for x in batches)
    assert after["inference_count"] - before["inference_count"] == rows
    executions = after["execution_count"] - before["execution_count"]
    assert 1 <= executions < len(batches), executions  # requests met in batches
    assert after["inference_stats"]["success"]["count"] - \
        before["inference_stats"]["success"]["count"] == len(batches)
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert after["inference_stats"][phase]["count"] >= len(batches), phase
        assert after["inference_stats"][phase]["ns"] > 0, phase
    assert max(b["batch_size"] for b in after["batch_stats"]) > 5


def _send_together(client, arrays):
    handles = [client.async_infer("checked", [_input("x", a)]) for a in arrays]
    out = []
    for handle in handles:
        try:
            out.append(handle.get_result(timeout=60).as_numpy("y"))
        except InferenceServerException as exc:
            out.append(exc)
    return out


def test_one_bad_request_never_fails_its_batch_mates(bclient, batch_server):
    rng = np.random.default_rng(4)
    good = [rng.uniform(-5, 5, size=(1, 4)).astype(np.float32) for _ in range(4)]
    before = _stats(bclient, "checked")
    results = _send_together(bclient, good)  # 4 rows: the preferred size, one execution
    for x, y in zip(good, results):
        np.testing.assert_array_equal(y, 2 * x)
    mid = _stats(bclient, "checked")
    assert mid["execution_count"] - before["execution_count"] == 1
    assert any(b["batch_size"] == 4 for b in mid["batch_stats"])

    bad = np.full((1, 4), 5000.0, np.float32)
    arrays = [good[0], good[1], bad, good[2]]
    results = _send_together(bclient, arrays)
    for i in (0, 1, 3):
        np.testing.assert_array_equal(results[i], 2 * arrays[i])
    assert isinstance(results[2], InferenceServerException)
    assert results[2].status() == "400"
    assert "every value must be below 1000" in results[2].message()
    after = _stats(bclient, "checked")
    assert after["inference_stats"]["fail"]["count"] - mid["inference_stats"]["fail"]["count"] == 1


def test_deadline_holds_in_the_batch_queue(batch_server):
    # alone, a request waits out the 1.5 s queue delay: a 0.2 s deadline ends it first
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                        "data": [1, 2, 3, 4]}]}
    t0 = time.monotonic()
    status, _, payload = batch_server.request("POST", "/v2/models/checked/infer", body,
                                              {"Inference-Timeout": "0.2"})
    assert status == 504, payload
    assert "in the queue (nothing ran)" in json.loads(payload)["error"]
    assert time.monotonic() - t0 < 1.4
    # a batch-mate with a deadline that passes does not disturb the one without
    results = []
    slow = threading.Thread(target=lambda: results.append(batch_server.request(
        "POST", "/v2/models/checked/infer", body)))
    slow.start()
    status, _, payload = batch_server.request("POST", "/v2/models/checked/infer", body,
                                              {"Inference-Timeout": "0.2"})
    assert status == 504
    slow.join(timeout=30)
    status, _, payload = results[0]
    assert status == 200 and json.loads(payload)["outputs"][0]["data"] == [2, 4, 6, 8]


def test_metrics_count_inferences_and_executions_apart(batch_server, bclient):
    x = np.ones((3, 16), np.float32)
    bclient.infer("mlp_classifier", [_input("features", x)])
    m = batch_server.metrics()
    labels = (("model", "mlp_classifier"), ("version", "1"))
    inferences = m[("tinyhal_inference_count_total", labels)]
    executions = m[("tinyhal_inference_exec_count_total", labels)]
    assert inferences >= 3 and 1 <= executions <= inferences
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert m[(f"tinyhal_inference_{phase}_duration_seconds_count", labels)] >= 1
    config = bclient.get_model_config("mlp_classifier")
    assert config["dynamic_batching"] == {"max_queue_delay_microseconds": 0,
                                          "preferred_batch_size": []}


def test_batching_config_is_checked(tmp_path, start_server):
    checked = compile_mlir(CHECKED_MLIR, HOST_FLAGS)
    write_model(tmp_path, "nobatch", checked, {"dynamic_batching": {}})
    write_model(tmp_path, "badpref", checked, {
        "max_batch_size": 4, "dynamic_batching": {"preferred_batch_size": [8]}})
    server = start_server("--model-repository", str(tmp_path), "--no-exit-on-error")
    status, _, body = server.request("POST", "/v2/repository/index")
    reasons = {m["name"]: m.get("reason", "") for m in json.loads(body)}
    assert "needs 'max_batch_size' > 0" in reasons["nobatch"]
    assert "preferred_batch_size" in reasons["badpref"]

"""tinyhal-serve end to end: a real server process and a real V2 client (tritonclient).

Results are compared bit for bit with `iree.runtime` running the same `.vmfb` in this
process.
"""

from __future__ import annotations

import json
import math
import threading
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from serve_helpers import DTYPES
from tritonclient.utils import InferenceServerException

from support.oracle_caches import session_cache

pytestmark = pytest.mark.timeout(120)

_V2 = {"i1": "BOOL", "i8": "INT8", "i16": "INT16", "i32": "INT32", "i64": "INT64",
       "f16": "FP16", "f32": "FP32", "f64": "FP64"}


@session_cache
def _iree_module(path: str):
    import iree.runtime as rt

    return rt.load_vm_flatbuffer_file(path, driver="local-task")


def iree_call(path, function: str, *args) -> list[np.ndarray]:
    result = getattr(_iree_module(str(path)), function)(*args)
    results = result if isinstance(result, (tuple, list)) else (result,)
    return [np.asarray(r.to_host() if hasattr(r, "to_host") else r) for r in results]


def _input(name, array, datatype, binary=True):
    inp = httpclient.InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array, binary_data=binary)
    return inp


# -- health and metadata ---------------------------------------------------------------


def test_health_and_server_metadata(client, server):
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "tinyhal"
    assert "binary_tensor_data" in meta["extensions"]
    status, headers, body = server.request("GET", "/v2/health/ready")
    assert status == 200 and json.loads(body) == {"ready": True}


def test_model_metadata_from_abi_declaration(client):
    meta = client.get_model_metadata("mlp_classifier")
    assert meta["name"] == "mlp_classifier" and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 16]}]
    assert meta["outputs"] == [
        {"name": "probabilities", "datatype": "FP32", "shape": [-1, 4]},
        {"name": "class", "datatype": "INT32", "shape": [-1]},
    ]
    spin = client.get_model_metadata("spin", "1")
    assert spin["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1]},
                              {"name": "n", "datatype": "INT32", "shape": [1]}]
    dtypes = client.get_model_metadata("dtypes")
    assert [i["datatype"] for i in dtypes["inputs"]] == [_V2[t] for _, t in DTYPES]
    assert client.is_model_ready("saxpy")
    assert client.is_model_ready("saxpy", "1")
    assert not client.is_model_ready("saxpy", "7")
    index = client.get_model_repository_index()
    assert {(m["name"], m["state"]) for m in index} == {
        ("mlp_classifier", "READY"), ("saxpy", "READY"), ("spin", "READY"),
        ("dtypes", "READY")}
    config = client.get_model_config("mlp_classifier")
    assert config["function"] == "predict" and config["max_batch_size"] == 64


def test_unknown_model_and_version_are_404(server):
    for path in ("/v2/models/nope", "/v2/models/nope/ready", "/v2/models/saxpy/versions/2",
                 "/v2/models/saxpy/versions/2/ready"):
        status, _, body = server.request("GET", path)
        assert status == 404, path
        assert "unknown" in json.loads(body)["error"]
    status, _, body = server.request("POST", "/v2/models/nope/infer", {"inputs": []})
    assert status == 404 and "unknown model: 'nope' is not found" in json.loads(body)["error"]
    status, _, body = server.request("GET", "/v2/models/saxpy/infer")
    assert status == 405 and "error" in json.loads(body)
    status, _, body = server.request("GET", "/no/such/route")
    assert status == 404 and "error" in json.loads(body)


# -- inference -------------------------------------------------------------------------


@pytest.mark.parametrize("binary_in", [False, True], ids=["json-in", "binary-in"])
@pytest.mark.parametrize("binary_out", [False, True], ids=["json-out", "binary-out"])
def test_mlp_matches_iree_runtime(client, repository, binary_in, binary_out):
    x = np.random.default_rng(7).normal(size=(5, 16)).astype(np.float32)
    outputs = [httpclient.InferRequestedOutput("probabilities", binary_data=binary_out),
               httpclient.InferRequestedOutput("class", binary_data=binary_out)]
    result = client.infer("mlp_classifier", [_input("features", x, "FP32", binary_in)],
                          outputs=outputs, request_id="req-17")
    probs, cls = iree_call(repository / "mlp_classifier/1/model.vmfb", "predict", x)
    np.testing.assert_array_equal(result.as_numpy("probabilities"), probs)
    np.testing.assert_array_equal(result.as_numpy("class"), cls)
    response = result.get_response()
    assert response["id"] == "req-17"
    assert response["model_name"] == "mlp_classifier" and response["model_version"] == "1"


def test_default_outputs_are_binary_and_scalar_inputs(client, repository):
    x = np.linspace(-1, 1, 7, dtype=np.float32)
    y = np.arange(7, dtype=np.float32)
    alpha = np.array([2.5], dtype=np.float32)
    result = client.infer("saxpy", [_input("alpha", alpha, "FP32"), _input("x", x, "FP32"),
                                    _input("y", y, "FP32", binary=False)])
    (ref,) = iree_call(repository / "saxpy/1/model.vmfb", "saxpy", 2.5, x, y)
    np.testing.assert_array_equal(result.as_numpy("z"), ref)
    assert result.get_output("z")["parameters"]["binary_data_size"] == ref.nbytes


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_every_datatype_matches_iree_runtime(client, repository, binary):
    rng = np.random.default_rng(3)
    arrays = []
    inputs = []
    for name, t in DTYPES:
        dtype = {"i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32,
                 "i64": np.int64, "f16": np.float16, "f32": np.float32, "f64": np.float64}[t]
        if t == "i1":
            a = rng.integers(0, 2, 6).astype(np.bool_)
        elif t.startswith("i"):
            info = np.iinfo(dtype)
            a = rng.integers(info.min, info.max, 6, dtype=dtype, endpoint=True)
        else:
            a = (rng.normal(size=6) * 100).astype(dtype)
        arrays.append(a)
        inputs.append(_input(f"in_{name}", a, _V2[t], binary))
    outputs = [httpclient.InferRequestedOutput(f"out_{n}", binary_data=binary) for n, _ in DTYPES]
    result = client.infer("dtypes", inputs, outputs=outputs)
    refs = iree_call(repository / "dtypes/1/model.vmfb", "main", *arrays)
    for (name, t), ref in zip(DTYPES, refs):
        got = result.as_numpy(f"out_{name}")
        assert got.dtype == ref.dtype, name
        np.testing.assert_array_equal(got, ref, err_msg=name)
        assert result.get_output(f"out_{name}")["datatype"] == _V2[t]


def test_many_parallel_requests(client, repository):
    rng = np.random.default_rng(11)
    batches = [rng.normal(size=(1 + i % 8, 16)).astype(np.float32) for i in range(40)]
    pending = [client.async_infer("mlp_classifier", [_input("features", x, "FP32")])
               for x in batches]
    path = repository / "mlp_classifier/1/model.vmfb"
    for x, handle in zip(batches, pending):
        result = handle.get_result(timeout=60)
        probs, cls = iree_call(path, "predict", x)
        np.testing.assert_array_equal(result.as_numpy("probabilities"), probs)
        np.testing.assert_array_equal(result.as_numpy("class"), cls)


# -- overload and deadlines ------------------------------------------------------------


def _spin_body(n: int, length: int = 1024, **parameters) -> dict:
    body = {"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [length], "data": [1.0] * length},
        {"name": "n", "datatype": "INT32", "shape": [1], "data": [n]},
    ]}
    if parameters:
        body["parameters"] = parameters
    return body


def _wait_metric(server, name, labels, predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        value = server.metrics().get((name, tuple(sorted(labels.items()))))
        if value is not None and predicate(value):
            return value
        assert time.monotonic() < deadline, f"{name}{labels} stayed at {value}"
        time.sleep(0.05)


def test_overload_answers_503_with_retry_after(server):
    # spin allows 1 running + 1 queued: of 5 concurrent slow requests 3+ are refused, as
    # Triton refuses beyond max_queue_size: UNAVAILABLE "Exceeds maximum queue size".
    results = []

    def send():
        results.append(server.request("POST", "/v2/models/spin/infer", _spin_body(400_000)))

    threads = [threading.Thread(target=send) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    statuses = sorted(status for status, _, _ in results)
    assert statuses.count(200) >= 1 and statuses.count(503) >= 2, statuses
    assert set(statuses) <= {200, 503}
    for status, headers, body in results:
        if status == 503:
            assert int(headers["retry-after"]) >= 1
            assert "Exceeds maximum queue size" in json.loads(body)["error"]
    _wait_metric(server, "tinyhal_inference_in_flight", {"model": "spin", "version": "1"},
                 lambda v: v == 0)
    m = server.metrics()
    assert m[("tinyhal_inference_requests_total",
              (("code", "503"), ("model", "spin"), ("version", "1")))] >= 2


@pytest.mark.parametrize("how", ["parameter", "header"])
def test_deadline_gives_504_and_device_recovers(server, how):
    labels = {"model": "spin", "version": "1"}
    _wait_metric(server, "tinyhal_inference_in_flight", labels, lambda v: v == 0)
    # what an answered request of this shape leaves live: its idle input buffers, kept
    # for the next call of the shape
    status, _, payload = server.request("POST", "/v2/models/spin/infer", _spin_body(0))
    assert status == 200, payload
    idle = server.metrics()[("tinyhal_device_memory_live_bytes", (("device", "task"),))]
    if how == "parameter":  # tritonclient's timeout: microseconds in parameters.timeout
        body, headers = _spin_body(3_000_000, timeout=200_000), {}
    else:
        body, headers = _spin_body(3_000_000), {"Inference-Timeout": "0.2"}
    status, _, payload = server.request("POST", "/v2/models/spin/infer", body, headers)
    assert status == 504, payload
    assert "deadline exceeded" in json.loads(payload)["error"]
    # answered at the deadline, not when the spin ended: its execution still runs
    # (counted, not timed by this process's clock, which a busy machine stretches)
    detached = server.metrics()[("tinyhal_inference_detached", tuple(sorted(labels.items())))]
    assert detached == 1, detached
    # the invocation runs to completion in the background; then the device is idle again,
    # holding no more than after the answered request
    _wait_metric(server, "tinyhal_inference_detached", labels, lambda v: v == 0)
    _wait_metric(server, "tinyhal_inference_in_flight", labels, lambda v: v == 0)
    _wait_metric(server, "tinyhal_device_memory_live_bytes", {"device": "task"},
                 lambda v: v == idle)
    # and the model still answers correctly
    status, _, payload = server.request("POST", "/v2/models/spin/infer", _spin_body(0, 4))
    assert status == 200 and json.loads(payload)["outputs"][0]["data"] == [1.0] * 4


def test_deadline_while_queued(server):
    labels = {"model": "spin", "version": "1"}
    _wait_metric(server, "tinyhal_inference_in_flight", labels, lambda v: v == 0)
    slow = []
    t = threading.Thread(target=lambda: slow.append(
        server.request("POST", "/v2/models/spin/infer", _spin_body(1_000_000))))
    t.start()
    _wait_metric(server, "tinyhal_inference_in_flight", labels, lambda v: v == 1)
    status, _, payload = server.request("POST", "/v2/models/spin/infer", _spin_body(10),
                                        {"Inference-Timeout": "0.1"})
    assert status == 504
    assert "in the queue (nothing ran)" in json.loads(payload)["error"]
    t.join(timeout=60)
    assert slow[0][0] == 200


# -- bad input -------------------------------------------------------------------------

_X = {"name": "x", "datatype": "FP32", "shape": [2], "data": [1, 2]}
_Y = {"name": "y", "datatype": "FP32", "shape": [2], "data": [1, 2]}
_A = {"name": "alpha", "datatype": "FP32", "shape": [1], "data": [1]}


def _saxpy(*inputs, **extra):
    return {"inputs": list(inputs), **extra}


BAD = [
    ("not json", b"{nope", 400, "not valid JSON"),
    ("not an object", b"[1, 2]", 400, "JSON object"),
    ("no inputs", {"inputs": []}, 400, "non-empty 'inputs'"),
    ("unknown input", _saxpy(_A, _X, _Y, {**_X, "name": "w"}), 400, "unexpected inference input 'w'"),
    ("missing input", _saxpy(_A, _X), 400,
     "missing required input(s) ['y']"),
    ("wrong datatype", _saxpy(_A, _X, {**_Y, "datatype": "FP64"}), 400,
     "data-type is 'FP64', but model 'saxpy' expects 'FP32'"),
    ("unknown datatype", _saxpy(_A, _X, {**_Y, "datatype": "FP8"}), 400, "unknown datatype"),
    ("bytes", _saxpy(_A, _X, {**_Y, "datatype": "BYTES", "data": ["a", "b"]}), 400,
     "BYTES (string) tensors are not supported"),
    ("wrong rank", _saxpy(_A, _X, {**_Y, "shape": [1, 2]}), 400,
     "Expected [-1], got [1,2]"),
    ("count mismatch", _saxpy(_A, _X, {**_Y, "shape": [3]}), 400, "has 2 elements"),
    ("negative dim", _saxpy(_A, _X, {**_Y, "shape": [-2]}), 400, "negative dimension"),
    ("non-number", _saxpy(_A, _X, {**_Y, "data": [1, "2"]}), 400, "must hold numbers"),
    ("scalar shape", _saxpy({**_A, "shape": [2], "data": [1, 2]}, _X, _Y), 400,
     "is a scalar"),
    ("program check", _saxpy(_A, _X, {**_Y, "shape": [3], "data": [1, 2, 3]}), 400,
     "x and y must have the same length"),
    ("duplicate input", _saxpy(_A, _X, _X, _Y), 400, "more than once"),
    ("unknown output", _saxpy(_A, _X, _Y, outputs=[{"name": "q"}]), 400, "unexpected inference output 'q'"),
    ("bad timeout", _saxpy(_A, _X, _Y, parameters={"timeout": "soon"}), 400, "'timeout'"),
    ("bad id", _saxpy(_A, _X, _Y, id=5), 400, "'id' must be a string"),
]


@pytest.mark.parametrize("body,status,message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_requests_get_4xx_with_a_clear_message(server, body, status, message):
    got, _, payload = server.request("POST", "/v2/models/saxpy/infer", body)
    error = json.loads(payload)["error"]
    assert got == status, error
    assert message in error, error


def test_bad_binary_and_model_limits(server):
    head = json.dumps({"inputs": [
        {"name": "features", "datatype": "FP32", "shape": [1, 16],
         "parameters": {"binary_data_size": 64}}]}).encode()
    cases = [
        (head + bytes(60), {"Inference-Header-Content-Length": str(len(head))}, 400,
         "needs 64 binary bytes"),
        (head + bytes(64), {"Inference-Header-Content-Length": "x"}, 400, "must be an integer"),
        (head + bytes(64), {"Inference-Header-Content-Length": str(len(head) + 999)}, 400,
         "outside the body"),
        (head + bytes(72), {"Inference-Header-Content-Length": str(len(head))}, 400,
         "8 binary bytes that no input claims"),
        (json.dumps({"inputs": [{"name": "features", "datatype": "FP32", "shape": [65, 16],
                                 "data": [0.0] * 65 * 16}]}).encode(), {}, 400,
         "batch-size must be <= 64 for 'mlp_classifier'"),
        (json.dumps({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 15],
                                 "data": [0.0] * 15}]}).encode(), {}, 400,
         "Expected [-1,16], got [1,15]"),
        (bytes(2 << 20), {}, 413, "exceeds the limit"),
        (b"{}", {"Content-Encoding": "br"}, 415, "not supported"),
    ]
    for body, headers, status, message in cases:
        got, _, payload = server.request("POST", "/v2/models/mlp_classifier/infer", body,
                                         headers)
        error = json.loads(payload)["error"]
        assert (got, message in error) == (status, True), (status, message, got, error)


def test_int_range_and_bool_checks(server):
    base = {"name": "in_i8", "datatype": "INT8", "shape": [1], "data": [300]}
    got, _, payload = server.request("POST", "/v2/models/dtypes/infer", {"inputs": [base]})
    assert got == 400 and "outside INT8's range" in json.loads(payload)["error"]
    b = {"name": "in_b", "datatype": "BOOL", "shape": [1], "data": [1]}
    got, _, payload = server.request("POST", "/v2/models/dtypes/infer", {"inputs": [b]})
    assert got == 400 and "true/false" in json.loads(payload)["error"]


def test_tritonclient_sees_the_error_message(client):
    x = np.zeros((1, 15), np.float32)
    with pytest.raises(InferenceServerException) as info:
        client.infer("mlp_classifier", [_input("features", x, "FP32")])
    assert info.value.status() == "400"
    assert "Expected [-1,16], got [1,15]" in info.value.message()


# -- metrics ---------------------------------------------------------------------------


def test_metrics_expose_device_memory_and_requests(server, client):
    x = np.ones((64, 16), np.float32)
    client.infer("mlp_classifier", [_input("features", x, "FP32")])
    m = server.metrics()
    dev = (("device", "sync"),)  # mlp_classifier's config
    peak = m[("tinyhal_device_memory_peak_bytes", dev)]
    live = m[("tinyhal_device_memory_live_bytes", dev)]
    heaps = {labels[1][1]: v for (name, labels), v in m.items()
             if name == "tinyhal_device_heap_peak_bytes" and labels[0] == dev[0]}
    assert set(heaps) >= {"device", "transient"}
    # a 64x16 f32 input (4 KiB) was live at some point
    assert peak >= 64 * 16 * 4
    assert max(heaps.values()) <= peak <= sum(heaps.values())
    assert live == sum(v for (name, labels), v in m.items()
                       if name == "tinyhal_device_heap_live_bytes" and labels[0] == dev[0])
    assert m[("tinyhal_inference_requests_total",
              (("code", "200"), ("model", "mlp_classifier"), ("version", "1")))] >= 1
    assert m[("tinyhal_inference_request_duration_seconds_count",
              (("model", "mlp_classifier"), ("version", "1")))] >= 1
    assert m[("tinyhal_model_info", (("device", "sync"), ("execution", "thread"),
                                     ("function", "predict"), ("model", "mlp_classifier"),
                                     ("version", "1")))] == 1
    assert m[("tinyhal_server_draining", ())] == 0
    assert not math.isnan(m[("tinyhal_model_load_seconds",
                              (("model", "saxpy"), ("version", "1")))])


def test_metrics_and_statistics_record_the_same_phases(server, client):
    """Each request is recorded once into both the Prometheus histograms and Triton's
    statistics: for every phase the counts and the totals agree, and the buckets are
    cumulative up to +Inf = count."""
    x = np.ones((2, 16), np.float32)
    for _ in range(3):
        client.infer("mlp_classifier", [_input("features", x, "FP32")])
    m = server.metrics()
    stats = client.get_inference_statistics("mlp_classifier", "1")["model_stats"][0]
    labels = (("model", "mlp_classifier"), ("version", "1"))
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        name = f"tinyhal_inference_{phase}_duration_seconds"
        count = m[(f"{name}_count", labels)]
        assert count == stats["inference_stats"][phase]["count"] >= 3, phase
        assert m[(f"{name}_sum", labels)] == pytest.approx(
            stats["inference_stats"][phase]["ns"] / 1e9, rel=1e-6, abs=1e-9), phase
        buckets = sorted((float(dict(lb)["le"]), v) for (n, lb), v in m.items()
                         if n == f"{name}_bucket" and dict(lb)["model"] == "mlp_classifier"
                         and dict(lb)["version"] == "1")
        values = [v for _, v in buckets]
        assert values == sorted(values) and buckets[-1] == (math.inf, count), phase

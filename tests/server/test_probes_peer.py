"""Probes of stateless serving as Triton's own qa tests and clients see it: every method
of `tritonclient.http.InferenceServerClient` and of its asyncio twin, `infer` with each
of its options, `InferResult` for every datatype (BF16 too), a model of two versions, the
refusals, the queue bound and deadlines in Triton's words (`qa/L0_model_queue`,
`L0_input_validation`, `L0_output_name`, `L0_lifecycle`, `L0_parameters`,
`L0_http` restricted APIs), the statistics extension field by field (Triton core's
`TRITONSERVER_ServerModelStatistics`), and the metrics Triton's tests read
(`nv_inference_*`, `L0_metrics`). One server child (explicit model control, the samples
plus a slow `spin` model, one of every datatype, a BF16 one and one of versions 2 and 10)
for the module; the restricted-API and label-escaping probes start their own."""

from __future__ import annotations

import asyncio
import copy
import json
import re
import shutil
import threading
import time
import urllib.parse

import numpy as np
import pytest
from serve_helpers import SAMPLES, ServerProcess, write_model

pytestmark = pytest.mark.timeout(240)

_SPIN_BODY_LENGTH = 1024


_BF16_ADD = """
func.func @main(%x: tensor<?xbf16> {iree.abi.name = "x"}, %y: tensor<?xbf16> {iree.abi.name = "y"})
    -> (tensor<?xbf16> {iree.abi.name = "sum"}) {
  %0 = arith.addf %x, %y : tensor<?xbf16>
  return %0 : tensor<?xbf16>
}
"""


@pytest.fixture(scope="module")
def peer_server(tmp_path_factory, spin_vmfb, dtypes_vmfb):
    from support.iree_tools import HOST_FLAGS, compile_mlir

    root = tmp_path_factory.mktemp("repo")
    write_model(root, "bf16_add", compile_mlir(_BF16_ADD, HOST_FLAGS))
    for sample in ("mlp_classifier", "saxpy"):
        shutil.copytree(SAMPLES / sample, root / sample)
    write_model(root, "spin", spin_vmfb, {"max_concurrency": 1, "max_queue": 1})
    write_model(root, "dtypes", dtypes_vmfb)
    # two versions served at once, numbered so that text order is not number order
    for version in ("2", "10"):
        shutil.copytree(SAMPLES / "mlp_classifier" / "1", root / "mlp2" / version)
    config = json.loads((SAMPLES / "mlp_classifier" / "config.json").read_text())
    (root / "mlp2" / "config.json").write_text(json.dumps(
        dict(config, version_policy={"all": {}})))
    server = ServerProcess("--model-repository", str(root), "--model-control-mode",
                           "explicit", "--load-model", "*")
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def client(peer_server):
    import tritonclient.http as httpclient

    c = httpclient.InferenceServerClient(peer_server.url, concurrency=8,
                                         network_timeout=60.0)
    try:
        yield c
    finally:
        c.close()


def _saxpy_inputs(n: int = 4, binary: bool = True) -> list:
    import tritonclient.http as httpclient

    inputs = []
    for name, shape in (("alpha", [1]), ("x", [n]), ("y", [n])):
        tensor = httpclient.InferInput(name, shape, "FP32")
        tensor.set_data_from_numpy(np.full(shape, 2.0, np.float32), binary_data=binary)
        inputs.append(tensor)
    return inputs


def _mlp_inputs(rows: int) -> list:
    import tritonclient.http as httpclient

    tensor = httpclient.InferInput("features", [rows, 16], "FP32")
    tensor.set_data_from_numpy(np.ones((rows, 16), np.float32))
    return [tensor]


def _spin_body(n: int, **parameters) -> dict:
    return {"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [_SPIN_BODY_LENGTH],
         "data": [1.0] * _SPIN_BODY_LENGTH},
        {"name": "n", "datatype": "INT32", "shape": [], "data": [n]}],
        **({"parameters": parameters} if parameters else {})}


def _wait_idle(server: ServerProcess, model: str) -> None:
    deadline = time.monotonic() + 60
    key = ("tinyhal_inference_in_flight", (("model", model), ("version", "1")))
    while server.metrics().get(key, 0) or server.metrics().get(
            ("tinyhal_inference_detached", key[1]), 0):
        assert time.monotonic() < deadline, f"{model} stayed busy"
        time.sleep(0.05)


# -- the client's methods --------------------------------------------------------------

def test_every_client_method_reads_our_answers_as_tritons(client, peer_server):
    """Each getter returns what tritonclient parses from Triton; the extensions not
    offered (shared memory, trace, logging) raise 404 naming the extension, and are not
    in the server metadata."""
    from tritonclient.utils import InferenceServerException

    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("saxpy") and client.is_model_ready("saxpy", "1")
    assert not client.is_model_ready("nosuch")
    meta = client.get_server_metadata()
    assert set(meta) >= {"name", "version", "extensions"}
    model = client.get_model_metadata("saxpy")
    assert model["name"] == "saxpy" and model["versions"] == ["1"]
    assert {t["name"] for t in model["inputs"]} == {"alpha", "x", "y"}
    assert all(set(t) == {"name", "datatype", "shape"} for t in model["inputs"]
               + model["outputs"])
    config = client.get_model_config("mlp_classifier")
    assert config["name"] == "mlp_classifier" and config["max_batch_size"] == 64
    index = client.get_model_repository_index()
    assert {"name": "spin", "version": "1", "state": "READY"} in index
    stats = client.get_inference_statistics("saxpy")
    assert [s["name"] for s in stats["model_stats"]] == ["saxpy"]
    not_offered = [
        ("system shared memory", lambda: client.get_system_shared_memory_status()),
        ("system shared memory", lambda: client.register_system_shared_memory("r", "/k",
                                                                              16)),
        ("system shared memory", lambda: client.unregister_system_shared_memory()),
        ("CUDA shared memory", lambda: client.get_cuda_shared_memory_status()),
        ("CUDA shared memory", lambda: client.register_cuda_shared_memory("r", b"h", 0,
                                                                          16)),
        ("CUDA shared memory", lambda: client.unregister_cuda_shared_memory()),
        ("trace", lambda: client.get_trace_settings()),
        ("trace", lambda: client.update_trace_settings(settings={"trace_rate": "1"})),
        ("logging", lambda: client.get_log_settings()),
        ("logging", lambda: client.update_log_settings({"log_info": True})),
    ]
    for extension, call in not_offered:
        with pytest.raises(InferenceServerException) as raised:
            call()
        assert raised.value.status() == "404", (extension, raised.value)
        assert f"the {extension} extension is not offered" in raised.value.message(), \
            raised.value
    for absent in ("system_shared_memory", "cuda_shared_memory", "trace", "logging",
                   "classification", "generate"):
        assert absent not in meta["extensions"]
    for path in ("/v2/models/saxpy/generate", "/v2/models/saxpy/versions/1/generate_stream"):
        status, _, payload = peer_server.request("POST", path, {"text_input": "x"})
        assert status == 404 and b"the generate extension is not offered" in payload
    assert client.is_server_live()


def test_infer_with_every_option_of_the_client(client):
    """`infer` with each option tritonclient offers gets Triton's answer: the id echoed,
    schedule parameters taken, compression either way, custom parameters taken,
    `class_count` a 400 naming the extension, and `get_response` shaped as Triton's."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    expected = np.full(4, 6.0, np.float32)
    result = client.infer("saxpy", _saxpy_inputs(), request_id="req-7")
    response = result.get_response()
    assert response["model_name"] == "saxpy" and response["model_version"] == "1"
    assert response["id"] == "req-7"
    assert response["outputs"] == [{"name": "z", "datatype": "FP32", "shape": [4],
                                    "parameters": {"binary_data_size": 16}}]
    assert result.get_output("z")["name"] == "z" and result.get_output("nope") is None
    # an empty id is not echoed, as Triton's frontend (perf_analyzer sends one each time)
    assert "id" not in client.infer("saxpy", _saxpy_inputs(), request_id="").get_response()
    assert result.as_numpy("nope") is None
    np.testing.assert_array_equal(result.as_numpy("z"), expected)
    options = [
        {"priority": 1}, {"priority": 2**64 - 1}, {"timeout": 30_000_000},
        {"headers": {"X-Caller": "probe"}}, {"query_params": {"probe": "1"}},
        {"request_compression_algorithm": "gzip"},
        {"request_compression_algorithm": "deflate"},
        {"response_compression_algorithm": "gzip"},
        {"response_compression_algorithm": "deflate"},
        {"parameters": {"custom": "x", "count": 3, "flag": True}},
        {"model_version": "1"},
        # a stateless model ignores sequence controls, as Triton's dynamic batcher does
        {"sequence_id": 9, "sequence_start": True, "sequence_end": True},
        {"sequence_id": "text-id", "sequence_start": True},
    ]
    for option in options:
        for binary in (True, False):
            # a copy: tritonclient writes its own headers into the dict it is given
            got = client.infer("saxpy", _saxpy_inputs(binary=binary), **copy.deepcopy(option))
            np.testing.assert_array_equal(got.as_numpy("z"), expected, err_msg=str(option))
    for binary in (True, False):
        asked = [httpclient.InferRequestedOutput("z", binary_data=binary)]
        got = client.infer("saxpy", _saxpy_inputs(), outputs=asked)
        np.testing.assert_array_equal(got.as_numpy("z"), expected)
        assert ("binary_data_size" in got.get_output("z").get("parameters", {})) == binary
    with pytest.raises(InferenceServerException) as raised:
        client.infer("saxpy", _saxpy_inputs(), outputs=[
            httpclient.InferRequestedOutput("z", class_count=2)])
    assert raised.value.status() == "400" and "classification" in raised.value.message()
    with pytest.raises(InferenceServerException) as raised:
        client.infer("saxpy", _saxpy_inputs(), model_version="2")
    assert raised.value.status() == "404"
    assert raised.value.message().startswith("Request for unknown model")
    with pytest.raises(InferenceServerException) as raised:
        client.infer("nosuch", _saxpy_inputs())
    # Triton's L0_infer: ex.message().startswith("Request for unknown model")
    assert raised.value.message().startswith("Request for unknown model: 'nosuch'")


def test_refused_inputs_in_tritons_words(client):
    """A request the signature refuses is a 400 whose message starts as Triton core's
    (its qa tests compare them: L0_input_validation, L0_output_name), followed by what
    the model takes."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    def refusal(model: str, inputs: list, **options) -> str:
        with pytest.raises(InferenceServerException) as raised:
            client.infer(model, inputs, **options)
        assert raised.value.status() == "400", raised.value
        return raised.value.message()

    alpha, x, y = _saxpy_inputs()
    assert refusal("saxpy", [alpha]).startswith(
        "expected 3 inputs but got 1 inputs for model 'saxpy'. Got input(s) ['alpha'], "
        "but missing required input(s) ['x','y']. Please provide all required input(s).")
    assert refusal("saxpy", [alpha, x, y], outputs=[
        httpclient.InferRequestedOutput("DUMMY")]).startswith(
        "unexpected inference output 'DUMMY' for model 'saxpy'")
    extra = httpclient.InferInput("w", [4], "FP32")
    extra.set_data_from_numpy(np.zeros(4, np.float32))
    assert refusal("saxpy", [alpha, x, extra]).startswith(
        "unexpected inference input 'w' for model 'saxpy'")
    wrong = httpclient.InferInput("features", [1, 16], "FP64")
    wrong.set_data_from_numpy(np.zeros((1, 16)))
    assert refusal("mlp_classifier", [wrong]).startswith(
        "inference input 'features' data-type is 'FP64', but model 'mlp_classifier' "
        "expects 'FP32'")
    assert refusal("mlp_classifier", _mlp_inputs(65)).startswith(
        "inference request batch-size must be <= 64 for 'mlp_classifier'")
    flat = httpclient.InferInput("features", [16], "FP32")
    flat.set_data_from_numpy(np.zeros(16, np.float32))
    assert refusal("mlp_classifier", [flat]).startswith(
        "unexpected shape for input 'features' for model 'mlp_classifier'. Expected "
        "[-1,16], got [16]")


def test_a_model_not_loaded_in_tritons_words(client, peer_server):
    """A model whose versions are unloaded: inference, metadata and configuration are
    503 in Triton core's words (L0_lifecycle looks for "has no available versions" and
    "version 1 is not at ready state"), naming why; after a load it serves again."""
    from tritonclient.utils import InferenceServerException

    server = peer_server
    assert server.request("POST", "/v2/repository/models/saxpy/unload", b"")[0] == 200
    try:
        # statistics: 404 (see docs/architecture.md), in Triton's words
        for version, words in (("", "requested model 'saxpy' is not available"),
                               ("1", "requested model version is not available for "
                                     "model 'saxpy'")):
            with pytest.raises(InferenceServerException) as raised:
                client.get_inference_statistics("saxpy", version)
            assert raised.value.status() == "404" and words in raised.value.message()
        for version, words in (("", "Request for unknown model: 'saxpy' has no available "
                                    "versions"),
                               ("1", "Request for unknown model: 'saxpy' version 1 is not "
                                     "at ready state")):
            calls = ((client.infer, ("saxpy", _saxpy_inputs()), {"model_version": version}),
                     (client.get_model_metadata, ("saxpy", version), {}),
                     (client.get_model_config, ("saxpy", version), {}))
            for call, args, options in calls:
                with pytest.raises(InferenceServerException) as raised:
                    call(*args, **options)
                assert raised.value.status() == "503", raised.value
                assert words in raised.value.message(), raised.value
                assert "unloaded" in raised.value.message()
    finally:
        assert server.request("POST", "/v2/repository/models/saxpy/load", b"")[0] == 200
    assert client.infer("saxpy", _saxpy_inputs()).as_numpy("z") is not None


def test_a_model_of_two_versions_as_triton_lists_and_serves_them(client):
    """Metadata lists the ready versions in number order (the asked one alone when the
    path names it), an inference without a version runs the highest, and statistics
    come per version, as Triton's."""
    assert client.get_model_metadata("mlp2")["versions"] == ["2", "10"]
    assert client.get_model_metadata("mlp2", "2")["versions"] == ["2"]
    assert client.get_model_metadata("mlp2", "10")["versions"] == ["10"]
    assert client.is_model_ready("mlp2", "2") and client.is_model_ready("mlp2", "10")
    assert client.infer("mlp2", _mlp_inputs(1)).get_response()["model_version"] == "10"
    assert client.infer("mlp2", _mlp_inputs(2), model_version="2").get_response()[
        "model_version"] == "2"
    stats = {s["version"]: s for s in client.get_inference_statistics("mlp2")["model_stats"]}
    assert stats["2"]["inference_count"] == 2 and stats["10"]["inference_count"] == 1
    config = client.get_model_config("mlp2", "2")
    assert config["name"] == "mlp2" and config["version"] == "2"


def test_as_numpy_of_every_datatype_binary_and_json(client):
    """Every datatype a compiled program carries comes back through `as_numpy` with its
    dtype and values, asked as binary and as JSON."""
    import tritonclient.http as httpclient
    from serve_helpers import DTYPES

    names = {"b": ("BOOL", np.bool_), "i8": ("INT8", np.int8), "i16": ("INT16", np.int16),
             "i32": ("INT32", np.int32), "i64": ("INT64", np.int64),
             "f16": ("FP16", np.float16), "f32": ("FP32", np.float32),
             "f64": ("FP64", np.float64)}
    for binary in (True, False):
        inputs, expected = [], {}
        for short, _ in DTYPES:
            datatype, dtype = names[short]
            value = np.array([True, False, True] if dtype is np.bool_ else [1, -2, 3],
                             dtype)
            tensor = httpclient.InferInput(f"in_{short}", [3], datatype)
            tensor.set_data_from_numpy(value, binary_data=binary)
            inputs.append(tensor)
            expected[f"out_{short}"] = ~value if dtype is np.bool_ else (
                value * 3 - 3 if np.issubdtype(dtype, np.integer) else value * 1.5 + 1.5)
        outputs = [httpclient.InferRequestedOutput(name, binary_data=binary)
                   for name in expected]
        result = client.infer("dtypes", inputs, outputs=outputs)
        for name, value in expected.items():
            got = result.as_numpy(name)
            assert got.dtype == value.dtype, (name, got.dtype)
            np.testing.assert_array_equal(got, value, err_msg=name)


def test_bf16_through_tritonclients_own_conversion(client):
    """BF16 as tritonclient sends and reads it (ml_dtypes.bfloat16 arrays, sent as their
    binary bits: the client refuses BF16 as JSON): sums exact in bf16 come back exact and
    bf16, their output asked binary and as JSON numbers."""
    import ml_dtypes
    import tritonclient.http as httpclient

    bf16 = ml_dtypes.bfloat16
    x = np.array([1.5, -2.25, 3.0, 2.0**100, -0.0, 256.0], bf16)
    y = np.array([0.5, 0.25, -3.0, 2.0**100, 0.0, 16.0], bf16)
    want = np.array([2.0, -2.0, 0.0, 2.0**101, 0.0, 272.0], bf16)
    for binary in (True, False):
        inputs = []
        for name, value in (("x", x), ("y", y)):
            tensor = httpclient.InferInput(name, [6], "BF16")
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        result = client.infer("bf16_add", inputs, outputs=[
            httpclient.InferRequestedOutput("sum", binary_data=binary)])
        assert result.get_output("sum")["datatype"] == "BF16"
        got = result.as_numpy("sum")
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (binary, got)


def test_async_infer_many_in_flight_each_gets_its_own_answer(client):
    """64 `async_infer` calls in flight over the client's 8 connections: every result is
    the one its request asked for (ids and values)."""
    import tritonclient.http as httpclient

    pending = []
    for i in range(64):
        tensor = httpclient.InferInput("features", [1 + i % 5, 16], "FP32")
        tensor.set_data_from_numpy(np.full((1 + i % 5, 16), i / 64, np.float32))
        pending.append((i, client.async_infer("mlp_classifier", [tensor],
                                              request_id=f"r{i}")))
    for i, request in pending:
        result = request.get_result(timeout=60)
        assert result.get_response()["id"] == f"r{i}"
        assert result.as_numpy("probabilities").shape == (1 + i % 5, 4)


def test_the_asyncio_client_reads_every_answer(peer_server):
    """`tritonclient.http.aio`: its getters, `infer`, 32 requests gathered at once, and
    the extensions not offered raising 404."""
    import tritonclient.http.aio as aioclient
    from tritonclient.utils import InferenceServerException

    async def run() -> None:
        client = aioclient.InferenceServerClient(peer_server.url, conn_timeout=60)
        try:
            assert await client.is_server_live() and await client.is_server_ready()
            assert await client.is_model_ready("mlp_classifier")
            assert (await client.get_server_metadata())["name"]
            assert (await client.get_model_metadata("saxpy"))["name"] == "saxpy"
            assert (await client.get_model_config("saxpy"))["name"] == "saxpy"
            assert await client.get_model_repository_index()
            assert (await client.get_inference_statistics("saxpy"))["model_stats"]
            with pytest.raises(InferenceServerException) as raised:
                await client.get_trace_settings()
            assert raised.value.status() == "404"
            options = [{}, {"request_compression_algorithm": "gzip"},
                       {"response_compression_algorithm": "deflate"},
                       {"parameters": {"custom": "x"}, "priority": 1,
                        "timeout": 30_000_000}]
            results = await asyncio.gather(*[
                client.infer("saxpy", _saxpy_inputs(n, binary=n % 2 == 0),
                             request_id=str(n), **options[n % len(options)])
                for n in range(1, 33)])
            for n, result in zip(range(1, 33), results):
                assert result.get_response()["id"] == str(n)
                np.testing.assert_array_equal(result.as_numpy("z"),
                                              np.full(n, 6.0, np.float32))
            # failures come back each to its own call, the others unharmed
            answers = await asyncio.gather(
                client.infer("saxpy", _saxpy_inputs(2)),
                client.infer("nosuch", _saxpy_inputs(2)),
                client.infer("saxpy", _saxpy_inputs(2), model_version="9"),
                return_exceptions=True)
            assert answers[0].as_numpy("z").shape == (2,)
            assert [a.status() for a in answers[1:]] == ["404", "404"]
        finally:
            await client.close()

    asyncio.run(asyncio.wait_for(run(), 120))


# -- the queue and deadlines -----------------------------------------------------------

def _spin_stats(server: ServerProcess) -> dict:
    status, _, payload = server.request("GET", "/v2/models/spin/stats")
    assert status == 200, payload
    return json.loads(payload)["model_stats"][0]


def test_queue_full_and_queue_timeout_in_tritons_words(peer_server):
    """spin runs one and queues one: beyond, 503 "Exceeds maximum queue size" with
    Retry-After (L0_model_queue reads these words); a request whose `timeout` passes in
    the queue leaves it unrun with "Request timeout expired" (504: see the deviation in
    docs/architecture.md)."""
    server = peer_server
    _wait_idle(server, "spin")
    fail_before = _spin_stats(server)["inference_stats"]["fail"]["count"]
    results: list = []

    def send(body: dict) -> None:
        results.append(server.request("POST", "/v2/models/spin/infer", body))

    first = threading.Thread(target=send, args=(_spin_body(2_000_000),))
    first.start()
    deadline = time.monotonic() + 30
    while not server.metrics().get(("tinyhal_inference_in_flight",
                                    (("model", "spin"), ("version", "1"))), 0):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    # queued behind the running one, with a deadline far shorter than its run
    status, _, payload = server.request("POST", "/v2/models/spin/infer",
                                        _spin_body(0, timeout=100_000))
    assert status == 504, payload
    assert "Request timeout expired" in json.loads(payload)["error"]
    # the queue's one place taken, the next is refused at once
    queued = threading.Thread(target=send, args=(_spin_body(0),))
    queued.start()
    deadline = time.monotonic() + 30
    while not server.metrics().get(("tinyhal_inference_queued",
                                    (("model", "spin"), ("version", "1"))), 0):
        assert time.monotonic() < deadline and first.is_alive()
        time.sleep(0.02)
    # L0_metrics' queue size: requests waiting, not the one running
    _, _, text = server.request("GET", "/metrics")
    assert b'\nnv_inference_pending_request_count{model="spin",version="1"} 1\n' in text
    status, headers, payload = server.request("POST", "/v2/models/spin/infer",
                                              _spin_body(0))
    assert status == 503 and int(headers["retry-after"]) >= 1, payload
    assert "Exceeds maximum queue size" in json.loads(payload)["error"]
    first.join(60)
    queued.join(60)
    assert sorted(s for s, _, _ in results) == [200, 200]
    _wait_idle(server, "spin")
    # the timed-out request is a failure of the version; the one the full queue refused
    # never reached it (Triton's enqueue refuses it before its statistics see it)
    stats = _spin_stats(server)["inference_stats"]
    assert stats["fail"]["count"] == fail_before + 1 and stats["fail"]["ns"] > 0
    assert stats["success"]["count"] == stats["queue"]["count"]
    # read as L0_model_queue reads it: the exposition's line, Triton's name and labels
    _, _, text = server.request("GET", "/metrics")
    rejected = re.search(rb'\nnv_inference_request_failure\{model="spin",reason="REJECTED",'
                         rb'version="1"\} (\d+)\n', text)
    assert rejected and int(rejected.group(1)) >= 1, text[-2000:]


def test_schedule_parameters_are_read_as_tritons_frontend_reads_them(peer_server):
    """`priority` and `timeout` are uint64s in Triton's frontend (`MemberAsUInt`): a
    fraction, a negative number, a string or a boolean is a 400 naming the parameter;
    the integers at the range's ends are taken (priority beyond the levels is the
    default level, as in Triton; the largest timeout is no bound in practice)."""
    server = peer_server
    rows = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16],
                        "data": [0.5] * 16}]}
    for parameters in ({"timeout": 1.5}, {"timeout": 1e7}, {"timeout": -1},
                       {"timeout": "100"}, {"timeout": True}, {"priority": 1.0},
                       {"priority": -3}, {"priority": False}):
        status, _, payload = server.request("POST", "/v2/models/mlp_classifier/infer",
                                            dict(rows, parameters=parameters))
        key = next(iter(parameters))
        assert status == 400 and f"parameter '{key}' must be" in json.loads(payload)[
            "error"], (parameters, payload)
    for parameters in ({"timeout": 0}, {"timeout": 2**64 - 1}, {"priority": 0},
                       {"priority": 2**64 - 1}):
        status, _, payload = server.request("POST", "/v2/models/mlp_classifier/infer",
                                            dict(rows, parameters=parameters))
        assert status == 200, (parameters, payload)


def test_a_client_that_leaves_mid_request_is_counted_as_tritons(peer_server):
    """A stateless request whose client hangs up while it runs (L0_client_timeout's
    client giving up) runs to its end and is counted a success, as in Triton, whose HTTP
    frontend does not cancel it; the server keeps serving."""
    import socket

    server = peer_server
    _wait_idle(server, "spin")
    before = _spin_stats(server)["inference_stats"]["success"]["count"]
    body = json.dumps(_spin_body(1_000_000)).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"POST /v2/models/spin/infer HTTP/1.1\r\nHost: t\r\n"
                     b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
        deadline = time.monotonic() + 30
        while not server.metrics().get(("tinyhal_inference_in_flight",
                                        (("model", "spin"), ("version", "1"))), 0):
            assert time.monotonic() < deadline
            time.sleep(0.02)
    deadline = time.monotonic() + 60
    while _spin_stats(server)["inference_stats"]["success"]["count"] != before + 1:
        assert time.monotonic() < deadline, "the request of the client that left was lost"
        time.sleep(0.05)
    _wait_idle(server, "spin")
    status, _, payload = server.request("POST", "/v2/models/spin/infer", _spin_body(0))
    assert status == 200, payload


def test_reserved_parameters_in_tritons_words(peer_server):
    """L0_parameters: a `triton_` parameter sent over raw HTTP is a 400 "reserved for
    Triton usage"; custom parameters of every JSON scalar type are taken."""
    server = peer_server
    rows = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16],
                        "data": [0.5] * 16}]}
    for key in ("triton_enable_empty_final_response", "triton_final_response",
                "triton_injected_via_header"):
        status, _, payload = server.request("POST", "/v2/models/mlp_classifier/infer",
                                            dict(rows, parameters={key: "dummy-value"}))
        assert status == 400 and "reserved for Triton usage" in json.loads(payload)[
            "error"], payload
    for parameters in ({"key1": "value1", "key2": "value2"}, {"key1": 1, "key2": 2},
                       {"key1": 123.123, "key2": 321.321}, {"key1": True, "key2": "v"}):
        status, _, payload = server.request("POST", "/v2/models/mlp_classifier/infer",
                                            dict(rows, parameters=parameters))
        assert status == 200, (parameters, payload)


def test_triton_queue_policy_settings_are_refused_naming_them(peer_server):
    """Triton's queue policy (`default_queue_policy`, `priority_levels`) is not offered:
    a configuration giving it is refused naming the key, never taken and ignored."""
    server = peer_server
    for batching in ({"default_queue_policy": {"timeout_action": "DELAY"}},
                     {"priority_levels": 2, "default_priority_level": 1},
                     {"preserve_ordering": True}):
        config = json.dumps({"max_batch_size": 64, "function": "predict",
                             "dynamic_batching": batching})
        status, _, payload = server.request(
            "POST", "/v2/repository/models/mlp_classifier/load",
            {"parameters": {"config": config}})
        key = next(iter(batching))
        assert status == 400 and key in json.loads(payload)["error"], payload
    status, _, payload = server.request("POST", "/v2/repository/models/mlp_classifier/load",
                                        b"")
    assert status == 200, payload


# -- statistics and metrics ------------------------------------------------------------

def _stats(client, model: str) -> dict:
    (doc,) = client.get_inference_statistics(model)["model_stats"]
    return doc


def test_statistics_field_by_field_as_tritons(client, peer_server):
    """Every field of Triton's statistics, with its meaning: requests and rows, executions
    and their batch sizes, a failure counted in `fail` only, the phases counted once per
    success, an unknown model in Triton's words."""
    from tritonclient.utils import InferenceServerException

    assert peer_server.request("POST", "/v2/repository/models/mlp_classifier/load",
                               b"")[0] == 200
    before = _stats(client, "mlp_classifier")
    assert set(before) == {"name", "version", "last_inference", "inference_count",
                           "execution_count", "inference_stats", "response_stats",
                           "batch_stats", "memory_usage"}
    assert set(before["inference_stats"]) == {"success", "fail", "queue", "compute_input",
                                              "compute_infer", "compute_output",
                                              "cache_hit", "cache_miss"}
    assert before["inference_count"] == before["execution_count"] == 0
    assert before["last_inference"] == 0 and before["batch_stats"] == []
    started_ms = int(time.time() * 1000)
    for rows in (1, 3, 3):
        client.infer("mlp_classifier", _mlp_inputs(rows))
    bad = _mlp_inputs(2)
    bad[0]._shape = [2, 15]  # refused by the signature before admission: as Triton,
    with pytest.raises(InferenceServerException):  # no failure of the version
        client.infer("mlp_classifier", bad)
    doc = _stats(client, "mlp_classifier")
    stats = doc["inference_stats"]
    assert doc["inference_count"] == 7 and doc["execution_count"] == 3
    assert stats["success"]["count"] == 3 and stats["fail"] == {"count": 0, "ns": 0}
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert stats[phase]["count"] == 3, phase
    assert stats["success"]["ns"] >= stats["compute_infer"]["ns"] > 0
    assert stats["cache_hit"] == stats["cache_miss"] == {"count": 0, "ns": 0}
    assert doc["last_inference"] >= started_ms - 1000
    batches = {b["batch_size"]: b for b in doc["batch_stats"]}
    assert set(batches) == {1, 3}
    for phase in ("compute_input", "compute_infer", "compute_output"):
        assert batches[1][phase]["count"] == 1 and batches[3][phase]["count"] == 2
    assert doc["response_stats"] == {} and doc["memory_usage"] == []
    # per version, and all models
    assert _stats(client, "mlp_classifier") == client.get_inference_statistics(
        "mlp_classifier", "1")["model_stats"][0]
    names = {s["name"] for s in client.get_inference_statistics()["model_stats"]}
    assert names == {"mlp_classifier", "saxpy", "spin", "dtypes", "mlp2", "bf16_add"}
    for model, version in (("nosuch", ""), ("mlp_classifier", "9")):
        with pytest.raises(InferenceServerException) as raised:
            client.get_inference_statistics(model, version)
        assert "Request for unknown model" in raised.value.message()


def _reload(server: ServerProcess, model: str) -> None:
    assert server.request("POST", f"/v2/repository/models/{model}/unload", b"")[0] == 200
    assert server.request("POST", f"/v2/repository/models/{model}/load", b"")[0] == 200


def test_counters_stay_monotone_across_unload_and_reload(client, peer_server):
    """Prometheus counters of a version never go down while the process lives: what a
    version counted before an unload is still counted after its reload, while its
    statistics start again from zero, as Triton's."""
    server = peer_server
    labels = (("model", "saxpy"), ("version", "1"))
    names = ("tinyhal_inference_count_total", "tinyhal_inference_exec_count_total",
             "tinyhal_inference_requests_total")

    def counters() -> dict:
        metrics = server.metrics()
        return {name: metrics[(name, (("code", "200"), *labels) if "requests" in name
                               else labels)] for name in names}

    for n in (2, 3):
        client.infer("saxpy", _saxpy_inputs(n))
    before = counters()
    assert before["tinyhal_inference_count_total"] >= 2
    _reload(server, "saxpy")
    assert counters() == before
    assert _stats(client, "saxpy")["inference_count"] == 0
    client.infer("saxpy", _saxpy_inputs(1))
    after = counters()
    assert all(after[name] == before[name] + 1 for name in names), (before, after)


def test_tritons_request_metrics_under_its_names(client, peer_server):
    """Triton's request metrics as its qa tests read them from the exposition's text
    (`nv_inference_request_success{model="m",version="1"} N`): successes, failures by
    reason (every reason at zero from the start), rows, executions, cumulative phase
    microseconds and pending requests; counters too stay monotone over a reload."""
    server = peer_server

    def triton_metrics() -> dict[str, float]:
        _, _, text = server.request("GET", "/metrics")
        found = re.findall(rb'\n(nv_inference_[a-z_]+)\{model="saxpy",(reason="[A-Z]+",)?'
                           rb'version="1"\} ([0-9.e+]+)', text)
        return {(name + (b":" + reason[8:-2] if reason else b"")).decode(): float(value)
                for name, reason, value in found}

    before = triton_metrics()
    for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
        assert f"nv_inference_request_failure:{reason}" in before
    assert {"nv_inference_request_success", "nv_inference_count", "nv_inference_exec_count",
            "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
            "nv_inference_compute_input_duration_us",
            "nv_inference_compute_infer_duration_us",
            "nv_inference_compute_output_duration_us",
            "nv_inference_pending_request_count"} <= set(before)
    from tritonclient.utils import InferenceServerException

    client.infer("saxpy", _saxpy_inputs(3))
    refused = _saxpy_inputs(3)
    refused[1]._datatype = "INT32"  # refused by the signature: never reaches the version
    refused[1]._raw_data = np.zeros(3, np.int32).tobytes()
    with pytest.raises(InferenceServerException):
        client.infer("saxpy", refused)
    alpha, x, _ = _saxpy_inputs(3)
    _, _, y = _saxpy_inputs(2)  # lengths the program itself refuses when it runs
    with pytest.raises(InferenceServerException) as raised:
        client.infer("saxpy", [alpha, x, y])
    assert raised.value.status() == "400"
    after = triton_metrics()
    assert after["nv_inference_request_success"] == before["nv_inference_request_success"] + 1
    assert after["nv_inference_count"] == before["nv_inference_count"] + 1
    assert after["nv_inference_request_failure:BACKEND"] == \
        before["nv_inference_request_failure:BACKEND"] + 1
    for reason in ("REJECTED", "CANCELED", "OTHER"):
        assert after[f"nv_inference_request_failure:{reason}"] == \
            before[f"nv_inference_request_failure:{reason}"]
    assert after["nv_inference_request_duration_us"] > before["nv_inference_request_duration_us"]
    assert after["nv_inference_pending_request_count"] == 0
    _reload(server, "saxpy")
    assert triton_metrics() == after


def test_restricted_apis_as_tritons_l0_http_restricted_api(tmp_path):
    """Triton's L0_http restricted-API case, run as its test.sh starts it: a restricted
    group without its header is 403 "This API is restricted"; with the header the request
    goes through (a model-control request then gets its own refusal, "explicit model load
    / unload is not allowed")."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    shutil.copytree(SAMPLES / "saxpy", tmp_path / "saxpy")
    server = ServerProcess("--model-repository", str(tmp_path),
                           "--http-restricted-api", "model-repository:admin-key=admin-value",
                           "--http-restricted-api", "inference,metadata:infer-key=infer-value")
    try:
        server.start()
        client = httpclient.InferenceServerClient(server.url, network_timeout=60.0)
        try:
            with pytest.raises(InferenceServerException, match="This API is restricted"):
                client.unload_model("saxpy", headers={"infer-key": "infer-value"})
            with pytest.raises(InferenceServerException,
                               match="explicit model load / unload is not allowed"):
                client.unload_model("saxpy", headers={"admin-key": "admin-value"})
            with pytest.raises(InferenceServerException, match="This API is restricted"):
                client.get_server_metadata()
            assert client.get_server_metadata({"infer-key": "infer-value"})["name"]
            with pytest.raises(InferenceServerException, match="This API is restricted"):
                client.infer("saxpy", _saxpy_inputs(), headers={"test": "1"})
            result = client.infer("saxpy", _saxpy_inputs(),
                                  headers={"infer-key": "infer-value"})
            np.testing.assert_array_equal(result.as_numpy("z"), np.full(4, 6.0, np.float32))
            assert client.is_server_live()  # health is not restricted here
        finally:
            client.close()
    finally:
        server.stop()


def test_triton_metrics_of_a_model_named_with_quotes_and_backslashes(tmp_path):
    """Model names are label values: the hand-written `nv_inference_*` lines escape them
    as the exposition format says, so a parser reads the name back whole."""
    name = 'q"uo\\te'
    shutil.copytree(SAMPLES / "saxpy", tmp_path / name)
    server = ServerProcess("--model-repository", str(tmp_path))
    try:
        server.start()
        body = json.dumps({"inputs": [
            {"name": n, "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}
            for n in ("x", "y")] + [{"name": "alpha", "datatype": "FP32", "shape": [1],
                                     "data": [1.0]}]})
        path = "/v2/models/" + urllib.parse.quote(name, safe="") + "/infer"
        assert server.request("POST", path, body.encode())[0] == 404  # not decoded
        metrics = server.metrics()
        labels = (("model", name), ("version", "1"))
        assert metrics[("nv_inference_count_total", labels)] == 0
        assert metrics[("nv_inference_request_failure_total",
                        (("model", name), ("reason", "OTHER"), ("version", "1")))] == 0
    finally:
        server.stop()

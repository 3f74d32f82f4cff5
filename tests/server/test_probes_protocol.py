"""Probes of what a V2 request may say, checked against Triton's HTTP frontend and its L0
tests (`qa/L0_http`, `qa/L0_sequence_batcher`, `qa/L0_model_control_*`): request
parameters, ids, shared-memory parameters, names and versions in the path, endpoints of
extensions not offered, and repository control bodies. One server child (explicit model
control, the bundled samples) for the module; each probe is a 4xx naming what was wrong,
or the 200 Triton gives, and the server keeps serving."""

from __future__ import annotations

import json

import pytest
from serve_helpers import ServerProcess, sample_server

pytestmark = pytest.mark.timeout(180)

_ROW = [0.5] * 16
_INPUTS = [{"name": "features", "datatype": "FP32", "shape": [1, 16], "data": _ROW}]
_MLP = "/v2/models/mlp_classifier/infer"


@pytest.fixture(scope="module")
def probe_server(tmp_path_factory):
    with sample_server(tmp_path_factory.mktemp("repo"), ("mlp_classifier", "saxpy", "gru_step"),
                       "--model-control-mode", "explicit", "--load-model", "*") as server:
        yield server


def _request(**members) -> bytes:
    return json.dumps({"inputs": _INPUTS, **members}).encode()


def _infer_ok(server: ServerProcess) -> None:
    status, _, payload = server.request("POST", _MLP, _request())
    assert status == 200, payload


# (probe, body, status, part of the error); Triton's frontend reads each parameter
# with a typed getter (MemberAsUInt, MemberAsBool...) and any other parameter must be a
# string, an integer, a boolean or a number
_BODIES = [
    ("priority not a uint64", _request(parameters={"priority": "high"}), 400,
     "parameter 'priority' must be a uint64"),
    ("negative priority", _request(parameters={"priority": -1}), 400, "'priority'"),
    ("timeout beyond uint64", b'{"parameters": {"timeout": 1' + b"0" * 22 + b'}, "inputs": '
     + json.dumps(_INPUTS).encode() + b"}", 400, "parameter 'timeout' must be"),
    ("a parameter holding an object", _request(parameters={"custom": {"a": {"b": 1}}}), 400,
     "parameter 'custom' has invalid type"),
    ("a parameter holding a list", _request(parameters={"custom": [1, 2]}), 400,
     "parameter 'custom' has invalid type"),
    ("a parameter holding null", _request(parameters={"custom": None}), 400,
     "parameter 'custom' has invalid type"),
    ("a reserved triton_ key", _request(parameters={"triton_enable_empty_final_response":
                                                    True}), 400, "reserved"),
    ("sequence_id of a wrong type on a stateless model",
     _request(parameters={"sequence_id": [1]}), 400, "'sequence_id' must be a uint64"),
    ("sequence_end as a string on a stateless model",
     _request(parameters={"sequence_end": "true"}), 400, "'sequence_end' must be true"),
    ("id null", _request(id=None), 400, "'id' must be a string, not null"),
    ("input in a shared-memory region", json.dumps({"inputs": [{
        "name": "features", "datatype": "FP32", "shape": [1, 16], "parameters": {
            "shared_memory_region": "r", "shared_memory_byte_size": 64}}]}).encode(), 400,
     "shared-memory extensions are not supported"),
    ("output to a shared-memory region", _request(outputs=[{
        "name": "class", "parameters": {"shared_memory_region": "r"}}]), 400,
     "shared-memory extensions are not supported"),
    # what stays accepted: parameters Triton passes on to the model, and the ones it reads
    ("custom scalar parameters", _request(parameters={"s": "x", "i": -3, "f": 0.5,
                                                      "b": True}), 200, ""),
    ("priority and timeout", _request(parameters={"priority": 1, "timeout": 10_000_000}),
     200, ""),
    ("sequence parameters on a stateless model",
     _request(parameters={"sequence_id": 5, "sequence_start": True}), 200, ""),
]


@pytest.mark.parametrize("body,status,message", [b[1:] for b in _BODIES],
                         ids=[b[0] for b in _BODIES])
def test_request_probes(probe_server, body, status, message):
    got, _, payload = probe_server.request("POST", _MLP, body)
    assert got == status, payload
    if status != 200:
        assert message in json.loads(payload)["error"], payload
    _infer_ok(probe_server)


def test_a_binary_header_with_bad_parameters_is_refused_every_time(probe_server):
    """The parameters of a binary request's header are checked with the header, which
    the server keeps by its bytes: the same header is refused again, not let through."""
    head = json.dumps({"parameters": {"priority": "x"}, "inputs": [
        {"name": "features", "datatype": "FP32", "shape": [1, 16],
         "parameters": {"binary_data_size": 64}}]}).encode()
    for _ in range(3):
        status, _, payload = probe_server.request(
            "POST", _MLP, head + bytes(64), {"Inference-Header-Content-Length": str(len(head))})
        assert status == 400 and b"'priority'" in payload, payload


@pytest.mark.parametrize("path,status", [
    ("/v2/models/%2e%2e/ready", 404),
    ("/v2/models/..%2fsaxpy/ready", 404),
    ("/v2/models/mlp_classifier%00/ready", 404),
    ("/v2/models/" + "m" * 4000 + "/ready", 404),
    ("/v2/models/mlp_classifier/versions/0/ready", 404),
    ("/v2/models/mlp_classifier/versions/-1/ready", 404),
    ("/v2/models/mlp_classifier/versions/99999999999999999999/ready", 400),  # as Triton
    ("/v2/models/mlp_classifier/versions/01/ready", 200),  # version 1, as Triton reads it
    ("/v2/models/mlp_classifier/versions/7/stats", 404),
    ("/v2/models/mlp_classifier/versions/1/ready", 200),
    # extensions not offered (not in the server metadata's list): no such route
    ("/v2/trace/setting", 404),
    ("/v2/models/mlp_classifier/trace/setting", 404),
    ("/v2/logging", 404),
    ("/v2/systemsharedmemory/status", 404),
    ("/v2/cudasharedmemory/status", 404),
])
def test_names_versions_and_endpoints_not_offered(probe_server, path, status):
    got, _, payload = probe_server.request("GET", path)
    assert got == status, payload
    if status == 404:
        assert "error" in json.loads(payload)


def test_extensions_not_offered_are_not_advertised(probe_server):
    status, _, payload = probe_server.request("GET", "/v2")
    extensions = set(json.loads(payload)["extensions"])
    assert status == 200 and not extensions & {"trace", "logging", "system_shared_memory",
                                               "cuda_shared_memory", "classification"}


@pytest.mark.parametrize("body,message", [
    (b"not json", "unload request body is not valid JSON"),
    (b"[" * 250_000 + b"]" * 250_000, "unload request body is not valid JSON"),
    (b"[1]", "unload request body must be a JSON object"),
    (b'{"parameters": null}', "unload request 'parameters' must be an object"),
    (b'{"parameters": {"unload_dependents": "yes"}}', "'unload_dependents' must be true"),
])
def test_unload_bodies_are_parsed_as_triton_parses_them(probe_server, body, message):
    status, _, payload = probe_server.request("POST", "/v2/repository/models/saxpy/unload",
                                              body)
    assert status == 400 and message in json.loads(payload)["error"], payload
    status, _, _ = probe_server.request("GET", "/v2/models/saxpy/ready")
    assert status == 200  # a refused unload unloads nothing


def test_control_bodies_that_are_not_objects_are_400(probe_server):
    for path in ("/v2/repository/models/saxpy/load", "/v2/repository/index"):
        status, _, payload = probe_server.request("POST", path, b"[true]")
        assert status == 400 and b"must be a JSON object" in payload, payload
    status, _, payload = probe_server.request(
        "POST", "/v2/repository/models/saxpy/unload",
        b'{"parameters": {"unload_dependents": false}}')
    assert status == 200, payload
    status, _, payload = probe_server.request("POST", "/v2/repository/models/saxpy/load", b"")
    assert status == 200, payload


def test_many_small_tensors_in_a_large_body_are_refused_before_they_cost(probe_server):
    """A large JSON body of 200,000 one-value tensors (11 MB) took 970 MB of server
    memory (4 GB for 45 MB) and, before, minutes of a parsing thread's CPU: the objects
    a parser makes per value were charged nowhere. The data arrays and the values beside
    them are bounded before the JSON is parsed."""
    many_tensors = b'{"inputs":[' + b",".join(
        b'{"name":"i%d","datatype":"FP32","shape":[1],"data":[1]}' % i
        for i in range(200_000)) + b"]}"
    many_outputs = json.dumps({"inputs": _INPUTS, "id": " " * 70_000, "outputs": [
        {"name": "class"}] * 200_000}).encode()
    for body, message in ((many_tensors, "more than 4096 'data' arrays"),
                          (many_outputs, "more than 65536 commas")):
        peak = probe_server.status_bytes("VmHWM")
        status, _, payload = probe_server.request("POST", _MLP, body, timeout=120)
        assert status == 400 and message in json.loads(payload)["error"], payload[:300]
        grown = probe_server.status_bytes("VmHWM") - peak
        assert grown < 8 * len(body), f"peak RSS grew {grown >> 20} MB"
    _infer_ok(probe_server)


def test_an_empty_outputs_list_asks_for_every_output_as_triton(probe_server):
    """Triton's frontend requests each listed output and its core answers every output
    when none was requested: `"outputs": []` was answered with no output at all."""
    status, _, payload = probe_server.request("POST", _MLP, _request(outputs=[]))
    assert status == 200, payload
    assert [o["name"] for o in json.loads(payload)["outputs"]] == ["probabilities", "class"]
    status, _, payload = probe_server.request(
        "POST", _MLP, _request(outputs=[{"name": "class",
                                          "parameters": {"binary_data": True}}]))
    assert status == 200, payload
    header, _, tail = payload.partition(b"}]}")  # a JSON header, then the output's bytes
    out = json.loads(header + b"}]}")["outputs"]
    assert [o["name"] for o in out] == ["class"] and len(tail) == 4, payload
    assert out[0]["parameters"]["binary_data_size"] == 4


def test_statistics_are_those_of_loaded_versions_as_triton(probe_server):
    """Triton keeps a version's statistics with the loaded version (its L0_server_status
    expects none for an unloaded one, and a reload starts from zero): they were served
    for unloaded versions, frozen."""
    server = probe_server
    saxpy = json.dumps({"inputs": [
        {"name": n, "datatype": "FP32", "shape": s, "data": [1.0] * s[0]}
        for n, s in (("alpha", [1]), ("x", [4]), ("y", [4]))]}).encode()

    def counts() -> dict:
        status, _, payload = server.request("GET", "/v2/models/stats")
        assert status == 200, payload
        return {(m["name"], m["version"]): m["inference_count"]
                for m in json.loads(payload)["model_stats"]}

    assert server.request("POST", "/v2/repository/models/saxpy/load", b"")[0] == 200
    assert server.request("POST", "/v2/models/saxpy/infer", saxpy)[0] == 200
    assert counts()[("saxpy", "1")] >= 1
    assert server.request("POST", "/v2/repository/models/saxpy/unload", b"")[0] == 200
    assert ("saxpy", "1") not in counts()
    # nor its configuration and metadata, as Triton's
    for path in ("/v2/models/saxpy/config", "/v2/models/saxpy", "/v2/models/saxpy/versions/1"):
        status, _, payload = server.request("GET", path)
        assert status == 503 and b"is not ready: unloaded" in payload, (path, payload)
    for path in ("/v2/models/saxpy/stats", "/v2/models/saxpy/versions/1/stats"):
        status, _, payload = server.request("GET", path)
        assert status == 404 and b"loaded versions only" in payload, payload
    assert server.request("POST", "/v2/repository/models/saxpy/load", b"")[0] == 200
    assert counts()[("saxpy", "1")] == 0
    _infer_ok(server)

"""The model-repository extension with tritonclient: index, load, unload, new versions
picked up, unload never closing a module under a running invocation; statistics."""

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

pytestmark = pytest.mark.timeout(180)


def _saxpy(client, version=""):
    inputs = []
    for name, array in (("alpha", np.array([2.0], np.float32)),
                        ("x", np.arange(3, dtype=np.float32)),
                        ("y", np.ones(3, np.float32))):
        inp = httpclient.InferInput(name, list(array.shape), "FP32")
        inp.set_data_from_numpy(array)
        inputs.append(inp)
    return client.infer("saxpy", inputs, model_version=version).as_numpy("z")


def test_load_unload_and_new_versions(tmp_path, start_server, spin_vmfb):
    shutil.copytree(SAMPLES / "saxpy", tmp_path / "saxpy")
    write_model(tmp_path, "spin", spin_vmfb, {"max_concurrency": 1})
    server = start_server("--model-repository", str(tmp_path), "--model-control-mode",
                          "explicit", "--load-model", "*")
    client = httpclient.InferenceServerClient(server.url, network_timeout=60.0)
    try:
        assert {"model_repository", "statistics"} <= set(
            client.get_server_metadata()["extensions"])
        np.testing.assert_array_equal(_saxpy(client), [1, 3, 5])

        client.unload_model("saxpy")
        assert not client.is_model_ready("saxpy")
        assert client.is_server_ready()  # spin still serves; saxpy was unloaded on purpose
        index = {m["name"]: m for m in client.get_model_repository_index()}
        assert (index["saxpy"]["state"], index["saxpy"]["reason"]) == ("UNAVAILABLE",
                                                                        "unloaded")
        with pytest.raises(InferenceServerException) as info:
            _saxpy(client)
        assert info.value.status() == "503"
        status, _, body = server.request("POST", "/v2/repository/index",
                                         json.dumps({"ready": True}).encode())
        assert [m["name"] for m in json.loads(body)] == ["spin"]

        client.load_model("saxpy")
        assert client.is_model_ready("saxpy")
        np.testing.assert_array_equal(_saxpy(client), [1, 3, 5])

        # a new version directory is picked up by load; with version policy "all" both
        # serve ...
        shutil.copytree(tmp_path / "saxpy" / "1", tmp_path / "saxpy" / "2")
        config = json.loads((tmp_path / "saxpy" / "config.json").read_text())
        (tmp_path / "saxpy" / "config.json").write_text(
            json.dumps({**config, "version_policy": {"all": {}}}))
        client.load_model("saxpy")
        assert client.get_model_metadata("saxpy")["versions"] == ["1", "2"]
        assert client.is_model_ready("saxpy", "2")
        np.testing.assert_array_equal(_saxpy(client, "2"), [1, 3, 5])
        # ... with the default policy only the latest one; the other unloads
        (tmp_path / "saxpy" / "config.json").write_text(json.dumps(config))
        client.load_model("saxpy")
        assert client.get_model_metadata("saxpy")["versions"] == ["2"]
        assert not client.is_model_ready("saxpy", "1")
        # ... and a version whose directory is gone is unloaded and dropped
        shutil.copytree(tmp_path / "saxpy" / "2", tmp_path / "saxpy" / "3")
        client.load_model("saxpy")
        shutil.rmtree(tmp_path / "saxpy" / "3")
        client.load_model("saxpy")
        assert client.get_model_metadata("saxpy")["versions"] == ["2"]

        with pytest.raises(InferenceServerException) as info:
            client.load_model("nope")
        assert info.value.status() == "400" and "no such model directory" in info.value.message()
        client.unload_model("nope")  # not loaded: already unloaded, as Triton answers
    finally:
        client.close()


def test_unload_waits_for_a_running_invocation(tmp_path, start_server, spin_vmfb):
    write_model(tmp_path, "spin", spin_vmfb, {"max_concurrency": 1})
    shutil.copytree(SAMPLES / "saxpy", tmp_path / "saxpy")
    server = start_server("--model-repository", str(tmp_path), "--model-control-mode",
                          "explicit", "--load-model", "*")
    body = {"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1024], "data": [1.0] * 1024},
        {"name": "n", "datatype": "INT32", "shape": [1], "data": [1_000_000]}]}
    results = []
    worker = threading.Thread(target=lambda: results.append(
        server.request("POST", "/v2/models/spin/infer", body)))
    worker.start()
    labels = (("model", "spin"), ("version", "1"))
    deadline = time.monotonic() + 30
    while server.metrics().get(("tinyhal_inference_in_flight", labels)) != 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    status, _, _ = server.request("POST", "/v2/repository/models/spin/unload", b"")
    assert status == 200
    worker.join(timeout=60)
    assert results[0][0] == 200  # it finished before the module closed
    status, _, payload = server.request("POST", "/v2/models/spin/infer", body)
    assert status == 503 and "unloaded" in json.loads(payload)["error"]
    status, _, _ = server.request("POST", "/v2/repository/models/spin/load", b"")
    assert status == 200
    small = {"inputs": [{**body["inputs"][0], "shape": [2], "data": [1.0, 1.0]},
                        {**body["inputs"][1], "data": [0]}]}
    status, _, payload = server.request("POST", "/v2/models/spin/infer", small)
    assert status == 200, payload


def test_inference_statistics(server, client):
    x = np.ones((2, 16), np.float32)
    inp = httpclient.InferInput("features", [2, 16], "FP32")
    inp.set_data_from_numpy(x)
    before = client.get_inference_statistics("mlp_classifier")["model_stats"][0]
    client.infer("mlp_classifier", [inp])
    bad = httpclient.InferInput("features", [1, 15], "FP32")
    bad.set_data_from_numpy(np.ones((1, 15), np.float32))
    with pytest.raises(InferenceServerException):
        client.infer("mlp_classifier", [bad])
    stats = client.get_inference_statistics("mlp_classifier", "1")["model_stats"][0]
    assert (stats["name"], stats["version"]) == ("mlp_classifier", "1")
    inference = stats["inference_stats"]
    was = before["inference_stats"]
    assert inference["success"]["count"] == was["success"]["count"] + 1
    # refused by the signature before admission: not a failure of the version (Triton)
    assert inference["fail"]["count"] == was["fail"]["count"]
    assert stats["inference_count"] == before["inference_count"] + 2
    assert stats["execution_count"] == before["execution_count"] + 1
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert inference[phase]["count"] == was[phase]["count"] + 1
    assert stats["last_inference"] > 0
    every = client.get_inference_statistics()["model_stats"]
    assert {s["name"] for s in every} >= {"mlp_classifier", "saxpy", "spin", "dtypes"}
    with pytest.raises(InferenceServerException) as info:
        client.get_inference_statistics("nope")
    assert info.value.status() == "404"


def test_explicit_control_without_load_model_starts_with_no_model_loaded(tmp_path,
                                                                         start_server):
    """As Triton's: `--model-control-mode explicit` loads only what `--load-model` names,
    none without it; the repository index lists every model, and a load serves it."""
    shutil.copytree(SAMPLES / "saxpy", tmp_path / "saxpy")
    shutil.copytree(SAMPLES / "mlp_classifier", tmp_path / "mlp_classifier")
    server = start_server("--model-repository", str(tmp_path), "--model-control-mode",
                          "explicit")
    assert "serving no models" in server.stdout[-1]
    client = httpclient.InferenceServerClient(server.url, network_timeout=60.0)
    try:
        assert not client.is_model_ready("saxpy")
        index = {m["name"]: m for m in client.get_model_repository_index()}
        assert set(index) == {"saxpy", "mlp_classifier"}
        assert all(m.get("state") != "READY" for m in index.values()), index
        client.load_model("saxpy")
        np.testing.assert_array_equal(_saxpy(client), [1, 3, 5])
        assert not client.is_model_ready("mlp_classifier")
    finally:
        client.close()

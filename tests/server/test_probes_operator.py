"""Probes of what a careless operator does to a running server: leaves a broken model in
a polled repository, and loads, unloads and queries one model from many clients at once
while others infer on it. Server children on 127.0.0.1, every wait bounded."""

from __future__ import annotations

import http.client
import json
import shutil
import threading
import time
from collections import Counter

import pytest
from serve_helpers import SAMPLES, ServerProcess

pytestmark = pytest.mark.timeout(180)


def _wait(predicate, timeout: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_poll_tries_a_failed_version_again_only_once_its_files_changed(tmp_path):
    """Triton's poll reloads only what changed. A version that failed to load (a bad
    config, a module file that is not one) was loaded again at every poll: an error
    line per poll, and a large module translated again and again. Now it is tried again
    when its files change, and then it serves."""
    shutil.copytree(SAMPLES / "saxpy", tmp_path / "saxpy")
    shutil.copytree(SAMPLES / "saxpy", tmp_path / "badconfig")
    (tmp_path / "badconfig" / "config.json").write_text('{"max_batch_size": "8"}')
    shutil.copytree(SAMPLES / "saxpy", tmp_path / "badmodule")
    (tmp_path / "badmodule" / "1" / "model.vmfb").write_bytes(b"not a module" * 100)
    server = ServerProcess("--model-repository", str(tmp_path), "--model-control-mode",
                           "poll", "--repository-poll-secs", "0.2", "--no-exit-on-error")
    try:
        server.start()
        server.wait_stderr(r"model badmodule version 1 failed to load")
        time.sleep(3)  # some fifteen polls
        log = "".join(server.stderr)
        assert log.count("loading model badmodule version 1") == 1, log[-3000:]
        assert log.count("model badconfig version 1: ") == 1, log[-3000:]
        status, _, payload = server.request("GET", "/v2/repository/index")
        states = {e["name"]: e.get("state") for e in json.loads(payload)}
        assert states == {"saxpy": "READY", "badconfig": "UNAVAILABLE",
                          "badmodule": "UNAVAILABLE"}, states
        # the operator fixes both: the next poll loads them
        shutil.copyfile(SAMPLES / "saxpy" / "config.json",
                        tmp_path / "badconfig" / "config.json")
        shutil.copyfile(SAMPLES / "saxpy" / "1" / "model.vmfb",
                        tmp_path / "badmodule" / "1" / "model.vmfb.new")
        (tmp_path / "badmodule" / "1" / "model.vmfb.new").rename(
            tmp_path / "badmodule" / "1" / "model.vmfb")
        for name in ("badconfig", "badmodule"):
            _wait(lambda n=name: server.request("GET", f"/v2/models/{n}/ready")[0] == 200,
                  what=f"{name} to load once fixed")
    finally:
        server.stop()


_SAXPY = json.dumps({"inputs": [
    {"name": "alpha", "datatype": "FP32", "shape": [1], "data": [2.0]},
    {"name": "x", "datatype": "FP32", "shape": [4], "data": [1.0] * 4},
    {"name": "y", "datatype": "FP32", "shape": [4], "data": [1.0] * 4}]}).encode()
_STEP = {"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 8],
                     "data": [0.1] * 8}]}


def test_a_storm_of_load_unload_and_requests_on_one_model(tmp_path):
    """Two clients load (one with a config override), one unloads, others read the
    index, statistics, metadata and metrics, and others infer on the same stateless
    and sequence models, for a few seconds. Every answer is a 200, a 400 for a sequence
    its unload ended, or the documented 503 of a version not ready; nothing is a 5xx
    otherwise or hangs; afterwards the model loads and serves."""
    for sample in ("saxpy", "gru_step"):
        shutil.copytree(SAMPLES / sample, tmp_path / sample)
    server = ServerProcess("--model-repository", str(tmp_path), "--model-control-mode",
                           "explicit", "--load-model", "*")
    statuses: Counter = Counter()
    unexpected: list = []
    stop = time.monotonic() + 6

    def client(kind: str, index: int) -> None:
        conn = None
        sequence, step = index * 1_000_000, 0
        while time.monotonic() < stop:
            model = "gru_step" if kind == "seq" or (kind != "infer" and index % 2) \
                else "saxpy"
            method, path, body = "POST", f"/v2/models/{model}/infer", _SAXPY
            if kind == "load":
                path, body = f"/v2/repository/models/{model}/load", b"{}"
            elif kind == "load-config":
                override = json.dumps({"function": "saxpy", "max_queue": 8})
                path = "/v2/repository/models/saxpy/load"
                body = json.dumps({"parameters": {"config": override}}).encode()
            elif kind == "unload":
                path, body = f"/v2/repository/models/{model}/unload", b""
            elif kind == "read":
                method, body = "GET", None
                path = ("/v2/repository/index", f"/v2/models/{model}/stats",
                        f"/v2/models/{model}", "/metrics")[step % 4]
                step += 1
            elif kind == "seq":
                sequence += step == 0
                body = json.dumps({**_STEP, "parameters": {
                    "sequence_id": sequence if index % 2 else f"s{sequence}",
                    "sequence_start": step == 0, "sequence_end": step == 3}}).encode()
                step = (step + 1) % 4
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
                conn.request(method, path, body)
                response = conn.getresponse()
                payload = response.read()
            except (OSError, http.client.HTTPException) as exc:
                unexpected.append((kind, path, repr(exc)))
                conn = None
                continue
            statuses[(kind, response.status)] += 1
            error = json.loads(payload).get("error", "") if response.status >= 400 and \
                payload.startswith(b"{") else ""
            allowed = response.status == 200 or (
                response.status == 503 and "is not ready" in error) or (
                response.status == 400 and kind == "seq" and "START flag" in error) or (
                response.status == 404 and "loaded versions only" in error)  # stats
            if not allowed:
                unexpected.append((kind, path, response.status, error[:200]))
            if kind == "seq" and response.status != 200:
                step = 0  # start the next sequence
    try:
        server.start()
        kinds = ["load", "load", "load-config", "unload", "unload", "read", "read",
                 "infer", "infer", "seq", "seq"]
        threads = [threading.Thread(target=client, args=(kind, i))
                   for i, kind in enumerate(kinds)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not any(thread.is_alive() for thread in threads), "a client hung"
        assert unexpected == [], (unexpected[:10], statuses)
        assert statuses[("infer", 200)] and statuses[("seq", 200)], statuses
        for model in ("saxpy", "gru_step"):
            status, _, payload = server.request("POST", f"/v2/repository/models/{model}/load",
                                                b"{}")
            assert status == 200, payload
        status, _, payload = server.request("POST", "/v2/models/saxpy/infer", _SAXPY)
        assert status == 200 and json.loads(payload)["outputs"][0]["data"] == [3.0] * 4
        assert "Traceback" not in "".join(server.stderr)
    finally:
        server.stop()


def test_a_repository_gone_under_a_poll_keeps_the_models_and_logs_once(tmp_path):
    """The operator moves the repository away and back: the loaded models serve
    throughout, the poll says once that it cannot read the repository (not once per
    poll) and once that it can again."""
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copytree(SAMPLES / "saxpy", root / "saxpy")
    server = ServerProcess("--model-repository", str(root), "--model-control-mode", "poll",
                           "--repository-poll-secs", "0.2")
    try:
        server.start()
        root.rename(tmp_path / "moved")
        server.wait_stderr("cannot read the model repository")
        time.sleep(2)  # some ten polls
        status, _, payload = server.request("POST", "/v2/models/saxpy/infer", _SAXPY)
        assert status == 200, payload
        (tmp_path / "moved").rename(root)
        log = server.wait_stderr("can be read again")
        assert log.count("cannot read the model repository") == 1, log[-2000:]
        status, _, payload = server.request("GET", "/v2/repository/index")
        assert json.loads(payload) == [{"name": "saxpy", "version": "1", "state": "READY"}]
    finally:
        server.stop()

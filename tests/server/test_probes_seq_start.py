"""Probes of start-up and readiness after Triton's L0_lifecycle tests
(server/main.py, repository.py): a model directory with a config and no version at
start is a failure, as Triton's test_parse_error_model_no_version (exit 1 with
`--exit-on-error`; with `--no-exit-on-error` the others serve and the server is not
ready until that model loads, is unloaded or leaves); one found so by a later poll is
a directory being filled and changes nothing; a failed explicit load keeps the server
from being ready until it is unloaded. Server children, each bounded."""

from __future__ import annotations

import json
import shutil
import signal
import time

import pytest
from serve_helpers import SAMPLES, ServerProcess

pytestmark = pytest.mark.timeout(120)

_BODY = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16],
                     "data": [0.5] * 16}]}


def _no_version(root, name: str = "empty") -> None:
    (root / name).mkdir()
    shutil.copyfile(SAMPLES / "mlp_classifier" / "config.json", root / name / "config.json")


def _ready(server: ServerProcess) -> int:
    return server.request("GET", "/v2/health/ready")[0]


def _wait(what: str, condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.05)


def test_a_model_without_a_version_at_start_exits_1(tmp_path):
    shutil.copytree(SAMPLES / "mlp_classifier", tmp_path / "mlp")
    _no_version(tmp_path)
    server = ServerProcess("--model-repository", str(tmp_path))
    try:
        assert server.wait(timeout=60) == 1
        assert "no version directory" in "".join(server.stderr)
    finally:
        server.stop()


def test_a_model_without_a_version_at_start_keeps_the_server_not_ready(tmp_path):
    """`--no-exit-on-error`, poll mode: the good model serves, the server is live but
    not ready while `empty` has no version; once a version appears and a poll loads it,
    the server is ready. A model directory that appears empty later is being filled:
    readiness stays."""
    shutil.copytree(SAMPLES / "mlp_classifier", tmp_path / "mlp")
    _no_version(tmp_path)
    server = ServerProcess("--model-repository", str(tmp_path), "--no-exit-on-error",
                           "--model-control-mode", "poll", "--repository-poll-secs", "3600")
    try:
        server.start()
        assert server.request("GET", "/v2/health/live")[0] == 200
        assert _ready(server) == 503
        assert server.request("POST", "/v2/models/mlp/infer", _BODY)[0] == 200
        index = json.loads(server.request("POST", "/v2/repository/index", b"")[2])
        entry = next(e for e in index if e["name"] == "empty")
        assert entry["state"] == "UNAVAILABLE" and "no version" in entry["reason"], entry
        shutil.copytree(SAMPLES / "mlp_classifier" / "1", tmp_path / "empty" / "1")
        server.proc.send_signal(signal.SIGHUP)
        _wait("ready once the model loaded", lambda: _ready(server) == 200)
        _no_version(tmp_path, "filling")  # a later poll finds it empty: being copied in
        server.proc.send_signal(signal.SIGHUP)
        server.wait_stderr("model filling: no version directory", timeout=30)
        assert _ready(server) == 200
    finally:
        server.stop()


def test_a_failed_explicit_load_keeps_the_server_not_ready_until_unloaded(tmp_path):
    """As Triton's strict readiness: a model whose load failed (its version policy
    selects none of its versions) is UNAVAILABLE, so the server is not ready; unloading
    it makes the server ready again."""
    shutil.copytree(SAMPLES / "mlp_classifier", tmp_path / "mlp")
    shutil.copytree(SAMPLES / "mlp_classifier", tmp_path / "bad")
    config = json.loads((SAMPLES / "mlp_classifier" / "config.json").read_text())
    config["version_policy"] = {"specific": {"versions": [7]}}
    (tmp_path / "bad" / "config.json").write_text(json.dumps(config))
    server = ServerProcess("--model-repository", str(tmp_path), "--model-control-mode",
                           "explicit", "--load-model", "mlp")
    try:
        server.start()
        assert _ready(server) == 200  # `bad` was not asked for: nothing failed
        status, _, body = server.request("POST", "/v2/repository/models/bad/load", b"")
        assert status == 400 and b"at least one version must be available" in body, body
        assert _ready(server) == 503
        assert server.request("POST", "/v2/models/mlp/infer", _BODY)[0] == 200
        assert server.request("POST", "/v2/repository/models/bad/unload", b"")[0] == 200
        assert _ready(server) == 200
    finally:
        server.stop()


def test_a_serving_model_a_poll_cannot_read_again_keeps_the_server_ready(tmp_path):
    """Its config.json turns into a version policy that selects none of its versions:
    the poll logs why and the version that served keeps serving, so the server stays
    ready (its versions decide, as for a failed reload)."""
    shutil.copytree(SAMPLES / "mlp_classifier", tmp_path / "mlp")
    server = ServerProcess("--model-repository", str(tmp_path), "--model-control-mode",
                           "poll", "--repository-poll-secs", "3600")
    try:
        server.start()
        config = json.loads((SAMPLES / "mlp_classifier" / "config.json").read_text())
        config["version_policy"] = {"specific": {"versions": [7]}}
        (tmp_path / "mlp" / "config.json").write_text(json.dumps(config))
        server.proc.send_signal(signal.SIGHUP)
        server.wait_stderr("at least one version must be available", timeout=30)
        assert _ready(server) == 200
        assert server.request("POST", "/v2/models/mlp/infer", _BODY)[0] == 200
    finally:
        server.stop()

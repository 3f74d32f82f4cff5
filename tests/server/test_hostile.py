"""tinyhal-serve survives its clients: a gzip bomb, a 64 MB header, 2,000 slowloris
sockets and stalled uploads are each bounded in memory and time while health keeps
answering; `Expect: 100-continue` with a too-large length is refused at once; every bad
shape is a 400; control modes and the restricted API (with tritonclient); errors name no
other model and no absolute path. Every server is a child process; every wait is
bounded."""

from __future__ import annotations

import gzip
import json
import resource
import shutil
import socket
import threading
import time

import pytest
import tritonclient.http as httpclient
from serve_helpers import SAMPLES, HealthWatch, ServerProcess, sample_server
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.timeout(300)

MB = 1 << 20


def _rss(server: ServerProcess) -> int:
    with open(f"/proc/{server.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")




@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory):
    with sample_server(tmp_path_factory.mktemp("hostile"), ("mlp_classifier", "saxpy"),
                       "--max-request-bytes", str(8 * MB), "--request-head-timeout", "3",
                       "--request-body-timeout", "2", "--max-connections", "500") as server:
        yield server


def _raw(server: ServerProcess, data: bytes, timeout: float = 30) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
        except OSError:
            pass
        chunks = []
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except OSError:
            pass
        return b"".join(chunks)


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else -1


def test_gzip_bomb_is_refused_while_inflating(hostile_server):
    server = hostile_server
    row = b"[" + b"0.0," * 15 + b"0.0]"
    bomb = gzip.compress(b'{"inputs":[{"name":"features","datatype":"FP32","shape":[1,16],'
                         b'"data":[' + b",".join([row] * (60 * MB // len(row))) + b"]}]}",
                         compresslevel=9)
    assert len(bomb) < MB
    before = _rss(server)
    watch = HealthWatch(server)
    results: list[int] = []

    def send() -> None:
        status, _, body = server.request(
            "POST", "/v2/models/mlp_classifier/infer", bomb,
            {"Content-Encoding": "gzip", "Content-Type": "application/json"}, timeout=60)
        results.append(status)

    threads = [threading.Thread(target=send) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    watch.stop()
    assert results == [413] * 4
    assert _rss(server) - before < 100 * MB


def test_large_bodies_parse_off_the_loop(hostile_server):
    """Four 7 MB JSON bodies at once (under the limit; refused for their batch size once
    parsed) while health keeps answering and memory comes back."""
    server = hostile_server
    rows = 7 * MB // 112  # "0.125, " is 7 bytes a value, 16 a row
    body = json.dumps({"inputs": [{"name": "features", "datatype": "FP32",
                                   "shape": [rows, 16], "data": [0.125] * (rows * 16)}]}
                      ).encode()
    assert 6 * MB < len(body) < 8 * MB
    before = _rss(server)
    watch = HealthWatch(server)
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(server.request(
        "POST", "/v2/models/mlp_classifier/infer", body, timeout=120)[0]))
        for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    watch.stop()
    assert results == [400] * 4  # over max_batch_size: a 400 after the parse
    assert _rss(server) - before < 100 * MB


def test_huge_header_is_refused_while_it_arrives(hostile_server):
    server = hostile_server
    before = _rss(server)
    watch = HealthWatch(server)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: ")
        sent = 0
        try:
            while sent < 64 * MB:
                sock.sendall(b"a" * MB)
                sent += MB
        except OSError:
            pass  # the server answered and closed long before 64 MB
        answer = sock.recv(65536)
    watch.stop()
    assert _status(answer) == 431 and sent < 64 * MB
    assert _rss(server) - before < 50 * MB


def test_slowloris_sockets_neither_starve_clients_nor_grow_memory(hostile_server):
    server = hostile_server
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    before = _rss(server)
    watch = HealthWatch(server)
    sockets = []
    try:
        for _ in range(2000):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")  # never ends
            sockets.append(sock)
        time.sleep(1.0)
        assert server.request("GET", "/v2/health/live", timeout=10)[0] == 200
    finally:
        for sock in sockets:
            sock.close()
    watch.stop()
    assert _rss(server) - before < 100 * MB
    assert "--max-connections" in "".join(server.stderr)


def test_slowloris_at_a_256_descriptor_limit_leaves_health_answering(tmp_path):
    shutil.copytree(SAMPLES / "saxpy", tmp_path / "saxpy")
    server = ServerProcess("--model-repository", str(tmp_path), open_files=256).start()
    sockets = []
    try:
        for _ in range(600):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
            sockets.append(sock)
        watch = HealthWatch(server)
        time.sleep(1.0)
        watch.stop()
        assert "--max-connections lowered" in "".join(server.stderr)
    finally:
        for sock in sockets:
            sock.close()
        server.stop()


def test_stalled_uploads_get_408_and_free_their_memory(hostile_server):
    server = hostile_server
    before = _rss(server)
    watch = HealthWatch(server)
    socks = []
    for _ in range(6):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        sock.sendall(b"POST /v2/models/mlp_classifier/infer HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 8000000\r\n\r\n"
                     + b" " * (6 * MB))
        socks.append(sock)
    answers = []
    for sock in socks:  # then nothing more: each stalls
        answers.append(sock.recv(65536))
        sock.close()
    watch.stop()
    assert [_status(a) for a in answers] == [408] * 6
    assert _rss(server) - before < 100 * MB


def test_expect_continue_with_too_large_length_is_413_at_once(hostile_server):
    answer = _raw(hostile_server, b"POST /v2/models/mlp_classifier/infer HTTP/1.1\r\n"
                                  b"Host: x\r\nContent-Length: 999999999\r\n"
                                  b"Expect: 100-continue\r\n\r\n")
    assert _status(answer) == 413 and b"100 Continue" not in answer


def test_every_bad_shape_is_a_400_and_errors_name_no_other_model(hostile_server):
    server = hostile_server
    for shape in ([1] * 65, [1] * 33, [-1, 16], [2 ** 62, 2 ** 62], [1, 15], "x"):
        status, _, body = server.request("POST", "/v2/models/mlp_classifier/infer", {
            "inputs": [{"name": "features", "datatype": "FP32", "shape": shape,
                        "data": [0.0] * 16}]})
        assert status == 400, (shape, body)
    status, _, body = server.request("GET", "/v2/models/nope")
    assert status == 404 and b"saxpy" not in body and b"mlp" not in body
    status, _, body = server.request("POST", "/v2/models/nope/infer", b"{}")
    assert status == 404 and b"saxpy" not in body


def test_control_mode_none_refuses_load_and_unload(hostile_server):
    client = httpclient.InferenceServerClient(hostile_server.url)
    try:
        for call in (client.load_model, client.unload_model):
            with pytest.raises(InferenceServerException) as info:
                call("saxpy")
            assert info.value.status() == "403"
            assert "--model-control-mode" in info.value.message()
        names = {m["name"] for m in client.get_model_repository_index()}
        assert names == {"mlp_classifier", "saxpy"}
        assert client.is_model_ready("saxpy")
    finally:
        client.close()


def test_restricted_api_and_explicit_control(tmp_path):
    shutil.copytree(SAMPLES / "saxpy", tmp_path / "saxpy")
    server = ServerProcess("--model-repository", str(tmp_path), "--model-control-mode",
                           "explicit", "--load-model", "*", "--http-restricted-api",
                           "model-repository,statistics:x-admin-key=s3cret").start()
    client = httpclient.InferenceServerClient(server.url)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.unload_model("saxpy")
        assert info.value.status() == "403" and "x-admin-key" in info.value.message()
        with pytest.raises(InferenceServerException) as info:
            client.get_inference_statistics("saxpy")
        assert info.value.status() == "403"
        assert client.is_server_live() and client.is_model_ready("saxpy")
        headers = {"x-admin-key": "s3cret"}
        client.unload_model("saxpy", headers=headers)
        assert not client.is_model_ready("saxpy")
        client.load_model("saxpy", headers=headers)
        assert client.is_model_ready("saxpy")
        assert client.get_inference_statistics("saxpy", headers=headers)["model_stats"]
    finally:
        client.close()
        server.stop()


def test_poll_mode_picks_up_new_and_changed_models(tmp_path):
    shutil.copytree(SAMPLES / "saxpy", tmp_path / "saxpy")
    server = ServerProcess("--model-repository", str(tmp_path), "--model-control-mode",
                           "poll", "--repository-poll-secs", "0.2").start()
    client = httpclient.InferenceServerClient(server.url)
    try:
        with pytest.raises(InferenceServerException):
            client.load_model("saxpy")  # poll mode: no explicit control
        shutil.copytree(SAMPLES / "mlp_classifier", tmp_path / "mlp_classifier")
        shutil.copytree(tmp_path / "saxpy" / "1", tmp_path / "saxpy" / "2")
        deadline = time.monotonic() + 30
        while not (client.is_model_ready("mlp_classifier") and
                   client.get_model_metadata("saxpy")["versions"] == ["2"]):
            assert time.monotonic() < deadline, client.get_model_repository_index()
            time.sleep(0.1)
        shutil.rmtree(tmp_path / "mlp_classifier")
        while "mlp_classifier" in {m["name"] for m in client.get_model_repository_index()
                                   if m["state"] == "READY"}:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        client.close()
        server.stop()

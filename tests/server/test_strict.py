"""Strict request handling and operator-friendly start-up: every bad request gets a 4xx
with a JSON error naming what is wrong, and the server keeps serving."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import struct
import subprocess
import sys

import pytest
from serve_helpers import SAMPLES

pytestmark = pytest.mark.timeout(120)


def _features(rows, **extra):
    return {"inputs": [{"name": "features", "datatype": "FP32", "shape": [len(rows), 16],
                        "data": rows}], **extra}


_ROW = [0.5] * 16

BAD = [
    ("nested 1000 deep", b'{"inputs": ' + b"[" * 1000 + b"]" * 1000 + b"}", {},
     "nested deeper than 400"),
    ("nested 450 deep", b'{"inputs": [{"name": "features", "parameters": {"p": ' +
     b"[" * 450 + b"]" * 450 + b"}}]}", {}, "nested deeper than 400"),
    ("ragged", _features([_ROW, _ROW[:15]]), {}, "ragged"),
    ("nested unlike shape", _features([[[0.5]] * 16]), {}, ""),
    ("bool as FP32", _features([[True] + _ROW[1:]]), {}, "must hold numbers"),
    ("string as FP32", _features([["1"] + _ROW[1:]]), {}, "must hold numbers"),
    ("1e300 as FP32", _features([[1e300] + _ROW[1:]]), {}, "does not fit FP32"),
    ("huge int as FP32", b'{"inputs": [{"name": "features", "datatype": "FP32", '
     b'"shape": [1, 16], "data": [' + b"1" * 400 + b"," + b"0," * 14 + b"0]}]}", {},
     "not valid JSON"),
    ("NaN literal", b'{"inputs": [{"name": "features", "datatype": "FP32", '
     b'"shape": [1, 1], "data": [NaN]}]}', {}, "not valid JSON"),
    ("5000-digit int", b'{"inputs": [{"name": "features", "datatype": "FP32", '
     b'"shape": [1, 1], "data": [' + b"1" * 5000 + b"]}]}", {}, "not valid JSON"),
    ("binary_data_output yes", _features([_ROW], parameters={"binary_data_output": "yes"}),
     {}, "'binary_data_output' must be true or false"),
    ("binary_data 1", _features([_ROW], outputs=[{"name": "class",
                                                   "parameters": {"binary_data": 1}}]),
     {}, "'binary_data' must be true or false"),
    ("element count overflow", {"inputs": [{"name": "features", "datatype": "FP32",
                                            "shape": [2**40, 2**40], "data": []}]}, {},
     "64-bit count"),
    ("negative dim", {"inputs": [{"name": "features", "datatype": "FP32",
                                  "shape": [-1, 16], "data": []}]}, {}, "negative dimension"),
    ("header length 0", json.dumps(_features([_ROW])).encode(),
     {"Inference-Header-Content-Length": "0"}, "must be in (0,"),
    ("scalar data", {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16],
                                 "data": 5}]}, {}, "must be a list"),
]


@pytest.mark.parametrize("body,headers,message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_requests_get_400_and_the_server_keeps_serving(server, body, headers, message):
    status, _, payload = server.request("POST", "/v2/models/mlp_classifier/infer", body,
                                        headers)
    error = json.loads(payload)["error"]
    assert status == 400, error
    assert message in error, error
    status, _, payload = server.request("POST", "/v2/models/mlp_classifier/infer",
                                        _features([_ROW]))
    assert status == 200, payload


def _raw(server, data: bytes) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    response = b"".join(chunks)
    status = int(response.split(b" ", 2)[1])
    return status, response.split(b"\r\n\r\n", 1)[1]


def test_chunked_bodies(server):
    body = json.dumps(_features([_ROW, _ROW])).encode()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("POST", "/v2/models/mlp_classifier/infer",
                     iter([body[:10], body[10:100], body[100:]]),
                     {"Transfer-Encoding": "chunked", "Content-Type": "application/json"},
                     encode_chunked=True)
        response = conn.getresponse()
        assert response.status == 200
        assert json.loads(response.read())["outputs"][0]["shape"] == [2, 4]
    finally:
        conn.close()
    # a broken chunk size: 400 with a JSON error, and the connection closes
    status, payload = _raw(server, b"POST /v2/models/mlp_classifier/infer HTTP/1.1\r\n"
                                   b"Host: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                                   b"zz\r\n{}\r\n0\r\n\r\n")
    assert status == 400 and "error" in json.loads(payload)
    status, _, _ = server.request("GET", "/v2/health/live")
    assert status == 200


def test_readiness_with_no_model_is_not_ready(tmp_path, start_server):
    server = start_server("--model-repository", str(tmp_path))
    status, _, body = server.request("GET", "/v2/health/ready")
    assert status == 503 and json.loads(body) == {"ready": False}
    assert "tinyhal-serve: serving no models (not ready)" in "".join(server.stdout)
    status, _, _ = server.request("GET", "/v2/health/live")
    assert status == 200


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tinyhal.server.main", *args],
                          capture_output=True, text=True, timeout=60)


def test_port_in_use_and_out_of_range_are_one_line_errors(server):
    proc = _cli("--host", "127.0.0.1", "--port", str(server.port))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"cannot listen on 127.0.0.1 port {server.port}" in lines[0], \
        proc.stderr
    assert "in use" in lines[0]
    for port in ("70000", "-1"):
        proc = _cli("--port", port)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and "out of range" in lines[0], \
            proc.stderr


def test_unreadable_repository_is_a_one_line_error(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    proc = _cli("--port", "0", "--model-repository", str(not_a_dir))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "not a directory" in lines[0]


def test_start_up_logs_each_model_and_warns_about_a_missing_model_vmfb(tmp_path,
                                                                       start_server):
    shutil.copytree(SAMPLES / "saxpy", tmp_path / "saxpy")
    (tmp_path / "saxpy" / "2").mkdir()
    (tmp_path / "saxpy" / "2" / "saxpy.vmfb").write_bytes(b"x")
    server = start_server("--model-repository", str(tmp_path))
    err = server.wait_stderr(r"loaded model saxpy version 1")
    assert "model saxpy version 2: no model.vmfb" in err and "saxpy.vmfb" in err, err
    assert "loading model saxpy version 1" in err
    assert "loaded model saxpy version 1" in err


def test_http_edges_pipelining_continue_http10_head(server):
    body = json.dumps(_features([_ROW])).encode()
    post = (b"POST /v2/models/mlp_classifier/infer HTTP/1.1\r\nHost: x\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body
    # two pipelined requests, then one that closes: three answers in order, then EOF
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(post + post + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n"
                     b"Connection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.count(b"HTTP/1.1 200 OK") == 3 and data.endswith(b'{"live":true}')
    # Expect: 100-continue gets its interim answer before the body is sent
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(post.split(b"\r\n\r\n")[0].replace(b"Host: x", b"Host: x\r\nExpect: "
                                                        b"100-continue") + b"\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(body)
        assert b"HTTP/1.1 200 OK" in sock.recv(65536)
    # HTTP/1.0 without keep-alive: answered, then closed; HEAD: headers only
    status, payload = _raw(server, b"GET /v2/health/live HTTP/1.0\r\n\r\n")
    assert status == 200 and json.loads(payload) == {"live": True}
    status, payload = _raw(server, b"HEAD /v2/health/live HTTP/1.1\r\nHost: x\r\n"
                                   b"Connection: close\r\n\r\n")
    assert status == 405 and payload == b""
    # garbage and an oversized head: 400 with a JSON error
    status, payload = _raw(server, b"NOT HTTP AT ALL\r\n\r\n")
    assert status == 400 and "malformed HTTP request" in json.loads(payload)["error"]
    status, payload = _raw(server, b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Big: " +
                           b"a" * (70 << 10) + b"\r\n\r\n")
    assert status == 431 and "error" in json.loads(payload)
    status, _, _ = server.request("GET", "/v2/health/live")
    assert status == 200


def test_a_binary_header_is_checked_against_each_model_that_receives_it(server):
    """The server keeps a header it has checked (clients repeat theirs): the same bytes
    are accepted again by the model that accepted them, and still refused by another
    model, and a refused header stays refused."""
    head = json.dumps({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16],
                                   "parameters": {"binary_data_size": 64}}]}).encode()
    bad = head.replace(b"[1, 16]", b"[16, 1]")
    length = {"Inference-Header-Content-Length": str(len(head))}
    for value in (0.5, -0.5):
        status, _, payload = server.request("POST", "/v2/models/mlp_classifier/infer",
                                            head + struct.pack("<16f", *[value] * 16), length)
        assert status == 200, payload
        status, _, payload = server.request("POST", "/v2/models/saxpy/infer",
                                            head + bytes(64), length)
        assert status == 400 and b"unexpected inference input 'features'" in payload, payload
        status, _, payload = server.request("POST", "/v2/models/mlp_classifier/infer",
                                            bad + bytes(64), length)
        assert status == 400 and b"got [16,1]" in payload, payload

"""Probes of how a request may arrive and nest, against one server child: every byte
boundary a TCP segment can cut a request at (head, Content-Length body, chunk sizes and
CRLFs), pipelined POSTs with a body-less GET between them, `Expect: 100-continue`, and
JSON nested past the bound in each endpoint that reads a body. Each is answered as if
the request had come whole, or 400 naming what is wrong; the server keeps serving."""

from __future__ import annotations

import json
import socket

import pytest
from serve_helpers import ServerProcess, receive_until, sample_server

pytestmark = pytest.mark.timeout(180)

_BODY = json.dumps({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16],
                                "data": [0.5] * 16}]}).encode()
_INFER = b"POST /v2/models/mlp_classifier/infer HTTP/1.1\r\nHost: x\r\n"
_CLOSE = b"Connection: close\r\n"


@pytest.fixture(scope="module")
def split_server(tmp_path_factory):
    with sample_server(tmp_path_factory.mktemp("repo"), ("mlp_classifier",),
                       "--model-control-mode", "explicit", "--load-model", "*") as server:
        yield server


def _send_in_parts(server: ServerProcess, parts: list[bytes]) -> bytes:
    """Sends each part as its own segment (TCP_NODELAY) and reads until the server
    closes."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for part in parts:
            sock.sendall(part)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def _answers(response: bytes) -> list[tuple[int, bytes]]:
    """(status, body) of each answer on a connection (Content-Length framed)."""
    out = []
    while response:
        head, rest = response.split(b"\r\n\r\n", 1)
        status = int(head.split(b" ", 2)[1])
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:]
                       if line.lower().startswith(b"content-length:")), 0)
        out.append((status, rest[:length]))
        response = rest[length:]
    return out


def test_a_request_cut_at_every_byte_is_answered_as_if_whole(split_server):
    plain = _INFER + b"Content-Length: %d\r\n" % len(_BODY) + _CLOSE + b"\r\n" + _BODY
    chunked = (_INFER + b"Transfer-Encoding: chunked\r\n" + _CLOSE + b"\r\n" +
               b"%x;ext=1\r\n" % 40 + _BODY[:40] + b"\r\n" +
               b"%x\r\n" % (len(_BODY) - 40) + _BODY[40:] + b"\r\n0\r\n\r\n")
    want = _answers(_send_in_parts(split_server, [plain]))
    assert [s for s, _ in want] == [200]
    for request in (plain, chunked):
        for cut in range(1, len(request)):
            got = _answers(_send_in_parts(split_server, [request[:cut], request[cut:]]))
            assert got == want, (cut, request[:cut][-20:], got)
    # and a byte at a time
    assert _answers(_send_in_parts(split_server, [bytes([b]) for b in chunked])) == want


def test_pipelined_posts_with_a_get_between_are_answered_in_order(split_server):
    post = _INFER + b"Content-Length: %d\r\n\r\n" % len(_BODY) + _BODY
    get = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
    meta = b"GET /v2/models/mlp_classifier HTTP/1.1\r\nHost: x\r\n\r\n"
    last = _INFER + b"Content-Length: %d\r\n" % len(_BODY) + _CLOSE + b"\r\n" + _BODY
    stream = post + get + post + meta + get + last
    for parts in ([stream], [stream[i:i + 7] for i in range(0, len(stream), 7)]):
        answers = _answers(_send_in_parts(split_server, parts))
        assert [s for s, _ in answers] == [200] * 6
        assert [json.loads(b).get("ready") for _, b in answers] == \
            [None, True, None, None, True, None]
        assert json.loads(answers[3][1])["name"] == "mlp_classifier"
        assert answers[0][1] == answers[2][1] == answers[5][1]  # the same inference


def test_expect_100_continue_gets_its_interim_answer_before_the_body(split_server):
    with socket.create_connection(("127.0.0.1", split_server.port), timeout=30) as sock:
        sock.sendall(_INFER + b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n"
                     % len(_BODY))
        interim = sock.recv(65536)  # the server must not wait for the body first
        assert interim.startswith(b"HTTP/1.1 100 Continue\r\n"), interim
        sock.sendall(_BODY)
        answer = receive_until(sock, b'"outputs"')
    assert answer.startswith(b"HTTP/1.1 200"), answer[:100]


_DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("path,body,message", [
    ("/v2/models/mlp_classifier/infer", '{"inputs": [{"name": "features", "datatype": '
     '"FP32", "shape": [1, 16], "data": %s}]}' % _DEEP, "nested deeper than"),
    ("/v2/models/mlp_classifier/infer", '{"inputs": [], "parameters": {"x": %s}}' % _DEEP,
     "nested deeper than"),
    ("/v2/models/mlp_classifier/infer", _DEEP, "nested deeper than"),
    ("/v2/repository/index", '{"ready": %s}' % _DEEP,
     "Invalid value for 'ready': expected a boolean"),
    ("/v2/repository/models/mlp_classifier/unload",
     '{"parameters": {"unload_dependents": %s}}' % _DEEP, "not valid JSON"),
    ("/v2/repository/models/mlp_classifier/load", '{"parameters": %s}' % _DEEP,
     "not valid JSON"),
    ("/v2/repository/models/mlp_classifier/load",
     '{"parameters": {"config": %s}}' % json.dumps("[" * 100_000), "not valid JSON"),
], ids=["tensor data", "request parameter", "whole body", "index", "unload", "load",
        "load config"])
def test_json_nested_past_the_bound_is_400_in_every_endpoint(split_server, path, body,
                                                             message):
    status, _, payload = split_server.request("POST", path, body.encode())
    assert status == 400 and message in json.loads(payload)["error"], payload
    status, _, payload = split_server.request("POST", "/v2/models/mlp_classifier/infer",
                                              _BODY)
    assert status == 200, payload


@pytest.mark.parametrize("ready", ["[true]", "1", '"true"', "null", "{}",
                                   "[" * 250_000 + "true" + "]" * 250_000])
def test_index_ready_that_is_not_a_boolean_is_400_in_tritons_words(split_server, ready):
    """Triton's L0_http sends `ready` nested 250,000 deep and reads these words."""
    status, _, payload = split_server.request("POST", "/v2/repository/index",
                                              ('{"ready": %s}' % ready).encode())
    assert status == 400, payload
    assert "Invalid value for 'ready': expected a boolean" in json.loads(payload)["error"]

"""Probes of the HTTP framing a hostile client controls, against one server child: chunked
bodies (trailer floods, many tiny chunks, more chunks than Triton takes, transfer codings
other than chunked) and the request-smuggling and malformed-head classics. Every answer is
a 4xx with a JSON error naming what was wrong, what the server held for the client goes
back, and health keeps answering."""

from __future__ import annotations

import json
import socket
import time

import pytest
from serve_helpers import (
    ServerProcess,
    exchange,
    receive_until,
    sample_server,
    status_and_error,
)

pytestmark = pytest.mark.timeout(180)

_ROW = [0.5] * 16
_BODY = json.dumps({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16],
                                "data": _ROW}]}).encode()
_INFER = b"POST /v2/models/mlp_classifier/infer HTTP/1.1\r\nHost: x\r\n"


@pytest.fixture(scope="module")
def http_server(tmp_path_factory):
    with sample_server(tmp_path_factory.mktemp("repo"), ("mlp_classifier",)) as server:
        yield server


def _chunked(*chunks: bytes, trailer: bytes = b"") -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n" + trailer + \
        b"\r\n"


def _assert_healthy(server: ServerProcess) -> None:
    status, _, _ = server.request("GET", "/v2/health/live", timeout=30)
    assert status == 200
    status, _, payload = server.request("POST", "/v2/models/mlp_classifier/infer", _BODY)
    assert status == 200, payload


# (probe, bytes sent, status, part of the error)
_FRAMING = [
    ("transfer coding gzip then chunked",
     _INFER + b"Transfer-Encoding: gzip, chunked\r\n\r\n" + _chunked(_BODY), 400,
     "Transfer-Encoding 'gzip, chunked' is not supported"),
    ("transfer coding identity", _INFER + b"Transfer-Encoding: identity\r\n\r\n" + _BODY,
     400, "Transfer-Encoding"),
    ("Content-Length and Transfer-Encoding",
     _INFER + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(_BODY),
     400, "malformed HTTP request"),
    ("two Content-Lengths", _INFER + b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
     % (len(_BODY), len(_BODY)) + _BODY, 400, "Duplicate Content-Length"),
    ("negative Content-Length", _INFER + b"Content-Length: -1\r\n\r\n", 400,
     "Content-Length"),
    ("Content-Length beyond 64 bits", _INFER + b"Content-Length: " + b"9" * 30 + b"\r\n\r\n",
     400, "Content-Length"),
    ("obsolete line folding", b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n",
     400, "malformed HTTP request"),
    ("bare line feeds", b"GET /v2/health/live HTTP/1.1\nHost: x\n\n", 400,
     "malformed HTTP request"),
    ("NUL in a header value", b"GET /v2/health/live HTTP/1.1\r\nHost: a\x00b\r\n\r\n", 400,
     "malformed HTTP request"),
    ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400, ""),
    ("h2c upgrade", b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
     b"Upgrade: h2c\r\n\r\n", 400, "protocol upgrades are not supported"),
    ("10,000 headers", b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" +
     b"".join(b"X-%d: a\r\n" % i for i in range(10_000)) + b"\r\n", 431,
     "request head exceeds"),
    ("a chunk size of 2**64 - 1", _INFER + b"Transfer-Encoding: chunked\r\n\r\n" +
     b"f" * 17 + b"\r\nabc", 400, "malformed HTTP request"),
]


@pytest.mark.parametrize("data,status,message", [p[1:] for p in _FRAMING],
                         ids=[p[0] for p in _FRAMING])
def test_framing_probes_are_4xx_naming_the_problem(http_server, data, status, message):
    got, error = status_and_error(exchange(http_server, data))
    assert got == status and message in error, (got, error)
    _assert_healthy(http_server)


def test_a_trailer_flood_is_431_and_holds_no_memory(http_server):
    """Trailer fields were kept without a bound (192 MB of them took 200 MB of RSS):
    they count against the head's 64 KiB now, and nothing of them is kept."""
    before = http_server.settled_rss(0.5)
    line = b"X-T: " + b"b" * 1000 + b"\r\n"
    with socket.create_connection(("127.0.0.1", http_server.port), timeout=30) as sock:
        sock.sendall(_INFER + b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % len(_BODY)
                     + _BODY + b"\r\n0\r\n")
        sent = 0
        try:
            while sent < 64 << 20:
                sock.sendall(line * 1000)
                sent += len(line) * 1000
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    assert sent < 16 << 20, f"the server took {sent >> 20} MB of trailer fields"
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    assert http_server.settled_rss(0.5) - before < 16 << 20
    _assert_healthy(http_server)


def test_a_body_of_65537_chunks_is_400_and_the_client_reads_why(http_server):
    """Triton's bound (its L0_http many-chunks test): 65,536 non-empty chunks are a
    request like any other, one more is a 400 naming the bound, sent before the
    connection closes, and a million of them cost the server no more."""
    head = _INFER + b"Transfer-Encoding: chunked\r\n\r\n"
    status, error = status_and_error(exchange(http_server, head + b"1\r\n \r\n" * 65536
                                                + b"0\r\n\r\n"))
    assert status == 400 and "not valid JSON" in error, error  # 64 KiB of spaces
    for count in (65537, 1_000_000):
        status, error = status_and_error(exchange(http_server, head + b"1\r\n \r\n" * count
                                                    + b"0\r\n\r\n"))
        assert status == 400 and "exceeds 65536 chunks" in error, error
    _assert_healthy(http_server)


def test_small_bodies_in_tiny_chunks_cost_about_their_size(http_server):
    """A body under 64 KiB is not charged to the memory budget: one per connection,
    --max-connections bounds them. Sent in 2-byte chunks it was kept as one bytes object
    per chunk, ~1 MB of server memory per 64 KB body (200 such connections: +212 MB).
    Now the pieces are joined as they come."""
    before = http_server.settled_rss(0.5)
    socks = []
    try:
        for _ in range(200):
            sock = socket.create_connection(("127.0.0.1", http_server.port), timeout=30)
            socks.append(sock)
            sock.sendall(_INFER + b"Transfer-Encoding: chunked\r\n\r\n" +
                         b"2\r\n  \r\n" * 32_000)  # 64,000 bytes, never finished
        # every body was read: a request on each connection's heels is answered
        _assert_healthy(http_server)
        deadline = time.monotonic() + 30
        while True:
            held = http_server.rss() - before
            if held < 60 << 20 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert held < 60 << 20, f"200 pending 64 KB bodies hold {held >> 20} MB"
    finally:
        for sock in socks:
            sock.close()
    _assert_healthy(http_server)


def test_a_pipelined_request_is_answered_while_the_next_body_stalls(http_server):
    post = _INFER + b"Content-Length: %d\r\n\r\n" % len(_BODY)
    with socket.create_connection(("127.0.0.1", http_server.port), timeout=30) as sock:
        sock.sendall(post + _BODY + post + _BODY[:10])
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200"), first[:100]
        sock.sendall(_BODY[10:])
        second = receive_until(sock, b'"outputs"')
        assert second.startswith(b"HTTP/1.1 200"), second[:100]


def test_a_body_in_small_chunks_across_the_64_kib_threshold_arrives_whole(http_server):
    """Pieces joined below 64 KiB, then charged and grown past it: the bytes the model
    sees are the bytes sent, in order (a 64-row request of ~120 KB in 97-byte chunks)."""
    rows = [[(r * 16 + c) / 1024 for c in range(16)] for r in range(64)]
    body = json.dumps({"inputs": [{"name": "features", "datatype": "FP32",
                                   "shape": [64, 16], "data": rows}]}).encode()
    body = body.replace(b", ", b"," + b" " * 100)  # past 64 KiB
    assert len(body) > 96 << 10
    chunks = [body[i:i + 97] for i in range(0, len(body), 97)]
    response = exchange(http_server, _INFER + b"Transfer-Encoding: chunked\r\n"
                         b"Connection: close\r\n\r\n" + _chunked(*chunks))
    assert response.startswith(b"HTTP/1.1 200"), response[:300]
    chunked = json.loads(response.split(b"\r\n\r\n", 1)[1])
    status, _, payload = http_server.request("POST", "/v2/models/mlp_classifier/infer", body)
    assert status == 200 and json.loads(payload)["outputs"] == chunked["outputs"]


def _answer_while_open(sock: socket.socket) -> bytes:
    """What the server answers while the client keeps its connection open and sends
    nothing more (the answer must not wait for the body)."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(65536)
        if not chunk:
            break
        answer += chunk
    return answer


def test_a_chunk_declared_over_the_limit_is_413_when_its_size_line_arrives(http_server):
    """It was refused only once --max-request-bytes of its data had arrived. The size
    line alone, with or without the first bytes of its data, and after a first chunk
    that fit, is answered now."""
    over = (64 << 20) + 1
    for sent in (b"%x\r\n" % over, b"%x\r\nabc" % over,
                 b"10\r\n" + b"a" * 16 + b"\r\n" + b"%x;ext=1\r\n" % (over - 16) + b"x" * 5):
        with socket.create_connection(("127.0.0.1", http_server.port), timeout=30) as sock:
            sock.sendall(_INFER + b"Transfer-Encoding: chunked\r\n\r\n" + sent)
            status, error = status_and_error(_answer_while_open(sock))
        assert status == 413 and "--max-request-bytes" in error, (sent[:20], error)
    # a size line split across reads, and a chunk that fits: served
    with socket.create_connection(("127.0.0.1", http_server.port), timeout=30) as sock:
        sock.sendall(_INFER + b"Transfer-Encoding: chunked\r\n\r\n" + b"%x" % len(_BODY))
        time.sleep(0.2)
        sock.sendall(b"\r\n" + _BODY[:5])
        time.sleep(0.2)
        sock.sendall(_BODY[5:] + b"\r\n0\r\n\r\n")
        answer = _answer_while_open(sock)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    _assert_healthy(http_server)


def _statuses(response: bytes) -> list[int]:
    return [int(part.split(b" ", 1)[0]) for part in response.split(b"HTTP/1.1 ")[1:]]


def test_pipelined_requests_before_a_malformed_one_are_answered_first(http_server):
    """A malformed request closes the connection with 400; the complete requests sent
    before it on the same connection were dropped unanswered."""
    post = _INFER + b"Content-Length: %d\r\n\r\n" % len(_BODY) + _BODY
    health = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    for sent, want in (
            (health + b"GARBAGE\r\n\r\n" + health, [200, 400]),
            (post + post + _INFER + b"Content-Length: -1\r\n\r\n" + post, [200, 200, 400]),
            (post + _INFER + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", [200, 400])):
        assert _statuses(exchange(http_server, sent)) == want
    _assert_healthy(http_server)


def test_targets_as_triton_routes_them(http_server):
    """The absolute form (RFC 9112 3.2.2: a server must accept it; libevhtp parses out
    its path) is served; a percent-encoded name is not decoded and HEAD is not GET, as
    in Triton's frontend (it matches the raw path and allows GET or POST only)."""
    absolute = (b"POST http://127.0.0.1:%d/v2/models/mlp_classifier/infer HTTP/1.1\r\n"
                b"Host: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                % (http_server.port, len(_BODY)) + _BODY)
    assert _statuses(exchange(http_server, absolute)) == [200]
    for target, status in ((b"/v2/models/mlp%5Fclassifier/infer", 404),
                           (b"/v2/models/mlp_classifier/versions/%31/infer", 404)):
        got, _ = status_and_error(exchange(http_server, b"POST " + target + b" HTTP/1.1\r\n"
                                             b"Host: x\r\nContent-Length: %d\r\nConnection: "
                                             b"close\r\n\r\n" % len(_BODY) + _BODY))
        assert got == status, target
    head = exchange(http_server, b"HEAD /v2/health/live HTTP/1.1\r\nHost: x\r\n"
                                  b"Connection: close\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 405") and b"allow: get" in head.lower(), head
    assert head.endswith(b"\r\n\r\n"), head  # no body to a HEAD

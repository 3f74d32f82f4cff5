"""Probes of the wire a hostile client or a peer's HTTP/1.1 and V2 tests control, against
one server child (the samples mlp_classifier and saxpy, and the `dtypes` test model with
one input per datatype): framing the other probe files do not send (Content-Length and
chunk-size spellings, header bytes, request-line versions, targets with fragments,
methods), HTTP/1.0 keep-alive, compressed bodies that end early or carry more, numeric
headers Python would read too loosely, version forms in every model endpoint, JSON
numbers at each datatype's edges on the small and the large (cut-out data) parse, empty
tensors of every datatype and the classification parameter. Each is the 2xx the
protocol gives or a 4xx/505 naming what was wrong, and the server keeps serving."""

from __future__ import annotations

import gzip
import json
import random
import shutil
import socket
import threading
import time
import zlib

import pytest
from serve_helpers import (
    SAMPLES,
    ServerProcess,
    exchange,
    status_and_error,
    write_model,
)

pytestmark = pytest.mark.timeout(180)

_MLP = b"/v2/models/mlp_classifier/infer"
_BODY = json.dumps({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16],
                                "data": [0.5] * 16}]}).encode()
_HEALTH = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
_V2 = {"b": "BOOL", "i8": "INT8", "i16": "INT16", "i32": "INT32", "i64": "INT64",
       "f16": "FP16", "f32": "FP32", "f64": "FP64"}


@pytest.fixture(scope="module")
def wire_server(tmp_path_factory, dtypes_vmfb):
    root = tmp_path_factory.mktemp("repo")
    for sample in ("mlp_classifier", "saxpy"):
        shutil.copytree(SAMPLES / sample, root / sample)
    write_model(root, "dtypes", dtypes_vmfb)
    shutil.copytree(SAMPLES / "saxpy", root / "padded")  # its version directory is 7
    (root / "padded" / "1").rename(root / "padded" / "7")
    server = ServerProcess("--model-repository", str(root))
    try:
        yield server.start()
    finally:
        server.stop()


def _post(target: bytes, body: bytes, *headers: bytes, length: bool = True) -> bytes:
    head = b"POST " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    if length:
        head += b"Content-Length: %d\r\n" % len(body)
    return head + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body


def _get(target: bytes, version: bytes = b"HTTP/1.1", method: bytes = b"GET") -> bytes:
    return method + b" " + target + b" " + version + b"\r\nHost: x\r\nConnection: close\r\n\r\n"


def _chunked(body: bytes, size_line: bytes = b"%x") -> bytes:
    return (size_line % len(body)) + b"\r\n" + body + b"\r\n0\r\n\r\n"


def _assert_healthy(server: ServerProcess) -> None:
    status, _ = status_and_error(exchange(server, _HEALTH))
    assert status == 200
    status, error = status_and_error(exchange(server, _post(_MLP, _BODY)))
    assert status == 200, error


# (probe, bytes sent, status, part of the error)
_FRAMING = [
    ("Content-Length with leading zeros", _post(_MLP, _BODY, b"Content-Length: 0%d"
                                               % len(_BODY), length=False), 200, ""),
    ("Content-Length after spaces", _post(_MLP, _BODY, b"Content-Length:   %d"
                                          % len(_BODY), length=False), 200, ""),
    ("Content-Length with a sign", _post(_MLP, _BODY, b"Content-Length: +%d"
                                         % len(_BODY), length=False), 400, "Content-Length"),
    ("Content-Length as a list", _post(_MLP, _BODY, b"Content-Length: %d, %d"
                                       % (len(_BODY), len(_BODY)), length=False), 400,
     "Content-Length"),
    ("conflicting Content-Lengths", _post(_MLP, _BODY, b"Content-Length: %d" % len(_BODY),
                                          b"Content-Length: 5", length=False), 400,
     "Content-Length"),
    ("chunk size with leading zeros", _post(_MLP, _chunked(_BODY, b"000%x"),
                                            b"Transfer-Encoding: chunked", length=False),
     200, ""),
    ("chunk extensions, one quoted", _post(_MLP, _chunked(_BODY, b'%x;a=b;c="d;e"'),
                                           b"Transfer-Encoding: chunked", length=False),
     200, ""),
    ("Transfer-Encoding in capitals", _post(_MLP, _chunked(_BODY),
                                            b"Transfer-Encoding: CHUNKED", length=False),
     200, ""),
    ("chunked twice", _post(_MLP, _chunked(_BODY), b"Transfer-Encoding: chunked",
                            b"Transfer-Encoding: chunked", length=False), 400,
     "Transfer-Encoding"),
    ("chunked, then identity", _post(_MLP, _chunked(_BODY), b"Transfer-Encoding: chunked, "
                                     b"identity", length=False), 400, "Transfer-Encoding"),
    ("a space before a header's colon", b"GET /v2/health/live HTTP/1.1\r\nHost : x\r\n\r\n",
     400, "malformed HTTP request"),
    ("a non-ASCII header name", b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-\xc3\xa9: 1"
     b"\r\n\r\n", 400, "malformed HTTP request"),
    ("a bare CR in a header value", b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-A: a\rb"
     b"\r\n\r\n", 400, "malformed HTTP request"),
    ("a control byte in a header value", b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n"
     b"Content-Type: \x01\r\n\r\n", 400, "malformed HTTP request"),
    ("Latin-1 bytes in a header value", b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-A: "
     b"\xe9\xff\r\nConnection: close\r\n\r\n", 200, ""),
    ("a non-ASCII byte in the target", _get(b"/v2/models/\xc3\xa9/ready"), 400,
     "malformed HTTP request"),
    ("a 70 KB target", _get(b"/v2/models/" + b"m" * 70_000 + b"/ready"), 431,
     "request head exceeds"),
    ("a fragment in the target", _get(b"/v2/health/live#x"), 400, "fragment"),
    ("a fragment in a model path", _get(b"/v2/models/mlp_classifier#x/ready"), 400,
     "fragment"),
    ("a percent-encoded name (not decoded, as Triton)",
     _post(b"/v2/models/%6Dlp_classifier/infer", _BODY), 404, "unknown model"),
    ("a percent-encoded slash", _get(b"/v2/models/mlp_classifier%2Fready"), 404,
     "unknown model"),
    ("dot segments", _get(b"/v2/models/x/../mlp_classifier/ready"), 404, "no route"),
    ("the asterisk target", _get(b"*", method=b"OPTIONS"), 404, "no route"),
    ("HTTP/2.0 in the request line", _get(b"/v2/health/live", b"HTTP/2.0"), 505,
     "HTTP/2.0 is not supported"),
    ("an HTTP/0.9 request line", b"GET /v2/health/live\r\n\r\n", 505,
     "HTTP/0.9 is not supported"),
    ("HTTP/1.2", _get(b"/v2/health/live", b"HTTP/1.2"), 400, "malformed HTTP request"),
    ("Transfer-Encoding in an HTTP/1.0 request",
     b"POST " + _MLP + b" HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(_BODY),
     400, "Transfer-Encoding in an HTTP/1.0 request"),
    ("Transfer-Encoding in an HTTP/1.0 keep-alive request",
     b"POST " + _MLP + b" HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked"
     b"\r\n\r\n" + _chunked(_BODY) + b"GET /v2/health/live HTTP/1.0\r\n\r\n", 400,
     "Transfer-Encoding in an HTTP/1.0 request"),
    ("a GET with a body (ignored)", b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n"
     b"Content-Length: 5\r\nConnection: close\r\n\r\nhello", 200, ""),
    ("a tab between method and target", b"GET\t/v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n",
     400, "malformed HTTP request"),
    ("a chunk size with a sign", _post(_MLP, b"-5\r\nhello\r\n0\r\n\r\n",
                                       b"Transfer-Encoding: chunked", length=False), 400,
     "chunk size"),
    ("a chunk without its CRLF", _post(_MLP, b"%x\r\n" % len(_BODY) + _BODY + b"XX0\r\n\r\n",
                                       b"Transfer-Encoding: chunked", length=False), 400,
     "malformed HTTP request"),
    ("CONNECT", b"CONNECT 127.0.0.1:1 HTTP/1.1\r\nHost: x\r\n\r\n", 400, "not supported"),
    ("an absolute https target", _get(b"https://u:p@elsewhere/v2/health/live"), 200, ""),
    ("a lower-case method", _get(b"/v2/health/live", method=b"get"), 400,
     "malformed HTTP request"),
    ("an unknown method", _get(b"/v2/health/live", method=b"BREW"), 400,
     "malformed HTTP request"),
    ("PATCH on infer", _get(_MLP, method=b"PATCH"), 405, "method PATCH not allowed"),
    ("OPTIONS on a model", _get(b"/v2/models/mlp_classifier", method=b"OPTIONS"), 405,
     "method OPTIONS not allowed"),
    ("DELETE on metrics", _get(b"/metrics", method=b"DELETE"), 405, "not allowed"),
]


@pytest.mark.parametrize("data,status,message", [p[1:] for p in _FRAMING],
                         ids=[p[0] for p in _FRAMING])
def test_framing_and_request_lines(wire_server, data, status, message):
    got, error = status_and_error(exchange(wire_server, data))
    assert got == status and message in error, (got, error)
    _assert_healthy(wire_server)


def test_http_1_0_keep_alive_is_said_and_kept(wire_server):
    """An HTTP/1.0 client keeps its connection only when the answer says `Connection:
    keep-alive` (RFC 9112 9.3): the answer kept the connection open without saying so,
    so the client closed it after every request; without keep-alive it closes."""
    with socket.create_connection(("127.0.0.1", wire_server.port), timeout=30) as sock:
        for _ in range(2):
            sock.sendall(b"GET /v2/health/live HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            answer = b""
            while not answer.endswith(b"{\"live\":true}"):
                chunk = sock.recv(65536)
                assert chunk, answer
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200") and \
                b"\r\nconnection: keep-alive\r\n" in answer, answer
    answer = exchange(wire_server, b"GET /v2/health/live HTTP/1.0\r\n\r\n")
    assert b"\r\nconnection: close\r\n" in answer, answer


def test_http_1_0_keep_alive_infer_answers_say_keep_alive_and_no_100_continue(wire_server):
    """Inference answers too (an instance thread writes them itself). And an HTTP/1.0
    request's `Expect: 100-continue` is ignored (RFC 9110 10.1.1: a 1.0 client would
    take the interim 100 for its answer); it was answered with one."""
    post = b"POST " + _MLP + b" HTTP/1.0\r\nConnection: keep-alive\r\nExpect: 100-continue" \
        b"\r\nContent-Length: %d\r\n\r\n" % len(_BODY)
    with socket.create_connection(("127.0.0.1", wire_server.port), timeout=30) as sock:
        for _ in range(3):
            sock.sendall(post)
            sock.settimeout(0.5)
            with pytest.raises(TimeoutError):
                early = sock.recv(65536)
                pytest.fail(f"answered before the body was sent: {early!r}")
            sock.settimeout(30)
            sock.sendall(_BODY)
            answer = b""
            while not answer.endswith(b"}]}"):
                chunk = sock.recv(65536)
                assert chunk, answer
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200") and \
                b"\r\nconnection: keep-alive\r\n" in answer, answer


def test_connection_close_is_honoured_before_a_pipelined_request(wire_server):
    answer = exchange(wire_server, _HEALTH + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.count(b"HTTP/1.1 200") == 1, answer


_JSON = json.dumps({"inputs": [
    {"name": "alpha", "datatype": "FP32", "shape": [1], "data": [1.5]},
    {"name": "x", "datatype": "FP32", "shape": [2], "data": [1, 2]},
    {"name": "y", "datatype": "FP32", "shape": [2], "data": [1, 2]}]}).encode()
_SAXPY = b"/v2/models/saxpy/infer"
_GZIP = gzip.compress(_JSON)

# (probe, body, headers, status, part of the error)
_ENCODED = [
    ("gzip", _GZIP, [b"Content-Encoding: gzip"], 200, ""),
    ("deflate (zlib)", zlib.compress(_JSON), [b"Content-Encoding: deflate"], 200, ""),
    ("gzip in two members", gzip.compress(_JSON[:20]) + gzip.compress(_JSON[20:]),
     [b"Content-Encoding: gzip"], 200, ""),
    ("gzip in 16 members", b"".join(gzip.compress(_JSON[i:i + 14]) for i in range(0, 210, 14))
     + gzip.compress(_JSON[210:]), [b"Content-Encoding: gzip"], 200, ""),
    ("a gzip stream labelled deflate (read as Triton reads it)", _GZIP,
     [b"Content-Encoding: deflate"], 200, ""),
    ("gzip without its checksum", _GZIP[:-8], [b"Content-Encoding: gzip"], 400,
     "truncated"),
    ("gzip cut in its data", _GZIP[:len(_GZIP) // 2], [b"Content-Encoding: gzip"], 400,
     "truncated"),
    ("gzip, then other bytes", _GZIP + b"junk", [b"Content-Encoding: gzip"], 400,
     "4 bytes after the end of its gzip stream that are not another gzip member"),
    ("gzip in 17 members", b"".join(gzip.compress(_JSON[i:i + 16])
                                    for i in range(0, 256, 16)) + gzip.compress(_JSON[256:]),
     [b"Content-Encoding: gzip"], 400, "at most 16 gzip members"),
    ("100,000 empty gzip members", gzip.compress(_JSON) + gzip.compress(b"") * 100_000,
     [b"Content-Encoding: gzip"], 400, "at most 16 gzip members"),
    ("deflate, then other bytes", zlib.compress(_JSON) + b"junk",
     [b"Content-Encoding: deflate"], 400, "4 bytes after the end of its deflate stream"),
    ("an empty gzip body", b"", [b"Content-Encoding: gzip"], 400, "truncated"),
    ("raw deflate without a zlib header", zlib.compress(_JSON)[2:-4],
     [b"Content-Encoding: deflate"], 400, "not valid deflate"),
    ("codings stacked", gzip.compress(_GZIP), [b"Content-Encoding: gzip, gzip"], 415,
     "not supported"),
    ("x-gzip", _GZIP, [b"Content-Encoding: x-gzip"], 415, "not supported"),
    ("Inference-Header-Content-Length with a sign", _JSON,
     [b"Inference-Header-Content-Length: +%d" % len(_JSON)], 400, "must be an integer"),
    ("Inference-Header-Content-Length with an underscore", _JSON,
     [b"Inference-Header-Content-Length: 1_0"], 400, "must be an integer"),
    ("Inference-Header-Content-Length negative", _JSON,
     [b"Inference-Header-Content-Length: -1"], 400, "must be an integer"),
    ("Inference-Header-Content-Length repeated", _JSON,
     [b"Inference-Header-Content-Length: %d" % len(_JSON)] * 2, 400, "must be an integer"),
    ("Inference-Header-Content-Length of 5,000 digits", _JSON,
     [b"Inference-Header-Content-Length: " + b"9" * 5000], 400, "must be an integer"),
    ("Inference-Header-Content-Length the whole body", _JSON,
     [b"Inference-Header-Content-Length: %d" % len(_JSON)], 200, ""),
    ("Inference-Timeout with an underscore", _JSON, [b"Inference-Timeout: 1_0"], 400,
     "Inference-Timeout must be"),
    ("Inference-Timeout infinity", _JSON, [b"Inference-Timeout: infinity"], 400,
     "Inference-Timeout must be"),
    ("Inference-Timeout 1e400", _JSON, [b"Inference-Timeout: 1e400"], 400,
     "Inference-Timeout must be"),
    ("Inference-Timeout in hex", _JSON, [b"Inference-Timeout: 0x10"], 400,
     "Inference-Timeout must be"),
    ("Inference-Timeout 2.5e1", _JSON, [b"Inference-Timeout: 2.5e1"], 200, ""),
    ("Inference-Header-Content-Length past the body", _JSON,
     [b"Inference-Header-Content-Length: %d" % (len(_JSON) + 1)], 400, "outside the body"),
    ("an odd Content-Type", _JSON, [b"Content-Type: text/plain; charset=latin-1"], 200, ""),
    ("Accept-Encoding gzip (answers are not compressed)", _JSON,
     [b"Accept-Encoding: gzip"], 200, ""),
]


@pytest.mark.parametrize("body,headers,status,message", [p[1:] for p in _ENCODED],
                         ids=[p[0] for p in _ENCODED])
def test_encodings_and_numeric_headers(wire_server, body, headers, status, message):
    answer = exchange(wire_server, _post(_SAXPY, body, *headers))
    got, error = status_and_error(answer)
    assert got == status and message in error, (got, error)
    if got == 200:
        out = json.loads(answer.split(b"\r\n\r\n", 1)[1])["outputs"]
        assert out[0]["data"] == [2.5, 5.0] and b"content-encoding" not in answer.lower()
    if got == 415:  # RFC 9110 15.5.16, as Triton's frontend: the codings it takes
        assert b"\r\naccept-encoding: gzip, deflate\r\n" in answer, answer
    _assert_healthy(wire_server)


@pytest.mark.parametrize("version,status", [
    (b"1", 200), (b"01", 200), (b"0001", 200),  # Triton reads the digits as an integer
    (b"0", 404), (b"2", 404),
    (b"99999999999999999999", 400),  # beyond int64: Triton's 400 too
    (b"9" * 5000, 400), (b"0" * 5000 + b"1", 200),  # no 4,300-digit int() limit
    (b"-1", 404), (b"+1", 404), (b"1.0", 404), (b"1e0", 404), (b"%31", 404), (b"", 404),
])
@pytest.mark.parametrize("endpoint", [b"", b"/ready", b"/config", b"/stats", b"/infer"])
def test_every_version_form_in_every_model_endpoint(wire_server, version, status,
                                                    endpoint):
    target = b"/v2/models/mlp_classifier/versions/" + version + endpoint
    data = _post(target, _BODY) if endpoint == b"/infer" else _get(target)
    got, error = status_and_error(exchange(wire_server, data))
    assert got == status, (target, got, error)
    if status == 400:
        assert "out of range" in error


@pytest.mark.parametrize("target", [b"/v2/models/mlp_classifier/",
                                    b"/v2/models/mlp_classifier/versions/1/",
                                    b"/v2/models/mlp_classifier/ready/",
                                    b"/v2/models/mlp_classifier//ready",
                                    b"/v2/models/mlp_classifier/versions/1//ready",
                                    b"/v2/models/mlp_classifier/versions",
                                    b"//v2/health/live", b"/v2/health/live/", b"/v2/"])
def test_a_trailing_or_doubled_slash_names_no_endpoint(wire_server, target):
    """Triton matches the whole path: `/v2/models/m/` was this server's metadata."""
    got, error = status_and_error(exchange(wire_server, _get(target)))
    assert got == 404 and "no route" in error, (target, got, error)


def _dtypes_request(overrides: dict[str, bytes], pad: int = 0, outputs: bytes = b"") -> bytes:
    """A `dtypes` request: two values per datatype, `overrides` replacing an input's JSON
    (by short name), the whole padded past `pad` bytes (a large request's JSON goes
    through the cut-out data parse)."""
    tensors = []
    for short, datatype in _V2.items():
        tensor = overrides.get(short)
        if tensor is None:
            data = b"[true, false]" if datatype == "BOOL" else b"[1, 2]"
            tensor = b'{"shape": [2], "data": %s}' % data
        tensors.append(b'{"name": "in_%s", "datatype": "%s", ' % (short.encode(),
                                                                  datatype.encode())
                       + tensor[1:])
    body = b'{"inputs": [' + b", ".join(tensors) + b"]" + outputs
    return body + b" " * max(0, pad - len(body)) + b"}"


# (probe, the inputs changed, status, part of the error)
_NUMBERS = [
    ("INT8 128", {"i8": b'{"shape": [2], "data": [128, 1]}'}, 400, "outside INT8's range"),
    ("INT8 -129", {"i8": b'{"shape": [2], "data": [-129, 1]}'}, 400, "outside INT8's range"),
    ("INT64 2**63", {"i64": b'{"shape": [2], "data": [9223372036854775808, 1]}'}, 400,
     "outside INT64's range"),
    ("INT64 -2**63", {"i64": b'{"shape": [2], "data": [-9223372036854775808, 1]}'}, 200, ""),
    ("INT64 2**64", {"i64": b'{"shape": [2], "data": [18446744073709551616, 1]}'}, 400,
     "must hold integers"),
    ("INT32 1.0", {"i32": b'{"shape": [2], "data": [1.0, 1]}'}, 400, "must hold integers"),
    ("INT32 \"1\"", {"i32": b'{"shape": [2], "data": ["1", 1]}'}, 400, ""),
    ("BOOL 2", {"b": b'{"shape": [2], "data": [2, 1]}'}, 400, "true/false"),
    ("BOOL 1 and 0", {"b": b'{"shape": [2], "data": [1, 0]}'}, 400, "true/false"),
    ("FP16 65519 (rounds to 65504)", {"f16": b'{"shape": [2], "data": [65519, -65519.9]}'},
     200, ""),
    ("FP16 65520 (rounds to infinity)", {"f16": b'{"shape": [2], "data": [65520, 1]}'}, 400,
     "does not fit FP16"),
    ("FP32 3.4028235e38", {"f32": b'{"shape": [2], "data": [3.4028235e38, 1]}'}, 200, ""),
    ("FP32 3.5e38", {"f32": b'{"shape": [2], "data": [3.5e38, 1]}'}, 400,
     "does not fit FP32"),
    ("FP64 1e400", {"f64": b'{"shape": [2], "data": [1e400, 1]}'}, 400, "not valid JSON"),
    ("FP32 NaN", {"f32": b'{"shape": [2], "data": [NaN, 1]}'}, 400, "not valid JSON"),
    ("FP32 -Infinity", {"f32": b'{"shape": [2], "data": [-Infinity, 1]}'}, 400,
     "not valid JSON"),
    ("FP32 -0 and 1e-50", {"f32": b'{"shape": [2], "data": [-0, 1e-50]}'}, 200, ""),
    ("FP32 null", {"f32": b'{"shape": [2], "data": [null, 1]}'}, 400, ""),
    ("FP32 +1", {"f32": b'{"shape": [2], "data": [+1, 1]}'}, 400, "not valid JSON"),
    ("INT32 01", {"i32": b'{"shape": [2], "data": [01, 1]}'}, 400, "not valid JSON"),
    ("FP32 data nested deeper than its shape", {"f32": b'{"shape": [2], "data": [[1], [2]]}'},
     400, "nested"),
    ("FP32 data a string", {"f32": b'{"shape": [2], "data": "[1, 2]"}'}, 400,
     "must be a list"),
    ("FP32 data with a trailing comma", {"f32": b'{"shape": [2], "data": [1, 2,]}'}, 400,
     "not valid JSON"),
    ("too many values", {"f32": b'{"shape": [2], "data": [1, 2, 3]}'}, 400, "elements"),
    ("every datatype empty", {s: b'{"shape": [0], "data": []}' for s in _V2}, 200, ""),
    ("an empty tensor with a value", {"f32": b'{"shape": [0], "data": [1]}'}, 400,
     "elements"),
    ("an empty tensor nested", {"f32": b'{"shape": [0], "data": [[]]}'}, 400, ""),
]


@pytest.mark.parametrize("pad", [0, 80_000], ids=["small", "large"])
@pytest.mark.parametrize("overrides,status,message", [p[1:] for p in _NUMBERS],
                         ids=[p[0] for p in _NUMBERS])
def test_numbers_at_each_datatypes_edge(wire_server, overrides, status, message, pad):
    """The small parse (orjson whole) and the large one (each data array cut out and
    parsed into its typed array) give the same answers."""
    answer = exchange(wire_server, _post(b"/v2/models/dtypes/infer",
                                         _dtypes_request(overrides, pad)))
    got, error = status_and_error(answer)
    assert got == status and message in error, (got, error)
    if got == 200:
        outputs = json.loads(answer.split(b"\r\n\r\n", 1)[1])["outputs"]
        assert [o["name"] for o in outputs] == [f"out_{s}" for s in _V2]


def test_empty_tensors_of_every_datatype_come_back_empty(wire_server):
    for pad in (0, 80_000):
        answer = exchange(wire_server, _post(b"/v2/models/dtypes/infer", _dtypes_request(
            {s: b'{"shape": [0], "data": []}' for s in _V2}, pad)))
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        outputs = json.loads(answer.split(b"\r\n\r\n", 1)[1])["outputs"]
        assert [(o["datatype"], o["shape"], o["data"]) for o in outputs] == \
            [(t, [0], []) for t in _V2.values()]


@pytest.mark.parametrize("parameters,status,message", [
    (b'{"classification": 0}', 200, ""),  # Triton's "no classification"
    (b'{"classification": 2}', 400, "classification extension is not supported"),
    (b'{"classification": false}', 400, "must be a non-negative integer"),
    (b'{"classification": "2"}', 400, "must be a non-negative integer"),
    (b'{"classification": null}', 400, "must be a non-negative integer"),
    (b'{"classification": -1}', 400, "must be a non-negative integer"),
    (b'{"classification": 1.5}', 400, "must be a non-negative integer"),
])
def test_the_classification_parameter_is_read_as_triton_reads_it(wire_server, parameters,
                                                                 status, message):
    outputs = b', "outputs": [{"name": "out_f32", "parameters": %s}]' % parameters
    answer = exchange(wire_server, _post(b"/v2/models/dtypes/infer",
                                         _dtypes_request({}, outputs=outputs)))
    got, error = status_and_error(answer)
    assert got == status and message in error, (got, error)
    if got == 200:
        outputs = json.loads(answer.split(b"\r\n\r\n", 1)[1])["outputs"]
        assert [(o["name"], o["data"]) for o in outputs] == [("out_f32", [3.0, 4.5])]


@pytest.mark.parametrize("value", [b"null", b"1", b'"true"', b"[]"])
def test_binary_data_of_an_output_is_a_boolean(wire_server, value):
    """`"binary_data": null` was taken as absent (Triton's frontend reads it as a
    boolean: 400)."""
    outputs = b', "outputs": [{"name": "out_f32", "parameters": {"binary_data": %s}}]' % value
    got, error = status_and_error(exchange(wire_server, _post(
        b"/v2/models/dtypes/infer", _dtypes_request({}, outputs=outputs))))
    assert got == 400 and "'binary_data' must be true or false" in error, (got, error)


def test_binary_outputs_of_every_datatype_and_one_asked_as_json(wire_server):
    """`binary_data_output` makes every output binary, an output's own `binary_data:
    false` wins for it; the bytes follow the JSON header in the order asked."""
    asked = b', "parameters": {"binary_data_output": true}, "outputs": [' \
            b'{"name": "out_f16", "parameters": {"binary_data": false}}, {"name": "out_b"},' \
            b' {"name": "out_i64"}]'
    answer = exchange(wire_server, _post(b"/v2/models/dtypes/infer",
                                         _dtypes_request({}, outputs=asked)))
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200"), answer[:300]
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"inference-header-content-length")))
    outputs = json.loads(body[:length])["outputs"]
    assert outputs[0] == {"name": "out_f16", "datatype": "FP16", "shape": [2],
                          "data": [3.0, 4.5]}
    assert [o["parameters"]["binary_data_size"] for o in outputs[1:]] == [2, 16]
    assert body[length:] == b"\x00\x01" + (0).to_bytes(8, "little", signed=True) + \
        (3).to_bytes(8, "little", signed=True)


@pytest.mark.parametrize("doc,message", [
    ({"inputs": [{"name": "features", "datatype": "FP32", "shape": [2**4, 2**60 + 2],
                  "data": [1.0]}]}, "causes total element count to exceed maximum size of"),
    ({"inputs": [{"name": "features", "datatype": "FP32", "shape": [2**2, 2**60 + 2],
                  "data": [1.0]}]}, "byte size overflow for input"),
    ({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16],
                  "data": [0.5] * 16}], "outputs": [{"name": "class"}] * 2},
     "output 'class' already exists in request"),
])
def test_triton_l0_http_cases_get_its_status_and_words(wire_server, doc, message):
    """Triton's own L0_http cases (buffer size overflow, duplicate output names): the
    400 and the words its test looks for."""
    got, error = status_and_error(exchange(wire_server, _post(_MLP, json.dumps(doc).encode())))
    assert got == 400 and message in error, (got, error)


def _answers(stream: bytes) -> list[tuple[int, bytes]]:
    """(status, body) of each answer on a connection (Content-Length framed)."""
    out = []
    while stream:
        head, rest = stream.split(b"\r\n\r\n", 1)
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:]
                      if line.lower().startswith(b"content-length:"))
        out.append((int(head.split(b" ", 2)[1]), rest[:length]))
        stream = rest[length:]
    return out


def test_clients_splitting_pipelined_requests_at_odd_boundaries_all_at_once(wire_server):
    """Eight connections at once, each pipelining a random mix of JSON, binary, chunked
    and GET requests cut at random byte boundaries (1 byte to 4 KiB, small pauses):
    every request gets the answer it gets whole, in order."""
    header = json.dumps({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16],
                                     "parameters": {"binary_data_size": 64}}]}).encode()
    binary = header + bytes(64)
    head = b"POST " + _MLP + b" HTTP/1.1\r\nHost: x\r\n"
    requests = [
        head + b"Content-Length: %d\r\n\r\n" % len(_BODY) + _BODY,
        b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n",
        head + b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
        % (len(header), len(binary)) + binary,
        head + b"Transfer-Encoding: chunked\r\n\r\n" + b"20\r\n" + _BODY[:32] + b"\r\n" +
        _chunked(_BODY[32:]),
        b"GET /v2/models/mlp_classifier/versions/01/ready HTTP/1.1\r\nHost: x\r\n\r\n",
    ]
    last = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    whole = [_answers(exchange(wire_server, r + last))[0] for r in requests]
    assert [status for status, _ in whole] == [200] * len(requests)
    failures: list = []

    def client(seed: int) -> None:
        rnd = random.Random(seed)
        for _ in range(8):
            picked = [rnd.randrange(len(requests)) for _ in range(rnd.randrange(1, 7))]
            stream = b"".join(requests[i] for i in picked) + last
            with socket.create_connection(("127.0.0.1", wire_server.port), timeout=30) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                pos = 0
                while pos < len(stream):
                    step = rnd.choice((1, 2, 3, 7, 64, 500, 4096))
                    sock.sendall(stream[pos:pos + step])
                    pos += step
                    if rnd.random() < 0.03:
                        time.sleep(0.002)
                received = b""
                while chunk := sock.recv(65536):
                    received += chunk
            got = _answers(received)
            if got[:-1] != [whole[i] for i in picked] or got[-1][0] != 200:
                failures.append((picked, [status for status, _ in got]))

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures[:3]
    _assert_healthy(wire_server)


_ROUTES = {b"/v2/health/live": b"GET", b"/v2/health/ready": b"GET", b"/v2": b"GET",
           b"/v2/models/mlp_classifier": b"GET", b"/v2/models/mlp_classifier/ready": b"GET",
           b"/v2/models/mlp_classifier/versions/1/config": b"GET",
           b"/v2/models/mlp_classifier/stats": b"GET", b"/v2/models/stats": b"GET",
           b"/metrics": b"GET", _MLP: b"POST",
           b"/v2/repository/models/mlp_classifier/load": b"POST"}


@pytest.mark.parametrize("method", [b"HEAD", b"OPTIONS", b"PUT", b"DELETE", b"PATCH",
                                    b"TRACE", b"GET", b"POST"])
def test_every_method_on_every_route(wire_server, method):
    """GET or POST per endpoint, as Triton's frontend; any other method 405 naming the
    one allowed (a HEAD answer has no body)."""
    for target, allowed in _ROUTES.items():
        if method == allowed:
            continue
        data = method + _post(target, b"{}")[4:] if method in (b"POST", b"PUT", b"PATCH") \
            else _get(target, method=method)
        answer = exchange(wire_server, data)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 405") and \
            b"\r\nallow: " + allowed.lower() in head.lower(), (method, target, answer)
        assert (body == b"") == (method == b"HEAD"), (method, target, answer)


def _binary(inputs: list[dict], tail: bytes) -> bytes:
    header = json.dumps({"inputs": inputs}).encode()
    return _post(_SAXPY, header + tail, b"Inference-Header-Content-Length: %d" % len(header))


def _saxpy_inputs(alpha: dict) -> list[dict]:
    return [alpha, *({"name": n, "datatype": "FP32", "shape": [1],
                      "parameters": {"binary_data_size": 4}} for n in ("x", "y"))]


@pytest.mark.parametrize("alpha,tail,message", [
    ({"name": "alpha", "datatype": "BYTES", "shape": [1], "data": ["ab"]}, b"",
     "BYTES (string) tensors are not supported"),
    ({"name": "alpha", "datatype": "BYTES", "shape": [1],
      "parameters": {"binary_data_size": 8}}, b"\xff\xff\xff\xffabcd",
     "BYTES (string) tensors are not supported"),
    ({"name": "alpha", "datatype": "FP32", "shape": [1],
      "parameters": {"binary_data_size": -4}}, b"", "binary_data_size must be"),
    ({"name": "alpha", "datatype": "FP32", "shape": [1],
      "parameters": {"binary_data_size": 4.0}}, bytes(4), "binary_data_size must be"),
    ({"name": "alpha", "datatype": "FP32", "shape": [1],
      "parameters": {"binary_data_size": 8}}, bytes(8), "needs 4"),
    ({"name": "alpha", "datatype": "FP32", "shape": [1], "data": [1.0],
      "parameters": {"binary_data_size": 4}}, bytes(4), "both 'data' and binary_data_size"),
    ({"name": "alpha", "datatype": "FP32", "shape": [1],
      "parameters": {"binary_data_size": 4}}, bytes(3), "binary bytes"),
    ({"name": "alpha", "datatype": "FP32", "shape": [1],
      "parameters": {"binary_data_size": 4}}, bytes(5), "binary bytes"),
])
def test_binary_tensors_that_lie_about_their_bytes(wire_server, alpha, tail, message):
    """The inputs x and y bring their 4 bytes each; alpha's declaration or bytes lie."""
    got, error = status_and_error(exchange(wire_server, _binary(_saxpy_inputs(alpha),
                                                                tail + bytes(8))))
    assert got == 400 and message in error, (got, error)


_REPEATS = [
    ("inputs", b'{"inputs": [], ' + _BODY[1:]),
    ("name", _BODY.replace(b'"name": "features"', b'"name": "x", "name": "features"')),
    ("name, spelt with an escape", _BODY.replace(b'"name": "features"',
                                                 b'"n\\u0061me": "x", "name": "features"')),
    ("binary_data", _BODY[:-1] + b', "outputs": [{"name": "class", "parameters": '
     b'{"binary_data": true, "binary_data": false}}]}'),
    ("timeout", _BODY[:-1] + b', "parameters": {"timeout": 1, "timeout": 2}}'),
    ("outputs, in a large body", _BODY[:-1] + b', "outputs": [], "outputs": []' +
     b" " * 70_000 + b"}"),
]


@pytest.mark.parametrize("body", [r[1] for r in _REPEATS], ids=[r[0] for r in _REPEATS])
def test_a_repeated_key_is_400(wire_server, body):
    """orjson keeps a repeated key's last value and Triton's RapidJSON its first: a
    filter in front reading one could pass a request that runs the other. They were
    served (the last value won)."""
    got, error = status_and_error(exchange(wire_server, _post(_MLP, body)))
    assert got == 400 and "repeats the key" in error, (got, error)


def test_colons_in_strings_and_nested_parameters_are_no_repeats(wire_server):
    body = _BODY[:-1] + (b', "id": "a:b:c", "parameters": {"note": "x:y"}, "outputs": '
                         b'[{"name": "class", "parameters": {"k": "v:w"}}]}')
    answer = exchange(wire_server, _post(_MLP, body))
    assert answer.startswith(b"HTTP/1.1 200") and b'"id":"a:b:c"' in answer, answer[:300]


def test_a_head_of_one_header_repeated_16000_times_is_served(wire_server):
    """A repeated header's values were joined one by one into a growing string (16,000
    repeats of `X:` in a 64 KiB head cost the event loop 19 ms of CPU, quadratic); they
    are gathered and joined once now (about 5 ms, the parser's per-field callbacks; see
    docs/performance.md). Each head is new, as a repeated one is decoded only once."""
    head = b"GET /v2/health/live HTTP/1.1\r\nHost: %d\r\n" + b"X:\r\n" * 16_000 + b"\r\n"
    assert len(head) < 64 << 10
    with socket.create_connection(("127.0.0.1", wire_server.port), timeout=60) as sock:
        for i in range(5):
            sock.sendall(head % i)
            answer = b""
            while not answer.endswith(b"{\"live\":true}"):
                chunk = sock.recv(65536)
                assert chunk, answer
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200"), answer
    _assert_healthy(wire_server)


def test_repeated_header_names_are_joined_in_order():
    from tinyhal.server.http import _header_dict

    raw = [b"Accept", b"a", b"X-One", b"1", b"accept", b"b", b"ACCEPT", b"", b"Host", b"h"]
    assert _header_dict(raw) == {"accept": "a, b, ", "x-one": "1", "host": "h"}
    assert _header_dict([b"X", b"\xe9"]) == {"x": "\xe9"}


@pytest.mark.parametrize("version", [b"007", b"7", b"0007"])
def test_a_version_in_the_path_with_leading_zeros_is_its_integer(wire_server, version):
    """A version in the path is read as an integer, as Triton's frontend reads it: any
    digits of 7 find version 7 (a version directory with leading zeros is ignored, as
    Triton ignores it: test_probes_seq.py)."""
    answer = exchange(wire_server, _get(b"/v2/models/padded/versions/" + version))
    got, error = status_and_error(answer)
    assert got == 200, (version, error)
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["versions"] == ["7"]

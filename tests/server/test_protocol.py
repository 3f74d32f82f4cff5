"""The V2 wire format without a server: parsing and response building."""

from __future__ import annotations

import json
import re

import ml_dtypes
import numpy as np
import pytest

from tinyhal.server import protocol
from tinyhal.server.protocol import (
    DATATYPES,
    ProtocolError,
    build_infer_response,
    parse_infer_request,
)


def _req(*inputs, **extra) -> bytes:
    return json.dumps({"inputs": list(inputs), **extra}).encode()


def test_nested_json_data_is_row_major():
    req = parse_infer_request(_req({"name": "a", "datatype": "INT32", "shape": [2, 3],
                                    "data": [[1, 2, 3], [4, 5, 6]]}))
    np.testing.assert_array_equal(req.inputs["a"], np.arange(1, 7, dtype=np.int32).reshape(2, 3))
    assert req.inputs["a"].dtype == np.int32


def test_full_unsigned_and_signed_ranges():
    big = 2**64 - 1
    req = parse_infer_request(_req(
        {"name": "u", "datatype": "UINT64", "shape": [2], "data": [0, big]},
        {"name": "s", "datatype": "INT64", "shape": [1], "data": [-(2**63)]}))
    assert req.inputs["u"].tolist() == [0, big]
    assert req.inputs["s"].tolist() == [-(2**63)]
    with pytest.raises(ProtocolError, match="outside UINT8's range"):
        parse_infer_request(_req({"name": "u", "datatype": "UINT8", "shape": [1], "data": [-1]}))


def test_binary_inputs_in_order_and_bool_bytes_checked():
    a = np.arange(4, dtype=np.float16)
    b = np.array([True, False, True])
    head = _req({"name": "a", "datatype": "FP16", "shape": [4],
                 "parameters": {"binary_data_size": a.nbytes}},
                {"name": "j", "datatype": "INT8", "shape": [2], "data": [1, -1]},
                {"name": "b", "datatype": "BOOL", "shape": [3],
                 "parameters": {"binary_data_size": 3}})
    body = head + a.tobytes() + b.tobytes()
    req = parse_infer_request(body, str(len(head)))
    np.testing.assert_array_equal(req.inputs["a"], a)
    np.testing.assert_array_equal(req.inputs["b"], b)
    # binary tensors are views of the request body, not copies
    whole = np.frombuffer(body, np.uint8)
    assert np.shares_memory(req.inputs["a"], whole) and np.shares_memory(req.inputs["b"], whole)
    assert req.inputs["j"].tolist() == [1, -1]
    with pytest.raises(ProtocolError, match="must be 0 or 1"):
        parse_infer_request(head + a.tobytes() + b"\x00\x02\x01", str(len(head)))


def test_a_repeated_binary_header_is_checked_once_but_read_anew_each_time():
    """A header seen before is not parsed again (its plan is kept by its bytes), yet each
    request gets its own tensors, and what depends on the body is still checked."""
    head = _req({"name": "x", "datatype": "FP32", "shape": [1, 3],
                 "parameters": {"binary_data_size": 12}},
                {"name": "b", "datatype": "BOOL", "shape": [2],
                 "parameters": {"binary_data_size": 2}},
                outputs=[{"name": "y", "parameters": {"binary_data": True}}],
                parameters={"sequence_id": 7})
    first = np.array([[1, 2, 3]], np.float32)
    second = np.array([[4, 5, 6]], np.float32)
    one = parse_infer_request(head + first.tobytes() + b"\x01\x00", str(len(head)))
    two = parse_infer_request(head + second.tobytes() + b"\x00\x01", str(len(head)))
    np.testing.assert_array_equal(one.inputs["x"], first)
    np.testing.assert_array_equal(two.inputs["x"], second)
    assert one.inputs["b"].tolist() == [True, False] and two.inputs["b"].tolist() == [False, True]
    assert one.inputs is not two.inputs
    assert two.parameters == {"sequence_id": 7} and two.outputs[0].binary is True
    assert protocol._PLANS[head].tensors.outputs is one.outputs is two.outputs
    with pytest.raises(ProtocolError, match="must be 0 or 1"):
        parse_infer_request(head + second.tobytes() + b"\x00\x05", str(len(head)))
    with pytest.raises(ProtocolError, match="needs 2 binary bytes at offset 12"):
        parse_infer_request(head + second.tobytes() + b"\x00", str(len(head)))
    with pytest.raises(ProtocolError, match="1 binary bytes that no input claims"):
        parse_infer_request(head + second.tobytes() + b"\x00\x01\x00", str(len(head)))


def test_the_answer_of_a_repeated_header_carries_each_requests_results():
    head = _req({"name": "x", "datatype": "FP32", "shape": [1],
                 "parameters": {"binary_data_size": 4}},
               parameters={"binary_data_output": True}, id="r1")
    req = parse_infer_request(head + b"\x00" * 4, str(len(head)))
    bodies = [build_infer_response("m", "1", req, [("y", "FP32", np.array([v], np.float32)),
                                                    ("z", "INT8", np.array([[v, -v]], np.int8))])
              for v in (3, 4)]
    for (body, length), v in zip(bodies, (3, 4)):
        doc = json.loads(body[:length])
        assert doc["id"] == "r1" and [o["shape"] for o in doc["outputs"]] == [[1], [1, 2]]
        assert body[length:] == np.array([v], "<f4").tobytes() + bytes([v, 256 - v])
    # another shape is another header
    body, length = build_infer_response("m", "1", req, [
        ("y", "FP32", np.array([1, 2], np.float32)), ("z", "INT8", np.zeros((1, 2), np.int8))])
    assert json.loads(body[:length])["outputs"][0]["shape"] == [2]


def test_headers_naming_the_same_tensors_keep_their_own_ids_and_parameters():
    """A sequence's steps differ only in their id and parameters: each answer carries its
    own request's id, each request keeps its own parameters, all checked per header."""
    x = np.array([1, 2], np.float32)

    def step(sid: int, start: bool, request_id: str | None) -> tuple[bytes, str]:
        extra = {} if request_id is None else {"id": request_id}
        head = _req({"name": "x", "datatype": "FP32", "shape": [2],
                     "parameters": {"binary_data_size": 8}},
                    parameters={"sequence_id": sid, "sequence_start": start,
                                "binary_data_output": True}, **extra)
        return head + x.tobytes(), str(len(head))

    a = parse_infer_request(*step(1, True, "a"))
    b = parse_infer_request(*step(2, False, "b"))
    c = parse_infer_request(*step(3, False, None))
    assert (a.parameters["sequence_id"], b.parameters["sequence_id"]) == (1, 2)
    assert a.parameters["sequence_start"] and not b.parameters["sequence_start"]
    for req, request_id in ((a, "a"), (b, "b"), (c, None), (a, "a")):
        body, length = build_infer_response("m", "1", req, [("y", "FP32", x)])
        assert json.loads(body[:length]).get("id") == request_id
    # the tensors are the same, the parameters are still checked per header
    head = _req({"name": "x", "datatype": "FP32", "shape": [2],
                 "parameters": {"binary_data_size": 8}},
                parameters={"binary_data_output": "yes"})
    with pytest.raises(ProtocolError, match="binary_data_output"):
        parse_infer_request(head + x.tobytes(), str(len(head)))
    # a long header is checked but not kept: no client makes the server hold big keys
    names = [{"name": f"x{i:05d}", "datatype": "FP32", "shape": [0],
              "parameters": {"binary_data_size": 0}} for i in range(200)]
    head = _req(*names)
    assert len(head) > 4096
    before = dict(protocol._PLANS)
    assert list(parse_infer_request(head, str(len(head))).inputs) == [n["name"] for n in names]
    assert protocol._PLANS == before
    # other tensors are another plan, checked on their own
    head = _req({"name": "x", "datatype": "FP32", "shape": [3],
                 "parameters": {"binary_data_size": 8}})
    with pytest.raises(ProtocolError, match="binary_data_size is 8 bytes"):
        parse_infer_request(head + x.tobytes(), str(len(head)))


def _id_first(request_id: str, compact: bool = True, **extra) -> tuple[bytes, str]:
    """A step header with the id first, as tritonclient and perf_analyzer write it, and
    4 binary bytes after it."""
    doc = {"id": request_id, "inputs": [{"name": "x", "datatype": "FP32", "shape": [1],
                                         "parameters": {"binary_data_size": 4}}], **extra}
    head = json.dumps(doc, separators=(",", ":") if compact else None,
                      ensure_ascii=False).encode()
    return head + b"\0" * 4, str(len(head))


@pytest.mark.parametrize("compact", [True, False])
def test_a_new_request_id_each_time_finds_the_plan_and_keeps_its_own_id(compact):
    """Clients that send a new id with every request (perf_analyzer on sequence models,
    tritonclient with request_id) reuse the plan of the bytes after the id, and do not
    fill the kept plans with one entry per id."""
    protocol._PLANS.clear()
    built = []
    plan_header = protocol._plan_header

    def counting(*args, **kwargs):
        built.append(1)
        return plan_header(*args, **kwargs)

    protocol._plan_header = counting
    try:
        ids = [f"req-{i}" for i in range(50)] + ["caf\u00e9 \U0001f600"]
        requests = [parse_infer_request(*_id_first(i, compact, parameters={"sequence_id": 9}))
                    for i in ids]
        assert len(built) == 1 and len(protocol._PLANS) == 1
        # an empty id is the same every time (perf_analyzer's): kept by its own bytes
        empty = [parse_infer_request(*_id_first("", compact, parameters={"sequence_id": 9}))
                 for _ in range(3)]
        assert len(built) == 2 and len(protocol._PLANS) == 2
    finally:
        protocol._plan_header = plan_header
    assert [r.id for r in requests + empty] == ids + ["", "", ""]
    assert all(r.parameters == {"sequence_id": 9} for r in requests + empty)
    # the same bytes without an id are their own header, whose requests have no id
    head = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1],
                                   "parameters": {"binary_data_size": 4}}],
                       "parameters": {"sequence_id": 9}}, separators=(",", ":")).encode()
    assert parse_infer_request(head + b"\0" * 4, str(len(head))).id is None


_ID_TAIL = (b'"inputs":[{"name":"x","datatype":"FP32","shape":[1],'
            b'"parameters":{"binary_data_size":4}}]}')


def test_an_id_with_an_escape_is_read_by_the_full_parse():
    head = b'{"id":"a\\"b",'
    for _ in range(2):  # the second finds whatever the first kept
        assert parse_infer_request(head + _ID_TAIL + b"\0" * 4,
                                   str(len(head + _ID_TAIL))).id == 'a"b'


@pytest.mark.parametrize("head", [b'{"id":"a","id":"b",', b'{"id":"a","i\\u0064":"b",'])
def test_a_repeated_id_is_refused_every_time_never_cut(head):
    """Parsers disagree on which of repeated names counts: refused (400), and no plan
    is kept for it under the bytes after the first id."""
    for _ in range(2):
        with pytest.raises(ProtocolError, match="repeats the key 'id'"):
            parse_infer_request(head + _ID_TAIL + b"\0" * 4, str(len(head + _ID_TAIL)))


@pytest.mark.parametrize("bad_id,message", [
    (b'"\xff"', "not valid JSON"),  # not UTF-8
    (b'"a\tb"', "not valid JSON"),  # a control character in a string
    (b"null", "'id' must be a string"),
    (b"7", "'id' must be a string"),
])
def test_a_bad_id_is_refused_even_when_its_plan_is_kept(bad_id, message):
    parse_infer_request(*_id_first("ok"))  # the plan of the bytes after the id is kept
    head, _ = _id_first("ok")
    head = head[:-4].replace(b'"ok"', bad_id, 1)
    with pytest.raises(ProtocolError, match=message) as info:
        parse_infer_request(head + b"\0" * 4, str(len(head)))
    assert info.value.status == 400


@pytest.mark.parametrize("datatype,message", [("BYTES", "BYTES (string) tensors are not")])
def test_unsupported_datatypes_are_named(datatype, message):
    with pytest.raises(ProtocolError, match=re.escape(message)) as info:
        parse_infer_request(_req({"name": "a", "datatype": datatype, "shape": [1],
                                  "data": ["x"]}))
    assert info.value.status == 400


def test_response_binary_outputs_follow_the_json_header():
    req = parse_infer_request(_req(
        {"name": "a", "datatype": "FP32", "shape": [1], "data": [1]}, id="abc",
        outputs=[{"name": "y", "parameters": {"binary_data": True}}, {"name": "z"}]))
    y = np.array([1.5, -2.0], np.float32)
    z = np.array([[True], [False]])
    body, header_length = build_infer_response(
        "m", "1", req, [("z", "BOOL", z), ("y", "FP32", y)])
    head = json.loads(body[:header_length])
    assert head["id"] == "abc" and [o["name"] for o in head["outputs"]] == ["y", "z"]
    assert head["outputs"][0]["parameters"] == {"binary_data_size": 8}
    assert head["outputs"][1]["data"] == [True, False] and head["outputs"][1]["shape"] == [2, 1]
    assert np.frombuffer(body[header_length:], np.float32).tolist() == [1.5, -2.0]


def test_request_level_binary_output_and_per_output_override():
    req = parse_infer_request(_req(
        {"name": "a", "datatype": "FP32", "shape": [1], "data": [1]},
        parameters={"binary_data_output": True},
        outputs=[{"name": "y"}, {"name": "z", "parameters": {"binary_data": False}}]))
    body, header_length = build_infer_response(
        "m", "1", req, [("y", "INT64", np.array([7])), ("z", "INT64", np.array([8]))])
    head = json.loads(body[:header_length])
    assert "data" not in head["outputs"][0] and head["outputs"][1]["data"] == [8]
    assert np.frombuffer(body[header_length:], "<i8").tolist() == [7]


def test_all_json_response_has_no_header_length():
    req = parse_infer_request(_req({"name": "a", "datatype": "FP64", "shape": [1],
                                    "data": [0.1]}))
    body, header_length = build_infer_response("m", "2", req, [("y", "FP64", np.array([0.1]))])
    assert header_length is None
    assert json.loads(body) == {"model_name": "m", "model_version": "2",
                                "outputs": [{"name": "y", "datatype": "FP64", "shape": [1],
                                             "data": [0.1]}]}


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64", "INT8", "UINT64", "BOOL"])
def test_json_outputs_read_back_to_the_same_bits(datatype):
    """JSON outputs come straight from the array; read as their datatype they give back the
    exact values (floats in their shortest form, a batch-mate's strided rows too)."""
    dtype = DATATYPES[datatype]
    rng = np.random.default_rng(5)
    if dtype.kind == "f":
        values = rng.standard_normal((6, 3)).astype(dtype)
    elif dtype.kind == "b":
        values = rng.integers(0, 2, (6, 3)).astype(bool)
    else:
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, (6, 3), dtype=dtype, endpoint=True)
    array = values[::2]  # not contiguous
    req = parse_infer_request(_req({"name": "a", "datatype": "FP32", "shape": [1],
                                    "data": [1]}))
    body, header_length = build_infer_response("m", "1", req, [("y", datatype, array)])
    assert header_length is None
    out = json.loads(body)["outputs"][0]
    assert out["shape"] == [3, 3]
    back = np.array(out["data"], dtype=dtype)
    assert back.tobytes() == np.ascontiguousarray(array).reshape(-1).tobytes()


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64", "BF16"])
def test_json_floats_round_once_and_refuse_what_does_not_fit(datatype):
    """A JSON number becomes the nearest value of the datatype (as numpy rounds a float64
    to it); a number beyond the largest finite value is a 400 naming it (JSON cannot
    carry one beyond float64: orjson refuses it as invalid JSON)."""
    dtype = DATATYPES[datatype]
    largest = float(ml_dtypes.finfo(dtype).max)
    values = [0.1, -2.5, 1, 3.0000001, 1e-8, -largest, largest, 2**60]
    values = [v for v in values if abs(v) <= largest]
    req = parse_infer_request(_req({"name": "a", "datatype": datatype,
                                    "shape": [len(values)], "data": values}))
    want = np.array(values, np.float64).astype(dtype)
    assert req.inputs["a"].dtype == dtype
    assert req.inputs["a"].tobytes() == want.tobytes()
    if datatype == "FP64":
        return
    too_big = largest * 1.01
    with pytest.raises(ProtocolError, match=f"does not fit {datatype}") as info:
        parse_infer_request(_req({"name": "a", "datatype": datatype, "shape": [2],
                                  "data": [1.0, -too_big]}))
    assert info.value.status == 400

"""KServe V2 / Open Inference Protocol: request parsing and response building.

Pure functions over bytes, dicts and numpy arrays (no I/O, no trio), so every rule of the
wire format can be tested without a server:

- JSON tensors: `{"name", "shape", "datatype", "data"}` with `data` flat or nested,
  row-major; BOOL as JSON booleans. JSON outputs are written flat straight from the array
  by orjson, each float in the shortest form that reads back to the same value of its
  datatype (an FP32 0.1 is `0.1`, not its float64 expansion; NaN and infinities `null`).
- The binary tensor extension as Triton and `tritonclient` use it: the request header
  `Inference-Header-Content-Length: N` says the first N body bytes are the JSON header;
  each input with `parameters.binary_data_size` takes that many bytes from what follows,
  in the order the inputs appear. Outputs asked for with `parameters.binary_data: true`
  (or every output, with the request parameter `binary_data_output: true`) are returned
  the same way, little-endian, after the JSON header of the response.
- Datatypes BOOL, INT8..INT64, UINT8..UINT64, FP16, FP32, FP64 and BF16 (as
  `ml_dtypes.bfloat16`; JSON data are numbers). BYTES is rejected with a message saying
  so: no tinyhal model takes strings.

Strictness (every case is a 400 naming what is wrong): JSON nested deeper than
`MAX_JSON_DEPTH` (400) levels; `data` that is ragged, nested unlike `shape` or holds values
of the wrong JSON type; values that do not fit the datatype (an integer out of range, a
finite number that overflows FP16/FP32); shapes with a negative dimension or an element
count over 2**63 - 1; boolean parameters (`binary_data_output`, `binary_data`) that are
not JSON booleans; request parameters Triton's frontend would refuse (`_check_parameters`);
an object that repeats a key (`_no_repeated_keys`);
tensors in shared-memory regions; `Inference-Header-Content-Length` outside (0, body
length].

Every malformed request raises `ProtocolError(status, message)`; the app turns it into a
V2 error body `{"error": message}` with that status.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
import orjson

from ..hal.types import ELEMENT_TYPES, element_info_for_mlir

__all__ = [
    "DATATYPES",
    "InferRequest",
    "ProtocolError",
    "RequestedOutput",
    "MAX_JSON_DEPTH",
    "JSON_SLICE_ELEMENTS",
    "build_infer_response",
    "datatype_for_mlir",
    "encodes_in_slices",
    "parse_infer_request",
]

# V2 datatype -> little-endian numpy dtype (BF16 as ml_dtypes.bfloat16), from the one
# element-type table the VM and tinyhal-run use
DATATYPES: dict[str, np.dtype] = {
    info.kserve: info.dtype.newbyteorder("<") if info.dtype.itemsize > 1 else info.dtype
    for info in ELEMENT_TYPES
    if info.kserve is not None
}
MAX_JSON_DEPTH = 400
_MAX_BYTES = 2**63 - 1
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")

_BOOL_TYPES = frozenset({bool})
_INT_TYPES = frozenset({int})
_NUMBER_TYPES = frozenset({int, float})
# per float datatype: its largest finite value, and the magnitude from which a JSON
# number is refused. Numpy converts Python floats to FP16/FP32/FP64 directly, rounding
# to nearest: a number rounds to infinity from the largest plus half its last step, and
# below that to the largest (65519 is a valid FP16, 65504). BF16 goes through float32
# (rounded twice), so only numbers up to its largest are taken. (finfo of ml_dtypes: numpy's
# knows no bf16.)
_LARGEST_FINITE = {name: float(ml_dtypes.finfo(dtype).max)
                   for name, dtype in DATATYPES.items() if dtype.kind in "fV"
                   or dtype.type.__module__.startswith("ml_dtypes")}
_DIRECT_FLOATS = frozenset({"FP16", "FP32", "FP64"})
_OVERFLOWS_FROM = {
    name: largest + math.ldexp(1.0, ml_dtypes.finfo(DATATYPES[name]).maxexp - 2
                               - ml_dtypes.finfo(DATATYPES[name]).nmant)
    if name in _DIRECT_FLOATS else math.nextafter(largest, math.inf)
    for name, largest in _LARGEST_FINITE.items()}

_UNSUPPORTED = {
    "BYTES": "BYTES (string) tensors are not supported: tinyhal models take numeric tensors",
}


def datatype_for_mlir(mlir_type: str) -> str | None:
    """The V2 datatype of an MLIR element type, or None when V2 has none for it."""
    info = element_info_for_mlir(mlir_type)
    return info.kserve if info is not None else None


class ProtocolError(Exception):
    """A request the protocol (or the model's signature) rejects: HTTP `status` + message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    name: str
    binary: bool | None  # None: as the request-level binary_data_output says


@dataclass(slots=True)
class InferRequest:
    id: str | None
    inputs: dict[str, np.ndarray]
    input_datatypes: dict[str, str]
    outputs: list[RequestedOutput] | None  # None: every output
    binary_output: bool  # the request-level `binary_data_output` parameter
    parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def timeout_us(self) -> float | None:
        """The request's `parameters.timeout` in microseconds (Triton's convention;
        checked with the other parameters, `_check_parameters`)."""
        value = self.parameters.get("timeout")
        return None if value is None else float(value)


def _bad(message: str) -> ProtocolError:
    return ProtocolError(400, message)


def _as_dict(value: Any, what: str, name: str = "") -> dict:
    """`value` as an object ({} for None); `what` names it in the error, with `name`
    put in place of `{}` (formatted only on error)."""
    if value is None:
        return {}
    if type(value) is not dict:
        raise _bad(f"{what.format(name)} must be a JSON object, not {type(value).__name__}")
    return value


MAX_DIMS = 32  # numpy holds at most 64; no model here takes more than a few


def _shape(value: Any, name: str, itemsize: int) -> tuple[int, ...]:
    """`value` as a shape of elements of `itemsize` bytes. Its bytes must have a 64-bit
    count even where a zero dimension makes it empty (the product of its nonzero
    dimensions, as numpy needs: [2**31, 0, 2**31] is refused, not only [2**62, 4])."""
    # one C-level pass per rule (JSON integers are exactly `int`; booleans are not)
    if type(value) is not list or not set(map(type, value)) <= _INT_TYPES:
        raise _bad(f"input '{name}' 'shape' must be a list of integers, not {value!r}")
    if len(value) > MAX_DIMS:
        raise _bad(f"input '{name}' 'shape' has {len(value)} dimensions; at most "
                   f"{MAX_DIMS}")
    if value and min(value) < 0:
        raise _bad(f"input '{name}' 'shape' {value} has a negative dimension")
    if value and (max(value) > _MAX_BYTES or
                  math.prod(filter(None, value)) * itemsize > _MAX_BYTES):
        _too_large(value, name)
    return tuple(value)


def _too_large(shape: list[int], name: str) -> None:
    """Raises the 400 for a shape whose elements or their bytes overflow a 64-bit
    count, in the words of Triton's frontend (its L0_http test reads them)."""
    if math.prod(filter(None, shape)) > _MAX_BYTES:
        raise _bad(f"input '{name}' 'shape' {shape} causes total element count to exceed "
                   f"maximum size of {_MAX_BYTES} (a 64-bit count)")
    raise _bad(f"byte size overflow for input '{name}': the bytes of 'shape' {shape} do not "
               f"fit a 64-bit count")


def _flatten(data: Any, shape: tuple[int, ...], name: str) -> tuple[list, set]:
    """`data` as one flat row-major list: either flat already, or nested exactly as `shape`
    says (every level a list of the dim's length, scalars only at the innermost); and
    the set of the types of its elements."""
    if not isinstance(data, list):
        raise _bad(f"input '{name}' 'data' must be a list, not {type(data).__name__}")
    types = set(map(type, data))  # one C-level pass instead of a Python loop
    if list not in types:
        return data, types
    if len(data) != (shape[0] if shape else 1):
        raise _bad(f"input '{name}' 'data' has {len(data)} items at the outer level but "
                   f"shape {list(shape)} needs {shape[0] if shape else 1}")
    level = data
    for depth in range(1, len(shape)):
        nxt: list = []
        want = shape[depth]
        for item in level:
            if type(item) is not list or len(item) != want:
                raise _bad(f"input '{name}' 'data' is ragged or nested unlike shape "
                           f"{list(shape)}: expected lists of {want} at depth {depth}")
            nxt.extend(item)
        level = nxt
    types = set(map(type, level))
    if list in types:
        raise _bad(f"input '{name}' 'data' is nested deeper than shape {list(shape)}")
    return level, types


def _json_tensor(name: str, datatype: str, shape: tuple[int, ...], data: Any) -> np.ndarray:
    flat, types = _flatten(data, shape, name)
    count = math.prod(shape)
    if len(flat) != count:
        _bad_count(name, len(flat), shape)
    return _typed(name, datatype, flat, types).reshape(shape)


def _bad_count(name: str, found: int, shape: tuple[int, ...]) -> None:
    raise _bad(f"input '{name}' has {found} elements in 'data' but shape {list(shape)} "
               f"needs {math.prod(shape)}")


def _typed(name: str, datatype: str, flat: list, types: set) -> np.ndarray:
    """The JSON values `flat` (of the Python `types`) as a 1-D array of `datatype`, after
    checking each is a value of it (400 naming the first that is not)."""
    dtype = DATATYPES[datatype]
    if datatype == "BOOL":
        if not types <= _BOOL_TYPES:
            raise _bad(f"input '{name}' is BOOL: 'data' must hold only true/false")
        return np.array(flat, dtype=dtype)
    if dtype.kind in "iu":
        if not types <= _INT_TYPES:
            bad = next(x for x in flat if type(x) is not int)
            raise _bad(f"input '{name}' is {datatype}: 'data' must hold integers, found {bad!r}")
        info = np.iinfo(dtype)
        if flat and (min(flat) < info.min or max(flat) > info.max):
            raise _bad(f"input '{name}' has a value outside {datatype}'s range "
                       f"[{info.min}, {info.max}]")
        return np.array(flat, dtype=dtype)
    # floats: JSON numbers (ints too; JSON has no NaN/Inf and orjson refuses them)
    if not types <= _NUMBER_TYPES:
        bad = next(x for x in flat if type(x) not in _NUMBER_TYPES)
        raise _bad(f"input '{name}' is {datatype}: 'data' must hold numbers, found {bad!r}")
    bound = _OVERFLOWS_FROM[datatype]
    if flat and not -bound < min(flat) <= max(flat) < bound:  # C-speed scans
        bad = next(x for x in flat if not -bound < x < bound)
        raise _bad(f"input '{name}' has the value {bad!r}, which does not fit {datatype} "
                   f"(largest finite {_LARGEST_FINITE[datatype]!r})")
    if datatype in _DIRECT_FLOATS:  # numpy rounds each number once, straight to dtype
        return np.array(flat, dtype=dtype)
    return np.array(flat, dtype=np.float64).astype(dtype)


# -- JSON tensor data of large requests ------------------------------------------------
#
# Parsed whole, the `data` of a large JSON request becomes a Python list of Python
# numbers: 32 bytes per element or more (8 of them the list's pointer), eight times the
# FP32 tensor, hundreds of megabytes for tens of megabytes of JSON. Heads over
# `_SPAN_HEAD_BYTES` are therefore parsed in two steps: each `"data": [...]` array is cut
# out of the bytes first (found outside JSON strings, its end by counting brackets with
# numpy, a window at a time) and a placeholder parsed in its place, so the JSON parser
# sees only the small rest; once the tensor's name, datatype and shape are known (and
# checked against the model, `check`), its data is parsed into the typed array it
# becomes, a slice of `_SPAN_CHUNK` bytes at a time: orjson parses the slice (the same
# JSON rules as the whole document), the values are checked as any JSON tensor's and
# written into the array. What is held at once is the array, one slice's Python numbers
# and the body: no list of the whole tensor is ever built.

_SPAN_HEAD_BYTES = 64 << 10
_SPAN_CHUNK = 256 << 10
_SPAN_WINDOW = 1 << 20
# what a large request's JSON may hold once its data arrays are cut out: each value
# becomes a Python object of 50+ bytes that the memory budget does not see (a 45 MB body
# of 800,000 one-value tensors peaked at 4 GB); no model takes more than a few dozen
# tensors, and a header of that many is a few thousand values
MAX_DATA_ARRAYS = 4096
_MAX_HEADER_VALUES = 65536
_SPAN_FIRST_WINDOW = 4 << 10
_DATA_OR_STRING = re.compile(rb'"data"\s*:\s*\[|"(?:[^"\\]|\\.)*"', re.S)
_NOT_SKELETON = bytes(b for b in range(256) if b not in b"[],")


class _DataSpan:
    """Where one cut-out `data` array lies in the request's bytes: [start, end)."""

    __slots__ = ("buffer", "start", "end")

    def __init__(self, buffer: bytes | bytearray, start: int, end: int) -> None:
        self.buffer = buffer
        self.start = start
        self.end = end


def _cut_data_spans(head: bytes | bytearray) -> tuple[bytes, dict[str, _DataSpan]]:
    """`head` with every `"data"` array replaced by a placeholder string (unguessable:
    a client cannot name one), and the spans by placeholder."""
    nonce = os.urandom(8).hex()
    json_nonce = nonce.encode()
    pieces: list[bytes] = []
    spans: dict[str, _DataSpan] = {}
    pos = last = 0
    while True:
        match = _DATA_OR_STRING.search(head, pos)
        if match is None:
            break
        if match.group()[-1:] != b"[" or not match.group().startswith(b'"data"'):
            pos = match.end()  # a string, skipped whole
            continue
        start = match.end() - 1
        end = _array_end(head, start)
        key = len(spans)
        if key == MAX_DATA_ARRAYS:
            raise _bad(f"request has more than {MAX_DATA_ARRAYS} 'data' arrays")
        spans[f"\x00{nonce}:{key}"] = _DataSpan(head, start, end)
        # the placeholder as JSON, made here: each small orjson.dumps result keeps a
        # ~4 KiB buffer (200,000 small arrays held 800 MB)
        pieces += (head[last:start], b'"\\u0000%s:%d"' % (json_nonce, key))
        pos = last = end
    if not spans:
        return head, spans
    pieces.append(head[last:])
    return b"".join(pieces), spans


def _check_header_values(head: bytes | bytearray) -> None:
    """400 when the JSON of a large request, its data arrays cut out, may hold more
    than `_MAX_HEADER_VALUES` values, before a parser makes an object of each: counted
    as its commas, at C speed and with no copy (commas inside strings count too; a
    header that has that many is not a client's honest one)."""
    if head.count(b",") > _MAX_HEADER_VALUES:
        raise _bad(f"request JSON has more than {_MAX_HEADER_VALUES} commas outside its "
                   f"tensors' data: too many values")


def _array_end(head: bytes | bytearray, start: int) -> int:
    """The index after the `]` closing the array that opens at `start`. A flat array
    (the common case) is found by a few byte searches; a nested one is scanned in
    windows that start small and double up to `_SPAN_WINDOW`, so a request of many
    small arrays costs about its size (a 1 MiB window per array cost minutes of CPU for
    200,000 of them)."""
    close = head.find(b"]", start)
    if close >= 0 and head.find(b"[", start + 1, close) < 0 and \
            head.find(b'"', start + 1, close) < 0 and head.find(b"{", start + 1, close) < 0:
        return close + 1
    depth = 0
    pos = start
    size = _SPAN_FIRST_WINDOW
    while pos < len(head):
        window = np.frombuffer(head, np.uint8, min(size, len(head) - pos), pos)
        size = min(size * 2, _SPAN_WINDOW)
        marks = np.flatnonzero((window == 0x5B) | (window == 0x5D) | (window == 0x22)
                               | (window == 0x7B))
        kinds = window[marks]
        brackets = (kinds == 0x5B) | (kinds == 0x5D)
        levels = np.cumsum(np.where(kinds[brackets] == 0x5B, 1, -1)) + depth
        closed = np.flatnonzero(levels == 0)
        if closed.size:
            levels = levels[:closed[0] + 1]
        limit = int(marks[brackets][closed[0]]) if closed.size else len(window)
        others = marks[~brackets]
        if others.size and others[0] < limit:
            raise _bad("a tensor's 'data' holds a string or an object: tensor data are "
                       "numbers or booleans")
        if levels.size and levels.max() > MAX_JSON_DEPTH:
            raise _bad(f"request JSON is nested deeper than {MAX_JSON_DEPTH} levels")
        if closed.size:
            return pos + limit + 1
        if levels.size:
            depth = int(levels[-1])
        pos += len(window)
    raise _bad("request body is not valid JSON: a 'data' array is not closed")


def _skeleton(shape: tuple[int, ...]) -> bytes:
    """The brackets and commas of JSON data nested exactly as `shape`."""
    level = b"[" + b"," * (shape[-1] - 1) + b"]" if shape[-1] else b"[]"
    for dim in reversed(shape[:-1]):
        level = b"[" + b",".join([level] * dim) + b"]" if dim else b"[]"
    return level


def _span_tensor(name: str, datatype: str, shape: tuple[int, ...], span: _DataSpan
                 ) -> np.ndarray:
    """The array of a cut-out `data` array (see above): flat, or nested exactly as
    `shape` says, every value checked as `_json_tensor` checks them."""
    buffer, start, end = span.buffer, span.start, span.end
    count = math.prod(shape)
    nested = buffer.find(b"[", start + 1, end) >= 0
    if nested:
        if not shape or buffer[start:end].translate(None, _NOT_SKELETON) != \
                _skeleton(shape):
            raise _bad(f"input '{name}' 'data' is ragged or nested unlike shape "
                       f"{list(shape)}")
        if not count:
            return np.empty(shape, DATATYPES[datatype])
    out = np.empty(count, DATATYPES[datatype])
    filled = 0
    pos, last = start + 1, end - 1
    while pos < last:
        stop = buffer.find(b",", pos + _SPAN_CHUNK, last) if last - pos > _SPAN_CHUNK else -1
        if stop < 0:
            stop = last
        piece = bytes(buffer[pos:stop])
        if nested:
            piece = piece.translate(None, b"[]")
        try:
            values = orjson.loads(b"[%b]" % piece)
        except ValueError as exc:
            raise _bad(f"input '{name}' 'data' is not valid JSON: {exc}") from None
        if filled + len(values) > count:
            _bad_count(name, filled + len(values), shape)  # at least that many
        out[filled:filled + len(values)] = _typed(name, datatype, values,
                                                  set(map(type, values)))
        filled += len(values)
        pos = stop + 1
    if filled != count:
        _bad_count(name, filled, shape)
    return out.reshape(shape)


_UINT64_MAX = (1 << 64) - 1
# request parameters Triton's HTTP frontend reads itself: the JSON types each may have
# (numbers within the uint64 range), and how an error says so
_PARAMETER_TYPES: dict[str, tuple[frozenset, str]] = {
    "sequence_id": (frozenset({int, str}), "a uint64 or a string"),
    "sequence_start": (_BOOL_TYPES, "true or false"),
    "sequence_end": (_BOOL_TYPES, "true or false"),
    "binary_data_output": (_BOOL_TYPES, "true or false"),
    "priority": (_INT_TYPES, "a uint64"),
    "timeout": (_INT_TYPES, f"a uint64 count of microseconds (an integer in [0, "
                            f"{_UINT64_MAX}])"),
}
_PARAMETER_VALUE_TYPES = frozenset({str, int, float, bool})


def _check_parameters(parameters: dict) -> None:
    """A request's `parameters` as Triton's HTTP frontend reads them, or a 400 naming
    the parameter: those it reads itself have their types (`sequence_id` a uint64 or a
    string, `sequence_start`/`sequence_end`/`binary_data_output` booleans, `priority`
    a uint64, `timeout` a uint64 count of microseconds: Triton reads both with
    `MemberAsUInt`, which refuses 1.5), every other value
    is a string, a number or a boolean (an object, a list or null is refused, so no
    nesting hides in it), and keys starting with `triton_` are reserved."""
    for key, value in parameters.items():
        kind = type(value)
        rule = _PARAMETER_TYPES.get(key)
        if rule is None:
            if kind not in _PARAMETER_VALUE_TYPES:
                raise _bad(f"parameter '{key}' has invalid type: it must be a string, a "
                           f"number or a boolean, not "
                           f"{kind.__name__ if value is not None else 'null'}")
            if key.startswith("triton_"):
                raise _bad(f"parameter '{key}': parameter keys starting with 'triton_' "
                           f"are reserved for Triton usage and should not be specified")
        elif kind not in rule[0] or kind in _NUMBER_TYPES and not 0 <= value <= _UINT64_MAX:
            raise _bad(f"parameter '{key}' must be {rule[1]}, not "
                       f"{orjson.dumps(value).decode()[:40]}")


def _no_shared_memory(params: dict, kind: str, name: str) -> None:
    """A tensor placed in a shared-memory region is a 400 saying so: the server offers
    neither shared-memory extension (Triton answers 400 for a region not registered)."""
    if "shared_memory_region" in params:
        raise _bad(f"{kind} '{name}' names shared_memory_region "
                   f"{orjson.dumps(params['shared_memory_region']).decode()[:80]}: the "
                   f"shared-memory extensions are not supported; send the data in the body")


def _no_classification(params: dict, name: str) -> None:
    """Output `name`'s `classification` parameter as Triton reads it, a uint64 class
    count (anything else, null too, is a 400), where 0 asks for the output as it is; a
    count asks for Triton's classification extension, which is not offered (400 saying
    so). JSON integers are within the uint64 range or negative (orjson)."""
    count = params.get("classification", 0)
    if type(count) is not int or count < 0:
        raise _bad(f"output '{name}' parameter 'classification' must be a non-negative "
                   f"integer (a class count), not {orjson.dumps(count).decode()[:40]}")
    if count or params.get("class_count"):
        raise _bad(f"output '{name}': the classification extension is not supported (it "
                   f"is not in the server metadata's extensions); ask for the output "
                   f"itself")


def _bad_datatype(name: str, datatype: Any) -> None:
    """Raises the 400 for an input whose datatype is missing or not one we take."""
    if not isinstance(datatype, str):
        raise _bad(f"input '{name}' has no 'datatype'")
    if datatype in _UNSUPPORTED:
        raise _bad(f"input '{name}': {_UNSUPPORTED[datatype]}")
    raise _bad(f"input '{name}' has unknown datatype {datatype!r}; supported: "
               f"{', '.join(DATATYPES)}")


def _check_depth(head: bytes | memoryview) -> None:
    """400 if the JSON nests deeper than MAX_JSON_DEPTH (checked on the bytes, in C-speed
    steps, before a recursive parser sees them)."""
    if len(head) <= MAX_JSON_DEPTH:  # cannot open more brackets than it has bytes
        return
    if type(head) is memoryview:
        head = head.tobytes()
    if head.count(b"[") + head.count(b"{") <= MAX_JSON_DEPTH:
        return
    brackets = _JSON_STRING.sub(b"", head).translate(None, _NOT_BRACKETS)
    steps = np.frombuffer(brackets, np.uint8)
    opening = (steps == ord("[")) | (steps == ord("{"))
    depth = np.cumsum(np.where(opening, 1, -1), dtype=np.int64)
    if depth.size and depth.max() > MAX_JSON_DEPTH:
        raise _bad(f"request JSON is nested deeper than {MAX_JSON_DEPTH} levels")


def split_body(body: bytes, header_length: str | None) -> tuple[bytes | memoryview,
                                                                memoryview]:
    """The JSON header and the binary tail of a request body (views: nothing copied)."""
    if header_length is None:
        return body, _EMPTY
    text = header_length if header_length.isdecimal() else header_length.strip(" \t")
    if not text.isdecimal() or len(text) > 20:  # int() takes '+5', '1_0' and '-1' too
        raise _bad(f"Inference-Header-Content-Length must be an integer of at most 20 "
                   f"decimal digits, not {header_length[:40]!r}")
    n = int(text)
    if not 0 < n <= len(body):
        raise _bad(f"Inference-Header-Content-Length {n} is outside the body of "
                   f"{len(body)} bytes (it must be in (0, {len(body)}])")
    view = memoryview(body)
    return view[:n], view[n:]


_EMPTY = memoryview(b"")
_ABSENT = object()  # a request without "outputs" (null is refused: not an array)


class _TensorPlan:
    """The tensors a request's JSON header names, checked once: the inputs (with where
    each binary one lies in the bytes after the header) and the outputs asked for.
    Read-only once made."""

    __slots__ = ("inputs", "datatypes", "outputs", "binary_bytes", "reusable")

    def __init__(self, inputs: list[tuple], datatypes: dict[str, str],
                 outputs: list[RequestedOutput] | None, binary_bytes: int,
                 reusable: bool) -> None:
        # (name, dtype, shape, offset of its bytes or -1, its JSON-given array or None)
        self.inputs = inputs
        self.datatypes = datatypes
        self.outputs = outputs
        self.binary_bytes = binary_bytes
        self.reusable = reusable  # every input binary: the plan fits any tensor data


class _HeaderPlan:
    """What a request's JSON header says, checked once: its id, parameters and tensors
    (`_TensorPlan`). A header whose inputs are all binary describes every request that
    sends the same header bytes, whatever their tensors hold: such plans are kept by those
    bytes (`_PLANS`), so a client repeating a header (most do: same shapes, same options)
    pays neither the JSON parse nor the checks again. A header that opens with a plain
    string id (`{"id": "42", ...`; tritonclient and perf_analyzer put it there, and many
    clients send a new one with every request) is kept by the bytes after that id instead
    (`_plan_key`): a new id still finds the plan, and unique ids do not push the plans of
    other clients out. The parts a plan hands to requests (the parameters, the outputs,
    the datatypes) are shared between them: read-only."""

    __slots__ = ("id", "parameters", "binary_output", "tensors")

    def __init__(self, request_id: str | None, parameters: dict[str, Any],
                 binary_output: bool, tensors: _TensorPlan) -> None:
        self.id = request_id
        self.parameters = parameters
        self.binary_output = binary_output
        self.tensors = tensors

    def request(self, tail: bytes | memoryview, request_id: str | None = None
                ) -> InferRequest:
        """The request of this header whose binary tensors are `tail` (of exactly
        `binary_bytes`): arrays viewing it, nothing copied. `request_id` is its id when
        the plan was found by the bytes after it (`_plan_key`); else the plan's own."""
        tensors = self.tensors
        inputs = {}
        for name, dtype, shape, offset, array in tensors.inputs:
            if offset >= 0:
                array = np.ndarray(shape, dtype, tail, offset)
                if dtype.kind == "b" and array.size and array.view(np.uint8).max() > 1:
                    raise _bad(f"input '{name}' is BOOL: binary bytes must be 0 or 1")
            inputs[name] = array
        return InferRequest(self.id if request_id is None else request_id, inputs,
                            tensors.datatypes, tensors.outputs, self.binary_output,
                            self.parameters)


_PLANS: dict[bytes, _HeaderPlan] = {}
_PLANS_KEPT = 1024
_PLANS_LOCK = threading.Lock()  # adding one (large bodies are parsed on worker threads)
_PLAN_HEAD_BYTES = 4096


def _keep(plans: dict, key: bytes, plan: Any, kept: int) -> None:
    """Adds `plan` to `plans` under `key`, the oldest going beyond `kept`."""
    with _PLANS_LOCK:
        if len(plans) >= kept:
            plans.pop(next(iter(plans)), None)
        plans[key] = plan


Check = Callable[[str, str, tuple[int, ...]], None]
Charge = Callable[[int, str], None]


def parse_infer_request(body: bytes | bytearray, header_length: str | None = None, *,
                        check: Check | None = None, charge: Charge | None = None
                        ) -> InferRequest:
    """Parses an inference request body (JSON, optionally followed by binary tensors).

    For large bodies: `check(name, datatype, shape)` is called for each input given as
    JSON data before its data is parsed (to refuse, raising ProtocolError, what the model
    would refuse anyway), and `charge(nbytes, what)` before its array is made (to charge
    them to a memory budget; it raises to refuse)."""
    if header_length is None:  # all JSON
        head, tail = body, _EMPTY
    else:
        head, tail = split_body(body, header_length)
    key = request_id = None
    if header_length is not None and len(head) <= _PLAN_HEAD_BYTES:
        key = bytes(head)
        plan = _PLANS.get(key)
        if plan is None:
            key, request_id = _plan_key(key)
            if request_id is not None:
                plan = _PLANS.get(key)
        if plan is not None and plan.tensors.binary_bytes == len(tail):
            return plan.request(tail, request_id)
    plan = _plan_header(head, len(tail), check, charge)
    request = plan.request(tail)
    if key is not None and plan.tensors.reusable:
        if request_id is not None:  # kept without its id: it serves every id
            plan = _HeaderPlan(None, plan.parameters, plan.binary_output, plan.tensors)
        _keep(_PLANS, key, plan, _PLANS_KEPT)
    return request


# a header opening with an id that is a plain JSON string (no escapes, no control
# characters), then more members; the rest of the header after that id's comma
_LEADING_ID = re.compile(rb'\{[ \t\r\n]*"id"[ \t\r\n]*:[ \t\r\n]*"([^"\\\x00-\x1f]*)"[ \t\r\n]*,')


def _plan_key(head: bytes) -> tuple[bytes, str | None]:
    """The key of a header's plan in `_PLANS` when its own bytes found none, and the
    request id cut out of it (None: the key is the header's bytes). A leading plain,
    non-empty string id is cut when nothing after it could name another id (JSON takes
    the last of repeated names): the key is then a NUL byte, which no header that
    parses begins with (so no header's own bytes are ever such a key), and the bytes
    after the id. An empty id (perf_analyzer sends `"id":""` on every request) is the
    same every time: such a header stays keyed by its bytes, found at the first look."""
    found = _LEADING_ID.match(head)
    if found is None:
        return head, None
    value, rest = found.group(1), head[found.end():]
    if not value or b'"id"' in rest or b"\\u" in rest:  # "i\u0064" is "id" too
        return head, None
    try:
        request_id = value.decode("utf-8")
    except UnicodeDecodeError:  # refused by the full parse
        return head, None
    return b"\0" + rest, request_id


def _plan_header(head: bytes | bytearray | memoryview, tail_bytes: int,
                 check: Check | None = None, charge: Charge | None = None) -> _HeaderPlan:
    """Parses and checks a request's JSON header, followed by `tail_bytes` binary bytes."""
    spans: dict[str, _DataSpan] = {}
    if len(head) > _SPAN_HEAD_BYTES:
        head, spans = _cut_data_spans(head.tobytes() if type(head) is memoryview else head)
        _check_header_values(head)
    _check_depth(head)
    try:
        doc = orjson.loads(head)
    except ValueError as exc:  # JSONDecodeError (bad UTF-8, integers beyond 64 bits too)
        raise _bad(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise _bad(f"request JSON is nested deeper than {MAX_JSON_DEPTH} levels") from None
    if not isinstance(doc, dict):
        raise _bad("request body must be a JSON object")
    request_id = doc.get("id", _ABSENT)
    if request_id is _ABSENT:
        request_id = None
    elif type(request_id) is not str:  # null too, as Triton: a string when present
        raise _bad(f"'id' must be a string, not "
                   f"{type(request_id).__name__ if request_id is not None else 'null'}")
    parameters = doc.get("parameters", {})
    if type(parameters) is not dict:  # null too, as Triton: an object when present
        raise _bad(f"'parameters' must be a JSON object, not "
                   f"{orjson.dumps(parameters).decode()[:40]}")
    if parameters:
        _check_parameters(parameters)
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise _bad("request must have a non-empty 'inputs' list")
    binary_output = parameters.get("binary_data_output") is True
    tensors = _tensor_plan(raw_inputs, doc.get("outputs", _ABSENT), tail_bytes, spans,
                           check, charge)
    _no_repeated_keys(head, doc, len(spans))
    return _HeaderPlan(request_id, parameters, binary_output, tensors)


def _no_repeated_keys(head: bytes | bytearray | memoryview, doc: dict,
                      placeholders: int) -> None:
    """400 when an object of the request names a key twice. JSON parsers disagree on
    which value wins (orjson the last, Triton's RapidJSON the first), so a proxy or
    filter in front that reads one could pass a request that runs the other. Checked
    after the rest (the request is otherwise valid): when the header's colons are as
    many as the keys of the objects a request has (the top, its parameters, each tensor
    and its parameters; each cut-out data placeholder holds one colon), no object
    repeats one; otherwise (a colon inside a string, objects nested in parameters, or a
    repeat) the header is parsed again keeping every key."""
    if type(head) is memoryview:
        head = head.tobytes()
    keys = len(doc)
    params = doc.get("parameters")
    if type(params) is dict:
        keys += len(params)
    for member in ("inputs", "outputs"):
        items = doc.get(member)
        if type(items) is list:
            for item in items:
                keys += len(item)
                params = item.get("parameters")
                if type(params) is dict:
                    keys += len(params)
    if head.count(b":") - placeholders == keys:
        return
    repeated: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict:
        obj = dict(items)
        if len(obj) != len(items) and not repeated:
            names = [name for name, _ in items]
            repeated.append(next(n for n in names if names.count(n) > 1))
        return obj

    json.loads(head, object_pairs_hook=pairs)
    if repeated:
        raise _bad(f"request JSON repeats the key {repeated[0][:100]!r} in one object: "
                   f"JSON parsers disagree on which value counts; send each key once")


def _tensor_plan(raw_inputs: list, raw_outputs: Any, tail_bytes: int,
                 spans: dict[str, _DataSpan] | None = None, check: Check | None = None,
                 charge: Charge | None = None) -> _TensorPlan:
    """Checks a header's inputs (followed by `tail_bytes` binary bytes) and outputs;
    `spans`, `check` and `charge` as `parse_infer_request` and `_cut_data_spans` say."""
    inputs: list[tuple] = []
    datatypes: dict[str, str] = {}
    offset = 0
    all_binary = True
    for i, item in enumerate(raw_inputs):
        if type(item) is not dict:  # orjson makes exactly dicts, lists and strs
            raise _bad(f"inputs[{i}] must be a JSON object")
        name = item.get("name")
        if type(name) is not str or not name:
            raise _bad(f"inputs[{i}] has no 'name'")
        if name in datatypes:
            raise _bad(f"input '{name}' appears more than once")
        datatype = item.get("datatype")
        if type(datatype) is not str or datatype not in DATATYPES:
            _bad_datatype(name, datatype)
        dtype = DATATYPES[datatype]
        shape = _shape(item.get("shape"), name, dtype.itemsize)
        params = item.get("parameters")
        size = None
        if params is not None:
            params = _as_dict(params, "input '{}' 'parameters'", name)
            _no_shared_memory(params, "input", name)
            size = params.get("binary_data_size")
        if size is not None:
            if "data" in item:
                raise _bad(f"input '{name}' has both 'data' and binary_data_size")
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise _bad(f"input '{name}' binary_data_size must be a non-negative integer")
            want = math.prod(shape) * dtype.itemsize
            if size != want:
                raise _bad(f"input '{name}' binary_data_size is {size} bytes but shape "
                           f"{list(shape)} of {datatype} needs {want}")
            if offset + size > tail_bytes:
                raise _bad(f"input '{name}' needs {size} binary bytes at offset {offset} but "
                           f"the body has only {tail_bytes} after the JSON header")
            inputs.append((name, dtype, shape, offset, None))
            offset += size
        else:
            if "data" not in item:
                raise _bad(f"input '{name}' has neither 'data' nor binary_data_size")
            data = item["data"]
            if check is not None:
                check(name, datatype, shape)
            if charge is not None:
                charge(math.prod(shape) * dtype.itemsize, f"input '{name}'")
            span = spans.get(data) if spans and type(data) is str else None
            array = _json_tensor(name, datatype, shape, data) if span is None else \
                _span_tensor(name, datatype, shape, span)
            inputs.append((name, dtype, shape, -1, array))
            all_binary = False
        datatypes[name] = datatype
    if offset != tail_bytes:
        raise _bad(f"the body has {tail_bytes - offset} binary bytes that no input claims")

    outputs = None
    if raw_outputs is not _ABSENT:
        if not isinstance(raw_outputs, list):  # null too: the protocol says an array
            raise _bad(f"'outputs' must be a list of requested outputs, not "
                       f"{orjson.dumps(raw_outputs).decode()[:40]}")
        outputs = []
        seen = set()
        for i, item in enumerate(raw_outputs):
            name = item.get("name") if type(item) is dict else None
            if type(name) is not str:
                raise _bad(f"outputs[{i}] must be an object with a 'name'")
            oparams = item.get("parameters")
            binary = None
            if oparams is not None:
                oparams = _as_dict(oparams, "output '{}' 'parameters'", name)
                _no_shared_memory(oparams, "output", name)
                if "classification" in oparams or oparams.get("class_count"):
                    _no_classification(oparams, name)
                binary = oparams.get("binary_data", _ABSENT)
                if binary is _ABSENT:
                    binary = None
                elif type(binary) is not bool:  # null too, as Triton's AsBool
                    raise _bad(f"output '{name}' parameter 'binary_data' must be true or "
                               f"false, not {orjson.dumps(binary).decode()[:40]}")
            if name in seen:
                raise _bad(f"output '{name}' already exists in request (requested more "
                           f"than once)")
            seen.add(name)
            outputs.append(RequestedOutput(name, binary))
    # an empty list asks for no output in particular: every output, as Triton answers it
    return _TensorPlan(inputs, datatypes, outputs or None, offset, all_binary)


def build_infer_response(
    model_name: str,
    model_version: str,
    request: InferRequest,
    results: list[tuple[str, str, np.ndarray]],
) -> tuple[bytes, int | None]:
    """The response body for `results` [(name, datatype, array)], filtered and encoded as
    `request` asked. Returns (body, json_header_length or None when all JSON).

    A JSON output of more than `JSON_SLICE_ELEMENTS` values is written a slice at a time
    (see `encodes_in_slices`), the same bytes as in one piece."""
    out_docs = []
    tails: list[bytes | memoryview] = []
    sliced = False
    for (name, datatype, array), binary in _wanted(request, results):
        if binary:
            data = _bytes_of(array, DATATYPES[datatype])
            out_docs.append({"name": name, "datatype": datatype, "shape": list(array.shape),
                             "parameters": {"binary_data_size": len(data)}})
            tails.append(data)
            continue
        flat = array.reshape(-1)
        if flat.dtype.kind == "V" or flat.dtype.type.__module__.startswith("ml_dtypes"):
            flat = flat.astype(np.float32)  # bf16: exact in f32, JSON numbers
        # orjson writes the array itself (no Python list)
        out_docs.append({"name": name, "datatype": datatype, "shape": list(array.shape),
                         "data": flat})
        sliced = sliced or flat.size > JSON_SLICE_ELEMENTS
    response: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request.id:  # an empty id is not echoed, as Triton's frontend
        response["id"] = request.id
    if sliced:
        head = _dumps_sliced(response, out_docs)
    else:
        response["outputs"] = out_docs
        head = orjson.dumps(response, option=orjson.OPT_SERIALIZE_NUMPY)
    if not tails:
        return head, None
    return b"".join([head, *tails]), len(head)


# -- JSON data of large answers --------------------------------------------------------
#
# orjson holds the interpreter lock for the whole of one call: a million FP32 values
# (10 MB of JSON) take 30-110 ms, during which no other thread of the server runs, the
# event loop included. A JSON output of more than `JSON_SLICE_ELEMENTS` values is therefore
# encoded one slice at a time (about 1-2 ms each); between two slices the interpreter can
# hand the lock to a thread that waits for it (after its switch interval, 5 ms), so the
# loop is never kept out for much longer than one slice. On the loop itself that would not
# help: there, an answer `encodes_in_slices` is built on a worker thread. One large answer
# is encoded at a time (`_ONE_ENCODER`): the encoding holds the interpreter lock anyway,
# so two at once would finish no sooner, and each thread waiting for the interpreter lock
# is one more the loop must win it from (with four encoding at once the loop stalled up
# to 66 ms; with one, under the same load, see docs/performance.md).

JSON_SLICE_ELEMENTS = 16 << 10
_NUMPY = orjson.OPT_SERIALIZE_NUMPY
_ONE_ENCODER = threading.Lock()


def _wanted(request: InferRequest, results: list[tuple[str, str, np.ndarray]]
            ) -> list[tuple[tuple[str, str, np.ndarray], bool | None]]:
    """[(result, binary)] of the outputs `request` asked for, in the order it asked."""
    asked = request.outputs
    if asked is None:
        binary = request.binary_output
        return [(result, binary) for result in results]
    by_name = {result[0]: result for result in results}
    return [(by_name[o.name], request.binary_output if o.binary is None else o.binary)
            for o in asked]


def encodes_in_slices(request: InferRequest, results: list[tuple[str, str, np.ndarray]]
                      ) -> bool:
    """Whether `build_infer_response` writes a JSON output of `results` a slice at a time
    (so it takes long enough that the event loop must hand it to a thread)."""
    for result in results:  # a plain loop: no generator per answer
        if result[2].size > JSON_SLICE_ELEMENTS:
            break
    else:
        return False
    return any(not binary and result[2].size > JSON_SLICE_ELEMENTS
               for result, binary in _wanted(request, results))


def _dumps_sliced(response: dict[str, Any], out_docs: list[dict]) -> bytes:
    """What `orjson.dumps({**response, "outputs": out_docs})` writes, byte for byte, with
    each large `data` array encoded a slice at a time (see above)."""
    parts: list[bytes | memoryview] = [orjson.dumps(response)[:-1], b',"outputs":[']
    for doc in out_docs:
        data = doc.get("data")
        if data is None or data.size <= JSON_SLICE_ELEMENTS:
            parts += (orjson.dumps(doc, option=_NUMPY), b",")
            continue
        head = orjson.dumps({key: doc[key] for key in ("name", "datatype", "shape")})
        parts += (head[:-1], b',"data":[')
        with _ONE_ENCODER:
            for start in range(0, data.size, JSON_SLICE_ELEMENTS):
                text = orjson.dumps(data[start:start + JSON_SLICE_ELEMENTS], option=_NUMPY)
                parts += (memoryview(text)[1:-1], b",")
        parts[-1] = b"]},"
    parts[-1] = parts[-1][:-1] + b"]}"
    return b"".join(parts)


def _bytes_of(array: np.ndarray, dtype: np.dtype) -> bytes | memoryview:
    """The bytes of `array` as `dtype` (little-endian, row-major). A big array of that
    dtype already is a view when it is contiguous (say, a batch-mate's rows): its one
    copy is the join into the body."""
    if array.dtype == dtype and array.nbytes <= _SMALL_BYTES:
        return array.tobytes()  # one small copy beats making a view
    return memoryview(np.ascontiguousarray(array, dtype=dtype).reshape(-1)
                      .view(np.uint8))  # bf16 has no buffer format


_SMALL_BYTES = 64 << 10

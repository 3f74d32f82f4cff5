"""The request gates a model version derives at load accept exactly what its full check
accepts, with the same arguments; whatever they turn away, the full check names."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from tinyhal.server.protocol import ProtocolError, parse_infer_request
from tinyhal.server.repository import ModelVersion, RequestGates, TensorSpec

SIGNATURES = [
    # (inputs, max_batch_size)
    ([TensorSpec("x", "FP32", (-1, 16))], 64),
    ([TensorSpec("x", "FP32", (-1, 16))], 0),
    ([TensorSpec("x", "FP32", (4, 16))], 0),
    ([TensorSpec("x", "FP32", (4, 16))], 2),
    ([TensorSpec("x", "FP32", (-1,)), TensorSpec("n", "INT32", (-1, 2, 3))], 8),
]
OUTPUTS = [TensorSpec("y", "FP32", (-1, 4))]
SHAPES = [(1, 16), (4, 16), (2, 16), (0, 16), (65, 16), (16,), (1, 15), (1, 16, 1), (3,),
          (3, 2, 3), (9, 2, 3), (2, 3, 2)]


def _version(inputs: list[TensorSpec], max_batch_size: int) -> ModelVersion:
    """A version with this signature and no gates: `prepare` is the full check."""
    mv = ModelVersion("m", "1", Path("m/1/model.vmfb"), {}, "sync")
    mv.inputs, mv.outputs, mv.max_batch_size = inputs, OUTPUTS, max_batch_size
    return mv


def _request(tensors: list[tuple[str, str, tuple[int, ...]]], outputs: list[str] | None):
    doc: dict = {"inputs": [{"name": n, "datatype": d, "shape": list(s),
                             "data": np.zeros(s, np.float32 if d == "FP32" else np.int32)
                             .ravel().tolist()} for n, d, s in tensors]}
    if outputs is not None:
        doc["outputs"] = [{"name": o} for o in outputs]
    return parse_infer_request(json.dumps(doc).encode())


def _full(mv: ModelVersion, request) -> list | str:
    try:
        return mv.prepare(request)
    except ProtocolError as exc:
        assert exc.status == 400
        return exc.message


@pytest.mark.parametrize("inputs,max_batch_size", SIGNATURES)
def test_gates_accept_exactly_what_the_full_check_accepts(inputs, max_batch_size):
    gates = RequestGates.of(inputs, OUTPUTS, max_batch_size)
    assert gates is not None
    mv = _version(inputs, max_batch_size)
    names = [(s.name, s.datatype) for s in inputs]
    cases = 0
    for shapes in itertools.product(SHAPES, repeat=len(inputs)):
        for outputs in (None, ["y"], ["z"]):
            for datatypes in (None, "INT8"):
                tensors = [(n, datatypes or d, s) for (n, d), s in zip(names, shapes)]
                request = _request(tensors, outputs)
                full = _full(mv, request)
                fast = gates.arguments(request)
                if isinstance(full, str):
                    assert fast is None, (tensors, outputs, full)
                else:
                    assert fast is not None and all(a is b for a, b in zip(fast, full)), \
                        (tensors, outputs)
                cases += 1
    assert cases >= 36


def test_a_request_missing_or_adding_an_input_is_not_let_through():
    inputs = [TensorSpec("x", "FP32", (-1,)), TensorSpec("n", "INT32", (-1, 2, 3))]
    gates = RequestGates.of(inputs, OUTPUTS, 8)
    assert gates.arguments(_request([("x", "FP32", (3,))], None)) is None
    assert gates.arguments(_request([("x", "FP32", (3,)), ("n", "INT32", (3, 2, 3)),
                                     ("extra", "FP32", (1,))], None)) is None
    assert gates.arguments(_request([("n", "INT32", (3, 2, 3)), ("x", "FP32", (3,))],
                                    None)) is not None  # any order in the request


@pytest.mark.parametrize("inputs", [
    [TensorSpec("alpha", "FP32", (1,), scalar=True), TensorSpec("x", "FP32", (-1,))],
    [TensorSpec("x", "FP32", (-1, -1))],
    [TensorSpec("x", "FP32", ())],
])
def test_signatures_the_gates_cannot_express_take_the_full_check(inputs):
    assert RequestGates.of(inputs, OUTPUTS, 0) is None

"""KServe V2 BF16 through a real tinyhal-serve (public HTTP API only): JSON and binary
tensors in and out, bit-identical to iree.runtime on the same module."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
from serve_helpers import write_model

from support.iree_tools import HOST_FLAGS, compile_mlir

BF16_MLIR = """
func.func @main(%x: tensor<?xbf16> {iree.abi.name = "x"}, %y: tensor<?xbf16> {iree.abi.name = "y"})
    -> (tensor<?xbf16> {iree.abi.name = "sum"}) {
  %0 = arith.addf %x, %y : tensor<?xbf16>
  return %0 : tensor<?xbf16>
}
"""


def test_bf16_tensors_in_and_out(tmp_path, start_server):
    import iree.runtime as rt

    vmfb = compile_mlir(BF16_MLIR, HOST_FLAGS)
    write_model(tmp_path, "bf16_add", vmfb)
    server = start_server("--model-repository", str(tmp_path), "--device", "sync")
    x = np.array([1.5, -2.25, 3.14159, 1e30, -0.0, 65504], ml_dtypes.bfloat16)
    y = np.array([0.1, 0.2, 0.3, 1e30, 0.0, 16], ml_dtypes.bfloat16)
    oracle = rt.load_vm_flatbuffer_file(str(vmfb), driver="local-sync")
    want = np.asarray(oracle.main(x, y))
    assert want.dtype == np.dtype(ml_dtypes.bfloat16)

    status, _, body = server.request("GET", "/v2/models/bf16_add")
    assert status == 200
    meta = json.loads(body)
    assert {t["datatype"] for t in meta["inputs"] + meta["outputs"]} == {"BF16"}

    request = {"inputs": [
        {"name": "x", "shape": [6], "datatype": "BF16", "data": x.astype(float).tolist()},
        {"name": "y", "shape": [6], "datatype": "BF16", "data": y.astype(float).tolist()}]}
    status, _, body = server.request("POST", "/v2/models/bf16_add/infer", request)
    assert status == 200, body
    (out,) = json.loads(body)["outputs"]
    assert (out["name"], out["datatype"], out["shape"]) == ("sum", "BF16", [6])
    got = np.array(out["data"], np.float32).astype(ml_dtypes.bfloat16)
    assert got.tobytes() == want.tobytes()

    # binary tensors: raw little-endian bf16 bits both ways
    head = json.dumps({
        "inputs": [{"name": n, "shape": [6], "datatype": "BF16",
                    "parameters": {"binary_data_size": 12}} for n in ("x", "y")],
        "parameters": {"binary_data_output": True}}).encode()
    status, headers, body = server.request(
        "POST", "/v2/models/bf16_add/infer", head + x.tobytes() + y.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(head)),
                 "Content-Type": "application/octet-stream"})
    assert status == 200, body
    n = int(headers["inference-header-content-length"])
    (out,) = json.loads(body[:n])["outputs"]
    assert out["datatype"] == "BF16" and out["parameters"]["binary_data_size"] == 12
    assert body[n:] == want.tobytes()

"""`tinyhal-serve --executable-policy portable`: a model compiled to VMVX is served with
iree.runtime's bits over tritonclient, on every driver; a model compiled to machine code
(llvm-cpu) is refused, UNAVAILABLE with the policy named, and the server keeps serving."""

from __future__ import annotations

import numpy as np
import tritonclient.http as httpclient
from serve_helpers import write_model

from support.iree_tools import HOST_FLAGS, compile_mlir

VMVX = ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=vmvx",
        "--iree-vmvx-enable-microkernels"]

DENSE = """
func.func @main(%x: tensor<2x16xf32>) -> tensor<2x8xf32> {
  %w = arith.constant dense<0.125> : tensor<16x8xf32>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<2x8xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<2x8xf32>) -> tensor<2x8xf32>
  %m = linalg.matmul ins(%x, %w : tensor<2x16xf32>, tensor<16x8xf32>)
                     outs(%f : tensor<2x8xf32>) -> tensor<2x8xf32>
  %y = math.exp %m : tensor<2x8xf32>
  return %y : tensor<2x8xf32>
}
"""


def test_portable_policy_serves_vmvx_and_refuses_machine_code(tmp_path, start_server):
    import iree.runtime as rt

    portable = compile_mlir(DENSE, VMVX)
    native = compile_mlir(DENSE, HOST_FLAGS)
    for driver in ("sync", "task", "emu"):
        write_model(tmp_path, f"dense_{driver}", portable, {"device": driver})
    write_model(tmp_path, "native", native)
    x = np.linspace(-2, 3, 32, dtype=np.float32).reshape(2, 16)
    config = rt.Config("local-task")
    module = rt.VmModule.mmap(config.vm_instance, str(portable))
    expected = rt.SystemContext(vm_modules=[module], config=config
                                ).modules.module["main"](x).to_host()

    server = start_server("--model-repository", str(tmp_path), "--no-exit-on-error",
                          "--executable-policy", "portable")
    client = httpclient.InferenceServerClient(server.url, network_timeout=60.0)
    for driver in ("sync", "task", "emu"):
        name = f"dense_{driver}"
        metadata = client.get_model_metadata(name)
        inp = httpclient.InferInput(metadata["inputs"][0]["name"], [2, 16], "FP32")
        inp.set_data_from_numpy(x)
        got = client.infer(name, [inp]).as_numpy(metadata["outputs"][0]["name"])
        assert got.tobytes() == expected.tobytes(), driver
    assert not client.is_model_ready("native")
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert "executable policy 'portable'" in index["native"]["reason"]

"""tinyhal-serve serves a model compiled with external parameters: the parameter file
sits beside `model.vmfb` and `config.json` names it; tritonclient gets iree.runtime's
bits, and /metrics shows the parameter memory apart from the invocations' peaks."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import tritonclient.http as httpclient

from support.iree_tools import HOST_FLAGS, compile_mlir

pytestmark = pytest.mark.timeout(180)

AFFINE = """
util.global private @w = #stream.parameter.named<"model"::"w"> : tensor<16x8xf32>
util.global private @b = #stream.parameter.named<"model"::"b"> : tensor<8xf32>
func.func @affine(%x: tensor<2x16xf32> {iree.abi.name = "x"})
    -> (tensor<2x8xf32> {iree.abi.name = "y"}) {
  %w = util.global.load @w : tensor<16x8xf32>
  %b = util.global.load @b : tensor<8xf32>
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<2x8xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<2x8xf32>) -> tensor<2x8xf32>
  %m = linalg.matmul ins(%x, %w : tensor<2x16xf32>, tensor<16x8xf32>)
                     outs(%f : tensor<2x8xf32>) -> tensor<2x8xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>,
                                        affine_map<(i, j) -> (j)>,
                                        affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%m, %b : tensor<2x8xf32>, tensor<8xf32>) outs(%e : tensor<2x8xf32>) {
  ^bb0(%a: f32, %c: f32, %o: f32):
    %s = arith.addf %a, %c : f32
    linalg.yield %s : f32
  } -> tensor<2x8xf32>
  return %r : tensor<2x8xf32>
}
"""


def test_parameterized_model_served_with_parameter_memory_metric(tmp_path, start_server):
    import iree.runtime as rt
    from safetensors.numpy import save_file

    vmfb = compile_mlir(AFFINE, HOST_FLAGS)
    w = (np.arange(128, dtype=np.float32).reshape(16, 8) - 60) / 16
    b = np.linspace(-1, 1, 8, dtype=np.float32)
    for name, device in (("affine_task", "task"), ("affine_emu", "emu")):
        version = tmp_path / name / "1"
        version.mkdir(parents=True)
        shutil.copyfile(vmfb, version / "model.vmfb")
        save_file({"w": w, "b": b}, str(version / "weights.safetensors"))
        (tmp_path / name / "config.json").write_text(json.dumps(
            {"device": device, "parameters": {"model": "weights.safetensors"}}))
    bad = tmp_path / "escapes" / "1"
    bad.mkdir(parents=True)
    shutil.copyfile(vmfb, bad / "model.vmfb")
    (bad / "config.json").write_text(json.dumps({"parameters": {"model": "../../x.irpa"}}))

    x = np.linspace(-2, 3, 32, dtype=np.float32).reshape(2, 16)
    config = rt.Config("local-sync")
    index = rt.ParameterIndex()
    index.load(str(tmp_path / "affine_task" / "1" / "weights.safetensors"))
    params = rt.create_io_parameters_module(config.vm_instance,
                                            index.create_provider(scope="model"))
    main = rt.VmModule.mmap(config.vm_instance, str(vmfb))
    expected = rt.SystemContext(vm_modules=[params, main], config=config
                                ).modules.module["affine"](x).to_host()

    server = start_server("--model-repository", str(tmp_path), "--no-exit-on-error")
    client = httpclient.InferenceServerClient(server.url, network_timeout=60.0)
    for name in ("affine_task", "affine_emu"):
        inp = httpclient.InferInput("x", [2, 16], "FP32")
        inp.set_data_from_numpy(x)
        got = client.infer(name, [inp]).as_numpy("y")
        assert got.tobytes() == expected.tobytes()
    assert not client.is_model_ready("escapes")
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert "not inside" in index["escapes"]["reason"]

    metrics = server.metrics()
    for name, device in (("affine_task", "task"), ("affine_emu", "emu")):
        labels = (("device", device), ("model", name), ("version", "1"))
        held = metrics[("tinyhal_model_parameter_bytes", labels)]
        assert held == w.nbytes + b.nbytes
        assert metrics[("tinyhal_model_parameter_peak_bytes", labels)] == held
        peak = metrics.get(("tinyhal_model_memory_peak_bytes", labels))
        assert peak is None or peak < held + 4096  # invocations do not hold the weights


def test_poll_reloads_a_model_whose_parameter_file_was_replaced(tmp_path, start_server):
    """Triton's poll reloads a model when any file of it changed: here the weights
    beside an unchanged model.vmfb and config.json, written again in place."""
    from safetensors.numpy import save_file

    vmfb = compile_mlir(AFFINE, HOST_FLAGS)
    version = tmp_path / "affine" / "1"
    version.mkdir(parents=True)
    shutil.copyfile(vmfb, version / "model.vmfb")
    weights = version / "weights.safetensors"
    w = np.ones((16, 8), np.float32)
    save_file({"w": w, "b": np.zeros(8, np.float32)}, str(weights))
    (tmp_path / "affine" / "config.json").write_text(json.dumps(
        {"parameters": {"model": "weights.safetensors"}}))
    server = start_server("--model-repository", str(tmp_path), "--model-control-mode",
                          "poll", "--repository-poll-secs", "0.1")
    client = httpclient.InferenceServerClient(server.url, network_timeout=60.0)
    x = np.ones((2, 16), np.float32)

    def infer() -> np.ndarray:
        inp = httpclient.InferInput("x", [2, 16], "FP32")
        inp.set_data_from_numpy(x)
        return client.infer("affine", [inp]).as_numpy("y")

    assert (infer() == 16).all()
    save_file({"w": w, "b": np.full(8, 0.5, np.float32)}, str(weights))
    server.wait_stderr(r"loaded model affine version 1.*\n(.|\n)*loaded model affine "
                       r"version 1", timeout=30)
    assert (infer() == 16.5).all()

"""Real networks built in code (no downloads): MobileNetV2 with seeded random weights.

`mobilenet_v2_onnx()` builds the standard MobileNetV2 (width 1.0, 224x224, batch-norm
folded into conv biases, ReLU6 as Clip) with onnx's helper API; `mobilenet_v2_vmfb()`
imports it with `iree-import-onnx` and compiles it for this host with the pinned
iree-compile, both cached by content hash like every compiled test artifact.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np

from .iree_tools import HOST_FLAGS, cache_dir, compile_mlir

# (expansion t, channels c, repeats n, first stride s)
_SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
             (6, 160, 3, 2), (6, 320, 1, 1)]

# The bench's pure-VM loop (bench/vm_vs_iree.py): i32 multiply, xor and add carried
# around an scf.while, no HAL calls; tests check its generated shape and results.
VM_LOOP_MLIR = """
func.func @loop(%n: i32) -> i32 {
  %c0 = arith.constant 0 : i32
  %c1 = arith.constant 1 : i32
  %r:2 = scf.while (%i = %c0, %acc = %c0) : (i32, i32) -> (i32, i32) {
    %go = arith.cmpi slt, %i, %n : i32
    scf.condition(%go) %i, %acc : i32, i32
  } do {
  ^bb0(%i: i32, %acc: i32):
    %x = arith.muli %i, %i : i32
    %y = arith.xori %x, %acc : i32
    %s = arith.addi %y, %i : i32
    %n1 = arith.addi %i, %c1 : i32
    scf.yield %n1, %s : i32, i32
  }
  return %r#1 : i32
}
"""



def mobilenet_v2_onnx(seed: int = 0, num_classes: int = 1000, size: int = 224) -> bytes:
    """The serialized ONNX model (opset 17), deterministic for a seed."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes: list = []
    inits: list = []
    counter = [0]

    def name(prefix: str) -> str:
        counter[0] += 1
        return f"{prefix}_{counter[0]}"

    def const(array: np.ndarray, prefix: str) -> str:
        n = name(prefix)
        inits.append(numpy_helper.from_array(array.astype(np.float32), n))
        return n

    relu_lo = const(np.array(0.0), "zero")
    relu_hi = const(np.array(6.0), "six")

    def conv(x: str, cin: int, cout: int, k: int, stride: int, groups: int = 1,
             relu6: bool = True) -> str:
        fan_in = cin // groups * k * k
        w = rng.standard_normal((cout, cin // groups, k, k)) * np.sqrt(2.0 / fan_in)
        b = rng.standard_normal(cout) * 0.05
        out = name("conv")
        pad = k // 2
        nodes.append(helper.make_node(
            "Conv", [x, const(w, "w"), const(b, "b")], [out], kernel_shape=[k, k],
            strides=[stride, stride], pads=[pad, pad, pad, pad], group=groups))
        if relu6:
            clipped = name("relu6")
            nodes.append(helper.make_node("Clip", [out, relu_lo, relu_hi], [clipped]))
            return clipped
        return out

    x = conv("input", 3, 32, 3, 2)
    cin = 32
    for t, c, n, s in _SETTINGS:
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            y = x
            if t != 1:
                y = conv(y, cin, hidden, 1, 1)
            y = conv(y, hidden, hidden, 3, stride, groups=hidden)
            y = conv(y, hidden, c, 1, 1, relu6=False)
            if stride == 1 and cin == c:
                added = name("add")
                nodes.append(helper.make_node("Add", [x, y], [added]))
                y = added
            x, cin = y, c
    x = conv(x, cin, 1280, 1, 1)
    pooled = name("pool")
    nodes.append(helper.make_node("GlobalAveragePool", [x], [pooled]))
    flat = name("flat")
    nodes.append(helper.make_node("Flatten", [pooled], [flat], axis=1))
    fc_w = const(rng.standard_normal((num_classes, 1280)) * np.sqrt(1.0 / 1280), "fc_w")
    fc_b = const(rng.standard_normal(num_classes) * 0.01, "fc_b")
    nodes.append(helper.make_node("Gemm", [flat, fc_w, fc_b], ["logits"], transB=1))

    graph = helper.make_graph(
        nodes, "mobilenet_v2",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, num_classes])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="tinyhal-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def import_onnx(model: bytes) -> str:
    """MLIR text for an ONNX model, via the pinned `iree-import-onnx` (cached)."""
    key = hashlib.sha256(model).hexdigest()[:24]
    out = cache_dir() / f"{key}.onnx.mlir"
    if not out.exists():
        src = cache_dir() / f"{key}.onnx"
        src.write_bytes(model)
        tool = Path(sys.executable).with_name("iree-import-onnx")
        tmp = out.with_name(out.name + ".tmp")
        subprocess.run([str(tool), str(src), "-o", str(tmp)], check=True,
                       capture_output=True, timeout=600)
        tmp.replace(out)
    return out.read_text()


def mobilenet_v2_vmfb(seed: int = 0) -> Path:
    """MobileNetV2 compiled for this host (cached by content hash)."""
    return compile_mlir(import_onnx(mobilenet_v2_onnx(seed)), HOST_FLAGS)


def mobilenet_input(seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 3, 224, 224)).astype(np.float32)


def small_cnn_onnx(seed: int = 0) -> bytes:
    """A small CNN (3 strided conv+ReLU, global pool, FC) on 1x3x64x64 inputs."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    x, cin = "input", 3
    for i, cout in enumerate((16, 32, 64)):
        w = (rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2.0 / (cin * 9))).astype(np.float32)
        b = (rng.standard_normal(cout) * 0.05).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"],
                                      kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        x, cin = f"r{i}", cout
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pool"]))
    nodes.append(helper.make_node("Flatten", ["pool"], ["flat"], axis=1))
    inits += [numpy_helper.from_array((rng.standard_normal((10, 64)) * 0.1).astype(np.float32),
                                      "fc_w"),
              numpy_helper.from_array(np.zeros(10, np.float32), "fc_b")]
    nodes.append(helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1))
    graph = helper.make_graph(
        nodes, "small_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 64, 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def small_cnn_vmfb(seed: int = 0) -> Path:
    return compile_mlir(import_onnx(small_cnn_onnx(seed)), HOST_FLAGS)


def ds_cnn_kws_onnx(seed: int = 0, keywords: int = 12) -> bytes:
    """The keyword-spotting DS-CNN (small) that TFLM benchmarks: 1x1x49x10 MFCC in.

    A 10x4 stride-2 conv to 64 channels, four depthwise-separable blocks (3x3 depthwise,
    1x1 pointwise, each followed by ReLU; batch-norm folded into biases), global average
    pooling and a linear layer to `keywords` logits.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def conv(x: str, tag: str, cin: int, cout: int, kernel: tuple[int, int],
             strides: tuple[int, int], pads: list[int], groups: int = 1) -> str:
        fan_in = cin // groups * kernel[0] * kernel[1]
        w = rng.standard_normal((cout, cin // groups, *kernel)) * np.sqrt(2.0 / fan_in)
        b = rng.standard_normal(cout) * 0.05
        inits.extend([numpy_helper.from_array(w.astype(np.float32), f"{tag}_w"),
                      numpy_helper.from_array(b.astype(np.float32), f"{tag}_b")])
        nodes.append(helper.make_node(
            "Conv", [x, f"{tag}_w", f"{tag}_b"], [f"{tag}_c"], kernel_shape=list(kernel),
            strides=list(strides), pads=pads, group=groups))
        nodes.append(helper.make_node("Relu", [f"{tag}_c"], [f"{tag}_r"]))
        return f"{tag}_r"

    # "same" padding for 49x10 with a 10x4 kernel and stride 2: 25x5 out
    x = conv("input", "conv0", 1, 64, (10, 4), (2, 2), [4, 1, 5, 1])
    for i in range(4):
        x = conv(x, f"dw{i}", 64, 64, (3, 3), (1, 1), [1, 1, 1, 1], groups=64)
        x = conv(x, f"pw{i}", 64, 64, (1, 1), (1, 1), [0, 0, 0, 0])
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pool"]))
    nodes.append(helper.make_node("Flatten", ["pool"], ["flat"], axis=1))
    inits += [numpy_helper.from_array(
                  (rng.standard_normal((keywords, 64)) * 0.125).astype(np.float32), "fc_w"),
              numpy_helper.from_array(
                  (rng.standard_normal(keywords) * 0.01).astype(np.float32), "fc_b")]
    nodes.append(helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1))
    graph = helper.make_graph(
        nodes, "ds_cnn_kws",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 1, 49, 10])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, keywords])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="tinyhal-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def ds_cnn_kws_vmfb(seed: int = 0) -> Path:
    """The KWS DS-CNN compiled for this host (cached by content hash)."""
    return compile_mlir(import_onnx(ds_cnn_kws_onnx(seed)), HOST_FLAGS)


def kws_input(seed: int = 1) -> np.ndarray:
    """A seeded 1x1x49x10 MFCC-shaped input."""
    return np.random.default_rng(seed).standard_normal((1, 1, 49, 10)).astype(np.float32)


def iree_function(vmfb: Path, name: str, driver: str = "local-sync"):
    """`name` of the module in `vmfb` on iree.runtime: call it with numpy arrays, get
    numpy arrays back (the reference every bit-exactness test compares with)."""
    import iree.runtime as rt

    ctx = rt.SystemContext(config=rt.Config(driver))
    ctx.add_vm_module(rt.VmModule.mmap(ctx.instance, str(vmfb)))
    fn = ctx.modules.module[name]
    return lambda *args: fn(*args).to_host()


_MODELS = {"mobilenet_v2": (mobilenet_v2_vmfb, mobilenet_input),
           "small_cnn": (small_cnn_vmfb, None),
           "ds_cnn_kws": (ds_cnn_kws_vmfb, kws_input)}


def main(argv: list[str] | None = None) -> None:
    """`python -m support.models NAME [DIR]` (with `tests` on PYTHONPATH): writes NAME.vmfb
    and, where the model has one, its seeded input as x.npy into DIR (default: here), for
    the documentation's examples."""
    import argparse
    import shutil

    parser = argparse.ArgumentParser(prog="python -m support.models")
    parser.add_argument("name", choices=sorted(_MODELS))
    parser.add_argument("directory", nargs="?", default=".")
    args = parser.parse_args(argv)
    build, make_input = _MODELS[args.name]
    out = Path(args.directory)
    shutil.copyfile(build(), out / f"{args.name}.vmfb")
    if make_input is not None:
        np.save(out / "x.npy", make_input())
    print(f"wrote {out / (args.name + '.vmfb')}" + (" and x.npy" if make_input else ""))


if __name__ == "__main__":
    main()

"""Builds the sample models `tinyhal-serve` serves when started without arguments.

    python server/models/build_samples.py            # rebuild every sample in place
    python server/models/build_samples.py --check    # rebuild to a temp dir, compare bytes

Each sample is an MLIR program written here, compiled with the pinned `iree-compile`
(iree-base-compiler 3.13.0) for a GENERIC x86-64 CPU (`--iree-llvmcpu-target-cpu=generic`,
triple `x86_64-unknown-linux-gnu`), so the committed `.vmfb` files run on any x86-64
machine, not only the one that built them. Weights are drawn from a seeded numpy generator
and embedded as hex `dense<"0x...">` constants, so a rebuild is byte-for-byte the same.
The MLIR goes to the compiler on stdin: no path of the building machine ends up in a file.

Layout written (one version each, the layout `--model-repository` expects):

    server/models/<name>/1/model.vmfb
    server/models/<name>/config.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
COMPILER_VERSION = "3.13.0"
FLAGS = [
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
    "--iree-llvmcpu-target-triple=x86_64-unknown-linux-gnu",
    "--iree-llvmcpu-target-cpu=generic",
    "--iree-llvmcpu-debug-symbols=false",
]


def _hex(array: np.ndarray) -> str:
    return '"0x' + np.ascontiguousarray(array).astype("<f4").tobytes().hex().upper() + '"'


def mlp_classifier() -> tuple[str, dict]:
    """A 16 -> 32 (ReLU) -> 4 MLP: softmax probabilities and the arg-max class per row."""
    rng = np.random.default_rng(20240601)
    w1 = rng.normal(0, 0.5, (16, 32)).astype(np.float32)
    b1 = rng.normal(0, 0.1, (32,)).astype(np.float32)
    w2 = rng.normal(0, 0.5, (32, 4)).astype(np.float32)
    b2 = rng.normal(0, 0.1, (4,)).astype(np.float32)
    mlir = f"""
#id2 = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d1)>
#red = affine_map<(d0, d1) -> (d0)>
func.func @predict(%x: tensor<?x16xf32> {{iree.abi.name = "features"}})
    -> (tensor<?x4xf32> {{iree.abi.name = "probabilities"}},
        tensor<?xi32> {{iree.abi.name = "class"}}) {{
  %w1 = arith.constant dense<{_hex(w1)}> : tensor<16x32xf32>
  %b1 = arith.constant dense<{_hex(b1)}> : tensor<32xf32>
  %w2 = arith.constant dense<{_hex(w2)}> : tensor<32x4xf32>
  %b2 = arith.constant dense<{_hex(b2)}> : tensor<4xf32>
  %zero = arith.constant 0.0 : f32
  %c0 = arith.constant 0 : index
  %n = tensor.dim %x, %c0 : tensor<?x16xf32>
  %e1 = tensor.empty(%n) : tensor<?x32xf32>
  %f1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<?x32xf32>) -> tensor<?x32xf32>
  %m1 = linalg.matmul ins(%x, %w1 : tensor<?x16xf32>, tensor<16x32xf32>)
                      outs(%f1 : tensor<?x32xf32>) -> tensor<?x32xf32>
  %h = linalg.generic {{indexing_maps = [#id2, #row, #id2],
                        iterator_types = ["parallel", "parallel"]}}
      ins(%m1, %b1 : tensor<?x32xf32>, tensor<32xf32>) outs(%e1 : tensor<?x32xf32>) {{
  ^bb0(%a: f32, %b: f32, %o: f32):
    %s = arith.addf %a, %b : f32
    %r = arith.maximumf %s, %zero : f32
    linalg.yield %r : f32
  }} -> tensor<?x32xf32>
  %e2 = tensor.empty(%n) : tensor<?x4xf32>
  %f2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<?x4xf32>) -> tensor<?x4xf32>
  %m2 = linalg.matmul ins(%h, %w2 : tensor<?x32xf32>, tensor<32x4xf32>)
                      outs(%f2 : tensor<?x4xf32>) -> tensor<?x4xf32>
  %logits = linalg.generic {{indexing_maps = [#id2, #row, #id2],
                             iterator_types = ["parallel", "parallel"]}}
      ins(%m2, %b2 : tensor<?x4xf32>, tensor<4xf32>) outs(%e2 : tensor<?x4xf32>) {{
  ^bb0(%a: f32, %b: f32, %o: f32):
    %s = arith.addf %a, %b : f32
    linalg.yield %s : f32
  }} -> tensor<?x4xf32>
  %probs = linalg.softmax dimension(1) ins(%logits : tensor<?x4xf32>)
                          outs(%e2 : tensor<?x4xf32>) -> tensor<?x4xf32>
  %ninf = arith.constant 0xFF800000 : f32
  %c0i = arith.constant 0 : i32
  %ev = tensor.empty(%n) : tensor<?xf32>
  %ei = tensor.empty(%n) : tensor<?xi32>
  %fv = linalg.fill ins(%ninf : f32) outs(%ev : tensor<?xf32>) -> tensor<?xf32>
  %fi = linalg.fill ins(%c0i : i32) outs(%ei : tensor<?xi32>) -> tensor<?xi32>
  %best:2 = linalg.generic {{indexing_maps = [#id2, #red, #red],
                             iterator_types = ["parallel", "reduction"]}}
      ins(%logits : tensor<?x4xf32>) outs(%fv, %fi : tensor<?xf32>, tensor<?xi32>) {{
  ^bb0(%v: f32, %bv: f32, %bi: i32):
    %j = linalg.index 1 : index
    %ji = arith.index_cast %j : index to i32
    %gt = arith.cmpf ogt, %v, %bv : f32
    %nv = arith.select %gt, %v, %bv : f32
    %ni = arith.select %gt, %ji, %bi : i32
    linalg.yield %nv, %ni : f32, i32
  }} -> (tensor<?xf32>, tensor<?xi32>)
  return %probs, %best#1 : tensor<?x4xf32>, tensor<?xi32>
}}
"""
    config = {
        "function": "predict",
        # one invocation takes well under a millisecond: the sync device runs it inline on
        # the instance thread, cheaper than handing each dispatch to worker threads
        "device": "sync",
        "max_batch_size": 64,
        "dynamic_batching": {"max_queue_delay_microseconds": 0},
        # one instance: the sync device runs one invocation at a time anyway, and with one
        # execution in flight the next batch takes everything that queued meanwhile
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "max_queue": 64,
        "description": "16-feature MLP classifier (seeded weights): class probabilities "
                       "and the arg-max class",
    }
    return mlir, config


def saxpy() -> tuple[str, dict]:
    """z = alpha * x + y over vectors of any equal length (checked in the program)."""
    mlir = """
#id = affine_map<(d0) -> (d0)>
func.func @saxpy(%alpha: f32 {iree.abi.name = "alpha"},
                 %x: tensor<?xf32> {iree.abi.name = "x"},
                 %y: tensor<?xf32> {iree.abi.name = "y"})
    -> (tensor<?xf32> {iree.abi.name = "z"}) {
  %c0 = arith.constant 0 : index
  %nx = tensor.dim %x, %c0 : tensor<?xf32>
  %ny = tensor.dim %y, %c0 : tensor<?xf32>
  %same = arith.cmpi eq, %nx, %ny : index
  cf.assert %same, "x and y must have the same length"
  %e = tensor.empty(%nx) : tensor<?xf32>
  %z = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel"]}
      ins(%x, %y : tensor<?xf32>, tensor<?xf32>) outs(%e : tensor<?xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %m = arith.mulf %alpha, %a : f32
    %s = arith.addf %m, %b : f32
    linalg.yield %s : f32
  } -> tensor<?xf32>
  return %z : tensor<?xf32>
}
"""
    config = {
        "function": "saxpy",
        "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
        "max_queue": 32,
        "description": "z = alpha * x + y (alpha a scalar, x and y vectors of one length)",
    }
    return mlir, config


GRU_INPUT, GRU_HIDDEN = 8, 16


def gru_step() -> tuple[str, dict]:
    """One step of a GRU cell over a batch of sequences: the hidden state comes in as
    `STATE_IN` and goes out as `STATE_OUT` (the server keeps it between a sequence's
    requests: `sequence_batching.state`), and `OUTPUT` is the new hidden state. The three
    gates' weights are stacked (as cuDNN and PyTorch store them): two matmuls per step."""
    rng = np.random.default_rng(20261124)
    i, h = GRU_INPUT, GRU_HIDDEN
    wx = rng.normal(0, 0.4, (i, 3 * h)).astype(np.float32)  # gates z, r, n
    wh = rng.normal(0, 0.4, (h, 3 * h)).astype(np.float32)
    bx = rng.normal(0, 0.1, (3, h)).astype(np.float32)
    bhn = rng.normal(0, 0.1, (h,)).astype(np.float32)
    t = f"tensor<?x{h}xf32>"
    g = f"tensor<?x{3 * h}xf32>"
    g3 = f"tensor<?x3x{h}xf32>"
    mlir = f"""
#id2 = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d1)>
#gz = affine_map<(d0, d1) -> (d0, 0, d1)>
#gr = affine_map<(d0, d1) -> (d0, 1, d1)>
#gn = affine_map<(d0, d1) -> (d0, 2, d1)>
#bz = affine_map<(d0, d1) -> (0, d1)>
#br = affine_map<(d0, d1) -> (1, d1)>
#bn = affine_map<(d0, d1) -> (2, d1)>
func.func @step(%x: tensor<?x{i}xf32> {{iree.abi.name = "INPUT"}},
                %s: {t} {{iree.abi.name = "STATE_IN"}})
    -> ({t} {{iree.abi.name = "OUTPUT"}}, {t} {{iree.abi.name = "STATE_OUT"}}) {{
  %wx = arith.constant dense<{_hex(wx)}> : tensor<{i}x{3 * h}xf32>
  %wh = arith.constant dense<{_hex(wh)}> : tensor<{h}x{3 * h}xf32>
  %bx = arith.constant dense<{_hex(bx)}> : tensor<3x{h}xf32>
  %bhn = arith.constant dense<{_hex(bhn)}> : tensor<{h}xf32>
  %zero = arith.constant 0.0 : f32
  %one = arith.constant 1.0 : f32
  %c0 = arith.constant 0 : index
  %n = tensor.dim %x, %c0 : tensor<?x{i}xf32>
  %ns = tensor.dim %s, %c0 : {t}
  %same = arith.cmpi eq, %n, %ns : index
  cf.assert %same, "INPUT and STATE_IN must have the same batch size"
  %eg = tensor.empty(%n) : {g}
  %zg = linalg.fill ins(%zero : f32) outs(%eg : {g}) -> {g}
  %px = linalg.matmul ins(%x, %wx : tensor<?x{i}xf32>, tensor<{i}x{3 * h}xf32>)
                      outs(%zg : {g}) -> {g}
  %ph = linalg.matmul ins(%s, %wh : {t}, tensor<{h}x{3 * h}xf32>)
                      outs(%zg : {g}) -> {g}
  %gx = tensor.expand_shape %px [[0], [1, 2]] output_shape [%n, 3, {h}] : {g} into {g3}
  %gh = tensor.expand_shape %ph [[0], [1, 2]] output_shape [%n, 3, {h}] : {g} into {g3}
  %e = tensor.empty(%n) : {t}
  %new = linalg.generic {{indexing_maps = [#gz, #gz, #gr, #gr, #gn, #gn, #id2,
                                          #bz, #br, #bn, #row, #id2],
                         iterator_types = ["parallel", "parallel"]}}
      ins(%gx, %gh, %gx, %gh, %gx, %gh, %s, %bx, %bx, %bx, %bhn
          : {g3}, {g3}, {g3}, {g3}, {g3}, {g3}, {t}, tensor<3x{h}xf32>,
            tensor<3x{h}xf32>, tensor<3x{h}xf32>, tensor<{h}xf32>)
      outs(%e : {t}) {{
  ^bb0(%xz: f32, %hz: f32, %xr: f32, %hr: f32, %xn: f32, %hn: f32, %hp: f32,
       %bz: f32, %br: f32, %bn: f32, %bh: f32, %o: f32):
    %az0 = arith.addf %xz, %hz : f32
    %az = arith.addf %az0, %bz : f32
    %nz = arith.negf %az : f32
    %ez = math.exp %nz : f32
    %dz = arith.addf %one, %ez : f32
    %z = arith.divf %one, %dz : f32
    %ar0 = arith.addf %xr, %hr : f32
    %ar = arith.addf %ar0, %br : f32
    %nr = arith.negf %ar : f32
    %er = math.exp %nr : f32
    %dr = arith.addf %one, %er : f32
    %r = arith.divf %one, %dr : f32
    %hb = arith.addf %hn, %bh : f32
    %rh = arith.mulf %r, %hb : f32
    %an0 = arith.addf %xn, %bn : f32
    %an = arith.addf %an0, %rh : f32
    %c = math.tanh %an : f32
    %d = arith.subf %hp, %c : f32
    %zd = arith.mulf %z, %d : f32
    %hnew = arith.addf %c, %zd : f32
    linalg.yield %hnew : f32
  }} -> {t}
  return %new, %new : {t}, {t}
}}
"""
    config = {
        "function": "step",
        # a step of a few sequences is microseconds of kernel time: run it inline
        "device": "sync",
        "max_batch_size": 64,
        "sequence_batching": {
            "max_sequence_idle_microseconds": 10000000,
            "oldest": {"max_candidate_sequences": 256, "max_queue_delay_microseconds": 0,
                       "preferred_batch_size": []},
            "state": [{"input_name": "STATE_IN", "output_name": "STATE_OUT",
                       "data_type": "TYPE_FP32", "dims": [h],
                       "initial_state": [{"data_type": "TYPE_FP32", "dims": [h],
                                          "zero_data": True, "name": "zeros"}]}],
        },
        "max_queue": 1024,
        "description": f"one GRU cell step ({i} inputs, {h} hidden units, seeded weights) "
                       f"per sequence; the hidden state stays on the server between the "
                       f"requests of a sequence (sequence_id, sequence_start, sequence_end)",
    }
    return mlir, config


SAMPLES = {"mlp_classifier": mlp_classifier, "saxpy": saxpy, "gru_step": gru_step}


def iree_compile() -> str:
    try:
        from iree.compiler.tools import binaries

        return binaries.find_tool("iree-compile")
    except Exception:
        found = shutil.which("iree-compile")
        if not found:
            sys.exit("iree-compile not found: pip install iree-base-compiler==" + COMPILER_VERSION)
        return found


def compile_to(mlir: str, out: Path) -> None:
    proc = subprocess.run(
        [iree_compile(), "-", "-o", str(out), *FLAGS],
        input=mlir, text=True, capture_output=True, timeout=600,
    )
    if proc.returncode != 0:
        raise SystemExit(f"iree-compile failed for {out}:\n{proc.stderr[-4000:]}")


def build(root: Path) -> list[Path]:
    written = []
    for name, make in SAMPLES.items():
        mlir, config = make()
        version_dir = root / name / "1"
        version_dir.mkdir(parents=True, exist_ok=True)
        compile_to(mlir, version_dir / "model.vmfb")
        (root / name / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        written += [version_dir / "model.vmfb", root / name / "config.json"]
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="rebuild into a temporary directory and compare with the committed files")
    args = parser.parse_args(argv)
    if not args.check:
        for path in build(HERE):
            print(f"wrote {path.relative_to(HERE)} ({path.stat().st_size} bytes)")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        differ = []
        for path in build(Path(tmp)):
            rel = path.relative_to(tmp)
            committed = HERE / rel
            if not committed.exists() or committed.read_bytes() != path.read_bytes():
                differ.append(str(rel))
        if differ:
            print("differ from a fresh build: " + ", ".join(differ))
            return 1
        print("committed samples match a fresh build")
        return 0


if __name__ == "__main__":
    sys.exit(main())

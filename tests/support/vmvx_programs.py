"""VMVX programs shared by the VMVX tests and `bench/vmvx.py`: the compiler flags of each
shape VMVX code comes in, and a small MLP the program carries as MLIR (weights as
constants)."""

from __future__ import annotations

import numpy as np

VMVX = ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=vmvx"]
FLAVOURS = {
    "loops": VMVX,
    "ukernels": VMVX + ["--iree-vmvx-enable-microkernels"],
    "data-tiling": VMVX + ["--iree-vmvx-enable-microkernels", "--iree-opt-data-tiling"],
    # TinyIREE's inline mode: the executables reach the device through `hal_loader`
    "inline": VMVX + ["--iree-vmvx-enable-microkernels", "--iree-execution-model=inline-dynamic"],
}


def dense_literal(array: np.ndarray) -> str:
    """A 2-D float32 array as an MLIR `dense<...>` constant."""
    rows = ", ".join("[" + ", ".join(f"{v:.8e}" for v in row) + "]" for row in array)
    return f"dense<[{rows}]> : tensor<{array.shape[0]}x{array.shape[1]}xf32>"


def mlp_mlir() -> str:
    """Three layers (dense + bias + relu, twice, then dense + softmax) with weights the
    program carries as constants."""
    rng = np.random.default_rng(19)
    sizes = [(20, 32), (32, 16), (16, 5)]
    weights = [(rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32) for s in sizes]
    biases = [rng.standard_normal((1, s[1])).astype(np.float32) * 0.1 for s in sizes]
    lines = ["func.func @mlp(%x: tensor<4x20xf32>) -> tensor<4x5xf32> {",
             "  %zero = arith.constant 0.0 : f32",
             "  %ninf = arith.constant 0xFF800000 : f32"]
    value, width = "%x", 20
    for i, (w, b) in enumerate(zip(weights, biases)):
        out = w.shape[1]
        lines += [
            f"  %w{i} = arith.constant {dense_literal(w)}",
            f"  %b{i} = arith.constant {dense_literal(b)}",
            f"  %e{i} = tensor.empty() : tensor<4x{out}xf32>",
            f"  %f{i} = linalg.fill ins(%zero : f32) outs(%e{i} : tensor<4x{out}xf32>)"
            f" -> tensor<4x{out}xf32>",
            f"  %m{i} = linalg.matmul ins({value}, %w{i} : tensor<4x{width}xf32>, "
            f"tensor<{width}x{out}xf32>) outs(%f{i} : tensor<4x{out}xf32>) -> "
            f"tensor<4x{out}xf32>",
            f"  %a{i} = linalg.generic {{indexing_maps = [affine_map<(i, j) -> (i, j)>, "
            "affine_map<(i, j) -> (0, j)>, affine_map<(i, j) -> (i, j)>], iterator_types = "
            f"[\"parallel\", \"parallel\"]}} ins(%m{i}, %b{i} : tensor<4x{out}xf32>, "
            f"tensor<1x{out}xf32>) outs(%e{i} : tensor<4x{out}xf32>) {{",
            "  ^bb0(%p: f32, %q: f32, %o: f32):",
            "    %s = arith.addf %p, %q : f32",
            ("    %r = arith.maximumf %s, %zero : f32\n    linalg.yield %r : f32"
             if i < 2 else "    linalg.yield %s : f32"),
            f"  }} -> tensor<4x{out}xf32>",
        ]
        value, width = f"%a{i}", out
    lines += [
        "  %em = tensor.empty() : tensor<4xf32>",
        "  %fm = linalg.fill ins(%ninf : f32) outs(%em : tensor<4xf32>) -> tensor<4xf32>",
        "  %mx = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, "
        "affine_map<(i, j) -> (i)>], iterator_types = [\"parallel\", \"reduction\"]} "
        "ins(%a2 : tensor<4x5xf32>) outs(%fm : tensor<4xf32>) {",
        "  ^bb0(%p: f32, %acc: f32):",
        "    %r = arith.maximumf %p, %acc : f32",
        "    linalg.yield %r : f32",
        "  } -> tensor<4xf32>",
        "  %ee = tensor.empty() : tensor<4x5xf32>",
        "  %ex = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, "
        "affine_map<(i, j) -> (i)>, affine_map<(i, j) -> (i, j)>], iterator_types = "
        "[\"parallel\", \"parallel\"]} ins(%a2, %mx : tensor<4x5xf32>, tensor<4xf32>) "
        "outs(%ee : tensor<4x5xf32>) {",
        "  ^bb0(%p: f32, %m: f32, %o: f32):",
        "    %d = arith.subf %p, %m : f32",
        "    %e = math.exp %d : f32",
        "    linalg.yield %e : f32",
        "  } -> tensor<4x5xf32>",
        "  %fs = linalg.fill ins(%zero : f32) outs(%em : tensor<4xf32>) -> tensor<4xf32>",
        "  %sm = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, "
        "affine_map<(i, j) -> (i)>], iterator_types = [\"parallel\", \"reduction\"]} "
        "ins(%ex : tensor<4x5xf32>) outs(%fs : tensor<4xf32>) {",
        "  ^bb0(%p: f32, %acc: f32):",
        "    %r = arith.addf %p, %acc : f32",
        "    linalg.yield %r : f32",
        "  } -> tensor<4xf32>",
        "  %sx = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, "
        "affine_map<(i, j) -> (i)>, affine_map<(i, j) -> (i, j)>], iterator_types = "
        "[\"parallel\", \"parallel\"]} ins(%ex, %sm : tensor<4x5xf32>, tensor<4xf32>) "
        "outs(%ee : tensor<4x5xf32>) {",
        "  ^bb0(%p: f32, %s: f32, %o: f32):",
        "    %d = arith.divf %p, %s : f32",
        "    linalg.yield %d : f32",
        "  } -> tensor<4x5xf32>",
        "  return %sx : tensor<4x5xf32>",
        "}",
    ]
    return "\n".join(lines) + "\n"


def mlp_input(seed: int = 4) -> np.ndarray:
    """A batch of four rows for `mlp_mlir`'s `@mlp`."""
    return (np.random.default_rng(seed).standard_normal((4, 20)) * 3).astype(np.float32)


# A matmul of dynamic sizes: data tiling makes VMVX query its tile sizes at run time.
DYNAMIC_MATMUL = """
func.func @matmul(%a: tensor<?x?xf32>, %b: tensor<?x?xf32>) -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %m = tensor.dim %a, %c0 : tensor<?x?xf32>
  %n = tensor.dim %b, %c1 : tensor<?x?xf32>
  %z = arith.constant 0.0 : f32
  %e = tensor.empty(%m, %n) : tensor<?x?xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<?x?xf32>) -> tensor<?x?xf32>
  %r = linalg.matmul ins(%a, %b : tensor<?x?xf32>, tensor<?x?xf32>)
                     outs(%f : tensor<?x?xf32>) -> tensor<?x?xf32>
  return %r : tensor<?x?xf32>
}
"""

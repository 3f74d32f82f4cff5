"""Programs whose translation is large: what a model loading next to live traffic must
not stall the server with (tests/server/test_isolation.py, bench/load_stall.py)."""

from __future__ import annotations

__all__ = ["large_function_mlir"]


def large_function_mlir(steps: int) -> str:
    """One function of straight-line integer work, 3 VM instructions per step that no
    compiler pass folds: its Python translation is ~250 bytes of source per step (1,500
    steps: ~0.4 MB; 4,000: ~1 MB)."""
    lines = ['func.func @big(%n: i32 {iree.abi.name = "n"}) -> (i32 {iree.abi.name = "r"}) {',
             "  %k = arith.constant 1103515245 : i32", "  %s = arith.constant 7 : i32"]
    previous = "%n"
    for i in range(steps):
        lines += [f"  %m{i} = arith.muli {previous}, %k : i32",
                  f"  %h{i} = arith.shrui %m{i}, %s : i32",
                  f"  %x{i} = arith.xori %m{i}, %h{i} : i32"]
        previous = f"%x{i}"
    return "\n".join([*lines, f"  return {previous} : i32", "}"])

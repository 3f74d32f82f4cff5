"""Helpers for the VM suites: compile scalar MLIR programs, run them in tinyhal and IREE.

`vm_compile_source(source)` compiles with the pinned iree-compile for the local llvm-cpu
target (scalar programs produce no hal imports) and returns the `.vmfb` path. A `Pair`
holds a tinyhal `Context` and an `iree.runtime` context over the same file;
`Pair.check(fn, *args)` calls both and asserts identical results bit for bit (floats
compared by their IEEE bits). The `*_EDGES` lists are edge values for arithmetic tests.
"""

from __future__ import annotations

import math
import struct

from .iree_tools import compile_mlir

VM_FLAGS = [
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
]


def vm_compile_source(source: str, flags=()) -> str:
    return str(compile_mlir(source, [*VM_FLAGS, *flags]))


def bits_of(value):
    """A comparable form of a result: floats by their bits, everything else as is."""
    if isinstance(value, float):
        return ("f", struct.pack("<d", value).hex())
    if isinstance(value, (list, tuple)):
        return tuple(bits_of(v) for v in value)
    return value


class Pair:
    def __init__(self, path: str) -> None:
        import iree.runtime as rt

        from tinyhal.vm import Context, load_module

        self.path = path
        self.module = load_module(path)
        self.ctx = Context([self.module])
        config = rt.Config("local-sync")
        self.oracle = rt.SystemContext(config=config)
        with open(path, "rb") as f:
            self.oracle.add_vm_module(rt.VmModule.copy_buffer(self.oracle.instance, f.read()))
        self.oracle_module = getattr(self.oracle.modules, self.module.name)

    def ours(self, fn: str, *args):
        out = self.ctx.invoke(fn, list(args))
        return out[0] if len(out) == 1 else tuple(out) if out else None

    def theirs(self, fn: str, *args):
        out = self.oracle_module[fn](*args)
        if isinstance(out, list):
            out = tuple(out)
        return out

    def check(self, fn: str, *args):
        theirs = self.theirs(fn, *args)
        ours = self.ours(fn, *args)
        assert bits_of(ours) == bits_of(theirs), (
            f"{fn}{args}: tinyhal {ours!r} != iree {theirs!r}"
        )
        return ours


I32_EDGES = [0, 1, -1, 2, -2, 7, -7, 31, 32, 33, 255, 256, 65535, -32768,
             2**31 - 1, -(2**31), 0x55555555, -0x55555556]
I64_EDGES = [0, 1, -1, 3, -3, 63, 64, 65, 2**31 - 1, -(2**31), 2**32, 2**32 + 1,
             2**63 - 1, -(2**63), 0x5555555555555555, -0x0123456789ABCDEF]
F32_EDGES = [0.0, -0.0, 1.0, -1.0, 0.5, 1.5, 2.5, -2.5, 0.1, 3.0, 1e-45, -1e-40,
             3.4028234663852886e38, -3.4028234663852886e38, 16777217.0, 2147483648.0,
             -2147483904.0, 1e10, math.inf, -math.inf, math.nan]
F64_EDGES = [0.0, -0.0, 1.0, -1.0, 0.5, 1.5, 2.5, -2.5, 0.1, 1e-310, 1e300, -1e300,
             9007199254740993.0, 2.0**63, -(2.0**63), 2.0**64, 4294967296.5,
             math.inf, -math.inf, math.nan]

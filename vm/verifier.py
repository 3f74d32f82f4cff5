"""Verifies a module's bytecode before it is translated, as IREE's `bytecode/verifier.c`.

The loader has checked the container, the tables and every function's descriptor; this
checks what the functions' instructions say, so that the translator (`codegen`) may take
every operand as meant and raises nothing of its own:

- structure: a function begins with a block, has as many blocks as its descriptor says
  and ends in a terminator (or `fail`); every branch target is a block;
- registers: each operand names a register of the bank its instruction declares, within
  the descriptor's register counts; 64-bit values start at an even 32-bit slot; branch
  operands never move a value between the integer and the ref banks;
- ordinals: globals (bytes within the module's state, refs within its ref count),
  rodata segments, types, internal functions and imports exist;
- calls: operands and results agree with the callee's calling convention (a variadic
  call names its segment sizes, and only imports are variadic); a return gives as many
  values as the function declares, each from a register of its type.

Errors are `InvalidArgumentError` (malformed) or `OutOfRangeError` (an ordinal or a
register past its table), naming `module.function+pc (instruction)` where an
instruction is at fault. A module that passes is described by `VerifiedFunction`s: each
function's basic blocks, which the translator reads.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..errors import InvalidArgumentError, OutOfRangeError
from . import isa, optable

__all__ = ["VerifiedFunction", "verify_module"]

_WIDE = frozenset({"i64", "f64"})
_LISTS: dict[str, str] = {}  # op -> what its register list holds, from the op table


def _derive(op: optable.Op) -> None:
    if op.lists:
        _LISTS[op.name] = op.lists


optable.on_row(_derive)


class VerifiedFunction(NamedTuple):
    """One function that passed: its instructions cut into basic blocks (each list
    begins with its `block` marker), each block's index by the pc of its marker, and how
    many i32 registers it may name."""

    function: Any  # loader.Function
    blocks: list[list[Any]]
    block_index: dict[int, int]
    i32_limit: int


def verify_module(module: Any) -> list[VerifiedFunction]:
    """Verifies every function of `module` (a `loader.BytecodeModule`), in order."""
    return [_FunctionVerifier(module, fn).verify() for fn in module.functions]


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p <<= 1
    return p


def _register_limits(descriptor: Any) -> tuple[int, int]:
    """How many i32 and ref registers a function may name: IREE rounds the descriptor's
    counts up to powers of two (at least one of each)."""
    return (_pow2(max(1, descriptor.i32_register_count)),
            _pow2(max(1, descriptor.ref_register_count)))


class _FunctionVerifier:
    def __init__(self, module: Any, fn: Any) -> None:
        self.module = module
        self.fn = fn
        self.where = f"{module.name}.{fn.name}"
        self.i32_limit, self.ref_limit = _register_limits(fn.descriptor)
        self.block_index: dict[int, int] = {}

    def err(self, ins: Any, msg: str) -> InvalidArgumentError:
        return InvalidArgumentError(f"{self.where}+{ins.pc:08X} ({ins.name}): {msg}")

    def verify(self) -> VerifiedFunction:
        instrs = self.fn.instructions
        if not instrs or instrs[0].name != "block":
            raise InvalidArgumentError(f"{self.where}: function does not begin with a block")
        blocks: list[list[Any]] = []
        for ins in instrs:
            if ins.name == "block":
                self.block_index[ins.pc] = len(blocks)
                blocks.append([ins])
            else:
                blocks[-1].append(ins)
        if len(blocks) != self.fn.descriptor.block_count:
            raise InvalidArgumentError(
                f"{self.where}: {len(blocks)} blocks found, descriptor says "
                f"{self.fn.descriptor.block_count}")
        last = blocks[-1][-1]
        if last.name not in isa.TERMINATORS and last.name != "fail":
            raise InvalidArgumentError(
                f"{self.where}: function missing terminator in the last block")
        for blk in blocks:
            for ins in blk[1:]:
                self.instruction(ins)
        return VerifiedFunction(self.fn, blocks, self.block_index, self.i32_limit)

    # -- operands
    def int_register(self, ins: Any, raw: int, wide: bool) -> None:
        if raw & isa.REF_BIT:
            raise self.err(ins, f"register {raw} is a ref register, expected i32/i64")
        if wide:
            if raw & 1:
                raise self.err(ins, f"64-bit register {raw} not 8-byte aligned")
            if raw + 1 >= self.i32_limit:
                raise OutOfRangeError(f"{self.where}: 64-bit register {raw} out of range")
        elif raw >= self.i32_limit:
            raise OutOfRangeError(f"{self.where}: register {raw} out of range")

    def ref_register(self, ins: Any, raw: int) -> None:
        if not raw & isa.REF_BIT:
            raise self.err(ins, f"register {raw} is not a ref register")
        if raw & isa.REF_MASK >= self.ref_limit:
            raise OutOfRangeError(
                f"{self.where}: ref register {raw & isa.REF_MASK} out of range")

    def any_register(self, ins: Any, raw: int) -> None:
        if raw & isa.REF_BIT:
            self.ref_register(ins, raw)
        else:
            self.int_register(ins, raw, False)

    def typed_register(self, ins: Any, raw: int, t: str) -> None:
        """A register holding a value of calling-convention type `t` (`iIfFr`)."""
        if t == "r":
            self.ref_register(ins, raw)
        else:
            self.int_register(ins, raw, t in "IF")

    def banked_register(self, ins: Any, raw: int, bank: str) -> None:
        """A register of an instruction layout's bank (`i32`, `i64`, `f32`, `f64`, `ref`)."""
        if bank == "ref":
            self.ref_register(ins, raw)
        else:
            self.int_register(ins, raw, bank in _WIDE)

    def target(self, ins: Any, pc: int) -> None:
        if pc not in self.block_index:
            raise self.err(ins, f"branch target {pc:08X} is not a block")

    def branch_operands(self, ins: Any, pairs: Any) -> None:
        for src, dst in pairs:
            if (src & isa.REF_BIT) != (dst & isa.REF_BIT):
                raise self.err(ins, "branch operand remaps between register banks")
            self.any_register(ins, src)
            self.any_register(ins, dst)

    def type_id(self, ins: Any, type_id: int) -> None:
        types = self.module.types
        if type_id >= len(types):
            raise OutOfRangeError(
                f"{self.where}: type id ordinal out of range: {type_id} (table={len(types)})")

    def global_operand(self, ins: Any, value: int) -> None:
        if ins.name.endswith(".ref"):
            if value >= self.module.global_ref_count:
                raise OutOfRangeError(f"{self.where}: global ref ordinal out of range: {value}")
            return
        width = 8 if ins.name.endswith(("i64", "f64")) else 4
        if value + width > self.module.global_bytes_capacity:
            raise OutOfRangeError(
                f"{self.where}: global byte_offset out of range: {value} "
                f"(rwdata={self.module.global_bytes_capacity})")

    def import_ordinal(self, ins: Any, ordinal: int) -> Any:
        k = ordinal & ~isa.IMPORT_BIT
        if k >= len(self.module.imports):
            raise self.err(ins, f"import ordinal {k} out of range")
        return self.module.imports[k]

    # -- instructions
    def instruction(self, ins: Any) -> None:
        name = ins.name
        for (code, arg), value in zip(ins.layout, ins.fields):
            if code == "r" or code == "w":
                self.banked_register(ins, value, arg)
            elif code == "G":
                self.global_operand(ins, value)
            elif code == "T":
                self.type_id(ins, value)
            elif code == "D":
                if value >= len(self.module.rodata):
                    raise OutOfRangeError(f"{self.where}: rodata ordinal {value} out of range")
            elif code == "B":
                self.target(ins, value)
            elif code == "O":
                self.branch_operands(ins, value)
            elif code == "C":
                for target, pairs in value:
                    self.target(ins, target)
                    self.branch_operands(ins, pairs)
        # what a `V` list holds is its row's fact (`optable.Op.lists`); `F` ordinals
        # are a call's or `import.resolved`'s
        f = ins.fields
        lists = _LISTS.get(name)
        if lists == "signature":
            if name == "return":
                self.returned(ins)
            else:
                self.call(ins)
        elif lists == "result":
            bank = ins.layout[-1][1]
            for raw in f[-2]:
                self.banked_register(ins, raw, bank)
        elif lists == "ref":
            for raw in f[0]:
                self.ref_register(ins, raw)
        elif lists == "any":
            for raw in f[-1]:
                self.any_register(ins, raw)
        elif name == "import.resolved":
            if not f[0] & isa.IMPORT_BIT:
                raise self.err(ins, "import.resolved of a non-import function")
            self.import_ordinal(ins, f[0])

    def returned(self, ins: Any) -> None:
        """A return: as many values as the signature declares, each of its type."""
        results = self.fn.cconv.results
        values = ins.fields[0]
        if len(values) != len(results):
            raise self.err(ins, f"returns {len(values)} values, signature declares "
                                f"{len(results)}")
        for raw, t in zip(values, results):
            self.typed_register(ins, raw, t)

    def call(self, ins: Any) -> None:
        f = ins.fields
        variadic = ins.name.startswith("call.variadic")
        ordinal = f[0]
        segments = f[1] if variadic else None
        src = f[2] if variadic else f[1]
        dst = f[-1]
        if ordinal & isa.IMPORT_BIT:
            imp = self.import_ordinal(ins, ordinal)
            self.import_operands(ins, imp, segments, src)
            results = imp.cconv.results
            if len(dst) > len(results):
                raise self.err(ins, f"call to {imp.full_name} expects {len(dst)} results, "
                                    f"import declares {len(results)}")
            for raw, t in zip(dst, results):
                self.typed_register(ins, raw, t)
            return
        if variadic:
            raise self.err(ins, "variadic calls only supported for imports")
        if ordinal >= len(self.module.functions):
            raise self.err(ins, f"function ordinal {ordinal} out of range")
        callee = self.module.functions[ordinal]
        if len(src) != len(callee.cconv.args) or len(dst) != len(callee.cconv.results):
            raise self.err(ins, f"call to {callee.name} does not match its signature")
        for raw, t in zip(src, callee.cconv.args):
            self.typed_register(ins, raw, t)
        for raw, t in zip(dst, callee.cconv.results):
            self.typed_register(ins, raw, t)

    def import_operands(self, ins: Any, imp: Any, segments: Any, src: Any) -> None:
        """The operands of an import call against its convention: one register per
        plain argument, `segments[i]` entries of the span's types per variadic span."""
        pos = 0
        for seg_i, t in enumerate(imp.cconv.args):
            if isinstance(t, tuple):
                if segments is None or seg_i >= len(segments):
                    raise self.err(ins, f"variadic call to {imp.full_name} lacks segment sizes")
                inner = t[1]
                if pos + segments[seg_i] * len(inner) > len(src):
                    raise self.err(ins, f"call to {imp.full_name} has too few operands")
                for _ in range(segments[seg_i]):
                    for it in inner:
                        self.typed_register(ins, src[pos], it)
                        pos += 1
            else:
                if pos >= len(src):
                    raise self.err(ins, f"call to {imp.full_name} has too few operands")
                self.typed_register(ins, src[pos], t)
                pos += 1
        if pos != len(src):
            raise self.err(ins, f"call to {imp.full_name} has {len(src)} operands, "
                                f"signature takes {pos}")

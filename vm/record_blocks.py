"""Recording blocks: the run of record calls that follows the import beginning a
command buffer, made by the VM in one call.

IREE's programs record one-shot command buffers inside VM loops (a recurrent model
records one per time step): a create, tens of dispatches, copies and barriers, often a
finalize, with only integer arithmetic and a pure lookup in between. Translated call by
call, each record operation is a Python call that validates its operands again, every
time. The translator (`vm.codegen`) instead finds such a run in a basic block
(`find_block`), emits the instructions in between as usual, keeps each record
operation's operands that are not literals in locals, and ends the run with one call of
a `RecordBlock` site with those values. Record operations change nothing but the command
buffer, which no instruction in between reads, so running them at the end of the run is
the same program.

Which imports begin, record into, finish or submit a command buffer, and which are pure,
is what their native module's table declares (`native_table.Traits`, read by the
import's full name): this module names no import of any module.

A block is described as data (`RecordBlock.ops`: per operation the import's ordinal and
its argument template, whose leaves are `("k", literal)`, `("d", index)` into the
values passed, or `("cb",)`, the command buffer that the first operation returned; a
variadic segment is a tuple of entries of leaves). The module providing the imports may
serve the block as a whole (a `NativeModule.block_recorder`: the `hal` module's adopts
the recording of equal operands, checking only the buffers); otherwise `replay` calls
the imports one by one, exactly as the unfused code would have.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from . import isa, native_table

__all__ = ["RecordBlock", "arguments", "begins_recording", "find_block", "find_execute",
           "is_pure", "replay", "target"]


def _traits(imp: Any) -> native_table.Traits | None:
    return native_table.traits_of(imp.full_name)


def begins_recording(imp: Any) -> bool:
    """Whether the import returns a new command buffer to record into."""
    traits = _traits(imp)
    return traits is not None and traits.role == native_table.BEGIN


def target(imp: Any) -> int:
    """The argument position of the command buffer a record operation records into."""
    return _traits(imp).target


def is_pure(imp: Any) -> bool:
    """Whether the import is pure: a block may hold it, and its call sites may keep their
    last result."""
    traits = _traits(imp)
    return traits is not None and traits.role == native_table.PURE


# Roles of record operations that may join a block: they change only the command buffer
# and capture nothing of host memory; finishing it ends the block.
_IN_BLOCK = frozenset({native_table.RECORD, native_table.FINISH})
# Roles of imports that may run between a block and the submit it is fused with.
_BEFORE_SUBMIT = frozenset({native_table.PURE, native_table.INDEPENDENT})
# Instructions that end a block before them: control flow, calls, output, failure.
MIN_RECORD_OPS = 2  # fewer record operations are not worth a block


class RecordBlock(NamedTuple):
    """One block: `ops` (import ordinal, argument template) in order, the first being
    `create`; `values` is how many values the site is called with.

    `execute` is None, or `(import ordinal, argument position)` of the queue execute
    that the block's command buffer goes to (`find_execute`): the site is then called
    at that execute with the execute's arguments, the values in the command buffer's
    place, records and submits, and returns what the execute returns (nothing)."""

    ops: tuple[tuple[int, tuple[Any, ...]], ...]
    values: int
    execute: tuple[int, int] | None = None


def call_operands(ins: Any) -> tuple[int, Sequence[int] | None, Sequence[int], Sequence[int]]:
    """(import ordinal or -1, segment sizes, sources, destinations) of a call."""
    f = ins.fields
    if ins.name == "call":
        ordinal, segments, src, dst = f[0], None, f[1], f[2]
    elif ins.name == "call.variadic":
        ordinal, segments, src, dst = f[0], f[1], f[2], f[3]
    else:
        return -1, None, (), ()
    if not ordinal & isa.IMPORT_BIT:
        return -1, None, (), ()
    return ordinal & ~isa.IMPORT_BIT, segments, src, dst


def _touches(ins: Any, ref: int) -> bool:
    """Whether `ins` names ref register `ref` (or does anything a block cannot hold)."""
    for (code, arg), value in zip(ins.layout, ins.fields):
        if code in ("r", "w") and arg == "ref":
            if value & isa.REF_MASK == ref:
                return True
        elif code == "V":
            if any(v & isa.REF_BIT and v & isa.REF_MASK == ref for v in value):
                return True
        elif code in ("O", "C", "B"):
            return True
    return False


def _names_ref(registers: Sequence[int], ref: int) -> bool:
    return any(r & isa.REF_BIT and r & isa.REF_MASK == ref for r in registers)


def find_block(instrs: Sequence[Any], start: int, imports: Sequence[Any]) -> int | None:
    """The index one past the last record operation of the block that `instrs[start]`
    begins (a `create`), or None when it begins none worth making."""
    k, _segments, _src, dst = call_operands(instrs[start])
    if k < 0 or k >= len(imports) or not begins_recording(imports[k]) or len(dst) != 1:
        return None
    cb = dst[0] & isa.REF_MASK
    last, count = None, 0
    for j in range(start + 1, len(instrs)):
        ins = instrs[j]
        k, _segments, src, dst = call_operands(ins)
        if k >= 0:
            if k >= len(imports):
                break
            traits = _traits(imports[k])
            role = traits.role if traits is not None else None
            if role in _IN_BLOCK:
                t = traits.target
                if (0 <= t < len(src) and src[t] & isa.REF_BIT and src[t] & isa.REF_MASK == cb
                        and not _names_ref(src[:t], cb) and not _names_ref(src[t + 1:], cb)
                        and not _names_ref(dst, cb)):
                    count += 1
                    last = j
                    if role == native_table.FINISH or src[t] & isa.MOVE_BIT:
                        break
                    continue
                break
            if (role == native_table.PURE and not _names_ref(src, cb)
                    and not _names_ref(dst, cb)):
                continue
            break
        if ins.name in isa.TERMINATORS or ins.name in isa.EFFECTS or _touches(ins, cb):
            break
    if count < MIN_RECORD_OPS:
        return None
    return last + 1


def find_execute(instrs: Sequence[Any], start: int, end: int,
                 imports: Sequence[Any]) -> tuple[int, int, int] | None:
    """(index, import ordinal, argument position of the command buffer) of the queue
    execute that the
    block `instrs[start:end]` may be fused with, or None. It must be the next use of
    the block's command buffer, moving it (its last use: the command buffer is never
    seen again, so it need not exist), with only instructions that a block may hold
    and pure or independent imports in between, none naming the command buffer; running the
    record operations at the execute is then the same program, as running them at the
    block's end is (an error of theirs surfaces at the execute)."""
    cb = call_operands(instrs[start])[3][0] & isa.REF_MASK
    last_k, _segments, last_src, _dst = call_operands(instrs[end - 1])
    last_traits = _traits(imports[last_k])
    if last_src[last_traits.target] & isa.MOVE_BIT:
        return None  # the block's last operation moved the command buffer
    for j in range(end, len(instrs)):
        ins = instrs[j]
        k, segments, src, dst = call_operands(ins)
        if k >= 0:
            if k >= len(imports):
                return None
            traits = _traits(imports[k])
            role = traits.role if traits is not None else None
            if role == native_table.SUBMIT and segments is None and not _names_ref(dst, cb):
                named = [p for p, r in enumerate(src)
                         if r & isa.REF_BIT and r & isa.REF_MASK == cb]
                if named == [traits.target] and src[traits.target] & isa.MOVE_BIT:
                    return j, k, traits.target
                return None
            if role in _BEFORE_SUBMIT and not _names_ref(src, cb) and not _names_ref(dst, cb):
                continue
            return None
        if ins.name in isa.TERMINATORS or ins.name in isa.EFFECTS or _touches(ins, cb):
            return None
    return None


def arguments(template: tuple[Any, ...], values: Sequence[Any], cb: Any) -> list[Any]:
    """The arguments of one operation, its template filled from `values`."""

    def leaf(item: tuple[Any, ...]) -> Any:
        kind = item[0]
        if kind == "k":
            return item[1]
        if kind == "d":
            return values[item[1]]
        return cb

    out: list[Any] = []
    for arg in template:
        if arg and arg[0].__class__ is str:
            out.append(leaf(arg))
        else:
            out.append([tuple(leaf(item) for item in entry) for entry in arg])
    return out


def replay(block: RecordBlock, functions: Sequence[Callable[..., Any]]
           ) -> Callable[..., Any]:
    """A site that calls the block's imports (`functions`, in `block.ops` order, then
    the execute's if it has one) one by one; it returns the command buffer the first
    (`create`) returned, or, fused with an execute, submits it by that import."""
    ops = [(template, fn) for (_k, template), fn in zip(block.ops, functions)]

    def run(values: tuple[Any, ...]) -> Any:
        (template, fn), rest = ops[0], ops[1:]
        cb = fn(*arguments(template, values, None))
        for template, fn in rest:
            fn(*arguments(template, values, cb))
        return cb

    if block.execute is None:
        return run
    execute, position = functions[len(ops)], block.execute[1]

    def run_and_execute(*args: Any) -> Any:
        return execute(*args[:position], run(args[position]), *args[position + 1:])

    return run_and_execute

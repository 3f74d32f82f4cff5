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

A recurrent step's queue operations around its block are two more sites: its head, the
allocas of its buffers with the fences that order them (`find_allocas`, `AllocaRun`),
and its tail, the new fences and the scratch buffer's dealloca around the block's
execute (`find_tail`, `RecordBlock.after`). Which imports make fences, join them,
allocate and deallocate is declared on their rows too (`native_table.Traits.step`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from . import isa, native_table
from .native_table import ALLOCA, DEALLOCA, JOIN_FENCES, NEW_FENCE

__all__ = ["AllocaRun", "RecordBlock", "arguments", "begins_recording", "find_allocas",
           "find_block", "find_execute", "find_tail", "imports_of", "is_pure", "replay",
           "target"]


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
    place, records and submits, and returns what the execute returns (nothing).

    `after` is None, or the step's tail (`find_tail`) fused with that execute:
    `(signal position, (new fence, new fence, dealloca))`, each operation (import
    ordinal, argument template) with leaves `("k", literal)`, `("x", position)` (the
    execute's argument there), `("a", 0)` (the one argument the site takes after the
    execute's), `("s", 0)` (the first new fence, which the execute signals: the site's
    argument at the signal position is ignored) or `("s", 1)` (the second). The site
    then returns the second fence, which the dealloca signals."""

    ops: tuple[tuple[int, tuple[Any, ...]], ...]
    values: int
    execute: tuple[int, int] | None = None
    after: tuple[int, tuple[tuple[int, tuple[Any, ...]], ...]] | None = None


class AllocaRun(NamedTuple):
    """The head of a recurrent step (`find_allocas`): an optional join of fences, then
    per buffer a new fence and a transient alloca waiting on that join (or on one
    fence) and signalling the new fence, then the join of those fences. `ops` are
    (import ordinal, argument template) in order, leaves `("k", literal)`, `("d", index)`
    into the values the site is called with, or `("o", op)`: the result of an earlier
    operation of the run. The site returns the results of the operations `results`
    names (the buffers, then the last join's fence) as a sequence."""

    ops: tuple[tuple[int, tuple[Any, ...]], ...]
    values: int
    results: tuple[int, ...]  # the operations whose results the site returns, in order
    execute: None = None  # as a block's: no execute


def imports_of(site: RecordBlock | AllocaRun) -> list[int]:
    """The ordinals of the imports a site's operations call, in order (a fused
    execute's, then its tail's, last)."""
    ordinals = [k for k, _template in site.ops]
    if site.execute is not None:
        ordinals.append(site.execute[0])
        if site.after is not None:
            ordinals.extend(k for k, _template in site.after[1])
    return ordinals


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


def _step_of(imports: Sequence[Any], k: int) -> str:
    traits = _traits(imports[k]) if 0 <= k < len(imports) else None
    return traits.step if traits is not None else ""


def _one_ref(dst: Sequence[int]) -> int | None:
    return dst[0] & isa.REF_MASK if len(dst) == 1 and dst[0] & isa.REF_BIT else None


def _ref_uses(src: Sequence[int], ref: int) -> list[int]:
    return [p for p, r in enumerate(src) if r & isa.REF_BIT and r & isa.REF_MASK == ref]


def find_allocas(instrs: Sequence[Any], start: int, imports: Sequence[Any]) -> int | None:
    """The index one past the head of a recurrent step that `instrs[start]` begins
    (`AllocaRun`), or None. The head is consecutive calls: an optional join of fences
    (its fence read by every alloca as its wait and by nothing after the last one),
    then two or more times a new fence and an alloca that signals it, then the join of
    exactly those fences, each moved there (read by nothing else). So the fences made
    inside the head never leave it: the site that serves it returns only the buffers
    and the last join, whatever fence stands for them; its imports run in the order
    they are written, errors at the alloca that raises them."""
    j, wait = start, None
    k, _segments, _src, dst = call_operands(instrs[j])
    if _step_of(imports, k) == JOIN_FENCES:
        wait = _one_ref(dst)
        if wait is None:
            return None
        j += 1
    made: list[int] = []  # the fences the allocas signal
    results: list[int] = []  # their buffers
    waits: list[int] = []  # the raw wait operand of each alloca
    while j + 1 < len(instrs):
        k, _segments, src, dst = call_operands(instrs[j])
        if _step_of(imports, k) != NEW_FENCE:
            break
        fence = _one_ref(dst)
        k2, _segments, src2, dst2 = call_operands(instrs[j + 1])
        if fence is None or _step_of(imports, k2) != ALLOCA or _one_ref(dst2) is None:
            return None
        traits = _traits(imports[k2])
        signal = src2[traits.signal]
        if (not signal & isa.REF_BIT or signal & isa.REF_MASK != fence or signal & isa.MOVE_BIT
                or _ref_uses(src2, fence) != [traits.signal] or _names_ref(src, fence)):
            return None
        waits.append(src2[traits.wait])
        made.append(fence)
        results.append(_one_ref(dst2))
        j += 2
    if len(made) < 2 or j >= len(instrs):
        return None
    k, segments, src, dst = call_operands(instrs[j])
    if (_step_of(imports, k) != JOIN_FENCES or _one_ref(dst) is None
            or [r & isa.REF_MASK for r in src if r & isa.REF_BIT] != made
            or not all(r & isa.MOVE_BIT for r in src if r & isa.REF_BIT)):
        return None
    first = waits[0]
    if any(w & ~isa.MOVE_BIT != first & ~isa.MOVE_BIT for w in waits) or any(
            w & isa.MOVE_BIT for w in waits[:-1]):
        return None
    if wait is not None and (not first & isa.REF_BIT or first & isa.REF_MASK != wait
                             or not waits[-1] & isa.MOVE_BIT):
        return None
    internal = set(made) | ({wait} if wait is not None else set())
    if len(set(results)) != len(results) or internal.intersection(results):
        return None
    for i in range(start + (wait is not None), j):  # no buffer made here is read here
        _k, _segments, src, _dst = call_operands(instrs[i])
        if any(_names_ref(src, b) for b in results):
            return None
    return j + 1


def find_tail(instrs: Sequence[Any], at: int, imports: Sequence[Any]) -> bool:
    """Whether the queue execute `instrs[at]` is the tail of a recurrent step: the call
    before it makes the new fence it signals, and the two after it make a new fence
    and dealloca a buffer waiting on the first fence (moving it: read by nothing else)
    and signalling the second. A site serving execute and tail returns the second
    fence (`RecordBlock.after`)."""
    if at < 1 or at + 2 >= len(instrs):
        return False
    k, _segments, src, _dst = call_operands(instrs[at])
    traits = _traits(imports[k])
    if traits is None or traits.signal < 0:
        return False
    signal = src[traits.signal]
    ran = signal & isa.REF_MASK
    if not signal & isa.REF_BIT or signal & isa.MOVE_BIT or _ref_uses(src, ran) != [traits.signal]:
        return False
    k1, _segments, src1, dst1 = call_operands(instrs[at - 1])
    k2, _segments, src2, dst2 = call_operands(instrs[at + 1])
    k3, _segments, src3, dst3 = call_operands(instrs[at + 2])
    if (_step_of(imports, k1) != NEW_FENCE or _one_ref(dst1) != ran
            or _step_of(imports, k2) != NEW_FENCE or _step_of(imports, k3) != DEALLOCA
            or dst3 or _names_ref(src1, ran) or _names_ref(src2, ran)):
        return False
    freed = _one_ref(dst2)
    dealloca = _traits(imports[k3])
    wait, signal = src3[dealloca.wait], src3[dealloca.signal]
    return (freed is not None and freed != ran and not _names_ref(src2, freed)
            and wait & isa.REF_BIT and wait & isa.REF_MASK == ran and bool(wait & isa.MOVE_BIT)
            and _ref_uses(src3, ran) == [dealloca.wait]
            and signal & isa.REF_BIT and signal & isa.REF_MASK == freed
            and not signal & isa.MOVE_BIT and _ref_uses(src3, freed) == [dealloca.signal])


def arguments(template: tuple[Any, ...], values: Sequence[Any], cb: Any) -> list[Any]:
    """The arguments of one operation, its template filled from `values` (and `cb` for
    the command buffer)."""
    return filled(template, lambda item: values[item[1]] if item[0] == "d" else cb)


def filled(template: tuple[Any, ...], leaf: Callable[[tuple[Any, ...]], Any]) -> list[Any]:
    """The arguments of one operation: its template with each leaf replaced by
    `leaf(leaf)` (literals by their value)."""
    out: list[Any] = []
    for arg in template:
        if arg and arg[0].__class__ is str:
            out.append(arg[1] if arg[0] == "k" else leaf(arg))
        else:
            out.append([tuple(item[1] if item[0] == "k" else leaf(item) for item in entry)
                        for entry in arg])
    return out


def replay(block: RecordBlock | AllocaRun, functions: Sequence[Callable[..., Any]]
           ) -> Callable[..., Any]:
    """A site that calls the block's imports (`functions`, in `imports_of(block)`
    order) one by one; it returns the command buffer the first (`create`) returned, or,
    fused with an execute, submits it by that import (and runs the tail after it, if
    any, returning its fence); an `AllocaRun`'s returns its buffers and last fence."""
    if isinstance(block, AllocaRun):
        return _replay_allocas(block, functions)
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
    if block.after is None:

        def run_and_execute(*args: Any) -> Any:
            return execute(*args[:position], run(args[position]), *args[position + 1:])

        return run_and_execute
    tail = after_replay(block, functions[len(ops) + 1:])

    def submit(arguments: list[Any]) -> None:
        arguments[position] = run(arguments[position])
        execute(*arguments)

    def run_execute_and_tail(*args: Any) -> Any:
        return tail(args, submit)

    return run_execute_and_tail


def after_replay(block: RecordBlock, functions: Sequence[Callable[..., Any]]
                 ) -> Callable[..., Any]:
    """`tail(args, submit)`: the tail of `block` (`RecordBlock.after`) run import by
    import (`functions`) around `submit(arguments)`, which submits the block with the
    execute's `arguments` (the site's `args` without its last, extra, one), their
    signal the first new fence; returns the second."""
    signal_at, ((_k1, new_ran), (_k2, new_freed), (_k3, dealloca)) = block.after
    fence_ran, fence_freed, free = functions

    def tail(args: tuple[Any, ...], submit: Callable[[list[Any]], Any]) -> Any:
        execute_args, extra = list(args[:-1]), args[-1]
        fences: list[Any] = []

        def leaf(item: tuple[Any, ...]) -> Any:
            kind = item[0]
            if kind == "x":
                return execute_args[item[1]]
            if kind == "a":
                return extra
            return fences[item[1]]

        fences.append(fence_ran(*filled(new_ran, leaf)))
        execute_args[signal_at] = fences[0]
        submit(execute_args)
        fences.append(fence_freed(*filled(new_freed, leaf)))
        free(*filled(dealloca, leaf))
        return fences[1]

    return tail


def _replay_allocas(run: AllocaRun, functions: Sequence[Callable[..., Any]]
                    ) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    ops = [(template, fn) for (_k, template), fn in zip(run.ops, functions)]
    results = run.results

    def site(values: tuple[Any, ...]) -> tuple[Any, ...]:
        made: list[Any] = []

        def leaf(item: tuple[Any, ...]) -> Any:
            return values[item[1]] if item[0] == "d" else made[item[1]]

        for template, fn in ops:
            made.append(fn(*filled(template, leaf)))
        return tuple(made[j] for j in results)

    return site

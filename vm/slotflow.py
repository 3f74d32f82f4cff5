"""What each 32-bit register slot holds where a branch runs, for ordered remap lists.

IREE copies a branch's operand list slot by slot, in order (`regflow.slot_hazard`), so
when the compiler emits a list that overwrites a slot a later pair still reads, the
target registers get what the slots held at that moment: an i64's high half may come
from an f32 or an i32, an f32 from an i64's half. The generator keeps an i64 whole in its
first slot's local, an f64 as a float there and an f32 as a float, so to give IREE's bits it must know, at the
branch, what each source slot holds, and what each destination register is (the type
of the value the list meant to move there).

`slot_states(fn, blocks, functions, imports)` answers with a forward data flow over the
function's blocks: per slot one of `i32`, `f32`, `i64`/`f64` (first slot), `i64.hi`/
`f64.hi` (second slot), or None where paths disagree or nothing typed it. It returns the
state at every branch instruction's pc, before its remaps.
"""

from __future__ import annotations

from . import isa
from .cconv import cconv_registers

_CCONV = {"i": "i32", "f": "f32", "I": "i64", "F": "f64"}
State = dict  # slot -> str | None


def _write(state: State, slot: int, t: str | None) -> None:
    if t in ("i64", "f64"):
        state[slot] = t
        state[slot + 1] = f"{t}.hi"
    else:
        state[slot] = t


def _typed_writes(ins, functions, imports) -> list[tuple[int, str | None]] | None:
    """(slot, type) of the integer registers `ins` writes; None if it cannot tell."""
    name, f = ins.name, ins.fields
    if isa.EFFECTS.get(name) == "call":
        ordinal, dst = f[0], f[-1]
        if ordinal & isa.IMPORT_BIT:
            k = ordinal & ~isa.IMPORT_BIT
            callee = imports[k] if k < len(imports) else None
        else:
            callee = functions[ordinal] if ordinal < len(functions) else None
        if callee is None:
            return None
        return [(raw, _CCONV.get(t)) for raw, t in zip(dst, callee.cconv.results)
                if not raw & isa.REF_BIT]
    out = []
    for (code, arg), val in zip(ins.layout, f):
        if code == "w" and arg != "ref":
            out.append((val, arg))
    return out


def _edges(ins, block_of: dict, next_block: int | None) -> list[tuple[int, tuple]]:
    """(target block, remap pairs) of each way out of `ins`, by its operand layout: "BO"
    a jump, "rBOBO" a conditional branch, "rBO" a conditional break (or on), "rBOHC" a
    table; a call that may yield resumes at its block; other terminators leave."""
    f = ins.fields
    fall = [(next_block, ())] if next_block is not None else []
    if ins.name not in isa.TERMINATORS:
        return fall
    shape = "".join(code for code, _a in ins.layout)
    if shape == "BO":
        return [(block_of[f[0]], f[1])]
    if shape == "rBOBO":
        return [(block_of[f[1]], f[2]), (block_of[f[3]], f[4])]
    if shape == "rBO":
        return [(block_of[f[1]], f[2])] + fall
    if shape == "rBOHC":
        return [(block_of[f[1]], f[2])] + [(block_of[t], p) for t, p in f[4]]
    if isa.EFFECTS.get(ins.name) == "call":
        return [(block_of[f[-2]], ())]
    return []


def remapped(state: State, pairs) -> State:
    """`state` after the remap `pairs`: each destination slot holds the type of the value
    the list meant to move there (the source's before the list, or as an earlier pair
    of the list wrote it, or, where that is unknown, of what lands there), whatever bits
    IREE's ordered moves leave in it, as the generator keeps it (an i64 whole in its
    first slot's local, an f32 as a float)."""
    out = dict(state)
    moved = dict(state)  # what IREE's ordered moves leave in each slot
    written: dict[int, str | None] = {}  # the intent of the list's own earlier writes
    for s, d in pairs:
        if not s & isa.REF_BIT:
            moved[d] = moved.get(s)
            # a slot an earlier pair wrote (a temporary of a swap) carries that pair's
            # intent; unknown intent: the generator copies the bits that land (an i64's
            # half as an i32)
            meant = written[s] if s in written else state.get(s)
            out[d] = written[d] = (meant if meant is not None
                                   else _LANDED.get(moved[d], moved[d]))
    return out


_LANDED = {"i64": "i32", "i64.hi": "i32", "f64": None, "f64.hi": None}


def _join(a: State, b: State) -> State:
    return {k: a.get(k) if a.get(k) == b.get(k) else None for k in a.keys() | b.keys()}


def slot_states(fn, blocks: list, functions, imports) -> dict[int, State] | None:
    """The slots' state before each branch's remaps, by the branch's pc (see the module
    docstring); None when an instruction's writes cannot be typed."""
    block_of = {blk[0].pc: bi for bi, blk in enumerate(blocks)}
    entry: State = {}
    for t, (bank, reg) in zip(fn.cconv.args, cconv_registers(fn.cconv.args)):
        if bank == "i":
            _write(entry, reg, _CCONV[t])
    ins_state: list[State | None] = [None] * len(blocks)
    ins_state[0] = entry
    at_branch: dict[int, State] = {}
    work = [0]
    while work:
        bi = work.pop()
        state = dict(ins_state[bi])
        blk = blocks[bi]
        next_block = bi + 1 if bi + 1 < len(blocks) else None
        for ins in blk:
            if ins.name == "block":
                continue
            edges = _edges(ins, block_of, next_block) if (
                ins.name in isa.TERMINATORS or ins is blk[-1]) else []
            if any(p for _, p in edges):
                at_branch[ins.pc] = state
            writes = _typed_writes(ins, functions, imports)
            if writes is None:
                return None
            resumes = ins.name in isa.TERMINATORS and isa.EFFECTS.get(ins.name) == "call"
            if not resumes:  # a call that may yield writes its results where it resumes
                for slot, t in writes:
                    _write(state, slot, t)
            for target, pairs in edges:
                arriving = remapped(state, pairs)
                if resumes:
                    for slot, t in writes:
                        _write(arriving, slot, t)
                before = ins_state[target]
                joined = arriving if before is None else _join(before, arriving)
                if joined != before:
                    ins_state[target] = joined
                    work.append(target)
    return at_branch


def source_kind(state: State, slot: int) -> tuple[str, int]:
    """What reading `slot` means for the generator's locals: ("lo", s) / ("hi", s) for a
    half of the i64 whose local is `i<s>`, ("dlo", s) / ("dhi", s) for a half of the
    f64 (a float local) there, ("f32", s) for a float local, ("i32", s) for an int local,
    ("?", s) when unknown."""
    t = state.get(slot)
    if t == "i64":
        return ("lo", slot)
    if t == "i64.hi":
        return ("hi", slot - 1)
    if t == "f64":
        return ("dlo", slot)
    if t == "f64.hi":
        return ("dhi", slot - 1)
    if t in ("i32", "f32"):
        return (t, slot)
    return ("?", slot)


__all__ = ["remapped", "slot_states", "source_kind"]

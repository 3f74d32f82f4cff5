"""Translates verified bytecode functions into Python source, compiled once per module.

The phases: `isa` decodes, `verifier` checks every operand and cuts the blocks, `regflow`
analyses integer data flow, and this module emits, from the instruction templates that
`templates` renders from the op table (`optable`) and its own handlers for the ops whose
rows say HANDWRITTEN; it takes the verified input as meant and
raises nothing of its own. `instantiate` runs the result over a context's `Linkage`.

Every VM function becomes one Python function whose registers are local variables
(`i<n>` for the 32-bit bank, where f32 values and whole i64/f64 values live in their
first slot, and `r<n>` for refs), so the inner loop does no dict look-ups, attribute
chains or allocation per instruction. Basic blocks are dispatched by a block index
through a binary `if` tree inside one `while` loop.

Integer arithmetic follows the function's data flow (`regflow.py`): single-use results
stay unwrapped inside their reader's expression and are wrapped once where stored,
constant registers become literals, compares fold into their branch, loop-carried
values are computed in place and may be held unsigned, and counted loops become
`for ... in range`.

A function that may suspend (it contains `vm.yield`, `call.yieldable` or calls such a
function) is generated as a Python generator: suspension points `yield` either `None`
(`vm.yield`) or a `native.Suspend`, and internal calls to such functions use
`yield from`, so the whole VM stack suspends and resumes as one coroutine.

Nothing read from the module is pasted into source except integers formatted here;
strings and floats go through the per-module constant table `_K`.
"""

from __future__ import annotations

import linecache
import marshal
import math
import re
import sys
import types
from typing import TYPE_CHECKING, NamedTuple

from . import isa, native_table, ops, record_blocks, scalar
from .cconv import cconv_registers
from .linkage import Linkage
from .templates import H32, H64, HELPERS, M32, M64, template, wrap32_expr, wrap64_expr

if TYPE_CHECKING:  # the verifier runs only when a module is translated, not on a cache hit
    from .verifier import VerifiedFunction


def element_type_name(type_name: str) -> str:
    """Maps a module type-table name to a VMList element type / ref type name."""
    t = type_name.strip()
    if t in ("i8", "i16", "i32", "i64", "f32", "f64"):
        return t
    if t in ("!vm.opaque", "?", "!vm.ref<?>", "opaque"):
        return "variant"
    if t.startswith("!"):
        t = t[1:]
    if t.startswith("vm.ref<") and t.endswith(">"):
        t = t[7:-1].lstrip("!")
    lt = t.find("<")
    if lt > 0:
        t = t[:lt]
    return t


class ModuleProgram(NamedTuple):
    """The compiled Python form of a module, instantiated per context."""

    code: object  # code object defining `_f<ordinal>` functions
    filename: str
    source: str
    line_pcs: list  # line number (1-based) -> (ordinal, pc) or None
    generator_ordinals: frozenset
    constants: list
    function_count: int
    native_loops: dict  # ordinal -> scalar.ScalarProgram run natively in place of `_f<n>`
    record_blocks: tuple  # site -> record_blocks.RecordBlock, called as `_blk<site>`
    native_entries: dict  # ordinal -> scalar.EntryProgram: a VMVX workgroup function in C
    trace_sites: tuple = ()  # traced translations: site -> (ordinal, pc, vm.trace parts)

    def replaced(self, **changes: object) -> ModuleProgram:
        """This program with the fields in `changes` replaced (the translation cache
        stores the code marshalled and adopts an entry under a file name of its own)."""
        return self._replace(**changes)


class _Gen:
    """Per-function source emitter."""

    def __init__(self, module, verified: VerifiedFunction, program_state,
                 traced: bool = False) -> None:
        self.module = module
        self.traced = traced
        self.fn = verified.function
        self.st = program_state
        self.i32_limit = verified.i32_limit
        self.lines: list[tuple[int, str, int]] = []  # (indent, text, pc)
        self.i_regs: set[int] = set()
        self.r_regs: set[int] = set()
        self.uses_fa = False
        self.block_index: dict[int, int] = verified.block_index
        self.blocks: list = verified.blocks
        self.cur_block = -1
        self.loop_mode = False
        self.self_loop_used = False
        self.inlining = False
        from . import regflow  # the translator's analysis: a warm cache never imports it

        self.flow = regflow.Flow()
        self.slot_states: dict | None = None  # `slotflow.slot_states`, when first needed
        self.pending: dict[str, tuple[str, bool]] = {}  # fused ring results (expr, bounded)
        self.pending_cond: tuple[str, str] | None = None  # folded compare (register, cond)
        self.lazy: dict[str, int] = {}  # registers carried unreduced in this counted loop

    # -- register helpers
    def ireg(self, raw: int) -> str:
        """The value of an integer/float register as an expression, for a read."""
        return self.read(self.ireg_name(raw))

    def read(self, name: str) -> str:
        c = self.flow.constants.get(name)
        if c is not None:
            return str(c) if c >= 0 else f"({c})"
        w = self.flow.unsigned.get(name)
        if w is not None:
            h = H32 if w == 32 else H64
            return f"(({name} ^ {h}) - {h})"
        return name

    def ireg_name(self, raw: int) -> str:
        """The local holding an integer/float register (an i64/f64 lives whole in its
        first slot's local), for a write."""
        self.i_regs.add(raw)
        return f"i{raw}"

    def rreg(self, raw: int) -> str:
        idx = raw & isa.REF_MASK
        self.r_regs.add(idx)
        return f"r{idx}"

    def anyreg(self, raw: int) -> str:
        """A register of either bank, for a read."""
        if raw & isa.REF_BIT:
            return self.rreg(raw)
        return self.ireg(raw)

    def const(self, value) -> str:
        return f"_K[{self.st.constant(value)}]"

    def type_name(self, type_id: int) -> str:
        return element_type_name(self.module.types[type_id])

    def block(self, target: int) -> int:
        return self.block_index[target]

    # -- emit
    def emit(self, indent: int, text: str, pc: int) -> None:
        self.lines.append((indent, text, pc))

    def check_ref(self, indent: int, reg: str, type_name: str, what: str, pc: int) -> None:
        """Checks that the ref in `reg` may be held where `type_name` is declared: a set
        lookup of its class among those already accepted for that type (`_RC<k>`), and a
        call of `ops.check_ref_class` only for a class not seen there yet."""
        k = self.st.constant(type_name)
        self.st.ref_class_sets.add(k)
        self.emit(indent, f"if {reg}.__class__ not in _RC{k}: "
                          f"_check_ref_class({reg}, _K[{k}], {what!r}, _RC{k})", pc)

    def remap(self, ins, pairs, indent: int, target_pc: int) -> None:
        """The copies of a branch's operand list into the block at `target_pc`."""
        from . import regflow

        skipped = self.flow.skipped_pairs.get(ins.pc, ())
        if regflow.slot_hazard(pairs):
            self.remap_slots(ins, [p for p in pairs if not p[0] & isa.REF_BIT], indent,
                             target_pc)
            pairs = [p for p in pairs if p[0] & isa.REF_BIT]
        for src, dst in pairs:
            if not src & isa.REF_BIT:
                s = self.ireg_name(src)
                d = self.ireg_name(dst)
                if s != d and (s, d) not in skipped:
                    self.emit(indent, f"{d} = {self.copy_value(s, d)}", ins.pc)
                continue
            s = self.rreg(src)
            d = self.rreg(dst)
            if s != d:
                self.emit(indent, f"{d} = {s}", ins.pc)
                if src & isa.REF_BIT and src & isa.MOVE_BIT:
                    self.emit(indent, f"{s} = None", ins.pc)

    def remap_slots(self, ins, pairs, indent: int, target_pc: int) -> None:
        """An integer remap list that reads a slot an earlier pair of it wrote, run as
        IREE runs every list: 32-bit slot moves one after another, so a later pair sees
        the earlier writes, halves of an i64 or f64 included (each lives whole in its
        first slot's local here, an f64 as a float, so its halves are split out of its
        bits and joined back as needed: where both halves move together, or where the
        target block reads the pair written as one i64 or f64)."""
        for src, dst in pairs:
            self.ireg_name(src)
            self.ireg_name(dst)
        wide = self.wide_slots(ins)
        # what each slot holds here (`slotflow`): a destination register is of the type
        # the list meant to move into it, and gets the bits its slots really receive
        from . import slotflow  # only a function with such a list needs it

        if self.slot_states is None:
            self.slot_states = slotflow.slot_states(
                self.fn, self.blocks, self.module.functions, self.module.imports) or {}
        before = self.slot_states.get(ins.pc, {})

        def initial(slot: int) -> tuple[str, int]:
            known = slotflow.source_kind(before, slot)
            if known[0] != "?":
                return known
            if slot in wide:
                return ("lo", slot)
            if slot & 1 and slot - 1 in wide:
                return ("hi", slot - 1)
            return ("?", slot)

        state: dict[int, tuple[str, int]] = {}
        meant: dict[int, str | None] = {}
        for src, dst in pairs:
            state[dst] = state.get(src) or initial(src)
            meant[dst] = meant[src] if src in meant else before.get(src)
        wide_dst = {d for d, (kind, slot) in state.items()
                    if not d & 1 and kind == "lo" and state.get(d + 1) == ("hi", slot)}
        wide_dst |= {d for d, t in meant.items() if t in ("i64", "f64")}
        wide_dst |= {d - 1 for d, t in meant.items() if t in ("i64.hi", "f64.hi")}
        read_as = {d: self.first_read_wide(target_pc, d) for d in state
                   if not d & 1 and d + 1 in state}
        wide_dst |= {d for d, t in read_as.items() if t}
        double_dst = {d for d in wide_dst if meant.get(d) == "f64" or meant.get(d + 1) ==
                      "f64.hi" or (meant.get(d) is None and read_as.get(d) == "f64")}

        def half(value: tuple[str, int]) -> str:
            kind, slot = value
            r = self.read(f"i{slot}")
            if kind in ("dlo", "dhi"):
                r = f"_bitcast_f64_i64({r})"
            if kind in ("lo", "dlo"):
                return f"((({r} & {M32}) ^ {H32}) - {H32})"
            if kind in ("hi", "dhi"):
                return f"({r} >> 32)"
            return r

        def bits(value: tuple[str, int]) -> str:
            r = half(value)
            if value[0] == "f32":
                return f"_bitcast_f32_i32({r})"
            if value[0] == "?":
                return f"(_bitcast_f32_i32({r}) if ({r}).__class__ is not int else {r})"
            return r

        out: list[tuple[str, str]] = []
        for dst in sorted(state):
            if dst & 1 and dst - 1 in wide_dst:
                continue
            if dst in wide_dst:
                lo = state.get(dst) or initial(dst)
                hi = state.get(dst + 1) or initial(dst + 1)
                double = dst in double_dst
                if (lo[0], hi) in ((("lo", ("hi", lo[1])), ("dlo", ("dhi", lo[1]))) if double
                                   else (("lo", ("hi", lo[1])),)):
                    value = self.read(f"i{lo[1]}")  # whole, of the type meant
                else:
                    value = f"({bits(hi)} << 32) | ({bits(lo)} & {M32})"
                    if double:
                        value = f"_bitcast_i64_f64(({value}) & {M64})"
            elif meant[dst] == "f32" and state[dst][0] != "f32":
                value = f"_bitcast_i32_f32({bits(state[dst])})"
            elif meant[dst] == "i32":
                value = bits(state[dst])
            else:
                value = half(state[dst])
            out.append((f"i{dst}", value))
        for k, (_, value) in enumerate(out):
            self.emit(indent, f"_m{k} = {value}", ins.pc)
        for k, (name, _) in enumerate(out):
            self.emit(indent, f"{name} = _m{k}", ins.pc)

    def first_read_wide(self, target_pc: int, slot: int) -> str | None:
        """"i64" or "f64" when the block at `target_pc` first reads `slot` as (the low
        half of) one, before anything writes it; None when it writes it first, reads it
        as 32 bits, or passes it on in a register list or to another block."""
        for other in self.blocks[self.block(target_pc)][1:]:
            for (code, arg), val in zip(other.layout, other.fields):
                if code == "r" and val == slot:
                    return arg if arg in ("i64", "f64") else None
                if code in ("V", "O", "C"):
                    return None
            if any(code == "w" and val <= slot <= val + (arg in ("i64", "f64"))
                   for (code, arg), val in zip(other.layout, other.fields)):
                return None
        return None

    def wide_slots(self, ins, held: str = "i64") -> set[int]:
        """First slots of the registers holding an i64 (or another type `held`) when
        `ins` runs: by the last typed write in its block, else by every typed write in the
        function being of that type."""
        params = {reg: {"I": "i64", "F": "f64", "i": "i32", "f": "f32"}[t]
                  for t, (bank, reg) in zip(self.fn.cconv.args,
                                            cconv_registers(self.fn.cconv.args))
                  if bank == "i"}
        kinds: dict[int, set] = {reg: {arg} for reg, arg in params.items()}
        for blk in self.blocks:
            for other in blk:
                for (code, arg), val in zip(other.layout, other.fields):
                    if code == "w" and arg != "ref":
                        kinds.setdefault(val, set()).add(arg)
        last: dict[int, str] = {}
        for bi, blk in enumerate(self.blocks):
            if blk[0].pc <= ins.pc <= blk[-1].pc:
                if bi == 0:
                    for reg, arg in params.items():
                        last[reg] = arg
                        if arg in ("i64", "f64"):
                            last[reg + 1] = "hi"
                for other in blk:
                    if other.pc >= ins.pc:
                        break
                    for (code, arg), val in zip(other.layout, other.fields):
                        if code == "w" and arg != "ref":
                            last[val] = arg
                            if arg in ("i64", "f64"):
                                last[val + 1] = "hi"
                            elif val & 1 and last.get(val - 1) in ("i64", "f64"):
                                last[val - 1] = "split"
                break
        wide = set()
        for slot, ks in kinds.items():
            arg = last.get(slot)
            if arg == held or (arg is None and ks == {held} and (
                    held not in ("i64", "f64") or slot + 1 not in last)):
                wide.add(slot)
        return wide

    def copy_value(self, src: str, dst: str) -> str:
        """`src`'s value in the form `dst` holds (see regflow: constant, unsigned)."""
        w = self.flow.unsigned.get(dst)
        if w is None:
            return self.read(src)
        if self.flow.unsigned.get(src) == w:
            return src
        m = M32 if w == 32 else M64
        c = self.flow.constants.get(src)
        if c is not None:
            return str(c & int(m))
        return f"{src} & {m}"

    def jump(self, ins, target_pc: int, pairs, indent: int) -> None:
        self.remap(ins, pairs, indent, target_pc)
        self.goto(indent, self.block(target_pc), ins.pc)

    def goto(self, indent: int, idx: int, pc: int, pre: tuple = ()) -> None:
        """Transfers control to block `idx` (after emitting `pre` lines)."""
        if self.loop_mode and idx == self.cur_block:
            for line in pre:
                self.emit(indent, line, pc)
            self.emit(indent, "continue", pc)  # the block's own `while` loop
            self.self_loop_used = True
            return
        self.emit(indent, f"_b = {idx}", pc)
        for line in pre:
            self.emit(indent, line, pc)
        self.emit(indent, "break" if self.loop_mode else "continue", pc)

    # Blocks this small are duplicated into an unconditional branch that targets them
    # (typically a loop header: compare + cond_br), saving a dispatch per iteration and
    # turning loops into self-loops that run as a plain Python `while`.
    TAIL_DUP_MAX = 4

    def _start_block(self, bi: int, loop_mode: bool) -> None:
        """Fresh emission state for block `bi`."""
        self.lines = []
        self.pending = {}
        self.pending_cond = None
        self.cur_block = bi
        self.loop_mode = loop_mode
        self.self_loop_used = False

    def _emit_block(self, bi: int, blk: list, loop_mode: bool) -> list:
        self._start_block(bi, loop_mode)
        self._emit_run(blk[1:], 0)
        if blk[-1].name not in isa.TERMINATORS:
            if bi + 1 < len(self.blocks):
                self.goto(0, bi + 1, blk[-1].pc)
            else:
                self.emit(0, "raise _fail(13, _FALLOFF)", blk[-1].pc)
        return self.lines

    def _emit_counted(self, bi: int, blk: list, loop: tuple) -> list:
        """A counted loop (regflow): the block's body under `for counter in range(...)`,
        its header's compare and step replaced by the range."""
        counter, bound, step_pc, header = loop
        self._start_block(bi, False)
        self.has_branches = True
        cmp, cond_br = self.blocks[header][1:]
        self.emit(0, f"for {counter} in range({counter}, {self.read(bound)}):", cmp.pc)
        self.lazy = self.flow.lazy.get(bi, {})
        self._emit_run([ins for ins in blk[1:-1] if ins.pc != step_pc], 1)
        br = blk[-1]
        self.remap(br, br.fields[1], 1, br.fields[0])
        if self.lines[-1][0] == 0:
            self.emit(1, "pass", br.pc)
        for name, width in sorted(self.lazy.items()):
            self.emit(0, f"{name} &= {M32 if width == 32 else M64}", br.pc)
        self.lazy = {}
        self.emit(0, f"{counter} += 1", step_pc)
        self.jump(cond_br, cond_br.fields[3], cond_br.fields[4], 0)
        return self.lines

    def generate(self) -> list[tuple[int, str, int]]:
        from . import regflow

        fn = self.fn
        blocks = self.blocks
        i_params = [f"i{reg}" for bank, reg in cconv_registers(fn.cconv.args) if bank == "i"]
        self.flow = (regflow.Flow() if self.traced else
                     regflow.analyse(fn, blocks, self.block_index, i_params,
                                     self.module.functions, self.module.imports,
                                     isa.TERMINATORS) or regflow.Flow())
        bodies: list[list[tuple[int, str, int]]] = []
        for bi, blk in enumerate(blocks):
            if bi in self.flow.counted:
                bodies.append(self._emit_counted(bi, blk, self.flow.counted[bi]))
                continue
            lines = self._emit_block(bi, blk, True)
            if self.self_loop_used:
                body = [(0, "while 1:", -1)]
                body += [(ind + 1, text, pc) for ind, text, pc in lines]
                body.append((0, "continue", -1))
            else:
                body = self._emit_block(bi, blk, False)
            bodies.append(body)

        # Header: parameters and register initialisation.
        params = []
        for bank, reg in cconv_registers(fn.cconv.args):
            params.append(f"{bank}{reg}")
        param_set = set(params)
        out: list[tuple[int, str, int]] = []
        name = f"_f{fn.ordinal}"
        out.append((0, f"def {name}({', '.join(params)}):", -1))
        inits_i = [f"i{n}" for n in sorted(self.i_regs) if f"i{n}" not in param_set]
        inits_r = [f"r{n}" for n in sorted(self.r_regs) if f"r{n}" not in param_set]
        for chunk in _chunks(inits_i, 32):
            out.append((1, " = ".join(chunk) + " = 0", -1))
        for chunk in _chunks(inits_r, 32):
            out.append((1, " = ".join(chunk) + " = None", -1))
        if self.uses_fa:
            out.append((1, "_fa = _array('f', _Z)", -1))
        if self.traced:
            from . import trace

            out.append((1, self.trace_call(trace.entry_site(), blocks[0][0].pc), blocks[0][0].pc))
        if len(blocks) == 1 and not self.has_branches:
            for indent, text, pc in bodies[0]:
                if text == "continue" or text.startswith("_b = "):
                    continue
                out.append((1 + indent, text, pc))
            return out
        out.append((1, "_b = 0", -1))
        out.append((1, "while 1:", -1))
        self._tree(out, bodies, 0, len(blocks), 2)
        return out

    has_branches = False

    def _tree(self, out, bodies, lo: int, hi: int, indent: int) -> None:
        if hi - lo == 1:
            for ind, text, pc in bodies[lo]:
                out.append((indent + ind, text, pc))
            return
        if hi - lo == 2:
            out.append((indent, f"if _b == {lo}:", -1))
            self._tree(out, bodies, lo, lo + 1, indent + 1)
            out.append((indent, "else:", -1))
            self._tree(out, bodies, lo + 1, hi, indent + 1)
            return
        mid = (lo + hi) // 2
        out.append((indent, f"if _b < {mid}:", -1))
        self._tree(out, bodies, lo, mid, indent + 1)
        out.append((indent, "else:", -1))
        self._tree(out, bodies, mid, hi, indent + 1)

    # -- one instruction
    def instruction(self, ins, ind: int) -> None:
        from . import regflow

        name = ins.name
        f = ins.fields
        pc = ins.pc
        if self.traced:
            self.emit(ind, self.trace_call(self.trace_site(ins), pc), pc)
        if pc in self.flow.constant_defs:
            self.ireg_name(f[-1])
            return
        ring = regflow.RING_OPS.get(name)
        if ring is not None:
            self.ring_op(ins, ring, ind)
            return
        if name.startswith("const.i") and not name.endswith(".ref"):
            res = self.ireg_name(f[-1])
            w = self.flow.unsigned.get(res)
            if w is not None:
                value = 0 if name.endswith("zero") else f[0]
                self.emit(ind, f"{res} = {value & (2**w - 1)}", pc)
                return
        tmpl = template(name)
        if tmpl is not None:
            args = []
            for (code, arg), val in zip(ins.layout, f):
                if code in ("r", "w"):
                    if arg == "ref":
                        args.append(self.rreg(val))
                    elif code == "w":
                        args.append(self.ireg_name(val))
                    else:
                        args.append(self.ireg(val))
                elif code == "S":
                    args.append(self.const(val))
                else:  # A: a literal; G: a global's byte offset; D: a rodata ordinal
                    args.append(val)
            text = tmpl.format(*args)
            if pc in self.flow.fused_cmps and self.fold_compare(ins, text):
                return
            if "_fa[" in text:  # not "_fa": `_fail` is no reason for the array
                self.uses_fa = True
            for line in text.split("\n"):
                self.emit(ind, line, pc)
            return
        getattr(self, "op_" + name.replace(".", "_"))(ins, f, ind)

    def trace_site(self, ins):
        """What `vm.trace` makes of `ins` (see there), with this function's register
        layout: which slots hold an i64 or f64 whole, the callees' conventions."""
        from . import trace

        wide = self.wide_slots(ins)
        f64 = self.f64_slots()

        def slot_kind(raw: int) -> str:
            if raw & 1 and raw - 1 in wide:
                return "u32hi"
            if raw in f64:
                return "u32d"
            if raw & 1 and raw - 1 in f64:
                return "u32dhi"
            if raw & 1:  # after a slot that may hold an i64 whole: told by its value
                return "u32pair"
            return "u32"

        def arg_kinds(ordinal: int) -> tuple:
            if ordinal & isa.IMPORT_BIT:
                return trace.list_kinds(self.module.imports[ordinal & ~isa.IMPORT_BIT].cconv.args)
            return trace.list_kinds(self.module.functions[ordinal].cconv.args)

        return trace.describe(self.module, ins, slot_kind, arg_kinds,
                              tuple(self.fn.cconv.results))

    def f64_slots(self) -> set[int]:
        """First slots that some instruction (or a parameter) of the function types f64."""
        slots = {reg for t, (_bank, reg) in zip(self.fn.cconv.args,
                                                cconv_registers(self.fn.cconv.args))
                 if t == "F"}
        for blk in self.blocks:
            for other in blk:
                for (code, arg), val in zip(other.layout, other.fields):
                    if code in ("r", "w") and arg == "f64":
                        slots.add(val)
        return slots

    def trace_call(self, site, pc: int) -> str:
        """`_tr(k, (values,))`: prints the site's line with the registers it reads."""
        k = self.st.trace_site(self.fn.ordinal, pc, tuple(site.parts))
        values = []
        for raw, kind in site.reads:
            if kind == "ref":
                values.append(self.rreg(raw))
            elif kind in ("u32hi", "u32dhi"):
                values.append(self.ireg(raw - 1))
            elif kind == "u32pair":
                values.append(f"({self.ireg(raw - 1)}, {self.ireg(raw)})")
            else:
                values.append(self.ireg(raw))
        return f"_tr({k}, ({''.join(v + ', ' for v in values)}))"

    def fold_compare(self, ins, text: str) -> bool:
        """Keeps a compare whose only reader is the next cond_br as that branch's
        condition instead of materialising 0/1."""
        res = self.ireg_name(ins.fields[-1])
        for head, tail, negate in ((f"{res} = 1 if ", " else 0", False),
                                   (f"{res} = 0 if ", " else 1", True)):
            if text.startswith(head) and text.endswith(tail) and "\n" not in text:
                cond = text[len(head): len(text) - len(tail)]
                self.pending_cond = (res, f"not ({cond})" if negate else f"({cond})")
                return True
        return False

    def ring_op(self, ins, ring, ind: int) -> None:
        """add/sub/mul/fma/and/or/xor/not/shl: operands that regflow fused are substituted
        unwrapped; the result is wrapped once, only where it is stored."""
        tmpl, width, ring_pos, bitwise = ring.expr, ring.width, ring.positions, ring.bitwise
        f = ins.fields
        operands = []
        bounded = bitwise
        lits: list[int | None] = []
        canonical: list[bool] = []
        for i, val in enumerate(f[:-1]):
            name = self.ireg_name(val)
            lit = self.flow.constants.get(name)
            lits.append(lit if i in ring_pos else None)
            canonical.append(True)
            if i not in ring_pos:
                operands.append(self.read(name))
            elif name in self.pending:
                text, b = self.pending.pop(name)
                operands.append(f"({text})")
                bounded = bounded and b
                canonical[-1] = b
            elif lit is not None:
                operands.append(self.read(name))
            elif self.flow.unsigned.get(name) == width:
                operands.append(name)
                bounded = False
                canonical[-1] = False
            else:
                operands.append(self.read(name))
        expr = tmpl.format(*operands)
        res = self.ireg_name(f[-1])
        pc = ins.pc
        if pc in self.flow.fused:
            self.pending[res] = (expr, bounded or pc in self.flow.in_range)
            return
        target = self.flow.rename.get(pc, res)
        self.i_regs.add(int(target[1:]))
        m, h = (M32, H32) if width == 32 else (M64, H64)
        hi, lo = (2**31 - 1, -(2**31)) if width == 32 else (2**63 - 1, -(2**63))
        if target in self.lazy:  # reduced once, after its counted loop
            self.emit(ind, f"{target} = {expr}", pc)
            return
        if target in self.flow.unsigned:
            self.emit(ind, f"{target} = ({expr}) & {m}", pc)
            return
        if bounded or pc in self.flow.in_range:
            self.emit(ind, f"{target} = {expr}", pc)
            return
        side = _one_sided(ins.name, canonical, lits, width)
        self.emit(ind, f"{target} = {expr}", pc)
        if side > 0:
            self.emit(ind, f"if {target} > {hi}: {target} -= {int(m) + 1}", pc)
        elif side < 0:
            self.emit(ind, f"if {target} < {lo}: {target} += {int(m) + 1}", pc)
        else:
            self.emit(ind, f"if {target} > {hi} or {target} < {lo}: "
                           f"{target} = ({target} + {h} & {m}) - {h}", pc)

    def moved(self, raw: int) -> bool:
        return bool(raw & isa.REF_BIT and raw & isa.MOVE_BIT)

    def clear_moved(self, ins, raws, keep: set, ind: int) -> None:
        for raw in raws:
            if self.moved(raw):
                name = f"r{raw & isa.REF_MASK}"
                if name not in keep:
                    self.emit(ind, f"{name} = None", ins.pc)

    # constants that need exact float bits
    def op_const_f32(self, ins, f, ind):
        res = self.ireg_name(f[1])
        if ops.is_subnormal_f32(f[0]):
            # whether its float value is the subnormal or a zero depends on the
            # floating-point state it runs under (denormals-are-zero in a dispatch)
            self.emit(ind, f"{res} = _f32_from_bits({f[0] & 0xFFFFFFFF})", ins.pc)
            return
        self.emit(ind, f"{res} = {self._float_literal(ops.f32_from_bits(f[0]))}", ins.pc)

    def op_const_f64(self, ins, f, ind):
        self.emit(ind, f"{self.ireg_name(f[1])} = {self._float_literal(f[0])}", ins.pc)

    def _float_literal(self, value: float) -> str:
        if value.__class__ is float and math.isfinite(value):
            return repr(value)
        return self.const(value)

    def op_global_load_ref(self, ins, f, ind):
        g = f[0]
        t = self.type_name(f[1])
        res = self.rreg(f[2])
        self.emit(ind, f"{res} = _GR[{g}]", ins.pc)
        self.check_ref(ind, res, t, "global.load.ref", ins.pc)
        if f[2] & isa.MOVE_BIT:
            self.emit(ind, f"_GR[{g}] = None", ins.pc)

    def op_global_store_ref(self, ins, f, ind):
        g = f[0]
        t = self.type_name(f[1])
        val = self.rreg(f[2])
        self.check_ref(ind, val, t, "global.store.ref", ins.pc)
        self.emit(ind, f"_GR[{g}] = {val}", ins.pc)
        self.clear_moved(ins, [f[2]], set(), ind)

    def op_global_load_indirect_ref(self, ins, f, ind):
        idx = self.ireg(f[0])
        t = self.type_name(f[1])
        res = self.rreg(f[2])
        self.emit(ind, f"_t = _grefi({idx}, _GRN)", ins.pc)
        self.emit(ind, f"{res} = _GR[_t]", ins.pc)
        self.check_ref(ind, res, t, "global.load.ref", ins.pc)
        if f[2] & isa.MOVE_BIT:
            self.emit(ind, "_GR[_t] = None", ins.pc)

    def op_global_store_indirect_ref(self, ins, f, ind):
        idx = self.ireg(f[0])
        t = self.type_name(f[1])
        val = self.rreg(f[2])
        self.check_ref(ind, val, t, "global.store.ref", ins.pc)
        self.emit(ind, f"_GR[_grefi({idx}, _GRN)] = {val}", ins.pc)
        self.clear_moved(ins, [f[2]], set(), ind)

    def op_list_alloc(self, ins, f, ind):
        t = self.type_name(f[0])
        cap = self.ireg(f[1])
        res = self.rreg(f[2])
        self.emit(ind, f"{res} = _list_alloc({self.const(t)}, {cap})", ins.pc)

    def op_list_get_ref(self, ins, f, ind):
        lst = self.rreg(f[0])
        idx = self.ireg(f[1])
        t = self.type_name(f[2])
        res = self.rreg(f[3])
        move = bool(f[3] & isa.MOVE_BIT)
        self.emit(ind, f"{res} = _list_get_ref({lst}, {idx}, {self.const(t)}, {move})", ins.pc)

    def op_list_set_ref(self, ins, f, ind):
        lst = self.rreg(f[0])
        idx = self.ireg(f[1])
        val = self.rreg(f[2])
        self.emit(ind, f"_list_set_ref({lst}, {idx}, {val})", ins.pc)
        self.clear_moved(ins, [f[2]], set(), ind)

    def op_select_ref(self, ins, f, ind):
        cond = self.ireg(f[0])
        self.type_name(f[1])
        a = self.rreg(f[2])
        b = self.rreg(f[3])
        res = self.rreg(f[4])
        self.emit(ind, f"{res} = {a} if {cond} else {b}", ins.pc)
        self.clear_moved(ins, [f[2], f[3]], {res}, ind)

    def _switch(self, ins, f, ind, wide: bool, ref: bool):
        idx = self.ireg(f[0])
        if ref:
            self.type_name(f[1])
            default_raw, values, res_raw = f[2], f[3], f[4]
            default = self.rreg(default_raw)
            names = [self.rreg(v) for v in values]
            res = self.rreg(res_raw)
        else:
            default_raw, values, res_raw = f[1], f[2], f[3]
            default = self.ireg(default_raw)
            names = [self.ireg(v) for v in values]
            res = self.ireg_name(res_raw)
        if not names:
            self.emit(ind, f"{res} = {default}", ins.pc)
        else:
            tup = "(" + ", ".join(names) + ",)"
            pick = f"{tup}[{idx}]"
            if ins.name == "switch.i64":
                pick = f"_wrap32({pick})"  # IREE reads only the low 32 bits here
            self.emit(ind, f"{res} = {pick} if 0 <= {idx} < {len(names)} else {default}", ins.pc)
        if ref:
            self.clear_moved(ins, [default_raw, *values], {res}, ind)

    def op_switch_i32(self, ins, f, ind):
        self._switch(ins, f, ind, False, False)

    def op_switch_i64(self, ins, f, ind):
        self._switch(ins, f, ind, True, False)

    def op_switch_f32(self, ins, f, ind):
        self._switch(ins, f, ind, False, False)

    def op_switch_f64(self, ins, f, ind):
        self._switch(ins, f, ind, True, False)

    def op_switch_ref(self, ins, f, ind):
        self._switch(ins, f, ind, False, True)

    def op_cast_any_ref(self, ins, f, ind):
        src = self.rreg(f[0])
        t = self.type_name(f[1])
        res = self.rreg(f[2])
        self.check_ref(ind, src, t, "cast.any.ref", ins.pc)
        self.emit(ind, f"{res} = {src}", ins.pc)
        self.clear_moved(ins, [f[0]], {res}, ind)

    def op_assign_ref(self, ins, f, ind):
        src = self.rreg(f[0])
        res = self.rreg(f[1])
        if src != res:
            self.emit(ind, f"{res} = {src}", ins.pc)
            self.clear_moved(ins, [f[0]], {res}, ind)

    def op_discard_refs(self, ins, f, ind):
        for raw in f[0]:
            self.emit(ind, f"{self.rreg(raw)} = None", ins.pc)

    def op_import_resolved(self, ins, f, ind):
        k = f[0] & ~isa.IMPORT_BIT
        self.st.resolved_tests.add(k)
        self.emit(ind, f"{self.ireg_name(f[1])} = _res{k}", ins.pc)

    def _trace(self, ins, f, ind, kind: str):
        names = [self.anyreg(r) for r in f[1]]
        tup = "(" + "".join(n + ", " for n in names) + ")"
        self.emit(ind, f"_on_{kind}({self.const(f[0])}, {tup})", ins.pc)
        for raw in f[1]:
            if self.moved(raw):
                self.emit(ind, f"r{raw & isa.REF_MASK} = None", ins.pc)

    def op_trace(self, ins, f, ind):
        self._trace(ins, f, ind, "trace")

    def op_print(self, ins, f, ind):
        self._trace(ins, f, ind, "print")

    # -- control flow
    def op_br(self, ins, f, ind):
        self.has_branches = True
        idx = self.block(f[0])
        target = self.blocks[idx] if idx < len(self.blocks) else None
        if (
            not self.inlining
            and ins.name == "br"
            and target is not None
            and idx != self.cur_block
            and 1 < len(target) <= self.TAIL_DUP_MAX + 1
            and target[-1].name in ("cond_br", "br", "return")
        ):
            self.remap(ins, f[1], ind, f[0])
            self.inlining = True
            try:
                for t_ins in target[1:]:
                    self.instruction(t_ins, ind)
            finally:
                self.inlining = False
            return
        self.jump(ins, f[0], f[1], ind)

    op_break = op_br

    def op_cond_break(self, ins, f, ind):
        self.ireg(f[0])
        self.has_branches = True
        self.jump(ins, f[1], f[2], ind)

    def op_cond_br(self, ins, f, ind):
        self.has_branches = True
        cond = self.ireg(f[0])
        folded, self.pending_cond = self.pending_cond, None
        if folded is not None and folded[0] == self.ireg_name(f[0]):
            cond = folded[1]
        t_idx, f_idx = self.block(f[1]), self.block(f[3])
        if not f[2] and not f[4] and not self.loop_mode:
            self.emit(ind, f"_b = {t_idx} if {cond} else {f_idx}", ins.pc)
            self.emit(ind, "continue", ins.pc)
            return
        self.emit(ind, f"if {cond}:", ins.pc)
        self.jump(ins, f[1], f[2], ind + 1)
        self.jump(ins, f[3], f[4], ind)

    def op_br_table(self, ins, f, ind):
        self.has_branches = True
        idx = self.ireg(f[0])
        cases = f[4]
        for i, (target, pairs) in enumerate(cases):
            self.emit(ind, f"{'if' if i == 0 else 'elif'} {idx} == {i}:", ins.pc)
            self.jump(ins, target, pairs, ind + 1)
        self.jump(ins, f[1], f[2], ind)

    def op_return(self, ins, f, ind):
        regs = f[0]
        results = self.fn.cconv.results
        names = [self._typed_reg(raw, t) for raw, t in zip(regs, results)]
        if not names:
            self.emit(ind, "return", ins.pc)
        elif len(names) == 1:
            self.emit(ind, f"return {names[0]}", ins.pc)
        else:
            self.emit(ind, f"return ({', '.join(names)})", ins.pc)

    def _typed_reg(self, raw: int, t: str) -> str:
        if t == "r":
            return self.rreg(raw)
        return self.ireg(raw)

    def op_yield(self, ins, f, ind):
        self.has_branches = True
        self.st.mark_generator(self.fn.ordinal)
        self.remap(ins, f[1], ind, f[0])
        self.goto(ind, self.block(f[0]), ins.pc, pre=("yield None",))

    def op_call(self, ins, f, ind):
        self._call(ins, f[0], None, f[1], f[2], None, ind)

    def op_call_variadic(self, ins, f, ind):
        self._call(ins, f[0], f[1], f[2], f[3], None, ind)

    def op_call_yieldable(self, ins, f, ind):
        self.has_branches = True
        self.st.mark_generator(self.fn.ordinal)
        self._call(ins, f[0], None, f[1], f[3], f[2], ind)

    def op_call_variadic_yieldable(self, ins, f, ind):
        self.has_branches = True
        self.st.mark_generator(self.fn.ordinal)
        self._call(ins, f[0], f[1], f[2], f[4], f[3], ind)

    def _call(self, ins, ordinal, segments, src, dst, resume_pc, ind):
        pc = ins.pc
        yieldable = resume_pc is not None
        if ordinal & isa.IMPORT_BIT:
            k = ordinal & ~isa.IMPORT_BIT
            imp = self.module.imports[k]
            args = self._import_args(imp, segments, src)
            result_types = imp.cconv.results
            if yieldable:
                self.st.yield_sites.add(k)
                self.emit(ind, f"_t = _impy{k}({args})", pc)
                self.emit(ind, "if _t.__class__ is _Suspend: _t = yield _t", pc)
                self.emit(ind, "elif _t.__class__ is _GenType: _t = yield from _t", pc)
            elif (record_blocks.is_pure(imp) and len(result_types) == 1
                    and all(t == "r" for t in imp.cconv.args)):
                # pure: each call site remembers its last refs (by identity) and result
                tree = self._import_arg_tree(imp, segments, src)
                site = f"_P{self.st.pure_site(len(tree))}"
                compared = list(enumerate(tree))
                if self.lines and len(tree) > 1:
                    # An argument the line before loads from rodata and this call drops
                    # is the same object at every call: passed as it is, not compared.
                    before_ind, before, before_pc = self.lines[-1]
                    for (i, a), raw in zip(compared, src):
                        if (before_ind == ind and self.moved(raw)
                                and before.startswith(f"{a} = _ROD[")):
                            self.lines[-1] = (ind, "pass", before_pc)
                            tree[i] = before.split(" = ", 1)[1]
                            del compared[i]
                            args = ", ".join(tree)
                            break
                same = " and ".join(f"{site}[{i}] is {a}" for i, a in compared)
                t = result_types[0]
                if t in ("i", "I"):  # the site keeps the result wrapped, as the register holds it
                    reg = self._typed_reg(dst[0], t)
                    bits = 32 if t == "i" else 64
                    self.emit(ind, f"{reg} = {site}[{len(tree)}] if {same} else "
                                   f"_remember({site}, {bits}, _imp{k}, {args})", pc)
                    self.clear_moved(ins, src, set(), ind)
                    return
                self.emit(ind, f"_t = {site}[{len(tree)}] if {same} else "
                               f"_remember({site}, 0, _imp{k}, {args})", pc)
            else:
                self.emit(ind, f"_t = _imp{k}({args})", pc)
            self.clear_moved(ins, src, set(), ind)
            outs = []
            for i, raw in enumerate(dst):
                t = result_types[i]
                val = "_t" if len(result_types) == 1 else f"_t[{i}]"
                reg = self._typed_reg(raw, t)
                if t == "i":
                    outs.append(f"{reg} = " + wrap32_expr(val))
                elif t == "I":
                    outs.append(f"{reg} = " + wrap64_expr(val))
                elif t == "f":
                    outs.append(f"{reg} = _to_f32({val})")
                elif t == "F":
                    outs.append(f"{reg} = float({val})")
                else:
                    outs.append(f"{reg} = {val}")
            for line in outs:
                self.emit(ind, line, pc)
        else:
            callee = self.module.functions[ordinal]
            args = ", ".join(self._typed_reg(raw, t)
                             for raw, t in zip(src, callee.cconv.args))
            self.st.calls.setdefault(self.fn.ordinal, set()).add(ordinal)
            # Generator-ness of the callee is decided after all functions are seen;
            # emit a placeholder both ways and pick at assembly.
            call = f"@CALL{ordinal}@({args})"
            results = [self._typed_reg(raw, t) for raw, t in zip(dst, callee.cconv.results)]
            moved = [raw for raw in src if self.moved(raw)]
            if moved:
                self.emit(ind, f"_t = {call}", pc)
                self.clear_moved(ins, src, set(), ind)
                if results:
                    self.emit(ind, f"{', '.join(results)}{',' if len(results) > 1 else ''}"
                                   f" = _t", pc)
            elif not results:
                self.emit(ind, call, pc)
            elif len(results) == 1:
                self.emit(ind, f"{results[0]} = {call}", pc)
            else:
                self.emit(ind, f"{', '.join(results)} = {call}", pc)
        if yieldable:
            self.goto(ind, self.block(resume_pc), pc)

    def _import_args(self, imp, segments, src) -> str:
        parts = []
        for arg in self._import_arg_tree(imp, segments, src):
            if isinstance(arg, list):
                parts.append("[" + ", ".join(
                    "(" + "".join(v + ", " for v in entry) + ")" for entry in arg) + "]")
            else:
                parts.append(arg)
        return ", ".join(parts)

    def _import_arg_tree(self, imp, segments, src) -> list:
        """Each argument of an import call as an expression; a variadic segment as a
        list of entries (tuples of expressions)."""
        parts: list = []
        pos = 0
        for seg_i, t in enumerate(imp.cconv.args):
            if isinstance(t, tuple):
                inner = t[1]
                entries = []
                for _ in range(segments[seg_i]):
                    vals = []
                    for it in inner:
                        vals.append(self._typed_reg(src[pos], it))
                        pos += 1
                    entries.append(tuple(vals))
                parts.append(entries)
            else:
                parts.append(self._typed_reg(src[pos], t))
                pos += 1
        return parts

    # -- recording blocks (vm/record_blocks.py)
    def _emit_run(self, instrs, ind: int) -> None:
        """Emits `instrs` in order, each recording block as one site call (at the
        execute it is fused with, if any: `record_blocks.find_execute`, with the step's
        tail after it: `find_tail`), and each step's head (`find_allocas`) as another."""
        if self.traced:  # every import called on its own, each call traced
            for ins in instrs:
                self.instruction(ins, ind)
            return
        imports = self.module.imports
        i = 0
        # a fused execute's index -> (its block's site, the tail's extra argument or None)
        fused: dict[int, tuple[int, str | None]] = {}
        skipped: set[int] = set()  # a tail's new fence before its execute
        while i < len(instrs):
            if i in skipped:
                i += 1
                continue
            found = fused.pop(i, None)
            if found is not None:
                site, extra = found
                tail = extra is not None
                self._emit_fused_execute(instrs[i:i + 3] if tail else instrs[i:i + 1], site,
                                         extra, ind)
                i += 3 if tail else 1
                continue
            end = record_blocks.find_allocas(instrs, i, imports)
            if end is not None:
                self._emit_allocas(instrs[i:end], ind)
                i = end
                continue
            end = record_blocks.find_block(instrs, i, imports)
            if end is None:
                self.instruction(instrs[i], ind)
                i += 1
            else:
                execute = record_blocks.find_execute(instrs, i, end, imports)
                after, extra = None, None
                if execute is not None and record_blocks.find_tail(instrs, execute[0], imports):
                    tail = self._tail_templates(instrs[execute[0] - 1:execute[0] + 3])
                    if tail is not None:
                        after, extra = tail
                site = self._emit_record_block(instrs[i:end], ind, execute, after)
                if execute is not None:
                    fused[execute[0]] = (site, extra)
                    if after is not None:
                        skipped.add(execute[0] - 1)
                i = end

    def _literal_leaf(self, expr: str) -> tuple | None:
        literal = expr[1:-1] if expr.startswith("(") and expr.endswith(")") else expr
        return ("k", int(literal)) if literal.lstrip("-").isdigit() else None

    def _tail_templates(self, instrs) -> tuple | None:
        """`RecordBlock.after` of a step's tail (`record_blocks.find_tail`: new fence,
        execute, new fence, dealloca), or None when an operand of the new fences or the
        dealloca is not a literal, an operand the execute has and keeps (not moved) or,
        for the dealloca, one register of its own."""
        imports = self.module.imports
        k, segments, src, _dst = record_blocks.call_operands(instrs[1])
        traits = native_table.traits_of(imports[k].full_name)
        execute_args = self._import_arg_tree(imports[k], segments, src)
        kept = {expr: p for p, expr in enumerate(execute_args)
                if p not in (traits.target, traits.signal) and isinstance(expr, str)
                and not self.moved(src[p])}
        ops, extra = [], None
        for n, ins in enumerate((instrs[0], instrs[2], instrs[3])):
            k, segments, src, _dst = record_blocks.call_operands(ins)
            step = native_table.traits_of(imports[k].full_name)
            template = []
            for p, expr in enumerate(self._import_arg_tree(imports[k], segments, src)):
                if not isinstance(expr, str):
                    return None
                leaf = self._literal_leaf(expr)
                if n == 2 and p == step.wait:
                    leaf = ("s", 0)
                elif n == 2 and p == step.signal:
                    leaf = ("s", 1)
                elif leaf is None and expr in kept:
                    leaf = ("x", kept[expr])
                elif leaf is None and n == 2 and extra is None:
                    extra, leaf = expr, ("a", 0)
                if leaf is None:
                    return None
                template.append(leaf)
            ops.append((k, tuple(template)))
        if extra is None:
            return None
        return (traits.signal, tuple(ops)), extra

    def _emit_fused_execute(self, instrs, site: int, extra: str | None, ind: int) -> None:
        """The call of a block's site at the execute it is fused with (`instrs[0]`),
        with the step's tail (new fence, dealloca: `instrs[1:]`) when there is one."""
        ins = instrs[0]
        k, segments, src, _dst = record_blocks.call_operands(ins)
        imp = self.module.imports[k]
        if len(instrs) == 1:
            args = self._import_args(imp, segments, src)
            self.emit(ind, f"_t = _blk{site}({args})", ins.pc)
            self.clear_moved(ins, src, set(), ind)
            return
        traits = native_table.traits_of(imp.full_name)
        args = self._import_arg_tree(imp, segments, src)
        args[traits.signal] = "None"
        self.emit(ind, f"_t = _blk{site}({', '.join(args)}, {extra})", ins.pc)
        freed = self.rreg(record_blocks.call_operands(instrs[1])[3][0])
        for one in instrs:
            self.clear_moved(one, record_blocks.call_operands(one)[2], {freed}, ind)
        self.emit(ind, f"{freed} = _t", instrs[-1].pc)

    def _emit_allocas(self, instrs, ind: int) -> None:
        """A step's head (`record_blocks.find_allocas`) as one call of an `AllocaRun`
        site, which returns the buffers of its allocas and its last join's fence."""
        imports = self.module.imports
        values: list[str] = []
        made: dict[str, int] = {}  # a register an operation of the run assigned -> it
        ops, results = [], []

        def leaf(expr: str) -> tuple:
            known = self._literal_leaf(expr)
            if known is not None:
                return known
            if expr in made:
                return ("o", made[expr])
            if expr not in values:
                values.append(expr)
            return ("d", values.index(expr))

        for j, ins in enumerate(instrs):
            k, segments, src, dst = record_blocks.call_operands(ins)
            template = []
            for arg in self._import_arg_tree(imports[k], segments, src):
                if isinstance(arg, list):
                    template.append(tuple(tuple(leaf(e) for e in entry) for entry in arg))
                else:
                    template.append(leaf(arg))
            ops.append((k, tuple(template)))
            step = native_table.traits_of(imports[k].full_name).step
            if step == native_table.ALLOCA or j == len(instrs) - 1:
                results.append(j)
            made[self.rreg(dst[0])] = j
        site = self.st.record_block(record_blocks.AllocaRun(tuple(ops), len(values),
                                                            tuple(results)))
        outputs = [self.rreg(record_blocks.call_operands(instrs[j])[3][0]) for j in results]
        pc = instrs[0].pc
        self.emit(ind, f"_t = _blk{site}(({''.join(v + ', ' for v in values)}))", pc)
        for ins in instrs:
            self.clear_moved(ins, record_blocks.call_operands(ins)[2], set(outputs), ind)
        self.emit(ind, f"{', '.join(outputs)} = _t", pc)

    def _emit_record_block(self, instrs, ind: int,
                           execute: tuple[int, int, int] | None = None,
                           after: tuple | None = None) -> int:
        """The instructions of a block as usual, but each record operation's non-literal
        operands kept in locals `_d<n>` and the operations made by one `_blk<site>`
        call at the end, which returns the command buffer; returns the site. Fused with
        an `execute` (`record_blocks.find_execute`: its index, import and the command
        buffer's argument position), the
        command buffer's register holds the values until that execute instead (nothing
        else reads it), which calls the site instead of the import, with the same
        arguments (and, with the step's tail `after`, one more: `_emit_fused_execute`)."""
        cb_raw = record_blocks.call_operands(instrs[0])[3][0]
        cb = self.rreg(cb_raw)
        values: list[tuple[str, bool]] = []  # (local, is a ref)
        kept: dict[str, int] = {}  # expression -> its value's index, while it holds
        captured: list[int] = []  # per value, the line that keeps it
        ops = []
        moved_cb = False

        def leaf(ins, expr: str, t: str) -> tuple:
            if expr == cb:
                return ("cb",)
            literal = expr[1:-1] if expr.startswith("(") and expr.endswith(")") else expr
            if literal.lstrip("-").isdigit():
                return ("k", int(literal))
            index = kept.get(expr)
            if index is None:
                index = kept[expr] = len(values)
                values.append((f"_d{index}", t == "r"))
                captured.append(len(self.lines))
                self.emit(ind, f"_d{index} = {expr}", ins.pc)
            return ("d", index)

        def forget_assigned(since: int) -> None:
            """Drops kept expressions over registers that lines from `since` assign."""
            assigned = set()
            for _indent, text, _pc in self.lines[since:]:
                assigned.update(_ASSIGNED.findall(text))
            if assigned:
                for expr in [e for e in kept if assigned.intersection(_REGISTER.findall(e))]:
                    del kept[expr]

        for ins in instrs:
            k, segments, src, dst = record_blocks.call_operands(ins)
            imp = self.module.imports[k] if k >= 0 else None
            if imp is None or record_blocks.is_pure(imp):
                since = len(self.lines)
                self.instruction(ins, ind)
                forget_assigned(since)
                continue
            template = []
            for arg, t in zip(self._import_arg_tree(imp, segments, src), imp.cconv.args):
                if isinstance(arg, list):
                    template.append(tuple(tuple(leaf(ins, e, it) for e, it in zip(entry, t[1]))
                                          for entry in arg))
                else:
                    template.append(leaf(ins, arg, t))
            ops.append((k, tuple(template)))
            if not record_blocks.begins_recording(imp) and self.moved(src[record_blocks.target(imp)]):
                moved_cb = True
            since = len(self.lines)
            self.clear_moved(ins, src, {cb}, ind)
            forget_assigned(since)
        pc = instrs[-1].pc
        site = self.st.record_block(record_blocks.RecordBlock(
            tuple(ops), len(values), None if execute is None else execute[1:], after))
        # A value that is a register no later line of the block assigns is passed as
        # that register: no local to keep it in, and none to clear.
        unkept = []
        for index, at in enumerate(captured):
            expr = self.lines[at][1].split(" = ", 1)[1]
            if _REGISTER.fullmatch(expr) and not any(
                    expr in _ASSIGNED.findall(text) for _i, text, _pc in self.lines[at + 1:]):
                values[index] = (expr, False)
                unkept.append(at)
        for at in reversed(unkept):
            del self.lines[at]
        names = [name for name, _ in values]
        made = f"({''.join(n + ', ' for n in names)})"
        self.emit(ind, f"{cb} = {made}" if execute else f"{cb} = _blk{site}({made})", pc)
        refs = [name for name, is_ref in values if is_ref]
        if refs:
            self.emit(ind, " = ".join(refs) + " = None", pc)
        if moved_cb:
            self.emit(ind, f"{cb} = None", pc)
        return site


_REGISTER = re.compile(r"\b[ir]\d+\b")
# a register local that a line of generated code assigns (also augmented: `i3 -= ...`)
_ASSIGNED = re.compile(r"\b([ir]\d+)\s*(?:<<|>>|//|\*\*|[-+*/%&|^])?=(?!=)")


def _one_sided(op: str, canonical: list, lits: list, width: int) -> int:
    """+1 / -1 when a wrapped add/sub of a canonical value and a constant can only
    overflow upwards / downwards, else 0."""
    kind = op.split(".")[0]
    if kind not in ("add", "sub") or len(lits) != 2:
        return 0
    half = 2 ** (width - 1)
    if lits[1] is not None and lits[0] is None:
        c, other = lits[1], canonical[0]
    elif kind == "add" and lits[0] is not None and lits[1] is None:
        c, other = lits[0], canonical[1]
    else:
        return 0
    if not other:
        return 0
    if kind == "sub":
        c = -c
    if 0 < c < half:
        return 1
    if -half <= c < 0:
        return -1
    return 0


def _chunks(items, n):
    for i in range(0, len(items), n):
        yield items[i : i + n]


class _ProgramState:
    def __init__(self) -> None:
        self.constants: list = []
        self._const_index: dict = {}
        self.generators: set[int] = set()
        self.calls: dict[int, set[int]] = {}
        self.yield_sites: set[int] = set()  # imports that `call.yieldable` calls
        self.resolved_tests: set[int] = set()  # imports that `import.resolved` tests
        self.record_blocks: list[record_blocks.RecordBlock] = []
        self.pure_sites: list[int] = []  # arity of each pure import call site (`_P<n>`)
        self.ref_class_sets: set[int] = set()  # constants (ref type names) with an `_RC<k>`
        self._record_block_index: dict = {}
        self.trace_sites: list[tuple] = []  # traced translations (see `vm.trace`)

    def trace_site(self, ordinal: int, pc: int, parts: tuple) -> int:
        self.trace_sites.append((ordinal, pc, parts))
        return len(self.trace_sites) - 1

    def pure_site(self, arity: int) -> int:
        self.pure_sites.append(arity)
        return len(self.pure_sites) - 1

    def record_block(self, block: record_blocks.RecordBlock) -> int:
        """The site number of `block` (equal blocks share one site)."""
        site = self._record_block_index.get(block)
        if site is None:
            site = self._record_block_index[block] = len(self.record_blocks)
            self.record_blocks.append(block)
        return site

    def constant(self, value) -> int:
        if value.__class__ is float or isinstance(value, ops.F32Bits):
            key = (value.__class__.__name__, ops.bitcast_f64_i64(value),
                   getattr(value, "bits", None))
        else:
            key = (value.__class__.__name__, value)
        idx = self._const_index.get(key)
        if idx is None:
            idx = len(self.constants)
            self.constants.append(value)
            self._const_index[key] = idx
        return idx

    def mark_generator(self, ordinal: int) -> None:
        self.generators.add(ordinal)


_COUNTER = [0]


def generate_module(module, verified: list[VerifiedFunction],
                    traced: bool = False) -> ModuleProgram:
    """Translates `module`'s functions, which `verifier.verify_module` passed as
    `verified`, into one Python module (compiled, not yet run). `traced`: the
    translation `--trace_execution` runs (`vm.trace`): plain, one traced line per
    instruction, no native loops or recording blocks; never the default one."""
    st = _ProgramState()
    per_fn = []
    for vf in verified:
        g = _Gen(module, vf, st, traced)
        per_fn.append((vf.function, g, g.generate()))

    # Propagate generator-ness through the internal call graph (fixpoint).
    changed = True
    while changed:
        changed = False
        for caller, callees in st.calls.items():
            if caller not in st.generators and callees & st.generators:
                st.generators.add(caller)
                changed = True

    native_loops = {}
    native_entries = {}
    if scalar.enabled() and not traced:
        type_names = [element_type_name(t) for t in module.types]
        imports = [(imp.full_name, imp.cconv.text) for imp in module.imports]
        for fn, g, _body in per_fn:
            if fn.ordinal not in st.generators:
                program = scalar.encode(
                    fn.instructions, fn.cconv.args, fn.cconv.results,
                    [reg for _bank, reg in cconv_registers(fn.cconv.args)], g.i32_limit)
                if program is not None:
                    native_loops[fn.ordinal] = program
                entry = scalar.encode_entry(fn.instructions, fn.cconv.text, g.i32_limit,
                                            len(module.rodata), type_names, imports)
                if entry is not None:
                    native_entries[fn.ordinal] = entry

    lines = _prologue(module, st)
    if traced:
        lines.append("_tr = _L.trace")
    line_pcs: list = [None] * (len(lines) + 1)  # 1-based
    for fn, _g, body in per_fn:
        is_gen = fn.ordinal in st.generators
        needs_yield_stub = is_gen
        for indent, text, pc in body:
            if "@CALL" in text:
                text = _resolve_calls(text, st.generators)
            if "yield" in text and not text.startswith("def "):
                needs_yield_stub = False
            lines.append("    " * indent + text)
            line_pcs.append((fn.ordinal, pc) if pc >= 0 else None)
        if needs_yield_stub:
            lines.append("    if 0: yield")
            line_pcs.append(None)
        lines.append("")
        line_pcs.append(None)

    _COUNTER[0] += 1
    filename = f"<tinyhal-vm:{module.name}#{_COUNTER[0]}>"
    source = "\n".join(lines) + "\n"
    code = compile_module_source(source, filename)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return ModuleProgram(code, filename, source, line_pcs, frozenset(st.generators),
                         st.constants, len(per_fn), native_loops, tuple(st.record_blocks),
                         native_entries, tuple(st.trace_sites))


# Sources at least this large compile in a child process: CPython's `compile` holds the
# interpreter lock throughout (0.6 s for a 1 MB module: a server's event loop would stall
# that long; 29 ms of CPU for 61 KiB, 41 ms for 122 KiB on the shared 2-core machine,
# against a 50 ms bar for the loop), the child's work costs the parent one
# `marshal.loads` (under 1 ms).
_CHILD_COMPILE_BYTES = 48 << 10
_CHILD_COMPILER = ("import marshal, sys; sys.stdout.buffer.write(marshal.dumps(compile("
                   "sys.stdin.buffer.read().decode(), sys.argv[1], 'exec')))")
_CHILD_COMPILE_TIMEOUT = 300.0


def compile_module_source(source: str, filename: str):
    """The code object of a generated module, compiled without holding this process's
    interpreter lock for long when the source is large (see `_CHILD_COMPILE_BYTES`):
    the same interpreter compiles it in a child process and hands back its marshalled
    code. Where no child can run, it compiles here."""
    if len(source) >= _CHILD_COMPILE_BYTES and sys.executable:
        import subprocess  # only a large translation pays for it

        flags = ["-I", "-S"] + (["-" + "O" * sys.flags.optimize] if sys.flags.optimize else [])
        try:
            done = subprocess.run([sys.executable, *flags, "-c", _CHILD_COMPILER, filename],
                                  input=source.encode(), capture_output=True, check=True,
                                  timeout=_CHILD_COMPILE_TIMEOUT)
            code = marshal.loads(done.stdout)
            if isinstance(code, types.CodeType):
                return code
        except (OSError, subprocess.SubprocessError, ValueError, EOFError, TypeError):
            pass
    return compile(source, filename, "exec")


def _prologue(module, st: _ProgramState) -> list[str]:
    """The generated module's first lines, run once per instantiation: what its functions
    use, bound from the `Linkage` (`_L`) into globals, each pure call site's memory and
    the accepted classes of each ref type the program checks."""
    lines = ["_G = _L.rwdata", "_GCAP = len(_G)", "_GR = _L.global_refs", "_GRN = len(_GR)",
             "_ROD = _L.rodata", "_on_print = _L.on_print", "_on_trace = _L.on_trace"]
    lines += [f"_imp{k} = _L.imports[{k}]" for k in range(len(module.imports))]
    lines += [f"_impy{k} = _L.yieldable_imports[{k}]" for k in sorted(st.yield_sites)]
    lines += [f"_res{k} = 1 if _L.resolved[{k}] else 0" for k in sorted(st.resolved_tests)]
    lines += [f"_blk{n} = _L.record_sites[{n}]" for n in range(len(st.record_blocks))]
    lines += [f"_P{n} = [{'_UNSET, ' * arity}None]" for n, arity in enumerate(st.pure_sites)]
    lines += [f"_RC{k} = _ref_classes(_K[{k}])" for k in sorted(st.ref_class_sets)]
    return lines


def _resolve_calls(text: str, generators) -> str:
    out = []
    i = 0
    while True:
        j = text.find("@CALL", i)
        if j < 0:
            out.append(text[i:])
            break
        k = text.index("@", j + 5)
        ordinal = int(text[j + 5 : k])
        out.append(text[i:j])
        # find the matching parenthesised argument list
        depth = 0
        m = k + 1
        while True:
            c = text[m]
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0:
                    break
            m += 1
        args = text[k + 1 : m + 1]
        if ordinal in generators:
            out.append(f"(yield from _f{ordinal}{args})")
        else:
            out.append(f"_f{ordinal}{args}")
        i = m + 1
    return "".join(out)


def instantiate(program: ModuleProgram, linkage: Linkage) -> None:
    """Runs `program` in a fresh namespace over `linkage` (one per module instance) and
    puts its functions, by ordinal, in `linkage.functions`."""
    ns = dict(HELPERS)
    ns["_K"] = program.constants
    ns["_FALLOFF"] = b"execution fell off the end of the function"
    ns["_L"] = linkage
    exec(program.code, ns)  # noqa: S102 - source generated by this module from verified bytecode
    for ordinal, native in program.native_loops.items():
        ns[f"_f{ordinal}"] = scalar.entry(native, ns[f"_f{ordinal}"])
    linkage.functions[:] = [ns[f"_f{ordinal}"] for ordinal in range(program.function_count)]

"""Register data flow of one bytecode function, for the code generator's integer fast paths.

The generator keeps every register in a Python local. This analysis tells it where that
is wasteful and what it may do instead, each fact derived from the verified bytecode:

- **constant registers**: assigned once, by a constant in the entry block, before any
  read; every read becomes the literal.
- **deferred wrapping**: add, sub, mul, fma, and, or, xor, not and shl (of its value
  operand) only need their inputs modulo 2^n, so a result read exactly once, by such an
  op of the same width later in the same block, stays an unwrapped Python expression
  substituted into its reader (`fused`), and is wrapped once where it is stored.
- **compare + branch**: a compare whose result is read only by the `cond_br` right after
  it becomes the branch's condition (`fused_cmps`).
- **copy coalescing**: a value computed in a block and then only copied to another
  register by the block's `br` is computed straight into that register (`rename`,
  `skipped_pairs`).
- **guarded increments**: in a block entered only through the taken edge of
  `cond_br (cmp.lt.s a, b)`, `a + 1` cannot overflow (a < b <= max) and `b - 1` cannot
  underflow while a and b are unchanged, so they need no wrap (`in_range`).
- **counted loops**: a block B ending in `br H`, where H is just `cmp.lt.s c, n` +
  `cond_br` back to B, whose only write of c is such a guarded `c + 1` not read again in
  B, and which leaves n alone, runs as `for c in range(c, n)` (`counted`).
- **unsigned registers**: a register written only by such ring ops, constants and
  copies, and read only by ring ops, copies and `return`, is held as its value modulo
  2^n in [0, 2^n) — one `&` per store instead of a signed wrap — and converted to the
  signed value where a copy or return reads it (`unsigned`).
- **lazy accumulators**: in a counted loop, an unsigned register read only by ring ops
  of its width and stored only from expressions in which it appears once, never as a
  factor (mul, fma's multiplicands, shl's value), keeps any value congruent to it modulo 2^n and is reduced once after
  the loop (`lazy`). |x ^ y|, |x | y|, |x & y|, |x +- y| <= |x| + |y| (+1), so such a
  register grows by a bounded amount per trip, not geometrically.

Registers are the generator's locals (`i<n>`), so an i64 lives in its first slot's name.
Anything the analysis does not understand disables all of it for the function
(`analyse` returns None), leaving the plain translation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import isa, optable

# op -> (python template over operand strings, width, ring operand positions, bitwise):
# the ring facts of the op table's rows (`optable.Ring`)
RING_OPS: dict[str, optable.Ring] = {}
_CONSTS: dict[str, int] = {}  # integer constant op -> its width, from the rows' facts


def _derive(op: optable.Op) -> None:
    ring = optable.meaning(op).ring
    if ring is not None:
        RING_OPS[op.name] = ring
    result = op.layout.split()[-1]
    if op.constant and result in ("w:i32", "w:i64"):
        _CONSTS[op.name] = int(result[3:])


optable.on_row(_derive)

# Bounds that keep the analysis linear on very large functions.
MAX_INSTRUCTIONS = 20000  # larger functions get the plain translation
FUSE_WINDOW = 64  # a fused value's reader is at most this many instructions later

_CALL_DST = {"i": "i32", "I": "i64", "f": "f32", "F": "f64"}
_MIXED = "mixed"


@dataclass
class Flow:
    """What the generator may do differently in one function (see the module doc)."""

    constants: dict[str, int] = field(default_factory=dict)
    constant_defs: set[int] = field(default_factory=set)  # pcs of their defining ops
    fused: set[int] = field(default_factory=set)  # pcs of ring ops kept as expressions
    fused_cmps: set[int] = field(default_factory=set)  # pcs of compares folded into cond_br
    rename: dict[int, str] = field(default_factory=dict)  # ring op pc -> register written
    skipped_pairs: dict[int, set] = field(default_factory=dict)  # br pc -> {(src, dst)}
    unsigned: dict[str, int] = field(default_factory=dict)  # register -> width
    in_range: set[int] = field(default_factory=set)  # pcs of add/sub that cannot wrap
    # loop block -> (counter, bound, pc of the counter's step, header block)
    counted: dict[int, tuple[str, str, int, int]] = field(default_factory=dict)
    # counted loop block -> {unsigned register carried unreduced: width}
    lazy: dict[int, dict[str, int]] = field(default_factory=dict)


def _iname(raw: int) -> str | None:
    return None if raw & isa.REF_BIT else f"i{raw}"


class _Unknown(Exception):
    pass


@dataclass
class _Ins:
    ins: object
    reads: list  # i-register names read (with multiplicity), before any edge
    writes: list  # (name, type) written, in order
    edges: list  # [(block index, [(src, dst)])] for terminators


def slot_hazard(pairs) -> bool:
    """Whether an integer remap list reads a slot an earlier pair of it wrote. IREE moves
    the slots one after another, so such a list is not a parallel copy (the compiler
    can emit one when an i64 pair overlaps an i32 register)."""
    written: set[int] = set()
    for s, d in pairs:
        if s & isa.REF_BIT:
            continue
        if s in written:
            return True
        written.add(d)
    return False


def _pairs(ins, pairs) -> list:
    if slot_hazard(pairs):
        raise _Unknown
    out = []
    for s, d in pairs:
        if (s & isa.REF_BIT) != (d & isa.REF_BIT):
            raise _Unknown
        if not s & isa.REF_BIT:
            out.append((f"i{s}", f"i{d}"))
    return out


def _access(ins, block_index: dict, next_block: int | None, functions, imports) -> _Ins:
    name, f = ins.name, ins.fields
    reads: list = []
    writes: list = []
    edges: list = []

    def target(pc):
        if pc not in block_index:
            raise _Unknown
        return block_index[pc]

    def dsts(regs, types):
        for raw, t in zip(regs, types):
            n = _iname(raw)
            if n is not None:
                writes.append((n, _CALL_DST.get(t, _MIXED)))

    if name in ("br", "break", "yield"):
        edges.append((target(f[0]), _pairs(ins, f[1])))
    elif name == "cond_br":
        reads.append(_iname(f[0]))
        edges.append((target(f[1]), _pairs(ins, f[2])))
        edges.append((target(f[3]), _pairs(ins, f[4])))
    elif name == "cond_break":
        reads.append(_iname(f[0]))
        edges.append((target(f[1]), _pairs(ins, f[2])))
        if next_block is not None:
            edges.append((next_block, []))
    elif name == "br_table":
        reads.append(_iname(f[0]))
        edges.append((target(f[1]), _pairs(ins, f[2])))
        for t, p in f[4]:
            edges.append((target(t), _pairs(ins, p)))
    elif name in ("return", "trace", "print"):
        regs = f[0] if name == "return" else f[1]
        reads.extend(n for n in map(_iname, regs) if n)
    elif name == "discard.refs":
        pass
    elif name in ("call", "call.variadic", "call.yieldable", "call.variadic.yieldable"):
        ordinal = f[0]
        src = f[2] if "variadic" in name else f[1]
        dst = f[-1]
        reads.extend(n for n in map(_iname, src) if n)
        if ordinal & isa.IMPORT_BIT:
            k = ordinal & ~isa.IMPORT_BIT
            if k >= len(imports):
                raise _Unknown
            dsts(dst, imports[k].cconv.results)
        else:
            if ordinal >= len(functions):
                raise _Unknown
            dsts(dst, functions[ordinal].cconv.results)
        if name.endswith("yieldable"):
            edges.append((target(f[-2]), []))
    elif name == "switch.i32" or name == "switch.i64" or name.startswith("switch.f"):
        reads.append(_iname(f[0]))
        reads.append(_iname(f[1]))
        reads.extend(_iname(v) for v in f[2])
        writes.append((_iname(f[3]), "i64" if name == "switch.i64" else name[7:]))
    else:
        for (code, arg), val in zip(ins.layout, f):
            if code in ("V", "O", "C"):
                raise _Unknown
            if code in ("r", "w") and arg != "ref":
                n = _iname(val)
                if n is None:
                    raise _Unknown
                if code == "r":
                    reads.append(n)
                else:
                    writes.append((n, arg))
    if None in reads or any(n is None for n, _ in writes):
        raise _Unknown
    return _Ins(ins, reads, writes, edges)


def _edge_live(pairs, live: set) -> set:
    live = set(live)
    for s, d in reversed(pairs):
        live.discard(d)
        live.add(s)
    return live


def analyse(fn, blocks: list, block_index: dict, params: list[str], functions, imports,
            terminators: set) -> Flow | None:
    """The flow facts of `fn` (blocks as the generator split them), or None if the
    function uses anything the analysis does not model."""
    if len(fn.instructions) > MAX_INSTRUCTIONS:
        return None
    try:
        return _analyse(fn, blocks, block_index, params, functions, imports, terminators)
    except _Unknown:
        return None


def _analyse(fn, blocks, block_index, params, functions, imports, terminators) -> Flow:
    nb = len(blocks)
    acc: list[list[_Ins]] = []
    for bi, blk in enumerate(blocks):
        row = [_access(ins, block_index, bi + 1 if bi + 1 < nb else None, functions, imports)
               for ins in blk[1:]]
        if any(a.edges or a.ins.name in terminators for a in row[:-1]):
            raise _Unknown  # control leaves the block before its end
        if not row or blk[-1].name not in terminators:
            # falls through (or off the end) into the next block
            row.append(_Ins(None, [], [], [(bi + 1, [])] if bi + 1 < nb else []))
        acc.append(row)

    # Liveness (backward, to a fixpoint).
    live_in: list[set] = [set() for _ in range(nb)]
    changed = True
    while changed:
        changed = False
        for bi in range(nb - 1, -1, -1):
            live = _block_live_in(acc[bi], live_in)
            if live != live_in[bi]:
                live_in[bi] = live
                changed = True
    live_after: dict[int, list[set]] = {}
    for bi in range(nb):
        live_after[bi] = _live_after(acc[bi], live_in)

    flow = Flow()
    param_set = set(params)
    targeted = {t for row in acc for a in row for t, _ in a.edges}

    # Constant registers.
    write_count: dict[str, int] = {}
    for row in acc:
        for a in row:
            for n, _ in a.writes:
                write_count[n] = write_count.get(n, 0) + 1
            for _, pairs in a.edges:
                for _, d in pairs:
                    write_count[d] = write_count.get(d, 0) + 1
    if 0 not in targeted:
        read_so_far: set = set()
        for a in acc[0]:
            ins = a.ins
            if ins is not None and ins.name in _CONSTS:
                n = a.writes[0][0]
                if write_count.get(n) == 1 and n not in read_so_far and n not in param_set:
                    value = 0 if ins.name.endswith("zero") else ins.fields[0]
                    flow.constants[n] = value
                    flow.constant_defs.add(ins.pc)
            read_so_far.update(a.reads)
            for _, pairs in a.edges:
                read_so_far.update(s for s, _ in pairs)

    # Value types per register, for the unsigned form (copies join their source's type).
    types: dict[str, str] = {}

    def join(n, t):
        old = types.get(n)
        new = t if old is None or old == t else _MIXED
        if new != old:
            types[n] = new
            return True
        return False

    for p, t in zip(params, _param_types(fn)):
        join(p, t)
    for row in acc:
        for a in row:
            for n, t in a.writes:
                join(n, t)
    copies = list(_edge_copies(acc))
    changed = True
    while changed:
        changed = False
        for s, d in copies:
            if s in types and join(d, types[s]):
                changed = True

    # Deferred wrapping, compare folding and coalescing, block by block.
    for bi in range(nb):
        _block_facts(flow, acc[bi], live_after[bi], live_in)

    _guarded(flow, acc)
    _counted(flow, acc, types)
    _unsigned(flow, acc, types, param_set, fn)
    _lazy(flow, acc)
    return flow


def _edge_copies(acc: list[list[_Ins]]):
    """Every (source, destination) register copy a branch makes along an edge."""
    for row in acc:
        for a in row:
            for _, pairs in a.edges:
                yield from pairs


def _counted(flow: Flow, acc: list[list[_Ins]], types: dict) -> None:
    for bi, row in enumerate(acc):
        last = row[-1]
        if last.ins is None or last.ins.name != "br":
            continue
        h, pairs = last.edges[0]
        hrow = acc[h]
        if h == bi or len(hrow) != 2 or hrow[1].ins is None or hrow[1].ins.name != "cond_br":
            continue
        cmp, cbr = hrow
        if cmp.ins.pc not in flow.fused_cmps or not cmp.ins.name.startswith("cmp.lt.i"):
            continue
        (t_true, p_true), (t_false, _) = cbr.edges
        counter, bound = cmp.reads
        if t_true != bi or p_true or t_false == bi or counter == bound:
            continue
        if types.get(counter) not in ("i32", "i64") or types.get(bound) not in (
                None, "i32", "i64"):
            continue
        # registers each instruction stores to, after coalescing
        stores = [[flow.rename.get(a.ins.pc, n) for n, _ in a.writes] for a in row[:-1]]
        skipped = flow.skipped_pairs.get(last.ins.pc, set())
        pairs = [p for p in pairs if p not in skipped]
        steps = [j for j, names in enumerate(stores) if counter in names]
        if len(steps) != 1:
            continue
        j = steps[0]
        step = row[j].ins
        if step.pc not in flow.in_range or not step.name.startswith("add"):
            continue
        if any(counter in row[m].reads for m in range(j + 1, len(row) - 1)):
            continue
        if any(counter in (s, d) or bound == d for s, d in pairs):
            continue
        if any(bound in names for names in stores):
            continue
        flow.counted[bi] = (counter, bound, step.pc, h)


def _lazy(flow: Flow, acc: list[list[_Ins]]) -> None:
    """Unsigned registers each counted loop may carry unreduced (see the module doc)."""
    for bi, (counter, bound, _step, _h) in flow.counted.items():
        row = acc[bi]
        cands = {n: w for n, w in flow.unsigned.items() if n not in (counter, bound)}
        last = row[-1]
        skipped = flow.skipped_pairs.get(last.ins.pc, set())
        bad = {n for p in last.edges[0][1] if p not in skipped for n in p}
        written: set = set()
        pending: dict[str, dict[str, int]] = {}  # fused result -> {lazy register: count}
        for a in row[:-1]:
            ring = _ring(a)
            if ring is None:
                bad.update(a.reads)
                bad.update(n for n, _ in a.writes)
                continue
            width, ring_pos, scaled = ring.width, ring.positions, ring.scaling
            taint: dict[str, int] = {}
            for i, n in enumerate(a.reads):
                src = pending.pop(n) if n in pending else ({n: 1} if n in cands else {})
                if src and (i in scaled or i not in ring_pos
                            or any(cands[m] != width for m in src)):
                    bad.update(src)
                for m, k in src.items():
                    taint[m] = taint.get(m, 0) + k
            res = a.writes[0][0]
            if a.ins.pc in flow.fused:
                pending[res] = taint
                continue
            target = flow.rename.get(a.ins.pc, res)
            if taint and taint != {target: 1}:
                bad.update(taint)
                bad.add(target)
            if target in cands:
                written.add(target)
        lazy = {n: cands[n] for n in written if n not in bad}
        if lazy:
            flow.lazy[bi] = lazy


def _guarded(flow: Flow, acc: list[list[_Ins]]) -> None:
    """Adds of 1 / subtracts of 1 that a dominating signed less-than keeps in range."""
    incoming: dict[int, list] = {0: [None]}  # the entry block is entered by the call
    for bi, row in enumerate(acc):
        last = row[-1]
        for e, (t, pairs) in enumerate(last.edges):
            incoming.setdefault(t, []).append((bi, e, pairs))
    for bi, row in enumerate(acc):
        edges = incoming.get(bi, [])
        if len(edges) != 1 or edges[0] is None:
            continue
        pb, e, pairs = edges[0]
        prow = acc[pb]
        last = prow[-1]
        if last.ins is None or last.ins.name != "cond_br" or e != 0 or len(prow) < 2:
            continue
        cmp = prow[-2]
        if (
            cmp.ins is None
            or cmp.ins.name not in ("cmp.lt.i32.s", "cmp.lt.i64.s")
            or cmp.writes[0][0] != last.reads[0]
        ):
            continue
        lo, hi = cmp.reads
        if cmp.writes[0][0] in (lo, hi):
            continue
        width = 32 if "i32" in cmp.ins.name else 64
        if any(d in (lo, hi) for _, d in pairs):
            continue
        for a in row:
            if a.ins is None:
                break
            ring = _ring(a)
            if ring is not None and ring.width == width and a.ins.name.startswith(("add", "sub")):
                x, y = a.reads
                if a.ins.name.startswith("add"):
                    if (x == lo and flow.constants.get(y) == 1) or (
                            y == lo and flow.constants.get(x) == 1):
                        flow.in_range.add(a.ins.pc)
                elif x == hi and flow.constants.get(y) == 1:
                    flow.in_range.add(a.ins.pc)
            if any(flow.rename.get(a.ins.pc, n) in (lo, hi) or n in (lo, hi)
                   for n, _ in a.writes):
                break


def _param_types(fn) -> list[str]:
    return [_CALL_DST.get(t, _MIXED) for t in fn.cconv.args if t != "r"]


def _block_live_in(row: list[_Ins], live_in: list[set]) -> set:
    live = _term_live(row[-1], live_in)
    for a in reversed(row[:-1]):
        for n, _ in a.writes:
            live.discard(n)
        live.update(a.reads)
    return live


def _term_live(a: _Ins, live_in: list[set]) -> set:
    live: set = set()
    for t, pairs in a.edges:
        live |= _edge_live(pairs, live_in[t])
    for n, _ in a.writes:
        live.discard(n)
    live.update(a.reads)
    return live


def _live_after(row: list[_Ins], live_in: list[set]) -> list[set]:
    """live_after[j]: registers live just after instruction j (edges included for the
    terminator, whose own entry is the union of its edges' live-ins)."""
    out: list[set] = [set() for _ in row]
    last = row[-1]
    live: set = set()
    for t, pairs in last.edges:
        live |= _edge_live(pairs, live_in[t])
    out[-1] = set(live)
    for n, _ in last.writes:
        live.discard(n)
    live.update(last.reads)
    for j in range(len(row) - 2, -1, -1):
        out[j] = set(live)
        a = row[j]
        for n, _ in a.writes:
            live.discard(n)
        live.update(a.reads)
    return out


def _ring(a: _Ins):
    return RING_OPS.get(a.ins.name) if a.ins is not None else None


def _ring_reads(a: _Ins, name: str) -> int:
    """How many of `a`'s reads of `name` are ring operands (0 if `a` is no ring op)."""
    ring = _ring(a)
    if ring is None:
        return 0
    return sum(1 for i in ring.positions if a.reads[i] == name)


def _block_facts(flow: Flow, row: list[_Ins], live_after: list[set], live_in) -> None:
    # ring op index -> registers its expression reads (fused operands' included)
    leaves: dict[int, set] = {j: {n for n in a.reads if n not in flow.constants}
                              for j, a in enumerate(row) if _ring(a) is not None}
    pending: dict[str, int] = {}  # register -> index of its fused (pending) def
    for j, a in enumerate(row):
        ring = _ring(a)
        for n in set(a.reads):
            if n in pending:
                d = pending.pop(n)
                if ring is not None:
                    leaves[j] |= leaves[d]
        if ring is None:
            continue
        res = a.writes[0][0]
        k = _first_access(row, j, res)
        if k is None:
            continue
        b = row[k]
        if (
            _ring(b) is not None
            and RING_OPS[b.ins.name].width == ring.width
            and b.reads.count(res) == 1
            and _ring_reads(b, res) == 1
            and (b.writes[0][0] == res or res not in live_after[k])
            and not any(n in leaves[j] for m in range(j + 1, k) for n, _ in row[m].writes)
        ):
            flow.fused.add(a.ins.pc)
            pending[res] = j

    last = row[-1]
    if last.ins is None:
        return
    # compare + cond_br
    if last.ins.name == "cond_br" and len(row) >= 2:
        prev = row[-2]
        cond = last.reads[0]
        if (
            prev.ins is not None
            and prev.ins.name in isa.COMPARES
            and prev.writes and prev.writes[0][0] == cond
            and cond not in last.reads[1:]
            and cond not in live_after[-1]
        ):
            flow.fused_cmps.add(prev.ins.pc)
    # copy coalescing into a br's destination registers
    if last.ins.name == "br":
        target, pairs = last.edges[0]
        srcs = [s for s, _ in pairs]
        dsts = [d for _, d in pairs]
        for s, d in pairs:
            if s == d or srcs.count(s) != 1 or dsts.count(d) != 1 or s in dsts or d in srcs:
                continue
            if s in flow.constants or d in flow.constants:
                continue
            if s in live_in[target]:
                continue
            j = _last_write(row, s)
            if j is None or _ring(row[j]) is None or row[j].ins.pc in flow.fused:
                continue
            # (a fused expression reads its leaves where it is consumed)
            if any(
                s in row[m].reads or d in row[m].reads or d in leaves.get(m, ())
                or any(n in (s, d) for n, _ in row[m].writes)
                for m in range(j + 1, len(row) - 1)
            ):
                continue
            flow.rename[row[j].ins.pc] = d
            flow.skipped_pairs.setdefault(last.ins.pc, set()).add((s, d))


def _first_access(row: list[_Ins], j: int, name: str) -> int | None:
    """Index of the first instruction after j reading `name` (None if a write or the
    block end comes first, or the first reader is the terminator)."""
    for k in range(j + 1, min(len(row) - 1, j + 1 + FUSE_WINDOW)):
        a = row[k]
        if name in a.reads:
            return k
        if any(n == name for n, _ in a.writes):
            return None
    return None


def _last_write(row: list[_Ins], name: str) -> int | None:
    for j in range(len(row) - 2, -1, -1):
        if any(n == name for n, _ in row[j].writes):
            return j
        if name in row[j].reads:
            return None
    return None


def _unsigned(flow: Flow, acc, types: dict, param_set: set, fn) -> None:
    """Registers held as their value modulo 2^n (see the module doc)."""
    ok: dict[str, int] = {}
    bad: set = set(param_set) | set(flow.constants)
    grows: set = set()
    results = fn.cconv.results
    for row in acc:
        for a in row:
            if a.ins is None:
                continue
            ring = _ring(a)
            renamed = flow.rename.get(a.ins.pc)
            for n, _ in a.writes:
                target = renamed or n
                if a.ins.name in _CONSTS:
                    if ok.setdefault(target, _CONSTS[a.ins.name]) != _CONSTS[a.ins.name]:
                        bad.add(target)
                    continue
                if ring is None:
                    bad.add(target)
                    continue
                if a.ins.pc in flow.fused:
                    continue
                if ok.setdefault(target, ring.width) != ring.width:
                    bad.add(target)
                if not ring.bitwise:
                    grows.add(target)
            for i, n in enumerate(a.reads):
                if ring is not None and i in ring.positions and ok.get(n, ring.width) == ring.width:
                    ok.setdefault(n, ring.width)
                    continue
                if a.ins.name == "return":
                    continue
                bad.add(n)
            if a.ins.name == "return":
                regs = [n for n in map(_iname, a.ins.fields[0]) if n]
                for n, t in zip(regs, [t for t in results if t != "r"]):
                    if t not in "iI":
                        bad.add(n)
                    elif ok.setdefault(n, 32 if t == "i" else 64) != (32 if t == "i" else 64):
                        bad.add(n)
    for name, width in ok.items():
        if name in bad or name not in grows:
            continue
        if types.get(name) != f"i{width}":
            continue
        flow.unsigned[name] = width
    # A copy into an unsigned register must come from a register of the same width.
    changed = True
    while changed:
        changed = False
        for s, d in _edge_copies(acc):
            w = flow.unsigned.get(d)
            if w is not None and types.get(s) not in (None, f"i{w}"):
                del flow.unsigned[d]
                changed = True

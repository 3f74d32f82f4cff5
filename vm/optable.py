"""The VM's instruction set, one row per op: where an op is defined.

A row (`Op`) holds everything tinyhal knows about one instruction of IREE's bytecode 17.0:
its mnemonic, opcode set and byte, operand layout (see `isa`), and its meaning, written
once as a `Form` from which the Python template of the translator (`codegen`, through
`templates.template`) and the case of the C interpreter (`vm/scalar/scalar.c`, generated
into it by `vm/scalar/build.py`) are both produced, plus the facts the verifier and the
data-flow analysis read (terminator, ring arithmetic and which operands it scales, what a
register list holds, whether it writes a constant) and where, if anywhere, the C
interpreter runs it (`native`).

A form is written over the instruction's fields by position: `{0}`, `{1}`, ... is field
k's value (a register read, a literal); `{s0}` / `{u0}` read an integer register as
signed / unsigned of its width and `{b0}` a register's raw bits. The result is the last
field. The operators are those Python and C spell alike (`+ - * & | ^ ~ << >> == != < <=
> >=`, parentheses), with `and`, `or`, `not` written the Python way. Integer forms read in
Python as the VM's signed value and in C as its unsigned bits; a ring form (`ring`) is
exact modulo 2^n in both, the others say what they produce (`pred`, `pick`, `value`,
`wrapped`, `f32_arith`, `libm`). Where no such form says it (a trapping division, a
conversion with a rounding rule, a buffer access), the row gives both spellings side by
side (`spelled`), still in this one row; where the translation or the interpreter is
control flow or state rather than an expression (branches, calls, globals, lists), the
row says `HANDWRITTEN` and names the one place: `codegen._Gen.op_<name>` for Python,
`scalar.c`'s `interpret` for C.

This module imports nothing of tinyhal: the C build (`vm/scalar/build.py`) loads it by
path before the package can be imported. A test may `extend` the table with a row of its
own: the modules that derive tables from it (`isa`, `templates`, `regflow`, `scalar`)
subscribe through `on_row` and see every row, present and added.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import NamedTuple

__all__ = ["ENTRY", "EXT_F32", "EXT_F64", "HANDWRITTEN", "LOOP", "Form", "Op", "Ring", "by_name",
           "extend", "f32_arith", "helper", "libm", "make", "meaning", "on_row", "pick", "pred",
           "ring", "rows", "spelled", "value", "wrap_statement", "wrapped"]

EXT_F32 = 0xE0  # opcode prefix of the f32 extension set
EXT_F64 = 0xE1  # and of the f64 one
HANDWRITTEN = "handwritten"  # python / c of a row whose meaning a handler spells out

# `Op.native`: where the C interpreter runs an op (0: never, the Python translation only)
LOOP = 1  # integer loops (`scalar.encode`) and VMVX workgroup functions
ENTRY = 2  # VMVX workgroup functions only (`scalar.encode_entry`)

M32 = "4294967295"
M64 = "18446744073709551615"
H32 = "2147483648"
H64 = "9223372036854775808"


class Ring(NamedTuple):
    """An integer op exact modulo 2^width (add, sub, mul, fma, and, or, xor, not, shl):
    `expr` over its operands, which of them are ring operands (only their value modulo
    2^width matters), whether it is bitwise (its result is no wider than its operands),
    and which operands it scales (multiplies: a value carried unreduced through them
    grows geometrically). `regflow` defers such ops' wrapping; `codegen.ring_op` emits
    them."""

    expr: str
    width: int
    positions: tuple[int, ...]
    bitwise: bool
    scaling: tuple[int, ...] = ()


class Form(NamedTuple):
    """An op's meaning rendered for its row: its Python template for `codegen` (None: a
    ring op, emitted by `codegen.ring_op` from `ring`; HANDWRITTEN: `codegen._Gen`'s
    `op_<name>`), its C case body for scalar.c (None: not in C; HANDWRITTEN: spelled in
    scalar.c's `interpret`) and its ring facts."""

    python: str | None
    c: str | None
    ring: Ring | None = None


class Op(NamedTuple):
    """One instruction (see the module docstring). Its meaning is kept as its form,
    rendered only when asked (`meaning`): decoding a module reads names and layouts only."""

    name: str
    opset: int | None  # None: the core set; EXT_F32 / EXT_F64
    opcode: int
    layout: str  # isa's field codes
    form: Callable[[str], Form]  # the meaning, rendered for `layout` by `meaning`
    native: int = 0  # LOOP, ENTRY or 0 (Python only)
    terminator: bool = False  # ends its block's control flow
    lists: str = ""  # what its `V` register list holds: "result" (the result's bank),
    # "ref", "any", or "signature" (a call's or return's: the verifier checks it)
    constant: bool = False  # writes a literal (its first field, or zero) and reads nothing
    effect: str = ""  # what it does beyond registers and memory, which ends a straight run
    # of instructions (a recording block): "call", "output" (trace, print) or "fail"
    compare: bool = False  # writes an i32 0/1 answering a predicate of its operands (a
    # `pred` form, or spelled so): a branch may take it as its condition


# -- forms ------------------------------------------------------------------------------

_PLACE = r"\{([sub]?)(\d+)\}"  # a placeholder of a form (compiled at first use)
_BANK_BITS = {"i32": 32, "i64": 64, "f32": 32, "f64": 64}


def _fields(layout: str) -> list[tuple[str, str]]:
    return [tuple(f.partition(":")[::2]) for f in layout.split()]  # type: ignore[misc]


def _python(form: str, layout: str) -> str:
    """A form in Python: `{uK}` masks to the register's width, other reads are as held."""
    fields = _fields(layout)

    def one(m: re.Match) -> str:
        view, k = m.group(1), int(m.group(2))
        if view == "u":
            return "({%d} & %s)" % (k, M32 if _BANK_BITS[fields[k][1]] == 32 else M64)
        return "{%d}" % k
    return re.sub(_PLACE, one, form)


def _word(at: int) -> str:
    """The C expression of the instruction's word `at` (1: the word after the opcode,
    scalar.c's `A`)."""
    return "ABCDE"[at - 1] if at <= 5 else f"code[pc + {at}]"


def _words(layout: str) -> list[int]:
    """Each field's first word."""
    out, at = [], 1
    for code, arg in _fields(layout):
        out.append(at)
        at += 2 if code == "A" and arg == "i64" else 1
    return out


def _word_count(layout: str) -> int:
    return 1 + sum(2 if code == "A" and arg == "i64" else 1 for code, arg in _fields(layout))


def _c(form: str, layout: str) -> str:
    """A form in C, in the vocabulary of scalar.c's `interpret` (`U32(r)`, `S64(r)`,
    `F32(r)`, `refs[r]`, and `{wK}` for field K's raw word)."""
    fields = _fields(layout)
    words = _words(layout)

    def one(m: re.Match) -> str:
        view, k = m.group(1), int(m.group(2))
        code, arg = fields[k]
        word = _word(words[k])
        if code in ("r", "w"):
            if arg == "ref":
                return f"refs[{word}]"
            bits = _BANK_BITS[arg]
            if arg[0] == "f" and view != "b":
                return f"F{bits}({word})"
            return f"{'S' if view == 's' else 'U'}{bits}({word})"
        if code == "A" and arg == "i64":
            return f"(((uint64_t)(uint32_t){_word(words[k] + 1)} << 32) | (uint32_t){word})"
        return word
    text = re.sub(r"\{w(\d+)\}", lambda m: _word(words[int(m.group(1))]), form)
    text = re.sub(_PLACE, one, text)
    text = re.sub(r"\bnot\s+", "!", text)
    return text.replace(" or ", " || ").replace(" and ", " && ")


def _put(layout: str, bits: bool = False) -> str:
    """The C store of the result (the last field) by its bank, `%s` its value."""
    code, arg = _fields(layout)[-1]
    word = _word(_words(layout)[-1])
    if arg == "ref":
        return f"refs[{word}] = %s"
    if arg == "f32" and not bits:
        return f"PUTF({word}, %s)"
    return f"PUT{_BANK_BITS[arg]}({word}, %s)"


# A form constructor takes the row's layout and returns a `Form`; rows call them through
# `_row`, so each is written with its meaning only.
FormOf = Callable[[str], Form]


def ring(expr: str, positions: tuple[int, ...], bitwise: bool = False,
         scaling: tuple[int, ...] = ()) -> FormOf:
    """Exact modulo 2^n: `expr` in both languages (C's unsigned arithmetic wraps)."""
    def of(layout: str) -> Form:
        width = _BANK_BITS[_fields(layout)[-1][1]]
        return Form(None, _put(layout) % _c(expr, layout),
                    Ring(_python(expr, layout), width, positions, bitwise, scaling))
    return of


def pred(cond: str, negated: bool = False) -> FormOf:
    """An i32 0/1 answering `cond` (`negated`: answering its negation, as `0 if ...`); its
    row is a compare (`Op.compare`)."""
    def of(layout: str) -> Form:
        res = len(_fields(layout)) - 1
        py = "{%d} = %s if %s else %s" % (res, *(("0", _python(cond, layout), "1") if negated
                                                 else ("1", _python(cond, layout), "0")))
        c = _c(f"not ({cond})" if negated else cond, layout)
        return Form(py, _put(layout) % f"({c}) ? 1 : 0")
    of.predicate = True  # type: ignore[attr-defined]
    return of


def pick(cond: str, yes: int, no: int) -> FormOf:
    """Field `yes` if `cond` else field `no`, moved as bits (select, min, max)."""
    def of(layout: str) -> Form:
        res = len(_fields(layout)) - 1
        py = "{%d} = {%d} if %s else {%d}" % (res, yes, _python(cond, layout), no)
        c = _c("(%s) ? {b%d} : {b%d}" % (cond, yes, no), layout)
        return Form(py, _put(layout, bits=True) % c)
    return of


def value(expr: str) -> FormOf:
    """`expr`, already the result's value (in range for its width)."""
    def of(layout: str) -> Form:
        res = len(_fields(layout)) - 1
        return Form("{%d} = %s" % (res, _python(expr, layout)), _put(layout) % _c(expr, layout))
    return of


def wrapped(expr: str) -> FormOf:
    """`expr` wrapped to the result's signed width (C: the unsigned bits it stores)."""
    def of(layout: str) -> Form:
        res = len(_fields(layout)) - 1
        bits = _BANK_BITS[_fields(layout)[-1][1]]
        return Form(wrap_statement("{%d}" % res, _python(expr, layout), bits),
                    _put(layout) % _c(expr, layout))
    return of


def wrap_statement(res: str, expr: str, bits: int) -> str:
    """`res = expr` wrapped to a signed `bits` integer; the common in-range case costs
    two compares instead of three big-int operations."""
    hi, lo = (2**31 - 1, -(2**31)) if bits == 32 else (2**63 - 1, -(2**63))
    h, m = (H32, M32) if bits == 32 else (H64, M64)
    return f"{res} = {expr}\nif {res} > {hi} or {res} < {lo}: {res} = ({res} + {h} & {m}) - {h}"


_ROUND_F32 = "_fa[0] = {e}; {r} = _fa[0]"  # Python: round to binary32 through `_fa`


def f32_arith(expr: str, nan_first: bool = False) -> FormOf:
    """IEEE arithmetic `expr`, rounded to the result's format (f32: binary32 through the
    per-call array `_fa` in Python). `nan_first`: a NaN result is the first NaN operand
    (IREE's rule for commutative ops, which CPython and C compilers do not fix)."""
    def of(layout: str) -> Form:
        fields = _fields(layout)
        res = len(fields) - 1
        f32 = fields[-1][1] == "f32"
        r = "{%d}" % res
        if nan_first:
            py = "_t = %s\nif _t != _t: _t = _nanp({0}, {1}, _t)\n" % _python(expr, layout)
            py += _ROUND_F32.format(e="_t", r=r) if f32 else f"{r} = _t"
            c = ("{ float r = %s; %s; }" % (_c(expr, layout), _put(layout)
                                           % "r != r ? nan_first(F32(A), F32(B), r) : r"))
        else:
            e = _python(expr, layout)
            py = _ROUND_F32.format(e=e, r=r) if f32 else f"{r} = {e}"
            c = _put(layout) % _c(expr, layout)
        return Form(py, c)
    return of


# scalar.h's MATH_* order: the C library's unary functions the interpreter is handed
LIBM_UNARY = ("atan", "cos", "sin", "exp", "exp2", "expm1", "log", "log10", "log1p", "log2",
              "sqrt", "tanh", "erf", "ceil", "floor", "round")
LIBM_BINARY = {"atan2": "atan2f", "pow": "powf", "rem": "remainderf"}  # -> the math table's field


def libm(function: str) -> FormOf:
    """The C library's `function` of the operand(s), the same symbol in both languages:
    Python calls `templates.HELPERS['_<function>_<type>']`, C the address handed over."""
    def of(layout: str) -> Form:
        fields = _fields(layout)
        t = fields[-1][1]
        operands = ", ".join("{%d}" % k for k in range(len(fields) - 1))
        py = "{%d} = _%s_%s(%s)" % (len(fields) - 1, function, t, operands)
        if function in LIBM_BINARY:
            c = "((binary_fn)math_fns.%s)({0}, {1})" % LIBM_BINARY[function]
        else:
            c = "unary(MATH_%s, {0})" % function.upper()
        return Form(py, _put(layout) % _c(c, layout) if t == "f32" else None)
    return of


def spelled(python: str | None, c: str | None = None) -> FormOf:
    """A meaning no form above says, spelled in both languages side by side: `python` a
    template as is (None: HANDWRITTEN in codegen), `c` a case body over placeholders."""
    def of(layout: str) -> Form:
        return Form(HANDWRITTEN if python is None else python,
                    None if c is None else c if c == HANDWRITTEN else _c(c, layout))
    return of


def helper(name: str, c: str | None = None) -> FormOf:
    """A call of the Python helper `_name` over every field but the result, stored in the
    result (if the layout has one); `c` spells the C case if the interpreter has it."""
    def of(layout: str) -> Form:
        fields = _fields(layout)
        has_result = fields[-1][0] == "w"
        n = len(fields) - 1 if has_result else len(fields)
        call = "_%s(%s)" % (name, ", ".join("{%d}" % k for k in range(n)))
        return spelled(("{%d} = " % n if has_result else "") + call, c)(layout)
    return of


# -- the table --------------------------------------------------------------------------

_ROWS: list[Op] = []
_BY_KEY: dict[tuple[int | None, int], Op] = {}
_BY_NAME: dict[str, Op] = {}
_SUBSCRIBERS: list[Callable[[Op], None]] = []


def _add(op: Op) -> None:
    if (op.opset, op.opcode) in _BY_KEY or op.name in _BY_NAME:
        raise ValueError(f"op {op.name} (0x{op.opcode:02X}) is defined twice")
    _ROWS.append(op)
    _BY_KEY[(op.opset, op.opcode)] = op
    _BY_NAME[op.name] = op
    for subscriber in _SUBSCRIBERS:
        subscriber(op)


def make(opset: int | None, opcode: int, name: str, layout: str, form: FormOf, *,
         native: int = 0, terminator: bool = False, lists: str = "",
         constant: bool = False, effect: str = "", compare: bool = False) -> Op:
    """A row (for `extend`; the table's own are made alike). A `pred` form makes it a
    compare."""
    compare = compare or getattr(form, "predicate", False)
    return Op(name, opset, opcode, layout, form, native, terminator, lists, constant, effect,
              compare)


_MEANINGS: dict[Op, Form] = {}


def meaning(op: Op) -> Form:
    """`op`'s form rendered for its layout, the C case with its advance to the next
    instruction appended (HANDWRITTEN control flow advances itself) and only where the
    interpreter runs it; ValueError for a native op without a C case."""
    done = _MEANINGS.get(op)
    if done is None:
        rendered = op.form(op.layout)
        c = rendered.c if op.native else None
        if c is not None and c != HANDWRITTEN:
            c = f"{c}{' ' if c.endswith('}') else '; '}NEXT({_word_count(op.layout)});"
        if op.native and c is None:
            raise ValueError(f"op {op.name} runs natively but has no C case")
        done = _MEANINGS[op] = Form(rendered.python, c, rendered.ring)
    return done


def _row(opcode: int, name: str, layout: str, form: FormOf, **facts) -> None:
    _add(make(_opset, opcode, name, layout, form, **facts))


def rows() -> tuple[Op, ...]:
    """Every row, in the order defined (then added)."""
    return tuple(_ROWS)


def by_name(name: str) -> Op | None:
    return _BY_NAME.get(name)


def on_row(subscriber: Callable[[Op], None]) -> None:
    """Calls `subscriber(row)` for every row now and for every row `extend` adds later:
    how a module keeps a table derived from this one."""
    _SUBSCRIBERS.append(subscriber)
    for op in _ROWS:
        subscriber(op)


def extend(ops: Iterable[Op]) -> None:
    """Adds rows (a test's own op, made with `make`) to the table and to every table
    derived from it."""
    for op in ops:
        _add(op)


HW = spelled(None, HANDWRITTEN)  # both languages handwritten (control flow)
PY = spelled(None)  # a translator handler, not in C


def _int_rows(bits: int, base: dict[str, int]) -> None:
    """The integer ops IREE has at both widths (shift amounts are i32 at both, compares
    write an i32), `base` their opcodes at this width."""
    t, w = f"i{bits}", f"r:i{bits}"
    sh = bits - 1
    m = M32 if bits == 32 else M64
    two, one, cmp2 = f"{w} {w} w:{t}", f"{w} w:{t}", f"{w} {w} w:i32"
    shift = f"{w} r:i32 w:{t}"
    fault = "{s1} == 0 or ({s1} == -1 and {s0} == INT%d_MIN)" % bits
    ops_: list[tuple[str, str, FormOf, int]] = [
        (f"add.{t}", two, ring("{0} + {1}", (0, 1)), LOOP),
        (f"sub.{t}", two, ring("{0} - {1}", (0, 1)), LOOP),
        (f"mul.{t}", two, ring("{0} * {1}", (0, 1), scaling=(0, 1)), LOOP),
        (f"fma.{t}", f"{w} {w} {w} w:{t}", ring("{0} * {1} + {2}", (0, 1, 2), scaling=(0, 1)), LOOP),
        (f"and.{t}", two, ring("{0} & {1}", (0, 1), True), LOOP),
        (f"or.{t}", two, ring("{0} | {1}", (0, 1), True), LOOP),
        (f"xor.{t}", two, ring("{0} ^ {1}", (0, 1), True), LOOP),
        (f"not.{t}", one, ring("~{0}", (0,), True), LOOP),
        (f"shl.{t}", shift, ring("{0} << ({1} & %d)" % sh, (0,), scaling=(0,)), LOOP),
        # the Python helpers raise the VM's error where C traps (the translation reruns)
        (f"div.{t}.s", two, helper(f"div_{t}s", "if (%s) goto trap; PUT%d({w2}, {s0} / {s1})"
                                   % (fault, bits)), LOOP),
        (f"div.{t}.u", two, helper(f"div_{t}u", "if ({u1} == 0) goto trap; PUT%d({w2}, {u0} / {u1})"
                                   % bits), LOOP),
        (f"rem.{t}.s", two, helper(f"rem_{t}s", "if (%s) goto trap; PUT%d({w2}, {s0} %% {s1})"
                                   % (fault, bits)), LOOP),
        (f"rem.{t}.u", two, helper(f"rem_{t}u",
                                   "if ({u1} == 0) goto trap; PUT%d({w2}, {u0} %% {u1})"
                                   % bits), LOOP),
        (f"abs.{t}", one, spelled(wrap_statement("{1}", "abs({0})", bits),
                                  "PUT%d({w1}, {s0} < 0 ? 0 - {u0} : {u0})" % bits), LOOP),
        (f"min.{t}.s", two, pick("{s1} < {s0}", 1, 0), LOOP),
        (f"min.{t}.u", two, pick("{u1} < {u0}", 1, 0), LOOP),
        (f"max.{t}.s", two, pick("{s0} < {s1}", 1, 0), LOOP),
        (f"max.{t}.u", two, pick("{u0} < {u1}", 1, 0), LOOP),
        (f"ctlz.{t}", one, spelled("{1} = %d - ({0} & %s).bit_length()" % (bits, m),
                                   "PUT%d({w1}, clz%d({u0}))" % (bits, bits)), LOOP),
        (f"shr.{t}.s", shift, value("{s0} >> ({1} & %d)" % sh), LOOP),
        (f"shr.{t}.u", shift, wrapped("{u0} >> ({1} & %d)" % sh), LOOP),
        (f"cmp.eq.{t}", cmp2, pred("{0} == {1}"), LOOP),
        (f"cmp.ne.{t}", cmp2, pred("{0} != {1}"), LOOP),
        (f"cmp.lt.{t}.s", cmp2, pred("{s0} < {s1}"), LOOP),
        (f"cmp.lt.{t}.u", cmp2, pred("{u0} < {u1}"), LOOP),
        (f"cmp.nz.{t}", f"{w} w:i32", pred("{0}"), LOOP),
        (f"select.{t}", f"r:i32 {w} {w} w:{t}", pick("{0}", 1, 2), LOOP),
        (f"const.{t}.zero", f"w:{t}", value("0"), LOOP),
        (f"const.{t}", f"A:{t} w:{t}", spelled("{1} = {0!r}", "PUT%d({w1}, {0})" % bits), LOOP),
        (f"global.load.{t}", f"G w:{t}", spelled("{1} = _ld_%s(_G, {0})[0]" % t), 0),
        (f"global.store.{t}", f"G r:{t}", spelled("_st_%s(_G, {0}, {1})" % t), 0),
        (f"global.load.indirect.{t}", f"r:i32 w:{t}",
         spelled("{1} = _ld_%s(_G, _goff({0}, %d, _GCAP))[0]" % (t, bits // 8)), 0),
        (f"global.store.indirect.{t}", f"r:i32 {w}",
         spelled("_st_%s(_G, _goff({0}, %d, _GCAP), {1})" % (t, bits // 8)), 0),
        (f"list.get.{t}", f"r:ref r:i32 w:{t}", helper(f"list_get_{t}"), 0),
        (f"list.set.{t}", f"r:ref r:i32 {w}", helper(f"list_set_{t}"), 0),
        (f"switch.{t}", f"r:i32 {w} V w:{t}", PY, 0),
    ]
    for name, layout, form, native in ops_:
        _row(base[name], name, layout, form, native=native,
             lists="result" if name.startswith("switch.") else "",
             constant=name.startswith("const."))


def _float_rows(t: str, base: dict[str, int]) -> None:
    """The float ops IREE has for both f32 and f64 (the C interpreter has f32's: in
    integer loops too, but buffer accesses only in workgroup functions)."""
    f32 = t == "f32"
    native = LOOP if f32 else 0
    w = f"r:{t}"
    two, one, cmp2 = f"{w} {w} w:{t}", f"{w} w:{t}", f"{w} {w} w:i32"
    nbytes = 4 if f32 else 8
    mask = "0x7FFFFFFFu" if f32 else "0x7FFFFFFFFFFFFFFFull"
    sign = "0x80000000u" if f32 else "0x8000000000000000ull"
    fma_py = "_t = {0} * {1}\nif _t != _t: _t = _nanp({0}, {1}, _t)\n" + (
        "_fa[0] = _t; _t = _fa[0] + {2}\nif _t != _t: _t = _nanp(_fa[0], {2}, _t)\n"
        "_fa[0] = _t; {3} = _fa[0]" if f32 else
        "_u = _t + {2}\nif _u != _u: _u = _nanp(_t, {2}, _u)\n{3} = _u")
    # a multiply and an add, each rounded, as IREE's VM computes it
    fma_c = ("{ float a = {0}, b = {1}, c = {2}; float p = a * b; if (p != p) "
             "p = nan_first(a, b, p); float r = p + c; PUTF({w3}, r != r ? nan_first(p, c, r) "
             ": r); }")
    ops_: list[tuple[str, str, FormOf]] = [
        (f"add.{t}", two, f32_arith("{0} + {1}", nan_first=True)),
        (f"sub.{t}", two, f32_arith("{0} - {1}")),
        (f"mul.{t}", two, f32_arith("{0} * {1}", nan_first=True)),
        # Python's `/` raises on zero where IEEE gives an infinity or NaN (`_div_f`)
        (f"div.{t}", two, spelled(_ROUND_F32.format(e="({0} / {1} if {1} else _div_f({0}, {1}))",
                                                    r="{2}") if f32 else
                                  "{2} = ({0} / {1} if {1} else _div_f({0}, {1}))",
                                  "PUTF({w2}, {0} / {1})")),
        (f"rem.{t}", two, libm("rem")),
        (f"fma.{t}", f"{w} {w} {w} w:{t}", spelled(fma_py, fma_c)),
        (f"abs.{t}", one, spelled("{1} = abs({0})", "PUT%d({w1}, {b0} & %s)"
                                  % (nbytes * 8, mask))),
        (f"neg.{t}", one, spelled("{1} = -{0}", "PUT%d({w1}, {b0} ^ %s)" % (nbytes * 8, sign))),
        (f"min.{t}", two, pick("{1} < {0}", 1, 0)),
        (f"max.{t}", two, pick("{0} < {1}", 1, 0)),
        (f"atan2.{t}", two, libm("atan2")),
        (f"pow.{t}", two, libm("pow")),
        (f"rsqrt.{t}", one, spelled("{1} = _rsqrt_%s({0})" % t,
                                    "PUTF({w1}, 1.0f / unary(MATH_SQRT, {0}))")),
        (f"cmp.eq.{t}.o", cmp2, pred("{0} == {1}")),
        (f"cmp.eq.{t}.u", cmp2, pred("({0} < {1} or {0} > {1})", negated=True)),
        (f"cmp.ne.{t}.o", cmp2, pred("{0} != {1}")),
        (f"cmp.ne.{t}.u", cmp2, pred("{0} != {1}")),
        (f"cmp.lt.{t}.o", cmp2, pred("{0} < {1}")),
        (f"cmp.lt.{t}.u", cmp2, pred("{0} >= {1}", negated=True)),
        (f"cmp.lte.{t}.o", cmp2, pred("{0} <= {1}")),
        (f"cmp.lte.{t}.u", cmp2, pred("{0} > {1}", negated=True)),
        (f"cmp.nan.{t}", f"{w} w:i32", pred("{0} != {0}")),
        (f"select.{t}", f"r:i32 {w} {w} w:{t}", pick("{0}", 1, 2)),
        (f"const.{t}.zero", f"w:{t}", spelled("{0} = 0.0", "PUT%d({w0}, 0)" % (nbytes * 8))),
        # exact bits (a subnormal's value depends on the floating-point state)
        (f"const.{t}", f"A:{t} w:{t}", spelled(None, "PUT32({w1}, {0})")),
        (f"global.load.{t}", f"G w:{t}", spelled("{1} = _gload_%s(_G, {0})" % t)),
        (f"global.store.{t}", f"G r:{t}", spelled("_gstore_%s(_G, {0}, {1})" % t)),
        (f"global.load.indirect.{t}", f"r:i32 w:{t}",
         spelled("{1} = _gload_%s(_G, _goff({0}, %d, _GCAP))" % (t, nbytes))),
        (f"global.store.indirect.{t}", f"r:i32 {w}",
         spelled("_gstore_%s(_G, _goff({0}, %d, _GCAP), {1})" % (t, nbytes))),
        (f"list.get.{t}", f"r:ref r:i32 w:{t}", helper(f"list_get_{t}")),
        (f"list.set.{t}", f"r:ref r:i32 {w}", helper(f"list_set_{t}")),
        (f"switch.{t}", f"r:i32 {w} V w:{t}", PY),
        (f"buffer.load.{t}", f"r:ref r:i64 w:{t}", helper(
            f"buffer_load_{t}", "BUFFER_LOAD({w0}, {w1}, {w2}, uint32_t, 2, PUT32)")),
        (f"buffer.store.{t}", f"r:ref r:i64 {w}", helper(
            f"buffer_store_{t}", "BUFFER_STORE({w0}, {w1}, {w2}, uint32_t, 2, U32)")),
        (f"buffer.fill.{t}", f"r:ref r:i64 r:i64 {w}", helper(
            f"buffer_fill_{t}", "BUFFER_FILL({w0}, {w1}, {w2}, {w3}, uint32_t, 2, U32)")),
        (f"round.{t}.even", one, helper(f"round_even_{t}")),
    ]
    ops_ += [(f"{fn}.{t}", one, libm(fn)) for fn in LIBM_UNARY]
    for name, layout, form in ops_:
        _row(base[name], name, layout, form, native=0 if (
            name.startswith(("global.", "list.", "switch.")) or name.endswith(".even")) else
            ENTRY if native and name.startswith("buffer.") else native,
            lists="result" if name.startswith("switch.") else "",
            constant=name.startswith("const."))


# Opcode bytes, transcribed from the facts of IREE's `isa.json` for bytecode version 17.0;
# `_opset` is the opcode set the rows that follow belong to.
_opset: int | None = None
_int_rows(32, {
    "global.load.i32": 0x00, "global.store.i32": 0x01, "global.load.indirect.i32": 0x02,
    "global.store.indirect.i32": 0x03, "const.i32.zero": 0x0C, "const.i32": 0x0D,
    "list.get.i32": 0x16, "list.set.i32": 0x17, "select.i32": 0x1C, "switch.i32": 0x1F,
    "add.i32": 0x22, "sub.i32": 0x23, "mul.i32": 0x24, "div.i32.s": 0x25, "div.i32.u": 0x26,
    "rem.i32.s": 0x27, "rem.i32.u": 0x28, "fma.i32": 0x29, "not.i32": 0x32, "and.i32": 0x33,
    "or.i32": 0x34, "xor.i32": 0x35, "shl.i32": 0x3A, "shr.i32.s": 0x3B, "shr.i32.u": 0x3C,
    "cmp.eq.i32": 0x49, "cmp.ne.i32": 0x4A, "cmp.lt.i32.s": 0x4B, "cmp.lt.i32.u": 0x4C,
    "cmp.nz.i32": 0x4D, "ctlz.i32": 0x75, "abs.i32": 0x77, "min.i32.s": 0x7A,
    "min.i32.u": 0x7B, "max.i32.s": 0x7C, "max.i32.u": 0x7D,
})
_int_rows(64, {
    "global.load.i64": 0x04, "global.store.i64": 0x05, "global.load.indirect.i64": 0x06,
    "global.store.indirect.i64": 0x07, "const.i64.zero": 0x0E, "const.i64": 0x0F,
    "list.get.i64": 0x18, "list.set.i64": 0x19, "select.i64": 0x1D, "switch.i64": 0x20,
    "add.i64": 0x2A, "sub.i64": 0x2B, "mul.i64": 0x2C, "div.i64.s": 0x2D, "div.i64.u": 0x2E,
    "rem.i64.s": 0x2F, "rem.i64.u": 0x30, "fma.i64": 0x31, "not.i64": 0x36, "and.i64": 0x37,
    "or.i64": 0x38, "xor.i64": 0x39, "shl.i64": 0x3D, "shr.i64.s": 0x3E, "shr.i64.u": 0x3F,
    "cmp.eq.i64": 0x4E, "cmp.ne.i64": 0x4F, "cmp.lt.i64.s": 0x50, "cmp.lt.i64.u": 0x51,
    "cmp.nz.i64": 0x52, "ctlz.i64": 0x76, "abs.i64": 0x78, "min.i64.s": 0x7E,
    "min.i64.u": 0x7F, "max.i64.s": 0x80, "max.i64.u": 0x81,
})

_BUF = "r:ref r:i64"
# buffer.load / store / fill: (element type in memory, log2 of its size, register put/get)
for _op, _w, _ctype, _shift, _acc, _t in (
        (0x62, "i8.u", "uint8_t", 0, "PUT32", "i32"), (0x63, "i8.s", "int8_t", 0, "PUT32", "i32"),
        (0x64, "i16.u", "uint16_t", 1, "PUT32", "i32"),
        (0x65, "i16.s", "int16_t", 1, "PUT32", "i32"),
        (0x66, "i32", "uint32_t", 2, "PUT32", "i32"), (0x67, "i64", "int64_t", 3, "PUT64", "i64")):
    _row(_op, f"buffer.load.{_w}", f"{_BUF} w:{_t}", helper(
        f"buffer_load_{_w.replace('.', '')}",
        f"BUFFER_LOAD({{w0}}, {{w1}}, {{w2}}, {_ctype}, {_shift}, {_acc})"), native=ENTRY)
for _op, _w, _ctype, _shift, _get, _t in (
        (0x68, "i8", "uint8_t", 0, "U32", "i32"), (0x69, "i16", "uint16_t", 1, "U32", "i32"),
        (0x6A, "i32", "uint32_t", 2, "U32", "i32"), (0x6B, "i64", "uint64_t", 3, "U64", "i64")):
    _row(_op, f"buffer.store.{_w}", f"{_BUF} r:{_t}", helper(
        f"buffer_store_{_w}", f"BUFFER_STORE({{w0}}, {{w1}}, {{w2}}, {_ctype}, {_shift}, {_get})"),
        native=ENTRY)
    _row(_op + 9, f"buffer.fill.{_w}", f"{_BUF} r:i64 r:{_t}", helper(
        f"buffer_fill_{_w}",
        f"BUFFER_FILL({{w0}}, {{w1}}, {{w2}}, {{w3}}, {_ctype}, {_shift}, {_get})"), native=ENTRY)

_row(0x08, "global.load.ref", "G T w:ref", PY)
_row(0x09, "global.store.ref", "G T r:ref", PY)
_row(0x0A, "global.load.indirect.ref", "r:i32 T w:ref", PY)
_row(0x0B, "global.store.indirect.ref", "r:i32 T r:ref", PY)
_row(0x10, "const.ref.zero", "w:ref", spelled("{0} = None", "refs[{w0}] = 0"), native=ENTRY,
     constant=True)
# rodata segment k is the interpreter's span 4 + k
_row(0x11, "const.ref.rodata", "D w:ref", spelled("{1} = _ROD[{0}]",
                                                   "refs[{w1}] = (int32_t)(4 + {0})"), native=ENTRY,
     constant=True)
_row(0x12, "list.alloc", "T r:i32 w:ref", PY)
_row(0x13, "list.reserve", "r:ref r:i32", helper("list_reserve"))
_row(0x14, "list.size", "r:ref w:i32", helper("list_size"))
_row(0x15, "list.resize", "r:ref r:i32", helper("list_resize"))
# the bindings list: T's word says whether a buffer matches the type (else null)
_row(0x1A, "list.get.ref", "r:ref r:i32 T w:ref", spelled(
        None, "if ({0} <= 0 || !heap->spans[{0}].is_list || {u1} >= heap->list_count) "
              "goto trap; refs[{w3}] = {w2} ? (int32_t)(heap->list_first + {u1}) : 0"),
     native=ENTRY)
_row(0x1B, "list.set.ref", "r:ref r:i32 r:ref", PY)
_row(0x1E, "select.ref", "r:i32 T r:ref r:ref w:ref", PY)
_row(0x21, "switch.ref", "r:i32 T r:ref V w:ref", PY)
_row(0x40, "trunc.i32.i8", "r:i32 w:i32", value("{0} & 255"), native=LOOP)
_row(0x41, "trunc.i32.i16", "r:i32 w:i32", value("{0} & 65535"), native=LOOP)
_row(0x42, "trunc.i64.i32", "r:i64 w:i32", spelled(
        "{1} = {0} & %s\nif {1} > 2147483647: {1} -= 4294967296" % M32, "PUT32({w1}, {u0})"),
    native=LOOP)
_row(0x43, "ext.i8.i32.s", "r:i32 w:i32", spelled("{1} = {0} & 255\nif {1} > 127: {1} -= 256",
                                                   "PUT32({w1}, (int8_t){u0})"), native=LOOP)
_row(0x44, "ext.i8.i32.u", "r:i32 w:i32", value("{0} & 255"), native=LOOP)
_row(0x45, "ext.i16.i32.s", "r:i32 w:i32", spelled(
        "{1} = {0} & 65535\nif {1} > 32767: {1} -= 65536", "PUT32({w1}, (int16_t){u0})"),
     native=LOOP)
_row(0x46, "ext.i16.i32.u", "r:i32 w:i32", value("{0} & 65535"), native=LOOP)
_row(0x47, "ext.i32.i64.s", "r:i32 w:i64", value("{s0}"), native=LOOP)
_row(0x48, "ext.i32.i64.u", "r:i32 w:i64", spelled("{1} = {0} & " + M32, "PUT64({w1}, {u0})"),
    native=LOOP)
_row(0x53, "cmp.eq.ref", "r:ref r:ref w:i32", spelled("{2} = 1 if {0} is {1} else 0"),
     compare=True)
_row(0x54, "cmp.ne.ref", "r:ref r:ref w:i32", spelled("{2} = 0 if {0} is {1} else 1"),
     compare=True)
_row(0x55, "cmp.nz.ref", "r:ref w:i32", spelled("{1} = 0 if {0} is None else 1",
                                                "PUT32({w1}, {0} != 0)"), native=ENTRY,
     compare=True)
# natively only a call of a `vmvx` operation (scalar.c's `call`)
_row(0x58, "call", "F V V", HW, native=ENTRY, lists="signature", effect="call")
_row(0x59, "call.variadic", "F V V V", PY, lists="signature", effect="call")
_row(0x5A, "return", "V", HW, native=LOOP, lists="signature", terminator=True)
_row(0x5B, "fail", "r:i32 S", spelled("if {0}: raise _fail({0}, {1})"), effect="fail")
_row(0x5C, "import.resolved", "F w:i32", PY)
_row(0x5E, "trace", "S V", PY, lists="any", effect="output")
_row(0x5F, "print", "S V", PY, lists="any", effect="output")
_row(0x6C, "buffer.alloc", "r:i64 r:i32 w:ref", helper(
        "buffer_alloc", "{ int32_t handle = allocate(heap, {s0}); if (handle < 0) goto trap; "
                        "refs[{w2}] = handle; }"), native=ENTRY)
_row(0x6D, "buffer.clone", "r:ref r:i64 r:i64 r:i32 w:ref", helper("buffer_clone"))
_row(0x6E, "buffer.length", "r:ref w:i64", helper(
        "buffer_length", "{ span_t* span = reach(heap, {0}, 0, 0, 0, 0); if (!span) goto trap; "
                         "PUT64({w1}, span->length); }"), native=ENTRY)
# (source, its byte offset, target, its byte offset, length)
_row(0x6F, "buffer.copy", "r:ref r:i64 r:ref r:i64 r:i64", helper(
        "buffer_copy", "{ int64_t length = {s4}; span_t* src = length < 0 ? NULL : reach(heap, "
                       "{0}, {s1}, (uint64_t)length, 0, 0); span_t* dst = src ? reach(heap, {2}, "
                       "{s3}, (uint64_t)length, 0, 1) : NULL; if (!dst) goto trap; "
                       "memmove(dst->data + {s3}, src->data + {s1}, (size_t)length); }"),
     native=ENTRY)
_row(0x70, "buffer.compare", "r:ref r:i64 r:ref r:i64 r:i64 w:i32", helper("buffer_compare"))
_row(0x82, "cast.any.ref", "r:ref T w:ref", PY)
_row(0x84, "buffer.hash", "r:ref r:i64 r:i64 w:i64", helper("buffer_hash"))
_row(0x85, "discard.refs", "V", HW, native=ENTRY, lists="ref")
_row(0x86, "assign.ref", "r:ref w:ref", PY)

for _opcode, _name, _layout, _native in (
        (0x56, "br", "B O", LOOP), (0x57, "cond_br", "r:i32 B O B O", LOOP),
        (0x5D, "yield", "B O", 0), (0x60, "cond_break", "r:i32 B O", 0),
        (0x61, "break", "B O", 0), (0x83, "br_table", "r:i32 B O H C", 0),
        (0x87, "call.yieldable", "F V B V", 0), (0x88, "call.variadic.yieldable", "F V V B V", 0)):
    # a call that may yield resumes at a block of its own
    _call = _name.startswith("call")
    _row(_opcode, _name, _layout, HW if _native else PY, native=_native, terminator=True,
         lists="signature" if _call else "", effect="call" if _call else "")

_opset = EXT_F32
_float_rows("f32", {
    "global.load.f32": 0x00, "global.store.f32": 0x01, "global.load.indirect.f32": 0x02,
    "global.store.indirect.f32": 0x03, "const.f32.zero": 0x04, "const.f32": 0x05,
    "list.get.f32": 0x06, "list.set.f32": 0x07, "select.f32": 0x08, "switch.f32": 0x09,
    "add.f32": 0x0A, "sub.f32": 0x0B, "mul.f32": 0x0C, "div.f32": 0x0D, "rem.f32": 0x0E,
    "fma.f32": 0x0F, "abs.f32": 0x10, "neg.f32": 0x11, "ceil.f32": 0x12, "floor.f32": 0x13,
    "atan.f32": 0x1A, "atan2.f32": 0x1B, "cos.f32": 0x1C, "sin.f32": 0x1D, "exp.f32": 0x1E,
    "exp2.f32": 0x1F, "expm1.f32": 0x20, "log.f32": 0x21, "log10.f32": 0x22,
    "log1p.f32": 0x23, "log2.f32": 0x24, "pow.f32": 0x25, "rsqrt.f32": 0x26, "sqrt.f32": 0x27,
    "tanh.f32": 0x28, "erf.f32": 0x29, "cmp.eq.f32.o": 0x2A, "cmp.eq.f32.u": 0x2B,
    "cmp.ne.f32.o": 0x2C, "cmp.ne.f32.u": 0x2D, "cmp.lt.f32.o": 0x2E, "cmp.lt.f32.u": 0x2F,
    "cmp.lte.f32.o": 0x30, "cmp.lte.f32.u": 0x31, "cmp.nan.f32": 0x32,
    "buffer.load.f32": 0x33, "buffer.store.f32": 0x34, "buffer.fill.f32": 0x35,
    "round.f32": 0x36, "min.f32": 0x37, "max.f32": 0x38, "round.f32.even": 0x39,
})
for _opcode, _name, _layout, _form, _native in (
    (0x14, "cast.si32.f32", "r:i32 w:f32", f32_arith("{s0}"), LOOP),
    (0x15, "cast.ui32.f32", "r:i32 w:f32", f32_arith("{u0}"), LOOP),
    # to the nearest integer, halves away from zero (the C library's lroundf / llroundf)
    (0x16, "cast.f32.si32", "r:f32 w:i32", helper(
        "cast_f32_si32", "PUT32({w1}, ((long (*)(float))math_fns.lroundf)({0}))"), LOOP),
    (0x17, "cast.f32.ui32", "r:f32 w:i32", helper(
        "cast_f32_ui32", "PUT32({w1}, ((long long (*)(float))math_fns.llroundf)({0}))"), LOOP),
    (0x18, "bitcast.i32.f32", "r:i32 w:f32", helper("bitcast_i32_f32", "PUT32({w1}, {b0})"),
     LOOP),
    (0x19, "bitcast.f32.i32", "r:f32 w:i32", helper("bitcast_f32_i32", "PUT32({w1}, {b0})"),
     LOOP),
    (0x3A, "cast.f32.si64", "r:f32 w:i64", helper("cast_f32_si64"), 0),
    (0x3B, "cast.f32.ui64", "r:f32 w:i64", helper("cast_f32_ui64"), 0),
    (0x3C, "cast.si64.f32", "r:i64 w:f32", helper("cast_si64_f32"), 0),
    (0x3D, "cast.ui64.f32", "r:i64 w:f32", helper("cast_ui64_f32"), 0),
):
    _row(_opcode, _name, _layout, _form, native=_native)

_opset = EXT_F64
_float_rows("f64", {
    "global.load.f64": 0x00, "global.store.f64": 0x01, "global.load.indirect.f64": 0x02,
    "global.store.indirect.f64": 0x03, "const.f64.zero": 0x04, "const.f64": 0x05,
    "list.get.f64": 0x06, "list.set.f64": 0x07, "select.f64": 0x08, "switch.f64": 0x09,
    "add.f64": 0x0A, "sub.f64": 0x0B, "mul.f64": 0x0C, "div.f64": 0x0D, "rem.f64": 0x0E,
    "fma.f64": 0x0F, "abs.f64": 0x10, "neg.f64": 0x11, "ceil.f64": 0x12, "floor.f64": 0x13,
    "atan.f64": 0x20, "atan2.f64": 0x21, "cos.f64": 0x22, "sin.f64": 0x23, "exp.f64": 0x24,
    "exp2.f64": 0x25, "expm1.f64": 0x26, "log.f64": 0x27, "log10.f64": 0x28,
    "log1p.f64": 0x29, "log2.f64": 0x2A, "pow.f64": 0x2B, "rsqrt.f64": 0x2C, "sqrt.f64": 0x2D,
    "tanh.f64": 0x2E, "erf.f64": 0x2F, "cmp.eq.f64.o": 0x30, "cmp.eq.f64.u": 0x31,
    "cmp.ne.f64.o": 0x32, "cmp.ne.f64.u": 0x33, "cmp.lt.f64.o": 0x34, "cmp.lt.f64.u": 0x35,
    "cmp.lte.f64.o": 0x36, "cmp.lte.f64.u": 0x37, "cmp.nan.f64": 0x38,
    "buffer.load.f64": 0x39, "buffer.store.f64": 0x3A, "buffer.fill.f64": 0x3B,
    "round.f64": 0x3C, "min.f64": 0x3D, "max.f64": 0x3E, "round.f64.even": 0x3F,
})
for _opcode, _name, _layout, _form in (
    (0x14, "trunc.f64.f32", "r:f64 w:f32", f32_arith("{0}")),
    (0x15, "ext.f32.f64", "r:f32 w:f64", value("float({0})")),
    (0x16, "cast.si32.f64", "r:i32 w:f64", value("float({0})")),
    (0x17, "cast.ui32.f64", "r:i32 w:f64", spelled("{1} = float({0} & %s)" % M32)),
    (0x18, "cast.f64.si32", "r:f64 w:i32", helper("cast_f64_si32")),
    (0x19, "cast.f64.ui32", "r:f64 w:i32", helper("cast_f64_ui32")),
    (0x1A, "cast.si64.f64", "r:i64 w:f64", value("float({0})")),
    (0x1B, "cast.ui64.f64", "r:i64 w:f64", spelled("{1} = float({0} & %s)" % M64)),
    (0x1C, "cast.f64.si64", "r:f64 w:i64", helper("cast_f64_si64")),
    (0x1D, "cast.f64.ui64", "r:f64 w:i64", helper("cast_f64_ui64")),
    (0x1E, "bitcast.i64.f64", "r:i64 w:f64", helper("bitcast_i64_f64")),
    (0x1F, "bitcast.f64.i64", "r:f64 w:i64", helper("bitcast_f64_i64")),
):
    _row(_opcode, _name, _layout, _form)
_opset = None

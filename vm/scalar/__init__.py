"""VM functions run natively: integer loops, and VMVX workgroup functions.

The Python translation (`codegen.py`) runs a VM instruction in tens of nanoseconds, which
is CPython's floor; a function that only computes on integers in a loop gains nothing from
being Python. Such a function is re-laid once, at module load, as a word program (see
`scalar.c`) and runs in the C interpreter here, with IREE's register semantics (one bank of
32-bit slots, i64 values in two of them, branch operand lists copied slot by slot).

A function qualifies when every instruction is in `SUPPORTED` (the rows of `optable`
marked `LOOP`: integer constants, arithmetic, bitwise ops, shifts, casts, compares,
select, ctlz/abs/min/max, `br`, `cond_br`, `return`, and the f32 arithmetic, compares,
selects, conversions, bitcasts and C library math), its arguments and results are
i32/i64/f32, and it loops (some branch goes back). Host code runs under the caller's
floating-point state (no denormals-are-zero: the HAL sets that only around dispatches),
as the Python translation computes. A loop-free function runs a handful of instructions, for which crossing into C
costs more than it saves, so it stays Python.

A VMVX workgroup function (`encode_entry`; calling convention `0rrriiiiiiiii_v`: local
memory, constants, the bindings list, then the workgroup id, size and count) qualifies
when every instruction is in `ENTRY_SUPPORTED` (those and the rows marked `ENTRY`): the
integer set plus f32 arithmetic,
compares, selects, conversions and C library math, `vm.buffer` loads, stores, fills,
copies, `length` and `alloc`, rodata and null refs, `list.get.ref` on the bindings,
`discard.refs`, and calls of the `vmvx` operations (`KERNELS`: all of them), which
scalar.c implements accepting and refusing what the Python `vmvx` module does, with the
host's answers (which fused f32 `mmt4d` tiles, which matmul tile sizes) handed over by
it. It then runs as a C dispatch function of the executable ABI
(`WorkgroupEntry`): the HAL's workgroup loop calls it for every workgroup with no Python
in between, and on the task driver from several threads at once. Any other function
stays Python, decided per function at load.

The native run is an accelerator, never a second semantics: where the VM would fail (a
faulting integer division; for workgroup functions also a null ref, an access out of a
buffer's bounds, a store into a read-only buffer, an allocation over the limit, a `vmvx`
operation's refusal), it stops and the Python translation runs the same call again,
which raises the VM's own error. An integer function has no side effects, so running it
twice is safe. A workgroup may have stored before it stopped, so its Python run reads
what the native one left; should that run not fail, the dispatch fails as an internal
error naming the disagreement, never a silent result. Long loops run in slices of
`BRANCH_BUDGET` taken branches, between which Python handles signals, so Ctrl-C still
interrupts a runaway loop; the C code runs without the GIL.

`TINYHAL_VM_NATIVE_LOOPS=0` in the environment keeps every function in Python (the tests
use it to check both paths against IREE).
"""

from __future__ import annotations

import os
import warnings
from array import array
from collections.abc import Callable, Sequence
from typing import NamedTuple

from ...errors import InternalError
from ...hal.native import load_compiled
from .. import isa, optable

_module = load_compiled(__name__ + "._scalar", __name__ + ".build")
_ffi = _module.ffi
_lib = _module.lib


def _warn_if_table_edited() -> None:
    """Warns when the op table is newer than the interpreter built in place beside it (an
    editable install): the interpreter's cases are generated from the table, so an edited
    row runs in C only once rebuilt (else a new op stops the run as a bad opcode)."""
    built = getattr(_module, "__file__", None)
    if not built or os.path.dirname(built) != os.path.dirname(os.path.abspath(__file__)):
        return  # built into the cache, keyed by the table's content
    try:
        stale = os.stat(optable.__file__).st_mtime > os.stat(built).st_mtime + 1.0
    except OSError:
        return
    if stale:
        warnings.warn(f"{_module.__name__} is older than vm/optable.py: rebuild it "
                      "(pip install -e .) to run the edited op table", RuntimeWarning,
                      stacklevel=3)


_warn_if_table_edited()

# The ops the interpreter runs, from the op table's rows (`optable.Op.native`): in integer
# loops, and in workgroup functions (those plus f32, buffer and ref ops)
SUPPORTED: set[str] = set()
ENTRY_SUPPORTED: set[str] = set()
_OPCODES: dict[str, int] = {}  # op -> the interpreter's opcode word

# The `vmvx` operations a workgroup function may call natively, in scalar.c's kernel
# order; a call's arguments are read as the module's import declares them (a
# declaration other than the `vmvx` module's own fails linking, so it never runs)
KERNELS = {f"vmvx.{name}": number for number, name in enumerate(
    [f"{op}.2d.f32" for op in ("add", "sub", "mul", "div")]
    + [f"{op}.2d.i32" for op in ("add", "sub", "mul", "and", "or", "xor", "shl", "shru",
                                 "shrs", "divs", "divu")]
    + [f"{op}.2d.f32" for op in ("abs", "neg", "ceil", "floor", "exp", "log", "rsqrt")]
    + ["ctlz.2d.i32"] + [f"copy.2d.x{bits}" for bits in (8, 16, 32, 64)]
    + ["fill.2d.x32", "mmt4d", "pack", "unpack", "query_tile_sizes.2d"])}
_MAX_KERNEL_ARGUMENTS = 20  # scalar.c's MAX_KERNEL_ARGUMENTS
_MAX_KERNEL_RESULTS = 2
_ARGUMENT_KINDS = {"i": 0, "I": 1, "r": 2}  # cconv type -> the word scalar.c reads it by

EXT_F32_BASE = 0x100  # as build.py numbers the f32 extension set
_FELL_OFF_END = 0xFF  # scalar.c's word after a function's last instruction


def _derive(op: optable.Op) -> None:
    if not op.native:
        return
    _OPCODES[op.name] = op.opcode + (EXT_F32_BASE if op.opset == optable.EXT_F32 else 0)
    ENTRY_SUPPORTED.add(op.name)
    if op.native == optable.LOOP:
        SUPPORTED.add(op.name)


optable.on_row(_derive)
_INTEGER_TYPES = {"i": False, "I": True}  # cconv type -> is i64
_LOOP_TYPES = {**_INTEGER_TYPES, "f": False}  # an integer loop's arguments and results
_BUFFER_TYPES = ("vm.buffer", "variant")  # a `list.get.ref` of these yields the buffer
BRANCH_BUDGET = 1 << 22
_M32 = 0xFFFFFFFF
_WIDE = "i64"


def enabled() -> bool:
    """Whether loaded modules run their integer loops and VMVX workgroup functions
    natively (the default)."""
    return os.environ.get("TINYHAL_VM_NATIVE_LOOPS", "1") != "0"


class ScalarProgram(NamedTuple):
    """One function as a word program: `words` for `tinyhal_scalar_run`, the register
    file it needs (32-bit slots), where each argument goes and how many results return."""

    words: array
    register_count: int
    arguments: tuple[tuple[int, bool], ...]  # (slot, is_i64) per argument
    result_count: int
    float_arguments: tuple[bool, ...] = ()  # per argument: an f32 (passed as its bits)
    float_results: tuple[bool, ...] = ()  # per result: an f32 (returned as its bits)


class EntryProgram(NamedTuple):
    """One workgroup function as a word program for `tinyhal_vmvx_dispatch`: its words
    and the 32-bit slots and ref registers it needs."""

    words: array
    register_count: int
    ref_count: int


def _word(value: int) -> int:
    """An unsigned 32-bit field as the signed word `array('i')` stores."""
    value &= _M32
    return value - (1 << 32) if value >> 31 else value


def encode(instructions: Sequence, arg_types: Sequence[str], result_types: Sequence[str],
           argument_slots: Sequence[int], register_count: int) -> ScalarProgram | None:
    """The word program of one already-verified integer function, or None when it does
    not qualify (see the module docstring)."""
    if any(t not in _LOOP_TYPES for t in (*arg_types, *result_types)):
        return None
    try:
        layout = _Encoder(register_count, SUPPORTED, 0, ()).encode(instructions, result_types)
    except ValueError:  # a register the C side could not address, an op not supported
        return None
    words, loops, _ = layout
    if not loops:
        return None
    arguments = tuple((_slot(raw, _LOOP_TYPES[t], register_count), _LOOP_TYPES[t])
                      for raw, t in zip(argument_slots, arg_types))
    return ScalarProgram(words, register_count, arguments, len(result_types),
                         tuple(t == "f" for t in arg_types),
                         tuple(t == "f" for t in result_types))


ENTRY_CCONV = "0rrriiiiiiiii_v"


def encode_entry(instructions: Sequence, cconv: str, register_count: int,
                 rodata_count: int, type_names: Sequence[str],
                 imports: Sequence[tuple[str, str]] = ()) -> EntryProgram | None:
    """The word program of one already-verified VMVX workgroup function (calling
    convention `ENTRY_CCONV`, whose arguments IREE places in ref registers 0-2 and i32
    slots 0-8), or None when it does not qualify (see the module docstring). `imports`
    are the module's (full name, calling convention) by ordinal."""
    if cconv != ENTRY_CCONV or register_count < 9:
        return None
    try:
        encoder = _Encoder(register_count, ENTRY_SUPPORTED, rodata_count, type_names,
                           imports)
        words, _, ref_count = encoder.encode(instructions, ())
    except ValueError:
        return None
    return EntryProgram(words, register_count, max(ref_count, 3))


def _slot(raw: int, wide: bool, register_count: int) -> int:
    """`raw` as a register slot in range for its width (else ValueError): the program is
    checked here once so the interpreter never checks anything."""
    if raw & isa.REF_BIT or raw + wide >= register_count or (wide and raw & 1):
        raise ValueError(raw)
    return raw


class _Encoder:
    """Lays out one function's instructions as words (see scalar.c), checking every
    register, ordinal and target; ValueError where the function does not qualify."""

    def __init__(self, register_count: int, supported: frozenset, rodata_count: int,
                 type_names: Sequence[str], imports: Sequence[tuple[str, str]] = ()) -> None:
        self.imports = imports
        self.register_count = register_count
        self.supported = supported
        self.rodata_count = rodata_count
        self.type_names = type_names
        self.refs = supported is not SUPPORTED
        self.ref_count = 0

    def ref(self, raw: int) -> int:
        if not self.refs or not raw & isa.REF_BIT:
            raise ValueError(raw)
        index = raw & isa.REF_MASK
        self.ref_count = max(self.ref_count, index + 1)
        return index

    def register(self, raw: int, bank: str) -> int:
        if bank == "ref":
            return self.ref(raw)
        return _slot(raw, bank == _WIDE, self.register_count)

    def remap(self, pairs) -> list[int]:
        words = [len(pairs)]
        for src, dst in pairs:
            if src & isa.REF_BIT:
                words += (2 if src & isa.MOVE_BIT else 1, self.ref(src), self.ref(dst))
            else:
                words += (0, _slot(src, False, self.register_count),
                          _slot(dst, False, self.register_count))
        return words

    def call(self, function: int, arguments, results) -> list[int]:
        """A call of a `vmvx` operation the interpreter has (see `KERNELS`), its argument
        registers read as the operation's calling convention types them."""
        ordinal = function & ~isa.IMPORT_BIT
        if not function & isa.IMPORT_BIT or not 0 <= ordinal < len(self.imports):
            raise ValueError(function)
        name, cconv = self.imports[ordinal]
        kernel = KERNELS.get(name)
        types, _, result_types = cconv[1:].partition("_")
        result_types = result_types.replace("v", "")
        if (kernel is None or len(arguments) != len(types) or len(types) >
                _MAX_KERNEL_ARGUMENTS or len(results) != len(result_types)
                or len(results) > _MAX_KERNEL_RESULTS or not set(types + result_types)
                <= set(_ARGUMENT_KINDS)):
            raise ValueError(function)
        words = [kernel]
        for registers, kinds in ((arguments, types), (results, result_types)):
            words.append(len(registers))
            for raw, kind in zip(registers, kinds):
                bank = "ref" if kind == "r" else _WIDE if kind == "I" else "i32"
                words += (_ARGUMENT_KINDS[kind], self.register(raw, bank))
        return words

    def encode(self, instructions, result_types) -> tuple[array, bool, int]:
        """(words, whether some branch goes back, ref registers used)."""
        words: list[int] = []
        block_words: dict[int, int] = {}  # block pc -> word index of its first instruction
        fixups: list[tuple[int, int]] = []  # (word index, target block pc)
        loops = False
        for ins in instructions:
            name = ins.name
            if name == "block":
                block_words[ins.pc] = len(words)
                continue
            if name not in self.supported:
                raise ValueError(name)
            words.append(_OPCODES[name])
            if name == "return":
                regs = ins.fields[0]
                if len(regs) != len(result_types):
                    raise ValueError(name)
                words.append(len(regs))
                for raw, t in zip(regs, result_types):
                    wide = _LOOP_TYPES[t]
                    words += (_slot(raw, wide, self.register_count), int(wide))
                continue
            if name == "discard.refs":
                regs = ins.fields[0]
                words += (len(regs), *(self.ref(raw) for raw in regs))
                continue
            if name == "call":
                words += self.call(*ins.fields)
                continue
            if name == "list.get.ref" and ins.fields[3] & isa.MOVE_BIT:
                raise ValueError(name)  # moves the binding out of the list: Python's job
            for (code, arg), value in zip(ins.layout, ins.fields):
                if code in ("r", "w"):
                    words.append(self.register(value, arg))
                elif code == "A":
                    words.append(_word(value))
                    if arg == _WIDE:
                        words.append(_word(value >> 32))
                elif code == "B":
                    loops |= value <= ins.pc
                    fixups.append((len(words), value))
                    words.append(0)
                elif code == "O":
                    words += self.remap(value)
                elif code == "D":
                    if not 0 <= value < self.rodata_count:
                        raise ValueError(value)
                    words.append(value)
                elif code == "T":
                    if not 0 <= value < len(self.type_names):
                        raise ValueError(value)
                    words.append(int(self.type_names[value] in _BUFFER_TYPES))
                else:  # pragma: no cover - the supported sets hold no other field kinds
                    raise ValueError(code)
        words.append(_FELL_OFF_END)
        for at, target in fixups:
            if target not in block_words:
                raise ValueError(target)
            words[at] = block_words[target]
        return array("i", words), loops, self.ref_count


def entry(program: ScalarProgram, fallback: Callable) -> Callable:
    """A function with `fallback`'s signature that runs `program` natively; `fallback`
    (the Python translation of the same VM function) runs only where a division faults.
    f32 arguments enter as their bits and f32 results leave as register values."""
    code = _ffi.from_buffer("int32_t[]", program.words)
    run = _lib.tinyhal_scalar_run
    count = program.register_count
    arguments = program.arguments
    results = program.result_count
    budget_ran_out, done = _lib.SCALAR_BUDGET, _lib.SCALAR_DONE
    if any(program.float_arguments) or any(program.float_results):
        from ..numbers import f32_bits, f32_from_bits

        _set_math()
        floats_in, floats_out = program.float_arguments, program.float_results
        trapped = object()
        native = _entry(code, run, count, arguments, results, budget_ran_out, done,
                        lambda *_: trapped)

        def with_floats(*args):
            out = native(*(f32_bits(a) if f else a for f, a in zip(floats_in, args)))
            if out is trapped:
                return fallback(*args)
            if results == 1:
                return f32_from_bits(out) if floats_out[0] else out
            if not results:
                return out
            return tuple(f32_from_bits(v) if f else v for f, v in zip(floats_out, out))

        with_floats.__wrapped__ = fallback
        return with_floats
    call = _entry(code, run, count, arguments, results, budget_ran_out, done, fallback)
    call.__wrapped__ = fallback
    return call


def _entry(code, run, count: int, arguments, results: int, budget_ran_out: int, done: int,
           fallback: Callable) -> Callable:
    """The native call over integer arguments and results (f32s as their bits)."""
    new = _ffi.new

    def call(*args):
        regs = new("uint32_t[]", count)
        for (slot, wide), value in zip(arguments, args):
            regs[slot] = value & _M32
            if wide:
                regs[slot + 1] = (value >> 32) & _M32
        pc = new("uint32_t*")
        out = new("int64_t[]", results or 1)
        status = run(code, regs, pc, BRANCH_BUDGET, out)
        while status == budget_ran_out:
            status = run(code, regs, pc, BRANCH_BUDGET, out)
        if status != done:
            if status == _lib.SCALAR_TRAP:
                return fallback(*args)
            raise InternalError(f"native VM loop stopped with status {status} at word {pc[0]}")
        if results == 1:
            return out[0]
        return tuple(out[0:results]) if results else None

    call.__wrapped__ = fallback
    return call


_MATH_UNARY = ("atan", "cos", "sin", "exp", "exp2", "expm1", "log", "log10", "log1p", "log2",
               "sqrt", "tanh", "erf", "ceil", "floor", "round")  # scalar.h's MATH_* order
_math_set: list[bool] = []


def _set_math() -> None:
    """Hands the interpreter the C library functions the Python translation calls, once."""
    if _math_set:
        return
    from ..ops import f32_libm_address

    math = _ffi.new("tinyhal_scalar_math_t*")
    for i, name in enumerate(_MATH_UNARY):
        math.unary[i] = _ffi.cast("void*", f32_libm_address(name))
    for field, name in (("atan2f", "atan2"), ("powf", "pow"), ("remainderf", "remainder"),
                        ("lroundf", "lround"), ("llroundf", "llround")):
        setattr(math, field, _ffi.cast("void*", f32_libm_address(name)))
    _lib.tinyhal_scalar_set_math(math)
    _math_set.append(True)


class WorkgroupEntry:
    """A VMVX workgroup function as a C dispatch function of the executable ABI.

    `function_address` is the dispatch function (the same for every entry) and
    `environment_address` the `tinyhal_environment_t*` to call it with: the entry's own
    record, from which the dispatch function reads its program. `on_trap` (an address of a
    dispatch function) runs a workgroup again in Python where the native run stops at a
    VM error; between slices of `BRANCH_BUDGET` taken branches Python runs its pending
    signal handlers, and one that raises (Ctrl-C) stops the dispatch after
    `on_interrupt(exception)`. The entry keeps what it points at alive.
    """

    def __init__(self, program: EntryProgram, rodata: Sequence, max_allocation: int,
                 fused_tiles: int, matmul_tiles: Sequence[int], on_trap: int,
                 on_interrupt: Callable[[BaseException], None]) -> None:
        _set_math()

        def stop(exc_type, exc, traceback) -> int:
            on_interrupt(exc)
            return 1

        self._code = _ffi.from_buffer("int32_t[]", program.words)
        self._rodata = [_ffi.from_buffer("uint8_t[]", data) for data in rodata]
        self._rodata_data = _ffi.new("uint8_t*[]", self._rodata or [_ffi.NULL])
        self._rodata_lengths = _ffi.new("uint64_t[]", [len(data) for data in rodata] or [0])
        self._on_budget = _ffi.callback("int(void)", _between_slices, onerror=stop)
        entry = self._entry = _ffi.new("tinyhal_vmvx_entry_t*")
        entry.code = self._code
        entry.register_count = program.register_count
        entry.ref_count = program.ref_count
        entry.rodata_count = len(rodata)
        entry.rodata_data = self._rodata_data
        entry.rodata_lengths = self._rodata_lengths
        entry.max_allocation = max_allocation
        entry.budget = BRANCH_BUDGET
        entry.features = fused_tiles
        entry.tiles = list(matmul_tiles)
        entry.on_trap = _ffi.cast("void*", on_trap)
        entry.on_budget = _ffi.cast("void*", self._on_budget)
        self.environment_address = int(_ffi.cast("uintptr_t", entry))
        self.function_address = int(_ffi.cast("uintptr_t",
                                              _lib.tinyhal_vmvx_dispatch_address()))


def _between_slices() -> int:
    """Called between slices of a workgroup's run: entering Python runs the signal
    handlers that are pending, so Ctrl-C raises here and (through `onerror`) stops it."""
    return 0


__all__ = ["BRANCH_BUDGET", "ENTRY_CCONV", "ENTRY_SUPPORTED", "KERNELS", "SUPPORTED",
           "EntryProgram",
           "ScalarProgram", "WorkgroupEntry", "enabled", "encode", "encode_entry", "entry"]

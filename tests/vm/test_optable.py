"""The op table (`tinyhal.vm.optable`): an op is defined by one row, and the decoder, the
verifier, the data-flow analysis, the Python translation and the C interpreter all take it
from there.

The end-to-end test adds two toy ops in one row each (a ring op and a selection, at core
opcodes IREE leaves unused), patches a compiled loop to use them, and runs it translated
to Python and interpreted by a C interpreter built from the extended table: both agree
with a model of the toy semantics on edge values. It runs in a child process: it extends
the process's tables and loads a C library of its own."""

from __future__ import annotations

import pytest

from support.child import run_child
from support.vm_pairs import I32_EDGES, vm_compile_source
from tinyhal.vm import codegen, isa, optable, regflow, scalar, templates

TOY_LOOP = """
func.func @mix(%n: i32, %a: i32, %b: i32, %c: i32) -> i32 {
  %c0 = arith.constant 0 : i32
  %c1 = arith.constant 1 : i32
  %r = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %a) -> i32 : i32 {
    %x = arith.xori %acc, %b : i32
    %m = arith.maxsi %x, %c : i32
    %k = arith.addi %m, %b : i32
    scf.yield %k : i32
  }
  return %r : i32
}
"""


@pytest.mark.timeout(300)
def test_a_toy_op_in_one_row_is_decoded_verified_translated_and_interpreted_in_c(tmp_path):
    path = vm_compile_source(TOY_LOOP)
    out = run_child(f"""
        import importlib.util, os

        os.environ["TINYHAL_VM_CACHE"] = "off"
        from tinyhal.vm import Context, load_module, optable
        from tinyhal.vm.scalar import build

        # the two rows: everything below follows from them
        optable.extend([
            optable.make(None, 0x90, "toy.xnor.i32", "r:i32 r:i32 w:i32",
                         optable.ring("~({{0}} ^ {{1}})", (0, 1), bitwise=True),
                         native=optable.LOOP),
            optable.make(None, 0x91, "toy.min.i32.s", "r:i32 r:i32 w:i32",
                         optable.pick("{{s1}} < {{s0}}", 1, 0), native=optable.LOOP),
        ])

        data = bytearray(open({path!r}, "rb").read())
        fn = load_module(bytes(data)).functions[0]
        at = bytes(data).find(bytes(fn.bytecode))
        for ins in fn.instructions:  # xor -> toy.xnor, max -> toy.min
            if ins.name in ("xor.i32", "max.i32.s"):
                data[at + ins.pc] = 0x90 if ins.name == "xor.i32" else 0x91

        def wrap(v):
            return (v + 2**31) % 2**32 - 2**31

        def model(n, a, b, c):
            for _ in range(n):
                a = wrap(min(~(a ^ b), c) + b)
            return a

        os.environ["TINYHAL_VM_NATIVE_LOOPS"] = "0"
        python = load_module(bytes(data))
        names = [ins.name for ins in python.functions[0].instructions]
        assert "toy.xnor.i32" in names and "toy.min.i32.s" in names, names
        assert not python.program.native_loops
        context = Context([python])

        os.environ["TINYHAL_VM_NATIVE_LOOPS"] = "1"
        program = load_module(bytes(data)).program.native_loops[0]
        so = build.make_builder("_toy_scalar", rows=optable.rows()).compile(
            tmpdir={str(tmp_path)!r})
        spec = importlib.util.spec_from_file_location("_toy_scalar", so)
        toy = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(toy)
        code = toy.ffi.from_buffer("int32_t[]", program.words)

        def interpreted(*args):
            regs = toy.ffi.new("uint32_t[]", program.register_count)
            for (slot, _wide), value in zip(program.arguments, args):
                regs[slot] = value & 0xFFFFFFFF
            pc = toy.ffi.new("uint32_t*")
            out = toy.ffi.new("int64_t[]", 1)
            status = toy.lib.tinyhal_scalar_run(code, regs, pc, 1 << 22, out)
            assert status == toy.lib.SCALAR_DONE, status
            return out[0]

        checked = 0
        edges = {I32_EDGES!r}
        for n in (0, 1, 2, 5):
            for a in edges[::3]:
                for b in edges[1::4]:
                    for c in edges[2::5]:
                        want = model(n, a, b, c)
                        got = context.invoke("mix", [n, a, b, c]), interpreted(n, a, b, c)
                        assert got == ([want], want), (n, a, b, c, want, got)
                        checked += 1
        print(checked)
    """, timeout=280)
    assert int(out.split()[-1]) > 100


def test_every_row_renders_and_the_derived_tables_agree_with_it():
    rows = optable.rows()
    assert len({(op.opset, op.opcode) for op in rows}) == len(rows)
    for op in rows:
        meaning = optable.meaning(op)
        assert isa.OPSETS[op.opset][op.opcode] == (op.name, op.layout)
        assert (op.name in isa.TERMINATORS) == op.terminator
        assert (op.name in regflow.RING_OPS) == (meaning.ring is not None)
        if meaning.python == optable.HANDWRITTEN:
            assert hasattr(codegen._Gen, "op_" + op.name.replace(".", "_")), op.name
        elif meaning.python is not None:
            assert templates.template(op.name) == meaning.python
        assert (op.name in scalar.ENTRY_SUPPORTED) == bool(op.native)
        assert (op.name in scalar.SUPPORTED) == (op.native == optable.LOOP)
        assert (meaning.c is not None) == bool(op.native), op.name


def test_one_form_gives_both_languages():
    """A form is written once; its Python and C spellings are its renderings."""
    add = optable.meaning(optable.by_name("add.i64"))
    assert add.ring.expr == "{0} + {1}" and add.python is None
    assert add.c == "PUT64(C, U64(A) + U64(B)); NEXT(4);"
    lt = optable.meaning(optable.by_name("cmp.lt.i32.u"))
    assert lt.python == "{2} = 1 if ({0} & 4294967295) < ({1} & 4294967295) else 0"
    assert lt.c == "PUT32(C, (U32(A) < U32(B)) ? 1 : 0); NEXT(4);"
    unordered = optable.meaning(optable.by_name("cmp.lt.f32.u"))
    assert unordered.python == "{2} = 0 if {0} >= {1} else 1"
    assert unordered.c == "PUT32(C, (!(F32(A) >= F32(B))) ? 1 : 0); NEXT(4);"


def test_a_native_row_without_a_c_case_or_a_missing_handwritten_case_is_refused():
    from tinyhal.vm.scalar import build

    no_case = optable.make(None, 0x92, "toy.python.only", "r:i32 w:i32",
                           optable.spelled("{1} = {0}"), native=optable.LOOP)
    with pytest.raises(ValueError, match="no C case"):
        optable.meaning(no_case)
    claimed = optable.make(None, 0x93, "toy.claimed", "r:i32 w:i32",
                           optable.spelled(None, optable.HANDWRITTEN), native=optable.LOOP)
    with pytest.raises(ValueError, match="scalar.c spells its case; it does not"):
        build.generated_source([*optable.rows(), claimed])

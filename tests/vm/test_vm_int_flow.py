"""Integer fast paths of the code generator (vm/regflow.py): fused expressions with
deferred wrapping, constant registers, folded compares, coalesced copies and registers
held unsigned, checked bit for bit against iree.runtime at the wrap boundaries."""

from __future__ import annotations

import itertools
import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.models import VM_LOOP_MLIR
from support.vm_pairs import I32_EDGES, I64_EDGES, vm_compile_source

LIMITS = {"i32": (-(2**31), 2**31 - 1), "i64": (-(2**63), 2**63 - 1)}


def _chain(t: str) -> str:
    return f"""
func.func @chain_{t}(%a: {t}, %b: {t}, %c: {t}, %d: {t}) -> ({t}, {t}, {t}, i1, {t}, {t}) {{
  %m = arith.muli %a, %b : {t}
  %x = arith.addi %m, %c : {t}
  %y = arith.xori %x, %d : {t}
  %z = arith.subi %y, %a : {t}
  %s = arith.shli %z, %b : {t}
  %sr = arith.shrsi %z, %b : {t}
  %su = arith.shrui %y, %c : {t}
  %lt = arith.cmpi slt, %z, %a : {t}
  %q = arith.addi %z, %s : {t}
  %n = arith.xori %q, %m : {t}
  %o = arith.ori %n, %d : {t}
  %w = arith.andi %o, %x : {t}
  %dv = arith.divui %w, %d : {t}
  return %q, %sr, %su, %lt, %w, %dv : {t}, {t}, {t}, i1, {t}, {t}
}}
"""


def _consts(t: str) -> str:
    lo, hi = LIMITS[t]
    return f"""
func.func @consts_{t}(%a: {t}) -> ({t}, {t}, {t}, {t}, {t}, {t}, i1) {{
  %c1 = arith.constant 1 : {t}
  %c7 = arith.constant 7 : {t}
  %cmax = arith.constant {hi} : {t}
  %cmin = arith.constant {lo} : {t}
  %r1 = arith.addi %a, %c1 : {t}
  %r2 = arith.subi %a, %c7 : {t}
  %r3 = arith.addi %a, %cmax : {t}
  %r4 = arith.subi %a, %cmin : {t}
  %r5 = arith.addi %cmin, %a : {t}
  %r6 = arith.muli %a, %c7 : {t}
  %gt = arith.cmpi sgt, %r1, %a : {t}
  return %r1, %r2, %r3, %r4, %r5, %r6, %gt : {t}, {t}, {t}, {t}, {t}, {t}, i1
}}
"""


def _loops(t: str) -> str:
    return f"""
func.func @lcg_{t}(%n: i32, %seed: {t}) -> ({t}, {t}, i1, {t}) {{
  %c0 = arith.constant 0 : i32
  %c1 = arith.constant 1 : i32
  %z = arith.constant 0 : {t}
  %k = arith.constant 1103515245 : {t}
  %inc = arith.constant 12345 : {t}
  %r:3 = scf.while (%i = %c0, %x = %seed, %acc = %seed) : (i32, {t}, {t}) -> (i32, {t}, {t}) {{
    %go = arith.cmpi slt, %i, %n : i32
    scf.condition(%go) %i, %x, %acc : i32, {t}, {t}
  }} do {{
  ^bb0(%i: i32, %x: {t}, %acc: {t}):
    %x1 = arith.muli %x, %k : {t}
    %x2 = arith.addi %x1, %inc : {t}
    %a1 = arith.xori %acc, %x2 : {t}
    %a2 = arith.muli %a1, %a1 : {t}
    %a3 = arith.subi %a2, %x : {t}
    %i1 = arith.addi %i, %c1 : i32
    scf.yield %i1, %x2, %a3 : i32, {t}, {t}
  }}
  %neg = arith.cmpi slt, %r#2, %z : {t}
  %sh = arith.shrsi %r#2, %r#1 : {t}
  return %r#1, %r#2, %neg, %sh : {t}, {t}, i1, {t}
}}

func.func @count_{t}(%n: i32, %start: {t}) -> ({t}, {t}) {{
  %c0 = arith.constant 0 : i32
  %c1 = arith.constant 1 : i32
  %one = arith.constant 1 : {t}
  %r:3 = scf.while (%i = %c0, %up = %start, %down = %start) : (i32, {t}, {t})
      -> (i32, {t}, {t}) {{
    %go = arith.cmpi slt, %i, %n : i32
    scf.condition(%go) %i, %up, %down : i32, {t}, {t}
  }} do {{
  ^bb0(%i: i32, %up: {t}, %down: {t}):
    %u = arith.addi %up, %one : {t}
    %d = arith.subi %down, %one : {t}
    %i1 = arith.addi %i, %c1 : i32
    scf.yield %i1, %u, %d : i32, {t}, {t}
  }}
  return %r#1, %r#2 : {t}, {t}
}}

func.func @upto_{t}(%start: {t}, %n: {t}) -> ({t}, {t}) {{
  %one = arith.constant 1 : {t}
  %r:2 = scf.while (%i = %start, %s = %start) : ({t}, {t}) -> ({t}, {t}) {{
    %go = arith.cmpi slt, %i, %n : {t}
    scf.condition(%go) %i, %s : {t}, {t}
  }} do {{
  ^bb0(%i: {t}, %s: {t}):
    %s1 = arith.xori %s, %i : {t}
    %i1 = arith.addi %i, %one : {t}
    scf.yield %i1, %s1 : {t}, {t}
  }}
  return %r#0, %r#1 : {t}, {t}
}}

func.func @downto_{t}(%start: {t}, %n: {t}) -> ({t}, {t}) {{
  %one = arith.constant 1 : {t}
  %r:2 = scf.while (%i = %start, %s = %start) : ({t}, {t}) -> ({t}, {t}) {{
    %go = arith.cmpi slt, %n, %i : {t}
    scf.condition(%go) %i, %s : {t}, {t}
  }} do {{
  ^bb0(%i: {t}, %s: {t}):
    %s1 = arith.addi %s, %i : {t}
    %i1 = arith.subi %i, %one : {t}
    scf.yield %i1, %s1 : {t}, {t}
  }}
  return %r#0, %r#1 : {t}, {t}
}}

func.func @trip_{t}(%start: i32, %n: i32, %x: {t}) -> (i32, {t}) {{
  %c1 = arith.constant 1 : i32
  %r:2 = scf.while (%i = %start, %acc = %x) : (i32, {t}) -> (i32, {t}) {{
    %go = arith.cmpi slt, %i, %n : i32
    scf.condition(%go) %i, %acc : i32, {t}
  }} do {{
  ^bb0(%i: i32, %acc: {t}):
    %e = {"arith.extsi %i : i32 to i64" if t == "i64" else "arith.addi %i, %i : i32"}
    %m = arith.muli %acc, %e : {t}
    %a = arith.addi %m, %x : {t}
    %i1 = arith.addi %i, %c1 : i32
    scf.yield %i1, %a : i32, {t}
  }}
  return %r#0, %r#1 : i32, {t}
}}

func.func @collatz_{t}(%n: i32, %x0: {t}) -> ({t}, {t}) {{
  %c0 = arith.constant 0 : i32
  %c1 = arith.constant 1 : i32
  %one = arith.constant 1 : {t}
  %three = arith.constant 3 : {t}
  %zero = arith.constant 0 : {t}
  %r:3 = scf.while (%i = %c0, %x = %x0, %s = %zero) : (i32, {t}, {t}) -> (i32, {t}, {t}) {{
    %go = arith.cmpi slt, %i, %n : i32
    scf.condition(%go) %i, %x, %s : i32, {t}, {t}
  }} do {{
  ^bb0(%i: i32, %x: {t}, %s: {t}):
    %odd = arith.andi %x, %one : {t}
    %even = arith.cmpi eq, %odd, %zero : {t}
    %y = scf.if %even -> {t} {{
      %h = arith.shrui %x, %one : {t}
      scf.yield %h : {t}
    }} else {{
      %m = arith.muli %x, %three : {t}
      %p = arith.addi %m, %one : {t}
      scf.yield %p : {t}
    }}
    %s1 = arith.addi %s, %y : {t}
    %i1 = arith.addi %i, %c1 : i32
    scf.yield %i1, %y, %s1 : i32, {t}, {t}
  }}
  return %r#1, %r#2 : {t}, {t}
}}
"""


@pytest.fixture(scope="module")
def flow_path():
    return vm_compile_source("\n".join(f(t) for t in ("i32", "i64")
                                       for f in (_chain, _consts, _loops)))


@pytest.fixture(scope="module")
def bench_loop_path():
    return vm_compile_source(VM_LOOP_MLIR)


EDGES = {"i32": I32_EDGES, "i64": I64_EDGES}


@pytest.mark.parametrize("t", ["i32", "i64"])
def test_fused_chain_edges(vm_pair, flow_path, t):
    p = vm_pair(flow_path)
    edges = EDGES[t]
    for a, b, c in itertools.product(edges[::2], edges[1::2], edges[::3]):
        p.check(f"chain_{t}", a, b, c, 3)
        p.check(f"chain_{t}", b, a, c, -5)


@pytest.mark.parametrize("t", ["i32", "i64"])
def test_constant_operands_wrap_one_sided(vm_pair, flow_path, t):
    p = vm_pair(flow_path)
    lo, hi = LIMITS[t]
    for a in [*EDGES[t], lo, lo + 1, lo + 6, lo + 7, hi, hi - 1, hi - 6, -1, 0]:
        p.check(f"consts_{t}", a)


@pytest.mark.parametrize("t", ["i32", "i64"])
def test_loop_carried_values(vm_pair, flow_path, t, loop_mode):
    p = vm_pair(flow_path)
    lo, hi = LIMITS[t]
    for n in (0, 1, 2, 7, 100):
        for seed in (0, 1, -1, hi, lo, 12345, -987654321):
            p.check(f"lcg_{t}", n, seed)
    for n in (0, 1, 3, 10):
        for start in (hi - 5, hi, lo, lo + 2, 0, -1):
            p.check(f"count_{t}", n, start)
    for start, n in ((hi - 3, hi), (hi, hi), (lo, lo + 2), (-2, 2), (5, -5)):
        p.check(f"upto_{t}", start, n)
        p.check(f"downto_{t}", n, start)
        p.check(f"downto_{t}", start, n)
    for start, n in ((0, 0), (0, 5), (-3, 4), (2**31 - 4, 2**31 - 1), (-(2**31), -(2**31) + 3),
                     (7, 2)):
        for x in (1, -1, hi, lo, 3):
            p.check(f"trip_{t}", start, n, x)
    for n in (0, 5, 60):
        for x0 in (27, hi, lo, -7, hi // 3, 1):
            p.check(f"collatz_{t}", n, x0)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=st.integers(-(2**63), 2**63 - 1), b=st.integers(-(2**63), 2**63 - 1),
       c=st.integers(-(2**63), 2**63 - 1), d=st.integers(-(2**63), 2**63 - 1),
       n=st.integers(0, 40))
def test_random_against_iree(vm_pair, flow_path, loop_mode, a, b, c, d, n):
    p = vm_pair(flow_path)
    d = d or 1
    p.check("chain_i64", a, b, c, d)
    p.check("lcg_i64", n, a)
    p.check("collatz_i64", n, b)
    w = [v % 2**32 - 2**31 for v in (a, b, c, d)]
    w[3] = w[3] or 1
    p.check("chain_i32", *w)
    p.check("lcg_i32", n, w[0])
    p.check("consts_i32", w[1])


def test_bench_loop_shape_and_result(vm_pair, bench_loop_path, loop_mode):
    """The VM-loop benchmark's body is one fused, unsigned-masked expression for the
    accumulator, an unchecked counter increment (guarded by the loop's compare) and the
    compare folded into the branch."""
    p = vm_pair(bench_loop_path)
    for n in (0, 1, 2, 1000, 50_000, 70_000):
        p.check("loop", n)
    source = p.module.program.source
    # the accumulator is carried unreduced through the loop and reduced once after it
    assert "i3 = ((i1 * i1) ^ i3) + i1\n" in source
    assert "i3 &= 4294967295\n" in source
    assert "1 if" not in source  # no compare materialised as 0/1
    assert "2147483647" not in source  # no overflow check left


def _accumulators(t: str) -> str:
    """Counted loops whose carried value wraps many times: some may stay unreduced in the
    loop (add/sub/xor/or/and/not of the accumulator once), others must not (the
    accumulator multiplied, shifted, doubled, compared or copied inside the loop)."""
    loop = """
func.func @{name}_{t}(%n: i32, %a0: {t}, %x: {t}) -> {t} {{
  %c0 = arith.constant 0 : i32
  %c1 = arith.constant 1 : i32
  %k = arith.constant {k} : {t}
  %r:2 = scf.while (%i = %c0, %acc = %k) : (i32, {t}) -> (i32, {t}) {{
    %go = arith.cmpi slt, %i, %n : i32
    scf.condition(%go) %i, %acc : i32, {t}
  }} do {{
  ^bb0(%i: i32, %acc: {t}):
{body}
    %i1 = arith.addi %i, %c1 : i32
    scf.yield %i1, %s : i32, {t}
  }}
  return %r#1 : {t}
}}
"""
    k = "9223372036854775783" if t == "i64" else "2147483629"
    bodies = {
        # stay unreduced
        "sum": "    %p = arith.muli %x, %a0 : {t}\n    %s = arith.addi %acc, %p : {t}",
        "mix": ("    %p = arith.muli %x, %x : {t}\n    %q = arith.xori %acc, %p : {t}\n"
                "    %u = arith.subi %q, %k : {t}\n    %v = arith.ori %u, %x : {t}\n"
                "    %s = arith.andi %v, %k : {t}"),
        "neg": ("    %m = arith.constant -1 : {t}\n    %q = arith.xori %acc, %m : {t}\n"
                "    %s = arith.subi %x, %q : {t}"),
        # must be reduced every trip (or are read where the high bits would show)
        "scale": "    %s = arith.muli %acc, %k : {t}",
        "double": "    %s = arith.addi %acc, %acc : {t}",
        "shift": ("    %one = arith.constant 1 : {t}\n    %q = arith.shli %acc, %one : {t}\n"
                  "    %s = arith.addi %q, %x : {t}"),
        "compare": ("    %big = arith.cmpi ugt, %acc, %x : {t}\n"
                    "    %y = arith.select %big, %x, %k : {t}\n"
                    "    %s = arith.addi %acc, %y : {t}"),
        "divide": ("    %d = arith.ori %x, %k : {t}\n    %q = arith.divui %acc, %d : {t}\n"
                   "    %s = arith.addi %q, %k : {t}"),
    }
    return "".join(loop.format(name=name, t=t, k=k, body=body.format(t=t))
                   for name, body in bodies.items())


ACCUMULATORS = ("sum", "mix", "neg", "scale", "double", "shift", "compare", "divide")


@pytest.fixture(scope="module")
def accumulators_path():
    return vm_compile_source("\n".join(_accumulators(t) for t in ("i32", "i64")))


@pytest.mark.parametrize("t", ["i32", "i64"])
def test_accumulators_carried_unreduced_match_iree(vm_pair, accumulators_path, t, loop_mode):
    p = vm_pair(accumulators_path)
    lo, hi = LIMITS[t]
    for name in ACCUMULATORS:
        for n in (0, 1, 2, 3, 50, 3000):
            for a0, x in ((0, 1), (hi, hi), (lo, -1), (-1, lo), (12345, -987), (hi, 7)):
                p.check(f"{name}_{t}", n, a0, x)
    # Which loops the pinned compiler shapes as counted loops varies; where one is, the
    # linear accumulators are reduced once after it and the others never are.
    functions = re.split(r"^def ", p.module.program.source, flags=re.M)[1:]
    assert len(functions) == 2 * len(ACCUMULATORS)
    offset = 0 if t == "i32" else len(ACCUMULATORS)
    lazy = {name for i, name in enumerate(ACCUMULATORS) if " &= " in functions[offset + i]}
    assert lazy >= {"sum"} and lazy <= {"sum", "mix", "neg"}, lazy


def test_errors_still_name_the_instruction(vm_pair, flow_path):
    from tinyhal.errors import Error

    p = vm_pair(flow_path)
    with pytest.raises(Error, match=r"chain_i32\+[0-9A-F]{8}"):
        p.ours("chain_i32", 3, 4, 5, 0)


_RANDOM_OPS = ["addi", "subi", "muli", "xori", "andi", "ori", "shli", "shrsi", "shrui", "divui",
               "cmp", "if"]


def _random_function(rng: random.Random, name: str, t: str) -> str:
    """A loop over random integer ops: values flow through loop-carried registers,
    branches, compares, shifts and divisions, so every fast path meets the others."""
    count = itertools.count()
    lines = ["  %one = arith.constant 1 : {t}", "  %c0 = arith.constant 0 : i32",
             "  %c1 = arith.constant 1 : i32"]
    lines = [line.format(t=t) for line in lines]
    consts = []
    for c in rng.sample([0, 1, 2, 7, -1, 31, 2**31 - 1, -(2**31), 12345, 1 << 20], 4):
        v = f"%k{next(count)}"
        lines.append(f"  {v} = arith.constant {c} : {t}")
        consts.append(v)

    def ops(pool: list, out: list, nested: bool) -> None:
        for _ in range(rng.randint(2, 8)):
            op = rng.choice(_RANDOM_OPS)
            a, b = rng.choice(pool), rng.choice(pool)
            v = f"%v{next(count)}"
            if op == "cmp":
                c = f"%v{next(count)}"
                pred = rng.choice(["slt", "ult", "eq", "sgt"])
                out.append(f"  {c} = arith.cmpi {pred}, {a}, {b} : {t}")
                out.append(f"  {v} = arith.select {c}, {a}, {rng.choice(pool)} : {t}")
            elif op == "divui":
                d = f"%v{next(count)}"
                out.append(f"  {d} = arith.ori {b}, %one : {t}")
                out.append(f"  {v} = arith.divui {a}, {d} : {t}")
            elif op == "if":
                if nested:
                    continue
                c = f"%v{next(count)}"
                out.append(f"  {c} = arith.cmpi slt, {a}, {b} : {t}")
                out.append(f"  {v} = scf.if {c} -> {t} {{")
                for arm in range(2):
                    inner_pool = list(pool)
                    ops(inner_pool, out, True)
                    out.append(f"    scf.yield {inner_pool[-1]} : {t}")
                    if arm == 0:
                        out.append("  } else {")
                out.append("  }")
            else:
                out.append(f"  {v} = arith.{op} {a}, {b} : {t}")
            pool.append(v)

    pool = ["%a", "%b", "%c", *consts]
    ops(pool, lines, False)
    init = [rng.choice(pool) for _ in range(3)]
    carried = f"i32, {t}, {t}, {t}"
    lines.append(f"  %r:4 = scf.while (%i = %c0, %x = {init[0]}, %y = {init[1]}, "
                 f"%z = {init[2]}) : ({carried}) -> ({carried}) {{")
    lines.append("    %go = arith.cmpi slt, %i, %n : i32")
    lines.append(f"    scf.condition(%go) %i, %x, %y, %z : {carried}")
    lines.append("  } do {")
    lines.append(f"  ^bb0(%i: i32, %x: {t}, %y: {t}, %z: {t}):")
    pool = ["%x", "%y", "%z", *consts]
    ops(pool, lines, False)
    nxt = [rng.choice(pool[-4:] + pool[:3]) for _ in range(3)]
    lines.append("    %i1 = arith.addi %i, %c1 : i32")
    lines.append(f"    scf.yield %i1, {', '.join(nxt)} : {carried}")
    lines.append("  }")
    pool = ["%r#1", "%r#2", "%r#3", *consts]
    ops(pool, lines, False)
    outs = [rng.choice(pool) for _ in range(3)]
    return (f"func.func @{name}(%a: {t}, %b: {t}, %c: {t}, %n: i32) -> ({carried}) {{\n"
            + "\n".join(lines)
            + f"\n  return %r#0, {', '.join(outs)} : {carried}\n}}\n")


def test_random_programs_against_iree(vm_pair, loop_mode):
    rng = random.Random(8)
    functions = [(f"r{i}", rng.choice(["i32", "i64"])) for i in range(16)]
    source = "".join(_random_function(rng, name, t) for name, t in functions)
    p = vm_pair(vm_compile_source(source))
    values = {"i32": [0, 1, -1, 2**31 - 1, -(2**31), 46341, 12345],
              "i64": [0, 1, -1, 2**63 - 1, -(2**63), 3037000500, 12345]}
    for name, t in functions:
        for a, b, c in itertools.islice(itertools.product(values[t], repeat=3), 0, None, 29):
            for n in (0, 1, 5):
                p.check(name, a, b, c, n)

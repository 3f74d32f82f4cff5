"""The fuzzer's seed corpus as a regression test.

Each entry is a mutation of a real module regenerated from its seed by
`support.mutations` (the same code `bench/fuzz_loaders.py` uses), never a stored binary:
past failures (a module name with a NUL byte reached Python's `compile()`; an ELF data
segment with no permissions made reading the library table fault; corrupted machine code
that killed the process before kernel faults were contained) and inputs that reach every
validator the fuzzer found (ELF header, program headers,
dynamic section, relocations, symbols, library table; FlatBuffer tables, strings, vectors,
types; bytecode decoding and verification; HAL argument checks). Each case runs in its own
child process with a timeout, on every driver, and must end in a clean `tinyhal.Error` (a
status other than INTERNAL, with a message that is not a bare Python exception) or run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

# (module, seed, case, mutator, what tinyhal reported when the case was added)
CORPUS = [
    ("tiny", 7, 5903, "fb_offset", "module name not printable (was ValueError: embedded null "
     "character from compile())"),
    ("tiny", 0, 15, "elf_phdr", "segment 3 is not readable (was SIGSEGV reading the library)"),
    ("tiny", 0, 322, "bitflip", "FlatBuffer length prefix out of bounds"),
    ("tiny", 0, 131, "byteset", "unsupported cconv char"),
    ("small_cnn", 0, 2, "delete", "embedded ELF: not an ELF library (bad magic)"),
    ("small_cnn", 0, 245, "elf_bytes", "export table mangled: no export of that name"),
    ("tiny", 0, 72, "elf_bytes", "DT_RELA[11] points outside the image"),
    ("system_elf", 0, 122, "elf_bytes", "export 0 name lies outside the library image"),
    ("small_cnn", 0, 0, "elf_dynamic", "unsupported dynamic tag 0xFFFF"),
    ("system_elf", 0, 21, "elf_dynamic", "DT_JMPREL and its size must come together"),
    ("small_cnn", 0, 3, "elf_header", "section name table index out of range"),
    ("tiny", 0, 11, "elf_header", "unknown ELF version"),
    ("system_elf", 0, 17, "elf_header", "program header 0 has unsupported type"),
    ("small_cnn", 0, 24, "elf_phdr", "missing .dynsym/.dynstr"),
    ("system_elf", 0, 15, "elf_phdr", "segment 0 has more file bytes than memory bytes"),
    ("system_elf", 0, 130, "elf_reloc", "export name pointer moved: no export of that name"),
    ("tiny", 0, 8, "elf_reloc", "unsupported relocation type 64"),
    ("small_cnn", 0, 69, "elf_symbol", "exports no iree_hal_executable_library_query"),
    ("system_elf", 0, 5, "fb_bytes", "debug.functions[0]: vtable offset outside buffer"),
    ("small_cnn", 0, 47, "fb_bytes", "imported_functions[11].0: string is not UTF-8"),
    ("system_elf", 0, 270, "fb_offset", "HAL device not found or unavailable"),
    ("tiny", 0, 97, "fb_offset", "binding slot beyond the binding capacity"),
    ("tiny", 0, 312, "fb_bytes", "no type registered with name '!ha1.device'"),
    ("small_cnn", 0, 165, "insert", "bytecode version mismatch"),
    ("small_cnn", 0, 325, "truncate", "FlatBuffer data is not present"),
    ("tiny", 0, 216, "bitflip", "bytecode data overrun"),
    ("tiny", 0, 344, "fb_bytes", "branch target is not a block"),
    ("system_elf", 0, 95, "byteset", "relocation names a symbol past the table"),
    # corrupted machine code: contained kernel faults (each was a crash)
    ("small_cnn", 0, 196, "splice", "SIGSEGV storing through a zero register (iree-run-module "
     "ran it and printed wrong results)"),
    ("small_cnn", 0, 23, "byteset", "SIGILL in a kernel (crashes iree-run-module too)"),
    ("system_elf", 0, 173, "elf_bytes", "jump to an unrelocated address with a wild stack "
     "pointer: caught on the alternate signal stack (crashes iree-run-module too)"),
    ("tiny", 0, 318, "elf_symbol", "code pointer into the middle of an instruction: SIGILL"),
    ("small_cnn", 7, 1850, "elf_bytes", "a vector store 2 KiB past the kernel's frame smashed "
     "the interpreter's stack (now lands in the stack pad; IREE runs it, with wrong results)"),
]

CHILD = r"""
import json, re, sys
import tinyhal
from tinyhal.errors import StatusCode
from support.mutations import Subject, case_seed, mutate

subject = Subject(**json.loads(sys.argv[1]))
seed, case = int(sys.argv[2]), int(sys.argv[3])
name = subject.name
with open(subject.path, "rb") as f:
    data, description = mutate(f.read(), case_seed(seed, name, case))
python_internals = re.compile(r"\b(IndexError|KeyError|struct\.error|UnicodeDecodeError|"
                              r"TypeError|ValueError|AttributeError|RuntimeError|"
                              r"OverflowError|cannot dereference|Traceback)")
results = []
for driver in ("sync", "task", "emu"):
    module = None
    try:
        module = tinyhal.load(data, device=driver)
        module.invoke(subject.function, *subject.inputs())
        results.append([driver, "ran", ""])
    except tinyhal.Error as exc:
        clean = exc.code != StatusCode.INTERNAL and not python_internals.search(str(exc))
        results.append([driver, "error" if clean else "unclear", str(exc)[:300]])
    finally:
        if module is not None:
            module.close()
print(json.dumps({"mutation": description, "results": results}))
"""


def _run(subject, entry: tuple[str, int, int, str, str]) -> tuple[int, str, str]:
    seed, case = entry[1], entry[2]
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=tests_dir + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(subject.__dict__),
                               str(seed), str(case)],
                              capture_output=True, text=True, timeout=60, env=env)
    except subprocess.TimeoutExpired:
        return -1, "", "timed out after 60 s"
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def outcomes() -> dict:
    from support.mutations import subjects

    by_name = {s.name: s for s in subjects(["tiny", "small_cnn", "system_elf"])}
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = pool.map(lambda e: _run(by_name[e[0]], e), CORPUS)
        return dict(zip([e[:3] for e in CORPUS], results))


@pytest.mark.parametrize("entry", CORPUS, ids=[f"{e[0]}-{e[1]}-{e[2]}-{e[3]}" for e in CORPUS])
def test_corpus_case_is_clean(entry, outcomes) -> None:
    rc, stdout, stderr = outcomes[entry[:3]]
    assert rc == 0, f"child ended with {rc} (negative: signal): {stderr[-1500:]}"
    report = json.loads(stdout.strip().splitlines()[-1])
    for driver, outcome, message in report["results"]:
        assert outcome in ("ran", "error"), (driver, outcome, message, report["mutation"])

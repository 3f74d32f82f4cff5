"""ELF validation: each malformed library, built in code from a real IREE executable, is
rejected by `parse_elf` with DATA_LOSS or INVALID_ARGUMENT naming what was wrong, and no
native loader ever sees it (checked through `Executable` in a child process)."""

from __future__ import annotations

import struct
import subprocess
import sys
from collections.abc import Callable

import pytest

from support.executables import compile_executable
from tinyhal.errors import DataLossError, InvalidArgumentError
from tinyhal.hal import elf
from tinyhal.hal.elf import parse_elf


class Patcher:
    """A mutable copy of a real library with helpers to find and rewrite its tables."""

    def __init__(self, data: bytes) -> None:
        self.data = bytearray(data)
        ehdr = elf.EHDR.unpack_from(self.data, 0)
        self.phoff, self.phnum = ehdr[5], ehdr[10]

    def u(self, fmt: str, at: int, value: int) -> None:
        struct.pack_into(fmt, self.data, at, value)

    def phdr(self, p_type: int, nth: int = 0) -> int:
        found = [self.phoff + i * 56 for i in range(self.phnum)
                 if struct.unpack_from("<I", self.data, self.phoff + i * 56)[0] == p_type]
        return found[nth]

    def file_offset(self, vaddr: int) -> int:
        for i in range(self.phnum):
            p_type, _, off, va, _, filesz, _, _ = elf.PHDR.unpack_from(
                self.data, self.phoff + i * 56)
            if p_type == elf.PT_LOAD and va <= vaddr < va + filesz:
                return off + vaddr - va
        raise AssertionError(vaddr)

    def dyn_start(self) -> int:
        vaddr = struct.unpack_from("<Q", self.data, self.phdr(elf.PT_DYNAMIC) + 16)[0]
        return self.file_offset(vaddr)

    def dyn(self, tag: int) -> int:
        """File offset of the dynamic entry with `tag`."""
        at = self.dyn_start()
        while True:
            t = struct.unpack_from("<q", self.data, at)[0]
            if t == tag:
                return at
            assert t != 0, tag
            at += 16

    def dyn_value(self, tag: int) -> int:
        return struct.unpack_from("<Q", self.data, self.dyn(tag) + 8)[0]

    def rela(self, index: int = 0) -> int:
        return self.file_offset(self.dyn_value(elf.DT_RELA)) + 24 * index

    def sym(self, index: int) -> int:
        return self.file_offset(self.dyn_value(elf.DT_SYMTAB)) + 24 * index


def _segments(p: Patcher) -> list[int]:
    return [p.phoff + i * 56 for i in range(p.phnum)
            if struct.unpack_from("<I", p.data, p.phoff + i * 56)[0] == elf.PT_LOAD]


def _hash_loop(p: Patcher) -> None:
    at = p.file_offset(p.dyn_value(elf.DT_HASH))
    nbucket, nchain = struct.unpack_from("<II", p.data, at)
    chain1 = at + 8 + 4 * nbucket + 4 * 1
    p.u("<I", chain1, 1)


def _no_hash(p: Patcher) -> None:
    p.u("<q", p.dyn(elf.DT_HASH), elf.DT_BIND_NOW)
    try:
        p.u("<q", p.dyn(elf.DT_GNU_HASH), elf.DT_FLAGS)
    except AssertionError:
        pass


# (id, mutation, expected error, message fragment)
CASES: list[tuple[str, Callable[[Patcher], None], type, str]] = [
    ("bad-magic", lambda p: p.u("<B", 0, 0), InvalidArgumentError, "bad magic"),
    ("truncated", lambda p: p.data.__delitem__(slice(40, None)), DataLossError, "truncated"),
    ("32-bit", lambda p: p.u("<B", 4, 1), InvalidArgumentError, "64-bit"),
    ("big-endian", lambda p: p.u("<B", 5, 2), InvalidArgumentError, "little-endian"),
    ("e_version", lambda p: p.u("<I", 20, 2), DataLossError, "version"),
    ("ident-padding", lambda p: p.u("<B", 12, 1), InvalidArgumentError, "padding"),
    ("machine", lambda p: p.u("<H", 18, 183), InvalidArgumentError, "machine 183"),
    ("not-shared-object", lambda p: p.u("<H", 16, 2), InvalidArgumentError, "shared object"),
    ("phentsize", lambda p: p.u("<H", 54, 32), DataLossError, "header sizes"),
    ("shentsize", lambda p: p.u("<H", 58, 40), DataLossError, "header sizes"),
    ("phdrs-past-end", lambda p: p.u("<Q", 32, len(p.data) - 8), DataLossError,
     "program header table"),
    ("no-phdrs", lambda p: p.u("<H", 56, 0), DataLossError, "program header table"),
    ("shdrs-past-end", lambda p: p.u("<Q", 40, len(p.data)), DataLossError,
     "section header table"),
    ("shstrndx", lambda p: p.u("<H", 62, 999), DataLossError, "section name table"),
    ("segment-past-end", lambda p: p.u("<Q", _segments(p)[1] + 32, 1 << 20), DataLossError,
     "runs past the end"),
    ("filesz-over-memsz", lambda p: p.u("<Q", _segments(p)[0] + 40, 1), DataLossError,
     "more file bytes"),
    ("write-exec", lambda p: p.u("<I", _segments(p)[1] + 4, 7), InvalidArgumentError,
     "writable and executable"),
    ("unreadable", lambda p: p.u("<I", _segments(p)[2] + 4, 0), InvalidArgumentError,
     "not readable"),
    ("misaligned", lambda p: p.u("<Q", _segments(p)[1] + 16,
                                 struct.unpack_from("<Q", p.data, _segments(p)[1] + 16)[0] + 8),
     DataLossError, "modulo its alignment"),
    ("align-not-power-of-two", lambda p: p.u("<Q", _segments(p)[1] + 48, 0x1800),
     DataLossError, "power of two"),
    ("overlap", lambda p: p.u("<Q", _segments(p)[0] + 40, struct.unpack_from(
        "<Q", p.data, _segments(p)[1] + 16)[0] + 16), DataLossError, "overlaps"),
    ("huge-vaddr", lambda p: p.u("<Q", _segments(p)[2] + 16, 1 << 40), DataLossError,
     "beyond"),
    ("tls-segment", lambda p: p.u("<I", p.phdr(elf.PT_GNU_STACK), elf.PT_TLS),
     InvalidArgumentError, "unsupported type"),
    ("exec-stack", lambda p: p.u("<I", p.phdr(elf.PT_GNU_STACK) + 4, 7), InvalidArgumentError,
     "executable stack"),
    ("no-dynamic", lambda p: p.u("<I", p.phdr(elf.PT_DYNAMIC), elf.PT_NULL), DataLossError,
     "no PT_DYNAMIC"),
    ("dynamic-outside", lambda p: p.u("<Q", p.phdr(elf.PT_DYNAMIC) + 16, 0x7FFF0),
     DataLossError, "not inside a loaded segment"),
    ("syment", lambda p: p.u("<Q", p.dyn(elf.DT_SYMENT) + 8, 16), DataLossError, "DT_SYMENT"),
    ("relaent", lambda p: p.u("<Q", p.dyn(elf.DT_RELAENT) + 8, 16), DataLossError,
     "DT_RELAENT"),
    ("no-strtab", lambda p: p.u("<q", p.dyn(elf.DT_STRTAB), elf.DT_BIND_NOW), DataLossError,
     "no DT_STRTAB"),
    ("no-hash", _no_hash, DataLossError, "DT_HASH"),
    ("strtab-outside", lambda p: p.u("<Q", p.dyn(elf.DT_STRTAB) + 8, 0x7FFF0), DataLossError,
     ".dynstr"),
    ("strsz-huge", lambda p: p.u("<Q", p.dyn(elf.DT_STRSZ) + 8, 1 << 40), DataLossError,
     "DT_STRSZ"),
    ("symtab-outside", lambda p: p.u("<Q", p.dyn(elf.DT_SYMTAB) + 8, 0x7FFF0), DataLossError,
     ".dynsym"),
    ("rela-outside", lambda p: p.u("<Q", p.dyn(elf.DT_RELA) + 8, 0x7FFF0), DataLossError,
     "DT_RELA"),
    ("relasz-partial", lambda p: p.u("<Q", p.dyn(elf.DT_RELASZ) + 8,
                                     p.dyn_value(elf.DT_RELASZ) - 5), DataLossError,
     "whole number"),
    ("textrel-tag", lambda p: p.u("<q", p.dyn(elf.DT_RELACOUNT), 22), InvalidArgumentError,
     "unsupported dynamic tag"),
    ("duplicate-tag", lambda p: p.u("<q", p.dyn(elf.DT_RELACOUNT), elf.DT_SYMENT),
     DataLossError, "twice"),
    ("no-null", lambda p: p.u("<Q", p.phdr(elf.PT_DYNAMIC) + 32,
                              p.dyn(elf.DT_NULL) - p.dyn_start()), DataLossError, "DT_NULL"),
    ("needed-not-system", lambda p: p.u("<q", p.dyn(elf.DT_RELACOUNT), elf.DT_NEEDED),
     InvalidArgumentError, "needs library"),
    ("pltrel-rel", lambda p: (p.u("<q", p.dyn(elf.DT_RELACOUNT), elf.DT_PLTREL),
                              p.u("<Q", p.dyn(elf.DT_PLTREL) + 8, elf.DT_REL)),
     InvalidArgumentError, "DT_PLTREL"),
    ("hash-loop", _hash_loop, DataLossError, "loops"),
    ("reloc-type-irelative", lambda p: p.u("<I", p.rela(0) + 8, 37), InvalidArgumentError,
     "unsupported relocation type 37"),
    ("reloc-type-copy", lambda p: p.u("<I", p.rela(0) + 8, 5), InvalidArgumentError,
     "unsupported relocation type 5"),
    ("reloc-target-outside", lambda p: p.u("<Q", p.rela(0), 1 << 29), DataLossError,
     "outside every loaded segment"),
    ("reloc-addend-outside", lambda p: p.u("<q", p.rela(0) + 16, -4096), DataLossError,
     "points outside the image"),
    ("reloc-symbol-out-of-range", lambda p: (p.u("<I", p.rela(0) + 8, 1),
                                             p.u("<I", p.rela(0) + 12, 99)),
     DataLossError, "names symbol 99"),
    ("symbol-name-outside", lambda p: p.u("<I", p.sym(1), 1 << 20), DataLossError,
     "outside .dynstr"),
    ("symbol-section", lambda p: p.u("<H", p.sym(1) + 6, 0x7000), DataLossError,
     "section index"),
    ("symbol-value-outside", lambda p: p.u("<Q", p.sym(1) + 8, 1 << 29), DataLossError,
     "outside the image"),
    ("query-not-in-code", lambda p: p.u("<Q", p.sym(1) + 8, 0x10), DataLossError,
     "not in an executable segment"),
    ("no-query-symbol", lambda p: p.u("<I", p.sym(1), 0), InvalidArgumentError,
     "iree_hal_executable_library_query"),
    ("query-undefined", lambda p: p.u("<H", p.sym(1) + 6, 0), InvalidArgumentError,
     "iree_hal_executable_library_query"),
]


@pytest.fixture(scope="module", params=["embedded", "system"])
def library(request) -> bytes:
    return compile_executable("elementwise_3d", embedded=request.param == "embedded")


def malformed(data: bytes, mutation: Callable[[Patcher], None]) -> bytes:
    p = Patcher(data)
    mutation(p)
    return bytes(p.data)


def test_real_libraries_pass(library: bytes) -> None:
    lib = parse_elf(library, "real")
    assert lib.self_contained and lib.query_value
    assert all(r.type == elf.R_X86_64_RELATIVE for r in lib.relocations)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_rejected(library: bytes, case) -> None:
    name, mutation, error, fragment = case
    try:
        data = malformed(library, mutation)
    except (AssertionError, KeyError, IndexError):
        pytest.skip("the table this case edits is absent in this flavour")
    with pytest.raises(error, match=fragment) as info:
        parse_elf(data, f"executable {name!r}")
    assert f"executable {name!r}" in str(info.value)


def test_executable_never_loads_malformed_libraries(tmp_path) -> None:
    """Every case through `Executable` (validation, then the native loaders) in a child."""
    library_paths = []
    for flavour in ("embedded", "system"):
        data = compile_executable("elementwise_3d", embedded=flavour == "embedded")
        for name, mutation, _, _ in CASES:
            try:
                bad = malformed(data, mutation)
            except (AssertionError, KeyError, IndexError, struct.error):
                continue
            path = tmp_path / f"{flavour}-{name}.so"
            path.write_bytes(bad)
            library_paths.append(str(path))
    script = (
        "import sys\n"
        "from tinyhal.errors import DataLossError, InvalidArgumentError\n"
        "from tinyhal.hal.executable import Executable\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        Executable(open(path, 'rb').read(), path)\n"
        "    except (DataLossError, InvalidArgumentError):\n"
        "        continue\n"
        "    print('LOADED', path)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, *library_paths],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "LOADED" not in proc.stdout, proc.stdout


def test_iree_executables_bypass_the_dynamic_loader(library: bytes) -> None:
    """IREE's executables are mapped by tinyhal's own loader: no memfd library appears in
    the process's mappings (dlopen would map one), and dispatching through it works."""
    from tinyhal.hal.executable import Executable

    executable = Executable(library, "own-loader-check")
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
        assert "tinyhal-own-loader-check" not in maps
        assert executable.export_names
    finally:
        executable.close()

"""ELF shared objects: full validation before any loader sees them, and a loader of our own.

`parse_elf(data, what)` checks an executable library the way a careful loader would before
mapping it: the header, every program header (bounds, alignment, ordering, overlaps, a
sane address range, no writable+executable segment), the dynamic section (only known
tags, required entries present, entry sizes right, every table and string inside a loaded
segment, hash chains that end), every relocation (a supported type, a target inside the
image, a symbol that exists) and every dynamic symbol (names inside `.dynstr`, values
inside the image), and finds `iree_hal_executable_library_query` in an executable segment.
It rejects at least everything IREE's embedded-ELF loader rejects
(`runtime/src/iree/hal/local/elf/`), as `DataLossError` (malformed, out of bounds) or
`InvalidArgumentError` (well formed but not something tinyhal loads), each naming `what`.

`map_image(elf, data)` loads a self-contained library (no `DT_NEEDED`, no undefined
symbols, no initializers) the way IREE's loader does: anonymous pages, PT_LOAD segments
copied in, relocations applied, then each page protected as its segment asks, so glibc's
dynamic loader never reads untrusted bytes. Libraries that need more (host kernels built
by a C compiler) go to `dlopen`, but only after the same validation.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
from collections.abc import Callable
from typing import NamedTuple

from ..errors import DataLossError, InternalError, InvalidArgumentError, ResourceExhaustedError

QUERY_SYMBOL = "iree_hal_executable_library_query"

EM_X86_64 = 62
EM_AARCH64 = 183
HOST_MACHINE = {"x86_64": EM_X86_64, "AMD64": EM_X86_64, "aarch64": EM_AARCH64,
                "arm64": EM_AARCH64}.get(os.uname().machine)

PT_NULL, PT_LOAD, PT_DYNAMIC, PT_INTERP, PT_NOTE, PT_SHLIB, PT_PHDR, PT_TLS = range(8)
PT_GNU_EH_FRAME = 0x6474E550
PT_GNU_STACK = 0x6474E551
PT_GNU_RELRO = 0x6474E552
PT_GNU_PROPERTY = 0x6474E553
PF_X, PF_W, PF_R = 1, 2, 4

DT_NULL, DT_NEEDED, DT_PLTRELSZ, DT_PLTGOT, DT_HASH, DT_STRTAB, DT_SYMTAB = range(7)
DT_RELA, DT_RELASZ, DT_RELAENT, DT_STRSZ, DT_SYMENT, DT_INIT, DT_FINI = range(7, 14)
DT_SONAME, DT_REL, DT_RELSZ, DT_RELENT, DT_PLTREL = 14, 17, 18, 19, 20
DT_JMPREL, DT_BIND_NOW, DT_INIT_ARRAY, DT_FINI_ARRAY = 23, 24, 25, 26
DT_INIT_ARRAYSZ, DT_FINI_ARRAYSZ, DT_RUNPATH, DT_FLAGS = 27, 28, 29, 30
DT_GNU_HASH = 0x6FFFFEF5
DT_RELACOUNT = 0x6FFFFFF9
DT_FLAGS_1 = 0x6FFFFFFB
DT_VERSYM = 0x6FFFFFF0
DT_VERDEF, DT_VERDEFNUM, DT_VERNEED, DT_VERNEEDNUM = 0x6FFFFFFC, 0x6FFFFFFD, 0x6FFFFFFE, 0x6FFFFFFF

# Tags a library may carry; anything else (DT_REL, DT_TEXTREL, DT_RPATH, DT_RELR, symbol
# versioning, DT_DEBUG, ...) is rejected rather than handed to a loader that would act on it.
ALLOWED_DYNAMIC_TAGS = frozenset({
    DT_NULL, DT_NEEDED, DT_PLTRELSZ, DT_PLTGOT, DT_HASH, DT_STRTAB, DT_SYMTAB, DT_RELA,
    DT_RELASZ, DT_RELAENT, DT_STRSZ, DT_SYMENT, DT_INIT, DT_FINI, DT_SONAME, DT_PLTREL,
    DT_JMPREL, DT_BIND_NOW, DT_INIT_ARRAY, DT_FINI_ARRAY, DT_INIT_ARRAYSZ, DT_FINI_ARRAYSZ,
    DT_RUNPATH, DT_FLAGS, DT_GNU_HASH, DT_RELACOUNT, DT_FLAGS_1, DT_VERSYM, DT_VERDEF,
    DT_VERDEFNUM, DT_VERNEED, DT_VERNEEDNUM,
})
ALLOWED_SEGMENT_TYPES = frozenset({
    PT_NULL, PT_LOAD, PT_DYNAMIC, PT_NOTE, PT_PHDR, PT_GNU_EH_FRAME, PT_GNU_STACK,
    PT_GNU_RELRO, PT_GNU_PROPERTY,
})
# Libraries a system ELF may ask the dynamic loader for.
ALLOWED_NEEDED = frozenset({
    "libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
    "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1",
})

R_X86_64_NONE, R_X86_64_64, R_X86_64_PC32 = 0, 1, 2
R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT, R_X86_64_RELATIVE = 6, 7, 8
R_X86_64_32, R_X86_64_32S = 10, 11
# Relocation types and the bytes each writes (the subset of IREE's x86_64 loader that a
# shared object uses; R_X86_64_COPY has no meaning in a library and is refused).
RELOCATION_WIDTH = {
    R_X86_64_NONE: 0, R_X86_64_64: 8, R_X86_64_PC32: 4, R_X86_64_GLOB_DAT: 8,
    R_X86_64_JUMP_SLOT: 8, R_X86_64_RELATIVE: 8, R_X86_64_32: 4, R_X86_64_32S: 4,
}
RELOCATION_NAMES = {
    0: "NONE", 1: "64", 2: "PC32", 6: "GLOB_DAT", 7: "JUMP_SLOT", 8: "RELATIVE", 10: "32",
    11: "32S",
}

SHN_UNDEF, SHN_LORESERVE, SHN_ABS, SHN_COMMON = 0, 0xFF00, 0xFFF1, 0xFFF2
STB_GLOBAL, STB_WEAK = 1, 2

EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
PHDR = struct.Struct("<IIQQQQQQ")
SHDR = struct.Struct("<IIQQQQIIQQ")
DYN = struct.Struct("<qQ")
SYM = struct.Struct("<IBBHQQ")
RELA = struct.Struct("<QQq")

MAX_IMAGE_SIZE = 1 << 30
MAX_PROGRAM_HEADERS = 256
MAX_DYNAMIC_ENTRIES = 4096
MAX_SYMBOLS = 1 << 20
MAX_RELOCATIONS = 1 << 22
PAGE_SIZE = mmap.PAGESIZE


class Segment(NamedTuple):
    """One PT_LOAD segment. (The ELF's records are NamedTuples: they define several
    times faster than frozen dataclasses, and every start-up defines them.)"""

    vaddr: int
    memsz: int
    offset: int
    filesz: int
    flags: int

    @property
    def end(self) -> int:
        return self.vaddr + self.memsz


class Relocation(NamedTuple):
    offset: int
    type: int
    symbol: int
    addend: int


class Symbol(NamedTuple):
    name: str
    value: int
    info: int
    section: int


class ElfLibrary:
    """A validated executable library: what a loader needs, nothing it must re-check.
    (A plain class: defined at every start-up, which a dataclass makes slower.)"""

    __slots__ = ("what", "segments", "relro", "relocations", "symbols", "needed",
                 "query_value", "has_gnu_hash", "has_initializers", "vaddr_min",
                 "vaddr_max", "notes")

    def __init__(self, what: str, segments: list[Segment], relro: list[tuple[int, int]],
                 relocations: list[Relocation], symbols: list[Symbol], needed: list[str],
                 query_value: int, has_gnu_hash: bool, has_initializers: bool,
                 vaddr_min: int = 0, vaddr_max: int = 0, notes: list[str] | None = None
                 ) -> None:
        self.what = what
        self.segments = segments
        self.relro = relro
        self.relocations = relocations
        self.symbols = symbols
        self.needed = needed
        self.query_value = query_value
        self.has_gnu_hash = has_gnu_hash
        self.has_initializers = has_initializers
        self.vaddr_min = vaddr_min
        self.vaddr_max = vaddr_max
        self.notes: list[str] = [] if notes is None else notes

    @property
    def is_system(self) -> bool:
        """Whether a system linker made it (needs libraries or carries a GNU hash table)."""
        return bool(self.needed) or self.has_gnu_hash

    @property
    def self_contained(self) -> bool:
        """Whether `map_image` can load it: no imports, no initializers."""
        return (not self.needed and not self.has_initializers
                and all(s.section != SHN_UNDEF for s in self.symbols[1:]))

    def segment_at(self, vaddr: int, size: int = 1) -> Segment | None:
        for seg in self.segments:
            if seg.vaddr <= vaddr and vaddr + size <= seg.end:
                return seg
        return None


def _bad(what: str, message: str) -> DataLossError:
    return DataLossError(f"{what}: malformed ELF: {message}")


def _unsupported(what: str, message: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"{what}: {message}")


def parse_elf(data: bytes, what: str = "executable") -> ElfLibrary:
    """Validates `data` as a loadable executable library; see the module docstring."""
    size = len(data)
    if size < 4 or data[:4] != b"\x7fELF":
        raise InvalidArgumentError(f"{what}: not an ELF library (bad magic)")
    if size < EHDR.size:
        raise _bad(what, f"truncated: {size} bytes, the header needs {EHDR.size}")
    (ident, e_type, e_machine, e_version, _entry, e_phoff, e_shoff, _flags, e_ehsize,
     e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx) = EHDR.unpack_from(data, 0)
    if ident[4] != 2:
        raise _unsupported(what, f"not a 64-bit ELF (class {ident[4]})")
    if ident[5] != 1:
        raise _unsupported(what, f"not a little-endian ELF (data encoding {ident[5]})")
    if ident[6] != 1 or e_version != 1:
        raise _bad(what, f"unknown ELF version ({ident[6]}, {e_version})")
    if ident[7] not in (0, 3) or ident[8] != 0 or any(ident[9:]):
        raise _unsupported(what, "unsupported OS ABI or non-zero identification padding")
    if e_machine != HOST_MACHINE:
        raise _unsupported(
            what, f"built for machine {e_machine}, this host is {os.uname().machine}")
    if e_type != 3:
        raise _unsupported(what, f"not a shared object (e_type={e_type})")
    if e_ehsize != EHDR.size or e_phentsize != PHDR.size or e_shentsize != SHDR.size:
        raise _bad(what, f"header sizes ({e_ehsize}, {e_phentsize}, {e_shentsize}) are not "
                         f"({EHDR.size}, {PHDR.size}, {SHDR.size})")
    if e_phoff == 0 or e_phnum == 0 or e_phnum > MAX_PROGRAM_HEADERS or (
            e_phoff + e_phnum * PHDR.size > size):
        raise _bad(what, f"program header table ({e_phnum} at {e_phoff}) is outside the "
                         f"file ({size} bytes)")
    if e_shoff == 0 or e_shnum == 0 or e_shoff + e_shnum * SHDR.size > size:
        raise _bad(what, f"section header table ({e_shnum} at {e_shoff}) is outside the "
                         f"file ({size} bytes)")
    if e_shstrndx >= e_shnum:
        raise _bad(what, f"section name table index {e_shstrndx} >= {e_shnum} sections")

    headers = [PHDR.unpack_from(data, e_phoff + i * PHDR.size) for i in range(e_phnum)]
    segments: list[Segment] = []
    others: list[tuple] = []
    for i, (p_type, p_flags, p_offset, p_vaddr, _paddr, p_filesz, p_memsz, p_align) in (
            enumerate(headers)):
        if p_type not in ALLOWED_SEGMENT_TYPES:
            raise _unsupported(what, f"program header {i} has unsupported type 0x{p_type:X}")
        if p_type == PT_GNU_STACK:
            if p_flags & PF_X:
                raise _unsupported(what, "asks for an executable stack")
            continue
        if p_type == PT_NULL:
            continue
        if p_filesz > size or p_offset > size - p_filesz:
            raise _bad(what, f"segment {i} (file bytes {p_offset}+{p_filesz}) runs past the "
                             f"end of the file ({size} bytes)")
        if p_filesz > p_memsz:
            raise _bad(what, f"segment {i} has more file bytes ({p_filesz}) than memory "
                             f"bytes ({p_memsz})")
        if p_vaddr > MAX_IMAGE_SIZE or p_memsz > MAX_IMAGE_SIZE - p_vaddr:
            raise _bad(what, f"segment {i} (address 0x{p_vaddr:X}+0x{p_memsz:X}) lies "
                             f"beyond {MAX_IMAGE_SIZE >> 20} MiB")
        if p_align & (p_align - 1):
            raise _bad(what, f"segment {i} alignment {p_align} is not a power of two")
        if p_type == PT_LOAD:
            if p_align >= PAGE_SIZE and (p_vaddr - p_offset) % p_align:
                raise _bad(what, f"segment {i} address 0x{p_vaddr:X} and file offset "
                                 f"0x{p_offset:X} disagree modulo its alignment {p_align}")
            if p_flags & PF_W and p_flags & PF_X:
                raise _unsupported(what, f"segment {i} is both writable and executable")
            if not p_flags & PF_R:
                raise _unsupported(what, f"segment {i} is not readable (flags {p_flags})")
            if p_memsz == 0:
                continue
            if segments and p_vaddr < segments[-1].end:
                raise _bad(what, f"segment {i} at 0x{p_vaddr:X} overlaps or precedes the "
                                 f"previous one (ending 0x{segments[-1].end:X})")
            segments.append(Segment(p_vaddr, p_memsz, p_offset, p_filesz, p_flags))
        else:
            others.append((i, p_type, p_vaddr, p_memsz, p_filesz, p_align))
    if not segments:
        raise _bad(what, "no loadable segment")
    _check_page_protections(segments, what)

    lib = ElfLibrary(what, segments, [], [], [], [], 0, False, False)
    lib.vaddr_min = segments[0].vaddr & ~(PAGE_SIZE - 1)
    lib.vaddr_max = segments[-1].end

    def file_bytes(vaddr: int, length: int, name: str) -> memoryview:
        """`length` bytes at `vaddr`, which must lie in one segment's file-backed part."""
        for seg in segments:
            if seg.vaddr <= vaddr and length <= seg.filesz and vaddr - seg.vaddr <= (
                    seg.filesz - length):
                start = seg.offset + vaddr - seg.vaddr
                return memoryview(data)[start : start + length]
        raise _bad(what, f"{name} (0x{vaddr:X}+{length}) is not inside a loaded segment")

    dynamic = None
    for i, p_type, p_vaddr, p_memsz, p_filesz, p_align in others:
        if p_type in (PT_DYNAMIC, PT_NOTE, PT_GNU_PROPERTY, PT_GNU_EH_FRAME, PT_PHDR):
            file_bytes(p_vaddr, p_filesz, f"segment {i}")
        elif p_type == PT_GNU_RELRO:
            if p_memsz and lib.segment_at(p_vaddr, p_memsz) is None:
                raise _bad(what, f"RELRO range 0x{p_vaddr:X}+0x{p_memsz:X} is not inside a "
                                 "loaded segment")
            lib.relro.append((p_vaddr, p_memsz))
        if p_type in (PT_NOTE, PT_GNU_PROPERTY):
            _check_notes(file_bytes(p_vaddr, p_filesz, "notes"), p_align, what)
        if p_type == PT_DYNAMIC:
            if dynamic is not None:
                raise _bad(what, "more than one PT_DYNAMIC segment")
            dynamic = (p_vaddr, p_filesz)
    if dynamic is None or dynamic[1] < DYN.size:
        raise _bad(what, "no PT_DYNAMIC segment")
    _parse_dynamic(lib, file_bytes, dynamic, data, e_shoff, e_shnum)
    return lib


def _check_page_protections(segments: list[Segment], what: str) -> None:
    """Segments sharing a page must not make it writable and executable at once."""
    pages: dict[int, int] = {}
    for seg in segments:
        first = seg.vaddr // PAGE_SIZE
        last = (seg.end - 1) // PAGE_SIZE
        for page in (first, last):
            flags = pages.get(page, 0) | seg.flags
            if flags & PF_W and flags & PF_X:
                raise _unsupported(what, f"page 0x{page * PAGE_SIZE:X} would be both "
                                         "writable and executable")
            pages[page] = flags


def _check_notes(notes: memoryview, align: int, what: str) -> None:
    pad = 8 if align == 8 else 4
    pos = 0
    while pos < len(notes):
        if len(notes) - pos < 12:
            raise _bad(what, "truncated note header")
        namesz, descsz, _ = struct.unpack_from("<III", notes, pos)
        pos += 12
        pos += (namesz + pad - 1) // pad * pad
        pos += (descsz + pad - 1) // pad * pad
        if pos > len(notes):
            raise _bad(what, "note runs past the end of its segment")


def _parse_dynamic(lib: ElfLibrary, file_bytes: Callable[[int, int, str], memoryview],
                   dynamic: tuple[int, int], data: bytes, e_shoff: int, e_shnum: int) -> None:
    what = lib.what
    dyn_vaddr, dyn_size = dynamic
    count = min(dyn_size // DYN.size, MAX_DYNAMIC_ENTRIES)
    raw = file_bytes(dyn_vaddr, count * DYN.size, "the dynamic section")
    tags: dict[int, int] = {}
    needed_offsets: list[int] = []
    string_offsets: list[tuple[str, int]] = []
    for i in range(count):
        tag, value = DYN.unpack_from(raw, i * DYN.size)
        if tag == DT_NULL:
            break
        if tag not in ALLOWED_DYNAMIC_TAGS:
            raise _unsupported(what, f"unsupported dynamic tag 0x{tag & (2**64 - 1):X}")
        if tag == DT_NEEDED:
            needed_offsets.append(value)
            continue
        if tag in (DT_SONAME, DT_RUNPATH):
            string_offsets.append(("DT_SONAME" if tag == DT_SONAME else "DT_RUNPATH", value))
        if tag in tags:
            raise _bad(what, f"dynamic tag {tag} appears twice")
        tags[tag] = value
    else:
        raise _bad(what, "the dynamic section has no DT_NULL terminator")

    for tag, name in ((DT_STRTAB, "DT_STRTAB"), (DT_STRSZ, "DT_STRSZ"),
                      (DT_SYMTAB, "DT_SYMTAB")):
        if tag not in tags:
            raise _bad(what, f"missing .dynsym/.dynstr: no {name} in the dynamic section")
    if DT_HASH not in tags and DT_GNU_HASH not in tags:
        raise _bad(what, "no DT_HASH or DT_GNU_HASH (the symbol count is unknown)")
    if tags.get(DT_SYMENT, SYM.size) != SYM.size:
        raise _bad(what, f"DT_SYMENT is {tags[DT_SYMENT]}, not {SYM.size}")
    if tags.get(DT_RELAENT, RELA.size) != RELA.size:
        raise _bad(what, f"DT_RELAENT is {tags[DT_RELAENT]}, not {RELA.size}")
    if DT_PLTREL in tags and tags[DT_PLTREL] != DT_RELA:
        raise _unsupported(what, "DT_PLTREL is not DT_RELA")

    strsz = tags[DT_STRSZ]
    if strsz == 0 or strsz > MAX_IMAGE_SIZE:
        raise _bad(what, f"DT_STRSZ {strsz} is implausible")
    strtab = bytes(file_bytes(tags[DT_STRTAB], strsz, ".dynstr"))
    if strtab[-1] != 0:
        raise _bad(what, ".dynstr does not end with a NUL")

    def string(offset: int, name: str) -> str:
        if offset >= strsz:
            raise _bad(what, f"{name} string offset {offset} is outside .dynstr ({strsz})")
        raw_name = strtab[offset : strtab.index(b"\0", offset)]
        try:
            return raw_name.decode()
        except UnicodeDecodeError:
            raise _bad(what, f"{name} string at {offset} is not UTF-8") from None

    for name, offset in string_offsets:
        string(offset, name)
    lib.needed = [string(off, "DT_NEEDED") for off in needed_offsets]
    for needed in lib.needed:
        if needed not in ALLOWED_NEEDED:
            raise _unsupported(what, f"needs library {needed!r}; only system libraries "
                                     f"({', '.join(sorted(ALLOWED_NEEDED))}) may be named")
    lib.has_gnu_hash = DT_GNU_HASH in tags

    symtab = tags[DT_SYMTAB]
    nsyms = _symbol_count(lib, file_bytes, tags, symtab, data, e_shoff, e_shnum)
    if not 1 <= nsyms <= MAX_SYMBOLS:
        raise _bad(what, f"symbol count {nsyms} is implausible")
    raw_syms = file_bytes(symtab, nsyms * SYM.size, ".dynsym")
    for i in range(nsyms):
        st_name, st_info, _other, st_shndx, st_value, _st_size = SYM.unpack_from(
            raw_syms, i * SYM.size)
        name = string(st_name, f"symbol {i}") if st_name else ""
        if st_shndx not in (SHN_UNDEF, SHN_ABS, SHN_COMMON) and (
                st_shndx >= e_shnum and st_shndx < SHN_LORESERVE):
            raise _bad(what, f"symbol {name or i} has section index {st_shndx} >= {e_shnum}")
        if st_shndx not in (SHN_UNDEF, SHN_ABS) and i and not (
                lib.vaddr_min <= st_value <= lib.vaddr_max):
            raise _bad(what, f"symbol {name or i} value 0x{st_value:X} is outside the image")
        lib.symbols.append(Symbol(name, st_value, st_info, st_shndx))

    _check_versions(lib, file_bytes, tags, nsyms, string)
    query = [s for s in lib.symbols[1:] if s.name == QUERY_SYMBOL
             and s.info >> 4 in (STB_GLOBAL, STB_WEAK) and s.section != SHN_UNDEF]
    if not query:
        raise _unsupported(what, f"exports no {QUERY_SYMBOL} (not an executable library)")
    seg = lib.segment_at(query[-1].value)
    if seg is None or not seg.flags & PF_X:
        raise _bad(what, f"{QUERY_SYMBOL} (0x{query[-1].value:X}) is not in an executable "
                         "segment")
    lib.query_value = query[-1].value

    for tag, size_tag, name in ((DT_RELA, DT_RELASZ, "DT_RELA"),
                                (DT_JMPREL, DT_PLTRELSZ, "DT_JMPREL")):
        if (tag in tags) != (size_tag in tags):
            raise _bad(what, f"{name} and its size must come together")
        if tag not in tags:
            continue
        table_size = tags[size_tag]
        if table_size % RELA.size or table_size // RELA.size > MAX_RELOCATIONS:
            raise _bad(what, f"{name} size {table_size} is not a whole number of entries")
        table = file_bytes(tags[tag], table_size, name)
        for j in range(table_size // RELA.size):
            offset, info, addend = RELA.unpack_from(table, j * RELA.size)
            lib.relocations.append(_check_relocation(lib, name, j, offset, info, addend,
                                                     nsyms))

    for tag, name in ((DT_INIT, "DT_INIT"), (DT_FINI, "DT_FINI")):
        if tag in tags:
            seg = lib.segment_at(tags[tag])
            if seg is None or not seg.flags & PF_X:
                raise _bad(what, f"{name} 0x{tags[tag]:X} is not in an executable segment")
    for tag, size_tag, name in ((DT_INIT_ARRAY, DT_INIT_ARRAYSZ, "DT_INIT_ARRAY"),
                                (DT_FINI_ARRAY, DT_FINI_ARRAYSZ, "DT_FINI_ARRAY")):
        if (tag in tags) != (size_tag in tags):
            raise _bad(what, f"{name} and its size must come together")
        if tag in tags and (tags[size_tag] % 8 or lib.segment_at(tags[tag], max(
                tags[size_tag], 1)) is None):
            raise _bad(what, f"{name} (0x{tags[tag]:X}+{tags[size_tag]}) is not inside a "
                             "loaded segment")
    lib.has_initializers = (DT_INIT in tags or tags.get(DT_INIT_ARRAYSZ, 0) > 0
                            or DT_FINI in tags or tags.get(DT_FINI_ARRAYSZ, 0) > 0)
    if DT_PLTGOT in tags and lib.segment_at(tags[DT_PLTGOT], 8) is None:
        raise _bad(what, f"DT_PLTGOT 0x{tags[DT_PLTGOT]:X} is not inside a loaded segment")


def _check_versions(lib: ElfLibrary, file_bytes: Callable[[int, int, str], memoryview],
                    tags: dict[int, int], nsyms: int, string: Callable[[int, str], str]) -> None:
    """Symbol-versioning tables: every record and name in bounds, every index defined."""
    what = lib.what
    for tag, num in ((DT_VERNEED, DT_VERNEEDNUM), (DT_VERDEF, DT_VERDEFNUM)):
        if (tag in tags) != (num in tags):
            raise _bad(what, "a version table and its count must come together")
    highest = 1
    at, remaining = tags.get(DT_VERNEED, 0), tags.get(DT_VERNEEDNUM, 0)
    if remaining > 64:
        raise _bad(what, f"implausible DT_VERNEEDNUM {remaining}")
    while remaining:
        version, cnt, file_name, aux, next_ = struct.unpack_from(
            "<HHIII", file_bytes(at, 16, "DT_VERNEED"))
        if version != 1 or cnt > 64:
            raise _bad(what, "malformed DT_VERNEED record")
        if string(file_name, "DT_VERNEED file") not in ALLOWED_NEEDED:
            raise _unsupported(what, "version requirement names a library that is not a "
                                     "system library")
        aux_at = at + aux
        for _ in range(cnt):
            _, _, other, name, aux_next = struct.unpack_from(
                "<IHHII", file_bytes(aux_at, 16, "DT_VERNEED aux"))
            string(name, "DT_VERNEED version")
            highest = max(highest, other & 0x7FFF)
            aux_at += aux_next
        remaining -= 1
        if remaining and next_ == 0:
            raise _bad(what, "DT_VERNEED chain ends early")
        at += next_
    at, remaining = tags.get(DT_VERDEF, 0), tags.get(DT_VERDEFNUM, 0)
    if remaining > 64:
        raise _bad(what, f"implausible DT_VERDEFNUM {remaining}")
    while remaining:
        version, _, ndx, cnt, _, aux, next_ = struct.unpack_from(
            "<HHHHIII", file_bytes(at, 20, "DT_VERDEF"))
        if version != 1 or cnt == 0 or cnt > 64:
            raise _bad(what, "malformed DT_VERDEF record")
        aux_at = at + aux
        for _ in range(cnt):
            name, aux_next = struct.unpack_from("<II", file_bytes(aux_at, 8, "DT_VERDEF aux"))
            string(name, "DT_VERDEF version")
            aux_at += aux_next
        highest = max(highest, ndx & 0x7FFF)
        remaining -= 1
        if remaining and next_ == 0:
            raise _bad(what, "DT_VERDEF chain ends early")
        at += next_
    if DT_VERSYM in tags:
        indices = struct.unpack_from(f"<{nsyms}H", file_bytes(tags[DT_VERSYM], 2 * nsyms,
                                                               "DT_VERSYM"))
        if any(v & 0x7FFF > highest for v in indices):
            raise _bad(what, "DT_VERSYM names a version no table defines")


def _symbol_count(lib: ElfLibrary, file_bytes: Callable[[int, int, str], memoryview],
                  tags: dict[int, int], symtab: int, data: bytes, e_shoff: int,
                  e_shnum: int) -> int:
    """The number of dynamic symbols, with every hash table checked to be walkable."""
    what = lib.what
    count = None
    if DT_HASH in tags:
        nbucket, nchain = struct.unpack_from("<II", file_bytes(tags[DT_HASH], 8, "DT_HASH"))
        if nbucket == 0 or nchain == 0 or nbucket + nchain > MAX_SYMBOLS:
            raise _bad(what, f"DT_HASH table ({nbucket} buckets, {nchain} chains) is "
                             "implausible")
        words = struct.unpack_from(f"<{nbucket + nchain}I", file_bytes(
            tags[DT_HASH], 8 + 4 * (nbucket + nchain), "DT_HASH"), 8)
        buckets, chains = words[:nbucket], words[nbucket:]
        if any(v >= nchain for v in words):
            raise _bad(what, "DT_HASH table refers to a symbol past its chain count")
        seen = bytearray(nchain)
        for start in buckets:
            steps = 0
            index = start
            while index:
                steps += 1
                if steps > nchain:
                    raise _bad(what, "DT_HASH chain loops")
                seen[index] = 1
                index = chains[index]
        count = nchain
    if DT_GNU_HASH in tags:
        gnu = tags[DT_GNU_HASH]
        nbuckets, symoffset, bloom_size, _shift = struct.unpack_from(
            "<IIII", file_bytes(gnu, 16, "DT_GNU_HASH"))
        if nbuckets == 0 or bloom_size == 0 or bloom_size & (bloom_size - 1) or (
                nbuckets > MAX_SYMBOLS or bloom_size > MAX_SYMBOLS or symoffset == 0):
            raise _bad(what, "DT_GNU_HASH header is implausible")
        file_bytes(gnu, 16 + 8 * bloom_size, "DT_GNU_HASH bloom filter")
        buckets_at = gnu + 16 + 8 * bloom_size
        buckets = struct.unpack_from(f"<{nbuckets}I", file_bytes(
            buckets_at, 4 * nbuckets, "DT_GNU_HASH buckets"))
        chains_at = buckets_at + 4 * nbuckets
        last = max(buckets)
        if last and last < symoffset:
            raise _bad(what, "DT_GNU_HASH bucket precedes the first hashed symbol")
        gnu_count = symoffset
        if last:
            index = last
            while True:
                if index - symoffset > MAX_SYMBOLS:
                    raise _bad(what, "DT_GNU_HASH chain does not end")
                (word,) = struct.unpack_from("<I", file_bytes(
                    chains_at + 4 * (index - symoffset), 4, "DT_GNU_HASH chain"))
                if word & 1:
                    break
                index += 1
            gnu_count = index + 1
        if any(b and b < symoffset for b in buckets):
            raise _bad(what, "DT_GNU_HASH bucket precedes the first hashed symbol")
        if count is not None and gnu_count > count:
            raise _bad(what, f"DT_GNU_HASH covers {gnu_count} symbols, DT_HASH {count}")
        count = count if count is not None else gnu_count
    for i in range(e_shnum):
        _, sh_type, _, sh_addr, _, sh_size, _, _, _, sh_entsize = SHDR.unpack_from(
            data, e_shoff + i * SHDR.size)
        if sh_type == 11 and sh_addr == symtab and sh_entsize == SYM.size:  # SHT_DYNSYM
            if count is not None and sh_size // SYM.size < count:
                raise _bad(what, f".dynsym holds {sh_size // SYM.size} symbols, the hash "
                                 f"table {count}")
    assert count is not None
    return count


def _check_relocation(lib: ElfLibrary, table: str, index: int, offset: int, info: int,
                      addend: int, nsyms: int) -> Relocation:
    what = lib.what
    rtype, symbol = info & 0xFFFFFFFF, info >> 32
    width = RELOCATION_WIDTH.get(rtype) if HOST_MACHINE == EM_X86_64 else None
    if width is None:
        raise _unsupported(what, f"{table}[{index}] has unsupported relocation type {rtype}")
    if rtype == R_X86_64_NONE:
        return Relocation(offset, rtype, 0, 0)
    if symbol >= nsyms:
        raise _bad(what, f"{table}[{index}] names symbol {symbol}, there are {nsyms}")
    if rtype == R_X86_64_RELATIVE and symbol:
        raise _bad(what, f"{table}[{index}] is RELATIVE but names symbol {symbol}")
    if rtype != R_X86_64_RELATIVE and not symbol:
        raise _bad(what, f"{table}[{index}] ({RELOCATION_NAMES[rtype]}) names no symbol")
    if rtype == R_X86_64_RELATIVE and not lib.vaddr_min <= addend <= lib.vaddr_max:
        raise _bad(what, f"{table}[{index}] points outside the image (0x{addend & (2**64 - 1):X})")
    seg = lib.segment_at(offset, width)
    if seg is None:
        raise _bad(what, f"{table}[{index}] writes 0x{offset:X}+{width}, outside every "
                         "loaded segment")
    return Relocation(offset, rtype, symbol, addend)


# -- our own loader ------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_mmap = _libc.mmap
_mmap.restype = ctypes.c_void_p
_mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                  ctypes.c_long]
_mprotect = _libc.mprotect
_mprotect.restype = ctypes.c_int
_mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_munmap = _libc.munmap
_munmap.restype = ctypes.c_int
_munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


class MappedImage:
    """A self-contained library loaded into anonymous pages; `close` unmaps it."""

    def __init__(self, lib: ElfLibrary, data: bytes) -> None:
        if not lib.self_contained:
            raise InvalidArgumentError(f"{lib.what}: needs a dynamic loader")
        self.size = (lib.vaddr_max - lib.vaddr_min + PAGE_SIZE - 1) & ~(PAGE_SIZE - 1)
        base = _mmap(None, self.size, mmap.PROT_READ | mmap.PROT_WRITE,
                     mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if base in (None, _MAP_FAILED):
            raise ResourceExhaustedError(f"{lib.what}: cannot map {self.size} bytes")
        self.base = base
        self.bias = base - lib.vaddr_min
        self.lib = lib
        try:
            self._load(data)
        except BaseException:
            self.close()
            raise

    def _load(self, data: bytes) -> None:
        lib = self.lib
        memory = memoryview((ctypes.c_ubyte * self.size).from_address(self.base)).cast("B")
        low = lib.vaddr_min
        for seg in lib.segments:
            at = seg.vaddr - low
            memory[at : at + seg.filesz] = data[seg.offset : seg.offset + seg.filesz]
        bias = self.bias
        for rel in lib.relocations:
            at = rel.offset - low
            sym = lib.symbols[rel.symbol].value + bias if rel.symbol else 0
            if rel.type == R_X86_64_RELATIVE:
                struct.pack_into("<Q", memory, at, (bias + rel.addend) & (2**64 - 1))
            elif rel.type in (R_X86_64_64, R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT):
                add = rel.addend if rel.type == R_X86_64_64 else 0
                struct.pack_into("<Q", memory, at, (sym + add) & (2**64 - 1))
            elif rel.type == R_X86_64_32:
                struct.pack_into("<I", memory, at, (sym + rel.addend) & 0xFFFFFFFF)
            elif rel.type == R_X86_64_32S:
                struct.pack_into("<I", memory, at, (sym + rel.addend) & 0xFFFFFFFF)
            elif rel.type == R_X86_64_PC32:
                place = bias + rel.offset
                struct.pack_into("<I", memory, at, (sym + rel.addend - place) & 0xFFFFFFFF)
        memory.release()
        protections: dict[int, int] = {}
        for seg in lib.segments:
            prot = (mmap.PROT_READ if seg.flags & (PF_R | PF_W | PF_X) else 0) | (
                mmap.PROT_WRITE if seg.flags & PF_W else 0) | (
                mmap.PROT_EXEC if seg.flags & PF_X else 0)
            for page in range((seg.vaddr - low) // PAGE_SIZE,
                              (seg.end - low - 1) // PAGE_SIZE + 1):
                protections[page] = protections.get(page, 0) | prot
        for start, length in lib.relro:
            first = (start - low + PAGE_SIZE - 1) // PAGE_SIZE
            for page in range(first, (start + length - low) // PAGE_SIZE):
                protections[page] = protections.get(page, 0) & ~mmap.PROT_WRITE
        for page in range(self.size // PAGE_SIZE):
            prot = protections.get(page, 0)
            if _mprotect(self.base + page * PAGE_SIZE, PAGE_SIZE, prot) != 0:
                raise InternalError(f"{lib.what}: mprotect failed (errno {ctypes.get_errno()})")

    @property
    def query_address(self) -> int:
        return self.bias + self.lib.query_value

    def close(self) -> None:
        if getattr(self, "base", None):
            _munmap(self.base, self.size)
            self.base = 0

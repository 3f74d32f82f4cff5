"""Deterministic mutations of `.vmfb` files, shared by bench/fuzz_loaders.py and the
seed-corpus regression test: a case is (module bytes, seed string) -> mutated bytes, so a
reproducer is a seed, never a committed binary.

Mutators: bit flips, byte sets, word overwrites with boundary values, truncation,
splices, insertions and deletions anywhere; targeted ones aimed at the embedded ELF
executables (header, program headers, dynamic entries, relocations, symbols) and at the
FlatBuffer (u32 offsets and vtable entries).
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass

INTERESTING_U32 = (0, 1, 2, 3, 4, 7, 8, 16, 24, 56, 64, 0x7F, 0x80, 0xFF, 0x100, 0x1000,
                   0x7FFF, 0x8000, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE,
                   0xFFFFFFFF)
INTERESTING_U64 = INTERESTING_U32 + (0x100000000, 0x7FFFFFFFFFFFFFFF, 0x8000000000000000,
                                     0xFFFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFFF0)


@dataclass(frozen=True)
class ElfSpan:
    """One embedded ELF inside a module file and where its tables are."""

    start: int
    end: int
    phdrs: tuple[int, ...]
    dynamic: tuple[int, ...]
    relocations: tuple[int, ...]
    symbols: tuple[int, ...]


def find_elfs(data: bytes) -> list[ElfSpan]:
    """The ELF libraries embedded in `data` (by magic; structure read best-effort)."""
    spans = []
    pos = data.find(b"\x7fELF")
    while pos >= 0:
        span = _elf_span(data, pos)
        if span is not None:
            spans.append(span)
        pos = data.find(b"\x7fELF", pos + 4)
    return spans


def _elf_span(data: bytes, start: int) -> ElfSpan | None:
    try:
        phoff, shoff = struct.unpack_from("<QQ", data, start + 32)
        phnum, _, shnum = struct.unpack_from("<HHH", data, start + 56)
        end = start + max(shoff + shnum * 64, phoff + phnum * 56)
        if end > len(data) or phnum > 64:
            return None
        phdrs = tuple(start + phoff + 56 * i for i in range(phnum))
        dynamic: list[int] = []
        relocations: list[int] = []
        symbols: list[int] = []
        loads = []
        for ph in phdrs:
            p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", data, ph)
            if p_type == 1:
                loads.append((p_vaddr, p_offset, p_filesz))
            if p_type == 2:
                dynamic = list(range(start + p_offset, start + p_offset + p_filesz, 16))

        def file_of(vaddr: int) -> int | None:
            for v, o, n in loads:
                if v <= vaddr < v + n:
                    return start + o + vaddr - v
            return None

        tags = {}
        for d in dynamic:
            tag, value = struct.unpack_from("<qQ", data, d)
            tags[tag] = value
        if 7 in tags and 8 in tags and file_of(tags[7]) is not None:
            base = file_of(tags[7])
            relocations = list(range(base, base + tags[8], 24))
        if 6 in tags and file_of(tags[6]) is not None:
            base = file_of(tags[6])
            symbols = [base + 24 * i for i in range(4)]
        return ElfSpan(start, end, phdrs, tuple(dynamic), tuple(relocations), tuple(symbols))
    except struct.error:
        return None


def code_ranges(data: bytes) -> list[tuple[int, int]]:
    """File ranges of the executable (PF_X) segments of every embedded ELF in `data`."""
    ranges = []
    for elf in find_elfs(data):
        for ph in elf.phdrs:
            p_type, p_flags, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", data, ph)
            if p_type == 1 and p_flags & 1:
                ranges.append((elf.start + p_offset, elf.start + p_offset + p_filesz))
    return ranges


def touches_code(original: bytes, mutated: bytes) -> bool:
    """Whether a same-length mutation changed an embedded executable's machine code, or a
    relocation whose target is code (a function pointer moved within the code)."""
    if len(original) != len(mutated):
        return False
    changed = [i for i, (a, b) in enumerate(zip(original, mutated)) if a != b]
    for lo, hi in code_ranges(original):
        if any(lo <= i < hi for i in changed):
            return True
    for elf in find_elfs(original):
        code = []
        for ph in elf.phdrs:
            p_type, p_flags, _, p_vaddr, _, _, p_memsz = struct.unpack_from(
                "<IIQQQQQ", original, ph)
            if p_type == 1 and p_flags & 1:
                code.append((p_vaddr, p_vaddr + p_memsz))
        for rel in elf.relocations:
            if any(rel <= i < rel + 24 for i in changed):
                addend = struct.unpack_from("<q", original, rel + 16)[0]
                if any(lo <= addend < hi for lo, hi in code):
                    return True
    return False


def flatbuffer_span(data: bytes) -> tuple[int, int]:
    """(start, end) of the FlatBuffer inside a `.vmfb` (after any ZIP header)."""
    start = 0
    if data[:4] == b"PK\x03\x04":
        name_len, extra_len = struct.unpack_from("<HH", data, 26)
        start = 30 + name_len + extra_len
    size = struct.unpack_from("<I", data, start)[0]
    return start + 4, min(len(data), start + 4 + size)


MUTATORS = ("bitflip", "byteset", "word", "truncate", "splice", "insert", "delete",
            "elf_header", "elf_phdr", "elf_dynamic", "elf_reloc", "elf_symbol", "elf_bytes",
            "fb_offset", "fb_bytes")


def mutate(data: bytes, seed: str, mutator: str | None = None) -> tuple[bytes, str]:
    """`data` mutated deterministically by `seed`; returns (bytes, a description)."""
    rng = random.Random(seed)
    mutator = mutator or rng.choice(MUTATORS)
    buf = bytearray(data)
    elfs = find_elfs(data)
    fb_start, fb_end = flatbuffer_span(data)
    n = len(buf)

    def put(at: int, value: int, width: int) -> None:
        if 0 <= at and at + width <= len(buf):
            struct.pack_into("<Q" if width == 8 else "<I" if width == 4 else "<H"
                             if width == 2 else "<B", buf, at, value & ((1 << 8 * width) - 1))

    def boundary(width: int, old: int) -> int:
        choices = INTERESTING_U64 if width == 8 else INTERESTING_U32
        kind = rng.random()
        if kind < 0.4:
            return rng.choice(choices)
        if kind < 0.8:
            return old + rng.choice((-64, -16, -8, -4, -1, 1, 4, 8, 16, 64, 4096))
        return old ^ (1 << rng.randrange(8 * width))

    def field(at: int, width: int) -> str:
        if at + width > len(buf):
            return "none"
        old = int.from_bytes(buf[at : at + width], "little")
        put(at, boundary(width, old), width)
        return f"@{at}/{width}"

    if mutator.startswith("elf") and not elfs:
        mutator = "bitflip"
    elf = rng.choice(elfs) if elfs else None
    if mutator == "bitflip":
        count = rng.choice((1, 1, 2, 4, 8))
        where = []
        for _ in range(count):
            at = rng.randrange(n)
            buf[at] ^= 1 << rng.randrange(8)
            where.append(at)
        detail = f"bits at {where}"
    elif mutator == "byteset":
        where = []
        for _ in range(rng.choice((1, 2, 4))):
            at = rng.randrange(n)
            buf[at] = rng.choice((0, 0xFF, 0x7F, 0x80, 1, rng.randrange(256)))
            where.append(at)
        detail = f"bytes at {where}"
    elif mutator == "word":
        width = rng.choice((2, 4, 8))
        at = rng.randrange(max(1, n - width))
        detail = "word " + field(at, width)
    elif mutator == "truncate":
        cut = rng.choice((rng.randrange(n), n - rng.randrange(1, 256), rng.randrange(64)))
        buf = buf[: max(0, cut)]
        detail = f"truncate to {len(buf)}"
    elif mutator == "splice":
        length = rng.choice((4, 8, 16, 64, 256))
        src, dst = rng.randrange(n), rng.randrange(n)
        chunk = bytes(buf[src : src + length])
        buf[dst : dst + len(chunk)] = chunk
        detail = f"splice {src}->{dst} ({len(chunk)})"
    elif mutator == "insert":
        at = rng.randrange(n)
        chunk = bytes(rng.randrange(256) for _ in range(rng.choice((1, 4, 16))))
        buf[at:at] = chunk
        detail = f"insert {len(chunk)} at {at}"
    elif mutator == "delete":
        at = rng.randrange(n)
        length = rng.choice((1, 4, 16))
        del buf[at : at + length]
        detail = f"delete {length} at {at}"
    elif mutator == "elf_header":
        assert elf is not None
        offset, width = rng.choice(((4, 1), (5, 1), (6, 1), (7, 1), (16, 2), (18, 2), (20, 4),
                                    (24, 8), (32, 8), (40, 8), (52, 2), (54, 2), (56, 2),
                                    (58, 2), (60, 2), (62, 2)))
        detail = "elf header " + field(elf.start + offset, width)
    elif mutator == "elf_phdr":
        assert elf is not None
        ph = rng.choice(elf.phdrs)
        offset, width = rng.choice(((0, 4), (4, 4), (8, 8), (16, 8), (32, 8), (40, 8), (48, 8)))
        detail = "elf phdr " + field(ph + offset, width)
    elif mutator == "elf_dynamic" and elf is not None and elf.dynamic:
        d = rng.choice(elf.dynamic)
        detail = "elf dynamic " + field(d + rng.choice((0, 8)), 8)
    elif mutator == "elf_reloc" and elf is not None and elf.relocations:
        r = rng.choice(elf.relocations)
        offset, width = rng.choice(((0, 8), (8, 4), (12, 4), (16, 8)))
        detail = "elf reloc " + field(r + offset, width)
    elif mutator == "elf_symbol" and elf is not None and elf.symbols:
        s = rng.choice(elf.symbols)
        offset, width = rng.choice(((0, 4), (4, 1), (6, 2), (8, 8), (16, 8)))
        detail = "elf symbol " + field(s + offset, width)
    elif mutator in ("elf_bytes", "elf_dynamic", "elf_reloc", "elf_symbol"):
        assert elf is not None
        at = rng.randrange(elf.start, elf.end)
        buf[at] ^= 1 << rng.randrange(8)
        detail = f"elf bit at {at}"
    elif mutator == "fb_offset":
        at = fb_start + 4 * rng.randrange(max(1, (fb_end - fb_start) // 4))
        detail = "flatbuffer " + field(at, rng.choice((4, 4, 4, 2)))
    else:  # fb_bytes
        at = rng.randrange(fb_start, max(fb_start + 1, fb_end))
        if at < len(buf):
            buf[at] = rng.randrange(256)
        detail = f"flatbuffer byte at {at}"
    return bytes(buf), f"{mutator}: {detail}"


# -- the modules fuzzed --------------------------------------------------------------

TINY = """
func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = arith.addf %a, %b : tensor<4xf32>
  %1 = arith.mulf %0, %b : tensor<4xf32>
  return %1 : tensor<4xf32>
}
"""

SYSTEM_ELF = """
func.func @main(%a: tensor<3x70xf32>, %b: tensor<70x5xf32>) -> (tensor<3x5xf32>, tensor<3xf32>) {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<3x5xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<3x5xf32>) -> tensor<3x5xf32>
  %m = linalg.matmul ins(%a, %b : tensor<3x70xf32>, tensor<70x5xf32>)
                     outs(%f : tensor<3x5xf32>) -> tensor<3x5xf32>
  %e2 = tensor.empty() : tensor<3xf32>
  %f2 = linalg.fill ins(%z : f32) outs(%e2 : tensor<3xf32>) -> tensor<3xf32>
  %s = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>,
                                        affine_map<(d0, d1) -> (d0)>],
                       iterator_types = ["parallel", "reduction"]}
      ins(%a : tensor<3x70xf32>) outs(%f2 : tensor<3xf32>) {
  ^bb0(%x: f32, %acc: f32):
    %t = math.tanh %x : f32
    %r = arith.addf %t, %acc : f32
    linalg.yield %r : f32
  } -> tensor<3xf32>
  return %m, %s : tensor<3x5xf32>, tensor<3xf32>
}
"""


@dataclass(frozen=True)
class Subject:
    """A module to mutate: its file, the function to call and its inputs."""

    name: str
    path: str
    function: str
    shapes: tuple[tuple[int, ...], ...]

    def inputs(self) -> list:
        import numpy as np

        rng = np.random.default_rng(7)
        return [rng.standard_normal(s).astype(np.float32) for s in self.shapes]

    def iree_inputs(self, directory: str) -> list[str]:
        """`--input=@x.npy` flags for iree-run-module, the arrays saved in `directory`."""
        import os

        import numpy as np

        out = []
        for i, array in enumerate(self.inputs()):
            path = os.path.join(directory, f"{self.name}-input{i}.npy")
            partial = f"{path}.{os.getpid()}.{id(array)}.tmp"
            with open(partial, "wb") as f:
                np.save(f, array)
            os.replace(partial, path)  # readers never see a half-written file
            out.append(f"--input=@{path}")
        return out


def subjects(names: list[str]) -> list[Subject]:
    """The modules named (tiny, small_cnn, system_elf, mobilenet), compiled or cached."""
    from .iree_tools import HOST_FLAGS, compile_mlir
    from .models import mobilenet_v2_vmfb, small_cnn_vmfb

    table = {
        "tiny": lambda: Subject("tiny", str(compile_mlir(TINY, HOST_FLAGS)), "main",
                                ((4,), (4,))),
        "small_cnn": lambda: Subject("small_cnn", str(small_cnn_vmfb()), "small_cnn",
                                     ((1, 3, 64, 64),)),
        "system_elf": lambda: Subject(
            "system_elf", str(compile_mlir(SYSTEM_ELF, [*HOST_FLAGS,
                                                        "--iree-llvmcpu-link-embedded=false"])),
            "main", ((3, 70), (70, 5))),
        "mobilenet": lambda: Subject("mobilenet", str(mobilenet_v2_vmfb()), "main_graph",
                                     ((1, 3, 224, 224),)),
    }
    return [table[n]() for n in names]


def case_seed(seed: int, subject: str, case: int) -> str:
    return f"{seed}:{subject}:{case}"

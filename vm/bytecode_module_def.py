"""Bounds-checked readers for the `.vmfb` FlatBuffer (IREE's `BytecodeModuleDef`).

A FlatBuffer is read in place: a table is a signed offset to its vtable, the vtable a
list of 16-bit field offsets. Every accessor here goes through `_Tab`, which checks each
vtable, field, string and vector against the buffer before reading it, so a truncated
or hostile file raises `InvalidArgumentError` instead of `IndexError`, `struct.error` or
a huge allocation. (The `flatbuffers` package's reader checks nothing, and importing it
imports numpy whenever numpy is installed, ~60 ms and 15 MiB for every tool start.)

Field slots are those of IREE's `bytecode_module_def.fbs` (a union occupies two slots:
its type byte, then its value).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from ..errors import InvalidArgumentError
from .types import HEAD_BYTES

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_I16 = struct.Struct("<h")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")
_FUNCTION_DESCRIPTOR = struct.Struct("<iiIhhhh")  # 20 bytes, see FunctionDescriptor
_BYTECODE_LOCATION = struct.Struct("<ii")

# Hard caps so hostile counts cannot make us loop or allocate without bound.
MAX_VECTOR_ELEMENTS = 1 << 24


def _bad(what: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"malformed module FlatBuffer: {what}")


class _Tab:
    """A FlatBuffer table at `pos` of `buf`, with every read bounds-checked."""

    __slots__ = ("buf", "pos", "vt", "vt_size", "size", "what")

    def __init__(self, buf: memoryview, pos: int, what: str) -> None:
        size = len(buf)
        self.buf = buf
        self.size = size
        self.what = what
        if pos < 0 or pos + 4 > size:
            raise _bad(f"{what}: table offset {pos} outside buffer of {size} bytes")
        vt = pos - _I32.unpack_from(buf, pos)[0]
        if vt < 0 or vt + 4 > size:
            raise _bad(f"{what}: vtable offset {vt} outside buffer of {size} bytes")
        vt_size, obj_size = _U16.unpack_from(buf, vt)[0], _U16.unpack_from(buf, vt + 2)[0]
        if vt_size < 4 or vt_size & 1 or vt + vt_size > size:
            raise _bad(f"{what}: vtable size {vt_size} invalid")
        if pos + obj_size > size:
            raise _bad(f"{what}: table of {obj_size} bytes overruns buffer")
        self.pos = pos
        self.vt = vt
        self.vt_size = vt_size

    def _field(self, slot: int, width: int) -> int:
        """Absolute position of a field of `width` bytes, or 0 when absent."""
        voff = 4 + 2 * slot
        if voff >= self.vt_size:
            return 0
        rel = _U16.unpack_from(self.buf, self.vt + voff)[0]
        if not rel:
            return 0
        at = self.pos + rel
        if at + width > self.size:
            raise _bad(f"{self.what}: field {slot} overruns buffer")
        return at

    def scalar(self, slot: int, fmt: struct.Struct, default: int = 0) -> int:
        at = self._field(slot, fmt.size)
        return fmt.unpack_from(self.buf, at)[0] if at else default

    def has(self, slot: int) -> bool:
        return self._field(slot, 1) != 0

    def _indirect(self, slot: int) -> int:
        at = self._field(slot, 4)
        if not at:
            return 0
        target = at + _U32.unpack_from(self.buf, at)[0]
        if target + 4 > self.size:
            raise _bad(f"{self.what}: field {slot} points outside buffer")
        return target

    def string(self, slot: int) -> str | None:
        at = self._indirect(slot)
        if not at:
            return None
        return _read_string(self.buf, at, f"{self.what}.{slot}")

    def table(self, slot: int, what: str) -> _Tab | None:
        at = self._indirect(slot)
        return _Tab(self.buf, at, what) if at else None

    def vector(self, slot: int, elem_size: int) -> tuple[int, int]:
        """(start, count) of a vector of `elem_size`-byte elements; (0, 0) if absent."""
        at = self._indirect(slot)
        if not at:
            return 0, 0
        count = _U32.unpack_from(self.buf, at)[0]
        start = at + 4
        if count > MAX_VECTOR_ELEMENTS and elem_size > 1:
            raise _bad(f"{self.what}: vector {slot} has {count} elements")
        if start + count * elem_size > self.size:
            raise _bad(f"{self.what}: vector {slot} of {count} elements overruns buffer")
        return start, count

    def bytes_view(self, slot: int) -> memoryview | None:
        start, count = self.vector(slot, 1)
        if not start:
            return None
        return self.buf[start : start + count]

    def tables(self, slot: int, what: str) -> list[_Tab]:
        start, count = self.vector(slot, 4)
        out = []
        for i in range(count):
            at = start + 4 * i
            out.append(_Tab(self.buf, at + _U32.unpack_from(self.buf, at)[0], f"{what}[{i}]"))
        return out

    def strings_or_tables_union(self, type_slot: int, value_slot: int, what: str):
        """Vector-of-unions: [(type, _Tab | None)]."""
        tstart, tcount = self.vector(type_slot, 1)
        vstart, vcount = self.vector(value_slot, 4)
        if tcount != vcount:
            raise _bad(f"{what}: union type/value vectors differ in length")
        out = []
        for i in range(vcount):
            kind = self.buf[tstart + i]
            at = vstart + 4 * i
            off = _U32.unpack_from(self.buf, at)[0]
            out.append((kind, _Tab(self.buf, at + off, f"{what}[{i}]") if kind and off else None))
        return out


def _read_string(buf: memoryview, at: int, what: str) -> str:
    n = _U32.unpack_from(buf, at)[0]
    if at + 4 + n > len(buf):
        raise _bad(f"{what}: string of {n} bytes overruns buffer")
    raw = bytes(buf[at + 4 : at + 4 + n])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(f"{what}: string is not UTF-8") from None


# ---------------------------------------------------------------------------
# Plain records produced by the reader.


class FunctionSignature(NamedTuple):
    calling_convention: str | None
    attrs: dict[str, str]


class ImportFunction(NamedTuple):
    full_name: str
    signature: FunctionSignature
    optional: bool


class ExportFunction(NamedTuple):
    local_name: str
    internal_ordinal: int


class Dependency(NamedTuple):
    name: str
    minimum_version: int
    optional: bool


class FunctionDescriptor(NamedTuple):
    bytecode_offset: int
    bytecode_length: int
    requirements: int
    reserved: int
    block_count: int
    i32_register_count: int
    ref_register_count: int


class RodataSegment(NamedTuple):
    embedded: memoryview | None
    external_offset: int | None
    external_length: int | None
    compressed: bool
    head: memoryview | None = None  # the file's 8 bytes before `embedded` (`VMBuffer.head`)


class FunctionSourceMap(NamedTuple):
    local_name: str | None
    locations: tuple[tuple[int, int], ...]  # (bytecode offset, location index)


class DebugDatabase(NamedTuple):
    # Each entry: ("file", filename, line, column) | ("name", name, child) |
    # ("callsite", callee, caller) | ("fused", metadata, (children...)) | None
    location_table: tuple
    functions: tuple[FunctionSourceMap, ...]


class ModuleDef(NamedTuple):
    name: str
    version: int
    requirements: int
    attrs: dict[str, str]
    types: list[str]
    dependencies: list[Dependency]
    imported_functions: list[ImportFunction]
    exported_functions: list[ExportFunction]
    function_signatures: list[FunctionSignature]
    rodata_segments: list[RodataSegment]
    rwdata_segment_sizes: list[int]
    global_bytes_capacity: int
    global_ref_count: int
    function_descriptors: list[FunctionDescriptor]
    bytecode_version: int
    bytecode_data: memoryview
    debug_database: DebugDatabase | None


# BytecodeModuleDef slots.
_M_NAME, _M_VERSION, _M_REQUIREMENTS, _M_ATTRS, _M_TYPES, _M_DEPENDENCIES = range(6)
_M_IMPORTS, _M_EXPORTS, _M_SIGNATURES, _M_RODATA, _M_RWDATA, _M_STATE = range(6, 12)
_M_DESCRIPTORS, _M_BYTECODE_VERSION, _M_BYTECODE_DATA, _M_DEBUG = range(12, 16)


def _attrs(tab: _Tab | None, slot: int, what: str) -> dict[str, str]:
    if tab is None:
        return {}
    out = {}
    for a in tab.tables(slot, what):
        key = a.string(0)
        if key is None:
            raise _bad(f"{a.what}: attribute without key")
        out[key] = a.string(1) or ""
    return out


def _signature(tab: _Tab | None) -> FunctionSignature:
    if tab is None:
        return FunctionSignature(None, {})
    return FunctionSignature(tab.string(0), _attrs(tab, 1, tab.what + ".attrs"))


def _debug_database(tab: _Tab) -> DebugDatabase:
    locs = []
    for kind, loc in tab.strings_or_tables_union(0, 1, "location_table"):
        if loc is None:
            locs.append(None)
        elif kind == 1:  # CallSiteLocDef
            locs.append(("callsite", loc.scalar(0, _I32), loc.scalar(1, _I32)))
        elif kind == 2:  # FileLineColLocDef
            locs.append(("file", loc.string(0) or "", loc.scalar(1, _I32), loc.scalar(2, _I32)))
        elif kind == 3:  # FusedLocDef
            start, count = loc.vector(1, 4)
            children = tuple(_I32.unpack_from(loc.buf, start + 4 * i)[0] for i in range(count))
            locs.append(("fused", loc.string(0), children))
        elif kind == 4:  # NameLocDef
            locs.append(("name", loc.string(0) or "", loc.scalar(1, _I32)))
        else:
            locs.append(None)
    funcs = []
    for f in tab.tables(2, "debug.functions"):
        start, count = f.vector(1, _BYTECODE_LOCATION.size)
        pairs = tuple(
            _BYTECODE_LOCATION.unpack_from(f.buf, start + 8 * i) for i in range(count)
        )
        funcs.append(FunctionSourceMap(f.string(0), pairs))
    return DebugDatabase(tuple(locs), tuple(funcs))


def read_module_def(flatbuffer: memoryview) -> ModuleDef:
    """Parses a `BytecodeModuleDef` FlatBuffer (without its size prefix)."""
    if len(flatbuffer) < 8:
        raise _bad(f"buffer of {len(flatbuffer)} bytes is too small")
    if bytes(flatbuffer[4:8]) != b"IREE":
        raise _bad("file identifier is not 'IREE'")
    root = _U32.unpack_from(flatbuffer, 0)[0]
    m = _Tab(flatbuffer, root, "module")

    name = m.string(_M_NAME)
    if not name:
        raise _bad("module missing name field")

    types = []
    for i, t in enumerate(m.tables(_M_TYPES, "types")):
        tname = t.string(0)
        if not tname:
            raise _bad(f"types[{i}] missing name")
        types.append(tname)

    deps = []
    for i, d in enumerate(m.tables(_M_DEPENDENCIES, "dependencies")):
        dname = d.string(0)
        if not dname:
            raise _bad(f"dependencies[{i}] has no module name")
        flags = d.scalar(2, _U32, 1)
        deps.append(Dependency(dname, d.scalar(1, _U32), bool(flags & 2)))

    imports = []
    for i, imp in enumerate(m.tables(_M_IMPORTS, "imported_functions")):
        full = imp.string(0)
        if not full:
            raise _bad(f"imports[{i}] missing full_name")
        sig = _signature(imp.table(1, f"imports[{i}].signature"))
        flags = imp.scalar(2, _U32, 1)
        imports.append(ImportFunction(full, sig, bool(flags & 2)))

    signatures = [_signature(s) for s in m.tables(_M_SIGNATURES, "function_signatures")]

    dstart, dcount = m.vector(_M_DESCRIPTORS, _FUNCTION_DESCRIPTOR.size)
    descriptors = [
        FunctionDescriptor(*_FUNCTION_DESCRIPTOR.unpack_from(flatbuffer, dstart + 20 * i))
        for i in range(dcount)
    ]

    exports = []
    for i, e in enumerate(m.tables(_M_EXPORTS, "exported_functions")):
        local = e.string(0)
        if not local:
            raise _bad(f"exports[{i}] missing local_name")
        exports.append(ExportFunction(local, e.scalar(1, _I32)))

    rodata = []
    for seg in m.tables(_M_RODATA, "rodata_segments"):
        compressed = seg.scalar(0, _U8) not in (0, 1)
        embedded = seg.bytes_view(2)
        if embedded is not None:
            start = seg.vector(2, 1)[0]
            head = m.buf[start - HEAD_BYTES : start] if start >= HEAD_BYTES else None
            rodata.append(RodataSegment(embedded, None, None, compressed, head))
        else:
            rodata.append(
                RodataSegment(None, seg.scalar(3, _U64), seg.scalar(4, _U64), compressed)
            )

    rwdata = [s.scalar(0, _I32) for s in m.tables(_M_RWDATA, "rwdata_segments")]

    state = m.table(_M_STATE, "module_state")
    global_bytes = state.scalar(0, _I32) if state else 0
    global_refs = state.scalar(1, _I32) if state else 0

    bytecode = m.bytes_view(_M_BYTECODE_DATA)
    debug_tab = m.table(_M_DEBUG, "debug_database")
    return ModuleDef(
        name=name,
        version=m.scalar(_M_VERSION, _U32),
        requirements=m.scalar(_M_REQUIREMENTS, _U32),
        attrs=_attrs(m, _M_ATTRS, "attrs"),
        types=types,
        dependencies=deps,
        imported_functions=imports,
        exported_functions=exports,
        function_signatures=signatures,
        rodata_segments=rodata,
        rwdata_segment_sizes=rwdata,
        global_bytes_capacity=global_bytes,
        global_ref_count=global_refs,
        function_descriptors=descriptors,
        bytecode_version=m.scalar(_M_BYTECODE_VERSION, _U32),
        bytecode_data=bytecode if bytecode is not None else memoryview(b""),
        debug_database=_debug_database(debug_tab) if debug_tab else None,
    )

"""Loading and verifying `.vmfb` modules.

`load_module(path_or_bytes)` parses the container (optional ZIP local header, 4-byte
size prefix, FlatBuffer, 64-byte aligned external rodata), reads the `BytecodeModuleDef`,
checks every offset, signature and ordinal, then decodes every function once, verifies
its bytecode (`verifier.py`) and translates it into Python (`codegen.py`), or on a
translation-cache hit takes the stored translation and decodes nothing. Anything
malformed raises a `tinyhal.Error` (`InvalidArgumentError`, `OutOfRangeError`,
`DataLossError`, `IncompatibleError`...) naming what was wrong; nothing in a hostile file
can crash, hang or over-allocate.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from typing import NamedTuple

from ..errors import (
    DataLossError,
    Error,
    IncompatibleError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    UnimplementedError,
)
from ..hal.buffer import ALIGNMENT, mapped_block
from . import isa
from .bytecode_module_def import (
    DebugDatabase,
    Dependency,
    FunctionDescriptor,
    FunctionSignature,
    ModuleDef,
    read_module_def,
)
from .cconv import CConv, parse_cconv
from .files import open_regular_file
from .types import HEAD_BYTES, VMBuffer

ZIP_LOCAL_HEADER = 0x04034B50
# Type names a module may require: the VM's value types and builtin ref types, and the
# ref types the `hal` module registers (IREE resolves the same names at load).
VALUE_TYPE_NAMES = frozenset({"i8", "i16", "i32", "i64", "f32", "f64", "!vm.opaque"})
REGISTERED_REF_TYPES = frozenset({
    "vm.buffer", "vm.list", "hal.allocator", "hal.buffer", "hal.buffer_view", "hal.channel",
    "hal.command_buffer", "hal.device", "hal.event", "hal.executable", "hal.fence",
    "hal.file", "hal.semaphore",
})
SEGMENT_ALIGNMENT = 64
assert SEGMENT_ALIGNMENT <= ALIGNMENT  # so a module read into a host block keeps it
MAX_REGISTERS = 0x3FFF


class Function:
    """An internal function: descriptor, signature, decoded instructions, source map.

    `where` is `module.function`, for errors; `bytecode` the body, decoded on first use
    of `instructions`: only translating reads them, so a translation-cache hit never
    decodes (the entry's key covers these bytes, which decoded cleanly when it was
    written); `locations` maps a pc to its location index. (A plain class: defined at
    every start-up, which a dataclass makes slower.)"""

    __slots__ = ("ordinal", "name", "descriptor", "signature", "cconv", "where",
                 "bytecode", "locations", "_instructions")

    def __init__(self, ordinal: int, name: str, descriptor: FunctionDescriptor,
                 signature: FunctionSignature, cconv: CConv, where: str = "",
                 bytecode: memoryview | None = None) -> None:
        self.ordinal = ordinal
        self.name = name
        self.descriptor = descriptor
        self.signature = signature
        self.cconv = cconv
        self.where = where
        self.bytecode = bytecode
        self.locations: dict[int, int] = {}
        self._instructions: list | None = None

    def __repr__(self) -> str:
        return f"Function({self.where or self.name!r}, ordinal {self.ordinal})"

    @property
    def instructions(self) -> list:
        if self._instructions is None:
            self._instructions = isa.decode_function(self.bytecode, self.where)
        return self._instructions

    @property
    def reflection(self) -> dict[str, str]:
        return self.signature.attrs


class Import(NamedTuple):
    ordinal: int
    full_name: str
    signature: FunctionSignature
    cconv: CConv
    optional: bool


class Export(NamedTuple):
    name: str
    internal_ordinal: int
    function: Function

    @property
    def cconv(self) -> CConv:
        return self.function.cconv

    @property
    def reflection(self) -> dict[str, str]:
        return self.function.signature.attrs


class BytecodeModule:
    """A loaded, verified bytecode module; instantiate it in a `vm.Context`."""

    def __init__(self, data: memoryview, module_def: ModuleDef, rodata: list[VMBuffer],
                 owner=None) -> None:
        self._data = data
        self._owner = owner  # keeps an mmap alive
        self.name = module_def.name
        self.version = module_def.version
        self.requirements = module_def.requirements
        self.attrs = module_def.attrs
        self.types = module_def.types
        self.dependencies: list[Dependency] = module_def.dependencies
        self.bytecode_version = module_def.bytecode_version
        self.global_bytes_capacity = module_def.global_bytes_capacity
        self.global_ref_count = module_def.global_ref_count
        self.rodata: list[VMBuffer] = rodata
        self.debug_database: DebugDatabase | None = module_def.debug_database
        self.functions: list[Function] = []
        self.imports: list[Import] = []
        self.exports: dict[str, Export] = {}
        self.program = None  # codegen.ModuleProgram

    def location_string(self, index: int, depth: int = 0) -> str | None:
        db = self.debug_database
        if db is None or not 0 <= index < len(db.location_table) or depth > 16:
            return None
        loc = db.location_table[index]
        if loc is None:
            return None
        kind = loc[0]
        if kind == "file":
            return f"{loc[1]}:{loc[2]}:{loc[3]}"
        if kind == "name":
            child = self.location_string(loc[2], depth + 1)
            return f'"{loc[1]}"' + (f"({child})" if child else "")
        if kind == "callsite":
            return self.location_string(loc[1], depth + 1)
        if kind == "fused":
            parts = [self.location_string(c, depth + 1) for c in loc[2][:4]]
            parts = [p for p in parts if p]
            return "; ".join(parts) if parts else None
        return None

    def source_location(self, function: Function, pc: int) -> str | None:
        if not function.locations:
            return None
        best = None
        for off, loc in function.locations.items():
            if off <= pc and (best is None or off > best[0]):
                best = (off, loc)
        if best is None:
            return None
        return self.location_string(best[1])

    def __repr__(self) -> str:
        return f"BytecodeModule({self.name!r}, {len(self.exports)} exports)"


def _split_container(buf: memoryview, size: int | None = None) -> tuple[memoryview, int]:
    """Returns (flatbuffer, rodata base offset) per IREE's archive layout. `size`: the
    whole file's, when `buf` is only its head (the FlatBuffer returned is then cut
    short)."""
    total = len(buf) if size is None else size
    if total >= 30 and struct.unpack_from("<I", buf, 0)[0] == ZIP_LOCAL_HEADER:
        name_len, extra_len = struct.unpack_from("<HH", buf, 26)
        start = 30 + name_len + extra_len
        if start > total:
            raise InvalidArgumentError(
                "archive self-reports as a zip but does not have enough data to contain "
                "a module"
            )
    else:
        start = 0
    if total - start < 16:
        raise InvalidArgumentError(
            f"FlatBuffer data is not present or less than 16 bytes ({total - start} total)"
        )
    prefix = struct.unpack_from("<I", buf, start)[0]
    remaining = total - start - 4
    if prefix > remaining:
        raise InvalidArgumentError(
            f"FlatBuffer length prefix out of bounds (prefix is {prefix} but only "
            f"{remaining} available)"
        )
    fb = buf[start + 4 : start + 4 + prefix]
    rodata_base = (start + 4 + prefix + SEGMENT_ALIGNMENT - 1) & ~(SEGMENT_ALIGNMENT - 1)
    return fb, rodata_base


def _origin(source) -> str:
    """How errors name where a module came from: its path, or `<bytes>`."""
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source) if isinstance(os.fspath(source), str) else repr(source)
    return "<bytes>"


def _check_type_name(name: str) -> None:
    """NOT_FOUND unless `name` is a value type or a registered ref type (as IREE)."""
    if not name:
        raise InvalidArgumentError("type definition has no name")
    if name in VALUE_TYPE_NAMES:
        return
    if name.startswith("!"):
        ref = "vm.list" if name[1:].startswith("vm.list") else name[1:]
        if ref in REGISTERED_REF_TYPES:
            return
    raise NotFoundError(f"no type registered with name {name!r}")


def read_module_file(path: str | os.PathLike, *, limit: int | None = None) -> memoryview:
    """The bytes of the regular file `path`, read into private 64-byte-aligned memory.

    What is returned belongs to the caller: no later write, truncation or deletion of the
    file reaches it. Only regular files are read (a FIFO, device or socket is refused at
    once, without blocking), so the time it takes is bounded by the file's size; a file
    that shrinks while being read is DATA_LOSS. `limit` bounds the size (OUT_OF_RANGE).
    """
    origin = os.fspath(path)
    fd, st = open_regular_file(path, "module file")
    try:
        size = st.st_size
        if limit is not None and size > limit:
            raise OutOfRangeError(f"{origin}: module file has {size} bytes, over the "
                                  f"limit of {limit}")
        # fresh zero pages a large file's read fills (a bytearray would first write
        # zeros over every page: ~10-20 ms more for MobileNetV2's 14 MB)
        view, _ = mapped_block(size, filled=True)
        got = 0
        while got < size:
            n = os.readv(fd, [view[got:]])
            if n == 0:
                raise DataLossError(f"{origin}: module file shrank while it was read "
                                    f"({got} of {size} bytes)")
            got += n
    except OSError as exc:
        raise InvalidArgumentError(f"{origin}: module file cannot be read: "
                                   f"{exc.strerror or exc}") from None
    finally:
        os.close(fd)
    return view.toreadonly()


# a ZIP local header with the longest name and extra field, the size prefix, and the
# FlatBuffer's root offset and file identifier
_MODULE_HEAD_BYTES = 30 + 2 * 0xFFFF + 4 + 8


def check_module_file(path: str | os.PathLike) -> None:
    """Refuses at once, reading only its head (at most ~128 KiB), a file that cannot be
    a module: no IREE FlatBuffer where the container puts one, or a size prefix past the
    file's end. A wrong multi-gigabyte file (an archive, a disk image, zeros) is then not
    read into memory before it is refused. INVALID_ARGUMENT naming the file."""
    origin = os.fspath(path)
    fd, st = open_regular_file(path, "module file")
    try:
        head = os.pread(fd, _MODULE_HEAD_BYTES, 0)
    except OSError as exc:
        raise InvalidArgumentError(f"{origin}: module file cannot be read: "
                                   f"{exc.strerror or exc}") from None
    finally:
        os.close(fd)
    hint = _source_text_hint(memoryview(head))
    try:
        flatbuffer, _ = _split_container(memoryview(head), st.st_size)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{origin}: not an IREE module: {exc.message}{hint}"
                                   ) from None
    if bytes(flatbuffer[4:8]) != b"IREE":
        raise InvalidArgumentError(f"{origin}: not an IREE module: its FlatBuffer's file "
                                   f"identifier is not 'IREE'{hint}")


def read_checked_module(path: str | os.PathLike) -> memoryview:
    """A module file's bytes (`read_module_file`), its head checked first
    (`check_module_file`): a wrong multi-gigabyte file is refused before it is read."""
    check_module_file(path)
    return read_module_file(path)


def _to_view(source, origin: str, mapped: bool = False) -> tuple[memoryview, object]:
    """A view of the module's bytes. A file is read into private memory unless `mapped`;
    then it is mapped privately (copy-on-write), zero-copy but not safe against later
    changes of the file (a truncation makes reads of the lost pages fault)."""
    if isinstance(source, (str, os.PathLike)):
        if not mapped:
            return read_checked_module(source), None
        try:
            with open(source, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    raise InvalidArgumentError(f"module file is not a regular file: {origin}")
                size = os.fstat(f.fileno()).st_size
                if size == 0:
                    return memoryview(b""), None
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        except FileNotFoundError:
            raise NotFoundError(f"module file not found: {origin}") from None
        except PermissionError:
            raise PermissionDeniedError(f"module file cannot be read: {origin}") from None
        except IsADirectoryError:
            raise InvalidArgumentError(f"module path is a directory: {origin}") from None
        except (OSError, ValueError) as exc:
            raise InvalidArgumentError(f"module file cannot be mapped: {origin}: {exc}"
                                       ) from None
        return memoryview(mm), mm
    if isinstance(source, memoryview):
        return source.cast("B") if source.format != "B" else source, None
    if isinstance(source, (bytes, bytearray)):
        return memoryview(source), None
    raise InvalidArgumentError(f"cannot load a module from {type(source).__name__}")


def load_module(source, *, mapped: bool = False) -> BytecodeModule:
    """Loads and verifies a `.vmfb` from a path, bytes, bytearray or memoryview.

    The returned module keeps zero-copy views of `source` (rodata buffers included);
    a bytearray passed in must not be mutated afterwards. A path is read into private
    memory (`read_module_file`), so the module owns its bytes; `mapped=True` maps it
    privately instead (zero-copy; the file must then not change while the module lives).
    Every error names the file (or `<bytes>`).
    """
    origin = _origin(source)
    view, owner = _to_view(source, origin, mapped)
    try:
        return _load(view, owner)
    except Error as exc:
        exc.message = f"{origin}: {exc.message}{_source_text_hint(view)}"
        raise
    except RecursionError:
        raise InvalidArgumentError(f"{origin}: module too deeply nested") from None
    except MemoryError:
        raise DataLossError(f"{origin}: corrupt module: implausible sizes") from None
    except SyntaxError as exc:  # pragma: no cover - generated code is ours
        raise InternalError(f"{origin}: code generation failed: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - a parse failure: the file is corrupt
        raise DataLossError(f"{origin}: corrupt module: {type(exc).__name__}: {exc}"
                            ) from None


def _source_text_hint(view: memoryview) -> str:
    """A hint when the bytes are MLIR source, the step before a module: a user passing
    `model.mlir` needs to compile it, not to read about FlatBuffer prefixes."""
    head = bytes(view[:512]).lstrip()
    if head.startswith((b"module", b"func.func", b"//", b"#", b"util.", b"hal.", b"vm.")):
        return ("; the file is MLIR source text, not a compiled module: compile it with "
                "iree-compile first (iree-compile model.mlir -o model.vmfb, see the README)")
    return ""


def _load(view: memoryview, owner) -> BytecodeModule:
    fb, rodata_base = _split_container(view)
    mdef = read_module_def(fb)
    if not mdef.name or not mdef.name.isprintable():
        raise InvalidArgumentError(f"module name {mdef.name!r} is empty or not printable")
    for name in mdef.types:
        _check_type_name(name)

    if mdef.bytecode_version != isa.BYTECODE_VERSION:
        major, minor = mdef.bytecode_version >> 16, mdef.bytecode_version & 0xFFFF
        raise IncompatibleError(
            f"bytecode version mismatch; runtime supports 17.0, module has {major}.{minor}"
        )
    unsupported = mdef.requirements & ~isa.SUPPORTED_FEATURES
    if unsupported:
        raise UnimplementedError(f"module requires unsupported features 0x{unsupported:X}")

    # Rodata segments, zero-copy.
    rodata: list[VMBuffer] = []
    for i, seg in enumerate(mdef.rodata_segments):
        if seg.compressed:
            raise UnimplementedError(f"rodata[{i}] uses an unsupported compression type")
        if seg.embedded is not None:
            head = seg.head.toreadonly() if seg.head is not None else None
            rodata.append(VMBuffer(seg.embedded.toreadonly(), False, head))
            continue
        off, length = seg.external_offset or 0, seg.external_length or 0
        avail = len(view)
        if rodata_base > avail or off > avail - rodata_base or length > avail - rodata_base - off:
            raise InvalidArgumentError(f"rodata[{i}] external reference out of range")
        start = rodata_base + off
        head = view[start - HEAD_BYTES : start].toreadonly() if start >= HEAD_BYTES else None
        rodata.append(VMBuffer(view[start : start + length].toreadonly(), False, head))

    if mdef.global_bytes_capacity < 0 or mdef.global_ref_count < 0:
        raise InvalidArgumentError("module state sizes are negative")
    if mdef.global_bytes_capacity > (1 << 30) or mdef.global_ref_count > (1 << 24):
        raise InvalidArgumentError(
            f"module state too large ({mdef.global_bytes_capacity} bytes, "
            f"{mdef.global_ref_count} refs)"
        )

    if len(mdef.function_signatures) != len(mdef.function_descriptors):
        raise InvalidArgumentError(
            "function signature and descriptor table length mismatch "
            f"({len(mdef.function_signatures)} vs {len(mdef.function_descriptors)})"
        )

    module = BytecodeModule(view, mdef, rodata, owner)
    bytecode = mdef.bytecode_data

    # Names of internal functions: exports first, then debug names, else ordinal.
    names: dict[int, str] = {}
    for e in mdef.exported_functions:
        if not 0 <= e.internal_ordinal < len(mdef.function_descriptors):
            raise InvalidArgumentError(
                f"export {e.local_name!r} internal_ordinal {e.internal_ordinal} out of bounds"
            )
        names.setdefault(e.internal_ordinal, e.local_name)
    # Source maps are meant to be 1:1 with the descriptors, but iree-compile 3.13.0 may
    # emit fewer (observed: only the last function's); then match them by name.
    source_maps: dict[int, object] = {}
    db = mdef.debug_database
    if db is not None:
        if len(db.functions) == len(mdef.function_descriptors):
            for i, fmap in enumerate(db.functions):
                source_maps[i] = fmap
                if fmap.local_name and i not in names:
                    names[i] = fmap.local_name
        else:
            by_name = {n: i for i, n in names.items()}
            for fmap in db.functions:
                if fmap.local_name in by_name:
                    source_maps[by_name[fmap.local_name]] = fmap

    for i, (desc, sig) in enumerate(zip(mdef.function_descriptors, mdef.function_signatures)):
        fname = names.get(i, f"function#{i}")
        where = f"{mdef.name}.{fname}"
        if desc.block_count <= 0:
            raise InvalidArgumentError(f"{where}: descriptor block count is {desc.block_count}")
        if desc.bytecode_length <= 0:
            raise InvalidArgumentError(f"{where}: descriptor bytecode length is 0")
        if desc.bytecode_offset < 0 or desc.bytecode_offset + desc.bytecode_length > len(bytecode):
            raise InvalidArgumentError(
                f"{where}: descriptor bytecode span out of range "
                f"({desc.bytecode_offset}+{desc.bytecode_length} > {len(bytecode)})"
            )
        if not 0 <= desc.i32_register_count <= MAX_REGISTERS or not (
            0 <= desc.ref_register_count <= MAX_REGISTERS
        ):
            raise InvalidArgumentError(f"{where}: descriptor register count out of range")
        unsupported = desc.requirements & ~isa.SUPPORTED_FEATURES
        if unsupported:
            raise UnimplementedError(f"{where} requires unsupported features 0x{unsupported:X}")
        cconv = parse_cconv(sig.calling_convention, where)
        if cconv.is_variadic:
            raise InvalidArgumentError(f"{where}: internal functions cannot be variadic")
        span = bytecode[desc.bytecode_offset : desc.bytecode_offset + desc.bytecode_length]
        fn = Function(i, fname, desc, sig, cconv, where, span)
        if i in source_maps:
            fn.locations = dict(source_maps[i].locations)
        module.functions.append(fn)

    for i, imp in enumerate(mdef.imported_functions):
        module.imports.append(
            Import(i, imp.full_name, imp.signature,
                   parse_cconv(imp.signature.calling_convention, imp.full_name), imp.optional)
        )

    for e in mdef.exported_functions:
        fn = module.functions[e.internal_ordinal]
        if e.local_name in module.exports:
            raise InvalidArgumentError(f"duplicate export {e.local_name!r}")
        module.exports[e.local_name] = Export(e.local_name, e.internal_ordinal, fn)

    from .translation_cache import translate

    module.program = translate(module, fb, _translate)
    return module


def _translate(module: BytecodeModule) -> object:
    """Verifies the functions' bytecode, then translates it (a `codegen.ModuleProgram`):
    only on a translation-cache miss, since an entry was verified when it was written."""
    from . import codegen
    from .verifier import verify_module

    verified = verify_module(module)
    try:
        return codegen.generate_module(module, verified)
    except (Error, MemoryError, RecursionError):
        raise
    except Exception as exc:
        raise InternalError(
            f"translating verified bytecode failed ({type(exc).__name__}: {exc}); the "
            "module passed verification, so this is a tinyhal bug: please report it"
        ) from exc

"""Executables: libraries with IREE's executable-library ABI (version 6), loaded with cffi.

Every library is first validated in full by `elf.parse_elf` (header, segments, dynamic
section, relocations, symbols), so no loader ever sees bytes it cannot trust. A
self-contained library (IREE's llvm-cpu output, embedded or system ELF: no imports, no
initializers) is then loaded by `elf.MappedImage`, as IREE's own loader does, and glibc
never reads it; one that needs the dynamic loader (host kernels built by a C compiler) goes
into a memfd (unique per load, so glibc's by-path cache never returns a stale library) and
is `dlopen`ed. The query function's library table and every pointer read from it (export
functions, names, attributes) are checked to lie inside the library's own image.
A `PreparedDispatch` packs one dispatch's state into C memory once; running it calls the
C workgroup loop, which may run on several threads at once over one grid.

Other executable formats plug in as IREE's local devices take executable loaders: a
layer above registers an `ExecutableLoader` (format name, a test on the bytes, a
factory returning an `Executable` subclass whose `dispatch_function` is a C callable of
the same ABI), so streams, drivers and profiles run it like a library. `vmvx-bytecode-fb`
(`tinyhal.vm.vmvx`) is the one there is. An executable policy (`EXECUTABLE_POLICIES`)
says which formats a device accepts: `"portable"` refuses every format that carries
machine code.
"""

from __future__ import annotations

import ctypes
import os
from _blake2 import blake2b  # hashlib would load OpenSSL (3.5 MiB) at start-up
from collections.abc import Callable
from typing import Any, NamedTuple

from ..errors import (
    DataLossError,
    Error,
    InternalError,
    InvalidArgumentError,
    KernelFaultError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnimplementedError,
    error_for_code,
)
from .cpu import PROCESSOR_DATA
from .elf import PF_X, QUERY_SYMBOL, ElfLibrary, MappedImage, parse_elf
from .native import ffi, lib

LOCAL_MEMORY_PAGE_SIZE = 4096
MAX_CONSTANTS = 64
MAX_BINDINGS = 64
MAX_WORKGROUP_COUNT_Z = 0xFFFF

LIBRARY_VERSION = 6
HOST_ARCH = {"x86_64": "x86_64", "AMD64": "x86_64", "aarch64": "arm_64",
             "arm64": "arm_64"}.get(os.uname().machine, os.uname().machine)
FORMATS = (f"embedded-elf-{HOST_ARCH}", f"system-elf-{HOST_ARCH}")
EXECUTABLE_POLICIES = ("any", "portable")
"""`any`: every format tinyhal loads; `portable`: only formats without machine code."""


class ExecutableLoader(NamedTuple):
    """A loader for one executable format besides the ELF libraries (see the module
    docstring); `native_code` says whether its executables run machine code."""

    format: str
    recognizes: Callable[[bytes], bool]
    load: Callable[[bytes, str], Executable]
    native_code: bool = False


_LOADERS: dict[str, ExecutableLoader] = {}


def register_executable_loader(loader: ExecutableLoader) -> None:
    """Makes `loader.format` loadable by every device (idempotent per format)."""
    _LOADERS[loader.format] = loader


def executable_formats(policy: str = "any") -> tuple[str, ...]:
    """The formats a device with executable policy `policy` loads."""
    registered = tuple(f for f, loader in _LOADERS.items()
                       if policy == "any" or not loader.native_code)
    return (FORMATS if policy == "any" else ()) + registered


def check_executable_policy(policy: Any) -> str:
    if policy not in EXECUTABLE_POLICIES:
        raise InvalidArgumentError(
            f"executable_policy must be one of {EXECUTABLE_POLICIES}, not {policy!r}")
    return policy


def load_executable_data(data: bytes, name: str = "", policy: str = "any") -> Executable:
    """An executable of whichever format `data` holds (ELF, or a registered loader's),
    refused with PERMISSION_DENIED when it carries machine code and `policy` is
    `"portable"`."""
    if data[:4] != b"\x7fELF":
        for loader in _LOADERS.values():
            if loader.recognizes(data):
                if loader.native_code and policy != "any":
                    raise _refused(data, name, loader.format, policy)
                return loader.load(data, name)
        if data[:4] == b"PK\x03\x04" or data[4:8] == b"IREE":
            raise UnimplementedError(
                "the executable is a VM bytecode module (VMVX, vmvx-bytecode-fb); its "
                "loader is registered when tinyhal.vm is imported")
    if policy != "any":
        raise _refused(data, name, "ELF executable library", policy)
    return Executable(data, name)


def _refused(data: bytes, name: str, kind: str, policy: str) -> PermissionDeniedError:
    what = (f"executable {name!r}" if name else
            f"executable {blake2b(data, digest_size=32).hexdigest()[:12]}")
    return PermissionDeniedError(
        f"{what} ({kind}) carries native machine code, which the device's executable "
        f"policy {policy!r} refuses; it loads only {', '.join(executable_formats(policy))}"
        " (compile with --iree-hal-local-target-device-backends=vmvx)")


class ExportInfo:
    """What the library declares about one export. (A plain class with slots: defined at
    every start-up, which a dataclass makes slower, and read per dispatch recorded.)"""

    __slots__ = ("ordinal", "name", "workgroup_size", "constant_count", "binding_count",
                 "local_memory_size", "flags", "tag", "source_location")

    def __init__(self, ordinal: int, name: str, workgroup_size: tuple[int, int, int],
                 constant_count: int | None, binding_count: int | None,
                 local_memory_size: int, flags: int, tag: str,
                 source_location: tuple[str, int] | None = None) -> None:
        self.ordinal = ordinal
        self.name = name
        self.workgroup_size = workgroup_size
        self.constant_count = constant_count
        self.binding_count = binding_count
        self.local_memory_size = local_memory_size
        self.flags = flags
        self.tag = tag
        self.source_location = source_location  # (path, line) the compiler wrote

    def __repr__(self) -> str:
        return f"ExportInfo({self.ordinal}, {self.name!r})"


# Kernel status for a contained fault: FAULT_STATUS - signal number (dispatch.c).
FAULT_STATUS = -1000


def _query_contained(query: Any, environment: Any, what: str) -> Any:
    """Calls the library query under the fault trap (installed by the first load; the
    C installer does nothing on later calls)."""
    rc = lib.tinyhal_install_fault_handler()
    if rc:
        raise InternalError(f"cannot install the kernel fault handler: {os.strerror(rc)}")
    fault = ffi.new("int*")
    header = lib.tinyhal_library_query_contained(query, LIBRARY_VERSION, environment, fault)
    if fault[0]:
        raise KernelFaultError(
            f"{what}: the library query faulted: {fault_description(fault[0], None)}")
    return header


def fault_description(signal_number: int, executable: Executable | None) -> str:
    """`"SIGSEGV at +0x1f40 in executable 'x', address 0x0 (...)"`, from the last contained
    fault (process-wide: with two faults at once the addresses may be the other's)."""
    import signal

    info = ffi.new("uint64_t[3]")
    lib.tinyhal_last_fault_info(info)
    try:
        name = signal.Signals(signal_number).name
    except ValueError:
        name = f"signal {signal_number}"
    pc, address = info[1], info[2]
    where = f"pc 0x{pc:x}"
    if executable is not None:
        where = executable.describe_address(pc)
    return (f"{name} at {where}, address 0x{address:x} (corrupt machine code, or a kernel "
            "touching memory it does not own)")


_QUERY_FN = "const tinyhal_library_header_t** (*)(uint32_t, const tinyhal_environment_t*)"
_MAX_EXPORTS = 1 << 16
_MAX_STRING = 4096
_libc = ctypes.CDLL(None)
_dlsym = _libc.dlsym
_dlsym.restype = ctypes.c_void_p
_dlsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p]


def _address(pointer: Any) -> int:
    return int(ffi.cast("uintptr_t", pointer))


def _in_regions(pointer: Any, size: int, regions: list[tuple[int, int, int]],
                executable: bool = False) -> bool:
    at = _address(pointer)
    for start, end, flags in regions:
        if start <= at and at + size <= end:
            return not executable or bool(flags & PF_X)
    return False


def _check_array(pointer: Any, ctype: str, count: int, regions: list[tuple[int, int, int]],
                 what: str, required: bool = False) -> None:
    if pointer == ffi.NULL:
        if required and count:
            raise DataLossError(f"{what} is missing")
        return
    if count and not _in_regions(pointer, ffi.sizeof(ctype) * count, regions):
        raise DataLossError(f"{what} ({count} entries) lies outside the library image")


# iree_hal_executable_source_location_v0_t: {uint32 line; uint32 path_length; char* path}
_SOURCE_LOCATION_SIZE = 16


def _source_locations(pointer: Any, count: int, regions: list[tuple[int, int, int]],
                      what: str) -> list[tuple[str, int] | None]:
    """Each export's source location as the library declares it (IREE writes one per
    export at `--iree-hal-executable-debug-level` 1 and up: the file and line of the
    export in the source the compiler last saw, a dumped executable when dumps are
    asked for), None where the path is empty."""
    if count and not _in_regions(pointer, _SOURCE_LOCATION_SIZE * count, regions):
        raise DataLossError(f"{what}: export source locations lie outside the library image")
    base = ffi.cast("uint8_t*", pointer)
    locations: list[tuple[str, int] | None] = []
    for i in range(count):
        entry = base + i * _SOURCE_LOCATION_SIZE
        line = ffi.cast("uint32_t*", entry)[0]
        path_pointer = ffi.cast("char**", entry + 8)[0]
        path = (_checked_string(path_pointer, regions, f"{what}: export {i} source path")
                if path_pointer != ffi.NULL else "")
        locations.append((path, int(line)) if path else None)
    return locations


def _checked_string(pointer: Any, regions: list[tuple[int, int, int]], what: str) -> str:
    at = _address(pointer)
    for start, end, _ in regions:
        if start <= at < end:
            raw = ffi.buffer(ffi.cast("char*", pointer), min(end - at, _MAX_STRING))[:]
            nul = raw.find(b"\0")
            if nul < 0:
                raise DataLossError(f"{what} is not NUL-terminated inside the library image")
            try:
                return raw[:nul].decode()
            except UnicodeDecodeError:
                raise DataLossError(f"{what} is not UTF-8") from None
    raise DataLossError(f"{what} lies outside the library image")


def _checked_library(header: Any, regions: list[tuple[int, int, int]], what: str) -> Any:
    """The library the query returned, checked to be version 6 and inside the image."""
    if header == ffi.NULL:
        raise InvalidArgumentError(
            f"{what}: library does not provide executable-library version {LIBRARY_VERSION}"
        )
    if not _in_regions(header, ffi.sizeof("tinyhal_library_t"), regions):
        raise DataLossError(f"{what}: library table lies outside the library image")
    library = ffi.cast("const tinyhal_library_t*", header)
    if not _in_regions(library.header, ffi.sizeof("tinyhal_library_header_t"), regions):
        raise DataLossError(f"{what}: library header lies outside the library image")
    if library.header.version != LIBRARY_VERSION:
        raise InvalidArgumentError(
            f"{what}: library version {library.header.version}, tinyhal loads "
            f"{LIBRARY_VERSION}"
        )
    imports = library.imports
    if imports.count > _MAX_EXPORTS:
        raise DataLossError(f"{what}: implausible import count {imports.count}")
    _check_array(imports.symbols, "char*", imports.count, regions, f"{what}: import table",
                 True)
    for i in range(imports.count):
        _checked_string(imports.symbols[i], regions, f"{what}: import {i}")
    return library


class Executable:
    """A loaded executable library and its exports."""

    def __init__(self, data: bytes, name: str = "") -> None:
        data = bytes(data)
        self.name = name
        self.digest = blake2b(data, digest_size=32).hexdigest()
        what = f"executable {name!r}" if name else f"executable {self.digest[:12]}"
        elf = parse_elf(data, what)
        self.format = FORMATS[1] if elf.is_system else FORMATS[0]
        self._fd = -1
        self._handle = ffi.NULL
        self._image: MappedImage | None = None
        self._what = what
        self._regions: list[tuple[int, int, int]] = []
        try:
            self._environment = ffi.new("tinyhal_environment_t*")
            self._environment.processor_data = PROCESSOR_DATA
            if elf.self_contained:
                self._image = MappedImage(elf, data)
                query = ffi.cast(_QUERY_FN, self._image.query_address)
                bias = self._image.bias
            else:
                query, bias = self._dlopen(data, elf, what)
            regions = [(bias + s.vaddr, bias + s.end, s.flags) for s in elf.segments]
            self._regions = regions
            header = _query_contained(query, self._environment, what)
            self._library = _checked_library(header, regions, what)
            if not name:
                try:
                    library_name = _checked_string(self._library.header.name, regions, what)
                    self._what = f"executable {library_name!r}"
                except DataLossError:
                    pass  # the digest names it
            self._bind_imports()
            self.exports = self._read_exports(regions, what)
        except BaseException:
            self.close()
            raise
        self.export_names = [e.name for e in self.exports]
        self._templates: dict[tuple, _DispatchTemplate] = {}
        self._by_name = {e.name: e.ordinal for e in self.exports}

    @property
    def environment(self) -> Any:
        """The `tinyhal_environment_t*` every dispatch function of this executable gets."""
        return self._environment

    def dispatch_function(self, ordinal: int) -> Any:
        """The C dispatch function (IREE's ABI) of export `ordinal`."""
        return self._library.exports.ptrs[ordinal]

    def dispatch_environment(self, ordinal: int) -> Any:
        """The `tinyhal_environment_t*` export `ordinal`'s dispatch function is called
        with: the executable's `environment`, unless an executable gives an export one of
        its own (a VMVX export run natively finds its program by it)."""
        return self.environment

    def failure_detail(self) -> str:
        """Why the last failed dispatch failed, when the executable can say more than its
        status code (an executable of VM bytecode can); empty for machine code."""
        return ""

    def _dlopen(self, data: bytes, elf: ElfLibrary, what: str) -> tuple[Any, int]:
        """Loads a validated library that needs the dynamic loader; (query, load bias)."""
        self._fd = os.memfd_create(f"tinyhal-{self.name or self.digest[:12]}", os.MFD_CLOEXEC)
        os.write(self._fd, data)
        err = ffi.new("char[]", 512)
        self._handle = lib.tinyhal_library_open(f"/proc/self/fd/{self._fd}".encode(), err, 512)
        if self._handle == ffi.NULL:
            raise DataLossError(f"{what} could not be loaded: {ffi.string(err).decode()}")
        address = _dlsym(_address(self._handle), QUERY_SYMBOL.encode())
        if not address:
            raise InvalidArgumentError(f"{what} exports no {QUERY_SYMBOL}")
        return ffi.cast(_QUERY_FN, address), address - elf.query_value

    def __repr__(self) -> str:
        return f"<Executable {self.name or self.digest[:12]} {self.format} {self.export_names}>"

    def describe_address(self, address: int) -> str:
        """`+0x1f40 in executable 'x'` for an address inside its image, else the address."""
        regions = self._regions
        if regions and any(lo <= address < hi for lo, hi, _ in regions):
            return f"+0x{address - min(lo for lo, _, _ in regions):x} in {self._what}"
        return f"pc 0x{address:x} (outside the executable)"

    def _bind_imports(self) -> None:
        imports = self._library.imports
        if imports.count == 0:
            return
        missing = []
        for i in range(imports.count):
            symbol = ffi.string(imports.symbols[i]).decode(errors="replace")
            if not symbol.startswith("?"):
                missing.append(symbol)
        if missing:
            raise UnimplementedError(
                f"executable imports host functions tinyhal does not provide: {missing}"
            )
        self._import_funcs = ffi.new("tinyhal_import_fn_t[]", imports.count)
        self._import_contexts = ffi.new("void*[]", imports.count)
        self._environment.import_thunk = lib.tinyhal_import_thunk()
        self._environment.import_funcs = self._import_funcs
        self._environment.import_contexts = ffi.cast("const void**", self._import_contexts)

    def _read_exports(self, regions: list[tuple[int, int, int]], what: str
                      ) -> list[ExportInfo]:
        """The export table, every pointer checked to lie in the library's own image."""
        table = self._library.exports
        count = table.count
        if count > _MAX_EXPORTS:
            raise DataLossError(f"{what}: implausible export count {count}")
        _check_array(table.ptrs, "void*", count, regions, f"{what}: export table", True)
        _check_array(table.names, "char*", count, regions, f"{what}: export names")
        _check_array(table.tags, "char*", count, regions, f"{what}: export tags")
        _check_array(table.attrs, "tinyhal_dispatch_attrs_t", count, regions,
                     f"{what}: export attributes")
        exports = []
        for i in range(count):
            name = (_checked_string(table.names[i], regions, f"{what}: export {i} name")
                    if table.names != ffi.NULL else str(i))
            tag = (_checked_string(table.tags[i], regions, f"{what}: export {name!r} tag")
                   if table.tags != ffi.NULL and table.tags[i] != ffi.NULL else "")
            if not _in_regions(table.ptrs[i], 1, regions, executable=True):
                raise DataLossError(
                    f"{what}: export {name!r} dispatch function is not in executable code"
                )
            if table.attrs != ffi.NULL:
                a = table.attrs[i]
                size = (a.workgroup_size_x or 1, a.workgroup_size_y or 1, a.workgroup_size_z or 1)
                info = ExportInfo(i, name, size, a.constant_count, a.binding_count,
                                  a.local_memory_pages * LOCAL_MEMORY_PAGE_SIZE, a.flags, tag)
            else:
                info = ExportInfo(i, name, (1, 1, 1), None, None, 0, 0, tag)
            exports.append(info)
        if table.source_locations != ffi.NULL:
            for export, location in zip(exports, _source_locations(
                    table.source_locations, count, regions, what)):
                export.source_location = location
        return exports

    def lookup(self, name: str) -> int:
        """The ordinal of the export called `name`; NOT_FOUND names the exports there are."""
        try:
            return self._by_name[name]
        except KeyError:
            raise NotFoundError(
                f"{self!r} has no export {name!r}; exports: {self.export_names}"
            ) from None

    def resolve_entry(self, entry: int | str) -> int:
        if isinstance(entry, str):
            return self.lookup(entry)
        if not isinstance(entry, int) or not 0 <= entry < len(self.exports):
            raise NotFoundError(
                f"export ordinal {entry!r} is out of range for {self!r} "
                f"({len(self.exports)} exports)"
            )
        return entry

    def prepare_dispatch(
        self,
        ordinal: int,
        workgroups: tuple[int, int, int],
        constants: Any,
        binding_ptrs: list[int],
        binding_lengths: list[int],
        max_concurrency: int = 1,
    ) -> PreparedDispatch:
        """Packs one dispatch into C memory (validated by the caller).

        The parts that recur across submissions (state fields, constants) come from a
        per-executable template cache; only binding addresses are new each time.
        """
        key = (ordinal, workgroups, constants, max_concurrency)
        template = self._templates.get(key)
        if template is None:
            if len(self._templates) >= _TEMPLATE_CACHE_SIZE:
                self._templates.clear()
            template = self._templates[key] = _DispatchTemplate(
                self, ordinal, workgroups, constants, max_concurrency)
        return PreparedDispatch(template, binding_ptrs, binding_lengths)

    def close(self) -> None:
        if getattr(self, "_handle", ffi.NULL) != ffi.NULL:
            lib.tinyhal_library_close(self._handle)
            self._handle = ffi.NULL
        if getattr(self, "_image", None) is not None:
            self._image.close()
            self._image = None
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


_TEMPLATE_CACHE_SIZE = 256


class _DispatchTemplate:
    """The submission-independent C state of a dispatch: copied, then patched, per run."""

    __slots__ = ("executable", "export", "total", "state", "consts", "function", "environment",
                 "local_memory_size")

    def __init__(self, executable: Executable, ordinal: int, workgroups: tuple[int, int, int],
                 constants: Any, max_concurrency: int) -> None:
        export = executable.exports[ordinal]
        x, y, z = workgroups
        self.executable = executable
        self.export = export
        self.total = x * y * z
        self.consts = ffi.new("uint32_t[]", list(constants) or [0])
        state = self.state = ffi.new("tinyhal_dispatch_state_t*")
        state.workgroup_size_x, state.workgroup_size_y, state.workgroup_size_z = (
            export.workgroup_size
        )
        state.constant_count = len(constants)
        state.workgroup_count_x, state.workgroup_count_y, state.workgroup_count_z = x, y, z
        state.max_concurrency = max(1, min(255, max_concurrency))
        state.constants = self.consts
        self.function = executable.dispatch_function(ordinal)
        self.environment = executable.dispatch_environment(ordinal)
        self.local_memory_size = export.local_memory_size


class PreparedDispatch:
    """One dispatch's C-side state; `run` may be called by several threads at once.

    What a native stream reads is public: `function`, `environment`, `state` (the
    `tinyhal_dispatch_state_t*`), `local_memory_size`, `total` (workgroups), and the
    `binding_addresses` / `binding_lengths` arrays `state` points at, which a recorded
    stream patches in place for each execution.
    """

    __slots__ = ("executable", "export", "total", "function", "environment", "state",
                 "local_memory_size", "binding_addresses", "binding_lengths", "_template",
                 "_cursor", "_abort", "_failed", "_control")

    def __init__(self, template: _DispatchTemplate, binding_ptrs: list[int],
                 binding_lengths: list[int]) -> None:
        self.executable = template.executable
        self.export = template.export
        self.total = template.total
        self._template = template  # keeps the constants alive
        self.binding_addresses = ffi.new("uint64_t[]", binding_ptrs or [0])
        self.binding_lengths = ffi.new("size_t[]", binding_lengths or [0])
        state = self.state = ffi.new("tinyhal_dispatch_state_t*", template.state[0])
        state.binding_count = len(binding_ptrs)
        state.binding_ptrs = ffi.cast("void* const*", self.binding_addresses)
        state.binding_lengths = self.binding_lengths
        control = self._control = ffi.new("uint64_t[3]")  # cursor, failed workgroup, abort
        self.function = template.function
        self.environment = template.environment
        self.local_memory_size = template.local_memory_size
        self._cursor = control
        self._failed = control + 1
        self._abort = ffi.cast("int*", control + 2)

    def run(self, processor_id: int = 0, tile: int = 0) -> int:
        """Runs workgroups until the grid is exhausted; returns the kernel status (0 = ok).

        Threads calling `run` concurrently share the grid, each claiming `tile` workgroups
        at a time (0 = the whole grid at once).
        """
        return lib.tinyhal_dispatch_workgroups(
            self.function, self.environment, self.state, self.local_memory_size,
            processor_id, self._cursor, tile or self.total, self.total, self._abort,
            self._failed)

    def raise_for_status(self, rc: int) -> None:
        if rc != 0:
            raise self.error_for(rc, self._failed[0])

    def error_for(self, rc: int, failed_index: int) -> Error:
        """The error for kernel status `rc` in linear workgroup `failed_index`."""
        if rc == -12:
            return ResourceExhaustedError(
                f"no memory for {self.local_memory_size} bytes of workgroup local memory"
            )
        state = self.state
        cx, cy = state.workgroup_count_x, state.workgroup_count_y
        wid = (failed_index % cx, (failed_index // cx) % cy, failed_index // (cx * cy))
        if rc <= FAULT_STATUS:
            return KernelFaultError(
                f"dispatch of {self.export.name!r} faulted in workgroup {wid}: "
                f"{fault_description(-rc + FAULT_STATUS, self.executable)}")
        message = (f"dispatch of {self.export.name!r} failed in workgroup {wid} "
                   f"with kernel status {rc}")
        detail = self.executable.failure_detail()
        if detail:
            message = f"{message}: {detail}"
        return error_for_code(rc, message) if 0 < rc < 32 else InternalError(message)


def validate_workgroups(workgroups: Any) -> tuple[int, int, int]:
    try:
        x, y, z = (int(v) for v in workgroups)
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"workgroups must be three ints (x, y, z), not {workgroups!r}"
        ) from None
    if min(x, y, z) < 0 or max(x, y) > 0xFFFFFFFF or z > MAX_WORKGROUP_COUNT_Z:
        raise OutOfRangeError(
            f"workgroup count {(x, y, z)} out of range (x, y < 2**32, z <= {MAX_WORKGROUP_COUNT_Z})"
        )
    return x, y, z

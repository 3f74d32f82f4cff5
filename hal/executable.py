"""Executables: dylibs with IREE's executable-library ABI (version 6), loaded with cffi.

IREE's llvm-cpu output (embedded or system ELF) and kernels host apps build against
`tinyhal_executable.h` load the same way: the bytes go into a memfd (unique per load, so
glibc's by-path cache never returns a stale library), are checked as a well-formed ELF for
this machine, then `dlopen`ed; the library's query function yields the export table.
A `PreparedDispatch` packs one dispatch's state into C memory once; running it calls the
C workgroup loop, which may run on several threads at once over one grid.
"""

from __future__ import annotations

import hashlib
import os
import platform
import struct
from dataclasses import dataclass
from typing import Any

from ..errors import (
    DataLossError,
    Error,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    ResourceExhaustedError,
    UnimplementedError,
    error_for_code,
)
from .native import ffi, lib

LOCAL_MEMORY_PAGE_SIZE = 4096
MAX_CONSTANTS = 64
MAX_BINDINGS = 64
MAX_WORKGROUP_COUNT_Z = 0xFFFF

_MACHINES = {"x86_64": (62, "x86_64"), "AMD64": (62, "x86_64"), "aarch64": (183, "arm_64"),
             "arm64": (183, "arm_64")}
_HOST_MACHINE, HOST_ARCH = _MACHINES.get(platform.machine(), (None, platform.machine()))
FORMATS = (f"embedded-elf-{HOST_ARCH}", f"system-elf-{HOST_ARCH}")


@dataclass(frozen=True)
class ExportInfo:
    """What the library declares about one export."""

    ordinal: int
    name: str
    workgroup_size: tuple[int, int, int]
    constant_count: int | None
    binding_count: int | None
    local_memory_size: int
    flags: int
    tag: str


def _check_elf(data: bytes) -> str:
    """Validates the ELF header and segment table; returns the executable format name."""
    if len(data) < 4 or data[:4] != b"\x7fELF":
        raise InvalidArgumentError(
            "executable data is not an ELF library (bad magic); formats supported: "
            + ", ".join(FORMATS)
        )
    if len(data) < 64:
        raise DataLossError(f"ELF executable is truncated: {len(data)} bytes, header needs 64")
    if data[4] != 2 or data[5] != 1:
        raise InvalidArgumentError("ELF executable is not 64-bit little-endian")
    e_type, e_machine = struct.unpack_from("<HH", data, 16)
    if e_machine != _HOST_MACHINE:
        raise InvalidArgumentError(
            f"ELF executable is for machine {e_machine}, this host is {platform.machine()}"
        )
    if e_type != 3:
        raise InvalidArgumentError(f"ELF executable is not a shared object (e_type={e_type})")
    e_phoff, e_shoff = struct.unpack_from("<QQ", data, 32)
    e_phentsize, e_phnum, e_shentsize, e_shnum = struct.unpack_from("<HHHH", data, 54)
    if e_phentsize < 56 or e_phoff + e_phnum * e_phentsize > len(data):
        raise DataLossError("ELF executable is truncated: program headers run past the end")
    if e_shnum and e_shoff + e_shnum * e_shentsize > len(data):
        raise DataLossError("ELF executable is truncated: section headers run past the end")
    system = False
    for i in range(e_phnum):
        p_type, _, p_offset, _, _, p_filesz, _, _ = struct.unpack_from(
            "<IIQQQQQQ", data, e_phoff + i * e_phentsize
        )
        if p_type in (1, 2) and p_offset + p_filesz > len(data):
            raise DataLossError(
                f"ELF executable is truncated: segment {i} needs bytes up to "
                f"{p_offset + p_filesz}, file has {len(data)}"
            )
        if p_type == 2:
            for j in range(p_offset, p_offset + p_filesz - 15, 16):
                tag = struct.unpack_from("<q", data, j)[0]
                if tag == 0:
                    break
                if tag in (1, 0x6FFFFEF5):  # DT_NEEDED, DT_GNU_HASH: a system linker's output
                    system = True
    return FORMATS[1] if system else FORMATS[0]


class Executable:
    """A loaded executable library and its exports."""

    def __init__(self, data: bytes, name: str = "") -> None:
        data = bytes(data)
        self.format = _check_elf(data)
        self.name = name
        self.digest = hashlib.sha256(data).hexdigest()
        self._fd = os.memfd_create(f"tinyhal-{name or self.digest[:12]}", os.MFD_CLOEXEC)
        self._handle = ffi.NULL
        try:
            os.write(self._fd, data)
            err = ffi.new("char[]", 512)
            self._handle = lib.tinyhal_library_open(f"/proc/self/fd/{self._fd}".encode(), err, 512)
            if self._handle == ffi.NULL:
                raise DataLossError(f"executable could not be loaded: {ffi.string(err).decode()}")
            self._environment = ffi.new("tinyhal_environment_t*")
            self._library = lib.tinyhal_library_query(self._handle, self._environment, err, 512)
            if self._library == ffi.NULL:
                raise InvalidArgumentError(
                    f"executable is not an executable library: {ffi.string(err).decode()}"
                )
            self._bind_imports()
            self.exports = self._read_exports()
        except BaseException:
            self.close()
            raise
        self.export_names = [e.name for e in self.exports]
        self._templates: dict[tuple, _DispatchTemplate] = {}
        self._by_name = {e.name: e.ordinal for e in self.exports}

    def __repr__(self) -> str:
        return f"<Executable {self.name or self.digest[:12]} {self.format} {self.export_names}>"

    def _bind_imports(self) -> None:
        imports = self._library.imports
        if imports.count == 0:
            return
        missing = []
        for i in range(imports.count):
            symbol = ffi.string(imports.symbols[i]).decode()
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

    def _read_exports(self) -> list[ExportInfo]:
        table = self._library.exports
        exports = []
        for i in range(table.count):
            name = ffi.string(table.names[i]).decode() if table.names != ffi.NULL else str(i)
            tag = (
                ffi.string(table.tags[i]).decode()
                if table.tags != ffi.NULL and table.tags[i] != ffi.NULL
                else ""
            )
            if table.ptrs[i] == ffi.NULL:
                raise InvalidArgumentError(f"export {name!r} has no dispatch function")
            if table.attrs != ffi.NULL:
                a = table.attrs[i]
                size = (a.workgroup_size_x or 1, a.workgroup_size_y or 1, a.workgroup_size_z or 1)
                info = ExportInfo(i, name, size, a.constant_count, a.binding_count,
                                  a.local_memory_pages * LOCAL_MEMORY_PAGE_SIZE, a.flags, tag)
            else:
                info = ExportInfo(i, name, (1, 1, 1), None, None, 0, 0, tag)
            exports.append(info)
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
        self.function = executable._library.exports.ptrs[ordinal]
        self.environment = executable._environment
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
        message = (f"dispatch of {self.export.name!r} failed in workgroup {wid} "
                   f"with kernel status {rc}")
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

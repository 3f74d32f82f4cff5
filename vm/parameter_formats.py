"""Parameter indexes: which named parameters a file (or host memory) holds, and where.

Programs compiled with external parameters (`#stream.parameter.named<"scope"::"key">`
globals) ask the `io_parameters` module for them by scope and key; a `ParameterIndex`
answers for one scope. Its entries come from parameter files, read here from each
format's own layout, as IREE's `runtime/src/iree/io/formats/` reads them:

- `.irpa` (IREE parameter archive): a 16-byte-aligned header chain; per header an entry
  table of data entries (a range of the storage segment) and splat entries (a pattern
  of up to 16 bytes repeated over a length, no storage);
- `.safetensors`: a little-endian u64 header length, a JSON object mapping each tensor
  name to its `data_offsets` in the data that follows (`__metadata__` skipped);
- `.gguf` (versions 2 and 3): metadata key/values (only `general.alignment` matters),
  then tensor infos whose storage size follows from the GGML type's block size.

The format is chosen by the file's extension (case-insensitive), or `format=`.

Where an entry's bytes live is its `ParameterSource`. The contract that keeps a process
alive whatever happens to a file later: a regular file is never memory-mapped (a file
truncated under a mapping kills the process with SIGBUS on the next touch). It is read
with `pread` into device memory when a program loads a parameter (`mode="file"`, the
default; a file that shrank since it was opened gives DATA_LOSS naming the parameter) or
copied once into private memory when the index is built (`mode="preload"`). Parameters
are used in place, without a copy, only where that is safe: private memory (preloaded
files, arrays added with `add_buffer`) and memfds sealed against shrinking and writing,
which the kernel guarantees never change, are imported zero-copy by `io_parameters.load`.
"""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import (
    DataLossError,
    Error,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    UnimplementedError,
)
from ..hal.buffer import ALIGNMENT
from .files import open_regular_file

__all__ = [
    "FileSource",
    "MemorySource",
    "ParameterEntry",
    "ParameterIndex",
    "ParameterSource",
    "PARAMETER_FORMATS",
]

PARAMETER_FORMATS = ("irpa", "safetensors", "gguf")
MODES = ("file", "preload")
MAX_SPLAT_PATTERN = 16


# -- where the bytes are ---------------------------------------------------------------


class ParameterSource:
    """A store of parameter bytes addressed by offset: a file or host memory."""

    name: str
    size: int
    readable: bool = True
    writable: bool = False

    def read_into(self, offset: int, target: np.ndarray, key: str) -> None:
        """Copies `target.nbytes` bytes at `offset` into `target` (a uint8 array)."""
        raise NotImplementedError

    def write_from(self, offset: int, data: np.ndarray, key: str) -> None:
        """Copies `data` (a uint8 array) to `offset`."""
        raise NotImplementedError

    def host_view(self, offset: int, length: int) -> np.ndarray | None:
        """The bytes as host memory that cannot go away while referenced and changes
        only as its owner chose (so they may be used in place), or None when that cannot
        be promised (a file: it may shrink)."""
        return None


class MemorySource(ParameterSource):
    """Parameter bytes in host memory: private copies, caller arrays added writable, or
    a sealed memfd's mapping. `array` is a flat uint8 array."""

    def __init__(self, array: np.ndarray, name: str, *, writable: bool = False,
                 immutable: bool = True, owner: Any = None) -> None:
        self.array = array
        self.name = name
        self.size = array.nbytes
        self.writable = writable
        self.immutable = immutable and not writable
        self.owner = owner  # keeps a mapping alive

    def read_into(self, offset: int, target: np.ndarray, key: str) -> None:
        target[:] = self.array[offset : offset + target.nbytes]

    def write_from(self, offset: int, data: np.ndarray, key: str) -> None:
        self.array[offset : offset + data.nbytes] = data

    def host_view(self, offset: int, length: int) -> np.ndarray | None:
        # Private copies never change; a caller's writable memory is theirs to change
        # (IREE imports such host allocations in place too, so a later scatter is seen
        # through buffers loaded from it).
        return self.array[offset : offset + length]


class FileSource(ParameterSource):
    """A parameter file read (and, opened writable, written) with positional I/O on one
    open descriptor: the file may change or shrink later without harm to the process;
    a read that finds fewer bytes than the index promised is DATA_LOSS."""

    def __init__(self, fd: int, name: str, size: int, writable: bool) -> None:
        self.fd = fd
        self.name = name
        self.size = size
        self.writable = writable
        self._closed = threading.Event()

    def read_into(self, offset: int, target: np.ndarray, key: str) -> None:
        view = memoryview(target).cast("B")
        done = 0
        while done < len(view):
            try:
                got = os.preadv(self.fd, [view[done:]], offset + done)
            except OSError as exc:
                raise DataLossError(
                    f"parameter `{key}`: reading {self.name} at offset {offset + done} "
                    f"failed: {exc.strerror}") from None
            if got == 0:
                raise DataLossError(
                    f"parameter `{key}`: {self.name} ends at byte {offset + done}, before "
                    f"the parameter's range [{offset}, {offset + len(view)}) ends (the file "
                    f"shrank after it was indexed)")
            done += got

    def write_from(self, offset: int, data: np.ndarray, key: str) -> None:
        view = memoryview(np.ascontiguousarray(data)).cast("B")
        done = 0
        while done < len(view):
            try:
                done += os.pwritev(self.fd, [view[done:]], offset + done)
            except OSError as exc:
                raise DataLossError(
                    f"parameter `{key}`: writing {self.name} at offset {offset + done} "
                    f"failed: {exc.strerror}") from None

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            os.close(self.fd)

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:
            pass


def _aligned_empty(size: int) -> np.ndarray:
    """`size` uninitialised bytes starting at a 64-byte boundary."""
    raw = np.empty(size + ALIGNMENT, np.uint8)
    start = (-raw.ctypes.data) % ALIGNMENT
    return raw[start : start + size]


def _private_copy(data: Any) -> np.ndarray:
    """`data`'s bytes in new 64-byte-aligned memory (so loads can import it in place)."""
    src = np.frombuffer(memoryview(data).cast("B"), np.uint8)
    out = _aligned_empty(src.nbytes)
    out[:] = src
    out.flags.writeable = False
    return out


_SEALED = (getattr(fcntl, "F_SEAL_SHRINK", 0) | getattr(fcntl, "F_SEAL_WRITE", 0))


def _sealed_immutable(fd: int) -> bool:
    """Whether the kernel guarantees `fd`'s contents never shrink or change (a memfd
    sealed with F_SEAL_SHRINK and F_SEAL_WRITE)."""
    get_seals = getattr(fcntl, "F_GET_SEALS", None)
    if get_seals is None or not _SEALED:
        return False
    try:
        seals = fcntl.fcntl(fd, get_seals)
    except OSError:
        return False
    return seals & _SEALED == _SEALED


def open_source(path: str | os.PathLike, mode: str = "file",
                writable: bool = False) -> ParameterSource:
    """A source for the parameter file at `path` (see the module docstring)."""
    if mode not in MODES:
        raise InvalidArgumentError(
            f"unrecognized parameter mode '{mode}'; modes: {', '.join(MODES)}")
    name = os.fspath(path)
    fd, st = open_regular_file(name, "parameter file", writable)
    try:
        size = st.st_size
        if not writable and size and _sealed_immutable(fd):
            mapping = mmap.mmap(fd, size, prot=mmap.PROT_READ)
            array = np.frombuffer(mapping, np.uint8)
            return MemorySource(array, name, owner=mapping)
        source = FileSource(fd, name, size, writable)
        fd = -1
        if mode == "preload":
            array = _aligned_empty(size)
            source.read_into(0, array, "(preload)")
            source.close()
            array.flags.writeable = False
            return MemorySource(array, name)
        return source
    finally:
        if fd >= 0:
            os.close(fd)


# -- the index -------------------------------------------------------------------------


@dataclass(frozen=True)
class ParameterEntry:
    """One named parameter: `length` bytes at `offset` of `source`, or a splat (the
    `splat` pattern repeated over `length` bytes, no storage)."""

    key: str
    length: int
    source: ParameterSource | None = None
    offset: int = 0
    splat: bytes | None = None
    metadata: bytes = b""

    @property
    def is_splat(self) -> bool:
        return self.splat is not None

    def read(self) -> bytes:
        """The parameter's bytes (a splat expanded)."""
        if self.splat is not None:
            return _expand_splat(self.splat, self.length).tobytes()
        out = np.empty(self.length, np.uint8)
        self.source.read_into(self.offset, out, self.key)
        return out.tobytes()


def _expand_splat(pattern: bytes, length: int) -> np.ndarray:
    reps = -(-length // len(pattern))
    return np.frombuffer(pattern * reps, np.uint8)[:length]


class ParameterIndex:
    """The parameters of one scope, by key (a key added twice resolves to the first, as
    in IREE). Build it from files (`load`) and host memory (`add_buffer`, `add_splat`)."""

    def __init__(self) -> None:
        self._entries: list[ParameterEntry] = []
        self._by_key: dict[str, ParameterEntry] = {}
        self._sources: list[ParameterSource] = []

    # -- building
    def add(self, entry: ParameterEntry) -> None:
        self._entries.append(entry)
        self._by_key.setdefault(entry.key, entry)

    def load(self, path: str | os.PathLike, *, format: str | None = None,
             mode: str = "file", writable: bool = False) -> ParameterIndex:
        """Adds every parameter of the file at `path` (format by extension unless
        `format` is one of `irpa`, `safetensors`, `gguf`); returns the index."""
        name = os.fspath(path)
        fmt = (format or _format_of(name)).lower()
        parser = _PARSERS.get(fmt)
        if parser is None:
            raise UnimplementedError(
                f"unsupported file format `{fmt}`; ensure the extension matches one of the "
                "supported formats: [.irpa, .gguf, .safetensors]")
        source = open_source(name, mode, writable)
        reader = _Reader(source)
        try:
            entries = list(parser(reader, source))
        except Error as exc:
            raise exc.with_context(name) from None
        except (struct.error, UnicodeDecodeError, ValueError) as exc:
            raise InvalidArgumentError(f"{name}: malformed {fmt} file: {exc}") from None
        for entry in entries:
            self.add(entry)
        self._sources.append(source)
        return self

    def add_buffer(self, key: str, data: Any, *, writable: bool = False,
                   metadata: bytes = b"") -> None:
        """Adds `data` (bytes, a numpy array, anything exposing its bytes) as parameter
        `key`. By default its bytes are copied once into private memory, which loads then
        use in place; with `writable=True` the caller's own writable memory is the
        parameter, which `io_parameters.scatter` may write and which loads use in place
        where they can (64-byte aligned host memory, as IREE imports it), so the program
        sees later writes to it."""
        if writable:
            array = np.frombuffer(memoryview(data).cast("B"), np.uint8)
            if not array.flags.writeable:
                raise InvalidArgumentError(
                    f"parameter `{key}`: writable=True needs writable memory")
            source = MemorySource(array, f"<buffer {key}>", writable=True, immutable=False)
        else:
            source = MemorySource(_private_copy(data), f"<buffer {key}>")
        self.add(ParameterEntry(str(key), source.size, source, 0, None, bytes(metadata)))

    def add_splat(self, key: str, pattern: Any, length: int) -> None:
        """Adds parameter `key`: `pattern` (bytes or a numpy scalar, 1 to 16 bytes)
        repeated over `length` bytes, stored nowhere."""
        raw = pattern.tobytes() if isinstance(pattern, np.generic) else bytes(pattern)
        if not 0 < len(raw) <= MAX_SPLAT_PATTERN:
            raise InvalidArgumentError(
                f"splat pattern length {len(raw)} out of bounds {MAX_SPLAT_PATTERN}")
        if not isinstance(length, int) or length < 0:
            raise InvalidArgumentError(f"splat length must be an int >= 0, not {length!r}")
        self.add(ParameterEntry(str(key), length, None, 0, raw))

    # -- reading
    def lookup(self, key: str) -> ParameterEntry:
        entry = self._by_key.get(key)
        if entry is None:
            raise NotFoundError(f"no parameter found in index with key '{key}'")
        return entry

    def __getitem__(self, key: str) -> ParameterEntry:
        return self.lookup(key)

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[ParameterEntry]:
        return iter(self._entries)

    def keys(self) -> list[str]:
        return [e.key for e in self._entries]

    def __repr__(self) -> str:
        return f"<ParameterIndex {len(self._entries)} entries>"


def _format_of(name: str) -> str:
    base = os.path.basename(name)
    stem, dot, ext = base.rpartition(".")
    return ext if dot and stem else base


# -- reading a file's index ------------------------------------------------------------


class _Reader:
    """Bytes of a source for a parser: ranges checked against the source's size."""

    def __init__(self, source: ParameterSource) -> None:
        self.source = source
        self.size = source.size

    def read(self, offset: int, length: int, what: str) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise OutOfRangeError(
                f"{what} [{offset}, {offset + length}) lies outside the {self.size}-byte "
                "file")
        out = np.empty(length, np.uint8)
        self.source.read_into(offset, out, what)
        return out.tobytes()


# IRPA (runtime/src/iree/schemas/parameter_archive.h): packed little-endian structs.
_IRPA_MAGIC = 0x41505249
_IRPA_PREFIX = struct.Struct("<IHHQQQ")  # magic, major, minor, header size, next, flags
_IRPA_HEADER_V0 = struct.Struct("<IHHQQQQQQQQQQ")  # prefix, count, 3 segments
_IRPA_ENTRY = struct.Struct("<QIQQQQQQ")  # size, type, flags, name, metadata, alignment
_IRPA_SPLAT = struct.Struct("<Q16sB")  # length, pattern, pattern length
_IRPA_DATA = struct.Struct("<QQ")  # storage offset, length
_IRPA_ENTRY_ALIGNMENT = 16
_IRPA_SKIP, _IRPA_SPLAT_TYPE, _IRPA_DATA_TYPE = 0, 1, 2


def _parse_irpa(reader: _Reader, source: ParameterSource) -> Iterator[ParameterEntry]:
    base = 0
    while True:
        if reader.size < base + _IRPA_PREFIX.size:
            raise InvalidArgumentError(
                "not enough bytes for a valid IRPA header; file may be empty or truncated")
        magic, major, minor, header_size, next_header, _flags = _IRPA_PREFIX.unpack(
            reader.read(base, _IRPA_PREFIX.size, "IRPA header"))
        if magic != _IRPA_MAGIC:
            raise InvalidArgumentError(
                f"IRPA file magic missing or invalid {magic:08X}; expected {_IRPA_MAGIC:08X}")
        if header_size > reader.size:
            raise OutOfRangeError(
                f"file buffer underrun parsing header of reported size {header_size} (only "
                f"{reader.size} bytes available)")
        if next_header and reader.size < base + next_header + _IRPA_PREFIX.size:
            raise OutOfRangeError(
                f"file buffer underrun verifying linked header at offset "
                f"{base + next_header} (only {reader.size} bytes available)")
        if major != 0:
            raise UnimplementedError(
                f"IRPA major version {major}.{minor} not supported by this runtime")
        if minor > 0:
            raise UnimplementedError(
                f"IRPA version {major}.{minor} not supported (major supported but minor is "
                "newer than the runtime trying to parse it)")
        if header_size != _IRPA_HEADER_V0.size:
            raise InvalidArgumentError(
                f"IRPA v0 header expected to be exactly {_IRPA_HEADER_V0.size} bytes but "
                f"was reported as {header_size}")
        yield from _parse_irpa_v0(reader, source, base)
        if not next_header:
            return
        base += next_header


def _parse_irpa_v0(reader: _Reader, source: ParameterSource,
                   base: int) -> Iterator[ParameterEntry]:
    fields = _IRPA_HEADER_V0.unpack(reader.read(base, _IRPA_HEADER_V0.size, "IRPA header"))
    count = fields[6]
    segments = {"entry table": fields[7:9], "metadata segment": fields[9:11],
                "storage segment": fields[11:13]}
    for what, (offset, length) in segments.items():
        if length and base + offset + length > reader.size:
            raise OutOfRangeError(
                f"verifying {what}: file segment out of range ({base + offset} to "
                f"{base + offset + length - 1} for {length}, file_size={reader.size})")
    table_offset, table_length = segments["entry table"]
    metadata_offset, metadata_length = segments["metadata segment"]
    storage_offset, storage_length = segments["storage segment"]
    table = reader.read(base + table_offset, table_length, "IRPA entry table")
    metadata = reader.read(base + metadata_offset, metadata_length, "IRPA metadata")

    def metadata_range(offset: int, length: int, what: str) -> bytes:
        if length and offset + length > metadata_length:
            raise OutOfRangeError(
                f"resolving entry {what}: metadata segment reference out of range "
                f"({offset} to {offset + length - 1} for {length}, segment_size="
                f"{metadata_length})")
        return metadata[offset : offset + length] if length else b""

    position = 0
    for _ in range(count):
        remaining = table_length - position
        if remaining < _IRPA_ENTRY.size:
            raise OutOfRangeError(
                "entry table truncated; insufficient bytes for base entry header")
        (entry_size, entry_type, _flags, name_offset, name_length, meta_offset,
         meta_length, _alignment) = _IRPA_ENTRY.unpack_from(table, position)
        if entry_size < _IRPA_ENTRY.size or remaining < entry_size:
            raise OutOfRangeError("entry table truncated; insufficient bytes for sized header")
        body = position + _IRPA_ENTRY.size
        position += -(-entry_size // _IRPA_ENTRY_ALIGNMENT) * _IRPA_ENTRY_ALIGNMENT
        key = metadata_range(name_offset, name_length, "name").decode("utf-8")
        meta = metadata_range(meta_offset, meta_length, "metadata")
        if entry_type == _IRPA_SKIP:
            continue
        if entry_type == _IRPA_SPLAT_TYPE:
            if entry_size < _IRPA_ENTRY.size + _IRPA_SPLAT.size:
                raise OutOfRangeError("splat entry length underflow")
            length, pattern, pattern_length = _IRPA_SPLAT.unpack_from(table, body)
            if pattern_length > MAX_SPLAT_PATTERN:
                raise InvalidArgumentError(
                    f"splat pattern length {pattern_length} out of bounds {MAX_SPLAT_PATTERN}")
            if pattern_length == 0:
                raise InvalidArgumentError(f"splat entry `{key}` has an empty pattern")
            yield ParameterEntry(key, length, None, 0, pattern[:pattern_length], meta)
        elif entry_type == _IRPA_DATA_TYPE:
            if entry_size < _IRPA_ENTRY.size + _IRPA_DATA.size:
                raise OutOfRangeError("data entry length underflow")
            offset, length = _IRPA_DATA.unpack_from(table, body)
            if length and offset + length > storage_length:
                raise OutOfRangeError(
                    f"storage segment reference out of range ({offset} to "
                    f"{offset + length - 1} for {length}, segment_size={storage_length})")
            yield ParameterEntry(key, length, source, base + storage_offset + offset, None,
                                 meta)
        else:
            raise UnimplementedError(f"parser does not support entry type {entry_type}")


def _parse_safetensors(reader: _Reader, source: ParameterSource) -> Iterator[ParameterEntry]:
    if reader.size < 8:
        raise OutOfRangeError(
            f"insufficient capacity for safetensors header length (need at least 8 bytes "
            f"but have {reader.size})")
    (header_length,) = struct.unpack("<Q", reader.read(0, 8, "safetensors header length"))
    if reader.size - 8 < header_length:
        raise OutOfRangeError(
            f"insufficient capacity for safetensors header contents (declared as "
            f"{header_length} but only {reader.size - 8} bytes available)")
    text = reader.read(8, header_length, "safetensors header").decode("utf-8")
    pairs = json.loads(text, object_pairs_hook=lambda items: items)
    if not isinstance(pairs, list):
        raise InvalidArgumentError("safetensors header is not a JSON object")
    base = 8 + header_length
    available = reader.size - base
    for key, value in pairs:
        if key == "__metadata__":
            continue
        offsets = dict(value).get("data_offsets") if isinstance(value, list) else None
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(type(o) is int and o >= 0 for o in offsets)):
            raise InvalidArgumentError(f"failed to parse entry data offsets `{offsets}`")
        begin, end = offsets
        if begin > end or end > available:
            raise InvalidArgumentError(
                f"entry has data offsets outside of the available data (begin={begin}, "
                f"end={end}, available={available})")
        yield ParameterEntry(key, end - begin, source, base + begin)


# GGUF: https://github.com/ggerganov/ggml/blob/master/docs/gguf.md
_GGUF_MAGIC = 0x46554747
_GGUF_DEFAULT_ALIGNMENT = 32
# GGML type -> (elements per block, bytes per block)
_GGML_TYPES = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
    9: (32, 40), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176),
    14: (256, 210), 15: (256, 292), 16: (1, 1), 17: (1, 2), 18: (1, 4),
}
# metadata value type -> fixed size (strings 8, arrays 9 are variable)
_GGUF_VALUE_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY, _GGUF_UINT32 = 8, 9, 4


class _Cursor:
    """Sequential little-endian reads over a `_Reader`, through a window of the file."""

    WINDOW = 1 << 20

    def __init__(self, reader: _Reader) -> None:
        self.reader = reader
        self.position = 0
        self._window = b""
        self._window_start = 0

    def take(self, length: int) -> bytes:
        start = self.position - self._window_start
        if start + length > len(self._window):
            if self.position + length > self.reader.size:
                raise OutOfRangeError(f"file buffer underrun parsing {length} byte value")
            size = min(max(length, self.WINDOW), self.reader.size - self.position)
            self._window = self.reader.read(self.position, size, "GGUF header")
            self._window_start, start = self.position, 0
        self.position += length
        return self._window[start : start + length]

    def skip(self, length: int) -> None:
        if self.position + length > self.reader.size:
            raise OutOfRangeError("file buffer underrun parsing array")
        self.position += length

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def string(self) -> bytes:
        return self.take(self.u64())


def _gguf_value(cursor: _Cursor, value_type: int) -> Any:
    if value_type in _GGUF_VALUE_SIZES:
        return cursor.take(_GGUF_VALUE_SIZES[value_type])
    if value_type == _GGUF_STRING:
        return cursor.string()
    if value_type == _GGUF_ARRAY:
        element_type, count = cursor.u32(), cursor.u64()
        if element_type in _GGUF_VALUE_SIZES:
            cursor.skip(count * _GGUF_VALUE_SIZES[element_type])
        elif element_type == _GGUF_STRING:
            for _ in range(count):
                cursor.skip(cursor.u64())
        elif element_type == _GGUF_ARRAY:
            raise InvalidArgumentError("nested arrays not supported in gguf")
        else:
            raise InvalidArgumentError(f"unsupported metadata value type {element_type}")
        return None
    raise InvalidArgumentError(f"unsupported metadata value type {value_type}")


def _parse_gguf(reader: _Reader, source: ParameterSource) -> Iterator[ParameterEntry]:
    cursor = _Cursor(reader)
    magic = cursor.u32()
    if magic != _GGUF_MAGIC:
        raise InvalidArgumentError(
            f"GGUF file magic missing or invalid {magic:08X}; expected {_GGUF_MAGIC:08X}")
    version = cursor.u32()
    if not 2 <= version <= 3:
        raise UnimplementedError(
            f"GGUF format version {version} is unsupported; expected version 2-3")
    tensor_count, kv_count = cursor.u64(), cursor.u64()
    if tensor_count == 0:
        return
    alignment = _GGUF_DEFAULT_ALIGNMENT
    for _ in range(kv_count):
        key = cursor.string()
        value_type = cursor.u32()
        value = _gguf_value(cursor, value_type)
        if key == b"general.alignment":
            if value_type != _GGUF_UINT32:
                raise InvalidArgumentError("general.alignment metadata value must be uint32")
            alignment = struct.unpack("<I", value)[0]
            if alignment == 0 or alignment & (alignment - 1):
                raise InvalidArgumentError(
                    f"general.alignment {alignment} is not a power of two")
    infos = []
    for _ in range(tensor_count):
        name = cursor.string().decode("utf-8")
        dims = cursor.u32()
        shape = struct.unpack(f"<{dims}Q", cursor.take(8 * dims)) if dims else ()
        ggml_type, offset = cursor.u32(), cursor.u64()
        infos.append((name, shape, ggml_type, offset))
    data_offset = -(-cursor.position // alignment) * alignment
    available = reader.size - data_offset if reader.size >= data_offset else 0
    for name, shape, ggml_type, offset in infos:
        traits = _GGML_TYPES.get(ggml_type)
        if traits is None:
            raise UnimplementedError(f"GGML tensor type {ggml_type} not supported")
        elements = 1
        for d in shape:
            elements *= d
        length = elements * traits[1] // traits[0]
        end = offset + length
        if end > available:
            raise InvalidArgumentError(
                f"entry has data offsets outside of the available data (begin={offset}, "
                f"end={end}, available={available})")
        yield ParameterEntry(name, length, source, data_offset + offset)


_PARSERS = {"irpa": _parse_irpa, "safetensors": _parse_safetensors, "gguf": _parse_gguf}

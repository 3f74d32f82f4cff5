"""The VM's own reference types: `VMBuffer` (byte buffers) and `VMList` (typed lists).

Refs in tinyhal are plain Python objects (`None` is the null ref); these two are the
ones the VM itself creates (`vm.buffer.*`, `vm.list.*`, rodata). Native modules receive
and return them like any other ref.
"""

from __future__ import annotations

from ..errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    OutOfRangeError,
    ResourceExhaustedError,
)
from .numbers import round_f32

# Largest single allocation the VM will make for guest code (vm.buffer.alloc, lists).
MAX_ALLOCATION_BYTES = 1 << 36
MAX_LIST_ELEMENTS = 1 << 26


HEAD_BYTES = 8
"""Bytes of IREE's zeroed buffer header padding before a VM-allocated buffer's data
(its header and data are one allocation, the header rounded up to 16 bytes), enough for
the widest element."""


class VMBuffer:
    """A byte buffer (`!vm.buffer`).

    `data` is a writable or read-only `memoryview` of unsigned bytes. Rodata buffers are
    zero-copy views of the loaded module and have `mutable == False`; guest writes to
    them fail with PERMISSION_DENIED as in IREE.

    `head` stands for the bytes IREE keeps just before the data, which an element access
    at index -1 (or an index that wraps to it) reaches there (`ops.element_span`): for a
    buffer the VM allocates, its header's zeroed padding (8 bytes; a store there stays),
    for rodata the module's bytes before the segment; None where the memory before the
    data is not the buffer's to model (host and device memory), and such an access fails.
    The padding is IREE's buffer object's own state, which its clone reads: a clone of a
    VM-allocated buffer whose head was written fails (IREE crashes there).
    """

    __slots__ = ("data", "mutable", "head", "__weakref__")
    type_name = "vm.buffer"

    def __init__(self, data: bytes | bytearray | memoryview, mutable: bool | None = None,
                 head: bytearray | memoryview | None = None) -> None:
        view = data if isinstance(data, memoryview) else memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        if mutable is None:
            mutable = not view.readonly
        elif mutable and view.readonly:
            raise InvalidArgumentError("cannot create a mutable VMBuffer over read-only memory")
        self.data = view
        self.mutable = mutable
        self.head = head

    @classmethod
    def allocate(cls, length: int) -> VMBuffer:
        if length < 0 or length > MAX_ALLOCATION_BYTES:
            raise ResourceExhaustedError(
                f"vm.buffer allocation of {length} bytes exceeds the limit of "
                f"{MAX_ALLOCATION_BYTES} bytes"
            )
        try:
            return cls(bytearray(length), True, bytearray(HEAD_BYTES))
        except MemoryError:
            raise ResourceExhaustedError(
                f"out of memory allocating a vm.buffer of {length} bytes"
            ) from None

    def __len__(self) -> int:
        return len(self.data)

    @property
    def byte_length(self) -> int:
        return len(self.data)

    def tobytes(self) -> bytes:
        return self.data.tobytes()

    def __repr__(self) -> str:
        return f"VMBuffer({len(self.data)} bytes, {'mutable' if self.mutable else 'read-only'})"


# Value element types a list may hold, and their widths in bytes.
VALUE_TYPES = {"i8": 1, "i16": 2, "i32": 4, "i64": 8, "f32": 4, "f64": 8}
VARIANT = "variant"


def _wrap(value: int, bits: int) -> int:
    half = 1 << (bits - 1)
    return ((value + half) & ((1 << bits) - 1)) - half


def convert_value(value, source: str, target: str):
    """IREE's list value conversion between value types (unsupported pairs give 0)."""
    if source == target:
        return value
    if source in ("i8", "i16", "i32", "i64") and target in ("i8", "i16", "i32", "i64"):
        return _wrap(int(value), VALUE_TYPES[target] * 8)
    if source == "f32" and target == "f64":
        return float(value)
    if source == "f64" and target == "f32":
        return round_f32(value)
    return 0.0 if target in ("f32", "f64") else 0


class VMList:
    """A list (`!vm.list<T>`): of values (`i8`..`f64`), of refs of one type, or variants.

    `element_type` is a value type name, a ref type name (such as `"hal.buffer_view"`,
    or `"?"` for any ref) or `"variant"`. Value lists hold Python numbers; ref lists hold
    objects or `None`; variant lists hold `(type, value)` pairs (type a value type name
    or `"ref"`) or `None` for an empty slot.
    """

    __slots__ = ("element_type", "items", "capacity", "__weakref__")
    type_name = "vm.list"

    def __init__(self, element_type: str = VARIANT, capacity: int = 0) -> None:
        self.element_type = element_type
        self.items: list = []
        self.capacity = 0
        self.reserve(capacity)

    def _empty(self):
        et = self.element_type
        if et in VALUE_TYPES:
            return 0.0 if et[0] == "f" else 0
        return None

    def reserve(self, minimum_capacity: int) -> None:
        if minimum_capacity <= self.capacity:
            return
        aligned = (minimum_capacity + 63) & ~63
        if aligned * 8 > MAX_ALLOCATION_BYTES:
            raise OutOfRangeError(f"list capacity {minimum_capacity} overflow")
        self.capacity = max(aligned, self.capacity)

    def __len__(self) -> int:
        return len(self.items)

    def resize(self, new_size: int) -> None:
        if new_size < 0:
            raise OutOfRangeError(f"list size {new_size} invalid")
        n = len(self.items)
        if new_size > MAX_LIST_ELEMENTS:
            raise ResourceExhaustedError(
                f"list size {new_size} exceeds the limit of {MAX_LIST_ELEMENTS} elements"
            )
        if new_size < n:
            del self.items[new_size:]
        elif new_size > n:
            if new_size > self.capacity:
                self.reserve(new_size)
            self.items.extend([self._empty()] * (new_size - n))

    def _check_index(self, index: int) -> None:
        if not 0 <= index < len(self.items):
            raise OutOfRangeError(f"index {index} out of bounds ({len(self.items)})")

    # -- values
    def get_value_as(self, index: int, value_type: str):
        self._check_index(index)
        et = self.element_type
        if et in VALUE_TYPES:
            return convert_value(self.items[index], et, value_type)
        if et == VARIANT:
            item = self.items[index]
            if item is None or item[0] == "ref":
                raise FailedPreconditionError(f"variant at index {index} is not a value type")
            return convert_value(item[1], item[0], value_type)
        raise FailedPreconditionError("list does not store values")

    def set_value(self, index: int, value, value_type: str) -> None:
        self._check_index(index)
        et = self.element_type
        if et in VALUE_TYPES:
            self.items[index] = convert_value(value, value_type, et)
        elif et == VARIANT:
            self.items[index] = (value_type, value)
        else:
            raise FailedPreconditionError("list cannot store values")

    # -- refs
    def get_ref(self, index: int, move: bool = False):
        self._check_index(index)
        et = self.element_type
        if et in VALUE_TYPES:
            raise FailedPreconditionError("list does not store refs")
        item = self.items[index]
        if et == VARIANT:
            if item is None:
                return None
            if item[0] != "ref":
                raise FailedPreconditionError(f"variant at index {index} is not a ref")
            if move:
                self.items[index] = None
            return item[1]
        if move:
            self.items[index] = None
        return item

    def set_ref(self, index: int, obj) -> None:
        self._check_index(index)
        et = self.element_type
        if et in VALUE_TYPES:
            raise FailedPreconditionError("list cannot store refs")
        if et == VARIANT:
            self.items[index] = None if obj is None else ("ref", obj)
        else:
            if obj is not None and not ref_type_matches(obj, et):
                raise InvalidArgumentError(
                    f"ref type mismatch storing {type(obj).__name__} into list<{et}>"
                )
            self.items[index] = obj

    # -- convenience for hosts
    def append(self, value, value_type: str | None = None) -> None:
        self.items.append(None)
        try:
            if value_type is not None or self.element_type in VALUE_TYPES:
                self.set_value(len(self.items) - 1, value, value_type or self.element_type)
            else:
                self.set_ref(len(self.items) - 1, value)
        except Exception:
            self.items.pop()
            raise

    def __getitem__(self, index: int):
        self._check_index(index)
        item = self.items[index]
        if self.element_type == VARIANT and item is not None:
            return item[1]
        return item

    def __repr__(self) -> str:
        return f"VMList<{self.element_type}>({len(self.items)} items)"


def ref_type_name(obj) -> str | None:
    """The VM type name of a ref object (`vm.buffer`, `hal.buffer_view`, ...), if known."""
    name = getattr(type(obj), "type_name", None)
    return name if isinstance(name, str) else None


def ref_type_matches(obj, expected: str | None) -> bool:
    """Whether `obj` may be stored where ref type `expected` is declared.

    Types that are not known (native objects without a `type_name`) are accepted: only
    the VM's own types are checked, as a safety net against miscompiled modules.
    """
    if expected is None or expected in ("?", VARIANT):
        return True
    actual = ref_type_name(obj)
    if actual is None:
        return True
    return actual == expected

"""Each hot HAL object has one constructor.

Buffer, BufferView, RingStorage, Semaphore and Fence keep their fields in C base types
(`hal/native/core.c`) whose constructor is the only place those fields are set: the public
class call and every path C builds them on (the ring's ready alloca, `Fence.pending`,
`Fence.join`, the VM's `hal.buffer_view.create`) go through it. These tests compare what
each path makes, check that no code builds one of them around its constructor, and check
the constructors' refusals.
"""

from __future__ import annotations

import pathlib
import re
import weakref

import pytest

from support.leaks import traced_growth
from tinyhal import errors
from tinyhal.hal import Buffer, BufferView, Fence, Semaphore, create_device
from tinyhal.hal.buffer import RingStorage, Storage, pending_buffer
from tinyhal.hal.native import core
from tinyhal.hal.stream import Stream
from tinyhal.hal.types import EncodingType, MemoryAccess
from tinyhal.vm.hal_module import buffer_view_create

ROOT = pathlib.Path(__file__).resolve().parents[2]
F32 = 0x21000020

BUFFER_FIELDS = ("allocator", "byte_offset", "byte_length", "memory_type_bits", "usage_bits",
                 "access_bits")
STORAGE_FIELDS = ("byte_length", "released", "_on_release", "ring", "block")


def fields(obj, names):
    return {name: (type(getattr(obj, name)), getattr(obj, name)) for name in names}


@pytest.fixture
def device():
    dev = create_device("sync")
    yield dev
    dev.close()


def test_a_ready_alloca_builds_the_buffer_the_public_constructor_builds(device):
    ready = device.queue_alloca(100)  # placed at once, in C
    assert type(ready) is Buffer and type(ready.storage) is RingStorage
    public = Buffer(device.allocator, RingStorage(100), 0, 100, ready.memory_type,
                    ready.allowed_usage)  # flags, not ints: kept as ints all the same
    assert fields(ready, BUFFER_FIELDS) == fields(public, BUFFER_FIELDS)
    pending = pending_buffer(device.allocator, 100, ready.memory_type_bits, ready.usage_bits)
    assert fields(pending, BUFFER_FIELDS) == fields(public, BUFFER_FIELDS)
    assert ready.access_bits == int(MemoryAccess.ALL)
    # the ring filled the storage in place; otherwise it is what RingStorage(n) makes
    assert ready.storage.ring is device.transient and ready.storage.block is not None
    assert fields(pending.storage, STORAGE_FIELDS) == fields(RingStorage(100), STORAGE_FIELDS)
    device.queue_dealloca(ready)


def test_the_vm_builds_the_buffer_view_the_public_constructor_builds(device):
    buffer = device.allocator.allocate(64)
    from_vm = buffer_view_create(None, buffer, 0, 64, F32, 1, [(4,), (2,)])
    public = BufferView(buffer, [4, 2], F32)
    names = ("buffer", "shape", "element_type", "encoding_type")
    assert type(from_vm) is type(public) is BufferView
    assert fields(from_vm, names) == fields(public, names)
    assert public.encoding_type == int(EncodingType.DENSE_ROW_MAJOR)
    with pytest.raises(errors.OutOfRangeError, match="needs 36 bytes but the buffer has 32"):
        buffer_view_create(None, buffer, 0, 32, F32, 1, [(9,)])


def test_every_fence_and_semaphore_comes_from_one_constructor():
    sem = Semaphore()
    made = [Fence([(sem, 1)]), Fence.single(sem, 1), Fence.pending(),
            Fence.join([Fence.single(sem, 1)]), Fence.join([Fence.pending(), None])]
    for fence in made:
        assert type(fence) is Fence and type(fence._points) is tuple
        (point,) = fence._points
        assert type(point) is tuple and type(point[1]) is int and point[1] == 1
        assert dict(fence._points) == fence.timeline
    from_c = Fence.pending()._points[0][0]
    assert type(from_c) is Semaphore
    names = ("_value", "name", "_failure", "_timepoints", "_offers", "_blocked")
    assert fields(from_c, names) == fields(Semaphore(), names)


def test_a_fence_keeps_each_semaphore_once_at_its_largest_value():
    a, b = Semaphore(), Semaphore()
    fence = Fence([(a, 3), (b, 1), (a, 2), [a, 7]])
    assert fence._points == ((a, 7), (b, 1))
    with pytest.raises(AttributeError):
        fence._points = ()  # a fence never changes once made


@pytest.mark.parametrize("make, error, message", [
    (lambda b: BufferView(b, (9,), F32), errors.OutOfRangeError, "needs 36 bytes"),
    (lambda b: BufferView(b, (2**70, 2**70), F32), errors.OutOfRangeError, "needs 55751"),
    (lambda b: BufferView(b, (-1, 2), F32), errors.InvalidArgumentError, "negative"),
    (lambda b: BufferView(b, "ab", F32), errors.InvalidArgumentError, "not a sequence of ints"),
    (lambda b: BufferView(b, 4, F32), errors.InvalidArgumentError, "not a sequence of ints"),
    (lambda b: BufferView(b.storage, (1,), F32), errors.InvalidArgumentError, "needs a Buffer"),
    (lambda b: BufferView(b, (1,), "f32"), errors.InvalidArgumentError, "must be ints"),
    (lambda b: BufferView(b, (1,), F32, 1.0), errors.InvalidArgumentError, "must be ints"),
    (lambda b: Fence([(Semaphore(), -1)]), errors.InvalidArgumentError, "fence value"),
    (lambda b: Fence([1]), errors.InvalidArgumentError, "pairs"),
    (lambda b: Fence(5), errors.InvalidArgumentError, "an iterable of"),
    (lambda b: Fence([(Semaphore(), 1, 2)]), errors.InvalidArgumentError, "pairs"),
    (lambda b: Fence.single(Semaphore(), 2**64), errors.InvalidArgumentError, "fence value"),
    (lambda b: Semaphore(-1), errors.InvalidArgumentError, "initial value"),
    (lambda b: Semaphore(1.5), errors.InvalidArgumentError, "initial value"),
])
def test_the_constructors_refuse_bad_input_with_a_tinyhal_error(device, make, error, message):
    buffer = device.allocator.allocate(32)
    with pytest.raises(error, match=message):
        make(buffer)


def test_the_objects_take_weak_references(device):
    buffer = device.allocator.allocate(32)
    for obj in (buffer, buffer.storage, RingStorage(8), Semaphore(), Fence.pending()):
        assert weakref.ref(obj)() is obj


def test_fields_are_set_once(device):
    buffer = device.allocator.allocate(32)
    view = BufferView(buffer, (8,), F32)
    for obj, name in [(buffer, "byte_length"), (buffer, "storage"), (view, "shape"),
                      (view, "buffer")]:
        with pytest.raises(AttributeError):
            setattr(obj, name, None)
    assert BufferView(buffer, [2.0, 4], F32).shape == (2, 4)  # what int() takes, as ints


def test_the_hot_classes_have_no_python_constructor():
    """Their constructor is the C base's; `Storage.__init__` is the one Python
    constructor of a storage (allocating or adopting its block)."""
    for cls in (Buffer, BufferView, Semaphore, Fence):
        assert "__init__" not in vars(cls) and "__new__" not in vars(cls), cls
        assert cls.__new__ is cls.__mro__[1].__new__
    assert RingStorage is core.RingStorage and issubclass(Storage, core.StorageCore)
    assert "__new__" not in vars(Storage) and "__new__" not in vars(Stream)


CONSTRUCTED_AROUND = re.compile(
    r"(?:object|\w*Core|Buffer|BufferView|Fence|Semaphore|Stream|\w*Storage)\.__new__\("
    r"|_new\w*\((?:Buffer|BufferView|Fence|Semaphore|Stream|\w*Storage)\)")


def test_no_code_builds_a_hot_object_around_its_constructor():
    """No `object.__new__(Buffer)` followed by field writes, in Python; in C, no
    `__slots__` member found by name and written by offset."""
    offenders = []
    paths = (path for top in ("hal", "vm", "server", "scheduler")
             for path in sorted((ROOT / top).rglob("*.py")))
    for path in paths:
        rel = path.relative_to(ROOT)
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if CONSTRUCTED_AROUND.search(line) and not line.lstrip().startswith("#"):
                offenders.append(f"{rel}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
    core_c = (ROOT / "hal" / "native" / "core.c").read_text()
    for sign in ("PyMemberDescr_Type", "d_member", "find_slots", "tp_alloc(buffer_class",
                 "tp_alloc(fence_class", "tp_alloc(semaphore_class"):
        assert sign not in core_c, sign


def test_the_constructors_leak_nothing_on_any_path(device):
    """Refusals (an error built in C), deduplicated points, and transient buffers given
    back or dropped leave no memory behind."""
    buffer = device.allocator.allocate(64)
    sem = Semaphore()
    refused = (lambda: BufferView(buffer, (100,), F32), lambda: BufferView(buffer, "ab", F32),
               lambda: BufferView(buffer, (2**70,), F32), lambda: Fence([(sem, -1)]),
               lambda: Fence(5), lambda: Semaphore(-1))

    def cycle() -> None:
        for make in refused:
            with pytest.raises(errors.Error):
                make()
        BufferView(buffer, [2, 2], F32)
        Fence([(sem, 1), (sem, 3), [sem, 2]])
        device.queue_dealloca(device.queue_alloca(100))
        dropped = device.queue_alloca(100)
        del dropped

    assert traced_growth(cycle, warm=500, measured=1500) < 64 << 10
    assert device.transient._live_blocks() == 0

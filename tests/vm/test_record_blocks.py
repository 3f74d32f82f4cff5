"""Recording blocks: a `create` and the record operations after it, made in one call.

The translator fuses them (`vm/record_blocks.py`); the `hal` module's site records a new
set of operands import by import and adopts the recording for equal operands over new
buffers (`vm/hal_blocks.py`). Pinned here: a re-recorded block reaches no record shim
and binds the new buffers; a buffer that fails a check gets the record operation's own
error; operands that differ (ordinal, aliasing) record anew; the generic site calls the
imports in order.
"""

from __future__ import annotations

import functools
import sys

import numpy as np
import pytest

import tinyhal
from support.executables import compile_executable
from tinyhal import errors, hal
from tinyhal.hal import BufferView
from tinyhal.hal.command_buffer import CommandBuffer
from tinyhal.vm import isa
from tinyhal.vm.hal_module import command_buffer_dispatch, create_hal_module
from tinyhal.vm.record_blocks import (
    AllocaRun,
    RecordBlock,
    find_allocas,
    find_block,
    find_execute,
    find_tail,
    replay,
)

F32 = 0x21000020
TWO = int(np.array(2.0, np.float32).view(np.uint32))


def _k(value):
    return ("k", value)


def _d(index):
    return ("d", index)


# values: 0 device, 1 executable, 2 ordinal, 3/4/5 the three buffers
FMA_BLOCK = RecordBlock((
    (0, (_d(0), _k(1), _k(3), _k(-1), _k(0))),                       # create
    (1, (("cb",), _d(1), _d(2), _k(4), _k(1), _k(1), _k(0),          # dispatch
         ((_k(TWO),), (_k(0),)),
         ((_k(0), _k(0), _d(3), _k(0), _k(64)), (_k(0), _k(0), _d(4), _k(0), _k(64)),
          (_k(0), _k(0), _d(5), _k(0), _k(64))))),
    (2, (("cb",), _k(28), _k(13), _k(0))),                            # execution_barrier
    (3, (("cb",),)),                                                  # finalize
), 6)
FMA_NAMES = ["hal.command_buffer.create", "hal.command_buffer.dispatch",
             "hal.command_buffer.execution_barrier", "hal.command_buffer.finalize"]


@pytest.fixture
def fma_site():
    device = hal.create_device("sync")
    module = create_hal_module(device)
    exe = device.load_executable(compile_executable("elementwise_3d", embedded=True))
    functions = [module.functions[name].fn for name in FMA_NAMES]
    site = module.block_recorder(FMA_NAMES, FMA_BLOCK, functions)
    yield device, exe, site
    module.on_close()
    device.close()


def _buffers(device, seed, out_bytes=64):
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal(16).astype(np.float32) for _ in range(2))
    return (a, b, BufferView.from_numpy(device, a).buffer,
            BufferView.from_numpy(device, b).buffer, device.allocator.allocate(out_bytes))


def _run(device, cb, out):
    sem = device.create_semaphore()
    device.submit(cb, signal=[(sem, 1)])
    sem.wait(1, timeout=60)
    return BufferView(out, (16,), F32).to_numpy()


def _calls_of(code, fn, *more) -> int:
    """How many times running `fn` enters a function whose code is `code` (or one of
    `more`)."""
    calls = 0
    codes = {code, *more}

    def profile(frame, event, arg):
        nonlocal calls
        if event == "call" and frame.f_code in codes:
            calls += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def _dispatch_shim_calls(fn) -> int:
    return _calls_of(command_buffer_dispatch.__code__, fn)


def test_a_rerecorded_block_adopts_its_recording_over_new_buffers(fma_site):
    device, exe, site = fma_site
    ordinal = exe.lookup("fma_3d")
    first = None
    for seed in range(3):
        a, b, va, vb, out = _buffers(device, seed)
        made: list = []
        calls = _dispatch_shim_calls(
            lambda values=(device, exe, ordinal, va, vb, out), made=made:
            made.append(site(values)))
        cb = made[0]
        assert cb.finalized and cb.direct == [va, vb, out]
        if first is None:
            first = cb.recording
            assert calls == 1  # recorded import by import
        else:
            assert calls == 0 and cb.recording is first  # adopted
        assert np.array_equal(_run(device, cb, out), a * np.float32(2) + b)


def test_a_buffer_that_fails_a_check_gets_the_record_operations_error(fma_site):
    device, exe, site = fma_site
    ordinal = exe.lookup("fma_3d")
    _a, _b, va, vb, out = _buffers(device, 0)
    site((device, exe, ordinal, va, vb, out))
    _a, _b, va, vb, small = _buffers(device, 1, out_bytes=32)
    with pytest.raises(errors.OutOfRangeError, match="binding 2 of 'fma_3d'"):
        site((device, exe, ordinal, va, vb, small))
    _a, _b, va, vb, out = _buffers(device, 2)
    vb.storage.release()
    with pytest.raises(errors.FailedPreconditionError):
        site((device, exe, ordinal, va, vb, out))


def test_an_adopted_command_buffer_refuses_a_buffer_released_before_its_submit(fma_site):
    """Adopting binds the buffers' addresses once (`Recording.adopter`); a buffer released
    between the adoption and the submit is still refused there, naming its operand."""
    device, exe, site = fma_site
    ordinal = exe.lookup("fma_3d")
    _a, _b, va, vb, out = _buffers(device, 0)
    site((device, exe, ordinal, va, vb, out))
    _a, _b, va, vb, out = _buffers(device, 1)
    cb = site((device, exe, ordinal, va, vb, out))
    assert cb.bound is not None  # adopted, with its bindings made
    vb.storage.release()
    with pytest.raises(errors.FailedPreconditionError, match="binding 1 of 'fma_3d'"):
        device.submit(cb)


def test_a_block_adopted_over_a_transient_buffer_not_yet_placed_submits_as_adopted(fma_site):
    """A step whose transient buffer's alloca has not run yet (it waits on the queue, as
    a profiled or task alloca may when the next step records) still adopts: its command
    buffer carries its submission with the addresses left to the stream, so the submit
    resolves nothing, and the kernels run over the memory the alloca then places."""
    device, exe, site = fma_site
    ordinal = exe.lookup("fma_3d")
    _a, _b, va, vb, out = _buffers(device, 0)
    site((device, exe, ordinal, va, vb, out))
    a, b, va, vb, _out = _buffers(device, 1)
    gate, placed, done = (device.create_semaphore() for _ in range(3))
    out = device.queue_alloca(64, wait=[(gate, 1)], signal=[(placed, 1)])
    assert not out.storage.address  # no memory yet
    cb = site((device, exe, ordinal, va, vb, out))
    assert cb.bound is not None and cb.bound.addresses is None
    submit = lambda: device.submit(cb, wait=[(placed, 1)], signal=[(done, 1)])  # noqa: E731
    assert _resolve_calls(submit) == 0
    gate.signal(1)
    done.wait(1, timeout=60)
    assert np.array_equal(BufferView(out, (16,), F32).to_numpy(), a * np.float32(2) + b)
    device.queue_dealloca(out)


def test_a_recordings_adopt_checks_what_recording_checked_and_binds(fma_site):
    """`Recording.adopter()` (a check made once per shape of needs, the recording's
    needs bound as data) admits buffers that recording would have, binding them as
    `bind` does, and nothing else; recordings of one shape share the check."""
    device, exe, site = fma_site
    ordinal = exe.lookup("fma_3d")
    _a, _b, va, vb, out = _buffers(device, 0)
    recording = site((device, exe, ordinal, va, vb, out)).recording
    adopt = recording.adopter()
    assert adopt.func is type(recording)(
        recording.commands, 0, recording.direct_count, recording.max_concurrency
    ).adopter().func  # one check per shape
    _a, _b, va, vb, out = _buffers(device, 1)
    submission = adopt([va, vb, out])
    assert submission.parts == [(recording, [(b, 0, 64) for b in (out, vb, va)])]
    assert submission.addresses == [b.address for b in (out, vb, va)]
    assert submission.lengths == [64, 64, 64]
    wide = device.allocator.allocate(128)
    assert adopt([va, vb]) is None  # too few
    assert adopt([va, vb, "out"]) is None  # not a buffer
    assert adopt([va, vb, device.allocator.allocate(32)]) is None  # too small
    assert adopt([va, vb, wide.subspan(16, 64)]) is None  # misaligned for the kernel
    assert adopt([va, vb, device.allocator.allocate(
        64, usage=hal.BufferUsage.TRANSFER)]) is None  # no dispatch usage
    out.storage.release()
    assert adopt([va, vb, out]) is None  # released
    pending = device.allocator.allocate(64)
    pending.storage.address = 0  # as a transient buffer before its alloca runs
    assert adopt([va, vb, pending]).addresses is None


def test_a_host_program_and_the_vm_recording_equal_commands_share_one_recording(fma_site):
    """The recording is the HAL's, keyed by the commands: a host program recording a
    command buffer through the public API and a VM block recording the same commands
    over other buffers get one recording, whichever records first, and the block then
    adopts it over new buffers."""
    device, exe, site = fma_site
    ordinal = exe.lookup("fma_3d")
    a, b, va, vb, out = _buffers(device, 0)
    host = device.create_command_buffer("one_shot")
    host.dispatch(exe, ordinal, (4, 1, 1), constants=(TWO, 0),
                  bindings=[(va, 0, 64), (vb, 0, 64), (out, 0, 64)])
    host.barrier()
    host.finalize()
    assert np.array_equal(_run(device, host, out), a * np.float32(2) + b)
    a, b, va, vb, out = _buffers(device, 1)
    recorded = site((device, exe, ordinal, va, vb, out))  # import by import
    assert recorded.recording is host.recording
    assert np.array_equal(_run(device, recorded, out), a * np.float32(2) + b)
    a, b, va, vb, out = _buffers(device, 2)
    adopted = site((device, exe, ordinal, va, vb, out))
    assert adopted.recording is host.recording and adopted.bound is not None
    assert np.array_equal(_run(device, adopted, out), a * np.float32(2) + b)


def test_an_adopted_command_buffer_whose_buffer_was_released_since_is_refused(fma_site):
    """What adopting bound is taken as it is only while every direct buffer is live: a
    buffer released between the block and the submit is named by the submit, and the
    command buffer can still go once the failure is seen (it was not submitted)."""
    device, exe, site = fma_site
    ordinal = exe.lookup("fma_3d")
    _a, _b, va, vb, out = _buffers(device, 0)
    site((device, exe, ordinal, va, vb, out))
    _a, _b, va, vb, out = _buffers(device, 1)
    adopted = site((device, exe, ordinal, va, vb, out))
    assert adopted.bound is not None
    va.storage.release()
    with pytest.raises(errors.FailedPreconditionError, match="binding 0 of 'fma_3d'.*deallocated"):
        device.submit(adopted)
    assert not adopted.submitted


def test_changed_operands_record_anew(fma_site):
    device, exe, site = fma_site
    ordinal = exe.lookup("fma_3d")
    a, b, va, vb, out = _buffers(device, 0)
    first = site((device, exe, ordinal, va, vb, out)).recording
    aliased = site((device, exe, ordinal, va, va, out))  # one buffer twice: new numbering
    assert aliased.recording is not first and len(aliased.direct) == 2
    assert np.array_equal(_run(device, aliased, out), a * np.float32(3))
    again = site((device, exe, ordinal, vb, vb, out))
    assert again.recording is aliased.recording  # the same aliasing: adopted
    assert np.array_equal(_run(device, again, out), b * np.float32(3))


def test_the_generic_site_calls_the_imports_in_order():
    calls = []

    def create(*args):
        calls.append(("create", args))
        return "cb"

    def record(name):
        return lambda *args: calls.append((name, args))

    site = replay(FMA_BLOCK, [create, record("dispatch"), record("barrier"),
                              record("finalize")])
    assert site(("dev", "exe", 7, "a", "b", "c")) == "cb"
    assert [name for name, _ in calls] == ["create", "dispatch", "barrier", "finalize"]
    assert calls[0][1] == ("dev", 1, 3, -1, 0)
    assert calls[1][1] == ("cb", "exe", 7, 4, 1, 1, 0, [(TWO,), (0,)],
                           [(0, 0, "a", 0, 64), (0, 0, "b", 0, 64), (0, 0, "c", 0, 64)])
    assert calls[3][1] == ("cb",)


def test_the_generic_site_of_a_block_fused_with_an_execute_records_then_submits():
    calls = []

    def record(name):
        return lambda *args: calls.append((name, args)) or "cb"

    block = RecordBlock(FMA_BLOCK.ops, FMA_BLOCK.values, (9, 4))
    site = replay(block, [record("create"), record("dispatch"), record("barrier"),
                          record("finalize"), record("execute")])
    values = ("dev", "exe", 7, "a", "b", "c")
    site("dev", -1, "wait", "signal", values, 0)
    assert [name for name, _ in calls] == ["create", "dispatch", "barrier", "finalize",
                                           "execute"]
    assert calls[-1][1] == ("dev", -1, "wait", "signal", "cb", 0)


def _resolve_calls(fn) -> int:
    from tinyhal.hal import execution

    return _calls_of(execution.resolve_commands.__code__, fn)


@pytest.mark.parametrize("driver", ["sync", "task", "emu"])
def test_a_recurrent_step_submits_its_adopted_command_buffer_as_adopted(driver):
    """GRU records a one-shot command buffer per step and moves it into the next
    queue execute: the translator fuses the two, and an adopted step's command buffer
    carries what its submit binds, so no submit resolves it again, profiled or not (the
    profile still has every dispatch). Results equal the unprofiled call's."""
    pytest.importorskip("onnx")
    from support.zoo import ZOO, zoo_inputs, zoo_vmfb

    with tinyhal.load(zoo_vmfb("gru"), device=driver) as module:
        fn = getattr(module, ZOO["gru"].function)
        args = zoo_inputs("gru")
        expected = [np.asarray(r).copy() for r in _as_list(fn(*args))]
        # 16 steps submit adopted command buffers; only the call's one other execute,
        # which no step re-records, is resolved (and, profiled, a transfer of emu's)
        assert _resolve_calls(lambda: fn(*args)) == 1
        with module.profiling("host-execution") as profiles:
            assert _resolve_calls(lambda: _as_list(fn(*args))) <= 2
            got = _as_list(fn(*args))
        for a, b in zip(expected, got):
            assert np.asarray(b).tobytes() == a.tobytes()
        assert profiles[0].summary().dispatches >= 16 * 6  # six kernels per time step


def test_a_recurrent_step_adopts_on_a_driver_that_places_transients_later():
    """The one-file toy driver (`support/toy_driver.py`) runs every alloca on its own
    queue thread, so each GRU step's block adopts its recording over a transient buffer
    that has no memory yet: the step's submit still resolves nothing (the call's one
    other execute is resolved), and the results equal sync's bit for bit."""
    pytest.importorskip("onnx")
    from support import toy_driver
    from support.zoo import ZOO, zoo_inputs, zoo_vmfb

    hal.register_driver(toy_driver.DRIVER)
    results = {}
    for driver in ("sync", toy_driver.NAME):
        with tinyhal.load(zoo_vmfb("gru"), device=driver) as module:
            fn = getattr(module, ZOO["gru"].function)
            args = zoo_inputs("gru")
            fn(*args)
            assert _resolve_calls(functools.partial(fn, *args)) == 1
            results[driver] = [np.asarray(r).tobytes() for r in _as_list(fn(*args))]
    assert results[toy_driver.NAME] == results["sync"]


def _as_list(result):
    return list(result) if isinstance(result, (tuple, list)) else [result]


@pytest.mark.parametrize("name", ["gru", "lstm"])
def test_a_recurrent_model_records_its_steps_import_by_import_only_once(name):
    """The second call of a model that re-records a command buffer per time step
    adopts every step's recording: no dispatch reaches its record shim."""
    pytest.importorskip("onnx")
    from support.zoo import ZOO, zoo_inputs, zoo_vmfb

    with tinyhal.load(zoo_vmfb(name), device="sync") as module:
        fn = getattr(module, ZOO[name].function)
        args = zoo_inputs(name)
        assert _dispatch_shim_calls(lambda: fn(*args)) > 0
        assert _dispatch_shim_calls(lambda: fn(*args)) == 0


class _Import:
    def __init__(self, full_name: str) -> None:
        self.full_name = full_name


_IMPORTS = [_Import(n) for n in (
    "hal.command_buffer.create", "hal.command_buffer.execution_barrier",
    "hal.command_buffer.finalize", "hal.device.queue.execute",
    "hal.executable.lookup.function", "hal.fence.create")]
_CB = isa.REF_BIT | 3  # the command buffer's register


def _call(k: int, src: list, dst: list = ()) -> isa.Instruction:
    return isa.Instruction(0, 0, "call", [k | isa.IMPORT_BIT, list(src), list(dst)], ())


_CREATE = _call(0, [isa.REF_BIT | 1], [_CB])
_BARRIER = _call(1, [_CB])
_FINALIZE = _call(2, [_CB])
_ADD = isa.Instruction(0, 0, "add.i32", [1, 2, 3], (("r", "i32"), ("r", "i32"), ("w", "i32")))


@pytest.mark.parametrize("instrs, end", [
    ([_CREATE, _BARRIER, _ADD, _BARRIER, _FINALIZE, _BARRIER], 5),  # ends at finalize
    ([_CREATE, _BARRIER, _call(4, [isa.REF_BIT | 5, isa.REF_BIT | 6], [7]), _BARRIER], 4),
    ([_CREATE, _BARRIER, _call(3, [isa.REF_BIT | 1, _CB]), _BARRIER, _BARRIER], None),
    ([_CREATE, _BARRIER, _BARRIER, _call(3, [_CB])], 3),  # a queue op ends it
    ([_CREATE, _BARRIER, isa.Instruction(0, 0, "assign.ref", [_CB, isa.REF_BIT | 4],
                                         (("r", "ref"), ("w", "ref"))), _BARRIER], None),
    ([_CREATE, _BARRIER, _ADD, _BARRIER, isa.Instruction(0, 0, "br", [0, []],
                                                          (("B", ""), ("O", ""))), _BARRIER], 4),
    ([_CREATE, _FINALIZE, _BARRIER], None),  # one record op is not worth a block
])
def test_a_block_runs_from_create_to_what_it_cannot_hold(instrs, end):
    assert find_block(instrs, 0, _IMPORTS) == end


_FENCE = _call(5, [isa.REF_BIT | 1], [isa.REF_BIT | 8])
_MOVED_CB = _CB | isa.MOVE_BIT


def _execute(cb=_MOVED_CB, *more):
    return _call(3, [isa.REF_BIT | 1, 0, isa.REF_BIT | 7, isa.REF_BIT | 8, cb, 0, *more])


@pytest.mark.parametrize("after, found", [
    ([_FENCE, _ADD, _execute()], (5, 3, 4)),  # the next use of the command buffer
    ([_execute()], (3, 3, 4)),
    ([_execute(_CB)], None),  # not its last use: the command buffer must exist
    ([_execute(_MOVED_CB, _CB)], None),  # named twice
    ([_BARRIER, _execute()], None),  # another use first
    ([_call(4, [isa.REF_BIT | 5, isa.REF_BIT | 6], [7]), _execute()], (4, 3, 4)),
    ([isa.Instruction(0, 0, "br", [0, []], (("B", ""), ("O", ""))), _execute()], None),
    ([_call(0, [isa.REF_BIT | 1], [isa.REF_BIT | 9]), _execute()], None),  # other imports
    ([_ADD], None),
])
def test_a_block_fuses_with_the_execute_its_command_buffer_moves_into(after, found):
    instrs = [_CREATE, _BARRIER, _FINALIZE, *after]
    assert find_block(instrs, 0, _IMPORTS) == 3
    assert find_execute(instrs, 0, 3, _IMPORTS) == found


def test_a_block_whose_last_operation_moves_the_command_buffer_fuses_with_nothing():
    instrs = [_CREATE, _BARRIER, _call(2, [_MOVED_CB]), _execute()]
    assert find_block(instrs, 0, _IMPORTS) == 3
    assert find_execute(instrs, 0, 3, _IMPORTS) is None


# -- a recurrent step's head and tail (`find_allocas`, `find_tail`, `hal_blocks`) ----------

_STEP_IMPORTS = [_Import(n) for n in (
    "hal.fence.join", "hal.fence.create", "hal.device.queue.alloca",
    "hal.device.queue.execute", "hal.device.queue.dealloca")]
_JOIN, _NEW, _ALLOCA, _EXEC, _FREE = range(5)
_DEV = isa.REF_BIT | 1


def _r(n, moved=False):
    return isa.REF_BIT | n | (isa.MOVE_BIT if moved else 0)


def _variadic(k: int, src: list, dst: list) -> isa.Instruction:
    return isa.Instruction(0, 0, "call.variadic",
                           [k | isa.IMPORT_BIT, [0, len(src) - 1], list(src), list(dst)], ())


def _alloca(wait, signal, buffer):
    return _call(_ALLOCA, [_DEV, 0, wait, signal, 0, 0, 0, 0, 0], [_r(buffer)])


# GRU's head: join the step's waits into 7; per buffer (10, 12) a new fence (8, 11) and an
# alloca waiting on 7 and signalling it; the join of 8 and 11 into 11
_HEAD = [
    _variadic(_JOIN, [0, _r(2), _r(3, True)], [_r(7)]),
    _call(_NEW, [_DEV, 0], [_r(8)]), _alloca(_r(7), _r(8), 10),
    _call(_NEW, [_DEV, 0], [_r(11)]), _alloca(_r(7, True), _r(11), 12),
    _variadic(_JOIN, [0, _r(8, True), _r(11, True)], [_r(11)]),
]


@pytest.mark.parametrize("change, end", [
    (lambda h: h, 6),
    (lambda h: h[1:], 5),  # no join before: the allocas wait on one fence
    (lambda h: h + [_ADD], 6),
    (lambda h: h[:3] + h[5:], None),  # one alloca is not worth a site
    (lambda h: h[:4] + [_alloca(_r(7), _r(11), 12)] + h[5:], None),  # the wait lives on
    (lambda h: h[:5] + [_variadic(_JOIN, [0, _r(8), _r(11, True)], [_r(11)])], None),
    (lambda h: h[:4] + [_alloca(_r(9, True), _r(11), 12)] + h[5:], None),  # another wait
    (lambda h: h[:4] + [_call(_ALLOCA, [_r(10), 0, _r(7, True), _r(11), 0, 0, 0, 0, 0],
                              [_r(12)])] + h[5:], None),  # reads a buffer the head made
])
def test_a_steps_head_runs_from_its_join_to_the_join_of_its_allocas_fences(change, end):
    assert find_allocas(change(list(_HEAD)), 0, _STEP_IMPORTS) == end


# GRU's tail: a new fence 8, the execute (waits 11, signals 8, moves the command buffer),
# a new fence 7, the dealloca of 12 waiting on 8 (moved) and signalling 7
_TAIL = [
    _call(_NEW, [_DEV, 0], [_r(8)]),
    _call(_EXEC, [_DEV, 0, _r(11, True), _r(8), _MOVED_CB, 0]),
    _call(_NEW, [_DEV, 0], [_r(7)]),
    _call(_FREE, [_DEV, 0, _r(8, True), _r(7), _r(12, True), 0]),
]


@pytest.mark.parametrize("change, found", [
    (lambda t: t, True),
    (lambda t: [_ADD] + t[1:], False),  # the signal was not made just before
    (lambda t: t[:3] + [_call(_FREE, [_DEV, 0, _r(8), _r(7), _r(12, True), 0])], False),
    (lambda t: t[:3] + [_call(_FREE, [_DEV, 0, _r(9, True), _r(7), _r(12, True), 0])], False),
    (lambda t: t[:2] + [_ADD, t[3]], False),
    (lambda t: t[:1] + [_call(_EXEC, [_DEV, 0, _r(8), _r(8), _MOVED_CB, 0])] + t[2:], False),
])
def test_a_steps_tail_is_the_new_fence_execute_new_fence_dealloca_around_it(change, found):
    assert find_tail(change(list(_TAIL)), 1, _STEP_IMPORTS) is found


_HEAD_NAMES = ["hal.fence.join", "hal.fence.create", "hal.device.queue.alloca",
               "hal.fence.create", "hal.device.queue.alloca", "hal.fence.join"]


def _o(index):
    return ("o", index)


# values: 0 device, 1 and 2 the fences joined, 3 the first buffer's size
_HEAD_RUN = AllocaRun((
    (0, (_k(0), ((_d(1),), (_d(2),)))),
    (1, (_d(0), _k(0))),
    (2, (_d(0), _k(-1), _o(0), _o(1), _k(0), _k(48), _k(3075), _d(3), _k(0))),
    (1, (_d(0), _k(0))),
    (2, (_d(0), _k(-1), _o(0), _o(3), _k(0), _k(48), _k(3075), _k(256), _k(0))),
    (0, (_k(0), ((_o(1),), (_o(3),)))),
), 4, (2, 4, 5))


@pytest.fixture
def hal_sites():
    """A `hal` module over a sync device (a small ring), and a function making the
    site of a step run: the module's (`block_recorder`) or the one calling its imports
    one by one (`replay`)."""
    device = hal.create_device("sync", transient_capacity=1 << 16)
    module = create_hal_module(device)

    def make(names, run, served=True):
        functions = [module.functions[name].fn for name in names]
        return module.block_recorder(names, run, functions) if served else replay(
            run, functions)

    yield device, make
    module.on_close()
    device.close()


def _shim_calls(fn, *shims) -> int:
    codes = [getattr(shim, "__func__", shim).__code__ for shim in shims]
    return _calls_of(codes[0], fn, *codes[1:])


def test_a_steps_head_is_one_hal_operation_when_its_waits_are_reached(hal_sites):
    """All waits reached on a device without a profile: the allocas are placed by one
    `Device.queue_allocas` (no alloca or fence shim runs) and the fence the execute
    would wait on is None, as there is nothing to wait for."""
    from tinyhal.vm import hal_module

    device, make = hal_sites
    site = make(_HEAD_NAMES, _HEAD_RUN)
    site((device, None, None, 64))  # the first places through the alloca's own path
    reached = hal.Fence.pending()
    reached.signal()
    result = []
    assert _shim_calls(lambda: result.extend(site((device, reached, None, 64))),
                       hal_module.device_queue_alloca, hal_module.fence_create,
                       hal_module.fence_join) == 0
    first, second, fence = result
    assert fence is None
    assert (first.byte_length, second.byte_length) == (64, 256)
    assert device.transient.owns(first.storage) and device.transient.owns(second.storage)


def test_a_steps_head_waiting_on_a_fence_not_reached_takes_each_alloca_in_turn(hal_sites):
    device, make = hal_sites
    gate = hal.Fence.pending()
    for served in (True, False):
        first, second, fence = make(_HEAD_NAMES, _HEAD_RUN, served)((device, gate, None, 64))
        assert not fence.query()
        assert first.storage.block is None and second.storage.block is None
    gate.signal()
    assert fence.query() and first.storage.block is not None


def test_a_steps_head_raises_at_the_alloca_that_its_ring_refuses(hal_sites):
    """A size larger than the whole ring raises RESOURCE_EXHAUSTED at that alloca, as
    the imports one by one do; a pool raises the alloca shim's UNIMPLEMENTED."""
    device, make = hal_sites
    messages = []
    for served in (True, False):
        with pytest.raises(errors.ResourceExhaustedError) as caught:
            make(_HEAD_NAMES, _HEAD_RUN, served)((device, None, None, 1 << 20))
        messages.append(str(caught.value))
    assert messages[0] == messages[1]
    pooled = _HEAD_RUN._replace(ops=_HEAD_RUN.ops[:2] + (
        (2, (_d(0), _k(-1), _o(0), _o(1), _k(1), _k(48), _k(3075), _d(3), _k(0))),)
        + _HEAD_RUN.ops[3:])
    with pytest.raises(errors.UnimplementedError):
        make(_HEAD_NAMES, pooled)((device, None, None, 64))
    with pytest.raises(errors.InvalidArgumentError, match="hal.device"):
        make(_HEAD_NAMES, _HEAD_RUN)(("not a device", None, None, 64))


def test_a_steps_head_under_a_profile_records_each_alloca(hal_sites):
    device, make = hal_sites
    site = make(_HEAD_NAMES, _HEAD_RUN)
    with device.profiling("queue-events") as profile:
        first, second, fence = site((device, None, None, 64))
    assert profile.summary().queue_operations.get("alloca") == 2
    fence.wait(timeout=60)


_STEP_NAMES = FMA_NAMES + ["hal.device.queue.execute", "hal.fence.create",
                           "hal.fence.create", "hal.device.queue.dealloca"]
_X0 = ("x", 0)
_STEP_BLOCK = FMA_BLOCK._replace(execute=(4, 4), after=(3, (
    (5, (_X0, _k(0))), (5, (_X0, _k(0))),
    (7, (_X0, ("x", 1), ("s", 0), ("s", 1), ("a", 0), _k(0))))))


def _fma_values(device, exe, seed):
    a, b, *buffers = _buffers(device, seed)
    return a, b, buffers[2], (device, exe, 0, *buffers)


def _step(fences, site, device, gate, values, scratch):
    fences.append(site(device, -1, gate, None, values, 0, scratch))


@pytest.mark.parametrize("gated", [False, True])
def test_a_steps_tail_submits_and_gives_the_scratch_buffer_back(hal_sites, gated):
    """The block fused with its execute and the step's dealloca: its results, and the
    scratch buffer's memory back in the ring once the fence it returns is reached; one
    `Device.queue_execute_dealloca` when the wait is reached (the fence then already
    is), the imports' path when it is not (the fence then waits for it)."""
    from tinyhal.vm import hal_module

    device, make = hal_sites
    exe = device.load_executable(compile_executable("elementwise_3d", embedded=True))
    site = make(_STEP_NAMES, _STEP_BLOCK)
    for seed in range(3):
        a, b, out, values = _fma_values(device, exe, seed)
        scratch = device.queue_alloca(64)
        gate = hal.Fence.pending() if gated else None
        fences = []
        step = functools.partial(_step, fences, site, device, gate, values, scratch)
        # and an adopted step (after the first) hands its submission over as is: no
        # command buffer is built for it
        assert _shim_calls(step, hal_module.device_queue_execute,
                           hal_module.device_queue_dealloca, hal_module.fence_create,
                           CommandBuffer.adopted) == 0
        if gated:
            assert not fences[0].query() and not scratch.storage.released
            gate.signal()
        fences[0].wait(timeout=60)
        assert scratch.storage.released
        assert BufferView(out, (16,), F32).to_numpy().tobytes() == (a * 2 + b).tobytes()


def test_a_steps_tail_under_a_profile_records_the_execute_and_the_dealloca(hal_sites):
    device, make = hal_sites
    exe = device.load_executable(compile_executable("elementwise_3d", embedded=True))
    site = make(_STEP_NAMES, _STEP_BLOCK)
    site(device, -1, None, None, _fma_values(device, exe, 0)[3], 0, device.queue_alloca(64))
    with device.profiling("queue-events") as profile:
        scratch = device.queue_alloca(64)
        a, b, out, values = _fma_values(device, exe, 1)
        fences = []
        # profiled, the adopted step passes a command buffer, which the profile names
        assert _shim_calls(functools.partial(
            _step, fences, site, device, None, values, scratch), CommandBuffer.adopted) == 1
        fences[0].wait(timeout=60)
    operations = profile.summary().queue_operations
    assert operations.get("execute") == 1 and operations.get("dealloca") == 1
    assert BufferView(out, (16,), F32).to_numpy().tobytes() == (a * 2 + b).tobytes()


def test_the_generic_sites_of_a_steps_head_and_tail_call_the_imports_in_order():
    calls = []

    def recorder(name, result=None):
        def fn(*args):
            calls.append((name, args))
            return result if result is not None else name
        return fn

    head = replay(_HEAD_RUN, [recorder(n, f"{n}#{i}") for i, n in enumerate(_HEAD_NAMES)])
    assert head(("dev", "w1", "w2", 64)) == ("hal.device.queue.alloca#2",
                                               "hal.device.queue.alloca#4",
                                               "hal.fence.join#5")
    assert [args for _, args in calls][2] == ("dev", -1, "hal.fence.join#0",
                                              "hal.fence.create#1", 0, 48, 3075, 64, 0)
    calls.clear()
    names = [*_STEP_NAMES[:5], "ran", "freed", "dealloca"]
    tail = replay(_STEP_BLOCK, [recorder(n) for n in names])
    assert tail("dev", -1, "wait", None, ("dev", "exe", 7, "a", "b", "c"), 0,
                "scratch") == "freed"
    assert [name for name, _ in calls] == ["ran", *FMA_NAMES, "hal.device.queue.execute",
                                           "freed", "dealloca"]
    assert calls[-3][1] == ("dev", -1, "wait", "ran", "hal.command_buffer.create", 0)
    assert calls[-1][1] == ("dev", -1, "ran", "freed", "scratch", 0)


@pytest.mark.parametrize("driver", ["sync", "task"])
@pytest.mark.parametrize("name", ["gru", "lstm"])
def test_a_recurrent_models_steps_run_as_two_hal_operations_each(driver, name):
    """Each time step of GRU and LSTM is translated into a head (`find_allocas`) and a
    tail (`find_tail`): on a device that places its allocas at once no step calls the
    alloca, dealloca or fence-create shims, only the step's two HAL operations (on
    `task`, a step after one whose stream a worker finished takes the imports' path)."""
    pytest.importorskip("onnx")
    from support.zoo import ZOO, zoo_inputs, zoo_vmfb
    from tinyhal.hal.device import Device
    from tinyhal.vm import hal_module

    with tinyhal.load(zoo_vmfb(name), device=driver) as module:
        fn = getattr(module, ZOO[name].function)
        args = zoo_inputs(name)
        fn(*args)
        run = functools.partial(fn, *args)
        heads = _calls_of(Device.queue_allocas.__code__, run)
        tails = _calls_of(Device.queue_execute_dealloca.__code__, run)
        if driver == "sync":
            assert heads >= 2 and tails == heads
            once = _shim_calls(run, hal_module.device_queue_dealloca, hal_module.fence_create)
            assert once < heads  # what the call does outside its loop
        else:
            assert heads >= 2 and tails >= 1


def test_a_steps_head_and_tail_on_a_device_of_several_queues_take_the_imports_path():
    """The queue an affinity picks is the shims' rule: a device of two queues calls the
    imports one by one, with the same results."""
    from tinyhal.hal.device import Device

    device = hal.create_device("emu", queues=2)
    module = create_hal_module(device)
    try:
        head = module.block_recorder(_HEAD_NAMES, _HEAD_RUN,
                                     [module.functions[n].fn for n in _HEAD_NAMES])
        first, second, fence = [], [], []

        def run():
            a, b, f = head((device, None, None, 64))
            first.append(a), second.append(b), fence.append(f)

        assert _calls_of(Device.queue_allocas.__code__, run) == 0
        fence[0].wait(timeout=60)
        assert (first[0].byte_length, second[0].byte_length) == (64, 256)
    finally:
        module.on_close()
        device.close()


def test_a_steps_tail_over_a_buffer_not_of_the_ring_only_orders_it(hal_sites):
    """A dealloca of memory `queue_alloca` did not make only orders the queue (as the
    shim does): the buffer lives on."""
    device, make = hal_sites
    exe = device.load_executable(compile_executable("elementwise_3d", embedded=True))
    site = make(_STEP_NAMES, _STEP_BLOCK)
    for seed in range(2):
        a, b, out, values = _fma_values(device, exe, seed)
        kept = device.allocator.allocate(64)
        site(device, -1, None, None, values, 0, kept).wait(timeout=60)
        assert not kept.storage.released
        device.write_bytes(kept, bytes(64))
        assert BufferView(out, (16,), F32).to_numpy().tobytes() == (a * 2 + b).tobytes()

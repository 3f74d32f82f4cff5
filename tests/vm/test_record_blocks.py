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
from tinyhal.vm import isa
from tinyhal.vm.hal_module import command_buffer_dispatch, create_hal_module
from tinyhal.vm.record_blocks import RecordBlock, find_block, find_execute, replay

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


def _calls_of(code, fn) -> int:
    """How many times running `fn` enters a function whose code is `code`."""
    calls = 0

    def profile(frame, event, arg):
        nonlocal calls
        if event == "call" and frame.f_code is code:
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

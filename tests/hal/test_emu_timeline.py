"""The modelled timeline of real programs, pinned: how the emulated device runs them
(engines, queues, the plans fast mode replays) may change, what it models may not.

The expected values were recorded from the driver that placed every operation one at a
time, before fast mode replayed plans (`hal/drivers/emu_engines.py`): per model and
preset, three invocations' modelled total, dispatch and transfer counts, bytes moved,
busy time per engine and queue, and a digest of every trace event (name, engine,
modelled start and duration, size, queue, units).
"""

from __future__ import annotations

import hashlib
import json
import random

import pytest

import tinyhal
from support.models import ds_cnn_kws_vmfb, kws_input
from tinyhal import hal

pytestmark = pytest.mark.timeout(300)

EXPECTED = {
    ("bert_tiny", "generic"): (491172, 108, 6, 1152, [("compute", 394950), ("dma0", 12072), ("queue0", 491172)], 114, "e807d3667d6987bf"),
    ("bert_tiny", "edge-npu"): (5227074, 108, 6, 1152, [("compute", 2912247), ("dma0", 6072), ("dma1", 6072), ("queue0", 5227074)], 114, "ab74d4f9c3b64dc8"),
    ("bert_tiny", "datacenter"): (327690, 108, 6, 1152, [("compute", 24592), ("dma0", 2008), ("dma1", 2008), ("dma2", 1004), ("dma3", 1004), ("queue0", 327690)], 114, "f9ffaf93a74f9f5b"),
    ("gpt_step", "generic"): (706188, 159, 18, 196656, [("compute", 187425), ("dma0", 48288), ("queue0", 706188)], 177, "dd4b2df96f0da2c8"),
    ("gpt_step", "edge-npu"): (5928651, 159, 18, 196656, [("compute", 898002), ("dma0", 30291), ("dma1", 30291), ("queue0", 5928651)], 177, "6f4282c89a12df06"),
    ("gpt_step", "datacenter"): (481257, 159, 18, 196656, [("compute", 8251), ("dma0", 5984), ("dma1", 5984), ("dma2", 4984), ("dma3", 4984), ("queue0", 481257)], 177, "12a2aaafa0c9ff6c"),
    ("lstm", "generic"): (5222784, 864, 393, 486144, [("compute", 550800), ("dma0", 816384), ("queue0", 5222784)], 1257, "152ed9399e079e60"),
    ("lstm", "edge-npu"): (16022880, 864, 393, 486144, [("compute", 948888), ("dma0", 417072), ("dma1", 429696), ("queue0", 16022880)], 1257, "11b8acdc40170531"),
    ("lstm", "datacenter"): (3164481, 864, 393, 486144, [("compute", 21600), ("dma0", 102072), ("dma1", 101031), ("dma2", 98603), ("dma3", 100990), ("queue0", 3164481)], 1257, "6f16002d7482f222"),
    ("kws", "generic"): (206088, 36, 18, 594840, [("compute", 166425), ("dma0", 73176), ("queue0", 206088)], 54, "5f6a171d6fd16335"),
    ("kws", "edge-npu"): (755073, 36, 18, 594840, [("compute", 628762), ("dma0", 55023), ("dma1", 55332), ("queue0", 755073)], 54, "b164f1ea9faf5848"),
    ("kws", "datacenter"): (121485, 36, 18, 594840, [("compute", 23550), ("dma0", 7982), ("dma1", 8016), ("dma2", 6943), ("dma3", 6960), ("queue0", 121485)], 54, "5c8537a104138f0b"),
}  # fmt: skip
PRESETS = ("generic", "edge-npu", "datacenter")
CALLS = 3


def _program(name: str):
    """(vmfb, function, inputs) of a model."""
    if name == "kws":
        return ds_cnn_kws_vmfb(), "ds_cnn_kws", (kws_input(),)
    pytest.importorskip("onnx")
    from support.zoo import ZOO, zoo_inputs, zoo_vmfb

    return zoo_vmfb(name), ZOO[name].function, zoo_inputs(name)


def timeline(emu, vmfb, function: str, inputs: tuple, calls: int = CALLS) -> tuple:
    with tinyhal.load(vmfb, device=emu) as module:
        for _ in range(calls):
            getattr(module, function)(*inputs)
    s = emu.summary()
    events = [(e.name, e.engine, e.start_ns, e.duration_ns, e.size, e.queue, e.units)
              for e in emu.trace()]
    digest = hashlib.sha256(json.dumps(events).encode()).hexdigest()[:16]
    return (s.modelled_ns, s.dispatches, s.transfers, s.bytes_moved,
            sorted(s.busy_ns.items()), len(events), digest)


@pytest.fixture(scope="module", params=["bert_tiny", "gpt_step", "lstm", "kws"])
def program(request):
    return request.param, _program(request.param)


@pytest.mark.parametrize("preset", PRESETS)
def test_fast_mode_models_what_placing_each_operation_modelled(program, preset):
    name, (vmfb, function, inputs) = program
    with hal.create_device("emu", preset=preset) as emu:
        got = timeline(emu, vmfb, function, inputs)
    assert got == EXPECTED[name, preset]


@pytest.mark.parametrize("preset", ["edge-npu"])
def test_operation_by_operation_models_the_same(program, preset):
    """A fault armed for an export that never runs makes the device place operations one
    at a time (as it does while profiling, pacing or calibrating): same timeline."""
    name, (vmfb, function, inputs) = program
    with hal.create_device("emu", preset=preset) as emu:
        emu.inject_fault("dispatch", export="no such export")
        got = timeline(emu, vmfb, function, inputs)
    assert got == EXPECTED[name, preset]


NOOP = ("static int k(const tinyhal_environment_t* e, const tinyhal_dispatch_state_t* d,"
        " const tinyhal_workgroup_state_t* w) { return 0; }")


def _hal_timeline(library, one_at_a_time: bool, seed: int, queues: int,
                  mixed: bool = False) -> tuple:
    """Reusable command buffers of fills, copies and dispatches (1 to 13 workgroups on 6
    units) with and without barriers, made from `seed`, submitted in turn on `queues`
    queues over three DMA engines, each several times, each finished before the next is
    submitted (so the order is fixed) but none waiting for another (so the queues overlap
    in modelled time): replayed plans meet engines left busy past their queue's start
    by other queues, and units some of which other queues freed before it. Host writes
    into device memory come between some of them (modelled as queue updates on queue
    0, in fast mode after the fact); `mixed` runs about half of the submissions under
    a profiling session, which places their operations one at a time between replays."""
    rng = random.Random(seed)
    between = random.Random(seed + 1000)  # the same writes and mixing in every run
    with hal.create_device("emu", queues=queues, dma_engines=3, compute_units=6,
                           memory_bandwidth=4e9, dma_bandwidth=2e9) as emu:
        if one_at_a_time:
            emu.inject_fault("dispatch", export="no such export")
        exe = emu.load_executable(library)
        a = emu.allocator.allocate(1 << 16)
        b = emu.allocator.allocate(1 << 16)
        shapes = []
        for _ in range(6):
            cb = emu.create_command_buffer("reusable")
            for _ in range(rng.randint(1, 6)):
                kind = rng.randrange(4)
                if kind == 0:
                    cb.fill(a, 0, 256 << rng.randrange(6), rng.randrange(1, 200))
                elif kind == 1:
                    cb.copy(a, 0, b, 1024, 512 * rng.randint(1, 8))
                else:
                    cb.dispatch(exe, "k", (rng.choice((1, 1, 2, 3, 5, 13)), 1, 1),
                                bindings=[b])
                if rng.random() < 0.3:
                    cb.barrier()
            cb.finalize()
            shapes.append(cb)
        sem = emu.create_semaphore()
        for n in range(1, 41):  # no semaphore orders them: the queues overlap
            for _ in range(between.choice((0, 0, 1, 2))):
                emu.write_bytes(a, bytes(between.randint(1, 4096)), between.randrange(4096))
            cb, queue = rng.choice(shapes), rng.randrange(queues)
            if between.random() < 0.5 and mixed:
                with emu.profiling():
                    emu.submit(cb, signal=[(sem, n)], queue=queue)
                    sem.wait(n, timeout=30)
            else:
                emu.submit(cb, signal=[(sem, n)], queue=queue)
                sem.wait(n, timeout=30)
        s = emu.summary()
        return ([(e.name, e.engine, e.start_ns, e.duration_ns, e.size, e.queue, e.units)
                 for e in emu.trace()], s.modelled_ns, sorted(s.busy_ns.items()),
                s.bytes_moved, emu.clock_ns)


@pytest.mark.parametrize(("seed", "queues"), [(1, 2), (2, 3), (3, 1), (4, 4)])
def test_replayed_plans_match_placing_each_operation(seed, queues):
    library = hal.build_executable(NOOP, ["k"], name="emu_timeline_noop")
    replayed = _hal_timeline(library, False, seed, queues)
    placed = _hal_timeline(library, True, seed, queues)
    assert replayed == placed
    assert len(replayed[0]) > 40
    assert _hal_timeline(library, False, seed, queues, mixed=True) == placed

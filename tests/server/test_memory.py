"""Per-version invocation peaks stay exact when `DeviceMemory` skips the peak restart."""

from __future__ import annotations

import random
from types import SimpleNamespace

from tinyhal.hal.allocator import Allocator
from tinyhal.server.memory import DeviceMemory


def _run(memory: DeviceMemory, device, known: dict, version: str, held: int,
         leftover: int, skip: bool = True) -> None:
    """One invocation of `version` that holds `held` bytes at its most and leaves
    `leftover` of them live (outputs kept by the caller, a cache that grew)."""
    allocator = device.allocator
    watch = memory.begin("d", device, known.get(version) if skip else None)
    allocator.track("device", held)
    allocator.track("device", leftover - held)
    got = memory.end(watch, device)
    if got is not None and got > known.get(version, 0):
        known[version] = got


def test_skipped_restarts_give_the_same_maxima_as_restarting_every_time():
    rng = random.Random(3)
    for _ in range(50):
        devices = [SimpleNamespace(allocator=Allocator("d")) for _ in range(2)]
        lazy, eager = DeviceMemory(), DeviceMemory()
        known_lazy: dict = {}
        known_eager: dict = {}
        truth: dict = {}
        for _ in range(40):
            version = rng.choice("ab")
            held = rng.randrange(0, 4096, 64)
            leftover = rng.choice([0, 0, 0, rng.randrange(0, held + 1)])
            truth[version] = max(truth.get(version, 0), held)
            _run(lazy, devices[0], known_lazy, version, held, leftover)
            _run(eager, devices[1], known_eager, version, held, leftover, skip=False)
        assert known_lazy == known_eager == truth
        assert lazy.device_peaks("d", devices[0].allocator.statistics()) == \
            eager.device_peaks("d", devices[1].allocator.statistics())


def test_steady_invocations_leave_the_allocator_peak_alone():
    device = SimpleNamespace(allocator=Allocator("d"))
    memory, known = DeviceMemory(), {}
    calls = []
    reset = device.allocator.reset_peak
    device.allocator.reset_peak = lambda: (calls.append(1), reset())
    for _ in range(10):
        _run(memory, device, known, "a", 1024, 0)
    assert known == {"a": 1024}
    assert len(calls) == 1

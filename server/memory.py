"""Per-model-version peak device memory: the most device memory one invocation held.

The allocator counts live and peak bytes per device, shared by every model on it. To
attribute memory to one model version, `DeviceMemory` watches invocations per device:
when an invocation starts while none other runs on its device, it folds the allocator's
peaks so far into its own since-start record, restarts the allocator's peak tracking
(`Allocator.reset_peak`) and notes the live bytes. If it is still alone when it ends, the
allocator's peak minus the live bytes at its start is what it held at its most (inputs,
outputs and transients, the ringbuffer included). Invocations that overlapped with another
on the same device are not attributed (their peaks would mix); the figure is the maximum
over attributed invocations.

The device-wide peaks on /metrics stay "since start": `device_peaks()` is the maximum of
the folded record and the allocator's current peaks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["DeviceMemory", "Invocation"]


@dataclass
class Invocation:
    device_name: str
    live_before: int
    alone: bool = True


@dataclass
class _DeviceState:
    running: list[Invocation] = field(default_factory=list)
    peak_total: int = 0
    heap_peaks: dict[str, int] = field(default_factory=dict)


class DeviceMemory:
    def __init__(self) -> None:
        self._devices: dict[str, _DeviceState] = {}

    def begin(self, device_name: str, device: Any, known_peak: int | None = None) -> Invocation:
        """Starts watching one invocation; `known_peak` is the most its model version held
        so far (None: nothing yet), which lets the peak restart be skipped (see above)."""
        state = self._devices.setdefault(device_name, _DeviceState())
        allocator = device.allocator
        if state.running:
            for other in state.running:
                other.alone = False
            invocation = Invocation(device_name, 0, alone=False)
        else:
            total = allocator.total
            with allocator.lock:
                live, peak = total.live, total.peak
            if known_peak is None or peak - live > known_peak:
                self._fold(state, allocator.statistics())
                allocator.reset_peak()
                live = total.live
            invocation = Invocation(device_name, live)
        state.running.append(invocation)
        return invocation

    def end(self, invocation: Invocation, device: Any) -> int | None:
        """Bytes the invocation held at its most, or None when it did not run alone."""
        state = self._devices[invocation.device_name]
        state.running.remove(invocation)
        if not invocation.alone:
            return None
        return max(0, device.allocator.total.peak - invocation.live_before)

    def device_peaks(self, device_name: str, stats: Any) -> tuple[int, dict[str, int]]:
        """(peak bytes, {heap: peak bytes}) since start for the device."""
        state = self._devices.get(device_name)
        if state is None:
            return stats.peak_bytes, {h: s.peak_bytes for h, s in stats.heaps.items()}
        return max(state.peak_total, stats.peak_bytes), {
            h: max(state.heap_peaks.get(h, 0), s.peak_bytes) for h, s in stats.heaps.items()}

    @staticmethod
    def _fold(state: _DeviceState, stats: Any) -> None:
        state.peak_total = max(state.peak_total, stats.peak_bytes)
        for heap, s in stats.heaps.items():
            state.heap_peaks[heap] = max(state.heap_peaks.get(heap, 0), s.peak_bytes)

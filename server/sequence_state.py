"""Where the implicit state of a sequence model's live sequences lives: rows of device
buffers the program returned (`DeviceState`), and what one instance runs a step with
(`StepProgram`). The sequence batcher (sequences.py) decides which rows an execution
takes; this module gathers them on the device and knows what they hold."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..hal.buffer import ALIGNMENT
from ..hal.buffer_view import BufferView, dense_byte_length
from ..hal.semaphore import Fence
from ..hal.types import BufferUsage, element_type_for, pack_elements, unpack_elements

__all__ = ["DeviceState", "StepProgram"]

_STATE_USAGE = int(BufferUsage.DEFAULT | BufferUsage.MAPPING)


@dataclass  # not frozen: an unload drops `module` (a stopped scheduler outlives it)
class StepProgram:
    """What executions run on one instance: its loaded module (`tinyhal.vm.Module`), the
    step function's name, and the lock a `sync` device needs (it runs work inline on
    the calling thread, one invocation at a time), or None."""

    module: Any
    function: str
    lock: Any = None


class DeviceState:
    """Where the implicit state of live sequences lives: in device buffers, never on the
    host. A sequence's state is a *row* of a buffer the program returned (its state
    output of the sequence's last step: row i of an execution belongs to the i-th
    sequence of its batch) or, before its first step succeeded, a row of a block of
    copies of the initial value made when the model loaded. Those buffers are never
    written after the program returned them, so a row stays valid while any sequence
    refers to it and is released with the last one.

    Gather builds an execution's state input from its sequences' rows: when they are
    consecutive rows of one buffer (the batch is ordered by where its rows are, so a
    group of sequences that stepped together last time and steps together again is one
    run) the input is a view of that buffer, with no copy; otherwise one device copy
    per run of consecutive rows into a new buffer. Scatter is free: the state output
    becomes the rows' new home. The gathers' copies signal a fence the invocation takes
    as its wait fence (`take_gathers`): a coarse-fences step function waits for them on
    the device; for a synchronous one the host waits before calling it."""

    def __init__(self, states: tuple[Any, ...], rows: int,
                 programs: list[StepProgram]) -> None:
        module = programs[0].module
        self.device = device = module.device
        self._memory = module.input_memory_type
        self.element_types = [int(element_type_for(s.initial.dtype)) for s in states]
        self.row_bytes = [dense_byte_length(s.dims, t)
                          for s, t in zip(states, self.element_types)]
        self.dims = [s.dims for s in states]
        self.initial = []
        for state, element_type, size in zip(states, self.element_types, self.row_bytes):
            block = device.allocator.allocate(rows * size, self._memory, _STATE_USAGE)
            row = pack_elements(np.ascontiguousarray(state.initial), element_type).tobytes()
            device.write_bytes(block, row * rows)
            self.initial.append(block)
        self.initial_home = (tuple(self.initial), 0)
        self._gathers: dict[int, list] = {id(p): [] for p in programs}
        # gathers passed as views of where the rows are, gathers that copied, copies
        self.counts = {"in_place": 0, "copied": 0, "copies": 0}

    def gather(self, program: StepProgram, state: int, homes: list[tuple[tuple, int]],
               copy: bool = False) -> BufferView:
        """The state input made of the rows `homes` ((buffers per state, row) each); in a
        new buffer of just those rows with `copy`."""
        size = self.row_bytes[state]
        runs: list[list] = []  # [source, first source row, first batch row, rows]
        initial = self.initial[state]
        for i, (buffers, row) in enumerate(homes):
            source = buffers[state]
            if runs:
                last = runs[-1]
                if last[0] is source and last[1] + last[3] == row:
                    last[3] += 1
                    continue
                if source is initial and last[0] is initial:  # any initial row will do
                    last[3] += 1
                    continue
            runs.append([source, row, i, 1])
        shape = (len(homes), *self.dims[state])
        element_type = self.element_types[state]
        counts = self.counts
        if len(runs) == 1 and not copy:
            source, row = runs[0][0], runs[0][1]
            offset = row * size
            if offset == 0 and source.byte_length == len(homes) * size:
                counts["in_place"] += 1
                return BufferView(source, shape, element_type)
            if offset % ALIGNMENT == 0:
                counts["in_place"] += 1
                return BufferView(source.subspan(offset, len(homes) * size), shape,
                                  element_type)
        counts["copied"] += 1
        counts["copies"] += len(runs)
        target = self.device.allocator.allocate(len(homes) * size, self._memory,
                                                _STATE_USAGE)
        commands = self.device.create_command_buffer()
        for source, row, at, count in runs:
            commands.copy(source, row * size, target, at * size, count * size)
        commands.finalize()
        done = self.device.create_semaphore(0)
        self.device.submit(commands, signal=[(done, 1)])
        self._gathers[id(program)].append(done)
        return BufferView(target, shape, element_type)

    def take_gathers(self, program: StepProgram) -> Fence | None:
        """The fence the gathers made for `program`'s next invocation signal (None when
        every state input is a view): its wait fence."""
        pending = self._gathers[id(program)]
        if not pending:
            return None
        fence = Fence([(done, 1) for done in pending])
        pending.clear()
        return fence

    def compact(self, program: StepProgram, homes: list[tuple[tuple, int]]
                ) -> list[tuple[tuple, int]]:
        """Copies the rows `homes` into new buffers of just those rows (so the larger
        buffers they were among can go once nothing else refers to them); their new
        homes, in order."""
        views = [self.gather(program, state, homes, copy=True)
                 for state in range(len(self.row_bytes))]
        done = self.take_gathers(program)
        if done is not None:
            done.wait()
        buffers = tuple(view.buffer for view in views)
        return [(buffers, i) for i in range(len(homes))]

    @property
    def initial_bytes(self) -> int:
        return sum(b.byte_length for b in self.initial)

    def read(self, state: int, home: tuple[tuple, int]) -> np.ndarray:
        """A copy of one sequence's state on the host (a transfer: for tests)."""
        buffers, row = home
        size = self.row_bytes[state]
        data = self.device.read_array(buffers[state], row * size, size)
        return unpack_elements(data, self.dims[state], self.element_types[state])

    def held_bytes(self, homes: Iterable[tuple[tuple, int]]) -> int:
        """Device memory the rows `homes` keep alive, and the initial blocks: whole
        allocations (a program may return its outputs as windows of one)."""
        blocks = {id(b.storage): b.storage.byte_length for b in self.initial}
        for home in homes:
            for buffer in home[0]:
                blocks[id(buffer.storage)] = buffer.storage.byte_length
        return sum(blocks.values())

"""The `hal` module's recording blocks (`vm.record_blocks`): a program that records the
same commands again, over new buffers, adopts the recording it made before.

A site first records its block as the unfused code would, import by import (every
check with its own message). When that succeeds, it remembers the result under the
block's operands: every value that is not a buffer (device, executable, ordinals,
workgroup counts, constants, offsets, lengths, slots) and which buffer operands were the
same buffer (the numbering of direct buffers by first use). Equal operands record equal
commands over the same slots, so on a later call with equal operands the site only
checks the new buffers against what the commands need (`Recording.admits`: live, usage
bits, bytes, aligned addresses: what recording each command checked) and hands the
command buffer the commands and, if the block finalized it, the device's recording of
them (`CommandBuffer.adopt`): a re-recorded command buffer costs a few checks per
buffer, and its submit looks nothing up. Anything else (a new operand, a buffer that
fails a check, a whole-buffer length, whose bytes depend on the buffer) records import
by import again, so errors are those of the record operation that fails.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

from ..hal.command_buffer import CommandBuffer
from ..hal.execution import Recording
from .record_blocks import RecordBlock, replay

__all__ = ["block_recorder"]

# (argument position, position in a variadic entry or None) of each buffer operand,
# and of each length that may be WHOLE_BUFFER, per record operation.
_BUFFERS = {
    "hal.command_buffer.dispatch": {(8, 2)},
    "hal.command_buffer.copy_buffer": {(3, None), (5, None)},
    "hal.command_buffer.fill_buffer": {(1, None)},
}
_LENGTHS = {
    "hal.command_buffer.dispatch": {(8, 4)},
    "hal.command_buffer.copy_buffer": {(7, None)},
    "hal.command_buffer.fill_buffer": {(3, None)},
}
MEMO_SIZE = 64  # operand sets remembered per site; past it the site starts afresh


def _leaves(template: tuple[Any, ...]):
    """(position, entry position or None, leaf) of every leaf of an argument template."""
    for position, arg in enumerate(template):
        if arg and arg[0].__class__ is str:
            yield position, None, arg
        else:
            for entry in arg:
                for item, leaf in enumerate(entry):
                    yield position, item, leaf


def _getter(indices: list[int]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    if len(indices) > 1:
        return itemgetter(*indices)
    if indices:
        i = indices[0]
        return lambda values: (values[i],)
    return lambda values: ()


def block_recorder(memos: list[dict], names: list[str], block: RecordBlock,
                   functions: Sequence[Callable[..., Any]]) -> Callable[[tuple], Any]:
    """The site serving `block` (see the module docstring); `functions` are the `hal`
    module's bound shims for its operations, which record what it cannot adopt. The
    site's memory is appended to `memos` (the module state clears them when its context
    closes: they hold recordings, and so executables)."""
    record = replay(block, functions)
    buffers, scalars, lengths = [], [], []
    for name, (_k, template) in zip(names, block.ops):
        for position, item, leaf in _leaves(template):
            if (position, item) in _LENGTHS.get(name, ()):
                lengths.append(leaf)
            if leaf[0] != "d":
                continue
            (buffers if (position, item) in _BUFFERS.get(name, ()) else scalars).append(leaf[1])
    buffers_of, scalars_of = _getter(buffers), _getter(scalars)
    count = range(len(buffers))
    memo: dict[Any, tuple[Recording, Any, Any, int, bool]] = {}
    memos.append(memo)

    def learn(key: Any, values: tuple[Any, ...], cb: Any) -> None:
        if cb.__class__ is not CommandBuffer or any(
                (values[leaf[1]] if leaf[0] == "d" else leaf[1]) < 0 for leaf in lengths):
            return
        device = cb.device
        if cb.finalized:
            recording = device.recordings.get(cb, device.concurrency)
            cb.recording = recording
        else:
            recording = Recording(tuple(cb.commands), cb.max_slot + 1, len(cb.direct),
                                  device.concurrency)
        if not recording.shareable:
            return
        if len(memo) >= MEMO_SIZE:
            memo.clear()
        memo[key] = (recording, device, cb.mode, cb.binding_capacity, cb.finalized)

    def site(values: tuple[Any, ...]) -> Any:
        first: dict[Any, int] = {}
        try:
            key = (scalars_of(values), tuple(map(first.setdefault, buffers_of(values), count)))
            entry = memo.get(key)
        except TypeError:  # an unhashable operand: not a buffer; its shim says so
            return record(values)
        if entry is None:
            cb = record(values)
            learn(key, values, cb)
            return cb
        first.pop(None, None)  # a null buffer operand names a binding table slot
        direct = list(first)
        recording, device, mode, capacity, finalized = entry
        if not recording.admits(direct):
            return record(values)
        cb = CommandBuffer(device, mode, capacity)  # `create_command_buffer`'s work
        cb.adopt(recording.commands, direct, recording.table_slots,
                 recording if finalized else None)
        return cb

    return site

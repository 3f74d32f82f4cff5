"""The `hal` module's recording blocks (`vm.record_blocks`): a program that records the
same commands again, over new buffers, adopts the recording it made before.

A site first records its block as the unfused code would, import by import (every
check with its own message). When that succeeds, it remembers the result under the
block's operands: every value that is not a buffer (device, executable, ordinals,
workgroup counts, constants, offsets, lengths, slots; the key of a dict), then which
buffer operands were the same buffer (the numbering of direct buffers by first use,
tested on later calls by position and identity, without hashing every operand again:
`_Aliasing`). Equal operands record equal
commands over the same slots, so on a later call with equal operands the site only
checks the new buffers against what the commands need (`Recording.adopter`: live, usage
bits, bytes, aligned addresses: what recording each command checked) and hands a new
command buffer the commands and, if the block finalized it, the device's recording of
them (`CommandBuffer.adopted`): a re-recorded command buffer costs a few checks per
buffer, made once for the site and its submit (which looks nothing up and reads the
addresses that check took: the `CommandBuffer.bound` submission). Anything else (a new
operand, a buffer that fails a check, a whole-buffer length, whose bytes depend on the
buffer) records import by import again, so errors are those of the record operation that
fails.

Which operands are buffers and lengths, and where the execute takes the command buffer,
is what the `hal` module's rows declare (`native_table.Traits`).

A recurrent step's head (`record_blocks.AllocaRun`) and its tail fused with the execute
(`RecordBlock.after`) are served by one `Device` operation each (`queue_allocas`,
`queue_execute_dealloca`), with the imports one by one as the fallback.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any, NamedTuple

from ..hal.buffer import Buffer
from ..hal.command_buffer import CommandBuffer
from ..hal.device import Device
from ..hal.execution import Recording
from ..hal.semaphore import Fence, fences_reached, join_fence_rows
from .native_table import ALLOCA, DEALLOCA, JOIN_FENCES, NEW_FENCE, SUBMIT, traits_of
from .record_blocks import AllocaRun, RecordBlock, after_replay, replay

__all__ = ["block_recorder"]

MEMO_SIZE = 64  # scalar operand sets (and aliasings of each) remembered per site; past it
# the site starts afresh


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
    closes: they hold recordings, and so executables). A step's head (`AllocaRun`) is
    served by `_allocas`."""
    if isinstance(block, AllocaRun):
        return _allocas(names, block, functions)
    record = replay(RecordBlock(block.ops, block.values), functions)  # the record operations
    buffers, scalars, lengths = [], [], []
    for name, (_k, template) in zip(names, block.ops):
        traits = traits_of(name)
        for position, item, leaf in _leaves(template):
            if (position, item) in traits.lengths:
                lengths.append(leaf)
            if leaf[0] != "d":
                continue
            kind = buffers if (position, item) in traits.buffers else scalars
            if leaf[1] not in kind:  # a value named again is the same value
                kind.append(leaf[1])
    buffers_of, scalars_of = _getter(buffers), _getter(scalars)
    count = range(len(buffers))
    # scalars -> what each aliasing of the buffer operands seen with them adopts: the
    # recording, and how the buffers alias (`_Aliasing`)
    memo: dict[Any, list[_Adoption]] = {}
    memos.append(memo)

    def learn(scalar_key: tuple[Any, ...], buffer_values: tuple[Any, ...],
              values: tuple[Any, ...], cb: Any) -> None:
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
        adoptions = memo.setdefault(scalar_key, [])
        if len(adoptions) >= MEMO_SIZE:
            adoptions.clear()
        adoptions.append(_Adoption(
            _Aliasing(buffer_values, count), recording.adopter(),
            functools.partial(CommandBuffer.adopted, device, cb.mode, cb.binding_capacity,
                              recording.commands),
            recording.table_slots, recording if cb.finalized else None,
            device if cb.finalized and not recording.table_slots else None))

    def adopting(values: tuple[Any, ...]) -> tuple[_Adoption, list[Any], Any] | None:
        """The adoption whose operands `values` equal, the direct buffers among them and
        the submission that binds them (`Recording.adopter`), or None: record them."""
        try:
            adoptions = memo.get(scalars_of(values))
        except TypeError:  # an unhashable operand: not a buffer; its shim says so
            return None
        if adoptions is None:
            return None
        buffer_values = buffers_of(values)
        for adoption in adoptions:
            aliasing = adoption.aliasing
            if aliasing.plain:  # `_Aliasing.direct` of distinct buffers, without its frame
                try:
                    if len(set(buffer_values)) != aliasing.distinct:
                        continue
                except TypeError:  # an unhashable operand: not a buffer; its shim says so
                    return None
                direct = list(buffer_values)
            else:
                direct = aliasing.direct(buffer_values)
                if direct is None:
                    continue
            bound = adoption.adopt(direct)
            if bound is None:
                return None
            return adoption, direct, bound
        return None

    def adopt(values: tuple[Any, ...]) -> CommandBuffer | None:
        """A command buffer of the recording whose operands `values` equal, over the
        direct buffers among them, or None: record them."""
        found = adopting(values)
        if found is None:
            return None
        adoption, direct, bound = found
        return adoption.command_buffer(direct, adoption.table_slots, adoption.finalized,
                                       bound)

    def record_anew(values: tuple[Any, ...]) -> Any:
        cb = record(values)
        try:
            scalar_key = scalars_of(values)
            adoptions = memo.get(scalar_key)
        except TypeError:
            return cb
        buffer_values = buffers_of(values)
        if adoptions is None or all(
                a.aliasing.direct(buffer_values) is None for a in adoptions):
            learn(scalar_key, buffer_values, values, cb)
        return cb

    def site(values: tuple[Any, ...]) -> Any:
        cb = adopt(values)
        return record_anew(values) if cb is None else cb

    if block.execute is None:
        return site
    execute = functions[len(block.ops)]
    submit = traits_of(names[len(block.ops)])
    if submit is None or submit.role != SUBMIT or block.execute[1] != submit.target:
        return replay(block, functions)
    position = submit.target
    if block.after is not None:
        return _execute_and_tail(block, names[len(block.ops):], functions[len(block.ops):],
                                 adopting, adopt, record_anew)

    def execute_site(*args: Any) -> None:
        """The block recorded and submitted by the execute import, the values in its
        command buffer's place: an adopted command buffer carries what its submit binds
        (`CommandBuffer.bound`)."""
        values = args[position]
        cb = adopt(values)
        if cb is None:
            cb = record_anew(values)
        return execute(*args[:position], cb, *args[position + 1:])

    return execute_site


class _Aliasing:
    """How a block's buffer operands alias: each operand is the buffer at its first
    position (`first_of`), the first positions hold distinct buffers, and a null operand
    (naming a binding table slot) sits at `null_at` among them, or nowhere (-1). Equal
    aliasing with equal scalars records equal commands over the same slots."""

    __slots__ = ("first_of", "firsts", "distinct", "null_at", "plain")

    def __init__(self, buffer_values: tuple[Any, ...], count: range) -> None:
        first: dict[Any, int] = {}
        positions = list(map(first.setdefault, buffer_values, count))
        self.first_of = _getter(positions)
        self.firsts = _getter(list(first.values()))
        self.distinct = len(first)
        self.null_at = list(first).index(None) if None in first else -1
        # every operand a different buffer (the usual case): they are the direct buffers
        self.plain = self.distinct == len(buffer_values) and self.null_at < 0

    def direct(self, buffer_values: tuple[Any, ...]) -> list[Any] | None:
        """The direct buffers (distinct, by first use, nulls left out) of operands that
        alias this way; None if they alias otherwise."""
        if self.plain:
            try:
                if len(set(buffer_values)) != self.distinct:
                    return None
            except TypeError:  # an unhashable operand: not a buffer; its shim says so
                return None
            return list(buffer_values)
        if self.first_of(buffer_values) != buffer_values:
            return None
        firsts = self.firsts(buffer_values)
        try:
            if len(set(firsts)) != self.distinct:
                return None
        except TypeError:  # an unhashable operand: not a buffer; its shim says so
            return None
        direct = list(firsts)
        null_at = self.null_at
        if null_at >= 0:
            if direct[null_at] is not None:
                return None
            del direct[null_at]
        return direct


class _Adoption(NamedTuple):
    aliasing: _Aliasing
    adopt: Callable[[list[Any]], Any]  # `Recording.adopter()`: a Submission or None
    # `CommandBuffer.adopted` with the device, mode, binding capacity and commands given
    command_buffer: Callable[..., CommandBuffer]
    table_slots: int
    finalized: Recording | None  # the recording, when the block finalized the command buffer
    # the device, when the submission `adopt` gives is the whole of a submit of the command
    # buffer (finalized, no binding table): `Device.queue_execute_dealloca` takes it as is
    submits_bound_on: Device | None


# The `hal` module's argument positions that the step sites read where its rows declare
# none (device first; the alloca's pool, memory types, usage and size; the dealloca's
# buffer), and those of the execute that the tail's site, with its fixed parameters,
# takes: its signal fence and command buffer (checked against what the rows declare).
_DEVICE, _SIGNAL, _COMMANDS = 0, 3, 4
_POOL, _MEMORY_TYPES, _USAGE, _SIZE = 4, 5, 6, 7
_FREED_BUFFER = 4
_U32 = 0xFFFFFFFF


def _allocas(names: list[str], run: AllocaRun, functions: Sequence[Callable[..., Any]]
             ) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """The site of a step's head: one `Device.queue_allocas` (the allocas' device and
    queue 0, the first join's fence or the allocas' wait, each alloca's size, memory
    types and usage), returning the buffers and the fence it gives (None when all were
    placed at once: the execute that waits on it waits on nothing); the imports one by
    one (`replay`) when the device has several queues, an operand is not what its row
    declares (their shims name it) or a pool is asked for."""
    per_import = replay(run, functions)
    traits = [traits_of(name) for name in names]
    steps = [t.step for t in traits]
    allocas = [template for (_k, template), step in zip(run.ops, steps) if step == ALLOCA]
    wait_at = traits[steps.index(ALLOCA)].wait
    device = allocas[0][_DEVICE]
    fences = [template for (_k, template), step in zip(run.ops, steps) if step == NEW_FENCE]
    if (device[0] != "d" or any(t[_DEVICE] != device for t in allocas + fences)
            or any(t[wait_at] != allocas[0][wait_at] for t in allocas)):
        return per_import
    pools = {t[_POOL] for t in allocas}
    memory_types = tuple(t[_MEMORY_TYPES] for t in allocas)
    usages = tuple(t[_USAGE] for t in allocas)
    if pools != {("k", 0)} or any(leaf[0] != "k" for leaf in memory_types + usages):
        return per_import  # a pool (refused by the shim) or kinds chosen at run time
    memory_types = tuple(m[1] & _U32 for m in memory_types)
    usages = tuple(u[1] & _U32 for u in usages)
    at = device[1]
    rows = run.ops[0][1][1] if steps[0] == JOIN_FENCES else [(allocas[0][wait_at],)]
    if any(leaf[0] != "d" for (leaf,) in rows):
        return per_import
    waits_of = _getter([leaf[1] for (leaf,) in rows])
    sizes = [t[_SIZE] for t in allocas]
    requests = None  # fixed sizes (the usual case): the same requests every step
    if all(leaf[0] == "k" for leaf in sizes):
        requests = list(zip([leaf[1] for leaf in sizes], memory_types, usages))
    sizes_of = _getter([leaf[1] if leaf[0] == "d" else -1 for leaf in sizes])
    literal_sizes = [leaf[1] if leaf[0] == "k" else None for leaf in sizes]

    def site(values: tuple[Any, ...]) -> list[Any] | tuple[Any, ...]:
        device = values[at]
        if not isinstance(device, Device) or device.queue_count != 1:
            return per_import(values)
        waits = waits_of(values)
        reached = fences_reached(waits)
        if reached is NotImplemented:
            return per_import(values)
        # what the allocas wait on: nothing when every wait is reached, else their join
        wait = None if reached else join_fence_rows(list(zip(waits)))
        if requests is None:
            given = [size if literal is None else literal
                     for size, literal in zip(sizes_of(values), literal_sizes)]
            buffers, fence = device.queue_allocas(list(zip(given, memory_types, usages)),
                                                  wait)
        else:
            buffers, fence = device.queue_allocas(requests, wait)
        buffers.append(fence)  # the buffers, then the fence
        return buffers

    return site


def _execute_and_tail(block: RecordBlock, names: list[str],
                      functions: Sequence[Callable[..., Any]], adopting: Callable[..., Any],
                      adopt: Callable[..., Any], record_anew: Callable[..., Any]
                      ) -> Callable[..., Any]:
    """The site of a block fused with its execute and the step's tail
    (`RecordBlock.after`): one `Device.queue_execute_dealloca` of the block's command
    buffer (adopted or recorded) and the dealloca's buffer, returning the fence it
    gives (for a buffer that is not the device's transient memory, it only orders the
    queue, as the dealloca shim does); the imports one by one (`after_replay`) when the
    device has several queues or an operand is not what its row declares (their shims
    name it). An adopted recording that binds no table is handed over as the submission
    its adoption gives, without a command buffer for it, while no profile records (a
    profile names the command buffers it runs)."""
    execute = functions[0]
    position = block.execute[1]
    tail = after_replay(block, functions[1:])

    def submit(arguments: list[Any]) -> None:
        values = arguments[position]
        cb = adopt(values)
        arguments[position] = record_anew(values) if cb is None else cb
        execute(*arguments)

    signal_at, ops = block.after
    steps = [traits_of(name).step for name in names[1:]]
    if (steps != [NEW_FENCE, NEW_FENCE, DEALLOCA] or position != _COMMANDS
            or signal_at != _SIGNAL
            or any(template[_DEVICE] != ("x", _DEVICE) for _k, template in ops)
            or ops[2][1][_FREED_BUFFER] != ("a", 0)):
        return lambda *args: tail(args, submit)

    def site(device: Any, affinity: Any, wait: Any, signal: Any, values: tuple[Any, ...],
             flags: Any, buffer: Any) -> Any:
        if (isinstance(device, Device) and device.queue_count == 1
                and (wait is None or wait.__class__ is Fence) and buffer.__class__ is Buffer):
            found = adopting(values)
            if found is None:
                return device.queue_execute_dealloca(record_anew(values), wait, buffer)
            adoption, direct, bound = found
            if adoption.submits_bound_on is device and device.profile is None:
                return device.queue_execute_dealloca(bound, wait, buffer)
            return device.queue_execute_dealloca(
                adoption.command_buffer(direct, adoption.table_slots, adoption.finalized,
                                        bound), wait, buffer)
        return tail((device, affinity, wait, signal, values, flags, buffer), submit)

    return site

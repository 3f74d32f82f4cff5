"""Running a whole submission in C: its operations packed as one stream.

`Stream` turns a submission's resolved operations (dispatches, fills, copies, updates)
into an array of `tinyhal_op_t` and runs it with `tinyhal_run_stream`: one participant
leads through the operations in order, any others help by claiming workgroup tiles of the
dispatch the leader has posted. Python runs once per participant per submission, never
per operation, workgroup or barrier: a stream needs no barrier handling because the
leader completes each operation, helpers included, before starting the next.

Packing happens when the submission starts (its waits are met), so transient buffers
from `queue_alloca` already have their memory.
"""

from __future__ import annotations

from typing import Any

from ..errors import Error, InternalError, ResourceExhaustedError
from .execution import BARRIER, COPY, DISPATCH, FILL, UPDATE
from .native import ffi, lib

TILES_PER_PARTICIPANT = 32  # small tiles limit what a descheduled worker holds back


class Stream:
    """One submission's operations in C memory, ready for `participants` threads."""

    __slots__ = ("_ops", "_count", "_state", "_keep", "_dispatches", "_lmem")

    def __init__(self, operations: list[tuple], participants: int = 1) -> None:
        packed = [op for op in operations if op[0] != BARRIER]
        ops = ffi.new("tinyhal_op_t[]", max(1, len(packed)))
        keep: list[Any] = []
        dispatches: dict[int, Any] = {}
        lmem = 0
        for i, op in enumerate(packed):
            kind, c = op[0], ops[i]
            if kind == DISPATCH:
                prepared = op[1]
                prepared = getattr(prepared, "prepare", lambda p=prepared: p)()
                dispatches[i] = prepared
                c.kind = lib.TINYHAL_OP_DISPATCH
                c.length = prepared.total
                c.tile = max(1, prepared.total // (participants * TILES_PER_PARTICIPANT))
                c.fn = prepared._fn
                c.environment = prepared.executable._environment
                c.state = prepared._state
                c.local_memory_size = prepared._lmem
                lmem = max(lmem, prepared._lmem)
            elif kind == FILL:
                buffer, offset, length = op[1]
                c.kind = lib.TINYHAL_OP_FILL
                c.dst = ffi.cast("void*", buffer.address + offset)
                c.length = length
                c.pattern = int(op[2])
                c.pattern_length = op[2].dtype.itemsize
            else:
                if kind == COPY:
                    source, offset, length = op[1]
                    c.src = ffi.cast("void*", source.address + offset)
                    keep.append(source)
                    target = op[2]
                elif kind == UPDATE:
                    data = ffi.from_buffer(op[2])
                    keep.append(data)
                    c.src = data
                    target, length = op[1], len(op[2])
                else:  # pragma: no cover - resolve_commands emits no other kinds
                    raise InternalError(f"unknown operation kind {kind}")
                buffer, offset, _ = target
                c.kind = lib.TINYHAL_OP_COPY
                c.dst = ffi.cast("void*", buffer.address + offset)
                c.length = length
        self._ops = ops
        self._count = len(packed)
        self._state = ffi.new("tinyhal_stream_t*")
        self._keep = (keep, operations)
        self._dispatches = dispatches
        self._lmem = lmem

    def run(self, processor_id: int = 0) -> None:
        """Participates in the stream: the first caller leads, later ones help.

        Returns when this participant is done; the leader raises the stream's error.
        """
        rc = lib.tinyhal_run_stream(self._ops, self._count, self._state, processor_id,
                                    self._lmem)
        if rc:
            raise self._error(rc)

    def _error(self, rc: int) -> Error:
        state = self._state
        prepared = self._dispatches.get(state.failed_op)
        if rc == -12 or prepared is None:
            return ResourceExhaustedError(
                f"no memory for {self._lmem} bytes of workgroup local memory"
            ) if rc == -12 else InternalError(f"stream failed with status {rc}")
        return prepared.error_for(rc, state.failed_workgroup)

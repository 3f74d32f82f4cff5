"""Stateful sequences and cellular batching (Triton's sequence batcher, KServe's
sequence extension).

A model version whose config has a `sequence_batching` object serves *sequences*: each
request names its sequence with the request parameters `sequence_id` (a non-zero uint64 or
a non-empty string), `sequence_start` (the first request) and `sequence_end` (the last).
The object mirrors Triton's `sequence_batching` message as JSON, with Triton's field names
and values, so a Triton configuration carries over:

    "sequence_batching": {
      "max_sequence_idle_microseconds": 5000000,
      "oldest": {"max_candidate_sequences": 64, "max_queue_delay_microseconds": 0,
                 "preferred_batch_size": [16]},          # or "direct": {}
      "control_input": [{"name": "START", "control": [
          {"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}]}],
      "state": [{"input_name": "STATE_IN", "output_name": "STATE_OUT",
                 "data_type": "TYPE_FP32", "dims": [16],
                 "initial_state": [{"data_type": "TYPE_FP32", "dims": [16],
                                    "zero_data": true, "name": "zeros"}]}]
    }

*Control inputs* are program inputs the server fills, shape [batch, 1]: START and END are
the request's flags as the configured false/true values (`int32_false_true`,
`fp32_false_true`, `bool_false_true`), READY is always true (only ready requests are
batched), CORRID is the sequence id as `data_type` (an integer type). *Implicit state*:
the program takes `input_name` and returns `output_name` (both [batch, *dims]); the
server keeps each live sequence's state on the device, starting from `initial_state`
(zeros, or the raw bytes of `initial_state/<data_file>` beside the model file). Clients
never see control or state tensors, and the host never reads or writes a state: a
sequence's state is the row of the state output its last step returned, left where the
program put it (`DeviceState`). The next execution's state input is a view of those
rows when the batch's rows are consecutive in one buffer (sequences that stepped
together step together again: the common case of a steady group), else it is gathered
by device copies, one per run of neighbouring rows; nothing is scattered, the output
becomes the rows' new home. A step that fails leaves its sequence's state where it was.
A buffer of states lives while any live sequence's state is a row of it; the statistics
count those bytes (`state_bytes_reserved`) beside the rows in use (`state_bytes_in_use`).
When they come to more than twice the rows in use (idle sequences keeping whole batches'
outputs alive), an idle instance copies the idle sequences' rows into buffers of their
own, on the device.

Cellular batching: every live sequence holds a slot (`max_candidate_sequences` of them
with `oldest`, `max_batch_size` x instances with `direct`; further starts wait for one).
Whenever an instance is free, one execution takes the head request of each of up to
`max_batch_size` *ready* sequences (a slot, a queued request, no request running), oldest
first: their inputs are stacked along dim 0 (in the order their state rows lie), their
state gathered on the device, the step runs once. A sequence never has two requests in
one execution, so its steps run in order; sequences join and leave between executions.
One failing request does not fail its batch-mates (each request of a failed batch runs
again alone). With `preferred_batch_size`, a batch of more ready sequences than a
preferred size but fewer than `max_batch_size` is cut back to the largest preferred size
it reaches (the others lead the next batch), as the dynamic batcher does. With
`max_queue_delay_microseconds`, a batch smaller than the largest preferred size (else
`max_batch_size`) waits at most that long after its oldest request arrived; the delay
ends through the dynamic batcher's timer (`admission.delay_timer`: a timerfd the loop
waits on), not a trio timeout, which epoll rounds up to whole milliseconds.

With `direct`, as in Triton, slot s is row s % max_batch_size of instance
s // max_batch_size for the sequence's whole life: an execution takes the ready
sequences of one instance and covers its rows up to the highest ready one; the rows in
between are null (zero inputs, READY false, START/END false, CORRID 0, the state of the
slot's idle sequence or the initial one), and their outputs are dropped.

Triton's semantics and errors (400): a request without `sequence_id` (or 0, or ""); a
request of an unknown (never started, ended or expired) sequence without
`sequence_start`; a `sequence_start` for a sequence still live. A sequence that received
nothing for `max_sequence_idle_microseconds` (none queued or running) is ended and its
slot freed. A client that closes its connection while a step of its sequence waits or
runs ends the sequence (as Triton cancels a sequence with a cancelled request): its
queued requests are dropped and its slot is freed at once, or as soon as the running
step is done (the connections of waiting steps are looked at every 20 ms, see
`http.client_gone_probe`). A client that goes away between two steps is only seen by the
idle expiry: the next step may come over another connection, as HTTP allows.
A request whose deadline passes while queued leaves its sequence with 504 (nothing ran,
the state did not change); one whose step already runs gets its 504 and the step still
updates the state.

Everything happens on the event loop except the execution (gather, invoke, scatter),
which runs on the version's instance threads, as with `admission.Admission`.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import trio

from ..hal.buffer import ALIGNMENT
from ..hal.buffer_view import BufferView, dense_byte_length
from ..hal.semaphore import Fence
from ..hal.types import BufferUsage, element_type_for, pack_elements, unpack_elements
from .admission import (
    DeadlineExceeded,
    DispatchAfterPass,
    InFlight,
    Instance,
    Overloaded,
    PendingRequest,
    Unavailable,
    answer_directly,
    delay_timer,
)
from .batching import Outcome, Results
from .http import client_gone_probe
from .protocol import DATATYPES, ProtocolError
from .stats import Latency

__all__ = ["ControlInput", "DeviceState", "SequenceBatcher", "SequenceCollector",
           "SequenceConfig", "StateSpec", "StepProgram", "parse_sequence_config",
           "sequence_parameters"]

CONTROL_KINDS = ("CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_END",
                 "CONTROL_SEQUENCE_READY", "CONTROL_SEQUENCE_CORRID")
_FALSE_TRUE = {"int32_false_true": np.int32, "fp32_false_true": np.float32,
               "bool_false_true": np.bool_}
_CORRID_TYPES = ("TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32")
DEFAULT_IDLE_US = 1_000_000  # Triton's default max_sequence_idle_microseconds
# the host phases of one execution, as recorded in `SequenceBatcher.host`
HOST_PHASES = ("gather", "invoke", "scatter", "respond")
_EXPIRED_REMEMBERED = 4096
_CLIENT_CHECK_SECONDS = 0.02  # how often waiting steps' connections are looked at
_STATE_USAGE = int(BufferUsage.DEFAULT | BufferUsage.MAPPING)
_WAIT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                 0.25, 0.5, 1.0)


@dataclass(frozen=True)
class ControlInput:
    """A program input the server fills: `kind` (CONTROL_SEQUENCE_*), its false and true
    values (START, END, READY) or its datatype (CORRID)."""

    name: str
    kind: str
    dtype: np.dtype
    false_true: tuple[Any, Any] = (0, 1)


@dataclass(frozen=True)
class StateSpec:
    """One implicit state: the program input and output that carry it, and its start value
    (shape `dims`, without the batch dim)."""

    input_name: str
    output_name: str
    datatype: str  # V2 name, e.g. FP32
    dims: tuple[int, ...]
    initial: np.ndarray

    @property
    def row_bytes(self) -> int:
        return self.initial.nbytes


@dataclass(frozen=True)
class SequenceConfig:
    max_sequence_idle_us: int
    strategy: str  # "oldest" | "direct"
    max_candidate_sequences: int
    max_queue_delay_us: int
    preferred_batch_sizes: tuple[int, ...]
    controls: tuple[ControlInput, ...]
    states: tuple[StateSpec, ...]

    def describe(self) -> dict:
        strategy: dict[str, Any] = {"max_queue_delay_microseconds": self.max_queue_delay_us,
                                    "preferred_batch_size": list(self.preferred_batch_sizes)}
        if self.strategy == "oldest":
            strategy["max_candidate_sequences"] = self.max_candidate_sequences
        return {
            "max_sequence_idle_microseconds": self.max_sequence_idle_us,
            self.strategy: strategy,
            "control_input": [{"name": c.name, "control": [{"kind": c.kind}]}
                              for c in self.controls],
            "state": [{"input_name": s.input_name, "output_name": s.output_name,
                       "data_type": "TYPE_" + s.datatype, "dims": list(s.dims)}
                      for s in self.states],
        }


def _int(value: Any, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"config '{what}' must be an integer >= {minimum}, not {value!r}")
    return value


def _object(value: Any, what: str, keys: set[str]) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"config '{what}' must be an object, not {value!r}")
    unknown = set(value) - keys
    if unknown:
        raise ValueError(f"config '{what}': unknown keys {sorted(unknown)}; known: "
                         f"{sorted(keys)}")
    return value


def _datatype(value: Any, what: str) -> str:
    name = value[5:] if isinstance(value, str) and value.startswith("TYPE_") else None
    if name not in DATATYPES:
        raise ValueError(f"config '{what}' must be a Triton data type like 'TYPE_FP32', "
                         f"not {value!r}")
    return name


def _list(value: Any, what: str) -> list:
    if not isinstance(value, list):
        raise ValueError(f"config '{what}' must be a list, not {value!r}")
    return value


def parse_sequence_config(value: Any, max_batch_size: int, version_dir: Path
                          ) -> SequenceConfig | None:
    """`sequence_batching` of a model config (None when absent); ValueError naming the
    field and the bound."""
    if value is None:
        return None
    doc = _object(value, "sequence_batching",
                  {"max_sequence_idle_microseconds", "direct", "oldest", "control_input",
                   "state"})
    if max_batch_size <= 0:
        raise ValueError("config 'sequence_batching' needs 'max_batch_size' > 0 (the batch "
                         "dim indexes sequences)")
    idle = _int(doc.get("max_sequence_idle_microseconds", DEFAULT_IDLE_US),
                "sequence_batching.max_sequence_idle_microseconds", 1)
    if "direct" in doc and "oldest" in doc:
        raise ValueError("config 'sequence_batching' takes one of 'direct' and 'oldest'")
    strategy = "oldest" if "oldest" in doc else "direct"
    where = f"sequence_batching.{strategy}"
    body = _object(doc.get(strategy, {}), where,
                   {"max_candidate_sequences", "max_queue_delay_microseconds",
                    "preferred_batch_size"} if strategy == "oldest" else
                   {"max_queue_delay_microseconds", "minimum_slot_utilization"})
    candidates = _int(body.get("max_candidate_sequences", max_batch_size),
                      f"{where}.max_candidate_sequences", 1)
    delay = _int(body.get("max_queue_delay_microseconds", 0),
                 f"{where}.max_queue_delay_microseconds", 0)
    preferred = _list(body.get("preferred_batch_size", []), f"{where}.preferred_batch_size")
    for size in preferred:
        _int(size, f"{where}.preferred_batch_size", 1)
        if size > max_batch_size:
            raise ValueError(f"config '{where}.preferred_batch_size' {size} is over "
                             f"max_batch_size {max_batch_size}")
    controls = []
    for i, item in enumerate(_list(doc.get("control_input", []),
                                   "sequence_batching.control_input")):
        what = f"sequence_batching.control_input[{i}]"
        item = _object(item, what, {"name", "control"})
        name = item.get("name")
        spec = _list(item.get("control"), f"{what}.control")
        if not isinstance(name, str) or not name or len(spec) != 1:
            raise ValueError(f"config '{what}' needs a 'name' and one 'control'")
        ctl = _object(spec[0], f"{what}.control[0]",
                      {"kind", "data_type", *_FALSE_TRUE})
        kind = ctl.get("kind")
        if kind not in CONTROL_KINDS:
            raise ValueError(f"config '{what}.control[0].kind' must be one of "
                             f"{list(CONTROL_KINDS)}, not {kind!r}")
        if kind == "CONTROL_SEQUENCE_CORRID":
            if ctl.get("data_type") not in _CORRID_TYPES:
                raise ValueError(f"config '{what}.control[0].data_type' must be one of "
                                 f"{list(_CORRID_TYPES)}, not {ctl.get('data_type')!r}")
            controls.append(ControlInput(name, kind, DATATYPES[ctl["data_type"][5:]]))
            continue
        given = [k for k in _FALSE_TRUE if k in ctl]
        if len(given) != 1:
            raise ValueError(f"config '{what}.control[0]' needs one of {list(_FALSE_TRUE)}")
        pair = _list(ctl[given[0]], f"{what}.control[0].{given[0]}")
        if len(pair) != 2:
            raise ValueError(f"config '{what}.control[0].{given[0]}' must be [false, true]")
        controls.append(ControlInput(name, kind, np.dtype(_FALSE_TRUE[given[0]]),
                                     (pair[0], pair[1])))
    states = []
    for i, item in enumerate(_list(doc.get("state", []), "sequence_batching.state")):
        what = f"sequence_batching.state[{i}]"
        item = _object(item, what, {"input_name", "output_name", "data_type", "dims",
                                    "initial_state"})
        names = item.get("input_name"), item.get("output_name")
        if not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"config '{what}' needs 'input_name' and 'output_name'")
        datatype = _datatype(item.get("data_type"), f"{what}.data_type")
        dims = tuple(_int(d, f"{what}.dims", 1) for d in _list(item.get("dims"),
                                                               f"{what}.dims"))
        initial = np.zeros(dims, DATATYPES[datatype])
        inits = _list(item.get("initial_state", []), f"{what}.initial_state")
        if len(inits) > 1:
            raise ValueError(f"config '{what}.initial_state' takes at most one entry")
        for init in inits:
            init = _object(init, f"{what}.initial_state[0]",
                           {"data_type", "dims", "zero_data", "data_file", "name"})
            if "data_type" in init and _datatype(
                    init["data_type"], f"{what}.initial_state[0].data_type") != datatype:
                raise ValueError(f"config '{what}.initial_state[0].data_type' differs "
                                 f"from the state's")
            if "dims" in init and tuple(init["dims"]) != dims:
                raise ValueError(f"config '{what}.initial_state[0].dims' {init['dims']} "
                                 f"differ from the state's {list(dims)}")
            if ("zero_data" in init) == ("data_file" in init):
                raise ValueError(f"config '{what}.initial_state[0]' needs one of "
                                 f"'zero_data' and 'data_file'")
            if "data_file" in init:
                initial = _initial_from_file(init["data_file"], version_dir, initial,
                                             f"{what}.initial_state[0].data_file")
        initial.setflags(write=False)
        states.append(StateSpec(names[0], names[1], datatype, dims, initial))
    return SequenceConfig(idle, strategy, candidates, delay, tuple(sorted(preferred)),
                          tuple(controls), tuple(states))


def _initial_from_file(name: Any, version_dir: Path, like: np.ndarray, what: str
                       ) -> np.ndarray:
    """Triton's `data_file`: the raw little-endian values of the state, in
    `<version>/initial_state/<name>`."""
    if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
        raise ValueError(f"config '{what}' must be a file name, not {name!r}")
    path = version_dir / "initial_state" / name
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"config '{what}': cannot read initial_state/{name}: "
                         f"{exc.strerror}") from None
    if len(data) != like.nbytes:
        raise ValueError(f"config '{what}': initial_state/{name} holds {len(data)} bytes, "
                         f"the state takes {like.nbytes}")
    return np.frombuffer(data, like.dtype.newbyteorder("<")).astype(like.dtype) \
        .reshape(like.shape)


def sequence_parameters(parameters: dict, model: str) -> tuple[int | str, bool, bool]:
    """(sequence id, start, end) from a request's parameters; ProtocolError 400 when they
    are missing or malformed."""
    sid = parameters.get("sequence_id", 0)
    kind = type(sid)  # JSON gives exactly int, str or bool (not an int here)
    if not ((kind is int and 0 <= sid < 1 << 64) or kind is str):
        raise ProtocolError(400, f"parameter 'sequence_id' must be a uint64 or a string, "
                                 f"not {sid!r}")
    if not sid:
        raise ProtocolError(400, f"inference request to model '{model}' must specify a "
                                 f"non-zero or non-empty correlation ID (parameter "
                                 f"'sequence_id')")
    start = parameters.get("sequence_start", False)
    end = parameters.get("sequence_end", False)
    if type(start) is not bool or type(end) is not bool:
        key, value = ("sequence_start", start) if type(start) is not bool else \
            ("sequence_end", end)
        raise ProtocolError(400, f"parameter '{key}' must be true or false, not {value!r}")
    return sid, start, end


class _Step(PendingRequest):
    """One request of a sequence: a pending request (one row) and its control flags."""

    __slots__ = ("start", "end")

    def __init__(self, args: list[Any], start: bool, end: bool, deadline: float,
                 label: str, now: float,
                 respond: Callable[[Results, float], Any] | None = None) -> None:
        super().__init__(args, 1, deadline, label, now, respond)
        self.start = start
        self.end = end


class _Sequence:
    __slots__ = ("id", "slot", "home", "steps", "running", "ending", "gone", "ready",
                 "last_used")

    def __init__(self, sid: int | str, now: float) -> None:
        self.id = sid
        self.slot: int | None = None
        self.home: tuple[tuple, int] = ((), 0)  # where its state is (DeviceState)
        self.steps: deque[_Step] = deque()
        self.running = False
        self.ending = False  # its END request arrived: it takes no more
        self.gone = False  # ended because a client went away: freed when nothing runs
        self.ready = False  # in the ready queue
        self.last_used = now


@dataclass(frozen=True)
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

    def __init__(self, states: tuple[StateSpec, ...], rows: int,
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


def _slot(seq: _Sequence) -> int:
    return seq.slot


def _home_order(seq: _Sequence) -> tuple[int, int]:
    """Batch order: sequences whose rows are neighbours in one buffer, next to each
    other (initial rows first)."""
    buffers, row = seq.home
    return (id(buffers[0]) if buffers else 0, row)


class SequenceBatcher:
    """Schedules one model version's sequences onto its instances (see the module doc).

    `programs[i]` is what instance i runs. `program_inputs` names the program's inputs
    in order; the client's arguments (`infer(args, ...)`) are the others, in order.
    `program_outputs` lists the program's outputs as (name, V2 datatype). `executed(
    requests, rows, seconds)` is called for every execution that succeeded (Triton's
    statistics)."""

    def __init__(self, model: str, config: SequenceConfig, max_batch_size: int,
                 instances: list[Instance], programs: list[StepProgram],
                 program_inputs: list[str], program_outputs: list[tuple[str, str]],
                 max_queue: int, *,
                 executed: Callable[[int, int, float], None] | None = None) -> None:
        self.model = model
        self.config = config
        self.max_batch_size = max_batch_size
        self.max_queue = max_queue
        self._instances = instances
        self._programs = {id(i): p for i, p in zip(instances, programs)}
        # direct: slot s is row s % max_batch_size of instance s // max_batch_size
        self._direct = config.strategy == "direct"
        self._instance_index = {id(i): n for n, i in enumerate(instances)}
        self._slot_owner: dict[int, _Sequence] = {}
        self._idle: list[Instance] = list(reversed(instances))
        self._executed = executed
        slots = config.max_candidate_sequences if config.strategy == "oldest" else \
            max_batch_size * len(instances)
        self.slots = slots
        self._free_slots = list(range(slots - 1, -1, -1))
        self._device = DeviceState(config.states, max_batch_size, programs)
        controls = {c.name: c for c in config.controls}
        states = {s.input_name: i for i, s in enumerate(config.states)}
        # how each program input is made: ("client", i) | ("control", c) | ("state", i)
        self._plan: list[tuple[str, Any]] = []
        client = 0
        for name in program_inputs:
            if name in controls:
                self._plan.append(("control", controls[name]))
            elif name in states:
                self._plan.append(("state", states[name]))
            else:
                self._plan.append(("client", client))
                client += 1
        self._corrid_integer = any(c.kind == "CONTROL_SEQUENCE_CORRID"
                                   for c in config.controls)
        self._state_outputs = {s.output_name: i for i, s in enumerate(config.states)}
        self._program_outputs = [(name, datatype, DATATYPES[datatype])
                                 for name, datatype in program_outputs]
        self._sequences: dict[tuple[type, int | str], _Sequence] = {}
        self._backlog: deque[_Sequence] = deque()  # started, waiting for a slot
        self._ready: deque[_Sequence] = deque()
        # why recently ended sequences ended, when not by their END request
        self._ended: OrderedDict[tuple[type, int | str], str] = OrderedDict()
        self._queued = 0
        self._in_flight = InFlight()
        self._closed = False
        self._timer_at = math.inf
        # steps that arrive in one wake-up of the loop, the next steps of sequences just
        # answered among them, run as one batch; the instance is woken just before the
        # loop waits for I/O, not while the loop still holds the interpreter
        self._dispatch_after_pass = DispatchAfterPass(self._dispatch)
        self._timer: Any = None  # `delay_timer`, made with the first step if delays are on
        self._tasks_started = False
        self._now: Callable[[], float] = trio.current_time  # the run's clock (see `infer`)
        self.expired_count = 0
        self.client_gone_count = 0  # sequences ended because a client went away
        # steps whose client can be asked whether it is still there: step -> (seq, probe)
        self._watched: dict[_Step, tuple[_Sequence, Callable[[], bool]]] = {}
        self._watch_wake: trio.Event | None = None  # set: a step is watched again
        self.host = {phase: Latency() for phase in HOST_PHASES}
        self.queue_wait = Latency(_WAIT_BUCKETS)

    # -- observation -------------------------------------------------------------------

    @property
    def live(self) -> int:
        return len(self._sequences)

    @property
    def slots_in_use(self) -> int:
        return self.slots - len(self._free_slots)

    @property
    def state_bytes_in_use(self) -> int:
        return self.slots_in_use * sum(s.row_bytes for s in self.config.states)

    def statistics(self) -> dict:
        """Live sequences, slots and their state memory, and where executions spent host
        time (count and total ns per phase)."""
        return {
            "strategy": self.config.strategy,
            "live_sequences": self.live,
            "queued_steps": self._queued,
            "waiting_for_slot": len(self._backlog),
            "slots": self.slots,
            "slots_in_use": self.slots_in_use,
            "state_bytes_in_use": self.state_bytes_in_use,
            "state_bytes_reserved": self._device.held_bytes(
                s.home for s in self._sequences.values() if s.slot is not None),
            "expired_sequences": self.expired_count,
            "client_gone_sequences": self.client_gone_count,
            "state_gathers": dict(self._device.counts),
            "queue_wait": self.queue_wait.doc(),
            "host": {phase: latency.doc() for phase, latency in self.host.items()},
        }

    # -- requests ----------------------------------------------------------------------

    async def infer(self, args: list[Any], parameters: dict, deadline: float, label: str,
                    respond: Callable[[Results, float], Any] | None = None
                    ) -> tuple[Results, float, float]:
        """Runs one step of the request's sequence: (client outputs, seconds queued,
        seconds its execution took). Raises ProtocolError 400 for a bad control flow,
        `Unavailable`, `Overloaded`, `DeadlineExceeded`, or the invocation's error.

        `respond(results, execution_seconds)`, when given, answers the client from the
        instance thread as soon as the step ran (as `Admission.infer`'s), before the loop
        has taken in the step's outcome: the sequence's next step may then arrive first,
        and waits, as any step of a running sequence does. A sequence's last step is
        always answered by the loop, once its slot is free, so a client that starts the
        same sequence id again on that answer finds it ended."""
        sid, start, end = sequence_parameters(parameters, self.model)
        if self._closed:
            raise Unavailable("the model version is unloading")
        rows = int(args[0].shape[0]) if args else 1
        if rows != 1:
            raise ProtocolError(400, f"inference request for sequence {sid} to model "
                                     f"'{self.model}' must have batch size 1, not {rows}")
        if not self._tasks_started:
            self._tasks_started = True
            self._now = trio.lowlevel.current_clock().current_time  # one call per read
            # system tasks: they end with the batcher (close), not with a request
            trio.lowlevel.spawn_system_task(self._expire_idle)
            trio.lowlevel.spawn_system_task(self._watch_clients)
            if self.config.max_queue_delay_us:
                self._timer = delay_timer(self._timer_fired)
        if self._corrid_integer and not isinstance(sid, int):
            raise ProtocolError(400, f"model '{self.model}' takes an integer sequence_id "
                                     f"(it has a CORRID control input), not the string "
                                     f"{sid!r}")
        key = (type(sid), sid)
        now = self._now()
        seq = self._sequences.get(key)
        if start:
            if seq is not None:
                raise ProtocolError(400, f"inference request for sequence {sid} to model "
                                         f"'{self.model}' has sequence_start, but sequence "
                                         f"{sid} is already in progress: end it "
                                         f"(sequence_end) before starting it again")
        elif seq is None or seq.ending:
            why = f" ({self._ended[key]})" if key in self._ended else ""
            raise ProtocolError(400, f"inference request for sequence {sid} to model "
                                     f"'{self.model}' must specify the START flag on the "
                                     f"first request of the sequence{why}")
        if self._queued >= max(self.max_queue, self.slots):
            raise Overloaded(f"{self._queued} sequence requests queued (max_queue "
                             f"{self.max_queue})", 1)
        if seq is None:
            seq = _Sequence(sid, now)
            self._sequences[key] = seq
            self._ended.pop(key, None)
            if self._free_slots:
                self._assign(seq)
            else:
                self._backlog.append(seq)
        step = _Step(args, start, end, deadline, label, now, None if end else respond)
        seq.steps.append(step)
        seq.last_used = now
        if end:
            seq.ending = True
        self._queued += 1
        self._in_flight.count += 1
        self._mark_ready(seq)
        self._dispatch_after_pass()
        probe = client_gone_probe()
        if probe is not None:
            self._watched[step] = (seq, probe)
            if self._watch_wake is not None:
                self._watch_wake.set()
        try:
            if deadline == math.inf:  # no cancel scope to enter and leave per step
                await step.done.wait()
            else:
                with trio.move_on_at(deadline):
                    await step.done.wait()
        finally:
            self._watched.pop(step, None)
            if not step.done.is_set():
                self._abandon(seq, step)
        if step.outcome is None:
            waited = trio.current_time() - step.arrived
            if step.started:
                raise DeadlineExceeded(
                    f"deadline exceeded after {waited:.3f} s; the step of sequence {sid} "
                    f"started and still updates its state (its result is discarded)",
                    started=True)
            raise DeadlineExceeded(f"deadline exceeded after {waited:.3f} s in the queue "
                                   f"of sequence {sid} (nothing ran; its state is "
                                   f"unchanged)", started=False)
        results, error = step.outcome
        if error is not None:
            raise error
        return results, step.queued_seconds, step.infer_seconds

    def _abandon(self, seq: _Sequence, step: _Step) -> None:
        """The step stops waiting (deadline, or its task was cancelled)."""
        if step.started:
            step.detached = True
            return
        seq.steps.remove(step)
        self._queued -= 1
        self._in_flight.left(1)
        if step.end and not seq.steps and not seq.running:
            self._release(seq)
        self._dispatch()

    # -- scheduling (on the loop, no checkpoints) ----------------------------------------

    def _assign(self, seq: _Sequence) -> None:
        seq.slot = self._free_slots.pop()
        self._slot_owner[seq.slot] = seq
        seq.home = self._device.initial_home

    def _mark_ready(self, seq: _Sequence) -> None:
        if not seq.ready and not seq.running and seq.slot is not None and seq.steps:
            seq.ready = True
            self._ready.append(seq)

    def _release(self, seq: _Sequence) -> None:
        """Ends a sequence (after its END request, or idle): frees its slot for the next
        sequence waiting for one."""
        key = (type(seq.id), seq.id)
        if self._sequences.get(key) is seq:
            del self._sequences[key]
        if seq.slot is None:
            self._backlog.remove(seq)
            return
        self._free_slots.append(seq.slot)
        del self._slot_owner[seq.slot]
        seq.slot = None
        seq.home = ((), 0)
        while self._backlog and self._free_slots:
            waiting = self._backlog.popleft()
            self._assign(waiting)
            self._mark_ready(waiting)

    def _take(self, now: float) -> tuple[list[_Sequence], int | None]:
        """The next batch, and with `direct` the index of the (idle) instance whose
        slots its sequences hold."""
        batch: list[_Sequence] = []
        skipped: list[_Sequence] = []
        ready = self._ready
        idle = {self._instance_index[id(i)] for i in self._idle} if self._direct else None
        owner = None
        while ready and len(batch) < self.max_batch_size:
            seq = ready.popleft()
            seq.ready = False
            if seq.running or seq.slot is None or not seq.steps:
                continue
            if seq.steps[0].deadline <= now:
                skipped.append(seq)  # its task takes the request out with 504
                continue
            if idle is not None:
                where = seq.slot // self.max_batch_size
                if where not in idle or (owner is not None and where != owner):
                    skipped.append(seq)  # another instance's slot
                    continue
                owner = where
            batch.append(seq)
        preferred = self.config.preferred_batch_sizes
        if preferred and len(batch) < self.max_batch_size:
            # as the dynamic batcher: cut back to the largest preferred size reached
            fitting = [size for size in preferred if size <= len(batch)]
            if fitting:
                skipped[:0] = batch[fitting[-1]:]
                del batch[fitting[-1]:]
        for seq in reversed(skipped):
            seq.ready = True
            ready.appendleft(seq)
        return batch, owner

    def _dispatch(self) -> None:
        """Starts executions while an instance is free and a sequence is ready."""
        config = self.config
        while self._idle and self._ready:
            now = self._now()
            if config.max_queue_delay_us and not self._closed:
                target = config.preferred_batch_sizes[-1] if \
                    config.preferred_batch_sizes else self.max_batch_size
                oldest = min((s.steps[0].arrived for s in self._ready if s.steps),
                             default=now) \
                    if len(self._ready) < target else now
                until = oldest + config.max_queue_delay_us / 1e6
                if now < until and len(self._ready) < target:
                    self._arm(until)
                    return
            batch, owner = self._take(now)
            if not batch:
                return
            self._start(batch, now, owner)
        self._arm(math.inf)

    def _start(self, batch: list[_Sequence], now: float, owner: int | None) -> None:
        if owner is None:
            instance = self._idle.pop()
            batch.sort(key=_home_order)
        else:
            instance = self._instances[owner]
            self._idle.remove(instance)
            batch.sort(key=_slot)
        steps = []
        for seq in batch:
            step = seq.steps.popleft()
            step.started = True
            step.queued_seconds = now - step.arrived
            self.queue_wait.add(step.queued_seconds)
            seq.running = True
            steps.append(step)
        self._queued -= len(steps)
        homes = [seq.home for seq in batch]
        ids = [seq.id for seq in batch]
        layout = None
        if owner is not None:  # direct: row r is slot owner * max_batch_size + r
            first = owner * self.max_batch_size
            rows = {seq.slot - first: i for i, seq in enumerate(batch)}
            layout = [rows.get(r, -1) for r in range(max(rows) + 1)]
            initial = self._device.initial_home
            homes = [homes[i] if i >= 0 else
                     getattr(self._slot_owner.get(first + r), "home", initial)
                     for r, i in enumerate(layout)]
        program = self._programs[id(instance)]
        instance.thread.submit([(
            lambda: self._execute_and_answer(program, steps, homes, ids, layout),
            lambda result: self._finished(instance, batch, steps, now, result))])

    def _execute_and_answer(self, program: StepProgram, steps: list[_Step],
                            homes: list[tuple[tuple, int]], ids: list[int | str],
                            layout: list[int] | None) -> tuple:
        """`_execute`, then the steps that asked for it are answered from the instance
        thread (`answer_directly`)."""
        result = self._execute(program, steps, homes, ids, layout)
        answer_directly(steps, result[0], result[2])
        return result

    def _execute(self, program: StepProgram, steps: list[_Step],
                 homes: list[tuple[tuple, int]], ids: list[int | str],
                 layout: list[int] | None = None) -> tuple:
        """On the instance thread: one execution of the batch (see `_run_rows`); if it
        fails and holds several requests, each runs again alone so only the request the
        program rejects gets the error. Returns each request's outcome, the new home of
        each sequence's state (None where its step failed: its state is unchanged), the
        executions and the host time of the phases."""
        timing = [0.0, 0.0, 0.0]
        count = len(steps)
        with program.lock or contextlib.nullcontext():
            start = time.perf_counter()
            try:
                results, new_homes = self._run_rows(program, steps, homes, ids, timing,
                                                    layout)
            except Exception as exc:  # noqa: BLE001 - isolated below, or handed on
                if count == 1:
                    return [(None, exc)], [None], [], tuple(timing)
            else:
                executions = [(count, count, time.perf_counter() - start)]
                return ([(r, None) for r in results], new_homes, executions,
                        tuple(timing))
            outcomes: list[Outcome] = []
            alone_homes: list[tuple[tuple, int] | None] = []
            executions = []
            own = homes if layout is None else [homes[layout.index(i)] for i in range(count)]
            for i in range(count):
                start = time.perf_counter()
                try:
                    results, new_homes = self._run_rows(
                        program, steps[i:i + 1], own[i:i + 1], ids[i:i + 1], timing)
                except Exception as exc:  # noqa: BLE001 - handed to its request
                    outcomes.append((None, exc))
                    alone_homes.append(None)
                    continue
                outcomes.append((results[0], None))
                alone_homes.append(new_homes[0])
                executions.append((1, 1, time.perf_counter() - start))
            return outcomes, alone_homes, executions, tuple(timing)

    def _run_rows(self, program: StepProgram, steps: list[_Step],
                  homes: list[tuple[tuple, int]], ids: list[int | str],
                  timing: list[float], layout: list[int] | None = None
                  ) -> tuple[list[Results], list[tuple[tuple, int]]]:
        """Runs the step once for `steps`: their inputs stacked along dim 0, their
        control values, their state rows gathered on the device (`DeviceState`); copies
        the client outputs to the host and keeps the state outputs on the device as the
        sequences' new homes. Row i is the i-th step, or with `layout` (`direct`) step
        `layout[i]`, -1 for a null row: zero inputs, READY false, the state `homes[i]`
        (of the slot's idle sequence, or the initial one), its outputs dropped. Adds the
        host time of gather, invoke (with the copies of the client outputs) and scatter
        to `timing`. Raises when the program fails (no state changed then)."""
        t0 = time.perf_counter()
        rows: list[_Step | None] = steps if layout is None else \
            [steps[i] if i >= 0 else None for i in layout]
        row_ids = ids if layout is None else [ids[i] if i >= 0 else 0 for i in layout]
        args: list[Any] = []
        for kind, what in self._plan:
            if kind == "client":
                if len(rows) == 1:
                    args.append(steps[0].args[what])
                    continue
                if layout is None:
                    args.append(np.concatenate([step.args[what] for step in steps]))
                    continue
                null = np.zeros_like(steps[0].args[what])
                args.append(np.concatenate([null if step is None else step.args[what]
                                            for step in rows]))
            elif kind == "state":
                args.append(self._device.gather(program, what, homes))
            else:
                args.append(self._control_values(what, rows, row_ids))
        wait = self._device.take_gathers(program)
        t1 = time.perf_counter()
        # a coarse-fences step waits for its gathers on the device; else the host waits
        results = program.module.invoke_raw(program.function, *args, wait=wait)
        count = len(rows)
        at = list(range(count)) if layout is None else \
            sorted(range(count), key=lambda r: layout[r])[count - len(steps):]
        client_rows: list[Results] = [[] for _ in steps]
        state_buffers: list[Any] = [None] * len(self.config.states)
        for (name, datatype, dtype), value in zip(self._program_outputs, results):
            shape = getattr(value, "shape", ())
            if not shape or shape[0] != count:
                raise ValueError(f"output '{name}' has shape {list(shape)}: not batched "
                                 f"along dim 0 ({count} rows)")
            state = self._state_outputs.get(name)
            if state is not None:
                state_buffers[state] = value.buffer
                continue
            array = value.to_numpy()
            if array.dtype != dtype:
                array = array.astype(dtype)
            for row, results in zip(at, client_rows):
                results.append((name, datatype, array[row:row + 1]))
        t2 = time.perf_counter()
        buffers = tuple(state_buffers)
        new_homes = [(buffers, row) for row in at]
        timing[0] += t1 - t0
        timing[1] += t2 - t1
        timing[2] += time.perf_counter() - t2
        return client_rows, new_homes

    def _control_values(self, control: ControlInput, steps: list[_Step | None],
                        ids: list[int | str]) -> np.ndarray:
        """The control input of `steps` (None: a null row) as the program takes it,
        shape [rows, 1]."""
        kind = control.kind
        false, true = control.false_true
        if kind == "CONTROL_SEQUENCE_CORRID":
            values: list[Any] = ids
        elif kind == "CONTROL_SEQUENCE_READY":
            values = [false if step is None else true for step in steps]
        else:
            start = kind == "CONTROL_SEQUENCE_START"
            values = [true if step is not None and (step.start if start else step.end)
                      else false for step in steps]
        return np.array(values, control.dtype).reshape(len(steps), 1)

    def _finished(self, instance: Instance, batch: list[_Sequence], steps: list[_Step],
                  started: float, result: Any) -> None:
        """On the loop, when an instance thread finished an execution."""
        t0 = time.perf_counter()
        if isinstance(result, BaseException):
            outcomes: list[Outcome] = [(None, result)] * len(steps)
            homes = None
            executions: list[tuple[int, int, float]] = []
        else:
            outcomes, homes, executions, phases = result
            for phase, seconds in zip(HOST_PHASES, phases):
                self.host[phase].add(seconds)
        now = self._now()
        seconds = now - started
        for i, (seq, step, outcome) in enumerate(zip(batch, steps, outcomes)):
            if homes is not None and homes[i] is not None:
                seq.home = homes[i]  # the previous home is released with its last row
            step.outcome = outcome
            step.infer_seconds = seconds
            step.done.set()
            seq.running = False
            seq.last_used = now
            if step.end or seq.gone:
                self._release(seq)
            else:
                self._mark_ready(seq)
        if self._executed is not None:
            for counts in executions:
                self._executed(*counts)
        self._idle.append(instance)
        self._dispatch_after_pass()
        self._in_flight.left(len(steps))
        if not isinstance(result, BaseException):
            self.host["respond"].add(time.perf_counter() - t0)

    def _arm(self, at: float) -> None:
        if at != self._timer_at:
            self._timer_at = at
            if self._timer is not None:
                self._timer.arm(at)

    def _timer_fired(self, at: float) -> None:
        """On the loop, when the queue delay armed for `at` ran out (the timer wakes the
        loop at that time itself: trio's own timeouts are rounded to milliseconds)."""
        if self._timer_at == at:
            self._timer_at = math.inf
            self._dispatch_after_pass()

    async def _watch_clients(self) -> None:
        """Ends the sequences whose client closed its connection while a step of theirs
        waited or ran (`_client_left`)."""
        while not self._closed:
            if not self._watched:  # sleep until there is something to watch
                self._watch_wake = trio.Event()
                await self._watch_wake.wait()
                self._watch_wake = None
            await trio.sleep(_CLIENT_CHECK_SECONDS)
            before = trio.current_time() - _CLIENT_CHECK_SECONDS
            for step, (seq, gone) in list(self._watched.items()):
                # a started step answered from its instance thread may be answered
                # already, and a proxy may close the connection at once (HAProxy's
                # reuse): only the loop, taking in its outcome, stops watching it
                if step.started and step.respond is not None:
                    continue
                if step.arrived <= before and not seq.gone and gone():
                    self._client_left(seq, step)
            self._dispatch()

    def _client_left(self, seq: _Sequence, step: _Step) -> None:
        """The client of `step` went away (its connection closed) before its answer:
        as Triton cancels a sequence with a cancelled request, the sequence ends with
        every request it has queued, and its slot is freed as soon as no step of it runs
        (a running step finishes; its result goes nowhere)."""
        self._watched.pop(step, None)
        self.client_gone_count += 1
        self._remember_end((type(seq.id), seq.id), "it was ended: a client closed its "
                                                   "connection before an answer")
        seq.ending = seq.gone = True
        error = ProtocolError(400, f"sequence {seq.id} of model '{self.model}' was ended: "
                                   f"the client of one of its requests closed its "
                                   f"connection before the answer")
        while seq.steps:
            queued = seq.steps.popleft()
            self._queued -= 1
            self._in_flight.left(1)
            queued.outcome = (None, error)
            queued.done.set()
        if seq.ready:
            seq.ready = False
            self._ready.remove(seq)
        if not seq.running:
            self._release(seq)

    def _remember_end(self, key: tuple[type, int | str], why: str) -> None:
        self._ended[key] = why
        if len(self._ended) > _EXPIRED_REMEMBERED:
            self._ended.popitem(last=False)

    async def _expire_idle(self) -> None:
        """Ends sequences idle longer than `max_sequence_idle_microseconds`."""
        idle = self.config.max_sequence_idle_us / 1e6
        period = min(max(idle / 4, 0.001), 1.0)
        while not self._closed:
            await trio.sleep(period)
            now = trio.current_time()
            for key, seq in list(self._sequences.items()):
                if not seq.steps and not seq.running and now - seq.last_used > idle:
                    self._release(seq)
                    self.expired_count += 1
                    self._remember_end(key, f"it expired: idle for more than "
                                            f"max_sequence_idle_microseconds = "
                                            f"{self.config.max_sequence_idle_us}")
            self._dispatch()  # sequences that waited for a slot may have one now
            self._compact_states()

    def _compact_states(self) -> None:
        """When the state buffers live sequences keep alive hold more than twice the
        bytes of their states (sequences that stepped together went separate ways, and
        idle ones keep whole batches' outputs), an idle instance copies the rows of the
        idle sequences among them into buffers of their own."""
        if self._closed or not self._idle or not self.config.states:
            return
        homes = [seq.home for seq in self._sequences.values() if seq.slot is not None]
        in_use = self.state_bytes_in_use
        device = self._device
        if device.held_bytes(homes) - device.initial_bytes <= 2 * in_use:
            return
        rows: dict[int, int] = {}
        for buffers, _ in homes:
            if buffers:
                rows[id(buffers[0])] = rows.get(id(buffers[0]), 0) + 1
        row_bytes = device.row_bytes[0]
        movers = [seq for seq in self._sequences.values()
                  if seq.slot is not None and not seq.running and not seq.steps
                  and seq.home[0] and seq.home[0][0] is not device.initial[0]
                  and rows[id(seq.home[0][0])] * row_bytes < seq.home[0][0].byte_length]
        if not movers:
            return
        instance = self._idle.pop()
        program = self._programs[id(instance)]
        old = [seq.home for seq in movers]

        def compact() -> Any:
            with program.lock or contextlib.nullcontext():
                return device.compact(program, old)

        def compacted(result: Any) -> None:
            if not isinstance(result, BaseException):
                for seq, before, after in zip(movers, old, result):
                    if seq.home is before:  # it did not step meanwhile
                        seq.home = after
            self._idle.append(instance)
            self._dispatch()

        instance.thread.submit([(compact, compacted)])

    # -- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Admits nothing new; what is queued still runs."""
        self._closed = True
        if self._watch_wake is not None:
            self._watch_wake.set()
        self._arm(math.inf)
        if self._timer is not None:
            self._timer.stop()
        self._dispatch()

    async def wait_idle(self) -> None:
        await self._in_flight.wait_idle()


class SequenceCollector:
    """Prometheus families of every sequence-batched model version, read at scrape time:

        tinyhal_sequences_live{model,version}              sequences started, not ended
        tinyhal_sequences_waiting_for_slot{model,version}  started, no slot free yet
        tinyhal_sequence_slots{model,version}              state slots
        tinyhal_sequence_slots_in_use{model,version}
        tinyhal_sequence_state_bytes{model,version}        state memory of the slots in use
        tinyhal_sequence_state_device_bytes{model,version} device memory the states hold
        tinyhal_sequences_expired_total{model,version}     ended by idle expiry
        tinyhal_sequences_client_gone_total{model,version} ended: a client hung up mid-step
        tinyhal_sequence_batch_size{model,version}         sequences per execution
        tinyhal_sequence_queue_wait_seconds{model,version} a step's wait for its execution
        tinyhal_sequence_host_seconds_total{model,version,phase}  host time of executions
            (gather, invoke, scatter, respond)

    `versions()` yields objects with `name`, `version`, `sequences` (a SequenceBatcher or
    None) and `stats` (stats.ModelStatistics: the executions by batch size)."""

    def __init__(self, versions: Callable[[], Iterable[Any]]) -> None:
        self._versions = versions

    def describe(self) -> list:
        return []

    def collect(self) -> Any:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )
        from prometheus_client.utils import floatToGoString

        labels = ["model", "version"]
        gauges = {
            "live_sequences": GaugeMetricFamily("tinyhal_sequences_live", "Live sequences",
                                      labels=labels),
            "waiting_for_slot": GaugeMetricFamily(
                "tinyhal_sequences_waiting_for_slot",
                "Sequences started and waiting for a free state slot", labels=labels),
            "slots": GaugeMetricFamily("tinyhal_sequence_slots", "State slots",
                                       labels=labels),
            "slots_in_use": GaugeMetricFamily("tinyhal_sequence_slots_in_use",
                                              "State slots held by live sequences",
                                              labels=labels),
            "state_bytes_in_use": GaugeMetricFamily(
                "tinyhal_sequence_state_bytes", "Bytes of implicit state in the slots in use",
                labels=labels),
            "state_bytes_reserved": GaugeMetricFamily(
                "tinyhal_sequence_state_device_bytes",
                "Device memory the implicit states keep alive (their buffers, the initial "
                "rows)", labels=labels),
        }
        expired = CounterMetricFamily("tinyhal_sequences_expired",
                                      "Sequences ended by max_sequence_idle_microseconds",
                                      labels=labels)
        gone = CounterMetricFamily("tinyhal_sequences_client_gone",
                                   "Sequences ended because a client closed its connection "
                                   "while a step of theirs waited or ran", labels=labels)
        batch = HistogramMetricFamily("tinyhal_sequence_batch_size",
                                      "Sequences per execution", labels=labels)
        wait = HistogramMetricFamily("tinyhal_sequence_queue_wait_seconds",
                                     "Time a step waited for its execution", labels=labels)
        host = CounterMetricFamily("tinyhal_sequence_host_seconds",
                                   "Host time of executions by phase",
                                   labels=[*labels, "phase"])
        for mv in self._versions():
            batcher = mv.sequences
            if batcher is None:
                continue
            names = [mv.name, mv.version]
            st = batcher.statistics()
            for key, family in gauges.items():
                family.add_metric(names, st[key])
            expired.add_metric(names, batcher.expired_count)
            gone.add_metric(names, batcher.client_gone_count)
            rows = [(r, d.count) for r, d in mv.stats.batches.items()]
            buckets = [(floatToGoString(bound), sum(n for r, n in rows if r <= bound))
                       for bound in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
            buckets.append(("+Inf", sum(n for _, n in rows)))
            batch.add_metric(names, buckets, sum(r * n for r, n in rows))
            latency = batcher.queue_wait
            wait.add_metric(names, [(floatToGoString(b), n) for b, n in latency.cumulative()],
                            latency.ns / 1e9)
            for phase, latency in batcher.host.items():
                host.add_metric([*names, phase], latency.ns / 1e9)
        yield from gauges.values()
        yield from (expired, gone, batch, wait, host)

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
ends through the dynamic batcher's timer (`scheduling.QueueTimer`: a timerfd the loop
waits on, armed early by how late its wake-ups came), not a trio timeout, which epoll
rounds up to whole milliseconds.

With `direct`, as in Triton, slot s is row s % max_batch_size of instance
s // max_batch_size for the sequence's whole life: an execution takes the ready
sequences of one instance and covers its rows up to the highest ready one; the rows in
between are null (zero inputs, READY false, START/END false, CORRID 0, the state of the
slot's idle sequence or the initial one), and their outputs are dropped. Its
`max_queue_delay_microseconds` is waited out, as Triton's, only with a
`minimum_slot_utilization` above 0, and only until that share of `max_batch_size`
sequences is ready (counted over the model's instances); with 0 a ready step runs at once.

Triton's semantics and errors (400): a request without `sequence_id` (or 0, or ""); a
request of an unknown (never started, ended or expired) sequence without
`sequence_start`; an id the CORRID control's type cannot hold; a string id of more than
`MAX_SEQUENCE_ID_LENGTH` characters. A `sequence_start` for a sequence still live ends
it and starts it anew (its queued steps run first; Triton's "previous sequence will be
terminated early"). A sequence whose START left the queue unrun (its deadline) is ended,
as one that expired. A sequence waiting for a slot expires whole at the earliest
deadline of its steps, as Triton's backlog: each of its steps is answered 504 "timeout
of the corresponding sequence has been expired" (Triton's words). Ended sequences are remembered (why they ended, for the next
step's 400) by a 16-byte digest of their id, 4,096 at most. A sequence that received
nothing for `max_sequence_idle_microseconds` (none queued or running) is ended and its
slot freed. A client that closes its connection while a step of its sequence waits or
runs ends the sequence (as Triton cancels a sequence with a cancelled request): its
queued requests are dropped and its slot is freed at once, or as soon as the running
step is done (the connections of waiting steps are looked at every 20 ms, see
`http.client_gone_probe`). A client that goes away between two steps is only seen by the
idle expiry: the next step may come over another connection, as HTTP allows.
A request whose deadline passes while queued leaves its sequence with 504 (nothing ran,
the state did not change); one whose step already runs gets its 504 and the step still
updates the state. An END that leaves the queue so still ends its sequence, as Triton's
(which frees the slot when it takes the END from the sequence's queue): the slot is
free once no step of it runs, not when the sequence idles out.

Everything happens on the event loop except the execution (gather, invoke, scatter),
which runs on the version's instance threads, as with `admission.Admission`.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import numpy as np
import trio

from .admission import (
    AdmissionStatistics,
    Execution,
    Instance,
    PendingRequest,
    abandon_running,
    answer_directly,
    log_abandoned,
    wait_outcome,
)
from .batching import BatchingConfig, Outcome, Results
from .config import (  # the configuration's schema; importable from here as before
    ControlInput,
    SequenceConfig,
    StateSpec,
    parse_sequence_config,
)
from .http import client_gone_probe
from .protocol import DATATYPES, ProtocolError
from .scheduling import (
    DeadlineExceeded,
    DispatchAfterPass,
    InFlight,
    Overloaded,
    QueueTimer,
    RunningInvocation,
    Unavailable,
)
from .sequence_clients import ClientWatch
from .sequence_metrics import SequenceCollector
from .sequence_state import DeviceState, StepProgram
from .stats import Latency

__all__ = ["ControlInput", "DeviceState", "SequenceBatcher", "SequenceCollector",
           "SequenceConfig", "StateSpec", "StepProgram", "parse_sequence_config"]

# the host phases of one execution, as recorded in `SequenceBatcher.host`
HOST_PHASES = ("gather", "invoke", "scatter", "respond")
_ENDED_REMEMBERED = 4096  # ended sequences whose reason a late step is told
# the longest string sequence id taken: the ids of live sequences are kept whole
MAX_SEQUENCE_ID_LENGTH = 1024
log = logging.getLogger("tinyhal.server")
_WAIT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                 0.25, 0.5, 1.0)


class _Step(PendingRequest):
    """One request of a sequence: a pending request (one row), its control flags, its
    sequence and the probe of its client's connection (`ClientWatch`; None outside a
    connection's task)."""

    started_note = "the step started and still updates its state (its result is " \
                   "discarded)"
    __slots__ = ("start", "end", "sequence", "probe")

    def __init__(self, args: list[Any], start: bool, end: bool, deadline: float,
                 label: str, now: float, respond: Callable[[Results, float], Any] | None,
                 sequence: _Sequence) -> None:
        super().__init__(args, 1, deadline, label, now, respond)
        self.start = start
        self.end = end
        self.sequence = sequence
        self.probe = client_gone_probe()

    @property
    def queued_note(self) -> str:
        """What a step that left the queue at its deadline is told (see `_expire_waiting`
        for a sequence that waited for a slot)."""
        if self.sequence.expired_waiting:
            return f"waiting for a sequence slot: {_WAITING_EXPIRED} (nothing ran)"
        return "in the queue of its sequence (nothing ran; its state is unchanged)"


# Triton's words for a sequence that waited for a slot past a request's deadline
_WAITING_EXPIRED = "timeout of the corresponding sequence has been expired"


class _Sequence:
    __slots__ = ("id", "slot", "home", "steps", "running", "ending", "gone", "ready",
                 "last_used", "expired_waiting")

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
        self.expired_waiting = False  # ended by a deadline while it waited for a slot


def _digest(key: tuple[type, int | str]) -> bytes:
    """A fixed-size digest of a sequence id (its type and value): what is remembered of
    an ended sequence."""
    sid = key[1]
    data = b"s" + sid.encode("utf-8", "surrogatepass") if type(sid) is str else \
        b"i" + str(sid).encode()
    return hashlib.blake2b(data, digest_size=16).digest()


def _in_transient_ring(home: tuple[tuple, int]) -> bool:
    """Whether a sequence's rows (`home`) are a block of a transient ring."""
    return any(getattr(buffer.storage, "block", None) is not None for buffer in home[0])


def _watch_ended(step: _Step) -> bool:
    """Whether a waiting step's client no longer matters: its sequence ended, the step
    stopped waiting (its deadline passed while it ran), or it was started and answered
    from its instance thread (behind a proxy its connection may close as soon as the
    answer is written, before the loop takes in the outcome)."""
    return step.sequence.gone or step.detached or (step.started and step.respond is not None)


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
        self.max_concurrency = len(instances)
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
        self._capacity = max(max_queue, slots)  # steps queued at most (Overloaded beyond)
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
        # (lowest, highest, datatype) of the CORRID control input's type, if any
        self._corrid: tuple[int, int, str] | None = None
        for control in config.controls:
            if control.kind == "CONTROL_SEQUENCE_CORRID":
                limits = np.iinfo(control.dtype)
                self._corrid = (max(int(limits.min), 1), int(limits.max), control.dtype.name)
        self._state_outputs = {s.output_name: i for i, s in enumerate(config.states)}
        self._program_outputs = [(name, datatype, DATATYPES[datatype])
                                 for name, datatype in program_outputs]
        self._sequences: dict[tuple[type, int | str], _Sequence] = {}
        self._backlog: deque[_Sequence] = deque()  # started, waiting for a slot
        self._ready: deque[_Sequence] = deque()
        # why recently ended sequences ended, when not by their END request: by a
        # fixed-size digest of their id, so what is kept is bounded whatever the ids
        self._ended: OrderedDict[bytes, str] = OrderedDict()
        # an idle pass's compaction that found every instance busy (`_compact_states`)
        self._compaction_due: float | None = None
        self._queued = 0
        self._in_flight = InFlight()
        self._running: set[Execution] = set()
        self._detached = 0
        self._closed = False
        self._closed_why = ""
        # steps that arrive in one wake-up of the loop, the next steps of sequences just
        # answered among them, run as one batch; the instance is woken just before the
        # loop waits for I/O, not while the loop still holds the interpreter
        self._dispatch_after_pass = DispatchAfterPass(self._dispatch)
        # the dynamic batcher's policy (queue delay, preferred sizes) and its queue-delay
        # timer (with its lead correction)
        self._policy = BatchingConfig(max_batch_size, config.max_queue_delay_us,
                                      config.preferred_batch_sizes)
        self._target_rows = self._policy.target_rows  # ready at which the delay ends
        if self._direct:  # as Triton's: the delay waits for a share of the slots only
            utilization = config.minimum_slot_utilization
            self._policy = BatchingConfig(
                max_batch_size, config.max_queue_delay_us if utilization else 0)
            self._target_rows = max(1, math.ceil(utilization * max_batch_size - 1e-9))
        self._timer = QueueTimer(self._policy.delay, self._dispatch_after_pass)
        self._tasks_started = False
        self._now: Callable[[], float] = trio.current_time  # the run's clock (see `infer`)
        self.expired_count = 0
        self._idle_reason = (f"it expired: idle for more than max_sequence_idle_microseconds"
                             f" = {config.max_sequence_idle_us}")
        self.client_gone_count = 0  # sequences ended because a client went away
        # steps whose client can be asked whether it is still there: step -> (seq, probe)
        self._clients = ClientWatch(self._waiting_steps, self._client_left, _watch_ended,
                                    self._dispatch)
        self.host = {phase: Latency() for phase in HOST_PHASES}
        self.queue_wait = Latency(_WAIT_BUCKETS)

    # -- observation -------------------------------------------------------------------

    @property
    def live(self) -> int:
        return len(self._sequences)

    @property
    def live_sequences(self) -> int:
        return len(self._sequences)

    @property
    def in_flight(self) -> int:
        """Steps admitted and not finished (queued, running, detached)."""
        return self._in_flight.count

    def statistics(self) -> AdmissionStatistics:
        """The figures every scheduler gives (executions, queued steps, instances)."""
        return AdmissionStatistics(len(self._running), self._queued, self.max_concurrency,
                                   self.max_queue, self._detached)

    def running_invocations(self) -> list[RunningInvocation]:
        """The executions running now, oldest first."""
        return [RunningInvocation(e.label, e.started, all(r.detached for r in e.requests))
                for e in sorted(self._running, key=lambda e: e.started)]

    @property
    def slots_in_use(self) -> int:
        return self.slots - len(self._free_slots)

    @property
    def state_bytes_in_use(self) -> int:
        return self.slots_in_use * sum(s.row_bytes for s in self.config.states)

    def sequence_statistics(self) -> dict:
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

    def infer(self, args: list[Any], rows: int, deadline: float, label: str,
              respond: Callable[[Results, float], Any] | None = None,
              parameters: dict | None = None) -> Awaitable[tuple[Results, float, float]]:
        """Runs one step of the request's sequence (named by `parameters`): (client
        outputs, seconds queued, seconds its execution took). Raises ProtocolError 400
        for a bad control flow, `Unavailable`, `Overloaded`, `DeadlineExceeded`, or the
        invocation's error.

        `respond(results, execution_seconds)`, when given, answers the client from the
        instance thread as soon as the step ran (as `Admission.infer`'s), before the loop
        has taken in the step's outcome: the sequence's next step may then arrive first,
        and waits, as any step of a running sequence does. A sequence's last step is
        always answered by the loop, once its slot is free, so a client that starts the
        same sequence id again on that answer finds it ended.

        As Triton: a START for a sequence still live ends it there and starts it anew
        (its steps already queued run first, the START step then begins from the
        initial state); a sequence whose START left the queue unrun (its deadline) is
        ended, so its next step without START is refused."""
        if parameters is None:
            parameters = {}
        # types checked by the protocol layer for every model: a uint64 or string id,
        # boolean flags
        sid = parameters.get("sequence_id", 0)
        if not sid:
            raise ProtocolError(400, f"inference request to model '{self.model}' must "
                                     f"specify a non-zero or non-empty correlation ID "
                                     f"(parameter 'sequence_id')")
        start = parameters.get("sequence_start", False)
        end = parameters.get("sequence_end", False)
        if self._closed:
            raise Unavailable(self._closed_why)
        if rows != 1:
            raise ProtocolError(400, f"inference request to model '{self.model}' must "
                                     f"specify batch-size 1 due to requirements of sequence "
                                     f"batcher (sequence {sid} sent {rows} rows)")
        if not self._tasks_started:
            self._start_tasks()
        if self._corrid is not None:
            self._check_corrid(sid)
        elif type(sid) is str and len(sid) > MAX_SEQUENCE_ID_LENGTH:
            raise ProtocolError(400, f"parameter 'sequence_id' is a string of {len(sid)} "
                                     f"characters; at most {MAX_SEQUENCE_ID_LENGTH} are "
                                     f"taken")
        key = (type(sid), sid)
        now = self._now()
        seq = self._sequences.get(key)
        if start:
            if seq is not None and not seq.ending:  # debug: a client could flood the log
                log.debug("sequence %s of model '%s' has a START while still in "
                          "progress: it ends there and starts anew", sid, self.model)
        elif seq is None or seq.ending:
            why = self._ended_reason(key)
            raise ProtocolError(400, f"inference request for sequence {sid} to model "
                                     f"'{self.model}' must specify the START flag on the "
                                     f"first request of the sequence"
                                     f"{f' ({why})' if why else ''}")
        if self._queued >= self._capacity:
            raise Overloaded(f"Exceeds maximum queue size: {self._queued} sequence "
                             f"requests queued (max_queue {self.max_queue})", 1)
        if seq is None:
            seq = _Sequence(sid, now)
            self._sequences[key] = seq
            if self._ended:
                self._ended.pop(_digest(key), None)
            if self._free_slots:
                self._assign(seq)
            else:
                self._backlog.append(seq)
        step = _Step(args, start, end, deadline, label, now, None if end else respond, seq)
        seq.steps.append(step)
        seq.last_used = now
        seq.ending = end
        self._queued += 1
        self._in_flight.count += 1
        self._mark_ready(seq)
        self._dispatch_after_pass()
        if self._clients.asleep:
            self._clients.wake()
        return wait_outcome(step, self._abandon_step)

    def _waiting_steps(self) -> Iterator[_Step]:
        """The steps queued or running (what `ClientWatch` looks at)."""
        for seq in self._sequences.values():
            yield from seq.steps
        for execution in self._running:
            yield from execution.requests

    def _start_tasks(self) -> None:
        """On the first step: the run's clock, and the system tasks that end with the
        batcher (`close`), not with a request."""
        self._tasks_started = True
        self._now = trio.lowlevel.current_clock().current_time  # one call per read
        trio.lowlevel.spawn_system_task(self._contained, self._expire_idle)
        trio.lowlevel.spawn_system_task(self._contained, self._clients.run)

    async def _contained(self, task: Callable[[], Awaitable[None]]) -> None:
        """Runs a system task of this batcher so that a failure of it (a bug) fails this
        model version, not the process (an exception in a system task ends trio's run):
        it is logged, every admitted step is answered 503 and the version admits
        nothing new, saying why."""
        try:
            await task()
        except Exception as exc:  # noqa: BLE001 - contained to this model version
            log.exception("model '%s': the sequence batcher failed; its steps are "
                          "answered 503 and it takes no new ones", self.model)
            why = f"the sequence batcher failed ({type(exc).__name__})"
            self.close(why)
            self.abandon(why)

    def _check_corrid(self, sid: int | str) -> None:
        """The id must be an integer the CORRID control's type holds (400 otherwise)."""
        if type(sid) is not int:
            raise ProtocolError(400, f"model '{self.model}' takes an integer sequence_id "
                                     f"(it has a CORRID control input), not a string")
        low, high, datatype = self._corrid
        if not low <= sid <= high:
            raise ProtocolError(400, f"parameter 'sequence_id' {sid} is out of the range of "
                                     f"the CORRID control input's {datatype} "
                                     f"({low}..{high})")

    def continues_work(self, parameters: dict) -> bool:
        """A step without START (what a draining server still takes): one of a sequence
        live here is served, any other gets the 400 it gets at any time ("must specify
        the START flag", with why the sequence ended when that is known). A front end
        sends such a step only to the replica its sequence is pinned to, so a 503 to
        retry elsewhere would only repeat until the drain ended."""
        sid = parameters.get("sequence_id")
        return type(sid) in (int, str) and not parameters.get("sequence_start")

    def _abandon_step(self, step: _Step) -> None:
        """The step stops waiting (deadline, or its task was cancelled)."""
        seq = step.sequence
        if step.started:
            step.detached = True
            self._detached += 1
            return
        if seq.slot is None:
            self._expire_waiting(seq, step)
            return
        steps = seq.steps
        at = steps.index(step)
        del steps[at]
        self._queued -= 1
        self._in_flight.left(1)
        if step.start:
            self._start_lost(seq, at)
        elif step.end and not steps and not seq.running:
            self._release(seq)
        self._dispatch()

    def _expire_waiting(self, seq: _Sequence, step: _Step) -> None:
        """A step of a sequence waiting for a slot left the queue at its deadline: as
        Triton's backlog, whose deadline is its earliest request's, the whole sequence
        expires. Every step it queued is answered 504 with Triton's words ("timeout of
        the corresponding sequence has been expired"), and its next step without START is
        refused (400) saying so."""
        seq.steps.remove(step)
        self._queued -= 1
        self._in_flight.left(1)
        seq.expired_waiting = True
        why = f"{_WAITING_EXPIRED} (it waited for a sequence slot past a request's deadline)"
        self._end_early(seq, why, DeadlineExceeded(
            f"sequence {seq.id} of model '{self.model}': {why}; nothing ran",
            started=False))
        self._dispatch()

    def _start_lost(self, seq: _Sequence, at: int) -> None:
        """The START that was queued at `at` left the queue unrun: as Triton, the
        sequence it began is expired. The steps queued behind it (up to another START,
        which begins the sequence anew) are refused; the sequence takes no step without
        START any more, and ends once the steps ahead of it (an earlier run of the same
        id) are done."""
        why = "its START request left the queue unrun (its deadline passed)"
        error = ProtocolError(400, f"sequence {seq.id} of model '{self.model}' was ended: "
                                   f"{why}")
        steps = seq.steps
        while at < len(steps) and not steps[at].start:
            lost = steps[at]
            del steps[at]
            self._queued -= 1
            self._in_flight.left(1)
            lost.finish((None, error))
        if at < len(steps):
            return
        self._remember_end(seq.id, f"it was ended: {why}")
        if not steps and not seq.running:
            self._release(seq)
        else:
            seq.ending = True

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
        want = self._policy.preferred_size(len(batch))  # the dynamic batcher's cut
        if want:
            skipped[:0] = batch[want:]
            del batch[want:]
        for seq in reversed(skipped):
            seq.ready = True
            ready.appendleft(seq)
        return batch, owner

    def _dispatch(self) -> None:
        """Starts executions while an instance is free and a sequence is ready."""
        policy = self._policy
        while self._idle and self._ready:
            now = self._now()
            if policy.delay and not self._closed:
                target = self._target_rows
                oldest = min((s.steps[0].arrived for s in self._ready if s.steps),
                             default=now) \
                    if len(self._ready) < target else now
                until = oldest + self._timer.delay - self._timer.lead
                if now < until and len(self._ready) < target:
                    self._timer.arm(until)
                    return
            batch, owner = self._take(now)
            if not batch:
                return
            self._start(batch, now, owner)
        self._timer.arm(math.inf)

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
        initial = self._device.initial_home
        # a START (of a new sequence, or one started anew) begins from the initial state
        homes = [initial if step.start else seq.home for seq, step in zip(batch, steps)]
        ids = [seq.id for seq in batch]
        layout = None
        if owner is not None:  # direct: row r is slot owner * max_batch_size + r
            first = owner * self.max_batch_size
            rows = {seq.slot - first: i for i, seq in enumerate(batch)}
            layout = [rows.get(r, -1) for r in range(max(rows) + 1)]
            homes = [homes[i] if i >= 0 else
                     getattr(self._slot_owner.get(first + r), "home", initial)
                     for r, i in enumerate(layout)]
        program = self._programs[id(instance)]
        execution = Execution(steps, instance, now)
        self._running.add(execution)
        instance.thread.submit([(
            lambda: self._execute_and_answer(program, steps, homes, ids, layout),
            lambda result: self._finished(execution, batch, result))])

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

    def _finished(self, execution: Execution, batch: list[_Sequence], result: Any) -> None:
        """On the loop, when an instance thread finished an execution."""
        t0 = time.perf_counter()
        self._running.discard(execution)
        steps = execution.requests
        if isinstance(result, BaseException):
            outcomes: list[Outcome] = [(None, result)] * len(steps)
            homes = None
            executions: list[tuple[int, int, float]] = []
        else:
            outcomes, homes, executions, phases = result
            for phase, seconds in zip(HOST_PHASES, phases):
                self.host[phase].add(seconds)
        now = self._now()
        seconds = now - execution.started
        for i, (seq, step, outcome) in enumerate(zip(batch, steps, outcomes)):
            if homes is not None and homes[i] is not None:
                seq.home = homes[i]  # the previous home is released with its last row
            step.infer_seconds = seconds
            step.finish(outcome)
            if step.detached:
                self._detached -= 1
            seq.running = False
            seq.last_used = now
            if seq.gone or (seq.ending and not seq.steps):  # its END came (and went)
                self._release(seq)
            else:
                self._mark_ready(seq)
        if self._executed is not None:
            for counts in executions:
                self._executed(*counts)
        self._idle.append(execution.instance)
        if self._compaction_due is not None:
            self._compact_states(self._compaction_due)
        self._dispatch_after_pass()
        self._in_flight.left(len(steps))
        if not isinstance(result, BaseException):
            self.host["respond"].add(time.perf_counter() - t0)

    def _client_left(self, step: _Step) -> None:
        """The client of `step` went away (its connection closed) before its answer:
        as Triton cancels a sequence with a cancelled request, the sequence ends with
        every request it has queued (`_end_early`)."""
        self.client_gone_count += 1
        self._end_early(step.sequence, "the client of one of its requests closed its connection "
                             "before the answer")

    def _end_early(self, seq: _Sequence, why: str, error: Exception | None = None) -> None:
        """Ends `seq` before its END: its queued steps are answered `error` (a 400 naming
        `why` by default), its id is free at once and remembered with `why`, and its slot
        is freed as soon as no step of it runs (a running step finishes; its result
        goes nowhere)."""
        self._remember_end(seq.id, f"it was ended: {why}")
        key = (type(seq.id), seq.id)
        if self._sequences.get(key) is seq:
            del self._sequences[key]
        seq.ending = seq.gone = True
        if error is None:
            error = ProtocolError(400, f"sequence {seq.id} of model '{self.model}' was "
                                       f"ended: {why}")
        while seq.steps:
            queued = seq.steps.popleft()
            self._queued -= 1
            self._in_flight.left(1)
            queued.finish((None, error))
        if seq.ready:
            seq.ready = False
            self._ready.remove(seq)
        if not seq.running:
            self._release(seq)

    def _remember_end(self, sid: int | str, why: str) -> None:
        ended = self._ended
        ended[_digest((type(sid), sid))] = why
        if len(ended) > _ENDED_REMEMBERED:
            ended.popitem(last=False)

    def _ended_reason(self, key: tuple[type, int | str]) -> str | None:
        return self._ended.get(_digest(key)) if self._ended else None

    async def _expire_idle(self) -> None:
        """Ends sequences idle longer than `max_sequence_idle_microseconds`."""
        idle = self.config.max_sequence_idle_us / 1e6
        period = min(max(idle / 4, 0.001), 1.0)
        while not self._closed:
            await trio.sleep(period)
            now = trio.current_time()
            for seq in list(self._sequences.values()):
                if not seq.steps and not seq.running and now - seq.last_used > idle:
                    self._release(seq)
                    self.expired_count += 1
                    self._remember_end(seq.id, self._idle_reason)
            self._dispatch()  # sequences that waited for a slot may have one now
            self._compact_states(now - period)

    def _compact_states(self, idle_since: float) -> None:
        """An idle instance copies the rows of idle sequences into buffers of their own
        when they keep more alive than their states: when the state buffers live
        sequences keep alive hold more than twice the bytes of their states (sequences
        that stepped together went separate ways, and idle ones keep whole batches'
        outputs), and for every sequence not used since `idle_since` whose rows are a
        block of the device's transient ring (a step's output): the ring's tail cannot
        pass that block, so a ring that wrapped round to it would wait for the sequence
        to end. When every instance is busy, the next one to finish an execution runs
        it before the next batch (a busy model never idles)."""
        self._compaction_due = None
        if self._closed or not self.config.states:
            return
        homes = [seq.home for seq in self._sequences.values() if seq.slot is not None]
        in_use = self.state_bytes_in_use
        device = self._device
        wasteful = device.held_bytes(homes) - device.initial_bytes > 2 * in_use
        rows: dict[int, int] = {}
        for buffers, _ in homes:
            if buffers:
                rows[id(buffers[0])] = rows.get(id(buffers[0]), 0) + 1
        row_bytes = device.row_bytes[0]
        movers = [seq for seq in self._sequences.values()
                  if seq.slot is not None and not seq.running and not seq.steps
                  and seq.home[0] and seq.home[0][0] is not device.initial[0]
                  and (wasteful and rows[id(seq.home[0][0])] * row_bytes
                       < seq.home[0][0].byte_length
                       or seq.last_used <= idle_since and _in_transient_ring(seq.home))]
        if not movers:
            return
        if not self._idle:  # busy: the next instance to finish runs it first
            self._compaction_due = idle_since
            return
        instance = self._idle.pop()
        program = self._programs[id(instance)]
        old = [seq.home for seq in movers]
        self._in_flight.count += 1  # an unload waits for it: it runs on the modules

        def compact() -> Any:
            with program.lock or contextlib.nullcontext():
                return device.compact(program, old)

        def compacted(result: Any) -> None:
            if not isinstance(result, BaseException):
                for seq, before, after in zip(movers, old, result):
                    if seq.home is before:  # it did not step meanwhile
                        seq.home = after
            self._idle.append(instance)
            self._in_flight.left(1)
            self._dispatch()

        instance.thread.submit([(compact, compacted)])

    # -- lifecycle -----------------------------------------------------------------------

    def close(self, why: str = "the model version is unloading") -> None:
        """Admits nothing new (the version unloads; `why` says so to new steps). The
        steps of sequences holding a slot still run, without waiting out a queue delay;
        what could never run is answered at once: the steps of sequences waiting for a
        slot get `Unavailable` (503, each logged), and live sequences with nothing
        queued or running end."""
        if self._closed:
            return
        self._closed = True
        self._closed_why = why
        self._clients.stop()
        for seq in list(self._backlog):
            for step in seq.steps:
                log_abandoned(step, 503, f"{why}; it waited for a sequence slot")
            self._end_early(seq, why, Unavailable(f"{why}; the sequence waited for a "
                                                  f"slot and nothing ran"))
        for seq in list(self._sequences.values()):
            if not seq.steps and not seq.running:
                self._release(seq)
        self._dispatch()
        self._timer.arm(math.inf)

    def abandon(self, why: str) -> int:
        """Answers every admitted step that has not finished (`Scheduler.abandon`); the
        sequences end."""
        count = 0
        for seq in list(self._sequences.values()):
            for step in seq.steps:
                log_abandoned(step, 503, why)
            count += len(seq.steps)
            self._end_early(seq, why, Unavailable(f"{why}; nothing ran"))
        detached = abandon_running(self._running, why)
        self._detached += detached
        return count + detached

    async def wait_idle(self) -> None:
        """Returns once every step admitted so far has finished (detached ones and state
        compactions included): nothing runs on the modules."""
        await self._in_flight.wait_idle()

    def stop(self) -> None:
        """Ends the instance threads and the timer (call once idle)."""
        for instance in self._instances:
            instance.thread.stop()
        self._timer.stop()
        self._dispatch_after_pass.detach()  # no cycle left: freed by reference counting
        self._clients.detach()

"""The `emu` driver's modelled engines: where and when each operation runs, in device time.

`Engines` keeps the modelled state of one device: each queue's clock, when each DMA
engine and each compute unit is next free, the modelled times at which this device's
work signalled semaphores, the counters a summary reports, and the trace. An operation
is placed on the engine free first (a transfer) or on the units free first (a
dispatch), no earlier than its segment's start (a barrier joins everything before it);
its duration comes from the `CostModel`.

Placement is a pure function of the operations (their kinds, export names, sizes, bound
bytes), the cost model, and the engines' free times relative to the submission's start.
So a submission is modelled as a whole by a `Plan`, built once by placing its operations
on a copy of that relative state and replayed on later submissions of the same recorded
content over the same relative state: found through the plan replayed before it, and
applied by counting its use and writing the trace record and the queue's clock, instead
of Python per operation (summaries add up uses times each plan's totals; on one queue
the engines' free times stay in the chain of replays until an operation is placed by
itself). Host writes into device memory are modelled after the fact, as updates in the
plan of the submission that follows them. Relative state is encoded exactly: free times
after the start as offsets, those before it by their order alone (placement only
compares them with each other and with a segment's start, never measures them), so a
replay gives bit for bit the times that placing each operation would. `place_dispatch` /
`place_transfer` are that placement, used alike when a plan is built and when operations
are placed one at a time (paced mode, calibration, profiling, armed faults).
"""

from __future__ import annotations

import bisect
import functools
import json
import operator
import threading
import weakref
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from ..dispatch_work import dispatch_work
from ..emu_cost import DispatchCost
from ..execution import Barrier, Dispatch, Operation, Submission
from ..types import MemoryType
from .emu_model import CostModel

PLAN_CAPACITY = 1024  # plans kept per device (a plan holds its recordings, no buffers)
SIGNAL_HISTORY_PRUNE = 1024  # semaphores with signal times before dead ones are dropped
_DEVICE_VISIBLE = int(MemoryType.DEVICE_VISIBLE)
_entry_length = operator.itemgetter(2)
_entry_buffer = operator.itemgetter(0)
_memory_type_bits = operator.attrgetter("memory_type_bits")


@dataclass(frozen=True)
class TraceEvent:
    """One operation as the emulated device ran it, in modelled nanoseconds.

    `engine` is "compute" or "dma<i>"; `units` how many compute units a dispatch took;
    `host_ns` the host time it took when it ran by itself (0 when its submission ran
    as one native stream, fast mode's replay); a dispatch's `cost` (cycles, stalls,
    DRAM bytes) and `work_source`, where its figure came from.
    """

    name: str
    engine: str
    start_ns: int
    duration_ns: int
    size: int
    queue: int = 0
    units: int = 0
    host_ns: int = 0
    cost: DispatchCost | None = None
    work_source: str = ""


def profile_cost(cost: DispatchCost | None, work_source: str) -> dict[str, Any] | None:
    """A dispatch's modelled cost as the fields a profile writes beside its span."""
    if cost is None:
        return None
    return {"compute_cycles": cost.compute_cycles, "stall_cycles": cost.stall_cycles,
            "dram_read_bytes": cost.dram_read_bytes,
            "dram_write_bytes": cost.dram_write_bytes,
            "utilisation": round(cost.utilisation, 6), "work_source": work_source}


@dataclass(frozen=True)
class DispatchRecord:
    """One export's dispatches in a summary: how many ran, and per dispatch on average
    its modelled cycles (compute + stall), DRAM bytes and utilisation of the
    processing elements, and where the figures came from."""

    export: str
    count: int
    cycles: int
    compute_cycles: int
    stall_cycles: int
    dram_bytes: int
    utilisation: float
    work_source: str


@dataclass(frozen=True)
class EmuSummary:
    """One run at a glance (modelled times in nanoseconds)."""

    preset: str
    modelled_ns: int
    wall_ns: int
    utilisation: dict[str, float]
    busy_ns: dict[str, int]
    dispatches: int
    transfers: int
    bytes_moved: int
    peak_device_bytes: int
    memory_size: int
    calibration_error: float | None
    dispatch_costs: tuple[DispatchRecord, ...] = ()
    clock_hz: float = 1e9
    accelerator: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        """The summary as one JSON-ready object: `dispatches` a list of its exports'
        records (totals over all their runs, cycles at `clock_hz`), `dispatch_count`
        how many dispatches ran."""
        out = {k: v for k, v in self.__dict__.items() if k != "dispatch_costs"}
        out["dispatch_count"] = self.dispatches
        out["dispatches"] = [
            {"export": r.export, "count": r.count, "cycles": r.cycles * r.count,
             "compute_cycles": r.compute_cycles * r.count,
             "stall_cycles": r.stall_cycles * r.count, "dram_bytes": r.dram_bytes * r.count,
             "utilisation": r.utilisation, "work_source": r.work_source}
            for r in self.dispatch_costs]
        return out

    def format(self) -> str:
        lines = [f"emu ({self.preset}): modelled {self.modelled_ns / 1e6:.3f} ms, wall "
                 f"{self.wall_ns / 1e6:.3f} ms, {self.dispatches} dispatches, "
                 f"{self.transfers} transfers, {self.bytes_moved} bytes moved",
                 f"  peak device memory {self.peak_device_bytes} of {self.memory_size} bytes"]
        for engine, share in self.utilisation.items():
            lines.append(f"  {engine:<10} {share:6.1%} busy ({self.busy_ns[engine] / 1e6:.3f} ms)")
        if self.calibration_error is not None:
            lines.append(f"  calibration: mean per-dispatch |error| {self.calibration_error:.1%}")
        if self.accelerator is not None:
            a = self.accelerator
            lines.append(f"  accelerator: {a['rows']}x{a['cols']} {a['dataflow']} at "
                         f"{self.clock_hz / 1e9:g} GHz, cost model {a['cost_model']}")
            lines.append(f"  {'export':<48} {'runs':>5} {'cycles':>11} {'stall':>9} "
                         f"{'DRAM bytes':>11} {'util':>6}  source")
            for r in self.dispatch_costs:
                lines.append(f"  {r.export[-48:]:<48} {r.count:>5} {r.cycles:>11} "
                             f"{r.stall_cycles:>9} {r.dram_bytes:>11} {r.utilisation:>6.1%}  "
                             f"{r.work_source}")
        return "\n".join(lines) + "\n"


class Step(NamedTuple):
    """An operation as the engines see it: a dispatch (`size` its workgroups, `bound`
    the bytes its bindings span, `work` what it computes) or a transfer (`size` its
    bytes); None is a barrier."""

    dispatch: bool
    name: str
    size: int
    bound: int
    work: Any = None


class Steps(NamedTuple):
    """A submission as the engines see it: its `steps`, whether any is a transfer,
    its widest dispatch's workgroups, for a submission whose recordings are not shared
    (so never seen again) its typed operations, to run one by one rather than building
    a native program for one use, and the key its plans are kept under: the identity
    of `steps` when the engines keep them (`Engines.steps`), else `steps` itself."""

    steps: tuple[Step | None, ...]
    transfers: bool
    widest: int
    ops: list[Operation] | None
    key: Any


class Plan(NamedTuple):
    """A submission's placement relative to its start: its events (queue 0, host time
    0), its end, the free times it leaves on the DMA engines it used (index, offset) and
    on the units (those before its start it leaves as they were, a slice of the
    ascending list, followed by these offsets), what it adds to the busy counters.
    `bound` is the latest free time it leaves on any engine (0 if before its start), and
    `next_at` / `next_above` the relative state of the engines it leaves as seen from a
    start at `bound` / after it, so a submission replayed next from such a start needs
    no `_relative`; `after_at` / `after_above` map the key of what was replayed next
    from there to its plan. `uses` counts its replays per queue whose busy time, bytes
    and operations the engines' counters do not hold yet (`Engines._count_uses` adds
    them, when a summary reads the counters or before the plan is dropped), so a replay
    only counts itself."""

    events: tuple[TraceEvent, ...]
    end: int
    dma_final: tuple[tuple[int, int], ...]
    units_kept: tuple[int, int]
    units_after: tuple[int, ...]
    busy: tuple[tuple[str, int], ...]
    bytes_moved: int
    dispatches: int
    transfers: int
    bound: int
    next_at: tuple[Any, Any]
    next_above: tuple[Any, Any]
    after_at: dict[Any, Plan]
    after_above: dict[Any, Plan]
    uses: list[int]


def place_dispatch(unit_free: list[int], model: CostModel, name: str, workgroups: int,
                   bound: int, segment_start: int, work: Any = None
                   ) -> tuple[int, int, int, DispatchCost, str]:
    """Places a dispatch on the units free first: (units, start, duration, cost in
    cycles, work source).

    `unit_free` is kept in ascending order: units are interchangeable (which one ran
    what is not observable, only when each is free again), so the ones free first are
    its head, and equal multisets of free times are equal lists. With an accelerator a
    dispatch takes one unit (one accelerator) and shares DRAM bandwidth with the
    dispatches still running on the others when it starts."""
    if model.accelerator is not None:
        units = 1
        op_start = max(segment_start, unit_free[0])
        overlapping = len(unit_free) - bisect.bisect_right(unit_free, op_start)
    else:
        units = max(1, min(workgroups, model.compute_units))
        op_start = max(segment_start, unit_free[units - 1])
        overlapping = 0
    duration, cost, source = model.dispatch_time(name, workgroups, units, bound, work,
                                                 overlapping)
    unit_free[:units] = [op_start + duration] * units
    unit_free.sort()
    return units, op_start, duration, cost, source


def place_transfer(dma_free: list[int], model: CostModel, size: int,
                   segment_start: int) -> tuple[int, int, int]:
    """Places a transfer on the DMA engine that can start it first (then the one idle
    longest, then the lowest): (engine index, start, duration)."""
    index = min(range(len(dma_free)), key=lambda i: (
        max(segment_start, dma_free[i]), dma_free[i], i))
    op_start = max(segment_start, dma_free[index])
    cost = model.transfer_ns(size)
    dma_free[index] = op_start + cost
    return index, op_start, cost


def _relative(values: list[int], start: int) -> tuple[Any, ...]:
    """`values` relative to `start`, exactly as placement can tell them apart: each
    value's rank among the distinct values, how many distinct values lie before
    `start` (placement only orders those, never measures them) and the offsets of the
    others from `start`."""
    distinct = sorted(set(values))
    below = bisect.bisect_left(distinct, start)
    rank = {v: k for k, v in enumerate(distinct)}
    return (tuple(map(rank.__getitem__, values)), below,
            tuple([v - start for v in distinct[below:]]))


def _unit_key(units: list[int], start: int, one_queue: bool) -> tuple[Any, ...]:
    """`_relative` for the compute units. With one queue every later operation starts
    at `start` or after, so free times up to `start` all place alike: they are keyed
    as `start` (with several queues another queue may still start earlier)."""
    if one_queue:
        units = [u if u > start else start for u in units]
    return _relative(units, start)


def _decode(key: tuple[Any, ...]) -> list[int]:
    """Free times relative to a start 0 that place as the `_relative` key's values do
    (those before the start as -n .. -1, in order)."""
    ranks, below, offsets = key
    encoded = list(range(-below, 0)) + list(offsets)
    return [encoded[r] for r in ranks]


def device_visible(op: Operation) -> bool:
    """Whether every range of a transfer is memory the device can see."""
    ranges = (op.source, op.target) if hasattr(op, "source") else (op.target,)
    for r in ranges:
        if not r.buffer.memory_type_bits & MemoryType.DEVICE_VISIBLE:
            return False
    return True


class Trace:
    """The operations run so far, up to `capacity`: single events and replayed plans,
    each under the sequence number its first operation was issued with."""

    __slots__ = ("capacity", "count", "seq", "records")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.count = 0
        self.seq = 0
        self.records: list[tuple[int, tuple[TraceEvent, ...], int, int, int]] = []

    def reserve(self, n: int) -> int:
        """The sequence number of the first of `n` operations issued now (under the
        engines' lock)."""
        seq = self.seq
        self.seq = seq + n
        return seq

    def add(self, seq: int, events: tuple[TraceEvent, ...], start: int, queue: int,
            host_ns: int) -> None:
        room = self.capacity - self.count
        if room <= 0:
            return
        if len(events) > room:
            events = events[:room]
        self.count += len(events)
        self.records.append((seq, events, start, queue, host_ns))

    def events(self) -> list[TraceEvent]:
        out = []
        for _seq, events, start, queue, host_ns in sorted(self.records, key=lambda r: r[0]):
            for e in events:
                out.append(replace(e, start_ns=e.start_ns + start, queue=queue,
                                   host_ns=host_ns) if start or host_ns or e.queue != queue
                           else e)
        return out


class Engines:
    """The modelled state of one emulated device (see the module's docstring). Every
    method takes `lock` itself; the attributes are read by `summary` under it."""

    def __init__(self, model: CostModel, queues: int, trace_capacity: int) -> None:
        self.model = model
        self.lock = threading.Lock()
        self.queue_clock = [0] * queues
        self.queue_names = [f"queue{q}" for q in range(queues)]
        self.dma_free = [0] * model.dma_engines
        self.unit_free = [0] * model.compute_units
        self.busy: dict[str, int] = {}
        self.bytes_moved = 0
        self.dispatch_count = 0
        self.transfer_count = 0
        # export name -> [runs, compute cycles, stall cycles, DRAM bytes,
        # utilisation x cycles, work source], as the counters above are kept
        self.dispatch_costs: dict[str, list[Any]] = {}
        self.clock_ns = 0
        self.trace = Trace(trace_capacity)
        # id of a semaphore -> (weak reference to it, [(value, modelled time it was
        # signalled)], ascending, the last 64); an entry whose reference is dead is
        # replaced by the next semaphore with its id, or pruned as the dict grows. (Keyed
        # by id, not by weak reference: semaphores made and dropped per call reuse
        # addresses, and dead references of one hash made every look-up a long probe.)
        # Kept only with several queues: a queue's clock only advances, and every time
        # it signals at is its clock then, so a wait on what the same queue signalled
        # never starts anything later than that clock does.
        self.across_queues = queues > 1
        self.signal_times: dict[int, tuple[weakref.ref, list[tuple[int, int]]]] = {}
        self.prune_at = SIGNAL_HISTORY_PRUNE
        self.plans: dict[Any, Plan] = {}
        # After a replay: (latest free time it left, its plan, whose `next_at` /
        # `next_above` are the relative state seen from a start then / after, and whose
        # `after_at` / `after_above` the plans replayed next from there); None once an
        # operation was placed by itself.
        self.chain: tuple[int, Plan] | None = None
        self.steps: dict[Any, Steps] = {}
        # Sizes of host writes into device memory that ran on queue 0 and are not
        # modelled yet, each standing for a queue update of that many bytes. The device
        # appends to it (`list.append`, atomic: no lock) while it holds queue 0 idle;
        # they are modelled, in order, before anything else reads or changes the
        # engines, all in one step (with the next submission on queue 0 when it follows
        # them at once). The list is never replaced.
        self.host_writes: list[int] = []
        self.write_steps: dict[tuple[int, ...], tuple[Step | None, ...]] = {}

    def set_model(self, model: CostModel) -> None:
        """Uses `model` from now on (plans made with the old one are dropped)."""
        with self.lock:
            if self.host_writes:  # costed by the model they ran under
                self._model_host_writes()
            self.model = model
            self._clear_plans()

    def clock(self) -> int:
        """The latest modelled time any operation ended at."""
        with self.lock:
            if self.host_writes:
                self._model_host_writes()
            return self.clock_ns

    # -- host writes --------------------------------------------------------------------

    def _take_host_writes(self) -> tuple[int, ...]:
        writes = self.host_writes
        sizes = tuple(writes)
        del writes[: len(sizes)]  # one appended meanwhile stays for the next
        return sizes

    def _model_host_writes(self) -> None:
        """Models the deferred host writes (lock held): updates on queue 0, one after
        another from its clock, as one plan."""
        self._apply_plan(0, self.queue_clock[0], (), self._take_host_writes(), None, ())

    def _write_steps(self, sizes: tuple[int, ...]) -> tuple[Step | None, ...]:
        """The steps of host writes of `sizes` bytes, each after the one before."""
        known = self.write_steps.get(sizes)
        if known is None:
            steps: list[Step | None] = []
            for size in sizes:
                steps += (None, Step(False, "update", size, 0))
            known = tuple(steps[1:])
            if len(self.write_steps) >= PLAN_CAPACITY:
                self.write_steps.clear()
            self.write_steps[sizes] = known
        return known

    # -- submissions ------------------------------------------------------------------

    def start(self, queue: int, wait: Any) -> int:
        """When a submission on `queue` waiting on `wait` starts, in modelled time."""
        with self.lock:
            if self.host_writes:
                self._model_host_writes()
            return self._start(queue, wait)

    def _start(self, queue: int, wait: Any) -> int:
        start = self.queue_clock[queue]
        if not self.across_queues:
            return start
        times = self.signal_times
        for sem, value in wait:
            entry = times.get(id(sem))
            if entry is not None and entry[0]() is sem:
                history = entry[1]
                i = bisect.bisect_left(history, (value, -1))
                if i < len(history) and history[i][1] > start:
                    start = history[i][1]
        return start

    def end(self, queue: int, start: int, end: int, signal: Any) -> None:
        """A submission on `queue` that started at `start` ended at `end`; `signal` its
        points reached then (empty when it failed)."""
        with self.lock:
            self._end(queue, start, end, signal)

    def _end(self, queue: int, start: int, end: int, signal: Any) -> None:
        self.queue_clock[queue] = end
        key = self.queue_names[queue]
        self.busy[key] = self.busy.get(key, 0) + (end - start)
        if end > self.clock_ns:
            self.clock_ns = end
        self._signalled(signal, end)

    def _signalled(self, signal: Any, at: int) -> None:
        if not self.across_queues:
            return
        times = self.signal_times
        for sem, value in signal:
            key = id(sem)
            entry = times.get(key)
            if entry is not None and entry[0]() is sem:
                history = entry[1]
            else:
                try:
                    ref = weakref.ref(sem)
                except TypeError:  # not a semaphore of this device
                    continue
                if entry is None and len(times) >= self.prune_at:
                    for dead in [k for k, (r, _h) in times.items() if r() is None]:
                        del times[dead]
                    self.prune_at = max(SIGNAL_HISTORY_PRUNE, 2 * len(times))
                history = []
                times[key] = (ref, history)
            bisect.insort(history, (value, at))
            if len(history) > 64:
                del history[:-64]

    def host_work(self, queue: int, wait: Any, signal: Any) -> None:
        """Host work on `queue` (a read or write of host memory) took no device time."""
        with self.lock:
            if self.host_writes:
                self._model_host_writes()
            if wait:
                self.queue_clock[queue] = self._start(queue, wait)
            if signal:
                self._signalled(signal, self.queue_clock[queue])

    # -- one operation at a time --------------------------------------------------------

    def issue_dispatch(self, name: str, workgroups: int, bound: int, segment_start: int,
                       queue: int, work: Any = None) -> tuple[TraceEvent, int]:
        """Places one dispatch now: its event and issue sequence number."""
        with self.lock:
            if self.host_writes:
                self._model_host_writes()
            self._break_chain()
            units, op_start, duration, cost, source = place_dispatch(
                self.unit_free, self.model, name, workgroups, bound, segment_start, work)
            self.busy["compute"] = self.busy.get("compute", 0) + duration * units
            self.dispatch_count += 1
            event = TraceEvent(name, "compute", op_start, duration, workgroups, queue, units,
                               0, cost, source)
            self._count_cost(event, 1)
            return event, self.trace.reserve(1)

    def _count_cost(self, event: TraceEvent, uses: int) -> None:
        """Adds `uses` runs of a dispatch's cost to its export's totals."""
        cost = event.cost
        totals = self.dispatch_costs.get(event.name)
        if totals is None:
            totals = self.dispatch_costs[event.name] = [0, 0, 0, 0, 0.0, event.work_source]
        totals[0] += uses
        totals[1] += cost.compute_cycles * uses
        totals[2] += cost.stall_cycles * uses
        totals[3] += cost.dram_bytes * uses
        totals[4] += cost.utilisation * cost.cycles * uses

    def issue_transfer(self, name: str, size: int, segment_start: int,
                       queue: int) -> tuple[TraceEvent, int, int]:
        """Places one transfer now: its event, DMA engine and issue sequence number."""
        with self.lock:
            if self.host_writes:
                self._model_host_writes()
            self._break_chain()
            index, op_start, cost = place_transfer(self.dma_free, self.model, size,
                                                   segment_start)
            engine = f"dma{index}"
            self.busy[engine] = self.busy.get(engine, 0) + cost
            self.bytes_moved += size
            self.transfer_count += 1
            return (TraceEvent(name, engine, op_start, cost, size, queue), index,
                    self.trace.reserve(1))

    def record(self, seq: int, event: TraceEvent, host_ns: int) -> None:
        """Traces an operation placed by `issue_*` once it has run."""
        with self.lock:
            self.trace.add(seq, (event,), 0, event.queue, host_ns)

    # -- whole submissions ---------------------------------------------------------------

    def steps_of(self, submission: Submission) -> Steps | None:
        """The submission's operations as `Steps`; None when it has to run one
        operation at a time (a transfer touches memory the device cannot see)."""
        parts = submission.parts
        if len(parts) == 1:
            recording, entries = parts[0]
            key: Any = ((recording, tuple(map(_entry_length, entries))),)
        else:
            key = tuple([(r, tuple(map(_entry_length, e))) for r, e in parts])
        known = self.steps.get(key)
        if known is None:
            ops = submission.operations()
            unique = not all(r.shareable for r, _e in parts)  # plans keyed by content
            known = _steps(ops, ops if unique else None)
            if known is None or unique:
                return known
            if len(self.steps) >= PLAN_CAPACITY:
                self.steps.clear()
                self._clear_plans()  # plans are keyed by the identity of their steps
            self.steps[key] = known
            return known
        if known.transfers:  # every bound buffer's memory type has DEVICE_VISIBLE
            for _r, entries in parts:
                if not functools.reduce(operator.and_, map(
                        _memory_type_bits, map(_entry_buffer, entries)), _DEVICE_VISIBLE):
                    return None
        return known

    def replay(self, queue: int, wait: Any, signal: Any, steps: Steps) -> None:
        """Models a whole submission that has run: from the plan of its steps over the
        engines' relative state (made now if new), in one step. Deferred host writes
        go first: in the same plan when the submission follows them at once (on queue 0,
        with no wait signalled later than its clock), else in a plan of their own."""
        with self.lock:
            across = self.across_queues
            writes: tuple[int, ...] = ()
            pending = self.host_writes
            if pending:
                if queue == 0 and (not (wait and across)
                                   or self._start(0, wait) == self.queue_clock[0]):
                    writes = tuple(pending)
                    del pending[: len(writes)]  # one appended meanwhile stays for the next
                else:
                    self._model_host_writes()
            start = self.queue_clock[queue]
            if wait and across and not writes:
                start = self._start(queue, wait)
            self._apply_plan(queue, start, signal, writes, steps, steps.steps)

    def _apply_plan(self, queue: int, start: int, signal: Any, writes: tuple[int, ...],
                    steps: Steps | None, body: tuple[Step | None, ...]) -> None:
        """Places host writes of `writes` bytes, then `steps` (if any), on `queue` from
        `start`, by their plan over the engines' relative state (made now if new). (The
        hot path of fast mode: what `_end` and `Trace.add` do is written out here.)"""
        key = None if steps is None else steps.key
        if writes:
            key = (writes, key)
        chain = self.chain
        plan = memo = None
        if chain is not None and start >= chain[0]:
            last = chain[1]
            if start == chain[0]:
                state, memo = last.next_at, last.after_at
            else:
                state, memo = last.next_above, last.after_above
            plan = memo.get(key)
        else:
            self._break_chain()  # the free times the chain held, written out
            state = (_relative(self.dma_free, start),
                     _unit_key(self.unit_free, start, len(self.queue_clock) == 1))
        if plan is None:
            plan = self.plans.get((key, state))
            if plan is None:
                if writes:
                    body = (self._write_steps(writes) + (None,) + body if body
                            else self._write_steps(writes))
                plan = _plan(self.model, body, _decode(state[0]), _decode(state[1]),
                             len(self.queue_clock))
                if len(self.plans) >= PLAN_CAPACITY:
                    self._clear_plans()
                self.plans[(key, state)] = plan
            if memo is not None:
                memo[key] = plan
        self.chain = (start + plan.bound, plan)
        plan.uses[queue] += 1
        if self.across_queues:  # another queue may start before the chain's time
            if plan.transfers:
                dma_free = self.dma_free
                for i, offset in plan.dma_final:
                    dma_free[i] = start + offset
            if plan.dispatches:
                kept_from, kept_to = plan.units_kept
                self.unit_free = (self.unit_free[kept_from:kept_to]
                                  + list(map(start.__add__, plan.units_after)))
        events = plan.events
        trace = self.trace
        seq = trace.seq
        n = len(events)
        trace.seq = seq + n
        if trace.count + n <= trace.capacity:
            trace.count += n
            trace.records.append((seq, events, start, queue, 0))
        else:
            trace.add(seq, events, start, queue, 0)
        end = start + plan.end
        self.queue_clock[queue] = end
        if end > self.clock_ns:
            self.clock_ns = end
        if signal and self.across_queues:
            self._signalled(signal, end)

    def _clear_plans(self) -> None:
        self._count_uses()
        self.plans.clear()
        self._break_chain()  # its plan's successors are dropped plans

    def _break_chain(self) -> None:
        """Ends the chain of replays: the next placement reads `dma_free` and
        `unit_free`. With one queue replays leave those to the chain (see
        `_apply_plan`); they are written out here from its relative state: free times
        before the chain's time as that many nanoseconds before it, in order, which
        places every later operation (none starts before that time) as the true ones
        do."""
        chain = self.chain
        if chain is None:
            return
        self.chain = None
        if not self.across_queues:
            at, plan = chain
            self.dma_free = [at + v for v in _decode(plan.next_at[0])]
            self.unit_free = [at + v for v in _decode(plan.next_at[1])]

    def _count_uses(self) -> None:
        """Adds what the plans' replays since the last call did to the counters."""
        busy = self.busy
        for plan in self.plans.values():
            uses = plan.uses
            if not any(uses):
                continue
            total = sum(uses)
            for name, ns in plan.busy:
                busy[name] = busy.get(name, 0) + ns * total
            for q, n in enumerate(uses):
                if n:
                    name = self.queue_names[q]
                    busy[name] = busy.get(name, 0) + plan.end * n
                    uses[q] = 0
            self.bytes_moved += plan.bytes_moved * total
            self.transfer_count += plan.transfers * total
            self.dispatch_count += plan.dispatches * total
            if plan.dispatches:
                for event in plan.events:
                    if event.cost is not None:
                        self._count_cost(event, total)

    # -- results ------------------------------------------------------------------------

    def events(self) -> list[TraceEvent]:
        """The operations run so far, in the order their queues issued them."""
        with self.lock:
            if self.host_writes:
                self._model_host_writes()
            return self.trace.events()

    def export_trace(self, path: str) -> None:
        """Writes the trace as Chrome trace-event JSON (open in Perfetto): one track per
        engine and one per queue (the queue's submissions), in modelled time."""
        events = []
        tids: dict[str, int] = {}
        for e in self.events():
            for track in (e.engine, f"queue {e.queue}"):
                tid = tids.setdefault(track, len(tids))
                events.append({"name": e.name, "cat": e.engine, "ph": "X", "pid": 0,
                               "tid": tid, "ts": e.start_ns / 1000, "dur": e.duration_ns / 1000,
                               "args": {"size": e.size, "queue": e.queue, "engine": e.engine}})
                if track.startswith("queue"):
                    break
        for track, tid in tids.items():
            events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid,
                           "args": {"name": track}})
        with open(path, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ns"}, f)

    def summary(self, preset: str, wall_ns: int, peak_device_bytes: int, memory_size: int,
                calibration_error: float | None) -> EmuSummary:
        with self.lock:
            if self.host_writes:
                self._model_host_writes()
            self._count_uses()
            total = max(self.queue_clock + [self.clock_ns])
            busy = dict(self.busy)
            util = {}
            busy["compute"] = busy.get("compute", 0) // self.model.compute_units  # unit-ns
            for engine in [f"dma{i}" for i in range(len(self.dma_free))] + ["compute"]:
                b = busy.setdefault(engine, 0)
                util[engine] = b / total if total else 0.0
            for q in range(len(self.queue_clock)):
                b = busy.setdefault(f"queue{q}", 0)
                util[f"queue{q}"] = b / total if total else 0.0
            records = []
            for name, (count, compute, stall, dram, weighted, source) in (
                    self.dispatch_costs.items()):
                cycles = compute + stall
                records.append(DispatchRecord(
                    name, count, cycles // count, compute // count, stall // count,
                    dram // count, weighted / cycles if cycles else 0.0, source))
            model = self.model
            accelerator = None
            if model.accelerator is not None:
                accelerator = dict(model.accelerator.__dict__)
            return EmuSummary(preset, total, wall_ns, util, busy, self.dispatch_count,
                              self.transfer_count, self.bytes_moved, peak_device_bytes,
                              memory_size, calibration_error, tuple(records), model.clock_hz,
                              accelerator)


def _steps(ops: list[Operation], keep: list[Operation] | None) -> Steps | None:
    steps: list[Step | None] = []
    transfers = False
    widest = 0
    for op in ops:
        if type(op) is Barrier:
            steps.append(None)
        elif type(op) is Dispatch:
            prepared = op.prepared
            bound = sum(prepared.binding_lengths[i] for i in range(prepared.state.binding_count))
            steps.append(Step(True, prepared.export.name, prepared.total, bound,
                              dispatch_work(prepared)))
            widest = max(widest, prepared.total)
        elif device_visible(op):
            steps.append(Step(False, op.name, op.target.length, 0))
            transfers = True
        else:
            return None
    body = tuple(steps)
    return Steps(body, transfers, widest, keep, id(body) if keep is None else body)


def _plan(model: CostModel, steps: tuple[Step | None, ...], dma: list[int],
          units: list[int], queues: int) -> Plan:
    """Places `steps` from relative start 0 on engines free at `dma` / `units` (on a
    device with `queues` queues)."""
    one_queue = queues == 1
    dma_before = list(dma)
    before_start = sum(1 for u in units if u < 0)
    events = []
    busy: dict[str, int] = {}
    moved = dispatches = transfers = 0
    segment_start = end = 0
    for step in steps:
        if step is None:
            segment_start = end
            continue
        if step.dispatch:
            n, op_start, cost, spent, source = place_dispatch(
                units, model, step.name, step.size, step.bound, segment_start, step.work)
            events.append(TraceEvent(step.name, "compute", op_start, cost, step.size, 0, n, 0,
                                     spent, source))
            busy["compute"] = busy.get("compute", 0) + cost * n
            dispatches += 1
        else:
            index, op_start, cost = place_transfer(dma, model, step.size, segment_start)
            engine = f"dma{index}"
            events.append(TraceEvent(step.name, engine, op_start, cost, step.size, 0))
            busy[engine] = busy.get(engine, 0) + cost
            moved += step.size
            transfers += 1
        end = max(end, op_start + cost)
    bound = max(0, max(dma), max(units))
    return Plan(tuple(events), end,
                tuple((i, v) for i, v in enumerate(dma) if v != dma_before[i]),
                (before_start - sum(1 for u in units if u < 0), before_start),
                tuple(u for u in units if u >= 0),
                tuple(busy.items()), moved, dispatches, transfers, bound,
                (_relative(dma, bound), _unit_key(units, bound, one_queue)),
                (_relative(dma, bound + 1), _unit_key(units, bound + 1, one_queue)),
                {}, {}, [0] * queues)


__all__ = ["DispatchRecord", "EmuSummary", "Engines", "Plan", "Step", "Steps", "Trace", "TraceEvent",
           "device_visible", "profile_cost",
           "place_dispatch", "place_transfer"]

"""The dynamic batcher: admission control and scheduling of one model version's
requests (instances, a bounded FIFO queue, deadlines, dynamic batching, and an unload
that waits for what it admitted). It implements `scheduling.Scheduler`.

One `Admission` guards one model version. The version runs on `instances` model instances
(Triton's `instance_group` count; each an `InstanceThread` with its own module): at most
that many executions run at once. Requests beyond wait in one FIFO queue of at most
`max_queue` (at least one with dynamic batching), whether or not an instance is free (as
Triton's `max_queue_size`: requests waiting out a queue delay count); anything beyond is
refused at once with `Overloaded` (503 with a Retry-After estimated from recent
latencies) rather than piling up memory and latency. Whenever an instance is free the next execution takes the head of
the queue: one request, or with dynamic batching everything that fits one batch
(`batching.take_batch`), so when an execution finishes the next takes all that gathered
meanwhile. Without a queue delay, a request that finds an instance free starts at once
when it comes alone; while requests come in company (the last execution had several) it
waits for the end of the loop's scheduler pass (a trio instrument's `before_io_wait`), so
the requests that arrived in the same wake-up join its batch.

A queue delay is honoured to within tens of microseconds on a quiet machine: on Linux
the loop waits on a timerfd set to the delay's end (the kernel makes it readable at that
time, where the loop's epoll timeout would round the wait up to whole milliseconds;
spinning on the clock instead doubled the CPU per request at low load), elsewhere a
timer thread waits on a condition variable and posts the dispatch to the loop (a thread
that takes the interpreter lock for each wait), armed early by the mean time its
wake-up took to reach the loop (so a batch starts when the delay ends: the delay is a
maximum, as in Triton), and an arrival that fills the preferred batch ends the wait at
once. The batch is taken at the end of the scheduler pass the timer's wake-up arrived
in, so requests the loop reads in that same wake-up join it.

Everything happens on the event loop in plain functions (`_dispatch`, `_finished`) except
the execution itself, which runs on the instance's thread; its outcome comes back through
`TrioToken.run_sync_soon` and wakes the waiting requests directly.

One protocol for every request, batched or not:

- *admitted*: `infer` counts a request as in flight before its first checkpoint; it stays
  counted until its execution finished (or it left the queue with 504). `wait_idle`
  returns once nothing admitted is in flight; its wake-up cannot be lost: waiters are
  woken by the transition to zero and re-check the count.
- *deadline while queued*: the request leaves the queue and gets `DeadlineExceeded`
  (504); nothing ran.
- *deadline while running* (or the client went away): the request gets its 504 at the
  deadline and is *detached*: the execution is not interrupted, its instance stays busy
  until it ends, and the request's result is dropped. Cutting a VM invocation at a
  `hal.fence.await` would abandon the program between its queue operations (its transient
  buffers would never return), so "cancel" means: stop waiting, and do not count the
  instance free before the device is.
- *close* (unload): new requests are refused with `Unavailable`; queued ones are
  dispatched without waiting out a queue delay; `wait_idle` then returns when the last
  admitted request finished, and `stop` ends the instance threads.
- *abandon* (the drain's bound ran out): every queued request gets `Unavailable` (503),
  every running one `DeadlineExceeded` (504, detached), each with a log line.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from .batching import BatchingConfig, Outcome, Results, ready_rows, run_batch, take_batch
from .instances import InstanceThread
from .scheduling import (
    DeadlineExceeded,
    DispatchAfterPass,
    InFlight,
    Overloaded,
    QueueTimer,
    RunningInvocation,
    Unavailable,
)

log = logging.getLogger("tinyhal.server")

# most unbatched requests handed to a free instance at once (each its own execution)
_RUN_LIST = 16
# an instance answers its requests itself while its next batch waits at least this long
_DIRECT_MARGIN = 200e-6

__all__ = ["Admission", "AdmissionStatistics", "DeadlineExceeded", "Execution", "Instance",
           "Overloaded", "PendingRequest", "Unavailable", "abandon_running", "answer_directly", "log_abandoned",
           "wait_outcome"]


@dataclass(frozen=True)
class AdmissionStatistics:
    running: int  # executions handed to instances and not finished
    queued: int
    max_concurrency: int  # instances
    max_queue: int
    detached: int  # requests whose execution still runs after they got their 504


@dataclass
class Instance:
    """One model instance: the thread that runs its executions and the blocking call
    that runs one invocation on it (arguments -> [(name, datatype, array)])."""

    thread: InstanceThread
    invoke: Callable[[list[Any]], Results]
    pending: int = 0  # executions handed to its thread and not finished


def _shape_key(args: list[Any]) -> tuple:
    """What the requests of one batch must share: the shapes of their arguments past the
    batch dimension."""
    if len(args) == 1:
        return (getattr(args[0], "shape", ())[1:],)
    return tuple(getattr(a, "shape", ())[1:] for a in args)


class _Request:
    """A request admitted and waiting for its outcome (`wait_outcome`). It is its own
    one-waiter completion: `finish` gives it its outcome and wakes the task parked on it,
    so a request costs one object and its task one coroutine (no event, no parking lot,
    no waiter set)."""

    # what a 504 says of it, by whether its execution had started
    started_note = "the invocation started and runs to completion in the background " \
                   "(its result is discarded)"
    queued_note = "in the queue (nothing ran)"
    __slots__ = ("args", "rows", "key", "deadline", "arrived", "label", "finished", "outcome",
                 "started", "detached", "queued_seconds", "infer_seconds", "respond",
                 "_task")

    def __init__(self, args: list[Any], rows: int, deadline: float, label: str,
                 now: float, respond: Callable[[Results, float], Any] | None = None,
                 key: tuple = ()) -> None:
        self.args = args
        self.rows = rows
        self.key = key  # what requests batched together share (`_shape_key`)
        self.deadline = deadline
        self.arrived = now
        self.label = label
        self.finished = False
        self.outcome: Outcome | None = None
        self.started = False
        self.detached = False
        self.queued_seconds = 0.0
        self.infer_seconds = 0.0
        self.respond = respond
        self._task: Any = None  # the task parked in `wait_outcome`

    def finish(self, outcome: Outcome) -> None:
        """Gives the request `outcome` and wakes its task (on the loop); the first
        outcome stays (a 504 the drain gave a running request is not replaced by the
        result that comes later)."""
        if not self.finished:
            self.finished = True
            self.outcome = outcome
            task = self._task
            if task is not None:
                self._task = None
                trio.lowlevel.reschedule(task)

    def _abort(self, raise_cancel: Any) -> trio.lowlevel.Abort:
        self._task = None
        return trio.lowlevel.Abort.SUCCEEDED


PendingRequest = _Request  # what a request waiting for an execution records (sequences.py)


async def wait_outcome(request: _Request, abandon: Callable[[_Request], None]
                       ) -> tuple[Results, float, float]:
    """Waits for `request`'s outcome until its deadline: (results, seconds queued, seconds
    its execution took), or its error raised. A request that stops waiting first (its
    deadline, or its task was cancelled) is handed to `abandon` and gets
    `DeadlineExceeded`. A checkpoint whether or not it has to park."""
    try:
        if request.finished:
            await trio.lowlevel.checkpoint()
        else:
            request._task = trio.lowlevel.current_task()
            if request.deadline == math.inf:  # no cancel scope to enter and leave
                await trio.lowlevel.wait_task_rescheduled(request._abort)
            else:
                with trio.move_on_at(request.deadline):
                    await trio.lowlevel.wait_task_rescheduled(request._abort)
    finally:
        if not request.finished:
            abandon(request)
    outcome = request.outcome
    if outcome is None:
        waited = trio.current_time() - request.arrived
        if request.started:
            raise DeadlineExceeded(f"deadline exceeded after {waited:.3f} s; "
                                   f"{request.started_note}", started=True)
        raise DeadlineExceeded(f"Request timeout expired: deadline exceeded after "
                               f"{waited:.3f} s {request.queued_note}", started=False)
    results, error = outcome
    if error is not None:
        raise error
    return results, request.queued_seconds, request.infer_seconds


def log_abandoned(request: _Request, status: int, why: str) -> None:
    """The log line of a request the drain or an unload answered without its result."""
    log.warning("answered %d: %s (%s while it was %s)", status, request.label, why,
                "running" if request.started else "queued")


def abandon_running(running: Any, why: str) -> int:
    """Answers 504 (logged) every unfinished request of the executions in `running` and
    detaches it, so its instance's result is dropped when it comes; how many there were."""
    count = 0
    for execution in running:
        for request in execution.requests:
            if not request.finished:
                count += 1
                request.detached = True
                log_abandoned(request, 504, why)
                request.finish((None, DeadlineExceeded(f"{why}; {request.started_note}",
                                                       started=True)))
    return count


class Execution:
    """Requests handed to an instance as one execution, since when (trio clock)."""

    __slots__ = ("requests", "instance", "started", "watch")

    def __init__(self, requests: list[_Request], instance: Instance, started: float) -> None:
        self.requests = requests
        self.instance = instance
        self.started = started
        self.watch: Any = None

    @property
    def label(self) -> str:
        """What runs, for logs (only formed when asked: most executions never are)."""
        requests = self.requests
        if len(requests) == 1:
            return requests[0].label
        model = requests[0].label.split(" request ")[0]
        ids = ", ".join(r.label.split(" request ")[-1] for r in requests)
        return f"{model} batch of {len(requests)} requests ({ids})"


class Admission:
    """Schedules one model version's requests onto its instances (see the module doc).

    `executed(requests, rows, seconds)` is called for every execution that succeeded;
    `watch = begin()` / `end(watch)` bracket every execution on the loop (the device
    memory attribution).
    """

    def __init__(self, instances: list[Instance], max_queue: int,
                 batching: BatchingConfig | None = None, *,
                 executed: Callable[[int, int, float], None] | None = None,
                 begin: Callable[[], Any] | None = None,
                 end: Callable[[Any], None] | None = None) -> None:
        if not instances:
            raise ValueError("a model version needs at least one instance")
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, not {max_queue}")
        self.max_concurrency = len(instances)
        self.max_queue = max_queue
        self.batching = batching
        self._capacity = max(1, max_queue) if batching is not None else max_queue
        self._instances = instances
        self._idle: list[Instance] = list(reversed(instances))
        self._queue: list[_Request] = []
        self._running: set[Execution] = set()
        self._in_flight = InFlight()
        self._detached = 0
        self._closed = False
        self._latency = 0.0  # exponentially weighted mean of execution seconds
        self._executed = executed
        self._begin = begin
        self._end = end
        # with no queue delay, a free instance takes its batch once the loop has run
        # every task that was ready (the requests that arrived in the same wake-up join
        # it): at once, as far as any client can tell. Only while requests come in
        # company (the last execution had several): a lone request starts at once,
        # which measured faster at one connection
        self._dispatch_after_pass = DispatchAfterPass(self._dispatch)
        self._last_batch_requests = 0
        # the queue delay's timer; it also keeps how late its wake-ups reach the loop,
        # and is armed that much early, so a batch starts when the delay ends
        self._timer = QueueTimer(batching.delay if batching else 0.0,
                                 self._dispatch_after_pass)
        self._clock_offset: float | None = None  # trio clock - monotonic (other threads)
        # the trio clock; the run's own reader once the first execution started on the
        # loop (one call, where `trio.current_time()` is three frames)
        self._now: Callable[[], float] = trio.current_time

    # -- observation -------------------------------------------------------------------

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def in_flight(self) -> int:
        """Requests admitted and not finished (queued, running, detached)."""
        return self._in_flight.count

    live_sequences = 0  # the dynamic batcher keeps no sequences

    def continues_work(self, parameters: dict) -> bool:
        """Nothing continues here: every request is new work."""
        return False

    def statistics(self) -> AdmissionStatistics:
        return AdmissionStatistics(len(self._running), len(self._queue),
                                   self.max_concurrency, self.max_queue, self._detached)

    def running_invocations(self) -> list[RunningInvocation]:
        """The executions running now, oldest first (for the drain's abandon log)."""
        return [RunningInvocation(e.label, e.started, all(r.detached for r in e.requests))
                for e in sorted(self._running, key=lambda e: e.started)]

    def retry_after(self) -> int:
        """Seconds until a slot is likely free: the queue ahead drained at the recent rate."""
        ahead = len(self._queue) + len(self._running)
        return max(1, math.ceil(self._latency * ahead / self.max_concurrency))

    # -- requests ----------------------------------------------------------------------

    def infer(self, args: list[Any], rows: int, deadline: float, label: str,
              respond: Callable[[Results, float], Any] | None = None,
              parameters: dict | None = None) -> Awaitable[tuple[Results, float, float]]:
        """Runs one request (batched with others when the model batches): (its results,
        seconds queued, seconds its execution took). Raises `Unavailable` when closed,
        `Overloaded` when the queue is full, `DeadlineExceeded` when `deadline` (trio
        clock; `math.inf` for none) passes first, or the invocation's own error.

        `respond(results, execution_seconds)`, when given, is called on the instance
        thread right after a successful execution, before the request is woken: the
        caller answers its client from there (it must be safe to call on any thread and
        to lose the race with the deadline). `parameters` are not looked at.

        The queue bound holds whether or not an instance is free (as Triton's
        `max_queue_size`): requests waiting out a queue delay count."""
        if self._closed:
            raise Unavailable("the model version is unloading")
        queue = self._queue
        if len(queue) >= self._capacity and (queue or not self._idle):
            raise Overloaded(
                f"Exceeds maximum queue size: {len(self._running)} executions running and "
                f"{len(queue)} requests queued (instances {self.max_concurrency}, "
                f"max_queue {self.max_queue})", self.retry_after())
        now = self._now()
        request = _Request(args, rows, deadline, label, now, respond, _shape_key(args))
        self._in_flight.count += 1
        batching = self.batching
        if self._idle and not self._queue and (
                batching is None or rows >= batching.target_rows
                or (not batching.delay and self._last_batch_requests <= 1)):
            self._start([[request]], now)  # the ready path: no queue, no task hop
        else:
            self._queue.append(request)
            if self._idle and batching is not None and not batching.delay:
                self._dispatch_after_pass()
            else:
                self._dispatch()
        return wait_outcome(request, self._abandon)

    def _abandon(self, request: _Request) -> None:
        """The request stops waiting (deadline, or its task was cancelled)."""
        if request.started:
            request.detached = True
            self._detached += 1
            return
        self._queue.remove(request)
        self._in_flight.left(1)
        self._dispatch()  # the head may have changed

    # -- scheduling (on the loop, no checkpoints) ----------------------------------------

    def _dispatch(self) -> None:
        """Starts executions while an instance is free and a batch is ready. Without
        batching, a free instance is handed a run of up to `_RUN_LIST` queued requests,
        each its own execution, run one after the other and answered one by one: the
        instance does not sit idle while the loop hands it the next request."""
        batching = self.batching
        while self._idle and self._queue:
            now = self._now()
            if batching is not None and batching.delay and not self._closed:
                until = self._queue[0].arrived + batching.delay - self._timer.lead
                if now < until and ready_rows(self._queue) < batching.target_rows:
                    self._timer.arm(until)
                    return
            batch = take_batch(self._queue, batching, now)
            if not batch:
                return  # only expired requests are queued; their tasks take them out
            run = [batch]
            while batching is None and len(run) < _RUN_LIST and self._queue:
                more = take_batch(self._queue, None, now)
                if not more:
                    break
                run.append(more)
            self._start(run, now)
        self._timer.arm(math.inf)

    def _start(self, run: list[list[_Request]], now: float) -> None:
        if self._clock_offset is None:
            self._clock_offset = now - time.monotonic()
            self._now = trio.lowlevel.current_clock().current_time
        instance = self._idle.pop()
        instance.pending = len(run)
        self._last_batch_requests = len(run[-1])
        invoke = instance.invoke
        jobs = []
        for batch in run:
            execution = Execution(batch, instance, now)
            for request in batch:
                request.started = True
                request.queued_seconds = now - request.arrived
            self._running.add(execution)
            if self._begin is not None:
                execution.watch = self._begin()
            last = len(jobs) == len(run) - 1
            jobs.append((functools.partial(_execute, invoke, batch,
                                           self._next_waits if last else None),
                         functools.partial(self._finished, execution)))
        instance.thread.submit(jobs)

    def _next_waits(self) -> bool:
        """On an instance thread, at the end of its run: whether its next execution
        would not start at once anyway, so answering the run's requests first delays
        nothing: nothing is queued, or what is queued waits out a queue delay that
        has well over `_DIRECT_MARGIN` to go and cannot fill a batch. A hint read
        without a lock (the loop decides what runs next)."""
        queue = self._queue
        if not queue:
            return True
        batching = self.batching
        if batching is None or not batching.delay or len(queue) >= batching.target_rows:
            return False
        try:
            head = queue[0]
        except IndexError:  # taken meanwhile
            return True
        left = head.arrived + batching.delay - self._timer.lead - \
            (time.monotonic() + self._clock_offset)
        return left > _DIRECT_MARGIN

    def _finished(self, execution: Execution, result: Any) -> None:
        """On the loop, when an instance thread finished an execution. The instance is
        handed its next execution first; then the requests its thread left unanswered
        are answered (`answer_directly`) and every request is woken."""
        if self._end is not None:
            self._end(execution.watch)
        self._running.discard(execution)
        instance = execution.instance
        instance.pending -= 1
        if not instance.pending:
            self._idle.append(instance)
            self._dispatch()
        if isinstance(result, BaseException):
            outcomes, executions = [(None, result)] * len(execution.requests), []
        else:
            outcomes, executions, answered = result
            if not answered:
                # the instance went on with its next execution; its clients are answered
                # here, before their tasks wake: a task then only finishes its request and
                # reads the client's next one, which the answer let it send meanwhile
                answer_directly(execution.requests, outcomes, executions)
        seconds = sum(e[2] for e in executions) if executions else \
            trio.current_time() - execution.started
        self._latency = seconds if not self._latency else 0.8 * self._latency + 0.2 * seconds
        for request, outcome in zip(execution.requests, outcomes):
            request.infer_seconds = seconds
            if request.detached:
                self._detached -= 1
            request.finish(outcome)
        if self._executed is not None:
            for counts in executions:
                self._executed(*counts)
        self._in_flight.left(len(execution.requests))

    # -- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Admits nothing new; what is queued runs without waiting out a queue delay."""
        self._closed = True
        self._dispatch()
        self._timer.arm(math.inf)

    def abandon(self, why: str) -> int:
        """Answers every admitted request that has not finished (`Scheduler.abandon`)."""
        queue, self._queue = self._queue, []
        for request in queue:
            log_abandoned(request, 503, why)
            request.finish((None, Unavailable(f"{why}; nothing ran")))
        detached = abandon_running(self._running, why)
        self._detached += detached
        self._in_flight.left(len(queue))
        return len(queue) + detached

    async def wait_idle(self) -> None:
        """Returns once every request admitted so far has finished (detached ones
        included)."""
        await self._in_flight.wait_idle()

    def stop(self) -> None:
        """Ends the instance threads after their current jobs (call once idle)."""
        for instance in self._instances:
            instance.thread.stop()
        self._timer.stop()
        self._dispatch_after_pass.detach()  # no cycle left: freed by reference counting


def _execute(invoke: Callable[[list[Any]], Results], batch: list[_Request],
             next_waits: Callable[[], bool] | None
             ) -> tuple[list[Outcome], list[tuple[int, int, float]], bool]:
    """One execution on an instance thread (`run_batch`): (outcomes, executions, whether
    its requests were answered here). When it is the last of its run and its instance
    would not start another at once (`next_waits`: nothing queued, or the queue waits out
    a delay), each request that asked for it is answered from here (`respond`): the
    client need not wait for the loop to wake up, and its next request is usually there
    when the loop reads. Otherwise the loop answers them as it takes in the outcome
    (`Admission._finished`), and the instance is handed its next execution at once."""
    outcomes, executions = run_batch(invoke, [r.args for r in batch], [r.rows for r in batch])
    if next_waits is None or not next_waits():
        return outcomes, executions, False
    answer_directly(batch, outcomes, executions)
    return outcomes, executions, True


def answer_directly(requests: list[_Request], outcomes: list[Outcome],
                    executions: list[tuple[int, int, float]]) -> None:
    """After an execution (on its instance thread, or on the loop as it takes in the
    outcome): each request that asked for it (`respond`), succeeded and still waits is
    answered from here; the tasks of the requests answer the rest."""
    seconds = sum(e[2] for e in executions)
    for request, (results, error) in zip(requests, outcomes):
        if request.respond is not None and error is None and not (request.finished
                                                                   or request.detached):
            try:
                request.respond(results, seconds)
            except Exception:  # noqa: BLE001 - a bug of ours: the loop answers instead
                log.exception("answering %s directly failed", request.label)



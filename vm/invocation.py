"""One protocol for running a VM call, however its waits are met: begin, resume, end.

IREE drives an invocation the same way from every caller (`vm/invocation.h`: begin,
resume after each wait, end). Here a VM function that may suspend is a Python generator
(`codegen`) that yields what it waits for: a `native.Suspend` from a yieldable import,
or `None` for a `vm.yield`. An `Invocation` is one such call in flight:

- begin: `Invocation(function, args)` calls it and runs it to its first suspension or to
  its end (a function that never suspends ends here);
- `request` is what it waits for while not `done`;
- resume: `resume(value)` hands it the wait's results, `resume(error=exc)` raises the
  wait's failure where it waits (the VM cannot catch it, so it comes back out);
- end: `end()` returns what the function returned.

The drivers differ only in how they wait: `run_blocking` on the calling thread
(`Suspend.block()`), `run_async` on trio (`await Suspend.wait_async()`, and a checkpoint
for a `vm.yield`); `call_blocking` is `run_blocking` of a new invocation without the
object while the call does not wait. An exception the function raises comes out of `Invocation(...)` or
`resume`, turned by `trap` (if given: the context's, which names the VM stack) into the
error to raise; `BaseException`s that are not `Exception`s (a trio cancel) pass as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import GeneratorType
from typing import Any

from ..errors import FailedPreconditionError, InternalError
from .native import Suspend

__all__ = ["Invocation", "call_blocking", "run_async", "run_blocking"]


class Invocation:
    """A call of `function(*args)` in flight; see the module's docstring."""

    __slots__ = ("request", "done", "_frame", "_value", "_trap")

    def __init__(self, function: Callable[..., Any], args: Sequence[Any],
                 trap: Callable[[Exception], BaseException] | None = None) -> None:
        self._trap = trap
        self.request: Suspend | None = None
        self._value: Any = None
        try:
            value = function(*args)
        except Exception as exc:
            if trap is None:
                raise
            raise trap(exc) from None
        cls = value.__class__
        if cls is GeneratorType:
            self._frame: Any = value
            self.done = False
            self.resume()
        elif cls is Suspend:  # a yieldable native function: its results are the wait's
            self._frame = None
            self.done = False
            self.request = value
        else:
            self._frame = None
            self.done = True
            self._value = value

    @classmethod
    def suspended(cls, frame: GeneratorType | None, request: Suspend | None,
                  trap: Callable[[Exception], BaseException] | None) -> Invocation:
        """An invocation begun elsewhere (`call_blocking`) that now waits for `request`:
        `frame` is its running generator, or None for a yieldable native function."""
        invocation = cls.__new__(cls)
        invocation._trap = trap
        invocation._frame = frame
        invocation._value = None
        invocation.request = request
        invocation.done = False
        return invocation

    def resume(self, value: Any = None, error: BaseException | None = None) -> None:
        """Continues after the wait for `request`: with its results `value`, or with
        its failure `error`, which the function cannot catch and so raises here."""
        frame = self._frame
        if frame is None:
            if error is not None:
                raise error
            self.request, self._value, self.done = None, value, True
            return
        try:
            self.request = frame.send(value) if error is None else frame.throw(error)
            if error is not None:  # the function cannot catch; anything else is a bug
                raise InternalError("invocation resumed after a failed wait") from error
        except StopIteration as stop:
            self.request, self._value, self.done, self._frame = None, stop.value, True, None
        except Exception as exc:
            if self._trap is None:
                raise
            raise self._trap(exc) from None

    def end(self) -> Any:
        """What the function returned."""
        if not self.done:
            raise FailedPreconditionError("the invocation has not ended: it waits")
        return self._value


def run_blocking(invocation: Invocation) -> Any:
    """Runs `invocation` to its end on this thread, blocking on each wait."""
    while not invocation.done:
        request = invocation.request
        if request is None:  # vm.yield: nothing to wait for on a thread
            invocation.resume()
            continue
        try:
            value = request.block()
        except BaseException as exc:  # noqa: BLE001 - raised where the function waits
            invocation.resume(error=exc)
            continue
        invocation.resume(value)
    return invocation._value  # `end()`, without its frame: the loop just saw `done`


def call_blocking(function: Callable[..., Any], args: Sequence[Any],
                  trap: Callable[[Exception], BaseException] | None = None) -> Any:
    """`run_blocking(Invocation(function, args, trap))` in one frame and no object while
    the call never waits, as a ready call on `sync` never does: the path of every
    blocking call. A call that waits becomes an `Invocation` and runs as there."""
    try:
        value = function(*args)
        cls = value.__class__
        if cls is GeneratorType:
            try:
                invocation = Invocation.suspended(value, value.send(None), trap)
            except StopIteration as stop:
                return stop.value
        elif cls is Suspend:
            invocation = Invocation.suspended(None, value, trap)
        else:
            return value
    except Exception as exc:
        if trap is None:
            raise
        raise trap(exc) from None
    return run_blocking(invocation)


async def run_async(invocation: Invocation) -> Any:
    """Runs `invocation` to its end on trio; a wait suspends only this task."""
    import trio

    while not invocation.done:
        request = invocation.request
        if request is None:  # vm.yield: let other tasks run
            await trio.lowlevel.checkpoint()
            invocation.resume()
            continue
        try:
            value = await request.wait_async()
        except BaseException as exc:  # noqa: BLE001 - raised where the function waits
            invocation.resume(error=exc)
            continue
        invocation.resume(value)
    return invocation._value  # `end()`, without its frame: the loop just saw `done`

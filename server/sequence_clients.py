"""Which clients of waiting sequence steps are still there (`ClientWatch`).

Triton cancels a sequence with a cancelled request; over HTTP a cancelled request is a
client that closed its connection while its step waited or ran. The loop only sees that
when it next reads the connection, which it does not while the step waits, so the
connections of waiting steps are looked at every 20 ms through their probes
(`http.client_gone_probe`: a poll of the socket, no read), which a step takes when it is
admitted."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import trio

from .scheduling import nothing

__all__ = ["ClientWatch"]

_CHECK_SECONDS = 0.02  # how often waiting steps' connections are looked at


class ClientWatch:
    """Every check period, calls `left(step)` for each step `waiting()` yields whose
    client closed its connection: a step that waited at least one period, has a probe
    (`step.probe`, from `http.client_gone_probe` when it was admitted) and that
    `is_ended(step)` does not rule out (its sequence ended, it stopped waiting, or it was
    answered already); `after()` after each check. The steps are the scheduler's own (its queues and running executions):
    nothing is registered or forgotten per step. Runs as a system task (`run`) until
    `stop`; once nothing waits it sleeps until `wake` (the scheduler wakes it when it
    admits a step while it is `asleep`)."""

    def __init__(self, waiting: Callable[[], Iterable[Any]], left: Callable[[Any], None],
                 is_ended: Callable[[Any], bool], after: Callable[[], None]) -> None:
        self._waiting = waiting
        self._left = left
        self._is_ended = is_ended
        self._after = after
        self.asleep = False  # waits for `wake`: nothing was waiting at the last check
        self._wake: trio.Event | None = None
        self._stopped = False

    def wake(self) -> None:
        self.asleep = False
        if self._wake is not None:
            self._wake.set()

    def stop(self) -> None:
        self._stopped = True
        self.wake()

    def detach(self) -> None:
        """Calls nothing any more (its batcher stopped, idle): its callbacks were a
        reference cycle through the batcher, which a frozen heap would never collect."""
        self.stop()
        self._waiting = tuple  # `run` looks at no step again, calls `after` at most once
        self._left = self._is_ended = self._after = nothing

    async def run(self) -> None:
        while not self._stopped:
            await trio.sleep(_CHECK_SECONDS)
            before = trio.current_time() - _CHECK_SECONDS
            steps = list(self._waiting())
            for step in steps:
                if step.arrived <= before and step.probe is not None \
                        and not self._is_ended(step) and step.probe():
                    self._left(step)
            self._after()
            if not steps and not self._stopped:  # sleep until a step is admitted
                self._wake = trio.Event()
                self.asleep = True
                await self._wake.wait()
                self._wake = None

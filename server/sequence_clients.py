"""Which clients of waiting sequence steps are still there (`ClientWatch`).

Triton cancels a sequence with a cancelled request; over HTTP a cancelled request is a
client that closed its connection while its step waited or ran. The loop only sees that
when it next reads the connection, which it does not while the step waits, so the
connections of waiting steps are looked at every 20 ms through their probes
(`http.client_gone_probe`: a poll of the socket, no read)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from .http import client_gone_probe
from .scheduling import nothing

__all__ = ["ClientWatch"]

_CHECK_SECONDS = 0.02  # how often waiting steps' connections are looked at


class ClientWatch:
    """Calls `left(step)` for a watched step whose client closed its connection (once
    the step waited at least one check period, and not for a step `is_ended(step)`
    says needs no watching any more); `after()` after each check. Runs as a system
    task (`run`) until `stop`."""

    def __init__(self, left: Callable[[Any], None], is_ended: Callable[[Any], bool],
                 after: Callable[[], None]) -> None:
        self._left = left
        self._is_ended = is_ended
        self._after = after
        self.watched: dict[Any, Callable[[], bool]] = {}  # step -> its client's probe
        self._wake: trio.Event | None = None  # set: a step is watched again
        self._stopped = False

    def watch(self, step: Any) -> None:
        """Watches `step`'s client, when the calling task serves a connection."""
        probe = client_gone_probe()
        if probe is not None:
            self.watched[step] = probe
            if self._wake is not None:
                self._wake.set()

    def forget(self, step: Any) -> None:
        self.watched.pop(step, None)

    def stop(self) -> None:
        self._stopped = True
        if self._wake is not None:
            self._wake.set()

    def detach(self) -> None:
        """Calls nothing any more (its batcher stopped, idle): its callbacks were a
        reference cycle through the batcher, which a frozen heap would never collect."""
        self.stop()
        self.watched.clear()  # `run` looks at none of them again, calls `after` at most
        self._left = self._is_ended = self._after = nothing

    async def run(self) -> None:
        while not self._stopped:
            if not self.watched:  # sleep until there is something to watch
                self._wake = trio.Event()
                await self._wake.wait()
                self._wake = None
                continue
            await trio.sleep(_CHECK_SECONDS)
            before = trio.current_time() - _CHECK_SECONDS
            for step, gone in list(self.watched.items()):
                if step.arrived <= before and not self._is_ended(step) and gone():
                    self._left(step)
            self._after()

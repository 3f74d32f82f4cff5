"""The client watch of waiting sequence steps (server/sequence_clients.py): it probes the
steps its scheduler yields at each check, with nothing registered per step, and sleeps
while nothing waits. Driven on trio's mock clock, so no wall-clock time is asserted."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from tinyhal.server.sequence_clients import ClientWatch

pytestmark = pytest.mark.timeout(60)


class _Step:
    def __init__(self, name: str, arrived: float, gone: bool | None,
                 ended: bool = False) -> None:
        self.name = name
        self.arrived = arrived
        self.probed = 0
        self.probe = None if gone is None else self._probe
        self._gone = gone
        self.ended = ended

    def _probe(self) -> bool:
        self.probed += 1
        return bool(self._gone)


def _run(test) -> None:
    trio.run(test, clock=trio.testing.MockClock(autojump_threshold=0))


def test_only_steps_that_waited_a_period_and_still_matter_are_probed():
    async def main() -> None:
        now = trio.current_time()
        steps = [_Step("gone", now, True), _Step("here", now, False),
                 _Step("no connection", now, None), _Step("ended", now, True, ended=True)]
        waiting = list(steps)
        left: list[str] = []
        checks = [0]

        def leave(step: _Step) -> None:  # as the scheduler: the step's sequence ends
            left.append(step.name)
            waiting.remove(step)

        watch = ClientWatch(lambda: iter(waiting), leave, lambda s: s.ended,
                            lambda: checks.__setitem__(0, checks[0] + 1))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch.run)
            await trio.sleep(0.51)  # between two checks (every 20 ms)
            late = _Step("late", trio.current_time(), True)
            waiting.append(late)
            await trio.sleep(0.015)  # the next check came: too soon for it to be probed
            assert late.probed == 0 and checks[0] >= 26
            await trio.sleep(0.1)
            assert left == ["gone", "late"]
            assert steps[1].probed >= 2 and steps[3].probed == 0
            assert checks[0] >= 2
            watch.stop()

    _run(main)


def test_it_sleeps_while_nothing_waits_and_wakes_for_a_step():
    async def main() -> None:
        waiting: list[_Step] = []
        checks = [0]
        left: list[str] = []

        def leave(step: _Step) -> None:  # as the scheduler: the step's sequence ends
            left.append(step.name)
            waiting.remove(step)

        watch = ClientWatch(lambda: iter(waiting), leave, lambda s: False,
                            lambda: checks.__setitem__(0, checks[0] + 1))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch.run)
            await trio.sleep(1)
            assert watch.asleep and checks[0] == 1  # one check found nothing, then slept
            await trio.sleep(10)
            assert checks[0] == 1
            waiting.append(_Step("gone", trio.current_time(), True))
            watch.wake()
            assert not watch.asleep
            await trio.sleep(0.1)
            assert left == ["gone"] and checks[0] > 1
            watch.stop()  # ends `run`, asleep or not

    _run(main)

"""Runs `tinyhal-serve` with its event-loop thread profiled only while a flag file exists.

    python bench/loop_profiler.py STATS_FILE [tinyhal-serve arguments ...]

cProfile on a thread-CPU-time clock (time the thread waited for a CPU or slept is not
counted, so a loaded machine changes the figures less), on the loop thread only. The
profiler is switched on and off between two passes of the loop (a trio instrument looks
at a flag set by a watcher thread that sees `STATS_FILE.on` appear and disappear), so
start-up, model loading and warm-up stay out. The statistics are written to STATS_FILE
(pstats format) when the server ends. Used by `serve_profile.py --sequences`; runs with
whichever interpreter (build) starts it.
"""

from __future__ import annotations

import cProfile
import os
import runpy
import sys
import threading
import time

import trio

_PROFILE = cProfile.Profile(time.thread_time_ns, 1e-9)
_WANTED = threading.Event()  # the flag file exists


class _Switch(trio.abc.Instrument):
    def __init__(self) -> None:
        self.on = False

    def before_io_wait(self, timeout: float) -> None:
        wanted = _WANTED.is_set()
        if wanted != self.on:
            self.on = wanted
            if wanted:
                _PROFILE.enable()
            else:
                _PROFILE.disable()


def _watch(flag: str) -> None:
    while True:
        if os.path.exists(flag):
            _WANTED.set()
        else:
            _WANTED.clear()
        time.sleep(0.05)


def main() -> None:
    stats_file = sys.argv[1]
    threading.Thread(target=_watch, args=(stats_file + ".on",), daemon=True).start()
    run = trio.run

    def run_switched(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - trio.run's own
        kwargs["instruments"] = [*kwargs.get("instruments", ()), _Switch()]
        return run(*args, **kwargs)

    trio.run = run_switched
    exit_now = os._exit

    def dump_and_exit(code: int) -> None:  # the server ends with os._exit
        _PROFILE.disable()
        _PROFILE.dump_stats(stats_file)
        exit_now(code)

    os._exit = dump_and_exit
    sys.argv = ["tinyhal-serve", *sys.argv[2:]]
    try:
        runpy.run_module("tinyhal.server.main", run_name="__main__")
    finally:
        dump_and_exit(0)


if __name__ == "__main__":
    main()

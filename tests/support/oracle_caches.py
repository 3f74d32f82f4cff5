"""Every cache of iree.runtime objects (the oracle the tests compare tinyhal with) that
outlives one test registers here, and tests/conftest.py empties them all when the session
ends. An iree.runtime object still referenced once pytest returns is freed, if at all,
during the interpreter's teardown, after nanobind has checked for leaks: it then prints a
report of every iree.runtime instance, type and function after pytest's summary line.
Which module globals teardown clears first depends on which test modules were imported,
so a cache that is harmless in one suite leaks in the full run; releasing them all here
makes the end of every run the same.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Protocol, TypeVar


class _Clearable(Protocol):
    def clear(self) -> None: ...


_CACHES: list[Callable[[], None]] = []

C = TypeVar("C", bound=_Clearable)
F = TypeVar("F", bound=Callable)


def register(cache: C) -> C:
    """Adds a dict (or anything with `clear()`) holding iree.runtime objects to what the
    session's end empties; returns it, so a cache is made and registered in one line."""
    _CACHES.append(cache.clear)
    return cache


def session_cache(function: F) -> F:
    """`functools.cache` for a function returning iree.runtime objects, emptied when the
    session ends."""
    cached = functools.cache(function)
    _CACHES.append(cached.cache_clear)
    return cached  # type: ignore[return-value]


def clear_all() -> None:
    """Empties every registered cache (the session's end; nothing runs the oracle after)."""
    for clear in _CACHES:
        clear()

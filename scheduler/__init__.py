"""tinyhal.scheduler: a generic task system.

A worker pool (`Executor` running `CallTask`s) and a trio bridge (`await_callback`, which
the HAL's semaphores wait through; `on_event_loop`). It knows nothing of
buffers, semaphores, devices or modules; HAL drivers build on it.
"""

from __future__ import annotations

from .executor import (
    CallTask,
    Executor,
    ExecutorStatistics,
    current_worker_index,
    default_worker_count,
)
from .trio_bridge import await_callback, on_event_loop

__all__ = [
    "CallTask",
    "Executor",
    "ExecutorStatistics",
    "await_callback",
    "current_worker_index",
    "default_worker_count",
    "on_event_loop",
]

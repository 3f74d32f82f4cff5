"""tinyhal: an asynchronous HAL and task-scheduler runtime for IREE-compiled programs."""

from __future__ import annotations

from typing import Any

from .errors import Error, StatusCode

__all__ = ["Error", "StatusCode", "load"]
__version__ = "0.1.0"


def load(path_or_bytes: Any, device: Any = "task", **options: Any) -> Any:
    """Loads a `.vmfb` module onto a device; see `tinyhal.vm.load`."""
    from .vm import load as _load

    return _load(path_or_bytes, device=device, **options)

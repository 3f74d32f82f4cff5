"""Driver registry: each driver is a `Device` subclass in its own module, imported lazily."""

from __future__ import annotations

import importlib
from typing import Any

from ...errors import InvalidArgumentError

_DRIVERS = {
    "sync": ("sync", "SyncDevice"),
    "task": ("task", "TaskDevice"),
    "emu": ("emu", "EmuDevice"),
}


def names() -> list[str]:
    available = []
    for name, (module, _) in _DRIVERS.items():
        try:
            importlib.import_module(f"{__name__}.{module}")
        except ImportError:
            continue
        available.append(name)
    return available


def create(name: str, **options: Any) -> Any:
    try:
        module_name, class_name = _DRIVERS[name]
    except KeyError:
        raise InvalidArgumentError(
            f"unknown driver {name!r}; drivers: {', '.join(_DRIVERS)}"
        ) from None
    try:
        module = importlib.import_module(f"{__name__}.{module_name}")
    except ImportError as exc:
        from ...errors import UnimplementedError

        raise UnimplementedError(f"driver {name!r} is not available: {exc}") from None
    return getattr(module, class_name)(**options)

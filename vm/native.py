"""The contract between the bytecode interpreter and modules written in Python.

A `NativeModule` (the `hal` module first of all) exposes functions by their fully
qualified import name (`hal.buffer_view.create`) with IREE's calling-convention string
(`0rIIiiCID_r`). The interpreter marshals arguments by that string:

- `i` -> Python int (the signed 32-bit value), `I` -> Python int (signed 64-bit),
  `f`/`F` -> Python float, `r` -> the referenced object or `None` for a null ref;
- a variadic segment `C...D` -> a `list` of `tuple`s, one tuple per segment entry, with
  the entry's values in order (a one-value entry is still a 1-tuple).

The function returns `None` for `_v`, the bare value for one result and a tuple for
several. Ints returned are wrapped to the declared width by the interpreter.

A function declared `yieldable` may instead return a `Suspend`: the interpreter hands it
to whoever drives the invocation, which either blocks on it (`Suspend.block()`) or awaits
it on trio (`await Suspend.wait_async()`); both return the function's results.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any


class Suspend:
    """A yieldable import's request to wait before producing its results."""

    __slots__ = ("_block", "_wait_async")

    def __init__(
        self,
        block: Callable[[], Any],
        wait_async: Callable[[], Awaitable[Any]],
    ) -> None:
        self._block = block
        self._wait_async = wait_async

    def block(self) -> Any:
        """Waits on the calling thread and returns the import's results."""
        return self._block()

    async def wait_async(self) -> Any:
        """Waits without blocking the trio event loop and returns the import's results."""
        return await self._wait_async()


@dataclass(frozen=True)
class NativeFunction:
    """One function a native module exports."""

    name: str
    cconv: str
    fn: Callable[..., Any]
    yieldable: bool = False


@dataclass
class NativeModule:
    """A module implemented in Python whose functions bytecode modules import."""

    name: str
    version: int = 0
    functions: dict[str, NativeFunction] = field(default_factory=dict)

    def export(
        self, name: str, cconv: str, *, yieldable: bool = False
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator registering `fn` as `<module>.<name>` with calling convention `cconv`."""

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            full = f"{self.name}.{name}"
            self.functions[full] = NativeFunction(full, cconv, fn, yieldable)
            return fn

        return register

    def lookup(self, full_name: str) -> NativeFunction | None:
        return self.functions.get(full_name)

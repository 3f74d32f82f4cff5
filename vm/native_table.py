"""Native modules declared as a table plus an explicit state, as IREE declares its
modules (`exports.inl`: one row per export, and a per-context state struct).

Each row (`Export`) names the export, its IREE calling convention, the ref type of each
top-level argument (a type name, `?` suffixed when null is allowed, None for a
non-ref) and its function, which takes the module's state first. `build_module` binds
the rows to one state and registers them on a `NativeModule` behind the marshaller that
checks the declared refs (`tinyhal.vm.native`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from .native import NativeModule, RefType

__all__ = ["Export", "build_module"]


class Export(NamedTuple):
    """One export of a native module (see the module docstring)."""

    name: str
    cconv: str
    refs: tuple[str | None, ...]
    fn: Callable[..., Any]


def _bind(fn: Callable[..., Any], state: Any) -> Callable[..., Any]:
    def bound(*args: Any) -> Any:
        return fn(state, *args)

    bound.__name__ = fn.__name__
    return bound


def build_module(name: str, version: int, exports: Iterable[Export], state: Any,
                 ref_types: Mapping[str, type]) -> NativeModule:
    """A `NativeModule` serving `exports` over `state` (kept as `module.state`);
    `ref_types` maps each ref type name the rows use to its Python class."""
    module = NativeModule(name, version)
    for export in exports:
        refs = tuple(None if r is None else RefType(ref_types[r.rstrip("?")], r.rstrip("?"),
                                                     r.endswith("?"))
                     for r in export.refs)
        module.export(export.name, export.cconv, refs=refs)(_bind(export.fn, state))
    module.state = state  # type: ignore[attr-defined]
    return module

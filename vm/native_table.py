"""Native modules declared as a table plus an explicit state, as IREE declares its
modules (`exports.inl`: one row per export, and a per-context state struct).

Each row (`Export`) names the export, its IREE calling convention, the ref type of each
top-level argument (a type name, `?` suffixed when null is allowed, None for a
non-ref; the whole tuple None for an export that declares none, such as one that is
UNIMPLEMENTED), its function, which takes the module's state first, and whether it may
yield (return a `Suspend`). `build_module` binds every function to one state with
`functools.partial`, which adds no Python frame, and registers it on a `NativeModule`.

Declared refs are checked in one of two ways, chosen per module: behind the marshaller
that `tinyhal.vm.native` generates from the declaration (the default), or by the
functions themselves in their first lines (`shims_check_refs=True`, the `hal` module,
whose import calls must cost exactly one frame; its tests hold every row to its shim).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from .native import NativeModule, RefType

__all__ = ["Export", "build_module"]


class Export(NamedTuple):
    """One export of a native module (see the module docstring)."""

    name: str
    cconv: str
    refs: tuple[str | None, ...] | None
    fn: Callable[..., Any]
    yields: bool = False


def _ref_type(declared: str, ref_types: Mapping[str, type]) -> RefType:
    name = declared.rstrip("?")
    return RefType(ref_types[name], name, declared.endswith("?"))


def build_module(name: str, version: int, exports: Iterable[Export], state: Any,
                 ref_types: Mapping[str, type] | None = None, *,
                 shims_check_refs: bool = False) -> NativeModule:
    """A `NativeModule` serving `exports` over `state` (kept as `module.state`).

    `ref_types` maps each ref type name the rows use to its Python class; it is needed
    only when the marshaller checks the refs, that is unless `shims_check_refs`."""
    module = NativeModule(name, version)
    for export in exports:
        refs = None
        if export.refs is not None and not shims_check_refs:
            refs = tuple(None if r is None else _ref_type(r, ref_types or {})
                         for r in export.refs)
        module.export(export.name, export.cconv, yieldable=export.yields,
                      refs=refs)(functools.partial(export.fn, state))
    module.state = state  # type: ignore[attr-defined]
    return module

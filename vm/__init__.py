"""tinyhal.vm — the IREE VM: `.vmfb` loader, bytecode interpreter and module contexts.

    from tinyhal.vm import Context, load_module
    ctx = Context([hal_module, load_module("model.vmfb")])
    ctx.invoke("module.main", [x, y])          # -> list of results
    await ctx.invoke_async("module.main", [x])  # on trio
    invocation = ctx.begin("module.main", [x])  # by hand: resume after each wait, end()

Native modules (such as `hal`) implement the contract in `tinyhal.vm.native`; host apps
write their own the same way and pass them to `tinyhal.load(path, modules=[...])` (or
`tinyhal-run --native_module=pkg.mod:factory`). `create_hal_module(device)` makes the
`hal` module for a context built by hand.
"""

from __future__ import annotations

from typing import Any

from ..hal.executable import ExecutableLoader, register_executable_loader
from .cconv import parse_cconv
from .context import Context, ModuleInstance, VMFunction
from .hal_module import create_hal_module
from .invocation import Invocation, call_blocking, run_async, run_blocking
from .loader import BytecodeModule, load_module
from .native import NativeFunction, NativeModule, Suspend
from .ops import F32Bits
from .types import VMBuffer, VMList
from .vmvx_format import VMVX_FORMAT, is_vmvx_module


def _load_vmvx(data: bytes, name: str) -> Any:
    """A VMVX executable: `tinyhal.vm.vmvx` runs its operations with numpy (~60 ms and
    15 MiB to import), so it is imported with the first one, not with the package."""
    from .vmvx import VMVXExecutable

    return VMVXExecutable(data, name)


register_executable_loader(ExecutableLoader(VMVX_FORMAT, is_vmvx_module, _load_vmvx))


__all__ = [
    "BytecodeModule",
    "Context",
    "F32Bits",
    "Invocation",
    "ModuleInstance",
    "NativeFunction",
    "NativeModule",
    "ParameterIndex",
    "Suspend",
    "VMBuffer",
    "VMFunction",
    "VMList",
    "VMVXExecutable",
    "call_blocking",
    "create_hal_inline_module",
    "create_hal_loader_module",
    "create_hal_module",
    "create_io_parameters_module",
    "create_vmvx_module",
    "load_module",
    "parse_cconv",
    "run_async",
    "run_blocking",
]


# Imported on first use: a program that needs neither TinyIREE's inline modules nor
# parameters (most) does not pay for them, nor for the parameter formats' json, nor one
# without VMVX executables for numpy (VMVX's operations).
_LAZY = {
    "VMVXExecutable": ".vmvx",
    "create_vmvx_module": ".vmvx",
    "create_hal_inline_module": ".hal_inline",
    "create_hal_loader_module": ".hal_inline",
    "create_io_parameters_module": ".io_parameters",
    "ParameterIndex": ".parameter_formats",
    "load": ".api",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

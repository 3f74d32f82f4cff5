"""Build of `tinyhal.hal.native._core`, a CPython extension (C API, not cffi: it takes and
returns Python objects) from `core.c`.

setup.py builds it as an `Extension` (`extension()`); `tinyhal.hal.native.load_compiled`
builds the same source into the per-user cache when running from an uninstalled tree,
through `make_builder`, which answers the `compile(tmpdir=...)` that cffi's builders do.
The module's init function is named after the module (`TINYHAL_CORE_NAME`), so the cache
can load it under its content-hashed name.
"""

from __future__ import annotations

import os
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE_NAME = "tinyhal.hal.native._core"
SOURCES = ("core_build.py", "core.c")  # what the build-on-first-use cache is keyed by
COMPILE_ARGS = ["-O2", "-std=c11"]


def _refuse_free_threaded() -> None:
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        raise RuntimeError(
            "tinyhal's _core relies on the GIL for its fast paths and cannot be built for a "
            "free-threaded (Py_GIL_DISABLED) interpreter"
        )


def extension(module_name: str = MODULE_NAME, source: str | None = None):
    """The setuptools `Extension` of `module_name` (its last component names the init
    function); `source` defaults to `core.c` relative to the project root (setup.py)."""
    from setuptools import Extension

    _refuse_free_threaded()
    return Extension(
        module_name,
        sources=[source or os.path.join("hal", "native", "core.c")],
        define_macros=[("TINYHAL_CORE_NAME", module_name.rsplit(".", 1)[-1])],
        extra_compile_args=COMPILE_ARGS,
    )


class _ExtensionBuilder:
    """Compiles one `extension` with setuptools' build_ext into a directory."""

    def __init__(self, module_name: str) -> None:
        self.module_name = module_name

    def compile(self, tmpdir: str) -> str:
        from setuptools import Distribution
        from setuptools.command.build_ext import build_ext

        ext = extension(self.module_name, os.path.join(HERE, "core.c"))
        command = build_ext(Distribution({"name": self.module_name, "ext_modules": [ext]}))
        command.build_lib = tmpdir
        command.build_temp = os.path.join(tmpdir, "temp")
        command.ensure_finalized()
        command.run()
        return command.get_ext_fullpath(self.module_name)


def make_builder(module_name: str = MODULE_NAME) -> _ExtensionBuilder:
    return _ExtensionBuilder(module_name)

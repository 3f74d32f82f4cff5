"""Shared test configuration.

The repository root is itself the package `tinyhal` (it has an `__init__.py`), so pytest
would collect it as a package and import that `__init__.py` under the checkout folder's
name: `wt/` would work by accident and `tinyhal-main/` (a ZIP download) or
`tinyhal-0.1.0/` (a release) would fail every test. The plugin below collects the root
as a plain directory instead. It is registered as a plugin rather than written as a hook
here because a conftest's hooks only see paths under its own folder, and the root is
above `tests/`. `tests/support` is made importable for every suite. Tests marked
`container` (building the container image) run only with `-m container`, those marked
`chaos` (a short run of bench/serve_chaos.py) only with `-m chaos`.

A run ends with pytest's summary line and nothing after it: iree.runtime objects (the
oracle's contexts and the devices iree.runtime caches per URI) are released when the
session ends, before the interpreter's teardown, where nanobind would report each one
still alive as a leak (tests/test_quiet_run.py).
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


class _RootIsADirectory:
    def __init__(self, root: Path) -> None:
        self.root = root

    @pytest.hookimpl(tryfirst=True)
    def pytest_collect_directory(self, path: Path, parent: pytest.Collector):
        if path == self.root:
            return pytest.Dir.from_parent(parent, path=path)
        return None


_OPT_IN = {"container": "python -m pytest -m container tests/test_container.py",
           "chaos": "python -m pytest -m chaos tests/server/test_chaos.py",
           "differential_storm": "python -m pytest -m differential_storm "
                                 "tests/vm/test_differential_programs.py"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests with an opt-in marker (`container`, `chaos`) run only when asked for
    (`-m container`, `-m chaos`)."""
    asked = config.option.markexpr or ""
    for marker, command in _OPT_IN.items():
        if marker in asked:
            continue
        opt_in = pytest.mark.skip(reason=f"opt-in: {command}")
        for item in items:
            if item.get_closest_marker(marker) is not None:
                item.add_marker(opt_in)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Drops what keeps iree.runtime objects alive past the run: the tests' own oracle
    caches (each registered in `support.oracle_caches`), the last failed test's traceback
    (pytest keeps it in `sys.last_value` for post-mortem debugging; its frames hold the
    test's locals), iree.runtime's own per-URI device cache (module state of
    `iree.runtime.system_setup`, which has no public way to empty it), its binding's
    driver cache and the one object the binding keeps for every call (`_invoke_statics`,
    which a long run's teardown frees after nanobind checked for leaks), then every cycle
    still holding one, the frozen ones included: a test that loads a model repository in
    this process freezes the heap (`gc.freeze`, as the server does), and a frozen cycle,
    such as an earlier test's oracle context, is never collected and outlives the run.
    Nothing runs iree.runtime after this hook."""
    from support.oracle_caches import clear_all

    clear_all()
    for name in ("last_exc", "last_type", "last_value", "last_traceback"):
        if hasattr(sys, name):
            delattr(sys, name)
    system_setup = sys.modules.get("iree.runtime.system_setup")
    devices = getattr(system_setup, "_GLOBAL_DEVICES_BY_URI", None)
    if isinstance(devices, dict):
        devices.clear()
    binding = sys.modules.get("iree._runtime_libs._runtime")
    if binding is not None and hasattr(binding, "clear_hal_driver_cache"):
        binding.clear_hal_driver_cache()
    for name in ("iree._runtime_libs._runtime", "iree.runtime.function"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "_invoke_statics"):
            del module._invoke_statics
    gc.unfreeze()
    gc.collect()


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_RootIsADirectory(Path(__file__).resolve().parents[1]),
                                  "tinyhal-root-is-a-directory")

"""Fixtures for the VM suites (helpers live in `support.vm_pairs`)."""

from __future__ import annotations

import pytest

from support.oracle_caches import register
from support.vm_pairs import Pair, vm_compile_source


@pytest.fixture(scope="session")
def vm_compile():
    return vm_compile_source


@pytest.fixture(scope="session")
def vm_pair_cache():
    """Pairs by program, for the session; emptied at its end (`support.oracle_caches`) so
    their iree.runtime contexts do not outlive the run."""
    return register({})


@pytest.fixture
def vm_pair(vm_pair_cache):
    """A cached `Pair` per program and per setting of native integer loops (the setting
    applies when a module loads)."""
    from tinyhal.vm import scalar

    def make(path: str, fresh: bool = False) -> Pair:
        if fresh:
            return Pair(path)
        key = (path, scalar.enabled())
        p = vm_pair_cache.get(key)
        if p is None:
            p = vm_pair_cache[key] = Pair(path)
        return p

    return make


@pytest.fixture(params=["native loops", "python loops"])
def loop_mode(request, monkeypatch):
    """Runs a test once with integer loops in C (the default) and once all in Python."""
    monkeypatch.setenv("TINYHAL_VM_NATIVE_LOOPS", "1" if request.param == "native loops" else "0")
    return request.param

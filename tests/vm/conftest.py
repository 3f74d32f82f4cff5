"""Fixtures for the VM suites (helpers live in `support.vm_pairs`)."""

from __future__ import annotations

import pytest

from support.vm_pairs import Pair, vm_compile_source


@pytest.fixture(scope="session")
def vm_compile():
    return vm_compile_source


@pytest.fixture(scope="session")
def vm_pair_cache():
    return {}


@pytest.fixture
def vm_pair(vm_pair_cache):
    def make(path: str, fresh: bool = False) -> Pair:
        if fresh:
            return Pair(path)
        p = vm_pair_cache.get(path)
        if p is None:
            p = vm_pair_cache[path] = Pair(path)
        return p

    return make

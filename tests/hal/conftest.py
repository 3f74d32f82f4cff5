"""Fixtures for the HAL conformance suite: one device per driver, IREE-built executables.

Every test taking `device` runs once per driver, so each driver must pass the same suite
(as IREE's CTS does). `TINYHAL_TEST_DRIVERS=sync,task` narrows the list; it may also
name a driver registered at run time through `TINYHAL_DRIVER_MODULES` (as
`support/toy_driver.py`, the one-file driver, is: see its docstring).
"""

from __future__ import annotations

import os

import pytest

from support.executables import compile_executable
from tinyhal import hal


def _drivers() -> list[str]:
    wanted = os.environ.get("TINYHAL_TEST_DRIVERS")
    available = hal.available_drivers()
    if wanted:
        return [d for d in wanted.split(",") if d in available]
    return available


DRIVERS = _drivers()


@pytest.fixture(params=DRIVERS)
def driver(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def device(driver: str):
    dev = hal.create_device(driver)
    yield dev
    dev.close()


@pytest.fixture(scope="session", params=["embedded", "system"])
def elementwise_executable_bytes(request: pytest.FixtureRequest) -> bytes:
    return compile_executable("elementwise_3d", embedded=request.param == "embedded")


@pytest.fixture(scope="session")
def executable_bytes_by_name():
    return compile_executable

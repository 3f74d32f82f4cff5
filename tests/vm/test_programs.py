"""The program corpus run by tinyhal (`sync` and `task`) against IREE on the same .vmfb.

Every program in `programs/` is compiled once by the pinned iree-compile (cached by
content hash), run by `iree.runtime` (local-sync) and by `tinyhal.load` on each driver;
every result must be identical (dtype, shape, bits), except for host-side float math
where the case allows a couple of ULP.
"""

from __future__ import annotations

import pytest
from programs.corpus import CASES, Case, assert_same, compile_program, iree_run_calls

import tinyhal
from tinyhal import hal

DRIVERS = ["sync", "task", "emu"]


@pytest.fixture(scope="module", params=DRIVERS)
def device(request):
    dev = hal.create_device(request.param)
    yield dev
    dev.close()


@pytest.fixture(scope="module")
def oracle_results():
    cache: dict[str, list] = {}

    def get(case: Case) -> list:
        if case.program not in cache:
            cache[case.program] = iree_run_calls(compile_program(case.program), case.calls)
        return cache[case.program]

    return get


def test_corpus_is_large_enough():
    assert len(CASES) >= 30
    assert len({c.program for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_program_matches_iree(case: Case, device, oracle_results):
    vmfb = compile_program(case.program)
    expected = oracle_results(case)
    with tinyhal.load(vmfb, device=device) as module:
        for i, ((fn, args), theirs) in enumerate(zip(case.calls, expected)):
            ours = module.invoke(fn, *args)
            assert_same(ours, theirs, case.ulps, f"{case.program} call {i} {fn}")


def test_module_state_persists_across_calls(device):
    import numpy as np

    vmfb = compile_program("globals_counter")
    with tinyhal.load(vmfb, device=device) as module:
        x = np.ones(4, np.float32)
        for n in range(1, 4):
            total, count = module.accumulate(x)
            assert count == n
            assert total.tolist() == [float(n)] * 4
        assert module.get_count() == 3
    with tinyhal.load(vmfb, device=device) as fresh:  # a new module starts over
        assert fresh.get_count() == 0

"""The keyword-spotting DS-CNN (the TFLM benchmark model), IREE vs tinyhal on every driver.

The model memoizes its command buffer in `__init` and replays it with
`queue.execute.indirect` on each call, so repeated calls with different inputs check
that replay re-binds the binding table (new inputs, new transient memory) bit-exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

import tinyhal
from support.models import ds_cnn_kws_vmfb, iree_function, kws_input

pytest.importorskip("onnx")

SEEDS = (1, 2, 3)


@pytest.fixture(scope="module")
def vmfb():
    return ds_cnn_kws_vmfb()


@pytest.fixture(scope="module")
def expected(vmfb):
    reference = iree_function(vmfb, "ds_cnn_kws")
    return {seed: reference(kws_input(seed)) for seed in SEEDS}


@pytest.mark.parametrize("driver", ["sync", "task", "emu"])
def test_kws_ds_cnn_matches_iree_bit_exactly(vmfb, expected, driver):
    with tinyhal.load(vmfb, device=driver) as module:
        results = {}
        for _round in range(2):
            for seed in SEEDS:
                ours = module.ds_cnn_kws(kws_input(seed))
                assert ours.dtype == np.float32 and ours.shape == (1, 12)
                assert ours.tobytes() == expected[seed].tobytes(), (driver, seed)
                results[seed] = ours
        # different inputs give different keywords' scores: the replay re-bound its inputs
        assert results[1].tobytes() != results[2].tobytes()
        module.trim()  # the input buffer kept for the next call
        assert module.statistics().live_bytes == 0

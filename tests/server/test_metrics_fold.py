"""Request series are folded into histograms and statistics a table at a time: the same
counts, totals and buckets as recording every duration one by one."""

from __future__ import annotations

import random

from tinyhal.server.metrics import _FOLD_ROWS, ModelSeries
from tinyhal.server.stats import PHASES, Latency, ModelStatistics


def test_folding_a_table_counts_as_adding_each_duration():
    series, stats = ModelSeries(), ModelStatistics()
    bounds = series.duration.bounds
    one_by_one = [Latency(bounds) for _ in range(1 + len(PHASES))]
    rng = random.Random(7)
    picks = [0.0, 1e-6, *bounds, 0.0031, 45.0]  # on the bounds too: they are inclusive
    for _ in range(_FOLD_ROWS * 2 + 17):  # folds on its own twice, then when read
        row = [rng.choice(picks) if rng.random() < 0.5 else rng.random() / 50
               for _ in range(1 + len(PHASES))]
        series.succeeded(stats, tuple(row[1:]), row[0])
        for latency, seconds in zip(one_by_one, row):
            latency.add(seconds)
    series.fold()
    folded = [series.duration, *series.phases]
    for got, want in zip(folded, one_by_one):
        assert got.count == want.count and got.buckets == want.buckets
        assert abs(got.ns - want.ns) <= got.count  # each truncated to whole ns
    for got, want in zip([stats.success, *stats.phase_list], one_by_one):
        assert got.count == want.count and abs(got.ns - want.ns) <= got.count
    assert series.by_code[200] == _FOLD_ROWS * 2 + 17

"""Bootstrap intervals of the report metrics (spec 003 §2.5)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dplang.reports.bootstrap import bootstrap_metrics, claim_metrics
from dplang.reports.evaluation import emit_rate, false_emission, mean_support, unsupported_emit
from dplang.reports.mechanism import FilterConfig, calibrate


def test_point_values_equal_the_pooled_metrics() -> None:
    rng = np.random.default_rng(0)
    f = rng.uniform(0, 0.2, 40)
    e = rng.random((30, 40)) < 0.3 + f
    ci = bootstrap_metrics(e, f, 0.05, np.random.default_rng(1), reps=500)
    assert ci["emit_rate"].value == pytest.approx(emit_rate(e))
    assert ci["unsupported_emit"].value == pytest.approx(unsupported_emit(e, f, 0.05))
    assert ci["false_emission"].value == pytest.approx(false_emission(e, f, 0.05))
    assert ci["mean_support"].value == pytest.approx(mean_support(e, f))
    for m in ci.values():
        assert m.lower <= m.value <= m.upper
        assert m.runs == 30
    per_run = np.nanmean([false_emission(r, f, 0.05) for r in e])
    assert ci["false_emission"].per_run == pytest.approx(per_run)


def test_intervals_cover_the_exact_expectation() -> None:
    """Proposal-and-filter on a fixed list: the exact E[EmitRate] = mean_j g(f_j) lies in the
    95% bootstrap interval of 40-run experiments about 95% of the time (a too-narrow interval,
    e.g. one that resampled candidates instead of runs, would fail)."""
    n, m = 1000, 50
    rng = np.random.default_rng(7)
    counts = rng.integers(0, 150, m)
    test, _ = calibrate(FilterConfig(epsilon=5.0, beta=0.05, theta=0.05, noise="laplace"), m, n)
    exact = float(np.mean([test.emit_probability(int(c), 0.05) for c in counts]))
    hits, trials = 0, 200
    for t in range(trials):
        z = test.sample_array(np.random.default_rng(100 + t), (40, m))
        e = test.emits_array(counts[None, :], z, 0.05)
        ci = bootstrap_metrics(e, counts / n, 0.05, np.random.default_rng(t), reps=400)
        hits += ci["emit_rate"].lower <= exact <= ci["emit_rate"].upper
    assert 0.88 <= hits / trials <= 0.99


def test_claim_metrics_for_free_text() -> None:
    sup = [np.array([0.0, 0.2]), np.array([0.01]), np.array([]), np.array([0.3, 0.4, 0.02])]
    ci = claim_metrics(sup, 0.05, np.random.default_rng(0), reps=300)
    assert ci["false_emission"].value == pytest.approx(3 / 6)
    assert ci["mean_support"].value == pytest.approx(0.93 / 6)
    assert ci["emit_rate"].value == 1.0
    assert ci["unsupported_emit"].value == 1.0
    # per-run: texts without claims are skipped
    assert ci["false_emission"].per_run == pytest.approx((0.5 + 1 + 1 / 3) / 3)
    one = claim_metrics([np.array([0.0])], 0.05, np.random.default_rng(0))
    assert math.isnan(one["false_emission"].lower)

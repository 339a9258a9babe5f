"""Metrics and the Theorem 5.1 / 5.2 checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dplang.privacy.randomness import RandomStreams
from dplang.reports import (
    FilterConfig,
    KeywordPredicate,
    Statement,
    calibrate,
    certify_counts,
    coverage,
    emit_rate,
    evaluate_report,
    exact_expected_emit_rate,
    false_emission,
    mean_support,
    proposal_and_filter,
    theorem_5_2_interval,
    true_supports,
    unsupported_emit,
)
from dplang.reports.evaluation import unsupported_emit_per_candidate


def test_metrics_on_a_hand_made_example() -> None:
    supports = np.array([0.5, 0.02, 0.3, 0.01, 0.0])
    emitted = np.array([True, True, False, False, False])
    theta = 0.1
    assert emit_rate(emitted) == pytest.approx(0.4)
    # U = {1, 3, 4}; O ∩ U = {1}
    assert unsupported_emit(emitted, supports, theta) == pytest.approx(1 / 3)
    assert unsupported_emit_per_candidate(emitted, supports, theta) == pytest.approx(1 / 5)
    assert false_emission(emitted, supports, theta) == pytest.approx(1 / 2)
    assert mean_support(emitted, supports) == pytest.approx(0.26)
    assert coverage(supports, theta) == pytest.approx(2 / 5)
    none = np.zeros(5, dtype=bool)
    assert math.isnan(false_emission(none, supports, theta))
    assert math.isnan(mean_support(none, supports))
    assert math.isnan(unsupported_emit(emitted, np.ones(5), theta))  # no unsupported ones


def test_metrics_pool_over_runs() -> None:
    supports = np.array([0.5, 0.0])
    emitted = np.array([[True, False], [True, True]])
    assert emit_rate(emitted) == pytest.approx(0.75)
    assert unsupported_emit(emitted, supports, 0.1) == pytest.approx(0.5)
    assert false_emission(emitted, supports, 0.1) == pytest.approx(1 / 3)


def test_interval_values() -> None:
    supports = np.array([0.0, 0.05, 0.1, 0.2, 0.5])
    iv = theorem_5_2_interval(supports, theta=0.1, tau=0.05, beta=0.05)
    assert iv.p_theta == pytest.approx(3 / 5) and iv.p_theta_2tau == pytest.approx(2 / 5)
    assert iv.lower == pytest.approx(0.95 * 0.4)
    assert iv.upper == pytest.approx(0.6 + 0.05 * 0.4)
    assert iv.upper_loose == pytest.approx(0.65)


@settings(max_examples=150, deadline=None)
@given(
    family=st.sampled_from(["discrete-laplace", "laplace", "gaussian"]),
    n=st.integers(20, 3000),
    m=st.integers(1, 40),
    eps=st.floats(0.05, 20.0),
    beta=st.floats(0.001, 0.49),
    theta=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_exact_expected_emit_rate_is_inside_theorem_5_2(family, n, m, eps, beta, theta, seed
                                                        ) -> None:
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, n + 1, size=m)
    cfg = FilterConfig(epsilon=eps, beta=beta, theta=theta, noise=family, delta=1e-6)
    test, _ = calibrate(cfg, m, n)
    expected = exact_expected_emit_rate(counts, test, theta)
    iv = theorem_5_2_interval(counts / n, theta, test.tau, test.beta)
    assert iv.lower - 1e-9 <= expected <= iv.upper + 1e-9
    assert iv.upper <= iv.upper_loose + 1e-15
    # Theorem 5.1 per candidate
    for c in counts:
        if c / n < theta - 1e-12:
            assert test.emit_probability(int(c), theta) <= test.beta * (1 + 1e-9)


def test_simulated_emit_rate_matches_exact_expectation() -> None:
    n, m = 500, 40
    rng = np.random.default_rng(1)
    counts = rng.integers(0, 120, size=m)
    cfg = FilterConfig(epsilon=20.0, beta=0.05, theta=0.1, noise="laplace")
    runs = []
    for r in range(200):
        rep = certify_counts([f"s{j}" for j in range(m)], counts, n, cfg, RandomStreams(r))
        runs.append(rep.emitted_mask)
    emitted = np.array(runs)
    expected = exact_expected_emit_rate(counts, rep.test, cfg.theta)
    se = math.sqrt(expected * (1 - expected) / emitted.size)
    assert abs(emit_rate(emitted) - expected) < 4 * se + 1e-3
    assert unsupported_emit(emitted, counts / n, cfg.theta) <= cfg.beta + 0.02


def test_evaluate_report_and_true_supports() -> None:
    records = ["good food"] * 30 + ["bad food"] * 10 + ["nothing"] * 60
    statements = [Statement("good", "good"), Statement("bad", "bad"), Statement("food", "food")]
    pred = KeywordPredicate()
    f = true_supports(pred, statements, records)
    assert f.tolist() == [0.3, 0.1, 0.4]
    report = proposal_and_filter(statements, records, pred,
                                 FilterConfig(epsilon=30.0, theta=0.2), seed=4)
    metrics = evaluate_report(report, f)
    assert metrics["m"] == 3
    assert metrics["interval_lower"] <= metrics["expected_emit_rate"] <= metrics["interval_upper"]
    assert 0 <= metrics["emit_rate"] <= 1

"""Selection: what the report's bounds promise for the statements it *emits*.

The per-candidate bound L holds with probability ≥ 1 − β for a candidate fixed in advance.
Emission (L ≥ θ) selects the candidates whose noise was high, so for the emitted statements L
is no confidence bound: with many candidates just below θ every emitted L overstates its
support. The report therefore also carries a simultaneous bound (margin at level β/m, same
noise draw) that holds for all candidates at once and hence for whatever was emitted.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from scipy.stats import binom

from dplang.privacy.randomness import RandomStreams
from dplang.reports import FilterConfig, certify_counts, report_to_dict, report_to_markdown

N, M, REPS, THETA, BETA = 1000, 100, 300, 0.1, 0.05


def _adversarial_reports(noise: str = "discrete-laplace"):
    """300 reports of 100 candidates, each supported by ⌈θn⌉ − 1 records: all below θ."""
    count = math.ceil(Fraction(repr(THETA)) * N) - 1
    cfg = FilterConfig(epsilon=10.0, beta=BETA, theta=THETA, noise=noise)
    stmts = [f"statement {j}" for j in range(M)]
    reports = [certify_counts(stmts, [count] * M, N, cfg, RandomStreams(10_000 + r))
               for r in range(REPS)]
    return reports, count / N


@pytest.fixture(scope="module")
def adversarial():
    return _adversarial_reports()


@pytest.mark.slow
@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_simultaneous_bound_other_families(noise):
    reports, support = _adversarial_reports(noise)
    failures = sum(any(c.simultaneous_lower_bound > support for c in r.emitted)
                   for r in reports)
    assert failures <= binom.ppf(1 - 1e-4, REPS, BETA)


@pytest.mark.audits("proposal-and-filter")
def test_emitted_statements_selection_valid_bound(adversarial):
    reports, support = adversarial
    emitted = [c for r in reports for c in r.emitted]
    # the adversarial setting: over 800 statements emitted, every one of them below θ
    assert len(emitted) > 800
    # the per-candidate bound fails for *every* emitted statement: it is no confidence level
    # for what is shown (a report claiming "confidence 0.95 per statement" would be false)
    assert all(c.lower_bound > support for c in emitted)
    per_candidate_failures = sum(bool(r.emitted) for r in reports)
    assert per_candidate_failures > binom.ppf(1 - 1e-4, REPS, BETA)  # the check has teeth
    # the simultaneous bound holds for all emitted statements of a report with prob. ≥ 1 − β
    failures = sum(any(c.simultaneous_lower_bound > support for c in r.emitted)
                   for r in reports)
    assert failures <= binom.ppf(1 - 1e-4, REPS, BETA)
    # ... and exactly: Pr[some candidate's L_sim > f] = 1 − (1 − Pr[Z > τ_sim])^m ≤ β
    sim = reports[0].simultaneous_test
    assert sim is not None and sim.scale == reports[0].test.scale  # same noise, other margin
    p_one = sim.upper_tail(sim.tau_count + 1)  # integer noise: Z > τ_c ⇔ Z ≥ τ_c + 1
    assert 1 - (1 - p_one) ** M <= BETA
    test = reports[0].test
    assert 1 - (1 - test.upper_tail(test.tau_count + 1)) ** M > 0.9  # the per-candidate one


def test_report_text_states_the_guarantee_that_holds(adversarial):
    reports, _ = adversarial
    report = next(r for r in reports if r.emitted)
    md = report_to_markdown(report)
    assert "per statement" not in md
    assert "simultaneous lower bound" in md and "before selection" in md
    assert f"m·β = {M * BETA:.4g}" in md
    doc = report_to_dict(report)
    assert "whatever was selected" in doc["coverage"]
    assert doc["parameters"]["tau_simultaneous"] > doc["parameters"]["tau"]
    for c in doc["certificates"]:
        if c["decision"] == "emit":
            assert c["simultaneous_lower_bound"] < c["lower_bound"]
            assert c["simultaneous_beta"] == BETA


def test_bonferroni_bound_is_already_simultaneous():
    cfg = FilterConfig(epsilon=10.0, beta=BETA, theta=0.0, bonferroni=True)
    r = certify_counts(["a", "b", "c"], [10, 500, 900], N, cfg, RandomStreams(1))
    for c in r.emitted:
        assert c.simultaneous_lower_bound == c.lower_bound
    assert r.test.beta == pytest.approx(BETA / 3)


@pytest.mark.parametrize("family", ["discrete-laplace", "laplace", "gaussian"])
def test_at_level_keeps_the_noise_and_moves_the_margin(family):
    cfg = FilterConfig(epsilon=2.0, beta=BETA, theta=0.1, noise=family)
    r = certify_counts(["a"] * 1 + ["b"], [1, 2], 50, cfg, RandomStreams(0))
    test = r.test
    assert test.at_level(test.beta) == test
    tighter = test.at_level(test.beta / 10)
    assert tighter.scale == test.scale and tighter.epsilon == test.epsilon
    assert tighter.tau_count > test.tau_count
    assert tighter.beta_attained <= test.beta / 10 * (1 + 1e-12)

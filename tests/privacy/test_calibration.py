"""The one calibrator, and every calibrated value of dplang on the safe side of its target.

The first part checks :func:`calibrate` itself on monotone predicates with known boundaries:
the value returned is always one where the predicate was evaluated True, within the
tolerance of the boundary. The second part checks each calibration that uses it against its
own target, evaluated independently where an independent formula exists. Property tests run
derandomized (the same examples every run, no example database)."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dplang.privacy.accounting import epsilon_to_rho, rho_to_delta, rho_to_epsilon
from dplang.privacy.audit import gaussian_privacy_profile
from dplang.privacy.calibration import CalibrationError, calibrate
from dplang.reports.noise import (
    SupportTest,
    _dlap_upper_tail,
    analytic_gaussian_delta,
    analytic_gaussian_sigma,
)
from dplang.sampling.bounds import clipped_mean_min_n, min_n
from dplang.sampling.evaluation import minimal_n
from dplang.sampling.product import ClippedMeanSampler
from dplang.textgen.methods import amin

PROPERTY = settings(max_examples=60, deadline=None, derandomize=True, database=None)

thresholds = st.floats(min_value=1e-6, max_value=1e6, allow_nan=False)
starts = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False)


class Probe:
    """A monotone predicate that records where it was evaluated True."""

    def __init__(self, holds):
        self.holds, self.true_at = holds, set()

    def __call__(self, x):
        value = self.holds(x)
        if value:
            self.true_at.add(x)
        return value


# ------------------------------------------------------------------------------- calibrate


@pytest.mark.audits("accounting")
@PROPERTY
@given(t=thresholds, hi=starts, rtol=st.sampled_from([0.0, 1e-13, 1e-6, 1e-3]))
def test_above_returns_the_smallest_value_found_that_meets_the_target(t, hi, rtol):
    ok = Probe(lambda x: x >= t)
    r = calibrate(ok, 0.0, hi, safe="above", rtol=rtol)
    assert r >= t and r in ok.true_at
    assert r - t <= max(rtol * r, 4 * math.ulp(t))


@pytest.mark.audits("accounting")
@PROPERTY
@given(t=thresholds, hi=starts, rtol=st.sampled_from([0.0, 1e-13, 1e-6, 1e-3]))
def test_below_returns_the_largest_value_found_that_meets_the_target(t, hi, rtol):
    ok = Probe(lambda x: x <= t)
    r = calibrate(ok, 0.0, hi, safe="below", rtol=rtol)
    assert r <= t and (r in ok.true_at or r == 0.0)
    assert t - r <= max(rtol * 2 * t, 4 * math.ulp(t))


@pytest.mark.audits("accounting")
@PROPERTY
@given(t=st.integers(1, 10**9), lo=st.integers(1, 50), span=st.integers(1, 1000),
       log_scale=st.booleans(), slide=st.booleans())
def test_integer_search_finds_the_exact_boundary(t, lo, span, log_scale, slide):
    ok = Probe(lambda n: n >= t)
    r = calibrate(ok, lo, lo + span, safe="above", integer=True, log_scale=log_scale,
                  slide=slide)
    assert isinstance(r, int) and r == max(t, lo) and r in ok.true_at


@PROPERTY
@given(t=thresholds, lo=st.floats(min_value=1e-7, max_value=1e-6),
       rtol=st.sampled_from([1e-4, 1e-3, 1e-2]))
def test_log_scale_search_is_within_the_ratio(t, lo, rtol):
    ok = Probe(lambda x: x >= t)
    r = calibrate(ok, lo, 2 * lo, safe="above", rtol=rtol, log_scale=True)
    assert r >= t and r in ok.true_at and r / t <= (1 + rtol) * (1 + 1e-12)


def test_no_value_on_the_safe_side_is_an_error():
    with pytest.raises(CalibrationError):
        calibrate(lambda x: x >= 100, 0.0, 1.0, safe="above", limit=50.0)
    with pytest.raises(CalibrationError):  # the caller's "safe" end does not meet the target
        calibrate(lambda x: x < 0, 0.0, 4.0, safe="below")
    with pytest.raises(ValueError):
        calibrate(lambda x: True, 1.0, 1.0, safe="above")
    with pytest.raises(ValueError):
        calibrate(lambda x: True, 0.0, 1.0, safe="up")


def test_the_limit_itself_is_probed():
    assert calibrate(lambda x: x >= 9.5, 1.0, 2.0, safe="above", limit=10.0, rtol=1e-9) \
        == pytest.approx(9.5)
    assert min_n(lambda n: n >= 900, hi=2, limit=1000) == 900


# ---------------------------------------------------------- every calibrated value is safe

rhos = st.floats(min_value=1e-8, max_value=200.0, allow_nan=False)
epsilons = st.floats(min_value=1e-3, max_value=100.0, allow_nan=False)
deltas = st.floats(min_value=1e-14, max_value=0.4, allow_nan=False)


@pytest.mark.audits("accounting")
@PROPERTY
@given(rho=rhos, delta=deltas)
@example(rho=3.96e-4, delta=3.96e-4)
def test_rho_to_epsilon_is_above_the_exact_epsilon(rho, delta):
    eps = rho_to_epsilon(rho, delta)
    assert rho_to_delta(rho, eps) <= delta
    if eps > 1e-9:
        assert rho_to_delta(rho, eps * (1 - 1e-9)) > delta  # and tight


@pytest.mark.audits("accounting")
@PROPERTY
@given(eps=epsilons, delta=deltas)
def test_epsilon_to_rho_is_below_the_exact_rho(eps, delta):
    rho = epsilon_to_rho(eps, delta)
    assert rho_to_delta(rho, eps) <= delta
    assert rho_to_delta(rho * (1 + 1e-9), eps) > delta


@pytest.mark.audits("amin")
@PROPERTY
@given(eps=st.floats(min_value=0.05, max_value=100.0), delta=st.floats(1e-12, 1e-2),
       batch=st.integers(1, 64), tau=st.floats(0.3, 3.0), sigma=st.floats(0.01, 10.0),
       tokens=st.integers(1, 300))
def test_amin_clip_charges_at_most_the_budget(eps, delta, batch, tau, sigma, tokens):
    budget = amin.calibrate(eps, delta, batch, tau, sigma, tokens, "correct")
    per_token = epsilon_to_rho(eps, delta) / tokens
    assert sum(amin.step_costs(budget.clip, batch, tau, sigma, "correct")) <= per_token
    assert rho_to_delta(budget.rho, eps) <= delta  # the printed (ε, δ) holds for the charge
    assert sum(amin.step_costs(budget.clip * (1 + 1e-9), batch, tau, sigma, "correct")) \
        > per_token


@pytest.mark.audits("proposal-and-filter")
@PROPERTY
@given(eps=st.floats(min_value=1e-3, max_value=60.0), delta=st.floats(1e-12, 0.3),
       sensitivity=st.floats(1e-2, 1e2))
def test_analytic_gaussian_sigma_meets_delta(eps, delta, sensitivity):
    sigma = analytic_gaussian_sigma(eps, delta, sensitivity)
    assert analytic_gaussian_delta(sigma, eps, sensitivity) <= delta
    # an independent evaluation of the same profile (log space) agrees to rounding
    assert gaussian_privacy_profile(eps, sensitivity / sigma) <= delta * (1 + 1e-9)
    assert analytic_gaussian_delta(sigma * (1 - 1e-9), eps, sensitivity) > delta


@pytest.mark.audits("proposal-and-filter")
@PROPERTY
@given(eps=st.floats(min_value=1e-4, max_value=300.0), beta=st.floats(1e-12, 0.49))
def test_discrete_laplace_margin_is_the_smallest_safe_integer(eps, beta):
    test = SupportTest.calibrate("discrete-laplace", 10, beta, epsilon=eps)
    k = int(test.tau_count)
    assert _dlap_upper_tail(k, eps) <= beta
    assert k == 1 or _dlap_upper_tail(k - 1, eps) > beta
    assert test.at_level(beta).tau_count == test.tau_count


@pytest.mark.audits("clipped-mean")
@pytest.mark.parametrize("accountant", ["best", "basic", "zcdp"])
@pytest.mark.parametrize(("d", "eps", "delta"), [(1, 0.5, 1e-6), (2, 1.0, 1e-6),
                                                  (8, 0.3, 1e-5), (30, 2.0, 1e-3)])
def test_clipped_mean_min_n_is_private_enough_and_minimal(d, eps, delta, accountant):
    n = clipped_mean_min_n(d, eps, delta, accountant)
    sampler = ClippedMeanSampler(delta=delta, accountant=accountant)
    assert all(sampler.guarantee(m, d).epsilon <= eps for m in range(n, n + 12))
    assert n == 1 or sampler.guarantee(n - 1, d).epsilon > eps


@PROPERTY
@given(k=st.integers(2, 100), eps=st.floats(0.05, 5.0), alpha=st.floats(1e-3, 0.5),
       integer=st.booleans())
def test_minimal_n_meets_the_accuracy_target(k, eps, alpha, integer):
    def tv(n):
        return k / (eps * n)

    n = minimal_n(tv, alpha, 1.0, 1e12, integer=integer)
    assert tv(n) <= alpha and (not integer or n == int(n))
    # minimal to within the relative tolerance 1e-3 (or one, for integers)
    below = min(n / (1 + 1e-3), n - 1 if integer else math.inf) * (1 - 1e-12)
    assert n == 1.0 or tv(below) > alpha

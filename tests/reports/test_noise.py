"""The DP support test: margins, exact emission law, and exact per-candidate privacy loss."""

from __future__ import annotations

import dataclasses
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from dplang.privacy.audit import exact_audit
from dplang.privacy.mechanisms import discrete_laplace_pmf
from dplang.reports.noise import (
    SupportTest,
    analytic_gaussian_delta,
    analytic_gaussian_sigma,
    exact_decimal,
)

FAMILIES = ("discrete-laplace", "laplace", "gaussian")


def make(family: str, n: int = 1000, beta: float = 0.05, eps0: float = 0.1) -> SupportTest:
    delta = 1e-6 if family == "gaussian" else 0.0
    return SupportTest.calibrate(family, n, beta, epsilon=eps0, delta=delta)


def dlap_tail_from_pmf(k: int, test: SupportTest) -> float:
    """P(Z ≥ k) by summing the exact pmf (independent of the closed form in the module)."""
    width = int(60 / test.epsilon) + abs(k) + 10
    z = np.arange(k, width + 1)
    upper = float(np.sum(discrete_laplace_pmf(z, test.exact_scale)))
    return upper


def emission_from_cdf(test: SupportTest, count: float, theta: float) -> float:
    """Pr[C + Z − τ_c ≥ θn] computed directly from the noise law (pmf or CDF)."""
    t = theta * test.n + test.tau_count - count
    if test.family == "discrete-laplace":
        k = math.ceil(exact_decimal(theta) * test.n + int(test.tau_count) - Fraction(count))
        return dlap_tail_from_pmf(k, test)
    if test.family == "laplace":
        b = test.scale
        return 0.5 * math.exp(-t / b) if t >= 0 else 1 - 0.5 * math.exp(t / b)
    return float(norm.sf(t / test.scale))


# ------------------------------------------------------------------------------ margins


@pytest.mark.parametrize("family", ["laplace", "gaussian"])
@pytest.mark.parametrize("beta", [0.01, 0.05, 0.2, 0.49])
def test_continuous_emission_is_exactly_beta_at_theta_and_one_minus_beta_at_theta_plus_2tau(
    family: str, beta: float
) -> None:
    test = make(family, n=1000, beta=beta)
    theta = 0.1
    at_theta = emission_from_cdf(test, theta * test.n, theta)
    at_top = emission_from_cdf(test, (theta + 2 * test.tau) * test.n, theta)
    assert at_theta == pytest.approx(beta, rel=1e-12)
    assert at_top == pytest.approx(1 - beta, rel=1e-12)
    # the module's own exact law agrees with the CDF computation
    assert test.emit_probability(theta * test.n, theta) == pytest.approx(beta, rel=1e-12)
    assert test.beta_attained == pytest.approx(beta, rel=1e-12)


@pytest.mark.parametrize("eps0", [0.01, 0.1, 0.5, 1.0, 3.0])
@pytest.mark.parametrize("beta", [0.01, 0.05, 0.2])
def test_discrete_laplace_emission_at_theta_and_theta_plus_2tau(eps0: float, beta: float
                                                                ) -> None:
    """Integer noise attains β* = P(Z ≥ τ_c) ≤ β, the largest attainable level ≤ β; at
    f = θ the emission probability is exactly β*, at f = θ + 2τ it is 1 − P(Z ≥ τ_c + 1)."""
    test = make("discrete-laplace", n=1000, beta=beta, eps0=eps0)
    theta = 0.05  # θn = 50 exactly
    tau_c = int(test.tau_count)
    at_theta = emission_from_cdf(test, 50, theta)
    at_top = emission_from_cdf(test, 50 + 2 * tau_c, theta)
    assert at_theta == pytest.approx(test.beta_attained, rel=1e-9)
    assert at_theta <= beta * (1 + 1e-12)
    assert dlap_tail_from_pmf(tau_c - 1, test) > beta  # τ_c is the smallest valid margin
    assert at_top == pytest.approx(1 - dlap_tail_from_pmf(tau_c + 1, test), rel=1e-9)
    assert at_top >= 1 - beta
    assert test.emit_probability(50, theta) == pytest.approx(at_theta, rel=1e-9)
    assert test.emit_probability(50 + 2 * tau_c, theta) == pytest.approx(at_top, rel=1e-9)
    # spec §2.2 closed form
    q = math.exp(-eps0)
    assert tau_c == max(1, math.ceil(math.log(1 / (beta * (1 + q))) / eps0))


@pytest.mark.parametrize("family", FAMILIES)
def test_emission_probability_matches_cdf_and_is_monotone(family: str) -> None:
    test = make(family, n=500, eps0=0.2)
    theta = 0.1
    counts = np.arange(0, 140)
    probs = [test.emit_probability(int(c), theta) for c in counts]
    assert all(b >= a - 1e-15 for a, b in itertools.pairwise(probs))
    for c in (0, 30, 49, 50, 51, 60, 90):
        assert test.emit_probability(c, theta) == pytest.approx(
            emission_from_cdf(test, c, theta), rel=1e-9, abs=1e-15)
    # unsupported candidates (f < θ) are emitted with probability ≤ β (Theorem 5.1)
    assert max(p for c, p in zip(counts, probs, strict=True) if c < 50) <= test.beta + 1e-12


@settings(max_examples=200, deadline=None)
@given(
    family=st.sampled_from(FAMILIES),
    n=st.integers(1, 100_000),
    beta=st.floats(1e-6, 0.499),
    eps0=st.floats(1e-3, 20.0),
)
def test_margin_properties(family: str, n: int, beta: float, eps0: float) -> None:
    test = make(family, n=n, beta=beta, eps0=eps0)
    assert test.tau > 0 and test.tau_count > 0
    assert test.tau == pytest.approx(test.tau_count / n)
    # upper and lower tails at τ are ≤ β (needed by Thms 5.1 and 5.2)
    assert test.upper_tail(test.tau_count) <= beta * (1 + 1e-9)
    assert test.lower_tail(test.tau_count) <= beta * (1 + 1e-9)
    if family == "discrete-laplace":
        assert test.tau_count == int(test.tau_count)
        if test.tau_count > 1:
            assert test.upper_tail(test.tau_count - 1) > beta
    elif family == "laplace":
        assert test.tau_count == pytest.approx(math.log(1 / (2 * beta)) / eps0, rel=1e-12)
    # smaller β ⇒ larger margin
    smaller = make(family, n=n, beta=beta / 2, eps0=eps0)
    assert smaller.tau_count >= test.tau_count


@settings(max_examples=150, deadline=None)
@given(
    family=st.sampled_from(FAMILIES),
    n=st.integers(10, 5000),
    theta=st.floats(0.0, 1.0),
    frac=st.floats(0.0, 1.0),
)
def test_decision_threshold_maths(family: str, n: int, theta: float, frac: float) -> None:
    """emits(C, Z) ⇔ L = (C + Z − τ_c)/n ≥ θ, and L is a (1−β) lower bound on f."""
    test = make(family, n=n, eps0=0.3)
    count = round(frac * n)
    rng = np.random.default_rng(count)
    for _ in range(5):
        z = test.sample(rng)
        bound = test.lower_bound(count, z)
        emit = test.emits(count, z, theta)
        if abs(bound - theta) > 1e-9:
            assert emit == (bound >= theta)
        assert bound == pytest.approx((count + z - test.tau_count) / n, abs=1e-12)
    # Pr[f ≥ L] = Pr[Z ≤ τ_c] ≥ 1 − β
    assert 1 - test.upper_tail(test.tau_count + (1 if test.is_discrete else 0)) >= 1 - test.beta


def test_theta_is_read_as_a_decimal() -> None:
    test = make("discrete-laplace", n=1000, eps0=1.0)
    # θn = 50 exactly: C = 50 + τ_c with Z = 0 is emitted (L = θ), C one less is not
    tau_c = int(test.tau_count)
    assert test.emits(50 + tau_c, 0, 0.05)
    assert not test.emits(49 + tau_c, 0, 0.05)


def test_calibration_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        SupportTest.calibrate("laplace", 10, 0.5, epsilon=1.0)
    with pytest.raises(ValueError):
        SupportTest.calibrate("laplace", 10, 0.0, epsilon=1.0)
    with pytest.raises(ValueError):
        SupportTest.calibrate("laplace", 0, 0.1, epsilon=1.0)
    with pytest.raises(ValueError):
        SupportTest.calibrate("laplace", 10, 0.1, epsilon=0.0)
    with pytest.raises(ValueError):
        SupportTest.calibrate("gaussian", 10, 0.1, epsilon=1.0, delta=0.0)
    with pytest.raises(ValueError):
        SupportTest.calibrate("cauchy", 10, 0.1, epsilon=1.0)


# ------------------------------------------------------------------------------ privacy


def _noisy_count_law(scale: Fraction, count: int, support: np.ndarray) -> np.ndarray:
    """Exact law of C + Z on ``support`` for discrete Laplace noise of the given scale."""
    p = np.asarray(discrete_laplace_pmf(support - count, scale), dtype=np.float64)
    return p / p.sum()


@pytest.mark.audits("proposal-and-filter")
@pytest.mark.parametrize("eps0", [0.05, 0.3, 1.0, 2.5])
def test_per_candidate_test_is_eps0_dp_exactly(eps0: float) -> None:
    """The released noisy count C + Z (everything a certificate is computed from) has exact
    privacy loss ε₀ between neighbouring counts C and C + 1; a test whose noise scale is
    wrong by a factor 2 is caught by the same check."""
    test = make("discrete-laplace", n=200, eps0=eps0)
    width = int(40 / eps0) + 5
    support = np.arange(-width, 200 + width + 1)
    pairs = [(_noisy_count_law(test.exact_scale, c, support),
              _noisy_count_law(test.exact_scale, c + 1, support)) for c in (0, 37, 150, 199)]
    audit = exact_audit(pairs, alphas=(2.0,))
    assert audit.satisfies_pure(eps0, tol=1e-9)
    assert audit.max_log_ratio == pytest.approx(eps0, rel=1e-6)

    broken = dataclasses.replace(test, scale=test.scale / 2)
    broken_scale = 1 / (2 * Fraction(eps0))
    assert broken.scale == pytest.approx(float(broken_scale))
    bad_pairs = [(_noisy_count_law(broken_scale, c, support),
                  _noisy_count_law(broken_scale, c + 1, support)) for c in (0, 37)]
    assert not exact_audit(bad_pairs, alphas=(2.0,)).satisfies_pure(eps0, tol=1e-9)


@pytest.mark.audits("proposal-and-filter")
@pytest.mark.parametrize("eps0", [0.1, 1.0])
def test_emit_decision_privacy_loss_is_at_most_eps0(eps0: float) -> None:
    """The emit/abstain decision alone: log-ratio of emission probabilities ≤ ε₀."""
    test = make("discrete-laplace", n=300, eps0=eps0)
    theta = 0.2
    for c in range(0, 300):
        p, q = test.emit_probability(c, theta), test.emit_probability(c + 1, theta)
        pa, qa = test.abstain_probability(c, theta), test.abstain_probability(c + 1, theta)
        assert p + pa == pytest.approx(1.0, abs=1e-12)
        assert abs(math.log(p) - math.log(q)) <= eps0 * (1 + 1e-9)
        assert abs(math.log(pa) - math.log(qa)) <= eps0 * (1 + 1e-9)


def test_sampler_follows_the_calibrated_law() -> None:
    """The draws of SupportTest.sample match the exact pmf of scale 1/ε₀ (and not 1/(2ε₀))."""
    test = make("discrete-laplace", n=100, eps0=0.5)
    rng = np.random.default_rng(7)
    draws = np.array([test.sample(rng) for _ in range(20_000)])
    values, freq = np.unique(draws, return_counts=True)
    emp = freq / freq.sum()
    good = np.asarray(discrete_laplace_pmf(values, test.exact_scale))
    bad = np.asarray(discrete_laplace_pmf(values, test.exact_scale / 2))
    assert 0.5 * np.abs(emp - good).sum() < 0.02
    assert 0.5 * np.abs(emp - bad).sum() > 0.1


@pytest.mark.parametrize("family", ["laplace", "gaussian"])
def test_continuous_draws_follow_the_calibrated_law(family: str) -> None:
    """The release path's draws (SupportTest.sample, one per candidate) follow the law the
    guarantee was calibrated for: a Kolmogorov-Smirnov test against the exact tail, which a
    scale of half (twice the privacy loss) fails by far."""
    from scipy.stats import kstest

    test = make(family, n=100, eps0=0.5)
    rng = np.random.default_rng(7)
    draws = np.array([test.sample(rng) for _ in range(20_000)])

    def cdf(x: np.ndarray) -> np.ndarray:
        return np.array([1.0 - test.upper_tail(float(v)) for v in np.atleast_1d(x)])

    assert kstest(draws, cdf).pvalue > 1e-3
    assert kstest(draws / 2, cdf).pvalue < 1e-12  # the same draws at half the scale


def test_analytic_gaussian_calibration() -> None:
    for eps, delta in ((0.1, 1e-6), (1.0, 1e-5), (5.0, 1e-9)):
        sigma = analytic_gaussian_sigma(eps, delta)
        assert analytic_gaussian_delta(sigma, eps) <= delta
        assert analytic_gaussian_delta(sigma * (1 - 1e-6), eps) > delta * (1 - 1e-3)
        # never worse than the classical bound σ = sqrt(2 ln(1.25/δ))/ε (valid for ε < 1)
        if eps < 1:
            assert sigma <= math.sqrt(2 * math.log(1.25 / delta)) / eps


def test_analytic_gaussian_agrees_with_dp_accounting() -> None:
    pld = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")
    sigma = analytic_gaussian_sigma(1.0, 1e-5)
    dist = pld.from_gaussian_mechanism(sigma, sensitivity=1.0, value_discretization_interval=1e-4)
    assert dist.get_delta_for_epsilon(1.0) == pytest.approx(1e-5, rel=0.05)


@pytest.mark.parametrize("family", FAMILIES)
def test_vectorised_decisions_agree_with_scalar_ones(family: str) -> None:
    test = make(family, n=400, eps0=0.4)
    rng = np.random.default_rng(3)
    counts = rng.integers(0, 400, size=300)
    noise = test.sample_array(rng, 300)
    for theta in (0.0, 0.05, 0.1234, 0.5):
        vec = test.emits_array(counts, noise, theta)
        assert vec.tolist() == [test.emits(int(c), z.item(), theta)
                                for c, z in zip(counts, noise, strict=True)]

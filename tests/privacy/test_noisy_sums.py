"""The vector noise steps of :mod:`dplang.privacy.mechanisms` that the samplers call:
``laplace_noisy_sum``, ``gaussian_noisy_sum`` (release paths) and ``two_sided_geometric``
(evaluation only). Each check is paired with a mis-calibrated variant it must reject."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dplang.privacy import mechanisms as m
from dplang.privacy.audit import gaussian_privacy_profile, monte_carlo_epsilon_lower_bound

P_THRESHOLD = 1e-3


def test_noisy_sums_are_the_primitive_draws() -> None:
    """Same draws, in the same order, as the scalar primitives with ``size=value.shape``."""
    v = np.arange(12, dtype=np.float64).reshape(3, 4)
    np.testing.assert_array_equal(m.laplace_noisy_sum(v, 0.7, np.random.default_rng(1)),
                                  v + m.laplace(0.7, np.random.default_rng(1), size=(3, 4)))
    np.testing.assert_array_equal(m.gaussian_noisy_sum(v, 1.3, np.random.default_rng(2)),
                                  v + m.gaussian(1.3, np.random.default_rng(2), size=(3, 4)))
    # the calibrated mechanisms are these with b = Δ/ε and σ = Δ/√(2ρ)
    np.testing.assert_array_equal(m.laplace_mechanism(v, 2.0, 0.5, np.random.default_rng(3)),
                                  m.laplace_noisy_sum(v, 4.0, np.random.default_rng(3)))
    np.testing.assert_array_equal(m.gaussian_mechanism(v, 1.0, 0.5, np.random.default_rng(4)),
                                  m.gaussian_noisy_sum(v, 1.0, np.random.default_rng(4)))


def test_noisy_sum_laws_and_misscaled_variants() -> None:
    v = np.linspace(-3, 3, 20_000)
    lap = m.laplace_noisy_sum(v, 1.7, np.random.default_rng(5)) - v
    assert stats.kstest(lap, stats.laplace(scale=1.7).cdf).pvalue > P_THRESHOLD
    assert stats.kstest(lap, stats.laplace(scale=1.7 * 1.25).cdf).pvalue < P_THRESHOLD
    gau = m.gaussian_noisy_sum(v, 2.3, np.random.default_rng(6)) - v
    assert stats.kstest(gau, stats.norm(scale=2.3).cdf).pvalue > P_THRESHOLD
    assert stats.kstest(gau, stats.norm(scale=2.3 * 1.25).cdf).pvalue < P_THRESHOLD


def test_noisy_sums_validate() -> None:
    rng = np.random.default_rng(0)
    for f in (m.laplace_noisy_sum, m.gaussian_noisy_sum):
        with pytest.raises(ValueError, match="finite"):
            f(np.array([1.0, np.nan]), 1.0, rng)
        for bad in (0.0, -1.0, math.inf):
            with pytest.raises(ValueError):
                f(np.zeros(3), bad, rng)
        with pytest.raises(TypeError):
            f(np.zeros(3), 1.0, 7)  # type: ignore[arg-type]


def _laplace_loss(y: np.ndarray, x: np.ndarray, x2: np.ndarray, b: float) -> np.ndarray:
    """ln p(y | x) − ln p(y | x') of the product Laplace law, for each row of ``y``."""
    return (np.abs(y - x2) - np.abs(y - x)).sum(axis=-1) / b


@pytest.mark.audits("noise-primitives")
@settings(derandomize=True, max_examples=60, deadline=None)
@given(d=st.integers(1, 6), b=st.floats(0.2, 5.0), delta=st.floats(0.1, 4.0),
       seed=st.integers(0, 2**32 - 1))
def test_laplace_noisy_sum_loss_is_at_most_l1_over_b(d: int, b: float, delta: float,
                                                      seed: int) -> None:
    """Neighbouring queries at ℓ1 distance Δ: the privacy loss of every released vector is at
    most Δ/b, and Δ/b is attained (far from both); a scale of b/2 exceeds it."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=d)
    w = rng.random(d) + 0.1
    x2 = x + delta * w / w.sum() * rng.choice([-1.0, 1.0], size=d)  # ‖x − x2‖₁ = Δ
    y = np.stack([m.laplace_noisy_sum(x, b, rng) for _ in range(200)])
    assert np.all(_laplace_loss(y, x, x2, b) <= delta / b + 1e-9)
    far = x - 100.0 * np.sign(x2 - x)
    assert _laplace_loss(far, x, x2, b) == pytest.approx(delta / b, rel=1e-9)
    assert _laplace_loss(far, x, x2, b / 2) > delta / b + 1e-6


@pytest.mark.audits("noise-primitives")
def test_gaussian_noisy_sum_audit() -> None:
    """Monte Carlo audit at the exact (ε, δ) profile of σ = Δ: no violation; the same audit
    catches a sum of sensitivity 2Δ noised for Δ."""
    rng = np.random.default_rng(11)
    eps = 1.0
    delta = gaussian_privacy_profile(eps, 1.0)
    zero, one, two = np.zeros(3), np.array([1.0, 0, 0]), np.array([2.0, 0, 0])

    def audit(shift: np.ndarray, threshold: float) -> float:
        return monte_carlo_epsilon_lower_bound(
            lambda r: m.gaussian_noisy_sum(zero, 1.0, r), lambda r: m.gaussian_noisy_sum(
                shift, 1.0, r), lambda y: y[0] > threshold, 20_000, rng, delta=delta,
        ).epsilon_lower_bound

    assert audit(one, 1.0) <= eps
    assert audit(two, 1.5) > eps


def test_two_sided_geometric_is_the_discrete_laplace_law() -> None:
    scale = 2 / 1.3
    z = m.two_sided_geometric(scale, np.random.default_rng(7), size=40_000)
    assert z.dtype == np.int64
    assert isinstance(m.two_sided_geometric(scale, np.random.default_rng(7)), int)

    def p_value(law_scale: float) -> float:
        ks = np.arange(-8, 9)
        expected = np.asarray(m.discrete_laplace_pmf(ks, law_scale)) * z.size
        observed = np.array([np.sum(z == k) for k in ks], dtype=np.float64)
        tails = z.size - observed.sum(), z.size - expected.sum()
        obs = np.append(observed, tails[0])
        exp = np.append(expected, tails[1])
        return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)

    assert p_value(scale) > P_THRESHOLD
    assert p_value(scale * 1.25) < P_THRESHOLD

"""Tests of dplang.privacy.mechanisms: output laws, exact privacy loss, determinism, validation.

Every goodness-of-fit check is paired with a deliberately mis-scaled variant that the same
check must reject, so that a passing test means something.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dplang.privacy import mechanisms as m

N = 20_000
P_THRESHOLD = 1e-3


# ---------------------------------------------------------------------------------------------
# Goodness-of-fit helper
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IntegerLaw:
    """A law on ℤ given by its pmf; |z| > half_width has negligible mass."""

    pmf: Callable[[np.ndarray], np.ndarray]
    half_width: int


def _p_value_integer(samples: np.ndarray, law: IntegerLaw) -> float:
    """Chi-square over integer bins with expected count ≥ 5, tails pooled into two bins."""
    x = np.asarray(samples, dtype=np.int64)
    n = x.size
    z = np.arange(-law.half_width, law.half_width + 1)
    p = np.asarray(law.pmf(z), dtype=np.float64)
    inner = z[n * p >= 5]
    lo, hi = int(inner.min()), int(inner.max())
    assert np.all(n * p[(z >= lo) & (z <= hi)] >= 5), "law must be unimodal for this binning"
    obs = [int(np.sum(x < lo))]
    exp = [n * float(p[z < lo].sum())]
    for k in range(lo, hi + 1):
        obs.append(int(np.sum(x == k)))
        exp.append(n * float(p[z == k][0]))
    obs.append(int(np.sum(x > hi)))
    exp.append(n * float(p[z > hi].sum()))
    # Pool a small tail bin into its neighbour.
    if exp[0] < 5:
        o, e = obs.pop(0), exp.pop(0)
        obs[0] += o
        exp[0] += e
    if exp[-1] < 5:
        o, e = obs.pop(), exp.pop()
        obs[-1] += o
        exp[-1] += e
    obs_a = np.asarray(obs, dtype=np.float64)
    exp_a = np.asarray(exp, dtype=np.float64)
    exp_a *= n / exp_a.sum()
    return float(stats.chisquare(obs_a, exp_a).pvalue)


def _p_value_categorical(samples: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square of categorical draws against probabilities; any draw in a zero-probability
    category is an outright rejection."""
    x = np.asarray(samples, dtype=np.int64)
    counts = np.bincount(x, minlength=probs.size).astype(np.float64)
    if counts.size > probs.size or np.any(counts[probs == 0] > 0):
        return 0.0
    keep = probs > 0
    exp = x.size * probs[keep]
    assert np.all(exp >= 5), "choose a law with expected counts >= 5"
    return float(stats.chisquare(counts[keep], exp * (x.size / exp.sum())).pvalue)


def _p_value(samples: np.ndarray, law: object) -> float:
    if isinstance(law, IntegerLaw):
        return _p_value_integer(samples, law)
    if isinstance(law, np.ndarray):
        return _p_value_categorical(samples, law)
    # A frozen scipy continuous distribution: Kolmogorov–Smirnov.
    return float(stats.kstest(np.asarray(samples, dtype=np.float64), law.cdf).pvalue)


def _fits(samples: np.ndarray, law: object) -> bool:
    return _p_value(samples, law) > P_THRESHOLD


def _dlap_law(scale: float | Fraction) -> IntegerLaw:
    return IntegerLaw(lambda z: m.discrete_laplace_pmf(z, scale), int(60 * float(scale)) + 60)


def _dgauss_law(sigma: float | Fraction) -> IntegerLaw:
    return IntegerLaw(lambda z: m.discrete_gaussian_pmf(z, sigma), int(20 * float(sigma)) + 20)


# ---------------------------------------------------------------------------------------------
# Continuous Laplace and Gaussian
# ---------------------------------------------------------------------------------------------


@pytest.mark.audits("noise-primitives")
def test_laplace_matches_law_and_rejects_misscaled() -> None:
    b = 1.7
    law = stats.laplace(scale=b)
    good = m.laplace(b, np.random.default_rng(1), size=N)
    bad = m.laplace(1.25 * b, np.random.default_rng(2), size=N)
    assert isinstance(good, np.ndarray) and good.shape == (N,)
    assert _fits(good, law)
    assert not _fits(bad, law)


@pytest.mark.audits("noise-primitives")
def test_gaussian_matches_law_and_rejects_misscaled() -> None:
    sigma = 2.3
    law = stats.norm(scale=sigma)
    good = m.gaussian(sigma, np.random.default_rng(3), size=N)
    bad = m.gaussian(1.25 * sigma, np.random.default_rng(4), size=N)
    assert _fits(good, law)
    assert not _fits(bad, law)


def test_scalar_continuous_draws_are_floats() -> None:
    rng = np.random.default_rng(5)
    assert isinstance(m.laplace(1.0, rng), float)
    assert isinstance(m.gaussian(1.0, rng), float)
    assert m.laplace(1.0, rng, size=(3, 2)).shape == (3, 2)


def test_laplace_mechanism_calibration() -> None:
    value, delta, eps = 5.0, 2.0, 0.8
    rng = np.random.default_rng(6)
    out = m.laplace_mechanism(np.full(N, value), delta, eps, rng)
    assert _fits(out, stats.laplace(loc=value, scale=delta / eps))
    # The same test rejects a mechanism that forgot the sensitivity (scale 1/ε).
    assert not _fits(out, stats.laplace(loc=value, scale=1.0 / eps))
    assert isinstance(m.laplace_mechanism(1.0, 1.0, 1.0, rng), float)


def test_gaussian_mechanism_calibration() -> None:
    value, delta, rho = -3.0, 1.5, 0.4
    rng = np.random.default_rng(7)
    out = m.gaussian_mechanism(np.full(N, value), delta, rho, rng)
    sigma = delta / math.sqrt(2 * rho)
    assert _fits(out, stats.norm(loc=value, scale=sigma))
    assert not _fits(out, stats.norm(loc=value, scale=sigma / 1.25))
    assert isinstance(m.gaussian_mechanism(1.0, 1.0, 1.0, rng), float)


# ---------------------------------------------------------------------------------------------
# Exact discrete samplers
# ---------------------------------------------------------------------------------------------


@pytest.mark.audits("noise-primitives")
@pytest.mark.parametrize("scale", [0.6, 3.0, 1 / 0.3, Fraction(7, 3)])
def test_discrete_laplace_matches_law_and_rejects_misscaled(scale: float | Fraction) -> None:
    law = _dlap_law(scale)
    good = m.discrete_laplace(scale, np.random.default_rng(11), size=N)
    bad = m.discrete_laplace(1.25 * scale, np.random.default_rng(12), size=N)
    assert good.dtype == np.int64 and good.shape == (N,)
    assert _fits(good, law)
    assert not _fits(bad, law)


@pytest.mark.audits("noise-primitives")
@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.5, 10 / 3])
def test_discrete_gaussian_matches_law_and_rejects_misscaled(sigma: float) -> None:
    law = _dgauss_law(sigma)
    good = m.discrete_gaussian(sigma, np.random.default_rng(21), size=N)
    bad = m.discrete_gaussian(1.25 * sigma, np.random.default_rng(22), size=N)
    assert good.dtype == np.int64
    assert _fits(good, law)
    assert not _fits(bad, law)


def test_discrete_gaussian_is_not_a_discrete_laplace() -> None:
    """The chi-square check distinguishes the two laws at equal variance (shape, not scale)."""
    sigma = 2.0
    good = m.discrete_gaussian(sigma, np.random.default_rng(23), size=N)
    # Discrete Laplace with variance ≈ σ²: 2q/(1−q)² = σ².
    q = (sigma**2 + 1 - math.sqrt(2 * sigma**2 + 1)) / sigma**2
    lap = m.discrete_laplace(-1 / math.log(q), np.random.default_rng(24), size=N)
    assert np.var(lap) == pytest.approx(sigma**2, rel=0.1)
    assert _fits(good, _dgauss_law(sigma))
    assert not _fits(lap, _dgauss_law(sigma))


def test_scalar_discrete_draws_are_ints() -> None:
    rng = np.random.default_rng(25)
    assert type(m.discrete_laplace(2.0, rng)) is int
    assert type(m.discrete_gaussian(2.0, rng)) is int
    assert m.discrete_gaussian(1.0, rng, size=(4, 5)).shape == (4, 5)
    assert m.discrete_laplace(1.0, rng, size=0).shape == (0,)


def test_discrete_laplace_tiny_scale_is_nearly_zero() -> None:
    # Scale 0.05: P(z ≠ 0) = 2e^{-20}/(1+e^{-20}) ≈ 4e-9.
    out = m.discrete_laplace(0.05, np.random.default_rng(26), size=2000)
    assert np.all(out == 0)


def test_discrete_moments() -> None:
    b = 2.0
    x = m.discrete_laplace(b, np.random.default_rng(31), size=N)
    q = math.exp(-1 / b)
    var_exact = 2 * q / (1 - q) ** 2
    se_var = math.sqrt(float(np.mean(x.astype(float) ** 4)) / N)
    assert abs(float(np.mean(x))) < 5 * math.sqrt(var_exact / N)
    assert abs(float(np.var(x)) - var_exact) < 5 * se_var

    for sigma in [0.3, 0.5, 1.0, 2.0, 7.5]:
        z = np.arange(-int(20 * sigma) - 20, int(20 * sigma) + 21)
        p = m.discrete_gaussian_pmf(z, sigma)
        assert float(p.sum()) == pytest.approx(1.0, abs=1e-12)
        var_exact = float(np.sum(z.astype(float) ** 2 * p))
        assert var_exact <= sigma**2 + 1e-12  # CKS 2020, Prop. 19: Var ≤ σ²
        y = m.discrete_gaussian(sigma, np.random.default_rng(32), size=N).astype(float)
        assert abs(float(np.mean(y))) < 5 * math.sqrt(var_exact / N) + 1e-9
        se_var = math.sqrt(float(np.mean(y**4)) / N)
        assert abs(float(np.var(y)) - var_exact) < 5 * se_var + 1e-9
    # At σ = 0.5 the gap to σ² is large enough to see in the sample.
    y = m.discrete_gaussian(0.5, np.random.default_rng(33), size=N)
    assert float(np.var(y)) <= 0.25


def test_pmfs_are_normalised() -> None:
    z = np.arange(-2000, 2001)
    for b in [0.3, 1.0, 12.5]:
        assert float(m.discrete_laplace_pmf(z, b).sum()) == pytest.approx(1.0, abs=1e-12)
    assert m.discrete_laplace_pmf(0, 1.0) == pytest.approx(math.tanh(0.5))
    assert m.discrete_gaussian_pmf(0, 1.0) == pytest.approx(
        1 / sum(math.exp(-k * k / 2) for k in range(-40, 41))
    )
    assert isinstance(m.discrete_gaussian_logpmf(3, 2.0), float)


def test_discrete_laplace_mechanism_calibration() -> None:
    value, delta, eps = 40, 3, 1.2
    rng = np.random.default_rng(41)
    out = m.discrete_laplace_mechanism(np.full(N, value, dtype=np.int64), delta, eps, rng)
    assert out.dtype == np.int64
    scale = Fraction(delta) / Fraction(eps)
    assert _fits(out - value, _dlap_law(scale))
    assert not _fits(out - value, _dlap_law(1 / eps))  # sensitivity forgotten
    assert type(m.discrete_laplace_mechanism(7, 1, 1.0, rng)) is int


def test_discrete_gaussian_mechanism_calibration() -> None:
    value, delta, rho = -12, 2.0, 0.5
    rng = np.random.default_rng(42)
    out = m.discrete_gaussian_mechanism(np.full(N, value, dtype=np.int64), delta, rho, rng)
    sigma = delta / math.sqrt(2 * rho)
    assert _fits(out - value, _dgauss_law(sigma))
    assert not _fits(out - value, _dgauss_law(sigma / 1.25))
    assert type(m.discrete_gaussian_mechanism(3, 1, 0.5, rng)) is int
    # Exact rational parameters are accepted too.
    x = m.discrete_gaussian_mechanism(np.zeros(3, dtype=np.int32), Fraction(1), Fraction(1, 2), rng)
    assert x.shape == (3,)


# ---------------------------------------------------------------------------------------------
# Exponential mechanism
# ---------------------------------------------------------------------------------------------

SCORES = np.array([0.0, 1.0, 2.0, 3.0, 2.5, -1.0, 0.5])
MASK = np.array([True, False, True, True, False, True, True])


def _draws(sampler: Callable[..., int], tau: float, mask: np.ndarray | None, seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [sampler(SCORES, tau, rng, mask) for _ in range(N)]


@pytest.mark.audits("noise-primitives")
@pytest.mark.parametrize("sampler", [m.exponential_mechanism, m.gumbel_max])
@pytest.mark.parametrize("mask", [None, MASK], ids=["nomask", "mask"])
def test_exponential_mechanism_matches_law_and_rejects_misscaled(
    sampler: Callable[..., int], mask: np.ndarray | None
) -> None:
    tau = 1.3
    law = m.exponential_mechanism_probabilities(SCORES, tau, mask)
    good = np.asarray(_draws(sampler, tau, mask, seed=51))
    bad = np.asarray(_draws(sampler, 2 * tau, mask, seed=52))
    if mask is not None:
        assert np.all(MASK[good]), "a draw fell outside the mask"
        assert np.all(MASK[bad])
    assert _fits(good, law)
    assert not _fits(bad, law)


def test_mask_violation_is_rejected_by_fit() -> None:
    law = m.exponential_mechanism_probabilities(SCORES, 1.0, MASK)
    unmasked = np.asarray(_draws(m.exponential_mechanism, 1.0, None, seed=53))
    assert not _fits(unmasked, law)


def test_exponential_mechanism_probabilities_exact() -> None:
    p = m.exponential_mechanism_probabilities(SCORES, 0.7, MASK)
    assert p.dtype == np.float64
    assert np.all(p[~MASK] == 0)
    w = np.exp(SCORES[MASK] / 0.7)
    np.testing.assert_allclose(p[MASK], w / w.sum(), rtol=1e-14)
    # Stable for huge scores; -inf and nan allowed outside the mask.
    big = np.array([1e6, 1e6 - 1.0, -np.inf, np.nan])
    mask = np.array([True, True, False, False])
    q = m.exponential_mechanism_probabilities(big, 1.0, mask)
    np.testing.assert_allclose(q, [1 / (1 + math.e**-1), math.e**-1 / (1 + math.e**-1), 0, 0])
    rng = np.random.default_rng(54)
    assert m.exponential_mechanism(big, 1.0, rng, mask) in (0, 1)
    assert m.gumbel_max(big, 1.0, rng, mask) in (0, 1)
    # A single candidate is returned with certainty.
    only = np.zeros(4, dtype=bool)
    only[2] = True
    assert m.exponential_mechanism(SCORES[:4], 1.0, rng, only) == 2
    assert m.gumbel_max(SCORES[:4], 1.0, rng, only) == 2


@pytest.mark.audits("noise-primitives")
@settings(derandomize=True, max_examples=300, deadline=None)
@given(
    data=st.data(),
    n=st.integers(min_value=1, max_value=12),
    tau=st.floats(min_value=0.5, max_value=10.0),
    delta=st.floats(min_value=1e-3, max_value=5.0),
)
def test_exponential_mechanism_privacy_loss_bounded(
    data: st.DataObject, n: int, tau: float, delta: float
) -> None:
    """For ‖u − u'‖∞ ≤ Δ: max_y |log p(y) − log p'(y)| ≤ 2Δ/τ (pure (2Δ/τ)-DP)."""
    score = st.floats(min_value=-50.0, max_value=50.0)
    u = np.array(data.draw(st.lists(score, min_size=n, max_size=n)))
    shift = st.floats(min_value=-1.0, max_value=1.0)
    d = delta * np.array(data.draw(st.lists(shift, min_size=n, max_size=n)))
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    if not mask.any():
        mask[0] = True
    p = m.exponential_mechanism_probabilities(u, tau, mask)[mask]
    q = m.exponential_mechanism_probabilities(u + d, tau, mask)[mask]
    loss = float(np.max(np.abs(np.log(p) - np.log(q))))
    assert loss <= 2 * delta / tau + 1e-9


@pytest.mark.audits("noise-primitives")
def test_exponential_mechanism_privacy_loss_check_can_fail() -> None:
    """The worst-case neighbour nearly attains 2Δ/τ, so a mechanism run at τ/2 (claimed τ)
    visibly exceeds the bound that the property test checks."""
    n, tau, delta = 200, 1.0, 0.5
    u = np.zeros(n)
    d = -delta * np.ones(n)
    d[0] = delta
    p = m.exponential_mechanism_probabilities(u, tau)
    q = m.exponential_mechanism_probabilities(u + d, tau)
    loss = float(np.max(np.abs(np.log(p) - np.log(q))))
    assert 0.95 * 2 * delta / tau < loss <= 2 * delta / tau + 1e-12
    q_bad = m.exponential_mechanism_probabilities(u + d, tau / 2)
    p_bad = m.exponential_mechanism_probabilities(u, tau / 2)
    assert float(np.max(np.abs(np.log(p_bad) - np.log(q_bad)))) > 2 * delta / tau + 0.1


# ---------------------------------------------------------------------------------------------
# Exact privacy loss of the discrete Laplace
# ---------------------------------------------------------------------------------------------


def _dlap_max_loss(scale: float | Fraction, sensitivity: int) -> float:
    z = np.arange(-200, 201)
    lp = m.discrete_laplace_logpmf(z, scale)
    lq = m.discrete_laplace_logpmf(z - sensitivity, scale)
    return float(np.max(np.abs(lp - lq)))


@pytest.mark.audits("noise-primitives")
@settings(derandomize=True, max_examples=100, deadline=None)
@given(
    eps=st.floats(min_value=0.05, max_value=5.0),
    sensitivity=st.integers(min_value=1, max_value=10),
)
def test_discrete_laplace_privacy_loss_is_exactly_epsilon(eps: float, sensitivity: int) -> None:
    scale = sensitivity / eps
    loss = _dlap_max_loss(scale, sensitivity)
    assert loss <= eps + 1e-12
    assert loss == pytest.approx(eps, rel=1e-9)
    # Mis-scaled variant (scale Δ/(2ε)) exceeds ε: the check can fail.
    assert _dlap_max_loss(sensitivity / (2 * eps), sensitivity) > eps + 1e-6


# ---------------------------------------------------------------------------------------------
# Determinism
# ---------------------------------------------------------------------------------------------

SAMPLERS: list[tuple[str, Callable[[np.random.Generator], object]]] = [
    ("laplace", lambda r: m.laplace(1.0, r, size=50)),
    ("gaussian", lambda r: m.gaussian(1.0, r, size=50)),
    ("discrete_laplace", lambda r: m.discrete_laplace(1 / 0.3, r, size=50)),
    ("discrete_gaussian", lambda r: m.discrete_gaussian(2.5, r, size=50)),
    ("exponential", lambda r: [m.exponential_mechanism(SCORES, 1.0, r) for _ in range(50)]),
    ("gumbel", lambda r: [m.gumbel_max(SCORES, 1.0, r, MASK) for _ in range(50)]),
    ("laplace_mech", lambda r: m.laplace_mechanism(np.zeros(50), 1.0, 1.0, r)),
    ("gaussian_mech", lambda r: m.gaussian_mechanism(np.zeros(50), 1.0, 1.0, r)),
    (
        "dlap_mech",
        lambda r: m.discrete_laplace_mechanism(np.zeros(50, dtype=np.int64), 1, 0.5, r),
    ),
    (
        "dgauss_mech",
        lambda r: m.discrete_gaussian_mechanism(np.zeros(50, dtype=np.int64), 1, 0.1, r),
    ),
]


@pytest.mark.parametrize("draw", [s[1] for s in SAMPLERS], ids=[s[0] for s in SAMPLERS])
def test_same_seed_same_draws(draw: Callable[[np.random.Generator], object]) -> None:
    a = np.asarray(draw(np.random.default_rng(123)))
    b = np.asarray(draw(np.random.default_rng(123)))
    c = np.asarray(draw(np.random.default_rng(124)))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_no_global_randomness() -> None:
    """Seeding or consuming numpy's and Python's global generators changes nothing."""
    import random

    np.random.seed(0)
    random.seed(0)
    a = m.discrete_gaussian(3.0, np.random.default_rng(9), size=20)
    np.random.seed(1)
    random.seed(1)
    np.random.random(10)
    b = m.discrete_gaussian(3.0, np.random.default_rng(9), size=20)
    np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------------------------------
# Input validation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tau", [0.0, -1.0, math.nan, math.inf])
def test_exponential_rejects_bad_temperature(tau: float) -> None:
    rng = np.random.default_rng(0)
    for f in (m.exponential_mechanism, m.gumbel_max):
        with pytest.raises(ValueError):
            f(SCORES, tau, rng)
    with pytest.raises(ValueError):
        m.exponential_mechanism_probabilities(SCORES, tau)


def test_exponential_rejects_bad_scores_and_masks() -> None:
    rng = np.random.default_rng(0)
    for f in (m.exponential_mechanism, m.gumbel_max):
        with pytest.raises(ValueError, match="empty"):
            f(SCORES, 1.0, rng, np.zeros(SCORES.size, dtype=bool))
        with pytest.raises(ValueError, match="finite"):
            f(np.array([0.0, np.nan, 1.0]), 1.0, rng)
        with pytest.raises(ValueError, match="finite"):
            f(np.array([0.0, np.inf, 1.0]), 1.0, rng, np.array([False, True, True]))
        with pytest.raises(ValueError):
            f(SCORES, 1.0, rng, MASK[:3])
        with pytest.raises(ValueError):
            f(SCORES, 1.0, rng, MASK.astype(int))
        with pytest.raises(ValueError):
            f(np.zeros((2, 2)), 1.0, rng)
        with pytest.raises(ValueError, match="empty"):
            f(np.array([]), 1.0, rng)
        with pytest.raises(TypeError):
            f(SCORES, 1.0, 123)


@pytest.mark.parametrize("bad", [0.0, -2.0, math.nan, math.inf])
def test_samplers_reject_bad_scale(bad: float) -> None:
    rng = np.random.default_rng(0)
    for f in (m.laplace, m.gaussian, m.discrete_laplace, m.discrete_gaussian):
        with pytest.raises(ValueError):
            f(bad, rng)


def test_discrete_samplers_reject_bad_fraction() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError):
        m.discrete_laplace(Fraction(0), rng)
    with pytest.raises(ValueError):
        m.discrete_gaussian(Fraction(-1, 2), rng)


@pytest.mark.parametrize(
    ("sens", "budget"),
    [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0), (1.0, -0.5), (math.nan, 1.0), (1.0, math.inf)],
)
def test_continuous_mechanisms_reject_bad_parameters(sens: float, budget: float) -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError):
        m.laplace_mechanism(1.0, sens, budget, rng)
    with pytest.raises(ValueError):
        m.gaussian_mechanism(1.0, sens, budget, rng)


def test_mechanisms_reject_bad_values() -> None:
    rng = np.random.default_rng(0)
    for v in (math.nan, math.inf, np.array([1.0, np.nan])):
        with pytest.raises(ValueError):
            m.laplace_mechanism(v, 1.0, 1.0, rng)
        with pytest.raises(ValueError):
            m.gaussian_mechanism(v, 1.0, 1.0, rng)
    for v in (1.5, np.array([1.0, 2.0]), True, math.nan):
        with pytest.raises(ValueError):
            m.discrete_laplace_mechanism(v, 1, 1.0, rng)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            m.discrete_gaussian_mechanism(v, 1, 1.0, rng)  # type: ignore[arg-type]


def test_discrete_mechanisms_reject_bad_parameters() -> None:
    rng = np.random.default_rng(0)
    for sens in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            m.discrete_laplace_mechanism(3, sens, 1.0, rng)  # type: ignore[arg-type]
    for eps in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            m.discrete_laplace_mechanism(3, 1, eps, rng)
    for sens, rho in (
        (0.0, 1.0),
        (-1.0, 1.0),
        (1.0, 0.0),
        (1.0, -1.0),
        (math.nan, 1.0),
        (1.0, math.inf),
    ):
        with pytest.raises(ValueError):
            m.discrete_gaussian_mechanism(3, sens, rho, rng)


# ---------------------------------------------------------------------------------------------
# Exact random primitives (internal, but everything above rests on them)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("num", "den"),
    [(1, 3), (5, 2), (7 * 2**70 + 1, 3 * 2**70), (0, 1), (1, 1)],
)
def test_exact_bernoulli_exp_frequency(num: int, den: int) -> None:
    bits = m._Bits(np.random.default_rng(61))
    p = math.exp(-num / den)
    hits = sum(bits.bernoulli_exp(num, den) for _ in range(N))
    assert stats.binomtest(hits, N, p).pvalue > P_THRESHOLD
    if 0 < p < 1:  # the same test rejects a Bernoulli of a 10% larger γ
        assert stats.binomtest(hits, N, math.exp(-1.1 * num / den)).pvalue < P_THRESHOLD


def test_exact_uniform_below_large_bound() -> None:
    bits = m._Bits(np.random.default_rng(62))
    n = 3 * 2**100 + 7
    draws = [bits.below(n) for _ in range(N)]
    assert all(0 <= d < n for d in draws)
    # Top third of the range should receive about a third of the draws.
    top = sum(d >= 2 * n // 3 for d in draws)
    assert stats.binomtest(top, N, 1 / 3).pvalue > P_THRESHOLD
    assert {bits.below(3) for _ in range(200)} == {0, 1, 2}
    assert bits.below(1) == 0

"""Product samplers on {0,1}^d (spec 004 §3 A2, A3, baselines; §6.4)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dplang.privacy.accounting import epsilon_to_rho, rho_to_epsilon
from dplang.sampling import (
    BucketedProductSampler,
    ClippedMeanSampler,
    GaussianMarginalSampler,
    PerCoordinateLaplaceSampler,
)
from dplang.sampling import distributions as dist
from dplang.sampling.bounds import bb_upper_n, clipped_mean_min_n
from dplang.sampling.evaluation import (
    _poisson_binomial_tail,
    bucketed_product_tv,
    product_tv,
    tv_distance,
)
from dplang.sampling.product import clipped_gaussian_mean, clipped_laplace_mean

unit = st.floats(0.0, 1.0, allow_nan=False)


@pytest.mark.parametrize("n", [4, 8, 12, 40, 100, 400, 4000])
def test_clipped_mean_epsilon_is_ln_1_plus_4_over_n_when_4_divides_n(n):
    s = ClippedMeanSampler()
    assert s.epsilon_per_coordinate(n) == pytest.approx(math.log1p(4 / n), rel=1e-12)
    assert s.epsilon_per_coordinate(n) <= 4 / n


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 5000))
def test_clipped_mean_epsilon_never_exceeds_ln_1_plus_4_over_n(n):
    e = ClippedMeanSampler().epsilon_per_coordinate(n)
    if n % 4 == 0:
        assert e == pytest.approx(math.log1p(4 / n), rel=1e-12)
    else:
        assert e < math.log1p(4 / n)


def test_clipped_mean_spec_numbers():
    s = ClippedMeanSampler()
    assert s.epsilon_per_coordinate(5) == pytest.approx(0.470, abs=5e-4)
    assert s.epsilon_per_coordinate(100) == pytest.approx(0.03922, abs=5e-6)
    # exact worst-case bias over p ∈ [1/3, 2/3] (spec §3 A2 table)
    for n, ref in [(10, 2.7e-2), (50, 3.1e-3), (100, 6.3e-4), (200, 5.3e-5), (400, 8.0e-7)]:
        assert s.worst_case_bias(n) == pytest.approx(ref, rel=0.06)
        assert s.worst_case_bias(n) <= 0.5 * math.exp(-n / 72)


def test_clipped_mean_guarantee_accountants():
    s = ClippedMeanSampler(delta=1e-6)
    n, d = 400, 100
    g = s.guarantee(n, d)
    eps = g.details["epsilon_by_accountant"]
    assert g.epsilon == pytest.approx(min(eps.values()))
    e1 = s.epsilon_per_coordinate(n)
    assert eps["basic"] == pytest.approx(d * e1)
    rho = d * s.rho_per_coordinate(n)
    assert rho <= d * e1 * e1 / 2
    assert eps["zcdp"] == pytest.approx(rho_to_epsilon(rho, 1e-6))
    assert g.rho == pytest.approx(rho) and g.delta == 1e-6
    one = ClippedMeanSampler().guarantee(n, 1)
    assert one.delta == 0 and one.epsilon == pytest.approx(e1)


@pytest.mark.audits("clipped-mean")
@pytest.mark.parametrize("d", [2, 10, 100, 1000])
def test_bb_upper_n_is_private_enough(d):
    """Claim 12: at n = max(8√(2d ln(1/δ))/ε, 72 ln(d/(2α))) the sampler is (ε, δ)-DP."""
    eps, delta, alpha = 1.0, 1e-6, 0.1
    n = bb_upper_n(d, alpha, eps, delta)
    for acc in ("advanced", "zcdp"):
        g = ClippedMeanSampler(delta=delta, accountant=acc).guarantee(n, d)
        assert g.epsilon <= eps
    # the exact search needs fewer records than the closed form
    assert clipped_mean_min_n(d, eps, delta) <= n
    assert ClippedMeanSampler(delta=delta).guarantee(clipped_mean_min_n(d, eps, delta),
                                                     d).epsilon <= eps


def test_clipped_mean_law_is_the_exact_product():
    p = np.array([0.4, 0.6])
    s = ClippedMeanSampler()
    n = 12
    q = s.exact_marginals(n, p)
    rng = np.random.default_rng(0)
    reps = 40_000
    draws = np.vstack([s.sample((rng.random((n, 2)) < p).astype(np.uint8), rng).samples
                       for _ in range(reps)])
    # the 4 outcome frequencies match the product of the exact marginals
    codes = draws[:, 0] * 2 + draws[:, 1]
    freq = np.bincount(codes, minlength=4) / reps
    law = np.array([(1 - q[0]) * (1 - q[1]), (1 - q[0]) * q[1], q[0] * (1 - q[1]), q[0] * q[1]])
    assert np.all(np.abs(freq - law) <= 4.5 * np.sqrt(law * (1 - law) / reps))


def test_clipped_mean_tv_decreases_in_n_on_bounded_biases():
    s = ClippedMeanSampler()
    p = np.array([1 / 3, 0.4, 0.5, 2 / 3])
    tvs = [product_tv(s.exact_marginals(n, p), p).exact for n in (10, 20, 40, 80, 160)]
    assert all(a > b for a, b in itertools.pairwise(tvs))
    assert tvs[-1] <= s.tv_bound(160, 4)


def test_clipped_mean_is_inaccurate_near_zero():
    """Claim 14: on a bias near 0 the bias is ≥ 1/4 − p."""
    s = ClippedMeanSampler()
    q = s.exact_marginals(1000, np.array([0.02]))
    assert q[0] - 0.02 >= 0.25 - 0.02 - 1e-12


@settings(max_examples=40, deadline=None)
@given(unit, st.floats(0.01, 2.0))
def test_clipped_noise_closed_forms(m, scale):
    rng = np.random.default_rng(int(m * 1e6) + int(scale * 1e3))
    reps = 100_000
    z = rng.laplace(0, scale, reps)
    mc = np.clip(m + z, 0, 1)
    assert abs(mc.mean() - clipped_laplace_mean(m, scale)) <= 5 * mc.std() / math.sqrt(reps) + 1e-9
    g = rng.normal(0, scale, reps)
    mc = np.clip(m + g, 0, 1)
    assert abs(mc.mean() - clipped_gaussian_mean(m, scale)) <= 5 * mc.std() / math.sqrt(reps) + 1e-9


@settings(max_examples=40, deadline=None)
@given(st.lists(unit, min_size=1, max_size=10), st.lists(unit, min_size=1, max_size=10))
def test_product_tv_brackets(q, p):
    m = min(len(q), len(p))
    res = product_tv(np.array(q[:m]), np.array(p[:m]))
    assert res.lower - 1e-12 <= res.exact <= res.upper + 1e-12


def test_poisson_binomial_tail():
    rng = np.random.default_rng(1)
    p = rng.uniform(0, 0.5, 8)
    for t in range(0, 9):
        brute = 0.0
        for bits in range(256):
            b = np.array([(bits >> j) & 1 for j in range(8)])
            if b.sum() > t:
                brute += np.prod(np.where(b == 1, p, 1 - p))
        assert _poisson_binomial_tail(p, t) == pytest.approx(brute, abs=1e-12)


def test_marginal_baselines():
    n, d = 200, 4
    p = np.array([0.0, 0.1, 0.5, 1.0])
    lap = PerCoordinateLaplaceSampler(1.0)
    g = lap.guarantee(n, d)
    assert g.epsilon == 1.0 and g.delta == 0
    assert lap.noise_scale(n, d) == pytest.approx(d / n)
    assert product_tv(lap.exact_marginals(n, p), p).upper <= lap.tv_bound(n, d)
    gauss = GaussianMarginalSampler(1.0, 1e-5)
    assert gauss.rho == pytest.approx(epsilon_to_rho(1.0, 1e-5))
    assert gauss.sigma(n, d) == pytest.approx(math.sqrt(d) / (n * math.sqrt(2 * gauss.rho)))
    assert product_tv(gauss.exact_marginals(n, p), p).upper <= gauss.tv_bound(n, d)
    rng = np.random.default_rng(2)
    x = (rng.random((n, d)) < p).astype(np.uint8)
    for s in (lap, gauss):
        samples, _guarantee = s.sample(x, rng)
        assert samples.shape == (1, d) and set(np.unique(samples)) <= {0, 1}


class TestBucketedProduct:
    def test_output_and_guarantee(self):
        s = BucketedProductSampler(1.0, 1e-6, alpha=0.1)
        rng = np.random.default_rng(0)
        x = (rng.random((400, 7)) < 0.3).astype(np.uint8)
        samples, g = s.sample(x, rng)
        assert samples.shape == (1, 7) and set(np.unique(samples)) <= {0, 1}
        assert g.rho == pytest.approx(epsilon_to_rho(1.0, 1e-6))
        assert g.epsilon == 1.0 and g.delta == 1e-6
        assert g.details["c_T"] == 3.0 and g.details["split"] == [0.25, 0.25, 0.5]

    def test_blocks_are_a_positional_partition(self):
        s = BucketedProductSampler(1.0, 1e-6)
        (a, b), (c, d), (e, f) = s.blocks(101)
        assert (a, b, d, f) == (0, 25, 50, 101) and b == c and d == e
        with pytest.raises(ValueError):
            BucketedProductSampler(1.0, 1e-6, split=(0.5, 0.5, 0.0))

    def test_plan_partitions_coordinates_and_budget_adds_up(self):
        s = BucketedProductSampler(1.0, 1e-6)
        rng = np.random.default_rng(3)
        p = np.r_[np.full(5, 0.9), np.full(5, 0.3), np.full(5, 0.05), np.zeros(5)]
        n, d = 4000, p.size
        x = (rng.random((n, d)) < p).astype(np.uint8)
        plan = s.plan(x, rng)
        cols = np.sort(np.concatenate([c for c, _ in plan.buckets]))
        assert np.array_equal(cols, np.arange(d))
        assert plan.flips[:5].all() and not plan.flips[5:].any()
        # phase 2: B Gaussian releases whose zCDP costs Δ_b²/(2σ_b²) add up to ρ
        params = s.phase2_parameters(plan, n, d)
        spent = 0.0
        for (c, _u), (t_b, sigma) in zip(plan.buckets, params, strict=True):
            sens2 = min(2 * t_b, c.size)
            spent += sens2 / (2 * sigma * sigma)
        assert spent == pytest.approx(s.rho, rel=1e-12)

    def test_orientation_is_undone(self):
        s = BucketedProductSampler(2.0, 1e-6)
        rng = np.random.default_rng(4)
        x = np.ones((2000, 5), dtype=np.uint8)
        laws = np.mean([s.output_law(x, rng) for _ in range(20)], axis=0)
        assert np.all(laws > 0.95)

    def test_accuracy_on_the_subset_instance(self):
        s = BucketedProductSampler(1.0, 1e-6)
        p = dist.subset_product(4)
        rng = np.random.default_rng(5)
        small = bucketed_product_tv(s, p, 2000, 20, rng)
        large = bucketed_product_tv(s, p, 16000, 20, rng)
        assert large["upper"] < small["upper"] < 0.1
        assert large["lower"] <= large["upper"]
        # TV upper bound is consistent with a direct Monte Carlo of the marginals
        qs = np.mean([s.output_law((rng.random((16000, 8)) < p).astype(np.uint8), rng)
                      for _ in range(30)], axis=0)
        assert np.max(np.abs(qs - p)) < 0.02

    def test_invalid(self):
        with pytest.raises(ValueError):
            BucketedProductSampler(0.0, 1e-6)
        with pytest.raises(ValueError):
            BucketedProductSampler(1.0, 1.0)
        with pytest.raises(ValueError):
            BucketedProductSampler(1.0, 1e-6).sample(np.array([[0, 2]]), np.random.default_rng())


def test_product_tv_exact_for_identical_products():
    p = np.full(5, 0.4)
    assert product_tv(p, p).exact == pytest.approx(0.0, abs=1e-15)
    assert tv_distance([0.5, 0.5], [0.2, 0.8]) == pytest.approx(0.3)


def test_sparse_rows_give_the_same_result():
    from dplang.sampling import SparseBinaryRows

    rng = np.random.default_rng(11)
    p = np.r_[np.full(4, 0.8), np.full(6, 0.05), np.zeros(3)]
    x = (rng.random((3000, p.size)) < p).astype(np.uint8)
    sp = SparseBinaryRows.from_dense(x)
    assert np.array_equal(sp.to_dense(), x)
    s = BucketedProductSampler(1.0, 1e-6, c_T=0.5)
    a = s.output_law(x, np.random.default_rng(5))
    b = s.output_law(sp, np.random.default_rng(5))
    assert np.array_equal(a, b)
    plan_a, plan_b = s.plan(x, np.random.default_rng(6)), s.plan(sp, np.random.default_rng(6))
    assert np.array_equal(plan_a.flips, plan_b.flips) and plan_a.flips[:4].all()
    for (ca, ua), (cb, ub) in zip(plan_a.buckets, plan_b.buckets, strict=True):
        assert np.array_equal(ca, cb) and ua == ub
    # truncation is exercised: tiny thresholds zero most rows, identically in both storages
    from dplang.sampling.product import _Rows

    flips = np.zeros(p.size, dtype=bool)
    flips[:2] = True
    cols = np.arange(p.size)
    for t in (0, 1, 2, 5):
        assert np.array_equal(_Rows(x).truncated_sums(10, 900, cols, flips, t),
                              _Rows(sp).truncated_sums(10, 900, cols, flips, t))


def test_sparse_random_rows_follow_the_product_law():
    from dplang.sampling import SparseBinaryRows

    p = np.array([0.0, 0.01, 0.2, 0.5])
    sp = SparseBinaryRows.random(p, 20000, np.random.default_rng(12))
    means = sp.to_dense().mean(axis=0)
    assert np.all(np.abs(means - p) <= 5 * np.sqrt(p * (1 - p) / 20000) + 1e-12)


@pytest.mark.parametrize("sampler", [PerCoordinateLaplaceSampler(1.0),
                                     GaussianMarginalSampler(1.0, 1e-6)],
                         ids=["laplace-marginals", "gaussian-marginals"])
def test_the_release_draws_follow_the_calibrated_noise(sampler) -> None:
    """output_law (what a release draws) adds noise of the scale the guarantee states: a
    Kolmogorov-Smirnov test of the noisy means against the exact law, which the same draws at
    half the scale (twice the privacy loss) fail by far. Means of 1/2 and a scale far below
    1/2: clipping never happens, the noisy mean is p̂ + Z."""
    from scipy.stats import kstest, laplace, norm

    x = np.tile([[1, 0], [0, 1]], (500, 1))  # n = 1000, d = 2, p̂ = (1/2, 1/2)
    n, d = x.shape
    if isinstance(sampler, PerCoordinateLaplaceSampler):
        law = laplace(scale=sampler.noise_scale(n, d)).cdf
    else:
        law = norm(scale=sampler.sigma(n, d)).cdf
    rng = np.random.default_rng(3)
    noise = np.array([sampler.output_law(x, rng) for _ in range(10_000)]).ravel() - 0.5
    assert kstest(noise, law).pvalue > 1e-3
    assert kstest(noise / 2, law).pvalue < 1e-12

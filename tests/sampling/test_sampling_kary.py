"""k-ary samplers: projection, exact laws, accuracy (spec 004 §3 A1, A1'; §6.4)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.optimize import linprog

from dplang.sampling import (
    DiscreteLaplaceHistogramSampler,
    LaplaceHistogramSampler,
    LearnThenSampleSampler,
    RevealOrObscureSampler,
    project_euclidean,
    project_l1,
)
from dplang.sampling import distributions as dist
from dplang.sampling.evaluation import (
    compositions,
    estimate_output_law,
    exact_output_law,
    tv_distance,
)

finite = st.floats(-5, 5, allow_nan=False, allow_infinity=False)


def _l1_projection_lp(v: np.ndarray) -> float:
    """min_{p ∈ Δ} ‖p − v‖₁ by linear programming (variables p, t with t ≥ |p − v|)."""
    k = v.shape[0]
    c = np.r_[np.zeros(k), np.ones(k)]
    eye = np.eye(k)
    a_ub = np.block([[eye, -eye], [-eye, -eye]])
    b_ub = np.r_[v, -v]
    a_eq = np.r_[np.ones(k), np.zeros(k)][None, :]
    res = linprog(c, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=[1.0],
                  bounds=[(0, None)] * k + [(None, None)] * k, method="highs")
    return float(res.fun)


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, st.integers(1, 7), elements=finite))
def test_l1_projection_is_exact(v):
    p = project_l1(v)
    assert np.all(p >= 0) and p.sum() == pytest.approx(1.0)
    formula = np.maximum(-v, 0).sum() + abs(1 - np.maximum(v, 0).sum())
    assert np.abs(p - v).sum() == pytest.approx(formula, abs=1e-9)
    # HiGHS solves to a feasibility tolerance of ~1e-7 (it returned −9.9e-8 for a true
    # optimum of +9.9e-8 on v = [1, 4.9e-8, 4.9e-8]), so the LP is compared at 1e-6
    assert np.abs(p - v).sum() == pytest.approx(_l1_projection_lp(v), abs=1e-6)


@settings(max_examples=40, deadline=None)
@given(arrays(np.float64, st.integers(1, 7), elements=finite), st.integers(0, 2**32 - 1))
def test_euclidean_projection_is_closest_point(v, seed):
    p = project_euclidean(v)
    assert np.all(p >= 0) and p.sum() == pytest.approx(1.0)
    others = np.random.default_rng(seed).dirichlet(np.ones(v.shape[0]), size=50)
    assert np.sum((p - v) ** 2) <= np.min(np.sum((others - v) ** 2, axis=1)) + 1e-9


@pytest.mark.parametrize("counts,eps", [([5, 0, 2, 0, 3], 1.0), ([30, 1, 0, 0], 4.0),
                                         ([0, 0, 0], 1.0), ([2, 1], 0.3)])
def test_laplace_exact_law_matches_monte_carlo(counts, eps):
    s = LaplaceHistogramSampler(len(counts), eps)
    law = s.exact_law_given_counts(np.array(counts))
    assert law.sum() == pytest.approx(1.0, abs=1e-12)
    rng = np.random.default_rng(1)
    reps = 200_000
    laws = s.batch_law_given_counts(np.tile(counts, (reps, 1)), rng)
    se = laws.std(axis=0) / math.sqrt(reps)
    assert np.all(np.abs(laws.mean(axis=0) - law) <= 4.5 * se + 1e-12)


def test_discrete_laplace_exact_law_matches_monte_carlo():
    counts = np.array([3, 0, 1])
    s = DiscreteLaplaceHistogramSampler(3, 1.0)
    law = s.exact_law_given_counts(counts)
    rng = np.random.default_rng(2)
    reps = 200_000
    laws = s.batch_law_given_counts(np.tile(counts, (reps, 1)), rng)
    se = laws.std(axis=0) / math.sqrt(reps)
    assert np.all(np.abs(laws.mean(axis=0) - law) <= 4.5 * se)


def test_discrete_sampler_release_path_follows_exact_law():
    """sample() (exact CKS noise, exact integer draw) has the exact law given the data."""
    x = np.array([0, 0, 1])
    s = DiscreteLaplaceHistogramSampler(2, 2.0)
    law = s.conditional_law(x)
    rng = np.random.default_rng(3)
    reps = 4000
    ones = sum(int(s.sample(x, rng).samples[0]) for _ in range(reps))
    se = math.sqrt(law[1] * law[0] / reps)
    assert abs(ones / reps - law[1]) <= 4.5 * se


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=2, max_size=5), st.floats(0.2, 3.0),
       st.randoms(use_true_random=False))
def test_histogram_law_is_symmetric(counts, eps, rnd):
    """Frequency-count based: permuting the counts permutes the law."""
    s = LaplaceHistogramSampler(len(counts), eps)
    perm = list(range(len(counts)))
    rnd.shuffle(perm)
    c = np.array(counts)
    assert np.allclose(s.exact_law_given_counts(c)[perm], s.exact_law_given_counts(c[perm]),
                       atol=1e-10)


def test_uniform_p_gives_exact_output():
    """Claim 4: on uniform P, Q = P exactly (symmetry), whatever n and ε."""
    for k, n, eps in [(3, 4, 1.0), (4, 3, 0.5)]:
        q = exact_output_law(LaplaceHistogramSampler(k, eps), dist.uniform(k), n)
        assert np.allclose(q, dist.uniform(k), atol=1e-10)


@pytest.mark.parametrize("seed", range(6))
def test_laplace_histogram_exact_tv_below_k_over_eps_n(seed):
    """Claim 3: d_TV(Q, P) ≤ k/(εn) for every P. Q is computed exactly: the multinomial count
    vectors are enumerated and, for each, the noise is integrated by the one-dimensional
    formula of dplang.sampling._histlaw (Pr[z|c] = ∫ψ_z Π_{j≠z} φ_j dt + Pr[s=0]/k)."""
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 5))
    p = dist.random_distribution(k, rng, concentration=0.5)
    for n in (2, 5, 9):
        for eps in (0.5, 1.0, 3.0):
            s = LaplaceHistogramSampler(k, eps)
            tv = tv_distance(exact_output_law(s, p, n), p)
            assert tv <= s.tv_bound(n) + 1e-9
            # and the bound is not vacuous here only when < 1; TV is always <= 1
            assert tv <= 1.0


def test_discrete_laplace_exact_tv_below_its_bound():
    rng = np.random.default_rng(7)
    for _ in range(3):
        p = dist.random_distribution(3, rng, concentration=0.5)
        s = DiscreteLaplaceHistogramSampler(3, 1.0)
        tv = tv_distance(exact_output_law(s, p, 4), p)
        assert tv <= s.tv_bound(4) <= 3 / (1.0 * 4)


def test_point_mass_tv_is_close_to_the_bound():
    """The bound k/(εn) is nearly attained by a point mass (TV ≈ (k−1)/(εn) for large n)."""
    s = LaplaceHistogramSampler(3, 1.0)
    n = 60
    tv = tv_distance(exact_output_law(s, dist.point_mass(3), n), dist.point_mass(3))
    assert 0.75 * (3 - 1) / n < tv <= 3 / n


@pytest.mark.parametrize("k,n,eps", [(3, 5, 1.0), (4, 3, 0.4), (2, 8, 2.0)])
def test_reveal_or_obscure_exact_tv_is_q_times_tv_uniform(k, n, eps):
    """Claim 5: the exact law, by enumerating datasets, is (1−q)P + qU, so TV = q·TV(U, P)."""
    rng = np.random.default_rng(k * 100 + n)
    p = dist.random_distribution(k, rng)
    s = RevealOrObscureSampler(k, eps)
    q_enum = np.zeros(k)
    for c in compositions(n, k):
        w = math.factorial(n) * np.prod([p[j] ** c[j] / math.factorial(c[j]) for j in range(k)])
        q_enum += w * s.exact_law_given_counts(c)
    q = s.mixing_probability(n)
    assert q == pytest.approx(k / (k + n * math.expm1(eps)))
    assert tv_distance(q_enum, p) == pytest.approx(q * tv_distance(dist.uniform(k), p), abs=1e-12)
    assert tv_distance(q_enum, p) <= k / (n * eps) + 1e-12
    assert np.allclose(exact_output_law(s, p, n), q_enum, atol=1e-12)


def test_reveal_or_obscure_sampling_matches_its_law():
    s = RevealOrObscureSampler(3, 1.0)
    x = np.array([0, 0, 0, 1])
    law = s.conditional_law(x)
    rng = np.random.default_rng(4)
    draws = np.array([s.sample(x, rng).samples[0] for _ in range(20000)])
    freq = np.bincount(draws, minlength=3) / draws.size
    assert np.all(np.abs(freq - law) <= 4.5 * np.sqrt(law * (1 - law) / draws.size))


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 6), st.integers(1, 30), st.floats(0.05, 5.0), st.integers(0, 10**6))
def test_samplers_release_a_valid_record_and_guarantee(k, n, eps, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, k, size=n)
    for s in (LaplaceHistogramSampler(k, eps), RevealOrObscureSampler(k, eps),
              LearnThenSampleSampler(k, eps, "euclidean"),
              LearnThenSampleSampler(k, eps, "threshold")):
        samples, g = s.sample(x, rng)
        assert samples.shape == (1,) and 0 <= samples[0] < k
        assert g.epsilon == pytest.approx(eps) and g.delta == 0 and g.adjacency == "replace-one"
        assert g.unit == "record" and g.ex_ante
        law = s.output_law(x, rng)
        assert law.shape == (k,) and np.all(law >= 0) and law.sum() == pytest.approx(1.0)


def test_monte_carlo_interval_contains_exact_tv():
    p = dist.spiky(6)
    s = LaplaceHistogramSampler(6, 1.0)
    n = 6
    exact = tv_distance(exact_output_law(s, p, n), p)
    est = estimate_output_law(s, p, n, 100_000, np.random.default_rng(5))
    from dplang.sampling.evaluation import tv_with_interval

    ci = tv_with_interval(est, p)
    assert ci.lower <= exact <= ci.upper
    assert ci.noise_floor < 0.1 * exact


def test_invalid_parameters_are_refused():
    with pytest.raises(ValueError):
        LaplaceHistogramSampler(3, 0.0)
    with pytest.raises(ValueError):
        LaplaceHistogramSampler(1, 1.0)
    with pytest.raises(ValueError):
        RevealOrObscureSampler(3, -1.0)
    s = LaplaceHistogramSampler(3, 1.0)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError):
        s.sample(np.array([0, 3]), rng)
    with pytest.raises(ValueError):
        s.sample(np.array([], dtype=int), rng)
    with pytest.raises(ValueError):
        LearnThenSampleSampler(3, 1.0, "nearest")

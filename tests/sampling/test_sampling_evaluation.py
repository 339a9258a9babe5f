"""Evaluation helpers, Poisson-exact laws, lower-bound instance, bounds, repeated sampling."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dplang.privacy.randomness import RandomStreams
from dplang.sampling import (
    FirstRecordSampler,
    LaplaceHistogramSampler,
    RandomRecordSampler,
    RevealOrObscureSampler,
    block_slices,
    bounds,
    sample_repeated,
)
from dplang.sampling import distributions as dist
from dplang.sampling.evaluation import (
    claim24_probability,
    estimate_output_law,
    exact_output_law,
    exact_output_law_poisson,
    exact_tv,
    learning_error_quantile,
    minimal_n,
    support_miss_probability,
    tv_distance,
)


def test_poisson_exact_law_matches_monte_carlo():
    p = dist.spiky(8)
    s = LaplaceHistogramSampler(8, 0.7)
    n = 30.0
    q = exact_output_law_poisson(s, p, n)
    assert q.sum() == pytest.approx(1.0)
    est = estimate_output_law(s, p, n, 200_000, np.random.default_rng(0), poisson_size=True)
    assert np.all(np.abs(est.mean - q) <= 4.5 * est.se + 1e-12)


def test_poisson_roo_and_records():
    p = dist.half_support(5)
    roo = RevealOrObscureSampler(5, 1.0)
    q = exact_output_law_poisson(roo, p, 10.0)
    est = estimate_output_law(roo, p, 10.0, 100_000, np.random.default_rng(1),
                              poisson_size=True)
    assert np.all(np.abs(est.mean - q) <= 4.5 * est.se + 1e-12)
    assert np.allclose(exact_output_law_poisson(RandomRecordSampler(5), p, 10.0),
                       (1 - math.exp(-10)) * p + math.exp(-10) / 5)
    assert np.allclose(exact_output_law(FirstRecordSampler(5), p, 3), p)


def test_lemma21_instance_witness():
    """Lemma 2.1 (α ≤ 1/60, ε ≤ 1/ln(1/α), Poisson sizes): at n = k/(60αε) the sampler's
    output misses the support with probability > α, hence TV > α; with n = k/(αε) it is
    α-accurate."""
    k, alpha = 10, 0.01
    eps = 1 / math.log(1 / alpha)
    p = dist.lemma21_instance(k, alpha)
    s = LaplaceHistogramSampler(2 * k + 1, eps)
    n_low = bounds.kary_lower_n(k, alpha, eps)
    q = exact_output_law_poisson(s, p, n_low)
    assert support_miss_probability(q, p) > alpha
    assert tv_distance(q, p) > alpha
    assert exact_tv(s, p, (2 * k + 1) / (alpha * eps), poisson_size=True) <= alpha


def test_claim24():
    k, alpha = 20, 0.01
    eps = 1 / math.log(1 / alpha)
    n = k / (60 * alpha * eps)
    assert claim24_probability(k, n, alpha, eps, 20_000, np.random.default_rng(2)) <= alpha


def test_lemma21_validity_ranges():
    with pytest.raises(ValueError, match="1/60"):
        dist.lemma21_instance(5, 0.02)
    with pytest.raises(ValueError, match="1/60"):
        bounds.kary_lower_n(5, 0.02, 0.1)
    with pytest.raises(ValueError):
        bounds.kary_lower_n(5, 0.01, 1.0)  # ε > 1/ln(100)
    with pytest.raises(ValueError):
        bounds.kary_lower_n(5, 0.01, 0.2, delta=0.1)
    assert bounds.kary_lower_n(5, 0.01, 0.2) == pytest.approx(5 / (60 * 0.01 * 0.2))


def test_bounds_values():
    assert bounds.kary_upper_n(10, 0.1, 1.0) == 100
    assert bounds.kary_tv_bound(10, 100, 1.0) == pytest.approx(0.1)
    assert bounds.bernoulli_lower_n(0.01, 1.0) == pytest.approx(
        math.log(4.5) / (0.1 * math.expm1(1.0)))
    # ln(4.5)/(10(e−1)) = 0.08753: the spec rounds it up to 0.0876
    assert bounds.bernoulli_lower_n(0.01, 1.0) >= 0.0875 / 0.01
    assert bounds.bb_upper_n(1, 0.1, 1.0) == max(4, math.ceil(72 * math.log(5)))
    assert bounds.kary_learning_n(10, 0.1, 1.0) == pytest.approx(10 / 0.01 + 10 / 0.1)
    with pytest.raises(ValueError):
        bounds.bb_upper_n(10, 0.1, 1.0)  # δ needed for d > 1
    assert bounds.min_n(lambda n: n * n >= 1000) == 32


def test_minimal_n_bisection():
    f = lambda n: 3.0 / n  # noqa: E731
    assert minimal_n(f, 0.01, 1.0, 1e6) == pytest.approx(300.0, rel=2e-3)
    assert minimal_n(f, 0.01, 1.0, 1e6, integer=True) == 300
    with pytest.raises(ValueError):
        minimal_n(f, 1e-9, 1.0, 10.0)


def test_learning_needs_more_data_than_sampling():
    """Spec §2 / F7: the noisy histogram, judged as a learner (TV ≤ α w.p. 1−α), needs far
    more data than as a sampler (TV(Q, P) ≤ α)."""
    k, eps, alpha = 10, 1.0, 0.05
    p = dist.uniform(k)
    s = LaplaceHistogramSampler(k, eps)
    n = 2 * bounds.kary_upper_n(k, alpha, eps)
    q_err = learning_error_quantile(s, p, n, 2000, np.random.default_rng(3), 1 - alpha)
    assert q_err > alpha  # not yet a learner at this n…
    assert exact_tv(s, p, n, poisson_size=True) <= alpha  # …but already a sampler


@pytest.mark.audits("repeated-sampling")
def test_block_slices_and_repeated_sampling():
    assert block_slices(10, 3) == [slice(0, 3), slice(3, 6), slice(6, 9)]
    with pytest.raises(ValueError):
        block_slices(2, 3)
    x = np.array([0] * 10 + [1] * 10)
    s = LaplaceHistogramSampler(2, 1.0)
    rep = sample_repeated(s, x, 4, RandomStreams(7))
    assert rep.samples.shape == (4,)
    assert rep.guarantee.epsilon == pytest.approx(1.0)  # parallel composition
    assert rep.blocks == ((0, 5), (5, 10), (10, 15), (15, 20))
    again = sample_repeated(s, x, 4, RandomStreams(7))
    assert np.array_equal(rep.samples, again.samples)  # determinism (invariant 5)
    seq = sample_repeated(s, x, 4, RandomStreams(7), split=False)
    assert seq.guarantee.epsilon == pytest.approx(4.0)  # sequential composition


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 50), st.integers(1, 10))
def test_block_slices_are_disjoint_and_positional(n, m):
    if n < m:
        with pytest.raises(ValueError):
            block_slices(n, m)
        return
    sl = block_slices(n, m)
    idx = np.concatenate([np.arange(n)[s] for s in sl])
    assert len(sl) == m and len(set(idx.tolist())) == idx.size == m * (n // m)


def test_random_record_guarantee():
    g = RandomRecordSampler(3).guarantee(8)
    assert g.epsilon == 0 and g.delta == pytest.approx(1 / 8)
    assert math.isinf(FirstRecordSampler(3).guarantee(8).epsilon)

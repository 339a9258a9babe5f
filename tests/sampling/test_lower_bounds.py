"""Paper 004 lower-bound instances and structural claims."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dplang.sampling import (
    BucketedProductSampler,
    DiscreteLaplaceHistogramSampler,
    FirstRecordSampler,
    GaussianMarginalSampler,
    LaplaceHistogramSampler,
)
from dplang.sampling import distributions as dist
from dplang.sampling.evaluation import (
    bucketed_product_tv,
    exact_output_law_poisson,
    product_tv,
    tv_distance,
)
from dplang.sampling.lower_bounds import (
    bias_decomposition,
    bucketed_marginals,
    claim16_check,
    claim22_ratio,
    learner_alpha,
    mixture_support_miss,
    mixture_tv_monte_carlo,
    support_miss_product,
)


class QuarterNoise(LaplaceHistogramSampler):
    """A mis-calibrated A1: Lap(1/(2ε)) instead of Lap(2/ε)."""

    @property
    def noise_scale(self) -> float:
        return 0.5 / self.epsilon


def _product_pmf(q: np.ndarray) -> np.ndarray:
    out = np.ones(1)
    for qj in q:
        out = np.concatenate([out * (1 - qj), out * qj])
    return out


def test_support_miss_product() -> None:
    p = dist.subset_product(3)  # d = 6: 1/3 on three coordinates, 0 on three
    q = np.array([0.3, 0.3, 0.3, 0.1, 0.0, 0.2])
    assert support_miss_product(q, p) == pytest.approx(1 - 0.9 * 0.8)
    assert support_miss_product(p, p) == 0.0
    # it is a lower bound on the TV (exact for d = 6)
    assert support_miss_product(q, p) <= product_tv(q, p).exact + 1e-12
    # Gaussian marginals at small n put ones outside the support; more data, less mass
    g = GaussianMarginalSampler(1.0, 1e-6)
    p = dist.subset_product(32)
    misses = [support_miss_product(g.exact_marginals(n, p), p) for n in (500, 5000, 50000)]
    assert misses[0] > 0.5 and misses[0] > misses[1] > misses[2]


def test_mixture_tv_monte_carlo_matches_exact_enumeration() -> None:
    rng = np.random.default_rng(0)
    p = np.array([0.25, 0.0, 0.5, 0.0, 0.1, 0.7, 0.0, 0.3])
    qs = np.clip(p[None, :] + rng.normal(0, 0.08, (3, 8)), 0, 1)
    exact = tv_distance(np.mean([_product_pmf(q) for q in qs], axis=0), _product_pmf(p))
    est = mixture_tv_monte_carlo(qs, p, 40000, np.random.default_rng(1))
    assert est.lower <= exact <= est.upper
    assert est.upper - est.lower < 0.02
    one = mixture_tv_monte_carlo(qs[:1], p, 40000, np.random.default_rng(2))
    assert one.lower <= product_tv(qs[0], p).exact <= one.upper
    # mixing can only help: TV of the mixture ≤ mean TV of its components
    assert exact <= np.mean([product_tv(q, p).exact for q in qs]) + 1e-12


def test_bucketed_marginals_agree_with_bucketed_product_tv() -> None:
    s = BucketedProductSampler(1.0, 1e-6, 0.1)
    p = dist.subset_product(4)
    pm = bucketed_marginals(s, p, 4000, 3, np.random.default_rng(5))
    ref = bucketed_product_tv(s, p, 4000, 3, np.random.default_rng(5))
    upper = np.mean([min(1.0, t + product_tv(q, p).value)
                     for q, t in zip(pm.q, pm.truncation, strict=True)])
    assert upper == pytest.approx(ref["upper"], rel=1e-12)
    assert mixture_support_miss(pm, p) <= ref["upper"]
    est = mixture_tv_monte_carlo(pm.q, p, 20000, np.random.default_rng(6))
    assert est.lower <= ref["upper"] + 1e-9


def test_learner_alpha() -> None:
    assert learner_alpha(np.zeros(10)) == 0.0
    assert learner_alpha(np.full(10, 0.5)) == pytest.approx(0.5)
    # errors uniform on [0, 0.2]: Pr[err > α] = 1 − 5α ≤ α  ⇔  α ≥ 1/6
    e = np.linspace(0, 0.2, 100001)
    assert learner_alpha(e) == pytest.approx(0.2 / 1.2, abs=1e-4)
    a = learner_alpha(np.random.default_rng(0).exponential(0.05, 500))
    assert np.mean(np.random.default_rng(0).exponential(0.05, 500) > a) <= a


def test_claim16_learner_gives_2alpha_sampler() -> None:
    """Claim 16: the noisy-histogram learner's α bounds the sampler's TV by 2α; measured, the
    sampler is far better than the bound (zero-bias principle)."""
    s = LaplaceHistogramSampler(10, 1.0)
    for inst, n in ((dist.half_support(10), 30), (dist.point_mass(10), 200),
                    (dist.spiky(10), 1000)):
        c = claim16_check(s, inst, n, 4000, np.random.default_rng(n))
        assert c.holds, c
        assert c.sampler_tv < 0.75 * c.learner_alpha
    # the learner's α is computed, not assumed: a learner that ignores the data (the uniform
    # law) is not accurate on the point mass, and its α is large
    class Ignorant(LaplaceHistogramSampler):
        def batch_law_given_counts(self, counts, rng):  # type: ignore[override]
            return np.full(np.shape(counts), 0.1)

    bad = claim16_check(Ignorant(10, 1.0), dist.point_mass(10), 200, 500,
                        np.random.default_rng(0))
    assert bad.learner_alpha == pytest.approx(0.9)


@pytest.mark.parametrize("cls", [LaplaceHistogramSampler, DiscreteLaplaceHistogramSampler])
def test_claim7_claim22_for_A1(cls: type) -> None:
    """Claim 2.2 (δ = 0): an element seen j times is output with probability ≤ e^{εj} times
    that of an unseen element. A1 satisfies it; A1 with a quarter of the noise does not."""
    eps = 1.0
    s = cls(6, eps)
    for counts in itertools.product((0, 1, 3), repeat=2):
        c = np.array((*counts, 0, 2, 0, 5))
        r = claim22_ratio(s.exact_law_given_counts(c), c, eps)
        assert r <= 1 + 1e-9, (c, r)
    bad = QuarterNoise(6, eps)
    worst = max(claim22_ratio(bad.exact_law_given_counts(np.array(c)), np.array(c), eps)
                for c in ((1, 0, 0, 0, 0, 0), (2, 0, 5, 0, 0, 1), (1, 1, 1, 0, 0, 0)))
    assert worst > 1.0
    assert math.isnan(claim22_ratio(np.full(3, 1 / 3), np.array([1, 1, 1]), eps))


def test_bias_decomposition_zero_bias_principle() -> None:
    s = LaplaceHistogramSampler(10, 1.0)
    p = dist.half_support(10)
    q = exact_output_law_poisson(s, p, 50.0)
    dec = bias_decomposition(q, p, 50)
    assert dec.tv == pytest.approx(dec.absent + dec.present)
    assert dec.absent > 0 and dec.present > 0
    assert dec.absent == pytest.approx(0.5 * q[p == 0].sum())
    # no absent element and a symmetric P: no bias at all
    u = dist.uniform(10)
    assert bias_decomposition(exact_output_law_poisson(s, u, 50.0), u, 50).tv < 1e-9
    # the non-private first record is unbiased
    first = FirstRecordSampler(10)
    x = np.array([3, 1, 1, 0])
    assert first.conditional_law(x)[3] == 1.0

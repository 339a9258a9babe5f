"""Exact privacy audits: enumerate all neighbouring datasets for small n (spec §6.3 F8).

Each pure-DP sampler's largest privacy loss over all neighbours and outputs must be at most its
claimed ε; a deliberately mis-calibrated variant (claiming the same ε) must exceed it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dplang.sampling import (
    ClippedMeanSampler,
    DiscreteLaplaceHistogramSampler,
    FirstRecordSampler,
    GaussianMarginalSampler,
    LaplaceHistogramSampler,
    PerCoordinateLaplaceSampler,
    RandomRecordSampler,
    RevealOrObscureSampler,
)
from dplang.sampling.evaluation import exact_privacy_audit


class ForgotFactorTwo(LaplaceHistogramSampler):
    """Mis-calibrated: Lap(1/ε) on the counts (the add/remove sensitivity), claims ε."""

    @property
    def noise_scale(self) -> float:
        return 1.0 / self.epsilon


class HalfNoise(LaplaceHistogramSampler):
    @property
    def noise_scale(self) -> float:
        return 0.5 / self.epsilon


class RooWrongQ(RevealOrObscureSampler):
    """Mis-calibrated: q computed for 2ε, still claims ε."""

    def mixing_probability(self, n: int) -> float:
        return self.k / (self.k + n * math.expm1(2 * self.epsilon))


class WideClip(ClippedMeanSampler):
    """Clips to [1/8, 7/8] but keeps claiming ln(1 + 4/n) per coordinate."""

    def __init__(self) -> None:
        super().__init__(lo=0.125, hi=0.875)

    def epsilon_per_coordinate(self, n: int) -> float:
        return math.log1p(4 / n)


class ForgotDimension(PerCoordinateLaplaceSampler):
    """Mis-calibrated: noise for L1 sensitivity 1/n instead of d/n."""

    def noise_scale(self, n: int, d: int) -> float:
        return 1.0 / (n * self.epsilon)


@pytest.mark.audits("laplace-histogram")
@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0])
def test_laplace_histogram_audit(eps):
    audit = exact_privacy_audit(LaplaceHistogramSampler(3, eps), 4, k=3)
    assert audit.pairs == 60  # ordered pairs (c, c − e_a + e_b), c_a ≥ 1, over 15 count vectors
    assert 0 < audit.max_log_ratio <= eps
    assert audit.delta_at_epsilon == 0.0 and audit.passed
    # a quarter of the noise (scale 1/(2ε) instead of 2/ε) breaks the claim
    bad = exact_privacy_audit(HalfNoise(3, eps), 4, k=3)
    assert bad.max_log_ratio > eps
    assert bad.delta_at_epsilon > 0 and not bad.passed


@pytest.mark.audits("laplace-histogram")
@pytest.mark.parametrize("eps", [0.5, 1.0])
def test_add_remove_sensitivity_mistake_is_caught(eps):
    """Lap(1/ε) — calibrating to the add/remove sensitivity 1 instead of the replace-one
    sensitivity 2 — exceeds ε on the released sample for ε ≤ 1. (The sampled element is much
    more private than the noisy counts: the correct sampler's loss is only ≈ 0.57ε at ε = 1,
    so for ε ≥ 2 this particular mistake stays hidden in the output; spec claim 1.)"""
    assert exact_privacy_audit(ForgotFactorTwo(3, eps), 4, k=3).max_log_ratio > eps


@pytest.mark.audits("discrete-laplace-histogram")
def test_discrete_laplace_histogram_audit():
    audit = exact_privacy_audit(DiscreteLaplaceHistogramSampler(2, 1.0), 3, k=2)
    assert 0 < audit.max_log_ratio <= 1.0


@pytest.mark.audits("reveal-or-obscure")
def test_reveal_or_obscure_audit_is_tight():
    for k, n, eps in [(3, 4, 1.0), (4, 3, 0.5), (2, 6, 2.0)]:
        audit = exact_privacy_audit(RevealOrObscureSampler(k, eps), n, k=k)
        assert audit.max_log_ratio == pytest.approx(eps, rel=1e-12)
        assert audit.delta_at_epsilon <= 1e-15
        bad = exact_privacy_audit(RooWrongQ(k, eps), n, k=k)
        assert bad.max_log_ratio == pytest.approx(2 * eps, rel=1e-12)
        assert not bad.passed


@pytest.mark.audits("clipped-mean")
@pytest.mark.parametrize("n,d", [(4, 1), (5, 1), (8, 1), (4, 2), (3, 2)])
def test_clipped_mean_audit_equals_composed_epsilon(n, d):
    s = ClippedMeanSampler()
    audit = exact_privacy_audit(s, n, d=d)
    # pure composition is exact here: a replaced row can push every column to its worst pair
    assert audit.max_log_ratio == pytest.approx(d * s.epsilon_per_coordinate(n), rel=1e-12)
    assert audit.passed


@pytest.mark.audits("clipped-mean")
@pytest.mark.parametrize("n,d", [(8, 1), (12, 1), (3, 2)])
def test_clipped_mean_wider_clip_breaks_the_claim(n, d):
    bad = exact_privacy_audit(WideClip(), n, d=d)
    assert bad.max_log_ratio > bad.epsilon + 1e-3


@pytest.mark.audits("laplace-marginals")
def test_per_coordinate_laplace_audit():
    audit = exact_privacy_audit(PerCoordinateLaplaceSampler(1.0), 3, d=2)
    assert audit.max_log_ratio <= 1.0
    bad = exact_privacy_audit(ForgotDimension(1.0), 2, d=3)
    assert bad.max_log_ratio > 1.0


@pytest.mark.audits("gaussian-marginals")
def test_gaussian_marginals_audit_delta():
    s = GaussianMarginalSampler(1.0, 1e-3)
    audit = exact_privacy_audit(s, 3, d=2)
    assert audit.delta_at_epsilon <= s.delta


@pytest.mark.audits("record-baselines")
def test_baselines_audit():
    first = exact_privacy_audit(FirstRecordSampler(3), 3, k=3)
    assert first.max_log_ratio == math.inf
    assert first.pairs == 27 * 3 * 2
    n = 4
    rand = exact_privacy_audit(RandomRecordSampler(3), n, k=3)
    assert rand.max_log_ratio == math.inf
    # (0, 1/n)-DP exactly: the largest δ at ε = 0 is 1/n
    assert rand.epsilon == 0 and rand.delta_at_epsilon == pytest.approx(1 / n)
    assert rand.passed


def test_audit_needs_a_domain():
    with pytest.raises(ValueError):
        exact_privacy_audit(LaplaceHistogramSampler(2, 1.0), 2)


def test_worst_pair_is_a_neighbouring_pair():
    audit = exact_privacy_audit(LaplaceHistogramSampler(3, 1.0), 3, k=3)
    a, b = (np.array(v) for v in audit.worst_pair)
    assert a.sum() == b.sum() == 3 and np.abs(a - b).sum() == 2

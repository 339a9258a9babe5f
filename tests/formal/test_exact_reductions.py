"""The reductions behind the exact experiments E2 and E10.

* binomial tails in log space far below e^{−745} (scipy's logcdf/logsf underflow there);
* identification: the margin rules' laws depend only on differences of error counts, so types
  inside or outside every language drop out (nested segments: one binomial);
* slender DFA languages: valid candidates among the first n·2⁶⁴ members counted from the
  periodic counts by length;
* E10's exact generation error on DFAs against end-to-end Monte Carlo.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import logsumexp
from scipy.stats import binom

from dplang.formal import evaluation as ev
from dplang.formal.collections import dfa_demo_family
from dplang.formal.languages import _count_sub_periodic, count_sub_among_first
from dplang.formal.statistical import (
    Linear,
    MarginIdentifier,
    PrefixCountGenerator,
    SoftMarginIdentifier,
)
from dplang.formal.truth import instance


@pytest.mark.parametrize(("k", "n", "p"), [(1999, 10000, 0.4), (100, 10000, 0.4),
                                           (0, 50, 0.5), (3999, 10000, 0.4), (7, 8, 0.99)])
def test_binomial_tails_in_log_space(k, n, p):
    lp = binom.logpmf(np.arange(n + 1), n, p)
    assert ev.log_binom_cdf(k, n, p) == pytest.approx(float(logsumexp(lp[:k + 1])), rel=1e-9)
    assert ev.log_binom_sf(n - k - 1, n, 1 - p) == pytest.approx(
        float(logsumexp(lp[:k + 1])), rel=1e-9)  # P(n − X > n − k − 1) = P(X ≤ k)
    got = ev.log_binom_cdf(np.array([k, k]), np.array([n, n]), p)
    assert got.shape == (2,) and got[0] == got[1]
    assert ev.log_binom_cdf(-1, n, p) == -math.inf and ev.log_binom_sf(n, n, p) == -math.inf


def test_nested_segments_reduce_to_one_binomial():
    ns = instance("nested-segments")
    # Algorithm 4: Err = 0.4·P(Bin(n, 0.4) < n/K) in closed form, e^{−3667} at n = 40000
    for n, k in ((2000, 5), (40000, 5)):
        got = ev.exact_identification_error(MarginIdentifier(k=k), ns.collection, ns.distribution,
                                            n)
        want = math.log(0.4) + float(ev.log_binom_cdf(math.ceil(n / k) - 1, n, 0.4))
        assert got.log_value == pytest.approx(want, rel=1e-9)
    # Algorithm 1 at n = 40000 (K = 5): the Rao–Blackwell average agrees (its conditional
    # error hardly varies), and the value is far below float range at n = 10⁶
    alg = SoftMarginIdentifier(k=5, epsilon=0.5)
    exact = ev.exact_identification_error(alg, ns.collection, ns.distribution, 40000)
    rb = ev.sampled_identification_error(alg, ns.collection, ns.distribution, 40000, 50, 1)
    assert exact.log_value == pytest.approx(rb.log_value, rel=1e-6)
    big = ev.exact_identification_error(SoftMarginIdentifier(k=11, epsilon=0.5), ns.collection,
                                        ns.distribution, 1_000_000)
    assert -big.log_value / 1000 == pytest.approx(0.5174, abs=1e-3)  # ≥ min{1, ε} = 0.5
    assert big.parts["log_left_out"] < big.log_value - 40


def test_slender_dfa_counts_by_period():
    coll = dfa_demo_family()
    even_b = coll[2]
    for lang, expected in ((coll[3], lambda t: t), (coll[4], lambda t: (t + 1) // 2)):
        sub = lang.intersection(even_b)  # a* ⊆ even #b; (ab)^k ∈ even #b iff k is even
        for t in (7, 50, 333):
            assert _count_sub_periodic(lang, sub, t) == (expected(t), expected(t))
            assert sub.count_upto(lang.nth_index(t)) == expected(t)
        huge = 1000 * 2**64 + 5
        assert count_sub_among_first(lang, sub, huge) == (expected(huge), expected(huge))
    # dense languages are counted by position; no period is claimed
    assert _count_sub_periodic(coll[5], coll[5].intersection(even_b), 50) is None


def test_dfa_generation_exact_against_monte_carlo():
    dd = instance("dfa-demo")
    alg = PrefixCountGenerator(k=6, epsilon=1.0, tau=Linear(1 / 128), big_m=9,
                               big_r=lambda m: m << (2 * m))
    exact = ev.exact_generation_error(alg, dd.collection, dd.distribution, 400)
    assert exact.exact and exact.parts["log_remainder"] < exact.log_value - 20
    assert exact.value == pytest.approx(0.1524, abs=5e-4)
    mc = ev.monte_carlo_error(alg, dd.collection, dd.distribution, 400, runs=150, seed=2,
                              confidence=0.99)
    assert mc.low <= exact.value <= mc.high

"""Theorems 4.1 / 4.2 of paper 003 (E5) and the paper-number checks (claims 12-14, 16-17)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dplang.reports.theory import (
    DiscreteLaplaceCount,
    ExponentialMechanismGenerator,
    LaplaceCount,
    RandomizedResponse,
    StaircaseCount,
    best_test_error,
    check_pair,
    estimation_lower_bound,
    group_tv_bound,
    minimax_estimation_risk,
    paper_identity_check,
    pure_dp_loss,
    total_variation,
    tv_upper_bound,
)
from dplang.reports.theory import (
    testing_error_lower_bound as error_bound,
)

EPS = (0.05, 0.25, 0.5, 1.0, 2.0)
KS = (1, 2, 3, 4, 5, 8)


def _neighbours(lo: int, hi: int) -> tuple[list[list[int]], list[list[int]]]:
    return [[c] for c in range(lo, hi)], [[c + 1] for c in range(lo, hi)]


def test_bound_formulas() -> None:
    for eps in EPS:
        for k in KS:
            x = math.exp(k * eps)
            assert tv_upper_bound(k, eps) == pytest.approx((x - 1) / (x + 1), rel=1e-12)
            assert error_bound(k, eps) == pytest.approx(
                1 - tv_upper_bound(k, eps), rel=1e-12)
            assert estimation_lower_bound(0.2, k, eps) == pytest.approx(
                0.2 / (2 * (x + 1)), rel=1e-12)
    with pytest.raises(ValueError):
        tv_upper_bound(-1, 1.0)


def test_sharp_group_bound_matches_brute_force_over_chains() -> None:
    """Maximise p_k − p_0 over ε-DP chains on a grid of starting points; the closed form must
    agree (and be ≤ tanh(kε/2), with equality only at k = 1)."""
    start = np.concatenate([np.linspace(0, 1, 20001), np.logspace(-9, 0, 4001)])
    for eps in (0.1, 0.5, 1.0, 2.0):
        for k in (1, 2, 3, 4, 5, 6):
            p = start.copy()
            for _ in range(k):
                p = np.minimum(math.exp(eps) * p, 1 - math.exp(-eps) * (1 - p))
            brute = float((p - start).max())
            sharp = group_tv_bound(k, eps)
            assert brute == pytest.approx(sharp, abs=2e-4)
            assert brute <= sharp + 1e-12
            if k == 1:
                assert sharp == pytest.approx(tv_upper_bound(1, eps), rel=1e-12)
            else:
                assert sharp < tv_upper_bound(k, eps) - 1e-6


def test_randomized_response_is_on_the_curve() -> None:
    """Claim 12/13: RR with parameter kε at distance 1 attains tanh(kε/2) and the best test
    errs with probability exactly 2/(e^{kε}+1)."""
    for eps in EPS:
        for k in KS:
            rr = RandomizedResponse(k * eps)
            ev = check_pair(rr, [0], [1], 1, epsilon=k * eps)
            assert ev.tv == pytest.approx(tv_upper_bound(k, eps), rel=1e-12)
            assert ev.test_error == pytest.approx(error_bound(k, eps), rel=1e-9)
            assert not ev.flagged


def test_count_mechanisms_and_generator_respect_both_bounds() -> None:
    for eps in EPS:
        for k in KS:
            for mech, c0, c1 in ((DiscreteLaplaceCount(eps), [3], [3 + k]),
                                 (RandomizedResponse(eps, cutoff=3 + k), [3], [3 + k]),
                                 (ExponentialMechanismGenerator(eps), [0, k, 2], [k, 0, 2])):
                ev = check_pair(mech, c0, c1, k, supports=(c0[0] / 100, c1[0] / 100))
                assert ev.tv <= ev.sharp_bound + 1e-12
                assert ev.sharp_bound <= ev.tv_bound + 1e-12
                assert ev.test_error >= ev.test_error_bound - 1e-12
                assert ev.risk is not None and ev.risk_bound is not None
                assert ev.risk >= ev.risk_bound - 1e-12
                assert not ev.flagged


def test_laplace_counts_and_staircase_attain_the_sharp_bound() -> None:
    for eps in EPS:
        for k in KS:
            if k % 2 == 0:
                assert LaplaceCount(eps).tv(0, k) == pytest.approx(group_tv_bound(k, eps))
            assert check_pair(DiscreteLaplaceCount(eps), [20], [20 + k], k).tv == \
                pytest.approx(group_tv_bound(k, eps), rel=1e-9)
            st = StaircaseCount(eps, k)
            ev = check_pair(st, [0], [k], k)
            assert ev.tv == pytest.approx(group_tv_bound(k, eps), rel=1e-9)
            # ... and the staircase really is ε-DP (exact loss over all neighbouring counts)
            lo, hi = _neighbours(-2, k + 2)
            assert pure_dp_loss(st, lo, hi) <= eps + 1e-9


def test_exact_privacy_losses() -> None:
    lo, hi = _neighbours(-10, 20)
    assert pure_dp_loss(DiscreteLaplaceCount(0.7), lo, hi) == pytest.approx(0.7, rel=1e-9)
    assert pure_dp_loss(RandomizedResponse(0.7, cutoff=4), lo, hi) == pytest.approx(0.7)
    em = ExponentialMechanismGenerator(0.7)
    # one record moves each count by at most one: all sign patterns of a 3-statement corpus
    base = [5, 2, 7]
    pats = [[s0, s1, s2] for s0 in (-1, 0, 1) for s1 in (-1, 0, 1) for s2 in (-1, 0, 1)]
    assert pure_dp_loss(em, [base] * len(pats),
                        [[b + s for b, s in zip(base, p, strict=True)] for p in pats]) <= 0.7


@pytest.mark.parametrize("k", [1, 2, 3])
def test_a_mechanism_above_the_curve_is_flagged(k: int) -> None:
    """Mechanisms that claim ε but spend more are flagged on a distance-k pair."""
    eps = 0.5
    # randomized response with parameter (k+1)ε claimed as ε-DP
    too_strong = RandomizedResponse((k + 1) * eps, cutoff=1)
    ev = check_pair(too_strong, [0], [k], k, epsilon=eps / k if k > 1 else eps)
    assert ev.above_theorem and ev.flagged
    # a Laplace-type count with half the noise (scale 1/(2ε)) claimed as ε-DP
    half = DiscreteLaplaceCount(2 * eps)
    ev = check_pair(half, [0], [k], k, epsilon=eps)
    assert ev.flagged
    assert ev.above_sharp
    # the honest versions are not flagged
    assert not check_pair(DiscreteLaplaceCount(eps), [0], [k], k).flagged


def test_sharp_bound_catches_what_theorem_misses() -> None:
    """At k = 2, ε = 1 randomized response with parameter 1.6 (so really 1.6-DP) has
    d_TV = tanh(0.8) = 0.664: below Theorem 4.1's tanh(1) = 0.762, above the sharp 0.632."""
    ev = check_pair(RandomizedResponse(1.6, cutoff=1), [0], [2], 2, epsilon=1.0)
    assert not ev.above_theorem
    assert ev.above_sharp and ev.flagged
    lo, hi = _neighbours(-3, 5)
    assert pure_dp_loss(RandomizedResponse(1.6, cutoff=1), lo, hi) > 1.0


def test_minimax_risk_exact_values() -> None:
    # identical laws: the estimator cannot beat the midpoint, risk Δ/2
    p = np.array([0.3, 0.7])
    assert minimax_estimation_risk(p, p, 0.1, 0.5) == pytest.approx(0.2, rel=1e-6)
    # disjoint laws: zero risk
    assert minimax_estimation_risk(np.array([1.0, 0.0]), np.array([0.0, 1.0]), 0, 1) == 0.0
    # RR: risk ≥ (Δ/2)(1 − d_TV), twice Theorem 4.2's (Δ/4)(1 − d_TV)
    rr = RandomizedResponse(1.0)
    p0, p1 = rr.law([0]), rr.law([1])
    tv = total_variation(p0, p1)
    risk = minimax_estimation_risk(p0, p1, 0.0, 0.3)
    assert risk >= 0.3 / 2 * (1 - tv) - 1e-12
    assert best_test_error(p0, p1) == pytest.approx(1 - tv)


def test_paper_numbers_claims_16_and_17() -> None:
    """Spec 003 §4.3-4.4: EmitRate inside the predicted interval, UnsupportedEmit < β, and
    the identity UnsupportedEmit ≈ FalseEmission·EmitRate/(1 − p_θ) with p_θ back-solved from
    the interval's upper end; the |O∩U|/m normalisation is inconsistent with the table."""
    beta = 0.05
    rows = {"TAB": (0.404, (0.356, 0.557), 0.008, 0.010),
            "WildChat": (0.220, (0.162, 0.350), 0.004, 0.014)}
    for name, (er, (lo, hi), ue, fe) in rows.items():
        assert lo <= er <= hi, name
        assert ue < beta
        p_theta = (hi - beta) / (1 - beta)
        p_2tau = lo / (1 - beta)
        assert p_2tau <= p_theta
        check = paper_identity_check(fe, er, p_theta, ue)
        assert check.consistent, (name, check)
        other = paper_identity_check(fe, er, p_theta, ue, conditional=False)
        assert not other.consistent, (name, other)
        # FalseEmission ratio bound β(1−p_θ)/((1−β)p_{θ+2τ}) holds
        assert fe <= beta * (1 - p_theta) / ((1 - beta) * p_2tau)
    tab = paper_identity_check(0.010, 0.404, (0.557 - 0.05) / 0.95, 0.008)
    assert tab.predicted == pytest.approx(0.0087, abs=5e-5)
    wc = paper_identity_check(0.014, 0.220, (0.350 - 0.05) / 0.95, 0.004)
    assert wc.predicted == pytest.approx(0.0045, abs=5e-5)


def test_discrete_laplace_law_keeps_its_tails() -> None:
    mech = DiscreteLaplaceCount(0.3, lo=-5, hi=5)
    law = mech.law([2])
    assert law.sum() == pytest.approx(1.0, abs=1e-15)
    a = math.exp(-0.3)
    # the end points carry the whole tails: P(Y = hi) = P(Z ≥ 3) = a^3/(1+a)
    assert law[-1] == pytest.approx(a**3 / (1 + a), rel=1e-12)
    assert law[0] == pytest.approx(a**7 / (1 + a), rel=1e-12)
    with pytest.raises(ValueError):
        mech.law([9])

"""Exact generation error with more than two positive-mass window strings.

The clipped-count law is checked against a brute-force sum over every multinomial
composition, the whole error against the same brute force (three strings: no approximation),
against the two-string path (two strings forced through the general code), and against
end-to-end Monte Carlo (four strings, where the commonest is taken as covered and the
remainder bound is reported).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import gammaln, logsumexp, xlogy

from dplang.formal import evaluation as ev
from dplang.formal.statistical import (
    GaussianThresholdGenerator,
    JointThresholdGenerator,
    PrefixCountGenerator,
)
from dplang.formal.truth import instance


@pytest.fixture(scope="module")
def r57():
    return instance("remark-5.7")


def _compositions(n, r, low=0):
    """Every vector of r counts ≥ low with sum ≤ n (rows)."""
    grid = np.stack(np.meshgrid(*[np.arange(low, n + 1)] * r, indexing="ij"), -1).reshape(-1, r)
    return grid[grid.sum(axis=1) <= n]


def _log_mult(comp, ps, n):
    """Multinomial log-probabilities of count rows ``comp`` (the rest on one more cell)."""
    rest = n - comp.sum(axis=1)
    lp = gammaln(n + 1) - gammaln(comp + 1).sum(axis=1) - gammaln(rest + 1)
    return lp + comp @ np.log(ps) + xlogy(rest, 1 - sum(ps))


def _brute_clipped(n, ps, cap):
    comp = _compositions(n, len(ps))
    lp = _log_mult(comp, ps, n)
    out: dict[tuple[int, ...], list[float]] = {}
    for key, v in zip(map(tuple, np.minimum(comp, cap).tolist()), lp, strict=True):
        out.setdefault(key, []).append(v)
    return {k: float(logsumexp(v)) for k, v in out.items()}


@pytest.mark.parametrize(("n", "ps", "cap"), [
    (12, [0.1, 0.2, 0.3], 3), (15, [0.05, 0.3, 0.5], 4), (10, [0.2, 0.3], 2), (9, [0.4], 3),
    (14, [0.01, 0.02, 0.9], 5)])
def test_clipped_law_is_the_brute_force_law(n, ps, cap):
    want = _brute_clipped(n, ps, cap)
    lp, ys, log_dropped = ev._clipped_states(n, ps, cap, horizon=1e9)
    got = {tuple(y): v for y, v in zip(ys.tolist(), lp, strict=True)}
    assert log_dropped == -math.inf
    assert set(got) == {k for k, v in want.items() if v > -math.inf}
    for k, v in got.items():
        assert v == pytest.approx(want[k], abs=1e-10)
    assert float(logsumexp(lp)) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize(("m", "qs", "cap"), [
    (200, [0.01, 0.02], 30),          # a rare event: the direct sum
    (200, [0.3, 0.3], 30),            # the bulk: inclusion–exclusion on the complement
    (120, [0.01, 0.02, 0.03], 4),
    (120, [0.2, 0.3, 0.4], 15)])
def test_joint_tail_both_branches(m, qs, cap):
    terms = _log_mult(_compositions(m, len(qs), low=cap), qs, m)
    assert ev._log_all_at_least(m, qs, cap) == pytest.approx(float(logsumexp(terms)),
                                                              rel=1e-9, abs=1e-12)


def _brute_error(alg, coll, dist, n):
    """Err by summing over every composition of the positive-mass window strings."""
    _, kp = alg.horizon(n, coll)
    window, big_r = alg.window(n), alg.pool(n)
    cap = math.ceil(alg.threshold_tau(n))
    memb = alg.membership(coll, n)
    probs = np.array([dist.pmf(coll.universe.at(j)) for j in range(1, window + 1)])
    pos = [j for j in range(window) if probs[j] > 0]
    units = ([(i, m) for i in range(1, kp + 1) for m in range(1, window + 1)]
             if isinstance(alg, JointThresholdGenerator) else
             [(i, window) for i in range(1, kp + 1)])
    fails = np.array([ev.fail_given_selection(coll, i, m, big_r, dist.support, dist.atoms(), n)
                      for i, m in units])
    inv, log_coll = fails[:, 0], fails[:, 1]
    comp = _compositions(n, len(pos))
    lp = _log_mult(comp, probs[pos], n)
    counts = np.zeros((comp.shape[0], window))
    counts[:, pos] = np.minimum(comp, cap)
    if isinstance(alg, GaussianThresholdGenerator):
        scores = alg.scores(counts, memb, n).reshape(comp.shape[0], -1)
        uniq, inverse = np.unique(scores, axis=0, return_inverse=True)
        law = ev.gaussian_argmax_log_law(uniq, alg.sigma(n, kp))[np.ravel(inverse)]
    else:
        law = alg.log_law(counts, memb, n).reshape(comp.shape[0], -1)
    with np.errstate(divide="ignore"):
        sel = logsumexp(lp[:, None] + law + np.log(inv)[None, :])
        coll_part = logsumexp(logsumexp(lp[:, None] + law, axis=0) + np.log1p(-inv) + log_coll)
    return float(np.logaddexp(sel, coll_part))


def test_three_positive_strings_match_brute_force(r57):
    d1 = r57.distributions["D1"]  # window 0, 1, 2, 3: positive 0, 1, 3
    for alg, n in ((JointThresholdGenerator(k=2, epsilon=1.0, tau=lambda m: m / 8, mbar=4), 24),
                   (PrefixCountGenerator(k=2, epsilon=0.5, tau=lambda m: m / 8, big_m=4), 24),
                   (GaussianThresholdGenerator(k=2, epsilon=0.5, delta=1e-3,
                                               tau=lambda m: m / 8, mbar=4), 16)):
        got = ev.exact_generation_error(alg, r57.collection, d1, n)
        assert got.exact and got.parts["log_remainder"] == -math.inf
        assert got.log_value == pytest.approx(_brute_error(alg, r57.collection, d1, n),
                                              abs=1e-10)


def test_general_path_equals_the_two_string_path(r57):
    d1 = r57.distributions["D1"]
    for alg, n in ((PrefixCountGenerator(k=2, epsilon=0.25, big_m=3), 400),
                   (JointThresholdGenerator(k=2, epsilon=1.0, tau=lambda m: m / 16, mbar=3),
                    1200)):
        two = ev.exact_generation_error(alg, r57.collection, d1, n)
        _, kp = alg.horizon(n, r57.collection)
        window, big_r = alg.window(n), alg.pool(n)
        memb = alg.membership(r57.collection, n)
        probs = np.array([d1.pmf(r57.collection.universe.at(j)) for j in range(1, window + 1)])
        units = ([(i, m) for i in range(1, kp + 1) for m in range(1, window + 1)]
                 if isinstance(alg, JointThresholdGenerator) else
                 [(i, window) for i in range(1, kp + 1)])
        fails = np.array([ev.fail_given_selection(r57.collection, i, m, big_r, d1.support,
                                                  d1.atoms(), n) for i, m in units])
        general = ev._exact_generation_many(
            window, math.ceil(alg.threshold_tau(n)), n, probs,
            [j for j in range(window) if probs[j] > 0], fails[:, 0], fails[:, 1],
            lambda c, alg=alg, memb=memb, n=n: alg.log_law(c, memb, n).reshape(c.shape[0], -1))
        assert general.log_value == pytest.approx(two.log_value, abs=1e-9)


def test_four_positive_strings_against_monte_carlo(r57):
    """Remark 5.7 with M̄ = 6 (positive 0, 1, 3, 5; 0 taken as covered): the exact value lies in
    the 99% Wilson interval of end-to-end runs, and the remainder bound is reported."""
    d1 = r57.distributions["D1"]
    alg = JointThresholdGenerator(k=2, epsilon=0.5, tau=lambda m: m / 64, mbar=6)
    n = 640
    exact = ev.exact_generation_error(alg, r57.collection, d1, n)
    assert exact.exact and exact.parts["log_remainder"] < exact.log_value + math.log(1e-9)
    assert 0.05 < exact.value < 0.5
    mc = ev.monte_carlo_error(alg, r57.collection, d1, n, runs=1000, seed=3, confidence=0.99)
    assert mc.low <= exact.value <= mc.high
    # the Rao–Blackwell average of the exact conditional error agrees closely
    rb = ev.rao_blackwell_error(alg, r57.collection, d1, n, runs=60, seed=4)
    assert rb.value == pytest.approx(exact.value, rel=0.25)


def test_uncovered_commoner_strings_are_refused(r57):
    """τ = n/16 with M̄ = 12 (the Cor 4.7 probe): the commoner strings 3 and 5 are mostly below
    τ, so no exact value is claimed."""
    alg = JointThresholdGenerator(k=2, epsilon=1.0, tau=lambda m: m / 16, mbar=12)
    with pytest.raises(ValueError, match="covered"):
        ev.exact_generation_error(alg, r57.collection, r57.distributions["D1"], 400)

import itertools
import math

import numpy as np
import pytest

from dplang.privacy.audit import (
    AuditResult,
    clopper_pearson,
    delta_at_epsilon,
    exact_audit,
    max_log_loss,
    max_log_ratio,
    monte_carlo_epsilon_lower_bound,
    renyi_divergence,
)


def test_exact_measures():
    p = np.array([0.5, 0.5])
    q = np.array([0.25, 0.75])
    assert max_log_ratio(p, q) == pytest.approx(math.log(2))
    assert max_log_ratio([1.0, 0.0], [0.5, 0.5]) == math.inf
    # D_2(p||q) = log sum p^2/q
    assert renyi_divergence(p, q, 2.0) == pytest.approx(math.log(0.25 / 0.25 + 0.25 / 0.75))
    assert renyi_divergence(p, p, 5.0) == pytest.approx(0.0, abs=1e-12)


def test_randomized_response_audit_catches_wrong_epsilon():
    eps = 1.0
    e = math.exp(eps)
    p = [e / (1 + e), 1 / (1 + e)]
    q = p[::-1]
    audit = exact_audit([(p, q)])
    assert audit.satisfies_pure(eps)
    assert not audit.satisfies_pure(0.9)
    # eps-DP implies eps^2/2-zCDP
    assert audit.satisfies_zcdp(eps**2 / 2)


def test_monte_carlo_lower_bound():
    rng = np.random.default_rng(0)
    eps = 2.0
    e = math.exp(eps)

    def rr(bit):
        return lambda g: bit if g.random() < e / (1 + e) else 1 - bit

    res = monte_carlo_epsilon_lower_bound(rr(1), rr(0), lambda y: y == 1, 20000, rng)
    assert 1.5 < res.epsilon_lower_bound <= eps + 1e-9
    # a mechanism claiming eps=1 is caught
    assert res.epsilon_lower_bound > 1.0


def test_clopper_pearson():
    lo, hi = clopper_pearson(50, 100, 0.95)
    assert lo < 0.5 < hi
    assert clopper_pearson(0, 10, 0.95)[0] == 0.0


def _sup_over_events(p, q, eps):
    """sup_E P(E) − e^ε Q(E) by brute force over every event of a small outcome space."""
    outcomes = range(len(p))
    return max(sum(p[y] for y in event) - math.exp(eps) * sum(q[y] for y in event)
               for r in range(len(p) + 1) for event in itertools.combinations(outcomes, r))


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("eps", [0.0, 0.3, 1.0])
def test_delta_at_epsilon_is_the_worst_event(seed, eps):
    rng = np.random.default_rng(seed)
    p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))
    assert delta_at_epsilon(p, q, eps) == pytest.approx(_sup_over_events(p, q, eps), abs=1e-15)
    audit = exact_audit([(p, q)], epsilon=eps)
    assert audit.delta_at_epsilon == pytest.approx(
        max(_sup_over_events(p, q, eps), _sup_over_events(q, p, eps)), abs=1e-15)


def test_delta_at_epsilon_of_randomized_response_and_at_huge_epsilon():
    e = math.exp(1.0)
    p, q = [e / (1 + e), 1 / (1 + e)], [1 / (1 + e), e / (1 + e)]
    assert delta_at_epsilon(p, q, 1.0) == pytest.approx(0.0, abs=1e-15)
    assert delta_at_epsilon(p, q, 0.5) == pytest.approx((e - math.exp(0.5)) / (1 + e))
    # where e^ε overflows only the outputs q cannot produce count; ε = ∞ needs no δ
    assert delta_at_epsilon([0.5, 0.5], [0.25, 0.75], 800.0) == 0.0
    assert delta_at_epsilon([0.5, 0.5], [1.0, 0.0], 800.0) == 0.5
    assert delta_at_epsilon([0.5, 0.5], [1.0, 0.0], math.inf) == 0.0


def test_max_log_loss_works_on_log_laws():
    la = np.log([0.5, 0.25, 0.25])
    lb = np.log([0.25, 0.5, 0.25])
    assert max_log_loss(la, lb) == pytest.approx(math.log(2))
    assert max_log_loss([0.0, -np.inf], [0.0, -1.0]) == math.inf  # supports differ
    assert max_log_loss([-np.inf], [-np.inf]) == 0.0
    assert max_log_loss([0.0, 0.0], [0.0]) == math.inf  # different outcome spaces


def test_audit_result_line_and_statistic():
    exact = AuditResult(mechanism="m", epsilon=1.0, passed=True, max_log_ratio=0.5,
                        detail="3 pairs", reason="small")
    assert exact.statistic == 0.5
    assert exact.line() == "PASS m: max exact privacy loss = 0.5 (ε = 1) over 3 pairs"
    assert exact.method_line() == "method: exact (small)"
    gauss = AuditResult(mechanism="g", epsilon=0.5, delta=1e-6, passed=False,
                        delta_at_epsilon=2e-6, pairs=4)
    assert gauss.statistic == 2e-6
    assert gauss.line() == ("FAIL g: max δ(ε) = 2e-06 (target δ = 1e-06, ε = 0.5) over 4 "
                            "neighbour pairs")
    mc = AuditResult(mechanism="m", method="monte-carlo", epsilon=1.0, passed=True,
                     epsilon_lower_bound=0.8, detail="the pair")
    assert mc.statistic == 0.8 and "Monte Carlo lower bound ε̂ = 0.8 (claimed ε = 1)" in mc.line()

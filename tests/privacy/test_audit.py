import math

import numpy as np
import pytest

from dplang.privacy.audit import (
    clopper_pearson,
    exact_audit,
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

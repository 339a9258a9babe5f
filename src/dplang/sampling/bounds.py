"""Sample-complexity bounds of Table 1 of Raskhodnikova et al. 2021, with explicit constants.

Upper bounds are the constants derived for dplang's samplers; lower bounds are the paper's
(Lemma 2.1, with its validity range enforced) or reconstructed (the Bernoulli case); see
``docs/sampling.md``, "Results: Table 1's rates" and "Reconstructions and choices".
Learning bounds are Θ-statements in the paper: they are exposed as functions of a user constant.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ..privacy.calibration import CalibrationError, calibrate
from .base import check_delta, check_epsilon, check_n

__all__ = [
    "bb_upper_n",
    "bernoulli_lower_n",
    "clipped_mean_min_n",
    "kary_learning_n",
    "kary_lower_n",
    "kary_tv_bound",
    "kary_upper_n",
    "min_n",
]


def _check_alpha(alpha: float) -> float:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    return float(alpha)


def kary_tv_bound(k: int, n: int, epsilon: float) -> float:
    """k/(εn): the Laplace-histogram sampler's TV bound for every P on [k] (Theorem 1.4)."""
    return k / (check_epsilon(epsilon) * check_n(n))


def kary_upper_n(k: int, alpha: float, epsilon: float) -> int:
    """⌈k/(αε)⌉ records suffice for α-accuracy on every P on [k] (pure ε-DP, Theorem 1.4)."""
    return math.ceil(k / (_check_alpha(alpha) * check_epsilon(epsilon)))


def kary_lower_n(k: int, alpha: float, epsilon: float, delta: float = 0.0) -> float:
    """Lemma 2.1: an (ε, δ)-DP frequency-count-based Poisson sampler that is α-accurate on
    distributions over [2k+1] needs n > k/(60αε).

    Valid only for α ≤ 1/60 (the paper says α ≤ 0.02, but its instance has mass 60α on [2k]
    and is a distribution only when 60α ≤ 1), ε ≤ 1/ln(1/α) and δ ≤ 0.1αε/k; outside that
    range ValueError is raised."""
    _check_alpha(alpha)
    check_epsilon(epsilon)
    if alpha > 1 / 60:
        raise ValueError(f"Lemma 2.1 needs alpha <= 1/60 (corrected from the paper's 0.02), "
                         f"got {alpha}")
    if epsilon > 1 / math.log(1 / alpha) * (1 + 1e-12):
        raise ValueError(f"Lemma 2.1 needs epsilon <= 1/ln(1/alpha) = {1 / math.log(1 / alpha)}"
                         f", got {epsilon}")
    if not 0 <= delta <= 0.1 * alpha * epsilon / k:
        raise ValueError(f"Lemma 2.1 needs 0 <= delta <= 0.1·alpha·epsilon/k, got {delta}")
    return k / (60.0 * alpha * epsilon)


def bernoulli_lower_n(alpha: float, epsilon: float, pure: bool = False) -> float:
    """k = 2 lower bound on P = Ber(10α) (reconstructed constants): n ≥ ln(4.5)/(10α(e^ε−1))
    from the paper's 2αe^{εt} bound, or n ≥ ln 9/(10α(e^ε−1)) for pure DP (bound αe^{εt})."""
    _check_alpha(alpha)
    c = math.log(9.0) if pure else math.log(4.5)
    return c / (10.0 * alpha * math.expm1(check_epsilon(epsilon)))


def bb_upper_n(d: int, alpha: float, epsilon: float, delta: float | None = None) -> int:
    """Sufficient n for the clipped-mean sampler (Theorem 1.8; claim 12 of ``docs/sampling.md``):
    max(⌈8√(2d ln(1/δ))/ε⌉, ⌈72 ln(d/(2α))⌉); for d = 1 (pure DP, no δ)
    max(⌈4/ε⌉, ⌈72 ln(1/(2α))⌉). Requires ε ≤ 1 for the privacy part."""
    _check_alpha(alpha)
    check_epsilon(epsilon)
    if d == 1:
        return max(math.ceil(4 / epsilon), math.ceil(72 * math.log(1 / (2 * alpha))), 1)
    dl = check_delta(delta if delta is not None else -1.0)
    n_priv = math.ceil(8 * math.sqrt(2 * d * math.log(1 / dl)) / epsilon)
    n_acc = math.ceil(72 * math.log(d / (2 * alpha)))
    return max(n_priv, n_acc)


def kary_learning_n(k: int, alpha: float, epsilon: float, constant: float = 1.0) -> float:
    """Θ(k/α² + k/(αε)) for private learning of k-ary distributions (Table 1), times
    ``constant``."""
    _check_alpha(alpha)
    return constant * (k / alpha**2 + k / (alpha * check_epsilon(epsilon)))


def min_n(ok: Callable[[int], bool], lo: int = 1, hi: int | None = None,
          limit: int = 10**9) -> int:
    """Smallest integer n ≥ lo with ok(n) True, for a predicate monotone in n
    (:func:`dplang.privacy.calibration.calibrate`: doubling, then integer bisection). Raises
    ValueError when none is found up to ``limit``."""
    lo = max(1, int(lo))
    start = max(lo + 1, 2 * lo) if hi is None else int(hi)
    try:
        return int(calibrate(ok, lo, start, safe="above", integer=True, limit=limit))
    except CalibrationError:
        raise ValueError("no n below the limit satisfies the condition") from None


def clipped_mean_min_n(d: int, epsilon: float, delta: float | None = None,
                       accountant: str = "best") -> int:
    """Smallest n such that the clipped-mean sampler on n' records of dimension d is
    (ε, δ)-DP for *every* n' ≥ n (exact per-coordinate ε₁, composed by ``accountant``).

    ε₁(n) is not monotone (it is ln(1+4/n) at multiples of 4 and smaller in between), so the
    search runs over the envelope: the multiples of 4, then steps down while still fine."""
    from .product import ClippedMeanSampler

    check_epsilon(epsilon)
    sampler = ClippedMeanSampler(delta=delta, accountant=accountant)

    def eps_at(n: int) -> float:
        return sampler.guarantee(n, d).epsilon

    m = min_n(lambda j: eps_at(4 * j) <= epsilon)
    n = 4 * m
    while n > 1 and eps_at(n - 1) <= epsilon:
        n -= 1
    return n

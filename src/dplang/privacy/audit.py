"""Privacy auditors: exact privacy-loss checks and black-box Monte Carlo lower bounds.

Exact checks take the two output distributions of a mechanism on neighbouring inputs (as
probability vectors over the same finite outcome space) and compute the pure privacy loss
max_y |log p(y) − log q(y)| and Rényi divergences D_α(p‖q). They are how the tests show that a
mechanism meets its stated ε or ρ, and that a deliberately broken one does not.

The Monte Carlo auditor runs a black-box mechanism many times on two neighbouring inputs and
returns a statistically valid *lower bound* on its ε (Clopper–Pearson intervals on the
probability of an event): a lower bound above the claimed ε proves a violation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import beta as beta_dist

_TINY = 0.0


def _as_prob(p: Sequence[float] | np.ndarray) -> np.ndarray:
    arr = np.asarray(p, dtype=np.float64)
    if arr.ndim != 1 or np.any(arr < 0) or not np.isfinite(arr).all():
        raise ValueError("a distribution must be a 1-D vector of finite non-negative numbers")
    total = arr.sum()
    if not abs(total - 1.0) < 1e-9:
        raise ValueError(f"probabilities must sum to 1, got {total}")
    return arr


def max_log_ratio(p: Sequence[float] | np.ndarray, q: Sequence[float] | np.ndarray) -> float:
    """Pure privacy loss max_y |log p(y) − log q(y)|; ``inf`` when the supports differ."""
    p, q = _as_prob(p), _as_prob(q)
    if p.shape != q.shape:
        raise ValueError("distributions over different outcome spaces")
    if np.any((p > _TINY) != (q > _TINY)):
        return math.inf
    support = p > _TINY
    return float(np.max(np.abs(np.log(p[support]) - np.log(q[support]))))


def renyi_divergence(
    p: Sequence[float] | np.ndarray, q: Sequence[float] | np.ndarray, alpha: float
) -> float:
    """Exact D_α(p‖q) = log(Σ p^α q^(1−α)) / (α − 1) for α > 1 (``inf`` if p ≪ q fails)."""
    if not alpha > 1:
        raise ValueError(f"alpha must be > 1, got {alpha}")
    p, q = _as_prob(p), _as_prob(q)
    if np.any((p > _TINY) & (q <= _TINY)):
        return math.inf
    s = p > _TINY
    # log-sum-exp of α·log p + (1−α)·log q for stability at large α
    terms = alpha * np.log(p[s]) + (1 - alpha) * np.log(q[s])
    top = terms.max()
    return float((top + math.log(np.exp(terms - top).sum())) / (alpha - 1))


DEFAULT_ALPHAS = (1.01, 1.1, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 100.0, 1000.0)


@dataclass(frozen=True)
class ExactAudit:
    """Worst privacy loss found between pairs of neighbouring output distributions."""

    max_log_ratio: float
    #: max over pairs and both directions of D_α / α, per α.
    renyi_over_alpha: dict[float, float]

    @property
    def rho_lower_bound(self) -> float:
        """max_α D_α/α: the smallest ρ consistent with the observed divergences."""
        return max(self.renyi_over_alpha.values(), default=0.0)

    def satisfies_pure(self, epsilon: float, tol: float = 1e-9) -> bool:
        return self.max_log_ratio <= epsilon + tol

    def satisfies_zcdp(self, rho: float, tol: float = 1e-9) -> bool:
        return self.rho_lower_bound <= rho + tol


def exact_audit(
    pairs: Iterable[tuple[Sequence[float] | np.ndarray, Sequence[float] | np.ndarray]],
    alphas: Sequence[float] = DEFAULT_ALPHAS,
) -> ExactAudit:
    """Audit a mechanism exactly from (law on D, law on D') pairs for neighbouring D ≃ D'.

    Both directions of each pair are checked (zCDP and pure DP are symmetric notions)."""
    worst = 0.0
    renyi = dict.fromkeys(alphas, 0.0)
    for p, q in pairs:
        worst = max(worst, max_log_ratio(p, q))
        for a in alphas:
            renyi[a] = max(renyi[a], renyi_divergence(p, q, a) / a, renyi_divergence(q, p, a) / a)
    return ExactAudit(worst, renyi)


def clopper_pearson(successes: int, trials: int, confidence: float) -> tuple[float, float]:
    """Two-sided Clopper–Pearson interval for a binomial proportion."""
    if trials <= 0 or not 0 <= successes <= trials:
        raise ValueError("need 0 <= successes <= trials and trials > 0")
    a = 1 - confidence
    lo = 0.0 if successes == 0 else float(beta_dist.ppf(a / 2, successes, trials - successes + 1))
    hi = 1.0 if successes == trials else float(
        beta_dist.ppf(1 - a / 2, successes + 1, trials - successes)
    )
    return lo, hi


@dataclass(frozen=True)
class MonteCarloAudit:
    """A black-box audit: a lower bound on ε valid with the stated confidence."""

    epsilon_lower_bound: float
    p_hat: float
    q_hat: float
    trials: int
    confidence: float


def monte_carlo_epsilon_lower_bound(
    run_on_d: Callable[[np.random.Generator], object],
    run_on_d_prime: Callable[[np.random.Generator], object],
    event: Callable[[object], bool],
    trials: int,
    rng: np.random.Generator,
    confidence: float = 0.99,
    delta: float = 0.0,
) -> MonteCarloAudit:
    """Lower-bound ε from P[M(D) ∈ E] ≤ e^ε P[M(D') ∈ E] + δ, with Clopper–Pearson intervals.

    ``run_on_d``/``run_on_d_prime`` each take a Generator and return one output; ``event``
    decides membership. Both orders of (D, D') are tried; the bound holds with probability at
    least ``confidence`` (each interval at (1+confidence)/2, union bound)."""
    hits_d = sum(bool(event(run_on_d(rng))) for _ in range(trials))
    hits_p = sum(bool(event(run_on_d_prime(rng))) for _ in range(trials))
    conf = (1 + confidence) / 2
    d_lo, d_hi = clopper_pearson(hits_d, trials, conf)
    p_lo, p_hi = clopper_pearson(hits_p, trials, conf)

    def bound(num_lo: float, den_hi: float) -> float:
        num = num_lo - delta
        if num <= 0:
            return 0.0
        return max(0.0, math.log(num / den_hi))

    lb = max(bound(d_lo, p_hi), bound(1 - d_hi, 1 - p_lo),
             bound(p_lo, d_hi), bound(1 - p_hi, 1 - d_lo))
    return MonteCarloAudit(lb, hits_d / trials, hits_p / trials, trials, confidence)


def gaussian_privacy_profile(epsilon: float, distance_over_sigma: float) -> float:
    """Exact privacy profile δ(ε) of the Gaussian mechanism (Balle & Wang 2018, Thm 8).

    For outputs f(D) + N(0, σ²I) and f(D′) + N(0, σ²I) with a = ‖f(D) − f(D′)‖₂/σ, the smallest
    δ with P[M(D) ∈ E] ≤ e^ε P[M(D′) ∈ E] + δ for every event E is

        δ(ε) = Φ(a/2 − ε/a) − e^ε Φ(−a/2 − ε/a)

    (symmetric in D, D′). a = 0 gives δ = 0. Computed in log space, so tiny δ do not underflow
    to 0 before they fall below float range. Any post-processing (an argmax, a margin rule) of
    the released vector has a profile at most this one."""
    if not epsilon >= 0 or math.isnan(epsilon):
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    a = float(distance_over_sigma)
    if not a >= 0 or math.isnan(a):
        raise ValueError(f"the distance over sigma must be >= 0, got {a}")
    if a == 0:
        return 0.0
    if math.isinf(a):
        return 1.0
    from scipy.stats import norm

    l1 = float(norm.logcdf(a / 2 - epsilon / a))
    l2 = float(norm.logcdf(-a / 2 - epsilon / a))
    diff = epsilon + l2 - l1
    if diff >= 0:  # pragma: no cover - cannot happen mathematically (δ ≥ 0)
        return 0.0
    return max(0.0, math.exp(l1) * -math.expm1(diff))

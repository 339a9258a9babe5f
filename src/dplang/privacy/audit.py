"""Privacy auditors: exact privacy-loss checks and black-box Monte Carlo lower bounds.

Exact checks take the two output distributions of a mechanism on neighbouring inputs (as
probability vectors over the same finite outcome space) and compute the pure privacy loss
max_y |log p(y) − log q(y)| (:func:`max_log_ratio`, or :func:`max_log_loss` from log-laws), the
exact δ at a given ε (:func:`delta_at_epsilon`: the hockey-stick divergence) and Rényi
divergences D_α(p‖q). They are how the tests show that a mechanism meets its stated ε, δ or ρ,
and that a deliberately broken one does not.

The Monte Carlo auditor runs a black-box mechanism many times on two neighbouring inputs and
returns a statistically valid *lower bound* on its ε (Clopper–Pearson intervals on the
probability of an event): a lower bound above the claimed ε proves a violation.

Every audit of dplang — these, the samplers' (:mod:`dplang.sampling.evaluation`) and the formal
lab's (:mod:`dplang.formal.audit`) — returns one :class:`AuditResult`. Which test audits which
mechanism is recorded on the tests themselves (``@pytest.mark.audits("name")``) and listed in
``docs/privacy.md`` by ``scripts/audit_table.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

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
    with np.errstate(divide="ignore"):
        return max_log_loss(np.log(p), np.log(q))


def max_log_loss(log_p: Sequence[float] | np.ndarray, log_q: Sequence[float] | np.ndarray
                 ) -> float:
    """:func:`max_log_ratio` from log-laws (log 0 = −∞, for laws whose probabilities underflow):
    max |log p − log q| over the common support, ``inf`` when the supports (or the outcome
    spaces) differ, 0 when both are empty."""
    lp = np.asarray(log_p, dtype=np.float64).ravel()
    lq = np.asarray(log_q, dtype=np.float64).ravel()
    fp, fq = np.isfinite(lp), np.isfinite(lq)
    if lp.shape != lq.shape or np.any(fp != fq):
        return math.inf
    return float(np.max(np.abs(lp[fp] - lq[fp]))) if fp.any() else 0.0


def delta_at_epsilon(p: Sequence[float] | np.ndarray, q: Sequence[float] | np.ndarray,
                     epsilon: float) -> float:
    """The exact δ(ε) of the ordered pair (p on D, q on D′): the smallest δ with
    P(E) ≤ e^ε·Q(E) + δ for every event E, Σ_y (p(y) − e^ε q(y))⁺ (the hockey-stick
    divergence; check both orders for a symmetric neighbour relation). Where e^ε overflows
    only the outputs that q cannot produce count; ε = ∞ gives 0."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    if p.shape != q.shape:
        raise ValueError("distributions over different outcome spaces")
    if not epsilon >= 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    if math.isinf(epsilon):  # an infinite ε bounds nothing: no δ is needed
        return 0.0
    e_eps = math.exp(epsilon) if epsilon < 709.0 else math.inf  # exp overflows from 709.8
    with np.errstate(invalid="ignore", over="ignore"):
        excess = np.where(q > 0, p - e_eps * q, p)
    return float(np.maximum(excess, 0.0).sum())


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
class AuditResult:
    """What a privacy audit found, and its verdict on the claim it was given.

    The one result type of every audit in dplang: exact audits (the output laws on
    neighbouring inputs are known exactly) fill ``max_log_ratio``, ``delta_at_epsilon`` and
    ``renyi_over_alpha``; Monte Carlo audits fill ``epsilon_lower_bound`` (a lower bound on the
    true ε, so ``passed`` means only that no violation was detected). Fields an audit does not
    compute keep their defaults (NaN, None, empty).

    Attributes:
        mechanism: what was audited (a label).
        method: ``"exact"`` or ``"monte-carlo"``; ``output_space`` and ``reason`` say why, where
            an audit chooses (:mod:`dplang.formal.audit`).
        epsilon, delta: the claim audited (ε = None: no claim, ``passed`` is None).
        passed: the verdict, by the audit's own rule (and tolerance).
        pairs: the neighbour pairs compared; ``worst_pair`` the one that attained the maximum.
        max_log_ratio: max over pairs, both directions and outputs of |log p − log q| (∞ when
            the supports differ, NaN when not computed).
        delta_at_epsilon: max over pairs (both directions) of the exact δ at the claimed ε.
        renyi_over_alpha: max over pairs and both directions of D_α/α, per α.
        epsilon_lower_bound: the Monte Carlo lower bound ε̂.
        sensitivity, claimed_sensitivity: the largest change of the released statistic found,
            and the one the calibration assumes.
        detail: what was compared, in words; ``notes``: audit-specific numbers.
    """

    mechanism: str = ""
    method: str = "exact"
    epsilon: float | None = None
    delta: float = 0.0
    passed: bool | None = None
    pairs: int = 0
    worst_pair: Any = None
    max_log_ratio: float = math.nan
    delta_at_epsilon: float | None = None
    renyi_over_alpha: dict[float, float] = field(default_factory=dict)
    epsilon_lower_bound: float | None = None
    sensitivity: float | None = None
    claimed_sensitivity: float | None = None
    output_space: float | None = None
    reason: str = ""
    detail: str = ""
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def rho_lower_bound(self) -> float:
        """max_α D_α/α: the smallest ρ consistent with the observed divergences."""
        return max(self.renyi_over_alpha.values(), default=0.0)

    def satisfies_pure(self, epsilon: float, tol: float = 1e-9) -> bool:
        return self.max_log_ratio <= epsilon + tol

    def satisfies_zcdp(self, rho: float, tol: float = 1e-9) -> bool:
        return self.rho_lower_bound <= rho + tol

    @property
    def statistic(self) -> float:
        """The number the verdict rests on: ε̂ (Monte Carlo), the exact δ(ε) (a claim with
        δ > 0 audited through δ), or the exact pure loss."""
        if self.method == "monte-carlo":
            return math.nan if self.epsilon_lower_bound is None else self.epsilon_lower_bound
        if self.delta > 0 and self.delta_at_epsilon is not None:
            return self.delta_at_epsilon
        return self.max_log_ratio

    def line(self) -> str:
        """One line: the verdict, the statistic against the claim, and what was compared."""
        verdict = "PASS" if self.passed else "FAIL"
        eps = math.inf if self.epsilon is None else self.epsilon
        if self.method == "exact":
            what = (f"max δ(ε) = {self.statistic:.3g} (target δ = {self.delta:g}, "
                    f"ε = {eps:g})" if self.delta > 0 else
                    f"max exact privacy loss = {self.statistic:.6g} (ε = {eps:g})")
        else:
            what = (f"Monte Carlo lower bound ε̂ = {self.statistic:.4g} (claimed ε = "
                    f"{eps:g}" + (f", δ = {self.delta:g}" if self.delta else "") + ")")
        over = self.detail or f"{self.pairs} neighbour pairs"
        return f"{verdict} {self.mechanism}: {what} over {over}"

    def method_line(self) -> str:
        return f"method: {self.method} ({self.reason})"


def exact_audit(
    pairs: Iterable[tuple[Sequence[float] | np.ndarray, Sequence[float] | np.ndarray]],
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    epsilon: float | None = None,
) -> AuditResult:
    """Audit a mechanism exactly from (law on D, law on D') pairs for neighbouring D ≃ D'.

    Both directions of each pair are checked (zCDP and pure DP are symmetric notions). With
    ``epsilon``, also the exact δ at that ε (``delta_at_epsilon``)."""
    worst = 0.0
    renyi = dict.fromkeys(alphas, 0.0)
    worst_delta = 0.0
    count = 0
    for p, q in pairs:
        count += 1
        worst = max(worst, max_log_ratio(p, q))
        for a in alphas:
            renyi[a] = max(renyi[a], renyi_divergence(p, q, a) / a, renyi_divergence(q, p, a) / a)
        if epsilon is not None:
            worst_delta = max(worst_delta, delta_at_epsilon(p, q, epsilon),
                              delta_at_epsilon(q, p, epsilon))
    return AuditResult(epsilon=epsilon, pairs=count, max_log_ratio=worst,
                       delta_at_epsilon=worst_delta if epsilon is not None else None,
                       renyi_over_alpha=renyi)


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


def monte_carlo_epsilon_lower_bound(
    run_on_d: Callable[[np.random.Generator], object],
    run_on_d_prime: Callable[[np.random.Generator], object],
    event: Callable[[object], bool],
    trials: int,
    rng: np.random.Generator,
    confidence: float = 0.99,
    delta: float = 0.0,
) -> AuditResult:
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
    return AuditResult(method="monte-carlo", delta=delta, epsilon_lower_bound=lb, pairs=1,
                       notes={"p_hat": hits_d / trials, "q_hat": hits_p / trials,
                              "trials": trials, "confidence": confidence})


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

"""Why free text cannot be evidence: Theorems 4.1 and 4.2 of the evidence-
insights paper (:mod:`dplang.reports`), evaluated exactly (E5 in ``docs/reports.md``).

Theorem 4.1: for any ε-DP mechanism A and corpora R₀, R₁ at (replacement) distance ≤ k,
d_TV(A(R₀), A(R₁)) ≤ (e^{kε} − 1)/(e^{kε} + 1) = tanh(kε/2), and every test φ of
H₀: "the output came from R₀" against H₁ errs with total probability
E₀[φ] + E₁[1 − φ] ≥ 1 − d_TV ≥ 2/(e^{kε} + 1). Theorem 4.2: any support estimator f̂ computed
from one output has max_i E_i|f̂ − a_i| ≥ (Δ/4)(1 − d_TV) ≥ Δ/(2(e^{kε} + 1)), a_i = f_s(R_i),
Δ = |a₁ − a₀|.

This module gives the bounds as functions, the **sharp** group bound (below), a few mechanisms
whose output law is known exactly as a function of support counts — randomized response, a
(discrete) Laplace count, an exponential-mechanism "free-text generator" that writes one
statement chosen by its support count, and the extremal "staircase" mechanism — and exact
evaluators: total variation of a pair, the best test's error (1 − d_TV), the minimax risk of
the best estimator, the exact pure-DP privacy loss over neighbouring counts, and a check that
flags a mechanism whose distance exceeds a bound.

**The sharp bound for k ≥ 2.** tanh(kε/2) is what a kε-DP mechanism can reach at distance 1
(randomized response with parameter kε attains it), but an ε-DP mechanism at distance k is more
constrained: along a path R₀ = S₀, S₁, …, S_k = R₁ of neighbours, the probabilities
p_c = Pr[A(S_c) ∈ E] of any event must satisfy p_{c+1} ≤ e^ε p_c and
1 − p_{c+1} ≥ e^{−ε}(1 − p_c) at every step. Maximising p_k − p₀ over such chains gives
(:func:`group_tv_bound`)

    k even:  1 − e^{−kε/2}          k odd:  1 − 2e^{−(k−1)ε/2}/(1 + e^ε),

equal to tanh(kε/2) at k = 1 and strictly below it for k ≥ 2 (ε > 0). The bound is attained by
:class:`StaircaseCount` (a Bernoulli whose success probability follows the extremal chain in a
clipped support count) and by the discrete Laplace count at every k, and for even k also by the
continuous Laplace count of scale 1/ε, whose d_TV at distance k is 1 − e^{−kε/2}.

Privacy contracts: the bound functions and evaluators read no private data (they evaluate known
laws); each mechanism class states its own contract in its docstring. The mechanisms here are
for the E5 experiment; dplang's reports use :mod:`dplang.reports.mechanism`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from scipy.optimize import minimize_scalar

__all__ = [
    "DiscreteLaplaceCount",
    "ExactMechanism",
    "ExponentialMechanismGenerator",
    "LaplaceCount",
    "PairEvaluation",
    "PaperConsistency",
    "RandomizedResponse",
    "StaircaseCount",
    "best_test_error",
    "check_pair",
    "estimation_lower_bound",
    "group_tv_bound",
    "minimax_estimation_risk",
    "paper_identity_check",
    "pure_dp_loss",
    "testing_error_lower_bound",
    "total_variation",
    "tv_upper_bound",
]


# --------------------------------------------------------------------------------------------
# The bounds


def _check(k: int, epsilon: float) -> None:
    if k < 0 or int(k) != k:
        raise ValueError(f"k must be a non-negative integer, got {k}")
    if not (epsilon >= 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be finite and >= 0, got {epsilon}")


def tv_upper_bound(k: int, epsilon: float) -> float:
    """Theorem 4.1: (e^{kε} − 1)/(e^{kε} + 1) = tanh(kε/2)."""
    _check(k, epsilon)
    return math.tanh(k * epsilon / 2.0)


def testing_error_lower_bound(k: int, epsilon: float) -> float:
    """Theorem 4.1: every test's type-I + type-II error is ≥ 2/(e^{kε} + 1) = 1 − tanh(kε/2)."""
    _check(k, epsilon)
    x = k * epsilon
    return 2.0 / (math.exp(x) + 1.0) if x < 700 else 0.0


def estimation_lower_bound(gap: float, k: int, epsilon: float, tv: float | None = None
                           ) -> float:
    """Theorem 4.2: (Δ/4)(1 − d_TV), with d_TV = ``tv`` when given, else its upper bound
    tanh(kε/2), which gives Δ/(2(e^{kε} + 1))."""
    _check(k, epsilon)
    d = tv_upper_bound(k, epsilon) if tv is None else float(tv)
    return abs(gap) / 4.0 * (1.0 - d)


def group_tv_bound(k: int, epsilon: float) -> float:
    """The sharp bound on d_TV between the outputs of an ε-DP mechanism on corpora at distance
    k (module docstring): 1 − e^{−kε/2} for even k, 1 − 2e^{−(k−1)ε/2}/(1 + e^ε) for odd k.
    Equals tanh(kε/2) at k = 1, is below it for k ≥ 2.

    Proof sketch: along a path of k neighbours the probability of an event can grow at most
    by p ↦ min(e^ε p, 1 − e^{−ε}(1 − p)) per step (both the event and its complement obey
    ε-DP); this map is increasing, so the best chain applies it k times, and the best start is
    the one that makes the chain symmetric about 1/2. The tests compare the formula with a
    brute-force maximisation over chains."""
    _check(k, epsilon)
    if k == 0:
        return 0.0
    j = k // 2
    if k % 2 == 0:
        return -math.expm1(-j * epsilon)
    return 1.0 - 2.0 * math.exp(-j * epsilon) / (1.0 + math.exp(epsilon))


def _chain_step(p: np.ndarray, epsilon: float) -> np.ndarray:
    return np.minimum(math.exp(epsilon) * p, 1.0 - math.exp(-epsilon) * (1.0 - p))


# --------------------------------------------------------------------------------------------
# Mechanisms with exact laws


class ExactMechanism(Protocol):
    """A mechanism whose output law is a known function of the corpus' support counts.

    ``law(counts)`` returns the probabilities of its finitely many outputs; ``counts`` is the
    vector of support counts C_s = Σ_r σ_s(r) of the statements the mechanism reads (one entry
    for the count mechanisms). Under replace-one adjacency each C_s changes by at most 1
    between neighbours."""

    epsilon: float
    name: str

    def law(self, counts: Sequence[int]) -> np.ndarray: ...


@dataclass(frozen=True)
class RandomizedResponse:
    """Binary randomized response on the bit b = [C ≥ cutoff]: outputs b with probability
    e^ε/(1 + e^ε), else 1 − b.

    Privacy contract: ε-DP under replace-one adjacency (one record moves C by ≤ 1, so b
    changes at most once; the two output laws have ratio exactly e^ε). With parameter kε it
    is the mechanism that attains Theorem 4.1's bound at distance 1."""

    epsilon: float
    cutoff: int = 1
    name: str = "randomized response"

    def law(self, counts: Sequence[int]) -> np.ndarray:
        b = int(counts[0] >= self.cutoff)
        keep = 1.0 / (1.0 + math.exp(-self.epsilon))
        return np.array([1.0 - keep, keep]) if b else np.array([keep, 1.0 - keep])


@dataclass(frozen=True)
class DiscreteLaplaceCount:
    """The support count plus discrete Laplace noise, P(Z = z) ∝ e^{−ε|z|}, reported clamped to
    the window [lo, hi] (values below lo reported as lo, above hi as hi).

    Privacy contract: ε-DP under replace-one adjacency (sensitivity 1); the clamp is
    post-processing, and it makes the output set finite so the law is exact (the tail mass
    beyond the window is kept in the two end points, not dropped)."""

    epsilon: float
    lo: int = -60
    hi: int = 80
    name: str = "discrete Laplace count"

    def law(self, counts: Sequence[int]) -> np.ndarray:
        c = int(counts[0])
        if not self.lo <= c <= self.hi:
            raise ValueError(f"count {c} outside the window [{self.lo}, {self.hi}]")
        y = np.arange(self.lo, self.hi + 1)
        a = math.exp(-self.epsilon)
        pmf = (1 - a) / (1 + a) * np.exp(-self.epsilon * np.abs(y - c))
        # tails: P(Z ≤ −t) = P(Z ≥ t) = a^t/(1+a) for t ≥ 1
        pmf[0] += a ** (c - self.lo + 1) / (1 + a)  # P(Z < lo − c)
        pmf[-1] += a ** (self.hi - c + 1) / (1 + a)  # P(Z > hi − c)
        return pmf / pmf.sum()


@dataclass(frozen=True)
class LaplaceCount:
    """The support count plus continuous Laplace noise of scale 1/ε (the output is a real
    number; :meth:`tv` gives the exact distance between two counts in closed form).

    Privacy contract: ε-DP under replace-one adjacency (sensitivity 1)."""

    epsilon: float
    name: str = "Laplace count"

    def tv(self, c0: float, c1: float) -> float:
        """d_TV(Lap(c0, 1/ε), Lap(c1, 1/ε)) = 1 − e^{−ε|c1 − c0|/2}."""
        return -math.expm1(-self.epsilon * abs(c1 - c0) / 2.0)


@dataclass(frozen=True)
class ExponentialMechanismGenerator:
    """A toy "free-text generator": writes one of M statements, chosen with probability
    ∝ exp(ε·C_s/2) where C_s is the statement's support count (the exponential mechanism with
    utility = support count, sensitivity 1).

    Privacy contract: ε-DP under replace-one adjacency, even when one record changes every
    statement's count (each by at most 1)."""

    epsilon: float
    name: str = "exponential-mechanism generator"

    def law(self, counts: Sequence[int]) -> np.ndarray:
        u = self.epsilon * np.asarray(counts, dtype=np.float64) / 2.0
        w = np.exp(u - u.max())
        return w / w.sum()


@dataclass(frozen=True)
class StaircaseCount:
    """The extremal mechanism for distance k: outputs 1 with probability p_{clip(C − c₀, 0, k)}
    where p₀, …, p_k is the chain of :func:`group_tv_bound` (p_{c+1} = min(e^ε p_c,
    1 − e^{−ε}(1 − p_c)), started where the chain is symmetric about 1/2).

    Privacy contract: ε-DP under replace-one adjacency: neighbouring corpora have clipped counts
    at most one step apart and consecutive chain values satisfy both ε-DP ratios (checked
    exactly by :func:`pure_dp_loss` in the tests)."""

    epsilon: float
    k: int
    c0: int = 0
    name: str = "staircase (extremal)"

    def chain(self) -> np.ndarray:
        e, k = self.epsilon, self.k
        j = k // 2
        start = (0.5 * math.exp(-j * e) if k % 2 == 0
                 else math.exp(-j * e) / (1.0 + math.exp(e)))
        p = [start]
        for _ in range(k):
            p.append(float(_chain_step(np.array([p[-1]]), e)[0]))
        return np.array(p)

    def law(self, counts: Sequence[int]) -> np.ndarray:
        c = min(max(int(counts[0]) - self.c0, 0), self.k)
        p1 = self.chain()[c]
        return np.array([1.0 - p1, p1])


# --------------------------------------------------------------------------------------------
# Exact evaluation


def total_variation(p0: np.ndarray, p1: np.ndarray) -> float:
    """½ Σ |p0 − p1| (exact for finite laws)."""
    return 0.5 * float(np.abs(np.asarray(p0, float) - np.asarray(p1, float)).sum())


def best_test_error(p0: np.ndarray, p1: np.ndarray) -> float:
    """The smallest type-I + type-II error of any (randomised) test between two laws:
    Σ_y min(p0(y), p1(y)) = 1 − d_TV (the likelihood-ratio test attains it)."""
    return float(np.minimum(np.asarray(p0, float), np.asarray(p1, float)).sum())


def minimax_estimation_risk(p0: np.ndarray, p1: np.ndarray, a0: float, a1: float) -> float:
    """min over estimators f̂: outputs → ℝ of max_i E_{P_i}|f̂(Y) − a_i|, exactly.

    By the minimax theorem (the risk is linear in the prior and convex in f̂) this is the
    largest Bayes risk over priors λ on {0, 1}; for a prior, the Bayes estimator puts f̂(y) on
    whichever of a0, a1 has the larger posterior weight, with risk
    Δ Σ_y min(λ p0(y), (1 − λ) p1(y)), a concave function of λ maximised numerically.
    At λ = ½ it is (Δ/2)(1 − d_TV), so the result is ≥ (Δ/2)(1 − d_TV) — twice Theorem 4.2's
    (Δ/4)(1 − d_TV)."""
    p0 = np.asarray(p0, dtype=np.float64)
    p1 = np.asarray(p1, dtype=np.float64)
    gap = abs(a1 - a0)

    def neg(lam: float) -> float:
        return -gap * float(np.minimum(lam * p0, (1.0 - lam) * p1).sum())

    res = minimize_scalar(neg, bounds=(0.0, 1.0), method="bounded",
                          options={"xatol": 1e-12})
    return max(-float(res.fun), -neg(0.5))


def pure_dp_loss(mechanism: ExactMechanism, counts: Sequence[Sequence[int]],
                 neighbours: Sequence[Sequence[int]]) -> float:
    """The exact pure-DP privacy loss max_y |ln P(y | c) − ln P(y | c′)| over the given pairs
    of neighbouring count vectors (``counts[i]`` ~ ``neighbours[i]``); ∞ if a law has a zero
    where its neighbour has not."""
    worst = 0.0
    for c, c2 in zip(counts, neighbours, strict=True):
        a, b = mechanism.law(c), mechanism.law(c2)
        if np.any((a == 0) != (b == 0)):
            return math.inf
        pos = a > 0
        worst = max(worst, float(np.max(np.abs(np.log(a[pos]) - np.log(b[pos])))))
    return worst


@dataclass(frozen=True)
class PairEvaluation:
    """Exact quantities of one mechanism on one pair of corpora at distance k."""

    mechanism: str
    k: int
    epsilon: float
    tv: float
    tv_bound: float
    sharp_bound: float
    test_error: float
    test_error_bound: float
    risk: float | None
    risk_bound: float | None

    @property
    def above_theorem(self) -> bool:
        """d_TV exceeds Theorem 4.1's tanh(kε/2): the mechanism cannot be ε-DP."""
        return self.tv > self.tv_bound + 1e-12

    @property
    def above_sharp(self) -> bool:
        """d_TV exceeds the sharp group bound: the mechanism cannot be ε-DP."""
        return self.tv > self.sharp_bound + 1e-12

    @property
    def flagged(self) -> bool:
        return self.above_theorem or self.above_sharp


def check_pair(mechanism: ExactMechanism, counts0: Sequence[int], counts1: Sequence[int],
               k: int, epsilon: float | None = None, supports: tuple[float, float] | None = None
               ) -> PairEvaluation:
    """Evaluate ``mechanism`` exactly on two corpora at distance ``k`` (given by their support
    counts) against the bounds for the ε it *claims* (``epsilon``, default its own): d_TV,
    the best test's error, and with ``supports = (a0, a1)`` the minimax estimation risk.
    ``flagged`` is True when the pair proves the claim false."""
    eps = mechanism.epsilon if epsilon is None else epsilon
    p0, p1 = mechanism.law(counts0), mechanism.law(counts1)
    tv = total_variation(p0, p1)
    risk = risk_bound = None
    if supports is not None:
        a0, a1 = supports
        risk = minimax_estimation_risk(p0, p1, a0, a1)
        risk_bound = estimation_lower_bound(a1 - a0, k, eps)
    return PairEvaluation(mechanism.name, k, eps, tv, tv_upper_bound(k, eps),
                          group_tv_bound(k, eps), best_test_error(p0, p1),
                          testing_error_lower_bound(k, eps), risk, risk_bound)


# --------------------------------------------------------------------------------------------
# Paper-number checks (claims 16-17)


@dataclass(frozen=True)
class PaperConsistency:
    """Whether reported, rounded numbers are consistent with an identity: the range the
    identity gives when each input ranges over its rounding interval, against the rounding
    interval of the reported value."""

    predicted: float
    predicted_range: tuple[float, float]
    reported: float
    reported_range: tuple[float, float]

    @property
    def consistent(self) -> bool:
        lo, hi = self.predicted_range
        rlo, rhi = self.reported_range
        return lo <= rhi and rlo <= hi


def _rounding(x: float, decimals: int) -> tuple[float, float]:
    h = 0.5 * 10.0 ** (-decimals)
    return x - h, x + h


def paper_identity_check(false_emission: float, emit_rate: float, p_theta: float,
                         unsupported_emit: float, decimals: int = 3,
                         conditional: bool = True) -> PaperConsistency:
    """Claim 17: UnsupportedEmit = FalseEmission·EmitRate/(1 − p_θ) (conditional rate
    |O∩U|/|U|), or FalseEmission·EmitRate (``conditional=False``: the |O∩U|/m normalisation),
    with every reported number read as rounded to ``decimals`` places (p_θ is treated as
    exact: it is back-solved, not reported).

    For pooled metrics on a fixed candidate list the identity is exact algebra:
    |O∩U|/|U| = (|O∩U|/|O|)·(|O|/(mR))/(|U|/(mR))."""
    fe = _rounding(false_emission, decimals)
    er = _rounding(emit_rate, decimals)
    scale = 1.0 / (1.0 - p_theta) if conditional else 1.0
    predicted = false_emission * emit_rate * scale
    return PaperConsistency(predicted, (fe[0] * er[0] * scale, fe[1] * er[1] * scale),
                            unsupported_emit, _rounding(unsupported_emit, decimals))

"""The theorems' bounds, as functions that return a number or a failed precondition.

Each upper bound checks the theorem's conditions against the ground truth it is given and
returns :class:`FailedPrecondition` (falsy, with the reason) instead of a number when one fails
— e.g. Cor 4.7 with a mass floor ρ₀ above the true ρ_n, which the paper's "no public bound"
reading invites (spec 000 §7). Upper bounds use the exact exponential-mechanism constants
reconstructed in spec 000 §3 ((K−1)e^{…} rather than the paper's possibly weaker printed ones).

Paper 000: :func:`thm32_soft_margin` (Alg 1), :func:`thm33_gaussian_margin` (Alg 2),
:func:`thm45_prefix_count` (Alg 3), :func:`thm46_joint_threshold` (Alg 6),
:func:`cor47_mass_floor`, :func:`thm49_gaussian_threshold` (Alg 7), the lower bounds
:func:`thm54_identification_lower` (F.7) and :func:`thm56_generation_lower` (F.19).

Paper 001: :func:`thmC1_good_probability` and :func:`thmC1_continual_failure` (uniform
generator), :func:`thmC3_paper_lower` (the printed constant, erratum E3),
:func:`repaired_lower_bound` (§3.5), :func:`sperner_lp_epsilon` (the optimal n = 1 mechanism by
linear programming), :func:`thmC5_epoch_error` (Alg 2), :func:`alg1_bad_event` and
:func:`alg3_mistake_bounds` (§3.4).

Privacy contract: none — closed-form arithmetic on public parameters.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from math import comb

import numpy as np
from scipy.optimize import linprog
from scipy.special import logsumexp

from ..privacy.calibration import calibrate

__all__ = [
    "Bound",
    "FailedPrecondition",
    "alg1_bad_event",
    "alg3_mistake_bounds",
    "cor47_mass_floor",
    "repaired_lower_bound",
    "sperner_lp_epsilon",
    "thm32_soft_margin",
    "thm33_gaussian_margin",
    "thm45_prefix_count",
    "thm46_joint_threshold",
    "thm49_gaussian_threshold",
    "thm54_identification_lower",
    "thm56_generation_lower",
    "thmC1_continual_failure",
    "thmC1_good_probability",
    "thmC3_paper_lower",
    "thmC5_epoch_error",
]


@dataclass(frozen=True)
class Bound:
    """A bound's value (and its log, for values below float range) with its terms."""

    theorem: str
    value: float
    log_value: float
    kind: str = "upper"
    terms: dict[str, float] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return True

    def __str__(self) -> str:
        return f"{self.theorem}: {self.kind} bound {self.value:.4g}"


@dataclass(frozen=True)
class FailedPrecondition:
    """A theorem whose conditions do not hold: no number is returned."""

    theorem: str
    reason: str

    value = None

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return f"{self.theorem} does not apply: {self.reason}"


def _sum_logs(theorem: str, terms: dict[str, float], kind: str = "upper") -> Bound:
    """Build a Bound from log-terms {name: log value}."""
    logs = [v for v in terms.values() if v > -math.inf]
    lv = float(logsumexp(logs)) if logs else -math.inf
    return Bound(theorem, math.exp(lv) if lv > -745 else 0.0, lv, kind,
                 {k: (math.exp(v) if v > -745 else 0.0) for k, v in terms.items()})


def _log(x: float) -> float:
    return math.log(x) if x > 0 else -math.inf


# =============================================================================================
# Paper 000 — upper bounds
# =============================================================================================


def _id_conditions(theorem: str, k: int, i_star: int,
                   gap: float | None) -> FailedPrecondition | None:
    if k < i_star:
        return FailedPrecondition(theorem, f"k(n) = {k} < i* = {i_star} (the optimum is beyond "
                                           "the horizon)")
    if gap is not None and 1.0 / k > gap / 2 + 1e-15:
        return FailedPrecondition(theorem, f"the margin 1/k = {1 / k:.4g} exceeds Δ/2 = "
                                           f"{gap / 2:.4g}")
    return None


def thm32_soft_margin(n: int, k: int, epsilon: float, i_star: int,
                      gap: float | None) -> Bound | FailedPrecondition:
    """Thm 3.2 / D.8 (Alg 1): Err_ID ≤ 2K e^{−n/(8K²)} + (K−1) e^{−εn/(8K²)} once K ≥ i* and
    1/K ≤ Δ/2."""
    fail = _id_conditions("Thm 3.2", k, i_star, gap)
    if fail is not None:
        return fail
    return _sum_logs("Thm 3.2", {
        "statistical": math.log(2 * k) - n / (8 * k * k),
        "privacy": _log(k - 1) - epsilon * n / (8 * k * k)})


def thm33_gaussian_margin(n: int, k: int, epsilon: float, delta: float, i_star: int,
                          gap: float | None) -> Bound | FailedPrecondition:
    """Thm 3.3 / D.14 (Alg 2): 2K e^{−n/(8K²)} + 2K e^{−ε²n²/(64K³ ln(1.25/δ))}, ε < 1."""
    if not 0 < epsilon < 1:
        return FailedPrecondition("Thm 3.3",
                                  f"needs ε ∈ (0, 1) (classical Gaussian), got {epsilon}")
    fail = _id_conditions("Thm 3.3", k, i_star, gap)
    if fail is not None:
        return fail
    return _sum_logs("Thm 3.3", {
        "statistical": math.log(2 * k) - n / (8 * k * k),
        "privacy": math.log(2 * k) - epsilon**2 * n**2 / (64 * k**3 * math.log(1.25 / delta))})


def _gen_conditions(theorem: str, n: int, k: int, window: int, tau: float, big_r: int,
                    i_circ: int | None, m_star: float,
                    rho: float | None) -> FailedPrecondition | None:
    if i_circ is None:
        return FailedPrecondition(theorem, "no language of the horizon is inside supp D "
                                           "(Assumption 4.3)")
    if k < i_circ:
        return FailedPrecondition(theorem, f"k(n) = {k} < i° = {i_circ}")
    if window < m_star:
        return FailedPrecondition(theorem, f"the window {window} is below the witness index "
                                           f"m* = {m_star}")
    if rho is not None and tau > n * rho / 2 * (1 + 1e-12):
        return FailedPrecondition(theorem, f"τ = {tau:g} > nρ/2 = {n * rho / 2:g} (coverage "
                                           "is not guaranteed)")
    if big_r < n:
        return FailedPrecondition(theorem, f"R = {big_r} < n")
    return None


def thm45_prefix_count(n: int, k: int, epsilon: float, tau: float, big_m: int, big_r: int,
                       i_circ: int | None, m_star: float, rho: float | None,
                       coverage_size: int) -> Bound | FailedPrecondition:
    """Thm 4.5 / E.11 (Alg 3): |J°| e^{−nρ/8} + (K−1) e^{−ετ/2} + n/R, when M ≥ m*, K ≥ i°
    and τ ≤ nρ/2."""
    fail = _gen_conditions("Thm 4.5", n, k, big_m, tau, big_r, i_circ, m_star, rho)
    if fail is not None:
        return fail
    return _sum_logs("Thm 4.5", {
        "coverage": _log(coverage_size) - n * (rho or 0) / 8 if rho else -math.inf,
        "privacy": _log(k - 1) - epsilon * tau / 2,
        "collision": math.log(n) - math.log(big_r)})


def thm46_joint_threshold(n: int, k: int, epsilon: float, tau: float, mbar: int, big_r: int,
                          i_circ: int | None, m_star: float, rho_n: float | None,
                          coverage_size: int) -> Bound | FailedPrecondition:
    """Thm 4.6 / E.20 (Alg 6): |J°_n| e^{−nρ_n/8} + K M̄ e^{−ετ(M̄−m*+1)/(2M̄)} + n/R."""
    fail = _gen_conditions("Thm 4.6", n, k, mbar, tau, big_r, i_circ, m_star, rho_n)
    if fail is not None:
        return fail
    return _sum_logs("Thm 4.6", {
        "coverage": _log(coverage_size) - n * (rho_n or 0) / 8 if rho_n else -math.inf,
        "privacy": math.log(k * mbar) - epsilon * tau * (mbar - m_star + 1) / (2 * mbar),
        "collision": math.log(n) - math.log(big_r)})


def cor47_mass_floor(n: int, k: int, epsilon: float, mbar: int, big_r: int, rho0: float,
                     i_circ: int | None, m_star: float,
                     rho_n: float | None) -> Bound | FailedPrecondition:
    """Cor 4.7 / E.21: with a mass floor ρ₀ ≤ ρ_n, τ = ρ₀n/2 and M̄ ≥ 2m*:
    Err ≤ M̄ e^{−nρ₀/8} + K M̄ e^{−ερ₀n/8} + n/R.

    Refused when ρ₀ > ρ_n: the floor must hold for the threshold horizon actually used, and
    ρ_n → 0 as M̄ grows — the corollary is not a "no public bound" result (spec 000 §7)."""
    if rho_n is None or rho0 > rho_n * (1 + 1e-12):
        return FailedPrecondition("Cor 4.7", f"the mass floor ρ₀ = {rho0:g} exceeds "
                                             f"ρ_n = {rho_n} for M̄ = {mbar}")
    if mbar < 2 * m_star:
        return FailedPrecondition("Cor 4.7", f"M̄ = {mbar} < 2m* = {2 * m_star}")
    if i_circ is None or k < i_circ:
        return FailedPrecondition("Cor 4.7", f"k(n) = {k} < i° = {i_circ}")
    return _sum_logs("Cor 4.7", {
        "coverage": math.log(mbar) - n * rho0 / 8,
        "privacy": math.log(k * mbar) - epsilon * rho0 * n / 8,
        "collision": math.log(n) - math.log(big_r)})


def thm49_gaussian_threshold(n: int, k: int, epsilon: float, delta: float, tau: float,
                             mbar: int, big_r: int, i_circ: int | None, m_star: float,
                             rho_n: float | None,
                             coverage_size: int) -> Bound | FailedPrecondition:
    """Thm 4.9 / E.27 (Alg 7): |J°_n| e^{−nρ_n/8}
    + 2K M̄ exp(−ε²τ²(M̄−m*+1)²/(16 K M̄³ ln(1.25/δ))) + n/R, ε < 1."""
    if not 0 < epsilon < 1:
        return FailedPrecondition("Thm 4.9", f"needs ε ∈ (0, 1), got {epsilon}")
    fail = _gen_conditions("Thm 4.9", n, k, mbar, tau, big_r, i_circ, m_star, rho_n)
    if fail is not None:
        return fail
    gap = mbar - m_star + 1
    return _sum_logs("Thm 4.9", {
        "coverage": _log(coverage_size) - n * (rho_n or 0) / 8 if rho_n else -math.inf,
        "privacy": math.log(2 * k * mbar) - (epsilon * tau * gap) ** 2 / (
            16 * k * mbar**3 * math.log(1.25 / delta)),
        "collision": math.log(n) - math.log(big_r)})


# =============================================================================================
# Paper 000 — lower bounds (group privacy + coupling)
# =============================================================================================


def _group_delta(distance: float, epsilon: float, delta: float) -> float:
    """δ after group privacy over ⌊D⌋ changes: ⌊D⌋·e^{(⌊D⌋−1)ε}·δ (∞-safe)."""
    if delta == 0:
        return 0.0
    d = math.floor(distance)
    if d <= 0:
        return 0.0
    log = math.log(d) + (d - 1) * epsilon + math.log(delta)
    return math.exp(min(log, 700.0))


def _lower(theorem: str, success: float, epsilon: float, distance: float,
           delta: float) -> Bound:
    """α ≥ (success − δ_D)/(1 + e^{εD}) in log space (0 when vacuous)."""
    num = success - _group_delta(distance, epsilon, delta)
    if num <= 0 or math.isinf(epsilon):
        return Bound(theorem, 0.0, -math.inf, "lower")
    lv = math.log(num) - float(np.logaddexp(0.0, epsilon * distance))
    return Bound(theorem, math.exp(lv) if lv > -745 else 0.0, lv, "lower")


def thm54_identification_lower(n: int, epsilon: float, p: float = 0.25,
                               delta: float = 0.0) -> Bound:
    """Thm 5.4 / F.7: any ε-DP identifier has max_{D1,D2} Err_ID ≥ p·α with
    α ≥ (1 − e^{−pn/3})/(1 + e^{2εpn}) on the IPP pair (Hamming distance D = 2pn).

    With δ > 0 the coupling lemma uses group privacy for (ε, δ) (δ_D = ⌊D⌋e^{(⌊D⌋−1)ε}δ); the
    bound is then usually vacuous (0), which the algorithms trivially meet. ε = ∞ gives 0."""
    a = _lower("Thm 5.4", 1 - math.exp(-p * n / 3), epsilon, 2 * p * n, delta)
    lv = a.log_value + math.log(p)
    return Bound("Thm 5.4", math.exp(lv) if lv > -745 else 0.0, lv, "lower")


def thm56_generation_lower(n: int, epsilon: float, p: float = 0.25,
                           delta: float = 0.0) -> Bound:
    """Thm 5.6 / F.19: any ε-DP generator has
    max_{D1,D2} Err_GEN ≥ (1 − pⁿ − e^{−pn/3})/(1 + e^{2εpn}) on the IIDP pair."""
    return _lower("Thm 5.6", 1 - p**n - math.exp(-p * n / 3), epsilon, 2 * p * n, delta)


# =============================================================================================
# Paper 001
# =============================================================================================


def thmC1_good_probability(n: int, k: int, d: int, epsilon: float) -> Bound:
    """Thm C.1 (one-shot): P(good) ≥ 1 − 4 e^{−ε(n−d)/(2k)} (element success: 5 instead of 4)."""
    x = -epsilon * (n - d) / (2 * k)
    return Bound("Thm C.1", 1 - 4 * math.exp(x), math.log1p(-4 * math.exp(x))
                 if 4 * math.exp(x) < 1 else -math.inf, "lower",
                 {"element": 1 - 5 * math.exp(x)})


def thmC1_continual_failure(epoch: int, k: int, epsilon: float, terms: int = 200) -> Bound:
    """Thm C.1 (continual release): failure from epoch t on is at most
    5 Σ_{t′≥t} exp(−(3/π²)(ε/k)2^{t′}/t′²)."""
    logs = [math.log(5) - (3 / math.pi**2) * (epsilon / k) * 2.0**t / t**2
            for t in range(epoch, epoch + terms)]
    return _sum_logs("Thm C.1 (CR)", {"failure": float(logsumexp(logs))})


def thmC3_paper_lower(k: int, epsilon: float, d: int = 0) -> float:
    """The printed Thm C.3 bound n ≥ ln((2/3)·C(k, ⌊k/2⌋))/ε + d (not justified: erratum E3)."""
    return math.log(2 / 3 * comb(k, k // 2)) / epsilon + d


def _sperner_counts(k: int) -> tuple[list[int], list[int]]:
    """B_o = #residues with overlap o with S_j; A_o = # of those containing a fixed i ∈ S_j."""
    h = k // 2
    big_b = [comb(h, o) * comb(k - h, h - o) for o in range(h + 1)]
    big_a = [comb(h - 1, o - 1) * comb(k - h, h - o) if o >= 1 else 0 for o in range(h + 1)]
    return big_b, big_a


def repaired_lower_bound(k: int, target: float = 2 / 3, sharp: bool = False) -> float:
    """Spec 001 §3.5: nε ≥ max_θ ln[(γ − θ)/((1 − θ)ρ(θ))] (γ = 2/3), ρ(θ) the fraction of
    residues whose set overlaps S_j in at least θh elements; θ ranges over o/h, o = 1..h.

    ``sharp=True`` uses that the overlap is an integer (Pr[a ≥ o/h] ≥ (γ − (o−1)/h)/(1 − (o−1)/h)),
    a slightly larger valid bound. Returns max(0, ·)."""
    h = k // 2
    big_b, _ = _sperner_counts(k)
    total = comb(k, h)
    tail = [0] * (h + 2)
    for o in range(h, -1, -1):
        tail[o] = tail[o + 1] + big_b[o]
    best = 0.0
    for o in range(1, h + 1):
        theta = (o - 1) / h if sharp else o / h
        if theta >= target:
            continue
        rho = tail[o] / total
        best = max(best, math.log((target - theta) / ((1 - theta) * rho)))
    return best


def sperner_lp_epsilon(k: int, target: float = 2 / 3, tol: float = 1e-10,
                       lp_max_k: int = 30) -> float:
    """The smallest ε for which some ε-DP one-shot generator on Sperner(k) with n = 1 succeeds
    with probability ≥ ``target`` for every target language (spec 001 §4.2(b), erratum E3).

    By symmetry the output law depends only on the overlap o = |S_r ∩ S_j| between the output's
    residue class and the input's; q_o is the probability of each residue with overlap o. The
    linear programme maximises the success Σ_o A_o q_o subject to Σ_o B_o q_o = 1 and the DP
    constraints q_o ≤ e^ε q_{o′} for every pair of overlaps that two neighbouring inputs can give
    the same residue (:func:`_realisable_overlap_pairs`); ε is found by bisection on the optimum
    (HiGHS). For k > ``lp_max_k`` the coefficients span too many orders of magnitude for a
    floating-point LP and the exact vertex solution :func:`sperner_bang_bang_epsilon` is used:
    a linear-fractional objective over the box c ≤ q_o ≤ e^ε c is optimal at a vertex, i.e. a
    threshold in the overlap (the tests check both agree, and that every pair of distinct
    overlaps is realisable, for k ≤ 30)."""
    h = k // 2
    big_b, big_a = _sperner_counts(k)
    if k > lp_max_k:
        return sperner_bang_bang_epsilon(k, target)
    pairs = _realisable_overlap_pairs(k)
    total = comb(k, h)
    b = np.array(big_b, float) / total
    a = np.array(big_a, float) / total

    def best_success(eps: float) -> float:
        m = h + 1
        rows = []
        for o, o2 in sorted(pairs):
            if o == o2:
                continue
            row = np.zeros(m)
            row[o] = 1.0
            row[o2] = -math.exp(eps)
            rows.append(row)
        res = linprog(-a, A_ub=np.array(rows) if rows else None,
                      b_ub=np.zeros(len(rows)) if rows else None,
                      A_eq=b[None, :], b_eq=[1.0], bounds=[(0, None)] * m, method="highs")
        if not res.success:  # pragma: no cover - the uniform law is always feasible
            raise RuntimeError(res.message)
        return float(a @ res.x)

    # the smallest ε whose optimal success reaches the target; slide=False keeps the probes
    # (and so the values) of the published tables
    return calibrate(lambda eps: best_success(eps) >= target, 0.0, 1.0, safe="above",
                     rtol=tol, xtol=tol, slide=False, limit=2.0**14)


def sperner_bang_bang_epsilon(k: int, target: float = 2 / 3) -> float:
    """Closed form of :func:`sperner_lp_epsilon` when every pair of overlaps is constrained:
    the optimum is bang-bang (q_o ∈ {c, e^ε c}, high for o ≥ o₀), so
    e^ε = min_{o₀} ((γB_lo − A_lo)/(A_hi − γB_hi))."""
    big_b, big_a = _sperner_counts(k)
    cb = [0, *itertools.accumulate(big_b)]
    ca = [0, *itertools.accumulate(big_a)]
    best = math.inf
    for o0 in range(len(big_b) + 1):
        blo, alo = cb[o0], ca[o0]
        bhi, ahi = cb[-1] - blo, ca[-1] - alo
        den = ahi - target * bhi
        if den <= 0:
            continue
        num = target * blo - alo
        best = min(best, max(0.0, math.log(num / den)) if num > 0 else 0.0)
    return best


def _realisable_overlap_pairs(k: int) -> set[tuple[int, int]]:
    """(o, o′) such that some residue r and two input classes j ≠ j′ give |S_r ∩ S_j| = o and
    |S_r ∩ S_j′| = o′ (the DP constraints of the n = 1 LP)."""
    h = k // 2
    out = set()
    for m in range(max(0, 2 * h - k), h):  # |S_j ∩ S_j′| = m < h
        only = h - m
        neither = k - 2 * h + m
        for a in range(m + 1):
            for b in range(only + 1):
                for c in range(only + 1):
                    e = h - a - b - c
                    if 0 <= e <= neither:
                        out.add((a + b, a + c))
    return out


def thmC5_epoch_error(s: int, epsilon: float) -> float:
    """Thm C.5 (Alg 2) per-epoch bound s·exp(−3ε·2^{s−1}/(π²s²)) (valid from epoch s₁)."""
    return min(1.0, s * math.exp(-3 * epsilon * 2.0 ** (s - 1) / (math.pi**2 * s * s)))


def alg2_first_epoch(i_star: int, pairwise_max: float) -> int:
    """s₁ = the first s with s ≥ i* and M(i*) ≤ 2^{s−1}."""
    s = max(1, i_star)
    while pairwise_max > 2 ** (s - 1):
        s += 1
    return s


def alg1_bad_event(k: int, i: int, epsilon: float) -> float:
    """001 Alg 1: Pr[|r̃_{i,t_k} − r_{i,t_k}| ≥ t_k/(200i²)] = exp(−ε₀k³/(200i²))."""
    eps0 = 6 * epsilon / math.pi**2
    return math.exp(-eps0 * k**3 / (200 * i * i))


def alg3_mistake_bounds(s: int, epsilon: float, i_star: int, prior: Sequence[float],
                        superset_indices: Sequence[int]) -> dict[str, float]:
    """001 §3.4 bounds for Alg 3 at epoch s: the tail ≤ s^{−2}/π_{i*}; each superset i < i*
    ≤ (π_i/π_{i*}) s^{2(i*−i)} e^{−εs/π²}."""
    pis = prior[i_star - 1]
    out = {"tail": min(1.0, s**-2 / pis)}
    for i in superset_indices:
        out[f"superset {i}"] = min(1.0, prior[i - 1] / pis * s ** (2 * (i_star - i))
                                   * math.exp(-epsilon * s / math.pi**2))
    return out

"""Exact and Monte Carlo evaluation of the lab's algorithms, and their privacy audits.

Errors (spec 000 §1.2–1.3):
    Err_ID(A, D, n) = E[err_D(A(S))] − err*,    Err_GEN(A, D, n) = Pr[A(S) ∉ supp D ∖ S].

Monte Carlo cannot see errors like e^{−40}, so wherever the sufficient statistics are
low-dimensional the error is computed **exactly** (spec 000 §5.3):

* identification (:func:`exact_identification_error`): every support point has a *membership
  type* (which of L_1..L_K′ contain it); the error counts depend on the sample only through
  the multinomial type counts, which are enumerated (O(n) for two types, O(n²) for three), and
  the algorithm's exact selection law given the counts is averaged in log space;
* generation (:func:`exact_generation_error`): the scores depend on the multiplicities of the
  window's positive-mass strings, clipped at ⌈τ⌉; with at most two such strings (Remark 5.7 with
  M = 3) the joint law is enumerated exactly — the common string by an exact sum over its count,
  the other through conditional binomial tails — in O(n·τ). With more (Remark 5.7 with M̄ = 4,
  6, 12; ``dfa-demo``), the clipped counts of the three rarest are enumerated with their exact
  law (exact coordinates by the multinomial, lumped ones by conditional joint tails, no
  cancellation) and the commoner ones are taken as covered, which is only accepted when the
  bound Σ_j P(N_j < ⌈τ⌉) on the change is below 1e−9·Err. The output step adds the exact
  probability that the released string is invalid or a repeat (``fail_given_selection``).

Elsewhere :func:`rao_blackwell_error` draws samples S and averages the *exact* conditional
error given S (the mechanism's randomness integrated out), and :func:`monte_carlo_error` runs
the algorithm end to end; both report Wilson intervals (for the Rao–Blackwell average of
[0, 1]-valued terms the Wilson interval is conservative, as Var ≤ μ(1 − μ)).

The privacy audits of these algorithms, and their broken twins, are in
:mod:`dplang.formal.audit`.

Privacy contract: none — this module evaluates algorithms on public simulation models; it
releases nothing about private data.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import gammaln, logsumexp, xlogy
from scipy.stats import binom, norm

from ..privacy.randomness import RandomStreams
from .collections import Collection
from .distributions import Distribution
from .languages import count_sub_among_first, element_key
from .statistical import (
    GaussianMarginIdentifier,
    GaussianThresholdGenerator,
    JointThresholdGenerator,
    PointerGenerator,
    PrefixCountGenerator,
    _Generator,
    _Identifier,
    _membership_cached,
    error_counts,
    multiplicities,
)
from .truth import generation_truth, identification_truth

__all__ = [
    "ErrorEstimate",
    "exact_generation_error",
    "exact_identification_error",
    "exact_pointer_error",
    "gaussian_argmax_log_law",
    "monte_carlo_error",
    "rao_blackwell_error",
    "sampled_identification_error",
    "wilson",
]


@dataclass(frozen=True)
class ErrorEstimate:
    """An error value with its natural log (exact values may be below float range) and, for
    Monte Carlo, a confidence interval."""

    value: float
    log_value: float
    exact: bool
    low: float | None = None
    high: float | None = None
    runs: int | None = None
    parts: dict[str, float] = field(default_factory=dict)

    def __str__(self) -> str:
        if self.exact:
            return f"{self.value:.4g} (exact)"
        return f"{self.value:.4g} [{self.low:.3g}, {self.high:.3g}] ({self.runs} runs)"


def _from_log(log_value: float, **kw: Any) -> ErrorEstimate:
    return ErrorEstimate(math.exp(log_value) if log_value > -745 else 0.0, log_value, **kw)


def wilson(successes: float, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a proportion (successes may be a Rao–Blackwell sum).

    Where p = successes/trials is far below z²/trials, mid − half cancels (0 successes gave
    1e-19, not 0): there the lower end is computed as p²/(den·(mid + half)), the same number
    without the subtraction (mid² − half² = p²/den), so it is 0 exactly at 0 successes; the
    upper end likewise near p = 1 (1 exactly when every trial succeeds)."""
    if trials <= 0:
        raise ValueError("trials must be > 0")
    z = float(norm.ppf(0.5 + confidence / 2))
    p = successes / trials
    den = 1 + z * z / trials
    mid = (p + z * z / (2 * trials)) / den
    half = z * math.sqrt(max(p * (1 - p), 0.0) / trials + z * z / (4 * trials**2)) / den
    lo, hi = mid - half, mid + half
    if lo < 1e-3 * mid:
        lo = p * p / (den * (mid + half))
    if 1 - hi < 1e-3 * (1 - mid):
        q = 1 - p
        hi = 1 - q * q / (den * ((1 - mid) + half))
    return max(0.0, lo), min(1.0, hi)


# =============================================================================================
# Exact identification error
# =============================================================================================


def log_binom_cdf(k: Any, n: Any, p: float) -> np.ndarray:
    """log P(X ≤ k), X ~ Bin(n, p), elementwise, valid far below e^{−745} (scipy's logcdf
    is the log of the cdf and underflows to −inf there). Where it underflows (k far below
    the mean), the lower tail is summed in log space from k downwards: the pmf ratio
    pmf(x−1)/pmf(x) = x(1−p)/((n−x+1)p) ≤ r < 1, so the terms left out after J of them are
    below r^J/(1 − r) of the sum (J chosen to make that < 1e−17)."""
    k_arr, n_arr = np.broadcast_arrays(np.asarray(k, dtype=np.int64),
                                       np.asarray(n, dtype=np.int64))
    shape = k_arr.shape
    k_arr, n_arr = k_arr.ravel(), n_arr.ravel()
    out = np.asarray(binom.logcdf(k_arr, n_arr, p), dtype=np.float64).copy()
    todo = np.flatnonzero((out < -700) & (k_arr >= 0) & (k_arr < n_arr))
    if todo.size:
        kk, nn = k_arr[todo], n_arr[todo]
        with np.errstate(divide="ignore"):
            r = kk * (1 - p) / ((nn - kk + 1) * p)
            need = np.where(r < 1, np.ceil(-42.0 / np.log(np.where(r < 1, r, 0.5))) + 2,
                            np.inf)
        terms = np.minimum(kk + 1, need).astype(np.int64)  # kk + 1 = the whole lower tail
        for chunk in np.array_split(np.arange(todo.size), max(1, todo.size // 2048)):
            width = int(terms[chunk].max())
            j = np.arange(width)[None, :]
            x = kk[chunk][:, None] - j
            lp = binom.logpmf(np.maximum(x, 0), nn[chunk][:, None], p)
            lp = np.where((j < terms[chunk][:, None]) & (x >= 0), lp, -np.inf)
            out[todo[chunk]] = logsumexp(lp, axis=1)
    return out.reshape(shape) if shape else out[0]


def log_binom_sf(k: Any, n: Any, p: float) -> np.ndarray:
    """log P(X > k), X ~ Bin(n, p), elementwise, valid far below e^{−745}:
    P(X > k) = P(n − X ≤ n − k − 1) with n − X ~ Bin(n, 1 − p)."""
    k_arr, n_arr = np.broadcast_arrays(np.asarray(k, dtype=np.int64),
                                       np.asarray(n, dtype=np.int64))
    shape = k_arr.shape
    k_arr, n_arr = k_arr.ravel(), n_arr.ravel()
    out = np.full(k_arr.shape, -np.inf)
    out[k_arr < 0] = 0.0
    mid = (k_arr >= 0) & (k_arr < n_arr)
    if mid.any():
        out[mid] = log_binom_cdf(n_arr[mid] - k_arr[mid] - 1, n_arr[mid], 1.0 - p)
    return out.reshape(shape) if shape else out[0]


def _binom_band(n: int, p: float, width: float) -> tuple[int, int]:
    """[lo, hi]: the counts x whose Bin(n, p) log-pmf is within ``width`` of its maximum (the
    log-pmf is unimodal: bisection on each side of the mode)."""
    mode = min(n, math.floor((n + 1) * p))
    floor = float(binom.logpmf(mode, n, p)) - width

    def above(x: int) -> bool:
        return float(binom.logpmf(x, n, p)) >= floor

    lo_a, lo_b = 0, mode  # smallest x in [0, mode] above the floor
    if above(0):
        lo = 0
    else:
        while lo_b - lo_a > 1:
            mid = (lo_a + lo_b) // 2
            lo_a, lo_b = (lo_a, mid) if above(mid) else (mid, lo_b)
        lo = lo_b
    hi_a, hi_b = mode, n  # largest x in [mode, n] above the floor
    if above(n):
        hi = n
    else:
        while hi_b - hi_a > 1:
            mid = (hi_a + hi_b) // 2
            hi_a, hi_b = (mid, hi_b) if above(mid) else (hi_a, mid)
        hi = hi_a
    return lo, hi


_MAX_ID_STATES = 40_000_000


def exact_identification_error(alg: _Identifier, collection: Collection,
                               distribution: Distribution, n: int,
                               truth_horizon: int | None = None) -> ErrorEstimate:
    """Err_ID exactly, by enumerating the multinomial counts of membership types.

    The error counts c_i = #{t : x_t ∉ L_i} depend on S only through the counts of the support
    points' membership types over L_1..L_K′. A type inside every L_i never counts; for the
    margin rules (``shift_invariant``: Algorithms 4, 1 and 2, whose laws depend on the counts
    only through their differences) a type outside every L_i adds the same to every c_i and is
    dropped as well. The remaining (at most three) types' counts are enumerated on the grid
    where each marginal Bin(n, p_t) is within e^{−H} of its mode, with the exact multinomial law;
    the mass outside the grid (exact binomial tails) times the largest excess must be below
    e^{−40}·Err, else H grows — so nested segments (one relevant type) are O(band) even at
    n = 10⁸. Needs an algorithm whose selection law has a closed form (Algorithms 4, 1, and 2
    with K′ ≤ 2). ``truth_horizon`` measures err* over more languages than the algorithm
    searches (the error of a horizon that is too short)."""
    big_k, kp = alg.horizon(n, collection)
    truth = identification_truth(collection, distribution, max(big_k, truth_horizon or 0))
    langs = collection.first(kp)
    types: dict[tuple[bool, ...], float] = {}
    for u, p in distribution.atoms():
        key = tuple(not lang.contains(u) for lang in langs)  # outside which languages
        types[key] = types.get(key, 0.0) + p
    shift = bool(getattr(alg, "shift_invariant", False))
    relevant = [k for k in types if any(k) and not (shift and all(k))]
    if len(relevant) > 3:
        raise ValueError(f"{len(relevant)} membership types that move the error counts: exact "
                         "enumeration supports at most 3; use sampled_identification_error")
    excess = np.array(truth.errors[:kp]) - truth.err_star
    pos = excess > 1e-15
    if not pos.any():
        return ErrorEstimate(0.0, -math.inf, True)
    log_excess = np.where(pos, np.log(np.where(pos, excess, 1.0)), -np.inf)
    log_max_excess = float(np.max(log_excess))
    if not relevant:
        law = alg.log_law(np.zeros((1, kp), dtype=np.int64), n, big_k)
        return _from_log(float(logsumexp(law[0] + log_excess)), exact=True)
    outside = np.array(relevant, dtype=np.int64)  # R × K′
    ps = np.array([types[k] for k in relevant])
    rest = max(0.0, 1.0 - float(ps.sum()))
    logp = np.log(ps)
    width = 200.0
    while True:
        bands = [_binom_band(n, float(p), width) for p in ps]
        size = math.prod(hi - lo + 1 for lo, hi in bands)
        layer = math.prod(hi - lo + 1 for lo, hi in bands[1:])  # states per first count
        if size > _MAX_ID_STATES or layer > _MAX_ID_STATES // 20:
            raise ValueError(f"{size} type-count states needed for an exact value (limit "
                             f"{_MAX_ID_STATES}): use sampled_identification_error")
        tails = [float(np.logaddexp(log_binom_cdf(lo - 1, n, p) if lo > 0 else -np.inf,
                                    log_binom_sf(hi, n, p))) for (lo, hi), p in zip(bands, ps,
                                                                                    strict=True)]
        log_out = float(logsumexp(tails)) + log_max_excess
        terms: list[float] = []
        first = np.arange(bands[0][0], bands[0][1] + 1)
        others = [np.arange(lo, hi + 1) for lo, hi in bands[1:]]
        grid = (np.stack(np.meshgrid(*others, indexing="ij"), axis=-1).reshape(-1, len(others))
                if others else np.zeros((1, 0), dtype=np.int64))
        step = max(1, 2_000_000 // max(1, grid.shape[0] * kp))
        for start in range(0, first.size, step):
            xs = first[start:start + step]
            comp = np.concatenate([np.repeat(xs, grid.shape[0])[:, None],
                                   np.tile(grid, (xs.size, 1))], axis=1)
            m_rest = n - comp.sum(axis=1)
            ok = m_rest >= 0 if rest > 0 else m_rest == 0
            comp, m_rest = comp[ok], m_rest[ok]
            if comp.shape[0] == 0:
                continue
            lp = (gammaln(n + 1) - gammaln(comp + 1).sum(axis=1) - gammaln(m_rest + 1)
                  + comp @ logp + xlogy(m_rest, rest))
            law = alg.log_law(comp @ outside, n, big_k)
            terms.append(float(logsumexp(lp[:, None] + law + log_excess[None, :])))
        total = float(logsumexp(terms)) if terms else -math.inf
        if log_out <= total - 40:
            return _from_log(total, exact=True, parts={"log_left_out": log_out})
        if total == -math.inf:
            width *= 4
        else:
            width += (log_out - total + 40) + 20


def sampled_identification_error(alg: _Identifier, collection: Collection,
                                 distribution: Distribution, n: int, runs: int, seed: int,
                                 confidence: float = 0.95,
                                 truth_horizon: int | None = None) -> ErrorEstimate:
    """Rao–Blackwellised Err_ID for large n: draw the multinomial counts of the membership
    types (not the samples), and average the exact conditional error given them in log space
    (so values like e^{−200} survive). Algorithm 2 with K′ > 2 averages 400 noise draws.
    ``truth_horizon`` measures err* over more languages than the algorithm searches (to show
    the error of a horizon that is too short)."""
    big_k, kp = alg.horizon(n, collection)
    truth = identification_truth(collection, distribution, max(big_k, truth_horizon or 0))
    langs = collection.first(kp)
    types: dict[tuple[bool, ...], float] = {}
    for u, p in distribution.atoms():
        key = tuple(lang.contains(u) for lang in langs)
        types[key] = types.get(key, 0.0) + p
    keys = list(types)
    probs = np.array([types[k] for k in keys])
    outside = np.array([[not k[i] for i in range(kp)] for k in keys], dtype=np.int64)
    rng = RandomStreams(seed).generator(0)
    comp = rng.multinomial(n, probs / probs.sum(), size=runs)
    counts = comp @ outside
    excess = np.array(truth.errors[:kp]) - truth.err_star
    if isinstance(alg, GaussianMarginIdentifier) and kp > 2:
        sig = alg.sigma(n, kp)
        vals = []
        for c in counts:
            noisy = c / n + rng.normal(0, sig, size=(400, kp))
            vals.append(float(np.mean(excess[alg.index_from_noisy(noisy, big_k) - 1])))
        with np.errstate(divide="ignore"):
            logs = np.log(np.asarray(vals))  # −inf where no noise draw erred
    else:
        pos = excess > 1e-15
        law = alg.log_law(counts, n, big_k)
        logs = logsumexp(law[:, pos] + np.log(excess[pos])[None, :], axis=1)
    log_mean = float(logsumexp(logs) - math.log(runs))
    mean = math.exp(log_mean) if log_mean > -745 else 0.0
    lo, hi = wilson(mean * runs, runs, confidence)
    return ErrorEstimate(mean, log_mean, False, lo, hi, runs)


# =============================================================================================
# Exact generation error
# =============================================================================================


def _invalid_fraction(lang: Any, valid_lang: Any, beyond: int, big_r: int) -> float:
    """The fraction of the first R members of L beyond position m that are outside supp D.

    Counted by position when the R-th member can be written out; for a slender DFA language
    (a*, (ab)*: the member has ~n·2⁶⁴ letters) by :func:`count_sub_among_first`, whose bracket
    (at most the number of members of one length) is ≤ 2⁻⁶⁰ of R: its midpoint is used."""
    if lang.issubset(valid_lang):
        return 0.0
    base = lang.count_upto(beyond)
    lo_end, hi_end = count_sub_among_first(lang, valid_lang, base + big_r)
    start = valid_lang.count_upto(beyond)
    if (hi_end - lo_end) * 2**60 > big_r:
        raise ValueError("the number of valid candidates is not determined to 2^-60 of R")
    # (R − valid)/R with valid = (lo + hi)/2 − start, in exact integer arithmetic
    return (2 * big_r - lo_end - hi_end + 2 * start) / (2 * big_r)


def fail_given_selection(collection: Collection, index: int, beyond: int, big_r: int,
                         support: Any, atoms: list[tuple[Any, float]],
                         n: int, memo: dict[Any, Any] | None = None) -> tuple[float, float]:
    """(probability that the r-th member of L_index beyond ``beyond`` is outside supp D,
    log of the expected collision probability with S ~ Dⁿ) for r ~ Unif{1..R}.

    The invalid part is exact; the collision part is E[|first R ∩ supp ∩ S|]/R =
    Σ_x (1 − (1 − D(x))ⁿ)/R over the atoms among the first R members (tail < 1e−18).
    ``memo`` (one dict per collection, support and atom list) keeps each language's
    intersection with the support and its atoms' ranks across calls."""
    memo = {} if memo is None else memo
    if index not in memo:
        lang = collection[index]
        uni = collection.universe
        ranks, masses = [], []
        for x, p in atoms:
            if lang.contains(x):
                ranks.append(lang.count_upto(uni.index(x)))
                masses.append(-math.expm1(n * math.log1p(-p)) if p < 1 else 1.0)
        memo[index] = (lang, lang.intersection(support), np.array(ranks, dtype=object),
                       np.array(masses))
    lang, valid_lang, ranks, masses = memo[index]
    invalid = _invalid_fraction(lang, valid_lang, beyond, big_r)
    base = lang.count_upto(beyond)
    inside = np.array([base < r <= base + big_r for r in ranks.tolist()], dtype=bool)
    coll = float(masses[inside].sum()) if inside.size else 0.0
    return invalid, (math.log(coll) - math.log(big_r)) if coll > 0 else -math.inf


def exact_generation_error(alg: _Generator, collection: Collection,
                           distribution: Distribution, n: int) -> ErrorEstimate:
    """Err_GEN exactly for Algorithms 3, 6 and 7 (Algorithm 7's law by quadrature, once per
    distinct score vector). One or two positive-mass window strings: every clipped count
    enumerated. Three or more: :func:`_exact_generation_many` (the three rarest enumerated, the
    others covered up to a remainder ≤ 1e−9·Err, else ValueError). States are visited by
    decreasing probability and the rest left out once it is below e^{−40}·Err
    (``parts['log_left_out']``).

    Err = E[Σ_i P(î = i | S)·invalid_i] + E[Σ_i P(î = i | S)·(1 − invalid_i)]·collision_i, where
    the collision term uses E over S of the collision probability (its correlation with the
    selection changes Err by at most E[P(bad)]·n/R, i.e. relative 2⁻⁶⁴ for R = n·2⁶⁴)."""
    if not isinstance(alg, PrefixCountGenerator | JointThresholdGenerator):
        raise ValueError("exact generation error is implemented for Algorithms 3, 6 and 7")
    _, kp = alg.horizon(n, collection)
    window = alg.window(n)
    big_r = alg.pool(n)
    tau = alg.threshold_tau(n)
    cap = math.ceil(tau)
    memb = alg.membership(collection, n)
    uni = collection.universe
    probs = np.array([distribution.pmf(uni.at(j)) for j in range(1, window + 1)])
    positive = [j for j in range(window) if probs[j] > 0]
    if not positive:
        raise ValueError("no positive-mass string in the window: use rao_blackwell_error")
    support = distribution.support
    atoms = distribution.atoms()
    # sample points outside the listed atoms (a truncated support) could also collide: at most
    # n·(1 − Σ listed)/R in expectation, which must be negligible for an exact value
    unlisted = max(0.0, 1.0 - math.fsum(p for _, p in atoms))
    log_unlisted = (math.log(n * unlisted) - math.log(big_r)) if unlisted > 0 else -math.inf
    # per selected unit: invalid probability and collision probability
    if isinstance(alg, JointThresholdGenerator):
        units = [(i, m) for i in range(1, kp + 1) for m in range(1, window + 1)]
    else:
        units = [(i, window) for i in range(1, kp + 1)]
    memo: dict[Any, Any] = {}
    fails = np.array([fail_given_selection(collection, i, m, big_r, support, atoms, n, memo)
                      for i, m in units])
    invalid, log_coll = fails[:, 0], fails[:, 1]

    gauss_cache: dict[bytes, np.ndarray] = {}

    def log_laws(counts: np.ndarray) -> np.ndarray:
        if isinstance(alg, GaussianThresholdGenerator):
            scores = alg.scores(counts, memb, n).reshape(counts.shape[0], -1)
            uniq, inverse = np.unique(scores, axis=0, return_inverse=True)
            sig = alg.sigma(n, kp)
            todo = [row for row in uniq if row.tobytes() not in gauss_cache]
            if todo:
                for row, law in zip(todo, gaussian_argmax_log_law(np.array(todo), sig),
                                    strict=True):
                    gauss_cache[row.tobytes()] = law
            laws = [gauss_cache[row.tobytes()] for row in uniq]
            return np.asarray(laws)[np.ravel(inverse)]
        law = alg.log_law(counts, memb, n)
        return law.reshape(counts.shape[0], -1)

    if len(positive) > 2:
        return _with_unlisted(_exact_generation_many(window, cap, n, probs, positive, invalid,
                                                     log_coll, log_laws), log_unlisted)
    # enumerate (clipped) counts of the positive-mass strings with exact probabilities:
    # blocks of (log probability, count vectors)
    blocks: list[tuple[np.ndarray, np.ndarray]] = []
    log_skipped = -math.inf  # bound on the probability of the counts not enumerated
    if len(positive) == 1:
        (a,) = positive
        c = np.arange(0, cap + 1)
        lp = binom.logpmf(c, n, probs[a])
        lp[-1] = log_binom_sf(cap - 1, n, probs[a])
        counts = np.zeros((c.size, window))
        counts[:, a] = c
        blocks.append((lp, counts))
    else:
        # the rarer string's count x is enumerated exactly; given x, the commoner's count is
        # Bin(n − x, p_b/(1 − p_a)), clipped at cap (its upper tail lumped)
        a, b = sorted(positive, key=lambda j: probs[j])
        pa, pb = probs[a], probs[b]
        cond = min(1.0, pb / (1 - pa))
        ca = np.arange(n + 1)
        lpa = binom.logpmf(ca, n, pa)
        far = lpa <= lpa.max() - 800
        xs = ca[~far]
        if far.any():
            log_skipped = float(logsumexp(lpa[far]))
        cb = np.arange(0, cap + 1)
        for chunk in np.array_split(xs, max(1, xs.size // 256)):
            m = (n - chunk)[:, None]
            lpb = binom.logpmf(cb[None, :], m, cond)
            tail = log_binom_sf(cap - 1, m[:, 0], cond)
            lpb[:, -1] = np.where(cap <= m[:, 0], tail, lpb[:, -1])
            lpb = np.where(cb[None, :] <= m, lpb, -np.inf)
            lp = (lpa[chunk][:, None] + lpb).ravel()
            counts = np.zeros((chunk.size, cb.size, window))
            counts[:, :, a] = np.minimum(chunk, cap)[:, None]
            counts[:, :, b] = cb[None, :]
            counts = counts.reshape(-1, window)
            ok = np.isfinite(lp)
            blocks.append((lp[ok], counts[ok]))
    all_lp = np.concatenate([lp for lp, _ in blocks])
    all_counts = np.concatenate([c for _, c in blocks], axis=0)
    log_sel, log_collision, left_out = _accumulate(all_lp, lambda idx: all_counts[idx],
                                                   invalid, log_coll, log_laws)
    total = float(np.logaddexp(log_sel, log_collision))
    log_left = float(np.logaddexp(left_out, log_skipped))
    if log_left > total - 40:
        raise ValueError("the count enumeration left out too much mass: use "
                         "rao_blackwell_error")
    return _with_unlisted(_from_log(total, exact=True, parts={
        "selection": math.exp(log_sel) if log_sel > -745 else 0.0, "log_selection": log_sel,
        "log_collision": log_collision, "log_left_out": log_left}), log_unlisted)


def _with_unlisted(est: ErrorEstimate, log_unlisted: float) -> ErrorEstimate:
    """Refuse an exact value whose collision part misses more than 1e−9·Err (atoms of a
    truncated support), and report the bound."""
    if log_unlisted > est.log_value + math.log(1e-9):
        raise ValueError(f"the support's unlisted atoms could add up to e^{log_unlisted:.1f} of "
                         f"collisions (Err e^{est.log_value:.1f}): use a larger R or "
                         "rao_blackwell_error")
    est.parts["log_unlisted_collision"] = log_unlisted
    return est


# ---------------------------------------------------------------------------------------------
# the clipped multinomial law (three or more positive-mass window strings)
# ---------------------------------------------------------------------------------------------

_RARE = 3  # positive-mass window strings whose clipped counts are enumerated exactly
_MAX_STATES = 8_000_000  # clipped-count states enumerated at most (memory ~40 bytes each)


def _log_all_below(m: int, qs: Sequence[float], cap: int) -> float:
    """log P(N_l < cap for every l), (N_l) ~ Mult(m; qs, rest): a finite sum of positive terms,
    conditioning on the first count (no cancellation)."""
    if not qs:
        return 0.0
    if cap <= 0:
        return -math.inf
    if len(qs) == 1:
        return float(log_binom_cdf(cap - 1, m, qs[0]))
    q1 = qs[0]
    rest = [q / (1 - q1) for q in qs[1:]]
    x = np.arange(0, min(cap - 1, m) + 1)
    lp = binom.logpmf(x, m, q1)
    if len(rest) == 1:
        inner = log_binom_cdf(cap - 1, m - x, rest[0])
    else:
        inner = np.array([_log_all_below(m - int(v), rest, cap) for v in x])
    return float(logsumexp(lp + inner))


def _log_all_at_least(m: int, qs: Sequence[float], cap: int) -> float:
    """log P(N_l ≥ cap for every l), (N_l) ~ Mult(m; qs, rest).

    When the union bound Σ_l P(N_l < cap) is at most 1/2, as 1 − P(∪{N_l < cap}) by
    inclusion–exclusion (every term a sum of positive terms; relative error ~1e−16 as the
    result is ≥ 1/2). Otherwise by conditioning on the first count x ≥ cap and summing the
    positive terms P(N_1 = x)·P(rest ≥ cap | x) from the most probable x outwards, until the
    binomial mass of the x not yet summed is below e^{−50} times the sum (a rigorous bound, as
    every conditional factor is ≤ 1)."""
    if not qs or cap <= 0:
        return 0.0
    if m < len(qs) * cap:
        return -math.inf
    if len(qs) == 1:
        return float(log_binom_sf(cap - 1, m, qs[0]))
    lows = [float(log_binom_cdf(cap - 1, m, q)) for q in qs]
    if float(logsumexp(lows)) <= math.log(0.5):
        logs, signs = [], []
        for size in range(1, len(qs) + 1):
            for sub in itertools.combinations(range(len(qs)), size):
                logs.append(lows[sub[0]] if size == 1
                            else _log_all_below(m, [qs[i] for i in sub], cap))
                signs.append(1 if size % 2 else -1)
        union = _signed_logsumexp(logs, signs)
        return math.log1p(-math.exp(union)) if union > -math.inf else 0.0
    q1 = qs[0]
    rest = [q / (1 - q1) for q in qs[1:]]
    x = np.arange(cap, m + 1)
    lp = binom.logpmf(x, m, q1)
    order = np.argsort(-lp, kind="stable")
    lp_sorted = lp[order]
    # remaining[k] = log Σ_{k' ≥ k} P(N_1 = x_(k')): the mass not yet summed
    remaining = np.logaddexp.accumulate(lp_sorted[::-1])[::-1]
    total = -math.inf
    for start in range(0, x.size, 256):
        if total > -math.inf and remaining[start] < total - 50:
            break
        idx = order[start:start + 256]
        xs = x[idx]
        if len(rest) == 1:
            inner = log_binom_sf(cap - 1, m - xs, rest[0])
        else:
            inner = np.array([_log_all_at_least(m - int(v), rest, cap) for v in xs])
        total = float(np.logaddexp(total, logsumexp(lp[idx] + inner)))
    return total


def _clipped_states(n: int, ps: Sequence[float], cap: int,
                    horizon: float) -> tuple[np.ndarray, np.ndarray, float]:
    """The exact law of the clipped counts Y_l = min(N_l, cap) of r ≤ 3 strings with masses
    ``ps`` when S ~ Dⁿ: (log-probabilities, states (rows of Y), log of a bound on the total
    probability of the states left out). States below max − ``horizon`` are left out.

    A state with exact coordinates E (Y_l < cap) and lumped ones L (Y_l = cap) has probability
    Mult(y_E, m; p_E, 1 − Σp_E)·P(N_l ≥ cap ∀ l ∈ L | m) with m = n − Σ y_E, where the lumped
    counts given y_E are Mult(m; p_L/(1 − Σp_E)) (:func:`_log_all_at_least`): no cancellation.
    An exact coordinate only ranges over the values y whose marginal P(N_l = y) is at least
    e^{−horizon} times the all-lumped state's probability (a state's probability is at most
    each of its coordinates' marginals), so the work grows with the horizon, not with cap^r."""
    r = len(ps)
    if not 1 <= r <= 3:
        raise ValueError("the clipped law is enumerated for 1 to 3 strings")
    logp = np.log(np.asarray(ps, dtype=np.float64))
    top = _log_all_at_least(n, list(ps), cap)  # the all-lumped state: a lower bound on the max
    floor = top - horizon if top > -math.inf else -math.inf
    band = []
    outside = 0
    for p in ps:
        lpm = binom.logpmf(np.arange(cap), n, p)
        inside = np.flatnonzero(lpm >= floor)
        band.append(inside)
        outside = max(outside, cap - inside.size)
    size = sum(math.prod(band[i].size for i in range(r) if not lump[i])
               for lump in itertools.product((False, True), repeat=r))
    if size > _MAX_STATES:
        raise ValueError(f"{size} clipped-count states within e^-{horizon:.0f} of the most "
                         f"probable one (limit {_MAX_STATES}): use rao_blackwell_error")
    keep_lp: list[np.ndarray] = []
    keep_y: list[np.ndarray] = []
    dropped = 0
    for lump in itertools.product((False, True), repeat=r):
        ex = [i for i in range(r) if not lump[i]]
        lu = [i for i in range(r) if lump[i]]
        pe = float(sum(ps[i] for i in ex))
        rest_mass = 1.0 - pe
        if lu and rest_mass <= 0:
            continue
        ql = [ps[i] / rest_mass for i in lu]
        # exact coordinates: the first one by layers (bounded memory), the others as a grid
        first = band[ex[0]] if ex else np.zeros(1, dtype=np.int64)
        if len(ex) > 1:
            grid = np.stack(np.meshgrid(*[band[i] for i in ex[1:]], indexing="ij"),
                            axis=-1).reshape(-1, len(ex) - 1)
        else:
            grid = np.zeros((1, 0), dtype=np.int64)
        tails: dict[int, float] = {}
        for x0 in first.tolist():
            vals = (np.concatenate([np.full((grid.shape[0], 1), x0), grid], axis=1)
                    if ex else np.zeros((1, 0), dtype=np.int64))
            m_rem = n - vals.sum(axis=1)
            ok = m_rem >= len(lu) * cap
            if not ok.all():  # impossible states (probability 0)
                vals, m_rem = vals[ok], m_rem[ok]
            if vals.shape[0] == 0:
                continue
            lp = (gammaln(n + 1) - gammaln(vals + 1).sum(axis=1) - gammaln(m_rem + 1)
                  + (vals * logp[ex][None, :]).sum(axis=1) + xlogy(m_rem, rest_mass))
            if lu:
                for v in np.unique(m_rem).tolist():
                    if v not in tails:
                        tails[v] = _log_all_at_least(int(v), ql, cap)
                lp = lp + np.array([tails[v] for v in m_rem.tolist()])
            finite = np.isfinite(lp)
            lp, vals = lp[finite], vals[finite]
            if lp.size == 0:
                continue
            top = max(top, float(lp.max()))
            keep = lp >= top - horizon
            dropped += int(np.count_nonzero(~keep))
            ys = np.full((int(np.count_nonzero(keep)), r), cap, dtype=np.int32)
            ys[:, ex] = vals[keep]
            keep_lp.append(lp[keep])
            keep_y.append(ys)
    lp_all = np.concatenate(keep_lp)
    y_all = np.concatenate(keep_y, axis=0)
    final = lp_all >= top - horizon
    dropped += int(np.count_nonzero(~final))
    log_dropped = math.log(dropped) + top - horizon if dropped else -math.inf
    if outside:  # states with a coordinate outside its band: each below ``floor``
        log_dropped = float(np.logaddexp(log_dropped, r * math.log(cap + 1) + floor))
    return lp_all[final], y_all[final], log_dropped


def _accumulate(lp: np.ndarray, counts_of: Any, invalid: np.ndarray, log_coll: np.ndarray,
                log_laws: Any) -> tuple[float, float, float]:
    """Σ over states of P(state)·(selection failure + collision), states processed by
    decreasing probability; a state whose probability is below e^{−40} times the error so far
    (divided by the number of states) is left out: (log selection part, log collision part,
    log bound on what was left out)."""
    order = np.argsort(-lp, kind="stable")
    lp_sorted = lp[order]
    sel_terms: list[np.ndarray] = []
    good_terms: list[np.ndarray] = []
    log_inv = np.log(np.maximum(invalid, 1e-300))
    pos_inv = invalid > 0
    current = -math.inf
    left_out = -math.inf
    log_size = math.log(max(lp.size, 1))
    step = 4096
    for start in range(0, lp.size, step):
        chunk_lp = lp_sorted[start:start + step]
        if current > -math.inf and chunk_lp[0] + log_size < current - 40:
            left_out = float(chunk_lp[0] + log_size)
            break
        law = log_laws(counts_of(order[start:start + step]))
        if pos_inv.any():
            sel_terms.append(logsumexp(chunk_lp[:, None] + law[:, pos_inv]
                                       + log_inv[None, pos_inv], axis=1))
            current = float(logsumexp(np.concatenate(sel_terms)))
        good_terms.append(logsumexp(chunk_lp[:, None] + law, axis=0)[None, :])
    log_sel = float(logsumexp(np.concatenate(sel_terms))) if sel_terms else -math.inf
    log_mean_law = logsumexp(np.concatenate(good_terms, axis=0), axis=0)
    with np.errstate(divide="ignore"):
        log_valid = np.log1p(-np.minimum(invalid, 1.0))
    log_collision = float(logsumexp(log_mean_law + log_valid + log_coll))
    return log_sel, log_collision, left_out


def _exact_generation_many(window: int, cap: int, n: int, probs: np.ndarray,
                           positive: Sequence[int], invalid: np.ndarray, log_coll: np.ndarray,
                           log_laws: Any, rare: int = _RARE) -> ErrorEstimate:
    """exact_generation_error with more than two positive-mass window strings.

    The clipped counts of the ``rare`` (3) rarest strings are enumerated with their exact law
    (:func:`_clipped_states`, (⌈τ⌉ + 1)³ states); every commoner string is taken as *covered*
    (count ≥ ⌈τ⌉, so it never enters a deficit). That changes Err by at most the remainder
    Σ_j P(N_j < ⌈τ⌉) over the commoner strings (Err is the expectation of a [0, 1]-valued
    function f of S, and |E f − E f̃| ≤ P(f ≠ f̃)); the value is returned only when the
    remainder is at most 1e−9·Err (``parts['log_remainder']``), else ValueError. States are
    left out only below e^{−40}·Err in total (``parts['log_left_out']``): the value is exact to
    a relative 1e−9."""
    order = sorted(positive, key=lambda j: (probs[j], j))
    exact_set, common = order[:rare], order[rare:]
    log_rem = (float(logsumexp([log_binom_cdf(cap - 1, n, probs[j]) for j in common]))
               if common else -math.inf)
    if log_rem > math.log(1e-9):  # Err ≤ 1: the remainder can only be too large
        raise ValueError(f"the commoner window strings are not covered well enough for an exact "
                         f"value (remainder e^{log_rem:.1f}): use rao_blackwell_error")
    base = np.zeros(window)
    base[common] = cap
    horizon = 200.0
    while True:
        lp, ys, log_dropped = _clipped_states(n, [float(probs[j]) for j in exact_set], cap,
                                              horizon)

        def counts_of(idx: np.ndarray, ys: np.ndarray = ys) -> np.ndarray:
            counts = np.tile(base, (idx.size, 1))
            counts[:, exact_set] = ys[idx]
            return counts

        log_sel, log_collision, left_out = _accumulate(lp, counts_of, invalid, log_coll,
                                                       log_laws)
        total = float(np.logaddexp(log_sel, log_collision))
        if log_dropped <= total - 40 or horizon >= 20000:
            break
        # widen the horizon: at most doubled (the error found so far may be far too small
        # when the failing states all lie beyond it)
        horizon = min(2 * horizon, horizon + (log_dropped - total + 40) + 3 * math.log(cap + 1)
                      + 10)
    log_left = float(np.logaddexp(log_dropped, left_out))
    if log_left > total - 40:
        raise ValueError("the clipped-count enumeration could not bound the states it left "
                         "out: use rao_blackwell_error")
    if log_rem > total + math.log(1e-9):
        raise ValueError(f"the commoner window strings are not covered well enough for an exact "
                         f"value (remainder e^{log_rem:.1f} vs Err e^{total:.1f}): use "
                         "rao_blackwell_error")
    return _from_log(total, exact=True,
                     parts={"selection": math.exp(log_sel) if log_sel > -745 else 0.0,
                            "log_selection": log_sel, "log_collision": log_collision,
                            "log_remainder": log_rem, "log_left_out": log_left})


def _signed_logsumexp(logs: Sequence[float], signs: Sequence[int]) -> float:
    pos = [v for v, sg in zip(logs, signs, strict=True) if sg > 0 and v > -math.inf]
    neg = [v for v, sg in zip(logs, signs, strict=True) if sg < 0 and v > -math.inf]
    lp = float(logsumexp(pos)) if pos else -math.inf
    ln = float(logsumexp(neg)) if neg else -math.inf
    if ln == -math.inf:
        return lp
    if ln >= lp:
        return -math.inf  # cancellation to (numerically) zero
    return lp + math.log1p(-math.exp(ln - lp))


def exact_pointer_error(alg: PointerGenerator, collection: Collection,
                        distribution: Distribution, n: int) -> ErrorEstimate:
    """Err_GEN of the pointer rule (000 Alg 5) exactly.

    With W = m* (every bad language's pointer stops at or before its witness, which is never
    seen), the outcome depends only on which positive-mass strings among u_1..u_W were seen:
    a pointer beyond W belongs to a good language (success); otherwise the output is the
    unseen u_p, valid iff D(u_p) > 0. P(seen set = T) by inclusion–exclusion, in log space."""
    big_k, kp = alg.horizon(n, collection)
    truth = generation_truth(collection, distribution, big_k)
    window = int(truth.m_star)
    uni = collection.universe
    probs = [distribution.pmf(uni.at(j)) for j in range(1, window + 1)]
    positive = [j for j in range(window) if probs[j] > 0]
    if len(positive) > 12:
        raise ValueError("too many positive-mass strings before the witness index")
    memb = _membership_cached(collection, kp, window)
    logs, signs = [], []
    for r in range(len(positive) + 1):
        for seen in itertools.combinations(positive, r):
            seen_set = set(seen)
            ptr = []
            for i in range(kp):
                p = next((j for j in range(window) if memb[i, j] and j not in seen_set), None)
                ptr.append(window if p is None else p)  # window = "beyond"
            best = max(ptr)
            if best == window:
                continue  # a good language wins: valid and novel
            if probs[best] > 0:
                continue  # the unseen u_p is in the support
            unseen = [j for j in positive if j not in seen_set]
            q = sum(probs[j] for j in unseen)
            for a in range(len(seen) + 1):
                for sub in itertools.combinations(seen, a):
                    rest = 1.0 - q - sum(probs[j] for j in sub)
                    logs.append(n * math.log(rest) if rest > 0 else -math.inf)
                    signs.append(-1 if a % 2 else 1)
    total = _signed_logsumexp(logs, signs) if logs else -math.inf
    return _from_log(total, exact=True)


# =============================================================================================
# Gaussian argmax law (Algorithm 7)
# =============================================================================================


def gaussian_argmax_log_law(means: np.ndarray, sigma: float, points: int = 1201) -> np.ndarray:
    """log P(argmax_b (means_b + Z_b) = b), Z i.i.d. N(0, σ²), by quadrature in log space:
    P(b) = ∫ φ_σ(x − μ_b) Π_{o≠b} Φ((x − μ_o)/σ) dx on a grid from below the lowest mean (at
    most 40σ under the top) to 12σ above the top; the integrand is smooth, so the trapezoid
    rule converges spectrally (1201 points agree with 20001 to 1e−12). ``means`` may be a
    matrix (one law per row)."""
    mu = np.asarray(means, dtype=np.float64)
    single = mu.ndim == 1
    mu = mu.reshape(-1, mu.shape[-1])
    out = np.empty_like(mu)
    for start in range(0, mu.shape[0], 128):
        block = mu[start:start + 128] / sigma  # standardised means, rows × B
        top = block.max(axis=1, keepdims=True)
        low = np.maximum(block.min(axis=1, keepdims=True), top - 40.0) - 12.0
        z = low + (top + 12.0 - low) * np.linspace(0.0, 1.0, points)[None, :]  # rows × X
        diff = z[:, None, :] - block[:, :, None]  # rows × B × X
        logcdf = norm.logcdf(diff)
        total = logcdf.sum(axis=1, keepdims=True)
        integrand = norm.logpdf(diff) + total - logcdf
        dz = (z[:, 1] - z[:, 0])[:, None]
        res = logsumexp(integrand, axis=2) + np.log(dz)
        out[start:start + 128] = res - logsumexp(res, axis=1, keepdims=True)
    return out[0] if single else out


# =============================================================================================
# Monte Carlo
# =============================================================================================


def conditional_log_error(alg: Any, collection: Collection, distribution: Distribution,
                          sample: np.ndarray, rng: np.random.Generator) -> float:
    """log of the error given the sample, with the mechanism's randomness integrated out
    exactly (Monte Carlo over the noise only for Algorithm 2 with K′ > 2); −inf for 0."""
    n = len(sample)
    if isinstance(alg, _Identifier):
        big_k, kp = alg.horizon(n, collection)
        truth = identification_truth(collection, distribution, big_k)
        counts = error_counts(sample, collection, kp)
        excess = np.array(truth.errors) - truth.err_star
        if isinstance(alg, GaussianMarginIdentifier) and kp > 2:
            draws = 400
            sig = alg.sigma(n, kp)
            noisy = counts / n + rng.normal(0, sig, size=(draws, kp))
            idx = alg.index_from_noisy(noisy, big_k)
            v = float(np.mean(excess[idx - 1]))
            return math.log(v) if v > 0 else -math.inf
        pos = excess > 1e-15
        if not pos.any():
            return -math.inf
        return float(logsumexp(alg.log_law(counts, n, big_k)[pos] + np.log(excess[pos])))
    support = distribution.support
    if isinstance(alg, PointerGenerator):
        sel = alg.run(sample, collection, rng)
        bad = not (support.contains(sel.output) and not in_sample(sel.output, sample))
        return 0.0 if bad else -math.inf
    ctx = _generation_context(alg, collection, distribution, n)
    counts = multiplicities(sample, collection, ctx.window)
    kp, window = ctx.kp, ctx.window
    if isinstance(alg, GaussianThresholdGenerator):
        log_law = gaussian_argmax_log_law(alg.scores(counts, ctx.memb, n),
                                          alg.sigma(n, kp)).reshape(kp, window)
    elif isinstance(alg, JointThresholdGenerator):
        log_law = alg.log_law(counts, ctx.memb, n).reshape(kp, window)
    else:
        log_law = np.full((kp, window), -np.inf)
        log_law[:, -1] = alg.log_law(counts, ctx.memb, n)
    terms = []
    with np.errstate(divide="ignore"):
        inv = np.log(ctx.invalid)
    terms.append(log_law + inv)
    # collisions: distinct valid sample strings among the first R members beyond m
    uniq = np.unique(np.asarray(sample))
    log_r = math.log(ctx.big_r)
    for i in range(kp):
        inside = ctx.valid_langs[i].contains_many(uniq)
        if not inside.any():
            continue
        pos = np.array([ctx.universe.index(element_key(x)) for x in uniq[inside].tolist()])
        for m in range(window):
            if log_law[i, m] == -np.inf or ctx.invalid[i, m] >= 1:
                continue
            beyond = pos[pos > m + 1]
            if beyond.size:
                lang = collection[i + 1]
                base = lang.count_upto(m + 1)
                if lang.count_upto(int(beyond.max())) - base <= ctx.big_r:
                    hits = int(beyond.size)
                else:
                    hits = sum(1 for j in beyond.tolist()
                               if lang.count_upto(j) - base <= ctx.big_r)
                if hits:
                    terms.append(np.array([log_law[i, m] + math.log(hits) - log_r]))
    flat = np.concatenate([t.ravel() for t in terms])
    return float(min(0.0, logsumexp(flat)))


@dataclass
class _GenContext:
    kp: int
    window: int
    big_r: int
    memb: np.ndarray
    invalid: np.ndarray
    valid_langs: list[Any]
    universe: Any


_CONTEXTS: dict[tuple[int, int, int, int], tuple[Any, _GenContext]] = {}


def _generation_context(alg: Any, collection: Collection, distribution: Distribution,
                        n: int) -> _GenContext:
    key = (id(alg), id(collection), id(distribution), n)
    hit = _CONTEXTS.get(key)
    if hit is not None and hit[0] == (alg, collection, distribution):
        return hit[1]
    _, kp = alg.horizon(n, collection)
    window, big_r = alg.window(n), alg.pool(n)
    support = distribution.support
    valid_langs = [lang.intersection(support) for lang in collection.first(kp)]
    invalid = np.zeros((kp, window))
    for i, (lang, vl) in enumerate(zip(collection.first(kp), valid_langs, strict=True)):
        for m in range(1, window + 1):
            invalid[i, m - 1] = _invalid_fraction(lang, vl, m, big_r)
    ctx = _GenContext(kp, window, big_r, alg.membership(collection, n), invalid, valid_langs,
                      collection.universe)
    if len(_CONTEXTS) > 64:
        _CONTEXTS.clear()
    _CONTEXTS[key] = ((alg, collection, distribution), ctx)
    return ctx


def rao_blackwell_error(alg: Any, collection: Collection, distribution: Distribution, n: int,
                        runs: int, seed: int, confidence: float = 0.95,
                        unit_offset: int = 0) -> ErrorEstimate:
    """Average over ``runs`` samples S of the exact conditional error given S (run u draws S
    from ``RandomStreams(seed).generator(unit_offset + u)``)."""
    streams = RandomStreams(seed)
    logs = []
    for u in range(runs):
        rng = streams.generator(unit_offset + u)
        sample = distribution.sample(n, rng)
        logs.append(conditional_log_error(alg, collection, distribution, sample, rng))
    log_mean = float(logsumexp(logs) - math.log(runs))
    mean = math.exp(log_mean) if log_mean > -745 else 0.0
    lo, hi = wilson(mean * runs, runs, confidence)
    return ErrorEstimate(mean, log_mean, False, lo, hi, runs)


def run_failed(alg: Any, collection: Collection, distribution: Distribution,
               sample: np.ndarray, rng: np.random.Generator) -> float:
    """One end-to-end run: the realised excess risk (identification) or the 0/1 failure
    (generation: output ∉ supp D ∖ S)."""
    sel = alg.run(sample, collection, rng)
    if isinstance(alg, _Identifier):
        big_k, _ = alg.horizon(len(sample), collection)
        truth = identification_truth(collection, distribution, big_k)
        return truth.errors[sel.index - 1] - truth.err_star
    out = sel.output
    from .statistical import Unmaterialised

    if isinstance(out, Unmaterialised):  # longer than every sample string: only validity
        lang = collection[out.language_index]
        valid_lang = lang.intersection(distribution.support)
        if lang.issubset(valid_lang):
            return 0.0
        t = lang.count_upto(out.beyond) + out.rank
        lo1, hi1 = count_sub_among_first(lang, valid_lang, t)
        lo0, hi0 = count_sub_among_first(lang, valid_lang, t - 1)
        if lo1 != hi1 or lo0 != hi0:
            raise ValueError("the validity of an unmaterialised output is not determined")
        return 0.0 if lo1 > lo0 else 1.0
    return float(not (distribution.support.contains(out) and not in_sample(out, sample)))


def in_sample(u: Any, sample: np.ndarray) -> bool:
    """Whether u occurs in the sample (vectorised for integer samples)."""
    arr = np.asarray(sample)
    key = element_key(u)
    if arr.dtype.kind in "iu":
        return isinstance(key, int) and not isinstance(key, bool) and bool(np.any(arr == key))
    return any(element_key(x) == key for x in arr.tolist())


def monte_carlo_error(alg: Any, collection: Collection, distribution: Distribution, n: int,
                      runs: int, seed: int, confidence: float = 0.95,
                      unit_offset: int = 0) -> ErrorEstimate:
    """End-to-end Monte Carlo (sampling, oracles, mechanism, output step): each run u uses its
    own stream ``RandomStreams(seed).generator(unit_offset + u)`` (DESIGN invariant 5)."""
    streams = RandomStreams(seed)
    total = 0.0
    for u in range(runs):
        rng = streams.generator(unit_offset + u)
        sample = distribution.sample(n, rng)
        total += run_failed(alg, collection, distribution, sample, rng)
    mean = total / runs
    lo, hi = wilson(total, runs, confidence)
    return ErrorEstimate(mean, math.log(mean) if mean > 0 else -math.inf, False, lo, hi, runs)

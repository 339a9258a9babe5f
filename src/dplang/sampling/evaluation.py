"""Exact and Monte Carlo evaluation of samplers: output laws, TV distances, privacy audits.

The output law of a sampler A on P with n records is
``Q(z) = Σ_x Pr[X = x]·Pr[A(x) = z]`` (Raskhodnikova et al. 2021, §1). This module computes it

* **exactly** for k-ary samplers by enumerating the count vectors (multinomial, restricted to
  the support of P) and using each sampler's exact law given the counts
  (:func:`exact_output_law`); for *Poisson* samplers (dataset size N ~ Po(n), the setting of
  the lower bound) of the Laplace-histogram family for any k and n, because the counts are then
  independent Po(nP_j) and the one-integral formula of :mod:`dplang.sampling._histlaw` applies
  with mixed φ, ψ (:func:`exact_output_law_poisson`); in closed form for reveal-or-obscure;
* **exactly** for the clipped-mean and marginal product samplers, whose Q is a product with
  marginals given by binomial sums; TV between products is exact up to d = 16 (enumeration of
  {0,1}^d) and bracketed beyond (:func:`product_tv`, in :mod:`dplang.sampling.product_tv` with
  the bucketed sampler's Monte Carlo TV; re-exported here);
* **by Monte Carlo** otherwise, Rao–Blackwellised (the law given data and noise is averaged,
  never single draws), with a conservative confidence interval (:func:`estimate_tv`).

:func:`exact_privacy_audit` enumerates all pairs of neighbouring datasets for small n and
reports the largest privacy loss of the exact output laws (and the exact δ at the claimed ε) as
a :class:`~dplang.privacy.audit.AuditResult`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import gammaln
from scipy.stats import norm, poisson

from ..privacy.audit import AuditResult, delta_at_epsilon, max_log_loss
from ..privacy.calibration import CalibrationError, calibrate
from . import _histlaw
from .baselines import FirstRecordSampler, RandomRecordSampler
from .distance import tv_distance
from .kary import KarySampler, LaplaceHistogramSampler, RevealOrObscureSampler
from .product_tv import (  # re-exported: the product part of this module's job
    ProductTV,
    _poisson_binomial_tail,  # noqa: F401
    _product_pmf,
    bucketed_product_tv,
    product_tv,
)

__all__ = [
    "LawEstimate",
    "ProductTV",
    "TVEstimate",
    "bucketed_product_tv",
    "claim24_probability",
    "compositions",
    "estimate_output_law",
    "estimate_tv",
    "exact_output_law",
    "exact_output_law_poisson",
    "exact_privacy_audit",
    "exact_tv",
    "learning_error_quantile",
    "minimal_n",
    "product_tv",
    "support_miss_probability",
    "tv_distance",
]


def _check_p(p: np.ndarray) -> np.ndarray:
    arr = np.asarray(p, dtype=np.float64)
    if arr.ndim != 1 or np.any(arr < 0) or not abs(arr.sum() - 1) < 1e-9:
        raise ValueError("P must be a probability vector")
    return arr


# --------------------------------------------------------------------------------------------
# k-ary: exact


def compositions(n: int, k: int) -> Iterator[np.ndarray]:
    """All count vectors (c_0..c_{k−1}) of non-negative integers summing to n (stars and
    bars; there are C(n+k−1, k−1) of them)."""
    for bars in itertools.combinations(range(n + k - 1), k - 1):
        edges = np.array((-1, *bars, n + k - 1))
        yield np.diff(edges) - 1


def _multinomial_logpmf(c: np.ndarray, n: int, logp: np.ndarray) -> float:
    mask = c > 0
    return float(gammaln(n + 1) - gammaln(c + 1).sum() + (c[mask] * logp[mask]).sum())


def exact_output_law(sampler: Any, p: np.ndarray, n: int, max_datasets: int = 200_000
                     ) -> np.ndarray:
    """Exact Q for a k-ary sampler with n records drawn i.i.d. from P.

    Reveal-or-obscure, first record and random record have closed forms ((1−q)P + qU, P, P);
    other frequency-count samplers are evaluated by enumerating the count vectors supported by
    P (at most ``max_datasets`` of them) with their exact law given the counts."""
    p = _check_p(p)
    if isinstance(sampler, RevealOrObscureSampler):
        q = sampler.mixing_probability(n)
        return (1 - q) * p + q / sampler.k
    if isinstance(sampler, (FirstRecordSampler, RandomRecordSampler)):
        return p.copy()
    if not isinstance(sampler, KarySampler):
        raise TypeError(f"exact_output_law needs a k-ary sampler, got {type(sampler).__name__}")
    support = np.flatnonzero(p > 0)
    m = support.size
    count = math.comb(n + m - 1, m - 1)
    if count > max_datasets:
        raise ValueError(f"{count} count vectors exceed max_datasets={max_datasets}; use "
                         "exact_output_law_poisson or estimate_output_law")
    logp = np.log(p[support])
    q = np.zeros(sampler.k)
    full = np.zeros(sampler.k, dtype=np.int64)
    law = _symmetric_law_cache(sampler)
    for c in compositions(n, m):
        full[:] = 0
        full[support] = c
        q += math.exp(_multinomial_logpmf(c, n, logp)) * law(full)
    return q / q.sum()


def _symmetric_law_cache(sampler: Any) -> Callable[[np.ndarray], np.ndarray]:
    """The exact law given counts, computed once per multiset of counts: a frequency-count
    sampler's law commutes with permutations of the elements."""
    cache: dict[tuple[int, ...], np.ndarray] = {}

    def law(counts: np.ndarray) -> np.ndarray:
        c = np.asarray(counts, dtype=np.int64)
        order = np.argsort(c, kind="stable")
        key = tuple(int(v) for v in c[order])
        if key not in cache:
            cache[key] = sampler.exact_law_given_counts(np.array(key))
        out = np.empty(c.shape[0])
        out[order] = cache[key]
        return out

    return law


def exact_output_law_poisson(sampler: Any, p: np.ndarray, n: float) -> np.ndarray:
    """Exact Q of the *Poisson* version of a sampler: dataset size N ~ Po(n), X ~ P^{⊗N}.

    Supported: the Laplace-histogram family (continuous or discrete Laplace noise; counts are
    independent Po(nP_j), so the one-integral law applies with Poisson-mixed φ, ψ — exact for
    any k and n, cost growing with the number of distinct values of P), reveal-or-obscure
    (Q = (1 − E[q(N)])P + E[q(N)]U with q(0) = 1), and first/random record (Q = P given
    N ≥ 1, uniform when N = 0)."""
    p = _check_p(p)
    k = p.shape[0]
    if isinstance(sampler, LaplaceHistogramSampler):
        groups, inverse = _histlaw.poisson_count_groups(n * p)
        return _histlaw.histogram_sampler_law(groups, inverse, sampler.noise_scale,
                                              sampler.noise)
    if isinstance(sampler, RevealOrObscureSampler):
        lo = 0
        hi = math.ceil(n + 14 * math.sqrt(n + 1) + 30)
        big_n = np.arange(lo, hi + 1)
        w = poisson.pmf(big_n, n)
        q = np.where(big_n == 0, 1.0, k / (k + np.maximum(big_n, 1) * math.expm1(
            sampler.epsilon)))
        eq = float(np.dot(w, q) / w.sum())
        return (1 - eq) * p + eq / k
    if isinstance(sampler, (FirstRecordSampler, RandomRecordSampler)):
        p0 = math.exp(-n)
        return (1 - p0) * p + p0 / k
    raise TypeError(f"no exact Poisson law for {type(sampler).__name__}")


def exact_tv(sampler: Any, p: np.ndarray, n: float, poisson_size: bool = False) -> float:
    """d_TV(Q, P), exactly (see :func:`exact_output_law`, :func:`exact_output_law_poisson`)."""
    q = exact_output_law_poisson(sampler, p, n) if poisson_size else exact_output_law(
        sampler, p, int(n))
    return tv_distance(q, p)


def support_miss_probability(q: np.ndarray, p: np.ndarray) -> float:
    """Q(outside the support of P) — the quantity Lemma 2.1 bounds from below."""
    return float(np.asarray(q)[np.asarray(p) == 0].sum())


# --------------------------------------------------------------------------------------------
# k-ary: Monte Carlo


@dataclass(frozen=True)
class LawEstimate:
    """Rao–Blackwellised estimate of Q: the mean of the per-replication laws and its standard
    error per outcome."""

    mean: np.ndarray
    se: np.ndarray
    reps: int


@dataclass(frozen=True)
class TVEstimate:
    """A Monte Carlo estimate of d_TV(Q, P) with a conservative confidence interval.

    ``tv`` is the plug-in ½Σ|Q̂ − P| (biased upward by at most about ``noise_floor`` =
    ½Σ se_z·√(2/π) when Q = P). [``lower``, ``upper``] = tv ∓ ½Σ_z h_z with h_z simultaneous
    (Bonferroni) normal half-widths at ``confidence``; it contains d_TV(Q, P) whenever every
    |Q̂_z − Q_z| ≤ h_z, because |d_TV(Q̂, P) − d_TV(Q, P)| ≤ d_TV(Q̂, Q)."""

    tv: float
    lower: float
    upper: float
    noise_floor: float
    reps: int
    confidence: float


def _counts_draw(p: np.ndarray, n: float, size: int, rng: np.random.Generator,
                 poisson_size: bool) -> np.ndarray:
    if poisson_size:
        return rng.poisson(n * p, size=(size, p.shape[0]))
    return rng.multinomial(int(n), p, size=size)


def estimate_output_law(sampler: Any, p: np.ndarray, n: float, reps: int,
                        rng: np.random.Generator, poisson_size: bool = False,
                        exact_noise: bool = False, chunk: int = 4096) -> LawEstimate:
    """Monte Carlo estimate of Q for a frequency-count k-ary sampler: ``reps`` datasets (count
    vectors) are drawn; for each, the law given the counts and one noise draw is averaged
    (or, with ``exact_noise``, the exact law given the counts — slower, less variance)."""
    p = _check_p(p)
    total = np.zeros(p.shape[0])
    total_sq = np.zeros(p.shape[0])
    done = 0
    while done < reps:
        m = min(chunk, reps - done)
        counts = _counts_draw(p, n, m, rng, poisson_size)
        if exact_noise:
            laws = np.vstack([sampler.exact_law_given_counts(c) for c in counts])
        else:
            laws = sampler.batch_law_given_counts(counts, rng)
        total += laws.sum(axis=0)
        total_sq += (laws * laws).sum(axis=0)
        done += m
    mean = total / reps
    var = np.maximum(total_sq / reps - mean * mean, 0.0) * reps / max(reps - 1, 1)
    return LawEstimate(mean, np.sqrt(var / reps), reps)


def tv_with_interval(estimate: LawEstimate, p: np.ndarray, confidence: float = 0.95
                     ) -> TVEstimate:
    """The plug-in TV of a law estimate with its conservative interval (see TVEstimate)."""
    k = estimate.mean.shape[0]
    z = float(norm.ppf(1 - (1 - confidence) / (2 * k)))
    half = 0.5 * float(estimate.se.sum()) * z
    tv = tv_distance(estimate.mean, p)
    floor = 0.5 * float(estimate.se.sum()) * math.sqrt(2 / math.pi)
    return TVEstimate(tv, max(0.0, tv - half), tv + half, floor, estimate.reps, confidence)


def estimate_tv(sampler: Any, p: np.ndarray, n: float, reps: int, rng: np.random.Generator,
                poisson_size: bool = False, confidence: float = 0.95, **kwargs: Any
                ) -> TVEstimate:
    """Monte Carlo d_TV(Q, P) with a conservative confidence interval (k-ary samplers)."""
    est = estimate_output_law(sampler, p, n, reps, rng, poisson_size, **kwargs)
    return tv_with_interval(est, p, confidence)


def learning_error_quantile(sampler: Any, p: np.ndarray, n: int, reps: int,
                            rng: np.random.Generator, level: float) -> float:
    """The ``level``-quantile of d_TV(P̃, P) where P̃ is the distribution the sampler learns
    (its law given the data and noise): a learner is α-accurate (Definition 1.2) when the
    (1−α)-quantile is ≤ α."""
    p = _check_p(p)
    counts = rng.multinomial(int(n), p, size=reps)
    laws = sampler.batch_law_given_counts(counts, rng)
    errors = 0.5 * np.abs(laws - p[None, :]).sum(axis=1)
    return float(np.quantile(errors, level))


def claim24_probability(k: int, n: float, alpha: float, epsilon: float, reps: int,
                        rng: np.random.Generator) -> float:
    """Monte Carlo Pr[Y/k > e³] with Y = Σ_{i≤k} e^{εN_i}, N_i ~ Po(60αn/k) i.i.d. (Claim 2.4
    says it is ≤ α when n ≤ k/(60αε) and ε ≤ 1/ln(1/α))."""
    counts = rng.poisson(60 * alpha * n / k, size=(reps, k))
    y = np.exp(epsilon * counts).mean(axis=1)
    return float(np.mean(y > math.e**3))


def minimal_n(tv_at: Callable[[float], float], alpha: float, lo: float, hi: float,
              rel_tol: float = 1e-3, integer: bool = False) -> float:
    """Smallest n in [lo, hi] with tv_at(n) ≤ α (tv_at assumed non-increasing), by
    :func:`dplang.privacy.calibration.calibrate`: doubling from ``lo`` until the condition holds
    (so n far above the answer is never evaluated), then bisection on log n to relative
    precision ``rel_tol``. Raises ValueError when even tv_at(hi) > α. With ``integer`` the
    result is an integer."""
    try:
        n = calibrate(lambda n: tv_at(float(n)) <= alpha, lo, min(hi, 2.0 * lo), safe="above",
                      rtol=rel_tol, log_scale=True, integer=integer, limit=hi)
    except CalibrationError:
        raise ValueError(f"TV at n = {hi} is above alpha = {alpha}; raise hi") from None
    return float(n)


# --------------------------------------------------------------------------------------------
# Exact privacy audit


def _kary_pairs(n: int, k: int) -> Iterator[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every ordered pair of count vectors over k types (n items) that differ by moving one
    item: the replace-one neighbours of frequency-count data (k-ary records, or the 2^d row
    types of binary records)."""
    for c in compositions(n, k):
        for a in range(k):
            if c[a] == 0:
                continue
            for b in range(k):
                if b != a:
                    c2 = c.copy()
                    c2[a] -= 1
                    c2[b] += 1
                    yield tuple(int(v) for v in c), tuple(int(v) for v in c2)


def _rows_from_types(counts: tuple[int, ...], d: int) -> np.ndarray:
    rows = []
    for t, m in enumerate(counts):
        bits = [(t >> j) & 1 for j in range(d)]
        rows.extend([bits] * m)
    return np.array(rows, dtype=np.uint8)


def exact_privacy_audit(sampler: Any, n: int, k: int | None = None, d: int | None = None,
                        guarantee: Any = None) -> AuditResult:
    """Enumerate every pair of neighbouring datasets of size n and compare the exact output
    laws.

    k-ary samplers (give ``k``): frequency-count samplers are enumerated over count vectors
    (every replace-one neighbour changes one count by −1 and another by +1); order-dependent
    ones (first record) over all of [k]^n. Product samplers (give ``d``): datasets are
    multisets of n rows in {0,1}^d, the output law is the product with the sampler's exact
    conditional biases, over all 2^d outputs. The claimed guarantee defaults to
    ``sampler.guarantee(n, d)``.

    Returns the :class:`~dplang.privacy.audit.AuditResult` with ``max_log_ratio`` (the largest
    |log Pr[A(x)=y] − log Pr[A(x')=y]| over all neighbours and outputs, ∞ when supports differ),
    ``delta_at_epsilon`` (the largest exact δ at the claimed ε), ``worst_pair`` (the datasets —
    count vectors or row-type counts — attaining the maximum) and ``passed``: the exact δ at
    the claimed ε is within the claimed δ (1e-9 slack)."""
    g = guarantee if guarantee is not None else sampler.guarantee(n, d)
    eps, dl = float(g.epsilon), float(g.delta)
    cache: dict[tuple[int, ...], np.ndarray] = {}
    if k is not None:
        if getattr(sampler, "symmetric", True):
            sym = _symmetric_law_cache(sampler)

            def law(key: tuple[int, ...]) -> np.ndarray:
                if key not in cache:
                    cache[key] = sym(np.array(key))
                return cache[key]
            pairs: Iterator[tuple[Any, Any]] = _kary_pairs(n, k)
        else:
            def law(key: tuple[int, ...]) -> np.ndarray:
                if key not in cache:
                    cache[key] = sampler.conditional_law(np.array(key))
                return cache[key]

            def full_pairs() -> Iterator[tuple[Any, Any]]:
                for x in itertools.product(range(k), repeat=n):
                    for i in range(n):
                        for v in range(k):
                            if v != x[i]:
                                yield x, (*x[:i], v, *x[i + 1:])
            pairs = full_pairs()
    elif d is not None:
        def law(key: tuple[int, ...]) -> np.ndarray:
            if key not in cache:
                cache[key] = _product_pmf(sampler.conditional_law(_rows_from_types(key, d)))
            return cache[key]
        pairs = _kary_pairs(n, 1 << d)
    else:
        raise ValueError("give k (k-ary samplers) or d (product samplers)")
    worst = -1.0
    worst_pair: tuple[Any, Any] = ((), ())
    delta_max = 0.0
    count = 0
    for a, b in pairs:
        p, q = law(a), law(b)
        count += 1
        with np.errstate(divide="ignore"):
            ratio = max_log_loss(np.log(p), np.log(q))
        if ratio > worst:
            worst, worst_pair = ratio, (a, b)
        delta_max = max(delta_max, delta_at_epsilon(p, q, eps))
    return AuditResult(mechanism=getattr(sampler, "name", type(sampler).__name__),
                       epsilon=eps, delta=dl, passed=delta_max <= dl + 1e-9, pairs=count,
                       worst_pair=worst_pair, max_log_ratio=worst, delta_at_epsilon=delta_max)

"""Total variation between product laws, exact or bracketed, and the Monte Carlo TV of the
bucketed product sampler (part of :mod:`dplang.sampling.evaluation`, which re-exports it).

Evaluation on a known (public) P: it releases nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import norm

from .distance import tv_distance
from .product import (
    BucketedProductSampler,
    SparseBinaryRows,
    binomial_expectation,
    clipped_gaussian_mean,
)

__all__ = ["ProductTV", "bucketed_product_tv", "product_tv"]


@dataclass(frozen=True)
class ProductTV:
    """d_TV between two product laws on {0,1}^d: exact when d ≤ 16, else bracketed by
    ``lower`` = max(max_j |q_j − p_j|, 1 − BC) and ``upper`` = min(Σ_j|q_j − p_j|,
    √(1 − BC²)), BC = Π_j BC_j the Bhattacharyya coefficient."""

    lower: float
    upper: float
    exact: float | None

    @property
    def value(self) -> float:
        """The exact value when known, else the upper bound."""
        return self.exact if self.exact is not None else self.upper


def _product_pmf(b: np.ndarray) -> np.ndarray:
    law = np.ones(1)
    for bj in b:
        law = np.concatenate([law * (1 - bj), law * bj])
    return law


def product_tv(q: np.ndarray, p: np.ndarray, exact_max_d: int = 16) -> ProductTV:
    """d_TV(⊗Ber(q_j), ⊗Ber(p_j)) (see :class:`ProductTV`)."""
    q = np.clip(np.asarray(q, dtype=np.float64), 0, 1)
    p = np.clip(np.asarray(p, dtype=np.float64), 0, 1)
    diffs = np.abs(q - p)
    bc_j = np.sqrt(q * p) + np.sqrt((1 - q) * (1 - p))
    bc = float(np.exp(np.sum(np.log(np.maximum(bc_j, 1e-300)))))
    lower = max(float(diffs.max(initial=0.0)), 1.0 - bc)
    upper = min(float(diffs.sum()), math.sqrt(max(0.0, 1.0 - bc * bc)), 1.0)
    exact = None
    if q.shape[0] <= exact_max_d:
        exact = tv_distance(_product_pmf(q), _product_pmf(p))
    return ProductTV(lower, upper, exact)


@dataclass(frozen=True)
class PlanMarginals:
    """A3 (``BucketedProductSampler``) evaluated on P: for each simulated bucketing plan r, the
    exact marginals ``q[r]`` of the untruncated sampling phase and the exact probability
    ``truncation[r]`` that some sampling-phase row is truncated (the only event on which the
    real output differs from that product law)."""

    q: np.ndarray
    truncation: np.ndarray
    buckets: np.ndarray


def bucketed_marginals(sampler: BucketedProductSampler, p: np.ndarray, n: int, reps: int,
                       rng: np.random.Generator) -> PlanMarginals:
    """Simulate A3's orientation and bucketing phases ``reps`` times on fresh data from P and
    compute, given each plan, the sampling phase's exact marginals (binomial sums of the
    clipped Gaussian mean) and truncation probability (Poisson-binomial row sums) — the same
    computation :func:`bucketed_product_tv` bounds d_TV from."""
    p = np.asarray(p, dtype=np.float64)
    d = p.shape[0]
    (_o0, _o1), (_b0, b1), (s0, s1) = sampler.blocks(n)
    n_s = s1 - s0
    qs = np.empty((reps, d))
    truncs = np.empty(reps)
    nb = np.empty(reps)
    sparse = float(p.sum()) <= 0.05 * d
    for r in range(reps):
        if sparse:
            part = SparseBinaryRows.random(p, b1, rng)
            indptr = np.concatenate([part.indptr, np.full(n - b1, part.indptr[-1])])
            data: Any = SparseBinaryRows(indptr, part.indices, (n, d))
        else:
            data = np.zeros((n, d), dtype=np.uint8)
            data[:b1] = rng.random((b1, d)) < p
        plan = sampler.plan(data, rng)
        params = sampler.phase2_parameters(plan, n, d)
        pf = np.where(plan.flips, 1 - p, p)
        q = np.empty(d)
        no_trunc = 1.0
        for (cols, _u), (t_b, sigma) in zip(plan.buckets, params, strict=True):
            s = sigma / n_s
            q[cols] = binomial_expectation(n_s, pf[cols],
                                           lambda m, s=s: clipped_gaussian_mean(m, s))
            no_trunc *= (1.0 - _poisson_binomial_tail(pf[cols], t_b)) ** n_s
        qs[r] = np.where(plan.flips, 1 - q, q)
        truncs[r] = 1.0 - no_trunc
        nb[r] = len(plan.buckets)
    return PlanMarginals(qs, truncs, nb)


def bucketed_product_tv(sampler: BucketedProductSampler, p: np.ndarray, n: int, reps: int,
                        rng: np.random.Generator, confidence: float = 0.95) -> dict[str, float]:
    """Semi-analytic bounds on d_TV(Q, P) for the general product sampler.

    Phases 0–1 (orientation, bucketing) are simulated ``reps`` times on fresh data (stored
    sparsely when P has few ones, which is exact and lets d reach the thousands). Given their
    outcome (the plan), the *untruncated* phase-2 output is a product with exact marginals
    q_j = E[clip((T_j + σ_b N)/n_S, 0, 1)], T_j ~ Bin(n_S, p_j') (binomial sums), and the real
    output differs from it only when some phase-2 row is truncated, whose probability is
    computed exactly (Poisson-binomial row sums). Hence

        d_TV(Q, P) ≤ E_plan[ Pr(truncation | plan) + d_TV(⊗Ber(q), P) ]  (upper),
        d_TV(Q, P) ≥ max_j |E_plan q_j − p_j| − E_plan Pr(truncation)     (lower),

    with d_TV(⊗Ber(q), P) exact for d ≤ 16 and bounded above otherwise. Returns the upper bound
    estimate and its one-sided upper confidence limit, the lower bound (point estimate), the
    mean truncation probability and the mean number of buckets."""
    p = np.asarray(p, dtype=np.float64)
    marginals = bucketed_marginals(sampler, p, n, reps, rng)
    qs, truncs = marginals.q, marginals.truncation
    ub = np.array([min(1.0, trunc + product_tv(q, p).value) for q, trunc in zip(qs, truncs,
                                                                             strict=True)])
    z = float(norm.ppf(confidence))
    mean_ub = float(ub.mean())
    se = float(ub.std(ddof=1) / math.sqrt(reps)) if reps > 1 else 0.0
    lower = max(0.0, float(np.abs(qs.mean(axis=0) - p).max()) - float(truncs.mean()))
    return {"upper": mean_ub, "upper_limit": mean_ub + z * se, "lower": lower,
            "truncation": float(truncs.mean()), "buckets": float(marginals.buckets.mean()),
            "reps": reps}


def _poisson_binomial_tail(p: np.ndarray, t: int) -> float:
    """Pr[Σ_j B_j > t] for independent B_j ~ Ber(p_j) (exact dynamic programme, O(d·t))."""
    if t >= p.shape[0]:
        return 0.0
    dist = np.zeros(t + 2)
    dist[0] = 1.0
    for pj in p:
        over = dist[-1]
        dist[1:] = dist[1:] * (1 - pj) + dist[:-1] * pj
        dist[0] *= 1 - pj
        dist[-1] += over * pj  # the last cell accumulates "more than t"
    return float(min(1.0, max(0.0, dist[-1])))

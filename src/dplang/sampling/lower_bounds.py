"""Measuring the lower bounds and structural claims of Raskhodnikova et al. 2021 with dplang's
samplers.

* **Theorem 1.7 / claim 18** (general products need Ω(d) samples): on ``subset_product(k)``
  (bias 1/k on k of d = 2k coordinates, 0 elsewhere) an accurate sampler must tell bias-0
  coordinates from bias-1/k ones; :func:`support_miss_product` is the mass a product law puts
  outside the support of P (a one on some bias-0 coordinate), which lower-bounds d_TV.
* **Claim 16** (a learner with error α gives a 2α-accurate sampler): :func:`learner_alpha`
  turns a sample of learning errors into the learner's α (Definition 1.2) and
  :func:`claim16_check` compares it with the exact TV of the sampler that samples from the
  learned distribution (the noisy-histogram sampler A1, Poisson sizes).
* **Claim 7 / Claim 2.2** (p_{j,F} ≤ e^{εj} p_{0,F}): :func:`claim22_ratio`.
* **The zero-bias principle (F9)**: :func:`bias_decomposition` splits A1's exact TV into the
  part on elements absent from P's support and the part on present ones.
* **TV of the general product sampler with intervals**:
  :func:`bucketed_marginals` simulates A3's bucketing phases and returns, per plan, the exact
  marginals of its (untruncated) sampling phase; :func:`mixture_tv_monte_carlo` estimates the TV
  between the mixture of those product laws and P by importance sampling under P, with a
  confidence interval; :func:`mixture_support_miss` gives an exact lower bound for the same
  mixture.

Privacy contract of every function here: none needed — they evaluate known, public test
distributions P and release nothing about private data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import norm

from .evaluation import exact_tv
from .product_tv import PlanMarginals, bucketed_marginals

__all__ = [
    "BiasDecomposition",
    "Claim16",
    "MixtureTV",
    "PlanMarginals",
    "bias_decomposition",
    "bucketed_marginals",
    "claim16_check",
    "claim22_ratio",
    "learner_alpha",
    "mixture_support_miss",
    "mixture_tv_monte_carlo",
    "support_miss_product",
]


# --------------------------------------------------------------------------------------------
# Theorem 1.7: mass outside the support


def support_miss_product(q: np.ndarray, p: np.ndarray) -> float:
    """Pr_{y∼⊗Ber(q)}[y_j = 1 for some j with p_j = 0]: the mass a product law puts outside the
    support of the product P (P gives it 0), hence a lower bound on d_TV(⊗Ber(q), P)."""
    q = np.asarray(q, dtype=np.float64)
    zero = np.asarray(p, dtype=np.float64) == 0
    return float(-np.expm1(np.sum(np.log1p(-np.clip(q[zero], 0.0, 1.0)))))


def mixture_support_miss(marginals: PlanMarginals, p: np.ndarray) -> float:
    """Lower bound on d_TV(Q, P) for A3: the mass the mixture of the plans' untruncated product
    laws puts outside P's support, minus the mean truncation probability (clipped at 0)."""
    miss = np.mean([support_miss_product(q, p) for q in marginals.q])
    return max(0.0, float(miss - marginals.truncation.mean()))


@dataclass(frozen=True)
class MixtureTV:
    """Monte Carlo estimate of d_TV(mean_r ⊗Ber(q_r), ⊗Ber(p)) with a normal interval."""

    estimate: float
    lower: float
    upper: float
    samples: int


def mixture_tv_monte_carlo(qs: np.ndarray, p: np.ndarray, samples: int,
                           rng: np.random.Generator, confidence: float = 0.95,
                           chunk: int = 2000) -> MixtureTV:
    """d_TV(Q̄, P) = E_{y∼P}[(1 − Q̄(y)/P(y))₊] for the mixture Q̄ = mean_r ⊗Ber(q_r) and the
    product P = ⊗Ber(p), estimated from ``samples`` draws y ∼ P (the integrand is in [0, 1]:
    an unbiased estimate with a normal confidence interval). Mass Q̄ puts where P is zero is
    counted through the identity TV = Σ_y (P(y) − Q̄(y))₊."""
    qs = np.atleast_2d(np.clip(np.asarray(qs, dtype=np.float64), 0.0, 1.0))
    p = np.asarray(p, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        # log-ratio of a zero and of a one at each coordinate, per component [d, R]
        l0 = np.where(p < 1, np.log1p(-qs) - np.log1p(-p), 0.0).T
        l1 = np.where(p > 0, np.log(qs) - np.log(p), 0.0).T
    l0 = np.nan_to_num(l0, nan=0.0, neginf=-np.inf)
    base = l0.sum(axis=0)  # all zeros
    diff = l1 - l0
    vals = []
    done = 0
    while done < samples:
        size = min(chunk, samples - done)
        y = rng.random((size, p.size)) < p
        if np.isinf(diff).any():
            with np.errstate(invalid="ignore"):
                lr = np.where(y[:, :, None], diff[None, :, :], 0.0).sum(axis=1)
        else:
            lr = y.astype(np.float64) @ diff
        lr = lr + base[None, :]
        ratio = np.exp(lr).mean(axis=1)
        vals.append(np.clip(1.0 - ratio, 0.0, 1.0))
        done += size
    v = np.concatenate(vals)
    est = float(v.mean())
    z = float(norm.ppf(0.5 + confidence / 2))
    se = float(v.std(ddof=1) / math.sqrt(v.size)) if v.size > 1 else 0.0
    return MixtureTV(est, max(0.0, est - z * se), min(1.0, est + z * se), int(v.size))


# --------------------------------------------------------------------------------------------
# Claim 16: learner -> sampler


def learner_alpha(errors: np.ndarray) -> float:
    """The smallest α with Pr[d_TV(P̃, P) > α] ≤ α for the empirical law of ``errors``: the
    learner is then α-accurate in the sense of Definition 1.2."""
    e = np.sort(np.asarray(errors, dtype=np.float64))
    m = e.size
    # g(α) = #{e_i > α}/m is a non-increasing step function; the smallest α with g(α) ≤ α is
    # one of the data values or one of the levels t/m
    cand = np.unique(np.concatenate([e, np.arange(m + 1) / m]))
    tail = (m - np.searchsorted(e, cand, side="right")) / m
    return float(cand[tail <= cand].min())


@dataclass(frozen=True)
class Claim16:
    """A noisy-histogram learner's α against the TV of the sampler built from it."""

    n: float
    learner_alpha: float
    mean_learning_error: float
    mean_learning_error_se: float
    sampler_tv: float

    @property
    def holds(self) -> bool:
        """TV(Q, P) ≤ 2α (claim 16) — and ≤ E[d_TV(P̃, P)] (the proof's first step, Jensen;
        an equality on a point mass), up to 3 Monte Carlo standard errors of the mean."""
        return (self.sampler_tv <= 2 * self.learner_alpha + 1e-12
                and self.sampler_tv <= self.mean_learning_error
                + 3 * self.mean_learning_error_se + 1e-12)


def claim16_check(sampler: Any, p: np.ndarray, n: float, reps: int,
                  rng: np.random.Generator) -> Claim16:
    """Run the k-ary ``sampler`` as a learner (its law P̃ given Poisson(nP_j) counts and one
    noise draw) ``reps`` times, and compare its α and mean error with the exact TV of the
    sampler's output law (Poisson sizes)."""
    p = np.asarray(p, dtype=np.float64)
    counts = rng.poisson(n * p, size=(reps, p.size))
    laws = sampler.batch_law_given_counts(counts, rng)
    errors = 0.5 * np.abs(laws - p[None, :]).sum(axis=1)
    return Claim16(float(n), learner_alpha(errors), float(errors.mean()),
                   float(errors.std(ddof=1) / math.sqrt(reps)),
                   exact_tv(sampler, p, n, poisson_size=True))


# --------------------------------------------------------------------------------------------
# Claim 2.2 and the zero-bias principle


def claim22_ratio(law: np.ndarray, counts: np.ndarray, epsilon: float) -> float:
    """max over elements z seen j ≥ 1 times of Pr[z] / (e^{εj}·Pr[unseen element]) for the law
    of a frequency-count-based sampler given ``counts`` (Claim 2.2 with δ = 0 says ≤ 1). The
    unseen probability is the largest over unseen elements (they are equal for a
    frequency-count-based sampler); NaN when every element is seen."""
    law = np.asarray(law, dtype=np.float64)
    counts = np.asarray(counts)
    unseen = counts == 0
    if not unseen.any():
        return math.nan
    p0 = float(law[unseen].max())
    seen = ~unseen
    if not seen.any():
        return 0.0
    with np.errstate(divide="ignore"):
        r = law[seen] / (np.exp(epsilon * counts[seen]) * p0)
    return float(r.max())


@dataclass(frozen=True)
class BiasDecomposition:
    """d_TV(Q, P) split by where it is lost: on elements outside P's support (½ of Q's mass
    there) and on elements inside it."""

    n: float
    tv: float
    absent: float
    present: float


def bias_decomposition(q: np.ndarray, p: np.ndarray, n: float) -> BiasDecomposition:
    """Split ½Σ|Q − P| into the absent (P_z = 0) and present parts."""
    q = np.asarray(q, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    out = p == 0
    diff = 0.5 * np.abs(q - p)
    return BiasDecomposition(float(n), float(diff.sum()), float(diff[out].sum()),
                             float(diff[~out].sum()))

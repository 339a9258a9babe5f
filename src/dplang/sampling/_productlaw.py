"""Exact marginal laws of the product samplers: binomial expectations and the means of a
clipped noisy mean (Laplace and Gaussian), used by ``exact_marginals`` and ``conditional_law``
of :mod:`dplang.sampling.product` and by the evaluation.

Numerical helpers on public quantities (a known bias, a noise scale): they release nothing.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import ndtr
from scipy.stats import binom

__all__ = ["binomial_expectation", "clipped_gaussian_mean", "clipped_laplace_mean"]


def binomial_expectation(n: int, p: np.ndarray, g, width: float = 14.0) -> np.ndarray:
    """E[g(T/n)] for T ~ Bin(n, p_j), for each bias p_j (exact up to the binomial mass beyond
    mean ± width·sd + 30, below 1e-40). ``g`` maps an array of means m ∈ [0, 1] to values."""
    p = np.atleast_1d(np.asarray(p, dtype=np.float64))
    out = np.empty(p.shape[0])
    cache: dict[float, float] = {}
    for j, pj in enumerate(p):
        if pj in cache:
            out[j] = cache[pj]
            continue
        sd = math.sqrt(n * pj * (1 - pj))
        lo = max(0, math.floor(n * pj - width * sd - 30))
        hi = min(n, math.ceil(n * pj + width * sd + 30))
        t = np.arange(lo, hi + 1)
        w = binom.pmf(t, n, pj)
        cache[pj] = out[j] = float(np.dot(w, g(t / n)) / w.sum())
    return out


def clipped_laplace_mean(m: np.ndarray, scale: float) -> np.ndarray:
    """E[clip(m + Z, 0, 1)] for Z ~ Lap(scale) and m ∈ [0, 1]:
    m + (b/2)(e^{−m/b} − e^{−(1−m)/b})."""
    m = np.asarray(m, dtype=np.float64)
    b = float(scale)
    return m + 0.5 * b * (np.exp(-m / b) - np.exp(-(1.0 - m) / b))


def _gauss_excess(a: np.ndarray, sigma: float) -> np.ndarray:
    """E[(σN − a)⁺] = σφ(a/σ) − a(1 − Φ(a/σ))."""
    z = a / sigma
    return sigma * np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi) - a * ndtr(-z)


def clipped_gaussian_mean(m: np.ndarray, sigma: float) -> np.ndarray:
    """E[clip(m + σN, 0, 1)] for N ~ N(0, 1): m + E[(σN − m)⁺] − E[(σN − (1−m))⁺]."""
    m = np.asarray(m, dtype=np.float64)
    return m + _gauss_excess(m, sigma) - _gauss_excess(1.0 - m, sigma)

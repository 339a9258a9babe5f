"""Exact output law of the noisy-histogram sampler (clip-and-renormalise), by one integral.

The Laplace-histogram sampler (Theorem 1.4 of Raskhodnikova et al. 2021) adds independent noise
Z_j to each count c_j, clips at zero, w_j = max(c_j + Z_j, 0), and outputs z with probability
w_z / s, s = Σ_j w_j (uniform when s = 0). Its law given the counts is

    Pr[z | c] = E[w_z / s ; s > 0] + Pr[s = 0] / k .

With 1/s = ∫_0^∞ e^{−ts} dt (s > 0; when s = 0 also w_z = 0) and Tonelli, independence of the
w_j turns the k-dimensional expectation into ONE integral over t:

    E[w_z / s ; s > 0] = ∫_0^∞ ψ_z(t) · Π_{j≠z} φ_j(t) dt,
    φ_j(t) = E[e^{−t w_j}],  ψ_z(t) = E[w_z e^{−t w_z}],  Pr[s = 0] = Π_j Pr[w_j = 0].

φ and ψ have closed forms for Laplace noise (derived below) and are finite sums for discrete
Laplace noise; the t-integral is done by adaptive Gauss–Kronrod (``scipy.integrate.quad_vec``)
after the map t = t₀·u/(1−u), u ∈ [0, 1). The same identity holds when the counts are random
and independent across elements — e.g. Poissonised data, c_j ~ Po(n·P_j) — with φ, ψ, Pr[w=0]
replaced by their mixtures over c_j: that gives the *exact* output law Q of the Poisson sampler
for any k and n. Elements whose count law is identical share φ and ψ, so the cost grows with
the number of distinct count laws, not with k.

Closed forms for Laplace noise of scale b and a count c ≥ 0 (x = c(1/b − t), y = |x|):

    Pr[w = 0] = ½ e^{−c/b}
    φ(t) = ½ e^{−c/b} + (c/2b)·e^{−c·min(t, 1/b)}·h(y) + e^{−ct}/(2(bt+1))
    ψ(t) = (c²/2b)·[e^{−ct} k(y) if x ≥ 0 else e^{−c/b} g(y)] + e^{−ct}(c + b/(bt+1))/(2(bt+1))

with h(y) = (1−e^{−y})/y, k(y) = ∫₀¹(1−v)e^{−yv}dv = (y − 1 + e^{−y})/y², g(y) = ∫₀¹ v e^{−yv}dv
= (1 − e^{−y}(1+y))/y², all evaluated stably (series near 0) and in log space.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import gammaln, logsumexp

_LOG_HALF = math.log(0.5)
_SERIES_CUT = 0.5
_SERIES_TERMS = 24


def _series(y: np.ndarray, denom: np.ndarray) -> np.ndarray:
    """Σ_m (−y)^m / (m! · denom[m])."""
    out = np.zeros_like(y)
    term = np.ones_like(y)
    for m in range(_SERIES_TERMS):
        out += term / denom[m]
        term = term * (-y) / (m + 1)
    return out


_M = np.arange(_SERIES_TERMS, dtype=np.float64)
_DEN_H = _M + 1.0
_DEN_K = (_M + 1.0) * (_M + 2.0)
_DEN_G = _M + 2.0


def _log_special(y: np.ndarray, which: str) -> np.ndarray:
    """log h(y), log k(y) or log g(y) for y ≥ 0 (see module docstring)."""
    y = np.asarray(y, dtype=np.float64)
    out = np.empty_like(y)
    small = y < _SERIES_CUT
    ys = y[small]
    yl = y[~small]
    if which == "h":
        out[small] = np.log(_series(ys, _DEN_H))
        out[~small] = np.log(-np.expm1(-yl)) - np.log(yl)
    elif which == "k":
        out[small] = np.log(_series(ys, _DEN_K))
        out[~small] = np.log(yl + np.expm1(-yl)) - 2 * np.log(yl)
    else:
        out[small] = np.log(_series(ys, _DEN_G))
        out[~small] = np.log(-np.expm1(-yl) - yl * np.exp(-yl)) - 2 * np.log(yl)
    return out


def _laplace_parts(c: np.ndarray, b: float, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log φ(t), log ψ(t)) for Laplace noise of scale b: arrays of shape (len(c), len(t))."""
    c = np.asarray(c, dtype=np.float64)[:, None]
    t = np.asarray(t, dtype=np.float64)[None, :]
    inv_b = 1.0 / b
    x = c * (inv_b - t)
    y = np.abs(x)
    pos = c > 0
    with np.errstate(divide="ignore"):
        log_c = np.where(pos, np.log(np.where(pos, c, 1.0)), -np.inf)
    log_p0 = _LOG_HALF - c * inv_b
    log_bt1 = np.log(2 * (b * t + 1))
    log_s1 = log_c - math.log(2 * b) - c * np.minimum(t, inv_b) + _log_special(y, "h")
    log_s2 = -c * t - log_bt1
    log_phi = np.logaddexp(np.logaddexp(log_p0, log_s1), log_s2)
    inner = np.where(x >= 0, -c * t + _log_special(y, "k"), -c * inv_b + _log_special(y, "g"))
    log_psi1 = 2 * log_c - math.log(2 * b) + inner
    log_psi2 = -c * t - log_bt1 + np.log(c + b / (b * t + 1))
    log_psi = np.logaddexp(log_psi1, log_psi2)
    return log_phi, log_psi


def _laplace_log_p0(c: np.ndarray, b: float) -> np.ndarray:
    return _LOG_HALF - np.asarray(c, dtype=np.float64) / b


def _dlap_tail(b: float) -> int:
    return math.ceil(45.0 * b) + 5


def _dlap_parts(c: np.ndarray, b: float, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log φ(t), log ψ(t)) for discrete Laplace noise of scale b (P(z) ∝ e^{−|z|/b}), by
    direct summation over the values w = 1, …, c + 45b (the omitted tail is < e^{−45})."""
    log_r = -1.0 / b
    log_a = math.log(math.tanh(0.5 / b))
    tail = _dlap_tail(b)
    t = np.asarray(t, dtype=np.float64)
    cs = np.asarray(c, dtype=np.int64)
    log_phi = np.empty((cs.shape[0], t.shape[0]))
    log_psi = np.empty((cs.shape[0], t.shape[0]))
    for i, ci in enumerate(cs):
        y = np.arange(1, ci + tail + 1, dtype=np.float64)
        terms = (log_a + np.abs(y - ci) * log_r)[:, None] - y[:, None] * t[None, :]
        log_p0 = ci * log_r - math.log1p(math.exp(log_r))
        log_phi[i] = np.logaddexp(log_p0, logsumexp(terms, axis=0))
        log_psi[i] = logsumexp(terms + np.log(y)[:, None], axis=0)
    return log_phi, log_psi


def _dlap_log_p0(c: np.ndarray, b: float) -> np.ndarray:
    log_r = -1.0 / b
    return np.asarray(c, dtype=np.float64) * log_r - math.log1p(math.exp(log_r))


@dataclass(frozen=True)
class CountLaw:
    """The law of one element's count: ``values`` with log-probabilities ``log_weights``,
    shared by ``multiplicity`` elements (all with the same law)."""

    values: np.ndarray
    log_weights: np.ndarray
    multiplicity: int


def fixed_count_groups(counts: np.ndarray) -> tuple[list[CountLaw], np.ndarray]:
    """Group equal counts: returns the groups and, per element, its group index."""
    uniq, inverse, mult = np.unique(np.asarray(counts, dtype=np.float64), return_inverse=True,
                                    return_counts=True)
    groups = [CountLaw(np.array([u]), np.array([0.0]), int(m)) for u, m in zip(uniq, mult,
                                                                               strict=True)]
    return groups, inverse


def poisson_count_groups(means: np.ndarray, width: float = 11.0) -> tuple[list[CountLaw],
                                                                          np.ndarray]:
    """Group elements by their Poisson mean; each group's count law is Po(mean), truncated
    to mean ± width·√mean (+ 30) — the omitted mass is below 1e-26 — and renormalised."""
    uniq, inverse, mult = np.unique(np.asarray(means, dtype=np.float64), return_inverse=True,
                                    return_counts=True)
    groups = []
    for lam, m in zip(uniq, mult, strict=True):
        if lam <= 0:
            groups.append(CountLaw(np.array([0.0]), np.array([0.0]), int(m)))
            continue
        lo = max(0, math.floor(lam - width * math.sqrt(lam) - 30))
        hi = math.ceil(lam + width * math.sqrt(lam) + 30)
        c = np.arange(lo, hi + 1, dtype=np.float64)
        logw = c * math.log(lam) - lam - gammaln(c + 1)
        logw -= logsumexp(logw)
        groups.append(CountLaw(c, logw, int(m)))
    return groups, inverse


#: |Σ law − 1| before renormalisation in the last call (a check on the quadrature).
last_normalisation_error = 0.0

_GL_NODES, _GL_WEIGHTS = np.polynomial.legendre.leggauss(16)


def _integrate_log_grid(func, lo: float, hi: float, tol: float) -> np.ndarray:
    """∫_lo^hi func(s) ds for a vector-valued, smooth ``func`` (s ↦ array (G, len(s))), by
    composite 16-point Gauss–Legendre, halving the panels until two rounds agree to ``tol``
    (relative to the largest component)."""
    panels = max(8, math.ceil((hi - lo) / 2.0))
    previous = None
    for _ in range(7):
        edges = np.linspace(lo, hi, panels + 1)
        mid = 0.5 * (edges[:-1] + edges[1:])
        half = 0.5 * (edges[1:] - edges[:-1])
        s = (mid[:, None] + half[:, None] * _GL_NODES[None, :]).ravel()
        w = (half[:, None] * _GL_WEIGHTS[None, :]).ravel()
        value = func(s) @ w
        if previous is not None:
            scale = max(float(np.max(np.abs(value))), 1e-300)
            if float(np.max(np.abs(value - previous))) <= tol * scale:
                return value
        previous = value
        panels *= 2
    return value


def histogram_sampler_law(
    groups: Sequence[CountLaw],
    inverse: np.ndarray,
    scale: float,
    noise: str = "laplace",
    tol: float = 1e-11,
) -> np.ndarray:
    """Exact law of the clip-and-renormalise noisy-histogram sampler over k = len(inverse)
    elements whose counts are independent with the given group laws.

    ``noise`` is ``"laplace"`` (continuous, scale b) or ``"discrete-laplace"`` (P(z) ∝
    e^{−|z|/b} on ℤ). The t-integral is computed in s = log t over
    [log t₀ − 32, log(1/b) + 34] (t₀ = 1/(E[s] + kb)); the integrand vanishes like t at the
    left end and like 1/t at the right end, so the truncation error is below 1e-13 (for
    discrete noise w ≥ 1 when positive, so ψ(t) ≤ e^{−t}·E[w] and t ≤ 60 suffices). Returns a
    probability vector of length k."""
    if noise == "laplace":
        parts, p0 = _laplace_parts, _laplace_log_p0
    elif noise == "discrete-laplace":
        parts, p0 = _dlap_parts, _dlap_log_p0
    else:
        raise ValueError(f"unknown noise {noise!r}")
    b = float(scale)
    if not b > 0:
        raise ValueError(f"noise scale must be > 0, got {scale}")
    k = int(np.asarray(inverse).shape[0])
    mult = np.array([g.multiplicity for g in groups], dtype=np.float64)
    mean_total = sum(
        g.multiplicity * float(np.exp(logsumexp(g.log_weights, b=g.values))) if
        np.any(g.values > 0) else 0.0
        for g in groups
    )
    t0 = 1.0 / max(1.0, mean_total + k * b)
    lo = math.log(t0) - 32.0
    hi = math.log(1.0 / min(b, 1.0)) + 34.0 if noise == "laplace" else math.log(60.0)

    # evaluate in blocks of t so that the (values × t) temporaries stay small (≈ 2e5 cells)
    block = max(16, 200_000 // max(len(g.values) for g in groups))

    def integrand(s: np.ndarray) -> np.ndarray:
        t = np.exp(s)
        lphi = np.empty((len(groups), t.shape[0]))
        lpsi = np.empty((len(groups), t.shape[0]))
        for i, g in enumerate(groups):
            for start in range(0, t.shape[0], block):
                sl = slice(start, start + block)
                a, p = parts(g.values, b, t[sl])
                lphi[i, sl] = logsumexp(g.log_weights[:, None] + a, axis=0)
                lpsi[i, sl] = logsumexp(g.log_weights[:, None] + p, axis=0)
        total = mult @ lphi
        return np.exp(lpsi + total[None, :] - lphi + s[None, :])

    per_group = _integrate_log_grid(integrand, lo, hi, tol)
    log_zero = 0.0
    for g in groups:
        log_zero += g.multiplicity * float(logsumexp(g.log_weights + p0(g.values, b)))
    law = np.asarray(per_group)[np.asarray(inverse)] + math.exp(log_zero) / k
    total = float(law.sum())
    global last_normalisation_error
    last_normalisation_error = abs(total - 1.0)
    if not abs(total - 1.0) < 1e-7:  # pragma: no cover - a quadrature failure
        raise FloatingPointError(f"histogram law integrates to {total!r}, not 1")
    # The vector sums to 1 up to the quadrature error; renormalising removes that drift.
    return law / total

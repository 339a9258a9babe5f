"""Private samplers for distributions on ``[k] = {0, …, k−1}`` (Raskhodnikova et al. 2021,
Theorem 1.4, and a mixture baseline; ``docs/sampling.md``, "Samplers").

* :class:`LaplaceHistogramSampler` — Theorem 1.4's sampler: Laplace noise on the counts,
  exact L1 projection onto the simplex (clip at 0 and renormalise; uniform if everything is
  clipped), one draw. Pure ε-DP; ``d_TV(Q, P) ≤ k/(εn)`` for every P.
* :class:`DiscreteLaplaceHistogramSampler` — the same with *exact* discrete-Laplace noise
  (Canonne–Kamath–Steinke sampler, integer arithmetic, exact final draw). Pure ε-DP;
  ``d_TV ≤ k/(2n·sinh(ε/2)) ≤ k/(εn)``.
* :class:`RevealOrObscureSampler` — the mixture baseline: with probability
  ``q = k/(k + n(e^ε − 1))`` a uniform element, otherwise a uniformly random record. Pure ε-DP
  (tight), and its law is exactly ``(1−q)P + qU``, so ``d_TV = q·d_TV(U, P)``.

Why clip-and-renormalise is an exact L1 projection (what Theorem 1.4's accuracy needs): for any
p in the simplex, ``‖p − v‖₁ ≥ Σ_j v_j⁻ + |1 − Σ_j v_j⁺|`` (split v into its positive and
negative parts and use the triangle inequality), and ``w/s`` (w = v⁺, s = Σw; uniform if s = 0)
attains it. The accuracy proof needs only this optimality:
``d_TV(Q, P) = ½Σ_z|E[P̃_z − v_z]| ≤ ½E‖P̃ − v‖₁ ≤ ½E‖P̂ − v‖₁ = ½E‖Z‖₁/n`` because the
empirical distribution P̂ is itself in the simplex.

The exact law of the two histogram samplers given the counts (over the noise) is computed by a
single numerical integral (see :mod:`dplang.sampling._histlaw`); this is what the exact
evaluation and the exact privacy audit use.
"""

from __future__ import annotations

import math
import sys
from fractions import Fraction

import numpy as np

from ..privacy.guarantees import Guarantee
from ..privacy.mechanisms import discrete_laplace, laplace_noisy_sum, two_sided_geometric
from . import _histlaw
from .base import ADJACENCY, UNIT, SampleResult, as_kary, check_epsilon, check_n

__all__ = [
    "DiscreteLaplaceHistogramSampler",
    "KarySampler",
    "LaplaceHistogramSampler",
    "RevealOrObscureSampler",
    "mixing_probability",
    "project_euclidean",
    "project_l1",
]


def project_l1(v: np.ndarray) -> np.ndarray:
    """Exact L1 projection onto the probability simplex: clip negatives and renormalise
    (uniform when every entry is ≤ 0). Works on the last axis of a 2-D array too.

    Attains ``min_{p∈Δ} ‖p − v‖₁ = Σ_j v_j⁻ + |1 − Σ_j v_j⁺|`` (module docstring).

    Privacy contract: pure post-processing of its input — no privacy cost of its own."""
    arr = np.asarray(v, dtype=np.float64)
    w = np.maximum(arr, 0.0)
    s = w.sum(axis=-1, keepdims=True)
    k = arr.shape[-1]
    safe = np.where(s > 0, s, 1.0)
    return np.where(s > 0, w / safe, 1.0 / k)


def project_euclidean(v: np.ndarray) -> np.ndarray:
    """Euclidean projection onto the simplex (Duchi et al. 2008): ``max(v − τ, 0)`` with τ
    chosen so the result sums to 1. Works row-wise on a 2-D array.

    Not an L1 projection: used by the learn-then-sample baseline to show that the choice of
    projection matters for sampling (its sampler is biased differently).

    Privacy contract: pure post-processing of its input — no privacy cost of its own."""
    arr = np.atleast_2d(np.asarray(v, dtype=np.float64))
    k = arr.shape[1]
    u = -np.sort(-arr, axis=1)
    css = np.cumsum(u, axis=1) - 1.0
    idx = np.arange(1, k + 1)
    cond = u - css / idx > 0
    rho = k - np.argmax(cond[:, ::-1], axis=1)  # last index where cond holds (1-based)
    tau = css[np.arange(arr.shape[0]), rho - 1] / rho
    out = np.maximum(arr - tau[:, None], 0.0)
    return out if np.ndim(v) == 2 else out[0]


def _draw(law: np.ndarray, rng: np.random.Generator) -> int:
    cdf = np.cumsum(law)
    u = rng.random() * cdf[-1]
    return int(min(np.searchsorted(cdf, u, side="right"), law.shape[0] - 1))


class KarySampler:
    """Base class of samplers on [k] whose output depends on the data only through the counts
    (``symmetric = True``: frequency-count-based and permutation-invariant in the sense of
    the paper's Section 2). Subclasses implement :meth:`law_given_counts` and usually
    :meth:`exact_law_given_counts` and :meth:`guarantee`.

    Privacy contract: :meth:`sample` releases one element under :meth:`guarantee` (defined by
    each subclass); the ``*law*`` methods return quantities computed from the data and noise
    for evaluation — they are NOT private releases."""

    kind = "kary"
    symmetric = True
    name = "kary-sampler"

    def __init__(self, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 2:
            raise ValueError(f"k must be an integer >= 2, got {k!r}")
        self.k = int(k)

    # -- privacy ---------------------------------------------------------------------------
    def guarantee(self, n: int | None = None,
                  d: int | None = None) -> Guarantee:  # pragma: no cover
        raise NotImplementedError

    def _pure(self, epsilon: float, **details: object) -> Guarantee:
        """Pure ε-DP, replace-one, with k and ``details`` recorded."""
        return Guarantee.pure(self.name, UNIT, ADJACENCY, epsilon,
                              details={"k": self.k, **details})

    # -- laws --------------------------------------------------------------------------------
    def counts(self, x: np.ndarray) -> np.ndarray:
        """Counts of each element (validates ``x``)."""
        return np.bincount(as_kary(x, self.k), minlength=self.k)

    def law_given_counts(self, counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Law of the output given the counts and one draw of the internal noise."""
        return self.batch_law_given_counts(np.asarray(counts)[None, :], rng)[0]

    def batch_law_given_counts(self, counts: np.ndarray,
                               rng: np.random.Generator) -> np.ndarray:  # pragma: no cover
        """Vectorised :meth:`law_given_counts` over the rows of a (T, k) count matrix."""
        raise NotImplementedError

    def exact_law_given_counts(self, counts: np.ndarray) -> np.ndarray:  # pragma: no cover
        """Exact law of the output given the counts (all internal randomness integrated)."""
        raise NotImplementedError

    def output_law(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Law of the output given the data and one draw of internal noise."""
        return self.law_given_counts(self.counts(x), rng)

    def conditional_law(self, x: np.ndarray) -> np.ndarray:
        """Exact law of the output given the data ``x`` (over the sampler's coins)."""
        return self.exact_law_given_counts(self.counts(x))

    def sample(self, x: np.ndarray, rng: np.random.Generator) -> SampleResult:
        """Release one element of [k] and the guarantee of :meth:`guarantee` (n = len(x))."""
        x = as_kary(x, self.k)
        law = self.output_law(x, rng)
        return SampleResult(np.array([_draw(law, rng)], dtype=np.int64),
                            self.guarantee(x.shape[0]))

    def tv_bound(self, n: int) -> float:  # pragma: no cover
        """An upper bound on d_TV(Q, P) valid for every P on [k] with n records."""
        raise NotImplementedError


class LaplaceHistogramSampler(KarySampler):
    """Theorem 1.4's sampler: counts + Lap(2/ε) noise, clip-and-renormalise
    (the exact L1 projection), one draw.

    Privacy contract: pure ε-DP under replace-one adjacency, for every n — one call of
    :func:`~dplang.privacy.mechanisms.laplace_noisy_sum` (scale b = 2/ε) on the count vector,
    whose L1 sensitivity is 2 (one record leaves one bin and enters another), so 2/b = ε; the
    rest is post-processing. The noise is numpy's floating-point Laplace (Mironov's
    floating-point caveat applies; :class:`DiscreteLaplaceHistogramSampler` avoids it).

    Accuracy: ``d_TV(Q, P) ≤ k/(εn)`` for every P on [k] (module docstring); equality of Q and
    P when P is uniform (symmetry)."""

    name = "laplace-histogram-sampler"
    noise = "laplace"

    def __init__(self, k: int, epsilon: float) -> None:
        super().__init__(k)
        self.epsilon = check_epsilon(epsilon)

    @property
    def noise_scale(self) -> float:
        """Scale b of the noise on each count: Δ₁/ε = 2/ε."""
        return 2.0 / self.epsilon

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        """Pure ε-DP, replace-one, whatever n (ex ante)."""
        check_n(n)
        return self._pure(self.epsilon, noise=self.noise, noise_scale=self.noise_scale,
                          projection="l1 (clip and renormalise)")

    def batch_law_given_counts(self, counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        c = np.asarray(counts, dtype=np.float64)
        return project_l1(self.noisy_counts(c, rng))

    def noisy_counts(self, counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Counts plus Laplace noise of scale b = 2/ε, the ε-DP part of the mechanism
        (:func:`~dplang.privacy.mechanisms.laplace_noisy_sum`: ℓ1 sensitivity 2 ⇒ 2/b = ε);
        the rows of a (T, k) matrix get independent noise."""
        return laplace_noisy_sum(np.asarray(counts, dtype=np.float64), self.noise_scale, rng)

    def exact_law_given_counts(self, counts: np.ndarray) -> np.ndarray:
        """Exact law (noise integrated) by the one-dimensional integral of
        :mod:`dplang.sampling._histlaw` (relative accuracy ~1e-11)."""
        groups, inverse = _histlaw.fixed_count_groups(np.asarray(counts))
        return _histlaw.histogram_sampler_law(groups, inverse, self.noise_scale, self.noise)

    def tv_bound(self, n: int) -> float:
        """k/(εn) = ½·E‖Z‖₁/n (module docstring)."""
        return self.k / (self.epsilon * check_n(n))


class DiscreteLaplaceHistogramSampler(LaplaceHistogramSampler):
    """A1 with exact noise: counts + discrete Laplace of scale 2/ε (P(z) ∝ e^{−ε|z|/2} on ℤ),
    clip at 0, output z with probability w_z/Σw (uniform if all clipped).

    Privacy contract: pure ε-DP under replace-one adjacency. The noise is drawn by the exact
    CKS 2020 sampler of :func:`dplang.privacy.mechanisms.discrete_laplace` with the scale
    2/ε represented exactly as a rational (from ε's binary value), and the final draw is an
    exact integer draw (uniform integer below Σw), so no floating-point step touches the data.

    Accuracy: ``d_TV(Q, P) ≤ k·E|Z|/(2n) = k/(2n·sinh(ε/2)) ≤ k/(εn)``."""

    name = "discrete-laplace-histogram-sampler"
    noise = "discrete-laplace"

    @property
    def exact_scale(self) -> Fraction:
        """The noise scale 2/ε as an exact rational."""
        return Fraction(2) / Fraction(self.epsilon)

    def noisy_counts(self, counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Counts plus exact discrete-Laplace noise of scale b = 2/ε, the ε-DP part of the
        mechanism (:func:`~dplang.privacy.mechanisms.discrete_laplace`: ℓ1 sensitivity 2 ⇒
        2/b = ε)."""
        c = np.asarray(counts, dtype=np.int64)
        return c + np.asarray(discrete_laplace(self.exact_scale, rng, size=c.shape),
                              dtype=np.int64)

    def sample(self, x: np.ndarray, rng: np.random.Generator) -> SampleResult:
        """Release one element of [k] (exact integer arithmetic throughout)."""
        x = as_kary(x, self.k)
        w = np.maximum(self.noisy_counts(self.counts(x), rng), 0)
        total = int(w.sum())
        if total == 0:
            z = int(rng.integers(0, self.k))
        else:
            u = int(rng.integers(0, total))
            z = int(np.searchsorted(np.cumsum(w), u, side="right"))
        return SampleResult(np.array([z], dtype=np.int64), self.guarantee(x.shape[0]))

    def law_given_counts(self, counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return project_l1(self.noisy_counts(counts, rng).astype(np.float64))

    def batch_law_given_counts(self, counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Vectorised law for evaluation only: the noise is drawn as a difference of two
        numpy geometric variables (same law up to floating-point rounding of e^{−ε/2}; the
        release path :meth:`sample` uses the exact sampler)."""
        c = np.asarray(counts, dtype=np.float64)
        return project_l1(c + two_sided_geometric(self.noise_scale, rng, size=c.shape))

    def tv_bound(self, n: int) -> float:
        """k/(2n·sinh(ε/2)) (≤ k/(εn)): ½·E|Z|·k/n with E|Z| = 1/sinh(ε/2)."""
        return self.k / (2.0 * check_n(n) * math.sinh(self.epsilon / 2.0))


def mixing_probability(k: int, n: int, epsilon: float) -> float:
    """Reveal-or-obscure's q = k/(k + n(e^ε − 1)) as a float that is ≥ the exact value and > 0.

    Direct formula while it is safely finite (relative error ≤ ~5 unit roundoffs, bumped up by
    8 ulps); otherwise log q = −log(1 + e^t), t = ln(n/k) + ln(e^ε − 1), evaluated without
    overflow and bumped up by a relative 1e−12 (above its rounding error, ≤ 745·5·2⁻⁵³ while
    q is a normal float; two steps up for a subnormal q), then floored at the smallest
    positive float. Below 2⁻⁵³ the release's
    coin ``rng.random() < q`` fires with probability exactly 2⁻⁵³ whatever q > 0 is, which
    exceeds the exact q. Privacy contract: none of its own — it calibrates
    :class:`RevealOrObscureSampler`, whose ε-DP needs a coin probability ≥ the exact q."""
    if not (epsilon > 0 and math.isfinite(epsilon)) or k < 1 or n < 1:
        raise ValueError(f"need finite epsilon > 0, k >= 1 and n >= 1, got {epsilon}, {k}, {n}")
    if epsilon < 600.0:
        q = k / (k + n * math.expm1(epsilon))
        for _ in range(8):
            q = math.nextafter(q, math.inf)
    else:
        log_expm1 = epsilon + math.log1p(-math.exp(-epsilon))  # ln(e^ε − 1), ε large
        t = math.log(n) - math.log(k) + log_expm1
        log_q = -(max(t, 0.0) + math.log1p(math.exp(-abs(t))))
        q = math.exp(log_q) * (1.0 + 1e-12)
        if q < sys.float_info.min:  # subnormal: absolute granularity; round up two steps
            q = math.nextafter(math.nextafter(q, math.inf), math.inf)
    return min(1.0, max(q, math.ulp(0.0)))


class RevealOrObscureSampler(KarySampler):
    """Reveal-or-obscure (mixture) baseline (not in the paper; ``docs/sampling.md``): with
    probability ``q = k/(k + n(e^ε − 1))`` output a uniform element of [k], otherwise a uniformly
    random record.

    Privacy contract: pure ε-DP under replace-one adjacency, tight: Pr[z | x] =
    (1−q)c_z/n + q/k, whose largest ratio between neighbours is 1 + (1−q)k/(qn) = e^ε.

    Accuracy: Q = (1−q)P + qU exactly, so d_TV(Q, P) = q·d_TV(U, P) ≤ q ≤ k/(n(e^ε−1)) ≤
    k/(εn)."""

    name = "reveal-or-obscure-sampler"

    def __init__(self, k: int, epsilon: float) -> None:
        super().__init__(k)
        self.epsilon = check_epsilon(epsilon)

    def mixing_probability(self, n: int) -> float:
        """q = k/(k + n(e^ε − 1)), rounded *up* to a positive float (for every finite ε).

        Privacy contract: the returned q is never below the exact q (the privacy loss of the
        mixture, log(1 + (1−q)k/(qn)), decreases in q, so a larger q keeps the release ε-DP) and
        never 0: at large ε the direct formula overflows (ε ≥ 710) or underflows to q = 0 (a
        raw record released under a finite ε), so q is then computed in log space and floored
        at the smallest positive float. The coin ``rng.random() < q`` has probability
        ⌈q·2⁵³⌉/2⁵³ ≥ q, so the release is ε-DP for every finite ε (:func:`mixing_probability`
        below)."""
        return mixing_probability(self.k, check_n(n), self.epsilon)

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        """Pure ε-DP, replace-one (q is computed from the public n)."""
        return self._pure(self.epsilon, mixing_probability=self.mixing_probability(n))

    def batch_law_given_counts(self, counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        # The coins (uniform vs record) are integrated out exactly: the law given the data is
        # already exact and noise-free.
        c = np.asarray(counts, dtype=np.float64)
        n = c.sum(axis=1, keepdims=True)
        sizes = np.rint(n).astype(np.int64)
        q = np.array([[mixing_probability(self.k, int(m), self.epsilon) if m > 0 else 1.0]
                      for m in sizes[:, 0]]).reshape(n.shape)
        return (1.0 - q) * c / np.maximum(n, 1) + q / self.k

    def exact_law_given_counts(self, counts: np.ndarray) -> np.ndarray:
        c = np.asarray(counts, dtype=np.float64)
        n = round(c.sum())
        if n == 0:
            return np.full(self.k, 1.0 / self.k)
        q = self.mixing_probability(n)
        return (1.0 - q) * c / n + q / self.k

    def sample(self, x: np.ndarray, rng: np.random.Generator) -> SampleResult:
        """Release one element: a uniform one with probability q, else a random record."""
        x = as_kary(x, self.k)
        n = x.shape[0]
        if rng.random() < self.mixing_probability(n):
            z = int(rng.integers(0, self.k))
        else:
            z = int(x[int(rng.integers(0, n))])
        return SampleResult(np.array([z], dtype=np.int64), self.guarantee(n))

    def tv_bound(self, n: int) -> float:
        """q·(1 − 1/k) = max_P q·d_TV(U, P)."""
        return self.mixing_probability(n) * (1.0 - 1.0 / self.k)

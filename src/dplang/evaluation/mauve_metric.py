"""MAUVE between held-out real texts (p) and synthetic texts (q), with the paper's settings.

Settings (InvisibleInk paper, §5.1 and Appendix D; the paper's code calls
``mauve.compute_mauve(p_features=real, q_features=fake, num_buckets=num // 20,
mauve_scaling_factor=0.9)``):

* ``p`` = real (held-out) texts, ``q`` = synthetic texts, **equal sizes** ``n`` (enforced);
* features from a sentence embedder (:mod:`dplang.evaluation.embedders`), not GPT-2;
* ``num_buckets = max(2, ⌊n/20⌋)`` k-means buckets (the paper's ``n // 20``; at least 2, and
  ``n`` must be at least :data:`MIN_TEXTS` = 20); an explicit bucket count must leave at least
  4 of the ``2n`` pooled points per bucket on average (``num_buckets ≤ n/2``);
* scaling factor 0.9; everything else is ``mauve-text``'s default (PCA keeping 90% of the
  variance, k-means with 5 restarts and 500 iterations);
* deterministic: ``seed`` (default 25, mauve-text's own default, which the paper's code used)
  seeds PCA and k-means.

Scores depend on ``n``, the embedder and the bucket count, so compare them only at equal
settings (the paper: "only relative comparisons").

**Intervals over resampled texts** (:func:`mauve_bootstrap`, ``--mauve-bootstrap R``): the
spread of MAUVE over k-means seeds alone understates its noise (a different sample of texts
moves it more), so each of ``R`` resamples draws ``n`` real and ``n`` synthetic feature rows
with replacement *and* a fresh k-means / PCA seed, and the 95 % percentile interval of the
``R`` scores is reported. Duplicated rows make each resample slightly less diverse than a
fresh sample of ``n`` texts, so the interval is approximate (it is also centred on the
resampled scores, not on the point estimate); read it as the resolution of MAUVE at this
``n``, and compare it with the real-vs-real ceiling (``experiments/metric_resolution.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from dplang.evaluation.data import EvaluationError
from dplang.evaluation.embedders import Embedder

__all__ = [
    "DEFAULT_MAUVE_SEED",
    "MIN_TEXTS",
    "SCALING_FACTOR",
    "MauveResult",
    "check_mauve_sizes",
    "default_num_buckets",
    "mauve_bootstrap",
    "mauve_from_features",
    "mauve_score",
]

#: The paper's MAUVE scaling factor.
SCALING_FACTOR = 0.9
#: Fewest texts per side (⌊n/20⌋ ≥ 1).
MIN_TEXTS = 20
#: mauve-text's default k-means seed (used by the paper's code).
DEFAULT_MAUVE_SEED = 25
#: Confidence of the bootstrap interval over resampled texts.
BOOTSTRAP_CONFIDENCE = 0.95


@dataclass(frozen=True)
class MauveResult:
    """One MAUVE computation.

    Attributes:
        mauve: the MAUVE score in [0, 1] (reports show it in %).
        frontier_integral: mauve-text's frontier integral (lower is better).
        num_buckets: k-means buckets used.
        n: texts per side.
        seed: k-means / PCA seed.
        scaling_factor: the MAUVE scaling factor.
        p_hist / q_hist: bucket histograms of the real and synthetic texts.
    """

    mauve: float
    frontier_integral: float
    num_buckets: int
    n: int
    seed: int
    scaling_factor: float
    p_hist: list[float] = field(default_factory=list, repr=False)
    q_hist: list[float] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return {
            "mauve": self.mauve,
            "frontier_integral": self.frontier_integral,
            "num_buckets": self.num_buckets,
            "n": self.n,
            "seed": self.seed,
            "scaling_factor": self.scaling_factor,
            "p_hist": self.p_hist,
            "q_hist": self.q_hist,
        }


def default_num_buckets(n: int) -> int:
    """The paper's bucket count for ``n`` texts per side: ``max(2, n // 20)``."""
    return max(2, n // 20)


def check_mauve_sizes(n_p: int, n_q: int, num_buckets: int | None = None) -> int:
    """The bucket count for ``n_p`` real and ``n_q`` synthetic texts, or
    :class:`EvaluationError` when the sizes differ, are too small, or do not fit the buckets."""
    if n_p != n_q:
        raise EvaluationError(
            f"MAUVE needs equal numbers of real and synthetic texts, got {n_p} and {n_q}"
        )
    if n_p < MIN_TEXTS:
        raise EvaluationError(
            f"MAUVE needs at least {MIN_TEXTS} texts per side (n/20 buckets), got {n_p}"
        )
    buckets = default_num_buckets(n_p) if num_buckets is None else int(num_buckets)
    if buckets < 2 or buckets > n_p // 2:
        raise EvaluationError(
            f"{buckets} MAUVE buckets do not fit {n_p} texts per side "
            f"(need 2 <= buckets <= {n_p // 2})"
        )
    return buckets


def mauve_from_features(
    p_features: np.ndarray,
    q_features: np.ndarray,
    *,
    num_buckets: int | None = None,
    scaling_factor: float = SCALING_FACTOR,
    seed: int = DEFAULT_MAUVE_SEED,
) -> MauveResult:
    """MAUVE of real features ``p`` against synthetic features ``q`` (equal row counts)."""
    import mauve

    p = np.asarray(p_features, dtype=np.float32)
    q = np.asarray(q_features, dtype=np.float32)
    if p.ndim != 2 or q.ndim != 2 or p.shape[1] != q.shape[1]:
        raise EvaluationError(f"feature arrays must be [n, d] alike, got {p.shape} and {q.shape}")
    buckets = check_mauve_sizes(p.shape[0], q.shape[0], num_buckets)
    # PCA + k-means on at most a few thousand points is tiny work; multi-threaded BLAS/OpenMP
    # made it up to 500x slower on a shared 2-core machine (threads spin-waiting), so it runs
    # single-threaded. The result does not depend on the thread count.
    with threadpool_limits(limits=1):
        out = mauve.compute_mauve(
            p_features=p,
            q_features=q,
            num_buckets=buckets,
            mauve_scaling_factor=scaling_factor,
            seed=seed,
            verbose=False,
        )
    return MauveResult(
        mauve=float(out.mauve),
        frontier_integral=float(out.frontier_integral),
        num_buckets=int(out.num_buckets),
        n=int(p.shape[0]),
        seed=seed,
        scaling_factor=scaling_factor,
        p_hist=[float(x) for x in out.p_hist],
        q_hist=[float(x) for x in out.q_hist],
    )


@dataclass(frozen=True)
class MauveInterval:
    """A percentile-bootstrap interval of MAUVE over resampled texts (and k-means seeds)."""

    low: float
    high: float
    resamples: int
    seed: int
    confidence: float = BOOTSTRAP_CONFIDENCE
    values: tuple[float, ...] = field(default=(), repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"low": self.low, "high": self.high, "half_width": (self.high - self.low) / 2,
                "resamples": self.resamples, "seed": self.seed, "confidence": self.confidence,
                "bootstrap_mean": float(np.mean(self.values)) if self.values else None}


def mauve_bootstrap(
    p_features: np.ndarray,
    q_features: np.ndarray,
    *,
    resamples: int,
    num_buckets: int | None = None,
    scaling_factor: float = SCALING_FACTOR,
    seed: int = DEFAULT_MAUVE_SEED,
    confidence: float = BOOTSTRAP_CONFIDENCE,
) -> MauveInterval:
    """MAUVE's ``confidence`` percentile interval over ``resamples`` bootstrap resamples:
    each draws ``n`` rows of ``p`` and of ``q`` with replacement and a fresh k-means / PCA
    seed (all from ``seed``: deterministic). See the module docstring for how to read it."""
    p = np.asarray(p_features, dtype=np.float32)
    q = np.asarray(q_features, dtype=np.float32)
    if resamples < 2:
        raise EvaluationError(f"a MAUVE bootstrap needs at least 2 resamples, got {resamples}")
    buckets = check_mauve_sizes(p.shape[0], q.shape[0], num_buckets)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 28]))
    values = []
    for _ in range(resamples):
        pi = rng.integers(0, p.shape[0], p.shape[0])
        qi = rng.integers(0, q.shape[0], q.shape[0])
        kseed = int(rng.integers(0, 2**31 - 1))
        values.append(mauve_from_features(p[pi], q[qi], num_buckets=buckets,
                                          scaling_factor=scaling_factor, seed=kseed).mauve)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(np.asarray(values), [alpha, 1.0 - alpha])
    return MauveInterval(float(low), float(high), resamples, seed, confidence, tuple(values))


def mauve_score(
    real_texts: Sequence[str],
    synthetic_texts: Sequence[str],
    embedder: Embedder,
    *,
    num_buckets: int | None = None,
    scaling_factor: float = SCALING_FACTOR,
    seed: int = DEFAULT_MAUVE_SEED,
    real_features: np.ndarray | None = None,
) -> MauveResult:
    """MAUVE of ``real_texts`` (p) against ``synthetic_texts`` (q) under ``embedder``.

    Pass ``real_features`` (the embedder's output for ``real_texts``) to reuse them across
    several synthetic runs."""
    check_mauve_sizes(len(real_texts), len(synthetic_texts), num_buckets)
    p = embedder.embed(real_texts) if real_features is None else real_features
    q = embedder.embed(synthetic_texts)
    return mauve_from_features(
        p, q, num_buckets=num_buckets, scaling_factor=scaling_factor, seed=seed
    )

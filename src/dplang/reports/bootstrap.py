"""Bootstrap confidence intervals for the report metrics: pooled and per-run-averaged variants,
bootstrap intervals over runs (``docs/reports.md``, "Metric identity (E3), bootstrap intervals").

A *run* is one report (proposal-and-filter: one noise draw over the m candidates) or one
free-text generation (its parsed claims play the emitted statements). Every metric of
:mod:`dplang.reports.evaluation` is a pooled ratio Σ_r num_r / Σ_r den_r of per-run counts:

=================  ==========================  ============================
metric             num_r                       den_r
=================  ==========================  ============================
EmitRate           |O_r|                        m_r
UnsupportedEmit    |O_r ∩ U_r|                  |U_r|
FalseEmission      |O_r ∩ U_r|                  |O_r|
MeanSupport        Σ_{j ∈ O_r} f_j              |O_r|
=================  ==========================  ============================

The bootstrap resamples runs with replacement (multinomial weights, vectorised) and reports the
percentile interval of the pooled ratio; the per-run-averaged variant is the mean over runs of
num_r/den_r over runs with den_r > 0.

**Evaluation only.** The inputs are the candidates' *true* supports (private statistics of the
corpus); nothing here is differentially private. Use it on synthetic data, public benchmarks
and audits, never to publish facts about a private corpus.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["MetricCI", "bootstrap_metrics", "claim_metrics", "per_run_counts"]

_TOL = 1e-12
METRICS = ("emit_rate", "unsupported_emit", "false_emission", "mean_support")


@dataclass(frozen=True)
class MetricCI:
    """A pooled metric, its bootstrap percentile interval and its per-run-averaged variant."""

    name: str
    value: float
    lower: float
    upper: float
    per_run: float
    runs: int

    def __str__(self) -> str:
        return f"{self.value:.4f} [{self.lower:.4f}, {self.upper:.4f}]"


def per_run_counts(emitted: np.ndarray, supports: np.ndarray, theta: float
                   ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(num_r, den_r) of every metric for ``emitted[runs, m]`` and ``supports`` ``[m]`` or
    ``[runs, m]`` (module docstring).

    Privacy contract: evaluation only — reads true supports, releases nothing private."""
    e = np.atleast_2d(np.asarray(emitted, dtype=bool))
    f = np.broadcast_to(np.asarray(supports, dtype=np.float64), e.shape)
    u = f < theta - _TOL
    o = e.sum(axis=1).astype(np.float64)
    ou = (e & u).sum(axis=1).astype(np.float64)
    return {
        "emit_rate": (o, np.full(e.shape[0], float(e.shape[1]))),
        "unsupported_emit": (ou, u.sum(axis=1).astype(np.float64)),
        "false_emission": (ou, o),
        "mean_support": (np.where(e, f, 0.0).sum(axis=1), o),
    }


def _ci(name: str, num: np.ndarray, den: np.ndarray, reps: int, confidence: float,
        rng: np.random.Generator) -> MetricCI:
    runs = num.shape[0]
    total = float(den.sum())
    value = float(num.sum() / total) if total > 0 else math.nan
    ok = den > 0
    per_run = float(np.mean(num[ok] / den[ok])) if ok.any() else math.nan
    if runs < 2 or not total > 0:
        return MetricCI(name, value, math.nan, math.nan, per_run, runs)
    w = rng.multinomial(runs, np.full(runs, 1.0 / runs), size=reps).astype(np.float64)
    nb, db = w @ num, w @ den
    ratios = nb[db > 0] / db[db > 0]
    a = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(ratios, [a, 1.0 - a]) if ratios.size else (math.nan, math.nan)
    return MetricCI(name, value, float(lo), float(hi), per_run, runs)


def bootstrap_metrics(emitted: np.ndarray, supports: np.ndarray, theta: float,
                      rng: np.random.Generator, reps: int = 2000, confidence: float = 0.95
                      ) -> dict[str, MetricCI]:
    """Pooled EmitRate, UnsupportedEmit, FalseEmission and MeanSupport of ``emitted[runs, m]``
    with bootstrap percentile intervals over runs and per-run averages.

    Privacy contract: evaluation only — reads true supports, releases nothing private."""
    counts = per_run_counts(emitted, supports, theta)
    return {k: _ci(k, *counts[k], reps, confidence, rng) for k in METRICS}


def claim_metrics(claim_supports: Sequence[Sequence[float] | np.ndarray], theta: float,
                  rng: np.random.Generator, reps: int = 2000, confidence: float = 0.95
                  ) -> dict[str, MetricCI]:
    """The same metrics for a free-text method: ``claim_supports[r]`` holds the true supports
    of the claims parsed from generation r, and every parsed claim counts as emitted (free text
    has no abstention). UnsupportedEmit is then 1 whenever any claim is unsupported, and
    EmitRate is 1: a free-text generator asserts everything it writes.

    Privacy contract: evaluation only — reads true supports, releases nothing private."""
    nums: dict[str, list[float]] = {k: [] for k in METRICS}
    dens: dict[str, list[float]] = {k: [] for k in METRICS}
    for sup in claim_supports:
        f = np.asarray(sup, dtype=np.float64)
        counts = per_run_counts(np.ones((1, f.size), dtype=bool), f, theta)
        for k in METRICS:
            nums[k].append(float(counts[k][0][0]) if f.size else 0.0)
            dens[k].append(float(counts[k][1][0]) if f.size else 0.0)
    return {k: _ci(k, np.array(nums[k]), np.array(dens[k]), reps, confidence, rng)
            for k in METRICS}

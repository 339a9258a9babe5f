"""Metrics and theory checks for proposal-and-filter, on evaluation data.

**Evaluation only.** Everything here takes the *true* supports f_s(R) (or counts), which are
private: these functions are for synthetic data, public benchmarks and audits, and their outputs
are not differentially private. Never publish them for a private corpus.

Definitions (``docs/reports.md``, "Paper errors and gaps"; arrays may be one run ``[m]`` or many
runs ``[runs, m]``, pooled):

* EmitRate = |O| / m (mean over runs) — the quantity of Theorem 5.2;
* UnsupportedEmit = |O ∩ U| / |U| with U = {f < θ} — the per-candidate failure rate that
  Theorem 5.1 bounds by β (the normalisation the paper's numbers are consistent with: *not*
  |O ∩ U| / m, which is also available as :func:`unsupported_emit_per_candidate`);
* FalseEmission = |O ∩ U| / |O| — not theorem-backed (it depends on the proposer's mix);
* MeanSupport = mean of f over the emitted statements (or over parsed free-text claims);
* Theorem 5.2: (1−β)·p_{θ+2τ} ≤ E[EmitRate] ≤ p_θ + β(1 − p_θ) ≤ p_θ + β, with
  p_a = fraction of candidates with f ≥ a.

Ratios with an empty denominator are NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..privacy.audit import clopper_pearson
from .mechanism import Report
from .noise import SupportTest
from .predicates import SupportPredicate
from .statements import Statement

__all__ = [
    "EmitInterval",
    "clopper_pearson",
    "coverage",
    "emit_rate",
    "evaluate_report",
    "exact_expected_emit_rate",
    "false_emission",
    "mean_support",
    "theorem_5_2_interval",
    "true_supports",
    "unsupported_emit",
    "unsupported_emit_per_candidate",
]

#: Tolerance for comparing supports with thresholds (supports are count/n; thresholds such
#: as θ + 2τ are sums of floats, so f = θ + 2τ can be off by rounding).
_TOL = 1e-12


def _arrays(emitted: np.ndarray, supports: np.ndarray | None = None
            ) -> tuple[np.ndarray, np.ndarray | None]:
    e = np.asarray(emitted, dtype=bool)
    if supports is None:
        return e, None
    f = np.asarray(supports, dtype=np.float64)
    f = np.broadcast_to(f, e.shape)
    return e, f


def _ratio(num: float, den: float) -> float:
    return float(num / den) if den > 0 else math.nan


def emit_rate(emitted: np.ndarray) -> float:
    """|O| / m, pooled over runs (= mean over runs of |O|/m when every run has m candidates)."""
    e, _ = _arrays(emitted)
    return _ratio(float(e.sum()), float(e.size))


def unsupported_emit(emitted: np.ndarray, supports: np.ndarray, theta: float) -> float:
    """|O ∩ U| / |U|, U = {f < θ}, pooled over runs (Theorem 5.1: expectation ≤ β)."""
    e, f = _arrays(emitted, supports)
    u = f < theta - _TOL
    return _ratio(float((e & u).sum()), float(u.sum()))


def unsupported_emit_per_candidate(emitted: np.ndarray, supports: np.ndarray,
                                   theta: float) -> float:
    """|O ∩ U| / m (the other normalisation; not the paper's)."""
    e, f = _arrays(emitted, supports)
    return _ratio(float((e & (f < theta - _TOL)).sum()), float(e.size))


def false_emission(emitted: np.ndarray, supports: np.ndarray, theta: float) -> float:
    """|O ∩ U| / |O|: the fraction of emitted statements that are unsupported (pooled)."""
    e, f = _arrays(emitted, supports)
    return _ratio(float((e & (f < theta - _TOL)).sum()), float(e.sum()))


def mean_support(emitted: np.ndarray, supports: np.ndarray) -> float:
    """Mean true support of the emitted statements (pooled); NaN when nothing was emitted."""
    e, f = _arrays(emitted, supports)
    return _ratio(float(f[e].sum()), float(e.sum()))


def coverage(supports: np.ndarray, a: float) -> float:
    """p_a: fraction of candidates with f ≥ a."""
    f = np.asarray(supports, dtype=np.float64)
    return _ratio(float((f >= a - _TOL).sum()), float(f.size))


@dataclass(frozen=True)
class EmitInterval:
    """Theorem 5.2's interval for E[EmitRate]: [lower, upper] and the looser p_θ + β."""

    lower: float
    upper: float
    upper_loose: float
    p_theta: float
    p_theta_2tau: float

    def contains(self, value: float, slack: float = 0.0) -> bool:
        return self.lower - slack <= value <= self.upper + slack


def theorem_5_2_interval(supports: np.ndarray, theta: float, tau: float,
                         beta: float) -> EmitInterval:
    """[(1−β)·p_{θ+2τ}, p_θ + β(1−p_θ)] from the true supports of the candidates (valid for
    i.i.d. candidates and, with p_a the fraction of a fixed list, for a fixed list)."""
    p_t = coverage(supports, theta)
    p_t2 = coverage(supports, theta + 2.0 * tau)
    return EmitInterval((1 - beta) * p_t2, p_t + beta * (1 - p_t), p_t + beta, p_t, p_t2)


def exact_expected_emit_rate(counts: Sequence[float] | np.ndarray, test: SupportTest,
                             theta: float) -> float:
    """E[EmitRate] = mean over candidates of the exact emission probability g(f)."""
    c = np.asarray(counts, dtype=np.float64)
    return float(np.mean([test.emit_probability(x, theta) for x in c.tolist()]))


def true_supports(predicate: SupportPredicate, statements: Sequence[Statement | str],
                  records: Sequence[str | None]) -> np.ndarray:
    """The exact supports f_s = C_s / n (n = all records). PRIVATE: evaluation only."""
    m = predicate.matrix(statements, records)
    return m.sum(axis=1) / max(len(records), 1)


def evaluate_report(report: Report, supports: np.ndarray) -> dict[str, float]:
    """All metrics of one report against the candidates' true supports (evaluation only)."""
    f = np.asarray(supports, dtype=np.float64)
    e = report.emitted_mask
    theta, beta = report.config.theta, report.test.beta
    interval = theorem_5_2_interval(f, theta, report.test.tau, beta)
    return {
        "m": float(report.m),
        "emitted": float(e.sum()),
        "emit_rate": emit_rate(e),
        "unsupported_emit": unsupported_emit(e, f, theta),
        "unsupported_emit_per_candidate": unsupported_emit_per_candidate(e, f, theta),
        "false_emission": false_emission(e, f, theta),
        "mean_support": mean_support(e, f),
        "p_theta": interval.p_theta,
        "p_theta_2tau": interval.p_theta_2tau,
        "interval_lower": interval.lower,
        "interval_upper": interval.upper,
        "expected_emit_rate": exact_expected_emit_rate(np.rint(f * report.n), report.test,
                                                       theta),
    }

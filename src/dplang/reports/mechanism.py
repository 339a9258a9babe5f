"""Proposal-and-filter: certify or abstain on each of m data-independent candidates.

For candidates s_1..s_m fixed before the data is read, a corpus of n records and a predicate σ:

1. ε₀ = ε/m (basic composition; or ρ₀ = ρ(ε, δ)/m for the zCDP Gaussian option);
2. per-candidate level β (or β_family/m with Bonferroni) and margin τ (see
   :mod:`dplang.reports.noise`);
3. for each candidate j, with its own random stream ``RandomStreams(seed).generator(j)``:
   C_j = Σ_r σ_{s_j}(r), Z_j ~ noise, L_j = (C_j + Z_j − τ_c)/n;
   **emit** (s_j, certificate with L_j) iff L_j ≥ θ, else **abstain** (explicitly).

Guarantees (the paper's Theorems 5.1–5.2; ``docs/reports.md``, "The support test"):

* privacy: each test is ε₀-DP ((ε₀, δ₀)-DP or ρ₀-zCDP for the Gaussian) with respect to
  replacing one record, so the report is ε-DP by sequential composition (ρ-zCDP ⇒ (ε, δ) for the
  zCDP option); the candidates, their order, n and all calibration are public; the report is
  post-processing of the m noisy counts;
* honesty: a candidate with f_s < θ is emitted with probability ≤ β (Thm 5.1), per candidate,
  for every corpus; with Bonferroni any unsupported emission at all has probability ≤ β_family;
* the certificate L satisfies Pr[f_s ≥ L] ≥ 1 − β **per candidate, before selection**. That is
  not a confidence level for the statements that were emitted: emission selects the candidates
  whose noise was high, so when many candidates sit just below θ every emitted L overstates its
  support (300 reports of 100 such candidates emit ~1300 statements, all overstated). What holds
  for the emitted set is (a) the expected number of emitted statements with f_s < L is at most
  m·β, and (b) the **simultaneous** bound L_sim = (C + Z − τ_c(β/m))/n that every certificate
  also carries: Pr[f_s ≥ L_sim for every candidate] ≥ 1 − β, hence for every emitted statement
  whatever the selection (union bound over the m candidates). L_sim uses the same noise draw, so
  it costs no privacy; with ``bonferroni`` the emission test itself is at level β/m and
  L_sim = L.

A certificate never contains the seed, the noise draw, or the exact support (count or
fraction); abstentions carry no bound unless ``release_abstained_bounds`` (free: those bounds
were already paid for).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from fractions import Fraction
from typing import Any, Literal

import numpy as np

from ..privacy.accounting import (
    BudgetLimitError,
    check_budget_limit,
    compose_sequential,
    epsilon_to_rho,
)
from ..privacy.guarantees import Guarantee
from ..privacy.randomness import RandomStreams
from .noise import NOISE_FAMILIES, SupportTest
from .predicates import SupportPredicate, support_counts
from .statements import Statement

__all__ = [
    "MECHANISM",
    "Certificate",
    "FilterConfig",
    "Report",
    "ReportConfigError",
    "calibrate",
    "certify_counts",
    "proposal_and_filter",
]

MECHANISM = "proposal-and-filter"
Decision = Literal["emit", "abstain"]


class ReportConfigError(ValueError):
    """Bad report parameters (one-line message)."""


@dataclass(frozen=True)
class FilterConfig:
    """The public parameters of a report.

    ``epsilon`` is the *total* budget over all candidates; ``beta`` the per-candidate failure
    probability (the family-wise one with ``bonferroni``); ``theta`` the reporting threshold on
    the support fraction; ``delta`` is used by the Gaussian only (pure families report δ = 0);
    ``composition`` is ``"basic"`` (paper) or ``"zcdp"`` (Gaussian only)."""

    epsilon: float
    beta: float = 0.05
    theta: float = 0.1
    noise: str = "discrete-laplace"
    delta: float = 1e-5
    composition: str = "basic"
    bonferroni: bool = False
    release_abstained_bounds: bool = False

    def validate(self) -> None:
        """Raise :class:`ReportConfigError` on out-of-range parameters."""
        if not (isinstance(self.epsilon, int | float) and math.isfinite(self.epsilon)
                and self.epsilon > 0):
            raise ReportConfigError(f"epsilon must be finite and > 0, got {self.epsilon}")
        try:
            check_budget_limit(float(self.epsilon), name="--epsilon")
        except BudgetLimitError as exc:
            raise ReportConfigError(str(exc)) from None
        if not 0 < self.beta < 0.5:
            raise ReportConfigError(f"beta must be in (0, 1/2), got {self.beta}")
        if not 0 <= self.theta <= 1:
            raise ReportConfigError(f"the threshold theta must be in [0, 1], got {self.theta}")
        if self.noise not in NOISE_FAMILIES:
            raise ReportConfigError(f"noise must be one of {', '.join(NOISE_FAMILIES)}, "
                                    f"got {self.noise!r}")
        if self.composition not in ("basic", "zcdp"):
            raise ReportConfigError(f"composition must be basic or zcdp, got "
                                    f"{self.composition!r}")
        if self.composition == "zcdp" and self.noise != "gaussian":
            raise ReportConfigError("zcdp composition is available for the gaussian noise only")
        if self.noise == "gaussian" and not 0 < self.delta < 1:
            raise ReportConfigError(f"gaussian noise needs delta in (0, 1), got {self.delta}")

    @property
    def effective_delta(self) -> float:
        return self.delta if self.noise == "gaussian" else 0.0


def _share(total: float, m: int) -> float:
    """total/m rounded down so that m times it is ≤ total exactly (rational arithmetic)."""
    share = total / m
    while Fraction(share) * m > Fraction(total):
        share = math.nextafter(share, 0.0)
    return share


def calibrate(config: FilterConfig, m: int, n: int) -> tuple[SupportTest, Guarantee]:
    """The per-candidate test and the report's composed guarantee for m candidates over n
    records. Public: depends on (config, m, n) only.

    Privacy contract: m tests of the returned calibration, each on a count of replace-one
    sensitivity 1, compose to the returned guarantee (unit = record, replace-one)."""
    config.validate()
    if m < 1:
        raise ReportConfigError("no candidate statements")
    if n < 1:
        raise ReportConfigError("the corpus is empty")
    beta = config.beta / m if config.bonferroni else config.beta
    if config.noise == "gaussian" and config.composition == "zcdp":
        rho_total = epsilon_to_rho(config.epsilon, config.delta)
        test = SupportTest.calibrate("gaussian", n, beta, rho=_share(rho_total, m),
                                     delta=config.delta / m)
        parts = [test.guarantee()] * m
        composed = compose_sequential(parts, delta=config.delta, mechanism=MECHANISM)
    else:
        eps0 = _share(config.epsilon, m)
        delta0 = _share(config.delta, m) if config.noise == "gaussian" else 0.0
        test = SupportTest.calibrate(config.noise, n, beta, epsilon=eps0, delta=delta0)
        parts = [test.guarantee()] * m
        compose_sequential(parts, mechanism=MECHANISM)  # checks units/adjacency agree
        # Basic composition: the exact sum m·ε₀ is ≤ ε by construction of _share, so the
        # report is (ε, δ)-DP for the budget asked for (the float sum could differ in the last
        # bit).
        composed = Guarantee.approximate(MECHANISM, "record", "replace-one", config.epsilon,
                                         config.effective_delta)
    details = {
        "composition": ("zCDP over the m support tests" if config.composition == "zcdp"
                        else "basic (sequential) composition over the m support tests"),
        "candidates": m,
        "n_records": n,
        "noise": config.noise,
        "per_candidate_epsilon": test.epsilon,
        "per_candidate_delta": test.delta,
        "per_candidate_rho": test.rho,
        "beta_per_candidate": beta,
        "bonferroni": config.bonferroni,
        "threshold": config.theta,
        "proposer": "data-independent (fixed before the data is read)",
    }
    guarantee = replace(composed, details=details)
    return test, guarantee


@dataclass(frozen=True)
class Certificate:
    """What the report says about one candidate: public, post-processed DP output.

    ``lower_bound`` L = f̂ − τ is a (1 − β) lower confidence bound on the statement's support
    (the fraction of records whose predicate value is 1): Pr[f ≥ L] ≥ 1 − β over the noise, for
    the corpus at hand. It is ``None`` for an abstention unless abstained bounds are released.
    It says nothing about statements that were not candidates, nor that the statement is
    *true* beyond what the predicate measures.
    """

    index: int
    statement: str
    decision: Decision
    lower_bound: float | None
    threshold: float
    beta: float
    beta_attained: float
    family_beta: float | None
    tau: float
    noise: str
    noise_scale: float
    noise_scale_counts: float
    epsilon0: float
    delta0: float
    rho0: float | None
    n_records: int
    predicate: dict[str, Any] = field(default_factory=dict)
    #: L_sim = (C + Z − τ_c(β/m))/n from the same noise draw: with probability ≥ 1 − β the
    #: bounds of *all* candidates hold at once, so it remains valid for the emitted statements
    #: whatever was selected (``None`` where ``lower_bound`` is ``None``).
    simultaneous_lower_bound: float | None = None
    #: The family-wise level of ``simultaneous_lower_bound`` (β; the per-test margin is β/m).
    simultaneous_beta: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Report:
    """The outcome of proposal-and-filter: one certificate per candidate, and the guarantee."""

    certificates: list[Certificate]
    guarantee: Guarantee
    config: FilterConfig
    test: SupportTest
    #: The same noise with the margin of level β/m (the simultaneous bound's calibration).
    simultaneous_test: SupportTest | None = None

    @property
    def m(self) -> int:
        return len(self.certificates)

    @property
    def n(self) -> int:
        return self.test.n

    @property
    def emitted(self) -> list[Certificate]:
        return [c for c in self.certificates if c.decision == "emit"]

    @property
    def abstained(self) -> list[Certificate]:
        return [c for c in self.certificates if c.decision == "abstain"]

    @property
    def emitted_mask(self) -> np.ndarray:
        return np.array([c.decision == "emit" for c in self.certificates], dtype=bool)

    def full_support_emit_probability(self) -> float:
        """Pr[emit] for a statement supported by *every* record (public; a power check)."""
        return self.test.emit_probability(self.n, self.config.theta)


def _predicate_identity(predicate: SupportPredicate | None, statement: Statement
                        ) -> dict[str, Any]:
    if predicate is None:
        return {"kind": "given counts"}
    return {"id": predicate.id, "rule": predicate.rule_for(statement)}


def certify_counts(
    statements: Sequence[Statement | str],
    counts: Sequence[int] | np.ndarray,
    n: int,
    config: FilterConfig,
    streams: RandomStreams,
    predicate: SupportPredicate | None = None,
) -> Report:
    """Run the support tests on exact counts C_j (candidate j draws from ``streams``' stream j).

    PRIVATE INPUT: ``counts`` are the exact support counts; the returned :class:`Report` is the
    DP release. Privacy contract: if each count has replace-one sensitivity 1 and the
    statements/order/n/config are public, the report satisfies ``report.guarantee``."""
    stmts = [s if isinstance(s, Statement) else Statement(str(s)) for s in statements]
    counts = np.asarray(counts)
    if counts.shape != (len(stmts),):
        raise ValueError(f"need one count per statement: {counts.shape} vs {len(stmts)}")
    if np.any(counts < 0) or np.any(counts > n):
        raise ValueError("counts must lie in [0, n]")
    test, guarantee = calibrate(config, len(stmts), n)
    family_beta = config.beta if config.bonferroni else None
    # Same noise, margin at level β/m: valid for all candidates at once (post-processing).
    simultaneous = test if config.bonferroni else test.at_level(config.beta / len(stmts))
    certs: list[Certificate] = []
    beta_attained = test.beta_attained
    for j, (s, c) in enumerate(zip(stmts, counts.tolist(), strict=True)):
        z = test.sample(streams.generator(j))
        emit = test.emits(c, z, config.theta)
        bound = test.lower_bound(c, z)
        simultaneous_bound = simultaneous.lower_bound(c, z)
        del z  # the raw noise never leaves this function
        show = emit or config.release_abstained_bounds
        certs.append(Certificate(
            index=j, statement=s.text, decision="emit" if emit else "abstain",
            lower_bound=bound if show else None, threshold=config.theta, beta=test.beta,
            beta_attained=beta_attained, family_beta=family_beta, tau=test.tau,
            noise=test.family, noise_scale=test.scale_support, noise_scale_counts=test.scale,
            epsilon0=test.epsilon, delta0=test.delta, rho0=test.rho, n_records=n,
            predicate=_predicate_identity(predicate, s),
            simultaneous_lower_bound=simultaneous_bound if show else None,
            simultaneous_beta=config.beta,
        ))
    return Report(certs, guarantee, config, test, simultaneous)


def proposal_and_filter(
    statements: Sequence[Statement | str],
    records: Sequence[str | None],
    predicate: SupportPredicate,
    config: FilterConfig,
    seed: int | None = None,
) -> Report:
    """The whole mechanism on a corpus: evaluate the predicate, then :func:`certify_counts`.

    ``statements`` must already be deduplicated and fixed without looking at ``records``
    (use a proposer); n = ``len(records)`` counts every record, ``None`` (blank) ones too
    (public under replace-one adjacency). ``seed`` selects reproducible streams; ``None`` uses
    fresh OS entropy. Knowing the seed voids the guarantee: keep it secret.

    Privacy contract: the returned report satisfies ``report.guarantee`` (ε-DP, or (ε, δ) for
    the Gaussian, with respect to replacing one record)."""
    config.validate()
    stmts = [s if isinstance(s, Statement) else Statement(str(s)) for s in statements]
    if not stmts:
        raise ReportConfigError("no candidate statements")
    if not records:
        raise ReportConfigError("the corpus is empty")
    predicate.check(stmts)
    calibrate(config, len(stmts), len(records))  # refuse bad settings before reading data
    streams = RandomStreams(seed) if seed is not None else RandomStreams.from_os_entropy()
    counts = support_counts(predicate, stmts, records)
    return certify_counts(stmts, counts, len(records), config, streams, predicate)

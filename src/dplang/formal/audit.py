"""Privacy audits of the lab's algorithms (000 §5.4, 001 §5.5): the exact/Monte Carlo rule, the
exact audits of both papers, and a black-box Monte Carlo audit.

**Which audit** (:func:`choose_method`, a public rule on public inputs only): an audit follows
the released value of the algorithm through the post-processing it actually applies, and its
*output space* is the set of values that release can take (:func:`output_space_size`):

* 000: the selected index, |[K′]| (Algorithms 1–5), or pair, |[K′]×[M̄]| (Algorithms 6, 7; the
  Gaussian vectors are audited through their exact profile, which bounds every
  post-processing);
* 001·1: the increment bits of the audited updates. Their transcript has 2^(Σ_k k) outcomes
  (200 updates: 20 100 bits, 2^20100 transcripts), but the bits are independent given the
  stream, so the law is a product of two-atom laws, Σ_k 2k atoms in all (40 200), each
  computed exactly. The audit sums each bit's largest |log-ratio|
  (:func:`~dplang.formal.limit.alg1_transcript_loss`): an *upper bound* on the transcript's
  loss, not the loss itself (which is the larger of the two one-directional sums: 0.946 against
  the bound 0.996 at ε = 1, 3.31 against 3.57 for the printed-scale twin). A PASS is sound and
  the verdicts at ε ∈ {0.5, 1, 2, 5} are those of the exact loss;
* 001·C.1: the subset S ⊆ [k] (2^k);
* 001·2: Σ_s W_s over the audited epochs;
* 001·3: ℕ, computed as the first m = 20 indices plus the prior's tail bound (m + 1 atoms per
  epoch);
* the non-private baselines are deterministic (one atom per dataset).

The output space is **small** when it has at most :data:`EXACT_AUDIT_MAX_OUTPUTS` = 2¹⁶ atoms:
then the audit is exact — the exact law on every dataset and neighbour (000: every dataset of
size n ≤ max_n over four letters; 001: the spec's worst-case transcript pair, all neighbours of
size ≤ 4, or every substitution of a 16-element prefix) — otherwise it is Monte Carlo.
``method="exact"`` or ``"monte-carlo"`` forces one.

**Monte Carlo** (:func:`monte_carlo_audit`): a crafted neighbour pair (the pair whose released
statistic moves most — the spread max Δs − min Δs of the scores, the ℓ₂ change of a Gaussian
vector, or a change of a deterministic output — among the exact audit's candidates), ``trials``
independent runs of the algorithm on each side; the first half picks the 8 outputs with the
largest empirical log-ratio (either direction), the second half bounds each with Clopper–Pearson
intervals (Bonferroni over the 8 events, 95% overall): ε̂ = max ln((p_lo − δ)/q_hi). It is a
*lower bound* on the true loss, so PASS means only that no violation was detected (it cannot
see, e.g., 001·1's printed Laplace scale, whose excess lies in events of tiny probability).

**The exact 000 audit** (:func:`privacy_audit_statistical`) enumerates every dataset of size n
over a few letters and every replace-one neighbour, and computes the exact privacy loss of the
exponential-mechanism laws, or the exact Gaussian privacy profile δ(ε)
(:func:`dplang.privacy.audit.gaussian_privacy_profile`) of the released noisy vector. The broken
twins (:func:`twin`) must fail the same audits. Every audit returns a
:class:`dplang.privacy.audit.AuditResult`.

Privacy contract: none — audits run on public toy data and release nothing.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..privacy.audit import AuditResult, clopper_pearson, gaussian_privacy_profile, max_log_loss
from ..privacy.mechanisms import exponential_mechanism
from ..privacy.randomness import RandomStreams
from . import limit
from .collections import Collection
from .languages import element_key
from .statistical import (
    GaussianMarginIdentifier,
    GaussianThresholdGenerator,
    JointThresholdGenerator,
    MarginIdentifier,
    PointerGenerator,
    PrefixCountGenerator,
    SoftMarginIdentifier,
    _Generator,
    _Identifier,
    error_counts,
    multiplicities,
)
from .streams import ExplicitStream, Stream, SubstitutedStream

__all__ = [
    "ALG1_EXACT_UPDATES",
    "ALG1_MC_UPDATES",
    "EXACT_AUDIT_MAX_OUTPUTS",
    "audit",
    "choose_method",
    "monte_carlo_audit",
    "neighbour_pairs",
    "output_space_size",
    "privacy_audit_statistical",
    "twin",
]

#: the exact audit is used when the output space has at most this many atoms (2¹⁶)
EXACT_AUDIT_MAX_OUTPUTS = 1 << 16
#: 001·1: updates followed by the exact audit (the spec's 200) and by the Monte Carlo audit
ALG1_EXACT_UPDATES = 200
ALG1_MC_UPDATES = 3
#: 001·2/3: epochs audited and the stream prefix substituted
LIMIT_EPOCHS = 4
LIMIT_PREFIX = 16
#: 001·3: indices computed exactly per epoch (the tail is bounded by the prior)
ALG3_HEAD = 20
MC_EVENTS = 8
MC_CONFIDENCE = 0.95


# =============================================================================================
# 000: the exact audit over all neighbours of small datasets
# =============================================================================================


def neighbour_pairs(letters: Sequence[Any],
                    n: int) -> list[tuple[tuple[Any, ...], tuple[Any, ...]]]:
    """All (S, S′) with S ∈ lettersⁿ (as sorted multisets: the algorithms are symmetric) and S′
    obtained by replacing one entry by another letter."""
    out = []
    for s in itertools.combinations_with_replacement(letters, n):
        for pos in range(n):
            if pos and s[pos] == s[pos - 1]:
                continue
            for v in letters:
                if v != s[pos]:
                    out.append((s, tuple(sorted((*s[:pos], v, *s[pos + 1:]),
                                                key=lambda e: (str(type(e)), e)))))
    return out


def _as_sample(s: Sequence[Any], universe: Any) -> np.ndarray:
    if all(isinstance(v, int) for v in s):
        return np.asarray(s, dtype=np.int64)
    arr = np.empty(len(s), dtype=object)
    arr[:] = list(s)
    return arr


def privacy_audit_statistical(alg: Any, collection: Collection, n: int,
                              letters: Sequence[Any],
                              extra_pairs: Sequence[tuple[Sequence[Any], Sequence[Any]]] = (),
                              name: str | None = None,
                              claimed_epsilon: float | None = None) -> AuditResult:
    """Exact audit over all replace-one neighbours of size-n datasets over ``letters`` (plus
    crafted pairs): the max |log P(o|S) − log P(o|S′)| of the exact selection law
    (Algorithms 1, 3, 6; non-private 4 and 5 by their deterministic outputs), or the max exact
    Gaussian profile δ(ε) of the released vector (Algorithms 2 and 7). ``claimed_epsilon``
    checks a non-private algorithm against a finite ε (it fails: its loss is infinite).

    Privacy contract: none (an audit on public toy data)."""
    label = name or type(alg).__name__
    pairs = neighbour_pairs(letters, n) + [(tuple(a), tuple(b)) for a, b in extra_pairs]
    eps = getattr(alg, "epsilon", math.inf)
    if isinstance(alg, MarginIdentifier | PointerGenerator):
        eps = math.inf
    if claimed_epsilon is not None:
        eps = claimed_epsilon
    gaussian = isinstance(alg, GaussianMarginIdentifier | GaussianThresholdGenerator)
    delta = getattr(alg, "delta", 0.0) if gaussian else 0.0
    worst_loss, worst_delta, worst_sens, worst_pair = 0.0, 0.0, 0.0, None
    claimed: float | None = None
    uni = collection.universe

    def stats(s: Sequence[Any]) -> Any:
        sample = _as_sample(s, uni)
        if isinstance(alg, _Identifier):
            _, kp = alg.horizon(n, collection)
            return error_counts(sample, collection, kp)
        if isinstance(alg, PointerGenerator):
            return alg.run(sample, collection, np.random.default_rng(0)).output
        return multiplicities(sample, collection, alg.window(n))

    cache: dict[tuple[Any, ...], Any] = {}
    for s, t in pairs:
        a = cache.setdefault(s, stats(s))
        b = cache.setdefault(t, stats(t))
        released: tuple[float, float] | None = None  # a Gaussian vector's (ℓ₂ change, σ)
        if isinstance(alg, PointerGenerator):
            loss = 0.0 if element_key(a) == element_key(b) else math.inf
            sens = loss
        elif isinstance(alg, _Identifier):
            big_k, kp = alg.horizon(n, collection)
            if isinstance(alg, GaussianMarginIdentifier):
                released = float(np.linalg.norm((a - b) / n)), alg.sigma(n, kp)
                claimed = math.sqrt(kp) / n
            else:
                loss = max_log_loss(alg.log_law(a, n, big_k), alg.log_law(b, n, big_k))
                if isinstance(alg, SoftMarginIdentifier):
                    sens = float(np.max(np.abs(alg.scores(a, n, big_k)
                                               - alg.scores(b, n, big_k))))
                    claimed = alg.sensitivity(n, big_k)
                else:
                    sens = loss
        else:
            memb = alg.membership(collection, n)
            if isinstance(alg, GaussianThresholdGenerator):
                _, kp = alg.horizon(n, collection)
                released = (float(np.linalg.norm(alg.scores(a, memb, n)
                                                 - alg.scores(b, memb, n))), alg.sigma(n, kp))
                claimed = alg.l2_sensitivity(n, kp)
            else:
                loss = max_log_loss(alg.log_law(a, memb, n), alg.log_law(b, memb, n))
                sens = float(np.max(np.abs(alg.scores(a, memb, n) - alg.scores(b, memb, n))))
                claimed = alg.sensitivity(n)
        if released is not None:  # audited through the exact profile of the released vector
            dist, sigma = released
            dlt = gaussian_privacy_profile(eps, dist / sigma)
            if dlt > worst_delta:
                worst_delta, worst_pair = dlt, (s, t)
            worst_sens = max(worst_sens, dist)
            continue
        worst_sens = max(worst_sens, sens)
        if loss > worst_loss:
            worst_loss, worst_pair = loss, (s, t)
    if gaussian:
        return AuditResult(mechanism=label, epsilon=eps, delta=delta,
                           passed=worst_delta <= delta * (1 + 1e-9), pairs=len(pairs),
                           worst_pair=worst_pair, delta_at_epsilon=worst_delta,
                           sensitivity=worst_sens, claimed_sensitivity=claimed)
    return AuditResult(mechanism=label, epsilon=eps, delta=0.0, passed=worst_loss <= eps + 1e-9,
                       pairs=len(pairs), worst_pair=worst_pair, max_log_ratio=worst_loss,
                       sensitivity=worst_sens, claimed_sensitivity=claimed)


# =============================================================================================
# Broken twins (negative controls)
# =============================================================================================


@dataclass(frozen=True)
class _SoftMarginTwin(SoftMarginIdentifier):
    """000·1 calibrated to Δ = 2/n (the sensitivity of a single risk difference) — wrong."""

    def sensitivity(self, n: int, big_k: int) -> float:
        return 2.0 / n


@dataclass(frozen=True)
class _PrefixCountTwin(PrefixCountGenerator):
    """000·3 with weights e^{εs} (temperature 1/ε) — twice the stated loss."""

    def temperature(self, n: int) -> float:
        return 1.0 / self.epsilon


@dataclass(frozen=True)
class _JointThresholdTwin(JointThresholdGenerator):
    """000·6 calibrated to Δ = 1 although the pair scores move by M̄/τ."""

    def sensitivity(self, n: int) -> float:
        return 1.0


@dataclass(frozen=True)
class _GaussianMarginTwin(GaussianMarginIdentifier):
    """000·2 with σ/2."""

    def sigma(self, n: int, kp: int) -> float:
        return super().sigma(n, kp) / 2


@dataclass(frozen=True)
class _GaussianThresholdTwin(GaussianThresholdGenerator):
    """000·7 with σ/2."""

    def sigma(self, n: int, kp: int) -> float:
        return super().sigma(n, kp) / 2


_TWINS: dict[type, type] = {
    SoftMarginIdentifier: _SoftMarginTwin,
    PrefixCountGenerator: _PrefixCountTwin,
    JointThresholdGenerator: _JointThresholdTwin,
    GaussianMarginIdentifier: _GaussianMarginTwin,
    GaussianThresholdGenerator: _GaussianThresholdTwin,
}


def twin(alg: Any) -> Any:
    """The deliberately broken variant of a private algorithm (same parameters), used as a
    negative control by the audits; the non-private algorithms are their own negative
    controls."""
    cls = _TWINS.get(type(alg))
    if cls is None:
        return limit.twin(alg)
    fields = {f: getattr(alg, f) for f in alg.__dataclass_fields__}
    return cls(**fields)


# =============================================================================================
# the rule
# =============================================================================================


def _statistical_range(alg: Any, collection: Any, max_n: int) -> int:
    size = 0
    for n in range(1, max_n + 1):
        _, kp = alg.horizon(n, collection)
        if isinstance(alg, JointThresholdGenerator):  # 6 and 7: pairs (i, m)
            size = max(size, kp * alg.window(n))
        else:
            size = max(size, kp)
    return size


def output_space_size(alg: Any, collection: Any, max_n: int = 5,
                      updates: int = ALG1_EXACT_UPDATES) -> float:
    """The number of atoms of the audited release's law (see the module docstring)."""
    if isinstance(alg, MarginIdentifier | PointerGenerator | limit.ClosureGenerator):
        return 1  # deterministic
    if isinstance(alg, limit.ApproximateIntersectionGenerator):
        if not alg.private:
            return 1
        return 2 * updates * (updates + 1) // 2
    if isinstance(alg, limit.UniformPrivateGenerator):
        return 2 ** int(collection.size or 0) if collection.is_finite else math.inf
    if isinstance(alg, limit.EpochEMIdentifier):
        return sum(alg.window(s, collection) for s in range(1, LIMIT_EPOCHS + 1))
    if isinstance(alg, limit.StochasticIdentifier):
        return LIMIT_EPOCHS * (collection.horizon(ALG3_HEAD) + 1)
    if isinstance(alg, _Identifier | _Generator):
        return _statistical_range(alg, collection, max_n)
    raise ValueError(f"no audit for {type(alg).__name__}")


def choose_method(size: float, force: str | None = None) -> tuple[str, str]:
    """("exact" | "monte-carlo", the reason): exact iff ``size`` ≤ 2¹⁶, unless forced."""
    if force not in (None, "auto", "exact", "monte-carlo"):
        raise ValueError(f"method must be auto, exact or monte-carlo, got {force!r}")
    shown = "∞" if math.isinf(size) else f"{int(size):,}"
    atoms = "atom" if size == 1 else "atoms"
    if force in ("exact", "monte-carlo"):
        return force, f"forced; the output space has {shown} {atoms}"
    if size <= EXACT_AUDIT_MAX_OUTPUTS:
        return "exact", f"the output space has {shown} ≤ 2^16 {atoms}"
    return "monte-carlo", f"the output space has {shown} > 2^16 {atoms}"


# =============================================================================================
# Monte Carlo
# =============================================================================================


def monte_carlo_audit(draw_a: Callable[[np.random.Generator, int], Sequence[Any]],
                      draw_b: Callable[[np.random.Generator, int], Sequence[Any]],
                      trials: int, rng: np.random.Generator, delta: float = 0.0,
                      events: int = MC_EVENTS,
                      confidence: float = MC_CONFIDENCE) -> tuple[float, str]:
    """A black-box lower bound on ε for one neighbour pair.

    ``draw_x(rng, size)`` returns ``size`` outputs of independent runs on dataset x (hashable
    values). Half the trials choose the ``events`` outputs with the largest empirical
    log-ratio (either direction); the other half bound each with Clopper–Pearson intervals at
    level 1 − (1 − confidence)/(2·events), so the returned ε̂ = max ln((p_lo − δ)/q_hi) is below
    the true ε with probability ≥ ``confidence``."""
    if trials < 2:
        raise ValueError("trials must be >= 2")
    first, second = trials // 2, trials - trials // 2

    def counts(values: Sequence[Any]) -> dict[Any, int]:
        out: dict[Any, int] = {}
        for v in values:
            out[v] = out.get(v, 0) + 1
        return out

    pa, pb = counts(draw_a(rng, first)), counts(draw_b(rng, first))
    cands = []
    for o in set(pa) | set(pb):
        ca, cb = pa.get(o, 0), pb.get(o, 0)
        cands.append((math.log((ca + 0.5) / (cb + 0.5)), o, +1))
        cands.append((math.log((cb + 0.5) / (ca + 0.5)), o, -1))
    cands.sort(key=lambda c: -c[0])
    chosen = cands[:events]
    ha, hb = counts(draw_a(rng, second)), counts(draw_b(rng, second))
    level = 1 - (1 - confidence) / (2 * max(1, len(chosen)))
    best, best_event = 0.0, None
    for _, o, direction in chosen:
        num, den = (ha.get(o, 0), hb.get(o, 0)) if direction > 0 else (hb.get(o, 0),
                                                                       ha.get(o, 0))
        lo = clopper_pearson(num, second, level)[0]
        hi = clopper_pearson(den, second, level)[1]
        if lo - delta > 0 and hi > 0:
            val = math.log((lo - delta) / hi)
            if val > best:
                best, best_event = val, (o, direction)
    where = "" if best_event is None else f"; worst event: output {best_event[0]!r}"
    return best, f"{trials} runs per dataset, {len(chosen)} events{where}"


def _spread(sa: np.ndarray, sb: np.ndarray) -> float:
    """max Δs − min Δs (the EM loss is at most ε/(2Δ) times it); ∞ when finiteness differs."""
    sa, sb = np.asarray(sa, float).ravel(), np.asarray(sb, float).ravel()
    fa, fb = np.isfinite(sa), np.isfinite(sb)
    if np.any(fa != fb):
        return math.inf
    if not fa.any():
        return 0.0
    d = sa[fa] - sb[fa]
    return float(d.max() - d.min())


# =============================================================================================
# 000
# =============================================================================================


def _statistic_000(alg: Any, collection: Any, sample: np.ndarray) -> Any:
    n = len(sample)
    if isinstance(alg, PointerGenerator):
        return alg.run(sample, collection, np.random.default_rng(0)).output
    if isinstance(alg, _Identifier):
        big_k, kp = alg.horizon(n, collection)
        c = error_counts(sample, collection, kp)
        if isinstance(alg, MarginIdentifier):
            return int(alg.index_from(c, n, big_k))
        if isinstance(alg, GaussianMarginIdentifier):
            return c / n
        return alg.scores(c, n, big_k)
    memb = alg.membership(collection, n)
    return alg.scores(multiplicities(sample, collection, alg.window(n)), memb, n)


def crafted_pair_000(alg: Any, collection: Any, letters: Sequence[Any],
                     max_n: int = 3) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The neighbour pair (datasets of size ≤ max_n over ``letters``) whose released statistic
    moves most: the score spread (EM), the ℓ₂ change (Gaussian), a changed output
    (non-private)."""
    best, pair = -1.0, None
    uni = collection.universe
    gaussian = isinstance(alg, GaussianMarginIdentifier | GaussianThresholdGenerator)
    for n in range(1, max_n + 1):
        cache: dict[tuple[Any, ...], Any] = {}
        for s, t in neighbour_pairs(letters, n):
            a = cache.setdefault(s, _statistic_000(alg, collection, _as_sample(s, uni)))
            b = cache.setdefault(t, _statistic_000(alg, collection, _as_sample(t, uni)))
            if isinstance(alg, MarginIdentifier | PointerGenerator):
                v = 0.0 if a == b else math.inf
            elif gaussian:
                v = float(np.linalg.norm(np.asarray(a, float) - np.asarray(b, float)))
            else:
                v = _spread(a, b)
            if v > best:
                best, pair = v, (s, t)
            if math.isinf(best):
                break
    assert pair is not None
    return pair


def _draws_000(alg: Any, collection: Any, sample: np.ndarray
               ) -> Callable[[np.random.Generator, int], list[Any]]:
    two_d = isinstance(alg, JointThresholdGenerator)

    def draw(rng: np.random.Generator, size: int) -> list[Any]:
        out = []
        for _ in range(size):
            sel = alg.run(sample, collection, rng)
            out.append((sel.index, sel.threshold) if two_d else sel.index)
        return out

    return draw


def audit_statistical(alg: Any, collection: Any, letters: Sequence[Any], epsilon: float,
                      method: str | None = None, max_n: int = 5, trials: int = 20_000,
                      seed: int = 0, name: str | None = None) -> AuditResult:
    """Audit a 000 algorithm (exact over all neighbours of size ≤ ``max_n`` over ``letters``,
    or Monte Carlo on the crafted pair), with the method chosen by :func:`choose_method`."""
    label = name or type(alg).__name__
    size = output_space_size(alg, collection, max_n)
    chosen, reason = choose_method(size, method)
    gaussian = isinstance(alg, GaussianMarginIdentifier | GaussianThresholdGenerator)
    delta = float(getattr(alg, "delta", 0.0)) if gaussian else 0.0
    if chosen == "exact":
        results = [privacy_audit_statistical(alg, collection, m, letters,
                                             claimed_epsilon=epsilon)
                   for m in range(1, max_n + 1)]
        passed = all(r.passed for r in results)
        pairs = sum(r.pairs for r in results)
        stat = (max(r.delta_at_epsilon or 0.0 for r in results) if gaussian else
                max(0.0 if math.isnan(r.max_log_ratio) else r.max_log_ratio for r in results))
        found = {"delta_at_epsilon": stat} if gaussian else {"max_log_ratio": stat}
        return AuditResult(mechanism=label, method="exact", epsilon=epsilon, delta=delta,
                           passed=passed, pairs=pairs, output_space=size, reason=reason,
                           detail=f"{pairs} neighbour pairs (n ≤ {max_n}, {len(letters)} letters)",
                           **found)
    a, b = crafted_pair_000(alg, collection, letters)
    uni = collection.universe
    rng = RandomStreams(seed).generator(0)
    eps_hat, detail = monte_carlo_audit(_draws_000(alg, collection, _as_sample(a, uni)),
                                        _draws_000(alg, collection, _as_sample(b, uni)),
                                        trials, rng, delta)
    return AuditResult(mechanism=label, method="monte-carlo", epsilon=epsilon, delta=delta,
                       passed=eps_hat <= epsilon + 1e-12, pairs=1, epsilon_lower_bound=eps_hat,
                       output_space=size, reason=reason, detail=f"the pair {a} ~ {b}: {detail}")


# =============================================================================================
# 001
# =============================================================================================


def _limit_prefix(instance: Any) -> Stream:
    coll = instance.collection
    return ExplicitStream(instance.stream(seed=0).prefix(LIMIT_PREFIX), coll.universe)


def _epoch_scores(alg: Any, stream: Stream, collection: Any, s: int) -> np.ndarray:
    if isinstance(alg, limit.StochasticIdentifier):
        return alg.head_log_weights(stream, collection, s, ALG3_HEAD)
    return alg.scores(stream, collection, s)


def _epoch_law(alg: Any, stream: Stream, collection: Any, s: int) -> np.ndarray:
    if isinstance(alg, limit.StochasticIdentifier):
        return alg.log_law(stream, collection, s, ALG3_HEAD)
    return alg.log_law(alg.scores(stream, collection, s), s)


def _substitutions(instance: Any) -> list[tuple[Stream, Stream]]:
    coll = instance.collection
    base = _limit_prefix(instance)
    letters = [coll.universe.at(j) for j in range(1, 4)]
    return [(base, SubstitutedStream(base, pos, v)) for pos in range(1, LIMIT_PREFIX + 1)
            for v in letters]


def _upg_pairs(coll: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    letters = [coll.universe.at(j) for j in range(1, 5)]
    return [(np.array(x, dtype=object), np.array(y, dtype=object))
            for m in range(1, 5) for x, y in neighbour_pairs(letters, m)]


def _exact_limit(alg: Any, instance: Any) -> tuple[float, str]:
    coll = instance.collection
    if isinstance(alg, limit.ApproximateIntersectionGenerator):
        a, b = limit.alg1_worst_case_counts(ALG1_EXACT_UPDATES)
        return (limit.alg1_transcript_loss(alg, a, b),
                f"the worst-case pair (001 §4.2c), {ALG1_EXACT_UPDATES} updates (the sum of "
                "each independent increment bit's largest |log-ratio|: an upper bound on the "
                "loss of the transcript)")
    if isinstance(alg, limit.UniformPrivateGenerator):
        loss = 0.0
        pairs = _upg_pairs(coll)
        for x, y in pairs:
            loss = max(loss, max_log_loss(alg.log_law(x, coll), alg.log_law(y, coll)))
        return loss, f"all {len(pairs)} neighbours of size ≤ 4 over 4 letters"
    pairs = _substitutions(instance)
    loss = 0.0
    for base, nb in pairs:
        loss = max(loss, sum(max_log_loss(_epoch_law(alg, base, coll, s),
                                          _epoch_law(alg, nb, coll, s))
                             for s in range(1, LIMIT_EPOCHS + 1)))
    return loss, (f"all {len(pairs)} substitutions of a {LIMIT_PREFIX}-element prefix, "
                  f"epochs 1–{LIMIT_EPOCHS}")


def _mc_limit(alg: Any, instance: Any, trials: int, rng: np.random.Generator
              ) -> tuple[float, str]:
    coll = instance.collection
    if isinstance(alg, limit.ApproximateIntersectionGenerator):
        a, b = limit.alg1_worst_case_counts(ALG1_MC_UPDATES)

        def bits(counts: list[np.ndarray]) -> Callable[[np.random.Generator, int], list[Any]]:
            def draw(r: np.random.Generator, size: int) -> list[Any]:
                out = []
                for _ in range(size):
                    state = np.zeros(ALG1_MC_UPDATES + 1, dtype=np.int64)
                    out.append(tuple(int(v) for k, c in enumerate(counts, 1)
                                     for v in alg._update(c, k**6, k, state, r)))
                return out
            return draw

        eps_hat, detail = monte_carlo_audit(bits(a), bits(b), trials, rng)
        return eps_hat, (f"the worst-case pair, increment bits of {ALG1_MC_UPDATES} updates: "
                         f"{detail}")
    if isinstance(alg, limit.UniformPrivateGenerator):
        best, pair = -1.0, None
        for x, y in _upg_pairs(coll):
            if len(x) > 2:
                break
            v = _spread(alg.scores(limit._masks(x, coll), len(x), coll),
                        alg.scores(limit._masks(y, coll), len(y), coll))
            if v > best:
                best, pair = v, (x, y)
            if best >= 2.0:  # Δu = 1: no pair moves the scores' spread further
                break
        assert pair is not None

        def subsets(data: np.ndarray) -> Callable[[np.random.Generator, int], list[Any]]:
            return lambda r, size: alg.sample_subsets(data, coll, r, size).tolist()

        eps_hat, detail = monte_carlo_audit(subsets(pair[0]), subsets(pair[1]), trials, rng)
        return eps_hat, f"the pair {tuple(pair[0])} ~ {tuple(pair[1])}: {detail}"
    # 001·2 / 001·3: the transcript (I_1, …, I_4) on the substitution that moves most
    best, pair = -1.0, None
    for base, nb in _substitutions(instance):
        v = sum(alg.epoch_epsilon(s) * _spread(_epoch_scores(alg, base, coll, s),
                                               _epoch_scores(alg, nb, coll, s))
                for s in range(1, LIMIT_EPOCHS + 1))
        if v > best:
            best, pair = v, (base, nb)
    assert pair is not None

    def transcript(stream: Stream) -> Callable[[np.random.Generator, int], list[Any]]:
        def draw(r: np.random.Generator, size: int) -> list[Any]:
            if isinstance(alg, limit.StochasticIdentifier):
                return [tuple(alg.sample(stream, coll, s, r) for s in range(1, LIMIT_EPOCHS + 1))
                        for _ in range(size)]
            scores = [alg.scores(stream, coll, s) for s in range(1, LIMIT_EPOCHS + 1)]
            return [tuple(_em_index(sc, alg, s, r) for s, sc in enumerate(scores, 1))
                    for _ in range(size)]
        return draw

    eps_hat, detail = monte_carlo_audit(transcript(pair[0]), transcript(pair[1]), trials, rng)
    sub = pair[1]
    assert isinstance(sub, SubstitutedStream)
    return eps_hat, (f"the 16-element prefix with x_{sub.position} := {sub.value!r}, epochs "
                     f"1–{LIMIT_EPOCHS}: {detail}")


def _em_index(scores: np.ndarray, alg: Any, s: int, rng: np.random.Generator) -> int:
    """One draw of 001·2's epoch-s mechanism on fixed scores (−inf entries are excluded, as in
    the data-dependent-window twin)."""
    fin = np.isfinite(scores)
    return int(exponential_mechanism(np.where(fin, scores, 0.0), 2.0 / alg.epoch_epsilon(s),
                                     rng, mask=fin)) + 1


def audit_limit(alg: Any, instance: Any, epsilon: float, method: str | None = None,
                trials: int = 20_000, seed: int = 0, name: str | None = None) -> AuditResult:
    """Audit a 001 algorithm in continual release (see the module docstring)."""
    label = name or type(alg).__name__
    coll = instance.collection
    if isinstance(alg, limit.ClosureGenerator) or (
            isinstance(alg, limit.ApproximateIntersectionGenerator) and not alg.private):
        return AuditResult(mechanism=label, method="exact", epsilon=epsilon, passed=False,
                           max_log_ratio=math.inf, output_space=1,
                           reason="a deterministic, non-private baseline",
                           detail="any pair whose output changes (ε = ∞)")
    if isinstance(alg, limit.StochasticIdentifier):
        alg.check(coll)
    if isinstance(alg, limit.EpochEMIdentifier) and not isinstance(alg,
                                                                   limit._DataDependentWindow):
        alg.check(coll)
    size = output_space_size(alg, coll)
    chosen, reason = choose_method(size, method)
    if chosen == "exact":
        loss, detail = _exact_limit(alg, instance)
        return AuditResult(mechanism=label, method="exact", epsilon=epsilon,
                           passed=loss <= epsilon + 1e-9, max_log_ratio=loss, output_space=size,
                           reason=reason, detail=detail)
    eps_hat, detail = _mc_limit(alg, instance, trials, RandomStreams(seed).generator(0))
    return AuditResult(mechanism=label, method="monte-carlo", epsilon=epsilon,
                       passed=eps_hat <= epsilon + 1e-12, epsilon_lower_bound=eps_hat,
                       output_space=size, reason=reason, detail=detail)


def audit(alg: Any, instance: Any, epsilon: float, method: str | None = None, max_n: int = 5,
          trials: int = 20_000, seed: int = 0) -> AuditResult:
    """Audit ``alg`` on a named instance: 000 algorithms over the instance's first four
    universe elements, 001 algorithms in continual release."""
    if isinstance(alg, _Identifier | _Generator):
        uni = instance.collection.universe
        letters = [uni.at(j) for j in range(1, 5)]
        return audit_statistical(alg, instance.collection, letters, epsilon, method, max_n,
                                 trials, seed)
    return audit_limit(alg, instance, epsilon, method, trials, seed)

"""Paper 001 ("Differentially Private Language Generation and Identification in the Limit"):
the continual-release algorithms, a fast-forward runner, and their exact privacy accounting.

| paper·alg | class | guarantee (continual release, unit "stream element", replace-one) |
|---|---|---|
| 001·1 | :class:`ApproximateIntersectionGenerator` | Laplace √t/ε₀ = k³/ε₀ at t = k⁶: (ε, 0) |
| 001·C.1 | :class:`UniformPrivateGenerator` (+ ``.continual()``) | EM on subsets, Δ = 1: (ε, 0) |
| 001·2 | :class:`EpochEMIdentifier` | EM, ε_s = 6ε/(π²s²) at t = 2ˢ: (ε, 0) |
| 001·3 | :class:`StochasticIdentifier` | EM, prior 2^{−i}s^{−2i}, Δ = 3: (ε, 0) |
| 001 | :class:`ClosureGenerator`, ``ApproximateIntersectionGenerator(ε=∞)`` | not private |

The whole, infinite output transcript is protected against replacing one stream element
(Def. 5), for every stream — valid enumerations or not (algorithms never validate their input;
:func:`dplang.formal.streams.check_stream` is the harness's precondition check).

**Corrected scale (erratum E1).** 001·1's box prints Lap(t^{1/3}/ε₀); the privacy proof needs
b_k = k³/ε₀ = √t/ε₀ (k coordinates of sensitivity 1 at cost ε₀/k², summing to ε). The printed
scale is kept as ``scale="printed"`` only as the negative control whose exact loss exceeds ε
(:func:`alg1_transcript_loss`). ⌊t^{1/6}⌋ is an exact integer root (:func:`int_root`): the float
root of 4096 = 4⁶ is 3.9999…, which would skip the update at t = 4096.

**Fast-forward runner.** Every algorithm changes state only at its update times (k⁶, 2ˢ,
2ᵗ + d) and reads the stream only through :meth:`Stream.error_count` and
:meth:`Stream.multiplicity`, so :meth:`run` jumps from update to update (t ≈ 10⁹ for 001·1,
2⁶⁰ for 001·2/3) and reports, per segment between updates, the output set or index and whether
it is valid. :meth:`ApproximateIntersectionGenerator.run_steps` is the step-level reference (one
output per t) that the tests compare with the fast-forward path.

Randomness: run u uses ``RandomStreams(seed).generator(u, 0)`` for the mechanism's noise and
``generator(u, 1)`` for the output step (NovelSample), so outputs never shift the noise.

Size: the limit-setting algorithms of paper 001 share the update-time schedule, the fast-forward
runner and the stream bookkeeping; splitting them would separate each algorithm from the
schedule its privacy proof rests on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from ..privacy.guarantees import Guarantee
from ..privacy.mechanisms import exponential_mechanism, laplace
from .collections import Collection
from .languages import Language, NatSet, element_key
from .registry import FormalAlgorithm, register_algorithm
from .statistical import Unmaterialised, log_softmax, uniform_int
from .streams import Stream

__all__ = [
    "ALGORITHMS",
    "ApproximateIntersectionGenerator",
    "ClosureGenerator",
    "EpochEMIdentifier",
    "LimitRun",
    "Segment",
    "StochasticIdentifier",
    "UniformPrivateGenerator",
    "alg1_transcript_loss",
    "alg1_worst_case_counts",
    "int_root",
    "novel_sample_law",
    "twin",
]

UNIT = "stream element"
ADJACENCY = "replace-one"
PI2 = math.pi**2


def int_root(t: int, k: int) -> int:
    """⌊t^{1/k}⌋ exactly, for any non-negative Python int t."""
    if t < 0 or k < 1:
        raise ValueError("need t >= 0 and k >= 1")
    if t < 2:
        return t
    if t.bit_length() // k < 48:
        r = round(t ** (1.0 / k))
    else:  # integer Newton iteration from above
        r = 1 << (t.bit_length() // k + 1)
        while True:
            nxt = ((k - 1) * r + t // r ** (k - 1)) // k
            if nxt >= r:
                break
            r = nxt
    while r**k > t:
        r -= 1
    while (r + 1) ** k <= t:
        r += 1
    return r


def _check_eps(epsilon: float, allow_inf: bool = False) -> None:
    if not epsilon > 0 or math.isnan(epsilon):
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    if math.isinf(epsilon) and not allow_inf:
        raise ValueError("epsilon must be finite")


def _guarantee(name: str, epsilon: float, **details: Any) -> Guarantee:
    if math.isinf(epsilon):
        return Guarantee.non_private(name, UNIT, ADJACENCY, details=details)
    return Guarantee.pure(name, UNIT, ADJACENCY, float(epsilon),
                          details={"continual_release": True, **details})


def novel_sample(language: Language, n: int, pool: int, rng: np.random.Generator) -> Any:
    """Lemma 4.1's NovelSample: the j-th member of U for j ~ Unif{1..pool} (pool = ⌈2n/β⌉).

    Pure post-processing of U: the data is never looked at, so no seen string is rejected (a
    rejecting variant has infinite privacy loss; :func:`twin`). A finite U (a bad closure) gets
    a data-independent fallback, its min(j, |U|)-th member (counted as a failure by the
    harness). A string too long to write out is returned as :class:`Unmaterialised`."""
    del n
    j = uniform_int(rng, pool)
    if not language.is_infinite:
        size = int(language.size or 0)
        if size == 0:
            return language.universe.at(1)
        j = min(j, size)
    try:
        return language.nth(j)
    except OverflowError:
        return Unmaterialised(0, 0, j)


def pool_size(n: int, log_inv_beta: float) -> int:
    """⌈2n/β⌉ for β = e^{−x}; for huge x a power of two ≥ 2n·e^x (a larger pool only lowers
    the collision probability)."""
    if log_inv_beta < 700:
        return max(1, math.ceil(2 * n * math.exp(log_inv_beta)))
    return (2 * n) << (math.ceil(log_inv_beta / math.log(2)) + 1)


@dataclass
class Segment:
    """The output between two update times: t ∈ [start, end]."""

    start: int
    end: int
    output: Any  # a Language (001·1, UPG) or an index (001·2/3)
    valid: bool | None
    note: str = ""


@dataclass
class LimitRun:
    """A fast-forwarded run: segments, per-update diagnostics and the guarantee."""

    guarantee: Guarantee
    segments: list[Segment] = field(default_factory=list)
    updates: list[dict[str, Any]] = field(default_factory=list)
    samples: list[tuple[int, Any, bool | None]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def valid_at(self, t: int) -> bool | None:
        for seg in self.segments:
            if seg.start <= t <= seg.end:
                return seg.valid
        raise ValueError(f"t = {t} is outside the run")

    def last_invalid(self) -> int | None:
        """The last t whose output was invalid (None when none was)."""
        bad = [seg.end for seg in self.segments if seg.valid is False]
        return max(bad) if bad else None


def _valid_set(u: Language, target: Language | None) -> bool | None:
    if target is None:
        return None
    return bool(u.is_infinite and u.issubset(target))


def _epoch_run(guarantee: Guarantee, collection: Collection, horizon: int,
               target_index: int | None,
               pick: Callable[[int], tuple[int, str, dict[str, Any]]]) -> LimitRun:
    """The epoch schedule of 001 Algorithms 2 and 3, fast-forwarded: ``L_1`` at t = 1, then for
    every epoch s with 2ˢ ≤ ``horizon`` the index ``pick(s)`` draws (with a note and the
    epoch's diagnostics), output on [2ˢ, 2ˢ⁺¹ − 1]. The privacy of the run is ``pick``'s."""
    out = LimitRun(guarantee)
    target = collection[target_index] if target_index else None

    def ok(i: int) -> bool | None:
        return None if target is None else collection[i].equals(target)

    out.segments.append(Segment(1, min(1, horizon), 1, ok(1), "t = 1: L_1"))
    s = 1
    while 2**s <= horizon:
        i, note, diagnostics = pick(s)
        end = min(2 ** (s + 1) - 1, horizon)
        out.segments.append(Segment(2**s, end, i, ok(i), note))
        out.updates.append({"s": s, "t": 2**s, **diagnostics, "index": i})
        s += 1
    return out


# =============================================================================================
# 001·1 — Private Approximate Intersection
# =============================================================================================


@dataclass(frozen=True)
class ApproximateIntersectionGenerator:
    """001 Algorithm 1 with the corrected Laplace scale √t/ε₀ (ε₀ = 6ε/π²).

    At t = k⁶: r_i = #{r ≤ t : x_r ∉ L_i} for i ≤ k; r̃_i = max{0, r_i + Lap(b_k)}; if
    r̃_i/t > 1/(c·i²) the counter Ñ_i increments (c = 200); priorities P̃_i = i + Ñ_i. At every t:
    order L_1..L_k by (P̃_i, i), take the longest prefix with an infinite intersection U_t, and
    output a uniform member among its first 200t³ (NovelSample with β_t = 1/(100t²)).
    ``epsilon=math.inf`` is the noise-free priority algorithm (MVYZ25; not private).

    Privacy contract: ε-DP in continual release (replace one stream element): update k
    releases a k-vector of error counts with ℓ₁ sensitivity k through Laplace(k³/ε₀), costing
    ε₀/k²; Σ_k ε₀/k² = ε; thresholds, sorting and NovelSample are post-processing."""

    epsilon: float = 1.0
    threshold_c: float = 200.0
    scale: str = "corrected"

    name = "approximate-intersection"
    paper = "001·1"

    def __post_init__(self) -> None:
        _check_eps(self.epsilon, allow_inf=True)
        if self.scale not in ("corrected", "printed"):
            raise ValueError("scale must be 'corrected' or 'printed'")
        if not self.threshold_c > 0:
            raise ValueError("the threshold constant must be > 0")

    @property
    def private(self) -> bool:
        return math.isfinite(self.epsilon)

    @property
    def eps0(self) -> float:
        return 6 * self.epsilon / PI2

    def noise_scale(self, k: int) -> float:
        """b_k = k³/ε₀ (corrected) or k²/ε₀ (the printed t^{1/3}/ε₀)."""
        return (k**3 if self.scale == "corrected" else k**2) / self.eps0

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        return _guarantee("approximate-intersection-generator (001 Alg 1)", self.epsilon,
                          scale=self.scale)

    def spent(self, updates: int) -> float:
        """Budget used after ``updates`` updates: ε₀ Σ_{k≤K} 1/k² (< ε, → ε)."""
        if not self.private:
            return math.inf
        return self.eps0 * sum(1 / k**2 for k in range(1, updates + 1))

    def update_times(self, horizon: int) -> Iterator[int]:
        k = 1
        while k**6 <= horizon:
            yield k**6
            k += 1

    def _update(self, counts: np.ndarray, t: int, k: int, state: np.ndarray,
                rng: np.random.Generator) -> np.ndarray:
        i = np.arange(1, k + 1)
        if self.private:
            noisy = np.maximum(0.0, counts + np.asarray(laplace(self.noise_scale(k), rng,
                                                                size=k)))
        else:
            noisy = counts.astype(np.float64)
        inc = noisy / t > 1.0 / (self.threshold_c * i * i)
        state[:k] += inc
        return inc

    @staticmethod
    def _closure(collection: Collection, k: int, state: np.ndarray) -> tuple[Language, int,
                                                                               list[int]]:
        prio = [(i + int(state[i - 1]), i) for i in range(1, k + 1)]
        order = [i for _, i in sorted(prio)]
        current = collection[order[0]]
        used = 1
        for i in order[1:]:
            nxt = current.intersection(collection[i])
            if not nxt.is_infinite:
                break
            current, used = nxt, used + 1
        return current, used, order

    def run(self, stream: Stream, collection: Collection, horizon: int,
            rng: np.random.Generator, target: Language | None = None,
            output_rng: np.random.Generator | None = None, sample_outputs: bool = False,
            record: bool = True) -> LimitRun:
        """Fast-forward to ``horizon``: one segment per update interval [k⁶, (k+1)⁶ − 1].

        ``target`` (K) lets the run mark each segment valid (U_t ⊆ K and infinite);
        ``sample_outputs`` draws the released string at each segment's first step.

        Privacy contract: see the class docstring (this is the algorithm itself)."""
        out = LimitRun(self.guarantee())
        kmax = int_root(horizon, 6)
        state = np.zeros(kmax + 1, dtype=np.int64)
        for k in range(1, kmax + 1):
            t = k**6
            counts = np.array([stream.error_count(collection[i], t) for i in range(1, k + 1)])
            inc = self._update(counts, t, k, state, rng)
            u, used, order = self._closure(collection, k, state)
            end = min((k + 1) ** 6 - 1, horizon)
            valid = _valid_set(u, target)
            out.segments.append(Segment(t, end, u, valid, f"J_t = {used}"))
            if record:
                out.updates.append({"t": t, "k": k, "error_counts": counts.tolist(),
                                    "increments": inc.astype(int).tolist(),
                                    "priorities": [i + int(state[i - 1])
                                                   for i in range(1, k + 1)],
                                    "order": order, "J": used})
            if sample_outputs:
                orng = output_rng if output_rng is not None else rng
                w = novel_sample(u, t, 200 * t**3, orng)
                seen = _seen(stream, w, t)
                out.samples.append((t, w, None if target is None else
                                    bool(target.contains(w) and not seen)))
        return out

    def run_steps(self, stream: Stream, collection: Collection, horizon: int,
                  rng: np.random.Generator, output_rng: np.random.Generator,
                  target: Language | None = None) -> list[tuple[int, Any, Language]]:
        """Step-level reference runner: reads x_1..x_t one by one and outputs w_t at every t
        (error counts from the materialised prefix, not from the stream's closed forms)."""
        kmax = int_root(horizon, 6)
        state = np.zeros(kmax + 1, dtype=np.int64)
        errors = np.zeros(kmax + 1, dtype=np.int64)
        outputs = []
        u: Language | None = None
        for t in range(1, horizon + 1):
            x = stream.element(t)
            for i in range(1, kmax + 1):
                if not collection[i].contains(x):
                    errors[i] += 1
            k = int_root(t, 6)
            if t == k**6:
                self._update(errors[1:k + 1].copy(), t, k, state, rng)
                u = self._closure(collection, k, state)[0]
            assert u is not None
            outputs.append((t, novel_sample(u, t, 200 * t**3, output_rng), u))
        return outputs

    def increment_probabilities(self, counts: Sequence[int], t: int, k: int) -> np.ndarray:
        """log P(increment) and log P(no increment) per language at update k (exact, for the
        privacy accounting): P(r + Lap(b) > t/(c i²))."""
        i = np.arange(1, k + 1)
        tau = t / (self.threshold_c * i * i)
        b = self.noise_scale(k)
        gap = tau - np.asarray(counts, dtype=np.float64)
        # P(Lap > gap) = ½ e^{−gap/b} for gap ≥ 0, 1 − ½ e^{gap/b} otherwise
        log_p = np.where(gap >= 0, math.log(0.5) - gap / b,
                         np.log1p(-0.5 * np.exp(np.minimum(gap, 0) / b)))
        log_q = np.where(gap >= 0, np.log1p(-0.5 * np.exp(-np.maximum(gap, 0) / b)),
                         math.log(0.5) + gap / b)
        return np.stack([log_p, log_q])


def _seen(stream: Stream, w: Any, t: int) -> bool:
    if isinstance(w, Unmaterialised):
        return False
    try:
        return stream.multiplicity(w, t) > 0
    except (ValueError, TypeError):
        return False


def alg1_transcript_loss(alg: ApproximateIntersectionGenerator, counts_a: Sequence[np.ndarray],
                         counts_b: Sequence[np.ndarray]) -> float:
    """An upper bound on the worst-case privacy loss of 001·1's released increment bits for two
    neighbouring streams, given their error-count vectors at updates k = 1..K (``counts_a[k−1]``
    has k entries).

    The bits are independent given the streams, so each bit's law is computed exactly, and
    Σ_{k,i} max(|ln p/p′|, |ln (1−p)/(1−p′)|) bounds the log-ratio of every transcript (2^(Σ k)
    of them) in both directions. It is not the loss itself: that is the larger of the two
    one-directional sums Σ max(ln p/p′, ln (1−p)/(1−p′)) and Σ max(ln p′/p, ln (1−p′)/(1−p)),
    which the bound exceeds where bits' worst directions differ (at the worst-case pair over 200
    updates, ε = 1: 0.946 against 0.996; the printed-scale twin 3.31 against 3.57). Everything
    downstream (priorities, order, U_t, NovelSample) is post-processing of the bits."""
    total = 0.0
    for k, (a, b) in enumerate(zip(counts_a, counts_b, strict=True), 1):
        la = alg.increment_probabilities(a, k**6, k)
        lb = alg.increment_probabilities(b, k**6, k)
        total += float(np.sum(np.max(np.abs(la - lb), axis=0)))
    return total


def alg1_worst_case_counts(updates: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Spec 001 §4.2(c): every stream element lies in every L_i, and the neighbour replaces x_1
    by a string in no language: r_{i,t} = 0 against 1 at every update."""
    a = [np.zeros(k, dtype=np.int64) for k in range(1, updates + 1)]
    b = [np.ones(k, dtype=np.int64) for k in range(1, updates + 1)]
    return a, b


# =============================================================================================
# Non-private closure generator (LRT25)
# =============================================================================================


@dataclass(frozen=True)
class ClosureGenerator:
    """The non-private uniform generator for a finite collection (LRT25): output the smallest
    unseen member of Cl({L ∈ 𝓛 : L ⊇ S_n}); correct once d + 1 distinct strings were seen.

    Privacy contract: NOT private (ε = ∞)."""

    name = "closure"
    paper = "001 (LRT25)"
    private = False
    epsilon = math.inf

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        return _guarantee("closure-generator (LRT25, non-private)", math.inf)

    def output(self, data: Sequence[Any], collection: Collection) -> Any:
        seen = {element_key(x) for x in data}
        consistent = [i for i in range(1, int(collection.size or 0) + 1)
                      if all(collection[i].contains(x) for x in seen)]
        u = collection.intersection(consistent)
        r = 1
        while True:
            x = u.nth(r)
            if element_key(x) not in seen:
                return x
            r += 1


# =============================================================================================
# 001·C.1 — uniform private generator over subsets
# =============================================================================================


def _superset_sums(values: np.ndarray, k: int) -> np.ndarray:
    """cnt[S] = Σ_{T ⊇ S} values[T] over bitmasks (zeta transform), O(k 2^k)."""
    out = values.astype(np.float64).copy()
    for b in range(k):
        view = out.reshape(-1, 2, 1 << b)  # axis 1 = bit b of the mask
        view[:, 0, :] += view[:, 1, :]
    return out


@lru_cache(maxsize=8)
def _popcounts(k: int) -> np.ndarray:
    """|S| for every bitmask S < 2^k (read-only, cached)."""
    masks = np.arange(1 << k, dtype=np.int64)
    out = np.zeros(1 << k, dtype=np.float64)
    for b in range(k):
        out += (masks >> b) & 1
    out.setflags(write=False)
    return out


def _masks(data: Sequence[Any] | np.ndarray, collection: Collection) -> np.ndarray:
    k = int(collection.size or 0)
    arr = np.asarray(data)
    masks = np.zeros(arr.shape[0], dtype=np.int64)
    for i in range(1, k + 1):
        masks |= collection[i].contains_many(arr).astype(np.int64) << (i - 1)
    return masks


_INF_CACHE: dict[int, tuple[Collection, np.ndarray]] = {}


def infinite_closures(collection: Collection) -> np.ndarray:
    """inf[S] = [Cl(L_S) is infinite] for every bitmask S of a finite collection (Cl(∅) = X).

    For eventually periodic languages over ℕ₀ the infinite atoms are read off one period beyond
    every start (a closure is infinite iff some infinite atom lies in it); otherwise every
    closure is intersected explicitly (k ≤ 12)."""
    hit = _INF_CACHE.get(id(collection))
    if hit is not None and hit[0] is collection:
        return hit[1]
    k = int(collection.size or 0)
    langs = collection.first(k)
    if all(isinstance(lang, NatSet) and lang.universe.offset == 0 for lang in langs):
        start = max((p.lo for lang in langs for p in lang.pieces), default=0)
        period = 1
        for lang in langs:
            if lang.is_infinite:
                q = lang.pieces[-1].q
                period = period // math.gcd(period, q) * q
        if period > 5_000_000:
            raise ValueError("period too large for the atom enumeration")
        xs = np.arange(start, start + period, dtype=np.int64)
        atoms = np.unique(_masks(xs, collection))
        ind = np.zeros(1 << k)
        ind[atoms] = 1
        inf = _superset_sums(ind, k) > 0
    else:
        if k > 12:
            raise ValueError("explicit closure enumeration is limited to k <= 12")
        inf = np.array([collection.intersection([i + 1 for i in range(k) if s >> i & 1])
                        .is_infinite for s in range(1 << k)])
    _INF_CACHE[id(collection)] = (collection, inf)
    return inf


@dataclass(frozen=True)
class UniformPrivateGenerator:
    """001 Thm C.1 (one-shot): exponential mechanism over all subsets S ⊆ [k] with
    u(S) = |Cl(L_S) ∩ x_{1:n}| + f·|S|, f = (n − d − 2k ln2/ε)/k (Δu = 1; positions counted),
    weights e^{εu/2}; then NovelSample from Cl(L_S) with β = e^{−ε(n−d)/(2k)}.

    Finite collections with k ≤ 20 (2^k subsets); d is the closure dimension (computed when
    not given).

    Privacy contract: ε-DP under replacing one input element (exponential mechanism with
    Δu = 1; NovelSample is post-processing)."""

    epsilon: float = 1.0
    d: int | None = None

    name = "uniform-private"
    paper = "001·C.1"
    private = True

    def __post_init__(self) -> None:
        _check_eps(self.epsilon)

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        return _guarantee("uniform-private-generator (001 Thm C.1)", self.epsilon)

    def temperature(self) -> float:
        return 2.0 / self.epsilon

    def _k_d(self, collection: Collection) -> tuple[int, int]:
        if not collection.is_finite:
            if self.d is None:
                collection.closure_dimension()  # raises: not computable for a countable one
            raise ValueError("the uniform private generator needs a finite collection")
        k = int(collection.size or 0)
        if k > 20:
            raise ValueError(f"the uniform private generator enumerates 2^k subsets: k = {k} "
                             "> 20")
        d = self.d if self.d is not None else collection.closure_dimension()
        return k, max(d, 0)

    def scores(self, masks: np.ndarray, n: int, collection: Collection,
               epsilon: float | None = None) -> np.ndarray:
        k, d = self._k_d(collection)
        eps = self.epsilon if epsilon is None else epsilon
        counts = np.bincount(np.asarray(masks, dtype=np.int64), minlength=1 << k)
        cnt = _superset_sums(counts, k)
        f = (n - d - 2 * k * math.log(2) / eps) / k
        return cnt + f * _popcounts(k)

    def log_law(self, data: Sequence[Any] | np.ndarray, collection: Collection,
                epsilon: float | None = None) -> np.ndarray:
        """Exact log-law of the selected subset (bitmask order)."""
        eps = self.epsilon if epsilon is None else epsilon
        s = self.scores(_masks(data, collection), len(data), collection, eps)
        return log_softmax(s / self._temp_for(eps))

    def _temp_for(self, eps: float) -> float:
        return 2.0 / eps

    def p_good(self, data: Sequence[Any] | np.ndarray, collection: Collection,
               target_index: int) -> float:
        """P(i* ∈ S and Cl(L_S) infinite) exactly (the "good" event of Thm C.1's proof)."""
        law = np.exp(self.log_law(data, collection))
        inf = infinite_closures(collection)
        bit = 1 << (target_index - 1)
        sets = np.arange(law.size)
        good = ((sets & bit) != 0) & inf
        return float(law[good].sum())

    def sample_subsets(self, data: Sequence[Any] | np.ndarray, collection: Collection,
                       rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` independent draws of the selected subset S (bitmasks) on the same input:
        the scores are computed once and each draw is the inverse-CDF step of
        :func:`dplang.privacy.mechanisms.exponential_mechanism` (for a given generator, the
        same draws as ``size`` calls of it), so Monte Carlo audits of 2^k outputs stay cheap.

        Privacy contract: each draw is one run of the ε-DP mechanism on ``data`` (``size``
        draws on the same data compose to size·ε; audits only)."""
        s = self.scores(_masks(data, collection), len(data), collection) / float(
            self._temp_for(self.epsilon))
        cdf = np.cumsum(np.exp(s - s.max()))
        u = rng.random(size) * cdf[-1]
        return np.minimum(np.searchsorted(cdf, u, side="right"), cdf.size - 1)

    def run(self, data: Sequence[Any] | np.ndarray, collection: Collection,
            rng: np.random.Generator, epsilon: float | None = None,
            beta_scale: float = 1.0) -> tuple[Any, int, Language]:
        """(released string, chosen subset bitmask, Cl(L_S)) for input x_{1:n}.

        Privacy contract: see the class docstring."""
        eps = self.epsilon if epsilon is None else epsilon
        k, d = self._k_d(collection)
        n = len(data)
        s = self.scores(_masks(data, collection), n, collection, eps)
        subset = exponential_mechanism(s, self._temp_for(eps), rng)
        u = collection.intersection([i + 1 for i in range(k) if subset >> i & 1])
        log_inv_beta = eps * (n - d) / (2 * k) - math.log(beta_scale)
        w = novel_sample(u, n, pool_size(n, max(log_inv_beta, 0.0)), rng)
        return w, subset, u

    def continual(self) -> UPGContinual:
        """The continual-release version (epochs n_t = 2ᵗ + d, ε_t = 6ε/(π²t²))."""
        return UPGContinual(self.epsilon, self.d)


@dataclass(frozen=True)
class UPGContinual:
    """001 Thm C.1 (continual release): at n_t = 2ᵗ + d run the one-shot mechanism on x_{1:n_t}
    with ε_t = 6ε/(π²t²); until n_{t+1} − 1 output NovelSample(Cl(L_{S_t}), n, β_n) with
    β_n = e^{−ε_t(n_t−d)/(2k)}/2ᵗ [RECON]; before n_1 = 2 + d, the data-independent u_1.

    Privacy contract: ε-DP in continual release (Σ_t ε_t = ε)."""

    epsilon: float = 1.0
    d: int | None = None

    name = "uniform-private-continual"
    paper = "001·C.1 (CR)"
    private = True

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        return _guarantee("uniform-private-generator, continual (001 Thm C.1)", self.epsilon)

    def epoch_epsilon(self, t: int) -> float:
        return 6 * self.epsilon / (PI2 * t * t)

    def run(self, stream: Stream, collection: Collection, horizon: int,
            rng: np.random.Generator, target: Language | None = None) -> LimitRun:
        """Fast-forward over epochs (the prefix x_{1:n_t} is materialised; n_t ≤ 2²⁰)."""
        one = UniformPrivateGenerator(self.epsilon, self.d)
        k, d = one._k_d(collection)
        out = LimitRun(self.guarantee())
        first = 2 + d
        if horizon < first:
            out.segments.append(Segment(1, horizon, None, None, "before the first epoch"))
            return out
        out.segments.append(Segment(1, first - 1, None, False if target else None,
                                    "data-independent string before n_1"))
        t = 1
        while 2**t + d <= horizon:
            n_t = 2**t + d
            if n_t > 2**20:
                raise ValueError("the continual UPG materialises prefixes up to 2^20")
            eps_t = self.epoch_epsilon(t)
            data = stream.prefix(n_t)
            law = one.log_law(data, collection, eps_t)
            subset = exponential_mechanism(law, 1.0, rng)
            u = collection.intersection([i + 1 for i in range(k) if subset >> i & 1])
            end = min(2 ** (t + 1) + d - 1, horizon)
            out.segments.append(Segment(n_t, end, u, _valid_set(u, target), f"S = {subset:b}"))
            out.updates.append({"t": n_t, "epoch": t, "epsilon": eps_t, "subset": subset})
            t += 1
        return out


# =============================================================================================
# 001·2 — epoch exponential mechanism (online identification)
# =============================================================================================


@dataclass(frozen=True)
class EpochEMIdentifier:
    """001 Algorithm 2: at t_s = 2ˢ, W_s = max({1} ∪ {d ≤ s : M(d) ≤ t_s/2}) (public),
    u_s(i) = −#{r ≤ t_s : x_r ∉ L_i} for i ≤ W_s (Δ = 1), I_s ~ EM with ε_s = 6ε/(π²s²); output
    L_{I_s} on [2ˢ, 2ˢ⁺¹ − 1] and L_1 at t = 1. ``cap=False`` uses W_s = s (Thm 1.5 demos).

    Privacy contract: ε-DP in continual release (Σ_s ε_s = ε; W_s depends only on the public
    M(·); repeated outputs are post-processing)."""

    epsilon: float = 1.0
    cap: bool = True

    name = "epoch-em"
    paper = "001·2"
    private = True

    def __post_init__(self) -> None:
        _check_eps(self.epsilon)

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        return _guarantee("epoch-exponential-mechanism identifier (001 Alg 2)", self.epsilon,
                          cap=self.cap)

    def epoch_epsilon(self, s: int) -> float:
        return 6 * self.epsilon / (PI2 * s * s)

    def window(self, s: int, collection: Collection) -> int:
        """W_s (at most |𝓛| for a finite collection)."""
        if not self.cap:
            return collection.horizon(s)
        ts = 2**s
        w = 1
        for dd in range(1, collection.horizon(s) + 1):
            if collection.M(dd) <= ts / 2:
                w = dd
        return w

    def check(self, collection: Collection, upto: int = 32) -> None:
        """Refuse a collection without finite pairwise intersections (Thm C.5's condition)."""
        if self.cap and not collection.finite_pairwise_intersections(min(upto, collection.size
                                                                         or upto)):
            raise ValueError(f"001 Algorithm 2 needs finite pairwise intersections; "
                             f"{collection.name} has an infinite one among its first "
                             f"{min(upto, collection.size or upto)} languages")

    def scores(self, stream: Stream, collection: Collection, s: int) -> np.ndarray:
        ts = 2**s
        return -np.array([stream.error_count(collection[i], ts)
                          for i in range(1, self.window(s, collection) + 1)], dtype=np.float64)

    def log_law(self, scores: np.ndarray, s: int) -> np.ndarray:
        return log_softmax(scores * self.epoch_epsilon(s) / 2.0)

    def run(self, stream: Stream, collection: Collection, horizon: int,
            rng: np.random.Generator, target_index: int | None = None) -> LimitRun:
        """Fast-forward over epochs 2ˢ ≤ horizon (Privacy contract: class docstring)."""
        self.check(collection)

        def pick(s: int) -> tuple[int, str, dict[str, Any]]:
            sc = self.scores(stream, collection, s)
            i = exponential_mechanism(sc, 2.0 / self.epoch_epsilon(s), rng) + 1
            return i, f"s = {s}, W_s = {sc.size}", {"W": int(sc.size), "scores": sc.tolist()}

        return _epoch_run(self.guarantee(), collection, horizon, target_index, pick)

    def epoch_error(self, stream: Stream, collection: Collection, s: int,
                    target_index: int) -> float:
        """Pr[I_s ≠ i*] exactly for a given stream (the law of one epoch)."""
        law = np.exp(self.log_law(self.scores(stream, collection, s), s))
        target = collection[target_index]
        return float(sum(p for i, p in enumerate(law, 1) if not collection[i].equals(target)))


# =============================================================================================
# 001·3 — stochastic identification with tell-tales
# =============================================================================================


_HEAD_CACHE: dict[tuple[Any, ...], tuple[Stream, Collection, np.ndarray]] = {}


@dataclass(frozen=True)
class StochasticIdentifier:
    """001 Algorithm 3: at t_s = 2ˢ, k_s = s³,
    u_s(i) = −#{r ≤ t_s : x_r ∉ L_i} − Σ_{w ∈ T_i} max{0, k_s − c(w)} (Δ = 3), and
    P(I_s = i) ∝ π_i s^{−2i} exp(λ_s u_s(i)) with π_i = 2^{−i}, λ_s = ε_s/(2Δ),
    ε_s = 6ε/(π²s²), over all i ∈ ℕ — sampled exactly by an envelope: the first m = 10 + s
    weights exactly, the tail from the prior (geometric with ratio 1/(2s²)) accepted with
    probability e^{λ_s u_s(i)}. L_1 at t = 1 [RECON].

    Privacy contract: ε-DP in continual release (the prior is data-independent; Σ ε_s = ε)."""

    epsilon: float = 1.0
    sensitivity: float = 3.0

    name = "stochastic"
    paper = "001·3"
    private = True

    def __post_init__(self) -> None:
        _check_eps(self.epsilon)

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        return _guarantee("stochastic identifier (001 Alg 3)", self.epsilon)

    def epoch_epsilon(self, s: int) -> float:
        return 6 * self.epsilon / (PI2 * s * s)

    def lam(self, s: int) -> float:
        return self.epoch_epsilon(s) / (2 * self.sensitivity)

    @staticmethod
    def cutoff(s: int) -> int:
        return 10 + s

    def utility(self, stream: Stream, collection: Collection, i: int, s: int) -> float:
        ts, ks = 2**s, s**3
        err = stream.error_count(collection[i], ts)
        deficit = sum(max(0, ks - stream.multiplicity(w, ts)) for w in collection.telltale(i))
        return -float(err + deficit)

    def log_prior(self, i: int, s: int) -> float:
        return -i * math.log(2) - 2 * i * math.log(s) if s > 1 else -i * math.log(2)

    def head_log_weights(self, stream: Stream, collection: Collection, s: int,
                         m: int | None = None) -> np.ndarray:
        m = collection.horizon(self.cutoff(s) if m is None else m)
        key = (id(stream), id(collection), s, m, self.epsilon, self.sensitivity)
        hit = _HEAD_CACHE.get(key)
        if hit is not None and hit[0] is stream and hit[1] is collection:
            return hit[2]
        lam = self.lam(s)
        out = np.array([self.log_prior(i, s) + lam * self.utility(stream, collection, i, s)
                        for i in range(1, m + 1)])
        if len(_HEAD_CACHE) > 256:
            _HEAD_CACHE.clear()
        _HEAD_CACHE[key] = (stream, collection, out)
        return out

    def log_law(self, stream: Stream, collection: Collection, s: int,
                upto: int | None = None) -> np.ndarray:
        """log P(I_s = i) for i ≤ upto (default cutoff + 40), normalised over all of ℕ: terms
        beyond are below (2s²)^{−upto} relative and are bounded by the prior."""
        upto = collection.horizon(self.cutoff(s) + 40 if upto is None else upto)
        logw = self.head_log_weights(stream, collection, s, upto)
        if collection.is_finite and upto == collection.size:
            return logw - float(np.logaddexp.reduce(logw))
        ratio = 1 / (2 * s * s) if s > 1 else 0.5
        tail = self.log_prior(upto + 1, s) - math.log1p(-ratio)  # Σ_{i>upto} prior ≥ tail mass
        total = float(np.logaddexp(np.logaddexp.reduce(logw), tail))
        return logw - total

    def check(self, collection: Collection) -> None:
        if not collection.has_telltales:
            raise ValueError(f"001 Algorithm 3 needs tell-tales; {collection.name} supplies "
                             "none")

    def sample(self, stream: Stream, collection: Collection, s: int,
               rng: np.random.Generator) -> int:
        """One exact draw of I_s (envelope rejection sampling over ℕ)."""
        m = collection.horizon(self.cutoff(s))
        head = self.head_log_weights(stream, collection, s, m)
        if collection.is_finite and m == collection.size:
            return exponential_mechanism(head, 1.0, rng) + 1
        ratio = 1 / (2 * s * s) if s > 1 else 0.5
        log_tail = self.log_prior(m + 1, s) - math.log1p(-ratio)
        logits = np.append(head, log_tail)
        lam = self.lam(s)
        for _ in range(10_000):
            j = exponential_mechanism(logits, 1.0, rng)  # a categorical draw on exact weights
            if j < m:
                return j + 1
            i = m + int(rng.geometric(1 - ratio))
            if rng.random() < math.exp(lam * self.utility(stream, collection, i, s)):
                return i
        raise RuntimeError("envelope sampler did not accept")  # pragma: no cover

    def run(self, stream: Stream, collection: Collection, horizon: int,
            rng: np.random.Generator, target_index: int | None = None) -> LimitRun:
        """Fast-forward over epochs 2ˢ ≤ horizon (Privacy contract: class docstring)."""
        self.check(collection)

        def pick(s: int) -> tuple[int, str, dict[str, Any]]:
            return self.sample(stream, collection, s, rng), f"s = {s}", {}

        return _epoch_run(self.guarantee(), collection, horizon, target_index, pick)

    def epoch_error(self, stream: Stream, collection: Collection, s: int,
                    target_index: int) -> float:
        """Pr[I_s ≠ i*] given the stream (exact up to the tail bound of :meth:`log_law`)."""
        law = np.exp(self.log_law(stream, collection, s))
        target = collection[target_index]
        right = sum(p for i, p in enumerate(law, 1) if collection[i].equals(target))
        return float(max(0.0, 1.0 - right))


# =============================================================================================
# Broken twins (negative controls)
# =============================================================================================


@dataclass(frozen=True)
class _DataDependentWindow(EpochEMIdentifier):
    """001·2 twin: W_s = the languages (among the first s) with zero error — data-dependent."""

    def scores(self, stream: Stream, collection: Collection, s: int) -> np.ndarray:
        ts = 2**s
        errs = [stream.error_count(collection[i], ts) for i in range(1, s + 1)]
        keep = [i for i, e in enumerate(errs, 1) if e == 0] or [1]
        sc = np.full(s, -np.inf)
        for i in keep:
            sc[i - 1] = -float(errs[i - 1])
        return sc

    def log_law(self, scores: np.ndarray, s: int) -> np.ndarray:
        out = np.full(scores.shape, -np.inf)
        fin = np.isfinite(scores)
        out[fin] = log_softmax(scores[fin] * self.epoch_epsilon(s) / 2.0)
        return out


@dataclass(frozen=True)
class _UPGTwin(UniformPrivateGenerator):
    """UPG with weights e^{εu} instead of e^{εu/2}."""

    def _temp_for(self, eps: float) -> float:
        return 1.0 / eps


def novel_sample_law(language: Language, pool: int, seen: set[Any] | None = None,
                     rejecting: bool = False) -> dict[Any, float]:
    """Exact output law of NovelSample over a small pool (the rejecting twin conditions on
    unseen strings)."""
    members = [element_key(language.nth(j)) for j in range(1, pool + 1)]
    if rejecting:
        members = [x for x in members if x not in (seen or set())]
    law: dict[Any, float] = {}
    for x in members:
        law[x] = law.get(x, 0.0) + 1.0 / len(members)
    return law


def twin(alg: Any) -> Any:
    """The broken variant of a 001 algorithm (negative control for the audits)."""
    if isinstance(alg, ApproximateIntersectionGenerator):
        return ApproximateIntersectionGenerator(alg.epsilon, alg.threshold_c, "printed")
    if isinstance(alg, EpochEMIdentifier):
        return _DataDependentWindow(alg.epsilon, alg.cap)
    if isinstance(alg, UniformPrivateGenerator):
        return _UPGTwin(alg.epsilon, alg.d)
    if isinstance(alg, StochasticIdentifier):
        return StochasticIdentifier(alg.epsilon, sensitivity=1.0)
    raise ValueError(f"no twin for {type(alg).__name__}")


#: The algorithms of the limit setting, registered (:mod:`dplang.formal.registry`); the uniform
#: private generator also runs one-shot on a sample (the statistical setting).
_ENTRIES = (
    register_algorithm(FormalAlgorithm(
        "approximate-intersection", ApproximateIntersectionGenerator, "001·1", "generation",
        ("limit",))),
    register_algorithm(FormalAlgorithm(
        "uniform-private", UniformPrivateGenerator, "001·C.1", "generation",
        ("statistical", "limit"), aliases=("001.c1",))),
    register_algorithm(FormalAlgorithm(
        "epoch-em", EpochEMIdentifier, "001·2", "identification", ("limit",))),
    register_algorithm(FormalAlgorithm(
        "stochastic", StochasticIdentifier, "001·3", "identification", ("limit",))),
    register_algorithm(FormalAlgorithm(
        "closure", ClosureGenerator, "001 (LRT25)", "generation", ("limit",), private=False)),
)

#: name → (class, paper algorithm, task), from the registry (kept for earlier imports).
ALGORITHMS: dict[str, tuple[type, str, str]] = {e.name: (e.cls, e.paper, e.task)
                                               for e in _ENTRIES}

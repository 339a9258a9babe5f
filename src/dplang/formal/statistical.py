"""Paper 000 ("On the Price of Privacy for Language Identification and Generation"): the seven
algorithms of the statistical setting, S ~ Dⁿ.

| paper·alg | class | guarantee (replace-one, unit "record", n public) |
|---|---|---|
| 000·4 | :class:`MarginIdentifier` | not private (ε = ∞) |
| 000·5 | :class:`PointerGenerator` | not private (ε = ∞) |
| 000·1 | :class:`SoftMarginIdentifier` | exponential mechanism, Δ = 4K²/n: (ε, 0) |
| 000·2 | :class:`GaussianMarginIdentifier` | errors + N(0, σ²), ℓ₂ √K′/n: (ε, δ) |
| 000·3 | :class:`PrefixCountGenerator` | exponential mechanism, Δ = 1: (ε, 0) |
| 000·6 | :class:`JointThresholdGenerator` | EM on [K]×[M̄], Δ = M̄/τ: (ε, 0) |
| 000·7 | :class:`GaussianThresholdGenerator` | ℓ₂ √(K′M̄)·M̄/τ, then argmax: (ε, δ) |

Every algorithm is a frozen dataclass of public parameters. The tuning K = k(n), τ(n), M̄ = m̄(n),
M and R(n) are numbers or callables of n only (never of the data: spec 000 §5.7, DESIGN
invariant 4). The range searched is K′ = min(K, |𝓛|) for a finite collection, with the constants
computed from K (spec 000 §2); Algorithm 2's noise uses the true ℓ₂ sensitivity √K′/n of the
K′-vector it releases (the E3 numbers are reproduced only this way).

Each algorithm exposes its score function on sufficient statistics — error counts (the number
of sample points outside each L_i) for identification, multiplicities N_j of u_1..u_W for
generation — vectorised over leading axes, and the *exact* law of its selection given those
statistics (``log_law``; closed form for the exponential mechanism and for Algorithm 2 with
K′ ≤ 2). :mod:`dplang.formal.evaluation` averages these laws over the sufficient statistics to
get Err exactly. ``run`` draws the released output with the privacy core:
:func:`dplang.privacy.mechanisms.exponential_mechanism` at temperature 2Δ/ε and
:func:`dplang.privacy.mechanisms.gaussian`.

Gaussian calibration: ``calibration="classical"`` (default) uses σ = Δ√(2 ln(1.25/δ))/ε, valid
only for ε < 1 (Lemma 2.5), and states (ε, δ) with ``rho=None``; ``calibration="zcdp"`` uses
ρ = :func:`dplang.privacy.accounting.epsilon_to_rho` (ε, δ) and σ = Δ/√(2ρ), valid for any ε.

Floating-point exponential mechanisms are not exactly DP (precision attacks, Mironov 2012); this
is documented, not defended against (out of scope for the lab).

Size: the statistical-setting algorithms of paper 000 (identification and generation, with their
exact selection laws) share one parameter schedule and one set of score functions, and are read
beside the paper's section.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
from scipy.stats import norm

from ..privacy.accounting import epsilon_to_rho
from ..privacy.guarantees import Guarantee
from ..privacy.mechanisms import exponential_mechanism, gaussian
from .collections import Collection
from .languages import element_key
from .registry import FormalAlgorithm, register_algorithm

__all__ = [
    "ALGORITHMS",
    "GaussianMarginIdentifier",
    "GaussianThresholdGenerator",
    "JointThresholdGenerator",
    "Linear",
    "MarginIdentifier",
    "PointerGenerator",
    "PrefixCountGenerator",
    "Selection",
    "SoftMarginIdentifier",
    "TimesPow2",
    "Unmaterialised",
    "gaussian_calibration",
    "uniform_int",
]

Tuning = int | float | Callable[[int], float]


@dataclass(frozen=True)
class Linear:
    """The public tuning n ↦ factor·n (picklable, unlike a lambda)."""

    factor: float

    def __call__(self, n: int) -> float:
        return n * self.factor

    def __repr__(self) -> str:
        return f"{self.factor:g}·n"


@dataclass(frozen=True)
class TimesPow2:
    """The public pool size n ↦ n·2^exponent (an exact integer)."""

    exponent: int

    def __call__(self, n: int) -> int:
        return n << self.exponent

    def __repr__(self) -> str:
        return f"n·2^{self.exponent}"

UNIT = "record"
ADJACENCY = "replace-one"


# =============================================================================================
# Shared helpers
# =============================================================================================


def _resolve(value: Tuning, n: int, name: str, integer: bool = True) -> Any:
    v = value(n) if callable(value) else value
    if integer:
        if isinstance(v, float) and not v.is_integer():
            raise ValueError(f"{name}({n}) = {v} is not an integer")
        v = int(v)
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    else:
        v = float(v)
        if not (v > 0 and math.isfinite(v)):
            raise ValueError(f"{name} must be > 0 and finite, got {v}")
    return v


def _check_epsilon(epsilon: float) -> None:
    if not epsilon > 0 or math.isnan(epsilon):
        raise ValueError(f"epsilon must be > 0, got {epsilon}")


def _check_finite_epsilon(epsilon: float) -> None:
    """An exponential mechanism's ε: > 0 and finite (its temperature 2Δ/ε must be > 0)."""
    _check_epsilon(epsilon)
    if not math.isfinite(epsilon):
        raise ValueError("epsilon must be finite")


def _check_delta(delta: float) -> None:
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")


def _check_n(n: int) -> int:
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n}")
    return int(n)


def gaussian_calibration(l2_sensitivity: float, epsilon: float, delta: float,
                         calibration: str = "classical") -> tuple[float, float | None]:
    """(σ, ρ) for the Gaussian mechanism (Lemma 2.5 / Remark 2.6).

    Privacy contract: adding N(0, σ²) per coordinate to a query with ℓ₂ sensitivity
    ``l2_sensitivity`` is (ε, δ)-DP — classically for ε < 1 (ρ returned as None), or ρ-zCDP with
    ρ = epsilon_to_rho(ε, δ), which implies (ε, δ), for any ε."""
    _check_epsilon(epsilon)
    _check_delta(delta)
    if calibration == "classical":
        if not epsilon < 1:
            raise ValueError(f"the classical Gaussian calibration needs epsilon < 1, got "
                             f"{epsilon}; use calibration='zcdp'")
        return l2_sensitivity * math.sqrt(2 * math.log(1.25 / delta)) / epsilon, None
    if calibration == "zcdp":
        if not math.isfinite(epsilon):
            raise ValueError("epsilon must be finite")
        rho = epsilon_to_rho(epsilon, delta)
        return l2_sensitivity / math.sqrt(2 * rho), rho
    raise ValueError(f"unknown calibration {calibration!r}; use 'classical' or 'zcdp'")


def _gaussian_guarantee(name: str, epsilon: float, delta: float, calibration: str
                        ) -> Guarantee:
    """(ε, δ)-DP of a Gaussian release calibrated by :func:`gaussian_calibration`: classical
    (no ρ), or ρ-zCDP for the target (ε, δ)."""
    rho = gaussian_calibration(1.0, epsilon, delta, calibration)[1]
    details = {"calibration": calibration, "mechanism": "gaussian"}
    if rho is None:
        return Guarantee.approximate(name, UNIT, ADJACENCY, epsilon, delta, details=details)
    return Guarantee.zcdp(name, UNIT, ADJACENCY, rho, delta, epsilon=epsilon, details=details)


def uniform_int(rng: np.random.Generator, high: int) -> int:
    """A uniform integer in {1, …, high} for any Python int ``high`` ≥ 1 (exact rejection
    sampling on 64-bit words)."""
    if high < 1:
        raise ValueError("high must be >= 1")
    if high <= 2**62:
        return int(rng.integers(1, high + 1))
    k = (high - 1).bit_length()
    words = (k + 63) // 64
    shift = 64 * words - k
    while True:
        r = 0
        for w in rng.integers(0, 2**64, size=words, dtype=np.uint64).tolist():
            r = (r << 64) | int(w)
        r >>= shift
        if r < high:
            return r + 1


@dataclass(frozen=True)
class Unmaterialised:
    """A released string too long to write out (e.g. the 2⁷⁰-th word of a*): the r-th member of
    L_i beyond position m. It is a member of L_i and longer than every sample string."""

    language_index: int
    beyond: int
    rank: int

    def __str__(self) -> str:
        return f"<member #{self.rank} of L{self.language_index} beyond position {self.beyond}>"


@dataclass
class Selection:
    """What one run released, with diagnostics.

    ``output`` is the released language (identification) or string (generation); ``index`` is
    î; ``threshold`` the window M or m̂ beyond which the string was drawn; ``log_law`` the exact
    log-law of the selection over the range given the data when it has a closed form."""

    output: Any
    index: int
    guarantee: Guarantee
    threshold: int | None = None
    diagnostics: dict[str, Any] = field(default_factory=dict)


def _membership(collection: Collection, k: int, window: int) -> np.ndarray:
    """memb[i, j] = [u_{j+1} ∈ L_{i+1}] for i < K′, j < W (cached per collection object)."""
    return _membership_cached(collection, k, window).copy()


@lru_cache(maxsize=256)
def _membership_cached(collection: Collection, k: int, window: int) -> np.ndarray:
    uni = collection.universe
    elems = [uni.at(j) for j in range(1, window + 1)]
    return np.array([lang.contains_many(elems) if elems else np.zeros(0, bool)
                     for lang in collection.first(k)], dtype=bool).reshape(-1, window)


def error_counts(sample: Sequence[Any] | np.ndarray, collection: Collection, k: int) -> np.ndarray:
    """c_i = #{t : x_t ∉ L_i} for i ≤ K′ (so err_S(L_i) = c_i/n)."""
    arr = np.asarray(sample) if not isinstance(sample, np.ndarray) else sample
    return np.array([int(arr.shape[0] - np.count_nonzero(lang.contains_many(arr)))
                     for lang in collection.first(k)], dtype=np.int64)


def multiplicities(sample: Sequence[Any] | np.ndarray, collection: Collection,
                   window: int) -> np.ndarray:
    """N_j = N_S(u_j) for j = 1..W."""
    uni = collection.universe
    out = np.zeros(window, dtype=np.int64)
    arr = np.asarray(sample) if not isinstance(sample, np.ndarray) else sample
    if arr.dtype.kind in "iu" and hasattr(uni, "offset"):
        pos = arr.astype(np.int64) + uni.offset  # 0-based positions
        pos = pos[(pos >= 0) & (pos < window)]
        out += np.bincount(pos, minlength=window)[:window]
        return out
    for x in arr.tolist():
        try:
            j = uni.index(element_key(x))
        except ValueError:
            continue
        if j <= window:
            out[j - 1] += 1
    return out


def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """x − logsumexp(x) along ``axis`` (plain numpy; scipy's version is slower per call)."""
    x = np.asarray(x, dtype=np.float64)
    top = np.max(x, axis=axis, keepdims=True)
    shifted = x - top
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def _em_log_law(scores: np.ndarray, sensitivity: float, epsilon: float) -> np.ndarray:
    """log P(i) = log-softmax(ε s_i / (2Δ)) along the last axis (the exact EM law)."""
    return log_softmax(np.asarray(scores, dtype=np.float64) * (epsilon / (2 * sensitivity)),
                       axis=-1)


def _check_infinite(collection: Collection, k: int) -> None:
    for i, lang in enumerate(collection.first(k), 1):
        if not lang.is_infinite:
            raise ValueError(f"generation needs infinite languages; L{i} = {lang.describe()} "
                             "is finite")


def _draw_string(collection: Collection, index: int, beyond: int, big_r: int,
                 rng: np.random.Generator) -> tuple[Any, int]:
    r = uniform_int(rng, big_r)
    try:
        return collection[index].nth_beyond(beyond, r), r
    except OverflowError:
        return Unmaterialised(index, beyond, r), r


# =============================================================================================
# Identification (Algorithms 4, 1, 2)
# =============================================================================================


@dataclass(frozen=True)
class _Identifier:
    k: Tuning = 8

    name = "identifier"
    paper = "000"
    private = True

    def horizon(self, n: int, collection: Collection) -> tuple[int, int]:
        """(K, K′) at sample size n."""
        big_k = _resolve(self.k, n, "k")
        return big_k, collection.horizon(big_k)

    def statistics(self, sample: Sequence[Any] | np.ndarray, collection: Collection) -> np.ndarray:
        """Error counts c_i = n·err_S(L_i), i ≤ K′."""
        n = len(sample)
        _, kp = self.horizon(n, collection)
        return error_counts(sample, collection, kp)

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        raise NotImplementedError

    def select(self, counts: np.ndarray, n: int, big_k: int,
               rng: np.random.Generator) -> tuple[int, dict[str, Any]]:
        raise NotImplementedError

    def run(self, sample: Sequence[Any] | np.ndarray, collection: Collection,
            rng: np.random.Generator) -> Selection:
        """Identify a language from the sample S (|S| = n).

        Privacy contract: see :meth:`guarantee` (replace-one neighbours, n public)."""
        n = _check_n(len(sample))
        big_k, kp = self.horizon(n, collection)
        counts = error_counts(sample, collection, kp)
        index, diag = self.select(counts, n, big_k, rng)
        diag.update({"error_counts": counts, "K": big_k, "K_prime": kp, "n": n})
        return Selection(collection[index], index, self.guarantee(n), None, diag)


def margins(counts: np.ndarray, n: int) -> np.ndarray:
    """g_i = min_{j<i}(e_j − e_i) with e = counts/n (g_1 = +∞), along the last axis."""
    e = np.asarray(counts, dtype=np.float64) / n
    prev = np.minimum.accumulate(e, axis=-1)
    g = np.empty_like(e)
    g[..., 0] = np.inf
    g[..., 1:] = prev[..., :-1] - e[..., 1:]
    return g


@dataclass(frozen=True)
class MarginIdentifier(_Identifier):
    """000 Algorithm 4 (HP, Appendix C): the largest i ≤ K′ whose empirical risk beats every
    predecessor by the margin 1/K: F = {i : ∀j < i, e_j − e_i ≥ 1/K}; return L_{max F}.

    Privacy contract: NOT private (ε = ∞): the margin test is discontinuous in the data."""

    name = "margin"
    private = False
    shift_invariant = True  # the law depends on the error counts only through differences

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        return Guarantee.non_private("margin-identifier (000 Alg 4, non-private)", UNIT, ADJACENCY)

    def passes(self, counts: np.ndarray, n: int, big_k: int) -> np.ndarray:
        """Margin test in exact integer arithmetic: (c_j − c_i)·K ≥ n for all j < i."""
        c = np.asarray(counts, dtype=np.int64)
        prev = np.minimum.accumulate(c, axis=-1)
        ok = np.ones(c.shape, dtype=bool)
        ok[..., 1:] = (prev[..., :-1] - c[..., 1:]) * big_k >= n
        return ok

    def index_from(self, counts: np.ndarray, n: int, big_k: int) -> np.ndarray:
        ok = self.passes(counts, n, big_k)
        kp = ok.shape[-1]
        return kp - np.argmax(ok[..., ::-1], axis=-1)  # 1-based largest passing index

    def log_law(self, counts: np.ndarray, n: int, big_k: int) -> np.ndarray:
        idx = self.index_from(counts, n, big_k)
        kp = np.asarray(counts).shape[-1]
        out = np.full((*np.shape(idx), kp), -np.inf)
        np.put_along_axis(out, (np.asarray(idx) - 1)[..., None], 0.0, axis=-1)
        return out

    def select(self, counts, n, big_k, rng):
        return int(self.index_from(counts, n, big_k)), {"margins": margins(counts, n)}


@dataclass(frozen=True)
class SoftMarginIdentifier(_Identifier):
    """000 Algorithm 1: exponential mechanism over soft-margin scores.

    s_i = i − (2K/γ)·max{0, γ − g_i} with margin γ = 1/K (so the coefficient is 2K²), score
    sensitivity Δ = 4K/(nγ) = 4K²/n (Lemma D.2); P(î = i) ∝ exp(ε s_i/(2Δ)).

    Privacy contract: ε-DP under replace-one neighbours (exponential mechanism, Lemma D.3)."""

    epsilon: float = 1.0
    margin: Tuning | None = None  # γ; default 1/K

    name = "soft-margin"
    shift_invariant = True  # the law depends on the error counts only through differences

    def __post_init__(self) -> None:
        _check_finite_epsilon(self.epsilon)

    def gamma(self, big_k: int) -> float:
        if self.margin is None:
            return 1.0 / big_k
        return _resolve(self.margin, big_k, "margin", integer=False)

    def sensitivity(self, n: int, big_k: int) -> float:
        """Δ = 4K/(nγ) (= 4K²/n for γ = 1/K)."""
        return 4.0 * big_k / (n * self.gamma(big_k))

    def scores(self, counts: np.ndarray, n: int, big_k: int) -> np.ndarray:
        gam = self.gamma(big_k)
        deficit = np.maximum(0.0, gam - margins(counts, n))
        kp = np.asarray(counts).shape[-1]
        return np.arange(1, kp + 1, dtype=np.float64) - (2.0 * big_k / gam) * deficit

    def log_law(self, counts: np.ndarray, n: int, big_k: int) -> np.ndarray:
        return _em_log_law(self.scores(counts, n, big_k), self.sensitivity(n, big_k),
                           self.epsilon)

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        return Guarantee.pure("soft-margin-identifier (000 Alg 1)", UNIT, ADJACENCY, self.epsilon,
                              details={"mechanism": "exponential"})

    def select(self, counts, n, big_k, rng):
        s = self.scores(counts, n, big_k)
        delta = self.sensitivity(n, big_k)
        i = exponential_mechanism(s, 2 * delta / self.epsilon, rng) + 1
        return i, {"scores": s, "sensitivity": delta,
                   "log_law": self.log_law(counts, n, big_k)}


@dataclass(frozen=True)
class GaussianMarginIdentifier(_Identifier):
    """000 Algorithm 2: release ẽ = e + N(0, σ² I_{K′}) with ℓ₂ sensitivity √K′/n, then the
    deterministic margin rule î = max{i : min_{j<i}(ẽ_j − ẽ_i) ≥ 1/K} (post-processing).

    Privacy contract: (ε, δ)-DP under replace-one neighbours — classical calibration for
    ε < 1, or ρ-zCDP with ρ = epsilon_to_rho(ε, δ) (``calibration="zcdp"``)."""

    epsilon: float = 0.5
    delta: float = 1e-6
    calibration: str = "classical"

    name = "gaussian-margin"
    shift_invariant = True  # the law depends on the error counts only through differences

    def __post_init__(self) -> None:
        gaussian_calibration(1.0, self.epsilon, self.delta, self.calibration)

    def sigma(self, n: int, kp: int) -> float:
        return gaussian_calibration(math.sqrt(kp) / n, self.epsilon, self.delta,
                                    self.calibration)[0]

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        return _gaussian_guarantee("gaussian-margin-identifier (000 Alg 2)", self.epsilon,
                                   self.delta, self.calibration)

    def index_from_noisy(self, noisy_errors: np.ndarray, big_k: int) -> np.ndarray:
        prev = np.minimum.accumulate(noisy_errors, axis=-1)
        ok = np.ones(noisy_errors.shape, dtype=bool)
        ok[..., 1:] = prev[..., :-1] - noisy_errors[..., 1:] >= 1.0 / big_k
        kp = ok.shape[-1]
        return kp - np.argmax(ok[..., ::-1], axis=-1)

    def log_law(self, counts: np.ndarray, n: int, big_k: int) -> np.ndarray:
        """Exact for K′ ≤ 2: P(î = 2) = Φ((e_1 − e_2 − 1/K)/(σ√2))."""
        c = np.asarray(counts, dtype=np.float64)
        kp = c.shape[-1]
        if kp == 1:
            return np.zeros(c.shape)
        if kp != 2:
            raise NotImplementedError("the margin rule's law has no closed form for K′ > 2; "
                                      "use evaluation.monte_carlo")
        s = self.sigma(n, kp) * math.sqrt(2)
        z = ((c[..., 0] - c[..., 1]) / n - 1.0 / big_k) / s
        return np.stack([norm.logsf(z), norm.logcdf(z)], axis=-1)

    def select(self, counts, n, big_k, rng):
        kp = len(counts)
        sig = self.sigma(n, kp)
        noisy = counts / n + np.asarray(gaussian(sig, rng, size=kp))
        diag: dict[str, Any] = {"sigma": sig, "noisy_errors": noisy}
        if kp <= 2:
            diag["log_law"] = self.log_law(counts, n, big_k)
        return int(self.index_from_noisy(noisy, big_k)), diag


# =============================================================================================
# Generation (Algorithms 5, 3, 6, 7)
# =============================================================================================


@dataclass(frozen=True)
class _Generator:
    k: Tuning = 2
    big_r: Tuning = TimesPow2(64)

    name = "generator"
    paper = "000"
    private = True

    def horizon(self, n: int, collection: Collection) -> tuple[int, int]:
        big_k = _resolve(self.k, n, "k")
        return big_k, collection.horizon(big_k)

    def pool(self, n: int) -> int:
        """R(n): the output is uniform among the first R members beyond the window."""
        r = self.big_r(n) if callable(self.big_r) else self.big_r
        if isinstance(r, float):
            if not r.is_integer():
                raise ValueError(f"R({n}) = {r} is not an integer")
            r = int(r)
        if r < n:
            raise ValueError(f"R must be >= n (R({n}) = {r})")
        return int(r)

    def window(self, n: int) -> int:
        raise NotImplementedError

    def statistics(self, sample: Sequence[Any] | np.ndarray, collection: Collection) -> np.ndarray:
        return multiplicities(sample, collection, self.window(len(sample)))

    def membership(self, collection: Collection, n: int) -> np.ndarray:
        _, kp = self.horizon(n, collection)
        return _membership(collection, kp, self.window(n))


def _min_counts(counts: np.ndarray, memb: np.ndarray) -> np.ndarray:
    """c_i = min_{j ∈ J_i} N_j (+∞ for empty J_i), vectorised: (..., W) × (K, W) → (..., K)."""
    n = np.asarray(counts, dtype=np.float64)[..., None, :]
    masked = np.where(memb, n, np.inf)
    return masked.min(axis=-1)


def _running_min_counts(counts: np.ndarray, memb: np.ndarray) -> np.ndarray:
    """c_{i,m} = min{N_j : j ≤ m, u_j ∈ L_i}: (..., W) × (K, W) → (..., K, W)."""
    n = np.asarray(counts, dtype=np.float64)[..., None, :]
    masked = np.where(memb, n, np.inf)
    return np.minimum.accumulate(masked, axis=-1)


@dataclass(frozen=True)
class PointerGenerator(_Generator):
    """000 Algorithm 5 (HP pointer rule, Appendix C): p_i = the first position j with
    u_j ∈ L_i ∖ S; î = argmax_i p_i (ties: smallest index); output u_{p_î}.

    Privacy contract: NOT private (ε = ∞): removing the only copy of a string can reset a
    pointer arbitrarily far."""

    name = "pointer"
    private = False

    def window(self, n: int) -> int:
        return 0

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        return Guarantee.non_private("pointer-generator (000 Alg 5, non-private)", UNIT, ADJACENCY)

    def pointers(self, sample: Sequence[Any] | np.ndarray, collection: Collection,
                 kp: int) -> list[int]:
        seen = {element_key(x) for x in np.asarray(sample).tolist()}
        out = []
        for lang in collection.first(kp):
            r = 1
            while True:
                x = lang.nth(r)
                if x not in seen:
                    out.append(lang.universe.index(x))
                    break
                r += 1
        return out

    def run(self, sample: Sequence[Any] | np.ndarray, collection: Collection,
            rng: np.random.Generator) -> Selection:
        """Output a string of the language whose pointer advanced farthest (not private)."""
        n = _check_n(len(sample))
        big_k, kp = self.horizon(n, collection)
        _check_infinite(collection, kp)
        ptr = self.pointers(sample, collection, kp)
        index = int(np.argmax(ptr)) + 1
        out = collection.universe.at(ptr[index - 1])
        return Selection(out, index, self.guarantee(n), None,
                         {"pointers": ptr, "K": big_k, "K_prime": kp, "n": n})


@dataclass(frozen=True)
class PrefixCountGenerator(_Generator):
    """000 Algorithm 3 (public witness bound M): c_i = min_{j ≤ M, u_j ∈ L_i} N_j,
    s_i = −max{0, τ − c_i} (sensitivity 1), P(î = i) ∝ exp(ε s_i / 2); output the r-th member of
    L_î beyond position M with r ~ Unif{1..R} (public randomness).

    Privacy contract: ε-DP under replace-one neighbours (exponential mechanism with Δ = 1; the
    output step is post-processing with public randomness)."""

    epsilon: float = 1.0
    tau: Tuning = Linear(1 / 16)
    big_m: Tuning = 3

    name = "prefix-count"

    def __post_init__(self) -> None:
        _check_finite_epsilon(self.epsilon)

    def window(self, n: int) -> int:
        return _resolve(self.big_m, n, "M")

    def threshold_tau(self, n: int) -> float:
        return _resolve(self.tau, n, "tau", integer=False)

    def sensitivity(self, n: int) -> float:
        return 1.0

    def temperature(self, n: int) -> float:
        """2Δ/ε."""
        return 2.0 * self.sensitivity(n) / self.epsilon

    def scores(self, counts: np.ndarray, memb: np.ndarray, n: int) -> np.ndarray:
        c = _min_counts(counts, memb)
        return -np.maximum(0.0, self.threshold_tau(n) - c)

    def log_law(self, counts: np.ndarray, memb: np.ndarray, n: int) -> np.ndarray:
        return log_softmax(self.scores(counts, memb, n) / self.temperature(n), axis=-1)

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        return Guarantee.pure("prefix-count-generator (000 Alg 3)", UNIT, ADJACENCY, self.epsilon,
                              details={"mechanism": "exponential"})

    def run(self, sample: Sequence[Any] | np.ndarray, collection: Collection,
            rng: np.random.Generator) -> Selection:
        """Generate a string (Privacy contract: see :meth:`guarantee`)."""
        n = _check_n(len(sample))
        big_k, kp = self.horizon(n, collection)
        _check_infinite(collection, kp)
        big_m, big_r = self.window(n), self.pool(n)
        memb = self.membership(collection, n)
        counts = multiplicities(sample, collection, big_m)
        s = self.scores(counts, memb, n)
        index = exponential_mechanism(s, self.temperature(n), rng) + 1
        out, r = _draw_string(collection, index, big_m, big_r, rng)
        return Selection(out, index, self.guarantee(n), big_m, {
            "scores": s, "log_law": log_softmax(s / self.temperature(n)), "r": r, "R": big_r,
            "counts": counts, "K": big_k, "K_prime": kp, "n": n, "tau": self.threshold_tau(n)})


@dataclass(frozen=True)
class JointThresholdGenerator(_Generator):
    """000 Algorithm 6 (no public bound): pair scores on [K′]×[M̄],
    s_{i,m} = m − (M̄/τ)·max{0, τ − c_{i,m}} with c_{i,m} = min{N_j : j ≤ m, u_j ∈ L_i};
    sensitivity M̄/τ; P(î, m̂) ∝ exp(ε s/(2Δ)); output the r-th member of L_î beyond m̂.

    Privacy contract: ε-DP under replace-one neighbours."""

    epsilon: float = 1.0
    tau: Tuning = Linear(1 / 16)
    mbar: Tuning = 6

    name = "joint-threshold"

    def __post_init__(self) -> None:
        _check_finite_epsilon(self.epsilon)

    def window(self, n: int) -> int:
        return _resolve(self.mbar, n, "mbar")

    def threshold_tau(self, n: int) -> float:
        return _resolve(self.tau, n, "tau", integer=False)

    def sensitivity(self, n: int) -> float:
        return self.window(n) / self.threshold_tau(n)

    def scores(self, counts: np.ndarray, memb: np.ndarray, n: int) -> np.ndarray:
        """s[..., i, m] for i < K′, m < M̄ (0-based)."""
        mbar, tau = self.window(n), self.threshold_tau(n)
        c = _running_min_counts(counts, memb)
        m = np.arange(1, mbar + 1, dtype=np.float64)
        return m - (mbar / tau) * np.maximum(0.0, tau - c)

    def log_law(self, counts: np.ndarray, memb: np.ndarray, n: int) -> np.ndarray:
        """Exact log-law over the K′·M̄ pairs (flattened row-major: pair (i, m) at (i−1)·M̄ + m−1)."""
        s = self.scores(counts, memb, n)
        flat = s.reshape(*s.shape[:-2], -1)
        return _em_log_law(flat, self.sensitivity(n), self.epsilon)

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        return Guarantee.pure("joint-threshold-generator (000 Alg 6)", UNIT, ADJACENCY,
                              self.epsilon, details={"mechanism": "exponential"})

    def run(self, sample: Sequence[Any] | np.ndarray, collection: Collection,
            rng: np.random.Generator) -> Selection:
        """Generate a string (Privacy contract: see :meth:`guarantee`)."""
        n = _check_n(len(sample))
        big_k, kp = self.horizon(n, collection)
        _check_infinite(collection, kp)
        mbar, big_r = self.window(n), self.pool(n)
        memb = self.membership(collection, n)
        counts = multiplicities(sample, collection, mbar)
        s = self.scores(counts, memb, n)
        pair = exponential_mechanism(s.ravel(), 2 * self.sensitivity(n) / self.epsilon, rng)
        index, m_hat = divmod(pair, mbar)
        index, m_hat = index + 1, m_hat + 1
        out, r = _draw_string(collection, index, m_hat, big_r, rng)
        return Selection(out, index, self.guarantee(n), m_hat, {
            "scores": s, "log_law": _em_log_law(s.ravel(), self.sensitivity(n), self.epsilon),
            "r": r, "R": big_r, "counts": counts, "K": big_k, "K_prime": kp, "n": n,
            "sensitivity": self.sensitivity(n)})


@dataclass(frozen=True)
class GaussianThresholdGenerator(JointThresholdGenerator):
    """000 Algorithm 7: Algorithm 6's pair scores plus N(0, σ²) noise with ℓ₂ sensitivity
    √(K′M̄)·M̄/τ, then the argmax (post-processing); output beyond m̂.

    Privacy contract: (ε, δ)-DP under replace-one neighbours (classical calibration for ε < 1,
    or zCDP calibration)."""

    delta: float = 1e-6
    calibration: str = "classical"
    epsilon: float = 0.5

    name = "gaussian-threshold"

    def __post_init__(self) -> None:
        gaussian_calibration(1.0, self.epsilon, self.delta, self.calibration)

    def l2_sensitivity(self, n: int, kp: int) -> float:
        mbar = self.window(n)
        return math.sqrt(kp * mbar) * mbar / self.threshold_tau(n)

    def sigma(self, n: int, kp: int) -> float:
        return gaussian_calibration(self.l2_sensitivity(n, kp), self.epsilon, self.delta,
                                    self.calibration)[0]

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        return _gaussian_guarantee("gaussian-threshold-generator (000 Alg 7)", self.epsilon,
                                   self.delta, self.calibration)

    def log_law(self, counts: np.ndarray, memb: np.ndarray, n: int) -> np.ndarray:
        raise NotImplementedError("use evaluation.gaussian_argmax_log_law")

    def run(self, sample: Sequence[Any] | np.ndarray, collection: Collection,
            rng: np.random.Generator) -> Selection:
        """Generate a string (Privacy contract: see :meth:`guarantee`)."""
        n = _check_n(len(sample))
        big_k, kp = self.horizon(n, collection)
        _check_infinite(collection, kp)
        mbar, big_r = self.window(n), self.pool(n)
        memb = self.membership(collection, n)
        counts = multiplicities(sample, collection, mbar)
        s = self.scores(counts, memb, n)
        sig = self.sigma(n, kp)
        noisy = s + np.asarray(gaussian(sig, rng, size=s.shape))
        pair = int(np.argmax(noisy))
        index, m_hat = divmod(pair, mbar)
        index, m_hat = index + 1, m_hat + 1
        out, r = _draw_string(collection, index, m_hat, big_r, rng)
        return Selection(out, index, self.guarantee(n), m_hat, {
            "scores": s, "noisy_scores": noisy, "sigma": sig, "r": r, "R": big_r,
            "counts": counts, "K": big_k, "K_prime": kp, "n": n})


#: The algorithms of the statistical setting, registered (:mod:`dplang.formal.registry`).
_ENTRIES = tuple(register_algorithm(FormalAlgorithm(
    name, cls, paper, task, ("statistical",), private=private, gaussian=gaussian,
    theorem=theorem)) for name, cls, paper, task, private, gaussian, theorem in (
    ("margin", MarginIdentifier, "000·4", "identification", False, False, "HP's bound"),
    ("soft-margin", SoftMarginIdentifier, "000·1", "identification", True, False, "Thm 3.2"),
    ("gaussian-margin", GaussianMarginIdentifier, "000·2", "identification", True, True,
     "Thm 3.3"),
    ("pointer", PointerGenerator, "000·5", "generation", False, False, "HP's bound"),
    ("prefix-count", PrefixCountGenerator, "000·3", "generation", True, False, "Thm 4.5"),
    ("joint-threshold", JointThresholdGenerator, "000·6", "generation", True, False, "Thm 4.6"),
    ("gaussian-threshold", GaussianThresholdGenerator, "000·7", "generation", True, True,
     "Thm 4.9"),
))

#: name → (class, paper algorithm number, task), from the registry (kept for earlier imports).
ALGORITHMS: dict[str, tuple[type, str, str]] = {e.name: (e.cls, e.paper, e.task)
                                               for e in _ENTRIES}

"""Private samplers for product distributions on {0,1}^d (Raskhodnikova et al. 2021, Theorems
1.6 and 1.8, and baselines; ``docs/sampling.md``, "Samplers").

* :class:`ClippedMeanSampler` — Theorem 1.8's sampler for biases in [1/3, 2/3]: per coordinate,
  the empirical mean clipped to [1/4, 3/4], then an independent coin. No noise is added; its
  privacy is a function of n: exactly ``ε₁(n) ≤ ln(1 + 4/n)`` per coordinate (equality when
  4 | n), composed over d coordinates by zCDP (via pure DP or bounded range), advanced
  composition, or basic composition.
* :class:`BucketedProductSampler` — the general product sampler of Theorem 1.6 (a
  reconstruction: the paper's supplement with the constants is not available): orientation,
  bucketing of the biases into geometric classes, and truncated noisy column sums with
  Gaussian noise scaled to each bucket; ρ-zCDP by parallel composition over three disjoint
  position blocks. All tunable constants are constructor arguments.
* :class:`PerCoordinateLaplaceSampler`, :class:`GaussianMarginalSampler` — noisy means with
  noise calibrated to the whole mean vector (L1 sensitivity d/n, L2 sensitivity √d/n),
  clipped to [0, 1], then independent coins.

The rows the bucketed sampler reads (dense or :class:`SparseBinaryRows`) are in
:mod:`dplang.sampling._rows`, the exact marginal laws in :mod:`dplang.sampling._productlaw`.

A replaced record changes every coordinate's column at once, which is why per-coordinate
guarantees compose over d. Output laws: for the clipped-mean and marginal samplers each output
bit depends only on its own column and its own noise, so under a product P the law Q is itself
a product, with marginals computable exactly by binomial sums (:meth:`exact_marginals`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..privacy.accounting import (
    bounded_range_to_zcdp,
    epsilon_to_rho,
    pure_to_zcdp,
)
from ..privacy.guarantees import Guarantee
from ..privacy.mechanisms import gaussian_noisy_sum, laplace_noisy_sum
from ._productlaw import binomial_expectation, clipped_gaussian_mean, clipped_laplace_mean
from ._rows import SparseBinaryRows, _Rows
from .base import (
    ADJACENCY,
    UNIT,
    SampleResult,
    as_binary_matrix,
    check_delta,
    check_epsilon,
    check_n,
)

__all__ = [
    "BucketPlan",
    "BucketedProductSampler",
    "ClippedMeanSampler",
    "GaussianMarginalSampler",
    "PerCoordinateLaplaceSampler",
    "SparseBinaryRows",
    "binomial_expectation",
    "clipped_gaussian_mean",
    "clipped_laplace_mean",
]


def _draw_bits(biases: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return (rng.random(biases.shape[0]) < biases).astype(np.int64)[None, :]


class _ProductSampler:
    kind = "product"
    symmetric = True
    name = "product-sampler"

    def conditional_law(self, x: np.ndarray) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def sample(self, x: np.ndarray, rng: np.random.Generator) -> SampleResult:
        """Release one vector in {0,1}^d (shape (1, d)) and the guarantee for (n, d)."""
        arr = as_binary_matrix(x)
        biases = self.output_law(arr, rng)
        return SampleResult(_draw_bits(biases, rng), self.guarantee(*arr.shape))

    def output_law(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Biases of the product law of the output given the data and the internal noise."""
        return self.conditional_law(x)


# --------------------------------------------------------------------------------------------
# A2: clipped mean


class ClippedMeanSampler(_ProductSampler):
    """Bounded-bias product sampler (Theorem 1.8): y_j ~ Ber(clip(p̂_j, lo, hi)).

    Privacy contract (replace-one): each coordinate is pure ε₁(n)-DP with ε₁ exactly given by
    :meth:`epsilon_per_coordinate` (≤ ln(1 + 4/n) ≤ 4/n for the default [1/4, 3/4]). Over d
    coordinates, :meth:`guarantee` composes by ``accountant``:

    * ``"basic"``: pure d·ε₁;
    * ``"advanced"``: (ε₁√(2d ln(1/δ)) + dε₁(e^{ε₁} − 1), δ) (Dwork–Rothblum–Vadhan);
    * ``"zcdp"``: ρ = d·min(ε₁²/2, η₁²/8) with η₁ the exact bounded-range width of one
      coordinate (ε-DP ⇒ ε²/2-zCDP, Bun–Steinke; η-bounded range ⇒ η²/8-zCDP,
      Cesar–Rogers), converted to (ε, δ) with the tight CKS conversion;
    * ``"best"`` (default): the smallest ε of the three.

    d = 1 needs no δ (pure ε₁). The sampler takes no ε: to reach a target ε choose n (the CLI
    refuses when the data are too few). Accurate only for biases in [1/3, 2/3]:
    d_TV(Q, P) ≤ Σ_j |E[clip(p̂_j)] − p_j| ≤ (d/2)·e^{−n/72} there; inaccurate near 0 or 1.
    """

    name = "clipped-mean-sampler"

    def __init__(self, lo: float = 0.25, hi: float = 0.75, delta: float | None = None,
                 accountant: str = "best") -> None:
        if not 0 < lo < hi < 1:
            raise ValueError(f"need 0 < lo < hi < 1, got lo={lo}, hi={hi}")
        if accountant not in ("best", "zcdp", "advanced", "basic"):
            raise ValueError(f"unknown accountant {accountant!r}")
        self.lo, self.hi = float(lo), float(hi)
        self.delta = None if delta is None else check_delta(delta)
        self.accountant = accountant

    def _clip_values(self, n: int) -> np.ndarray:
        t = np.arange(n + 1, dtype=np.float64)
        return np.clip(t / n, self.lo, self.hi)

    def _log_ratios(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        q = self._clip_values(check_n(n))
        up = np.log1p((q[1:] - q[:-1]) / q[:-1])          # log q(t+1)/q(t)   ≥ 0
        down = np.log1p((q[1:] - q[:-1]) / (1.0 - q[1:]))  # log (1−q(t))/(1−q(t+1)) ≥ 0
        return up, down

    def epsilon_per_coordinate(self, n: int) -> float:
        """Exact pure-DP ε of one coordinate: max over t of the two log-ratios between
        clip(t/n) and clip((t+1)/n). Equals ln(1 + 4/n) when 4 | n (default clip range)."""
        up, down = self._log_ratios(n)
        return float(max(up.max(), down.max()))

    def bounded_range_per_coordinate(self, n: int) -> float:
        """Exact bounded-range width of one coordinate: max_t (log-ratio of 1 + of 0)."""
        up, down = self._log_ratios(n)
        return float((up + down).max())

    def rho_per_coordinate(self, n: int) -> float:
        """zCDP of one coordinate: min(ε₁²/2, η₁²/8)."""
        e1 = self.epsilon_per_coordinate(n)
        if e1 == 0:
            return 0.0
        return min(pure_to_zcdp(e1), bounded_range_to_zcdp(self.bounded_range_per_coordinate(n)))

    def composed_epsilons(self, n: int, d: int, delta: float) -> dict[str, float]:
        """ε of the d-fold composition at δ under each accountant (``basic`` is pure)."""
        e1 = self.epsilon_per_coordinate(n)
        d = int(d)
        basic = d * e1
        advanced = e1 * math.sqrt(2 * d * math.log(1 / delta)) + d * e1 * math.expm1(e1)
        rho = d * self.rho_per_coordinate(n)
        zcdp = Guarantee.zcdp(self.name, UNIT, ADJACENCY, rho, delta).epsilon
        return {"basic": basic, "advanced": advanced, "zcdp": zcdp}

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        """The guarantee of one draw on n records of dimension d (see the class docstring)."""
        n = check_n(n)
        d = 1 if d is None else int(d)
        dl = self.delta
        e1 = self.epsilon_per_coordinate(n)
        details = {"d": d, "epsilon_per_coordinate": e1, "clip": [self.lo, self.hi]}
        if d == 1 or dl is None or self.accountant == "basic":
            return Guarantee.pure(self.name, UNIT, ADJACENCY, d * e1,
                                  details={"accountant": "basic", **details})
        eps = self.composed_epsilons(n, d, dl)
        choice = self.accountant
        if choice == "best":
            choice = min(eps, key=lambda a: eps[a])
        details["epsilon_by_accountant"] = eps
        if choice == "basic":
            return Guarantee.pure(self.name, UNIT, ADJACENCY, eps["basic"],
                                  details={"accountant": "basic", **details})
        if choice == "advanced":
            return Guarantee.approximate(self.name, UNIT, ADJACENCY, eps["advanced"], dl,
                                         details={"accountant": "advanced", **details})
        rho = d * self.rho_per_coordinate(n)
        return Guarantee.zcdp(self.name, UNIT, ADJACENCY, rho, dl, epsilon=eps["zcdp"],
                              details={"accountant": "zcdp", **details})

    def conditional_law(self, x: np.ndarray) -> np.ndarray:
        """The output law given the data is the product with biases clip(p̂_j, lo, hi)."""
        arr = as_binary_matrix(x)
        return np.clip(arr.mean(axis=0), self.lo, self.hi)

    def exact_marginals(self, n: int, p: np.ndarray) -> np.ndarray:
        """Q_j(1) = E[clip(Bin(n, p_j)/n, lo, hi)] (Q is the product of these)."""
        return binomial_expectation(check_n(n), p, lambda m: np.clip(m, self.lo, self.hi))

    def worst_case_bias(self, n: int, lo_bias: float = 1 / 3) -> float:
        """max over p ∈ [lo_bias, 1 − lo_bias] of |E[clip(p̂)] − p|, attained at the end points
        (E[clip(p̂)] − p is decreasing in p: stochastic monotonicity of the binomial)."""
        q = self.exact_marginals(n, np.array([lo_bias, 1 - lo_bias]))
        return float(max(abs(q[0] - lo_bias), abs(q[1] - (1 - lo_bias))))

    @staticmethod
    def tv_bound(n: int, d: int) -> float:
        """Hoeffding bound (d/2)·e^{−n/72} on d_TV for biases in [1/3, 2/3] (Theorem 1.8)."""
        return 0.5 * d * math.exp(-check_n(n) / 72.0)


# --------------------------------------------------------------------------------------------
# Marginal baselines


class PerCoordinateLaplaceSampler(_ProductSampler):
    """Noisy means p̃_j = clip(p̂_j + Lap(d/(nε)), 0, 1), then y_j ~ Ber(p̃_j).

    Privacy contract: pure ε-DP under replace-one adjacency — one call of
    :func:`~dplang.privacy.mechanisms.laplace_noisy_sum` with b = d/(nε) on the mean vector,
    whose L1 sensitivity is d/n; clipping and the coins are post-processing. Accuracy: Q is
    the product of E[clip(p̂_j + Z_j)], so d_TV ≤ Σ_j|Q_j − p_j| ≤ d·b/2 = d²/(2nε): needs
    n ≈ d²/(αε)."""

    name = "per-coordinate-laplace-sampler"

    def __init__(self, epsilon: float) -> None:
        self.epsilon = check_epsilon(epsilon)

    def noise_scale(self, n: int, d: int) -> float:
        return d / (check_n(n) * self.epsilon)

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        d = 1 if d is None else int(d)
        return Guarantee.pure(self.name, UNIT, ADJACENCY, self.epsilon,
                              details={"d": d, "noise_scale": self.noise_scale(n, d)})

    def output_law(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        arr = as_binary_matrix(x)
        n, d = arr.shape
        return np.clip(laplace_noisy_sum(arr.mean(axis=0), self.noise_scale(n, d), rng), 0, 1)

    def conditional_law(self, x: np.ndarray) -> np.ndarray:
        """Exact law given the data: the product with biases E[clip(p̂_j + Z_j, 0, 1)]."""
        arr = as_binary_matrix(x)
        return clipped_laplace_mean(arr.mean(axis=0), self.noise_scale(*arr.shape))

    def exact_marginals(self, n: int, p: np.ndarray) -> np.ndarray:
        b = self.noise_scale(n, len(p))
        return binomial_expectation(n, p, lambda m: clipped_laplace_mean(m, b))

    def tv_bound(self, n: int, d: int) -> float:
        """d·(d/(nε))/2."""
        return d * self.noise_scale(n, d) / 2.0


class GaussianMarginalSampler(_ProductSampler):
    """Noisy means p̃_j = clip(p̂_j + N(0, σ²), 0, 1) with σ = √d/(n√(2ρ)), ρ the largest zCDP
    budget that implies (ε, δ)-DP; then y_j ~ Ber(p̃_j).

    Privacy contract: ρ-zCDP (hence (ε, δ)-DP) under replace-one adjacency — one call of
    :func:`~dplang.privacy.mechanisms.gaussian_noisy_sum` on the mean vector, whose L2
    sensitivity is √d/n, with σ = √d/(n√(2ρ)). Accuracy: d_TV ≤ Σ_j|Q_j − p_j| ≤ d·σ/√(2π):
    n ≈ d^{1.5}/(α√ρ)."""

    name = "gaussian-marginal-sampler"

    def __init__(self, epsilon: float, delta: float) -> None:
        self.epsilon = check_epsilon(epsilon)
        self.delta = check_delta(delta)
        self.rho = epsilon_to_rho(self.epsilon, self.delta)

    def sigma(self, n: int, d: int) -> float:
        return math.sqrt(d) / (check_n(n) * math.sqrt(2 * self.rho))

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        d = 1 if d is None else int(d)
        return Guarantee.zcdp(self.name, UNIT, ADJACENCY, self.rho, self.delta,
                              epsilon=self.epsilon, details={"d": d, "sigma": self.sigma(n, d)})

    def output_law(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        arr = as_binary_matrix(x)
        n, d = arr.shape
        return np.clip(gaussian_noisy_sum(arr.mean(axis=0), self.sigma(n, d), rng), 0, 1)

    def conditional_law(self, x: np.ndarray) -> np.ndarray:
        arr = as_binary_matrix(x)
        return clipped_gaussian_mean(arr.mean(axis=0), self.sigma(*arr.shape))

    def exact_marginals(self, n: int, p: np.ndarray) -> np.ndarray:
        s = self.sigma(n, len(p))
        return binomial_expectation(n, p, lambda m: clipped_gaussian_mean(m, s))

    def tv_bound(self, n: int, d: int) -> float:
        """d·σ/√(2π)."""
        return d * self.sigma(n, d) / math.sqrt(2 * math.pi)


# --------------------------------------------------------------------------------------------
# A3: general product sampler (reconstruction)


@dataclass(frozen=True)
class BucketPlan:
    """What phases 0 and 1 of :class:`BucketedProductSampler` released (all DP outputs).

    ``flips``: coordinates that were flipped (estimated bias > 1/2). ``buckets``: the non-empty
    coordinate classes with their bias bound u_b (after flipping). ``blocks``: the row ranges
    (start, stop) of the orientation, bucketing and sampling blocks.

    Privacy contract: every field is a post-processing of the ρ-zCDP phases 0–1 (covered by
    the sampler's guarantee when used inside it); publishing a plan is a release of its own."""

    flips: np.ndarray
    buckets: tuple[tuple[np.ndarray, float], ...]
    blocks: tuple[tuple[int, int], ...]
    rounds: int
    details: dict[str, object] = field(default_factory=dict)


class BucketedProductSampler(_ProductSampler):
    """General product sampler (Theorem 1.6; its constants are reconstructed:
    ``docs/sampling.md``, "Reconstructions and choices").

    Rows are split by position into blocks X_O, X_B, X_S (fractions ``split``). With
    η = ln(8nd/α) and NOISYSUM(Y, T, ρ') = column sums of Y after zeroing every row with more
    than T ones, plus N(0, σ²) per column with σ = min(√(2T), √cols)/√(2ρ'):

    0. *orientation* on X_O: flip coordinate j when NOISYSUM(X_O, d, ρ)_j/|X_O| > 1/2;
    1. *bucketing* on R = ⌈log₂ d⌉ disjoint chunks of X_B: starting from A = [d], u = ``u0``,
       each round estimates the biases of A with T = ⌈2u|A| + c_T·η⌉ and budget ρ, moves
       H = {j : p̂_j > u/2} into a bucket with bound u, halves u; stops when u < 1/d; the rest
       form a last bucket with bound max(u, 1/d);
    2. *sampling* on X_S: each of the B buckets S gets a fresh NOISYSUM with
       T_b = ⌈2u_b|S| + c_T·η⌉ and budget ρ/B; p̃ = clip(sum/|X_S|, 0, 1); y_j ~ Ber(p̃_j),
       flipped back.

    Privacy contract: ρ-zCDP under replace-one adjacency, with ρ the largest budget implying
    (ε, δ)-DP (tight CKS conversion). Every NOISYSUM is one call of
    :func:`~dplang.privacy.mechanisms.gaussian_noisy_sum` (written once, :meth:`_noisy_sum`);
    each block is ρ-zCDP (phase 0: one Gaussian release;
    phase 1: one release per disjoint chunk — adaptive parallel composition; phase 2: B
    releases of ρ/B — sequential composition), and the blocks are disjoint and formed from
    positions alone, so the whole is ρ-zCDP. A replaced row moves each truncated column-sum
    vector by at most min(√(2T), √cols) in L2, which is what σ is calibrated to.

    Tunable constants: ``split``, ``c_T``, ``u0`` and ``alpha`` (which enters only η). The
    accuracy goal is n = Õ(d/(αε)); the error comes from clipping p̃ at 0 (the tiny bucket
    dominates) and from rare truncation or bucketing failures.
    """

    name = "bucketed-product-sampler"

    def __init__(self, epsilon: float, delta: float, alpha: float = 0.1,
                 split: tuple[float, float, float] = (0.25, 0.25, 0.5), c_T: float = 3.0,
                 u0: float = 0.75) -> None:
        self.epsilon = check_epsilon(epsilon)
        self.delta = check_delta(delta)
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        if len(split) != 3 or any(s < 0 for s in split) or not math.isclose(sum(split), 1.0) \
                or split[2] <= 0:
            raise ValueError(f"split must be three non-negative fractions summing to 1 with a "
                             f"positive sampling share, got {split}")
        if not c_T >= 0:
            raise ValueError(f"c_T must be >= 0, got {c_T}")
        if not 0 < u0 <= 1:
            raise ValueError(f"u0 must be in (0, 1], got {u0}")
        self.alpha = float(alpha)
        self.split = tuple(float(s) for s in split)
        self.c_T = float(c_T)
        self.u0 = float(u0)
        self.rho = epsilon_to_rho(self.epsilon, self.delta)

    # -- structure ---------------------------------------------------------------------------
    def blocks(self, n: int) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
        """Row ranges of X_O, X_B, X_S (by position; data-independent)."""
        n = check_n(n)
        n_o = math.floor(n * self.split[0])
        n_b = math.floor(n * self.split[1])
        if n - n_o - n_b < 1:
            raise ValueError(f"n = {n} leaves no rows for the sampling phase")
        return (0, n_o), (n_o, n_o + n_b), (n_o + n_b, n)

    def eta(self, n: int, d: int) -> float:
        """η = ln(8nd/α), the log factor in the truncation thresholds."""
        return math.log(8.0 * n * d / self.alpha)

    def threshold(self, u: float, cols: int, n: int, d: int) -> int:
        """T = ⌈2u·cols + c_T·η⌉."""
        return math.ceil(2.0 * u * cols + self.c_T * self.eta(n, d))

    @staticmethod
    def sigma(threshold: int, cols: int, rho: float) -> float:
        """Noise standard deviation (in count units) for a truncated column sum."""
        return min(math.sqrt(2.0 * threshold), math.sqrt(cols)) / math.sqrt(2.0 * rho)

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        """ρ-zCDP ⇒ (ε, δ)-DP, replace-one, ex ante (depends on nothing but the parameters)."""
        d = 1 if d is None else int(d)
        self.blocks(n)
        return Guarantee.zcdp(self.name, UNIT, ADJACENCY, self.rho, self.delta,
                              epsilon=self.epsilon,
                              details={"d": d, "alpha": self.alpha, "split": list(self.split),
                                       "c_T": self.c_T, "u0": self.u0, "eta": self.eta(n, d)})

    # -- the algorithm -----------------------------------------------------------------------
    def _noisy_sum(self, rows: _Rows, start: int, stop: int, cols: np.ndarray,
                   flips: np.ndarray, threshold: int, rho: float,
                   rng: np.random.Generator) -> np.ndarray:
        """NOISYSUM on rows [start, stop), columns ``cols``, after flipping ``flips``: the
        truncated column sums (ℓ2 sensitivity ≤ min(√(2T), √cols) under replace-one) through
        :func:`~dplang.privacy.mechanisms.gaussian_noisy_sum` with σ = :meth:`sigma`, i.e. a
        ρ-zCDP release."""
        sums = rows.truncated_sums(start, stop, cols, flips, threshold)
        return gaussian_noisy_sum(sums, self.sigma(threshold, cols.size, rho), rng)

    def plan(self, x: np.ndarray | SparseBinaryRows, rng: np.random.Generator) -> BucketPlan:
        """Phases 0 and 1 (orientation and bucketing) on blocks X_O and X_B.

        ``x`` is an (n, d) 0/1 array or a :class:`SparseBinaryRows` (same result, same draws
        from ``rng``)."""
        rows = _Rows(x)
        n, d = rows.shape
        (o0, o1), (b0, b1), s_block = self.blocks(n)
        everything = np.arange(d)
        flips = np.zeros(d, dtype=bool)
        if o1 > o0:
            est = self._noisy_sum(rows, o0, o1, everything, flips, d, self.rho, rng) / (o1 - o0)
            flips = est > 0.5
        u = self.u0 if o1 > o0 else 1.0
        active = everything
        buckets: list[tuple[np.ndarray, float]] = []
        rounds = max(1, math.ceil(math.log2(d))) if d > 1 else 1
        rounds = min(rounds, b1 - b0)
        done = 0
        if rounds > 0:
            chunk = (b1 - b0) // rounds
            for r in range(rounds):
                if active.size == 0 or u < 1.0 / d:
                    break
                t_r = self.threshold(u, active.size, n, d)
                start = b0 + r * chunk
                est = self._noisy_sum(rows, start, start + chunk, active, flips, t_r, self.rho,
                                      rng) / chunk
                heavy = est > u / 2.0
                if heavy.any():
                    buckets.append((active[heavy], u))
                active = active[~heavy]
                u /= 2.0
                done += 1
        if active.size:
            buckets.append((active, max(u, 1.0 / d)))
        return BucketPlan(flips, tuple(buckets), ((o0, o1), (b0, b1), s_block), done)

    def phase2_parameters(self, plan: BucketPlan, n: int, d: int) -> list[tuple[int, float]]:
        """(T_b, σ_b) of each bucket in the sampling phase (σ in count units)."""
        rho_b = self.rho / len(plan.buckets)
        out = []
        for cols, u in plan.buckets:
            t_b = self.threshold(u, cols.size, n, d)
            out.append((t_b, self.sigma(t_b, cols.size, rho_b)))
        return out

    def output_law(self, x: np.ndarray | SparseBinaryRows,
                   rng: np.random.Generator) -> np.ndarray:
        """Biases of the output (a product law given the data and all noise)."""
        rows = _Rows(x)
        n, d = rows.shape
        plan = self.plan(x, rng)
        s0, s1 = plan.blocks[2]
        rho_b = self.rho / len(plan.buckets)
        biases = np.empty(d)
        for cols, u in plan.buckets:
            sums = self._noisy_sum(rows, s0, s1, cols, plan.flips,
                                   self.threshold(u, cols.size, n, d), rho_b, rng)
            biases[cols] = np.clip(sums / (s1 - s0), 0.0, 1.0)
        return np.where(plan.flips, 1.0 - biases, biases)

    def sample(self, x: np.ndarray | SparseBinaryRows,
               rng: np.random.Generator) -> SampleResult:
        """Release one vector in {0,1}^d (shape (1, d)) and the ρ-zCDP guarantee."""
        rows = _Rows(x)
        biases = self.output_law(x, rng)
        return SampleResult(_draw_bits(biases, rng), self.guarantee(*rows.shape))

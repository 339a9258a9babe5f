"""Baseline samplers: first record, random record, learn-then-sample (``docs/sampling.md``).

* :class:`FirstRecordSampler` — outputs ``x[0]``: exactly distributed as P, **not private**.
* :class:`RandomRecordSampler` — outputs a uniformly random record: exactly distributed as P and
  (0, 1/n)-DP — the reason the paper restricts to δ < 1/n (its §1; claim 17 of
  ``docs/sampling.md``).
* :class:`LearnThenSampleSampler` — a private *learner* (noisy histogram + a projection or a
  threshold) followed by one draw from what it learned. With the L1 projection it is exactly
  :class:`~dplang.sampling.kary.LaplaceHistogramSampler`; the Euclidean projection and the
  thresholded histogram are good learners whose sampling bias is different (larger).

The per-coordinate Laplace and Gaussian marginal baselines for products live in
:mod:`dplang.sampling.product`.
"""

from __future__ import annotations

import math

import numpy as np

from ..privacy.guarantees import Guarantee
from ..privacy.mechanisms import laplace_noisy_sum
from .base import ADJACENCY, UNIT, SampleResult, as_binary_matrix, as_kary, check_epsilon, check_n
from .kary import KarySampler, _draw, project_euclidean, project_l1

__all__ = ["FirstRecordSampler", "LearnThenSampleSampler", "RandomRecordSampler"]


def _records(x: np.ndarray, k: int | None) -> np.ndarray:
    if k is not None:
        return as_kary(x, k)
    return as_binary_matrix(x)


class FirstRecordSampler:
    """Output the first record. Q = P exactly; NOT differentially private.

    Privacy contract: none — replacing the first record changes the output with certainty.
    The returned guarantee says so: ε = ∞ and ``details["private"] = False``. Give ``k`` for
    k-ary data (1-D arrays); leave it None for binary vectors ((n, d) arrays)."""

    symmetric = False
    name = "first-record (non-private)"

    def __init__(self, k: int | None = None) -> None:
        self.k = None if k is None else int(k)
        self.kind = "kary" if k is not None else "product"

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        check_n(n)
        return Guarantee.non_private(self.name, UNIT, ADJACENCY)

    def conditional_law(self, x: np.ndarray) -> np.ndarray:
        """k-ary: the point mass at x[0]; binary: the biases x[0] (a point mass)."""
        arr = _records(x, self.k)
        if self.k is not None:
            out = np.zeros(self.k)
            out[int(arr[0])] = 1.0
            return out
        return arr[0].astype(np.float64)

    def output_law(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return self.conditional_law(x)

    def sample(self, x: np.ndarray, rng: np.random.Generator) -> SampleResult:
        arr = _records(x, self.k)
        return SampleResult(arr[:1].astype(np.int64), self.guarantee(arr.shape[0]))


class RandomRecordSampler:
    """Output a uniformly random record. Q = P exactly.

    Privacy contract: (0, 1/n)-DP under replace-one adjacency (the output laws on neighbours
    differ by 1/n in total variation) and no better pure ε: a record value present only in
    x can be output from x but not from x'. Meaningful only when 1/n is an acceptable δ,
    which the paper's regime (δ < 1/n) excludes."""

    name = "random-record"

    def __init__(self, k: int | None = None) -> None:
        self.k = None if k is None else int(k)
        self.kind = "kary" if k is not None else "product"
        self.symmetric = k is not None

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        n = check_n(n)
        if n == 1:  # the only record is output: not private at all
            return Guarantee.non_private(self.name, UNIT, ADJACENCY)
        return Guarantee.approximate(self.name, UNIT, ADJACENCY, 0.0, 1.0 / n,
                                     details={"note": "trivial: exactly distributed as P, "
                                              "delta = 1/n"})

    def conditional_law(self, x: np.ndarray) -> np.ndarray:
        """k-ary only: counts/n."""
        if self.k is None:
            raise NotImplementedError("the law of a random binary record is not a product")
        return self.exact_law_given_counts(np.bincount(as_kary(x, self.k), minlength=self.k))

    def exact_law_given_counts(self, counts: np.ndarray) -> np.ndarray:
        c = np.asarray(counts, dtype=np.float64)
        return c / c.sum()

    def batch_law_given_counts(self, counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        c = np.asarray(counts, dtype=np.float64)
        return c / c.sum(axis=1, keepdims=True)

    def output_law(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """k-ary: counts/n; binary: the biases of one uniformly chosen record."""
        arr = _records(x, self.k)
        if self.k is not None:
            return self.conditional_law(arr)
        return arr[int(rng.integers(0, arr.shape[0]))].astype(np.float64)

    def sample(self, x: np.ndarray, rng: np.random.Generator) -> SampleResult:
        arr = _records(x, self.k)
        i = int(rng.integers(0, arr.shape[0]))
        return SampleResult(arr[i:i + 1].astype(np.int64), self.guarantee(arr.shape[0]))


class LearnThenSampleSampler(KarySampler):
    """Learn P privately, then sample from the estimate (claim 16 of ``docs/sampling.md``).

    The learner adds Lap(2/ε) to the counts and turns v = noisy counts / n into a distribution:

    * ``projection="euclidean"``: Euclidean projection onto the simplex (a natural choice for a
      learner; not an L1 projection, so Theorem 1.4's accuracy argument does not apply);
    * ``projection="threshold"``: zero every noisy count below ``threshold`` (default
      (2/ε)·ln k), then clip and renormalise (a learner that suppresses absent elements);
    * ``projection="l1"``: clip and renormalise — identical to A1.

    Privacy contract: pure ε-DP under replace-one adjacency, for every projection — one call
    of :func:`~dplang.privacy.mechanisms.laplace_noisy_sum` (b = 2/ε) on a count vector of L1
    sensitivity 2, then post-processing.

    A learner that is α-accurate in TV with probability 1−α gives a 2α-accurate sampler
    (the paper's Definition 1.2); :meth:`learn` exposes the learner itself."""

    name = "learn-then-sample"

    def __init__(self, k: int, epsilon: float, projection: str = "euclidean",
                 threshold: float | None = None) -> None:
        super().__init__(k)
        self.epsilon = check_epsilon(epsilon)
        if projection not in ("euclidean", "threshold", "l1"):
            raise ValueError(f"projection must be euclidean, threshold or l1, got {projection!r}")
        self.projection = projection
        self.threshold = (2.0 / self.epsilon) * math.log(k) if threshold is None else float(
            threshold)

    @property
    def noise_scale(self) -> float:
        return 2.0 / self.epsilon

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        """Pure ε-DP, replace-one, whatever n."""
        check_n(n)
        return self._pure(self.epsilon, projection=self.projection,
                          threshold=self.threshold if self.projection == "threshold" else None,
                          noise_scale=self.noise_scale)

    def _estimate(self, noisy_counts: np.ndarray) -> np.ndarray:
        v = np.asarray(noisy_counts, dtype=np.float64)
        if self.projection == "threshold":
            v = np.where(v >= self.threshold, v, 0.0)
        return project_l1(v)

    def batch_law_given_counts(self, counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        c = np.asarray(counts, dtype=np.float64)
        noisy = laplace_noisy_sum(c, self.noise_scale, rng)  # ℓ1 sensitivity 2, scale 2/ε
        if self.projection == "euclidean":
            n = c.sum(axis=1, keepdims=True)  # n is public
            return project_euclidean(noisy / n)
        return self._estimate(noisy)

    def learn(self, x: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, Guarantee]:
        """The private learner alone: its distribution estimate and its guarantee."""
        arr = as_kary(x, self.k)
        return self.output_law(arr, rng), self.guarantee(arr.shape[0])

    def sample(self, x: np.ndarray, rng: np.random.Generator) -> SampleResult:
        arr = as_kary(x, self.k)
        law = self.output_law(arr, rng)
        return SampleResult(np.array([_draw(law, rng)], dtype=np.int64),
                            self.guarantee(arr.shape[0]))

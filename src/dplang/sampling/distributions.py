"""Test distributions used by the evaluation and the experiments (``docs/sampling.md``,
"Results: Table 1's rates").

k-ary distributions are probability vectors over {0, …, k−1}; product distributions are bias
vectors in [0, 1]^d. None of these reads private data.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "bernoulli_hard",
    "half_support",
    "lemma21_instance",
    "point_mass",
    "random_biases",
    "random_bounded_biases",
    "random_distribution",
    "spiky",
    "subset_product",
    "uniform",
]


def _check_k(k: int) -> int:
    if isinstance(k, bool) or int(k) != k or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    return int(k)


def uniform(k: int) -> np.ndarray:
    """The uniform distribution on [k]."""
    k = _check_k(k)
    return np.full(k, 1.0 / k)


def point_mass(k: int, at: int = 0) -> np.ndarray:
    """All mass on one element: nearly the worst case of the Laplace-histogram sampler (every
    other element is absent from the data), whose TV is then ≈ (k−1)/(εn)."""
    k = _check_k(k)
    p = np.zeros(k)
    p[at] = 1.0
    return p


def half_support(k: int) -> np.ndarray:
    """Uniform on the first ⌈k/2⌉ elements."""
    k = _check_k(k)
    m = (k + 1) // 2
    p = np.zeros(k)
    p[:m] = 1.0 / m
    return p


def spiky(k: int) -> np.ndarray:
    """0.9 on element 0 and 0.1 spread evenly over elements 1..⌊k/2⌋ (the k-ary experiments of
    ``docs/sampling.md``)."""
    k = _check_k(k)
    if k < 2:
        raise ValueError("spiky needs k >= 2")
    m = max(1, k // 2)
    p = np.zeros(k)
    p[0] = 0.9
    p[1:m + 1] += 0.1 / m
    return p


def lemma21_instance(k: int, alpha: float) -> np.ndarray:
    """The hard instance of Lemma 2.1 on the universe [2k+1] (0-based: 0..2k).

    Mass α*/k on each of the k elements of S* = {0, …, k−1}, none on {k, …, 2k−1}, and
    1 − α* on the special element 2k, with α* = 60α. Requires α ≤ 1/60 (else P is not a
    distribution) — the paper's lemma states α ≤ 0.02, an inconsistency (``docs/sampling.md``,
    "Errors in the paper")."""
    k = _check_k(k)
    if not 0 < alpha <= 1 / 60:
        raise ValueError(
            f"the Lemma 2.1 instance needs 0 < alpha <= 1/60 (so that 60·alpha <= 1), got "
            f"{alpha}; the paper's range alpha <= 0.02 is inconsistent with its own instance"
        )
    a_star = 60.0 * alpha
    p = np.zeros(2 * k + 1)
    p[:k] = a_star / k
    p[2 * k] = 1.0 - a_star
    return p


def bernoulli_hard(alpha: float) -> np.ndarray:
    """Ber(10α) as a distribution on {0, 1}: the k = 2 lower-bound instance (Theorem 1.7)."""
    if not 0 < alpha <= 0.1:
        raise ValueError(f"bernoulli_hard needs 0 < alpha <= 0.1, got {alpha}")
    return np.array([1.0 - 10.0 * alpha, 10.0 * alpha])


def random_distribution(k: int, rng: np.random.Generator, concentration: float = 1.0
                        ) -> np.ndarray:
    """A Dirichlet(concentration·1) random distribution on [k]."""
    return rng.dirichlet(np.full(_check_k(k), float(concentration)))


def subset_product(k: int) -> np.ndarray:
    """Theorem 1.7's instance in dimension d = 2k: bias 1/k on the first k coordinates, 0 on
    the other k."""
    k = _check_k(k)
    p = np.zeros(2 * k)
    p[:k] = 1.0 / k
    return p


def random_bounded_biases(d: int, rng: np.random.Generator) -> np.ndarray:
    """Biases drawn uniformly from [1/3, 2/3] (the bounded-bias class)."""
    return rng.uniform(1 / 3, 2 / 3, size=_check_k(d))


def random_biases(d: int, rng: np.random.Generator) -> np.ndarray:
    """Biases drawn uniformly from [0, 1]."""
    return rng.uniform(0.0, 1.0, size=_check_k(d))

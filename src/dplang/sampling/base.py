"""Shared pieces of the private samplers: results, input checks, repeated sampling.

Setting (Raskhodnikova et al. 2021, §1). A *sampler* reads a dataset ``x`` of ``n`` records drawn
i.i.d. from an unknown distribution P and outputs **one** record whose law Q (over the data *and*
the sampler's coins) should be close to P in total variation. Records are

* *k-ary*: integers in ``{0, …, k−1}`` (the paper's ``[k]``, shifted to 0-based labels), a
  dataset is a 1-D integer array of length n;
* *binary vectors* in ``{0,1}^d``: a dataset is an ``(n, d)`` array of 0/1.

Privacy is always with respect to **replace-one** adjacency (one record replaced by any other,
n fixed and public), the paper's notion. Every sampler returns its samples together with a
:class:`~dplang.privacy.guarantees.Guarantee` that is fixed before the data is read (it may
depend on the public n, k, d and the parameters, never on the records).

Repeated sampling (:func:`sample_repeated`). ``m`` samples are drawn either from ``m``
**disjoint blocks of consecutive positions** (block ``i`` = records ``i·⌊n/m⌋ … (i+1)·⌊n/m⌋−1``,
the remainder unused) — a partition that depends only on positions, so the guarantee is the
*parallel* composition, i.e. the guarantee of one draw on ``⌊n/m⌋`` records — or, with
``split=False``, each from the whole dataset with fresh coins, composed *sequentially*.
Draw ``i`` uses its own random stream ``RandomStreams(seed).generator(i)`` (``docs/privacy.md``
invariant 5).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..privacy.accounting import compose_parallel, compose_sequential
from ..privacy.guarantees import Guarantee
from ..privacy.randomness import RandomStreams

__all__ = [
    "ADJACENCY",
    "UNIT",
    "RepeatedSample",
    "SampleResult",
    "Sampler",
    "as_binary_matrix",
    "as_kary",
    "block_slices",
    "sample_repeated",
]

UNIT = "record"
ADJACENCY = "replace-one"


@dataclass(frozen=True)
class SampleResult:
    """Samples and the guarantee they were released under.

    ``samples`` has shape ``(m,)`` (k-ary) or ``(m, d)`` (binary vectors). The object unpacks
    as a pair: ``samples, guarantee = sampler.sample(x, rng)``.
    """

    samples: np.ndarray
    guarantee: Guarantee

    def __iter__(self) -> Iterator[Any]:
        yield self.samples
        yield self.guarantee


@runtime_checkable
class Sampler(Protocol):
    """What every sampler offers.

    ``kind`` is ``"kary"`` or ``"product"``. ``guarantee(n, d)`` is the ex-ante privacy
    guarantee of one draw on ``n`` records (``d`` only for products; ``n`` is required: the
    signature is :class:`~dplang.privacy.guarantees.GuaranteeSource`'s). ``sample(x, rng)``
    releases one draw and that guarantee. ``output_law(x, rng)`` returns the law of the output
    given the data and one draw of the sampler's internal noise (a probability vector of length
    k, or the ``d`` biases of a product law); averaging it over noise and data gives Q
    (Rao–Blackwellised evaluation).
    """

    kind: str

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee: ...

    def sample(self, x: np.ndarray, rng: np.random.Generator) -> SampleResult: ...

    def output_law(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray: ...


# --------------------------------------------------------------------------------------------
# Input checks


def as_kary(x: Any, k: int) -> np.ndarray:
    """Validate a k-ary dataset: a non-empty 1-D array of integers in ``[0, k)``.

    Raises ValueError otherwise. Returns an int64 array (a copy only when a conversion is
    needed). Privacy contract: input validation only (releases nothing)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"a k-ary dataset must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("the dataset is empty")
    if arr.dtype == np.bool_:
        arr = arr.astype(np.int64)
    if not np.issubdtype(arr.dtype, np.integer):
        if np.issubdtype(arr.dtype, np.floating) and np.all(np.isfinite(arr)) and np.all(
            arr == np.round(arr)
        ):
            arr = arr.astype(np.int64)
        else:
            raise ValueError(f"k-ary records must be integers, got dtype {arr.dtype}")
    if arr.min() < 0 or arr.max() >= k:
        raise ValueError(f"k-ary records must lie in [0, {k}), got range [{arr.min()}, "
                         f"{arr.max()}]")
    return arr.astype(np.int64, copy=False)


def as_binary_matrix(x: Any, d: int | None = None) -> np.ndarray:
    """Validate a dataset of binary vectors: a non-empty ``(n, d)`` array of 0/1 entries.

    A 1-D array is read as ``n`` records of dimension 1. Raises ValueError otherwise; returns
    a uint8 array. Privacy contract: input validation only (releases nothing)."""
    arr = np.asarray(x)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2:
        raise ValueError(f"a binary dataset must be an (n, d) array, got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise ValueError("the dataset is empty")
    if arr.shape[1] == 0:
        raise ValueError("records have dimension 0")
    if d is not None and arr.shape[1] != d:
        raise ValueError(f"records must have dimension {d}, got {arr.shape[1]}")
    if arr.dtype != np.bool_ and not np.all((arr == 0) | (arr == 1)):
        raise ValueError("binary records must have entries in {0, 1}")
    return arr.astype(np.uint8, copy=False)


def check_epsilon(epsilon: float) -> float:
    """ε must be finite and > 0. (Parameter check; no privacy contract needed.)"""
    e = float(epsilon)
    if not (e > 0 and np.isfinite(e)):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon}")
    return e


def check_delta(delta: float) -> float:
    """δ must lie in (0, 1). (Parameter check; no privacy contract needed.)"""
    dl = float(delta)
    if not 0 < dl < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    return dl


def check_n(n: int | None) -> int:
    """n must be a positive integer. (Parameter check; no privacy contract needed.)"""
    if n is None or isinstance(n, bool) or int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    return int(n)


# --------------------------------------------------------------------------------------------
# Repeated sampling on disjoint, position-based blocks


def block_slices(n: int, m: int) -> list[slice]:
    """The ``m`` disjoint blocks of ``⌊n/m⌋`` consecutive positions (remainder unused).

    Depends only on (n, m): a data-independent partition, so parallel composition applies."""
    n = check_n(n)
    if isinstance(m, bool) or int(m) != m or m < 1:
        raise ValueError(f"the number of samples must be a positive integer, got {m!r}")
    size = n // m
    if size < 1:
        raise ValueError(f"cannot form {m} disjoint non-empty blocks from {n} records")
    return [slice(i * size, (i + 1) * size) for i in range(m)]


@dataclass(frozen=True)
class RepeatedSample:
    """``m`` samples, the overall guarantee, and the per-draw guarantees and blocks."""

    samples: np.ndarray
    guarantee: Guarantee
    per_draw: tuple[Guarantee, ...]
    blocks: tuple[tuple[int, int], ...]
    split: bool

    def __iter__(self) -> Iterator[Any]:
        yield self.samples
        yield self.guarantee


def sample_repeated(
    sampler: Sampler,
    x: np.ndarray,
    m: int,
    streams: RandomStreams,
    split: bool = True,
    delta: float | None = None,
) -> RepeatedSample:
    """Release ``m`` samples.

    Privacy contract: with ``split=True`` (default) draw ``i`` reads only block ``i`` of
    :func:`block_slices` — disjoint, formed from positions alone — so the release has the
    guarantee of a single draw on ``⌊n/m⌋`` records (parallel composition). With
    ``split=False`` every draw reads all ``n`` records and the guarantees compose sequentially
    (pure ε add up; zCDP ρ add up and are converted at ``delta``, default the largest δ).
    """
    arr = np.asarray(x)
    n = arr.shape[0]
    if split:
        slices = block_slices(n, m)
    else:
        if isinstance(m, bool) or int(m) != m or m < 1:
            raise ValueError(f"the number of samples must be a positive integer, got {m!r}")
        slices = [slice(0, n)] * int(m)
    outs = []
    guarantees = []
    for i, sl in enumerate(slices):
        res = sampler.sample(arr[sl], streams.generator(i))
        outs.append(res.samples)
        guarantees.append(res.guarantee)
    samples = np.concatenate(outs, axis=0)
    if split:
        overall = compose_parallel(guarantees, mechanism=guarantees[0].mechanism)
    else:
        overall = compose_sequential(guarantees, delta=delta, mechanism=guarantees[0].mechanism)
    blocks = tuple((sl.start, sl.stop) for sl in slices)
    return RepeatedSample(samples, overall, tuple(guarantees), blocks, split)

"""Streams x_1, x_2, … for the limit setting (spec 001 §1.2, §5.3).

The limit algorithms only look at the stream at sparse update times (k⁶, 2ˢ, 2ᵗ + d), and
only through a few statistics of the prefix x_{1:t}:

* ``error_count(L, t)`` = #{r ≤ t : x_r ∉ L} (001 Algorithms 1–3),
* ``multiplicity(u, t)`` = #{r ≤ t : x_r = u} (tell-tale counts of Algorithm 3),
* ``count_superset(masks…)``-style quantities are built from ``prefix`` for short horizons.

Every stream answers these in closed form (or from sufficient statistics), so the fast-forward
runner of :mod:`dplang.formal.limit` reaches t ≈ 10⁹ without materialising the prefix; ``prefix``
and ``element`` serve the step-level runner and the tests, which check both paths agree.

Adversarial enumerations of a target K (duplicate-free unless stated):
:class:`CanonicalEnumeration`, :class:`BlockShuffle`, :class:`IntersectionFirst`,
:class:`LateTelltale`; out-of-model probes: :class:`DuplicateHeavy` (001 erratum E2);
i.i.d. streams: :class:`IIDStream` (draws from a distribution; counts by sequential binomials
beyond a materialised prefix); :class:`ExplicitStream` (a finite list, e.g. ``--data`` or
crafted neighbours) and :class:`SubstitutedStream` (replace one x_τ — the neighbour relation of
continual release, Def. 5).

Algorithms never validate streams (privacy must hold for every stream, Def. 5);
:func:`check_stream` is the harness's precondition check and returns warnings.

Privacy contract: none — streams are inputs; this module only reads them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..privacy.randomness import RandomStreams
from .distributions import Distribution
from .languages import Language, element_key
from .universe import Universe

__all__ = [
    "BlockShuffle",
    "CanonicalEnumeration",
    "DuplicateHeavy",
    "ExplicitStream",
    "IIDStream",
    "IntersectionFirst",
    "LateTelltale",
    "Stream",
    "SubstitutedStream",
    "check_stream",
]


class Stream(ABC):
    """An infinite (or, for :class:`ExplicitStream`, finite) sequence over a universe."""

    universe: Universe
    name: str = "stream"
    #: True when no element repeats (the standing assumption of Thm 1.1, C.1, C.5, 1.5)
    duplicate_free: bool = True
    #: the language the stream enumerates (adversarial) or whose distribution it samples
    target: Language | None = None
    #: "adversarial" or "iid"
    kind: str = "adversarial"
    #: number of elements, None for an infinite stream
    length: int | None = None

    @abstractmethod
    def element(self, t: int) -> Any:
        """x_t (t ≥ 1)."""

    def prefix(self, t: int) -> list[Any]:
        """[x_1, …, x_t]."""
        return [self.element(r) for r in range(1, t + 1)]

    def error_count(self, language: Language, t: int) -> int:
        """#{r ≤ t : x_r ∉ L}."""
        return int(t - int(np.count_nonzero(language.contains_many(self._prefix_array(t)))))

    def multiplicity(self, u: Any, t: int) -> int:
        """#{r ≤ t : x_r = u}."""
        key = element_key(u)
        return sum(1 for v in self.prefix(t) if element_key(v) == key)

    def _prefix_array(self, t: int) -> np.ndarray:
        vals = self.prefix(t)
        if vals and all(isinstance(v, int | np.integer) for v in vals):
            return np.asarray(vals, dtype=np.int64)
        arr = np.empty(len(vals), dtype=object)
        arr[:] = vals
        return arr

    def _check_t(self, t: int) -> None:
        if t < 0:
            raise ValueError("t must be >= 0")
        if self.length is not None and t > self.length:
            raise ValueError(f"the stream has only {self.length} elements")

    def describe(self) -> str:
        return self.name


class _IntersectionCache:
    def __init__(self, base: Language) -> None:
        self.base = base
        self._cache: dict[int, tuple[Language, Language]] = {}

    def get(self, language: Language) -> Language:
        hit = self._cache.get(id(language))
        if hit is None or hit[0] is not language:
            hit = (language, self.base.intersection(language))
            self._cache[id(language)] = hit
        return hit[1]


def _count_first_in(enum: Language, cache: _IntersectionCache, language: Language,
                    m: int) -> int:
    """How many of the first m members of ``enum`` lie in ``language``."""
    if m <= 0:
        return 0
    return cache.get(language).count_upto(enum.nth_index(m))


class CanonicalEnumeration(Stream):
    """x_t = the t-th member of K in the universe's order (duplicate-free)."""

    def __init__(self, target: Language, name: str = "canonical") -> None:
        if not target.is_infinite:
            raise ValueError("an enumeration of a finite language ends; targets are infinite")
        self.target = target
        self.universe = target.universe
        self.name = name
        self._cache = _IntersectionCache(target)

    def element(self, t: int) -> Any:
        return self.target.nth(t)  # type: ignore[union-attr]

    def error_count(self, language: Language, t: int) -> int:
        return t - _count_first_in(self.target, self._cache, language, t)  # type: ignore[arg-type]

    def multiplicity(self, u: Any, t: int) -> int:
        k = self.target
        assert k is not None
        if not k.contains(u):
            return 0
        return 1 if k.count_upto(self.universe.index(u)) <= t else 0


class BlockShuffle(Stream):
    """K's canonical order cut into blocks of size B, each block shuffled (every element
    appears once); the permutation of block b comes from ``RandomStreams(seed).generator(b)``."""

    def __init__(self, target: Language, block: int, seed: int, name: str = "") -> None:
        if block < 1:
            raise ValueError("block size must be >= 1")
        if not target.is_infinite:
            raise ValueError("targets are infinite")
        self.target = target
        self.universe = target.universe
        self.block = int(block)
        self._streams = RandomStreams(seed)
        self._perms: dict[int, np.ndarray] = {}
        self._cache = _IntersectionCache(target)
        self.name = name or f"block-shuffle(B={block})"

    def _perm(self, b: int) -> np.ndarray:
        p = self._perms.get(b)
        if p is None:
            p = self._streams.generator(b).permutation(self.block)
            if len(self._perms) > 4096:
                self._perms.clear()
            self._perms[b] = p
        return p

    def element(self, t: int) -> Any:
        b, i = divmod(t - 1, self.block)
        return self.target.nth(b * self.block + int(self._perm(b)[i]) + 1)  # type: ignore[union-attr]

    def error_count(self, language: Language, t: int) -> int:
        full = (t // self.block) * self.block
        k = self.target
        assert k is not None
        inside = _count_first_in(k, self._cache, language, full)
        rest = t - full
        if rest:
            b = t // self.block
            perm = self._perm(b)[:rest]
            inside += sum(1 for i in perm.tolist()
                          if language.contains(k.nth(b * self.block + i + 1)))
        return t - inside

    def multiplicity(self, u: Any, t: int) -> int:
        k = self.target
        assert k is not None
        if not k.contains(u):
            return 0
        rank = k.count_upto(self.universe.index(u))
        b, i = divmod(rank - 1, self.block)
        pos = int(np.flatnonzero(self._perm(b) == i)[0])
        return 1 if b * self.block + pos + 1 <= t else 0


class IntersectionFirst(Stream):
    """K ∩ L′ listed densely, K ∖ L′ only at the sparse positions t = 1, 2, 4, 8, …
    (stresses error-rate thresholds and priorities; spec 001 §5.3 (iii))."""

    def __init__(self, target: Language, other: Language, name: str = "") -> None:
        dense = target.intersection(other)
        sparse = target.difference(other)
        if not dense.is_infinite:
            raise ValueError("K ∩ L′ must be infinite for the dense part")
        self.target = target
        self.universe = target.universe
        self.dense, self.sparse = dense, sparse
        self._nsparse = None if sparse.is_infinite else int(sparse.size or 0)
        self._dense_cache = _IntersectionCache(dense)
        self._sparse_cache = _IntersectionCache(sparse)
        self.name = name or "intersection-first"

    def _sparse_upto(self, t: int) -> int:
        s = t.bit_length() if t > 0 else 0  # number of powers of two ≤ t
        return s if self._nsparse is None else min(s, self._nsparse)

    def element(self, t: int) -> Any:
        if t & (t - 1) == 0:
            j = t.bit_length()
            if self._nsparse is None or j <= self._nsparse:
                return self.sparse.nth(j)
        return self.dense.nth(t - self._sparse_upto(t))

    def error_count(self, language: Language, t: int) -> int:
        s = self._sparse_upto(t)
        inside = (_count_first_in(self.sparse, self._sparse_cache, language, s)
                  + _count_first_in(self.dense, self._dense_cache, language, t - s))
        return t - inside

    def multiplicity(self, u: Any, t: int) -> int:
        if self.sparse.contains(u):
            j = self.sparse.count_upto(self.universe.index(u))
            return 1 if (1 << (j - 1)) <= t else 0
        if self.dense.contains(u):
            m = self.dense.count_upto(self.universe.index(u))
            # position of the m-th dense element: smallest t with t − sparse(t) = m
            lo, hi = m, 2 * m + 64
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if mid - self._sparse_upto(mid) >= m:
                    hi = mid
                else:
                    lo = mid
            pos = lo if lo - self._sparse_upto(lo) >= m else hi
            return 1 if pos <= t else 0
        return 0


class LateTelltale(Stream):
    """K's canonical order with one element w held back and shown once at position T."""

    def __init__(self, target: Language, held: Any, at: int, name: str = "") -> None:
        if not target.contains(held):
            raise ValueError("the held-back element must belong to K")
        if at < 1:
            raise ValueError("the position must be >= 1")
        self.target = target
        self.universe = target.universe
        self.held = held
        self.at = int(at)
        from .languages import finite as _finite

        self.rest = target.difference(_finite([held], target.universe))
        self._cache = _IntersectionCache(self.rest)
        self.name = name or f"late-telltale({held}@{at})"

    def element(self, t: int) -> Any:
        if t == self.at:
            return self.held
        return self.rest.nth(t if t < self.at else t - 1)

    def error_count(self, language: Language, t: int) -> int:
        if t < self.at:
            return t - _count_first_in(self.rest, self._cache, language, t)
        inside = _count_first_in(self.rest, self._cache, language, t - 1)
        return t - inside - (1 if language.contains(self.held) else 0)

    def multiplicity(self, u: Any, t: int) -> int:
        if element_key(u) == element_key(self.held):
            return 1 if t >= self.at else 0
        if not self.rest.contains(u):
            return 0
        rank = self.rest.count_upto(self.universe.index(u))
        pos = rank if rank < self.at else rank + 1
        return 1 if pos <= t else 0


class DuplicateHeavy(Stream):
    """Spec 001 §4.2(d): x_t = ``filler`` except x_{2^j} = value(j) for j ≥ ``first``.

    With filler 0, first 12 and value(j) = 2(j − 11) this is a valid enumeration of the evens
    (every even number appears) in which 0 repeats at almost every step: duplicate-heavy."""

    duplicate_free = False

    def __init__(self, target: Language, filler: Any = 0, first: int = 12,
                 offset: int = 11, name: str = "duplicate-heavy") -> None:
        self.target = target
        self.universe = target.universe
        self.filler = filler
        self.first = int(first)
        self.offset = int(offset)
        self.name = name

    def value(self, j: int) -> int:
        return 2 * (j - self.offset)

    def _sparse(self, t: int) -> list[int]:
        return [self.value(j) for j in range(self.first, t.bit_length())
                if (1 << j) <= t]

    def element(self, t: int) -> Any:
        if t & (t - 1) == 0 and t.bit_length() - 1 >= self.first:
            return self.value(t.bit_length() - 1)
        return self.filler

    def error_count(self, language: Language, t: int) -> int:
        sparse = self._sparse(t)
        bad = sum(1 for v in sparse if not language.contains(v))
        if not language.contains(self.filler):
            bad += t - len(sparse)
        return bad

    def multiplicity(self, u: Any, t: int) -> int:
        sparse = self._sparse(t)
        c = sum(1 for v in sparse if v == u)
        if element_key(u) == element_key(self.filler):
            c += t - len(sparse)
        return c


class ExplicitStream(Stream):
    """A finite stream given as a list (``--data`` files, crafted neighbours, tests)."""

    def __init__(self, values: Sequence[Any], universe: Universe, name: str = "explicit",
                 target: Language | None = None) -> None:
        self.universe = universe
        self.values = [element_key(v) for v in values]
        for v in self.values:
            universe.index(v)
        self.length = len(self.values)
        self.name = name
        self.target = target
        self.duplicate_free = len(set(map(repr, self.values))) == len(self.values)
        self._arr: np.ndarray | None = None

    def element(self, t: int) -> Any:
        if not 1 <= t <= self.length:  # type: ignore[operator]
            raise ValueError(f"the stream has only {self.length} elements")
        return self.values[t - 1]

    def prefix(self, t: int) -> list[Any]:
        self._check_t(t)
        return self.values[:t]

    def _prefix_array(self, t: int) -> np.ndarray:
        if self._arr is None:
            vals = self.values
            if vals and all(isinstance(v, int) and -(2**63) <= v < 2**63 for v in vals):
                self._arr = np.asarray(vals, dtype=np.int64)
            else:
                self._arr = np.empty(len(vals), dtype=object)
                self._arr[:] = vals
        self._check_t(t)
        return self._arr[:t]


class SubstitutedStream(Stream):
    """The neighbour of ``base`` with x_τ replaced by ``value`` (continual-release adjacency)."""

    def __init__(self, base: Stream, position: int, value: Any) -> None:
        if position < 1:
            raise ValueError("positions are 1-based")
        base.universe.index(value)
        self.base = base
        self.universe = base.universe
        self.position = int(position)
        self.value = element_key(value)
        self.length = base.length
        self.kind = base.kind
        self.target = base.target
        self.duplicate_free = False  # not known in general
        self.name = f"{base.name}[x{position}:={value}]"

    def element(self, t: int) -> Any:
        return self.value if t == self.position else self.base.element(t)

    def error_count(self, language: Language, t: int) -> int:
        c = self.base.error_count(language, t)
        if t >= self.position:
            c += (0 if language.contains(self.value) else 1) - (
                0 if language.contains(self.base.element(self.position)) else 1)
        return c

    def multiplicity(self, u: Any, t: int) -> int:
        c = self.base.multiplicity(u, t)
        if t >= self.position:
            key = element_key(u)
            c += (1 if self.value == key else 0) - (
                1 if element_key(self.base.element(self.position)) == key else 0)
        return c


class IIDStream(Stream):
    """x_t i.i.d. from D (001 Def. 7). The first ``materialise`` draws (a power of two) are
    kept explicitly; beyond them the stream is defined block by block — the multiplicities of
    the draws in [2^j, 2^{j+1}) come from ``RandomStreams(seed).generator(1, j)`` by sequential
    binomials — so ``error_count`` and ``multiplicity`` work at every t = 2^j up to 2⁶² and give
    the same answers whatever was asked before. Beyond the materialised prefix only dyadic
    t = 2^j can be asked (all the stochastic-setting algorithms update at t = 2ˢ)."""

    kind = "iid"

    def __init__(self, distribution: Distribution, seed: int, materialise: int = 1 << 16,
                 name: str = "") -> None:
        if materialise < 1 or materialise & (materialise - 1):
            raise ValueError("materialise must be a power of two")
        self.distribution = distribution
        self.universe = distribution.universe
        self.target = distribution.support
        self.seed = int(seed)
        self.cap = int(materialise)
        self.duplicate_free = False
        self.name = name or f"iid({distribution.describe()})"
        self._prefix = distribution.sample(self.cap, RandomStreams(seed).generator(0))
        self._blocks: dict[int, dict[Any, int]] = {}
        self._at: dict[int, dict[Any, int]] = {}

    def element(self, t: int) -> Any:
        if t > self.cap:
            raise ValueError(f"elements beyond the materialised prefix ({self.cap}) are only "
                             "available as counts")
        return element_key(self._prefix[t - 1])

    def prefix(self, t: int) -> list[Any]:
        if t > self.cap:
            raise ValueError("the prefix beyond the materialised part is not available")
        return [element_key(v) for v in self._prefix[:t].tolist()]

    def _block(self, j: int) -> dict[Any, int]:
        blk = self._blocks.get(j)
        if blk is None:
            blk = self.distribution.sample_counts(1 << j,
                                                  RandomStreams(self.seed).generator(1, j))
            self._blocks[j] = blk
        return blk

    def counts(self, t: int) -> dict[Any, int]:
        """Multiplicities of every element among x_1..x_t."""
        if t <= self.cap:
            vals, cnt = np.unique(self._prefix[:t], return_counts=True)
            return {element_key(v): int(c) for v, c in zip(vals.tolist(), cnt.tolist(),
                                                            strict=True)}
        if t & (t - 1):
            raise ValueError(f"beyond the materialised prefix ({self.cap}) an i.i.d. stream "
                             f"answers only at t = 2^j, not at t = {t}")
        hit = self._at.get(t)
        if hit is not None:
            return hit
        out = dict(self.counts(self.cap))
        for j in range(self.cap.bit_length() - 1, t.bit_length() - 1):
            for u, c in self._block(j).items():
                out[u] = out.get(u, 0) + c
        self._at[t] = out
        return out

    def error_count(self, language: Language, t: int) -> int:
        counts = self.counts(t)
        return sum(c for u, c in counts.items() if not language.contains(u))

    def multiplicity(self, u: Any, t: int) -> int:
        return self.counts(t).get(element_key(u), 0)


def check_stream(stream: Stream, target: Language | None, horizon: int,
                 sample: int = 2000) -> list[str]:
    """The harness's precondition check: returns warnings (empty when all is well).

    Flags an adversarial stream that is not duplicate-free (Thms 1.1, C.1, C.5 and 1.5 assume
    it; spec 001 erratum E2; i.i.d. streams repeat by nature) and, on the first ``sample``
    elements, elements outside the target."""
    warnings = []
    if not stream.duplicate_free and stream.kind == "adversarial":
        warnings.append(f"{stream.describe()} repeats elements: Thm 1.1 (and C.1, C.5) assume "
                        "a duplicate-free enumeration (spec 001 erratum E2); their guarantees "
                        "do not apply")
    if target is not None and stream.kind == "adversarial":
        t = min(sample, horizon) if stream.length is None else min(sample, horizon, stream.length)
        try:
            outside = [v for v in stream.prefix(t) if not target.contains(v)]
        except ValueError:
            outside = []
        if outside:
            warnings.append(f"{stream.describe()} has elements outside the target "
                            f"(e.g. {outside[0]!r}): it is not an enumeration of K")
    return warnings

"""Languages: subsets of a universe with exact membership, counting, unranking and set algebra.

Every language offers the oracles the two papers assume (spec 000 §5.1, spec 001 §5.2):

* ``contains(u)`` — membership (all the identification algorithms need);
* ``is_infinite`` / ``is_empty`` / ``size`` — decided exactly;
* ``count_upto(j)`` — the number of members at universe positions ≤ j (fast error counts for the
  fast-forward runner of :mod:`dplang.formal.limit`);
* ``nth(r)`` / ``nth_beyond(m, r)`` — the r-th smallest-positioned member (beyond position m), on
  Python big integers, because the generation algorithms draw r up to R = n·2⁶⁴ (000 Algs 3,
  5–7) and 200t³ (001 Alg 1);
* ``intersection``, ``difference``, ``union``, ``issubset`` — exact, which gives closures
  Cl(𝓛′) = ∩𝓛′, witnesses (the first element of L \\ supp D), Thm 1.5's finite-difference test
  and the validity test U_t ⊆ K.

Three exact representations cover every family the lab uses:

* :class:`NatSet` — an eventually periodic subset of ℕ₀: finitely many intervals [lo, hi), each
  with its own modulus q and residue set R ⊆ ℤ_q (x ∈ L iff x lies in an interval and x mod q ∈
  R). Finite and cofinite sets, initial segments, thresholds, arithmetic progressions, residue
  unions (intersections by the Chinese remainder theorem), finite modifications, 2-adic classes
  and the Sperner(k, d) residue families are all of this form, and the form is closed under the
  Boolean operations.
* :class:`DFALanguage` — a regular language over Σ* in shortlex order given by a *complete* DFA;
  counting and unranking by a count-by-length dynamic programme, products for ∩ and \\.
* :class:`PairSet` — a subset of ℕ₀² that is a finite union of columns {(c, y) : y ∈ A_c} with A_c
  a :class:`NatSet` ("rows" in ℕ², Cor C.4's tagged Sperner collections).

:class:`FiniteSet` covers finite universes (the identification hard pair {z, x, y}) and
:class:`WholeUniverse` is X itself (the closure of the empty subcollection, Cl(∅) = X).

Privacy contract: none — languages are public objects; nothing here reads private data.
"""

from __future__ import annotations

import bisect
import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .universe import CantorPairs, FiniteUniverse, Naturals, Shortlex, Universe, cantor_pair

#: int64's range: naturals beyond it are decided one Python int at a time.
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

__all__ = [
    "DFA",
    "DFALanguage",
    "FiniteSet",
    "Language",
    "NatSet",
    "PairSet",
    "WholeUniverse",
    "ap",
    "cofinite",
    "column",
    "dfa_language",
    "finite",
    "residues",
    "segment",
    "threshold",
    "two_adic",
]

#: largest modulus a residue set is ever expanded to (the Boolean operations lift two residue
#: sets to the lcm of their moduli); beyond it the operation is refused
MAX_MODULUS = 20_000_000

#: DFA unranking refuses strings longer than this (a sparse language's r-th element with r ~ 2⁶⁴
#: has astronomically many letters); callers then handle the element symbolically
MAX_WORD_LENGTH = 100_000


class Language(ABC):
    """A subset of a universe with exact oracles (see the module docstring)."""

    universe: Universe
    name: str = ""

    # ---- membership ---------------------------------------------------------------------------
    @abstractmethod
    def contains(self, u: Any) -> bool:
        """Membership oracle: is u ∈ L?"""

    def contains_many(self, items: Iterable[Any]) -> np.ndarray:
        """Membership of every item (a boolean array)."""
        return np.fromiter((self.contains(u) for u in items), dtype=bool)

    def __contains__(self, u: Any) -> bool:
        return self.contains(u)

    # ---- size ---------------------------------------------------------------------------------
    @property
    @abstractmethod
    def is_infinite(self) -> bool:
        """True when L has infinitely many elements."""

    @property
    def is_empty(self) -> bool:
        return not self.is_infinite and self.size == 0

    @property
    def size(self) -> int | None:
        """|L| for a finite language, None for an infinite one."""
        if self.is_infinite:
            return None
        return self._finite_size()

    @abstractmethod
    def _finite_size(self) -> int: ...

    # ---- counting and unranking ---------------------------------------------------------------
    @abstractmethod
    def count_upto(self, j: int) -> int:
        """Number of members at universe positions ≤ j (j may be 0)."""

    @abstractmethod
    def nth_index(self, r: int) -> int:
        """Universe position of the r-th member (1-based, in position order).

        Raises IndexError when L has fewer than r members."""

    def nth(self, r: int) -> Any:
        """The r-th member (1-based) in the universe's order."""
        return self.universe.at(self.nth_index(r))

    def nth_beyond(self, m: int, r: int) -> Any:
        """The r-th smallest-positioned member with position > m (spec 000 Algs 3, 5–7)."""
        if m < 0 or r < 1:
            raise ValueError("need m >= 0 and r >= 1")
        return self.nth(self.count_upto(m) + r)

    def nth_index_beyond(self, m: int, r: int) -> int:
        """Position of :meth:`nth_beyond`'s element."""
        if m < 0 or r < 1:
            raise ValueError("need m >= 0 and r >= 1")
        return self.nth_index(self.count_upto(m) + r)

    def prefix_indices(self, m: int) -> list[int]:
        """Sorted positions j ≤ m with u_j ∈ L."""
        return [j for j in range(1, m + 1) if self.contains(self.universe.at(j))]

    def first_index(self) -> int | None:
        """Position of the first member, None for the empty language."""
        return None if self.is_empty else self.nth_index(1)

    def elements(self, limit: int) -> list[Any]:
        """The first ``limit`` members (fewer if L is smaller)."""
        out = []
        for r in range(1, limit + 1):
            try:
                out.append(self.nth(r))
            except IndexError:
                break
        return out

    # ---- set algebra --------------------------------------------------------------------------
    @abstractmethod
    def intersection(self, other: Language) -> Language: ...

    @abstractmethod
    def difference(self, other: Language) -> Language: ...

    @abstractmethod
    def union(self, other: Language) -> Language: ...

    def issubset(self, other: Language) -> bool:
        """L ⊆ other, decided exactly."""
        return self.difference(other).is_empty

    def equals(self, other: Language) -> bool:
        return self.issubset(other) and other.issubset(self)

    def _same_universe(self, other: Language) -> None:
        if other.universe != self.universe:
            raise ValueError(f"languages over different universes: {self.universe.describe()} "
                             f"and {other.universe.describe()}")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name or self.describe()}>"

    def describe(self) -> str:
        return self.name or type(self).__name__

    def named(self, name: str) -> Language:
        """Set the display name (returns self)."""
        self.name = name
        return self


# =============================================================================================
# Eventually periodic subsets of ℕ₀
# =============================================================================================


def _divisors(q: int) -> list[int]:
    small, large = [], []
    d = 1
    while d * d <= q:
        if q % d == 0:
            small.append(d)
            if d * d != q:
                large.append(q // d)
        d += 1
    return small + large[::-1]


def _reduce_residues(q: int, res: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    """The smallest period p | q for which the residue set is p-periodic."""
    if not res:
        return 1, ()
    if len(res) == q:
        return 1, (0,)
    for p in _divisors(q):
        if p == q:
            break
        rp = {r % p for r in res}
        if len(rp) * (q // p) == len(res):
            return p, tuple(sorted(rp))
    return q, res


def _lift(q: int, res: tuple[int, ...], big: int) -> np.ndarray:
    """Residues mod ``big`` (a multiple of q) that reduce into ``res`` mod q, as a bool mask."""
    mask = np.zeros(big, dtype=bool)
    if res:
        base = np.asarray(res, dtype=np.int64)
        offs = np.arange(0, big, q, dtype=np.int64)
        mask[(offs[:, None] + base[None, :]).ravel()] = True
    return mask


def _crt(r1: int, q1: int, r2: int, q2: int) -> int | None:
    """The x mod lcm(q1, q2) with x ≡ r1 (q1), x ≡ r2 (q2), or None when incompatible."""
    g = math.gcd(q1, q2)
    if (r2 - r1) % g:
        return None
    lcm = q1 // g * q2
    m1, m2 = q1 // g, q2 // g
    t = ((r2 - r1) // g) * pow(m1, -1, m2) % m2 if m2 > 1 else 0
    return (r1 + q1 * t) % lcm


def _residue_op(qa: int, ra: tuple[int, ...], qb: int, rb: tuple[int, ...],
                op: str) -> tuple[int, tuple[int, ...]]:
    if op == "and":
        if not ra or not rb:
            return 1, ()
        if qa == qb:
            return _reduce_residues(qa, tuple(sorted(set(ra) & set(rb))))
        lcm = qa // math.gcd(qa, qb) * qb
        if len(ra) * len(rb) <= 4096 or lcm > MAX_MODULUS:
            out = {x for a in ra for b in rb if (x := _crt(a, qa, b, qb)) is not None}
            return _reduce_residues(lcm, tuple(sorted(out)))
    if qa == qb:
        sa, sb = set(ra), set(rb)
        res = sa | sb if op == "or" else sa - sb
        return _reduce_residues(qa, tuple(sorted(res)))
    lcm = qa // math.gcd(qa, qb) * qb
    if lcm > MAX_MODULUS:
        raise ValueError(f"residue sets would need modulus {lcm} (> {MAX_MODULUS})")
    ma, mb = _lift(qa, ra, lcm), _lift(qb, rb, lcm)
    m = {"and": ma & mb, "or": ma | mb, "diff": ma & ~mb}[op]
    return _reduce_residues(lcm, tuple(int(x) for x in np.flatnonzero(m)))


def _count_res(q: int, res: tuple[int, ...], v: int) -> int:
    """#{x ∈ [0, v] : x mod q ∈ res} for v ≥ −1."""
    if v < 0 or not res:
        return 0
    full, rem = divmod(v + 1, q)
    return full * len(res) + bisect.bisect_left(res, rem)


@dataclass(frozen=True)
class _Piece:
    lo: int
    hi: int | None  # None = ∞
    q: int
    res: tuple[int, ...]

    def count_le(self, v: int) -> int:
        if v < self.lo:
            return 0
        top = v if self.hi is None else min(v, self.hi - 1)
        return _count_res(self.q, self.res, top) - _count_res(self.q, self.res, self.lo - 1)

    @property
    def total(self) -> int | None:
        if self.hi is None:
            return None if self.res else 0
        return self.count_le(self.hi - 1)


class NatSet(Language):
    """An eventually periodic subset of ℕ₀ (see the module docstring).

    Build one with :func:`ap`, :func:`residues`, :func:`threshold`, :func:`segment`,
    :func:`finite`, :func:`cofinite`, :func:`two_adic` or the Boolean operations."""

    def __init__(self, pieces: Iterable[tuple[int, int | None, int, Iterable[int]]] = (),
                 universe: Naturals | None = None, name: str = "") -> None:
        self.universe = universe if universe is not None else Naturals()
        if not isinstance(self.universe, Naturals):
            raise ValueError("a NatSet lives in a Naturals universe")
        raw = []
        for lo, hi, q, res in pieces:
            if q < 1 or lo < 0 or (hi is not None and hi < lo):
                raise ValueError(f"bad piece ({lo}, {hi}, {q})")
            rs = tuple(sorted({int(r) % q for r in res}))
            p, rs = _reduce_residues(q, rs)
            raw.append(_Piece(int(lo), None if hi is None else int(hi), p, rs))
        self._pieces = self._normalise(raw)
        self.name = name

    # -- construction helpers -------------------------------------------------------------------
    @staticmethod
    def _normalise(pieces: list[_Piece]) -> tuple[_Piece, ...]:
        pieces = [p for p in pieces if p.res and (p.hi is None or p.total)]
        pieces.sort(key=lambda p: p.lo)
        for a, b in itertools.pairwise(pieces):
            if a.hi is None or a.hi > b.lo:
                raise ValueError("pieces overlap; combine them with union()")
        out: list[_Piece] = []
        for p in pieces:
            if out and out[-1].hi == p.lo and (out[-1].q, out[-1].res) == (p.q, p.res):
                out[-1] = _Piece(out[-1].lo, p.hi, p.q, p.res)
            else:
                out.append(p)
        return tuple(out)

    @classmethod
    def _from_pieces(cls, pieces: list[_Piece], universe: Naturals) -> NatSet:
        obj = cls.__new__(cls)
        obj.universe = universe
        obj._pieces = cls._normalise(pieces)
        obj.name = ""
        return obj

    @property
    def pieces(self) -> tuple[_Piece, ...]:
        return self._pieces

    def with_universe(self, universe: Naturals) -> NatSet:
        """The same set of numbers in another Naturals universe (e.g. with noise symbols)."""
        out = NatSet._from_pieces(list(self._pieces), universe)
        out.name = self.name
        return out

    # -- membership -----------------------------------------------------------------------------
    def contains(self, u: Any) -> bool:
        if isinstance(u, bool | str) or u is None:
            return False
        try:
            x = int(u)
        except (TypeError, ValueError):
            return False
        if x != u or x < 0:
            return False
        i = bisect.bisect_right([p.lo for p in self._pieces], x) - 1
        if i < 0:
            return False
        p = self._pieces[i]
        if p.hi is not None and x >= p.hi:
            return False
        r = x % p.q
        j = bisect.bisect_left(p.res, r)
        return j < len(p.res) and p.res[j] == r

    def contains_many(self, items: Iterable[Any]) -> np.ndarray:
        arr = np.asarray(items if isinstance(items, np.ndarray) else list(items))
        if arr.dtype.kind == "O":  # e.g. numbers mixed with noise symbols
            values = arr.tolist()
            is_int = np.fromiter((isinstance(v, int | np.integer) and not isinstance(v, bool)
                                  and _INT64_MIN <= v <= _INT64_MAX for v in values),
                                 dtype=bool, count=arr.size)
            # a natural beyond int64 (any element of ℕ₀ is in the domain) is decided exactly,
            # one Python int at a time
            out = np.fromiter((isinstance(v, int) and not isinstance(v, bool) and not ok
                               and self.contains(v)
                               for ok, v in zip(is_int, values, strict=True)),
                              dtype=bool, count=arr.size)
            if is_int.any():
                out[is_int] = self.contains_many(arr[is_int].astype(np.int64))
            return out
        if arr.dtype.kind not in "iu":
            return super().contains_many(arr.tolist())
        x = arr.astype(np.int64, copy=False)
        out = np.zeros(x.shape, dtype=bool)
        for p in self._pieces:
            m = x >= p.lo
            if p.hi is not None:
                m &= x < p.hi
            if p.q == 1:
                out |= m
            else:
                out |= m & np.isin(x % p.q, np.asarray(p.res, dtype=np.int64))
        return out

    # -- sizes ----------------------------------------------------------------------------------
    @property
    def is_infinite(self) -> bool:
        return bool(self._pieces) and self._pieces[-1].hi is None

    @property
    def is_empty(self) -> bool:
        return not self._pieces

    def _finite_size(self) -> int:
        return sum(p.total or 0 for p in self._pieces)

    # -- counting -------------------------------------------------------------------------------
    def count_le(self, v: int) -> int:
        """#{x ∈ L : x ≤ v}."""
        return sum(p.count_le(v) for p in self._pieces if p.lo <= v)

    def count_upto(self, j: int) -> int:
        return self.count_le(self.universe.value_bound(j))

    def nth_value(self, r: int) -> int:
        """The r-th smallest member (1-based)."""
        if r < 1:
            raise IndexError("r must be >= 1")
        for p in self._pieces:
            tot = p.total
            if tot is None or r <= tot:
                t = _count_res(p.q, p.res, p.lo - 1) + r
                full, idx = divmod(t - 1, len(p.res))
                return full * p.q + p.res[idx]
            r -= tot
        raise IndexError("the language has fewer elements")

    def nth_index(self, r: int) -> int:
        return self.nth_value(r) + self.universe.offset + 1

    def nth(self, r: int) -> int:
        return self.nth_value(r)

    def values(self, limit: int) -> list[int]:
        """The first ``limit`` members."""
        return self.elements(limit)

    # -- Boolean operations ---------------------------------------------------------------------
    def _combine(self, other: Language, op: str) -> NatSet:
        if isinstance(other, WholeUniverse):
            other = threshold(0, universe=self.universe)
        if not isinstance(other, NatSet):
            raise TypeError(f"cannot combine a NatSet with {type(other).__name__}")
        self._same_universe(other)
        cuts = sorted({0} | {p.lo for p in self._pieces + other._pieces}
                      | {p.hi for p in self._pieces + other._pieces if p.hi is not None})
        bounds = [*itertools.pairwise(cuts), (cuts[-1], None)]

        def at(pieces: tuple[_Piece, ...], lo: int) -> tuple[int, tuple[int, ...]]:
            for p in pieces:
                if p.lo <= lo and (p.hi is None or lo < p.hi):
                    return p.q, p.res
            return 1, ()

        out = []
        for lo, hi in bounds:
            qa, ra = at(self._pieces, lo)
            qb, rb = at(other._pieces, lo)
            q, res = _residue_op(qa, ra, qb, rb, op)
            if res:
                out.append(_Piece(lo, hi, q, res))
        return NatSet._from_pieces(out, self.universe)

    def intersection(self, other: Language) -> NatSet:
        return self._combine(other, "and")

    def union(self, other: Language) -> NatSet:
        return self._combine(other, "or")

    def difference(self, other: Language) -> NatSet:
        return self._combine(other, "diff")

    def complement(self) -> NatSet:
        """ℕ₀ \\ L (noise symbols are never members)."""
        return threshold(0, universe=self.universe).difference(self)

    def describe(self) -> str:
        if self.name:
            return self.name
        parts = []
        for p in self._pieces:
            rng = f"[{p.lo},{'∞' if p.hi is None else p.hi})"
            parts.append(rng if p.q == 1 else f"{rng}∩{{x≡{','.join(map(str, p.res))} mod {p.q}}}")
        return " ∪ ".join(parts) or "∅"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, NatSet) and other.universe == self.universe
                and other._pieces == self._pieces)

    def __hash__(self) -> int:
        return hash(self._pieces)


def _nat_universe(universe: Naturals | None) -> Naturals:
    return universe if universe is not None else Naturals()


def ap(a: int, b: int, universe: Naturals | None = None) -> NatSet:
    """The arithmetic progression {a + b·t : t ≥ 0} (b ≥ 1)."""
    if a < 0 or b < 1:
        raise ValueError("need a >= 0 and b >= 1")
    return NatSet([(a, None, b, (a % b,))], _nat_universe(universe), name=f"{a}+{b}ℕ₀")


def residues(q: int, res: Iterable[int], start: int = 0,
             universe: Naturals | None = None) -> NatSet:
    """{x ≥ start : x mod q ∈ res}."""
    rs = sorted({int(r) % q for r in res})
    return NatSet([(start, None, q, rs)], _nat_universe(universe),
                  name=f"{{x≥{start}: x mod {q} ∈ {{{','.join(map(str, rs))}}}}}"
                  if start else f"{{x mod {q} ∈ {{{','.join(map(str, rs))}}}}}")


def threshold(level: int, universe: Naturals | None = None) -> NatSet:
    """{x : x ≥ level}."""
    return NatSet([(level, None, 1, (0,))], _nat_universe(universe), name=f"{{x≥{level}}}")


def segment(i: int, universe: Naturals | None = None) -> NatSet:
    """The initial segment {0, …, i − 1}."""
    return NatSet([(0, i, 1, (0,))], _nat_universe(universe), name=f"{{0..{i - 1}}}")


def finite(elements: Iterable[Any], universe: Universe | None = None) -> Language:
    """A finite language: a :class:`NatSet` over ℕ₀ or a :class:`FiniteSet` otherwise."""
    elems = list(elements)
    if universe is None or isinstance(universe, Naturals):
        xs = sorted({int(x) for x in elems})
        return NatSet([(x, x + 1, 1, (0,)) for x in xs], _nat_universe(universe),  # type: ignore[arg-type]
                      name="{" + ",".join(map(str, xs)) + "}")
    if isinstance(universe, FiniteUniverse):
        return FiniteSet(universe, elems)
    if isinstance(universe, Shortlex):
        return dfa_finite(universe, elems)
    if isinstance(universe, CantorPairs):
        cols: dict[int, list[int]] = {}
        for x, y in elems:
            cols.setdefault(x, []).append(y)
        return PairSet({c: finite(ys) for c, ys in cols.items()})  # type: ignore[misc]
    raise ValueError(f"no finite languages over {universe.describe()}")


def cofinite(excluded: Iterable[int], universe: Naturals | None = None) -> NatSet:
    """ℕ₀ minus a finite set."""
    ex = sorted({int(x) for x in excluded})
    out = threshold(0, universe).difference(finite(ex, universe))
    out.name = "ℕ₀∖{" + ",".join(map(str, ex)) + "}" if ex else "ℕ₀"
    return out


def two_adic(i: int, universe: Naturals | None = None) -> NatSet:
    """The 2-adic class {2^i (2m + 1) : m ≥ 0} (pairwise disjoint for distinct i)."""
    out = residues(2 ** (i + 1), (2**i,), universe=universe)
    out.name = f"2^{i}(2ℕ₀+1)"
    return out


# =============================================================================================
# Finite universes
# =============================================================================================


class FiniteSet(Language):
    """A subset of a :class:`FiniteUniverse` (or any universe, for finite sets)."""

    def __init__(self, universe: Universe, elements: Iterable[Any], name: str = "") -> None:
        self.universe = universe
        elems = frozenset(elements)
        for e in elems:
            universe.index(e)  # raises for a foreign element
        self.members = elems
        self._positions = sorted(universe.index(e) for e in elems)
        self.name = name or "{" + ",".join(map(str, sorted(elems, key=universe.index))) + "}"

    def contains(self, u: Any) -> bool:
        try:
            return u in self.members
        except TypeError:
            return False

    @property
    def is_infinite(self) -> bool:
        return False

    def _finite_size(self) -> int:
        return len(self.members)

    def count_upto(self, j: int) -> int:
        return bisect.bisect_right(self._positions, j)

    def nth_index(self, r: int) -> int:
        if not 1 <= r <= len(self._positions):
            raise IndexError("the language has fewer elements")
        return self._positions[r - 1]

    def intersection(self, other: Language) -> FiniteSet:
        self._same_universe(other)
        return FiniteSet(self.universe, {e for e in self.members if other.contains(e)})

    def difference(self, other: Language) -> FiniteSet:
        self._same_universe(other)
        return FiniteSet(self.universe, {e for e in self.members if not other.contains(e)})

    def union(self, other: Language) -> FiniteSet:
        if not isinstance(other, FiniteSet):
            raise TypeError("union with a non-finite language")
        return FiniteSet(self.universe, self.members | other.members)


class WholeUniverse(Language):
    """X itself: Cl(∅) = X (spec 001 §1.1 convention)."""

    def __init__(self, universe: Universe) -> None:
        self.universe = universe
        self.name = "X"

    def contains(self, u: Any) -> bool:
        return self.universe.contains(u)

    @property
    def is_infinite(self) -> bool:
        return self.universe.size is None

    def _finite_size(self) -> int:
        return int(self.universe.size or 0)

    def count_upto(self, j: int) -> int:
        return j if self.universe.size is None else min(j, self.universe.size)

    def nth_index(self, r: int) -> int:
        if r < 1 or (self.universe.size is not None and r > self.universe.size):
            raise IndexError("the universe has fewer elements")
        return r

    def intersection(self, other: Language) -> Language:
        self._same_universe(other)
        return other

    def difference(self, other: Language) -> Language:
        self._same_universe(other)
        if isinstance(other, WholeUniverse):
            return FiniteSet(self.universe, ()) if isinstance(self.universe, FiniteUniverse) \
                else _empty_like(self.universe)
        if isinstance(other, NatSet):
            if other.universe.offset:
                raise TypeError("X minus a NatSet includes noise symbols; not representable")
            return other.complement()
        if isinstance(other, DFALanguage):
            return other.complement()
        if isinstance(other, FiniteSet) and isinstance(self.universe, FiniteUniverse):
            return FiniteSet(self.universe, set(self.universe.elements) - other.members)
        raise TypeError(f"X \\ {type(other).__name__} is not representable")

    def union(self, other: Language) -> Language:
        self._same_universe(other)
        return self


def _empty_like(universe: Universe) -> Language:
    if isinstance(universe, Naturals):
        return NatSet((), universe)
    if isinstance(universe, Shortlex):
        return dfa_finite(universe, ())
    if isinstance(universe, CantorPairs):
        return PairSet({})
    return FiniteSet(universe, ())


# =============================================================================================
# Regular languages over Σ* (shortlex)
# =============================================================================================


@dataclass(frozen=True)
class DFA:
    """A complete deterministic finite automaton over ``alphabet``.

    ``delta[s][c]`` is the state reached from state s on letter c (an index into the alphabet);
    states are 0 … len(delta) − 1. A *partial* DFA (a missing transition) is refused."""

    alphabet: tuple[str, ...]
    delta: tuple[tuple[int, ...], ...]
    start: int
    accept: frozenset[int]

    def __post_init__(self) -> None:
        n = len(self.delta)
        if n == 0:
            raise ValueError("a DFA needs at least one state")
        if not 0 <= self.start < n:
            raise ValueError("the start state is not a state")
        if any(not 0 <= a < n for a in self.accept):
            raise ValueError("an accepting state is not a state")
        for s, row in enumerate(self.delta):
            if len(row) != len(self.alphabet):
                raise ValueError(f"partial DFA: state {s} has {len(row)} transitions for "
                                 f"{len(self.alphabet)} letters")
            if any(t is None or not 0 <= t < n for t in row):
                raise ValueError(f"partial DFA: state {s} has a missing or invalid transition")

    @classmethod
    def from_table(cls, alphabet: str | Sequence[str], table: Mapping[Any, Mapping[str, Any]],
                   start: Any, accept: Iterable[Any]) -> DFA:
        """Build from {state: {letter: next_state}} with arbitrary state names."""
        letters = tuple(alphabet)
        names = list(table)
        pos = {s: i for i, s in enumerate(names)}
        rows = []
        for s in names:
            row = []
            for c in letters:
                if c not in table[s]:
                    raise ValueError(f"partial DFA: no transition from state {s!r} on {c!r}")
                nxt = table[s][c]
                if nxt not in pos:
                    raise ValueError(f"partial DFA: transition to unknown state {nxt!r}")
                row.append(pos[nxt])
            rows.append(tuple(row))
        if start not in pos:
            raise ValueError(f"unknown start state {start!r}")
        acc = set(accept)
        unknown = acc - set(pos)
        if unknown:
            raise ValueError(f"unknown accepting states {sorted(map(str, unknown))}")
        return cls(letters, tuple(rows), pos[start], frozenset(pos[a] for a in acc))

    def run(self, word: str) -> int:
        s = self.start
        idx = {c: i for i, c in enumerate(self.alphabet)}
        for c in word:
            s = self.delta[s][idx[c]]
        return s


class DFALanguage(Language):
    """The language of a complete DFA, over Σ* in shortlex order."""

    def __init__(self, dfa: DFA, name: str = "") -> None:
        self.dfa = dfa
        self.universe = Shortlex(dfa.alphabet)
        self.name = name
        self._letter = {c: i for i, c in enumerate(dfa.alphabet)}
        self._counts: list[list[int]] = [[1 if s in dfa.accept else 0
                                          for s in range(len(dfa.delta))]]
        self._useful = self._useful_states()

    # cnt[ℓ][s] = number of accepted strings of length ℓ read from state s
    def _cnt(self, length: int) -> list[int]:
        d = self.dfa.delta
        while len(self._counts) <= length:
            prev = self._counts[-1]
            self._counts.append([sum(prev[t] for t in row) for row in d])
        return self._counts[length]

    def _useful_states(self) -> set[int]:
        d = self.dfa.delta
        reach = {self.dfa.start}
        stack = [self.dfa.start]
        while stack:
            s = stack.pop()
            for t in d[s]:
                if t not in reach:
                    reach.add(t)
                    stack.append(t)
        co = set(self.dfa.accept)
        changed = True
        while changed:
            changed = False
            for s in range(len(d)):
                if s not in co and any(t in co for t in d[s]):
                    co.add(s)
                    changed = True
        return reach & co

    def contains(self, u: Any) -> bool:
        if not isinstance(u, str) or any(c not in self._letter for c in u):
            return False
        return self.dfa.run(u) in self.dfa.accept

    @property
    def is_infinite(self) -> bool:
        useful = self._useful
        d = self.dfa.delta
        color: dict[int, int] = {}

        def cyclic(s: int) -> bool:  # iterative DFS for a cycle within useful states
            stack = [(s, iter(d[s]))]
            color[s] = 1
            while stack:
                node, it = stack[-1]
                for t in it:
                    if t not in useful:
                        continue
                    if color.get(t) == 1:
                        return True
                    if t not in color:
                        color[t] = 1
                        stack.append((t, iter(d[t])))
                        break
                else:
                    color[node] = 2
                    stack.pop()
            return False

        return any(s not in color and cyclic(s) for s in useful)

    @property
    def is_empty(self) -> bool:
        return self.dfa.start not in self._useful

    def _finite_size(self) -> int:
        n = len(self.dfa.delta)
        return sum(self._cnt(ell)[self.dfa.start] for ell in range(n))

    def count_length(self, length: int) -> int:
        """Number of members of the given length."""
        return self._cnt(length)[self.dfa.start]

    def count_upto(self, j: int) -> int:
        if j < 1:
            return 0
        w = self.universe.at(j)
        total = sum(self.count_length(ell) for ell in range(len(w)))
        s = self.dfa.start
        d = self.dfa.delta
        length = len(w)
        for p, c in enumerate(w):
            digit = self._letter[c]
            rest = self._cnt(length - p - 1)
            total += sum(rest[d[s][b]] for b in range(digit))
            s = d[s][digit]
        return total + (1 if s in self.dfa.accept else 0)

    def nth(self, r: int) -> str:
        if r < 1:
            raise IndexError("r must be >= 1")
        infinite = self.is_infinite
        if not infinite and r > self._finite_size():
            raise IndexError("the language has fewer elements")
        if infinite and r > self._members_upto_max_length():
            raise OverflowError(f"the element has more than {MAX_WORD_LENGTH} letters")
        length = 0
        while True:
            c = self.count_length(length)
            if r <= c:
                break
            r -= c
            length += 1
            if length > MAX_WORD_LENGTH:
                raise OverflowError(f"the element has more than {MAX_WORD_LENGTH} letters")
        s = self.dfa.start
        d = self.dfa.delta
        out = []
        for p in range(length):
            rest = self._cnt(length - p - 1)
            for b, letter in enumerate(self.dfa.alphabet):
                c = rest[d[s][b]]
                if r <= c:
                    out.append(letter)
                    s = d[s][b]
                    break
                r -= c
        return "".join(out)

    def nth_index(self, r: int) -> int:
        return self.universe.index(self.nth(r))

    def _members_upto_max_length(self) -> float:
        """The number of members with at most MAX_WORD_LENGTH letters, from the periodic counts
        when the language is slender (a*, (ab)*: r ~ 2⁶⁴ would otherwise walk 10⁵ lengths
        before overflowing); +inf (no shortcut) otherwise."""
        cached = getattr(self, "_upto_max", None)
        if cached is not None:
            return cached
        per = _periodic_counts(self)
        total: float = math.inf
        if per is not None:
            l0, p = per
            head = sum(self.count_length(ell) for ell in range(l0))
            period = [self.count_length(l0 + i) for i in range(p)]
            full, part = divmod(MAX_WORD_LENGTH + 1 - l0, p)
            total = head + full * sum(period) + sum(period[:part])
        self._upto_max = total
        return total

    # -- products -------------------------------------------------------------------------------
    def _product(self, other: Language, op: Callable[[bool, bool], bool]) -> DFALanguage:
        if isinstance(other, WholeUniverse):
            other = dfa_all(self.universe)
        if not isinstance(other, DFALanguage):
            raise TypeError(f"cannot combine a DFA language with {type(other).__name__}")
        self._same_universe(other)
        a, b = self.dfa, other.dfa
        start = (a.start, b.start)
        pos = {start: 0}
        order = [start]
        rows: list[tuple[int, ...]] = []
        i = 0
        while i < len(order):
            sa, sb = order[i]
            row = []
            for c in range(len(a.alphabet)):
                t = (a.delta[sa][c], b.delta[sb][c])
                if t not in pos:
                    pos[t] = len(order)
                    order.append(t)
                row.append(pos[t])
            rows.append(tuple(row))
            i += 1
        acc = frozenset(k for k, (sa, sb) in enumerate(order)
                        if op(sa in a.accept, sb in b.accept))
        return DFALanguage(DFA(a.alphabet, tuple(rows), 0, acc))

    def intersection(self, other: Language) -> DFALanguage:
        return self._product(other, lambda x, y: x and y)

    def union(self, other: Language) -> DFALanguage:
        return self._product(other, lambda x, y: x or y)

    def difference(self, other: Language) -> DFALanguage:
        return self._product(other, lambda x, y: x and not y)

    def complement(self) -> DFALanguage:
        a = self.dfa
        return DFALanguage(DFA(a.alphabet, a.delta, a.start,
                               frozenset(range(len(a.delta))) - a.accept))


def dfa_language(alphabet: str | Sequence[str], table: Mapping[Any, Mapping[str, Any]],
                 start: Any, accept: Iterable[Any], name: str = "") -> DFALanguage:
    """A regular language from a transition table {state: {letter: next}} (complete DFA)."""
    return DFALanguage(DFA.from_table(alphabet, table, start, accept), name=name)


def dfa_all(universe: Shortlex) -> DFALanguage:
    """Σ* as a one-state DFA."""
    return DFALanguage(DFA(universe.alphabet, ((0,) * universe.base,), 0, frozenset({0})), "Σ*")


def dfa_finite(universe: Shortlex, words: Iterable[str]) -> DFALanguage:
    """A finite set of words as a (trie) DFA."""
    letters = universe.alphabet
    idx = {c: i for i, c in enumerate(letters)}
    rows: list[list[int]] = [[-1] * len(letters)]  # state 0 = root; last state = sink
    accept = set()
    for w in words:
        universe.index(w)
        s = 0
        for c in w:
            nxt = rows[s][idx[c]]
            if nxt < 0:
                rows.append([-1] * len(letters))
                nxt = len(rows) - 1
                rows[s][idx[c]] = nxt
            s = nxt
        accept.add(s)
    sink = len(rows)
    rows.append([sink] * len(letters))
    table = tuple(tuple(sink if t < 0 else t for t in row) for row in rows)
    return DFALanguage(DFA(letters, table, 0, frozenset(accept)))


# =============================================================================================
# Subsets of ℕ₀² made of finitely many columns
# =============================================================================================


def _ymax(c: int, v: int) -> int:
    """max y ≥ 0 with π(c, y) ≤ v, or −1 when π(c, 0) > v."""
    if cantor_pair(c, 0) > v:
        return -1
    lo, hi = 0, 1
    while cantor_pair(c, hi) <= v:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if cantor_pair(c, mid) <= v:
            lo = mid
        else:
            hi = mid
    return lo


class PairSet(Language):
    """{(c, y) : y ∈ A_c} for finitely many columns c (each A_c a :class:`NatSet`)."""

    def __init__(self, columns: Mapping[int, NatSet], name: str = "") -> None:
        self.universe = CantorPairs()
        cols = {}
        for c, a in columns.items():
            if not isinstance(a, NatSet):
                raise TypeError("columns must be NatSets")
            if c < 0:
                raise ValueError("column indices are natural numbers")
            if not a.is_empty:
                cols[int(c)] = a.with_universe(Naturals()) if a.universe.offset else a
        self.columns = dict(sorted(cols.items()))
        self.name = name

    def contains(self, u: Any) -> bool:
        if not (isinstance(u, tuple) and len(u) == 2):
            return False
        a = self.columns.get(u[0])
        return a is not None and a.contains(u[1])

    @property
    def is_infinite(self) -> bool:
        return any(a.is_infinite for a in self.columns.values())

    @property
    def is_empty(self) -> bool:
        return not self.columns

    def _finite_size(self) -> int:
        return sum(int(a.size or 0) for a in self.columns.values())

    def count_upto(self, j: int) -> int:
        v = j - 1
        return sum(a.count_le(_ymax(c, v)) for c, a in self.columns.items())

    def nth_index(self, r: int) -> int:
        if r < 1:
            raise IndexError("r must be >= 1")
        if not self.is_infinite and r > self._finite_size():
            raise IndexError("the language has fewer elements")
        hi = 1
        while self.count_upto(hi) < r:
            hi *= 2
        lo = hi // 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.count_upto(mid) >= r:
                hi = mid
            else:
                lo = mid
        return hi

    def _combine(self, other: Language, op: str) -> PairSet:
        if isinstance(other, WholeUniverse):
            if op == "and":
                return self
            raise TypeError("X \\ PairSet is not representable")
        if not isinstance(other, PairSet):
            raise TypeError(f"cannot combine a PairSet with {type(other).__name__}")
        keys = set(self.columns) | set(other.columns)
        empty = NatSet(())
        out = {}
        for c in keys:
            a = self.columns.get(c, empty)
            b = other.columns.get(c, empty)
            out[c] = {"and": a.intersection, "or": a.union, "diff": a.difference}[op](b)
        return PairSet(out)

    def intersection(self, other: Language) -> PairSet:
        return self._combine(other, "and")

    def union(self, other: Language) -> PairSet:
        return self._combine(other, "or")

    def difference(self, other: Language) -> PairSet:
        return self._combine(other, "diff")


def column(c: int, values: NatSet) -> PairSet:
    """{(c, y) : y ∈ values}."""
    return PairSet({c: values})


def element_key(u: Any) -> Hashable:
    """A hashable key for an element (numpy scalars become ints)."""
    if isinstance(u, np.integer):
        return int(u)
    return u


def _periodic_counts(lang: DFALanguage, max_period: int = 720) -> tuple[int, int] | None:
    """(ℓ₀, p) with count_length(ℓ + p) = count_length(ℓ) for every ℓ ≥ ℓ₀, or None.

    The counts c(ℓ) = e_startᵀ Aℓ f_accept satisfy the linear recurrence of A's characteristic
    polynomial (order q = number of states), and so does c(ℓ + p) − c(ℓ); a sequence of that
    kind that vanishes at q consecutive ℓ vanishes from there on. So checking q consecutive
    lengths from ℓ₀ = q proves the periodicity (a slender language — boundedly many members
    per length, like a* or (ab)* — always has one)."""
    cached = getattr(lang, "_period", False)
    if cached is not False:
        return cached
    q = len(lang.dfa.delta)
    found = None
    for p in range(1, max_period + 1):
        if all(lang.count_length(q + i + p) == lang.count_length(q + i) for i in range(q)):
            found = (q, p)
            break
    lang._period = found  # type: ignore[attr-defined]
    return found


def count_sub_among_first(lang: Language, sub: Language, t: int) -> tuple[int, int]:
    """Bounds (lo, hi) on the number of members of ``sub`` ⊆ ``lang`` among the first t members
    of ``lang`` (in the universe's order); lo = hi whenever it is decided.

    Exact via the t-th member's position when it can be written out. Otherwise (a slender DFA
    language whose t-th member, t ~ n·2⁶⁴, has astronomically many letters) from the eventually
    periodic counts by length of ``lang`` and ``sub`` (:func:`_periodic_counts`): every length
    before the t-th member's length ℓ_t counts whole; within ℓ_t only the number of members
    (at most the slender bound) is known, so hi − lo ≤ count_length(ℓ_t) − |the part decided|."""
    if t <= 0:
        return 0, 0
    bracket = (_count_sub_periodic(lang, sub, t)
               if isinstance(lang, DFALanguage) and isinstance(sub, DFALanguage) else None)
    if bracket is not None and bracket[0] == bracket[1]:
        return bracket
    try:
        end = lang.nth_index(t)
    except OverflowError:
        if bracket is None:
            raise
        return bracket
    v = sub.count_upto(end)
    return v, v


def _count_sub_periodic(lang: DFALanguage, sub: DFALanguage, t: int) -> tuple[int, int] | None:
    """count_sub_among_first from the periodic counts by length (None: not slender, or the
    t-th member lies before the periodic part)."""
    pl, ps = _periodic_counts(lang), _periodic_counts(sub)
    if pl is None or ps is None:
        return None
    l0 = max(pl[0], ps[0])
    p = math.lcm(pl[1], ps[1])
    cl = [lang.count_length(ell) for ell in range(l0 + p)]
    cs = [sub.count_length(ell) for ell in range(l0 + p)]
    head_l, head_s = sum(cl[:l0]), sum(cs[:l0])
    per_l, per_s = sum(cl[l0:]), sum(cs[l0:])
    if t <= head_l or per_l == 0:
        return None
    k, rest = divmod(t - head_l - 1, per_l)  # k whole periods, then the (rest+1)-th member
    before_l, before_s = head_l + k * per_l, head_s + k * per_s
    for i in range(p):
        ell = l0 + i
        if rest < cl[ell]:
            s = rest + 1  # the t-th member is the s-th of its length
            lo = before_s + max(0, s - (cl[ell] - cs[ell]))
            hi = before_s + min(s, cs[ell])
            return lo, hi
        rest -= cl[ell]
        before_l += cl[ell]
        before_s += cs[ell]
    raise AssertionError("unreachable")

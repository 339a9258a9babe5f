"""Distributions over a universe, with exact support, pmf, error masses and samplers.

Spec 000 §5.1 asks for ``sample(n, rng)``, ``pmf(u)``, ``in_support(u)`` and an exact
``err_D(L) = Pr_{x~D}[x ∉ L]``; spec 001 §5.3 adds sufficient-statistic sampling for huge
stream lengths (``sample_counts``: the multiplicity of every element among n i.i.d. draws, by
sequential binomials, for n up to 2⁶²).

* :class:`FiniteDistribution` — finitely many atoms (exact everything).
* :class:`GeometricOver` — D(z_t) = (1 − q)·q^{t−1} on the enumeration z_1 < z_2 < … of an
  infinite language (the Remark 5.7 hard pair uses q = 1/2 on the odd and the even numbers; the
  "safe" AP family uses it on 3ℕ₀).
* :class:`LengthGeometric` — over Σ*: the length ℓ has probability ∝ q^ℓ among lengths with
  members, then a uniform member of that length (000 E10's "geometric-length distribution
  restricted to even #b").
* :class:`Mixture` — a finite mixture of the above with disjoint supports.

``err`` is exact for finite supports and a truncated series otherwise: the omitted tail has mass
below ``TAIL`` (1e−18), far below every error probability the lab reports through ``err``
(identification errors are computed from sufficient statistics, not from ``err`` sums).

Privacy contract: none — these are the *public* model distributions of the simulations; the lab
never fits a distribution to private data.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import numpy as np

from .languages import DFALanguage, Language, finite
from .universe import Naturals, Shortlex, Universe

__all__ = [
    "TAIL",
    "Distribution",
    "FiniteDistribution",
    "GeometricOver",
    "LengthGeometric",
    "Mixture",
]

#: mass of the tail a truncated series may omit
TAIL = 1e-18


class Distribution(ABC):
    """A probability distribution on a universe."""

    universe: Universe
    name: str = ""

    @abstractmethod
    def pmf(self, u: Any) -> float:
        """D(u)."""

    def in_support(self, u: Any) -> bool:
        return self.pmf(u) > 0

    @property
    @abstractmethod
    def support(self) -> Language:
        """supp D as an exact language."""

    @abstractmethod
    def atoms(self, max_terms: int | None = None) -> list[tuple[Any, float]]:
        """(element, probability) pairs in decreasing order of significance, until the omitted
        mass is below :data:`TAIL` (or ``max_terms`` pairs). :class:`LengthGeometric` stops at
        the first length with more than 4096 members; its ``err`` is exact by counting."""

    def err(self, language: Language) -> float:
        """err_D(L) = Pr_{x~D}[x ∉ L] (exact for finite support; tail < TAIL otherwise)."""
        return float(math.fsum(p for u, p in self.atoms() if not language.contains(u)))

    def mass(self, language: Language) -> float:
        """D(L)."""
        return float(math.fsum(p for u, p in self.atoms() if language.contains(u)))

    @abstractmethod
    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """n i.i.d. draws (int64 array over ℕ₀, object array otherwise)."""

    @abstractmethod
    def sample_counts(self, n: int, rng: np.random.Generator) -> dict[Any, int]:
        """Multiplicities of n i.i.d. draws ({element: count}, zero counts omitted)."""

    def describe(self) -> str:
        return self.name or type(self).__name__


def _as_array(values: list[Any], universe: Universe) -> np.ndarray:
    if isinstance(universe, Naturals) and all(isinstance(v, int | np.integer) for v in values):
        return np.asarray(values, dtype=np.int64)
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


def _sequential_counts(n: int, probs: list[float], rng: np.random.Generator) -> list[int]:
    """Multinomial counts by sequential binomials (exact for any n < 2⁶³)."""
    out = []
    remaining = int(n)
    rest = 1.0
    for p in probs:
        if remaining == 0:
            out.append(0)
            continue
        if rest <= 0:
            out.append(0)
            continue
        c = int(rng.binomial(remaining, min(1.0, p / rest)))
        out.append(c)
        remaining -= c
        rest -= p
    return out


class FiniteDistribution(Distribution):
    """Finitely many atoms {element: probability}."""

    def __init__(self, universe: Universe, probs: Mapping[Any, float], name: str = "") -> None:
        self.universe = universe
        items = [(u, float(p)) for u, p in probs.items() if p > 0]
        for u, p in items:
            universe.index(u)
            if not (p > 0 and math.isfinite(p)):
                raise ValueError("probabilities must be positive and finite")
        total = math.fsum(p for _, p in items)
        if abs(total - 1) > 1e-9:
            raise ValueError(f"probabilities sum to {total}, not 1")
        items.sort(key=lambda t: universe.index(t[0]))
        self._items = [(u, p / total) for u, p in items]
        self._pmf = dict(self._items)
        self._values = _as_array([u for u, _ in self._items], universe)
        self._probs = np.array([p for _, p in self._items])
        self._cum = np.cumsum(self._probs)
        self._support: Language | None = None
        self.name = name

    def pmf(self, u: Any) -> float:
        try:
            return self._pmf.get(u, 0.0)
        except TypeError:
            return 0.0

    @property
    def support(self) -> Language:
        if self._support is not None:
            return self._support
        elems = [u for u, _ in self._items]
        if isinstance(self.universe, Naturals) and any(isinstance(u, str) for u in elems):
            raise ValueError("a support with noise symbols is not a language of numbers")
        self._support = finite(elems, self.universe)
        return self._support

    def atoms(self, max_terms: int | None = None) -> list[tuple[Any, float]]:
        return list(self._items if max_terms is None else self._items[:max_terms])

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        if len(self._items) == 1:
            return np.repeat(self._values, n)
        idx = np.searchsorted(self._cum, rng.random(n) * self._cum[-1], side="right")
        return self._values[np.minimum(idx, len(self._items) - 1)]

    def sample_counts(self, n: int, rng: np.random.Generator) -> dict[Any, int]:
        counts = _sequential_counts(n, [p for _, p in self._items], rng)
        return {u: c for (u, _), c in zip(self._items, counts, strict=True) if c}


class GeometricOver(Distribution):
    """D(z_t) = (1 − q) q^{t−1} on the members z_1 < z_2 < … of an infinite language."""

    def __init__(self, language: Language, q: float, name: str = "") -> None:
        if not language.is_infinite:
            raise ValueError("a geometric distribution needs an infinite language")
        if not 0 < q < 1:
            raise ValueError("q must be in (0, 1)")
        self.language = language
        self.universe = language.universe
        self.q = float(q)
        self.name = name
        self._terms = max(1, math.ceil(math.log(TAIL) / math.log(self.q)))

    def pmf(self, u: Any) -> float:
        if not self.language.contains(u):
            return 0.0
        t = self.language.count_upto(self.universe.index(u))
        return (1 - self.q) * self.q ** (t - 1)

    @property
    def support(self) -> Language:
        return self.language

    def atoms(self, max_terms: int | None = None) -> list[tuple[Any, float]]:
        m = self._terms if max_terms is None else min(max_terms, self._terms)
        return [(self.language.nth(t), (1 - self.q) * self.q ** (t - 1)) for t in range(1, m + 1)]

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        ts = rng.geometric(1 - self.q, size=n)  # t ≥ 1 with P(t) = (1−q) q^{t−1}
        uniq, inv = np.unique(ts, return_inverse=True)
        table = _as_array([self.language.nth(int(t)) for t in uniq], self.universe)
        return table[inv] if n else table[:0]

    def sample_counts(self, n: int, rng: np.random.Generator) -> dict[Any, int]:
        out: dict[Any, int] = {}
        remaining = int(n)
        t = 1
        while remaining > 0:
            # P(t | ≥ t) = 1 − q for a geometric law (memoryless)
            c = int(rng.binomial(remaining, 1 - self.q))
            if c:
                out[self.language.nth(t)] = c
            remaining -= c
            t += 1
        return out


class LengthGeometric(Distribution):
    """Over Σ*: P(length ℓ) ∝ q^ℓ on lengths with members, then uniform within the length."""

    def __init__(self, language: DFALanguage, q: float, name: str = "",
                 max_length: int = 400) -> None:
        if not isinstance(language.universe, Shortlex) or not language.is_infinite:
            raise ValueError("LengthGeometric needs an infinite regular language over Σ*")
        if not 0 < q < 1:
            raise ValueError("q must be in (0, 1)")
        self.language = language
        self.universe = language.universe
        self.q = float(q)
        self.name = name
        lengths = [ell for ell in range(max_length) if language.count_length(ell) > 0]
        w = np.array([self.q**ell for ell in lengths])
        self._lengths = lengths
        self._plen = w / w.sum()
        self._before = {ell: sum(language.count_length(m) for m in range(ell))
                        for ell in lengths}

    def pmf(self, u: Any) -> float:
        if not self.language.contains(u):
            return 0.0
        ell = len(u)
        i = self._lengths.index(ell) if ell in self._lengths else None
        if i is None:
            return 0.0
        return float(self._plen[i]) / self.language.count_length(ell)

    @property
    def support(self) -> Language:
        return self.language

    def atoms(self, max_terms: int | None = None) -> list[tuple[Any, float]]:
        out: list[tuple[Any, float]] = []
        omitted = 1.0
        for ell, p in zip(self._lengths, self._plen, strict=True):
            c = self.language.count_length(ell)
            if c > 4096:
                break
            for r in range(c):
                out.append((self.language.nth(self._before[ell] + r + 1), float(p) / c))
            omitted -= float(p)
            if omitted < TAIL or (max_terms is not None and len(out) >= max_terms):
                break
        return out if max_terms is None else out[:max_terms]

    def err(self, language: Language) -> float:
        """Exact by counting: Σ_ℓ P(ℓ)·|supp ∩ Lᶜ of length ℓ| / |supp of length ℓ|."""
        if isinstance(language, DFALanguage):
            bad = self.language.difference(language)
            return float(math.fsum(float(p) * bad.count_length(ell) / self.language.count_length(
                ell) for ell, p in zip(self._lengths, self._plen, strict=True)))
        return super().err(language)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        li = rng.choice(len(self._lengths), size=n, p=self._plen)
        vals = []
        for i in li.tolist():
            ell = self._lengths[i]
            c = self.language.count_length(ell)
            r = int(rng.integers(0, c)) if c < 2**62 else int(rng.integers(0, 2**62))
            vals.append(self.language.nth(self._before[ell] + r + 1))
        return _as_array(vals, self.universe)

    def sample_counts(self, n: int, rng: np.random.Generator) -> dict[Any, int]:
        out: dict[Any, int] = {}
        for u in self.sample(n, rng).tolist():
            out[u] = out.get(u, 0) + 1
        return out


class Mixture(Distribution):
    """Σ_c w_c D_c with pairwise disjoint supports."""

    def __init__(self, components: list[tuple[float, Distribution]], name: str = "") -> None:
        if not components:
            raise ValueError("a mixture needs components")
        total = math.fsum(w for w, _ in components)
        if abs(total - 1) > 1e-9 or any(w <= 0 for w, _ in components):
            raise ValueError("mixture weights must be positive and sum to 1")
        self.components = [(w / total, d) for w, d in components]
        self.universe = components[0][1].universe
        self.name = name
        self._support: Language | None = None

    def pmf(self, u: Any) -> float:
        return float(math.fsum(w * d.pmf(u) for w, d in self.components))

    @property
    def support(self) -> Language:
        if self._support is None:
            sup = self.components[0][1].support
            for _, d in self.components[1:]:
                sup = sup.union(d.support)
            self._support = sup
        return self._support

    def atoms(self, max_terms: int | None = None) -> list[tuple[Any, float]]:
        out: list[tuple[Any, float]] = []
        for w, d in self.components:
            out.extend((u, w * p) for u, p in d.atoms())
        out.sort(key=lambda t: -t[1])
        return out if max_terms is None else out[:max_terms]

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        cum = np.cumsum([w for w, _ in self.components])
        comp = np.minimum(np.searchsorted(cum, rng.random(n) * cum[-1], side="right"),
                          len(self.components) - 1)
        parts = [d.sample(int(np.count_nonzero(comp == c)), rng)
                 for c, (_, d) in enumerate(self.components)]
        if all(p.dtype.kind in "iu" for p in parts):
            out = np.empty(n, dtype=np.int64)
        else:
            out = np.empty(n, dtype=object)
        for c, part in enumerate(parts):
            out[comp == c] = part
        return out

    def sample_counts(self, n: int, rng: np.random.Generator) -> dict[Any, int]:
        sizes = _sequential_counts(n, [w for w, _ in self.components], rng)
        out: dict[Any, int] = {}
        for (_, d), m in zip(self.components, sizes, strict=True):
            if m:
                for u, c in d.sample_counts(m, rng).items():
                    out[u] = out.get(u, 0) + c
        return out


def point(universe: Universe, u: Any) -> FiniteDistribution:
    """The point mass at u."""
    return FiniteDistribution(universe, {u: 1.0})

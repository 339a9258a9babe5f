"""Universes: countable sets of strings with a fixed, public enumeration u_1, u_2, ….

Both papers fix an enumeration of the universe X (spec 000 §1.1, spec 001 §1.1): the
generation algorithms output "the r-th element of a language beyond index m", the witness index
m* counts positions in it, and the limit algorithms order strings canonically. A universe here
is a bijection between positions j = 1, 2, … and elements, with ``at(j)`` and ``index(u)``.

* :class:`Naturals` — ℕ₀ = {0, 1, 2, …} with u_j = j − 1, optionally preceded by named noise
  symbols (``Naturals(noise=("#",))`` is ℕ₀ ∪ {#} with u_1 = "#", u_2 = 0, …): noise symbols are
  in no language built by :mod:`dplang.formal.languages`, which is what agnostic identification
  needs (spec 000 E2).
* :class:`Shortlex` — Σ* in shortlex order (length first, then lexicographic in the alphabet's
  order); bijective base-|Σ| numeration gives O(|u|) ``index`` and ``at``.
* :class:`CantorPairs` — ℕ₀² in Cantor order, π(x, y) = (x + y)(x + y + 1)/2 + y, u_j = π⁻¹(j − 1)
  (used by the "rows" collection and Cor C.4's disjoint union of Sperner collections).
* :class:`FiniteUniverse` — a finite tuple of symbols (``finite_universe(n, noise)`` gives
  {0, …, n − 1} followed by noise symbols).

All positions are Python ints (arbitrary precision): the generation algorithms reach positions
such as n·2⁶⁴.

Privacy contract: none — universes are public objects; nothing here reads data.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from typing import Any

__all__ = [
    "CantorPairs",
    "FiniteUniverse",
    "Naturals",
    "Shortlex",
    "Universe",
    "cantor_pair",
    "cantor_unpair",
    "finite_universe",
]


class Universe(ABC):
    """A countable set with a fixed enumeration u_1, u_2, … (1-based positions)."""

    #: number of elements, or None for a countably infinite universe
    size: int | None = None

    @abstractmethod
    def at(self, j: int) -> Any:
        """The element u_j at position j ≥ 1."""

    @abstractmethod
    def index(self, u: Any) -> int:
        """The position j of element u (so ``at(index(u)) == u``); ValueError if u ∉ X."""

    def contains(self, u: Any) -> bool:
        """True when u is an element of the universe."""
        try:
            self.index(u)
        except (ValueError, TypeError):
            return False
        return True

    def _check_position(self, j: int) -> int:
        if isinstance(j, bool) or not isinstance(j, int):
            try:
                j = int(j)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"position must be an integer, got {j!r}") from exc
        if j < 1:
            raise ValueError(f"positions are 1-based, got {j}")
        if self.size is not None and j > self.size:
            raise ValueError(f"position {j} beyond the universe's {self.size} elements")
        return j

    def describe(self) -> str:
        return type(self).__name__

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self._key() == other._key()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._key()))

    def _key(self) -> Hashable:
        return ()


class Naturals(Universe):
    """ℕ₀ in increasing order, optionally preceded by noise symbols (strings)."""

    def __init__(self, noise: Sequence[str] = ()) -> None:
        noise = tuple(noise)
        if len(set(noise)) != len(noise) or not all(isinstance(s, str) for s in noise):
            raise ValueError("noise symbols must be distinct strings")
        self.noise = noise
        self.offset = len(noise)

    def at(self, j: int) -> Any:
        j = self._check_position(j)
        if j <= self.offset:
            return self.noise[j - 1]
        return j - self.offset - 1

    def index(self, u: Any) -> int:
        if isinstance(u, str):
            if u in self.noise:
                return self.noise.index(u) + 1
            raise ValueError(f"{u!r} is not in {self.describe()}")
        if isinstance(u, bool):
            raise ValueError("booleans are not natural numbers")
        try:
            v = int(u)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{u!r} is not in {self.describe()}") from exc
        if v != u or v < 0:
            raise ValueError(f"{u!r} is not in {self.describe()}")
        return v + self.offset + 1

    def value_bound(self, j: int) -> int:
        """The largest number with position ≤ j (−1 when there is none)."""
        return j - self.offset - 1

    def describe(self) -> str:
        return "ℕ₀" + "".join(f" ∪ {{{s}}}" for s in self.noise)

    def _key(self) -> Hashable:
        return self.noise


class Shortlex(Universe):
    """Σ* in shortlex order: "", then strings of length 1, 2, … each in lexicographic order."""

    def __init__(self, alphabet: str | Sequence[str] = "ab") -> None:
        letters = tuple(alphabet)
        if not letters or len(set(letters)) != len(letters):
            raise ValueError("the alphabet must be a non-empty sequence of distinct letters")
        if not all(isinstance(c, str) and len(c) == 1 for c in letters):
            raise ValueError("letters must be single characters")
        self.alphabet = letters
        self.base = len(letters)
        self._digit = {c: i for i, c in enumerate(letters)}

    def at(self, j: int) -> str:
        j = self._check_position(j)
        # bijective base-b numeration of j − 1 (0 ↦ "")
        v = j - 1
        out: list[str] = []
        b = self.base
        while v > 0:
            v -= 1
            v, d = divmod(v, b)
            out.append(self.alphabet[d])
        return "".join(reversed(out))

    def index(self, u: Any) -> int:
        if not isinstance(u, str):
            raise ValueError(f"{u!r} is not a string")
        v = 0
        for c in u:
            d = self._digit.get(c)
            if d is None:
                raise ValueError(f"{u!r} has a letter outside the alphabet {self.alphabet}")
            v = v * self.base + d + 1
        return v + 1

    def first_index_of_length(self, length: int) -> int:
        """Position of the first string of the given length: 1 + Σ_{ℓ<length} b^ℓ."""
        b = self.base
        if b == 1:
            return length + 1
        return 1 + (b**length - 1) // (b - 1)

    def describe(self) -> str:
        return "{" + ",".join(self.alphabet) + "}* (shortlex)"

    def _key(self) -> Hashable:
        return self.alphabet


def cantor_pair(x: int, y: int) -> int:
    """π(x, y) = (x + y)(x + y + 1)/2 + y, a bijection ℕ₀² → ℕ₀."""
    s = x + y
    return s * (s + 1) // 2 + y


def cantor_unpair(z: int) -> tuple[int, int]:
    """The inverse of :func:`cantor_pair` (exact on big integers)."""
    s = (math.isqrt(8 * z + 1) - 1) // 2
    y = z - s * (s + 1) // 2
    return s - y, y


class CantorPairs(Universe):
    """ℕ₀² in Cantor order: u_j = π⁻¹(j − 1)."""

    def at(self, j: int) -> tuple[int, int]:
        j = self._check_position(j)
        return cantor_unpair(j - 1)

    def index(self, u: Any) -> int:
        if not (isinstance(u, tuple) and len(u) == 2):
            raise ValueError(f"{u!r} is not a pair")
        x, y = u
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (x, y)):
            raise ValueError(f"{u!r} is not a pair of natural numbers")
        return cantor_pair(x, y) + 1

    def describe(self) -> str:
        return "ℕ₀² (Cantor order)"


class FiniteUniverse(Universe):
    """A finite universe: the given symbols in the given order."""

    def __init__(self, elements: Sequence[Hashable]) -> None:
        elems = tuple(elements)
        if not elems:
            raise ValueError("a finite universe needs at least one element")
        if len(set(elems)) != len(elems):
            raise ValueError("universe elements must be distinct")
        self.elements = elems
        self.size = len(elems)
        self._pos = {e: i + 1 for i, e in enumerate(elems)}

    def at(self, j: int) -> Any:
        j = self._check_position(j)
        return self.elements[j - 1]

    def index(self, u: Any) -> int:
        try:
            return self._pos[u]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{u!r} is not in the universe") from exc

    def describe(self) -> str:
        return "{" + ", ".join(map(str, self.elements)) + "}"

    def _key(self) -> Hashable:
        return self.elements


def finite_universe(n: int, noise: Sequence[str] = ("#",)) -> FiniteUniverse:
    """{0, …, n − 1} followed by the noise symbols (spec 000 §5.1)."""
    if n < 0:
        raise ValueError("n must be >= 0")
    return FiniteUniverse((*range(n), *noise))

"""Collections 𝓛 = {L_1, L_2, …} (1-indexed, finite or lazily countable) and their oracles.

Index order matters to every algorithm of both papers (larger indices preferred by the margin
rule of 000, priorities and caps in 001), so a collection is a *sequence*, duplicates allowed.
Beyond ``collection[i]`` it answers the oracles the 001 algorithms are given (spec 001 §1.1):

* ``intersection(indices)`` — the closure Cl(𝓛′) = ∩_{i ∈ 𝓛′} L_i (Cl(∅) = X);
* ``closure_dimension()`` — the smallest d such that every finite closure has at most d elements
  (−1 when every closure is infinite); finite collections only — asking it of a countable one is
  an error (it is not computable from finitely many languages);
* ``M(k)`` — max_{a<b≤k} |L_a ∩ L_b| (``math.inf`` if some intersection is infinite), the public
  cap of 001 Algorithm 2;
* ``telltale(i)`` — Angluin tell-tales T_i, when the collection supplies them (001 Algorithm 3).

Families (builders): :func:`finite_collection`, :func:`countable`, :func:`sperner`,
:func:`padded_sperner`, :func:`thresholds_family`, :func:`ap_family`, :func:`rows_family`,
:func:`two_adic_family`, :func:`nested_segments_family`, :func:`dfa_demo_family`, and
:func:`disjoint_union_of_sperner` (001 Cor C.4).

Privacy contract: none — collections are public objects.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from typing import Any

from .languages import (
    Language,
    NatSet,
    PairSet,
    WholeUniverse,
    ap,
    cofinite,
    dfa_language,
    finite,
    residues,
    segment,
    threshold,
    two_adic,
)
from .universe import CantorPairs, Naturals, Universe

__all__ = [
    "Collection",
    "ap_family",
    "countable",
    "dfa_demo_family",
    "disjoint_union_of_sperner",
    "finite_collection",
    "nested_segments_family",
    "padded_sperner",
    "rows_family",
    "sperner",
    "sperner_sets",
    "thresholds_family",
    "two_adic_family",
]


class Collection:
    """A 1-indexed sequence of languages over one universe (finite or countable)."""

    def __init__(
        self,
        name: str,
        universe: Universe,
        languages: Sequence[Language] | None = None,
        factory: Callable[[int], Language] | None = None,
        *,
        pairwise_max: Callable[[int], float] | None = None,
        telltales: Callable[[int], frozenset[Any]] | None = None,
        telltales_valid: bool = True,
        closure_dim: int | None = None,
        description: str = "",
    ) -> None:
        if (languages is None) == (factory is None):
            raise ValueError("give either a finite list of languages or a factory")
        self.name = name
        self.universe = universe
        self._list = list(languages) if languages is not None else None
        self._factory = factory
        self._cache: dict[int, Language] = {}
        self._pairwise_max = pairwise_max
        self._telltales = telltales
        self.telltales_valid = telltales_valid
        self._closure_dim = closure_dim
        self.description = description
        if self._list is not None:
            if not self._list:
                raise ValueError("a collection needs at least one language")
            for lang in self._list:
                if lang.universe != universe:
                    raise ValueError("all languages must share the collection's universe")

    # -- access ---------------------------------------------------------------------------------
    @property
    def size(self) -> int | None:
        """|𝓛| for a finite collection, None for a countable one."""
        return None if self._list is None else len(self._list)

    @property
    def is_finite(self) -> bool:
        return self._list is not None

    def __getitem__(self, i: int) -> Language:
        if isinstance(i, bool) or not isinstance(i, int) or i < 1:
            raise IndexError(f"collections are 1-indexed, got {i!r}")
        if self._list is not None:
            if i > len(self._list):
                raise IndexError(f"{self.name} has {len(self._list)} languages, asked for {i}")
            return self._list[i - 1]
        lang = self._cache.get(i)
        if lang is None:
            assert self._factory is not None
            lang = self._factory(i)
            if lang.universe != self.universe:
                raise ValueError("the factory built a language over another universe")
            self._cache[i] = lang
        return lang

    def horizon(self, k: int) -> int:
        """K′ = min(K, |𝓛|): the range the algorithms actually search (spec 000 §2)."""
        if k < 1:
            raise ValueError("the horizon must be >= 1")
        return k if self._list is None else min(k, len(self._list))

    def first(self, k: int) -> list[Language]:
        """[L_1, …, L_K′]."""
        return [self[i] for i in range(1, self.horizon(k) + 1)]

    def __len__(self) -> int:
        if self._list is None:
            raise TypeError(f"{self.name} is countably infinite")
        return len(self._list)

    # -- closures -------------------------------------------------------------------------------
    def intersection(self, indices: Iterable[int]) -> Language:
        """Cl({L_i : i ∈ indices}); X for no indices."""
        idx = sorted(set(indices))
        if not idx:
            return WholeUniverse(self.universe)
        out = self[idx[0]]
        for i in idx[1:]:
            out = out.intersection(self[i])
        return out

    def closure_dimension(self) -> int:
        """The closure dimension d (LRT25): max size of a finite closure, −1 if none is finite.

        Finite collections only. Computed by a depth-first search over subcollections that stops
        at finite closures (a superset's closure is a subset, so it cannot be larger)."""
        if self._list is None:
            raise ValueError(f"closure_dimension of a countable collection ({self.name}) is "
                             "not computable; give a finite collection")
        if self._closure_dim is not None:
            return self._closure_dim
        k = len(self._list)
        if k > 20:
            raise ValueError(f"closure_dimension enumerates subcollections: k = {k} > 20")
        best = -1

        def visit(start: int, current: Language) -> None:
            nonlocal best
            for i in range(start, k):
                nxt = current.intersection(self._list[i])  # type: ignore[index]
                if nxt.is_infinite:
                    visit(i + 1, nxt)
                else:
                    best = max(best, int(nxt.size or 0))

        whole = WholeUniverse(self.universe)
        if not whole.is_infinite:
            best = max(best, int(whole.size or 0))
        visit(0, whole)
        self._closure_dim = best
        return best

    def computed_closure_dimension(self) -> int:
        """:meth:`closure_dimension` recomputed, ignoring a declared value (for tests)."""
        declared, self._closure_dim = self._closure_dim, None
        try:
            return self.closure_dimension()
        finally:
            if declared is not None:
                self._closure_dim = declared

    # -- pairwise intersections -----------------------------------------------------------------
    def M(self, k: int) -> float:
        """max_{1≤a<b≤k} |L_a ∩ L_b| (0 for k = 1; ``math.inf`` if some pair is infinite)."""
        if k < 1:
            raise ValueError("k must be >= 1")
        if self._pairwise_max is not None:
            return self._pairwise_max(k)
        return self.computed_M(k)

    def computed_M(self, k: int) -> float:
        best: float = 0
        langs = self.first(k)
        for a, b in itertools.combinations(langs, 2):
            inter = a.intersection(b)
            if inter.is_infinite:
                return math.inf
            best = max(best, int(inter.size or 0))
        return best

    @property
    def has_pairwise_max(self) -> bool:
        return self._pairwise_max is not None

    def finite_pairwise_intersections(self, k: int) -> bool:
        """Whether L_1..L_k have finite pairwise intersections (001 Thm C.5's condition)."""
        return math.isfinite(self.M(k))

    # -- tell-tales -----------------------------------------------------------------------------
    @property
    def has_telltales(self) -> bool:
        return self._telltales is not None

    def telltale(self, i: int) -> frozenset[Any]:
        """Angluin tell-tale T_i ⊆ L_i (finite); ValueError when none are supplied."""
        if self._telltales is None:
            raise ValueError(f"{self.name} supplies no tell-tales (001 Algorithm 3 needs them)")
        return self._telltales(i)

    def describe(self) -> str:
        size = "countable" if self._list is None else f"{len(self._list)} languages"
        return f"{self.name} ({size} over {self.universe.describe()})"

    def __repr__(self) -> str:
        return f"<Collection {self.describe()}>"


def finite_collection(name: str, languages: Sequence[Language], **kw: Any) -> Collection:
    """A finite collection (the universe is the first language's)."""
    return Collection(name, languages[0].universe, list(languages), **kw)


def countable(name: str, universe: Universe, factory: Callable[[int], Language],
              **kw: Any) -> Collection:
    """A countable collection L_i = factory(i), built lazily."""
    return Collection(name, universe, factory=factory, **kw)


# =============================================================================================
# Families
# =============================================================================================


@lru_cache(maxsize=64)
def sperner_sets(k: int) -> tuple[frozenset[int], ...]:
    """S_1, …, S_N: the ⌊k/2⌋-subsets of {1..k} in lexicographic order (N = C(k, ⌊k/2⌋))."""
    h = k // 2
    return tuple(frozenset(c) for c in itertools.combinations(range(1, k + 1), h))


def sperner(k: int, d: int = 0) -> Collection:
    """Sperner(k) (001 Thm C.3), padded with d common elements (Remark C.2).

    N = C(k, ⌊k/2⌋); residue class j ∈ [N] is {d + (j−1) + N t : t ≥ 0}, and
    L_i = {0, …, d−1} ∪ ⋃_{j : i ∈ S_j} class_j. Closures are infinite iff the subcollection has
    at most ⌊k/2⌋ languages, otherwise they are the d padding elements: closure dimension d
    (d = 0: every finite closure is empty)."""
    if k < 2:
        raise ValueError("Sperner(k) needs k >= 2")
    if d < 0:
        raise ValueError("the padding d must be >= 0")
    sets = sperner_sets(k)
    n_classes = len(sets)
    langs: list[Language] = []
    for i in range(1, k + 1):
        res = [(d + j) % n_classes for j, s in enumerate(sets) if i in s]
        lang = residues(n_classes, res, start=d)
        if d:
            lang = lang.union(segment(d))
        lang.name = f"L{i}"
        langs.append(lang)
    return Collection(f"sperner(k={k},d={d})", Naturals(), langs, closure_dim=d,
                      description=f"Sperner collection, N = C({k},{k // 2}) = {n_classes} classes"
                      + (f", padded with {d} common elements" if d else ""))


def padded_sperner(k: int, d: int) -> Collection:
    """Alias of :func:`sperner` with padding (001 Remark C.2)."""
    return sperner(k, d)


def sperner_class_element(k: int, j: int, t: int, d: int = 0) -> int:
    """The t-th (t ≥ 0) element of residue class j ∈ [N] of Sperner(k, d)."""
    n_classes = len(sperner_sets(k))
    if not 1 <= j <= n_classes:
        raise ValueError(f"class index must be in 1..{n_classes}")
    return d + (j - 1) + n_classes * t


def thresholds_family() -> Collection:
    """L_i = {x : x ≥ i − 1} (L_1 = ℕ₀), tell-tales T_i = {i − 1} (001 §3.3)."""
    return countable(
        "thresholds", Naturals(), lambda i: threshold(i - 1).named(f"{{x≥{i - 1}}}"),
        pairwise_max=lambda k: 0 if k == 1 else math.inf,
        telltales=lambda i: frozenset({i - 1}),
        description="thresholds L_i = {x ≥ i−1}: a chain (Thm 1.5 applies), Angluin with "
                    "T_i = {i−1}")


def non_angluin_family(telltale_size: int = 5) -> Collection:
    """{ℕ₀ (index 1)} ∪ {ℕ₀ ∖ {i − 2} : i ≥ 2}, with the (necessarily invalid) tell-tales
    T_1 = {0, …, telltale_size − 1}, T_i = ∅ (001 §6 claim 24)."""
    def lang(i: int) -> Language:
        return threshold(0).named("ℕ₀") if i == 1 else cofinite([i - 2])

    return countable(
        "non-angluin", Naturals(), lang,
        pairwise_max=lambda k: 0 if k == 1 else math.inf,
        telltales=lambda i: frozenset(range(telltale_size)) if i == 1 else frozenset(),
        telltales_valid=False,
        description="ℕ₀ and all ℕ₀∖{i}: no finite tell-tale for ℕ₀ exists (not Angluin)")


def ap_family(moduli: Sequence[int]) -> Collection:
    """All APs a + bℕ₀ with b in ``moduli`` and 0 ≤ a < b, in that order (finite)."""
    langs = [ap(a, b) for b in moduli for a in range(b)]
    return finite_collection(f"aps{tuple(moduli)}", langs)


def rows_family() -> Collection:
    """Rows in ℕ₀²: L_i = {(i, m) : m ≥ 0} ∪ {(0, m) : m < i}; |L_a ∩ L_b| = min(a, b), so
    M(k) = k − 1 (finite pairwise intersections; 001 §5.2 family 5)."""
    def lang(i: int) -> Language:
        cols = {i: threshold(0)}
        if i >= 1:
            cols[0] = segment(i)
        return PairSet(cols, name=f"row{i}")

    return countable("rows", CantorPairs(), lang, pairwise_max=lambda k: max(0, k - 1),
                     description="rows L_i = {(i,m)} ∪ {(0,m): m < i}, M(k) = k − 1")


def two_adic_family() -> Collection:
    """L_i = {2^i (2m + 1)}: pairwise disjoint, M ≡ 0."""
    return countable("two-adic", Naturals(), lambda i: two_adic(i),
                     pairwise_max=lambda k: 0,
                     description="2-adic classes 2^i(2ℕ₀+1), pairwise disjoint")


def nested_segments_family(noise: Sequence[str] = ("#",)) -> Collection:
    """L_i = {0, …, i − 1} over ℕ₀ ∪ {#} (000 E2)."""
    uni = Naturals(noise)
    return countable("nested-segments", uni, lambda i: segment(i, uni).named(f"{{0..{i - 1}}}"),
                     description="nested initial segments {0..i−1} with a noise symbol #")


def _two_state(alphabet: str, flip: str) -> dict[int, dict[str, int]]:
    return {0: {c: (1 if c == flip else 0) for c in alphabet},
            1: {c: (0 if c == flip else 1) for c in alphabet}}


def dfa_demo_family() -> Collection:
    """000 E10: DFAs over {a, b} for Σ*, "even #b", a*, (ab)*, "ends with a", "contains aa"."""
    sigma = dfa_language("ab", {0: {"a": 0, "b": 0}}, 0, [0], "Σ*")
    even_b = dfa_language("ab", _two_state("ab", "b"), 0, [0], "even #b")
    a_star = dfa_language("ab", {0: {"a": 0, "b": 1}, 1: {"a": 1, "b": 1}}, 0, [0], "a*")
    ab_star = dfa_language("ab", {0: {"a": 1, "b": 2}, 1: {"a": 2, "b": 0},
                                  2: {"a": 2, "b": 2}}, 0, [0], "(ab)*")
    ends_a = dfa_language("ab", {0: {"a": 1, "b": 0}, 1: {"a": 1, "b": 0}}, 0, [1],
                          "ends with a")
    has_aa = dfa_language("ab", {0: {"a": 1, "b": 0}, 1: {"a": 2, "b": 0},
                                 2: {"a": 2, "b": 2}}, 0, [2], "contains aa")
    return finite_collection("dfa-demo", [sigma, even_b, a_star, ab_star, ends_a, has_aa])


def disjoint_union_of_sperner(max_block: int | None = None) -> Collection:
    """001 Cor C.4: ⊔_k {L × {k} : L ∈ Sperner(k)} ⊆ ℕ₀², as columns (k, x).

    Enumerated block by block (k = 2, 3, …); closure dimension 0. ``max_block`` makes it finite
    (blocks 2..max_block)."""
    def locate(idx: int) -> tuple[int, int]:
        k = 2
        while idx > k:
            idx -= k
            k += 1
        return k, idx

    def lang(idx: int) -> Language:
        k, i = locate(idx)
        base = sperner(k)[i]
        assert isinstance(base, NatSet)
        return PairSet({k: base}, name=f"S{k}.L{i}")

    if max_block is not None:
        total = sum(range(2, max_block + 1))
        return Collection(f"sperner-union(≤{max_block})", CantorPairs(),
                          [lang(i) for i in range(1, total + 1)], closure_dim=0)
    return countable("sperner-union", CantorPairs(), lang,
                     description="disjoint union of Sperner(k) × {k}, closure dimension 0")


def remark_57_languages() -> tuple[Language, Language]:
    """L1 = {0} ∪ odds, L2 = {0} ∪ evens ≥ 2 (= the evens) (000 Remark 5.7)."""
    l1 = finite([0]).union(ap(1, 2))
    l1.name = "{0}∪odds"  # type: ignore[union-attr]
    l2 = ap(0, 2)
    l2.name = "evens"
    return l1, l2  # type: ignore[return-value]

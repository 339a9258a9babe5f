"""Ground truth and the named instances of the lab.

Ground truth is computed exactly from the public model (collection + distribution or target),
never read from the algorithms:

* identification (spec 000 §1.2): err_D(L_i) for i ≤ K′, the smallest optimal index i*, err*,
  and the least risk gap Δ = min_{j<i*} err_D(L_j) − err*;
* generation (000 §1.3): which L_i ⊆ supp D (good), the smallest good index i°, each bad
  language's first witness (the first position in L_i ∖ supp D), m* = the largest of those,
  J° = {j ≤ M : u_j ∈ L_{i°}} and ρ = min_{j∈J°} D(u_j) (ρ_n for a threshold horizon M̄);
* limit (001): the smallest index of the target, the closure dimension d (finite collections),
  M(k), the pairs meeting Thm 1.5's condition (|L_i ∩ L_j| = ∞ and |L_i ∖ L_j| < ∞), and whether
  the supplied tell-tales satisfy Angluin's condition among the first k languages.

Every quantity is restricted to the horizon the algorithms touch (the first k languages).

Named instances (:data:`INSTANCES`, :func:`instance`) bundle a collection with its
distributions or streams, defaults and the ground truth the specs state (``expected``); the
tests check that :func:`identification_truth` and :func:`generation_truth` reproduce it.

Privacy contract: none — ground truth is a property of the public simulation model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .collections import (
    Collection,
    countable,
    dfa_demo_family,
    finite_collection,
    nested_segments_family,
    non_angluin_family,
    remark_57_languages,
    rows_family,
    sperner,
    sperner_sets,
    thresholds_family,
    two_adic_family,
)
from .distributions import Distribution, FiniteDistribution, GeometricOver, LengthGeometric, Mixture
from .languages import (
    DFALanguage,
    FiniteSet,
    Language,
    ap,
    cofinite,
    finite,
    residues,
    segment,
    threshold,
)
from .streams import (
    CanonicalEnumeration,
    DuplicateHeavy,
    IIDStream,
    IntersectionFirst,
    Stream,
)
from .universe import FiniteUniverse, Naturals

__all__ = [
    "INSTANCES",
    "GenerationTruth",
    "IdentificationTruth",
    "Instance",
    "LimitTruth",
    "generation_truth",
    "identification_truth",
    "instance",
    "limit_truth",
    "rho_n",
    "thm15_pairs",
]

_TOL = 1e-12


# =============================================================================================
# Ground truth
# =============================================================================================


@dataclass(frozen=True)
class IdentificationTruth:
    """err_D(L_i) for i ≤ K′, i* (smallest optimal index), err*, Δ (None when i* = 1)."""

    errors: tuple[float, ...]
    i_star: int
    err_star: float
    gap: float | None

    @property
    def horizon(self) -> int:
        return len(self.errors)


def identification_truth(collection: Collection, distribution: Distribution,
                         k: int) -> IdentificationTruth:
    """Ground truth of identification over the first K′ = min(k, |𝓛|) languages.

    Assumption 3.1 (an attained optimum) is taken over the horizon; for a countable collection
    the instance must guarantee that no later language does better."""
    errs = tuple(distribution.err(lang) for lang in collection.first(k))
    best = min(errs)
    i_star = next(i for i, e in enumerate(errs, 1) if e <= best + _TOL)
    gap = None if i_star == 1 else min(errs[j] - best for j in range(i_star - 1))
    return IdentificationTruth(errs, i_star, best, gap)


@dataclass(frozen=True)
class GenerationTruth:
    """Good languages, i°, witnesses and m* over the horizon; J° and ρ for a window M."""

    good: tuple[bool, ...]
    i_circ: int | None
    witnesses: dict[int, int]
    m_star: float
    window: int | None = None
    J: tuple[int, ...] = ()
    rho: float | None = None

    @property
    def horizon(self) -> int:
        return len(self.good)


def generation_truth(collection: Collection, distribution: Distribution, k: int,
                     window: int | None = None) -> GenerationTruth:
    """Ground truth of generation over the first K′ languages (000 Def 4.1, Assumptions
    4.2–4.3, E.5). ``m_star`` is 1 when no language is bad (min over ℕ) and ``math.inf``
    never arises for finite horizons. With ``window`` = M: J° and ρ."""
    supp = distribution.support
    good: list[bool] = []
    witnesses: dict[int, int] = {}
    for i, lang in enumerate(collection.first(k), 1):
        bad_part = lang.difference(supp)
        if bad_part.is_empty:
            good.append(True)
        else:
            good.append(False)
            witnesses[i] = bad_part.nth_index(1)
    i_circ = next((i for i, g in enumerate(good, 1) if g), None)
    m_star: float = max(witnesses.values()) if witnesses else 1
    J: tuple[int, ...] = ()
    rho = None
    if window is not None and i_circ is not None:
        J, rho = _coverage(collection[i_circ], distribution, window)
    return GenerationTruth(tuple(good), i_circ, witnesses, m_star, window, J, rho)


def _coverage(lang: Language, distribution: Distribution,
              window: int) -> tuple[tuple[int, ...], float | None]:
    J = tuple(j for j in range(1, window + 1)
              if lang.contains(lang.universe.at(j)))
    if not J:
        return (), None
    return J, min(distribution.pmf(lang.universe.at(j)) for j in J)


def rho_n(collection: Collection, distribution: Distribution, i_circ: int,
          mbar: int) -> float | None:
    """ρ_n = min_{j ≤ M̄, u_j ∈ L_{i°}} D(u_j) (000 E.11); None when J°_n is empty."""
    return _coverage(collection[i_circ], distribution, mbar)[1]


@dataclass(frozen=True)
class LimitTruth:
    """The limit setting's ground truth for a target K = L_i (over the first k languages)."""

    target_index: int
    smallest_index: int
    closure_dimension: int | None
    pairwise_max: float
    thm15_pairs: tuple[tuple[int, int], ...]
    telltales_ok: bool | None


def thm15_pairs(collection: Collection, k: int) -> list[tuple[int, int]]:
    """Pairs (i, j), i ≠ j ≤ k, with |L_i ∩ L_j| = ∞ and |L_i ∖ L_j| < ∞ (001 Thm 1.5)."""
    langs = collection.first(k)
    out = []
    for i, a in enumerate(langs, 1):
        for j, b in enumerate(langs, 1):
            if i != j and a.intersection(b).is_infinite and not a.difference(b).is_infinite:
                out.append((i, j))
    return out


def limit_truth(collection: Collection, target_index: int, k: int) -> LimitTruth:
    """Ground truth for the limit setting (see :class:`LimitTruth`)."""
    target = collection[target_index]
    smallest = next(i for i in range(1, target_index + 1) if collection[i].equals(target))
    d = collection.closure_dimension() if collection.is_finite else None
    ok: bool | None = None
    if collection.has_telltales:
        ok = True
        langs = collection.first(k)
        for i, li in enumerate(langs, 1):
            tt = collection.telltale(i)
            if not all(li.contains(w) for w in tt):
                ok = False
                break
            for lj in langs:
                if all(lj.contains(w) for w in tt) and lj.issubset(li) and not li.issubset(lj):
                    ok = False
                    break
            if not ok:
                break
    return LimitTruth(target_index, smallest, d, collection.M(k),
                      tuple(thm15_pairs(collection, k)), ok)


# =============================================================================================
# Named instances
# =============================================================================================


@dataclass
class Instance:
    """A named public model: collection, distributions or streams, defaults, spec truth."""

    name: str
    description: str
    source: str
    settings: tuple[str, ...]
    collection: Collection
    distributions: dict[str, Distribution] = field(default_factory=dict)
    default_distribution: str | None = None
    target: int | None = None
    streams: dict[str, Callable[[int], Stream]] = field(default_factory=dict)
    default_stream: str | None = None
    defaults: dict[str, Any] = field(default_factory=dict)
    expected: dict[str, Any] = field(default_factory=dict)

    @property
    def distribution(self) -> Distribution:
        if self.default_distribution is None:
            raise ValueError(f"instance {self.name} has no distribution (limit setting)")
        return self.distributions[self.default_distribution]

    def stream(self, seed: int = 0, which: str | None = None) -> Stream:
        key = which or self.default_stream
        if key is None:
            raise ValueError(f"instance {self.name} has no stream (statistical setting)")
        return self.streams[key](seed)

    def summary(self) -> str:
        truth = ", ".join(f"{k}={v}" for k, v in self.expected.items())
        return f"{self.name}: {self.description} [{truth}]"


def _ipp_pair(p: float = 0.25) -> Instance:
    uni = FiniteUniverse(("z", "x", "y", "#"))
    l1 = FiniteSet(uni, {"z", "x"}, name="L1={z,x}")
    l2 = FiniteSet(uni, {"z", "y"}, name="L2={z,y}")
    coll = finite_collection("ipp-pair", [l1, l2])
    d1 = FiniteDistribution(uni, {"z": 1 - p, "x": p}, name=f"D1(z:{1 - p:g}, x:{p:g})")
    d2 = FiniteDistribution(uni, {"z": 1 - p, "y": p}, name=f"D2(z:{1 - p:g}, y:{p:g})")
    return Instance(
        "ipp-pair", "identification hard pair X = {z,x,y,#}, L1 = {z,x}, L2 = {z,y}",
        "000 Def F.3, E1, E3", ("statistical",), coll, {"D1": d1, "D2": d2}, "D2",
        defaults={"k": 8, "p": p},
        expected={"D2.i_star": 2, "D2.gap": p, "D2.err_star": 0.0, "D1.i_star": 1})


def _remark_57() -> Instance:
    l1, l2 = remark_57_languages()
    coll = finite_collection("remark-5.7", [l1, l2])
    odds, evens_pos = ap(1, 2), ap(2, 2)
    uni = Naturals()
    d1 = Mixture([(0.75, FiniteDistribution(uni, {0: 1.0})),
                  (0.25, GeometricOver(odds, 0.5))], name="D1(0:3/4, 2t−1:2^−t/4)")
    d2 = Mixture([(0.75, FiniteDistribution(uni, {0: 1.0})),
                  (0.25, GeometricOver(evens_pos, 0.5))], name="D2(0:3/4, 2t:2^−t/4)")
    return Instance(
        "remark-5.7", "generation hard pair L1 = {0} ∪ odds, L2 = evens over ℕ₀",
        "000 Remark 5.7, E4–E7", ("statistical",), coll, {"D1": d1, "D2": d2}, "D1",
        defaults={"k": 2, "M": 3},
        expected={"D1.i_circ": 1, "D1.m_star": 3, "D1.rho(M=3)": 1 / 8,
                  "D1.rho(M=6)": 1 / 32, "D1.rho(M=12)": 1 / 256,
                  "D2.i_circ": 2, "D2.m_star": 2})


def _nested_segments() -> Instance:
    coll = nested_segments_family()
    uni = coll.universe
    main = FiniteDistribution(uni, {"#": 0.2, 0: 0.4, 1: 0.4}, name="D(#:.2, 0:.4, 1:.4)")
    deep = FiniteDistribution(uni, {"#": 0.3, 0: 0.175, 1: 0.175, 2: 0.175, 3: 0.175},
                              name="D(#:.3, 0..3:.175)")
    return Instance(
        "nested-segments", "countable nested segments {0..i−1} with noise #; later indices tie",
        "000 E2", ("statistical",), coll, {"main": main, "deep": deep}, "main",
        defaults={"k": 8},
        expected={"main.i_star": 2, "main.gap": 0.4, "main.err_star": 0.2,
                  "deep.i_star": 4, "deep.gap": 0.175})


def _safe_ap() -> Instance:
    def lang(i: int) -> Language:
        if i == 1:
            return threshold(0).named("ℕ₀")
        b, odd = divmod(i, 2)
        base = ap(0, 3 * b)
        if odd:
            out = base.union(finite([1]))
            out.name = f"{{1}}∪{3 * b}ℕ₀"
            return out
        return base.named(f"{3 * b}ℕ₀")

    coll = countable("safe-ap", Naturals(), lang,
                     description="L_1 = ℕ₀, L_2b = 3bℕ₀ (good), L_2b+1 = {1} ∪ 3bℕ₀ (bad)")
    d = GeometricOver(ap(0, 3), 0.5, name="D(3t) = 2^−(t+1)")
    return Instance(
        "safe-ap", "countable AP family with a provable witness bound (m* = 2)",
        "000 §5.1 (L_1 = ℕ₀ added [RECON])", ("statistical",), coll, {"D": d}, "D",
        defaults={"k": 6, "M": 2},
        expected={"D.i_circ": 2, "D.m_star": 2, "D.rho(M=2)": 0.5})


def _dfa_demo() -> Instance:
    coll = dfa_demo_family()
    even_b = coll[2]
    assert isinstance(even_b, DFALanguage)
    d = LengthGeometric(even_b, 0.5, name="geometric length on even #b")
    return Instance(
        "dfa-demo", "DFAs over {a,b}: Σ*, even #b, a*, (ab)*, ends with a, contains aa",
        "000 E10", ("statistical",), coll, {"D": d}, "D",
        defaults={"k": 6, "M": 9},
        expected={"D.i_circ": 2, "D.m_star": 9, "sigma_star_witness": 3})


def _sperner(k: int = 4, d: int = 0) -> Instance:
    coll = sperner(k, d)
    n_classes = len(sperner_sets(k))
    cls_j = 1  # the class of S_1 = {1, …, ⌊k/2⌋}: L_1 contains it
    klass = residues(n_classes, [(d + cls_j - 1) % n_classes], start=d)

    def one_class(seed: int) -> Stream:
        """The d padding elements, then class 1 in order: its first n elements are the
        adversarial data of n_{2/3} (spec 001 §4.2(a): n distinct elements of one class, after
        the padding), a prefix of an enumeration of L_1 that lists the other classes later."""
        del seed
        return CanonicalEnumeration(klass.union(segment(d)) if d else klass, name="one-class")

    def intersection_first(seed: int) -> Stream:
        """All of L_1: class 1 densely, the rest of L_1 (the other classes, the padding) at
        t = 1, 2, 4, 8, … (at k = 4, n = 12: 8 elements of class 1 and 2 of each other)."""
        del seed
        return IntersectionFirst(coll[1], klass, name="intersection-first")

    return Instance(
        "sperner", f"Sperner({k}) residue collection (closure dimension {d})",
        "001 Thm C.3, §4.2(a)", ("limit",), coll, target=1,
        streams={"one-class": one_class, "intersection-first": intersection_first,
                 "canonical": lambda seed: CanonicalEnumeration(coll[1])},
        default_stream="one-class", defaults={"k": k, "d": d},
        expected={"d": d, "classes": n_classes})


def _thresholds(target: int = 3) -> Instance:
    coll = thresholds_family()
    tgt = coll[target]

    def iid(seed: int) -> Stream:
        return IIDStream(GeometricOver(tgt, 0.5), seed, name="iid geometric(1/2)")

    return Instance(
        "thresholds", "thresholds L_i = {x ≥ i−1} with tell-tales {i−1}",
        "001 §3.3, Thm 1.5, Thm 1.6", ("limit",), coll, target=target,
        streams={"iid": iid, "canonical": lambda seed: CanonicalEnumeration(tgt)},
        default_stream="iid", defaults={"k": 8},
        expected={"i_star": target, "thm15": True, "angluin": True})


def _non_angluin(target: int = 8, telltale_size: int = 5) -> Instance:
    coll = non_angluin_family(telltale_size)
    tgt = coll[target]

    def iid(seed: int) -> Stream:
        return IIDStream(GeometricOver(tgt, 0.5), seed, name="iid geometric(1/2)")

    return Instance(
        "non-angluin", "ℕ₀ and ℕ₀∖{i}: no finite tell-tale for ℕ₀",
        "001 §6 claim 24", ("limit",), coll, target=target,
        streams={"iid": iid, "canonical": lambda seed: CanonicalEnumeration(tgt)},
        default_stream="iid", defaults={"k": 10},
        expected={"i_star": target, "angluin": False})


def _rows(target: int = 3) -> Instance:
    coll = rows_family()
    tgt = coll[target]
    return Instance(
        "rows", "rows in ℕ₀²: finite pairwise intersections, M(k) = k − 1",
        "001 Thm C.5, §5.2", ("limit",), coll, target=target,
        streams={"canonical": lambda seed: CanonicalEnumeration(tgt)},
        default_stream="canonical", defaults={"k": 8},
        expected={"i_star": target, "M(5)": 4})


def _dup_heavy() -> Instance:
    l1, evens = remark_57_languages()

    def lang(i: int) -> Language:
        if i == 1:
            return l1
        if i == 2:
            return evens
        return residues(2**i, [0]).named(f"{2**i}ℕ₀")

    coll = countable("dup-heavy", Naturals(), lang,
                     description="L1 = {0} ∪ odds, L2 = evens (target), L_i = 2^iℕ₀")
    return Instance(
        "dup-heavy", "001 E2 probe: a valid but duplicate-heavy enumeration of the evens",
        "001 erratum E2, §4.2(d)", ("limit",), coll, target=2,
        streams={"duplicate-heavy": lambda seed: DuplicateHeavy(evens),
                 "canonical": lambda seed: CanonicalEnumeration(evens)},
        default_stream="duplicate-heavy", defaults={"k": 20},
        expected={"i_star": 2, "duplicate_free": False})


def _aps(target: int = 5) -> Instance:
    def ab(i: int) -> tuple[int, int]:
        b = 1
        while i > b:
            i -= b
            b += 1
        return i - 1, b

    coll = countable("aps", Naturals(), lambda i: ap(*ab(i)),
                     description="all residue classes a + bℕ₀ (0 ≤ a < b), ordered by b then a")
    tgt = coll[target]
    return Instance(
        "aps", "countable collection of all residue classes (nested pairs such as 2ℕ₀ ⊋ 4ℕ₀)",
        "001 §5.6 E1", ("limit",), coll, target=target,
        streams={"canonical": lambda seed: CanonicalEnumeration(tgt)},
        default_stream="canonical", defaults={"k": 12},
        expected={"i_star": target})


def _nat_pair() -> Instance:
    coll = finite_collection("nat-pair", [threshold(0).named("ℕ₀"), cofinite([0])],
                             telltales=lambda i: frozenset({0}) if i == 1 else frozenset())
    return Instance(
        "nat-pair", "{ℕ₀, ℕ₀∖{0}}: Thm 1.5's smallest barrier",
        "001 Thm 1.5, §5.6 E7", ("limit",), coll, target=1,
        streams={"canonical": lambda seed: CanonicalEnumeration(coll[1])},
        default_stream="canonical", defaults={"k": 2},
        expected={"i_star": 1, "thm15": True})


def _two_adic(target: int = 2) -> Instance:
    coll = two_adic_family()
    tgt = coll[target]
    return Instance(
        "two-adic", "2-adic classes 2^i(2ℕ₀+1): pairwise disjoint (M ≡ 0)",
        "001 §5.2 family 5", ("limit",), coll, target=target,
        streams={"canonical": lambda seed: CanonicalEnumeration(tgt)},
        default_stream="canonical", defaults={"k": 8},
        expected={"i_star": target, "M(5)": 0})


INSTANCES: dict[str, Callable[..., Instance]] = {
    "ipp-pair": _ipp_pair,
    "remark-5.7": _remark_57,
    "nested-segments": _nested_segments,
    "safe-ap": _safe_ap,
    "dfa-demo": _dfa_demo,
    "sperner": _sperner,
    "thresholds": _thresholds,
    "non-angluin": _non_angluin,
    "rows": _rows,
    "dup-heavy": _dup_heavy,
    "aps": _aps,
    "nat-pair": _nat_pair,
    "two-adic": _two_adic,
}


def instance(name: str, **params: Any) -> Instance:
    """Build a named instance (ValueError for an unknown name)."""
    try:
        factory = INSTANCES[name]
    except KeyError:
        raise ValueError(f"unknown instance {name!r}; choose one of "
                         f"{', '.join(INSTANCES)}") from None
    return factory(**params)

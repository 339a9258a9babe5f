"""Canaries: what a private generation leaks, and what the guarantee allows.

Synthetic *canary* sentences (improbable, so that a model does not produce them by itself) are
inserted into some references of a copy of the data set: each canary to ``m`` distinct references
(m = 1 for "a phrase one person wrote", m = 2, 5, 20, ... for "a phrase many people wrote").
Generating from the data with and without the canaries and counting, per canary, the generations
that contain it verbatim or near-verbatim (word n-gram overlap) gives an empirical privacy check
of the whole pipeline, next to the bound the guarantee implies.

The bounds. Inserting a canary into a reference turns that reference into another non-empty
reference. Under ``replace-by-null`` adjacency (every generation method's, and
``zero-out``) the neighbours of a reference are the *empty* reference, so r → r' is two
neighbouring steps (r → ∅ → r'), and the mechanism's analysis is tight about it: InvisibleInk's
clipped differences lie in [−C, C], so replacing r by r' moves the batch aggregate by up to
2C/B, twice the C/B of r → ∅ (docs/privacy.md, "InvisibleInk accounting"), i.e. 4ρ = 2²ρ. A
canary in ``m`` references is therefore a group of ``k = 2m`` (``k = m`` under
``replace-one``; it would also be ``m`` if the run without the canary emptied those rows
instead of keeping their original text). ρ-zCDP gives k²ρ-zCDP for groups of size k (Bun &
Steinke 2016, Prop. 1.9), hence (ε, δ_k(ε))-DP for every ε ≥ 0 with δ_k from the tight
conversion (:func:`dplang.privacy.accounting.rho_to_delta`). For the event "a generation
contains the canary" (a post-processing of the release), and by linearity for the expected
rate over generations,

    P_with ≤ min_ε [ e^ε · P_without + δ_k(ε) ]          (:func:`emission_bound`, "group").

A tighter bound uses what the release's guarantee rests on: parallel composition over
disjoint batches formed without reading the texts (docs/privacy.md, "Composition"). A
generation whose batch holds none of the canary's rows has the same distribution with and
without it; generation j whose batch holds c_j ≥ 1 of them is a group of 2c_j for its own
ρ-zCDP mechanism. With A the affected generations among n and p the rate without,

    rate_with ≤ p + (1/n) · min(|A|, (e^ε − 1)·min(n·p, |A|) + Σ_{j∈A} δ_{2c_j}(ε))

for every ε (:func:`parallel_bound`, "per generation"): a canary in one reference can move at
most one generation in n.

Several canaries are inserted in one run (two runs per ε instead of one per canary). The data
with all of them and the data without any differ in every canary's rows, so the comparison
for canary X is made against the data with every canary *but* X: when no batch holds rows of
two canaries (:func:`make_canaries` with ``batch_size``), a run on those data is, generation by
generation, the run with the canaries where X is absent from the batch and the run without
them where X is present (same seed, own random stream per generation; :func:`canary_table`
with ``batches``), so both bounds hold for X with its own m.

``P_without`` is unknown; both bounds plug in a one-sided Clopper–Pearson upper confidence
bound on it from the generations without the canary (an observed zero does not mean a zero
probability).

Privacy contract: this module computes statistics of generations from private data (and of the
canary rows it chose); they are not DP releases. Files describing them are written mode 600
(:func:`write_canary_report`). The choice of canary texts and rows is public (a seeded function
of the row count, never of the content).
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dplang.privacy.accounting import rho_to_delta

__all__ = [
    "DEFAULT_NEAR_THRESHOLD",
    "DEFAULT_NGRAM",
    "Canary",
    "CanaryCount",
    "canary_table",
    "count_occurrences",
    "emission_bound",
    "group_size",
    "insert_canaries",
    "make_canaries",
    "ngram_overlap",
    "normalise_words",
    "parallel_bound",
    "rate_interval",
    "upper_confidence",
    "write_canary_report",
]

#: Word n-gram length for near-verbatim matching.
DEFAULT_NGRAM = 3
#: A generation contains a canary near-verbatim when at least this fraction of the canary's word
#: n-grams occur in it.
DEFAULT_NEAR_THRESHOLD = 0.5

_NAMES = ["Zorblat", "Quennifer", "Mirovask", "Tullibrand", "Oskavelle", "Pribbledon",
          "Vantorique", "Elsquith", "Drummarock", "Fenwhistle", "Gastrovian", "Hollibrook"]
_NUMBERS = ["seventeen", "forty-three", "ninety-one", "twenty-six", "eighty-eight", "sixty-two"]
_COLOURS = ["violet", "turquoise", "ochre", "magenta", "silver", "crimson", "amber"]
_ANIMALS = ["ferrets", "axolotls", "llamas", "herons", "tortoises", "pangolins", "marmots"]
_PLACES = ["laundromat", "observatory", "greenhouse", "boathouse", "planetarium", "bell tower"]


@dataclass(frozen=True)
class Canary:
    """One canary: its sentence and the (0-based) rows of the data set it was inserted into."""

    text: str
    rows: tuple[int, ...]

    @property
    def repeats(self) -> int:
        """m: the number of references holding the canary."""
        return len(self.rows)


def make_canaries(repeats: Sequence[int], n_rows: int, *, seed: int = 0,
                  batch_size: int | None = None) -> list[Canary]:
    """One improbable sentence per entry of ``repeats``, placed in that many distinct rows.

    Rows are drawn (seeded) without replacement across all canaries, so no reference holds two
    canaries; the choice depends only on ``(repeats, n_rows, seed, batch_size)``, never on the
    data. With ``batch_size`` B (the generation's batches are consecutive chunks of B rows) no
    *batch* holds rows of two canaries either: each canary gets ⌈m/B⌉ whole batches, drawn at
    random, and m of their rows (every one of its batches holds at least one), so that the
    other canaries cannot move the generations that read it (:func:`canary_table`). Raises
    ``ValueError`` when the rows (or batches) do not suffice."""
    if any(m < 1 for m in repeats):
        raise ValueError("every canary needs at least one reference")
    if sum(repeats) > n_rows:
        raise ValueError(f"{sum(repeats)} canary rows asked for, the data set has {n_rows}")
    rng = random.Random(seed)
    if batch_size is None:
        drawn = rng.sample(range(n_rows), sum(repeats))
        chosen, start = [], 0
        for m in repeats:
            chosen.append(drawn[start:start + m])
            start += m
    else:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        need = [math.ceil(m / batch_size) for m in repeats]
        batches = n_rows // batch_size
        if sum(need) > batches:
            raise ValueError(f"the canaries need {sum(need)} whole batches of B = {batch_size} "
                             f"(no batch holds two canaries) but {n_rows} rows make {batches}")
        order = rng.sample(range(batches), sum(need))
        chosen, start = [], 0
        for m, b in zip(repeats, need, strict=True):
            pool = [j * batch_size + r for j in order[start:start + b]
                    for r in range(batch_size)]
            chosen.append(rng.sample(pool, m))
            start += b
    used: set[str] = set()
    out: list[Canary] = []
    for rows in chosen:
        while True:
            text = (f"My neighbour {rng.choice(_NAMES)} keeps {rng.choice(_NUMBERS)} "
                    f"{rng.choice(_COLOURS)} {rng.choice(_ANIMALS)} in the "
                    f"{rng.choice(_PLACES)}.")
            if text not in used:
                used.add(text)
                break
        out.append(Canary(text, tuple(sorted(rows))))
    return out


def insert_canaries(texts: Sequence[str], canaries: Sequence[Canary], *,
                    position: str = "start") -> list[str]:
    """A copy of ``texts`` with each canary inserted into its rows, as the first sentence
    (``position="start"``, the default: references are truncated to their first tokens before
    they enter the prompt, which could cut a canary at the end) or the last (``"end"``)."""
    if position not in ("start", "end"):
        raise ValueError("position must be 'start' or 'end'")
    out = list(texts)
    for canary in canaries:
        for row in canary.rows:
            if not 0 <= row < len(out):
                raise ValueError(f"canary row {row} outside the {len(out)} texts")
            parts = [canary.text, out[row].strip()] if position == "start" else [
                out[row].strip(), canary.text]
            out[row] = " ".join(p for p in parts if p)
    return out


_WORD = re.compile(r"[a-z0-9]+(?:[-'][a-z0-9]+)*")


def normalise_words(text: str) -> list[str]:
    """Lower-cased words (letters, digits, inner hyphens/apostrophes); punctuation dropped."""
    return _WORD.findall(text.lower())


def _ngrams(words: Sequence[str], n: int) -> set[tuple[str, ...]]:
    if len(words) < n:
        return {tuple(words)} if words else set()
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def ngram_overlap(canary: str, text: str, n: int = DEFAULT_NGRAM) -> float:
    """Fraction of the canary's word n-grams that occur in ``text`` (0 to 1)."""
    grams = _ngrams(normalise_words(canary), n)
    if not grams:
        raise ValueError("a canary needs at least one word")
    have = _ngrams(normalise_words(text), n)
    return len(grams & have) / len(grams)


def _verbatim(canary: str, text: str) -> bool:
    c = " ".join(normalise_words(canary))
    return f" {c} " in f" {' '.join(normalise_words(text))} "


@dataclass(frozen=True)
class CanaryCount:
    """Occurrences of one canary in a set of generations."""

    generations: int
    verbatim: int
    near: int
    max_overlap: float


def count_occurrences(canary: str, outputs: Sequence[str], *, n: int = DEFAULT_NGRAM,
                      threshold: float = DEFAULT_NEAR_THRESHOLD) -> CanaryCount:
    """Generations containing ``canary`` verbatim (its words in order, case and punctuation
    ignored) and near-verbatim (n-gram overlap ≥ ``threshold``; verbatim ones included)."""
    overlaps = [ngram_overlap(canary, t, n) for t in outputs]
    return CanaryCount(
        generations=len(outputs),
        verbatim=sum(_verbatim(canary, t) for t in outputs),
        near=sum(o >= threshold for o in overlaps),
        max_overlap=max(overlaps, default=0.0),
    )


def group_size(repeats: int, adjacency: str = "replace-by-null") -> int:
    """Neighbouring steps between the data with and without a canary inserted into ``repeats``
    references: 2 per reference under replace-by-null / zero-out, 1 under replace-one."""
    if adjacency in ("replace-by-null", "zero-out"):
        return 2 * repeats
    if adjacency == "replace-one":
        return repeats
    raise ValueError(f"no group bound for adjacency {adjacency!r}")


def upper_confidence(count: int, total: int, confidence: float = 0.95) -> float:
    """One-sided Clopper–Pearson upper bound on a binomial probability (1 when total = 0)."""
    if total <= 0 or count >= total:
        return 1.0
    from scipy.stats import beta

    return float(beta.ppf(confidence, count + 1, total - count))


def rate_interval(count: int, total: int, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided Clopper–Pearson interval of a binomial rate (``(0, 1)`` when total = 0)."""
    if total <= 0:
        return 0.0, 1.0
    from scipy.stats import beta

    alpha = (1.0 - confidence) / 2.0
    low = 0.0 if count == 0 else float(beta.ppf(alpha, count, total - count + 1))
    high = 1.0 if count >= total else float(beta.ppf(1.0 - alpha, count + 1, total - count))
    return low, high


def _minimise(value: Callable[[float], float], rho_max: float) -> float:
    """The ε ≥ 0 minimising ``value`` (a bound of the form e^ε·p + δ(ε), which falls and then
    rises): a log-spaced grid up to where δ of ``rho_max`` is negligible, then a local
    refinement."""
    hi = rho_max + 2.0 * math.sqrt(rho_max * math.log(1e12)) + 1.0
    grid = [0.0] + [hi * 10 ** (-6 + 6 * i / 200) for i in range(201)]
    best = min(grid, key=value)
    from scipy.optimize import minimize_scalar

    lo_e, hi_e = max(0.0, best / 1.2 - 1e-3), best * 1.2 + 1e-3
    res = minimize_scalar(value, bounds=(lo_e, hi_e), method="bounded",
                          options={"xatol": 1e-9})
    return float(res.x) if value(float(res.x)) <= value(best) else best


def emission_bound(rho: float, repeats: int, p_without: float, *,
                   adjacency: str = "replace-by-null") -> dict[str, float]:
    """The bound ρ-zCDP implies on P_with for a canary in ``repeats`` references, for the
    whole release (group privacy): ``min_ε e^ε·p_without + δ_k(ε)`` with
    ``k = group_size(repeats)`` and group ρ_k = k²ρ.

    Returns ``bound`` (capped at 1), the minimising ``epsilon`` and ``delta`` and ``rho_group``.
    """
    if not 0 <= p_without <= 1:
        raise ValueError("p_without must be a probability")
    k = group_size(repeats, adjacency)
    rho_k = k * k * rho
    if rho_k == 0:
        return {"bound": p_without, "epsilon": 0.0, "delta": 0.0, "rho_group": 0.0}

    def value(eps: float) -> float:
        return min(1.0, math.exp(min(eps, 700.0)) * p_without + rho_to_delta(rho_k, eps))

    eps = _minimise(value, rho_k)
    return {"bound": value(eps), "epsilon": eps, "delta": rho_to_delta(rho_k, eps),
            "rho_group": rho_k}


def parallel_bound(rho: float, per_generation: Sequence[int], p_without: float, *,
                   adjacency: str = "replace-by-null") -> dict[str, float]:
    """The bound on the expected rate of generations containing a canary when each
    generation reads only its own batch (parallel composition; module docstring):
    ``per_generation[j]`` is the number of the canary's rows in generation j's batch, and
    generation j is a ρ-zCDP mechanism of its batch.

    Returns ``bound`` (capped at 1), the minimising ``epsilon`` and ``affected`` (generations
    whose batch holds the canary)."""
    if not 0 <= p_without <= 1:
        raise ValueError("p_without must be a probability")
    n = len(per_generation)
    if n == 0:
        raise ValueError("no generations")
    affected = [c for c in per_generation if c > 0]
    if not affected or rho == 0:
        return {"bound": p_without, "epsilon": 0.0, "affected": len(affected)}
    groups: dict[int, int] = {}
    for c in affected:
        k = group_size(c, adjacency)
        groups[k] = groups.get(k, 0) + 1
    a = len(affected)
    mass = min(n * p_without, float(a))

    def value(eps: float) -> float:
        deltas = sum(count * rho_to_delta(k * k * rho, eps) for k, count in groups.items())
        extra = min(float(a), math.expm1(min(eps, 700.0)) * mass + deltas)
        return min(1.0, p_without + extra / n)

    eps = _minimise(value, max(groups) ** 2 * rho)
    return {"bound": value(eps), "epsilon": eps, "affected": a}


def canary_table(canaries: Sequence[Canary], with_outputs: Sequence[str],
                 without_outputs: Sequence[str], rho: float, *,
                 batches: Sequence[Sequence[int]] | None = None,
                 adjacency: str = "replace-by-null", n: int = DEFAULT_NGRAM,
                 threshold: float = DEFAULT_NEAR_THRESHOLD,
                 confidence: float = 0.95) -> list[dict[str, Any]]:
    """One row per canary: its repeats m, occurrences (verbatim, near) with and without it,
    the observed near-verbatim rate with it (and its two-sided ``confidence`` interval), and
    the bounds on that rate implied by ρ given a ``confidence`` upper bound on the rate
    without it: ``bound_rate_with`` for the whole release (a group of k = 2m) and, with
    ``batches``, ``bound_parallel`` per generation (:func:`parallel_bound`).

    ``batches`` (generation j's reference rows, in the order of both output lists, which must
    come from the same seed) makes the comparison exact when several canaries were inserted
    together: a batch must hold rows of at most one canary (:func:`make_canaries` with
    ``batch_size``; refused otherwise), and the rate "without" canary X is then counted on the
    data with every *other* canary (generation j from the run with the canaries where j's
    batch holds none of X's rows, from the run without them where it does): by parallel
    composition that is a run on the canaries' data minus X, the neighbour group of X. Without
    ``batches`` the rate without is the run without any canary, and the bounds hold for one
    canary per run only (several canaries inserted together are a group of all their rows).
    """
    if batches is not None:
        if len(batches) != len(with_outputs) or len(batches) != len(without_outputs):
            raise ValueError("batches must give the reference rows of every generation")
        owner = {row: i for i, c in enumerate(canaries) for row in c.rows}
        for j, batch in enumerate(batches):
            if len({owner[r] for r in batch if r in owner}) > 1:
                raise ValueError(f"generation {j}'s batch holds rows of two canaries: the "
                                 "bounds need one canary per batch "
                                 "(make_canaries(..., batch_size=B))")
    rows = []
    for c in canaries:
        w = count_occurrences(c.text, with_outputs, n=n, threshold=threshold)
        wo = count_occurrences(c.text, without_outputs, n=n, threshold=threshold)
        base, per_generation = wo, None
        if batches is not None:
            mine = set(c.rows)
            per_generation = [len(mine.intersection(b)) for b in batches]
            if sum(per_generation) != c.repeats:
                raise ValueError(f"canary rows {sorted(mine)} are not all in the batches of "
                                 "the generations: the insertion missed the references used")
            hybrid = [without_outputs[j] if k else with_outputs[j]
                      for j, k in enumerate(per_generation)]
            base = count_occurrences(c.text, hybrid, n=n, threshold=threshold)
        p_wo = upper_confidence(base.near, base.generations, confidence)
        bound = emission_bound(rho, c.repeats, p_wo, adjacency=adjacency)
        row = {
            "canary": c.text, "repeats": c.repeats, "rows": list(c.rows),
            "group_size": group_size(c.repeats, adjacency),
            "with": asdict(w), "without": asdict(wo), "baseline": asdict(base),
            "rate_with": w.near / w.generations if w.generations else None,
            "rate_with_interval": list(rate_interval(w.near, w.generations, confidence)),
            "verbatim_rate_with": w.verbatim / w.generations if w.generations else None,
            "p_without_upper": p_wo,
            "bound_rate_with": bound["bound"], "bound_epsilon": bound["epsilon"],
            "bound_delta": bound["delta"], "rho_group": bound["rho_group"],
        }
        if per_generation is not None:
            par = parallel_bound(rho, per_generation, p_wo, adjacency=adjacency)
            row.update({"affected_generations": par["affected"],
                        "max_rows_in_a_batch": max(per_generation),
                        "bound_parallel": par["bound"],
                        "bound_parallel_epsilon": par["epsilon"]})
        rows.append(row)
    return rows


def write_canary_report(result: dict[str, Any], path: str | Path) -> Path:
    """Write ``result`` as JSON, **mode 600 from creation** (it describes generations from
    private references and where the canaries were put)."""
    from dplang.release import write_atomic

    path = Path(path)
    write_atomic(path, json.dumps(result, indent=2, ensure_ascii=False) + "\n", private=True)
    return path

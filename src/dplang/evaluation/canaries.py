"""Canaries: what a private generation leaks, and what the guarantee allows (issue 18, §2).

Synthetic *canary* sentences (improbable, so that a model does not produce them by itself) are
inserted into some references of a copy of the data set: each canary to ``m`` distinct references
(m = 1 for "a phrase one person wrote", m = 2, 5, 20, ... for "a phrase many people wrote").
Generating from the data with and without the canaries and counting, per canary, the generations
that contain it verbatim or near-verbatim (word n-gram overlap) gives an empirical privacy check
of the whole pipeline, next to the bound the guarantee implies.

The bound. Inserting a canary into a reference turns it into another reference: under
``replace-by-null`` (or ``zero-out``) adjacency that is two neighbouring steps (r → ∅ → r'), so a
canary in ``m`` references changes the data set by a group of ``k = 2m`` (``k = m`` under
``replace-one``). ρ-zCDP gives k²ρ-zCDP for groups of size k (Bun & Steinke 2016, Prop. 1.9),
hence (ε, δ_k(ε))-DP for every ε ≥ 0 with δ_k from the tight conversion
(:func:`dplang.privacy.accounting.rho_to_delta`). For the event "a generation contains the
canary" (a post-processing of the release), and by linearity for the expected rate over
generations,

    P_with ≤ min_ε [ e^ε · P_without + δ_k(ε) ].

``P_without`` is unknown; :func:`emission_bound` plugs in a one-sided Clopper–Pearson upper
confidence bound on it from the generations without the canary (an observed zero does not mean
a zero probability).

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
from collections.abc import Sequence
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


def make_canaries(repeats: Sequence[int], n_rows: int, *, seed: int = 0) -> list[Canary]:
    """One improbable sentence per entry of ``repeats``, placed in that many distinct rows.

    Rows are drawn (seeded) without replacement across all canaries, so no reference holds two
    canaries; the choice depends only on ``(repeats, n_rows, seed)``, never on the data.
    Raises ``ValueError`` when the rows do not suffice."""
    if any(m < 1 for m in repeats):
        raise ValueError("every canary needs at least one reference")
    if sum(repeats) > n_rows:
        raise ValueError(f"{sum(repeats)} canary rows asked for, the data set has {n_rows}")
    rng = random.Random(seed)
    rows = rng.sample(range(n_rows), sum(repeats))
    used: set[str] = set()
    out: list[Canary] = []
    start = 0
    for m in repeats:
        while True:
            text = (f"My neighbour {rng.choice(_NAMES)} keeps {rng.choice(_NUMBERS)} "
                    f"{rng.choice(_COLOURS)} {rng.choice(_ANIMALS)} in the "
                    f"{rng.choice(_PLACES)}.")
            if text not in used:
                used.add(text)
                break
        out.append(Canary(text, tuple(sorted(rows[start:start + m]))))
        start += m
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


def emission_bound(rho: float, repeats: int, p_without: float, *,
                   adjacency: str = "replace-by-null") -> dict[str, float]:
    """The bound ρ-zCDP implies on P_with for a canary in ``repeats`` references:
    ``min_ε e^ε·p_without + δ_k(ε)`` with ``k = group_size(repeats)`` and group ρ_k = k²ρ.

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

    # δ_k(ε) falls and e^ε·p rises with ε: a log-spaced grid, then a local refinement.
    hi = rho_k + 2.0 * math.sqrt(rho_k * math.log(1e12)) + 1.0
    grid = [0.0] + [hi * 10 ** (-6 + 6 * i / 200) for i in range(201)]
    best = min(grid, key=value)
    from scipy.optimize import minimize_scalar

    lo_e, hi_e = max(0.0, best / 1.2 - 1e-3), best * 1.2 + 1e-3
    res = minimize_scalar(value, bounds=(lo_e, hi_e), method="bounded",
                          options={"xatol": 1e-9})
    eps = float(res.x) if value(float(res.x)) <= value(best) else best
    return {"bound": value(eps), "epsilon": eps, "delta": rho_to_delta(rho_k, eps),
            "rho_group": rho_k}


def canary_table(canaries: Sequence[Canary], with_outputs: Sequence[str],
                 without_outputs: Sequence[str], rho: float, *,
                 adjacency: str = "replace-by-null", n: int = DEFAULT_NGRAM,
                 threshold: float = DEFAULT_NEAR_THRESHOLD,
                 confidence: float = 0.95) -> list[dict[str, Any]]:
    """One row per canary: its repeats m, occurrences (verbatim, near) with and without it,
    the observed near-verbatim rate with it, and the bound on that rate implied by ρ given a
    ``confidence`` upper bound on the rate without it."""
    rows = []
    for c in canaries:
        w = count_occurrences(c.text, with_outputs, n=n, threshold=threshold)
        wo = count_occurrences(c.text, without_outputs, n=n, threshold=threshold)
        p_wo = upper_confidence(wo.near, wo.generations, confidence)
        bound = emission_bound(rho, c.repeats, p_wo, adjacency=adjacency)
        rows.append({
            "canary": c.text, "repeats": c.repeats, "rows": list(c.rows),
            "group_size": group_size(c.repeats, adjacency),
            "with": asdict(w), "without": asdict(wo),
            "rate_with": w.near / w.generations if w.generations else None,
            "p_without_upper": p_wo,
            "bound_rate_with": bound["bound"], "bound_epsilon": bound["epsilon"],
            "bound_delta": bound["delta"], "rho_group": bound["rho_group"],
        })
    return rows


def write_canary_report(result: dict[str, Any], path: str | Path) -> Path:
    """Write ``result`` as JSON, **mode 600 from creation** (it describes generations from
    private references and where the canaries were put)."""
    from dplang.release import write_atomic

    path = Path(path)
    write_atomic(path, json.dumps(result, indent=2, ensure_ascii=False) + "\n", private=True)
    return path

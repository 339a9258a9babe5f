"""Privacy accounting: zCDP, pure and approximate DP, composition and calibration.

The zCDP ↔ (ε, δ) conversions (:func:`rho_to_delta`, :func:`rho_to_epsilon`,
:func:`epsilon_to_rho`, :func:`simple_rho_to_epsilon`) are defined in the leaf module
:mod:`dplang.privacy.conversions`, which :class:`~dplang.privacy.guarantees.Guarantee` imports
too, and are re-exported here.

InvisibleInk's calibration (the DClip sensitivity C/B, ρ_seq = T·Δ²/(2τ²), the clip norm for a
budget) lives with the method, in :mod:`dplang.textgen.methods.invisibleink` (InvisibleInk
paper, Thm 2 and App. C; ``docs/privacy.md``, "InvisibleInk accounting"); this module keeps the
generic pieces it uses (:func:`exponential_mechanism_rho`, conversions, composition).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

# the conversions, re-exported: callers import them from here
from .conversions import _check_epsilon, rho_to_epsilon
from .conversions import epsilon_to_rho as epsilon_to_rho
from .conversions import rho_to_delta as rho_to_delta
from .conversions import simple_rho_to_epsilon as simple_rho_to_epsilon
from .guarantees import Guarantee

#: Defaults of InvisibleInk's hyperparameters, shared by ``dplang account``, ``dplang generate``
#: and experiment configurations (one place, so the clip norm one command prints is the one the
#: other uses). τ = 1.2 and B = 7 are the InvisibleInk paper's settings for Yelp
#: (its §5.1; ``docs/experiments.md``, "Setting").
DEFAULT_TEMPERATURE = 1.2
DEFAULT_BATCH_SIZE = 7
DEFAULT_MAX_TOKENS = 64


#: The largest ε (at the release's δ) that any dplang release accepts. Beyond it the bound on
#: the likelihood ratio of neighbouring outputs, e^ε > 2.7·10^43, promises nothing, and the
#: calibrations of some mechanisms overflow (ε ≳ 710). A budget above it is refused before
#: anything is read, loaded, charged or written (docs/privacy.md, "Budget limits").
MAX_EPSILON = 100.0
#: ρ above which the implied ε is certainly above :data:`MAX_EPSILON` at any δ < 1/2 (it is
#: refused without running the conversion, which would overflow for ρ near the float range).
_MAX_RHO_SHORTCUT = 1e6


class BudgetLimitError(ValueError):
    """A privacy parameter that is not finite and positive, or means no meaningful privacy."""


def implied_epsilon(rho: float, delta: float) -> float:
    """ε at ``delta`` of a ρ-zCDP guarantee, or ``inf`` when it is beyond the float range
    (never an exception for a finite ρ ≥ 0)."""
    if not math.isfinite(rho) or rho > _MAX_RHO_SHORTCUT:
        return math.inf
    try:
        return rho_to_epsilon(rho, delta)
    except (ValueError, OverflowError, ZeroDivisionError):
        return math.inf


def check_budget_limit(value: float | None, *, name: str = "--epsilon", kind: str = "epsilon",
                       delta: float | None = None) -> None:
    """Refuse a privacy parameter with a one-line :class:`BudgetLimitError`.

    ``kind="epsilon"``: ``value`` is an ε; ``kind="rho"``: a zCDP ρ, whose ε at ``delta`` is
    checked. ``value`` must be finite and > 0, and the ε it means at most
    :data:`MAX_EPSILON`. ``None`` (not given) passes."""
    if value is None:
        return
    if not (math.isfinite(value) and value > 0):
        raise BudgetLimitError(f"{name} must be finite and > 0, got {value}")
    if kind == "epsilon":
        if value > MAX_EPSILON:
            raise BudgetLimitError(f"{name} {value:g} is {_ABOVE}")
        return
    if kind != "rho":
        raise ValueError(f"kind must be 'epsilon' or 'rho', got {kind!r}")
    if delta is None or not 0 < delta < 1:
        raise BudgetLimitError(f"--delta must be in (0, 1), got {delta}")
    check_epsilon_limit(implied_epsilon(value, delta), f"{name} {value:g}", delta)


_ABOVE = (f"above dplang's limit ε ≤ {MAX_EPSILON:g}: no meaningful privacy "
          "(docs/privacy.md, 'Budget limits')")


def check_epsilon_limit(epsilon: float, what: str, delta: float | None = None) -> None:
    """Refuse (:class:`BudgetLimitError`) when ``epsilon``, the ε that ``what`` implies (at
    ``delta`` when given), is not finite or exceeds :data:`MAX_EPSILON`."""
    if math.isfinite(epsilon) and epsilon <= MAX_EPSILON:
        return
    at = f" at δ = {delta:g}" if delta is not None else ""
    shown = f"= {epsilon:.4g}" if math.isfinite(epsilon) else f"> {MAX_EPSILON:g}"
    raise BudgetLimitError(f"{what} means ε {shown}{at}, {_ABOVE}")


def pure_to_zcdp(epsilon: float) -> float:
    """ε-DP implies ε²/2-zCDP (Bun–Steinke 2016, Prop. 1.4)."""
    _check_epsilon(epsilon)
    return epsilon * epsilon / 2.0


def bounded_range_to_zcdp(epsilon: float) -> float:
    """An ε-bounded-range mechanism (e.g. the exponential mechanism whose scores have
    sensitivity Δ, run with ε = 2Δ/τ) is ε²/8-zCDP (Cesar–Rogers 2021)."""
    _check_epsilon(epsilon)
    return epsilon * epsilon / 8.0


def exponential_mechanism_rho(sensitivity: float, temperature: float) -> float:
    """zCDP cost of sampling softmax(u/τ) when ‖u(D) − u(D')‖∞ ≤ sensitivity: Δ²/(2τ²)."""
    if not sensitivity >= 0 or not temperature > 0:
        raise ValueError("sensitivity must be >= 0 and temperature > 0")
    return sensitivity * sensitivity / (2.0 * temperature * temperature)


# --------------------------------------------------------------------------------------------
# Composition


def _common(guarantees: Sequence[Guarantee], what: str) -> tuple[str, str]:
    if not guarantees:
        raise ValueError(f"{what} composition needs at least one guarantee")
    units = {g.unit for g in guarantees}
    adjacencies = {g.adjacency for g in guarantees}
    if len(units) > 1 or len(adjacencies) > 1:
        raise ValueError(
            f"cannot compose guarantees over different units/adjacencies: "
            f"{sorted(units)} / {sorted(adjacencies)}"
        )
    return units.pop(), adjacencies.pop()


def compose_sequential(
    guarantees: Sequence[Guarantee], delta: float | None = None, mechanism: str | None = None
) -> Guarantee:
    """Adaptive sequential composition (all releases see the same data).

    zCDP parameters add (pure ε-DP releases enter as ε²/2-zCDP) and the sum is converted at
    ``delta`` (default: the largest δ among the inputs, or pure when all are pure). When some
    release is approximate DP without a zCDP parameter, basic composition is used (ε and δ add).
    All releases must assume the same unit and adjacency.
    """
    unit, adjacency = _common(guarantees, "sequential")
    name = mechanism or "+".join(dict.fromkeys(g.mechanism for g in guarantees))
    details = {"composition": "sequential", "parts": len(guarantees)}
    if all(g.is_pure and g.rho is None for g in guarantees):
        composed = Guarantee.pure(name, unit, adjacency, sum(g.epsilon for g in guarantees),
                                  details=details)
    elif any(g.rho is None and not g.is_pure for g in guarantees):
        composed = Guarantee.approximate(name, unit, adjacency,
                                         sum(g.epsilon for g in guarantees),
                                         sum(g.delta for g in guarantees), details=details)
    else:
        rho = sum(g.rho if g.rho is not None else pure_to_zcdp(g.epsilon) for g in guarantees)
        target = delta if delta is not None else max(g.delta for g in guarantees)
        composed = Guarantee.zcdp(name, unit, adjacency, rho, target, details=details)
    return _labelled(composed, guarantees)


def compose_parallel(
    guarantees: Sequence[Guarantee], mechanism: str | None = None
) -> Guarantee:
    """Parallel composition over a fixed, data-independent partition: the maximum.

    Valid only when each release reads a disjoint part of the data and the partition itself
    does not depend on the data's content (InvisibleInk paper, Lemma 13(b) / Corollary 11).
    """
    unit, adjacency = _common(guarantees, "parallel")
    name = mechanism or "+".join(dict.fromkeys(g.mechanism for g in guarantees))
    worst = max(guarantees, key=lambda g: (g.rho if g.rho is not None else -1, g.epsilon, g.delta))
    details = {"composition": "parallel over a data-independent partition",
               "parts": len(guarantees)}
    if any(g.rho is None for g in guarantees):
        composed = Guarantee.approximate(name, unit, adjacency,
                                         max(g.epsilon for g in guarantees),
                                         max(g.delta for g in guarantees), details=details)
    else:  # the worst part's (ρ, ε, δ), as it was stated
        composed = replace(worst, mechanism=name, details=details)
    return _labelled(composed, guarantees)


def _labelled(composed: Guarantee, parts: Sequence[Guarantee]) -> Guarantee:
    """``composed`` with the labels of its parts: data-dependent if one part is, a toy run if
    one part's seed is public (one public seed voids the whole)."""
    return replace(composed, ex_ante=all(g.ex_ante for g in parts),
                   public_seed=any(g.public_seed for g in parts))

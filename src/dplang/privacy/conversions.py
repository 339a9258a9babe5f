"""zCDP ↔ (ε, δ)-DP conversions (a leaf: it imports only :mod:`dplang.privacy.calibration`, so
:class:`~dplang.privacy.guarantees.Guarantee` and :mod:`dplang.privacy.accounting`, which
re-exports these functions, both import it without importing each other in a circle).

``rho_to_delta`` is the tight zCDP → (ε, δ) conversion of Canonne, Kamath and Steinke (2020,
Prop. 12 / Cor. 13; equivalently Balle et al. 2020, Thm 21 as used by the InvisibleInk paper):

    δ(ρ, ε) = inf_{α>1} exp((α−1)(αρ−ε)) / (α−1) · (1 − 1/α)^α .

The log of the objective is convex in α with derivative (2α−1)ρ − ε + log(1 − 1/α), which is
increasing, so the infimum is found by a root search on the derivative. We implement it here
rather than calling OpenDP because the inverse maps (ε → ρ, and ρ → ε at fixed δ) are needed
for calibration and OpenDP exposes only the forward privacy profile; the tests cross-check this
implementation against OpenDP's ``make_zCDP_to_approxDP`` and dp-accounting's RDP conversion.
Inverses are computed by :func:`dplang.privacy.calibration.calibrate` (bracket, bisect) and
always rounded to the *safe* side (ε up, ρ down).

Privacy contract: none of its own — pure functions of public parameters.
"""

from __future__ import annotations

import math

from .calibration import calibrate

__all__ = ["epsilon_to_rho", "rho_to_delta", "rho_to_epsilon", "simple_rho_to_epsilon"]

#: relative precision of the conversions' inverses (rounded to the safe side)
_RTOL = 1e-13


def _check_rho(rho: float) -> None:
    if not (rho >= 0 and math.isfinite(rho)):
        raise ValueError(f"rho must be finite and >= 0, got {rho}")


def _check_epsilon(epsilon: float) -> None:
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon}")


def _check_delta(delta: float) -> None:
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")


def _log_delta_objective(alpha: float, rho: float, epsilon: float) -> float:
    return (
        (alpha - 1.0) * (alpha * rho - epsilon)
        + alpha * math.log1p(-1.0 / alpha)
        - math.log(alpha - 1.0)
    )


def rho_to_delta(rho: float, epsilon: float) -> float:
    """Smallest δ such that ρ-zCDP implies (ε, δ)-DP (tight CKS 2020 conversion)."""
    _check_rho(rho)
    if not epsilon >= 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    if rho == 0:
        return 0.0

    def derivative(alpha: float) -> float:
        return (2 * alpha - 1) * rho - epsilon + math.log1p(-1.0 / alpha)

    lo = 1.0 + 1e-12
    if derivative(lo) >= 0:  # objective increasing on (1, ∞): infimum is the limit α → 1, δ = 1
        return 1.0
    hi = (epsilon + 1.0) / (2.0 * rho) + 2.0
    while derivative(hi) <= 0:  # pragma: no cover - the bound above always suffices
        hi *= 2.0
    from scipy.optimize import brentq  # here: `import dplang.privacy` stays light

    alpha = brentq(derivative, lo, hi, xtol=1e-14, rtol=1e-14, maxiter=500)
    log_delta = _log_delta_objective(alpha, rho, epsilon)
    return min(1.0, math.exp(log_delta))


def simple_rho_to_epsilon(rho: float, delta: float) -> float:
    """The simple (loose) bound ε = ρ + 2·sqrt(ρ·ln(1/δ)) (Bun–Steinke 2016, Prop. 1.3)."""
    _check_rho(rho)
    _check_delta(delta)
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def rho_to_epsilon(rho: float, delta: float) -> float:
    """Smallest ε such that ρ-zCDP implies (ε, δ)-DP (tight; rounded up)."""
    _check_rho(rho)
    _check_delta(delta)
    if rho == 0:
        return 0.0
    return calibrate(lambda eps: rho_to_delta(rho, eps) <= delta, 0.0,
                     simple_rho_to_epsilon(rho, delta), safe="above", rtol=_RTOL, xtol=_RTOL)


def epsilon_to_rho(epsilon: float, delta: float) -> float:
    """Largest ρ such that ρ-zCDP implies (ε, δ)-DP (tight; rounded down)."""
    _check_epsilon(epsilon)
    _check_delta(delta)
    return calibrate(lambda rho: rho_to_delta(rho, epsilon) <= delta, 0.0, epsilon + 1.0,
                     safe="below", rtol=_RTOL)

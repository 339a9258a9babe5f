"""Noise and selection mechanisms: exponential mechanism, Laplace, Gaussian and their exact
discrete counterparts.

Every sampler takes an explicit ``numpy.random.Generator`` (``rng``) and never touches global
randomness, so that each unit can draw from its own seeded stream (``docs/privacy.md``
invariant 5; :mod:`dplang.privacy.randomness`). Every noise draw of dplang's samplers and
reports goes through this module, so a sampler's privacy contract is the composition of the
calls below, each with its own contract (and its own test in ``tests/privacy``).

Privacy contracts (Δ is the sensitivity of the query under the caller's adjacency)
---------------------------------------------------------------------------------
* Exponential mechanism, P(y) ∝ exp(u(y)/τ) (``exponential_mechanism``, ``gumbel_max``): if the
  score vector u has ℓ∞ sensitivity Δ, one draw is (2Δ/τ)-DP and (2Δ/τ)-bounded-range, hence
  ρ = (2Δ/τ)²/8 = Δ²/(2τ²)-zCDP (Cesar & Rogers 2021).
* Laplace noise of scale b (``laplace``, ``laplace_noisy_sum``, ``laplace_mechanism``): a real
  (vector) query with ℓ1 sensitivity Δ is (Δ/b)-DP; ``laplace_mechanism`` uses b = Δ/ε.
* Gaussian noise of standard deviation σ (``gaussian``, ``gaussian_noisy_sum``,
  ``gaussian_mechanism``): a real (vector) query with ℓ2 sensitivity Δ is Δ²/(2σ²)-zCDP;
  ``gaussian_mechanism`` uses σ = Δ/√(2ρ).
* Discrete Laplace of scale b, P(z) ∝ exp(−|z|/b) on ℤ (``discrete_laplace``,
  ``discrete_laplace_mechanism``): an integer query with ℓ1 sensitivity Δ is (Δ/b)-DP.
* Discrete Gaussian, P(z) ∝ exp(−z²/(2σ²)) on ℤ (``discrete_gaussian``,
  ``discrete_gaussian_mechanism``): an integer query with ℓ2 sensitivity Δ is
  Δ²/(2σ²)-zCDP (Canonne, Kamath & Steinke 2020, Thm 14).

The continuous samplers use numpy's floating-point samplers and inherit their known
floating-point caveats (Mironov 2012). The discrete samplers are *exact*: they follow Canonne,
Kamath & Steinke 2020 ("The Discrete Gaussian for Differential Privacy", Algorithms 1–3) with
exact rational/integer arithmetic, so their output law is exactly the stated one given ideal
uniform random words from ``rng``.
"""

from __future__ import annotations

import math
from fractions import Fraction
from numbers import Integral, Real

import numpy as np

from ._cks import _Bits

__all__ = [
    "discrete_gaussian",
    "discrete_gaussian_logpmf",
    "discrete_gaussian_mechanism",
    "discrete_gaussian_pmf",
    "discrete_laplace",
    "discrete_laplace_logpmf",
    "discrete_laplace_mechanism",
    "discrete_laplace_pmf",
    "exponential_mechanism",
    "exponential_mechanism_probabilities",
    "gaussian",
    "gaussian_mechanism",
    "gaussian_noisy_sum",
    "gumbel_max",
    "laplace",
    "laplace_mechanism",
    "laplace_noisy_sum",
    "two_sided_geometric",
]

Size = int | tuple[int, ...] | None

# ---------------------------------------------------------------------------------------------
# Validation helpers
# ---------------------------------------------------------------------------------------------


def _check_positive_finite(name: str, value: float | Fraction) -> None:
    if isinstance(value, Fraction):
        if value <= 0:
            raise ValueError(f"{name} must be > 0, got {value}")
        return
    try:
        v = float(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a real number, got {value!r}") from exc
    if not (v > 0 and math.isfinite(v)):
        raise ValueError(f"{name} must be finite and > 0, got {value}")


def _check_rng(rng: np.random.Generator) -> None:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")


def _to_fraction(name: str, value: float | Fraction | int) -> Fraction:
    """Convert a positive float/int/Fraction to an exact Fraction.

    Floats are converted *exactly* (``Fraction(float)`` is the exact binary value), not via
    ``limit_denominator``: rounding the scale down would silently weaken the privacy guarantee,
    and the exact samplers below handle arbitrary denominators at O(1) expected cost.
    """
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if isinstance(value, Fraction):
        frac = value
    elif isinstance(value, Integral):
        frac = Fraction(int(value))
    elif isinstance(value, Real):
        v = float(value)
        if not math.isfinite(v):
            raise ValueError(f"{name} must be finite and > 0, got {value}")
        frac = Fraction(v)
    else:
        raise ValueError(f"{name} must be a real number, got {value!r}")
    if frac <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return frac


def _count(size: Size) -> int:
    if size is None:
        return 1
    shape = (size,) if isinstance(size, Integral) else tuple(size)
    if any(int(s) < 0 for s in shape):
        raise ValueError(f"size must be non-negative, got {size}")
    return math.prod(int(s) for s in shape)


# ---------------------------------------------------------------------------------------------
# Exponential mechanism
# ---------------------------------------------------------------------------------------------


def _masked_logits(
    scores: np.ndarray, temperature: float, mask: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Return (indices inside the mask, (scores/τ − max) at those indices) after validation."""
    _check_positive_finite("temperature", temperature)
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 1:
        raise ValueError(f"scores must be one-dimensional, got shape {s.shape}")
    if mask is None:
        idx = np.arange(s.shape[0])
    else:
        m = np.asarray(mask)
        if m.dtype != np.bool_:
            raise ValueError(f"mask must be boolean, got dtype {m.dtype}")
        if m.shape != s.shape:
            raise ValueError(f"mask shape {m.shape} does not match scores shape {s.shape}")
        idx = np.flatnonzero(m)
    if idx.size == 0:
        raise ValueError("the exponential mechanism needs at least one candidate (empty mask)")
    x = s[idx]
    if not np.all(np.isfinite(x)):
        raise ValueError("scores inside the mask must be finite")
    x = x / float(temperature)
    x = x - x.max()
    return idx, x


def exponential_mechanism_probabilities(
    scores: np.ndarray, temperature: float, mask: np.ndarray | None = None
) -> np.ndarray:
    """The exact output law of the exponential mechanism, P(y) ∝ exp(scores[y]/τ) on the mask.

    Returns a float64 array of the same length as ``scores`` with zeros outside ``mask``.
    Computed stably (the maximum is subtracted before exponentiating).

    Privacy contract: if ``scores`` has ℓ∞ sensitivity Δ, a draw from this law is
    (2Δ/τ)-DP and ρ = Δ²/(2τ²)-zCDP (bounded range 2Δ/τ ⇒ (2Δ/τ)²/8-zCDP).
    """
    idx, x = _masked_logits(scores, temperature, mask)
    w = np.exp(x)
    out = np.zeros(np.asarray(scores).shape[0], dtype=np.float64)
    out[idx] = w / w.sum()
    return out


def exponential_mechanism(
    scores: np.ndarray,
    temperature: float,
    rng: np.random.Generator,
    mask: np.ndarray | None = None,
) -> int:
    """Sample an index y with probability ∝ exp(scores[y]/τ) among the entries where ``mask``
    is True (all entries when ``mask`` is None), by inverse-CDF sampling of the exact law.

    Raises ValueError when τ ≤ 0, the mask is empty, or a score inside the mask is not finite
    (scores outside the mask may be anything, e.g. −inf).

    Privacy contract: if ``scores`` has ℓ∞ sensitivity Δ, the draw is (2Δ/τ)-DP and
    ρ = Δ²/(2τ²)-zCDP.
    """
    _check_rng(rng)
    idx, x = _masked_logits(scores, temperature, mask)
    cdf = np.cumsum(np.exp(x))
    u = rng.random() * cdf[-1]  # u in [0, total)
    j = int(np.searchsorted(cdf, u, side="right"))
    # side="right" returns the first j with cdf[j] > u, which always has positive mass.
    j = min(j, idx.size - 1)
    return int(idx[j])


def gumbel_max(
    scores: np.ndarray,
    temperature: float,
    rng: np.random.Generator,
    mask: np.ndarray | None = None,
) -> int:
    """The Gumbel-max form of the exponential mechanism: argmax over the mask of
    scores[y]/τ + G_y with G_y i.i.d. standard Gumbel. Same law as
    :func:`exponential_mechanism`, same validation.

    Privacy contract: if ``scores`` has ℓ∞ sensitivity Δ, the draw is (2Δ/τ)-DP and
    ρ = Δ²/(2τ²)-zCDP.
    """
    _check_rng(rng)
    idx, x = _masked_logits(scores, temperature, mask)
    g = rng.gumbel(size=idx.size)
    return int(idx[int(np.argmax(x + g))])


# ---------------------------------------------------------------------------------------------
# Continuous Laplace and Gaussian
# ---------------------------------------------------------------------------------------------


def laplace(scale: float, rng: np.random.Generator, size: Size = None) -> float | np.ndarray:
    """Continuous Laplace noise with density ∝ exp(−|x|/b), b = ``scale``.

    Privacy contract: added to a real query with ℓ1 sensitivity Δ it gives ε = Δ/b pure DP.
    Returns a float when ``size`` is None, otherwise an array of that shape.
    """
    _check_rng(rng)
    _check_positive_finite("scale", scale)
    out = rng.laplace(0.0, float(scale), size=size)
    return float(out) if size is None else np.asarray(out, dtype=np.float64)


def gaussian(sigma: float, rng: np.random.Generator, size: Size = None) -> float | np.ndarray:
    """Continuous Gaussian noise N(0, σ²).

    Privacy contract: added to a real query with ℓ2 sensitivity Δ it gives
    ρ = Δ²/(2σ²)-zCDP. Returns a float when ``size`` is None, otherwise an array.
    """
    _check_rng(rng)
    _check_positive_finite("sigma", sigma)
    out = rng.normal(0.0, float(sigma), size=size)
    return float(out) if size is None else np.asarray(out, dtype=np.float64)


def laplace_noisy_sum(value: np.ndarray, scale: float, rng: np.random.Generator) -> np.ndarray:
    """Release a real vector query (counts, column sums, means) plus i.i.d. Laplace noise of
    scale b = ``scale`` on every coordinate: the noisy-sum step of every Laplace sampler.

    ``value`` must be finite; the noise is one call ``laplace(b, rng, size=value.shape)`` (the
    same draws, in the same order). Returns a float64 array of ``value``'s shape.

    Privacy contract: if ``value`` has ℓ1 sensitivity Δ under the caller's adjacency, the
    release is (Δ/b)-DP (pure)."""
    _check_rng(rng)
    arr = _check_values_finite(value)
    return arr + np.asarray(laplace(scale, rng, size=arr.shape))


def gaussian_noisy_sum(value: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Release a real vector query plus i.i.d. N(0, σ²) noise on every coordinate: the
    noisy-sum step of every Gaussian sampler.

    ``value`` must be finite; the noise is one call ``gaussian(σ, rng, size=value.shape)``.
    Returns a float64 array of ``value``'s shape.

    Privacy contract: if ``value`` has ℓ2 sensitivity Δ under the caller's adjacency, the
    release is Δ²/(2σ²)-zCDP."""
    _check_rng(rng)
    arr = _check_values_finite(value)
    return arr + np.asarray(gaussian(sigma, rng, size=arr.shape))


def two_sided_geometric(scale: float, rng: np.random.Generator, size: Size = None
                        ) -> int | np.ndarray:
    """Discrete Laplace noise of scale b drawn fast, as the difference of two numpy geometric
    variables with success probability p = 1 − e^{−1/b} computed in floating point.

    For simulations and evaluation only (vectorised; millions of draws): its law is the
    discrete Laplace's up to the rounding of p, so it is not exact. Releases use
    :func:`discrete_laplace`.

    Privacy contract: none claimed — never on a release path (an integer query with ℓ1
    sensitivity Δ plus this noise is (Δ/b)-DP only up to the rounding of p)."""
    _check_rng(rng)
    _check_positive_finite("scale", scale)
    p = -math.expm1(-1.0 / float(scale))
    out = rng.geometric(p, size=size) - rng.geometric(p, size=size)
    return int(out) if size is None else np.asarray(out, dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# Exact discrete samplers (Canonne, Kamath & Steinke 2020)
#
# Why hand-written rather than OpenDP's exact samplers: OpenDP draws its randomness from the
# operating system's entropy source and cannot be driven by a seeded numpy Generator, whereas
# dplang needs every unit to draw from its own seeded stream so that runs are deterministic and
# resumable (docs/privacy.md invariant 5). The algorithms are the exact ones of CKS 2020
# (Algorithms 1, 2 and 3), in :mod:`dplang.privacy._cks`: all arithmetic is on Python
# integers/rationals, and every random decision is made from uniform 64-bit words drawn with
# ``rng.integers``.
# ---------------------------------------------------------------------------------------------

def _discrete_output(values: list[int], size: Size) -> int | np.ndarray:
    if size is None:
        return values[0]
    shape = (size,) if isinstance(size, Integral) else tuple(int(s) for s in size)
    return np.asarray(values, dtype=np.int64).reshape(shape)


def discrete_laplace(
    scale: float | Fraction, rng: np.random.Generator, size: Size = None
) -> int | np.ndarray:
    """Exact discrete Laplace (two-sided geometric) noise, P(z) ∝ exp(−|z|/b) on ℤ, b = ``scale``.

    Implements Canonne–Kamath–Steinke 2020, Algorithm 2, with Bernoulli(exp(−γ)) drawn exactly
    (their Algorithm 1) from uniform integers produced by ``rng.integers``. ``scale`` may be a
    float, int or :class:`fractions.Fraction`; a float is converted *exactly* to a rational
    (``Fraction(scale)``), never rounded, so the law is exactly the one of the given scale.

    Privacy contract: added to an integer query with ℓ1 sensitivity Δ it gives ε = Δ/b pure DP.
    Returns a Python int when ``size`` is None, otherwise an int64 array of that shape.
    """
    _check_rng(rng)
    b = _to_fraction("scale", scale)
    n = _count(size)
    bits = _Bits(rng, expected_words=12 * n)
    t, s = b.numerator, b.denominator
    values = [bits.discrete_laplace(t, s) for _ in range(n)]
    return _discrete_output(values, size)


def _discrete_gaussian_sigma2(
    sigma2: Fraction, rng: np.random.Generator, size: Size
) -> int | np.ndarray:
    n = _count(size)
    bits = _Bits(rng, expected_words=24 * n)
    values = [bits.discrete_gaussian(sigma2.numerator, sigma2.denominator) for _ in range(n)]
    return _discrete_output(values, size)


def discrete_gaussian(
    sigma: float | Fraction, rng: np.random.Generator, size: Size = None
) -> int | np.ndarray:
    """Exact discrete Gaussian noise, P(z) ∝ exp(−z²/(2σ²)) on ℤ.

    Implements Canonne–Kamath–Steinke 2020, Algorithm 3 (rejection from a discrete Laplace of
    scale ⌊σ⌋+1), with exact rational arithmetic: ``sigma`` (float, int or Fraction) is
    converted exactly to a rational and σ² is formed exactly.

    Privacy contract: added to an integer-valued query with ℓ2 sensitivity Δ it gives
    ρ = Δ²/(2σ²)-zCDP. Returns a Python int when ``size`` is None, otherwise an int64 array.
    """
    _check_rng(rng)
    sig = _to_fraction("sigma", sigma)
    return _discrete_gaussian_sigma2(sig * sig, rng, size)


# ---------------------------------------------------------------------------------------------
# Calibrated mechanisms
# ---------------------------------------------------------------------------------------------


def _check_values_finite(value: float | np.ndarray) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError("the query value must be finite")
    return arr


def _check_integer_values(value: int | np.ndarray) -> np.ndarray:
    if isinstance(value, bool):
        raise ValueError("the query value must be an integer, not a bool")
    arr = np.asarray(value)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"the query value must be integer-valued, got dtype {arr.dtype}")
    return arr


def laplace_mechanism(
    value: float | np.ndarray,
    sensitivity: float,
    epsilon: float,
    rng: np.random.Generator,
) -> float | np.ndarray:
    """Release ``value`` + Laplace(Δ/ε) noise (i.i.d. per coordinate).

    Privacy contract: if ``value`` has ℓ1 sensitivity Δ = ``sensitivity``, the release is
    ε-DP.
    """
    _check_positive_finite("sensitivity", sensitivity)
    _check_positive_finite("epsilon", epsilon)
    arr = _check_values_finite(value)
    scale = float(sensitivity) / float(epsilon)
    if arr.ndim == 0:
        return float(arr) + float(laplace(scale, rng))
    return laplace_noisy_sum(arr, scale, rng)


def gaussian_mechanism(
    value: float | np.ndarray,
    sensitivity: float,
    rho: float,
    rng: np.random.Generator,
) -> float | np.ndarray:
    """Release ``value`` + N(0, σ²) noise with σ = Δ/√(2ρ) (i.i.d. per coordinate).

    Privacy contract: if ``value`` has ℓ2 sensitivity Δ = ``sensitivity``, the release is
    ρ-zCDP.
    """
    _check_positive_finite("sensitivity", sensitivity)
    _check_positive_finite("rho", rho)
    arr = _check_values_finite(value)
    sigma = float(sensitivity) / math.sqrt(2.0 * float(rho))
    if arr.ndim == 0:
        return float(arr) + float(gaussian(sigma, rng))
    return gaussian_noisy_sum(arr, sigma, rng)


def discrete_laplace_mechanism(
    value: int | np.ndarray,
    sensitivity: int,
    epsilon: float | Fraction,
    rng: np.random.Generator,
) -> int | np.ndarray:
    """Release integer ``value`` + exact discrete Laplace noise of scale Δ/ε (rational, exact).

    Privacy contract: if ``value`` has ℓ1 sensitivity Δ = ``sensitivity`` (an integer), the
    release is ε-DP.
    """
    if isinstance(sensitivity, bool) or not isinstance(sensitivity, Integral):
        raise ValueError(f"sensitivity must be a positive integer, got {sensitivity!r}")
    if sensitivity <= 0:
        raise ValueError(f"sensitivity must be > 0, got {sensitivity}")
    if not isinstance(epsilon, Fraction):
        _check_positive_finite("epsilon", epsilon)
    eps = _to_fraction("epsilon", epsilon)
    arr = _check_integer_values(value)
    scale = Fraction(int(sensitivity)) / eps
    if arr.ndim == 0:
        return int(arr) + int(discrete_laplace(scale, rng))
    return arr.astype(np.int64) + np.asarray(discrete_laplace(scale, rng, size=arr.shape))


def discrete_gaussian_mechanism(
    value: int | np.ndarray,
    sensitivity: float | Fraction,
    rho: float | Fraction,
    rng: np.random.Generator,
) -> int | np.ndarray:
    """Release integer ``value`` + exact discrete Gaussian noise with σ² = Δ²/(2ρ), computed
    exactly as a rational (no rounding of σ).

    Privacy contract: if ``value`` has ℓ2 sensitivity Δ = ``sensitivity``, the release is
    ρ-zCDP (i.i.d. noise per coordinate; CKS 2020, Thm 14).
    """
    if not isinstance(sensitivity, Fraction):
        _check_positive_finite("sensitivity", sensitivity)
    if not isinstance(rho, Fraction):
        _check_positive_finite("rho", rho)
    delta = _to_fraction("sensitivity", sensitivity)
    r = _to_fraction("rho", rho)
    _check_rng(rng)
    arr = _check_integer_values(value)
    sigma2 = delta * delta / (2 * r)
    if arr.ndim == 0:
        return int(arr) + int(_discrete_gaussian_sigma2(sigma2, rng, None))
    noise = np.asarray(_discrete_gaussian_sigma2(sigma2, rng, arr.shape))
    return arr.astype(np.int64) + noise


# ---------------------------------------------------------------------------------------------
# Exact laws (for tests and auditors)
# ---------------------------------------------------------------------------------------------


def discrete_laplace_logpmf(z: int | np.ndarray, scale: float | Fraction) -> float | np.ndarray:
    """log P(z) of the discrete Laplace of scale b: log tanh(1/(2b)) − |z|/b."""
    b = float(_to_fraction("scale", scale))
    zz = np.asarray(z, dtype=np.float64)
    # Normaliser (1 − e^{−1/b}) / (1 + e^{−1/b}) = tanh(1/(2b)).
    out = math.log(math.tanh(0.5 / b)) - np.abs(zz) / b
    return float(out) if out.ndim == 0 else out


def discrete_laplace_pmf(z: int | np.ndarray, scale: float | Fraction) -> float | np.ndarray:
    """P(z) = tanh(1/(2b)) · exp(−|z|/b), the normalised discrete Laplace pmf of scale b.

    Privacy contract of the law: for scale b, |log P(z) − log P(z−Δ)| ≤ Δ/b for all z.
    """
    out = np.exp(discrete_laplace_logpmf(z, scale))
    return float(out) if np.ndim(out) == 0 else out


def _discrete_gaussian_log_normaliser(sigma: float) -> float:
    half_width = math.ceil(20.0 * sigma + 20.0)
    k = np.arange(-half_width, half_width + 1, dtype=np.float64)
    e = -(k * k) / (2.0 * sigma * sigma)
    return float(np.log(np.sum(np.exp(e))))  # max exponent is 0 (k = 0): stable


def discrete_gaussian_logpmf(z: int | np.ndarray, sigma: float | Fraction) -> float | np.ndarray:
    """log P(z) of the discrete Gaussian, −z²/(2σ²) − log Σ_{|k| ≤ 20σ+20} exp(−k²/(2σ²))."""
    s = float(_to_fraction("sigma", sigma))
    zz = np.asarray(z, dtype=np.float64)
    out = -(zz * zz) / (2.0 * s * s) - _discrete_gaussian_log_normaliser(s)
    return float(out) if out.ndim == 0 else out


def discrete_gaussian_pmf(z: int | np.ndarray, sigma: float | Fraction) -> float | np.ndarray:
    """P(z) ∝ exp(−z²/(2σ²)) on ℤ, normalised over |z| ≤ 20σ+20 (the omitted mass is below
    float64 resolution).

    Privacy contract of the law: integer query with ℓ2 sensitivity Δ ⇒ Δ²/(2σ²)-zCDP.
    """
    out = np.exp(discrete_gaussian_logpmf(z, sigma))
    return float(out) if np.ndim(out) == 0 else out

"""The DP support test of one candidate: noise family, margin τ and exact emission law.

The test works on **counts**. For a statement s and a corpus R of n records,
C_s = Σ_r σ_s(r) is an integer with replace-one sensitivity 1 (one record flips σ by at most 1),
and the support is f_s = C_s / n. Under replace-one adjacency n is the same for every
neighbouring corpus, so n is **public** and dividing by it is post-processing: adding noise Z to
the count and reporting f̂ = (C + Z)/n is the same mechanism as adding Z/n to f (the paper's
f̂ = f + Z with Δ_f = 1/n; ``docs/reports.md``, "The support test"). A record is a *row* of the
data file, blank rows included (σ = 0 on them): counting only non-blank rows would make n
data-dependent.

For a margin τ_c (counts; τ = τ_c/n in support units) and threshold θ the test emits iff

    L = (C + Z − τ_c) / n ≥ θ,

and L is the certificate: Pr[f_s ≥ L] = Pr[Z ≤ τ_c] ≥ 1 − β. Families (Δ = 1 on counts):

* ``discrete-laplace`` (default): P(Z = z) ∝ e^{−ε₀|z|} on ℤ (scale b = 1/ε₀), drawn with the
  exact sampler of :mod:`dplang.privacy.mechanisms`; ε₀-DP. Tail: P(Z ≥ k) = e^{−ε₀k}/(1+e^{−ε₀})
  for integers k ≥ 1. τ_c is the *smallest integer* with P(Z ≥ τ_c) ≤ β, i.e.
  τ_c = ⌈ln(1/(β(1+e^{−ε₀})))/ε₀⌉. Because Z is integer the attained level
  β* = P(Z ≥ τ_c) is in general slightly *below* β (it is the largest attainable level ≤ β);
  the comparison L ≥ θ is done in exact rational arithmetic, reading θ as the decimal it prints
  as (``Fraction(repr(θ))``, so θ = 0.05 means exactly 1/20).
* ``laplace``: density ∝ e^{−|z|/b}, b = 1/ε₀; ε₀-DP. τ_c = b·ln(1/(2β)) so P(Z ≥ τ_c) = β
  exactly (and P(Z ≤ −τ_c) = β). Floating-point sampler (Mironov 2012 caveat).
* ``gaussian``: Z ~ N(0, σ²), τ_c = σ·Φ⁻¹(1−β). Either (ε₀, δ₀)-DP with σ from the *analytic*
  Gaussian mechanism (Balle & Wang 2018) under basic composition, or ρ₀-zCDP with
  σ = 1/√(2ρ₀) (zCDP composition; not in the paper).

With β < 1/2 every τ_c is > 0. All of the above are public functions of (family, ε₀, δ₀ or
ρ₀, β, n): the calibration never looks at the data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Literal

import numpy as np
from scipy.stats import norm

from ..privacy.calibration import calibrate
from ..privacy.guarantees import Guarantee
from ..privacy.mechanisms import discrete_laplace, gaussian, laplace

__all__ = [
    "NOISE_FAMILIES",
    "NoiseFamily",
    "SupportTest",
    "analytic_gaussian_delta",
    "analytic_gaussian_sigma",
    "exact_decimal",
]

NoiseFamily = Literal["discrete-laplace", "laplace", "gaussian"]
#: the mechanism named in the guarantee of one test
MECHANISM = "dp-support-test"
NOISE_FAMILIES: tuple[str, ...] = ("discrete-laplace", "laplace", "gaussian")


def exact_decimal(x: float) -> Fraction:
    """The rational a float *prints as* (``Fraction(repr(x))``): 0.05 → 1/20 exactly."""
    return Fraction(repr(float(x)))


def analytic_gaussian_delta(sigma: float, epsilon: float, sensitivity: float = 1.0) -> float:
    """Smallest δ for which N(0, σ²) noise on a query of ℓ2 sensitivity Δ is (ε, δ)-DP
    (Balle & Wang 2018, Thm 8): Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ).

    The same profile as :func:`dplang.privacy.audit.gaussian_privacy_profile` (which works in
    log space, for audits of tiny δ); this evaluation is kept because the σ of every report so
    far was calibrated with it, and the other rounds differently in the last bits of σ for about
    a quarter of budgets. ``tests/privacy/test_calibration.py`` checks the σ against both."""
    a = sensitivity / (2.0 * sigma)
    b = epsilon * sigma / sensitivity
    first = norm.cdf(a - b)
    second = math.exp(epsilon + norm.logcdf(-a - b))
    return max(0.0, float(first - second))


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest σ (rounded up) such that Gaussian noise is (ε, δ)-DP (analytic Gaussian
    mechanism, Balle & Wang 2018), by bisection on the decreasing map σ ↦ δ(σ)."""
    if not (epsilon > 0 and math.isfinite(epsilon)) or not 0 < delta < 1:
        raise ValueError("need epsilon > 0 and 0 < delta < 1")
    # slide=False: the bracket's lower end stays at 1e-12·Δ while it grows, the probes that
    # fixed the σ of every report so far
    return calibrate(lambda sigma: analytic_gaussian_delta(sigma, epsilon, sensitivity) <= delta,
                     1e-12 * sensitivity, sensitivity, safe="above", rtol=1e-14, slide=False)


def _dlap_upper_tail(k: int, epsilon: float) -> float:
    """P(Z ≥ k) for the discrete Laplace with P(z) ∝ e^{−ε|z|}, integer k."""
    q = math.exp(-epsilon)
    if k >= 1:
        return math.exp(-epsilon * k) / (1.0 + q)
    # P(Z ≥ k) = 1 − P(Z ≤ k − 1) = 1 − P(Z ≥ 1 − k) by symmetry
    return 1.0 - math.exp(-epsilon * (1 - k)) / (1.0 + q)


def _dlap_margin(epsilon: float, beta: float) -> float:
    """τ_c: the smallest integer k ≥ 1 with P(Z ≥ k) ≤ β for the discrete Laplace of parameter
    ε (the tail, hence the condition, is evaluated exactly as the test uses it; the closed form
    ⌈ln(1/(β(1+e^{−ε})))/ε⌉ is the first guess of the bracket)."""
    q = math.exp(-epsilon)
    guess = max(1, math.ceil(math.log(1.0 / (beta * (1.0 + q))) / epsilon))
    return float(calibrate(lambda k: _dlap_upper_tail(k, epsilon) <= beta, 1, guess + 1,
                           safe="above", integer=True))


@dataclass(frozen=True)
class SupportTest:
    """The public calibration of one candidate's support test (see the module docstring).

    ``scale`` is in count units (b for the Laplace families, σ for the Gaussian); ``tau_count``
    is the margin τ_c in counts (an integer for the discrete Laplace). ``epsilon``/``delta``/
    ``rho`` are the guarantee of *this one test* (ε₀, δ₀, ρ₀). Build with :meth:`calibrate`.
    """

    family: str
    n: int
    epsilon: float
    delta: float
    rho: float | None
    scale: float
    beta: float
    tau_count: float

    # ------------------------------------------------------------------ construction

    @classmethod
    def calibrate(
        cls,
        family: str,
        n: int,
        beta: float,
        *,
        epsilon: float | None = None,
        delta: float = 0.0,
        rho: float | None = None,
    ) -> SupportTest:
        """Calibrate a test of per-candidate budget ε₀ (``epsilon``; with ``delta`` = δ₀ for
        the analytic Gaussian) or ρ₀ (``rho``, Gaussian zCDP only) at level β.

        Privacy contract: the returned test, applied to a count of replace-one sensitivity 1,
        is ε₀-DP (Laplace families), (ε₀, δ₀)-DP or ρ₀-zCDP (Gaussian)."""
        if family not in NOISE_FAMILIES:
            raise ValueError(f"unknown noise family {family!r}; expected one of {NOISE_FAMILIES}")
        if not (isinstance(n, int | np.integer) and n >= 1):
            raise ValueError(f"n must be a positive integer, got {n!r}")
        if not 0 < beta < 0.5:
            raise ValueError(f"beta must be in (0, 1/2), got {beta}")
        if family == "gaussian":
            if rho is not None:
                if not (rho > 0 and math.isfinite(rho)) or epsilon is not None:
                    raise ValueError("give rho > 0 (and no epsilon) for a zCDP Gaussian test")
                if not 0 < delta < 1:
                    raise ValueError(f"a zCDP Gaussian test needs delta in (0, 1), got {delta}")
                sigma = 1.0 / math.sqrt(2.0 * rho)
                # what ρ₀-zCDP implies at δ₀ on its own
                eps0 = Guarantee.zcdp(MECHANISM, "record", "replace-one", rho, delta).epsilon
                tau = sigma * float(norm.isf(beta))
                return cls(family, int(n), eps0, float(delta), float(rho), sigma, beta, tau)
            if epsilon is None or not (epsilon > 0 and math.isfinite(epsilon)):
                raise ValueError("a Gaussian test needs epsilon > 0 (with delta) or rho")
            if not 0 < delta < 1:
                raise ValueError(f"a Gaussian test needs delta in (0, 1), got {delta}")
            sigma = analytic_gaussian_sigma(epsilon, delta)
            tau = sigma * float(norm.isf(beta))
            return cls(family, int(n), float(epsilon), float(delta), None, sigma, beta, tau)
        if rho is not None:
            raise ValueError(f"rho applies to the Gaussian test only, not {family}")
        if epsilon is None or not (epsilon > 0 and math.isfinite(epsilon)):
            raise ValueError(f"epsilon must be finite and > 0, got {epsilon}")
        b = 1.0 / epsilon
        if family == "laplace":
            tau = b * math.log(1.0 / (2.0 * beta))
            return cls(family, int(n), float(epsilon), 0.0, None, b, beta, tau)
        return cls(family, int(n), float(epsilon), 0.0, None, b, beta,
                   _dlap_margin(epsilon, beta))

    def at_level(self, beta: float) -> SupportTest:
        """The same noise (family, n, ε₀/δ₀/ρ₀, scale) with the margin τ_c of level ``beta``.

        Used for the *simultaneous* bound: a bound computed from the same noisy count with
        another margin is post-processing of the same release, so it costs no privacy."""
        if not 0 < beta < 0.5:
            raise ValueError(f"beta must be in (0, 1/2), got {beta}")
        if self.family == "gaussian":
            tau = self.scale * float(norm.isf(beta))
        elif self.family == "laplace":
            tau = self.scale * math.log(1.0 / (2.0 * beta))
        else:
            tau = _dlap_margin(self.epsilon, beta)
        return replace(self, beta=float(beta), tau_count=tau)

    # ------------------------------------------------------------------ public quantities

    @property
    def tau(self) -> float:
        """The margin τ in support units (τ_c / n)."""
        return self.tau_count / self.n

    @property
    def scale_support(self) -> float:
        """The noise scale in support units (scale / n)."""
        return self.scale / self.n

    @property
    def is_discrete(self) -> bool:
        return self.family == "discrete-laplace"

    def upper_tail(self, t: float) -> float:
        """P(Z ≥ t) for a real t in count units (exact law; evaluated in floating point)."""
        if self.is_discrete:
            return _dlap_upper_tail(math.ceil(Fraction(t)), self.epsilon)
        if self.family == "laplace":
            if t <= 0:
                return 1.0 - 0.5 * math.exp(t / self.scale)
            return 0.5 * math.exp(-t / self.scale)
        return float(norm.sf(t / self.scale))

    def lower_tail(self, t: float) -> float:
        """P(Z ≤ −t); equal to :meth:`upper_tail` by symmetry of every family."""
        return self.upper_tail(t)

    @property
    def beta_attained(self) -> float:
        """P(Z ≥ τ_c): equals β for the continuous families, is the largest attainable level
        ≤ β for the discrete Laplace."""
        return self.upper_tail(self.tau_count)

    def noise_pmf(self, z: np.ndarray) -> np.ndarray:
        """P(Z = z) of the discrete Laplace (tests and audits only)."""
        if not self.is_discrete:
            raise ValueError("noise_pmf is defined for the discrete Laplace only")
        from ..privacy.mechanisms import discrete_laplace_pmf

        return np.asarray(discrete_laplace_pmf(np.asarray(z), self.exact_scale))

    @property
    def exact_scale(self) -> Fraction:
        """The discrete Laplace scale as an exact rational, 1/ε₀ (ε₀ read exactly)."""
        return 1 / Fraction(self.epsilon)

    # ------------------------------------------------------------------ the test itself

    def sample(self, rng: np.random.Generator) -> int | float:
        """One noise draw Z in count units from ``rng``. PRIVATE: never release it."""
        if self.is_discrete:
            return int(discrete_laplace(self.exact_scale, rng))
        if self.family == "laplace":
            return float(laplace(self.scale, rng))
        return float(gaussian(self.scale, rng))

    def emits(self, count: int, noise: int | float, theta: float) -> bool:
        """The decision L ≥ θ for a noisy count C + Z (exact rational comparison for the
        discrete Laplace, floating point otherwise)."""
        if self.is_discrete:
            return (int(count) + int(noise) - int(self.tau_count)) >= exact_decimal(theta) * self.n
        return (count + noise - self.tau_count) >= theta * self.n

    def emits_array(self, counts: np.ndarray, noise: np.ndarray, theta: float) -> np.ndarray:
        """Vectorised :meth:`emits` (simulations): same decisions, exact for integer noise
        (C + Z − τ_c ≥ θn ⇔ C + Z − τ_c ≥ ⌈θn⌉ for integers, with θ read as a decimal)."""
        total = np.asarray(counts) + np.asarray(noise) - self.tau_count
        if self.is_discrete:
            return total >= math.ceil(exact_decimal(theta) * self.n)
        return total >= theta * self.n

    def sample_array(self, rng: np.random.Generator, size: int | tuple[int, ...]
                     ) -> np.ndarray:
        """Many i.i.d. noise draws (simulations; the report itself uses :meth:`sample` with one
        stream per candidate)."""
        if self.is_discrete:
            return np.asarray(discrete_laplace(self.exact_scale, rng, size=size))
        if self.family == "laplace":
            return np.asarray(laplace(self.scale, rng, size=size))
        return np.asarray(gaussian(self.scale, rng, size=size))

    def lower_bound(self, count: int, noise: int | float) -> float:
        """The certificate L = (C + Z − τ_c)/n: a (1−β) lower confidence bound on f."""
        if self.is_discrete:
            return float(Fraction(int(count) + int(noise) - int(self.tau_count), self.n))
        return (count + noise - self.tau_count) / self.n

    def emit_probability(self, count: float, theta: float) -> float:
        """Exact Pr[emit] for a candidate with support count ``count`` (the emission curve g(f) of
        ``docs/reports.md``, f = count/n): P(Z ≥ θn + τ_c − C)."""
        if self.is_discrete:
            t = exact_decimal(theta) * self.n + int(self.tau_count) - Fraction(count)
            return _dlap_upper_tail(math.ceil(t), self.epsilon)
        return self.upper_tail(theta * self.n + self.tau_count - count)

    def abstain_probability(self, count: float, theta: float) -> float:
        """Exact Pr[abstain] = 1 − :meth:`emit_probability`, computed without cancellation
        (from the lower tail) so that ratios of tiny abstention probabilities are accurate."""
        if self.is_discrete:
            t = exact_decimal(theta) * self.n + int(self.tau_count) - Fraction(count)
            # P(Z < k) = P(Z ≤ k − 1) = P(Z ≥ 1 − k) by symmetry
            return _dlap_upper_tail(1 - math.ceil(t), self.epsilon)
        return self.upper_tail(-(theta * self.n + self.tau_count - count))

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        """The guarantee of this one test (unit = record, replace-one adjacency; its n is the
        test's own)."""
        details = {"noise": self.family, "scale_counts": self.scale, "n": self.n}
        if self.rho is not None:
            return Guarantee.zcdp(MECHANISM, "record", "replace-one", self.rho, self.delta,
                                  epsilon=self.epsilon, details=details)
        return Guarantee.approximate(MECHANISM, "record", "replace-one", self.epsilon,
                                     self.delta, details=details)

"""Baseline: Amin et al. 2024, private prediction for synthetic text (a baseline of the
InvisibleInk paper; deviations in docs/deviations.md).

Per step, with B references:

* re-centred clipping ``clip_amin(z, C) = clip(z + (C − max z), −C, C)``, aggregate
  ``φ̄_A = (1/B) Σ_i clip_amin(φ_i, C)`` (an empty reference contributes ``clip_amin(φ_pub)``:
  under replace-by-null it *is* the public prompt);
* a sparse vector test decides whether the step needs the private distribution:
  ``d = ‖softmax(φ̄_A) − softmax(φ_pub)‖₁``, ``d̂ = d + Lap(2σ)``; if ``d̂ > θ̂`` the token is
  sampled from ``softmax(φ̄_A/τ)`` (a *private token*) and the threshold is refreshed,
  ``θ̂ = θ + Lap(σ)``; otherwise from ``softmax(φ_pub/τ_pub)`` at no privacy cost;
* generation stops at EOS, at T tokens, or after ``T_prv`` private tokens.

Accounting (charged for the cap ``T_prv``): per private token, the exponential mechanism costs
``ρ_prv = Δ²/(2τ²)`` with Δ the ℓ∞ sensitivity of φ̄_A, and the above-threshold answer costs
``ρ_SVT = ε_SVT²/2`` with ``ε_SVT = 2Δ_d/σ`` (threshold noise Lap(σ), query noise Lap(2σ)) and
Δ_d the sensitivity of the distance d. Two conventions:

* ``correct`` (default): replace-by-null adjacency, Δ = 2C/B (both clipped vectors lie in
  [−C, C]; paper Property 9), and Δ_d = min(2, e^{2Δ} − 1) (a logit shift of at most Δ in
  ℓ∞ moves every softmax probability by a factor within e^{±2Δ}).
* ``paper``: the authors' code — Δ = C/B (valid under zero-out adjacency only) and Δ_d = 1/B
  (an assumption of their code that does not hold: a logit shift within ±C/B moves the ℓ1
  distance by up to 2·tanh(C/2B), attained, 19 times 1/B at B = 100, C = 19.5). With it,
  σ = 0.3, T_prv = 100 and δ = 1e-6 reproduce the paper's infeasible (INF) cells exactly. Its
  guarantee is :meth:`~dplang.privacy.guarantees.Guarantee.unproven` — NOT DP: never charged
  as DP, refused under a budget — and records what the same run provably costs
  (``rho_provable``, with Δ_d = 2·tanh(C/2B)).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..._lazy import lazy_module
from ...privacy import calibration
from ...privacy.accounting import epsilon_to_rho
from ...privacy.guarantees import Adjacency, Guarantee
from ...privacy.mechanisms import exponential_mechanism, laplace
from ..distributions import softmax64
from ..engine import GroupJob, StepPolicy
from .registry import (
    MethodInputs,
    MethodOption,
    MethodSpec,
    at_least,
    finite,
    positive,
    register_method,
)

torch = lazy_module("torch")  # imported on first use (`dplang generate --help` needs none)

CONVENTIONS = ("correct", "paper")


class InfeasibleBudget(ValueError):
    """The budget cannot pay even for the sparse vector test (the paper's "INF")."""


@dataclass(frozen=True)
class AminBudget:
    """Calibration of Amin et al. for a target budget (all public)."""

    clip: float
    rho: float
    rho_private_token: float
    rho_svt: float
    private_tokens: int
    convention: str


def logit_sensitivity(clip: float, batch_size: int, convention: str) -> float:
    """ℓ∞ sensitivity of φ̄_A: 2C/B (correct, replace-by-null) or C/B (paper)."""
    _check_convention(convention)
    return (2.0 if convention == "correct" else 1.0) * clip / batch_size


def svt_query_sensitivity(clip: float, batch_size: int, convention: str) -> float:
    """Sensitivity of d = ‖softmax(φ̄_A) − softmax(φ_pub)‖₁."""
    if convention == "paper":
        return 1.0 / batch_size
    delta_inf = logit_sensitivity(clip, batch_size, convention)
    return min(2.0, math.expm1(2.0 * delta_inf))


def provable_paper_rho(budget: AminBudget, batch_size: int, temperature: float,
                       sigma: float) -> float:
    """What a run calibrated with the ``paper`` convention provably costs under zero-out
    adjacency: ρ_prv with Δ = C/B, and the sparse vector test with the sensitivity the shift
    of φ̄_A within ±C/B (a range of 2C/B) can give the ℓ1 distance, 2·tanh(C/2B) (attained
    by a two-block split of the probabilities; at most 2)."""
    clip = budget.clip
    rho_prv = (clip / batch_size) ** 2 / (2.0 * temperature * temperature)
    eps_svt = 2.0 * min(2.0, 2.0 * math.tanh(clip / (2.0 * batch_size))) / sigma
    return budget.private_tokens * (rho_prv + eps_svt * eps_svt / 2.0)


def step_costs(clip: float, batch_size: int, temperature: float, sigma: float,
               convention: str) -> tuple[float, float]:
    """(ρ_prv, ρ_SVT) of one private token."""
    sens = logit_sensitivity(clip, batch_size, convention)
    rho_prv = sens * sens / (2.0 * temperature * temperature)
    eps_svt = 2.0 * svt_query_sensitivity(clip, batch_size, convention) / sigma
    return rho_prv, eps_svt * eps_svt / 2.0


def _check_convention(convention: str) -> None:
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")


def calibrate(
    epsilon: float, delta: float, batch_size: int, temperature: float, sigma: float = 0.3,
    private_tokens: int = 100, convention: str = "correct",
) -> AminBudget:
    """The clip norm that spends (ε, δ) over ``private_tokens`` private tokens.

    Raises :class:`InfeasibleBudget` (with the numbers) when the sparse vector test alone
    exceeds the per-token budget."""
    _check_convention(convention)
    if batch_size < 1 or private_tokens < 1 or not sigma > 0 or not temperature > 0:
        raise ValueError("batch_size, private_tokens >= 1 and sigma, temperature > 0")
    rho = epsilon_to_rho(epsilon, delta)
    rho_tok = rho / private_tokens
    if convention == "paper":
        rho_svt = step_costs(1.0, batch_size, temperature, sigma, convention)[1]
        if rho_svt >= rho_tok:
            raise InfeasibleBudget(
                f"infeasible: the sparse vector test alone costs rho_SVT = 2/(B*sigma)^2 = "
                f"{rho_svt:.5g} per private token, at least the per-token budget "
                f"rho/T_prv = {rho:.5g}/{private_tokens} = {rho_tok:.5g} (B={batch_size}, "
                f"sigma={sigma}, eps={epsilon}, delta={delta})"
            )
        clip = temperature * batch_size * math.sqrt(2.0 * (rho_tok - rho_svt))
    else:
        # the largest C whose per-token cost ρ_prv(C) + ρ_SVT(C) is within ρ/T_prv
        clip = calibration.calibrate(
            lambda c: sum(step_costs(c, batch_size, temperature, sigma, convention)) <= rho_tok,
            0.0, 1.0, safe="below")
    rho_prv, rho_svt = step_costs(clip, batch_size, temperature, sigma, convention)
    return AminBudget(clip, private_tokens * (rho_prv + rho_svt), rho_prv, rho_svt,
                      private_tokens, convention)


def clip_amin(logits: torch.Tensor, clip: float) -> torch.Tensor:
    """Re-centred clipping: shift each row so its max is C, then clip to [−C, C]."""
    shifted = logits + (clip - logits.max(dim=-1, keepdim=True).values)
    return shifted.clamp(-clip, clip)


def _clipped_steps(logits: torch.Tensor, clip: float, q: int) -> np.ndarray:
    """Each row's re-centred clipped logits as integers on the grid 2^−q, in
    [−(⌊C·2^q⌋ − 1), ⌊C·2^q⌋ − 1]: computed in float64 from that row alone; a NaN (a broken
    row, or ∞ − ∞ after the shift) counts as 0, whatever the row holds the integer stays in
    range."""
    t = logits.detach().cpu().to(torch.float64)
    clipped = clip_amin(t, clip).numpy().astype(np.float64, copy=True)
    clipped[np.isnan(clipped)] = 0.0
    steps = np.rint(np.ldexp(clipped, q))
    limit = float(max(math.floor(math.ldexp(clip, q)) - 1, 0))
    return np.clip(steps, -limit, limit)


def aggregate(private: torch.Tensor, public: torch.Tensor, clip: float,
              batch_size: int) -> np.ndarray:
    """φ̄_A = (1/B) Σ_i clip_amin(φ_i, C) over the B references, an empty one contributing
    clip_amin(φ_pub), as the float64 scores the sampler receives.

    Exact sensitivity: like InvisibleInk's ``candidate_scores`` (docs/privacy.md, "Numerics of
    the aggregate"), the sum is taken in fixed point on a public grid 2^−q, q = 51 −
    ⌈log₂(B·(C + 1))⌉: each clipped row is an integer vector in [−L, L], L = ⌊C·2^q⌋ − 1, their
    sum N is exact (|N| ≤ B·L < 2^51) in any order, and φ̄ = fl(N/B)·2^−q. Replacing one
    reference by the empty one changes N by at most 2L = 2⌊C·2^q⌋ − 2 exactly; |N/B| < 2^51/B,
    whose ulp is at most 2^−1/B, so each division rounds by at most 1/(4B) grid steps and the
    float64 scores of neighbours differ by at most (2L + 1/2)/B < 2C·2^q/B grid steps: 2C/B,
    exactly (a float32 aggregate exceeds it by ~3e-6 at logits 20–40). Public-only cost: the
    public row is rounded to the grid."""
    m = private.shape[0]
    if m > batch_size:
        raise ValueError(f"{m} private rows for a batch of {batch_size}")
    q = 51 - math.ceil(math.log2(batch_size * (float(clip) + 1.0)))
    total = (batch_size - m) * _clipped_steps(public.unsqueeze(0), clip, q)[0]
    if m:
        total = total + _clipped_steps(private, clip, q).sum(axis=0)
    return np.ldexp(total / batch_size, -q)


class AminPolicy:
    """One generation of Amin et al. (dense: needs the private logits on the whole vocabulary)."""

    def __init__(self, budget: AminBudget, batch_size: int, temperature: float,
                 public_temperature: float = 1.0, threshold: float = 0.7,
                 sigma: float = 0.3) -> None:
        self.budget, self.batch_size = budget, batch_size
        self.temperature, self.public_temperature = temperature, public_temperature
        self.threshold, self.sigma = threshold, sigma
        self.noisy_threshold: float | None = None
        self.private_tokens = 0

    def candidates(self, public: torch.Tensor) -> None:
        return None

    def choose(self, public: torch.Tensor, private: torch.Tensor, ids: torch.Tensor | None,
               rng: np.random.Generator) -> int | None:
        if self.private_tokens >= self.budget.private_tokens:
            return None
        if self.noisy_threshold is None:
            self.noisy_threshold = self.threshold + float(laplace(self.sigma, rng))
        scores = aggregate(private, public, self.budget.clip, self.batch_size)
        # tokens the public logits exclude (the engine's banned control tokens: the same for
        # every neighbour) are excluded from the private distribution too
        scores[np.isneginf(public.to(torch.float64).numpy())] = -np.inf
        p_pub = softmax64(public)
        distance = float(np.abs(softmax64(torch.from_numpy(scores)) - p_pub).sum())
        if distance + float(laplace(2.0 * self.sigma, rng)) > self.noisy_threshold:
            self.noisy_threshold = self.threshold + float(laplace(self.sigma, rng))
            self.private_tokens += 1
            return int(exponential_mechanism(scores, self.temperature, rng,
                                             mask=~np.isneginf(scores)))
        scores = public.to(torch.float64).numpy()
        return int(exponential_mechanism(scores, self.public_temperature, rng,
                                         mask=~np.isneginf(scores)))

    def stats(self) -> dict[str, int]:
        return {"private_tokens": self.private_tokens}


@dataclass(frozen=True)
class AminParams:
    """A calibrated Amin et al. run: its :class:`AminBudget` and the public decoding options.

    Privacy contract: each generation is charged ``budget.rho`` (the cap on private tokens,
    whatever is emitted); generations over disjoint batches compose in parallel."""

    budget: AminBudget
    epsilon: float
    delta: float
    batch_size: int
    temperature: float
    public_temperature: float
    threshold: float
    sigma: float

    @classmethod
    def calibrate(cls, inputs: MethodInputs, options: Mapping[str, Any]) -> AminParams:
        if inputs.epsilon is None:
            raise ValueError("needs --epsilon (its accounting is calibrated from ε)")
        budget = calibrate(inputs.epsilon, inputs.delta, inputs.batch_size, inputs.temperature,
                           options["sigma"], options["private_tokens"], options["convention"])
        return cls(budget, inputs.epsilon, inputs.delta, inputs.batch_size, inputs.temperature,
                   options["public_temperature"], options["threshold"], options["sigma"])

    @property
    def clip(self) -> float:
        return self.budget.clip

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        """The guarantee of every run with these parameters, calibrated for (ε, δ) (checked:
        the charged ρ must imply it)."""
        budget = self.budget
        adjacency = "replace-by-null" if budget.convention == "correct" else "zero-out"
        details = {
            "clip": budget.clip, "private_tokens_cap": budget.private_tokens,
            "rho_private_token": budget.rho_private_token, "rho_svt": budget.rho_svt,
            "convention": budget.convention,
            "charged": "for the cap on private tokens, whatever is emitted",
        }
        if budget.convention == "paper":
            details["claimed_rho"] = budget.rho
            details["rho_provable"] = provable_paper_rho(budget, self.batch_size,
                                                         self.temperature, self.sigma)
            return Guarantee.unproven(
                "amin", "reference", adjacency, self.epsilon, self.delta,
                assumption=("the paper's code takes the sensitivity of its sparse vector "
                            "test's distance to be 1/B, but a logit shift within ±C/B moves "
                            "it by up to 2·tanh(C/2B); with that sensitivity this run costs "
                            f"ρ = {details['rho_provable']:.4g}, not {budget.rho:.4g}"),
                details=details)
        return Guarantee.zcdp("amin", "reference", adjacency, budget.rho, self.delta,
                              epsilon=self.epsilon, details=details)

    def policy_factory(self, vocab_size: int) -> Callable[[GroupJob], StepPolicy]:
        return lambda _job: AminPolicy(self.budget, self.batch_size, self.temperature,
                                       self.public_temperature, self.threshold, self.sigma)


SPEC = register_method(MethodSpec(
    name="amin",
    summary="Amin et al. 2024: sparse vector test between public and private tokens, "
            "re-centred clipping",
    adjacencies=(Adjacency.REPLACE_BY_NULL, Adjacency.ZERO_OUT),
    calibrate=AminParams.calibrate,
    options=(
        MethodOption("sigma", float, 0.3, "SVT noise σ.", positive),
        MethodOption("threshold", float, 0.7, "SVT threshold θ.", finite),
        MethodOption("private_tokens", int, 100, "Cap on private tokens (charged).",
                     at_least(1)),
        MethodOption("public_temperature", float, 1.0, "Temperature of public tokens.",
                     positive),
        MethodOption("convention", str, "correct",
                     "Sensitivity: correct (2C/B, replace-by-null) or paper (C/B).",
                     choices=CONVENTIONS),
    ),
))

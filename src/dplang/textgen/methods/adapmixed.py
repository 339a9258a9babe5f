"""Baseline: AdaPMixED (Flemings et al. 2024), adapted to generation (docs/deviations.md).

Per step, with the public distribution ``p_pub = softmax(φ_pub/τ)`` and one distribution per
reference ``p_i = softmax(φ_i/τ)``:

1. *noisy screening*: on the public top-``screen_k`` tokens, compare ``p_pub`` with the
   Gaussian-noised mixture ``p_mix = λ·mean_i p_i + (1−λ)·p_pub``; cost ``α·(λ/(Bσ))²`` (RDP
   of order α, as the authors' code charges it). If the symmetric Rényi divergence exceeds
   ``screen_threshold`` the token is sampled from ``p_pub`` at no further cost;
2. otherwise each reference gets the largest mixing weight λ_i with
   ``D^sym_α(p_pub, (1−λ_i)p_pub + λ_i p_i) = β·α`` (root search; 0 when none), the token is
   sampled from ``p = mean_i mix_i``, and the step costs ``max_i D^sym_α(p_{−i}, p)`` where
   ``p_{−i}`` leaves reference i out (add-or-remove: mean of the others; replace-by-null: the
   others plus ``p_pub`` for the empty reference);
3. the running cost converts to ε by ``cost + log(1 − 1/α) − log(δα)/(α − 1)``; the generation
   stops *before* sampling once this exceeds the target ε.

Privacy contract: **none in the sense of differential privacy.** The accounting is
data-dependent: the cost of each step is computed from the private references, and so is the
length at which the budget runs out. A neighbouring batch has other costs and stops elsewhere, so
the target (ε, δ) is a stopping rule, not an (ε, δ)-DP bound; :meth:`AdaPMixEDParams.guarantee`
is marked ``ex_ante=False`` and its summary says that the release does not satisfy differential
privacy. The exact running cost is itself a function of the private data (it differs between
neighbours), so :meth:`AdaPMixEDPolicy.stats` does not publish it (no ``rdp_cost`` or
``epsilon_spent`` in the output records); :attr:`AdaPMixEDPolicy.cost` keeps it in memory only.

The library keeps the authors' per-batch ``add-remove`` formula (removing one reference from a
batch of B); ``dplang generate`` offers only ``replace-by-null``, because removing a row of the
data file would shift every later reference into another batch (docs/deviations.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..._lazy import lazy_module
from ...privacy.guarantees import Adjacency, Guarantee
from ...privacy.mechanisms import gaussian
from ..distributions import softmax64
from ..engine import GroupJob, StepPolicy
from .registry import MethodInputs, MethodSpec, register_method

torch = lazy_module("torch")  # imported on first use (`dplang generate --help` needs none)

ADJACENCIES = ("add-remove", "replace-by-null")


@dataclass(frozen=True)
class AdaPMixEDParams:
    """Hyperparameters (defaults: the authors' code; docs/deviations.md)."""

    epsilon: float
    delta: float = 1e-6
    temperature: float = 1.0
    screen_k: int = 60
    screen_threshold: float = 4.5
    sigma: float = 0.01
    alpha: float = 15.0
    beta: float = 0.3
    mix_lambda: float = 1e-4
    adjacency: str = "add-remove"

    def __post_init__(self) -> None:
        if self.adjacency not in ADJACENCIES:
            raise ValueError(f"adjacency must be one of {ADJACENCIES}, got {self.adjacency!r}")
        if not self.epsilon > 0 or not 0 < self.delta < 1 or not self.alpha > 1:
            raise ValueError("epsilon > 0, delta in (0, 1) and alpha > 1 are required")

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        return Guarantee.data_dependent(
            "adapmixed", "reference", self.adjacency, self.epsilon, self.delta,
            details={"accounting": "data-dependent Rényi DP (order alpha), generation stops "
                     "when the running epsilon would exceed the target", "alpha": self.alpha,
                     "sigma": self.sigma, "beta": self.beta, "lambda": self.mix_lambda},
        )

    def epsilon_of(self, rdp_cost: float) -> float:
        a = self.alpha
        return rdp_cost + math.log1p(-1.0 / a) - math.log(self.delta * a) / (a - 1.0)


def renyi(p: np.ndarray, q: np.ndarray, alpha: float) -> float:
    """D_α(p‖q) for distributions with full support (log-sum-exp)."""
    mask = p > 0
    with np.errstate(divide="ignore"):
        terms = alpha * np.log(p[mask]) + (1 - alpha) * np.log(np.maximum(q[mask], 1e-300))
    top = terms.max()
    return float((top + math.log(np.exp(terms - top).sum())) / (alpha - 1.0))


def renyi_sym(p: np.ndarray, q: np.ndarray, alpha: float) -> float:
    """max(D_α(p‖q), D_α(q‖p))."""
    return max(renyi(p, q, alpha), renyi(q, p, alpha))


def mixing_weight(p_pub: np.ndarray, p_i: np.ndarray, alpha: float, beta: float) -> float:
    """Largest λ in (1e-5, 1 − 1e-5) with D^sym_α(p_pub, mix) = β·α (0 if no root)."""

    def f(lam: float) -> float:
        return renyi_sym(p_pub, (1 - lam) * p_pub + lam * p_i, alpha) - beta * alpha

    lo, hi = 1e-5, 1 - 1e-5
    try:
        f_lo, f_hi = f(lo), f(hi)
        if not (np.isfinite(f_lo) and np.isfinite(f_hi)) or f_lo * f_hi > 0:
            return 0.0 if f_lo > 0 else (hi if f_hi < 0 else 0.0)
        from scipy.optimize import brentq

        return float(brentq(f, lo, hi, xtol=1e-6))
    except (ValueError, FloatingPointError):
        return 0.0


class AdaPMixEDPolicy:
    """One generation of AdaPMixED (dense private logits)."""

    def __init__(self, params: AdaPMixEDParams, batch_size: int) -> None:
        self.p, self.batch_size = params, batch_size
        self.cost = 0.0
        self.private_steps = 0
        self.public_steps = 0

    def candidates(self, public: torch.Tensor) -> None:
        return None

    def choose(self, public: torch.Tensor, private: torch.Tensor, ids: torch.Tensor | None,
               rng: np.random.Generator) -> int | None:
        prm, b = self.p, self.batch_size
        p_pub = softmax64(public, prm.temperature)
        nulls = b - private.shape[0]
        p_refs = softmax64(private, prm.temperature) if private.shape[0] else p_pub[None, :0]
        if nulls:  # an empty reference's distribution is the public one
            p_refs = np.concatenate([p_refs.reshape(-1, p_pub.size),
                                     np.repeat(p_pub[None, :], nulls, axis=0)])
        # 1. noisy screening on the public top-k
        cost = self.cost + prm.alpha * (prm.mix_lambda / (b * prm.sigma)) ** 2
        idx = np.argsort(p_pub)[-prm.screen_k:]
        p_mix = prm.mix_lambda * p_refs.mean(axis=0) + (1 - prm.mix_lambda) * p_pub
        noisy = np.maximum(p_mix[idx] + gaussian(prm.sigma, rng, size=idx.size), 1e-12)
        pub_top = p_pub[idx] / p_pub[idx].sum()
        if renyi_sym(pub_top, noisy / noisy.sum(), prm.alpha) > prm.screen_threshold:
            dist = p_pub
            private_step = False
        else:
            lams = [mixing_weight(p_pub, p_refs[i], prm.alpha, prm.beta) for i in range(b)]
            mixes = np.stack([(1 - lam) * p_pub + lam * p_refs[i] for i, lam in enumerate(lams)])
            dist = mixes.mean(axis=0)
            total = mixes.sum(axis=0)
            worst = 0.0
            for i in range(b):
                if prm.adjacency == "add-remove":
                    left_out = (total - mixes[i]) / max(b - 1, 1)
                else:
                    left_out = (total - mixes[i] + p_pub) / b
                worst = max(worst, renyi_sym(left_out, dist, prm.alpha))
            cost += worst
            private_step = True
        if prm.epsilon_of(cost) > prm.epsilon:
            return None  # budget spent: stop before sampling
        self.cost = cost
        if private_step:
            self.private_steps += 1
        else:
            self.public_steps += 1
        dist = dist / dist.sum()
        return int(rng.choice(dist.size, p=dist))

    def stats(self) -> dict[str, float | int]:
        """Per-generation statistics written to the output. The running privacy cost is
        deliberately absent: it is an exact function of the private references."""
        return {"private_steps": self.private_steps, "public_steps": self.public_steps}


@dataclass(frozen=True)
class AdaPMixEDRun:
    """AdaPMixED's params as a registered method: :class:`AdaPMixEDParams` and B.

    Privacy contract: the guarantee is data-dependent (``ex_ante=False``), and says so."""

    params: AdaPMixEDParams
    batch_size: int
    clip: float = 0.0

    @classmethod
    def calibrate(cls, inputs: MethodInputs, options: Mapping[str, Any]) -> AdaPMixEDRun:
        if inputs.epsilon is None:
            raise ValueError("needs --epsilon (its accounting is calibrated from ε)")
        return cls(AdaPMixEDParams(epsilon=inputs.epsilon, delta=inputs.delta,
                                   temperature=inputs.temperature,
                                   adjacency=str(inputs.adjacency)), inputs.batch_size)

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        return self.params.guarantee()

    def policy_factory(self, vocab_size: int) -> Callable[[GroupJob], StepPolicy]:
        return lambda _job: AdaPMixEDPolicy(self.params, self.batch_size)


SPEC = register_method(MethodSpec(
    name="adapmixed",
    summary="AdaPMixED (Flemings et al. 2024): data-dependent mixing, NOT ex-ante DP",
    adjacencies=(Adjacency.REPLACE_BY_NULL,),
    calibrate=AdaPMixEDRun.calibrate,
))

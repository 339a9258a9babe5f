"""InvisibleInk (Vinod, Pillutla, Thakurta 2025, Algorithm 1): one private decoding step.

For a generation with B private references R = (r_1..r_B), public prompt q and prefix x_<t:

* DClip:        DClip_C(φ_i, φ_pub) = φ_pub + clip_C(φ_i − φ_pub)   (coordinate-wise to [−C, C])
* aggregate:    φ̄ = φ_pub + (1/B) Σ_i clip_C(φ_i − φ_pub)
* Top-k+:       V_k^+ = {y : φ_pub(y) ≥ ℓ − 2C/B}, ℓ the k-th largest public logit (k = 0 or
                k ≥ |V| means the whole vocabulary)
* sample:       x_t ~ softmax(φ̄[V_k^+] / τ)   (exponential mechanism over V_k^+)

Privacy contract (spec 002 §2.4, §5): under replace-by-null adjacency the aggregate has ℓ∞
sensitivity C/B, provided an empty reference contributes *exactly* the public logits (this
module's callers never compute logits for an empty reference: its clipped difference is
exactly 0 by construction). V_k^+ is a function of the public logits only. Each step is therefore
ρ_tok = C²/(2B²τ²)-zCDP and a generation of at most T tokens is T·ρ_tok-zCDP (charged for T).

The functions here are pure tensor/numpy code shared by the dense path (private logits over the
whole vocabulary) and the sparse path (private logits only on V_k^+): both reduce to the same
compact candidate scores and the same sampler, so they have the same sampling distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..privacy.mechanisms import exponential_mechanism


def clip(values: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """clip_C: coordinate-wise projection onto [−C, C]."""
    return values.clamp(-clip_norm, clip_norm)


def dclip(private: torch.Tensor, public: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """DClip_C(φ, φ_pub) = φ_pub + clip_C(φ − φ_pub) (broadcasts ``public`` over rows)."""
    return public + clip(private - public, clip_norm)


def aggregate(
    private: torch.Tensor, public: torch.Tensor, clip_norm: float, batch_size: int
) -> torch.Tensor:
    """φ̄ = φ_pub + (1/B) Σ_i clip_C(φ_i − φ_pub) over the rows of ``private``.

    ``private`` holds the logits of the *non-empty* references, ``[m, K]`` with m ≤ B; the
    B − m empty references contribute clip_C(φ_pub − φ_pub) = 0 exactly, which is why they are
    never computed. ``batch_size`` is the public B (never m): dividing by m would make the
    sensitivity data-dependent.
    """
    if private.shape[0] > batch_size:
        raise ValueError(f"{private.shape[0]} private rows for a batch of {batch_size}")
    if private.shape[0] == 0:
        return public.clone()
    diffs = clip(private - public, clip_norm)
    return public + diffs.sum(dim=0) / batch_size


def topk_threshold(public: torch.Tensor, k: int) -> torch.Tensor:
    """ℓ, the k-th largest public logit (last dimension, kept as size 1), or −inf when
    ``k <= 0`` or ``k >= |V|`` (the full vocabulary)."""
    vocab = public.shape[-1]
    if k <= 0 or k >= vocab:
        return torch.full((*public.shape[:-1], 1), float("-inf"), dtype=public.dtype)
    return torch.topk(public, k, dim=-1).values[..., -1:]


def expanded_topk_mask(
    public: torch.Tensor,
    k: int,
    clip_norm: float,
    batch_size: int,
    threshold: torch.Tensor | None = None,
) -> torch.Tensor:
    """Boolean mask of V_k^+ = {y : φ_pub(y) ≥ ℓ − 2C/B} over the last dimension.

    Reads only the public logits (and the public k, C, B); ``threshold`` may pass ℓ when the
    caller already computed it with :func:`topk_threshold`. ``k <= 0`` or ``k >= |V|`` gives
    the full vocabulary."""
    vocab = public.shape[-1]
    if k <= 0 or k >= vocab:
        return torch.ones_like(public, dtype=torch.bool)
    ell = topk_threshold(public, k) if threshold is None else threshold
    return public >= ell - 2.0 * clip_norm / batch_size


@dataclass(frozen=True)
class StepResult:
    """One sampled token and the statistics the paper reports (Table 12)."""

    token: int
    candidates: int  # |V_k^+|
    from_expansion: bool  # sampled from V_k^+ \ V_k (φ_pub(token) below ℓ)


def candidate_scores(
    private_on_candidates: torch.Tensor,
    public_on_candidates: torch.Tensor,
    clip_norm: float,
    batch_size: int,
) -> np.ndarray:
    """Aggregated scores φ̄ restricted to the candidates, as float64 (compact, ascending ids)."""
    agg = aggregate(private_on_candidates, public_on_candidates, clip_norm, batch_size)
    return agg.to(torch.float64).numpy()


def sample_from_candidates(
    scores: np.ndarray, candidate_ids: np.ndarray, temperature: float, rng: np.random.Generator
) -> int:
    """Exponential mechanism over the candidate set: returns a token id."""
    index = exponential_mechanism(scores, temperature, rng)
    return int(candidate_ids[index])


def step_probabilities(
    private: torch.Tensor,
    public: torch.Tensor,
    clip_norm: float,
    batch_size: int,
    temperature: float,
    k: int,
) -> np.ndarray:
    """The exact next-token law softmax(φ̄[V_k^+]/τ) over the whole vocabulary (float64).

    Reference implementation used by tests and audits (dense; zeros outside V_k^+)."""
    mask = expanded_topk_mask(public, k, clip_norm, batch_size).numpy()
    scores = aggregate(private, public, clip_norm, batch_size).to(torch.float64).numpy()
    out = np.zeros_like(scores)
    s = scores[mask] / temperature
    s = np.exp(s - s.max())
    out[mask] = s / s.sum()
    return out


def invisibleink_step(
    private: torch.Tensor,
    public: torch.Tensor,
    clip_norm: float,
    batch_size: int,
    temperature: float,
    k: int,
    rng: np.random.Generator,
) -> StepResult:
    """One dense InvisibleInk step for one generation: full-vocabulary logits in, a token out.

    ``private``: ``[m, V]`` logits of the m ≤ B non-empty references; ``public``: ``[V]``.
    Runs exactly the engine's :class:`InvisibleInkPolicy` on the dense logits."""
    policy = InvisibleInkPolicy(clip_norm, batch_size, temperature, k, public.shape[-1])
    ids = policy.candidates(public)
    token = policy.choose(public, private if ids is None else private[:, ids], ids, rng)
    return StepResult(token, policy.sizes[-1], policy.expansion > 0)


class InvisibleInkPolicy:
    """InvisibleInk as a per-generation step policy for the engine.

    :meth:`candidates` computes V_k^+ from the public logits alone (``None`` for the full
    vocabulary); :meth:`choose` aggregates the DClipped private logits on V_k^+ and samples
    with the exponential mechanism. Records |V_k^+| per step and how many sampled tokens came
    from V_k^+ \\ V_k (public logit below ℓ)."""

    def __init__(self, clip_norm: float, batch_size: int, temperature: float, top_k: int,
                 vocab_size: int) -> None:
        self.clip_norm, self.batch_size = clip_norm, batch_size
        self.temperature, self.top_k, self.vocab_size = temperature, top_k, vocab_size
        self.sizes: list[int] = []
        self.expansion = 0
        self._ell = float("-inf")

    @property
    def full_vocabulary(self) -> bool:
        return self.top_k <= 0 or self.top_k >= self.vocab_size

    def candidates(self, public: torch.Tensor) -> torch.Tensor | None:
        if self.full_vocabulary:
            return None
        ell = topk_threshold(public, self.top_k)
        self._ell = float(ell.squeeze())
        mask = expanded_topk_mask(public, self.top_k, self.clip_norm, self.batch_size, ell)
        return torch.nonzero(mask).squeeze(-1)

    def choose(self, public: torch.Tensor, private: torch.Tensor, ids: torch.Tensor | None,
               rng: np.random.Generator) -> int:
        if ids is None:
            ids = torch.arange(public.shape[-1])
        scores = candidate_scores(private, public[ids], self.clip_norm, self.batch_size)
        token = sample_from_candidates(scores, ids.numpy(), self.temperature, rng)
        self.sizes.append(int(ids.numel()))
        if float(public[token]) < self._ell:
            self.expansion += 1
        return token

    def stats(self) -> dict[str, float | int]:
        sizes = np.asarray(self.sizes, dtype=np.float64)
        return {
            "topk_plus_mean": float(sizes.mean()) if sizes.size else 0.0,
            "topk_plus_std": float(sizes.std()) if sizes.size else 0.0,
            "topk_plus_min": int(sizes.min()) if sizes.size else 0,
            "expansion_tokens": self.expansion,
        }

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

Numerics (what makes the bound hold for the floats the sampler actually receives):

* **Any private logit is clipped.** A private difference φ_i − φ_pub that is NaN counts as 0
  (the empty reference's value), +inf as +C and −inf as −C, so every reference contributes a
  value in [−C, C] whatever its model returned; nothing a reference does can abort the run.
* **Non-finite public logits are a public decision** (:func:`public_support`): a token whose
  public logit is NaN or −inf is never a candidate; if some public logits are +inf, the
  candidates are exactly those tokens and the step is uniform over them without reading the
  private rows (the limit of the exponential mechanism when φ_pub → +inf, since a bounded
  private shift cannot matter there). A public row with no finite logit and no +inf one is
  refused (ValueError) — the same for every neighbouring data set.
* **Exact sensitivity in float64** (:func:`candidate_scores`). The scores are computed in
  fixed point on a public grid 2^−q (q from max |φ_pub|, C and B only): every clipped difference
  is an integer number of grid steps in [−(⌊C·2^q⌋ − 2), ⌊C·2^q⌋ − 2], their sum and
  N = B·round(φ_pub·2^q) + Σ_i d_i are exact integers below 2^52, and φ̄ = fl(N/B)·2^−q. Removing
  one reference changes N by at most ⌊C·2^q⌋ − 2 exactly, and each of the two divisions rounds
  by less than one grid step / B, so |φ̄(D)(y) − φ̄(D')(y)| ≤ C/B holds for the float64 values
  themselves, not only up to rounding (float32 arithmetic exceeds C/B by ~2e-6 at logits 20–40).
  The public logits are rounded to the grid (2^−q ≈ 1e-13 for typical logits): a public-only
  change of the sampling law far below anything measurable.

The functions here are pure tensor/numpy code shared by the dense path (private logits over the
whole vocabulary) and the sparse path (private logits only on V_k^+): both reduce to the same
compact candidate scores and the same sampler, so they have the same sampling distribution.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..privacy.mechanisms import exponential_mechanism

#: Called by :meth:`InvisibleInkPolicy.choose` just before sampling, with the candidate token
#: ids, their float64 scores and the temperature: the exact next-token law is
#: ``exponential_mechanism_probabilities(scores, temperature)`` on those ids (audits use it).
ScoreObserver = Callable[[np.ndarray, np.ndarray, float], None]


def clip(values: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """clip_C: coordinate-wise projection onto [−C, C]; NaN ↦ 0, ±inf ↦ ±C."""
    return torch.nan_to_num(values, nan=0.0).clamp(-clip_norm, clip_norm)


def dclip(private: torch.Tensor, public: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """DClip_C(φ, φ_pub) = φ_pub + clip_C(φ − φ_pub) (broadcasts ``public`` over rows)."""
    return public + clip(private - public, clip_norm)


def aggregate(
    private: torch.Tensor, public: torch.Tensor, clip_norm: float, batch_size: int
) -> torch.Tensor:
    """φ̄ = φ_pub + (1/B) Σ_i clip_C(φ_i − φ_pub) over the rows of ``private`` (float64).

    ``private`` holds the logits of the *non-empty* references, ``[m, K]`` with m ≤ B; the
    B − m empty references contribute clip_C(φ_pub − φ_pub) = 0 exactly, which is why they are
    never computed. ``batch_size`` is the public B (never m): dividing by m would make the
    sensitivity data-dependent. This is the textbook formula in float64 (reference for tests);
    the sampler uses :func:`candidate_scores`, whose sensitivity bound is exact in float64.
    """
    if private.shape[0] > batch_size:
        raise ValueError(f"{private.shape[0]} private rows for a batch of {batch_size}")
    pub = public.to(torch.float64)
    if private.shape[0] == 0:
        return pub.clone()
    diffs = clip(private.to(torch.float64) - pub, clip_norm)
    return pub + diffs.sum(dim=0) / batch_size


def public_support(public: torch.Tensor) -> torch.Tensor:
    """The tokens the public logits allow (boolean mask; a function of ``public`` only).

    NaN and −inf public logits are excluded; if any public logit is +inf, exactly the +inf
    tokens are allowed (see the module docstring)."""
    plus = torch.isposinf(public)
    if bool(plus.any()):
        return plus
    return torch.isfinite(public)


def topk_threshold(public: torch.Tensor, k: int) -> torch.Tensor:
    """ℓ, the k-th largest public logit (last dimension, kept as size 1), or −inf when
    ``k <= 0`` or ``k >= |V|`` (the full vocabulary). NaN public logits count as −inf."""
    vocab = public.shape[-1]
    if k <= 0 or k >= vocab:
        return torch.full((*public.shape[:-1], 1), float("-inf"), dtype=public.dtype)
    clean = torch.nan_to_num(public, nan=float("-inf"), posinf=float("inf"),
                             neginf=float("-inf"))
    return torch.topk(clean, k, dim=-1).values[..., -1:]


def expanded_topk_mask(
    public: torch.Tensor,
    k: int,
    clip_norm: float,
    batch_size: int,
    threshold: torch.Tensor | None = None,
) -> torch.Tensor:
    """Boolean mask of V_k^+ = {y : φ_pub(y) ≥ ℓ − 2C/B} ∩ :func:`public_support`.

    Reads only the public logits (and the public k, C, B); ``threshold`` may pass ℓ when the
    caller already computed it with :func:`topk_threshold`. ``k <= 0`` or ``k >= |V|`` gives
    the whole (public) support."""
    support = public_support(public)
    vocab = public.shape[-1]
    if k <= 0 or k >= vocab:
        return support
    ell = topk_threshold(public, k) if threshold is None else threshold
    return support & (public >= ell - 2.0 * clip_norm / batch_size)


@dataclass(frozen=True)
class StepResult:
    """One sampled token and the statistics the paper reports (Table 12)."""

    token: int
    candidates: int  # |V_k^+|
    from_expansion: bool  # sampled from V_k^+ \ V_k (φ_pub(token) below ℓ)


def grid_exponent(public_abs_max: float, clip_norm: float, batch_size: int) -> int:
    """The public grid 2^−q of :func:`candidate_scores`: the largest q with
    B·(max|φ_pub| + C + 1)·2^q ≤ 2^51, so that every integer in the computation is exact."""
    bound = batch_size * (float(public_abs_max) + float(clip_norm) + 1.0)
    if not math.isfinite(bound):
        raise ValueError("public logits and the clip norm must be finite")
    return 51 - math.ceil(math.log2(bound))


def _float64(values: torch.Tensor) -> np.ndarray:
    t = values.detach().cpu()
    if t.dtype not in (torch.float32, torch.float64):
        t = t.to(torch.float64)
    return np.asarray(t.numpy(), dtype=np.float64)


def candidate_scores(
    private_on_candidates: torch.Tensor,
    public_on_candidates: torch.Tensor,
    clip_norm: float,
    batch_size: int,
) -> np.ndarray:
    """Aggregated scores φ̄ restricted to the candidates, as float64 (compact, ascending ids).

    ``public_on_candidates`` must be finite (candidates come from :func:`public_support`);
    private logits may be anything (NaN, ±inf included). Fixed-point construction (module
    docstring): for neighbours that differ by one non-empty reference (present in one, absent
    in the other) the returned values differ by at most C/B *exactly*, coordinate by
    coordinate.
    """
    m = private_on_candidates.shape[0]
    if m > batch_size:
        raise ValueError(f"{m} private rows for a batch of {batch_size}")
    pub = _float64(public_on_candidates)
    top = float(np.abs(pub).max()) if pub.size else 0.0
    if not math.isfinite(top):
        raise ValueError("public logits on the candidates must be finite (see public_support)")
    q = grid_exponent(top, clip_norm, batch_size)
    # P = φ_pub on the grid: |φ_pub|·2^q ≤ 2^51, so the product and the rounding are exact.
    total = batch_size * np.rint(np.ldexp(pub, q))
    if m:
        limit = float(max(math.floor(math.ldexp(clip_norm, q)) - 2, 0))
        diff = _float64(private_on_candidates) - pub
        diff[np.isnan(diff)] = 0.0  # NaN: the empty reference's contribution; ±inf: ±C below
        np.clip(diff, -clip_norm, clip_norm, out=diff)
        steps = np.rint(np.ldexp(diff, q))
        np.clip(steps, -limit, limit, out=steps)
        # integers of magnitude ≤ B·C·2^q < 2^51: the sum is exact in any order
        total = total + steps.sum(axis=0)
    return np.ldexp(total / batch_size, -q)


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
    """The exact next-token law of one InvisibleInk step over the whole vocabulary (float64).

    Computed from the very scores :class:`InvisibleInkPolicy` samples from (dense private
    logits ``[m, V]``; zeros outside V_k^+). Reference implementation for tests and audits."""
    from ..privacy.mechanisms import exponential_mechanism_probabilities

    policy = InvisibleInkPolicy(clip_norm, batch_size, temperature, k, public.shape[-1])
    ids = policy.candidates(public)
    ids_np, scores = policy.scores(public, private if ids is None else private[:, ids], ids)
    out = np.zeros(public.shape[-1], dtype=np.float64)
    out[ids_np] = exponential_mechanism_probabilities(scores, temperature)
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
    from V_k^+ \\ V_k (public logit below ℓ).

    ``observer`` (optional, also settable as an attribute) is called before each draw with
    (candidate ids, float64 scores, τ): the exact law the draw follows. It is how the
    engine-level audits read the sampling law of a real run; it must not feed anything back.

    Privacy contract: with ``clip_norm`` C, ``batch_size`` B and ``temperature`` τ, each
    :meth:`choose` is C²/(2B²τ²)-zCDP (and 2C/(Bτ)-DP) with respect to replacing one reference
    by the empty one, provided the caller passes the private rows of the non-empty references
    only and the public row's logits come from the public prompt.
    """

    def __init__(self, clip_norm: float, batch_size: int, temperature: float, top_k: int,
                 vocab_size: int, *, observer: ScoreObserver | None = None) -> None:
        self.clip_norm, self.batch_size = clip_norm, batch_size
        self.temperature, self.top_k, self.vocab_size = temperature, top_k, vocab_size
        self.observer = observer
        self.sizes: list[int] = []
        self.expansion = 0
        self._ell = float("-inf")

    @property
    def full_vocabulary(self) -> bool:
        return self.top_k <= 0 or self.top_k >= self.vocab_size

    def candidates(self, public: torch.Tensor) -> torch.Tensor | None:
        """V_k^+ as ascending ids (public logits only); ``None`` when it is the whole
        vocabulary (full-vocabulary mode and every public logit finite)."""
        if self.full_vocabulary:
            support = public_support(public)
            if bool(support.all()):
                return None
            return self._nonempty(torch.nonzero(support).squeeze(-1))
        ell = topk_threshold(public, self.top_k)
        self._ell = float(ell.squeeze())
        mask = expanded_topk_mask(public, self.top_k, self.clip_norm, self.batch_size, ell)
        return self._nonempty(torch.nonzero(mask).squeeze(-1))

    @staticmethod
    def _nonempty(ids: torch.Tensor) -> torch.Tensor:
        if ids.numel() == 0:
            raise ValueError("the public logits allow no token (all NaN or -inf)")
        return ids

    def scores(self, public: torch.Tensor, private: torch.Tensor, ids: torch.Tensor | None
               ) -> tuple[np.ndarray, np.ndarray]:
        """(candidate ids, float64 scores) the next draw is made from: the exponential
        mechanism at temperature τ over these scores is the exact next-token law."""
        if ids is None:
            ids = torch.arange(public.shape[-1])
        pub = public[ids]
        if bool(torch.isposinf(pub).any()):  # public certainty: uniform, private rows unread
            return ids.numpy(), np.zeros(int(ids.numel()), dtype=np.float64)
        return ids.numpy(), candidate_scores(private, pub, self.clip_norm, self.batch_size)

    def choose(self, public: torch.Tensor, private: torch.Tensor, ids: torch.Tensor | None,
               rng: np.random.Generator) -> int:
        ids_np, scores = self.scores(public, private, ids)
        if self.observer is not None:
            self.observer(ids_np, scores, self.temperature)
        token = sample_from_candidates(scores, ids_np, self.temperature, rng)
        self.sizes.append(int(ids_np.size))
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

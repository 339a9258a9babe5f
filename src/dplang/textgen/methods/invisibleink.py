"""InvisibleInk (Vinod, Pillutla, Thakurta 2025, Algorithm 1): one private decoding step.

For a generation with B private references R = (r_1..r_B), public prompt q and prefix x_<t:

* DClip:        DClip_C(φ_i, φ_pub) = φ_pub + clip_C(φ_i − φ_pub)   (coordinate-wise to [−C, C])
* aggregate:    φ̄ = φ_pub + (1/B) Σ_i clip_C(φ_i − φ_pub)
* Top-k+:       V_k^+ = {y : φ_pub(y) ≥ ℓ − 2C/B}, ℓ the k-th largest public logit (k = 0 or
                k ≥ |V| means the whole vocabulary)
* sample:       x_t ~ softmax(φ̄[V_k^+] / τ)   (exponential mechanism over V_k^+)

Privacy contract (InvisibleInk paper, §4 and Theorem 2; docs/privacy.md): under
replace-by-null adjacency the aggregate has ℓ∞ sensitivity C/B, provided an empty reference
contributes *exactly* the public logits (this module's callers never compute logits for an
empty reference: its clipped difference is exactly 0 by construction). V_k^+ is a function of
the public logits only. Each step is therefore ρ_tok = C²/(2B²τ²)-zCDP and a generation of
at most T tokens is T·ρ_tok-zCDP (charged for T).

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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._lazy import lazy_module
from ...privacy.accounting import epsilon_to_rho, exponential_mechanism_rho
from ...privacy.guarantees import Adjacency, Guarantee
from ...privacy.mechanisms import exponential_mechanism
from ...privacy.randomness import RandomStreams
from ..engine import DecodingParams, GroupJob, GroupResult, StepPolicy, run_groups
from .registry import MethodInputs, MethodSpec, register_method

if TYPE_CHECKING:
    from ...models.base import LogitsModel
    from .invisibleink_batch import BatchSettings, GroupBatchStep

torch = lazy_module("torch")  # imported on first use (`dplang generate --help` needs none)

#: The largest finite float32 (the public logits are float32).
FLOAT32_MAX = float(np.finfo(np.float32).max)

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
    if k <= 0 or k >= vocab or bool(torch.isposinf(public).any()):
        return support  # with +inf logits: exactly those (the threshold is not read)
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
    # ⌈log2 bound⌉ exactly, from frexp (bound = m·2^e, m in [0.5, 1)): math.log2 rounds, and
    # just above a power of two it returns the power's exponent; the batched step's
    # device-side exponent is the same exact function (invisibleink_batch.ceil_log2)
    mantissa, exponent = math.frexp(bound)
    return 51 - (exponent - 1 if mantissa == 0.5 else exponent)


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
    return np.ldexp(total / batch_size, -q) + 0.0  # + 0.0: a zero score is +0.0, never −0.0


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
    from ...privacy.mechanisms import exponential_mechanism_probabilities

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
        from ...models import kernels

        fused = kernels.lookup("topk_plus", public)
        if fused is not None:  # the same set in two passes over the vocabulary
            return self._nonempty(fused(public, self.top_k, self.clip_norm, self.batch_size))
        ell = topk_threshold(public, self.top_k)
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
        public_on = _float64(public[torch.from_numpy(ids_np)])
        return self.choose_scored(ids_np, scores, public_on, rng)

    def choose_scored(self, ids: np.ndarray, scores: np.ndarray, public_on: np.ndarray,
                      rng: np.random.Generator) -> int:
        """The draw of :meth:`choose` from what it computed: the candidate ids, their float64
        scores (:meth:`scores`) and their public logits (for the statistics). The batched
        step (:mod:`.invisibleink_batch`) computes the same three for many groups at once
        and calls this, so both paths draw by the very same code."""
        if self.observer is not None:
            self.observer(ids, scores, self.temperature)
        index = exponential_mechanism(scores, self.temperature, rng)
        token = int(ids[index])
        self.sizes.append(int(ids.size))
        if self._below_topk(public_on, index):
            self.expansion += 1
        return token

    def _below_topk(self, public_on: np.ndarray, index: int) -> bool:
        """Whether the candidate ``index`` is in V_k^+ \\ V_k: its public logit is below ℓ,
        the k-th largest, i.e. at least k public logits exceed it. All of those are ≥ ℓ, so
        they are among the candidates: counting there is exact (public logits only)."""
        if self.full_vocabulary:
            return False
        return int(np.count_nonzero(public_on > public_on[index])) >= self.top_k

    def batch_settings(self) -> BatchSettings | None:
        """What a batched step needs to decide this group beside others with the same
        settings (:mod:`.invisibleink_batch`); ``None`` in full-vocabulary mode (decided
        group by group) or for a subclass that redefines how a group decides (the batched
        step computes InvisibleInk's own candidates and scores: it would bypass them)."""
        decided_here = ("candidates", "scores", "choose", "choose_scored")
        if self.full_vocabulary or any(
                getattr(type(self), name) is not getattr(InvisibleInkPolicy, name)
                or name in vars(self) for name in decided_here):
            return None
        # the grid bound B·(max|φ_pub| + C + 1) must be finite for any float32 public logit
        # (else each group alone refuses the step, or not, by its own logits: decided there)
        if not math.isfinite(self.batch_size * (FLOAT32_MAX + float(self.clip_norm) + 1.0)):
            return None
        from .invisibleink_batch import BatchSettings

        return BatchSettings(float(self.clip_norm), int(self.batch_size),
                             float(self.temperature), int(self.top_k))

    @staticmethod
    def batch_step(settings: BatchSettings) -> GroupBatchStep:
        """A batched step for groups that share ``settings``."""
        from .invisibleink_batch import GroupBatchStep

        return GroupBatchStep(settings)

    def stats(self) -> dict[str, float | int]:
        sizes = np.asarray(self.sizes, dtype=np.float64)
        return {
            "topk_plus_mean": float(sizes.mean()) if sizes.size else 0.0,
            "topk_plus_std": float(sizes.std()) if sizes.size else 0.0,
            "topk_plus_min": int(sizes.min()) if sizes.size else 0,
            "expansion_tokens": self.expansion,
        }


def run_invisibleink(
    model: LogitsModel,
    jobs: Iterable[GroupJob],
    params: DecodingParams,
    streams: RandomStreams,
    concurrent_groups: int = 8,
    on_result: Callable[[GroupResult], None] | None = None,
    on_step: Callable[[int], None] | None = None,
) -> list[GroupResult]:
    """Run InvisibleInk for every job, ``concurrent_groups`` at a time (see :func:`run_groups`)."""

    def policy(_job: GroupJob) -> StepPolicy:
        return InvisibleInkPolicy(params.clip, params.batch_size, params.temperature,
                                  params.top_k, model.vocab_size)

    return run_groups(model, jobs, policy, params.batch_size, params.max_tokens, streams,
                      concurrent_groups, on_result, on_step, params.sparse_head,
                      params.stop_at_eos)


# --------------------------------------------------------------------------------------------
# Calibration (InvisibleInk paper, §4 and Theorem 2): the guarantee is built here, beside the
# mechanism that earns it

#: Adjacencies for which the DClip aggregate has a known sensitivity, with its factor on C/B.
DCLIP_SENSITIVITY_FACTOR = {"replace-by-null": 1.0, "zero-out": 2.0}


def dclip_sensitivity(clip: float, batch_size: int, adjacency: str = "replace-by-null") -> float:
    """ℓ∞ sensitivity of (1/B) Σ DClip_C(φ_i, φ_pub): C/B (replace-by-null), 2C/B (zero-out)."""
    if adjacency not in DCLIP_SENSITIVITY_FACTOR:
        raise ValueError(
            f"adjacency must be one of {sorted(DCLIP_SENSITIVITY_FACTOR)}, got {adjacency!r}"
        )
    if not clip >= 0 or batch_size < 1:
        raise ValueError("clip must be >= 0 and batch_size >= 1")
    return DCLIP_SENSITIVITY_FACTOR[adjacency] * clip / batch_size


def invisibleink_rho(
    tokens: int,
    clip: float,
    batch_size: int,
    temperature: float,
    adjacency: str = "replace-by-null",
) -> float:
    """ρ_seq = T·Δ²/(2τ²) with Δ the DClip sensitivity; = T·C²/(2B²τ²) under replace-by-null."""
    if tokens < 1:
        raise ValueError(f"tokens must be >= 1, got {tokens}")
    sens = dclip_sensitivity(clip, batch_size, adjacency)
    return tokens * exponential_mechanism_rho(sens, temperature)


def calibrate_clip(
    rho: float,
    tokens: int,
    batch_size: int,
    temperature: float,
    adjacency: str = "replace-by-null",
) -> float:
    """The clip norm C that spends exactly ρ over T tokens: C = Bτ·sqrt(2ρ/T) / factor.

    (The InvisibleInk paper's §5.4 prints C = Bτ/sqrt(2ρ/T), a typo; §4 and Thm 2 give this.)
    """
    if not (rho >= 0 and math.isfinite(rho)):
        raise ValueError(f"rho must be finite and >= 0, got {rho}")
    if tokens < 1 or batch_size < 1 or not temperature > 0:
        raise ValueError("tokens >= 1, batch_size >= 1 and temperature > 0 are required")
    # Δ = factor·C/B and ρ = T·Δ²/(2τ²)  ⇒  C = Bτ·sqrt(2ρ/T) / factor
    unit_sensitivity = dclip_sensitivity(1.0, 1, adjacency)
    return batch_size * temperature * math.sqrt(2.0 * rho / tokens) / unit_sensitivity


def topk_plus_margin(clip: float, batch_size: int) -> float:
    """The Top-k+ expansion margin 2C/B (a property of the public logits; any adjacency)."""
    return 2.0 * clip / batch_size


def per_token_pure_epsilon(
    clip: float, batch_size: int, temperature: float, adjacency: str = "replace-by-null"
) -> float:
    """Per-token pure-DP bound of the exponential mechanism: 2Δ/τ (= 2C/(Bτ) by default)."""
    return 2.0 * dclip_sensitivity(clip, batch_size, adjacency) / temperature


def invisibleink_budget(
    *, epsilon: float | None, rho: float | None, clip: float | None, delta: float,
    tokens: int, batch_size: int, temperature: float, adjacency: str,
) -> dict[str, float | int | str]:
    """The whole InvisibleInk calculation from exactly one of ε (at δ), ρ or a clip norm C.

    Returns ``rho``, ``epsilon``, ``delta``, ``clip``, ``margin`` (2C/B), ``per_token_epsilon``
    (2Δ/τ) and the inputs. The guarantee is ρ-zCDP, charged for T tokens."""
    if sum(v is not None for v in (epsilon, rho, clip)) != 1:
        raise ValueError("give exactly one of epsilon, rho or clip")
    if clip is None:
        rho_value = rho if rho is not None else epsilon_to_rho(epsilon, delta)
        clip_value = calibrate_clip(rho_value, tokens, batch_size, temperature, adjacency)
    else:
        clip_value = clip
        rho_value = invisibleink_rho(tokens, clip, batch_size, temperature, adjacency)
    stated = Guarantee.zcdp("invisibleink", "reference", adjacency, rho_value, delta,
                            epsilon=epsilon)  # ε as asked for, else ρ's tight conversion at δ
    return {
        "rho": rho_value,
        "epsilon": stated.epsilon,
        "delta": delta,
        "clip": clip_value,
        "margin": topk_plus_margin(clip_value, batch_size),
        "per_token_epsilon": per_token_pure_epsilon(clip_value, batch_size, temperature,
                                                    adjacency),
        "tokens": tokens,
        "batch_size": batch_size,
        "temperature": temperature,
        "adjacency": adjacency,
    }


@dataclass(frozen=True)
class InvisibleInkParams:
    """A calibrated InvisibleInk run: clip norm C, batch size B, temperature τ, Top-k+ k, T
    tokens, adjacency; :meth:`guarantee` is what every release with them satisfies.

    Privacy contract: each generation reads one batch of B references and is charged
    ρ = T·Δ²/(2τ²) with Δ = C/B (replace-by-null) or 2C/B (zero-out) whatever it emits;
    generations over disjoint, data-independently formed batches compose in parallel, so the
    whole release is ρ-zCDP, reported with its tight (ε, δ) conversion."""

    clip: float
    batch_size: int
    temperature: float
    top_k: int
    max_tokens: int
    rho: float
    epsilon: float
    delta: float
    adjacency: Adjacency = Adjacency.REPLACE_BY_NULL

    @classmethod
    def calibrate(cls, inputs: MethodInputs, options: Mapping[str, Any] | None = None
                  ) -> InvisibleInkParams:
        """From exactly one of ε (at δ), ρ or a clip norm C (``inputs``); ε is the one asked
        for, else the tight conversion of ρ at δ."""
        budget = invisibleink_budget(
            epsilon=inputs.epsilon, rho=inputs.rho, clip=inputs.clip, delta=inputs.delta,
            tokens=inputs.max_tokens, batch_size=inputs.batch_size,
            temperature=inputs.temperature, adjacency=inputs.adjacency)
        return cls(float(budget["clip"]), inputs.batch_size, inputs.temperature, inputs.top_k,
                   inputs.max_tokens, float(budget["rho"]), float(budget["epsilon"]),
                   inputs.delta, Adjacency(inputs.adjacency))

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        return Guarantee.zcdp(
            "invisibleink", "reference", self.adjacency, self.rho, self.delta,
            epsilon=self.epsilon,
            details={"clip": self.clip, "batch_size": self.batch_size,
                     "max_tokens": self.max_tokens, "temperature": self.temperature,
                     "top_k": self.top_k,
                     "composition": "parallel over disjoint batches formed in file order"})

    def policy_factory(self, vocab_size: int) -> Callable[[GroupJob], StepPolicy]:
        return lambda _job: InvisibleInkPolicy(self.clip, self.batch_size, self.temperature,
                                               self.top_k, vocab_size)


SPEC = register_method(MethodSpec(
    name="invisibleink",
    summary="InvisibleInk (Vinod, Pillutla, Thakurta 2025): DClip + Top-k+ exponential "
            "mechanism, ρ-zCDP per batch",
    adjacencies=(Adjacency.REPLACE_BY_NULL, Adjacency.ZERO_OUT),
    calibrate=InvisibleInkParams.calibrate,
    budget_forms=("epsilon", "rho", "clip"),
))

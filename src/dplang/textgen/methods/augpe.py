"""Baseline: Aug-PE, Augmented Private Evolution (Xie et al. 2024; docs/augpe.md).

"Differentially Private Synthetic Data via Foundation Model APIs 2: Text" treats the language
model as two black-box APIs — a *random API* (generate a text from a public prompt) and a
*variation API* (paraphrase a given text) — and evolves a population of synthetic texts towards
the private references with a differentially private nearest-neighbour histogram. dplang runs
both APIs on one white-box causal LM (:func:`dplang.textgen.engine.run_plain`: ordinary,
non-private top-k sampling) with public prompts only.

Algorithm (n = ``num_texts``, L = ``variations``, T = ``iterations``)::

    S = n texts from the generation prompt                  (random API)
    P = S + L variations of each text of S                  (variation API), |P| = n(L+1)
    for t = 1..T:
        h = NN histogram of the references over P           (the only access to private data)
        h~ = h + N(0, σ² I)                                 (Gaussian mechanism)
        w = max(h~ − H, 0)                                  (threshold H; post-processing)
        S = n draws from P with probability ∝ w             (or the top n by h~: "rank")
        if t < T: P = S + L variations of each text of S
    output S

NN histogram (spec Eq. 8): every reference votes for its nearest candidate in embedding space
(Euclidean distance; ties go to the lowest candidate index), ``h[i]`` = number of votes of
candidate i.

Privacy contract
----------------
The private references are read **only** through the noisy histograms: they are embedded once,
and their embeddings enter nothing but :func:`nn_histogram`, whose output is released only after
Gaussian noise. Candidates, prompts, selections and variations are functions of public inputs
(prompts, model, seed) and of earlier noisy histograms, i.e. post-processing. A reference that
is ``None``, empty or whitespace only is the *null reference* and casts **no vote**.

ℓ2 sensitivity of the histogram (Xie et al. 2024, Property 10): a reference's vote is a
deterministic function of its own embedding and the (public) candidates, so

* add-or-remove one reference: one count changes by one, ℓ2 = 1;
* replace one reference by another text: two counts change by one each, ℓ2 ≤ √2;
* replace-by-null: with dplang's null element (no vote) one count changes by one (ℓ2 = 1); if
  the null reference were instead embedded like any text and voted (how the InvisibleInk paper
  reads replace-by-null for Aug-PE), two counts could change, ℓ2 ≤ √2. dplang charges **√2**
  under replace-by-null — valid for either reading and the value the InvisibleInk paper's
  comparison uses.

Each histogram is a Gaussian mechanism: ρ_iter = Δ²/(2σ²)-zCDP; the T histograms compose
adaptively, ρ = T·Δ²/(2σ²). Given (ε, δ), σ = Δ·sqrt(T/(2ρ)) with ρ = ``epsilon_to_rho(ε, δ)``
(tight zCDP → (ε, δ) conversion). The accounting is ex ante: it does not depend on the data.

Sensitivity conventions: ``"correct"`` (default) calibrates σ with the true Δ of the chosen
adjacency. ``"paper"`` calibrates with Δ = 1 whatever the adjacency, as the Aug-PE code does
(a √2 advantage under replace-by-null; docs/augpe.md). The returned guarantee is always the *true*
one under the chosen adjacency — under replace-by-null with ``"paper"`` its ρ is twice the
requested ρ and its ε exceeds the requested ε — and the authors' claimed values are recorded in
``details`` (``paper_claimed_rho``, ``paper_claimed_epsilon``).

Determinism (docs/privacy.md invariant 5): every generation and variation call, every noise draw and
every selection uses its own random stream derived from (seed, unit), so results do not depend
on the model batch size. (Floating-point caveat: sentence embedders batch their inputs, so an
embedding can differ in the last bits with the batch it shares; the nearest-neighbour search
itself is made independent of the other references, see :func:`nn_histogram`.)

Size: one algorithm (params, the private histogram, the population loop) whose privacy argument
is read as a whole.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ...evaluation.embedders import Embedder, resolve_embedder
from ...privacy.accounting import epsilon_to_rho
from ...privacy.guarantees import Adjacency, Guarantee
from ...privacy.mechanisms import gaussian
from ...privacy.randomness import RandomStreams
from ..engine import GroupResult, run_plain
from .registry import (
    MethodInputs,
    MethodOption,
    MethodSpec,
    at_least,
    register_method,
)

if TYPE_CHECKING:
    from ...models.base import LogitsModel

__all__ = [
    "ADJACENCY_SENSITIVITY",
    "CONVENTIONS",
    "DEFAULT_CHAT_GENERATION_PROMPT",
    "DEFAULT_CHAT_VARIATION_TEMPLATE",
    "DEFAULT_GENERATION_PROMPT",
    "DEFAULT_VARIATION_TEMPLATE",
    "SELECTIONS",
    "STYLES",
    "AugPEParams",
    "augpe_rho",
    "calibrate_sigma",
    "default_prompts",
    "embed_references",
    "histogram_sensitivity",
    "is_null_reference",
    "nn_histogram",
    "noisy_histogram",
    "run_augpe",
    "selection_weights",
]

#: ℓ2 sensitivity of the NN histogram per adjacency (see the module docstring).
ADJACENCY_SENSITIVITY = {
    "replace-by-null": math.sqrt(2.0),
    "replace-one": math.sqrt(2.0),
    "add-remove": 1.0,
}
#: ``"correct"``: σ from the adjacency's true sensitivity; ``"paper"``: σ from Δ = 1.
CONVENTIONS = ("correct", "paper")
#: ``"prob"``: n draws ∝ the thresholded noisy counts (with replacement, spec default);
#: ``"rank"``: the n candidates with the largest noisy counts (the Aug-PE Yelp scripts).
SELECTIONS = ("prob", "rank")

#: Slot of the variation template that receives the text to paraphrase.
TEXT_SLOT = "{text}"
#: Optional slot of the variation template filled with a random public style.
STYLE_SLOT = "{style}"

#: Completion-form defaults for base models (no chat template), Yelp-style.
DEFAULT_GENERATION_PROMPT = "Here is a review of a local business:\n"
DEFAULT_VARIATION_TEMPLATE = "Here is a review:\n{text}\n\nHere is the same review, rephrased:\n"
#: Instruction-form defaults for chat models (in the spirit of the Aug-PE Yelp prompts).
DEFAULT_CHAT_GENERATION_PROMPT = (
    "Please give me a fake Yelp customer review of a fictional business."
)
DEFAULT_CHAT_VARIATION_TEMPLATE = (
    "Please rephrase the following Yelp review {style}. Output only the rephrased review.\n"
    "{text}"
)
#: Paraphrase styles drawn (from a public stream) for a ``{style}`` slot; a selection of the
#: style list of the Aug-PE code.
STYLES = (
    "in a casual way", "in a creative style", "in an informal way", "in a detailed way",
    "in a professional way", "with more details", "in a short way", "in a concise manner",
    "briefly", "in a storytelling tone", "in a formal manner", "in a laid-back manner",
)

# Random-stream layout: (phase, ...) prefixes of RandomStreams(seed).generator.
_GEN, _VAR, _NOISE, _SELECT, _STYLE = 0, 1, 2, 3, 4
# References embedded per nearest-neighbour block (memory only; votes do not depend on it).
_NN_BLOCK = 1024


# --------------------------------------------------------------------------------------------
# parameters and accounting


def histogram_sensitivity(adjacency: str) -> float:
    """True ℓ2 sensitivity of the NN histogram: √2 (replace-by-null, replace-one), 1
    (add-remove)."""
    if adjacency not in ADJACENCY_SENSITIVITY:
        raise ValueError(
            f"adjacency must be one of {sorted(ADJACENCY_SENSITIVITY)}, got {adjacency!r}"
        )
    return ADJACENCY_SENSITIVITY[adjacency]


def calibrate_sigma(epsilon: float, delta: float, iterations: int, sensitivity: float) -> float:
    """Noise σ of each histogram so that ``iterations`` Gaussian mechanisms with ℓ2 sensitivity
    ``sensitivity`` compose to (ε, δ)-DP: σ = Δ·sqrt(T/(2ρ)), ρ = ``epsilon_to_rho(ε, δ)``."""
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    if not (sensitivity > 0 and math.isfinite(sensitivity)):
        raise ValueError(f"sensitivity must be finite and > 0, got {sensitivity}")
    rho = epsilon_to_rho(epsilon, delta)
    return sensitivity * math.sqrt(iterations / (2.0 * rho))


def augpe_rho(sigma: float, iterations: int, sensitivity: float) -> float:
    """zCDP cost of ``iterations`` noisy histograms: ρ = T·Δ²/(2σ²)."""
    if not (sigma > 0 and math.isfinite(sigma)):
        raise ValueError(f"sigma must be finite and > 0, got {sigma}")
    if iterations < 1 or not sensitivity >= 0:
        raise ValueError("iterations must be >= 1 and sensitivity >= 0")
    return iterations * sensitivity * sensitivity / (2.0 * sigma * sigma)


@dataclass(frozen=True)
class AugPEParams:
    """Hyperparameters of one Aug-PE run (all public; none is derived from the data).

    Args:
        epsilon, delta: the target (ε, δ); σ is calibrated from them (see the module docs).
        num_texts: n, the number of synthetic texts selected per iteration and output.
        iterations: T, the number of noisy histograms (PE iterations).
        variations: L, paraphrases made of each selected text; the voted population has
            n·(L+1) candidates (the selected texts and their variations).
        max_tokens, temperature, top_k: sampling of both APIs (top_k = 0: full vocabulary).
        threshold: H, subtracted from the noisy counts before clipping at 0 (default 0).
        adjacency: ``"replace-by-null"`` (Δ = √2, default), ``"replace-one"`` (√2) or
            ``"add-remove"`` (1).
        sensitivity_convention: ``"correct"`` (default) or ``"paper"`` (σ calibrated with
            Δ = 1 whatever the adjacency, as the authors did; the guarantee stays true).
        selection: ``"prob"`` (default) or ``"rank"`` (see :data:`SELECTIONS`).
    """

    epsilon: float
    num_texts: int
    delta: float = 1e-6
    iterations: int = 3
    variations: int = 7
    max_tokens: int = 64
    temperature: float = 1.0
    top_k: int = 50
    threshold: float = 0.0
    adjacency: str = "replace-by-null"
    sensitivity_convention: str = "correct"
    selection: str = "prob"

    def __post_init__(self) -> None:
        if not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError(f"epsilon must be finite and > 0, got {self.epsilon}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")
        if self.num_texts < 1:
            raise ValueError(f"num_texts must be >= 1, got {self.num_texts}")
        if self.iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {self.iterations}")
        if self.variations < 0:
            raise ValueError(f"variations must be >= 0, got {self.variations}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = full vocabulary), got {self.top_k}")
        if not (self.threshold >= 0 and math.isfinite(self.threshold)):
            raise ValueError(f"threshold must be finite and >= 0, got {self.threshold}")
        histogram_sensitivity(self.adjacency)
        if self.sensitivity_convention not in CONVENTIONS:
            raise ValueError(f"sensitivity_convention must be one of {CONVENTIONS}, "
                             f"got {self.sensitivity_convention!r}")
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {self.selection!r}")

    @property
    def clip(self) -> float:
        """Aug-PE clips no logits: 0 (what the manifest records for methods without one)."""
        return 0.0

    @property
    def sensitivity(self) -> float:
        """The true ℓ2 sensitivity of one histogram under :attr:`adjacency`."""
        return histogram_sensitivity(self.adjacency)

    @property
    def calibration_sensitivity(self) -> float:
        """The Δ σ is calibrated with: the true one, or 1 under the ``"paper"`` convention."""
        return 1.0 if self.sensitivity_convention == "paper" else self.sensitivity

    @property
    def sigma(self) -> float:
        """Gaussian noise standard deviation added to every count."""
        return calibrate_sigma(self.epsilon, self.delta, self.iterations,
                               self.calibration_sensitivity)

    @property
    def rho(self) -> float:
        """True zCDP cost of the run under :attr:`adjacency`: T·Δ²/(2σ²)."""
        return augpe_rho(self.sigma, self.iterations, self.sensitivity)

    @property
    def population_size(self) -> int:
        """Candidates per vote: n·(L+1)."""
        return self.num_texts * (self.variations + 1)

    @property
    def model_generations(self) -> int:
        """Full-sequence generations of a run: n (random API) + n·L·T (variation API)."""
        return self.num_texts * (1 + self.variations * self.iterations)

    def guarantee(self, n: int | None = None, d: int | None = None) -> Guarantee:
        """The (true, ex-ante) guarantee of a run with these parameters."""
        rho = self.rho
        info: dict[str, Any] = {
            "sigma": self.sigma, "iterations": self.iterations, "variations": self.variations,
            "num_texts": self.num_texts, "population_size": self.population_size,
            "threshold": self.threshold, "selection": self.selection,
            "sensitivity": self.sensitivity,
            "calibration_sensitivity": self.calibration_sensitivity,
            "sensitivity_convention": self.sensitivity_convention,
            "max_tokens": self.max_tokens, "temperature": self.temperature, "top_k": self.top_k,
            "null_reference": "None, empty or whitespace-only references cast no vote",
            "accounting": "T Gaussian-mechanism NN histograms, rho = T*Delta^2/(2 sigma^2)",
        }
        if self.sensitivity_convention == "paper":
            claimed = augpe_rho(self.sigma, self.iterations, 1.0)
            info["paper_claimed_rho"] = claimed
            info["paper_claimed_epsilon"] = Guarantee.zcdp(
                "augpe", "reference", self.adjacency, claimed, self.delta).epsilon
            if self.sensitivity > 1.0:
                info["warning"] = (
                    "paper convention: sigma calibrated with sensitivity 1, but the histogram "
                    f"has sensitivity {self.sensitivity:.6g} under {self.adjacency}; the "
                    "guarantee recorded here is the true one"
                )
        return Guarantee.zcdp("augpe", "reference", self.adjacency, rho, self.delta,
                              details=info)


# --------------------------------------------------------------------------------------------
# the private histogram


def is_null_reference(reference: str | None) -> bool:
    """``None``, ``""`` and whitespace-only references are the null reference (no vote)."""
    return reference is None or not reference.strip()


def embed_references(references: Sequence[str | None], embedder: Embedder) -> np.ndarray:
    """Embeddings ``[N', dim]`` of the non-null references (null references cast no vote).

    Privacy: the result is private; it may only enter :func:`nn_histogram`. Each reference is
    embedded in a call of its own, so its embedding (hence its vote) is the same bits whatever
    the other references are (a batched encoder sorts and pads texts together)."""
    texts = [r for r in references if not is_null_reference(r)]
    if not texts:
        dim = int(np.asarray(embedder.embed(["x"])).shape[1])
        return np.zeros((0, dim))
    return np.concatenate([np.asarray(embedder.embed([t]), dtype=np.float64) for t in texts])


def nn_histogram(private_emb: np.ndarray, candidate_emb: np.ndarray) -> np.ndarray:
    """Nearest-neighbour vote counts (float64 ``[m]``) of the rows of ``private_emb`` ``[N, d]``
    over the candidates ``candidate_emb`` ``[m, d]`` (spec Eq. 8; Euclidean distance, ties to
    the lowest candidate index).

    Each row's vote is a function of that row and the candidates only, so adding or removing a
    row changes one count by one (ℓ2 = 1) and replacing a row by another changes at most two
    counts by one each (ℓ2 ≤ √2). To keep this exact in floating point, distances are first
    computed with a matrix product (whose rounding can depend on the other rows) and every
    near-tie is then settled with the direct formula Σ(r − c)², which depends on the row alone.
    """
    priv = np.asarray(private_emb, dtype=np.float64)
    cand = np.asarray(candidate_emb, dtype=np.float64)
    if cand.ndim != 2 or cand.shape[0] == 0:
        raise ValueError("candidate embeddings must be a non-empty [m, d] array")
    m, d = cand.shape
    if priv.size == 0:
        return np.zeros(m)
    if priv.ndim != 2 or priv.shape[1] != d:
        raise ValueError(f"private embeddings must be [N, {d}], got {priv.shape}")
    if not (np.isfinite(priv).all() and np.isfinite(cand).all()):
        raise ValueError("embeddings must be finite")
    cand_sq = np.einsum("ij,ij->i", cand, cand)
    counts = np.zeros(m)
    for start in range(0, priv.shape[0], _NN_BLOCK):
        block = priv[start:start + _NN_BLOCK]
        block_sq = np.einsum("ij,ij->i", block, block)
        dist = block_sq[:, None] - 2.0 * (block @ cand.T) + cand_sq[None, :]
        best = dist.min(axis=1)
        # A bound far above the rounding error of the expansion (≈ d·2⁻⁵² relative).
        tol = 1e-9 * (block_sq + cand_sq.max()) + 1e-300
        near = dist <= (best + tol)[:, None]
        votes = np.argmax(near, axis=1)  # the only near-tie candidate in the common case
        for row in np.flatnonzero(near.sum(axis=1) > 1):
            ids = np.flatnonzero(near[row])
            exact = np.sum((cand[ids] - block[row]) ** 2, axis=1)
            votes[row] = ids[int(np.argmin(exact))]  # first minimum = lowest index
        counts += np.bincount(votes, minlength=m)
    return counts


def noisy_histogram(counts: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """``counts`` + i.i.d. N(0, σ²) noise: ρ = Δ²/(2σ²)-zCDP when ``counts`` has ℓ2
    sensitivity Δ."""
    arr = np.asarray(counts, dtype=np.float64)
    return arr + np.asarray(gaussian(sigma, rng, size=arr.shape))


def selection_weights(noisy: np.ndarray, threshold: float = 0.0) -> np.ndarray:
    """max(h~ − H, 0), Aug-PE's thresholded counts (post-processing)."""
    return np.maximum(np.asarray(noisy, dtype=np.float64) - threshold, 0.0)


def _select(noisy: np.ndarray, n: int, params: AugPEParams,
            rng: np.random.Generator) -> tuple[np.ndarray, bool]:
    """Indices of the n selected candidates, and whether the uniform fallback was used."""
    if params.selection == "rank":
        return np.argsort(-noisy, kind="stable")[:n], False
    weights = selection_weights(noisy, params.threshold)
    total = weights.sum()
    if not total > 0:  # every noisy count below the threshold: nothing to prefer
        return rng.integers(0, len(noisy), size=n), True
    return rng.choice(len(noisy), size=n, replace=True, p=weights / total), False


# --------------------------------------------------------------------------------------------
# the two APIs


def default_prompts(chat: bool) -> tuple[str, str]:
    """The built-in (generation prompt, variation template): instruction form for chat
    models, completion form for base models."""
    if chat:
        return DEFAULT_CHAT_GENERATION_PROMPT, DEFAULT_CHAT_VARIATION_TEMPLATE
    return DEFAULT_GENERATION_PROMPT, DEFAULT_VARIATION_TEMPLATE


class _SubStreams(RandomStreams):
    """The streams ``parent.generator(*prefix, i)``, seen as ``generator(i)`` by the engine."""

    def __init__(self, parent: RandomStreams, *prefix: int) -> None:  # no super(): a view
        self._parent = parent
        self._prefix = prefix
        self.os_entropy = parent.os_entropy
        self.seed = parent.seed

    def generator(self, index: int, *sub: int) -> np.random.Generator:
        return self._parent.generator(*self._prefix, index, *sub)


@dataclass
class _Counter:
    total: int
    on_progress: Callable[[str, int, int], None] | None
    done: int = 0
    calls: int = 0
    tokens: int = 0
    steps: int = 0


def _sample(model: LogitsModel, prompts: Sequence[str], params: AugPEParams,
            streams: RandomStreams, stage: str, counter: _Counter, concurrent: int) -> list[str]:
    """One text per prompt (row i on stream i of ``streams``), ``concurrent`` rows at a time."""

    def step(_rows: int) -> None:
        counter.steps += 1

    texts: list[str] = []
    for start in range(0, len(prompts), concurrent):
        chunk = prompts[start:start + concurrent]
        outs = run_plain(model, chunk, params.max_tokens, params.temperature, params.top_k,
                         streams, on_step=step, first_stream=start)
        for ids in outs:
            counter.tokens += len(ids)
            texts.append(model.decode(ids).strip())
        counter.calls += len(chunk)
        counter.done += len(chunk)
        if counter.on_progress is not None:
            counter.on_progress(stage, counter.done, counter.total)
    return texts


def _vary(model: LogitsModel, texts: Sequence[str], template: str, system: str | None,
          params: AugPEParams, streams: RandomStreams, round_: int, counter: _Counter,
          concurrent: int) -> list[str]:
    """The population ``texts + [L variations of texts[0]] + [L of texts[1]] + ...``."""
    L = params.variations
    prompts = []
    for i, text in enumerate(texts):
        source = model.truncate_tokens(text, params.max_tokens)
        for v in range(L):
            user = template.replace(TEXT_SLOT, source)
            if STYLE_SLOT in user:
                rng = streams.generator(_STYLE, round_, i * L + v)
                user = user.replace(STYLE_SLOT, STYLES[int(rng.integers(len(STYLES)))])
            prompts.append(model.render_prompt(user, system))
    out = _sample(model, prompts, params, _SubStreams(streams, _VAR, round_),
                  f"variation {round_}", counter, concurrent)
    # An empty paraphrase keeps its parent (a failed variation; public post-processing).
    out = [o if o else texts[j // L] for j, o in enumerate(out)]
    return list(texts) + out


# --------------------------------------------------------------------------------------------
# the whole run


def run_augpe(
    model: LogitsModel,
    references: Sequence[str | None],
    params: AugPEParams,
    seed: int,
    public_prompt: str | None = None,
    variation_template: str | None = None,
    embedder: str | Embedder = "default",
    on_progress: Callable[[str, int, int], None] | None = None,
    *,
    system_prompt: str | None = None,
    concurrent: int = 64,
) -> tuple[list[str], Guarantee, dict[str, Any]]:
    """Aug-PE with ``model`` as random and variation API; returns (texts, guarantee, stats).

    Privacy contract: ``references`` are read only through T nearest-neighbour histograms, each
    released with N(0, σ²) noise, σ from :attr:`AugPEParams.sigma`; the result is
    ``params.rho``-zCDP (hence (ε, δ)-DP at ``params.delta``) with respect to one reference
    under ``params.adjacency``, charged ex ante. ``None``, empty and whitespace-only references
    are the null reference of replace-by-null adjacency: they cast no vote. Everything else —
    prompts, candidates, selections, variations, the returned statistics — is computed from
    public inputs and the noisy histograms only (post-processing).

    Args:
        model: any :class:`~dplang.models.base.LogitsModel`.
        references: the private texts.
        params: hyperparameters (all public).
        seed: root of the random streams (same seed ⇒ same output).
        public_prompt: the generation prompt (user message); default
            :func:`default_prompts` for the model's kind.
        variation_template: the paraphrase prompt with a ``{text}`` slot (and optionally a
            ``{style}`` slot, filled from :data:`STYLES` on a public stream).
        embedder: ``"default"`` (offline all-MiniLM-L6-v2), ``"hashing"``, a
            sentence-transformers folder or an :class:`~dplang.evaluation.embedders.Embedder`.
        on_progress: called as ``on_progress(stage, done, total)`` after each model batch,
            counting full-sequence generations (total ``params.model_generations``).
        system_prompt: system message for chat models (ignored by base models).
        concurrent: rows per model batch (speed only; results do not depend on it).

    Returns:
        the ``params.num_texts`` synthetic texts, the guarantee (mechanism ``"augpe"``, unit
        ``"reference"``; ``details`` has σ, T, L and model calls: public quantities only, no
        seed and no duration) and run statistics (calls, tokens, noisy-count sums, ...; its
        ``wall_clock_seconds`` is a duration of the computation on the private references, a
        timing side channel: keep it out of public files).
    """
    started = time.perf_counter()
    if concurrent < 1:
        raise ValueError(f"concurrent must be >= 1, got {concurrent}")
    gen_default, var_default = default_prompts(model.has_chat_template)
    gen_prompt = gen_default if public_prompt is None else public_prompt
    template = var_default if variation_template is None else variation_template
    if TEXT_SLOT not in template:
        raise ValueError(f"the variation template needs a {TEXT_SLOT} slot")
    sigma = params.sigma
    streams = RandomStreams(seed)
    emb = resolve_embedder(embedder)
    counter = _Counter(params.model_generations, on_progress)
    n = params.num_texts

    # The only access to the private data: embeddings used by nn_histogram alone.
    private_emb = embed_references(references, emb)

    seeds = _sample(model, [model.render_prompt(gen_prompt, system_prompt)] * n, params,
                    _SubStreams(streams, _GEN), "generation", counter, concurrent)
    generation_calls = counter.calls
    population = _vary(model, seeds, template, system_prompt, params, streams, 0, counter,
                       concurrent)
    noisy_sums: list[float] = []
    positive: list[int] = []
    fallbacks = 0
    selected: list[str] = []
    for t in range(1, params.iterations + 1):
        candidate_emb = np.asarray(emb.embed(population), dtype=np.float64)
        noisy = noisy_histogram(nn_histogram(private_emb, candidate_emb), sigma,
                                streams.generator(_NOISE, t))
        # ---- from here on only the noisy histogram is used (post-processing) ----
        idx, fallback = _select(noisy, n, params, streams.generator(_SELECT, t))
        fallbacks += int(fallback)
        noisy_sums.append(float(noisy.sum()))
        positive.append(int((selection_weights(noisy, params.threshold) > 0).sum()))
        selected = [population[int(i)] for i in idx]
        if t < params.iterations:
            population = _vary(model, selected, template, system_prompt, params, streams, t,
                               counter, concurrent)

    seconds = time.perf_counter() - started
    stats: dict[str, Any] = {
        "generation_calls": generation_calls,
        "variation_calls": counter.calls - generation_calls,
        "model_calls": counter.calls,
        "decode_steps": counter.steps,
        "tokens_generated": counter.tokens,
        "population_size": params.population_size,
        "noisy_count_sums": noisy_sums,
        "candidates_above_threshold": positive,
        "uniform_fallbacks": fallbacks,
        "distinct_outputs": len(set(selected)),
        "embedder": getattr(emb, "name", type(emb).__name__),
        "wall_clock_seconds": seconds,
    }
    # The guarantee is public (it goes into manifests): only public quantities. Never the
    # seed (secret: it inverts the noise) nor the wall clock (a duration of the computation on
    # the private references: a timing side channel), which stays in ``stats`` for the caller.
    stated = params.guarantee()
    guarantee = replace(stated, details={
        **stated.details, "embedder": stats["embedder"],
        "model_calls": counter.calls, "generation_calls": generation_calls,
        "variation_calls": stats["variation_calls"],
    })
    return selected, guarantee, stats


# --------------------------------------------------------------------------------------------
# as a registered method


def _calibrate(inputs: MethodInputs, options: Mapping[str, Any]) -> AugPEParams:
    if inputs.epsilon is None:
        raise ValueError("needs --epsilon (its accounting is calibrated from ε)")
    return AugPEParams(
        epsilon=inputs.epsilon, num_texts=1, delta=inputs.delta,
        iterations=options["iterations"], variations=options["variations"],
        max_tokens=inputs.max_tokens, temperature=inputs.temperature, top_k=inputs.top_k,
        adjacency=str(inputs.adjacency))


#: The embedder the registered method uses (``run_augpe``'s default; tests may use "hashing").
EMBEDDER = "default"


def _load_embedder(_params: AugPEParams) -> None:
    """Load the sentence embedder now, before the charge (it is cached for the run): its first
    use, on the private references, would otherwise load it after the charge. Embeds a fixed
    public string only."""
    resolve_embedder(EMBEDDER).embed(["a public warm-up text"])


def run_population(
    params: AugPEParams, model: LogitsModel, references: Sequence[str | None], num_texts: int,
    public_prompt: str, system_prompt: str | None, seed: int,
    on_step: Callable[[int], None] | None = None,
) -> tuple[list[GroupResult], dict[str, Any]]:
    """Aug-PE over all the references of the planned batches: ``num_texts`` texts (one per
    batch). The references are used only through the noisy nearest-neighbour histograms
    (:func:`run_augpe`); the guarantee does not depend on ``num_texts``."""

    def progress(_stage: str, _done: int, _total: int) -> None:
        if on_step is not None:
            on_step(0)

    texts, _guarantee, stats = run_augpe(
        model, references, replace(params, num_texts=num_texts), seed % (2**63),
        public_prompt=public_prompt, on_progress=progress, system_prompt=system_prompt,
        embedder=EMBEDDER)
    results = [GroupResult(i, [], text, "population", {}, token_count=model.count_tokens(text))
               for i, text in enumerate(texts)]
    return results, stats


SPEC = register_method(MethodSpec(
    name="augpe",
    summary="Aug-PE (Xie et al. 2024): private evolution with Gaussian nearest-neighbour "
            "histograms (a population method)",
    adjacencies=(Adjacency.REPLACE_BY_NULL,),
    calibrate=_calibrate,
    options=(
        MethodOption("iterations", int, 3, "Iterations T (noisy histograms).", at_least(1),
                     in_sweeps=True),
        MethodOption("variations", int, 7, "Variations L per selected text.", at_least(0),
                     in_sweeps=True),
    ),
    run_population=run_population,
    prepare=_load_embedder,
    calls_per_token=lambda _b, options: 1 + options["variations"] * options["iterations"],
    # functions of the noisy histograms (and of the texts selected from them): DP outputs
    released_statistics=("noisy_count_sums", "candidates_above_threshold", "uniform_fallbacks",
                         "distinct_outputs", "tokens_generated", "decode_steps"),
))

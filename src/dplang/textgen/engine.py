"""The generation engine: decodes many InvisibleInk generation groups over one model.

A *group* is one generation: B private prompts (one per reference) and one public prompt.
The engine decodes G groups at once — G×(B+1) rows in one model batch, fewer when references
are empty — and retires a group's rows as soon as it ends (EOS or T tokens). Groups are taken
in waves of G; a wave ends when its last group ends.

Privacy-relevant properties (DESIGN.md invariants 1, 2, 5):

* a private prompt identical to the public prompt (an empty reference) gets no row: its
  clipped difference is exactly zero by construction (:func:`invisibleink.aggregate`);
* the candidate set V_k^+ is computed from the public row's logits only, and with the sparse
  LM head the private rows' logits are computed only on V_k^+ — the sampling law is the same as
  the dense path's because both feed the same candidate scores to the same sampler;
* group ``j`` samples from its own stream ``streams.generator(j)``, so its text does not depend
  on G, on the other groups, or on resuming (up to floating-point differences between batch
  shapes, which can flip a draw only when the uniform variate falls within ~1e-7 of a
  boundary of the inverse CDF).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice

import numpy as np
import torch

from ..models.base import LogitsModel
from ..privacy.randomness import RandomStreams
from .invisibleink import (
    candidate_scores,
    expanded_topk_mask,
    sample_from_candidates,
    topk_threshold,
)


@dataclass(frozen=True)
class DecodingParams:
    """Hyperparameters of one InvisibleInk run (all public)."""

    clip: float
    batch_size: int
    temperature: float
    top_k: int
    max_tokens: int
    sparse_head: bool = True
    #: Stop a generation at EOS (always, except in benchmarks that time fixed-length decoding).
    stop_at_eos: bool = True

    def __post_init__(self) -> None:
        if not (self.clip >= 0 and math.isfinite(self.clip)):
            raise ValueError(f"clip must be finite and >= 0, got {self.clip}")
        if self.batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {self.batch_size}")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top-k must be >= 0 (0 = full vocabulary), got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max tokens must be >= 1, got {self.max_tokens}")


@dataclass(frozen=True)
class GroupJob:
    """One generation: its index (which seeds its random stream) and its prompts.

    ``private_prompts`` has exactly B entries, already rendered for the model; an entry equal
    to ``public_prompt`` stands for an empty reference."""

    index: int
    public_prompt: str
    private_prompts: tuple[str, ...]


@dataclass
class GroupResult:
    """What one generation produced (EOS is not part of ``token_ids``)."""

    index: int
    token_ids: list[int]
    text: str
    stopped: str  # "eos" or "length"
    topk_plus_sizes: list[int] = field(repr=False)
    expansion_tokens: int

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def topk_plus_mean(self) -> float:
        return float(np.mean(self.topk_plus_sizes)) if self.topk_plus_sizes else 0.0

    @property
    def topk_plus_std(self) -> float:
        return float(np.std(self.topk_plus_sizes)) if self.topk_plus_sizes else 0.0


@dataclass
class _Live:
    job: GroupJob
    rng: np.random.Generator
    rows: list[int]  # private rows in the current model batch
    public_row: int
    tokens: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    expansion: int = 0


def _waves(jobs: Iterable[GroupJob], size: int) -> Iterator[list[GroupJob]]:
    it = iter(jobs)
    while wave := list(islice(it, size)):
        yield wave


def run_invisibleink(
    model: LogitsModel,
    jobs: Iterable[GroupJob],
    params: DecodingParams,
    streams: RandomStreams,
    concurrent_groups: int = 8,
    on_result: Callable[[GroupResult], None] | None = None,
    on_step: Callable[[int], None] | None = None,
) -> list[GroupResult]:
    """Run InvisibleInk for every job, ``concurrent_groups`` at a time.

    ``on_result`` is called as soon as a group ends (to persist it); ``on_step(n)`` after each
    decode step with the number of tokens produced in it (for progress). Returns all results
    in completion order."""
    if concurrent_groups < 1:
        raise ValueError(f"concurrent groups must be >= 1, got {concurrent_groups}")
    results: list[GroupResult] = []
    for wave in _waves(jobs, concurrent_groups):
        for res in _run_wave(model, wave, params, streams, on_step):
            results.append(res)
            if on_result is not None:
                on_result(res)
    return results


def _run_wave(
    model: LogitsModel,
    wave: Sequence[GroupJob],
    params: DecodingParams,
    streams: RandomStreams,
    on_step: Callable[[int], None] | None,
) -> Iterator[GroupResult]:
    for job in wave:
        if len(job.private_prompts) != params.batch_size:
            raise ValueError(
                f"group {job.index} has {len(job.private_prompts)} references, expected "
                f"{params.batch_size}"
            )
    prompts: list[str] = []
    live: list[_Live] = []
    for job in wave:
        rows = []
        for p in job.private_prompts:
            if p != job.public_prompt:  # empty reference ⇒ exactly the public logits
                rows.append(len(prompts))
                prompts.append(p)
        live.append(_Live(job, streams.generator(job.index), rows, len(prompts)))
        prompts.append(job.public_prompt)

    state = model.encode_prompts(prompts)
    next_tokens: torch.Tensor | None = None
    eos = model.eos_token_ids
    sparse = params.sparse_head and 0 < params.top_k < model.vocab_size

    while live:
        hidden = model.next_hidden(state, next_tokens)
        public = model.logits_from_hidden(hidden[[g.public_row for g in live]])
        thresholds = topk_threshold(public, params.top_k)
        masks = expanded_topk_mask(
            public, params.top_k, params.clip, params.batch_size, thresholds
        )
        cand_ids = [torch.nonzero(masks[j]).squeeze(-1) for j in range(len(live))]
        private_rows = [r for g in live for r in g.rows]
        private = _private_logits(model, hidden, live, private_rows, cand_ids, sparse)

        row_tokens = torch.empty(hidden.shape[0], dtype=torch.long)
        finished: list[int] = []
        offset = 0
        for j, g in enumerate(live):
            ids = cand_ids[j]
            m = len(g.rows)
            block = private[offset:offset + m]
            offset += m
            priv = block[:, : ids.numel()] if sparse else block[:, ids]
            scores = candidate_scores(priv, public[j, ids], params.clip, params.batch_size)
            token = sample_from_candidates(scores, ids.numpy(), params.temperature, g.rng)
            g.sizes.append(int(ids.numel()))
            if public[j, token] < thresholds[j, 0]:
                g.expansion += 1
            row_tokens[g.rows] = token
            row_tokens[g.public_row] = token
            if token in eos and params.stop_at_eos:
                finished.append(j)
                continue
            g.tokens.append(token)
            if len(g.tokens) >= params.max_tokens:
                finished.append(j)
        if on_step is not None:
            on_step(len(live))

        if not finished:
            next_tokens = row_tokens
            continue
        done = set(finished)
        for j in finished:
            g = live[j]
            stopped = "length" if len(g.tokens) >= params.max_tokens else "eos"
            yield GroupResult(g.job.index, g.tokens, model.decode(g.tokens), stopped,
                              g.sizes, g.expansion)
        live = [g for j, g in enumerate(live) if j not in done]
        if not live:
            break
        keep: list[int] = []
        for g in live:  # renumber the surviving rows: private rows first, then the public one
            new_rows = []
            for r in g.rows:
                new_rows.append(len(keep))
                keep.append(r)
            old_public = g.public_row
            g.rows, g.public_row = new_rows, len(keep)
            keep.append(old_public)
        keep_t = torch.tensor(keep, dtype=torch.long)
        state = model.drop_rows(state, keep_t)
        next_tokens = row_tokens[keep_t]


def _private_logits(
    model: LogitsModel,
    hidden: torch.Tensor,
    live: Sequence[_Live],
    private_rows: list[int],
    cand_ids: list[torch.Tensor],
    sparse: bool,
) -> torch.Tensor:
    if not private_rows:
        return torch.empty(0, 0)
    rows_hidden = hidden[private_rows]
    if not sparse:
        return model.logits_from_hidden(rows_hidden)
    width = max(ids.numel() for ids in cand_ids)
    cand = torch.empty(len(private_rows), width, dtype=torch.long)
    offset = 0
    for g, ids in zip(live, cand_ids, strict=True):
        m = len(g.rows)
        if m:
            padded = torch.cat([ids, ids[:1].expand(width - ids.numel())])
            cand[offset:offset + m] = padded
        offset += m
    return model.logits_from_hidden(rows_hidden, cand)


def run_plain(
    model: LogitsModel,
    prompts: Sequence[str],
    max_tokens: int,
    temperature: float,
    top_k: int,
    streams: RandomStreams,
    stop_at_eos: bool = True,
    on_step: Callable[[int], None] | None = None,
    first_stream: int = 0,
) -> list[list[int]]:
    """Non-private top-k sampling, one independent text per prompt (row ``i`` uses stream
    ``first_stream + i``). Used for public-only generation (no references: no privacy cost)
    and as the non-private baseline in benchmarks. Returns each text's token ids (no EOS)."""
    rngs = [streams.generator(first_stream + i) for i in range(len(prompts))]
    outputs: list[list[int]] = [[] for _ in prompts]
    alive = list(range(len(prompts)))
    state = model.encode_prompts(list(prompts))
    next_tokens: torch.Tensor | None = None
    eos = model.eos_token_ids
    while alive:
        logits = model.logits_from_hidden(model.next_hidden(state, next_tokens))
        if 0 < top_k < logits.shape[-1]:
            values, ids = torch.topk(logits, top_k, dim=-1)
        else:
            values = logits
            ids = torch.arange(logits.shape[-1]).expand_as(logits)
        tokens = torch.empty(len(alive), dtype=torch.long)
        keep: list[int] = []
        for j, row in enumerate(alive):
            scores = values[j].to(torch.float64).numpy()
            token = sample_from_candidates(scores, ids[j].numpy(), temperature, rngs[row])
            tokens[j] = token
            if token in eos and stop_at_eos:
                continue
            outputs[row].append(token)
            if len(outputs[row]) < max_tokens:
                keep.append(j)
        if on_step is not None:
            on_step(len(alive))
        if len(keep) < len(alive):
            if not keep:
                break
            keep_t = torch.tensor(keep, dtype=torch.long)
            state = model.drop_rows(state, keep_t)
            alive = [alive[j] for j in keep]
            next_tokens = tokens[keep_t]
        else:
            next_tokens = tokens
    return outputs

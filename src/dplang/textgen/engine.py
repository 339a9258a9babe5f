"""The generation engine: decodes many InvisibleInk generation groups over one model.

A *group* is one generation: B private prompts (one per reference) and one public prompt.
The engine decodes up to G groups at once — G×(B+1) rows in one model batch, fewer when
references are empty — retires a group's rows as soon as it ends (EOS or T tokens) and admits
the next group in its place, whose prompts run in the same model call as the others' next
tokens (continuous batching at the level of groups).

Privacy-relevant properties (docs/privacy.md invariants 1, 2, 5):

* a private prompt identical to the public prompt (an empty reference) gets no row: its
  clipped difference is exactly zero by construction (:func:`invisibleink.aggregate`);
* the candidate set V_k^+ is computed from the public row's logits only, and with the sparse
  LM head the private rows' logits are computed only on V_k^+ — the sampling law is the same as
  the dense path's because both feed the same candidate scores to the same sampler;
* policies that offer it (``batch_settings``: plain InvisibleInk) are decided for all live
  groups at once on the model's device, with one host copy per step
  (:mod:`~dplang.textgen.methods.invisibleink_batch`): the same tokens, bit for bit, as each
  policy's own ``choose``; other policies decide group by group;
* group ``j`` samples from its own stream ``streams.generator(j)``, and the model is
  row-invariant (``dplang.models.base``: a row's logits are the same bits whatever else is in
  the batch), so its text does not depend on G, on the other groups (their references, their
  lengths, when they end), or on resuming: bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .._lazy import lazy_module
from ..models.devices import index_tensor
from ..privacy.mechanisms import exponential_mechanism
from ..privacy.randomness import RandomStreams, StreamSource

if TYPE_CHECKING:
    from ..models.base import LogitsModel

torch = lazy_module("torch")  # imported on first use: declaring methods needs no torch


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
    to ``public_prompt`` stands for an empty reference. ``prefix`` is public text that the
    prompts start with (the template up to the reference, as far as the public prompt shares
    it): the model computes it once for all of the group's rows (see
    ``LogitsModel.add_prompts``)."""

    index: int
    public_prompt: str
    private_prompts: tuple[str, ...]
    prefix: str = ""


class StepPolicy(Protocol):
    """The per-generation decision rule of a private decoding method (one object per group).

    Privacy contract for implementers: :meth:`candidates` may read only the public logits;
    :meth:`choose` receives the private rows' logits (only the non-empty references: an empty
    reference contributes exactly the public logits and has no row) and must account for
    everything it releases."""

    def candidates(self, public: torch.Tensor) -> torch.Tensor | None:
        """Ascending token ids on which the private logits are needed, computed from the
        public logits ``[V]`` only; ``None`` means the whole vocabulary."""
        ...

    def choose(
        self, public: torch.Tensor, private: torch.Tensor, ids: torch.Tensor | None,
        rng: np.random.Generator,
    ) -> int | None:
        """The next token, from the public logits ``[V]`` and the private logits (``[m, K]``
        on ``ids``, or ``[m, V]`` when ``ids`` is None); ``None`` ends the generation before
        sampling (e.g. a spent data-dependent budget)."""
        ...

    def stats(self) -> dict[str, Any]:
        """Per-generation statistics recorded in the output."""
        ...

    # Optional (see _batch_settings): ``batch_settings()`` returns hashable settings, equal for
    # policies that one batched step may decide together, and ``batch_step(settings)`` that
    # step, whose ``choose`` must return exactly the tokens each policy's ``choose`` would.


@dataclass
class GroupResult:
    """What one generation produced (EOS is not part of ``token_ids``)."""

    index: int
    token_ids: list[int]
    text: str
    stopped: str  # "eos", "length" or "budget"
    stats: dict[str, Any] = field(default_factory=dict)
    #: Length in tokens when ``token_ids`` are not kept (population methods such as Aug-PE).
    token_count: int | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids) if self.token_count is None else self.token_count


@dataclass
class _Live:
    job: GroupJob
    policy: StepPolicy
    rng: np.random.Generator
    rows: list[int]  # private rows in the current model batch
    public_row: int
    tokens: list[int] = field(default_factory=list)


def run_groups(
    model: LogitsModel,
    jobs: Iterable[GroupJob],
    make_policy: Callable[[GroupJob], StepPolicy],
    batch_size: int,
    max_tokens: int,
    streams: StreamSource,
    concurrent_groups: int = 8,
    on_result: Callable[[GroupResult], None] | None = None,
    on_step: Callable[[int], None] | None = None,
    sparse_head: bool = True,
    stop_at_eos: bool = True,
    special_tokens: bool = False,
) -> list[GroupResult]:
    """Decode every job with its policy, ``concurrent_groups`` groups at a time.

    ``on_result`` is called as soon as a group ends (to persist it); ``on_step(n)`` after each
    decode step with the number of tokens produced in it (for progress). Returns all results
    in completion order. ``streams`` is a :class:`RandomStreams` (the driver, which holds the
    seed) or a :class:`~dplang.privacy.randomness.StreamStates` (an executor's worker, which
    holds only its groups' initial stream states): the draws are the same. The model's special
    and control tokens (``special_token_ids``) are never sampled unless ``special_tokens``
    (:func:`banned_tokens`)."""
    if concurrent_groups < 1:
        raise ValueError(f"concurrent groups must be >= 1, got {concurrent_groups}")
    if max_tokens < 1:
        raise ValueError(f"max tokens must be >= 1, got {max_tokens}")
    require_row_invariance(model)
    results: list[GroupResult] = []
    for res in _run_continuous(model, jobs, make_policy, batch_size, max_tokens, streams,
                               concurrent_groups, on_step, sparse_head, stop_at_eos,
                               banned_tokens(model, special_tokens)):
        results.append(res)
        if on_result is not None:
            on_result(res)
    return results


def banned_tokens(model: Any, special_tokens: bool = False) -> torch.Tensor | None:
    """The token ids a generation never samples: the model's special and control tokens
    (``special_token_ids``: markup such as ``<start_of_image>``, never the end of sequence),
    or none when ``special_tokens`` asks for them. Public: a function of the tokenizer.

    Privacy contract: the engine sets these tokens' logits to −∞ in the public row and in
    every private row alike (a fixed, public change of the model), so a method's candidate
    set, computed from the public logits, never holds them, and no record can change that."""
    ids = getattr(model, "special_token_ids", None)
    if special_tokens or not ids:
        return None
    return torch.tensor(sorted(ids), dtype=torch.long)


def _ban(logits: torch.Tensor, banned: torch.Tensor | None,
         ids: torch.Tensor | None = None) -> torch.Tensor:
    """``logits`` ``[rows, V]`` (or ``[rows, K]`` on ``ids``) with the banned tokens at −∞."""
    if banned is None or logits.numel() == 0:
        return logits
    if ids is None:
        logits[:, banned] = -math.inf
    else:
        hit = torch.isin(ids, banned)
        if bool(hit.any()):
            logits[:, hit] = -math.inf
    return logits


def warm_up() -> None:
    """Load the engine's own compiled kernels (Top-k+ candidates) before decoding starts, on
    public dummy input: a worker says it is ready only then, so its first decode step is not
    mistaken for a hung worker while numba loads them."""
    from ..models import kernels

    probe = torch.zeros(4)
    fused = kernels.lookup("topk_plus", probe)  # one row of the batched step's kernel
    if fused is not None:
        fused(probe, 1, 0.0, 1)


def require_row_invariance(model: Any) -> None:
    """Refuse a model that cannot show that each row's logits depend on that row alone for its
    configuration as it is now (DESIGN invariant 7: the parallel composition of the groups and
    the public-only candidate sets rest on it). A backend that can run the check
    (``ensure_row_invariance``) runs it for a configuration not yet checked (its record when on
    file). Raises :class:`~dplang.models.errors.RowInvarianceError`."""
    from ..models.errors import RowInvarianceError

    checked = getattr(model, "row_invariance_checked", None)
    if callable(checked) and checked() is True:
        return
    ensure = getattr(model, "ensure_row_invariance", None)
    if callable(ensure):  # e.g. its thread count changed since its load: checked again here
        ensure()
    if not (callable(checked) and checked() is True):
        raise RowInvarianceError(
            f"model {getattr(model, 'model_id', type(model).__name__)!r} has not passed "
            "dplang's row-invariance check for its present configuration (a model loaded with "
            "check_invariance=False is for scoring only): load it with "
            "dplang.models.resolve_model(spec), or pass its spec")


def _run_continuous(
    model: LogitsModel,
    jobs: Iterable[GroupJob],
    make_policy: Callable[[GroupJob], StepPolicy],
    batch_size: int,
    max_tokens: int,
    streams: StreamSource,
    concurrent_groups: int,
    on_step: Callable[[int], None] | None,
    sparse_head: bool,
    stop_at_eos: bool,
    banned: torch.Tensor | None = None,
) -> Iterator[GroupResult]:
    """Continuous batching at the level of groups: up to ``concurrent_groups`` groups are
    decoded together, and a new group is admitted (its prompts run in the same model call as
    the others' next tokens) as soon as one retires.

    Which groups share a call depends on when the others end (EOS: on their references). That
    is safe because nothing a group computes depends on the rows beside it: the model is
    row-invariant and each group samples from its own stream ``streams.generator(index)``."""
    queue = iter(jobs)
    live: list[_Live] = []
    state = model.encode_prompts([])
    eos = model.eos_token_ids
    tokens_of_started: list[int] = []  # next token of every row that has run, in row order

    def admit() -> None:
        while len(live) < concurrent_groups:
            job = next(queue, None)
            if job is None:
                return
            if len(job.private_prompts) != batch_size:
                raise ValueError(f"group {job.index} has {len(job.private_prompts)} "
                                 f"references, expected {batch_size}")
            first = state.rows
            prompts = [p for p in job.private_prompts if p != job.public_prompt]
            # An empty reference (its prompt is the public one) gets no row: its clipped
            # difference is exactly zero by construction.
            rows_prompts = [*prompts, job.public_prompt]
            # A prompt that does not start with the prefix (only a private one can: a chat
            # template may rewrite its reference) is run whole: its own rows' business.
            prefixes = [job.prefix if p.startswith(job.prefix) else None for p in rows_prompts]
            model.add_prompts(state, rows_prompts, prefixes)
            rows = list(range(first, first + len(prompts)))
            live.append(_Live(job, make_policy(job), streams.generator(job.index), rows,
                              first + len(prompts)))

    steppers: dict[Any, Any] = {}  # batched steps by their settings (they keep a width)
    reserve = getattr(model, "reserve_new_tokens", None)
    if reserve is not None:  # a capacity hint: the store is sized once for prompt + tokens
        reserve(state, max_tokens)
    admit()
    while live:
        step_tokens = (torch.tensor(tokens_of_started, dtype=torch.long)
                       if tokens_of_started else None)
        hidden = model.next_hidden(state, step_tokens)
        settings = _batch_settings(live) if sparse_head else None
        if settings is not None:  # every group decided in one batch, on the model's device
            if banned is not None and banned.device != hidden.device:
                banned = banned.to(hidden.device)  # once: an index from the host would wait
            stepper = steppers.get(settings)
            if stepper is None:
                stepper = steppers[settings] = live[0].policy.batch_step(settings)  # type: ignore[attr-defined]
            public_hidden = hidden[index_tensor([g.public_row for g in live], hidden.device)]
            decided = [(g.rows, g.policy, g.rng) for g in live]
            superset = _top_superset(model, public_hidden, settings, banned)
            picks: list[int | None]
            if superset is not None:  # the public rows' logits on a superset of V_k^+ only
                picks = stepper.choose_in_superset(model, hidden, superset, decided)
            else:
                public = _ban(model.logits_from_hidden(public_hidden, keep_device=True), banned)
                picks = stepper.choose(model, hidden, public, decided)
        else:
            picks = _choose_per_group(model, hidden, live, banned, sparse_head)

        row_tokens = [0] * hidden.shape[0]
        finished: list[tuple[int, str]] = []
        for j, g in enumerate(live):
            token = picks[j]
            if token is None:
                finished.append((j, "budget"))
                continue
            for r in (*g.rows, g.public_row):
                row_tokens[r] = token
            if token in eos and stop_at_eos:
                finished.append((j, "eos"))
                continue
            g.tokens.append(token)
            if len(g.tokens) >= max_tokens:
                finished.append((j, "length"))
        if on_step is not None:
            on_step(len(live))

        if finished:
            done = {j for j, _ in finished}
            for j, why in finished:
                g = live[j]
                yield GroupResult(g.job.index, g.tokens, model.decode(g.tokens), why,
                                  g.policy.stats())
            live = [g for j, g in enumerate(live) if j not in done]
            keep: list[int] = []
            for g in live:  # renumber the surviving rows: private rows first, then the public
                new_rows = []
                for r in g.rows:
                    new_rows.append(len(keep))
                    keep.append(r)
                old_public = g.public_row
                g.rows, g.public_row = new_rows, len(keep)
                keep.append(old_public)
            model.drop_rows(state, torch.tensor(keep, dtype=torch.long))
            row_tokens = [row_tokens[r] for r in keep]
        tokens_of_started = row_tokens
        admit()


def _top_superset(model: LogitsModel, public_hidden: torch.Tensor, settings: Any,
                  banned: torch.Tensor | None) -> Any:
    """The public rows' logits on a superset of their Top-k+ sets (the model's
    ``top_superset_logits`` with k and the margin ``f32(2C/B)`` of ``settings``), or ``None``
    where the model has no such method or no cheaper way: then every public logit is
    computed. Public rows only: the choice depends on public data alone."""
    method = getattr(model, "top_superset_logits", None)
    if not callable(method):
        return None
    with np.errstate(over="ignore"):  # a margin beyond float32 is +inf, as the rule's
        margin = float(np.float32(2.0 * settings.clip_norm / settings.batch_size))
    if not margin >= 0.0:  # (a negative C: refused by calibration, not by a policy)
        return None
    return method(public_hidden, settings.top_k, margin, banned)


def _batch_settings(live: Sequence[_Live]) -> Any:
    """The settings every live group's policy shares for a batched step (``batch_settings``),
    or ``None`` when a policy has none or they differ: then each group decides alone."""
    first = getattr(live[0].policy, "batch_settings", None)
    settings = first() if callable(first) else None
    if settings is None:
        return None
    for g in live[1:]:
        other = getattr(g.policy, "batch_settings", None)
        if not callable(other) or other() != settings:
            return None
    return settings


def _choose_per_group(model: LogitsModel, hidden: torch.Tensor, live: Sequence[_Live],
                      banned: torch.Tensor | None, sparse_head: bool) -> list[int | None]:
    """Each group's next token by its own policy, one group at a time."""
    if banned is not None:
        banned = banned.cpu()  # these logits are on the CPU
    public = _ban(model.logits_from_hidden(hidden[[g.public_row for g in live]]), banned)
    cand_ids = [g.policy.candidates(public[j]) for j, g in enumerate(live)]
    blocks = [_ban(block, banned, cand_ids[j]) for j, block in
              enumerate(_private_logits(model, hidden, live, cand_ids, sparse_head))]
    return [g.policy.choose(public[j], blocks[j], cand_ids[j], g.rng)
            for j, g in enumerate(live)]


def _private_logits(
    model: LogitsModel,
    hidden: torch.Tensor,
    live: Sequence[_Live],
    cand_ids: Sequence[torch.Tensor | None],
    sparse_head: bool,
) -> list[torch.Tensor]:
    """Each group's private logits: ``[m, K]`` on its candidates, or ``[m, V]`` when it has
    none. A group with candidates uses the sparse head (when on) and the others the full head,
    group by group: one group's choice never changes how another's logits are computed."""
    sparse = [sparse_head and ids is not None for ids in cand_ids]
    blocks: list[torch.Tensor] = [torch.empty(0, 0)] * len(live)
    for use_sparse in (True, False):
        members = [j for j, g in enumerate(live) if sparse[j] == use_sparse and g.rows]
        if not members:
            continue
        rows = [r for j in members for r in live[j].rows]
        if use_sparse:
            width = max(cand_ids[j].numel() for j in members)  # type: ignore[union-attr]
            cand = torch.cat([torch.cat([ids, ids[:1].expand(width - ids.numel())])
                              .expand(len(live[j].rows), width)
                              for j in members
                              for ids in [cand_ids[j]] if ids is not None])
            logits = model.logits_from_hidden(hidden[rows], cand)
        else:
            logits = model.logits_from_hidden(hidden[rows])
        offset = 0
        for j in members:
            m = len(live[j].rows)
            block = logits[offset:offset + m]
            offset += m
            ids = cand_ids[j]
            if ids is not None:  # narrow to this group's candidates (sparse rows are padded)
                block = block[:, : ids.numel()] if use_sparse else block[:, ids]
            blocks[j] = block
    for j, g in enumerate(live):
        if not g.rows:
            ids = cand_ids[j]
            blocks[j] = torch.empty(0, model.vocab_size if ids is None else ids.numel())
    return blocks


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
    special_tokens: bool = False,
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
    banned = banned_tokens(model, special_tokens)
    while alive:
        logits = _ban(model.logits_from_hidden(model.next_hidden(state, next_tokens)), banned)
        if 0 < top_k < logits.shape[-1]:
            values, ids = torch.topk(logits, top_k, dim=-1)
        else:
            values = logits
            ids = torch.arange(logits.shape[-1]).expand_as(logits)
        tokens = torch.empty(len(alive), dtype=torch.long)
        keep: list[int] = []
        for j, row in enumerate(alive):
            scores = values[j].to(torch.float64).numpy()
            allowed = ~np.isneginf(scores) if banned is not None else None
            token = int(ids[j, exponential_mechanism(scores, temperature, rngs[row],
                                                     mask=allowed)])
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

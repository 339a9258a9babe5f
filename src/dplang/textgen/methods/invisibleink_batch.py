"""One InvisibleInk decode step for every live group at once, on the model's device.

:class:`InvisibleInkPolicy` decides one group at a time: its Top-k+ set, its private logits on
that set, its fixed-point scores, its draw. That is a handful of small operations and host
round trips per group and step — nothing on a CPU at G = 8, most of the step on a GPU at
G = 256. :class:`GroupBatchStep` computes the same decisions for all groups together:

1. **Top-k+ sets** ``[G, W]`` from the public logits ``[G, V]``, row by row (the CPU's fused
   kernel per row, or one batched top-k and mask on any device), padded to a width W by
   repeating each row's first id;
2. **private logits on them** ``[R, W]``: one call of the sparse LM head for all private rows;
3. **fixed-point scores** ``[G, W]`` in float64, exactly the integers and bits of
   :func:`~dplang.textgen.methods.invisibleink.candidate_scores` (below);
4. **one host copy** of (scores, ids, public logits on the ids, set sizes) — on a GPU the
   step's only synchronisation — and each group's draw from its own stream on the host,
   by the very code :meth:`InvisibleInkPolicy.choose` runs
   (:meth:`InvisibleInkPolicy.choose_scored`).

Privacy contract: the tokens are those of :meth:`InvisibleInkPolicy.choose` per group, bit for
bit, whatever the device, the number of groups, their order, or the width W (tested:
``tests/textgen/test_invisibleink_batch.py``); so the guarantee of
:class:`InvisibleInkPolicy` holds unchanged, and group ``g``'s token depends only on its own
rows and its own stream. Why each stage is row-local and exact (docs/privacy.md, "The batched
InvisibleInk step"):

* the Top-k+ set of row ``g`` is a function of that row's public logits only (a per-row top-k
  threshold and comparisons); the padding W depends on other groups' set sizes, and so does
  nothing but which padded columns are computed and then ignored;
* the private logits of a candidate are the same bits at any width (the sparse head's
  contract, ``logits_from_hidden``);
* the scores use only IEEE-exact operations on float64: subtraction of float32 values widened
  to float64, clamping, multiplication by a power of two built from its bits (not ``ldexp``
  or ``exp2``, whose GPU versions are not specified to be exact), rounding to an integer, sums
  of integers below 2^53 (exact in any order, so ``index_add_``'s order on a GPU does not
  matter), one correctly rounded division by B. The grid exponent comes from ``frexp``, an
  exact operation, not a logarithm;
* the draw — ``exp``, a running sum and a search, whose GPU versions are neither correctly
  rounded nor in a fixed order — is made on the host, per group, from the group's own numpy
  stream: a text is the same whichever device computed its scores.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..._lazy import lazy_module

torch = lazy_module("torch")


class GroupDecider(Protocol):
    """What the batched step needs of a group's policy (:class:`InvisibleInkPolicy`; this
    module imports nothing of :mod:`.invisibleink`, which imports it)."""

    def choose_scored(self, ids: np.ndarray, scores: np.ndarray, public_on: np.ndarray,
                      rng: np.random.Generator) -> int:
        """The draw from the candidate ids, their float64 scores and public logits."""
        ...


@dataclass(frozen=True)
class BatchSettings:
    """What groups must share to be decided in one batch (all public)."""

    clip_norm: float
    batch_size: int
    temperature: float
    top_k: int


def power_of_two(exponents: torch.Tensor) -> torch.Tensor:
    """2^e as float64 for int64 exponents in the normal range [−1022, 1023] (the caller's
    duty: not checked, a check would synchronise a GPU), built from its bits: exact on every
    device (``torch.ldexp``/``exp2`` are not specified to be)."""
    return ((exponents.to(torch.int64) + 1023) << 52).view(torch.float64)


def ceil_log2(values: torch.Tensor) -> torch.Tensor:
    """⌈log2 x⌉ of positive finite float64 ``values``, exactly (from ``frexp``: x = m·2^e with
    m in [0.5, 1), so ⌈log2 x⌉ = e − 1 when m = 0.5 and e otherwise)."""
    mantissa, exponent = torch.frexp(values)
    return exponent.to(torch.int64) - (mantissa == 0.5).to(torch.int64)


def topk_plus_mask(public: torch.Tensor, top_k: int, clip_norm: float, batch_size: int
                   ) -> torch.Tensor:
    """V_k^+ of each row of ``[G, V]`` as a boolean mask, for 0 < k < V: exactly
    :func:`~dplang.textgen.methods.invisibleink.expanded_topk_mask` of each row alone."""
    # ℓ, each row's k-th largest public logit, NaN counted as −inf (as topk_threshold)
    clean = torch.nan_to_num(public, nan=-math.inf, posinf=math.inf, neginf=-math.inf)
    ell = torch.topk(clean, top_k, dim=-1).values[..., -1:]
    plus = torch.isposinf(public)
    # a row with +inf logits keeps exactly those (its threshold is not read: with a margin
    # that overflows float32, +inf − inf would be NaN and drop them)
    return torch.where(plus.any(dim=-1, keepdim=True), plus,
                       torch.isfinite(public) & (public >= ell - 2.0 * clip_norm / batch_size))


def masked_ids(mask: torch.Tensor, width: int) -> torch.Tensor:
    """The first ``width`` ids of each row's mask, ascending, padded by the row's first id
    (rows with more than ``width`` ids are cut: callers check the sizes)."""
    vocab = mask.shape[-1]
    # int32 keys (a vocabulary is far below 2^31): half the memory traffic of int64 over
    # [G, V], which is most of this function's cost on a GPU at large G
    arange = torch.arange(vocab, device=mask.device, dtype=torch.int32)
    key = torch.where(mask, arange, torch.full((), vocab, dtype=torch.int32, device=mask.device))
    ids = torch.topk(key, min(width, vocab), dim=-1, largest=False, sorted=True).values
    ids = ids.to(torch.int64)
    if width > vocab:
        ids = torch.cat([ids, ids[:, :1].expand(-1, width - vocab)], dim=-1)
    first = ids[:, :1]
    first = torch.where(first == vocab, 0, first)  # an empty row (refused after the copy)
    return torch.where(ids == vocab, first, ids)


def batched_scores(private: torch.Tensor, owner: torch.Tensor, public_on: torch.Tensor,
                   sizes: torch.Tensor, clip_norm: float, batch_size: int) -> torch.Tensor:
    """:func:`~dplang.textgen.methods.invisibleink.candidate_scores` of every group at once.

    ``public_on`` ``[G, W]``: each group's public logits on its (padded) candidates; ``sizes``
    ``[G]``: how many of them are real; ``private`` ``[R, W]``: the private rows' logits on
    their group's candidates; ``owner`` ``[R]``: each private row's group. Returns float64
    ``[G, W]``; the first ``sizes[g]`` entries of row g are the bits ``candidate_scores``
    returns for group g alone (zeros for a row whose candidates have a +inf public logit:
    :meth:`InvisibleInkPolicy.scores`' uniform case), the rest is unspecified."""
    groups, width = public_on.shape
    device = public_on.device
    pub = public_on.to(torch.float64)
    valid = torch.arange(width, device=device) < sizes.to(device)[:, None]
    plus = (torch.isposinf(pub) & valid).any(dim=-1)
    finite = torch.where(valid & ~plus[:, None], pub, torch.zeros((), dtype=torch.float64,
                                                                  device=device))
    top = finite.abs().amax(dim=-1) if width else torch.zeros(groups, dtype=torch.float64,
                                                              device=device)
    # grid_exponent: the largest q with B·(max|φ_pub| + C + 1)·2^q ≤ 2^51; the bound is at
    # least 1 and finite, so q ≤ 51 and q ≥ 51 − 1024: 2^q and 2^−q are normal floats
    q = 51 - ceil_log2((top + float(clip_norm) + 1.0) * batch_size)
    scale = power_of_two(q)[:, None]
    total = batch_size * torch.round(finite * scale)
    if private.shape[0]:
        limit = torch.clamp(torch.floor(clip_norm * scale) - 2, min=0.0)
        own = owner.to(device)
        diff = private.to(device=device, dtype=torch.float64) - finite[own]
        diff = torch.nan_to_num(diff, nan=0.0, posinf=float(clip_norm),
                                neginf=-float(clip_norm)).clamp(-clip_norm, clip_norm)
        steps = torch.round(diff * scale[own])
        steps = torch.maximum(torch.minimum(steps, limit[own]), -limit[own])
        total = total.index_add(0, own, steps)  # integers below 2^53: exact in any order
    # B as a tensor on the device: a GPU divides by a host scalar as a multiplication by its
    # reciprocal (not correctly rounded); by a tensor, correctly rounded, like the CPU
    divisor = torch.full((), float(batch_size), dtype=torch.float64, device=device)
    scores = (total / divisor) * power_of_two(-q)[:, None] + 0.0  # + 0.0: no −0.0 scores
    return torch.where(plus[:, None], torch.zeros((), dtype=torch.float64, device=device),
                       scores)


@dataclass
class GroupBatchStep:
    """The batched decision of one step for groups that share :class:`BatchSettings`.

    Keeps, on a GPU, a width W for the Top-k+ sets that grows when a step's sets do not fit
    (the step is then recomputed at the larger width: a function of public logits only), so
    that W needs no synchronisation; on the CPU W is each step's largest set."""

    settings: BatchSettings
    width: int = 0
    #: Keep a width across steps even on the CPU (a GPU always does); for tests.
    fixed_width: bool = False

    def choose(self, model: Any, hidden: torch.Tensor, public: torch.Tensor,
               groups: Sequence[tuple[Sequence[int], GroupDecider, np.random.Generator]]
               ) -> list[int]:
        """The next token of every group: ``groups[g]`` = (its private rows in ``hidden``, its
        policy, its stream); ``public[g]`` is its public row's logits (banned tokens at −inf).
        Each token is what ``policy.choose`` returns for that group alone."""
        s = self.settings
        from ...models import kernels

        for rows_g, _policy, _rng in groups:
            if len(rows_g) > s.batch_size:
                raise ValueError(f"{len(rows_g)} private rows for a batch of {s.batch_size}")
        fused = kernels.lookup("topk_plus_rows", public)
        if fused is not None:  # the CPU's kernel, rows in parallel: the exact width
            ids, sizes = fused(public, s.top_k, s.clip_norm, s.batch_size)
            exact = self._finish(model, hidden, public.gather(1, ids.to(public.device)), groups,
                                 ids, sizes)
            assert exact is not None  # the width is the largest set's
            return exact
        mask = topk_plus_mask(public, s.top_k, s.clip_norm, s.batch_size)
        sizes = mask.sum(dim=-1)
        fixed = self.fixed_width or public.device.type != "cpu"
        if not fixed:  # no synchronisation to save: the exact width
            self.width = max(int(sizes.max()), 1)
        elif self.width == 0:
            self.width = self._least_width
        while True:
            ids = masked_ids(mask, self.width)
            tokens = self._finish(model, hidden, public.gather(1, ids.to(public.device)),
                                  groups, ids, sizes)
            if tokens is not None:
                return tokens
            # a set did not fit: widen (public logits only decide) and recompute the step

    def choose_in_superset(self, model: Any, hidden: torch.Tensor,
                           superset: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                           groups: Sequence[tuple[Sequence[int], GroupDecider,
                                                  np.random.Generator]]) -> list[int]:
        """:meth:`choose` from a superset of each group's Top-k+ set instead of its whole public
        row: ``superset = (ids [G, W], sizes [G], logits [G, W])`` as the model's
        ``top_superset_logits`` returns for the public rows with this step's k and
        margin ``f32(2C/B)`` (the k largest public logits and every token whose public
        logit is at least ``f32(ell - margin)``, with their logits). The rule applied to
        those logits (the rest at -inf) gives each group's Top-k+ set exactly: the k
        largest public logits are all in the superset (so ``ell`` is the same) and so is
        every token the rule keeps. The same tokens as :meth:`choose` (tested)."""
        s = self.settings
        from ...models import kernels

        for rows_g, _policy, _rng in groups:
            if len(rows_g) > s.batch_size:
                raise ValueError(f"{len(rows_g)} private rows for a batch of {s.batch_size}")
        cand, counts, logits = superset
        width = logits.shape[1]
        outside = torch.arange(width)[None, :] >= counts[:, None]
        values = logits.masked_fill(outside, -math.inf)  # the padding repeats a candidate
        if width <= s.top_k:  # more columns than k: the rule then always takes its k-th
            # largest (at most k columns would make it keep the whole set)
            extra = s.top_k + 1 - width
            values = torch.cat([values, values.new_full((values.shape[0], extra), -math.inf)],
                               dim=1)
            cand = torch.cat([cand, cand[:, :1].expand(-1, extra)], dim=1)
        fused = kernels.lookup("topk_plus_rows", values)
        if fused is not None:
            local, sizes = fused(values, s.top_k, s.clip_norm, s.batch_size)
        else:
            mask = topk_plus_mask(values, s.top_k, s.clip_norm, s.batch_size)
            sizes = mask.sum(dim=-1)
            local = masked_ids(mask, max(int(sizes.max()), 1))
        ids = cand.gather(1, local)
        tokens = self._finish(model, hidden, values.gather(1, local), groups, ids, sizes)
        assert tokens is not None  # the width is the largest set's
        return tokens

    @property
    def _least_width(self) -> int:
        """The width a kept width starts at and never shrinks below: room for twice k."""
        return _round_up(2 * self.settings.top_k + 14)

    def _finish(self, model: Any, hidden: torch.Tensor, public_on: torch.Tensor,
                groups: Sequence[tuple[Sequence[int], GroupDecider, np.random.Generator]],
                ids: torch.Tensor, sizes: torch.Tensor) -> list[int] | None:
        """The step from the candidate ids ``[G, W]``, their public logits ``public_on`` and
        the set sizes; ``None`` when a set did not fit in the width W."""
        from ...models.devices import index_tensor

        s = self.settings
        device = public_on.device
        rows = [r for g in groups for r in g[0]]
        owner = index_tensor([j for j, g in enumerate(groups) for _ in g[0]], device)
        if rows:
            index = index_tensor(rows, hidden.device)
            private = model.logits_from_hidden(hidden[index], ids[owner.to(ids.device)],
                                               keep_device=True)
        else:
            private = torch.empty((0, ids.shape[1]), dtype=torch.float32, device=device)
        scores = batched_scores(private, owner, public_on, sizes, s.clip_norm, s.batch_size)
        # the step's one host copy: everything the draws and the statistics read
        packed = torch.cat([scores, ids.to(device=device, dtype=torch.float64),
                            public_on.to(torch.float64),
                            sizes.to(device=device, dtype=torch.float64)[:, None]], dim=1).cpu()
        width = ids.shape[1]
        counts = packed[:, -1].to(torch.int64).tolist()
        largest = max(counts, default=0)
        if largest > width:
            self.width = _round_up(largest)
            return None
        if self.width >= 4 * _round_up(largest) and self.width > self._least_width:
            # a kept width far above the sets (after one huge set): shrink it, keeping room
            self.width = max(_round_up(2 * largest), self._least_width)
        if min(counts, default=1) == 0:  # before any group draws (no stream is advanced)
            raise ValueError("the public logits allow no token (all NaN or -inf)")
        host = packed.numpy()
        tokens = []
        for j, (_rows, policy, rng) in enumerate(groups):
            n = counts[j]
            tokens.append(policy.choose_scored(host[j, width:width + n].astype(np.int64),
                                               host[j, :n].copy(),
                                               host[j, 2 * width:2 * width + n], rng))
        return tokens


def _round_up(width: int) -> int:
    return max(64, -(-width // 64) * 64)


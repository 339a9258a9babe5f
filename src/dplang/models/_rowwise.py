"""Row-invariant execution of a Hugging Face transformer body (privacy-critical).

Parallel composition (one reference influences only its own generation) and a Top-k+ set that
depends on public data only both need a *row-invariant* model: the logits of a row, at every
prompt and decode step, must be a deterministic function of that row's own tokens, bit for bit,
whatever other rows share the batch, how many there are and how long they are. Ordinary batched
inference is not: padding to the longest prompt, kernels chosen by row count and reductions split
by shape all let a row's last bits depend on its neighbours (measured: up to 2.4e-5 of a logit in
float32 and 0.35 in bfloat16 on Gemma 3 270M). A difference between neighbouring datasets that is
not clipped is outside the proof, and a Top-k+ set that differs between them is an infinite
privacy loss.

This module removes every such dependence by construction, and the backend verifies it at load
(:func:`dplang.models.transformers.TransformersModel.check_row_invariance`):

* **No padding.** The rows of a step are concatenated into one token sequence (batch 1, ``T``
  tokens: a whole prompt per row on the first step, one token per row later); every per-token
  operation (embeddings, norms, rotary embeddings, MLP) sees only its own token's values.
* **Matrix products whose per-row result does not depend on the row count.** The linear layers
  use oneDNN pre-packed weights (see :mod:`dplang.models._kernels`), whose reduction order is fixed
  by the packed layout; measured bit-identical for every row count 1..8191 on every layer shape of
  the default model, where MKL's plain GEMM is not.
* **Elementwise functions with one code path.** PyTorch computes the tail of a vectorised loop
  with a scalar function that can differ in the last bit from the vector one (measured for GELU,
  SiLU and sigmoid; not for the functions it evaluates through its vector math library: exp,
  tanh, erf, sin, cos, sqrt, rsqrt, log). Where a row's elements fall in such a tail depends on
  the tensor's total size and the thread split, i.e. on the other rows, so the MLP activations are
  replaced by :class:`InvariantActivation`, written with those library functions and the
  correctly rounded + − × ÷ only (bfloat16 inputs are computed in float32 and rounded back).
* **Attention per row.** :func:`rowwise_attention` (registered with ``transformers`` under
  :data:`ROWWISE`) keeps each row's keys and values in fixed-size blocks of a paged cache
  (:class:`PagedKVCache`). A row whose step has several tokens (its prompt) is attended alone, in
  calls that contain nothing but that row. One-token steps are batched over (row, block) pairs:
  every pair is the same fixed-shape problem (``[g, d] x [d, P]`` then ``[g, P] x [P, d]``), and
  the per-block partial results of a row are merged in block order with elementwise operations
  only; a row with fewer blocks than the longest one is padded with ``-inf`` maxima and ``-0.0``
  sums, which leave every value bit-identical (``x + (-0.0) == x`` for every ``x``).

What remains a function of the configuration, not of the data, is public: the model, its dtype,
the thread count and the block size are fixed for a run.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

#: Name of the attention implementation registered with ``transformers``.
ROWWISE = "dplang_rowwise"

#: Tokens per block of the paged key/value cache. Decode attention reads whole blocks, so a row
#: wastes at most ``BLOCK_SIZE - 1`` positions; smaller blocks mean more pairs to merge.
BLOCK_SIZE = 64


class PagedKVCache:
    """Keys and values of every row in fixed-size blocks, one pool per layer.

    Block ``b`` of layer ``l`` holds ``BLOCK_SIZE`` consecutive positions of the row that owns
    it, ``[P, kv_heads, head_dim]`` in the model's dtype. The block ids of a row are the same in
    every layer (one allocator); rows never share a block, so writing or reading one row's block
    never touches another row's values."""

    def __init__(self, num_layers: int, block_size: int = BLOCK_SIZE) -> None:
        if block_size < 1:
            raise ValueError(f"block size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.capacity = 0
        self._free: list[int] = []

    def allocate(self, count: int) -> list[int]:
        """``count`` free block ids, zero-filled in every layer (the pools grow geometrically
        when needed). A reused block must not carry its previous owner's values: decode
        attention reads whole blocks, and a non-finite value at a masked position would still
        poison the new owner's result (0 * NaN = NaN)."""
        if count > len(self._free):
            grow = max(count - len(self._free), self.capacity, 16)
            self._free.extend(range(self.capacity + grow - 1, self.capacity - 1, -1))
            self.capacity += grow
        blocks = [self._free.pop() for _ in range(count)]
        self.fill(blocks, 0.0)
        return blocks

    @torch.inference_mode()
    def fill(self, blocks: Sequence[int], value: float) -> None:
        """Set ``blocks`` to ``value`` in every existing pool (growth fills with zeros)."""
        if not blocks:
            return
        index = torch.tensor(list(blocks), dtype=torch.int64)
        for pool in (*self.keys, *self.values):
            if pool is not None:
                index = index.to(pool.device)
                inside = index[index < pool.shape[0]]
                pool.index_fill_(0, inside, value)

    def release(self, blocks: Sequence[int]) -> None:
        """Return blocks to the free list (their contents are never read again)."""
        self._free.extend(blocks)

    def _pools(self, layer: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``layer``'s pools, grown to the current capacity (``like``: ``[T, kvh, d]``)."""
        pool_k, pool_v = self.keys[layer], self.values[layer]
        if pool_k is None or pool_v is None or pool_k.shape[0] < self.capacity:
            shape = (self.capacity, self.block_size, *like.shape[1:])
            new_k = like.new_zeros(shape)
            new_v = like.new_zeros(shape)
            if pool_k is not None and pool_v is not None:
                new_k[: pool_k.shape[0]] = pool_k
                new_v[: pool_v.shape[0]] = pool_v
            pool_k, pool_v = new_k, new_v
            self.keys[layer], self.values[layer] = pool_k, pool_v
        return pool_k, pool_v

    def write(self, layer: int, slots: torch.Tensor, keys: torch.Tensor,
              values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``keys``/``values`` ``[T, kv_heads, d]`` at flat ``slots`` (block * P + offset)
        of ``layer``; returns that layer's pools ``[capacity, P, kv_heads, d]``."""
        pool_k, pool_v = self._pools(layer, keys)
        flat = (-1, *keys.shape[1:])
        pool_k.view(flat).index_copy_(0, slots, keys.to(pool_k.dtype))
        pool_v.view(flat).index_copy_(0, slots, values.to(pool_v.dtype))
        return pool_k, pool_v

    @torch.inference_mode()
    def copy_block(self, source: int, target: int) -> None:
        """Copy block ``source`` into block ``target`` in every layer (exact copies)."""
        for layer, pool in enumerate(self.keys):
            if pool is None:
                continue
            pool_k, pool_v = self._pools(layer, pool[0])
            pool_k[target] = pool_k[source]
            pool_v[target] = pool_v[source]


@dataclass
class RowCache:
    """One row's share of the paged cache: its block ids and its number of cached positions.

    The first ``shared`` blocks belong to a shared prefix (read-only for this row, never
    released with it)."""

    blocks: list[int] = field(default_factory=list)
    length: int = 0
    shared: int = 0

    @property
    def owned(self) -> list[int]:
        """The blocks this row may write and frees when it is dropped."""
        return self.blocks[self.shared:]

    def slots(self, start: int, end: int, block_size: int) -> list[int]:
        """Flat cache slots of positions ``start..end-1``."""
        return [self.blocks[p // block_size] * block_size + p % block_size
                for p in range(start, end)]


@dataclass(frozen=True)
class PromptSegment:
    """A row whose step has several tokens: positions ``start..start+count-1`` of the row,
    tokens ``first..first+count-1`` of the step's sequence."""

    first: int
    count: int
    start: int
    slots: torch.Tensor  # flat cache slots of positions 0..start+count-1


@dataclass(frozen=True)
class PairPlan:
    """Decode attention of the one-token rows for one window size, as (row, block) pairs.

    ``pair_row[i]`` and ``pair_block[i]`` name the row (index into the step's one-token rows) and
    the cache block of pair ``i``; ``visible[i]`` marks the block's positions the row attends
    to; ``merge[r, j]`` is the pair holding row ``r``'s ``j``-th block, or ``len(pairs)``
    (a padding entry) where the row has fewer blocks."""

    pair_row: torch.Tensor
    pair_block: torch.Tensor
    visible: torch.Tensor
    merge: torch.Tensor


@dataclass
class StepLayout:
    """Everything :func:`rowwise_attention` needs about one forward call of the body."""

    cache: PagedKVCache
    slots: torch.Tensor  # [T] flat cache slot of every token of the step
    prompts: list[PromptSegment]
    single_tokens: torch.Tensor  # [R1] indices (in the step) of the one-token rows
    single_rows: list[RowCache]  # their caches, after this step's append
    plans: dict[int | None, PairPlan] = field(default_factory=dict)

    def pair_plan(self, window: int | None) -> PairPlan:
        """The (row, block) pairs of the one-token rows for a sliding ``window`` (None: all
        positions), computed once per step and window from the rows' lengths only."""
        plan = self.plans.get(window)
        if plan is None:
            plan = _pair_plan(self.single_rows, window, self.cache.block_size)
            device = self.slots.device
            if device.type != "cpu":  # built on the CPU from the rows' lengths, used there
                plan = PairPlan(*(t.to(device) for t in (plan.pair_row, plan.pair_block,
                                                         plan.visible, plan.merge)))
            self.plans[window] = plan
        return plan


def _pair_plan(rows: Sequence[RowCache], window: int | None, block_size: int) -> PairPlan:
    pair_row: list[int] = []
    pair_block: list[int] = []
    visible_rows: list[torch.Tensor] = []
    per_row: list[list[int]] = []
    positions = torch.arange(block_size)
    for r, row in enumerate(rows):
        end = row.length  # the new token is at end - 1 and sees positions [first, end)
        first = 0 if window is None else max(0, end - window)
        mine = []
        for b in range(first // block_size, (end - 1) // block_size + 1):
            mine.append(len(pair_row))
            pair_row.append(r)
            pair_block.append(row.blocks[b])
            pos = positions + b * block_size
            visible_rows.append((pos >= first) & (pos < end))
        per_row.append(mine)
    width = max((len(m) for m in per_row), default=0)
    pad = len(pair_row)
    merge = torch.full((len(rows), width), pad, dtype=torch.int64)
    for r, mine in enumerate(per_row):
        merge[r, : len(mine)] = torch.tensor(mine, dtype=torch.int64)
    visible = (torch.stack(visible_rows) if visible_rows
               else torch.empty(0, block_size, dtype=torch.bool))
    return PairPlan(torch.tensor(pair_row, dtype=torch.int64),
                    torch.tensor(pair_block, dtype=torch.int64), visible, merge)


#: The layout of the forward call being run (``None`` outside :func:`active_layout`).
_ACTIVE: contextvars.ContextVar[StepLayout | None] = contextvars.ContextVar(
    "dplang_rowwise_layout", default=None
)


@contextlib.contextmanager
def active_layout(configs: Sequence[Any], layout: StepLayout) -> Iterator[None]:
    """Within this context the model's attention runs :func:`rowwise_attention` on ``layout``
    (``configs``: the model's config objects whose ``_attn_implementation`` is switched)."""
    saved = [c._attn_implementation for c in configs]
    token = _ACTIVE.set(layout)
    try:
        for config in configs:
            config._attn_implementation = ROWWISE
        yield
    finally:
        for config, name in zip(configs, saved, strict=True):
            config._attn_implementation = name
        _ACTIVE.reset(token)


def rowwise_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    dropout: float = 0.0,
    **_kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of one step's tokens, each row over its own cached positions only.

    ``query`` is ``[1, heads, T, d]`` and ``key``/``value`` ``[1, kv_heads, T, d]`` (batch 1: the
    step's rows concatenated, see the module docstring). The new keys and values are appended to
    the paged cache first. Returns ``[1, T, heads, d]`` in the query's dtype."""
    layout = _ACTIVE.get()
    if layout is None:
        raise RuntimeError("rowwise attention called outside a row-invariant forward")
    if query.shape[0] != 1 or dropout:
        raise ValueError("rowwise attention takes one flattened sequence and no dropout")
    heads, tokens, dim = query.shape[1], query.shape[2], query.shape[3]
    kv_heads = key.shape[1]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads are not a multiple of {kv_heads} key heads")
    scale = float(scaling) if scaling is not None else dim**-0.5
    window = int(sliding_window) if sliding_window else None
    cap = float(softcap) if softcap else None

    pool_k, pool_v = layout.cache.write(
        module.layer_idx, layout.slots, key[0].transpose(0, 1), value[0].transpose(0, 1)
    )
    out = torch.empty((tokens, heads, dim), dtype=torch.float32, device=query.device)
    q_all = query[0].transpose(0, 1)  # [T, heads, d]
    if layout.single_tokens.numel():
        rows_q = q_all.index_select(0, layout.single_tokens).float()
        out[layout.single_tokens] = _decode_attention(
            rows_q, pool_k, pool_v, layout.pair_plan(window), scale, cap
        )
    for seg in layout.prompts:
        q = q_all[seg.first : seg.first + seg.count].float()
        out[seg.first : seg.first + seg.count] = _prompt_attention(
            q, pool_k, pool_v, seg, window, scale, cap
        )
    return out.to(query.dtype).unsqueeze(0), None


def _scores_postprocess(scores: torch.Tensor, scale: float, cap: float | None) -> torch.Tensor:
    scores = scores * scale
    if cap is not None:
        scores = torch.tanh(scores / cap) * cap
    return scores


def _decode_attention(
    q: torch.Tensor,
    pool_k: torch.Tensor,
    pool_v: torch.Tensor,
    plan: PairPlan,
    scale: float,
    cap: float | None,
) -> torch.Tensor:
    """One query token per row (``q`` ``[R, heads, d]`` float32) over the row's blocks."""
    rows, heads, dim = q.shape
    kv_heads = pool_k.shape[2]
    group = heads // kv_heads
    # Per pair and key head: [g, d] x [d, P], then [g, P] x [P, d] -- the same fixed-shape
    # problem for every pair. Operands are made contiguous in one fixed layout first: given a
    # strided view, torch.matmul picks a different kernel path when there is a single pair.
    pairs = plan.pair_row.numel()
    q_pairs = q.view(rows, kv_heads, group, dim).index_select(0, plan.pair_row)
    q_pairs = q_pairs.reshape(pairs * kv_heads, group, dim)
    k_blocks = pool_k.index_select(0, plan.pair_block).float()  # [pairs, P, kvh, d]
    k_blocks = k_blocks.permute(0, 2, 3, 1).contiguous().view(pairs * kv_heads, dim, -1)
    scores = _scores_postprocess(torch.bmm(q_pairs, k_blocks), scale, cap)
    # Invisible positions are set to -inf (not added to: NaN + -inf is NaN).
    scores = torch.where(plan.visible[:, None, None, :], scores.view(pairs, kv_heads, group, -1),
                         float("-inf"))
    block_max = scores.amax(dim=-1)  # [pairs, kvh, g]
    weights = torch.exp(scores - block_max.unsqueeze(-1))
    block_sum = weights.sum(dim=-1)
    v_blocks = pool_v.index_select(0, plan.pair_block).float()  # [pairs, P, kvh, d]
    v_blocks = v_blocks.permute(0, 2, 1, 3).contiguous().view(pairs * kv_heads, -1, dim)
    block_out = torch.bmm(weights.view(pairs * kv_heads, group, -1), v_blocks)
    block_out = block_out.view(pairs, kv_heads, group, dim)

    # Merge each row's blocks in block order. Padding entries carry max -inf and sums -0.0,
    # so they change no value: the result is the one the row alone would get.
    pad_max = block_max.new_full((1, kv_heads, group), float("-inf"))
    pad_sum = block_sum.new_full((1, kv_heads, group), -0.0)
    pad_out = block_out.new_full((1, kv_heads, group, dim), -0.0)
    index = plan.merge.reshape(-1)
    width = plan.merge.shape[1]
    maxima = torch.cat([block_max, pad_max]).index_select(0, index).view(rows, width, kv_heads,
                                                                           group)
    sums = torch.cat([block_sum, pad_sum]).index_select(0, index).view(rows, width, kv_heads,
                                                                        group)
    outs = torch.cat([block_out, pad_out]).index_select(0, index).view(rows, width, kv_heads,
                                                                        group, dim)
    row_max = maxima.amax(dim=1, keepdim=True)  # a maximum is exact in any order
    rescale = torch.exp(maxima - row_max)
    sums = sums * rescale
    outs = outs * rescale.unsqueeze(-1)
    total, acc = sums[:, 0], outs[:, 0]
    for j in range(1, width):
        total = total + sums[:, j]
        acc = acc + outs[:, j]
    return (acc / total.unsqueeze(-1)).reshape(rows, heads, dim)


def _prompt_attention(
    q: torch.Tensor,
    pool_k: torch.Tensor,
    pool_v: torch.Tensor,
    seg: PromptSegment,
    window: int | None,
    scale: float,
    cap: float | None,
) -> torch.Tensor:
    """Several new tokens of one row (``q`` ``[n, heads, d]`` float32), causal over the row's
    positions ``0..start+n-1``; computed in calls that contain this row only."""
    count, heads, dim = q.shape
    kv_heads = pool_k.shape[2]
    group = heads // kv_heads
    flat = (-1, kv_heads, dim)
    keys = pool_k.view(flat).index_select(0, seg.slots).float().transpose(0, 1)  # [kvh, L, d]
    values = pool_v.view(flat).index_select(0, seg.slots).float().transpose(0, 1)
    length = keys.shape[1]
    query_pos = torch.arange(seg.start, seg.start + count, device=q.device).unsqueeze(1)
    key_pos = torch.arange(length, device=q.device).unsqueeze(0)
    visible = key_pos <= query_pos
    if window is not None:
        visible &= key_pos > query_pos - window
    qg = q.transpose(0, 1).reshape(kv_heads, group * count, dim)
    scores = _scores_postprocess(torch.bmm(qg, keys.transpose(1, 2)), scale, cap)
    scores = scores.view(kv_heads, group, count, length).masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1).view(kv_heads, group * count, length)
    out = torch.bmm(probs, values).view(heads, count, dim)
    return out.transpose(0, 1)


# ---------------------------------------------------------------------------- activations

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


class InvariantActivation(torch.nn.Module):
    """An MLP activation computed with one code path for every element (see the module
    docstring): ``gelu_tanh``, ``gelu`` (erf), ``silu`` or ``relu``. Equal to PyTorch's fused
    version up to rounding."""

    KINDS = ("gelu_tanh", "gelu", "silu", "relu")

    def __init__(self, kind: str) -> None:
        super().__init__()
        if kind not in self.KINDS:
            raise ValueError(f"unknown activation {kind!r}")
        self.kind = kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        if self.kind == "gelu_tanh":
            inner = (y + 0.044715 * (y * y * y)) * _SQRT_2_OVER_PI
            out = 0.5 * y * (1.0 + torch.tanh(inner))
        elif self.kind == "gelu":
            out = 0.5 * y * (1.0 + torch.erf(y / math.sqrt(2.0)))
        elif self.kind == "silu":
            out = y / (1.0 + torch.exp(-y))
        else:
            out = torch.clamp(y, min=0.0)
        return out.to(x.dtype)


def _activation_kind(module: torch.nn.Module) -> str | None:
    """The :class:`InvariantActivation` kind equivalent to ``module``, if it is a known one."""
    name = type(module).__name__
    if name in ("GELUTanh", "PytorchGELUTanh", "NewGELUActivation", "GELUPytorchTanh",
                "FastGELUActivation"):
        return "gelu_tanh"
    if isinstance(module, torch.nn.GELU):
        return "gelu_tanh" if module.approximate == "tanh" else "gelu"
    if name == "GELUActivation":
        return "gelu"
    if isinstance(module, torch.nn.SiLU) or name == "SiLUActivation":
        return "silu"
    if isinstance(module, torch.nn.ReLU):
        return "relu"
    return None


def replace_activations(body: torch.nn.Module) -> int:
    """Swap every known activation module of ``body`` for an :class:`InvariantActivation`;
    returns how many were replaced. Raises ``NotImplementedError`` for an MLP whose activation
    is not one of the known kinds (its row invariance could not be guaranteed)."""
    replaced = 0
    for parent in body.modules():
        for name, child in list(parent.named_children()):
            kind = _activation_kind(child)
            if kind is not None:
                setattr(parent, name, InvariantActivation(kind))
                replaced += 1
            elif name in ("act_fn", "activation_fn", "act") and not isinstance(
                child, InvariantActivation
            ):
                raise NotImplementedError(
                    f"activation {type(child).__name__} has no row-invariant implementation"
                )
    return replaced


def register() -> bool:
    """Register :func:`rowwise_attention` under :data:`ROWWISE` (attention only: with no mask
    function registered for it, ``transformers`` builds no attention mask); ``False`` where
    this ``transformers`` has no attention registry."""
    try:
        from transformers import AttentionInterface
    except ImportError:  # pragma: no cover - older transformers
        return False
    AttentionInterface.register(ROWWISE, rowwise_attention)
    return True

"""Exact attention over a per-row key/value store (privacy-critical).

Each row owns a *slot*: a contiguous range of positions in per-layer tensors of keys and values
(:class:`SlotCache`). Keys and values are stored as integers on a scale per position and head
(:func:`~dplang.models.exact.quantize_rows` over the head dimension), queries are rounded the
same way per token and head, and attention is computed so that no sum depends on how it is
split (see :mod:`dplang.models.exact`):

* **Scores.** Queries are 15-bit integers split into two 8-bit limbs, keys integers of at most
  :func:`key_levels`; ``q . k`` is two sums of ``head_dim`` products whose every partial sum
  is at most 2**24: exact in float32 in any order, so a batched product over many rows gives
  each row the integers it gets alone. (Queries and keys arrive rotated by a Hadamard
  transform, which spreads a vector's outliers before it is rounded: see
  :mod:`dplang.models.decoder`.)
* **Softmax.** The maximum is exact in any order; ``exp`` is :func:`dplang.models.exact.exp`
  (basic operations only); the denominator is a :func:`~dplang.models.exact.fixed_point_sum`.
* **Values.** ``sum_p w_p * sigma_p * v_p`` is computed as integers: ``w_p * sigma_p`` is rounded
  to an integer of at most :data:`WEIGHT_LEVELS` relative to the row's largest, values are
  integers of at most :func:`value_levels`, and the products are summed per block of
  ``block`` positions (every partial sum at most 2**24: exact in float32), then across blocks
  in float64 (at most 2**20 positions: integers below 2**45, exact in any order). Not int64:
  a count that is not a number (a score that overflowed float32, weights whose masses
  overflowed) would be cast to an integer the platform chooses; in float64 it stays NaN, as in
  every kernel of this sum.

Positions a row cannot see (beyond its length, outside a sliding window, or another row's
data in a gathered tile) are excluded with ``where`` before any sum; stored integers and scales
are always finite, so an excluded position contributes an exact zero. A row's result is
therefore the same bits whatever rows, slots, padding or tiles surround it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dplang.models import kernels
from dplang.models.exact import TWO_LIMB_LEVELS, exp, fixed_point_sum, quantize_rows, split_limbs
from dplang.models.memory import trim_heap

__all__ = ["BLOCK_SIZE", "MAX_POSITIONS", "TILE", "WEIGHT_LEVELS", "AttentionStep", "PromptTile",
           "SlotCache", "attend", "gather_queries", "key_levels", "prompt_tiles", "value_levels"]

#: Weight of a query's high limb (queries are ``hi * LIMB_SCALE + lo``).
LIMB_SCALE = 256
#: Default positions per exact value sum (and per growth step of a slot).
BLOCK_SIZE = 64
#: Largest integer of an attention weight in the value sums (relative to the row's largest).
WEIGHT_LEVELS = 1024
#: Maximum tokens of a prompt tile (queries of one row attended together).
TILE = 64
#: Most positions a row may have (the softmax denominator's fixed-point grid is set for it).
MAX_POSITIONS = 2**20


def key_levels(head_dim: int) -> int:
    """Largest integer of a stored key: a query limb (at most 128) times a key, summed over
    ``head_dim`` coordinates, stays at most 2**24, so scores are exact in float32."""
    return max(1, min(TWO_LIMB_LEVELS, 2**24 // (128 * head_dim)))


def value_levels(block: int) -> int:
    """Largest integer of a stored value for value sums over ``block`` positions: a weight
    (at most :data:`WEIGHT_LEVELS`) times a value, summed over a block, stays at most 2**24."""
    return max(1, min(TWO_LIMB_LEVELS, 2**24 // (WEIGHT_LEVELS * block)))


class SlotCache:
    """Integer keys and values of every row, one slot of ``capacity`` positions per row.

    Per layer: ``keys``/``values`` ``[slots, kv_heads, capacity, head_dim]`` holding
    integers in [-levels, levels] (at most 2**15 - 1: :func:`key_levels`, :func:`value_levels`),
    as int16 on every device (half the memory of float32: at G = 1,024 groups on a GPU the
    store is most of the memory). The kernels read them as integers; the torch definition
    converts what it reads to float32 (on a decode call the whole layer's store, a transient
    copy where no fused attention kernel is admitted): the same integers.
    ``key_scale``/``value_scale`` ``[slots, kv_heads, capacity]`` float32. The capacity is a
    multiple of ``block`` (the positions of one exact value sum) and grows when a row needs
    more; the number of slots grows when more rows are live. Slots are reused: a new row's
    positions beyond its length are never read (masked), and every stored number is finite
    (zero until written)."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, block: int,
                 device: torch.device) -> None:
        if block < 1:
            raise ValueError(f"block size must be >= 1, got {block}")
        self.num_layers, self.kv_heads, self.head_dim = num_layers, kv_heads, head_dim
        self.block, self.device = block, device
        self.dtype = torch.int16
        self.slots = 0
        self.capacity = 0
        self.keys: list[torch.Tensor] = []
        self.key_scale: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.value_scale: list[torch.Tensor] = []
        self._free: list[int] = []
        #: The store's decode graphs (:class:`dplang.models.decode_graphs.DecodeGraphs`), made
        #: by the model on first use.
        self.decode_graphs: Any = None

    # -- allocation --------------------------------------------------------------------

    def allocate(self) -> int:
        """A free slot (the slot count grows by half when none is free)."""
        if not self._free:
            self._resize(self._slots_for(1), self.capacity)
        return self._free.pop()

    def release(self, slot: int) -> None:
        """Return ``slot`` to the free list (its contents are never read again)."""
        self._free.append(slot)

    @property
    def live_slots(self) -> int:
        return self.slots - len(self._free)

    def prepare(self, free_slots: int, positions: int) -> None:
        """Grow once ahead of ``free_slots`` new rows of up to ``positions`` positions (the
        rules of :meth:`allocate` and :meth:`reserve`): a batch of prompts then copies the
        store once, not at every slot and block it would otherwise add one by one."""
        slots = self._slots_for(free_slots)
        capacity = self._capacity_for(positions)
        if slots != self.slots or capacity != self.capacity:
            self._resize(slots, capacity)

    def reserve(self, positions: int) -> None:
        """Make every slot hold at least ``positions`` positions. The capacity grows by at
        least half (in whole blocks, up to :data:`MAX_POSITIONS`): a decode that lengthens
        its rows one position per step copies the store a logarithmic number of times, not
        once per block."""
        capacity = self._capacity_for(positions)
        if capacity != self.capacity:
            self._resize(self.slots, capacity)

    def _slots_for(self, free_slots: int) -> int:
        """The slot count once ``free_slots`` slots are free: the current one if they are,
        else grown by at least half (at least 4)."""
        if len(self._free) >= free_slots:
            return self.slots
        return max(4, self.live_slots + free_slots, self.slots + (self.slots + 1) // 2)

    def _capacity_for(self, positions: int) -> int:
        """The capacity once every slot holds ``positions``: the current one if it does, else
        grown by at least half, in whole blocks, up to :data:`MAX_POSITIONS`."""
        if positions > MAX_POSITIONS:
            raise ValueError(f"a row of {positions} positions exceeds {MAX_POSITIONS}")
        if positions <= self.capacity:
            return self.capacity
        wanted = max(positions, min(self.capacity + self.capacity // 2, MAX_POSITIONS))
        return -(-wanted // self.block) * self.block

    def _resize(self, slots: int, capacity: int) -> None:
        # Ordinary tensors even when called inside inference mode (a decode graph's call):
        # the store is written in place outside it too (copy_positions, poison).
        with torch.inference_mode(False):
            self._resize_to(slots, capacity)

    def _resize_to(self, slots: int, capacity: int) -> None:
        if slots == self.slots and capacity == self.capacity:
            return
        if self.slots == 0 and slots > 0 and capacity == 0:
            capacity = self.block
        new_free = list(range(slots - 1, self.slots - 1, -1))
        shape = (slots, self.kv_heads, capacity, self.head_dim)
        for name in ("keys", "values", "key_scale", "value_scale"):
            tensors = getattr(self, name)
            dims = shape if name in ("keys", "values") else shape[:3]
            for layer in range(self.num_layers):
                # One layer at a time, the old tensor dropped at once: a resize holds one
                # layer's tensors twice, not the whole store.
                dtype = self.dtype if name in ("keys", "values") else torch.float32
                tensor = _zeros(dims, dtype, self.device)
                if layer < len(tensors):
                    src = tensors[layer]
                    tensor[: src.shape[0], :, : src.shape[2]] = src
                    tensors[layer] = tensor
                    del src
                else:
                    tensors.append(tensor)
        self._free = new_free + self._free
        self.slots, self.capacity = slots, capacity
        trim_heap()  # the replaced tensors' heap pages go back to the system

    # -- data --------------------------------------------------------------------------

    def write(self, layer: int, slots: torch.Tensor, positions: torch.Tensor,
              keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store float32 ``keys``/``values`` ``[T, kv_heads, head_dim]`` of tokens at
        (``slots[i]``, ``positions[i]``), as integers on a scale per token and head."""
        fused = kernels.lookup("write_kv", keys)
        if fused is not None:  # the same integers and scales, stored in one pass
            fused(keys, values, slots, positions, self.keys[layer], self.values[layer],
                  self.key_scale[layer], self.value_scale[layer], key_levels(self.head_dim),
                  value_levels(self.block))
            return
        k_int, k_scale = quantize_rows(keys, key_levels(self.head_dim))
        v_int, v_scale = quantize_rows(values, value_levels(self.block))
        self.keys[layer].permute(0, 2, 1, 3)[slots, positions] = k_int.to(self.dtype)
        self.values[layer].permute(0, 2, 1, 3)[slots, positions] = v_int.to(self.dtype)
        self.key_scale[layer].permute(0, 2, 1)[slots, positions] = _finite(k_scale[..., 0])
        self.value_scale[layer].permute(0, 2, 1)[slots, positions] = _finite(v_scale[..., 0])

    def poison(self, slot: int, value: float = 1e30) -> None:
        """Overwrite every position of ``slot`` with ``value`` (finite: what a freed slot may
        hold for its next owner; the load-time check uses it to show it is never read)."""
        for tensors in (self.keys, self.values, self.key_scale, self.value_scale):
            for tensor in tensors:
                if tensor.is_floating_point():
                    fill = value
                else:  # the int16 store: the largest magnitude it holds, with value's sign
                    info = torch.iinfo(tensor.dtype)
                    fill = max(info.min + 1, min(info.max, value))
                tensor[slot] = fill

    def copy_positions(self, source: int, target: int, count: int) -> None:
        """Copy positions ``0..count-1`` of slot ``source`` into slot ``target`` (every layer;
        exact copies: a row starting with a shared prefix)."""
        for tensors in (self.keys, self.values, self.key_scale, self.value_scale):
            for tensor in tensors:
                tensor[target, :, :count] = tensor[source, :, :count]


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor of zeros; on the CPU from ``numpy.zeros`` (``calloc``: a large block comes
    from the system already zero, so its pages are touched only when written, and a store
    sized for the longest row costs no time for the positions shorter rows never reach)."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    numpy_dtype = {torch.int16: np.int16, torch.float32: np.float32}[dtype]
    return torch.from_numpy(np.zeros(shape, dtype=numpy_dtype))


def _finite(scale: torch.Tensor) -> torch.Tensor:
    """Scales are finite by construction (quantize_rows); a float32 overflow cannot occur, but
    the guarantee that masked positions contribute exact zeros rests on it."""
    return torch.nan_to_num(scale, nan=1.0, posinf=1.0, neginf=1.0)


@dataclass(frozen=True)
class PromptTile:
    """Up to :data:`TILE` consecutive new tokens of one row: tokens ``first..first+count-1``
    of the step (positions ``start..start+count-1`` of slot ``slot``)."""

    slot: int
    first: int
    count: int
    start: int


@dataclass
class AttentionStep:
    """Public description of one forward call's attention, built from the rows' lengths only.

    ``decode_tokens[i]`` is the step index of the one-token row in slot ``decode_slots[i]``;
    ``lengths[s]`` is slot ``s``'s length after this step's tokens (0 for a free slot);
    ``tiles`` are the prompt tiles; ``extent``, when set, is more than every position (the
    position tables are then gathered without reading the positions on the host)."""

    slots: torch.Tensor  # [T] slot of every token of the step
    positions: torch.Tensor  # [T] position of every token in its slot
    decode_tokens: torch.Tensor  # [R] step indices of one-token rows
    decode_slots: torch.Tensor  # [R] their slots
    lengths: torch.Tensor  # [slots] slot lengths after the step (int64, CPU)
    tiles: list[PromptTile]
    extent: int | None = None  # more than the largest position (host int), when known
    _masks: dict[tuple[str, int | None], torch.Tensor] | None = None

    def decode_visible(self, capacity: int, window: int | None, device: torch.device
                       ) -> torch.Tensor:
        """``[slots, capacity]``: positions a one-token row's new token sees (its slot's
        positions below its length, within ``window`` of the new token)."""
        key = ("decode", window)
        cache = self._masks if self._masks is not None else {}
        self._masks = cache
        if key not in cache:
            pos = torch.arange(capacity).unsqueeze(0)
            length = self.lengths.unsqueeze(1)
            visible = pos < length
            if window is not None:
                visible &= pos >= length - window
            cache[key] = visible.to(device)
        return cache[key]

    def tile_visible(self, width: int, window: int | None, device: torch.device
                     ) -> torch.Tensor:
        """``[tiles, TILE, width]``: for query ``i`` of each tile, the positions of its row it
        sees (causal, within ``window``); padding queries see nothing."""
        key = ("tiles", window)
        cache = self._masks if self._masks is not None else {}
        self._masks = cache
        if key not in cache:
            starts = torch.tensor([t.start for t in self.tiles]).view(-1, 1, 1)
            counts = torch.tensor([t.count for t in self.tiles]).view(-1, 1, 1)
            query = torch.arange(TILE).view(1, -1, 1)
            qpos = starts + query
            kpos = torch.arange(width).view(1, 1, -1)
            visible = (kpos <= qpos) & (query < counts)
            if window is not None:
                visible &= kpos > qpos - window
            cache[key] = visible.to(device)
        return cache[key]


def attend(
    q: torch.Tensor,
    q_scale: torch.Tensor,
    keys: torch.Tensor,
    key_scale: torch.Tensor,
    values: torch.Tensor,
    value_scale: torch.Tensor,
    visible: torch.Tensor,
    scaling: float,
    softcap: float | None,
    block: int,
) -> torch.Tensor:
    """Attention of integer queries over integer keys and values, exact sums only.

    ``q`` ``[B, kvh, Q, g, d]`` (integers of at most :data:`TWO_LIMB_LEVELS`), ``q_scale``
    ``[B, kvh, Q, g]``; ``keys``/``values`` ``[B, kvh, L, d]`` with ``L`` a multiple of
    ``block``, scales ``[B, kvh, L]``; ``visible`` broadcastable to ``[B, 1, Q, 1, L]``.
    Returns float32 ``[B, kvh, Q, g, d]``. Each (b, kv head, query, head) result is a function
    of its own query, its own visible positions' keys and values, bit for bit."""
    batch, kvh, nq, g, d = q.shape
    length = keys.shape[2]
    keys, values = keys.float(), values.float()  # int16 stores: the same integers
    rows = nq * g
    hi, lo = split_limbs(q.reshape(batch * kvh, rows, d))
    both = torch.bmm(torch.cat([hi, lo], dim=1),
                     keys.reshape(batch * kvh, length, d).transpose(1, 2))  # exact integers
    levels = WEIGHT_LEVELS
    blocks = length // block
    softmax_counts = kernels.lookup("softmax_counts", both)
    if softmax_counts is not None:
        attention_output = kernels.lookup("attention_output", both)
        assert attention_output is not None
        vis = visible.expand(batch, kvh, nq, g, length).reshape(batch * kvh, rows, length)
        counts, largest, denominator = softmax_counts(
            both, q_scale.reshape(batch * kvh, rows), key_scale.reshape(batch * kvh, length),
            value_scale.reshape(batch * kvh, length), vis, scaling, softcap, levels,
            MAX_POSITIONS)
        counts = counts.view(batch, kvh, rows, blocks, block).permute(0, 1, 3, 2, 4)
        sums = torch.bmm(counts.reshape(batch * kvh * blocks, rows, block),
                         values.reshape(batch * kvh * blocks, block, d))  # exact per block
        total = sums.double().view(batch, kvh, blocks, rows, d).sum(dim=2)  # exact integers
        out = attention_output(total.view(batch * kvh * rows, d), largest.view(-1),
                               denominator.view(-1), levels)
        return out.view(batch, kvh, nq, g, d)
    scores = both[:, :rows] * float(LIMB_SCALE) + both[:, rows:]
    scores = scores.view(batch, kvh, nq, g, length)
    scores = scores * q_scale.unsqueeze(-1)
    scores = scores * key_scale.view(batch, kvh, 1, 1, length)
    scores = scores * scaling
    if softcap is not None:
        scores = scores * (1.0 / softcap)
        scores = (2.0 / (exp(-2.0 * scores) + 1.0) - 1.0) * softcap
    scores = torch.where(visible, scores, float("-inf"))
    top = scores.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    weights = torch.where(visible, exp(scores - top), 0.0)
    denominator = fixed_point_sum(weights.double(), MAX_POSITIONS)
    mass = weights * value_scale.view(batch, kvh, 1, 1, length)
    largest = mass.amax(dim=-1, keepdim=True)
    largest = torch.where(largest > 0, largest, torch.ones_like(largest))
    counts = torch.round(mass * (levels / largest))
    counts = counts.view(batch, kvh, rows, blocks, block).permute(0, 1, 3, 2, 4)
    sums = torch.bmm(counts.reshape(batch * kvh * blocks, rows, block),
                     values.reshape(batch * kvh * blocks, block, d))  # exact per block
    total = sums.double().view(batch, kvh, blocks, rows, d).sum(dim=2)  # exact integers
    total = total.view(batch, kvh, nq, g, d)
    out = total * (largest.double() / levels) / denominator
    return out.float()


def gather_queries(q_int: torch.Tensor, q_scale: torch.Tensor, tokens: torch.Tensor,
                   kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``q_int [T, H, d]``/``q_scale [T, H]`` rows ``tokens`` (``[...]`` of step indices, ``T``
    for padding: a zero query) as ``[..., kvh, g, d]`` and ``[..., kvh, g]``."""
    heads, d = q_int.shape[1], q_int.shape[2]
    g = heads // kv_heads
    padded = torch.cat([q_int, q_int.new_zeros((1, heads, d))])
    padded_scale = torch.cat([q_scale, q_scale.new_ones((1, heads))])
    shape = tokens.shape
    flat = tokens.reshape(-1)
    out = padded.index_select(0, flat).view(*shape, kv_heads, g, d)
    scale = padded_scale.index_select(0, flat).view(*shape, kv_heads, g)
    return out, scale


def prompt_tiles(tiles: Sequence[PromptTile], device: torch.device) -> torch.Tensor:
    """``[tiles, TILE]`` step indices of each tile's queries (``-1`` for padding)."""
    index = torch.full((len(tiles), TILE), -1, dtype=torch.int64)
    for i, tile in enumerate(tiles):
        index[i, : tile.count] = torch.arange(tile.first, tile.first + tile.count)
    return index.to(device)

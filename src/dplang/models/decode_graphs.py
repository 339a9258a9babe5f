"""CUDA graphs of the body's decode calls: one launch per step instead of hundreds (issue 38).

A decode call runs one new token per row through every layer: on a GPU about thirty kernels per
layer, each launched from Python. With many rows the GPU waits for the launches, not the other
way round. :class:`DecodeGraphs` records the forward pass of a decode call once per *padded*
token count (:func:`padded_count`: 8, 12, 16, 24, 32, 48, ...) as a CUDA graph and replays it:
per step, one host-to-device copy of the step's token ids, slots and positions, one
device-to-device copy into the graph's input, one graph launch.

Privacy contract (docs/privacy.md, "Decode graphs"):

- *The same bits.* A replay runs the kernels the eager call would run, on the same inputs. The
  first replay of every graph is compared, bit for bit, with the eager call it was recorded from
  (:class:`GraphMismatch` otherwise; the model then stays eager).
- *Padding reads and writes nothing of a row.* The padding tokens are token 0 at position 0 of
  a slot of their own (:attr:`DecodeGraphs.pad_slot`), which no row is ever given; every
  operation of the body acts on one token's own vector or, for attention, on the token's own
  slot only, so a real row's numbers are those of an unpadded call (the exact engine's row
  invariance: the padded count is one more row count).
- *Nothing private chooses a graph.* The padded count is a function of the number of rows in
  the step, which the engine's public schedule fixes; the graphs' storage is the key/value
  store's and the position tables', public shapes.

Graphs are used only where every operation of the step has an admitted Triton kernel
(:func:`graphs_wanted`; the torch definition of attention reads masks built on the host per
step, which a replay could not refresh) and ``DPLANG_NO_CUDA_GRAPHS`` is unset. On the CPU the
same padded, static-input path runs without recording (``record=False``: for tests).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from dplang.models import kernels
from dplang.models.attention import AttentionStep, SlotCache
from dplang.models.devices import index_tensor

if TYPE_CHECKING:
    from dplang.models.decoder import ExactDecoder

__all__ = ["DecodeGraphs", "GraphMismatch", "graphs_wanted", "padded_count"]

#: The smallest padded token count.
MIN_TOKENS = 8


class GraphMismatch(RuntimeError):
    """A replayed graph's output differed from the eager call it was recorded from."""


def padded_count(tokens: int) -> int:
    """The token count a decode call of ``tokens`` tokens runs at: at least
    :data:`MIN_TOKENS`, then a power of two or three quarters of one (8, 12, 16, 24, 32, ...):
    at most 1.5 times ``tokens``, two graphs per doubling."""
    if tokens < 0:
        raise ValueError(f"token count must be >= 0, got {tokens}")
    if tokens <= MIN_TOKENS:
        return MIN_TOKENS
    power = 1 << (tokens - 1).bit_length()
    three_quarters = power // 4 * 3
    return three_quarters if tokens <= three_quarters else power


def graphs_wanted(device: torch.device | str) -> bool:
    """Whether decode calls on ``device`` replay CUDA graphs: a CUDA device on which every
    operation with a Triton kernel has one admitted (:mod:`dplang.models.kernels`), unless
    ``DPLANG_NO_CUDA_GRAPHS=1``."""
    if os.environ.get("DPLANG_NO_CUDA_GRAPHS", "") not in ("", "0"):
        return False
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    probe = torch.empty(0, device=device)
    return all(kernels.lookup(op, probe) is not None for op in kernels.gpu_ops())


class _Recorded:
    """One padded token count: its static input ``[3, count]`` (ids, slots, positions), the
    recorded graph (``None`` on the CPU) and its output ``[count, H]``."""

    def __init__(self, inputs: torch.Tensor, graph: Any, output: torch.Tensor) -> None:
        self.inputs, self.graph, self.output = inputs, graph, output


class DecodeGraphs:
    """The decode calls of one key/value store, replayed from graphs at padded token counts.

    Built by the model for a store (``cache``) on first use; :meth:`run` replaces one
    decode-only forward call. Graphs are dropped and recorded again when the store or the
    position tables are reallocated (more slots, more positions)."""

    def __init__(self, decoder: ExactDecoder, cache: SlotCache, *, record: bool = True) -> None:
        self._decoder = decoder
        self._record = record
        #: The padding tokens' slot: allocated here, never given to a row.
        self.pad_slot = cache.allocate()
        self._graphs: dict[int, _Recorded] = {}
        self._signature: tuple[Any, ...] | None = None
        #: Graphs recorded and replays run (public counters for benchmarks and tests).
        self.recorded = 0
        self.replays = 0

    def _storage(self, cache: SlotCache) -> tuple[Any, ...]:
        """What a recorded graph's addresses depend on."""
        return (cache.slots, cache.capacity, cache.keys[0].data_ptr(),
                cache.values[-1].data_ptr(), cache.key_scale[0].data_ptr(),
                cache.value_scale[-1].data_ptr(),
                self._decoder.positions.device_pointers(cache.device))

    def run(self, cache: SlotCache, ids: Sequence[int], slots: Sequence[int],
            positions: Sequence[int]) -> torch.Tensor:
        """Final-norm hidden states ``[len(ids), H]`` of one new token per row (``ids[i]`` at
        ``positions[i]`` of slot ``slots[i]``), their keys and values written to ``cache``
        first: the bits of ``decoder.forward`` on the unpadded call. The result is a view of
        the graph's output, valid until the next call."""
        tokens = len(ids)
        if not tokens == len(slots) == len(positions):
            raise ValueError("ids, slots and positions must have the same length")
        if self.pad_slot in slots:
            raise ValueError(f"slot {self.pad_slot} is the padding slot; no row may use it")
        count = padded_count(tokens)
        pad = count - tokens
        cache.reserve(max([*positions, 0]) + 1)
        filler = [0] * pad
        values = [*ids, *filler, *slots, *[self.pad_slot] * pad, *positions, *filler]
        inputs = index_tensor(values, cache.device).view(3, count)
        for key in self._rope_keys():  # tables for every position the store holds
            self._decoder.positions.table(key, cache.capacity, cache.device)
        signature = self._storage(cache)
        if signature != self._signature:
            self._graphs.clear()  # their addresses are stale
            self._signature = signature
        recorded = self._graphs.get(count)
        if recorded is None:
            recorded = self._graphs[count] = self._build(cache, inputs)
        else:
            recorded.inputs.copy_(inputs)
            self._replay(cache, recorded)
        return recorded.output[:tokens]

    def _rope_keys(self) -> list[str]:
        return sorted({layer.rope for layer in self._decoder.layers})

    def _forward(self, cache: SlotCache, inputs: torch.Tensor) -> torch.Tensor:
        ids, slots, positions = inputs[0], inputs[1], inputs[2]
        count = ids.shape[0]
        if self._record:
            lengths = torch.zeros(0, dtype=torch.int64)  # the attention kernel reads none
        else:  # the torch definition of attention reads the slots' lengths
            lengths = torch.zeros(cache.slots, dtype=torch.int64)
            lengths[slots.cpu()] = positions.cpu() + 1
        step = AttentionStep(slots=slots, positions=positions,
                             decode_tokens=torch.arange(count, device=ids.device),
                             decode_slots=slots, lengths=lengths, tiles=[],
                             extent=cache.capacity)
        return self._decoder.forward(ids, step, cache)

    def _replay(self, cache: SlotCache, recorded: _Recorded) -> None:
        self.replays += 1
        if recorded.graph is None:
            recorded.output.copy_(self._forward(cache, recorded.inputs))
        else:
            recorded.graph.replay()

    def _build(self, cache: SlotCache, inputs: torch.Tensor) -> _Recorded:
        """Run the call eagerly (it compiles any kernel not compiled yet), record it, replay
        it and compare the replay's bits with the eager call's (without recording: the static
        path run again)."""
        static = inputs.clone()
        if self._record:
            device = cache.device
            stream = torch.cuda.Stream(device=device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                eager = self._forward(cache, static).clone()
            torch.cuda.current_stream(device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()  # its own memory pool: graphs replay in any order
            with torch.cuda.graph(graph):
                output = self._forward(cache, static)
        else:
            eager = self._forward(cache, static).clone()
            graph, output = None, torch.empty_like(eager)
        recorded = _Recorded(static, graph, output)
        self.recorded += 1
        self._replay(cache, recorded)  # writes the same keys and values again: idempotent
        if not torch.equal(recorded.output.view(torch.int32), eager.view(torch.int32)):
            raise GraphMismatch(
                f"the decode graph at {static.shape[1]} tokens replayed other bits than the "
                "eager call it was recorded from")
        return recorded

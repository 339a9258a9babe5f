"""CUDA graphs of the body's decode calls: one launch per step instead of hundreds (issue 38).

A decode call runs one new token per row through every layer: on a GPU about thirty kernels per
layer, each launched from Python. With many rows the GPU waits for the launches, not the other
way round. :class:`DecodeGraphs` records the forward pass of a decode call once per *padded*
token count (:func:`padded_count`: 8, 12, 16, 24, 32, 48, ...) as a CUDA graph and replays it:
per call, one host-to-device copy of the step's token ids, slots and positions, one
device-to-device copy into the graph's input, one graph launch (and the model's copy of the
output).

Privacy contract (docs/privacy.md, "Decode graphs"):

- *The same bits.* A replay runs the kernels the eager call would run, on the same inputs. Each
  graph is checked when recorded: replayed on reversed and on given inputs with the step's
  keys and values zeroed first, its output and its writes must be the eager call's, bit for
  bit (:class:`GraphMismatch` otherwise, which stops the run; a recording that fails,
  :class:`GraphRecordingError`, leaves the model decoding eagerly).
- *Padding reads and writes nothing of a row.* The padding tokens are token 0 at position 0 of
  a slot of their own (:attr:`DecodeGraphs.pad_slot`), which no row is ever given; every
  operation of the body acts on one token's own vector or, for attention, on the token's own
  slot only, so a real row's numbers are those of an unpadded call (the exact engine's row
  invariance: the padded count is one more row count).
- *The row count chooses a graph.* The padded count is a function of the number of rows in
  the step (which groups are still running, as the released texts show); a graph changes a
  step's time, never its bits.

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

__all__ = ["DecodeGraphs", "GraphMismatch", "GraphRecordingError", "graphs_wanted",
           "padded_count"]

#: The smallest padded token count.
MIN_TOKENS = 8


class GraphMismatch(RuntimeError):
    """A recorded graph's replay differed from the eager call it was recorded from (its output,
    or the keys and values it wrote). The run stops: such a graph may have written elsewhere
    in the store (``DPLANG_NO_CUDA_GRAPHS=1`` decodes without graphs)."""


class GraphRecordingError(RuntimeError):
    """Recording a decode graph failed (the model then decodes eagerly)."""


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
        self._rope_keys = sorted({layer.rope for layer in decoder.layers})
        #: The padding tokens' slot: allocated here, never given to a row.
        self.pad_slot = cache.allocate()
        self._graphs: dict[int, _Recorded] = {}
        self._signature: tuple[Any, ...] | None = None
        self._pool: Any = None  # one memory pool for every padded count (one stream, outputs
        # copied out before the next call)
        #: Graphs recorded, and later calls served by replaying one (public counters).
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
        the graph's output, valid until the next call. Raises :class:`GraphRecordingError`
        when a graph cannot be recorded and :class:`GraphMismatch` when one replays other
        bits than its eager call."""
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
        for key in self._rope_keys:  # tables for every position the store holds
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
            self.replays += 1
        return recorded.output[:tokens]

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
        if recorded.graph is None:
            recorded.output.copy_(self._forward(cache, recorded.inputs))
        else:
            recorded.graph.replay()

    @staticmethod
    def _entries(cache: SlotCache, inputs: torch.Tensor) -> list[torch.Tensor]:
        """The store's keys, values and scales at the call's (slot, position) pairs, every
        layer."""
        slots, positions = inputs[1], inputs[2]
        return [store[slots, :, positions]
                for stores in (cache.keys, cache.values, cache.key_scale, cache.value_scale)
                for store in stores]

    @staticmethod
    def _poison(cache: SlotCache, inputs: torch.Tensor) -> None:
        """Overwrite the call's (slot, position) entries (every layer) with zeros: a graph
        that did not write them would leave them so."""
        slots, positions = inputs[1], inputs[2]
        for stores in (cache.keys, cache.values, cache.key_scale, cache.value_scale):
            for store in stores:
                store[slots, :, positions] = 0

    def _record_graph(self, cache: SlotCache, static: torch.Tensor
                      ) -> tuple[torch.Tensor, Any, torch.Tensor]:
        """``(eager output, graph, graph output)``: the call run eagerly on a side stream (it
        compiles any kernel not compiled yet), then recorded. The current stream is restored
        whatever happens."""
        device = cache.device
        current = torch.cuda.current_stream(device)
        try:
            stream = torch.cuda.Stream(device=device)
            stream.wait_stream(current)
            with torch.cuda.stream(stream):
                eager = self._forward(cache, static).clone()
            current.wait_stream(stream)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            # thread_local: another thread's CUDA work (a prefetch) does not void the capture
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                output = self._forward(cache, static)
        except Exception as error:
            raise GraphRecordingError(f"{type(error).__name__}: {error}") from error
        finally:
            torch.cuda.set_stream(current)
        return eager, graph, output

    def _build(self, cache: SlotCache, inputs: torch.Tensor) -> _Recorded:
        """Record the call, then check the graph against the eager call: its output and the
        keys and values it writes (the step's entries are zeroed first), on the inputs in
        reverse order (a value fixed at recording would show) and as given (without
        recording: the static path run the same way)."""
        static = inputs.clone()  # the graph's input buffer (``inputs`` stays the call's)
        if self._record:
            eager, graph, output = self._record_graph(cache, static)
        else:
            eager = self._forward(cache, static).clone()
            graph, output = None, torch.empty_like(eager)
        recorded = _Recorded(static, graph, output)
        self.recorded += 1
        written = [entry.clone() for entry in self._entries(cache, inputs)]
        for order in ("reversed", "given"):
            self._poison(cache, inputs)
            recorded.inputs.copy_(inputs.flip(1) if order == "reversed" else inputs)
            self._replay(cache, recorded)
            got = recorded.output.flip(0) if order == "reversed" else recorded.output
            same = torch.equal(got.view(torch.int32), eager.view(torch.int32)) and all(
                torch.equal(a, b) for a, b in zip(self._entries(cache, inputs), written,
                                                  strict=True))
            if not same:
                raise GraphMismatch(
                    f"the decode graph at {static.shape[1]} tokens replayed ({order} inputs) "
                    "other bits than the eager call it was recorded from; decoding stops "
                    "(DPLANG_NO_CUDA_GRAPHS=1 decodes without graphs)")
        return recorded

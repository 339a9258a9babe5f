"""Decode graphs (dplang.models.decode_graphs): the padded, static-input path of a GPU's CUDA
graphs gives every row the bits of the eager call, and a replay that differs is caught.

On the CPU the path runs without recording (``set_decode_graphs("static")``): the same padding
slot, padded counts, static inputs, position tables gathered on the device, and the replay's
comparison with the eager call. The recording itself runs under ``-m gpu``."""

from __future__ import annotations

import collections
import contextlib
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from dplang.models import TransformersModel, kernels
from dplang.models.decode_graphs import (
    DecodeGraphs,
    GraphMismatch,
    GraphRecordingError,
    padded_count,
)
from dplang.models.invariance import bitwise_equal
from dplang.models.transformers import RowDecodeState


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def loaded(request: pytest.FixtureRequest, tiny_llama_dir: Path, tiny_gemma_dir: Path):
    folder = tiny_llama_dir if request.param == "llama" else tiny_gemma_dir
    return TransformersModel(folder, threads=2, block_size=4)


@pytest.fixture
def model(loaded: TransformersModel):
    """The module's model, back to its default decode mode after the test."""
    yield loaded
    loaded.set_decode_graphs("auto")
    loaded.graphs_refused = None


def _decode(m: TransformersModel, prompts: list[list[int]], tokens: list[list[int]],
            drops: dict[int, list[int]] | None = None,
            added: dict[int, list[list[int]]] | None = None
            ) -> tuple[dict[int, list[torch.Tensor]], RowDecodeState]:
    """Hidden states of every row at every step (rows numbered as they are added); after step
    ``s``, ``drops[s]`` lists the rows kept and ``added[s]`` the prompts of new rows."""
    state = RowDecodeState(prompts=[list(p) for p in prompts])
    live = list(range(len(prompts)))
    seen: dict[int, list[torch.Tensor]] = {r: [] for r in live}
    ran: set[int] = set()
    for s in range(len(tokens) + 1):
        started = [r for r in live if r in ran]
        step = None if not started else torch.tensor([tokens[s - 1][r % len(tokens[0])]
                                                      for r in started])
        hidden = m.next_hidden(state, step)
        ran.update(live)
        for j, r in enumerate(live):
            seen[r].append(hidden[j].clone())
        if drops and s in drops:
            keep = [live.index(r) for r in drops[s]]
            m.drop_rows(state, torch.tensor(keep, dtype=torch.int64))
            live = list(drops[s])
        if added and s in added:
            for prompt in added[s]:
                state.prompts.append(list(prompt))
                state.caches.append(None)
                state.prefix_of.append(None)
                live.append(len(seen))
                seen[len(seen)] = []
    return seen, state


def _same(got: dict[int, list[torch.Tensor]], want: dict[int, list[torch.Tensor]]) -> None:
    assert got.keys() == want.keys()
    for r in want:
        assert len(got[r]) == len(want[r])
        for a, b in zip(got[r], want[r], strict=True):
            assert bitwise_equal(a, b), (r, float((a - b).abs().max()))


@given(st.integers(0, 5000))
def test_padded_counts_waste_at_most_half_and_are_few(tokens: int) -> None:
    count = padded_count(tokens)
    assert count >= max(tokens, 8) and count <= max(8, 3 * tokens // 2 + 1)
    assert padded_count(count) == count  # a padded count is its own bucket
    assert count & (count - 1) == 0 or (count // 3) & (count // 3 - 1) == 0
    with pytest.raises(ValueError):
        padded_count(-1)


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_static_graph_path_gives_every_row_the_eager_bits(model: TransformersModel,
                                                          data: st.DataObject) -> None:
    """Random rows, tokens, drops and rows joining mid-run: the padded static path (padding
    rows in a slot of their own, counts 8, 12, 16...) gives the eager call's bits."""
    vocab = model.vocab_size
    rows = data.draw(st.integers(1, 13), label="rows")
    prompts = [data.draw(st.lists(st.integers(3, vocab - 1), min_size=1, max_size=9))
               for _ in range(rows)]
    steps = data.draw(st.integers(1, 5), label="steps")
    tokens = [[data.draw(st.integers(0, vocab - 1)) for _ in range(rows)] for _ in range(steps)]
    drops, added = None, None
    if rows > 1 and steps > 1:
        drops = {1: sorted(data.draw(st.sets(st.integers(0, rows - 1), min_size=1,
                                             max_size=rows - 1)))}
        added = {1: [data.draw(st.lists(st.integers(3, vocab - 1), min_size=1, max_size=5))]}
    model.set_decode_graphs("off")
    want, _ = _decode(model, prompts, tokens, drops, added)
    model.set_decode_graphs("static")
    got, state = _decode(model, prompts, tokens, drops, added)
    _same(got, want)
    graphs = state.cache.decode_graphs
    assert isinstance(graphs, DecodeGraphs) and model.graphs_refused is None
    assert graphs.recorded >= 1 and graphs.recorded + graphs.replays >= (
        steps if added is None else 1)
    assert all(c.slot != graphs.pad_slot for c in state.caches if c is not None)


def test_a_row_never_gets_the_padding_slot(model: TransformersModel) -> None:
    model.set_decode_graphs("static")
    _, state = _decode(model, [[5, 6], [7]], [[8, 9]] * 3)
    graphs = state.cache.decode_graphs
    with pytest.raises(ValueError, match="padding slot"):
        graphs.run(state.cache, [5], [graphs.pad_slot], [3])
    with pytest.raises(ValueError, match="same length"):
        graphs.run(state.cache, [5, 6], [0], [3])


def test_the_padding_slot_is_reserved_with_the_rows(model: TransformersModel) -> None:
    """The store is sized for the rows and the graphs' padding slot at once: the first
    decode call does not grow it (by half: at G = 1024 on a GPU tens of GiB and a copy)."""
    model.set_decode_graphs("static")
    state = RowDecodeState(prompts=[[5, 6, 7]] * 8)
    model.next_hidden(state, None)
    slots = state.cache.slots
    assert slots == 9
    model.next_hidden(state, torch.arange(3, 11))
    assert state.cache.decode_graphs is not None and state.cache.slots == slots
    model.set_decode_graphs("off")  # without graphs, no slot is reserved for them
    state = RowDecodeState(prompts=[[5, 6, 7]] * 8)
    model.next_hidden(state, None)
    assert state.cache.slots == 8


def test_graphs_are_rebuilt_when_the_store_grows(model: TransformersModel) -> None:
    """More positions than the store held reallocate it: the graphs are recorded again (a
    graph keeps the addresses it was recorded with)."""
    model.set_decode_graphs("off")
    prompt = [[4, 5, 6]]
    tokens = [[7 + s % 50] for s in range(12)]  # block size 4: the store grows every 4 steps
    want, _ = _decode(model, prompt, tokens)
    model.set_decode_graphs("static")
    got, state = _decode(model, prompt, tokens)
    _same(got, want)
    assert state.cache.decode_graphs.recorded >= 3
    # a store large enough from the start: one graph, replayed at every later step
    state = RowDecodeState(prompts=prompt)
    model.next_hidden(state, None)
    state.cache.reserve(64)
    for step in tokens:
        model.next_hidden(state, torch.tensor(step))
    graphs = state.cache.decode_graphs
    assert (graphs.recorded, graphs.replays) == (1, len(tokens) - 1)


def test_a_replay_with_other_bits_stops_the_run(model: TransformersModel,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A mutation of the replay (one bit of one row's output) is caught by the comparison
    with the eager call, and the run stops: such a graph may have written anywhere."""
    original = DecodeGraphs._replay

    def flipped(self, cache, recorded):
        original(self, cache, recorded)
        recorded.output.view(torch.int32)[0, 0] ^= 1

    monkeypatch.setattr(DecodeGraphs, "_replay", flipped)
    model.set_decode_graphs("static")
    with pytest.raises(GraphMismatch, match="DPLANG_NO_CUDA_GRAPHS"):
        _decode(model, [[5, 6, 7], [8]], [[9, 10]] * 3)


def test_a_graph_that_does_not_write_the_store_is_caught(model: TransformersModel,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """A replay with the right hidden states that leaves the step's keys and values unwritten
    (the eager warm-up wrote them: only the check's zeroing shows it) stops the run."""
    original = DecodeGraphs._replay

    def unwritten(self, cache, recorded):
        original(self, cache, recorded)
        self._poison(cache, recorded.inputs)  # as if the graph had not written them

    monkeypatch.setattr(DecodeGraphs, "_replay", unwritten)
    model.set_decode_graphs("static")
    with pytest.raises(GraphMismatch):
        _decode(model, [[5, 6, 7], [8]], [[9, 10]] * 3)


def test_a_failed_recording_falls_back_to_eager_decoding(model: TransformersModel,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    model.set_decode_graphs("off")
    want, _ = _decode(model, [[5, 6, 7], [8]], [[9, 10]] * 3)

    def refuse(self, cache, inputs):
        raise GraphRecordingError("RuntimeError: operation not permitted when capturing")

    monkeypatch.setattr(DecodeGraphs, "_build", refuse)
    model.set_decode_graphs("static")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, _ = _decode(model, [[5, 6, 7], [8]], [[9, 10]] * 3)
    _same(got, want)
    assert model.graphs_refused is not None and "not permitted" in model.graphs_refused
    assert any("decode graphs turned off" in str(w.message) for w in caught)
    model.set_decode_graphs("static")  # asked again: tried again
    assert model.graphs_refused is None


def test_the_engine_with_prefixes_and_groups_joining(loaded: TransformersModel) -> None:
    """The engine's ordinary path: groups with a shared public prefix, at most two at once, a
    new group admitted into the slots of one that finished (the store grows inside decode
    calls): the same texts with and without the graphs' path."""
    from dplang.privacy import RandomStreams
    from dplang.textgen.engine import DecodingParams, GroupJob
    from dplang.textgen.methods.invisibleink import run_invisibleink

    public = "Write: "
    jobs = [GroupJob(i, public, tuple(public + w for w in (
        ["a cat sat", "the dog ran"] if i % 2 else ["bird", "fish swam far"])), prefix=public)
        for i in range(5)]
    params = DecodingParams(clip=1.0, batch_size=2, temperature=1.0, top_k=8,
                            max_tokens=9, stop_at_eos=False)
    texts = {}
    try:
        for mode in ("off", "static"):
            loaded.set_decode_graphs(mode)
            results = run_invisibleink(loaded, jobs, params, RandomStreams(1),
                                       concurrent_groups=2)
            texts[mode] = {r.index: r.token_ids for r in results}
    finally:
        loaded.set_decode_graphs("auto")
    assert texts["static"] == texts["off"] and loaded.graphs_refused is None


class _ScalarReads(TorchDispatchMode):
    """Counts the operations that read a tensor's value on the host (a GPU waits for them,
    and a CUDA graph cannot record them) or give a shape that depends on values."""

    HOST_READS = ("_local_scalar_dense", "item", "nonzero", "masked_select", "unique")

    def __init__(self) -> None:
        super().__init__()
        self.seen: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if any(word in name for word in self.HOST_READS):
            self.seen[name] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("definitions", [False, True])
def test_a_decode_call_reads_nothing_on_the_host(model: TransformersModel,
                                                 definitions: bool) -> None:
    """What a CUDA graph needs of the forward pass: no value read on the host (the position
    tables are gathered on the device, up to the store's capacity), checked with the CPU
    kernels and with the torch definitions (what runs on a GPU is one or the other)."""
    model.set_decode_graphs("static")
    state = RowDecodeState(prompts=[[5, 6, 7], [8, 9]])
    model.next_hidden(state, None)
    # recording's step (no host lengths) with the kernels; the torch definition of attention
    # needs the host lengths, built before the forward pass
    graphs = DecodeGraphs(model._decoder, state.cache, record=not definitions)
    slots = [c.slot for c in state.caches]
    inputs = torch.tensor([[10, 11], slots, [3, 2]])
    counter = _ScalarReads()
    with torch.inference_mode(), (kernels.definitions_only() if definitions
                                   else contextlib.nullcontext()), counter:
        graphs._forward(state.cache, inputs)
    assert not counter.seen, dict(counter.seen)


@pytest.mark.gpu
def test_on_a_gpu_recorded_graphs_give_the_eager_bits(tiny_gemma_dir: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    gpu = TransformersModel(tiny_gemma_dir, device="cuda", block_size=4)
    prompts = [[4 + r, 5, 6 + r] for r in range(11)]
    tokens = [[(7 + s * 3 + r) % 200 + 3 for r in range(11)] for s in range(9)]
    gpu.set_decode_graphs("off")
    want, _ = _decode(gpu, prompts, tokens, drops={3: [0, 2, 5, 7]})
    gpu.set_decode_graphs("auto")
    got, state = _decode(gpu, prompts, tokens, drops={3: [0, 2, 5, 7]})
    _same(got, want)
    assert gpu.graphs_refused is None, gpu.graphs_refused
    graphs = state.cache.decode_graphs
    assert graphs is not None and graphs.recorded + graphs.replays == 9

"""TransformersModel on tiny locally written models: cached batched decoding is exact."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dplang.models import LogitsModel, TransformersModel
from dplang.models.transformers import (
    _LINEAR_BLOCKS,
    _MIN_PACKED_ROWS,
    _PACKED_LINEARS,
    HFDecodeState,
    _body_linear_forward,
    _head_matmul,
    _packed_linear,
    pack_linear_weight,
)

PROMPTS = [
    "The food was great and the service was friendly, but the pasta was cold.",
    "Paris",
    "Our waiter was slow; the pizza took an hour!",
    "Five stars.",
]
STEPS = 6
ATOL = 1e-4


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def model(request: pytest.FixtureRequest, tiny_llama_dir: Path, tiny_gemma_dir: Path):
    folder = tiny_llama_dir if request.param == "llama" else tiny_gemma_dir
    return TransformersModel(folder, threads=2)  # 2 threads: blocked linears in use


def _tokens(m: TransformersModel, rows: int, steps: int, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, m.vocab_size, (steps, rows), generator=gen)


def _reference(m: TransformersModel, prompt: str, generated: list[int]) -> torch.Tensor:
    """Next-token logits of one prompt run alone, without padding or cache."""
    ids = m._prompt_ids(prompt) + generated
    with torch.no_grad():
        return m.model(input_ids=torch.tensor([ids])).logits[0, -1].float()


def test_protocol_conformance(model: TransformersModel) -> None:
    assert isinstance(model, LogitsModel)
    assert model.vocab_size == model.model.get_output_embeddings().weight.shape[0]
    assert model.eos_token_ids == frozenset({model.tokenizer.eos_token_id})


def test_encode_left_pads(model: TransformersModel) -> None:
    state = model.encode_prompts(PROMPTS)
    assert isinstance(state, HFDecodeState)
    lengths = [len(model._prompt_ids(p)) for p in PROMPTS]
    assert state.input_ids.shape == (len(PROMPTS), max(lengths))
    for row, length in enumerate(lengths):
        mask = state.attention_mask[row]
        assert mask.sum() == length and mask[-length:].all()  # left padding
        assert state.input_ids[row, -length] == model.tokenizer.bos_token_id
    assert state.cache is None and not state.started


def test_batched_cached_matches_single_uncached(model: TransformersModel) -> None:
    state = model.encode_prompts(PROMPTS)
    tokens = _tokens(model, len(PROMPTS), STEPS)
    generated: list[list[int]] = [[] for _ in PROMPTS]
    logits = model.next_logits(state, None)
    for step in range(STEPS + 1):
        assert logits.shape == (len(PROMPTS), model.vocab_size)
        assert logits.dtype == torch.float32
        for row, prompt in enumerate(PROMPTS):
            ref = _reference(model, prompt, generated[row])
            torch.testing.assert_close(logits[row], ref, atol=ATOL, rtol=1e-4)
        if step == STEPS:
            break
        for row in range(len(PROMPTS)):
            generated[row].append(int(tokens[step, row]))
        logits = model.next_logits(state, tokens[step])


def test_drop_rows_mid_decoding(model: TransformersModel) -> None:
    full = model.encode_prompts(PROMPTS)
    part = model.encode_prompts(PROMPTS)
    tokens = _tokens(model, len(PROMPTS), STEPS, seed=2)
    keep = torch.tensor([0, 2, 3])
    model.next_hidden(full, None)
    model.next_hidden(part, None)
    for step in range(STEPS):
        if step == 2:
            model.drop_rows(part, keep)
            assert part.rows == 3
        if step == 4:  # drop again, down to one row
            model.drop_rows(part, torch.tensor([1]))
            keep = keep[1:2]
        dense = model.next_logits(full, tokens[step])
        step_tokens = tokens[step] if step < 2 else tokens[step, keep]
        sub = model.next_logits(part, step_tokens)
        expected = dense if step < 2 else dense[keep]
        torch.testing.assert_close(sub, expected, atol=ATOL, rtol=1e-4)


def test_drop_all_rows(model: TransformersModel) -> None:
    state = model.encode_prompts(PROMPTS[:2])
    model.next_hidden(state, None)
    model.drop_rows(state, torch.tensor([], dtype=torch.int64))
    hidden = model.next_hidden(state, torch.tensor([], dtype=torch.int64))
    assert hidden.shape == (0, model.hidden_size)
    assert model.logits_from_hidden(hidden).shape == (0, model.vocab_size)


def test_candidates_equal_gathered_dense(model: TransformersModel) -> None:
    state = model.encode_prompts(PROMPTS)
    hidden = model.next_hidden(state, None)
    dense = model.logits_from_hidden(hidden)
    gen = torch.Generator().manual_seed(3)
    candidates = torch.stack(
        [torch.randperm(model.vocab_size, generator=gen)[:17] for _ in PROMPTS]
    )
    sparse = model.logits_from_hidden(hidden, candidates)
    assert sparse.shape == (len(PROMPTS), 17) and sparse.dtype == torch.float32
    torch.testing.assert_close(sparse, dense.gather(1, candidates), atol=1e-5, rtol=1e-5)
    # next_logits with candidates is the same composition.
    state2 = model.encode_prompts(PROMPTS)
    torch.testing.assert_close(
        model.next_logits(state2, None, candidates), sparse, atol=1e-6, rtol=1e-6
    )
    with pytest.raises(TypeError):
        model.logits_from_hidden(hidden, candidates.int())
    with pytest.raises(ValueError):
        model.logits_from_hidden(hidden, candidates + model.vocab_size)


def test_returned_tensors_are_editable(model: TransformersModel) -> None:
    state = model.encode_prompts(PROMPTS[:1])
    hidden = model.next_hidden(state, None)
    logits = model.logits_from_hidden(hidden)
    hidden.zero_()  # ordinary tensors, not inference tensors
    logits[:, 0] = -1.0


def test_head_matmul_equals_plain_product() -> None:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(5000, 24, generator=gen)  # 5000 is not a multiple of the blocks
    for rows in (1, 3, 8):
        hidden = torch.randn(rows, 24, generator=gen)
        torch.testing.assert_close(_head_matmul(hidden, weight), hidden @ weight.T)


@pytest.mark.parametrize("bias", [False, True])
def test_blocked_linear_equals_plain(bias: bool) -> None:
    torch.manual_seed(0)
    layer = torch.nn.Linear(24, 40, bias=bias)
    x = torch.randn(3, 1, 24)
    with torch.no_grad():
        plain = layer(x)
        token = _LINEAR_BLOCKS.set(4)
        try:
            blocked = _body_linear_forward(layer, x)
        finally:
            _LINEAR_BLOCKS.reset(token)
        assert _body_linear_forward(layer, x).equal(plain)  # inactive outside decode steps
    assert blocked.shape == plain.shape
    torch.testing.assert_close(blocked, plain)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_packed_linear_equals_plain(dtype: torch.dtype, rows: int) -> None:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(300, 40, generator=gen).to(dtype)
    bias = torch.randn(300, generator=gen).to(dtype)
    packed = pack_linear_weight(weight)
    if packed is None:
        pytest.skip(f"oneDNN weight packing is unavailable for {dtype} here")
    x = torch.randn(rows, 40, generator=gen).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    want = torch.nn.functional.linear(x, weight, bias)
    got = _packed_linear(x, packed, bias)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * 10)
    x3 = x.view(rows, 1, 40)  # 3-D input, as the body passes it
    torch.testing.assert_close(_packed_linear(x3, packed, None).float(),
                               torch.nn.functional.linear(x3, weight).float(),
                               rtol=tol, atol=tol * 10)


def test_body_linears_use_the_packed_weight_only_inside_the_body() -> None:
    """Dispatch: the packed weight serves products of >= _MIN_PACKED_ROWS tokens while the body
    runs, never outside it (a packed copy of a *different* weight makes the path visible)."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(24, 40, bias=True)
    other = torch.randn(40, 24)
    packed = pack_linear_weight(other)
    if packed is None:
        pytest.skip("oneDNN weight packing is unavailable here")
    layer._dplang_packed = packed
    many = torch.randn(_MIN_PACKED_ROWS, 1, 24)
    few = many[: _MIN_PACKED_ROWS - 1]
    with torch.no_grad():
        token = _PACKED_LINEARS.set(True)
        try:
            inside_many = _body_linear_forward(layer, many)
            inside_few = _body_linear_forward(layer, few)
        finally:
            _PACKED_LINEARS.reset(token)
        torch.testing.assert_close(inside_many, torch.nn.functional.linear(many, other, layer.bias))
        torch.testing.assert_close(inside_few, layer(few))
        assert _body_linear_forward(layer, many).equal(layer(many))  # outside the body


def test_packing_can_be_turned_off_by_environment(
    tiny_llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if pack_linear_weight(torch.ones(4, 4)) is None:
        pytest.skip("oneDNN weight packing is unavailable here")
    assert TransformersModel(tiny_llama_dir)._packed_head is not None
    monkeypatch.setenv("DPLANG_PACKED_WEIGHTS", "0")
    off = TransformersModel(tiny_llama_dir)
    assert off._packed_head is None and not off._packed_linears
    assert TransformersModel(tiny_llama_dir, packed_weights=True)._packed_head is not None


def test_packed_head_agrees_with_plain_head(model: TransformersModel) -> None:
    if model._packed_head is None:
        pytest.skip("oneDNN weight packing is unavailable here")
    hidden = torch.randn(_MIN_PACKED_ROWS + 2, model.hidden_size)
    one_by_one = torch.cat([model.logits_from_hidden(row[None]) for row in hidden])  # unpacked
    torch.testing.assert_close(model.logits_from_hidden(hidden), one_by_one, rtol=1e-4,
                               atol=1e-4)


def test_prompt_step_rules(model: TransformersModel) -> None:
    state = model.encode_prompts(PROMPTS[:2])
    with pytest.raises(ValueError):
        model.next_hidden(state, torch.tensor([5, 6]))
    model.next_hidden(state, None)
    with pytest.raises(ValueError):
        model.next_hidden(state, None)
    with pytest.raises(ValueError):
        model.next_hidden(state, torch.tensor([5]))
    with pytest.raises(TypeError):
        model.encode_prompts("one string")


def test_render_prompt_without_template(tiny_llama_dir: Path) -> None:
    m = TransformersModel(tiny_llama_dir, threads=1)
    assert not m.has_chat_template
    assert m.render_prompt("Write a review.") == "Write a review."
    assert m.render_prompt("Write a review.", system="Be brief.") == "Be brief.\n\nWrite a review."


def test_render_prompt_with_template(tiny_gemma_dir: Path) -> None:
    m = TransformersModel(tiny_gemma_dir, threads=1)
    assert m.has_chat_template
    text = m.render_prompt("Write a review.", system="Be brief.")
    assert text == (
        "<bos><|system|>\nBe brief.<eos>\n<|user|>\nWrite a review.<eos>\n<|assistant|>\n"
    )
    # The template already starts with BOS: encoding does not add a second one.
    state = m.encode_prompts([text])
    ids = state.input_ids[0].tolist()
    assert ids[0] == m.tokenizer.bos_token_id and ids[1] != m.tokenizer.bos_token_id


def test_count_truncate_decode(model: TransformersModel) -> None:
    text = "The pasta was cold, but the dessert was wonderful!"
    n = model.count_tokens(text)
    assert n == len(model.tokenizer(text, add_special_tokens=False)["input_ids"]) > 5
    assert model.truncate_tokens(text, n) == text
    assert model.truncate_tokens(text, n + 10) == text
    assert model.truncate_tokens(text, 0) == ""
    cut = model.truncate_tokens(text, 5)
    assert text.startswith(cut) and len(cut) < len(text)
    assert model.count_tokens(cut) == 5
    with pytest.raises(ValueError):
        model.truncate_tokens(text, -1)
    ids = model.tokenizer(text, add_special_tokens=False)["input_ids"]
    eos = model.tokenizer.eos_token_id
    assert model.decode([*ids, eos]) == text  # special tokens skipped


def test_identity_and_digest(tiny_llama_dir: Path) -> None:
    m = TransformersModel(tiny_llama_dir, threads=1)
    assert m.model_id == str(tiny_llama_dir)
    digest = m.weights_digest()
    assert len(digest) == 64 and digest == m.weights_digest()
    in_memory = TransformersModel(model=m.model, tokenizer=m.tokenizer, threads=1)
    assert len(in_memory.weights_digest()) == 64
    assert TransformersModel(tiny_llama_dir, weights_digest="abc").weights_digest() == "abc"


def test_missing_path_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        TransformersModel(tmp_path / "nope")


def test_stock_path_agrees(tiny_gemma_dir: Path) -> None:
    """The in-place KV cache and blocked linears give the same logits as transformers' own
    DynamicCache and F.linear."""
    fast = TransformersModel(tiny_gemma_dir, threads=2)
    stock = TransformersModel(
        tiny_gemma_dir, threads=2, buffered_cache=False, blocked_linear=False, packed_weights=False
    )
    s1, s2 = fast.encode_prompts(PROMPTS), stock.encode_prompts(PROMPTS)
    tokens = _tokens(fast, len(PROMPTS), 12, seed=5)
    a, b = fast.next_logits(s1, None), stock.next_logits(s2, None)
    for step in range(12):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        if step == 5:
            fast.drop_rows(s1, torch.tensor([1, 3]))
            stock.drop_rows(s2, torch.tensor([1, 3]))
            tokens = tokens[:, [1, 3]]
        a, b = fast.next_logits(s1, tokens[step]), stock.next_logits(s2, tokens[step])


# ------------------------------------------------------------ grouped prompt step

LONG_PROMPTS = [
    "Paris",
    "The food was great and the service was friendly, but the pasta was cold and the bread "
    "was stale; we will not come back.",
    "Five stars.",
    "Our waiter was slow; the pizza took an hour! The dessert was good though.",
    "Ok",
    "The food was great and the service was friendly, but the pasta was cold.",
]


def test_prefill_groups_partition_and_bound() -> None:
    from dplang.models.transformers import prefill_groups

    lengths = [300, 20, 150, 290, 145, 21, 160, 22]
    groups = prefill_groups(lengths, slack=1.25)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        width = max(lengths[i] for i in g)
        assert lengths[g[0]] == width
        assert width * len(g) <= 1.25 * sum(lengths[i] for i in g) or len(g) == 1
    assert len(groups) > 1  # these lengths are worth grouping
    assert prefill_groups([7, 7, 7, 7]) == [[0, 1, 2, 3]]  # equal lengths: one group
    assert prefill_groups([]) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 400), min_size=1, max_size=40), st.floats(1.0, 3.0))
def test_prefill_groups_property(lengths: list[int], slack: float) -> None:
    from dplang.models.transformers import prefill_groups

    groups = prefill_groups(lengths, slack=slack, max_positions=2048)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        width = lengths[g[0]]
        assert all(lengths[i] <= width for i in g)
        if len(g) > 1:
            assert width * len(g) <= slack * sum(lengths[i] for i in g) + 1e-9
            assert width * len(g) <= 2048


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_grouped_prefill_equals_padded(
    arch: str, tiny_llama_dir: Path, tiny_gemma_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pre-filling rows of similar length separately and merging their caches gives the
    logits of the padded prompt step, through decoding and row dropping (the tiny Gemma has
    a sliding window of 4, far shorter than the prompts)."""
    folder = tiny_llama_dir if arch == "llama" else tiny_gemma_dir
    grouped = TransformersModel(folder, threads=2)
    padded = TransformersModel(folder, threads=2, grouped_prefill=False)
    calls: list[int] = []
    real = TransformersModel._grouped_prompt_step

    def spy(self: TransformersModel, state: HFDecodeState):
        out = real(self, state)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(TransformersModel, "_grouped_prompt_step", spy)
    s1, s2 = grouped.encode_prompts(LONG_PROMPTS), padded.encode_prompts(LONG_PROMPTS)
    a, b = grouped.next_logits(s1, None), padded.next_logits(s2, None)
    assert calls == [True]  # the grouped path ran (and only for the grouped model)
    tokens = _tokens(grouped, len(LONG_PROMPTS), 8, seed=7)
    for step in range(8):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        if step == 3:
            keep = torch.tensor([0, 1, 4])
            grouped.drop_rows(s1, keep)
            padded.drop_rows(s2, keep)
            tokens = tokens[:, keep]
        a, b = grouped.next_logits(s1, tokens[step]), padded.next_logits(s2, tokens[step])
    for row, prompt in enumerate(LONG_PROMPTS):  # and both equal the uncached forward
        state = grouped.encode_prompts(LONG_PROMPTS)
        logits = grouped.next_logits(state, None)
        torch.testing.assert_close(logits[row], _reference(grouped, prompt, []), atol=ATOL,
                                   rtol=1e-4)


# ------------------------------------------------------------ ragged decode attention


def _bucket_cost(padding: list[int], width: int, overhead: int, buckets) -> int:
    return sum((end - first) * (width - padding[first]) + overhead for first, end, _ in buckets)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 60), min_size=1, max_size=7), st.integers(0, 50))
def test_plan_buckets_is_an_optimal_contiguous_split(padding: list[int], overhead: int) -> None:
    from itertools import combinations, pairwise

    from dplang.models._ragged import plan_buckets

    padding = sorted(padding)
    width = max(padding) + 5
    buckets = plan_buckets(padding, width, overhead)
    assert buckets[0][0] == 0 and buckets[-1][1] == len(padding)
    assert all(a[1] == b[0] for a, b in pairwise(buckets))  # contiguous, in order
    assert all(pad == padding[first] for first, _, pad in buckets)
    rows = len(padding)
    best = min(  # every split of the rows into consecutive runs
        _bucket_cost(padding, width, overhead,
                     [(a, b, 0) for a, b in zip((0, *cuts), (*cuts, rows), strict=True)])
        for k in range(rows)
        for cuts in combinations(range(1, rows), k)
    )
    assert _bucket_cost(padding, width, overhead, buckets) == best


def test_plan_buckets_needs_sorted_rows() -> None:
    from dplang.models._ragged import plan_buckets

    with pytest.raises(ValueError):
        plan_buckets([3, 1], 10)


@pytest.mark.parametrize("grouped", [True, False])
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_ragged_attention_equals_plain_sdpa(
    arch: str, grouped: bool, tiny_llama_dir: Path, tiny_gemma_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Attention per bucket of length-sorted rows gives the logits of plain SDPA over the whole
    padded cache, through decoding and row dropping (the tiny Gemma's sliding window of 4 is
    far shorter than the prompts, so its sliding layers keep fewer positions than the cache)."""
    from dplang.models import _ragged

    monkeypatch.setattr(_ragged, "BUCKET_OVERHEAD", 0)  # many buckets even for tiny prompts
    folder = tiny_llama_dir if arch == "llama" else tiny_gemma_dir
    ragged = TransformersModel(folder, threads=2, grouped_prefill=grouped)
    plain = TransformersModel(folder, threads=2, grouped_prefill=grouped, ragged_attention=False)
    assert ragged.config._attn_implementation == _ragged.RAGGED_SDPA
    assert plain.config._attn_implementation == "sdpa"
    rewrapped = TransformersModel(model=ragged.model, tokenizer=ragged.tokenizer, verify=False)
    assert rewrapped._ragged  # a model switched by another instance stays usable
    s1, s2 = ragged.encode_prompts(LONG_PROMPTS), plain.encode_prompts(LONG_PROMPTS)
    assert s1.order is not None and s1.order.tolist() != list(range(len(LONG_PROMPTS)))
    assert s2.order is None
    a, b = ragged.next_logits(s1, None), plain.next_logits(s2, None)
    tokens = _tokens(ragged, len(LONG_PROMPTS), 8, seed=11)
    for step in range(8):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        if step == 3:
            assert s1.buckets is not None and len(s1.buckets) >= 3  # the bucketed path ran
            keep = torch.tensor([0, 1, 4, 5])
            ragged.drop_rows(s1, keep)
            plain.drop_rows(s2, keep)
            tokens = tokens[:, keep]
        a, b = ragged.next_logits(s1, tokens[step]), plain.next_logits(s2, tokens[step])
    assert s1.buckets is not None and s1.buckets[-1][1] == 4
    for row, prompt in enumerate(LONG_PROMPTS[:2]):  # and the uncached forward
        state = ragged.encode_prompts(LONG_PROMPTS)
        generated = _tokens(ragged, len(LONG_PROMPTS), 2, seed=3)
        ragged.next_logits(state, None)
        ragged.next_logits(state, generated[0])
        logits = ragged.next_logits(state, generated[1])
        torch.testing.assert_close(
            logits[row], _reference(ragged, prompt, generated[:, row].tolist()), atol=ATOL,
            rtol=1e-4,
        )


# ------------------------------------------------------------------ dtype


def test_bfloat16_body_float32_logits(tiny_gemma_dir: Path) -> None:
    full = TransformersModel(tiny_gemma_dir, threads=2)
    half = TransformersModel(tiny_gemma_dir, threads=2, dtype="bfloat16")
    assert half.dtype == torch.bfloat16 and full.dtype == torch.float32
    assert next(half._body.parameters()).dtype == torch.bfloat16
    assert half._head_weight.dtype == torch.float32
    torch.testing.assert_close(half._head_weight, full._head_weight)  # a float32 copy
    s1, s2 = full.encode_prompts(LONG_PROMPTS), half.encode_prompts(LONG_PROMPTS)
    a, b = full.next_logits(s1, None), half.next_logits(s2, None)
    assert b.dtype == torch.float32
    spread = float(a.abs().max())
    assert float((a - b).abs().max()) < 0.1 * spread  # close, not equal
    hidden = half.next_hidden(s2, torch.topk(b, 1).indices[:, 0])
    cand = torch.topk(half.logits_from_hidden(hidden), 5).indices
    dense = half.logits_from_hidden(hidden)
    torch.testing.assert_close(half.logits_from_hidden(hidden, cand), dense.gather(1, cand))


def test_dtype_resolution(monkeypatch: pytest.MonkeyPatch, tiny_llama_dir: Path) -> None:
    from dplang.models import transformers as backend

    assert backend.resolve_dtype("float32") == torch.float32
    assert backend.resolve_dtype("bfloat16") == torch.bfloat16
    monkeypatch.setattr(backend, "native_bfloat16", lambda: True)
    assert backend.resolve_dtype("auto") == torch.bfloat16
    monkeypatch.setattr(backend, "native_bfloat16", lambda: False)
    assert backend.resolve_dtype("auto") == torch.float32
    with pytest.raises(ValueError, match="dtype must be one of"):
        backend.resolve_dtype("float16")
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        backend.resolve_dtype(torch.float16)
    with pytest.raises(ValueError, match="dtype"):
        TransformersModel(tiny_llama_dir, dtype="int8")

"""TransformersModel on tiny locally written models: exact, row-invariant decoding.

The privacy-critical property (DESIGN.md invariant 7): a row's hidden states and logits are a
deterministic function of that row's own tokens, bit for bit, whatever other rows share the
batch, how many there are and how long they are, through decoding and row dropping."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dplang.models import LogitsModel, TransformersModel, _rowwise
from dplang.models._kernels import linear_product, pack_linear_weight
from dplang.models.invariance import RowInvarianceError
from dplang.models.invariance import bitwise_equal as _bitwise_equal
from dplang.models.transformers import RowDecodeState

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
    # Blocks of 4 positions: every prompt spans several blocks (Gemma's window is 4 too).
    return TransformersModel(folder, threads=2, block_size=4)


def _tokens(m: TransformersModel, rows: int, steps: int, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, m.vocab_size, (steps, rows), generator=gen)


def _reference(m: TransformersModel, prompt: str, generated: list[int]) -> torch.Tensor:
    """Next-token logits of one prompt run alone by the model's own uncached forward."""
    ids = m._prompt_ids(prompt) + generated
    with torch.no_grad():
        return m.model(input_ids=torch.tensor([ids])).logits[0, -1].float()


def test_protocol_conformance(model: TransformersModel) -> None:
    assert isinstance(model, LogitsModel)
    assert model.vocab_size == model.model.get_output_embeddings().weight.shape[0]
    assert model.eos_token_ids == frozenset({model.tokenizer.eos_token_id})


def test_encode_keeps_each_prompt_unpadded(model: TransformersModel) -> None:
    state = model.encode_prompts(PROMPTS)
    assert isinstance(state, RowDecodeState)
    assert state.prompts == [model._prompt_ids(p) for p in PROMPTS]
    assert state.prompts[0][0] == model.tokenizer.bos_token_id
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


def _decode_rows(m: TransformersModel, prompts: list[list[int]], tokens: list[list[int]],
                 drops: dict[int, list[int]] | None = None,
                 candidates: torch.Tensor | None = None) -> list[list[torch.Tensor]]:
    """Decode token-id prompts; per row the hidden states, dense logits and candidate logits
    of every step it lived. ``drops[s]``: rows (original indices) kept after step ``s``."""
    state = RowDecodeState(prompts=[list(p) for p in prompts])
    live = list(range(len(prompts)))
    seen: list[list[torch.Tensor]] = [[] for _ in prompts]
    for s in range(len(tokens) + 1):
        step = None if s == 0 else torch.tensor([tokens[s - 1][r] for r in live])
        hidden = m.next_hidden(state, step)
        values = [hidden, m.logits_from_hidden(hidden)]
        if candidates is not None:
            values.append(m.logits_from_hidden(hidden, candidates.expand(len(live), -1)))
        for j, r in enumerate(live):
            seen[r].extend(v[j] for v in values)
        if drops and s in drops:
            keep = [live.index(r) for r in drops[s]]
            m.drop_rows(state, torch.tensor(keep, dtype=torch.int64))
            live = list(drops[s])
    return seen


def _assert_bitwise(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    for a, b in zip(got, want, strict=False):
        assert _bitwise_equal(a, b), float((a - b).abs().max())


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_row_invariance_property(model: TransformersModel, data: st.DataObject) -> None:
    """Each row of a random batch (random count, lengths, order, duplicates, drops) gives
    exactly the bits it gives decoded alone: hidden states, full and sparse logits."""
    vocab = model.vocab_size
    rows = data.draw(st.integers(1, 7), label="rows")
    prompts = [data.draw(st.lists(st.integers(3, vocab - 1), min_size=1, max_size=14),
                         label=f"prompt{r}") for r in range(rows)]
    steps = data.draw(st.integers(1, 6), label="steps")
    tokens = [[data.draw(st.integers(0, vocab - 1)) for _ in range(rows)] for _ in range(steps)]
    candidates = torch.tensor([sorted(set(data.draw(
        st.lists(st.integers(0, vocab - 1), min_size=1, max_size=9), label="candidates")))])
    drops = None
    if rows > 1 and steps > 1:
        at = data.draw(st.integers(0, steps - 1), label="drop step")
        kept = sorted(data.draw(st.sets(st.integers(0, rows - 1), min_size=1,
                                        max_size=rows - 1), label="kept"))
        drops = {at: kept}
    together = _decode_rows(model, prompts, tokens, drops, candidates)
    for r in range(rows):
        alone = _decode_rows(model, [prompts[r]], [[t[r]] for t in tokens],
                             candidates=candidates)[0]
        _assert_bitwise(together[r], alone)


def test_drop_rows_mid_decoding(model: TransformersModel) -> None:
    prompts = [model._prompt_ids(p) for p in PROMPTS]
    tokens = _tokens(model, len(PROMPTS), STEPS, seed=2).tolist()
    full = _decode_rows(model, prompts, tokens)
    part = _decode_rows(model, prompts, tokens, drops={2: [0, 2, 3], 4: [2]})
    for r in range(len(PROMPTS)):
        _assert_bitwise(part[r], full[r])
    assert len(part[2]) == len(full[2]) and len(part[1]) < len(full[1])


def test_drop_all_rows(model: TransformersModel) -> None:
    state = model.encode_prompts(PROMPTS[:2])
    model.next_hidden(state, None)
    model.drop_rows(state, torch.tensor([], dtype=torch.int64))
    hidden = model.next_hidden(state, torch.tensor([], dtype=torch.int64))
    assert hidden.shape == (0, model.hidden_size)
    assert model.logits_from_hidden(hidden).shape == (0, model.vocab_size)
    assert state.cache is not None and len(state.cache._free) == state.cache.capacity


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
    # Narrower candidate lists give the same bits on the ids they share.
    assert _bitwise_equal(model.logits_from_hidden(hidden, candidates[:, :5]), sparse[:, :5])
    state2 = model.encode_prompts(PROMPTS)
    assert _bitwise_equal(model.next_logits(state2, None, candidates), sparse)
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


def test_token_hidden_states_are_the_prompt_steps(model: TransformersModel) -> None:
    seqs = [model._prompt_ids(p) for p in PROMPTS]
    all_states = model.token_hidden_states(seqs)
    state = RowDecodeState(prompts=seqs)
    last = model.next_hidden(state, None)
    for r, seq in enumerate(seqs):
        assert all_states[r].shape == (len(seq), model.hidden_size)
        assert _bitwise_equal(all_states[r][-1], last[r])
    with pytest.raises(ValueError, match="empty"):
        model.token_hidden_states([[1, 2], []])


def test_prompt_step_rules(model: TransformersModel) -> None:
    state = model.encode_prompts(PROMPTS[:2])
    with pytest.raises(ValueError):
        model.next_hidden(state, torch.tensor([5, 6]))
    model.next_hidden(state, None)
    with pytest.raises(ValueError):
        model.next_hidden(state, None)
    with pytest.raises(ValueError):
        model.next_hidden(state, torch.tensor([5]))
    with pytest.raises(ValueError):
        model.next_hidden(state, torch.tensor([5, model.vocab_size]))
    with pytest.raises(TypeError):
        model.encode_prompts("one string")


def test_long_prompts_split_into_calls(model: TransformersModel, monkeypatch) -> None:
    """Prompt steps longer than MAX_STEP_TOKENS run in several calls, same bits."""
    from dplang.models import transformers as backend

    prompts = [model._prompt_ids(p) for p in PROMPTS]
    whole = _decode_rows(model, prompts, [[5] * len(prompts)])
    monkeypatch.setattr(backend, "MAX_STEP_TOKENS", 8)
    split = _decode_rows(model, prompts, [[5] * len(prompts)])
    for r in range(len(prompts)):
        _assert_bitwise(split[r], whole[r])


# ----------------------------------------------------------- the load-time check


def test_check_row_invariance_passes_here(model: TransformersModel) -> None:
    model.check_row_invariance()


def test_a_batch_dependent_kernel_is_refused(tiny_llama_dir: Path, monkeypatch) -> None:
    """A body whose results depend on the number of tokens in the call (as MKL's plain GEMM
    does in its last bits) is refused at load, not warned about."""
    original = _rowwise.rowwise_attention

    def leaky(module, query, *args, **kwargs):
        out, weights = original(module, query, *args, **kwargs)
        return out * (1 + 1e-6 * query.shape[2]), weights

    monkeypatch.setattr(_rowwise, "rowwise_attention", leaky)
    _rowwise.register()
    try:
        with pytest.raises(RowInvarianceError, match="differs from the same row decoded alone"):
            TransformersModel(tiny_llama_dir, threads=2, block_size=4)
    finally:
        monkeypatch.undo()
        _rowwise.register()


def test_decode_attention_merge_is_exact_across_block_sizes(tiny_gemma_dir: Path) -> None:
    """Rows of the same tokens give the same logits (to rounding) with any block size, and the
    paged merge never sees another row's blocks (sliding window 4 included)."""
    ids = [2, 7, 9, 11, 13, 17, 19, 23, 29, 31, 37]
    tokens = [[41], [43], [47], [53], [59]]
    ref = None
    for block in (1, 2, 3, 4, 16):
        m = TransformersModel(tiny_gemma_dir, threads=1, block_size=block,
                              check_invariance=False, verify=False)
        got = _decode_rows(m, [ids], tokens)[0]
        if ref is None:
            ref = got
        for a, b in zip(got, ref, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------ kernels


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_equals_plain_and_is_row_invariant(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 40, generator=gen).to(dtype)
    bias = torch.randn(96, generator=gen).to(dtype)
    packed = pack_linear_weight(weight)
    x = torch.randn(37, 40, generator=gen).to(dtype)
    got = linear_product(x, weight, bias, packed)
    want = torch.nn.functional.linear(x, weight, bias)
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    for i in (0, 17, 36):
        assert _bitwise_equal(got[i], linear_product(x[i:i + 1], weight, bias, packed)[0])


@pytest.mark.parametrize("kind", _rowwise.InvariantActivation.KINDS)
def test_invariant_activation_matches_torch_and_has_one_code_path(kind: str) -> None:
    reference = {
        "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
        "gelu": torch.nn.functional.gelu,
        "silu": torch.nn.functional.silu,
        "relu": torch.relu,
    }[kind]
    act = _rowwise.InvariantActivation(kind)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4099, generator=gen) * 4
    torch.testing.assert_close(act(x), reference(x), atol=1e-6, rtol=1e-5)
    # Every element gets the bits it gets at any other position and in any tensor size.
    for n in (1, 3, 17, 31, 250):
        assert _bitwise_equal(act(x[:n].clone()), act(x)[:n])
        assert _bitwise_equal(act(x[-n:].clone()), act(x)[-n:])
    half = x.to(torch.bfloat16)
    assert act(half).dtype == torch.bfloat16


def test_unknown_activation_is_refused() -> None:
    class Body(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.act_fn = torch.nn.Softsign()

    with pytest.raises(NotImplementedError, match="no row-invariant implementation"):
        _rowwise.replace_activations(Body())


def test_paged_cache_allocates_and_frees() -> None:
    cache = _rowwise.PagedKVCache(num_layers=2, block_size=4)
    a = cache.allocate(3)
    b = cache.allocate(20)
    assert len(set(a) | set(b)) == 23 and cache.capacity >= 23
    cache.release(a)
    assert sorted(cache.allocate(3)) == sorted(a)
    with pytest.raises(ValueError):
        _rowwise.PagedKVCache(num_layers=1, block_size=0)


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
    ids = state.prompts[0]
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


# ------------------------------------------------------------------ dtype

LONG_PROMPTS = [
    "Paris",
    "The food was great and the service was friendly, but the pasta was cold and the bread "
    "was stale; we will not come back.",
    "Five stars.",
    "Our waiter was slow; the pizza took an hour! The dessert was good though.",
]


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
    # Row invariance holds for the bfloat16 body too.
    prompts = [half._prompt_ids(p) for p in LONG_PROMPTS]
    together = _decode_rows(half, prompts, [[7, 8, 9, 10]] * 3)
    for r in range(len(prompts)):
        _assert_bitwise(together[r], _decode_rows(half, [prompts[r]], [[7 + r]] * 3)[0])


def test_dtype_resolution(monkeypatch: pytest.MonkeyPatch, tiny_llama_dir: Path) -> None:
    from dplang.models import dtypes as backend

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


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("heads", "kv_heads", "dim", "block"),
                         [(4, 2, 8, 64), (4, 1, 256, 64), (8, 2, 16, 4), (2, 2, 32, 1)])
def test_decode_attention_rows_are_independent(threads: int, heads: int, kv_heads: int,
                                               dim: int, block: int) -> None:
    """Each row of a batched decode-attention call gets the bits it gets alone, whatever the
    pair count (one pair included: a strided operand once took another kernel path there)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(heads * dim + block)
        pool_k = torch.randn(12, block, kv_heads, dim, generator=gen)
        pool_v = torch.randn(12, block, kv_heads, dim, generator=gen)
        rows = [_rowwise.RowCache(blocks=[0], length=1),
                _rowwise.RowCache(blocks=[1, 2, 3], length=min(3 * block, 2 * block + 1)),
                _rowwise.RowCache(blocks=[4, 5], length=block + 1)]
        q = torch.randn(len(rows), heads, dim, generator=gen)
        for window in (None, 2):
            full = _rowwise._decode_attention(
                q, pool_k, pool_v, _rowwise._pair_plan(rows, window, block), 0.3, None)
            for r, row in enumerate(rows):
                alone = _rowwise._decode_attention(
                    q[r:r + 1], pool_k, pool_v, _rowwise._pair_plan([row], window, block),
                    0.3, None)
                assert _bitwise_equal(alone[0], full[r])
    finally:
        torch.set_num_threads(previous)


def test_rows_added_mid_decoding_are_invariant(model: TransformersModel) -> None:
    """Rows joining a running batch (their prompts run beside the others' next tokens) get
    the bits they get alone, and so do the rows already there."""
    prompts = [model._prompt_ids(p) for p in PROMPTS]
    tokens = _tokens(model, len(PROMPTS), 4, seed=9).tolist()
    alone = {r: _decode_rows(model, [prompts[r]], [[t[r]] for t in tokens])[0]
             for r in range(len(PROMPTS))}
    state = RowDecodeState(prompts=[prompts[0], prompts[1]])
    seen: dict[int, list[torch.Tensor]] = {r: [] for r in range(len(PROMPTS))}
    rows = [0, 1]
    steps_done = {0: 0, 1: 0}
    for step in range(6):
        if step == 2:  # two rows join while rows 0 and 1 are mid-way
            state.prompts.extend([prompts[2], prompts[3]])
            state.caches.extend([None, None])
            state.prefix_of.extend([None, None])
            rows += [2, 3]
            steps_done.update({2: 0, 3: 0})
        started = [r for r in rows if steps_done[r] > 0]
        step_tokens = (torch.tensor([tokens[steps_done[r] - 1][r] for r in started])
                       if started else None)
        hidden = model.next_hidden(state, step_tokens)
        dense = model.logits_from_hidden(hidden)
        for i, r in enumerate(rows):
            if steps_done[r] <= 4:
                seen[r].extend([hidden[i], dense[i]])
            steps_done[r] += 1
        if step == 4:
            model.drop_rows(state, torch.tensor([2, 3]))
            rows = [2, 3]
    for r in range(len(PROMPTS)):
        assert len(seen[r]) >= 8, r  # at least four steps of (hidden, logits)
        _assert_bitwise(seen[r], alone[r])


# ------------------------------------------------------------------ shared prefixes

PREFIX = "Here is a review of a place we liked a lot, written by a guest: "


def _decode_texts(m: TransformersModel, texts: list[str], prefixes: list[str | None],
                  steps: int, drop_after: int | None = None,
                  ids: list[int] | None = None) -> list[list[torch.Tensor]]:
    """Per text: hidden states and logits of every step; the tokens fed to text ``i`` depend
    on ``ids[i]`` (default: its position) and the step only."""
    ids = list(range(len(texts))) if ids is None else ids
    state = RowDecodeState(prompts=[])
    m.add_prompts(state, texts, prefixes)
    live = list(range(len(texts)))
    seen: list[list[torch.Tensor]] = [[] for _ in texts]
    for s in range(steps + 1):
        step = None if s == 0 else torch.tensor(
            [(7 * s + 3 * ids[i]) % m.vocab_size for i in live])
        hidden = m.next_hidden(state, step)
        logits = m.logits_from_hidden(hidden)
        for j, i in enumerate(live):
            seen[i].extend([hidden[j], logits[j]])
        if drop_after == s:
            m.drop_rows(state, torch.arange(1, len(live)))
            live = live[1:]
    return seen


def test_shared_prefix_rows_are_invariant_and_match_the_forward(model: TransformersModel) -> None:
    """Rows sharing a public prefix get the bits they get alone (the prefix is computed once
    and its blocks shared), including a row that is the prefix itself; and their logits are the
    model's own forward on the same token ids."""
    texts = [PREFIX + "the soup was great", PREFIX + "slow service", PREFIX,
             PREFIX + "x" * 30]
    prefixes = [PREFIX] * len(texts)
    together = _decode_texts(model, texts, prefixes, 3, drop_after=1)
    for i, text in enumerate(texts):
        _assert_bitwise(together[i], _decode_texts(model, [text], [PREFIX], 3, ids=[i])[0])
    state = RowDecodeState(prompts=[])
    model.add_prompts(state, texts, prefixes)
    logits = model.logits_from_hidden(model.next_hidden(state, None))
    head = model._prompt_ids(PREFIX)
    for i, text in enumerate(texts):
        ids = head + model._ids(text[len(PREFIX):])
        with torch.no_grad():
            ref = model.model(input_ids=torch.tensor([ids])).logits[0, -1].float()
        torch.testing.assert_close(logits[i], ref, atol=ATOL, rtol=1e-4)


def test_shared_prefix_blocks_outlive_the_rows(model: TransformersModel) -> None:
    state = RowDecodeState(prompts=[])
    model.add_prompts(state, [PREFIX + "a b c", PREFIX + "d"], [PREFIX, PREFIX])
    model.next_hidden(state, None)
    prefix_cache, _ = next(iter(state.prefixes.values()))
    assert state.caches[0].shared == prefix_cache.length // model.block_size
    assert state.caches[0].blocks[:state.caches[0].shared] == prefix_cache.blocks[
        :state.caches[0].shared]
    model.drop_rows(state, torch.tensor([], dtype=torch.int64))
    free = set(state.cache._free)
    assert not free & set(prefix_cache.blocks)  # the prefix stays for rows that come later
    model.add_prompts(state, [PREFIX + "again"], [PREFIX])
    model.next_hidden(state, None)
    assert len(state.prefixes) == 1  # computed once per state


def test_add_prompts_checks_prefixes(model: TransformersModel) -> None:
    state = RowDecodeState(prompts=[])
    with pytest.raises(ValueError, match="does not start with its prefix"):
        model.add_prompts(state, ["other text"], [PREFIX])
    with pytest.raises(ValueError, match="prefixes for"):
        model.add_prompts(state, ["a", "b"], [None])

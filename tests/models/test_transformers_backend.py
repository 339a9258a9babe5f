"""TransformersModel on tiny locally written models: exact, row-invariant decoding.

The privacy-critical property (DESIGN.md invariant 7): a row's hidden states and logits are a
deterministic function of that row's own tokens, bit for bit, whatever other rows share the
batch, how many there are and how long they are, through decoding and row dropping. The
backend gets it by construction (exact integer products and sums, docs/privacy.md); these tests
check it through the production path, and that the exact decoder stays close to the model's
own float32 forward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dplang.models import LogitsModel, TransformersModel, attention, decoder, exact
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
#: The exact decoder rounds weights to 16 bits and activations to 15 bits per row: against the
#: model's own float32 forward its logits agree to a few thousandths (the tiny models' random
#: weights are far larger than a trained model's, which agrees to about 1e-5 relative).
ATOL = 0.05


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def model(request: pytest.FixtureRequest, tiny_llama_dir: Path, tiny_gemma_dir: Path):
    folder = tiny_llama_dir if request.param == "llama" else tiny_gemma_dir
    # Blocks of 4 positions: every prompt spans several blocks (Gemma's window is 4 too).
    return TransformersModel(folder, threads=2, block_size=4, keep_reference=True)


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
            torch.testing.assert_close(logits[row], ref, atol=ATOL, rtol=0)
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
    assert state.cache is not None and state.cache.live_slots == 0


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
    # The same exact integers and the same float formula: the same bits as the full head.
    assert _bitwise_equal(sparse, dense.gather(1, candidates))
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


@pytest.mark.parametrize("limit", [8, 3, 1])
def test_prompts_cut_anywhere_into_calls(model: TransformersModel, monkeypatch, limit: int
                                         ) -> None:
    """Prompt steps longer than MAX_STEP_TOKENS run in several calls, a prompt cut anywhere
    (even one token per call): the same bits."""
    from dplang.models import transformers as backend

    prompts = [model._prompt_ids(p) for p in PROMPTS]
    whole = _decode_rows(model, prompts, [[5] * len(prompts)])
    monkeypatch.setattr(backend, "MAX_STEP_TOKENS", limit)
    split = _decode_rows(model, prompts, [[5] * len(prompts)])
    for r in range(len(prompts)):
        _assert_bitwise(split[r], whole[r])


# ----------------------------------------------------------- the load-time check


def test_check_row_invariance_passes_here(model: TransformersModel) -> None:
    model.check_row_invariance()


def test_a_batch_dependent_kernel_is_refused(tiny_llama_dir: Path, monkeypatch) -> None:
    """An attention whose results depend on how many rows share the call (as a library kernel
    chosen by shape may) is refused at load, not warned about."""
    from dplang.models import cpu_kernels

    def leaky(original):
        def attend(q, *args, **kwargs):
            return original(q, *args, **kwargs) * (1 + 1e-6 * q.shape[0])
        return attend

    monkeypatch.setattr(cpu_kernels, "_NUMBA", cpu_kernels._NUMBA)  # restored afterwards
    monkeypatch.setattr(cpu_kernels, "_DISABLED", cpu_kernels._DISABLED)
    monkeypatch.setattr(decoder, "attend", leaky(attention.attend))
    monkeypatch.setattr(cpu_kernels, "attend_tokens", leaky(cpu_kernels.attend_tokens))
    with pytest.raises(RowInvarianceError, match="differs from the same row decoded alone"):
        TransformersModel(tiny_llama_dir, threads=2, block_size=4)


def test_decode_attention_is_close_across_block_sizes(tiny_gemma_dir: Path) -> None:
    """Rows of the same tokens give the same logits (to rounding) with any block size, and a
    row never sees another row's positions (sliding window 4 included)."""
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
            torch.testing.assert_close(a, b, atol=0.05, rtol=0)


# ------------------------------------------------------------------ kernels


@pytest.mark.parametrize("bits", [16, 8])
def test_integer_linear_is_close_exact_and_row_invariant(bits: int) -> None:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 40, generator=gen)
    bias = torch.randn(96, generator=gen)
    lin = exact.IntegerLinear(weight, bias, weight_bits=bits)
    x = torch.randn(37, 40, generator=gen)
    got = lin(x)
    want = torch.nn.functional.linear(x, weight, bias)
    # 16 bits: about 1e-4 of the outputs' spread; 8 bits: a weight is off by up to 1/254 of its
    # row's largest, so outputs by a few per cent of their spread.
    spread = float(want.abs().max())
    tol = (2e-4 if bits == 16 else 4e-2) * spread
    torch.testing.assert_close(got, want, rtol=0, atol=tol)
    for i in (0, 17, 36):
        assert _bitwise_equal(got[i], lin(x[i:i + 1])[0])
    # The int8 kernel and the float32 chunks compute the same integers: the same bits; so do
    # both limbs multiplied in one call (stacked) and in two.
    for kernel in ("float32", "int8") if exact.int8_kernel_is_exact("cpu", 40) else ("float32",):
        lin.kernel = kernel  # whichever the machine chose (product_kernel), the other too
        lin.packed = None
        assert _bitwise_equal(lin(x), got)
    for layout in ("kn", "nk"):
        for stacked in (True, False):
            other = exact.IntegerLinear(weight, bias, weight_bits=bits, layout=layout,
                                        stacked=stacked)
            assert _bitwise_equal(other(x), got)


def test_integer_products_are_exact_on_extreme_limbs() -> None:
    """The largest limbs (-128 and 127, the values that saturate an int16 intermediate on
    pre-VNNI CPUs) give exact sums with whichever kernel the probe chose, and with the float32
    chunks."""
    k = 2100  # longer than one float32 chunk
    left = torch.full((3, k), -128, dtype=torch.int8)
    right = torch.full((k, 5), -128, dtype=torch.int8)
    right[:, 1] = 127
    want = left.double() @ right.double()
    kernel = "int8" if exact.int8_kernel_is_exact("cpu", k) else "float32"
    for name in {kernel, "float32"}:
        assert torch.equal(exact.exact_products(left, right, name).double(), want)
    # large limbs of one sign and random low bits: partial sums pass 2**24 within 1,100 terms
    # and are not multiples of a power of two, so a float32 chunk longer than 1,024 terms
    # would round them (equal extremes, as above, stay exact in float32 at any length)
    gen = torch.Generator().manual_seed(k)
    left = torch.randint(100, 128, (3, k), generator=gen, dtype=torch.int8)
    right = torch.randint(100, 128, (k, 5), generator=gen, dtype=torch.int8)
    want = left.double() @ right.double()
    assert float(want.min()) > 2**24
    for name in {kernel, "float32"}:
        assert torch.equal(exact.exact_products(left, right, name).double(), want)


def test_the_int8_kernel_only_where_the_cpu_has_int8_dot_products(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU without int8 dot products ``torch._int_mm`` is a generic loop (30-60 times
    slower than float32 on an AMD EPYC Zen 3): the float32 chunks are used there; with them,
    the int8 kernel where it is exact. Speed only: both give the same integers."""
    from dplang.models import packed_int8

    monkeypatch.setenv("DPLANG_NO_PACKED_INT8", "1")  # (the packing's probe: not this test's)
    monkeypatch.setattr(packed_int8, "cpu_multiplies_int8_exactly", lambda: False)
    assert exact.product_kernel("cpu", 640) == "float32"
    assert exact.IntegerLinear(torch.randn(8, 640)).kernel == "float32"
    monkeypatch.setattr(packed_int8, "cpu_multiplies_int8_exactly", lambda: True)
    want = "int8" if exact.int8_kernel_is_exact("cpu", 640) else "float32"
    assert exact.product_kernel("cpu", 640) == want
    assert exact.IntegerLinear(torch.randn(8, 640)).kernel == want


@pytest.mark.parametrize("shape", [(1, 640, 2), (3, 13, 5), (16, 64, 8), (17, 8, 9),
                                   (40, 1000, 24)])
def test_the_cuda_padding_of_int8_products_changes_no_sum(
        shape: tuple[int, int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA's int8 kernel needs more than 16 rows and multiples of 8 (found on the first GPU
    run: a one-row LM head failed), in the "TN" layout; the zero padding that makes any shape
    fit is checked here on the CPU against a stand-in for that kernel which refuses every
    shape and layout CUDA's refuses and computes exact sums (the CPU's own int8 kernel is not
    exact on every machine: oneDNN's AVX2 path saturates an int16 intermediate): every entry
    is the exact sum of its own row and column."""
    calls: list[tuple[int, int, int]] = []

    def cuda_like_int_mm(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        rows, k = left.shape
        cols = right.shape[1]
        assert left.dtype == right.dtype == torch.int8
        assert rows > 16 and k % 8 == 0 and cols % 8 == 0, (rows, k, cols)
        assert left.is_contiguous() and right.t().is_contiguous(), "not the TN layout"
        calls.append((rows, k, cols))
        return (left.long() @ right.long()).to(torch.int32)

    monkeypatch.setattr(torch, "_int_mm", cuda_like_int_mm)
    m, k, n = shape
    gen = torch.Generator().manual_seed(sum(shape))
    left = torch.randint(-128, 128, (m, k), generator=gen, dtype=torch.int8)
    right = torch.randint(-128, 128, (k, n), generator=gen, dtype=torch.int8)
    got = exact._padded_int_mm(left, right)
    assert calls == [exact._padded_shape(m, k, n)]
    assert got.shape == (m, n) and got.dtype == torch.int32
    assert torch.equal(got.long(), left.long() @ right.long())


@pytest.mark.parametrize("name", ["gelu_tanh", "silu", "exp"])
def test_exact_elementwise_functions_are_close_and_position_free(name: str) -> None:
    reference = {
        "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
        "silu": torch.nn.functional.silu,
        "exp": torch.exp,
    }[name]
    fn = getattr(exact, name)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4099, generator=gen) * 4
    torch.testing.assert_close(fn(x), reference(x), atol=1e-6, rtol=2e-6)
    # Every element gets the bits it gets at any other position and in any tensor size.
    for n in (1, 3, 17, 31, 250):
        assert _bitwise_equal(fn(x[:n].clone()), fn(x)[:n])
        assert _bitwise_equal(fn(x[-n:].clone()), fn(x)[-n:])


def test_fixed_point_sum_ignores_order_and_padding() -> None:
    gen = torch.Generator().manual_seed(2)
    values = torch.rand(5, 300, generator=gen, dtype=torch.float64) ** 8
    total = exact.fixed_point_sum(values, 512)
    shuffled = values[:, torch.randperm(300, generator=gen)]
    assert _bitwise_equal(exact.fixed_point_sum(shuffled, 512), total)
    padded = torch.cat([values, torch.zeros(5, 100, dtype=torch.float64)], dim=1)
    assert _bitwise_equal(exact.fixed_point_sum(padded, 512), total)
    torch.testing.assert_close(total, values.sum(dim=-1, keepdim=True), rtol=1e-12, atol=0)
    with pytest.raises(ValueError):
        exact.fixed_point_sum(values, 100)


def test_unknown_activation_is_refused() -> None:
    with pytest.raises(NotImplementedError, match="no exact implementation"):
        decoder.activation_kind(torch.nn.Softsign())


def test_slot_cache_allocates_and_frees() -> None:
    cache = attention.SlotCache(num_layers=2, kv_heads=1, head_dim=8, block=4,
                                device=torch.device("cpu"))
    a = [cache.allocate() for _ in range(3)]
    b = [cache.allocate() for _ in range(20)]
    assert len(set(a) | set(b)) == 23 and cache.slots >= 23
    for slot in a:
        cache.release(slot)
    assert sorted(cache.allocate() for _ in range(3)) == sorted(a)
    cache.reserve(9)
    assert cache.capacity == 12
    with pytest.raises(ValueError):
        attention.SlotCache(num_layers=1, kv_heads=1, head_dim=8, block=0,
                            device=torch.device("cpu"))


def test_slot_cache_grows_once_ahead_of_new_rows() -> None:
    """``prepare`` makes room for a batch of rows in one resize, keeping what is stored."""
    cache = attention.SlotCache(num_layers=2, kv_heads=1, head_dim=8, block=4,
                                device=torch.device("cpu"))
    first = cache.allocate()
    cache.reserve(3)
    keys = torch.arange(3 * 8, dtype=torch.float32).reshape(3, 1, 8) - 7.0
    cache.write(1, torch.tensor([first] * 3), torch.arange(3), keys, -keys)
    stored = (cache.keys[1][first].clone(), cache.values[1][first].clone())
    resized = []
    real = cache._resize_to
    cache._resize_to = lambda slots, capacity: (resized.append((slots, capacity)),
                                                real(slots, capacity))
    cache.prepare(30, 50)
    assert len(resized) == 1 and cache.slots >= 31 and cache.capacity >= 50
    assert cache.capacity % 4 == 0
    slots = [cache.allocate() for _ in range(30)]
    cache.reserve(50)
    assert len(resized) == 1 and first not in slots and len(set(slots)) == 30
    assert torch.equal(cache.keys[1][first][:, :3], stored[0][:, :3])
    assert torch.equal(cache.values[1][first][:, :3], stored[1][:, :3])
    cache.prepare(0, 10)  # room enough: nothing to do
    assert len(resized) == 1
    with pytest.raises(ValueError):
        cache.prepare(1, attention.MAX_POSITIONS + 1)


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
    m = TransformersModel(tiny_llama_dir, threads=1, keep_reference=True)
    assert m.model_id == tiny_llama_dir.name  # its name only: public files never hold its folders
    digest = m.weights_digest()
    assert len(digest) == 64 and digest == m.weights_digest()
    in_memory = TransformersModel(model=m.model, tokenizer=m.tokenizer, threads=1)
    assert len(in_memory.weights_digest()) == 64
    assert TransformersModel(tiny_llama_dir, weights_digest="abc").weights_digest() == "abc"


def test_missing_path_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        TransformersModel(tmp_path / "nope")


def test_a_checkpoint_without_some_weights_is_refused(tiny_llama_dir: Path,
                                                      tmp_path: Path) -> None:
    """transformers fills missing weights with random numbers (e.g. the LM head of a
    classification checkpoint): another model, and other texts, at every load of the same
    files under the same fingerprint. Refused."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "headless"
    shutil.copytree(tiny_llama_dir, folder)
    weights = load_file(folder / "model.safetensors")
    del weights["lm_head.weight"]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"holds no weights for lm_head\.weight"):
        TransformersModel(folder)


# ------------------------------------------------------------------ dtype

LONG_PROMPTS = [
    "Paris",
    "The food was great and the service was friendly, but the pasta was cold and the bread "
    "was stale; we will not come back.",
    "Five stars.",
    "Our waiter was slow; the pizza took an hour! The dessert was good though.",
]


def test_bfloat16_means_8_bit_body_weights(tiny_gemma_dir: Path) -> None:
    full = TransformersModel(tiny_gemma_dir, threads=2)
    half = TransformersModel(tiny_gemma_dir, threads=2, dtype="bfloat16")
    assert half.dtype == torch.bfloat16 and full.dtype == torch.float32
    assert half._decoder.layers[0].qkv.weight_bits == 8
    assert full._decoder.layers[0].qkv.weight_bits == 16
    assert half._decoder.head.weight_bits == 16  # the LM head keeps 16 bits
    assert half.numerics["body_bits"] == 8 and full.numerics["body_bits"] == 16
    s1, s2 = full.encode_prompts(LONG_PROMPTS), half.encode_prompts(LONG_PROMPTS)
    a, b = full.next_logits(s1, None), half.next_logits(s2, None)
    assert b.dtype == torch.float32
    spread = float(a.abs().max())
    assert float((a - b).abs().max()) < 0.1 * spread  # close, not equal
    # Row invariance holds for the 8-bit body too.
    prompts = [half._prompt_ids(p) for p in LONG_PROMPTS]
    together = _decode_rows(half, prompts, [[7, 8, 9, 10]] * 3)
    for r in range(len(prompts)):
        _assert_bitwise(together[r], _decode_rows(half, [prompts[r]], [[7 + r]] * 3)[0])


def test_dtype_resolution(tiny_llama_dir: Path) -> None:
    from dplang.models import dtypes as backend

    assert backend.resolve_dtype("float32") == torch.float32
    assert backend.resolve_dtype("bfloat16") == torch.bfloat16
    assert backend.resolve_dtype("auto") == torch.bfloat16  # the runs' default (8-bit body)
    with pytest.raises(ValueError, match="dtype must be one of"):
        backend.resolve_dtype("float16")
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        backend.resolve_dtype(torch.float16)
    with pytest.raises(ValueError, match="dtype"):
        TransformersModel(tiny_llama_dir, dtype="int8")


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize(("heads", "kv_heads", "dim", "block"),
                         [(4, 2, 8, 64), (4, 1, 256, 64), (8, 2, 16, 4), (2, 2, 32, 1)])
def test_attention_rows_are_independent(threads: int, heads: int, kv_heads: int, dim: int,
                                        block: int) -> None:
    """Each row of a batched attention call gets the bits it gets alone, whatever the batch
    size, the padding of positions and the thread count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(heads * dim + block)
        g = heads // kv_heads
        rows, length = 5, 3 * block
        kmax, vmax = attention.key_levels(dim), attention.value_levels(block)
        q = torch.randint(-32512, 32513, (rows, kv_heads, 1, g, dim), generator=gen).float()
        q_scale = torch.rand(rows, kv_heads, 1, g, generator=gen)
        keys = torch.randint(-kmax, kmax + 1, (rows, kv_heads, length, dim), generator=gen).float()
        values = torch.randint(-vmax, vmax + 1, (rows, kv_heads, length, dim),
                               generator=gen).float()
        k_scale = torch.rand(rows, kv_heads, length, generator=gen)
        v_scale = torch.rand(rows, kv_heads, length, generator=gen)
        lengths = torch.tensor([1, length, block + 1, 2, length - 1])
        for window in (None, 2):
            visible = torch.arange(length).view(1, -1) < lengths.view(-1, 1)
            if window is not None:
                visible &= torch.arange(length).view(1, -1) >= lengths.view(-1, 1) - window
            full = attention.attend(q, q_scale, keys, k_scale, values, v_scale,
                                    visible.view(rows, 1, 1, 1, length), 0.3, None, block)
            for r in range(rows):
                cut = -(-int(lengths[r]) // block) * block  # the row's own positions only
                alone = attention.attend(
                    q[r:r + 1], q_scale[r:r + 1], keys[r:r + 1, :, :cut],
                    k_scale[r:r + 1, :, :cut], values[r:r + 1, :, :cut],
                    v_scale[r:r + 1, :, :cut], visible[r:r + 1, :cut].view(1, 1, 1, 1, cut),
                    0.3, None, block)
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
        torch.testing.assert_close(logits[i], ref, atol=ATOL, rtol=0)


def test_shared_prefix_outlives_the_rows(model: TransformersModel) -> None:
    state = RowDecodeState(prompts=[])
    model.add_prompts(state, [PREFIX + "a b c", PREFIX + "d"], [PREFIX, PREFIX])
    model.next_hidden(state, None)
    prefix_slot, _ = next(iter(state.prefixes.values()))
    assert state.caches[0].length > prefix_slot.length
    assert prefix_slot.slot not in {c.slot for c in state.caches if c is not None}
    model.drop_rows(state, torch.tensor([], dtype=torch.int64))
    assert state.cache is not None and state.cache.live_slots == 1  # the prefix's slot stays
    model.add_prompts(state, [PREFIX + "again"], [PREFIX])
    model.next_hidden(state, None)
    assert len(state.prefixes) == 1  # computed once per state


def test_add_prompts_checks_prefixes(model: TransformersModel) -> None:
    state = RowDecodeState(prompts=[])
    with pytest.raises(ValueError, match="does not start with its prefix"):
        model.add_prompts(state, ["other text"], [PREFIX])
    with pytest.raises(ValueError, match="prefixes for"):
        model.add_prompts(state, ["a", "b"], [None])

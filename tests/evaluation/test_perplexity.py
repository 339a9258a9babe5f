import math

import numpy as np
import pytest
import torch

from dplang.evaluation import PerplexityScorer, delta_ppl, perplexities
from dplang.models import TransformersModel

TEXTS = [
    "The food was great and the service was friendly.",
    "I would not come back.",
    "",
    "Prices are fair and portions are large. Five stars, would recommend to anyone!",
    "ok",
]


def manual_ppl(model: TransformersModel, text: str, max_length: int = 512,
               reference: bool = False) -> float:
    """exp(mean NLL) of the text tokens after BOS, from the logits of the text run alone: the
    backend's own (exact decoder), or with ``reference`` the transformers model's forward."""
    tok = model.tokenizer
    ids = tok(text, add_special_tokens=False)["input_ids"][: max_length - 1]
    x = torch.tensor([[tok.bos_token_id, *ids]])
    with torch.no_grad():
        if reference:
            logits = model.model(input_ids=x).logits[0, :-1].double()
        else:
            hidden = model.token_hidden_states([x[0].tolist()])[0]
            logits = model.logits_from_hidden(hidden)[:-1].double()
    logp = torch.log_softmax(logits, dim=-1)
    nll = -logp[torch.arange(len(ids)), x[0, 1:]]
    return math.exp(float(nll.mean()))


@pytest.fixture(scope="module")
def llama(tiny_model_dir):
    return TransformersModel(tiny_model_dir, keep_reference=True)


def test_perplexity_matches_hand_computation(llama):
    result = perplexities(TEXTS, llama, batch_size=3)  # padded batches of mixed lengths
    for text, value, count in zip(TEXTS, result.values, result.tokens, strict=True):
        if not text:
            assert math.isnan(value) and count == 0
            continue
        assert value == pytest.approx(manual_ppl(llama, text), rel=1e-6)
        # and close to the float32 model's own forward (dplang rounds to 15-16-bit integers)
        assert value == pytest.approx(manual_ppl(llama, text, reference=True), rel=1e-2)
    assert result.empty == 1 and result.truncated == 0
    assert result.scored.size == 4


def test_perplexity_gemma_softcap_and_sliding_window(tiny_gemma_dir):
    model = TransformersModel(tiny_gemma_dir)
    result = perplexities(TEXTS, model, batch_size=2)
    for text, value in zip(TEXTS, result.values, strict=True):
        if text:
            assert value == pytest.approx(manual_ppl(model, text), rel=1e-6)


def test_perplexity_independent_of_batching(llama):
    one = perplexities(TEXTS, llama, batch_size=1).values
    many = perplexities(TEXTS, llama, batch_size=8).values
    np.testing.assert_array_equal(one, many)  # row-invariant: batching changes no bit


def test_truncation_to_max_length(llama):
    text = " ".join(["the food was great"] * 20)
    scorer = PerplexityScorer(llama, max_length=9)
    result = scorer.score([text])
    assert result.truncated == 1 and result.tokens[0] == 8
    assert result.values[0] == pytest.approx(manual_ppl(llama, text, max_length=9), rel=1e-6)


def test_delta_ppl_is_absolute_difference_of_means(llama):
    real = perplexities(TEXTS[:2], llama)
    syn = perplexities(TEXTS[3:], llama)
    d = delta_ppl(syn, real)
    expected = abs(np.mean(syn.scored) - np.mean(real.scored))
    assert d.delta == pytest.approx(expected)
    assert d.signed.mean == pytest.approx(np.mean(syn.scored) - np.mean(real.scored))


def test_perplexity_refuses_non_hf_models():
    from dplang.models import ToyModel

    with pytest.raises(TypeError, match="Hugging Face"):
        PerplexityScorer(ToyModel())


@pytest.mark.slow
def test_perplexity_default_model_is_finite():
    result = perplexities(["The food was great and the staff were friendly."], "default")
    assert 1.0 < result.values[0] < 1e4

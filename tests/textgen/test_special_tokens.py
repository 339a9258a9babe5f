"""Issue 35 §6: a model's special and control tokens (``<start_of_image>``...) are never
sampled unless a run asks for them, by every method and by public generation; the ban is a
public change of the logits (the same in every row), so candidate sets stay public."""

from __future__ import annotations

import json

import pytest

import dplang
from dplang.models import ToyModel
from dplang.models.hf_loading import control_token_ids

TEXTS = [f"review number {i} was fine" for i in range(21)]


class WithSpecials(ToyModel):
    """A toy model whose tokenizer calls half of its vocabulary special."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.special_token_ids = frozenset(range(0, self.vocab_size, 2)) - self.eos_token_ids


def _tokens(result) -> set[int]:
    return {t for r in result.records for t in r["token_ids"]}


@pytest.mark.parametrize("method,extra", [("invisibleink", {}), ("nonprivate", {}),
                                          ("amin", {"threshold": -100.0})])
def test_special_tokens_are_never_sampled_unless_asked(method, extra):
    model = WithSpecials(vocab_size=40, eos_after=None)
    budget = {} if method == "nonprivate" else {"epsilon": 10}
    kw = dict(dataset=f"s-{method}", model=model, batch_size=3, max_tokens=12, quiet=True,
              method=method, top_k=0 if method == "invisibleink" else 50, **budget, **extra)
    banned = _tokens(dplang.generate(TEXTS, **kw)) & model.special_token_ids
    assert not banned
    allowed = dplang.generate(TEXTS, special_tokens=True, seed=3, **kw)
    assert _tokens(allowed) & model.special_token_ids  # they are likely: half the vocabulary
    assert allowed.manifest["fingerprint"]["parameters"]["special_tokens"] is True


def test_public_generation_never_samples_them():
    from dplang.privacy.randomness import RandomStreams
    from dplang.textgen.engine import run_plain

    model = WithSpecials(vocab_size=40, eos_after=None)
    outs = run_plain(model, ["a b", "c"] * 4, 10, 1.0, 0, RandomStreams(1))
    assert not {t for o in outs for t in o} & model.special_token_ids


def test_the_default_tokenizer_s_control_tokens_are_found():
    """Gemma 3's <start_of_image> is an added token its tokenizer does not flag special; it is
    banned by its form, as are the flagged ones; EOS, text tokens and HTML tags are not."""
    from dplang.models.default import ensure_default_model

    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(ensure_default_model()))
    eos = frozenset({tokenizer.eos_token_id})
    ids = control_token_ids(tokenizer, 262144, eos)
    vocab = tokenizer.get_vocab()
    for token in ("<start_of_image>", "<end_of_image>", "<pad>", "<bos>", "<mask>",
                  "<start_of_turn>", "<unused0>", "[multimodal]"):
        assert vocab[token] in ids, token
    for token in ("<eos>", "<table>", "\n", "▁the"):
        if token in vocab:
            assert vocab[token] not in ids, token
    assert json.dumps(sorted(ids))  # a plain, public list

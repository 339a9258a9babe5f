"""Support predicates: keyword rules, embedding similarity, entailment judges."""

from __future__ import annotations

import numpy as np
import pytest

from dplang.reports.chunking import chunk_text
from dplang.reports.predicates import (
    EmbeddingPredicate,
    EntailmentPredicate,
    KeywordPredicate,
    PredicateError,
    support_counts,
)
from dplang.reports.statements import Statement

RECORDS = ["The staff were great. Prices were high.", "great pasta", None, "STAFF rude",
           ""]


def test_keyword_predicate_rules_and_conjunction() -> None:
    pred = KeywordPredicate()
    statements = [Statement("staff", r"\bstaff\b"), Statement("great staff", ("great", "staff")),
                  Statement("nothing", "zebra")]
    m = pred.matrix(statements, RECORDS)
    assert m.tolist() == [[True, False, False, True, False],
                          [True, False, False, False, False],
                          [False] * 5]
    assert support_counts(pred, statements, RECORDS).tolist() == [2, 1, 0]
    assert pred(Statement("x", "pasta"), "great PASTA")
    assert pred.rule_for(statements[1]) == ["great", "staff"]
    with pytest.raises(PredicateError, match="no keyword rule"):
        pred.check([Statement("no rule")])


def test_sensitivity_of_counts_is_one() -> None:
    """Replacing one record changes each count by at most 1 (any record, any predicate)."""
    pred = KeywordPredicate()
    statements = [Statement("a", "a"), Statement("b", ("a", "b")), Statement("c", "c")]
    base = ["ab", "a", "c", None]
    for i in range(len(base)):
        for replacement in ("abc", None, "", "zzz", "b"):
            other = list(base)
            other[i] = replacement
            diff = support_counts(pred, statements, base) - support_counts(pred, statements,
                                                                             other)
            assert np.abs(diff).max() <= 1


def fake_encoder(texts: list[str]) -> np.ndarray:
    """Bag-of-letters embedding: deterministic, no model."""
    out = np.zeros((len(texts), 26), dtype=np.float32)
    for i, t in enumerate(texts):
        for ch in t.lower():
            if "a" <= ch <= "z":
                out[i, ord(ch) - 97] += 1
    return out + 1e-3


def test_embedding_predicate_is_max_over_chunks() -> None:
    pred = EmbeddingPredicate(0.9, max_words=3, pack=True, encoder=fake_encoder,
                              encoder_id="letters")
    statements = [Statement("great pasta")]
    records = ["nothing here at all. great pasta!", "great pasta", None, "zzz qqq"]
    sims = pred.similarities(statements, records)
    assert sims.shape == (1, 4)
    assert sims[0, 2] == -1.0  # no chunks
    chunk_sims = [float(fake_encoder(["great pasta"])[0] @ fake_encoder([c])[0]
                        / np.linalg.norm(fake_encoder(["great pasta"])[0])
                        / np.linalg.norm(fake_encoder([c])[0]))
                  for c in chunk_text(records[0], 3)]
    assert sims[0, 0] == pytest.approx(max(chunk_sims), abs=1e-5)
    assert pred.matrix(statements, records).tolist() == [[True, True, False, False]]
    d = pred.describe()
    assert d["threshold"] == 0.9 and d["model"] == "letters" and d["max_words"] == 3
    with pytest.raises(PredicateError):
        EmbeddingPredicate(1.5)


def test_default_embedder_offline() -> None:
    """The bundled MiniLM model loads offline (HF_HUB_OFFLINE) and is cached per process."""
    from dplang.reports.predicates import load_default_embedder

    pred = EmbeddingPredicate(0.6)
    statements = [Statement("The staff were friendly."), Statement("The hotel had a pool.")]
    records = ["Our waiter was very friendly and kind. We had soup.",
               "The swimming pool at the hotel was lovely."]
    sims = pred.similarities(statements, records)
    assert sims[0, 0] > sims[0, 1] and sims[1, 1] > sims[1, 0]
    assert pred.matrix(statements, records).tolist() == (sims >= 0.6).tolist()
    assert load_default_embedder() is load_default_embedder()
    assert "all-MiniLM-L6-v2" in pred.describe()["model"]


def test_entailment_predicate_with_nli_model(tiny_nli) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    pred = EntailmentPredicate(tiny_nli, max_words=4)
    assert pred.judge == "nli"
    statements = [Statement("the food was good"), Statement("the staff were rude")]
    records = ["the food was good. we liked the staff a lot", "bad", None]
    got = pred.matrix(statements, records)
    tok = AutoTokenizer.from_pretrained(tiny_nli)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_nli).eval()
    for j, s in enumerate(statements):
        for i, r in enumerate(records):
            chunks = chunk_text(r, 4)
            expect = False
            for c in chunks:
                with torch.inference_mode():
                    logits = model(**tok(c, s.text, return_tensors="pt")).logits
                expect |= int(logits.argmax()) == 1
            assert got[j, i] == expect
    assert pred.describe()["judge"] == "nli"
    # P(entailment) ≥ p_min: argmax-entailment ⇒ P ≥ 1/3, so a tiny p_min gives a superset
    low = EntailmentPredicate(tiny_nli, p_min=1e-12, max_words=4).matrix(statements, records)
    high = EntailmentPredicate(tiny_nli, p_min=0.999999, max_words=4).matrix(statements,
                                                                               records)
    assert (low >= got).all() and (high <= got).all()


def test_entailment_predicate_with_causal_lm(tiny_causal_lm) -> None:
    from dplang.models import resolve_model

    pred = EntailmentPredicate(tiny_causal_lm, max_words=50)
    assert pred.judge == "causal-lm"
    statements = [Statement("food good"), Statement("staff rude")]
    records = ["food was good", "the staff", None]
    got = pred.matrix(statements, records)
    model = resolve_model(str(tiny_causal_lm))
    yes = model.tokenizer(" yes", add_special_tokens=False)["input_ids"][0]
    no = model.tokenizer(" no", add_special_tokens=False)["input_ids"][0]
    for j, s in enumerate(statements):
        for i, r in enumerate(records):
            if r is None:
                assert not got[j, i]
                continue
            prompt = model.render_prompt(pred.prompt.format(premise=r, hypothesis=s.text))
            logits = model.next_logits(model.encode_prompts([prompt]), None)[0]
            assert got[j, i] == bool(logits[yes] > logits[no])


def test_entailment_predicate_errors(tmp_path) -> None:
    with pytest.raises(PredicateError):
        EntailmentPredicate(tmp_path / "missing")
    with pytest.raises(PredicateError):
        EntailmentPredicate(tmp_path, judge="oracle")


def test_embedding_support_is_a_function_of_the_record_alone() -> None:
    """A record's similarity (hence σ) is the same bits whatever other records are embedded
    with it: private chunks go one per encoder call (a batched encoder pads texts together)."""
    calls: list[int] = []

    def encoder(texts: list[str]) -> np.ndarray:
        calls.append(len(texts))
        # A batch-dependent encoder: every row is shifted by the batch's longest text.
        width = max(len(t) for t in texts)
        return np.array([[len(t) + 1e-3 * width, 1.0, (hash(t) % 7) / 7] for t in texts])

    pred = EmbeddingPredicate(0.5, encoder=encoder, encoder_id="test")
    statements = ["short", "a longer statement"]
    rec = "the soup was warm"
    alone = pred.similarities(statements, [rec])[:, 0]
    crowd = [rec, "x " * 300, "y"]
    together = pred.similarities(statements, crowd)[:, 0]
    assert np.array_equal(alone, together)
    assert max(calls) > 1  # the public statements are still batched

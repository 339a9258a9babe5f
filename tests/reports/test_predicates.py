"""Support predicates: keyword rules, embedding similarity, entailment judges."""

from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import pytest

from dplang.reports.chunking import chunk_text
from dplang.reports.predicates import (
    SIMILARITY_LEVELS,
    EmbeddingPredicate,
    EntailmentPredicate,
    KeywordPredicate,
    PredicateError,
    SupportPredicate,
    integer_cosines,
    integer_vectors,
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
    # a record's verdicts alone are those it got beside the others
    assert pred.matrix(statements, [records[0]])[:, 0].tolist() == got[:, 0].tolist()


def test_the_judge_is_identified_by_its_files_not_its_path(tiny_nli, tmp_path) -> None:
    """A judge changed in place is another judge: its digest (in describe(), hence in the
    release's fingerprint) changes with any file a loader reads, not with download
    bookkeeping under a hidden folder."""
    import shutil

    judge = tmp_path / "judge"
    shutil.copytree(tiny_nli, judge)
    first = EntailmentPredicate(judge, max_words=4).describe()
    assert first["model"] == str(judge) and len(first["model_sha256"]) == 64
    (judge / ".cache").mkdir()
    (judge / ".cache" / "download.metadata").write_text("etag, time")
    assert EntailmentPredicate(judge, max_words=4).describe() == first
    config = json.loads((judge / "config.json").read_text())
    config["id2label"] = {"0": "entailment", "1": "contradiction", "2": "neutral"}
    (judge / "config.json").write_text(json.dumps(config))
    second = EntailmentPredicate(judge, max_words=4).describe()["model_sha256"]
    assert second != first["model_sha256"]
    # files in a hidden or a symlinked folder (a shard index may name them) are files too
    (judge / ".shards").mkdir()
    (judge / ".shards" / "extra.json").write_text("1")
    third = EntailmentPredicate(judge, max_words=4).describe()["model_sha256"]
    assert third != second
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "part.json").write_text("1")
    (judge / "linked").symlink_to(elsewhere, target_is_directory=True)
    fourth = EntailmentPredicate(judge, max_words=4).describe()["model_sha256"]
    (elsewhere / "part.json").write_text("2")
    assert fourth != third
    assert EntailmentPredicate(judge, max_words=4).describe()["model_sha256"] != fourth


def test_a_judge_path_with_a_tilde_is_the_users_folder(tiny_nli, tmp_path, monkeypatch) -> None:
    """"--judge=~/judge" keeps its "~" past the shell: read as the home folder's judge (an
    NLI judge seen as such, identified by its files), not as a path that does not exist."""
    import shutil

    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copytree(tiny_nli, tmp_path / "judge")
    pred = EntailmentPredicate("~/judge", max_words=4)
    described = pred.describe()
    assert pred.judge == "nli" and described["model"] == str(tmp_path / "judge")
    assert described["model_sha256"] == EntailmentPredicate(
        tmp_path / "judge", max_words=4).describe()["model_sha256"]


def test_entailment_predicate_errors(tmp_path) -> None:
    with pytest.raises(PredicateError):
        EntailmentPredicate(tmp_path / "missing")
    with pytest.raises(PredicateError):
        EntailmentPredicate(tmp_path, judge="oracle")


def hashed_encoder(texts: list[str]) -> np.ndarray:
    """A deterministic 384-dimensional embedding per text (a function of the text alone), with
    entries of very different magnitudes, so that a float32 sum's last bits depend on its
    order (as a BLAS kernel chosen by the number of chunks would change it)."""
    out = np.empty((len(texts), 384), dtype=np.float32)
    for i, t in enumerate(texts):
        seed = int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little")
        rng = np.random.default_rng(seed)
        out[i] = rng.standard_normal(384) * np.exp(rng.uniform(-6, 6, 384))
    return out


def _key(x: float) -> int:
    """An integer that orders float64 values as the floats are ordered."""
    bits = struct.unpack("<q", struct.pack("<d", x))[0]
    return bits if bits >= 0 else -(bits & 0x7FFFFFFFFFFFFFFF)


def _float(k: int) -> float:
    bits = k if k >= 0 else (-k) | (1 << 63)
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def support_boundaries(pred: SupportPredicate, statements: list[str], records: list,
                       index: int) -> list[float]:
    """For each statement, the largest float64 threshold t in [-1, 1] at which the predicate
    says record ``index`` supports it (-2.0 if none), found by bisection over the float64
    values through :meth:`matrix` alone: the number σ really compares, bit for bit, however it
    is computed. (σ is monotone in t.)"""
    out = []
    saved = pred.threshold
    for j in range(len(statements)):
        def supported(k: int, j: int = j) -> bool:
            pred.threshold = _float(k)
            return bool(pred.matrix([statements[j]], records)[0, index])

        lo, hi = _key(-1.0), _key(1.0)
        if not supported(lo):
            out.append(-2.0)
            continue
        if supported(hi):
            out.append(1.0)
            continue
        while hi - lo > 1:  # supported(lo) and not supported(hi)
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if supported(mid) else (lo, mid)
        out.append(_float(lo))
    pred.threshold = saved
    return out


def test_embedding_support_is_a_function_of_the_record_alone() -> None:
    """A record's σ (and its similarities) are the same bits whatever other records are scored
    with it and however many there are (a float32 product over all chunks would round a
    record's cosine by the number of chunks). The boundary of σ in the threshold is found
    exactly, through ``matrix``, for the record alone and in crowds of 1 to 40 others."""
    records = [f"review {i}. the soup was {'warm' * (i % 5)} and the {i} staff were kind!"
               for i in range(40)]
    statements = ["The soup was warm.", "The staff were kind.", "Parking was easy."]
    pred = EmbeddingPredicate(0.0, encoder=hashed_encoder, encoder_id="hashed")
    rec = "The soup was warm. Staff: kind, quick, and the parking lot was full."
    alone = support_boundaries(pred, statements, [rec], 0)
    sims = pred.similarities(statements, [rec])[:, 0]
    for k in (1, 2, 3, 7, 8, 15, 16, 17, 31, 40):
        crowd = [*records[:k], rec]
        assert support_boundaries(pred, statements, crowd, k) == alone, k
        assert np.array_equal(pred.similarities(statements, crowd)[:, k], sims), k
        front = [rec, *records[:k]]
        assert np.array_equal(pred.similarities(statements, front)[:, 0], sims), k
    assert alone == sims.tolist()  # σ compares exactly the similarities


def test_encoder_calls_never_mix_records() -> None:
    """A batch-dependent encoder (each row shifted by its batch's longest text) cannot move a
    record's similarity: every encoder call holds the chunks of one record (at most
    batch_size of them) or public statements only (a custom encoder gets them all at once)."""
    calls: list[list[str]] = []

    def encoder(texts: list[str]) -> np.ndarray:
        calls.append(list(texts))
        width = max(len(t) for t in texts)
        return np.array([[len(t) + 1e-3 * width, 1.0, (hash(t) % 7) / 7] for t in texts])

    pred = EmbeddingPredicate(0.5, encoder=encoder, encoder_id="test", batch_size=2)
    statements = ["short", "a longer statement", "third"]
    rec = "the soup was warm. the staff were kind! parking was easy? yes."
    alone = pred.similarities(statements, [rec])[:, 0]
    crowd = ["x " * 300, rec, "y", "one. two. three."]
    calls.clear()
    together = pred.similarities(statements, crowd)[:, 1]
    assert np.array_equal(alone, together)
    chunk_sets = [set(chunk_text(r, pred.max_words, pack=False)) for r in crowd]
    for texts in calls:  # public statements together, or at most 2 chunks of one record
        assert set(texts) <= set(statements) or (
            len(texts) <= 2 and any(set(texts) <= c for c in chunk_sets))
    assert [len(t) for t in calls if set(t) <= chunk_sets[1]] == [2, 2]  # 4 chunks of rec


def test_integer_cosines_are_exact_and_order_free() -> None:
    """The cosine of rounded embeddings is computed from exact int64 sums: the same bits for a
    pair whatever the other rows, their number or their order, and close to the float
    cosine."""
    rng = np.random.default_rng(0)
    s = rng.standard_normal((5, 384)).astype(np.float32)
    c = (rng.standard_normal((50, 384)) * np.exp(rng.uniform(-5, 5, (50, 384)))).astype(
        np.float32)
    qs, qc = integer_vectors(s), integer_vectors(c)
    assert np.abs(qc.q).max() == SIMILARITY_LEVELS
    full = integer_cosines(qs, qc)
    for i in (0, 7, 49):
        one = integer_cosines(qs, integer_vectors(c[i:i + 1]))[:, 0]
        assert np.array_equal(one, full[:, i])
    perm = rng.permutation(50)
    assert np.array_equal(integer_cosines(qs, integer_vectors(c[perm])), full[:, perm])
    dots = qs.q.astype(object) @ qc.q.T.astype(object)  # Python integers: exact
    assert (dots == qs.q @ qc.q.T).all()
    ref = (s / np.linalg.norm(s, axis=1, keepdims=True)).astype(np.float64) @ (
        c / np.linalg.norm(c, axis=1, keepdims=True)).T.astype(np.float64)
    assert np.abs(full - ref).max() < 1e-3
    # a zero or non-finite embedding is the zero vector: cosine 0 with everything
    bad = np.stack([np.zeros(384, np.float32), np.full(384, np.nan, np.float32)])
    assert not integer_cosines(qs, integer_vectors(bad)).any()


def test_entailment_verdict_is_a_function_of_the_record_alone(tiny_nli) -> None:
    """The NLI judge gives a record the same verdicts alone and among other records (one pair
    per model call, one sequence without padding; the causal-LM judge is checked against
    one-row calls in test_entailment_predicate_with_causal_lm)."""
    statements = [Statement("the food was good"), Statement("the staff were rude")]
    rec = "the food was good. we liked the staff"
    crowd = ["bad", None, "the staff were so rude to us, and slow", "ok"]
    pred = EntailmentPredicate(tiny_nli, max_words=5, p_min=0.3)
    alone = pred.matrix(statements, [rec])[:, 0]
    for k in (1, 4):
        assert pred.matrix(statements, [*crowd[:k], rec])[:, -1].tolist() == alone.tolist()
        assert pred.matrix(statements, [rec, *crowd[:k]])[:, 0].tolist() == alone.tolist()

"""Statements, proposers (list, schema, language model) and the chunking rule."""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dplang.models import ToyModel
from dplang.reports.chunking import chunk_text
from dplang.reports.proposers import (
    LanguageModelProposer,
    ListProposer,
    TemplateProposer,
    load_schema,
)
from dplang.reports.statements import (
    MAX_STATEMENT_CHARS,
    Statement,
    StatementError,
    deduplicate,
    read_statements_file,
    validate_statements,
)


def test_statements_file_format(tmp_path) -> None:
    path = tmp_path / "s.txt"
    path.write_text("# a comment\n\nThe food is good\tfood|meal\n  Service   is slow  \n"
                    "the food is good.\tother\n", encoding="utf-8")
    raw = read_statements_file(path)
    assert [s.text for s in raw] == ["The food is good", "Service is slow", "the food is good."]
    assert raw[0].rule == "food|meal" and raw[1].rule is None
    kept = deduplicate(raw)
    assert [s.text for s in kept] == ["The food is good", "Service is slow"]
    assert kept[0].rule == "food|meal"  # first occurrence wins


def test_validation() -> None:
    with pytest.raises(StatementError, match="no candidate"):
        validate_statements([])
    with pytest.raises(StatementError, match="characters long"):
        validate_statements([Statement("x" * (MAX_STATEMENT_CHARS + 1))])
    with pytest.raises(StatementError, match="no keyword rule"):
        validate_statements([Statement("ok")], need_rules=True)
    with pytest.raises(StatementError, match="invalid regular expression"):
        validate_statements([Statement("ok", "(unclosed")])
    validate_statements([Statement("ok", ("a", "b"))], need_rules=True)


def test_missing_and_bad_files(tmp_path) -> None:
    with pytest.raises(StatementError, match="not found"):
        read_statements_file(tmp_path / "nope.txt")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe broken")
    with pytest.raises(StatementError, match="UTF-8"):
        read_statements_file(bad)


SCHEMA = """
template = "Reviews about {topic} mention {aspect} in {sentiment} contexts."
topic = ["restaurants", "hotels"]

[[aspect]]
text = "the service"
pattern = "\\\\b(service|staff)\\\\b"

[[aspect]]
text = "the price"
pattern = "\\\\bprice"

[[sentiment]]
text = "positive"
pattern = "great|good"

[[sentiment]]
text = "negative"
"""


def test_schema_proposer(tmp_path) -> None:
    path = tmp_path / "schema.toml"
    path.write_text(SCHEMA, encoding="utf-8")
    proposer = load_schema(path)
    statements = proposer.enumerate()
    assert len(statements) == 2 * 2 * 2
    first = statements[0]
    assert first.text == "Reviews about restaurants mention the service in positive contexts."
    assert first.patterns == (r"\b(service|staff)\b", "great|good")
    neg = next(s for s in statements if "negative" in s.text)
    assert len(neg.patterns) == 1
    assert proposer.propose() == deduplicate(statements)
    sampled = proposer.propose(m=50, rng=np.random.default_rng(0))
    assert 1 <= len(sampled) <= 8


@pytest.mark.parametrize(("text", "message"), [
    ('template = "About {topic}."\n', "non-empty array"),
    ('template = "About {topic}."\ntopic = ["a"]\nextra = 1\n', "not slots"),
    ('template = "About {topic!r}."\ntopic = ["a"]\n', "plain name"),
    ('topic = ["a"]\n', "exactly one of"),
    ('template = "About {topic}."\ntopic = [{text = "a", pattern = "("}]\n', "invalid pattern"),
    ("template = [", "invalid TOML"),
])
def test_schema_errors(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(StatementError, match=message):
        load_schema(path)


def test_proposers_never_receive_data() -> None:
    """The proposers' public API has no parameter through which records could be passed."""
    for method in (ListProposer.propose, TemplateProposer.propose,
                   LanguageModelProposer.propose, LanguageModelProposer.__init__,
                   TemplateProposer.__init__, ListProposer.__init__):
        params = set(inspect.signature(method).parameters)
        assert not params & {"records", "data", "corpus", "references"}


def test_language_model_proposer_is_deterministic_and_deduplicated() -> None:
    model = ToyModel(vocab_size=31, eos_token_id=0, eos_after=None)
    a = LanguageModelProposer(model, "Summarise reviews", num=6, max_tokens=12, seed=3,
                              min_words=1)
    b = LanguageModelProposer(model, "Summarise reviews", num=6, max_tokens=12, seed=3,
                              min_words=1)
    assert a.drafts() == b.drafts()
    out = a.propose()
    assert out == deduplicate(out) and all(s.source == "model" for s in out)
    assert all(len(s.text) <= MAX_STATEMENT_CHARS for s in out)
    with pytest.raises(StatementError):
        LanguageModelProposer(model, "  ")


def test_language_model_proposer_with_a_tiny_hf_model(tiny_causal_lm) -> None:
    from dplang.models import resolve_model

    model = resolve_model(str(tiny_causal_lm))
    proposer = LanguageModelProposer(model, "Summarise restaurant reviews", num=4,
                                     max_tokens=10, seed=0, min_words=1)
    assert len(proposer.drafts()) == 4
    assert all(isinstance(s, Statement) for s in proposer.propose())


# ------------------------------------------------------------------------------ chunking


def test_chunking_rule() -> None:
    text = "One two three. Four five six seven! Eight\nnine ten."
    assert chunk_text(text, max_words=4) == ["One two three.", "Four five six seven!",
                                             "Eight nine ten."]
    assert chunk_text(text, max_words=100) == ["One two three. Four five six seven! Eight "
                                               "nine ten."]
    long = " ".join(f"w{i}" for i in range(10))
    assert chunk_text(long, max_words=4) == ["w0 w1 w2 w3", "w4 w5 w6 w7", "w8 w9"]
    assert chunk_text(long, max_words=4, max_chunks=2) == ["w0 w1 w2 w3", "w4 w5 w6 w7"]
    assert chunk_text(None) == [] and chunk_text("   ") == []


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="ab .!?\n", max_size=200), st.integers(1, 10))
def test_chunks_cover_the_words_in_order(text: str, max_words: int) -> None:
    chunks = chunk_text(text, max_words=max_words)
    assert " ".join(chunks).split() == text.split()
    assert all(1 <= len(c.split()) <= max_words for c in chunks)


def test_dedupe_key_ignores_case_space_and_final_punctuation() -> None:
    got = deduplicate([Statement("A  b."), Statement("a b"), Statement("a b!"),
                       Statement("a c")])
    assert [s.text for s in got] == ["A b.", "a c"]
    assert all(re.fullmatch(r"\S.*\S|\S", s.text) for s in got)


def test_one_sentence_per_chunk() -> None:
    text = "One two three. Four five six seven! Eight\nnine ten."
    assert chunk_text(text, max_words=100, pack=False) == ["One two three.",
                                                          "Four five six seven!", "Eight",
                                                          "nine ten."]
    assert chunk_text("a b c d e", max_words=2, pack=False) == ["a b", "c d", "e"]

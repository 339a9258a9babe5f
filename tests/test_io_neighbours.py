"""Reading private files: what a neighbouring dataset must not change (a blank or missing
text is the null reference, kept in its place), and what lies outside the input domain and is
refused with a one-line error naming the line (``docs/privacy.md``, "Input domain")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dplang.io import ReferenceDataError, load_references


def test_one_column_csv_blank_reference_keeps_its_position(tmp_path: Path) -> None:
    """Replace-by-null: blanking reference 1 of a one-column CSV (an empty line, as many tools
    write it) must leave every other reference at its position and the row count unchanged."""
    full = tmp_path / "full.csv"
    full.write_text("text\nr0\nr1\nr2\nr3\n", encoding="utf-8")
    blank = tmp_path / "blank.csv"
    blank.write_text("text\nr0\n\nr2\nr3\n", encoding="utf-8")
    rec_full, st_full = load_references(full)
    rec_blank, st_blank = load_references(blank)
    assert st_blank.rows_seen == st_full.rows_seen == 4
    assert [r.index for r in rec_blank] == [r.index for r in rec_full]
    assert rec_blank[2].text == "r2" and rec_blank[1].text is None


def test_jsonl_first_record_without_text_is_a_null_reference(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(o) for o in
                              [{"label": "a"}, {"text": "t1", "label": "a"},
                               {"text": "t2", "label": "a"}]) + "\n", encoding="utf-8")
    records, stats = load_references(path)  # its neighbour with {"text": "t0"} first is read
    assert [r.text for r in records] == [None, "t1", "t2"]
    assert stats.skipped_by_reason == {"missing": 1}


def test_jsonl_huge_number_is_a_null_reference(tmp_path: Path) -> None:
    """A JSON number is not a string (``not_string``): the null reference, however many digits
    it has, never a crash or a refusal (its neighbour with a text there is read)."""
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a"}\n{"text": ' + "9" * 5000 + '}\n{"text": "b"}\n',
                    encoding="utf-8")
    records, stats = load_references(path)
    assert [r.text for r in records] == ["a", None, "b"]
    assert stats.skipped_by_reason == {"not_string": 1}


def test_jsonl_nested_deeper_than_the_parser_allows_is_refused(tmp_path: Path) -> None:
    """Outside the domain (a JSON line the parser cannot read): a one-line refusal naming the
    line, not a RecursionError."""
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a"}\n{"text": ' + "[" * 100_000 + "]" * 100_000
                    + '}\n{"text": "b"}\n', encoding="utf-8")
    with pytest.raises(ReferenceDataError, match=r"line 2: JSON nested too deeply$"):
        load_references(path)


def test_jsonl_lone_surrogate_is_refused(tmp_path: Path) -> None:
    """A string escape that is an unpaired surrogate is not Unicode text (no UTF-8 file can hold
    it): outside the domain, refused naming the line, never handed to a model."""
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a"}\n{"text": "caf\\ud800 review"}\n{"text": "b"}\n',
                    encoding="utf-8")
    with pytest.raises(ReferenceDataError, match=r"line 2: a string holds an unpaired surrogate"):
        load_references(path)

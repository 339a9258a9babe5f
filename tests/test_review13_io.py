"""Review of issue 13 (adversarial): reading private files.

Each test states what a neighbouring data set must NOT change. They are strict xfails: they
document defects found in review (see the review report) and fail loudly once fixed, so the
marker can be removed then."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dplang.io import ReferenceDataError, load_references

REVIEW = "review13: "


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


@pytest.mark.parametrize("value", ["9" * 5000, "[" * 100_000 + "]" * 100_000])
def test_jsonl_pathological_value_is_not_a_crash(tmp_path: Path, value: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a"}\n{"text": ' + value + '}\n{"text": "b"}\n', encoding="utf-8")
    try:
        records, _ = load_references(path)
    except ReferenceDataError:
        return  # a one-line, handled refusal is acceptable (the CLI prints it)
    assert [r.text for r in records] == ["a", None, "b"]


def test_jsonl_lone_surrogate_is_not_passed_on_as_text(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a"}\n{"text": "caf\\ud800 review"}\n{"text": "b"}\n',
                    encoding="utf-8")
    try:
        records, _ = load_references(path)
    except ReferenceDataError:
        return
    for r in records:
        if r.text is not None:
            r.text.encode("utf-8")  # every reference handed to a model is valid Unicode

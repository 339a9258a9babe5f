"""Tests for dplang.io: reading references from files."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dplang.io import (
    ReadStats,
    Record,
    ReferenceDataError,
    demo_corpus_path,
    detect_format,
    file_digest,
    load_references,
    read_records,
)


def write_csv(path: Path, rows: list[list[str]], delimiter: str = ",") -> Path:
    with path.open("w", encoding="utf-8", newline="") as f:
        csv.writer(f, delimiter=delimiter).writerows(rows)
    return path


def write_jsonl(path: Path, lines: list[object | str]) -> Path:
    with path.open("w", encoding="utf-8") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return path


# ---------------------------------------------------------------------------- formats


@pytest.mark.parametrize("ext,delim", [(".csv", ","), (".tsv", "\t")])
def test_delimited_skip_rule_and_counts(tmp_path: Path, ext: str, delim: str) -> None:
    path = write_csv(
        tmp_path / f"refs{ext}",
        [
            ["text", "label"],
            ["first review", "a"],
            ["", "b"],  # blank
            ["   \t ", "c"],  # blank
            ['line one\r\nline two, with "quotes"\tand tab', "d"],
            ["NA", "e"],  # kept verbatim (pandas would turn it into a missing value)
        ],
        delimiter=delim,
    )
    with path.open("a", encoding="utf-8") as f:
        f.write("\n")  # an empty line is a row: every field missing (kept in place)
        f.write("only-text-no-label\n")  # short row: label missing -> ""
    stats = ReadStats()
    records = list(read_records(path, columns=("label",), stats=stats))
    assert [r.index for r in records] == [0, 1, 2, 3, 4, 5, 6]
    assert records[0] == Record(0, "first review", {"label": "a"})
    assert records[1].text is None and records[2].text is None  # null references kept in place
    assert records[3].text == 'line one\nline two, with "quotes"\tand tab'
    assert records[4].text == "NA"
    assert records[5] == Record(5, None, {"label": ""})  # the empty line
    assert records[6].labels == {"label": ""}
    assert stats.rows_seen == 7 and stats.used == 4
    assert stats.skipped_by_reason == {"blank": 2, "missing": 1}
    assert stats.nulls == 3 and stats.records == 7

    stats = ReadStats()
    skipped = list(read_records(path, columns=("label",), on_unusable="skip", stats=stats))
    assert [r.index for r in skipped] == [0, 3, 4, 6]
    assert all(r.text for r in skipped)
    assert stats.used == 4 and stats.skipped_by_reason == {"blank": 2, "missing": 1}
    assert stats.nulls == 0


def test_csv_short_row_text_missing(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    path.write_text("label,text\nx,hello\ny\n", encoding="utf-8")
    records, stats = load_references(path, columns=("label",), on_unusable="skip")
    assert [r.text for r in records] == ["hello"]
    assert stats.skipped_by_reason == {"missing": 1}


def test_csv_bom_and_long_field(tmp_path: Path) -> None:
    long_text = "word " * 40_000  # over the csv module's default 128 KiB field limit
    path = tmp_path / "r.csv"
    with path.open("w", encoding="utf-8-sig", newline="") as f:
        csv.writer(f).writerows([["text"], [long_text]])
    (record,), _ = load_references(path)
    assert record.text == long_text


def test_jsonl_skip_reasons(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "r.jsonl",
        [
            {"text": "ok one", "stars": "5.0"},
            {"text": None, "stars": "4.0"},
            {"text": 17, "stars": 3},
            {"text": {"nested": "x"}, "stars": None},
            "",  # blank line: not a row
            {"text": "  ", "stars": "1.0"},
            {"stars": "2.0"},
            {"text": "crlf\r\nkept", "stars": 2.5},
        ],
    )
    stats = ReadStats()
    records = list(read_records(path, columns=("stars",), stats=stats))
    assert [r.index for r in records] == list(range(7))
    assert [r.text for r in records] == ["ok one", None, None, None, None, None, "crlf\nkept"]
    assert [r.labels["stars"] for r in records] == ["5.0", "4.0", "3", "", "1.0", "2.0", "2.5"]
    assert stats.rows_seen == 7 and stats.used == 2
    assert stats.skipped_by_reason == {"missing": 2, "not_string": 2, "blank": 1}


def test_ndjson_extension_and_explicit_fmt(tmp_path: Path) -> None:
    nd = write_jsonl(tmp_path / "r.ndjson", [{"text": "a"}])
    assert [r.text for r in read_records(nd)] == ["a"]
    odd = write_jsonl(tmp_path / "r.data", [{"text": "b"}])
    assert [r.text for r in read_records(odd, fmt="jsonl")] == ["b"]
    assert detect_format("x.PARQUET") == "parquet"
    assert detect_format("x.anything", fmt=".tsv") == "tsv"


def test_jsonl_malformed(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{"text": \n', encoding="utf-8")
    with pytest.raises(ReferenceDataError, match=r"bad\.jsonl: line 2: invalid JSON"):
        list(read_records(bad))
    arr = tmp_path / "arr.jsonl"
    arr.write_text('{"text": "a"}\n["text"]\n', encoding="utf-8")
    with pytest.raises(ReferenceDataError, match="line 2: expected a JSON object"):
        list(read_records(arr))


def test_parquet_skip_reasons(tmp_path: Path) -> None:
    path = tmp_path / "r.parquet"
    table = pa.table(
        {
            "text": ["alpha", None, "", " \n ", "a\r\nb", "omega"],
            "cat": ["x", "y", None, "x", "y", "x"],
            "num": [1, 2, 3, 4, 5, 6],
        }
    )
    pq.write_table(table, path, row_group_size=2)
    stats = ReadStats()
    records = list(read_records(path, columns=("cat",), stats=stats, chunk_rows=3))
    assert [r.text for r in records] == ["alpha", None, None, None, "a\nb", "omega"]
    assert [r.labels["cat"] for r in records] == ["x", "y", "", "x", "y", "x"]
    assert stats.skipped_by_reason == {"missing": 1, "blank": 2}
    # A non-text column is refused by its schema type (public), not by its values.
    with pytest.raises(ReferenceDataError, match="holds int64, not text"):
        list(read_records(path, text_column="num"))


def test_parquet_binary_invalid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "b.parquet"
    pq.write_table(pa.table({"text": pa.array([b"fine", b"\xff\xfe bad"], pa.binary())}), path)
    with pytest.raises(ReferenceDataError, match=r"b\.parquet: row 1 is not valid UTF-8"):
        list(read_records(path))


def test_parquet_not_parquet(tmp_path: Path) -> None:
    path = tmp_path / "fake.parquet"
    path.write_text("not parquet at all", encoding="utf-8")
    with pytest.raises(ReferenceDataError, match="not a readable Parquet file"):
        list(read_records(path))


def test_txt_one_reference_per_line(tmp_path: Path) -> None:
    path = tmp_path / "r.txt"
    path.write_bytes(b"first line\r\n\r\n   \nsecond line\nthird\n")
    stats = ReadStats()
    records = list(read_records(path, stats=stats))
    assert [r.text for r in records] == ["first line", None, None, "second line", "third"]
    assert stats.skipped_by_reason == {"blank": 2}
    skipped, stats = load_references(path, on_unusable="skip")
    assert [(r.index, r.text) for r in skipped] == [
        (0, "first line"),
        (3, "second line"),
        (4, "third"),
    ]
    with pytest.raises(ReferenceDataError, match="only the column 'text'"):
        list(read_records(path, columns=("stars",)))


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "name,content,where",
    [
        ("r.csv", b"text\nok\nbad \xff byte\n", "line 3"),
        ("r.tsv", b"text\tx\nbad \xc3\x28\t1\n", "line 2"),
        ("r.jsonl", b'{"text": "ok"}\n{"text": "\xe9t\xe9"}\n', "line 2"),
        ("r.txt", b"ok\nok\nok\n\x80\n", "line 4"),
    ],
)
def test_invalid_utf8_raises_with_file_and_line(
    tmp_path: Path, name: str, content: bytes, where: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ReferenceDataError) as info:
        list(read_records(path))
    message = str(info.value)
    assert name in message and where in message and "UTF-8" in message
    assert "\n" not in message


def test_unknown_text_column_lists_columns(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "r.csv", [["review", "stars"], ["x", "5"]])
    with pytest.raises(ReferenceDataError, match=r"unknown text column 'text'.*'review', 'stars'"):
        list(read_records(path))
    pqp = tmp_path / "r.parquet"
    pq.write_table(pa.table({"body": ["x"]}), pqp)
    with pytest.raises(ReferenceDataError, match=r"available columns: 'body'"):
        list(read_records(pqp))


def test_jsonl_has_no_schema_keys_never_refuse(tmp_path: Path) -> None:
    """JSONL has no schema: a text or label key that occurs in no record is not refused (its
    neighbour with the key in one record would be read); it is reported for a warning."""
    jl = write_jsonl(tmp_path / "r.jsonl", [{"body": "x"}, {"body": "y"}])
    stats = ReadStats()
    records = list(read_records(jl, columns=("stars",), stats=stats))
    assert [r.text for r in records] == [None, None]
    assert [r.labels for r in records] == [{"stars": ""}, {"stars": ""}]
    assert stats.skipped_by_reason == {"missing": 2}
    assert stats.absent_columns == ("text", "stars")
    # the neighbour where one record has both keys: read the same way, nothing refused
    nb = write_jsonl(tmp_path / "n.jsonl", [{"body": "x"}, {"text": "t", "stars": 5}])
    stats = ReadStats()
    records = list(read_records(nb, columns=("stars",), stats=stats))
    assert [r.index for r in records] == [0, 1] and records[1].text == "t"
    assert stats.absent_columns == ()


@pytest.mark.parametrize("ext,delim", [(".csv", ","), (".tsv", "\t")])
def test_every_line_after_the_header_is_a_row(tmp_path: Path, ext: str, delim: str) -> None:
    """The final line ending is not a row; an extra empty line is one (all fields missing);
    empty lines before the header are not rows."""
    path = tmp_path / f"r{ext}"
    cases = {
        "text\na\n": ["a"],
        "text\na": ["a"],
        "text\na\n\n": ["a", None],
        "text\n\na\n": [None, "a"],
        "\n\ntext\na\n": ["a"],
        "text\r\na\r\n\r\nb\r\n": ["a", None, "b"],
        'text\n""\n': [None],
        "text\n\n\n": [None, None],
    }
    for raw, texts in cases.items():
        path.write_text(raw.replace("text", f"text{delim}label"), encoding="utf-8", newline="")
        records, stats = load_references(path, columns=("label",))
        assert [r.text for r in records] == texts, raw
        assert [r.index for r in records] == list(range(len(texts)))
        assert stats.rows_seen == len(texts)


def test_unknown_group_by_column(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "r.csv", [["text", "stars"], ["x", "5"]])
    with pytest.raises(ReferenceDataError, match=r"unknown group-by.*'category'.*'text', 'stars'"):
        list(read_records(path, columns=("stars", "category")))


def test_missing_empty_and_unsupported(tmp_path: Path) -> None:
    with pytest.raises(ReferenceDataError, match="no such file"):
        read_records(tmp_path / "nope.csv")
    empty = tmp_path / "empty.csv"
    empty.write_bytes(b"")
    with pytest.raises(ReferenceDataError, match="empty file"):
        load_references(empty)
    with pytest.raises(ReferenceDataError, match=r"unsupported extension '\.xlsx'"):
        read_records(tmp_path / "r.xlsx")
    with pytest.raises(ReferenceDataError, match="unsupported format"):
        read_records(empty, fmt="xml")
    header_only = tmp_path / "h.csv"
    header_only.write_text("text,stars\n", encoding="utf-8")
    with pytest.raises(ReferenceDataError, match="no data rows"):
        load_references(header_only)
    blank = write_csv(tmp_path / "blank.csv", [["text"], [""], ["  "]])
    with pytest.raises(ReferenceDataError, match=r"no usable references.*blank: 2"):
        load_references(blank, on_unusable="skip")


def test_all_blank_references_are_not_refused(tmp_path: Path) -> None:
    """Under the null rule a file of blank rows is the neighbour of one with a usable row:
    refusing it (and not its neighbour) would release whether that row is blank."""
    blank = write_csv(tmp_path / "blank.csv", [["text"], [""], ["  "]])
    one = write_csv(tmp_path / "one.csv", [["text"], [""], ["hello"]])
    records, stats = load_references(blank)
    assert [r.text for r in records] == [None, None] and stats.used == 0
    assert [r.text for r in load_references(one)[0]] == [None, "hello"]


def test_errors_are_value_errors() -> None:
    assert issubclass(ReferenceDataError, ValueError)


# ---------------------------------------------------------------------------- limit


@pytest.mark.parametrize("on_unusable", ["null", "skip"])
def test_limit_stops_early(tmp_path: Path, on_unusable: str) -> None:
    # Rows after the limit are undecodable: reading them would raise.
    path = tmp_path / "big.csv"
    path.write_bytes(b'text\na\n""\nb\nc\nd\n' + b"\xff\xff\n" * 1000)
    records, stats = load_references(path, limit=3, on_unusable=on_unusable)  # type: ignore[arg-type]
    assert len(records) == 3
    if on_unusable == "null":
        assert [r.text for r in records] == ["a", None, "b"]
        assert stats.rows_seen == 3
    else:
        assert [r.text for r in records] == ["a", "b", "c"]
        assert stats.rows_seen == 4 and stats.skipped_by_reason == {"blank": 1}
    with pytest.raises(ReferenceDataError, match="line 7"):
        load_references(path)
    with pytest.raises(ValueError, match="limit"):
        load_references(path, limit=0)


def test_read_records_is_lazy(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    path.write_bytes(b'{"text": "a"}\n' * 5 + b"\xff\n")
    iterator = read_records(path)
    assert [next(iterator).text for _ in range(5)] == ["a"] * 5
    with pytest.raises(ReferenceDataError, match="line 6"):
        next(iterator)


# ---------------------------------------------------------------------------- misc


def test_file_digest(tmp_path: Path) -> None:
    path = tmp_path / "x.bin"
    data = bytes(range(256)) * 5000
    path.write_bytes(data)
    assert file_digest(path, chunk_size=1000) == hashlib.sha256(data).hexdigest()
    with pytest.raises(ReferenceDataError, match="no such file"):
        file_digest(tmp_path / "missing")


def test_demo_corpus() -> None:
    path = demo_corpus_path()
    assert path.is_file() and path.suffix == ".jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 42
    objs = [json.loads(line) for line in lines]
    assert all(set(o) >= {"text", "stars"} for o in objs)
    assert {o["stars"] for o in objs} == {"1.0", "2.0", "3.0", "4.0", "5.0"}
    assert len({o["text"] for o in objs}) == 42
    assert all(1 <= o["text"].count(".") + o["text"].count("!") <= 3 for o in objs)
    records, stats = load_references(path, columns=("stars",))
    assert len(records) == 42 and stats.used == 42 and not stats.skipped_by_reason


@pytest.mark.parametrize("ext,delim", [(".csv", ","), (".tsv", "\t")])
def test_unbalanced_quote_is_refused(tmp_path: Path, ext: str, delim: str) -> None:
    """A quoted field that is never closed would swallow the rest of the file as one
    reference: the file is not valid CSV (outside the input domain) and is refused, naming the
    line where the quote opened, even when a row limit stops reading at that row."""
    path = tmp_path / f"q{ext}"
    path.write_text(f"text{delim}label\nfine{delim}a\n\"broken start{delim}b\nmore\nlast\n")
    with pytest.raises(ReferenceDataError, match="line 3: a quoted field") as info:
        load_references(path, columns=("label",))
    assert "\n" not in str(info.value)
    with pytest.raises(ReferenceDataError, match="line 3"):
        load_references(path, limit=2)
    assert [r.text for r in load_references(path, limit=1)[0]] == ["fine"]
    # a quoted field over several lines that is closed is fine, with or without a final newline
    for tail in ("", "\n"):
        ok = tmp_path / f"ok{ext}"
        ok.write_text(f'text\nfine\n"quoted\nover lines"\nlast{tail}')
        assert [r.text for r in load_references(ok)[0]] == ["fine", "quoted\nover lines", "last"]


@pytest.mark.parametrize("ext,delim", [(".csv", ","), (".tsv", "\t")])
def test_a_stray_quote_is_refused_not_merged(tmp_path: Path, ext: str, delim: str) -> None:
    """A stray quote on line 12 that a later quote "closes" mid-field would merge two rows (20
    rows from 21 lines, raw ``""A""`` left inside), and a lenient reader reads
    ``"a "quoted" word"`` as ``a quoted" word"``. Quoting is strict: both are errors naming the
    line."""
    lines = ["text"] + [f"review {i}" for i in range(1, 11)]
    lines += ['"never closed', '"Great ""A"" rating"'] + [f"more {i}" for i in range(8)]
    path = tmp_path / f"stray{ext}"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ReferenceDataError, match="line 13: malformed CSV quoting") as info:
        load_references(path)
    assert "opened on line 12" in str(info.value) and "\n" not in str(info.value)
    inner = tmp_path / f"inner{ext}"
    inner.write_text('text\n"a "quoted" word"\nnext\n')
    with pytest.raises(ReferenceDataError, match="line 2: malformed CSV quoting"):
        load_references(inner)
    # well-formed quotes still read as before: doubled quotes, and a quote in an unquoted field
    ok = tmp_path / f"ok{ext}"
    ok.write_text('text\n"a ""quoted"" word"\na "bare" quote\n')
    assert [r.text for r in load_references(ok)[0]] == ['a "quoted" word', 'a "bare" quote']

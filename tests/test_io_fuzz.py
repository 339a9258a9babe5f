"""Fuzz the reference readers: any input ends in a clean one-line error or valid references.

"Valid references" means what the generation pipeline relies on: records numbered 0, 1, 2...
in file order, each text either None (the null reference) or a non-blank string that encodes as
UTF-8, labels that are strings, and read statistics that add up. Anything else that escapes
(an OverflowError, a RecursionError, a csv.Error, a UnicodeEncodeError later...) fails the test.
"""

from __future__ import annotations

import io
import itertools
import json
import string
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dplang.io import ReadStats, ReferenceDataError, load_references

FUZZ = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

#: Characters that matter to the parsers: quotes, delimiters, line ends, braces, NUL, BOM,
#: surrogates (as JSON escapes), non-ASCII.
_SPECIAL = '"\',\t\n\r{}[]:\\\x00\ufeff\u2028 é中'
_TEXT = st.text(alphabet=st.sampled_from(string.ascii_letters[:6] + _SPECIAL), max_size=40)


def _check(path: Path, columns: tuple[str, ...] = ()) -> None:
    """The property: a clean ReferenceDataError (one line) or valid references."""
    try:
        records, stats = load_references(path, "text", columns)
    except ReferenceDataError as exc:
        message = str(exc)
        assert message and "\n" not in message, message
        return
    assert isinstance(stats, ReadStats)
    assert [r.index for r in records] == list(range(len(records)))
    assert stats.rows_seen == len(records) == stats.used + stats.unusable
    for r in records:
        if r.text is not None:
            assert isinstance(r.text, str) and r.text.strip()
            r.text.encode("utf-8")  # no lone surrogate
        assert set(r.labels) == set(columns)
        for value in r.labels.values():
            assert isinstance(value, str)
            value.encode("utf-8")
    json.dumps([r.text for r in records], ensure_ascii=False).encode("utf-8")


_COUNTER = itertools.count()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _file(folder: Path, suffix: str, data: bytes) -> Path:
    path = folder / f"refs{next(_COUNTER)}{suffix}"
    path.write_bytes(data)
    return path


@FUZZ
@given(raw=st.binary(max_size=300), suffix=st.sampled_from([".csv", ".tsv", ".jsonl", ".txt",
                                                              ".parquet"]))
def test_random_bytes(folder: Path, raw: bytes, suffix: str) -> None:
    _check(_file(folder, suffix, raw))


@FUZZ
@given(header=st.lists(st.sampled_from(["text", "label", "x", '"text"', ""]), min_size=1,
                       max_size=3),
       rows=st.lists(st.lists(_TEXT, max_size=4), max_size=8),
       sep=st.sampled_from([",", "\t"]), eol=st.sampled_from(["\n", "\r\n", ""]))
def test_delimited_text(folder: Path, header: list[str], rows: list[list[str]], sep: str,
                        eol: str) -> None:
    body = sep.join(header) + "\n" + "\n".join(sep.join(r) for r in rows) + eol
    suffix = ".csv" if sep == "," else ".tsv"
    path = _file(folder, suffix, body.encode("utf-8", "surrogatepass"))
    _check(path)
    _check(path, ("label",))


_JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=8)


@FUZZ
@given(objects=st.lists(st.one_of(
    st.fixed_dictionaries({"text": _JSON_VALUE}, optional={"label": _JSON_VALUE}),
    _JSON_VALUE), max_size=6),
    junk=st.lists(st.sampled_from(["", "   ", "{", "[" * 3000 + "]" * 3000, '"\\ud800"',
                                   '{"text": "\\ud800"}', '{"text": "ok", "label": "\\udfff"}',
                                   '{"text": "ok", "label": {"a": ["\\ud800"]}}',
                                   "nul\x00", "1e999999"]), max_size=2))
def test_jsonl(folder: Path, objects: list[object], junk: list[str]) -> None:
    lines = [json.dumps(o) for o in objects] + junk
    path = _file(folder, ".jsonl", "\n".join(lines).encode("utf-8", "surrogatepass"))
    _check(path)
    _check(path, ("label",))


@FUZZ
@given(lines=st.lists(_TEXT, max_size=10))
def test_text_lines(folder: Path, lines: list[str]) -> None:
    _check(_file(folder, ".txt", "\n".join(lines).encode("utf-8", "surrogatepass")))


@FUZZ
@given(texts=st.lists(st.one_of(st.none(), _TEXT), max_size=8),
       kind=st.sampled_from(["string", "large_string", "binary", "int64", "null"]),
       truncate=st.integers(min_value=0, max_value=64))
def test_parquet(folder: Path, texts: list[str | None], kind: str, truncate: int) -> None:
    if kind == "int64":
        column = pa.array([len(t) if t is not None else None for t in texts], pa.int64())
    elif kind == "binary":
        column = pa.array([t.encode("utf-8", "surrogatepass") + b"\xff"[: len(t) % 2]
                           if t is not None else None for t in texts], pa.binary())
    elif kind == "null":
        column = pa.nulls(len(texts))
    else:
        column = pa.array([t.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
                           if t is not None else None for t in texts], getattr(pa, kind)())
    sink = io.BytesIO()
    pq.write_table(pa.table({"text": column, "label": pa.array([str(i) for i in
                                                                range(len(texts))])}), sink)
    raw = sink.getvalue()
    path = _file(folder, ".parquet", raw[: len(raw) - truncate] if truncate else raw)
    _check(path)
    _check(path, ("label",))

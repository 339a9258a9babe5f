"""Read private references from CSV, TSV, JSONL, Parquet, Arrow, saved Hugging Face datasets
or plain text, streaming.

(Over 500 lines on purpose: every command reads private rows through this one skip rule and
row numbering — ``docs/privacy.md``, "Input domain" — so all formats stay together.)

Formats (chosen by extension, or by an explicit ``fmt=``):

=================  ============  ========================================================
extension          ``fmt``       how rows are read
=================  ============  ========================================================
``.csv``           ``csv``       :mod:`csv` module, header row required, RFC 4180 quoting;
                                 every line after the header is a row (see below)
``.tsv``           ``tsv``       as CSV with a tab delimiter (same quoting rules)
``.jsonl``         ``jsonl``     one JSON object per line; blank lines are not rows; no
                                 schema (a missing key is a missing value, see below)
``.ndjson``
``.parquet``       ``parquet``   :meth:`pyarrow.parquet.ParquetFile.iter_batches`
``.arrow``         ``arrow``     an Arrow IPC file or stream (:mod:`dplang.arrow_sources`)
``.feather``
a folder           ``hf_dataset``  a ``datasets.Dataset`` saved with ``save_to_disk`` (its
                                 Arrow shards in order; ``datasets`` is not needed)
``.txt``           ``txt``       one reference per line (its only column is ``text``;
                                 ``text_column`` is ignored); a blank line is a row whose
                                 text is blank, so the skip rule below applies to it
=================  ============  ========================================================

CSV/TSV go through the :mod:`csv` module rather than pandas on purpose: pandas turns strings
such as ``"NA"`` or ``"null"`` into missing values and would silently change references.

**Rows of a CSV/TSV file** (:func:`iter_delimited_rows`, shared with ``dplang sample``). The
header is the first line holding a non-blank field; empty lines before it are not rows. After
the header, **every line is a row**: an empty line is a row whose fields are all missing (its
text is the null reference), kept in its place like any other row, because many tools write a
blank value of a one-column file as an empty line, and dropping it would move every later
reference (and change the number of rows) between a dataset and its replace-by-null
neighbour. The line ending that ends the file's last line is not a row: ``"text\\na\\n"``
has one row, ``"text\\na\\n\\n"`` two (the second empty). So a blank *last* value must be
written as an empty line that is itself ended (the file ends with two line endings) or as
``""`` (Python's :mod:`csv` writer does this for one empty field); a file without a final line
ending reads the same. A line is a CSV record: a quoted field may span lines.

**JSONL has no schema.** Each non-blank line is one record (a blank line is not a record:
no JSONL writer emits one for a null value). Which keys a record holds is data: a record
without the text key is the null reference (reason ``missing``), one without a label key has
the label ``""``, and no column is refused because of the keys records hold -- a refusal that
depends on one record's keys would tell its neighbours apart. A column that occurs in no
record is not refused either; it is reported in :attr:`ReadStats.absent_columns` so that the
command can warn the data holder (stderr).

**Skip rule** (the same for every format). A row's text is *unusable* when it is

* ``missing`` -- the column is absent from that row (short CSV row, empty CSV line, JSON
  object without the key) or the value is null (JSON ``null``, Parquet null);
* ``not_string`` -- the value is not a string (a JSON number, object, list, boolean; a
  non-string Parquet column);
* ``blank`` -- the string is empty or only whitespace.

Otherwise the text is kept verbatim, except that ``\\r\\n`` is normalised to ``\\n``.
Unusable rows are counted by reason in :class:`ReadStats` and handled according to
``on_unusable``:

* ``"null"`` (default) -- the row stays in its position as the *null reference*
  (``Record.text is None``); prompts render it exactly as the public prompt (``docs/privacy.md``
  invariant 1). This is what the paper's replace-by-null adjacency needs: replacing one
  reference by the empty one must not move any other reference to another batch, so a
  content-independent partition (Corollary 11) must not drop rows because they are blank.
* ``"skip"`` -- the row is dropped. Row indices of later records are unchanged, but
  position-based batching then depends on which rows were blank: use this only when the
  file is a cleaned data set in which no reference can be null.

Bytes that are not valid UTF-8 raise :class:`ReferenceDataError` naming the file and line
(or Parquet row); nothing is silently replaced. A UTF-8 byte-order mark is tolerated.
"""

from __future__ import annotations

import csv
import hashlib
import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, BinaryIO, Literal

__all__ = [
    "DATASET_FOLDER",
    "FORMATS",
    "ReadStats",
    "Record",
    "ReferenceDataError",
    "data_path_problem",
    "demo_corpus_path",
    "detect_format",
    "file_digest",
    "iter_delimited_rows",
    "iter_json_objects",
    "load_references",
    "read_records",
]

#: Extension -> format name.
FORMATS: dict[str, str] = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".arrow": "arrow",
    ".feather": "arrow",
    ".txt": "txt",
}
#: What ``--data`` accepts, for the commands' help (every format of :data:`FORMATS`).
DATA_FORMATS_HELP = ("CSV, TSV, JSONL (.jsonl, .ndjson), Parquet, Arrow (.arrow, .feather), "
                     "text (.txt: one per line) or a Hugging Face dataset saved with "
                     "save_to_disk (its folder)")
#: The format of a folder: a Hugging Face dataset saved with ``save_to_disk``.
DATASET_FOLDER = "hf_dataset"
_FMT_NAMES = frozenset(FORMATS.values()) | {DATASET_FOLDER}

#: Reasons a row's text is unusable (keys of ``ReadStats.skipped_by_reason``).
REASONS = ("missing", "not_string", "blank")

OnUnusable = Literal["null", "skip"]


class ReferenceDataError(ValueError):
    """A reference file cannot be read as asked; the message is one line."""


@dataclass(frozen=True)
class Record:
    """One row of a reference file.

    ``index`` is the 0-based position of the row among the file's data rows (header and, for
    JSONL, blank lines excluded), counting unusable rows too. ``text`` is the reference, or
    ``None`` for the null reference (an unusable row kept in place). ``labels`` holds the
    requested extra columns as strings (``""`` when absent or null).
    """

    index: int
    text: str | None
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class ReadStats:
    """Counts from one read.

    ``rows_seen``: data rows read. ``used``: rows with a usable text.
    ``skipped_by_reason``: unusable rows by reason (``missing``, ``not_string``, ``blank``);
    with ``on_unusable="null"`` these rows were kept as null references (``nulls`` of them),
    with ``"skip"`` they were dropped. ``absent_columns``: requested columns (text first) that
    occur in no record of a JSONL file, which has no schema (set once the file is read; the
    column is not refused, its values are missing). Every count here is a statistic of the
    private data: for the data holder's terminal and the private side file only.
    """

    rows_seen: int = 0
    used: int = 0
    skipped_by_reason: dict[str, int] = field(default_factory=dict)
    on_unusable: str = "null"
    absent_columns: tuple[str, ...] = ()

    @property
    def unusable(self) -> int:
        return sum(self.skipped_by_reason.values())

    @property
    def nulls(self) -> int:
        """Rows kept in position as null references."""
        return self.unusable if self.on_unusable == "null" else 0

    @property
    def records(self) -> int:
        """Records yielded (``used`` plus ``nulls``)."""
        return self.used + self.nulls

    def _count(self, reason: str) -> None:
        self.skipped_by_reason[reason] = self.skipped_by_reason.get(reason, 0) + 1

    def summary(self) -> str:
        parts = [f"{self.rows_seen} rows read", f"{self.used} usable"]
        if self.skipped_by_reason:
            verb = "kept as null" if self.on_unusable == "null" else "skipped"
            detail = ", ".join(f"{k}: {v}" for k, v in sorted(self.skipped_by_reason.items()))
            parts.append(f"{self.unusable} {verb} ({detail})")
        return "; ".join(parts)


# --------------------------------------------------------------------------------------------
# helpers


def detect_format(path: str | Path, fmt: str | None = None) -> str:
    """The format name for ``path`` (from ``fmt`` when given, else from the extension)."""
    if fmt is not None:
        name = fmt.lower().lstrip(".")
        name = FORMATS.get("." + name, name)
        if name not in _FMT_NAMES:
            raise ReferenceDataError(
                f"unsupported format {fmt!r}; choose one of {', '.join(sorted(_FMT_NAMES))}"
            )
        return name
    if Path(path).is_dir():
        return DATASET_FOLDER
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ReferenceDataError(
            f"{path}: unsupported extension {suffix or '(none)'!r}; "
            f"supported: {', '.join(FORMATS)} (or pass fmt=)"
        )
    return FORMATS[suffix]


def _classify(value: Any) -> tuple[str | None, str | None]:
    """(text, reason): exactly one of the two is None."""
    if value is None:
        return None, "missing"
    if isinstance(value, float) and value != value:  # NaN from a float column
        return None, "missing"
    if not isinstance(value, str):
        return None, "not_string"
    if not value.strip():
        return None, "blank"
    return value.replace("\r\n", "\n"), None


def _label_str(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if isinstance(value, str):
        return value.replace("\r\n", "\n")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 53:
        # 5.0 reads "5": a label is its own cell's, whatever the column's type (one missing
        # cell makes a column of integers floats in pandas, and must not turn every other
        # record's "5" into "5.0")
        return str(int(value))
    return str(value)


def _check_columns(
    path: Path, available: Sequence[str], text_column: str | None, columns: Sequence[str]
) -> None:
    shown = ", ".join(repr(c) for c in available) or "(none)"
    if text_column is not None and text_column not in available:
        raise ReferenceDataError(
            f"{path}: unknown text column {text_column!r}; available columns: {shown} (name "
            "the text column with --text-column)"
        )
    missing = [c for c in columns if c not in available]
    if missing:
        raise ReferenceDataError(
            f"{path}: unknown group-by/label column(s) {', '.join(map(repr, missing))}; "
            f"available columns: {shown}"
        )


def _decoded_lines(
    path: Path, handle: BinaryIO, error: type[Exception] | None = None
) -> Iterator[tuple[int, str]]:
    """(1-based line number, line with its ending) decoded strictly as UTF-8; an undecodable
    line raises ``error`` (default :class:`ReferenceDataError`) naming it."""
    for lineno, raw in enumerate(handle, start=1):
        if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            yield lineno, raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise (error or ReferenceDataError)(
                f"{path}: line {lineno} is not valid UTF-8 (byte offset {exc.start} in the line)"
            ) from None


#: Python refuses to convert integers of more digits than this (sys.int_info); JSON allows them.
_MAX_INT_DIGITS = 4000


def _parse_int(digits: str) -> int | float:
    """A JSON integer; one too long for Python is read as a float (inf when it overflows), so a
    record holding one is a non-string value like any number, never an exception."""
    if len(digits) > _MAX_INT_DIGITS:
        return float(digits)
    return int(digits)


def iter_json_objects(
    path: str | Path, error: type[Exception] | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(1-based line number, object) for every non-blank line of a JSONL file.

    The one JSONL reader of dplang (references, synthetic runs, tabular samples): a line that
    is not UTF-8, not JSON or not a JSON object raises ``error`` (default
    :class:`ReferenceDataError`) with a one-line message naming the file and line."""
    path = Path(path)
    fail = error or ReferenceDataError
    with path.open("rb") as handle:
        for lineno, line in _decoded_lines(path, handle, fail):
            if not line.strip():
                continue
            try:
                obj = json.loads(line, parse_int=_parse_int)
            except json.JSONDecodeError as exc:
                raise fail(
                    f"{path}: line {lineno}: invalid JSON ({exc.msg} at column {exc.colno})"
                ) from None
            except RecursionError:
                raise fail(f"{path}: line {lineno}: JSON nested too deeply") from None
            if not isinstance(obj, dict):
                raise fail(
                    f"{path}: line {lineno}: expected a JSON object, got {type(obj).__name__}"
                )
            yield lineno, obj


def data_path_problem(path: str | Path) -> str | None:
    """Why ``path`` cannot be a data input (one line), or None: it must be a file, or a folder
    holding one ``datasets.Dataset`` saved with ``save_to_disk``. Reads no row."""
    from .arrow_sources import dataset_folder_files

    path = Path(path)
    if not path.exists():
        return f"data file not found: {path}"
    if path.is_dir():
        try:
            dataset_folder_files(path, ReferenceDataError)
        except ReferenceDataError as exc:
            return str(exc)
        return None
    if not path.is_file():
        return f"{path} is not a file"
    return None


def _ensure_nonempty(path: Path) -> None:
    if not path.exists():
        raise ReferenceDataError(f"{path}: no such file")
    if path.is_dir():
        problem = data_path_problem(path)
        if problem is not None:
            raise ReferenceDataError(problem)
        return
    if not path.is_file():
        raise ReferenceDataError(f"{path}: not a regular file")
    if path.stat().st_size == 0:
        raise ReferenceDataError(f"{path}: empty file")


# --------------------------------------------------------------------------------------------
# per-format row iterators: yield (text value, {label column: raw value}) per data row


_CSV_FIELD_LIMIT_SET = False


def _raise_csv_field_limit() -> None:
    # The csv module refuses fields over 128 KiB by default; long documents (court cases,
    # clinical notes) exceed that. The limit is process-global, so raise it once.
    global _CSV_FIELD_LIMIT_SET
    if not _CSV_FIELD_LIMIT_SET:
        csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
        _CSV_FIELD_LIMIT_SET = True


#: Fed to the csv reader after the file's last line: if the reader is still inside a quoted
#: field at the end of the file, the marker ends up inside that field (an unbalanced quote);
#: otherwise it forms a row of its own, which is dropped. It contains a NUL and random-looking
#: text, so no data can hold it.
_EOF_MARKER = "\x00dplang-end-of-file-7c3e9a1f\x00"


def iter_delimited_rows(
    path: str | Path, delimiter: str = ",", error: type[Exception] | None = None
) -> Iterator[list[str]]:
    """The header row, then every data row of a CSV/TSV file, as lists of fields.

    The one delimited-file reader of dplang (references and tabular samples), so that both
    follow the same row rule (module docstring, "Rows of a CSV/TSV file"): the header is the
    first line that holds a non-blank field (empty lines before it are not rows); after it,
    **every line is a row** -- an empty line is the row ``[]``, whose fields are all missing --
    except that the line ending of the file's last line does not start another row. Quoted
    fields may span lines (RFC 4180). Quoting is read strictly: inside a quoted field a quote
    is doubled (``""``) or ends the field, followed by the delimiter or the line's end; a
    stray quote (``"a "quoted" word"``, or a field opened by mistake that a later quote
    "closes" mid-field) is an error, never a silently merged or altered row. Bytes that are
    not UTF-8, a quoted field that is never closed, or malformed CSV raise ``error`` (default
    :class:`ReferenceDataError`) with a one-line message naming the file and line; a file
    without a header raises it too.

    Privacy contract: which lines are rows depends on the file's layout only, never on a
    field's content, so blanking one value (replace-by-null) keeps every other row in place."""
    path = Path(path)
    fail = error or ReferenceDataError
    _raise_csv_field_limit()
    with path.open("rb") as handle:
        lines = _decoded_lines(path, handle, fail)
        current = [0]

        def feed() -> Iterator[str]:
            # One line behind the file, so that a last line without its line ending gets one
            # (the marker must not join its last field, and a separate "\n" would be an
            # empty line, i.e. a row).
            prev: tuple[int, str] | None = None
            for item in lines:
                if prev is not None:
                    current[0] = prev[0]
                    yield prev[1]
                prev = item
            if prev is not None:
                current[0] = prev[0]
                yield prev[1] if prev[1].endswith(("\n", "\r")) else prev[1] + "\n"
            yield _EOF_MARKER + "\n"

        # strict: a quote inside a quoted field must be doubled ("") or end the field; the
        # csv module's lenient default reads '"a "quoted" word"' as 'a quoted" word"' and lets
        # a stray quote that a later quote "closes" mid-field merge two rows
        reader = csv.reader(feed(), delimiter=delimiter, strict=True)
        row_start = [1]

        def unbalanced() -> Exception:
            return fail(
                f"{path}: line {row_start[0]}: a quoted field opened on this line is "
                "never closed (unbalanced \"); it would swallow the rest of the file as "
                'one value: fix the quoting (a literal " inside a quoted field is "")')

        def rows() -> Iterator[list[str]]:
            for row in reader:
                if row == [_EOF_MARKER]:
                    return
                if any(_EOF_MARKER in cell for cell in row):
                    raise unbalanced()
                yield row
                row_start[0] = current[0] + 1

        try:
            parsed = rows()
            header = next(parsed, None)
            while header is not None and not any(h.strip() for h in header):
                header = next(parsed, None)  # empty lines before the header are not rows
            if header is None:
                raise fail(f"{path}: empty file (no header row)")
            yield header
            # Every line after the header is a row, an empty one included ([]: all fields
            # missing): dropping it would shift every later row (a null reference written as
            # an empty line, as many tools write a one-column CSV, must keep its place).
            yield from parsed
        except csv.Error as exc:
            if "unexpected end of data" in str(exc):  # strict: end of file in a quoted field
                raise unbalanced() from None
            opened = (f" (in a quoted field opened on line {row_start[0]})"
                      if row_start[0] < current[0] else "")
            raise fail(
                f"{path}: line {current[0]}: malformed CSV quoting{opened}: {exc}; a literal \" "
                'inside a quoted field must be doubled ("")') from None


def _rows_delimited(
    path: Path, delimiter: str, text_column: str, columns: Sequence[str]
) -> Iterator[tuple[Any, dict[str, Any]]]:
    rows = iter_delimited_rows(path, delimiter)
    header = next(rows)
    _check_columns(path, header, text_column, columns)
    text_pos = header.index(text_column)
    label_pos = {c: header.index(c) for c in columns}
    for row in rows:
        text = row[text_pos] if text_pos < len(row) else None
        labels = {c: (row[i] if i < len(row) else None) for c, i in label_pos.items()}
        yield text, labels


def _unicode_text(path: Path, lineno: int, value: Any) -> Any:
    """``value``, refused when it is a string that is not Unicode text: a JSON escape such as
    ``"\\ud800"`` decodes to a lone surrogate, which no UTF-8 file can hold (the same domain
    rule as undecodable bytes)."""
    text = value if isinstance(value, str) else (
        json.dumps(value, ensure_ascii=False) if isinstance(value, (dict, list)) else None)
    if text is not None:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ReferenceDataError(
                f"{path}: line {lineno}: a string holds an unpaired surrogate escape (not "
                "Unicode text)") from None
    return value


def _rows_jsonl(
    path: Path, text_column: str, columns: Sequence[str], stats: ReadStats
) -> Iterator[tuple[Any, dict[str, Any]]]:
    # JSONL has no schema: which keys a record holds is data. A record without the text key is
    # the null reference (reason ``missing``), one without a label key has the label "", and no
    # column is ever refused because of the keys records hold (a first record without its text
    # would otherwise be refused and its neighbour with the text not). Columns that occur in
    # no record are reported in ``stats.absent_columns`` (for a warning to the data holder).
    wanted = (text_column, *columns)
    seen: set[str] = set()
    any_object = False
    for lineno, obj in iter_json_objects(path):
        any_object = True
        seen.update(c for c in wanted if c in obj)
        yield (_unicode_text(path, lineno, obj.get(text_column)),
               {c: _unicode_text(path, lineno, obj.get(c)) for c in columns})
    if not any_object:
        raise ReferenceDataError(f"{path}: empty file (no JSON objects)")
    stats.absent_columns = tuple(c for c in dict.fromkeys(wanted) if c not in seen)


def _rows_txt(path: Path) -> Iterator[tuple[Any, dict[str, Any]]]:
    with path.open("rb") as handle:
        for _lineno, line in _decoded_lines(path, handle):
            yield line.rstrip("\n").rstrip("\r"), {}


def _rows_arrow(
    path: Path, fmt: str, text_column: str, columns: Sequence[str], chunk_rows: int
) -> Iterator[tuple[Any, dict[str, Any]]]:
    """Rows of a Parquet file, an Arrow IPC file or a saved Hugging Face dataset."""
    import pyarrow as pa

    from .arrow_sources import open_arrow_source

    source = open_arrow_source(path, fmt, ReferenceDataError)
    names = list(source.schema.names)
    _check_columns(path, names, text_column, columns)
    text_type = source.schema.field(text_column).type
    if not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type)
            or pa.types.is_binary(text_type) or pa.types.is_large_binary(text_type)
            or pa.types.is_null(text_type)):
        # Decided by the file's schema (public), not by the values.
        raise ReferenceDataError(
            f"{path}: column {text_column!r} holds {text_type}, not text; choose the text "
            "column with --text-column"
        )
    wanted = list(dict.fromkeys([text_column, *columns]))
    start = 0
    try:
        for batch in source.iter_batches(wanted, chunk_rows):
            data = {}
            for name in wanted:
                col = batch.column(batch.schema.get_field_index(name))
                if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
                    data[name] = _decode_binary_column(path, col.to_pylist(), start)
                else:
                    data[name] = col.to_pylist()
            for i in range(batch.num_rows):
                yield data[text_column][i], {c: data[c][i] for c in columns}
            start += batch.num_rows
    except pa.ArrowException as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ReferenceDataError(
            f"{path}: cannot read rows from row {start} ({first_line})"
        ) from None


def _decode_binary_column(path: Path, values: list[Any], start: int) -> list[Any]:
    out: list[Any] = []
    for i, value in enumerate(values):
        if value is None:
            out.append(None)
            continue
        try:
            out.append(value.decode("utf-8"))
        except UnicodeDecodeError:
            raise ReferenceDataError(f"{path}: row {start + i} is not valid UTF-8") from None
    return out


# --------------------------------------------------------------------------------------------
# public API


def read_records(
    path: str | Path,
    text_column: str = "text",
    columns: Sequence[str] = (),
    *,
    fmt: str | None = None,
    on_unusable: OnUnusable = "null",
    stats: ReadStats | None = None,
    chunk_rows: int = 4096,
) -> Iterator[Record]:
    """Stream the rows of a reference file as :class:`Record` objects, in file order.

    ``columns`` are extra columns (group-by labels, metadata) copied into ``Record.labels``.
    Pass a :class:`ReadStats` as ``stats`` to have it filled while iterating. Existence,
    emptiness and format are checked at the call; column names when iteration starts. A file
    without data rows (or, with the skip rule, without usable text) raises
    :class:`ReferenceDataError` once it is exhausted.
    See the module docstring for the skip rule and ``on_unusable``.
    """
    path = Path(path)
    name = detect_format(path, fmt)
    if on_unusable not in ("null", "skip"):
        raise ValueError(f"on_unusable must be 'null' or 'skip', not {on_unusable!r}")
    columns = tuple(columns)
    if len(set(columns)) != len(columns):
        raise ReferenceDataError(f"{path}: duplicate label columns in {columns!r}")
    _ensure_nonempty(path)
    if stats is None:
        stats = ReadStats()
    stats.on_unusable = on_unusable
    return _iterate(path, name, text_column, columns, on_unusable, stats, chunk_rows)


def _iterate(
    path: Path,
    name: str,
    text_column: str,
    columns: tuple[str, ...],
    on_unusable: str,
    stats: ReadStats,
    chunk_rows: int,
) -> Iterator[Record]:
    rows: Iterable[tuple[Any, dict[str, Any]]]
    if name == "csv":
        rows = _rows_delimited(path, ",", text_column, columns)
    elif name == "tsv":
        rows = _rows_delimited(path, "\t", text_column, columns)
    elif name == "jsonl":
        rows = _rows_jsonl(path, text_column, columns, stats)
    elif name in ("parquet", "arrow", DATASET_FOLDER):
        rows = _rows_arrow(path, name, text_column, columns, chunk_rows)
    else:
        if columns:
            raise ReferenceDataError(
                f"{path}: unknown group-by/label column(s) {', '.join(map(repr, columns))}; "
                "a .txt file has only the column 'text'"
            )
        rows = _rows_txt(path)
    for value, raw_labels in rows:
        index = stats.rows_seen
        stats.rows_seen += 1
        text, reason = _classify(value)
        if reason is not None:
            stats._count(reason)
            if on_unusable == "skip":
                continue
        else:
            stats.used += 1
        labels = {c: _label_str(v) for c, v in raw_labels.items()}
        yield Record(index=index, text=text, labels=labels)
    _check_usable(path, stats)


def _check_usable(path: Path, stats: ReadStats) -> None:
    """Refuse a file with no data rows, or (skip rule) no usable row.

    Under the null rule (private references) a file whose rows are all unusable is *not*
    refused: it is a neighbour of a file with one usable row, and refusing one but not the other
    would release whether that row is blank. Its references are all empty."""
    if stats.rows_seen == 0:
        raise ReferenceDataError(f"{path}: no data rows")
    if stats.used == 0 and stats.on_unusable == "skip":
        raise ReferenceDataError(f"{path}: no usable references ({stats.summary()})")


def load_references(
    path: str | Path,
    text_column: str = "text",
    columns: Sequence[str] = (),
    limit: int | None = None,
    *,
    fmt: str | None = None,
    on_unusable: OnUnusable = "null",
) -> tuple[list[Record], ReadStats]:
    """Read records into a list, stopping as soon as ``limit`` records were read.

    ``limit`` counts returned records: with ``on_unusable="skip"`` these are usable rows;
    with ``"null"`` they are rows (null references included), so the rows read are the first
    ``limit`` rows of the file whatever their content. The rest of the file is not read.
    Raises :class:`ReferenceDataError` for a file without data rows and, with the skip rule,
    when no usable reference was found (see :func:`_check_usable`).
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    stats = ReadStats()
    records: list[Record] = []
    iterator = read_records(
        path, text_column, columns, fmt=fmt, on_unusable=on_unusable, stats=stats
    )
    try:
        for record in iterator:
            records.append(record)
            if limit is not None and len(records) >= limit:
                break
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
    _check_usable(Path(path), stats)
    return records, stats


def file_digest(path: str | Path, chunk_size: int = 1 << 20) -> str:
    """Hex SHA-256 of the file's bytes, read in chunks (the data's content identity in the
    private side file and the ledger); of a saved Hugging Face dataset (a folder), the bytes of
    its Arrow shards in row order."""
    from .arrow_sources import source_files

    digest = hashlib.sha256()
    try:
        for file in source_files(path):
            with Path(file).open("rb") as handle:
                while chunk := handle.read(chunk_size):
                    digest.update(chunk)
    except (FileNotFoundError, ValueError):
        raise ReferenceDataError(f"{path}: no such file") from None
    return digest.hexdigest()


def demo_corpus_path() -> Path:
    """Path of the built-in demo corpus: 42 short fictional restaurant/café reviews (JSONL).

    Keys per line: ``text``, ``stars`` (``"1.0"`` .. ``"5.0"``) and ``category``
    (``"Restaurants"``). Written for this project; it contains no real reviews.
    """
    resource = resources.files("dplang").joinpath("data", "demo_reviews.jsonl")
    path = Path(str(resource))
    if not path.is_file():  # e.g. installed from a zip archive
        raise ReferenceDataError(f"demo corpus not found as a file at {resource}")
    return path

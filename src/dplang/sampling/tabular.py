"""Declared binary, categorical and integer columns of a table, as records for the samplers.

Reading: CSV and TSV through :func:`dplang.io.iter_delimited_rows`, the reader ``generate``
uses, with every cell kept as a string ("NA" or "null" stay strings) and the same row rule:
after the header **every line is a row**, an empty line being a row whose cells are all missing
(they take the fallback below), so blanking a row never removes it; JSONL line by line with
:mod:`json` (values keep their JSON types; JSONL has no schema: a missing key is a missing cell,
and a column is never refused because of which keys records hold, even one that occurs in no
record — the command warns the data holder instead); Parquet, Arrow files and Hugging Face
datasets saved with ``save_to_disk`` through pyarrow (:mod:`dplang.arrow_sources`; the schema
is public). A record is the tuple of the selected columns of one row.

Column types are declared, never inferred. A sampler over records needs the *universe* of
possible records, and the privacy guarantee holds only if that universe is public: if the
categories — or even the type of a column — were read from the data, a value held by a single
person could change the universe (a column whose values happen to be 0/1 would be binary, its
neighbour with one "2" would be something else) and the output could exist for one dataset and
not for its neighbour (an unbounded privacy loss; ``docs/privacy.md`` invariant 4). Every column
must be declared (:func:`parse_column`, :func:`load_schema`; CLI ``--binary``, ``--domain``,
``--schema``):

* ``binary``: the universe {0, 1};
* ``categorical``: the declared values, in the declared order (``--domain COL=a,b,c``);
* ``integer``: the declared range lo..hi (``--domain COL=lo..hi``).

**Out-of-domain values follow a public rule** (``out_of_domain="map"``, the default), applied to
each cell alone, so neighbouring datasets stay neighbours and the guarantee holds for the raw
data: a numeric cell of a binary or integer column is rounded (half up) and clipped into the
range ([0, 1] or [lo, hi]); ``1``/``true``/``1.0`` and ``0``/``false``/``0.0`` are binary
tokens; any other cell — a missing one, text in a numeric column, an undeclared category — takes
the column's *fallback*: the first declared value unless another is declared (``0`` for binary
columns, lo for integer ones). How many cells were mapped is a statistic of the data: it goes to
the private side file only. ``out_of_domain="refuse"`` refuses such data instead, with a
one-line error; that refusal itself depends on the data (whether it fits the schema), so it is
for data the holder has already validated, not for a pipeline whose failures others can see.

Validation errors are :class:`SamplingDataError` with a one-line message.
"""

from __future__ import annotations

import datetime
import json
import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import numpy as np

from ..io import iter_delimited_rows, iter_json_objects

__all__ = [
    "BINARY_FALSE",
    "BINARY_TRUE",
    "KINDS",
    "OUT_OF_DOMAIN",
    "CategoricalTable",
    "ColumnSpec",
    "SamplingDataError",
    "binary_column",
    "declare_column",
    "load_schema",
    "load_table",
    "parse_column",
    "parse_domain",
]

BINARY_TRUE = frozenset({"1", "true", "1.0"})
BINARY_FALSE = frozenset({"0", "false", "0.0"})
KINDS = ("binary", "categorical", "integer")
OUT_OF_DOMAIN = ("map", "refuse")
_FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl",
            ".parquet": "parquet", ".arrow": "arrow", ".feather": "arrow"}
_MAX_RANGE = 10**6


class SamplingDataError(ValueError):
    """The data cannot be used as asked; the message is one line."""


@dataclass(frozen=True)
class ColumnSpec:
    """One declared column: ``kind`` is ``"binary"`` (values ("0", "1")), ``"categorical"``
    (the declared ``values``, in the declared order) or ``"integer"`` (``values`` = the
    range lo..hi as strings); ``fallback`` is the value an out-of-domain cell maps to."""

    name: str
    kind: str
    values: tuple[str, ...]
    fallback: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise SamplingDataError(f"column {self.name!r}: unknown type {self.kind!r}")
        if not self.values:
            raise SamplingDataError(f"column {self.name!r}: empty domain")
        if not self.fallback:
            object.__setattr__(self, "fallback", self.values[0])
        if self.fallback not in self.values:
            raise SamplingDataError(f"column {self.name!r}: fallback {self.fallback!r} is not "
                                    "one of its declared values")

    @property
    def size(self) -> int:
        return len(self.values)

    def describe(self) -> dict[str, Any]:
        """The public declaration (for manifests)."""
        return {"name": self.name, "kind": self.kind, "values": list(self.values),
                "fallback": self.fallback}


@dataclass(frozen=True)
class CategoricalTable:
    """Encoded records: ``codes[i, c]`` is the index of row i's value in column c's values.

    ``mapped`` counts, per column, the cells that were out of the declared domain and were
    mapped by the public rule: a statistic of the private data (private side file only).
    ``absent`` names the columns that occur in no record of a JSONL file (every cell took the
    fallback); also a statistic of the data, for the data holder's terminal only."""

    columns: tuple[ColumnSpec, ...]
    codes: np.ndarray
    mapped: Mapping[str, int] = field(default_factory=dict)
    absent: tuple[str, ...] = ()

    @property
    def n(self) -> int:
        return int(self.codes.shape[0])

    @property
    def all_binary(self) -> bool:
        return all(c.kind == "binary" for c in self.columns)

    @property
    def universe_size(self) -> int:
        """k = Π_c |values_c|: the number of possible records."""
        return math.prod(c.size for c in self.columns)

    def joint_codes(self) -> np.ndarray:
        """Each record as one integer in [0, k) (mixed radix, first column most significant)."""
        out = np.zeros(self.n, dtype=np.int64)
        for j, col in enumerate(self.columns):
            out = out * col.size + self.codes[:, j]
        return out

    def decode_joint(self, z: np.ndarray) -> list[tuple[str, ...]]:
        """Inverse of :meth:`joint_codes` for an array of element indices."""
        rows = []
        for v in np.asarray(z, dtype=np.int64):
            vals = []
            rest = int(v)
            for col in reversed(self.columns):
                rest, r = divmod(rest, col.size)
                vals.append(col.values[r])
            rows.append(tuple(reversed(vals)))
        return rows

    def binary_matrix(self) -> np.ndarray:
        """The (n, d) 0/1 matrix (all columns must be binary)."""
        if not self.all_binary:
            raise SamplingDataError("product samplers need binary columns only")
        return self.codes.astype(np.uint8)

    def decode_binary(self, y: np.ndarray) -> list[tuple[str, ...]]:
        return [tuple(str(int(b)) for b in row) for row in np.asarray(y)]


def _range_values(spec: str, lo_s: str, hi_s: str) -> tuple[str, ...]:
    try:
        lo, hi = int(lo_s), int(hi_s)
    except ValueError:
        raise SamplingDataError(f"--domain {spec!r}: a range must be two integers lo..hi"
                                ) from None
    if hi < lo or hi - lo > _MAX_RANGE:
        raise SamplingDataError(f"--domain {spec!r}: empty or too large range")
    return tuple(str(v) for v in range(lo, hi + 1))


def _list_values(spec: str, items: Sequence[Any]) -> tuple[str, ...]:
    values = tuple(str(v).strip() for v in items)
    if not values or any(v == "" for v in values):
        raise SamplingDataError(f"--domain {spec!r}: empty category")
    if len(set(values)) != len(values):
        raise SamplingDataError(f"--domain {spec!r}: repeated category")
    return values


def parse_domain(spec: str) -> tuple[str, tuple[str, ...]]:
    """``"COL=a,b,c"`` → ("COL", ("a", "b", "c")); ``"COL=1..5"`` → ("COL", ("1", …, "5"))."""
    column = parse_column(spec)
    return column.name, column.values


def parse_column(spec: str, fallback: str | None = None) -> ColumnSpec:
    """A ``--domain`` declaration: ``COL=a,b,c`` (categorical) or ``COL=lo..hi`` (integer)."""
    if "=" not in spec:
        raise SamplingDataError(f"--domain {spec!r}: expected COLUMN=v1,v2,... or COLUMN=lo..hi")
    name, _, rest = spec.partition("=")
    name = name.strip()
    if not name:
        raise SamplingDataError(f"--domain {spec!r}: empty column name")
    if ".." in rest and "," not in rest:
        lo_s, _, hi_s = rest.partition("..")
        return ColumnSpec(name, "integer", _range_values(spec, lo_s, hi_s), fallback or "")
    return ColumnSpec(name, "categorical", _list_values(spec, rest.split(",")), fallback or "")


def binary_column(name: str, fallback: str | None = None) -> ColumnSpec:
    """A declared binary column (universe {0, 1}; out-of-domain cells map to ``fallback``,
    default 0)."""
    return ColumnSpec(name, "binary", ("0", "1"), fallback or "0")


def load_schema(path: str | Path) -> dict[str, ColumnSpec]:
    """Read a public schema file (TOML)::

        [columns]
        smoker = "binary"
        region = ["north", "south", "east", "west"]
        age_band = "1..9"

        [fallback]            # optional: where out-of-domain cells go
        region = "west"

    The schema is public: it is read without the data."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SamplingDataError(f"--schema {path}: no such file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SamplingDataError(f"--schema {path}: {first}") from None
    columns = raw.get("columns")
    fallbacks = raw.get("fallback", {})
    if not isinstance(columns, dict) or not columns:
        raise SamplingDataError(f"--schema {path}: needs a [columns] table")
    if not isinstance(fallbacks, dict) or set(fallbacks) - set(columns):
        raise SamplingDataError(f"--schema {path}: [fallback] names columns not in [columns]")
    out: dict[str, ColumnSpec] = {}
    for name, decl in columns.items():
        fb = None if name not in fallbacks else str(fallbacks[name])
        try:
            out[name] = declare_column(name, decl, fb)
        except TypeError:
            raise SamplingDataError(f"--schema {path}: column {name!r} must be \"binary\", "
                                    "\"lo..hi\" or a list of values") from None
    return out


def declare_column(name: str, decl: Any, fallback: str | None = None) -> ColumnSpec:
    """A column declared as a schema declares it: ``"binary"``, ``"lo..hi"`` (an integer
    range; also a Python ``range`` of step 1) or a list of categories. ``TypeError`` for any
    other declaration; :class:`SamplingDataError` for a bad one of these kinds."""
    if isinstance(decl, range) and decl.step == 1 and len(decl):
        decl = f"{decl.start}..{decl.stop - 1}"
    if decl == "binary":
        return binary_column(name, fallback)
    if isinstance(decl, str) and ".." in decl:
        return parse_column(f"{name}={decl}", fallback)
    if isinstance(decl, (list, tuple)):
        return ColumnSpec(name, "categorical", _list_values(f"{name}=…", list(decl)),
                          fallback or "")
    raise TypeError(f"column {name!r}: a declaration is 'binary', 'lo..hi' or a list")


def _cell_string(value: Any) -> str | None:
    """The canonical string of a cell, or None when missing."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if value != value:
            return None
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, str):
        return value.strip() if value.strip() else None
    if isinstance(value, Decimal):  # a Parquet decimal reads as its number ("5.00")
        return str(value)
    if isinstance(value, (datetime.date, datetime.time)):  # datetimes are dates
        return value.isoformat()
    # any other cell (a list, a dict; a Parquet timestamp, date, decimal or binary) gets a
    # string by one rule that never raises: a cell's type must not decide whether a release
    # happens (a crash on one record's cell is visible to anyone who sees no output)
    try:
        return json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError, RecursionError):
        return repr(value)


def _read_columns(path: Path, columns: Sequence[str]
                  ) -> tuple[dict[str, list[Any]], int, tuple[str, ...]]:
    """(values per column, number of rows, columns that occur in no JSONL record).

    CSV/TSV: every line after the header is a row (:func:`dplang.io.iter_delimited_rows`, the
    rule ``generate`` follows), an empty line being a row whose cells are all missing; every
    cell is a string ("NA" stays "NA"). JSONL has no schema: a missing key is a missing cell,
    and the presence of a key in the data never decides a refusal. Parquet: the schema's
    columns (public)."""
    fmt = "hf_dataset" if path.is_dir() else _FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise SamplingDataError(f"{path}: unsupported extension {path.suffix or '(none)'!r}; "
                                f"use one of {', '.join(_FORMATS)}")
    if not path.exists():
        raise SamplingDataError(f"{path}: no such file")
    if fmt != "hf_dataset" and path.stat().st_size == 0:
        raise SamplingDataError(f"{path}: empty file")
    if fmt in ("csv", "tsv"):
        rows_iter = iter_delimited_rows(path, "," if fmt == "csv" else "\t", SamplingDataError)
        header = next(rows_iter)
        _check_known(path, header, columns)
        positions = {c: header.index(c) for c in columns}
        data: dict[str, list[Any]] = {c: [] for c in columns}
        rows = 0
        for row in rows_iter:
            for c, i in positions.items():
                data[c].append(row[i] if i < len(row) else None)
            rows += 1
        return data, rows, ()
    if fmt == "jsonl":
        data = {c: [] for c in columns}
        rows = 0
        seen: set[str] = set()
        for _lineno, obj in iter_json_objects(path, SamplingDataError):
            seen.update(c for c in columns if c in obj)
            for c in columns:
                data[c].append(obj.get(c))
            rows += 1
        return data, rows, tuple(c for c in columns if c not in seen) if rows else ()
    import pyarrow as pa

    from ..arrow_sources import open_arrow_source

    source = open_arrow_source(path, fmt, SamplingDataError)  # Parquet, Arrow, saved dataset
    _check_known(path, list(source.schema.names), columns)
    try:
        table = source.read(list(columns))
    except (pa.ArrowException, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SamplingDataError(f"{path}: cannot read its rows ({first})") from None
    return {c: _column_values(table.column(c)) for c in columns}, table.num_rows, ()


def _column_values(column: Any) -> list[Any]:
    """A column's cells as Python values, by one rule that never raises: a cell Python cannot
    hold (a timestamp beyond year 9999, say) must not make a run fail where its neighbour's
    null cell would not. Such a cell becomes its repr; every other cell is read as it is, cell
    by cell (never the whole column recast: one record's cell must not change how the other
    records' cells read)."""
    import pyarrow as pa

    try:
        return column.to_pylist()
    except (ArithmeticError, ValueError, pa.ArrowException):
        pass
    values: list[Any] = []
    for scalar in column:
        try:
            values.append(scalar.as_py())
        except (ArithmeticError, ValueError, pa.ArrowException):
            values.append(repr(scalar))
    return values


def _check_known(path: Path, available: Sequence[str], columns: Sequence[str]) -> None:
    missing = [c for c in columns if c not in available]
    if missing:
        shown = ", ".join(repr(c) for c in available) or "(none)"
        raise SamplingDataError(f"{path}: unknown column(s) {', '.join(map(repr, missing))}; "
                                f"available columns: {shown}")


def _clip_round(text: str, lo: int, hi: int) -> int | None:
    """A numeric cell rounded half up and clipped into [lo, hi]; None when not a finite
    number. (Clipping happens before rounding to an int, so a huge exponent costs nothing.)"""
    try:
        d = Decimal(text.strip())
    except InvalidOperation:
        return None
    if not d.is_finite():
        return None
    if d <= lo:
        return lo
    if d >= hi:
        return hi
    return int(d.to_integral_value(rounding=ROUND_HALF_UP))


def _encoder(col: ColumnSpec) -> Any:
    """cell string (or None) → (code, mapped): the public per-cell rule of the module doc."""
    index = {v: i for i, v in enumerate(col.values)}
    fallback = (index[col.fallback], True)
    cache: dict[str | None, tuple[int, bool]] = {}

    def encode(cell: str | None) -> tuple[int, bool]:
        if cell in cache:
            return cache[cell]
        result = fallback
        if cell is not None:
            if col.kind == "categorical":
                if cell in index:
                    result = (index[cell], False)
            elif col.kind == "binary":
                low = cell.lower()
                if low in BINARY_TRUE:
                    result = (1, False)
                elif low in BINARY_FALSE:
                    result = (0, False)
                else:
                    v = _clip_round(cell, 0, 1)
                    if v is not None:
                        result = (v, True)
            else:
                lo, hi = int(col.values[0]), int(col.values[-1])
                v = _clip_round(cell, lo, hi)
                if v is not None:
                    result = (v - lo, Decimal(cell.strip()) != v)
        cache[cell] = result
        return result

    return encode


def load_table(path: str | Path, columns: Sequence[str],
               types: Mapping[str, ColumnSpec] | None = None,
               out_of_domain: str = "map") -> CategoricalTable:
    """Read ``columns`` of a CSV/TSV/JSONL/Parquet file as encoded records of the declared
    ``types`` (every column must be declared: :func:`parse_column`, :func:`binary_column`,
    :func:`load_schema`).

    Refuses (SamplingDataError, one line), before reading any value: no or repeated columns, a
    column without a declared type, a declaration for a column not selected. Then, from the
    file: an unknown column, an empty file or no rows. Cells outside their declared domain
    (missing ones included) are mapped by the module's public rule (``out_of_domain="map"``),
    or refused (``"refuse"``: a refusal that depends on the data).

    Privacy contract: the result IS the private data (not private); only what a sampler
    releases from it is. The universe it defines depends on the declarations alone, never on
    which values occur, and the mapping is a fixed per-record function, so neighbouring
    datasets map to neighbouring (or equal) record lists. ``mapped`` (counts of mapped cells)
    is private."""
    path = Path(path)
    cols = [c.strip() for c in columns]
    if not cols or any(not c for c in cols):
        raise SamplingDataError("no columns given (--columns A,B,C)")
    if len(set(cols)) != len(cols):
        raise SamplingDataError(f"repeated column in {','.join(cols)}")
    if out_of_domain not in OUT_OF_DOMAIN:
        raise SamplingDataError(f"--out-of-domain must be one of {', '.join(OUT_OF_DOMAIN)}, "
                                f"got {out_of_domain!r}")
    types = dict(types or {})
    unknown_types = set(types) - set(cols)
    if unknown_types:
        raise SamplingDataError(f"a type is declared for column(s) not in --columns: "
                                f"{', '.join(sorted(unknown_types))}")
    undeclared = [c for c in cols if c not in types]
    if undeclared:
        c = undeclared[0]
        raise SamplingDataError(
            f"column {c!r} has no declared type: declare it with --binary {c}, --domain "
            f"{c}=v1,v2,... or --domain {c}=lo..hi, or in a --schema file (types are public: "
            "reading them from the values would leak which values occur)")
    raw, rows, absent = _read_columns(path, cols)
    if rows == 0:
        raise SamplingDataError(f"{path}: no data rows")
    specs = tuple(types[c] if types[c].name == c else
                  ColumnSpec(c, types[c].kind, types[c].values, types[c].fallback) for c in cols)
    codes = np.empty((rows, len(cols)), dtype=np.int64)
    mapped: dict[str, int] = {}
    for j, (c, spec) in enumerate(zip(cols, specs, strict=True)):
        encode = _encoder(spec)
        count = 0
        first = -1
        for i, value in enumerate(raw[c]):
            code, was_mapped = encode(_cell_string(value))
            codes[i, j] = code
            if was_mapped:
                count += 1
                first = i if first < 0 else first
        if count and out_of_domain == "refuse":
            raise SamplingDataError(
                f"column {c!r} has {count} value(s) outside its declared {spec.kind} "
                f"domain or missing (first at data row {first + 1}); fix the data, or use "
                "--out-of-domain map to map them by the public rule")
        mapped[c] = count
    return CategoricalTable(specs, codes, mapped, absent)

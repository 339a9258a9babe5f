"""Categorical and binary columns of a table, as records for the samplers.

Reading: CSV and TSV through pandas with every cell kept as a string (``keep_default_na=False``:
"NA" or "null" stay strings), JSONL line by line with :mod:`json` (values keep their JSON
types), Parquet through pyarrow. A record is the tuple of the selected columns of one row.

Column kinds — and why categories are never read from the data. A sampler over records needs
the *universe* of possible records, and the privacy guarantee holds only if that universe is
public: if the categories were taken from the data, a value held by a single person would be in
the universe of x but not of its neighbour, and could be output from one and not the other (an
unbounded privacy loss; DESIGN invariant 4). Hence:

* a column whose values are all binary tokens (0/1, true/false, 0.0/1.0) is **binary**, with the
  public universe {0, 1} fixed by its type;
* any other column must have its categories **declared** (``domains``; CLI ``--domain
  COL=a,b,c`` or ``COL=1..5``); every value must then belong to the declared list;
* a column that is neither is refused, with a message saying whether it looks numeric /
  free text (not categorical) or categorical without a declared domain.

Validation errors are :class:`SamplingDataError` with a one-line message.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..io import iter_json_objects

__all__ = [
    "BINARY_FALSE",
    "BINARY_TRUE",
    "CategoricalTable",
    "ColumnSpec",
    "SamplingDataError",
    "load_table",
    "parse_domain",
]

BINARY_TRUE = frozenset({"1", "true", "1.0"})
BINARY_FALSE = frozenset({"0", "false", "0.0"})
_FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl",
            ".parquet": "parquet"}


class SamplingDataError(ValueError):
    """The data cannot be used as asked; the message is one line."""


@dataclass(frozen=True)
class ColumnSpec:
    """One column: ``kind`` is ``"binary"`` (values ("0", "1")) or ``"categorical"`` (the
    declared ``values``, in the declared order)."""

    name: str
    kind: str
    values: tuple[str, ...]

    @property
    def size(self) -> int:
        return len(self.values)


@dataclass(frozen=True)
class CategoricalTable:
    """Encoded records: ``codes[i, c]`` is the index of row i's value in column c's values."""

    columns: tuple[ColumnSpec, ...]
    codes: np.ndarray

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


def parse_domain(spec: str) -> tuple[str, tuple[str, ...]]:
    """``"COL=a,b,c"`` → ("COL", ("a", "b", "c")); ``"COL=1..5"`` → ("COL", ("1", …, "5")).

    Privacy contract: none needed — parses a public, user-declared domain."""
    if "=" not in spec:
        raise SamplingDataError(f"--domain {spec!r}: expected COLUMN=v1,v2,... or COLUMN=lo..hi")
    name, _, rest = spec.partition("=")
    name = name.strip()
    if not name:
        raise SamplingDataError(f"--domain {spec!r}: empty column name")
    if ".." in rest and "," not in rest:
        lo_s, _, hi_s = rest.partition("..")
        try:
            lo, hi = int(lo_s), int(hi_s)
        except ValueError:
            raise SamplingDataError(f"--domain {spec!r}: a range must be two integers lo..hi"
                                    ) from None
        if hi < lo or hi - lo > 10**6:
            raise SamplingDataError(f"--domain {spec!r}: empty or too large range")
        values = tuple(str(v) for v in range(lo, hi + 1))
    else:
        values = tuple(v.strip() for v in rest.split(","))
    if not values or any(v == "" for v in values):
        raise SamplingDataError(f"--domain {spec!r}: empty category")
    if len(set(values)) != len(values):
        raise SamplingDataError(f"--domain {spec!r}: repeated category")
    return name, values


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
    return json.dumps(value, sort_keys=True)


def _read_columns(path: Path, columns: Sequence[str]) -> tuple[dict[str, list[Any]], int]:
    fmt = _FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise SamplingDataError(f"{path}: unsupported extension {path.suffix or '(none)'!r}; "
                                f"use one of {', '.join(_FORMATS)}")
    if not path.exists():
        raise SamplingDataError(f"{path}: no such file")
    if path.stat().st_size == 0:
        raise SamplingDataError(f"{path}: empty file")
    if fmt in ("csv", "tsv"):
        import pandas as pd

        try:
            frame = pd.read_csv(path, sep="," if fmt == "csv" else "\t", dtype=str,
                                keep_default_na=False, na_filter=False, encoding="utf-8")
        except pd.errors.EmptyDataError:
            raise SamplingDataError(f"{path}: empty file (no header row)") from None
        except (pd.errors.ParserError, UnicodeDecodeError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise SamplingDataError(f"{path}: cannot read ({first})") from None
        available = [str(c) for c in frame.columns]
        _check_known(path, available, columns)
        return {c: frame[c].tolist() for c in columns}, len(frame)
    if fmt == "jsonl":
        data: dict[str, list[Any]] = {c: [] for c in columns}
        rows = 0
        available: set[str] = set()
        for _lineno, obj in iter_json_objects(path, SamplingDataError):
            available.update(obj)
            for c in columns:
                data[c].append(obj.get(c))
            rows += 1
        if rows:
            _check_known(path, sorted(available), columns)
        return data, rows
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pfile = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SamplingDataError(f"{path}: not a readable Parquet file ({first})") from None
    _check_known(path, list(pfile.schema_arrow.names), columns)
    table = pfile.read(columns=list(columns))
    return {c: table.column(c).to_pylist() for c in columns}, table.num_rows


def _check_known(path: Path, available: Sequence[str], columns: Sequence[str]) -> None:
    missing = [c for c in columns if c not in available]
    if missing:
        shown = ", ".join(repr(c) for c in available) or "(none)"
        raise SamplingDataError(f"{path}: unknown column(s) {', '.join(map(repr, missing))}; "
                                f"available columns: {shown}")


def _looks_numeric(values: Sequence[str]) -> tuple[bool, bool]:
    """(all numeric, some non-integer)."""
    frac = False
    for v in values:
        try:
            f = float(v)
        except ValueError:
            return False, False
        if not math.isfinite(f) or not f.is_integer():
            frac = True
    return True, frac


def _classify(name: str, cells: list[str], declared: tuple[str, ...] | None) -> ColumnSpec:
    distinct = set(cells)
    if declared is not None:
        outside = distinct - set(declared)
        if outside:
            row = next(i for i, v in enumerate(cells) if v not in declared)
            raise SamplingDataError(
                f"column {name!r} has {len(outside)} value(s) outside its declared domain "
                f"(first at data row {row + 1})")
        return ColumnSpec(name, "categorical", tuple(declared))
    lowered = {v.lower() for v in distinct}
    if lowered <= BINARY_TRUE | BINARY_FALSE:
        return ColumnSpec(name, "binary", ("0", "1"))
    numeric, frac = _looks_numeric(sorted(distinct))
    n = len(cells)
    if numeric and (frac or len(distinct) > 50):
        raise SamplingDataError(
            f"column {name!r} is not categorical or binary: it is numeric with "
            f"{len(distinct)} distinct values" + (" (non-integers)" if frac else ""))
    if len(distinct) > max(50, n // 2):
        raise SamplingDataError(
            f"column {name!r} is not categorical or binary: {len(distinct)} distinct values "
            f"among {n} rows (free text or an identifier)")
    raise SamplingDataError(
        f"column {name!r} is categorical: declare its categories with --domain {name}=v1,v2,... "
        f"(they must be public; reading them from the data would leak which values occur)")


def load_table(path: str | Path, columns: Sequence[str],
               domains: Mapping[str, Sequence[str]] | None = None) -> CategoricalTable:
    """Read ``columns`` of a CSV/TSV/JSONL/Parquet file as encoded categorical records.

    Refuses (SamplingDataError, one line): unknown or repeated columns, an empty file or no
    rows, a missing cell, a column that is neither binary nor declared categorical, a value
    outside a declared domain. ``domains`` maps column names to their public categories.

    Privacy contract: the result IS the private data (not private); only what a sampler
    releases from it is. The universe it defines depends on the declared domains and the
    column types alone, never on which values occur. A refusal reveals only that the data
    violate the declared schema."""
    path = Path(path)
    cols = [c.strip() for c in columns]
    if not cols or any(not c for c in cols):
        raise SamplingDataError("no columns given (--columns A,B,C)")
    if len(set(cols)) != len(cols):
        raise SamplingDataError(f"repeated column in {','.join(cols)}")
    domains = dict(domains or {})
    unknown_domains = set(domains) - set(cols)
    if unknown_domains:
        raise SamplingDataError(f"--domain given for column(s) not in --columns: "
                                f"{', '.join(sorted(unknown_domains))}")
    raw, rows = _read_columns(path, cols)
    if rows == 0:
        raise SamplingDataError(f"{path}: no data rows")
    specs = []
    codes = np.empty((rows, len(cols)), dtype=np.int64)
    for j, c in enumerate(cols):
        cells = [_cell_string(v) for v in raw[c]]
        missing = [i for i, v in enumerate(cells) if v is None]
        if missing:
            raise SamplingDataError(f"column {c!r} has {len(missing)} missing value(s) (first at "
                                    f"data row {missing[0] + 1}); remove or fill them first")
        declared = tuple(domains[c]) if c in domains else None
        spec = _classify(c, cells, declared)  # type: ignore[arg-type]
        if spec.kind == "binary":
            codes[:, j] = [1 if v.lower() in BINARY_TRUE else 0 for v in cells]  # type: ignore
        else:
            index = {v: i for i, v in enumerate(spec.values)}
            codes[:, j] = [index[v] for v in cells]  # type: ignore[index]
        specs.append(spec)
    return CategoricalTable(tuple(specs), codes)

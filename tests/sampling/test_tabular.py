"""Declared column types and the public out-of-domain rule of ``dplang.sampling.tabular``."""

import json

import pytest

from dplang.sampling.tabular import (
    ColumnSpec,
    SamplingDataError,
    binary_column,
    load_schema,
    load_table,
    parse_column,
)


def _table(tmp_path, column, cells, spec, mode="map"):
    path = tmp_path / "d.csv"
    path.write_text(column + "\n" + "\n".join(cells) + "\n")
    return load_table(path, [column], {column: spec}, mode)


def test_binary_rule(tmp_path):
    cells = ["1", "0", "true", "FALSE", "1.0", "2", "-1", "0.5", "0.49", "yes", '""', "1e999999"]
    t = _table(tmp_path, "b", cells, binary_column("b"))
    assert t.codes[:, 0].tolist() == [1, 0, 1, 0, 1, 1, 0, 1, 0, 0, 0, 1]
    assert t.mapped == {"b": 7}
    t = _table(tmp_path, "b", ["yes", "1"], binary_column("b", "1"))
    assert t.codes[:, 0].tolist() == [1, 1]


def test_integer_rule(tmp_path):
    t = _table(tmp_path, "n", ["3", "3.0", "2.5", "7", "-4", "abc", '""', "nan"],
               parse_column("n=1..5"))
    assert [t.columns[0].values[c] for c in t.codes[:, 0]] == ["3", "3", "3", "5", "1", "1",
                                                                "1", "1"]
    assert t.mapped == {"n": 6}
    assert t.columns[0].kind == "integer"


def test_categorical_rule_and_refuse_mode(tmp_path):
    spec = parse_column("c=red,green,blue")
    assert spec.kind == "categorical" and spec.fallback == "red"
    t = _table(tmp_path, "c", ["green", "purple", "Blue"], spec)
    assert t.codes[:, 0].tolist() == [1, 0, 0] and t.mapped == {"c": 2}
    with pytest.raises(SamplingDataError, match=r"2 value\(s\) outside .* data row 2"):
        _table(tmp_path, "c", ["green", "purple", "Blue"], spec, "refuse")
    assert _table(tmp_path, "c", ["green", "blue"], spec, "refuse").mapped == {"c": 0}


def test_declarations(tmp_path):
    with pytest.raises(SamplingDataError, match="fallback"):
        ColumnSpec("c", "categorical", ("a", "b"), "z")
    path = tmp_path / "d.csv"
    path.write_text("c\na\n")
    with pytest.raises(SamplingDataError, match="no declared type"):
        load_table(path, ["c"], {})
    schema = tmp_path / "s.toml"
    schema.write_text('[columns]\na = "binary"\nb = ["x", "y"]\nc = "0..2"\n[fallback]\nb = "y"\n')
    cols = load_schema(schema)
    assert [(c.kind, c.fallback) for c in cols.values()] == [("binary", "0"),
                                                             ("categorical", "y"),
                                                             ("integer", "0")]
    schema.write_text('[columns]\na = "number"\n')
    with pytest.raises(SamplingDataError, match="must be"):
        load_schema(schema)
    schema.write_text('[columns]\na = "binary"\n[fallback]\nb = "1"\n')
    with pytest.raises(SamplingDataError, match="fallback"):
        load_schema(schema)


def test_csv_empty_line_is_a_row_whose_cells_are_missing(tmp_path):
    """The row rule of generate: after the header every line is a row. Blanking one value of
    a one-column CSV (an empty line, as many tools write it) keeps the row count and every
    other row in place; the final line ending is not a row."""
    full = tmp_path / "full.csv"
    full.write_text("b\n1\n1\n0\n1\n")
    blank = tmp_path / "blank.csv"
    blank.write_text("b\n1\n\n0\n1\n")
    tf = load_table(full, ["b"], {"b": binary_column("b")})
    tb = load_table(blank, ["b"], {"b": binary_column("b")})
    assert tf.n == tb.n == 4
    assert tf.codes[:, 0].tolist() == [1, 1, 0, 1]
    assert tb.codes[:, 0].tolist() == [1, 0, 0, 1]  # the empty line took the fallback 0
    assert tb.mapped == {"b": 1} and tf.mapped == {"b": 0}
    trailing = tmp_path / "t.tsv"
    trailing.write_text("b\tc\n1\tx\n\n")
    assert load_table(trailing, ["b"], {"b": binary_column("b")}).n == 2


def test_jsonl_column_in_no_record_is_not_refused(tmp_path):
    """JSONL has no schema: a declared column that occurs in no record maps every cell to its
    fallback (reported in ``absent``), exactly as when one record has it: never a refusal."""
    x = tmp_path / "x.jsonl"
    x.write_text("".join(json.dumps({"a": i % 2}) + "\n" for i in range(6)))
    y = tmp_path / "y.jsonl"
    y.write_text("".join(json.dumps({"a": i % 2} if i != 3 else {"a": 1, "c": 1}) + "\n"
                         for i in range(6)))
    types = {"a": binary_column("a"), "c": binary_column("c")}
    tx = load_table(x, ["a", "c"], types)
    ty = load_table(y, ["a", "c"], types)
    assert tx.n == ty.n == 6 and tx.absent == ("c",) and ty.absent == ()
    assert tx.codes[:, 1].tolist() == [0] * 6
    assert ty.codes[:, 1].tolist() == [0, 0, 0, 1, 0, 0]


@pytest.mark.parametrize("kind", ["timestamp", "date", "decimal", "binary", "list"])
def test_a_parquet_cell_of_any_type_maps_like_a_missing_one(tmp_path, kind):
    """Neighbours: a column all null, and the same with one non-null cell of a type JSON
    cannot write (timestamp, date, decimal, binary). Both load (the cell is out of the
    declared domain, mapped to the fallback): one record's cell never decides a crash."""
    import datetime
    import decimal

    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    value, arrow_type = {
        "timestamp": (datetime.datetime(2020, 1, 2, 3, 4, 5), pa.timestamp("us")),
        "date": (datetime.date(2020, 1, 2), pa.date32()),
        "decimal": (decimal.Decimal("1.25"), pa.decimal128(5, 2)),
        "binary": (b"\xff\x00", pa.binary()),
        "list": ([datetime.date(2020, 1, 2)], pa.list_(pa.date32())),
    }[kind]
    spec = parse_column("c=x,y")
    tables = []
    for name, cells in (("null", [None, None, None]), ("one", [None, value, None])):
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"c": pa.array(cells, type=arrow_type)}), path)
        tables.append(load_table(path, ["c"], {"c": spec}))
    assert [t.codes[:, 0].tolist() for t in tables] == [[0, 0, 0], [0, 0, 0]]


def test_a_parquet_cell_python_cannot_hold_maps_like_a_missing_one(tmp_path):
    """A timestamp Python cannot hold (10^12 s: beyond year 9999) beside nulls: the column
    loads (its cells out of the domain, mapped), as its all-null neighbour does."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    spec = parse_column("c=x,y")
    codes = []
    for name, cells in (("null", [None, None]), ("far", [None, 10**12])):
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"c": pa.array(cells, type=pa.timestamp("s"))}), path)
        codes.append(load_table(path, ["c"], {"c": spec}).codes[:, 0].tolist())
    assert codes == [[0, 0], [0, 0]]


def test_parquet_decimals_and_dates_are_read_as_their_values(tmp_path):
    """A decimal column declared as integers maps its numbers (not their JSON quotes), a
    date column declared as categories matches the ISO dates."""
    import datetime
    import decimal

    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({
        "n": pa.array([decimal.Decimal("5.00"), decimal.Decimal("7.40")], pa.decimal128(5, 2)),
        "d": pa.array([datetime.date(2020, 1, 2), datetime.date(2021, 3, 4)], pa.date32()),
    }), path)
    t = load_table(path, ["n", "d"], {"n": parse_column("n=0..10"),
                                      "d": parse_column("d=2020-01-02,2021-03-04")})
    assert [t.columns[0].values[c] for c in t.codes[:, 0]] == ["5", "7"]
    assert t.codes[:, 1].tolist() == [0, 1] and t.mapped == {"n": 1, "d": 0}  # 7.40: rounded


def test_one_cell_python_cannot_hold_changes_no_other_cell(tmp_path):
    """A far timestamp in one record: the other records' dates read as without it (a column
    recast to strings whole would read them otherwise, so one record would move the others)."""
    import datetime

    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    spec = parse_column("c=other,2020-01-02T03:04:05")
    codes = []
    for far in (None, 10**12):
        path = tmp_path / f"{far}.parquet"
        cells = [int(datetime.datetime(2020, 1, 2, 3, 4, 5,
                                       tzinfo=datetime.UTC).timestamp()), far]
        pq.write_table(pa.table({"c": pa.array(cells, type=pa.timestamp("s"))}), path)
        codes.append(load_table(path, ["c"], {"c": spec}).codes[:, 0].tolist())
    assert codes == [[1, 0], [1, 0]]

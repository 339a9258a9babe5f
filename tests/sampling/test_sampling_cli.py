"""``dplang sample`` end to end, and refusal of bad input (exit code 2, one-line errors)."""

from __future__ import annotations

import json

import pytest

from dplang.cli.app import main
from dplang.io import file_digest
from dplang.privacy.ledger import PrivacyLedger


def run(capsys, *args):
    code = main(["sample", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def table(tmp_path):
    rows = ["color,flag,other,price,size"]
    colors = ["red", "green", "blue"]
    for i in range(60):
        rows.append(f"{colors[i % 3]},{i % 2},{(i // 2) % 2},{1.5 + i * 0.25},{1 + i % 4}")
    path = tmp_path / "d.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def test_end_to_end_categorical_csv(tmp_path, capsys, table):
    out = tmp_path / "o" / "s.csv"
    code, stdout, err = run(capsys, "--data", str(table), "--columns", "color,flag",
                            "--domain", "color=red,green,blue", "--epsilon", "1", "--num", "3",
                            "--seed", "5", "--out", str(out))
    assert code == 0, err
    lines = out.read_text().splitlines()
    assert lines[0] == "color,flag" and len(lines) == 4
    for line in lines[1:]:
        c, f = line.split(",")
        assert c in {"red", "green", "blue"} and f in {"0", "1"}
    manifest = json.loads((tmp_path / "o" / "s.csv.manifest.json").read_text())
    assert manifest["epsilon"] == 1.0 and manifest["delta"] == 0.0
    assert manifest["guarantee"]["adjacency"] == "replace-one"
    assert manifest["blocks"] == [[0, 20], [20, 40], [40, 60]]
    assert manifest["universe_size"] == 6
    assert manifest["data"]["rows_per_sample"] == 20
    assert manifest["parameters"]["method"] == "discrete-laplace"
    assert manifest["accuracy_bound"] == pytest.approx(6 / (2 * 20 * __import__("math").sinh(0.5)))
    assert "seed" not in json.dumps(manifest["parameters"])
    # the ledger holds the release under the data file's digest
    releases = PrivacyLedger().releases(file_digest(table))
    assert len(releases) == 1 and releases[0]["release_id"] == manifest["ledger"]["release_id"]
    assert "accuracy" in stdout and "total variation" in stdout
    # same seed, same samples (determinism)
    out2 = tmp_path / "o" / "t.csv"
    assert run(capsys, "--data", str(table), "--columns", "color,flag", "--domain",
               "color=red,green,blue", "--epsilon", "1", "--num", "3", "--seed", "5",
               "--out", str(out2))[0] == 0
    assert out2.read_text() == out.read_text()


@pytest.mark.parametrize("method,extra", [("clipped-mean", ["--delta", "1e-6"]),
                                          ("product", ["--delta", "1e-6"]),
                                          ("laplace-marginals", []),
                                          ("gaussian-marginals", ["--delta", "1e-6"]),
                                          ("laplace", []), ("reveal-or-obscure", [])])
def test_binary_methods_jsonl(tmp_path, capsys, method, extra):
    rows = [json.dumps({"a": i % 2, "b": bool(i % 3), "c": "1" if i % 5 else "0"})
            for i in range(4000)]
    data = tmp_path / "b.jsonl"
    data.write_text("\n".join(rows) + "\n")
    out = tmp_path / f"{method}.jsonl"
    eps = "8" if method == "clipped-mean" else "1"
    code, _stdout, err = run(capsys, "--data", str(data), "--columns", "a,b,c", "--epsilon", eps,
                            "--method", method, "--num", "2", "--out", str(out), *extra)
    assert code == 0, err
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 2
    for r in recs:
        assert set(r) == {"a", "b", "c"}
        assert all(v in (0, 1) for v in r.values()) or method in ("laplace",
                                                                   "reveal-or-obscure")
    manifest = json.loads((tmp_path / f"{method}.jsonl.manifest.json").read_text())
    assert manifest["guarantee"]["epsilon"] <= float(eps) + 1e-9
    assert manifest["dimension"] == 3


def test_budget_is_charged_before_writing(tmp_path, capsys, table):
    ledger = PrivacyLedger()
    ledger.set_budget(file_digest(table), 0.5, 1e-6)
    out = tmp_path / "s.csv"
    code, _, err = run(capsys, "--data", str(table), "--columns", "flag", "--epsilon", "1",
                       "--out", str(out))
    assert code == 3 and "budget" in err
    assert not out.exists() and not (tmp_path / "s.csv.manifest.json").exists()


def _refused(capsys, table, tmp_path, *args):
    code, _, err = run(capsys, "--data", str(table), "--out", str(tmp_path / "x.csv"), *args)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert not (tmp_path / "x.csv").exists()
    return lines[0]


def test_bad_input_is_refused(tmp_path, capsys, table):
    msg = _refused(capsys, table, tmp_path, "--columns", "price", "--epsilon", "1")
    assert "not categorical or binary" in msg
    msg = _refused(capsys, table, tmp_path, "--columns", "color", "--epsilon", "1")
    assert "--domain color=" in msg
    msg = _refused(capsys, table, tmp_path, "--columns", "nope", "--epsilon", "1")
    assert "unknown column" in msg and "'nope'" in msg
    for eps in ("0", "-1"):
        assert "epsilon" in _refused(capsys, table, tmp_path, "--columns", "flag", "--epsilon",
                                     eps)
    for delta in ("0", "1", "1.5", "-0.1"):
        assert "delta" in _refused(capsys, table, tmp_path, "--columns", "flag", "--epsilon",
                                   "1", "--delta", delta)
    msg = _refused(capsys, table, tmp_path, "--columns", "color", "--epsilon", "1", "--domain",
                   "color=red,green")
    assert "outside its declared domain" in msg
    msg = _refused(capsys, table, tmp_path, "--columns", "color,flag", "--domain",
                   "color=red,green,blue", "--method", "laplace-marginals", "--epsilon", "1")
    assert "binary" in msg
    msg = _refused(capsys, table, tmp_path, "--columns", "flag,other", "--method",
                   "clipped-mean", "--epsilon", "0.1", "--delta", "1e-6")
    assert "records per sample" in msg
    msg = _refused(capsys, table, tmp_path, "--columns", "flag", "--epsilon", "1", "--method",
                   "nope")
    assert "unknown --method" in msg


def test_too_many_categories(tmp_path, capsys, table):
    # 1000 declared categories for 60 rows: the bound is vacuous → refused with the bound
    msg = _refused(capsys, table, tmp_path, "--columns", "size", "--domain", "size=1..1000",
                   "--epsilon", "1")
    assert "too many categories" in msg and "accuracy bound" in msg
    # forced: released, with a warning naming the bound
    out = tmp_path / "forced.csv"
    code, _, err = run(capsys, "--data", str(table), "--columns", "size", "--domain",
                       "size=1..1000", "--epsilon", "1", "--force", "--out", str(out))
    assert code == 0 and "warning:" in err and "accuracy bound" in err
    # many but not vacuous: a warning, and the release goes ahead
    out = tmp_path / "warn.csv"
    code, _stdout, err = run(capsys, "--data", str(table), "--columns", "size", "--domain",
                            "size=1..20", "--epsilon", "1", "--out", str(out))
    assert code == 0 and "warning:" in err and "TV ≤" in err


def test_empty_data(tmp_path, capsys):
    header_only = tmp_path / "h.csv"
    header_only.write_text("flag\n")
    msg = _refused(capsys, header_only, tmp_path, "--columns", "flag", "--epsilon", "1")
    assert "no data rows" in msg
    empty = tmp_path / "e.csv"
    empty.write_text("")
    assert "empty" in _refused(capsys, empty, tmp_path, "--columns", "flag", "--epsilon", "1")
    missing = tmp_path / "m.csv"
    missing.write_text("flag\n1\n\n0\n,\n")
    missing.write_text("flag,x\n1,a\n,b\n")
    assert "missing" in _refused(capsys, missing, tmp_path, "--columns", "flag", "--epsilon", "1")


def test_existing_output_is_not_overwritten(tmp_path, capsys, table):
    out = tmp_path / "x.csv"
    out.write_text("keep")
    code, _, err = run(capsys, "--data", str(table), "--columns", "flag", "--epsilon", "1",
                       "--out", str(out))
    assert code == 2 and "exists" in err and out.read_text() == "keep"


def test_huge_universe_is_refused(tmp_path, capsys, table):
    msg = _refused(capsys, table, tmp_path, "--columns", "size,flag", "--domain",
                   "size=1..1000000", "--epsilon", "1", "--force")
    assert "too many categories" in msg and "accuracy bound" in msg

"""``dplang sample`` end to end, and refusal of bad input (exit code 2, one-line errors)."""

from __future__ import annotations

import json

import pytest

from dplang.cli.app import main
from dplang.io import file_digest
from dplang.privacy.ledger import PrivacyLedger
from dplang.release import TIMESTAMP_FIELDS

#: Private side files live in this folder beside the output (mode 700; dplang.release).
PRIVATE = ".dplang-private"


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


@pytest.mark.audits("repeated-sampling")
def test_end_to_end_categorical_csv(tmp_path, capsys, table):
    out = tmp_path / "o" / "s.csv"
    code, stdout, err = run(capsys, "--data", str(table), "--columns", "color,flag",
                            "--domain", "color=red,green,blue", "--binary", "flag",
                            "--epsilon", "1", "--num", "3", "--seed", "5", "--out", str(out))
    assert code == 0, err
    lines = out.read_text().splitlines()
    assert lines[0] == "color,flag" and len(lines) == 4
    for line in lines[1:]:
        c, f = line.split(",")
        assert c in {"red", "green", "blue"} and f in {"0", "1"}
    manifest = json.loads((tmp_path / "o" / "s.manifest.json").read_text())
    assert manifest["epsilon"] == 1.0 and manifest["delta"] == 0.0
    assert manifest["guarantee"]["adjacency"] == "replace-one"
    assert manifest["blocks"] == [[0, 20], [20, 40], [40, 60]]
    assert manifest["universe_size"] == 6
    assert manifest["data"]["rows_per_sample"] == 20
    assert manifest["parameters"]["method"] == "discrete-laplace"
    assert manifest["accuracy_bound"] == pytest.approx(6 / (2 * 20 * __import__("math").sinh(0.5)))
    assert "seed" not in json.dumps(manifest["parameters"])
    assert manifest["columns"][1] == {"name": "flag", "kind": "binary", "values": ["0", "1"],
                                      "fallback": "0"}
    # no digest, path, seed or ledger entry in the public manifest ...
    text = json.dumps(manifest)
    assert file_digest(table) not in text and str(table) not in text
    assert "ledger" not in manifest and "seed" not in manifest
    # ... the private side file (mode 600) has them; the ledger holds the release under the
    # dataset's name (default: the data file's resolved path)
    side = tmp_path / "o" / PRIVATE / "s.private.json"
    assert oct(side.stat().st_mode & 0o777) == "0o600"
    private = json.loads(side.read_text())
    assert private["data"]["sha256"] == file_digest(table) and private["seed"] is None
    releases = PrivacyLedger().releases(str(table.resolve()))
    assert len(releases) == 1 and releases[0]["release_id"] == private["release_id"]
    assert "accuracy" in stdout and "total variation" in stdout
    # same seed, same samples (determinism) — the same release, not charged again
    out2 = tmp_path / "o" / "t.csv"
    assert run(capsys, "--data", str(table), "--columns", "color,flag", "--domain",
               "color=red,green,blue", "--binary", "flag", "--epsilon", "1", "--num", "3",
               "--seed", "5", "--out", str(out2))[0] == 0
    assert out2.read_text() == out.read_text()
    assert len(PrivacyLedger().releases(str(table.resolve()))) == 1


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
                            "--binary", "a,b", "--binary", "c", "--method", method, "--num", "2",
                            "--out", str(out), *extra)
    assert code == 0, err
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 2
    for r in recs:
        assert set(r) == {"a", "b", "c"}
        assert all(v in (0, 1) for v in r.values()) or method in ("laplace",
                                                                   "reveal-or-obscure")
    manifest = json.loads((tmp_path / f"{method}.manifest.json").read_text())
    assert manifest["guarantee"]["epsilon"] <= float(eps) + 1e-9
    assert manifest["dimension"] == 3


def test_budget_is_charged_before_writing(tmp_path, capsys, table):
    ledger = PrivacyLedger()
    ledger.set_budget(str(table.resolve()), 0.5, 1e-6)
    out = tmp_path / "s.csv"
    code, _, err = run(capsys, "--data", str(table), "--columns", "flag", "--binary", "flag",
                       "--epsilon", "1", "--out", str(out))
    assert code == 3 and "budget" in err
    assert not out.exists() and not (tmp_path / "s.manifest.json").exists()
    assert not (tmp_path / PRIVATE / "s.private.json").exists()


def test_a_sample_of_an_older_dplang_is_replaced_only_with_overwrite(tmp_path, capsys, table):
    """An older dplang named the files after the whole output name (``s.csv.manifest.json``,
    ``.dplang-private/s.csv.private.json``): they count as the output's files (refused
    without ``--overwrite``) and are removed when it is replaced."""
    out = tmp_path / "s.csv"
    out.write_text("flag\n1\n")
    (tmp_path / "s.csv.manifest.json").write_text("{}")
    (tmp_path / PRIVATE).mkdir(mode=0o700)
    (tmp_path / PRIVATE / "s.csv.private.json").write_text("{}")
    args = ["--data", str(table), "--columns", "flag", "--binary", "flag", "--epsilon", "1",
            "--out", str(out)]
    code, _, err = run(capsys, *args)
    assert code == 2 and "already exists" in err and "--overwrite" in err
    code, _, err = run(capsys, *args, "--overwrite")
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [PRIVATE, "d.csv", "s.csv",
                                                           "s.manifest.json"]
    assert [p.name for p in (tmp_path / PRIVATE).iterdir()] == ["s.private.json"]


def test_two_outputs_that_would_share_a_manifest_are_refused(tmp_path, capsys, table):
    """``s.csv`` and ``s.jsonl`` would both have ``s.manifest.json``: the second is refused,
    ``--overwrite`` or not, and nothing is charged."""
    args = ["--data", str(table), "--columns", "flag", "--binary", "flag", "--epsilon", "1"]
    assert run(capsys, *args, "--out", str(tmp_path / "s.csv"))[0] == 0
    for extra in ((), ("--overwrite",)):
        code, _, err = run(capsys, *args, "--out", str(tmp_path / "s.jsonl"), *extra)
        assert code == 2 and "would share its manifest s.manifest.json" in err
    assert not (tmp_path / "s.jsonl").exists()
    assert len(PrivacyLedger().releases(str(table.resolve()))) == 1


def _refused(capsys, table, tmp_path, *args):
    code, _, err = run(capsys, "--data", str(table), "--out", str(tmp_path / "x.csv"), *args)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert not (tmp_path / "x.csv").exists()
    return lines[0]


def test_bad_input_is_refused(tmp_path, capsys, table):
    msg = _refused(capsys, table, tmp_path, "--columns", "price", "--epsilon", "1")
    assert "no declared type" in msg and "--binary price" in msg
    msg = _refused(capsys, table, tmp_path, "--columns", "color", "--epsilon", "1")
    assert "--domain color=" in msg
    msg = _refused(capsys, table, tmp_path, "--columns", "nope", "--binary", "nope",
                   "--epsilon", "1")
    assert "unknown column" in msg and "'nope'" in msg
    for eps in ("0", "-1"):
        assert "epsilon" in _refused(capsys, table, tmp_path, "--columns", "flag", "--binary",
                                     "flag", "--epsilon", eps)
    for delta in ("0", "1", "1.5", "-0.1"):
        assert "delta" in _refused(capsys, table, tmp_path, "--columns", "flag", "--binary",
                                   "flag", "--epsilon", "1", "--delta", delta)
    msg = _refused(capsys, table, tmp_path, "--columns", "color", "--epsilon", "1", "--domain",
                   "color=red,green", "--out-of-domain", "refuse")
    assert "outside its declared categorical domain" in msg
    msg = _refused(capsys, table, tmp_path, "--columns", "color,flag", "--domain",
                   "color=red,green,blue", "--binary", "flag", "--method", "laplace-marginals",
                   "--epsilon", "1")
    assert "binary" in msg
    msg = _refused(capsys, table, tmp_path, "--columns", "flag,other", "--binary", "flag,other",
                   "--method", "clipped-mean", "--epsilon", "0.1", "--delta", "1e-6")
    assert "records per sample" in msg
    msg = _refused(capsys, table, tmp_path, "--columns", "flag", "--binary", "flag",
                   "--epsilon", "1", "--method", "nope")
    assert "unknown --method" in msg
    msg = _refused(capsys, table, tmp_path, "--columns", "flag", "--binary", "flag",
                   "--domain", "flag=0,1", "--epsilon", "1")
    assert "declared twice" in msg
    msg = _refused(capsys, table, tmp_path, "--columns", "flag", "--binary", "flag",
                   "--fallback", "flag=7", "--epsilon", "1")
    assert "fallback" in msg
    msg = _refused(capsys, table, tmp_path, "--columns", "flag", "--binary", "flag,color",
                   "--epsilon", "1")
    assert "not in --columns" in msg


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
    msg = _refused(capsys, header_only, tmp_path, "--columns", "flag", "--binary", "flag",
                   "--epsilon", "1")
    assert "no data rows" in msg
    empty = tmp_path / "e.csv"
    empty.write_text("")
    assert "empty" in _refused(capsys, empty, tmp_path, "--columns", "flag", "--binary", "flag",
                               "--epsilon", "1")
    missing = tmp_path / "m.csv"
    missing.write_text("flag,x\n1,a\n,b\n")
    assert "missing" in _refused(capsys, missing, tmp_path, "--columns", "flag", "--binary",
                                 "flag", "--epsilon", "1", "--out-of-domain", "refuse")


def test_existing_output_is_not_overwritten(tmp_path, capsys, table):
    out = tmp_path / "x.csv"
    out.write_text("keep")
    code, _, err = run(capsys, "--data", str(table), "--columns", "flag", "--binary", "flag",
                       "--epsilon", "1", "--out", str(out))
    assert code == 2 and "exists" in err and out.read_text() == "keep"


def test_huge_universe_is_refused(tmp_path, capsys, table):
    msg = _refused(capsys, table, tmp_path, "--columns", "size,flag", "--domain",
                   "size=1..1000000", "--binary", "flag", "--epsilon", "1", "--force")
    assert "too many categories" in msg and "accuracy bound" in msg


def _public(path):
    doc = json.loads(path.read_text())
    for key in TIMESTAMP_FIELDS:
        doc.pop(key, None)
    return json.dumps(doc, sort_keys=True)


@pytest.mark.parametrize("method,extra", [("discrete-laplace", []),
                                          ("gaussian-marginals", ["--delta", "1e-6"])])
def test_public_files_of_neighbouring_datasets_are_equal(tmp_path, capsys, method, extra):
    """Replace-one neighbours: one record's flag changed from 0 to 2 (an inferred type would
    make the first binary and refuse the second). With declared types both are
    released; the public manifests are byte-equal up to the timestamp; the differences (the
    data digest, one mapped cell) are in the private side file only."""
    rows = ["flag,other"] + [f"{i % 2},{(i // 3) % 2}" for i in range(200)]
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    data, neighbour = tmp_path / "x" / "d.csv", tmp_path / "y" / "d.csv"
    data.write_text("\n".join(rows) + "\n")
    rows[5] = "2,0"  # was "0,0"
    neighbour.write_text("\n".join(rows) + "\n")
    outs = []
    for d in (data, neighbour):
        out = d.parent / "out" / "s.jsonl"
        code, _, err = run(capsys, "--data", str(d), "--columns", "flag,other", "--binary",
                           "flag,other", "--epsilon", "1", "--num", "2", "--seed", "3",
                           "--method", method, "--out", str(out), *extra)
        assert code == 0, err
        outs.append(out.parent)
    x, y = outs
    assert sorted(p.name for p in x.iterdir()) == sorted(p.name for p in y.iterdir()) == [
        PRIVATE, "s.jsonl", "s.manifest.json"]
    assert _public(x / "s.manifest.json") == _public(y / "s.manifest.json")
    px = json.loads((x / PRIVATE / "s.private.json").read_text())
    py = json.loads((y / PRIVATE / "s.private.json").read_text())
    assert px["data"]["out_of_domain_cells_mapped"] == {"flag": 0, "other": 0}
    assert py["data"]["out_of_domain_cells_mapped"] == {"flag": 1, "other": 0}
    assert px["data"]["sha256"] != py["data"]["sha256"]


def test_types_are_declared_never_inferred(tmp_path, capsys):
    """An undeclared column is refused the same way whatever its values (the refusal reads no
    value); a declared one is released whatever its values."""
    for values in ("0,1,1,0", "0,1,2,0"):
        data = tmp_path / f"d{values[-3]}.csv"
        data.write_text("flag\n" + "\n".join(values.split(",")) + "\n")
        msg = _refused(capsys, data, tmp_path, "--columns", "flag", "--epsilon", "1")
        assert msg == ("error: column 'flag' has no declared type: declare it with --binary "
                       "flag, --domain flag=v1,v2,... or --domain flag=lo..hi, or in a --schema "
                       "file (types are public: reading them from the values would leak which "
                       "values occur)")
        out = tmp_path / f"s{values[-3]}.csv"
        code, _, err = run(capsys, "--data", str(data), "--columns", "flag", "--binary", "flag",
                           "--epsilon", "1", "--out", str(out))
        assert code == 0, err
        assert ("mapped by the public rule" in err) == ("2" in values)


def test_schema_file_and_fallback(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"region": r, "band": b, "smoker": s}) + "\n"
                            for r, b, s in [("north", 3, True), ("mars", 12, "yes"),
                                            ("south", 1, False), ("east", None, 1)] * 20))
    schema = tmp_path / "schema.toml"
    schema.write_text('[columns]\nregion = ["north", "south", "east", "west"]\n'
                      'band = "1..5"\nsmoker = "binary"\n[fallback]\nregion = "west"\n')
    out = tmp_path / "s.jsonl"
    code, _, err = run(capsys, "--data", str(data), "--columns", "region,band,smoker",
                       "--schema", str(schema), "--fallback", "band=3", "--epsilon", "2",
                       "--out", str(out))
    assert code == 0, err
    manifest = json.loads((tmp_path / "s.manifest.json").read_text())
    assert [c["fallback"] for c in manifest["columns"]] == ["west", "3", "0"]
    assert manifest["universe_size"] == 4 * 5 * 2
    private = json.loads((tmp_path / PRIVATE / "s.private.json").read_text())
    # "mars" → west; 12 → 5 (clipped); None → 3 (fallback); "yes" → 0 (fallback)
    assert private["data"]["out_of_domain_cells_mapped"] == {"region": 20, "band": 40,
                                                            "smoker": 20}
    [rec] = [json.loads(line) for line in out.read_text().splitlines()]
    assert rec["region"] in {"north", "south", "east", "west"} and 1 <= rec["band"] <= 5


@pytest.mark.parametrize("method,extra", [("discrete-laplace", []), ("laplace", []),
                                          ("laplace-marginals", []),
                                          ("gaussian-marginals", ["--delta", "1e-6"])])
def test_sampler_statistics_of_neighbouring_datasets(tmp_path, capsys, monkeypatch, method,
                                                     extra):
    """Through the CLI, the statistic each sampler perturbs is exact integer arithmetic of the
    records (docs/privacy.md, "Per-record computations"): on replace-one neighbours with the
    same seed, each block's counts (k-ary) or column sums n·p̂ (product) are integers and move
    by at most the sensitivity (one count down and one up; each column by at most 1)."""
    import numpy as np

    import dplang.sampling.kary as kary
    import dplang.sampling.product as product

    seen: list[np.ndarray] = []
    counts = kary.KarySampler.counts
    monkeypatch.setattr(kary.KarySampler, "counts",
                        lambda self, x: seen.append(counts(self, x)) or seen[-1])
    for name in ("laplace_noisy_sum", "gaussian_noisy_sum"):
        real = getattr(product, name)

        def spy(values, scale, rng, real=real):
            seen.append(np.asarray(values) * 50)  # the mean over a block of n = 50 rows
            return real(values, scale, rng)

        monkeypatch.setattr(product, name, spy)
    rows = ["flag,other"] + [f"{i % 2},{(i // 3) % 2}" for i in range(200)]
    runs = []
    for name in ("x", "y"):
        if name == "y":
            rows[1] = "1,1"  # was "0,0": one record replaced by another
        data = tmp_path / name / "d.csv"
        data.parent.mkdir()
        data.write_text("\n".join(rows) + "\n")
        seen.clear()
        code, _, err = run(capsys, "--data", str(data), "--columns", "flag,other", "--binary",
                           "flag,other", "--epsilon", "1", "--num", "4", "--seed", "3",
                           "--method", method, "--out", str(tmp_path / name / "s.csv"),
                           *extra)
        assert code == 0, err
        runs.append([np.asarray(s, dtype=np.float64) for s in seen])
    x, y = runs
    assert len(x) == len(y) == 4  # one statistic per block
    for i, (a, b) in enumerate(zip(x, y, strict=True)):
        assert np.allclose(a, np.round(a), rtol=0, atol=1e-9)  # integers (up to the /n)
        moved = np.abs(np.round(a) - np.round(b))
        if i != 0:  # the replaced record (the first) is in the first block only
            assert not moved.any()
        elif method in ("discrete-laplace", "laplace"):
            assert moved.sum() == 2  # the joint code 0 lost one record, code 3 gained one
        else:
            assert moved.tolist() == [1.0, 1.0]  # both columns gained a one

"""``dplang formal``: list, run (simulation and --data release), reproduce, audit, bad input."""

from __future__ import annotations

import json
import os
import stat
import time

import pytest

from dplang.cli.app import main
from dplang.privacy.ledger import PrivacyLedger


def run(capsys, *args):
    code = main(["formal", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_list(capsys):
    code, out, _ = run(capsys, "list")
    assert code == 0
    for word in ("soft-margin", "000·1", "approximate-intersection", "001·1", "remark-5.7",
                 "m_star=3", "price:thm4.5", "limit:thmC.3", "dup-heavy"):
        assert word in out


def test_run_simulation_writes_csv_and_manifest(capsys, tmp_path):
    out_dir = tmp_path / "o"
    code, out, err = run(capsys, "run", "prefix-count", "--instance", "remark-5.7", "--n", "400",
                         "--epsilon", "0.25", "--runs", "300", "--seed", "1", "--out",
                         str(out_dir))
    assert code == 0, err
    assert "Err = " in out and "exact: Err = 0.04208" in out and "pure 0.25-differential" in out
    manifest = json.loads((out_dir / "results.manifest.json").read_text())
    assert manifest["guarantee"]["epsilon"] == 0.25 and manifest["parameters"]["window"] == 3
    assert (out_dir / "results.csv").read_text().startswith("estimate,")
    code, out, err = run(capsys, "run", "approximate-intersection", "--instance", "aps",
                         "--horizon", "5000", "--epsilon", "2", "--runs", "3")
    assert code == 0 and "valid at t = 5000" in out


def test_warning_names_the_theorem(capsys):
    code, _, err = run(capsys, "run", "prefix-count", "--instance", "remark-5.7", "--n", "100",
                       "--epsilon", "1", "--window", "2", "--runs", "20")
    assert code == 0 and "M = 2 < m* = 3: Thm 4.5 no longer applies" in err
    code, _, err = run(capsys, "run", "soft-margin", "--instance", "ipp-pair", "--n", "100",
                       "--epsilon", "1", "--k", "1", "--runs", "20")
    assert code == 0 and "Thm 3.2 no longer applies" in err


@pytest.mark.parametrize("args", [
    ["run", "soft-margin", "--instance", "ipp-pair", "--n", "100", "--epsilon", "0"],
    ["run", "soft-margin", "--instance", "ipp-pair", "--n", "100", "--epsilon", "-1"],
    ["run", "gaussian-margin", "--instance", "ipp-pair", "--n", "100", "--epsilon", "0.5",
     "--delta", "1"],
    ["run", "gaussian-margin", "--instance", "ipp-pair", "--n", "100", "--epsilon", "1.5"],
    ["run", "soft-margin", "--instance", "ipp-pair", "--n", "0", "--epsilon", "1"],
    ["run", "soft-margin", "--instance", "ipp-pair", "--n", "10", "--epsilon", "1", "--k", "0"],
    ["run", "joint-threshold", "--instance", "remark-5.7", "--n", "10", "--epsilon", "1",
     "--window", "0"],
    ["run", "prefix-count", "--instance", "remark-5.7", "--n", "10", "--epsilon", "1",
     "--tau", "0"],
    ["run", "prefix-count", "--instance", "remark-5.7", "--n", "10", "--epsilon", "1",
     "--tau", "auto"],
    ["run", "prefix-count", "--instance", "remark-5.7", "--n", "10", "--epsilon", "1",
     "--R", "9"],
    ["run", "prefix-count", "--instance", "ipp-pair", "--n", "10", "--epsilon", "1"],
    ["run", "epoch-em", "--instance", "thresholds", "--horizon", "64", "--epsilon", "1"],
    ["run", "stochastic", "--instance", "rows", "--horizon", "64", "--epsilon", "1"],
    ["run", "uniform-private", "--instance", "thresholds", "--n", "10", "--epsilon", "1"],
    ["run", "uniform-private", "--instance", "sperner", "--k", "21", "--n", "10",
     "--epsilon", "1"],
    ["run", "prefix-count", "--instance", "remark-5.7", "--horizon", "10", "--epsilon", "1"],
    ["run", "epoch-em", "--instance", "rows", "--n", "10", "--epsilon", "1"],
    ["run", "nope", "--instance", "remark-5.7", "--n", "10"],
    ["run", "prefix-count", "--instance", "nope", "--n", "10", "--epsilon", "1"],
    ["run", "epoch-em", "--instance", "remark-5.7", "--horizon", "10", "--epsilon", "1"],
    ["reproduce", "price:nope"],
    ["audit", "soft-margin", "--instance", "ipp-pair", "--epsilon", "0"],
])
def test_bad_input_one_line_exit_2_nothing_written(capsys, tmp_path, args):
    out_dir = tmp_path / "never"
    code, out, err = run(capsys, *args, *(["--out", str(out_dir)] if args[0] != "audit"
                                          else []))
    assert code == 2, (args, out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert not out_dir.exists()


def test_closure_dimension_of_countable_is_refused(capsys):
    code, _, err = run(capsys, "run", "uniform-private", "--instance", "thresholds", "--n", "5",
                       "--epsilon", "1")
    assert code == 2 and "closure_dimension of a countable collection" in err


def test_existing_output_is_refused(capsys, tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("mine")
    code, _, err = run(capsys, "reproduce", "price:sensitivity", "--out", str(tmp_path / "x"))
    assert code == 2 and "already exists" in err
    assert os.listdir(tmp_path / "x") == ["keep.txt"]


@pytest.fixture
def sample_file(tmp_path):
    path = tmp_path / "sample.txt"
    values = [0] * 300 + [1] * 40 + [3] * 20 + [5] * 10 + [7] * 5
    path.write_text("\n".join(map(str, values)) + "\n")
    return path


def release(capsys, sample, out, *extra):
    return run(capsys, "run", "prefix-count", "--instance", "remark-5.7", "--epsilon", "1",
               "--data", str(sample), "--out", str(out), *extra)


def test_data_run_is_a_charged_release(capsys, tmp_path, sample_file):
    out_dir = tmp_path / "rel"
    code, _, err = release(capsys, sample_file, out_dir, "--seed", "7")
    assert code == 0, err
    ledger = PrivacyLedger()
    rel = ledger.releases(str(sample_file.resolve()))
    assert len(rel) == 1 and rel[0]["guarantee"]["epsilon"] == 1.0
    manifest = json.loads((out_dir / "results.manifest.json").read_text())
    text = json.dumps(manifest)
    assert "seed" not in json.dumps(manifest["fingerprint"]) and str(sample_file) not in text
    assert manifest["n"] == 375 and manifest["guarantee"]["unit"] == "record"
    private = out_dir / ".dplang-private" / "results.private.json"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert json.loads(private.read_text())["data"]["sha256"]
    # the same seed is the same release: not charged twice; a new seed is a new charge
    release(capsys, sample_file, tmp_path / "rel2", "--seed", "7")
    assert len(ledger.releases(str(sample_file.resolve()))) == 1
    release(capsys, sample_file, tmp_path / "rel3", "--seed", "8")
    assert len(ledger.releases(str(sample_file.resolve()))) == 2


def test_neighbouring_data_give_the_same_public_files(capsys, tmp_path, sample_file):
    other = tmp_path / "neighbour.txt"
    lines = sample_file.read_text().splitlines()
    lines[3] = "2"  # replace one element
    other.write_text("\n".join(lines) + "\n")
    a, b = tmp_path / "a", tmp_path / "b"
    assert release(capsys, sample_file, a, "--seed", "1", "--dataset", "d")[0] == 0
    assert release(capsys, other, b, "--seed", "1", "--dataset", "d2")[0] == 0
    ma = json.loads((a / "results.manifest.json").read_text())
    mb = json.loads((b / "results.manifest.json").read_text())
    for m in (ma, mb):
        m.pop("created")
    assert ma == mb


@pytest.mark.parametrize("algorithm, instance", [
    ("prefix-count", "remark-5.7"),  # statistical (000): the sample as an array
    ("approximate-intersection", "thresholds"),  # limit (001): the file as a stream
    ("uniform-private", "nat-pair"),  # one-shot generator over a finite collection
])
def test_data_run_accepts_every_natural_of_the_domain(capsys, tmp_path, sample_file,
                                                      algorithm, instance):
    """Any natural is in ℕ₀, 2^63 and 2^70 included: a file holding one runs like its
    neighbour with 2 on that line (exit 0, one release, equal public manifests), never
    crashing after the charge."""
    lines = sample_file.read_text().splitlines()
    files = {}
    for name, value in (("small", 2), ("huge", 2**63), ("huger", 2**70)):
        files[name] = tmp_path / f"{name}.txt"
        files[name].write_text("\n".join([*lines[:3], str(value), *lines[4:]]) + "\n")
    manifests = []
    for name, path in files.items():
        out_dir = tmp_path / f"out-{name}"
        code, _, err = run(capsys, "run", algorithm, "--instance", instance, "--epsilon", "1",
                           "--data", str(path), "--out", str(out_dir), "--dataset", name)
        assert code == 0, err
        assert len(PrivacyLedger().releases(name)) == 1
        manifest = json.loads((out_dir / "results.manifest.json").read_text())
        manifest.pop("created")
        manifests.append(manifest)
    assert manifests[0] == manifests[1] == manifests[2]


def test_budget_exceeded_exit_3_nothing_written(capsys, tmp_path, sample_file):
    PrivacyLedger().set_budget("tight", 0.5, 1e-6)
    out_dir = tmp_path / "over"
    code, _, err = release(capsys, sample_file, out_dir, "--dataset", "tight")
    assert code == 3 and "budget" in err
    assert not (out_dir / "results.csv").exists()
    assert not (out_dir / "results.manifest.json").exists()


def test_bad_data_and_partial_dfa(capsys, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("1\n2\nfoo\n")
    code, _, err = release(capsys, bad, tmp_path / "x")
    assert code == 2 and "line 3" in err and not (tmp_path / "x").exists()
    coll = tmp_path / "c.json"
    coll.write_text(json.dumps({"alphabet": "ab", "languages": [
        {"transitions": {"0": {"a": "0"}}, "start": "0", "accept": ["0"]}]}))
    words = tmp_path / "w.txt"
    words.write_text("ab\nba\n")
    code, _, err = run(capsys, "run", "prefix-count", "--collection", str(coll), "--epsilon",
                       "1", "--data", str(words), "--out", str(tmp_path / "y"))
    assert code == 2 and "partial DFA" in err and not (tmp_path / "y").exists()
    code, _, err = run(capsys, "run", "margin", "--instance", "ipp-pair", "--data",
                       str(words), "--out", str(tmp_path / "z"))
    assert code == 2 and "not private" in err


def test_data_run_over_a_custom_dfa_collection(capsys, tmp_path):
    coll = tmp_path / "c.json"
    coll.write_text(json.dumps({"name": "mine", "alphabet": "ab", "languages": [
        {"name": "sigma", "transitions": {"0": {"a": "0", "b": "0"}}, "start": "0",
         "accept": ["0"]},
        {"name": "even-b", "transitions": {"0": {"a": "0", "b": "1"},
                                           "1": {"a": "1", "b": "0"}},
         "start": "0", "accept": ["0"]}]}))
    words = tmp_path / "w.txt"
    words.write_text("\n".join(["aa", "bb", "", "abba", "aaaa"] * 30) + "\n")
    code, out, err = run(capsys, "run", "prefix-count", "--collection", str(coll), "--epsilon",
                         "2", "--data", str(words), "--out", str(tmp_path / "r"), "--window",
                         "4", "--seed", "3")
    assert code == 0, err
    assert "released" in out


def _two_dfas(path, accept_even_b: str = "0") -> None:
    path.write_text(json.dumps({"name": "mine", "alphabet": "ab", "languages": [
        {"name": "sigma", "transitions": {"0": {"a": "0", "b": "0"}}, "start": "0",
         "accept": ["0"]},
        {"name": "even-b", "transitions": {"0": {"a": "0", "b": "1"},
                                           "1": {"a": "1", "b": "0"}},
         "start": "0", "accept": [accept_even_b]}]}))


def test_a_collection_edited_in_place_is_another_release(capsys, tmp_path):
    """Same name, same size, same seed and data, other DFAs: another release (the seed is
    refused for it), never a free rerun drawing the same noise."""
    coll, words = tmp_path / "c.json", tmp_path / "w.txt"
    words.write_text("\n".join(["aa", "bb", "abba", "b"] * 30) + "\n")
    args = ["run", "soft-margin", "--collection", str(coll), "--epsilon", "1", "--data",
            str(words), "--seed", "77", "--dataset", "words"]
    _two_dfas(coll)
    assert run(capsys, *args, "--out", str(tmp_path / "o1"))[0] == 0
    assert run(capsys, *args, "--out", str(tmp_path / "o1-again"))[0] == 0  # a rerun
    assert len(PrivacyLedger().releases("words")) == 1
    manifest = (tmp_path / "o1" / "results.manifest.json").read_text()
    assert '"instance": "c.json"' in manifest and str(tmp_path) not in manifest
    _two_dfas(coll, accept_even_b="1")  # odd b's now
    code, _, err = run(capsys, *args, "--out", str(tmp_path / "o2"))
    assert code == 3 and "seed" in err, err
    assert not (tmp_path / "o2").exists() and len(PrivacyLedger().releases("words")) == 1


@pytest.mark.parametrize("algorithm, epsilon, message", [
    ("soft-margin", "1000", "limit"),  # ε > 100: no meaningful privacy
    ("soft-margin", "1e308", "limit"),
    ("epoch-em", "1", "finite pairwise intersections"),  # public properties of the
    ("stochastic", "1", "tell-tales"),                   # collection, checked first
])
def test_a_data_run_refused_before_the_charge(capsys, tmp_path, algorithm, epsilon, message):
    coll, words = tmp_path / "c.json", tmp_path / "w.txt"
    _two_dfas(coll)
    words.write_text("aa\nbb\nabba\n")
    code, _, err = run(capsys, "run", algorithm, "--collection", str(coll), "--epsilon",
                       epsilon, "--data", str(words), "--dataset", "words", "--out",
                       str(tmp_path / "o"))
    assert code == 2 and message in err, err
    assert not (tmp_path / "o").exists() and PrivacyLedger().releases("words") == []


def test_reproduce_quick_is_fast_and_worker_independent(capsys, tmp_path):
    start = time.perf_counter()
    code, out, err = run(capsys, "reproduce", "price:thm4.5", "--quick", "--workers", "1",
                         "--out", str(tmp_path / "w1"))
    elapsed = time.perf_counter() - start
    assert code == 0, err
    assert elapsed < 30
    assert "Err(400) = 0.0421" in out
    code, _, err = run(capsys, "reproduce", "price:thm4.5", "--quick", "--workers", "2",
                       "--out", str(tmp_path / "w2"))
    assert code == 0, err
    a = (tmp_path / "w1" / "results.csv").read_text()
    assert a == (tmp_path / "w2" / "results.csv").read_text()
    assert (tmp_path / "w1" / "formal_price_thm4_5.png").stat().st_size > 10_000
    manifest = json.loads((tmp_path / "w1" / "results.manifest.json").read_text())
    assert manifest["experiment"] == "price:thm4.5" and manifest["guarantees"]


def test_audit_pass_and_fail_exit_codes(capsys):
    code, out, _ = run(capsys, "audit", "prefix-count", "--instance", "remark-5.7",
                       "--epsilon", "1")
    assert code == 0 and out.startswith("PASS")
    code, out, _ = run(capsys, "audit", "prefix-count", "--instance", "remark-5.7",
                       "--epsilon", "1", "--twin")
    assert code == 1 and out.startswith("FAIL")
    code, out, _ = run(capsys, "audit", "approximate-intersection", "--instance", "aps",
                       "--epsilon", "1", "--twin")
    assert code == 1 and "3.57" in out
    code, out, _ = run(capsys, "audit", "pointer", "--instance", "remark-5.7", "--epsilon",
                       "1")
    assert code == 1 and "inf" in out


def test_run_limit_algorithms(capsys):
    code, out, err = run(capsys, "run", "uniform-private", "--instance", "sperner",
                         "--horizon", "512", "--epsilon", "4", "--runs", "2")
    assert code == 0 and "valid at t = 512" in out, err
    code, out, err = run(capsys, "run", "stochastic", "--instance", "thresholds", "--horizon",
                         str(2**30), "--epsilon", "20", "--runs", "2")
    assert code == 0 and "correct at t = 1073741824 in 2/2" in out
    assert "duplicate" not in err  # i.i.d. streams repeat by nature: no E2 warning
    code, out, err = run(capsys, "run", "approximate-intersection", "--instance", "dup-heavy",
                         "--horizon", "5000", "--epsilon", "1", "--runs", "2")
    assert code == 0 and "Thm 1.1" in err
    code, out, _ = run(capsys, "run", "closure", "--instance", "sperner", "--horizon", "8",
                       "--runs", "1")
    assert code == 0 and "not private" in out

"""``dplang report`` end to end (keyword predicate, small corpus) and its bad-input errors."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

import dplang.cli.report as report_cli
from dplang.cli.app import main
from dplang.io import file_digest
from dplang.models import ToyModel
from dplang.privacy.ledger import PrivacyLedger
from dplang.release import TIMESTAMP_FIELDS

#: Private side files live in this folder beside the output (mode 700; dplang.release).
PRIVATE = ".dplang-private"

REVIEWS = [
    "The pasta was great and the staff were friendly.",
    "Great coffee, but the service was slow.",
    "Slow service and cold food. Never again.",
    "Friendly staff, great desserts.",
    "The parking lot was full.",
    "",
    "Great food, great staff, great prices.",
    "The waiter was friendly and the soup was great.",
]


def write_corpus(tmp: Path, copies: int = 25) -> Path:
    lines = ['text,stars']
    for i in range(copies):
        for j, r in enumerate(REVIEWS):
            lines.append(f'"{r}",{(i + j) % 5 + 1}')
    path = tmp / "reviews.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_statements(tmp: Path) -> Path:
    path = tmp / "statements.txt"
    path.write_text(
        "# statement<TAB>regex\n"
        "Reviewers praise the food\tgreat (food|pasta|coffee|desserts|soup)|soup was great\n"
        "Staff are described as friendly\tfriendly\n"
        "Service is slow\tslow\n"
        "service is slow.\tslow\n"
        "Dogs are welcome\t\\bdogs?\\b\n",
        encoding="utf-8",
    )
    return path


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["report", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_report_end_to_end_with_keyword_predicate(tmp_path, capsys) -> None:
    data, statements = write_corpus(tmp_path), write_statements(tmp_path)
    out = tmp_path / "out" / "rep"
    code, stdout, err = run(capsys, "--data", str(data), "--statements", str(statements),
                            "--epsilon", "4", "--beta", "0.05", "--threshold", "0.2",
                            "--predicate", "keyword", "--seed", "7", "--out", str(out))
    assert code == 0, err
    assert "pure 4-differential privacy" in stdout
    doc = json.loads((tmp_path / "out" / "rep.json").read_text())
    md = (tmp_path / "out" / "rep.md").read_text()
    assert doc["guarantee"]["epsilon"] == 4 and doc["guarantee"]["unit"] == "record"
    assert doc["guarantee"]["adjacency"] == "replace-one"
    assert doc["parameters"]["candidates"] == 4  # the duplicate was removed before the data
    assert doc["statements"] == {"source": "list", "path": statements.name, "proposed": 5,
                                 "after_deduplication": 4}
    assert doc["parameters"]["n_records"] == 200  # blank rows count
    decisions = {c["statement"]: c["decision"] for c in doc["certificates"]}
    assert decisions["Reviewers praise the food"] == "emit"
    assert decisions["Dogs are welcome"] == "abstain"
    for c in doc["certificates"]:
        assert c["predicate"]["id"].startswith("keyword:")
        if c["decision"] == "emit":
            assert c["lower_bound"] >= 0.2
            assert c["statement"] in md
    assert "Privacy guarantee" in md and "Abstentions" in md
    assert "seed" not in json.dumps(doc) and "seed" not in md
    # no digest, path or ledger entry in the public files ...
    for public in (json.dumps(doc), md):
        assert file_digest(data) not in public and file_digest(data)[:16] not in public
        assert str(data) not in public and "ledger" not in public
    # ... they are in the private side file (mode 600), and the ledger holds the release
    # under the dataset's name (default: the data file's resolved path)
    side = tmp_path / "out" / PRIVATE / "rep.private.json"
    assert oct(side.stat().st_mode & 0o777) == "0o600"
    private = json.loads(side.read_text())
    assert private["data"]["sha256"] == file_digest(data) and private["seed"] is None
    assert private["data"]["read"]["unusable_by_reason"] == {"blank": 25}
    ledger = PrivacyLedger(os.environ["DPLANG_LEDGER"])
    releases = ledger.releases(str(data.resolve()))
    assert len(releases) == 1 and releases[0]["guarantee"]["epsilon"] == 4
    assert private["release_id"] == releases[0]["release_id"]
    # the same seed on the same data is the same release (same output): charged once
    out2 = tmp_path / "again"
    assert run(capsys, "--data", str(data), "--statements", str(statements), "--epsilon", "4",
               "--beta", "0.05", "--threshold", "0.2", "--seed", "7", "--out", str(out2))[0] == 0
    assert (tmp_path / "again.md").read_text() == md
    assert len(ledger.releases(str(data.resolve()))) == 1


def _public(path: Path) -> str:
    """The public JSON without its timestamp and released values (decisions, bounds)."""
    doc = json.loads(path.read_text())
    for key in (*TIMESTAMP_FIELDS, "summary"):
        doc.pop(key, None)
    for c in doc["certificates"]:
        del c["decision"], c["lower_bound"], c["simultaneous_lower_bound"]
    return json.dumps(doc, sort_keys=True)


def _masked(md: str) -> str:
    """The Markdown with the released lower bounds masked."""
    md = re.sub(r"(≥ |lower bound )\d\.\d{4}", r"\1L", md)
    return re.sub(r"\| \d\.\d{4} \|", "| L |", md)  # the per-candidate column


def test_public_files_of_neighbouring_datasets_are_equal(tmp_path, capsys) -> None:
    """Replace-one neighbours: one record changed (here to a blank one). With the same seed,
    the public files are equal up to the released decisions and bounds and the timestamp.
    Each run names its dataset (the noise depends on the dataset's name: with the resolved
    path, a pytest folder of another number, the decisions near the threshold could differ
    from run to run, as they did once in a fresh clone's make test; one name for both would be
    refused, since a seed is the secret of one release of a dataset)."""
    statements = write_statements(tmp_path)
    data = write_corpus(tmp_path)
    rows = data.read_text().splitlines()
    rows[3] = '"",2'  # one review replaced by a blank record
    (tmp_path / "n").mkdir()
    neighbour = tmp_path / "n" / "reviews.csv"
    neighbour.write_text("\n".join(rows) + "\n")
    outs = []
    for name, d in (("reviews", data), ("reviews-neighbour", neighbour)):
        out = d.parent / "rep" / "report"
        code, _, err = run(capsys, "--data", str(d), "--statements", str(statements),
                           "--epsilon", "4", "--threshold", "0.2", "--seed", "3",
                           "--dataset", name, "--out", str(out), "-q")
        assert code == 0, err
        outs.append(out.parent)
    x, y = outs
    assert sorted(p.name for p in x.iterdir()) == sorted(p.name for p in y.iterdir()) == [
        PRIVATE, "report.json", "report.md"]
    assert _public(x / "report.json") == _public(y / "report.json")
    md_x, md_y = (x / "report.md").read_text(), (y / "report.md").read_text()
    assert md_x != md_y and _masked(md_x) == _masked(md_y)
    px = json.loads((x / PRIVATE / "report.private.json").read_text())
    py = json.loads((y / PRIVATE / "report.private.json").read_text())
    assert px["data"]["sha256"] != py["data"]["sha256"]
    assert px["data"]["read"] != py["data"]["read"]


def test_report_with_schema_and_gaussian(tmp_path, capsys) -> None:
    data = write_corpus(tmp_path)
    schema = tmp_path / "schema.toml"
    schema.write_text(
        'template = "Reviews mention {aspect} in a {sentiment} way."\n'
        '[[aspect]]\ntext = "the staff"\npattern = "staff|waiter"\n'
        '[[aspect]]\ntext = "the service"\npattern = "service"\n'
        '[[sentiment]]\ntext = "positive"\npattern = "friendly|great"\n'
        '[[sentiment]]\ntext = "negative"\npattern = "slow|cold|never"\n', encoding="utf-8")
    out = tmp_path / "rep.json"  # a suffix is accepted and replaced
    code, _stdout, err = run(capsys, "--data", str(data), "--schema", str(schema),
                            "--epsilon", "2", "--threshold", "0.1", "--noise", "gaussian",
                            "--composition", "zcdp", "--delta", "1e-6", "--bonferroni",
                            "--seed", "1", "--out", str(out), "--quiet")
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["parameters"]["candidates"] == 4
    assert doc["parameters"]["beta_per_candidate"] == pytest.approx(0.05 / 4)
    assert doc["guarantee"]["rho"] is not None and doc["guarantee"]["delta"] == 1e-6
    assert (tmp_path / "rep.md").exists()


class WordToy(ToyModel):
    """A toy model whose tokens decode to words (so drafts look like sentences)."""

    def decode(self, token_ids) -> str:
        return " ".join(f"w{int(t)}" for t in token_ids)


def test_report_with_language_model_proposer(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(report_cli, "_load_model",
                        lambda spec: WordToy(vocab_size=31, eos_token_id=0))
    data = write_corpus(tmp_path, copies=2)
    out = tmp_path / "lm"
    code, _, err = run(capsys, "--data", str(data), "--task", "Summarise the reviews",
                       "--proposals", "5", "--predicate", "embedding", "--epsilon", "1",
                       "--threshold", "0.5", "--seed", "0", "--out", str(out), "-q")
    assert code == 0, err
    doc = json.loads((tmp_path / "lm.json").read_text())
    assert doc["statements"]["source"] == "language model"
    assert doc["predicate"]["kind"] == "embedding"


def test_a_judge_changed_in_place_is_another_release(tmp_path, capsys, tiny_nli) -> None:
    """The same seed, data and judge path after the judge's weights changed: another
    release (the seed is refused for it), never a free rerun whose bounds, subtracted from
    the first run's, would show noise-free changes of the support counts."""
    import shutil

    import torch
    from transformers import AutoModelForSequenceClassification

    data, statements = write_corpus(tmp_path, copies=2), write_statements(tmp_path)
    judge = tmp_path / "judge"
    shutil.copytree(tiny_nli, judge)
    args = ["--data", str(data), "--statements", str(statements), "--predicate",
            "entailment", "--judge", str(judge), "--epsilon", "1", "--threshold", "0.1",
            "--seed", "424242", "--dataset", "reviews", "-q"]
    assert run(capsys, *args, "--out", str(tmp_path / "r1"))[0] == 0
    assert run(capsys, *args, "--out", str(tmp_path / "r1-again"))[0] == 0  # a rerun
    ledger = PrivacyLedger(os.environ["DPLANG_LEDGER"])
    assert len(ledger.releases("reviews")) == 1
    model = AutoModelForSequenceClassification.from_pretrained(judge)
    with torch.no_grad():
        model.score.weight.mul_(-1.0)
    model.save_pretrained(judge)
    code, _, err = run(capsys, *args, "--out", str(tmp_path / "r2"))
    assert code == 3 and "seed" in err, err
    assert not (tmp_path / "r2.json").exists()
    assert len(ledger.releases("reviews")) == 1


def test_budget_exceeded_is_refused_before_writing(tmp_path, capsys) -> None:
    data, statements = write_corpus(tmp_path), write_statements(tmp_path)
    ledger = PrivacyLedger(os.environ["DPLANG_LEDGER"])
    ledger.set_budget("corpus", 5.0, 1e-6)
    args = ["--data", str(data), "--statements", str(statements), "--threshold", "0.2",
            "--dataset", "corpus", "-q"]
    assert run(capsys, *args, "--epsilon", "3", "--out", str(tmp_path / "a"))[0] == 0
    assert len(ledger.releases("corpus")) == 1
    code, _, err = run(capsys, *args, "--epsilon", "3", "--out", str(tmp_path / "b"))
    assert code == 3 and err.startswith("error: ") and "budget" in err
    assert not (tmp_path / "b.json").exists() and not (tmp_path / "b.md").exists()
    assert not (tmp_path / PRIVATE / "b.private.json").exists()


@pytest.mark.parametrize(("extra", "message"), [
    (["--epsilon", "0"], "epsilon must be"),
    (["--epsilon", "-1"], "epsilon must be"),
    (["--threshold", "1.5"], "theta must be in [0, 1]"),
    (["--threshold", "-0.1"], "theta must be in [0, 1]"),
    (["--beta", "0.5"], "beta must be in (0, 1/2)"),
    (["--beta", "0"], "beta must be in (0, 1/2)"),
    (["--noise", "cauchy"], "noise must be one of"),
    (["--noise", "laplace", "--composition", "zcdp"], "zcdp"),
    (["--predicate", "oracle"], "--predicate must be"),
    (["--predicate", "entailment"], "--judge"),
    (["--seed", "-3"], "--seed"),
])
def test_bad_parameters(tmp_path, capsys, extra: list[str], message: str) -> None:
    data, statements = write_corpus(tmp_path), write_statements(tmp_path)
    base = {"--epsilon": "1", "--threshold": "0.1"}
    args = ["--data", str(data), "--statements", str(statements), "--out",
            str(tmp_path / "r")]
    for key, value in base.items():
        if key not in extra:
            args += [key, value]
    code, _, err = run(capsys, *args, *extra)
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err
    assert not (tmp_path / "r.json").exists()


def bad_input_case(tmp_path: Path, case: str) -> tuple[list[str], str]:
    data, statements = write_corpus(tmp_path), write_statements(tmp_path)
    if case == "no statements":
        statements.write_text("# only a comment\n\n", encoding="utf-8")
        return ["--data", str(data), "--statements", str(statements)], "no candidate"
    if case == "long statement":
        statements.write_text("x" * 400 + "\tx\n", encoding="utf-8")
        return ["--data", str(data), "--statements", str(statements)], "characters long"
    if case == "no rule":
        statements.write_text("A statement without a rule\n", encoding="utf-8")
        return ["--data", str(data), "--statements", str(statements)], "no keyword rule"
    if case == "bad regex":
        statements.write_text("Broken\t(unclosed\n", encoding="utf-8")
        return ["--data", str(data), "--statements", str(statements)], "regular expression"
    if case == "empty corpus":
        empty = tmp_path / "empty.csv"
        empty.write_text("text\n", encoding="utf-8")
        return ["--data", str(empty), "--statements", str(statements)], "no data rows"
    if case == "missing data":
        return ["--data", str(tmp_path / "nope.csv"), "--statements", str(statements)], \
            "not found"
    if case == "missing statements":
        return ["--data", str(data), "--statements", str(tmp_path / "nope.txt")], "not found"
    if case == "two sources":
        return ["--data", str(data), "--statements", str(statements), "--schema",
                str(statements)], "exactly one of"
    if case == "no source":
        return ["--data", str(data)], "exactly one of"
    if case == "bad column":
        return ["--data", str(data), "--statements", str(statements), "--text-column",
                "body"], "body"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["no statements", "long statement", "no rule", "bad regex",
                                  "empty corpus", "missing data",
                                  "missing statements", "two sources", "no source",
                                  "bad column"])
def test_bad_input_gives_one_line_error(tmp_path, capsys, case: str) -> None:
    args, message = bad_input_case(tmp_path, case)
    code, _, err = run(capsys, *args, "--epsilon", "1", "--threshold", "0.1", "--out",
                       str(tmp_path / "r"))
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err, err
    assert not (tmp_path / "r.json").exists()
    ledger = PrivacyLedger(os.environ["DPLANG_LEDGER"])
    assert ledger.datasets() == []


def test_blank_corpus_is_reported_not_refused(tmp_path, capsys) -> None:
    """A corpus of blank records is a neighbour of one with a usable record: it gets a report
    (whose statements have no support), not a refusal that would tell the two apart."""
    blank = tmp_path / "blank.csv"
    blank.write_text('text\n""\n"  "\n', encoding="utf-8")
    statements = tmp_path / "s.txt"
    statements.write_text("Mentions pizza\tpizza\n", encoding="utf-8")
    code, _, err = run(capsys, "--data", str(blank), "--statements", str(statements),
                       "--epsilon", "1", "--threshold", "0.1", "--out", str(tmp_path / "r"))
    assert code == 0, err
    assert (tmp_path / "r.json").exists()

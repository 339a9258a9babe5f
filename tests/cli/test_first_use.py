"""Issue 35: what a new user meets — the description of the texts, the warning without it,
a dry run, rows with no usable text told to the data holder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import dplang.cli.generate as gen_cli
from dplang.cli.app import main
from dplang.models import ToyModel
from dplang.privacy.ledger import PrivacyLedger


@pytest.fixture
def toy(monkeypatch):
    model = ToyModel(vocab_size=30, eos_after=None)
    monkeypatch.setattr(gen_cli, "_load_model", lambda spec, dtype="float32": model)
    return model


def _data(tmp: Path, blank: int = 0) -> Path:
    path = tmp / "d.csv"
    rows = [f"review number {i} was fine" for i in range(14)]
    for i in range(blank):
        rows[2 * i] = ""
    path.write_text("text\n" + "".join(f'"{r}"\n' for r in rows))
    return path


def _run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["generate", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_describe_goes_into_both_prompts_and_the_manifest(tmp_path, capsys, toy):
    out = tmp_path / "o.jsonl"
    code, _, err = _run(capsys, "--data", str(_data(tmp_path)), "--epsilon", "3", "-B", "2",
                        "-T", "3", "--describe", "  support tickets   of a bank ", "--out",
                        str(out), "-q")
    assert code == 0 and "warning" not in err, err
    fp = json.loads(out.with_name("o.manifest.json").read_text())["fingerprint"]
    assert fp["parameters"]["describe"] == "support tickets of a bank"
    assert "a collection of support tickets of a bank" in fp["prompt"]["public"]
    assert "{reference}" in fp["prompt"]["private"] and "bank" in fp["prompt"]["private"]


def test_the_bare_generic_prompt_warns(tmp_path, capsys, toy):
    code, _, err = _run(capsys, "--data", str(_data(tmp_path)), "--epsilon", "3", "-B", "2",
                        "-T", "3", "--out", str(tmp_path / "o.jsonl"), "-q")
    assert code == 0 and "warning: the generic prompt does not say what your texts are" in err
    assert "--describe" in err


@pytest.mark.parametrize(("extra", "needle"), [
    (("--prompt", "yelp", "--group-by", "label"), "applies to the generic template"),
    (("--describe", "two\nlines"), "one line"),
    (("--describe", "   "), "is empty"),
    (("--describe", "x" * 301), "at most 300"),
])
def test_bad_descriptions_are_refused(tmp_path, capsys, toy, extra, needle):
    data = tmp_path / "l.csv"
    data.write_text("text,label\n" + "".join(f"r {i},a\n" for i in range(6)))
    code, _, err = _run(capsys, "--data", str(data), "--epsilon", "3", "--describe", "x",
                        "--out", str(tmp_path / "o.jsonl"), *extra)
    assert code == 2 and needle in err, err
    assert not PrivacyLedger().datasets()


def test_a_dry_run_shows_the_plan_and_charges_and_writes_nothing(tmp_path, capsys, toy):
    out = tmp_path / "runs" / "o.jsonl"
    code, _, err = _run(capsys, "--data", str(_data(tmp_path)), "--epsilon", "3", "-B", "2",
                        "-T", "4", "--describe", "reviews", "--out", str(out), "--dry-run")
    assert code == 0, err
    assert "dry run: nothing is charged, written" in err and "(3, 1e-06)" in err
    assert "7 generations × 3 rows" in err and "estimated time: about" in err
    assert not PrivacyLedger().datasets() and not (tmp_path / "runs").exists()


def test_rows_with_no_usable_text_are_told_to_the_data_holder(tmp_path, capsys, toy):
    code, _, err = _run(capsys, "--data", str(_data(tmp_path, blank=3)), "--epsilon", "3",
                        "-B", "2", "-T", "3", "--describe", "reviews", "--out",
                        str(tmp_path / "o.jsonl"))
    assert code == 0
    assert "3 rows have no usable text (3 blank) and count as empty references" in err
    manifest = (tmp_path / "o.manifest.json").read_text()
    assert "blank" not in manifest  # the terminal only: never a public file

"""``dplang report`` on neighbouring corpora, through the CLI: a record's σ is a function of
that record alone, bit for bit, for every predicate.

Every public file and stdout must be identical except for what the mechanism releases
(decisions and bounds) and the timestamp. The support counts C the mechanism adds its noise to
may differ by at most the sensitivity 1: they are computed with the report's own plan (the
predicate and the records the command uses; each release draws fresh noise, so the released
bounds of two runs do not show them).
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from dplang.cli.app import main
from dplang.release import TIMESTAMP_FIELDS

#: The Yelp development file, read in place (never copied into the repository).
YELP = Path(__file__).resolve().parents[3] / "shared" / "data" / "yelp" / "dev.csv"


def _write(path: Path, texts: list[str | None]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text"])
        for t in texts:
            writer.writerow(["" if t is None else t])
    return path


def _yelp_rows(n: int) -> list[str]:
    if not YELP.is_file():
        pytest.skip(f"the Yelp data ({YELP}) is not beside this clone")
    rows: list[str] = []
    with YELP.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if len(rows) == n:
                break
            rows.append(row["text"])
    return rows


_BOUND = re.compile(r"-?\d\.\d{4}")
#: Where a candidate is listed (emitted table or abstention list) and how many are in each is
#: the released decision.
_LISTED = re.compile(r"^(?:\| (\d+) \| .*|- \[(\d+)\] .*)$")
_DECISION_TEXT = re.compile(r"^(?:Emitted: \d+; abstained: \d+\.|None.*|Statements whose .*|"
                            r"For these candidates .*|\| # \|.*|\|---.*)$")


def _masked(text: str) -> str:
    """Released values masked: bounds (four decimals, any sign) become L, and the lines that
    place each candidate among the emitted or the abstained become one sorted list of the
    candidates' texts (with their bounds masked). Everything else must match."""
    kept, listed = [], []
    for line in _BOUND.sub("L", text).splitlines():
        if _LISTED.match(line):
            listed.append(re.sub(r"^(?:\| \d+ \| |- \[\d+\] )", "", line).split(" | ")[0]
                          .split(" (lower bound")[0])
        elif line.strip() and not _DECISION_TEXT.match(line):
            kept.append(line)
    return "\n".join([*kept, "candidates listed:", *sorted(listed)])


def _public_json(path: Path) -> str:
    doc = json.loads(path.read_text())
    for key in (*TIMESTAMP_FIELDS, "summary"):
        doc.pop(key, None)
    for c in doc["certificates"]:
        del c["decision"], c["lower_bound"], c["simultaneous_lower_bound"]
    return json.dumps(doc, sort_keys=True)


def run_neighbours(tmp_path: Path, capsys, monkeypatch, corpus: list[str | None], blank: int,
                   *args: str) -> tuple[dict, dict]:
    """Run the same report on ``corpus`` and on it with record ``blank`` blanked (a replace-one
    neighbour), each from its own folder with the same relative paths; check the public
    outputs are equal up to the released values; return the two public JSON documents."""
    neighbour = list(corpus)
    neighbour[blank] = None
    outputs = []
    for name, texts in (("x", corpus), ("y", neighbour)):
        folder = tmp_path / name
        _write(folder / "reviews.csv", texts)
        monkeypatch.chdir(folder)
        code = main(["report", "--data", "reviews.csv", "--out", "rep/report",
                     "--release-abstained-bounds", "--seed", "1", *args])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        outputs.append((folder / "rep", captured.out))
    (x, out_x), (y, out_y) = outputs
    assert sorted(p.name for p in x.iterdir()) == sorted(p.name for p in y.iterdir()) == [
        ".dplang-private", "report.json", "report.md"]
    assert _public_json(x / "report.json") == _public_json(y / "report.json")
    assert _masked((x / "report.md").read_text()) == _masked((y / "report.md").read_text())
    assert _masked(out_x) == _masked(out_y)
    docs = tuple(json.loads((d / "report.json").read_text()) for d in (x, y))
    return docs[0], docs[1]


def count_moves(tmp_path: Path, args: list[str]) -> list[int]:
    """C − C' for every candidate: the exact support counts of the two corpora written by
    :func:`run_neighbours`, computed with the plan the report command makes (its predicate,
    its candidates, its records)."""
    from dplang.reports.pipeline import ReportRequest, plan_report
    from dplang.reports.predicates import support_counts

    options = dict(zip(args[::2], args[1::2], strict=True))
    counts = []
    for name in ("x", "y"):
        folder = tmp_path / name
        req = ReportRequest(
            data=folder / "reviews.csv", out=folder / "plan-only", epsilon=float(
                options["--epsilon"]), threshold=float(options["--threshold"]),
            statements=Path(options["--statements"]), predicate=options["--predicate"],
            similarity=float(options.get("--similarity", 0.5)),
            judge=Path(options["--judge"]) if "--judge" in options else None,
            chunk_words=int(options.get("--chunk-words", 48)), seed=1,
            ledger=tmp_path / "plan.sqlite")
        plan = plan_report(req)
        counts.append(support_counts(plan.predicate, plan.candidates, plan.texts))
    return [int(a) - int(b) for a, b in zip(counts[0], counts[1], strict=True)]


@pytest.mark.parametrize("similarity", [
    0.09265393763780594,  # the boundary cosine found on another CPU
    0.09265386313199997,  # the same sentence's cosine on this project's CPU under the old code
])
def test_embedding_report_on_yelp_neighbours(tmp_path, capsys, monkeypatch, similarity) -> None:
    """The first 22 Yelp rows against the same rows with row 21 blanked: the support count
    moves by at most 1. (A float32 product over all chunks rounded row 20's cosine with "The
    service was slow." by one ulp differently for the two chunk counts, and the count moved by
    2: L·n 18 vs 16 on this project's CPU.)"""
    statements = tmp_path / "statements.txt"
    statements.write_text("The service was slow.\nReviewers praise the food\n",
                          encoding="utf-8")
    args = ["--statements", str(statements), "--predicate", "embedding",
            "--similarity", repr(similarity), "--epsilon", "2", "--threshold", "0.5"]
    doc_x, _ = run_neighbours(tmp_path, capsys, monkeypatch, list(_yelp_rows(22)), 21, *args)
    assert doc_x["predicate"]["kind"] == "embedding"
    moves = count_moves(tmp_path, args)
    assert all(abs(m) <= 1 for m in moves), moves


def test_entailment_report_on_neighbours(tmp_path, capsys, monkeypatch, tiny_nli) -> None:
    """The entailment predicate (a local NLI judge, one pair per call) through the CLI:
    blanking one record moves each support count by at most 1 and nothing public but the
    released values."""
    corpus: list[str | None] = [
        "The pasta was great. The staff were friendly.", "Slow service and cold food.",
        "Great coffee, but the service was slow.", "Friendly staff, great desserts.",
        "The parking lot was full.", None, "Great food, great staff, great prices.",
        "The waiter was friendly and the soup was great.",
    ] * 2
    statements = tmp_path / "statements.txt"
    statements.write_text("The food was great.\nThe service was slow.\nStaff are friendly.\n",
                          encoding="utf-8")
    args = ["--statements", str(statements), "--predicate", "entailment", "--judge",
            str(tiny_nli), "--chunk-words", "6", "--epsilon", "3", "--threshold", "0.3"]
    doc_x, _ = run_neighbours(tmp_path, capsys, monkeypatch, corpus, 3, *args)
    assert doc_x["predicate"]["kind"] == "entailment"
    assert all(abs(m) <= 1 for m in count_moves(tmp_path, args))

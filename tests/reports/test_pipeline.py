"""``dplang.reports.pipeline``: a whole report run as a library call (no command line)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from dplang.io import load_references
from dplang.privacy.ledger import BudgetExceeded, PrivacyLedger
from dplang.release import make_stream_seed
from dplang.reports import (
    KeywordPredicate,
    ReportError,
    ReportRequest,
    deduplicate,
    plan_report,
    proposal_and_filter,
    read_statements_file,
    run_report,
)

REVIEWS = ["The pasta was great and the staff were friendly.",
           "Great coffee, but the service was slow.", "Slow service and cold food.",
           "Friendly staff, great desserts.", "The parking lot was full.", "",
           "Great food, great staff, great prices.", "The waiter was friendly."]


def write_corpus(tmp: Path, copies: int = 25) -> Path:
    path = tmp / "reviews.csv"
    path.write_text("text\n" + "".join(f'"{r}"\n' for _ in range(copies) for r in REVIEWS),
                    encoding="utf-8")
    return path


def write_statements(tmp: Path) -> Path:
    path = tmp / "statements.txt"
    path.write_text("Reviewers praise the food\tgreat (food|pasta|coffee|desserts)\n"
                    "Staff are described as friendly\tfriendly\n"
                    "Service is slow\tslow\n"
                    "service is slow.\tslow\n"
                    "Dogs are welcome\t\\bdogs?\\b\n", encoding="utf-8")
    return path


def _request(tmp: Path, **extra) -> ReportRequest:
    fields = {"data": write_corpus(tmp), "statements": write_statements(tmp),
              "out": tmp / "out" / "rep", "epsilon": 4.0, "threshold": 0.2, "seed": 7}
    fields.update(extra)
    return ReportRequest(**fields)


def test_run_report_releases_what_the_mechanism_computes(tmp_path) -> None:
    """The pipeline orders the work around :func:`proposal_and_filter` and adds nothing to
    it: the written certificates are the mechanism's for the same seed."""
    messages: list[str] = []

    @contextlib.contextmanager
    def status(message: str):
        messages.append(message)
        yield

    request = _request(tmp_path)
    result = run_report(request, status=status)
    assert messages == ["evaluating 4 statements on 200 records…"]
    assert result.guarantee.epsilon == 4.0 and result.charge.recorded
    doc = json.loads(result.json_path.read_text())
    records, _ = load_references(request.data)
    statements = deduplicate(read_statements_file(request.statements))
    # the mechanism's noise is rooted at H(seed, release id), never at the seed itself
    root = make_stream_seed(7, result.charge.release_id)
    assert root != 7
    direct = proposal_and_filter(statements, [r.text for r in records], KeywordPredicate(),
                                 request.config, seed=root)
    assert doc["certificates"] == [c.to_dict() for c in direct.certificates]
    assert result.report.certificates == direct.certificates
    assert oct(result.private_path.stat().st_mode & 0o777) == "0o600"
    ledger = PrivacyLedger(os.environ["DPLANG_LEDGER"])
    assert len(ledger.releases(str(request.data.resolve()))) == 1


def test_plan_fixes_candidates_and_calibration_without_writing(tmp_path) -> None:
    plan = plan_report(_request(tmp_path))
    assert len(plan.candidates) == 4 and plan.source["after_deduplication"] == 4
    assert len(plan.texts) == 200 and plan.test.n == 200
    assert plan.guarantee.epsilon == 4.0
    assert not (tmp_path / "out").exists()
    assert PrivacyLedger(os.environ["DPLANG_LEDGER"]).datasets() == []


@pytest.mark.parametrize(("extra", "message"), [
    ({"epsilon": 0.0}, "epsilon must be"),
    ({"schema": Path("x.toml")}, "exactly one of"),
    ({"predicate": "oracle"}, "--predicate must be"),
    ({"predicate": "entailment"}, "--judge"),
    ({"seed": -1}, "--seed"),
])
def test_refusals_are_one_line_report_errors(tmp_path, extra, message) -> None:
    with pytest.raises(ReportError, match=message) as info:
        run_report(_request(tmp_path, **extra))
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


def test_over_budget_raises_budget_exceeded_and_writes_nothing(tmp_path) -> None:
    PrivacyLedger(os.environ["DPLANG_LEDGER"]).set_budget("corpus", 5.0, 1e-6)
    run_report(_request(tmp_path, dataset="corpus", out=tmp_path / "a"))
    with pytest.raises(BudgetExceeded):
        run_report(_request(tmp_path, dataset="corpus", out=tmp_path / "b", seed=8))
    assert not any((tmp_path / f"b{s}").exists() for s in (".json", ".md"))
    assert not (tmp_path / ".dplang-private" / "b.private.json").exists()


def test_the_charge_comes_before_the_first_computation_on_the_records(tmp_path,
                                                                      monkeypatch) -> None:
    """Issue 34 §3: a crash that depends on a record (or a Ctrl-C) in the middle of the
    mechanism leaves the release charged; a refused charge computes nothing."""
    import dplang.reports.pipeline as pipeline

    ledger = PrivacyLedger(os.environ["DPLANG_LEDGER"])
    calls: list[int] = []

    def crashing(*args, **kwargs):
        calls.append(len(ledger.releases("corpus")) if "corpus" in ledger.datasets() else 0)
        raise KeyboardInterrupt  # as a record that crashes the predicate would, midway

    monkeypatch.setattr(pipeline, "proposal_and_filter", crashing)
    with pytest.raises(KeyboardInterrupt):
        run_report(_request(tmp_path, dataset="corpus", out=tmp_path / "a"))
    assert calls == [1]  # already charged when the mechanism started
    assert len(ledger.releases("corpus")) == 1
    assert not (tmp_path / "a.json").exists()
    # a refused charge: the mechanism never runs
    ledger.set_budget("corpus", ledger.spent("corpus").epsilon_at(1e-6) + 0.1, 1e-6)
    calls.clear()
    with pytest.raises(BudgetExceeded):
        run_report(_request(tmp_path, dataset="corpus", out=tmp_path / "b", seed=9))
    assert calls == []


def test_report_files_carry_the_start_time_not_the_end(tmp_path, monkeypatch) -> None:
    """Issue 34 §5: OUT.json / OUT.md are written after the mechanism; their modification
    time is the release's start (the manifest's ``created``), so ``stat`` does not show how
    long the computation on the records took."""
    import time

    import dplang.reports.pipeline as pipeline

    real = pipeline.proposal_and_filter

    def slow(*args, **kwargs):
        time.sleep(1.5)  # a computation whose length depends on the records
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "proposal_and_filter", slow)
    run_report(_request(tmp_path, out=tmp_path / "out" / "rep"))
    created = json.loads((tmp_path / "out" / "rep.json").read_text())["created"]
    for name in ("rep.json", "rep.md"):
        assert (tmp_path / "out" / name).stat().st_mtime == pytest.approx(created, abs=1e-3)

"""Free-text DP baselines (spec 003 §2.4): interface, generators, claim parser."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dplang.models.toy import ToyModel
from dplang.privacy.accounting import epsilon_to_rho
from dplang.reports import KeywordPredicate, Statement
from dplang.reports.freetext import (
    REPORT_PROMPT,
    ClaimParser,
    ExponentialSelectionReport,
    FreeTextMechanism,
    InvisibleInkReport,
    PublicPromptReport,
    score_claims,
)


def test_claim_parser() -> None:
    parse = ClaimParser()
    text = ("- The food was great. Service slow\n2) Staff were very friendly!\nOk.\n"
            "Here is another review: The pasta is cold.")
    assert parse(text) == ["The food was great.", "Staff were very friendly!"]
    assert parse("great food and nice staff") == ["great food and nice staff"]
    assert parse("too short") == []
    assert parse("Prices are fair. Customer review: Awful place, never again.") == [
        "Prices are fair."]


def _records(n: int) -> list[str | None]:
    words = ["great food", "slow service", "friendly staff", None, "", "cold pasta"]
    return [words[i % len(words)] for i in range(n)]


@pytest.mark.audits("invisibleink-report")
def test_invisibleink_report_runs_through_textgen_and_is_calibrated() -> None:
    model = ToyModel(vocab_size=32, eos_after=12)
    mech = InvisibleInkReport(model, epsilon=10.0, batch_size=4, max_tokens=16,
                              generations=3)
    assert isinstance(mech, FreeTextMechanism)
    records = _records(20)
    out = mech.generate(records, seed=5)
    assert len(out.texts) == 3
    assert out.guarantee.epsilon == pytest.approx(10.0, rel=1e-6)
    assert out.guarantee.adjacency == "replace-one"
    assert out.guarantee.rho == pytest.approx(epsilon_to_rho(10.0, 1e-5), rel=1e-6)
    # replace-one is calibrated at ρ/4 under replace-by-null: half the clip norm
    null = InvisibleInkReport(model, epsilon=10.0, batch_size=4, max_tokens=16,
                              generations=3, adjacency="replace-by-null")
    assert mech.guarantee(20).details["clip"] == pytest.approx(
        null.guarantee(20).details["clip"] / 2, rel=1e-9)
    # deterministic given the seed; rows past the used batches are never read
    again = mech.generate(records[:12] + ["something else entirely"] * 8, seed=5)
    assert again.texts == out.texts
    # an empty record is the public prompt (DESIGN invariant 1)
    jobs = mech.jobs(records)
    assert jobs[0].private_prompts[3] == jobs[0].public_prompt  # None
    assert jobs[0].private_prompts[0] != jobs[0].public_prompt
    assert REPORT_PROMPT.render("  ") == REPORT_PROMPT.public_text


def test_public_prompt_report_reads_no_record() -> None:
    model = ToyModel(vocab_size=32, eos_after=8)
    mech = PublicPromptReport(model, texts=2, max_tokens=10)
    a = mech.generate(_records(10), seed=1)
    b = mech.generate(["x"] * 3, seed=1)
    assert a.texts == b.texts and len(a.texts) == 2
    assert a.guarantee.epsilon == 0.0


@pytest.mark.audits("exponential-selection")
def test_exponential_selection_is_epsilon_dp_exactly() -> None:
    """Exact law of the ordered draws on neighbouring count vectors (one record moves each
    count by at most one): the worst log-ratio is ≤ ε; a mechanism spending ε per draw (r·ε in
    total) is caught."""
    stmts = [Statement(f"s{i}", rule="x") for i in range(4)]
    mech = ExponentialSelectionReport(stmts, KeywordPredicate(), epsilon=1.0, sentences=2)
    greedy = ExponentialSelectionReport(stmts, KeywordPredicate(), epsilon=2.0, sentences=2)
    base = np.array([3, 5, 1, 4])
    worst = worst_greedy = 0.0
    for shift in itertools.product((-1, 0, 1), repeat=4):
        a, b = mech.ordered_law(base), mech.ordered_law(base + np.array(shift))
        worst = max(worst, max(abs(math.log(a[t] / b[t])) for t in a))
        a, b = greedy.ordered_law(base), greedy.ordered_law(base + np.array(shift))
        worst_greedy = max(worst_greedy, max(abs(math.log(a[t] / b[t])) for t in a))
    assert worst <= 1.0 + 1e-12
    assert worst_greedy > 1.0
    assert sum(mech.ordered_law(base).values()) == pytest.approx(1.0)


def test_exponential_selection_matches_its_law_and_generates_text() -> None:
    stmts = [Statement("The food is great.", rule="great food"),
             Statement("Service is slow.", rule="slow"),
             Statement("The pasta is cold.", rule="cold pasta")]
    mech = ExponentialSelectionReport(stmts, KeywordPredicate(), epsilon=2.0, sentences=1)
    records = _records(30)
    counts = np.array([5, 5, 5])
    law = mech.ordered_law(counts)
    rng = np.random.default_rng(0)
    draws = [mech.select(counts, rng)[0] for _ in range(3000)]
    for j in range(3):
        assert np.mean(np.array(draws) == j) == pytest.approx(law[(j,)], abs=0.04)
    out = mech.generate(records, seed=2)
    assert out.texts[0] in {s.text for s in stmts}
    assert out.guarantee.epsilon == 2.0 and out.guarantee.adjacency == "replace-one"
    with pytest.raises(ValueError):
        ExponentialSelectionReport(stmts, KeywordPredicate(), epsilon=1.0, sentences=4)


def test_score_claims_groups_by_text() -> None:
    pred = KeywordPredicate()

    class P(KeywordPredicate):
        def matrix(self, statements, records):  # type: ignore[override]
            return np.array([[bool(r) and s.text.split()[0].lower() in r for r in records]
                             for s in statements])

    records = ["great food", "slow service", None, "great staff"]
    sup = score_claims([["Great stuff.", "Slow days."], [], ["Nothing here."]], P(), records)
    assert [s.tolist() for s in sup] == [[0.5, 0.25], [], [0.0]]
    assert pred.kind == "keyword"


@pytest.mark.slow
@pytest.mark.model
def test_invisibleink_report_with_the_default_model() -> None:
    """The free-text DP (doc) generator end to end with the embedded default model."""
    from dplang.models import resolve_model

    model = resolve_model("default")
    mech = InvisibleInkReport(model, epsilon=10.0, batch_size=3, max_tokens=12, generations=2)
    records = ["The food was great and the staff friendly.", "Slow service, cold food.",
               None, "Loved the coffee.", "Great location, nice staff.", "Too pricey."]
    out = mech.generate(records, seed=0)
    assert len(out.texts) == 2 and all(isinstance(t, str) for t in out.texts)
    assert out.guarantee.epsilon == pytest.approx(10.0, rel=1e-6)
    assert out.texts == mech.generate(records, seed=0).texts

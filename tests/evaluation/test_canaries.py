"""Canaries: placement, counting, the group-privacy bound, and a run through the pipeline."""

from __future__ import annotations

import json
import math
import stat
from pathlib import Path

import pytest
from scipy.stats import norm

from dplang.evaluation.canaries import (
    Canary,
    canary_table,
    count_occurrences,
    emission_bound,
    group_size,
    insert_canaries,
    make_canaries,
    ngram_overlap,
    upper_confidence,
    write_canary_report,
)

CANARY = "My neighbour Zorblat keeps seventeen violet ferrets in the laundromat."


def test_make_canaries_distinct_rows_and_texts() -> None:
    canaries = make_canaries([1, 1, 2, 5, 20], 72, seed=3)
    assert [c.repeats for c in canaries] == [1, 1, 2, 5, 20]
    rows = [r for c in canaries for r in c.rows]
    assert len(rows) == len(set(rows)) == 29 and all(0 <= r < 72 for r in rows)
    assert len({c.text for c in canaries}) == 5
    assert make_canaries([1, 1, 2, 5, 20], 72, seed=3) == canaries  # data-independent, seeded
    with pytest.raises(ValueError):
        make_canaries([20, 20], 30)


def test_insert_canaries_into_chosen_rows_only() -> None:
    texts = [f"review {i}." for i in range(6)]
    out = insert_canaries(texts, [Canary(CANARY, (1, 4))])
    assert out[1] == f"{CANARY} review 1." and out[4] == f"{CANARY} review 4."
    assert insert_canaries(texts, [Canary(CANARY, (2,))], position="end")[2] == (
        f"review 2. {CANARY}")
    assert [out[i] for i in (0, 2, 3, 5)] == [texts[i] for i in (0, 2, 3, 5)]
    assert texts[1] == "review 1."  # the input is not modified


def test_counting_verbatim_and_near_verbatim() -> None:
    outputs = [
        f"Great tacos. {CANARY.upper()} Would return.",  # verbatim (case, punctuation ignored)
        "my neighbour zorblat keeps seventeen violet ferrets in the greenhouse",  # near
        "Zorblat keeps ferrets.",  # a few words: not near (no 3-gram in common)
        "The soup was cold.",
    ]
    count = count_occurrences(CANARY, outputs)
    assert (count.generations, count.verbatim, count.near) == (4, 1, 2)
    assert count.max_overlap == 1.0
    assert ngram_overlap(CANARY, outputs[1]) == pytest.approx(7 / 8)  # 8 trigrams
    assert ngram_overlap(CANARY, outputs[2]) == 0.0
    # a verbatim match needs the words in order and contiguous
    assert count_occurrences(CANARY, ["violet ferrets " + CANARY[:30]]).verbatim == 0


def test_group_size_by_adjacency() -> None:
    assert group_size(5) == 10 and group_size(5, "zero-out") == 10
    assert group_size(5, "replace-one") == 5
    with pytest.raises(ValueError):
        group_size(1, "add-remove")


@pytest.mark.parametrize("rho", [0.01, 0.1, 1.0])
@pytest.mark.parametrize("m", [1, 2, 5])
def test_bound_holds_for_the_gaussian_mechanism(rho: float, m: int) -> None:
    """N(0, σ²) vs N(k, σ²) with σ² = 1/(2ρ) is exactly k²ρ-zCDP: the bound must dominate
    every threshold event's probability with the group shift (and be nearly tight for some)."""
    sigma = math.sqrt(1 / (2 * rho))
    k = group_size(m)
    gaps = []
    for t in [k * f for f in (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)]:
        p_without = float(norm.sf(t / sigma))
        p_with = float(norm.sf((t - k) / sigma))
        bound = emission_bound(rho, m, p_without)["bound"]
        assert bound >= p_with - 1e-9
        gaps.append(bound - p_with)
    assert min(gaps) < 0.2


def test_bound_limits_and_monotonicity() -> None:
    assert emission_bound(0.0, 3, 0.2)["bound"] == 0.2
    bounds = [emission_bound(0.01, m, 0.01)["bound"] for m in (1, 2, 5, 20)]
    assert bounds == sorted(bounds) and bounds[0] > 0.01 and bounds[-1] == 1.0
    assert emission_bound(10.0, 1, 0.3)["bound"] == 1.0
    assert 0.0 < upper_confidence(0, 24) < 0.12 < upper_confidence(2, 24) < 1.0
    assert upper_confidence(0, 24) == pytest.approx(1 - 0.05 ** (1 / 24))


def test_canary_table_and_private_report(tmp_path: Path) -> None:
    canaries = [Canary(CANARY, (0,)), Canary("Another weird line about blue herons here.",
                                             (1, 2))]
    with_out = [CANARY, "nothing", "another weird line about blue herons here", "x"]
    without = ["nothing", "x", "y", "z"]
    rows = canary_table(canaries, with_out, without, rho=0.05)
    assert [r["with"]["near"] for r in rows] == [1, 1]
    assert [r["without"]["near"] for r in rows] == [0, 0]
    assert rows[1]["group_size"] == 4 and rows[1]["rho_group"] == pytest.approx(16 * 0.05)
    assert all(r["rate_with"] <= r["bound_rate_with"] for r in rows)
    path = write_canary_report({"rows": rows}, tmp_path / "canaries.json")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text())["rows"][0]["repeats"] == 1


def test_canaries_through_the_release_pipeline_with_the_toy_model(tmp_path: Path) -> None:
    """Canary data generated through plan_generation / execute_plan (throw-away ledger): every
    generation is counted, the run is charged, and a toy model emits no canary."""
    from dplang.models import ToyModel
    from dplang.privacy.ledger import PrivacyLedger
    from dplang.textgen.orchestration import (
        GenerationRequest,
        execute_plan,
        plan_generation,
    )

    texts = [f"review {i}: the soup was fine." for i in range(12)]
    canaries = make_canaries([1, 2, 5], 12, seed=1)
    data = tmp_path / "with.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n"
                            for t in insert_canaries(texts, canaries)))
    ledger = tmp_path / "ledger.sqlite"
    req = GenerationRequest(data=data, out=tmp_path / "out.jsonl", batch_size=3, max_tokens=8,
                            temperature=1.0, top_k=0, epsilon=1.0, ledger=ledger, seed=5)
    model = ToyModel(vocab_size=40, eos_token_id=0, eos_after=None)
    plan = plan_generation(req, lambda _spec: model)
    execute_plan(plan)
    outputs = [json.loads(line)["text"] for line in req.out.read_text().splitlines()]
    assert len(outputs) == 4
    rows = canary_table(canaries, outputs, outputs, rho=plan.guarantee.rho or 0.0)
    assert [r["with"]["near"] for r in rows] == [0, 0, 0]
    assert [r["repeats"] for r in rows] == [1, 2, 5]
    book = PrivacyLedger(ledger)
    assert [len(book.releases(d)) for d in book.datasets()] == [1]

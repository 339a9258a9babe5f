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
    parallel_bound,
    rate_interval,
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


# ---------------------------------------------------------------- batches, bounds, the run


def test_make_canaries_by_batch_keeps_one_canary_per_batch() -> None:
    repeats = [1, 2, 5, 20, 50]
    canaries = make_canaries(repeats, 96, seed=4, batch_size=3)
    assert [c.repeats for c in canaries] == repeats
    owners: dict[int, set[int]] = {}
    for i, c in enumerate(canaries):
        batches = {r // 3 for r in c.rows}
        assert len(batches) == math.ceil(c.repeats / 3)  # whole batches of its own
        for b in batches:
            owners.setdefault(b, set()).add(i)
    assert all(len(o) == 1 for o in owners.values())
    assert make_canaries(repeats, 96, seed=4, batch_size=3) == canaries
    with pytest.raises(ValueError, match="whole batches"):
        make_canaries(repeats, 81, seed=4, batch_size=3)  # 28 batches needed, 27 exist


@pytest.mark.parametrize("rho", [0.02, 0.2, 1.5])
@pytest.mark.parametrize("per_generation", [[1] + [0] * 31, [3, 3, 0, 0, 2] + [0] * 27,
                                            [1] * 16 + [0] * 16])
def test_parallel_bound_holds_for_independent_gaussian_generations(
        rho: float, per_generation: list[int]) -> None:
    """n generations, each a Gaussian mechanism of its own batch (k²ρ-zCDP for k changed
    references: N(0, σ²) vs N(k, σ²)); the event is a threshold. The bound must dominate the
    exact expected rate with the canary, and be no weaker than the group bound."""
    sigma = math.sqrt(1 / (2 * rho))
    n = len(per_generation)
    m = sum(per_generation)
    for t in (0.5, 1.0, 2.0, 4.0, 8.0):
        p_without = float(norm.sf(t * 2 / sigma))
        rate_with = sum(float(norm.sf((t * 2 - 2 * c) / sigma)) for c in per_generation) / n
        bound = parallel_bound(rho, per_generation, p_without)
        assert bound["affected"] == sum(c > 0 for c in per_generation)
        assert bound["bound"] >= rate_with - 1e-9
        assert bound["bound"] <= emission_bound(rho, m, p_without)["bound"] + 1e-9
    # a canary that no generation reads cannot move the rate
    assert parallel_bound(rho, [0] * n, 0.01)["bound"] == 0.01


def test_parallel_bound_limits_one_reference_to_one_generation() -> None:
    # ε = 10 (ρ ≈ 1.54) makes the group bound trivial, but one reference moves 1 of 32 texts
    one = parallel_bound(1.54, [1] + [0] * 31, 0.09)["bound"]
    assert 0.09 < one <= 0.09 + 1 / 32 + 1e-12 and emission_bound(1.54, 1, 0.09)["bound"] == 1
    assert rate_interval(0, 32)[0] == 0.0 and rate_interval(0, 32)[1] == pytest.approx(
        1 - 0.025 ** (1 / 32))
    lo, hi = rate_interval(8, 32)
    assert lo < 0.25 < hi


def test_canary_table_compares_each_canary_with_the_data_without_it() -> None:
    x, y = Canary(CANARY, (0, 1)), Canary("Another weird line about blue herons here.", (6,))
    batches = [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    # X's rows are in generation 0 only; generation 2 reads Y (and happens to say X)
    with_out = [CANARY, "nothing", CANARY, "x"]
    without = ["nothing", "nothing", "z", "x"]
    rows = canary_table([x, y], with_out, without, rho=0.05, batches=batches)
    assert rows[0]["with"]["near"] == 2 and rows[0]["without"]["near"] == 0
    # without X: generation 0 from the run without canaries, the others from the run with them
    assert rows[0]["baseline"]["near"] == 1
    assert rows[0]["affected_generations"] == 1 and rows[0]["max_rows_in_a_batch"] == 2
    assert rows[0]["p_without_upper"] == pytest.approx(upper_confidence(1, 4))
    assert rows[1]["affected_generations"] == 1 and rows[1]["baseline"]["near"] == 0
    for r in rows:
        assert r["bound_parallel"] <= r["bound_rate_with"] + 1e-12
    with pytest.raises(ValueError, match="two canaries"):
        canary_table([x, Canary("Blue herons again, weirdly.", (2,))], with_out, without,
                     rho=0.05, batches=batches)
    with pytest.raises(ValueError, match="missed the references"):
        canary_table([Canary(CANARY, (12,))], with_out, without, rho=0.05, batches=batches)


class _Recording:
    """A ToyModel that records every prompt it is asked to encode."""

    def __init__(self) -> None:
        from dplang.models import ToyModel

        self.model = ToyModel(vocab_size=40, eos_token_id=0, eos_after=None)
        self.prompts: list[str] = []
        encode, add = self.model.encode_prompts, self.model.add_prompts

        def encode_prompts(prompts):
            self.prompts.extend(prompts)
            return encode(prompts)

        def add_prompts(state, prompts, prefixes=None):
            self.prompts.extend(prompts)
            return add(state, prompts, prefixes)

        self.model.encode_prompts = encode_prompts
        self.model.add_prompts = add_prompts


def _toy_data(path: Path, n: int = 48) -> Path:
    path.write_text("text\n" + "".join(f"review {i}: the soup was fine.\n" for i in range(n)))
    return path


def test_run_canaries_through_the_release_pipeline(tmp_path: Path, monkeypatch) -> None:
    """The run generates both copies through the pipeline with a throw-away ledger in a
    temporary folder that is removed, inserts every canary into the references the
    generations read, and couples the two runs: generations reading no canary are identical."""
    import tempfile

    from dplang.experiments.canary_run import (
        CanaryRunError,
        CanaryRunSettings,
        render_canaries,
        run_canaries,
        write_canary_outputs,
    )
    from dplang.privacy.ledger import PrivacyLedger

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    data = _toy_data(tmp_path / "data.csv")
    rec = _Recording()
    settings = CanaryRunSettings(data=data, epsilons=(1.0, 10.0), repeats=(1, 2, 5), num=12,
                                 batch_size=3, max_tokens=6, top_k=0, temperature=1.0)
    result = run_canaries(settings, load_model=lambda _spec: rec.model)
    assert list(scratch.iterdir()) == []  # the copies of the data and the ledger are gone
    assert PrivacyLedger().datasets() == []  # the user's ledger was not touched
    assert [c["epsilon"] for c in result["cells"]] == [1.0, 10.0]
    for cell in result["cells"]:
        assert cell["generations"] == 12 and [r["repeats"] for r in cell["rows"]] == [1, 2, 5]
        assert cell["coupling"]["batches_without_canary"] == 12 - 4  # 1 + 1 + 2 batches
        assert cell["coupling"]["identical"] == cell["coupling"]["batches_without_canary"]
        assert all(r["bound_parallel"] <= r["bound_rate_with"] + 1e-12 for r in cell["rows"])
    for canary in result["canaries"]:  # in the private prompts of exactly its rows
        seen = sum(p.count(canary["text"]) for p in rec.prompts)
        assert seen == 2 * canary["repeats"]  # one run with canaries per ε
    assert "secret" in result["settings"]["seed"]
    text = json.dumps(result)
    assert "ledger" not in text and str(scratch) not in text
    written = write_canary_outputs(result, tmp_path / "out")
    assert {p.name for p in written} == {"canaries.md", "canaries.png", "canaries.json"}
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in written)
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o700  # sizes, times private
    assert "| 10 | 5 | 10 | 2 |" in render_canaries(result)
    with pytest.raises(CanaryRunError, match="raise --num to at least 4"):
        run_canaries(CanaryRunSettings(data=data, repeats=(1, 2, 5), num=3, batch_size=3))
    with pytest.raises(CanaryRunError, match="need 150 rows"):
        run_canaries(CanaryRunSettings(data=data, repeats=(1,), num=50, batch_size=3),
                     load_model=lambda _spec: rec.model)


def test_cli_evaluate_canaries(tmp_path: Path, monkeypatch, capsys) -> None:
    import dplang.models
    from dplang.cli.app import main

    rec = _Recording()
    monkeypatch.setattr(dplang.models, "resolve_model", lambda _spec: rec.model)
    data = _toy_data(tmp_path / "data.csv")
    out = tmp_path / "canaries"
    args = ["evaluate", "canaries", "--data", str(data), "--out", str(out), "--epsilon", "1,10",
            "--repeats", "1,2,5", "--num", "12", "-B", "3", "-T", "5", "--top-k", "0"]
    assert main(args) == 0, capsys.readouterr().err
    stdout = capsys.readouterr().out
    assert "| ε | m | k = 2m |" in stdout and "identical in both runs" in stdout
    for name in ("canaries.md", "canaries.png", "canaries.json"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600, name
    assert [c["epsilon"] for c in json.loads((out / "canaries.json").read_text())["cells"]] == [
        1.0, 10.0]
    assert main(args) == 2  # results exist
    assert "already exists" in capsys.readouterr().err
    assert main([*args[:-8], "--num", "3", "-B", "3", "--out", str(tmp_path / "o2")]) == 2
    assert "raise --num" in capsys.readouterr().err
    assert main(["evaluate", "--num", "5", "canaries", "--data", str(data), "--out",
                 str(tmp_path / "o3")]) == 2
    assert "do not go with `canaries`" in capsys.readouterr().err
    assert main(["evaluate", "--synthetic", str(data), "--out", str(tmp_path / "o4")]) == 2
    assert "missing option --real" in capsys.readouterr().err
    assert not (tmp_path / "o2").exists() and not (tmp_path / "o3").exists()


def _leaky_model():
    """A toy model with a cross-batch leak (like a cache shared between groups): once it has
    seen a canary, every later generation changes, those that read no canary included."""
    from dplang.models import ToyModel

    class Leaky(ToyModel):
        leaked = False

        def logits_for(self, prompt, prefix):
            if "My neighbour" in prompt:
                self.leaked = True
            out = super().logits_for(prompt, prefix)
            return out[::-1].copy() if self.leaked else out

    return Leaky(vocab_size=40, eos_token_id=0, eos_after=None)


def test_a_failed_coupling_check_is_reported_not_just_counted(tmp_path: Path,
                                                             monkeypatch, capsys) -> None:
    """Generations that read no canary but differ between the runs are a pipeline bug: the
    comparison "without X" and both bounds rest on them; the run says so (result, table, and
    the command's exit status) instead of printing a count next to bounds that do not hold."""
    import dplang.models
    from dplang.cli.app import main
    from dplang.experiments.canary_run import CanaryRunSettings, render_canaries, run_canaries

    data = _toy_data(tmp_path / "data.csv")
    settings = CanaryRunSettings(data=data, epsilons=(1.0,), repeats=(1, 2), num=8,
                                 batch_size=3, max_tokens=6, top_k=0, temperature=1.0, seed=3)
    result = run_canaries(settings, load_model=lambda _spec: _leaky_model())
    coupling = result["cells"][0]["coupling"]
    assert coupling["identical"] < coupling["batches_without_canary"]
    assert coupling["ok"] is False
    assert "MISMATCH" in render_canaries(result)
    good = run_canaries(settings, load_model=lambda _spec: _Recording().model)
    assert good["cells"][0]["coupling"]["ok"] is True
    assert "MISMATCH" not in render_canaries(good)

    monkeypatch.setattr(dplang.models, "resolve_model", lambda _spec: _leaky_model())
    out = tmp_path / "out"
    code = main(["evaluate", "canaries", "--data", str(data), "--out", str(out), "--epsilon",
                 "1", "--repeats", "1,2", "--num", "8", "-B", "3", "-T", "6", "--top-k", "0",
                 "--seed", "3", "--quiet"])
    err = capsys.readouterr().err
    assert code != 0 and "coupling check failed" in err, err
    assert (out / "canaries.json").exists()  # written, for the diagnosis

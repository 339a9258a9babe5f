"""Proposal-and-filter: guarantee, certificates, determinism, honesty, serialisation."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from dplang.privacy.audit import max_log_ratio
from dplang.privacy.randomness import RandomStreams
from dplang.reports import (
    CallablePredicate,
    FilterConfig,
    KeywordPredicate,
    ReportConfigError,
    Statement,
    calibrate,
    certify_counts,
    proposal_and_filter,
    report_to_dict,
    report_to_markdown,
)


def corpus() -> tuple[list[Statement], list[str | None]]:
    records: list[str | None] = (["great food and friendly staff"] * 40
                                 + ["slow service, great food"] * 25
                                 + ["parking was hard"] * 5 + [None] * 10)
    statements = [Statement("Food is praised", r"great food"),
                  Statement("Service is slow", r"slow"),
                  Statement("Parking is hard", r"parking"),
                  Statement("Dogs are welcome", r"\bdogs?\b")]
    return statements, records


@pytest.mark.parametrize(("noise", "composition"), [("discrete-laplace", "basic"),
                                                    ("laplace", "basic"),
                                                    ("gaussian", "basic"),
                                                    ("gaussian", "zcdp")])
def test_guarantee_composes_over_candidates(noise: str, composition: str) -> None:
    cfg = FilterConfig(epsilon=2.0, beta=0.05, theta=0.1, noise=noise, delta=1e-5,
                       composition=composition)
    test, g = calibrate(cfg, m=7, n=1000)
    assert (g.mechanism, g.unit, g.adjacency) == ("proposal-and-filter", "record", "replace-one")
    if composition == "basic":
        assert g.epsilon == 2.0 and g.rho is None
        assert test.epsilon * 7 <= 2.0
        assert test.epsilon == pytest.approx(2.0 / 7, rel=1e-15)
        assert g.delta == (1e-5 if noise == "gaussian" else 0.0)
    else:
        assert g.rho == pytest.approx(7 * test.rho, rel=1e-12)
        assert g.epsilon == pytest.approx(2.0, rel=1e-9) and g.delta == 1e-5
        assert test.scale == pytest.approx(1 / math.sqrt(2 * test.rho))


def test_bonferroni_divides_beta() -> None:
    cfg = FilterConfig(epsilon=1.0, beta=0.05, theta=0.1, bonferroni=True)
    test, g = calibrate(cfg, m=10, n=100)
    assert test.beta == pytest.approx(0.005)
    assert g.details["bonferroni"] is True
    plain, _ = calibrate(FilterConfig(epsilon=1.0, beta=0.05, theta=0.1), m=10, n=100)
    assert test.tau_count > plain.tau_count


def test_config_validation() -> None:
    for bad in (dict(epsilon=0.0), dict(epsilon=-1.0), dict(epsilon=math.inf),
                dict(epsilon=1.0, beta=0.5), dict(epsilon=1.0, beta=0.0),
                dict(epsilon=1.0, theta=1.01), dict(epsilon=1.0, theta=-0.1),
                dict(epsilon=1.0, noise="cauchy"),
                dict(epsilon=1.0, composition="zcdp"),
                dict(epsilon=1.0, noise="gaussian", delta=0.0)):
        with pytest.raises(ReportConfigError):
            FilterConfig(**bad).validate()


def test_end_to_end_report_is_deterministic_given_the_seed() -> None:
    statements, records = corpus()
    cfg = FilterConfig(epsilon=8.0, beta=0.05, theta=0.1)
    a = proposal_and_filter(statements, records, KeywordPredicate(), cfg, seed=11)
    b = proposal_and_filter(statements, records, KeywordPredicate(), cfg, seed=11)
    assert [c.to_dict() for c in a.certificates] == [c.to_dict() for c in b.certificates]
    assert a.n == 80  # blank records count: n is the number of rows
    decisions = {c.statement: c.decision for c in a.certificates}
    assert decisions["Food is praised"] == "emit"
    assert decisions["Dogs are welcome"] == "abstain"
    for c in a.emitted:
        assert c.lower_bound is not None and c.lower_bound >= cfg.theta
    for c in a.abstained:
        assert c.lower_bound is None


def test_each_candidate_uses_its_own_stream() -> None:
    """Candidate j's noise depends only on (seed, j): adding a candidate at the end does not
    change the others' bounds (beyond the changed ε₀ calibration, held fixed here)."""
    cfg = FilterConfig(epsilon=1.0, beta=0.05, theta=0.0, release_abstained_bounds=True)
    counts = np.array([10, 20, 30])
    r1 = certify_counts(["a", "b", "c"], counts, 100, cfg, RandomStreams(5))
    test = r1.test
    for j, c in enumerate(r1.certificates):
        z = test.sample(RandomStreams(5).generator(j))
        assert c.lower_bound == pytest.approx(test.lower_bound(int(counts[j]), z))


def test_release_abstained_bounds_option() -> None:
    cfg = FilterConfig(epsilon=1.0, beta=0.05, theta=0.9, release_abstained_bounds=True)
    r = certify_counts(["a", "b"], [1, 2], 100, cfg, RandomStreams(0))
    assert all(c.decision == "abstain" and c.lower_bound is not None for c in r.certificates)


def test_certificates_never_carry_noise_seed_or_exact_support() -> None:
    n, seed = 7919, 987_654_321
    counts = [4567, 1234, 6001]
    statements = ["first claim", "second claim", "third claim"]
    for noise in ("laplace", "discrete-laplace", "gaussian"):
        cfg = FilterConfig(epsilon=0.9, beta=0.05, theta=0.1, noise=noise,
                           release_abstained_bounds=True)
        report = certify_counts(statements, counts, n, cfg, RandomStreams(seed),
                                KeywordPredicate())
        text = json.dumps(report_to_dict(report)) + report_to_markdown(report)
        assert str(seed) not in text
        for j, count in enumerate(counts):
            z = report.test.sample(RandomStreams(seed).generator(j))
            forbidden = [repr(count / n), f"{count / n:.4f}", str(count)]
            if noise != "discrete-laplace":  # small integer draws would match anywhere
                forbidden += [repr(z / n), repr(z)]
            for item in forbidden:
                assert item not in text, (noise, item)
        keys = set()
        for c in report_to_dict(report)["certificates"]:
            keys |= set(c)
        assert not keys & {"seed", "noise_draw", "noise_value", "count", "support",
                           "true_support", "z"}


def test_honesty_small_monte_carlo() -> None:
    """Theorem 5.1 on a candidate just below θ: empirical emission rate ≤ β (+3 s.e.)."""
    cfg = FilterConfig(epsilon=0.5, beta=0.1, theta=0.2)
    test, _ = calibrate(cfg, m=1, n=200)
    count = 39  # f = 0.195 < θ
    emits = sum(test.emits(count, test.sample(RandomStreams(3).generator(i)), cfg.theta)
                for i in range(3000))
    p = test.emit_probability(count, cfg.theta)
    assert p <= cfg.beta
    assert emits / 3000 <= p + 3 * math.sqrt(p * (1 - p) / 3000) + 1e-3


@pytest.mark.audits("proposal-and-filter")
def test_whole_report_is_eps_dp_for_small_m_exactly() -> None:
    """Exact law of the emitted set for m = 2 candidates on neighbouring corpora (one record
    flips both predicates): max log-ratio ≤ ε = 2·ε₀."""
    cfg = FilterConfig(epsilon=0.6, beta=0.1, theta=0.3)
    test, g = calibrate(cfg, m=2, n=50)

    def law(counts: tuple[int, int]) -> list[float]:
        out = []
        for pattern in itertools.product((0, 1), repeat=2):
            p = 1.0
            for bit, c in zip(pattern, counts, strict=True):
                p *= (test.emit_probability(c, cfg.theta) if bit
                      else test.abstain_probability(c, cfg.theta))
            out.append(p)
        return out

    worst = max(max_log_ratio(law((c, c)), law((c + 1, c + 1))) for c in range(0, 50))
    assert worst <= g.epsilon + 1e-9


def test_callable_predicate_and_empty_inputs() -> None:
    pred = CallablePredicate(lambda s, r: s.split()[0] in r, "first word")
    cfg = FilterConfig(epsilon=5.0, theta=0.2)
    r = proposal_and_filter(["apple pie", "kiwi tart"], ["apple", "apple", None, "pear"],
                            pred, cfg, seed=0)
    assert r.n == 4 and r.m == 2
    with pytest.raises(ReportConfigError):
        proposal_and_filter([], ["x"], pred, cfg, seed=0)
    with pytest.raises(ReportConfigError):
        proposal_and_filter(["a"], [], pred, cfg, seed=0)


def test_markdown_states_guarantee_and_abstentions() -> None:
    statements, records = corpus()
    cfg = FilterConfig(epsilon=8.0, beta=0.05, theta=0.1)
    r = proposal_and_filter(statements, records, KeywordPredicate(), cfg, seed=2)
    md = report_to_markdown(r)
    assert "pure 8-differential privacy" in md
    assert "Abstentions" in md and "Dogs are welcome" in md
    assert "lower bound" in md

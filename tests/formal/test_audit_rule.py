"""The audit's method rule (exact when the output space has ≤ 2^16 atoms, Monte Carlo
otherwise), the black-box Monte Carlo audit, and ``dplang formal audit`` printing the method."""

from __future__ import annotations

import numpy as np
import pytest

from dplang.cli.app import main
from dplang.formal import limit
from dplang.formal.audit import (
    EXACT_AUDIT_MAX_OUTPUTS,
    audit,
    choose_method,
    monte_carlo_audit,
    output_space_size,
    twin,
)
from dplang.formal.collections import sperner
from dplang.formal.statistical import (
    JointThresholdGenerator,
    PointerGenerator,
    PrefixCountGenerator,
    SoftMarginIdentifier,
)
from dplang.formal.truth import instance
from dplang.privacy.mechanisms import exponential_mechanism


def test_the_rule_is_a_threshold_on_the_output_space():
    assert EXACT_AUDIT_MAX_OUTPUTS == 2**16
    assert choose_method(2**16)[0] == "exact"
    assert choose_method(2**16 + 1)[0] == "monte-carlo"
    assert choose_method(float("inf"))[0] == "monte-carlo"
    assert choose_method(4, "monte-carlo") == ("monte-carlo",
                                               "forced; the output space has 4 atoms")
    assert choose_method(2**20, "exact")[0] == "exact"
    with pytest.raises(ValueError, match="method"):
        choose_method(4, "guess")
    r57 = instance("remark-5.7").collection
    assert output_space_size(PrefixCountGenerator(k=2, tau=2, big_m=3), r57) == 2
    assert output_space_size(JointThresholdGenerator(k=2, tau=1, mbar=4), r57) == 8
    assert output_space_size(PointerGenerator(k=2), r57) == 1  # deterministic
    assert output_space_size(limit.ApproximateIntersectionGenerator(1.0), None) == 40_200
    assert output_space_size(limit.UniformPrivateGenerator(1.0), sperner(16)) == 2**16
    assert output_space_size(limit.UniformPrivateGenerator(1.0), sperner(17)) == 2**17


@pytest.mark.audits("formal-000")
def test_monte_carlo_audit_bounds_a_known_loss():
    """Randomised response with log-ratio 1 on each output: ε̂ is a lower bound close to 1."""
    p = 1 / (1 + np.exp(-1.0))

    def rr(bit):
        return lambda rng, size: (rng.random(size) < (p if bit else 1 - p)).tolist()

    eps_hat, detail = monte_carlo_audit(rr(1), rr(0), 200_000, np.random.default_rng(0))
    assert 0.9 < eps_hat <= 1.0 and "200000 runs" in detail
    same, _ = monte_carlo_audit(rr(1), rr(1), 20_000, np.random.default_rng(1))
    assert same < 0.1


@pytest.mark.audits("formal-000", "formal-001")
def test_auto_picks_monte_carlo_for_a_large_output_space_and_exact_otherwise():
    sp17 = instance("sperner", k=17)  # 2^17 subsets
    rep = audit(limit.UniformPrivateGenerator(1.0), sp17, 1.0, trials=4000)
    assert rep.method == "monte-carlo" and rep.passed and rep.statistic <= 1.0
    assert "131,072 > 2^16" in rep.method_line()
    sp4 = instance("sperner", k=4)
    rep4 = audit(limit.UniformPrivateGenerator(1.0), sp4, 1.0)
    assert rep4.method == "exact" and rep4.statistic == pytest.approx(0.677452, abs=1e-6)
    assert not audit(limit.twin(limit.UniformPrivateGenerator(1.0)), sp4, 1.0).passed
    # forced Monte Carlo catches gross violations: Δ = 2/n (loss ≫ ε) and a non-private rule
    ns = instance("nested-segments")
    bad = audit(twin(SoftMarginIdentifier(k=4, epsilon=1.0)), ns, 1.0, method="monte-carlo",
                trials=2000)
    assert bad.method == "monte-carlo" and not bad.passed and bad.statistic > 1.0
    ok = audit(SoftMarginIdentifier(k=4, epsilon=1.0), ns, 1.0, method="monte-carlo",
               trials=2000)
    assert ok.passed


def test_batched_subset_draws_equal_single_mechanism_calls():
    coll = sperner(6)
    upg = limit.UniformPrivateGenerator(1.5)
    data = np.array([0, 1, 1, 7])
    scores = upg.scores(limit._masks(data, coll), len(data), coll)
    rng = np.random.default_rng(5)
    single = [exponential_mechanism(scores, upg.temperature(), rng) for _ in range(300)]
    assert upg.sample_subsets(data, coll, np.random.default_rng(5), 300).tolist() == single


def run(capsys, *args):
    code = main(["formal", "audit", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.audits("formal-000")
def test_cli_prints_method_and_verdict(capsys):
    code, out, _ = run(capsys, "prefix-count", "--instance", "remark-5.7", "--epsilon", "1")
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith("PASS")
    assert lines[1] == "method: exact (the output space has 2 ≤ 2^16 atoms)"
    code, out, _ = run(capsys, "pointer", "--instance", "remark-5.7", "--epsilon", "1",
                       "--monte-carlo", "--trials", "1000")
    assert code == 1 and out.startswith("FAIL") and "Monte Carlo lower bound" in out
    assert "method: monte-carlo (forced; the output space has 1 atom)" in out
    code, out, _ = run(capsys, "uniform-private", "--instance", "sperner", "--k", "17",
                       "--epsilon", "1", "--trials", "2000")
    assert code == 0 and "method: monte-carlo (the output space has 131,072 > 2^16 atoms)" in out
    code, _, err = run(capsys, "prefix-count", "--instance", "remark-5.7", "--epsilon", "1",
                       "--exact", "--monte-carlo")
    assert code == 2 and err.startswith("error: give at most one of --exact and --monte-carlo")

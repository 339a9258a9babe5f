import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dplang.privacy.audit import max_log_ratio
from dplang.privacy.mechanisms import exponential_mechanism_probabilities
from dplang.textgen.distributions import softmax64
from dplang.textgen.methods import amin

EPS = (1, 3, 5, 10)


@pytest.mark.parametrize("b", [31, 63, 127])
@pytest.mark.parametrize("eps", EPS)
def test_paper_infeasible_cells_exactly(b, eps):
    """Spec §6.1 item 18: σ = 0.3, 100 private tokens, δ = 1e-6 → INF at B=31 for every ε,
    B=63 for ε ≤ 5, B=127 for ε = 1 (Table 2)."""
    infeasible = b == 31 or (b == 63 and eps <= 5) or (b == 127 and eps == 1)
    if infeasible:
        with pytest.raises(amin.InfeasibleBudget, match="infeasible"):
            amin.calibrate(eps, 1e-6, b, 1.0, 0.3, 100, "paper")
    else:
        budget = amin.calibrate(eps, 1e-6, b, 1.0, 0.3, 100, "paper")
        assert budget.clip > 0


@pytest.mark.parametrize(("b", "eps", "clip"),
                         [(127, 3, 3.906), (127, 5, 10.244), (127, 10, 21.263), (63, 10, 8.817)])
def test_paper_clip_values(b, eps, clip):
    assert amin.calibrate(eps, 1e-6, b, 1.0, 0.3, 100, "paper").clip == pytest.approx(clip,
                                                                                      abs=2e-3)


@pytest.mark.audits("amin")
@pytest.mark.parametrize("convention", ["correct", "paper"])
def test_calibration_spends_the_budget(convention):
    from dplang.privacy import epsilon_to_rho

    budget = amin.calibrate(10, 1e-6, 127, 1.2, 0.3, 100, convention)
    assert budget.rho == pytest.approx(epsilon_to_rho(10, 1e-6), rel=1e-6)
    g = amin.AminParams(budget, 10, 1e-6, 127, 1.2, 1.0, 0.7, 0.3).guarantee()
    assert g.adjacency == ("replace-by-null" if convention == "correct" else "zero-out")


def _agg(rows, public, clip, b):
    """The policy's aggregate (the scores its private tokens are sampled from)."""
    return torch.from_numpy(amin.aggregate(rows, public, clip, b))


@pytest.mark.audits("amin")
@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 9999), b=st.integers(1, 8), clip=st.floats(0.1, 10))
def test_aggregate_sensitivity_is_2c_over_b(seed, b, clip):
    g = torch.Generator().manual_seed(seed)
    public = torch.randn(30, generator=g, dtype=torch.float64) * 5
    rows = torch.randn(b, 30, generator=g, dtype=torch.float64) * 20
    full = _agg(rows, public, clip, b)
    for j in range(b):
        other = _agg(torch.cat([rows[:j], rows[j + 1:]]), public, clip, b)
        diff = float((full - other).abs().max())
        assert diff <= amin.logit_sensitivity(clip, b, "correct") + 1e-9
        # the SVT distance moves by at most the correct query sensitivity
        d_full = float(np.abs(softmax64(full) - softmax64(public)).sum())
        d_other = float(np.abs(softmax64(other) - softmax64(public)).sum())
        assert abs(d_full - d_other) <= amin.svt_query_sensitivity(clip, b, "correct") + 1e-9


@pytest.mark.audits("amin")
def test_paper_convention_is_caught():
    """The paper's C/B and 1/B sensitivities are exceeded by a replace-by-null neighbour."""
    b, clip = 4, 2.0
    public = torch.zeros(10, dtype=torch.float64)
    public[0] = 10.0
    rows = public.expand(b, 10).clone()
    rows[0] = -public  # a reference that inverts the public preference
    full = _agg(rows, public, clip, b)
    other = _agg(rows[1:], public, clip, b)
    diff = float((full - other).abs().max())
    assert diff > amin.logit_sensitivity(clip, b, "paper") + 1e-6
    assert diff <= amin.logit_sensitivity(clip, b, "correct") + 1e-9
    d = [float(np.abs(softmax64(x) - softmax64(public)).sum()) for x in (full, other)]
    assert abs(d[0] - d[1]) > amin.svt_query_sensitivity(clip, b, "paper")
    # the private-token exponential mechanism: exact loss within 2Δ/τ only for the correct Δ
    tau = 1.0
    p = exponential_mechanism_probabilities(full.numpy(), tau)
    q = exponential_mechanism_probabilities(other.numpy(), tau)
    loss = max_log_ratio(p, q)
    assert loss <= 2 * amin.logit_sensitivity(clip, b, "correct") / tau + 1e-9
    assert loss > 2 * amin.logit_sensitivity(clip, b, "paper") / tau


def test_policy_caps_private_tokens():
    budget = amin.calibrate(10, 1e-6, 3, 1.0, 0.3, 2, "correct")
    pol = amin.AminPolicy(budget, 3, 1.0, threshold=-100.0)  # SVT always says "private"
    rng = np.random.default_rng(0)
    public = torch.randn(20)
    priv = torch.randn(3, 20)
    toks = [pol.choose(public, priv, None, rng) for _ in range(3)]
    assert toks[0] is not None and toks[1] is not None and toks[2] is None
    assert pol.stats()["private_tokens"] == 2
    assert math.isfinite(budget.rho)


# ------------------------------------------------------------------ release-path checks


def _policy_scores(monkeypatch, rows, public, clip, b):
    """The scores the policy's private-token exponential mechanism actually receives (the SVT
    is forced to answer "private")."""
    seen = []

    def record(scores, temperature, rng, **_kwargs):
        seen.append(np.array(scores, dtype=np.float64))
        return 0

    monkeypatch.setattr(amin, "exponential_mechanism", record)
    budget = amin.AminBudget(clip, 1.0, 0.5, 0.5, 10, "correct")
    policy = amin.AminPolicy(budget, b, 1.0, threshold=-1e9)
    policy.choose(public, rows, None, np.random.default_rng(0))
    assert len(seen) == 1
    return seen[0]


def _exact_gap(a, b):
    from fractions import Fraction

    return max(abs(Fraction(float(x)) - Fraction(float(y))) for x, y in zip(a, b, strict=True))


@pytest.mark.audits("amin")
def test_the_sampled_aggregate_is_within_2c_over_b_exactly(monkeypatch):
    """The aggregate the policy samples from moves by at most Δ = 2C/B when one reference is
    replaced by the empty one — in exact arithmetic on the float64 values the sampler gets, for
    float32 logits at 20–40 (where a float32 aggregate exceeds 2C/B by ~3e-6), extreme and
    non-finite private logits included."""
    from fractions import Fraction

    g = torch.Generator().manual_seed(0)
    c, b = 0.05, 7
    bound = Fraction(2) * Fraction(c) / b
    for trial in range(300):
        public = (20 + 20 * torch.rand(64, generator=g)).to(torch.float32)
        rows = (public + 3 * torch.randn(b, 64, generator=g)).to(torch.float32)
        if trial % 10 == 0:  # extreme private logits: the clip still holds
            rows[0, :4] = torch.tensor([math.nan, math.inf, -math.inf, 3.0e38])
        j = trial % b
        full = _policy_scores(monkeypatch, rows, public, c, b)
        nulled = _policy_scores(monkeypatch, torch.cat([rows[:j], rows[j + 1:]]), public, c, b)
        assert np.isfinite(full).all()
        assert _exact_gap(full, nulled) <= bound
    # worst cases in exact arithmetic: a reference whose top token is the public prompt's
    # bottom one (+C against −C on both), for clip norms whose grid rounding goes up
    for c in (0.05, 0.3, 1.0, 3.0, 7.7):
        for b in (1, 2, 7):
            public = torch.tensor([0.0, -100.0, -50.0, 1.0])
            rows = torch.tensor([[-100.0, 0.0, 1.0, -100.0]] * b)
            full = _policy_scores(monkeypatch, rows, public, c, b)
            nulled = _policy_scores(monkeypatch, rows[1:], public, c, b)
            assert _exact_gap(full, nulled) <= Fraction(2) * Fraction(c) / b


@pytest.mark.audits("amin")
def test_svt_noise_drawn_is_what_the_guarantee_charges(monkeypatch):
    """The sparse vector test's noise as the policy draws it — threshold Lap(b₁), queries
    Lap(b₂) — must be paid for by the charged ε_SVT: AboveThreshold with sensitivity Δ_d is
    (Δ_d/b₁ + 2Δ_d/b₂)-DP per above-threshold answer, which must be ≤ ε_SVT = √(2ρ_SVT)."""
    scales = []
    real = amin.laplace

    def record(scale, rng, *args, **kwargs):
        scales.append(float(scale))
        return real(scale, rng, *args, **kwargs)

    monkeypatch.setattr(amin, "laplace", record)
    for sigma, b in ((0.3, 8), (1.0, 3)):
        scales.clear()
        budget = amin.calibrate(5.0, 1e-6, b, 1.0, sigma, 10, "correct")
        policy = amin.AminPolicy(budget, b, 1.0, threshold=1e9, sigma=sigma)  # never private
        rng = np.random.default_rng(1)
        public = torch.randn(12, dtype=torch.float64)
        for _ in range(5):
            policy.choose(public, torch.randn(b, 12, dtype=torch.float64), None, rng)
        threshold_scale, query_scales = scales[0], scales[1:]
        assert len(query_scales) == 5 and len(set(query_scales)) == 1
        d_sens = amin.svt_query_sensitivity(budget.clip, b, "correct")
        spent = d_sens / threshold_scale + 2 * d_sens / query_scales[0]
        assert spent <= math.sqrt(2 * budget.rho_svt) * (1 + 1e-12)


def _worst_l1_shift(shift: float, vocab: int, grid: int = 9) -> float:
    """Brute force, independent of amin.py's formulas: the largest change of
    ‖softmax(φ)‖ in ℓ1 when every logit moves by at most ``shift`` (ℓ∞), over logits φ on a
    grid of [-6, 6]^vocab and shifts at the corners of the box (the ℓ1 change is convex in the
    shift vector's direction for fixed signs, so a corner attains it) and at its centre
    lines."""
    import itertools

    values = np.linspace(-6.0, 6.0, grid)
    corners = [np.array(c) * shift for c in itertools.product((-1.0, 1.0, 0.0), repeat=vocab)]
    worst = 0.0
    for logits in itertools.product(values, repeat=vocab):
        phi = np.array(logits)
        p = np.exp(phi - phi.max())
        p /= p.sum()
        for s in corners:
            q = np.exp(phi + s - (phi + s).max())
            q /= q.sum()
            worst = max(worst, float(np.abs(p - q).sum()))
    return worst


@pytest.mark.audits("amin")
@pytest.mark.parametrize(("clip", "b"), [(0.05, 7), (0.4, 3), (2.0, 4), (6.0, 2)])
def test_svt_query_sensitivity_bounds_the_brute_forced_worst_case(clip, b):
    """The sparse vector test's query d = ‖softmax(φ̄_A) − softmax(φ_pub)‖₁ moves by at most
    the ℓ1 change of softmax(φ̄_A) (triangle inequality), and φ̄_A moves by at most 2C/B per
    logit under replace-by-null: the code's Δ_d must be at least the brute-forced worst ℓ1
    change (a Δ_d scaled down, e.g. expm1(Δ/2), fails here)."""
    shift = 2.0 * clip / b
    worst = max(_worst_l1_shift(shift, v) for v in (2, 3))
    assert worst > 0
    assert amin.svt_query_sensitivity(clip, b, "correct") >= worst - 1e-12
    # and the worst case is what the tight formula says: 2·tanh(shift/2), attained
    assert worst == pytest.approx(2 * math.tanh(shift / 2), rel=0.08)


def test_the_paper_convention_is_labelled_not_dp_and_refused_under_a_budget(tmp_path):
    """Its 1/B sparse-vector sensitivity is exceeded (up to 2·tanh(C/2B)): the run is labelled
    like AdaPMixED (not DP), never counted as DP, refused by a budgeted ledger, and records
    what the same run provably costs."""
    from dplang.privacy.guarantees import Adjacency
    from dplang.privacy.ledger import BudgetExceeded, PrivacyLedger
    from dplang.textgen.methods.registry import MethodInputs

    inputs = MethodInputs(epsilon=10.0, delta=1e-6, rho=None, clip=None, batch_size=100,
                          max_tokens=64, temperature=1.2, top_k=50,
                          adjacency=Adjacency.ZERO_OUT)
    options = {"sigma": 0.3, "threshold": 0.7, "private_tokens": 100,
               "public_temperature": 1.0, "convention": "paper"}
    params = amin.AminParams.calibrate(inputs, options)
    g = params.guarantee()
    assert not g.ex_ante and not g.is_dp and g.kind == "unproven accounting, NOT DP"
    assert "does NOT satisfy a differential privacy guarantee" in g.summary()
    assert "2·tanh(C/2B)" in g.summary()
    # the numbers: B = 100, ε = 10 gives C ≈ 19.5 and a provable ρ of about 85
    assert params.clip == pytest.approx(19.5, abs=0.1)
    assert g.details["rho_provable"] == pytest.approx(85, rel=0.05)
    assert g.details["claimed_rho"] == pytest.approx(1.54, abs=0.01)
    ledger = PrivacyLedger(tmp_path / "l.sqlite")
    ledger.set_budget("d", 20.0, 1e-6)
    with pytest.raises(BudgetExceeded, match="unproven assumption"):
        ledger.charge("d", "r1", g, "amin paper")
    assert amin.AminParams.calibrate(inputs, {**options, "convention": "correct"}
                                     ).guarantee().is_dp

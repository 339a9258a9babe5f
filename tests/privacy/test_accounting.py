import math

import dp_accounting
import opendp.prelude as dp
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from dplang.privacy import (
    Guarantee,
    bounded_range_to_zcdp,
    compose_parallel,
    compose_sequential,
    epsilon_to_rho,
    pure_to_zcdp,
    rho_to_delta,
    rho_to_epsilon,
    simple_rho_to_epsilon,
)
from dplang.textgen.methods.invisibleink import (
    calibrate_clip,
    invisibleink_rho,
    per_token_pure_epsilon,
    topk_plus_margin,
)

pytestmark = pytest.mark.audits("accounting")

VECTORS = [(1, 0.02436), (3, 0.18507), (5, 0.46306), (10, 1.53928)]

rhos = st.floats(min_value=1e-4, max_value=20, allow_nan=False)
deltas = st.floats(min_value=1e-12, max_value=0.1, allow_nan=False)


@pytest.mark.parametrize(("eps", "rho"), VECTORS)
def test_test_vectors(eps, rho):
    assert epsilon_to_rho(eps, 1e-6) == pytest.approx(rho, abs=1e-4)
    assert rho_to_epsilon(rho, 1e-6) == pytest.approx(eps, abs=2e-3)


@pytest.mark.parametrize(("eps", "clip"), [(1, 0.0829), (3, 0.2285), (5, 0.3615), (10, 0.6591)])
def test_table12_clip_norms(eps, clip):
    rho = epsilon_to_rho(eps, 1e-6)
    assert calibrate_clip(rho, 500, 7, 1.2) == pytest.approx(clip, abs=1e-4)


def test_simple_bound_values():
    assert simple_rho_to_epsilon(0.02436, 1e-6) == pytest.approx(1.1845, abs=1e-3)
    assert simple_rho_to_epsilon(1.53928, 1e-6) == pytest.approx(10.7623, abs=1e-3)


@pytest.mark.parametrize("rho", [0.01, 0.5, 1.53928, 8.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-9])
def test_agrees_with_opendp(rho, delta):
    dp.enable_features("contrib")
    # Gaussian mechanism with scale s on sensitivity 1 is 1/(2 s^2)-zCDP.
    scale = 1.0 / math.sqrt(2 * rho)
    meas = dp.m.make_gaussian(
        dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float), scale=scale
    )
    profile = dp.c.make_zCDP_to_approxDP(meas).map(1.0)
    assert rho_to_epsilon(rho, delta) == pytest.approx(profile.epsilon(delta), rel=1e-6)


def _exact_log_delta(rho: float, epsilon: float) -> float:
    """An independent reference for the tight zCDP → (ε, δ) conversion, in 30-digit
    arithmetic: log δ(ε) with δ(ε) = inf_{α>1} exp((α−1)(αρ−ε))/(α−1)·(1−1/α)^α (CKS 2020),
    capped at δ = 1, minimised by golden-section search over log(α − 1) (no derivative)."""
    mpmath = pytest.importorskip("mpmath")
    mp = mpmath.mp
    mp.dps = 30
    r, eps = mp.mpf(rho), mp.mpf(epsilon)

    def f(u):  # u = log(α − 1)
        a = 1 + mp.exp(u)
        return (a - 1) * (a * r - eps) - mp.log(a - 1) + a * mp.log(1 - 1 / a)

    lo, hi = mp.mpf(-40), mp.log(eps / r + 10) + 5
    g = (mp.sqrt(5) - 1) / 2
    x1, x2 = hi - g * (hi - lo), lo + g * (hi - lo)
    f1, f2 = f(x1), f(x2)
    for _ in range(150):
        if f1 < f2:
            hi, x2, f2 = x2, x1, f1
            x1 = hi - g * (hi - lo)
            f1 = f(x1)
        else:
            lo, x1, f1 = x1, x2, f2
            x2 = lo + g * (hi - lo)
            f2 = f(x2)
    return float(min(f1, f2, mp.mpf(0)))


# Deterministic: the same examples on every run (derandomized, no example database), plus the
# case that made an earlier, randomized version of this test fail (ρ = δ = 3.96e-4, where
# dp-accounting's ε is 6.7 % above the tight one).
@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(rho=rhos, delta=deltas)
@example(rho=3.96e-4, delta=3.96e-4)
@example(rho=1e-4, delta=0.1)
@example(rho=20.0, delta=1e-12)
def test_agrees_with_dp_accounting(rho, delta):
    """dplang's ε is the tight one, checked against an exact reference: it is sound (the exact
    δ at ε is at most δ) and tight (at ε·(1 − 1e-9) − 1e-12 the exact δ exceeds δ); and it is
    never looser than dp-accounting's RDP accountant, which optimises over a finite grid of
    orders and can be several percent loose for small ρ (so only that direction is checked)."""
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.ZCDpEvent(rho))
    theirs = acc.get_epsilon(delta)
    ours = rho_to_epsilon(rho, delta)
    log_delta = math.log(delta)
    assert _exact_log_delta(rho, ours) <= log_delta + 1e-12
    below = ours * (1 - 1e-9) - 1e-12
    if below > 0:
        assert _exact_log_delta(rho, below) > log_delta
    assert ours <= theirs + 1e-9


@settings(max_examples=60, deadline=None)
@given(rho=rhos, delta=deltas, factor=st.floats(min_value=1.01, max_value=3))
def test_monotonicity(rho, delta, factor):
    low, high = rho_to_epsilon(rho, delta), rho_to_epsilon(rho * factor, delta)
    assert high > low or high == low == 0.0  # ε = 0 already suffices for tiny ρ at large δ
    assert rho_to_epsilon(rho, min(delta * factor, 0.5)) <= rho_to_epsilon(rho, delta)


@settings(max_examples=60, deadline=None)
@given(rho=rhos, delta=deltas)
def test_tight_never_above_simple(rho, delta):
    assert rho_to_epsilon(rho, delta) <= simple_rho_to_epsilon(rho, delta) + 1e-12


@settings(max_examples=60, deadline=None)
@given(rho=rhos, delta=deltas)
def test_round_trip(rho, delta):
    eps = rho_to_epsilon(rho, delta)
    assume(eps > 0)
    back = epsilon_to_rho(eps, delta)
    assert back == pytest.approx(rho, rel=1e-6)
    # safe rounding: the rho returned never converts to more than eps
    assert rho_to_delta(back, eps) <= delta * (1 + 1e-9)


def test_delta_eps_consistency():
    rho = 0.5
    eps = rho_to_epsilon(rho, 1e-6)
    assert rho_to_delta(rho, eps) == pytest.approx(1e-6, rel=1e-6)
    assert rho_to_delta(0.0, 1.0) == 0.0
    assert rho_to_epsilon(0.0, 1e-6) == 0.0


@pytest.mark.parametrize(
    ("fn", "args"),
    [
        (rho_to_epsilon, (-1.0, 1e-6)),
        (rho_to_epsilon, (1.0, 0.0)),
        (rho_to_epsilon, (1.0, 1.0)),
        (epsilon_to_rho, (0.0, 1e-6)),
        (epsilon_to_rho, (1.0, 2.0)),
        (calibrate_clip, (1.0, 0, 7, 1.0)),
        (calibrate_clip, (1.0, 10, 7, 0.0)),
        (calibrate_clip, (1.0, 10, 7, 1.0, "add-remove")),
    ],
)
def test_invalid_inputs(fn, args):
    with pytest.raises(ValueError):
        fn(*args)


def test_pure_and_bounded_range():
    assert pure_to_zcdp(2.0) == 2.0
    assert bounded_range_to_zcdp(2.0) == 0.5


@settings(max_examples=50, deadline=None)
@given(
    rho=st.floats(min_value=1e-4, max_value=10),
    tokens=st.integers(1, 2000),
    b=st.integers(1, 128),
    tau=st.floats(min_value=0.1, max_value=3),
)
def test_invisibleink_calibration_round_trip(rho, tokens, b, tau):
    for adjacency in ("replace-by-null", "zero-out"):
        clip = calibrate_clip(rho, tokens, b, tau, adjacency)
        assert invisibleink_rho(tokens, clip, b, tau, adjacency) == pytest.approx(rho, rel=1e-9)
    # margin and per-token bound are independent of B at a calibrated C
    clip = calibrate_clip(rho, tokens, b, tau)
    assert topk_plus_margin(clip, b) == pytest.approx(2 * tau * math.sqrt(2 * rho / tokens))
    assert per_token_pure_epsilon(clip, b, tau) == pytest.approx(2 * math.sqrt(2 * rho / tokens))


def test_zero_out_quadruples_rho():
    base = invisibleink_rho(500, 0.66, 7, 1.2)
    assert base == pytest.approx(500 * 0.66**2 / (2 * 49 * 1.44))
    assert invisibleink_rho(500, 0.66, 7, 1.2, "zero-out") == pytest.approx(4 * base)


def _g(rho, eps=None, delta=1e-6, adjacency="replace-by-null", unit="reference"):
    e = eps if eps is not None else rho_to_epsilon(rho, delta)
    return Guarantee("m", unit, adjacency, rho, e, delta)


def test_sequential_composition_sums_rho():
    g = compose_sequential([_g(0.1), _g(0.2)])
    assert g.rho == pytest.approx(0.3)
    assert g.epsilon == pytest.approx(rho_to_epsilon(0.3, 1e-6))
    assert g.adjacency == "replace-by-null"
    pure = compose_sequential([Guarantee("a", "record", "replace-one", None, 1.0, 0.0)] * 3)
    assert pure.epsilon == 3.0 and pure.delta == 0 and pure.rho is None
    approx = compose_sequential([Guarantee("a", "record", "replace-one", None, 1.0, 1e-6)] * 2)
    assert approx.epsilon == 2.0 and approx.delta == 2e-6


def test_parallel_composition_takes_max():
    g = compose_parallel([_g(0.1), _g(0.5), _g(0.2)])
    assert g.rho == 0.5
    assert "data-independent" in g.details["composition"]


def test_composition_refuses_mixed_adjacency():
    with pytest.raises(ValueError, match="adjacenc"):
        compose_sequential([_g(0.1), _g(0.1, adjacency="zero-out")])
    with pytest.raises(ValueError):
        compose_parallel([])

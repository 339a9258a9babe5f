"""Aug-PE (spec 002 §3.3, §5 item 4): histogram sensitivity, calibration, end-to-end runs."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate
from scipy.stats import norm

from dplang.evaluation.embedders import HashingEmbedder
from dplang.models.toy import ToyModel
from dplang.privacy.accounting import epsilon_to_rho, rho_to_epsilon
from dplang.textgen.methods.augpe import (
    AugPEParams,
    augpe_rho,
    calibrate_sigma,
    default_prompts,
    embed_references,
    histogram_sensitivity,
    nn_histogram,
    noisy_histogram,
    run_augpe,
    selection_weights,
)

SQRT2 = math.sqrt(2.0)


def _embeddings(seed, n, m, d, clustered):
    rng = np.random.default_rng(seed)
    cand = rng.standard_normal((m, d))
    if clustered:  # references near candidates, many near-ties avoided; else arbitrary
        priv = cand[rng.integers(0, m, n)] + 0.1 * rng.standard_normal((n, d))
    else:
        priv = rng.standard_normal((n, d))
    return priv, cand


dims = st.tuples(
    st.integers(0, 2**32 - 1), st.integers(1, 25), st.integers(1, 12), st.integers(1, 6),
    st.booleans(),
)


# ----------------------------------------------------------------------------- histogram


def test_nn_histogram_votes_for_nearest():
    cand = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    priv = np.array([[1.0, 1.0], [9.0, 0.5], [0.2, 8.0], [0.1, 9.9], [5.0, 5.0]])
    # (5, 5) is equidistant from all three candidates -> the lowest index wins
    assert nn_histogram(priv, cand).tolist() == [2.0, 1.0, 2.0]
    assert nn_histogram(np.zeros((0, 2)), cand).tolist() == [0.0, 0.0, 0.0]
    tie = np.array([[1.0, 0.0], [1.0, 0.0]])  # duplicated candidate: the first one
    assert nn_histogram(np.array([[1.0, 0.1]]), tie).tolist() == [1.0, 0.0]
    with pytest.raises(ValueError):
        nn_histogram(priv, np.zeros((0, 2)))
    with pytest.raises(ValueError):
        nn_histogram(np.ones((1, 3)), cand)


def test_nn_histogram_matches_brute_force_and_blocking():
    priv, cand = _embeddings(1, 2500, 40, 8, clustered=True)
    brute = np.bincount(
        np.argmin(((priv[:, None, :] - cand[None, :, :]) ** 2).sum(-1), axis=1), minlength=40
    )
    h = nn_histogram(priv, cand)
    assert h.tolist() == brute.tolist() and h.sum() == 2500
    # votes do not depend on the other references: any split gives the same total
    assert (nn_histogram(priv[:777], cand) + nn_histogram(priv[777:], cand)).tolist() == h.tolist()


@pytest.mark.audits("augpe")
@settings(max_examples=150, deadline=None)
@given(dims, st.data())
def test_sensitivity_replace_by_null_and_replace_one(params, data):
    seed, n, m, d, clustered = params
    priv, cand = _embeddings(seed, n, m, d, clustered)
    h = nn_histogram(priv, cand)
    j = data.draw(st.integers(0, n - 1))
    # replace-by-null: the null reference casts no vote (one count moves by one)
    null = nn_histogram(np.delete(priv, j, axis=0), cand)
    assert np.linalg.norm(h - null) == pytest.approx(1.0)
    assert np.linalg.norm(h - null) <= SQRT2 + 1e-12
    # replace by another reference (and the reading where the null element votes)
    other = priv.copy()
    other[j] = np.random.default_rng(seed + 1).standard_normal(d) * 3
    diff = h - nn_histogram(other, cand)
    assert np.linalg.norm(diff) <= SQRT2 + 1e-12
    assert np.abs(diff).max() <= 1 and np.count_nonzero(diff) in (0, 2)


@settings(max_examples=150, deadline=None)
@given(dims, st.data())
def test_sensitivity_add_remove(params, data):
    seed, n, m, d, clustered = params
    priv, cand = _embeddings(seed, n, m, d, clustered)
    h = nn_histogram(priv, cand)
    j = data.draw(st.integers(0, n - 1))
    removed = nn_histogram(np.delete(priv, j, axis=0), cand)
    added = nn_histogram(np.vstack([priv, np.random.default_rng(seed).standard_normal(d)]), cand)
    assert np.linalg.norm(h - removed) <= 1 + 1e-12
    assert np.linalg.norm(h - added) <= 1 + 1e-12


def test_null_references_cast_no_vote_through_the_embedder():
    emb = HashingEmbedder(dim=64)
    cand = emb.embed(["the food was great", "terrible service", "nice hotel room"])
    refs = ["great food", "slow and terrible service", "a nice room"]
    h = nn_histogram(embed_references(refs, emb), cand)
    for null in (None, "", "   \n"):
        h0 = nn_histogram(embed_references([*refs[:1], null, *refs[2:]], emb), cand)
        assert np.linalg.norm(h - h0) == pytest.approx(1.0)
    assert embed_references([None, ""], emb).shape == (0, 64)
    assert nn_histogram(embed_references([None], emb), cand).tolist() == [0.0, 0.0, 0.0]


def _gaussian_renyi_numeric(shift, sigma, alpha):
    """D_α(N(shift, σ²) ‖ N(0, σ²)) by quadrature (the ℓ2 shift direction is all that
    matters for isotropic Gaussians)."""
    def log_f(x):
        return alpha * norm.logpdf(x, shift, sigma) + (1 - alpha) * norm.logpdf(x, 0, sigma)

    peak = alpha * shift  # the integrand is a scaled Gaussian density centred here
    top = log_f(peak)
    val, _ = integrate.quad(lambda x: math.exp(log_f(x) - top), peak - 40 * sigma,
                            peak + 40 * sigma, points=[peak], limit=200)
    return (top + math.log(val)) / (alpha - 1)


@pytest.mark.audits("augpe")
def test_wrong_sensitivity_is_caught():
    """σ calibrated with Δ = 1 under replace-by-null/replace-one is exposed by an exact check
    on a neighbouring pair whose histograms differ by √2."""
    eps, delta, T = 2.0, 1e-6, 3
    claimed = epsilon_to_rho(eps, delta)
    cand = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    base = np.array([[1.0, 1.0], [9.0, 0.5], [0.2, 8.0]])
    swapped = base.copy()
    swapped[0] = [0.3, 9.0]  # the reference moves its vote from candidate 0 to candidate 2
    shift = np.linalg.norm(nn_histogram(base, cand) - nn_histogram(swapped, cand))
    assert shift == pytest.approx(SQRT2)

    def true_rho(sigma):  # exact zCDP of T Gaussian releases at this worst-case pair
        per = max(_gaussian_renyi_numeric(shift, sigma, a) / a for a in (1.5, 2.0, 4.0, 16.0))
        assert per == pytest.approx(shift**2 / (2 * sigma**2), rel=1e-6)  # D_α/α = Δ²/2σ²
        return T * per

    good = calibrate_sigma(eps, delta, T, histogram_sensitivity("replace-by-null"))
    wrong = calibrate_sigma(eps, delta, T, 1.0)
    assert true_rho(good) <= claimed * (1 + 1e-9)
    assert true_rho(wrong) > 1.9 * claimed  # caught: twice the claimed ρ
    assert AugPEParams(eps, 4, delta, T).sigma == pytest.approx(good)
    paper = AugPEParams(eps, 4, delta, T, sensitivity_convention="paper")
    assert paper.sigma == pytest.approx(wrong)
    assert paper.rho == pytest.approx(true_rho(wrong), rel=1e-6)  # recorded honestly
    assert paper.guarantee().epsilon > eps


# ----------------------------------------------------------------------------- accounting


@pytest.mark.parametrize("eps", [0.5, 1.0, 4.0, 10.0])
@pytest.mark.parametrize("T", [1, 3, 10])
@pytest.mark.parametrize("adjacency", ["replace-by-null", "add-remove"])
def test_calibration_round_trip(eps, T, adjacency):
    delta = 1e-6
    sens = histogram_sensitivity(adjacency)
    sigma = calibrate_sigma(eps, delta, T, sens)
    assert sigma == pytest.approx(sens * math.sqrt(T / (2 * epsilon_to_rho(eps, delta))))
    assert rho_to_epsilon(augpe_rho(sigma, T, sens), delta) == pytest.approx(eps, rel=1e-9)
    p = AugPEParams(eps, 3, delta, T, adjacency=adjacency)
    g = p.guarantee()
    assert g.epsilon == pytest.approx(eps, rel=1e-9) and g.delta == delta
    assert g.rho == pytest.approx(T * sens**2 / (2 * p.sigma**2))
    assert (g.mechanism, g.unit, g.adjacency) == ("augpe", "reference", adjacency)


def test_sensitivities_and_paper_convention():
    assert histogram_sensitivity("replace-by-null") == SQRT2
    assert histogram_sensitivity("add-remove") == 1.0
    assert histogram_sensitivity("replace-one") == SQRT2
    with pytest.raises(ValueError):
        histogram_sensitivity("zero-out")
    p = AugPEParams(4.0, 10, sensitivity_convention="paper")
    c = AugPEParams(4.0, 10)
    assert p.sigma == pytest.approx(c.sigma / SQRT2)  # the √2 advantage
    g = p.guarantee()
    assert g.adjacency == "replace-by-null"
    assert g.rho == pytest.approx(2 * epsilon_to_rho(4.0, 1e-6))
    assert g.details["paper_claimed_epsilon"] == pytest.approx(4.0, rel=1e-9)
    assert "warning" in g.details
    # under add-remove the paper's Δ = 1 is the true one
    a = AugPEParams(4.0, 10, adjacency="add-remove", sensitivity_convention="paper")
    assert a.guarantee().epsilon == pytest.approx(4.0, rel=1e-9)
    assert "warning" not in a.guarantee().details


@pytest.mark.parametrize("bad", [
    {"epsilon": 0.0}, {"epsilon": math.inf}, {"delta": 0.0}, {"num_texts": 0},
    {"iterations": 0}, {"variations": -1}, {"max_tokens": 0}, {"temperature": 0.0},
    {"top_k": -1}, {"threshold": -1.0}, {"adjacency": "zero-out"},
    {"sensitivity_convention": "x"}, {"selection": "x"},
])
def test_params_validation(bad):
    kw = {"epsilon": 1.0, "num_texts": 4, **bad}
    with pytest.raises(ValueError):
        AugPEParams(**kw)


def test_noisy_histogram_and_weights():
    counts = np.array([3.0, 0.0, 1.0])
    a = noisy_histogram(counts, 2.0, np.random.default_rng(5))
    b = noisy_histogram(counts, 2.0, np.random.default_rng(5))
    assert a.tolist() == b.tolist() and not np.array_equal(a, counts)
    big = noisy_histogram(np.zeros(200_000), 2.0, np.random.default_rng(0))
    assert big.std() == pytest.approx(2.0, rel=0.01)
    assert selection_weights(np.array([-1.0, 0.5, 3.0]), 1.0).tolist() == [0.0, 0.0, 2.0]
    with pytest.raises(ValueError):
        noisy_histogram(counts, 0.0, np.random.default_rng(0))


# ----------------------------------------------------------------------------- end to end

REFS = ["the soup was great and the staff friendly", None, "awful parking, rude waiter",
        "", "lovely rooms and a quiet pool", "great pizza"]


class RecordingModel(ToyModel):
    """A toy model that records every prompt it is given."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.prompts = []

    def encode_prompts(self, prompts):
        self.prompts.extend(prompts)
        return super().encode_prompts(prompts)


def _run(refs=REFS, seed=0, model=None, **kw):
    model = model or ToyModel(vocab_size=31, eos_token_id=0, seed=1, eos_after=6)
    params = AugPEParams(epsilon=4.0, num_texts=6, iterations=2, variations=2, max_tokens=8,
                         top_k=10, **kw)
    return run_augpe(model, refs, params, seed, embedder=HashingEmbedder(dim=64))


def test_end_to_end_toy():
    events = []
    model = ToyModel(vocab_size=31, eos_token_id=0, seed=1, eos_after=6)
    params = AugPEParams(epsilon=4.0, num_texts=6, iterations=2, variations=2, max_tokens=8,
                         top_k=10)
    texts, g, stats = run_augpe(model, REFS, params, 3, "Here is a review:\n",
                                "Review:\n{text}\nSame review, rephrased:\n",
                                HashingEmbedder(dim=64), lambda *e: events.append(e))
    assert len(texts) == 6 and all(isinstance(t, str) for t in texts)
    T, sigma = 2, g.details["sigma"]
    assert g.mechanism == "augpe" and g.unit == "reference" and g.adjacency == "replace-by-null"
    assert g.rho == pytest.approx(T * SQRT2**2 / (2 * sigma**2))
    assert g.rho == pytest.approx(epsilon_to_rho(4.0, 1e-6))
    assert g.epsilon == pytest.approx(4.0, rel=1e-9) and g.ex_ante
    assert g.details["iterations"] == 2 and g.details["variations"] == 2
    assert g.details["model_calls"] == stats["model_calls"] == 6 + 6 * 2 * 2
    assert stats["generation_calls"] == 6 and stats["variation_calls"] == 24
    assert stats["wall_clock_seconds"] > 0
    # the guarantee is public: no secret seed, no duration (a timing side channel)
    assert "seed" not in g.details and "wall_clock_seconds" not in g.details
    assert 0 < stats["tokens_generated"] <= 30 * 8
    assert len(stats["noisy_count_sums"]) == 2
    assert events[-1][1:] == (30, 30) and events[0][0] == "generation"
    g.to_json()  # serialisable


def test_determinism_and_batching_independence():
    a = _run(seed=7)
    b = _run(seed=7)
    assert a[0] == b[0] and a[2]["noisy_count_sums"] == b[2]["noisy_count_sums"]
    c = _run(seed=8)
    assert c[0] != a[0]
    model = ToyModel(vocab_size=31, eos_token_id=0, seed=1, eos_after=6)
    params = AugPEParams(epsilon=4.0, num_texts=6, iterations=2, variations=2, max_tokens=8,
                         top_k=10)
    d = run_augpe(model, REFS, params, 7, embedder=HashingEmbedder(dim=64), concurrent=5)
    assert d[0] == a[0]


@pytest.mark.audits("augpe")
def test_null_references_change_nothing_and_model_never_sees_references():
    with_nulls = _run(seed=2)
    without = _run(refs=[r for r in REFS if r], seed=2)
    assert with_nulls[0] == without[0]
    assert with_nulls[2]["noisy_count_sums"] == without[2]["noisy_count_sums"]
    model = RecordingModel(vocab_size=31, eos_token_id=0, seed=1, eos_after=6)
    _run(seed=2, model=model)
    assert model.prompts
    for ref in filter(None, REFS):
        assert not any(ref in p for p in model.prompts)


def test_references_steer_the_selection():
    """With a tiny σ the votes decide: selections follow the references (sanity of wiring)."""
    texts, _, stats = _run(refs=["eeee"] * 50, seed=0, selection="rank")
    texts2, _, _ = _run(refs=["zzzz"] * 50, seed=0, selection="rank")
    assert texts != texts2  # same seed, different private data -> different votes
    assert 1 <= stats["distinct_outputs"] <= 6


def test_prompt_defaults_and_template_check():
    gen, var = default_prompts(chat=False)
    assert "{text}" in var and "{text}" not in gen
    assert "{style}" in default_prompts(chat=True)[1]
    model = ToyModel(vocab_size=31, eos_token_id=0, seed=1, eos_after=6)
    with pytest.raises(ValueError, match="text"):
        run_augpe(model, REFS, AugPEParams(1.0, 2), 0, "x", "no slot", HashingEmbedder(dim=16))


def test_style_slot_and_all_null_references():
    model = RecordingModel(vocab_size=31, eos_token_id=0, seed=1, eos_after=6)
    params = AugPEParams(epsilon=1.0, num_texts=3, iterations=1, variations=2, max_tokens=6)
    texts, _, _ = run_augpe(model, [None, ""], params, 0, "Write:",
                                "Rephrase {style}: {text}", HashingEmbedder(dim=16))
    assert len(texts) == 3
    assert not any("{style}" in p for p in model.prompts)
    assert any("Rephrase in" in p or "Rephrase with" in p or "Rephrase briefly" in p
               for p in model.prompts)


@pytest.mark.audits("augpe")
def test_release_path_noise_pays_for_the_printed_rho(monkeypatch):
    """The Gaussian noise Aug-PE actually adds — one N(0, σ_t²) per iteration, recorded where
    the run draws it, through the registered method's path (``run_population``) — must pay for
    the printed guarantee: Σ_t Δ²/(2σ_t²) ≤ ρ with Δ the histogram's true sensitivity."""
    from dplang.privacy.guarantees import Adjacency
    from dplang.textgen.methods import augpe
    from dplang.textgen.methods.registry import MethodInputs

    drawn = []
    real = augpe.noisy_histogram

    def record(counts, sigma, rng):
        drawn.append(float(sigma))
        return real(counts, sigma, rng)

    monkeypatch.setattr(augpe, "noisy_histogram", record)
    monkeypatch.setattr(augpe, "resolve_embedder", lambda _name: HashingEmbedder(dim=64))
    for iterations in (1, 3):
        drawn.clear()
        inputs = MethodInputs(2.0, 1e-6, None, None, 2, 6, 1.0, 10,
                              Adjacency.REPLACE_BY_NULL)
        params = augpe._calibrate(inputs, {"iterations": iterations, "variations": 1})
        model = ToyModel(vocab_size=31, eos_token_id=0, seed=1, eos_after=4)
        augpe.run_population(params, model, REFS, 3, "Here is a review:\n", None, 5)
        g = params.guarantee()
        assert len(drawn) == iterations
        paid = sum(params.sensitivity**2 / (2 * s * s) for s in drawn)
        assert paid <= g.rho * (1 + 1e-12)

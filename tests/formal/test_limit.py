"""Paper 001: streams, the fast-forward runner, the algorithms, the paper-error tests (E1–E3)
and the privacy audits of the continual-release algorithms."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dplang.formal import bounds
from dplang.formal.bounds import _realisable_overlap_pairs, sperner_bang_bang_epsilon
from dplang.formal.collections import sperner, sperner_class_element
from dplang.formal.languages import ap, finite, threshold
from dplang.formal.limit import (
    ApproximateIntersectionGenerator,
    ClosureGenerator,
    EpochEMIdentifier,
    StochasticIdentifier,
    UniformPrivateGenerator,
    alg1_transcript_loss,
    alg1_worst_case_counts,
    int_root,
    novel_sample_law,
    twin,
)
from dplang.formal.streams import (
    BlockShuffle,
    CanonicalEnumeration,
    DuplicateHeavy,
    ExplicitStream,
    IIDStream,
    IntersectionFirst,
    LateTelltale,
    SubstitutedStream,
    check_stream,
)
from dplang.formal.truth import instance
from dplang.privacy.randomness import RandomStreams

# ---------------------------------------------------------------------------------------------
# streams and the fast-forward runner
# ---------------------------------------------------------------------------------------------


def test_stream_closed_forms_match_the_materialised_prefix():
    k = ap(1, 3)
    langs = [ap(0, 2), ap(1, 2), threshold(10), finite([1, 4, 7, 100]), ap(4, 6)]
    dist = instance("remark-5.7").distributions["D1"]
    streams = [CanonicalEnumeration(k), BlockShuffle(k, 7, seed=3),
               IntersectionFirst(k, ap(0, 2)), LateTelltale(k, 4, 50),
               DuplicateHeavy(ap(0, 2), first=3, offset=2),
               IIDStream(dist, seed=1, materialise=512),
               SubstitutedStream(CanonicalEnumeration(k), 5, 2)]
    for st in streams:
        prefix = st.prefix(300)
        for t in (1, 17, 64, 299):
            for lang in langs:
                want = sum(1 for x in prefix[:t] if not lang.contains(x))
                assert st.error_count(lang, t) == want, (st.name, t, lang)
            for u in (0, 1, 4, 7, 2, 10):
                assert st.multiplicity(u, t) == prefix[:t].count(u), (st.name, t, u)
    # every element of K appears once in the adversarial enumerations
    for st in (streams[0], streams[1], streams[3]):
        assert sorted(st.prefix(300))[:40] == k.elements(40)
    first = streams[2].prefix(300)
    assert len(set(first)) == 300 and all(k.contains(x) for x in first)
    assert [first[2**j - 1] for j in range(5)] == [1, 7, 13, 19, 25]  # K∖evens, sparse


def test_iid_counts_beyond_the_materialised_prefix():
    dist = instance("remark-5.7").distributions["D1"]
    st = IIDStream(dist, seed=4, materialise=1024)
    c = st.counts(2**40)
    assert sum(c.values()) == 2**40
    again = IIDStream(dist, seed=4, materialise=1024)
    again.counts(2**20)  # asking in another order gives the same stream
    assert again.error_count(ap(1, 2), 2**40) == st.error_count(ap(1, 2), 2**40)
    small, big = st.counts(2**30), st.counts(2**31)
    assert all(big.get(u, 0) >= v for u, v in small.items())  # nested prefixes
    with pytest.raises(ValueError, match="2\\^j"):
        st.counts(3000)


def test_exact_sixth_root_hits_update_4096():
    assert int_root(4096, 6) == 4 and math.floor(4096 ** (1 / 6)) == 3
    assert int_root(10**54, 6) == 10**9 and int_root(10**54 - 1, 6) == 10**9 - 1
    alg = ApproximateIntersectionGenerator(1.0)
    assert list(alg.update_times(5000)) == [1, 64, 729, 4096]
    run = alg.run(CanonicalEnumeration(ap(0, 2)), instance("aps").collection, 5000,
                  np.random.default_rng(0))
    assert [seg.start for seg in run.segments] == [1, 64, 729, 4096]


def test_fast_forward_matches_the_step_level_runner():
    aps = instance("aps")
    st = aps.stream()
    alg = ApproximateIntersectionGenerator(2.0)
    horizon = 4200
    ff = alg.run(st, aps.collection, horizon, RandomStreams(9).generator(0, 0),
                 target=aps.collection[5])
    steps = alg.run_steps(st, aps.collection, horizon, RandomStreams(9).generator(0, 0),
                          RandomStreams(9).generator(0, 1))
    for t, w, u in steps:
        seg = next(s for s in ff.segments if s.start <= t <= s.end)
        assert u.equals(seg.output)
        assert u.contains(w)


def test_alg1_generates_in_the_limit_on_a_duplicate_free_enumeration():
    aps = instance("aps")
    k = aps.collection[aps.target]
    valid_end = []
    for u in range(6):
        run = ApproximateIntersectionGenerator(10.0).run(
            aps.stream(), aps.collection, 20**6, RandomStreams(7).generator(u, 0), target=k,
            output_rng=RandomStreams(7).generator(u, 1), sample_outputs=True, record=False)
        valid_end.append(run.segments[-1].valid)
        assert all(ok for t, w, ok in run.samples if run.valid_at(t))
    assert np.mean(valid_end) >= 5 / 6


# ---------------------------------------------------------------------------------------------
# paper errors
# ---------------------------------------------------------------------------------------------


def test_e1_printed_laplace_scale_is_not_private():
    alg = ApproximateIntersectionGenerator(1.0)
    printed = twin(alg)
    assert printed.scale == "printed"
    losses = {}
    for updates in (1, 2, 3, 200):
        a, b = alg1_worst_case_counts(updates)
        losses[updates] = (alg1_transcript_loss(alg, a, b), alg1_transcript_loss(printed, a, b))
    assert [round(losses[u][1], 3) for u in (2, 3)] == [0.909, 1.111]
    assert round(losses[200][1], 2) == 3.57
    assert losses[3][1] > 1.0 and losses[200][1] > 1.0  # > ε: the printed scale fails
    assert [round(losses[u][0], 3) for u in (2, 3, 200)] == [0.759, 0.827, 0.996]
    assert all(v[0] <= alg.spent(u) + 1e-12 <= 1.0 for u, v in losses.items())


def test_alg1_per_bit_sum_bounds_the_transcript_loss_with_the_same_verdicts():
    """alg1_transcript_loss sums each increment bit's largest |log-ratio|: an upper bound on the
    loss over the 2^20100 transcripts of 200 updates. The loss itself is the larger of the two
    one-directional sums; it is below the bound, and ≤ ε exactly where the bound is (the audit's
    verdicts are those of the exact loss)."""
    def one_directional(alg, a, b):
        sums = [0.0, 0.0]
        for k, (x, y) in enumerate(zip(a, b, strict=True), 1):
            d = alg.increment_probabilities(x, k**6, k) - alg.increment_probabilities(y, k**6, k)
            sums[0] += float(np.sum(np.max(d, axis=0)))
            sums[1] += float(np.sum(np.max(-d, axis=0)))
        return max(sums)

    a, b = alg1_worst_case_counts(200)
    for eps in (0.5, 1.0, 2.0, 5.0):
        correct = ApproximateIntersectionGenerator(eps)
        for alg in (correct, twin(correct)):
            bound, loss = alg1_transcript_loss(alg, a, b), one_directional(alg, a, b)
            assert loss <= bound + 1e-12
            assert (loss <= eps) == (bound <= eps)
    alg = ApproximateIntersectionGenerator(1.0)
    assert round(one_directional(alg, a, b), 3) == 0.946
    assert round(one_directional(twin(alg), a, b), 2) == 3.31


def test_e2_duplicate_heavy_enumeration_breaks_alg1():
    dh = instance("dup-heavy")
    st = dh.stream()
    k = dh.collection[2]
    noise_free = ApproximateIntersectionGenerator(math.inf).run(
        st, dh.collection, 20**6, np.random.default_rng(0), target=k)
    assert len(noise_free.segments) == 20
    assert all(seg.valid is False for seg in noise_free.segments)
    valid = [ApproximateIntersectionGenerator(1.0).run(
        st, dh.collection, 20**6, RandomStreams(12).generator(u, 0), target=k,
        record=False).segments[-1].valid for u in range(100)]
    assert np.mean(valid) < 0.2
    warnings = check_stream(st, k, 20**6)
    assert any("Thm 1.1" in w and "duplicate" in w for w in warnings)
    assert not check_stream(CanonicalEnumeration(k), k, 10**6)


def test_e3_lp_beats_the_printed_lower_bound_and_repaired_bound_holds():
    lp8 = bounds.sperner_lp_epsilon(8)
    assert round(lp8, 3) == 2.079
    assert round(bounds.thmC3_paper_lower(8, 1.0), 3) == 3.843 > lp8
    for k in (*range(4, 13), 16, 20, 30):
        h = k // 2
        pairs = _realisable_overlap_pairs(k)
        assert all((o, o2) in pairs for o in range(h + 1) for o2 in range(h + 1) if o != o2)
        assert bounds.sperner_lp_epsilon(k) == pytest.approx(sperner_bang_bang_epsilon(k),
                                                             abs=1e-8)
    for k in range(2, 201):
        lp = sperner_bang_bang_epsilon(k)  # = the LP optimum (checked above up to k = 30)
        assert bounds.repaired_lower_bound(k) <= lp + 1e-9
        assert bounds.repaired_lower_bound(k, sharp=True) <= lp + 1e-9
    assert [round(bounds.repaired_lower_bound(k), 1) for k in (100, 200)] == [2.8, 8.3]


# ---------------------------------------------------------------------------------------------
# the uniform private generator
# ---------------------------------------------------------------------------------------------


def one_class(k: int, n: int, d: int = 0) -> np.ndarray:
    pad = list(range(d))
    return np.array(pad + [sperner_class_element(k, 1, j, d) for j in range(n - d)])


def n_two_thirds(k: int, eps: float, d: int = 0) -> int:
    coll = sperner(k, d)
    upg = UniformPrivateGenerator(eps, d=d)
    n = d + 1
    while upg.p_good(one_class(k, n, d), coll, 1) < 2 / 3:
        n += 1
    return n


def test_upg_n_two_thirds_vector():
    assert [n_two_thirds(k, 1.0) for k in (4, 8, 16)] == [12, 23, 45]


def test_upg_padding_shifts_by_d_and_meets_thm_c1():
    assert n_two_thirds(4, 1.0, 3) - n_two_thirds(4, 1.0, 0) == 3
    for k in (4, 8):
        coll = sperner(k)
        upg = UniformPrivateGenerator(1.0, d=0)
        for n in range(1, 80, 7):
            pg = upg.p_good(one_class(k, n), coll, 1)
            assert pg >= bounds.thmC1_good_probability(n, k, 0, 1.0).value - 1e-12


def test_upg_run_and_refusals():
    coll = sperner(4)
    upg = UniformPrivateGenerator(2.0)
    data = one_class(4, 30)
    w, subset, u = upg.run(data, coll, np.random.default_rng(1))
    assert u.contains(w) and subset >= 0
    with pytest.raises(ValueError, match="k = 21"):
        UniformPrivateGenerator(1.0, d=0).run(np.array([0]), _big_collection(21),
                                              np.random.default_rng(0))
    with pytest.raises(ValueError, match="finite collection"):
        UniformPrivateGenerator(1.0).run(np.array([0]), instance("thresholds").collection,
                                         np.random.default_rng(0))
    assert ClosureGenerator().output([0, 6], coll) == 12


def _big_collection(k):
    from dplang.formal.collections import finite_collection

    return finite_collection("big", [ap(i, k) for i in range(k)], closure_dim=0)


@pytest.mark.audits("formal-001")
def test_upg_privacy_exact_and_twin():
    coll = sperner(4)
    letters = [0, 1, 2, 3]  # four classes of Sperner(4)
    from dplang.formal.audit import neighbour_pairs

    for eps in (0.5, 1.0):
        upg = UniformPrivateGenerator(eps, d=0)
        bad = twin(upg)
        worst = worst_twin = 0.0
        for n in (1, 2, 3, 4):
            for a, b in neighbour_pairs(letters, n):
                la, lb = upg.log_law(np.array(a), coll), upg.log_law(np.array(b), coll)
                worst = max(worst, float(np.max(np.abs(la - lb))))
                ta, tb = bad.log_law(np.array(a), coll), bad.log_law(np.array(b), coll)
                worst_twin = max(worst_twin, float(np.max(np.abs(ta - tb))))
        assert worst <= eps + 1e-9
        assert worst_twin > eps


# ---------------------------------------------------------------------------------------------
# 001·2 and 001·3
# ---------------------------------------------------------------------------------------------


def test_alg2_identifies_rows_within_the_thm_c5_bound():
    rows = instance("rows")
    st = rows.stream()
    alg = EpochEMIdentifier(1.0)
    s1 = bounds.alg2_first_epoch(3, rows.collection.M(3))
    errs = [alg.epoch_error(st, rows.collection, s, 3) for s in range(1, 17)]
    for s in range(s1, 17):
        assert errs[s - 1] <= bounds.thmC5_epoch_error(s, 1.0) + 1e-12
    assert errs[-1] < 1e-6
    run = alg.run(st, rows.collection, 2**16, np.random.default_rng(0), target_index=3)
    assert run.segments[-1].valid and run.segments[0].output == 1


@pytest.mark.audits("formal-001")
def test_alg2_privacy_per_epoch_and_data_dependent_window_twin():
    rows = instance("rows")
    base = ExplicitStream(CanonicalEnumeration(rows.collection[3]).prefix(16), rows.universe
                          if hasattr(rows, "universe") else rows.collection.universe)
    alg = EpochEMIdentifier(1.0, cap=False)
    bad = twin(alg)
    worst_ratio, twin_loss = 0.0, 0.0
    for pos in range(1, 17):
        for v in [(0, 0), (1, 0), (2, 5), (9, 9)]:
            nb = SubstitutedStream(base, pos, v)
            for s in (1, 2, 3, 4):
                la = alg.log_law(alg.scores(base, rows.collection, s), s)
                lb = alg.log_law(alg.scores(nb, rows.collection, s), s)
                worst_ratio = max(worst_ratio, float(np.max(np.abs(la - lb)))
                                  / alg.epoch_epsilon(s))
                ta = bad.log_law(bad.scores(base, rows.collection, s), s)
                tb = bad.log_law(bad.scores(nb, rows.collection, s), s)
                fa, fb = np.isfinite(ta), np.isfinite(tb)
                twin_loss = max(twin_loss, math.inf if np.any(fa != fb) else
                                float(np.max(np.abs(ta[fa] - tb[fb]))))
    assert worst_ratio <= 1 + 1e-9
    assert twin_loss == math.inf
    with pytest.raises(ValueError, match="finite pairwise intersections"):
        EpochEMIdentifier(1.0).run(CanonicalEnumeration(threshold(2)),
                                   instance("thresholds").collection, 64,
                                   np.random.default_rng(0))


def test_alg3_iid_succeeds_adversarial_fails_and_non_angluin_fails():
    th = instance("thresholds", target=2)
    alg = StochasticIdentifier(20.0)
    iid = th.stream(seed=5)
    assert alg.epoch_error(iid, th.collection, 40, 2) < 0.01
    canon = th.streams["canonical"](0)
    assert alg.epoch_error(canon, th.collection, 40, 2) > 0.99  # I_s → 1 (claim 23)
    na = instance("non-angluin")  # K = ℕ₀∖{6}, T_ℕ = {0..4}
    assert alg.epoch_error(na.stream(seed=2), na.collection, 30, na.target) > 0.99
    with pytest.raises(ValueError, match="tell-tales"):
        alg.run(CanonicalEnumeration(ap(0, 2)), instance("aps").collection, 4,
                np.random.default_rng(0))


def test_alg3_sampler_matches_its_exact_law():
    th = instance("thresholds", target=2)
    alg = StochasticIdentifier(2.0)
    st = th.stream(seed=1)
    s = 3
    law = np.exp(alg.log_law(st, th.collection, s))
    rng = np.random.default_rng(8)
    draws = np.bincount([alg.sample(st, th.collection, s, rng) for _ in range(1500)],
                        minlength=6)[1:6] / 1500
    assert np.allclose(draws, law[:5], atol=0.04)


@pytest.mark.audits("formal-001")
def test_alg3_privacy_and_sensitivity_one_twin():
    th = instance("thresholds", target=2)
    coll = th.collection
    alg = StochasticIdentifier(1.0)
    bad = twin(alg)
    base = ExplicitStream([1, 2, 1, 3, 1, 1, 2, 4], coll.universe)
    worst = worst_twin = 0.0
    for pos in range(1, 9):
        for v in (0, 1, 2, 5):
            nb = SubstitutedStream(base, pos, v)
            for s in (1, 2, 3):
                la, lb = alg.log_law(base, coll, s, 20), alg.log_law(nb, coll, s, 20)
                worst = max(worst, float(np.max(np.abs(la - lb))) / alg.epoch_epsilon(s))
                ta, tb = bad.log_law(base, coll, s, 20), bad.log_law(nb, coll, s, 20)
                worst_twin = max(worst_twin, float(np.max(np.abs(ta - tb)))
                                 / alg.epoch_epsilon(s))
    assert worst <= 1 + 1e-9
    assert worst_twin > 1


def test_thm15_demos():
    npair = instance("nat-pair")
    canon = npair.stream()
    uncapped = EpochEMIdentifier(1.0, cap=False)
    # {ℕ, ℕ∖{0}}: the error counts differ by one, λ_s → 0, so Pr[correct] → 1/2
    err = uncapped.epoch_error(canon, npair.collection, 30, 1)
    assert err == pytest.approx(0.5, abs=0.01)
    # Alg 3 with T_ℕ = {0}, 0 shown once: converges to the wrong index ℕ∖{0}
    alg3 = StochasticIdentifier(10.0)
    assert alg3.epoch_error(canon, npair.collection, 30, 1) > 0.99
    lt = instance("thresholds").collection
    from dplang.formal.truth import thm15_pairs

    assert (1, 2) in thm15_pairs(lt, 3)


@pytest.mark.audits("formal-001")
def test_novel_sample_never_rejects_and_the_rejecting_twin_leaks():
    odds = ap(1, 2)
    honest_a = novel_sample_law(odds, 8)
    honest_b = novel_sample_law(odds, 8)
    assert honest_a == honest_b  # the law does not depend on the data at all
    seen_a, seen_b = {1, 3}, {1, 5}  # neighbouring prefixes: x_2 = 3 replaced by 5
    rej_a = novel_sample_law(odds, 8, seen_a, rejecting=True)
    rej_b = novel_sample_law(odds, 8, seen_b, rejecting=True)
    assert rej_a.get(5, 0) > 0 and rej_b.get(5, 0) == 0  # infinite privacy loss


def test_guarantees_are_continual_release_stream_element():
    for alg in (ApproximateIntersectionGenerator(1.0), EpochEMIdentifier(2.0),
                StochasticIdentifier(1.0), UniformPrivateGenerator(1.0)):
        g = alg.guarantee()
        assert (g.unit, g.adjacency, g.delta) == ("stream element", "replace-one", 0.0)
        assert g.epsilon == alg.epsilon
    g = ApproximateIntersectionGenerator(math.inf).guarantee()
    assert g.epsilon == math.inf and g.details["private"] is False


def test_upg_continual_release_generates_and_spends_at_most_epsilon():
    sp = instance("sperner")
    coll = sp.collection
    cr = UniformPrivateGenerator(4.0, d=0).continual()
    assert sum(cr.epoch_epsilon(t) for t in range(1, 10_000)) < 4.0
    valid_end = []
    for u in range(8):
        run = cr.run(sp.stream(), coll, 2**11, RandomStreams(3).generator(u, 0),
                     target=coll[1])
        assert run.segments[0].valid is False  # the data-independent string before n_1
        valid_end.append(run.segments[-1].valid)
    assert np.mean(valid_end) >= 0.75
    fail = bounds.thmC1_continual_failure(11, 4, 4.0).value
    assert 0 <= fail < 0.05


def test_section_3_4_bounds_against_exact_laws():
    # Alg 1's noise event: Pr[|Lap(k³/ε₀)| ≥ k⁶/(200 i²)] = exp(−ε₀k³/(200 i²))
    alg = ApproximateIntersectionGenerator(1.0)
    k, i = 5, 2
    tau = k**6 / (200 * i * i)
    assert bounds.alg1_bad_event(k, i, 1.0) == pytest.approx(
        math.exp(-tau / alg.noise_scale(k)))
    # Alg 3: at a late epoch the exact mistake probability is below the §3.4 bounds
    th = instance("thresholds", target=2)
    alg3 = StochasticIdentifier(20.0)
    s = 36
    exact = alg3.epoch_error(th.stream(seed=5), th.collection, s, 2)
    prior = [2.0**-i for i in range(1, 60)]
    b = bounds.alg3_mistake_bounds(s, 20.0, 2, prior, [1])
    assert exact <= sum(b.values())

"""Collections, named instances and ground truth (spec 000 §1, §5.1; spec 001 §1, §5.2)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dplang.formal.collections import (
    dfa_demo_family,
    disjoint_union_of_sperner,
    sperner,
    sperner_sets,
    thresholds_family,
)
from dplang.formal.distributions import LengthGeometric
from dplang.formal.languages import ap, cofinite, threshold
from dplang.formal.truth import (
    INSTANCES,
    generation_truth,
    identification_truth,
    instance,
    limit_truth,
    rho_n,
)

NAMED = ["ipp-pair", "remark-5.7", "nested-segments", "safe-ap", "dfa-demo", "sperner",
         "thresholds", "non-angluin", "rows", "dup-heavy"]


def test_every_named_instance_exists():
    assert set(NAMED) <= set(INSTANCES)
    with pytest.raises(ValueError, match="unknown instance"):
        instance("no-such")


def test_identification_truth_matches_the_specs():
    ip = instance("ipp-pair")
    t2 = identification_truth(ip.collection, ip.distributions["D2"], 8)
    assert (t2.i_star, t2.gap, t2.err_star) == (2, 0.25, 0.0)
    assert identification_truth(ip.collection, ip.distributions["D1"], 8).i_star == 1
    ns = instance("nested-segments")
    t = identification_truth(ns.collection, ns.distribution, 8)
    assert t.i_star == ns.expected["main.i_star"] == 2
    assert t.gap == pytest.approx(0.4) and t.err_star == pytest.approx(0.2)
    assert all(e == pytest.approx(0.2) for e in t.errors[1:])  # every later index ties
    deep = identification_truth(ns.collection, ns.distributions["deep"], 14)
    assert (deep.i_star, deep.gap) == (4, pytest.approx(0.175))


def test_generation_truth_matches_the_specs():
    r = instance("remark-5.7")
    d1 = r.distributions["D1"]
    g = generation_truth(r.collection, d1, 2, window=3)
    assert (g.i_circ, g.m_star, g.J, g.rho) == (1, 3, (1, 2), 1 / 8)
    for mbar, want in ((6, 1 / 32), (12, 1 / 256)):
        assert rho_n(r.collection, d1, 1, mbar) == want == r.expected[f"D1.rho(M={mbar})"]
    g2 = generation_truth(r.collection, r.distributions["D2"], 2, window=3)
    assert (g2.i_circ, g2.m_star) == (2, 2)
    sa = instance("safe-ap")
    gs = generation_truth(sa.collection, sa.distribution, 12, window=2)
    assert (gs.i_circ, gs.m_star, gs.rho) == (2, 2, 0.5)
    assert gs.good == tuple(i % 2 == 0 for i in range(1, 13))
    dd = instance("dfa-demo")
    gd = generation_truth(dd.collection, dd.distribution, 6, window=9)
    assert (gd.i_circ, gd.m_star) == (2, 9)
    assert gd.witnesses[1] == 3  # Σ*'s witness is "b" at index 3 (000 E10)
    assert gd.good == (False, True, True, False, False, False)  # a* ⊆ even #b is good too


def test_distributions_are_normalised_and_sample_their_support():
    rng = np.random.default_rng(0)
    for name in ("remark-5.7", "safe-ap", "dfa-demo", "ipp-pair", "nested-segments"):
        inst = instance(name)
        for d in inst.distributions.values():
            if isinstance(d, LengthGeometric):  # atoms stop at lengths with > 4096 members
                assert d.err(d.support.difference(d.support)) == pytest.approx(1.0)
            else:
                total = math.fsum(p for _, p in d.atoms())
                assert total == pytest.approx(1.0, abs=1e-12)
            xs = d.sample(300, rng)
            assert all(d.pmf(x) > 0 for x in xs.tolist())
    d1 = instance("remark-5.7").distributions["D1"]
    counts = d1.sample_counts(2**40, rng)
    assert sum(counts.values()) == 2**40
    assert counts[0] / 2**40 == pytest.approx(0.75, abs=1e-5)


def test_sperner_structure():
    for k in (4, 5, 6):
        coll = sperner(k)
        assert coll.computed_closure_dimension() == 0
        h = k // 2
        for j, s in enumerate(sperner_sets(k), 1):
            cl = coll.intersection(s)
            # Cl(L_{S_j}) is exactly residue class j (001 claim 15)
            n = len(sperner_sets(k))
            assert cl.elements(3) == [j - 1, j - 1 + n, j - 1 + 2 * n]
        big = coll.intersection(range(1, h + 2))
        assert big.is_empty
    padded = sperner(4, 3)
    assert padded.computed_closure_dimension() == 3


def test_sperner_streams_one_class_is_the_data_of_n_two_thirds():
    """The default ``one-class`` stream lists the padding, then residue class 1: its prefix is
    the adversarial data of n_{2/3} (spec 001 §4.2(a)), so the one-shot success is the exact
    0.678 of k = 4, ε = 1, n = 12. ``intersection-first`` lists all of L_1 (the other classes at
    t = 1, 2, 4, 8): 8/2/2 elements of the three classes of L_1, another quantity (0.659)."""
    from dplang.formal.collections import sperner_class_element
    from dplang.formal.limit import UniformPrivateGenerator

    for d in (0, 3):
        inst = instance("sperner", k=4, d=d)
        assert inst.default_stream == "one-class"
        assert inst.stream().prefix(12) == list(range(d)) + [
            sperner_class_element(4, 1, j, d) for j in range(12 - d)]
    inst = instance("sperner", k=4)
    upg = UniformPrivateGenerator(1.0)
    prefixes = {w: inst.stream(which=w).prefix(12) for w in ("one-class", "intersection-first")}
    first = prefixes["intersection-first"]
    assert sorted(np.bincount([x % 6 for x in first], minlength=6).tolist()) == [0, 0, 0, 2, 2, 8]
    assert all(inst.collection[1].contains(x) for x in first)
    p = {w: upg.p_good(np.asarray(x, dtype=object), inst.collection, 1)
         for w, x in prefixes.items()}
    assert p["one-class"] == pytest.approx(0.677841, abs=1e-6)
    assert p["intersection-first"] == pytest.approx(0.659192, abs=1e-6)


def test_closure_dimension_refused_for_countable():
    with pytest.raises(ValueError, match="countable"):
        thresholds_family().closure_dimension()
    assert dfa_demo_family().computed_closure_dimension() >= -1


def test_pairwise_intersections_and_telltales():
    rows = instance("rows").collection
    for k in range(1, 7):
        assert rows.computed_M(k) == rows.M(k) == max(0, k - 1)
    assert math.isinf(thresholds_family().M(3))
    assert instance("two-adic").collection.computed_M(6) == 0
    th = instance("thresholds")
    assert limit_truth(th.collection, 3, 6).telltales_ok is True
    na = instance("non-angluin")
    assert limit_truth(na.collection, 8, 9).telltales_ok is False
    lt = limit_truth(instance("nat-pair").collection, 1, 2)
    assert (1, 2) in lt.thm15_pairs and lt.closure_dimension == -1


def test_cor_c4_union_blocks():
    coll = disjoint_union_of_sperner(max_block=4)
    assert coll.size == 2 + 3 + 4
    assert coll[1].name == "S2.L1" and coll[3].name == "S3.L1" and coll[6].name == "S4.L1"
    # languages of different blocks are disjoint
    assert coll[1].intersection(coll[3]).is_empty


def test_family_builders_misc():
    assert cofinite([0]).issubset(threshold(0))
    assert ap(0, 4).issubset(ap(0, 2))

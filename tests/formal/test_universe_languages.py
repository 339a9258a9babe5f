"""Universes and languages: bijections, exact counting/unranking, set algebra (spec 000 §5.1)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dplang.formal.languages import (
    DFA,
    FiniteSet,
    NatSet,
    PairSet,
    WholeUniverse,
    ap,
    cofinite,
    dfa_language,
    finite,
    residues,
    segment,
    threshold,
    two_adic,
)
from dplang.formal.universe import (
    CantorPairs,
    FiniteUniverse,
    Naturals,
    Shortlex,
    cantor_pair,
    cantor_unpair,
    finite_universe,
)


@pytest.mark.parametrize("uni", [Naturals(), Naturals(("#", "$")), Shortlex("ab"),
                                 Shortlex("abc"), CantorPairs(), finite_universe(5)])
def test_universe_bijection(uni):
    top = 60 if uni.size is None else uni.size
    seen = set()
    for j in range(1, top + 1):
        u = uni.at(j)
        assert uni.index(u) == j
        seen.add(repr(u))
    assert len(seen) == top


def test_shortlex_order_and_big_positions():
    u = Shortlex("ab")
    assert [u.at(j) for j in range(1, 10)] == ["", "a", "b", "aa", "ab", "ba", "bb", "aaa",
                                                "aab"]
    j = 3 * 2**80 + 17
    assert u.index(u.at(j)) == j
    assert u.first_index_of_length(3) == 8
    with pytest.raises(ValueError):
        u.index("abc")


def test_cantor_pairs_big():
    z = 10**40 + 12345
    assert cantor_pair(*cantor_unpair(z)) == z
    assert CantorPairs().at(1) == (0, 0)
    assert [CantorPairs().at(j) for j in (2, 3)] == [(1, 0), (0, 1)]


def test_naturals_with_noise():
    u = Naturals(("#",))
    assert u.at(1) == "#" and u.at(2) == 0 and u.index(5) == 7
    assert not segment(3, u).contains("#")
    assert segment(3, u).count_upto(3) == 2  # positions 1..3 = #, 0, 1


def brute(lang: NatSet, top: int) -> set[int]:
    return {x for x in range(top) if lang.contains(x)}


nat_sets = st.one_of(
    st.builds(lambda a, b: ap(a, b), st.integers(0, 12), st.integers(1, 6)),
    st.builds(lambda q, r, s: residues(q, r, start=s), st.integers(1, 6),
              st.sets(st.integers(0, 5), max_size=4), st.integers(0, 9)),
    st.builds(threshold, st.integers(0, 15)),
    st.builds(segment, st.integers(0, 15)),
    st.builds(lambda xs: finite(xs), st.sets(st.integers(0, 30), max_size=5)),
    st.builds(lambda xs: cofinite(xs), st.sets(st.integers(0, 30), max_size=5)),
)


@settings(max_examples=150, deadline=None)
@given(nat_sets, nat_sets)
def test_natset_algebra_matches_brute_force(a, b):
    top = 400
    sa, sb = brute(a, top), brute(b, top)
    assert brute(a.intersection(b), top) == sa & sb
    assert brute(a.union(b), top) == sa | sb
    assert brute(a.difference(b), top) == sa - sb
    assert brute(a.complement(), top) == set(range(top)) - sa
    # counting and unranking agree with the brute-force order
    members = sorted(sa)
    for v in (0, 7, 33, 199):
        assert a.count_le(v) == sum(1 for x in members if x <= v)
    for r, x in enumerate(members[:40], 1):
        assert a.nth(r) == x
    # finiteness: the periodic tail decides it
    if a.is_infinite:
        assert len(members) > 20
    else:
        assert a.size == len(members) or max(members, default=0) >= top


def test_natset_big_unranking_and_beyond():
    odds = ap(1, 2)
    r = 10**30 * 2**64
    assert odds.nth(r) == 2 * r - 1
    assert odds.nth_beyond(3, 1) == 3  # positions 1..3 = 0,1,2; next odd is 3
    assert odds.nth_beyond(3, r) == 2 * (r + 1) - 1
    l1 = finite([0]).union(ap(1, 2))
    assert l1.elements(5) == [0, 1, 3, 5, 7]
    assert l1.intersection(ap(0, 2)).size == 1
    big = threshold(10**9)
    assert big.count_le(10**9 + 4) == 5 and big.nth(3) == 10**9 + 2
    crt = ap(1, 6).intersection(ap(3, 4))
    assert crt.elements(3) == [7, 19, 31]
    assert two_adic(1).intersection(two_adic(2)).is_empty
    assert np.array_equal(l1.contains_many(np.arange(6)), [1, 1, 0, 1, 0, 1])


def test_finite_set_language():
    u = FiniteUniverse(("z", "x", "y", "#"))
    a = FiniteSet(u, {"z", "x"})
    b = FiniteSet(u, {"z", "y"})
    assert a.intersection(b).members == {"z"}
    assert a.difference(b).members == {"x"}
    assert not a.is_infinite and a.size == 2 and a.count_upto(2) == 2
    assert a.nth(2) == "x"
    with pytest.raises(IndexError):
        a.nth(3)


EVEN_B = {0: {"a": 0, "b": 1}, 1: {"a": 1, "b": 0}}


def test_dfa_counting_unranking_against_brute_force():
    even_b = dfa_language("ab", EVEN_B, 0, [0])
    uni = Shortlex("ab")
    members = [uni.at(j) for j in range(1, 300) if uni.at(j).count("b") % 2 == 0]
    assert even_b.elements(len(members)) == members
    for j in (1, 5, 17, 100, 299):
        assert even_b.count_upto(j) == sum(1 for m in members if uni.index(m) <= j)
    w = even_b.nth(10**25)
    assert w.count("b") % 2 == 0 and even_b.count_upto(uni.index(w)) == 10**25
    assert even_b.is_infinite


def test_dfa_set_algebra_and_finiteness():
    sigma = dfa_language("ab", {0: {"a": 0, "b": 0}}, 0, [0])
    even_b = dfa_language("ab", EVEN_B, 0, [0])
    a_star = dfa_language("ab", {0: {"a": 0, "b": 1}, 1: {"a": 1, "b": 1}}, 0, [0])
    assert a_star.issubset(even_b) and not even_b.issubset(a_star)
    assert sigma.difference(even_b).nth(1) == "b"
    fin = finite(["a", "bb"], Shortlex("ab"))
    assert not fin.is_infinite and fin.size == 2
    assert a_star.intersection(fin).size == 1
    with pytest.raises(OverflowError):
        a_star.nth(10**9)  # a^(10^9 − 1): too long to materialise


def test_partial_dfa_is_refused():
    with pytest.raises(ValueError, match="partial DFA"):
        dfa_language("ab", {0: {"a": 0}}, 0, [0])
    with pytest.raises(ValueError, match="partial DFA"):
        DFA(("a", "b"), ((0,),), 0, frozenset({0}))


def test_pairset_rows():
    rows = [PairSet({i: threshold(0), 0: segment(i)}) for i in range(1, 6)]
    for a in range(5):
        for b in range(a + 1, 5):
            assert rows[a].intersection(rows[b]).size == min(a, b) + 1
    uni = CantorPairs()
    r3 = rows[2]
    members = [uni.at(j) for j in range(1, 400) if r3.contains(uni.at(j))]
    assert r3.elements(len(members)) == members
    assert r3.count_upto(399) == len(members)
    assert r3.nth(10**12)[0] == 3


def test_whole_universe_is_cl_of_empty():
    w = WholeUniverse(Naturals())
    odds = ap(1, 2)
    assert w.intersection(odds) is odds
    assert w.difference(odds).elements(3) == [0, 2, 4]
    assert w.count_upto(10) == 10 and w.is_infinite
    assert math.isinf(float("inf"))

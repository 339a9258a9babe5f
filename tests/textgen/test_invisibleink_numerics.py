"""InvisibleInk numerics: non-finite logits and an exact float64 bound.

* Any private logit — NaN and ±inf included — contributes a clipped difference in [−C, C]:
  nothing a reference does aborts the run or escapes the clip.
* Non-finite *public* logits are decided from the public logits alone.
* The scores the sampler receives have sensitivity C/B exactly, in float64: for neighbouring
  batches (one reference present in one, absent — the empty reference — in the other) every
  coordinate differs by at most C/B, checked in exact rational arithmetic.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dplang.models import ToyModel
from dplang.privacy import RandomStreams
from dplang.privacy.audit import exact_audit
from dplang.textgen.engine import DecodingParams, GroupJob
from dplang.textgen.methods.invisibleink import (
    InvisibleInkPolicy,
    aggregate,
    candidate_scores,
    expanded_topk_mask,
    public_support,
    run_invisibleink,
    step_probabilities,
)

F32_MAX = float(np.finfo(np.float32).max)

public_values = st.one_of(
    st.floats(-F32_MAX, F32_MAX, width=32),
    st.floats(20.0, 40.0, width=32),
    st.floats(-2.0**-100, 2.0**-100, width=32),
    st.sampled_from([0.0, -0.0, 1e-45, 37.5, -1e6]),
)
private_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.floats(20.0, 40.0, width=32),
    st.sampled_from([math.nan, math.inf, -math.inf, F32_MAX, -F32_MAX]),
)
clips = st.one_of(st.floats(1e-6, 1e3), st.sampled_from([0.05, 0.1, 1.0, 3.0]))


@st.composite
def neighbours(draw):
    """(public [K], private rows of D [m, K], index of the row that D' lacks, C, B)."""
    k = draw(st.integers(1, 8))
    b = draw(st.integers(1, 12))
    m = draw(st.integers(1, b))
    pub = draw(st.lists(public_values, min_size=k, max_size=k))
    rows = draw(st.lists(st.lists(private_values, min_size=k, max_size=k), min_size=m,
                         max_size=m))
    j = draw(st.integers(0, m - 1))
    return (torch.tensor(pub, dtype=torch.float32), torch.tensor(rows, dtype=torch.float32),
            j, draw(clips), b)


def max_exact_gap(a: np.ndarray, b: np.ndarray) -> Fraction:
    return max(abs(Fraction(float(x)) - Fraction(float(y))) for x, y in zip(a, b, strict=True))


@pytest.mark.audits("invisibleink")
@settings(max_examples=400, deadline=None)
@given(neighbours())
def test_sensitivity_is_c_over_b_exactly_in_float64(case):
    pub, rows, j, c, b = case
    full = candidate_scores(rows, pub, c, b)
    nulled = candidate_scores(torch.cat([rows[:j], rows[j + 1:]]), pub, c, b)
    assert full.dtype == np.float64 and np.isfinite(full).all()
    assert max_exact_gap(full, nulled) <= Fraction(c) / b
    # zero-out (row replaced by zero logits): 2C/B, also exactly
    zero = rows.clone()
    zero[j] = 0.0
    assert max_exact_gap(full, candidate_scores(zero, pub, c, b)) <= 2 * Fraction(c) / b


def _float32_scores(private, public, c, b):
    """The previous aggregation: φ_pub + Σ clip(φ_i − φ_pub)/B in float32 (broken twin)."""
    diffs = (private - public).clamp(-c, c)
    return (public + diffs.sum(dim=0) / b).to(torch.float64).numpy()


def test_float32_aggregation_breaks_the_bound():
    """The same check rejects float32 aggregation at logits 20–40 (it exceeds C/B by ~2e-6),
    and even the textbook float64 formula."""
    g = torch.Generator().manual_seed(0)
    worst = Fraction(0)
    c, b = 0.05, 7
    for _ in range(200):
        pub = (20 + 20 * torch.rand(64, generator=g)).to(torch.float32)
        rows = (pub + 3 * torch.randn(b, 64, generator=g)).to(torch.float32)
        gap = max_exact_gap(_float32_scores(rows, pub, c, b), _float32_scores(rows[1:], pub, c, b))
        worst = max(worst, gap - Fraction(c) / b)
        assert max_exact_gap(candidate_scores(rows, pub, c, b),
                             candidate_scores(rows[1:], pub, c, b)) <= Fraction(c) / b
    assert worst > 1e-7
    # plain float64 arithmetic (the textbook aggregate) is not exact either: 1 − 1e-6 rounds
    pub, rows = torch.tensor([1.0], dtype=torch.float64), torch.tensor([[0.0]])
    textbook = aggregate(rows, pub, 1e-6, 1).numpy()
    assert max_exact_gap(textbook, pub.numpy()) > Fraction(1e-6)
    assert max_exact_gap(candidate_scores(rows, pub, 1e-6, 1),
                         candidate_scores(rows[:0], pub, 1e-6, 1)) <= Fraction(1e-6)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_private_logit_is_clipped_not_fatal(bad):
    pub = torch.tensor([1.0, 2.0, 3.0])
    rows = torch.tensor([[1.5, bad, 0.0], [0.0, 2.0, 3.0]])
    c, b = 0.5, 4
    scores = candidate_scores(rows, pub, c, b)
    # the bad entry counts as 0 (NaN: the empty reference's value), +C or −C
    clean = rows.clone()
    clean[0, 1] = {True: 2.0, False: 2.0 + math.copysign(c, bad)}[math.isnan(bad)]
    assert np.array_equal(scores, candidate_scores(clean, pub, c, b))
    law = step_probabilities(rows, pub, c, b, 1.0, 0)
    assert np.isfinite(law).all() and law.sum() == pytest.approx(1.0)


def test_non_finite_public_logits_are_a_public_decision():
    """NaN and −inf public logits are never candidates; +inf ones are the only candidates and
    the step is uniform over them; the private rows cannot change any of this."""
    c, b, tau = 1.0, 3, 1.0
    pub = torch.tensor([0.5, math.nan, -math.inf, 2.0, 1.0])
    assert public_support(pub).tolist() == [True, False, False, True, True]
    g = torch.Generator().manual_seed(1)
    for k in (0, 1, 2, 5):
        laws = [step_probabilities(50 * torch.randn(m, 5, generator=g), pub, c, b, tau, k)
                for m in (0, 1, 3)]
        for law in laws:
            assert law[1] == law[2] == 0 and law.sum() == pytest.approx(1.0)
        assert exact_audit([(laws[0], laws[1]), (laws[1], laws[2])]).max_log_ratio < math.inf
    plus = torch.tensor([0.5, math.inf, math.nan, math.inf])
    for k in (0, 1, 3):
        assert expanded_topk_mask(plus, k, c, b).tolist() == [False, True, False, True]
        for m in (0, 2):
            law = step_probabilities(torch.randn(m, 4, generator=g) * 9, plus, c, b, tau, k)
            assert law.tolist() == [0.0, 0.5, 0.0, 0.5]
    # a public row that allows nothing is refused whatever the private rows hold
    dead = torch.tensor([math.nan, -math.inf])
    policy = InvisibleInkPolicy(c, b, tau, 0, 2)
    with pytest.raises(ValueError, match="allow no token"):
        policy.candidates(dead)


class NaNForPrivateModel(ToyModel):
    """A toy model whose rows for one reference return NaN and ±inf logits."""

    def logits_for(self, prompt, prefix):
        out = super().logits_for(prompt, prefix)
        if "poison" in prompt:
            out[1::3] = np.nan
            out[2::3] = np.inf
            out[3::3] = -np.inf
        return out


@pytest.mark.parametrize("sparse", [True, False])
def test_engine_run_survives_non_finite_private_logits(sparse):
    """A reference whose logits are NaN/±inf neither aborts the run (its neighbour would not
    abort) nor escapes the clip: the group's law differs from the nulled group's by ≤ 2C/(Bτ)
    per token, as for any other reference."""
    model = NaNForPrivateModel(vocab_size=12, eos_after=None)
    params = DecodingParams(0.5, 3, 1.0, 0, 4, sparse_head=sparse)
    public = "public prompt"
    jobs = [GroupJob(0, public, ("poison reference", "other reference", public))]
    res = run_invisibleink(model, jobs, params, RandomStreams(0), 1)
    assert res[0].num_tokens == 4
    seen = []
    policy = InvisibleInkPolicy(0.5, 3, 1.0, 0, 12, observer=lambda i, s, t: seen.append(s))
    pub = torch.from_numpy(model.logits_for(public, []))
    rows = torch.from_numpy(np.stack([model.logits_for(p, []) for p in
                                      ("poison reference", "other reference")]))
    policy.choose(pub, rows, None, np.random.default_rng(0))
    policy.choose(pub, rows[1:], None, np.random.default_rng(0))
    assert max_exact_gap(seen[0], seen[1]) <= Fraction(0.5) / 3

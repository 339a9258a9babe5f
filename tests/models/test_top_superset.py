"""The LM head's Top-k superset from bounds (:meth:`IntegerLinear.top_superset`).

The set must hold every column whose output reaches ``f32(ell - margin)``; the engine then
applies InvisibleInk's rule to the exact logits on it, which gives exactly the rule's set on
the full logits. Tested on random heads and on heads whose low-limb weights are adversarial for
a row (every output at one end of its bound interval: a bound one integer too narrow loses a
kept column), with banned columns, ties and a bias.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dplang.models import cpu_kernels, exact
from dplang.models.exact import IntegerLinear

pytestmark = pytest.mark.skipif(not cpu_kernels.available(torch.zeros(1)),
                                reason="numba is not installed")


def _head(vocab: int, width: int, seed: int, bias: bool = False) -> IntegerLinear:
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab, width, generator=gen)
    b = torch.randn(vocab, generator=gen) if bias else None
    return IntegerLinear(weight, b, weight_bits=16, layout="nk")


def _rule(values: torch.Tensor, top_k: int, margin: float) -> list[list[int]]:
    """InvisibleInk's Top-k+ rule on full rows (the CPU kernel, with margin ``f32(margin)``):
    the ids each row keeps."""
    ids, sizes = cpu_kernels.topk_plus_rows(values, top_k, margin / 2.0, 1)
    return [ids[g, : int(sizes[g])].tolist() for g in range(values.shape[0])]


def _check(head: IntegerLinear, x: torch.Tensor, top_k: int, margin: float,
           banned: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    found = head.top_superset(x, top_k, float(np.float32(margin)), banned)
    assert found is not None
    ids, sizes, logits = found
    assert ids.shape == logits.shape and ids.dtype == torch.int64
    full = head(x)
    # every entry, the padding too, is the full product's output on its id, bit for bit
    assert torch.equal(logits.view(torch.int32), head(x).gather(1, ids).view(torch.int32))
    if banned is not None:
        full[:, banned] = -math.inf
    margin32 = np.float32(margin)
    for g in range(x.shape[0]):
        row = full[g]
        ell = torch.topk(row, top_k).values[-1]
        threshold = np.float32(ell.numpy() - margin32)
        kept = set(torch.nonzero(row >= float(threshold)).squeeze(-1).tolist())
        held = ids[g, : int(sizes[g])].tolist()
        assert held == sorted(set(held)), "ascending ids"
        assert (ids[g, int(sizes[g]):] == ids[g, 0]).all(), "padded by the first id"
        assert kept <= set(held), f"row {g} lost {sorted(kept - set(held))[:5]}"
        if banned is not None:
            assert not banned[held].any()
        # the rule on the exact logits of the set (the rest at -inf) keeps the same ids
        on_set = torch.full_like(row, -math.inf)
        on_set[held] = logits[g, : int(sizes[g])]
        assert _rule(on_set[None], top_k, margin) == _rule(row[None], top_k, margin)
    return ids, sizes, logits


@pytest.mark.parametrize("top_k", [1, 7, 50])
@pytest.mark.parametrize("margin", [0.0, 0.05, 1.0])
def test_superset_holds_every_kept_column(top_k: int, margin: float) -> None:
    head = _head(3000, 96, seed=top_k)
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(6, 96, generator=gen)
    x[1] *= 1e3
    x[2] *= torch.rand(96, generator=gen) ** 8  # outliers
    _check(head, x, top_k, margin)


def test_banned_columns_and_a_bias() -> None:
    head = _head(2000, 64, seed=3, bias=True)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(5))
    full = head(x)
    banned = torch.zeros(2000, dtype=torch.bool)
    banned[full[0].topk(5).indices] = True  # the best columns of row 0
    banned[::7] = True
    _check(head, x, 10, 0.3, banned)


def _adversarial(head: IntegerLinear, x: torch.Tensor, row: int) -> None:
    """Low-limb weights that put every output of ``row`` at one end of its bound interval:
    even columns at the upper end (127 against a positive high limb, -128 against a
    negative one), odd ones at the lower end."""
    prepared = exact.prepare_rows(x)
    sign = torch.sign(prepared.limbs[row].to(torch.int64))
    high = torch.where(sign > 0, 127, torch.where(sign < 0, -128, 0))
    low = torch.where(sign > 0, -128, torch.where(sign < 0, 127, 0))
    limbs = torch.stack([high, low]).repeat(head.out_features // 2 + 1, 1)
    head.limbs[1].copy_(limbs[: head.out_features].to(torch.int8))


@pytest.mark.parametrize("margin", [0.0, 0.01, 0.2])
def test_adversarial_low_limbs_reach_the_bounds(margin: float) -> None:
    head = _head(4000, 64, seed=9)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2))
    _adversarial(head, x, row=1)
    full = head(x)
    prepared = exact.prepare_rows(x)
    low_part = exact.exact_products(head.limbs[1], prepared.limbs.t().contiguous(), head.kernel)
    # row 1's low-limb products are the ends of the range the bounds use, exactly
    least, most = cpu_kernels.low_limb_range(prepared.limbs[:3])
    assert low_part[0::2, 1].unique().tolist() == [int(most[1])]
    assert low_part[1::2, 1].unique().tolist() == [int(least[1])]
    # and every other row's products are inside their ranges
    for row in (0, 2):
        assert int(least[row]) <= int(low_part[:, row].min())
        assert int(low_part[:, row].max()) <= int(most[row])
    assert torch.isfinite(full).all()
    for top_k in (1, 5, 40):
        _check(head, x, top_k, margin)


def test_ties_at_the_threshold_are_held() -> None:
    """A zero row's outputs are its bias (both bounds equal): columns tied with the k-th
    largest are at the threshold exactly (margin 0) and must be held."""
    head = _head(400, 32, seed=4, bias=True)
    bias = torch.linspace(-4.0, 3.0, 400)
    bias[[5, 50, 120, 300, 301, 399]] = 5.0
    head.bias = bias
    x = torch.zeros(2, 32)
    x[1] = torch.randn(32, generator=torch.Generator().manual_seed(1))
    ids, sizes, _ = _check(head, x, 3, 0.0)
    assert ids[0, : int(sizes[0])].tolist() == [5, 50, 120, 300, 301, 399]


def test_no_superset_where_it_would_not_pay_or_is_undefined() -> None:
    head = _head(300, 32, seed=1)
    x = torch.randn(2, 32, generator=torch.Generator().manual_seed(0))
    assert head.top_superset(x, 0, 0.1) is None  # no top-k
    assert head.top_superset(x, 300, 0.1) is None  # the whole vocabulary
    banned = torch.zeros(300, dtype=torch.bool)
    banned[:250] = True
    assert head.top_superset(x, 50, 0.1, banned) is None  # k >= the columns left
    assert head.top_superset(x, 5, 1e6) is None  # a margin that keeps every column
    # a negative margin (a negative C): f32(L_k - margin) > L_k could drop a top-k column
    assert head.top_superset(x, 5, -0.1) is None
    assert head.top_superset(x, 5, math.nan) is None
    bad = x.clone()
    bad[0, 3] = math.inf  # a row that rounds to zeros: every output 0, all tied
    assert head.top_superset(bad, 5, 0.1) is None
    eight = IntegerLinear(torch.randn(300, 32), None, weight_bits=8, layout="nk")
    assert eight.top_superset(x, 5, 0.1) is None  # one limb: nothing to bound
    assert IntegerLinear(torch.randn(300, 32), None, layout="kn").top_superset(x, 5, 0.1) is None


def test_a_rows_set_depends_on_that_row_only() -> None:
    head = _head(2500, 64, seed=6)
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(5, 64, generator=gen)
    ids, sizes, logits = _check(head, x, 20, 0.5)
    for g in range(5):
        alone, alone_sizes, alone_logits = head.top_superset(x[g:g + 1], 20,
                                                             float(np.float32(0.5)))
        n = int(sizes[g])
        assert int(alone_sizes[0]) == n
        assert torch.equal(alone[0, :n], ids[g, :n])
        assert torch.equal(alone_logits[0, :n].view(torch.int32),
                           logits[g, :n].view(torch.int32))


def _kernel_superset(head: IntegerLinear, x: torch.Tensor, top_k: int, margin: float,
                     chunk: int, most: int):
    """``cpu_kernels.top_superset`` on ``head`` with a chosen chunk and candidate limit."""
    prepared = exact.prepare_rows(x)
    right = prepared.limbs.t().contiguous()
    return cpu_kernels.top_superset(
        prepared.limbs, prepared.scale,
        lambda start, stop: exact.exact_products(head.limbs[0][start:stop], right, head.kernel),
        head.limbs[1], head.out_features, chunk, head.col_scale, head.bias,
        float(exact.LIMB * exact.LIMB), float(exact.LIMB), top_k, float(np.float32(margin)),
        None, most)


def test_candidates_dropped_when_a_chunk_would_not_fit() -> None:
    """Small chunks and a small candidate limit make the pass drop candidates that the
    threshold so far has passed (many times per row); the set and its logits are those of one
    chunk over the whole head, and a limit too small for the set gives ``None``."""
    head = _head(3000, 48, seed=12)
    gen = torch.Generator().manual_seed(13)
    x = torch.randn(4, 48, generator=gen)
    for top_k, margin in ((5, 0.5), (30, 2.0)):
        whole = _kernel_superset(head, x, top_k, margin, 3000, 3000)
        assert whole is not None
        sizes = whole[1]
        most = int(sizes.max()) + 40  # a few dozen above the largest set
        for chunk in (16, 64, 250):
            found = _kernel_superset(head, x, top_k, margin, chunk, most)
            assert found is not None, chunk
            for got, want in zip(found, whole, strict=True):
                assert torch.equal(got.view(torch.int32) if got.dtype == torch.float32 else got,
                                   want.view(torch.int32) if want.dtype == torch.float32
                                   else want), chunk
        assert _kernel_superset(head, x, top_k, margin, 64, top_k - 1) is None

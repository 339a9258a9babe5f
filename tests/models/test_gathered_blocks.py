"""``IntegerLinear.gathered`` (the LM head on each row's own candidates) in blocks of bounded
memory: the same bits as the full product's columns whatever the blocking, the candidate width
(narrow: gathered weight rows; wide: a block's full product) or the other rows.

On an H100 at 256 groups the unblocked version asked for 74.5 GiB (2048 rows x thousands of
candidates x K); the element budget is monkeypatched small here so that the blocking happens."""

from __future__ import annotations

import pytest
import torch

from dplang.models import exact


def _head(bits: int, n: int = 200, k: int = 48, bias: bool = True) -> exact.IntegerLinear:
    gen = torch.Generator().manual_seed(bits * 7 + n)
    weight = torch.randn(n, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    return exact.IntegerLinear(weight, b, weight_bits=bits, layout="nk")


def _ids(rows: int, width: int, n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, n, (rows, width), generator=gen)
    if width > 1:
        ids[:, 1] = ids[:, 0]  # repeats
    return ids


@pytest.mark.parametrize("bits", [16, 8])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("width", [1, 7, 49, 50, 130, 200, 260])  # 4 * 50 >= 200: wide
@pytest.mark.parametrize("budget", [2**24, 48 * 7, 500, 48 * 200 - 1, 200 * 3, 200 * 4 + 1])
def test_gathered_equals_the_full_products_columns(monkeypatch: pytest.MonkeyPatch, bits: int,
                                                   bias: bool, width: int, budget: int) -> None:
    """Budgets that make one row per block, several rows per block with a final partial block,
    candidates split across blocks, and a block of all rows."""
    monkeypatch.setattr(exact, "_GATHER_BUDGET", budget)
    lin = _head(bits, bias=bias)
    gen = torch.Generator().manual_seed(width + budget)
    x = torch.randn(23, 48, generator=gen)
    ids = _ids(23, width, 200, width)
    if width == 200:
        ids[0] = torch.arange(200)  # every column
    got = lin.gathered(x, ids)
    assert got.shape == (23, width) and got.dtype == torch.float32
    assert torch.equal(got, lin(x).gather(1, ids))
    # One row alone: the same bits (row invariance), through both paths.
    for i in (0, 11, 22):
        assert torch.equal(lin.gathered(x[i:i + 1], ids[i:i + 1]), got[i:i + 1])


@pytest.mark.parametrize("bits", [16, 8])
def test_gathered_long_rows_and_blocks(monkeypatch: pytest.MonkeyPatch, bits: int) -> None:
    """``K`` longer than one float32 chunk, and a budget below one candidate row (one row and
    one candidate per block)."""
    lin = _head(bits, n=64, k=2100)
    gen = torch.Generator().manual_seed(bits)
    x = torch.randn(5, 2100, generator=gen)
    ids = _ids(5, 9, 64, bits)
    want = lin(x).gather(1, ids)
    for budget in (2**24, 2100 * 4, 1000):
        monkeypatch.setattr(exact, "_GATHER_BUDGET", budget)
        assert torch.equal(lin.gathered(x, ids), want)
    wide = _ids(5, 64, 64, 3)
    monkeypatch.setattr(exact, "_GATHER_BUDGET", 64 * 2)
    assert torch.equal(lin.gathered(x, wide), lin(x).gather(1, wide))


def test_gathered_blocks_bound_the_gathered_limbs(monkeypatch: pytest.MonkeyPatch) -> None:
    """No gathered weight block is larger than the budget, however many rows and candidates."""
    budget = 48 * 30
    monkeypatch.setattr(exact, "_GATHER_BUDGET", budget)
    lin = _head(16)
    seen: list[int] = []
    weight_rows = lin.weight_rows

    def recording(ids: torch.Tensor) -> list[torch.Tensor]:
        limbs = weight_rows(ids)
        seen.append(limbs[0].numel())
        return limbs

    monkeypatch.setattr(lin, "weight_rows", recording)
    from dplang.models import cpu_kernels

    # the blocks are the torch definition's (the compiled head gathers no weight block)
    monkeypatch.setattr(cpu_kernels, "available", lambda tensor: False)
    x = torch.randn(37, 48)
    ids = _ids(37, 45, 200, 1)  # narrow: 4 * 45 < 200
    assert torch.equal(lin.gathered(x, ids), lin(x).gather(1, ids))
    assert len(seen) > 1 and max(seen) <= budget and sum(seen) == 37 * 45 * 48


def test_gathered_empty() -> None:
    lin = _head(16)
    assert lin.gathered(torch.randn(0, 48), torch.zeros(0, 5, dtype=torch.int64)).shape == (0, 5)
    assert lin.gathered(torch.randn(3, 48), torch.zeros(3, 0, dtype=torch.int64)).shape == (3, 0)

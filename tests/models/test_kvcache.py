"""The in-place KV cache layers behave exactly like transformers' own dynamic layers."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from dplang.models._kvcache import BufferedLayer, BufferedSlidingWindowLayer


@pytest.mark.parametrize("window", [None, 5, 70])
def test_buffered_layer_matches_stock(window: int | None) -> None:
    if window is None:
        ours, stock = BufferedLayer(), DynamicLayer()
    else:
        ours = BufferedSlidingWindowLayer(sliding_window=window)
        stock = DynamicSlidingWindowLayer(sliding_window=window)
    gen = torch.Generator().manual_seed(0)
    rows = 4
    # A prompt step, then many one-token steps: crosses several storage reallocations.
    lengths = [9] + [1] * 200
    for step, q in enumerate(lengths):
        if step == 60:  # drop rows mid-way, as the engine does
            keep = torch.tensor([0, 2, 3])
            ours.batch_select_indices(keep)
            stock.batch_select_indices(keep)
            rows = 3
        if step == 150:
            keep = torch.tensor([1])
            ours.batch_select_indices(keep)
            stock.batch_select_indices(keep)
            rows = 1
        assert ours.get_mask_sizes(q) == stock.get_mask_sizes(q)
        k = torch.randn(rows, 2, q, 8, generator=gen)
        v = torch.randn(rows, 2, q, 8, generator=gen)
        got_k, got_v = ours.update(k, v)
        want_k, want_v = stock.update(k, v)
        assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
        assert torch.equal(ours.keys, stock.keys) and torch.equal(ours.values, stock.values)
        assert ours.get_seq_length() == stock.get_seq_length()
    if window is not None:  # storage stays bounded by about twice the window
        assert ours._kbuf is not None and ours._kbuf.shape[-2] <= 2 * window + 64

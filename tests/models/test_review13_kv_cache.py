"""Row invariance through reused key/value slots: a slot freed by a dropped row and handed to
another must not carry the old row's values into the new owner's result, even when the old
row's activations overflowed (0 * NaN = NaN if a non-finite number were ever stored)."""

from __future__ import annotations

from pathlib import Path

import torch

from dplang.models.transformers import RowDecodeState, TransformersModel


def test_a_row_with_non_finite_activations_leaks_nothing_through_its_slot(
        tiny_llama_dir: Path, monkeypatch) -> None:
    m = TransformersModel(tiny_llama_dir, threads=1, block_size=4)  # passes the load check
    poison = 7
    embed = m._decoder.embed

    def overflowing(ids: torch.Tensor) -> torch.Tensor:  # any input whose activations overflow
        x = embed(ids)
        return torch.where((ids == poison).unsqueeze(-1), float("nan"), x)

    monkeypatch.setattr(m._decoder, "embed", overflowing)
    a, b = [1, 20, poison, 21], [1, 30, 31, 32]

    def last_logits(rows: list[list[int]], drop_first: bool) -> torch.Tensor:
        state = RowDecodeState(prompts=[list(r) for r in rows])
        m.next_hidden(state, None)
        if drop_first:  # the first row's group ended (EOS): its slot is freed
            m.drop_rows(state, torch.tensor([1]))
            state.prompts.append([1, 50, 51])  # a new row takes the freed slot
            state.caches.append(None)
            state.prefix_of.append(None)
        hidden = m.next_hidden(state, torch.tensor([40]))
        return m.logits_from_hidden(hidden)

    alone = last_logits([b], False)[-1]
    after = last_logits([a, b], True)
    assert torch.equal(after[0], alone)
    reused = RowDecodeState(prompts=[[1, 50, 51]])
    assert torch.equal(after[1], m.logits_from_hidden(m.next_hidden(reused, None))[0])

"""Row invariance through reused key/value cache blocks (found in the adversarial review of
issue 13): a block freed by a dropped row and handed to another must not carry the old row's
values into the new owner's result, even non-finite ones (0 * NaN = NaN)."""

from __future__ import annotations

from pathlib import Path

import torch

from dplang.models.transformers import RowDecodeState, TransformersModel


def test_stale_non_finite_values_in_a_reused_block_do_not_leak(tiny_llama_dir: Path) -> None:
    m = TransformersModel(tiny_llama_dir, threads=1, block_size=4)  # passes the load check
    poison = 7
    with torch.no_grad():  # stands for any input whose activations overflow
        m._body.embed_tokens.weight[poison] = float("nan")
    a, b = [1, 20, poison, 21], [1, 30, 31, 32]

    def last_logits(rows: list[list[int]], drop_first: bool) -> torch.Tensor:
        state = RowDecodeState(prompts=[list(r) for r in rows])
        m.next_hidden(state, None)
        if drop_first:  # the first row's group ended (EOS): its blocks are freed
            m.drop_rows(state, torch.tensor([1]))
        hidden = m.next_hidden(state, torch.tensor([40]))  # b grows into a new (reused) block
        return m.logits_from_hidden(hidden)[-1]

    alone = last_logits([b], False)
    after = last_logits([a, b], True)
    assert torch.equal(after, alone)

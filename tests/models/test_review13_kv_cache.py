"""Review of issue 13 (adversarial): row invariance through reused key/value cache blocks.

A strict xfail documenting a defect found in review; remove the marker once fixed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dplang.models.transformers import RowDecodeState, TransformersModel


@pytest.mark.xfail(strict=True, reason="review13: decode attention multiplies whole blocks, so "
                   "non-finite keys/values left in a freed block by a dropped row turn the next "
                   "owner's logits into NaN (0 * NaN, NaN + -inf)")
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

"""A reference is tokenized only as far as a public number of characters: the run's planning
time (which the lock file's and the manifest's times show) must not measure one reference's
length (a megabyte reference took seconds to tokenize whole)."""

from __future__ import annotations

import dplang
from dplang.models import ToyModel
from dplang.models.base import reference_prefix


class Measuring(ToyModel):
    """A toy model that records the length of every text it tokenizes."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.seen: list[int] = []

    def count_tokens(self, text: str) -> int:
        self.seen.append(len(text))
        return super().count_tokens(text)

    def truncate_tokens(self, text: str, max_tokens: int) -> str:
        self.seen.append(len(text))
        return super().truncate_tokens(text, max_tokens)


def test_a_huge_reference_is_tokenized_only_to_a_public_bound():
    limit = 16
    huge = ["review " * 200_000] + [f"review number {i}" for i in range(5)]
    model = Measuring(vocab_size=30, eos_after=None)
    result = dplang.generate(huge, epsilon=3, dataset="long", model=model, batch_size=3,
                             max_tokens=3, max_reference_tokens=limit, quiet=True)
    assert len(result.texts) == 2
    assert max(model.seen) <= 4 * (limit + 1) * Measuring.max_token_chars
    # the reference the engine reads is the same first tokens as before
    assert reference_prefix(model, huge[0], limit) == (huge[0][:limit], True)


def test_the_prefix_is_the_whole_texts_first_tokens(tiny_llama_dir):
    from dplang.models.transformers import TransformersModel

    model = TransformersModel(tiny_llama_dir, check_invariance=False, verify=False)
    assert model.max_token_chars >= 1
    text = "The soup was rich, the bread still warm; we waited forty minutes. " * 400
    for limit in (1, 16, 100):
        assert reference_prefix(model, text, limit) == (model.truncate_tokens(text, limit), True)
    assert reference_prefix(model, "short", 100) == ("short", False)
    assert reference_prefix(model, "", 5) == ("", False)

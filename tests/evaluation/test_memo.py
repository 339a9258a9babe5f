"""Real-side memoisation of the evaluation harness (a sweep scores one real set many times)."""

from dplang.evaluation import evaluate_texts
from dplang.evaluation.embedders import HashingEmbedder


class CountingEmbedder(HashingEmbedder):
    def __init__(self) -> None:
        super().__init__(dim=64)
        self.calls: list[int] = []

    def embed(self, texts):
        self.calls.append(len(texts))
        return super().embed(texts)


def _texts(tag: str, n: int = 24) -> list[str]:
    return [f"{tag} review number {i}: the {'soup' if i % 2 else 'bread'} was fine"
            for i in range(n)]


def test_real_features_are_computed_once_per_real_set():
    emb = CountingEmbedder()
    real = _texts("real")
    first = evaluate_texts(real, [_texts("a")], metrics=["mauve"], embedder=emb)
    again = evaluate_texts(real, [_texts("a")], metrics=["mauve"], embedder=emb)
    assert emb.calls == [24, 24, 24]  # real once, the synthetic set twice
    assert first["runs"][0]["mauve"] == again["runs"][0]["mauve"]
    evaluate_texts([*real[:-1], "a different last text"], [_texts("a")], metrics=["mauve"],
                   embedder=emb)
    assert emb.calls == [24, 24, 24, 24, 24]  # a different real set is embedded afresh

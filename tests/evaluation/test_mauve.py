import numpy as np
import pytest

from dplang.evaluation import (
    EvaluationError,
    HashingEmbedder,
    default_num_buckets,
    mauve_from_features,
    mauve_score,
    resolve_embedder,
)
from dplang.evaluation.embedders import PAPER_MAX_TOKENS

# With the paper's scaling factor 0.9, two distributions with disjoint supports score
# about 0.55 (the area under x^(1/0.9) + y^(1/0.9) = 1), not 0: that is MAUVE's floor.
DISJOINT_FLOOR = 0.56


def test_default_embedder_is_offline_minilm(default_embedder):
    assert "MiniLM" in default_embedder.name
    assert default_embedder.max_tokens == min(PAPER_MAX_TOKENS, 256) == 256
    features = default_embedder.embed(["a short text", ""])
    assert features.shape == (2, 384) and np.isfinite(features).all()


def test_mauve_real_embedder_same_source_high_degenerate_low(default_embedder, kit):
    real = kit.reviews(60, seed=1)
    features = default_embedder.embed(real)
    same_source = mauve_score(real, kit.reviews(60, seed=2), default_embedder,
                              real_features=features)
    degenerate = mauve_score(real, kit.degenerate(60), default_embedder, real_features=features)
    itself = mauve_score(real, real, default_embedder, real_features=features)
    assert itself.mauve == pytest.approx(1.0)
    assert same_source.mauve > 0.95
    assert degenerate.mauve < DISJOINT_FLOOR
    assert same_source.num_buckets == 3 and same_source.n == 60
    assert same_source.scaling_factor == 0.9


def test_mauve_hashing_embedder_orders_and_is_deterministic(kit):
    emb = HashingEmbedder()
    real = kit.reviews(100, seed=3)
    good = mauve_score(real, kit.reviews(100, seed=4), emb, num_buckets=10)
    bad = mauve_score(real, kit.degenerate(100), emb, num_buckets=10)
    assert good.mauve > 0.9 > DISJOINT_FLOOR > bad.mauve
    again = mauve_score(real, kit.reviews(100, seed=4), emb, num_buckets=10)
    assert again.mauve == good.mauve and again.p_hist == good.p_hist


def test_bucket_rule():
    assert default_num_buckets(1000) == 50
    assert default_num_buckets(100) == 5
    assert default_num_buckets(20) == 2 and default_num_buckets(39) == 2


def test_mauve_size_errors():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((30, 8))
    with pytest.raises(EvaluationError, match="equal numbers"):
        mauve_from_features(a, a[:25])
    with pytest.raises(EvaluationError, match="at least 20"):
        mauve_from_features(a[:10], a[:10])
    with pytest.raises(EvaluationError, match="buckets do not fit"):
        mauve_from_features(a, a, num_buckets=16)


def test_missing_embedder_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="embedder not found"):
        resolve_embedder(str(tmp_path / "nope"))


def test_sentence_transformers_model_by_path_matches_default(default_embedder):
    from dplang.evaluation.embedders import default_embedder_path

    by_path = resolve_embedder(str(default_embedder_path()))
    assert by_path.name == str(default_embedder_path().resolve())
    texts = ["The pasta was cold.", "Great staff and a cozy room."]
    np.testing.assert_allclose(by_path.embed(texts), default_embedder.embed(texts), atol=1e-6)


def test_embedder_truncates_to_its_max_tokens(default_embedder):
    long_text = "word " * 600
    # Whatever follows the first 256 tokens does not change the embedding.
    a, b = default_embedder.embed([long_text, long_text + " completely different ending"])
    np.testing.assert_allclose(a, b, atol=1e-6)

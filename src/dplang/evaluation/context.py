"""What one evaluation is given: its settings (:class:`EvaluationSettings`), the scoring model
and tokenizer (:class:`ScoringModels`), the real-side cache (:class:`RealSideCache`) and the
:class:`MetricContext` every metric's ``compute`` receives.

A leaf of :mod:`dplang.evaluation` below the metric registry, the harness and the metrics: each
of them imports it, it imports none of them (the registry re-exports :class:`MetricContext`
and :class:`RealSideCache`; the harness :class:`EvaluationSettings`; the built-in metrics
:class:`ScoringModels`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dplang.evaluation.lengths import load_tokenizer
from dplang.evaluation.mauve_metric import DEFAULT_MAUVE_SEED, SCALING_FACTOR
from dplang.evaluation.perplexity import DEFAULT_BATCH_SIZE, DEFAULT_MAX_LENGTH, PerplexityScorer

if TYPE_CHECKING:
    from dplang.evaluation.data import RealTexts, SyntheticRun
    from dplang.evaluation.embedders import Embedder

__all__ = [
    "REAL_SIDE_CACHE",
    "EvaluationSettings",
    "MetricContext",
    "RealSideCache",
    "ScoringModels",
]


@dataclass
class EvaluationSettings:
    """Everything that determines an evaluation (recorded in ``metrics.json``).

    Attributes:
        metrics: metric names (registered: :func:`dplang.evaluation.registry.metric_names`;
            ``None``: the registry's default metrics,
            :func:`~dplang.evaluation.registry.default_metrics`).
        embedder: ``"default"``, ``"hashing"``, a sentence-transformers folder, or an
            :class:`~dplang.evaluation.embedders.Embedder`.
        model: scoring / tokenizer model: ``"default"``, a path, or a loaded
            :class:`~dplang.models.TransformersModel`.
        num: requested texts per side (``None``: as many as every input provides).
        seed: MAUVE k-means / PCA seed.
        num_buckets: MAUVE buckets (``None``: ``max(2, n // 20)``).
        scaling_factor: MAUVE scaling factor.
        text_column: column of the real file with the text.
        exclude_references: skip real rows that were references of a run (when the real file
            is the generation's data file) instead of refusing.
        batch_size / max_length: perplexity batching and per-text token limit (incl. BOS).
        label_column: the public label column of the ``downstream`` metric (the generation's
            ``--group-by`` column).
        test_num: ``downstream``: held-out test rows after the ``n`` real texts (``None``: all
            the rest).
        mauve_bootstrap: ``mauve``: its interval over resampled texts, in bootstrap resamples
            (0: none).
        real_max_tokens: cut every held-out real text to its first this-many tokens of
            ``model``'s tokenizer before any metric sees it (``None``: whole texts), so that
            generations capped at T tokens are compared with real texts of at most T tokens.
    """

    metrics: tuple[str, ...] | None = None
    embedder: str | Embedder = "default"
    model: Any = "default"
    num: int | None = None
    seed: int = DEFAULT_MAUVE_SEED
    num_buckets: int | None = None
    scaling_factor: float = SCALING_FACTOR
    text_column: str = "text"
    exclude_references: bool = False
    batch_size: int = DEFAULT_BATCH_SIZE
    max_length: int = DEFAULT_MAX_LENGTH
    label_column: str | None = None
    test_num: int | None = None
    mauve_bootstrap: int = 0
    real_max_tokens: int | None = None
    metrics_explicit: bool = field(default=True, repr=False)


def _load_error(spec: str, exc: BaseException) -> str:
    if spec == "default":  # built to load everywhere: a failure is a defect to report
        from ..models.errors import load_failure_message

        return load_failure_message("--model", spec, exc)
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return first if first.startswith("model not found") else f"cannot load model {spec!r}: {first}"


class ScoringModels:
    """The scoring model and its tokenizer, loaded at most once and only as far as needed
    (perplexity needs the model, lengths only the tokenizer)."""

    def __init__(self, spec: Any, batch_size: int, max_length: int) -> None:
        self.spec = spec
        self.batch_size = batch_size
        self.max_length = max_length
        self._scorer: PerplexityScorer | None = None
        self._tokenizer: Any = None

    def check(self) -> None:
        """Fail early on a model path that does not exist."""
        if isinstance(self.spec, str) and self.spec != "default":
            path = Path(self.spec).expanduser()
            if not path.exists():
                raise FileNotFoundError(
                    f"model not found: {self.spec!r} is not 'default', a model folder or a "
                    ".gguf file"
                )

    @property
    def scorer(self) -> PerplexityScorer:
        if self._scorer is None:
            model = self.spec
            if isinstance(model, str):
                from dplang.models import resolve_model

                try:
                    model = resolve_model(model, check_invariance=False)  # scoring releases nothing
                except (OSError, ValueError) as exc:
                    raise FileNotFoundError(_load_error(self.spec, exc)) from exc
            self._scorer = PerplexityScorer(
                model, batch_size=self.batch_size, max_length=self.max_length
            )
        return self._scorer

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            if self._scorer is not None:
                self._tokenizer = self._scorer.tokenizer
            elif not isinstance(self.spec, str):
                self._tokenizer = self.spec.tokenizer
            else:
                try:
                    self._tokenizer = load_tokenizer(self.spec)
                except (OSError, ValueError) as exc:
                    raise FileNotFoundError(_load_error(self.spec, exc)) from exc
        return self._tokenizer


class RealSideCache:
    """Real-side results (embeddings, perplexities) kept across evaluations in one process: a
    sweep scores every cell against the same held-out texts. A key holds the model or embedder
    identity and the number and SHA-256 of the exact texts, so a hit is the same computation;
    the oldest entry goes when ``size`` are held."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._store: dict[tuple[Any, ...], Any] = {}

    def get(self, key: tuple[Any, ...], texts: Sequence[str], compute: Callable[[], Any]) -> Any:
        digest = hashlib.sha256("\x00".join(texts).encode("utf-8")).hexdigest()
        full = (*key, len(texts), digest)
        if full not in self._store:
            if len(self._store) >= self.size:
                self._store.pop(next(iter(self._store)))
            self._store[full] = compute()
        return self._store[full]

    def clear(self) -> None:
        self._store.clear()


#: The process's real-side cache (``evaluate_runs`` uses it unless given another).
REAL_SIDE_CACHE = RealSideCache()


@dataclass
class MetricContext:
    """The aligned inputs of one evaluation and the resources metrics share.

    ``real`` and every run hold the same number ``n`` of texts. ``warn`` appends to the
    result's warnings, ``say`` reports progress; ``embedder`` and ``models`` (the scoring model
    and tokenizer) are loaded at most once, on first use; ``cache`` keeps real-side results.

    ``read_real(limit, label_columns)`` reads the first ``limit`` (``None``: all) held-out rows
    of the real file again, by the same rules as ``real`` (blank rows skipped, reference rows
    refused or skipped), with the values of public label columns: for a metric that needs
    more held-out rows than ``n`` or their labels (``downstream``). It is ``None`` when the
    real texts were given in memory. ``shared`` is the evaluation's scratch space: what a
    metric's ``prepare`` read, for its ``compute``."""

    real: RealTexts
    runs: Sequence[SyntheticRun]
    n: int
    settings: EvaluationSettings
    models: ScoringModels
    cache: RealSideCache
    warn: Callable[[str], None]
    say: Callable[[str], None]
    read_real: Callable[[int | None, Sequence[str]], RealTexts] | None = None
    shared: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def embedder(self) -> Embedder:
        from dplang.evaluation.embedders import resolve_embedder

        return resolve_embedder(self.settings.embedder)

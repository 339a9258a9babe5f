"""Evaluation of synthetic texts: MAUVE, perplexity / ΔPPL, lengths, Top-k+ statistics,
99% Wald confidence intervals, reports and plots (the InvisibleInk paper's metrics, Vinod et
al., §4.5; ``docs/evaluation.md``).

Entry point: :func:`evaluate_files` (what ``dplang evaluate`` calls). Each metric is a
registered :class:`MetricSpec` (:mod:`~dplang.evaluation.registry`; the built-ins in
:mod:`~dplang.evaluation.metrics`) and the harness only loops over them: a new metric is one
:func:`register_metric` call. Building blocks:

* :mod:`~dplang.evaluation.data` — reading real and synthetic inputs, held-out checks, sizes;
* :mod:`~dplang.evaluation.embedders` — sentence embedders (offline default: all-MiniLM-L6-v2);
* :mod:`~dplang.evaluation.mauve_metric` — MAUVE with the paper's settings;
* :mod:`~dplang.evaluation.perplexity` — perplexity and ΔPPL under a causal LM;
* :mod:`~dplang.evaluation.lengths` — token lengths and Top-k+ statistics;
* :mod:`~dplang.evaluation.stats` — Wald intervals;
* :mod:`~dplang.evaluation.report` / :mod:`~dplang.evaluation.plots` — files;
* :mod:`~dplang.evaluation.downstream` — the opt-in ``downstream`` metric (train on synthetic,
  test on real);
* :mod:`~dplang.evaluation.canaries` — canaries: placement, counting, the bounds (the run
  that generates with and without them is :mod:`dplang.experiments.canary_run`, since
  ``evaluation`` does not import ``textgen``).

``import dplang.evaluation`` is cheap: submodules load on first attribute access.

Privacy contract, for the whole package: evaluation is not a private release and states no
guarantee. It reads held-out real texts and released synthetic texts, and its outputs
(``metrics.json`` holds per-text values of the real texts) are as sensitive as the real file:
the data holder's, never to be published as if private (``docs/evaluation.md``, "Caveats").
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dplang.evaluation.data import (
        EvaluationError,
        RealTexts,
        SyntheticRun,
        align_sizes,
        load_real,
        load_synthetic,
    )
    from dplang.evaluation.embedders import (
        Embedder,
        HashingEmbedder,
        SentenceTransformerEmbedder,
        resolve_embedder,
    )
    from dplang.evaluation.harness import (
        ALL_METRICS,
        EvaluationSettings,
        evaluate_files,
        evaluate_runs,
        evaluate_texts,
        parse_metrics,
    )
    from dplang.evaluation.lengths import (
        TopkStats,
        load_tokenizer,
        token_lengths,
        topk_statistics,
    )
    from dplang.evaluation.mauve_metric import (
        MauveResult,
        default_num_buckets,
        mauve_from_features,
        mauve_score,
    )
    from dplang.evaluation.perplexity import (
        DeltaPPL,
        PerplexityResult,
        PerplexityScorer,
        delta_ppl,
        perplexities,
    )
    from dplang.evaluation.registry import (
        MetricContext,
        MetricOutput,
        MetricSpec,
        RunValue,
        get_metric,
        metric_names,
        register_metric,
    )
    from dplang.evaluation.report import render_markdown, write_outputs
    from dplang.evaluation.stats import Z_99, Interval, difference_interval, wald_interval

_LAZY: dict[str, str] = {
    **dict.fromkeys(
        ["EvaluationError", "RealTexts", "SyntheticRun", "align_sizes", "load_real",
         "load_synthetic"], "data"),
    **dict.fromkeys(
        ["Embedder", "HashingEmbedder", "SentenceTransformerEmbedder", "resolve_embedder"],
        "embedders"),
    **dict.fromkeys(
        ["ALL_METRICS", "EvaluationSettings", "evaluate_files", "evaluate_runs",
         "evaluate_texts", "parse_metrics"], "harness"),
    **dict.fromkeys(["TopkStats", "load_tokenizer", "token_lengths", "topk_statistics"],
                    "lengths"),
    **dict.fromkeys(["MauveResult", "default_num_buckets", "mauve_from_features", "mauve_score"],
                    "mauve_metric"),
    **dict.fromkeys(["DeltaPPL", "PerplexityResult", "PerplexityScorer", "delta_ppl",
                     "perplexities"], "perplexity"),
    **dict.fromkeys(["MetricContext", "MetricOutput", "MetricSpec", "RunValue", "get_metric",
                     "metric_names", "register_metric"], "registry"),
    **dict.fromkeys(["render_markdown", "write_outputs"], "report"),
    **dict.fromkeys(["Z_99", "Interval", "difference_interval", "wald_interval"], "stats"),
}

__all__ = [
    "ALL_METRICS",
    "Z_99",
    "DeltaPPL",
    "Embedder",
    "EvaluationError",
    "EvaluationSettings",
    "HashingEmbedder",
    "Interval",
    "MauveResult",
    "MetricContext",
    "MetricOutput",
    "MetricSpec",
    "PerplexityResult",
    "PerplexityScorer",
    "RealTexts",
    "RunValue",
    "SentenceTransformerEmbedder",
    "SyntheticRun",
    "TopkStats",
    "align_sizes",
    "default_num_buckets",
    "delta_ppl",
    "difference_interval",
    "evaluate_files",
    "evaluate_runs",
    "evaluate_texts",
    "get_metric",
    "load_real",
    "load_synthetic",
    "load_tokenizer",
    "mauve_from_features",
    "mauve_score",
    "metric_names",
    "parse_metrics",
    "perplexities",
    "register_metric",
    "render_markdown",
    "resolve_embedder",
    "token_lengths",
    "topk_statistics",
    "wald_interval",
    "write_outputs",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(f"dplang.evaluation.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'dplang.evaluation' has no attribute {name!r}")

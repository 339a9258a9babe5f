"""The evaluation harness: held-out real texts vs one or more synthetic runs → a metrics dict.

:func:`evaluate_files` is what ``dplang evaluate`` and the experiment runner call. It reads the
inputs (:mod:`dplang.evaluation.data`), aligns their sizes, computes the requested metrics for
every synthetic run, aggregates per-run values over runs (seeds) with 99% Wald intervals and,
given ``out_dir``, writes ``metrics.json``, ``report.md`` and PNG plots
(:mod:`dplang.evaluation.report`).

The metrics themselves are registered specs (:mod:`dplang.evaluation.registry`; the built-ins in
:mod:`dplang.evaluation.metrics`): :func:`evaluate_runs` only loops over them, so a new metric
is one module calling :func:`~dplang.evaluation.registry.register_metric`.

Intervals: per-text metrics (perplexity, length, Top-k+ statistics) carry an interval over the
``n`` texts of their run; the ``aggregate`` section carries, for every per-run value (MAUVE,
ΔPPL, mean PPL, mean length, effective k, expansion tokens), an interval over the runs
(undefined, ``None``, with a single run).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from dplang import __version__
from dplang.evaluation.context import (
    REAL_SIDE_CACHE,
    EvaluationSettings,
    MetricContext,
    RealSideCache,
    ScoringModels,
)
from dplang.evaluation.data import (
    EvaluationError,
    RealTexts,
    SyntheticRun,
    align_sizes,
    load_real,
    load_synthetic,
)
from dplang.evaluation.embedders import Embedder
from dplang.evaluation.mauve_metric import DEFAULT_MAUVE_SEED
from dplang.evaluation.registry import (
    MetricSpec,
    default_metrics,
    get_metric,
    metric_names,
    resolve_metric_name,
    settings_problem,
)
from dplang.evaluation.stats import Z_99, wald_interval

__all__ = [
    "EvaluationSettings",
    "cut_texts",
    "evaluate_files",
    "evaluate_runs",
    "evaluate_texts",
    "parse_metrics",
]

#: Manifest keys copied into the report for every run.
_MANIFEST_KEYS = ("epsilon", "delta", "rho", "clip", "adjacency")
_PARAM_KEYS = ("top_k", "batch_size", "max_tokens", "temperature", "model", "data", "prompt")


def __getattr__(name: str) -> Any:  # PEP 562
    """``ALL_METRICS``, kept for earlier imports: the registry's default metrics (the names
    themselves exist only in the registry, :mod:`dplang.evaluation.registry`)."""
    if name == "ALL_METRICS":
        return default_metrics()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def parse_metrics(spec: str | Sequence[str] | None) -> tuple[str, ...]:
    """Metric names from ``"mauve,perplexity,length,topk"`` (aliases: ``ppl``, ``lengths``,
    ``top-k``), in registry order; ``None`` means the default metrics (the four built-ins).
    Unknown names raise :class:`EvaluationError`."""
    if spec is None:
        return default_metrics()
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    chosen: list[str] = []
    for item in items:
        if not item.strip():
            continue
        name = resolve_metric_name(item)
        if name is None:
            raise EvaluationError(
                f"unknown metric {item.strip()!r}; choose from {', '.join(metric_names())}"
            )
        if name not in chosen:
            chosen.append(name)
    if not chosen:
        raise EvaluationError("no metric given")
    return tuple(m for m in metric_names() if m in chosen)


def cut_texts(texts: Sequence[str], tokenizer: Any, max_tokens: int) -> list[str]:
    """Each text cut to its first ``max_tokens`` tokens of ``tokenizer`` (no special tokens),
    decoded back; a text that is not longer is returned unchanged. Per text: one text's cut
    never depends on the others."""
    out = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        out.append(text if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens]))
    return out


def _cut_real(real: RealTexts, settings: EvaluationSettings, models: ScoringModels
              ) -> RealTexts:
    if settings.real_max_tokens is None:
        return real
    return replace(real, texts=cut_texts(real.texts, models.tokenizer, settings.real_max_tokens))


def _manifest_summary(run: SyntheticRun) -> dict[str, Any] | None:
    if run.manifest is None:
        return None
    out = {k: run.manifest.get(k) for k in _MANIFEST_KEYS if k in run.manifest}
    params = run.parameters
    out.update({k: params.get(k) for k in _PARAM_KEYS if k in params})
    return out


def evaluate_runs(
    real: RealTexts,
    runs: Sequence[SyntheticRun],
    settings: EvaluationSettings,
    *,
    progress: Callable[[str], None] | None = None,
    cache: RealSideCache | None = None,
    read_real: Callable[[int | None, Sequence[str]], RealTexts] | None = None,
) -> dict[str, Any]:
    """Compute the metrics of already loaded inputs; see :func:`evaluate_files`.

    The loop: each metric's ``select`` (skip or refuse it for these runs), alignment of the
    sizes, each metric's ``prepare`` (fail before any slow work), the inputs' description,
    then each metric's ``compute`` and the aggregation of its per-run values over runs.
    ``cache`` keeps real-side results (default: the process's
    :data:`~dplang.evaluation.registry.REAL_SIDE_CACHE`); ``read_real`` re-reads more held-out
    rows with labels (:class:`~dplang.evaluation.registry.MetricContext`; ``None`` for texts
    in memory)."""
    say = progress or (lambda message: None)
    warnings: list[str] = []
    names = settings.metrics if settings.metrics is not None else default_metrics()
    specs = [get_metric(name) for name in names]
    for spec in list(specs):
        skip = spec.select(runs, settings.metrics_explicit) if spec.select else None
        if skip is not None:
            specs.remove(spec)
            warnings.append(skip)

    n_before = (len(real.texts), [len(r.texts) for r in runs])
    n, real, runs = align_sizes(real, runs, settings.num)
    if settings.num is None and (n_before[0] != n or any(k != n for k in n_before[1])):
        sizes = ", ".join(f"{k} in {r.name}" for k, r in zip(n_before[1], runs, strict=True))
        more = "" if real.exhausted else " or more"
        warnings.append(
            f"unequal sizes ({n_before[0]}{more} real texts, {sizes}): the first n = {n} of each "
            "are used"
        )
    if real.is_generation_data:
        how = (f"{real.excluded_references} reference rows were skipped"
               if settings.exclude_references else "no selected row was a reference")
        warnings.append(
            f"the real file is the data file of {', '.join(real.is_generation_data)}; {how}"
        )
    ctx = MetricContext(real, runs, n, settings,
                        ScoringModels(settings.model, settings.batch_size, settings.max_length),
                        cache if cache is not None else REAL_SIDE_CACHE, warnings.append, say,
                        read_real)
    for spec in specs:
        if spec.prepare is not None:
            spec.prepare(ctx)

    result: dict[str, Any] = {
        "dplang_version": __version__,
        "settings": {
            "metrics": [spec.name for spec in specs],
            "n": n,
            "confidence": 0.99,
            "z": Z_99,
            "seed": settings.seed,
            "text_column": settings.text_column,
            "selection": "first n texts of each input: real in file order (blank rows skipped), "
                         "synthetic in group order",
            "real_max_tokens": settings.real_max_tokens,
        },
        "real": {
            "path": str(real.path),
            "sha256": real.sha256,
            "n": n,
            "rows_seen": real.stats.rows_seen,
            "blank_rows_skipped": real.stats.unusable,
            "excluded_references": real.excluded_references,
            "read_whole_file": real.exhausted,
        },
        "runs": [],
        "aggregate": {},
        "warnings": warnings,
    }
    for run, total in zip(runs, n_before[1], strict=True):
        if run.repeated_lines:
            warnings.append(f"{run.name}: {run.repeated_lines} line(s) repeated a group's "
                            "generation exactly and were read once (a resumed run of an older "
                            "dplang appends its rerun)")
        empty = sum(1 for t in run.texts if not t.strip())
        if empty:
            warnings.append(f"{run.name}: {empty} of {n} synthetic texts are empty (kept)")
        result["runs"].append({
            "name": run.name,
            "path": str(run.path),
            "sha256": run.sha256,
            "n": n,
            "generations_in_file": total,
            "repeated_lines": run.repeated_lines,
            "empty_texts": empty,
            "manifest": _manifest_summary(run),
        })

    for spec in specs:
        output = spec.compute(ctx)
        if len(output.runs) != len(runs):
            raise RuntimeError(f"metric {spec.name!r} returned {len(output.runs)} run entries "
                               f"for {len(runs)} runs")
        if output.settings is not None:
            result["settings"][spec.name] = output.settings
        if output.real is not None:
            result["real"][spec.name] = output.real
        for entry, value in zip(result["runs"], output.runs, strict=True):
            entry[spec.name] = value

    differing = _differing_configurations(runs)
    if differing:  # a mean over runs is a mean over seeds of one configuration, or nothing
        warnings.append("no mean over runs: the runs are not seeds of one configuration "
                        f"({differing}); each is reported on its own")
    else:
        result["aggregate"] = _aggregate(result["runs"], specs)
    return result


def _differing_configurations(runs: Sequence[Any]) -> str:
    """What differs between the runs' public fingerprints (their configurations; a seed is
    never in one), as ``field: a → b`` for the first difference, or "" when they are the
    same configuration or a run has no manifest to tell."""
    from ..textgen.resume import differences

    prints = [((run.manifest or {}).get("fingerprint")) for run in runs]
    if len(prints) < 2 or any(not isinstance(p, dict) for p in prints):
        return ""
    for other in prints[1:]:
        diff = differences(prints[0], other)
        if diff:
            return diff[0] + (f"; and {len(diff) - 1} more" if len(diff) > 1 else "")
    return ""


def _aggregate(runs: list[dict[str, Any]], specs: Sequence[MetricSpec]) -> dict[str, Any]:
    """Interval over runs (seeds) of every per-run value of every metric."""
    out: dict[str, Any] = {}
    for spec in specs:
        for value in spec.aggregate:
            values = [value.value(r.get(spec.name)) for r in runs]
            if values and all(v is not None for v in values):
                out[value.key] = wald_interval(values).to_dict()
    return out


def evaluate_files(
    real: str | Path,
    synthetic: str | Path | Sequence[str | Path],
    *,
    metrics: str | Sequence[str] | None = None,
    embedder: str | Embedder = "default",
    model: Any = "default",
    num: int | None = None,
    seed: int = DEFAULT_MAUVE_SEED,
    num_buckets: int | None = None,
    text_column: str = "text",
    exclude_references: bool = False,
    out_dir: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
    label_column: str | None = None,
    test_num: int | None = None,
    mauve_bootstrap: int = 0,
    real_max_tokens: int | None = None,
) -> dict[str, Any]:
    """Evaluate synthetic runs against held-out real texts.

    Args:
        real: held-out real texts (CSV, TSV, JSONL, Parquet or text; column ``text_column``).
        synthetic: one or more ``dplang generate`` outputs (one per seed / run).
        metrics: registered metric names: ``mauve, perplexity, length, topk``, the opt-in
            ``downstream`` and any added with
            :func:`~dplang.evaluation.registry.register_metric` (``None``: the default ones,
            the four built-ins; Top-k+ is then skipped with a warning for runs that carry no
            statistics).
        embedder: MAUVE embedder (``"default"``, ``"hashing"``, a folder, or an object).
        model: perplexity / tokenizer model (``"default"``, a path, or a loaded model).
        num: texts per side (default: as many as every input provides).
        seed: MAUVE seed.
        num_buckets: MAUVE buckets (default ``max(2, n // 20)``).
        text_column: column of ``real`` holding the text.
        exclude_references: see :func:`dplang.evaluation.data.load_real`.
        out_dir: when given, ``metrics.json``, ``report.md`` and plots are written there.
        progress: called with short progress messages.
        label_column: ``downstream`` only (required there): the public label column, read
            from each generation's ``labels`` and from the real file.
        test_num: ``downstream`` only: held-out test rows after the ``n`` real texts that
            train the ceiling (default: all the rest).
        mauve_bootstrap: ``mauve`` only: bootstrap resamples of the texts for a 95% interval
            of each run's MAUVE (0: no interval; each resample is one MAUVE computation).
        real_max_tokens: cut every held-out real text to its first this-many tokens of
            ``model``'s tokenizer before any metric sees it (default: whole texts); for
            generations capped at T tokens, ``T`` compares like with like.

    Returns:
        The metrics dict (also written as ``metrics.json``): ``settings``, ``real``, ``runs``
        (one entry per synthetic file with ``mauve``, ``perplexity``, ``length``, ``topk``),
        ``aggregate`` (intervals over runs) and ``warnings``.

    Raises:
        EvaluationError: bad input (one-line message).
        FileNotFoundError: a model or embedder that does not exist or cannot be loaded.
    """
    chosen = parse_metrics(metrics)
    problem = settings_problem(chosen, {"label_column": label_column, "test_num": test_num,
                                        "mauve_bootstrap": mauve_bootstrap or None},
                               required=False)
    if problem is not None:
        raise EvaluationError(problem)
    settings = EvaluationSettings(
        metrics=chosen, embedder=embedder, model=model, num=num, seed=seed,
        num_buckets=num_buckets, text_column=text_column,
        exclude_references=exclude_references, label_column=label_column, test_num=test_num,
        mauve_bootstrap=mauve_bootstrap, real_max_tokens=real_max_tokens,
        metrics_explicit=metrics is not None,
    )
    paths = [synthetic] if isinstance(synthetic, (str, Path)) else list(synthetic)
    if not paths:
        raise EvaluationError("no synthetic file given")
    if len({Path(p).resolve() for p in paths}) != len(paths):
        raise EvaluationError("the same synthetic file is given twice")
    if num is not None and num < 1:
        raise EvaluationError(f"--num must be at least 1, got {num}")
    if real_max_tokens is not None and real_max_tokens < 1:
        raise EvaluationError(f"--real-max-tokens must be at least 1, got {real_max_tokens}")
    # Fail fast on paths before any slow work.
    for name in chosen:
        spec = get_metric(name)
        if spec.preflight is not None:
            spec.preflight(settings)
    runs = [load_synthetic(p) for p in paths]
    if len({r.path.name for r in runs}) != len(runs):  # e.g. seed1/gen.jsonl, seed2/gen.jsonl
        for r in runs:
            r.label = f"{r.path.parent.name}/{r.path.name}"
        if len({r.name for r in runs}) != len(runs):
            for r in runs:
                r.label = str(r.path)
    limit = num if num is not None else min(len(r.texts) for r in runs)
    models = ScoringModels(model, settings.batch_size, settings.max_length)
    if real_max_tokens is not None:
        models.check()
    real_texts = _cut_real(load_real(real, runs, text_column=text_column, limit=limit,
                                     exclude_references=exclude_references), settings, models)

    def read_real(limit: int | None, label_columns: Sequence[str]) -> RealTexts:
        return _cut_real(load_real(real, runs, text_column=text_column, limit=limit,
                                   exclude_references=exclude_references,
                                   label_columns=label_columns), settings, models)

    result = evaluate_runs(real_texts, runs, settings, progress=progress, read_real=read_real)
    if out_dir is not None:
        from dplang.evaluation.report import write_outputs

        write_outputs(result, out_dir)
    return result


def evaluate_texts(
    real: Sequence[str],
    synthetic: Sequence[Sequence[str] | Sequence[dict[str, Any]]],
    *,
    names: Sequence[str] | None = None,
    metrics: str | Sequence[str] | None = ("mauve", "perplexity", "length"),
    embedder: str | Embedder = "default",
    model: Any = "default",
    num: int | None = None,
    seed: int = DEFAULT_MAUVE_SEED,
    num_buckets: int | None = None,
    out_dir: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
    mauve_bootstrap: int = 0,
) -> dict[str, Any]:
    """:func:`evaluate_files` for texts in memory.

    ``real`` are held-out texts (the caller vouches that they are not references);
    ``synthetic`` is a list of runs, each a list of texts or of generation records (dicts with
    ``text`` and, for the ``topk`` metric, ``topk_plus_mean`` / ``expansion_tokens``).
    Run ``i`` is called ``names[i]`` (default ``run0``, ``run1``, ...). Synthetic lengths are
    always counted with ``model``'s tokenizer (there is no manifest to tell the generating
    model)."""
    from dplang.io import ReadStats

    if not synthetic or isinstance(synthetic, str) or isinstance(synthetic[0], str):
        raise EvaluationError("synthetic must be a list of runs (each a list of texts)")
    labels = list(names) if names is not None else [f"run{i}" for i in range(len(synthetic))]
    if len(labels) != len(synthetic):
        raise EvaluationError("names must have one entry per synthetic run")
    runs: list[SyntheticRun] = []
    for label, items in zip(labels, synthetic, strict=True):
        records = [dict(x) if isinstance(x, dict) else {"text": str(x)} for x in items]
        for record in records:
            record["text"] = record.get("text") or ""
        if not records or all(not r["text"].strip() for r in records):
            raise EvaluationError(f"{label}: no non-empty synthetic text")
        runs.append(SyntheticRun(Path(label), [r["text"] for r in records], records, None,
                                 "in-memory"))
    kept = [t for t in real if t and t.strip()]
    if not kept:
        raise EvaluationError("no non-empty real text")
    stats = ReadStats(rows_seen=len(real), used=len(kept))
    if len(kept) != len(real):
        stats.skipped_by_reason["blank"] = len(real) - len(kept)
    real_texts = RealTexts(Path("<memory>"), kept, list(range(len(kept))), stats, "in-memory")
    chosen = parse_metrics(metrics)
    problem = settings_problem(chosen, {"mauve_bootstrap": mauve_bootstrap or None},
                               required=False)
    if problem is not None:
        raise EvaluationError(problem)
    settings = EvaluationSettings(
        metrics=chosen, embedder=embedder, model=model, num=num, seed=seed,
        num_buckets=num_buckets, mauve_bootstrap=mauve_bootstrap,
        metrics_explicit=metrics is not None,
    )
    result = evaluate_runs(real_texts, runs, settings, progress=progress)
    if out_dir is not None:
        from dplang.evaluation.report import write_outputs

        write_outputs(result, out_dir)
    return result

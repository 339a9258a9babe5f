"""The evaluation harness: held-out real texts vs one or more synthetic runs → a metrics dict.

:func:`evaluate_files` is what ``dplang evaluate`` and the experiment runner call. It reads the
inputs (:mod:`dplang.evaluation.data`), aligns their sizes, computes the requested metrics for
every synthetic run, aggregates per-run values over runs (seeds) with 99% Wald intervals and,
given ``out_dir``, writes ``metrics.json``, ``report.md`` and PNG plots
(:mod:`dplang.evaluation.report`).

Intervals: per-text metrics (perplexity, length, Top-k+ statistics) carry an interval over the
``n`` texts of their run; the ``aggregate`` section carries, for every per-run value (MAUVE,
ΔPPL, mean PPL, mean length, effective k, expansion tokens), an interval over the runs
(undefined, ``None``, with a single run).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dplang import __version__
from dplang.evaluation.data import (
    EvaluationError,
    RealTexts,
    SyntheticRun,
    align_sizes,
    load_real,
    load_synthetic,
)
from dplang.evaluation.embedders import Embedder, resolve_embedder
from dplang.evaluation.lengths import load_tokenizer, token_lengths, topk_statistics
from dplang.evaluation.mauve_metric import (
    DEFAULT_MAUVE_SEED,
    SCALING_FACTOR,
    check_mauve_sizes,
    default_num_buckets,
    mauve_from_features,
)
from dplang.evaluation.perplexity import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_LENGTH,
    PerplexityScorer,
    delta_ppl,
)
from dplang.evaluation.stats import Z_99, wald_interval

__all__ = [
    "ALL_METRICS",
    "EvaluationSettings",
    "evaluate_files",
    "evaluate_runs",
    "evaluate_texts",
    "parse_metrics",
]

#: Metric names, in report order.
ALL_METRICS: tuple[str, ...] = ("mauve", "perplexity", "length", "topk")
_ALIASES = {"ppl": "perplexity", "lengths": "length", "top-k": "topk", "topk+": "topk"}
#: Manifest keys copied into the report for every run.
_MANIFEST_KEYS = ("epsilon", "delta", "rho", "clip", "adjacency")
_PARAM_KEYS = ("top_k", "batch_size", "max_tokens", "temperature", "model", "data", "prompt")


def parse_metrics(spec: str | Sequence[str] | None) -> tuple[str, ...]:
    """Metric names from ``"mauve,perplexity,length,topk"`` (aliases: ``ppl``, ``lengths``,
    ``top-k``); ``None`` means all. Unknown names raise :class:`EvaluationError`."""
    if spec is None:
        return ALL_METRICS
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    chosen: list[str] = []
    for item in items:
        name = item.strip().lower()
        if not name:
            continue
        name = _ALIASES.get(name, name)
        if name not in ALL_METRICS:
            raise EvaluationError(
                f"unknown metric {item.strip()!r}; choose from {', '.join(ALL_METRICS)}"
            )
        if name not in chosen:
            chosen.append(name)
    if not chosen:
        raise EvaluationError("no metric given")
    return tuple(m for m in ALL_METRICS if m in chosen)


@dataclass
class EvaluationSettings:
    """Everything that determines an evaluation (recorded in ``metrics.json``).

    Attributes:
        metrics: metric names (see :data:`ALL_METRICS`).
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
    """

    metrics: tuple[str, ...] = ALL_METRICS
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
    metrics_explicit: bool = field(default=True, repr=False)


def _model_name(model: Any) -> str:
    return model if isinstance(model, str) else str(getattr(model, "model_id", model))


def _same_model(run: SyntheticRun, model: Any) -> bool:
    """Whether ``run`` was generated with ``model`` (so its ``num_tokens`` are ``model``'s)."""
    recorded = run.parameters.get("model")
    if recorded is None:
        return False
    if not isinstance(model, str):
        fp = (run.manifest or {}).get("fingerprint") or {}
        return fp.get("model_id") == getattr(model, "model_id", None)
    if recorded == model:
        return True
    if "default" in (recorded, model):
        return False
    try:
        return Path(recorded).expanduser().resolve() == Path(model).expanduser().resolve()
    except OSError:
        return False


def _load_error(spec: str, exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return first if first.startswith("model not found") else f"cannot load model {spec!r}: {first}"


class _Models:
    """Loads the scoring model / tokenizer at most once, and only as much as needed."""

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
                    model = resolve_model(model)
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


def _manifest_summary(run: SyntheticRun) -> dict[str, Any] | None:
    if run.manifest is None:
        return None
    out = {k: run.manifest.get(k) for k in _MANIFEST_KEYS if k in run.manifest}
    params = run.parameters
    out.update({k: params.get(k) for k in _PARAM_KEYS if k in params})
    return out


def _floats(values: np.ndarray) -> list[float | None]:
    return [None if math.isnan(float(v)) else float(v) for v in values]


#: Real-side results (embeddings, perplexities) memoised within a process: a sweep evaluates
#: every cell against the same held-out texts. Keys hold the model / embedder id and a digest
#: of the exact texts, so a hit is the same computation.
_REAL_MEMO: dict[tuple[Any, ...], Any] = {}
_REAL_MEMO_SIZE = 8


def _memo_real(key: tuple[Any, ...], texts: Sequence[str], compute: Callable[[], Any]) -> Any:
    digest = hashlib.sha256("\x00".join(texts).encode("utf-8")).hexdigest()
    full = (*key, len(texts), digest)
    if full not in _REAL_MEMO:
        if len(_REAL_MEMO) >= _REAL_MEMO_SIZE:
            _REAL_MEMO.pop(next(iter(_REAL_MEMO)))
        _REAL_MEMO[full] = compute()
    return _REAL_MEMO[full]


def evaluate_runs(
    real: RealTexts,
    runs: Sequence[SyntheticRun],
    settings: EvaluationSettings,
    *,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Compute the metrics of already loaded inputs; see :func:`evaluate_files`."""
    say = progress or (lambda message: None)
    warnings: list[str] = []
    metrics = list(settings.metrics)

    if "topk" in metrics:
        missing = [r.name for r in runs if not r.has_field("topk_plus_mean")]
        if missing and not settings.metrics_explicit:
            metrics.remove("topk")
            warnings.append(f"Top-k+ statistics skipped: {', '.join(missing)} carry none")
        elif missing:
            raise EvaluationError(
                f"{missing[0]}: no Top-k+ statistics (not a dplang generate output?); "
                "leave 'topk' out of --metrics"
            )

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
    embedder: Embedder | None = None
    buckets = None
    if "mauve" in metrics:
        embedder = resolve_embedder(settings.embedder)
        buckets = settings.num_buckets if settings.num_buckets is not None else (
            default_num_buckets(n))
        check_mauve_sizes(n, n, buckets)
    models = _Models(settings.model, settings.batch_size, settings.max_length)
    if "perplexity" in metrics or "length" in metrics:
        models.check()

    result: dict[str, Any] = {
        "dplang_version": __version__,
        "settings": {
            "metrics": metrics,
            "n": n,
            "confidence": 0.99,
            "z": Z_99,
            "seed": settings.seed,
            "text_column": settings.text_column,
            "selection": "first n texts of each input: real in file order (blank rows skipped), "
                         "synthetic in group order",
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
        empty = sum(1 for t in run.texts if not t.strip())
        if empty:
            warnings.append(f"{run.name}: {empty} of {n} synthetic texts are empty (kept)")
        result["runs"].append({
            "name": run.name,
            "path": str(run.path),
            "sha256": run.sha256,
            "n": n,
            "generations_in_file": total,
            "empty_texts": empty,
            "manifest": _manifest_summary(run),
        })

    # ------------------------------------------------------------------ MAUVE
    if "mauve" in metrics:
        assert embedder is not None
        say(f"MAUVE: embedding {n} real texts with {embedder.name}")
        real_features = _memo_real(("embed", embedder.name, embedder.max_tokens), real.texts,
                                   lambda: embedder.embed(real.texts))
        result["settings"]["mauve"] = {
            "embedder": embedder.name,
            "max_tokens": embedder.max_tokens,
            "num_buckets": buckets,
            "scaling_factor": settings.scaling_factor,
            "seed": settings.seed,
            "p": "real (held-out)",
            "q": "synthetic",
        }
        for entry, run in zip(result["runs"], runs, strict=True):
            say(f"MAUVE: {run.name}")
            res = mauve_from_features(
                real_features, embedder.embed(run.texts), num_buckets=buckets,
                scaling_factor=settings.scaling_factor, seed=settings.seed,
            )
            entry["mauve"] = res.to_dict()

    # ------------------------------------------------------------------ perplexity
    if "perplexity" in metrics:
        scorer = models.scorer
        say(f"perplexity: scoring {n} real texts with {scorer.model_id}")
        # keyed on the model object itself (alive while memoised), not on its name: two
        # loads of one model in different dtypes score differently
        real_ppl = _memo_real(("ppl", scorer.model, settings.max_length),
                              real.texts, lambda: scorer.score(real.texts))
        if real_ppl.scored.size == 0:
            raise EvaluationError("perplexity: no real text has a token")
        result["settings"]["perplexity"] = {
            "model": scorer.model_id,
            "max_length": settings.max_length,
            "batch_size": settings.batch_size,
            "bos_prepended": True,
        }
        result["real"]["perplexity"] = {
            "mean": real_ppl.interval().to_dict(),
            "empty": real_ppl.empty,
            "truncated": real_ppl.truncated,
            "per_text": _floats(real_ppl.values),
        }
        for entry, run in zip(result["runs"], runs, strict=True):
            say(f"perplexity: {run.name}")
            syn = scorer.score(run.texts)
            if syn.scored.size == 0:
                raise EvaluationError(f"{run.name}: perplexity: no synthetic text has a token")
            d = delta_ppl(syn, real_ppl)
            entry["perplexity"] = {
                "mean": syn.interval().to_dict(),
                "empty": syn.empty,
                "truncated": syn.truncated,
                "per_text": _floats(syn.values),
                **d.to_dict(),
            }
            if syn.empty:
                warnings.append(f"{run.name}: {syn.empty} texts without tokens left out of the "
                                "perplexity")

    # ------------------------------------------------------------------ lengths
    if "length" in metrics:
        tokenizer = models.tokenizer
        say("lengths: counting tokens")
        real_len = token_lengths(real.texts, tokenizer)
        result["settings"]["length"] = {"tokenizer": _model_name(settings.model)}
        result["real"]["length"] = {
            "tokens": wald_interval(real_len).to_dict(),
            "per_text": [int(x) for x in real_len],
        }
        for entry, run in zip(result["runs"], runs, strict=True):
            if run.has_field("num_tokens") and _same_model(run, settings.model):
                lengths = np.array([int(r["num_tokens"]) for r in run.records], dtype=np.int64)
                source = "num_tokens (generation output)"
            else:
                lengths = token_lengths(run.texts, tokenizer)
                source = f"tokenizer of {_model_name(settings.model)}"
                if run.has_field("num_tokens"):
                    warnings.append(
                        f"{run.name}: generated with model {run.parameters.get('model')!r}, not "
                        f"{_model_name(settings.model)!r}; its lengths were re-counted with the "
                        "latter's tokenizer so that they compare with the real lengths"
                    )
            entry["length"] = {
                "tokens": wald_interval(lengths).to_dict(),
                "source": source,
                "per_text": [int(x) for x in lengths],
            }

    # ------------------------------------------------------------------ Top-k+
    if "topk" in metrics:
        for entry, run in zip(result["runs"], runs, strict=True):
            entry["topk"] = topk_statistics(run).to_dict()

    result["aggregate"] = _aggregate(result["runs"])
    return result


def _aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Interval over runs (seeds) of every per-run value."""
    getters: dict[str, Callable[[dict[str, Any]], Any]] = {
        "mauve": lambda r: r.get("mauve", {}).get("mauve"),
        "delta_ppl": lambda r: r.get("perplexity", {}).get("delta_ppl"),
        "ppl_synthetic": lambda r: r.get("perplexity", {}).get("mean", {}).get("mean"),
        "length_synthetic": lambda r: r.get("length", {}).get("tokens", {}).get("mean"),
        "effective_k": lambda r: r.get("topk", {}).get("effective_k", {}).get("mean"),
        "expansion_tokens": lambda r: r.get("topk", {}).get("expansion_tokens", {}).get("mean"),
    }
    out: dict[str, Any] = {}
    for name, get in getters.items():
        values = [get(r) for r in runs]
        if values and all(v is not None for v in values):
            out[name] = wald_interval(values).to_dict()
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
) -> dict[str, Any]:
    """Evaluate synthetic runs against held-out real texts.

    Args:
        real: held-out real texts (CSV, TSV, JSONL, Parquet or text; column ``text_column``).
        synthetic: one or more ``dplang generate`` outputs (one per seed / run).
        metrics: subset of ``mauve, perplexity, length, topk`` (``None``: all; Top-k+ is then
            skipped with a warning for runs that carry no statistics).
        embedder: MAUVE embedder (``"default"``, ``"hashing"``, a folder, or an object).
        model: perplexity / tokenizer model (``"default"``, a path, or a loaded model).
        num: texts per side (default: as many as every input provides).
        seed: MAUVE seed.
        num_buckets: MAUVE buckets (default ``max(2, n // 20)``).
        text_column: column of ``real`` holding the text.
        exclude_references: see :func:`dplang.evaluation.data.load_real`.
        out_dir: when given, ``metrics.json``, ``report.md`` and plots are written there.
        progress: called with short progress messages.

    Returns:
        The metrics dict (also written as ``metrics.json``): ``settings``, ``real``, ``runs``
        (one entry per synthetic file with ``mauve``, ``perplexity``, ``length``, ``topk``),
        ``aggregate`` (intervals over runs) and ``warnings``.

    Raises:
        EvaluationError: bad input (one-line message).
        FileNotFoundError: a model or embedder that does not exist or cannot be loaded.
    """
    chosen = parse_metrics(metrics)
    settings = EvaluationSettings(
        metrics=chosen, embedder=embedder, model=model, num=num, seed=seed,
        num_buckets=num_buckets, text_column=text_column,
        exclude_references=exclude_references, metrics_explicit=metrics is not None,
    )
    paths = [synthetic] if isinstance(synthetic, (str, Path)) else list(synthetic)
    if not paths:
        raise EvaluationError("no synthetic file given")
    if len({Path(p).resolve() for p in paths}) != len(paths):
        raise EvaluationError("the same synthetic file is given twice")
    if num is not None and num < 1:
        raise EvaluationError(f"--num must be at least 1, got {num}")
    # Fail fast on paths before any slow work.
    if "mauve" in chosen:
        resolve_embedder(embedder)
    if "perplexity" in chosen or "length" in chosen:
        _Models(model, DEFAULT_BATCH_SIZE, DEFAULT_MAX_LENGTH).check()
    runs = [load_synthetic(p) for p in paths]
    if len({r.path.name for r in runs}) != len(runs):  # e.g. seed1/gen.jsonl, seed2/gen.jsonl
        for r in runs:
            r.label = f"{r.path.parent.name}/{r.path.name}"
        if len({r.name for r in runs}) != len(runs):
            for r in runs:
                r.label = str(r.path)
    limit = num if num is not None else min(len(r.texts) for r in runs)
    real_texts = load_real(real, runs, text_column=text_column, limit=limit,
                           exclude_references=exclude_references)
    result = evaluate_runs(real_texts, runs, settings, progress=progress)
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
    settings = EvaluationSettings(
        metrics=parse_metrics(metrics), embedder=embedder, model=model, num=num, seed=seed,
        num_buckets=num_buckets, metrics_explicit=metrics is not None,
    )
    result = evaluate_runs(real_texts, runs, settings, progress=progress)
    if out_dir is not None:
        from dplang.evaluation.report import write_outputs

        write_outputs(result, out_dir)
    return result

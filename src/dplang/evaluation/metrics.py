"""The built-in metrics, one :class:`~dplang.evaluation.registry.MetricSpec` each: MAUVE,
perplexity / ΔPPL, lengths, Top-k+ statistics (the InvisibleInk paper's metrics, Vinod et al.,
§4.5 and Table 12; ``docs/evaluation.md``). Importing this module registers them, in this
order (the report order).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dplang.evaluation.context import ScoringModels
from dplang.evaluation.data import EvaluationError, SyntheticRun
from dplang.evaluation.lengths import token_lengths, topk_statistics
from dplang.evaluation.mauve_metric import (
    check_mauve_sizes,
    default_num_buckets,
    mauve_bootstrap,
    mauve_from_features,
)
from dplang.evaluation.perplexity import delta_ppl
from dplang.evaluation.registry import (
    MetricContext,
    MetricOutput,
    MetricSetting,
    MetricSpec,
    RunValue,
    SweepColumn,
    register_metric,
)
from dplang.evaluation.stats import wald_interval
from dplang.models.base import public_model_name

__all__ = ["LENGTH", "MAUVE", "PERPLEXITY", "TOPK", "ScoringModels"]


# ------------------------------------------------------------------------ shared resources


def _model_name(model: Any) -> str:
    return model if isinstance(model, str) else str(getattr(model, "model_id", model))


def _check_model(settings: Any) -> None:
    from dplang.evaluation.perplexity import DEFAULT_BATCH_SIZE, DEFAULT_MAX_LENGTH

    ScoringModels(settings.model, DEFAULT_BATCH_SIZE, DEFAULT_MAX_LENGTH).check()


def _floats(values: np.ndarray) -> list[float | None]:
    return [None if math.isnan(float(v)) else float(v) for v in values]


# ------------------------------------------------------------------------ MAUVE


def _mauve_buckets(ctx: MetricContext) -> int:
    given = ctx.settings.num_buckets
    return given if given is not None else default_num_buckets(ctx.n)


def _check_bootstrap(settings: Any) -> None:
    resamples = settings.mauve_bootstrap
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples == 1 \
            or resamples < 0:
        raise EvaluationError("--mauve-bootstrap must be 0 (no interval) or at least 2 "
                              f"resamples, got {resamples!r}")


def _mauve_preflight(settings: Any) -> None:
    from dplang.evaluation.embedders import resolve_embedder

    _check_bootstrap(settings)
    resolve_embedder(settings.embedder)


def _mauve_prepare(ctx: MetricContext) -> None:
    _check_bootstrap(ctx.settings)
    ctx.embedder  # noqa: B018  (resolve it now: a bad embedder fails before any work)
    check_mauve_sizes(ctx.n, ctx.n, _mauve_buckets(ctx))


def _mauve(ctx: MetricContext) -> MetricOutput:
    embedder, settings = ctx.embedder, ctx.settings
    buckets = _mauve_buckets(ctx)
    ctx.say(f"MAUVE: embedding {ctx.n} real texts with {embedder.name}")
    real_features = ctx.cache.get(("embed", embedder.name, embedder.max_tokens),
                                  ctx.real.texts, lambda: embedder.embed(ctx.real.texts))
    runs = []
    resamples = settings.mauve_bootstrap
    for run in ctx.runs:
        ctx.say(f"MAUVE: {run.name}")
        features = embedder.embed(run.texts)
        res = mauve_from_features(real_features, features, num_buckets=buckets,
                                  scaling_factor=settings.scaling_factor, seed=settings.seed)
        entry = res.to_dict()
        if resamples:
            ctx.say(f"MAUVE: {run.name}: {resamples} bootstrap resamples of the texts")
            interval = mauve_bootstrap(real_features, features, resamples=resamples,
                                       num_buckets=buckets,
                                       scaling_factor=settings.scaling_factor,
                                       seed=settings.seed).to_dict()
            entry.update({"low": interval["low"], "high": interval["high"],
                          "half_width": interval["half_width"], "bootstrap": interval})
        runs.append(entry)
    return MetricOutput(runs, settings={
        "embedder": embedder.name,
        "max_tokens": embedder.max_tokens,
        "num_buckets": buckets,
        "scaling_factor": settings.scaling_factor,
        "seed": settings.seed,
        "p": "real (held-out)",
        "q": "synthetic",
        "bootstrap_resamples": resamples,
    })


def _mauve_line(s: dict[str, Any] | None) -> str:
    assert s is not None
    resamples = s.get("bootstrap_resamples") or 0
    interval = (f"; 95% percentile interval over {resamples} bootstrap resamples of the texts "
                "(each with its own k-means seed)" if resamples else "; no per-run interval "
                "(--mauve-bootstrap R adds one over resampled texts)")
    return (f"- MAUVE: p = real, q = synthetic; embedder {s['embedder']} (inputs truncated to "
            f"{s['max_tokens'] or 'no'} tokens); {s['num_buckets']} k-means buckets; scaling "
            f"factor {s['scaling_factor']}; seed {s['seed']}{interval}")


def _mauve_summary(entry: dict[str, Any]) -> list[str]:
    """``MAUVE=51.20%``, with its interval over resampled texts when it has one
    (``MAUVE=51.20% [48.10, 54.90]``)."""
    interval = (f" [{100 * entry['low']:.2f}, {100 * entry['high']:.2f}]"
                if entry.get("low") is not None else "")
    return [f"MAUVE={100 * entry['mauve']:.2f}%{interval}"]


MAUVE = register_metric(MetricSpec(
    name="mauve",
    compute=_mauve,
    aggregate=(RunValue("mauve", ("mauve",), higher_is_better=True, header="MAUVE (%)",
                        half_width=("half_width",), scale=100.0),),
    preflight=_mauve_preflight,
    prepare=_mauve_prepare,
    describe=_mauve_line,
    settings=(MetricSetting("mauve_bootstrap", "bootstrap resamples of the texts for a 95% "
                            "interval of each run's MAUVE"),),
    summary=_mauve_summary,
    sweep_columns=(SweepColumn("mauve", ("mauve",)), SweepColumn("mauve_low", ("low",)),
                   SweepColumn("mauve_high", ("high",))),
))


# ------------------------------------------------------------------------ perplexity


def _perplexity(ctx: MetricContext) -> MetricOutput:
    scorer = ctx.models.scorer
    settings = ctx.settings
    ctx.say(f"perplexity: scoring {ctx.n} real texts with {scorer.model_id}")
    # keyed on the model object itself (alive while cached), not on its name: two loads of
    # one model in different dtypes score differently
    real_ppl = ctx.cache.get(("ppl", scorer.model, settings.max_length), ctx.real.texts,
                             lambda: scorer.score(ctx.real.texts))
    if real_ppl.scored.size == 0:
        raise EvaluationError("perplexity: no real text has a token")
    runs = []
    for run in ctx.runs:
        ctx.say(f"perplexity: {run.name}")
        syn = scorer.score(run.texts)
        if syn.scored.size == 0:
            raise EvaluationError(f"{run.name}: perplexity: no synthetic text has a token")
        runs.append({
            "mean": syn.interval().to_dict(),
            "empty": syn.empty,
            "truncated": syn.truncated,
            "per_text": _floats(syn.values),
            **delta_ppl(syn, real_ppl).to_dict(),
        })
        if syn.empty:
            ctx.warn(f"{run.name}: {syn.empty} texts without tokens left out of the perplexity")
    return MetricOutput(
        runs,
        settings={"model": scorer.model_id, "max_length": settings.max_length,
                  "batch_size": settings.batch_size, "bos_prepended": True},
        real={"mean": real_ppl.interval().to_dict(), "empty": real_ppl.empty,
              "truncated": real_ppl.truncated, "per_text": _floats(real_ppl.values)},
    )


def _perplexity_line(s: dict[str, Any] | None) -> str:
    assert s is not None
    return (f"- perplexity: model {s['model']}; BOS prepended; at most {s['max_length']} "
            "tokens per text incl. BOS; ΔPPL = |mean PPL(synthetic) − mean PPL(real)|")


PERPLEXITY = register_metric(MetricSpec(
    name="perplexity",
    compute=_perplexity,
    aggregate=(
        RunValue("delta_ppl", ("delta_ppl",), higher_is_better=False, header="ΔPPL",
                 half_width=("signed_difference", "half_width"), paren_half_width=True),
        RunValue("ppl_synthetic", ("mean", "mean"), higher_is_better=None, header="PPL",
                 panel="perplexity", half_width=("mean", "half_width"), real=("mean",)),
    ),
    columns=("ppl_synthetic", "delta_ppl"),
    aliases=("ppl",),
    preflight=_check_model,
    prepare=lambda ctx: ctx.models.check(),
    describe=_perplexity_line,
    summary=lambda e: [f"PPL={e['mean']['mean']:.2f}", f"ΔPPL={e['delta_ppl']:.2f}"],
    # a sweep scores with the model itself (loaded once, in float32), and computes ΔPPL only
    # when asked: it costs a forward pass over every text
    uses_model=True,
    sweep_default=False,
    sweep_columns=(SweepColumn("ppl_synthetic", ("mean", "mean")),
                   SweepColumn("delta_ppl", ("delta_ppl",))),
))


# ------------------------------------------------------------------------ lengths


def _same_model(run: SyntheticRun, model: Any) -> bool:
    """Whether ``run`` was generated with ``model`` (so its ``num_tokens`` are ``model``'s)."""
    recorded = run.parameters.get("model")
    if recorded is None:
        return False
    fp = (run.manifest or {}).get("fingerprint") or {}
    if not isinstance(model, str):  # a loaded model: its name and its weights' digest
        digest = getattr(model, "weights_digest", None)
        return (fp.get("model_id") == getattr(model, "model_id", None)
                and (digest is None or fp.get("model_sha256") == digest()))
    if recorded == model == "default":
        return True
    if "default" in (recorded, model):
        # the default model is recorded by its id when a loaded model was passed to the API
        from ..models.default import DEFAULT_MODEL_ID

        named = {recorded, model, fp.get("model_id")} - {"default", None}
        return named == {DEFAULT_MODEL_ID}
    if recorded != public_model_name(recorded):  # an older dplang recorded the path as typed
        try:
            return Path(recorded).expanduser().resolve() == Path(model).expanduser().resolve()
        except OSError:
            return False
    # a name: another folder of that name may hold another model
    return recorded == public_model_name(model) and _same_model_files(fp, Path(model))


def _same_model_files(fingerprint: dict[str, Any], path: Path) -> bool:
    """Whether the model at ``path`` has the tokenizer and configuration a run's fingerprint
    records (a run names a model by its name only: another folder of that name may hold
    another model); a GGUF file, which holds its tokenizer, by its own digest too."""
    from dplang.io import file_digest
    from dplang.models.hf_loading import support_files_digest

    path = path.expanduser()
    folder = path.parent if path.is_file() else path
    try:
        if fingerprint.get("model_files_sha256") != support_files_digest(folder):
            return False
        return not path.is_file() or fingerprint.get("model_sha256") == file_digest(path)
    except OSError:
        return False


def _length(ctx: MetricContext) -> MetricOutput:
    tokenizer = ctx.models.tokenizer
    model = ctx.settings.model
    ctx.say("lengths: counting tokens")
    real_len = token_lengths(ctx.real.texts, tokenizer)
    runs = []
    for run in ctx.runs:
        if run.has_field("num_tokens") and _same_model(run, model):
            lengths = np.array([int(r["num_tokens"]) for r in run.records], dtype=np.int64)
            source = "num_tokens (generation output)"
        else:
            lengths = token_lengths(run.texts, tokenizer)
            source = f"tokenizer of {_model_name(model)}"
            if run.has_field("num_tokens"):
                ctx.warn(f"{run.name}: generated with model {run.parameters.get('model')!r}, "
                         f"not {_model_name(model)!r}; its lengths were re-counted with the "
                         "latter's tokenizer so that they compare with the real lengths")
        runs.append({"tokens": wald_interval(lengths).to_dict(), "source": source,
                     "per_text": [int(x) for x in lengths]})
    return MetricOutput(
        runs,
        settings={"tokenizer": _model_name(model)},
        real={"tokens": wald_interval(real_len).to_dict(),
              "per_text": [int(x) for x in real_len]},
    )


def _length_plots(result: dict[str, Any], out_dir: Path) -> list[Path]:
    from dplang.evaluation.plots import plot_lengths

    return [plot_lengths(result["real"]["length"]["per_text"],
                         {run["name"]: run["length"]["per_text"] for run in result["runs"]},
                         out_dir / "lengths.png")]


LENGTH = register_metric(MetricSpec(
    name="length",
    compute=_length,
    aggregate=(RunValue("length_synthetic", ("tokens", "mean"), higher_is_better=None,
                        header="length (tokens)", half_width=("tokens", "half_width"),
                        real=("tokens",), digits=1),),
    aliases=("lengths",),
    preflight=_check_model,
    prepare=lambda ctx: ctx.models.check(),
    describe=lambda s: f"- lengths: tokens of {(s or {})['tokenizer']} (no special tokens)",
    plots=_length_plots,
    summary=lambda e: [f"length={e['tokens']['mean']:.1f}"],
    sweep_columns=(SweepColumn("length_mean", ("tokens", "mean")),),
))


# ------------------------------------------------------------------------ Top-k+ statistics


def _topk_select(runs: Sequence[SyntheticRun], explicit: bool) -> str | None:
    missing = [r.name for r in runs if not r.has_field("topk_plus_mean")]
    if not missing:
        return None
    if not explicit:
        return f"Top-k+ statistics skipped: {', '.join(missing)} carry none"
    raise EvaluationError(f"{missing[0]}: no Top-k+ statistics (not a dplang generate output?); "
                          "leave 'topk' out of --metrics")


def _topk(ctx: MetricContext) -> MetricOutput:
    return MetricOutput([topk_statistics(run).to_dict() for run in ctx.runs])


TOPK = register_metric(MetricSpec(
    name="topk",
    compute=_topk,
    aggregate=(
        RunValue("effective_k", ("effective_k", "mean"), higher_is_better=None,
                 header="effective k", half_width=("effective_k", "half_width")),
        RunValue("expansion_tokens", ("expansion_tokens", "mean"), higher_is_better=None,
                 header="expansion tokens", half_width=("expansion_tokens", "half_width")),
    ),
    aliases=("top-k", "topk+"),
    select=_topk_select,
    describe=lambda s: ("- Top-k+: effective k = mean of `topk_plus_mean`; expansion tokens = "
                        "mean of `expansion_tokens` (tokens sampled from V_k^+ \\ V_k)"),
    summary=lambda e: [f"effective_k={e['effective_k']['mean']:.2f}",
                       f"expansion_tokens={e['expansion_tokens']['mean']:.2f}"],
))

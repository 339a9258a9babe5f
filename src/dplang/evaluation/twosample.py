"""Two metrics that ask "can the synthetic set be told from the real one?".

* ``classifier`` — a **two-sample classifier test** (C2ST; Lopez-Paz & Oquab 2017): a logistic
  regression on sentence embeddings (the MAUVE embedder, default the offline MiniLM) learns to
  tell the ``n`` synthetic texts (class 1) from the ``n`` held-out real texts (class 0). Its
  stratified ``k``-fold cross-validated **AUC** (out-of-fold scores pooled over the folds) is
  the score: **0.5 = indistinguishable**, 1 = perfectly separable. The interval is a 95 %
  percentile bootstrap over the ``2n`` texts (resampled within each class) with the fitted
  classifiers held fixed.
* ``labels`` — the **match of label proportions** for generation grouped by label
  (``--group-by``): the mix of every label column the generations carry
  (``record["labels"]``, e.g. the Yelp category ``label1`` and stars ``label2``) against the
  mix of the same columns among the ``n`` held-out real texts, as a **total variation
  distance** TVD = ½ Σ_c |p_syn(c) − p_real(c)| ∈ [0, 1] (per column, and jointly over all of
  them), with a 95 % percentile bootstrap over texts (both sides resampled). Public-only runs
  (``method = public``: the public-prompt baseline) are marked ``role = floor``.

What the classifier test can show, and what it cannot:

* It sees **any** difference the embedding captures — topic, sentiment, style, length (texts
  are truncated at the embedder's limit, 256 MiniLM tokens, so a real review longer than the
  generation's T tokens differs from every 64-token generation in length alone), the label
  mix — and says how separable the sets are, not *why*. An AUC far from 0.5 says the sets
  differ; it does not say which one is "better" text.
* An AUC near 0.5 says that **this** classifier on **these** embeddings, trained on ``n``
  texts per side, cannot tell them apart: not that the distributions are equal. The test is
  blind to what the embedder does not encode (facts, rare words, memorised phrases: it says
  nothing about privacy) and weak at small ``n`` (the classifier has little to learn from).
* AUC depends on ``n``, the embedder and the classifier: compare only at equal settings, and
  read a difference between two runs against the real-vs-real ceiling at the same ``n``
  (``experiments/metric_resolution.py``). Out-of-fold AUC of two samples of one distribution
  scatters around 0.5 and can fall slightly below it.
* The bootstrap holds the classifiers fixed: the interval reflects the finite set of scored
  texts, not the randomness of training or of the generation (repeat runs for that).

Deterministic given ``seed`` (folds, bootstrap; single-threaded BLAS for the fit).

Privacy contract: like every evaluation output, these are statistics of the held-out real
rows, not differentially private releases; label columns are public by declaration (as in
generation).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dplang.evaluation.data import EvaluationError, SyntheticRun
from dplang.evaluation.registry import (
    MetricContext,
    MetricOutput,
    MetricSpec,
    RunValue,
    SweepColumn,
    register_metric,
)

__all__ = [
    "CLASSIFIER",
    "CLASSIFIER_FOLDS",
    "CLASSIFIER_SEED",
    "CONFIDENCE",
    "DEFAULT_RESAMPLES",
    "LABELS",
    "classifier_test",
    "label_mix",
    "percentile_interval",
    "run_labels",
    "total_variation",
]

#: Folds of the cross-validation.
CLASSIFIER_FOLDS = 5
#: Seed of the folds and of the bootstraps of the registered metrics.
CLASSIFIER_SEED = 0
#: Bootstrap resamples.
DEFAULT_RESAMPLES = 1000
#: Confidence of the bootstrap intervals.
CONFIDENCE = 0.95
#: Regularisation of the logistic regression (sklearn's C; features are standardised).
CLASSIFIER_C = 1.0


def percentile_interval(values: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The ``confidence`` percentile interval of bootstrap values."""
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(np.asarray(values, dtype=np.float64), [alpha, 1.0 - alpha])
    return float(low), float(high)


# ------------------------------------------------------------------------ classifier test


@dataclass(frozen=True)
class ClassifierTest:
    """A two-sample classifier test: cross-validated AUC and its bootstrap interval."""

    auc: float
    low: float
    high: float
    fold_aucs: tuple[float, ...]
    n_real: int
    n_synthetic: int
    folds: int
    resamples: int
    seed: int
    confidence: float = CONFIDENCE

    def to_dict(self) -> dict[str, Any]:
        return {"auc": self.auc, "low": self.low, "high": self.high,
                "half_width": (self.high - self.low) / 2.0,
                "fold_aucs": list(self.fold_aucs), "n_real": self.n_real,
                "n_synthetic": self.n_synthetic, "folds": self.folds,
                "resamples": self.resamples, "seed": self.seed, "confidence": self.confidence}


def _auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC as the Mann-Whitney statistic (ties count one half): the same number as
    ``sklearn.metrics.roc_auc_score`` (tested), without its per-call overhead, which dominated
    a thousand bootstrap resamples."""
    from scipy.stats import rankdata

    ranks = rankdata(scores)
    pos = labels == 1
    n1, n0 = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n1 * (n1 + 1) / 2.0) / (n1 * n0))


def classifier_test(
    real_features: np.ndarray, synthetic_features: np.ndarray, *,
    folds: int = CLASSIFIER_FOLDS, resamples: int = DEFAULT_RESAMPLES,
    seed: int = CLASSIFIER_SEED, confidence: float = CONFIDENCE, c: float = CLASSIFIER_C,
) -> ClassifierTest:
    """How well a logistic regression on ``features`` tells synthetic (class 1) from real
    (class 0): stratified ``folds``-fold out-of-fold AUC and a percentile bootstrap interval
    over the scored texts (resampled within each class; classifiers fixed). Deterministic
    given ``seed``."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from threadpoolctl import threadpool_limits

    real = np.asarray(real_features, dtype=np.float64)
    syn = np.asarray(synthetic_features, dtype=np.float64)
    if real.ndim != 2 or syn.ndim != 2 or real.shape[1] != syn.shape[1]:
        raise EvaluationError(f"feature arrays must be [n, d] alike, got {real.shape} and "
                              f"{syn.shape}")
    if min(real.shape[0], syn.shape[0]) < folds:
        raise EvaluationError(f"the classifier test needs at least {folds} texts per side "
                              f"({folds} folds), got {real.shape[0]} and {syn.shape[0]}")
    x = np.concatenate([real, syn])
    y = np.concatenate([np.zeros(real.shape[0], dtype=np.int64),
                        np.ones(syn.shape[0], dtype=np.int64)])
    scores = np.empty(y.size, dtype=np.float64)
    fold_aucs = []
    splitter = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    # a few small fits: multi-threaded BLAS only adds contention on a shared machine, and one
    # thread makes the fit reproducible to the bit
    with threadpool_limits(limits=1):
        for train, test in splitter.split(x, y):
            clf = make_pipeline(StandardScaler(),
                                LogisticRegression(C=c, max_iter=2000, random_state=seed))
            clf.fit(x[train], y[train])
            scores[test] = clf.decision_function(x[test])
            fold_aucs.append(_auc(scores[test], y[test]))
    auc = _auc(scores, y)
    rng = np.random.default_rng(seed)
    neg, pos = np.flatnonzero(y == 0), np.flatnonzero(y == 1)
    values = np.empty(resamples)
    for i in range(resamples):
        idx = np.concatenate([rng.choice(neg, neg.size), rng.choice(pos, pos.size)])
        values[i] = _auc(scores[idx], y[idx])
    low, high = percentile_interval(values, confidence) if resamples else (auc, auc)
    return ClassifierTest(auc, low, high, tuple(fold_aucs), int(real.shape[0]),
                          int(syn.shape[0]), folds, resamples, seed, confidence)


def _classifier_preflight(settings: Any) -> None:
    from dplang.evaluation.embedders import resolve_embedder

    resolve_embedder(settings.embedder)


def _classifier_prepare(ctx: MetricContext) -> None:
    ctx.embedder  # noqa: B018  (resolve it now: a bad embedder fails before any work)
    if ctx.n < CLASSIFIER_FOLDS:
        raise EvaluationError(f"the classifier test needs at least {CLASSIFIER_FOLDS} texts "
                              f"per side, got n = {ctx.n}")


def _classifier(ctx: MetricContext) -> MetricOutput:
    embedder = ctx.embedder
    ctx.say(f"classifier: embedding {ctx.n} real texts with {embedder.name}")
    # the same cache key as MAUVE's: the real side is embedded once per evaluation and sweep
    real_features = ctx.cache.get(("embed", embedder.name, embedder.max_tokens),
                                  ctx.real.texts, lambda: embedder.embed(ctx.real.texts))
    runs = []
    for run in ctx.runs:
        ctx.say(f"classifier: {run.name}")
        result = classifier_test(real_features, embedder.embed(run.texts))
        runs.append({**result.to_dict(), "role": _role(run)})
    return MetricOutput(runs, settings={
        "embedder": embedder.name, "max_tokens": embedder.max_tokens,
        "classifier": f"standardised features → logistic regression (sklearn, C = "
                      f"{CLASSIFIER_C:g})",
        "folds": CLASSIFIER_FOLDS, "resamples": DEFAULT_RESAMPLES, "seed": CLASSIFIER_SEED,
        "confidence": CONFIDENCE,
    })


def _classifier_line(s: dict[str, Any] | None) -> str:
    assert s is not None
    return (f"- classifier: two-sample test, {s['classifier']} on {s['embedder']} embeddings "
            f"(inputs truncated to {s['max_tokens'] or 'no'} tokens) telling synthetic from "
            f"real; {s['folds']}-fold cross-validated AUC (0.5 = indistinguishable) with a "
            f"{100 * s['confidence']:.0f}% percentile bootstrap over texts "
            f"({s['resamples']} resamples, seed {s['seed']}; classifiers fixed)")


def _interval_summary(label: str, key: str) -> Callable[[dict[str, Any]], list[str]]:
    """A spec's part of ``dplang evaluate``'s line: ``label=value [low, high]``."""
    return lambda e: [f"{label}={e[key]:.3f} [{e['low']:.3f}, {e['high']:.3f}]"]


def _interval_columns(prefix: str, key: str) -> tuple[SweepColumn, ...]:
    """``results.csv``: the value and its bootstrap interval's ends."""
    return (SweepColumn(prefix, (key,)), SweepColumn(f"{prefix}_low", ("low",)),
            SweepColumn(f"{prefix}_high", ("high",)))


CLASSIFIER = register_metric(MetricSpec(
    name="classifier",
    compute=_classifier,
    aggregate=(RunValue("classifier_auc", ("auc",), higher_is_better=False,
                        header="classifier AUC", half_width=("half_width",), digits=3),),
    aliases=("c2st", "two-sample"),
    default=False,
    help="two-sample AUC",
    preflight=_classifier_preflight,
    prepare=_classifier_prepare,
    describe=_classifier_line,
    summary=_interval_summary("classifier_AUC", "auc"),
    sweep_columns=_interval_columns("classifier_auc", "auc"),
))


# ------------------------------------------------------------------------ label proportions


def _role(run: SyntheticRun) -> str:
    """``floor`` for public-only generation (the public-prompt baseline), else
    ``synthetic``."""
    return "floor" if run.parameters.get("method") == "public" else "synthetic"


def total_variation(a: Sequence[str], b: Sequence[str]) -> float:
    """TVD ½ Σ_c |p_a(c) − p_b(c)| between the empirical distributions of two label lists."""
    if not a or not b:
        raise EvaluationError("total variation of an empty label list")
    ca, cb = Counter(a), Counter(b)
    return 0.5 * sum(abs(ca[c] / len(a) - cb[c] / len(b)) for c in set(ca) | set(cb))


def _codes(a: Sequence[str], b: Sequence[str]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    classes = sorted(set(a) | set(b))
    index = {c: i for i, c in enumerate(classes)}
    return (np.array([index[x] for x in a], dtype=np.int64),
            np.array([index[x] for x in b], dtype=np.int64), classes)


def _tvd_codes(a: np.ndarray, b: np.ndarray, k: int) -> float:
    pa = np.bincount(a, minlength=k) / a.size
    pb = np.bincount(b, minlength=k) / b.size
    return float(0.5 * np.abs(pa - pb).sum())


def _proportions(labels: Sequence[str]) -> dict[str, float]:
    counts = Counter(labels)
    return {c: counts[c] / len(labels) for c in sorted(counts)}


def label_mix(
    synthetic: dict[str, Sequence[str]], real: dict[str, Sequence[str]], *,
    resamples: int = DEFAULT_RESAMPLES, seed: int = CLASSIFIER_SEED,
    confidence: float = CONFIDENCE,
) -> dict[str, Any]:
    """The label mix of ``synthetic`` against ``real`` (both ``{column: labels}``, the same
    columns, labels aligned with texts): per column and, with several columns, jointly, the
    TVD with a percentile bootstrap interval over texts (each side resampled with the same
    indices for every column, so the joint and per-column values come from one resample).
    ``tvd`` / ``low`` / ``high`` at the top are the joint values (the column's with one)."""
    columns = sorted(synthetic)
    if not columns or sorted(real) != columns:
        raise EvaluationError(f"label columns differ: synthetic {sorted(synthetic)}, real "
                              f"{sorted(real)}")
    n_syn = {len(v) for v in synthetic.values()}
    n_real = {len(v) for v in real.values()}
    if len(n_syn) != 1 or len(n_real) != 1 or 0 in n_syn | n_real:
        raise EvaluationError("label lists must be non-empty and of one length per side")
    sets = {col: (list(synthetic[col]), list(real[col])) for col in columns}
    if len(columns) > 1:
        sets["joint"] = ([" | ".join(t) for t in zip(*(synthetic[c] for c in columns),
                                                      strict=True)],
                         [" | ".join(t) for t in zip(*(real[c] for c in columns), strict=True)])
    coded = {name: _codes(s, r) for name, (s, r) in sets.items()}
    rng = np.random.default_rng(seed)
    ns, nr = n_syn.pop(), n_real.pop()
    boot = {name: np.empty(resamples) for name in sets}
    for i in range(resamples):
        si, ri = rng.integers(0, ns, ns), rng.integers(0, nr, nr)
        for name, (a, b, classes) in coded.items():
            boot[name][i] = _tvd_codes(a[si], b[ri], len(classes))
    out: dict[str, Any] = {"columns": {}}
    for name, (s, r) in sets.items():
        tvd = total_variation(s, r)
        low, high = percentile_interval(boot[name], confidence) if resamples else (tvd, tvd)
        entry = {"tvd": tvd, "low": low, "high": high, "half_width": (high - low) / 2.0,
                 "synthetic": _proportions(s), "real": _proportions(r),
                 "missing": sorted(set(r) - set(s))}
        if name == "joint":
            out["joint"] = entry
        else:
            out["columns"][name] = entry
    top = out.get("joint") or out["columns"][columns[0]]
    out.update({k: top[k] for k in ("tvd", "low", "high", "half_width")})
    out.update({"n_synthetic": ns, "n_real": nr, "label_columns": columns,
                "resamples": resamples, "seed": seed, "confidence": confidence})
    return out


def run_labels(run: SyntheticRun) -> dict[str, list[str]]:
    """The label columns every generation of ``run`` carries (``record["labels"]``, written
    by grouped generation), as ``{column: labels}``; empty when a generation carries none."""
    per_record = [record.get("labels") or {} for record in run.records]
    common = set(per_record[0]) if per_record else set()
    for labels in per_record[1:]:
        common &= set(labels)
    return {col: [str(labels[col]) for labels in per_record] for col in sorted(common)}


def _columns(runs: Sequence[SyntheticRun]) -> tuple[list[str], list[str]]:
    """The label columns every run carries, and the runs that carry none."""
    per_run = {run.name: set(run_labels(run)) for run in runs}
    bare = [name for name, cols in per_run.items() if not cols]
    common = set.intersection(*per_run.values()) if per_run else set()
    return sorted(common), bare


def _labels_select(runs: Sequence[SyntheticRun], explicit: bool) -> str | None:
    columns, bare = _columns(runs)
    if columns:
        return None
    why = (f"{', '.join(bare)} carry no labels (generate with --group-by)" if bare else
           "the runs share no label column")
    if not explicit:
        return f"label proportions skipped: {why}"
    raise EvaluationError(f"labels: {why}; leave 'labels' out of --metrics")


def _labels_prepare(ctx: MetricContext) -> None:
    if ctx.read_real is None:
        raise EvaluationError("the labels metric reads the held-out rows' labels from a file "
                              "(evaluate_files, dplang evaluate); for labels in memory call "
                              "dplang.evaluation.twosample.label_mix")
    columns, _ = _columns(ctx.runs)
    held = ctx.read_real(ctx.n, columns)
    if held.texts != list(ctx.real.texts):  # the same rules read the same rows
        raise RuntimeError("labels: the held-out rows read again differ from the first n")
    for col in columns:
        missing = [i for i, v in zip(held.indices, held.labels[col], strict=True) if not v]
        if missing:
            raise EvaluationError(f"{held.path}: row {missing[0]} has no label in column "
                                  f"{col!r} (the labels metric compares its mix)")
    ctx.shared["labels"] = {"columns": columns,
                            "real": {col: held.labels[col] for col in columns}}


def _labels(ctx: MetricContext) -> MetricOutput:
    if "labels" not in ctx.shared:
        _labels_prepare(ctx)
    columns: list[str] = ctx.shared["labels"]["columns"]
    real: dict[str, list[str]] = ctx.shared["labels"]["real"]
    runs = []
    for run in ctx.runs:
        ctx.say(f"labels: {run.name}")
        syn = run_labels(run)
        mix = label_mix({c: syn[c] for c in columns}, real)
        runs.append({**mix, "role": _role(run)})
    return MetricOutput(runs, settings={
        "label_columns": columns, "resamples": DEFAULT_RESAMPLES, "seed": CLASSIFIER_SEED,
        "confidence": CONFIDENCE, "real": "the n held-out real texts of the evaluation",
    }, real={"columns": {c: {"proportions": _proportions(real[c])} for c in columns}})


def _labels_line(s: dict[str, Any] | None) -> str:
    assert s is not None
    cols = ", ".join(f"`{c}`" for c in s["label_columns"])
    joint = " (jointly over the columns; each column in metrics.json)" \
        if len(s["label_columns"]) > 1 else ""
    return (f"- labels: total variation distance between the label mix ({cols}) of each run's "
            f"generations and of the n real texts{joint}; {100 * s['confidence']:.0f}% "
            f"percentile bootstrap over texts ({s['resamples']} resamples, seed {s['seed']}); "
            "public-only runs are the public-prompt baseline (role floor)")


LABELS = register_metric(MetricSpec(
    name="labels",
    compute=_labels,
    aggregate=(RunValue("label_tvd", ("tvd",), higher_is_better=False, header="label TVD",
                        half_width=("half_width",), digits=3),),
    aliases=("label-mix", "label_mix"),
    default=False,
    help="label-mix TVD of grouped generations",
    select=_labels_select,
    prepare=_labels_prepare,
    describe=_labels_line,
    summary=_interval_summary("label_TVD", "tvd"),
    sweep_columns=_interval_columns("label_tvd", "tvd"),
))

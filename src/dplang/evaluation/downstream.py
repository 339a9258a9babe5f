"""Downstream utility: train on synthetic texts, test on held-out real texts.

A logistic-regression classifier is fitted on sentence embeddings of labelled texts and scored
(accuracy, macro-F1, each with a percentile-bootstrap 95% interval over the test texts) on
held-out real texts. The layout follows Aug-PE's Yelp table:

* one row per **synthetic** run (conditional generation with ``--group-by LABEL``: every text
  carries the label its group was generated for, ``record["labels"][LABEL]``);
* the **floor**: the same classifier trained on public-only generations (no private data);
* the **ceiling**: the same classifier trained on as many *real* texts (held-out rows, disjoint
  from the test rows).

Pure building blocks (:func:`fit_and_score`, :func:`bootstrap_interval`,
:func:`downstream_table`) take texts and labels in memory. Importing this module registers the
``downstream`` metric (:data:`DOWNSTREAM`, listed in
:data:`dplang.evaluation.registry.BUILTIN_MODULES`), which ``dplang evaluate --metrics
downstream --label-column COL`` and experiment sweeps run through the harness like every other
metric: each run trains on its first ``n`` generations, the ceiling on the ``n`` real texts of
the evaluation (the first ``n`` held-out rows), and the test set is the held-out rows after
them. Besides ``metrics.json`` it writes ``downstream.json`` / ``downstream.md``
(:func:`write_downstream`).

Privacy contract:

* **Labels are public by declaration** (like ``--group-by`` columns in generation): they are
  read from the synthetic records and the real file and appear in the outputs.
* **Held-out real rows are private.** Every output of this module describes them (their
  accuracy, class counts, path, digest), so :func:`write_downstream` writes its files with mode
  600 from creation (:func:`dplang.release.write_atomic` with ``private=True``), like every
  other evaluation file (:mod:`dplang.evaluation.report`). None of it is a DP release.
* **Held-out means disjoint from the references.** Real rows that were references of a
  synthetic run (the run's ``reference_ids`` when the real file is its data file) are refused
  (or skipped with ``exclude_references``), through :func:`dplang.evaluation.data.load_real`
  (the harness's ``read_real``);
  in memory, :func:`check_disjoint` refuses test texts that occur among the training texts or
  the given references.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dplang.evaluation.data import EvaluationError, RealTexts, SyntheticRun, load_real
from dplang.evaluation.embedders import Embedder, resolve_embedder
from dplang.evaluation.registry import (
    MetricContext,
    MetricOutput,
    MetricSetting,
    MetricSpec,
    RunValue,
    SweepColumn,
    register_metric,
)

__all__ = [
    "DEFAULT_BOOTSTRAP",
    "DOWNSTREAM",
    "DOWNSTREAM_SEED",
    "DownstreamScore",
    "LabelledTexts",
    "bootstrap_interval",
    "check_disjoint",
    "downstream_layout",
    "downstream_table",
    "fit_and_score",
    "labelled_run",
    "render_downstream",
    "summary_line",
    "write_downstream",
]

#: Bootstrap resamples of the test set.
DEFAULT_BOOTSTRAP = 1000
#: Seed of the bootstrap and of the classifier in the registered metric.
DOWNSTREAM_SEED = 0
#: Confidence of the bootstrap intervals.
CONFIDENCE = 0.95


@dataclass(frozen=True)
class LabelledTexts:
    """Texts with one (public) label each; ``name`` identifies the set in reports."""

    name: str
    texts: tuple[str, ...]
    labels: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.texts) != len(self.labels):
            raise EvaluationError(f"{self.name}: {len(self.texts)} texts but "
                                  f"{len(self.labels)} labels")

    @classmethod
    def of(cls, name: str, texts: Sequence[str], labels: Sequence[Any]) -> LabelledTexts:
        """Build from any sequences (labels turned into strings)."""
        return cls(name, tuple(texts), tuple(str(x) for x in labels))

    def head(self, n: int) -> LabelledTexts:
        """The first ``n`` texts."""
        return LabelledTexts(self.name, self.texts[:n], self.labels[:n])


@dataclass(frozen=True)
class DownstreamScore:
    """Test scores of one classifier (intervals: percentile bootstrap over test texts)."""

    name: str
    role: str  # "synthetic", "floor" or "ceiling"
    n_train: int
    train_classes: dict[str, int]
    accuracy: float
    accuracy_ci: tuple[float, float]
    macro_f1: float
    macro_f1_ci: tuple[float, float]
    trivial: str | None = None  # why no classifier was fitted (one class only)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "name": self.name, "role": self.role, "n_train": self.n_train,
            "train_classes": dict(self.train_classes),
            "accuracy": {"mean": self.accuracy, "low": self.accuracy_ci[0],
                         "high": self.accuracy_ci[1]},
            "macro_f1": {"mean": self.macro_f1, "low": self.macro_f1_ci[0],
                         "high": self.macro_f1_ci[1]},
            "trivial": self.trivial,
        }


def check_disjoint(test: Sequence[str], *others: Sequence[str], what: str = "training") -> None:
    """Refuse test texts that also occur (exactly, after stripping) in ``others``.

    A classifier scored on texts it was trained on, or on references of the generation it is
    evaluating, measures memorisation, not utility."""
    seen = {t.strip() for other in others for t in other}
    clash = [t for t in test if t.strip() in seen]
    if clash:
        raise EvaluationError(
            f"{len(clash)} held-out test texts also occur among the {what} texts (first: "
            f"{clash[0][:60]!r}); the test set must be disjoint from them"
        )


def _macro_f1(y_true: np.ndarray, y_pred: np.ndarray, classes: np.ndarray) -> float:
    """Macro-F1 over ``classes`` (sorted, holding every label), as scikit-learn's
    ``f1_score(average="macro", zero_division=0)`` computes it: per class
    ``2 tp / (true + predicted)`` (0 where both are 0), then the mean. Counted with
    ``bincount``: the bootstrap calls it a thousand times per score."""
    k = classes.size
    t = np.searchsorted(classes, y_true)
    p = np.searchsorted(classes, y_pred)
    tp = np.bincount(t[t == p], minlength=k)
    denominator = (np.bincount(t, minlength=k) + np.bincount(p, minlength=k)).astype(np.float64)
    per_class = np.divide(2.0 * tp, denominator, out=np.zeros(k), where=denominator > 0)
    return float(np.mean(per_class))


def bootstrap_interval(
    y_true: Sequence[Any], y_pred: Sequence[Any], metric: Callable[[np.ndarray, np.ndarray], float],
    *, resamples: int = DEFAULT_BOOTSTRAP, seed: int = 0, confidence: float = CONFIDENCE,
) -> tuple[float, float]:
    """Percentile-bootstrap interval of ``metric(y_true, y_pred)`` over the test examples.

    The resampling is of test texts only (the classifier is fixed): the interval reflects the
    finite test set, not the randomness of the training set or of the generation."""
    t = np.asarray(y_true)
    p = np.asarray(y_pred)
    if t.size == 0:
        raise EvaluationError("no test texts")
    rng = np.random.default_rng(seed)
    values = np.empty(resamples)
    for i in range(resamples):
        idx = rng.integers(0, t.size, t.size)
        values[i] = metric(t[idx], p[idx])
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(values, [alpha, 1.0 - alpha])
    return float(low), float(high)


def fit_and_score(
    train_features: np.ndarray, train_labels: Sequence[str],
    test_features: np.ndarray, test_labels: Sequence[str],
    *, name: str = "run", role: str = "synthetic", resamples: int = DEFAULT_BOOTSTRAP,
    seed: int = 0, max_iter: int = 2000,
) -> DownstreamScore:
    """Fit logistic regression on ``train_features`` and score it on the test set.

    Features are standardised (fitted on the training set only). A training set with a single
    class gets the constant classifier predicting it (recorded in ``trivial``). Macro-F1 is
    averaged over the union of training and test classes (a test class never predicted
    scores 0)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    y_train = np.asarray([str(x) for x in train_labels])
    y_test = np.asarray([str(x) for x in test_labels])
    if len(y_train) != len(train_features) or len(y_test) != len(test_features):
        raise EvaluationError("features and labels differ in length")
    if y_train.size == 0:
        raise EvaluationError(f"{name}: no training texts")
    classes_train, counts = np.unique(y_train, return_counts=True)
    classes = np.unique(np.concatenate([y_train, y_test]))
    trivial = None
    if classes_train.size == 1:
        trivial = f"one training class ({classes_train[0]!r}): constant prediction"
        y_pred = np.full(y_test.shape, classes_train[0])
    else:
        clf = make_pipeline(StandardScaler(),
                            LogisticRegression(max_iter=max_iter, random_state=seed))
        clf.fit(np.asarray(train_features), y_train)
        y_pred = np.asarray(clf.predict(np.asarray(test_features)))

    def acc(t: np.ndarray, p: np.ndarray) -> float:
        return float(np.mean(t == p))

    def f1(t: np.ndarray, p: np.ndarray) -> float:
        return _macro_f1(t, p, classes)

    return DownstreamScore(
        name=name, role=role, n_train=int(y_train.size),
        train_classes={str(c): int(k) for c, k in zip(classes_train, counts, strict=True)},
        accuracy=acc(y_test, y_pred),
        accuracy_ci=bootstrap_interval(y_test, y_pred, acc, resamples=resamples, seed=seed),
        macro_f1=f1(y_test, y_pred),
        macro_f1_ci=bootstrap_interval(y_test, y_pred, f1, resamples=resamples, seed=seed),
        trivial=trivial,
    )


def downstream_table(
    test: LabelledTexts,
    synthetic: Sequence[LabelledTexts],
    *,
    embedder: str | Embedder = "default",
    ceiling: LabelledTexts | None = None,
    floor: Sequence[LabelledTexts] = (),
    references: Sequence[str] = (),
    resamples: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    embed_real: Callable[[Sequence[str]], np.ndarray] | None = None,
) -> dict[str, Any]:
    """Scores of classifiers trained on each synthetic set, the floor(s) and the ceiling,
    all tested on ``test`` (held-out real texts).

    The ceiling is cut to the size of the largest synthetic set ("as many real texts"). Refuses
    (:class:`EvaluationError`) test texts that occur among the ceiling's training texts or among
    ``references`` (the generation's references, when the caller knows them). ``embed_real``
    (default: the embedder's) embeds the real texts, test and ceiling (a cache across
    evaluations; it must give the embedder's features). Returns a dict with ``settings``,
    ``test`` (size, class counts) and ``rows`` (one per classifier, in the order synthetic,
    floor, ceiling)."""
    if not test.texts:
        raise EvaluationError("no held-out test texts")
    if not synthetic and not floor and ceiling is None:
        raise EvaluationError("nothing to train on")
    if references:
        check_disjoint(test.texts, references, what="reference")
    n_syn = max((len(s.texts) for s in synthetic), default=None)
    if ceiling is not None:
        if n_syn is not None:
            if len(ceiling.texts) < n_syn:
                raise EvaluationError(f"ceiling: {len(ceiling.texts)} real training texts, fewer "
                                      f"than the {n_syn} synthetic ones")
            ceiling = ceiling.head(n_syn)
        check_disjoint(test.texts, ceiling.texts, what="ceiling's real training")
    emb = resolve_embedder(embedder)
    real_features = embed_real or (lambda texts: emb.embed(list(texts)))
    test_x = real_features(test.texts)
    rows: list[dict[str, Any]] = []
    for role, sets in (("synthetic", list(synthetic)), ("floor", list(floor)),
                       ("ceiling", [ceiling] if ceiling is not None else [])):
        for s in sets:
            features = (real_features(s.texts) if role == "ceiling"
                        else emb.embed(list(s.texts)))
            score = fit_and_score(features, s.labels, test_x, test.labels,
                                  name=s.name, role=role, resamples=resamples, seed=seed)
            rows.append(score.to_dict())
    classes, counts = np.unique(np.asarray(test.labels), return_counts=True)
    majority = float(counts.max() / counts.sum())
    return {
        "settings": {"classifier": "standardised features → logistic regression (sklearn)",
                     "embedder": emb.name, "max_tokens": emb.max_tokens,
                     "bootstrap_resamples": resamples, "confidence": CONFIDENCE, "seed": seed},
        "test": {"name": test.name, "n": len(test.texts),
                 "classes": {str(c): int(k) for c, k in zip(classes, counts, strict=True)},
                 "majority_accuracy": majority, "chance_macro_f1_uniform": 1.0 / classes.size},
        "rows": rows,
    }


def labelled_run(run: SyntheticRun, label_column: str) -> LabelledTexts:
    """A ``dplang generate`` (or public-only) output as labelled texts: each generation's label
    is the value of ``label_column`` its group was generated for (``record["labels"]``).
    Refuses runs generated without ``--group-by label_column``."""
    labels = []
    for i, record in enumerate(run.records):
        value = (record.get("labels") or {}).get(label_column)
        if value is None:
            raise EvaluationError(
                f"{run.name}: generation {i} carries no label {label_column!r}; generate with "
                f"--group-by {label_column} for the downstream metric"
            )
        labels.append(str(value))
    return LabelledTexts.of(run.name, run.texts, labels)


def _is_floor(run: SyntheticRun) -> bool:
    return run.parameters.get("method") == "public"


# ------------------------------------------------------------------------ the registered metric
#
# ``dplang evaluate --metrics downstream --label-column COL`` (and ``[evaluation].metrics`` of
# an experiment) go through the metric registry like every other metric: the harness aligns the
# inputs to ``n`` texts per side, so every run trains on its first ``n`` generations and the
# ceiling on the ``n`` real texts the other metrics use (the first ``n`` held-out rows); the
# test set is the held-out rows after them (``ctx.read_real``).

_SHARED = "downstream"


def _preflight(settings: Any) -> None:
    if not settings.label_column or not str(settings.label_column).strip():
        raise EvaluationError("the downstream metric needs a label column (--label-column: the "
                              "generation's --group-by column)")
    if settings.test_num is not None and settings.test_num < 1:
        raise EvaluationError(f"--test-num must be at least 1, got {settings.test_num}")
    resolve_embedder(settings.embedder)


def check_held_out(held: RealTexts, n: int, column: str, test_num: int | None = None) -> None:
    """Refuse held-out rows the downstream metric cannot use: no more than ``n`` of them (the
    ceiling trains on the first ``n``, the rest are the test set), a row without a label in
    ``column``, fewer than ``test_num`` test rows, or a test text among the ceiling's training
    texts. Raises :class:`EvaluationError`; reads nothing."""
    if len(held.texts) <= n:
        raise EvaluationError(f"{held.path}: {len(held.texts)} held-out real texts; the "
                              f"downstream metric needs more than n = {n} (the ceiling's "
                              "training set) plus a test set")
    labels = held.labels[column]
    missing = [i for i, label in zip(held.indices, labels, strict=True) if not label]
    if missing:
        raise EvaluationError(f"{held.path}: row {missing[0]} has no label in column "
                              f"{column!r}")
    if test_num is not None and len(held.texts) - n < test_num:
        raise EvaluationError(f"--test-num {test_num}: only {len(held.texts) - n} held-out "
                              f"test texts after the ceiling's {n}")
    check_disjoint(held.texts[n:], held.texts[:n], what="ceiling's real training")


def check_real_file(path: str | Path, n: int, column: str, *, text_column: str = "text") -> None:
    """:func:`check_held_out` on a held-out file read as the metric will read it (the same
    :func:`~dplang.evaluation.data.load_real` rules), so that a sweep can refuse a file the
    metric would refuse before any cell is generated and charged. The file is the data
    holder's; nothing is written."""
    held = load_real(path, [], text_column=text_column, label_columns=[column])
    check_held_out(held, n, column)


def _prepare(ctx: MetricContext) -> None:
    """Check everything before any embedding: labels of every run, labelled held-out rows,
    enough of them for a test set."""
    settings = ctx.settings
    if ctx.read_real is None:
        raise EvaluationError("the downstream metric reads labelled held-out rows from a file "
                              "(evaluate_files, dplang evaluate); for texts in memory call "
                              "dplang.evaluation.downstream.downstream_table")
    _preflight(settings)
    column = str(settings.label_column)
    labelled = [labelled_run(run, column) for run in ctx.runs]
    n, test_num = ctx.n, settings.test_num
    held = ctx.read_real(None if test_num is None else n + test_num, [column])
    if held.texts[:n] != list(ctx.real.texts):  # the same rules read the same rows
        raise RuntimeError("downstream: the held-out rows read again differ from the first n")
    check_held_out(held, n, column, test_num)
    labels = held.labels[column]
    ctx.shared[_SHARED] = {
        "runs": labelled,
        "floor": [_is_floor(run) for run in ctx.runs],
        "ceiling": LabelledTexts.of("real (ceiling)", held.texts[:n], labels[:n]),
        "test": LabelledTexts.of("real (held-out test)", held.texts[n:], labels[n:]),
        "excluded_references": held.excluded_references,
    }


def _compute(ctx: MetricContext) -> MetricOutput:
    prepared = ctx.shared.get(_SHARED)
    if prepared is None:
        _prepare(ctx)
        prepared = ctx.shared[_SHARED]
    runs: list[LabelledTexts] = prepared["runs"]
    floor: list[bool] = prepared["floor"]
    test: LabelledTexts = prepared["test"]
    ceiling: LabelledTexts = prepared["ceiling"]
    embedder = ctx.embedder
    if any(floor) and not all(floor):
        ctx.warn("downstream: the mean over runs mixes private runs and public-only (floor) "
                 "runs; read the per-run rows (downstream.md)")
    key = ("embed", embedder.name, embedder.max_tokens)

    def embed_real(texts: Sequence[str]) -> np.ndarray:  # shared across a sweep's cells
        return ctx.cache.get(key, list(texts), lambda: embedder.embed(list(texts)))

    ctx.say(f"downstream: {len(test.texts)} test texts, {ctx.n} training texts per classifier")
    table = downstream_table(
        test, [r for r, f in zip(runs, floor, strict=True) if not f], embedder=embedder,
        ceiling=ceiling, floor=[r for r, f in zip(runs, floor, strict=True) if f],
        resamples=DEFAULT_BOOTSTRAP, seed=DOWNSTREAM_SEED, embed_real=embed_real,
    )
    synthetic_rows = iter([r for r in table["rows"] if r["role"] == "synthetic"])
    floor_rows = iter([r for r in table["rows"] if r["role"] == "floor"])
    per_run = [next(floor_rows) if f else next(synthetic_rows) for f in floor]
    ceiling_row = next(r for r in table["rows"] if r["role"] == "ceiling")
    settings = dict(table["settings"])
    settings.update({
        "label_column": ctx.settings.label_column,
        "n_train": ctx.n,
        "ceiling_rows": "the n real texts of the evaluation (first n held-out rows)",
        "test_rows": "the held-out rows after them"
                     + ("" if ctx.settings.test_num is None
                        else f" (the first {ctx.settings.test_num})"),
    })
    return MetricOutput(per_run, settings=settings,
                        real={"test": table["test"], "ceiling": ceiling_row,
                              "excluded_references": prepared["excluded_references"]})


def downstream_layout(result: dict[str, Any]) -> dict[str, Any]:
    """The downstream part of an evaluation result (``metrics.json``) in Aug-PE's layout
    (``downstream.json``): ``settings``, ``test``, ``rows`` (synthetic runs, floor runs, the
    ceiling), ``real`` and ``runs``."""
    entries = [(run, run["downstream"]) for run in result["runs"]]
    rows = ([e for _, e in entries if e["role"] == "synthetic"]
            + [e for _, e in entries if e["role"] == "floor"]
            + [result["real"]["downstream"]["ceiling"]])
    real = result["real"]
    return {
        "settings": {**result["settings"]["downstream"],
                     "text_column": result["settings"]["text_column"]},
        "test": real["downstream"]["test"],
        "rows": rows,
        "real": {"path": real["path"], "sha256": real["sha256"],
                 "excluded_references": real["downstream"]["excluded_references"],
                 "ceiling_rows": result["settings"]["downstream"]["ceiling_rows"],
                 "test_rows": result["settings"]["downstream"]["test_rows"]},
        "runs": [{"name": run["name"], "path": run["path"], "sha256": run["sha256"],
                  "role": entry["role"]} for run, entry in entries],
    }


def _files(result: dict[str, Any], out_dir: Path) -> list[Path]:
    return write_downstream(downstream_layout(result), out_dir)


def _describe(s: dict[str, Any] | None) -> str:
    assert s is not None
    return (f"- downstream: {s['classifier']} on {s['embedder']} embeddings, label column "
            f"`{s['label_column']}`; trained on each run's n = {s['n_train']} texts, the "
            "ceiling (row 'real') on the n real texts; tested on "
            f"{s['test_rows']}; {100 * s['confidence']:.0f}% bootstrap intervals in "
            "`downstream.md`")


def summary_line(row: dict[str, Any]) -> str:
    """One run's (or the ceiling's) downstream scores on one line (``dplang evaluate``)."""
    a, f = row["accuracy"], row["macro_f1"]
    return (f"{row['role']}  accuracy={a['mean']:.3f} [{a['low']:.3f}, {a['high']:.3f}]  "
            f"macro_f1={f['mean']:.3f} [{f['low']:.3f}, {f['high']:.3f}]")


def _footer(result: dict[str, Any], out_dir: Path) -> list[str]:
    if "downstream" not in result["real"]:
        return []
    return [f"real (ceiling)  n={result['settings']['n']}  "
            + summary_line(result["real"]["downstream"]["ceiling"]),
            f"wrote {out_dir / 'downstream.md'} and {out_dir / 'downstream.json'}"]


DOWNSTREAM = register_metric(MetricSpec(
    name="downstream",
    compute=_compute,
    aggregate=(
        RunValue("downstream_accuracy", ("accuracy", "mean"), higher_is_better=True,
                 header="downstream accuracy (%)", real=("ceiling", "accuracy"), scale=100.0,
                 digits=1),
        RunValue("downstream_macro_f1", ("macro_f1", "mean"), higher_is_better=True,
                 header="downstream macro-F1 (%)", real=("ceiling", "macro_f1"), scale=100.0,
                 digits=1),
    ),
    default=False,
    preflight=_preflight,
    prepare=_prepare,
    describe=_describe,
    plots=_files,
    settings=(MetricSetting("label_column", "the public label column", required=True),
              MetricSetting("test_num", "held-out test rows after the n real texts")),
    summary=lambda entry: [summary_line(entry)],
    footer=_footer,
    sweep_columns=(
        SweepColumn("downstream_accuracy", ("accuracy", "mean")),
        SweepColumn("downstream_accuracy_low", ("accuracy", "low")),
        SweepColumn("downstream_accuracy_high", ("accuracy", "high")),
        SweepColumn("downstream_macro_f1", ("macro_f1", "mean")),
        SweepColumn("downstream_ceiling", ("ceiling", "accuracy", "mean"), real=True),
    ),
))


def render_downstream(result: dict[str, Any]) -> str:
    """Markdown table of a downstream result (Aug-PE's layout)."""
    s = result["settings"]
    t = result["test"]
    lines = ["# Downstream utility (train on synthetic, test on real)", "",
             f"Classifier: {s['classifier']} on {s['embedder']} embeddings; label column "
             f"`{s.get('label_column', '?')}`; {t['n']} held-out real test texts "
             f"(majority-class accuracy {t['majority_accuracy']:.3f}); intervals are "
             f"{100 * s['confidence']:.0f}% percentile bootstrap over test texts "
             f"({s['bootstrap_resamples']} resamples).", "",
             "| trained on | role | n train | accuracy | 95% CI | macro-F1 | 95% CI |",
             "|---|---|---:|---:|---|---:|---|"]
    for r in result["rows"]:
        a, f = r["accuracy"], r["macro_f1"]
        lines.append(f"| {r['name']} | {r['role']} | {r['n_train']} | {a['mean']:.3f} | "
                     f"[{a['low']:.3f}, {a['high']:.3f}] | {f['mean']:.3f} | "
                     f"[{f['low']:.3f}, {f['high']:.3f}] |")
    lines += ["", "Private: this file describes held-out real texts (mode 600). Labels are "
              "public by declaration.", ""]
    return "\n".join(lines)


def write_downstream(result: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write ``downstream.json`` and ``downstream.md`` into ``out_dir``, **mode 600 from
    creation** (they describe the private held-out rows)."""
    import json

    from dplang.evaluation.report import json_safe
    from dplang.release import write_atomic

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / "downstream.md", out / "downstream.json"
    write_atomic(md, render_downstream(result), private=True)
    write_atomic(js, json.dumps(json_safe(result), indent=2, ensure_ascii=False) + "\n",
                 private=True)
    return [md, js]


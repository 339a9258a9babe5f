"""The two-sample classifier test (``classifier``), the label-mix metric (``labels``) and
MAUVE's interval over resampled texts."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from dplang.evaluation import evaluate_files, evaluate_texts, parse_metrics
from dplang.evaluation import registry as reg
from dplang.evaluation.data import EvaluationError
from dplang.evaluation.mauve_metric import mauve_bootstrap, mauve_from_features
from dplang.evaluation.twosample import classifier_test, label_mix, total_variation


def _gauss(n: int, shift: float, seed: int, d: int = 8) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(n, d))
    x[:, 0] += shift
    return x


def test_classifier_test_separates_shifted_sets_and_not_equal_ones() -> None:
    same = classifier_test(_gauss(200, 0.0, 1), _gauss(200, 0.0, 2), resamples=300)
    assert same.low < 0.5 < same.high and abs(same.auc - 0.5) < 0.08
    shifted = classifier_test(_gauss(200, 0.0, 1), _gauss(200, 1.5, 2), resamples=300)
    assert shifted.auc > 0.8 and shifted.low > 0.7 and shifted.low <= shifted.auc <= shifted.high
    assert len(shifted.fold_aucs) == 5 and shifted.n_real == shifted.n_synthetic == 200
    again = classifier_test(_gauss(200, 0.0, 1), _gauss(200, 1.5, 2), resamples=300)
    assert again == shifted  # deterministic given the seed
    other = classifier_test(_gauss(200, 0.0, 1), _gauss(200, 1.5, 2), resamples=300, seed=1)
    assert other.auc != shifted.auc  # other folds


def test_auc_is_sklearns() -> None:
    from sklearn.metrics import roc_auc_score

    from dplang.evaluation.twosample import _auc

    rng = np.random.default_rng(0)
    scores = np.round(rng.normal(size=300), 1)  # with ties
    labels = rng.integers(0, 2, 300)
    assert _auc(scores, labels) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


def test_classifier_test_refuses_bad_inputs() -> None:
    with pytest.raises(EvaluationError, match="at least 5 texts"):
        classifier_test(_gauss(3, 0, 1), _gauss(3, 0, 2))
    with pytest.raises(EvaluationError, match="alike"):
        classifier_test(_gauss(20, 0, 1), _gauss(20, 0, 2, d=4))


def test_label_mix_total_variation_and_intervals() -> None:
    assert total_variation(["a", "b"], ["b", "a"]) == 0.0
    assert total_variation(["a"] * 4, ["a", "a", "b", "b"]) == pytest.approx(0.5)
    real = {"cat": ["x"] * 60 + ["y"] * 40, "stars": ["5"] * 50 + ["1"] * 50}
    same = label_mix(real, real, resamples=300)
    assert same["tvd"] == 0.0 and same["low"] >= 0.0 and same["high"] > 0.0
    assert set(same["columns"]) == {"cat", "stars"} and same["joint"]["tvd"] == 0.0
    skewed = {"cat": ["x"] * 100, "stars": ["5"] * 100}  # one group only
    mix = label_mix(skewed, real, resamples=300)
    assert mix["columns"]["cat"]["tvd"] == pytest.approx(0.4)
    assert mix["columns"]["stars"]["tvd"] == pytest.approx(0.5)
    assert mix["tvd"] == mix["joint"]["tvd"] >= 0.5  # the joint mix is at least as far
    assert mix["columns"]["cat"]["missing"] == ["y"]
    assert mix["columns"]["cat"]["low"] <= 0.4 <= mix["columns"]["cat"]["high"]
    assert label_mix(skewed, real, resamples=300) == mix  # deterministic
    one = label_mix({"cat": skewed["cat"]}, {"cat": real["cat"]}, resamples=50)
    assert "joint" not in one and one["tvd"] == pytest.approx(0.4)
    with pytest.raises(EvaluationError, match="columns differ"):
        label_mix({"cat": ["x"]}, {"stars": ["x"]})


def test_mauve_bootstrap_is_an_interval_over_resampled_texts() -> None:
    p, q = _gauss(60, 0.0, 1, d=16), _gauss(60, 3.0, 2, d=16)
    point = mauve_from_features(p, q, num_buckets=3).mauve
    interval = mauve_bootstrap(p, q, resamples=20, num_buckets=3)
    assert interval.low <= interval.high and len(interval.values) == 20
    assert interval.low < point + 0.2 and interval.high > point - 0.2
    assert mauve_bootstrap(p, q, resamples=20, num_buckets=3) == interval  # deterministic
    with pytest.raises(EvaluationError, match="at least 2"):
        mauve_bootstrap(p, q, resamples=1)


def _labelled_files(tmp_path, kit, *, skew: bool):
    """A real CSV (column ``cat``: two categories, 60/40) and two grouped generations: one
    whose categories follow the real mix, and a public-only one (``method = public``) all in
    one category when ``skew``."""
    n = 40
    real_texts = kit.reviews(n, seed=11)
    rows = ["text,cat"] + [f"\"{t}\",{'food' if i % 5 < 3 else 'hotel'}"
                           for i, t in enumerate(real_texts)]
    real = tmp_path / "real.csv"
    real.write_text("\n".join(rows) + "\n")
    paths = []
    for name, method, cats in (
            ("private", "invisibleink", ["food" if i % 5 < 3 else "hotel" for i in range(n)]),
            ("public", "public", ["food"] * n if skew else
             ["food" if i % 5 < 3 else "hotel" for i in range(n)])):
        path = kit.write_synthetic(tmp_path / f"{name}.jsonl", kit.reviews(n, seed=hash(name) % 97),
                                   manifest={"fingerprint": {"parameters": {"method": method}}})
        records = [json.loads(line) for line in path.read_text().splitlines()]
        for record, cat in zip(records, cats, strict=True):
            record["labels"] = {"cat": cat}
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        paths.append(path)
    return real, paths


def test_registered_metrics_run_through_the_harness(tmp_path, kit) -> None:
    assert parse_metrics("c2st,label-mix,mauve") == ("mauve", "classifier", "labels")
    assert {"classifier", "labels"} <= set(reg.metric_names())
    assert "classifier" not in reg.default_metrics() and "labels" not in reg.default_metrics()
    real, paths = _labelled_files(tmp_path, kit, skew=True)
    out = tmp_path / "eval"
    result = evaluate_files(real, paths, metrics="mauve,classifier,labels", embedder="hashing",
                            num_buckets=2, mauve_bootstrap=5, out_dir=out)
    private, public = result["runs"]
    assert private["labels"]["tvd"] == pytest.approx(0.0)
    assert public["labels"]["tvd"] == pytest.approx(0.4)
    assert (private["labels"]["role"], public["labels"]["role"]) == ("synthetic", "floor")
    assert result["real"]["labels"]["columns"]["cat"]["proportions"] == {"food": 0.6,
                                                                         "hotel": 0.4}
    for run in result["runs"]:
        c = run["classifier"]
        assert 0.0 <= c["low"] <= c["auc"] <= c["high"] <= 1.0 or c["low"] <= c["high"]
        assert run["mauve"]["bootstrap"]["resamples"] == 5
        assert run["mauve"]["low"] <= run["mauve"]["high"]
    # a private and a public-only run are not seeds of one configuration: no mean over runs,
    # but each metric declares the value it would average
    from dplang.evaluation.registry import get_metric

    assert result["aggregate"] == {}
    assert {v.key for name in ("classifier", "labels", "mauve")
            for v in get_metric(name).aggregate} >= {"classifier_auc", "label_tvd", "mauve"}
    report = (out / "report.md").read_text()
    assert "classifier AUC" in report and "label TVD" in report
    assert "bootstrap resamples of the texts" in report
    again = evaluate_files(real, paths, metrics="classifier,labels", embedder="hashing")
    assert [r["classifier"]["auc"] for r in again["runs"]] == \
        [r["classifier"]["auc"] for r in result["runs"]]


def test_labels_need_grouped_generations(tmp_path, kit) -> None:
    real = kit.write_real_csv(tmp_path / "real.csv", kit.reviews(30, seed=3))
    syn = kit.write_synthetic(tmp_path / "syn.jsonl", kit.reviews(30, seed=4))
    with pytest.raises(EvaluationError, match="carry no labels"):
        evaluate_files(real, syn, metrics="labels", embedder="hashing")
    with pytest.raises(EvaluationError, match="--mauve-bootstrap"):
        evaluate_files(real, syn, metrics="labels", mauve_bootstrap=5)
    result = evaluate_texts(kit.reviews(30, seed=3), [kit.reviews(30, seed=4)],
                            metrics="classifier", embedder="hashing")
    assert 0.0 <= result["runs"][0]["classifier"]["auc"] <= 1.0


def test_classifier_sees_a_degenerate_generator(kit) -> None:
    rng = random.Random(0)
    real = kit.reviews(60, seed=1)
    collapsed = [f"the the the {rng.choice(['the', 'a'])}" for _ in range(60)]
    result = evaluate_texts(real, [kit.reviews(60, seed=2), collapsed], metrics="classifier",
                            embedder="hashing")
    similar, degenerate = (r["classifier"] for r in result["runs"])
    assert degenerate["auc"] > 0.95 and degenerate["low"] > similar["high"]


def test_real_texts_cut_to_the_generations_length(tmp_path, kit, tiny_model_dir) -> None:
    """--real-max-tokens T: every real text is cut to its first T tokens before any metric,
    the texts read again for labels included; short texts are left as they are."""
    from dplang.evaluation.harness import cut_texts
    from dplang.evaluation.lengths import load_tokenizer

    tok = load_tokenizer(str(tiny_model_dir))
    texts = kit.reviews(30, seed=5)
    cut = cut_texts(texts, tok, 4)
    assert all(len(tok(c, add_special_tokens=False)["input_ids"]) <= 5 for c in cut)
    assert cut_texts(texts, tok, 10_000) == texts
    real, paths = _labelled_files(tmp_path, kit, skew=False)
    result = evaluate_files(real, paths[0], metrics="length,labels", model=str(tiny_model_dir),
                            real_max_tokens=4, out_dir=tmp_path / "eval")
    assert result["settings"]["real_max_tokens"] == 4
    assert max(result["real"]["length"]["per_text"]) <= 4
    assert result["runs"][0]["labels"]["tvd"] == pytest.approx(0.0)
    assert "cut to its first 4 tokens" in (tmp_path / "eval" / "report.md").read_text()
    with pytest.raises(EvaluationError, match="--real-max-tokens"):
        evaluate_files(real, paths[0], metrics="length", real_max_tokens=0)


def test_the_specs_state_their_lines_and_results_columns() -> None:
    """What dplang evaluate prints and the sweep's results.csv holds come from the specs:
    each value with its interval (MAUVE's only when it was bootstrapped)."""
    classifier, labels, mauve = (reg.get_metric(n) for n in ("classifier", "labels", "mauve"))
    assert classifier.run_summary({"auc": 0.5123, "low": 0.48, "high": 0.551}) == \
        ["classifier_AUC=0.512 [0.480, 0.551]"]
    assert labels.run_summary({"tvd": 0.1, "low": 0.05, "high": 0.2}) == \
        ["label_TVD=0.100 [0.050, 0.200]"]
    assert mauve.run_summary({"mauve": 0.5}) == ["MAUVE=50.00%"]
    assert mauve.run_summary({"mauve": 0.5, "low": 0.45, "high": 0.551}) == \
        ["MAUVE=50.00% [45.00, 55.10]"]
    assert [c.name for c in classifier.results_columns()] == \
        ["classifier_auc", "classifier_auc_low", "classifier_auc_high"]
    assert [c.name for c in labels.results_columns()] == \
        ["label_tvd", "label_tvd_low", "label_tvd_high"]
    assert [c.name for c in mauve.results_columns()] == ["mauve", "mauve_low", "mauve_high"]
    # --mauve-bootstrap is MAUVE's own setting: refused without it
    assert reg.settings_problem(["labels"], {"mauve_bootstrap": 5}) == \
        "--mauve-bootstrap is for --metrics mauve"

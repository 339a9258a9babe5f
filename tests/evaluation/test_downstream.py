"""Downstream utility (train on synthetic, test on real) with the hashing embedder."""

from __future__ import annotations

import csv
import json
import random
import stat
from pathlib import Path

import numpy as np
import pytest

from dplang.evaluation import evaluate_files, evaluate_texts, parse_metrics
from dplang.evaluation import registry as reg
from dplang.evaluation.data import EvaluationError
from dplang.evaluation.downstream import (
    DEFAULT_BOOTSTRAP,
    DOWNSTREAM_SEED,
    LabelledTexts,
    bootstrap_interval,
    check_disjoint,
    downstream_table,
    fit_and_score,
)
from dplang.evaluation.embedders import HashingEmbedder

_TOPICS = {
    "food": ["pizza", "pasta", "sushi", "burger", "dessert", "waiter", "menu", "sauce"],
    "hotel": ["room", "bed", "pillow", "lobby", "checkin", "suite", "shower", "balcony"],
    "auto": ["mechanic", "brakes", "engine", "oil", "tires", "garage", "battery", "clutch"],
}
_FILLER = ["the", "was", "really", "quite", "and", "but", "very", "our", "we", "it"]


def informative(n: int, seed: int) -> LabelledTexts:
    """Texts whose topic words give their label away."""
    rng = random.Random(seed)
    texts, labels = [], []
    for i in range(n):
        label = sorted(_TOPICS)[i % 3]
        words = [rng.choice(_TOPICS[label]) for _ in range(3)] + rng.sample(_FILLER, 5)
        rng.shuffle(words)
        texts.append(" ".join(words))
        labels.append(label)
    return LabelledTexts.of(f"informative{seed}", texts, labels)


def noise(n: int, seed: int) -> LabelledTexts:
    """Random strings with labels drawn independently of them."""
    rng = random.Random(seed)
    texts = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(40))
             for _ in range(n)]
    labels = [rng.choice(["a", "b"]) for _ in range(n)]
    return LabelledTexts.of(f"noise{seed}", texts, labels)


def test_informative_texts_score_high() -> None:
    result = downstream_table(informative(300, 2), [informative(150, 1)], embedder="hashing",
                              resamples=200)
    row = result["rows"][0]
    assert row["accuracy"]["mean"] > 0.9
    assert row["macro_f1"]["mean"] > 0.9
    assert row["accuracy"]["low"] <= row["accuracy"]["mean"] <= row["accuracy"]["high"]


def test_label_free_noise_scores_at_chance() -> None:
    result = downstream_table(noise(400, 2), [noise(200, 1)], embedder="hashing", resamples=300)
    acc = result["rows"][0]["accuracy"]
    assert 0.4 < acc["mean"] < 0.6
    assert acc["low"] < 0.5 < acc["high"]  # the interval covers chance


def test_synthetic_floor_ceiling_layout() -> None:
    test = informative(120, 9)
    result = downstream_table(test, [noise(60, 1)], embedder="hashing",
                              ceiling=informative(200, 3), floor=[noise(60, 4)], resamples=100)
    roles = [(r["role"], r["n_train"]) for r in result["rows"]]
    assert roles == [("synthetic", 60), ("floor", 60), ("ceiling", 60)]  # "as many" real texts
    ceiling = result["rows"][2]["accuracy"]["mean"]
    assert ceiling > 0.85
    assert result["test"]["n"] == 120


def test_overlap_between_test_and_ceiling_or_references_is_refused() -> None:
    test = informative(30, 5)
    leaky = LabelledTexts.of("leaky", [*test.texts[:3], *informative(40, 6).texts],
                             [*test.labels[:3], *informative(40, 6).labels])
    with pytest.raises(EvaluationError, match="disjoint"):
        downstream_table(test, [informative(30, 1)], embedder="hashing", ceiling=leaky)
    with pytest.raises(EvaluationError, match="reference"):
        downstream_table(test, [informative(30, 1)], embedder="hashing",
                         references=[test.texts[7]])
    check_disjoint(test.texts, informative(30, 8).texts)  # disjoint: no error


def test_one_training_class_is_the_constant_classifier() -> None:
    emb = HashingEmbedder()
    train = informative(30, 1)
    score = fit_and_score(emb.embed(train.texts), ["food"] * 30, emb.embed(train.texts),
                          train.labels, resamples=50)
    assert score.trivial is not None
    assert score.accuracy == pytest.approx(1 / 3)


def test_macro_f1_is_scikit_learns() -> None:
    """The bincount macro-F1 equals scikit-learn's to the bit, classes never predicted or
    never true included."""
    from sklearn.metrics import f1_score

    from dplang.evaluation.downstream import _macro_f1

    rng = np.random.default_rng(3)
    for trial in range(200):
        classes = np.array(sorted(f"c{i}" for i in range(int(rng.integers(1, 7)))))
        n = int(rng.integers(1, 60))
        t = classes[rng.integers(0, classes.size, n)]
        p = classes[rng.integers(0, max(1, classes.size - trial % 3), n)]
        want = f1_score(t, p, labels=classes, average="macro", zero_division=0)
        assert _macro_f1(t, p, classes) == want, (t, p)


def test_bootstrap_interval_narrows_with_more_test_texts() -> None:
    rng = random.Random(0)

    def acc(t, p):
        return float((t == p).mean())

    small = [rng.random() < 0.7 for _ in range(50)]
    large = [rng.random() < 0.7 for _ in range(2000)]
    lo_s, hi_s = bootstrap_interval(small, [True] * 50, acc, resamples=300)
    lo_l, hi_l = bootstrap_interval(large, [True] * 2000, acc, resamples=300)
    assert hi_l - lo_l < (hi_s - lo_s) / 3
    assert lo_l < 0.7 < hi_l


def _write_run(path: Path, data: LabelledTexts, *, method: str = "invisibleink",
               reference_ids: list[list[int]] | None = None, data_path: Path | None = None
               ) -> Path:
    with open(path, "w", encoding="utf-8") as fh:
        for i, (text, label) in enumerate(zip(data.texts, data.labels, strict=True)):
            fh.write(json.dumps({"group": i, "text": text, "labels": {"cat": label},
                                 "reference_ids": (reference_ids or [[]] * len(data.texts))[i]})
                     + "\n")
    params = {"method": method, "data": str(data_path) if data_path else None}
    path.with_name(path.name.removesuffix(".jsonl") + ".manifest.json").write_text(
        json.dumps({"fingerprint": {"parameters": params}}))
    return path


def _write_real(path: Path, data: LabelledTexts) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "cat"])
        writer.writerows(zip(data.texts, data.labels, strict=True))
    return path


def test_downstream_is_a_registered_opt_in_metric() -> None:
    spec = reg.get_metric("downstream")
    assert "downstream" in reg.metric_names() and "downstream" not in reg.default_metrics()
    assert spec.higher_is_better == {"downstream_accuracy": True, "downstream_macro_f1": True}
    assert parse_metrics("Downstream,mauve") == ("mauve", "downstream")
    assert parse_metrics(None) == ("mauve", "perplexity", "length", "topk")


def _files(tmp_path: Path, n_real: int = 150, n_syn: int = 40) -> tuple[Path, Path, Path]:
    real = _write_real(tmp_path / "real.csv", informative(n_real, 7))
    syn = _write_run(tmp_path / "syn.jsonl", informative(n_syn, 1))
    pub = _write_run(tmp_path / "pub.jsonl", noise(n_syn, 2), method="public")
    return real, syn, pub


def test_registered_metric_gives_the_numbers_of_the_table_on_the_same_split(
        tmp_path: Path) -> None:
    """Through the harness, every run trains on its n generations, the ceiling on the first
    n held-out rows and the test set is the rows after them: the numbers are those of
    downstream_table on that split, computed here independently."""
    real, syn, pub = _files(tmp_path)
    result = evaluate_files(real, [syn, pub], metrics="downstream", label_column="cat",
                            embedder="hashing", out_dir=tmp_path / "out")
    held = informative(150, 7)
    expected = downstream_table(
        LabelledTexts.of("test", held.texts[40:], held.labels[40:]), [informative(40, 1)],
        floor=[noise(40, 2)], ceiling=LabelledTexts.of("c", held.texts[:40], held.labels[:40]),
        embedder="hashing", resamples=DEFAULT_BOOTSTRAP, seed=DOWNSTREAM_SEED)
    got = [result["runs"][0]["downstream"], result["runs"][1]["downstream"],
           result["real"]["downstream"]["ceiling"]]
    for mine, ref in zip(got, expected["rows"], strict=True):
        assert mine["role"] == ref["role"] and mine["n_train"] == ref["n_train"] == 40
        assert mine["accuracy"] == ref["accuracy"] and mine["macro_f1"] == ref["macro_f1"]
    assert result["real"]["downstream"]["test"] == {**expected["test"],
                                                    "name": "real (held-out test)"}
    assert result["runs"][0]["downstream"]["accuracy"]["mean"] > 0.9  # informative texts
    assert result["runs"][1]["downstream"]["accuracy"]["mean"] < 0.6  # label-free noise
    # a private run and a public-only one are not seeds of one configuration: no mean
    assert "downstream_accuracy" not in result["aggregate"]
    assert any("no mean over runs" in w for w in result["warnings"])
    out = tmp_path / "out"
    for name in ("downstream.md", "downstream.json", "metrics.json", "report.md"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600, name
    table = (out / "downstream.md").read_text()
    assert "| syn.jsonl | synthetic | 40 |" in table
    assert "| real (ceiling) | ceiling | 40 |" in table
    assert [r["role"] for r in json.loads((out / "downstream.json").read_text())["rows"]] == [
        "synthetic", "floor", "ceiling"]
    report = (out / "report.md").read_text()
    assert "downstream accuracy (%)" in report and "label column `cat`" in report


def test_num_and_test_num_select_the_split(tmp_path: Path) -> None:
    real, syn, _ = _files(tmp_path)
    result = evaluate_files(real, syn, metrics="downstream", label_column="cat",
                            embedder="hashing", num=30, test_num=50)
    assert result["runs"][0]["downstream"]["n_train"] == 30
    assert result["real"]["downstream"]["ceiling"]["n_train"] == 30
    assert result["real"]["downstream"]["test"]["n"] == 50
    with pytest.raises(EvaluationError, match="--test-num 200: only 120"):
        evaluate_files(real, syn, metrics="downstream", label_column="cat",
                       embedder="hashing", num=30, test_num=200)


def test_downstream_refusals(tmp_path: Path) -> None:
    real, syn, _ = _files(tmp_path)
    with pytest.raises(EvaluationError, match="label column"):
        evaluate_files(real, syn, metrics="downstream", embedder="hashing")
    with pytest.raises(EvaluationError, match="for --metrics downstream"):
        evaluate_files(real, syn, metrics="topk", label_column="cat")
    with pytest.raises(EvaluationError, match="in memory"):
        evaluate_texts(["a b c"] * 30, [["a b c"] * 30], metrics="downstream",
                       embedder="hashing")
    small = _write_real(tmp_path / "small.csv", informative(40, 7))
    with pytest.raises(EvaluationError, match="plus a test set"):
        evaluate_files(small, syn, metrics="downstream", label_column="cat", embedder="hashing")

    # the real file is the generation's data file and its row 60 (a test row) was a reference
    leaky = _write_run(tmp_path / "leaky.jsonl", informative(40, 1), data_path=real,
                       reference_ids=[[60 + i] for i in range(40)])
    with pytest.raises(EvaluationError, match="references"):
        evaluate_files(real, leaky, metrics="downstream", label_column="cat",
                       embedder="hashing")
    skipped = evaluate_files(real, leaky, metrics="downstream", label_column="cat",
                             embedder="hashing", exclude_references=True)
    assert skipped["real"]["downstream"]["test"]["n"] == 70
    assert skipped["real"]["downstream"]["excluded_references"] == 40  # in the test rows

    unlabelled = tmp_path / "unlabelled.jsonl"
    unlabelled.write_text("".join(json.dumps({"group": i, "text": "x", "labels": {}}) + "\n"
                                  for i in range(40)))
    with pytest.raises(EvaluationError, match="--group-by cat"):
        evaluate_files(real, unlabelled, metrics="downstream", label_column="cat",
                       embedder="hashing")
    blank = _write_real(tmp_path / "blank.csv", LabelledTexts.of(
        "b", informative(150, 7).texts, ["food"] * 100 + [""] + ["food"] * 49))
    with pytest.raises(EvaluationError, match="row 100 has no label"):
        evaluate_files(blank, syn, metrics="downstream", label_column="cat",
                       embedder="hashing")


def test_cli_downstream_goes_through_the_registry(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from dplang.cli.app import main

    real = _write_real(tmp_path / "real.csv", informative(100, 7))
    syn = _write_run(tmp_path / "syn.jsonl", informative(30, 1))
    out = tmp_path / "eval"
    args = ["evaluate", "--real", str(real), "--synthetic", str(syn), "--out", str(out),
            "--metrics", "downstream", "--embedder", "hashing"]
    assert main(args) == 2  # a usage error
    assert "--label-column" in capsys.readouterr().err
    assert main([*args[:-4], "--metrics", "topk", "--label-column", "cat"]) == 2
    assert "are for --metrics downstream" in capsys.readouterr().err
    assert main([*args, "--label-column", "cat", "--test-num", "50"]) == 0
    stdout = capsys.readouterr().out
    assert "syn.jsonl  n=30  synthetic  accuracy=" in stdout
    assert "real (ceiling)  n=30  ceiling  accuracy=" in stdout
    data = json.loads((out / "metrics.json").read_text())
    assert data["settings"]["metrics"] == ["downstream"]
    assert data["real"]["downstream"]["test"]["n"] == 50
    assert stat.S_IMODE((out / "downstream.json").stat().st_mode) == 0o600
    assert main([*args, "--label-column", "cat"]) != 0  # results exist: --overwrite needed
    assert "already exists" in capsys.readouterr().err


def test_a_test_text_among_the_ceilings_is_refused_before_any_metric_runs(
        tmp_path: Path) -> None:
    """The held-out split (ceiling's n rows, test rows after them) is known in ``prepare``:
    a test text that is also a ceiling text is refused there, before MAUVE (or any metric)
    embeds anything, not after the other metrics have run."""
    from dplang.evaluation.embedders import HashingEmbedder

    data = informative(150, 7)
    texts = list(data.texts)
    texts[100] = texts[0]  # a test row repeats a ceiling row
    real = _write_real(tmp_path / "real.csv", LabelledTexts.of("r", texts, data.labels))
    syn = _write_run(tmp_path / "syn.jsonl", informative(40, 1))

    class Counting(HashingEmbedder):
        calls = 0

        def embed(self, texts):
            Counting.calls += 1
            return super().embed(texts)

    with pytest.raises(EvaluationError, match="ceiling's real training"):
        evaluate_files(real, syn, metrics="mauve,downstream", label_column="cat",
                       embedder=Counting())
    assert Counting.calls == 0

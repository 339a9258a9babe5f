"""The quality-against-compute sweep: its config grammar (ε per method, B per ε, the
nonprivate ceiling, the public cell alone, interleaved batches, MAUVE's bootstrap, real texts
cut to T tokens), a toy sweep with the new metrics, and the shipped
experiments/yelp_quality*.toml preflighted on the real Yelp file."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

import dplang.cli.experiment as exp_cli
from dplang.cli.app import main
from dplang.experiments import ConfigError, load_config
from dplang.models import ToyModel

REPO = Path(__file__).resolve().parents[2]

#: The toy sweep of test_experiment.py.
CONFIG = (Path(__file__).parent / "toy_sweep.toml").read_text(encoding="utf-8")
GROUPED = ('prompt = "template.toml"', 'prompt = "template.toml"\ngroup_by = ["cat"]')


def _edit(text, *edits):
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    return text


@pytest.fixture
def setup(tmp_path, monkeypatch):
    (tmp_path / "template.toml").write_text(
        'private = "Review: {reference}\\nAnother review:"\npublic = "Another review:"\n')
    model = ToyModel(vocab_size=30, eos_after=None)
    monkeypatch.setattr(exp_cli, "_load_model", lambda spec, dtype="float32": model)
    monkeypatch.setattr(exp_cli, "_check_model", lambda spec: None)  # "toy" is no model path
    return tmp_path


def _write(tmp_path, *edits):
    cfg = tmp_path / "c.toml"
    cfg.write_text(_edit(CONFIG, *edits))
    return cfg


def test_epsilon_per_method_batch_size_per_epsilon_and_the_nonprivate_ceiling(tmp_path):
    cfg = _write(tmp_path,
                 ('methods = ["invisibleink"]', 'methods = ["invisibleink", "amin", "nonprivate"]'),
                 ("epsilon = [1, 10]", "epsilon = { invisibleink = [1, 10], amin = [10] }"),
                 ("batch_size = [2]", 'batch_size = { invisibleink = { "1" = [2], "10" = [2, 3] },'
                                      " amin = [4], nonprivate = [1, 2] }"),
                 ("top_k = [3, 5]", "top_k = [3]"))
    config = load_config(cfg)
    cells = sorted((c.method, c.epsilon, c.batch_size) for c in config.cells)
    assert cells == [("amin", 10.0, 4), ("invisibleink", 1.0, 2), ("invisibleink", 10.0, 2),
                     ("invisibleink", 10.0, 3), ("nonprivate", math.inf, 1),
                     ("nonprivate", math.inf, 2), ("public", 0.0, 0)]
    assert "nonprivate_epsinf_B2_k3_t1_r0" in {c.key for c in config.cells}
    for edits, needle in [
        ((("epsilon = [1, 10]", "epsilon = { invisibleink = [1], amin = [10] }"),),
         "amin"),  # amin is not in [sweep].methods here
        ((('methods = ["invisibleink"]', 'methods = ["invisibleink", "nonprivate"]'),
          ("epsilon = [1, 10]", "epsilon = { invisibleink = [1], nonprivate = [3] }")),
         "nonprivate takes no privacy budget"),
        ((("batch_size = [2]", 'batch_size = { invisibleink = { "1" = [2] } }'),),
         "gives batch sizes for ε = 1 but [sweep].epsilon lists 1, 10"),
        ((("batch_size = [2]", 'batch_size = { invisibleink = { "one" = [2] } }'),),
         "is not an ε"),
        ((('embedder = "hashing"', 'embedder = "hashing"\nmauve_bootstrap = 1'),),
         "mauve_bootstrap"),
        ((('prompt = "template.toml"', 'prompt = "template.toml"\nbatch_order = "random"'),),
         "[data].batch_order must be one of grouped, interleaved"),
    ]:
        with pytest.raises(ConfigError) as info:
            load_config(_write(tmp_path, *edits))
        assert needle in str(info.value), (needle, str(info.value))


def test_the_public_cell_alone(tmp_path):
    config = load_config(_write(tmp_path, ('methods = ["invisibleink"]', "methods = []"),
                                ("epsilon = [1, 10]\n", ""), ("batch_size = [2]\n", "")))
    assert [c.key for c in config.cells] == ["public_k3_t1_r0", "public_k5_t1_r0"]
    with pytest.raises(ConfigError, match="methods must not be empty"):
        load_config(_write(tmp_path, ('methods = ["invisibleink"]', "methods = []"),
                           ("public_baseline = true", "public_baseline = false")))


def test_a_toy_sweep_with_the_ceiling_and_the_new_metrics(setup):
    """Grouped, interleaved generation with InvisibleInk, the nonprivate ceiling and the
    public cell, evaluated by the classifier test, the label mix and MAUVE with its bootstrap:
    every cell's labels follow the groups in proportion, and results.csv has the intervals."""
    tmp = setup
    rows = ["text,cat"] + [f"review {i}: {'the pizza' if i % 3 else 'the hotel'} was fine,"
                           f"{'food' if i % 3 else 'hotel'}" for i in range(100)]
    (tmp / "data.csv").write_text("\n".join(rows) + "\n")
    cfg = tmp / "exp.toml"
    cfg.write_text(_edit(CONFIG, GROUPED, ("real = [60, 90]", "real = [60, 100]"),
                         ('prompt = "template.toml"',
                          'prompt = "template.toml"\nbatch_order = "interleaved"'),
                         ('methods = ["invisibleink"]', 'methods = ["invisibleink", "nonprivate"]'),
                         ("epsilon = [1, 10]", "epsilon = { invisibleink = [10] }"),
                         ("top_k = [3, 5]", "top_k = [3]"),
                         ('metrics = ["mauve", "topk"]',
                          'metrics = ["mauve", "classifier", "labels", "topk"]\n'
                          "mauve_bootstrap = 3\nnum_buckets = 2")))
    out = tmp / "out"
    assert main(["experiment", str(cfg), "--out", str(out)]) == 0
    with open(out / "results.csv") as fh:
        results = {r["method"]: r for r in csv.DictReader(fh)}
    assert set(results) == {"invisibleink", "nonprivate", "public"}
    assert results["nonprivate"]["epsilon"] == "inf"
    for r in results.values():
        assert float(r["mauve_low"]) <= float(r["mauve_high"])
        assert float(r["classifier_auc_low"]) <= float(r["classifier_auc_high"])
        # references rows 0-59: 40 food, 20 hotel -> batches of 2 in proportion; real 60-99
        assert float(r["label_tvd"]) < 0.2
    md = (out / "results.md").read_text()
    assert "Two-sample classifier AUC" in md and "Label mix" in md and "| inf |" in md
    assert (out / "classifier_vs_compute.png").stat().st_size > 0
    manifest = json.loads(next(out.glob("cells/nonprivate*/gen.manifest.json")).read_text())
    assert "NOT PRIVATE" in manifest["guarantee_summary"]
    spec = json.loads(next(out.glob("cells/invisibleink*/cell.private.json")).read_text())
    assert spec["generation"]["batch_order"] == "interleaved"
    assert spec["evaluation"]["mauve_bootstrap"] == 3


def test_the_yelp_quality_config_is_ready(tmp_path):
    """experiments/yelp_quality.toml (not run here) has the planned cells, and on
    the real Yelp file, when it is there, passes the whole preflight (every cell's request,
    the ranges, 500 grouped batches of every B) and the held-out rows pass the downstream
    check; experiments/yelp_quality_public.toml is its public cell alone, with the same
    record (so the sweep skips a public cell made by it)."""
    from dplang.experiments.sweep import cell_spec, preflight, split_data
    from dplang.textgen.batching import make_batches

    config = load_config(REPO / "experiments" / "yelp_quality.toml")
    assert config.num >= 500 and config.max_tokens == 64
    assert {c.temperature for c in config.cells} == {1.2}
    assert config.group_by == ("label1", "label2") and config.batch_order == "interleaved"
    assert config.references[1] <= config.real[0]  # disjoint
    assert config.real[1] - config.real[0] > config.num  # downstream: ceiling + test set
    assert set(config.metrics) >= {"mauve", "classifier", "labels", "downstream"}
    assert config.mauve_bootstrap >= 100 and config.real_max_tokens == config.max_tokens
    points = {(c.method, c.epsilon, c.batch_size) for c in config.cells}
    assert {(m, e) for m, e, _ in points} == {
        ("public", 0.0), ("nonprivate", math.inf), ("invisibleink", 1.0), ("invisibleink", 3.0),
        ("invisibleink", 10.0), ("augpe", 3.0), ("augpe", 10.0), ("amin", 10.0),
        ("adapmixed", 10.0)}
    assert ("invisibleink", 1.0, 7) in points  # the paper's B at ε = 1
    public = load_config(REPO / "experiments" / "yelp_quality_public.toml")
    assert [c.key for c in public.cells] == ["public_k50_t1.2_s0"]
    # the stages experiments/run_quality.sh runs first are cells of the full sweep, each with
    # the full sweep's record of it (so the full sweep skips them, and refuses none)
    full = {c.key: c for c in config.cells}
    for stage in ("yelp_quality_first", "yelp_quality_second"):
        staged = load_config(REPO / "experiments" / f"{stage}.toml")
        assert staged.cells, stage
        for cell in staged.cells:
            assert cell_spec(staged, cell, "x") == cell_spec(config, full[cell.key], "x"), \
                (stage, cell.key)
    if not config.data_path.is_file():
        pytest.skip("the Yelp data (../shared/data/yelp/dev.csv) is not beside this clone")
    _, specs, states = preflight(config, tmp_path / "out", tmp_path / "ledger.sqlite", None)
    assert set(states.values()) == {"new"} and not (tmp_path / "out").exists()
    assert specs["public_k50_t1.2_s0"] == cell_spec(public, public.cells[0], "x") | {
        "generation": {**cell_spec(public, public.cells[0], "x")["generation"],
                       "data_sha256": specs["public_k50_t1.2_s0"]["generation"]["data_sha256"]}}
    _refs, real = split_data(config, tmp_path / "split")
    from dplang.evaluation.downstream import check_real_file

    check_real_file(real, config.num, "label1")
    check_real_file(real, config.num, "label2")
    # the first 500 batches hold every (category, stars) group in proportion
    from dplang.io import Record, read_records

    labels = [Record(r.index, None, r.labels)
              for r in read_records(config.data_path, "text", config.group_by)
              if r.index < config.references[1]]
    for b in sorted({c.batch_size for c in config.cells if c.method != "public"}):
        batches = make_batches(labels, b, config.num, config.group_by, order="interleaved")
        cats = {x.labels["label1"] for x in batches}
        assert len(batches) == config.num and len(cats) == 10, b

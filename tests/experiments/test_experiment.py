import csv

import pytest

import dplang.cli.experiment as exp_cli
from dplang.cli.app import main
from dplang.experiments import ConfigError, load_config
from dplang.models import ToyModel

CONFIG = """
name = "toy-sweep"
[data]
path = "data.csv"
references = [0, 60]
real = [60, 90]
prompt = "template.toml"
[generation]
model = "toy"
max_tokens = 6
num = 20
concurrent_groups = 4
[sweep]
methods = ["invisibleink"]
epsilon = [1, 10]
batch_size = [2]
top_k = [3, 5]
temperature = [1.0]
seeds = [0]
public_baseline = true
[evaluation]
metrics = ["mauve", "topk"]
embedder = "hashing"
"""


@pytest.fixture
def setup(tmp_path, monkeypatch):
    rows = ["text"] + [f"sentence {i} about food and {'service' if i % 3 else 'prices'}"
                       for i in range(100)]
    (tmp_path / "data.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "template.toml").write_text(
        'private = "Review: {reference}\\nAnother review:"\npublic = "Another review:"\n')
    (tmp_path / "exp.toml").write_text(CONFIG)
    model = ToyModel(vocab_size=30, eos_after=None)
    calls = []

    def load(spec, dtype="float32"):
        calls.append(spec)
        return model

    monkeypatch.setattr(exp_cli, "_load_model", load)
    return tmp_path, calls


def test_sweep_runs_resumes_and_writes_tables(setup, capsys):
    tmp, calls = setup
    out = tmp / "out"
    assert main(["experiment", str(tmp / "exp.toml"), "--out", str(out)]) == 0
    with open(out / "results.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 4 + 2
    inv = [r for r in rows if r["method"] == "invisibleink"]
    assert {(r["epsilon"], r["top_k"]) for r in inv} == {("1.0", "3"), ("1.0", "5"),
                                                          ("10.0", "3"), ("10.0", "5")}
    for r in inv:
        assert float(r["effective_k"]) >= float(r["top_k"])
        assert 0.0 < float(r["mauve"]) <= 1.0
        assert r["calls_per_token"] == "3"
    # larger ε ⇒ larger clip ⇒ larger margin ⇒ effective k no smaller
    eff = {(r["epsilon"], r["top_k"]): float(r["effective_k"]) for r in inv}
    assert eff[("10.0", "5")] >= eff[("1.0", "5")]
    md = (out / "results.md").read_text()
    assert "Table 2 layout" in md and "Table 12 layout" in md and "| ε | B | C |" in md
    assert "Public-only generation" in md and "sequential" in md
    for png in ("utility_vs_epsilon.png", "utility_vs_compute.png",
                "effective_k_vs_epsilon.png"):
        assert (out / png).stat().st_size > 0
    refs = (out / "data" / "references.jsonl").read_text().splitlines()
    real = (out / "data" / "real.jsonl").read_text().splitlines()
    assert len(refs) == 60 and len(real) == 30 and not set(refs) & set(real)
    from dplang.privacy.ledger import PrivacyLedger

    spent = PrivacyLedger(out / "ledger.sqlite").spent(str((out / "data" /
                                                            "references.jsonl").resolve()))
    assert spent.releases == 4  # each private cell charged; the public cells cost nothing
    assert spent.rho == pytest.approx(sum(float(r["rho"]) for r in inv))
    calls.clear()
    capsys.readouterr()
    assert main(["experiment", str(tmp / "exp.toml"), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.count("done, skipped") == 6 and not calls


def test_report_only_runs_nothing(setup, capsys):
    tmp, calls = setup
    out = tmp / "out"
    assert main(["experiment", str(tmp / "exp.toml"), "--out", str(out), "--report-only"]) == 0
    err = capsys.readouterr().err
    assert err.count("not finished") == 6 and not calls
    assert (out / "results.csv").read_text().count("\n") == 1  # header only


def test_config_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(CONFIG.replace("real = [60, 90]", "real = [50, 90]"))
    with pytest.raises(ConfigError, match="overlap"):
        load_config(bad)
    bad.write_text(CONFIG.replace('methods = ["invisibleink"]', 'methods = ["magic"]'))
    with pytest.raises(ConfigError, match="unknown method"):
        load_config(bad)
    assert main(["experiment", str(tmp_path / "nope.toml"), "--out", str(tmp_path / "o")]) == 2


def test_per_method_batch_sizes(tmp_path):
    two = 'methods = ["invisibleink", "amin"]'
    cfg = tmp_path / "c.toml"
    cfg.write_text(CONFIG.replace('methods = ["invisibleink"]', two)
                   .replace("batch_size = [2]",
                            "batch_size = { invisibleink = [2, 3], amin = [5] }")
                   .replace("top_k = [3, 5]", "top_k = [3]"))
    cells = load_config(cfg).cells
    pairs = sorted({(c.method, c.batch_size) for c in cells})
    assert pairs == [("amin", 5), ("invisibleink", 2), ("invisibleink", 3), ("public", 0)]
    assert len(cells) == 2 * 3 + 1  # ε ∈ {1, 10} × 3 (method, B) pairs + public
    cfg.write_text(CONFIG.replace("batch_size = [2]", "batch_size = { amin = [5] }"))
    with pytest.raises(ConfigError, match="not in"):
        load_config(cfg)
    cfg.write_text(CONFIG.replace('methods = ["invisibleink"]', two)
                   .replace("batch_size = [2]", "batch_size = { amin = [5] }"))
    with pytest.raises(ConfigError, match="no entry for invisibleink"):
        load_config(cfg)


def test_generation_options_and_compute_accounting(tmp_path):
    from dplang.experiments.config import calls_per_token

    cfg = tmp_path / "c.toml"
    both = 'methods = ["invisibleink", "augpe"]'
    cfg.write_text(CONFIG.replace('methods = ["invisibleink"]', both)
                   .replace("concurrent_groups = 4", 'concurrent_groups = 4\ndtype = "bfloat16"\n'
                            "augpe_iterations = 2\naugpe_variations = 4")
                   .replace('embedder = "hashing"', 'embedder = "hashing"\nnum_buckets = 3'))
    config = load_config(cfg)
    assert config.dtype == "bfloat16" and config.num_buckets == 3
    calls = {c.method: calls_per_token(c, config) for c in config.cells}
    # B + 1 rows per token; Aug-PE: one sample plus L variations in each of T iterations
    assert calls == {"invisibleink": 3, "augpe": 1 + 4 * 2, "public": 1}
    for bad, match in (('dtype = "bfloat16"', 'dtype = "float16"'),
                       ("num_buckets = 3", "num_buckets = 1"),
                       ("augpe_iterations = 2", "augpe_iterations = 0")):
        cfg.write_text(cfg.read_text().replace(bad, match))
        with pytest.raises(ConfigError):
            load_config(cfg)
        cfg.write_text(cfg.read_text().replace(match, bad))
    assert load_config(cfg).dtype == "bfloat16"


def test_baseline_cells_are_evaluated_without_topk(setup):
    """Top-k+ statistics exist only for InvisibleInk: a baseline cell drops the metric instead
    of failing the sweep."""
    tmp, _calls = setup
    cfg = tmp / "exp.toml"
    two = 'methods = ["invisibleink", "amin"]'
    cfg.write_text(CONFIG.replace('methods = ["invisibleink"]', two)
                   .replace("epsilon = [1, 10]", "epsilon = [10]")
                   .replace("top_k = [3, 5]", "top_k = [3]"))
    out = tmp / "out"
    assert main(["experiment", str(cfg), "--out", str(out)]) == 0
    with open(out / "results.csv") as fh:
        rows = {r["method"]: r for r in csv.DictReader(fh)}
    assert rows["amin"]["effective_k"] == "" and float(rows["amin"]["mauve"]) > 0
    assert float(rows["invisibleink"]["effective_k"]) >= 3

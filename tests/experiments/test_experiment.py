import csv
import json
import time
from pathlib import Path

import pytest

import dplang.cli.experiment as exp_cli
from dplang.cli.app import main
from dplang.experiments import ConfigError, load_config
from dplang.models import ToyModel

#: The toy sweep both experiment test files start from.
CONFIG = (Path(__file__).parent / "toy_sweep.toml").read_text(encoding="utf-8")


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
    monkeypatch.setattr(exp_cli, "_check_model", lambda spec: None)  # "toy" is no model path
    return tmp_path, calls


def test_sweep_runs_resumes_and_writes_tables(setup, capsys):
    tmp, calls = setup
    out = tmp / "out"
    before = time.time()
    assert main(["experiment", str(tmp / "exp.toml"), "--out", str(out)]) == 0
    after = time.time()
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
    assert len(refs) == len(set(refs)) == 60 and len(real) == 30 and not set(refs) & set(real)
    # the copies of private rows are private from creation
    for f in ("references.jsonl", "real.jsonl"):
        assert oct((out / "data" / f).stat().st_mode & 0o777) == "0o600"
    assert oct((out / "data").stat().st_mode & 0o777) == "0o700"
    # each private cell: a fresh secret seed in its own mode-600 side file, never in public
    seeds = set()
    for r in inv:
        key = f"invisibleink_eps{float(r['epsilon']):g}_B2_k{r['top_k']}_t1_r0"
        side = out / "cells" / key / ".dplang-private" / "gen.private.json"
        assert oct(side.stat().st_mode & 0o777) == "0o600"
        seed = json.loads(side.read_text())["seed"]
        seeds.add(seed)
        assert str(seed) not in (out / "cells" / key / "gen.manifest.json").read_text()
        assert str(seed) not in (out / "results.csv").read_text() + md
    assert len(seeds) == 4 and all(s.bit_length() > 64 for s in seeds)
    # only the releases and their public manifests are world-readable: every evaluation file
    # (digest, counts and statistics of the held-out rows), timing and result is mode 600,
    # and no public manifest holds an end time or a duration (timing side channel)
    public = {p.relative_to(out).as_posix() for p in out.rglob("*")
              if p.is_file() and p.stat().st_mode & 0o077}
    assert public and all(p.endswith(("/gen.jsonl", "/gen.manifest.json")) for p in public)
    for name in ("results.csv", "results.md", "utility_vs_epsilon.png"):
        assert oct((out / name).stat().st_mode & 0o777) == "0o600"
    for p in out.rglob("*.manifest.json"):
        doc = json.loads(p.read_text())
        assert not {"finished", "gen_seconds", "cpu_seconds", "wall_clock_seconds"} & set(doc)
    # every private cell states the sweep's start, in its manifest and its files' times: a
    # cell's own start minus the one before it would be that cell's duration on private rows
    manifests = [p for p in out.glob("cells/invisibleink*/gen.manifest.json")]
    started = {json.loads(p.read_text())["started"] for p in manifests}
    times = {int(q.stat().st_mtime) for p in manifests for q in (p, p.with_name("gen.jsonl"))}
    assert len(manifests) == 4 and len(started) == 1 and before <= started.pop() <= after
    assert len(times) == 1
    assert {r["seed"] for r in inv} == {"secret"}
    assert "fresh secret seed" in md and "No privacy guarantee" not in md
    # the sweep charged the user's ledger under the data's name, not a ledger of its own
    from dplang.privacy.ledger import PrivacyLedger

    assert not (out / "ledger.sqlite").exists()
    spent = PrivacyLedger().spent(str((tmp / "data.csv").resolve()))
    assert spent.releases == 4  # each private cell charged; the public cells cost nothing
    assert spent.rho == pytest.approx(sum(float(r["rho"]) for r in inv))
    assert f"ρ = {spent.rho:.4g}" in md
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


def test_written_seeds_are_toy_runs_everywhere(setup, capsys):
    """Seeds written in the config are not secret: its cells are toy runs, and say so
    everywhere — the terminal, results.md, every cell's public manifest (``toy_run``, the
    guarantee's ``public_seed`` and a summary that promises nothing) and the ledger (recorded
    as toy runs, outside every DP total) — and a dataset with a budget refuses the sweep
    before anything is generated."""
    tmp, _calls = setup
    cfg = tmp / "exp.toml"
    cfg.write_text(CONFIG.replace("public_baseline = true", "seeds = [7]\npublic_baseline = false")
                   .replace("epsilon = [1, 10]", "epsilon = [1]"))
    from dplang.privacy.ledger import PrivacyLedger

    ledger = PrivacyLedger()
    out = tmp / "out"
    assert main(["experiment", str(cfg), "--out", str(out), "--dataset", "toy-corpus"]) == 0
    err = capsys.readouterr().err
    assert "warning: this configuration writes its seeds" in err and "toy runs" in err
    md = (out / "results.md").read_text()
    assert "No privacy guarantee" in md and "toy runs" in md
    cell = out / "cells" / "invisibleink_eps1_B2_k3_t1_s7"
    side = json.loads((cell / ".dplang-private" / "gen.private.json").read_text())
    assert side["seed"] == 7 and side["dataset"] == "toy-corpus"
    manifest = json.loads((cell / "gen.manifest.json").read_text())
    assert manifest["guarantee"]["public_seed"] is True and "toy_run" in manifest
    assert manifest["guarantee_summary"].startswith("TOY RUN")
    assert "NO privacy guarantee" in manifest["guarantee_summary"]
    spent = ledger.spent("toy-corpus")
    assert spent.releases == 2 and spent.toy == 2 and spent.dp_releases == 0
    assert spent.rho == 0  # not summed into any DP total
    assert all(r["guarantee"]["public_seed"] for r in ledger.releases("toy-corpus"))
    assert main(["ledger", "show", "toy-corpus"]) == 0
    shown = capsys.readouterr().out
    assert "TOY RUNS        2 release(s)" in shown and "TOY RUN (public seed, not DP)" in shown
    # a dataset with a budget refuses toy runs: the whole sweep, before any cell runs
    ledger.set_budget("other", 1.5, 1e-6)
    code = main(["experiment", str(cfg), "--out", str(tmp / "o2"), "--dataset", "other", "-q"])
    assert code == 3 and "toy runs" in capsys.readouterr().err
    assert ledger.spent("other").releases == 0 and not (tmp / "o2" / "cells").exists()


def test_seeds_and_replicates(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(CONFIG.replace("public_baseline = true",
                                  "replicates = 2\npublic_baseline = true"))
    config = load_config(cfg)
    assert not config.written_seeds and {c.seed for c in config.cells} == {None}
    assert {c.key.rsplit("_", 1)[1] for c in config.cells} == {"r0", "r1"}
    assert len(config.cells) == 2 * (4 + 2)
    cfg.write_text(CONFIG.replace("public_baseline = true", "seeds = [3]\nreplicates = 2"))
    with pytest.raises(ConfigError, match="not both"):
        load_config(cfg)
    cfg.write_text(CONFIG.replace("public_baseline = true", "replicates = 0"))
    with pytest.raises(ConfigError, match="replicates"):
        load_config(cfg)


def _small(config: str) -> str:
    """One private cell and the public one (fast)."""
    return (config.replace("epsilon = [1, 10]", "epsilon = [10]")
            .replace("top_k = [3, 5]", "top_k = [3]"))


def test_a_changed_generation_setting_is_refused_not_relabelled(setup, capsys):
    """The cell key covers everything that determines the result. Rerunning into
    the same --out with another max_tokens (or other rows, model, dtype, prompt file...)
    refuses, naming what changed, before any model loads; nothing is charged or written."""
    from dplang.privacy.ledger import PrivacyLedger

    tmp, calls = setup
    cfg = tmp / "exp.toml"
    cfg.write_text(_small(CONFIG))
    out = tmp / "out"
    assert main(["experiment", str(cfg), "--out", str(out)]) == 0
    capsys.readouterr()
    spent = PrivacyLedger().spent(str((tmp / "data.csv").resolve())).releases
    before = sorted(str(p) for p in out.rglob("*"))
    for old, new, needle in (("max_tokens = 6", "max_tokens = 7", "max_tokens: 6 → 7"),
                             ("references = [0, 60]", "references = [0, 50]", "references"),
                             ('model = "toy"', 'model = "toy2"', "model"),
                             ("concurrent_groups = 4",
                              'concurrent_groups = 4\ndtype = "float32"', "dtype")):
        cfg.write_text(_small(CONFIG).replace(old, new))
        calls.clear()
        code = main(["experiment", str(cfg), "--out", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and needle in err and "new --out" in err, err
        assert err.count("\n") == 1 and not calls
    # a changed template file is a changed prompt
    cfg.write_text(_small(CONFIG))
    (tmp / "template.toml").write_text(
        'private = "Text: {reference}\\nAnother text:"\npublic = "Another text:"\n')
    assert main(["experiment", str(cfg), "--out", str(out)]) == 2
    assert "prompt" in capsys.readouterr().err
    assert sorted(str(p) for p in out.rglob("*")) == before
    assert PrivacyLedger().spent(str((tmp / "data.csv").resolve())).releases == spent
    # --overwrite generates the changed cells anew: a new release, charged anew
    cfg.write_text(_small(CONFIG).replace("max_tokens = 6", "max_tokens = 7"))
    assert main(["experiment", str(cfg), "--out", str(out), "--overwrite"]) == 0
    assert capsys.readouterr().err.count("generating anew (--overwrite)") == 2
    assert PrivacyLedger().spent(str((tmp / "data.csv").resolve())).releases == spent + 1
    for gen in out.glob("cells/*/gen.jsonl"):
        assert all(json.loads(line)["num_tokens"] == 7 for line in gen.read_text().splitlines())
    assert main(["experiment", str(cfg), "--out", str(out)]) == 0
    assert capsys.readouterr().err.count("done, skipped") == 2


def test_a_changed_evaluation_setting_re_evaluates(setup, capsys):
    """Evaluation settings are part of the key too, but they cost no privacy: the cells are
    re-evaluated with the new settings (nothing regenerated, nothing charged)."""
    from dplang.privacy.ledger import PrivacyLedger

    tmp, _calls = setup
    cfg = tmp / "exp.toml"
    cfg.write_text(_small(CONFIG))
    out = tmp / "out"
    assert main(["experiment", str(cfg), "--out", str(out)]) == 0
    gen = {p: p.read_bytes() for p in out.glob("cells/*/gen.jsonl")}
    spent = PrivacyLedger().spent(str((tmp / "data.csv").resolve())).releases
    cfg.write_text(_small(CONFIG).replace('metrics = ["mauve", "topk"]', 'metrics = ["topk"]'))
    capsys.readouterr()
    assert main(["experiment", str(cfg), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.count("re-evaluating") == 2 and "done, skipped" not in err
    for path in out.glob("cells/*/eval/metrics.json"):
        assert "mauve" not in json.loads(path.read_text())["runs"][0]
    assert {p: p.read_bytes() for p in out.glob("cells/*/gen.jsonl")} == gen
    assert PrivacyLedger().spent(str((tmp / "data.csv").resolve())).releases == spent
    assert main(["experiment", str(cfg), "--out", str(out)]) == 0
    assert capsys.readouterr().err.count("done, skipped") == 2
    # a cell folder without its configuration record (an older dplang) is refused
    (next(out.glob("cells/invisibleink*")) / "cell.private.json").unlink()
    assert main(["experiment", str(cfg), "--out", str(out)]) == 2
    assert "older dplang" in capsys.readouterr().err


@pytest.mark.parametrize(("edit", "needle"), [
    (("[generation]", "[generation]\nfoo = 1"), "[generation].foo"),
    (("[data]", "[data]\ncolumn = 'text'"), "[data].column"),
    (('name = "toy-sweep"', 'name = "toy-sweep"\nextra = true'), "unknown key extra"),
    (("max_tokens = 6", 'max_tokens = "six"'), "[generation].max_tokens"),
    (("epsilon = [1, 10]", "epsilon = [1, 1e308]"), "ε ≤ 100"),
    (("metrics = [\"mauve\", \"topk\"]", "metrics = [\"bleu\"]"), "[evaluation].metrics"),
])
def test_config_values_are_checked_by_name(tmp_path, edit, needle):
    (tmp_path / "data.csv").write_text("text\na\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text(CONFIG.replace(*edit))
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(("old", "new", "needle"), [
    ("batch_size = [2]", "batch_size = [2, 200]", "need 4000 references"),
    ("real = [60, 90]", "real = [60, 200]", "has 100 data rows"),
    ("num = 20", "num = 31", "need 62 references"),
    ('prompt = "template.toml"', 'prompt = "yelp"', "--group-by"),
    # the evaluation's sizes too: else the first cell is charged and published, and the
    # sweep stops at its evaluation
    ("real = [60, 90]", "real = [60, 70]", "[data].real holds 10 rows"),
    ("num = 20", "num = 10", "MAUVE needs at least 20 texts"),
])
def test_every_cell_is_checked_before_any_model_loads(setup, capsys, old, new, needle):
    """A bad cell anywhere in the sweep fails the run before the first model load: no cell
    folder, no data copy, no charge (today a bad config failed after a load, five times)."""
    from dplang.privacy.ledger import PrivacyLedger

    tmp, calls = setup
    cfg = tmp / "exp.toml"
    cfg.write_text(CONFIG.replace(old, new))
    out = tmp / "out"
    code = main(["experiment", str(cfg), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and err.count("\n") == 1, err
    assert not calls and not out.exists()
    assert PrivacyLedger().spent(str((tmp / "data.csv").resolve())).releases == 0


def test_shipped_configs_load_and_resolve_from_a_clone(tmp_path):
    """experiments/*.toml have only known keys, valid values and a data path that resolves
    from a clone of the repository that sits beside shared/ (as DESIGN.md lays it out)."""
    import shutil
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    clone = tmp_path / "clone"
    shutil.copytree(repo / "experiments", clone / "experiments")
    (clone / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    data = tmp_path / "shared" / "data" / "yelp" / "dev.csv"
    data.parent.mkdir(parents=True)
    data.write_text("text,label1,label2\nnice,a,b\n")
    configs = sorted((clone / "experiments").glob("*.toml"))
    shipped = [c for c in configs if "[data]" in c.read_text()]
    assert len(shipped) >= 4
    for path in shipped:
        config = load_config(path)
        assert config.data_path == data.resolve(), path.name
        assert Path(config.prompt).is_file()


DOWNSTREAM = (('metrics = ["mauve", "topk"]', 'metrics = ["downstream", "topk"]\n'
               'label_column = "cat"'),
              ('prompt = "template.toml"', 'prompt = "template.toml"\ngroup_by = ["cat"]'),
              ("real = [60, 90]", "real = [60, 100]"))


def _edit(text, *edits):
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    return text


@pytest.mark.parametrize(("edits", "needle"), [
    ((*DOWNSTREAM[:1], (', "topk"]\nlabel_column = "cat"', ', "topk"]'), *DOWNSTREAM[1:]),
     "[evaluation].label_column is required by the downstream metric"),
    ((*DOWNSTREAM[:1], ("\nlabel_column", "\nlabel_columns"), *DOWNSTREAM[1:]),
     "unknown key [evaluation].label_columns"),
    ((*DOWNSTREAM[:1], ('label_column = "cat"', "label_column = 3"), *DOWNSTREAM[1:]),
     "[evaluation].label_column must be a column name"),
    (DOWNSTREAM[:1] + DOWNSTREAM[2:], "is not a [data].group_by column"),
    ((*DOWNSTREAM[:2], ("real = [60, 90]", "real = [60, 80]")),
     "[data].real holds 20 rows: downstream needs more than [generation].num = 20"),
    (((DOWNSTREAM[0][0], 'metrics = ["topk"]\nlabel_column = "cat"'), *DOWNSTREAM[1:]),
     "[evaluation].label_column is for the downstream metric"),
])
def test_downstream_config_is_checked_up_front(tmp_path, edits, needle):
    (tmp_path / "data.csv").write_text("text,cat\na,x\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text(_edit(CONFIG, *edits))
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    assert needle in str(info.value) and "\n" not in str(info.value)
    cfg.write_text(_edit(CONFIG, *DOWNSTREAM))
    config = load_config(cfg)
    assert config.label_column == "cat" and config.metrics == ("downstream", "topk")


def test_config_metrics_are_the_registered_ones(tmp_path):
    """[evaluation].metrics is checked against the metric registry, which names the metrics
    (the config keeps no list of its own), and defaults to the registry's sweep metrics."""
    import re

    from dplang.evaluation.registry import metric_names, sweep_metrics

    cfg = tmp_path / "c.toml"
    cfg.write_text(CONFIG.replace('metrics = ["mauve", "topk"]', 'metrics = ["bleu"]'))
    with pytest.raises(ConfigError, match=re.escape(", ".join(metric_names()))):
        load_config(cfg)
    cfg.write_text(CONFIG.replace('metrics = ["mauve", "topk"]\n', ""))
    assert load_config(cfg).metrics == sweep_metrics() == ("mauve", "length", "topk")


def test_sweep_with_the_downstream_metric(setup):
    """A small end-to-end sweep on toy texts: conditional generation grouped by a public label,
    every cell evaluated by the registered downstream metric; the public cell is the floor, the
    ceiling is trained on real texts whose words give the label away."""
    tmp, _calls = setup
    rows = ["text,cat"] + [
        f"review {i}: {'the pizza and pasta' if i % 2 else 'the hotel room and bed'} "
        f"{'were tasty' if i % 3 else 'were fine'} today,{'food' if i % 2 else 'hotel'}"
        for i in range(100)]
    (tmp / "data.csv").write_text("\n".join(rows) + "\n")
    cfg = tmp / "exp.toml"
    cfg.write_text(_edit(CONFIG, *DOWNSTREAM, ("epsilon = [1, 10]", "epsilon = [10]"),
                         ("top_k = [3, 5]", "top_k = [3]")))
    out = tmp / "out"
    assert main(["experiment", str(cfg), "--out", str(out)]) == 0
    with open(out / "results.csv") as fh:
        results = {r["method"]: r for r in csv.DictReader(fh)}
    for r in results.values():
        assert 0.0 <= float(r["downstream_accuracy_low"]) <= float(r["downstream_accuracy"]) \
            <= float(r["downstream_accuracy_high"]) <= 1.0
        assert float(r["downstream_ceiling"]) > 0.9  # real texts give the label away
    assert float(results["invisibleink"]["downstream_accuracy"]) < 0.9  # toy-model noise
    public = next(out.glob("cells/public*/eval"))
    layout = json.loads((public / "downstream.json").read_text())
    assert [r["role"] for r in layout["rows"]] == ["floor", "ceiling"]
    assert layout["test"]["n"] == 20 and layout["rows"][0]["n_train"] == 20
    assert oct((public / "downstream.md").stat().st_mode & 0o777) == "0o600"
    md = (out / "results.md").read_text()
    assert "Downstream accuracy (%)" in md and "Ceiling" in md
    assert (out / "downstream_vs_compute.png").stat().st_size > 0
    spec = json.loads(next(out.glob("cells/invisibleink*/cell.private.json")).read_text())
    assert spec["evaluation"]["label_column"] == "cat"


def test_held_out_rows_the_downstream_metric_refuses_stop_the_sweep_before_any_cell(
        setup, capsys):
    """A test text that is also one of the ceiling's training texts (a natural duplicate in
    the held-out rows) is refused before any cell is generated and charged, not when the first
    cell is evaluated."""
    tmp, calls = setup
    texts = [f"review {i}: {'the pizza' if i % 2 else 'the hotel'} was fine" for i in range(100)]
    texts[85] = texts[65]  # [data].real = [60, 100], num = 20: ceiling 60-79, test 80-99
    rows = ["text,cat"] + [f"{t},{'food' if i % 2 else 'hotel'}" for i, t in enumerate(texts)]
    (tmp / "data.csv").write_text("\n".join(rows) + "\n")
    cfg = tmp / "exp.toml"
    cfg.write_text(_edit(CONFIG, *DOWNSTREAM))
    out = tmp / "out"
    assert main(["experiment", str(cfg), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "downstream metric" in err and "ceiling's real training" in err, err
    assert not calls and not list(out.glob("cells/*/gen.jsonl"))


def test_grouped_batches_are_checked_before_any_model_loads(setup, capsys):
    """With group_by each label group is cut into full batches: a cell whose num batches do
    not exist is refused by the preflight (from the public labels), before any model load."""
    tmp, calls = setup
    rows = ["text,cat"] + [f"sentence {i},{'a' if i % 2 else 'b'}" for i in range(100)]
    (tmp / "data.csv").write_text("\n".join(rows) + "\n")
    cfg = tmp / "exp.toml"
    cfg.write_text(_edit(CONFIG, DOWNSTREAM[1], ("batch_size = [2]", "batch_size = [2, 4]")))
    out = tmp / "out"
    assert main(["experiment", str(cfg), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "cell invisibleink_eps1_B4_k3_t1_r0" in err and "[data].references" in err, err
    assert not calls and not out.exists()
    cfg.write_text(_edit(CONFIG, DOWNSTREAM[1]))  # B = 2: 15 batches per label, 30 in all
    assert main(["experiment", str(cfg), "--out", str(out), "--report-only"]) == 0


def test_the_yelp_downstream_config_passes_preflight(tmp_path):
    """experiments/yelp_downstream.toml (not run: docs/evaluation.md) asks for the downstream
    metric on the category label, and, on the real Yelp file when it is there, passes the whole
    preflight: every cell's request, the ranges and 500 grouped batches of every B."""
    from pathlib import Path

    from dplang.experiments.sweep import preflight

    repo = Path(__file__).resolve().parents[2]
    config = load_config(repo / "experiments" / "yelp_downstream.toml")
    assert config.label_column == "label1" and config.group_by == ("label1",)
    assert config.metrics[0] == "downstream" and config.num == 500
    assert config.real[1] - config.real[0] > config.num
    assert {c.method for c in config.cells} == {"invisibleink", "augpe", "adapmixed", "public"}
    if not config.data_path.is_file():
        pytest.skip("the Yelp data (../shared/data/yelp/dev.csv) is not beside this clone")
    _, _, states = preflight(config, tmp_path / "out", tmp_path / "ledger.sqlite", None)
    assert set(states.values()) == {"new"} and not (tmp_path / "out").exists()


def test_a_refused_model_stops_the_sweep_in_one_line_and_leaves_no_private_rows(
        setup, capsys, monkeypatch):
    """A model refused at load (the row-invariance check) is reported like every command
    reports it (exit 2, one line, not 'a bug'), and the copies of private rows the sweep
    wrote before the first cell (data/references.jsonl, data/real.jsonl) are removed."""
    from dplang.models.errors import RowInvarianceError

    tmp, calls = setup

    def refused(spec, dtype="float32"):
        calls.append(spec)
        raise RowInvarianceError("toy: a row decoded together with others differs")

    monkeypatch.setattr(exp_cli, "_load_model", refused)
    out = tmp / "out"
    assert main(["experiment", str(tmp / "exp.toml"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: the model cannot be used: toy"), err
    assert not any("Traceback" in line or "bug in dplang" in line for line in err), err
    assert calls and not list(out.rglob("*.jsonl"))
    assert not (out / "data").exists()


@pytest.mark.parametrize(("old", "new", "budget", "needle"), [
    # four cells of ε 1 and 10 against a budget of 15: the first cells would fit
    ("methods = [\"invisibleink\"]", "methods = [\"invisibleink\"]", 15.0, "over its budget"),
    # the non-private ceiling under a budget: refused before the private cells run
    ("methods = [\"invisibleink\"]", "methods = [\"invisibleink\", \"nonprivate\"]", 1000.0,
     "no differential-privacy guarantee"),
])
def test_a_sweep_the_budget_would_stop_is_refused_before_any_charge(setup, capsys, old, new,
                                                                    budget, needle):
    """The budget, the ledger and every cell's guarantee are public: a sweep that would be
    refused at some cell is refused whole, before the cells ahead of it are charged and
    published (else the sweep stops halfway)."""
    from dplang.privacy.ledger import PrivacyLedger

    tmp, calls = setup
    name = str((tmp / "data.csv").resolve())
    PrivacyLedger().set_budget(name, budget, 1e-6)
    cfg = tmp / "exp.toml"
    cfg.write_text(CONFIG.replace(old, new))
    code = main(["experiment", str(cfg), "--out", str(tmp / "out")])
    err = capsys.readouterr().err
    assert code == 3 and needle in err, err
    assert not calls and PrivacyLedger().spent(name).releases == 0


def test_a_failed_evaluation_does_not_stop_the_later_cells(setup, capsys):
    """One blank held-out row leaves 19 real texts for 20 generated: every cell's evaluation
    fails. Each cell is still generated (and charged and published), as on the neighbour whose
    row is not blank: what is published does not depend on the held-out rows. The sweep then
    says which evaluations failed (exit 2)."""
    from dplang.privacy.ledger import PrivacyLedger

    tmp, _ = setup
    rows = (tmp / "data.csv").read_text().splitlines()
    rows[1 + 60] = '""'  # the first held-out row of [data].real = [60, 80], num = 20
    (tmp / "data.csv").write_text("\n".join(rows) + "\n")
    (tmp / "exp.toml").write_text(CONFIG.replace("real = [60, 90]", "real = [60, 80]"))
    out = tmp / "out"
    code = main(["experiment", str(tmp / "exp.toml"), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "evaluation of 6 cell(s) failed" in err, err
    assert len(list(out.glob("cells/*/gen.jsonl"))) == 6
    assert PrivacyLedger().spent(str((tmp / "data.csv").resolve())).releases == 4


def test_results_say_no_guarantee_covers_a_sweep_with_a_non_private_cell(setup):
    """A sweep with the non-private ceiling: its cell is not counted as a release of ρ = 0,
    and results.md says that nothing covers the sweep as a whole or a choice made from it."""
    tmp, _ = setup
    (tmp / "exp.toml").write_text(_edit(
        CONFIG, ('methods = ["invisibleink"]', 'methods = ["invisibleink", "nonprivate"]'),
        ("epsilon = [1, 10]", "epsilon = { invisibleink = [1] }"),
        ("top_k = [3, 5]", "top_k = [3]")))
    out = tmp / "out"
    assert main(["experiment", str(tmp / "exp.toml"), "--out", str(out)]) == 0
    md = (out / "results.md").read_text()
    assert "No differential-privacy guarantee covers this sweep as a whole" in md
    assert "1 of its cells are not differentially private" in md
    assert "holds 1 DP release(s)" in md


def test_a_refusal_for_changed_data_names_no_digest(setup, capsys):
    """Rerun into the same --out after the data changed: refused, saying the content changed,
    without printing either digest of the private data (terminal output is often logged)."""
    from dplang.io import file_digest

    tmp, _ = setup
    cfg = tmp / "exp.toml"
    cfg.write_text(_small(CONFIG))
    out = tmp / "out"
    assert main(["experiment", str(cfg), "--out", str(out)]) == 0
    before = file_digest(tmp / "data.csv")
    rows = (tmp / "data.csv").read_text().splitlines()
    rows[5] = "another first sentence"
    (tmp / "data.csv").write_text("\n".join(rows) + "\n")
    capsys.readouterr()
    assert main(["experiment", str(cfg), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "the data's content changed" in err, err
    assert before not in err and file_digest(tmp / "data.csv") not in err


def test_a_budget_on_the_data_file_that_the_sweeps_name_does_not_see_is_warned(setup,
                                                                                capsys):
    """The sweep generates from a copy of the rows: the ledger's check for a budget kept
    under the data file's own name looks at the data file, and its warnings reach stderr."""
    from dplang.privacy.ledger import PrivacyLedger

    tmp, _calls = setup
    PrivacyLedger().set_budget(str((tmp / "data.csv").resolve()), epsilon=1000, delta=1e-6)
    code = main(["experiment", str(tmp / "exp.toml"), "--out", str(tmp / "out"), "--dataset",
                 "another-name"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "has its own budget in the ledger" in err and "data.csv" in err, err


def test_an_unknown_text_column_names_the_configs_key(setup, capsys):
    tmp, _calls = setup
    (tmp / "exp.toml").write_text(CONFIG.replace('path = "data.csv"',
                                                 'path = "data.csv"\ntext_column = "body"'))
    code = main(["experiment", str(tmp / "exp.toml"), "--out", str(tmp / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "unknown text column 'body'" in err, err
    assert "[data].text_column" in err and "--text-column" not in err


def test_a_stopped_sweep_says_how_to_resume_and_charges_each_cell_once(setup, capsys,
                                                                       monkeypatch):
    import dplang.experiments.sweep as sweep
    from dplang.privacy.ledger import PrivacyLedger

    tmp, _calls = setup
    original = sweep.execute_plan
    calls = {"n": 0}

    def stop_in_the_second_cell(plan, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return original(plan, **kw)

    monkeypatch.setattr(sweep, "execute_plan", stop_in_the_second_cell)
    args = ["experiment", str(tmp / "exp.toml"), "--out", str(tmp / "out")]
    assert main(args) == 130
    err = capsys.readouterr().err
    assert "run the same command again to resume" in err and "charged twice" in err, err
    monkeypatch.setattr(sweep, "execute_plan", original)
    assert main(args) == 0
    releases = PrivacyLedger().spent(str((tmp / "data.csv").resolve())).releases
    assert releases == 4  # the four private cells, each charged once


def test_the_ledger_records_the_data_files_content_not_the_copys(setup, capsys):
    """The cells generate from a copy of some of the file's rows; the ledger recorded the
    copy's digest, so a later ``generate`` of the same file (same default dataset name) was
    warned that the dataset "had other content", and the same-content check never matched."""
    from dplang.privacy.ledger import PrivacyLedger
    from dplang.release import file_digest

    tmp, _calls = setup
    assert main(["experiment", str(tmp / "exp.toml"), "--out", str(tmp / "out")]) == 0
    capsys.readouterr()
    name = str((tmp / "data.csv").resolve())
    book = PrivacyLedger()
    digests = {r["data_digest"] for r in book.releases(name)}
    assert digests == {file_digest(tmp / "data.csv")}
    assert book.content_warnings(name, file_digest(tmp / "data.csv")) == []
    assert "the same file content" in " ".join(
        book.content_warnings("another-name", file_digest(tmp / "data.csv")))


def test_an_overwrite_stopped_before_its_charge_leaves_the_cell_under_its_old_settings(
        setup, capsys, monkeypatch):
    """``--overwrite`` of a changed cell recorded the new settings before the new release was
    charged: stopped there (a Ctrl-C while the model loads), the cell held its old texts under
    the new settings and both configs refused it. The record changes with the charge."""
    import dplang.experiments.sweep as sweep
    from dplang.privacy.ledger import PrivacyLedger

    tmp, _calls = setup
    cfg, out = tmp / "exp.toml", tmp / "out"
    cfg.write_text(_small(CONFIG))
    assert main(["experiment", str(cfg), "--out", str(out)]) == 0
    spent = PrivacyLedger().spent(str((tmp / "data.csv").resolve())).releases
    original = sweep.execute_plan

    def stop_before_the_charge(plan, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "execute_plan", stop_before_the_charge)
    cfg.write_text(_small(CONFIG).replace("max_tokens = 6", "max_tokens = 7"))
    assert main(["experiment", str(cfg), "--out", str(out), "--overwrite"]) == 130
    monkeypatch.setattr(sweep, "execute_plan", original)
    capsys.readouterr()
    cfg.write_text(_small(CONFIG))  # the old config: its cells are there, nothing to charge
    assert main(["experiment", str(cfg), "--out", str(out)]) == 0, capsys.readouterr().err
    assert PrivacyLedger().spent(str((tmp / "data.csv").resolve())).releases == spent
    cfg.write_text(_small(CONFIG).replace("max_tokens = 6", "max_tokens = 7"))
    assert main(["experiment", str(cfg), "--out", str(out), "--overwrite"]) == 0
    assert PrivacyLedger().spent(str((tmp / "data.csv").resolve())).releases == spent + 1
    for gen in out.glob("cells/*/gen.jsonl"):
        assert all(json.loads(line)["num_tokens"] == 7 for line in gen.read_text().splitlines())


def _stop_inside_the_charge(monkeypatch):
    """The ledger records the charge, then a Ctrl-C (one seen when COMMIT returns)."""
    from dplang.privacy.ledger import PrivacyLedger

    original = PrivacyLedger.charge

    def charge(self, *args, **kw):
        original(self, *args, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(PrivacyLedger, "charge", charge)


def _stop_while_replacing(monkeypatch):
    """The earlier run's public files are gone, its seed has not yet taken their place."""
    from dplang.release import OutputPaths

    def half(self):
        self.remove(keep_private=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(OutputPaths, "take_replacement", half)


def _stop_at_the_manifest(monkeypatch):
    from dplang.release import Release

    def stop(self, *args, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(Release, "write_manifest", stop)


def _stop_after_the_side_file(monkeypatch):
    """The new run's manifest and side file are written, no text yet (and the cell's new
    settings not yet recorded)."""
    from dplang.release import Release

    original = Release.write_private

    def stop(self, *args, **kw):
        original(self, *args, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(Release, "write_private", stop)


def _overwrite_stopped(setup, monkeypatch, stop):
    """A sweep of one private cell (a public one needs --overwrite to change) is run, then
    run again with another max_tokens and --overwrite, stopped by ``stop``. Returns the
    command line of the changed config (without --overwrite), its --out, the dataset's
    ledger name and how many releases it had before the --overwrite."""
    from dplang.privacy.ledger import PrivacyLedger

    tmp, _calls = setup
    cfg, out = tmp / "exp.toml", tmp / "out"
    config = _small(CONFIG).replace("public_baseline = true", "public_baseline = false")
    cfg.write_text(config)
    assert main(["experiment", str(cfg), "--out", str(out)]) == 0
    name = str((tmp / "data.csv").resolve())
    before = PrivacyLedger().spent(name).releases
    cfg.write_text(config.replace("max_tokens = 6", "max_tokens = 7"))
    args = ["experiment", str(cfg), "--out", str(out)]
    with monkeypatch.context() as patch:
        stop(patch)
        assert main([*args, "--overwrite"]) == 130
    return args, out, name, before


def _stop_before_the_charge(monkeypatch):
    import dplang.experiments.sweep as sweep

    def stop(plan, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "execute_plan", stop)


@pytest.mark.parametrize("stop", [_stop_inside_the_charge, _stop_while_replacing,
                                  _stop_at_the_manifest, _stop_after_the_side_file])
@pytest.mark.parametrize("again", [["--overwrite"], []])
def test_an_overwrite_stopped_after_its_charge_is_continued_charged_once(
        setup, capsys, monkeypatch, stop, again):
    """A cell's --overwrite stopped at any point after its charge: the same config (with
    --overwrite or without) continues the replacement with its kept seed, charged once; the
    cell was stuck (refused by every config) or charged a second time."""
    from dplang.privacy.ledger import PrivacyLedger

    args, out, name, spent = _overwrite_stopped(setup, monkeypatch, stop)
    capsys.readouterr()
    assert PrivacyLedger().spent(name).releases == spent + 1
    if stop is _stop_inside_the_charge and not again:
        # the charge returned no answer: the cell cannot tell it was charged, and asks for
        # --overwrite (which continues the kept seed: charged once)
        assert main(args) == 2
        assert "--overwrite" in capsys.readouterr().err
        again = ["--overwrite"]
    code = main([*args, *again])
    assert code == 0, capsys.readouterr().err
    assert PrivacyLedger().spent(name).releases == spent + 1
    for gen in out.glob("cells/*/gen.jsonl"):
        assert all(json.loads(line)["num_tokens"] == 7 for line in gen.read_text().splitlines())
    assert not list(out.glob("cells/*/cell.replacing.private.json"))
    assert main(args) == 0
    assert capsys.readouterr().err.count("done, skipped") == 1


def test_no_public_file_of_a_sweep_holds_a_data_digest(setup, capsys):
    """The ledger records the data file's digest for each cell (given to the release as a
    private request field): it must reach no public file, like the copy's."""
    from dplang.release import file_digest

    tmp, _calls = setup
    out = tmp / "out"
    assert main(["experiment", str(tmp / "exp.toml"), "--out", str(out)]) == 0
    digests = {file_digest(tmp / "data.csv"), file_digest(out / "data" / "references.jsonl")}
    public = [p for p in out.rglob("*") if p.is_file() and ".dplang-private" not in p.parts
              and "private" not in p.name and p.parent.name != "data"]
    assert any(p.name == "gen.manifest.json" for p in public)
    for path in public:
        text = path.read_bytes().decode("utf-8", "replace")
        assert not any(d in text for d in digests), path


def test_a_charged_replacement_continued_is_not_counted_by_the_sweeps_budget(
        setup, capsys, monkeypatch):
    """A cell's --overwrite charged and then stopped: continuing it costs nothing new, so the
    sweep's budget check does not refuse it where a new charge would not fit."""
    from dplang.privacy.ledger import PrivacyLedger

    args, _out, name, _before = _overwrite_stopped(setup, monkeypatch, _stop_inside_the_charge)
    book = PrivacyLedger()
    spent = book.spent(name).epsilon_at(1e-6)
    book.set_budget(name, epsilon=spent + 1, delta=1e-6)  # room for no new ε = 10 cell
    code = main([*args, "--overwrite"])
    assert code == 0, capsys.readouterr().err
    assert book.spent(name).releases == 2


def test_an_overwrite_stopped_before_its_charge_still_needs_overwrite(setup, capsys,
                                                                    monkeypatch):
    """The cell's replacement record of an --overwrite stopped before its charge does not
    make the new config regenerate the cell without --overwrite (it did, charging anew)."""
    from dplang.privacy.ledger import PrivacyLedger

    args, _out, name, _before = _overwrite_stopped(setup, monkeypatch, _stop_before_the_charge)
    capsys.readouterr()
    assert main(args) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert PrivacyLedger().spent(name).releases == 1


def test_a_replacement_the_cell_can_no_longer_continue_is_refused_not_charged_anew(
        setup, capsys, monkeypatch):
    """Without --overwrite a sweep continues a cell's charged replacement only as that very
    release: when the model's libraries changed since (another release), generate refuses
    rather than draw a new seed (it charged anew, unasked)."""
    from dplang.privacy.ledger import PrivacyLedger

    args, _out, name, _before = _overwrite_stopped(setup, monkeypatch, _stop_while_replacing)
    capsys.readouterr()
    assert PrivacyLedger().spent(name).releases == 2
    model = exp_cli._load_model("toy")
    monkeypatch.setattr(model, "numerics", {"torch": "another version"}, raising=False)
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2 and "--overwrite" in err, err
    assert PrivacyLedger().spent(name).releases == 2


def test_a_sweep_continues_only_the_release_its_cell_recorded(setup, capsys, monkeypatch):
    """A cell's charged replacement R1 can no longer be continued (the libraries changed);
    the --overwrite it was told to run drew R2 and was stopped before R2's charge. The
    config without --overwrite must not continue R2 (a new charge, unasked): only R1."""
    from dplang.privacy.ledger import PrivacyLedger

    args, _out, name, _before = _overwrite_stopped(setup, monkeypatch, _stop_while_replacing)
    model = exp_cli._load_model("toy")
    monkeypatch.setattr(model, "numerics", {"torch": "another version"}, raising=False)
    with monkeypatch.context() as patch:
        patch.setattr(PrivacyLedger, "charge", lambda self, *a, **kw: (_ for _ in ()).throw(
            KeyboardInterrupt()))
        assert main([*args, "--overwrite"]) == 130
    capsys.readouterr()
    assert PrivacyLedger().spent(name).releases == 2
    code = main(args)
    assert code == 2 and "--overwrite" in capsys.readouterr().err
    assert PrivacyLedger().spent(name).releases == 2

"""The command line on neighbouring datasets and the ledger: a blank CSV line or a JSONL key in
one record changes neither the public manifest nor the exit code, a dataset named like its file
meets that name's budget, releases under different adjacencies are totalled under replace-one,
and an experiment's statistics of the private rows are private files."""

from __future__ import annotations

import json
import os
import stat

import pytest

import dplang.cli.experiment as exp_cli
import dplang.cli.generate as gen_cli
from dplang.cli.app import main
from dplang.models import ToyModel
from dplang.privacy import rho_to_epsilon
from dplang.privacy.ledger import PrivacyLedger
from dplang.release import TIMESTAMP_FIELDS


@pytest.fixture
def toy(monkeypatch):
    model = ToyModel(vocab_size=30, eos_after=None)
    monkeypatch.setattr(gen_cli, "_load_model", lambda spec, dtype="float32": model)
    monkeypatch.setattr(exp_cli, "_load_model", lambda spec, dtype="float32": model)
    monkeypatch.setattr(exp_cli, "_check_model", lambda spec: None)  # "toy" is no model path
    return model


def _template(tmp_path):
    t = tmp_path / "t.toml"
    t.write_text('private = "Here: {reference}\\nAnother:"\npublic = "Another:"\n')
    return t


def _public(path):
    doc = json.loads(path.read_text())
    for key in TIMESTAMP_FIELDS:
        doc.pop(key, None)
    return doc


def test_generate_one_column_csv_neighbours_have_equal_manifests(tmp_path, capsys, toy):
    texts = [f"review number {i} was fine" for i in range(9)]
    manifests, groups = [], []
    for side, blank in (("x", None), ("y", 1)):
        d = tmp_path / side
        d.mkdir()
        rows = ["" if i == blank else t for i, t in enumerate(texts)]
        (d / "d.csv").write_text("text\n" + "\n".join(rows) + "\n")
        out = d / "gen.jsonl"
        code = main(["generate", "--data", str(d / "d.csv"), "--out", str(out), "--epsilon", "5",
                     "-B", "3", "-T", "4", "--seed", "7", "--prompt", str(_template(d)),
                     "--quiet"])
        assert code == 0, capsys.readouterr().err
        manifests.append(_public(d / "gen.manifest.json"))
        groups.append({json.loads(line)["group"]: json.loads(line)["text"]
                       for line in out.read_text().splitlines()})
    assert manifests[0]["fingerprint"] == manifests[1]["fingerprint"]
    # each release draws fresh noise (its streams are rooted at H(seed, release id)), so the
    # texts are compared under coupled noise, as an audit does: with one coupling key both
    # runs draw the same noise, and reference 1 lies in group 0: groups 1 and 2 must not change
    from dplang.textgen.orchestration import GenerationRequest, execute_plan, plan_generation

    coupled = []
    for side in ("x", "y"):
        d = tmp_path / side
        req = GenerationRequest(data=d / "d.csv", out=d / "coupled.jsonl", batch_size=3,
                                max_tokens=4, temperature=1.0, top_k=0, epsilon=5.0, seed=7,
                                prompt=str(_template(d)), coupling="neighbours",
                                public_seed=True, ledger=d / "audit.sqlite")
        execute_plan(plan_generation(req, lambda _spec: toy))
        coupled.append({json.loads(line)["group"]: json.loads(line)["text"]
                        for line in req.out.read_text().splitlines()})
    assert coupled[0][1] == coupled[1][1] and coupled[0][2] == coupled[1][2]
    assert len(groups[0]) == len(groups[1]) == 3


def test_dataset_given_as_the_file_name_meets_its_budget(tmp_path, capsys, toy, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reviews.csv").write_text("text\n" + "\n".join(f"r{i}" for i in range(9)) + "\n")
    t = _template(tmp_path)
    assert main(["ledger", "budget", "reviews.csv", "--epsilon", "1", "--delta", "1e-6"]) == 0
    code = main(["generate", "--data", "reviews.csv", "--dataset", "reviews.csv", "--out",
                 "a.jsonl", "--epsilon", "5", "-B", "3", "-T", "4", "--prompt", str(t), "-q"])
    capsys.readouterr()
    assert code == 3  # ε = 5 > budget ε = 1 of the dataset the user named
    assert not (tmp_path / "a.jsonl").exists()


def test_ledger_does_not_silently_mix_adjacencies(tmp_path, capsys, toy):
    data = tmp_path / "d.csv"
    data.write_text("text,smoker\n" + "\n".join(f"review {i},{i % 2}" for i in range(60)) + "\n")
    common = ["--dataset", "patients"]
    assert main(["generate", "--data", str(data), "--out", str(tmp_path / "g.jsonl"),
                 "--epsilon", "3", "-B", "3", "-T", "4", "--prompt", str(_template(tmp_path)),
                 "-q", *common]) == 0
    code = main(["sample", "--data", str(data), "--columns", "smoker", "--binary", "smoker",
                 "--epsilon", "3", "--out", str(tmp_path / "s.csv"), "-q", *common])
    err = capsys.readouterr().err
    assert code == 0, err  # no budget: accepted, with a warning that the total is converted
    assert "mixes adjacencies" in err
    ledger = PrivacyLedger()
    spent = ledger.spent("patients")
    rho_gen = next(r["guarantee"]["rho"] for r in ledger.releases("patients")
                   if r["guarantee"]["adjacency"] == "replace-by-null")
    # the total is stated under replace-one, where the replace-by-null release costs 4ρ (group
    # privacy at distance 2), never the plain sum of costs under different adjacencies
    assert spent.adjacency == "replace-one"
    assert spent.epsilon_at(1e-6) == pytest.approx(rho_to_epsilon(4 * rho_gen, 1e-6) + 3.0)


def test_experiment_files_about_private_rows_are_private(tmp_path, capsys, toy):
    rows = ["text"] + [f"sentence {i} about food and service" for i in range(100)]
    (tmp_path / "data.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "template.toml").write_text(
        'private = "Review: {reference}\\nAnother review:"\npublic = "Another review:"\n')
    (tmp_path / "exp.toml").write_text(
        'name = "t"\n[data]\npath = "data.csv"\nreferences = [0, 60]\nreal = [60, 90]\n'
        'prompt = "template.toml"\n[generation]\nmodel = "toy"\nmax_tokens = 4\nnum = 20\n'
        '[sweep]\nmethods = ["invisibleink"]\nepsilon = [5]\nbatch_size = [3]\ntop_k = [3]\n'
        'temperature = [1.0]\n[evaluation]\nmetrics = ["mauve"]\nembedder = "hashing"\n')
    old = os.umask(0o022)
    try:
        assert main(["experiment", str(tmp_path / "exp.toml"), "--out",
                     str(tmp_path / "out"), "-q"]) == 0
    finally:
        os.umask(old)
    capsys.readouterr()
    # metrics.json holds the held-out rows' SHA-256 (the data holder's record of what was
    # compared): a private file, mode 600 from creation whatever the umask, in the mode-700 DIR
    metrics = next((tmp_path / "out" / "cells").glob("*/eval/metrics.json"))
    assert json.loads(metrics.read_text())["real"]["sha256"]
    assert stat.S_IMODE(metrics.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o700


def test_sample_jsonl_column_present_in_one_record_only(tmp_path, capsys):
    rows = [{"a": i % 2} for i in range(200)]
    codes = []
    for side, extra in (("x", None), ("y", {"a": 1, "c": 1})):
        d = tmp_path / side
        d.mkdir()
        objs = list(rows)
        if extra is not None:
            objs[7] = extra
        (d / "d.jsonl").write_text("\n".join(json.dumps(o) for o in objs) + "\n")
        codes.append(main(["sample", "--data", str(d / "d.jsonl"), "--columns", "a,c",
                           "--binary", "a,c", "--epsilon", "1", "--seed", "5",
                           "--out", str(d / "s.csv"), "-q"]))
    capsys.readouterr()
    # JSONL has no schema: a column in no record (x) or in one (y) is never refused, and the
    # public manifests do not tell the two apart
    assert codes == [0, 0]
    x, y = (_public(tmp_path / side / "s.manifest.json") for side in ("x", "y"))
    assert x == y

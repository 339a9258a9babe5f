"""The nonprivate ceiling: the same private prompts, no clipping, no noise; and a
population method (Aug-PE) run per label group."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import dplang.cli.generate as gen_cli
from dplang.cli.app import main
from dplang.models import ToyModel
from dplang.privacy.ledger import PrivacyLedger
from dplang.textgen.methods import get_method, method_names
from dplang.textgen.methods.nonprivate import NonPrivatePolicy


@pytest.fixture
def toy(monkeypatch):
    model = ToyModel(vocab_size=30, eos_after=None)
    monkeypatch.setattr(gen_cli, "_load_model", lambda spec, dtype="float32": model)
    return model


def _data(path, n=12):
    path.write_text("text,label\n" + "".join(f"review number {i} was fine,L{i % 2}\n"
                                             for i in range(n)))
    (path.parent / "t.toml").write_text(
        'private = "{label}: {reference}\\nAnother {label}:"\npublic = "Another {label}:"\n')
    return path


def _args(data, out, *extra):
    return ["generate", "--data", str(data), "--out", str(out), "--batch-size", "3",
            "--max-tokens", "5", "--top-k", "4", "--seed", "1", "--quiet",
            "--prompt", str(data.parent / "t.toml"), "--group-by", "label", *extra]


def test_the_policy_samples_the_plain_mean_of_the_private_logits() -> None:
    public = torch.tensor([0.0, 0.0, 0.0, 5.0, 0.0])
    private = torch.tensor([[4.0, 0.0, 1.0, 0.0, 0.0], [2.0, 0.0, 3.0, 0.0, 0.0]])
    ids, logits = NonPrivatePolicy(3, 1.0, 2).scores(public, private)
    # mean over B = 3 with the empty reference's public row: [2, 0, 4/3, 5/3, 0]
    assert ids.tolist() == [0, 3] and logits == pytest.approx([2.0, 5.0 / 3.0])
    ids, logits = NonPrivatePolicy(2, 1.0, 0).scores(public, private)  # full vocabulary
    assert ids.tolist() == [0, 1, 2, 3, 4] and logits == pytest.approx([3, 0, 2, 0, 0])
    policy = NonPrivatePolicy(3, 0.5, 2)
    draws = [policy.choose(public, private, None, np.random.default_rng(s)) for s in range(50)]
    assert set(draws) <= {0, 3} and policy.stats() == {}
    assert draws == [NonPrivatePolicy(3, 0.5, 2).choose(public, private, None,
                                                        np.random.default_rng(s))
                     for s in range(50)]  # deterministic given the stream


def test_nonprivate_is_registered_without_a_budget_and_says_so(tmp_path, capsys, toy) -> None:
    assert "nonprivate" in method_names() and get_method("nonprivate").budget_forms == ()
    data = _data(tmp_path / "d.csv")
    out = tmp_path / "np.jsonl"
    assert main(_args(data, out, "--method", "nonprivate", "--epsilon", "3")) == 2
    assert "not private and takes no privacy budget" in capsys.readouterr().err
    assert main(_args(data, out, "--method", "nonprivate")) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 4 and all(r["method"] == "nonprivate" for r in records)
    manifest = json.loads(out.with_name("np.manifest.json").read_text())
    g = manifest["guarantee"]
    assert g["mechanism"] == "nonprivate" and math.isinf(g["epsilon"]) and not g["ex_ante"]
    assert "NOT PRIVATE" in manifest["guarantee_summary"]
    assert main(["ledger", "show"]) == 0
    shown = capsys.readouterr().out
    assert "NOT PRIVATE (ε = ∞)" in shown and "nominal ε = ∞: one or more are NOT PRIVATE" in shown
    # a dataset with a DP budget refuses it, like every release that is not DP
    ledger = tmp_path / "budget.sqlite"
    PrivacyLedger(ledger).set_budget(str(data.resolve()), epsilon=10.0, delta=1e-6)
    code = main(_args(data, tmp_path / "np2.jsonl", "--method", "nonprivate",
                      "--ledger", str(ledger)))
    assert code == 3 and "budget" in capsys.readouterr().err


def test_a_population_method_runs_once_per_label_group(tmp_path, capsys, toy, monkeypatch):
    """Aug-PE grouped by a label: one run per group over that group's references only, with
    its prompt, and every text recorded with the labels it was generated for (it used to run
    once over every reference with the first group's prompt)."""
    import dplang.textgen.methods.augpe as augpe_mod

    calls = []
    real_run = augpe_mod.run_augpe

    def spy(model, references, params, seed, **kw):
        calls.append((tuple(references), kw["public_prompt"], params.num_texts, seed))
        return real_run(model, references, params, seed, **{**kw, "embedder": "hashing"})

    monkeypatch.setattr(augpe_mod, "run_augpe", spy)
    data = _data(tmp_path / "d.csv", 13)  # L0: 7 rows (2 batches of 3), L1: 6 rows (2)
    out = tmp_path / "pe.jsonl"
    code = main(_args(data, out, "--method", "augpe", "--epsilon", "10",
                      "--augpe-iterations", "1", "--augpe-variations", "1"))
    assert code == 0, capsys.readouterr().err
    assert [(c[1], c[2]) for c in calls] == [("Another L0:", 2), ("Another L1:", 2)]
    for g, call in enumerate(calls):  # group L0 holds the even rows, L1 the odd ones
        assert all(int(ref.split()[2]) % 2 == g for ref in call[0])
    assert len(calls[0][0]) == len(calls[1][0]) == 6 and calls[0][3] != calls[1][3]
    records = sorted((json.loads(line) for line in out.read_text().splitlines()),
                     key=lambda r: r["group"])
    assert [r["labels"]["label"] for r in records] == ["L0", "L0", "L1", "L1"]
    for r in records:  # each text's references are its own group's
        assert all(i % 2 == int(r["labels"]["label"][1]) for i in r["reference_ids"])
    manifest = json.loads(out.with_name("pe.manifest.json").read_text())
    groups = manifest["augpe"]["groups"]
    assert [groups[g]["labels"] for g in ("0", "1")] == [{"label": "L0"}, {"label": "L1"}]
    assert "augpe.groups.1.noisy_count_sums" in manifest["released_statistics"]

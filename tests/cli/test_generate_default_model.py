"""End to end through the CLI with the embedded default model (Gemma 3 270M), a few tokens."""

import json
from importlib.resources import files

import pytest

from dplang.cli.app import main
from dplang.io import demo_corpus_path

pytestmark = pytest.mark.model


def test_generate_with_default_model(tmp_path, capsys):
    out = tmp_path / "demo.jsonl"
    template = str(files("dplang") / "data" / "demo_template.toml")
    code = main(["generate", "--data", str(demo_corpus_path()), "--model", "default",
                 "--epsilon", "10", "--batch-size", "7", "--max-tokens", "6", "--num", "2",
                 "--top-k", "50", "--temperature", "1.0", "--prompt", template, "--seed", "0",
                 "--out", str(out), "--quiet"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["group"] for r in sorted(recs, key=lambda r: r["group"])] == [0, 1]
    for r in recs:
        assert 1 <= r["num_tokens"] <= 6 and r["text"].strip()
        assert r["topk_plus_mean"] >= 50
    manifest = json.loads((tmp_path / "demo.manifest.json").read_text())
    assert manifest["epsilon"] == pytest.approx(10)
    assert manifest["fingerprint"]["model_id"].startswith("gemma-3-270m")
    assert "zero-concentrated" in manifest["guarantee_summary"]
    # -q: nothing but errors, also while the real model loads
    assert captured.out == "" and captured.err == "", captured

import json

import pytest

from dplang.cli.app import main


def run(capsys, *args):
    code = main(["evaluate", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def inputs(tmp_path, kit):
    real = kit.write_real_csv(tmp_path / "real.csv", kit.reviews(44, 1))
    syn = kit.write_synthetic(tmp_path / "gen.jsonl", kit.reviews(40, 2))
    return real, syn


def test_cli_end_to_end(tmp_path, capsys, inputs, tiny_model_dir, default_embedder):
    real, syn = inputs
    out = tmp_path / "eval"
    code, stdout, err = run(capsys, "--real", str(real), "--synthetic", str(syn),
                            "--metrics", "length,topk,mauve,perplexity", "--embedder", "default",
                            "--model", str(tiny_model_dir), "--seed", "3", "--out", str(out))
    assert code == 0, err
    assert "MAUVE=" in stdout and "ΔPPL=" in stdout and "effective_k=" in stdout
    data = json.loads((out / "metrics.json").read_text())
    run0 = data["runs"][0]
    assert data["settings"]["n"] == 40 and data["settings"]["mauve"]["seed"] == 3
    assert "MiniLM" in data["settings"]["mauve"]["embedder"]
    assert data["settings"]["mauve"]["max_tokens"] == 256
    assert 0.55 < run0["mauve"]["mauve"] <= 1.0
    assert run0["perplexity"]["mean"]["mean"] > 1 and run0["perplexity"]["delta_ppl"] >= 0
    assert run0["topk"]["effective_k"]["mean"] > 50
    assert len(run0["length"]["per_text"]) == 40
    assert {"report.md", "lengths.png", "metrics.png"} <= {p.name for p in out.iterdir()}


def test_cli_num_and_topk_only(tmp_path, capsys, inputs):
    real, syn = inputs
    code, stdout, err = run(capsys, "--real", str(real), "--synthetic", str(syn),
                            "--metrics", "topk", "--num", "10", "--out", str(tmp_path / "o"))
    assert code == 0, err
    assert "n=10" in stdout


def error_of(capsys, *args):
    code, _, err = run(capsys, *args)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2, err
    assert len(lines) == 1, err
    return lines[0]


def test_cli_errors(tmp_path, capsys, kit, inputs, tiny_model_dir):
    real, syn = inputs
    base = ["--real", str(real), "--synthetic", str(syn), "--out", str(tmp_path / "o")]
    assert "unknown metric 'bleu'" in error_of(capsys, *base, "--metrics", "mauve,bleu")
    assert "model not found" in error_of(capsys, *base, "--metrics", "perplexity",
                                         "--model", str(tmp_path / "no-model"))
    assert "embedder not found" in error_of(capsys, *base, "--metrics", "mauve",
                                            "--embedder", str(tmp_path / "no-embedder"))
    assert "--num 41 is more than" in error_of(capsys, *base, "--metrics", "topk",
                                                "--num", "41")
    small = kit.write_synthetic(tmp_path / "small.jsonl", kit.reviews(12, 3))
    msg = error_of(capsys, "--real", str(real), "--synthetic", str(small), "--metrics",
                   "mauve", "--embedder", "hashing", "--out", str(tmp_path / "o"))
    assert "at least 20 texts" in msg
    assert "buckets do not fit" in error_of(capsys, *base, "--metrics", "mauve", "--embedder",
                                            "hashing", "--num-buckets", "30")
    empty = kit.write_synthetic(tmp_path / "empty.jsonl", ["", ""])
    assert "are empty" in error_of(capsys, "--real", str(real), "--synthetic", str(empty),
                                   "--out", str(tmp_path / "o"))
    blank_real = tmp_path / "blank.csv"
    blank_real.write_text("text\n\n\"\"\n")
    assert "no usable" in error_of(capsys, "--real", str(blank_real), "--synthetic", str(syn),
                                   "--metrics", "topk", "--out", str(tmp_path / "o"))
    assert "not found" in error_of(capsys, "--real", str(tmp_path / "nope.csv"),
                                   "--synthetic", str(syn), "--metrics", "topk",
                                   "--out", str(tmp_path / "o"))
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({"text": t}) + "\n" for t in kit.reviews(30)))
    assert "no Top-k+" in error_of(capsys, "--real", str(real), "--synthetic", str(plain),
                                   "--metrics", "topk", "--out", str(tmp_path / "o"))


def test_cli_refuses_references_as_real_texts(tmp_path, capsys, kit):
    data = kit.write_real_csv(tmp_path / "data.csv", kit.reviews(60))
    manifest = {"fingerprint": {"parameters": {"data": str(data), "top_k": 5}},
                "data": {"path": str(data)}}
    syn = kit.write_synthetic(tmp_path / "g.jsonl", kit.reviews(20, 5), manifest=manifest,
                              reference_ids=lambda i: [i])
    args = ["--real", str(data), "--synthetic", str(syn), "--metrics", "topk",
            "--out", str(tmp_path / "o")]
    assert "--exclude-references" in error_of(capsys, *args)
    code, _, err = run(capsys, *args, "--exclude-references")
    assert code == 0, err
    assert "20 reference rows were skipped" in err
    data_out = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert data_out["real"]["excluded_references"] == 20

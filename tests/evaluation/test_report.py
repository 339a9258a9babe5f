import json

from dplang.evaluation import evaluate_files


def test_report_files_written(tmp_path, kit, tiny_model_dir):
    real = kit.write_real_csv(tmp_path / "real.csv", kit.reviews(45, 1), blank_at=(0,))
    runs = [kit.write_synthetic(tmp_path / f"s{i}.jsonl", kit.reviews(40 + i, 10 + i))
            for i in range(3)]
    out = tmp_path / "out"
    result = evaluate_files(real, runs, embedder="hashing", model=str(tiny_model_dir),
                            out_dir=out)
    for name in ("metrics.json", "report.md", "lengths.png", "metrics.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0
    assert (out / "lengths.png").read_bytes()[:4] == b"\x89PNG"
    data = json.loads((out / "metrics.json").read_text())
    assert data["settings"]["n"] == 40 and len(data["runs"]) == 3
    assert data["settings"]["mauve"]["num_buckets"] == 2
    assert data["real"]["blank_rows_skipped"] == 1
    for key in ("mauve", "delta_ppl", "ppl_synthetic", "length_synthetic", "effective_k",
                "expansion_tokens"):
        assert data["aggregate"][key]["n"] == 3  # intervals over the 3 runs (seeds)
    assert result["aggregate"]["mauve"]["half_width"] is not None
    assert any("unequal sizes" in w for w in data["warnings"])
    report = (out / "report.md").read_text()
    assert "mean over 3 runs" in report and "first n texts of each input" in report
    assert "![metrics.png](metrics.png)" in report
    # lengths: generated with 'default', scored with the tiny model -> re-counted
    assert data["runs"][0]["length"]["source"].startswith("tokenizer of")


def test_evaluate_texts_in_memory(tmp_path, kit, tiny_model_dir):
    from dplang.evaluation import evaluate_texts

    records = [{"text": t, "topk_plus_mean": 10.0, "expansion_tokens": 2, "num_tokens": 5}
               for t in kit.reviews(25, 4)]
    result = evaluate_texts([*kit.reviews(30, 1), "  "], [kit.reviews(25, 2), records],
                            names=["a", "b"], metrics="mauve,perplexity,length",
                            embedder="hashing", model=str(tiny_model_dir), out_dir=tmp_path)
    assert result["settings"]["n"] == 25
    assert [r["name"] for r in result["runs"]] == ["a", "b"]
    assert result["real"]["blank_rows_skipped"] == 1
    assert (tmp_path / "report.md").is_file()


def test_runs_with_the_same_file_name_get_distinct_labels(tmp_path, kit):
    real = kit.write_real_csv(tmp_path / "real.csv", kit.reviews(10, 1))
    paths = []
    for seed in (1, 2):
        (tmp_path / f"seed{seed}").mkdir()
        paths.append(kit.write_synthetic(tmp_path / f"seed{seed}" / "gen.jsonl",
                                         kit.reviews(10, seed)))
    result = evaluate_files(real, paths, metrics="topk")
    assert [r["name"] for r in result["runs"]] == ["seed1/gen.jsonl", "seed2/gen.jsonl"]
    assert result["aggregate"]["effective_k"]["n"] == 2


def test_repeated_group_lines_are_evaluated_once_and_reported(tmp_path, kit):
    real = kit.write_real_csv(tmp_path / "real.csv", kit.reviews(10, 1))
    path = kit.write_synthetic(tmp_path / "gen.jsonl", kit.reviews(10, 2))
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines + lines[:4]) + "\n")  # a rerun appended
    result = evaluate_files(real, path, metrics="topk")
    run = result["runs"][0]
    assert run["n"] == 10 and run["generations_in_file"] == 10 and run["repeated_lines"] == 4
    assert any("4 line(s) repeated" in w for w in result["warnings"])

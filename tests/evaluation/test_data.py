import json

import pytest

from dplang.evaluation import EvaluationError, align_sizes, load_real, load_synthetic
from dplang.evaluation.lengths import topk_statistics
from dplang.io import file_digest


def test_synthetic_sorted_by_group_and_manifest_read(tmp_path, kit):
    texts = kit.reviews(5)
    path = kit.write_synthetic(tmp_path / "s.jsonl", texts, order=[3, 0, 4, 1, 2])
    run = load_synthetic(path)
    assert run.texts == texts
    assert run.parameters["top_k"] == 50 and run.manifest["epsilon"] == 10.0
    assert run.reference_ids() == {1000, 1001, 1002, 1003, 1004}


def test_a_group_repeated_exactly_is_read_once_and_a_differing_one_refused(tmp_path, kit):
    """A resumed population run of an older dplang appended its rerun (the same records) to
    what the first attempt had written: sorted by group, the first n lines held some groups
    twice and left others out (the published Aug-PE cell of the quality sweep)."""
    texts = kit.reviews(5)
    path = kit.write_synthetic(tmp_path / "s.jsonl", texts)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:3] + lines) + "\n")  # groups 0-2 twice, as appended
    run = load_synthetic(path)
    assert run.texts == texts and run.repeated_lines == 3
    assert run.head(4).repeated_lines == 3
    other = json.loads(lines[1])
    other["text"] = "another text"
    path.write_text("\n".join([*lines, json.dumps(other)]) + "\n")
    with pytest.raises(EvaluationError, match="group 1 is on several lines with different"):
        load_synthetic(path)


def test_synthetic_all_empty_refused_and_some_empty_kept(tmp_path, kit):
    with pytest.raises(EvaluationError, match="all 3 synthetic texts are empty"):
        load_synthetic(kit.write_synthetic(tmp_path / "e.jsonl", ["", " ", ""]))
    run = load_synthetic(kit.write_synthetic(tmp_path / "f.jsonl", ["", "text"]))
    assert run.texts == ["", "text"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\nnot json\n')
    with pytest.raises(EvaluationError, match=r"bad.jsonl: line 2: invalid JSON"):
        load_synthetic(bad)
    with pytest.raises(EvaluationError, match="not found"):
        load_synthetic(tmp_path / "missing.jsonl")


def test_real_skips_blank_rows_and_sizes_align(tmp_path, kit):
    real_path = kit.write_real_csv(tmp_path / "r.csv", kit.reviews(12), blank_at=(2, 5))
    run_a = load_synthetic(kit.write_synthetic(tmp_path / "a.jsonl", kit.reviews(8, 1)))
    run_b = load_synthetic(kit.write_synthetic(tmp_path / "b.jsonl", kit.reviews(9, 2)))
    real = load_real(real_path, [run_a, run_b])
    assert len(real.texts) == 10 and real.stats.unusable == 2
    assert 2 not in real.indices and 5 not in real.indices
    n, real_n, (a_n, b_n) = align_sizes(real, [run_a, run_b])
    assert n == 8 and len(real_n.texts) == len(a_n.texts) == len(b_n.texts) == 8
    assert real_n.texts == real.texts[:8] and b_n.texts == run_b.texts[:8]
    assert align_sizes(real, [run_a, run_b], num=5)[0] == 5
    with pytest.raises(EvaluationError, match="--num 9 is more than"):
        align_sizes(real, [run_a, run_b], num=9)


def test_real_rows_that_were_references_are_refused_or_excluded(tmp_path, kit):
    data = kit.write_real_csv(tmp_path / "data.csv", kit.reviews(30))
    manifest = {"fingerprint": {"parameters": {"data": str(data), "top_k": 5}},
                "data": {"path": str(data), "sha256": "ignored"}}
    # 5 generations, references rows 0..14 (B = 3)
    syn = kit.write_synthetic(tmp_path / "s.jsonl", kit.reviews(5, 9), manifest=manifest,
                              reference_ids=lambda i: [3 * i, 3 * i + 1, 3 * i + 2])
    run = load_synthetic(syn)
    with pytest.raises(EvaluationError, match="references of the generation"):
        load_real(data, [run])
    real = load_real(data, [run], exclude_references=True)
    assert real.indices[0] == 15 and real.excluded_references == 15
    assert real.is_generation_data == ["s.jsonl"]
    # Detected by content too: a copy of the data file at another path.
    copy = tmp_path / "copy.csv"
    copy.write_bytes(data.read_bytes())
    manifest["data"]["sha256"] = file_digest(data)
    manifest["data"]["path"] = "/elsewhere/data.csv"
    manifest["fingerprint"]["parameters"]["data"] = "/elsewhere/data.csv"
    (tmp_path / "s.manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(EvaluationError, match="references"):
        load_real(copy, [load_synthetic(syn)])


def test_data_file_rows_disjoint_from_references_are_accepted(tmp_path, kit):
    data = kit.write_real_csv(tmp_path / "data.csv", kit.reviews(30))
    manifest = {"fingerprint": {"parameters": {"data": str(data)}}, "data": {"path": str(data)}}
    syn = kit.write_synthetic(tmp_path / "s.jsonl", kit.reviews(5, 9), manifest=manifest,
                              reference_ids=lambda i: [15 + 3 * i, 16 + 3 * i, 17 + 3 * i])
    real = load_real(data, [load_synthetic(syn)], limit=10)
    assert real.indices == list(range(10)) and real.is_generation_data == ["s.jsonl"]


def test_topk_statistics(tmp_path, kit):
    run = load_synthetic(kit.write_synthetic(tmp_path / "s.jsonl", kit.reviews(6)))
    stats = topk_statistics(run)
    assert stats.top_k == 50
    assert stats.effective_k.mean == pytest.approx((50 + 51 + 52) / 3)
    assert stats.expansion_tokens.mean == pytest.approx((0 + 1 + 2 + 3 + 0 + 1) / 6)
    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"text": "a b"}\n{"text": "c"}\n')
    with pytest.raises(EvaluationError, match="no Top-k"):
        topk_statistics(load_synthetic(plain))

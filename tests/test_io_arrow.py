"""Arrow-backed inputs: Arrow IPC files and Hugging Face datasets saved with
``save_to_disk`` read like every other format (same skip rule, same row positions), without
``datasets`` installed; with it, what ``save_to_disk`` writes is read as ``load_from_disk``
gives it."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.feather as feather
import pytest

from dplang.io import ReferenceDataError, data_path_problem, file_digest, load_references

TABLE = pa.table({"text": ["first", None, "third", "   ", "fifth"],
                  "label": ["a", "b", None, "d", "e"]})


def _saved_dataset(folder: Path, table: pa.Table = TABLE, shards: int = 2) -> Path:
    """A folder as ``Dataset.save_to_disk`` writes it: Arrow streams listed in state.json."""
    folder.mkdir(parents=True)
    bounds = [round(i * table.num_rows / shards) for i in range(shards + 1)]
    names = []
    for i in range(shards):
        name = f"data-{i:05d}-of-{shards:05d}.arrow"
        with pa.OSFile(str(folder / name), "wb") as sink, \
                pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table.slice(bounds[i], bounds[i + 1] - bounds[i]))
        names.append({"filename": name})
    (folder / "state.json").write_text(json.dumps({"_data_files": names}))
    (folder / "dataset_info.json").write_text("{}")
    return folder


def _texts(path: Path, **kw) -> list[str | None]:
    return [r.text for r in load_references(path, **kw)[0]]


def test_arrow_files_and_saved_datasets_read_like_parquet(tmp_path):
    import pyarrow.parquet as pq

    pq.write_table(TABLE, tmp_path / "t.parquet")
    feather.write_feather(TABLE, tmp_path / "t.feather")  # the IPC file format (ARROW1 magic)
    feather.write_feather(TABLE, tmp_path / "t.arrow")
    folder = _saved_dataset(tmp_path / "saved")
    expected = load_references(tmp_path / "t.parquet", columns=("label",))
    for path in (tmp_path / "t.feather", tmp_path / "t.arrow", folder):
        records, stats = load_references(path, columns=("label",))
        assert records == expected[0] and stats == expected[1], path
    assert _texts(folder) == ["first", None, "third", None, "fifth"]
    assert _texts(folder, limit=2) == ["first", None]
    assert data_path_problem(folder) is None


def test_a_saved_dataset_content_digest_is_its_shards(tmp_path):
    folder = _saved_dataset(tmp_path / "saved")
    digest = file_digest(folder)
    (folder / "dataset_info.json").write_text('{"description": "only metadata changed"}')
    assert file_digest(folder) == digest
    neighbour = _saved_dataset(tmp_path / "neighbour", TABLE.set_column(
        0, "text", pa.array(["first", None, "third", "   ", None])))
    assert file_digest(neighbour) != digest


def test_folders_that_are_not_one_dataset_are_refused_by_name(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    assert "not a data file or a Hugging Face dataset" in data_path_problem(plain)
    splits = tmp_path / "dict"
    _saved_dataset(splits / "train")
    _saved_dataset(splits / "test")
    (splits / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')
    problem = data_path_problem(splits)
    assert "DatasetDict (splits: train, test)" in problem and str(splits / "train") in problem
    with pytest.raises(ReferenceDataError, match="DatasetDict"):
        load_references(splits)
    broken = _saved_dataset(tmp_path / "broken")
    (broken / "data-00001-of-00002.arrow").unlink()
    assert "is missing" in data_path_problem(broken)
    (tmp_path / "bad.arrow").write_bytes(b"not arrow at all")
    with pytest.raises(ReferenceDataError, match="not a readable Arrow file"):
        load_references(tmp_path / "bad.arrow")


def test_a_non_text_column_is_refused_by_the_schema(tmp_path):
    folder = _saved_dataset(tmp_path / "saved", pa.table({"text": [1, 2], "n": [3, 4]}), 1)
    with pytest.raises(ReferenceDataError, match="holds int64, not text"):
        load_references(folder)


def test_what_datasets_save_to_disk_writes(tmp_path):
    datasets = pytest.importorskip("datasets", reason="the optional extra dplang[hf]")
    ds = datasets.Dataset.from_dict({"text": ["a", None, "c", " ", "e"], "stars": [1, 2, 3, 4, 5]})
    ds.select([4, 0, 2]).save_to_disk(str(tmp_path / "selected"))
    records, _stats = load_references(tmp_path / "selected", columns=("stars",))
    assert [(r.text, r.labels["stars"]) for r in records] == [("e", "5"), ("a", "1"), ("c", "3")]
    ds.save_to_disk(str(tmp_path / "all"), num_shards=2)
    assert _texts(tmp_path / "all") == ["a", None, "c", None, "e"]
    assert _texts(tmp_path / "all") == [
        r["text"] if r["text"] and r["text"].strip() else None
        for r in datasets.load_from_disk(str(tmp_path / "all"))]


def test_generate_and_sample_take_a_saved_dataset_folder(tmp_path, capsys, monkeypatch):
    """``--data`` takes a saved dataset (a folder) and an Arrow file: the same generations as
    the same rows in a CSV file (same seed, the two runs' noise coupled as an audit couples
    it: each release otherwise draws its own), charged under the folder's resolved path."""
    import dplang.cli.generate as gen_cli
    from dplang.cli.app import main
    from dplang.models import ToyModel
    from dplang.privacy.ledger import PrivacyLedger

    model = ToyModel(vocab_size=30, eos_after=None)
    monkeypatch.setattr(gen_cli, "_load_model", lambda spec, dtype="float32", **kw: model)
    texts = [f"review number {i} was fine" for i in range(9)]
    stars = [str(i % 5 + 1) for i in range(9)]
    table = pa.table({"text": texts, "stars": stars})
    folder = _saved_dataset(tmp_path / "reviews", table, shards=3)
    csv_path = tmp_path / "reviews.csv"
    csv_path.write_text("text,stars\n" + "".join(
        f"{t},{s}\n" for t, s in zip(texts, stars, strict=True)))

    def generate(data, out):
        code = main(["generate", "--data", str(data), "--out", str(out), "--epsilon", "5",
                     "-B", "3", "-T", "4", "--seed", "7", "-q"])
        assert code == 0, capsys.readouterr().err
        return [json.loads(line)["text"] for line in out.read_text().splitlines()]

    generate(folder, tmp_path / "a.jsonl")
    assert len(PrivacyLedger().releases(str(folder.resolve()))) == 1
    from dplang.textgen.orchestration import GenerationRequest, execute_plan, plan_generation

    coupled = []
    for i, data in enumerate((folder, csv_path)):
        req = GenerationRequest(data=data, out=tmp_path / f"coupled-{i}.jsonl",
                                batch_size=3, max_tokens=4, epsilon=5.0, seed=7,
                                temperature=1.2, top_k=50, coupling="same rows", public_seed=True,
                                ledger=tmp_path / f"audit-{i}.sqlite")
        execute_plan(plan_generation(req, lambda _spec: model))
        coupled.append([json.loads(line)["text"] for line in req.out.read_text().splitlines()])
    assert coupled[0] == coupled[1] and len(coupled[0]) == 3
    code = main(["sample", "--data", str(folder), "--columns", "stars", "--domain",
                 "stars=1..5", "--epsilon", "1", "--out", str(tmp_path / "s.csv"), "-q"])
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "s.csv").read_text().startswith("stars\n")

"""Public files name a model by its own name, never the folders above it; the digests
identify it, so a run resumes whichever way its model's path is spelled, and runs of older
versions (which recorded the path as typed) resume as the same release."""

import json
import shutil

import pytest

import dplang.models.prompt_side as prompt_side
import dplang.textgen.orchestration as orchestration
from dplang.cli.app import main
from dplang.models.base import public_model_name
from dplang.privacy.ledger import PrivacyLedger


@pytest.mark.parametrize(("spec", "name"), [
    ("default", "default"), ("/home/ana/models/llama-1b", "llama-1b"),
    ("/home/ana/models/llama-1b/", "llama-1b"), ("./m", "m"), ("m", "m"),
    ("~/x/gemma.Q4.gguf", "gemma.Q4.gguf"),
])
def test_public_model_name(spec, name):
    assert public_model_name(spec) == name


def test_a_dot_is_named_by_its_folder(tmp_path, monkeypatch):
    (tmp_path / "mymodel").mkdir()
    monkeypatch.chdir(tmp_path / "mymodel")
    assert public_model_name(".") == public_model_name("./") == "mymodel"


def _run(data, out, model):
    return main(["generate", "--data", str(data), "--out", str(out), "--epsilon", "3",
                 "-B", "3", "-T", "3", "--model", model, "-q"])


def _releases(data):
    return PrivacyLedger().spent(str(data.resolve())).releases


@pytest.fixture
def setup(tmp_path, tiny_llama_dir):
    data = tmp_path / "d.csv"
    data.write_text("text\n" + "\n".join(f"review {i} was fine" for i in range(6)) + "\n")
    return data, tmp_path / "runs" / "x.jsonl", tiny_llama_dir


def test_the_manifest_names_the_model_and_not_its_folders(setup, capsys, monkeypatch):
    data, out, model = setup
    assert _run(data, out, str(model)) == 0, capsys.readouterr().err
    text = out.with_name("x.manifest.json").read_text()
    fp = json.loads(text)["fingerprint"]
    assert fp["parameters"]["model"] == fp["model_id"] == model.name
    assert str(model.parent) not in text
    private = json.loads((out.parent / ".dplang-private" / "x.private.json").read_text())
    assert private["model"] == str(model)
    # the same model by another spelling, or a copy in another folder: the same run
    monkeypatch.chdir(model.parent)
    assert _run(data, out, f"./{model.name}") == 0, capsys.readouterr().err
    copy = data.parent / "elsewhere" / model.name
    shutil.copytree(model, copy)
    assert _run(data, out, str(copy)) == 0, capsys.readouterr().err
    assert _releases(data) == 1


def test_a_run_of_an_older_version_resumes_as_the_same_release(setup, capsys, monkeypatch):
    data, out, model = setup
    with monkeypatch.context() as older:  # it recorded the model's path as typed
        older.setattr(orchestration, "public_model_name", str)
        older.setattr(prompt_side, "public_model_name", str)
        assert _run(data, out, str(model)) == 0, capsys.readouterr().err
    manifest = out.with_name("x.manifest.json").read_text()
    assert json.loads(manifest)["fingerprint"]["model_id"] == str(model)
    assert _run(data, out, str(model)) == 0, capsys.readouterr().err
    assert _releases(data) == 1  # the stored fingerprint keeps the ledger's release id
    assert out.with_name("x.manifest.json").read_text() == manifest


def test_evaluate_knows_a_runs_model_by_name_and_files(setup, capsys, tmp_path):
    """``evaluate``'s length metric reuses a run's token counts only for the run's model: a
    model named as the run's with other files (another tokenizer) is not it."""
    from dplang.evaluation.data import SyntheticRun
    from dplang.evaluation.metrics import _same_model

    data, out, model = setup
    assert _run(data, out, str(model)) == 0, capsys.readouterr().err
    manifest = json.loads(out.with_name("x.manifest.json").read_text())
    run = SyntheticRun(out, [], [], manifest, "")
    assert _same_model(run, str(model))
    copy = tmp_path / "copy" / model.name
    shutil.copytree(model, copy)
    assert _same_model(run, str(copy))
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-3}))
    assert not _same_model(run, str(copy))
    other = tmp_path / "other"
    shutil.copytree(model, other)
    assert not _same_model(run, str(other))  # another name


def test_a_model_built_in_memory_is_named_without_its_folders(tiny_llama_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dplang.models.base import local_model_name
    from dplang.models.transformers import TransformersModel

    hf = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    model = TransformersModel(model=hf, tokenizer=tokenizer, threads=1)
    assert model.model_id == tiny_llama_dir.name
    assert local_model_name("google/gemma-3-270m") == "google/gemma-3-270m"  # a hub id
    assert local_model_name(str(tiny_llama_dir)) == tiny_llama_dir.name

"""Issue 35 §5: limits that were not checked — the model's context window, -T beyond any
model, a budget above the limit, flags that would do nothing, an unsupported architecture
seen in config.json before any data is read, a tokenizer that does not fit the model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dplang.cli.app import main
from dplang.privacy.ledger import PrivacyLedger


def _data(tmp: Path) -> Path:
    path = tmp / "d.csv"
    path.write_text("text\n" + "".join(f"review number {i} was fine\n" for i in range(14)))
    return path


def _copy_with_config(src: Path, dest: Path, **changes) -> Path:
    shutil.copytree(src, dest)
    config = json.loads((dest / "config.json").read_text())
    config.update(changes)
    (dest / "config.json").write_text(json.dumps(config))
    return dest


def _run(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().err


def _nothing_charged() -> bool:
    return not PrivacyLedger().datasets()


def test_a_run_that_does_not_fit_the_context_is_refused(tmp_path, capsys, tiny_llama_dir):
    small = _copy_with_config(tiny_llama_dir, tmp_path / "small", max_position_embeddings=64)
    code, err = _run(capsys, "generate", "--data", str(_data(tmp_path)), "--model", str(small),
                     "--epsilon", "3", "-B", "2", "-T", "100", "--out",
                     str(tmp_path / "o.jsonl"), "-q")
    assert code == 2 and "has a context of 64" in err and "--max-tokens 100" in err, err
    assert err.count("\n") == 1 and _nothing_charged() and not (tmp_path / "o.jsonl").exists()


def test_an_absurd_max_tokens_is_refused_before_anything_loads(tmp_path, capsys):
    code, err = _run(capsys, "generate", "--data", str(_data(tmp_path)), "--epsilon", "3",
                     "-T", "1000000000000", "--out", str(tmp_path / "o.jsonl"))
    assert code == 2 and "--max-tokens must be at most 1,048,576" in err, err


def test_a_budget_above_the_limit_is_refused(capsys):
    code, err = _run(capsys, "ledger", "budget", "ds", "--epsilon", "1000", "--delta", "1e-6")
    assert code == 2 and "above dplang's limit" in err and _nothing_charged()


@pytest.mark.parametrize(("extra", "needle"), [
    (("--workers", "4"), "--workers 4 applies to --executor local or ray"),
    (("--worker-timeout", "30"), "--worker-timeout applies to --executor local or ray"),
])
def test_flags_that_would_do_nothing_are_refused(tmp_path, capsys, extra, needle):
    code, err = _run(capsys, "generate", "--data", str(_data(tmp_path)), "--epsilon", "3",
                     "--out", str(tmp_path / "o.jsonl"), *extra)
    assert code == 2 and needle in err, err


def test_system_with_a_base_model_is_refused(tmp_path, capsys, tiny_llama_dir):
    code, err = _run(capsys, "generate", "--data", str(_data(tmp_path)), "--model",
                     str(tiny_llama_dir), "--epsilon", "3", "-B", "2", "-T", "2",
                     "--system", "You are a chatbot", "--out", str(tmp_path / "o.jsonl"), "-q")
    assert code == 2 and "has no chat template" in err and _nothing_charged(), err


def test_an_unsupported_architecture_is_refused_before_the_data_is_read(
        tmp_path, capsys, tiny_llama_dir, monkeypatch):
    gpt2 = _copy_with_config(tiny_llama_dir, tmp_path / "gpt2", model_type="gpt2")
    import dplang.io as io

    reads = []
    monkeypatch.setattr(io, "load_references", lambda *a, **k: reads.append(1))
    code, err = _run(capsys, "generate", "--data", str(_data(tmp_path)), "--model", str(gpt2),
                     "--epsilon", "3", "--out", str(tmp_path / "o.jsonl"))
    assert code == 2 and "architecture 'gpt2' (config.json) is not one" in err, err
    assert not reads


def test_a_tokenizer_larger_than_the_model_is_refused_in_one_line(tmp_path, tiny_llama_dir):
    """A tokenizer with more tokens than the model's output layer (another model's) was a raw
    IndexError mid-run; it is refused at load, naming both sizes."""
    from transformers import AutoTokenizer

    from dplang.models import TransformersModel
    from dplang.models.errors import UnsupportedModelError

    other = tmp_path / "other"
    shutil.copytree(tiny_llama_dir, other)
    tokenizer = AutoTokenizer.from_pretrained(str(other))
    tokenizer.add_tokens([f"extra{i}" for i in range(400)])
    tokenizer.save_pretrained(str(other))
    with pytest.raises(UnsupportedModelError, match=r"the tokenizer has 7\d\d tokens but the "
                       r"model's output layer 300: they do not belong together"):
        TransformersModel(other, check_invariance=False, verify=False)


@pytest.mark.parametrize("edit", ["config", "tokenizer"])
def test_a_model_whose_other_files_changed_is_another_release(tmp_path, capsys,
                                                              tiny_llama_dir, edit):
    """The same weights, seed and data, but the model's configuration (its norm's ε) or its
    tokenizer (no BOS token added) changed in place: other texts, so another release (the
    seed is refused for it), never a rerun charged once. Found by a review: the fingerprint
    named the weight files only."""
    model = _copy_with_config(tiny_llama_dir, tmp_path / "m")
    data = _data(tmp_path)
    args = ["generate", "--data", str(data), "--model", str(model), "--epsilon", "3", "-B",
            "2", "-T", "3", "--seed", "11", "--dataset", "d", "-q"]
    assert _run(capsys, *args, "--out", str(tmp_path / "a.jsonl"))[0] == 0
    assert _run(capsys, *args, "--out", str(tmp_path / "a2.jsonl"))[0] == 0  # a rerun
    assert PrivacyLedger().spent("d").releases == 1
    if edit == "config":
        config = json.loads((model / "config.json").read_text())
        config["rms_norm_eps"] = 0.5
        (model / "config.json").write_text(json.dumps(config))
    else:
        tok = json.loads((model / "tokenizer.json").read_text())
        tok["post_processor"] = None
        (model / "tokenizer.json").write_text(json.dumps(tok))
    code, err = _run(capsys, *args, "--out", str(tmp_path / "b.jsonl"))
    assert code == 3 and "seed" in err, err
    assert PrivacyLedger().spent("d").releases == 1 and not (tmp_path / "b.jsonl").exists()
    manifest = json.loads((tmp_path / "a.manifest.json").read_text())
    assert len(manifest["fingerprint"]["model_files_sha256"]) == 64

"""A folder's tokenizer read directly from tokenizer.json (dplang.models.tokenizer_loading):
the same tokenizer as AutoTokenizer's, used only where that was found so on this machine."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from dplang.models import tokenizer_loading
from dplang.models.tokenizer_loading import load_tokenizer, tokenizer_summary


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DPLANG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DPLANG_RECHECK_INVARIANCE", raising=False)
    return tmp_path / "cache" / "tokenizers"


@pytest.fixture
def auto_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Counts AutoTokenizer's loads."""
    from transformers import AutoTokenizer

    calls: list[str] = []
    real = AutoTokenizer.from_pretrained

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(str(args[0]))
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", counted)
    return calls


def _verdicts(cache: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(cache.glob("*.json"))]


def test_the_default_models_tokenizer_is_read_directly_once_found_the_same(
        tmp_path: Path, auto_loads: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoTokenizer

    from dplang.models.default import ensure_default_model

    folder = ensure_default_model()  # from the usual cache; the records in a new one
    monkeypatch.setenv("DPLANG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DPLANG_RECHECK_INVARIANCE", raising=False)
    cache = tmp_path / "cache" / "tokenizers"
    first = load_tokenizer(folder)
    assert len(auto_loads) == 1  # compared with AutoTokenizer's, which is returned
    assert _verdicts(cache) == [{"same": True, "class": "transformers.models.gemma."
                                 "tokenization_gemma.GemmaTokenizer"}]
    second = load_tokenizer(folder)
    assert len(auto_loads) == 1  # on record: read directly
    assert type(second) is type(first)
    reference = AutoTokenizer.from_pretrained(str(folder))
    assert tokenizer_summary(second) == tokenizer_summary(reference)
    text = "The food was great, the service slow.\n\n<start_of_turn>user ünï 🤖"
    for special in (False, True):
        assert (second(text, add_special_tokens=special)["input_ids"]
                == reference(text, add_special_tokens=special)["input_ids"])


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_tiny_models_tokenizers_with_and_without_a_chat_template(
        arch: str, tiny_llama_dir: Path, tiny_gemma_dir: Path, cache: Path,
        auto_loads: list[str]) -> None:
    from transformers import AutoTokenizer

    folder = tiny_llama_dir if arch == "llama" else tiny_gemma_dir
    load_tokenizer(folder)
    fast = load_tokenizer(folder)
    assert len(auto_loads) == 1 and _verdicts(cache)[0]["same"] is True
    reference = AutoTokenizer.from_pretrained(str(folder))
    assert tokenizer_summary(fast) == tokenizer_summary(reference)
    assert bool(fast.chat_template) == (arch == "gemma3")


def test_a_difference_keeps_autotokenizers_and_is_on_record(
        tiny_gemma_dir: Path, cache: Path, auto_loads: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A direct read that differs in anything a run reads (here the chat template lost) is not
    used, now or at the next load."""
    real = tokenizer_loading._init_kwargs

    def without_template(folder: Path) -> dict[str, Any]:
        kwargs = real(folder)
        kwargs.pop("chat_template", None)
        return kwargs

    monkeypatch.setattr(tokenizer_loading, "_init_kwargs", without_template)
    built: list[int] = []
    real_direct = tokenizer_loading._direct
    monkeypatch.setattr(tokenizer_loading, "_direct",
                        lambda *a: built.append(1) or real_direct(*a))
    first = load_tokenizer(tiny_gemma_dir)
    second = load_tokenizer(tiny_gemma_dir)
    assert first.chat_template and second.chat_template
    assert len(auto_loads) == 2 and _verdicts(cache)[0]["same"] is False
    assert built == [1]  # found different: AutoTokenizer's at once, nothing compared again


def test_a_class_with_behaviour_of_its_own_is_never_read_directly(
        tiny_llama_dir: Path) -> None:
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    class Plain(TokenizersBackend):
        padding_side = "left"

    class Overriding(TokenizersBackend):
        def decode(self, *args: Any, **kwargs: Any) -> str:
            return "something else"

    class WithProperty(TokenizersBackend):  # as DeBERTa's and MPNet's mask_token
        @property
        def mask_token(self) -> str:
            return "<special mask>"

    class WithClassMethod(TokenizersBackend):
        @classmethod
        def from_something(cls) -> None:
            return None

    assert tokenizer_loading._direct(tiny_llama_dir, Plain) is not None
    assert tokenizer_loading._direct(tiny_llama_dir, Overriding) is None
    assert tokenizer_loading._direct(tiny_llama_dir, WithProperty) is None
    assert tokenizer_loading._direct(tiny_llama_dir, WithClassMethod) is None
    assert tokenizer_loading._direct(tiny_llama_dir, type(Overriding)) is None
    assert tokenizer_loading._direct(tiny_llama_dir, None) is None


def test_changed_files_libraries_or_a_recheck_compare_again(
        tiny_llama_dir: Path, tmp_path: Path, cache: Path, auto_loads: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, folder)
    load_tokenizer(folder)
    load_tokenizer(folder)
    assert len(auto_loads) == 1
    config = folder / "tokenizer_config.json"
    stat = config.stat()
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # an edited file
    load_tokenizer(folder)
    assert len(auto_loads) == 2
    model_config = folder / "config.json"  # it can decide the class AutoTokenizer picks
    stat = model_config.stat()
    os.utime(model_config, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    load_tokenizer(folder)
    assert len(auto_loads) == 3
    (folder / "additional_chat_templates").mkdir()
    (folder / "additional_chat_templates" / "tool_use.jinja").write_text("{{ messages }}")
    load_tokenizer(folder)
    assert len(auto_loads) == 4
    # a named template the direct read does not build: found different, AutoTokenizer's kept
    assert isinstance(load_tokenizer(folder).chat_template, dict)
    assert len(auto_loads) == 5
    shutil.rmtree(folder / "additional_chat_templates")
    load_tokenizer(folder)  # the folder as it was before: its record (the same) again
    assert len(auto_loads) == 5
    auto_loads.clear()
    from importlib import metadata

    real_version = metadata.version
    with monkeypatch.context() as m:
        m.setattr(metadata, "version", lambda name: "0.0" if name == "tokenizers"
                  else real_version(name))
        load_tokenizer(folder)
    assert len(auto_loads) == 1
    monkeypatch.setenv("DPLANG_RECHECK_INVARIANCE", "1")
    load_tokenizer(folder)
    assert len(auto_loads) == 2
    monkeypatch.delenv("DPLANG_RECHECK_INVARIANCE")
    load_tokenizer(folder)
    assert len(auto_loads) == 2


@pytest.mark.parametrize("content", ["[]", "null", '"x"', "{", "", '{"same": "yes"}'])
def test_a_record_that_is_not_ours_is_compared_again(
        content: str, tiny_llama_dir: Path, cache: Path, auto_loads: list[str]) -> None:
    load_tokenizer(tiny_llama_dir)
    (record,) = cache.glob("*.json")
    record.write_text(content)
    load_tokenizer(tiny_llama_dir)
    assert len(auto_loads) == 2 and _verdicts(cache)[0]["same"] is True


def test_a_gguf_file_or_a_folder_without_tokenizer_json_uses_autotokenizer(
        tiny_llama_dir: Path, tmp_path: Path, cache: Path, auto_loads: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoTokenizer

    monkeypatch.setattr(AutoTokenizer, "from_pretrained",
                        lambda *a, **k: auto_loads.append(k.get("gguf_file", "")) or "auto")
    assert load_tokenizer(tiny_llama_dir, "model.gguf") == "auto"
    folder = tmp_path / "no-json"
    folder.mkdir()
    assert load_tokenizer(folder) == "auto"
    assert auto_loads == ["model.gguf", ""] and not cache.exists()


def test_end_of_turn_ids_asked_of_the_rust_tokenizer_are_the_vocabularys(
        tiny_gemma_dir: Path, cache: Path) -> None:
    from dplang.models.hf_loading import _token_id

    tokenizer = load_tokenizer(tiny_gemma_dir)
    vocab = tokenizer.get_vocab()

    class VocabOnly:  # a tokenizer without a Rust backend
        def get_vocab(self) -> dict[str, int]:
            return vocab

    for token in ["<end_of_turn>", "<|eot_id|>", "<|im_end|>", "<|endoftext|>", "<eos>",
                  *list(vocab)[:50]]:
        assert _token_id(tokenizer, token) == vocab.get(token)
        assert _token_id(VocabOnly(), token) == vocab.get(token)

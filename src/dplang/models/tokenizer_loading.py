"""Loading a model folder's tokenizer from its ``tokenizer.json`` in a third of the time.

``AutoTokenizer.from_pretrained`` on the default model's folder takes about 3.5 s on a
two-core CPU, most of every process's start after the model's own weights: transformers reads
the 33 MB ``tokenizer.json`` twice with Python's ``json`` module, then rebuilds the Rust
tokenizer from the vocabulary and merges it extracted. The tokenizers library reads the same
file directly in about 1.3 s. :func:`load_tokenizer` does that -- an instance of the class
``AutoTokenizer`` would have chosen, initialised as that class's common base initialises from a
``tokenizer.json`` -- where it gives the same tokenizer:

* only for a class whose behaviour is its base's: between the class and
  ``TokenizersBackend`` no class defines code other than ``__init__`` (no method, property or
  other descriptor; Gemma's tokenizer class defines only ``__init__``, which builds the Rust
  tokenizer from its own normaliser, pre-tokeniser and decoder and the file's vocabulary:
  that this equals the file's is what the comparison below checks);
* only once the two were compared on this machine: the first load of a folder builds both, and
  the fast one is kept only if everything a run reads of a tokenizer is equal -- the Rust
  tokenizer's serialisation, the special and added tokens, the chat template, the settings,
  the ids of sample texts and the text of sample ids. The verdict is kept on record (dplang's
  cache folder, ``tokenizers/``) under the path, size and modification time of every file of
  the folder (``config.json`` can decide the class) and of its ``additional_chat_templates/``,
  the library versions and this module's source; any change compares again, and so does
  ``DPLANG_RECHECK_INVARIANCE=1``. Otherwise ``AutoTokenizer``'s is used, and a folder found
  different is not tried again under the same key.

Privacy: a tokenizer is public (a function of the model's files); nothing here sees data.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["load_tokenizer", "tokenizer_summary"]

#: ``tokenizer_config.json`` entries that say how to load, not what the tokenizer is.
_LOADING_KEYS = ("tokenizer_class", "backend", "is_local", "local_files_only", "auto_map",
                 "tokenizer_file", "name_or_path")
#: Sample texts whose ids must agree (markup, whitespace runs, scripts, emoji, digits).
_SAMPLES = ("", " ", "Hello, world!", "  two  spaces\n\nand\tTabs\r\n",
            "<bos>markup<eos> <start_of_turn>user\nhi<end_of_turn>\n<pad><unk><mask>",
            "Ünïcödé — “quotes” 中文 日本語 한국어 العربية עברית हिन्दी 🤖👍🏽",
            "3.14159 1,000,000 0x1F $42.00 (555) 123-4567", "a" * 300)


def load_tokenizer(folder: str | os.PathLike[str], gguf_file: str | None = None) -> Any:
    """The tokenizer of a model ``folder`` (or of the GGUF file ``gguf_file`` in it), as
    ``AutoTokenizer.from_pretrained`` gives it: read directly from ``tokenizer.json`` where
    that was found to give the same tokenizer on this machine (see the module docstring),
    else through ``AutoTokenizer``."""
    from transformers import AutoTokenizer

    from dplang.models.records import read_json, recheck_requested, write_json

    folder = Path(folder)
    if gguf_file is not None:
        return AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf_file)
    if not (folder / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(str(folder))
    record = _record_path(folder)
    # a record that is missing or not ours reads as {}: compared again (and rewritten)
    verdict = read_json(record) if record is not None and not recheck_requested() else {}
    if verdict.get("same") is True:
        fast = _direct(folder, _class_named(str(verdict.get("class", ""))))
        if fast is not None:
            return fast
    elif verdict.get("same") is False:
        return AutoTokenizer.from_pretrained(str(folder))  # found different: not tried again
    reference = AutoTokenizer.from_pretrained(str(folder))
    fast = _direct(folder, type(reference))
    same = fast is not None and tokenizer_summary(fast) == tokenizer_summary(reference)
    if record is not None:
        write_json(record.parent, record, {"same": same,
                                           "class": _class_name(type(reference))})
    return reference


def tokenizer_summary(tokenizer: Any) -> dict[str, Any]:
    """Everything a run reads of a tokenizer, as plain values (two tokenizers with equal
    summaries tokenize, render and detokenize alike): the Rust tokenizer's serialisation
    (normaliser, pre-tokeniser, model with its vocabulary and merges, post-processor,
    decoder, added tokens), the settings, special and added tokens, and sample encodings and
    decodings."""
    added = {int(i): [str(t.content), bool(t.special), bool(t.lstrip), bool(t.rstrip),
                      bool(t.normalized), bool(t.single_word)]
             for i, t in (tokenizer.added_tokens_decoder or {}).items()}
    size = len(tokenizer)
    step = max(1, size // 4093)
    ids = list(range(0, size, step)) + sorted(added)
    settings = ("name_or_path", "chat_template", "model_max_length", "padding_side",
                "truncation_side", "model_input_names", "clean_up_tokenization_spaces",
                "split_special_tokens", "add_bos_token", "add_eos_token", "bos_token_id",
                "eos_token_id", "pad_token_id", "unk_token_id")
    return {
        "class": _class_name(type(tokenizer)),
        "backend": tokenizer.backend_tokenizer.to_str(),
        "settings": {name: repr(getattr(tokenizer, name, None)) for name in settings},
        "special": repr(tokenizer.special_tokens_map),
        "special_ids": list(tokenizer.all_special_ids),
        "added": added,
        "size": size,  # (the vocabulary and merges are in the backend's serialisation)
        "ids": [[list(tokenizer(text, add_special_tokens=special)["input_ids"])
                 for special in (False, True)] for text in _SAMPLES],
        "text": [tokenizer.decode(ids, skip_special_tokens=skip) for skip in (False, True)],
    }


def _direct(folder: Path, cls: type | None) -> Any:
    """An instance of ``cls`` initialised from ``folder/tokenizer.json`` by the tokenizers
    library (``TokenizersBackend.__init__``), or ``None`` where ``cls`` adds behaviour of its
    own or anything fails."""
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return None
    if cls is None or not issubclass(cls, TokenizersBackend):
        return None
    for klass in cls.__mro__[:cls.__mro__.index(TokenizersBackend)]:
        if any(name != "__init__" and _is_behaviour(value) for name, value in
               vars(klass).items()):
            return None  # behaviour of its own: only AutoTokenizer builds it faithfully
    try:
        kwargs = _init_kwargs(folder)
        tokenizer = cls.__new__(cls)
        TokenizersBackend.__init__(tokenizer, tokenizer_file=str(folder / "tokenizer.json"),
                                   name_or_path=str(folder), **kwargs)
    except Exception:
        return None
    return tokenizer


def _is_behaviour(value: Any) -> bool:
    """Whether a class attribute is code (a method, property, class or static method, any
    descriptor or callable other than a nested class), not a plain setting."""
    if isinstance(value, type):
        return False
    return (callable(value) or isinstance(value, (property, classmethod, staticmethod))
            or hasattr(value, "__get__"))


def _init_kwargs(folder: Path) -> dict[str, Any]:
    """The settings ``from_pretrained`` would pass: ``tokenizer_config.json``'s entries (less
    those about loading), the special tokens map and the chat template's file."""
    kwargs: dict[str, Any] = {}
    config = folder / "tokenizer_config.json"
    if config.is_file():
        kwargs.update(json.loads(config.read_text(encoding="utf-8")))
    special = folder / "special_tokens_map.json"
    if special.is_file():
        for name, value in json.loads(special.read_text(encoding="utf-8")).items():
            kwargs.setdefault(name, value)
    for name in _LOADING_KEYS:
        kwargs.pop(name, None)
    if (folder / "chat_template.jinja").is_file():
        kwargs["chat_template"] = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    elif (folder / "chat_template.json").is_file():
        data = json.loads((folder / "chat_template.json").read_text(encoding="utf-8"))
        kwargs["chat_template"] = data.get("chat_template")
    return kwargs


def _class_named(name: str) -> type | None:
    """The class of dotted ``name`` (the recorded reference's), or ``None``."""
    import importlib

    module, _, qualname = name.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), qualname)
    except Exception:
        return None
    return found if isinstance(found, type) else None


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _record_path(folder: Path) -> Path | None:
    """Where the verdict for ``folder``'s tokenizer files is kept (``None``: no cache)."""
    from importlib import metadata

    import dplang
    from dplang.models.cache import cache_dir
    from dplang.models.records import file_stamps

    # every file AutoTokenizer may read (config.json can decide the class)
    files = file_stamps([p for where in (folder, folder / "additional_chat_templates")
                         if where.is_dir() for p in sorted(where.iterdir()) if p.is_file()])
    versions = {}
    for package in ("transformers", "tokenizers"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "absent"
    blob = json.dumps({"files": files, "versions": versions, "dplang": dplang.__version__,
                       "source": hashlib.sha256(Path(__file__).read_bytes()).hexdigest()},
                      sort_keys=True)
    try:
        return cache_dir() / "tokenizers" / (hashlib.sha256(blob.encode()).hexdigest()[:32]
                                             + ".json")
    except Exception:
        return None

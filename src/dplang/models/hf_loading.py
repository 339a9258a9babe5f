"""Loading a Hugging Face causal LM for the transformers backend: paths, GGUF files, the
transformer body, the LM head's post-processing, EOS ids and the weights' digest."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "find_body",
    "find_eos_ids",
    "folder_digest",
    "load_pretrained",
    "logit_postprocessing",
    "model_files",
    "resolve_model_path",
    "strip_quantization",
    "support_files_digest",
    "weights_digest_of",
]


def resolve_model_path(path: Path, gguf_file: str | None) -> tuple[Path, str | None]:
    """(folder, GGUF file name or None) for a model folder or a ``.gguf`` file path."""
    if not path.exists():
        raise FileNotFoundError(f"model path does not exist: {path}")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(f"a model file must be a .gguf file, got {path}")
        return path.parent, path.name
    if gguf_file is not None and not (path / gguf_file).is_file():
        raise FileNotFoundError(f"GGUF file not found: {path / gguf_file}")
    return path, gguf_file


@contextlib.contextmanager
def no_library_bars() -> Any:
    """While active, transformers and huggingface_hub draw no progress bar (restored after)."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def load_pretrained(folder: Path, gguf_name: str | None, tokenizer: Any) -> tuple[Any, Any]:
    """The float32 causal LM (GGUF blocks dequantised) and its tokenizer."""
    from transformers import AutoModelForCausalLM

    from dplang.models.tokenizer_loading import load_tokenizer

    kwargs: dict[str, Any] = {"dtype": torch.float32}
    if gguf_name is not None:
        kwargs["gguf_file"] = gguf_name
        try:  # transformers >= 5 can keep GGUF blocks packed; we want plain float32.
            from transformers import GgufConfig

            kwargs["quantization_config"] = GgufConfig(dequantize=True)
        except ImportError:  # pragma: no cover - older transformers always dequantise
            pass
    with no_library_bars():  # transformers' "Loading weights" bar is not dplang's progress
        model, info = AutoModelForCausalLM.from_pretrained(str(folder), output_loading_info=True,
                                                           **kwargs)
    missing = sorted(info.get("missing_keys") or ())
    if missing:  # transformers fills them with random numbers: another model at every load
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3
                                          else "")
        raise ValueError(f"{folder / gguf_name if gguf_name else folder} holds no weights for "
                         f"{shown} of {type(model).__name__}: they would be random, another "
                         "model at every load (is it a causal language model's checkpoint?)")
    strip_quantization(model)
    if tokenizer is None:
        tokenizer = load_tokenizer(folder, gguf_name)
    return model, tokenizer


def find_body(model: Any) -> Any:
    """The transformer body (embeddings + layers + final norm), without the LM head."""
    body = None
    get_decoder = getattr(model, "get_decoder", None)
    if callable(get_decoder):
        try:
            body = get_decoder()
        except (AttributeError, NotImplementedError):
            body = None
    if body is None or body is model:
        body = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    if body is None or body is model:
        raise ValueError(f"cannot find the transformer body of {type(model).__name__}")
    return body


def logit_postprocessing(config: Any) -> tuple[float | None, float]:
    """(soft-cap, multiplier) the architecture applies to the LM-head output."""
    softcap = getattr(config, "final_logit_softcapping", None)
    multiplier = 1.0
    logit_scale = getattr(config, "logit_scale", None)  # Cohere: logits * logit_scale
    if isinstance(logit_scale, (int, float)):
        multiplier *= float(logit_scale)
    logits_scaling = getattr(config, "logits_scaling", None)  # Granite: logits / scaling
    if isinstance(logits_scaling, (int, float)) and logits_scaling:
        multiplier /= float(logits_scaling)
    return (float(softcap) if softcap else None), multiplier


def find_eos_ids(model: Any, tokenizer: Any, vocab_size: int) -> frozenset[int]:
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), model.config.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(i) for i in source)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    for token in ("<end_of_turn>", "<|eot_id|>", "<|im_end|>", "<|endoftext|>"):
        found = _token_id(tokenizer, token)
        if found is not None:
            ids.add(found)
    return frozenset(i for i in ids if 0 <= i < vocab_size)


def _token_id(tokenizer: Any, token: str) -> int | None:
    """The id of ``token`` in the tokenizer's vocabulary (added tokens included), or ``None``:
    asked of the Rust tokenizer where there is one (``get_vocab`` builds a dict of the whole
    vocabulary, 0.4 s for the default model's 262,144 tokens)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    token_to_id = getattr(backend, "token_to_id", None)
    if callable(token_to_id):
        found = token_to_id(token)
        return None if found is None else int(found)
    vocab = tokenizer.get_vocab()
    return int(vocab[token]) if token in vocab else None


#: Added tokens that are control tokens by their form though a tokenizer may not flag them
#: special (Gemma's ``<start_of_image>``, Llama's ``<|eot_id|>``, ``[multimodal]``, ``[@BOS@]``);
#: HTML-like tags (``<table>``) and whitespace runs are text.
_CONTROL_FORM = re.compile(r"^(<\|[^|\s]+\|>|<[a-z]+(_[a-z0-9]+)+>|<unused\d+>"
                           r"|\[[A-Za-z_]+\]|\[@[A-Za-z_]+@\])$")


def control_token_ids(tokenizer: Any, vocab_size: int,
                      eos_ids: frozenset[int]) -> frozenset[int]:
    """The tokenizer's special and control tokens, which a generation never samples (their
    text is markup for the model, not content): its special ids, the added tokens it flags
    special, and added tokens of a control token's form; end-of-sequence ids excepted (they
    end a text). Public: a function of the tokenizer only."""
    ids = {int(i) for i in getattr(tokenizer, "all_special_ids", []) or []}
    for index, token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        content = str(getattr(token, "content", token))
        if getattr(token, "special", False) or _CONTROL_FORM.match(content):
            ids.add(int(index))
    return frozenset(i for i in ids if 0 <= i < vocab_size and i not in eos_ids)


def context_length_of(config: Any) -> int | None:
    """The context window of a model configuration (``max_position_embeddings``), capped by
    what the exact decoder holds; ``None`` when the configuration does not say."""
    from dplang.models.attention import MAX_POSITIONS

    text = getattr(config, "text_config", None) or config
    value = getattr(text, "max_position_embeddings", None)
    if not isinstance(value, int) or value <= 0:
        return None
    return min(value, MAX_POSITIONS)


def model_files(path: Path, gguf_name: str | None) -> list[Path]:
    """The files a model folder's weights and configuration are read from."""
    if gguf_name is not None:
        return [path / gguf_name]
    files = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))
    return [*files, path / "config.json"]


def weights_digest_of(path: Path | None, gguf_name: str | None, model: Any) -> str:
    digest = hashlib.sha256()
    files: list[Path] = []
    if path is not None and path.is_dir():
        if gguf_name is not None:
            files = [path / gguf_name]
        else:
            files = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))
    if files:
        for file in files:
            if len(files) > 1:  # one file: its plain sha256 (what `sha256sum` prints)
                digest.update(file.name.encode())
            with file.open("rb") as handle:
                while block := handle.read(1 << 22):
                    digest.update(block)
        return digest.hexdigest()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


#: Folders inside a model folder that no loader reads: version control and download
#: bookkeeping (whose etags and times change when the same files are downloaded again).
_BOOKKEEPING = (".git", ".cache")
#: Weight files, identified by :func:`weights_digest_of` (``model_sha256``), left out of
#: :func:`support_files_digest`.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".ckpt", ".h5", ".msgpack",
                    ".onnx", ".ot")


def _model_files(path: Path) -> list[tuple[str, Path]]:
    """(relative name, path) of every file of a model folder, symlinked folders followed
    (a Hugging Face cache snapshot links to blobs; a shard index may name a file in a linked
    or hidden folder), each real folder once; ``.git/`` and ``.cache/`` left out."""
    found: list[tuple[str, Path]] = []
    seen: set[tuple[int, int]] = set()
    for root, dirs, files in os.walk(path, followlinks=True):
        st = os.stat(root)
        if (st.st_dev, st.st_ino) in seen:  # a link cycle, or a folder linked twice
            dirs[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        here = Path(root)
        if here == path:
            dirs[:] = [d for d in dirs if d not in _BOOKKEEPING]
        for name in files:
            file = here / name
            if file.is_file():
                found.append((file.relative_to(path).as_posix(), file))
    return sorted(found)


def folder_digest(path: Path, *, skip_weights: bool = False) -> str:
    """sha256 over every file a model folder holds (weights, configuration, tokenizer, chat
    template, hidden and symlinked folders included), each with its path relative to the
    folder; of a file, its bytes. Only ``.git/`` and ``.cache/`` (version control, download
    bookkeeping: never read by a loader) are left out; with ``skip_weights`` the weight files
    too (:data:`_WEIGHT_SUFFIXES`, identified by :func:`weights_digest_of`).

    What identifies a public model in a release's fingerprint (:mod:`dplang.release`): a
    model changed in place is another release, never a rerun of the old one."""
    digest = hashlib.sha256()
    files = ([(path.name, path)] if path.is_file() else _model_files(path))
    for name, file in files:
        if skip_weights and file.suffix.lower() in _WEIGHT_SUFFIXES:
            continue
        digest.update(json.dumps([name, file.stat().st_size]).encode())
        with file.open("rb") as handle:
            while block := handle.read(1 << 22):
                digest.update(block)
    return digest.hexdigest()


def support_files_digest(path: Path | None) -> str | None:
    """sha256 of a model folder's files other than its weights (configuration, tokenizer,
    chat template, generation configuration: they change the texts as the weights do), for
    the fingerprint beside ``model_sha256``; None for a model built in memory."""
    if path is None or not path.is_dir():
        return None
    return folder_digest(path, skip_weights=True)


def strip_quantization(model: Any) -> None:
    """Forget a (dequantised) GGUF quantisation config so the model saves as plain weights."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and hasattr(quantizer, "remove_quantization_config"):
        quantizer.remove_quantization_config(model)
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    if getattr(model, "is_quantized", False):
        with contextlib.suppress(AttributeError):  # a read-only property in transformers 5
            model.is_quantized = False

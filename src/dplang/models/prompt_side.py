"""The prompt side of a transformers model: tokenizer, chat template and identity, no weights.

A run whose groups are decoded by workers (``--executor local`` or ``ray``) needs the model's
*prompt side* in its driver only: rendering prompts with the chat template, counting and
truncating references in tokens, and the model's identity for the manifest's fingerprint (model
id, weights digest, dtype, numerics). :class:`PromptSide` is that, loaded from the model's
files (the tokenizer, and the weight files' bytes for the digest) without building the network
or loading its weights; the workers load the whole model and run its load-time checks
(:mod:`dplang.models.invariance`).

:class:`TokenizerText` is the text side that
:class:`~dplang.models.transformers.TransformersModel` uses too: one implementation, so the
driver renders, counts and truncates exactly as the whole model would, and
:func:`numerics_for`, :func:`compute_dtype` and :func:`model_id_for` give the same identity
(a run's manifest is the same bytes whichever of the two the driver loaded).

Privacy contract: a prompt side sees only the texts passed to it and exposes public facts
(identity, template); it never decodes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from dplang.models.attention import BLOCK_SIZE
from dplang.models.base import public_model_name
from dplang.models.dtypes import available_cores, resolve_dtype
from dplang.models.hf_loading import resolve_model_path, support_files_digest, weights_digest_of

__all__ = [
    "ARITHMETIC",
    "PromptSide",
    "TokenizerText",
    "body_bits_for",
    "compute_dtype",
    "model_id_for",
    "numerics_for",
    "prepare_tokenizer",
]


class TokenizerText:
    """Rendering, counting, truncating and decoding text with ``self.tokenizer`` (a Hugging
    Face tokenizer, see :func:`prepare_tokenizer`), and the digest of the model folder's
    files besides the weights (:meth:`support_digest`). A subclass sets ``_path`` (the
    folder, or None for a model built in memory) and ``_identity_given``."""

    tokenizer: Any
    _path: Path | None
    _identity_given: bool
    _support: str | bool | None = False  # support_digest: not computed yet
    _max_token_chars: int | None = None

    @property
    def max_token_chars(self) -> int:
        """The longest token of the vocabulary, in characters (public: a function of the
        tokenizer; :func:`dplang.models.base.reference_prefix`). Computed once."""
        if self._max_token_chars is None:
            self._max_token_chars = max(
                (len(str(t)) for t in self.tokenizer.get_vocab()), default=1) or 1
        return self._max_token_chars

    def support_digest(self) -> str | None:
        """sha256 of the model folder's files other than its weights (configuration,
        tokenizer, chat template: :func:`~dplang.models.hf_loading.support_files_digest`),
        for a run's fingerprint; the same for the whole model and its prompt side. None for a
        model built in memory or one whose identity was given (the packaged default model:
        its package pins every file). Computed once."""
        if self._support is False:
            self._support = (None if self._identity_given
                             else support_files_digest(self._path))
        return self._support

    @property
    def has_chat_template(self) -> bool:
        """Whether the tokenizer carries a chat template."""
        return bool(getattr(self.tokenizer, "chat_template", None))

    def render_prompt(self, user: str, system: str | None = None) -> str:
        """The chat template with a generation prompt, or ``user`` (with ``system`` and a blank
        line before it, if given) for a base model without a template."""
        if not self.has_chat_template:
            return user if system is None else f"{system}\n\n{user}"
        messages = [{"role": "user", "content": user}]
        if system is not None:
            messages.insert(0, {"role": "system", "content": system})
        try:
            return str(
                self.tokenizer.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=True
                )
            )
        except Exception:
            if system is None:
                raise
            # Some templates refuse a system role: fold it into the user turn instead.
            merged = [{"role": "user", "content": f"{system}\n\n{user}"}]
            rendered = self.tokenizer.apply_chat_template(
                merged, tokenize=False, add_generation_prompt=True
            )
            return str(rendered)

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def count_tokens(self, text: str) -> int:
        """Number of tokens of ``text`` (no special tokens added)."""
        return len(self._ids(text))

    def truncate_tokens(self, text: str, max_tokens: int) -> str:
        """``text`` cut to its first ``max_tokens`` tokens (unchanged when it is shorter)."""
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        ids = self._ids(text)
        if len(ids) <= max_tokens:
            return text
        return str(self.tokenizer.decode(ids[:max_tokens], skip_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        """Detokenize generated ids, skipping special tokens."""
        ids = [int(i) for i in token_ids]
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def _prompt_ids(self, prompt: str) -> list[int]:
        """Token ids of a rendered prompt, with BOS added as the tokenizer normally does (once:
        a chat template that already starts with the BOS text does not get a second one)."""
        bos = self.tokenizer.bos_token
        if bos and prompt.startswith(bos):
            return self._ids(prompt)
        return list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])


def prepare_tokenizer(tokenizer: Any) -> Any:
    """Give ``tokenizer`` a pad token (its EOS token, else token 0) if it has none, as the
    backend does at load; returns it."""
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is not None:
            tokenizer.pad_token = tokenizer.eos_token
        else:
            tokenizer.pad_token = tokenizer.convert_ids_to_tokens(0)
    return tokenizer


#: Version of dplang's exact arithmetic (:mod:`dplang.models.exact`): part of a run's numerics.
ARITHMETIC = "exact-integer-1"


def compute_dtype(dtype: str | torch.dtype, device_type: str) -> torch.dtype:
    """The precision for ``--dtype`` (``auto`` is bfloat16 on every device; see
    :func:`~dplang.models.dtypes.resolve_dtype`)."""
    del device_type  # the same arithmetic on every device
    return resolve_dtype(dtype)


def body_bits_for(dtype: torch.dtype) -> int:
    """Bits of the body's integer weights for a precision: 16 for float32, 8 for bfloat16."""
    return 16 if dtype == torch.float32 else 8


def numerics_for(threads: int, dtype: torch.dtype, block_size: int,
                 device_type: str) -> dict[str, Any]:
    """What, besides the weights and the prompts, fixes the bits of a transformers model's
    logits (see :attr:`TransformersModel.numerics`; public). The thread count and the CPU's
    vector capability are not listed: they change no bit (docs/privacy.md)."""
    import transformers

    del threads
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "arithmetic": ARITHMETIC,
        "dtype": str(dtype).replace("torch.", ""),
        "body_bits": body_bits_for(dtype),
        "block_size": block_size,
        "device": device_type,
    }


def _context_from_folder(folder: Path) -> int | None:
    """``max_position_embeddings`` of ``folder/config.json`` (of its text part), capped as
    :func:`~dplang.models.hf_loading.context_length_of` caps it."""
    import json
    import types

    from dplang.models.hf_loading import context_length_of

    try:
        raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict):
        return None
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    return context_length_of(types.SimpleNamespace(**{
        "max_position_embeddings": text.get("max_position_embeddings")}))


def model_id_for(folder: Path, gguf_name: str | None) -> str:
    """The default model id of a model loaded from ``folder`` (or its GGUF file): its name
    only (:func:`~dplang.models.base.public_model_name`), which public files record; its
    digests identify it."""
    return public_model_name(str(folder / gguf_name if gguf_name else folder))


def check_device(device: str | torch.device) -> torch.device:
    """``device`` as a ``torch.device`` (cpu or an available cuda), else ``ValueError``."""
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda, got {device}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda: no CUDA GPU is available here")
    return device


class PromptSide(TokenizerText):
    """The prompt side of the transformers model at ``path`` (see the module docstring): the
    same ``render_prompt``, ``count_tokens``, ``truncate_tokens``, ``model_id``,
    ``weights_digest()``, ``dtype``, ``threads`` and ``numerics`` as
    ``TransformersModel(path, ...)`` with the same arguments, without its weights.

    It has no ``vocab_size``, EOS ids or decoding methods: those belong to the workers' models
    (the executors check that every worker's model agrees with this identity and with the
    other workers')."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        gguf_file: str | None = None,
        model_id: str | None = None,
        weights_digest: str | None = None,
        threads: int | None = None,
        dtype: str | torch.dtype = "float32",
        device: str | torch.device = "cpu",
        block_size: int = BLOCK_SIZE,
    ) -> None:
        self.device_type: str = check_device(device).type
        self.dtype = compute_dtype(dtype, self.device_type)
        self.threads = threads if threads is not None else available_cores()
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        self.block_size = int(block_size)
        folder, self._gguf_name = resolve_model_path(Path(path), gguf_file)
        self._path = folder
        from dplang.models.tokenizer_loading import load_tokenizer

        self.tokenizer = prepare_tokenizer(load_tokenizer(folder, self._gguf_name))
        self.model_id = model_id if model_id is not None else model_id_for(folder,
                                                                           self._gguf_name)
        self._digest = weights_digest
        self._identity_given = weights_digest is not None
        #: The context window from the folder's config.json (None when it has none).
        self.context_length: int | None = _context_from_folder(folder)

    @property
    def numerics(self) -> dict[str, Any]:
        """The workers' numerics (:func:`numerics_for`)."""
        return numerics_for(self.threads, self.dtype, self.block_size, self.device_type)

    def weights_digest(self) -> str:
        """sha256 of the weight files (as :meth:`TransformersModel.weights_digest`), computed
        from the files' bytes once and cached."""
        if self._digest is None:
            if self._gguf_name is None and not (any(self._path.glob("*.safetensors"))
                                                or any(self._path.glob("*.bin"))):
                raise ValueError(f"{self._path}: no weight files to identify the model by")
            self._digest = weights_digest_of(self._path, self._gguf_name, None)
        return self._digest

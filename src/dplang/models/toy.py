"""Tiny deterministic models for tests: no weights, no downloads.

* :class:`ToyModel` implements the whole :class:`~dplang.models.base.LogitsModel` protocol as a
  pure function from (prompt text, generated prefix) to float32 logits, with character-level
  toy tokenization. It is cheap enough for property-based tests of the privacy machinery.
* :func:`make_tiny_hf_model` writes a tiny randomly initialised Hugging Face causal LM plus a
  tokenizer trained locally, so :class:`~dplang.models.transformers.TransformersModel` can be
  tested end to end without downloading anything.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch

__all__ = ["ToyDecodeState", "ToyModel", "make_tiny_hf_model"]

#: Characters the toy tokens decode to (token ``i`` -> ``_ALPHABET[i % len(_ALPHABET)]``).
_ALPHABET = " etaoinshrdlucmfwypvbgkjqxz.,!?"


@dataclass
class ToyDecodeState:
    """Decoding state of :class:`ToyModel`: the prompts and the tokens generated so far."""

    prompts: list[str]
    prefixes: list[list[int]] = field(default_factory=list)
    steps: int = 0
    started: list[bool] = field(default_factory=list)

    @property
    def rows(self) -> int:
        """Number of rows still decoded."""
        return len(self.prompts)


class ToyModel:
    """A deterministic toy language model.

    The logits of a row are a pure function of ``(seed, prompt text, generated prefix)``:
    ``scale * (shared + prompt_weight * specific) / sqrt(1 + prompt_weight**2)`` where
    ``shared`` depends only on the prefix (common to all prompts, like a language model's prior)
    and ``specific`` on the prompt and the prefix, both standard normal vectors drawn from
    hash-seeded generators. Public and private prompts therefore give correlated but different
    logits. The hidden state is the logit vector itself and the LM head is the identity, so
    sparse and dense logits agree exactly.

    Args:
        vocab_size: number of tokens (logits per row).
        eos_token_id: the end-of-sequence token.
        seed: selects the pseudo-random function.
        eos_after: ``None``: EOS is never likely (its logit sits 20 below the smallest other
            logit); ``k``: EOS is very unlikely before ``k`` generated tokens and very likely
            (10 above the largest other logit) from then on.
        prompt_weight: how strongly the logits depend on the prompt (0: not at all).
        scale: standard deviation of the logits.
        step_delay: seconds each :meth:`next_hidden` call sleeps (tests of executors that kill
            a worker mid-run); not part of the model's identity: it changes no logit.
        stall_on: a :meth:`next_hidden` call that starts a row whose prompt contains this text
            never returns (a stand-in for a hung worker: a deadlock, stuck I/O, a GPU hang; tests
            of the executors' progress timeout); not part of the model's identity.
        stall_marker: with ``stall_on``, a file path: only the first call to find the file
            absent creates it and stalls, later ones (in any process) run normally (a hang that
            a replacement worker does not repeat). Without it every such call stalls.
    """

    def __init__(
        self,
        vocab_size: int = 16,
        eos_token_id: int = 0,
        seed: int = 0,
        *,
        eos_after: int | None = None,
        prompt_weight: float = 1.0,
        scale: float = 3.0,
        step_delay: float = 0.0,
        stall_on: str | None = None,
        stall_marker: str | os.PathLike[str] | None = None,
    ) -> None:
        if vocab_size < 2:
            raise ValueError("vocab_size must be >= 2")
        if not 0 <= eos_token_id < vocab_size:
            raise ValueError("eos_token_id must be a valid token id")
        if eos_after is not None and eos_after < 0:
            raise ValueError("eos_after must be >= 0 or None")
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.eos_token_ids: frozenset[int] = frozenset({eos_token_id})
        self.seed = seed
        self.eos_after = eos_after
        self.prompt_weight = float(prompt_weight)
        self.scale = float(scale)
        self.step_delay = float(step_delay)
        self.stall_on = stall_on
        self.stall_marker = None if stall_marker is None else str(stall_marker)
        self.hidden_size = vocab_size
        self.model_id = (
            f"toy(vocab_size={vocab_size}, eos={eos_token_id}, seed={seed}, "
            f"eos_after={eos_after}, prompt_weight={prompt_weight}, scale={scale})"
        )

    # ---------------------------------------------------------------- identity

    def weights_digest(self) -> str:
        """A hash of the toy's parameters."""
        return hashlib.sha256(self.model_id.encode()).hexdigest()

    # ---------------------------------------------------------------- text side

    @property
    def has_chat_template(self) -> bool:
        """Always ``False``: the toy model continues text."""
        return False

    def render_prompt(self, user: str, system: str | None = None) -> str:
        """``user``, with ``system`` and a blank line before it if given."""
        return user if system is None else f"{system}\n\n{user}"

    #: One character per token.
    max_token_chars = 1

    def count_tokens(self, text: str) -> int:
        """One token per character."""
        return len(text)

    def truncate_tokens(self, text: str, max_tokens: int) -> str:
        """The first ``max_tokens`` characters."""
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        return text[:max_tokens]

    def decode(self, token_ids: Sequence[int]) -> str:
        """Each non-EOS token as one character."""
        return "".join(
            _ALPHABET[int(i) % len(_ALPHABET)]
            for i in token_ids
            if int(i) not in self.eos_token_ids
        )

    # ---------------------------------------------------------------- logits

    def _gaussian(self, *parts: object) -> np.ndarray:
        digest = hashlib.sha256(repr((self.seed, *parts)).encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:16], "little"))
        return rng.standard_normal(self.vocab_size)

    def logits_for(self, prompt: str, prefix: Sequence[int]) -> np.ndarray:
        """float32 logits of the next token after ``prompt`` followed by ``prefix``."""
        key = tuple(int(t) for t in prefix)
        shared = self._gaussian("shared", key)
        specific = self._gaussian("prompt", prompt, key)
        weight = self.prompt_weight
        logits = self.scale * (shared + weight * specific) / math.sqrt(1.0 + weight * weight)
        others = np.delete(logits, self.eos_token_id)
        if self.eos_after is not None and len(key) >= self.eos_after:
            logits[self.eos_token_id] = others.max() + 10.0
        else:
            logits[self.eos_token_id] = others.min() - 20.0
        return logits.astype(np.float32)

    # ---------------------------------------------------------------- protocol

    def encode_prompts(self, prompts: Sequence[str]) -> ToyDecodeState:
        """Remember the prompts; nothing is computed yet."""
        if isinstance(prompts, str):
            raise TypeError("encode_prompts takes a sequence of prompts, not one string")
        prompts = [str(p) for p in prompts]
        return ToyDecodeState(prompts=prompts, prefixes=[[] for _ in prompts],
                              started=[False] * len(prompts))

    def add_prompts(self, state: ToyDecodeState, prompts: Sequence[str],
                    prefixes: Sequence[str | None] | None = None) -> None:
        """Append rows; they start at the next :meth:`next_hidden` call (``prefixes`` change
        nothing: a row's logits are a function of its whole prompt)."""
        if isinstance(prompts, str):
            raise TypeError("add_prompts takes a sequence of prompts, not one string")
        state.prompts.extend(str(p) for p in prompts)
        state.prefixes.extend([] for _ in prompts)
        state.started.extend(False for _ in prompts)

    def row_invariance_checked(self) -> bool:
        """Always true: a row's logits are a pure function of its own tokens, computed row by
        row in float64 (nothing is shared between rows), so there is nothing to check."""
        return True

    def next_hidden(self, state: ToyDecodeState, tokens: torch.Tensor | None) -> torch.Tensor:
        """Append ``tokens`` to the rows that have run (``None`` when none has) and start the
        others; the hidden state is the logits."""
        started = [i for i, s in enumerate(state.started) if s]
        if not started:
            if tokens is not None and torch.as_tensor(tokens).numel():
                raise ValueError("next_hidden takes tokens=None when no row has run yet")
        else:
            if tokens is None:
                raise ValueError("next_hidden needs one token per row that has run")
            flat = torch.as_tensor(tokens, dtype=torch.int64).reshape(-1).tolist()
            if len(flat) != len(started):
                raise ValueError(f"expected {len(started)} tokens, got {len(flat)}")
            for row, token in zip(started, flat, strict=True):
                if not 0 <= token < self.vocab_size:
                    raise ValueError("token id out of range")
                state.prefixes[row].append(int(token))
        if self.stall_on is not None:
            new = [p for p, s in zip(state.prompts, state.started, strict=True) if not s]
            if any(self.stall_on in p for p in new):
                self._stall()
        state.started = [True] * state.rows
        state.steps += 1
        if self.step_delay > 0:
            time.sleep(self.step_delay)
        if state.rows == 0:
            return torch.zeros((0, self.vocab_size), dtype=torch.float32)
        rows = [self.logits_for(p, s) for p, s in zip(state.prompts, state.prefixes, strict=True)]
        return torch.from_numpy(np.stack(rows))

    def _stall(self) -> None:
        """Never return (see ``stall_on``), unless the stall marker says it already stalled."""
        if self.stall_marker is not None:
            try:
                os.close(os.open(self.stall_marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return
        while True:
            time.sleep(60)

    def logits_from_hidden(
        self, hidden: torch.Tensor, candidates: torch.Tensor | None = None,
        keep_device: bool = False,
    ) -> torch.Tensor:
        """Identity head: ``hidden`` itself, or its ``candidates`` columns per row (on the CPU,
        the toy model's only device, whatever ``keep_device``)."""
        if candidates is None:
            return hidden.to(torch.float32).clone()
        candidates = torch.as_tensor(candidates)
        if candidates.dtype != torch.int64:
            raise TypeError(f"candidates must be int64, got {candidates.dtype}")
        return hidden.to(torch.float32).gather(1, candidates.to(hidden.device))

    def next_logits(
        self,
        state: ToyDecodeState,
        tokens: torch.Tensor | None,
        candidates: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``logits_from_hidden(next_hidden(state, tokens), candidates)``."""
        return self.logits_from_hidden(self.next_hidden(state, tokens), candidates)

    def drop_rows(self, state: ToyDecodeState, keep: torch.Tensor) -> ToyDecodeState:
        """Keep only rows ``keep`` (in place; returns ``state``)."""
        idx = torch.as_tensor(keep, dtype=torch.int64).reshape(-1).tolist()
        if any(b <= a for a, b in itertools.pairwise(idx)):
            raise ValueError("keep must be strictly increasing")
        if idx and (idx[0] < 0 or idx[-1] >= state.rows):
            raise ValueError("keep index out of range")
        state.prompts = [state.prompts[i] for i in idx]
        state.prefixes = [state.prefixes[i] for i in idx]
        state.started = [state.started[i] for i in idx]
        return state


# ---------------------------------------------------------------------- tiny HF model

_CORPUS = [
    "The food was great and the service was friendly.",
    "I would not come back to this restaurant again.",
    "The pasta was cold, but the dessert was wonderful!",
    "Our waiter was slow; the pizza took an hour to arrive.",
    "Here is a review of a restaurant: good coffee, nice staff.",
    "The hotel room was clean and quiet, with a view of the sea.",
    "Prices are fair and portions are large. Five stars.",
    "Paris is the capital of France. Berlin is the capital of Germany.",
]

_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<eos>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def make_tiny_hf_model(
    directory: str | os.PathLike[str],
    *,
    arch: Literal["llama", "gemma3"] = "llama",
    chat_template: bool = False,
    seed: int = 0,
    vocab_size: int = 300,
    sliding_window: int = 4,
    final_logit_softcapping: float | None = None,
) -> Path:
    """Write a tiny randomly initialised causal LM and its tokenizer to ``directory``.

    The tokenizer is a byte-level BPE trained on a few sentences with the ``tokenizers``
    library (special tokens ``<pad> <bos> <eos> <unk>``, BOS added to every encoding). The
    model has hidden size 32 and a few layers: ``arch="llama"`` (untied head, grouped-query
    attention) or ``arch="gemma3"`` (tied head, a sliding-window layer with window
    ``sliding_window`` between full-attention layers, optional final-logit soft-capping).
    Weights are drawn with a large initializer range so that logits differ visibly between
    inputs. With ``chat_template`` a simple chat template (starting with the BOS text) is set.
    Returns the directory.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)

    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_CORPUS, trainer)
    pad_id, bos_id, eos_id, _ = (backend.token_to_id(t) for t in specials)
    backend.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", bos_id)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
    )
    if chat_template:
        tokenizer.chat_template = _CHAT_TEMPLATE
    tokenizer.save_pretrained(directory)
    vocab = backend.get_vocab_size()

    common = {
        "vocab_size": vocab,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "max_position_embeddings": 512,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "initializer_range": 0.3,
    }
    if arch == "llama":
        from transformers import LlamaConfig

        config = LlamaConfig(
            num_hidden_layers=2, num_key_value_heads=2, tie_word_embeddings=False, **common
        )
    elif arch == "gemma3":
        from transformers import Gemma3TextConfig

        config = Gemma3TextConfig(
            num_hidden_layers=3,
            num_key_value_heads=1,
            head_dim=8,
            query_pre_attn_scalar=8,
            sliding_window=sliding_window,
            layer_types=["full_attention", "sliding_attention", "full_attention"],
            final_logit_softcapping=final_logit_softcapping,
            **common,
        )
    else:
        raise ValueError(f"unknown arch {arch!r}")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(directory)
    return directory

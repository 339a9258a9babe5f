"""The small protocol every language model backend implements.

The generation engine decodes many rows at once (one row per prompt). A decode step is split
in two so that the engine can compute the public rows' logits first, derive the Top-k+
candidate set from them, and then ask for the private rows' logits only on those candidates
(the *sparse LM head*):

1. ``next_hidden(state, tokens)`` appends one token to every row that has already run (``None``
   when no row has: right after ``encode_prompts``), runs the prompts of the rows that have not
   (new rows, from ``encode_prompts`` or ``add_prompts``), and returns the final hidden state of
   every row, ``[rows, H]``. Rows can thus join a running batch (continuous batching).
2. ``logits_from_hidden(hidden, candidates)`` applies the LM head: the full vocabulary when
   ``candidates`` is ``None`` (``[rows, V]``), or only the token ids in ``candidates``
   (``[rows, K]`` of int64, one candidate list per row) returning ``[rows, K]``.

``next_logits`` is the convenience composition of the two (the protocol's signature).

Optional: ``top_superset_logits(hidden, top_k, margin, banned)`` returns, for each row, the ids,
count and exact logits of a set of tokens that holds the ``top_k`` largest logits and every
token whose logit is at least ``f32(ell - margin)`` (``margin >= 0``; ``ell`` the row's
``top_k``-th largest, banned ids at -inf and never in the set), or ``None`` when the backend has
no cheaper way than every logit. The engine asks it for the public rows (InvisibleInk's Top-k+
rule then runs on that set: the same candidates), and computes every public logit when it is
absent or answers ``None``
(:meth:`dplang.models.transformers.TransformersModel.top_superset_logits`).

Optional: ``reserve_new_tokens(state, tokens)``, a hint that each row added from now on will
generate up to ``tokens`` tokens (a backend may size its key/value store for them at once); no
result may depend on it.

Privacy contract (docs/privacy.md invariant 7, *row invariance*): each row's hidden state and logits
are a deterministic function of that row's own prompt and tokens (and, for candidate logits, its
own candidate ids), bit for bit, whatever other rows share the batch, how many there are and how
long they are, through row dropping. Parallel composition across generation groups and a Top-k+
set that depends on public data only both rest on it. A backend never sees which rows are
private; the caller decides which rows get which candidates.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only: a command that refuses its flags imports no torch
    import torch

DecodeState = Any
"""Backend-specific decoding state (KV cache, attention mask, positions)."""


class PromptModel(Protocol):
    """What a run's driver needs of a model to form its prompts and identify it: every
    :class:`LogitsModel`, or only its prompt side
    (:class:`~dplang.models.prompt_side.PromptSide`, no weights) when workers decode."""

    model_id: str

    def weights_digest(self) -> str: ...

    def render_prompt(self, user: str, system: str | None = None) -> str: ...

    @property
    def has_chat_template(self) -> bool: ...

    def count_tokens(self, text: str) -> int: ...

    def truncate_tokens(self, text: str, max_tokens: int) -> str: ...


@runtime_checkable
class LogitsModel(Protocol):
    """A causal language model that exposes next-token logits for a batch of rows."""

    #: Size of the output vocabulary (number of logits per row).
    vocab_size: int
    #: Token ids that end a generation.
    eos_token_ids: frozenset[int]
    #: Human-readable identity recorded in manifests (path or package name).
    model_id: str

    def weights_digest(self) -> str:
        """A hash identifying the weights (recorded in manifests)."""
        ...

    def render_prompt(self, user: str, system: str | None = None) -> str:
        """Turn a user message into the text fed to the model.

        Uses the model's chat template (with a generation prompt) when it has one, else
        returns ``user`` unchanged (base models continue text)."""
        ...

    @property
    def has_chat_template(self) -> bool:
        """Whether :meth:`render_prompt` applies a chat template."""
        ...

    def count_tokens(self, text: str) -> int:
        """Number of tokens of ``text`` (no special tokens)."""
        ...

    def truncate_tokens(self, text: str, max_tokens: int) -> str:
        """``text`` cut to its first ``max_tokens`` tokens (data-independent rule)."""
        ...

    def encode_prompts(self, prompts: Sequence[str]) -> DecodeState:
        """Tokenize rendered prompts; nothing is run yet."""
        ...

    def add_prompts(self, state: DecodeState, prompts: Sequence[str],
                    prefixes: Sequence[str | None] | None = None) -> None:
        """Append rows for ``prompts`` after the existing ones; they run at the next
        :meth:`next_hidden` call, beside the other rows' next tokens.

        ``prefixes`` (optional, one per prompt: public text the prompt starts with, or
        ``None``) lets a backend compute a prefix once for every row that starts with it. It is
        part of the row's definition: a row's logits may depend on where its prefix ends, but
        never on whether other rows share it."""
        ...

    def next_hidden(self, state: DecodeState, tokens: torch.Tensor | None) -> torch.Tensor:
        """Append ``tokens`` (int64, one per row that has already run, in row order; ``None``
        when no row has), run the prompts of the rows that have not, and return the last
        hidden state of every row, ``[rows, H]``.

        The returned tensor is an ordinary tensor (not an inference-mode tensor): callers may
        modify it in place."""
        ...

    def logits_from_hidden(
        self, hidden: torch.Tensor, candidates: torch.Tensor | None = None,
        keep_device: bool = False,
    ) -> torch.Tensor:
        """float32 logits: ``[rows, V]`` or, with ``candidates`` ``[rows, K]``, ``[rows, K]``;
        on the CPU, or left on the model's device with ``keep_device``."""
        ...

    def next_logits(
        self,
        state: DecodeState,
        tokens: torch.Tensor | None,
        candidates: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``logits_from_hidden(next_hidden(state, tokens), candidates)``."""
        ...

    def drop_rows(self, state: DecodeState, keep: torch.Tensor) -> DecodeState:
        """Keep only the rows whose indices are in ``keep`` (int64, increasing).

        Backends may update ``state`` in place; callers must use the returned state."""
        ...

    def row_invariance_checked(self) -> bool:
        """Whether each row's logits are known to be a function of that row alone, for the
        configuration as it is now (DESIGN invariant 7): by the load-time check, or by
        construction. A private run refuses a model that says no."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """Detokenize generated ids (special tokens skipped)."""
        ...


#: Characters per token assumed for a model that does not say (``max_token_chars``).
DEFAULT_TOKEN_CHARS = 64


def reference_prefix(model: PromptModel | LogitsModel, text: str, max_tokens: int
                     ) -> tuple[str, bool]:
    """(``text`` cut to its first ``max_tokens`` tokens, whether it was cut).

    Privacy contract: the work, and so the time, it takes is bounded by a public number of
    characters, whatever the text's length: only the first
    ``4 · (max_tokens + 1) · max_token_chars`` characters are tokenized (``max_token_chars``:
    the longest token of the vocabulary, public), which hold the first ``max_tokens`` tokens
    with a margin for normalisation. Tokenizing a whole reference of megabytes would make the
    run's planning time, which the lock file's and the manifest's times show, a measure of
    that one reference's length."""
    chars = int(getattr(model, "max_token_chars", DEFAULT_TOKEN_CHARS) or DEFAULT_TOKEN_CHARS)
    head = text[:4 * (max_tokens + 1) * chars]
    if len(head) == len(text) and model.count_tokens(head) <= max_tokens:
        return text, False
    return model.truncate_tokens(head, max_tokens), True


def public_model_name(spec: str) -> str:
    """How public files name a model given as ``spec``: ``"default"`` as such, a folder or a
    GGUF file by its own name (``/home/ana/models/llama-1b/`` → ``llama-1b``), never the
    folders above it (the data holder's file layout, like a template file's folder).

    What identifies the model in a release is its digests (weights, other files: the
    fingerprint's ``model_sha256`` and ``model_files_sha256``), so the same model under
    another path, or spelled ``./m`` or ``/abs/m``, is the same model."""
    if spec == "default":
        return spec
    path = Path(spec).expanduser()
    name = path.name
    if not name or name in (".", ".."):
        try:
            name = path.resolve().name
        except (OSError, RuntimeError):
            name = ""
    return name or spec


def local_model_name(name_or_path: str) -> str:
    """A checkpoint's ``_name_or_path`` as public files name it: a local path (absolute, from
    ``.`` or ``~``, or an existing file or folder) by :func:`public_model_name`, anything else
    (a hub id such as ``org/name``) as it is."""
    if not name_or_path:
        return name_or_path
    local = (name_or_path.startswith(("/", ".", "~"))
             or Path(name_or_path).expanduser().exists())
    return public_model_name(name_or_path) if local else name_or_path

"""Any local Hugging Face causal language model behind the :class:`LogitsModel` protocol.

The model is loaded on the CPU from a folder (``config.json`` + safetensors + tokenizer) or from a
GGUF file (dequantised by ``transformers``). A decode step is split as the protocol asks:
:meth:`TransformersModel.next_hidden` runs only the transformer body (embeddings, decoder layers,
final norm) and :meth:`TransformersModel.logits_from_hidden` applies the LM head, over the full
vocabulary or only over per-row candidate ids (the *sparse LM head*).

**Row invariance (privacy-critical).** Every row's hidden state and logits are a deterministic
function of that row's own tokens, bit for bit, whatever other rows share the batch: the body runs
on the rows' tokens concatenated without padding, with row-count-independent matrix products and
per-row attention over a paged key/value cache (:mod:`dplang.models._rowwise`,
:mod:`dplang.models._kernels`). :meth:`TransformersModel.check_row_invariance` verifies it at load
and the model refuses to run a configuration (model, dtype, thread count) where it fails.

**Device.** ``device="cpu"`` (default) or ``"cuda"``: the weights, the key/value cache and
every per-step tensor of the body live on that device; hidden states stay there and
:meth:`TransformersModel.logits_from_hidden` returns its logits on the CPU (where the sampling
policies run). On CUDA the linear layers use plain ``F.linear`` (oneDNN packing is a CPU
layout), so whether a CUDA configuration is row-invariant is decided by the same load-time
check, which refuses it if not. The device type is part of :attr:`numerics` (a run's
identity). The CUDA path has not been run on a GPU by this project yet (``pytest -m gpu``).

**Compute dtype.** ``dtype="bfloat16"`` runs the transformer body (weights, activations, KV
cache) in bfloat16; the LM head always stays float32 on the float32 final hidden state, so logits
are float32 either way. ``dtype="auto"`` picks bfloat16 only where :func:`native_bfloat16` says
the CPU multiplies it natively (elsewhere it is emulated and slower). The dtype changes the
model's numbers slightly, never the privacy guarantee (which holds for any deterministic,
row-invariant logits: the clipping bounds what each reference can change).

Size: one class, the backend; its kernels (_kernels.py), paged attention (_rowwise.py), loading
(hf_loading.py), dtypes and the invariance check live beside it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dplang.models import _rowwise
from dplang.models._kernels import install_linear_products, linear_product, pack_linear_weight
from dplang.models._rowwise import PagedKVCache, PromptSegment, RowCache, StepLayout
from dplang.models.base import DecodeState
from dplang.models.dtypes import available_cores
from dplang.models.hf_loading import (
    find_body,
    find_eos_ids,
    load_pretrained,
    logit_postprocessing,
    resolve_model_path,
    weights_digest_of,
)
from dplang.models.invariance import check_row_invariance, check_row_invariance_cached
from dplang.models.prompt_side import (
    TokenizerText,
    check_device,
    compute_dtype,
    model_id_for,
    numerics_for,
    prepare_tokenizer,
)

__all__ = ["MAX_STEP_TOKENS", "RowDecodeState", "TransformersModel"]

#: Most tokens run through the body in one call on a prompt step (rows are split into calls of
#: at most this many tokens; a longer prompt runs alone). Bounds the activations' memory.
MAX_STEP_TOKENS = 4096


@dataclass


class RowDecodeState:
    """Decoding state of :class:`TransformersModel`: one entry per row still decoded.

    Attributes:
        prompts: each row's prompt token ids (run by the first :meth:`next_hidden` call after
            the row was added).
        caches: each row's blocks in the paged key/value cache and its cached length, or
            ``None`` for a row whose prompt has not run yet.
        prefix_of, prefixes: shared public prefixes (see :meth:`TransformersModel.add_prompts`).
        cache: the paged cache (created by the first call that runs a prompt).
        steps: number of :meth:`next_hidden` calls so far.
    """

    prompts: list[list[int]]
    caches: list[RowCache | None] = field(default_factory=list)
    cache: PagedKVCache | None = None
    steps: int = 0
    #: Per row, the token ids of its shared public prefix (``None``: no prefix); the row's
    #: tokens are the prefix's followed by ``prompts[row]``.
    prefix_of: list[tuple[int, ...] | None] = field(default_factory=list)
    #: Computed prefixes: their cache (owned by the state) and last hidden state.
    prefixes: dict[tuple[int, ...], tuple[RowCache, torch.Tensor]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.caches) < len(self.prompts):
            self.caches.extend([None] * (len(self.prompts) - len(self.caches)))
        if len(self.prefix_of) < len(self.prompts):
            self.prefix_of.extend([None] * (len(self.prompts) - len(self.prefix_of)))

    @property
    def rows(self) -> int:
        """Number of rows still decoded."""
        return len(self.prompts)

    @property
    def started(self) -> bool:
        """Whether some row's prompt has been run through the model."""
        return any(c is not None for c in self.caches)

    @property
    def prompt_lengths(self) -> list[int]:
        """Number of prompt tokens of every row."""
        return [len(p) for p in self.prompts]


class TransformersModel(TokenizerText):
    """A Hugging Face causal LM (local folder or GGUF file) as a row-invariant
    :class:`LogitsModel`. Its text side (chat template, token counts, truncation) is
    :class:`~dplang.models.prompt_side.TokenizerText`, shared with the weight-less
    :class:`~dplang.models.prompt_side.PromptSide` a run's driver loads when workers decode.

    Args:
        path: a model folder, or a ``.gguf`` file (dequantised to float32 at load). May be
            ``None`` when ``model`` and ``tokenizer`` are given.
        gguf_file: name of a GGUF file inside the folder ``path`` (alternative to passing the
            file itself as ``path``).
        model: an already loaded causal LM (then ``path`` is only used for the id).
        tokenizer: its tokenizer (required with ``model``).
        model_id: identity recorded in manifests (default: the resolved path).
        weights_digest: a known digest of the weights (default: computed lazily, see
            :meth:`weights_digest`).
        threads: ``torch.set_num_threads`` value (default: the number of available cores).
            Note that this setting is process-wide.
        verify: check once, on a short prompt, that body + :meth:`logits_from_hidden`
            reproduces the model's own forward logits (guards against architectures whose
            LM-head post-processing this backend does not know).
        check_invariance: run :meth:`check_row_invariance` at load and raise
            :class:`RowInvarianceError` if this configuration is not row-invariant here;
            ``"cached"`` skips it when the same configuration already passed on this machine
            (:func:`~dplang.models.invariance.check_row_invariance_cached`; the CLI's models).
        dtype: compute dtype of the body, ``"float32"`` (default), ``"bfloat16"`` or
            ``"auto"`` (see the module docstring; on CUDA ``auto`` is bfloat16); logits are
            float32 in every case.
        device: ``"cpu"`` (default) or ``"cuda"`` (see the module docstring).
        block_size: positions per block of the paged key/value cache.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        gguf_file: str | None = None,
        model: Any = None,
        tokenizer: Any = None,
        model_id: str | None = None,
        weights_digest: str | None = None,
        threads: int | None = None,
        verify: bool = True,
        check_invariance: bool | str = True,
        dtype: str | torch.dtype = "float32",
        block_size: int = _rowwise.BLOCK_SIZE,
        device: str | torch.device = "cpu",
    ) -> None:
        self.device = check_device(device)
        #: ``"cpu"`` or ``"cuda"``: part of :attr:`numerics`, hence of a run's identity.
        self.device_type: str = self.device.type
        self.dtype = compute_dtype(dtype, self.device_type)
        self.threads = threads if threads is not None else available_cores()
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        torch.set_num_threads(self.threads)
        self.block_size = int(block_size)

        self._path: Path | None = None
        self._gguf_name: str | None = None
        if model is None:
            if path is None:
                raise ValueError("TransformersModel needs a path or a model")
            folder, self._gguf_name = resolve_model_path(Path(path), gguf_file)
            self._path = folder
            model, tokenizer = load_pretrained(folder, self._gguf_name, tokenizer)
        else:
            if tokenizer is None:
                raise ValueError("TransformersModel(model=...) also needs tokenizer=...")
            if path is not None:
                self._path = Path(path)
        self.model = model.to(torch.float32).to(self.device).eval()
        for param in self.model.parameters():
            param.requires_grad_(False)
        self.tokenizer = tokenizer
        self.config = self.model.config
        self._body = find_body(self.model)
        head = self.model.get_output_embeddings()
        if head is None or not hasattr(head, "weight"):
            raise ValueError(f"{type(self.model).__name__} has no output embeddings (LM head)")
        # The head stays float32 (a copy when the rest of the model is converted: Gemma ties
        # it to the input embeddings, which the body needs in its own dtype).
        copy = self.dtype != torch.float32
        weight = head.weight.detach()
        self._head_weight: torch.Tensor = weight.clone() if copy else weight
        bias = getattr(head, "bias", None)
        self._head_bias: torch.Tensor | None = None
        if bias is not None:
            self._head_bias = bias.detach().clone() if copy else bias.detach()
        if copy:
            self.model.to(self.dtype)
        self.vocab_size: int = int(self._head_weight.shape[0])
        self.hidden_size: int = int(self._head_weight.shape[1])
        self._softcap, self._logit_multiplier = logit_postprocessing(self.config)
        self._packed_head = pack_linear_weight(self._head_weight)
        self._packed_body = install_linear_products(self._body)
        _rowwise.replace_activations(self._body)
        self._attn_configs = self._attention_configs(self.model)
        self._num_layers = int(getattr(self._text_config(), "num_hidden_layers", 0))

        prepare_tokenizer(self.tokenizer)
        self.eos_token_ids: frozenset[int] = find_eos_ids(self.model, self.tokenizer,
                                                          self.vocab_size)

        if model_id is not None:
            self.model_id = model_id
        elif self._path is not None:
            self.model_id = model_id_for(self._path, self._gguf_name)
        else:
            self.model_id = getattr(self.config, "_name_or_path", "") or type(self.model).__name__
        self._digest = weights_digest
        if verify:
            self._verify_head()
        if check_invariance == "cached":
            check_row_invariance_cached(self)
        elif check_invariance:
            self.check_row_invariance()

    # ---------------------------------------------------------------- identity

    @property
    def numerics(self) -> dict[str, Any]:
        """What, besides the weights and the prompts, fixes the bits of the logits: library
        versions, the CPU's vector capability, the thread count, the dtype and the cache block
        size (public; part of a run's identity, so that a rerun elsewhere is a new release)."""
        return numerics_for(self.threads, self.dtype, self.block_size, self.device_type)


    def weights_digest(self) -> str:
        """sha256 of the weight file bytes (the GGUF file, or the ``*.safetensors`` /
        ``*.bin`` files: a single file's plain sha256, several files hashed with their names
        in name order), or of the in-memory state dict; computed once and cached."""
        if self._digest is None:
            self._digest = weights_digest_of(self._path, self._gguf_name, self.model)
        return self._digest

    # ---------------------------------------------------------------- text side
    # render_prompt, count_tokens, truncate_tokens, decode, _prompt_ids: TokenizerText

    # ---------------------------------------------------------------- decoding

    def _text_config(self) -> Any:
        return getattr(self.config, "text_config", None) or self.config

    @staticmethod
    def _attention_configs(model: Any) -> list[Any]:
        """The config objects whose attention implementation a row-invariant forward switches
        to :data:`dplang.models._rowwise.ROWWISE`."""
        if not _rowwise.register():  # pragma: no cover - older transformers
            raise NotImplementedError("this transformers version has no attention registry")
        configs = {id(c): c for c in (model.config, getattr(model.config, "text_config", None))
                   if c is not None}
        return list(configs.values())

    def encode_prompts(self, prompts: Sequence[str]) -> RowDecodeState:
        """Tokenize rendered prompts; nothing is run yet."""
        if isinstance(prompts, str):
            raise TypeError("encode_prompts takes a sequence of prompts, not one string")
        state = RowDecodeState(prompts=[])
        self.add_prompts(state, prompts)
        return state

    def add_prompts(self, state: DecodeState, prompts: Sequence[str],
                    prefixes: Sequence[str | None] | None = None) -> None:
        """Append rows for rendered ``prompts``; they run at the next :meth:`next_hidden`.

        ``prefixes`` (one per prompt, public text each prompt starts with, or ``None``) marks a
        shared prefix: such a row is encoded as the prefix's tokens followed by the rest's
        (tokenized separately, so the split is a public rule), and the prefix's keys and values
        are computed once per state and shared by every row that starts with it. A row's bits
        are the same whether its prefix is shared or computed for it alone: the prefix always
        runs as its own prompt, the rest as a continuation of it."""
        if isinstance(prompts, str):
            raise TypeError("add_prompts takes a sequence of prompts, not one string")
        if prefixes is None:
            prefixes = [None] * len(prompts)
        if len(prefixes) != len(prompts):
            raise ValueError(f"{len(prefixes)} prefixes for {len(prompts)} prompts")
        encoded: list[list[int]] = []
        keys: list[tuple[int, ...] | None] = []
        for i, (prompt, prefix) in enumerate(zip(prompts, prefixes, strict=True)):
            if prefix:
                if not prompt.startswith(prefix):
                    raise ValueError(f"prompt {i} does not start with its prefix")
                head = self._prompt_ids(prefix)
                if not head:
                    raise ValueError(f"the prefix of prompt {i} encodes to no tokens")
                encoded.append(self._ids(prompt[len(prefix):]))
                keys.append(tuple(head))
            else:
                ids = self._prompt_ids(prompt)
                if not ids:
                    raise ValueError(f"prompt {i} encodes to no tokens")
                encoded.append(ids)
                keys.append(None)
        state.prompts.extend(encoded)
        state.caches.extend([None] * len(encoded))
        state.prefix_of.extend(keys)

    def next_hidden(self, state: DecodeState, tokens: torch.Tensor | None) -> torch.Tensor:
        """Append ``tokens`` (one per row that has run, in row order; ``None`` when none has),
        run the prompts of the rows that have not, and return the final-norm hidden state of
        every row, ``[rows, H]`` float32.

        Privacy contract: row ``i`` of the result depends only on row ``i``'s prompt and
        tokens (bit for bit; see the module docstring), however the rows are split into calls."""
        started = [r for r, c in enumerate(state.caches) if c is not None]
        pending = [r for r, c in enumerate(state.caches) if c is None]
        if not started:
            if tokens is not None and torch.as_tensor(tokens).numel():
                raise ValueError("next_hidden takes tokens=None when no row has run yet")
            segments: list[tuple[int, Sequence[int]]] = []
        else:
            if tokens is None:
                raise ValueError("next_hidden needs one token per row that has run")
            tokens = torch.as_tensor(tokens, dtype=torch.int64).reshape(-1)
            if tokens.shape[0] != len(started):
                raise ValueError(f"expected {len(started)} tokens, got {tokens.shape[0]}")
            if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
                raise ValueError("token id out of range")
            segments = [(r, [t]) for r, t in zip(started, tokens.tolist(), strict=True)]
        hidden = torch.empty((state.rows, self.hidden_size), dtype=torch.float32,
                             device=self.device)
        if state.cache is None:
            state.cache = PagedKVCache(self._num_layers, self.block_size)
        self._run_prefixes(state, pending)
        for r in pending:
            state.caches[r] = self._start_row(state, r)
        # One call for the tokens and as many prompts as fit in MAX_STEP_TOKENS, then more
        # calls for the other prompts (a row's bits do not depend on the split).
        size = len(segments)
        for r in pending:
            ids = state.prompts[r]
            key = state.prefix_of[r]
            if not ids:  # the row is its prefix: its hidden state is the prefix's
                assert key is not None
                hidden[r] = state.prefixes[key][1]
                continue
            if segments and size + len(ids) > MAX_STEP_TOKENS:
                self._run_rows(state, segments, hidden)
                segments, size = [], 0
            segments.append((r, ids))
            size += len(ids)
        if segments:
            self._run_rows(state, segments, hidden)
        state.steps += 1
        return hidden

    def _run_rows(self, state: RowDecodeState, segments: list[tuple[int, Sequence[int]]],
                  hidden: torch.Tensor) -> None:
        assert state.cache is not None
        pairs = [(state.caches[r], ids) for r, ids in segments]
        hidden[[r for r, _ in segments]] = self._run_segments(state.cache, pairs)  # type: ignore[arg-type]

    def _run_prefixes(self, state: RowDecodeState, pending: list[int]) -> None:
        """Compute the shared prefixes of ``pending`` rows that are not computed yet, each as
        its own prompt (in calls of at most :data:`MAX_STEP_TOKENS` tokens)."""
        assert state.cache is not None
        missing = list(dict.fromkeys(
            k for k in (state.prefix_of[r] for r in pending)
            if k is not None and k not in state.prefixes))
        chunk: list[tuple[tuple[int, ...], RowCache]] = []
        size = 0

        def flush() -> None:
            assert state.cache is not None
            out = self._run_segments(state.cache, [(rc, key) for key, rc in chunk])
            for (key, rc), h in zip(chunk, out, strict=True):
                state.prefixes[key] = (rc, h)

        for key in missing:
            if chunk and size + len(key) > MAX_STEP_TOKENS:
                flush()
                chunk, size = [], 0
            chunk.append((key, RowCache()))
            size += len(key)
        if chunk:
            flush()

    def _start_row(self, state: RowDecodeState, row: int) -> RowCache:
        """A new row's cache: empty, or its prefix's blocks (full ones shared, the last partial
        one copied so the row can write after it)."""
        key = state.prefix_of[row]
        if key is None:
            return RowCache()
        assert state.cache is not None
        prefix, _ = state.prefixes[key]
        full = prefix.length // self.block_size
        rc = RowCache(blocks=list(prefix.blocks[:full]), length=prefix.length, shared=full)
        if prefix.length % self.block_size:
            copy = state.cache.allocate(1)[0]
            state.cache.copy_block(prefix.blocks[full], copy)
            rc.blocks.append(copy)
        return rc

    def _run_segments(
        self, cache: PagedKVCache, segments: Sequence[tuple[RowCache, Sequence[int]]],
        all_positions: bool = False,
    ) -> torch.Tensor:
        """Append each segment's tokens to its row's cache and run them through the body in
        one call.

        Returns the last hidden state of each segment (``[segments, H]``), or with
        ``all_positions`` the hidden state of every token of the call (``[T, H]``)."""
        block = cache.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        prompts: list[PromptSegment] = []
        single_index: list[int] = []
        single_rows: list[RowCache] = []
        last: list[int] = []
        for rc, new in segments:
            start, count = rc.length, len(new)
            rc.length += count
            missing = -(-rc.length // block) - len(rc.blocks)
            if missing > 0:
                rc.blocks.extend(cache.allocate(missing))
            first = len(ids)
            ids.extend(int(t) for t in new)
            positions.extend(range(start, start + count))
            slots.extend(rc.slots(start, start + count, block))
            if count == 1:
                single_index.append(first)
                single_rows.append(rc)
            else:
                prompts.append(PromptSegment(
                    first, count, start,
                    torch.tensor(rc.slots(0, start + count, block), dtype=torch.int64,
                                 device=self.device)))
            last.append(first + count - 1)
        layout = StepLayout(
            cache=cache,
            slots=torch.tensor(slots, dtype=torch.int64, device=self.device),
            prompts=prompts,
            single_tokens=torch.tensor(single_index, dtype=torch.int64, device=self.device),
            single_rows=single_rows,
        )
        hidden = self._forward(torch.tensor(ids, dtype=torch.int64, device=self.device),
                               torch.tensor(positions, dtype=torch.int64, device=self.device),
                               layout)
        if all_positions:
            return hidden
        return hidden[last]

    @torch.inference_mode()
    def _forward(self, ids: torch.Tensor, positions: torch.Tensor,
                 layout: StepLayout) -> torch.Tensor:
        """The body on one concatenated token sequence; float32 hidden states ``[T, H]``."""
        with _rowwise.active_layout(self._attn_configs, layout):
            out = self._body(input_ids=ids.unsqueeze(0), position_ids=positions.unsqueeze(0),
                             attention_mask=None, use_cache=False)
        # A clone made outside inference mode is an ordinary tensor (callers may edit it).
        with torch.inference_mode(False):
            return out.last_hidden_state[0].float().clone()

    def token_hidden_states(self, sequences: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """The final-norm hidden state of every position of each token sequence (``[len, H]``
        float32 each), computed as prompts with the same row-invariant path as decoding (used
        to score texts: perplexity)."""
        state = RowDecodeState(prompts=[list(s) for s in sequences])
        state.cache = PagedKVCache(self._num_layers, self.block_size)
        state.caches = [RowCache() for _ in range(state.rows)]
        results: list[torch.Tensor] = []
        chunk: list[tuple[int, list[int]]] = []
        size = 0

        def flush() -> None:
            assert state.cache is not None
            pairs = [(state.caches[row], seq) for row, seq in chunk]
            hidden = self._run_segments(state.cache, pairs, all_positions=True)  # type: ignore[arg-type]
            offset = 0
            for row, seq in chunk:
                results.append(hidden[offset:offset + len(seq)].cpu())
                offset += len(seq)
                done = state.caches[row]
                assert done is not None
                state.cache.release(done.blocks)
                state.caches[row] = RowCache()

        for row, seq in enumerate(state.prompts):
            if not seq:
                raise ValueError(f"sequence {row} is empty")
            if chunk and size + len(seq) > MAX_STEP_TOKENS:
                flush()
                chunk, size = [], 0
            chunk.append((row, seq))
            size += len(seq)
        if chunk:
            flush()
        return results

    @torch.no_grad()
    def logits_from_hidden(
        self, hidden: torch.Tensor, candidates: torch.Tensor | None = None
    ) -> torch.Tensor:
        """float32 logits: ``[rows, V]``, or ``[rows, K]`` for int64 ``candidates [rows, K]``
        (only those rows of the head weight are touched).

        Privacy contract: each row's logits depend only on that row's hidden state (and its own
        candidate ids), bit for bit, whatever the other rows or the width ``K``. The logits
        are on the CPU whatever the model's device."""
        hidden = hidden.to(device=self.device, dtype=torch.float32)
        if hidden.ndim != 2 or hidden.shape[1] != self.hidden_size:
            raise ValueError(
                f"hidden must be [rows, {self.hidden_size}], got {tuple(hidden.shape)}"
            )
        if candidates is None:
            logits = linear_product(hidden, self._head_weight, self._head_bias, self._packed_head)
        else:
            candidates = torch.as_tensor(candidates).to(self.device)
            if candidates.dtype != torch.int64:
                raise TypeError(f"candidates must be int64, got {candidates.dtype}")
            if candidates.ndim != 2 or candidates.shape[0] != hidden.shape[0]:
                raise ValueError(
                    f"candidates must be [rows={hidden.shape[0]}, K], got {tuple(candidates.shape)}"
                )
            if candidates.numel() and (
                int(candidates.min()) < 0 or int(candidates.max()) >= self.vocab_size
            ):
                raise ValueError("candidate id out of range")
            # One dot product per (row, candidate), each a reduction over the hidden size alone:
            # its bits do not depend on how many rows or candidates share the call (a batched
            # matrix product's would).
            gathered = self._head_weight[candidates]  # [rows, K, H]
            logits = (gathered * hidden.unsqueeze(1)).sum(dim=-1)
            if self._head_bias is not None:
                logits = logits + self._head_bias[candidates]
        if self._logit_multiplier != 1.0:
            logits = logits * self._logit_multiplier
        if self._softcap is not None:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return logits.float().cpu()

    def next_logits(
        self,
        state: DecodeState,
        tokens: torch.Tensor | None,
        candidates: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``logits_from_hidden(next_hidden(state, tokens), candidates)``."""
        return self.logits_from_hidden(self.next_hidden(state, tokens), candidates)

    def drop_rows(self, state: DecodeState, keep: torch.Tensor) -> DecodeState:
        """Keep only rows ``keep`` (int64, strictly increasing); the dropped rows' cache blocks
        are freed. Updates ``state`` in place and returns it."""
        keep = torch.as_tensor(keep, dtype=torch.int64).reshape(-1)
        if keep.numel() > 1 and not bool((keep[1:] > keep[:-1]).all()):
            raise ValueError("keep must be strictly increasing")
        if keep.numel() and (int(keep.min()) < 0 or int(keep.max()) >= state.rows):
            raise ValueError("keep index out of range")
        kept = keep.tolist()
        if state.cache is not None:
            for row in set(range(state.rows)) - set(kept):
                dropped = state.caches[row]
                if dropped is not None:
                    state.cache.release(dropped.owned)
        state.caches = [state.caches[i] for i in kept]
        state.prompts = [state.prompts[i] for i in kept]
        state.prefix_of = [state.prefix_of[i] for i in kept]
        return state

    # ----------------------------------------------------------------- checks

    @torch.inference_mode()
    def _verify_head(self) -> None:
        """Check body + our head against the model's own forward on a short prompt."""
        ids = self._prompt_ids("Hello world. This is a test")
        state = RowDecodeState(prompts=[ids])
        ours = self.logits_from_hidden(self.next_hidden(state, None))
        input_ids = torch.tensor([ids], dtype=torch.int64, device=self.device)
        out = self.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids))
        theirs = out.logits[:, -1].float().cpu()
        rtol = atol = 1e-3
        if self.dtype != torch.float32:
            # The model's own head runs in bfloat16 (8-bit mantissa) while ours is float32; a
            # missing soft-cap or scale still shows as an error of whole logits.
            rtol = 3e-2
            atol = rtol * max(float(theirs.abs().max()), 1.0)
        if not torch.allclose(ours, theirs, rtol=rtol, atol=atol):
            err = (ours - theirs).abs().max().item()
            raise NotImplementedError(
                f"{type(self.model).__name__}: body + LM head does not reproduce the model's "
                f"logits (max abs error {err:.3g}); its architecture post-processes logits in a "
                "way dplang does not know"
            )

    def check_row_invariance(self) -> None:
        """Verify this configuration is row-invariant here (see
        :func:`dplang.models.invariance.check_row_invariance`); raises
        :class:`~dplang.models.invariance.RowInvarianceError` if not."""
        check_row_invariance(self)

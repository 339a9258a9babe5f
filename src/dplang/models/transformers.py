"""Any local Hugging Face causal language model behind the :class:`LogitsModel` protocol.

The model is loaded on the CPU from a folder (``config.json`` + safetensors + tokenizer) or from a
GGUF file (dequantised by ``transformers``), and its weights are copied into the integer form of
:class:`~dplang.models.decoder.ExactDecoder`, which runs the forward pass. A decode step is split
as the protocol asks: :meth:`TransformersModel.next_hidden` runs the transformer body and
:meth:`TransformersModel.logits_from_hidden` applies the LM head, over the full vocabulary or only
over per-row candidate ids (the *sparse LM head*).

**Row invariance by construction (privacy-critical).** Every row's hidden state and logits are a
function of that row's own tokens, bit for bit, whatever other rows share the batch: the rows'
tokens are concatenated without padding, and every operation is either elementwise with basic
IEEE operations, a fixed-point (exact) sum over one token's own vector, an exact integer matrix
product, or exact attention over the row's own slot of the key/value store
(:mod:`dplang.models.exact`, :mod:`dplang.models.attention`, :mod:`dplang.models.decoder`;
docs/privacy.md gives the argument per operation). None of it depends on the CPU's ISA, the
thread count, the row count or a library's choice of kernel, so the same tokens give the same
bits on every machine. :meth:`TransformersModel.check_row_invariance` still verifies it at load
as the last line of defence.

**Precision.** ``dtype="float32"`` (default) rounds the weights to 16-bit integers per output
channel and every activation row to a 15-bit integer on its own scale: equal to the float32
model to about 1e-5 (next-token KL about 1e-6 on Yelp, docs/benchmarks.md). ``"bfloat16"``
keeps the LM head at 16 bits and rounds the body's weights to 8 bits (about bfloat16's
precision; faster, half the memory). ``"auto"`` is float32. Logits are float32 either way.

**Architectures.** The Llama and Gemma families (Llama, Mistral, Qwen 2 and 3, Gemma 1 to 3);
another architecture is refused at load (its invariance could not be argued).

**Device.** ``device="cpu"`` (default) or ``"cuda"``: the integer weights, the key/value store
and every per-step tensor live there; :meth:`TransformersModel.logits_from_hidden` returns its
logits on the CPU (where the sampling policies run). The CUDA path has not been run on a GPU by
this project yet (``pytest -m gpu``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dplang import notices
from dplang.models.attention import MAX_POSITIONS, TILE, AttentionStep, PromptTile, SlotCache
from dplang.models.base import DecodeState, local_model_name
from dplang.models.decode_graphs import DecodeGraphs, GraphRecordingError, graphs_wanted
from dplang.models.decoder import ExactDecoder, logits_postprocess
from dplang.models.devices import index_tensor
from dplang.models.dtypes import available_cores
from dplang.models.errors import UnsupportedModelError
from dplang.models.hf_loading import (
    context_length_of,
    control_token_ids,
    find_body,
    find_eos_ids,
    load_pretrained,
    logit_postprocessing,
    model_files,
    resolve_model_path,
    weights_digest_of,
)
from dplang.models.invariance import (
    check_row_invariance,
    check_row_invariance_cached,
    verification_key,
)
from dplang.models.kernels.triton_check import admit_kernels
from dplang.models.memory import trim_heap
from dplang.models.prompt_side import (
    BLOCK_SIZE,
    TokenizerText,
    body_bits_for,
    check_device,
    compute_dtype,
    model_id_for,
    numerics_for,
    prepare_tokenizer,
)
from dplang.models.records import record_verification, verified_on_record
from dplang.models.row_state import RowDecodeState, RowSlot

__all__ = ["MAX_STEP_TOKENS", "RowDecodeState", "RowSlot", "TransformersModel"]

#: Most tokens run through the body in one call (prompts are cut into calls of at most this many
#: tokens, anywhere: a row's bits do not depend on where its prompt is cut).
MAX_STEP_TOKENS = 1024
#: Most generated tokens :meth:`TransformersModel.reserve_new_tokens` sizes the store for at
#: once (beyond, the store grows as rows lengthen).
MAX_HINTED_TOKENS = 1024

#: The same on a GPU, where one call of many tokens costs little more than one of few (a decode
#: step of 1,024 groups of B + 1 = 8 rows is one call, one graph replay).
GPU_STEP_TOKENS = 8192


@dataclass
class _Segment:
    """New tokens of one row in a call: its slot, its first position, its token ids, and where
    its last hidden state goes (``row`` of the output, or a prefix key)."""

    cache: RowSlot
    ids: Sequence[int]
    target: int | tuple[int, ...] | None


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
        model_id: identity recorded in manifests (default: the folder's or GGUF
            file's name, :func:`~dplang.models.base.public_model_name`).
        weights_digest: a known digest of the weights (default: computed lazily from the
            files, or at load for an in-memory model).
        threads: ``torch.set_num_threads`` value (default: the number of available cores; it
            changes speed only, never a bit). Note that this setting is process-wide.
        verify: check once, on a short prompt, that the exact decoder reproduces the model's
            own forward logits (guards against architectures or post-processing it does not
            know); ``"cached"`` skips it when the same weights, configuration, precision and
            code passed before on this machine, and then frees each float weight as soon as
            it is converted (the CLI's models: a load then peaks at about half the memory).
        check_invariance: run :meth:`check_row_invariance` at load and raise
            :class:`RowInvarianceError` if this configuration is not row-invariant here;
            ``"cached"`` skips it when the same configuration already passed on this machine
            (:func:`~dplang.models.invariance.check_row_invariance_cached`; the CLI's models).
        dtype: ``"float32"`` (default), ``"bfloat16"`` or ``"auto"`` (see the module docstring).
        device: ``"cpu"`` (default) or ``"cuda"``.
        block_size: positions per exact value sum of the attention (1..64; smaller is more
            precise and slower).
        keep_reference: keep the ``transformers`` model (``self.model``) after load, for
            comparisons with its own forward (tests); by default its float weights are freed
            once copied, which halves the memory of the default model.
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
        verify: bool | str = True,
        check_invariance: bool | str = True,
        dtype: str | torch.dtype = "float32",
        block_size: int = BLOCK_SIZE,
        device: str | torch.device = "cpu",
        keep_reference: bool = False,
    ) -> None:
        self.device = check_device(device)
        #: ``"cpu"`` or ``"cuda"``: part of :attr:`numerics`, hence of a run's identity.
        self.device_type: str = self.device.type
        self.dtype = compute_dtype(dtype, self.device_type)
        self.threads = threads if threads is not None else available_cores()
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        torch.set_num_threads(self.threads)
        from dplang.models import cpu_kernels, vml

        vml.resolve_vml_dispatch()  # before any float op of the load (dplang.models.vml)
        cpu_kernels.set_threads(self.threads)
        self.block_size = int(block_size)
        if not 1 <= self.block_size <= 64:
            raise ValueError(f"block size must be in 1..64, got {self.block_size}")

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
        model = model.to(torch.float32).eval()
        for param in model.parameters():
            param.requires_grad_(False)
        self.tokenizer = tokenizer
        self.config = model.config
        self.model: Any = model
        body = find_body(model)
        head = model.get_output_embeddings()
        if head is None or not hasattr(head, "weight"):
            raise ValueError(f"{type(model).__name__} has no output embeddings (LM head)")
        self._digest = weights_digest
        self._identity_given = weights_digest is not None
        if self._digest is None and (self._path is None or not self._path.is_dir()):
            self._digest = weights_digest_of(None, None, model)  # before the weights go
        verification = None
        if verify == "cached":
            config_text = getattr(self.config, "to_json_string", None)
            verification = verification_key(
                self.weights_digest(),
                config_text(use_diff=False) if callable(config_text) else repr(self.config),
                str(self.dtype))
            if verified_on_record(verification):
                verify = False  # the same weights, configuration and code passed before
        release = not verify and not keep_reference
        self._decoder = ExactDecoder(model, body, body_bits=body_bits_for(self.dtype),
                                     head_bits=16, device=torch.device("cpu"), release=release)
        self.vocab_size: int = self._decoder.vocab_size
        self.hidden_size: int = self._decoder.hidden_size
        self._softcap, self._logit_multiplier = logit_postprocessing(self.config)
        self._num_layers = len(self._decoder.layers)
        self._graphs_mode = "auto"  # decode graphs: set_decode_graphs
        #: Why decode calls are no longer replayed from graphs (``None`` while they may be).
        self.graphs_refused: str | None = None

        prepare_tokenizer(self.tokenizer)
        if len(self.tokenizer) > self.vocab_size:
            raise UnsupportedModelError(
                f"the tokenizer has {len(self.tokenizer):,} tokens but the model's output layer "
                f"{self.vocab_size:,}: they do not belong together (a token id beyond the "
                "output layer could not be scored)")
        self.eos_token_ids: frozenset[int] = find_eos_ids(model, self.tokenizer,
                                                          self.vocab_size)
        #: Most positions a row may hold: the model's context window (public).
        self.context_length: int | None = context_length_of(self.config)
        #: Special and control tokens, never sampled unless a run asks for them (public).
        self.special_token_ids: frozenset[int] = control_token_ids(
            self.tokenizer, self.vocab_size, self.eos_token_ids)
        if model_id is not None:
            self.model_id = model_id
        elif self._path is not None:
            self.model_id = model_id_for(self._path, self._gguf_name)
        else:
            # the checkpoint it was loaded from: a local folder by its name only (public files
            # never show the folders above it), a hub id ("org/name") as it is
            self.model_id = (local_model_name(getattr(self.config, "_name_or_path", ""))
                             or type(model).__name__)
        if self.device_type != "cpu":
            self._decoder.to(self.device)  # before the verification, which runs on the device
            admit_kernels(self.device)  # the Triton kernels that give their definitions' bits
        if verify:
            self._verify_head()
            if verification is not None:
                record_verification(verification)
        del model, body, head  # self.model is the one reference left to the float model
        if not keep_reference:
            self.model = None  # the decoder holds integer copies of every weight it uses
            trim_heap()  # the float weights' freed heap pages go back to the system
        if check_invariance == "cached":
            check_row_invariance_cached(self)
        elif check_invariance:
            self.check_row_invariance()

    # ---------------------------------------------------------------- identity

    @property
    def numerics(self) -> dict[str, Any]:
        """What, besides the weights and the prompts, fixes the bits of the logits: the
        arithmetic's version, the precision, the attention block and the device type (public;
        part of a run's identity, so that a run with other numerics is a new release)."""
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

    def reserve_new_tokens(self, state: DecodeState, tokens: int) -> None:
        """Room for ``tokens`` generated tokens after each prompt added from now on: the
        key/value store is sized for them when the prompts run, instead of growing (and being
        copied whole) during the decode, up to :data:`MAX_HINTED_TOKENS`. A hint about public
        settings; no bit depends on it."""
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens}")
        state.new_tokens = max(state.new_tokens, int(tokens))

    def next_hidden(self, state: DecodeState, tokens: torch.Tensor | None) -> torch.Tensor:
        """Append ``tokens`` (one per row that has run, in row order; ``None`` when none has),
        run the prompts of the rows that have not, and return the final-norm hidden state of
        every row, ``[rows, H]`` float32, on the model's device (a GPU's step copies nothing
        to the host here: the batched InvisibleInk step copies once, after the head).

        Privacy contract: row ``i`` of the result depends only on row ``i``'s prompt and
        tokens (bit for bit; see the module docstring), however the rows are split into calls."""
        started = [r for r, c in enumerate(state.caches) if c is not None]
        pending = [r for r, c in enumerate(state.caches) if c is None]
        segments: list[_Segment] = []
        if not started:
            if tokens is not None and torch.as_tensor(tokens).numel():
                raise ValueError("next_hidden takes tokens=None when no row has run yet")
        else:
            if tokens is None:
                raise ValueError("next_hidden needs one token per row that has run")
            tokens = torch.as_tensor(tokens, dtype=torch.int64).reshape(-1)
            if tokens.shape[0] != len(started):
                raise ValueError(f"expected {len(started)} tokens, got {tokens.shape[0]}")
            if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
                raise ValueError("token id out of range")
            for r, t in zip(started, tokens.tolist(), strict=True):
                cache = state.caches[r]
                assert cache is not None
                segments.append(_Segment(cache, [t], r))
        hidden = torch.empty((state.rows, self.hidden_size), dtype=torch.float32,
                             device=self.device)
        if state.cache is None:
            state.cache = self._new_cache()
        if pending:  # the store grows once for the new rows and their shared prefixes
            new_prefixes = {state.prefix_of[r] for r in pending} - set(state.prefixes) - {None}
            longest = max(len(state.prompts[r]) + len(state.prefix_of[r] or ()) for r in pending)
            # the hint's room is capped (a hint of 10**6 tokens must neither raise nor size the
            # store for them: rows that stop early would leave it mostly unused); a prompt
            # beyond MAX_POSITIONS still raises, as without the hint
            room = min(state.new_tokens, MAX_HINTED_TOKENS)
            wanted = max(longest, min(longest + room, MAX_POSITIONS))
            # decode graphs take one slot of the store for their padding tokens at the first
            # decode call: reserved now, or that call would grow the store by half (a copy of
            # it, and half of it unused: tens of GiB at G = 1024 on a GPU)
            pad = int(state.cache.decode_graphs is None and self._graphs_wanted())
            state.cache.prepare(len(new_prefixes) + len(pending) + pad, wanted)
        self._run_prefixes(state, pending)
        for r in pending:
            cache, ids = self._start_row(state, r)
            state.caches[r] = cache
            key = state.prefix_of[r]
            if not ids:  # the row is its prefix: its hidden state is the prefix's
                assert key is not None
                hidden[r] = state.prefixes[key][1]
                continue
            segments.append(_Segment(cache, ids, r))
        results = self._run(state.cache, segments, graphs=True)
        if results:  # one copy for all rows (not one per row: launches on a GPU)
            targets = list(results)
            hidden[index_tensor(targets, hidden.device)] = \
                torch.stack([results[t] for t in targets])
        state.steps += 1
        return hidden

    def _new_cache(self) -> SlotCache:
        d = self._decoder
        return SlotCache(self._num_layers, d.kv_heads, d.head_dim, self.block_size, self.device)

    def _run_prefixes(self, state: RowDecodeState, pending: list[int]) -> None:
        """Compute the shared prefixes of ``pending`` rows that are not computed yet, each as
        its own prompt in a slot the state keeps."""
        assert state.cache is not None
        missing = list(dict.fromkeys(
            k for k in (state.prefix_of[r] for r in pending)
            if k is not None and k not in state.prefixes))
        if not missing:
            return
        segments = []
        for key in missing:
            cache = RowSlot(state.cache.allocate())
            segments.append(_Segment(cache, key, key))
        results = self._run(state.cache, segments)
        for seg in segments:
            assert isinstance(seg.target, tuple)
            state.prefixes[seg.target] = (seg.cache, results[seg.target])

    def _start_row(self, state: RowDecodeState, row: int) -> tuple[RowSlot, list[int]]:
        """A new row's slot (its prefix's positions copied in, when it has one) and the token
        ids still to run."""
        assert state.cache is not None
        cache = RowSlot(state.cache.allocate())
        key = state.prefix_of[row]
        if key is not None:
            prefix, _ = state.prefixes[key]
            state.cache.copy_positions(prefix.slot, cache.slot, prefix.length)
            cache.length = prefix.length
        return cache, list(state.prompts[row])

    def _run(self, cache: SlotCache, segments: Sequence[_Segment], all_positions: bool = False,
             graphs: bool = False) -> dict[Any, torch.Tensor]:
        """Run ``segments`` through the body in calls of at most :meth:`_step_tokens`
        tokens (a segment may be cut anywhere: its later part attends to the earlier part's
        keys in its slot, the same integers either way). Returns the last hidden state of each
        segment by target (with ``all_positions``, every position's, concatenated). With
        ``graphs`` (a decode step's call), decode calls may be replayed from graphs."""
        results: dict[Any, torch.Tensor] = {}
        pieces: dict[Any, list[torch.Tensor]] = {}
        limit = self._step_tokens()
        call: list[tuple[_Segment, int, int]] = []  # (segment, first id, count)
        size = 0

        def flush() -> None:
            out = self._call(cache, call, graphs)
            offset = 0
            for seg, first, count in call:
                part = out[offset:offset + count]
                offset += count
                if all_positions:
                    pieces.setdefault(seg.target, []).append(part)
                if first + count == len(seg.ids):
                    results[seg.target] = part[-1]

        for seg in segments:
            done = 0
            while done < len(seg.ids):
                count = min(len(seg.ids) - done, limit - size)
                call.append((seg, done, count))
                size += count
                done += count
                if size >= limit:
                    flush()
                    call, size = [], 0
        if call:
            flush()
        if all_positions:
            return {k: torch.cat(v) for k, v in pieces.items()}
        return results

    def _step_tokens(self) -> int:
        """Most tokens of one forward call: :data:`GPU_STEP_TOKENS` on a GPU whose decode
        calls are replayed from graphs (every kernel admitted), else :data:`MAX_STEP_TOKENS` (a
        public rule: where calls are cut changes no bit)."""
        if self.device_type == "cpu" or not self._graphs_wanted():
            return MAX_STEP_TOKENS
        return GPU_STEP_TOKENS

    def _call(self, cache: SlotCache, call: Sequence[tuple[_Segment, int, int]],
              graphs: bool = False) -> torch.Tensor:
        """One forward call: the listed pieces of segments, in order. Returns the hidden
        states of all its tokens, ``[T, H]`` on the model's device."""
        ids: list[int] = []
        slots: list[int] = []
        positions: list[int] = []
        decode_tokens: list[int] = []
        decode_slots: list[int] = []
        tiles: list[PromptTile] = []
        for seg, first, count in call:
            rc = seg.cache
            start = rc.length
            index = len(ids)
            ids.extend(int(t) for t in seg.ids[first:first + count])
            slots.extend([rc.slot] * count)
            positions.extend(range(start, start + count))
            rc.length += count
            if count == 1:  # one query: attended over its whole slot (the same bits as a tile)
                decode_tokens.append(index)
                decode_slots.append(rc.slot)
            else:
                for offset in range(0, count, TILE):
                    n = min(TILE, count - offset)
                    tiles.append(PromptTile(rc.slot, index + offset, n, start + offset))
        if graphs and not tiles and self._graphs_wanted():  # a decode call: from a graph
            hidden = self._replay_decode(cache, ids, slots, positions)
            if hidden is not None:
                return hidden
        cache.reserve(max(positions) + 1)
        lengths = torch.zeros(cache.slots, dtype=torch.int64)
        for seg, _, _ in call:
            lengths[seg.cache.slot] = seg.cache.length
        dev = self.device
        step = AttentionStep(  # index tensors copied without waiting for the device
            slots=index_tensor(slots, dev),
            positions=index_tensor(positions, dev),
            decode_tokens=index_tensor(decode_tokens, dev),
            decode_slots=index_tensor(decode_slots, dev),
            lengths=lengths,
            tiles=tiles,
            extent=max(positions) + 1,
        )
        with torch.inference_mode():
            hidden = self._decoder.forward(index_tensor(ids, dev), step, cache)
        with torch.inference_mode(False):
            return hidden.float().clone()

    # ------------------------------------------------------------ decode graphs

    def set_decode_graphs(self, mode: str) -> None:
        """How decode calls run: ``"auto"`` (default: replayed from CUDA graphs where
        :func:`~dplang.models.decode_graphs.graphs_wanted`), ``"off"`` (launched one kernel at
        a time), or ``"static"`` (the graphs' padded, static-input path without recording, on
        any device: for tests). The bits are the same in every mode."""
        if mode not in ("auto", "off", "static"):
            raise ValueError(f"decode graph mode must be auto, off or static, got {mode!r}")
        self._graphs_mode = mode
        self.graphs_refused = None

    def _graphs_wanted(self) -> bool:
        mode = self._graphs_mode
        if mode == "off" or self.graphs_refused is not None:
            return False
        return mode == "static" or graphs_wanted(self.device)

    def _replay_decode(self, cache: SlotCache, ids: list[int], slots: list[int],
                       positions: list[int]) -> torch.Tensor | None:
        """A decode call's hidden states from its graph, or ``None`` when a graph could not
        be recorded (the model then decodes eagerly, with a warning, and
        :attr:`graphs_refused` says why). A graph that replays other bits than its eager call
        stops the run (:class:`~dplang.models.decode_graphs.GraphMismatch`)."""
        graphs = cache.decode_graphs
        if graphs is None:
            graphs = cache.decode_graphs = DecodeGraphs(
                self._decoder, cache, record=self._graphs_mode != "static")
        try:
            with torch.inference_mode():
                hidden = graphs.run(cache, ids, slots, positions)
            with torch.inference_mode(False):
                return hidden.clone()  # the graph's output is overwritten by its next replay
        except GraphRecordingError as error:
            self.graphs_refused = str(error)
            notices.warn(f"decode graphs turned off, decode calls run eagerly: {error}",
                         RuntimeWarning, stacklevel=2)
            return None

    def token_hidden_states(self, sequences: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """The final-norm hidden state of every position of each token sequence (``[len, H]``
        float32 each), computed as prompts with the same row-invariant path as decoding (used
        to score texts: perplexity)."""
        for row, seq in enumerate(sequences):
            if not seq:
                raise ValueError(f"sequence {row} is empty")
        results: list[torch.Tensor] = []
        cache = self._new_cache()
        batch: list[_Segment] = []
        size = 0
        limit = self._step_tokens()

        def flush() -> None:
            out = self._run(cache, batch, all_positions=True)
            for seg in batch:
                results.append(out[seg.target].cpu())
                cache.release(seg.cache.slot)

        for row, seq in enumerate(sequences):
            if batch and size + len(seq) > limit:
                flush()
                batch, size = [], 0
            batch.append(_Segment(RowSlot(cache.allocate()), list(seq), row))
            size += len(seq)
        if batch:
            flush()
        return results

    @torch.no_grad()
    def logits_from_hidden(
        self, hidden: torch.Tensor, candidates: torch.Tensor | None = None,
        keep_device: bool = False,
    ) -> torch.Tensor:
        """float32 logits: ``[rows, V]``, or ``[rows, K]`` for int64 ``candidates [rows, K]``
        (only those rows of the head weight are touched).

        Privacy contract: each row's logits depend only on that row's hidden state (and its own
        candidate ids), bit for bit, whatever the other rows or the width ``K``; a candidate's
        logit is the same bits as in the full-vocabulary logits. The logits are on the CPU
        whatever the model's device, or on the model's device with ``keep_device`` (then
        candidates already on that device are not range-checked on the host, which would
        synchronise a GPU: an id out of range fails in the gather there, or gets a NaN logit
        from the Triton kernel of the sparse head, which reads nothing outside the weights)."""
        hidden = torch.as_tensor(hidden).to(device=self.device, dtype=torch.float32)
        if hidden.ndim != 2 or hidden.shape[1] != self.hidden_size:
            raise ValueError(
                f"hidden must be [rows, {self.hidden_size}], got {tuple(hidden.shape)}"
            )
        head = self._decoder.head
        if candidates is None:
            logits = head(hidden)
        else:
            candidates = torch.as_tensor(candidates)
            if candidates.dtype != torch.int64:
                raise TypeError(f"candidates must be int64, got {candidates.dtype}")
            if candidates.ndim != 2 or candidates.shape[0] != hidden.shape[0]:
                raise ValueError(
                    f"candidates must be [rows={hidden.shape[0]}, K], got {tuple(candidates.shape)}"
                )
            # skipped only for candidates already on a GPU (a host check would wait for it;
            # an id out of range fails in the gather there); on the CPU the compiled gather
            # has no bounds check, so the ids are always checked here
            on_device = torch.device(self.device).type
            on_host_check = not (keep_device and on_device != "cpu"
                                 and candidates.device.type == on_device)
            if on_host_check and candidates.numel() and (
                int(candidates.min()) < 0 or int(candidates.max()) >= self.vocab_size
            ):
                raise ValueError("candidate id out of range")
            logits = head.gathered(hidden, candidates.to(self.device))
        logits = logits_postprocess(logits, self._logit_multiplier, self._softcap)
        with torch.inference_mode(False):
            return logits.float().clone() if keep_device else logits.float().cpu().clone()

    def top_superset_logits(
        self, hidden: torch.Tensor, top_k: int, margin: float,
        banned: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """For each row of ``hidden [rows, H]``: ``(ids [rows, W], sizes [rows], logits [rows,
        W])``, the ascending ids (padded by the row's first id) of a set of tokens that holds
        the ``top_k`` largest logits and every token whose logit is at least
        ``f32(ell - margin)`` (``margin >= 0``), ``ell`` the row's
        ``top_k``-th largest logit with the ``banned`` ids (int64) at -inf (never in the
        set), and their logits (the same bits as :meth:`logits_from_hidden`'s). ``None``
        where the model has no cheaper way than every logit (see
        :meth:`dplang.models.exact.IntegerLinear.top_superset`; also with a logit scaling or
        soft cap, or off the CPU): the caller then computes every logit.

        Privacy contract: as :meth:`logits_from_hidden`'s; row ``i``'s set is a function of
        row ``i`` of ``hidden`` (and the public arguments) only."""
        if self._softcap is not None or self._logit_multiplier != 1.0:
            return None
        if torch.device(self.device).type != "cpu":
            return None
        hidden = torch.as_tensor(hidden).to(dtype=torch.float32)
        if hidden.ndim != 2 or hidden.shape[1] != self.hidden_size:
            raise ValueError(
                f"hidden must be [rows, {self.hidden_size}], got {tuple(hidden.shape)}"
            )
        mask = None
        if banned is not None and banned.numel():
            mask = torch.zeros(self.vocab_size, dtype=torch.bool)
            mask[banned.cpu()] = True
        return self._decoder.head.top_superset(hidden, top_k, margin, mask)

    def next_logits(
        self,
        state: DecodeState,
        tokens: torch.Tensor | None,
        candidates: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``logits_from_hidden(next_hidden(state, tokens), candidates)``."""
        return self.logits_from_hidden(self.next_hidden(state, tokens), candidates)

    def drop_rows(self, state: DecodeState, keep: torch.Tensor) -> DecodeState:
        """Keep only rows ``keep`` (int64, strictly increasing); the dropped rows' slots are
        freed. Updates ``state`` in place and returns it."""
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
                    state.cache.release(dropped.slot)
        state.caches = [state.caches[i] for i in kept]
        state.prompts = [state.prompts[i] for i in kept]
        state.prefix_of = [state.prefix_of[i] for i in kept]
        return state

    # ----------------------------------------------------------------- checks

    @torch.inference_mode()
    def _verify_head(self) -> None:
        """Check the exact decoder against the model's own forward on a short prompt: equal to
        rounding (a missing soft-cap, scale or norm form shows as an error of whole logits)."""
        ids = self._prompt_ids("Hello world. This is a test of the exact decoder")
        state = RowDecodeState(prompts=[ids])
        ours = self.logits_from_hidden(self.next_hidden(state, None))
        input_ids = torch.tensor([ids], dtype=torch.int64,
                                 device=next(self.model.parameters()).device)
        out = self.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids))
        theirs = out.logits[:, -1].float().cpu()
        spread = max(float(theirs.abs().max()), 1.0)
        tolerance = (3e-2 if self.dtype == torch.float32 else 6e-2) * spread
        err = float((ours - theirs).abs().max())
        if not err <= tolerance:
            raise UnsupportedModelError(
                f"{type(self.model).__name__}: dplang's exact decoder does not reproduce the "
                f"model's logits (max abs error {err:.3g} of {spread:.3g}); its architecture "
                "computes something dplang does not know"
            )

    def refusal_key(self) -> str | None:
        """The key of this configuration's refusal record
        (:func:`~dplang.models.invariance.refusal_key`), or ``None`` for an in-memory model."""
        from dplang.models.invariance import refusal_key

        if self._path is None:
            return None
        files = model_files(self._path, self._gguf_name)
        return refusal_key(files, self.numerics)

    def use_reference_arithmetic(self) -> None:
        """Run without the fast paths from now on: float32 products instead of the int8
        kernel, the torch definitions instead of the fused CPU kernels (the same bits by
        design: the load-time check falls back to this if a fast path misbehaves)."""
        from dplang.models import cpu_kernels

        self._decoder.use_float_products()
        cpu_kernels.disable()

    def check_row_invariance(self) -> None:
        """Verify this configuration is row-invariant here (see
        :func:`dplang.models.invariance.check_row_invariance`); raises
        :class:`~dplang.models.invariance.RowInvarianceError` if not."""
        from dplang.models.invariance import mark_checked

        check_row_invariance(self)
        mark_checked(self)

    def row_invariance_checked(self) -> bool:
        """Whether the row-invariance check passed for this model's configuration as it is
        now (its code, libraries, threads and device: :func:`~dplang.models.invariance.
        is_checked`). A model loaded with ``check_invariance=False`` (for scoring) has not."""
        from dplang.models.invariance import is_checked

        return is_checked(self)

    def ensure_row_invariance(self) -> None:
        """Run the check (its record, when on file: :func:`~dplang.models.invariance.
        check_row_invariance_cached`) unless it passed for the configuration as it is now;
        raises :class:`~dplang.models.invariance.RowInvarianceError` if it fails."""
        if not self.row_invariance_checked():
            check_row_invariance_cached(self)

"""Any local Hugging Face causal language model behind the :class:`LogitsModel` protocol.

The model is loaded in float32 on the CPU from a folder (``config.json`` + safetensors +
tokenizer) or from a GGUF file (dequantised by ``transformers``). A decode step is split as the
protocol asks: :meth:`TransformersModel.next_hidden` runs only the transformer body (embeddings,
decoder layers, final norm) with a KV cache, and :meth:`TransformersModel.logits_from_hidden`
applies the LM head, either over the full vocabulary or only over per-row candidate ids (the
*sparse LM head*: gather the candidate rows of the head weight and take batched dot products).

CPU performance notes (measured on a 2-core AMD EPYC with MKL, Gemma 3 270M):

* The full LM head (262,144 x 640) is the largest matrix product of a step. Written as
  ``hidden @ W.T`` MKL runs it as one skinny GEMM/GEMV that used a single core (~54 ms for one
  row); as a batched product over vocabulary blocks, ``bmm(W.view(B, V/B, H), hidden.T)``, the
  blocks are spread over the cores and the same product takes ~19 ms. It is never worse at
  larger row counts, so :func:`_head_matmul` always uses it.
* The same holds for the linear layers of the body when a decode step has only a few rows
  (at most 4 tokens in all): :func:`_body_linear_forward` then splits the output features
  into one block per thread, which nearly halves the body's time at one row (~41 -> ~23 ms).
  From about 6 rows on MKL's own GEMM is faster and is used.
* Faster from 3 rows on, where PyTorch has oneDNN (``torch.backends.mkldnn``): every linear
  layer of the body and the full LM head use weights *pre-packed* once at load into oneDNN's
  blocked layout (:func:`pack_linear_weight`), so no product re-lays out its weight at every
  call. Measured here (float32): the 8-row full head 53 -> 24 ms, the body's linear layers at
  8 rows 41 -> 22 ms and at 64 rows -28%, the prompt step -20-30%. At 1-2 rows the blocked
  products above stay faster and are used. The packed copies cost memory (about the size of
  the head plus the body's linear weights: ~1.1 GB for Gemma 3 270M in float32);
  ``packed_weights=False`` or ``DPLANG_PACKED_WEIGHTS=0`` keeps the plain path.
* The stock ``DynamicCache`` re-concatenates the whole KV cache at every step (a quarter of the
  step at 32 rows); see :mod:`dplang.models._kvcache` for the in-place replacement.

* The prompt step pre-fills rows of similar length together (:func:`prefill_groups`) and merges
  their caches into one left-padded cache, instead of running every row padded to the longest
  prompt: with Yelp reviews of 20-300 tokens, 55% of a padded prefill was padding.
* Decode steps skip most of that padding in attention too: the model keeps its rows sorted by
  decreasing prompt length (``HFDecodeState.order``; callers see their own order) and runs
  attention per bucket of similar rows over the cache suffix the bucket needs
  (:mod:`dplang.models._ragged`): about -10% for a 64-row DP step on Yelp prompts.

These change only how the work is split, not what is computed: results agree with the plain
path to float32 rounding (the tests compare against the model's own uncached forward).

**Compute dtype.** ``dtype="bfloat16"`` runs the transformer body (weights, activations, KV
cache) in bfloat16, the dtype Gemma 3 was trained in; the LM head always stays float32 on the
float32 final hidden state, so logits are float32 either way. On CPUs with native bfloat16
matrix units (AVX512-BF16 or AMX) the body's matrix products are about 3x faster (measured
here: 133 -> 416 GFLOP/s); elsewhere bfloat16 is emulated and slower, so ``dtype="auto"`` picks
bfloat16 only where :func:`native_bfloat16` says the CPU has it. The dtype changes the model's
numbers slightly, never the privacy guarantee (which holds for any deterministic logits: the
clipping bounds what each reference can change).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dplang.models import _ragged
from dplang.models._ragged import ACTIVE_PLAN, RAGGED_SDPA, BucketPlan, plan_buckets
from dplang.models._ragged import register as register_ragged_attention
from dplang.models.base import DecodeState

__all__ = [
    "DTYPES",
    "HFDecodeState",
    "TransformersModel",
    "available_cores",
    "native_bfloat16",
    "pack_linear_weight",
    "packed_weights_default",
    "prefill_groups",
    "resolve_dtype",
]

#: Accepted ``dtype`` names of :class:`TransformersModel`.
DTYPES = ("auto", "float32", "bfloat16")

#: Prompt-step row groups: a row joins a group while the group's padded size stays within
#: this factor of its real tokens (see :func:`prefill_groups`).
_PREFILL_SLACK = 1.25
#: ... and while the group holds at most this many (padded) token positions.
_PREFILL_MAX_POSITIONS = 8192

#: Number of vocabulary blocks of the batched LM-head product (see the module docstring).
_HEAD_BLOCKS = 64
#: Smallest vocabulary block worth a separate batch entry.
_MIN_BLOCK_ROWS = 1024


#: Block count for the body's linear layers in the current decode step (0: plain F.linear).
_LINEAR_BLOCKS: contextvars.ContextVar[int] = contextvars.ContextVar(
    "dplang_linear_blocks", default=0
)
#: Whether the body's linear layers use their pre-packed weights in the current call.
_PACKED_LINEARS: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "dplang_packed_linears", default=False
)
#: Above this many tokens in one call the plain GEMM is faster (measured: the blocked form wins
#: clearly up to 4 tokens, e.g. 41 -> 23 ms for the body at one row, and loses from 6 on).
_MAX_BLOCKED_TOKENS = 4
#: Packed weights are used from this many tokens (rows) per product on; below it the blocked
#: products are faster (measured, float32: full head at 1 / 2 / 3 / 8 rows 18 / 19 / 25 / 53 ms
#: blocked against 25 / 27 / 21 / 24 ms packed; the body's linear layers alike).
_MIN_PACKED_ROWS = 3
#: Row count oneDNN is told to expect when it packs a weight (a layout hint only: the packed
#: weight gives the same products for any number of rows).
_PACK_HINT_ROWS = 64


def available_cores() -> int:
    """Number of CPU cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def native_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices natively (AVX512-BF16 or AMX-BF16 in
    ``/proc/cpuinfo``, and oneDNN available to PyTorch)."""
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        flags: set[str] = set()
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("flags"):
                    flags.update(line.split(":", 1)[1].split())
                    break
    except OSError:  # not Linux, or no /proc: stay with float32
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The torch dtype for a ``dtype`` name: ``"auto"`` is bfloat16 where
    :func:`native_bfloat16`, else float32."""
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"dtype must be float32 or bfloat16, got {dtype}")
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if native_bfloat16() else torch.float32
    if dtype == "float32":
        return torch.float32
    if dtype == "bfloat16":
        return torch.bfloat16
    raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")


def _prompt_positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of left-padded prompts: 0, 1, ... over each row's real tokens."""
    return (mask.cumsum(dim=1) - 1).clamp_(min=0)


def prefill_groups(
    lengths: Sequence[int],
    *,
    slack: float = _PREFILL_SLACK,
    max_positions: int = _PREFILL_MAX_POSITIONS,
) -> list[list[int]]:
    """Row groups for the prompt step: rows sorted by decreasing length, and a row joins the
    current group while ``width * rows <= slack * real_tokens`` and ``width * rows <=
    max_positions`` (``width`` = the group's longest row). Every row is in exactly one group;
    the grouping depends only on the lengths."""
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    groups: list[list[int]] = []
    current: list[int] = []
    real = 0
    for i in order:
        length = int(lengths[i])
        if current:
            padded = int(lengths[current[0]]) * (len(current) + 1)
            if padded <= slack * (real + length) and padded <= max_positions:
                current.append(i)
                real += length
                continue
            groups.append(current)
        current, real = [i], length
    if current:
        groups.append(current)
    return groups


@dataclass
class HFDecodeState:
    """Decoding state of :class:`TransformersModel` for a batch of rows.

    Attributes:
        input_ids: left-padded prompt ids ``[rows, L]`` (consumed by the first step).
        attention_mask: ``[rows, L + steps]`` (1 for real tokens, 0 for left padding).
        next_positions: position id of the next token of every row, ``[rows]``.
        prompt_lengths: number of real prompt tokens of every row, ``[rows]``.
        cache: the ``transformers`` KV cache; ``None`` until the first :meth:`next_hidden`.
        steps: number of :meth:`next_hidden` calls so far.
        order: the row order inside the model (the cache and the body's batches): position
            ``i`` holds the caller's row ``order[i]``; rows sorted by decreasing prompt length
            with ragged attention (see :mod:`dplang.models._ragged`), else ``None`` (the
            caller's order). Every other field is in the caller's order.
        buckets: the ragged-attention bucket plan of the current rows (computed at the first
            decode step, dropped with rows).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    next_positions: torch.Tensor
    prompt_lengths: torch.Tensor
    cache: Any = None
    steps: int = 0
    order: torch.Tensor | None = None
    buckets: tuple[tuple[int, int, int], ...] | None = None

    def to_inner(self, rows: torch.Tensor) -> torch.Tensor:
        """Per-row values in the caller's order, rearranged to the model's internal order."""
        return rows if self.order is None else rows.index_select(0, self.order)

    def inner_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """The positions, in the model's internal order, of the caller's rows ``rows``."""
        return rows if self.order is None else torch.argsort(self.order).index_select(0, rows)

    def to_caller(self, rows: torch.Tensor) -> torch.Tensor:
        """Per-row values in the model's internal order, rearranged to the caller's order."""
        if self.order is None:
            return rows
        out = torch.empty_like(rows)
        out[self.order] = rows
        return out

    @property
    def rows(self) -> int:
        """Number of rows still decoded."""
        return int(self.attention_mask.shape[0])

    @property
    def started(self) -> bool:
        """Whether the prompts have been run through the model."""
        return self.steps > 0


@functools.cache
def _packing_works(dtype: torch.dtype) -> bool:
    """Whether oneDNN weight packing is available for ``dtype`` here and reproduces
    ``F.linear`` on a small probe (checked once per dtype and process)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        gen = torch.Generator().manual_seed(0)
        weight = torch.randn(48, 32, generator=gen).to(dtype)
        x = torch.randn(3, 32, generator=gen).to(dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_HINT_ROWS)
        got = _packed_linear(x, packed, None).float()
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    want = torch.nn.functional.linear(x, weight).float()
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    return got.shape == want.shape and bool(torch.allclose(got, want, rtol=tol, atol=tol))


def packed_weights_default() -> bool:
    """Whether models pre-pack their weights unless told otherwise: yes, unless the environment
    variable ``DPLANG_PACKED_WEIGHTS`` is ``0`` (or ``false``/``no``/``off``)."""
    value = os.environ.get("DPLANG_PACKED_WEIGHTS", "1").strip().lower()
    return value not in ("0", "false", "no", "off")


def pack_linear_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` (``[out, in]``) pre-packed in oneDNN's blocked layout for
    :func:`_packed_linear`, or ``None`` where packing is unavailable for its dtype.

    Only the memory layout changes: products with the packed weight equal ``F.linear`` up to
    floating-point summation order."""
    if weight.ndim != 2 or not _packing_works(weight.dtype):
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), _PACK_HINT_ROWS)


def _packed_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with the weight packed by :func:`pack_linear_weight`."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


def _head_matmul(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``hidden @ weight.T`` (``[rows, V]``) as a batched product over vocabulary blocks.

    Mathematically the plain product; only the work split differs (see the module docstring).
    """
    vocab, width = weight.shape
    rows = hidden.shape[0]
    blocks = min(_HEAD_BLOCKS, vocab // _MIN_BLOCK_ROWS)
    if blocks < 2 or not weight.is_contiguous():
        return hidden @ weight.T
    main = vocab - vocab % blocks
    chunked = weight[:main].view(blocks, main // blocks, width)
    out = torch.bmm(chunked, hidden.T.unsqueeze(0).expand(blocks, width, rows))
    out = out.permute(2, 0, 1).reshape(rows, main)
    if main < vocab:
        out = torch.cat([out, hidden @ weight[main:].T], dim=1)
    return out


def _body_linear_forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``module(x)``; inside :meth:`TransformersModel.next_hidden`, with the module's pre-packed
    weight (``_PACKED_LINEARS``) or, for a decode step of a few rows, as a batched product over
    output-feature blocks (``_LINEAR_BLOCKS``).

    Installed as the instance ``forward`` of the body's ``nn.Linear`` layers by
    :meth:`TransformersModel._install_body_linears`; outside ``next_hidden`` (both context
    variables unset) it is exactly ``nn.Linear.forward``.
    """
    weight = module.weight
    blocks = _LINEAR_BLOCKS.get()
    out_features, in_features = weight.shape
    tokens = x.numel() // in_features if in_features else 0
    packed = getattr(module, "_dplang_packed", None)
    if (
        packed is not None
        and _PACKED_LINEARS.get()
        and tokens >= _MIN_PACKED_ROWS
        and x.dtype == weight.dtype
    ):
        return _packed_linear(x, packed, module.bias)
    if (
        blocks < 2
        or tokens == 0
        or tokens > _MAX_BLOCKED_TOKENS
        or out_features % blocks
        or not weight.is_contiguous()
        or x.dtype != weight.dtype
    ):
        return torch.nn.functional.linear(x, weight, module.bias)
    flat = x.reshape(tokens, in_features)
    chunked = weight.view(blocks, out_features // blocks, in_features)
    out = torch.bmm(chunked, flat.T.unsqueeze(0).expand(blocks, in_features, tokens))
    out = out.permute(2, 0, 1).reshape(*x.shape[:-1], out_features)
    if module.bias is not None:
        out = out + module.bias
    return out


class TransformersModel:
    """A Hugging Face causal LM (local folder or GGUF file) as a :class:`LogitsModel`.

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
        buffered_cache: append to the KV cache in place instead of re-concatenating
            (see :mod:`dplang.models._kvcache`); ``False`` uses ``transformers``' stock cache.
        blocked_linear: during decode steps run the body's linear layers as batched products
            over one output block per thread (see the module docstring); ``False`` keeps
            ``F.linear``. The model's own ``forward`` is never affected.
        verify: check once, on a short prompt, that body + :meth:`logits_from_hidden`
            reproduces the model's own forward logits (guards against architectures whose
            LM-head post-processing this backend does not know).
        dtype: compute dtype of the body, ``"float32"`` (default), ``"bfloat16"`` or
            ``"auto"`` (see the module docstring); logits are float32 in every case.
        grouped_prefill: pre-fill rows of similar length together and merge their caches
            (see :func:`prefill_groups`); ``False`` pads every prompt to the longest.
        packed_weights: pre-pack the body's linear weights and the LM head for oneDNN where
            PyTorch has it (see the module docstring; costs a copy of those weights in
            memory); ``False`` keeps the plain products. ``None`` (the default): on, unless
            the environment variable ``DPLANG_PACKED_WEIGHTS`` is ``0`` (for machines short
            of memory; it reaches every command that loads a model).
        ragged_attention: run decode-step attention per bucket of rows of similar length, so
            that it skips most of the left padding (see :mod:`dplang.models._ragged`; only for
            models using ``transformers``' SDPA attention); ``False`` keeps plain SDPA.
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
        buffered_cache: bool = True,
        blocked_linear: bool = True,
        verify: bool = True,
        dtype: str | torch.dtype = "float32",
        grouped_prefill: bool = True,
        packed_weights: bool | None = None,
        ragged_attention: bool = True,
    ) -> None:
        self.dtype = resolve_dtype(dtype)
        self.threads = threads if threads is not None else available_cores()
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        torch.set_num_threads(self.threads)

        self._path: Path | None = None
        self._gguf_name: str | None = None
        if model is None:
            if path is None:
                raise ValueError("TransformersModel needs a path or a model")
            folder, self._gguf_name = self._resolve_path(Path(path), gguf_file)
            self._path = folder
            model, tokenizer = self._load(folder, self._gguf_name, tokenizer)
        else:
            if tokenizer is None:
                raise ValueError("TransformersModel(model=...) also needs tokenizer=...")
            if path is not None:
                self._path = Path(path)
        self.model = model.to(torch.float32).eval()
        for param in self.model.parameters():
            param.requires_grad_(False)
        self.tokenizer = tokenizer
        self.config = self.model.config
        self._body = self._find_body(self.model)
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
        self._grouped_prefill = grouped_prefill
        self.vocab_size: int = int(self._head_weight.shape[0])
        self.hidden_size: int = int(self._head_weight.shape[1])
        self._softcap, self._logit_multiplier = self._logit_postprocessing(self.config)
        self._buffered_cache = buffered_cache
        self._linear_blocks = self.threads if blocked_linear and self.threads > 1 else 0
        self._packed_head: torch.Tensor | None = None
        self._packed_linears = False
        if packed_weights is None:
            packed_weights = packed_weights_default()
        if packed_weights:
            self._packed_head = pack_linear_weight(self._head_weight)
            self._packed_linears = self._pack_body_linears(self._body)
        if self._linear_blocks or self._packed_linears:
            self._install_body_linears(self._body)
        self._ragged = ragged_attention and self._use_ragged_attention(self.model)

        if self.tokenizer.pad_token_id is None:
            if self.tokenizer.eos_token is not None:
                self.tokenizer.pad_token = self.tokenizer.eos_token
            else:
                self.tokenizer.pad_token = self.tokenizer.convert_ids_to_tokens(0)
        self._pad_id = int(self.tokenizer.pad_token_id)
        self.eos_token_ids: frozenset[int] = self._find_eos_ids()

        if model_id is not None:
            self.model_id = model_id
        elif self._path is not None:
            target = self._path / self._gguf_name if self._gguf_name else self._path
            self.model_id = str(target)
        else:
            self.model_id = getattr(self.config, "_name_or_path", "") or type(self.model).__name__
        self._digest = weights_digest
        if verify:
            self._verify_head()

    # ------------------------------------------------------------------ loading

    @staticmethod
    def _resolve_path(path: Path, gguf_file: str | None) -> tuple[Path, str | None]:
        if not path.exists():
            raise FileNotFoundError(f"model path does not exist: {path}")
        if path.is_file():
            if path.suffix.lower() != ".gguf":
                raise ValueError(f"a model file must be a .gguf file, got {path}")
            return path.parent, path.name
        if gguf_file is not None and not (path / gguf_file).is_file():
            raise FileNotFoundError(f"GGUF file not found: {path / gguf_file}")
        return path, gguf_file

    @staticmethod
    def _load(folder: Path, gguf_name: str | None, tokenizer: Any) -> tuple[Any, Any]:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        kwargs: dict[str, Any] = {"dtype": torch.float32}
        if gguf_name is not None:
            kwargs["gguf_file"] = gguf_name
            try:  # transformers >= 5 can keep GGUF blocks packed; we want plain float32.
                from transformers import GgufConfig

                kwargs["quantization_config"] = GgufConfig(dequantize=True)
            except ImportError:  # pragma: no cover - older transformers always dequantise
                pass
        model = AutoModelForCausalLM.from_pretrained(str(folder), **kwargs)
        strip_quantization(model)
        if tokenizer is None:
            tok_kwargs = {"gguf_file": gguf_name} if gguf_name is not None else {}
            tokenizer = AutoTokenizer.from_pretrained(str(folder), **tok_kwargs)
        return model, tokenizer

    @staticmethod
    def _find_body(model: Any) -> Any:
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

    @staticmethod
    def _use_ragged_attention(model: Any) -> bool:
        """Switch a model that uses SDPA attention to :data:`RAGGED_SDPA` (the same attention
        outside decode steps; a model already switched by another instance stays so);
        ``False`` if it uses another attention implementation."""
        configs = {id(c): c for c in (model.config, getattr(model.config, "text_config", None))
                   if c is not None}
        if any(getattr(c, "_attn_implementation", None) not in ("sdpa", RAGGED_SDPA)
               for c in configs.values()):
            return False
        if not register_ragged_attention():
            return False
        for config in configs.values():
            config._attn_implementation = RAGGED_SDPA
        return True

    @staticmethod
    def _pack_body_linears(body: Any) -> bool:
        """Attach a packed copy of its weight to every ``nn.Linear`` of the body; ``False``
        (nothing attached) where packing is unavailable."""
        linears = [m for m in body.modules() if type(m) is torch.nn.Linear]
        packed = [pack_linear_weight(m.weight) for m in linears]
        if not linears or any(p is None for p in packed):
            return False
        for module, weight in zip(linears, packed, strict=True):
            module._dplang_packed = weight
        return True

    @staticmethod
    def _install_body_linears(body: Any) -> None:
        """Route the body's ``nn.Linear`` layers through :func:`_body_linear_forward`."""
        for module in body.modules():
            if type(module) is torch.nn.Linear and "forward" not in vars(module):
                module.forward = functools.partial(_body_linear_forward, module)

    @staticmethod
    def _logit_postprocessing(config: Any) -> tuple[float | None, float]:
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

    def _find_eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        gen = getattr(self.model, "generation_config", None)
        for source in (getattr(gen, "eos_token_id", None), self.config.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif isinstance(source, (list, tuple)):
                ids.update(int(i) for i in source)
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        vocab = self.tokenizer.get_vocab()
        for token in ("<end_of_turn>", "<|eot_id|>", "<|im_end|>", "<|endoftext|>"):
            if token in vocab:
                ids.add(int(vocab[token]))
        return frozenset(i for i in ids if 0 <= i < self.vocab_size)

    @torch.inference_mode()
    def _verify_head(self) -> None:
        """Check body + our head against the model's own forward on a short prompt."""
        state = self.encode_prompts(["Hello world. This is a test"])
        ours = self.logits_from_hidden(self.next_hidden(state, None))
        out = self.model(input_ids=state.input_ids, attention_mask=state.attention_mask)
        theirs = out.logits[:, -1].float()
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

    # ---------------------------------------------------------------- identity

    def weights_digest(self) -> str:
        """sha256 of the weight file bytes (the GGUF file, or the ``*.safetensors`` /
        ``*.bin`` files: a single file's plain sha256, several files hashed with their names
        in name order), or of the in-memory state dict; computed once and cached."""
        if self._digest is None:
            self._digest = self._compute_digest()
        return self._digest

    def _compute_digest(self) -> str:
        digest = hashlib.sha256()
        files: list[Path] = []
        if self._path is not None and self._path.is_dir():
            if self._gguf_name is not None:
                files = [self._path / self._gguf_name]
            else:
                files = sorted(self._path.glob("*.safetensors")) or sorted(self._path.glob("*.bin"))
        if files:
            for file in files:
                if len(files) > 1:  # one file: its plain sha256 (what `sha256sum` prints)
                    digest.update(file.name.encode())
                with file.open("rb") as handle:
                    while block := handle.read(1 << 22):
                        digest.update(block)
            return digest.hexdigest()
        for name, tensor in sorted(self.model.state_dict().items()):
            digest.update(name.encode())
            digest.update(str(tuple(tensor.shape)).encode())
            digest.update(tensor.detach().contiguous().cpu().numpy().tobytes())
        return digest.hexdigest()

    # ---------------------------------------------------------------- text side

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

    # ---------------------------------------------------------------- decoding

    def encode_prompts(self, prompts: Sequence[str]) -> HFDecodeState:
        """Tokenize and left-pad rendered prompts; nothing is run yet."""
        if isinstance(prompts, str):
            raise TypeError("encode_prompts takes a sequence of prompts, not one string")
        encoded = [self._prompt_ids(p) for p in prompts]
        for i, ids in enumerate(encoded):
            if not ids:
                raise ValueError(f"prompt {i} encodes to no tokens")
        width = max((len(ids) for ids in encoded), default=0)
        rows = len(encoded)
        input_ids = torch.full((rows, width), self._pad_id, dtype=torch.int64)
        mask = torch.zeros((rows, width), dtype=torch.int64)
        for i, ids in enumerate(encoded):
            if ids:
                input_ids[i, width - len(ids) :] = torch.tensor(ids, dtype=torch.int64)
                mask[i, width - len(ids) :] = 1
        lengths = mask.sum(dim=1)
        order = None
        if self._ragged and rows > 1:  # longest prompt first: padding grows along the rows
            order = torch.tensor(sorted(range(rows), key=lambda i: (-len(encoded[i]), i)))
        return HFDecodeState(
            input_ids=input_ids,
            attention_mask=mask,
            next_positions=lengths.clone(),
            prompt_lengths=lengths,
            order=order,
        )

    def _call_body(
        self,
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        cache: Any,
        plan: BucketPlan | None = None,
    ) -> Any:
        with self.fast_products(plan):
            return self._body(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
            )

    @contextlib.contextmanager
    def fast_products(self, plan: BucketPlan | None = None) -> Iterator[None]:
        """Within this context the body's linear layers use this backend's faster products
        (packed weights, blocked products; see the module docstring) and decode attention
        follows ``plan``; outside it the body computes exactly as ``transformers`` does. Used
        by :meth:`next_hidden`, and by callers that run the body themselves (perplexity)."""
        blocks = _LINEAR_BLOCKS.set(self._linear_blocks)
        packed = _PACKED_LINEARS.set(self._packed_linears)
        ragged = ACTIVE_PLAN.set(plan)
        try:
            yield
        finally:
            ACTIVE_PLAN.reset(ragged)
            _PACKED_LINEARS.reset(packed)
            _LINEAR_BLOCKS.reset(blocks)

    def _grouped_prompt_step(self, state: HFDecodeState) -> torch.Tensor | None:
        """Prompt step by groups of rows of similar length (:func:`prefill_groups`), merged into
        one left-padded cache equal to what the padded prompt step leaves (the keys/values of
        padding positions are zeros instead of those of pad tokens; both are masked out).
        ``None`` when grouping would not save work or the cache layers are not plain."""
        from dplang.models._kvcache import make_cache, plain_layers

        lengths = state.prompt_lengths.tolist()
        groups = prefill_groups(lengths)
        if len(groups) < 2:
            return None
        width = int(state.input_ids.shape[1])
        hidden: torch.Tensor | None = None
        caches: list[tuple[torch.Tensor, Any]] = []
        for rows in groups:
            index = torch.tensor(rows, dtype=torch.int64)
            group_width = int(lengths[rows[0]])
            ids = state.input_ids.index_select(0, index)[:, width - group_width :]
            mask = state.attention_mask.index_select(0, index)[:, width - group_width :]
            positions = _prompt_positions(mask)
            cache = make_cache(self.config, buffered=self._buffered_cache)
            out = self._call_body(ids, mask, positions, cache)
            if not plain_layers(out.past_key_values):
                return None
            last = out.last_hidden_state[:, -1, :]
            if hidden is None:
                hidden = last.new_empty((state.rows, last.shape[-1]))
            hidden[index] = last
            caches.append((state.inner_rows(index), out.past_key_values))  # model's order
        merged = make_cache(self.config, buffered=self._buffered_cache)
        for layer in range(len(caches[0][1].layers)):
            sample = caches[0][1].layers[layer].keys
            keys = sample.new_zeros((state.rows, sample.shape[1], width, sample.shape[-1]))
            values = keys.clone()
            for inner, cache in caches:
                kept_k = cache.layers[layer].keys
                kept_v = cache.layers[layer].values
                kept = kept_k.shape[-2]
                keys[inner, :, width - kept :] = kept_k
                values[inner, :, width - kept :] = kept_v
            merged.update(keys, values, layer)
        state.cache = merged
        assert hidden is not None
        return hidden

    @torch.inference_mode()
    def _run_body(self, state: HFDecodeState, tokens: torch.Tensor | None) -> torch.Tensor:
        if not state.started:
            if tokens is not None:
                raise ValueError("the first next_hidden call takes tokens=None (prompt step)")
            from dplang.models._kvcache import make_cache

            if self._grouped_prefill and state.rows > 1:
                grouped = self._grouped_prompt_step(state)
                if grouped is not None:
                    return grouped.float()
            state.cache = make_cache(self.config, buffered=self._buffered_cache)
            mask = state.to_inner(state.attention_mask)
            positions = _prompt_positions(mask)
            input_ids = state.to_inner(state.input_ids)
            plan = None
        else:
            if tokens is None:
                raise ValueError("next_hidden needs one token per row after the first step")
            tokens = torch.as_tensor(tokens, dtype=torch.int64).reshape(-1)
            if tokens.shape[0] != state.rows:
                raise ValueError(f"expected {state.rows} tokens, got {tokens.shape[0]}")
            if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
                raise ValueError("token id out of range")
            ones = torch.ones((state.rows, 1), dtype=state.attention_mask.dtype)
            state.attention_mask = torch.cat([state.attention_mask, ones], dim=1)
            mask = state.to_inner(state.attention_mask)
            positions = state.to_inner(state.next_positions).unsqueeze(1)
            input_ids = state.to_inner(tokens).unsqueeze(1)
            plan = self._bucket_plan(state, mask)
        out = self._call_body(input_ids, mask, positions, state.cache, plan)
        state.cache = out.past_key_values if out.past_key_values is not None else state.cache
        if tokens is not None:
            state.next_positions = state.next_positions + 1
        return state.to_caller(out.last_hidden_state[:, -1, :].float())

    @staticmethod
    def _bucket_plan(state: HFDecodeState, inner_mask: torch.Tensor) -> BucketPlan | None:
        """The ragged-attention plan of a decode step (rows in the model's order), or ``None``
        where rows are not sorted by length (ragged attention off)."""
        if state.order is None:
            return None
        width = int(inner_mask.shape[1])
        if state.buckets is None:
            padding = (width - inner_mask.sum(dim=1)).tolist()
            state.buckets = plan_buckets(padding, width, _ragged.BUCKET_OVERHEAD)
        return BucketPlan(state.buckets, width)

    def next_hidden(self, state: DecodeState, tokens: torch.Tensor | None) -> torch.Tensor:
        """Append ``tokens`` (one per row; ``None`` on the first call, which runs the prompts)
        and return the final-norm hidden state of every row, ``[rows, H]`` float32."""
        if state.rows == 0:
            state.steps += 1
            return torch.zeros((0, self.hidden_size), dtype=torch.float32)
        hidden = self._run_body(state, tokens)
        state.steps += 1
        # A clone made outside inference mode is an ordinary tensor (callers may edit it).
        return hidden.clone()

    @torch.no_grad()
    def logits_from_hidden(
        self, hidden: torch.Tensor, candidates: torch.Tensor | None = None
    ) -> torch.Tensor:
        """float32 logits: ``[rows, V]``, or ``[rows, K]`` for int64 ``candidates [rows, K]``
        (only those rows of the head weight are touched)."""
        hidden = hidden.to(torch.float32)
        if hidden.ndim != 2 or hidden.shape[1] != self.hidden_size:
            raise ValueError(
                f"hidden must be [rows, {self.hidden_size}], got {tuple(hidden.shape)}"
            )
        if candidates is None:
            if self._packed_head is not None and hidden.shape[0] >= _MIN_PACKED_ROWS:
                logits = _packed_linear(hidden, self._packed_head, self._head_bias)
            else:
                logits = _head_matmul(hidden, self._head_weight)
                if self._head_bias is not None:
                    logits = logits + self._head_bias
        else:
            candidates = torch.as_tensor(candidates)
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
            gathered = self._head_weight[candidates]  # [rows, K, H]
            logits = torch.bmm(gathered, hidden.unsqueeze(2)).squeeze(2)
            if self._head_bias is not None:
                logits = logits + self._head_bias[candidates]
        if self._logit_multiplier != 1.0:
            logits = logits * self._logit_multiplier
        if self._softcap is not None:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return logits.float()

    def next_logits(
        self,
        state: DecodeState,
        tokens: torch.Tensor | None,
        candidates: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``logits_from_hidden(next_hidden(state, tokens), candidates)``."""
        return self.logits_from_hidden(self.next_hidden(state, tokens), candidates)

    @torch.inference_mode()
    def drop_rows(self, state: DecodeState, keep: torch.Tensor) -> DecodeState:
        """Keep only rows ``keep`` (int64, increasing): KV cache of every layer (sliding-window
        layers included), attention mask, positions and prompt ids. Updates ``state`` in place
        and returns it."""
        keep = torch.as_tensor(keep, dtype=torch.int64).reshape(-1)
        if keep.numel() > 1 and not bool((keep[1:] > keep[:-1]).all()):
            raise ValueError("keep must be strictly increasing")
        if keep.numel() and (int(keep.min()) < 0 or int(keep.max()) >= state.rows):
            raise ValueError("keep index out of range")
        state.input_ids = state.input_ids.index_select(0, keep).clone()
        state.attention_mask = state.attention_mask.index_select(0, keep).clone()
        state.next_positions = state.next_positions.index_select(0, keep).clone()
        state.prompt_lengths = state.prompt_lengths.index_select(0, keep).clone()
        inner_keep = keep
        if state.order is not None:
            # The kept rows in the model's order, and their new caller indices.
            inner_keep = torch.sort(state.inner_rows(keep)).values
            renumber = torch.full((int(state.order.numel()),), -1, dtype=torch.int64)
            renumber[keep] = torch.arange(keep.numel())
            state.order = renumber.index_select(0, state.order.index_select(0, inner_keep))
            state.buckets = None
        if state.cache is not None:
            from dplang.models._kvcache import select_cache_rows

            select_cache_rows(state.cache, inner_keep)
        return state


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

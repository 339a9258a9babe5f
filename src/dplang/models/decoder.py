"""The transformer decoder run with exact, row-independent arithmetic (privacy-critical).

:class:`ExactDecoder` takes the weights and configuration of a Hugging Face decoder of the Llama
and Gemma families (Llama, Mistral, Qwen 2 and 3, Gemma 1 to 3) and runs its forward pass with
the operations of :mod:`dplang.models.exact` and :mod:`dplang.models.attention` only: integer
matrix products, fixed-point sums, basic-operation activations, position tables and exact
attention. It does not call the ``transformers`` modules at run time, so nothing a library
decides per call (kernel, tiling, thread split, fused implementations from a kernel hub) can
make one row's numbers depend on another's. docs/privacy.md lists the argument per operation.

Every operation of the forward pass is either elementwise (a function of one token's values),
a reduction over one token's own vector (norms: :func:`~dplang.models.exact.rms_norm`), an
integer product (:class:`~dplang.models.exact.IntegerLinear`), or attention over the token's
own row (:func:`~dplang.models.attention.attend`). Tokens of many rows are concatenated into
one sequence per call; no operation mixes two tokens except attention, which only reads the
token's own slot.

An architecture it does not know is refused (``NotImplementedError``) rather than run by a
generic path whose invariance could not be argued. At load the backend also compares this
forward with the model's own (:meth:`dplang.models.transformers.TransformersModel`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dplang.models import exact, kernels
from dplang.models.architectures import SUPPORTED_MODEL_TYPES
from dplang.models.attention import (
    MAX_POSITIONS,
    TILE,
    WEIGHT_LEVELS,
    AttentionStep,
    SlotCache,
    attend,
    gather_queries,
    key_levels,
    prompt_tiles,
    value_levels,
)
from dplang.models.errors import UnsupportedModelError
from dplang.models.exact import (
    TWO_LIMB_LEVELS,
    IntegerLinear,
    PreparedRows,
    gated_rows,
    hadamard,
    prepare_rows,
    quantize_rows,
    residual_rows,
    rms_norm,
)
from dplang.models.memory import release_file_pages

__all__ = ["SUPPORTED_MODEL_TYPES", "ExactDecoder", "Norm"]

#: Positions per chunk of a position table (each chunk computed once, by the same call).
_ROPE_CHUNK = 256


@dataclass(frozen=True)
class Norm:
    """An RMS norm: ``x / sqrt(mean(x**2) + eps) * weight`` (``weight`` already ``1 + w`` for
    the Gemma form)."""

    weight: torch.Tensor
    eps: float

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


@dataclass
class Layer:
    """One decoder layer's weights and settings."""

    qkv: IntegerLinear
    o: IntegerLinear
    gate: IntegerLinear
    up: IntegerLinear
    down: IntegerLinear
    input_norm: Norm
    post_attention_norm: Norm | None  # Gemma 2/3: on the attention output
    pre_mlp_norm: Norm
    post_mlp_norm: Norm | None  # Gemma 2/3: on the MLP output
    q_norm: Norm | None
    k_norm: Norm | None
    window: int | None
    scaling: float
    softcap: float | None
    rope: str


_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu_tanh": exact.gelu_tanh,
    "silu": exact.silu,
    "relu": exact.relu,
}


def activation_kind(module: Any) -> str:
    """The exact activation equivalent to ``module`` (checked numerically), or
    ``NotImplementedError``."""
    name = type(module).__name__
    kind = None
    if name in ("GELUTanh", "PytorchGELUTanh", "NewGELUActivation", "GELUPytorchTanh",
                "FastGELUActivation") or (isinstance(module, torch.nn.GELU)
                                          and module.approximate == "tanh"):
        kind = "gelu_tanh"
    elif isinstance(module, torch.nn.SiLU) or name == "SiLUActivation":
        kind = "silu"
    elif isinstance(module, torch.nn.ReLU):
        kind = "relu"
    if kind is None:
        raise UnsupportedModelError(f"activation {name} has no exact implementation in dplang")
    x = torch.linspace(-9.0, 9.0, 1001)
    with torch.no_grad():
        want = module(x).float()
    if not torch.allclose(_ACTIVATIONS[kind](x), want, rtol=1e-5, atol=1e-6):
        raise UnsupportedModelError(f"activation {name} does not behave as {kind}")
    return kind


def _norm(module: Any) -> Norm:
    """The :class:`Norm` equal to the RMS-norm ``module`` (its form found numerically)."""
    weight = module.weight.detach().float().cpu()
    eps = float(getattr(module, "eps", getattr(module, "variance_epsilon", 1e-6)))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, weight.shape[0], generator=gen)
    with torch.no_grad():  # the model may sit on a GPU: probe it there, compare here
        want = module(x.to(module.weight.device)).float().cpu()
    for candidate in (Norm(weight.contiguous(), eps), Norm((1.0 + weight).contiguous(), eps)):
        if torch.allclose(candidate(x), want, rtol=1e-5, atol=1e-6):
            return candidate
    raise UnsupportedModelError(f"norm {type(module).__name__} is not an RMS norm dplang knows")


def _free(*modules: Any) -> None:
    """Drop the float weights of ``modules`` (their integer copies are made), and their
    resident pages where they are a memory-mapped file's (:mod:`dplang.models.memory`)."""
    for module in modules:
        for name in ("weight", "bias"):
            param = getattr(module, name, None)
            if isinstance(param, torch.Tensor):
                release_file_pages(param.data)
                param.data = param.data.new_empty(0)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotate: bool
           ) -> torch.Tensor:
    """The rotary embedding of every head of float32 ``x [T, H, d]`` with ``cos``/``sin
    [T, d]``: ``x * cos + rotate_half(x) * sin`` (two products and a sum, each rounded to
    float32), then with ``rotate`` the Hadamard transform of each head's vector
    (:func:`~dplang.models.exact.hadamard`). Each head's result is a function of that head's
    own values and its token's position only; a fused kernel computes the same bits in one
    pass where there is one (:mod:`dplang.models.kernels`)."""
    fused = kernels.lookup("rotary", x)
    if fused is not None and x.dtype == torch.float32 and x.numel():
        return fused(x, cos, sin, rotate)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    y = x * c + _rotate_half(x) * s
    return hadamard(y) if rotate else y


#: Rotary types whose frequencies are fixed when the module is built: the cos/sin of a
#: position are then ``cos(position * inv_freq) * attention_scaling`` whatever the sequence
#: length, which is what :class:`PositionTables` computes. ``dynamic`` and ``longrope``
#: recompute their frequencies from the sequence length; any other type is not one dplang read.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")

#: Largest difference accepted between the model's own rotary cos/sin and dplang's table (per
#: unit of attention scaling) at the load-time comparison. Both evaluate the *same* float32
#: angle (``position * inv_freq``: one float32 product in both). dplang's value is the float64
#: cosine rounded to float32 (within 0.5 ulp: 6e-8 for values in [-1, 1]). A library's float32
#: cos/sin is documented within 1 ulp (oneMKL's VML_HA kernels, SLEEF's u10, glibc) or 3.5 ulp
#: (SLEEF's u35 on some ARM builds); oneMKL's low-accuracy "EP" kernel, which a racing first
#: call can run (:mod:`dplang.models.vml`), keeps about half the mantissa bits: 2**-12 relative,
#: up to ~4,000 ulp (2.4e-4) reported upstream, 1.5e-4 measured here (issue 33). 2**-10 (9.8e-4)
#: accepts all of these with room to spare and stays far below what the check exists to catch:
#: a forward pass that is not ``cos(position * inv_freq)`` (another base, a scaled or partial
#: rotation, another pairing of dimensions) moves some value of the first 256 positions by more
#: than 0.01 (tests/models/test_rope_check.py measures each).
ROPE_VALUE_TOLERANCE = 2.0**-10


class PositionTables:
    """Rotary cos/sin of every position, per rotary variant (public: functions of the position
    only), computed from the model's inverse frequencies: the angle ``position * inv_freq`` in
    float32 as ``transformers`` computes it, its cosine and sine in float64 rounded to float32
    (so the tables are the same on every machine), times the variant's attention scaling.

    At construction each variant is identified and checked against the model's own rotary
    module: its type must be one with fixed frequencies (:data:`STATIC_ROPE_TYPES`), its
    frequencies unchanged since it was built, its scaling finite, and its cos/sin of the first
    positions equal to the table within :data:`ROPE_VALUE_TOLERANCE` (the accuracy of a
    library's float32 cos/sin, not of dplang's table: the table is what runs). A variant that
    differs is refused with what differs and by how much."""

    def __init__(self, body: Any, keys: set[str], head_dim: int) -> None:
        from dplang.models.vml import resolve_vml_dispatch

        resolve_vml_dispatch()  # the module's first cos/sin may be a process's first VML call
        self._head_dim = head_dim
        self._sources: dict[str, tuple[torch.Tensor, float]] = {}
        self._tables: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._device_tables: dict[tuple[str, torch.device],
                                  tuple[torch.Tensor, torch.Tensor]] = {}
        for key in sorted(keys):
            module, prefix, args = body.rotary_emb, "", ()
            if key.startswith("local:"):
                module = body.rotary_emb_local
            elif key != "default":
                prefix, args = f"{key}_", (key,)
            name = f"rotary embedding {type(module).__name__} ({key})"
            inv_freq = getattr(module, f"{prefix}inv_freq", None)
            original = getattr(module, f"{prefix}original_inv_freq", None)
            if inv_freq is None:
                inv_freq = getattr(module, "inv_freq", None)
                original = getattr(module, "original_inv_freq", None)
            if inv_freq is None:
                raise UnsupportedModelError(f"{name} has no inverse frequencies dplang can read")
            rope_type = _rope_type(module, key)
            if rope_type not in STATIC_ROPE_TYPES:
                raise UnsupportedModelError(
                    f"{name}: rope type {rope_type!r} is not one dplang reproduces (it "
                    f"reproduces ropes whose frequencies are fixed: "
                    f"{', '.join(STATIC_ROPE_TYPES)})")
            inv_freq = inv_freq.detach().float().cpu().clone()
            if not bool(torch.isfinite(inv_freq).all()):
                raise UnsupportedModelError(f"{name}: its inverse frequencies are not finite")
            if original is not None and not torch.equal(
                    original.detach().float().cpu(), inv_freq):
                moved = float((original.detach().float().cpu() - inv_freq).abs().max())
                raise UnsupportedModelError(
                    f"{name}: its frequencies changed after it was built (by up to "
                    f"{moved:.3g}), as a dynamic rope's do")
            scaling = getattr(module, f"{prefix}attention_scaling",
                              getattr(module, "attention_scaling", 1.0))
            scaling = float(scaling)
            if not (scaling > 0 and scaling < float("inf")):
                raise UnsupportedModelError(f"{name}: attention scaling {scaling!r} is not a "
                                            "positive finite number")
            self._sources[key] = (inv_freq, scaling)
            positions = torch.arange(_ROPE_CHUNK, dtype=torch.int64)
            with torch.no_grad():
                want_cos, want_sin = module(torch.zeros(1, _ROPE_CHUNK, head_dim),
                                            positions.unsqueeze(0), *args)
            cos, sin = self._compute(key, positions)
            tolerance = ROPE_VALUE_TOLERANCE * max(1.0, scaling)
            for what, mine, theirs in (("cos", cos, want_cos), ("sin", sin, want_sin)):
                theirs = theirs[0].detach().float().cpu()
                if theirs.shape != mine.shape:
                    raise UnsupportedModelError(
                        f"{name}: its {what} table has shape {tuple(theirs.shape)}, dplang's "
                        f"{tuple(mine.shape)} (a partial or differently laid-out rotation)")
                gap = (mine - theirs).abs()
                worst = float(gap.max())
                if not worst <= tolerance:  # NaN fails too
                    where = int(gap.argmax())
                    raise UnsupportedModelError(
                        f"{name}: its {what} differs from dplang's table by up to "
                        f"{worst:.3g} (position {where // head_dim}, dimension "
                        f"{where % head_dim}; a library's float32 {what} is within "
                        f"{tolerance:.1e}), so it is not cos/sin(position * inv_freq)")

    def _compute(self, key: str, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq, scaling = self._sources[key]
        angles = positions.float().unsqueeze(-1) * inv_freq  # float32, as transformers does
        angles = torch.cat([angles, angles], dim=-1).double()
        cos = torch.cos(angles).float()
        sin = torch.sin(angles).float()
        if scaling != 1.0:
            cos, sin = cos * scaling, sin * scaling
        return cos, sin

    def table(self, key: str, needed: int, device: torch.device | str = "cpu"
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` of rotary variant ``key`` for at least positions ``0..needed-1``, on
        ``device`` (a GPU's copy is kept, so a step gathers its rows there without reading the
        positions on the host: a CUDA graph of the step replays that gather)."""
        cos, sin = self._tables.get(key, (torch.empty(0, self._head_dim),) * 2)
        if cos.shape[0] < needed:
            stop = -(-needed // _ROPE_CHUNK) * _ROPE_CHUNK
            new_c, new_s = self._compute(key, torch.arange(cos.shape[0], stop))
            cos, sin = torch.cat([cos, new_c]), torch.cat([sin, new_s])
            self._tables[key] = (cos, sin)
        device = _indexed(device)
        if device.type == "cpu":
            return cos, sin
        moved = self._device_tables.get((key, device))
        if moved is None or moved[0].shape[0] != cos.shape[0]:
            moved = (cos.to(device), sin.to(device))  # the same bits: copies
            self._device_tables[(key, device)] = moved
        return moved

    def lookup(self, key: str, positions: torch.Tensor, extent: int | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` ``[T, head_dim]`` of ``positions`` for rotary variant ``key``, on
        ``positions``' device; ``extent`` (more than the largest position, when the caller
        knows it) spares reading the positions on the host, which would wait for a GPU."""
        if extent is None:
            extent = int(positions.max()) + 1 if positions.numel() else 0
        cos, sin = self.table(key, extent, positions.device)
        return cos.index_select(0, positions), sin.index_select(0, positions)

    def device_pointers(self, device: torch.device | str) -> tuple[int, ...]:
        """Addresses of the tables kept on ``device`` (a CUDA graph that gathers from them is
        valid while they are unchanged)."""
        device = _indexed(device)
        return tuple(t.data_ptr() for (key, dev), pair in sorted(
            self._device_tables.items(), key=lambda item: item[0][0]) if dev == device
            for t in pair)


def _indexed(device: torch.device | str) -> torch.device:
    """``device`` with its index (``cuda`` is the current GPU): one key per GPU for the tables
    kept there, however the caller names it."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _rope_type(module: Any, key: str) -> str:
    """The ``rope_type`` of a rotary module for one layer kind (``"default"`` when the module
    records none, as older ``transformers`` modules of the default type do)."""
    kind = getattr(module, "rope_type", None)
    if isinstance(kind, dict):
        kind = kind.get(key.split(":", 1)[-1], kind.get(key))
    return str(kind) if kind is not None else "default"


class ExactDecoder:
    """The body and LM head of a Hugging Face decoder, as integer weights and exact operations.

    Args:
        model: a loaded ``*ForCausalLM`` of a :data:`SUPPORTED_MODEL_TYPES` architecture
            (float32 weights; they are copied into integer form, the module is not used at
            run time except to tabulate rotary positions).
        body_bits: bits of the body's weights (16: equal to float32 to about 1e-5; 8: faster,
            about bfloat16's precision per weight).
        head_bits: bits of the LM head's (and tied embeddings') weights.
        release: free each float weight of ``model`` as soon as its integer copy is made (the
            model cannot run afterwards; bounds the peak memory of a load to the float weights
            not yet converted plus the integer ones).
    """

    def __init__(self, model: Any, body: Any, *, body_bits: int = 16, head_bits: int = 16,
                 device: torch.device | None = None, release: bool = False) -> None:
        config = getattr(model.config, "text_config", None) or model.config
        model_type = str(getattr(config, "model_type", ""))
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"architecture {model_type or type(model).__name__} is not supported by dplang's "
                f"exact decoder (supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
        self.config = config
        self.device = device or torch.device("cpu")
        self.hidden_size = int(config.hidden_size)
        self.num_heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.num_heads)
        self.head_dim = int(getattr(config, "head_dim", None)
                            or self.hidden_size // self.num_heads)
        self.body_bits, self.head_bits = body_bits, head_bits
        #: Queries, keys and values are rotated by a Hadamard transform before they are rounded
        #: per vector (power-of-two head sizes): scores and outputs are unchanged in exact
        #: arithmetic, and the rounding error of a vector with outliers shrinks several-fold.
        self.rotate = self.head_dim & (self.head_dim - 1) == 0

        head = model.get_output_embeddings()
        embed = body.embed_tokens
        tied = head.weight.data_ptr() == embed.weight.data_ptr()
        self.head = IntegerLinear(head.weight, getattr(head, "bias", None),
                                  weight_bits=head_bits, layout="nk",
                                  release_source=release and not (tied and head_bits != 16))
        self.embedding = self.head if tied and head_bits == 16 else IntegerLinear(
            embed.weight, None, weight_bits=16, layout="nk", release_source=release)
        self.embed_scale = self._embedding_scale(body, model_type)
        self.vocab_size = int(self.head.out_features)
        if release:
            _free(head, embed)

        layer_types = list(getattr(config, "layer_types", None) or [])
        rope_args = "layer_type" in inspect.signature(body.rotary_emb.forward).parameters
        self.layers: list[Layer] = []
        for index, hf_layer in enumerate(body.layers[: config.num_hidden_layers]):
            attn, mlp = hf_layer.self_attn, hf_layer.mlp
            layer_type = layer_types[index] if index < len(layer_types) else "full_attention"
            window = getattr(attn, "sliding_window", None)
            if window is None and layer_type == "sliding_attention":
                window = getattr(config, "sliding_window", None)
            if window is None and model_type == "mistral":
                window = getattr(config, "sliding_window", None)
            if rope_args:
                rope = layer_type
            elif layer_type == "sliding_attention" and hasattr(body, "rotary_emb_local"):
                rope = f"local:{layer_type}"
            else:
                rope = "default"
            sandwich = hasattr(hf_layer, "pre_feedforward_layernorm")
            softcap = getattr(attn, "attn_logit_softcapping", None) or getattr(
                config, "attn_logit_softcapping", None)
            v_weight, v_bias, o_weight = self._rotated_values(attn)
            qkv_weight = torch.cat([attn.q_proj.weight, attn.k_proj.weight, v_weight])
            biases = [attn.q_proj.bias, attn.k_proj.bias, v_bias]
            qkv_bias = None if all(b is None for b in biases) else torch.cat([
                b if b is not None else torch.zeros(getattr(attn, p).out_features)
                for b, p in zip(biases, ("q_proj", "k_proj", "v_proj"), strict=True)])
            self._act = activation_kind(mlp.act_fn)
            self.layers.append(Layer(
                qkv=IntegerLinear(qkv_weight, qkv_bias, weight_bits=body_bits),
                o=IntegerLinear(o_weight, attn.o_proj.bias, weight_bits=body_bits),
                gate=IntegerLinear(mlp.gate_proj.weight, getattr(mlp.gate_proj, "bias", None),
                                   weight_bits=body_bits, release_source=release),
                up=IntegerLinear(mlp.up_proj.weight, getattr(mlp.up_proj, "bias", None),
                                 weight_bits=body_bits, release_source=release),
                down=IntegerLinear(mlp.down_proj.weight, getattr(mlp.down_proj, "bias", None),
                                   weight_bits=body_bits, release_source=release),
                input_norm=_norm(hf_layer.input_layernorm),
                post_attention_norm=_norm(hf_layer.post_attention_layernorm) if sandwich
                else None,
                pre_mlp_norm=_norm(hf_layer.pre_feedforward_layernorm) if sandwich
                else _norm(hf_layer.post_attention_layernorm),
                post_mlp_norm=_norm(hf_layer.post_feedforward_layernorm) if sandwich else None,
                q_norm=_norm(attn.q_norm) if hasattr(attn, "q_norm") else None,
                k_norm=_norm(attn.k_norm) if hasattr(attn, "k_norm") else None,
                window=int(window) if window else None,
                scaling=float(getattr(attn, "scaling", self.head_dim**-0.5))
                / (self.head_dim if self.rotate else 1),
                softcap=float(softcap) if softcap else None,
                rope=rope,
            ))
            if release:
                _free(attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj,
                      mlp.up_proj, mlp.down_proj)
        self.final_norm = _norm(body.norm)
        self.activation = _ACTIVATIONS[self._act]
        self.positions = PositionTables(body, {lay.rope for lay in self.layers},
                                        self.head_dim)

    def _rotated_values(self, attn: Any) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """(v_proj weight, v_proj bias, o_proj weight) with the Hadamard rotation of the values
        folded in: ``v' = H v`` per key/value head and ``o = W_o (H / d) out'`` per head
        (``H @ H = d I``), computed in float64 from the float32 weights."""
        w_v, b_v, w_o = attn.v_proj.weight.detach(), attn.v_proj.bias, attn.o_proj.weight.detach()
        if not self.rotate:
            return w_v, b_v, w_o
        d = self.head_dim
        w_v = hadamard(w_v.double().view(self.kv_heads, d, -1).transpose(1, 2)).transpose(1, 2)
        if b_v is not None:
            b_v = hadamard(b_v.detach().double().view(self.kv_heads, d)).reshape(-1).float()
        w_o = hadamard(w_o.double().view(w_o.shape[0], self.num_heads, d)) / d
        return (w_v.reshape(self.kv_heads * d, -1).float(), b_v,
                w_o.reshape(w_o.shape[0], -1).float())

    @staticmethod
    def _embedding_scale(body: Any, model_type: str) -> float | None:
        """The factor the architecture multiplies embeddings by (Gemma: sqrt(hidden), rounded
        to the float32 the model computes it in)."""
        scale = getattr(body.embed_tokens, "embed_scale", None)
        if scale is not None:
            return float(torch.as_tensor(scale, dtype=torch.float32))
        if model_type in ("gemma", "gemma2"):
            return float(torch.tensor(body.config.hidden_size**0.5, dtype=torch.float32))
        return None

    def use_float_products(self) -> None:
        """Compute every integer product with float32 chunks instead of the int8 kernels
        (``torch._int_mm`` or the packed weights: the same integers)."""
        for linear in self._linears():
            linear.kernel = "float32"
            linear.packed = None

    def _linears(self) -> list[IntegerLinear]:
        linears = [self.head, self.embedding]
        for layer in self.layers:
            linears.extend([layer.qkv, layer.o, layer.gate, layer.up, layer.down])
        return list(dict.fromkeys(linears))

    def to(self, device: torch.device) -> ExactDecoder:
        """Move the integer weights and norms to ``device`` (in place)."""
        self.device = device
        linears = [self.head, self.embedding]
        for layer in self.layers:
            linears.extend([layer.qkv, layer.o, layer.gate, layer.up, layer.down])
            for name in ("input_norm", "post_attention_norm", "pre_mlp_norm", "post_mlp_norm",
                         "q_norm", "k_norm"):
                norm = getattr(layer, name)
                if norm is not None:
                    setattr(layer, name, Norm(norm.weight.to(device), norm.eps))
        for linear in dict.fromkeys(linears):
            linear.to(device)
        self.final_norm = Norm(self.final_norm.weight.to(device), self.final_norm.eps)
        return self

    @property
    def nbytes(self) -> int:
        """Bytes of the integer weights."""
        total = self.head.nbytes() + (0 if self.embedding is self.head
                                      else self.embedding.nbytes())
        for layer in self.layers:
            total += sum(p.nbytes() for p in (layer.qkv, layer.o, layer.gate, layer.up,
                                               layer.down))
        return total

    # ------------------------------------------------------------------ forward

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embedding.dequantized_rows(ids)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        return x

    def forward(self, ids: torch.Tensor, step: AttentionStep, cache: SlotCache) -> torch.Tensor:
        """Final-norm hidden states ``[T, H]`` of the step's tokens (``ids [T]`` at
        ``step.positions``); each layer's keys and values are written to ``cache`` first."""
        h = self.embed(ids)
        tables: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        rows = prepare_rows(self.layers[0].input_norm(h)) if self.layers else None
        last = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            assert rows is not None  # the previous layer's residual_rows prepared them
            if layer.rope not in tables:
                tables[layer.rope] = self.positions.lookup(layer.rope, step.positions,
                                                          step.extent)
            cos, sin = tables[layer.rope]
            q = qkv_step(layer, rows, self.num_heads, self.kv_heads, self.head_dim, cos, sin,
                         self.rotate, cache, index, step.slots, step.positions)
            attended = self._attention(index, layer, q, step, cache)
            h, rows = _residual(layer.o, layer.o.prepare(attended), h,
                                layer.post_attention_norm, layer.pre_mlp_norm)
            inner = gated_rows(self._act, layer.gate, layer.up, rows)
            if index < last:  # the next layer's input norm and its rows, in the same pass
                h, rows = _residual(layer.down, inner, h, layer.post_mlp_norm,
                                    self.layers[index + 1].input_norm)
                continue
            m = layer.down.apply(inner)
            if layer.post_mlp_norm is not None:
                m = layer.post_mlp_norm(m)
            h = h + m
        return self.final_norm(h)

    def _attention(self, index: int, layer: Layer, q: torch.Tensor, step: AttentionStep,
                   cache: SlotCache) -> torch.Tensor:
        """Attention output ``[T, heads * head_dim]`` of the step's tokens (see
        :mod:`dplang.models.attention`)."""
        tokens = q.shape[0]
        attend_tokens = kernels.lookup("attend_tokens", q)
        if attend_tokens is not None:  # the same bits, read straight from the slots
            out = attend_tokens(
                q, step.slots, step.positions, cache.keys[index], cache.key_scale[index],
                cache.values[index], cache.value_scale[index], layer.window, layer.scaling,
                layer.softcap, WEIGHT_LEVELS, MAX_POSITIONS)
            return out.reshape(tokens, self.num_heads * self.head_dim)
        q_int, q_scale = quantize_rows(q, TWO_LIMB_LEVELS)
        q_scale = q_scale[..., 0]
        out = q.new_zeros((tokens, self.num_heads, self.head_dim))
        kvh = self.kv_heads
        block = cache.block
        if step.decode_tokens.numel():
            slot_token = torch.full((cache.slots,), tokens, dtype=torch.int64, device=q.device)
            slot_token[step.decode_slots.to(q.device)] = step.decode_tokens.to(q.device)
            qs, qs_scale = gather_queries(q_int, q_scale, slot_token, kvh)
            visible = step.decode_visible(cache.capacity, layer.window, q.device)
            res = attend(qs.unsqueeze(2), qs_scale.unsqueeze(2), cache.keys[index],
                         cache.key_scale[index], cache.values[index], cache.value_scale[index],
                         visible.view(cache.slots, 1, 1, 1, -1), layer.scaling, layer.softcap,
                         block)
            picked = res[step.decode_slots.to(q.device), :, 0]  # [R, kvh, g, d]
            out[step.decode_tokens.to(q.device)] = picked.reshape(-1, self.num_heads,
                                                                  self.head_dim)
        if step.tiles:
            index_tokens = prompt_tiles(step.tiles, q.device)
            padded = torch.where(index_tokens >= 0, index_tokens, tokens)
            qt, qt_scale = gather_queries(q_int, q_scale, padded, kvh)  # [n, TILE, kvh, g, d]
            qt = qt.permute(0, 2, 1, 3, 4)
            qt_scale = qt_scale.permute(0, 2, 1, 3)
            width = max(t.start + t.count for t in step.tiles)
            width = -(-width // block) * block
            slots = torch.tensor([t.slot for t in step.tiles], device=q.device)
            keys = cache.keys[index][:, :, :width].index_select(0, slots)
            values = cache.values[index][:, :, :width].index_select(0, slots)
            k_scale = cache.key_scale[index][:, :, :width].index_select(0, slots)
            v_scale = cache.value_scale[index][:, :, :width].index_select(0, slots)
            visible = step.tile_visible(width, layer.window, q.device)
            res = attend(qt, qt_scale, keys, k_scale, values, v_scale,
                         visible.view(len(step.tiles), 1, TILE, 1, width), layer.scaling,
                         layer.softcap, block)
            res = res.permute(0, 2, 1, 3, 4).reshape(-1, self.num_heads, self.head_dim)
            valid = index_tokens.reshape(-1) >= 0
            out[index_tokens.reshape(-1)[valid]] = res[valid]
        return out.reshape(tokens, self.num_heads * self.head_dim)


def qkv_step(layer: Layer, rows: PreparedRows, heads: int, kv_heads: int, head_dim: int,
             cos: torch.Tensor, sin: torch.Tensor, rotate: bool, cache: SlotCache,
             index: int, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The queries ``[T, heads, head_dim]`` of a layer for prepared rows, its keys and values
    written to ``cache`` (layer ``index``, at ``slots``/``positions``) first: the q/k/v
    product, each query and key head normed (Gemma 3's ``q_norm``/``k_norm``) and rotated
    (:func:`rotary`), then :meth:`SlotCache.write`.

    That composition is the definition; on a CPU with the fused kernels everything after the
    integer product is one compiled loop per token (``qkv_heads``), the same operations in
    the same order: the same bits and the same stored integers.

    Privacy contract: token ``t``'s queries, and what is written at its slot and position,
    are functions of row ``t`` of ``rows`` and its position only."""
    qkv = layer.qkv
    tokens = rows.count
    fused = kernels.lookup("qkv_heads", rows.limbs) if qkv.layout == "kn" else None
    if fused is not None and tokens and cache.keys[index].dtype == torch.int16:
        shift = float(exact.LIMB) if qkv.weight_bits == 16 else 1.0
        return fused(qkv.integer_parts(rows), rows.scale, qkv.col_scale, qkv.bias,
                     shift * exact.LIMB, shift, heads, head_dim,
                     None if layer.q_norm is None else (layer.q_norm.weight, layer.q_norm.eps),
                     None if layer.k_norm is None else (layer.k_norm.weight, layer.k_norm.eps),
                     cos, sin, rotate, slots, positions, cache.keys[index],
                     cache.values[index], cache.key_scale[index], cache.value_scale[index],
                     key_levels(head_dim), value_levels(cache.block))
    out = qkv.apply(rows)
    nq, nk = heads * head_dim, kv_heads * head_dim
    q = out[:, :nq].reshape(tokens, heads, head_dim)
    k = out[:, nq:nq + nk].reshape(tokens, kv_heads, head_dim)
    v = out[:, nq + nk:].reshape(tokens, kv_heads, head_dim)
    if layer.q_norm is not None:
        q = layer.q_norm(q)
    if layer.k_norm is not None:
        k = layer.k_norm(k)
    q = rotary(q, cos, sin, rotate)
    k = rotary(k, cos, sin, rotate)
    cache.write(index, slots, positions, k, v)
    return q


def _residual(linear: IntegerLinear, rows: PreparedRows, h: torch.Tensor, post: Norm | None,
              norm: Norm) -> tuple[torch.Tensor, PreparedRows]:
    """:func:`~dplang.models.exact.residual_rows` with a layer's norms: ``h + post(linear(rows))``
    and the rows of ``norm`` of it, prepared for the next linear."""
    return residual_rows(linear, rows, h, None if post is None else post.weight,
                         0.0 if post is None else post.eps, norm.weight, norm.eps)


def logits_postprocess(logits: torch.Tensor, multiplier: float, softcap: float | None
                       ) -> torch.Tensor:
    """The architecture's logit scaling and soft cap, with basic operations only."""
    if multiplier != 1.0:
        logits = logits * multiplier
    if softcap is not None:
        logits = exact.tanh(logits * (1.0 / softcap)) * softcap
    return logits


"""Fused CPU kernels for the exact arithmetic (numba; optional, same bits as without it).

The definitions of the model's arithmetic are the torch functions of :mod:`dplang.models.exact`
and :mod:`dplang.models.attention`. Each of them is a chain of elementwise passes; on a CPU
with two cores a decode step spends most of its time starting those passes. This module runs
the same chains as one compiled loop per row: the same IEEE operations on float32 (or float64
where the definition uses it), in the same order, with the same constants rounded the same
way, so every element gets the same bits as from the torch definition (the tests compare them
bit for bit on random and extreme inputs). Loops never mix rows: each row is computed from
its own values by the same code, in parallel over rows.

Privacy contract: as for the torch definitions (row ``i`` of every output is a function of row
``i`` of the inputs only); nothing here depends on the number of rows or the thread count.

numba compiles the loops at first use (cached under dplang's cache folder). Without numba, or
on another device, :func:`available` is false and the torch definitions run.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

#: Largest magnitude of a two-limb integer (as dplang.models.exact.TWO_LIMB_LEVELS).
TWO_LIMB = 127 * 256

__all__ = [
    "attend_tokens",
    "attention_output",
    "available",
    "combine",
    "compile_expected",
    "gated_limbs",
    "gathered_head",
    "gelu_tanh_mul",
    "hadamard",
    "low_limb_range",
    "qkv_heads",
    "quantize_limbs",
    "record_compiled",
    "residual_limbs",
    "rms_norm",
    "rotary",
    "silu_mul",
    "softmax_counts",
    "top_superset",
    "topk_plus",
    "topk_plus_rows",
    "write_kv",
]

_NUMBA: Any = None


def _numba_cache_dir() -> str:
    """Where numba keeps the compiled kernels: ``NUMBA_CACHE_DIR`` as set, else dplang's cache
    folder's ``numba/`` (set as ``NUMBA_CACHE_DIR`` when numba is first imported here). numba
    reads the variable once, at its import: where the program imported numba before dplang
    did, the folder numba chose then (``""``: beside the kernels' source)."""
    numba = sys.modules.get("numba")
    if numba is not None:
        config = getattr(getattr(numba, "core", None), "config", None)
        chosen = getattr(config, "CACHE_DIR", None)
        if isinstance(chosen, str):
            return chosen
    from dplang.models.cache import cache_dir

    return os.environ.get("NUMBA_CACHE_DIR", str(cache_dir() / "numba"))


def _load() -> Any:
    global _NUMBA
    if _NUMBA is None:
        if os.environ.get("DPLANG_NO_KERNELS", "") not in ("", "0"):
            _NUMBA = False
            return _NUMBA
        try:
            os.environ.setdefault("NUMBA_CACHE_DIR", _numba_cache_dir())
            import numba
        except ImportError:
            _NUMBA = False
        else:
            _NUMBA = numba
    return _NUMBA


_DISABLED = False


def disable() -> None:
    """Use the torch definitions from now on in this process, on every device (the load-time
    check's fallback if a kernel ever gave row-dependent results)."""
    global _NUMBA, _DISABLED
    _NUMBA = False
    _DISABLED = True


def enabled() -> bool:
    """Whether fused kernels may run in this process at all (not :func:`disable`-d, and
    ``DPLANG_NO_KERNELS`` unset)."""
    return not _DISABLED and os.environ.get("DPLANG_NO_KERNELS", "") in ("", "0")


def _compiled_record() -> Path:
    """The record of a run that compiled this copy of the kernels into numba's cache on this
    machine, keyed as numba keys its cache (the source file's path, size and modification
    time), the numba version, the CPU and the cache folder."""
    from dplang.models import records
    from dplang.models.cache import cache_dir

    source = Path(__file__).with_name("_numba_kernels.py")
    key = json.dumps({"source": records.file_stamps([source]),
                      "numba": records.package_versions().get("numba", "absent"),
                      "python": list(sys.version_info[:2]),  # numba's cache files are per
                      "cpu": records.cpu_identity(),  # interpreter version
                      "cache": _numba_cache_dir()},
                     sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return cache_dir() / "kernels" / f"compiled-{digest}.json"


def compile_expected() -> bool:
    """Whether a model loaded in this process will first compile the fused kernels for this
    machine (about a minute on 2 cores, once per install): they may run (not :func:`disable`-d,
    ``DPLANG_NO_KERNELS`` unset), numba is installed, and no earlier run recorded
    (:func:`record_compiled`) that it compiled this copy of them here. It decides a message
    only: the kernels give the same bits compiled or read from numba's cache."""
    if not enabled() or importlib.util.find_spec("numba") is None:
        return False
    try:
        return not _compiled_record().is_file()
    except OSError:  # a cache folder this user may not search: no note (a message only)
        return False


def record_compiled() -> None:
    """Record that this copy of the kernels has been compiled on this machine (after a load
    that ran them). The record holds no data; a read-only cache keeps no record."""
    from dplang.models import records

    try:
        path = _compiled_record()
        if path.is_file():
            return
    except OSError:
        return
    records.write_json(path.parent, path, {"compiled": True})


def available(tensor: torch.Tensor) -> bool:
    """Whether the fused kernels run for ``tensor`` (a CPU tensor, numba installed, and
    ``DPLANG_NO_KERNELS`` unset)."""
    return tensor.device.type == "cpu" and bool(_load())


_KERNELS: dict[str, Any] = {}


class _Kernels:
    """The compiled loops by name, each loaded (from numba's disk cache, or compiled) on its
    first use only: a worker process that needs one kernel does not wait for all of them."""

    def __getitem__(self, name: str) -> Any:
        kernel = _KERNELS.get(name)
        if kernel is None:
            numba = _load()
            from dplang.models import _numba_kernels as compiled

            if not _KERNELS:
                numba.set_num_threads(max(1, min(torch.get_num_threads(),
                                                 numba.config.NUMBA_NUM_THREADS)))
            kernel = _KERNELS[name] = getattr(compiled, name)
        return kernel


def _kernels() -> _Kernels:
    return _Kernels()


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


def set_threads(threads: int) -> None:
    """Use ``threads`` threads in the kernels (changes speed only)."""
    numba = _load()
    if numba:
        numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))


def quantize_limbs(x: torch.Tensor, levels: int, dtype: torch.dtype = torch.int8
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(limbs [2M, K], scale [M, 1])`` of float32 ``x [M, K]``: the rows of
    :func:`~dplang.models.exact.quantize_rows` split by
    :func:`~dplang.models.exact.split_limbs`, high limbs first, as ``dtype`` (int8, or int16
    for attention's kernel): the same integers either way."""
    if dtype not in (torch.int8, torch.int16):
        raise ValueError(f"limbs are int8 or int16, not {dtype}")
    x = x.contiguous()
    rows, width = x.shape
    limbs = torch.empty((2 * rows, width), dtype=dtype)
    scale = torch.empty((rows, 1), dtype=torch.float32)
    _kernels()["quantize_limbs"](_np(x), levels, _np(limbs), _np(scale)[:, 0])
    return limbs, scale


def quantize(x: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~dplang.models.exact.quantize_rows` of float32 ``x [..., K]``."""
    shape = x.shape
    flat = x.reshape(-1, shape[-1]).contiguous()
    q = torch.empty_like(flat)
    scale = torch.empty((flat.shape[0], 1), dtype=torch.float32)
    _kernels()["quantize"](_np(flat), levels, _np(q), _np(scale)[:, 0])
    return q.view(shape), scale.view(*shape[:-1], 1)


def combine(high: torch.Tensor, low: torch.Tensor, low2: torch.Tensor | None,
            row_scale: torch.Tensor, col_scale: torch.Tensor, bias: torch.Tensor | None,
            high_shift: float, low_shift: float, transposed: bool = False) -> torch.Tensor:
    """:meth:`IntegerLinear.combine` with ``low + low2``; ``transposed``: ``high``/``low``
    are ``[N, M]`` (the weight was the left operand) and the result is ``[M, N]``."""
    rows = high.shape[1] if transposed else high.shape[0]
    cols = high.shape[0] if transposed else high.shape[1]
    out = torch.empty((rows, cols), dtype=torch.float32)
    name = "combine_cols" if transposed else "combine"
    _kernels()[name](_np(high), _np(low), _or_empty(low2, torch.int32),
                     _np(row_scale.reshape(-1).contiguous()), _np(col_scale.contiguous()),
                     _or_empty(None if bias is None else bias.contiguous(), torch.float32),
                     np.float32(high_shift), np.float32(low_shift), _np(out))
    return out


def _headroom(terms: int) -> int:
    """The fixed-point sum's headroom for ``terms`` terms (as
    :func:`~dplang.models.exact.fixed_point_sum` computes it)."""
    return 52 - max(1, math.ceil(math.log2(terms)))


def _or_empty(t: torch.Tensor | None, dtype: torch.dtype) -> np.ndarray:
    """``t`` as an array, or an empty one of ``dtype`` for "none" (the kernels test sizes)."""
    if t is None:
        return _np(torch.empty((0,) * (1 if dtype == torch.float32 else 2), dtype=dtype))
    return _np(t)


def residual_limbs(high: torch.Tensor, low: torch.Tensor, low2: torch.Tensor | None,
                   row_scale: torch.Tensor, col_scale: torch.Tensor,
                   bias: torch.Tensor | None, high_shift: float, low_shift: float,
                   h: torch.Tensor, post_weight: torch.Tensor | None, post_eps: float,
                   norm_weight: torch.Tensor, norm_eps: float, levels: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`~dplang.models.exact.residual_rows` from a "kn" linear's integer parts
    ``[M, N]``: ``(h_out [M, N], limbs [2M, N], scale [M, 1])``."""
    rows, cols = h.shape
    h = h.contiguous()
    h_out = torch.empty((rows, cols), dtype=torch.float32)
    work = torch.empty((rows, cols), dtype=torch.float32)
    limbs = torch.empty((2 * rows, cols), dtype=torch.int8)
    scale = torch.empty((rows, 1), dtype=torch.float32)
    _kernels()["residual_limbs"](
        _np(high), _np(low), _or_empty(low2, torch.int32),
        _np(row_scale.reshape(-1).contiguous()), _np(col_scale.contiguous()),
        _or_empty(None if bias is None else bias.contiguous(), torch.float32),
        np.float32(high_shift), np.float32(low_shift),
        _or_empty(None if post_weight is None else post_weight.contiguous(), torch.float32),
        float(post_eps), _np(h), _np(norm_weight.contiguous()), float(norm_eps),
        _headroom(cols), levels, _np(h_out), _np(work), _np(limbs), _np(scale)[:, 0])
    return h_out, limbs, scale


def gated_limbs(kind: str, gate_parts: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
                up_parts: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
                row_scale: torch.Tensor, gate_col: torch.Tensor, gate_bias: torch.Tensor | None,
                up_col: torch.Tensor, up_bias: torch.Tensor | None, high_shift: float,
                low_shift: float, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~dplang.models.exact.gated_rows` from the integer parts ``[M, N]`` of the gate
    and up linears ("kn", the same prepared rows): ``(limbs [2M, N], scale [M, 1])``;
    ``kind`` is ``"gelu_tanh"`` or ``"silu"``."""
    if kind not in ("gelu_tanh", "silu"):
        raise ValueError(f"no fused gated kernel for {kind!r}")
    g_high, g_low, g_low2 = gate_parts
    u_high, u_low, u_low2 = up_parts
    if (g_low2 is None) != (u_low2 is None):
        raise ValueError("gate and up weights of different widths")
    rows, cols = g_high.shape
    work = torch.empty((rows, cols), dtype=torch.float32)
    limbs = torch.empty((2 * rows, cols), dtype=torch.int8)
    scale = torch.empty((rows, 1), dtype=torch.float32)
    _kernels()["gated_limbs"](
        _np(g_high), _np(g_low), _or_empty(g_low2, torch.int32), _np(u_high), _np(u_low),
        _or_empty(u_low2, torch.int32), _np(row_scale.reshape(-1).contiguous()),
        _np(gate_col.contiguous()),
        _or_empty(None if gate_bias is None else gate_bias.contiguous(), torch.float32),
        _np(up_col.contiguous()),
        _or_empty(None if up_bias is None else up_bias.contiguous(), torch.float32),
        np.float32(high_shift), np.float32(low_shift), kind == "silu", levels, _np(work),
        _np(limbs), _np(scale)[:, 0])
    return limbs, scale


def qkv_heads(parts: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
              row_scale: torch.Tensor, col_scale: torch.Tensor, bias: torch.Tensor | None,
              high_shift: float, low_shift: float, heads: int, head_dim: int,
              q_norm: tuple[torch.Tensor, float] | None,
              k_norm: tuple[torch.Tensor, float] | None, cos: torch.Tensor,
              sin: torch.Tensor, rotate: bool, slots: torch.Tensor, positions: torch.Tensor,
              k_store: torch.Tensor, v_store: torch.Tensor, ks_store: torch.Tensor,
              vs_store: torch.Tensor, k_levels: int, v_levels: int) -> torch.Tensor:
    """:func:`~dplang.models.decoder.qkv_step` from the q/k/v linear's integer parts
    ``[T, N]`` ("kn"): the rotated queries ``[T, heads, head_dim]``; the keys and values
    are written into the stores (``[S, kvh, C, d]``, scales ``[S, kvh, C]``) in place."""
    high, low, low2 = parts
    tokens, cols = high.shape
    work = torch.empty((tokens, cols + head_dim), dtype=torch.float32)
    q = torch.empty((tokens, heads, head_dim), dtype=torch.float32)
    _kernels()["qkv_heads"](
        _np(high), _np(low), _or_empty(low2, torch.int32),
        _np(row_scale.reshape(-1).contiguous()), _np(col_scale.contiguous()),
        _or_empty(None if bias is None else bias.contiguous(), torch.float32),
        np.float32(high_shift), np.float32(low_shift),
        _or_empty(None if q_norm is None else q_norm[0].contiguous(), torch.float32),
        float(q_norm[1]) if q_norm is not None else 0.0,
        _or_empty(None if k_norm is None else k_norm[0].contiguous(), torch.float32),
        float(k_norm[1]) if k_norm is not None else 0.0, _headroom(head_dim),
        _np(cos.contiguous()), _np(sin.contiguous()), bool(rotate),
        _np(slots.to(torch.int64).contiguous()), _np(positions.to(torch.int64).contiguous()),
        _np(k_store), _np(v_store), _np(ks_store), _np(vs_store), k_levels, v_levels,
        _np(work), _np(q))
    return q


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`~dplang.models.exact.rms_norm` (float32, last dimension)."""
    shape = x.shape
    flat = x.reshape(-1, shape[-1]).contiguous()
    out = torch.empty_like(flat)
    headroom = _headroom(shape[-1])
    _kernels()["rms_norm"](_np(flat), _np(weight.contiguous()), float(eps), headroom,
                           _np(out))
    return out.view(shape)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotate: bool
           ) -> torch.Tensor:
    """:func:`~dplang.models.decoder.rotary` of float32 ``x [T, H, d]`` (any strides) with
    ``cos``/``sin [T, d]``: the rotation of every head and, with ``rotate``, its Hadamard
    transform, in one pass (a new contiguous tensor)."""
    out = torch.empty(x.shape, dtype=torch.float32)
    _kernels()["rotary_heads"](_np(x), _np(cos.contiguous()), _np(sin.contiguous()),
                               bool(rotate), _np(out))
    return out


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """:func:`~dplang.models.exact.hadamard` of float32 ``x`` (last dimension a power of two):
    the same butterflies in the same order, one row per loop."""
    shape = x.shape
    y = x.reshape(-1, shape[-1]).clone(memory_format=torch.contiguous_format)
    _kernels()["hadamard_rows"](_np(y))
    return y.view(shape)


def _gated(name: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    gate, up = gate.contiguous(), up.contiguous()
    out = torch.empty_like(gate)
    _kernels()[name](_np(gate.view(gate.shape[0], -1)), _np(up.view(up.shape[0], -1)),
                     _np(out.view(out.shape[0], -1)))
    return out


def gelu_tanh_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``exact.gelu_tanh(gate) * up``."""
    return _gated("gelu_tanh_mul", gate, up)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``exact.silu(gate) * up``."""
    return _gated("silu_mul", gate, up)


def softmax_counts(both: torch.Tensor, q_scale: torch.Tensor, key_scale: torch.Tensor,
                   value_scale: torch.Tensor, visible: torch.Tensor, scaling: float,
                   softcap: float | None, levels: int, max_terms: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The middle of :func:`~dplang.models.attention.attend`: from the exact two-limb scores
    ``both [B, 2R, L]`` to ``(counts [B, R, L], largest [B, R], denominator [B, R])``."""
    batch, rows2, length = both.shape
    rows = rows2 // 2
    counts = torch.empty((batch, rows, length), dtype=torch.float32)
    largest = torch.empty((batch, rows), dtype=torch.float32)
    denominator = torch.empty((batch, rows), dtype=torch.float64)
    headroom = _headroom(max_terms)
    cap = float(softcap) if softcap else 0.0
    _kernels()["softmax_counts"](
        _np(both.contiguous()), _np(q_scale.contiguous()), _np(key_scale.contiguous()),
        _np(value_scale.contiguous()), _np(visible.contiguous()), np.float32(scaling),
        np.float32(cap), np.float32(1.0 / cap) if cap else np.float32(0.0),
        np.float32(levels), headroom, _np(counts), _np(largest), _np(denominator))
    return counts, largest, denominator


#: Largest attention weight count the compiled value sums take (a count times a stored value,
#: at most 2**15 - 1, fits in int32 with room for a chunk of positions).
_MAX_COUNT = 2**15


def _value_chunk(levels: int) -> int:
    """Positions per int32 value sum of :func:`attend_tokens`: a count is at most
    ``levels + 1`` (rounded), a stored value at most 2**15 - 1 in magnitude, so ``chunk``
    such products sum to less than 2**31."""
    return max(1, (2**31 - 1) // ((int(levels) + 1) * (2**15 - 1)))


def attend_tokens(q: torch.Tensor, q_slot: torch.Tensor, q_pos: torch.Tensor,
                  keys: torch.Tensor, key_scale: torch.Tensor, values: torch.Tensor,
                  value_scale: torch.Tensor, window: int | None, scaling: float,
                  softcap: float | None, levels: int, max_terms: int) -> torch.Tensor:
    """The whole of :func:`~dplang.models.attention.attend` for every token of a step, read
    straight from the slot store: token ``t`` (float32 ``q [T, H, d]`` before rounding) sees
    positions ``q_pos[t] - window + 1 .. q_pos[t]`` of slot ``q_slot[t]``. Every sum is an exact
    integer (computed in int32 or float64 here, in float32 blocks by ``attend``), and every
    other operation is the same as ``attend``'s: the same bits."""
    if not 0 < levels <= _MAX_COUNT:
        raise ValueError(f"attention weight levels {levels} outside 1..{_MAX_COUNT}")
    tokens, heads, dim = q.shape
    limbs, scale = quantize_limbs(q.reshape(tokens * heads, dim), TWO_LIMB, dtype=torch.int16)
    q_hi = limbs[: tokens * heads].view(tokens, heads, dim)
    q_lo = limbs[tokens * heads:].view(tokens, heads, dim)
    out = torch.empty((tokens, heads, dim), dtype=torch.float32)
    cap = float(softcap) if softcap else 0.0
    headroom = _headroom(max_terms)
    _kernels()["attend_tokens"](
        _np(q_hi), _np(q_lo), _np(scale.view(tokens, heads)), _np(q_slot.contiguous()),
        _np(q_pos.contiguous()), _np(keys), _np(key_scale), _np(values), _np(value_scale),
        int(window or 0), np.float32(scaling), np.float32(cap),
        np.float32(1.0 / cap) if cap else np.float32(0.0), np.float32(levels), headroom,
        _value_chunk(levels) if values.dtype == torch.int16 else 0, _np(out))
    return out


def attention_output(total: torch.Tensor, largest: torch.Tensor, denominator: torch.Tensor,
                     levels: int) -> torch.Tensor:
    """The end of :func:`~dplang.models.attention.attend`: ``total [R, d]`` (float64
    integers) times ``largest / levels`` over ``denominator`` (``[R]`` each), as float32."""
    out = torch.empty(total.shape, dtype=torch.float32)
    _kernels()["attention_output"](_np(total.contiguous()), _np(largest.contiguous()),
                                   _np(denominator.contiguous()), float(levels), _np(out))
    return out


def write_kv(keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
             positions: torch.Tensor, k_store: torch.Tensor, v_store: torch.Tensor,
             ks_store: torch.Tensor, vs_store: torch.Tensor, k_levels: int,
             v_levels: int) -> None:
    """:meth:`~dplang.models.attention.SlotCache.write` of one layer: ``keys``/``values``
    ``[T, kvh, d]`` rounded per (token, head) and stored in place at ``(slots[t], head,
    positions[t])`` of the ``[S, kvh, C, d]`` stores and ``[S, kvh, C]`` scales."""
    _kernels()["write_kv"](_np(keys.contiguous()), _np(values.contiguous()),
                           _np(slots.to(torch.int64).contiguous()),
                           _np(positions.to(torch.int64).contiguous()), _np(k_store),
                           _np(v_store), _np(ks_store), _np(vs_store), k_levels, v_levels)


def topk_plus(public: torch.Tensor, k: int, clip_norm: float, batch_size: int
              ) -> torch.Tensor:
    """:meth:`~dplang.textgen.methods.invisibleink.InvisibleInkPolicy.candidates`' V_k^+ of
    float32 public logits ``[V]``: ascending int64 ids (possibly none); :func:`topk_plus_rows`
    of the one row."""
    ids, sizes = topk_plus_rows(public[None], k, clip_norm, batch_size)
    return ids[0, : int(sizes[0])]


def topk_plus_rows(public: torch.Tensor, k: int, clip_norm: float, batch_size: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`topk_plus` of every row of float32 ``public [G, V]`` at once (in parallel over
    rows): ``(ids [G, W], sizes [G])``, each row's ascending ids padded by its first id (0 for
    an empty row), W the largest size (at least 1)."""
    values = public.detach().float().contiguous()
    with np.errstate(over="ignore"):  # a margin beyond float32 is +inf, as in torch
        margin = np.float32(2.0 * clip_norm / batch_size)  # as torch rounds the scalar
    ids, sizes = _kernels()["topk_plus_rows"](_np(values), int(k), margin)
    return torch.from_numpy(ids), torch.from_numpy(sizes)


def gathered_head(limbs: torch.Tensor, row_scale: torch.Tensor, w_hi: torch.Tensor,
                  w_lo: torch.Tensor | None, ids: torch.Tensor, col_scale: torch.Tensor,
                  bias: torch.Tensor | None, high_shift: float, low_shift: float
                  ) -> torch.Tensor:
    """:meth:`~dplang.models.exact.IntegerLinear.gathered`'s outputs ``[M, W]`` of prepared
    rows (``limbs`` int8 ``[2M, K]``) on their own columns ``ids [M, W]`` of "nk" weights."""
    if limbs.shape[1] >= 2**17:  # int8 x int8 products summed in int32 (_numba_kernels)
        raise ValueError(f"gathered head: width {limbs.shape[1]} too large for int32 sums")
    rows, width = ids.shape
    out = torch.empty((rows, width), dtype=torch.float32)
    empty_w = torch.empty((0, 0), dtype=torch.int8)
    empty_f = torch.empty(0, dtype=torch.float32)
    _kernels()["gathered_head"](
        _np(limbs.contiguous()), rows, _np(w_hi.contiguous()),
        _np(w_lo.contiguous()) if w_lo is not None else _np(empty_w),
        _np(ids.to(torch.int64).contiguous()), _np(row_scale.reshape(-1).contiguous()),
        _np(col_scale.contiguous()), _np(bias.contiguous()) if bias is not None else _np(empty_f),
        np.float32(high_shift), np.float32(low_shift), _np(out))
    return out


def weight_products(weights: torch.Tensor, limbs: torch.Tensor) -> torch.Tensor:
    """``weights @ limbs.T`` as exact int32 ``[C, R]`` for int8 ``weights [C, K]`` and int8
    ``limbs [R, K]``: the integers of :func:`~dplang.models.exact.exact_products` (every sum
    is exact in int32 in any order, so the same integers), reading the int8 weights once
    instead of a float32 copy of them."""
    if limbs.shape[1] >= 2**17:  # int8 x int8 products summed in int32 (_numba_kernels)
        raise ValueError(f"weight products: width {limbs.shape[1]} too large for int32 sums")
    if weights.dtype != torch.int8 or limbs.dtype != torch.int8:
        raise ValueError("weight products take int8 weights and limbs")
    out = torch.empty((weights.shape[0], limbs.shape[0]), dtype=torch.int32)
    _kernels()["weight_products"](_np(weights.contiguous()), _np(limbs.contiguous()), _np(out))
    return out


def low_limb_range(high_limbs: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """``(least, most)`` int64 ``[M]``: the range of ``sum_k w_k h_k`` over every int8 weight
    vector ``w``, for each row ``h`` of ``high_limbs [M, K]`` (int8): ``w_k h_k`` is at most
    ``127 h_k`` (``h_k > 0``) or ``128 |h_k|`` (``h_k < 0``) and at least ``-128 h_k`` or
    ``-127 |h_k|``; both ends are reached (by ``w = 127 sign(h)`` with -128 for negative
    ``h_k``, and its opposite)."""
    x_hi = high_limbs.to(torch.int64)
    positive = x_hi.clamp(min=0).sum(dim=1)
    negative = (-x_hi).clamp(min=0).sum(dim=1)
    return ((-(128 * positive + 127 * negative)).numpy(),
            (127 * positive + 128 * negative).numpy())


def top_superset(limbs: torch.Tensor, row_scale: torch.Tensor,
                 products: Callable[[int, int], torch.Tensor], w_lo: torch.Tensor,
                 columns: int, chunk: int, col_scale: torch.Tensor,
                 bias: torch.Tensor | None, high_shift: float, low_shift: float, top_k: int,
                 margin: float, banned: torch.Tensor | None, most: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The set of :meth:`~dplang.models.exact.IntegerLinear.top_superset` and its exact
    logits: ``(ids [M, W], sizes [M], logits [M, W])`` for prepared rows (``limbs`` int8
    ``[2M, K]``: high limbs, then low; ``row_scale [M, 1]``) of "nk" 16-bit weights whose
    low limbs are ``w_lo``, given ``products(start, stop)``: the exact int32 products ``[stop -
    start, 2M]`` of the high-limb weights of those columns with the rows' high, then low,
    limbs. Ids ascending, padded by the row's first id (and its logit). ``None`` where a
    bound is not finite or some row's bound set has more than ``most`` columns.

    Two passes: bounds on every logit, chunk by chunk, keeping the candidates whose upper
    bound reaches ``f32(L_k - margin)`` (``L_k`` the k-th largest lower bound) with their two
    known integers; then the exact logits of the candidates (one int8 dot product each, the
    low-limb weights') by decreasing upper bound until the rest cannot reach ``f32(e -
    margin)`` (``e`` the k-th largest exact logit so far): ``head_bounds`` and
    ``superset_logits`` in :mod:`dplang.models._numba_kernels` say why that holds every token
    the rule needs."""
    rows = limbs.shape[0] // 2
    high_limbs = limbs[:rows]
    low_min, low_max = low_limb_range(high_limbs)
    scale = _np(row_scale.reshape(-1).float().contiguous())
    with np.errstate(over="ignore", invalid="ignore"):
        a = scale * np.float32(high_shift)  # as gathered_head and combine compute them
        b = scale * np.float32(low_shift)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return None
    heaps = np.empty((rows, top_k), dtype=np.float32)
    sizes = np.zeros(rows, dtype=np.int64)
    finite = np.ones(rows, dtype=np.bool_)
    blocked = (_np(banned.to(torch.bool).contiguous()) if banned is not None
               else np.zeros(0, dtype=np.bool_))
    cols = _np(col_scale.contiguous())
    bias_np = _np(bias.contiguous()) if bias is not None else np.zeros(0, dtype=np.float32)
    capacity = most + chunk  # room for one chunk beside a full set (pages touched as used)
    cand_ids = np.empty((rows, capacity), dtype=np.int64)
    cand_upper = np.empty((rows, capacity), dtype=np.float32)
    cand_hh = np.empty((rows, capacity), dtype=np.int32)
    cand_hl = np.empty((rows, capacity), dtype=np.int32)
    counts = np.zeros(rows, dtype=np.int64)
    kernels = _kernels()
    m32 = np.float32(margin)
    for start in range(0, columns, chunk):
        part = products(start, min(columns, start + chunk)).contiguous()
        kernels["head_bounds"](_np(part), rows, low_min, low_max, a, b, cols, bias_np, start,
                               blocked, m32, heaps, sizes, finite, cand_ids, cand_upper,
                               cand_hh, cand_hl, counts)
    if not finite.all() or (sizes < top_k).any() or (counts < 0).any():
        return None
    with np.errstate(over="ignore"):
        thresholds = heaps[:, 0] - m32  # float32, as topk_plus_rows
    if max(int((cand_upper[g, :counts[g]] >= thresholds[g]).sum()) for g in range(rows)) > most:
        return None
    out_ids = np.empty((rows, max(1, int(counts.max()))), dtype=np.int64)
    out_logits = np.empty(out_ids.shape, dtype=np.float32)
    out_counts = np.zeros(rows, dtype=np.int64)
    kernels["superset_logits"](
        cand_ids, cand_upper, cand_hh, cand_hl, counts, thresholds, _np(limbs.contiguous()),
        rows, _np(w_lo.contiguous()), a, b, cols, bias_np, top_k, m32, out_ids, out_logits,
        out_counts)
    width = max(1, int(out_counts.max()))
    pad = np.arange(width)[None, :] >= out_counts[:, None]
    out_ids = np.where(pad, out_ids[:, :1], out_ids[:, :width])
    out_logits = np.where(pad, out_logits[:, :1], out_logits[:, :width])
    return (torch.from_numpy(np.ascontiguousarray(out_ids)), torch.from_numpy(out_counts),
            torch.from_numpy(np.ascontiguousarray(out_logits)))

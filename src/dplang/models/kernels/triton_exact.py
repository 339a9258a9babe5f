"""Triton kernels of the exact operations (privacy-critical): the same integers and bits as the
torch definitions in :mod:`dplang.models.exact`, one kernel per operation instead of many.

Each kernel computes, for each element, the same sequence of IEEE operations as its torch
definition (docs/privacy.md, "the argument per operation"), with two precautions a GPU
compiler would otherwise undo:

* **no fused multiply-add**: every launch passes ``enable_fp_fusion=False``, so ``a * b + c``
  is a rounded product then a rounded sum, as in torch (a contraction would round once);
* **correctly rounded division and square root**: ``tl.math.div_rn`` in float32 (Triton's
  ``/`` on float32 may be an approximate division on a GPU); float64 ``/`` and ``sqrt`` are
  correctly rounded on every target;
* **round half to even** (``torch.round``) as ``(|v| + 1.5·2^23) − 1.5·2^23`` in float32 with
  the sign put back bit for bit (exact for |v| ≤ 2^22, which every rounded value here is: at
  most 32,512.5), or with 1.5·2^52 in float64 for non-negative values, never a library rint.

Integer products are ``tl.dot`` of int8 limbs with int32 accumulation: exact whatever the
tiling or the order, as the torch definitions' sums are. Every kernel works on rows
independently: row ``i`` of an output is a function of row ``i`` of the inputs only.

The kernels run on CUDA tensors, and on CPU tensors under Triton's interpreter
(``TRITON_INTERPRET=1``), where ``tests/models/test_triton_kernels.py`` compares each with its
torch definition bit for bit.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

__all__ = ["attend_tokens", "gathered_head", "gelu_tanh_mul", "linear", "quantize",
           "quantize_limbs", "rms_norm", "silu_mul"]

#: Launch options of every kernel (see the module docstring).
_LAUNCH = {"enable_fp_fusion": False}
#: Largest magnitude of a two-limb integer (as dplang.models.exact.TWO_LIMB_LEVELS; this
#: module imports nothing of dplang, so that the dispatch table can load it).
TWO_LIMB = 127 * 256
_MAGIC32 = 12582912.0  # 1.5 * 2**23
_MAGIC64 = 6755399441055744.0  # 1.5 * 2**52
_TINY32 = float(torch.finfo(torch.float32).tiny)
_LOG2E = 1.4426950408889634
_LN2_HI = 0.693359375
_LN2_LO = -2.12194440e-4
_GELU_2C = 2.0 * math.sqrt(2.0 / math.pi)


def _block(n: int) -> int:
    return max(16, triton.next_power_of_2(int(n)))


# ------------------------------------------------------------------ rows rounded to integers


@triton.jit
def _round_even(v):
    """``torch.round`` of float32 ``v`` (|v| <= 2**22): round half to even by the addition of
    1.5·2^23 to |v|, the sign (of a zero too: round(-0.3) is -0.0) put back bit for bit."""
    mag = (tl.abs(v) + 12582912.0) - 12582912.0
    sign = v.to(tl.int32, bitcast=True) & -2147483648
    return (mag.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def _quantize_kernel(x_ptr, out_ptr, scale_ptr, rows, levels, K: tl.constexpr,
                     BLOCK_K: tl.constexpr, LIMBS: tl.constexpr):
    """One row per program: ``q = round(x / scale)``, ``scale = max|x| / levels`` (a row whose
    scale is not a positive normal float: zeros, scale 1); with ``LIMBS`` the int8 limbs
    ``hi = floor((q + 128) / 256)``, ``lo = q - 256 hi`` at rows ``r`` and ``rows + r``."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_K)
    mask = cols < K
    x = tl.load(x_ptr + row * K + cols, mask=mask, other=0.0)
    amax = tl.max(tl.abs(x), axis=0)
    nans = tl.sum((x != x).to(tl.int32), axis=0)  # torch's amax propagates a NaN
    scale = tl.math.div_rn(amax, levels)
    usable = (scale >= 1.1754943508222875e-38) & (scale <= 3.4028234663852886e38) & (nans == 0)
    scale = tl.where(usable, scale, 1.0)
    q = _round_even(tl.math.div_rn(x, scale))
    q = tl.where(usable, q, 0.0)
    tl.store(scale_ptr + row, scale)
    if LIMBS:
        qi = q.to(tl.int32)
        hi = (qi + 128) >> 8
        lo = qi - hi * 256
        tl.store(out_ptr + row * K + cols, hi.to(tl.int8), mask=mask)
        tl.store(out_ptr + (rows + row) * K + cols, lo.to(tl.int8), mask=mask)
    else:
        tl.store(out_ptr + row * K + cols, q, mask=mask)


def quantize(x: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~dplang.models.exact.quantize_rows` of float32 ``x [..., K]``."""
    shape = x.shape
    flat = x.reshape(-1, shape[-1]).contiguous().float()
    rows, k = flat.shape
    q = torch.empty_like(flat)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    if rows:
        _quantize_kernel[(rows,)](flat, q, scale, rows, float(levels), K=k,
                                  BLOCK_K=_block(k), LIMBS=False, **_LAUNCH)
    return q.view(shape), scale.view(*shape[:-1], 1)


def quantize_limbs(x: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(limbs int8 [2M, K], scale [M, 1])`` of float32 ``x [M, K]``: the rows of
    :func:`~dplang.models.exact.quantize_rows` split by
    :func:`~dplang.models.exact.split_limbs`, high limbs first."""
    x = x.contiguous().float()
    rows, k = x.shape
    limbs = torch.empty((2 * rows, k), dtype=torch.int8, device=x.device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    if rows:
        _quantize_kernel[(rows,)](x, limbs, scale, rows, float(levels), K=k,
                                  BLOCK_K=_block(k), LIMBS=True, **_LAUNCH)
    return limbs, scale


# ------------------------------------------------------------------------ integer products


@triton.jit
def _linear_kernel(limbs_ptr, w_hi_ptr, w_lo_ptr, rscale_ptr, cscale_ptr, bias_ptr, out_ptr,
                   rows, N, stride_wk, stride_wn, high_shift, low_shift,
                   K: tl.constexpr, TWO: tl.constexpr, HAS_BIAS: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """A tile of ``y = (high * high_shift + low * low_shift) * s_row * s_col (+ b)``:
    ``high = x_hi · w_hi``, ``low = x_lo · w_hi (+ x_hi · w_lo)``, exact int32 sums of int8
    limb products (``TWO``: 16-bit weights in two limbs)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    # offsets in int64: rows x N outputs of the LM head pass 2**31 from 8,192 rows
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    high = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    low = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        a_mask = (rm[:, None] < rows) & (kk[None, :] < K)
        x_hi = tl.load(limbs_ptr + rm[:, None] * K + kk[None, :], mask=a_mask, other=0)
        x_lo = tl.load(limbs_ptr + (rows + rm[:, None]) * K + kk[None, :], mask=a_mask,
                       other=0)
        w_mask = (kk[:, None] < K) & (rn[None, :] < N)
        w_off = kk[:, None] * stride_wk + rn[None, :] * stride_wn
        w_hi = tl.load(w_hi_ptr + w_off, mask=w_mask, other=0)
        high += tl.dot(x_hi, w_hi, out_dtype=tl.int32)
        low += tl.dot(x_lo, w_hi, out_dtype=tl.int32)
        if TWO:
            w_lo = tl.load(w_lo_ptr + w_off, mask=w_mask, other=0)
            low += tl.dot(x_hi, w_lo, out_dtype=tl.int32)
    rs = tl.load(rscale_ptr + rm, mask=rm < rows, other=1.0)
    cs = tl.load(cscale_ptr + rn, mask=rn < N, other=1.0)
    y = high.to(tl.float32) * (rs * high_shift)[:, None]
    y = y + low.to(tl.float32) * (rs * low_shift)[:, None]
    y = y * cs[None, :]
    if HAS_BIAS:
        y = y + tl.load(bias_ptr + rn, mask=rn < N, other=0.0)[None, :]
    out_mask = (rm[:, None] < rows) & (rn[None, :] < N)
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], y, mask=out_mask)


def linear(limbs: torch.Tensor, row_scale: torch.Tensor, w_hi: torch.Tensor,
           w_lo: torch.Tensor | None, col_scale: torch.Tensor, bias: torch.Tensor | None
           ) -> torch.Tensor:
    """:meth:`~dplang.models.exact.IntegerLinear.apply` of prepared rows (``limbs`` int8
    ``[2M, K]``, ``row_scale [M, 1]``) with "kn" weight limbs ``[K, N]`` (any strides: CUDA's
    column-major ones too), ``w_lo`` for 16-bit weights: one kernel for the products and the
    fixed float32 formula that combines them."""
    rows = limbs.shape[0] // 2
    k, n = w_hi.shape
    out = torch.empty((rows, n), dtype=torch.float32, device=limbs.device)
    if rows == 0 or n == 0:
        return out
    two = w_lo is not None
    limb_base = 256.0
    high_shift, low_shift = (limb_base * limb_base, limb_base) if two else (limb_base, 1.0)
    block_m = 16 if rows <= 16 else 32 if rows <= 32 else 64
    grid = (triton.cdiv(rows, block_m), triton.cdiv(n, 64))
    _linear_kernel[grid](
        limbs.contiguous(), w_hi, w_lo if two else w_hi, row_scale.reshape(-1).contiguous(),
        col_scale.contiguous(), bias.contiguous() if bias is not None else col_scale,
        out, rows, n, w_hi.stride(0), w_hi.stride(1), high_shift, low_shift,
        K=k, TWO=two, HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=64, BLOCK_K=64,
        **_LAUNCH)
    return out


@triton.jit
def _gathered_head_kernel(limbs_ptr, w_hi_ptr, w_lo_ptr, ids_ptr, rscale_ptr, cscale_ptr,
                          bias_ptr, out_ptr, rows, W, N, high_shift, low_shift,
                          K: tl.constexpr, TWO: tl.constexpr, HAS_BIAS: tl.constexpr,
                          BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr):
    """Row ``i``'s outputs on a block of its own columns ``ids[i, j]`` ("nk" weight rows):
    the exact int32 dot products of its limbs with the gathered weight rows' limbs, then the
    fixed formula of :func:`_linear_kernel` (:meth:`~dplang.models.exact.IntegerLinear.combine`).
    An id outside ``0 .. N - 1`` reads nothing and gives NaN (where torch's gather would
    fail)."""
    i = tl.program_id(0).to(tl.int64)  # offsets in int64 (N x K weights, M x W outputs)
    rc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    in_set = rc < W
    c = tl.load(ids_ptr + i * W + rc, mask=in_set, other=0)
    known = (c >= 0) & (c < N)
    in_row = in_set & known
    c = tl.where(known, c, 0).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    high = tl.zeros((BLOCK_C,), dtype=tl.int32)
    low = tl.zeros((BLOCK_C,), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        k_in = kk < K
        x_hi = tl.load(limbs_ptr + i * K + kk, mask=k_in, other=0).to(tl.int32)
        x_lo = tl.load(limbs_ptr + (rows + i) * K + kk, mask=k_in, other=0).to(tl.int32)
        w_off = c[:, None] * K + kk[None, :]
        w_mask = in_row[:, None] & k_in[None, :]
        w_hi = tl.load(w_hi_ptr + w_off, mask=w_mask, other=0).to(tl.int32)
        high += tl.sum(x_hi[None, :] * w_hi, axis=1)
        low += tl.sum(x_lo[None, :] * w_hi, axis=1)
        if TWO:
            w_lo = tl.load(w_lo_ptr + w_off, mask=w_mask, other=0).to(tl.int32)
            low += tl.sum(x_hi[None, :] * w_lo, axis=1)
    rs = tl.load(rscale_ptr + i)
    cs = tl.load(cscale_ptr + c, mask=in_row, other=1.0)
    y = high.to(tl.float32) * (rs * high_shift)
    y = y + low.to(tl.float32) * (rs * low_shift)
    y = y * cs
    if HAS_BIAS:
        y = y + tl.load(bias_ptr + c, mask=in_row, other=0.0)
    y = tl.where(known, y, float("nan"))
    tl.store(out_ptr + i * W + rc, y, mask=in_set)


def gathered_head(limbs: torch.Tensor, row_scale: torch.Tensor, w_hi: torch.Tensor,
                  w_lo: torch.Tensor | None, ids: torch.Tensor, col_scale: torch.Tensor,
                  bias: torch.Tensor | None, high_shift: float, low_shift: float
                  ) -> torch.Tensor:
    """:meth:`~dplang.models.exact.IntegerLinear.gathered`'s outputs ``[M, W]`` of prepared
    rows (``limbs`` int8 ``[2M, K]``, ``row_scale [M, 1]``) on their own columns ``ids [M, W]``
    of "nk" weight limbs ``[N, K]`` (``w_lo`` for 16-bit weights): one kernel, the weight rows
    read where they are (no gathered copy). An id out of range gives a NaN output, not a read
    outside the weights (the ids are not checked on the host, which would wait for the GPU)."""
    k = limbs.shape[1]
    if k >= 2**17:  # int8 x int8 products summed in int32, as the torch definition's
        raise ValueError(f"gathered head: width {k} too large for int32 sums")
    rows, width = ids.shape
    out = torch.empty((rows, width), dtype=torch.float32, device=limbs.device)
    if rows == 0 or width == 0:
        return out
    two = w_lo is not None
    w_hi = w_hi.contiguous()
    block_c = min(64, _block(width))
    _gathered_head_kernel[(rows, triton.cdiv(width, block_c))](
        limbs.contiguous(), w_hi, w_lo.contiguous() if two else w_hi,
        ids.to(torch.int64).contiguous(), row_scale.reshape(-1).contiguous(),
        col_scale.contiguous(), bias.contiguous() if bias is not None else col_scale, out,
        rows, width, w_hi.shape[0], float(high_shift), float(low_shift), K=k, TWO=two,
        HAS_BIAS=bias is not None, BLOCK_C=block_c, BLOCK_K=64, **_LAUNCH)
    return out


# ------------------------------------------------------------------------------ RMS norm


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, eps_ptr, K: tl.constexpr, BLOCK_K: tl.constexpr,
                     HEADROOM: tl.constexpr):
    """One row: squares exact in float64, rounded to the row's power-of-two grid
    (:func:`~dplang.models.exact.fixed_point_sum`), summed as integers, then
    ``x * (1 / sqrt(mean + eps)) * w``."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_K)
    mask = cols < K
    x = tl.load(x_ptr + row * K + cols, mask=mask, other=0.0)
    x64 = x.to(tl.float64)
    sq = x64 * x64
    top = tl.max(sq, axis=0)
    biased = (top.to(tl.int64, bitcast=True) >> 52) & 0x7FF
    biased = tl.where(top > 0, biased, 1023)
    shift = HEADROOM - (biased - 1022)
    shift = tl.minimum(tl.maximum(shift, -1000), 1000)
    grid = ((shift + 1023).to(tl.int64) << 52).to(tl.float64, bitcast=True)  # 2**shift
    scaled = sq * grid
    rounded = (scaled + 6755399441055744.0) - 6755399441055744.0
    total = tl.sum(tl.where(mask, rounded, 0.0), axis=0)
    # float64 division and square root are correctly rounded on every Triton target (PTX has
    # no approximate float64 forms; the *_rn functions are float32-only)
    total = total / grid
    mean = total / K
    # eps from a float64 tensor: a compiled kernel types a Python float argument (or a
    # constexpr one) as float32, and 1e-5 is not a float32 number; the definition adds the
    # float64 eps
    eps = tl.load(eps_ptr)
    inv = (1.0 / tl.sqrt(mean + eps)).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    y = (x * inv) * w
    tl.store(out_ptr + row * K + cols, y, mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`~dplang.models.exact.rms_norm` (float32, last dimension)."""
    shape = x.shape
    flat = x.reshape(-1, shape[-1]).contiguous()
    out = torch.empty_like(flat)
    rows, k = flat.shape
    if rows:
        headroom = 52 - max(1, math.ceil(math.log2(k)))
        eps64 = torch.full((1,), float(eps), dtype=torch.float64, device=flat.device)
        _rms_norm_kernel[(rows,)](flat, weight.contiguous().float(), out, eps64, K=k,
                                  BLOCK_K=_block(k), HEADROOM=headroom, **_LAUNCH)
    return out.view(shape)


# ------------------------------------------------------------------ elementwise activations


@triton.jit
def _exp(x):
    """:func:`~dplang.models.exact.exp`: the same operations in the same order."""
    x = tl.clamp(x, -87.0, 88.0, propagate_nan=tl.PropagateNan.ALL)
    n = _round_even(x * 1.4426950408889634)
    r = x - n * 0.693359375
    r = r - n * -2.12194440e-4
    p = r * 0.0 + 1.9875691500e-4
    p = p * r
    p = p + 1.3981999507e-3
    p = p * r
    p = p + 8.3334519073e-3
    p = p * r
    p = p + 4.1665795894e-2
    p = p * r
    p = p + 1.6666665459e-1
    p = p * r
    p = p + 5.0000001201e-1
    p = p * (r * r)
    p = p + r
    p = p + 1.0
    n = tl.where(n == n, n, 0.0)
    scale = ((n.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
    return p * scale


@triton.jit
def _gated_kernel(gate_ptr, up_ptr, out_ptr, total, GELU: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    x = tl.load(gate_ptr + offs, mask=mask, other=0.0)
    up = tl.load(up_ptr + offs, mask=mask, other=0.0)
    if GELU:
        inner = x * x
        inner = inner * x
        inner = inner * 0.044715
        inner = inner + x
        inner = inner * 1.5957691216057308
        act = tl.math.div_rn(x, _exp(-inner) + 1.0)
    else:
        act = tl.math.div_rn(x, _exp(-x) + 1.0)
    tl.store(out_ptr + offs, act * up, mask=mask)


def _gated(gate: torch.Tensor, up: torch.Tensor, gelu: bool) -> torch.Tensor:
    gate, up = gate.contiguous().float(), up.contiguous().float()
    out = torch.empty_like(gate)
    total = gate.numel()
    if total:
        block = 1024
        _gated_kernel[(triton.cdiv(total, block),)](gate, up, out, total, GELU=gelu,
                                                    BLOCK=block, **_LAUNCH)
    return out


def gelu_tanh_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``exact.gelu_tanh(gate) * up``."""
    return _gated(gate, up, True)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``exact.silu(gate) * up``."""
    return _gated(gate, up, False)


# ------------------------------------------------------------------------------ attention


@triton.jit
def _scores(qh, ql, keys_ptr, kscale_ptr, base_k, base_s, offs_p, offs_d, visible, qs,
            scaling, softcap, inv_softcap, D: tl.constexpr, CAPPED: tl.constexpr):
    """A block of positions' scores: the exact integer dot products of the query's limbs
    with the keys, then ``attend``'s float formula (``-inf`` where not visible)."""
    k = tl.load(keys_ptr + base_k + offs_p[:, None] * D + offs_d[None, :],
                mask=visible[:, None], other=0).to(tl.int32)
    shi = tl.sum(qh[None, :] * k, axis=1)
    slo = tl.sum(ql[None, :] * k, axis=1)
    s = shi.to(tl.float32) * 256.0 + slo.to(tl.float32)
    ks = tl.load(kscale_ptr + base_s + offs_p, mask=visible, other=1.0)
    s = s * qs
    s = s * ks
    s = s * scaling
    if CAPPED:
        s = s * inv_softcap
        s = (tl.math.div_rn(2.0, _exp(-2.0 * s) + 1.0) - 1.0) * softcap
    return tl.where(visible, s, float("-inf"))


@triton.jit
def _block_scores(p0, first, pos, qh, ql, keys_ptr, kscale_ptr, base_k, base_s, offs_d, qs,
                  scaling, softcap, inv_softcap, D: tl.constexpr, C: tl.constexpr,
                  BLOCK_P: tl.constexpr, CAPPED: tl.constexpr):
    """The positions ``p0 .. p0 + BLOCK_P - 1``, which of them the token sees (within its
    window, at most its own position), and their scores (``-inf`` where not seen): one block of
    each of :func:`_attend_kernel`'s passes, which recompute the scores instead of storing
    them."""
    offs_p = p0 + tl.arange(0, BLOCK_P)
    visible = (offs_p >= first) & (offs_p <= pos) & (offs_p < C)
    s = _scores(qh, ql, keys_ptr, kscale_ptr, base_k, base_s, offs_p, offs_d, visible, qs,
                scaling, softcap, inv_softcap, D, CAPPED)
    return offs_p, visible, s


@triton.jit
def _attend_kernel(limbs_ptr, qscale_ptr, slot_ptr, pos_ptr, keys_ptr, kscale_ptr, values_ptr,
                   vscale_ptr, out_ptr, TH, H, KVH, window, scaling, softcap, inv_softcap,
                   levels, headroom, D: tl.constexpr, C: tl.constexpr, BLOCK_P: tl.constexpr,
                   CAPPED: tl.constexpr):
    """One (token, head): the whole of :func:`~dplang.models.attention.attend` over the
    positions its slot holds within its window, read straight from the slot store, in three
    passes (the largest score; the largest weight and mass; the fixed-point denominator and
    the exact integer value sums)."""
    item = tl.program_id(0)
    t = item // H
    h = item - t * H
    kv = h // (H // KVH)
    slot = tl.load(slot_ptr + t)
    pos = tl.load(pos_ptr + t)
    first = tl.where(window > 0, tl.maximum(pos - window + 1, 0), 0)
    offs_d = tl.arange(0, D)
    qh = tl.load(limbs_ptr + item * D + offs_d).to(tl.int32)
    ql = tl.load(limbs_ptr + (TH + item) * D + offs_d).to(tl.int32)
    qs = tl.load(qscale_ptr + item)
    base_s = (slot * KVH + kv) * C
    base_k = base_s * D
    # loop-carried values with their types fixed (a compiled loop keeps them)
    top = tl.full((), float("-inf"), tl.float32)
    nan = tl.zeros((), tl.int32)
    for p0 in range(0, C, BLOCK_P):
        offs_p, visible, s = _block_scores(p0, first, pos, qh, ql, keys_ptr, kscale_ptr, base_k,
                                           base_s, offs_d, qs, scaling, softcap, inv_softcap,
                                           D, C, BLOCK_P, CAPPED)
        nan += tl.sum((s != s).to(tl.int32), axis=0)
        top = tl.maximum(top, tl.max(tl.where(s == s, s, float("-inf")), axis=0))
    top = tl.where((nan > 0) | (top == float("-inf")) | (top == float("inf")), 0.0, top)
    wtop = tl.zeros((), tl.float32)
    mtop = tl.zeros((), tl.float32)
    mnan = tl.zeros((), tl.int32)
    for p0 in range(0, C, BLOCK_P):
        offs_p, visible, s = _block_scores(p0, first, pos, qh, ql, keys_ptr, kscale_ptr, base_k,
                                           base_s, offs_d, qs, scaling, softcap, inv_softcap,
                                           D, C, BLOCK_P, CAPPED)
        w = tl.where(visible, _exp(s - top), 0.0)
        wtop = tl.maximum(wtop, tl.max(w, axis=0))
        m = w * tl.load(vscale_ptr + base_s + offs_p, mask=visible, other=0.0)
        mnan += tl.sum((m != m).to(tl.int32), axis=0)
        mtop = tl.maximum(mtop, tl.max(tl.where(m == m, m, 0.0), axis=0))
    mtop = tl.where((mnan > 0) | (mtop <= 0.0), 1.0, mtop)
    top64 = wtop.to(tl.float64)
    biased = (top64.to(tl.int64, bitcast=True) >> 52) & 0x7FF
    biased = tl.where(wtop > 0, biased, 1023)
    shift = tl.minimum(tl.maximum(headroom - (biased - 1022), -1000), 1000)
    grid = ((shift + 1023).to(tl.int64) << 52).to(tl.float64, bitcast=True)
    factor = tl.math.div_rn(levels, mtop)
    total = tl.zeros((), tl.float64)
    acc = tl.zeros((D,), dtype=tl.float64)
    for p0 in range(0, C, BLOCK_P):
        offs_p, visible, s = _block_scores(p0, first, pos, qh, ql, keys_ptr, kscale_ptr, base_k,
                                           base_s, offs_d, qs, scaling, softcap, inv_softcap,
                                           D, C, BLOCK_P, CAPPED)
        w = tl.where(visible, _exp(s - top), 0.0)
        scaled = w.to(tl.float64) * grid
        total += tl.sum((scaled + 6755399441055744.0) - 6755399441055744.0, axis=0)
        m = w * tl.load(vscale_ptr + base_s + offs_p, mask=visible, other=0.0)
        count = (m * factor + 12582912.0) - 12582912.0
        v = tl.load(values_ptr + base_k + offs_p[:, None] * D + offs_d[None, :],
                    mask=visible[:, None], other=0).to(tl.float64)
        acc += tl.sum(count.to(tl.float64)[:, None] * v, axis=0)
    denominator = total / grid
    f = mtop.to(tl.float64) / levels
    out = ((acc * f) / denominator).to(tl.float32)
    tl.store(out_ptr + item * D + offs_d, out)


def attend_tokens(q: torch.Tensor, q_slot: torch.Tensor, q_pos: torch.Tensor,
                  keys: torch.Tensor, key_scale: torch.Tensor, values: torch.Tensor,
                  value_scale: torch.Tensor, window: int | None, scaling: float,
                  softcap: float | None, levels: int, max_terms: int) -> torch.Tensor:
    """:func:`dplang.models.cpu_kernels.attend_tokens` (the whole of
    :func:`~dplang.models.attention.attend` for every token of a step, read from the slot
    store) as one Triton kernel: ``q [T, H, d]`` float32 before rounding; token ``t`` sees
    positions ``q_pos[t] - window + 1 .. q_pos[t]`` of slot ``q_slot[t]``."""
    tokens, heads, dim = q.shape
    kv_heads, capacity = keys.shape[1], keys.shape[2]
    out = torch.empty((tokens, heads, dim), dtype=torch.float32, device=q.device)
    if tokens == 0:
        return out
    limbs, scale = quantize_limbs(q.reshape(tokens * heads, dim), TWO_LIMB)
    cap = float(softcap) if softcap else 0.0
    headroom = 52 - max(1, math.ceil(math.log2(max_terms)))
    _attend_kernel[(tokens * heads,)](
        limbs, scale.reshape(-1), q_slot.to(torch.int64).contiguous(),
        q_pos.to(torch.int64).contiguous(), keys.contiguous(), key_scale.contiguous(),
        values.contiguous(), value_scale.contiguous(), out, tokens * heads, heads, kv_heads,
        int(window or 0), float(scaling), cap, 1.0 / cap if cap else 0.0, float(levels),
        headroom, D=dim, C=capacity, BLOCK_P=min(32, _block(capacity)), CAPPED=bool(cap),
        **_LAUNCH)
    return out

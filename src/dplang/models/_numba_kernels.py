"""The compiled loops behind :mod:`dplang.models.cpu_kernels` (imported only when numba is).

Every kernel and the helpers it calls are module-level functions over module-level constants:
numba keys its on-disk cache by a function's code and the values of its closure variables, and
a helper dispatcher held in a closure pickles differently in every process, which made the
cache miss (and the kernels recompile, seconds each) in every new process.

The definitions each loop reproduces bit for bit are the torch functions of
:mod:`dplang.models.exact` and :mod:`dplang.models.attention`; see :mod:`cpu_kernels`.
"""


from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit, prange

f32 = np.float32
limb = f32(256.0)
limb_inv = f32(1.0 / 256.0)
half_limb = f32(128.0)
log2e = f32(1.4426950408889634)
ln2_hi = f32(0.693359375)
ln2_lo = f32(-2.12194440e-4)
c0, c1, c2, c3, c4, c5 = (f32(c) for c in (1.9875691500e-4, 1.3981999507e-3,
                                             8.3334519073e-3, 4.1665795894e-2,
                                             1.6666665459e-1, 5.0000001201e-1))
lo_clamp, hi_clamp, one = f32(-87.0), f32(88.0), f32(1.0)
gelu_a = f32(0.044715)
gelu_b = f32(2.0 * math.sqrt(2.0 / math.pi))
tiny32 = f32(np.finfo(np.float32).tiny)  # the smallest normal float32
# 2**k for every k exp32 can reach (its argument is clamped to [-87, 88]): the same float32 as
# math.ldexp(1.0, k), read from a table so that the loops around exp32 need no library call.
pow2_first = -126
pow2_32 = np.array([2.0**k for k in range(pow2_first, 128)], dtype=np.float32)
opts = {"cache": True, "fastmath": False, "error_model": "numpy"}


@njit(inline="always", **opts)
def exp32(x: Any) -> Any:  # dplang.models.exact.exp, element by element
    if x < lo_clamp:
        x = lo_clamp
    elif x > hi_clamp:
        x = hi_clamp
    n = np.rint(x * log2e)
    r = x - n * ln2_hi
    r = r - n * ln2_lo
    p = c0
    p = p * r
    p = p + c1
    p = p * r
    p = p + c2
    p = p * r
    p = p + c3
    p = p * r
    p = p + c4
    p = p * r
    p = p + c5
    p = p * (r * r)
    p = p + r
    p = p + one
    k = 0 if n != n else int(n)
    return p * pow2_32[k - pow2_first]  # 2**k exactly: n is in [-126, 127] after the clamp


@njit(inline="always", **opts)
def grid_of(top: Any, headroom: Any) -> Any:  # dplang.models.exact.fixed_point_sum's grid
    biased = 1023
    if top > 0:
        biased = math.frexp(top)[1] + 1022 if top < np.inf else 2047
    return math.ldexp(1.0, max(-1000, min(1000, headroom - (biased - 1022))))


@njit(inline="always", **opts)
def score_of(s: Any, qs: Any, ks: Any, scaling: Any, capped: Any, inv_softcap: Any,
             softcap: Any) -> Any:  # `attend`'s float formula for an exact integer score s
    s = s * qs
    s = s * ks
    s = s * scaling
    if capped:
        s = s * inv_softcap
        s = (f32(2.0) / (exp32(f32(-2.0) * s) + one) - one) * softcap
    return s


@njit(inline="always", **opts)
def positive_max_bits(x: Any) -> Any:
    # (bits of the largest positive value of a contiguous float32 row, or 0 if none is
    # positive; whether a NaN is present), by integer maxima the compiler vectorises: the bit
    # patterns of positive floats order as their values, negative ones are negative int32s,
    # and a NaN's magnitude bits are above +inf's.
    bits = x.view(np.int32)
    top = np.int32(0)
    nan = np.int32(0)
    for p in range(bits.shape[0]):
        b = bits[p]
        top = max(top, b)
        nan |= np.int32((b & magnitude_mask32) > inf_bits32)
    return top, nan != 0


@njit(inline="always", **opts)
def masses(w: Any, value_scale: Any, headroom: Any) -> Any:
    # `attend`'s denominator (the exact fixed-point sum of the weights w, contiguous, each
    # non-negative or NaN) and masses w * value_scale, written over w; returns (denominator,
    # largest mass or 1). The largest weight sets the grid (NaN if one is NaN); the rounded
    # weights are integers whose sum stays below 2**52 (the grid's headroom), so an int64
    # sum is the definition's float64 sum exactly, in any order; a NaN or an infinity keeps
    # the float64 sum.
    top_bits, nan = positive_max_bits(w)
    wtop = np.nan if nan else np.float64(np.int32(top_bits).view(np.float32))
    grid = grid_of(wtop, headroom)
    if wtop < np.inf:
        itotal = np.int64(0)
        for p in range(w.shape[0]):
            itotal += np.int64(np.rint(np.float64(w[p]) * grid))
        total = np.float64(itotal)
    else:
        total = 0.0
        for p in range(w.shape[0]):
            total += np.rint(np.float64(w[p]) * grid)
    for p in range(w.shape[0]):
        w[p] = w[p] * value_scale[p]
    m_bits, m_nan = positive_max_bits(w)
    mtop = one if m_nan or m_bits == 0 else np.int32(m_bits).view(np.float32)
    return total / grid, mtop


@njit(inline="always", **opts)
def largest_score(x: Any) -> Any:
    # `attend`'s largest score of a contiguous float32 row: its maximum, 0 if a NaN is
    # present or the maximum is infinite. An integer maximum of keys that order as the floats
    # (a float's bits if non-negative, its bits ^ 0x7FFFFFFF if negative; a NaN's key is the
    # smallest) finds it; a maximum of zero takes the first zero's sign, as the scalar loop
    # `if s > top` does, by that loop itself.
    bits = x.view(np.int32)
    top_key = np.int32(-2147483648)
    nan = np.int32(0)
    for p in range(bits.shape[0]):
        b = bits[p]
        is_nan = (b & magnitude_mask32) > inf_bits32
        key = b if b >= 0 else b ^ magnitude_mask32
        top_key = max(top_key, np.int32(-2147483648) if is_nan else key)
        nan |= np.int32(is_nan)
    if nan != 0:
        return f32(0.0)
    top = np.int32(top_key if top_key >= 0 else top_key ^ magnitude_mask32).view(np.float32)
    if top == 0:
        top = f32(-np.inf)
        for p in range(x.shape[0]):
            if x[p] > top:
                top = x[p]
    if not (top > -np.inf and top < np.inf):
        top = f32(0.0)
    return top


@njit(inline="always", **opts)
def row_scale(x: Any, i: Any, lv: Any) -> Any:  # dplang.models.exact.quantize_rows's scale
    return vector_scale(x[i], lv)


#: The bits of float32 +inf; a magnitude's bits above them are a NaN's.
inf_bits32 = np.int32(0x7F800000)
magnitude_mask32 = np.int32(0x7FFFFFFF)


@njit(inline="always", **opts)
def magnitude_bits(x: Any) -> Any:
    # The largest |x[j]| of a contiguous float32 row, as its bits (an int32): bit patterns of
    # non-negative floats order as their values, and a NaN's are above +inf's, so an integer
    # maximum (which the compiler vectorises, unlike a float one with NaN tests) gives the
    # largest magnitude exactly, or tells that a NaN is present (> inf_bits32).
    bits = x.view(np.int32)
    top = np.int32(0)
    for j in range(bits.shape[0]):
        top = max(top, bits[j] & magnitude_mask32)
    return top


@njit(inline="always", **opts)
def vector_scale(x: Any, lv: Any) -> Any:  # row_scale of a 1-D row
    top = magnitude_bits(x)
    s = f32(np.nan) if top > inf_bits32 else np.int32(top).view(np.float32) / lv
    usable = s >= tiny32 and s < np.inf  # a subnormal scale counts as too small
    if not usable:
        s = one
    return s, usable


@njit(inline="always", **opts)
def recombined(high: Any, lw: Any, a: Any, b: Any, col: Any, has_bias: Any, bias: Any) -> Any:
    # IntegerLinear.combine for one element: (high * a + low * b) * col (+ bias)
    y = f32(high) * a
    y = y + f32(lw) * b
    y = y * col
    if has_bias:
        y = y + bias
    return y


@njit(inline="always", **opts)
def limbs_of(x: Any, lv: Any, hi_out: Any, lo_out: Any) -> Any:
    # quantize_rows then split_limbs of one row x (1-D): its two limbs into hi_out/lo_out
    # (int8 or int16: each limb is an integer in [-128, 127], stored exactly either way);
    # returns the row's scale.
    s, usable = vector_scale(x, lv)
    for j in range(x.shape[0]):
        q = np.rint(x[j] / s) if usable else f32(0.0)
        hi = np.floor((q + half_limb) * limb_inv)
        lo = q - hi * limb
        hi_out[j] = np.int8(hi)
        lo_out[j] = np.int8(lo)
    return s


@njit(inline="always", **opts)
def recombined_at(high: Any, low: Any, low2: Any, i: Any, j: Any, two: Any, a: Any, b: Any,
                  col_scale: Any, has_bias: Any, bias: Any) -> Any:
    # recombined for element (i, j) of a "kn" product's integer parts (low + low2 where the
    # weights have two limbs)
    lw = low[i, j] + low2[i, j] if two else low[i, j]
    return recombined(high[i, j], lw, a, b, col_scale[j], has_bias,
                      bias[j] if has_bias else f32(0.0))


@njit(parallel=True, **opts)
def quantize_limbs(x: Any, levels: Any, limbs: Any, scale: Any) -> None:
    rows = x.shape[0]
    lv = f32(levels)
    for i in prange(rows):
        scale[i] = limbs_of(x[i], lv, limbs[i], limbs[rows + i])


@njit(parallel=True, **opts)
def quantize(x: Any, levels: Any, q: Any, scale: Any) -> None:
    rows, width = x.shape
    lv = f32(levels)
    for i in prange(rows):
        s, usable = row_scale(x, i, lv)
        scale[i] = s
        for j in range(width):
            q[i, j] = np.rint(x[i, j] / s) if usable else f32(0.0)


@njit(parallel=True, **opts)
def combine(high: Any, low: Any, low2: Any, row_scale: Any, col_scale: Any, bias: Any,
            high_shift: Any, low_shift: Any, out: Any) -> None:
    rows, cols = out.shape
    two = low2.shape[0] > 0
    has_bias = bias.shape[0] > 0
    for i in prange(rows):
        a = row_scale[i] * high_shift
        b = row_scale[i] * low_shift
        for j in range(cols):
            out[i, j] = recombined_at(high, low, low2, i, j, two, a, b, col_scale, has_bias,
                                      bias)


@njit(parallel=True, **opts)
def combine_cols(high: Any, low: Any, low2: Any, row_scale: Any, col_scale: Any,
                 bias: Any, high_shift: Any, low_shift: Any, out: Any) -> None:
    # high/low/low2: [N, M] (the weight was the left operand); out: [M, N].
    cols, rows = high.shape
    two = low2.shape[0] > 0
    has_bias = bias.shape[0] > 0
    chunk = 4096
    for c in prange((cols + chunk - 1) // chunk):
        for i in range(rows):
            a = row_scale[i] * high_shift
            b = row_scale[i] * low_shift
            for j in range(c * chunk, min(cols, (c + 1) * chunk)):
                lw = low[j, i] + low2[j, i] if two else low[j, i]
                out[i, j] = recombined(high[j, i], lw, a, b, col_scale[j], has_bias,
                                       bias[j] if has_bias else f32(0.0))


@njit(inline="always", **opts)
def norm_of(x: Any, weight: Any, eps: Any, headroom: Any, out: Any) -> None:
    # dplang.models.exact.rms_norm of one contiguous row x (1-D) into out (which may be x
    # itself: each element is read before its own output is written).
    width = x.shape[0]
    # The largest square is the square of the largest magnitude (float32 squares are exact
    # in float64, and monotone in the magnitude); NaN if a NaN is present.
    top_bits = magnitude_bits(x)
    if top_bits > inf_bits32:
        top = np.nan
    else:
        top_abs = np.float64(np.int32(top_bits).view(np.float32))
        top = top_abs * top_abs
    grid = grid_of(top, headroom)
    if top < np.inf:
        # Every rounded term is an integer below 2**headroom and their sum below 2**52, so an
        # int64 sum is the same integer as the definition's float64 one, in any order (which
        # lets the compiler vectorise it); converted back, the same float64.
        itotal = np.int64(0)
        for j in range(width):
            v = np.float64(x[j])
            itotal += np.int64(np.rint((v * v) * grid))
        total = np.float64(itotal)
    else:  # a NaN or an infinity: the definition's float64 sum (inf or NaN), as it is
        total = 0.0
        for j in range(width):
            v = np.float64(x[j])
            total += np.rint((v * v) * grid)
    mean = (total / grid) / np.float64(width)
    inv = f32(1.0 / math.sqrt(mean + eps))
    for j in range(width):
        out[j] = (x[j] * inv) * weight[j]


@njit(parallel=True, **opts)
def rms_norm(x: Any, weight: Any, eps: Any, headroom: Any, out: Any) -> None:
    for i in prange(x.shape[0]):
        norm_of(x[i], weight, eps, headroom, out[i])


@njit(parallel=True, **opts)
def hadamard_rows(y: Any) -> None:  # dplang.models.exact.hadamard, in place, per row
    rows, width = y.shape
    for i in prange(rows):
        half = 1
        while half < width:
            for start in range(0, width, 2 * half):
                for j in range(start, start + half):
                    a = y[i, j]
                    b = y[i, j + half]
                    y[i, j] = a + b
                    y[i, j + half] = a - b
            half *= 2


@njit(inline="always", **opts)
def rotate_into(x: Any, cos: Any, sin: Any, rotate: Any, out: Any) -> None:
    # dplang.models.decoder.rotary of one head x (1-D, any stride) with its position's cos/sin
    # rows: x * cos + rotate_half(x) * sin, each product and the sum rounded to float32 as
    # three torch operations round them; then, with rotate, hadamard_rows' butterflies.
    dim = x.shape[0]
    half = dim // 2
    for j in range(half):
        out[j] = x[j] * cos[j] + (-x[j + half]) * sin[j]
    for j in range(half, dim):
        out[j] = x[j] * cos[j] + x[j - half] * sin[j]
    if rotate:
        step = 1
        while step < dim:
            for start in range(0, dim, 2 * step):
                for j in range(start, start + step):
                    a = out[j]
                    b = out[j + step]
                    out[j] = a + b
                    out[j + step] = a - b
            step *= 2


@njit(parallel=True, **opts)
def rotary_heads(x: Any, cos: Any, sin: Any, rotate: Any, out: Any) -> None:
    # rotate_into for every (token, head) of x [T, H, d] (any strides; cos/sin [T, d]).
    tokens, heads, _ = x.shape
    for item in prange(tokens * heads):
        t = item // heads
        h = item - t * heads
        rotate_into(x[t, h], cos[t], sin[t], rotate, out[t, h])


@njit(inline="always", **opts)
def store_rounded(x: Any, lv: Any, scale_store: Any, store: Any, slot: Any, head: Any,
                  pos: Any) -> None:
    # SlotCache.write of one (token, head) vector x (contiguous): rounded on its own scale
    # (quantize_rows) and stored at (slot, head, pos).
    s, ok = vector_scale(x, lv)
    scale_store[slot, head, pos] = s
    for c in range(x.shape[0]):
        store[slot, head, pos, c] = np.rint(x[c] / s) if ok else f32(0.0)


@njit(parallel=True, **opts)
def qkv_heads(high: Any, low: Any, low2: Any, rscale: Any, col_scale: Any, bias: Any,
              high_shift: Any, low_shift: Any, q_norm: Any, q_eps: Any, k_norm: Any,
              k_eps: Any, headroom: Any, cos: Any, sin: Any, rotate: Any, slots: Any,
              positions: Any, k_store: Any, v_store: Any, ks_store: Any, vs_store: Any,
              k_levels: Any, v_levels: Any, work: Any, q_out: Any) -> None:
    # dplang.models.decoder.qkv_step, token by token: the q|k|v row recombined from the
    # product's integer parts; each query head normed (q_norm, if any) and rotated into
    # q_out; each key head normed (k_norm, if any), rotated and stored; each value head
    # stored. work [T, N + d] holds the row, then a key head's rotation.
    tokens, heads, dim = q_out.shape
    kv_heads = k_store.shape[1]
    cols = high.shape[1]
    nq = heads * dim
    nk = kv_heads * dim
    two = low2.shape[0] > 0
    has_bias = bias.shape[0] > 0
    has_q_norm = q_norm.shape[0] > 0
    has_k_norm = k_norm.shape[0] > 0
    kl = f32(k_levels)
    vl = f32(v_levels)
    for t in prange(tokens):
        a = rscale[t] * high_shift
        b = rscale[t] * low_shift
        row = work[t]
        for j in range(cols):
            row[j] = recombined_at(high, low, low2, t, j, two, a, b, col_scale, has_bias,
                                   bias)
        for h in range(heads):
            x = row[h * dim:(h + 1) * dim]
            if has_q_norm:
                norm_of(x, q_norm, q_eps, headroom, x)
            rotate_into(x, cos[t], sin[t], rotate, q_out[t, h])
        rotated = row[cols:cols + dim]
        slot = slots[t]
        pos = positions[t]
        for h in range(kv_heads):
            x = row[nq + h * dim:nq + (h + 1) * dim]
            if has_k_norm:
                norm_of(x, k_norm, k_eps, headroom, x)
            rotate_into(x, cos[t], sin[t], rotate, rotated)
            store_rounded(rotated, kl, ks_store, k_store, slot, h, pos)
            store_rounded(row[nq + nk + h * dim:nq + nk + (h + 1) * dim], vl, vs_store,
                          v_store, slot, h, pos)


@njit(inline="always", **opts)
def gelu_tanh32(x: Any) -> Any:  # dplang.models.exact.gelu_tanh of one float32
    inner = x * x
    inner = inner * x
    inner = inner * gelu_a
    inner = inner + x
    inner = inner * gelu_b
    return x / (exp32(-inner) + one)


@njit(inline="always", **opts)
def silu32(x: Any) -> Any:  # dplang.models.exact.silu of one float32
    return x / (exp32(-x) + one)


@njit(parallel=True, **opts)
def gelu_tanh_mul(gate: Any, up: Any, out: Any) -> None:
    rows, width = gate.shape
    for i in prange(rows):
        for j in range(width):
            out[i, j] = gelu_tanh32(gate[i, j]) * up[i, j]


@njit(parallel=True, **opts)
def silu_mul(gate: Any, up: Any, out: Any) -> None:
    rows, width = gate.shape
    for i in prange(rows):
        for j in range(width):
            out[i, j] = silu32(gate[i, j]) * up[i, j]


@njit(parallel=True, **opts)
def residual_limbs(high: Any, low: Any, low2: Any, rscale: Any, col_scale: Any, bias: Any,
                   high_shift: Any, low_shift: Any, post_weight: Any, post_eps: Any, h: Any,
                   norm_weight: Any, norm_eps: Any, headroom: Any, levels: Any, h_out: Any,
                   work: Any, limbs: Any, scale: Any) -> None:
    # dplang.models.exact.residual_rows, row by row: y = combine(high, low + low2) (then
    # rms_norm with post_weight, if any), h_out = h + y, and the limbs and scale of
    # rms_norm(h_out) with norm_weight. work [M, N] holds y, then the norm's output.
    rows, cols = h.shape
    two = low2.shape[0] > 0
    has_bias = bias.shape[0] > 0
    has_post = post_weight.shape[0] > 0
    lv = f32(levels)
    for i in prange(rows):
        a = rscale[i] * high_shift
        b = rscale[i] * low_shift
        y = work[i]
        for j in range(cols):
            y[j] = recombined_at(high, low, low2, i, j, two, a, b, col_scale, has_bias, bias)
        if has_post:
            norm_of(y, post_weight, post_eps, headroom, y)
        for j in range(cols):
            h_out[i, j] = h[i, j] + y[j]
        norm_of(h_out[i], norm_weight, norm_eps, headroom, y)
        scale[i] = limbs_of(y, lv, limbs[i], limbs[rows + i])


@njit(parallel=True, **opts)
def gated_limbs(g_high: Any, g_low: Any, g_low2: Any, u_high: Any, u_low: Any, u_low2: Any,
                rscale: Any, g_col: Any, g_bias: Any, u_col: Any, u_bias: Any,
                high_shift: Any, low_shift: Any, silu: Any, levels: Any, work: Any,
                limbs: Any, scale: Any) -> None:
    # dplang.models.exact.gated_rows, row by row: m = activation(combine(gate)) * combine(up)
    # (gelu_tanh, or silu), then the limbs and scale of m. work [M, N] holds m.
    rows, cols = work.shape
    two = g_low2.shape[0] > 0
    g_has_bias = g_bias.shape[0] > 0
    u_has_bias = u_bias.shape[0] > 0
    lv = f32(levels)
    for i in prange(rows):
        a = rscale[i] * high_shift
        b = rscale[i] * low_shift
        m = work[i]
        for j in range(cols):
            g = recombined_at(g_high, g_low, g_low2, i, j, two, a, b, g_col, g_has_bias,
                              g_bias)
            u = recombined_at(u_high, u_low, u_low2, i, j, two, a, b, u_col, u_has_bias,
                              u_bias)
            m[j] = (silu32(g) if silu else gelu_tanh32(g)) * u
        scale[i] = limbs_of(m, lv, limbs[i], limbs[rows + i])


@njit(parallel=True, **opts)
def softmax_counts(both: Any, q_scale: Any, key_scale: Any, value_scale: Any,
                   visible: Any, scaling: Any, softcap: Any, inv_softcap: Any,
                   levels: Any, headroom: Any, counts: Any, largest: Any,
                   denominator: Any) -> None:
    # both [B, 2*R, L] (high-limb scores, then low-limb scores); q_scale [B, R];
    # key_scale/value_scale [B, L]; visible [B, R, L]; counts [B, R, L] out.
    batch, rows2, length = both.shape
    rows = rows2 // 2
    capped = softcap > 0
    for item in prange(batch * rows):
        b = item // rows
        r = item - b * rows
        qs = q_scale[b, r]
        top = -np.inf
        nan = False
        for p in range(length):
            if visible[b, r, p]:
                s = score_of(both[b, r, p] * limb + both[b, rows + r, p], qs,
                             key_scale[b, p], scaling, capped, inv_softcap, softcap)
                counts[b, r, p] = s
                if s != s:
                    nan = True
                elif s > top:
                    top = s
        if nan or not (top > -np.inf and top < np.inf):
            top = f32(0.0)
        top32 = f32(top)
        for p in range(length):
            if visible[b, r, p]:
                counts[b, r, p] = exp32(counts[b, r, p] - top32)
            else:
                counts[b, r, p] = f32(0.0)
        denominator[b, r], mtop = masses(counts[b, r], value_scale[b], headroom)
        largest[b, r] = mtop
        factor = levels / mtop
        for p in range(length):
            counts[b, r, p] = np.rint(counts[b, r, p] * factor)


@njit(parallel=True, **opts)
def attention_output(total: Any, largest: Any, denominator: Any, levels: Any,
                     out: Any) -> None:
    rows, width = total.shape
    for i in prange(rows):
        f = np.float64(largest[i]) / levels
        for j in range(width):
            out[i, j] = f32((np.float64(total[i, j]) * f) / denominator[i])


@njit(inline="always", **opts)
def exact_dot(a: Any, b: Any) -> Any:
    # exact integer dot product of two int8 or int16 vectors whose every partial sum stays
    # within int32 (queries' limbs against stored keys: at most 2**24; int8 limbs against
    # int8 weight limbs: 2**14 per product, widths below 2**17): an int32 sum, which the
    # compiler turns into paired multiply-adds (its value is the same in any order)
    s = np.int32(0)
    for c in range(a.shape[0]):
        s = np.int32(s + np.int32(a[c]) * np.int32(b[c]))
    return s


@njit(parallel=True, **opts)
def attend_tokens(q_hi: Any, q_lo: Any, q_scale: Any, q_slot: Any, q_pos: Any, keys: Any,
                  key_scale: Any, values: Any, value_scale: Any, window: Any,
                  scaling: Any, softcap: Any, inv_softcap: Any, levels: Any,
                  headroom: Any, chunk: Any, out: Any) -> None:
    # q_hi/q_lo [T, H, d] int16 limbs, q_scale [T, H]; keys/values [S, kvh, C, d] (int16
    # integers); scales [S, kvh, C]; token t sees positions [pos - window + 1, pos] of its
    # slot. Value sums: int32 over `chunk` positions at a time (a count of at most levels + 1
    # times a value of at most 2**15 - 1, summed over chunk positions, stays within int32),
    # then float64 (exact: integers below 2**53); chunk 0 (values not int16) or a count out
    # of that range: float64 sums, as before.
    tokens, heads, dim = q_hi.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    capped = softcap > 0
    for item in prange(tokens * kv_heads):
        t = item // kv_heads
        kv = item - t * kv_heads
        slot = q_slot[t]
        pos = q_pos[t]
        first = 0 if window <= 0 else max(0, pos - window + 1)
        n = pos - first + 1
        weights = np.empty((group, n), dtype=np.float32)
        # scores: exact integer dot products, then the float formula of `attend`
        for p in range(n):
            key = keys[slot, kv, first + p]
            ks = key_scale[slot, kv, first + p]
            for j in range(group):
                h = kv * group + j
                shi = exact_dot(q_hi[t, h], key)
                slo = exact_dot(q_lo[t, h], key)
                weights[j, p] = score_of(f32(shi) * limb + f32(slo), q_scale[t, h],
                                         ks, scaling, capped, inv_softcap, softcap)
        # softmax per head: weights -> integer counts (counts[p, j])
        counts = np.empty((n, group), dtype=np.int32)
        denominators = np.empty(group, dtype=np.float64)
        largest = np.empty(group, dtype=np.float32)
        fits = chunk > 0
        for j in range(group):
            top32 = largest_score(weights[j])
            for p in range(n):
                weights[j, p] = exp32(weights[j, p] - top32)
            denominator, mtop = masses(weights[j], value_scale[slot, kv, first:first + n],
                                       headroom)
            denominators[j] = denominator
            largest[j] = mtop
            factor = levels / mtop
            for p in range(n):  # the counts, over the masses
                count = np.rint(weights[j, p] * factor)
                weights[j, p] = count
                if abs(count) <= levels + 1:
                    counts[p, j] = np.int32(count)
                else:  # NaN included
                    fits = False
        # value sums, every head of the group from one read of each stored value
        acc = np.zeros((group, dim), dtype=np.float64)
        if fits:  # int32 sums of chunk positions, then float64
            part = np.empty((group, dim), dtype=np.int32)
            for p0 in range(0, n, chunk):
                part[:] = 0
                for p in range(p0, min(n, p0 + chunk)):
                    value = values[slot, kv, first + p]
                    for j in range(group):
                        cnt = counts[p, j]
                        if cnt != 0:
                            for c in range(dim):
                                part[j, c] = np.int32(part[j, c] + cnt * np.int32(value[c]))
                for j in range(group):
                    for c in range(dim):
                        acc[j, c] += np.float64(part[j, c])
        else:  # a count out of int32's reach (NaN, after a score overflowed): float64 sums
            # for every head (a head whose counts fit gets the same exact integers either way:
            # each product and sum is an integer below 2**53)
            for j in range(group):
                for p in range(n):
                    count = weights[j, p]
                    if count != 0:
                        cnt = np.float64(count)
                        for c in range(dim):
                            acc[j, c] += cnt * np.float64(values[slot, kv, first + p, c])
        for j in range(group):
            h = kv * group + j
            f = np.float64(largest[j]) / np.float64(levels)
            for c in range(dim):
                out[t, h, c] = f32((acc[j, c] * f) / denominators[j])


@njit(parallel=True, **opts)
def write_kv(keys: Any, values: Any, slots: Any, positions: Any, k_store: Any, v_store: Any,
             ks_store: Any, vs_store: Any, k_levels: Any, v_levels: Any) -> None:
    # SlotCache.write: each (token, kv head) row of keys/values [T, kvh, d] rounded on its own
    # scale (quantize_rows) and stored at (slot, head, position) of the stores.
    tokens, heads = keys.shape[0], keys.shape[1]
    kl = f32(k_levels)
    vl = f32(v_levels)
    for item in prange(tokens * heads):
        t = item // heads
        h = item - t * heads
        slot = slots[t]
        pos = positions[t]
        store_rounded(keys[t, h], kl, ks_store, k_store, slot, h, pos)
        store_rounded(values[t, h], vl, vs_store, v_store, slot, h, pos)


@njit(inline="always", **opts)
def _kept(v: Any, plus: Any, threshold: Any) -> Any:
    # whether a public logit v is in V_k^+ (see topk_plus_rows)
    if plus:
        return v == np.inf
    return v == v and v != -np.inf and v >= threshold


@njit(parallel=True, **opts)
def topk_plus_rows(public: Any, k: Any, margin: Any) -> Any:
    # InvisibleInkPolicy.candidates of every row of public [G, V], in parallel over rows (each
    # row from its own values by the same code): V_k^+ = {y : pub[y] >= ell - margin} within
    # the public support (the +inf tokens when there are any, else the finite ones), ell the
    # k-th largest public logit (NaN counted as -inf; k <= 0 or k >= |V|: the whole support).
    # Returns (ids [G, W] ascending, each row padded by its first id, or 0 for an empty row;
    # sizes [G]), W the largest size (at least 1)
    rows, vocab = public.shape
    plus = np.zeros(rows, dtype=np.bool_)
    thresholds = np.empty(rows, dtype=np.float32)
    sizes = np.zeros(rows, dtype=np.int64)
    for g in prange(rows):
        p, threshold = _topk_plus_rule(public[g], k, margin)
        plus[g] = p
        thresholds[g] = threshold
        count = 0
        for y in range(vocab):
            if _kept(public[g, y], p, threshold):
                count += 1
        sizes[g] = count
    width = max(1, sizes.max()) if rows else 1
    ids = np.zeros((rows, width), dtype=np.int64)
    for g in prange(rows):
        count = 0
        for y in range(vocab):
            if _kept(public[g, y], plus[g], thresholds[g]):
                ids[g, count] = y
                count += 1
        for j in range(count, width):
            ids[g, j] = ids[g, 0]
    return ids, sizes


@njit(inline="always", **opts)
def heap_push(heap: Any, size: Any, v: Any) -> Any:
    # keep in the min-heap heap[:size] the k = len(heap) largest values seen, v included;
    # returns the new size (heap[0] is then the k-th largest once k values were seen)
    k = heap.shape[0]
    if size < k:
        j = size
        size += 1
        while j > 0:  # sift up
            parent = (j - 1) // 2
            if heap[parent] <= v:
                break
            heap[j] = heap[parent]
            j = parent
        heap[j] = v
    elif v > heap[0]:
        j = 0
        while True:  # sift down from the root with v
            left = 2 * j + 1
            if left >= k:
                break
            child = left
            if left + 1 < k and heap[left + 1] < heap[left]:
                child = left + 1
            if heap[child] >= v:
                break
            heap[j] = heap[child]
            j = child
        heap[j] = v
    return size


@njit(**opts)
def _topk_plus_rule(public: Any, k: Any, margin: Any) -> Any:
    # (whether the row has +inf logits, the threshold ell - margin) of topk_plus_rows
    vocab = public.shape[0]
    plus = False
    for y in range(vocab):
        if public[y] == np.inf:
            plus = True
            break
    threshold = f32(-np.inf)
    if not plus and 0 < k < vocab:
        # the k-th largest (NaN as -inf) by a min-heap of the k largest seen
        heap = np.empty(k, dtype=np.float32)
        size = 0
        for y in range(vocab):
            v = public[y]
            if v != v:
                v = f32(-np.inf)
            size = heap_push(heap, size, v)
        threshold = f32(heap[0] - margin)
    return plus, threshold


@njit(parallel=True, **opts)
def head_bounds(part: Any, rows: Any, low_min: Any, low_max: Any, a: Any, b: Any,
                col_scale: Any, bias: Any, start: Any, banned: Any, margin: Any, heaps: Any,
                sizes: Any, finite: Any, cand_ids: Any, cand_upper: Any, cand_hh: Any,
                cand_hl: Any, counts: Any) -> None:
    # Bounds on the logits of "nk" 16-bit weights' columns start .. start + c - 1 for each of
    # `rows` prepared rows, from part [c, 2 * rows] int32: column g the high-limb weights times
    # row g's high limbs (hh), column rows + g times its low limbs (hl). The missing low-limb
    # weights' products lie in [low_min[g], low_max[g]], and IntegerLinear.combine's formula
    # (recombined) is non-decreasing in its low integer (scales >= 0), so the logit is between
    # recombined(hh, hl + low_min) and recombined(hh, hl + low_max). The lower one is offered
    # to the heap of row g's k largest lower bounds (heaps[g], sizes[g] filled); then every
    # column of the chunk whose upper bound is at least f32(heap[0] - margin) (-inf while the
    # heap is not full) is appended to row g's candidates (id, upper bound, hh, hl; counts[g]
    # of them, ids ascending). heap[0] only grows, so every column whose upper bound reaches
    # the final f32(L_k - margin) is appended. When a chunk would not fit, the candidates
    # below the current threshold are dropped first; counts[g] = -1 marks a row that still
    # has no room. A banned column gets no bound and is never a candidate; finite[g] turns
    # false where a bound is not finite.
    c = part.shape[0]
    capacity = cand_ids.shape[1]
    has_bias = bias.shape[0] > 0
    any_banned = banned.shape[0] > 0
    m32 = f32(margin)
    for g in prange(rows):
        if counts[g] < 0:
            continue
        lower = np.empty(c, dtype=np.float32)
        upper = np.empty(c, dtype=np.float32)
        ag, bg, lo_g, hi_g = a[g], b[g], low_min[g], low_max[g]
        ok = True
        for r in range(c):
            col = start + r
            hh = part[r, g]
            hl = np.int64(part[r, rows + g])
            bv = bias[col] if has_bias else f32(0.0)
            lo = recombined(hh, hl + lo_g, ag, bg, col_scale[col], has_bias, bv)
            hi = recombined(hh, hl + hi_g, ag, bg, col_scale[col], has_bias, bv)
            if any_banned and banned[col]:
                lo = f32(-np.inf)
                hi = f32(-np.inf)
            else:
                ok = ok & (abs(lo) < np.inf) & (abs(hi) < np.inf)
            lower[r] = lo
            upper[r] = hi
        if not ok:
            finite[g] = False
        heap = heaps[g]
        size = sizes[g]
        k = heap.shape[0]
        for r in range(c):
            if (size < k or lower[r] > heap[0]) and not (any_banned and banned[start + r]):
                size = heap_push(heap, size, lower[r])
        sizes[g] = size
        threshold = f32(heap[0] - m32) if size == k else f32(-np.inf)
        n = counts[g]
        if n + c > capacity:  # drop the candidates the threshold has passed
            kept = 0
            for t in range(n):
                if cand_upper[g, t] >= threshold:
                    cand_ids[g, kept] = cand_ids[g, t]
                    cand_upper[g, kept] = cand_upper[g, t]
                    cand_hh[g, kept] = cand_hh[g, t]
                    cand_hl[g, kept] = cand_hl[g, t]
                    kept += 1
            n = kept
        for r in range(c):
            if upper[r] >= threshold and not (any_banned and banned[start + r]):
                if n == capacity:
                    n = -1
                    break
                cand_ids[g, n] = start + r
                cand_upper[g, n] = upper[r]
                cand_hh[g, n] = part[r, g]
                cand_hl[g, n] = part[r, rows + g]
                n += 1
        counts[g] = n


@njit(parallel=True, **opts)
def superset_logits(cand_ids: Any, cand_upper: Any, cand_hh: Any, cand_hl: Any, counts: Any,
                    thresholds: Any, limbs: Any, rows: Any, w_lo: Any, a: Any, b: Any,
                    col_scale: Any, bias: Any, top_k: Any, margin: Any, out_ids: Any,
                    out_logits: Any, out_counts: Any) -> None:
    # The exact logits of a bounded head's candidates (head_bounds') that the Top-k+ rule can
    # need, by a threshold algorithm. Row g's candidates with an upper bound of at least
    # thresholds[g] = f32(L_k - margin) are visited by decreasing upper bound (ties by
    # ascending id); each visited one's exact logit -- its low integer hl plus the low-limb
    # weights' product with the row's high limbs, combined as gathered_head combines them:
    # the same integers, the same bits -- joins a min-heap of the top_k largest exact logits
    # seen, and the visit stops at the first candidate whose upper bound is below f32(heap[0]
    # - margin) once the heap is full. Every candidate not visited has a logit <= its upper
    # bound < f32(e - margin) <= f32(ell - margin) <= ell (e: the heap's k-th largest at the
    # stop, at most the row's k-th largest logit ell; margin >= 0): neither among the k
    # largest nor kept by the rule; nor is a column that was never a candidate (its upper
    # bound is below f32(L_k - margin) <= f32(ell - margin)). The visited ids (ascending) and
    # logits go to out_ids[g], out_logits[g], their number to out_counts[g].
    has_bias = bias.shape[0] > 0
    m32 = f32(margin)
    for g in prange(rows):
        n = 0
        t0 = thresholds[g]
        for t in range(counts[g]):
            if cand_upper[g, t] >= t0:
                n += 1
        pos = np.empty(n, dtype=np.int64)
        neg = np.empty(n, dtype=np.float32)
        n = 0
        for t in range(counts[g]):
            if cand_upper[g, t] >= t0:
                pos[n] = t
                neg[n] = -cand_upper[g, t]
                n += 1
        order = np.argsort(neg, kind="mergesort")  # stable: equal bounds by ascending id
        heap = np.empty(top_k, dtype=np.float32)
        size = 0
        visited = np.zeros(n, dtype=np.bool_)
        value = np.empty(n, dtype=np.float32)
        for s in order:
            if size == top_k and -neg[s] < f32(heap[0] - m32):
                break
            t = pos[s]
            col = cand_ids[g, t]
            low = cand_hl[g, t] + exact_dot(limbs[g], w_lo[col])
            v = recombined(cand_hh[g, t], low, a[g], b[g], col_scale[col], has_bias,
                           bias[col] if has_bias else f32(0.0))
            value[s] = v
            visited[s] = True
            size = heap_push(heap, size, v)
        m = 0
        for s in range(n):
            if visited[s]:
                out_ids[g, m] = cand_ids[g, pos[s]]
                out_logits[g, m] = value[s]
                m += 1
        out_counts[g] = m


@njit(parallel=True, **opts)
def weight_products(weights: Any, limbs: Any, out: Any) -> None:
    # out[c, r]: the exact int32 dot product of int8 weight row c with int8 limb row r (every
    # partial sum within int32: 2**14 per product, widths below 2**17), the integers of
    # exact_products(weights, limbs.T) without a float32 copy of the weights. One weight row
    # per iteration: it is read from memory once and stays in cache for every limb row.
    for c in prange(weights.shape[0]):
        for r in range(limbs.shape[0]):
            out[c, r] = exact_dot(weights[c], limbs[r])


@njit(parallel=True, **opts)
def gathered_head(limbs: Any, rows: Any, w_hi: Any, w_lo: Any, ids: Any, row_scale: Any,
                  col_scale: Any, bias: Any, high_shift: Any, low_shift: Any, out: Any) -> None:
    # IntegerLinear.gathered (layout "nk"): row i's outputs on its own columns ids[i], from
    # the exact int32 dot products of its limbs (limbs[i], limbs[rows + i]) with the weight
    # rows' limbs, combined by IntegerLinear.combine's formula.
    # A column that repeats the row's first id (the padding of a ragged set) is not
    # recomputed: it is the first column's value, the same computation on the same id.
    count, width = ids.shape
    two = w_lo.shape[0] > 0
    has_bias = bias.shape[0] > 0
    for item in prange(count * width):  # column by column: rows that share ids (a group's
        j = item // count  # private rows) read each weight row while it is in cache
        i = item - j * count
        c = ids[i, j]
        if j > 0 and c == ids[i, 0]:
            continue
        high = exact_dot(limbs[i], w_hi[c])
        low = exact_dot(limbs[rows + i], w_hi[c])
        if two:
            low += exact_dot(limbs[i], w_lo[c])
        a = row_scale[i] * high_shift
        b = row_scale[i] * low_shift
        out[i, j] = recombined(high, low, a, b, col_scale[c], has_bias,
                               bias[c] if has_bias else f32(0.0))
    for i in prange(count):
        for j in range(1, width):
            if ids[i, j] == ids[i, 0]:
                out[i, j] = out[i, 0]

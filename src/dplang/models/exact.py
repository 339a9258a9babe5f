"""Arithmetic whose result for one row is the same bits whatever else is computed beside it
(privacy-critical; docs/privacy.md, "Row invariance by construction").

A row's logits must be a function of that row's own tokens, bit for bit (DESIGN.md invariant
7). A floating-point reduction does not give that by itself: its last bits depend on the order
of its additions, and a library chooses the order by the shape of the call, the ISA, the cache
sizes and the thread split, all of which change with the other rows of the batch. This module
therefore builds every operation of the model from two kinds of arithmetic whose result cannot
depend on such choices:

* **Exact integer sums.** An integer-valued sum whose every partial sum is representable is the
  same number in any order, tiling or precision of the kernel that computes it. Matrix products
  multiply integers: the activations of each row are rounded to integers on a scale of their own
  (:func:`quantize_rows`, a function of the row only) and split into two 8-bit *limbs*
  (:func:`split_limbs`), the weights are integers per output channel, and the products are
  computed either by an int8 kernel with int32 accumulation (used only where a probe on
  saturating operands shows it exact, :func:`int8_kernel_is_exact`, and on a CPU only where
  it has int8 dot products, :func:`product_kernel`; on x86 CPUs with VNNI or
  AMX, for reductions of up to 1,024 terms, oneDNN's matmul with weights packed once:
  :mod:`dplang.models.packed_int8`) or by float32 products of chunks whose sums stay below
  2**24 (:func:`exact_products`). All give the same integers, so the choice changes no bit.
  Sums of floats (norms, attention denominators) are rounded to a fixed-point grid first and
  summed as integers in float64 (:func:`fixed_point_sum`).
* **Correctly rounded elementwise operations.** IEEE 754 defines ``+ - * /`` and ``sqrt`` to be
  correctly rounded, so a vector unit, a scalar loop and a GPU give the same bits for each
  element. Library transcendental functions are not (a vectorised loop's tail may use another
  implementation, MKL's VML chooses per ISA), so ``exp``, ``tanh``, ``sigmoid`` and the
  activations are written here with basic operations only (:func:`exp`, :func:`gelu_tanh`,
  :func:`silu`). Nor is ``torch.sqrt`` on a CPU: it is oneMKL's VML square root, within
  1 ulp but not correctly rounded (about 0.6 % of float32 inputs differ from IEEE's), so
  the norms take their square root from :func:`ieee_sqrt`. Operations that could contract
  into a fused multiply-add inside one kernel (``addcmul``, ``lerp``, ``baddbmm``) are not
  used.

Maxima and minima are exact in any order, and gathers, casts of integers, ``floor`` and
``round`` are exact, so they are used freely. Nothing here depends on the number of rows.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from dplang.models import kernels, packed_int8
from dplang.models.memory import release_file_pages

__all__ = [
    "LIMB",
    "ONE_LIMB_LEVELS",
    "TWO_LIMB_LEVELS",
    "IntegerLinear",
    "PreparedRows",
    "exact_products",
    "exp",
    "fixed_point_sum",
    "gated",
    "gated_rows",
    "gelu_tanh",
    "hadamard",
    "int8_kernel_is_exact",
    "pow2",
    "product_kernel",
    "quantize_rows",
    "residual_rows",
    "rms_norm",
    "silu",
    "split_limbs",
    "sum_of_squares",
]

#: Base of the two-limb integer representation: ``v = hi * LIMB + lo``.
LIMB = 256
#: Largest magnitude of a two-limb integer: ``hi`` in [-127, 127] and ``lo`` in [-128, 127].
TWO_LIMB_LEVELS = 127 * LIMB
#: Largest magnitude of a one-limb (int8) integer.
ONE_LIMB_LEVELS = 127
#: Largest |limb|: products of two limbs are at most 2**14 in magnitude.
_LIMB_MAX = 128
#: Integers up to 2**24 are exact in float32; a float32 chunk of k products of limbs is exact
#: when k * 2**14 <= 2**24.
#: Output columns per integer product of :meth:`IntegerLinear.top_superset` (its int32
#: products stay in a core's cache for the bounds).
_HEAD_BOUND_CHUNK = 8192
_FLOAT32_CHUNK = 2**24 // (_LIMB_MAX * _LIMB_MAX)
#: Element budget of a block of :meth:`IntegerLinear.gathered` (its gathered weight limbs, their
#: float32 chunks, or the outputs of its full product): 2**24 elements are 16 MiB of int8 or
#: 64 MiB of float32, whatever the number of rows and candidates.
_GATHER_BUDGET = 2**24


# ------------------------------------------------------------------------ exact constructions


def pow2(exponents: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``2.0 ** exponents`` exactly, built from the bits of the float (no library function).
    Exponents must be in the normal range of ``dtype``."""
    if dtype == torch.float64:
        bias, shift, itype = 1023, 52, torch.int64
    elif dtype == torch.float32:
        bias, shift, itype = 127, 23, torch.int32
    else:
        raise ValueError(f"pow2 builds float32 or float64, not {dtype}")
    return torch.bitwise_left_shift(exponents.to(itype) + bias, shift).view(dtype)


def divide(x: torch.Tensor, number: float) -> torch.Tensor:
    """``x / number``, correctly rounded on every device.

    PyTorch's CUDA kernel divides a tensor by a host number as a multiplication by the
    number's rounded reciprocal, which differs from the division in the last bit for about
    one value in twenty when the number is not a power of two (e.g. 32,512 levels, a hidden
    size of 640); a CPU divides. A divisor that is a tensor on ``x``'s own device is divided
    on both, so the GPU computes the CPU definitions' bits (and its Triton kernels', which
    divide with ``div_rn``). Used for every division by a number in the exact path."""
    return x / x.new_full((), float(number))


def quantize_rows(x: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Round each row (last dimension) of float32 ``x`` to integers on its own scale.

    Returns ``(q, scale)``: ``q`` float32 with integer values in [-levels, levels] and
    ``x ~ q * scale``; ``scale`` (``[..., 1]``) is ``max|row| / levels``. Everything is a
    function of the row alone. A row whose scale is not a positive finite number (all zeros,
    a NaN or an infinity in it, or too small to scale) becomes zeros with scale 1, so that a
    multiplication by zero elsewhere can never produce NaN."""
    fused = kernels.lookup("quantize", x)
    if fused is not None and x.numel():
        return fused(x, levels)
    amax = x.abs().amax(dim=-1, keepdim=True)
    scale = divide(amax, levels)
    # A subnormal scale is rounded to a few significant bits, so |x / scale| could exceed
    # levels by half: such a row (largest magnitude below ~1e-34) counts as too small.
    usable = torch.isfinite(scale) & (scale >= torch.finfo(torch.float32).tiny)
    scale = torch.where(usable, scale, torch.ones_like(scale))
    # For a usable row every |x / scale| <= levels * (1 + 2**-23) < levels + 0.5.
    q = torch.where(usable, torch.round(x / scale), torch.zeros_like(x))
    return q, scale


def split_limbs(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two-limb split of integer-valued ``q`` (|q| <= :data:`TWO_LIMB_LEVELS`): ``hi`` in
    [-127, 127] and ``lo`` in [-128, 127] with ``q == hi * 256 + lo``, both integer-valued
    float tensors (every operation exact)."""
    hi = torch.floor((q + LIMB // 2) * (1.0 / LIMB))
    return hi, q - hi * LIMB


def sum_of_squares(x: torch.Tensor) -> torch.Tensor:
    """Sum of squares of each row of float32 ``x`` as float64 ``[..., 1]``: the squares are
    exact in float64 and :func:`fixed_point_sum` adds them in an order-free way."""
    x64 = x.double()
    return fixed_point_sum(x64 * x64, x.shape[-1])


def fixed_point_sum(values: torch.Tensor, max_terms: int) -> torch.Tensor:
    """Sum of each row (last dimension) of non-negative float64 ``values``, ``[..., 1]``.

    The row's values are rounded to integers on a power-of-two grid chosen from the row's
    maximum and from ``max_terms`` (a constant of the caller, never the number of values
    present, which may depend on other rows): the largest value becomes an integer below
    ``2**(52 - ceil(log2 max_terms))``, so every partial sum of at most ``max_terms`` terms is
    an integer below 2**52 and the sum is exact in any order. Relative precision: about
    ``max_terms * 2**-52`` of the row's largest value."""
    n = values.shape[-1]
    if n > max_terms:
        raise ValueError(f"{n} terms for a fixed-point sum of at most {max_terms}")
    if n == 0:
        return values.new_zeros((*values.shape[:-1], 1))
    top = values.amax(dim=-1, keepdim=True)
    # The binary exponent of the maximum from its bits (exact; normal float64 values only,
    # which squares of float32 numbers and weights in [0, 1] are). A zero row gets 1's.
    biased = torch.bitwise_right_shift(top.view(torch.int64), 52) & 0x7FF
    biased = torch.where(top > 0, biased, torch.full_like(biased, 1023))
    headroom = 52 - max(1, math.ceil(math.log2(max_terms)))
    # top < 2**(biased - 1022); scale it to below 2**headroom.
    shift = (headroom - (biased - 1022)).clamp(-1000, 1000)
    grid = pow2(shift, torch.float64)
    total = torch.round(values * grid).sum(dim=-1, keepdim=True)
    return total / grid


def ieee_sqrt(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded square root of every element (IEEE 754), on any device.

    On a CPU ``torch.sqrt`` is oneMKL's vector square root, accurate to 1 ulp but not
    correctly rounded; NumPy's is the processor's square-root instruction, which IEEE 754
    requires to be correctly rounded. CUDA's ``sqrt`` is correctly rounded by default."""
    if x.device.type != "cpu":
        return torch.sqrt(x)
    return torch.from_numpy(np.sqrt(x.detach().contiguous().numpy()))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x**2) + eps) * weight`` over the last dimension (``weight`` already in
    its final form, e.g. ``1 + w`` for Gemma), float32, with an order-free sum of squares."""
    fused = kernels.lookup("rms_norm", x)
    if fused is not None:
        return fused(x, weight, eps)
    mean = divide(sum_of_squares(x), x.shape[-1])
    inv = (1.0 / ieee_sqrt(mean + eps)).float()
    return x * inv * weight


# -------------------------------------------------------------- elementwise functions

_LOG2E = 1.4426950408889634
# ln 2 in two parts: _LN2_HI has few significant bits, so n * _LN2_HI is exact for |n| < 2**9.
_LN2_HI = 0.693359375
_LN2_LO = -2.12194440e-4
# Minimax coefficients of (exp(r) - 1 - r) / r**2 on [-ln2/2, ln2/2] (Cephes expf).
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
             1.6666665459e-1, 5.0000001201e-1)


def exp(x: torch.Tensor) -> torch.Tensor:
    """``e**x`` for float32 ``x`` from + - * and exact scaling only (about 1 ulp), the same bits
    for an element wherever and however it is computed. Inputs are clamped to [-87, 88]
    (results in the normal range); NaN stays NaN."""
    x = x.clamp(-87.0, 88.0)
    n = torch.round(x * _LOG2E)
    r = x - n * _LN2_HI
    r = r - n * _LN2_LO
    p = torch.full_like(r, _EXP_POLY[0])
    for c in _EXP_POLY[1:]:
        p = p * r
        p = p + c
    p = p * (r * r)
    p = p + r
    p = p + 1.0
    return p * pow2(torch.nan_to_num(n, nan=0.0), torch.float32)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """``1 / (1 + e**-x)`` with :func:`exp`."""
    return 1.0 / (exp(-x) + 1.0)


def tanh(x: torch.Tensor) -> torch.Tensor:
    """``tanh(x) = 2 sigmoid(2x) - 1`` with :func:`exp` (absolute error about 1e-7)."""
    return 2.0 * sigmoid(2.0 * x) - 1.0


_GELU_C = math.sqrt(2.0 / math.pi)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU, tanh approximation: ``0.5 x (1 + tanh(u)) = x * sigmoid(2u)``,
    ``u = sqrt(2/pi) (x + 0.044715 x**3)``."""
    inner = x * x
    inner = inner * x
    inner = inner * 0.044715
    inner = inner + x
    inner = inner * (2.0 * _GELU_C)
    return x / (exp(-inner) + 1.0)


def silu(x: torch.Tensor) -> torch.Tensor:
    """SiLU ``x * sigmoid(x)``."""
    return x / (exp(-x) + 1.0)


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """The unnormalised Walsh-Hadamard transform of each row of ``x`` (last dimension a power
    of two): ``x @ H`` with ``H`` the ±1 Sylvester matrix, by ``log2 d`` stages of elementwise
    additions and subtractions (each output element the same sequence of IEEE operations on
    its own row). ``hadamard(hadamard(x)) == d * x`` up to rounding. Used to spread a vector's
    outliers over all its coordinates before it is rounded to integers per vector."""
    d = x.shape[-1]
    if d & (d - 1):
        raise ValueError(f"the Hadamard transform needs a power-of-two length, got {d}")
    fused = kernels.lookup("hadamard", x)
    if x.dtype == torch.float32 and x.numel() and fused is not None:
        return fused(x)
    lead = x.shape[:-1]
    y = x.contiguous()
    half = 1
    while half < d:
        pairs = y.view(*lead, d // (2 * half), 2, half)
        first, second = pairs[..., 0, :], pairs[..., 1, :]
        y = torch.stack((first + second, first - second), dim=-2).view(*lead, d)
        half *= 2
    return y


def relu(x: torch.Tensor) -> torch.Tensor:
    """ReLU (a maximum: exact)."""
    return x.clamp(min=0.0)


_GATED = {"gelu_tanh": gelu_tanh, "silu": silu, "relu": relu}


def gated(kind: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``activation(gate) * up`` for a gated MLP (``kind``: gelu_tanh, silu or relu)."""
    fused = None if kind == "relu" else kernels.lookup(f"{kind}_mul", gate)
    if fused is not None:
        return fused(gate, up)
    return _GATED[kind](gate) * up


# ------------------------------------------------------------------------ integer products


@functools.cache
def int8_kernel_is_exact(device: str, k: int) -> bool:
    """Whether ``torch._int_mm`` on ``device`` computes exact int32 sums for reductions of
    length ``k`` over limbs (checked once per process on operands that make an int16
    intermediate saturate, as pre-VNNI x86 kernels do, and on random limbs, both operand
    orders, the right operand row-major and column-major). Where it does not,
    :func:`exact_products` uses float32 chunks instead."""
    if not hasattr(torch, "_int_mm"):
        return False
    dev = torch.device(device)
    rows = 32  # CUDA's int8 kernel needs more than 16 rows
    cols = 32
    gen = torch.Generator().manual_seed(k)
    patterns = [
        (torch.full((rows, k), 127), torch.full((k, cols), -128)),
        (torch.full((rows, k), -128), torch.full((k, cols), -128)),
        (torch.full((rows, k), 127), torch.full((k, cols), 127)),
        (torch.randint(-128, 128, (rows, k), generator=gen),
         torch.randint(-128, 128, (k, cols), generator=gen)),
    ]
    try:
        for a, b in patterns:
            for left, right in ((a, b), (b.t(), a.t())):
                want = left.double() @ right.double()
                a8 = left.to(torch.int8).contiguous().to(dev)
                b8 = right.to(torch.int8).contiguous().to(dev)
                # both layouts of the right operand (a library may choose its kernel by it;
                # IntegerLinear stores its weights column-major)
                for right8 in (b8, _column_major(b8)):
                    got = (_tn_int_mm(a8, right8) if dev.type == "cuda"
                           else torch._int_mm(a8, right8))
                    if not torch.equal(got.cpu().double(), want):
                        return False
    except (RuntimeError, NotImplementedError):
        return False
    return True


def product_kernel(device: str, k: int) -> str:
    """The kernel :class:`IntegerLinear` multiplies with on ``device`` for reductions of
    length ``k``: ``"int8"`` where ``torch._int_mm`` is exact (:func:`int8_kernel_is_exact`)
    and fast, else ``"float32"`` (exact float32 chunks). Both give the same integers, so this
    choice is about speed only and changes no bit.

    Fast means a GPU, or an x86 CPU with int8 dot products (AVX-512 VNNI, AVX-VNNI or
    AMX-INT8) that oneDNN may use (:func:`dplang.models.packed_int8.cpu_multiplies_int8_exactly`).
    On other CPUs ``torch._int_mm`` runs a generic loop: on an AMD EPYC (Zen 3, AVX2) it
    reached 1.8 GOP/s against float32's 50-110 (docs/benchmarks.md, "CPUs without int8 dot
    products"), and a ``make demo`` took ten minutes instead of one."""
    if torch.device(device).type == "cpu" and not packed_int8.cpu_multiplies_int8_exactly():
        return "float32"
    return "int8" if int8_kernel_is_exact(device, k) else "float32"


#: Shape classes ``(rows, K, N)`` (after the zero padding) for which CUDA's int8 kernel raised
#: ``CUBLAS_STATUS_NOT_SUPPORTED`` in this process: their products go to the float32 chunks at
#: once instead of failing again in cuBLASLt on every call.
_INT_MM_UNSUPPORTED: set[tuple[int, int, int]] = set()


def _padded_shape(rows: int, k: int, cols: int) -> tuple[int, int, int]:
    """The shape that :func:`_tn_int_mm` hands to CUDA's int8 kernel: more than 16 rows, and a
    reduction length and a column count that are multiples of 8."""
    return max(rows, 17), k + (-k % 8), cols + (-cols % 8)


def _column_major(t: torch.Tensor) -> torch.Tensor:
    """``t [K, N]`` as a column-major view (the ``.t()`` of a contiguous ``[N, K]`` tensor):
    the layout of the right operand of CUDA's int8 kernel. The same values; a copy is made
    only when ``t`` is not column-major already."""
    return t.t().contiguous().t()


def _tn_int_mm(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """``torch._int_mm`` on CUDA, whose kernel needs more than 16 rows and a reduction length
    and a column count that are multiples of 8: the operands are padded with zeros (a zero row,
    column or reduction term changes no other entry's integer sum) and the result cut back.

    The operands are handed over in the one layout cuBLASLt's int8 (IMMA) kernels support
    reliably, "TN": ``left`` row-major contiguous and ``right`` column-major (torch passes
    ``right`` to cuBLASLt as its first, transposed operand). Both operands row-major ("NN")
    fails with ``CUBLAS_STATUS_NOT_SUPPORTED`` on some GPUs and shapes (seen on an H100 at
    m 64 n 72 k 32; pytorch/pytorch#169956 on an A100). ``right`` is padded as its transpose,
    so a column-major ``right`` (IntegerLinear's weights on CUDA) is not copied when no padding
    is needed."""
    rows, k = left.shape
    cols = right.shape[1]
    pad_rows, pad_k, pad_cols = max(17 - rows, 0), -k % 8, -cols % 8
    if pad_rows or pad_k:
        left = torch.nn.functional.pad(left, (0, pad_k, 0, pad_rows))
    right_t = right.t()  # [N, K]
    if pad_k or pad_cols:
        right_t = torch.nn.functional.pad(right_t, (0, pad_k, 0, pad_cols))
    out = torch._int_mm(left.contiguous(), right_t.contiguous().t())
    return out[:rows, :cols] if pad_rows or pad_cols else out


def _padded_int_mm(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """The int8 kernel on CUDA (:func:`_tn_int_mm`: zero padding, "TN" layout).

    Last line of defence: if cuBLASLt still answers ``CUBLAS_STATUS_NOT_SUPPORTED`` for a shape,
    that product is computed with the exact float32 chunks of :func:`exact_products` instead
    (the same integers, so the same bits), and the padded shape class ``(rows, K, N)`` is
    remembered (:data:`_INT_MM_UNSUPPORTED`) so that it goes there directly from then on. Any
    other error is raised."""
    key = _padded_shape(left.shape[0], left.shape[1], right.shape[1])
    if key not in _INT_MM_UNSUPPORTED:
        try:
            return _tn_int_mm(left, right)
        except RuntimeError as exc:
            if "CUBLAS_STATUS_NOT_SUPPORTED" not in str(exc):
                raise
            _INT_MM_UNSUPPORTED.add(key)
    return _float32_products(left, right)


def exact_products(left: torch.Tensor, right: torch.Tensor, kernel: str) -> torch.Tensor:
    """``left @ right`` for int8 ``left [M, K]`` and ``right [K, N]`` as exact int32.

    ``kernel="int8"``: ``torch._int_mm`` (on CUDA with zero padding to the shapes its kernel
    needs, in its "TN" layout, falling back to the float32 chunks for a shape cuBLASLt does
    not support: :func:`_padded_int_mm`). ``kernel="float32"``: float32 products of
    chunks of at most :data:`_FLOAT32_CHUNK` along ``K``, each exact (every partial sum is an
    integer below 2**24), converted to int32 and added."""
    if kernel == "int8":
        if left.device.type == "cuda":
            return _padded_int_mm(left, right)
        return torch._int_mm(left, right)
    return _float32_products(left, right)


def packed_products(left: torch.Tensor, weight: packed_int8.PackedInt8Weight) -> torch.Tensor:
    """``left @ W^T`` for int8 ``left [M, K]`` and a packed weight, as float32 holding the
    exact integer sums (only for shapes its probe admitted:
    :func:`dplang.models.packed_int8.packed_products_are_exact`). The same integers as
    :func:`exact_products`; a consumer reads them with ``.float()`` or adds two of them in
    float32, which rounds their exact sum once, as int32 addition then ``.float()`` does."""
    return weight.padded_products(left)


def _float32_products(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """:func:`exact_products` with ``kernel="float32"``."""
    total: torch.Tensor | None = None
    for start in range(0, left.shape[1], _FLOAT32_CHUNK):
        stop = start + _FLOAT32_CHUNK
        part = (left[:, start:stop].float() @ right[start:stop].float()).to(torch.int32)
        total = part if total is None else total + part
    if total is None:
        return left.new_zeros((left.shape[0], right.shape[1]), dtype=torch.int32)
    return total


def prepare_rows(x: torch.Tensor) -> PreparedRows:
    """The rows of float32 ``x [M, K]`` as two 8-bit limbs each (:func:`quantize_rows` to
    :data:`TWO_LIMB_LEVELS`, then :func:`split_limbs`), high limbs first."""
    fused = kernels.lookup("quantize_limbs", x)
    if fused is not None:
        limbs, scale = fused(x, TWO_LIMB_LEVELS)
        return PreparedRows(limbs, scale, x.shape[0])
    q, scale = quantize_rows(x, TWO_LIMB_LEVELS)
    hi, lo = split_limbs(q)
    return PreparedRows(torch.cat([hi, lo]).to(torch.int8), scale, x.shape[0])


@dataclass(frozen=True)
class PreparedRows:
    """Rows rounded for :class:`IntegerLinear`: ``limbs`` int8 ``[2M, K]`` (the high limbs of
    the M rows, then their low limbs) and ``scale`` ``[M, 1]``."""

    limbs: torch.Tensor
    scale: torch.Tensor
    count: int


class IntegerLinear:
    """``y = x W^T + b`` with exact integer products (see the module docstring).

    The weight is rounded per output channel to integers of ``weight_bits`` bits (16: two
    limbs, equal to float32 to about 1e-5 relative; 8: one limb) at construction. Each call
    rounds every row of ``x`` to a 15-bit integer on the row's own scale (two limbs) and
    combines the exact int32 products with float32 operations in a fixed order:

    ``y = (hh * 2**16 + (lh + hl) * 2**8) * s_row * s_col`` (16-bit weights) or
    ``y = (hh * 2**8 + lh) * s_row * s_col`` (8-bit weights), then ``+ b``.

    ``release_source=True`` (a load that releases the float weights): each block of rows of
    ``weight``, once rounded, has its resident file pages dropped
    (:func:`dplang.models.memory.release_file_pages`; values unchanged), so a memory-mapped
    checkpoint is never resident whole.

    Privacy contract: row ``i`` of the result is a function of row ``i`` of ``x`` only, bit for
    bit, whatever the number of rows, their order or the kernel used."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                 weight_bits: int = 16, layout: str = "kn", stacked: bool | None = None,
                 release_source: bool = False) -> None:
        if weight_bits not in (8, 16):
            raise ValueError(f"weight bits must be 8 or 16, got {weight_bits}")
        if layout not in ("kn", "nk"):
            raise ValueError(f"layout must be 'kn' or 'nk', got {layout!r}")
        w = weight.detach()
        self.out_features, self.in_features = int(w.shape[0]), int(w.shape[1])
        self.weight_bits = weight_bits
        self.layout = layout
        self.device = w.device
        n, k = self.out_features, self.in_features
        levels = TWO_LIMB_LEVELS if weight_bits == 16 else ONE_LIMB_LEVELS
        count = 2 if weight_bits == 16 else 1
        # "kn": [K, N] int8 for x @ W^T; "nk": [N, K] (rows gatherable: embeddings, sparse head).
        # "stacked": the two limbs of 16-bit weights in one matrix, multiplied in one call
        # (the unused low x low block costs a quarter more arithmetic, one call less; the
        # same integers either way). Default: for the "nk" layout (the LM head).
        self.stacked = weight_bits == 16 and (layout == "nk" if stacked is None else stacked)
        rows = torch.empty((count, n, k), dtype=torch.int8, device=w.device)  # limb, channel
        self.col_scale = torch.empty(n, dtype=torch.float32, device=w.device)
        # Rounded by blocks of output channels (each channel is rounded on its own scale, so
        # the blocks change nothing; they bound the temporary float copies' memory).
        step = max(1, (1 << 22) // max(1, k))
        for start in range(0, n, step):
            q, scale = quantize_rows(w[start:start + step].float(), levels)
            self.col_scale[start:start + step] = scale[:, 0]
            parts = split_limbs(q) if weight_bits == 16 else (q,)
            for limb, part in enumerate(parts):
                rows[limb, start:start + step] = part.to(torch.int8)
            if release_source:  # the block's float pages, where a file's, are not read again
                release_file_pages(w[start:start + step])
        if self.stacked:
            if layout == "nk":
                self._stack = rows.view(2 * n, k)  # [2N, K]
                self.limbs = [self._stack[:n], self._stack[n:]]
            else:  # [K, 2N], column-major (see _place_kn_weights)
                self._stack = rows.view(2 * n, k).t()
                self.limbs = [self._stack[:, :n], self._stack[:, n:]]
        elif layout == "nk":
            self.limbs = [rows[limb] for limb in range(count)]
        else:  # [K, N] column-major views of the contiguous [N, K] limbs (no copy)
            self.limbs = [rows[limb].t() for limb in range(count)]
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.kernel = product_kernel(str(self.device), self.in_features)
        self._pack()

    def _pack(self) -> None:
        """Pack the weight limbs once for oneDNN's int8 matmul where that computes this
        shape's products exactly on this machine (:mod:`dplang.models.packed_int8`: a
        "kn" linear on a CPU, not stacked, at most 1,024 input features, admitted by its
        probe); ``self.packed`` holds one packed weight per limb, else ``None``. An extra copy
        of the weights: the limbs stay for the other uses (a move to another device)."""
        self.packed: list[packed_int8.PackedInt8Weight] | None = None
        if (self.layout != "kn" or self.stacked or self.device.type != "cpu"
                or self.kernel != "int8"
                or not packed_int8.packed_products_are_exact(self.in_features,
                                                             self.out_features)):
            return
        self.packed = [packed_int8.PackedInt8Weight(limb.t()) for limb in self.limbs]

    # -- weights as integers ------------------------------------------------------------

    def weight_rows(self, ids: torch.Tensor) -> list[torch.Tensor]:
        """The int8 limbs of output channels ``ids`` (``[..., K]`` each; layout "nk" only)."""
        if self.layout != "nk":
            raise ValueError("weight_rows needs the 'nk' layout")
        return [limb[ids] for limb in self.limbs]

    def dequantized_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 weight rows ``ids`` as the integers represent them (embedding lookups)."""
        limbs = self.weight_rows(ids)
        q = limbs[0].float()
        if len(limbs) == 2:
            q = q * LIMB + limbs[1].float()
        return q * self.col_scale[ids].unsqueeze(-1)

    def nbytes(self) -> int:
        """Bytes of the integer weights (the packed copies included)."""
        packed = sum(p.nbytes() for p in self.packed) if self.packed else 0
        if self.stacked:
            return self._stack.numel() * self._stack.element_size() + packed
        return sum(t.numel() * t.element_size() for t in self.limbs) + packed

    def __getstate__(self) -> dict[str, object]:
        """Pickled and copied without the packed weights (oneDNN's opaque tensors cannot be);
        they are packed again where the copy is made (:meth:`_pack`)."""
        state = dict(self.__dict__)
        state["packed"] = None
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._pack()

    def to(self, device: torch.device) -> IntegerLinear:
        """Move the weights to ``device`` (in place; the kernel is chosen again there).

        The "kn" layout's ``[K, N]`` limbs (and stacked matrix) are stored column-major
        (views of contiguous ``[N, K]`` tensors) on every device: on CUDA the right operand's
        layout of the int8 kernel there (:func:`_tn_int_mm`), so that no call copies them; on
        a CPU oneDNN's int8 products are 10-25 % faster with it (docs/benchmarks.md). The same
        integers either way."""
        self.device = torch.device(device)
        if self.layout == "kn":
            self._place_kn_weights()
        elif self.stacked:
            self._stack = self._stack.to(self.device)
            n = self.out_features
            self.limbs = [self._stack[:n], self._stack[n:]]
        else:
            self.limbs = [t.to(self.device) for t in self.limbs]
        self.col_scale = self.col_scale.to(self.device)
        if self.bias is not None:
            self.bias = self.bias.to(self.device)
        self.kernel = product_kernel(str(self.device), self.in_features)
        self._pack()
        return self

    def _place_kn_weights(self, column_major: bool | None = None) -> None:
        """The "kn" weights on ``self.device``: column-major (the default, as built) or
        row-major."""
        if column_major is None:
            column_major = True

        def place(t: torch.Tensor) -> torch.Tensor:
            if column_major:
                return t.t().contiguous().to(self.device).t()
            return t.to(self.device).contiguous()

        if self.stacked:
            self._stack = place(self._stack)
            n = self.out_features
            self.limbs = [self._stack[:, :n], self._stack[:, n:]]
        else:
            self.limbs = [place(t) for t in self.limbs]

    # -- products -----------------------------------------------------------------------

    def _mm(self, left: torch.Tensor, limb: torch.Tensor, index: int = 0) -> torch.Tensor:
        """Exact products of int8 ``left [M, K]`` with weight limb ``index`` (``limb``):
        ``[M, N]`` for the "kn" layout, ``[N, M]`` (the weight as the left operand) for "nk".
        int32, or float32 holding the same integers exactly where the limb is packed
        (:func:`packed_products`).

        On CUDA the right operand is handed over column-major (the int8 kernel's layout
        there): ``left.t()`` of the contiguous ``left`` is that already, with no copy."""
        if self.layout == "kn":
            if self.packed is not None and left.shape[0] <= packed_int8.MAX_ROWS:
                return packed_products(left, self.packed[index])
            return exact_products(left, limb, self.kernel)
        if left.device.type == "cuda":
            return exact_products(limb, left.t(), self.kernel)
        return exact_products(limb, left.t().contiguous(), self.kernel)

    def prepare(self, x: torch.Tensor) -> PreparedRows:
        """The rows of float32 ``x [M, K]`` as two-limb integers (shareable by every
        :class:`IntegerLinear` with the same input: q, k, v or gate, up)."""
        return prepare_rows(x)

    def integer_parts(self, rows: PreparedRows
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(high, low, low2)``: exact integer products (int32, or float32 holding them
        exactly where the weight is packed: :meth:`_mm`) with
        ``x W^T ~ (high * 2**s + low + low2) * row_scale * col_scale`` (``s`` is 16 or 8;
        ``low2`` only for 16-bit weights), ``[M, N]`` each, or ``[N, M]`` for the "nk"
        layout."""
        m, n = rows.count, self.out_features
        if self.stacked:
            both = self._mm(rows.limbs, self._stack)
            if self.layout == "kn":  # [2M, 2N]
                return both[:m, :n], both[m:, :n], both[:m, n:]
            return both[:n, :m], both[:n, m:], both[n:, :m]  # [2N, 2M]
        first = self._mm(rows.limbs, self.limbs[0])
        if self.layout == "kn":
            high, low = first[: rows.count], first[rows.count:]
        else:
            high, low = first[:, : rows.count], first[:, rows.count:]
        low2 = None
        if self.weight_bits == 16:
            low2 = self._mm(rows.limbs[: rows.count], self.limbs[1], 1)
        return high, low, low2

    def apply(self, rows: PreparedRows) -> torch.Tensor:
        """The outputs ``[M, N]`` for prepared rows."""
        fused_linear = kernels.lookup("linear", rows.limbs)
        if fused_linear is not None:  # products and combination in one kernel (a GPU)
            # the kernel reads "kn" limbs [K, N] with any strides: an "nk" weight's transpose
            # is such a view (the LM head, dense for the public rows), with no copy
            limbs = self.limbs if self.layout == "kn" else [t.t() for t in self.limbs]
            return fused_linear(rows.limbs, rows.scale, limbs[0],
                                limbs[1] if self.weight_bits == 16 else None,
                                self.col_scale, self.bias)
        high, low, low2 = self.integer_parts(rows)
        shift = float(LIMB) if self.weight_bits == 16 else 1.0
        fused = kernels.lookup("combine", high)
        if fused is not None:
            return fused(high, low, low2, rows.scale, self.col_scale, self.bias,
                         shift * LIMB, shift, transposed=self.layout == "nk")
        if low2 is not None:
            low = low + low2
        if self.layout == "nk":
            high, low = high.t(), low.t()
        return self.combine(high, low, rows.scale, self.col_scale, self.bias)

    def combine(self, high: torch.Tensor, low: torch.Tensor, row_scale: torch.Tensor,
                col_scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The fixed float32 formula that turns the exact integers into outputs (the same for
        the full product and for gathered columns, so both give the same bits)."""
        shift = float(LIMB) if self.weight_bits == 16 else 1.0
        y = high.float() * (row_scale * (shift * LIMB))
        y = y + low.float() * (row_scale * shift)
        y = y * col_scale
        if bias is not None:
            y = y + bias
        return y

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        y = self.apply(self.prepare(x.reshape(-1, self.in_features).float()))
        return y.reshape(*lead, self.out_features)

    def gathered(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Outputs of row ``i`` of ``x [M, K]`` on its own columns ``ids[i]`` (``[M, C]``
        int64): the same bits as ``self(x)[i, ids[i]]`` (layout "nk" only).

        The integer dot products are float32 sums of at most :data:`_FLOAT32_CHUNK` limb
        products per chunk (exact), so they equal the full product's integers. When the
        candidates are a large share of the columns (``4 C >= N``), the full product of a block
        of rows is computed instead and the candidates' columns are gathered from it (the same
        bits, by the above).

        Memory is bounded whatever ``M`` and ``C``: the rows (and, where one row's do not fit, the
        candidates) are processed in blocks whose gathered weight limbs and their float32
        chunks have at most :data:`_GATHER_BUDGET` elements each, and a block's full product
        at most that many outputs (its int32 integer parts a few times as many). The result
        does not depend on the blocking: each row's integers are exact sums of its own limbs,
        and the float32 formula that turns them into outputs is elementwise (:meth:`combine`),
        so a row gives the same bits in any block, alone or beside any other rows."""
        if self.layout != "nk":
            raise ValueError("gathered needs the 'nk' layout")
        rows, width = ids.shape
        x = x.reshape(rows, self.in_features)
        out = torch.empty((rows, width), dtype=torch.float32, device=x.device)
        if rows == 0 or width == 0:
            return out
        n, k = self.out_features, self.in_features
        if 4 * width >= n:
            step = max(1, _GATHER_BUDGET // n)
            for r0 in range(0, rows, step):
                full = self(x[r0:r0 + step])
                out[r0:r0 + step] = full.gather(1, ids[r0:r0 + step])
            return out
        fused = kernels.lookup("gathered_head", x)
        if fused is not None:  # exact int32 dot products straight from the weight rows
            prepared = prepare_rows(x.float())
            shift = float(LIMB) if self.weight_bits == 16 else 1.0
            return fused(prepared.limbs, prepared.scale, self.limbs[0],
                         self.limbs[1] if self.weight_bits == 16 else None, ids,
                         self.col_scale, self.bias, shift * LIMB, shift)
        col_step = min(width, max(1, _GATHER_BUDGET // k))
        row_step = max(1, _GATHER_BUDGET // (col_step * k))
        for r0 in range(0, rows, row_step):
            prepared = prepare_rows(x[r0:r0 + row_step].float())
            count = prepared.count
            hi = prepared.limbs[:count].float()
            lo = prepared.limbs[count:].float()
            for c0 in range(0, width, col_step):
                block = ids[r0:r0 + row_step, c0:c0 + col_step]
                out[r0:r0 + row_step, c0:c0 + col_step] = self._gathered_block(
                    hi, lo, prepared.scale, block)
        return out

    def top_superset(self, x: torch.Tensor, top_k: int, margin: float,
                     banned: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """For each row of float32 ``x [M, K]``: the ascending ids ``[M, W]`` (padded by the
        row's first id), sizes ``[M]`` and outputs ``[M, W]`` (the same bits as ``self(x)`` on
        those columns) of a set of columns that holds the ``top_k`` largest outputs and every
        column whose output is at least ``f32(ell - margin)`` (float32 subtraction), ``ell``
        the row's ``top_k``-th largest output, banned columns (bool ``[N]``) counted as -inf
        and never in the set; ``None`` where this cannot be computed more cheaply than every
        output (not a 16-bit "nk" head on a CPU with the compiled kernels, ``top_k`` outside
        ``1 .. N - 1 - banned``, a margin that is negative or NaN, bounds that are not finite,
        or a bound set larger than a quarter of the columns). ``margin`` is a float32 value
        (the rule's ``f32(2C/B)``): the thresholds are computed in float32 with it.

        How: the high-limb weights alone (half the weight bytes) give each output's exact
        integers but one, the low-limb weights times the row's high limbs, which an int8
        weight bounds by ``[-128 P - 127 N, 127 P + 128 N]`` (``P``, ``N``: the sums of the
        row's positive and negative high limbs). :meth:`combine`'s formula is non-decreasing
        in that integer (every scale is >= 0 and each float32 operation is monotone), so it
        gives a lower and an upper bound of each output in the very arithmetic the output is
        computed in. Every column whose output could reach the threshold has an upper bound
        >= ``f32(L_k - margin)``, ``L_k`` the k-th largest lower bound (<= ``ell``): the
        bound set. Of it, the exact outputs (as :meth:`gathered` computes them) are taken by
        decreasing upper bound until every column left has an upper bound below ``f32(e -
        margin)``, ``e`` the k-th largest exact output so far (<= ``ell``): a column left has
        an output below ``f32(ell - margin) <= ell``, so it is neither among the ``top_k``
        largest nor kept. Row ``i``'s set and outputs are a function of row ``i`` of ``x``
        only."""
        if self.layout != "nk" or self.weight_bits != 16 or self.device.type != "cpu":
            return None
        if self.in_features >= 2**16:  # a low integer of two int8 dot products within int32
            return None
        n = self.out_features
        blocked = 0 if banned is None else int(banned.sum())
        if not 0 < top_k < n - blocked:
            return None
        if not margin >= 0.0:  # a negative margin: f32(L_k - margin) > L_k could cut a top-k
            return None
        fused = kernels.lookup("top_superset", x)
        if fused is None:
            return None
        prepared = prepare_rows(x.reshape(-1, self.in_features).float())
        rows = prepared.count
        if rows == 0:
            return None
        weights = self.limbs[0]
        # Where the int8 kernel is not used (a CPU without int8 dot products), the compiled
        # int8 dot products read the weights once, not a float32 copy of each block of them
        # (the head is the largest weight; the same integers either way)
        direct = kernels.lookup("weight_products", x) if self.kernel == "float32" else None
        # [K, 2M] (high limbs, then low limbs): the right operand of the product kernel only
        right = prepared.limbs.t().contiguous() if direct is None else prepared.limbs

        def products(start: int, stop: int) -> torch.Tensor:
            if direct is not None:
                return direct(weights[start:stop], prepared.limbs)
            return exact_products(weights[start:stop], right, self.kernel)

        return fused(prepared.limbs, prepared.scale, products, self.limbs[1], n,
                     _HEAD_BOUND_CHUNK, self.col_scale, self.bias, float(LIMB * LIMB),
                     float(LIMB), top_k, margin, banned, n // 4)

    def _gathered_block(self, hi: torch.Tensor, lo: torch.Tensor, scale: torch.Tensor,
                        ids: torch.Tensor) -> torch.Tensor:
        """:meth:`gathered` for float32 limbs ``hi``, ``lo [B, K]`` of prepared rows with
        ``scale [B, 1]`` on columns ``ids [B, W]``."""
        limbs = self.weight_rows(ids)  # [B, W, K] int8 each
        k = self.in_features

        def dot(vec: torch.Tensor, limb: torch.Tensor) -> torch.Tensor:
            total: torch.Tensor | None = None
            for start in range(0, k, _FLOAT32_CHUNK):
                stop = start + _FLOAT32_CHUNK
                part = torch.bmm(limb[:, :, start:stop].float(),
                                 vec[:, start:stop].unsqueeze(-1))[..., 0].to(torch.int32)
                total = part if total is None else total + part
            assert total is not None
            return total

        high = dot(hi, limbs[0])
        low = dot(lo, limbs[0])
        if self.weight_bits == 16:
            low = low + dot(hi, limbs[1])
        bias = None if self.bias is None else self.bias[ids]
        return self.combine(high, low, scale, self.col_scale[ids], bias)


# ------------------------------------------------------------- a layer's chains, fused


def residual_rows(linear: IntegerLinear, rows: PreparedRows, h: torch.Tensor,
                  post_weight: torch.Tensor | None, post_eps: float,
                  norm_weight: torch.Tensor, norm_eps: float
                  ) -> tuple[torch.Tensor, PreparedRows]:
    """A residual branch's end and the next linear's input, as a decoder layer chains them:
    ``y = linear(rows)``, then ``y = rms_norm(y, post_weight, post_eps)`` (if ``post_weight``;
    Gemma's sandwich norms), ``h' = h + y``; returns ``(h', prepare_rows(rms_norm(h',
    norm_weight, norm_eps)))``.

    This composition of the functions above is the definition; on a CPU with the fused
    kernels the whole chain is one compiled loop per row (``residual_limbs``) from the
    linear's exact integer parts, with the same operations in the same order: the same bits.

    Privacy contract: row ``i`` of both results is a function of row ``i`` of ``rows`` and
    ``h`` only."""
    fused = kernels.lookup("residual_limbs", h) if linear.layout == "kn" else None
    if fused is not None and rows.count:
        high, low, low2 = linear.integer_parts(rows)
        shift = float(LIMB) if linear.weight_bits == 16 else 1.0
        h_out, limbs, scale = fused(high, low, low2, rows.scale, linear.col_scale,
                                    linear.bias, shift * LIMB, shift, h, post_weight,
                                    post_eps, norm_weight, norm_eps, TWO_LIMB_LEVELS)
        return h_out, PreparedRows(limbs, scale, rows.count)
    y = linear.apply(rows)
    if post_weight is not None:
        y = rms_norm(y, post_weight, post_eps)
    h = h + y
    return h, prepare_rows(rms_norm(h, norm_weight, norm_eps))


def gated_rows(kind: str, gate: IntegerLinear, up: IntegerLinear, rows: PreparedRows
               ) -> PreparedRows:
    """A gated MLP's inner rows, prepared for its down projection:
    ``prepare_rows(gated(kind, gate.apply(rows), up.apply(rows)))``.

    That composition is the definition; on a CPU with the fused kernels (``kind`` gelu_tanh
    or silu) the gate's and up's recombinations, the activation, the product and the rounding
    to limbs are one compiled loop per row (``gated_limbs``): the same bits.

    Privacy contract: row ``i`` of the result is a function of row ``i`` of ``rows`` only."""
    fused = kernels.lookup("gated_limbs", rows.limbs) if kind in ("gelu_tanh", "silu") else None
    if (fused is not None and gate.layout == up.layout == "kn" and rows.count
            and gate.weight_bits == up.weight_bits):
        shift = float(LIMB) if gate.weight_bits == 16 else 1.0
        limbs, scale = fused(kind, gate.integer_parts(rows), up.integer_parts(rows),
                             rows.scale, gate.col_scale, gate.bias, up.col_scale, up.bias,
                             shift * LIMB, shift, TWO_LIMB_LEVELS)
        return PreparedRows(limbs, scale, rows.count)
    return prepare_rows(gated(kind, gate.apply(rows), up.apply(rows)))

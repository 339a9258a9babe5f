"""Exact int8 products with weights prepacked once for oneDNN's int8 matmul (x86 CPUs).

``torch._int_mm`` on a CPU hands every call to oneDNN's generic int8 GEMM, which reorders the
weight operand on every call and does not use AMX tiles; oneDNN's matmul primitive with a
weight packed once (``torch.ops.onednn.qlinear_prepack``, the op PyTorch's x86 quantization
uses) runs the same products on AMX where the CPU has it and on VNNI otherwise: 1.2-2.2x
faster for the body's shapes on a Sapphire Rapids-class Xeon (docs/benchmarks.md).

What it computes must stay exact, since the guarantee rests on it (docs/privacy.md, "Prepacked
int8 products"):

* the operands are int8 limbs and int8 weights; oneDNN accumulates their products in int32, an
  exact integer sum whatever its order, tiling or thread split;
* the op returns float32, not int32: ``float32(acc) * 1.0 * 1.0`` (activation scale 1, weight
  scales 1, no zero points, no bias). Every integer of magnitude up to 2**24 is a float32,
  and ``|acc| <= K * 128 * 128``, so reductions of at most :data:`MAX_K` = 1024 terms come back
  as the exact integers. Longer reductions are not sent here;
* oneDNN's int8 kernels are exact only where the CPU multiplies int8 in hardware with int32
  accumulation (VNNI or AMX). On older ISAs, and when ``ONEDNN_MAX_CPU_ISA`` limits oneDNN
  below VNNI while PyTorch packed the weights for the real CPU, the products were seen to be
  wrong (not merely saturated). So the path is used only where the CPU reports VNNI or AMX,
  no environment variable limits oneDNN's ISA below them, and :func:`packed_products_are_exact`
  passed for the shape: extreme and random operands at row counts on both sides of every
  power of two up to :data:`MAX_ROWS` (the most limb rows a CPU call makes), compared with exact
  float64 sums. Anything else, including a call with more rows, uses ``torch._int_mm``.

Both paths give the same integers, so the choice changes no bit of any row.
``DPLANG_NO_PACKED_INT8=1`` turns this path off.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

__all__ = ["MAX_K", "MAX_ROWS", "PackedInt8Weight", "cpu_multiplies_int8_exactly",
           "packed_products_are_exact", "usable"]

#: Longest reduction sent to the packed path: ``K * 128 * 128 <= 2**24``, exact in float32.
MAX_K = 2**24 // (128 * 128)
#: Most rows of one packed call (the admission probes row counts up to it): a CPU forward call
#: holds at most 1,024 tokens, two limb rows each.
MAX_ROWS = 2048
#: ``ONEDNN_MAX_CPU_ISA`` values under which int8 products use VNNI or AMX.
_ISA_WITH_INT8_DOT = ("VNNI", "AMX", "AVX10")
_ONE = torch.tensor(1.0)
_ZERO = torch.tensor(0)


def _ops_present() -> bool:
    try:
        return hasattr(torch.ops.onednn, "qlinear_prepack") and hasattr(
            torch.ops.onednn, "qlinear_pointwise")
    except (AttributeError, RuntimeError):
        return False


@functools.cache
def cpu_multiplies_int8_exactly() -> bool:
    """Whether this CPU has int8 dot products with int32 accumulation (AVX-512 VNNI, AVX-VNNI
    or AMX-INT8, from ``/proc/cpuinfo``) and no environment variable limits oneDNN's ISA below
    them. Unknown (no ``/proc/cpuinfo``): no."""
    for var in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        limit = os.environ.get(var, "").strip().upper()
        if limit and limit not in ("ALL", "DEFAULT") and not any(
                name in limit for name in _ISA_WITH_INT8_DOT):
            return False
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags: set[str] = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
            break
    return bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8"})


def usable() -> bool:
    """Whether the packed path may be tried at all on this machine (the ops exist, the CPU and
    the environment allow it, ``DPLANG_NO_PACKED_INT8`` is not set)."""
    if os.environ.get("DPLANG_NO_PACKED_INT8", "") not in ("", "0"):
        return False
    return _ops_present() and cpu_multiplies_int8_exactly()


def _probe_rows() -> list[int]:
    """Row counts the admission tries: 1, and each power of two up to :data:`MAX_ROWS` with its
    neighbours (a library switches kernels at such sizes)."""
    counts = {1, 2, 3}
    power = 4
    while power <= MAX_ROWS:
        counts.update((power - 1, power, power + 1))
        power *= 2
    return sorted(c for c in counts if c <= MAX_ROWS)


@functools.cache
def packed_products_are_exact(k: int, n: int) -> bool:
    """Whether prepacked products of int8 ``[M, k]`` rows with an int8 ``[n, k]`` weight give
    the exact integers on this machine, for every probed row count ``M`` (see the module
    docstring); checked once per shape and process. False where the path is not
    :func:`usable`, ``k`` exceeds :data:`MAX_K`, or anything raises."""
    if not usable() or not 0 < k <= MAX_K or n <= 0:
        return False
    gen = torch.Generator().manual_seed(k * 7919 + n)
    tops = max(_probe_rows())
    # the largest sum (-128 * -128 each: 2**24 at k = 1024); an odd one just below it (one
    # term 127 * 127), which float32 could not hold if k allowed more than 2**24; random limbs
    odd_left = torch.full((tops, k), -128, dtype=torch.int8)
    odd_left[:, 0] = -127
    odd_w = torch.full((n, k), -128, dtype=torch.int8)
    odd_w[:, 0] = -127
    pairs = [(torch.full((tops, k), -128, dtype=torch.int8),
              torch.full((n, k), -128, dtype=torch.int8)),
             (odd_left, odd_w),
             (torch.randint(-128, 128, (tops, k), generator=gen, dtype=torch.int8),
              torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8))]
    try:
        for left, w in pairs:
            packed = PackedInt8Weight(w)
            want_all = left.double() @ w.double().t()
            for m in _probe_rows():
                got = packed.products(left[:m])
                if got.dtype != torch.float32 or not torch.equal(got.double(), want_all[:m]):
                    return False
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        return False
    return True


class PackedInt8Weight:
    """An int8 weight ``[N, K]`` packed once for oneDNN's int8 matmul.

    :meth:`products` returns ``left @ weight.T`` for int8 ``left [M, K]`` as float32 holding
    the exact integer sums (``K <= MAX_K``). Use it only for shapes that
    :func:`packed_products_are_exact` admitted; the caller checks.

    Privacy contract: row ``i`` of the result is the exact integer sums of row ``i`` of
    ``left`` with the weight: a function of that row alone."""

    def __init__(self, weight: torch.Tensor) -> None:
        if weight.dtype != torch.int8 or weight.dim() != 2:
            raise ValueError("a packed int8 weight is a 2-D int8 tensor [N, K]")
        self.out_features, self.in_features = int(weight.shape[0]), int(weight.shape[1])
        if self.in_features > MAX_K:
            raise ValueError(f"reductions of {self.in_features} terms may exceed 2**24 "
                             f"(at most {MAX_K})")
        self._packed = torch.ops.onednn.qlinear_prepack(weight.contiguous(),
                                                        [1, self.in_features])
        self._scales = torch.ones(self.out_features)
        self._zero_points = torch.zeros(self.out_features, dtype=torch.int64)

    def products(self, left: torch.Tensor) -> torch.Tensor:
        """``left [M, K] @ weight.T`` as float32 exact integers ``[M, N]``."""
        return torch.ops.onednn.qlinear_pointwise.tensor(
            left.contiguous(), _ONE, _ZERO, self._packed, self._scales, self._zero_points,
            None, 1.0, 0, torch.float32, "none", [], "")

    def nbytes(self) -> int:
        """Bytes of the packed weight (about the weight's own)."""
        return self.out_features * self.in_features

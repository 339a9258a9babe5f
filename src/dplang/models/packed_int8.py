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
  accumulation (VNNI or AMX), and PyTorch packs the weight for the real CPU whatever oneDNN is
  allowed to run: with ``ONEDNN_MAX_CPU_ISA=AVX2`` or ``AVX512_CORE`` the products were seen
  wrong (not merely saturated), and with a limit that keeps VNNI but not AMX oneDNN fell back
  to its reference kernel (exact, thousands of times slower). So the path is used only where
  the CPU reports VNNI or AMX, neither ``ONEDNN_MAX_CPU_ISA`` nor ``DNNL_MAX_CPU_ISA`` limits
  oneDNN at all, and :func:`packed_products_are_exact` passed for the weight's shape: extreme
  and random operands at every row count a call may use, compared with exact float64 sums.
  A call is padded with zero rows up to the next probed row count (:func:`padded_rows`; a zero
  row changes no other row's sums), so that no call runs a shape the probe did not; a call
  with more than :data:`MAX_ROWS` rows uses ``torch._int_mm`` (or the exact float32 chunks).

Both paths give the same integers, so the choice changes no bit of any row.
``DPLANG_NO_PACKED_INT8=1`` turns this path off.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

import torch

__all__ = ["MAX_K", "MAX_ROWS", "PackedInt8Weight", "cpu_multiplies_int8_exactly",
           "packed_products_are_exact", "padded_rows", "probed_rows", "usable"]

#: Longest reduction sent to the packed path: ``K * 128 * 128 <= 2**24``, exact in float32.
MAX_K = 2**24 // (128 * 128)
#: Most rows of one packed call (the admission probes row counts up to it): a CPU forward call
#: holds at most 1,024 tokens, two limb rows each.
MAX_ROWS = 2048
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
    or AMX-INT8, from ``/proc/cpuinfo``) and oneDNN may use all of its ISA (no
    ``ONEDNN_MAX_CPU_ISA`` or ``DNNL_MAX_CPU_ISA`` other than ``ALL``/``DEFAULT``: any limit
    may leave the weights packed for a kernel oneDNN then does not run). Unknown (no
    ``/proc/cpuinfo``): no."""
    for var in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        if os.environ.get(var, "").strip().upper() not in ("", "ALL", "DEFAULT"):
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


@functools.cache
def probed_rows() -> tuple[int, ...]:
    """The row counts the admission tries, and the only ones a packed call runs: 1 to 16, and
    from each power of two ``p`` up to :data:`MAX_ROWS` ``p - 1``, ``p``, ``p + 1``, ``5p/4``,
    ``3p/2`` and ``7p/4`` (a library switches kernels at such sizes; padding a call up to the
    next one costs at most a quarter more rows)."""
    counts = set(range(1, 17))
    power = 16
    while power <= MAX_ROWS:
        counts.update((power - 1, power, power + 1, power * 5 // 4, power * 3 // 2,
                       power * 7 // 4))
        power *= 2
    return tuple(sorted(c for c in counts if c <= MAX_ROWS))


def padded_rows(m: int) -> int:
    """The probed row count a call of ``m`` rows runs at (``m <= MAX_ROWS``)."""
    return next(c for c in probed_rows() if c >= m)


def packed_products_are_exact(k: int, n: int) -> bool:
    """Whether prepacked products of int8 ``[M, k]`` rows with an int8 ``[n, k]`` weight give
    the exact integers on this machine, for every probed row count ``M`` (see the module
    docstring); probed once per shape and thread count in a process, and a pass is kept on
    record (:func:`probe_record_key`). False where the path is not :func:`usable`, ``k``
    exceeds :data:`MAX_K`, or anything raises."""
    if not usable() or not 0 < k <= MAX_K or n <= 0:
        return False
    return _admitted(k, n, torch.get_num_threads())


@functools.cache
def _admitted(k: int, n: int, threads: int) -> bool:
    from dplang.models import records

    key = probe_record_key(k, n, threads)
    if records.verified_on_record(key):
        return True  # the same probe passed for this key before (DPLANG_RECHECK_...: never)
    admitted = _probe(k, n)
    if admitted:
        records.record_verification(key)  # a refusal is not recorded: it is probed again
    return admitted


def probe_record_key(k: int, n: int, threads: int) -> str:
    """The key under which a passed probe of shape ``(k, n)`` is kept on record (a small file
    in dplang's cache folder, beside the load-time check's records) and reused instead of
    probing again: everything that decides which kernel oneDNN runs and what it computes --
    the shape, the probed row counts and operands (this module's source, with the rest of the
    arithmetic's), the thread count, the CPU (model, family, flags, cache size, microcode,
    topology), the CPUs the process may use, the operating system's kernel release (which
    grants AMX), the library versions, the environment variables that steer kernels (as read
    at the probe), the Python and dplang versions. Under the same key the probe would run
    the same kernels on the same operands, so a recorded pass stands for the decision taken
    again; any change probes again, and so does ``DPLANG_RECHECK_INVARIANCE=1``."""
    import platform

    import dplang
    from dplang.models import records

    try:
        usable_cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable_cpus = None
    blob = json.dumps({"shape": [k, n], "rows": list(probed_rows()), "threads": threads,
                       "os": [platform.system(), platform.release()],
                       "cpus": [os.cpu_count(), usable_cpus],
                       "cpu": records.cpu_identity(), "python": platform.python_version(),
                       "dplang": dplang.__version__,
                       "backend_source": records.arithmetic_source_digest(),
                       "packages": records.package_versions(),
                       "environment": records.kernel_environment()}, sort_keys=True)
    return "packed-int8-" + hashlib.sha256(blob.encode()).hexdigest()[:32]


def _probe(k: int, n: int) -> bool:
    """Run the admission probe of shape ``(k, n)`` (see :func:`packed_products_are_exact`)."""
    gen = torch.Generator().manual_seed(k * 7919 + n)
    counts = probed_rows()
    tops = counts[-1]
    # the largest sum (-128 * -128 each: 2**24 at k = 1024); an odd one just below it (one
    # term 127 * 127), which float32 could not hold if k allowed more than 2**24; random limbs
    # at every probed row count, the extremes at the powers of two and their neighbours
    odd_left = torch.full((tops, k), -128, dtype=torch.int8)
    odd_left[:, 0] = -127
    odd_w = torch.full((n, k), -128, dtype=torch.int8)
    odd_w[:, 0] = -127
    edges = tuple(c for c in counts if c <= 3 or any(abs(c - 2**e) <= 1 for e in range(12)))
    cases = [(torch.full((tops, k), -128, dtype=torch.int8),
              torch.full((n, k), -128, dtype=torch.int8), edges),
             (odd_left, odd_w, edges),
             (torch.randint(-128, 128, (tops, k), generator=gen, dtype=torch.int8),
              torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8), counts)]
    try:
        for left, w, rows in cases:
            packed = PackedInt8Weight(w)
            want = left.double() @ w.double().t()  # the exact sums
            want_bits = want.float().view(torch.int32)  # their float32 bits, +0.0 for a zero
            for m in rows:
                got = packed.products(left[:m])
                if (got.dtype != torch.float32 or not torch.equal(got.double(), want[:m])
                        or not torch.equal(got.view(torch.int32), want_bits[:m])):
                    return False
    except Exception:  # any failure of the op means: not admitted
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
        self._scales = torch.ones(self.out_features, dtype=torch.float32)
        self._zero_points = torch.zeros(self.out_features, dtype=torch.int64)

    def products(self, left: torch.Tensor) -> torch.Tensor:
        """``left [M, K] @ weight.T`` as float32 exact integers ``[M, N]``, computed at
        exactly ``M`` rows (the probe's calls; :meth:`padded_products` for a model's)."""
        return torch.ops.onednn.qlinear_pointwise.tensor(
            left.contiguous(), _ONE, _ZERO, self._packed, self._scales, self._zero_points,
            None, 1.0, 0, torch.float32, "none", [], "")

    def padded_products(self, left: torch.Tensor) -> torch.Tensor:
        """:meth:`products` of ``left`` with zero rows appended up to :func:`padded_rows`
        (``M <= MAX_ROWS``), cut back to ``M`` rows: the call runs at a probed row count."""
        m = left.shape[0]
        rows = padded_rows(m)
        if rows != m:
            left = torch.cat([left, left.new_zeros((rows - m, left.shape[1]))])
        return self.products(left)[:m]

    def nbytes(self) -> int:
        """Bytes of the packed weight (about the weight's own)."""
        return self.out_features * self.in_features

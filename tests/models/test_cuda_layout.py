"""The operand layout of CUDA's int8 kernel, checked on the CPU (no GPU needed).

cuBLASLt's int8 (IMMA) kernels support the "TN" layout reliably and fail on "NN" for some GPUs
and shapes (``CUBLAS_STATUS_NOT_SUPPORTED`` from ``cublasLtMatmul`` on an H100, m 64 n 72 k
32). :func:`dplang.models.exact._padded_int_mm` must hand ``torch._int_mm`` a row-major
``left`` and a column-major ``right`` after its zero padding, fall back to the exact float32
chunks (the same integers) when cuBLASLt still refuses a shape, and IntegerLinear's "kn"
weights on CUDA are stored column-major so that no call copies them. ``torch._int_mm`` is
replaced here by a recorder that checks the layout and returns the exact product."""

from __future__ import annotations

import pytest
import torch

from dplang.models import exact

_NOT_SUPPORTED = ("CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul with "
                  "transpose_mat1 0 transpose_mat2 0 m 64 n 72 k 32 mat1_ld 64 mat2_ld 32 "
                  "result_ld 64 abType 3 cType 10 computeType 72 scaleType 10")


class _Recorder:
    """A stand-in for ``torch._int_mm`` that checks CUDA's operand constraints and layout."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __call__(self, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        self.calls.append((left, right))
        if self.fail:
            raise RuntimeError(_NOT_SUPPORTED)
        assert left.dtype == right.dtype == torch.int8
        (m, k), (k2, n) = left.shape, right.shape
        assert k == k2 and m > 16 and k % 8 == 0 and n % 8 == 0
        assert left.is_contiguous(), left.stride()  # row-major
        assert right.stride(0) == 1 and right.stride(1) == k, right.stride()  # column-major
        return (left.double() @ right.double()).int()


def _operands(m: int, k: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(m * 10007 + k * 101 + n)
    left = torch.randint(-128, 128, (m, k), generator=gen, dtype=torch.int8)
    right = torch.randint(-128, 128, (k, n), generator=gen, dtype=torch.int8)
    return left, right


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> _Recorder:
    fake = _Recorder()
    monkeypatch.setattr(torch, "_int_mm", fake)
    monkeypatch.setattr(exact, "_INT_MM_UNSUPPORTED", set())
    return fake


@pytest.mark.parametrize("m", [1, 5, 17, 72])
@pytest.mark.parametrize("k", [32, 30, 640])
@pytest.mark.parametrize("n", [64, 70])
@pytest.mark.parametrize("right_layout", ["row", "column"])
def test_padded_int_mm_hands_over_the_tn_layout(recorder: _Recorder, m: int, k: int, n: int,
                                                right_layout: str) -> None:
    left, right = _operands(m, k, n)
    if right_layout == "column":
        right = exact._column_major(right)
        assert right.stride(0) == 1 and torch.equal(right, _operands(m, k, n)[1])
    got = exact._padded_int_mm(left, right)
    assert got.shape == (m, n) and got.dtype == torch.int32
    assert torch.equal(got.long(), left.long() @ right.long())
    assert len(recorder.calls) == 1


def test_a_column_major_right_operand_is_not_copied(recorder: _Recorder) -> None:
    """No padding needed: both operands reach the kernel without a copy (the "kn" weights on
    CUDA, and the "nk" layout's ``left.t()`` of contiguous rows)."""
    left, right = _operands(24, 64, 40)
    right = exact._column_major(right)
    exact._padded_int_mm(left, right)
    (got_left, got_right), = recorder.calls
    assert got_left.data_ptr() == left.data_ptr()
    assert got_right.data_ptr() == right.data_ptr()
    rows = torch.randint(-128, 128, (16, 64), dtype=torch.int8)  # "nk": weight @ rows^T
    exact._padded_int_mm(left, rows.t())
    assert recorder.calls[-1][1].data_ptr() == rows.data_ptr()


def test_not_supported_falls_back_to_the_float32_chunks_once_per_shape(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _Recorder(fail=True)
    monkeypatch.setattr(torch, "_int_mm", fake)
    monkeypatch.setattr(exact, "_INT_MM_UNSUPPORTED", set())
    for m, k, n in ((64, 32, 72), (5, 2100, 70)):  # the second is longer than a float32 chunk
        left, right = _operands(m, k, n)
        right[:, 0] = -128
        left[0] = -128
        want = left.long() @ right.long()
        before = len(fake.calls)
        for _ in range(3):
            got = exact._padded_int_mm(left, right)
            assert got.dtype == torch.int32 and torch.equal(got.long(), want)
        assert len(fake.calls) == before + 1  # the shape class is not retried
        assert exact._padded_shape(m, k, n) in exact._INT_MM_UNSUPPORTED
    # 3 rows are padded to the shape class of 5 rows: not retried either
    left, right = _operands(3, 2100, 70)
    assert torch.equal(exact._padded_int_mm(left, right).long(), left.long() @ right.long())
    assert len(fake.calls) == 2


def test_other_errors_are_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch, "_int_mm", broken)
    monkeypatch.setattr(exact, "_INT_MM_UNSUPPORTED", set())
    left, right = _operands(20, 32, 8)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        exact._padded_int_mm(left, right)
    assert not exact._INT_MM_UNSUPPORTED
    # The load-time probe's call has no fallback: a refusal there means the float32 kernel.
    monkeypatch.setattr(torch, "_int_mm", _Recorder(fail=True))
    with pytest.raises(RuntimeError, match="CUBLAS_STATUS_NOT_SUPPORTED"):
        exact._tn_int_mm(left, right)


@pytest.mark.parametrize("bits", [16, 8])
@pytest.mark.parametrize("stacked", [True, False])
def test_kn_weights_stored_column_major_give_the_same_bits(bits: int, stacked: bool) -> None:
    """The "kn" weights are built column-major (views of contiguous ``[N, K]`` limbs, on every
    device: the int8 kernel's layout on CUDA, the faster one for oneDNN on a CPU); stored
    row-major instead, the integers and outputs do not change; the int8 kernel gets the
    column-major ones without a copy; moving to a device makes them column-major again."""
    gen = torch.Generator().manual_seed(bits + stacked)
    weight = torch.randn(48, 64, generator=gen)
    bias = torch.randn(48, generator=gen)
    x = torch.randn(21, 64, generator=gen)
    lin = exact.IntegerLinear(weight, bias, weight_bits=bits, layout="kn", stacked=stacked)
    for limb in lin.limbs:
        assert limb.stride(0) == 1 and limb.t().is_contiguous()
    want = lin(x)
    limbs = [t.clone() for t in lin.limbs]
    lin._place_kn_weights(column_major=False)
    for limb, before in zip(lin.limbs, limbs, strict=True):
        assert limb.shape == before.shape and limb.stride(1) == 1  # row-major
        assert torch.equal(limb, before)
    if lin.stacked:
        assert lin._stack.is_contiguous()
    for kernel in ("float32", lin.kernel):
        lin.kernel = kernel
        assert torch.equal(lin(x), want)
    lin.to(torch.device("cpu"))
    for limb, before in zip(lin.limbs, limbs, strict=True):
        assert limb.stride(0) == 1 and torch.equal(limb, before)
    if lin.stacked:
        assert lin._stack.stride(0) == 1 and lin._stack.t().is_contiguous()
    assert torch.equal(lin(x), want)
    with pytest.MonkeyPatch.context() as m:
        fake = _Recorder()
        m.setattr(torch, "_int_mm", fake)
        m.setattr(exact, "_INT_MM_UNSUPPORTED", set())
        prepared = lin.prepare(x[:12])  # 24 limb rows: no padding
        for kernel_right in ([lin._stack] if lin.stacked else lin.limbs):
            exact._padded_int_mm(prepared.limbs, kernel_right)
            assert fake.calls[-1][1].data_ptr() == kernel_right.data_ptr()

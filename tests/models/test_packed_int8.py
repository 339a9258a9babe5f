"""Products with weights packed once for oneDNN (dplang.models.packed_int8): the exact integers
where admitted, refused where they might not be, and the same bits through every consumer
(the fused kernels and the torch definitions) as the int32 products they replace."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from dplang.models import cpu_kernels, exact, packed_int8
from dplang.models.invariance import bitwise_equal

needs_packing = pytest.mark.skipif(not packed_int8.usable(),
                                   reason="no VNNI/AMX CPU or no oneDNN int8 ops here")


@pytest.fixture(autouse=True)
def _fresh_verdicts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test decides admission anew: the verdicts are cached per process, and passes are
    kept on record in dplang's cache folder (here one of the test's own)."""
    monkeypatch.setenv("DPLANG_CACHE_DIR", str(tmp_path / "cache"))
    packed_int8.cpu_multiplies_int8_exactly.cache_clear()
    packed_int8._admitted.cache_clear()
    yield
    packed_int8.cpu_multiplies_int8_exactly.cache_clear()
    packed_int8._admitted.cache_clear()


def _cpu_has_int8_dot() -> bool:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((set(line.split(":", 1)[1].split()) for line in text.splitlines()
                  if line.startswith("flags")), set())
    return bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8"})


def _torch_path(monkeypatch: pytest.MonkeyPatch, fn: Callable[[], object]) -> object:
    with monkeypatch.context() as m:
        m.setattr(cpu_kernels, "available", lambda tensor: False)
        return fn()


def _unpacked(lin: exact.IntegerLinear, fn: Callable[[], object]) -> object:
    kept, lin.packed = lin.packed, None
    try:
        return fn()
    finally:
        lin.packed = kept


def _same(a: object, b: object) -> None:
    if isinstance(a, tuple):
        assert isinstance(b, tuple)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
        return
    assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
    assert a.shape == b.shape and a.dtype == b.dtype
    nan = a.isnan() if a.is_floating_point() else torch.zeros_like(a, dtype=torch.bool)
    assert torch.equal(nan, b.isnan() if b.is_floating_point() else nan)
    assert bitwise_equal(a[~nan], b[~nan])


@needs_packing
@pytest.mark.parametrize("k", [1, 70, 640, packed_int8.MAX_K])
def test_packed_products_are_the_exact_integers(k: int) -> None:
    gen = torch.Generator().manual_seed(k)
    weight = torch.randint(-128, 128, (83, k), generator=gen, dtype=torch.int8)
    weight[0] = -128  # the extreme sums: -128 * -128 * K = 2**24 at K = 1024
    packed = packed_int8.PackedInt8Weight(weight)
    for m in (1, 2, 17, 64, 129, 700):
        left = torch.randint(-128, 128, (m, k), generator=gen, dtype=torch.int8)
        left[0] = -128
        got = packed.products(left)
        assert got.dtype == torch.float32 and got.shape == (m, 83)
        assert torch.equal(got.double(), left.double() @ weight.double().t())


@needs_packing
def test_a_row_is_the_same_bits_alone_and_among_others() -> None:
    gen = torch.Generator().manual_seed(3)
    packed = packed_int8.PackedInt8Weight(
        torch.randint(-128, 128, (300, 640), generator=gen, dtype=torch.int8))
    rows = torch.randint(-128, 128, (2048, 640), generator=gen, dtype=torch.int8)
    together = packed.products(rows)
    for i in (0, 1, 1000, 2047):
        assert bitwise_equal(packed.products(rows[i:i + 1])[0], together[i])


def test_admission_refuses_what_might_not_be_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    assert packed_int8.MAX_K == 1024
    assert not packed_int8.packed_products_are_exact(1025, 64)
    with pytest.raises(ValueError, match="2\\*\\*24"):
        packed_int8.PackedInt8Weight(torch.zeros(4, 1025, dtype=torch.int8))
    with pytest.raises(ValueError, match="int8"):
        packed_int8.PackedInt8Weight(torch.zeros(4, 8))
    monkeypatch.setenv("DPLANG_NO_PACKED_INT8", "1")
    assert not packed_int8.usable()
    assert not packed_int8.packed_products_are_exact(640, 64)
    monkeypatch.delenv("DPLANG_NO_PACKED_INT8")
    # oneDNN limited below VNNI (wrong products seen) or below AMX (its reference kernel
    # seen, 4,000 times slower): any limit at all
    for isa in ("AVX2", "avx512_core", "SSE41", "AVX512_CORE_VNNI", "AVX2_VNNI",
                "AVX10_1_512", "AVX512_CORE_AMX"):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
        packed_int8.cpu_multiplies_int8_exactly.cache_clear()
        assert not packed_int8.cpu_multiplies_int8_exactly()
    for isa in ("ALL", "default", ""):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
        packed_int8.cpu_multiplies_int8_exactly.cache_clear()
        assert packed_int8.cpu_multiplies_int8_exactly() == _cpu_has_int8_dot()
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "AVX2")
    packed_int8.cpu_multiplies_int8_exactly.cache_clear()
    assert not packed_int8.cpu_multiplies_int8_exactly()


@needs_packing
def test_the_probe_rejects_a_kernel_wrong_at_one_row_count(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel that is exact except at one size (a library switching implementations at a
    row count) is not admitted; the same kernel, right, is."""
    assert packed_int8.packed_products_are_exact(70, 50)
    right = packed_int8.PackedInt8Weight.products

    def wrong_at_257(self: packed_int8.PackedInt8Weight, left: torch.Tensor) -> torch.Tensor:
        out = right(self, left)
        if left.shape[0] == 257:
            out[-1, -1] += 1
        return out

    monkeypatch.setattr(packed_int8.PackedInt8Weight, "products", wrong_at_257)
    # a monkeypatched kernel does not change the record's key: probe again regardless (the
    # per-test cache folder holds the pass of the first call above)
    monkeypatch.setenv("DPLANG_RECHECK_INVARIANCE", "1")
    packed_int8._admitted.cache_clear()
    assert not packed_int8.packed_products_are_exact(70, 50)
    lin = exact.IntegerLinear(torch.randn(50, 70), weight_bits=8)
    assert lin.packed is None  # and so the linear keeps torch._int_mm


@needs_packing
def test_the_probe_alone_refuses_reductions_longer_than_float32_holds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With the bound lifted, the probe's odd extreme sum (above 2**24 for K > 1024) is
    rounded by float32, and the shape is refused."""
    monkeypatch.setattr(packed_int8, "MAX_K", 4096)
    assert packed_int8.packed_products_are_exact(1024, 40)
    assert not packed_int8.packed_products_are_exact(1025, 40)


@needs_packing
def test_a_passed_probe_is_on_record_under_everything_that_decides_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass is kept on record and reused by a later process (not probed again) only under
    the same key: another thread count, CPU, library version, kernel environment variable or
    arithmetic source probes again, as does DPLANG_RECHECK_INVARIANCE=1; a refusal is not
    kept (it is probed again)."""
    from dplang.models import records

    probes: list[tuple[int, int]] = []
    real_probe = packed_int8._probe

    def counted(k: int, n: int) -> bool:
        probes.append((k, n))
        return real_probe(k, n)

    monkeypatch.setattr(packed_int8, "_probe", counted)

    def new_process() -> bool:
        packed_int8._admitted.cache_clear()
        return packed_int8.packed_products_are_exact(70, 50)

    assert new_process() and probes == [(70, 50)]
    assert new_process() and probes == [(70, 50)]  # on record: not probed again
    key = packed_int8.probe_record_key(70, 50, torch.get_num_threads())
    assert (records.record_folder() / f"{key}.json").is_file()
    changes = {
        "threads": lambda m: m.setattr(torch, "get_num_threads", lambda: 7),
        "cpu": lambda m: m.setattr(records, "cpu_identity", lambda: "another CPU"),
        "library": lambda m: m.setattr(records, "package_versions",
                                       lambda: {"torch": "0.0"}),
        "environment": lambda m: m.setenv("ONEDNN_DEFAULT_FPMATH_MODE", "BF16"),
        "source": lambda m: m.setattr(records, "arithmetic_source_digest", lambda: "other"),
        "kernel release": lambda m: m.setattr("platform.release", lambda: "0.0-other"),
        "cpus": lambda m: m.setattr(os, "cpu_count", lambda: 97),
        "recheck": lambda m: m.setenv(records.RECHECK_ENV, "1"),
    }
    for name, change in changes.items():
        with monkeypatch.context() as m:
            change(m)
            before = len(probes)
            assert new_process(), name
            assert len(probes) == before + 1, f"{name}: the record was reused"
    for content in ("", "[]", '{"verified": false}', "{"):  # no pass: probed again
        (records.record_folder() / f"{key}.json").write_text(content)
        before = len(probes)
        assert new_process() and len(probes) == before + 1, content
    monkeypatch.setattr(packed_int8, "_probe", lambda k, n: probes.append((k, n)) or False)
    assert not packed_int8.packed_products_are_exact(71, 50)
    packed_int8._admitted.cache_clear()
    assert not packed_int8.packed_products_are_exact(71, 50)
    assert probes[-2:] == [(71, 50), (71, 50)]  # a refusal is probed again


def test_only_kn_linears_on_the_cpu_within_the_bound_are_packed() -> None:
    expect = packed_int8.usable()
    assert (exact.IntegerLinear(torch.randn(50, 70), weight_bits=8).packed is not None) == expect
    assert (exact.IntegerLinear(torch.randn(50, 70)).packed is not None) == expect
    assert exact.IntegerLinear(torch.randn(50, 70), layout="nk").packed is None
    assert exact.IntegerLinear(torch.randn(50, 70), stacked=True).packed is None
    assert exact.IntegerLinear(torch.randn(20, packed_int8.MAX_K + 8)).packed is None


@needs_packing
@pytest.mark.parametrize("bits", [16, 8])
@pytest.mark.parametrize("kernels", [True, False])
def test_every_consumer_gives_the_bits_of_the_int32_products(
        monkeypatch: pytest.MonkeyPatch, bits: int, kernels: bool) -> None:
    """apply, residual_rows, gated_rows on float32 parts (packed) and int32 parts (unpacked):
    the same bits, with the fused kernels and with the torch definitions (the sum of two
    float32 parts, 16-bit weights' ``low + low2``, rounds once, as int32 addition then a cast
    does). Most rows share the weights' sign pattern, so that their parts reach 2**23."""
    from dplang.models.decoder import Layer, Norm, qkv_step

    gen = torch.Generator().manual_seed(bits)
    width = 640
    signs = torch.randn(width, generator=gen).sign()
    x = signs * (1 + 0.01 * torch.randn(37, width, generator=gen))
    x[:5] = torch.randn(5, width, generator=gen) * 3
    x[0] = 0.0
    x[1, 3] = float("nan")
    rows = exact.prepare_rows(x)
    gate = exact.IntegerLinear(signs.expand(96, width) * (2 - 0.1 * torch.rand(96, width,
                                                                         generator=gen)),
                               torch.randn(96, generator=gen), weight_bits=bits)
    up = exact.IntegerLinear(torch.randn(96, width, generator=gen), None, weight_bits=bits)
    out = exact.IntegerLinear(torch.randn(96, width, generator=gen), None, weight_bits=bits)
    assert gate.packed is not None and up.packed is not None and out.packed is not None
    parts = gate.integer_parts(rows)
    assert parts[0].dtype == torch.float32
    assert float(parts[0].abs().max()) > 2**23
    h = torch.randn(37, 96, generator=gen)
    norm_w = torch.randn(96, generator=gen)
    heads, dim = 1, 32
    layer = Layer(qkv=gate, o=None, gate=None, up=None, down=None,  # type: ignore[arg-type]
                  input_norm=None, post_attention_norm=None,  # type: ignore[arg-type]
                  pre_mlp_norm=None, post_mlp_norm=None,  # type: ignore[arg-type]
                  q_norm=Norm(torch.randn(dim, generator=gen), 1e-6), k_norm=None,
                  window=None, scaling=1.0, softcap=None, rope="default")
    angles = torch.rand(37, dim, generator=gen, dtype=torch.float64) * 100
    cos, sin = torch.cos(angles).float(), torch.sin(angles).float()

    def run() -> tuple[torch.Tensor, ...]:
        from dplang.models import attention

        h_out, prepared = exact.residual_rows(out, rows, h, None, 1e-6, norm_w, 1e-5)
        inner = exact.gated_rows("gelu_tanh", gate, up, rows)
        cache = attention.SlotCache(num_layers=1, kv_heads=1, head_dim=dim, block=64,
                                    device=torch.device("cpu"))
        cache.allocate()
        cache.reserve(37)
        q = qkv_step(layer, rows, heads, 1, dim, cos, sin, True, cache, 0,
                     torch.zeros(37, dtype=torch.int64), torch.arange(37))
        return (gate.apply(rows), h_out, prepared.limbs, prepared.scale, inner.limbs,
                inner.scale, q, cache.keys[0], cache.values[0])

    def both() -> tuple[object, object]:
        packed = run()

        def unpacked() -> object:
            return _unpacked(gate, lambda: _unpacked(up, lambda: _unpacked(out, run)))
        return packed, unpacked()

    packed, unpacked = both() if kernels else _torch_path(monkeypatch, both)  # type: ignore[misc]
    _same(packed, unpacked)


@needs_packing
def test_a_call_runs_only_at_a_probed_row_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls are padded with zero rows up to the next row count the probe tried; the rows'
    sums are unchanged, and the padding is at most a quarter of the rows (from 16 on)."""
    counts = packed_int8.probed_rows()
    assert counts[:16] == tuple(range(1, 17)) and counts[-1] == packed_int8.MAX_ROWS
    for m in range(1, packed_int8.MAX_ROWS + 1):
        padded = packed_int8.padded_rows(m)
        assert padded in counts and m <= padded <= max(16, m * 5 // 4 + 1)
    seen: list[int] = []
    right = packed_int8.PackedInt8Weight.products

    def recording(self: packed_int8.PackedInt8Weight, left: torch.Tensor) -> torch.Tensor:
        seen.append(left.shape[0])
        return right(self, left)

    lin = exact.IntegerLinear(torch.randn(40, 64), weight_bits=8)
    assert lin.packed is not None
    rows = exact.prepare_rows(torch.randn(150, 64))  # 300 limb rows: run at 320
    want = _unpacked(lin, lambda: lin.apply(rows))
    monkeypatch.setattr(packed_int8.PackedInt8Weight, "products", recording)
    got = lin.apply(rows)
    assert seen == [320] and got.shape == (150, 40)
    _same(got, want)


def test_turning_the_path_off_later_in_a_process_holds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """DPLANG_NO_PACKED_INT8 set after a shape's verdict was cached still keeps new linears
    unpacked (it is read at each packing), and a pickled or copied linear packs again where
    the copy is made (oneDNN's packed tensors cannot be pickled), with the same bits."""
    import copy
    import pickle

    first = exact.IntegerLinear(torch.randn(40, 64), weight_bits=8)
    rows = exact.prepare_rows(torch.randn(9, 64))
    for twin in (pickle.loads(pickle.dumps(first)), copy.deepcopy(first)):
        assert (twin.packed is not None) == (first.packed is not None)
        _same(twin.apply(rows), first.apply(rows))
    monkeypatch.setenv("DPLANG_NO_PACKED_INT8", "1")
    assert exact.IntegerLinear(torch.randn(40, 64), weight_bits=8).packed is None
    assert pickle.loads(pickle.dumps(first)).packed is None


@needs_packing
def test_more_rows_than_the_probe_saw_use_the_int32_kernel(
        monkeypatch: pytest.MonkeyPatch) -> None:
    lin = exact.IntegerLinear(torch.randn(40, 64), weight_bits=8)
    assert lin.packed is not None
    monkeypatch.setattr(packed_int8, "MAX_ROWS", 8)
    rows = exact.prepare_rows(torch.randn(5, 64))  # 10 limb rows
    assert lin.integer_parts(rows)[0].dtype == torch.int32
    monkeypatch.setattr(packed_int8, "MAX_ROWS", 2048)
    assert lin.integer_parts(rows)[0].dtype == torch.float32


def test_the_reference_arithmetic_packs_nothing(tiny_gemma_dir: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The load-time check's fallback (no fast paths) drops the packed weights too, and the
    choice of the path is part of the check's record key."""
    from dplang.models import records
    from dplang.models.transformers import TransformersModel

    model = TransformersModel(tiny_gemma_dir, threads=2, block_size=4, check_invariance=False)
    mine = model._decoder._linears()
    assert all((m.packed is not None) == packed_int8.usable() for m in mine
               if m.layout == "kn")
    monkeypatch.setattr(cpu_kernels, "disable", lambda: None)  # not for the other tests
    model.use_reference_arithmetic()
    assert all(m.packed is None and m.kernel == "float32" for m in mine)
    assert "DPLANG_NO_PACKED_INT8" in records._KERNEL_ENV_NAMES

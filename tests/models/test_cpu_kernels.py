"""The fused CPU kernels give the bits of the torch definitions they replace, element by element
(random, extreme and non-finite inputs), and so do whole models run with and without them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from dplang.models import attention, cpu_kernels, exact
from dplang.models.invariance import bitwise_equal
from dplang.models.transformers import RowDecodeState, TransformersModel

pytestmark = pytest.mark.skipif(not cpu_kernels.available(torch.zeros(1)),
                                reason="numba is not installed")


def _torch_path(monkeypatch: pytest.MonkeyPatch, fn: Callable[[], object]) -> object:
    with monkeypatch.context() as m:
        m.setattr(cpu_kernels, "available", lambda tensor: False)
        return fn()


def _nasty(rows: int, width: int, seed: int) -> torch.Tensor:
    """Rows of ordinary, huge, tiny, zero and non-finite values."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=gen)
    x[0] = 0.0
    x[1] *= 1e30
    x[2] *= 1e-38
    x[3, 5] = float("nan")
    x[4, 7] = float("inf")
    x[5, :3] = torch.tensor([-0.0, 1e-45, -3e38])
    x[6] *= torch.rand(width, generator=gen) ** 20 * 1e5  # outliers
    return x


def _same(a: object, b: object) -> None:
    if isinstance(a, tuple):
        assert isinstance(b, tuple)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
        return
    assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
    assert a.shape == b.shape and a.dtype == b.dtype
    assert bitwise_equal(a, b), float((a.double() - b.double()).abs().nan_to_num().max())


@pytest.mark.parametrize("levels", [exact.TWO_LIMB_LEVELS, 127, 512])
def test_quantize(monkeypatch: pytest.MonkeyPatch, levels: int) -> None:
    x = _nasty(9, 70, 1)
    _same(exact.quantize_rows(x, levels), _torch_path(monkeypatch,
                                                      lambda: exact.quantize_rows(x, levels)))
    fast = exact.prepare_rows(x)
    slow = _torch_path(monkeypatch, lambda: exact.prepare_rows(x))
    _same((fast.limbs, fast.scale), (slow.limbs, slow.scale))


@pytest.mark.parametrize("bits", [16, 8])
@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_integer_linear(monkeypatch: pytest.MonkeyPatch, bits: int, layout: str) -> None:
    gen = torch.Generator().manual_seed(bits)
    weight = torch.randn(300, 70, generator=gen)
    bias = torch.randn(300, generator=gen)
    lin = exact.IntegerLinear(weight, bias, weight_bits=bits, layout=layout)
    x = _nasty(9, 70, 2)
    _same(lin(x), _torch_path(monkeypatch, lambda: lin(x)))
    if layout == "nk":  # the gathered head equals the dense head on its columns
        ids = torch.randint(0, 300, (9, 11), generator=gen)
        finite = torch.isfinite(lin(x)).all(dim=1)
        _same(lin.gathered(x, ids)[finite], lin(x).gather(1, ids)[finite])


def test_rms_norm(monkeypatch: pytest.MonkeyPatch) -> None:
    x = _nasty(9, 640, 3)
    w = torch.randn(640)
    _same(exact.rms_norm(x, w, 1e-6), _torch_path(monkeypatch,
                                                  lambda: exact.rms_norm(x, w, 1e-6)))


@pytest.mark.parametrize("shape", [(9, 256), (3, 5, 64), (2, 1)])
def test_hadamard(monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...]) -> None:
    x = _nasty(9, 256, 5).reshape(-1)[: torch.Size(shape).numel()].reshape(shape)
    _same(exact.hadamard(x), _torch_path(monkeypatch, lambda: exact.hadamard(x)))
    before = x.clone()
    exact.hadamard(x)
    _same(x, before)  # the input is not changed


@pytest.mark.parametrize("rotate", [False, True])
@pytest.mark.parametrize("dim", [64, 256])
def test_rotary(monkeypatch: pytest.MonkeyPatch, rotate: bool, dim: int) -> None:
    """The decoder's rotary embedding (and Hadamard transform) of every head, on a strided view
    of a wider row as the decoder passes it (the queries of a fused q/k/v product)."""
    from dplang.models.decoder import rotary

    tokens, heads = 9, 3
    wide = _nasty(tokens, (heads + 2) * dim, 6)
    x = wide[:, dim: dim + heads * dim].reshape(tokens, heads, dim)  # not contiguous
    assert not x.is_contiguous()
    gen = torch.Generator().manual_seed(dim)
    angles = torch.rand(tokens, dim, generator=gen, dtype=torch.float64) * 100
    cos, sin = torch.cos(angles).float(), torch.sin(angles).float()
    cos[2, 0], sin[3, 1] = float("nan"), float("inf")
    _same(rotary(x, cos, sin, rotate),
          _torch_path(monkeypatch, lambda: rotary(x, cos, sin, rotate)))
    before = x.clone()
    rotary(x, cos, sin, rotate)
    _same(x.contiguous(), before)  # the input is not changed


@pytest.mark.parametrize("kind", ["gelu_tanh", "silu"])
def test_gated(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    gate = _nasty(9, 300, 4) * 10
    gate[7] = torch.linspace(-100, 100, 300)
    up = torch.randn(9, 300)
    _same(exact.gated(kind, gate, up), _torch_path(monkeypatch,
                                                   lambda: exact.gated(kind, gate, up)))


def _prepared_like_a_layer(width: int, seed: int) -> exact.PreparedRows:
    """Prepared rows of extreme inputs (zero, huge, tiny, non-finite, outliers)."""
    return exact.prepare_rows(_nasty(9, width, seed))


@pytest.mark.parametrize("bits", [16, 8])
@pytest.mark.parametrize("post", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_residual_rows(monkeypatch: pytest.MonkeyPatch, bits: int, post: bool,
                       bias: bool) -> None:
    """A residual branch's end and the next linear's rows in one pass: the same bits as the
    chain of definitions (combine, post norm, residual sum, norm, rounding to limbs), on
    rows whose inputs and residuals are extreme and non-finite."""
    gen = torch.Generator().manual_seed(bits + 2 * post + 4 * bias)
    lin = exact.IntegerLinear(torch.randn(96, 70, generator=gen),
                              torch.randn(96, generator=gen) if bias else None,
                              weight_bits=bits)
    rows = _prepared_like_a_layer(70, 11)
    h = _nasty(9, 96, 12).flip(0) * 3  # extremes on other rows than the inputs'
    post_w = torch.randn(96, generator=gen) if post else None
    norm_w = torch.randn(96, generator=gen)

    def run() -> tuple[torch.Tensor, ...]:
        h_out, prepared = exact.residual_rows(lin, rows, h, post_w, 1e-6, norm_w, 1e-5)
        return h_out, prepared.limbs, prepared.scale

    fast = run()
    slow = _torch_path(monkeypatch, run)
    assert isinstance(slow, tuple)
    # Where both summands of h + y are NaN, IEEE 754 leaves open which NaN the sum carries
    # (x86 returns its first operand, and compilers order a commutative sum freely): the
    # residual may differ from the definition's in NaN payloads only. Nothing reads them: a
    # NaN row becomes zeros at its next rounding to limbs (the limbs below, compared bit for
    # bit) and the final norm's NaN hidden states reach the head the same way.
    _same(_canonical_nans(fast[0]), _canonical_nans(slow[0]))
    _same(fast[1:], slow[1:])
    assert fast[0].isnan().any() and fast[1].abs().sum() > 0  # the extremes reached the end


def _canonical_nans(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x.isnan(), torch.full_like(x, float("nan")), x)


@pytest.mark.parametrize("bits", [16, 8])
@pytest.mark.parametrize("kind", ["gelu_tanh", "silu"])
def test_gated_rows(monkeypatch: pytest.MonkeyPatch, bits: int, kind: str) -> None:
    """The gate's and up's recombinations, the activation, their product and the rounding to
    limbs in one pass: the same bits as the chain of definitions."""
    gen = torch.Generator().manual_seed(bits)
    gate = exact.IntegerLinear(torch.randn(300, 70, generator=gen) * 3,
                               torch.randn(300, generator=gen), weight_bits=bits)
    up = exact.IntegerLinear(torch.randn(300, 70, generator=gen), None, weight_bits=bits)
    rows = _prepared_like_a_layer(70, 13)

    def run() -> tuple[torch.Tensor, ...]:
        prepared = exact.gated_rows(kind, gate, up, rows)
        return prepared.limbs, prepared.scale

    _same(run(), _torch_path(monkeypatch, run))


@pytest.mark.parametrize("bits", [16, 8])
@pytest.mark.parametrize("norms", [True, False])
@pytest.mark.parametrize("rotate", [True, False])
def test_qkv_step(monkeypatch: pytest.MonkeyPatch, bits: int, norms: bool,
                  rotate: bool) -> None:
    """From a layer's prepared rows to its rotated queries and the keys and values it stores,
    in one pass: the same query bits, and the same integers and scales in the store (every
    slot and position, written or not), as the chain of definitions (product, q/k norms,
    rotation, SlotCache.write)."""
    from dplang.models.decoder import Layer, Norm, qkv_step

    heads, kv_heads, dim, tokens = 3, 2, 64, 9
    gen = torch.Generator().manual_seed(bits + 2 * norms + 4 * rotate)
    width = (heads + 2 * kv_heads) * dim
    qkv = exact.IntegerLinear(torch.randn(width, 70, generator=gen),
                              torch.randn(width, generator=gen), weight_bits=bits)
    q_norm = Norm(torch.randn(dim, generator=gen), 1e-6) if norms else None
    k_norm = Norm(torch.randn(dim, generator=gen), 1e-5) if norms else None
    layer = Layer(qkv=qkv, o=None, gate=None, up=None, down=None,  # type: ignore[arg-type]
                  input_norm=None, post_attention_norm=None,  # type: ignore[arg-type]
                  pre_mlp_norm=None, post_mlp_norm=None,  # type: ignore[arg-type]
                  q_norm=q_norm, k_norm=k_norm, window=None, scaling=1.0, softcap=None,
                  rope="default")
    rows = _prepared_like_a_layer(70, 14)
    angles = torch.rand(tokens, dim, generator=gen, dtype=torch.float64) * 100
    cos, sin = torch.cos(angles).float(), torch.sin(angles).float()
    slots = torch.tensor([0, 1, 2, 0, 1, 2, 3, 3, 0])
    positions = torch.tensor([0, 0, 0, 1, 1, 1, 0, 1, 2])

    def run() -> tuple[torch.Tensor, ...]:
        cache = attention.SlotCache(num_layers=2, kv_heads=kv_heads, head_dim=dim, block=4,
                                    device=torch.device("cpu"))
        for _ in range(4):
            cache.allocate()
        cache.reserve(3)
        q = qkv_step(layer, rows, heads, kv_heads, dim, cos, sin, rotate, cache, 1, slots,
                     positions)
        return (q, *cache.keys, *cache.values, *cache.key_scale, *cache.value_scale)

    fast = run()
    slow = _torch_path(monkeypatch, run)
    assert isinstance(slow, tuple)
    # A query head that overflowed is NaN in both paths; where both summands of the rotation
    # are NaN the sum's NaN payload is open (see test_residual_rows), and the queries'
    # rounding to limbs turns such a head into zeros: compared up to NaN payloads. The
    # stored integers and scales bit for bit.
    _same(_canonical_nans(fast[0]), _canonical_nans(slow[0]))
    _same(fast[1:], slow[1:])
    assert fast[0].isnan().any()  # the overflowing row reached the end
    assert fast[2].abs().sum() > 0 and fast[1].abs().sum() == 0  # layer 1 written, 0 not


@pytest.mark.parametrize("softcap", [None, 2.5])
def test_attention(monkeypatch: pytest.MonkeyPatch, softcap: float | None) -> None:
    gen = torch.Generator().manual_seed(5)
    batch, kvh, nq, g, d, block = 3, 2, 5, 2, 16, 4
    length = 3 * block
    kmax, vmax = attention.key_levels(d), attention.value_levels(block)
    q = torch.randint(-32512, 32513, (batch, kvh, nq, g, d), generator=gen).float()
    q_scale = torch.rand(batch, kvh, nq, g, generator=gen)
    keys = torch.randint(-kmax, kmax + 1, (batch, kvh, length, d), generator=gen).float()
    values = torch.randint(-vmax, vmax + 1, (batch, kvh, length, d), generator=gen).float()
    k_scale = torch.rand(batch, kvh, length, generator=gen) * 1e-3
    v_scale = torch.rand(batch, kvh, length, generator=gen)
    v_scale[0, 0, 3] = 1e30  # a finite poison at a hidden position
    visible = torch.rand(batch, 1, nq, 1, length, generator=gen) > 0.4
    visible[1, 0, 2] = False  # a query that sees nothing
    visible[0, 0, :, :, 3] = False

    def run() -> torch.Tensor:
        return attention.attend(q, q_scale, keys, k_scale, values, v_scale, visible, 0.7,
                                softcap, block)

    _same(run(), _torch_path(monkeypatch, run))


@pytest.mark.parametrize("store", [torch.int16, torch.float32])
@pytest.mark.parametrize(("window", "softcap", "block"), [(None, None, 64), (37, 30.0, 64),
                                                          (None, None, 8)])
def test_attend_tokens(monkeypatch: pytest.MonkeyPatch, store: torch.dtype, window: int | None,
                       softcap: float | None, block: int) -> None:
    """The step's attention kernel against ``attend`` token by token, over slots long enough
    for several int32 value chunks (63 positions each; a float32 store takes the float64
    sums), values as large as ``block`` allows, a poisoned value scale at a visible position
    and a token at position 0."""
    from dplang.models.kernels import definitions_only
    from dplang.models.kernels.triton_check import reference_attend_tokens

    gen = torch.Generator().manual_seed(8)
    slots, kvh, capacity, d, heads = 3, 2, 256, 32, 4
    kmax, vmax = attention.key_levels(d), attention.value_levels(block)
    keys = torch.randint(-kmax, kmax + 1, (slots, kvh, capacity, d), generator=gen).to(store)
    values = torch.randint(-vmax, vmax + 1, (slots, kvh, capacity, d), generator=gen).to(store)
    values[1, 0, :, 0] = vmax  # the largest sums
    k_scale = torch.rand(slots, kvh, capacity, generator=gen) * 1e-3 + 1e-4
    v_scale = torch.rand(slots, kvh, capacity, generator=gen) * 1e-2 + 1e-3
    v_scale[0, 1, 5] = 1e30  # a finite poison
    q = torch.randn(6, heads, d, generator=gen) * 4
    q[4] *= 1e-3  # flat weights: every count nonzero
    q_slot = torch.tensor([0, 1, 2, 1, 0, 2])
    q_pos = torch.tensor([200, 255, 100, 0, 130, 20])

    def kernel() -> torch.Tensor:
        return cpu_kernels.attend_tokens(q, q_slot, q_pos, keys, k_scale, values, v_scale,
                                         window, 0.18, softcap, attention.WEIGHT_LEVELS,
                                         attention.MAX_POSITIONS)

    with definitions_only():
        ref = reference_attend_tokens(q, q_slot, q_pos, keys.float(), k_scale, values.float(),
                                      v_scale, window, 0.18, softcap, block)
    _same(kernel(), ref)


def test_attend_tokens_when_every_score_is_negative_or_zero() -> None:
    """The largest score of a row whose scores are all negative (the integer keys that order
    negative floats must invert their bits) or all zero (a zero query: the first zero's sign,
    by the scalar loop), against the definition."""
    from dplang.models.kernels import definitions_only
    from dplang.models.kernels.triton_check import reference_attend_tokens

    d, n = 32, 64  # one block of positions
    gen = torch.Generator().manual_seed(5)
    kmax, vmax = attention.key_levels(d), attention.value_levels(64)
    keys = torch.randint(1, kmax + 1, (1, 1, n, d), generator=gen).to(torch.int16)
    values = torch.randint(-vmax, vmax + 1, (1, 1, n, d), generator=gen).to(torch.int16)
    k_scale = torch.rand(1, 1, n, generator=gen) * 1e-3 + 1e-4
    v_scale = torch.rand(1, 1, n, generator=gen) * 1e-2 + 1e-3
    q = -torch.rand(3, 2, d, generator=gen) * 4  # every score negative
    q[1] = 0.0  # every score zero
    q_slot, q_pos = torch.zeros(3, dtype=torch.long), torch.tensor([n - 1, n - 1, 7])
    got = cpu_kernels.attend_tokens(q, q_slot, q_pos, keys, k_scale, values, v_scale, None,
                                    0.18, None, attention.WEIGHT_LEVELS,
                                    attention.MAX_POSITIONS)
    with definitions_only():
        ref = reference_attend_tokens(q, q_slot, q_pos, keys.float(), k_scale, values.float(),
                                      v_scale, None, 0.18, None, 64)
    _same(got, ref)


def test_attend_tokens_when_scores_overflow() -> None:
    """A score that overflows float32 (a huge query against a huge stored key) makes the
    weights' masses overflow and the counts NaN: the kernel's float64 sums and the definition
    agree (NaN), where an int64 cast in the definition once gave the platform's choice."""
    from dplang.models.kernels import definitions_only
    from dplang.models.kernels.triton_check import reference_attend_tokens

    d, n = 32, 100
    cache = attention.SlotCache(1, 1, d, 64, torch.device("cpu"))
    cache.allocate()
    cache.reserve(n)
    k = torch.zeros(n, 1, d)
    k[10] = 1e19
    v = torch.randn(n, 1, d, generator=torch.Generator().manual_seed(2)) * 1000
    cache.write(0, torch.zeros(n, dtype=torch.long), torch.arange(n), k, v)
    q = torch.full((1, 1, d), 1e19)
    args = (q, torch.tensor([0]), torch.tensor([n - 1]))
    got = cpu_kernels.attend_tokens(*args, cache.keys[0], cache.key_scale[0], cache.values[0],
                                    cache.value_scale[0], None, 0.18, None,
                                    attention.WEIGHT_LEVELS, attention.MAX_POSITIONS)
    with definitions_only():
        ref = reference_attend_tokens(*args, cache.keys[0].float(), cache.key_scale[0],
                                      cache.values[0].float(), cache.value_scale[0], None,
                                      0.18, None)
    assert ref.isnan().all()
    _same(got, ref)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_whole_model_with_and_without_kernels(monkeypatch: pytest.MonkeyPatch,
                                              tiny_llama_dir: Path, tiny_gemma_dir: Path,
                                              arch: str) -> None:
    folder = tiny_llama_dir if arch == "llama" else tiny_gemma_dir
    model = TransformersModel(folder, threads=2, block_size=4, check_invariance=False)
    prompts = [[2, 5, 9, 11, 13, 17, 19, 23, 29], [2, 7], [2, 31, 37, 41, 43, 47]]

    def decode() -> tuple[torch.Tensor, ...]:
        state = RowDecodeState(prompts=[list(p) for p in prompts])
        seen = []
        hidden = model.next_hidden(state, None)
        for step in range(3):
            seen += [hidden, model.logits_from_hidden(hidden)]
            hidden = model.next_hidden(state, torch.tensor([3 + step, 4, 5]))
        return tuple(seen)

    _same(decode(), _torch_path(monkeypatch, decode))


@pytest.mark.parametrize("top", [1e-40, 3e-39, 1e-36, 1e-30, 1.0])
def test_rows_too_small_to_scale_become_zeros_in_both_definitions(
        top: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """A row whose scale max|row| / levels would be subnormal is rounded to zeros (a
    subnormal scale has a few significant bits, and |x / scale| could exceed levels by half,
    overflowing an int16 key or an int8 limb); otherwise every |q| <= levels. The torch
    definition and the fused kernel agree bit for bit."""
    from dplang.models.exact import TWO_LIMB_LEVELS, quantize_rows

    x = torch.tensor([[top, -top * 0.7, top * 0.3, 0.0]], dtype=torch.float32)
    fused = quantize_rows(x, TWO_LIMB_LEVELS)
    monkeypatch.setattr(cpu_kernels, "available", lambda tensor: False)
    plain = quantize_rows(x, TWO_LIMB_LEVELS)
    assert torch.equal(fused[0], plain[0]) and torch.equal(fused[1], plain[1])
    q, scale = plain
    assert float(q.abs().max()) <= TWO_LIMB_LEVELS
    if float(scale) != 1.0 or top >= 1.0:
        assert float(scale) >= torch.finfo(torch.float32).tiny
    if top / TWO_LIMB_LEVELS < torch.finfo(torch.float32).tiny:
        assert float(q.abs().max()) == 0.0 and float(scale) == 1.0


def test_cache_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused store (issue 36): the same integers and scales at the same places, int16
    store and float32 store alike, rows too small or not finite included."""
    for dtype in (torch.int16, torch.float32):
        caches = []
        for fused in (True, False):
            cache = attention.SlotCache(2, 3, 16, block=8, device=torch.device("cpu"))
            cache.dtype = dtype  # the CPU's int16 store, and the GPU's float32 one
            cache.reserve(24)
            for _ in range(3):
                cache.allocate()
            keys = _nasty(10, 48, 3).view(10, 3, 16)
            values = _nasty(10, 48, 4).view(10, 3, 16) * 7
            slots = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 2])
            positions = torch.tensor([0, 0, 0, 1, 1, 1, 5, 9, 23, 7])
            if fused:
                cache.write(1, slots, positions, keys, values)
            else:
                with monkeypatch.context() as m:
                    m.setattr(cpu_kernels, "available", lambda tensor: False)
                    cache.write(1, slots, positions, keys, values)
            caches.append(cache)
        for name in ("keys", "values", "key_scale", "value_scale"):
            _same(getattr(caches[0], name)[1], getattr(caches[1], name)[1])


@pytest.mark.parametrize("k", [0, 1, 5, 50, 299, 300, 400])
def test_topk_plus_candidates(monkeypatch: pytest.MonkeyPatch, k: int) -> None:
    """InvisibleInk's V_k^+ from a compiled pass (issue 36): the same ids as the torch
    definition, with ties at the k-th logit, NaN, -inf (banned tokens) and +inf publics."""
    from dplang.textgen.methods.invisibleink import InvisibleInkPolicy

    gen = torch.Generator().manual_seed(k)
    cases = []
    base = torch.randn(300, generator=gen) * 4
    cases.append(base)
    ties = torch.round(base)  # many equal logits, around the k-th too
    cases.append(ties)
    banned = base.clone()
    banned[::3] = float("-inf")
    banned[7] = float("nan")
    cases.append(banned)
    plus = base.clone()
    plus[[4, 90]] = float("inf")
    cases.append(plus)
    for clip in (0.0, 0.05, 3.0):
        policy = InvisibleInkPolicy(clip, 7, 1.2, k, 300)
        for public in cases:
            fast = policy.candidates(public)
            slow = _torch_path(monkeypatch, lambda p=public, q=policy: q.candidates(p))
            if fast is None or slow is None:
                assert fast is None and slow is None
            else:
                assert torch.equal(fast, slow), (k, clip)


@pytest.mark.parametrize("bits", [16, 8])
def test_gathered_head(monkeypatch: pytest.MonkeyPatch, bits: int) -> None:
    """The sparse head from the weight rows' limbs (issue 36): the same bits as the float32
    chunks of the definition, and as the dense head's columns, repeated ids included (the
    kernel copies a repeat of the row's first id instead of recomputing it)."""
    gen = torch.Generator().manual_seed(bits)
    w = torch.randn(500, 40, generator=gen)
    lin = exact.IntegerLinear(w, torch.randn(500, generator=gen), weight_bits=bits,
                              layout="nk")
    x = _nasty(9, 40, 5).nan_to_num(0.0, 0.0, 0.0)
    ids = torch.randint(0, 500, (9, 30), generator=gen)
    ids[:, 5::4] = ids[:, :1]  # repeats of a row's first id (a ragged set's padding) inside
    ids[3, 20:] = ids[3, 0]
    fast = lin.gathered(x, ids)
    slow = _torch_path(monkeypatch, lambda: lin.gathered(x, ids))
    _same(fast, slow)
    _same(fast, _torch_path(monkeypatch, lambda: lin(x)).gather(1, ids))


@pytest.mark.parametrize("width", [1, 40, 640, 1030])
def test_weight_products(width: int) -> None:
    """The int8 dot products of weight rows with limb rows are the integers of the float32
    chunks and of the int8 kernel, at the extremes (-128 x -128 everywhere: the largest sum)
    and on random limbs, widths across a float32 chunk's boundary."""
    gen = torch.Generator().manual_seed(width)
    weights = torch.randint(-128, 128, (37, width), generator=gen, dtype=torch.int8)
    limbs = torch.randint(-128, 128, (6, width), generator=gen, dtype=torch.int8)
    weights[0] = -128
    limbs[0] = -128
    weights[1] = 127
    limbs[1] = -128
    got = cpu_kernels.weight_products(weights, limbs)
    want = exact.exact_products(weights, limbs.t().contiguous(), "float32")
    assert got.dtype == torch.int32
    assert torch.equal(got, want)
    assert torch.equal(got.long(), weights.long() @ limbs.long().t())
    assert int(got[0, 0]) == width * 128 * 128


def test_weight_products_refuse_what_int32_cannot_hold() -> None:
    with pytest.raises(ValueError, match="too large"):
        cpu_kernels.weight_products(torch.zeros((1, 2**17), dtype=torch.int8),
                                    torch.zeros((1, 2**17), dtype=torch.int8))
    with pytest.raises(ValueError, match="int8"):
        cpu_kernels.weight_products(torch.zeros((1, 4), dtype=torch.int16),
                                    torch.zeros((1, 4), dtype=torch.int8))


def test_top_superset_from_the_compiled_products(monkeypatch: pytest.MonkeyPatch) -> None:
    """The head's bounds from the compiled int8 dot products (the float32 kernel: a CPU
    without int8 dot products) give the set and logits of the float32 chunks, bit for bit."""
    from dplang.models import kernels

    gen = torch.Generator().manual_seed(3)
    head = exact.IntegerLinear(torch.randn(3000, 64, generator=gen), layout="nk")
    head.kernel = "float32"
    x = torch.randn(5, 64, generator=gen)
    calls: list[int] = []
    real = cpu_kernels.weight_products
    with monkeypatch.context() as m:
        m.setattr(cpu_kernels, "weight_products",
                  lambda *a: calls.append(1) or real(*a))  # type: ignore[func-returns-value]
        direct = head.top_superset(x, 20, 0.5)
    assert calls  # the compiled products ran
    lookup = kernels.lookup
    with monkeypatch.context() as m:
        m.setattr(kernels, "lookup",
                  lambda op, t: None if op == "weight_products" else lookup(op, t))
        chunks = head.top_superset(x, 20, 0.5)
    assert direct is not None and chunks is not None
    _same(direct, chunks)

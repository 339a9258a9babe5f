"""The Triton kernels of the exact operations compute the same bits as their torch definitions
(issue 38): on the CPU under Triton's interpreter (``TRITON_INTERPRET=1``, small shapes, part
of ``make test``) and on a GPU under ``-m gpu``. The guarantee rests on it: a kernel that
rounded once where torch rounds twice (a fused multiply-add), divided approximately, or read a
neighbouring row would make one row's numbers depend on the machine or on the others.

The interpreter must be chosen before triton is imported, so the CPU checks run in a fresh
process (``_interpreted``) that imports the kernels under it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

triton = pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]

#: What every part's interpreted process runs first; each part then adds its cases to ``out``
#: (case name: the kernel gave the definition's bits), printed as one JSON verdict.
_PRELUDE = r'''
import json, math, sys, torch
from dplang.models import exact, cpu_kernels
from dplang.models.kernels import triton_check, triton_exact as tk
cpu_kernels.disable()  # the torch definitions, not the numba kernels, are the reference
g = torch.Generator().manual_seed(7)
out = {}

def same(a, b):
    return bool(a.dtype == b.dtype and a.shape == b.shape and
                torch.equal(a.view(torch.int32) if a.dtype == torch.float32 else a,
                            b.view(torch.int32) if b.dtype == torch.float32 else b))

def rows(m, k, spread=1.0):
    x = torch.randn(m, k, generator=g) * spread
    x[0, 0] = 0.0
    if m > 2:
        x[1] = 0.0                      # a zero row: zeros, scale 1
        x[2, 1] = float("nan")          # a row with a NaN: zeros, scale 1
    if m > 3:
        x[3] *= 1e-36                   # a row too small to scale
    if m > 4:
        x[4, 2] = float("inf")
    return x

'''

#: The checks, in two parts run side by side (each its own interpreted process): the
#: interpreter runs on one core, and the attention cases are half of the time.
_PARTS = {"kernels": r'''
for levels in (exact.TWO_LIMB_LEVELS, exact.ONE_LIMB_LEVELS):
    for m, k in ((1, 7), (5, 33), (19, 64), (40, 130)):
        x = rows(m, k, 30.0)
        q, s = exact.quantize_rows(x, levels)
        tq, ts = tk.quantize(x, levels)
        out[f"quantize {levels} {m}x{k}"] = same(q, tq) and same(s, ts)
for m, k in ((1, 16), (6, 48), (23, 100)):
    x = rows(m, k, 5.0)
    ref = exact.prepare_rows(x)
    limbs, scale = tk.quantize_limbs(x, exact.TWO_LIMB_LEVELS)
    out[f"limbs {m}x{k}"] = same(ref.limbs, limbs) and same(ref.scale, scale)

for bits in (16, 8):
    for m, k, n, bias in ((1, 32, 16, True), (3, 70, 40, False), (100, 96, 130, True)):
        w = torch.randn(n, k, generator=g) * 0.3
        b = torch.randn(n, generator=g) if bias else None
        lin = exact.IntegerLinear(w, b, weight_bits=bits)
        x = torch.randn(m, k, generator=g) * 4
        prepared = exact.prepare_rows(x)
        ref = lin.apply(prepared)
        got = tk.linear(prepared.limbs, prepared.scale, lin.limbs[0],
                        lin.limbs[1] if bits == 16 else None, lin.col_scale, lin.bias)
        # a column-major weight (CUDA's layout) gives the same bits
        cm = lin.limbs[0].t().contiguous().t()
        got_cm = tk.linear(prepared.limbs, prepared.scale, cm,
                           lin.limbs[1].t().contiguous().t() if bits == 16 else None,
                           lin.col_scale, lin.bias)
        # and a row alone gives the bits it has among the others
        alone = tk.linear(prepared.limbs[[0, m]], prepared.scale[:1], lin.limbs[0],
                          lin.limbs[1] if bits == 16 else None, lin.col_scale, lin.bias)
        out[f"linear {bits} {m}x{k}x{n}"] = (same(ref, got) and same(ref, got_cm)
                                             and same(ref[:1], alone))

for bits in (16, 8):  # the LM head ("nk", stacked for 16 bits): dense through the linear
    for m, k, n, bias in ((1, 32, 20, False), (70, 70, 300, True)):  # kernel, and gathered
        w = torch.randn(n, k, generator=g) * 0.3
        b = torch.randn(n, generator=g) if bias else None
        lin = exact.IntegerLinear(w, b, weight_bits=bits, layout="nk")
        x = rows(m, k, 4.0)
        prepared = exact.prepare_rows(x)
        two = bits == 16
        ref = lin.apply(prepared)
        got = tk.linear(prepared.limbs, prepared.scale, lin.limbs[0].t(),
                        lin.limbs[1].t() if two else None, lin.col_scale, lin.bias)
        out[f"linear nk {bits} {m}x{k}x{n}"] = same(ref, got)
        for width in (1, 7, 70):
            ids = torch.stack([torch.randperm(n, generator=g)[:width] for _ in range(m)])
            if width > 2:
                ids[:, -2:] = ids[:, :1]  # a ragged set's padding: the row's first id
            want = lin.gathered(x, ids)
            shift = 256.0 if two else 1.0
            got = tk.gathered_head(prepared.limbs, prepared.scale, lin.limbs[0],
                                   lin.limbs[1] if two else None, ids, lin.col_scale,
                                   lin.bias, shift * 256.0, shift)
            # a row alone gives the bits it has among the others
            alone = tk.gathered_head(prepared.limbs[[m - 1, 2 * m - 1]],
                                     prepared.scale[m - 1:], lin.limbs[0],
                                     lin.limbs[1] if two else None, ids[m - 1:],
                                     lin.col_scale, lin.bias, shift * 256.0, shift)
            out[f"gathered {bits} {m}x{k}x{n} w{width}"] = (
                same(want, got) and same(ref.gather(1, ids), got)
                and same(want[m - 1:], alone))
        # an id out of range reads nothing outside the weights: NaN there, the rest unchanged
        ids = torch.stack([torch.randperm(n, generator=g)[:5] for _ in range(m)])
        wrong = ids.clone()
        wrong[0, 1], wrong[-1, 3] = n, -1
        got = tk.gathered_head(prepared.limbs, prepared.scale, lin.limbs[0],
                               lin.limbs[1] if two else None, wrong, lin.col_scale, lin.bias,
                               shift * 256.0, shift)
        bad = wrong != ids
        out[f"gathered {bits} out of range"] = bool(
            got[bad].isnan().all() and same(got[~bad], ref.gather(1, ids)[~bad]))

for m, k in ((1, 8), (4, 64), (9, 200)):
    x = torch.randn(m, k, generator=g) * 3
    x[0, :3] = 0.0
    w = 1.0 + torch.randn(k, generator=g) * 0.1
    # rows whose mean square is near eps too: eps (1e-5, 1e-6: not float32 numbers) is added
    # in float64, as the definition adds it
    x = torch.cat([x, x * 1e-3])
    out[f"rms {m}x{k}"] = all(same(exact.rms_norm(x, w, eps), tk.rms_norm(x, w, eps))
                              for eps in (1e-6, 1e-5))

gate = torch.cat([torch.randn(3000, generator=g) * 6, torch.tensor([0.0, -0.0, 100.0,
                                                                     -100.0, 1e-30])])
up = torch.randn(gate.numel(), generator=g)
out["gelu"] = same(exact.gelu_tanh(gate) * up, tk.gelu_tanh_mul(gate, up))
out["silu"] = same(exact.silu(gate) * up, tk.silu_mul(gate, up))
from dplang.models import kernels
sys.path.insert(0, "tests/models")
from test_cuda_semantics import CudaDivision
for op in kernels.gpu_ops():  # every operation with a Triton kernel has its self-test
    # run with the definitions under a GPU's division rule (a host-number divisor multiplies
    # by its reciprocal there), as on a GPU; under the CPU's rule the definitions give the
    # same bits (exact.divide divides by a tensor), which the family checks above compare
    with CudaDivision():
        out[f"selftest {op} under the GPU division"] = triton_check.self_test(
            op, torch.device("cpu"))
''',
           "attention": r'''
from dplang.models.attention import BLOCK_SIZE, MAX_POSITIONS, WEIGHT_LEVELS
S, KVH, D, H = 3, 2, 16, 4
for capacity in (BLOCK_SIZE, 2 * BLOCK_SIZE):
    keys = torch.randint(-2000, 2001, (S, KVH, capacity, D), generator=g).to(torch.int16)
    values = torch.randint(-200, 201, (S, KVH, capacity, D), generator=g).to(torch.int16)
    ks = torch.rand(S, KVH, capacity, generator=g) * 1e-3 + 1e-4
    vs = torch.rand(S, KVH, capacity, generator=g) * 1e-2 + 1e-3
    q = torch.randn(7, H, D, generator=g) * 3
    slot = torch.tensor([0, 1, 2, 0, 1, 2, 2])
    pos = torch.tensor([0, 5, capacity - 1, 17, 22, 3, 40])
    for window, cap in ((None, None), (8, None), (None, 50.0), (16, 30.0)):
        args = (q, slot, pos, keys, ks, values, vs, window, 0.125, cap)
        ref = triton_check.reference_attend_tokens(*args)
        got = tk.attend_tokens(*args, WEIGHT_LEVELS, MAX_POSITIONS)
        alone = tk.attend_tokens(q[3:4], slot[3:4], pos[3:4], keys, ks, values, vs, window,
                                 0.125, cap, WEIGHT_LEVELS, MAX_POSITIONS)
        out[f"attend {capacity} {window} {cap}"] = same(ref, got) and same(ref[3:4], alone)
'''}


def _interpreted() -> dict[str, bool]:
    """Every part's verdicts, the parts run side by side in interpreted processes."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT / "src")}
    verdict = '\nprint("VERDICT " + json.dumps(out))\n'
    running = {part: subprocess.Popen([sys.executable, "-c", _PRELUDE + code + verdict],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env, cwd=ROOT)
               for part, code in _PARTS.items()}
    out: dict[str, bool] = {}
    for part, process in running.items():
        stdout, stderr = process.communicate(timeout=900)
        assert process.returncode == 0, f"{part}: {stderr[-3000:]}"
        line = next(ln for ln in stdout.splitlines() if ln.startswith("VERDICT "))
        out.update(json.loads(line.removeprefix("VERDICT ")))
    return out


@pytest.fixture(scope="module")
def verdicts() -> dict[str, bool]:
    return _interpreted()


@pytest.mark.parametrize("family", ["quantize", "limbs", "linear", "gathered", "rms", "gelu",
                                    "silu", "attend", "selftest"])
def test_each_kernel_gives_the_bits_of_its_torch_definition(verdicts, family):
    cases = {name: ok for name, ok in verdicts.items() if name.split()[0] == family}
    assert cases, f"no {family} case ran"
    assert all(cases.values()), {n: ok for n, ok in cases.items() if not ok}


def test_a_kernel_that_fails_its_self_test_is_not_used(monkeypatch):
    """On a GPU where a Triton kernel does not compile or gives other bits than its
    definition, the definition computes the operation (with a warning): speed is lost, never
    the bits. Kernels are admitted per GPU: one that passed on one GPU is not used on another
    where it failed, nor on one where it was never tested."""
    pytest.importorskip("triton")
    from dplang.models import cpu_kernels, kernels
    from dplang.models.kernels import triton_check, triton_exact

    monkeypatch.setattr(kernels, "triton_available", lambda: True)
    monkeypatch.setattr(cpu_kernels, "enabled", lambda: True)  # whatever tests ran before
    kernels.withdraw_all()
    try:
        monkeypatch.setattr(triton_check, "self_test", lambda op, device: True)
        assert all(triton_check.admit_kernels("cuda:0").values())
        monkeypatch.setattr(triton_check, "self_test", lambda op, device: op != "rms_norm")
        with pytest.warns(UserWarning, match="'rms_norm' is not used on cuda:1"):
            verdicts = triton_check.admit_kernels("cuda:1")
        assert verdicts == {op: op != "rms_norm" for op in kernels.gpu_ops()}
        assert kernels._admitted[1]["rms_norm"] is None
        assert kernels._admitted[0]["rms_norm"] is triton_exact.rms_norm
        assert kernels._admitted[1]["quantize"] is triton_exact.quantize
        assert kernels.self_tests_of("cuda:2") is None  # never tested: nothing admitted

        def on(index):  # what lookup reads of a tensor on GPU ``index``
            return SimpleNamespace(device=torch.device("cuda", index))

        assert kernels.lookup("rms_norm", on(0)) is triton_exact.rms_norm
        assert kernels.lookup("rms_norm", on(1)) is None
        assert kernels.lookup("quantize", on(1)) is triton_exact.quantize
        assert kernels.lookup("quantize", on(2)) is None
        assert triton_check.admit_kernels("cuda:1") == verdicts  # once per GPU

        def broken(op, device):
            raise RuntimeError("PassManager::run failed")

        kernels.withdraw_all()
        monkeypatch.setattr(triton_check, "self_test", broken)
        with pytest.warns(UserWarning, match="RuntimeError: PassManager::run failed"):
            assert not any(triton_check.admit_kernels("cuda:1").values())
        assert set(kernels._admitted) == {1}
        assert triton_check.admit_kernels("cpu") == {}  # nothing to admit off CUDA
    finally:
        kernels.withdraw_all()


def test_the_kernel_modules_agree_on_the_two_limb_range():
    pytest.importorskip("triton")
    from dplang.models import cpu_kernels, exact
    from dplang.models.kernels import triton_exact

    assert triton_exact.TWO_LIMB == cpu_kernels.TWO_LIMB == exact.TWO_LIMB_LEVELS


@pytest.mark.gpu
def test_the_kernels_on_a_gpu_give_the_bits_of_the_cpu_definitions():
    """On CUDA (compiled, not interpreted): the same comparisons, the inputs made on the CPU,
    the torch definitions computed on the CPU."""
    from dplang.models import cpu_kernels, exact, kernels
    from dplang.models.kernels import triton_check
    from dplang.models.kernels import triton_exact as tk

    verdicts = triton_check.admit_kernels("cuda")  # every kernel passes its self-test here
    assert verdicts == {op: True for op in kernels.gpu_ops()}, verdicts
    # the LM head ("nk", its limbs views of one stacked tensor, as moved by .to): dense and
    # gathered through the dispatch, several row blocks and candidate blocks
    import copy

    gh = torch.Generator().manual_seed(5)
    rows = torch.randn(150, 640, generator=gh) * 5
    head = exact.IntegerLinear(torch.randn(5000, 640, generator=gh) * 0.2, layout="nk")
    with kernels.definitions_only():  # the CPU reference by the torch definitions
        dense = head.apply(exact.prepare_rows(rows))
    ids = torch.randint(0, 5000, (150, 130), generator=gh)
    on_gpu = copy.deepcopy(head).to(torch.device("cuda"))
    assert kernels.lookup("linear", rows.cuda()) is tk.linear
    assert kernels.lookup("gathered_head", rows.cuda()) is tk.gathered_head
    got = on_gpu.apply(exact.prepare_rows(rows.cuda()))
    assert torch.equal(got.cpu().view(torch.int32), dense.view(torch.int32))
    got = on_gpu.gathered(rows.cuda(), ids.cuda())
    assert torch.equal(got.cpu().view(torch.int32), dense.gather(1, ids).view(torch.int32))
    cpu_kernels.disable()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(37, 640, generator=g) * 5
    w = torch.randn(300, 640, generator=g) * 0.2
    lin = exact.IntegerLinear(w, torch.randn(300, generator=g))
    prepared = exact.prepare_rows(x)
    ref = lin.apply(prepared)
    limbs, scale = tk.quantize_limbs(x.cuda(), exact.TWO_LIMB_LEVELS)
    assert torch.equal(limbs.cpu(), prepared.limbs) and torch.equal(scale.cpu(), prepared.scale)
    got = tk.linear(limbs, scale, lin.limbs[0].cuda(), lin.limbs[1].cuda(),
                    lin.col_scale.cuda(), lin.bias.cuda())
    assert torch.equal(got.cpu().view(torch.int32), ref.view(torch.int32))
    norm_w = 1 + torch.randn(640, generator=g) * 0.1
    assert torch.equal(tk.rms_norm(x.cuda(), norm_w.cuda(), 1e-6).cpu(),
                       exact.rms_norm(x, norm_w, 1e-6))
    gate, up = torch.randn(5000, generator=g) * 6, torch.randn(5000, generator=g)
    assert torch.equal(tk.gelu_tanh_mul(gate.cuda(), up.cuda()).cpu(),
                       exact.gelu_tanh(gate) * up)
    assert torch.equal(tk.silu_mul(gate.cuda(), up.cuda()).cpu(), exact.silu(gate) * up)

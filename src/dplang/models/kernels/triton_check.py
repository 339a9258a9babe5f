"""The self-tests that admit dplang's Triton kernels on a GPU (privacy-critical).

A Triton kernel computes an exact operation on CUDA only after it has given, on that GPU, the
bits of its torch definition (:mod:`dplang.models.exact`, :mod:`dplang.models.attention`,
computed with every kernel off) for a few small inputs: zero, NaN and tiny rows, a sliding
window, a soft cap. :func:`admit_kernels` runs them once per process and GPU and hands the
kernels that passed to the dispatch table for that GPU only
(:func:`dplang.models.kernels.record_self_tests`); a kernel that fails to compile or gives
other bits is left out there with a warning, and its torch definition
computes the operation: a GPU or a Triton version on which a kernel misbehaves costs speed,
never the bits. The model calls it when it moves to a CUDA device
(:class:`~dplang.models.transformers.TransformersModel`).

This module, not the dispatch table, imports the definitions: the definitions ask the table
which kernel computes them, so the table must not import them back (no import circles,
``scripts/import_cycles.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dplang import notices
from dplang.models import exact, kernels
from dplang.models.attention import BLOCK_SIZE, MAX_POSITIONS, WEIGHT_LEVELS, attend
from dplang.models.exact import TWO_LIMB_LEVELS, quantize_rows

__all__ = ["admit_kernels", "reference_attend_tokens", "self_test"]


def admit_kernels(device: torch.device | str) -> dict[str, bool]:
    """Run every Triton kernel's :func:`self_test` on CUDA ``device`` (once per process and
    GPU) and admit those that pass into the dispatch table for that GPU only; ``{op:
    passed}``. Nothing is run, and nothing admitted, where Triton is not usable
    (:func:`dplang.models.kernels.triton_available`)."""
    device = torch.device(device)
    if device.type != "cuda" or not kernels.triton_available():
        return {}
    known = kernels.self_tests_of(device)
    if known is not None:
        return known
    from dplang.models.kernels import triton_exact

    device = torch.device("cuda", kernels.cuda_index(device))
    results: dict[str, Callable[..., Any] | None] = {}
    for op in kernels.gpu_ops():
        try:
            ok = self_test(op, device)
        except Exception as exc:  # a compiler or driver that refuses the kernel
            ok, why = False, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
        else:
            why = "its result differs from the definition's"
        if not ok:
            notices.warn(f"dplang's Triton kernel {op!r} is not used on {device} ({why}); the "
                         "torch definition computes it (the same bits, slower)", stacklevel=2)
        results[op] = getattr(triton_exact, op) if ok else None
    kernels.record_self_tests(device, results)
    return {op: kernel is not None for op, kernel in results.items()}


def self_test(op: str, device: torch.device) -> bool:
    """Whether kernel ``op`` gives, on ``device``, the bits of its torch definition there for
    a few small inputs (zero, NaN and tiny rows included), the definition computed with every
    kernel off (:func:`dplang.models.kernels.definitions_only`)."""
    from dplang.models.kernels import triton_exact as tk

    g = torch.Generator().manual_seed(11)
    x = torch.randn(21, 96, generator=g) * 7
    x[1] = 0.0
    x[2, 3] = float("nan")
    x[3] *= 1e-36
    x = x.to(device)

    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        if a.dtype == torch.float32:
            a, b = a.view(torch.int32), b.view(torch.int32)
        return bool(a.shape == b.shape and torch.equal(a, b))

    with kernels.definitions_only():
        if op == "quantize":
            ref = exact.quantize_rows(x, exact.TWO_LIMB_LEVELS)
            got = tk.quantize(x, exact.TWO_LIMB_LEVELS)
            return same(ref[0], got[0]) and same(ref[1], got[1])
        if op == "quantize_limbs":
            ref_rows = exact.prepare_rows(x)
            limbs, scale = tk.quantize_limbs(x, exact.TWO_LIMB_LEVELS)
            return same(ref_rows.limbs, limbs) and same(ref_rows.scale, scale)
        if op == "rms_norm":
            w = (1 + torch.randn(96, generator=g) * 0.1).to(device)
            # rows whose mean square is near eps, where eps's last bits show: 1e-5 and 1e-6
            # are not float32 numbers (a kernel that rounded eps to float32 differs there)
            small = x.nan_to_num() * torch.logspace(-4, -1, x.shape[0]).to(device)[:, None]
            rows = torch.cat([x.nan_to_num(), small])
            return all(same(exact.rms_norm(rows, w, eps), tk.rms_norm(rows, w, eps))
                       for eps in (1e-6, 1e-5))
        if op in ("gelu_tanh_mul", "silu_mul"):
            up = torch.randn(x.shape, generator=g).to(device)
            fine = x.nan_to_num()
            ref = (exact.gelu_tanh(fine) if op == "gelu_tanh_mul" else exact.silu(fine)) * up
            return same(ref, getattr(tk, op)(fine, up))
        if op == "attend_tokens":
            keys = torch.randint(-3000, 3001, (2, 2, BLOCK_SIZE, 16), generator=g)
            values = torch.randint(-200, 201, (2, 2, BLOCK_SIZE, 16), generator=g)
            ks = torch.rand(2, 2, BLOCK_SIZE, generator=g) * 1e-3 + 1e-4
            vs = torch.rand(2, 2, BLOCK_SIZE, generator=g) * 1e-2 + 1e-3
            q = torch.randn(4, 4, 16, generator=g) * 3
            slot, pos = torch.tensor([0, 1, 1, 0]), torch.tensor([0, 9, 63, 30])
            # int16 keys and values, as the store holds them
            args = [t.to(device) for t in (q, slot, pos, keys.to(torch.int16), ks,
                                           values.to(torch.int16), vs)]
            ok = True
            for window, cap in ((None, None), (8, 30.0)):
                ref = reference_attend_tokens(*args, window, 0.25, cap)
                got = tk.attend_tokens(*args, window, 0.25, cap, WEIGHT_LEVELS, MAX_POSITIONS)
                ok = ok and same(ref, got)
            return ok
        if op in ("linear", "gathered_head"):
            ok = True
            # more rows than one of the linear kernel's row blocks (64), a NaN row among them
            many = torch.cat([x, (torch.randn(60, 96, generator=g) * 3).to(device)])
            rows = exact.prepare_rows(many)
            # "kn": a body linear; "nk": the LM head, whose transpose the linear kernel reads
            # (and whose rows the gathered head reads)
            layouts = ("kn", "nk") if op == "linear" else ("nk",)
            for bits, layout in ((b, lay) for lay in layouts for b in (16, 8)):
                w = torch.randn(300, 96, generator=g) * 0.3
                lin = exact.IntegerLinear(w, torch.randn(300, generator=g), weight_bits=bits,
                                          layout=layout)
                lin.to(device)
                two = bits == 16
                if op == "linear":
                    ref = lin.apply(rows)
                    limbs = lin.limbs if layout == "kn" else [t.t() for t in lin.limbs]
                    got = tk.linear(rows.limbs, rows.scale, limbs[0], limbs[1] if two else None,
                                    lin.col_scale, lin.bias)
                    ok = ok and same(ref, got)
                else:
                    # more candidates than one column block (64), the padding of a ragged
                    # set (the row's first id) at its end
                    ids = torch.randint(0, 300, (rows.count, 70), generator=g).to(device)
                    ids[:, -2:] = ids[:, :1]
                    ref = lin.gathered(many, ids)
                    shift = 256.0 if two else 1.0
                    got = tk.gathered_head(rows.limbs, rows.scale, lin.limbs[0],
                                           lin.limbs[1] if two else None, ids, lin.col_scale,
                                           lin.bias, shift * 256.0, shift)
                    ok = ok and same(ref, got)
            return ok
    raise KeyError(f"no self-test for {op!r}")


def reference_attend_tokens(q: torch.Tensor, q_slot: torch.Tensor, q_pos: torch.Tensor,
                            keys: torch.Tensor, key_scale: torch.Tensor, values: torch.Tensor,
                            value_scale: torch.Tensor, window: int | None, scaling: float,
                            softcap: float | None, block: int = BLOCK_SIZE) -> torch.Tensor:
    """:func:`~dplang.models.kernels.triton_exact.attend_tokens` by the torch definition, one
    token at a time: :func:`~dplang.models.attention.attend` of its query over its slot
    (capacity a multiple of the attention block ``block``), the positions it sees visible. The
    reference of the kernels' tests and self-test (with
    :func:`~dplang.models.kernels.definitions_only`)."""
    tokens, heads, dim = q.shape
    kv_heads, capacity = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    q_int, q_scale = quantize_rows(q, TWO_LIMB_LEVELS)
    out = torch.empty((tokens, heads, dim), dtype=torch.float32, device=q.device)
    position = torch.arange(capacity, device=q.device)
    for t in range(tokens):
        s, p = int(q_slot[t]), int(q_pos[t])
        visible = position <= p
        if window:
            visible &= position > p - window
        res = attend(q_int[t].view(1, kv_heads, 1, group, dim),
                     q_scale[t, :, 0].view(1, kv_heads, 1, group), keys[s:s + 1],
                     key_scale[s:s + 1], values[s:s + 1], value_scale[s:s + 1],
                     visible.view(1, 1, 1, 1, capacity), scaling, softcap, block)
        out[t] = res.view(heads, dim)
    return out

"""Matrix products of the transformers backend whose per-row results do not depend on the rows
beside them (see :mod:`dplang.models._rowwise` for why this matters to privacy).

Every ``nn.Linear`` of the model body, and the full-vocabulary LM head, multiply with weights
*pre-packed* once at load into oneDNN's blocked layout (``torch.ops.mkldnn``). oneDNN fixes the
reduction order of each output by that layout, so a row's result is the same bits whether it is
multiplied alone or with 8,000 other rows (measured for every layer shape of Gemma 3 270M; MKL's
plain GEMM, which PyTorch uses for ``F.linear`` in float32, changes the last bits with the row
count). Packing also makes the products faster from a few rows on: see ``docs/benchmarks.md``.

Where packing is unavailable for a dtype (bfloat16 on CPUs without AVX-512 or AVX-NE-CONVERT),
``F.linear`` is used; the backend's load-time check (``check_row_invariance``) then decides
whether that configuration is row-invariant on this machine, and refuses it if not.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["install_linear_products", "linear_product", "pack_linear_weight", "packing_available"]

#: Row count oneDNN is told to expect when it packs a weight (a layout hint only: the packed
#: weight gives the same products for any number of rows).
_PACK_HINT_ROWS = 64


@functools.cache
def packing_available(dtype: torch.dtype) -> bool:
    """Whether oneDNN weight packing works for ``dtype`` here and reproduces ``F.linear`` on a
    small probe (checked once per dtype and process)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        gen = torch.Generator().manual_seed(0)
        weight = torch.randn(48, 32, generator=gen).to(dtype)
        x = torch.randn(3, 32, generator=gen).to(dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_HINT_ROWS)
        got = _packed_linear(x, packed, None).float()
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    want = torch.nn.functional.linear(x, weight).float()
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    return got.shape == want.shape and bool(torch.allclose(got, want, rtol=tol, atol=tol))


def pack_linear_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` (``[out, in]``) pre-packed in oneDNN's blocked layout for
    :func:`linear_product`, or ``None`` where packing is unavailable for its dtype."""
    if weight.ndim != 2 or weight.device.type != "cpu" or not packing_available(weight.dtype):
        return None  # oneDNN packing is a CPU layout
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), _PACK_HINT_ROWS)


def _packed_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


def linear_product(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
    packed: torch.Tensor | None,
) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, with the packed copy of ``weight`` where there is one
    (any leading shape; the last dimension of ``x`` is the input features)."""
    if packed is not None and x.dtype == weight.dtype:
        return _packed_linear(x, packed, bias)
    return torch.nn.functional.linear(x, weight, bias)


def _linear_forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return linear_product(x, module.weight, module.bias, getattr(module, "_dplang_packed", None))


def install_linear_products(body: Any) -> bool:
    """Pack every ``nn.Linear`` of ``body`` and route it through :func:`linear_product` (for
    every caller, the model's own ``forward`` included). Returns whether all were packed."""
    linears = [m for m in body.modules() if type(m) is torch.nn.Linear]
    all_packed = bool(linears)
    for module in linears:
        packed = pack_linear_weight(module.weight)
        all_packed &= packed is not None
        module._dplang_packed = packed
        if "forward" not in vars(module):
            module.forward = functools.partial(_linear_forward, module)
    return all_packed

"""Which implementation computes each exact operation: dplang's one dispatch table.

Every exact operation has a torch definition (:mod:`dplang.models.exact`,
:mod:`dplang.models.attention`), which is what the operation *is*; a fused kernel computes the
same integers and bits in fewer passes, per device type:

==========  =============================================  ==================================
device      kernels                                        module
==========  =============================================  ==================================
``cpu``     numba loops (when numba is installed)          :mod:`dplang.models.cpu_kernels`
``cuda``    Triton kernels (when triton is installed)      :mod:`.triton_exact`
==========  =============================================  ==================================

:func:`lookup` answers "which function computes ``op`` for this tensor", or ``None`` for the
torch definition; the decoder's code asks it instead of testing devices itself.
``DPLANG_NO_KERNELS=1`` (or :func:`dplang.models.cpu_kernels.disable`, the load-time check's
fallback) turns the CPU kernels off, ``DPLANG_NO_TRITON=1`` the GPU ones: the torch definitions
then run, with the same bits. Each kernel has a bit-for-bit test against its definition
(``tests/models/test_cpu_kernels.py``, ``tests/models/test_triton_kernels.py``, the latter on the
CPU under Triton's interpreter and on a GPU).

Privacy contract: a kernel listed here computes, for every row, exactly the bits of the torch
definition, whatever the other rows (docs/privacy.md, the argument per operation).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from dplang.models import cpu_kernels

__all__ = ["OPS", "definitions_only", "lookup", "triton_available"]

_state = threading.local()


@contextlib.contextmanager
def definitions_only() -> Iterator[None]:
    """While active (in this thread), :func:`lookup` answers ``None``: the torch definitions
    compute every operation (the reference a kernel's self-test compares with)."""
    before = getattr(_state, "off", False)
    _state.off = True
    try:
        yield
    finally:
        _state.off = before

#: The operations that have fused kernels, and the devices that have them.
OPS: dict[str, tuple[str, ...]] = {
    "quantize": ("cpu", "cuda"),
    "quantize_limbs": ("cpu", "cuda"),
    "rms_norm": ("cpu", "cuda"),
    "gelu_tanh_mul": ("cpu", "cuda"),
    "silu_mul": ("cpu", "cuda"),
    "hadamard": ("cpu",),
    "combine": ("cpu",),
    "linear": ("cuda",),
    "softmax_counts": ("cpu",),
    "attention_output": ("cpu",),
    "attend_tokens": ("cpu", "cuda"),
    "write_kv": ("cpu",),
    "topk_plus": ("cpu",),
    "gathered_head": ("cpu",),
}


def _cpu(op: str) -> Callable[..., Any]:
    return getattr(cpu_kernels, op)


@functools.cache
def triton_available() -> bool:
    """Whether Triton can compile kernels here (installed, a CUDA device, not turned off)."""
    if os.environ.get("DPLANG_NO_TRITON", "") not in ("", "0"):
        return False
    if not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _cuda(op: str) -> Callable[..., Any] | None:
    """The Triton kernel of ``op``, once it has given the bits of its torch definition on
    this GPU (:func:`~dplang.models.kernels.triton_exact.self_test`, a few small cases, once
    per process); ``None`` (the definition then runs) when it fails to compile or differs,
    with a warning: a GPU or a Triton version on which a kernel misbehaves costs speed only."""
    from dplang.models.kernels import triton_exact

    try:
        ok = triton_exact.self_test(op, torch.device("cuda"))
    except Exception as exc:  # a compiler or driver that refuses the kernel
        ok, why = False, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
    else:
        why = "its result differs from the definition's"
    if not ok:
        warnings.warn(f"dplang's Triton kernel {op!r} is not used on this GPU ({why}); the "
                      "torch definition computes it (the same bits, slower)", stacklevel=3)
        return None
    return getattr(triton_exact, op)


def lookup(op: str, tensor: torch.Tensor) -> Callable[..., Any] | None:
    """The fused kernel that computes ``op`` for ``tensor``'s device, or ``None`` (the torch
    definition computes it)."""
    devices = OPS.get(op)
    if devices is None:
        raise KeyError(f"no exact operation {op!r} (known: {', '.join(OPS)})")
    device = tensor.device.type
    if device not in devices or getattr(_state, "off", False):
        return None
    if device == "cpu":
        return _cpu(op) if cpu_kernels.available(tensor) else None
    if device == "cuda" and cpu_kernels.enabled() and triton_available():
        return _cuda(op)
    return None

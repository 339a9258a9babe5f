"""Which implementation computes each exact operation: dplang's one dispatch table.

Every exact operation has a torch definition (:mod:`dplang.models.exact`,
:mod:`dplang.models.attention`), which is what the operation *is*; a fused kernel computes the
same integers and bits in fewer passes, per device type:

==========  =============================================  ==================================
device      kernels                                        module
==========  =============================================  ==================================
``cpu``     numba loops (when numba is installed)          :mod:`dplang.models.cpu_kernels`
``cuda``    Triton kernels (installed, and admitted)       :mod:`.triton_exact`
==========  =============================================  ==================================

:func:`lookup` answers "which function computes ``op`` for this tensor", or ``None`` for the
torch definition; the decoder's code asks it instead of testing devices itself.
``DPLANG_NO_KERNELS=1`` (or :func:`dplang.models.cpu_kernels.disable`, the load-time check's
fallback) turns the CPU kernels off, ``DPLANG_NO_TRITON=1`` the GPU ones: the torch definitions
then run, with the same bits. A Triton kernel runs only once admitted: it gave its
definition's bits on this GPU (:func:`dplang.models.kernels.triton_check.admit_kernels`, which
the model calls when it moves to CUDA). Each kernel has a bit-for-bit test against its definition
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
from collections.abc import Callable, Iterator
from typing import Any

import torch

from dplang.models import cpu_kernels

__all__ = ["OPS", "admit", "definitions_only", "gpu_ops", "lookup", "triton_available",
           "withdraw_all"]

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


#: The Triton kernels admitted on this process's GPU, by operation: those that passed their
#: self-test there (:func:`dplang.models.kernels.triton_check.admit_kernels`).
_admitted: dict[str, Callable[..., Any]] = {}


def gpu_ops() -> tuple[str, ...]:
    """The operations that have a Triton kernel."""
    return tuple(op for op, devices in OPS.items() if "cuda" in devices)


def admit(op: str, kernel: Callable[..., Any]) -> None:
    """Let ``kernel`` compute ``op`` on CUDA from now on. Only
    :func:`~dplang.models.kernels.triton_check.admit_kernels` calls it, for a kernel that gave
    the bits of its torch definition on this GPU."""
    if op not in gpu_ops():
        raise KeyError(f"no Triton kernel for {op!r} (known: {', '.join(gpu_ops())})")
    _admitted[op] = kernel


def withdraw_all() -> None:
    """Forget every admitted Triton kernel (the torch definitions compute everything on CUDA
    until kernels are admitted again; for tests)."""
    _admitted.clear()


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
        return _admitted.get(op)  # a kernel not admitted (yet, or at all): the definition
    return None

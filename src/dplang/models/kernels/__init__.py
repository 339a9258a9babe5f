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

__all__ = ["OPS", "cuda_index", "definitions_only", "gpu_ops", "lookup", "record_self_tests",
           "self_tests_of", "triton_available", "withdraw_all"]

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
    "rotary": ("cpu",),
    "combine": ("cpu",),
    "residual_limbs": ("cpu",),
    "gated_limbs": ("cpu",),
    "qkv_heads": ("cpu",),
    "linear": ("cuda",),
    "softmax_counts": ("cpu",),
    "attention_output": ("cpu",),
    "attend_tokens": ("cpu", "cuda"),
    "write_kv": ("cpu",),
    "topk_plus": ("cpu",),
    "topk_plus_rows": ("cpu",),
    "gathered_head": ("cpu", "cuda"),
    "top_superset": ("cpu",),
    "weight_products": ("cpu",),
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


#: The Triton kernels admitted, by GPU index and operation: those that passed their self-test
#: on that GPU (:func:`dplang.models.kernels.triton_check.admit_kernels`); ``None`` for one
#: that failed it. A GPU absent from the table has had no self-test: nothing is admitted there.
_admitted: dict[int, dict[str, Callable[..., Any] | None]] = {}


def gpu_ops() -> tuple[str, ...]:
    """The operations that have a Triton kernel."""
    return tuple(op for op, devices in OPS.items() if "cuda" in devices)


def cuda_index(device: torch.device | str) -> int:
    """The index of CUDA ``device`` (``"cuda"`` alone: the current device, 0 without CUDA)."""
    device = torch.device(device)
    if device.index is not None:
        return device.index
    try:
        return torch.cuda.current_device()
    except (RuntimeError, AssertionError):  # no CUDA here (tests)
        return 0


def record_self_tests(device: torch.device | str,
                      results: dict[str, Callable[..., Any] | None]) -> None:
    """Record the self-tests of the Triton kernels on CUDA ``device``: ``{op: kernel}`` for
    those that passed (the kernel computes ``op`` on that GPU from now on), ``{op: None}``
    for those that failed. Only :func:`~dplang.models.kernels.triton_check.admit_kernels`
    calls it."""
    unknown = set(results) - set(gpu_ops())
    if unknown:
        raise KeyError(f"no Triton kernel for {sorted(unknown)} (known: {', '.join(gpu_ops())})")
    _admitted[cuda_index(device)] = dict(results)


def self_tests_of(device: torch.device | str) -> dict[str, bool] | None:
    """``{op: passed}`` of the self-tests recorded for CUDA ``device``, or ``None`` (none)."""
    results = _admitted.get(cuda_index(device))
    return None if results is None else {op: k is not None for op, k in results.items()}


def withdraw_all() -> None:
    """Forget every self-test and admitted Triton kernel, on every GPU (the torch definitions
    compute everything on CUDA until kernels are admitted again; for tests)."""
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
        # a kernel admitted on this very GPU; else (not tested here, or failed) the definition
        return _admitted.get(tensor.device.index or 0, {}).get(op)
    return None

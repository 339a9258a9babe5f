"""Compute dtypes and CPU facts for the model backends (no model code here)."""

from __future__ import annotations

import os

import torch

__all__ = ["DTYPES", "available_cores", "native_bfloat16", "resolve_dtype"]

#: Accepted ``dtype`` names of the backends (``--dtype``).
DTYPES = ("auto", "float32", "bfloat16")


def available_cores() -> int:
    """Number of CPU cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def native_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices natively (AVX512-BF16 or AMX-BF16 in
    ``/proc/cpuinfo``, and oneDNN available to PyTorch)."""
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        flags: set[str] = set()
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("flags"):
                    flags.update(line.split(":", 1)[1].split())
                    break
    except OSError:  # not Linux, or no /proc: stay with float32
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The torch dtype for a ``dtype`` name: ``"auto"`` is bfloat16 where
    :func:`native_bfloat16`, else float32."""
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"dtype must be float32 or bfloat16, got {dtype}")
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if native_bfloat16() else torch.float32
    if dtype == "float32":
        return torch.float32
    if dtype == "bfloat16":
        return torch.bfloat16
    raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")

"""Compute dtypes and CPU facts for the model backends (no model code here)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported when a dtype is resolved, not by the flag checks
    import torch

__all__ = ["DTYPES", "available_cores", "resolve_dtype"]

#: Accepted ``dtype`` names of the backends (``--dtype``).
DTYPES = ("auto", "float32", "bfloat16")


#: Environment variables that set the default thread count (first one set wins).
THREAD_VARIABLES = ("DPLANG_THREADS", "OMP_NUM_THREADS")


def available_cores() -> int:
    """Threads a model uses by default: ``$DPLANG_THREADS`` or ``$OMP_NUM_THREADS`` when set
    (a positive integer), else the number of CPU cores this process may run on. The thread
    count changes speed only, never a bit of the results."""
    for name in THREAD_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value:
            try:
                count = int(value)
            except ValueError:
                raise ValueError(f"{name} must be a positive integer, got {value!r}") from None
            if count < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
            return count
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The precision for a ``dtype`` name: ``"float32"`` (16-bit integer weights),
    ``"bfloat16"`` (8-bit integer weights in the body) or ``"auto"`` (bfloat16, the runs'
    default: its texts cannot be told from float32's by the metrics a user sees, and it is
    faster; docs/generation.md)."""
    import torch

    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"dtype must be float32 or bfloat16, got {dtype}")
        return dtype
    if dtype == "float32":
        return torch.float32
    if dtype in ("auto", "bfloat16"):
        return torch.bfloat16
    raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")

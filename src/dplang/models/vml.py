"""Resolve oneMKL's vector-math dispatch before any multithreaded use of it.

PyTorch's CPU builds with MKL compute contiguous float unary operations (``cos``, ``sin``,
``exp``, ``log``, ``sqrt``, ``tanh``, ``erf``, ...) by calling oneMKL's VML on each intra-op
thread's chunk, asking for its high-accuracy kernels (``VML_HA``, about 1 ulp). oneMKL 2024.2,
the version in the PyTorch 2.10–2.13 wheels, chooses each function's kernel lazily, on the
function's first call. When that first call runs on several threads at once, one thread can
run a low-accuracy kernel (the AVX2 "EP" kernel: about half the mantissa bits) over its whole
chunk of that one call; later calls are accurate (pytorch/pytorch#188792, fixed upstream by
the same warm-up as here and by oneMKL >= 2025.0).

In dplang this was the default model failing to load about one time in five on a busy
machine: the first ``cos`` of a process is transformers' rotary table, which the load-time
check compares with dplang's own (issue 33: one thread's half of the table off by up to
1.5e-4). The exact decoder's private arithmetic never calls these functions on the CPU (it
uses basic operations only, ``docs/privacy.md``), but the float model that verifies it at a
first load, transformers' rotary module, and the evaluation's embedders do.

:func:`resolve_vml_dispatch` calls every VML-routed function once, on one element (so on one
thread), in float32 and float64: each function's kernel is then chosen before any concurrent
first call can race. It is idempotent and takes about a millisecond.
"""

from __future__ import annotations

import threading

import torch

__all__ = ["VML_FUNCTIONS", "resolve_vml_dispatch"]

#: The unary functions ATen routes to oneMKL's VML (``IMPLEMENT_VML_MKL`` in
#: ``ATen/cpu/vml.h``); a test compares this list with the header of the installed PyTorch.
VML_FUNCTIONS = ("acos", "asin", "atan", "cos", "erf", "erfc", "erfinv", "exp", "log",
                 "log10", "log2", "sin", "sqrt", "tan", "tanh", "trunc")

_lock = threading.Lock()
_resolved = False


def resolve_vml_dispatch() -> None:
    """Make the first call of every VML-routed function on one thread (once per process).

    Numerical contract: afterwards every call of these functions runs oneMKL's high-accuracy
    kernel on every thread, whatever the load or the thread split; without it, the first call
    of each may compute one thread's chunk with a kernel about 4,000 ulp off."""
    global _resolved
    if _resolved:
        return
    with _lock:
        if _resolved:
            return
        for dtype in (torch.float32, torch.float64):
            one = torch.full((1,), 0.5, dtype=dtype)  # in every function's domain
            for name in VML_FUNCTIONS:
                getattr(torch, name)(one)
        _resolved = True

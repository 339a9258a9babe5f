"""Resident memory of a model load: file pages of released weights, and the C heap after it.

A safetensors checkpoint is memory-mapped when ``transformers`` loads it: a float32 weight's
pages become resident when dplang makes its integer copy, and they stay resident (counted in
the process's RSS) until the whole mapping is closed, even once that weight is released, so a
load used to peak at the float model plus its integer copy. :func:`release_file_pages` drops a
released weight's pages (``madvise(MADV_DONTNEED)`` on the page-aligned interior of its bytes)
only where every one of them is a clean page of a regular file: the range must lie in one
mapping of a file that exists, and ``/proc/self/pagemap`` must show no page of it that was
written (a private copy, which ``MADV_DONTNEED`` would discard) or swapped. A clean file page
that is dropped is read back from the file if it is ever touched again, so no value can change,
whoever else holds the tensor; a range with a written page is left as it is.
:func:`trim_heap` returns the C heap's free pages to the system (glibc's
``malloc_trim``). Both act on Linux with glibc only and do nothing elsewhere.

Privacy: neither changes a number dplang computes or writes; they change memory use only.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from functools import cache

import numpy as np
import torch

__all__ = ["release_file_pages", "trim_heap"]

_MADV_DONTNEED = 4  # Linux
_PRESENT, _SWAPPED, _FILE_OR_SHARED = 1 << 63, 1 << 62, 1 << 61  # /proc/self/pagemap bits


@cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        lib = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:  # not glibc (musl, ...): nothing to do
        return None
    if not hasattr(lib, "madvise") or not hasattr(lib, "malloc_trim"):
        return None
    lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lib.madvise.restype = ctypes.c_int
    lib.malloc_trim.argtypes = [ctypes.c_size_t]
    lib.malloc_trim.restype = ctypes.c_int
    return lib


def _in_one_file_mapping(low: int, high: int) -> bool:
    """Whether ``[low, high)`` lies within one of this process's mappings of a regular file
    that still exists (``/proc/self/maps``). Only the mapping that holds the range is looked
    at further: a load releases hundreds of weights and the process maps about a thousand
    ranges, so checking every file (as an earlier version did) took seconds per load."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                span, _, rest = line.partition(" ")
                begin, _, end = span.partition("-")
                try:
                    if not int(begin, 16) <= low or not high <= int(end, 16):
                        continue
                except ValueError:
                    continue
                fields = rest.split(maxsplit=4)
                if len(fields) < 5 or fields[3] == "0" or not fields[4].startswith("/"):
                    return False  # anonymous, or a pseudo-file such as [heap] or [stack]
                path = fields[4].rstrip("\n")
                # a device (/dev/...) or a file that is gone: leave it alone
                return not path.endswith(" (deleted)") and os.path.isfile(path)
    except OSError:
        return False
    return False


def release_file_pages(tensor: torch.Tensor) -> int:
    """Drop the resident file pages under a released CPU ``tensor``'s bytes.

    Only the whole pages inside the tensor's bytes are advised, and only if they lie within
    one mapping of a regular file and none of them was written or swapped; anonymous memory
    is never touched. Returns the number of bytes advised (0 where nothing was done). The
    tensor stays valid and its values unchanged: a dropped page is read back from the file."""
    lib = _libc()
    if lib is None or tensor.device.type != "cpu" or not tensor.is_contiguous():
        return 0
    size = tensor.numel() * tensor.element_size()
    if size == 0:
        return 0
    page = mmap.PAGESIZE
    start = tensor.data_ptr()
    low = -(-start // page) * page
    high = (start + size) // page * page
    if high <= low:
        return 0
    if not _in_one_file_mapping(low, high):
        return 0
    if not _clean_file_pages(low, high):
        return 0
    if lib.madvise(ctypes.c_void_p(low), ctypes.c_size_t(high - low), _MADV_DONTNEED) != 0:
        return 0
    return high - low


def _clean_file_pages(low: int, high: int) -> bool:
    """Whether no page in ``[low, high)`` is a written private copy or swapped out (a page not
    present is fine: there is nothing to drop)."""
    page = mmap.PAGESIZE
    count = (high - low) // page
    try:
        with open("/proc/self/pagemap", "rb") as pagemap:
            pagemap.seek(low // page * 8)
            raw = pagemap.read(count * 8)
    except OSError:
        return False
    if len(raw) != count * 8:
        return False
    entries = np.frombuffer(raw, dtype="<u8")
    present = (entries & np.uint64(_PRESENT)) != 0
    swapped = (entries & np.uint64(_SWAPPED)) != 0
    file_page = (entries & np.uint64(_FILE_OR_SHARED)) != 0
    return not bool(np.any(swapped | (present & ~file_page)))


def trim_heap() -> bool:
    """Return the C heap's free pages to the system (glibc ``malloc_trim(0)``); True if
    anything was returned."""
    lib = _libc()
    return bool(lib is not None and lib.malloc_trim(0))

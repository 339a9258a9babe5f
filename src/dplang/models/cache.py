"""dplang's cache root, a leaf every other module of :mod:`dplang.models` may import (the
default model's folder, the numba kernels' cache, the row-invariance records)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    """dplang's cache root: ``$DPLANG_CACHE_DIR`` or the platform's user cache dir."""
    override = os.environ.get("DPLANG_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("dplang"))

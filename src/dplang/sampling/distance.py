"""Total variation distance between two laws on a finite set: a leaf of
:mod:`dplang.sampling`, for the evaluation (:mod:`.evaluation`) and the product laws
(:mod:`.product_tv`) alike. Evaluation on known laws: it releases nothing."""

from __future__ import annotations

import numpy as np

__all__ = ["tv_distance"]


def tv_distance(p: np.ndarray, q: np.ndarray) -> float:
    """½‖p − q‖₁."""
    return 0.5 * float(np.abs(np.asarray(p, dtype=np.float64) - np.asarray(q, np.float64)).sum())

"""Next-token distributions in float64, shared by the baselines that compare them.

Amin et al. (SVT on the L1 distance between the private and public distributions) and
AdaPMixED (Rényi divergences between mixtures) both need softmax probabilities accurate far
below float32's resolution; computing them here once keeps the two consistent.
"""

from __future__ import annotations

import numpy as np

from .._lazy import lazy_module

torch = lazy_module("torch")

__all__ = ["softmax64"]


def softmax64(logits: torch.Tensor, temperature: float = 1.0) -> np.ndarray:
    """``softmax(logits / temperature)`` over the last axis, computed in float64 (numpy).

    Pure post-processing: it adds no privacy cost of its own."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    z = logits.detach().to(torch.float64).cpu().numpy() / temperature
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)

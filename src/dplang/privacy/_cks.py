"""Exact random primitives over uniform 64-bit words (Canonne, Kamath & Steinke 2020).

The integer and rational arithmetic behind :func:`dplang.privacy.mechanisms.discrete_laplace`
and :func:`~dplang.privacy.mechanisms.discrete_gaussian`: uniform integers below a bound,
exact Bernoulli(num/den) and Bernoulli(exp(−γ)) coins (CKS 2020, Algorithm 1), the discrete
Laplace (Algorithm 2) and the discrete Gaussian (Algorithm 3). Every random decision is made
from words drawn with ``rng.integers``, so every output is a deterministic function of the
generator's state. Privacy contracts are stated once, in :mod:`dplang.privacy.mechanisms`, which
is the only caller.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["_Bits"]

_TWO64 = 1 << 64


class _Bits:
    """Exact random primitives over uniform 64-bit words drawn from ``rng.integers``.

    Words are fetched in chunks for speed; the sequence of words (and therefore every output)
    is a deterministic function of the generator's state.
    """

    __slots__ = ("_buf", "_chunk", "_pos", "_rng")

    def __init__(self, rng: np.random.Generator, expected_words: int = 64) -> None:
        self._rng = rng
        self._chunk = int(min(8192, max(16, expected_words)))
        self._buf: list[int] = []
        self._pos = 0

    def word(self) -> int:
        """A uniform integer in [0, 2⁶⁴)."""
        if self._pos >= len(self._buf):
            self._buf = self._rng.integers(
                0, _TWO64, size=self._chunk, dtype=np.uint64, endpoint=False
            ).tolist()
            self._pos = 0
        w = self._buf[self._pos]
        self._pos += 1
        return w

    def below(self, n: int) -> int:
        """A uniform integer in [0, n) (n ≥ 1), by exact rejection sampling."""
        if n <= 1:
            return 0
        k = (n - 1).bit_length()
        words = (k + 63) // 64
        shift = 64 * words - k
        while True:
            r = 0
            for _ in range(words):
                r = (r << 64) | self.word()
            r >>= shift
            if r < n:
                return r

    def bernoulli(self, num: int, den: int) -> bool:
        """Exact Bernoulli(num/den) for integers 0 ≤ num, 0 < den.

        Compares a uniform U ∈ [0, 1), revealed 64 bits at a time, with num/den; the expected
        number of words is 1 + 2⁻⁶⁴ + … whatever the size of den.
        """
        if num <= 0:
            return False
        if num >= den:
            return True
        rem = num
        while True:
            q, rem = divmod(rem << 64, den)
            w = self.word()
            if w != q:
                return w < q
            if rem == 0:
                # U ≥ num/den with U's remaining bits uniform: P(U < num/den) = 0 here.
                return False

    def bernoulli_exp_le1(self, num: int, den: int) -> bool:
        """Exact Bernoulli(exp(−γ)) for γ = num/den ∈ [0, 1] (CKS 2020, Algorithm 1)."""
        k = 1
        while self.bernoulli(num, den * k):
            k += 1
        return k % 2 == 1

    def bernoulli_exp(self, num: int, den: int) -> bool:
        """Exact Bernoulli(exp(−γ)) for any γ = num/den ≥ 0 (CKS 2020, Algorithm 1)."""
        whole, frac = divmod(num, den)
        for _ in range(whole):
            if not self.bernoulli_exp_le1(1, 1):
                return False
        return self.bernoulli_exp_le1(frac, den)

    def discrete_laplace(self, t: int, s: int) -> int:
        """Exact discrete Laplace with scale t/s, P(z) ∝ exp(−|z|·s/t) (CKS 2020, Alg. 2)."""
        while True:
            u = self.below(t)
            if not self.bernoulli_exp_le1(u, t):
                continue
            v = 0
            while self.bernoulli_exp_le1(1, 1):
                v += 1
            y = (u + t * v) // s
            negative = bool(self.word() & 1)
            if negative and y == 0:
                continue
            return -y if negative else y

    def discrete_gaussian(self, n: int, d: int) -> int:
        """Exact discrete Gaussian with σ² = n/d, P(z) ∝ exp(−z²/(2σ²)) (CKS 2020, Alg. 3)."""
        t = math.isqrt(n // d) + 1  # floor(σ) + 1, exactly
        # γ = (|y| − σ²/t)² / (2σ²) = (|y|·d·t − n)² / (2·n·d·t²), all integers.
        den = 2 * n * d * t * t
        dt = d * t
        while True:
            y = self.discrete_laplace(t, 1)
            a = abs(y) * dt - n
            if self.bernoulli_exp(a * a, den):
                return y

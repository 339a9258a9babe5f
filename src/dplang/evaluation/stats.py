"""99% Wald confidence intervals, the InvisibleInk paper's way of reporting every
metric (its §5.1 and Appendix D).

``x̄ ± z·s/√m`` with ``z = 2.576`` (two-sided 99%), ``s`` the sample standard deviation
(``ddof = 1``) and ``m`` the number of values: texts for per-text metrics, runs (seeds) for
per-run metrics such as MAUVE. Written by hand because it is three lines; ``scipy.stats`` would
give the same numbers (``norm.ppf(0.995) = 2.5758…``) but the paper rounds ``z`` to 2.576.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = ["Z_99", "Interval", "difference_interval", "wald_interval"]

#: Two-sided 99% normal quantile as used by the paper.
Z_99 = 2.576


@dataclass(frozen=True)
class Interval:
    """A mean with its Wald confidence interval.

    Attributes:
        mean: the sample mean ``x̄`` (NaN when there are no values).
        std: the sample standard deviation ``s`` (``ddof = 1``; NaN for fewer than 2 values).
        n: number of values ``m``.
        half_width: ``z·s/√m`` (NaN for fewer than 2 values: no interval).
        z: the normal quantile used.
    """

    mean: float
    std: float
    n: int
    half_width: float
    z: float = Z_99

    @property
    def low(self) -> float:
        """Lower end ``x̄ − z·s/√m``."""
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        """Upper end ``x̄ + z·s/√m``."""
        return self.mean + self.half_width

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dict (NaN becomes ``None``) with ``low`` and ``high`` added."""
        data = {**asdict(self), "low": self.low, "high": self.high}
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in data.items()}

    def format(self, digits: int = 2, scale: float = 1.0) -> str:
        """``"12.34 ± 0.56"`` (``± n/a`` without an interval), values multiplied by ``scale``."""
        if math.isnan(self.mean):
            return "n/a"
        if math.isnan(self.half_width):
            return f"{self.mean * scale:.{digits}f} ± n/a"
        return f"{self.mean * scale:.{digits}f} ± {self.half_width * scale:.{digits}f}"


def wald_interval(values: Iterable[float], z: float = Z_99) -> Interval:
    """Mean and Wald interval ``x̄ ± z·s/√m`` of ``values`` (non-finite values are an error)."""
    x = np.asarray(list(values), dtype=np.float64)
    if x.size and not np.all(np.isfinite(x)):
        raise ValueError("wald_interval: values must be finite")
    m = int(x.size)
    if m == 0:
        return Interval(math.nan, math.nan, 0, math.nan, z)
    mean = float(x.mean())
    if m < 2:
        return Interval(mean, math.nan, m, math.nan, z)
    std = float(x.std(ddof=1))
    return Interval(mean, std, m, z * std / math.sqrt(m), z)


def difference_interval(a: Interval, b: Interval) -> Interval:
    """Wald interval of ``mean(a) − mean(b)`` for two independent samples.

    Half-width ``z·√(s_a²/m_a + s_b²/m_b)``; ``std`` is NaN (there is no single sample) and
    ``n`` is ``min(m_a, m_b)``.
    """
    mean = a.mean - b.mean
    if math.isnan(a.half_width) or math.isnan(b.half_width):
        return Interval(mean, math.nan, min(a.n, b.n), math.nan, a.z)
    se = math.sqrt(a.std**2 / a.n + b.std**2 / b.n)
    return Interval(mean, math.nan, min(a.n, b.n), a.z * se, a.z)

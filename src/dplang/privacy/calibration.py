"""One calibrator: the parameter that meets a target, found on the safe side of it.

Every search in dplang for a mechanism's parameter — the ε a ρ implies at δ and the ρ an ε
allows, Amin et al.'s clip norm, the analytic Gaussian σ, the discrete Laplace margin of a
report's support test, the sample sizes of the samplers' bounds, the ε of the Sperner linear
programme — is the same problem: a predicate ``ok(x)`` ("x meets the target") that is monotone
in x, and the boundary value on the side where it holds. :func:`calibrate` solves it in three
steps, the way dp_accounting's ``mechanism_calibration`` does:

1. **bracket**: from the caller's interval [lo, hi], grow hi geometrically (×2) until ``ok``
   changes across [lo, hi];
2. **bisect** (arithmetic midpoints, or geometric ones on a log scale; integers when asked)
   until the bracket is within the tolerance, keeping the end where ``ok`` holds;
3. **check** that the value returned is on the safe side: ``ok`` was evaluated True there
   (the end the caller gave is evaluated when the search never moved it), otherwise
   :class:`CalibrationError`. The returned value is never the end where ``ok`` failed, nor a
   root-finder's estimate that may lie on either side.

``safe="above"``: ``ok`` holds from the boundary up (a noise scale, a sample size, the ε of a
conversion): the result is the smallest value found with ``ok`` True. ``safe="below"``: ``ok``
holds up to the boundary (a zCDP ρ, a clip norm): the result is the largest value found with
``ok`` True.

Privacy contract: none of its own — it returns a value at which the caller's ``ok`` was
evaluated True; a caller's guarantee holds when its ``ok`` is exactly its privacy condition.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

__all__ = ["CalibrationError", "calibrate"]

#: bisection steps at most (enough to reach adjacent floats from any bracket of floats)
MAX_STEPS = 200


class CalibrationError(ValueError):
    """No value on the safe side was found (the bracket never changed sign before ``limit``,
    or the end the caller said was safe is not)."""


def calibrate(
    ok: Callable[[float], bool],
    lo: float,
    hi: float,
    *,
    safe: Literal["above", "below"],
    rtol: float = 0.0,
    xtol: float = 0.0,
    steps: int = MAX_STEPS,
    log_scale: bool = False,
    integer: bool = False,
    slide: bool = True,
    limit: float = math.inf,
) -> float | int:
    """The boundary value of the monotone predicate ``ok`` on its safe side (module docstring).

    Args:
        ok: the target, monotone in x: False then True (``safe="above"``) or True then False
            (``safe="below"``).
        lo, hi: the starting bracket, 0 ≤ lo < hi. ``safe="above"``: the result is ≥ lo (lo
            itself when ``ok(lo)``). ``safe="below"``: lo must satisfy ``ok`` (it is checked
            when the search never replaces it).
        rtol, xtol: stop when hi − lo ≤ max(xtol, rtol·hi) (arithmetic), or when
            hi/lo ≤ 1 + rtol (``log_scale``); with neither, bisect to adjacent floats
            (at most ``steps`` steps). Integers stop when hi − lo ≤ 1.
        log_scale: geometric midpoints √(lo·hi) (lo > 0), for a parameter known only to within
            orders of magnitude.
        integer: integer probes (bracket ends rounded up, integer midpoints): the result is
            the exact boundary integer.
        slide: while growing the bracket, move lo to the last probe that failed (the default,
            as dp_accounting does). ``False`` keeps the caller's lo: a few more steps, kept
            where a published value depends on the exact sequence of probes.
        limit: the bracket grows no further than this (the last probe is ``limit`` itself);
            :class:`CalibrationError` when ``ok`` has still not changed there.

    Returns:
        a value at which ``ok`` was evaluated True: the smallest found (``"above"``) or the
        largest found (``"below"``); an ``int`` when ``integer`` (probes are ints too).
    """
    if safe not in ("above", "below"):
        raise ValueError(f"safe must be 'above' or 'below', got {safe!r}")
    if not lo < hi:
        raise ValueError(f"need lo < hi, got [{lo}, {hi}]")
    above = safe == "above"

    def holds(x: float) -> bool:
        return bool(ok(x))

    def grown(x: float) -> float:
        x = min(limit, x * 2)
        return math.ceil(x) if integer else x

    if integer:
        lo, hi = math.ceil(lo), math.ceil(hi)
    if above and holds(lo):
        return lo
    lo_checked = above  # "above": lo is known to fail; "below": lo is the caller's word
    # 1. bracket: grow hi until ok changes across [lo, hi]
    while holds(hi) != above:
        if hi >= limit:
            raise CalibrationError(f"the target is not met at the limit {limit:g}")
        if slide:
            lo, lo_checked = hi, True
        hi = grown(hi)
    # 2. bisect, keeping the end where ok holds (hi for "above", lo for "below")
    for _ in range(steps):
        if integer and hi - lo <= 1:
            break
        if log_scale:
            if hi / lo <= 1 + rtol:
                break
            mid = math.sqrt(float(lo) * float(hi))
            if integer:
                mid = round(mid)
        elif integer:
            mid = (lo + hi) // 2
        else:
            if hi - lo <= max(xtol, rtol * hi):
                break
            mid = 0.5 * (lo + hi)
        if not lo < mid < hi:
            break
        if holds(mid) == above:
            hi = mid
        else:
            lo, lo_checked = mid, True
    # 3. the value returned is on the safe side
    if not (above or lo_checked or holds(lo)):
        raise CalibrationError(f"the target is not met at the safe end {lo:g} of the bracket")
    return hi if above else lo

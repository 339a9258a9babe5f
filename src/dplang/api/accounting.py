"""The InvisibleInk privacy calculation as one call: :func:`account` (``dplang account``).

Pure arithmetic on public parameters: it reads no data, charges nothing and writes nothing.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..privacy.accounting import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    BudgetLimitError,
    check_budget_limit,
    check_epsilon_limit,
)
from .errors import DPLangError
from .params import python_api

__all__ = ["ADJACENCY_CHOICES", "account"]

ADJACENCY_CHOICES = ("replace-by-null", "zero-out")


def _check(epsilon: float | None, rho: float | None, clip: float | None, delta: float,
           tokens: int, batch_size: int, temperature: float, adjacency: str) -> None:
    """Exactly one of ε, ρ, C; each in range (a budget above the limit is refused)."""
    given = [name for name, v in (("--epsilon", epsilon), ("--rho", rho), ("--clip", clip))
             if v is not None]
    if len(given) != 1:
        raise DPLangError("give exactly one of --epsilon, --rho or --clip"
                          + (f" (got {', '.join(given)})" if given else ""))
    if not 0 < delta < 1:
        raise DPLangError(f"--delta must be in (0, 1), got {delta}")
    try:
        check_budget_limit(epsilon, name="--epsilon")
        check_budget_limit(rho, name="--rho", kind="rho", delta=delta)
    except BudgetLimitError as exc:
        raise DPLangError(str(exc)) from None
    if clip is not None and not (clip > 0 and math.isfinite(clip)):
        raise DPLangError(f"--clip must be finite and > 0, got {clip}")
    if tokens < 1:
        raise DPLangError(f"--tokens must be >= 1, got {tokens}")
    if batch_size < 1:
        raise DPLangError(f"--batch-size must be >= 1, got {batch_size}")
    if not (temperature > 0 and math.isfinite(temperature)):
        raise DPLangError(f"--temperature must be > 0, got {temperature}")
    if adjacency not in ADJACENCY_CHOICES:
        raise DPLangError(f"--adjacency must be one of {', '.join(ADJACENCY_CHOICES)}, got "
                          f"{adjacency}")


@python_api
def account(
    *,
    epsilon: float | None = None,
    rho: float | None = None,
    clip: float | None = None,
    delta: float = 1e-6,
    tokens: int = DEFAULT_MAX_TOKENS,
    batch_size: int = DEFAULT_BATCH_SIZE,
    temperature: float = DEFAULT_TEMPERATURE,
    adjacency: str = "replace-by-null",
) -> dict[str, Any]:
    """What ``dplang account --json`` prints, as a dict: from exactly one of ``epsilon`` (at
    ``delta``), ``rho`` or ``clip``: ``rho``, ``epsilon``, ``delta``, ``clip`` (the clip norm
    ``generate`` calibrates for the same T, B and τ: ``C = B·τ·√(2ρ/T)``, halved under
    zero-out), ``margin`` (Top-k+, 2C/B), ``per_token_epsilon`` and the inputs.

    Privacy contract: none needed (public arithmetic; no data, no ledger). A budget above
    ε = 100 is refused, like a clip norm whose ε is; refusals raise :class:`DPLangError`
    with the command line's message."""
    from ..textgen.methods.invisibleink import invisibleink_budget

    epsilon, rho, clip = (None if v is None else float(v) for v in (epsilon, rho, clip))
    delta, temperature = float(delta), float(temperature)
    _check(epsilon, rho, clip, delta, tokens, batch_size, temperature, adjacency)
    try:
        result: dict[str, Any] = dict(invisibleink_budget(
            epsilon=epsilon, rho=rho, clip=clip, delta=delta, tokens=tokens,
            batch_size=batch_size, temperature=temperature, adjacency=adjacency))
    except (ValueError, OverflowError):  # only a huge clip gets here (ρ overflows)
        result = {"epsilon": math.inf}
    if clip is not None:
        try:
            check_epsilon_limit(float(result["epsilon"]), f"--clip {clip:g}", delta)
        except BudgetLimitError as exc:
            raise DPLangError(str(exc)) from None
    return json.loads(json.dumps(result))  # exactly what --json prints

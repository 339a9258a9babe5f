"""``dplang account``: the InvisibleInk privacy calculation."""

from __future__ import annotations

import json
import math

import typer

from ..privacy.accounting import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    BudgetLimitError,
    check_budget_limit,
    check_epsilon_limit,
)
from ..textgen.methods.invisibleink import invisibleink_budget
from .errors import fail

ADJACENCY_CHOICES = ("replace-by-null", "zero-out")


def validate_budget_flags(
    epsilon: float | None, rho: float | None, clip: float | None, delta: float
) -> None:
    """Exactly one of --epsilon, --rho, --clip; each in range (a budget above
    :data:`~dplang.privacy.accounting.MAX_EPSILON` is refused)."""
    given = [name for name, v in (("--epsilon", epsilon), ("--rho", rho), ("--clip", clip))
             if v is not None]
    if len(given) != 1:
        fail("give exactly one of --epsilon, --rho or --clip"
             + (f" (got {', '.join(given)})" if given else ""))
    if not 0 < delta < 1:
        fail(f"--delta must be in (0, 1), got {delta}")
    try:
        check_budget_limit(epsilon, name="--epsilon")
        check_budget_limit(rho, name="--rho", kind="rho", delta=delta)
    except BudgetLimitError as exc:
        fail(str(exc))
    if clip is not None and not (clip > 0 and math.isfinite(clip)):
        fail(f"--clip must be finite and > 0, got {clip}")


def validate_generation_flags(tokens: int, batch_size: int, temperature: float,
                              adjacency: str) -> None:
    if tokens < 1:
        fail(f"--tokens must be >= 1, got {tokens}")
    if batch_size < 1:
        fail(f"--batch-size must be >= 1, got {batch_size}")
    if not (temperature > 0 and math.isfinite(temperature)):
        fail(f"--temperature must be > 0, got {temperature}")
    if adjacency not in ADJACENCY_CHOICES:
        fail(f"--adjacency must be one of {', '.join(ADJACENCY_CHOICES)}, got {adjacency}")


def account(
    epsilon: float | None = typer.Option(None, "--epsilon", help="Target ε (with --delta)."),
    delta: float = typer.Option(1e-6, "--delta", help="Target δ."),
    rho: float | None = typer.Option(None, "--rho", help="zCDP budget ρ instead of ε."),
    clip: float | None = typer.Option(
        None, "--clip", help="Clip norm C instead of a budget: print the ε it implies."
    ),
    tokens: int = typer.Option(DEFAULT_MAX_TOKENS, "--tokens", "--max-tokens", "-T",
                               help="Maximum tokens T per generation."),
    batch_size: int = typer.Option(
        DEFAULT_BATCH_SIZE, "--batch-size", "-B", help="Private references B per generation."
    ),
    temperature: float = typer.Option(DEFAULT_TEMPERATURE, "--temperature",
                                      help="Sampling temperature τ (generate's default)."),
    adjacency: str = typer.Option(
        "replace-by-null", "--adjacency", help="replace-by-null (default) or zero-out."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """InvisibleInk privacy calculation: ρ ↔ (ε, δ), the clip norm C, the Top-k+ margin."""
    validate_budget_flags(epsilon, rho, clip, delta)
    validate_generation_flags(tokens, batch_size, temperature, adjacency)
    try:
        r = invisibleink_budget(epsilon=epsilon, rho=rho, clip=clip, delta=delta,
                                tokens=tokens, batch_size=batch_size, temperature=temperature,
                                adjacency=adjacency)
    except (ValueError, OverflowError):  # only a huge --clip gets here (ρ overflows)
        r = {"epsilon": math.inf}
    if clip is not None:
        try:
            check_epsilon_limit(float(r["epsilon"]), f"--clip {clip:g}", delta)
        except BudgetLimitError as exc:
            fail(str(exc))
    if as_json:
        typer.echo(json.dumps(r))
        return
    lines = [
        f"InvisibleInk privacy calculation ({adjacency} adjacency, unit = one reference)",
        f"  T = {tokens} tokens, B = {batch_size} references, temperature = {temperature:g}",
        f"  zCDP                       rho     = {r['rho']:.6g}",
        f"  (epsilon, delta)-DP        epsilon = {r['epsilon']:.6g}, delta = {delta:g}"
        "  (tight conversion)",
        f"  clip norm                  C       = {r['clip']:.6g}"
        + ("  (calibrated: C = B*tau*sqrt(2*rho/T)"
           + (" / 2)" if adjacency == "zero-out" else ")") if clip is None else "  (given)"),
        f"  Top-k+ margin              2C/B    = {r['margin']:.6g}",
        f"  per-token pure-DP bound    2*sens/tau = {r['per_token_epsilon']:.6g}",
        "  The whole run is charged for T tokens whatever it emits; generations over",
        "  disjoint batches compose in parallel, so rho does not grow with their number.",
    ]
    typer.echo("\n".join(lines))

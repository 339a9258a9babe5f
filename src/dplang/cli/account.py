"""``dplang account``: the InvisibleInk privacy calculation."""

from __future__ import annotations

import json

import typer

from ..api.accounting import account as api_account  # its undecorated form: flags' names
from ..api.errors import DPLangError
from ..privacy.accounting import DEFAULT_BATCH_SIZE, DEFAULT_MAX_TOKENS, DEFAULT_TEMPERATURE
from .errors import fail


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
    try:  # dplang.account: the same checks and numbers
        r = api_account.__wrapped__(epsilon=epsilon, rho=rho, clip=clip, delta=delta, tokens=tokens,
                        batch_size=batch_size, temperature=temperature, adjacency=adjacency)
    except DPLangError as exc:
        fail(str(exc), exc.code)
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

"""``dplang experiment``: run a sweep of generation + evaluation cells."""

from __future__ import annotations

from pathlib import Path

import typer

from ..experiments import ConfigError, load_config, run_experiment
from ..io import ReferenceDataError
from ..models import resolve_model
from ..textgen.runner import GenerationError
from .errors import fail


def _load_model(spec: str, dtype: str = "float32"):  # indirection: tests substitute a toy
    return resolve_model(spec, dtype=dtype)


def experiment(
    config: Path = typer.Argument(..., help="Experiment TOML file."),
    out: Path = typer.Option(..., "--out", help="Output directory (resumable)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress messages."),
    report_only: bool = typer.Option(
        False, "--report-only", help="Write the results of the finished cells; run nothing."
    ),
) -> None:
    """Run (or resume) a sweep over method, ε, B, k, τ and seed; write tables and plots."""
    try:
        cfg = load_config(config)
    except ConfigError as exc:
        fail(str(exc))
    if not cfg.data_path.exists():
        fail(f"data file not found: {cfg.data_path}")

    def say(msg: str) -> None:
        if not quiet:
            typer.echo(msg, err=True)

    try:
        rows = run_experiment(cfg, out, _load_model, progress=say, report_only=report_only)
    except (GenerationError, ReferenceDataError, FileNotFoundError, ValueError) as exc:
        fail(str(exc).splitlines()[0])
    typer.echo(f"{len(rows)} cells; results in {out / 'results.csv'} and {out / 'results.md'}")

"""``dplang sample``: release private samples of categorical or binary records."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from ..privacy.ledger import BudgetExceeded
from ..sampling.release import METHODS, ReleaseRequest, execute_release, plan_release
from ..sampling.tabular import SamplingDataError, parse_domain
from .errors import fail


def sample(
    data: Path = typer.Option(..., "--data", help="Records: CSV, TSV, JSONL or Parquet."),
    columns: str = typer.Option(..., "--columns", help="Comma-separated columns A,B,C."),
    epsilon: float = typer.Option(..., "--epsilon", help="Privacy parameter ε (> 0)."),
    out: Path = typer.Option(..., "--out", help="Output .csv or .jsonl (+ OUT.manifest.json)."),
    delta: float | None = typer.Option(None, "--delta", help="δ in (0, 1) for (ε, δ) methods."),
    num: int = typer.Option(1, "--num", "-m", help="Number of samples m."),
    method: str = typer.Option(
        "discrete-laplace", "--method",
        help=f"One of {', '.join(METHODS)}. The first three treat a record (the tuple of the "
        "columns) as one of k categories; the others need binary columns."),
    seed: int | None = typer.Option(
        None, "--seed", help="Secret seed (default: fresh OS entropy); not recorded."),
    domain: list[str] | None = typer.Option(
        None, "--domain",
        help="Public categories of a column: COL=a,b,c or COL=1..5 (repeatable). Needed for "
        "every non-binary column."),
    split: bool = typer.Option(
        True, "--split/--no-split",
        help="Draw the m samples from disjoint blocks of rows (default; costs one draw's ε) "
        "or each from all rows (costs m times ε)."),
    alpha: float = typer.Option(0.1, "--alpha", help="Target accuracy α (method product)."),
    force: bool = typer.Option(False, "--force", help="Release even if the accuracy bound "
                               "is vacuous."),
    ledger: Path | None = typer.Option(None, "--ledger", help="Privacy ledger (SQLite) path."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only errors and warnings."),
) -> None:
    """Release m differentially private samples of records (RSSS NeurIPS 2021 samplers)."""
    try:
        domains = dict(parse_domain(spec) for spec in (domain or []))
        request = ReleaseRequest(
            data=data, columns=tuple(c.strip() for c in columns.split(",")), epsilon=epsilon,
            out=out, delta=delta, num=num, method=method, seed=seed, domains=domains,
            split=split, alpha=alpha, force=force, ledger=ledger,
        )
        plan = plan_release(request)
    except SamplingDataError as exc:
        fail(str(exc).splitlines()[0])
    except (ValueError, OSError) as exc:
        fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    for warning in plan.warnings:
        typer.echo(f"warning: {warning}", err=True)
    try:
        manifest = execute_release(plan)
    except BudgetExceeded as exc:
        fail(str(exc), code=3)
    console = Console(quiet=quiet, highlight=False, soft_wrap=True)
    g = plan.guarantee
    console.print(
        f"{method}: {num} sample(s) of {len(plan.table.columns)} column(s) from "
        f"{plan.table.n} rows ({plan.rows_per_sample} per sample) → {out}")
    console.print(f"accuracy: {plan.accuracy_note}")
    release = manifest["ledger"]["release_id"][:12]
    console.print(f"manifest: {plan.manifest_path}; ledger release {release}")
    console.print(g.summary())

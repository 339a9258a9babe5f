"""``dplang sample``: release private samples of categorical, integer or binary records."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ..api.errors import DPLangError
from .console import RichDisplay, quiet_libraries
from .errors import fail
from .options import dataset_option, ledger_option, overwrite_option, seed_option

if TYPE_CHECKING:
    from ..sampling.tabular import ColumnSpec

# The samplers (numpy, scipy) are imported when a release runs, not when the command is built
# (`dplang sample --help` answers at once). Their names, for the help text (the same as
# dplang.sampling.release.METHODS: tests/cli/test_habits.py checks):
METHODS = ("discrete-laplace", "laplace", "reveal-or-obscure", "clipped-mean", "product",
           "laplace-marginals", "gaussian-marginals")


def declared_types(domain: list[str], binary: list[str], schema: Path | None,
                   fallback: list[str]) -> dict[str, ColumnSpec]:
    """The public column types from ``--schema``, ``--binary`` and ``--domain`` (each column
    declared once), with ``--fallback COL=VALUE`` applied. Reads no data."""
    from ..sampling.tabular import (
        ColumnSpec,
        SamplingDataError,
        binary_column,
        load_schema,
        parse_column,
    )

    types: dict[str, ColumnSpec] = dict(load_schema(schema)) if schema is not None else {}
    declared = [binary_column(c.strip()) for spec in binary for c in spec.split(",")
                if c.strip()]
    declared += [parse_column(spec) for spec in domain]
    for col in declared:
        if col.name in types:
            raise SamplingDataError(f"column {col.name!r} is declared twice")
        types[col.name] = col
    for spec in fallback:
        name, sep, value = spec.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise SamplingDataError(f"--fallback {spec!r}: expected COLUMN=VALUE")
        if name not in types:
            raise SamplingDataError(f"--fallback {spec!r}: column {name!r} has no declared type")
        old = types[name]
        types[name] = ColumnSpec(old.name, old.kind, old.values, value)
    return types


def sample(
    data: Path = typer.Option(..., "--data", help="Records: a CSV, TSV, JSONL, Parquet or "
                              "Arrow file, or a saved Hugging Face dataset folder."),
    columns: str = typer.Option(..., "--columns", help="Comma-separated columns A,B,C."),
    epsilon: float = typer.Option(..., "--epsilon", help="Privacy parameter ε (> 0)."),
    out: Path = typer.Option(..., "--out", help="Output .csv or .jsonl (+ OUT.manifest.json)."),
    delta: float | None = typer.Option(None, "--delta", help="δ in (0, 1) for (ε, δ) methods."),
    num: int = typer.Option(1, "--num", "-m", help="Number of samples m."),
    method: str = typer.Option(
        "discrete-laplace", "--method",
        help=f"One of {', '.join(METHODS)}. The first three treat a record (the tuple of the "
        "columns) as one of k categories; the others need binary columns."),
    seed: int | None = seed_option("not stored"),
    domain: list[str] | None = typer.Option(
        None, "--domain",
        help="Declare a column's public categories: COL=a,b,c (categorical) or COL=1..5 "
        "(integer range) (repeatable)."),
    binary: list[str] | None = typer.Option(
        None, "--binary", help="Declare binary columns: A,B (repeatable)."),
    schema: Path | None = typer.Option(
        None, "--schema", help="Public schema TOML declaring the column types."),
    fallback: list[str] | None = typer.Option(
        None, "--fallback",
        help="COL=VALUE: where out-of-domain cells of COL go (default: its first value, 0 for "
        "binary columns, lo for ranges)."),
    out_of_domain: str = typer.Option(
        "map", "--out-of-domain",
        help="map (default): cells outside their declared domain are mapped by the public rule "
        "(clip numbers, else the fallback); refuse: stop with an error (a refusal that "
        "depends on the data)."),
    split: bool = typer.Option(
        True, "--split/--no-split",
        help="Draw the m samples from disjoint blocks of rows (default; costs one draw's ε) "
        "or each from all rows (costs m times ε)."),
    alpha: float = typer.Option(0.1, "--alpha", help="Target accuracy α (method product)."),
    force: bool = typer.Option(False, "--force", help="Release even if the accuracy bound "
                               "is vacuous."),
    ledger: str | None = ledger_option(),
    dataset: str | None = dataset_option(),
    overwrite: bool = overwrite_option(
        "Replace an existing output (its files are replaced only after the new charge)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only errors and warnings."),
) -> None:
    """Release m differentially private samples of records (RSSS NeurIPS 2021 samplers)."""
    with quiet_libraries(quiet):
        _sample(data, columns, epsilon, out, delta, num, method, seed, domain, binary, schema,
                fallback, out_of_domain, split, alpha, force, ledger, dataset, overwrite, quiet)


def _sample(data: Path, columns: str, epsilon: float, out: Path, delta: float | None, num: int,
            method: str, seed: int | None, domain: list[str] | None, binary: list[str] | None,
            schema: Path | None, fallback: list[str] | None, out_of_domain: str, split: bool,
            alpha: float, force: bool, ledger: str | None, dataset: str | None,
            overwrite: bool, quiet: bool) -> None:
    from ..api.sampling import run_sample
    from ..sampling.release import ReleaseRequest
    from ..sampling.tabular import SamplingDataError

    try:
        types = declared_types(domain or [], binary or [], schema, fallback or [])
    except SamplingDataError as exc:
        fail(str(exc).splitlines()[0])
    request = ReleaseRequest(
        data=data, columns=tuple(c.strip() for c in columns.split(",")), epsilon=epsilon,
        out=out, delta=delta, num=num, method=method, seed=seed, types=types,
        split=split, alpha=alpha, force=force, ledger=ledger, dataset=dataset,
        out_of_domain=out_of_domain, overwrite=overwrite,
    )
    try:  # what dplang.sample runs, with the command line's display
        plan, _manifest = run_sample(request, display=RichDisplay(quiet))
    except DPLangError as exc:
        fail(str(exc), exc.code)
    from rich.console import Console

    console = Console(quiet=quiet, highlight=False, soft_wrap=True, markup=False)  # paths
    g = plan.guarantee
    console.print(
        f"{method}: {num} sample(s) of {len(plan.table.columns)} column(s) from "
        f"{plan.table.n} rows ({plan.rows_per_sample} per sample) → {out}")
    console.print(f"accuracy: {plan.accuracy_note}")
    console.print(f"public manifest: {plan.manifest_path}; private side file (mode 600, never "
                  f"publish it): {plan.private_path}")
    console.print(g.summary())

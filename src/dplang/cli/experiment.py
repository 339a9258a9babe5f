"""``dplang experiment``: run a sweep of generation + evaluation cells."""

from __future__ import annotations

from pathlib import Path

import typer

from .console import quiet_libraries
from .errors import fail, use_threads
from .options import dataset_option, ledger_option, overwrite_option

# The sweep's machinery (torch, the models) is imported when it runs, not when the command is
# built: `dplang experiment --help` answers at once.


def _load_model(spec: str, dtype: str = "float32"):  # indirection: tests substitute a toy
    from ..models import resolve_model

    return resolve_model(spec, dtype=dtype)


def _check_model(spec: str) -> None:  # milliseconds: is [generation].model loadable at all?
    from ..models.default import check_model_spec

    check_model_spec(spec)


def experiment(
    config: Path = typer.Argument(..., help="Experiment TOML file."),
    out: Path = typer.Option(..., "--out", help="Output directory (resumable)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress messages."),
    report_only: bool = typer.Option(
        False, "--report-only", help="Write the results of the finished cells; run nothing."
    ),
    ledger: str | None = ledger_option(),
    dataset: str | None = dataset_option("[data].dataset, else the data file's resolved path"),
    data: Path | None = typer.Option(
        None, "--data", help="The data file, instead of [data].path (e.g. from another clone)."),
    overwrite: bool = overwrite_option(
        "Generate anew the cells this --out holds with other generation settings (new "
        "releases, charged anew); without it they are refused."),
) -> None:
    """Run (or resume) a sweep over method, ε, B, k, τ and replicate; write tables and plots.

    Every private cell is a release charged to the user's ledger under the dataset's name.
    The whole sweep is checked before any model loads; a cell that an earlier run generated
    with other settings is refused, one whose evaluation settings changed is re-evaluated."""
    from ..experiments import ConfigError, load_config, run_experiment
    from ..experiments.config import missing_data_message
    from ..io import ReferenceDataError
    from ..privacy.ledger import BudgetExceeded, LedgerError
    from ..release import ReleaseError
    from ..textgen.orchestration import GenerationError

    try:
        cfg = load_config(config, data=data)
    except ConfigError as exc:
        fail(str(exc))
    missing = missing_data_message(cfg)
    if missing:
        fail(missing)

    def say(msg: str) -> None:
        if not quiet:
            typer.echo(msg, err=True)

    if cfg.written_seeds and not report_only:
        typer.echo("warning: this configuration writes its seeds ([sweep].seeds): a written "
                   "seed is not secret and voids the privacy guarantee, so its cells are toy "
                   "runs (labelled so in their public manifests and in the ledger, refused "
                   "when the dataset has a budget); use written seeds for toy or public data "
                   "only (omit them to give every cell a secret seed)", err=True)
    use_threads(cfg.threads)
    try:
        with quiet_libraries(quiet):
            rows = run_experiment(cfg, out, _load_model, progress=say,
                                  report_only=report_only, ledger=ledger, dataset=dataset,
                                  check_model=_check_model, overwrite=overwrite,
                                  warn=lambda m: typer.echo(f"warning: {m}", err=True))
    except KeyboardInterrupt:  # what a stopped sweep kept, and how it resumes
        raise KeyboardInterrupt(
            f"interrupted: the finished cells and the unfinished cell's generations are kept "
            f"in {out}; run the same command again to resume (each cell's seed is kept in its "
            "private side file, from before its charge: no cell is charged twice); `dplang "
            "ledger show` lists the charges") from None
    except BudgetExceeded as exc:
        fail(str(exc), code=3)
    except (ConfigError, GenerationError, ReferenceDataError, ReleaseError, LedgerError,
            FileNotFoundError, ValueError) as exc:
        # the sweep's data options live in its configuration, not on the command line
        fail(str(exc).splitlines()[0].replace("--text-column", "[data].text_column"))
    if not quiet:
        typer.echo(f"{len(rows)} cells; results in {out / 'results.csv'} and "
                   f"{out / 'results.md'}")

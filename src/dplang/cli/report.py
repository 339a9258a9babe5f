"""``dplang report``: an evidence-bearing report by proposal-and-filter (``docs/reports.md``).

The command parses its flags into a :class:`~dplang.reports.pipeline.ReportRequest`, calls
:func:`~dplang.api.reporting.run_report_checked` (what ``dplang.report`` calls: it checks the
budget, then plans, charges the ledger and writes, in the order the privacy argument needs)
and prints the certificates and the guarantee.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ..io import DATA_FORMATS_HELP
from .errors import fail
from .options import dataset_option, ledger_option, overwrite_option, seed_option

if TYPE_CHECKING:
    from ..reports.pipeline import ReportRequest


def _load_model(spec: str) -> Any:  # indirection so tests can substitute a toy model
    from ..models import resolve_model

    return resolve_model(spec)


def report(
    data: Path = typer.Option(..., "--data", help=f"Private corpus: {DATA_FORMATS_HELP}."),
    out: Path = typer.Option(..., "--out", help="Writes OUT.json and OUT.md."),
    epsilon: float = typer.Option(..., "--epsilon", help="Total ε over all candidates."),
    threshold: float = typer.Option(..., "--threshold", help="Reporting threshold θ in [0, 1]."),
    beta: float = typer.Option(0.05, "--beta", help="Failure probability β in (0, 1/2)."),
    statements: Path | None = typer.Option(
        None, "--statements", help="Candidates: one per line, optional '<TAB>regex'."),
    schema: Path | None = typer.Option(None, "--schema", help="Candidates: template schema TOML."),
    task: str | None = typer.Option(
        None, "--task", help="Candidates drafted by a language model from this public task."),
    proposer_model: str = typer.Option("default", "--proposer-model",
                                       help="Model for --task: 'default' or a path."),
    proposals: int = typer.Option(20, "--proposals", help="Drafts to sample with --task."),
    proposal_seed: int = typer.Option(0, "--proposal-seed", help="Seed of the (public) drafts."),
    text_column: str = typer.Option("text", "--text-column", help="Column with the text."),
    predicate: str = typer.Option("keyword", "--predicate",
                                  help="keyword, embedding or entailment."),
    judge: Path | None = typer.Option(None, "--judge", help="Entailment judge model folder."),
    similarity: float = typer.Option(0.5, "--similarity",
                                     help="Cosine threshold of the embedding predicate."),
    chunk_words: int = typer.Option(48, "--chunk-words",
                                    help="Chunk size (words) for embedding/entailment."),
    noise: str = typer.Option("discrete-laplace", "--noise",
                              help="discrete-laplace, laplace or gaussian."),
    delta: float = typer.Option(1e-5, "--delta", help="Total δ (gaussian noise only)."),
    composition: str = typer.Option("basic", "--composition",
                                    help="basic, or zcdp (gaussian only)."),
    bonferroni: bool = typer.Option(False, "--bonferroni",
                                    help="β is family-wise: each test uses β/m."),
    release_abstained_bounds: bool = typer.Option(
        False, "--release-abstained-bounds", help="Also show L for abstentions (no extra cost)."),
    seed: int | None = seed_option("not stored"),
    ledger: str | None = ledger_option(),
    dataset: str | None = dataset_option(),
    overwrite: bool = overwrite_option(
        "Replace an existing OUT.json / OUT.md (removed only after the new charge)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only errors and warnings."),
) -> None:
    """Certify candidate statements about a private corpus, or abstain, under DP."""
    from .console import quiet_libraries

    with quiet_libraries(quiet):
        from ..reports.pipeline import ReportRequest

        request = ReportRequest(
            data=data, out=out, epsilon=epsilon, threshold=threshold, beta=beta,
            statements=statements, schema=schema, task=task, proposer_model=proposer_model,
            proposals=proposals, proposal_seed=proposal_seed, text_column=text_column,
            predicate=predicate, judge=judge, similarity=similarity, chunk_words=chunk_words,
            noise=noise, delta=delta, composition=composition, bonferroni=bonferroni,
            release_abstained_bounds=release_abstained_bounds, seed=seed, ledger=ledger,
            dataset=dataset, overwrite=overwrite)
        _report(request, quiet)


def _report(request: ReportRequest, quiet: bool) -> None:
    from ..api.errors import DPLangError
    from ..api.reporting import run_report_checked
    from ..reports.render import certificate_line
    from .console import RichDisplay

    display = RichDisplay(quiet)
    console = display.console
    try:
        result = run_report_checked(request, display=display,
                                    load_model=lambda spec: _load_model(spec))
    except DPLangError as exc:
        fail(str(exc), exc.code)
    report = result.report
    for c in sorted(report.certificates, key=lambda c: c.decision != "emit"):
        console.print(certificate_line(c), markup=False, highlight=False)
    console.print(f"{len(report.emitted)} emitted, {len(report.abstained)} abstained of "
                  f"{report.m} candidates (τ = {report.test.tau:.4g}); wrote "
                  f"{result.json_path} and {result.md_path}", markup=False, highlight=False)
    if not quiet:
        typer.echo(result.guarantee.summary())

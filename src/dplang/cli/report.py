"""``dplang report``: an evidence-bearing report by proposal-and-filter (spec 003).

Order of work (the privacy argument depends on it): parameters and candidate statements are
validated and deduplicated and the predicate is built *before* the data is read; the release
pipeline (:mod:`dplang.release`) charges the ledger before anything is written; the public
outputs (OUT.json, OUT.md) contain no seed, noise, exact support, data digest, data path or
count of the private rows; those that the data holder may need (digest, path, blank rows,
dataset name, release id) go to the private side file OUT.private.json (mode 600).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from .errors import fail


def _load_model(spec: str) -> Any:  # indirection so tests can substitute a toy model
    from ..models import resolve_model

    return resolve_model(spec)


def _check_model(spec: str) -> None:  # milliseconds: is --proposer-model loadable at all?
    from ..models.default import check_model_spec

    check_model_spec(spec, "--proposer-model")


def _statements(statements: Path | None, schema: Path | None, task: str | None,
                proposer_model: str, proposals: int, proposal_seed: int) -> tuple[list, dict]:
    from ..reports.proposers import LanguageModelProposer, ListProposer, load_schema

    given = [x for x in (statements, schema, task) if x is not None]
    if len(given) != 1:
        fail("give exactly one of --statements FILE.txt, --schema FILE.toml or --task TEXT")
    if statements is not None:
        raw = ListProposer.from_file(statements).statements
        return raw, {"source": "list", "path": str(statements), "proposed": len(raw)}
    if schema is not None:
        proposer = load_schema(schema)
        raw = proposer.enumerate()
        return raw, {"source": "schema", "path": str(schema), "proposed": len(raw)}
    assert task is not None
    try:
        model = _load_model(proposer_model)
    except Exception as exc:  # any loading failure is one line; nothing is charged yet
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        fail(f"--proposer-model {proposer_model}: cannot load it ({first})")
    lm = LanguageModelProposer(model, task, num=proposals, seed=proposal_seed)
    raw = lm.propose()
    return raw, {"source": "language model", "model": getattr(model, "model_id", proposer_model),
                 "task": task, "drafts": proposals, "proposal_seed": proposal_seed,
                 "proposed": len(raw)}


def _predicate(kind: str, judge: Path | None, similarity: float, chunk_words: int) -> Any:
    from ..reports.predicates import EmbeddingPredicate, EntailmentPredicate, KeywordPredicate

    if kind == "keyword":
        return KeywordPredicate()
    if kind == "embedding":
        return EmbeddingPredicate(similarity, max_words=chunk_words)
    if kind == "entailment":
        if judge is None:
            fail("--predicate entailment needs --judge PATH (a local NLI model or causal LM)")
        return EntailmentPredicate(judge, max_words=chunk_words)
    fail(f"--predicate must be keyword, embedding or entailment, got {kind!r}")


def report(
    data: Path = typer.Option(..., "--data", help="Private corpus: CSV, TSV, JSONL, Parquet."),
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
    seed: int | None = typer.Option(
        None, "--seed", help="Secret seed for reproducible noise (default: OS entropy)."),
    ledger: Path | None = typer.Option(None, "--ledger", help="Privacy ledger (SQLite) path."),
    dataset: str | None = typer.Option(
        None, "--dataset",
        help="Ledger name of the data's budget (default: the data file's resolved path)."),
    overwrite: bool = typer.Option(
        False, "--overwrite",
        help="Replace an existing OUT.json / OUT.md (removed only after the new charge)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only errors and warnings."),
) -> None:
    """Certify candidate statements about a private corpus, or abstain, under DP."""
    from .console import quiet_libraries

    with quiet_libraries(quiet), contextlib.ExitStack() as stack:
        from .. import io
        from ..privacy.ledger import BudgetExceeded, LedgerError, check_ledger_path
        from ..release import (
            Release,
            ReleaseError,
            RunLock,
            check_output_path,
            dataset_name,
            fresh_seed,
        )
        from ..reports.mechanism import FilterConfig, ReportConfigError, calibrate, certify_counts
        from ..reports.predicates import PredicateError, support_counts
        from ..reports.render import (
            certificate_line,
            private_path_for,
            report_paths,
            write_report,
        )
        from ..reports.statements import StatementError, deduplicate, validate_statements

        console = Console(stderr=True, quiet=quiet, soft_wrap=True)
        config = FilterConfig(epsilon=epsilon, beta=beta, theta=threshold, noise=noise, delta=delta,
                              composition=composition, bonferroni=bonferroni,
                              release_abstained_bounds=release_abstained_bounds)
        try:
            config.validate()
        except ReportConfigError as exc:
            fail(str(exc))
        if seed is not None and seed < 0:
            fail(f"--seed must be >= 0, got {seed}")
        if chunk_words < 1:
            fail(f"--chunk-words must be >= 1, got {chunk_words}")
        if proposals < 1:
            fail(f"--proposals must be >= 1, got {proposals}")
        if not (math.isfinite(similarity) and -1 <= similarity <= 1):
            fail(f"--similarity must be in [-1, 1], got {similarity}")
        json_path, md_path = report_paths(out)
        private_path = private_path_for(out)
        try:  # every path before anything is read, loaded or charged
            for path in (json_path, md_path, private_path):
                check_output_path(path)
            check_ledger_path(ledger)
            dataset_name(data, dataset)
        except (ReleaseError, LedgerError) as exc:
            fail(str(exc))
        existing = [p for p in (json_path, md_path, private_path) if p.exists()]
        if existing and not overwrite:
            fail(f"{existing[0]} already exists; choose another --out, or --overwrite to "
                 "replace the report (after the new release is charged)")
        if not data.exists():
            fail(f"data file not found: {data}")
        if not data.is_file():
            fail(f"--data {data} is not a file")
        if task is not None:
            from ..models.default import ModelSpecError

            try:
                _check_model(proposer_model)
            except ModelSpecError as exc:
                fail(str(exc))
        try:  # a second process writing the same report is refused
            stack.enter_context(RunLock(json_path))
        except ReleaseError as exc:
            fail(str(exc))

        # 1. candidates: public, deduplicated before the data is touched
        try:
            raw, source = _statements(statements, schema, task, proposer_model, proposals,
                                      proposal_seed)
            candidates = deduplicate(raw)
            validate_statements(candidates, need_rules=(predicate == "keyword"))
        except StatementError as exc:
            fail(str(exc))
        source["after_deduplication"] = len(candidates)

        # 2. the predicate, fixed before the data is read
        try:
            pred = _predicate(predicate, judge, similarity, chunk_words)
            pred.check(candidates)
        except PredicateError as exc:
            fail(str(exc))

        # 3. the data (n = every row, blank rows included: public under replace-one)
        try:
            records, stats = io.load_references(data, text_column)
        except io.ReferenceDataError as exc:
            fail(str(exc).splitlines()[0])
        texts = [r.text for r in records]
        try:
            test, guarantee = calibrate(config, len(candidates), len(texts))
        except ReportConfigError as exc:
            fail(str(exc))

        from ..privacy.randomness import RandomStreams

        fingerprint = {
            "parameters": {"epsilon": epsilon, "threshold": threshold, "beta": beta,
                           "noise": noise, "delta": delta, "composition": composition,
                           "bonferroni": bonferroni,
                           "release_abstained_bounds": release_abstained_bounds,
                           "text_column": text_column},
            "candidates_sha256": hashlib.sha256(json.dumps(
                [[c.text, c.rule] for c in candidates],
                default=str).encode()).hexdigest(),
            "predicate": pred.describe(),
        }
        try:
            release = Release.open("report", data=data, guarantee=guarantee,
                                   fingerprint=fingerprint, dataset=dataset,
                                   seed=seed if seed is not None else fresh_seed(),
                                   ledger=ledger, description=f"dplang report → {out}",
                                   seed_source="given" if seed is not None else "fresh OS entropy")
        except (ReleaseError, io.ReferenceDataError) as exc:
            fail(str(exc))
        streams = RandomStreams(release.seed)
        with console.status(f"evaluating {len(candidates)} statements on {len(texts)} records…"):
            counts = support_counts(pred, candidates, texts)
        result = certify_counts(candidates, counts, len(texts), config, streams, pred)
        del counts  # exact supports: never written anywhere

        # 4. charge the ledger before writing anything (DESIGN.md invariant 6)
        try:
            release.charge(lambda w: typer.echo(f"warning: {w}", err=True))
        except BudgetExceeded as exc:
            fail(str(exc), code=3)
        except LedgerError as exc:
            fail(str(exc))
        release.write_private(private_path_for(out), release.private_record(
            keep_seed=False,
            data={"n_records": len(texts), "text_column": text_column,
                  "read": {"used": stats.used,
                           "unusable_by_reason": dict(stats.skipped_by_reason)}},
            outputs=[str(json_path), str(md_path)],
        ))
        write_report(result, out, {
            "command": "report",
            "text_column": text_column,
            "statements": source,
            "predicate": pred.describe(),
            "created": release.opened,  # before the support counts: no duration published
        }, write=release.write_output)

        for c in sorted(result.certificates, key=lambda c: c.decision != "emit"):
            console.print(certificate_line(c), markup=False, highlight=False)
        console.print(f"{len(result.emitted)} emitted, {len(result.abstained)} abstained of "
                      f"{result.m} candidates (τ = {test.tau:.4g}); wrote {json_path} and "
                      f"{md_path}", markup=False, highlight=False)
        if not quiet:
            typer.echo(guarantee.summary())

"""A whole ``dplang report`` run as a library call: request → checks → plan → release → files.

The order of work is the privacy argument (``docs/reports.md``, "Privacy contract (order of
work)"; ``docs/privacy.md``, "Public and private files")::

    check_report(request)       parameters, output and ledger paths, the statement source,
                                the predicate kind, the proposer model's spec; reads nothing
    plan_report(request, ...)   the candidates (public, deduplicated) and the predicate, both
                                fixed BEFORE the data is read; then the data (n = every row)
                                and the calibration; writes and charges nothing
    execute_report(plan, ...)   opens the release (:mod:`dplang.release`), charges the ledger,
                                runs the mechanism
                                (:func:`~dplang.reports.mechanism.proposal_and_filter`), then
                                writes the private side file (mode 600), OUT.json and OUT.md
                                (their times set to the release's start)
    run_report(request, ...)    the three, under the output's :class:`~dplang.release.RunLock`

The mechanism itself lives in :mod:`dplang.reports.mechanism`; this module only orders the
work around it and never touches the counts or the noise.

What is public: OUT.json and OUT.md hold the certificates, the guarantee and public metadata
(statement source, predicate description, text column, a timestamp): no seed, noise, exact
support, data digest, data path or count of private rows. The data holder's side file
OUT.private.json (mode 600) holds the digest, path, read statistics, dataset name and release
id.

Errors: every refusal is a :class:`ReportError` (a one-line message that names the flag; nothing
read, charged or written unless the message says otherwise), except
:class:`~dplang.privacy.ledger.BudgetExceeded`, raised by the charge (nothing written).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import io
from ..privacy.guarantees import Guarantee
from ..privacy.ledger import LedgerError, check_ledger_path
from ..release import (
    Charge,
    OutputPaths,
    Release,
    ReleaseError,
    RunLock,
    check_output_path,
    dataset_name,
    output_label,
)
from .mechanism import FilterConfig, Report, ReportConfigError, calibrate, proposal_and_filter
from .noise import SupportTest
from .predicates import PredicateError, SupportPredicate
from .render import report_paths, write_report
from .statements import Statement, StatementError, deduplicate, validate_statements

__all__ = [
    "PREDICATES",
    "ReportError",
    "ReportPlan",
    "ReportRequest",
    "ReportResult",
    "check_report",
    "execute_report",
    "plan_report",
    "run_report",
]

#: The support predicates a request can name (``--predicate``).
PREDICATES = ("keyword", "embedding", "entailment")

LoadModel = Callable[[str], Any]
Status = Callable[[str], AbstractContextManager[Any]]


class ReportError(ValueError):
    """A report cannot be made as asked (one-line message naming the flag)."""


@dataclass(frozen=True)
class ReportRequest:
    """Everything ``dplang report`` was asked for (the flags, without their dashes).

    Exactly one candidate source: ``statements`` (a ``.txt`` list), ``schema`` (a tag-template
    TOML) or ``task`` (drafted by ``proposer_model`` from this public text). ``seed`` is the
    secret noise seed (``None``: fresh OS entropy, stored nowhere)."""

    data: Path
    out: Path
    epsilon: float
    threshold: float
    beta: float = 0.05
    statements: Path | None = None
    schema: Path | None = None
    task: str | None = None
    proposer_model: str = "default"
    proposals: int = 20
    proposal_seed: int = 0
    text_column: str = "text"
    predicate: str = "keyword"
    judge: Path | None = None
    similarity: float = 0.5
    chunk_words: int = 48
    noise: str = "discrete-laplace"
    delta: float = 1e-5
    composition: str = "basic"
    bonferroni: bool = False
    release_abstained_bounds: bool = False
    seed: int | None = field(default=None, repr=False)  # secret
    ledger: str | Path | None = field(default=None, repr=False)  # may hold a password
    dataset: str | None = None
    overwrite: bool = False

    @property
    def config(self) -> FilterConfig:
        """The mechanism's public parameters."""
        return FilterConfig(epsilon=self.epsilon, beta=self.beta, theta=self.threshold,
                            noise=self.noise, delta=self.delta, composition=self.composition,
                            bonferroni=self.bonferroni,
                            release_abstained_bounds=self.release_abstained_bounds)

    @property
    def json_path(self) -> Path:
        return report_paths(self.out)[0]

    @property
    def md_path(self) -> Path:
        return report_paths(self.out)[1]

    @property
    def paths(self) -> OutputPaths:
        """The files of ``OUT.json`` (the report is its own public document: it has no
        separate manifest), its private side file and its lock."""
        return OutputPaths.of(self.json_path)

    @property
    def private_path(self) -> Path:
        return self.paths.private

    def existing(self) -> list[Path]:
        """The report's files that exist (a side file under an older name included)."""
        paths = self.paths
        return [p for p in (self.json_path, self.md_path, paths.private, *paths.legacy_privates)
                if p.exists()]

    @property
    def outputs(self) -> tuple[Path, Path, Path]:
        """OUT.json, OUT.md and the private side file OUT.private.json."""
        return self.json_path, self.md_path, self.private_path

    def parameters(self) -> dict[str, Any]:
        """The public parameters recorded in the release's fingerprint."""
        return {"epsilon": self.epsilon, "threshold": self.threshold, "beta": self.beta,
                "noise": self.noise, "delta": self.delta, "composition": self.composition,
                "bonferroni": self.bonferroni,
                "release_abstained_bounds": self.release_abstained_bounds,
                "text_column": self.text_column}


@dataclass
class ReportPlan:
    """A checked request with its public candidates and predicate, the data read and the
    calibration fixed. ``texts`` and ``stats`` are PRIVATE (the rows and what reading them
    found); everything else is public."""

    request: ReportRequest
    config: FilterConfig
    candidates: list[Statement]
    source: dict[str, Any]
    predicate: SupportPredicate
    texts: list[str | None]
    stats: io.ReadStats
    test: SupportTest
    guarantee: Guarantee

    def fingerprint(self) -> dict[str, Any]:
        """What determines the report besides the data and the seed (public)."""
        return {
            "parameters": self.request.parameters(),
            "candidates_sha256": hashlib.sha256(json.dumps(
                [[c.text, c.rule] for c in self.candidates],
                default=str).encode()).hexdigest(),
            "predicate": self.predicate.describe(),
        }


@dataclass
class ReportResult:
    """A released report: the certificates and guarantee, and where they were written."""

    report: Report
    plan: ReportPlan
    charge: Charge
    json_path: Path
    md_path: Path
    private_path: Path

    @property
    def guarantee(self) -> Guarantee:
        return self.report.guarantee


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def check_report(request: ReportRequest) -> None:
    """Refuse a request that cannot run, before anything is read, loaded or charged: the
    mechanism's parameters, the seed and proposer/predicate settings, the statement source,
    the predicate kind, the output and ledger paths (an existing output needs ``overwrite``),
    the dataset name, the data file's existence and the proposer model's spec (milliseconds).
    Raises :class:`ReportError`. Reads no data."""
    req = request
    try:
        req.config.validate()
    except ReportConfigError as exc:
        raise ReportError(str(exc)) from None
    if req.seed is not None and req.seed < 0:
        raise ReportError(f"--seed must be >= 0, got {req.seed}")
    if req.chunk_words < 1:
        raise ReportError(f"--chunk-words must be >= 1, got {req.chunk_words}")
    if req.proposals < 1:
        raise ReportError(f"--proposals must be >= 1, got {req.proposals}")
    if not (math.isfinite(req.similarity) and -1 <= req.similarity <= 1):
        raise ReportError(f"--similarity must be in [-1, 1], got {req.similarity}")
    if sum(x is not None for x in (req.statements, req.schema, req.task)) != 1:
        raise ReportError("give exactly one of --statements FILE.txt, --schema FILE.toml or "
                          "--task TEXT")
    if req.predicate not in PREDICATES:
        raise ReportError(f"--predicate must be keyword, embedding or entailment, got "
                          f"{req.predicate!r}")
    if req.predicate == "entailment" and req.judge is None:
        raise ReportError("--predicate entailment needs --judge PATH (a local NLI model or "
                          "causal LM)")
    if req.out.is_dir():  # OUT names files beside it (OUT.json, OUT.md): never a folder's
        raise ReportError(f"--out {req.out} is an existing folder; --out names the report's "
                          f"files (OUT.json, OUT.md): give e.g. --out {req.out / 'report'}")
    try:
        for path in req.outputs:
            check_output_path(path)
        check_ledger_path(req.ledger)
        dataset_name(req.data, req.dataset)
    except (ReleaseError, LedgerError) as exc:
        raise ReportError(str(exc)) from None
    existing = req.existing()
    if existing and not req.overwrite:
        raise ReportError(f"{existing[0]} already exists; choose another --out, or --overwrite "
                          "to replace the report (after the new release is charged)")
    problem = io.data_path_problem(req.data)  # a file, or a saved Hugging Face dataset
    if problem is not None:
        raise ReportError(problem if problem.startswith("data file not found")
                          else f"--data {problem}")
    if req.task is not None:
        from ..models.default import ModelSpecError, check_model_spec

        try:
            check_model_spec(req.proposer_model, "--proposer-model")
        except ModelSpecError as exc:
            raise ReportError(str(exc)) from None


def _default_loader(spec: str) -> Any:
    from ..models import resolve_model

    return resolve_model(spec)


def _candidates(req: ReportRequest, load_model: LoadModel) -> tuple[list[Statement],
                                                                     dict[str, Any]]:
    """The raw candidates and a public description of their source (no data involved)."""
    from .proposers import LanguageModelProposer, ListProposer, load_schema

    # a file by its name, not its folder (a path of the data holder's machine; for a list
    # given to dplang.report, a temporary one): what determines the report, the candidates,
    # is in the fingerprint's candidates_sha256
    if req.statements is not None:
        raw = ListProposer.from_file(req.statements).statements
        return raw, {"source": "list", "path": Path(req.statements).name, "proposed": len(raw)}
    if req.schema is not None:
        raw = load_schema(req.schema).enumerate()
        return raw, {"source": "schema", "path": Path(req.schema).name, "proposed": len(raw)}
    assert req.task is not None
    try:
        model = load_model(req.proposer_model)
    except Exception as exc:  # any loading failure is one line; nothing is charged yet
        from ..models.errors import load_failure_message

        raise ReportError(load_failure_message("--proposer-model", req.proposer_model,
                                               exc)) from None
    raw = LanguageModelProposer(model, req.task, num=req.proposals,
                                seed=req.proposal_seed).propose()
    return raw, {"source": "language model",
                 "model": getattr(model, "model_id", req.proposer_model), "task": req.task,
                 "drafts": req.proposals, "proposal_seed": req.proposal_seed,
                 "proposed": len(raw)}


def _predicate(req: ReportRequest) -> SupportPredicate:
    from .predicates import EmbeddingPredicate, EntailmentPredicate, KeywordPredicate

    if req.predicate == "keyword":
        return KeywordPredicate()
    if req.predicate == "embedding":
        return EmbeddingPredicate(req.similarity, max_words=req.chunk_words)
    assert req.judge is not None  # check_report
    return EntailmentPredicate(req.judge, max_words=req.chunk_words)


def plan_report(request: ReportRequest, load_model: LoadModel | None = None) -> ReportPlan:
    """Check the request, then fix the candidates and the predicate, then read the data and
    calibrate. Writes and charges nothing; raises :class:`ReportError`.

    ``load_model(spec)`` loads the proposer model for ``task`` (default
    :func:`dplang.models.resolve_model`).

    Privacy contract: the candidates (and their order) and the predicate are functions of
    public inputs only, fixed before the data file is opened; the calibration and the returned
    ``guarantee`` depend on the public parameters, m and n (every row, blank ones included:
    public under replace-one adjacency) and nothing else."""
    req = request
    check_report(req)
    try:
        raw, source = _candidates(req, load_model or _default_loader)
        candidates = deduplicate(raw)
        validate_statements(candidates, need_rules=(req.predicate == "keyword"))
    except StatementError as exc:
        raise ReportError(str(exc)) from None
    source["after_deduplication"] = len(candidates)
    try:
        predicate = _predicate(req)
        predicate.check(candidates)
    except PredicateError as exc:
        raise ReportError(str(exc)) from None
    # the data, only now (n = every row, blank rows included)
    try:
        records, stats = io.load_references(req.data, req.text_column)
    except io.ReferenceDataError as exc:
        raise ReportError(_first_line(exc)) from None
    texts = [r.text for r in records]
    config = req.config
    try:
        test, guarantee = calibrate(config, len(candidates), len(texts))
    except ReportConfigError as exc:
        raise ReportError(str(exc)) from None
    return ReportPlan(req, config, candidates, source, predicate, texts, stats, test, guarantee)


def execute_report(plan: ReportPlan, *, on_warning: Callable[[str], None] | None = None,
                   status: Status | None = None) -> ReportResult:
    """Charge the ledger, run the mechanism, write the private side file and the report.

    ``on_warning`` receives the ledger's warnings (for the data holder's terminal only: they
    compare private digests); ``status(message)`` is entered around the evaluation of the
    predicate and the support tests (a progress display). Raises :class:`ReportError`, or
    :class:`~dplang.privacy.ledger.BudgetExceeded` when the dataset's budget would be exceeded
    (nothing written).

    Privacy contract: the files written satisfy ``plan.guarantee`` (that of
    :func:`~dplang.reports.mechanism.proposal_and_filter` for the plan's m and n); the release
    (public fingerprint, dataset name, data digest, seed) is recorded in the ledger before
    anything is written; the public files hold post-processed certificates and public metadata
    only, the private side file holds the rest and never the seed. The charge comes before
    the mechanism's first computation on the records: a run stopped by an error, a Ctrl-C or
    a refusal after it is charged all the same. Runs under the output's lock."""
    req = plan.request
    try:
        with RunLock(req.paths.output):
            return _execute_locked(plan, on_warning, status)
    except ReleaseError as exc:
        raise ReportError(str(exc)) from None


def _execute_locked(plan: ReportPlan, on_warning: Callable[[str], None] | None,
                    status: Status | None) -> ReportResult:
    req = plan.request
    existing = req.existing()
    if existing and not req.overwrite:
        raise ReportError(f"{existing[0]} already exists; choose another --out, or --overwrite "
                          "to replace the report (after the new release is charged)")
    try:
        release = Release.open("report", data=req.data, guarantee=plan.guarantee,
                               fingerprint=plan.fingerprint(), dataset=req.dataset,
                               seed=req.seed, ledger=req.ledger,
                               description=f"dplang report → {output_label(req.out)}")
    except (ReleaseError, io.ReferenceDataError) as exc:
        raise ReportError(str(exc)) from None
    # the charge comes right before the first computation on the records (as generate's):
    # a crash that depends on a record, a Ctrl-C or a refusal can then never leave a
    # computation on the data unrecorded, and a refusal costs nothing because nothing ran
    with release.stops_reported([req.json_path, req.md_path]):  # what a stop left
        return _charge_and_write(plan, release, existing, on_warning, status)


def _charge_and_write(plan: ReportPlan, release: Release, existing: list[Path],
                      on_warning: Callable[[str], None] | None,
                      status: Status | None) -> ReportResult:
    req = plan.request
    n, m = len(plan.texts), len(plan.candidates)
    try:
        charge = release.charge(on_warning)
    except LedgerError as exc:
        raise ReportError(str(exc)) from None
    for path in existing:  # --overwrite: the earlier report goes now that this one is charged
        path.unlink(missing_ok=True)  # (a stop below never leaves two releases' files)
    with (status or _no_status)(f"evaluating {m} statements on {n} records…"):
        report = proposal_and_filter(plan.candidates, plan.texts, plan.predicate, plan.config,
                                     seed=release.stream_seed)
    release.write_private(req.paths, release.private_record(
        keep_seed=False,
        data={"n_records": n, "text_column": req.text_column,
              "read": {"used": plan.stats.used,
                       "unusable_by_reason": dict(plan.stats.skipped_by_reason)}},
        outputs=[str(req.json_path), str(req.md_path)],
    ))
    write_report(report, req.out, {
        "command": "report",
        "text_column": req.text_column,
        "statements": plan.source,
        "predicate": plan.predicate.describe(),
        "created": release.opened,  # before the support counts: no duration published
    }, write=release.write_output)
    return ReportResult(report, plan, charge, req.json_path, req.md_path, req.private_path)


@contextlib.contextmanager
def _no_status(_message: str) -> Iterator[None]:
    yield


def run_report(request: ReportRequest, *, load_model: LoadModel | None = None,
               on_warning: Callable[[str], None] | None = None,
               status: Status | None = None) -> ReportResult:
    """:func:`check_report`, then :func:`plan_report` and :func:`execute_report` under the
    output's lock (a second process writing the same report is refused with
    :class:`ReportError`). Privacy contract: that of :func:`execute_report`."""
    check_report(request)
    try:
        lock = RunLock(request.paths.output).acquire()
    except ReleaseError as exc:
        raise ReportError(str(exc)) from None
    try:
        plan = plan_report(request, load_model)
        return execute_report(plan, on_warning=on_warning, status=status)
    finally:
        lock.release()

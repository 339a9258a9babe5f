"""An evidence-bearing private report as one call: :func:`report`, and the run both it and
``dplang report`` go through (:func:`run_report_checked`).

Order of work (``docs/reports.md``, "Privacy contract (order of work)"): the request is
checked (nothing read), the dataset's budget is checked against the report's guarantee (fixed
by ε, δ and the noise alone) before any statement is proposed, model loaded or row read, then
:func:`~dplang.reports.pipeline.run_report` fixes the candidates and predicate, reads the
corpus, runs the mechanism, charges the ledger and writes the files.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..privacy.guarantees import Guarantee
from ..privacy.ledger import BudgetExceeded, PrivacyLedger
from ..privacy.ledger_backends import is_ledger_url, ledger_location
from ..release import dataset_name
from ..reports.mechanism import Certificate, ReportConfigError, calibrate
from ..reports.pipeline import ReportError, ReportRequest, check_report, run_report
from ..reports.pipeline import ReportResult as PipelineResult
from .data import data_input
from .display import Display, TqdmDisplay, quiet_libraries, short_guarantee
from .errors import BUDGET, DPLangError, Interrupted, input_error, one_line
from .outputs import output_location
from .params import python_api

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ReportResult", "report", "run_report_checked"]


def _check_budget_early(request: ReportRequest) -> None:
    """Refuse (code 3) a report the dataset's budget cannot take before anything is proposed,
    loaded or read: the report's (ε, δ) is fixed by its parameters (m and n only split it);
    skipped with a given seed (the same report may already be in the ledger)."""
    if request.seed is not None:
        return
    where = ledger_location(request.ledger)
    if not is_ledger_url(str(where)) and not Path(where).exists():
        return
    try:
        _test, guarantee = calibrate(request.config, 1, 1)
    except ReportConfigError:
        return  # check_report refused it already, or the real calibration will
    try:
        PrivacyLedger(where).check_charge(dataset_name(request.data, request.dataset),
                                          guarantee)
    except BudgetExceeded as exc:
        raise DPLangError(str(exc), BUDGET) from None


def run_report_checked(request: ReportRequest, *, display: Display,
                       load_model: Callable[[str], Any] | None = None) -> PipelineResult:
    """:func:`~dplang.reports.pipeline.run_report` with the budget checked first and its
    refusals as :class:`DPLangError` (code 2, or 3 over budget: nothing charged or written);
    a Ctrl-C is :class:`Interrupted`.

    Privacy contract: that of :func:`~dplang.reports.pipeline.execute_report`."""
    try:
        check_report(request)
    except ReportError as exc:
        raise DPLangError(one_line(exc)) from None
    _check_budget_early(request)
    try:
        return run_report(request, load_model=load_model, on_warning=display.warning,
                          status=display.status)
    except ReportError as exc:
        raise input_error(exc) from None
    except BudgetExceeded as exc:
        raise DPLangError(str(exc), BUDGET) from None
    except KeyboardInterrupt as exc:
        raise Interrupted(str(exc) or (  # the pipeline says what the stop left
            "interrupted before the report was written: a report is charged "
            "right before its first computation on the records, so a stop after that point "
            "counts (`dplang ledger show` lists the charges)")) from None


@dataclass(frozen=True)
class ReportResult:
    """What :func:`report` released: one certificate per candidate statement (emitted with a
    lower confidence bound on its support, or abstained), the guarantee, and the public report
    (``OUT.json`` as a dict, ``OUT.md`` as text)."""

    certificates: list[Certificate]
    guarantee: Guarantee
    document: dict[str, Any]
    markdown: str
    out: Path | None = None

    @property
    def emitted(self) -> list[Certificate]:
        return [c for c in self.certificates if c.decision == "emit"]

    @property
    def abstained(self) -> list[Certificate]:
        return [c for c in self.certificates if c.decision == "abstain"]

    def __repr__(self) -> str:
        return (f"ReportResult({len(self.emitted)} emitted, {len(self.abstained)} abstained of "
                f"{len(self.certificates)}, {short_guarantee(self.guarantee)})")

    def to_pandas(self) -> pd.DataFrame:
        """One row per candidate: ``statement``, ``decision``, ``lower_bound``,
        ``simultaneous_lower_bound``, ``threshold``."""
        import pandas as pd

        return pd.DataFrame([{"statement": c.statement, "decision": c.decision,
                              "lower_bound": c.lower_bound,
                              "simultaneous_lower_bound": c.simultaneous_lower_bound,
                              "threshold": c.threshold} for c in self.certificates],
                            columns=["statement", "decision", "lower_bound",
                                     "simultaneous_lower_bound", "threshold"])


def _statement_line(i: int, item: Any) -> str:
    """Statement ``i`` of a list as its line of a statements file; refused (never changed or
    dropped) when that line would read back as something else."""
    if isinstance(item, (tuple, list)) and len(item) == 2 and all(isinstance(x, str)
                                                                  for x in item):
        if "\t" in item[0]:
            raise DPLangError(f"statements[{i}]: its text holds a tab, which separates a "
                              "statement's text from its regex")
        line = f"{item[0]}\t{item[1]}"
    elif isinstance(item, str):
        line = item
    else:
        raise DPLangError("statements must be a .txt file or a list of statements "
                          "(\"text\", \"text<TAB>regex\" or (text, regex)), not "
                          f"{type(item).__name__} at statements[{i}]")
    if not line.partition("\t")[0].strip():
        raise DPLangError(f"statements[{i}] has no text")
    if len(line.splitlines()) != 1:
        raise DPLangError(f"statements[{i}] holds a line break: one statement is one line")
    if line.lstrip().startswith("#"):
        raise DPLangError(f"statements[{i}] starts with '#', which a statements file reads "
                          "as a comment: reword it")
    return line


@contextlib.contextmanager
def _statements_file(statements: str | Path | Sequence[Any] | None) -> Iterator[Path | None]:
    """``statements`` as the ``--statements`` file: a path, or a list of statements (``"text"``,
    ``"text<TAB>regex"`` or ``(text, regex)``) written to a temporary file (public)."""
    if statements is None or isinstance(statements, (str, Path)):
        yield None if statements is None else Path(statements).expanduser()
        return
    lines = [_statement_line(i, item) for i, item in enumerate(statements)]
    with tempfile.TemporaryDirectory(prefix="dplang-statements-") as folder:
        path = Path(folder) / "statements.txt"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        yield path


@python_api
def report(
    data: Any,
    *,
    epsilon: float,
    threshold: float,
    statements: str | Path | Sequence[Any] | None = None,
    schema: str | Path | None = None,
    task: str | None = None,
    dataset: str | None = None,
    ledger: str | Path | None = None,
    out: str | Path | None = None,
    beta: float = 0.05,
    text_column: str = "text",
    predicate: str = "keyword",
    judge: str | Path | None = None,
    similarity: float = 0.5,
    chunk_words: int = 48,
    noise: str = "discrete-laplace",
    delta: float = 1e-5,
    composition: str = "basic",
    bonferroni: bool = False,
    release_abstained_bounds: bool = False,
    proposer_model: str | Path = "default",
    proposals: int = 20,
    proposal_seed: int = 0,
    seed: int | None = None,
    overwrite: bool = False,
    quiet: bool = False,
) -> ReportResult:
    """Certify candidate statements about a private corpus, or abstain: ``dplang report`` as a
    function (``docs/reports.md``).

    ``data``: a list of texts, a DataFrame (``text_column``), a ``datasets.Dataset`` or a path.
    Candidates from exactly one of ``statements`` (a ``.txt`` file, or a list of ``"text"``,
    ``"text<TAB>regex"`` or ``(text, regex)``: the keyword predicate needs the regex),
    ``schema`` (a template TOML) or ``task`` (drafted by ``proposer_model`` from this public
    text). With ``out=`` it writes what ``dplang report --out`` writes (``OUT.json``,
    ``OUT.md``, the private side file); without it only the ledger entry lasts.

    Privacy contract: the certificates satisfy ``result.guarantee`` ((ε, δ)-DP, δ = 0 for
    Laplace noise, with respect to replacing one record), charged to the ledger under
    ``dataset`` (the path's default; required for data in memory) before anything is written;
    candidates and predicate are fixed before the corpus is read; a report over the dataset's
    budget is refused before anything is read or loaded. The noise seed is fresh OS entropy
    unless given (secret) and stored nowhere. Refusals raise :class:`DPLangError` with the
    command line's message."""
    display: Display = Display() if quiet else TqdmDisplay()
    with (quiet_libraries(quiet),
          data_input(data, dataset=dataset, text_column=text_column) as source,
          _statements_file(statements) as statements_path,
          output_location(out, "report") as (out_path, keep)):
        request = ReportRequest(
            data=source.path, out=out_path, epsilon=float(epsilon), threshold=float(threshold),
            beta=float(beta), statements=statements_path,
            schema=None if schema is None else Path(schema).expanduser(), task=task,
            proposer_model=str(proposer_model), proposals=proposals,
            proposal_seed=proposal_seed, text_column=text_column, predicate=predicate,
            judge=None if judge is None else Path(judge).expanduser(),
            similarity=float(similarity), chunk_words=chunk_words, noise=noise,
            delta=float(delta), composition=composition, bonferroni=bonferroni,
            release_abstained_bounds=release_abstained_bounds, seed=seed, ledger=ledger,
            dataset=source.dataset, overwrite=overwrite)
        result = run_report_checked(request, display=display)
        document = json.loads(result.json_path.read_text(encoding="utf-8"))
        markdown = result.md_path.read_text(encoding="utf-8")
    return ReportResult(list(result.report.certificates), result.guarantee, document, markdown,
                        out_path if keep else None)

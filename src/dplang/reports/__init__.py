"""Evidence-bearing reports under differential privacy: proposal-and-filter (``docs/reports.md``).

After *Evidence-bearing Insights under Differential Privacy: Beyond the Limits of Private Text
Generation* (anonymous workshop paper; "the paper" in this package).

A data-independent *proposer* drafts candidate statements; a frozen *support predicate*
σ_s(r) ∈ {0,1} says which records support each one; an ε₀-DP *support test* adds noise to each
support count and **emits** a statement, with a certified lower bound on its support, only when
that bound clears the threshold θ — otherwise it **abstains**. The report is ε-DP (unit = record,
replace-one adjacency) by composition over the m candidates, and a statement with support below θ
is emitted with probability at most β.

Modules (one job each): :mod:`.statements` (candidates, dedup, file format), :mod:`.proposers`
(list, tag-template schema, language model), :mod:`.chunking`, :mod:`.predicates` (keyword,
embedding, entailment), :mod:`.noise` (calibration, margins, exact emission law),
:mod:`.mechanism` (the filter, certificates, guarantee), :mod:`.pipeline` (a whole
``dplang report`` run: checks, plan, ledger charge, files — :func:`run_report`),
:mod:`.evaluation` (metrics and Theorem 5.2 checks on evaluation data), :mod:`.render` (JSON and
Markdown).
"""

from .chunking import chunk_text
from .evaluation import (
    EmitInterval,
    coverage,
    emit_rate,
    evaluate_report,
    exact_expected_emit_rate,
    false_emission,
    mean_support,
    theorem_5_2_interval,
    true_supports,
    unsupported_emit,
)
from .mechanism import (
    Certificate,
    FilterConfig,
    Report,
    ReportConfigError,
    calibrate,
    certify_counts,
    proposal_and_filter,
)
from .noise import NOISE_FAMILIES, SupportTest
from .pipeline import (
    ReportError,
    ReportPlan,
    ReportRequest,
    ReportResult,
    check_report,
    execute_report,
    plan_report,
    run_report,
)
from .predicates import (
    CallablePredicate,
    EmbeddingPredicate,
    EntailmentPredicate,
    KeywordPredicate,
    PredicateError,
    SupportPredicate,
    support_counts,
)
from .proposers import LanguageModelProposer, ListProposer, TemplateProposer, load_schema
from .render import report_to_dict, report_to_markdown, write_report
from .statements import Statement, StatementError, deduplicate, read_statements_file

__all__ = [
    "NOISE_FAMILIES",
    "CallablePredicate",
    "Certificate",
    "EmbeddingPredicate",
    "EmitInterval",
    "EntailmentPredicate",
    "FilterConfig",
    "KeywordPredicate",
    "LanguageModelProposer",
    "ListProposer",
    "PredicateError",
    "Report",
    "ReportConfigError",
    "ReportError",
    "ReportPlan",
    "ReportRequest",
    "ReportResult",
    "Statement",
    "StatementError",
    "SupportPredicate",
    "SupportTest",
    "TemplateProposer",
    "calibrate",
    "certify_counts",
    "check_report",
    "chunk_text",
    "coverage",
    "deduplicate",
    "emit_rate",
    "evaluate_report",
    "exact_expected_emit_rate",
    "execute_report",
    "false_emission",
    "load_schema",
    "mean_support",
    "plan_report",
    "proposal_and_filter",
    "read_statements_file",
    "report_to_dict",
    "report_to_markdown",
    "run_report",
    "support_counts",
    "theorem_5_2_interval",
    "true_supports",
    "unsupported_emit",
    "write_report",
]

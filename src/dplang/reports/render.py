"""Writing a report: ``REPORT.json`` (machine-readable) and ``REPORT.md`` (for a human).

Privacy contract: both documents are post-processing of a :class:`~dplang.reports.mechanism.
Report` plus public metadata (parameters, n, statement sources, predicate). They never contain
the seed, a noise draw, an exact support or count, the data file's digest or path, or any other
statistic of the data (not even the number of blank rows, which changes when one record is
replaced). n, the number of rows, is public under the report's replace-one adjacency
(neighbours have the same n). What the data holder needs besides (digest, path, blank rows,
release id) goes to the private side file ``.dplang-private/OUT.private.json``
(:class:`dplang.release.OutputPaths` of ``OUT.json``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import __version__
from ..release import write_atomic
from .mechanism import Certificate, Report
from .noise import SupportTest

__all__ = ["FORMAT", "report_paths", "report_to_dict", "report_to_markdown", "write_report"]

FORMAT = "dplang.report/1"


def report_paths(out: str | Path) -> tuple[Path, Path]:
    """``REPORT`` (or ``REPORT.json`` / ``REPORT.md``) → (``REPORT.json``, ``REPORT.md``)."""
    out = Path(out)
    if out.suffix.lower() in (".json", ".md"):
        out = out.with_suffix("")
    return out.with_name(out.name + ".json"), out.with_name(out.name + ".md")


def _clean(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def report_to_dict(report: Report, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON document: format, guarantee (+ plain-words summary), parameters, certificates.

    ``metadata`` (public only: statement source, predicate description, text column, a
    timestamp) is merged in under its own keys. It must hold nothing computed from the private
    rows: no data digest or path, no counts (those go to the private side file)."""
    cfg = report.config
    test = report.test
    doc: dict[str, Any] = {
        "format": FORMAT,
        "dplang_version": __version__,
        "mechanism": report.guarantee.mechanism,
        "guarantee": report.guarantee.to_dict(),
        "guarantee_summary": report.guarantee.summary(),
        "parameters": {
            "epsilon": cfg.epsilon,
            "delta": cfg.effective_delta,
            "beta": cfg.beta,
            "beta_per_candidate": test.beta,
            "beta_attained": test.beta_attained,
            "bonferroni": cfg.bonferroni,
            "threshold": cfg.theta,
            "noise": cfg.noise,
            "composition": cfg.composition,
            "tau": test.tau,
            "tau_counts": test.tau_count,
            "noise_scale": test.scale_support,
            "noise_scale_counts": test.scale,
            "epsilon_per_candidate": test.epsilon,
            "delta_per_candidate": test.delta,
            "rho_per_candidate": test.rho,
            "release_abstained_bounds": cfg.release_abstained_bounds,
            "candidates": report.m,
            "n_records": report.n,
            "full_support_emit_probability": report.full_support_emit_probability(),
            "simultaneous_beta": cfg.beta,
            "tau_simultaneous": _simultaneous(report).tau,
            "tau_counts_simultaneous": _simultaneous(report).tau_count,
        },
        "coverage": coverage_statement(report),
        "summary": {"emitted": len(report.emitted), "abstained": len(report.abstained)},
        "certificates": [c.to_dict() for c in report.certificates],
    }
    if metadata:
        for key, value in metadata.items():
            doc.setdefault(key, value)
    return _clean(doc)


def _simultaneous(report: Report) -> SupportTest:
    if report.simultaneous_test is not None:
        return report.simultaneous_test
    if report.config.bonferroni:
        return report.test
    return report.test.at_level(report.config.beta / report.m)


def coverage_statement(report: Report) -> str:
    """What the bounds promise *for the emitted statements*, in plain words.

    The per-candidate bound L holds with probability ≥ 1 − β for each candidate before the
    emission decision; selection by L ≥ θ keeps exactly the candidates whose noise was high,
    so it is no confidence level for what is shown. Valid after selection: the simultaneous
    bound (all candidates at once, family-wise level β) and the expected number of emitted
    statements whose L overstates their support (at most m·β)."""
    cfg, m = report.config, report.m
    beta = cfg.beta
    if cfg.bonferroni:
        per = (f"each candidate's test and bound are at level β/m = {beta:g}/{m}, so the "
               "per-candidate bound L is itself simultaneous")
    else:
        per = (f"the per-candidate bound L holds with probability ≥ {1 - report.test.beta:.4g} "
               "for each candidate BEFORE selection only; it is not a confidence level for the "
               "statements shown (emission selects candidates whose noise was high: if many "
               "candidates sit just below the threshold, every emitted L can overstate its "
               f"support). In expectation at most m·β = {m * report.test.beta:.4g} emitted "
               "statements have L above their true support")
    return (f"With probability at least {1 - beta:.4g}, every emitted statement is supported "
            f"by at least its simultaneous lower bound (all {m} candidates at once, whatever "
            f"was selected); {per}.")


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.4f}"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def report_to_markdown(report: Report, metadata: dict[str, Any] | None = None) -> str:
    """A human-readable report: emitted statements with certified lower bounds, the
    abstentions, and the guarantee and what a certificate means, in plain words."""
    cfg, test = report.config, report.test
    meta = metadata or {}
    emitted = sorted(report.emitted, key=lambda c: (-(c.lower_bound or 0.0), c.index))
    lines = ["# Evidence-bearing report", ""]
    lines.append(f"n = {report.n} records (every row of the private corpus, blank ones "
                 "included).")
    lines += [
        f"Candidates: {report.m} statements, fixed before the data was read"
        + (f" (source: {meta['statements']['source']})." if meta.get("statements") else "."),
        f"Emitted: {len(report.emitted)}; abstained: {len(report.abstained)}.",
        "",
        "## Emitted statements",
        "",
    ]
    if emitted:
        lines += [f"Statements whose certified support cleared the threshold θ = "
                  f"{cfg.theta:g}. With probability at least {1 - cfg.beta:.4g}, **every** "
                  "statement below is supported by at least its *simultaneous* lower bound "
                  "(valid for the statements shown, whatever was selected). The per-candidate "
                  "bound is the test statistic: it held with probability "
                  f"{1 - test.beta:.4g} for each candidate before selection, which is not a "
                  "confidence level for an emitted statement (see below).", "",
                  "| # | statement | simultaneous lower bound on support "
                  "| per-candidate bound (before selection) |", "|---|---|---|---|"]
        lines += [f"| {c.index} | {_md_escape(c.statement)} | "
                  f"≥ {_fmt(c.simultaneous_lower_bound)} | {c.lower_bound:.4f} |"
                  for c in emitted]
    else:
        lines.append("None: no candidate passed the support test.")
    lines += ["", "## Abstentions", ""]
    if report.abstained:
        lines.append("For these candidates the report abstains: the private support test did "
                     "not certify support at or above the threshold. An abstention is *not* "
                     "evidence that the statement is false or rare.")
        lines.append("")
        for c in report.abstained:
            bound = f" (lower bound {_fmt(c.lower_bound)})" if c.lower_bound is not None else ""
            lines.append(f"- [{c.index}] {c.statement}{bound}")
    else:
        lines.append("None.")
    g = report.guarantee
    family = (f" (Bonferroni: β = {cfg.beta:g}/{report.m} per statement)" if cfg.bonferroni
              else "")
    lines += [
        "",
        "## Privacy guarantee",
        "",
        g.summary(),
        "",
        f"Each of the {report.m} support tests adds {cfg.noise} noise "
        f"(scale {test.scale_support:.4g} in support units, i.e. {test.scale:.4g} records) to "
        f"the number of supporting records; the budget is split equally "
        f"({'zCDP' if cfg.composition == 'zcdp' else 'basic composition'}).",
        "",
        "## What a certificate means",
        "",
        f"- {coverage_statement(report)}",
        f"- The per-candidate bound L = f̂ − τ (τ = {test.tau:.4g}) satisfies "
        f"Pr[true support ≥ L] ≥ {1 - test.beta:.4g} for a candidate fixed in advance, "
        "before the emission decision; the simultaneous bound f̂ − τ_sim "
        f"(τ_sim = {_simultaneous(report).tau:.4g}, level β/m) comes from the same noisy count "
        "and costs no extra privacy.",
        f"- A statement whose true support is below θ = {cfg.theta:g} is emitted with "
        f"probability at most β = {test.beta:.4g}{family} (the attained level "
        f"Pr[noise ≥ τ] is {test.beta_attained:.4g}).",
        "- Support is measured by the predicate recorded in each certificate "
        f"({meta.get('predicate', {}).get('kind', 'see JSON')}); a certificate says nothing "
        "about truth beyond that predicate, nothing about statements that were not "
        "candidates, and gives no recall guarantee (supported statements can be abstained on).",
        f"- A statement supported by every record would be emitted with probability "
        f"{report.full_support_emit_probability():.4g}.",
        "",
    ]
    return "\n".join(lines)


def write_report(report: Report, out: str | Path, metadata: dict[str, Any] | None = None,
                 write: Callable[[Path, str], None] = write_atomic) -> tuple[Path, Path]:
    """Write ``OUT.json`` and ``OUT.md`` (atomically, with ``write``: pass the release's
    ``write_output`` so that nothing is written before the ledger charge). Returns the two
    paths."""
    json_path, md_path = report_paths(out)
    doc = report_to_dict(report, metadata)
    write(json_path, json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    write(md_path, report_to_markdown(report, metadata))
    return json_path, md_path


def certificate_line(c: Certificate) -> str:
    """One line for a terminal."""
    if c.decision == "emit":
        return (f"EMIT     L ≥ {c.lower_bound:.4f} (simultaneous ≥ "
                f"{_fmt(c.simultaneous_lower_bound)})  {c.statement}")
    return f"ABSTAIN             {c.statement}"

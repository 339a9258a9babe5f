"""``dplang ledger``: the privacy ledger — datasets, budgets, spend and releases.

``show`` prints, per dataset name, its budget, what its differentially private releases have
spent (ρ of the zCDP releases, (ε, δ) of the pure/approximate ones, and the total (ε, δ) at the
budget's δ, under the adjacency it holds for: the releases' common one, or replace-one when
they mix adjacencies, each release's adjacency shown), the data-dependent releases apart
(they are not differential privacy and are never summed into the DP total), and every release.
``budget NAME --epsilon E --delta D`` sets a dataset's total budget. NAME is a name, as with
``--dataset`` (:func:`dplang.release.dataset_key`), even where a file of that name exists;
``--data FILE`` instead of NAME (``show`` and ``budget``) names the key a release of FILE made
without ``--dataset`` is charged to: the file's resolved path.

A spend without zCDP releases is stated exactly, (Σε, Σδ), at any ``--delta`` (said when Σδ is
above it; no guarantee once Σδ ≥ 1). ``show --json`` is standard JSON: an infinite ε is
``null``, each release says ``not_private``, and ``dp.delta_asked`` is the δ the total was
asked at. ``budget`` says when it created the ledger (a mistyped ``--ledger``) and warns when
δ > :data:`LARGE_BUDGET_DELTA`.

``--ledger`` (default ``$DPLANG_LEDGER``) is an SQLite file or a ``postgresql://`` URL (a ledger
shared by several machines); a URL is printed with its password masked.

The ledger is private to the data holder (it holds content digests, paths and release ids):
``show`` prints no digest, only how many distinct contents a name has been charged with.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import typer

from ..privacy.ledger import BudgetExceeded, PrivacyLedger
from ..privacy.ledger_backends import is_ledger_url, ledger_location
from ..release import ReleaseError, dataset_key, dataset_name
from .errors import fail
from .options import ledger_option

app = typer.Typer(
    name="ledger",
    help="The privacy ledger: datasets, budgets, spend and releases.",
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
)

#: A budget δ above which ``ledger budget`` warns (it still sets it: δ is the data holder's
#: choice, and a good one depends on the number of records, which the ledger does not know).
LARGE_BUDGET_DELTA = 1e-3


def _key(name: str | None, data: Path | None = None) -> str:
    """The dataset key of ``NAME`` (a name as written: :func:`dplang.release.dataset_key`,
    the rule of ``--dataset``) or of ``--data FILE`` (the file's resolved path: the key of its
    releases made without ``--dataset``). Exactly one of the two."""
    if name is not None and data is not None:
        fail("give a dataset NAME or --data FILE, not both")
    if data is not None:
        if not data.is_file():
            fail(f"--data {data} is not a file")
        return dataset_name(data)
    if name is None:
        fail("give a dataset NAME or --data FILE")
    try:
        return dataset_key(name)
    except ReleaseError as exc:
        fail(str(exc))


#: ``--data`` of ``show`` and ``budget``.
DATA_OPTION = typer.Option(
    None, "--data", help="Instead of NAME: the dataset a data file is charged to when a "
    "release names no --dataset (its resolved path).")


def _fmt_time(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _level(g: dict[str, Any]) -> str:
    rho = f"ρ={g['rho']:.4g} " if g.get("rho") is not None else ""
    return f"{rho}ε={g['epsilon']:.4g} δ={g['delta']:.3g}"


def dataset_summary(book: PrivacyLedger, name: str, delta: float | None = None
                    ) -> dict[str, Any]:
    """A JSON-ready summary of one dataset: budget, DP spend, data-dependent releases,
    releases (no content digests: only how many distinct contents were charged)."""
    budget = book.budget(name)
    spent = book.spent(name)
    at = delta if delta is not None else (budget[1] if budget else 1e-6)
    releases = book.releases(name)
    if spent.rho == 0:
        # without zCDP releases the total is exactly (Σε, Σδ) by basic composition, whatever
        # δ it is asked at: a pure-DP spend has δ = 0, not the budget's δ (or 1e-6), and an
        # approximate spend with Σδ above that δ is (Σε, Σδ), not "ε = ∞"
        total, total_delta = spent.approx_epsilon, min(spent.approx_delta, 1.0)
        if total_delta >= 1:  # (ε, 1)-DP promises nothing
            total = math.inf
    else:
        total, total_delta = spent.epsilon_at(at), at
    out: dict[str, Any] = {
        "dataset": name,
        "budget": None if budget is None else {"epsilon": budget[0], "delta": budget[1]},
        "dp": {
            "releases": spent.dp_releases,
            "adjacency": spent.adjacency,
            "converted_by_group_privacy": spent.converted,
            "by_adjacency": [
                {"adjacency": a, "releases": n, "rho": r, "pure_or_approx_epsilon": e,
                 "pure_or_approx_delta": d} for a, r, e, d, n in spent.by_adjacency],
            "rho": spent.rho,
            "pure_or_approx_epsilon": spent.approx_epsilon,
            "pure_or_approx_delta": spent.approx_delta,
            "total_epsilon": None if math.isinf(total) else total,
            "total_delta": total_delta,
            "delta_asked": at,  # total_delta may be above it (no zCDP releases: (Σε, Σδ))
        },
        "data_dependent": {
            "releases": spent.data_dependent,
            "nominal_epsilon": spent.data_dependent_epsilon,
            "nominal_delta": spent.data_dependent_delta,
            "note": "no differential-privacy guarantee; not part of the DP total",
        },
        "toy": {
            "releases": spent.toy,
            "note": "toy runs: their seed is public (written in a configuration file), so "
                    "they have no privacy guarantee at all; not part of the DP total",
        },
        "distinct_contents": len({r["data_digest"] for r in releases if r["data_digest"]}),
        "releases": [
            {"release_id": r["release_id"], "created": r["created"],
             "not_private": _not_private(r["guarantee"]),
             "mechanism": r["guarantee"].get("mechanism"),
             "unit": r["guarantee"].get("unit"), "adjacency": r["guarantee"].get("adjacency"),
             "rho": r["guarantee"].get("rho"),
             "epsilon": r["guarantee"].get("epsilon"), "delta": r["guarantee"].get("delta"),
             "ex_ante": r["ex_ante"], "toy": bool(r["guarantee"].get("public_seed")),
             "unproven": bool((r["guarantee"].get("details") or {}).get("unproven")),
             "description": r["description"]}
            for r in releases
        ],
    }
    if budget is not None:
        # at the budget's own δ, whatever --delta shows the total at: the room the ledger's
        # charges see (a larger --delta gives a smaller total, not more room)
        at_budget = spent.epsilon_at(budget[1]) if spent.dp_releases else 0.0
        out["remaining_epsilon"] = max(budget[0] - at_budget, 0.0)  # (0 when δ is spent)
    return out


def _dp_line(s: dict[str, Any]) -> str:
    dp = s["dp"]
    if not dp["releases"]:
        return "  DP spend        nothing yet"
    parts = []
    if dp["rho"] > 0:
        parts.append(f"ρ = {dp['rho']:.6g} (zCDP releases)")
    if dp["pure_or_approx_epsilon"] > 0 or dp["pure_or_approx_delta"] > 0:
        parts.append(f"ε = {dp['pure_or_approx_epsilon']:.6g}, δ = "
                     f"{dp['pure_or_approx_delta']:.3g} (pure/approximate releases, basic "
                     "composition)")
    above = ""
    if dp["total_epsilon"] is None and dp["total_delta"] >= 1:
        total = "∞ (no guarantee: Σδ ≥ 1)"
    elif dp["total_epsilon"] is None:
        total = "∞ (δ too small)"
    else:
        total = f"{dp['total_epsilon']:.6g}"
        if dp["total_delta"] > dp["delta_asked"]:  # (Σε, Σδ) without zCDP releases
            above = f"; above the δ asked, {dp['delta_asked']:.3g}"
    line = (f"  DP spend        {' + '.join(parts) or 'ρ = 0'} → total (ε = {total}, "
            f"δ = {dp['total_delta']:.3g}{above}) over {dp['releases']} release(s), under "
            f"{dp['adjacency']} adjacency")
    if len(dp["by_adjacency"]) > 1:
        mix = ", ".join(f"{b['releases']} {b['adjacency']}" for b in dp["by_adjacency"])
        line += (f"\n  adjacencies     mixed ({mix}): the total is stated under replace-one (one "
                 f"record replaced by any other); {dp['converted_by_group_privacy']} "
                 "release(s) of another adjacency count by group privacy at distance 2 "
                 "(4ρ, 2ε)")
    return line


def _not_private(release: dict) -> bool:
    """A release with no privacy at all (ε = ∞: ``--method nonprivate``)."""
    epsilon = release.get("epsilon")
    return isinstance(epsilon, float) and math.isinf(epsilon)


def _standard_json(value: Any) -> Any:
    """``value`` with every non-finite float as ``null``: standard JSON has no ``Infinity``
    (Python's ``json`` writes it, ``jq`` and most parsers refuse it). An infinite ε is a release
    with no privacy; each release says so in ``not_private``."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _standard_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_standard_json(v) for v in value]
    return value


def show(
    dataset: str | None = typer.Argument(None, help="Only this dataset (its name)."),
    data: Path | None = DATA_OPTION,
    ledger: str | None = ledger_option(),
    delta: float | None = typer.Option(
        None, "--delta", help="δ of the total (default: the budget's δ, else 1e-6)."),
    releases: bool = typer.Option(True, "--releases/--no-releases", help="List each release."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Datasets, budgets, total spend (ρ and (ε, δ)) and releases."""
    if delta is not None and not 0 < delta < 1:
        fail(f"--delta must be in (0, 1), got {delta}")
    if ledger is not None and not is_ledger_url(ledger) and not Path(ledger).exists():
        fail(f"no ledger at {ledger}")
    book = PrivacyLedger(ledger)
    one = dataset is not None or data is not None
    names = [_key(dataset, data)] if one else book.datasets()
    if one and names[0] not in book.datasets():
        fail(f"dataset {names[0]!r} is not in the ledger {book.location}")
    summaries = [dataset_summary(book, n, delta) for n in names]
    if as_json:
        typer.echo(json.dumps(_standard_json({"ledger": book.location, "datasets": summaries}),
                              indent=2, ensure_ascii=False, allow_nan=False))
        return
    lines = [f"ledger {book.location} (private to the data holder: do not share)"]
    if not summaries:
        lines.append("  no datasets yet")
    for s in summaries:
        lines += ["", f"dataset {s['dataset']}"]
        b = s["budget"]
        if b is None:
            lines.append("  budget          none (releases are recorded, nothing is refused)")
        else:
            left = s.get("remaining_epsilon")
            lines.append(f"  budget          ε = {b['epsilon']:.6g}, δ = {b['delta']:.3g}"
                         + (f"; remaining ε = {left:.6g}" if left is not None else ""))
        lines.append(_dp_line(s))
        dd = s["data_dependent"]
        if dd["releases"]:
            nominal = dd["nominal_epsilon"]
            nominal = ("∞: one or more are NOT PRIVATE at all, --method nonprivate"
                       if math.isinf(nominal) else f"{nominal:.4g} in all")
            lines.append(
                f"  NOT DP          {dd['releases']} release(s) with only a data-dependent "
                f"bound or an unproven accounting (nominal ε = {nominal}): NOT differential "
                "privacy and not in the total above; while they exist the dataset as a whole "
                "has no DP guarantee")
        if s["toy"]["releases"]:
            lines.append(
                f"  TOY RUNS        {s['toy']['releases']} release(s) with a public seed "
                "(written in a configuration file): NO privacy guarantee, not in the total "
                "above; use such seeds on toy or public data only")
        if s["distinct_contents"] > 1:
            lines.append(f"  contents        charged with {s['distinct_contents']} different "
                         "file contents under this name")
        if releases:
            lines.append(f"  releases ({len(s['releases'])}):")
            for r in s["releases"]:
                kind = ("TOY RUN (public seed, not DP)" if r["toy"] else
                        "DP" if r["ex_ante"] else
                        "NOT PRIVATE (ε = ∞)" if _not_private(r) else
                        "UNPROVEN ACCOUNTING (not DP)" if r.get("unproven") else
                        "DATA-DEPENDENT (not DP)")
                lines.append(f"    {_fmt_time(r['created'])}  {r['mechanism']:<20} "
                             f"{_level(r):<34} {r['adjacency'] or '?':<15} {kind}  "
                             f"{r['description']}  [{r['release_id'][:12]}]")
    typer.echo("\n".join(lines))


def budget(
    dataset: str | None = typer.Argument(None, help="Dataset name (as --dataset gives it)."),
    data: Path | None = DATA_OPTION,
    epsilon: float = typer.Option(..., "--epsilon", help="Total ε of the budget."),
    delta: float = typer.Option(..., "--delta", help="Total δ of the budget."),
    ledger: str | None = ledger_option(),
) -> None:
    """Set (or replace) a dataset's total (ε, δ) budget; refused below what it has spent."""
    from ..privacy.accounting import BudgetLimitError, check_budget_limit

    try:  # a budget above the limit would let releases with no meaningful privacy through
        check_budget_limit(epsilon, name="--epsilon")
    except BudgetLimitError as exc:
        fail(str(exc))
    if not 0 < delta < 1:
        fail(f"--delta must be in (0, 1), got {delta}")
    key = _key(dataset, data)
    where = ledger_location(ledger)
    created = isinstance(where, Path) and not os.path.lexists(where)
    book = PrivacyLedger(ledger)
    try:
        book.set_budget(key, epsilon, delta)
    except BudgetExceeded as exc:
        fail(str(exc))
    if created:  # a mistyped --ledger would otherwise hold a budget no release ever sees
        typer.echo(f"note: there was no ledger at {book.location}; this created it (if you "
                   "meant an existing ledger, check --ledger and $DPLANG_LEDGER)", err=True)
    if delta > LARGE_BUDGET_DELTA:
        typer.echo(f"warning: δ = {delta:g} is large: an (ε, δ) guarantee lets a release expose "
                   "whole records with probability up to δ; for n records take δ well below "
                   "1/n (1e-6 is common)", err=True)
    s = dataset_summary(book, key)
    spent = s["dp"]["total_epsilon"]  # None: ∞ (δ too small, or Σδ ≥ 1)
    shown = "∞" if spent is None and s["dp"]["releases"] else f"{spent or 0.0:.6g}"
    typer.echo(f"budget of dataset {key}: ε = {epsilon:g}, δ = {delta:g}; spent so far "
               f"ε = {shown} over {s['dp']['releases']} DP release(s) (ledger {book.location})")
    if dataset is not None and Path(key).is_file() and dataset_name(key) != key:
        typer.echo(f"warning: {key!r} is a dataset name, and also a file here: its budget "
                   f"counts the releases made with --dataset {key}; a release of the file "
                   f"without --dataset is charged to its resolved path, {dataset_name(key)} "
                   f"(budget that one with `dplang ledger budget --data {key}`)", err=True)
    if s["data_dependent"]["releases"]:
        typer.echo(f"warning: {key} already has {s['data_dependent']['releases']} "
                   "data-dependent release(s), which no DP budget covers", err=True)
    if s["toy"]["releases"]:
        typer.echo(f"warning: {key} already has {s['toy']['releases']} toy run(s) (a public "
                   "seed), which no DP budget covers", err=True)


app.command("show")(show)
app.command("budget")(budget)

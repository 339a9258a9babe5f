"""Releasing private samples of tabular records: plan, charge, sample, write (``dplang sample``).

:func:`plan_release` reads and validates the data, builds the sampler and fixes the guarantee
and the accuracy bound — all ex ante, from public quantities (n, the declared universe, the
parameters) — and writes nothing. :func:`execute_release` charges the privacy ledger (dataset
id = SHA-256 of the data file) *before* anything is written (``docs/privacy.md`` invariant 6),
then samples and writes the samples ``OUT.csv`` or ``OUT.jsonl`` (by extension), the public
manifest ``OUT.manifest.json`` and the private side file ``.dplang-private/OUT.private.json``
(:class:`dplang.release.OutputPaths`).

Several samples (``num`` = m > 1) come from m disjoint blocks of consecutive rows (positions
only, :func:`dplang.sampling.base.block_slices`): parallel composition, so the release has the
guarantee of one draw on ⌊n/m⌋ records. With ``split=False`` every draw reads all rows and the
guarantees compose sequentially (m·ε for pure DP).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..privacy.accounting import BudgetLimitError, check_budget_limit
from ..privacy.guarantees import Guarantee
from ..privacy.ledger import LedgerError, check_ledger_path
from ..privacy.randomness import RandomStreams
from ..release import (
    OutputPaths,
    Release,
    RunLock,
    check_output_path,
    dataset_name,
    output_label,
)
from ..release import ReleaseError as PipelineError
from .base import sample_repeated
from .kary import DiscreteLaplaceHistogramSampler, LaplaceHistogramSampler, RevealOrObscureSampler
from .product import (
    BucketedProductSampler,
    ClippedMeanSampler,
    GaussianMarginalSampler,
    PerCoordinateLaplaceSampler,
)
from .tabular import CategoricalTable, ColumnSpec, SamplingDataError, load_table

__all__ = [
    "KARY_METHODS",
    "METHODS",
    "PRODUCT_METHODS",
    "ReleasePlan",
    "ReleaseRequest",
    "execute_release",
    "plan_release",
]

KARY_METHODS = ("discrete-laplace", "laplace", "reveal-or-obscure")
PRODUCT_METHODS = ("clipped-mean", "product", "laplace-marginals", "gaussian-marginals")
METHODS = KARY_METHODS + PRODUCT_METHODS
_NEEDS_DELTA = ("product", "gaussian-marginals")

#: The k-ary samplers hold one noisy count per possible record: larger universes are refused.
MAX_UNIVERSE = 1_000_000

#: Above this TV bound a warning is printed; at or above 1 the bound is vacuous and the
#: release is refused unless forced.
WARN_BOUND = 0.1


class ReleaseError(SamplingDataError):
    """A release cannot be made as asked (one-line message)."""


@dataclass(frozen=True)
class ReleaseRequest:
    """Everything ``dplang sample`` was asked for."""

    data: Path
    columns: tuple[str, ...]
    epsilon: float
    out: Path
    delta: float | None = None
    num: int = 1
    method: str = "discrete-laplace"
    seed: int | None = field(default=None, repr=False)  # secret
    #: The declared (public) type of every column: tabular.parse_column / binary_column /
    #: load_schema. Never inferred from the values.
    types: Mapping[str, ColumnSpec] = field(default_factory=dict)
    split: bool = True
    alpha: float = 0.1
    force: bool = False
    ledger: str | Path | None = field(default=None, repr=False)  # may hold a password
    #: Ledger name of the dataset (default: the data file's resolved path).
    dataset: str | None = None
    #: "map" (public per-cell rule, default) or "refuse" (a data-dependent refusal).
    out_of_domain: str = "map"
    #: Replace an existing output (its files are replaced only after the new charge).
    overwrite: bool = False


@dataclass
class ReleasePlan:
    """A validated release: data, sampler, per-draw and overall guarantees, accuracy bound."""

    request: ReleaseRequest
    table: CategoricalTable
    sampler: Any
    records: np.ndarray
    rows_per_sample: int
    per_draw: Guarantee
    guarantee: Guarantee
    accuracy_bound: float | None
    accuracy_note: str
    dataset: str
    warnings: list[str]

    @property
    def paths(self) -> OutputPaths:
        """The samples, their public manifest, the private side file and the lock."""
        return OutputPaths.of(self.request.out)

    @property
    def manifest_path(self) -> Path:
        return self.paths.manifest

    @property
    def private_path(self) -> Path:
        return self.paths.private


def _check_existing(req: ReleaseRequest) -> None:
    """Refuse an ``--out`` whose files exist (old names included) unless ``overwrite``, and
    always one whose manifest would be another output's: ``s.jsonl`` beside ``s.csv`` (both
    have ``s.manifest.json``)."""
    paths = OutputPaths.of(req.out)
    for suffix in (".csv", ".jsonl"):
        other = req.out.with_suffix(suffix)
        if other != req.out and other.exists():
            raise ReleaseError(f"--out {req.out.name} would share its manifest "
                               f"{paths.manifest.name} with {other}; choose another --out")
    existing = paths.existing()
    if existing and not req.overwrite:
        raise ReleaseError(f"{existing[0]} already exists; choose another --out, or --overwrite "
                           "to replace it (after the new release is charged)")


def check_request(req: ReleaseRequest) -> None:
    """The parameters and paths (no data read, nothing created): the budget and its limit,
    the output (its folder can be created; an existing one needs ``overwrite``), the ledger.
    Raises :class:`ReleaseError`."""
    try:
        check_budget_limit(req.epsilon, name="--epsilon")
    except BudgetLimitError as exc:
        raise ReleaseError(str(exc)) from None
    if req.delta is not None and not 0 < req.delta < 1:
        raise ReleaseError(f"--delta must be in (0, 1), got {req.delta}")
    if req.num < 1:
        raise ReleaseError(f"--num must be >= 1, got {req.num}")
    if req.method not in METHODS:
        raise ReleaseError(f"unknown --method {req.method!r}; choose one of {', '.join(METHODS)}")
    if req.method in _NEEDS_DELTA and req.delta is None:
        raise ReleaseError(f"--method {req.method} is (ε, δ)-DP: give --delta")
    if not 0 < req.alpha < 1:
        raise ReleaseError(f"--alpha must be in (0, 1), got {req.alpha}")
    if req.seed is not None and req.seed < 0:
        raise ReleaseError(f"--seed must be >= 0, got {req.seed}")
    if req.out.suffix.lower() not in (".csv", ".jsonl"):
        raise ReleaseError(f"--out must end in .csv or .jsonl, got {req.out.name!r}")
    paths = OutputPaths.of(req.out)
    try:
        for path in (paths.output, paths.manifest, paths.private):
            check_output_path(path)
        check_ledger_path(req.ledger)
    except (PipelineError, LedgerError) as exc:
        raise ReleaseError(str(exc)) from None
    _check_existing(req)


def _kary_sampler(method: str, k: int, epsilon: float) -> Any:
    if method == "discrete-laplace":
        return DiscreteLaplaceHistogramSampler(k, epsilon)
    if method == "laplace":
        return LaplaceHistogramSampler(k, epsilon)
    return RevealOrObscureSampler(k, epsilon)


def plan_release(req: ReleaseRequest) -> ReleasePlan:
    """Validate and plan a release (reads the data, writes nothing, charges nothing).

    Privacy contract: the plan's ``guarantee`` is what :func:`execute_release` will charge and
    state — replace-one DP for the release of all ``num`` samples (parallel composition over
    disjoint position blocks, or sequential with ``split=False``). It is fixed ex ante: it
    depends on n, the declared universe and the parameters, never on the records. The
    accuracy bound likewise depends only on public quantities. Refusals (bad schema, too few
    rows for the requested ε) depend only on public quantities and the declared types; cells
    outside their declared domain are mapped by a public rule (or, with
    ``out_of_domain="refuse"``, refused: a data-dependent refusal)."""
    check_request(req)
    try:
        dataset = dataset_name(req.data, req.dataset)
    except PipelineError as exc:
        raise ReleaseError(str(exc)) from None
    table = load_table(req.data, req.columns, req.types, req.out_of_domain)
    n = table.n
    m_split = req.num if req.split else 1
    if n // m_split < 1:
        raise ReleaseError(f"{n} rows cannot form {req.num} disjoint non-empty blocks; lower "
                           "--num or use --no-split")
    rows = n // m_split
    warnings: list[str] = []
    if req.method in KARY_METHODS:
        k = table.universe_size
        if k < 2:
            raise ReleaseError("the declared universe has a single record value; nothing to "
                               "sample")
        if k > MAX_UNIVERSE:
            raise ReleaseError(f"too many categories: the columns' domains give k = {k} "
                               f"possible records (limit {MAX_UNIVERSE}); with {rows} records "
                               f"per sample the accuracy bound would be about "
                               f"{k / (rows * req.epsilon):.3g}")
        sampler = _kary_sampler(req.method, k, req.epsilon)
        records = table.joint_codes()
        bound: float | None = sampler.tv_bound(rows)
        note = (f"total variation between the law of each sample and the data distribution "
                f"≤ {bound:.4g} (k = {k} possible records, {rows} records per sample; "
                f"bound {'k/(2n·sinh(ε/2))' if req.method == 'discrete-laplace' else 'k/(εn)'})")
        if bound >= 1:
            msg = (f"too many categories for the data: k = {k} possible records and {rows} "
                   f"records per sample give an accuracy bound of {bound:.3g} (vacuous, ≥ 1); "
                   f"about {math.ceil(k / (0.1 * req.epsilon))} records per sample are needed "
                   f"for TV ≤ 0.1")
            if not req.force:
                raise ReleaseError(msg + " (use --force to release anyway)")
            warnings.append(msg)
        elif bound > WARN_BOUND:
            warnings.append(f"few records for {k} categories: accuracy bound TV ≤ {bound:.3g} "
                            f"with {rows} records per sample")
    else:
        if not table.all_binary:
            bad = [c.name for c in table.columns if c.kind != "binary"]
            raise ReleaseError(f"--method {req.method} needs binary columns (declare them "
                               f"with --binary); not binary: {', '.join(bad)}")
        d = len(table.columns)
        records = table.binary_matrix()
        if req.method == "clipped-mean":
            if d > 1 and req.delta is None:
                raise ReleaseError("--method clipped-mean with several columns is "
                                   "(ε, δ)-DP: give --delta")
            sampler = ClippedMeanSampler(delta=req.delta)
            achieved = sampler.guarantee(rows, d)
            if achieved.epsilon > req.epsilon * (1 + 1e-12):
                from .bounds import clipped_mean_min_n

                need = clipped_mean_min_n(d, req.epsilon, req.delta)
                raise ReleaseError(
                    f"clipped-mean on {rows} records per sample is only ε = "
                    f"{achieved.epsilon:.4g}-DP (its ε is fixed by n); ε = {req.epsilon:g} "
                    f"needs at least {need} records per sample")
            bound = d * sampler.worst_case_bias(rows)
            note = (f"total variation ≤ {bound:.3g} IF every column's bias lies in [1/3, 2/3] "
                    f"(not checked: that would read the data); no guarantee otherwise")
        elif req.method == "product":
            sampler = BucketedProductSampler(req.epsilon, req.delta, alpha=req.alpha)
            try:
                sampler.blocks(rows)
            except ValueError as exc:
                raise ReleaseError(str(exc)) from None
            bound = None
            note = ("no closed-form finite-n accuracy bound for the general product sampler "
                    "(rate Õ(d/(αε))); see docs/sampling.md for measured accuracy")
        elif req.method == "laplace-marginals":
            sampler = PerCoordinateLaplaceSampler(req.epsilon)
            bound = sampler.tv_bound(rows, d)
            note = f"total variation ≤ {bound:.3g} (d²/(2nε), d = {d}, n = {rows})"
        else:
            sampler = GaussianMarginalSampler(req.epsilon, req.delta)
            bound = sampler.tv_bound(rows, d)
            note = f"total variation ≤ {bound:.3g} (d·σ/√(2π), d = {d}, n = {rows})"
        if bound is not None and bound >= 1 and req.method != "clipped-mean":
            msg = f"accuracy bound {bound:.3g} is vacuous for {d} columns and {rows} rows"
            if not req.force:
                raise ReleaseError(msg + " (use --force to release anyway)")
            warnings.append(msg)
        elif bound is not None and bound > WARN_BOUND:
            warnings.append(f"weak accuracy: {note}")
    per_draw = sampler.guarantee(rows, None if req.method in KARY_METHODS else
                                 len(table.columns))
    guarantee = _overall(per_draw, req)
    return ReleasePlan(req, table, sampler, records, rows, per_draw, guarantee, bound, note,
                       dataset, warnings)


def _overall(per_draw: Guarantee, req: ReleaseRequest) -> Guarantee:
    from ..privacy.accounting import compose_parallel, compose_sequential

    parts = [per_draw] * req.num
    if req.split or req.num == 1:
        g = compose_parallel(parts, mechanism=per_draw.mechanism)
    else:
        g = compose_sequential(parts, delta=req.delta, mechanism=per_draw.mechanism)
    return replace(g, details={**per_draw.details, **g.details, "samples": req.num,
                               "disjoint_blocks": bool(req.split)})


def _render(plan: ReleasePlan, values: list[tuple[str, ...]]) -> str:
    names = [c.name for c in plan.table.columns]
    kinds = [c.kind for c in plan.table.columns]
    if plan.request.out.suffix.lower() == ".csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(names)
        writer.writerows(values)
        return buf.getvalue()
    lines = []
    for row in values:
        obj = {name: (int(v) if kind in ("binary", "integer") else v) for name, kind, v in
               zip(names, kinds, row, strict=True)}
        lines.append(json.dumps(obj, ensure_ascii=False))
    return "\n".join(lines) + "\n"


def execute_release(plan: ReleasePlan,
                    on_warning: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Charge the ledger, draw the samples, write the private side file, the public manifest
    and the samples; return the public manifest.

    Raises :class:`dplang.privacy.ledger.BudgetExceeded` (nothing charged, nothing written)
    when the dataset's budget would be exceeded. ``on_warning`` receives the ledger's warnings
    for the data holder (never to be written to a public file).

    Privacy contract: the samples written satisfy ``plan.guarantee``; the release (public
    fingerprint, dataset name, data digest, seed) is recorded in the ledger before anything is
    written. The manifest holds public inputs only (parameters, declared
    columns, n, blocks, the ex-ante accuracy bound): no seed, no data digest or path, no count
    of mapped cells; those go to ``OUT.private.json`` (mode 600), the seed nowhere.

    Runs under the output's lock (:class:`~dplang.release.RunLock`)."""
    with RunLock(plan.request.out):
        return _execute_locked(plan, on_warning)


def _execute_locked(plan: ReleasePlan,
                    on_warning: Callable[[str], None] | None) -> dict[str, Any]:
    req = plan.request
    _check_existing(req)
    params = {
        "method": req.method, "epsilon": req.epsilon, "delta": req.delta, "num": req.num,
        "split": req.split, "alpha": req.alpha, "columns": list(req.columns),
        "column_types": [c.describe() for c in plan.table.columns],
        "out_of_domain": req.out_of_domain,
    }
    fingerprint = {"parameters": params,
                   "sampler": {"class": type(plan.sampler).__name__,
                               **_sampler_constants(plan.sampler)}}
    release = Release.open(
        "sample", data=req.data, guarantee=plan.guarantee, fingerprint=fingerprint,
        dataset=plan.dataset, seed=req.seed, ledger=req.ledger,
        description=f"dplang sample ({req.method}, {req.num} draw(s)) → "
                    f"{output_label(req.out)}")
    with release.stops_reported([plan.paths.manifest, req.out]):  # what a stop left
        return _charge_and_write(plan, release, params, fingerprint, on_warning)


def _charge_and_write(plan: ReleasePlan, release: Release, params: dict[str, Any],
                      fingerprint: dict[str, Any],
                      on_warning: Callable[[str], None] | None) -> dict[str, Any]:
    req = plan.request
    release.charge(on_warning)  # before anything is written
    if req.overwrite:  # the earlier release's files go now that this one is charged: a stop
        plan.paths.remove()  # below never leaves files of two releases side by side
    streams = RandomStreams(release.stream_seed)  # fresh for every release
    result = sample_repeated(plan.sampler, plan.records, req.num, streams, split=req.split,
                             delta=req.delta)
    if req.method in KARY_METHODS:
        values = plan.table.decode_joint(result.samples)
    else:
        values = plan.table.decode_binary(result.samples)
    release.write_private(plan.paths, release.private_record(
        keep_seed=False,
        data={"rows": plan.table.n,
              "out_of_domain_cells_mapped": dict(plan.table.mapped),
              "columns_in_no_record": list(plan.table.absent)},
        output=str(req.out),
    ))
    manifest = release.public_manifest(
        per_draw_guarantee=plan.per_draw.to_dict(),
        parameters=params,
        sampler=fingerprint["sampler"],
        columns=[c.describe() for c in plan.table.columns],
        universe_size=plan.table.universe_size if req.method in KARY_METHODS else None,
        dimension=len(plan.table.columns),
        data={"rows": plan.table.n, "rows_per_sample": plan.rows_per_sample,
              "rows_rule": "n = every data row (public under replace-one adjacency)"},
        blocks=[list(b) for b in result.blocks],
        blocks_rule=("disjoint blocks of consecutive rows by position (data-independent); "
                     "parallel composition" if req.split else
                     "every draw reads all rows; sequential composition"),
        accuracy_bound=plan.accuracy_bound,
        accuracy_note=plan.accuracy_note,
        warnings=plan.warnings,
        output={"format": req.out.suffix.lower().lstrip("."), "samples": len(values)},
    )
    release.write_manifest(plan.paths, manifest)
    release.write_output(req.out, _render(plan, values))
    return manifest


def _sampler_constants(sampler: Any) -> dict[str, Any]:
    keys = ("epsilon", "delta", "alpha", "split", "c_T", "u0", "lo", "hi", "accountant", "rho",
            "k")
    out = {}
    for key in keys:
        if hasattr(sampler, key):
            v = getattr(sampler, key)
            out[key] = list(v) if isinstance(v, tuple) else v
    return out

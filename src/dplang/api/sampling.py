"""Private samples of records as one call: :func:`sample`, and the run both it and
``dplang sample`` go through (:func:`run_sample`).

The sampler's guarantee depends on n (the rows read) for some methods, so the budget is
checked by the charge itself, after the (cheap) read of the declared columns and before
anything is sampled or written (:func:`~dplang.sampling.release.execute_release`).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..privacy.guarantees import Guarantee
from ..privacy.ledger import BudgetExceeded
from ..release import ReleaseError, RunLock
from ..sampling.release import (
    ReleasePlan,
    ReleaseRequest,
    check_request,
    execute_release,
    plan_release,
)
from ..sampling.tabular import (
    OUT_OF_DOMAIN,
    ColumnSpec,
    SamplingDataError,
    binary_column,
    declare_column,
)
from .data import data_input
from .display import Display, TqdmDisplay, quiet_libraries, short_guarantee
from .errors import BUDGET, DPLangError, Interrupted, input_error, one_line
from .outputs import output_location
from .params import python_api

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["SampleResult", "run_sample", "sample"]


def run_sample(request: ReleaseRequest, *, display: Display) -> tuple[ReleasePlan,
                                                                       dict[str, Any]]:
    """Check, plan (read the declared columns) and release the samples under the output's
    lock; returns the plan and the public manifest. The plan's warnings (weak accuracy), the
    columns in no record and the count of mapped cells go to ``display.warning`` (the data
    holder's terminal only: they are statistics of the private data).

    Privacy contract: that of :func:`~dplang.sampling.release.execute_release`. Raises
    :class:`DPLangError` (code 2, or 3 over budget: nothing charged or written) and
    :class:`Interrupted`."""
    if request.out_of_domain not in OUT_OF_DOMAIN:
        raise DPLangError(f"--out-of-domain must be one of {', '.join(OUT_OF_DOMAIN)}, got "
                          f"{request.out_of_domain!r}")
    try:
        check_request(request)  # parameters and paths, before anything is read
        lock = RunLock(request.out).acquire()  # a second process on the same out is refused
    except (SamplingDataError, ReleaseError, ValueError, OSError) as exc:
        raise DPLangError(one_line(exc)) from None
    try:
        plan = plan_release(request)
        for warning in plan.warnings:
            display.warning(warning)
        for name in plan.table.absent:
            display.warning(
                f"column {name!r} occurs in no record of {request.data} (JSONL has no schema: "
                "not refused, its neighbour with the key in one record would not be); every "
                "cell of it took the fallback: check --columns")
        for name, count in plan.table.mapped.items():
            if count:
                display.warning(
                    f"{count} cell(s) of column {name!r} were outside its declared domain (or "
                    "missing) and were mapped by the public rule; this count is private (it is "
                    "kept in the private side file only)")
        manifest = execute_release(plan, on_warning=display.warning)
    except BudgetExceeded as exc:
        raise DPLangError(str(exc), BUDGET) from None
    except (SamplingDataError, ValueError, OSError) as exc:  # a ledger that cannot be written
        raise input_error(exc) from None
    except KeyboardInterrupt as exc:
        raise Interrupted(str(exc) or (  # the pipeline says what the stop left
            "interrupted before the samples were written: a release is charged "
            "right before its first computation on the records, so a stop after that point "
            "counts (`dplang ledger show` lists the charges)")) from None
    finally:
        lock.release()
    return plan, manifest


def column_types(domain: Mapping[str, Any] | None, binary: Sequence[str] | str = (),
                 fallback: Mapping[str, Any] | None = None) -> dict[str, ColumnSpec]:
    """The declared (public) column types: ``domain`` maps a column to ``"binary"``,
    ``"lo..hi"``, a ``range`` or a list of categories; ``binary`` names binary columns;
    ``fallback`` maps a column to the value its out-of-domain cells take."""
    fallback = dict(fallback or {})
    names = [binary] if isinstance(binary, str) else list(binary)
    types: dict[str, ColumnSpec] = {}
    try:
        for name in names:
            types[name] = binary_column(name, _text(fallback.get(name)))
        for name, decl in (domain or {}).items():
            if name in types:
                raise DPLangError(f"column {name!r} is declared twice")
            types[name] = declare_column(name, decl, _text(fallback.get(name)))
    except TypeError as exc:
        raise DPLangError(str(exc)) from None
    except SamplingDataError as exc:
        raise DPLangError(one_line(exc)) from None
    unknown = sorted(set(fallback) - set(types))
    if unknown:
        raise DPLangError(f"fallback for {', '.join(map(repr, unknown))}: no declared type")
    return types


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class SampleResult:
    """What :func:`sample` released: the samples (one dict per sample, the declared columns'
    values), the guarantee, and the public manifest."""

    samples: list[dict[str, Any]]
    columns: list[str]
    guarantee: Guarantee
    manifest: dict[str, Any]
    out: Path | None = None

    def __len__(self) -> int:
        return len(self.samples)

    def __repr__(self) -> str:
        return f"SampleResult({len(self.samples)} samples, {short_guarantee(self.guarantee)})"

    def to_pandas(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.samples, columns=self.columns)


def _read_samples(path: Path, plan: ReleasePlan) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    kinds = {c.name: c.kind for c in plan.table.columns}
    return [{k: int(v) if kinds.get(k) in ("binary", "integer") else v for k, v in row.items()}
            for row in csv.DictReader(io.StringIO(text))]


@python_api
def sample(
    data: Any,
    *,
    columns: str | Sequence[str],
    epsilon: float,
    domain: Mapping[str, Any] | None = None,
    binary: str | Sequence[str] = (),
    schema: str | Path | None = None,
    fallback: Mapping[str, Any] | None = None,
    num: int = 1,
    method: str = "discrete-laplace",
    delta: float | None = None,
    split: bool = True,
    alpha: float = 0.1,
    force: bool = False,
    out_of_domain: str = "map",
    dataset: str | None = None,
    ledger: str | Path | None = None,
    out: str | Path | None = None,
    seed: int | None = None,
    overwrite: bool = False,
    quiet: bool = False,
) -> SampleResult:
    """``num`` differentially private samples of records: ``dplang sample`` as a function
    (``docs/sampling.md``).

    ``columns`` are the record's columns; each needs a declared (public) type: ``domain``
    (``{"stars": "1..5", "city": ["a", "b"], "smoker": "binary"}``), ``binary`` or ``schema``
    (a TOML file). ``data``: a list of records (dicts), a DataFrame, a ``datasets.Dataset``
    or a path. With ``out=`` (``.csv`` or ``.jsonl``) it writes what
    ``dplang sample --out`` writes; without it only the ledger entry lasts.

    Privacy contract: the samples satisfy ``result.guarantee`` (replace-one DP; ``num``
    samples from disjoint blocks compose in parallel, ``split=False`` sequentially), charged
    to the ledger under ``dataset`` (the path's default; required for data in memory) before
    anything is sampled or written; the seed is fresh OS entropy unless given (secret), stored
    nowhere. Refusals raise :class:`DPLangError` with the command line's message."""
    from ..sampling.tabular import load_schema

    names = tuple(c.strip() for c in (columns.split(",") if isinstance(columns, str)
                                      else columns) if c.strip())
    types = column_types(domain, binary, None)
    if schema is not None:
        try:
            declared = load_schema(Path(schema).expanduser())
        except SamplingDataError as exc:
            raise DPLangError(one_line(exc)) from None
        twice = sorted(set(declared) & set(types))
        if twice:
            raise DPLangError(f"column {twice[0]!r} is declared twice")
        types = {**declared, **types}
    for name, value in (fallback or {}).items():
        if name not in types:
            raise DPLangError(f"fallback for {name!r}: no declared type")
        old = types[name]
        try:
            types[name] = ColumnSpec(old.name, old.kind, old.values, str(value))
        except SamplingDataError as exc:
            raise DPLangError(one_line(exc)) from None
    display: Display = Display() if quiet else TqdmDisplay()
    suffix = Path(out).suffix if out is not None else ".csv"
    with (quiet_libraries(quiet),
          data_input(data, dataset=dataset) as source,
          output_location(out, f"samples{suffix}") as (out_path, keep)):
        request = ReleaseRequest(
            data=source.path, columns=names, epsilon=float(epsilon), out=out_path,
            delta=None if delta is None else float(delta), num=num, method=method, seed=seed,
            types=types, split=split, alpha=float(alpha), force=force, ledger=ledger,
            dataset=source.dataset, out_of_domain=out_of_domain, overwrite=overwrite)
        plan, manifest = run_sample(request, display=display)
        samples = _read_samples(out_path, plan)
    return SampleResult(samples, list(names), plan.guarantee, manifest,
                        out_path if keep else None)

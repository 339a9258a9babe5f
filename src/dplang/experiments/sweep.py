"""Run an experiment sweep: generation + evaluation per cell, resumable, with tables and plots.

Layout of the output directory::

    DIR/data/references.jsonl, DIR/data/real.jsonl   PRIVATE copies of the row ranges of the
                                                     config (split by position only), mode 600
    DIR/cells/<key>/gen.jsonl, gen.manifest.json     generations of one cell (the release) and
                                                     their public manifest
    DIR/cells/<key>/.dplang-private/gen.private.json PRIVATE: the cell's secret seed, data
                                                     digest, counts (mode 600)
    DIR/cells/<key>/eval/metrics.json                PRIVATE: its evaluation (the cell's "done"
                                                     marker), report.md and plots (mode 600)
    DIR/cells/<key>/timing.json                      PRIVATE: its generation time (mode 600)
    DIR/results.csv, DIR/results.md, DIR/*.png       PRIVATE: the sweep's results (mode 600)

Every private cell is a release charged to the user's ledger under the dataset's name (not a
ledger of the experiment's own). The evaluation compares the generations with held-out real
rows of the same data: MAUVE, perplexity and the other results are statistics of those private
rows, not differentially private releases, and the timings are durations of computations on
private data (a side channel). Every such file is therefore written with mode 600 from
creation; publish them (``chmod``) only when the held-out data is public and the timings may be
known. The only world-readable files are the releases and their public manifests, and DIR itself
is mode 700 (only its owner can enter it: a mode-600 file's size and times are visible to
anyone who may search its folder, and they differ between neighbouring datasets): publish a
cell by copying its release and manifest out.

A finished cell (its ``eval/metrics.json`` exists) is skipped on rerun; an interrupted cell
resumes its generation where it stopped (with the seed kept in its private side file).

Size: a sweep's cell loop with its identity and resume rules, read together.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..evaluation.registry import get_metric, metric_names
from ..io import Record, file_digest, read_records
from ..models.base import LogitsModel
from ..privacy.accounting import rho_to_epsilon
from ..privacy.ledger import BudgetExceeded, LedgerError, PrivacyLedger, check_ledger_path
from ..release import (
    PRIVATE_MODE,
    OutputPaths,
    ReleaseError,
    RunLock,
    check_output_path,
    dataset_name,
    fsync_dir,
    private_dir,
    write_atomic,
    write_json,
)
from ..textgen.batching import make_batches
from ..textgen.orchestration import (
    GenerationError,
    GenerationRequest,
    check_request,
    execute_plan,
    plan_generation,
)
from ..textgen.prompts import get_template
from ..textgen.public import generate_public_texts
from ..textgen.resume import differences, kept_openings, read_record
from .config import (
    PUBLIC,
    Cell,
    ConfigError,
    ExperimentConfig,
    calls_per_token,
    method_options,
    takes_budget,
)
from .tables import write_plots, write_results_md

#: The columns of ``results.csv`` before and after the metrics' own (each registered metric's
#: :meth:`~dplang.evaluation.registry.MetricSpec.results_columns`, in registry order).
_CELL_COLUMNS = ("method", "epsilon", "batch_size", "top_k", "temperature", "seed",
                 "replicate", "calls_per_token", "clip", "rho", "n")
_TIMING_COLUMNS = ("gen_seconds", "cpu_seconds", "resumed")


def result_columns() -> tuple[str, ...]:
    """The columns of ``results.csv``: the cell, every registered metric's, the timings."""
    metric_columns = [column.name for name in metric_names()
                      for column in get_metric(name).results_columns()]
    return (*_CELL_COLUMNS, *metric_columns, *_TIMING_COLUMNS)


def _scores_with_model(config: ExperimentConfig) -> bool:
    """Whether a configured metric computes with the scoring model itself (perplexity), not
    only with its tokenizer."""
    return any(get_metric(name).uses_model for name in config.metrics)


def _private_writer(path: Path) -> Any:
    """A new file opened for writing with mode 600 from creation."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_MODE)
    return os.fdopen(fd, "w", encoding="utf-8")


def _split_spec(config: ExperimentConfig, data_digest: str) -> dict[str, Any]:
    return {"data_sha256": data_digest, "text_column": config.text_column,
            "group_by": list(config.group_by), "references": list(config.references),
            "real": list(config.real)}


def split_data(config: ExperimentConfig, out_dir: Path,
               data_digest: str | None = None) -> tuple[Path, Path]:
    """Write the reference and held-out row ranges to ``out_dir/data``, again whenever what
    selects them (the data's content, the ranges, the columns: ``data/split.private.json``)
    changed since they were written.

    Privacy contract: both files are copies of private rows: they are created with mode 600
    (the directory 700) and never published; copies left by earlier versions are tightened."""
    data_dir = out_dir / "data"
    refs, real = data_dir / "references.jsonl", data_dir / "real.jsonl"
    spec_path = data_dir / "split.private.json"
    spec = _split_spec(config, data_digest or file_digest(config.data_path))
    if refs.exists() and real.exists() and read_record(spec_path) == spec:
        for p in (data_dir, refs, real):
            if p.stat().st_mode & 0o077:
                p.chmod(0o700 if p.is_dir() else PRIVATE_MODE)
        return refs, real
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    data_dir.chmod(0o700)
    columns = config.group_by
    with _private_writer(refs.with_suffix(".tmp")) as fr, \
            _private_writer(real.with_suffix(".tmp")) as fe:
        for rec in read_records(config.data_path, config.text_column, columns):
            row = {"text": rec.text, **rec.labels}
            if config.references[0] <= rec.index < config.references[1]:
                fr.write(json.dumps(row, ensure_ascii=False) + "\n")
            elif config.real[0] <= rec.index < config.real[1]:
                fe.write(json.dumps(row, ensure_ascii=False) + "\n")
            if rec.index >= max(config.references[1], config.real[1]):
                break
        for fh in (fr, fe):
            fh.flush()
            os.fsync(fh.fileno())
    refs.with_suffix(".tmp").replace(refs)
    real.with_suffix(".tmp").replace(real)
    write_json(spec_path, spec, private=True)
    fsync_dir(data_dir)
    return refs, real


# ---------------------------------------------------------------------------------------------
# What determines a cell's result


CELL_SPEC = "cell.private.json"
#: A cell's settings while a run with them replaces its generation (``--overwrite``), until
#: that run has its files in place and they become :data:`CELL_SPEC`; from its charge on, with
#: the id of the release it was charged as (private, like the seed it hashes).
REPLACING_SPEC = "cell.replacing.private.json"


def _prompt_identity(config: ExperimentConfig) -> dict[str, str]:
    """A built-in template by name; a template file by its content (editing it changes the
    cells' results)."""
    path = Path(config.prompt)
    if config.prompt.endswith(".toml") and path.is_file():
        return {"file": path.name, "sha256": file_digest(path)}
    return {"name": config.prompt}


def cell_spec(config: ExperimentConfig, cell: Cell, data_digest: str) -> dict[str, Any]:
    """Everything that determines a cell's result, in two parts: ``generation`` (method,
    hyperparameters, seed or replicate, every generation option, the prompt, the model and
    its dtype, the data's content and the rows used) and ``evaluation`` (metrics, embedder,
    buckets, the held-out rows, the number of texts, the scoring model). Kept in the cell's
    ``cell.private.json`` (mode 600: it holds the data's digest)."""
    generation: dict[str, Any] = {
        "method": cell.method, "epsilon": cell.epsilon, "batch_size": cell.batch_size,
        "top_k": cell.top_k, "temperature": cell.temperature,
        "seed": cell.seed, "replicate": cell.replicate,
        "max_tokens": config.max_tokens, "num": config.num, "delta": config.delta,
        "max_reference_tokens": config.max_reference_tokens,
        "adjacency": "replace-by-null", "model": config.model, "dtype": config.dtype,
        "prompt": _prompt_identity(config), "text_column": config.text_column,
        "group_by": list(config.group_by), "references": list(config.references),
        "data_sha256": data_digest,
    }
    if config.batch_order != "grouped":  # recorded only when set: older cells stay "same"
        generation["batch_order"] = config.batch_order
    options = method_options(cell, config)
    if options:  # the options the config may set for this method (Aug-PE's T and L)
        generation[cell.method] = options
    evaluation = {
        "metrics": list(config.metrics), "embedder": config.embedder,
        "num_buckets": config.num_buckets, "real": list(config.real), "num": config.num,
        "model": config.model if _scores_with_model(config) else None,
    }
    if config.label_column is not None:  # recorded only when set: older cells stay "same"
        evaluation["label_column"] = config.label_column
    if config.mauve_bootstrap:  # likewise
        evaluation["mauve_bootstrap"] = config.mauve_bootstrap
    if config.real_max_tokens is not None:
        evaluation["real_max_tokens"] = config.real_max_tokens
        evaluation["model"] = config.model  # its tokenizer cuts the real texts
    return {"generation": generation, "evaluation": evaluation}


def _cell_state(cell_dir: Path, spec: dict[str, Any], overwrite: bool = False,
                book: PrivacyLedger | None = None) -> str:
    """``new`` (nothing there), ``same``, ``re-evaluate`` (the generation is the one the config
    asks for, the evaluation settings changed), ``changed`` (to be generated anew, with
    ``overwrite``) or ``continue``: without ``overwrite``, the cell's replacement by these very
    settings was charged (in ``book``) and stopped before its first text, and generate is to
    continue it with its kept seed (charged once), or refuse. Without ``overwrite`` a
    generation made with other settings (or by an older dplang that recorded none) raises
    :class:`ConfigError`: rerunning would relabel old numbers with the new configuration."""
    if not cell_dir.exists():
        return "new"
    stored = read_record(cell_dir / CELL_SPEC)
    if ((stored is None or stored.get("generation") != spec["generation"])
            and book is not None and _charged_replacement(cell_dir, spec, book)):
        return "changed" if overwrite else "continue"
    if stored is None:
        if not any((cell_dir / name).exists() for name in ("gen.jsonl", "eval")):
            return "new"
        if overwrite:
            return "changed"
        raise ConfigError(f"{cell_dir} records no configuration (made by an older dplang); "
                          "its results cannot be checked against this config: use a new --out "
                          "(or --overwrite to generate it anew, a new charge)")
    diff = differences(stored.get("generation"), spec["generation"])
    if diff:
        if overwrite:
            return "changed"
        # a digest of the data is private: named, never printed (terminals are logged)
        diff = [("the data's content changed" if d.split(":")[0].endswith("data_sha256") else d)
                for d in diff]
        shown = "; ".join(diff[:3]) + (f"; and {len(diff) - 3} more" if len(diff) > 3 else "")
        anew = ("--overwrite to continue its interrupted replacement by these settings (no "
                "new charge if it was charged, else a new release)"
                if _replacing_record(cell_dir, spec) is not None
                else "--overwrite to generate it anew (a new release, charged anew)")
        raise ConfigError(f"cell {cell_dir.name} in this --out was generated with other "
                          f"settings ({shown}); use a new --out, restore the config, or {anew}")
    return "same" if stored.get("evaluation") == spec["evaluation"] else "re-evaluate"


def count_rows(config: ExperimentConfig) -> int:
    """Data rows of the configured file (a public quantity under replace-by-null: neighbours
    have as many rows)."""
    return sum(1 for _ in read_records(config.data_path, config.text_column, config.group_by))


def _check_group_batches(config: ExperimentConfig) -> None:
    """With ``group_by``, every private cell's ``num`` batches must exist among the reference
    rows (each label group is cut into full batches of B): checked from the public labels
    alone (the texts are not kept), before any cell runs."""
    start, stop = config.references
    labels_only = [Record(rec.index, None, rec.labels)
                   for rec in read_records(config.data_path, config.text_column,
                                           config.group_by)
                   if start <= rec.index < stop]
    for cell in config.cells:
        if cell.method == PUBLIC:
            continue
        try:
            make_batches(labels_only, cell.batch_size, config.num, config.group_by)
        except ValueError as exc:
            raise ConfigError(f"cell {cell.key}: {str(exc).splitlines()[0]} (among "
                              "[data].references)") from None


def _check_downstream_rows(real: Path, config: ExperimentConfig) -> None:
    """With the downstream metric: refuse held-out rows it would refuse (too few, a row
    without a label, a test text among the ceiling's) now, before any cell is generated and
    charged, rather than when the first cell is evaluated."""
    from ..evaluation.data import EvaluationError
    from ..evaluation.downstream import check_real_file

    assert config.label_column is not None
    try:
        check_real_file(real, config.num, config.label_column)
    except EvaluationError as exc:
        raise ConfigError(f"[data].real rows {config.real[0]}-{config.real[1]} for the "
                          f"downstream metric: {str(exc).splitlines()[0]}") from None


def preflight(config: ExperimentConfig, out_dir: Path, ledger: str | Path | None,
              dataset: str | None, check_model: Callable[[str], None] | None = None,
              overwrite: bool = False,
              ) -> tuple[str, dict[str, dict[str, Any]], dict[str, str]]:
    """Check the whole sweep before anything is written, loaded or charged: the output
    folder, the ledger, the model spec, every private cell's request (parameters, budget
    limit, prompt and labels), the row ranges against the file, ``num × B`` against the
    reference rows, and what earlier runs left in ``out_dir`` (a cell generated with other
    settings is refused). Returns (data digest, spec per cell key, state per cell key).
    Raises :class:`ConfigError`, :class:`GenerationError` or ``ReferenceDataError``."""
    try:
        check_output_path(out_dir, what="--out", directory=True)
        where = check_ledger_path(ledger)
        name = dataset_name(config.data_path, dataset or config.dataset)
    except (ReleaseError, LedgerError) as exc:
        raise ConfigError(str(exc)) from None
    toys = [c.key for c in config.cells if c.method != PUBLIC and c.seed is not None]
    if toys and not (isinstance(where, Path) and not where.exists()) \
            and PrivacyLedger(ledger).budget(name) is not None:
        # the ledger would refuse the first toy cell at its charge: refuse the sweep now
        raise BudgetExceeded(
            f"dataset {name} has a differential-privacy budget and this configuration writes "
            f"its seeds ([sweep].seeds): its cells ({', '.join(toys[:3])}"
            f"{', ...' if len(toys) > 3 else ''}) would be toy runs with no privacy guarantee; "
            "remove the seeds (each cell then gets a fresh secret seed)")
    if check_model is not None:
        try:
            check_model(config.model)
        except ValueError as exc:
            raise ConfigError(str(exc).splitlines()[0]) from None
    guarantees = {}
    for cell in config.cells:
        if cell.method == PUBLIC:
            continue
        request = _request(config, cell, config.data_path, out_dir / "cells" / cell.key
                           / "gen.jsonl", ledger, dataset)
        try:
            guarantees[cell.key] = check_request(request).guarantee
        except GenerationError as exc:
            raise GenerationError(f"cell {cell.key}: {exc}") from None
    rows = count_rows(config)
    for what, (_start, stop) in (("references", config.references), ("real", config.real)):
        if stop > rows:
            raise ConfigError(f"[data].{what} ends at row {stop} but {config.data_path.name} "
                              f"has {rows} data rows")
    available = config.references[1] - config.references[0]
    if config.group_by:
        _check_group_batches(config)
    else:
        for cell in config.cells:
            need = config.num * max(cell.batch_size, 1)
            if cell.method != PUBLIC and need > available:
                raise ConfigError(
                    f"cell {cell.key}: num = {config.num} generations × B = {cell.batch_size} "
                    f"need {need} references but [data].references holds {available} rows")
    _check_evaluation_sizes(config)
    digest = file_digest(config.data_path)
    specs = {c.key: cell_spec(config, c, digest) for c in config.cells}
    book = None if isinstance(where, Path) and not where.exists() else PrivacyLedger(ledger)
    states = {c.key: _cell_state(out_dir / "cells" / c.key, specs[c.key], overwrite, book)
              for c in config.cells}
    if book is not None:
        _check_sweep_budget(book, name,
                            [g for key, g in guarantees.items()
                             if states[key] == "new" or (states[key] == "changed"
                             and not _continues_a_charge(out_dir / "cells" / key, specs[key],
                                                         book))])  # ("continue": no charge)
    return digest, specs, states


def _check_evaluation_sizes(config: ExperimentConfig) -> None:
    """Refuse, before any cell is charged, an evaluation that cannot run on the configured
    sizes (public): fewer held-out rows than texts, or a MAUVE that ``num`` texts cannot
    hold. Otherwise the first cell would be charged and published, and the sweep stop at its
    evaluation."""
    held_out = config.real[1] - config.real[0]
    if held_out < config.num:
        raise ConfigError(f"[data].real holds {held_out} rows but each cell is evaluated on "
                          f"num = {config.num} held-out texts")
    if "mauve" in config.metrics:
        from ..evaluation.data import EvaluationError
        from ..evaluation.mauve_metric import check_mauve_sizes

        try:
            check_mauve_sizes(config.num, config.num, config.num_buckets)
        except EvaluationError as exc:
            raise ConfigError(f"[evaluation]: {str(exc).splitlines()[0]}") from None


def _replacing_record(cell_dir: Path, spec: dict[str, Any]) -> dict[str, Any] | None:
    """The cell's replacement record (:data:`REPLACING_SPEC`) when it is a replacement by the
    generation settings of ``spec``; else None."""
    replacing = read_record(cell_dir / REPLACING_SPEC)
    if replacing is None or replacing.get("generation") != spec["generation"]:
        return None
    return replacing


def _charged_replacement(cell_dir: Path, spec: dict[str, Any], book: PrivacyLedger) -> bool:
    """Whether the cell's replacement by the generation settings of ``spec`` was charged (its
    record names the release, which ``book`` holds) and stopped before its first text:
    generate continues it with its kept seed, at no new cost."""
    replacing = _replacing_record(cell_dir, spec)
    return replacing is not None and _in_ledger(book, replacing.get("release_id"))


def _continues_a_charge(cell_dir: Path, spec: dict[str, Any], book: PrivacyLedger) -> bool:
    """For the sweep's budget check: whether a cell to generate anew likely continues a
    charged release at no new cost — its replacement record says so
    (:func:`_charged_replacement`), or it was stopped inside its charge, before the record
    could, and generate kept an opening whose release the ledger holds. (Should that opening
    belong to other settings, the cell's charge is a new one, and the ledger's own check at
    that charge still refuses it over budget.)"""
    replacing = _replacing_record(cell_dir, spec)
    if replacing is None:
        return False
    kept = [opening.get("release_id")
            for _path, opening in kept_openings(OutputPaths.of(cell_dir / "gen.jsonl"))]
    return any(_in_ledger(book, release_id)
               for release_id in (replacing.get("release_id"), *kept))


def _in_ledger(book: PrivacyLedger, release_id: Any) -> bool:
    return isinstance(release_id, str) and book.has_release(release_id)


def _check_sweep_budget(book: PrivacyLedger, name: str, guarantees: list[Any]) -> None:
    """Refuse the sweep, before anything is charged, when the dataset's budget would refuse
    any of its cells still to run (:meth:`PrivacyLedger.check_charges`: the charge's own
    rule, on public inputs only). Otherwise the cells before the refused one would be
    charged and published, and the sweep stop halfway."""
    try:
        book.check_charges(name, guarantees)
    except BudgetExceeded as exc:
        raise BudgetExceeded(f"this sweep's {len(guarantees)} cell(s) still to run: {exc}; "
                             "nothing was run (fewer cells, smaller ε, or drop the method "
                             "with no differential-privacy guarantee)") from None


def _generate(config: ExperimentConfig, cell: Cell, refs: Path, cell_dir: Path,
              load_model: Callable[[str], LogitsModel], ledger: str | Path | None, dataset: str,
              overwrite: bool = False, continue_release: str | None = None,
              opened: float | None = None,
              warn: Callable[[str], None] | None = None,
              on_charged: Callable[[str], None] | None = None,
              on_started: Callable[[], None] | None = None,
              data_source_digest: str | None = None) -> tuple[Path, dict[str, Any]]:
    """Generate one cell; returns the output and its timing: ``gen_seconds`` (wall clock) and
    ``cpu_seconds`` (CPU time of this process over all threads, which a paused or contended
    run does not inflate), plus ``resumed: True`` when an interrupted generation was continued
    (its times then cover the continuation only). The model is loaded before the clocks start.
    ``on_charged(release_id)`` is called as soon as a private cell's release is charged, and
    ``on_started()`` once its run also has its files in place (an earlier run's replaced, its
    manifest and side file written), right before it decodes. ``data_source_digest`` is the
    SHA-256 of the data file the references were copied from, which the ledger records
    (private: never in a public file)."""
    out = cell_dir / "gen.jsonl"
    started = [p for p in (out, OutputPaths.of(out).partial) if p.exists()]
    resumed = not overwrite and any(p.stat().st_size > 0 for p in started)
    model = load_model(config.model)
    start, cpu_start = time.time(), time.process_time()

    def timing() -> dict[str, Any]:
        return {"gen_seconds": time.time() - start,
                "cpu_seconds": time.process_time() - cpu_start, "resumed": resumed}

    if cell.method == PUBLIC:
        if not out.exists():
            template = get_template(config.prompt, chat=model.has_chat_template)
            records, _ = _records(refs, config.group_by)
            labels = ([b.labels for b in make_batches(records, 1, config.num, config.group_by,
                                                      order=config.batch_order)]
                      if config.group_by else [{}] * config.num)
            # public generation reads no private data: its seed need not be secret
            seed = cell.seed if cell.seed is not None else cell.replicate
            generate_public_texts(model, template, labels, config.max_tokens,
                                  cell.temperature, cell.top_k, seed, out)
        return out, timing()
    request = replace(_request(config, cell, refs, out, ledger, dataset), overwrite=overwrite,
                      continue_release=continue_release, opened=opened,
                      data_source=config.data_path,
                      # the content the copy was made from (no second read of the file)
                      data_source_digest=data_source_digest)
    plan = plan_generation(request, load_model)
    execute_plan(plan, on_warning=warn,  # the ledger's warnings: the data holder's terminal
                 on_charge=None if on_charged is None else
                 lambda charge: on_charged(charge.release_id),
                 on_start=None if on_started is None else lambda _total, _done: on_started())
    return out, timing()


def _request(config: ExperimentConfig, cell: Cell, data: Path, out: Path,
             ledger: str | Path | None, dataset: str | None) -> GenerationRequest:
    return GenerationRequest(
        data=data, out=out, batch_size=cell.batch_size, max_tokens=config.max_tokens,
        temperature=cell.temperature, top_k=cell.top_k,
        epsilon=cell.epsilon if takes_budget(cell.method) else None,  # nonprivate: none
        delta=config.delta, num=config.num, seed=cell.seed,
        public_seed=cell.seed is not None,  # a seed written in the config: a toy run
        concurrent_groups=config.concurrent_groups, prompt=config.prompt,
        group_by=config.group_by, model=config.model, ledger=ledger, dataset=dataset,
        method=cell.method,
        adjacency="replace-by-null",  # the only dataset-level adjacency of every method
        dtype=config.dtype,
        method_options=method_options(cell, config),
        max_reference_tokens=config.max_reference_tokens, batch_order=config.batch_order,
    )


def _cell_metrics(config: ExperimentConfig, gen: Path) -> list[str]:
    """The configured metrics that apply to a cell: a metric that would skip this cell's run
    when not asked for explicitly (its ``select`` hook: Top-k+ statistics exist only for
    methods that record them, InvisibleInk and public generation) is dropped for the cell
    rather than failing its evaluation."""
    from ..evaluation.data import load_synthetic

    runs = None
    metrics = []
    for name in config.metrics:
        spec = get_metric(name)
        if spec.select is not None:
            runs = runs if runs is not None else [load_synthetic(gen)]
            if spec.select(runs, False) is not None:
                continue
        metrics.append(name)
    return metrics


def _records(path: Path, group_by: tuple[str, ...]):
    from ..io import load_references

    return load_references(path, "text", group_by)


def _row(cell: Cell, config: ExperimentConfig, metrics: dict[str, Any],
         timing: dict[str, Any]) -> dict[str, Any]:
    run = metrics["runs"][0]
    manifest = run.get("manifest") or {}
    return {
        "method": cell.method, "epsilon": cell.epsilon, "batch_size": cell.batch_size,
        "top_k": cell.top_k, "temperature": cell.temperature,
        "seed": cell.seed if cell.seed is not None else "secret", "replicate": cell.replicate,
        "calls_per_token": calls_per_token(cell, config), "clip": manifest.get("clip"),
        "rho": manifest.get("rho"), "n": metrics.get("settings", {}).get("n"),
        **{column.name: column.value(metrics, name) for name in metric_names()
           for column in get_metric(name).results_columns()},
        "gen_seconds": round(float(timing.get("gen_seconds", 0.0)), 2),
        "resumed": bool(timing.get("resumed", False)),
        "cpu_seconds": (round(float(timing["cpu_seconds"]), 2)
                        if timing.get("cpu_seconds") is not None else None),
    }


def run_experiment(
    config: ExperimentConfig,
    out_dir: Path,
    load_model: Callable[[str, str], LogitsModel],
    progress: Callable[[str], None] | None = None,
    report_only: bool = False,
    ledger: str | Path | None = None,
    dataset: str | None = None,
    check_model: Callable[[str], None] | None = None,
    overwrite: bool = False,
    warn: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every cell not yet finished, then write results.csv / results.md / plots.

    The whole sweep is checked first (:func:`preflight`: every cell, the ranges, the model
    spec with ``check_model``, what ``out_dir`` already holds) before anything is written,
    loaded or charged, under a lock on ``out_dir`` (a second process is refused). A finished
    cell whose recorded configuration matches is skipped; one whose evaluation settings
    changed is re-evaluated (no privacy cost); one generated with other generation settings
    is refused, or with ``overwrite`` generated anew (a new release: charged; its old files
    are replaced once the new generation is charged, and its record, ``cell.private.json``,
    once the new run has its files in place: until then the new settings are in
    ``cell.replacing.private.json``, and a replacement charged and stopped before its first
    text is continued by the same config, with ``overwrite`` or without, charged once; the
    budget check counts no new charge for it). The ledger records, for every cell, the
    content digest of the data file its references were copied from. ``warn`` receives the
    ledger's warnings (a budget kept under the data file's own name that this sweep's dataset
    name does not see, content that changed...), for the data holder's terminal only. With
    ``report_only`` nothing is generated: the results cover the finished cells only (the
    state of a long sweep).

    Privacy contract: each private cell is a release of the references, charged before its
    output to ``ledger`` (default: the user's ledger) under ``dataset`` (default
    ``config.dataset``, else the data file's resolved path); its seed is fresh OS entropy kept
    in the cell's private side file unless the config writes seeds (then not secret: toy or
    public data only). ``results.md`` states the sweep's total charge."""
    say = progress or (lambda _msg: None)
    # every cell's release states this public time (its manifest's ``started``, its files'
    # times), taken before anything is read: a cell's own start, minus the one before it,
    # would show how long that cell took on the private rows
    opened = time.time()
    with RunLock(out_dir):
        digest, specs, states = preflight(config, out_dir, ledger, dataset, check_model,
                                          overwrite)
        name = dataset_name(config.data_path, dataset or config.dataset)
        # the sweep's folder is private as a whole (mode 700, an older one tightened): it holds
        # copies of private rows, side files, evaluations and timings, whose sizes and times
        # another user could otherwise read with stat; publish a cell by copying its gen.jsonl
        # and gen.manifest.json out
        private_dir(out_dir)
        fresh_split = not (out_dir / "data" / "references.jsonl").exists()
        refs, real = (None, None) if report_only else split_data(config, out_dir, digest)
        try:
            rows, failed = _run_cells(config, out_dir, load_model, say, report_only, ledger,
                                      name, specs, states, refs, real, opened, warn)
        except BaseException:
            if fresh_split and not report_only:
                _remove_unused_split(out_dir)
            raise
        write_results(rows, out_dir, config, ledger, name)
    if failed:
        from ..evaluation.data import EvaluationError

        raise EvaluationError(
            f"the evaluation of {len(failed)} cell(s) failed; every cell was generated, and "
            f"the others evaluated (results.md): {failed[0]}")
    return rows


def _remove_unused_split(out_dir: Path) -> None:
    """A sweep that stops before any cell has generated leaves no copy of private rows: the
    split it wrote this time is removed (a later run writes it again)."""
    if any((out_dir / "cells").glob("*/gen.jsonl")) or any(
            (out_dir / "cells").glob("*/.dplang-private/gen.jsonl.partial")):
        return  # a generation may resume from these rows
    data_dir = out_dir / "data"
    for name in ("references.jsonl", "real.jsonl", "split.private.json", "references.tmp",
                 "real.tmp"):
        (data_dir / name).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        data_dir.rmdir()


def _run_cells(config: ExperimentConfig, out_dir: Path,
               load_model: Callable[[str, str], LogitsModel], say: Callable[[str], None],
               report_only: bool, ledger: str | Path | None, name: str,
               specs: dict[str, Any], states: dict[str, str], refs: Path | None,
               real: Path | None, opened: float | None = None,
               warn: Callable[[str], None] | None = None
               ) -> tuple[list[dict[str, Any]], list[str]]:
    """Generate and evaluate every cell not yet finished (see :func:`run_experiment`); the
    rows of the evaluated cells, and a line per cell whose evaluation failed.

    A failed evaluation does not stop the sweep: it computes on the held-out private rows
    (one blank row among them leaves fewer texts than the cell's), and whether the later
    cells are generated and published must not depend on them."""
    from ..evaluation import evaluate_files
    from ..evaluation.data import EvaluationError

    if real is not None and config.label_column is not None:
        _check_downstream_rows(real, config)
    cache: dict[tuple[str, str], LogitsModel] = {}

    def cached(spec: str, dtype: str) -> LogitsModel:
        if (spec, dtype) not in cache:
            cache[(spec, dtype)] = load_model(spec, dtype)
        return cache[(spec, dtype)]

    def generation_model(spec: str) -> LogitsModel:
        return cached(spec, config.dtype)

    rows = []
    failed: list[str] = []
    for i, cell in enumerate(config.cells, 1):
        tag = f"[{i}/{len(config.cells)}] {cell.key}"
        cell_dir = out_dir / "cells" / cell.key
        metrics_path = cell_dir / "eval" / "metrics.json"
        timing_path = cell_dir / "timing.json"
        state = states[cell.key]
        if state == "same" and metrics_path.exists():
            say(f"{tag}: done, skipped")
        elif report_only:
            say(f"{tag}: not finished" + (" (its evaluation settings changed)"
                                          if state == "re-evaluate" else "")
                + ", left out of the report")
            continue
        else:
            assert refs is not None and real is not None
            new, anew = state == "new", state in ("changed", "continue")
            if state == "re-evaluate" or anew:
                metrics_path.unlink(missing_ok=True)  # never a stale "done" marker
            if anew:
                timing_path.unlink(missing_ok=True)
                if cell.method == PUBLIC:  # no release: nothing to charge first
                    (cell_dir / "gen.jsonl").unlink(missing_ok=True)
            cell_dir.mkdir(parents=True, exist_ok=True)
            spec_path, spec = cell_dir / CELL_SPEC, specs[cell.key]

            def record_spec(path: Path = spec_path, spec: dict[str, Any] = spec) -> None:
                write_json(path, spec, private=True)
                (path.parent / REPLACING_SPEC).unlink(missing_ok=True)

            def record_charge(release_id: str, path: Path = cell_dir / REPLACING_SPEC,
                              spec: dict[str, Any] = spec) -> None:
                write_json(path, {**spec, "release_id": release_id}, private=True)

            # A private cell generated anew keeps its old record until the new run has its
            # files in place; until then the new settings are its replacement record (with
            # the release id from its charge on). A stop before then leaves the old
            # generation under the old settings (the old config resumes it), never old texts
            # recorded under new settings, which both configs would refuse; the new config
            # continues the replacement (generate keeps its seed: charged once).
            replacing = anew and cell.method != PUBLIC
            kept = _replacing_record(cell_dir, spec)
            if not replacing:
                record_spec()
            elif kept is None:
                write_json(cell_dir / REPLACING_SPEC, spec, private=True)  # (else: continued)
            say(f"{tag}: " + ("generating anew (--overwrite)" if state == "changed"
                               else "continuing its interrupted --overwrite (charged once)"
                               if state == "continue" else "generating" if new
                               or not _started(cell_dir / "gen.jsonl")
                               else "evaluation settings changed, re-evaluating"
                               if state == "re-evaluate" else "resuming"))
            try:
                gen, timing = _generate(config, cell, refs, cell_dir, generation_model,
                                        ledger, name, overwrite=anew,
                                        continue_release=(kept or {}).get("release_id")
                                        if state == "continue" else None,
                                        opened=opened, warn=warn,
                                        on_charged=record_charge if replacing else None,
                                        on_started=record_spec if replacing else None,
                                        data_source_digest=spec["generation"]["data_sha256"])
            except BaseException:
                if new and not _started(cell_dir / "gen.jsonl"):
                    _remove_empty_cell(cell_dir)  # a cell that never started leaves nothing
                raise
            if not timing_path.exists():  # a duration: a side channel, so private
                write_json(timing_path, timing, private=True)
            say(f"{tag}: evaluating")
            model_for_eval = (cached(config.model, "float32")
                              if _scores_with_model(config) else config.model)
            try:
                evaluate_files(real, gen, metrics=_cell_metrics(config, gen),
                               embedder=config.embedder,
                               model=model_for_eval, num=config.num,
                               num_buckets=config.num_buckets,
                               mauve_bootstrap=config.mauve_bootstrap,
                               real_max_tokens=config.real_max_tokens,
                               out_dir=cell_dir / "eval", label_column=config.label_column)
            except EvaluationError as exc:
                failed.append(f"{cell.key}: {str(exc).splitlines()[0]}")
                say(f"{tag}: evaluation failed ({failed[-1]}); going on")
                continue
        metrics = json.loads(metrics_path.read_text())
        timing = json.loads(timing_path.read_text()) if timing_path.exists() else {}
        rows.append(_row(cell, config, metrics, timing))
    return rows, failed


def _started(gen: Path) -> bool:
    """Whether a cell's generation has begun: its output is published, or growing in the
    private folder (:attr:`~dplang.release.OutputPaths.partial`)."""
    return gen.exists() or OutputPaths.of(gen).partial.exists()


def _remove_empty_cell(cell_dir: Path) -> None:
    """Remove a cell folder that holds nothing but its configuration record."""
    spec = cell_dir / CELL_SPEC
    if {p.name for p in cell_dir.iterdir()} <= {CELL_SPEC}:
        spec.unlink(missing_ok=True)
        try:
            cell_dir.rmdir()
            cell_dir.parent.rmdir()  # cells/, when it was the first
        except OSError:
            pass


def sweep_spend(ledger_path: str | Path | None, release_ids: list[str], delta: float
                ) -> tuple[float, float, int, int]:
    """(Σρ, ε at δ, number of DP releases, number of releases that are not DP) of the given
    releases as recorded in the ledger (sequential composition: every cell reads the same
    references). Toy runs (a seed written in the config) are left out; a release that is not
    differential privacy (the non-private ceiling, a data-dependent bound) is counted apart,
    never as a release of ρ = 0."""
    book = PrivacyLedger(ledger_path)
    rho = 0.0
    found = not_dp = 0
    for rid in dict.fromkeys(release_ids):
        rec = book.release(rid)
        if rec is None or rec["guarantee"].get("public_seed"):
            continue
        epsilon = float(rec["guarantee"].get("epsilon", math.inf))
        if not rec["ex_ante"] or not math.isfinite(epsilon):
            not_dp += 1
            continue
        found += 1
        rho += float(rec["guarantee"].get("rho") or 0.0)
    return rho, (rho_to_epsilon(rho, delta) if rho > 0 else 0.0), found, not_dp


def _cell_release_ids(out_dir: Path, config: ExperimentConfig) -> list[str]:
    ids = []
    for cell in config.cells:
        side = OutputPaths.of(out_dir / "cells" / cell.key / "gen.jsonl").find_private()
        if cell.method != PUBLIC and side.exists():
            try:
                ids.append(str(json.loads(side.read_text(encoding="utf-8"))["release_id"]))
            except (OSError, ValueError, KeyError):
                continue
    return ids


def write_results(rows: list[dict[str, Any]], out_dir: Path, config: ExperimentConfig,
                  ledger: str | Path | None = None, dataset: str | None = None) -> None:
    """``results.csv``, ``results.md`` and the plots, all mode 600 from creation: MAUVE and the
    other utility figures are statistics of the held-out private rows, and ``gen_seconds`` /
    ``cpu_seconds`` are durations of computations on private data (a timing side channel)."""
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=result_columns())
    writer.writeheader()
    for r in rows:
        writer.writerow(r)
    write_atomic(out_dir / "results.csv", buf.getvalue(), private=True)
    name = dataset or dataset_name(config.data_path, config.dataset)
    rho, eps, releases, not_dp = sweep_spend(ledger, _cell_release_ids(out_dir, config),
                                             config.delta)
    total = PrivacyLedger(ledger).spent(name)
    write_results_md(rows, out_dir / "results.md", config, rho, eps, releases=releases,
                     dataset_total=total, not_dp=not_dp)
    write_plots(rows, out_dir)

"""Run an experiment sweep: generation + evaluation per cell, resumable, with tables and plots.

Layout of the output directory::

    DIR/data/references.jsonl, DIR/data/real.jsonl   PRIVATE copies of the row ranges of the
                                                     config (split by position only), mode 600
    DIR/cells/<key>/gen.jsonl, gen.manifest.json     generations of one cell (the release) and
                                                     their public manifest
    DIR/cells/<key>/gen.private.json                 PRIVATE: the cell's secret seed, data
                                                     digest, counts (mode 600)
    DIR/cells/<key>/eval/metrics.json                its evaluation (the cell's "done" marker)
    DIR/results.csv, DIR/results.md, DIR/*.png       the sweep's results

Every private cell is a release charged to the user's ledger under the dataset's name (not a
ledger of the experiment's own). The evaluation compares the generations with held-out real
rows of the same data: MAUVE, perplexity and the other results are statistics of those private
rows, not differentially private releases — publish them only when the held-out data is public.

A finished cell (its ``eval/metrics.json`` exists) is skipped on rerun; an interrupted cell
resumes its generation where it stopped (with the seed kept in its private side file).
"""

from __future__ import annotations

import csv
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..io import iter_json_objects, read_records
from ..models.base import LogitsModel
from ..privacy.accounting import rho_to_epsilon
from ..privacy.ledger import PrivacyLedger
from ..release import PRIVATE_MODE, dataset_name, fsync_dir
from ..textgen.batching import make_batches
from ..textgen.prompts import get_template
from ..textgen.public import generate_public_texts
from ..textgen.runner import GenerationRequest, execute_plan, plan_generation, private_path_for
from .config import Cell, ExperimentConfig, calls_per_token
from .tables import write_plots, write_results_md

RESULT_COLUMNS = (
    "method", "epsilon", "batch_size", "top_k", "temperature", "seed", "replicate",
    "calls_per_token",
    "clip", "rho", "n", "mauve", "ppl_synthetic", "delta_ppl", "length_mean",
    "effective_k", "expansion_tokens", "gen_seconds", "cpu_seconds", "resumed",
)


def _private_writer(path: Path) -> Any:
    """A new file opened for writing with mode 600 from creation."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_MODE)
    return os.fdopen(fd, "w", encoding="utf-8")


def split_data(config: ExperimentConfig, out_dir: Path) -> tuple[Path, Path]:
    """Write the reference and held-out row ranges to ``out_dir/data`` (once).

    Privacy contract: both files are copies of private rows: they are created with mode 600
    (the directory 700) and never published; copies left by earlier versions are tightened."""
    data_dir = out_dir / "data"
    refs, real = data_dir / "references.jsonl", data_dir / "real.jsonl"
    if refs.exists() and real.exists():
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
    fsync_dir(data_dir)
    return refs, real


def _generate(config: ExperimentConfig, cell: Cell, refs: Path, cell_dir: Path,
              load_model: Callable[[str], LogitsModel], ledger: Path | None, dataset: str
              ) -> tuple[Path, dict[str, Any]]:
    """Generate one cell; returns the output and its timing: ``gen_seconds`` (wall clock) and
    ``cpu_seconds`` (CPU time of this process over all threads, which a paused or contended
    run does not inflate), plus ``resumed: True`` when an interrupted generation was continued
    (its times then cover the continuation only). The model is loaded before the clocks start."""
    out = cell_dir / "gen.jsonl"
    resumed = out.exists() and out.stat().st_size > 0
    model = load_model(config.model)
    start, cpu_start = time.time(), time.process_time()

    def timing() -> dict[str, Any]:
        return {"gen_seconds": time.time() - start,
                "cpu_seconds": time.process_time() - cpu_start, "resumed": resumed}

    if cell.method == "public":
        if not out.exists():
            template = get_template(config.prompt, chat=model.has_chat_template)
            records, _ = _records(refs, config.group_by)
            labels = ([b.labels for b in make_batches(records, 1, config.num, config.group_by)]
                      if config.group_by else [{}] * config.num)
            # public generation reads no private data: its seed need not be secret
            seed = cell.seed if cell.seed is not None else cell.replicate
            generate_public_texts(model, template, labels, config.max_tokens,
                                  cell.temperature, cell.top_k, seed, out)
        return out, timing()
    request = GenerationRequest(
        data=refs, out=out, batch_size=cell.batch_size, max_tokens=config.max_tokens,
        temperature=cell.temperature, top_k=cell.top_k, epsilon=cell.epsilon,
        delta=config.delta, num=config.num, seed=cell.seed,
        concurrent_groups=config.concurrent_groups, prompt=config.prompt,
        group_by=config.group_by, model=config.model, ledger=ledger, dataset=dataset,
        method=cell.method,
        adjacency="add-remove" if cell.method == "adapmixed" else "replace-by-null",
        dtype=config.dtype, augpe_iterations=config.augpe_iterations,
        augpe_variations=config.augpe_variations,
    )
    plan = plan_generation(request, load_model)
    execute_plan(plan)
    return out, timing()


def _cell_metrics(config: ExperimentConfig, gen: Path) -> list[str]:
    """The configured metrics that apply to a cell: Top-k+ statistics exist only for methods
    that record them (InvisibleInk and public generation), so ``topk`` is dropped for the
    others rather than failing their evaluation."""
    metrics = list(config.metrics)
    if "topk" in metrics:
        first = next(iter_json_objects(gen), (0, {}))[1]
        if "topk_plus_mean" not in first:
            metrics.remove("topk")
    return metrics


def _records(path: Path, group_by: tuple[str, ...]):
    from ..io import load_references

    return load_references(path, "text", group_by)


def _row(cell: Cell, config: ExperimentConfig, metrics: dict[str, Any],
         timing: dict[str, Any]) -> dict[str, Any]:
    run = metrics["runs"][0]
    manifest = run.get("manifest") or {}

    def get(*keys: str) -> Any:
        node: Any = run
        for k in keys:
            if not isinstance(node, dict) or node.get(k) is None:
                return None
            node = node[k]
        return node

    return {
        "method": cell.method, "epsilon": cell.epsilon, "batch_size": cell.batch_size,
        "top_k": cell.top_k, "temperature": cell.temperature,
        "seed": cell.seed if cell.seed is not None else "secret", "replicate": cell.replicate,
        "calls_per_token": calls_per_token(cell, config), "clip": manifest.get("clip"),
        "rho": manifest.get("rho"), "n": metrics.get("settings", {}).get("n"),
        "mauve": get("mauve", "mauve"),
        "ppl_synthetic": get("perplexity", "mean", "mean"),
        "delta_ppl": get("perplexity", "delta_ppl"),
        "length_mean": get("length", "tokens", "mean"),
        "effective_k": get("topk", "effective_k", "mean"),
        "expansion_tokens": get("topk", "expansion_tokens", "mean"),
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
    ledger: Path | None = None,
    dataset: str | None = None,
) -> list[dict[str, Any]]:
    """Run every cell not yet finished, then write results.csv / results.md / plots.

    With ``report_only`` nothing is generated: the results cover the finished cells only (the
    state of a long sweep).

    Privacy contract: each private cell is a release of the references, charged before its
    output to ``ledger`` (default: the user's ledger) under ``dataset`` (default
    ``config.dataset``, else the data file's resolved path); its seed is fresh OS entropy kept
    in the cell's private side file unless the config writes seeds (then not secret: toy or
    public data only). ``results.md`` states the sweep's total charge."""
    from ..evaluation import evaluate_files

    say = progress or (lambda _msg: None)
    out_dir.mkdir(parents=True, exist_ok=True)
    refs, real = split_data(config, out_dir)
    name = dataset_name(config.data_path, dataset or config.dataset)
    cache: dict[tuple[str, str], LogitsModel] = {}

    def cached(spec: str, dtype: str) -> LogitsModel:
        if (spec, dtype) not in cache:
            cache[(spec, dtype)] = load_model(spec, dtype)
        return cache[(spec, dtype)]

    def generation_model(spec: str) -> LogitsModel:
        return cached(spec, config.dtype)

    rows = []
    for i, cell in enumerate(config.cells, 1):
        cell_dir = out_dir / "cells" / cell.key
        metrics_path = cell_dir / "eval" / "metrics.json"
        timing_path = cell_dir / "timing.json"
        if metrics_path.exists():
            say(f"[{i}/{len(config.cells)}] {cell.key}: done, skipped")
        elif report_only:
            say(f"[{i}/{len(config.cells)}] {cell.key}: not finished, left out of the report")
            continue
        else:
            say(f"[{i}/{len(config.cells)}] {cell.key}: generating")
            cell_dir.mkdir(parents=True, exist_ok=True)
            gen, timing = _generate(config, cell, refs, cell_dir, generation_model, ledger,
                                    name)
            if not timing_path.exists():
                timing_path.write_text(json.dumps(timing))
            say(f"[{i}/{len(config.cells)}] {cell.key}: evaluating")
            model_for_eval = (cached(config.model, "float32")
                              if "perplexity" in config.metrics else config.model)
            evaluate_files(real, gen, metrics=_cell_metrics(config, gen),
                           embedder=config.embedder,
                           model=model_for_eval, num=config.num,
                           num_buckets=config.num_buckets,
                           out_dir=cell_dir / "eval")
        metrics = json.loads(metrics_path.read_text())
        timing = json.loads(timing_path.read_text()) if timing_path.exists() else {}
        rows.append(_row(cell, config, metrics, timing))
    write_results(rows, out_dir, config, ledger, name)
    return rows


def sweep_spend(ledger_path: Path | None, release_ids: list[str], delta: float
                ) -> tuple[float, float, int]:
    """(Σρ, ε at δ, number of releases) of the given releases as recorded in the ledger
    (sequential composition: every cell reads the same references)."""
    book = PrivacyLedger(ledger_path)
    rho = 0.0
    found = 0
    for rid in dict.fromkeys(release_ids):
        rec = book.release(rid)
        if rec is None:
            continue
        found += 1
        rho += float(rec["guarantee"].get("rho") or 0.0)
    return rho, (rho_to_epsilon(rho, delta) if rho > 0 else 0.0), found


def _cell_release_ids(out_dir: Path, config: ExperimentConfig) -> list[str]:
    ids = []
    for cell in config.cells:
        side = private_path_for(out_dir / "cells" / cell.key / "gen.jsonl")
        if cell.method != "public" and side.exists():
            try:
                ids.append(str(json.loads(side.read_text(encoding="utf-8"))["release_id"]))
            except (OSError, ValueError, KeyError):
                continue
    return ids


def write_results(rows: list[dict[str, Any]], out_dir: Path, config: ExperimentConfig,
                  ledger: Path | None = None, dataset: str | None = None) -> None:
    with open(out_dir / "results.csv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=RESULT_COLUMNS)
        writer.writeheader()
        for r in rows:
            writer.writerow(r)
    name = dataset or dataset_name(config.data_path, config.dataset)
    rho, eps, releases = sweep_spend(ledger, _cell_release_ids(out_dir, config), config.delta)
    total = PrivacyLedger(ledger).spent(name)
    write_results_md(rows, out_dir / "results.md", config, rho, eps, releases=releases,
                     dataset_total=total)
    write_plots(rows, out_dir)

"""``dplang evaluate``: compare synthetic texts with held-out real texts.

Thin front end over :func:`dplang.evaluation.evaluate_files` (imported lazily so that other
commands do not pay for torch / transformers at start-up).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from .errors import fail


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def evaluate(
    real: Path = typer.Option(..., "--real", help="Held-out real texts (CSV, JSONL, ...)."),
    synthetic: list[Path] = typer.Option(
        ..., "--synthetic", metavar="OUT.jsonl",
        help="A dplang generate output; repeat for several seeds / runs.",
    ),
    out: Path = typer.Option(..., "--out", help="Directory for metrics.json, report.md, plots."),
    text_column: str = typer.Option("text", "--text-column", help="Text column of --real."),
    metrics: str | None = typer.Option(
        None, "--metrics",
        help="Comma-separated: mauve,perplexity,length,topk (default all), and downstream "
             "(opt-in; needs --label-column).",
    ),
    label_column: str | None = typer.Option(
        None, "--label-column",
        help="downstream: the public label column (generation's --group-by column).",
    ),
    test_num: int | None = typer.Option(
        None, "--test-num",
        help="downstream: held-out test rows after the n real texts (default: all the rest).",
    ),
    embedder: str = typer.Option(
        "default", "--embedder",
        help="MAUVE embedder: default (all-MiniLM-L6-v2, offline), hashing, or a folder.",
    ),
    model: str = typer.Option(
        "default", "--model", help="Perplexity / tokenizer model: default (Gemma 3 270M) or path."
    ),
    num: int | None = typer.Option(None, "--num", "-n", help="Texts per side (default: all)."),
    seed: int = typer.Option(25, "--seed", help="MAUVE k-means seed."),
    num_buckets: int | None = typer.Option(
        None, "--num-buckets", help="MAUVE buckets (default max(2, n/20))."
    ),
    exclude_references: bool = typer.Option(
        False, "--exclude-references",
        help="If --real is the generation's data file, skip its reference rows.",
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace the results an earlier evaluation left in --out."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only errors and warnings."),
) -> None:
    """Evaluate synthetic texts: MAUVE, perplexity/ΔPPL, lengths, Top-k+ statistics,
    downstream utility."""
    from dplang.release import ReleaseError, RunLock, check_output_path

    from .console import quiet_libraries

    try:
        check_output_path(out, directory=True)
    except ReleaseError as exc:
        fail(f"{exc} (evaluate writes a folder: metrics.json, report.md and plots)")
    _downstream_usage(metrics, label_column, test_num)
    existing = [out / name for name in ("metrics.json", "report.md", "downstream.json")
                if (out / name).exists()]
    if existing and not overwrite:
        fail(f"{existing[0]} already exists; choose another --out, or --overwrite to replace "
             "the results")
    with quiet_libraries(quiet):
        try:
            lock = RunLock(out).acquire()
        except ReleaseError as exc:
            fail(str(exc))
        try:
            _evaluate(real, synthetic, out, text_column, metrics, embedder, model, num,
                      seed, num_buckets, exclude_references, quiet, label_column, test_num)
        finally:
            lock.release()


def _downstream_usage(metrics: str | None, label_column: str | None,
                      test_num: int | None) -> None:
    """``--label-column`` / ``--test-num`` belong to ``--metrics downstream`` (usage errors
    before anything is read)."""
    names = [m.strip().lower() for m in (metrics or "").split(",") if m.strip()]
    if "downstream" not in names:
        if label_column is not None or test_num is not None:
            fail("--label-column and --test-num are for --metrics downstream")
    elif label_column is None:
        fail("--metrics downstream needs --label-column (the public label column)")


def _evaluate(real: Path, synthetic: list[Path], out: Path, text_column: str,
              metrics: str | None, embedder: str, model: str, num: int | None, seed: int,
              num_buckets: int | None, exclude_references: bool, quiet: bool,
              label_column: str | None = None, test_num: int | None = None) -> None:
    from dplang.evaluation import EvaluationError, evaluate_files
    from dplang.io import ReferenceDataError

    def progress(message: str) -> None:
        if not quiet:
            typer.echo(message, err=True)

    try:
        result = evaluate_files(
            real, synthetic, metrics=metrics, embedder=embedder, model=model, num=num,
            seed=seed, num_buckets=num_buckets, text_column=text_column,
            exclude_references=exclude_references, out_dir=out, progress=progress,
            label_column=label_column, test_num=test_num,
        )
    except (EvaluationError, ReferenceDataError, FileNotFoundError, ValueError) as exc:
        fail(_one_line(exc))
    for warning in result["warnings"]:
        typer.echo(f"warning: {warning}", err=True)
    if quiet:
        return
    for run in result["runs"]:
        parts = [run["name"], f"n={run['n']}"]
        if "mauve" in run:
            parts.append(f"MAUVE={100 * run['mauve']['mauve']:.2f}%")
        if "perplexity" in run:
            parts.append(f"PPL={run['perplexity']['mean']['mean']:.2f}")
            parts.append(f"ΔPPL={run['perplexity']['delta_ppl']:.2f}")
        if "length" in run:
            parts.append(f"length={run['length']['tokens']['mean']:.1f}")
        if "topk" in run:
            parts.append(f"effective_k={run['topk']['effective_k']['mean']:.2f}")
            parts.append(f"expansion_tokens={run['topk']['expansion_tokens']['mean']:.2f}")
        if "downstream" in run:
            parts.append(_downstream_line(run["downstream"]))
        typer.echo("  ".join(parts))
    if "downstream" in result["real"]:
        typer.echo(f"real (ceiling)  n={result['settings']['n']}  "
                   + _downstream_line(result["real"]["downstream"]["ceiling"]))
        typer.echo(f"wrote {out / 'downstream.md'} and {out / 'downstream.json'}")
    typer.echo(f"wrote {out / 'metrics.json'} and {out / 'report.md'}")


def _downstream_line(row: dict[str, Any]) -> str:
    """One run's (or the ceiling's) downstream scores on one line."""
    a, f = row["accuracy"], row["macro_f1"]
    return (f"{row['role']}  accuracy={a['mean']:.3f} [{a['low']:.3f}, {a['high']:.3f}]  "
            f"macro_f1={f['mean']:.3f} [{f['low']:.3f}, {f['high']:.3f}]")

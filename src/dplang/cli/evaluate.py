"""``dplang evaluate``: compare synthetic texts with held-out real texts.

Thin front end over :func:`dplang.evaluation.evaluate_files` (imported lazily so that other
commands do not pay for torch / transformers at start-up).
"""

from __future__ import annotations

from pathlib import Path

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
    """Evaluate synthetic texts: MAUVE, perplexity/ΔPPL, lengths, Top-k+ statistics."""
    from dplang.release import ReleaseError, RunLock, check_output_path

    from .console import quiet_libraries

    try:
        check_output_path(out, directory=True)
    except ReleaseError as exc:
        fail(f"{exc} (evaluate writes a folder: metrics.json, report.md and plots)")
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
            metrics = _downstream(real, synthetic, out, text_column, metrics, label_column,
                                  embedder, num, exclude_references, quiet)
            if metrics != "":
                _evaluate(real, synthetic, out, text_column, metrics, embedder, model, num,
                          seed, num_buckets, exclude_references, quiet)
        finally:
            lock.release()


def _downstream(real: Path, synthetic: list[Path], out: Path, text_column: str,
                metrics: str | None, label_column: str | None, embedder: str, num: int | None,
                exclude_references: bool, quiet: bool) -> str | None:
    """Run the opt-in ``downstream`` metric when ``--metrics`` names it (files mode 600, see
    :mod:`dplang.evaluation.downstream`); returns the other metrics ("" when none is left)."""
    names = [m.strip() for m in (metrics or "").split(",") if m.strip()]
    if "downstream" not in names:
        if label_column is not None:
            fail("--label-column is for --metrics downstream")
        return metrics
    if label_column is None:
        fail("--metrics downstream needs --label-column (the public label column)")
    from dplang.evaluation import EvaluationError
    from dplang.evaluation.downstream import evaluate_downstream_files, write_downstream
    from dplang.io import ReferenceDataError

    try:
        result = evaluate_downstream_files(
            real, synthetic, label_column=label_column, text_column=text_column, num=num,
            embedder=embedder, exclude_references=exclude_references,
            progress=None if quiet else (lambda m: typer.echo(m, err=True)))
    except (EvaluationError, ReferenceDataError, FileNotFoundError, ValueError) as exc:
        fail(_one_line(exc))
    written = write_downstream(result, out)
    if not quiet:
        for row in result["rows"]:
            a, f = row["accuracy"], row["macro_f1"]
            typer.echo(f"{row['name']}  {row['role']}  n_train={row['n_train']}  "
                       f"accuracy={a['mean']:.3f} [{a['low']:.3f}, {a['high']:.3f}]  "
                       f"macro_f1={f['mean']:.3f} [{f['low']:.3f}, {f['high']:.3f}]")
        typer.echo(f"wrote {written[0]} and {written[1]}")
    return ",".join(n for n in names if n != "downstream")


def _evaluate(real: Path, synthetic: list[Path], out: Path, text_column: str,
              metrics: str | None, embedder: str, model: str, num: int | None, seed: int,
              num_buckets: int | None, exclude_references: bool, quiet: bool) -> None:
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
        typer.echo("  ".join(parts))
    typer.echo(f"wrote {out / 'metrics.json'} and {out / 'report.md'}")

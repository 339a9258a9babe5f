"""``dplang evaluate``: compare synthetic texts with held-out real texts; ``dplang evaluate
canaries``: what a private generation lets through of phrases inserted into the references.

Thin front ends over :func:`dplang.evaluation.evaluate_files` and
:func:`dplang.experiments.canary_run.run_canaries` (imported lazily so that other commands do
not pay for torch / transformers at start-up). ``evaluate`` is a command group whose callback
is the evaluation itself (``dplang evaluate --real ... --synthetic ...``) and whose one
subcommand is ``canaries``.
"""

from __future__ import annotations

from pathlib import Path

import typer

from ..evaluation.registry import default_metrics, get_metric, metric_names, settings_problem
from ..io import DATA_FORMATS_HELP
from .errors import fail, output_lock
from .options import overwrite_option

app = typer.Typer(
    help="Evaluate synthetic texts (MAUVE, perplexity/ΔPPL, lengths, Top-k+, downstream); "
         "`dplang evaluate canaries` runs the canary check.",
    invoke_without_command=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _metrics_help() -> str:
    """``--metrics``' help, from the metric registry: the default metrics, then the opt-in
    ones with what they measure and the settings they require."""
    opt_in = []
    for name in metric_names():
        spec = get_metric(name)
        if not spec.default:
            needs = [s.flag for s in spec.settings if s.required]
            opt_in.append(f"{name} (opt-in" + (f": {spec.help}" if spec.help else "")
                          + (f"; needs {', '.join(needs)})" if needs else ")"))
    return (f"Comma-separated: {','.join(default_metrics())} (default all)"
            + (f", and {', '.join(opt_in)}" if opt_in else "") + ".")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@app.callback(invoke_without_command=True)
def evaluate(
    ctx: typer.Context,
    real: Path | None = typer.Option(
        None, "--real", help="Held-out real texts (CSV, JSONL, ...). Required."),
    synthetic: list[Path] | None = typer.Option(
        None, "--synthetic", metavar="OUT.jsonl",
        help="A dplang generate output; repeat for several seeds / runs. Required.",
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Directory for metrics.json, report.md, plots. Required."),
    text_column: str = typer.Option("text", "--text-column", help="Text column of --real."),
    metrics: str | None = typer.Option(None, "--metrics", help=_metrics_help()),
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
    real_max_tokens: int | None = typer.Option(
        None, "--real-max-tokens", metavar="T",
        help="Cut every real text to its first T tokens of --model's tokenizer before any "
             "metric (generations capped at T tokens then compare like with like).",
    ),
    mauve_bootstrap: int = typer.Option(
        0, "--mauve-bootstrap", metavar="R",
        help="MAUVE: a 95% interval over R bootstrap resamples of the texts (default 0: none; "
             "each resample is one more MAUVE computation).",
    ),
    exclude_references: bool = typer.Option(
        False, "--exclude-references",
        help="If --real is the generation's data file, skip its reference rows.",
    ),
    overwrite: bool = overwrite_option("Replace the results an earlier evaluation left in --out."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only errors and warnings."),
) -> None:
    """Evaluate synthetic texts: MAUVE, perplexity/ΔPPL, lengths, Top-k+ statistics,
    downstream utility. `dplang evaluate canaries --help`: the canary check."""
    from dplang.release import ReleaseError, check_output_path

    from .console import quiet_libraries

    if ctx.invoked_subcommand is not None:
        given = [k for k, v in ctx.params.items()
                 if not (v is None or v is False or v == _DEFAULTS.get(k)
                         or (isinstance(v, (list, tuple)) and not v))]
        if given:
            fail(f"the options of `dplang evaluate` ({', '.join(sorted(given))}) do not go "
                 f"with `{ctx.invoked_subcommand}`; give that command's own options after it")
        return
    missing = [flag for flag, value in (("--real", real), ("--synthetic", synthetic),
                                        ("--out", out)) if not value]
    if missing:
        fail(f"missing option {missing[0]} (dplang evaluate --help)")
    assert real is not None and synthetic is not None and out is not None
    try:
        check_output_path(out, directory=True)
    except ReleaseError as exc:
        fail(f"{exc} (evaluate writes a folder: metrics.json, report.md and plots)")
    _settings_usage(metrics, label_column, test_num, mauve_bootstrap)
    existing = [out / name for name in ("metrics.json", "report.md", "downstream.json")
                if (out / name).exists()]
    if existing and not overwrite:
        fail(f"{existing[0]} already exists; choose another --out, or --overwrite to replace "
             "the results")
    with quiet_libraries(quiet), output_lock(out):
        _evaluate(real, synthetic, out, text_column, metrics, embedder, model, num,
                  seed, num_buckets, exclude_references, quiet, label_column, test_num,
                  mauve_bootstrap, real_max_tokens)


#: Non-empty defaults of the evaluation's options (see the subcommand check above).
_DEFAULTS = {"text_column": "text", "embedder": "default", "model": "default", "seed": 25,
             "mauve_bootstrap": 0}


def _settings_usage(metrics: str | None, label_column: str | None,
                    test_num: int | None, mauve_bootstrap: int = 0) -> None:
    """A metric's own settings (``--label-column``, ``--test-num``, ``--mauve-bootstrap``: the
    registry says whose) given without it, or a chosen metric without one it requires: usage
    errors before anything is read."""
    names = [m for m in metrics.split(",") if m.strip()] if metrics is not None else None
    problem = settings_problem(names, {"label_column": label_column, "test_num": test_num,
                                       "mauve_bootstrap": mauve_bootstrap or None})
    if problem is not None:
        fail(problem)


def _evaluate(real: Path, synthetic: list[Path], out: Path, text_column: str,
              metrics: str | None, embedder: str, model: str, num: int | None, seed: int,
              num_buckets: int | None, exclude_references: bool, quiet: bool,
              label_column: str | None = None, test_num: int | None = None,
              mauve_bootstrap: int = 0, real_max_tokens: int | None = None) -> None:
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
            label_column=label_column, test_num=test_num, mauve_bootstrap=mauve_bootstrap,
            real_max_tokens=real_max_tokens,
        )
    except (EvaluationError, ReferenceDataError, FileNotFoundError, ValueError) as exc:
        fail(_one_line(exc))
    for warning in result["warnings"]:
        typer.echo(f"warning: {warning}", err=True)
    if quiet:
        return
    specs = [get_metric(name) for name in metric_names()]
    for run in result["runs"]:
        parts = [run["name"], f"n={run['n']}"]
        for spec in specs:
            if spec.name in run:
                parts += spec.run_summary(run[spec.name])
        typer.echo("  ".join(parts))
    for spec in specs:
        if spec.footer is not None and spec.name in result["settings"]["metrics"]:
            for line in spec.footer(result, out):
                typer.echo(line)
    typer.echo(f"wrote {out / 'metrics.json'} and {out / 'report.md'}")


@app.command("canaries")
def canaries(
    data: Path = typer.Option(..., "--data", help=f"References: {DATA_FORMATS_HELP}."),
    out: Path = typer.Option(
        ..., "--out", help="Directory for canaries.md, canaries.png and canaries.json."),
    epsilon: str = typer.Option(
        "1,10", "--epsilon", help="Comma-separated ε values, one pair of runs each."),
    repeats: str = typer.Option(
        "1,2,5,20,50", "--repeats",
        help="Comma-separated m: one canary per entry, inserted into m references."),
    num: int = typer.Option(32, "--num", "-n", help="Generations per run (num × B references)."),
    batch_size: int = typer.Option(3, "--batch-size", "-B", help="References per generation."),
    max_tokens: int = typer.Option(32, "--max-tokens", "-T", help="Tokens per generation."),
    top_k: int = typer.Option(50, "--top-k", help="Top-k of the public logits (0: all)."),
    temperature: float = typer.Option(1.2, "--temperature", help="Sampling temperature."),
    delta: float = typer.Option(1e-6, "--delta", help="Target δ."),
    model: str = typer.Option("default", "--model", help="'default' (Gemma 3 270M) or a path."),
    text_column: str = typer.Option("text", "--text-column", help="Text column of --data."),
    prompt: str = typer.Option("generic", "--prompt", help="Built-in template or a TOML file."),
    seed: int | None = typer.Option(
        None, "--seed",
        help="A seed for every run (NOT secret: toy or public data only). Default: one fresh "
             "secret seed, never written.",
    ),
    canary_seed: int = typer.Option(0, "--canary-seed", help="Chooses canary texts and rows."),
    concurrent_groups: int = typer.Option(8, "--concurrent-groups", "-G",
                                          help="Groups decoded at once."),
    overwrite: bool = overwrite_option("Replace the results an earlier run left in --out."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only errors and warnings."),
) -> None:
    """Insert canary sentences into copies of the references, generate with and without them
    (same seed, throw-away ledger, temporary mode-600 copies), count what comes through."""
    import signal

    from dplang.experiments.canary_run import (
        CanaryRunError,
        CanaryRunSettings,
        check_settings,
        failed_coupling,
        render_canaries,
        run_canaries,
        write_canary_outputs,
    )
    from dplang.io import ReferenceDataError
    from dplang.models.default import ModelSpecError, check_model_spec
    from dplang.release import ReleaseError, check_output_path
    from dplang.textgen.orchestration import GenerationError

    from .console import quiet_libraries

    try:
        check_output_path(out, directory=True)
    except ReleaseError as exc:
        fail(f"{exc} (canaries writes a folder: canaries.md, canaries.png, canaries.json)")
    existing = [out / n for n in ("canaries.json", "canaries.md") if (out / n).exists()]
    if existing and not overwrite:
        fail(f"{existing[0]} already exists; choose another --out, or --overwrite to replace "
             "the results")
    try:
        settings = CanaryRunSettings(
            data=data, epsilons=tuple(float(x) for x in epsilon.split(",") if x.strip()),
            repeats=tuple(int(x) for x in repeats.split(",") if x.strip()), num=num,
            batch_size=batch_size, max_tokens=max_tokens, top_k=top_k,
            temperature=temperature, delta=delta, model=model, text_column=text_column,
            prompt=prompt, seed=seed, canary_seed=canary_seed,
            concurrent_groups=concurrent_groups)
    except ValueError:
        fail("--epsilon and --repeats are comma-separated numbers (e.g. --epsilon 1,10 "
             "--repeats 1,2,5,20,50)")
    try:
        check_settings(settings)
        check_model_spec(model)
    except (CanaryRunError, ModelSpecError) as exc:
        fail(_one_line(exc))

    def progress(message: str) -> None:
        if not quiet:
            typer.echo(message, err=True)

    def terminated(*_args: object) -> None:  # the temporary copies of the data are removed
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        with quiet_libraries(quiet), output_lock(out):
            result = run_canaries(settings, progress=progress)
            written = write_canary_outputs(result, out)
    except (CanaryRunError, GenerationError, ReferenceDataError, ModelSpecError) as exc:
        fail(_one_line(exc))
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not quiet:
        typer.echo(render_canaries(result))
        typer.echo(f"wrote {', '.join(str(p) for p in written)}")
    failed = failed_coupling(result)
    if failed is not None:
        fail(f"{failed}; the results are in {out} for the diagnosis", code=1)

"""``dplang generate``: private text generation with InvisibleInk."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ..api.errors import DPLangError
from ..io import DATA_FORMATS_HELP
from ..privacy.accounting import DEFAULT_BATCH_SIZE, DEFAULT_MAX_TOKENS, DEFAULT_TEMPERATURE
from ..textgen.defaults import DEFAULT_CONCURRENT_GROUPS
from ..textgen.methods import all_methods
from ..textgen.prompts import DEFAULT_MAX_REFERENCE_TOKENS, DEFAULT_TEMPLATE
from .console import RichDisplay, quiet_libraries
from .errors import fail, use_threads
from .options import dataset_option, ledger_option, overwrite_option, seed_option

if TYPE_CHECKING:
    from ..textgen.orchestration import GenerationRequest

# The generation machinery (torch, the models) is imported when a run starts, not when the
# command is built: `dplang generate --help` answers in well under a second.


def resolve_model(spec: str, **kwargs: Any) -> Any:
    """:func:`dplang.models.resolve_model` (imported on call)."""
    from ..models import resolve_model as resolve

    return resolve(spec, **kwargs)


def resolve_prompt_side(spec: str, **kwargs: Any) -> Any:
    """:func:`dplang.models.default.resolve_prompt_side` (imported on call)."""
    from ..models.default import resolve_prompt_side as resolve

    return resolve(spec, **kwargs)


def check_model_spec(spec: str) -> None:
    """:func:`dplang.models.default.check_model_spec` (imported on call)."""
    from ..models.default import check_model_spec as check

    check(spec)


def _load_model(spec: str, dtype: str = "float32", device: str = "cpu", *,
                weights: bool = True):
    """The driver's model: the whole model (``--executor inline``), or with ``weights=False``
    only its prompt side (tokenizer, chat template, identity), when workers load the model.
    An indirection: tests substitute a toy (called without ``device`` on the CPU, and
    without ``weights`` inline)."""
    device_kw = {"device": device} if device != "cpu" else {}
    if not weights:
        return resolve_prompt_side(spec, dtype=dtype, **device_kw)
    return resolve_model(spec, dtype=dtype, **device_kw)


def _check_model(spec: str) -> None:  # milliseconds: is --model loadable at all?
    check_model_spec(spec)


def _generate(
    data: Path = typer.Option(..., "--data", help=f"References: {DATA_FORMATS_HELP}."),
    out: Path = typer.Option(..., "--out", help="Output JSONL; a manifest is written beside it."),
    model: str = typer.Option("default", "--model", help="'default' (Gemma 3 270M) or a path."),
    dtype: str = typer.Option(
        "bfloat16", "--dtype",
        help="Model precision: bfloat16 (default: 8-bit body weights, faster; texts "
        "indistinguishable from float32's at n = 500), float32 (16-bit integer weights) or "
        "auto (= bfloat16); docs/generation.md.",
    ),
    threads: int | None = typer.Option(
        None, "--threads", min=1,
        help="CPU threads (default: $DPLANG_THREADS, $OMP_NUM_THREADS or every core); speed "
        "only: the output is the same bits at any thread count.",
    ),
    epsilon: float | None = typer.Option(None, "--epsilon", help="Target ε (with --delta)."),
    delta: float = typer.Option(1e-6, "--delta", help="Target δ."),
    rho: float | None = typer.Option(None, "--rho", help="zCDP budget instead of ε."),
    clip: float | None = typer.Option(None, "--clip", help="Clip norm C instead of a budget."),
    batch_size: int = typer.Option(DEFAULT_BATCH_SIZE, "--batch-size", "-B",
                                   help="References per generation."),
    max_tokens: int = typer.Option(DEFAULT_MAX_TOKENS, "--max-tokens", "-T",
                                   help="Maximum tokens T."),
    temperature: float = typer.Option(DEFAULT_TEMPERATURE, "--temperature",
                                      help="Sampling temperature τ."),
    top_k: int = typer.Option(50, "--top-k", help="Top-k+ parameter k; 0 = full vocabulary."),
    num: int | None = typer.Option(None, "--num", "-n", help="Generations (default ⌊N/B⌋)."),
    seed: int | None = seed_option("kept in .dplang-private/OUT.private.json (mode 600) to "
                                   "resume"),
    concurrent_groups: int = typer.Option(
        DEFAULT_CONCURRENT_GROUPS, "--concurrent-groups", "-G", help="Groups decoded at once."
    ),
    prompt: str = typer.Option(
        DEFAULT_TEMPLATE, "--prompt",
        help="generic (default: any text column), yelp (needs --group-by label columns), tab, "
        "mimic or a .toml file."),
    system: str | None = typer.Option(None, "--system", help="System prompt (chat models)."),
    describe: str | None = typer.Option(
        None, "--describe", metavar="PHRASE",
        help="What the texts are, e.g. \"restaurant reviews from Yelp\": PUBLIC (written in "
        "the prompts and the manifest), never a secret. The generic prompt needs it for "
        "on-topic text (docs/generation.md, Prompts)."),
    text_column: str = typer.Option("text", "--text-column", help="Column with the text."),
    group_by: str | None = typer.Option(
        None, "--group-by", help="Comma-separated PUBLIC label columns to batch within."
    ),
    batch_order: str = typer.Option(
        "grouped", "--batch-order",
        help="With --group-by and --num: which batches are generated: grouped (the first "
             "groups first, the default) or interleaved (every group in proportion)."
    ),
    adjacency: str = typer.Option("replace-by-null", "--adjacency",
                                  help="replace-by-null (default) or zero-out."),
    max_reference_tokens: int = typer.Option(
        DEFAULT_MAX_REFERENCE_TOKENS, "--max-reference-tokens",
        help="References are cut to their first this-many tokens.",
    ),
    dense: bool = typer.Option(False, "--dense", help="Full LM head for private rows."),
    allow_special_tokens: bool = typer.Option(
        False, "--allow-special-tokens",
        help="Let the model sample its special and control tokens (<start_of_image>, "
        "<pad>...), which are otherwise never sampled."),
    method: str = typer.Option("invisibleink", "--method", help="(from the method registry)"),
    ledger: str | None = ledger_option(),
    dataset: str | None = dataset_option(),
    overwrite: bool = overwrite_option(
        "Replace what --out holds (another run) with a new run; the old files are removed only "
        "once the new run is charged. Without it, the same run resumes and another is "
        "refused."),
    quiet: bool = typer.Option(False, "--quiet", "-q",
                               help="Print only errors and warnings (no progress, no texts)."),
    dry_run: bool = typer.Option(
        False, "--dry-run",
        help="Check everything, read the data, load the model and print the plan, the "
        "guarantee, the model calls and an estimated time; charge and write nothing."),
    method_options: dict[str, Any] | None = None,
    executor: str = typer.Option(
        "inline", "--executor",
        help="Who decodes the groups: inline (this process), local (--workers spawned "
        "processes) or ray (Ray actors). The output is the same bytes (docs/scaling.md)."),
    workers: int = typer.Option(1, "--workers", help="Worker processes or actors (local, ray)."),
    ray_address: str | None = typer.Option(
        None, "--ray-address", help="Ray cluster to join (default: start a local instance)."),
    worker_timeout: float | None = typer.Option(
        None, "--worker-timeout", metavar="SECONDS",
        help="A worker (local, ray) that holds groups and makes no progress for this long "
        "is stopped and replaced, its groups retried [default: 600]."),
    device: str = typer.Option(
        "cpu", "--device",
        help="cpu (default), cuda or auto (cuda when a GPU is visible); part of the run's "
        "identity."),
) -> None:
    """Generate private synthetic texts from references with InvisibleInk."""
    from ..textgen.orchestration import GenerationRequest

    use_threads(threads)
    request = GenerationRequest(
        data=data, out=out, batch_size=batch_size, max_tokens=max_tokens,
        temperature=temperature, top_k=top_k, epsilon=epsilon, delta=delta, rho=rho, clip=clip,
        adjacency=adjacency, num=num, seed=seed, concurrent_groups=concurrent_groups,
        prompt=prompt, system=system, describe=describe, text_column=text_column,
        group_by=tuple(c.strip() for c in group_by.split(",") if c.strip()) if group_by else (),
        model=model, max_reference_tokens=max_reference_tokens, sparse_head=not dense,
        special_tokens=allow_special_tokens,
        ledger=ledger, dataset=dataset, method=method, method_options=method_options or {},
        dtype=dtype, overwrite=overwrite, batch_order=batch_order,
    )
    with quiet_libraries(quiet):
        _checked_run(request, quiet, _Execution(executor, workers, ray_address, device,
                                                worker_timeout), dry_run=dry_run)


def _method_parameters() -> dict[str, tuple[str, str, inspect.Parameter]]:
    """``{parameter: (method, option, typer parameter)}``: every registered method's options
    as ``--<method>-<option>`` flags (default None: "not given", so that a flag of another
    method than ``--method`` is refused instead of silently ignored)."""
    out: dict[str, tuple[str, str, inspect.Parameter]] = {}
    for spec in all_methods():
        for opt in spec.options:
            name = f"{spec.name}_{opt.name}"
            shown = opt.default if not opt.choices else f"{opt.default}; {'|'.join(opt.choices)}"
            out[name] = (spec.name, opt.name, inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, annotation=opt.type | None,
                default=typer.Option(None, opt.flag(spec.name),
                                     help=f"{spec.name}: {opt.help} [default: {shown}]",
                                     show_default=False)))
    return out


def _method_help(default: str) -> str:
    """``--method``'s help: the registered methods, ``default`` first; a method that takes no
    privacy budget (not private at all) is shown with its spec's summary, which says so."""
    others = [spec.name + ("" if spec.takes_budget else f" ({spec.summary})")
              for spec in all_methods() if spec.name != default]
    listed = (", ".join(others[:-1]) + " or " + others[-1]) if len(others) > 1 else "".join(others)
    return f"{default} (default)" + (f", {listed}" if listed else "") + " (docs/deviations.md)."


def _with_registry_help(param: inspect.Parameter) -> inspect.Parameter:
    """``param``, with ``--method``'s help listing the methods registered now."""
    if param.name != "method":
        return param
    option = copy.copy(param.default)
    option.help = _method_help(option.default)
    return param.replace(default=option)


def _build_command() -> Callable[..., None]:
    """``dplang generate``: the shared flags of :func:`_generate` and each registered method's
    own flags (the registry decides them: adding a method adds its flags here)."""
    base = inspect.signature(_generate, eval_str=True)
    extra = _method_parameters()

    def generate(**kwargs: Any) -> None:
        method = kwargs.get("method", "invisibleink")
        options: dict[str, Any] = {}
        for name, (owner, option, _param) in extra.items():
            value = kwargs.pop(name, None)
            if value is None:
                continue
            if owner != method:
                fail(f"--{owner}-{option.replace('_', '-')} applies to --method {owner} only "
                     f"(this run is --method {method})")
            options[option] = value
        _generate(**kwargs, method_options=options)

    params = [_with_registry_help(p).replace(kind=inspect.Parameter.KEYWORD_ONLY)
              for p in base.parameters.values() if p.name != "method_options"]
    params += [param for _m, _o, param in extra.values()]
    generate.__signature__ = base.replace(parameters=params)  # type: ignore[attr-defined]
    generate.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
    generate.__doc__ = _generate.__doc__
    return generate


_BUILT: dict[tuple[str, ...], Callable[..., None]] = {}


def command() -> Callable[..., None]:
    """The ``generate`` command for the methods registered now (built once per method set)."""
    key = tuple(spec.name for spec in all_methods())
    if key not in _BUILT:
        _BUILT[key] = _build_command()
    return _BUILT[key]


generate = command()


class _Execution:
    """Where the run executes (not part of its identity, except the device type)."""

    def __init__(self, executor: str = "inline", workers: int = 1,
                 ray_address: str | None = None, device: str = "cpu",
                 worker_timeout: float | None = None) -> None:
        self.executor, self.workers, self.ray_address = executor, workers, ray_address
        self.device = device
        #: ``--worker-timeout``: seconds without progress before a worker is declared hung.
        self.worker_timeout = worker_timeout


def _checked_run(request: GenerationRequest, quiet: bool,
                 execution: _Execution | None = None, *, dry_run: bool = False) -> None:
    """The run through :func:`dplang.api.generation.run_generation` (the one dplang.generate
    uses) with the command line's display; its refusals become one-line errors."""
    from ..api.generation import Execution, run_generation
    from ..models.devices import DeviceError, resolve_device

    execution = execution or _Execution()
    try:
        device = resolve_device(execution.device)
    except DeviceError as exc:
        fail(str(exc))
    # with workers (local, ray) the driver loads only the prompt side; each worker loads the
    # model and runs its load-time checks before anything is charged (docs/scaling.md)
    loader_kw: dict[str, Any] = {"device": device} if device != "cpu" else {}
    if execution.executor != "inline":
        loader_kw["weights"] = False
    display = RichDisplay(quiet)
    try:
        run = run_generation(
            request, display=display,
            execution=Execution(execution.executor, execution.workers, execution.ray_address,
                                device, execution.worker_timeout),
            load_model=lambda spec: _load_model(spec, request.dtype, **loader_kw),
            check_model=_check_model, dry_run=dry_run)
    except DPLangError as exc:
        fail(str(exc), exc.code)
    plan, summary = run.plan, run.summary
    if run.dry_run:
        if quiet:  # -q --dry-run: the plan still goes out (it is what was asked for)
            from ..api.generation import dry_run_lines, plan_line

            for line in (plan_line(plan), *dry_run_lines(plan)):
                typer.echo(line, err=True)
        return
    display.console.print(
        f"wrote {summary.written} new generations ({summary.skipped_existing} already there) "
        f"to {request.out}; public manifest {plan.manifest_path}, private side file "
        f"{plan.private_path} (mode 600, never publish it)", markup=False, highlight=False
    )
    if not quiet:
        typer.echo(plan.guarantee.summary())

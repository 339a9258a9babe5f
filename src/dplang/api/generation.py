"""Private text generation as one call: :func:`generate`, and the run both it and
``dplang generate`` go through (:func:`run_generation`).

Order of work (the command line's, which is the privacy argument's; ``docs/api.md``):

1. the device, the executor and every parameter, path, the ledger and the model spec are
   checked (milliseconds, nothing read or created: :func:`~dplang.textgen.orchestration.
   check_request`);
2. the dataset's budget is checked against the release's guarantee (fixed by the parameters
   alone) before any data is read or model loaded, so an over-budget run is refused in
   milliseconds; a run that may repeat a release already in the ledger (its output holds a
   run to resume, or the seed is given) is checked only by the charge, which knows;
3. under the output's lock: the data is read, the batches formed, the output compared with
   what it holds, the model loaded (its loaders' own bars folded into the status line);
4. :func:`~dplang.textgen.orchestration.execute_plan`: the private side file's opening record
   (the seed, so that a stop inside the charge keeps it), the charge, at the last moment before
   the first computation on the private references (after the workers loaded and checked their
   model), then the manifest, the whole private side file, and each generation as it is
   finished.

A Ctrl-C becomes :class:`~dplang.api.errors.Interrupted`, whose message says what was kept, what
was charged and how to resume.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..io import ReferenceDataError
from ..models.devices import DeviceError, resolve_device
from ..privacy.accounting import DEFAULT_BATCH_SIZE, DEFAULT_MAX_TOKENS, DEFAULT_TEMPERATURE
from ..privacy.guarantees import Guarantee
from ..privacy.ledger import BudgetExceeded, LedgerError, PrivacyLedger
from ..privacy.ledger_backends import is_ledger_url, ledger_location
from ..release import Charge, OutputPaths, Release, ReleaseError, RunLock, dataset_name
from ..textgen.defaults import DEFAULT_CONCURRENT_GROUPS
from ..textgen.executors import ExecutorError, check_executor, make_executor
from ..textgen.orchestration import (
    GenerationError,
    GenerationPlan,
    GenerationRequest,
    RunSummary,
    check_request,
    execute_plan,
    plan_generation,
)
from ..textgen.prompts import DEFAULT_MAX_REFERENCE_TOKENS
from ..textgen.resume import read_record
from .data import data_input
from .display import (
    Display,
    TqdmDisplay,
    _duration,
    library_bars_off,
    quiet_libraries,
    short_guarantee,
)
from .errors import BUDGET, DPLangError, Interrupted, one_line
from .outputs import output_location
from .params import python_api, unknown_keyword

if TYPE_CHECKING:
    import pandas as pd

    from ..models.base import PromptModel

__all__ = ["Execution", "GenerationResult", "GenerationRun", "generate", "run_generation"]


@dataclass(frozen=True)
class Execution:
    """Where a run decodes (not part of its identity, except the device type)."""

    executor: str = "inline"
    workers: int = 1
    ray_address: str | None = None
    device: str = "cpu"
    #: Seconds without progress before a worker is declared hung (local, ray).
    worker_timeout: float | None = None


@dataclass
class GenerationRun:
    """A finished run: its plan (request, guarantee, batches, model) and what it wrote."""

    plan: GenerationPlan
    summary: RunSummary
    #: A dry run: planned and shown, nothing charged or written.
    dry_run: bool = False


def model_loader(dtype: str, device: str, *, weights: bool = True
                 ) -> Callable[[str], PromptModel]:
    """The driver's model loader: the whole model, or with ``weights=False`` only its prompt
    side (tokenizer, chat template, identity), when workers load the model."""

    def load(spec: str) -> PromptModel:
        from ..models import resolve_model
        from ..models.default import resolve_prompt_side

        device_kw = {"device": device} if device != "cpu" else {}
        if not weights:
            return resolve_prompt_side(spec, dtype=dtype, **device_kw)
        return resolve_model(spec, dtype=dtype, **device_kw)

    return load


def _check_model(spec: str) -> None:  # milliseconds: is the model spec loadable at all?
    from ..models.default import check_model_spec

    check_model_spec(spec)


def _check_budget_early(request: GenerationRequest, guarantee: Guarantee) -> None:
    """Refuse (code 3) a new release the dataset's budget cannot take, before anything is read
    or loaded. Skipped where the release may already be in the ledger (a run in ``out`` to
    resume, or a given seed: the same release is charged nothing new); the charge decides."""
    if request.seed is not None or (OutputPaths.of(request.out).find_manifest().exists()
                                    and not request.overwrite):
        return
    where = ledger_location(request.ledger)
    if not is_ledger_url(str(where)) and not Path(where).exists():
        return  # no ledger yet: no budget (and nothing is created before the charge)
    try:
        PrivacyLedger(where).check_charge(dataset_name(request.data, request.dataset),
                                          guarantee)
    except BudgetExceeded as exc:
        raise DPLangError(str(exc), BUDGET) from None


#: Said when a run uses the generic prompt with no description of the texts.
BARE_PROMPT_WARNING = (
    "the generic prompt does not say what your texts are, and the model then writes about "
    "anything (off-topic texts): describe them, e.g. --describe \"customer reviews of local "
    "businesses\" "
    "(public: it goes into the prompts and the manifest) or give a "
    "template, --prompt FILE.toml (docs/generation.md, \"Prompts\")")


def dry_run_lines(plan: GenerationPlan, probe_steps: int = 3) -> list[str]:
    """What a dry run shows: the guarantee, the model calls, and an estimated time from a
    probe of a few decode steps of the PUBLIC prompts (no reference is read for it; the
    references' own prefill comes on top). Nothing is charged or written."""
    import time

    req = plan.request
    groups = len(plan.jobs)
    rows = req.batch_size + 1
    lines = [f"dry run: nothing is charged, written or computed on the references; "
             f"{plan.guarantee.summary()}",
             f"model calls: {groups} generations × {rows} rows (B = {req.batch_size} "
             f"references and the public prompt) × up to T = {req.max_tokens} tokens = "
             f"{groups * rows * req.max_tokens:,} token rows"]
    model = plan.model
    if not (hasattr(model, "next_hidden") and hasattr(model, "logits_from_hidden")) \
            or not plan.jobs:
        return [*lines, "estimated time: not probed (the workers load the model)"]
    concurrent = min(req.concurrent_groups, groups)
    prompts = [job.public_prompt for job in plan.jobs[:concurrent] for _ in range(rows)]
    state = model.encode_prompts(prompts)
    import torch

    start = time.perf_counter()
    hidden = model.next_hidden(state, None).cpu()  # waits for a GPU: the prefill's time
    prefill = time.perf_counter() - start
    tokens = torch.zeros(len(prompts), dtype=torch.long)
    start = time.perf_counter()
    for _ in range(probe_steps):
        model.logits_from_hidden(model.next_hidden(state, tokens))
    step = (time.perf_counter() - start) / probe_steps
    waves = -(-groups // concurrent)
    estimate = waves * (prefill + req.max_tokens * step)
    del hidden, state
    return [*lines, f"estimated time: about {_duration(estimate)} ({waves} wave(s) of "
                    f"{concurrent} groups; a decode step {step * 1000:.0f} ms, the public "
                    f"prompts' prefill {prefill:.1f} s: references make the prefill longer, "
                    "EOS the decoding shorter)"]


def plan_line(plan: GenerationPlan) -> str:
    """The run's plan in one line (method, n, B, T, k, C when the method has a clip norm, the
    guarantee, the model)."""
    req, g = plan.request, plan.guarantee
    clip = f"C={plan.params.clip:.4g}, " if plan.params.clip > 0 else ""
    return (f"{req.method}: {len(plan.jobs)} generations, B={req.batch_size}, "
            f"T={req.max_tokens}, k={req.top_k}, {clip}"
            + (f"ρ={g.rho:.4g} " if g.rho is not None else "")
            + (f"(ε={g.epsilon:.4g}, δ={g.delta:g}), " if g.ex_ante else
               f"(claimed ε={g.epsilon:.4g}, δ={g.delta:g}: unproven accounting, NOT a DP "
               "guarantee), " if g.details.get("unproven") else
               f"(stopping target ε={g.epsilon:.4g}, δ={g.delta:g}: data-dependent, NOT a DP "
               "guarantee), ")
            + f"model {plan.model.model_id}")


class _RunState:
    """What an interrupted run had done: charged or not, whether its seed is kept (the side
    file, or the replacement of an earlier run's files: :meth:`_seed_kept`), whether it had
    begun decoding (``started``), and how many generations it kept."""

    def __init__(self, plan: GenerationPlan, keep: bool) -> None:
        self.plan, self.keep = plan, keep
        self.charge: Charge | None = None
        self.release: Release | None = None  # set right before the charge
        self.total = len(plan.jobs)
        self.done_before = 0
        self.written = 0
        self.started = False  # its files are in place and it decodes (``on_start``)

    def interrupted(self) -> str:
        plan = self.plan
        out = plan.request.out
        if self.charge is None and self._recorded():
            recorded = (f"interrupted while the release was charged: it is in the ledger of "
                        f"dataset {plan.dataset!r} ({short_guarantee(plan.guarantee)})")
            kept = self._seed_kept()  # in the side file written before the charge
            if kept is not None:  # the same command, --overwrite or not, continues it
                return (f"{recorded}; its seed is kept in {kept}: run the same command again "
                        "to continue it (no new charge)")
            return (f"{recorded}, but its seed was not kept and nothing was written: a rerun "
                    "is a new release, charged again")
        if self.charge is None:
            return ("interrupted before the release was charged: nothing was charged"
                    + (f" and nothing written to {out}" if self.keep else ""))
        level = short_guarantee(plan.guarantee)
        charged = (f"the release was charged to dataset {plan.dataset!r} ({level})"
                   if self.charge.recorded else
                   f"nothing new was charged to dataset {plan.dataset!r} (the release was "
                   "already in the ledger)")
        paths = plan.paths
        no_text = not (self.started or paths.partial.exists() or out.exists())
        kept_at = self._seed_kept() if no_text else None
        if kept_at is not None:  # charged, no text yet: the same command (--overwrite or
            # not) continues it with the kept seed (dplang.textgen.resume.check_existing)
            return (f"interrupted: {charged}; no text was written yet; its seed is kept in "
                    f"{kept_at}: run the same command again to continue it (no new charge)")
        if not self.keep:
            return (f"interrupted: {charged}; its {self.written} finished generation(s) were "
                    "not kept (no out=); calling again draws a new seed, a new charge: pass "
                    "out= to make a run resumable")
        if plan.method.spec.run_population is not None:
            return (f"interrupted: {charged}; --method {plan.request.method} runs whole, so "
                    f"no text is published; run the same command again"
                    f"{self._without_overwrite()} to start it over with "
                    f"the same seed (kept in {plan.private_path}: the same texts), no new "
                    "charge")
        kept = self.done_before + self.written
        return (f"interrupted: {kept} of {self.total} generations are kept in "
                f"{plan.paths.partial} (private until the run is complete; {out} appears "
                f"then); {charged}; run the same command again{self._without_overwrite()} to "
                f"resume (the seed is kept in {plan.private_path}): resuming charges nothing "
                "new")

    def _without_overwrite(self) -> str:
        """How to say "the same command": with --overwrite, it would discard what was kept
        and charge a new release."""
        return " without --overwrite" if self.plan.request.overwrite else ""

    def _seed_kept(self) -> Path | None:
        """The side file that holds this release's seed (written before the charge: the
        side file, or the replacement of an earlier run's files under ``--overwrite``); None
        when none does (an API call's temporary output keeps no seed)."""
        if self.release is None or not self.keep:
            return None
        for path in (self.plan.paths.replacement, self.plan.paths.find_private()):
            record = read_record(path)
            if (record is not None and record.get("release_id") == self.release.release_id
                    and record.get("seed") is not None):
                return path
        return None

    def _recorded(self) -> bool:
        """Whether the release an interruption stopped inside its charge is in the ledger."""
        return self.release is not None and self.release.in_ledger()


def run_generation(request: GenerationRequest, *, display: Display,
                   execution: Execution | None = None,
                   load_model: Callable[[str], PromptModel] | None = None,
                   check_model: Callable[[str], None] | None = _check_model,
                   keep: bool = True, dry_run: bool = False) -> GenerationRun:
    """One whole generation run into ``request.out`` (see the module docstring for the order).

    ``load_model(spec)`` loads the driver's model (default :func:`model_loader` for the
    request's dtype and device: the prompt side only when workers decode); ``keep=False``
    says the output is temporary (the interruption message then does not offer a resume).
    ``dry_run=True`` stops after the plan (:func:`dry_run_lines` shows it): nothing is
    charged, written or computed on the references.

    Privacy contract: that of :func:`~dplang.textgen.orchestration.execute_plan`: the texts
    written satisfy the plan's guarantee, charged to the ledger under the request's dataset
    name before anything is written and before the first computation on the private
    references; the manifest is public, the seed, digest and counts go to the private side
    file (mode 600). Raises :class:`DPLangError` (code 2: nothing charged or written; code 3:
    refused by the budget, nothing charged or written) and :class:`Interrupted`."""
    execution = execution or Execution()
    try:  # where it runs, then every flag and path, in milliseconds, before anything is read
        device = resolve_device(execution.device)
        check_executor(execution.executor, execution.workers, request.method,
                       execution.worker_timeout)
    except (DeviceError, ValueError) as exc:
        raise DPLangError(one_line(exc)) from None
    try:
        made = check_request(request, check_model)
    except GenerationError as exc:
        raise DPLangError(one_line(exc)) from None
    _check_budget_early(request, made.guarantee)
    workers = execution.executor != "inline"
    loader = load_model or model_loader(request.dtype, device, weights=not workers)
    try:  # a second process on the same output is refused before anything loads
        lock = RunLock(request.out).acquire()
    except ReleaseError as exc:
        raise DPLangError(one_line(exc)) from None
    try:
        return _run_locked(request, display, Execution(
            execution.executor, execution.workers, execution.ray_address, device,
            execution.worker_timeout), loader, check_model, keep, dry_run)
    finally:
        lock.release()


def _run_locked(request: GenerationRequest, display: Display, execution: Execution,
                loader: Callable[[str], PromptModel], check_model: Callable[[str], None] | None,
                keep: bool, dry_run: bool = False) -> GenerationRun:
    from ..models.cpu_kernels import compile_expected, record_compiled

    what = "the tokenizer" if execution.executor != "inline" else "the model"
    # the note is about a model loaded in this process (workers load and compile their own)
    compiles = (execution.device == "cpu" and execution.executor == "inline"
                and compile_expected())
    note = (" (the first run of this dplang on this machine also compiles its CPU kernels: "
            "about a minute, once)") if compiles else ""
    try:
        with display.status(f"reading the data and loading {what}{note}…"), library_bars_off():
            plan = plan_generation(request, loader, check_model)
    except (GenerationError, ReferenceDataError) as exc:
        raise DPLangError(one_line(exc)) from None
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted while reading the data or loading {what}: nothing "
                          "was charged or written") from None
    if compiles:  # recorded after the load (whose check ran the kernels), not at the run's end
        # (a folder only its owner may search: records.write_json)
        record_compiled()
    display.info(plan_line(plan))
    display.info(plan.reference_usage())
    if str(request.prompt).lower() == "generic" and request.describe is None:
        display.warning(BARE_PROMPT_WARNING)
    if dry_run:
        for line in dry_run_lines(plan):
            display.info(line)
        return GenerationRun(plan, RunSummary(0, 0, len(plan.jobs), plan.guarantee, 0.0, 0),
                             dry_run=True)
    state = _RunState(plan, keep)
    population = plan.method.spec.run_population is not None

    def on_charge(charge: Charge) -> None:
        state.charge = charge

    def on_release(release: Release) -> None:
        state.release = release

    def on_start(total: int, done: int) -> None:
        state.total, state.done_before, state.started = total, done, True
        display.start(total, done, population=population, max_tokens=request.max_tokens)
        if done:
            display.info(f"resuming: {done} of {total} generations already in {request.out}")

    def on_result(record: dict[str, Any]) -> None:
        state.written += 1
        display.result(record)

    try:
        summary = execute_plan(
            plan, on_result=on_result, on_step=display.step, on_start=on_start,
            on_warning=display.warning, on_charge=on_charge, on_release=on_release,
            executor=make_executor(execution.executor, execution.workers,
                                   ray_address=execution.ray_address,
                                   stall_timeout_s=execution.worker_timeout))
    except BudgetExceeded as exc:
        raise DPLangError(str(exc), BUDGET) from None
    except (GenerationError, ReleaseError, LedgerError, ExecutorError) as exc:
        raise DPLangError(one_line(exc)) from None
    except KeyboardInterrupt:
        raise Interrupted(state.interrupted()) from None
    finally:
        display.finish()
    return GenerationRun(plan, summary)


# ---------------------------------------------------------------------------------------------
# The Python API


@dataclass(frozen=True)
class GenerationResult:
    """What :func:`generate` released: the texts in group order (with their labels when the
    run was grouped), the guarantee they satisfy, and the public manifest.

    ``records`` are the output file's records (text, labels, tokens, reference row positions,
    Top-k+ statistics); ``out`` the output file, or None when nothing was kept."""

    texts: list[str]
    labels: list[dict[str, str]]
    guarantee: Guarantee
    manifest: dict[str, Any]
    records: list[dict[str, Any]] = field(repr=False)
    out: Path | None = None

    def __len__(self) -> int:
        return len(self.texts)

    def __repr__(self) -> str:
        return (f"GenerationResult({len(self.texts)} texts, {short_guarantee(self.guarantee)}"
                + (f", out={str(self.out)!r}" if self.out else "") + ")")

    def to_pandas(self) -> pd.DataFrame:
        """One row per text: ``text``, one column per label, ``num_tokens``, ``stopped`` and
        ``group`` (pandas is a dependency of dplang)."""
        import pandas as pd

        label_names = list(dict.fromkeys(k for labels in self.labels for k in labels))
        rows = [{"text": r["text"], **{k: r.get("labels", {}).get(k) for k in label_names},
                 "num_tokens": r.get("num_tokens"), "stopped": r.get("stopped"),
                 "group": r.get("group")} for r in self.records]
        return pd.DataFrame(rows, columns=["text", *label_names, "num_tokens", "stopped",
                                           "group"])


def _read_output(out: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()
               if line.strip()]
    records.sort(key=lambda r: int(r["group"]))
    manifest = json.loads(OutputPaths.of(out).manifest.read_text(encoding="utf-8"))
    return records, manifest


def _model_spec(model: Any, dtype: str) -> tuple[str, str, Callable[[str], Any] | None]:
    """(spec, dtype, loader) for ``model``: a spec string (``"default"``, a folder, a GGUF
    file), or an already loaded model (its own dtype; not reloaded)."""
    from ..models.dtypes import DTYPES

    if isinstance(model, (str, Path)):
        return str(model), dtype, None
    if not hasattr(model, "model_id") or not hasattr(model, "render_prompt"):
        raise DPLangError("model must be 'default', a path (a Hugging Face folder or a GGUF "
                          "file) or a model from dplang.models.resolve_model, not a "
                          f"{type(model).__name__}")
    _require_checked(model)
    own = str(getattr(model, "dtype", "float32")).replace("torch.", "")
    return str(model.model_id), own if own in DTYPES else dtype, lambda _spec: model


def _check_method_options(method: str, options: dict[str, Any]) -> None:
    """Every extra keyword must be an option of ``method`` (``sigma=`` for amin); an unknown
    one is a typo of a keyword or an option of another method, and is refused by name."""
    import inspect

    from ..textgen.methods.registry import all_methods, get_method

    try:
        spec = get_method(method)
    except (KeyError, ValueError):
        return  # the unknown method is refused with its own message
    own = [opt.name for opt in spec.options]
    for name in options:
        if name in own:
            continue
        others = [m.name for m in all_methods() if name in {o.name for o in m.options}]
        if others:
            raise DPLangError(f"generate(): {name}= is an option of method "
                              f"{' and '.join(others)}, not of method={method!r}")
        params = [p for p in inspect.signature(generate).parameters if p != "method_options"]
        raise unknown_keyword("generate", name, [*params, *own])


def _require_checked(model: Any) -> None:
    """A model passed in runs a release only if it passed the row-invariance check for its
    configuration as it is now: a backend that can run the check runs it here (its record
    when on file), before anything is read or charged; any other model must say it passed
    (``row_invariance_checked()``), else the call is refused with the command line's
    message (a configuration that is not row-invariant, exit code 2)."""
    from ..models.errors import RowInvarianceError
    from ..textgen.engine import require_row_invariance

    try:
        ensure = getattr(model, "ensure_row_invariance", None)
        if callable(ensure):
            ensure()
        require_row_invariance(model)
    except RowInvarianceError as exc:
        raise DPLangError(one_line(exc)) from None


@python_api
def generate(
    data: Any,
    *,
    epsilon: float | None = None,
    rho: float | None = None,
    clip: float | None = None,
    delta: float = 1e-6,
    model: Any = "default",
    method: str = "invisibleink",
    dataset: str | None = None,
    ledger: str | Path | None = None,
    out: str | Path | None = None,
    text_column: str = "text",
    group_by: str | Sequence[str] = (),
    batch_order: str = "grouped",
    batch_size: int | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_k: int = 50,
    num: int | None = None,
    seed: int | None = None,
    prompt: str | Path = "generic",
    system: str | None = None,
    describe: str | None = None,
    adjacency: str = "replace-by-null",
    max_reference_tokens: int | None = None,
    dense: bool = False,
    special_tokens: bool = False,
    dtype: str = "bfloat16",
    device: str = "cpu",
    executor: str = "inline",
    workers: int = 1,
    concurrent_groups: int | None = None,
    overwrite: bool = False,
    quiet: bool = False,
    **method_options: Any,
) -> GenerationResult:
    """Private synthetic texts from ``data`` in one call: ``dplang generate`` as a function.

    ``data``: a list of texts, a pandas DataFrame (``text_column``), a ``datasets.Dataset``,
    or a path (a data file, or a dataset saved with ``save_to_disk``). ``epsilon`` (with
    ``delta``), ``rho`` or ``clip``: exactly one. ``model``: ``"default"`` (Gemma 3 270M), a
    path, or a model already loaded with :func:`dplang.models.resolve_model` (not reloaded).
    ``method``: ``invisibleink`` (default), ``amin``, ``adapmixed`` or ``augpe``; the method's
    own options as keywords (``generate(..., method="amin", sigma=0.3)``). The other
    parameters are the command's flags (``docs/generation.md``; defaults B = 7, T = 64,
    τ = 1.2, k = 50).

    With ``out=`` the call writes exactly what ``dplang generate --out`` writes (the JSONL,
    the public manifest, the private side file with the seed) and resumes a run that ``out``
    holds; without it nothing is written but the ledger entry (the run's files live in a
    private temporary folder for the call).

    Privacy contract: the returned texts satisfy ``result.guarantee`` (ρ-zCDP, hence
    (ε, δ)-DP, with respect to replacing one reference by the empty one), charged to the
    privacy ledger (``ledger``, default ``$DPLANG_LEDGER``) under ``dataset`` — the data
    file's resolved path by default, **required** for data in memory — before the first
    computation on the references; a run the dataset's budget cannot take is refused before
    anything is read or loaded. The seed is fresh OS entropy unless given (a given seed must
    stay secret), kept only in the private side file. Refusals raise :class:`DPLangError`
    with the command line's message (``code`` 2, or 3 for the budget), nothing charged;
    Ctrl-C raises :class:`Interrupted` saying what was kept and charged. ``quiet=True``
    shows nothing (dplang's privacy warnings still go out as ``DPLangWarning``)."""
    _check_method_options(method, method_options)
    # the command line's types (3 and 3.0 would be two releases: the fingerprint is JSON)
    epsilon, rho, clip = (None if v is None else float(v) for v in (epsilon, rho, clip))
    delta = float(delta)
    groups = (group_by,) if isinstance(group_by, str) else tuple(group_by)
    groups = tuple(g.strip() for c in groups for g in c.split(",") if g.strip())
    spec, dtype, loader = _model_spec(model, dtype)
    if loader is not None and executor != "inline":
        raise DPLangError(f"executor={executor!r} loads the model in each worker: give model "
                          "as 'default' or a path, not a loaded model")
    display: Display = Display() if quiet else TqdmDisplay()
    with (quiet_libraries(quiet),
          data_input(data, dataset=dataset, text_column=text_column) as source,
          output_location(out, "generations.jsonl") as (out_path, keep)):
        request = GenerationRequest(
            data=source.path, out=out_path,
            batch_size=DEFAULT_BATCH_SIZE if batch_size is None else batch_size,
            max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
            temperature=DEFAULT_TEMPERATURE if temperature is None else float(temperature),
            top_k=top_k, epsilon=epsilon, delta=delta, rho=rho, clip=clip,
            adjacency=adjacency, num=num, seed=seed,
            concurrent_groups=(DEFAULT_CONCURRENT_GROUPS if concurrent_groups is None
                               else concurrent_groups),
            prompt=str(prompt), system=system, describe=describe, text_column=text_column,
            group_by=groups,
            model=spec,
            max_reference_tokens=(DEFAULT_MAX_REFERENCE_TOKENS if max_reference_tokens is None
                                  else max_reference_tokens),
            sparse_head=not dense, special_tokens=special_tokens, ledger=ledger,
            dataset=source.dataset, method=method,
            method_options=method_options, dtype=dtype, overwrite=overwrite,
            batch_order=batch_order)
        run = run_generation(request, display=display,
                             execution=Execution(executor, workers, device=device),
                             load_model=loader, check_model=None if loader else _check_model,
                             keep=keep)
        records, manifest = _read_output(out_path)
    return GenerationResult(
        texts=[r["text"] for r in records], labels=[dict(r.get("labels") or {}) for r in records],
        guarantee=run.plan.guarantee, manifest=manifest, records=records,
        out=out_path if keep else None)

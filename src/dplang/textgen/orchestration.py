"""A whole private generation run: data → batches → prompts → engine → JSONL + manifest.

``plan_generation`` validates everything (hyperparameters, data, prompt template, model) and
writes nothing; ``execute_plan`` goes through the release pipeline (:mod:`dplang.release`):
it charges the privacy ledger, writes the private side file ``OUT.private.json`` (mode 600,
in the mode-700 folder ``.dplang-private`` beside the output: seed, data path and digest,
dataset name, read counts) and the public manifest
``OUT.manifest.json`` (parameters, guarantee, model: nothing computed from the private rows),
and appends each finished generation to the output at once (flushed and fsynced), so a crash
or Ctrl-C loses no finished generation. Rerunning the same command continues after the
finished groups; each group's text depends only on (seed, group index), so the result equals
an uninterrupted run's. A release is identified by its public fingerprint, dataset name, data
digest and seed: a rerun with the outputs moved away draws a new seed and is a new charge.

Privacy contract: the released texts, as a whole, satisfy ρ-zCDP with
ρ = T·C²/(2B²τ²) (×4 under zero-out) with respect to replacing one reference by the empty one:
each generation reads one disjoint, data-independently formed batch (parallel composition), and
each is charged for T tokens whatever it emits. The random seed is a secret: an adversary who
knows it can invert the sampler, so it is kept in the private side file (``OUT.private.json``,
mode 600 from creation), never in the manifest.

Size: one run's sequence (check → plan → release → dispatch → persist) kept in one place so that
the order of charge and writes can be read top to bottom; methods, resume rules, executors and
the release pipeline live in their own modules.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..io import (
    ReadStats,
    ReferenceDataError,
    data_path_problem,
    file_digest,
    load_references,
)
from ..models.base import LogitsModel, PromptModel, public_model_name, reference_prefix
from ..models.dtypes import DTYPES
from ..privacy.accounting import (
    BudgetLimitError,
    check_budget_limit,
    check_epsilon_limit,
)
from ..privacy.guarantees import Adjacency, Guarantee
from ..privacy.ledger import BudgetExceeded, LedgerError, check_ledger_path
from ..release import (
    Charge,
    OutputPaths,
    Release,
    ReleaseError,
    RunLock,
    check_output_path,
    dataset_name,
    is_temporary_output,
    output_label,
    write_json,
)
from .batching import BATCH_ORDERS, Batch, make_batches
from .engine import DecodingParams, GroupJob, GroupResult, StepPolicy
from .errors import GenerationError
from .executors import Executor, dispatch_plan, executor_session, plan_recipe
from .methods.registry import MethodInputs, MethodParams, MethodSpec, get_method
from .prompts import (
    BUILTIN_TEMPLATES,
    PromptTemplate,
    get_template,
)
from .request import GenerationRequest
from .resume import Existing, check_existing, is_opening, truncate_to_finished_groups

# Which methods exist, their adjacencies, budget forms and options: the method registry
# (dplang.textgen.methods). No method offers add-remove at the data-set level: removing a row
# shifts every later reference into another batch (and changes ⌊N/B⌋), so a per-batch
# add-remove bound says nothing about the data set (docs/deviations.md).


@dataclass
class GenerationPlan:
    """A validated run: what will be generated, from which batches, at what guarantee."""

    request: GenerationRequest
    #: The driver's model: the whole model (inline), or only its prompt side (tokenizer,
    #: chat template, identity; no weights) when workers decode (docs/scaling.md).
    model: PromptModel
    template: PromptTemplate
    batches: list[Batch]
    read_stats: ReadStats
    data_digest: str
    guarantee: Guarantee
    params: DecodingParams
    #: One step policy per group (token methods, with a whole model); None for a population
    #: method or a prompt-side driver (its workers build their own from the request).
    make_policy: Callable[[GroupJob], StepPolicy] | None
    method: CalibratedMethod
    dataset: str = ""
    truncated_references: int = 0
    jobs: list[GroupJob] = field(default_factory=list)

    @property
    def paths(self) -> OutputPaths:
        """The output, its public manifest, its private side file and its lock."""
        return OutputPaths.of(self.request.out)

    @property
    def manifest_path(self) -> Path:
        return self.paths.manifest

    @property
    def references_used(self) -> int:
        """n·B: the references the batches hold (each used by exactly one generation)."""
        return len(self.batches) * self.request.batch_size

    def reference_usage(self) -> str:
        """One line for the data holder: how many references the run uses, how many of those
        read it leaves unused (N − n·B) and why (the batching rule; docs/generation.md).

        The numbers are row counts, which replace-by-null neighbours share; the line is still
        printed to the terminal only, never written into a public file."""
        return self._usage() + self._unusable()

    def _unusable(self) -> str:
        """The rows whose text cannot be used (blank, missing, not a string), by reason: they
        are empty references, whose generations see only the public prompt."""
        skipped = {k: v for k, v in self.read_stats.skipped_by_reason.items() if v}
        if not skipped:
            return ""
        total = sum(skipped.values())
        reasons = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in skipped.items())
        rows = "row has" if total == 1 else "rows have"
        return (f"; {total} {rows} no usable text ({reasons}) and count as empty references "
                "(the public prompt alone; check --text-column)")

    def _usage(self) -> str:
        req, n, used = self.request, len(self.batches), self.references_used
        read = self.read_stats.rows_seen
        head = f"{n} generations × B = {req.batch_size} use {used} references"
        if req.num is not None and not req.group_by:
            return (f"{head}: the first {used} rows of {req.data.name} (--num {req.num}); "
                    "later rows are not read")
        unused = read - used
        if unused == 0:
            return f"{head}: all {read} rows of {req.data.name}"
        if req.group_by:
            why = (f"within each group of {'/'.join(req.group_by)} the rows after the last full "
                   f"batch of {req.batch_size} are left out"
                   + (f", and batches after the first {req.num}" if req.num is not None else ""))
        else:
            rows = "row does" if unused == 1 else "rows do"
            why = (f"batches are consecutive chunks of exactly B = {req.batch_size} rows, so the "
                   f"last N mod B = {unused} {rows} not fill one")
        return f"{head} of the N = {read} rows; {unused} left unused ({why})"

    @property
    def private_path(self) -> Path:
        return self.paths.private


#: The most positions (prompt and generated tokens) a row may have
#: (:data:`dplang.models.attention.MAX_POSITIONS`, without importing the models here).
MAX_TOKENS_LIMIT = 2**20
#: Tokens a rendered private prompt may have beyond its template and reference (the pieces
#: may tokenise differently where they join; a chat template adds a few).
_JOIN_MARGIN = 8


def _finite_positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def _validate(req: GenerationRequest) -> None:
    """Every parameter of the request, alone and together (no file is read)."""
    given = [n for n, v in (("--epsilon", req.epsilon), ("--rho", req.rho), ("--clip", req.clip))
             if v is not None]
    spec = _method(req)
    if not spec.takes_budget:  # not private at all (the nonprivate ceiling): no budget
        if given:
            raise GenerationError(f"--method {spec.name} is not private and takes no "
                                  f"privacy budget; leave out {', '.join(given)}")
    elif len(given) != 1:
        raise GenerationError("give exactly one of --epsilon, --rho or --clip"
                              + (f" (got {', '.join(given)})" if given else ""))
    if not 0 < req.delta < 1:
        raise GenerationError(f"--delta must be in (0, 1), got {req.delta}")
    try:
        check_budget_limit(req.epsilon, name="--epsilon")
        check_budget_limit(req.rho, name="--rho", kind="rho", delta=req.delta)
    except BudgetLimitError as exc:
        raise GenerationError(str(exc)) from None
    if req.clip is not None and not _finite_positive(req.clip):
        raise GenerationError(f"--clip must be finite and > 0, got {req.clip}")
    checks = [
        (req.batch_size >= 1, f"--batch-size must be >= 1, got {req.batch_size}"),
        (req.max_tokens >= 1, f"--max-tokens must be >= 1, got {req.max_tokens}"),
        (req.max_tokens <= MAX_TOKENS_LIMIT,
         f"--max-tokens must be at most {MAX_TOKENS_LIMIT:,} (the most positions a row of "
         f"the exact decoder holds), got {req.max_tokens:,}"),
        (req.max_reference_tokens <= MAX_TOKENS_LIMIT,
         f"--max-reference-tokens must be at most {MAX_TOKENS_LIMIT:,}, got "
         f"{req.max_reference_tokens:,}"),
        (_finite_positive(req.temperature),
         f"--temperature must be finite and > 0, got {req.temperature}"),
        (req.top_k >= 0, f"--top-k must be >= 0 (0 = full vocabulary), got {req.top_k}"),
        (req.num is None or req.num >= 1, f"--num must be >= 1, got {req.num}"),
        (req.seed is None or req.seed >= 0, f"--seed must be >= 0, got {req.seed}"),
        (req.coupling is None or req.seed is not None, "coupled streams need a seed"),
        (req.concurrent_groups >= 1,
         f"--concurrent-groups must be >= 1, got {req.concurrent_groups}"),
        (req.max_reference_tokens >= 1,
         f"--max-reference-tokens must be >= 1, got {req.max_reference_tokens}"),
        (req.dtype in DTYPES, f"--dtype must be one of {', '.join(DTYPES)}; got {req.dtype!r}"),
        (req.batch_order in BATCH_ORDERS,
         f"--batch-order must be one of {', '.join(BATCH_ORDERS)}; got {req.batch_order!r}"),
        (req.out.suffix == ".jsonl", f"--out must end in .jsonl, got {req.out}"),
    ]
    for ok, message in checks:
        if not ok:
            raise GenerationError(message)
    if req.adjacency not in spec.adjacencies:
        raise GenerationError(f"--adjacency for {spec.name} must be one of "
                              f"{', '.join(spec.adjacencies)}, got {req.adjacency}")
    form = given[0].removeprefix("--") if given else None
    if form is not None and form not in spec.budget_forms:
        raise GenerationError(
            f"--method {spec.name} needs --epsilon (its accounting is calibrated from ε)"
            if spec.budget_forms == ("epsilon",) else
            f"--method {spec.name} takes {' or '.join('--' + f for f in spec.budget_forms)}")
    _options(req, spec)


def _method(req: GenerationRequest) -> MethodSpec:
    try:
        return get_method(req.method)
    except ValueError as exc:
        raise GenerationError(str(exc)) from None


def _options(req: GenerationRequest, spec: MethodSpec) -> dict[str, Any]:
    """The method's options, given ones checked and the rest defaulted."""
    try:
        return spec.resolve_options(req.method_options)
    except ValueError as exc:
        raise GenerationError(str(exc)) from None


@dataclass(frozen=True)
class CalibratedMethod:
    """A request's method, calibrated: its spec, options and params (guarantee and clip)."""

    spec: MethodSpec
    options: dict[str, Any]
    params: MethodParams

    @property
    def guarantee(self) -> Guarantee:
        return self.params.guarantee()

    @property
    def clip(self) -> float:
        return float(self.params.clip)

    def policy_factory(self, vocab_size: int) -> Callable[[GroupJob], StepPolicy] | None:
        if self.spec.run_population is not None:
            return None
        return self.params.policy_factory(vocab_size)  # type: ignore[attr-defined]


def _calibrate(req: GenerationRequest) -> CalibratedMethod:
    """The request's method calibrated to its budget (nothing read, nothing loaded).

    A guarantee whose ε is above :data:`~dplang.privacy.accounting.MAX_EPSILON` (a huge
    ``--clip``) is refused like a huge ``--epsilon``."""
    spec = _method(req)
    options = _options(req, spec)
    inputs = MethodInputs(req.epsilon, req.delta, req.rho, req.clip, req.batch_size,
                          req.max_tokens, req.temperature, req.top_k, Adjacency(req.adjacency))
    try:
        made = CalibratedMethod(spec, options, spec.calibrate(inputs, options))
        epsilon = made.guarantee.epsilon
    except (OverflowError, ZeroDivisionError, ValueError) as exc:
        if isinstance(exc, GenerationError):
            raise
        if req.clip is None:
            message = str(exc).splitlines()[0]
            raise GenerationError(message if req.method == "invisibleink"
                                  else f"{req.method}: {message}") from None
        epsilon = math.inf  # a clip norm so large that its ρ overflows
    if req.clip is not None:
        try:
            check_epsilon_limit(epsilon, f"--clip {req.clip:g}", req.delta)
        except BudgetLimitError as exc:
            raise GenerationError(str(exc)) from None
    return made


def check_request(
    req: GenerationRequest, check_model: Callable[[str], None] | None = None
) -> tuple[Guarantee, float, Callable[[int], Callable[[GroupJob], StepPolicy]]]:
    """Everything about a request that can be checked without reading the data or loading the
    model: the parameters, the budget (and its limit), the prompt template and its labels,
    the data path, the output path (its folder can be created), the ledger (an SQLite dplang
    ledger, or creatable; or a reachable PostgreSQL ledger) and, with ``check_model``, the
    model spec. Milliseconds (plus a connection for a PostgreSQL ledger); creates nothing.
    Returns the calibrated method; raises :class:`GenerationError`."""
    _validate(req)
    made = _calibrate(req)
    problem = data_path_problem(req.data)  # a file, or a saved Hugging Face dataset folder
    if problem is not None:
        raise GenerationError(problem if problem.startswith("data file not found")
                              else f"--data {problem}")
    try:
        dataset_name(req.data, req.dataset)
        check_output_path(req.out)
        check_ledger_path(req.ledger)
    except (ReleaseError, LedgerError) as exc:
        raise GenerationError(str(exc)) from None
    try:  # the model decides the form later; the labels are the same in both forms
        template = get_template(req.prompt, chat=False, description=req.describe)
        template.check_labels(list(req.group_by))
    except (ValueError, OSError) as exc:
        raise GenerationError(f"--prompt: {exc}") from None
    if check_model is not None:
        try:
            check_model(req.model)
        except ValueError as exc:
            raise GenerationError(str(exc).splitlines()[0]) from None
    return made


def plan_generation(
    req: GenerationRequest, load_model: Callable[[str], PromptModel],
    check_model: Callable[[str], None] | None = None,
) -> GenerationPlan:
    """Validate the request (:func:`check_request`), read the data, form the batches, check
    what ``--out`` already holds, and only then load the model.

    ``load_model(spec)`` may return the whole model or, for a run whose workers decode
    (``--executor local``/``ray``), only its prompt side
    (:func:`~dplang.models.default.resolve_prompt_side`): the prompts, the fingerprint and the
    release are the same either way.

    Writes nothing. Raises :class:`GenerationError` (or ``ReferenceDataError``) with a
    one-line message on bad input, a model that fails to load included."""
    method = check_request(req, check_model)
    dataset = dataset_name(req.data, req.dataset)
    limit = None if req.num is None or req.group_by else req.num * req.batch_size
    records, stats = load_references(req.data, req.text_column, req.group_by, limit=limit)
    try:
        batches = make_batches(records, req.batch_size, req.num, req.group_by,
                               order=req.batch_order)
    except ValueError as exc:
        raise GenerationError(str(exc)) from exc
    digest = file_digest(req.data)
    # a different run in --out is refused before the (slow) model load; the model's own
    # identity (weights digest, prompt form) is compared again once it is loaded
    check_existing(req, _public_parameters(req, method),
                    _private_identity(req, digest, dataset))
    model = _load(load_model, req.model)
    template = get_template(req.prompt, chat=model.has_chat_template, description=req.describe)
    _check_context(req, model, template, batches)
    if req.system is not None and not model.has_chat_template:
        raise GenerationError(f"--system sets a chat model's system prompt; {req.model} has no "
                              "chat template (a base model: it continues text), so it would be "
                              "ignored: leave --system out, or write the instruction into the "
                              "prompt (--prompt FILE.toml)")
    if req.system is not None:
        template = PromptTemplate(template.name, template.private_text, template.public_text,
                                  req.system, template.form, template.label_normaliser)
    params = DecodingParams(method.clip, req.batch_size, req.temperature, req.top_k,
                            req.max_tokens, req.sparse_head)
    vocab = getattr(model, "vocab_size", None)
    guarantee = method.guarantee
    if req.public_seed or req.coupling is not None:  # a toy run: its seed voids the guarantee
        guarantee = guarantee.as_toy()
    plan = GenerationPlan(req, model, template, batches, stats, digest, guarantee,
                          params, method.policy_factory(vocab) if vocab is not None else None,
                          method, dataset=dataset)
    plan.jobs = [_job(plan, b) for b in batches]
    return plan


def _check_context(req: GenerationRequest, model: PromptModel, template: PromptTemplate,
                   batches: Sequence[Batch]) -> None:
    """Refuse a run whose longest possible row does not fit the model's context window: the
    template's tokens, ``--max-reference-tokens`` and ``-T``. A bound from public values only
    (the template, the labels, the limits), never from the references' lengths."""
    context = getattr(model, "context_length", None)
    if not context:
        return
    longest_template = 0
    for labels in {tuple(sorted(b.labels.items())) for b in batches} or {()}:
        empty = model.render_prompt(template.render("x", dict(labels)), template.system)
        longest_template = max(longest_template, model.count_tokens(empty))
    longest = longest_template + req.max_reference_tokens + _JOIN_MARGIN + req.max_tokens
    if longest > context:
        raise GenerationError(
            f"--max-tokens {req.max_tokens} after prompts of up to "
            f"{longest_template + req.max_reference_tokens + _JOIN_MARGIN} tokens (the template "
            f"and --max-reference-tokens {req.max_reference_tokens}) needs {longest} positions; "
            f"{req.model} has a context of {context}: lower --max-tokens or "
            "--max-reference-tokens")


def _load(load_model: Callable[[str], PromptModel], spec: str) -> PromptModel:
    """Load the model; any failure (a folder transformers cannot read, an unsupported
    architecture, a configuration that cannot be made row-invariant) is a one-line
    :class:`GenerationError`: nothing has been charged or written yet."""
    try:
        return load_model(spec)
    except GenerationError:
        raise
    except Exception as exc:  # third-party loaders raise anything
        from ..models.errors import load_failure_message

        raise GenerationError(load_failure_message("--model", spec, exc)) from None


def _job(plan: GenerationPlan, batch: Batch) -> GroupJob:
    model, template = plan.model, plan.template
    limit = plan.request.max_reference_tokens
    labels = batch.labels
    public = model.render_prompt(template.render(None, labels), template.system)
    private = []
    for ref in batch.references:
        if ref:
            ref, cut = reference_prefix(model, ref, limit)
            plan.truncated_references += int(cut)
        private.append(model.render_prompt(template.render(ref, labels), template.system))
    return GroupJob(batch.index, public, tuple(private), _shared_prefix(plan, labels, public))


_SENTINEL = "\x00dplang-reference\x00"


def _shared_prefix(plan: GenerationPlan, labels: dict[str, str], public: str) -> str:
    """The rendered text every prompt of a group starts with: the private form up to the
    reference, as far as the public prompt agrees with it. A function of the template, the
    labels and the model's chat template only (public)."""
    model, template = plan.model, plan.template
    rendered = model.render_prompt(template.render(_SENTINEL, labels), template.system)
    cut = rendered.find(_SENTINEL)
    if cut < 0:
        return ""
    head = rendered[:cut]
    length = 0
    for a, b in zip(head, public, strict=False):
        if a != b:
            break
        length += 1
    return head[:length]


#: Request fields that are not part of the public fingerprint: the seed (secret), paths and
#: the dataset name (private side file), concurrency (does not change the output) and
#: ``overwrite`` (what to do with an earlier run, not what this run is).
_NOT_FINGERPRINTED = ("seed", "ledger", "out", "concurrent_groups", "data", "dataset",
                      "overwrite", "public_seed", "coupling", "opened", "data_source",
                      "data_source_digest", "continue_release")


def _public_parameters(req: GenerationRequest, method: CalibratedMethod) -> dict[str, Any]:
    """The request's public parameters as the manifest records them (no model needed): the
    method's options with their defaults filled in."""
    params = {k: v for k, v in asdict(req).items() if k not in _NOT_FINGERPRINTED}
    params["group_by"] = list(req.group_by)
    if req.batch_order == "grouped":  # the default: runs of older versions keep their identity
        del params["batch_order"]
    if req.describe is None:  # likewise
        del params["describe"]
    else:
        params["describe"] = " ".join(req.describe.split())
    if not req.special_tokens:  # likewise
        del params["special_tokens"]
    params["adjacency"] = str(req.adjacency)
    # a model by its name only: its folders are a path (the private side file has it); its
    # digests (the fingerprint's model_sha256, model_files_sha256) identify it
    params["model"] = public_model_name(req.model)
    params["method_options"] = dict(method.options)
    if str(req.prompt).lower() not in BUILTIN_TEMPLATES:
        # A template file by its name only: its folder is a path (private side file, like the
        # data's); what determines the output, its texts, is in the fingerprint's "prompt".
        params["prompt"] = Path(req.prompt).name
    params["clip"] = method.clip
    return params


def _fingerprint(plan: GenerationPlan) -> dict[str, Any]:
    """Everything public that determines the output (goes into the public manifest).

    Privacy contract: a function of the request's public parameters, the model and the prompt
    only: no data path, no digest, no count of the private rows."""
    return {
        "parameters": _public_parameters(plan.request, plan.method),
        "model_id": plan.model.model_id,
        "model_sha256": plan.model.weights_digest(),
        # the configuration, tokenizer and chat template change the texts as the weights do
        "model_files_sha256": (plan.model.support_digest()
                               if hasattr(plan.model, "support_digest") else None),
        "model_dtype": str(getattr(plan.model, "dtype", "float32")).replace("torch.", ""),
        "prompt": {"name": plan.template.name, "form": plan.template.form,
                   "private": plan.template.private_text, "public": plan.template.public_text,
                   "system": plan.template.system},
        "num_generations": len(plan.batches),
        # Same seed, same parameters but other libraries, CPU or threads may round otherwise:
        # another output, so another release (a new charge).
        "numerics": getattr(plan.model, "numerics", None),
    }


def _private_identity(req: GenerationRequest, digest: str, dataset: str) -> dict[str, Any]:
    """What a resumed run must share with the first one besides the public fingerprint."""
    return {"path": str(req.data), "sha256": digest, "dataset": dataset}


def _private_fingerprint(plan: GenerationPlan) -> dict[str, Any]:
    return _private_identity(plan.request, plan.data_digest, plan.dataset)


@dataclass
class RunSummary:
    written: int
    skipped_existing: int
    total: int
    guarantee: Guarantee
    elapsed_s: float
    tokens: int


def _existing(plan: GenerationPlan, fingerprint: dict[str, Any]) -> Existing:
    """:func:`~dplang.textgen.resume.check_existing` with the loaded model's whole
    fingerprint."""
    return check_existing(plan.request, fingerprint["parameters"],
                           _private_fingerprint(plan), fingerprint)


def execute_plan(
    plan: GenerationPlan,
    on_result: Callable[[dict[str, Any]], None] | None = None,
    on_step: Callable[[int], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
    executor: Executor | None = None,
    on_charge: Callable[[Charge], None] | None = None,
    on_release: Callable[[Release], None] | None = None,
) -> RunSummary:
    """Write the opening side file (the seed, before the charge: beside an earlier run's
    files for ``--overwrite``), charge the ledger, replace an earlier run's files, write the
    public manifest and the full side file, and generate every group not yet in the output.

    ``on_start(total, already_done)`` is called once before decoding; ``on_result(record)``
    after each generation is persisted; ``on_step(n)`` after each decode step;
    ``on_warning(message)`` with the ledger's warnings for the data holder (a dataset name
    whose content changed...), which must not be written to a public file; ``on_charge``
    with the ledger's answer as soon as the release is charged (so that an interrupted run
    can say what it cost); ``on_release`` with the release right before its charge (an
    interruption inside the charge can then ask the ledger whether it was recorded).

    Privacy contract: the texts written satisfy ``plan.guarantee``; the release (public
    fingerprint, dataset name, data digest, seed) is in the ledger before anything is written
    (charged once however often it is resumed; a new seed is a new charge); the manifest holds
    public inputs only and the seed, digest, counts and paths go to ``OUT.private.json``
    (mode 600 from creation). Raises ``BudgetExceeded`` when over budget (nothing left: the
    opening is removed, an earlier run's files stay).

    The whole of it runs under the run's lock (:class:`~dplang.release.RunLock`): a second
    process writing the same ``--out`` is refused with :class:`~dplang.release.RunLocked`.

    ``executor`` (default inline; :mod:`dplang.textgen.executors`) decodes the groups; this
    process stays the only writer, and the output is the same bytes whatever the executor.
    An executor's workers are started, and load and check the model (identity, row
    invariance), before the charge: a configuration they refuse raises
    :class:`~dplang.textgen.executors.ExecutorError` with nothing charged or written. With
    workers, ``plan.model`` may be the prompt side only (no weights); the seed stays here and
    workers receive per-group stream states."""
    with RunLock(plan.request.out):
        return _execute_locked(plan, on_result, on_step, on_start, on_warning, executor,
                               on_charge, on_release)


def _published_complete(paths: OutputPaths) -> bool:
    """Whether a run's output is published whole: the output exists, nothing grows in the
    private folder, and its manifest says complete."""
    if not paths.output.exists() or paths.partial.exists() or not paths.manifest.exists():
        return False
    try:
        return json.loads(paths.manifest.read_text(encoding="utf-8")).get("status") == "complete"
    except (OSError, ValueError, AttributeError):
        return False


def _execute_locked(
    plan: GenerationPlan,
    on_result: Callable[[dict[str, Any]], None] | None,
    on_step: Callable[[int], None] | None,
    on_start: Callable[[int, int], None] | None,
    on_warning: Callable[[str], None] | None,
    executor: Executor | None = None,
    on_charge: Callable[[Charge], None] | None = None,
    on_release: Callable[[Release], None] | None = None,
) -> RunSummary:
    req = plan.request
    fingerprint = _fingerprint(plan)
    resuming, stored_seed, kept_fingerprint = _existing(plan, fingerprint)
    # a resumed or continued run keeps its own fingerprint: equal up to how an older dplang
    # named things, and part of the ledger's release id
    fingerprint = kept_fingerprint or fingerprint
    seed = stored_seed if stored_seed is not None else req.seed
    release = Release.open(
        "generate", data=req.data, guarantee=plan.guarantee, fingerprint=fingerprint,
        dataset=plan.dataset, seed=seed, ledger=req.ledger, data_digest=plan.data_digest,
        description=f"dplang generate ({req.method}) → {output_label(req.out)}",
        seed_source="resumed from the private side file" if stored_seed is not None else None,
        coupling=req.coupling, data_source=req.data_source,
        data_source_digest=req.data_source_digest,
    )
    if req.opened is not None:
        release.opened = req.opened
    done = set() if req.overwrite else truncate_to_finished_groups(
        plan.paths.partial if plan.paths.partial.exists() else req.out)
    population = plan.method.spec.run_population
    restart = population is not None and 0 < len(done) < len(plan.jobs)
    if restart:  # a population method runs whole: the rerun makes every text again (with the
        done = set()  # same seed: the same texts), so the unfinished run's texts are dropped
    pending = [j for j in plan.jobs if j.index not in done]
    if population is not None and not isinstance(plan.model, LogitsModel):
        raise GenerationError(f"--method {req.method} runs in the driver and needs the whole "
                              "model; use --executor inline")
    recipe = (None if population is not None
              else plan_recipe(executor, plan,
                              # workers rebuild the policies from the calibrated public
                              # parameters alone: never the request (its seed, dataset name,
                              # data and output paths, ledger location)
                              functools.partial(params_policy_factory, plan.method.params)))
    # Workers (local, ray) load the model and run its load-time checks now, before the charge:
    # a configuration they refuse stops the run with nothing charged or written.
    keep_seed = not is_temporary_output(req.out)  # (see the side file below)
    with executor_session(executor, recipe, len(pending)):
        if plan.method.spec.prepare is not None and pending:
            plan.method.spec.prepare(plan.method.params)  # e.g. an embedder, before the charge
        side_file, made_folder = _open_side_file(plan, release, resuming, keep_seed)
        if on_release is not None:
            on_release(release)
        try:
            charge = release.charge(on_warning)  # before any output (invariant 6); idempotent
        except BudgetExceeded:  # nothing was charged: nothing is left either
            if side_file != "none":
                _remove_opening(plan.paths, made_folder, replacing=side_file == "replacing")
            raise
        if on_charge is not None:
            on_charge(charge)
        if side_file == "replacing":  # the earlier run's files go only now that the new run
            plan.paths.take_replacement()  # is charged; its seed, kept beside them, takes over
        elif req.overwrite and side_file == "none":  # (an API call's temporary output)
            plan.paths.remove()
        if restart:  # (see above) its unfinished texts, wherever an older dplang left them
            plan.paths.partial.unlink(missing_ok=True)
            req.out.unlink(missing_ok=True)
        if resuming:  # a run of an older dplang: its side file moves into the private folder
            plan.paths.adopt_legacy_private()
        if plan.read_stats.absent_columns and on_warning is not None:
            # JSONL has no schema: a column in no record is not refused (its neighbour with the
            # key in one record would not be); the data holder is told.
            absent = ", ".join(map(repr, plan.read_stats.absent_columns))
            on_warning(f"column(s) {absent} occur in no record of {req.data}: their values are "
                       "missing in every row (check --text-column / --group-by)")
        if plan.read_stats.used == 0 and on_warning is not None:
            # Not refused (a neighbour with one usable row would not be): the data holder is
            # told.
            on_warning(f"no row of {req.data} holds a usable reference: every generation is "
                       "the public prompt's (check --text-column)")
        if resuming and not pending and _published_complete(plan.paths):
            # nothing left to do: the published output and manifest stay as they are (a
            # rewrite would unpublish the output for a moment and give both new times)
            if on_start is not None:
                on_start(len(plan.jobs), len(plan.jobs))
            return RunSummary(0, len(done), len(plan.jobs), plan.guarantee, 0.0, 0)
        manifest = release.public_manifest(
            clip=plan.params.clip,
            adjacency=req.adjacency,
            concurrent_groups=req.concurrent_groups,
            status="running",
            # the release's opening time, as the files' times: a later clock reading would
            # publish how long reading and preparing the private data took
            started=release.opened,
        )
        del manifest["created"]
        batches = {b.index: b for b in plan.batches}
        start = time.time()
        written = 0
        tokens = 0

        def persist(res: GroupResult) -> None:
            nonlocal written, tokens
            record = _record(res, batches[res.index], req.method)
            log.write_line(json.dumps(record, ensure_ascii=False))
            written += 1
            tokens += res.num_tokens
            if on_result is not None:
                on_result(record)

        publishing = False
        try:  # from the first public file on, a stop leaves the manifest saying "interrupted"
            release.write_manifest(plan.paths, manifest)
            # after the manifest: a stop between the two leaves the opening record, from which
            # the same command resumes
            if side_file != "none" or not resuming:
                release.write_private(plan.paths, release.private_record(
                    # the seed is kept to resume; an API call's temporary output is never
                    # resumed, and a crash (kill -9) would leave its seed behind
                    keep_seed=keep_seed,
                    data={"read": {"rows_seen": plan.read_stats.rows_seen,
                                   "used": plan.read_stats.used,
                                   "unusable_by_reason": dict(plan.read_stats.skipped_by_reason),
                                   "unusable_rule": plan.read_stats.on_unusable},
                          "truncated_references": plan.truncated_references,
                          "references_used": plan.references_used},
                    output=str(req.out),
                    model=str(req.model),  # the path as given (public files name it only)
                ))
            if on_start is not None:
                on_start(len(plan.jobs), len(plan.jobs) - len(pending))
            with release.append_log(plan.paths) as log:
                if population is not None:
                    if pending:  # a population method: runs whole (no per-group resume)
                        _run_population(plan, population, release.stream_seed, on_step,
                                        persist, manifest)
                else:
                    assert recipe is not None
                    dispatch_plan(executor, plan, pending, release.stream_seed, recipe,
                                  persist, on_step)
            # the output appears now, whole, in group order (not the order the groups
            # finished in, which timing decides), with the release's start time as its
            # modification time; an interrupted run's stays in the private folder
            publishing = True
            release.publish(plan.paths, _canonical_lines(plan.paths.partial))
        finally:
            # complete once published: the partial file is gone only then (a stop right after
            # the publish still says "complete")
            status = ("complete" if publishing and not plan.paths.partial.exists()
                      else "interrupted")
            manifest["status"] = status
            # no "finished" time: with "started" it would publish how long the generation
            # on the private references took (a timing side channel;
            # release.TIMESTAMP_FIELDS); the file's own times are the start's too
            if status == "complete":  # an interrupted run's count would show how far
                # the computation got in the time it had (a timing side channel)
                manifest["generations_written"] = len(done) + written
            else:
                manifest.pop("generations_written", None)
            with contextlib.suppress(OSError):
                write_json(plan.manifest_path, manifest, times=release.opened)
        return RunSummary(written, len(done), len(plan.jobs), plan.guarantee,
                          time.time() - start, tokens)


#: What :func:`_open_side_file` left for the charge: no opening (an API call's temporary
#: output keeps no seed; a resumed run past its manifest), an opening in the side file's place
#: (written now, or left by a run stopped before its manifest, which this one continues), or
#: one beside an earlier run's files that an ``--overwrite`` replaces after the charge.
SideFile = Literal["none", "opened", "replacing"]


def _open_side_file(plan: GenerationPlan, release: Release, resuming: bool,
                    keep_seed: bool) -> tuple[SideFile, bool]:
    """Write the run's opening side file (its seed, before the charge) when it has none yet,
    and say what there is (:data:`SideFile`) and whether its private folder was made now. A
    stop inside the charge, or between it and the manifest, then keeps the seed of a release
    the ledger may hold: the same command continues it, charged once
    (``resume.check_existing``).

    Not written for an API call's temporary output (never resumed: no seed is kept). For
    ``--overwrite`` of an existing run, whose files stay until the new run is charged, it is
    written to :attr:`~dplang.release.OutputPaths.replacement`, which takes the side file's
    place right after the charge."""
    paths = plan.paths
    if resuming:
        return ("opened" if is_opening(paths.private) else "none"), False
    if not keep_seed:
        return "none", False
    made_folder = not paths.private.parent.exists()
    if plan.request.overwrite and paths.existing():
        release.write_opening(paths, release.opening_record(), replacing=True)
        return "replacing", made_folder
    release.write_opening(paths, release.opening_record())
    # a replacement left with nothing to replace (its files deleted by hand) goes: kept, it
    # would give every later --overwrite of its command the same seed
    paths.replacement.unlink(missing_ok=True)
    return "opened", made_folder


def _remove_opening(paths: OutputPaths, made_folder: bool, *, replacing: bool = False) -> None:
    """Remove the opening side file of a refused charge, and its private folder when this run
    made it and it is still empty: a refused run leaves nothing behind."""
    (paths.replacement if replacing else paths.private).unlink(missing_ok=True)
    if made_folder:
        with contextlib.suppress(OSError):
            paths.private.parent.rmdir()  # only when empty


def _canonical_lines(path: Path) -> str:
    """The finished output's lines ordered by group index: the published bytes are a
    function of the released texts alone."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    lines.sort(key=lambda line: int(json.loads(line)["group"]))
    return "".join(line + "\n" for line in lines)


def params_policy_factory(params: MethodParams, vocab: int
                          ) -> Callable[[GroupJob], StepPolicy]:
    """The per-group step policies of a token method from its calibrated parameters alone
    (what an executor's workers receive: public, picklable; no seed, no dataset name, no
    path)."""
    factory = params.policy_factory(vocab)  # type: ignore[attr-defined]
    if factory is None:  # pragma: no cover - population methods have no recipe
        raise GenerationError("a population method has no per-group step policy")
    return factory


def label_groups(batches: list[Batch]) -> list[tuple[dict[str, str], list[Batch]]]:
    """The batches by their (public) labels, groups in order of first appearance."""
    groups: dict[tuple[tuple[str, str], ...], list[Batch]] = {}
    for batch in batches:
        groups.setdefault(tuple(sorted(batch.labels.items())), []).append(batch)
    return [(dict(key), members) for key, members in groups.items()]


def population_seed(stream_seed: int, group: int, groups: int) -> int:
    """The secret seed of a population method's run over label group ``group`` of
    ``groups``: the release's stream seed itself for a single group (ungrouped runs), else a
    child of it, a pure function of (stream seed, group index) (docs/privacy.md invariant 5)."""
    if groups == 1:
        return stream_seed
    import numpy as np

    state = np.random.SeedSequence(stream_seed, spawn_key=(group,)).generate_state(2, np.uint64)
    return int(state[0]) << 64 | int(state[1])


def _run_population(plan: GenerationPlan, population: Any, stream_seed: int,
                    on_step: Callable[[int], None] | None, persist: Callable[[GroupResult], None],
                    manifest: dict[str, Any]) -> None:
    """A population method (Aug-PE) over the planned batches: one run per label group (one
    run in all without ``--group-by``), each over the references of that group's batches only,
    writing as many texts as the group has batches, each from the group's public prompt and
    recorded with the group's labels.

    Privacy contract: the groups are disjoint sets of batches formed from positions and public
    labels only, and each run reads only its own group's references, so one reference
    changes at most one run: the runs compose in parallel and the release keeps the method's
    guarantee (as InvisibleInk's groups do). Each run draws from its own child stream of the
    release's secret stream seed. Before this, a grouped run used every reference with the
    first group's prompt and labelled the texts with other groups' labels."""
    name = plan.method.spec.name
    groups = label_groups(plan.batches)
    per_group = []
    for g, (labels, members) in enumerate(groups):
        results, stats = population(
            plan.method.params, plan.model, [ref for b in members for ref in b.references],
            len(members), plan.template.render(None, labels), plan.template.system,
            population_seed(stream_seed, g, len(groups)), on_step)
        for res, batch in zip(results, members, strict=True):
            res.index = batch.index  # the group's i-th text belongs to its i-th batch
            persist(res)
        stats.pop("wall_clock_seconds", None)  # a duration: never public
        per_group.append(stats)
    # which statistics are DP outputs (docs/privacy.md, "Public and private files"): the rest
    # must be functions of public inputs
    released = plan.method.spec.released_statistics
    if len(groups) == 1:
        manifest[name] = per_group[0]
        manifest["released_statistics"] = [f"{name}.{key}" for key in released
                                           if key in per_group[0]]
    else:
        # keyed by the group's index as a string, so that a dotted path names each value
        manifest[name] = {"groups": {str(g): {"labels": labels, "texts": len(members), **stats}
                                     for g, ((labels, members), stats)
                                     in enumerate(zip(groups, per_group, strict=True))}}
        manifest["released_statistics"] = [f"{name}.groups.{g}.{key}"
                                           for g, stats in enumerate(per_group)
                                           for key in released if key in stats]


def _record(res: GroupResult, batch: Batch, method: str) -> dict[str, Any]:
    return {
        "group": res.index,
        "text": res.text,
        "num_tokens": res.num_tokens,
        "stopped": res.stopped,
        "reference_ids": list(batch.reference_ids),
        "labels": dict(batch.labels),
        **{k: v for k, v in res.stats.items() if k != "topk_plus_min"},
        "method": method,
        **({"token_ids": res.token_ids} if res.token_count is None else {}),
    }


__all__ = [
    "GenerationError",
    "GenerationPlan",
    "GenerationRequest",
    "ReferenceDataError",
    "RunSummary",
    "execute_plan",
    "plan_generation",
]

"""A whole private generation run: data → batches → prompts → engine → JSONL + manifest.

``plan_generation`` validates everything (hyperparameters, data, prompt template, model) and
writes nothing; ``execute_plan`` goes through the release pipeline (:mod:`dplang.release`):
it charges the privacy ledger, writes the private side file ``OUT.private.json`` (mode 600:
seed, data path and digest, dataset name, read counts) and the public manifest
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
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..io import ReadStats, ReferenceDataError, file_digest, load_references
from ..models.base import LogitsModel
from ..models.dtypes import DTYPES
from ..privacy.accounting import invisibleink_budget
from ..privacy.guarantees import Guarantee
from ..privacy.randomness import RandomStreams
from ..release import Release, ReleaseError, dataset_name, write_json
from . import adapmixed, amin, augpe
from .batching import Batch, make_batches
from .engine import DecodingParams, GroupJob, GroupResult, StepPolicy, run_groups
from .invisibleink import InvisibleInkPolicy
from .prompts import DEFAULT_MAX_REFERENCE_TOKENS, PromptTemplate, get_template

DEFAULT_CONCURRENT_GROUPS = 8
#: Per-token methods that run on the engine (Aug-PE is a population method: see augpe.py).
METHODS = ("invisibleink", "amin", "adapmixed", "augpe")
#: Adjacencies each method's *dataset-level* guarantee holds for. No method offers add-remove:
#: removing a row shifts every later reference into another batch (and changes ⌊N/B⌋), so a
#: per-batch add-remove bound says nothing about the data set (docs/deviations.md).
_ADJACENCY = {
    "augpe": ("replace-by-null",),
    "invisibleink": ("replace-by-null", "zero-out"),
    "amin": ("replace-by-null", "zero-out"),
    "adapmixed": ("replace-by-null",),
}


class GenerationError(ValueError):
    """A user error detected before anything was written (one-line message)."""


@dataclass(frozen=True)
class GenerationRequest:
    """Everything a ``dplang generate`` run needs (all of it public except the data)."""

    data: Path
    out: Path
    batch_size: int
    max_tokens: int
    temperature: float
    top_k: int
    epsilon: float | None = None
    delta: float = 1e-6
    rho: float | None = None
    clip: float | None = None
    adjacency: str = "replace-by-null"
    num: int | None = None
    seed: int | None = None
    concurrent_groups: int = DEFAULT_CONCURRENT_GROUPS
    prompt: str = "yelp"
    system: str | None = None
    text_column: str = "text"
    group_by: tuple[str, ...] = ()
    model: str = "default"
    max_reference_tokens: int = DEFAULT_MAX_REFERENCE_TOKENS
    sparse_head: bool = True
    #: Compute dtype of the model body (a TransformersModel option; logits stay float32).
    dtype: str = "float32"
    ledger: Path | None = None
    #: Ledger name of the dataset (default: the data file's resolved path).
    dataset: str | None = None
    method: str = "invisibleink"
    #: Amin et al. baseline (spec 002 §3.1): SVT noise σ and threshold θ, cap on private
    #: tokens, public temperature, sensitivity convention ("correct" or "paper").
    amin_sigma: float = 0.3
    amin_threshold: float = 0.7
    amin_private_tokens: int = 100
    amin_public_temperature: float = 1.0
    amin_convention: str = "correct"
    #: Aug-PE baseline (spec 002 §3.3): iterations T_PE and variations L per selected text.
    augpe_iterations: int = 3
    augpe_variations: int = 7


@dataclass
class GenerationPlan:
    """A validated run: what will be generated, from which batches, at what guarantee."""

    request: GenerationRequest
    model: LogitsModel
    template: PromptTemplate
    batches: list[Batch]
    read_stats: ReadStats
    data_digest: str
    guarantee: Guarantee
    params: DecodingParams
    make_policy: Callable[[GroupJob], StepPolicy]
    dataset: str = ""
    truncated_references: int = 0
    jobs: list[GroupJob] = field(default_factory=list)

    @property
    def manifest_path(self) -> Path:
        return manifest_path_for(self.request.out)

    @property
    def private_path(self) -> Path:
        return private_path_for(self.request.out)


def manifest_path_for(out: Path) -> Path:
    """``runs/x.jsonl`` → ``runs/x.manifest.json`` (public)."""
    stem = out.name.removesuffix(".jsonl")
    return out.with_name(stem + ".manifest.json")


def private_path_for(out: Path) -> Path:
    """``runs/x.jsonl`` → ``runs/x.private.json`` (private side file, mode 600)."""
    stem = out.name.removesuffix(".jsonl")
    return out.with_name(stem + ".private.json")


def _validate(req: GenerationRequest) -> None:
    given = [n for n, v in (("--epsilon", req.epsilon), ("--rho", req.rho), ("--clip", req.clip))
             if v is not None]
    if len(given) != 1:
        raise GenerationError("give exactly one of --epsilon, --rho or --clip")
    for name, value in (("--epsilon", req.epsilon), ("--rho", req.rho), ("--clip", req.clip)):
        if value is not None and not value > 0:
            raise GenerationError(f"{name} must be > 0, got {value}")
    checks = [
        (0 < req.delta < 1, f"--delta must be in (0, 1), got {req.delta}"),
        (req.batch_size >= 1, f"--batch-size must be >= 1, got {req.batch_size}"),
        (req.max_tokens >= 1, f"--max-tokens must be >= 1, got {req.max_tokens}"),
        (req.temperature > 0, f"--temperature must be > 0, got {req.temperature}"),
        (req.top_k >= 0, f"--top-k must be >= 0 (0 = full vocabulary), got {req.top_k}"),
        (req.num is None or req.num >= 1, f"--num must be >= 1, got {req.num}"),
        (req.seed is None or req.seed >= 0, f"--seed must be >= 0, got {req.seed}"),
        (req.concurrent_groups >= 1,
         f"--concurrent-groups must be >= 1, got {req.concurrent_groups}"),
        (req.max_reference_tokens >= 1,
         f"--max-reference-tokens must be >= 1, got {req.max_reference_tokens}"),
        (req.method in METHODS,
         f"--method must be one of {', '.join(METHODS)}, got {req.method}"),
        (req.dtype in DTYPES, f"--dtype must be one of {', '.join(DTYPES)}; got {req.dtype!r}"),
        (req.method not in _ADJACENCY or req.adjacency in _ADJACENCY[req.method],
         f"--adjacency for {req.method} must be one of "
         f"{', '.join(_ADJACENCY.get(req.method, ()))}, got {req.adjacency}"),
        (req.method == "invisibleink" or req.epsilon is not None,
         f"--method {req.method} needs --epsilon (its accounting is calibrated from ε)"),
        (req.out.suffix == ".jsonl", f"--out must end in .jsonl, got {req.out}"),
    ]
    for ok, message in checks:
        if not ok:
            raise GenerationError(message)


def _make_guarantee(
    req: GenerationRequest,
) -> tuple[Guarantee, float, Callable[[int], Callable[[GroupJob], StepPolicy]]]:
    """The run's guarantee, its clip norm (0 when the method has none) and a factory that,
    given the model's vocabulary size, makes one step policy per generation."""
    if req.method == "amin":
        try:
            budget = amin.calibrate(req.epsilon, req.delta, req.batch_size,  # type: ignore[arg-type]
                                    req.temperature, req.amin_sigma, req.amin_private_tokens,
                                    req.amin_convention)
        except amin.InfeasibleBudget as exc:
            raise GenerationError(str(exc)) from exc
        except ValueError as exc:
            raise GenerationError(f"amin: {exc}") from exc
        guarantee = budget.guarantee(req.delta, req.epsilon)

        def amin_factory(_vocab: int) -> Callable[[GroupJob], StepPolicy]:
            return lambda _job: amin.AminPolicy(
                budget, req.batch_size, req.temperature, req.amin_public_temperature,
                req.amin_threshold, req.amin_sigma)

        return guarantee, budget.clip, amin_factory
    if req.method == "augpe":
        try:
            prm0 = _augpe_params(req, num_texts=1)
        except ValueError as exc:
            raise GenerationError(f"augpe: {exc}") from exc
        return prm0.guarantee(), 0.0, lambda _vocab: (lambda _job: None)  # type: ignore[return-value]
    if req.method == "adapmixed":
        prm = adapmixed.AdaPMixEDParams(epsilon=req.epsilon,  # type: ignore[arg-type]
                                        delta=req.delta, temperature=req.temperature,
                                        adjacency=req.adjacency)

        def ada_factory(_vocab: int) -> Callable[[GroupJob], StepPolicy]:
            return lambda _job: adapmixed.AdaPMixEDPolicy(prm, req.batch_size)

        return prm.guarantee(), 0.0, ada_factory
    budget = invisibleink_budget(
        epsilon=req.epsilon, rho=req.rho, clip=req.clip, delta=req.delta,
        tokens=req.max_tokens, batch_size=req.batch_size, temperature=req.temperature,
        adjacency=req.adjacency,
    )
    clip = float(budget["clip"])
    guarantee = Guarantee(
        mechanism="invisibleink",
        unit="reference",
        adjacency=req.adjacency,
        rho=float(budget["rho"]),
        epsilon=float(budget["epsilon"]),
        delta=req.delta,
        details={"clip": clip, "batch_size": req.batch_size, "max_tokens": req.max_tokens,
                 "temperature": req.temperature, "top_k": req.top_k,
                 "composition": "parallel over disjoint batches formed in file order"},
    )

    def ink_factory(vocab: int) -> Callable[[GroupJob], StepPolicy]:
        return lambda _job: InvisibleInkPolicy(clip, req.batch_size, req.temperature,
                                               req.top_k, vocab)

    return guarantee, clip, ink_factory


def _augpe_params(req: GenerationRequest, num_texts: int) -> augpe.AugPEParams:
    return augpe.AugPEParams(
        epsilon=req.epsilon, num_texts=num_texts, delta=req.delta,  # type: ignore[arg-type]
        iterations=req.augpe_iterations, variations=req.augpe_variations,
        max_tokens=req.max_tokens, temperature=req.temperature, top_k=req.top_k,
        adjacency=req.adjacency,
    )


def _run_augpe(plan: GenerationPlan, seed: int, persist: Callable[[GroupResult], None],
               on_step: Callable[[int], None] | None) -> dict[str, Any]:
    """Aug-PE over all the references of the planned batches: one text per batch. The
    references are used only through the noisy nearest-neighbour histograms."""
    req = plan.request
    references = [ref for b in plan.batches for ref in b.references]
    params = _augpe_params(req, num_texts=len(plan.batches))
    labels = plan.batches[0].labels if plan.batches else {}

    def progress(_stage: str, done: int, _total: int) -> None:
        if on_step is not None:
            on_step(0)

    texts, _guarantee, stats = augpe.run_augpe(
        plan.model, references, params, seed % (2**63),
        public_prompt=plan.template.render(None, labels), on_progress=progress,
        system_prompt=plan.template.system,
    )
    for i, text in enumerate(texts):
        persist(GroupResult(i, [], text, "population", {},
                            token_count=plan.model.count_tokens(text)))
    return stats


def plan_generation(
    req: GenerationRequest, load_model: Callable[[str], LogitsModel]
) -> GenerationPlan:
    """Validate the request, read the data, form the batches and load the model.

    Writes nothing. Raises :class:`GenerationError` (or ``ReferenceDataError`` /
    ``FileNotFoundError``) with a one-line message on bad input."""
    _validate(req)
    guarantee, clip, factory = _make_guarantee(req)
    if not req.data.exists():
        raise GenerationError(f"data file not found: {req.data}")
    try:
        dataset = dataset_name(req.data, req.dataset)
    except ReleaseError as exc:
        raise GenerationError(str(exc)) from exc
    try:  # checked before the (slow) model load; the model decides the form later
        template = get_template(req.prompt, chat=False)
        template.check_labels(list(req.group_by))
    except (ValueError, OSError) as exc:
        raise GenerationError(f"--prompt: {exc}") from exc
    limit = None if req.num is None or req.group_by else req.num * req.batch_size
    records, stats = load_references(req.data, req.text_column, req.group_by, limit=limit)
    try:
        batches = make_batches(records, req.batch_size, req.num, req.group_by)
    except ValueError as exc:
        raise GenerationError(str(exc)) from exc
    model = load_model(req.model)
    template = get_template(req.prompt, chat=model.has_chat_template)
    if req.system is not None:
        template = PromptTemplate(template.name, template.private_text, template.public_text,
                                  req.system, template.form, template.label_normaliser)
    params = DecodingParams(clip, req.batch_size, req.temperature, req.top_k, req.max_tokens,
                            req.sparse_head)
    plan = GenerationPlan(req, model, template, batches, stats, file_digest(req.data),
                          guarantee, params, factory(model.vocab_size), dataset=dataset)
    plan.jobs = [_job(plan, b) for b in batches]
    return plan


def _job(plan: GenerationPlan, batch: Batch) -> GroupJob:
    model, template = plan.model, plan.template
    limit = plan.request.max_reference_tokens
    labels = batch.labels
    public = model.render_prompt(template.render(None, labels), template.system)
    private = []
    for ref in batch.references:
        if ref and model.count_tokens(ref) > limit:
            ref = model.truncate_tokens(ref, limit)
            plan.truncated_references += 1
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
#: the dataset name (private side file), and concurrency (does not change the output).
_NOT_FINGERPRINTED = ("seed", "ledger", "out", "concurrent_groups", "data", "dataset")


def _fingerprint(plan: GenerationPlan) -> dict[str, Any]:
    """Everything public that determines the output (goes into the public manifest).

    Privacy contract: a function of the request's public parameters, the model and the prompt
    only: no data path, no digest, no count of the private rows."""
    req = plan.request
    params = {k: v for k, v in asdict(req).items() if k not in _NOT_FINGERPRINTED}
    params["group_by"] = list(req.group_by)
    params["clip"] = plan.params.clip
    return {
        "parameters": params,
        "model_id": plan.model.model_id,
        "model_sha256": plan.model.weights_digest(),
        "model_dtype": str(getattr(plan.model, "dtype", "float32")).replace("torch.", ""),
        "prompt": {"name": plan.template.name, "form": plan.template.form,
                   "private": plan.template.private_text, "public": plan.template.public_text,
                   "system": plan.template.system},
        "num_generations": len(plan.batches),
        # Same seed, same parameters but other libraries, CPU or threads may round otherwise:
        # another output, so another release (a new charge).
        "numerics": getattr(plan.model, "numerics", None),
    }


def _private_fingerprint(plan: GenerationPlan) -> dict[str, Any]:
    """What a resumed run must share with the first one besides the public fingerprint."""
    return {"path": str(plan.request.data), "sha256": plan.data_digest,
            "dataset": plan.dataset}


@dataclass
class RunSummary:
    written: int
    skipped_existing: int
    total: int
    guarantee: Guarantee
    elapsed_s: float
    tokens: int


def _finished_groups(out: Path) -> set[int]:
    """Groups already in ``out``; a torn last line (killed mid-write) is cut off."""
    if not out.exists():
        return set()
    done: set[int] = set()
    good_bytes = 0
    with open(out, "rb") as fh:
        for line in fh:
            if not line.endswith(b"\n"):
                break
            try:
                done.add(int(json.loads(line)["group"]))
            except (ValueError, KeyError, TypeError):
                break
            good_bytes += len(line)
    if good_bytes != out.stat().st_size:
        with open(out, "r+b") as fh:
            fh.truncate(good_bytes)
    return done


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise GenerationError(f"cannot read {path}: {exc}") from None


def _resume_seed(plan: GenerationPlan, fingerprint: dict[str, Any]) -> tuple[bool, int | None]:
    """(resuming, stored seed) after checking what ``--out`` already holds.

    Refused with a one-line error: an output without its manifest; a manifest of a different
    run; a run whose private side file is gone; a private side file left without its run's
    outputs (a stale seed is never half-used: delete it to start a new, newly charged run)."""
    req = plan.request
    manifest_path, private_path = plan.manifest_path, plan.private_path
    if not manifest_path.exists():
        if req.out.exists():
            raise GenerationError(f"{req.out} exists without a manifest; choose another --out")
        if private_path.exists():
            raise GenerationError(
                f"{private_path} is left from a run whose outputs are gone; restore "
                f"{req.out.name} and {manifest_path.name} to resume it, or delete it to start a "
                "new run (a new seed, charged anew)")
        return False, None
    old = _read_json(manifest_path)
    if old.get("fingerprint") != fingerprint:
        raise GenerationError(
            f"{req.out} holds a different run (other data, model or parameters); "
            "choose another --out or delete it"
        )
    if not private_path.exists():
        raise GenerationError(f"cannot resume {req.out}: its private side file {private_path} "
                              "(with the secret seed) is gone; choose another --out")
    private = _read_json(private_path)
    data = private.get("data") or {}
    stored_fp = {"path": data.get("path"), "sha256": data.get("sha256"),
                 "dataset": private.get("dataset")}
    if stored_fp != _private_fingerprint(plan):
        raise GenerationError(
            f"{req.out} holds a different run (other data, model or parameters); "
            "choose another --out or delete it"
        )
    try:
        stored = int(private["seed"])
    except (KeyError, TypeError, ValueError):
        raise GenerationError(f"cannot resume {req.out}: {private_path} holds no seed") from None
    if req.seed is not None and req.seed != stored:
        raise GenerationError(
            f"{req.out} was started with another --seed; use the same seed or a new --out"
        )
    return True, stored


def execute_plan(
    plan: GenerationPlan,
    on_result: Callable[[dict[str, Any]], None] | None = None,
    on_step: Callable[[int], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> RunSummary:
    """Charge the ledger, write the private side file and the public manifest, and generate
    every group not yet in the output.

    ``on_start(total, already_done)`` is called once before decoding; ``on_result(record)``
    after each generation is persisted; ``on_step(n)`` after each decode step;
    ``on_warning(message)`` with the ledger's warnings for the data holder (a dataset name
    whose content changed...), which must not be written to a public file.

    Privacy contract: the texts written satisfy ``plan.guarantee``; the release (public
    fingerprint, dataset name, data digest, seed) is in the ledger before anything is written
    (charged once however often it is resumed; a new seed is a new charge); the manifest holds
    public inputs only and the seed, digest, counts and paths go to ``OUT.private.json``
    (mode 600 from creation). Raises ``BudgetExceeded`` when over budget (nothing written)."""
    req = plan.request
    fingerprint = _fingerprint(plan)
    resuming, stored_seed = _resume_seed(plan, fingerprint)
    seed = stored_seed if stored_seed is not None else req.seed
    release = Release.open(
        "generate", data=req.data, guarantee=plan.guarantee, fingerprint=fingerprint,
        dataset=plan.dataset, seed=seed, ledger=req.ledger, data_digest=plan.data_digest,
        description=f"dplang generate ({req.method}) → {req.out}",
        seed_source="resumed from the private side file" if resuming else None,
    )
    done = _finished_groups(req.out)
    release.charge(on_warning)  # before any output (invariant 6); idempotent on resume
    if plan.read_stats.used == 0 and on_warning is not None:
        # Not refused (a neighbour with one usable row would not be): the data holder is told.
        on_warning(f"no row of {req.data} holds a usable reference: every generation is the "
                   "public prompt's (check --text-column)")
    if not resuming:
        release.write_private(plan.private_path, release.private_record(
            keep_seed=True,
            data={"read": {"rows_seen": plan.read_stats.rows_seen,
                           "used": plan.read_stats.used,
                           "unusable_by_reason": dict(plan.read_stats.skipped_by_reason),
                           "unusable_rule": plan.read_stats.on_unusable},
                  "truncated_references": plan.truncated_references},
            output=str(req.out),
        ))
    manifest = release.public_manifest(
        clip=plan.params.clip,
        adjacency=req.adjacency,
        concurrent_groups=req.concurrent_groups,
        status="running",
        started=time.time(),
    )
    del manifest["created"]
    release.write_manifest(plan.manifest_path, manifest)

    pending = [j for j in plan.jobs if j.index not in done]
    if on_start is not None:
        on_start(len(plan.jobs), len(plan.jobs) - len(pending))
    batches = {b.index: b for b in plan.batches}
    start = time.time()
    written = 0
    tokens = 0

    with release.append_log(req.out) as log:

        def persist(res: GroupResult) -> None:
            nonlocal written, tokens
            record = _record(res, batches[res.index], req.method)
            log.write_line(json.dumps(record, ensure_ascii=False))
            written += 1
            tokens += res.num_tokens
            if on_result is not None:
                on_result(record)

        status = "interrupted"
        try:
            if req.method == "augpe":
                if pending:  # a population method: runs whole (no per-group resume)
                    manifest["augpe"] = _run_augpe(plan, release.seed, persist, on_step)
                status = "complete"
                return RunSummary(written, len(done), len(plan.jobs), plan.guarantee,
                                  time.time() - start, tokens)
            run_groups(plan.model, pending, plan.make_policy, req.batch_size,
                       req.max_tokens, RandomStreams(release.seed), req.concurrent_groups,
                       on_result=persist, on_step=on_step, sparse_head=req.sparse_head)
            status = "complete"
        finally:
            manifest["status"] = status
            manifest["finished"] = time.time()
            manifest["generations_written"] = len(done) + written
            with contextlib.suppress(OSError):
                write_json(plan.manifest_path, manifest)
    return RunSummary(written, len(done), len(plan.jobs), plan.guarantee,
                      time.time() - start, tokens)


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
    "manifest_path_for",
    "plan_generation",
    "private_path_for",
]

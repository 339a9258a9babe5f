"""What every executor shares: the protocol, the units of work, the exactly-once commit.

A run has one *driver* (the process that ran ``dplang generate``) and an *executor* that
decodes its groups:

* ``inline``: the driver decodes every group itself (the engine's continuous batching).
* ``local``: ``N`` spawned worker processes on this machine, each with its own copy of the model
  (one per GPU, or per share of the CPU; :mod:`dplang.textgen.executors.local`).
* ``ray``: Ray actors (:mod:`dplang.textgen.executors.ray`, optional extra
  ``dplang[distributed]``).

Whatever the executor, the driver forms the batches and prompts, charges the ledger once before
anything is dispatched, keeps the secret seed and is the only process that writes the output.
A worker receives chunks of :class:`GroupTask` (a group's prompts and the *initial state* of the
group's random stream, never the root seed: see
:meth:`dplang.privacy.randomness.RandomStreams.initial_state`) and returns finished groups.

Exactly once (:class:`LeaseTable`, :class:`OrderedCommit`):

* a lease table maps each dispatched group to the worker holding it; when a worker dies, the
  groups it held and had not returned are queued again (first, one per chunk, so that a group
  that crashes its worker does not take its neighbours' retries with it);
* a worker that is alive but holds groups and reports no progress (no decode step, no finished
  group) for ``stall_timeout_s`` (a deadlock, stuck I/O, a GPU hang) is stopped and treated
  exactly like a dead one: its groups are requeued, each dispatch counts toward the retries,
  whatever it might still send is a late duplicate, and a replacement is started;
* a group returned twice (a late duplicate from a worker declared dead, a redelivery) is dropped
  at commit: two released texts for one group would be two draws from the mechanism;
* a group that keeps failing stops the run after ``max_retries`` retries with an error. It is
  never skipped: whether a group fails may depend on its references, so a skip would be a
  data-dependent release.

Byte-identical output: groups are written in group order, whatever order they finish in, and a
group's text is a function of its own prompts and its own stream only (the engine's row
invariance, DESIGN.md invariants 5 and 7). So the output file is the same bytes for every
executor, worker count, concurrency and interruption: a resumed run's file equals an
uninterrupted one's. The price is a reorder buffer: groups that finish before an earlier one are
held in the driver's memory (at most the reorder window) and recomputed, identically, if the
driver is killed before it writes them.

This module holds the protocol (:class:`Executor`), the units of work (:class:`GroupTask`,
:class:`WorkerRecipe`, :class:`ModelSource`), the lease table and the in-order commit, the
inline executor (the reference the others must equal), the pooled executors' common part
(:class:`PooledExecutor`) and the driver's :func:`dispatch_groups`. The backends with workers
are :mod:`.local` and :mod:`.ray`; the factory and the plan glue are the package's
(:mod:`dplang.textgen.executors`).
"""

from __future__ import annotations

import contextlib
import math
import pickle
import sys
from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ...models.base import LogitsModel, PromptModel
from ...privacy.randomness import RandomStreams, StreamStates
from ..engine import GroupJob, GroupResult, StepPolicy, run_groups

__all__ = [
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_STALL_TIMEOUT_S",
    "EventHook",
    "Executor",
    "ExecutorError",
    "GroupTask",
    "IdentityPin",
    "InlineExecutor",
    "LeaseTable",
    "ModelSource",
    "OrderedCommit",
    "PooledExecutor",
    "WorkerRecipe",
    "check_identity",
    "check_stall_timeout",
    "decode_tasks",
    "dispatch_groups",
    "executor_session",
    "model_identity",
]

#: Retries of one group before the run stops (each group is dispatched at most 1 + k times).
DEFAULT_MAX_RETRIES = 2
#: Seconds a worker holding groups may go without reporting progress (a decode step or a
#: finished group) before it is declared hung, stopped and replaced (``--worker-timeout``).
DEFAULT_STALL_TIMEOUT_S = 600.0

#: ``events(name, fields)``: what an executor did, for logs and tests: worker numbers, process
#: ids, group indices, never texts or references; but a ``reason`` quotes a worker's exception
#: message, which may mention what it was decoding: show it to the data holder only.
EventHook = Callable[[str, dict[str, Any]], None]


class ExecutorError(RuntimeError):
    """A run stopped by its executor (one-line message). What was committed stays in the
    output; rerunning the same command resumes after it."""


# --------------------------------------------------------------------------- units of work


@dataclass(frozen=True)
class GroupTask:
    """One group as a worker receives it: its job (prompts, public prefix) and the initial
    state of its random stream.

    Privacy contract: the state opens this group's stream only, and the prompts carry its
    references: a task is as private as the references (it travels between the driver's
    processes, or over Ray's object store inside the cluster; it is never written to disk)."""

    job: GroupJob
    stream_state: dict[str, Any]

    @property
    def index(self) -> int:
        return self.job.index


@dataclass(frozen=True)
class ModelSource:
    """How a worker obtains the run's model: a picklable ``instance`` (the toy models), or
    a ``spec`` (``--model``) loaded with ``dtype``, ``device`` and ``threads``."""

    instance: LogitsModel | None = None
    spec: str | None = None
    dtype: str = "float32"
    device: str = "cpu"
    threads: int | None = None

    @classmethod
    def for_model(cls, model: PromptModel, spec: str, dtype: str) -> ModelSource:
        """The source that reproduces the driver's ``model`` (loaded from ``spec`` in
        ``dtype``; a whole model or only its prompt side) in another process: a transformers
        model is loaded again from its spec on the same device with the same thread count (the
        worker checks that it got the same identity); any other model is sent pickled. Raises
        :class:`ExecutorError` for a model that cannot be sent."""
        text_side = sys.modules.get("dplang.models.prompt_side")
        if text_side is not None and isinstance(model, text_side.TokenizerText):
            return cls(spec=spec, dtype=str(model.dtype).replace("torch.", ""),  # type: ignore[attr-defined]
                       device=getattr(model, "device_type", "cpu"),
                       threads=model.threads)  # type: ignore[attr-defined]
        try:
            pickle.dumps(model)
        except Exception as exc:  # any pickling failure: the model cannot leave this process
            raise ExecutorError(f"the model {model.model_id} cannot be sent to worker "
                                f"processes ({type(exc).__name__}); use --executor inline"
                                ) from None
        return cls(instance=model)

    def load(self) -> LogitsModel:
        """The model, in this process."""
        if self.instance is not None:
            return self.instance
        if self.spec is None:
            raise ValueError("a ModelSource needs an instance or a spec")
        from ...models.default import resolve_model

        kwargs: dict[str, Any] = {"threads": self.threads, "dtype": self.dtype}
        if self.device != "cpu":
            kwargs["device"] = self.device
        return resolve_model(self.spec, **kwargs)


def model_identity(model: PromptModel) -> dict[str, Any]:
    """What must be equal between the driver's model and a worker's for the worker to compute
    the same bits: id, weights digest, numerics (library and arithmetic versions, dtype,
    attention block, device type: not the thread count, which changes no bit) and, for a
    whole model, vocabulary and EOS ids (a driver that loaded only the
    prompt side, :class:`~dplang.models.prompt_side.PromptSide`, does not know those: the
    executors then require every worker to agree with the first one). Public."""
    identity = {
        "model_id": model.model_id,
        "weights_sha256": model.weights_digest(),
        "numerics": getattr(model, "numerics", None),
    }
    if hasattr(model, "vocab_size") and hasattr(model, "eos_token_ids"):
        identity["vocab_size"] = int(model.vocab_size)
        identity["eos_token_ids"] = sorted(int(t) for t in model.eos_token_ids)
    return identity


@dataclass(frozen=True)
class WorkerRecipe:
    """Everything a worker needs to decode groups exactly as the driver would (picklable,
    public: no seed, no reference).

    ``policy_factory(vocab_size)`` returns the per-group step-policy factory (a module-level
    function with its public parameters bound, e.g. ``functools.partial``); ``identity`` is
    the driver's :func:`model_identity`, which the worker's model must match (on the keys it
    has)."""

    model: ModelSource
    policy_factory: Callable[[int], Callable[[GroupJob], StepPolicy]]
    batch_size: int
    max_tokens: int
    concurrent_groups: int
    sparse_head: bool
    identity: dict[str, Any]
    #: Whether the model's special and control tokens may be sampled (``--allow-special-tokens``).
    special_tokens: bool = False


def _identity_diffs(want: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """``key: want → got`` for every key of ``want`` that ``got`` does not equal."""
    diffs = []
    for key in sorted(want):
        a, b = want.get(key), got.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += [f"{key}.{k}: {a.get(k)!r} → {b.get(k)!r}"
                      for k in sorted(set(a) | set(b), key=str) if a.get(k) != b.get(k)]
        else:
            diffs.append(f"{key}: {a!r} → {b!r}")
    return diffs


def check_identity(model: LogitsModel, recipe: WorkerRecipe) -> dict[str, Any]:
    """A worker's model's :func:`model_identity` (it reports it to the driver), once checked
    against the driver's on every key the driver knows. Raises :class:`ExecutorError` naming
    what differs (another library version, dtype, device...): its texts would
    differ."""
    mine = model_identity(model)
    diffs = _identity_diffs(recipe.identity, mine)
    if diffs:
        raise ExecutorError("a worker's model differs from the driver's, so its texts would "
                            f"differ ({'; '.join(diffs[:3])})")
    return mine


class IdentityPin:
    """The driver's check that every worker of a run has the same model: the first worker's
    whole identity (with the vocabulary and EOS ids that a prompt-side driver does not know)
    is pinned, and every later worker must report the same."""

    def __init__(self) -> None:
        self.first: tuple[int, dict[str, Any]] | None = None

    def check(self, worker: int, identity: dict[str, Any], label: str = "worker") -> None:
        if self.first is None:
            self.first = (worker, identity)
            return
        number, pinned = self.first
        diffs = _identity_diffs(pinned, identity)
        if diffs:
            raise ExecutorError(f"{label} {worker}'s model differs from {label} {number}'s, "
                                f"so its texts would differ ({'; '.join(diffs[:3])})")


class _TaskFeed:
    """The engine's job iterator over tasks: registers each task's stream state as the engine
    admits its group. ``more()`` is asked for further tasks when the local ones run out (a
    worker polls its inbox without waiting); an empty answer ends admission for now."""

    def __init__(self, tasks: Iterable[GroupTask],
                 more: Callable[[], Sequence[GroupTask]] | None = None) -> None:
        self._tasks: Iterator[GroupTask] = iter(tasks)
        self._buffer: deque[GroupTask] = deque()
        self._more = more
        self.states = StreamStates({})

    def __iter__(self) -> _TaskFeed:
        return self

    def __next__(self) -> GroupJob:
        task = next(self._tasks, None)
        if task is None:
            if not self._buffer and self._more is not None:
                self._buffer.extend(self._more())
            if not self._buffer:
                raise StopIteration
            task = self._buffer.popleft()
        self.states.add(task.index, task.stream_state)
        return task.job


def decode_tasks(
    model: LogitsModel,
    recipe: WorkerRecipe,
    tasks: Iterable[GroupTask],
    on_result: Callable[[GroupResult], None],
    on_step: Callable[[int], None] | None = None,
    more: Callable[[], Sequence[GroupTask]] | None = None,
    policy: Callable[[GroupJob], StepPolicy] | None = None,
) -> None:
    """Decode ``tasks`` (then whatever ``more()`` returns) on ``model`` with the engine, each
    group from its own stream state: the texts equal the driver's inline ones, bit for bit.
    ``policy`` overrides ``recipe.policy_factory(model.vocab_size)``."""
    feed = _TaskFeed(tasks, more)
    make_policy = policy or recipe.policy_factory(model.vocab_size)
    run_groups(model, feed, make_policy, recipe.batch_size, recipe.max_tokens, feed.states,
               recipe.concurrent_groups, on_result=on_result, on_step=on_step,
               sparse_head=recipe.sparse_head, special_tokens=recipe.special_tokens)


# ------------------------------------------------------------------ exactly once, in order


class OrderedCommit:
    """The driver's one gate to the output: each group is committed once, in group order.

    ``offer(result)`` accepts the first result of a dispatched group and drops any later one
    (counted in ``duplicates_dropped``); results are handed to ``persist`` in ascending group
    order, so groups that finish early wait in a reorder buffer until the groups before them
    are in. ``received(i)`` tells the lease table that group ``i`` needs no retry."""

    def __init__(self, indices: Iterable[int], persist: Callable[[GroupResult], None]) -> None:
        self._order = sorted(set(indices))
        self._position = {index: n for n, index in enumerate(self._order)}
        self._persist = persist
        self._held: dict[int, GroupResult] = {}
        self._received: set[int] = set()
        self._next = 0
        self.duplicates_dropped = 0

    def __len__(self) -> int:
        return len(self._order)

    @property
    def committed(self) -> int:
        """Groups handed to ``persist`` so far."""
        return self._next

    @property
    def complete(self) -> bool:
        return self._next == len(self._order)

    @property
    def held(self) -> int:
        """Results received but waiting for an earlier group."""
        return len(self._held)

    def position(self, index: int) -> int:
        """Rank of group ``index`` among this run's groups."""
        return self._position[index]

    def received(self, index: int) -> bool:
        return index in self._received

    def offer(self, result: GroupResult) -> bool:
        """Accept ``result`` unless its group is already in (then it is dropped: ``False``).
        Raises :class:`ExecutorError` for a group this run did not dispatch."""
        if not isinstance(result, GroupResult) or result.index not in self._position:
            raise ExecutorError(f"an executor returned group {getattr(result, 'index', '?')}, "
                                "which this run did not dispatch")
        if result.index in self._received:
            self.duplicates_dropped += 1
            return False
        self._received.add(result.index)
        self._held[result.index] = result
        while self._next < len(self._order) and self._order[self._next] in self._held:
            self._persist(self._held.pop(self._order[self._next]))
            self._next += 1
        return True


class LeaseTable:
    """Which worker holds which group, and what to dispatch next.

    Groups are leased in group order, failed groups first and one per chunk; never further
    than ``window`` groups past the oldest uncommitted one (this bounds the reorder buffer).
    A worker that is lost (:meth:`lost`) gives back its groups that were not received; a group
    dispatched more than ``1 + max_retries`` times stops the run (:class:`ExecutorError`)."""

    def __init__(self, jobs: Sequence[GroupJob], commit: OrderedCommit, streams: RandomStreams,
                 *, chunk_size: int, max_retries: int = DEFAULT_MAX_RETRIES,
                 window: int | None = None) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk size must be >= 1, got {chunk_size}")
        if max_retries < 0:
            raise ValueError(f"max retries must be >= 0, got {max_retries}")
        self._jobs = {job.index: job for job in jobs}
        self._queue: deque[int] = deque(sorted(self._jobs))
        self._retry: deque[int] = deque()
        self._commit = commit
        self._streams = streams
        self.chunk_size = chunk_size
        self.max_retries = max_retries
        self.window = window if window is not None else max(256, 8 * chunk_size)
        self.leases: dict[int, Hashable] = {}
        self.attempts: Counter[int] = Counter()
        self.last_error: dict[int, str] = {}

    @property
    def done(self) -> bool:
        return self._commit.complete

    def __len__(self) -> int:
        """Groups this table dispatches in all."""
        return len(self._jobs)

    def outstanding(self, worker: Hashable) -> int:
        """Groups leased to ``worker`` and not yet returned."""
        return sum(1 for w in self.leases.values() if w == worker)

    def has_work(self) -> bool:
        """Whether :meth:`lease` would hand out something now."""
        return bool(self._retry) or (bool(self._queue) and self._within_window(self._queue[0]))

    def _within_window(self, index: int) -> bool:
        return self._commit.position(index) < self._commit.committed + self.window

    def lease(self, worker: Hashable) -> list[GroupTask]:
        """The next chunk for ``worker`` (empty when there is nothing to hand out now)."""
        if self._retry:
            picked = [self._retry.popleft()]
        else:
            picked = []
            while (self._queue and len(picked) < self.chunk_size
                   and self._within_window(self._queue[0])):
                picked.append(self._queue.popleft())
        tasks = []
        for index in picked:
            self.leases[index] = worker
            self.attempts[index] += 1
            tasks.append(GroupTask(self._jobs[index], self._streams.initial_state(index)))
        return tasks

    def returned(self, worker: Hashable, result: GroupResult) -> bool:
        """``worker`` returned ``result``: its lease ends and the result is offered for
        commit. ``False`` when the result was a duplicate (dropped)."""
        if self.leases.get(result.index) == worker:
            del self.leases[result.index]
        accepted = self._commit.offer(result)
        if accepted:  # a requeued copy still waiting in the queue is no longer needed
            with contextlib.suppress(ValueError):
                self._retry.remove(result.index)
        return accepted

    def lost(self, worker: Hashable, reason: str) -> list[int]:
        """``worker`` is gone (died, raised, was killed): the groups it held and had not
        returned go back to the queue. Returns them; raises :class:`ExecutorError` when one has
        used up its retries (the run stops; nothing is skipped)."""
        held = sorted(i for i, w in self.leases.items() if w == worker)
        requeue = []
        for index in held:
            del self.leases[index]
            if self._commit.received(index):
                continue
            self.last_error[index] = reason
            if self.attempts[index] > self.max_retries:
                raise ExecutorError(
                    f"group {index} failed {self.attempts[index]} times (last: {reason}); the "
                    "run stops rather than skip it (a skipped group would be a data-dependent "
                    "release); fix the cause and rerun the same command to resume")
            requeue.append(index)
        self._retry.extend(requeue)
        return requeue


# ------------------------------------------------------------------------------ executors


class Executor(Protocol):
    """Decodes dispatched groups and hands every finished group to ``table.returned``.

    Contract: an executor may deliver results in any order and more than once (the table and
    the commit make that exactly once, in order); it must call ``table.lost`` for a worker that
    stops holding groups it did not return, and return only when ``table.done``, or raise
    :class:`ExecutorError`. It never writes the output and never sees the root seed.

    An executor with workers may also have ``start(recipe, groups)``, which starts them and
    returns once each has loaded the model and passed its checks (raising
    :class:`ExecutorError` otherwise), and ``close()``, which stops them:
    :func:`executor_session` calls them around a run, so that a model or configuration the
    workers refuse stops the run before the ledger is charged."""

    name: str

    def run(self, model: PromptModel, recipe: WorkerRecipe, table: LeaseTable,
            on_step: Callable[[int], None] | None) -> None:
        """Decode until ``table.done``."""
        ...


@dataclass
class InlineExecutor:
    """Decode every group in the driver (the engine's continuous batching over the already
    loaded model): today's behaviour, and the reference the other executors must equal."""

    name: str = "inline"

    def run(self, model: PromptModel, recipe: WorkerRecipe, table: LeaseTable,
            on_step: Callable[[int], None] | None,
            policy: Callable[[GroupJob], StepPolicy] | None = None) -> None:
        if not isinstance(model, LogitsModel):
            raise ExecutorError(f"the inline executor needs the whole model; {model.model_id} "
                                "was loaded without its weights (for worker executors)")

        def more() -> list[GroupTask]:
            return table.lease("inline")

        decode_tasks(model, recipe, (), lambda r: table.returned("inline", r), on_step,
                     more=more, policy=policy)
        if not table.done:  # pragma: no cover - the feed hands out every group
            raise ExecutorError("the inline executor stopped before every group was decoded")


@contextlib.contextmanager
def executor_session(executor: Executor | None, recipe: WorkerRecipe | None,
                     groups: int) -> Iterator[None]:
    """Start ``executor``'s workers for ``groups`` groups (when it has workers, ``recipe`` is
    given and there is something to decode) and stop them on leaving, whatever happens.

    The driver enters it before charging the ledger: every worker loads the model and runs its
    load-time checks (identity, row invariance) first, and one that refuses stops the run with
    :class:`ExecutorError` while nothing has been charged or written. Workers receive only the
    public recipe here, nothing private."""
    start = getattr(executor, "start", None)
    close = getattr(executor, "close", None)
    try:
        if start is not None and recipe is not None and groups > 0:
            start(recipe, groups)
        yield
    finally:
        if close is not None:
            close()


def check_stall_timeout(seconds: float, flag: str = "stall_timeout_s") -> None:
    """Raise ``ValueError`` unless ``seconds`` is a finite number > 0."""
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{flag} must be a finite number of seconds > 0, got {seconds}")


class PooledExecutor:
    """What the local and the Ray executor share: a pool of workers started by ``start``
    (before the ledger is charged, when the run is driven by
    :func:`executor_session`) or by :meth:`run` itself, and stopped by :meth:`close`."""

    workers: int
    stall_timeout_s: float
    events: EventHook | None
    _pool: Any

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        check_stall_timeout(self.stall_timeout_s)
        self._pool = None

    def _emit(self, name: str, **fields: Any) -> None:
        if self.events is not None:
            self.events(name, fields)

    def start(self, recipe: WorkerRecipe, groups: int | None = None) -> None:
        raise NotImplementedError

    def run(self, model: PromptModel, recipe: WorkerRecipe, table: LeaseTable,
            on_step: Callable[[int], None] | None) -> None:
        own = self._pool is None or self._pool.recipe is not recipe
        try:
            if own:
                self.start(recipe, len(table))
            assert self._pool is not None
            self._pool.dispatch(table, on_step)
        finally:
            if own:
                self.close()

    def close(self) -> None:
        """Stop the pool's workers (its ``close`` says how); a no-op when none runs."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


def dispatch_groups(
    executor: Executor | None,
    model: PromptModel,
    jobs: Sequence[GroupJob],
    seed: int,
    recipe: WorkerRecipe,
    persist: Callable[[GroupResult], None],
    on_step: Callable[[int], None] | None = None,
    policy: Callable[[GroupJob], StepPolicy] | None = None,
) -> OrderedCommit:
    """Decode ``jobs`` with ``executor`` (default inline) and ``persist`` each finished group
    exactly once, in group order. Called by the driver after the ledger charge.

    Privacy contract: ``seed`` stays in this process (workers get per-group stream states);
    ``persist`` (the only writer) sees each group once; a group that cannot be decoded stops
    the run with :class:`ExecutorError` rather than being skipped. ``policy`` is the driver's
    own policy factory (used by the inline executor)."""
    commit = OrderedCommit((job.index for job in jobs), persist)
    if not jobs:
        return commit
    executor = executor if executor is not None else InlineExecutor()
    chunk = getattr(executor, "chunk_size", None) or recipe.concurrent_groups
    table = LeaseTable(jobs, commit, RandomStreams(seed), chunk_size=chunk,
                       max_retries=getattr(executor, "max_retries", DEFAULT_MAX_RETRIES),
                       window=max(256, 4 * getattr(executor, "workers", 1) * chunk))
    if isinstance(executor, InlineExecutor):
        executor.run(model, recipe, table, on_step, policy=policy)
    else:
        executor.run(model, recipe, table, on_step)
    if not commit.complete:
        raise ExecutorError(f"the {executor.name} executor returned before every group was "
                            "committed; rerun the same command to resume")
    return commit
